/* SPDX-License-Identifier: MIT */
/*
 * tests/test_store.c - the persistent NVMe store through the public API: parked sessions
 * published, listed and restored after the engine is destroyed and created again (with and
 * without the codec), a store made for another layout/codec/capacity refused with KVT_EFORMAT, a
 * damaged superblock refused, a reused or damaged slot making its session cleanly absent,
 * closing and dropping, a full NVMe tier giving up stored sessions, bit flips under the codec
 * detected, files created 0600, and a torn journal tail ignored.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine_impl.h"
#include "support/kvt_test.h"

#define SLOT_BYTES 8192u /* a 4 KiB header page + a 1024-byte test block, rounded up */

struct scfg {
	int codec;            /* enum kvt_codec */
	uint32_t nvme_blocks; /* NVMe capacity in slots */
	uint32_t tpb;         /* tokens per block (TSUP_TPB unless testing a mismatch) */
};

static int
store_engine(const char *dir, const struct scfg *c, struct kvt_engine **e)
{
	struct kvt_engine_opts o;

	tsup_store_opts(&o, dir, (uint64_t)(c->nvme_blocks ? c->nvme_blocks : 64) * SLOT_BYTES);
	if (c->tpb)
		o.layout.tokens_per_block = c->tpb;
	o.nvme_codec = c->codec;
	o.nvme_codec_min_saving = 0.05f;
	*e = NULL;
	return kvt_engine_create(&o, e);
}

static struct kvt_engine *
store_engine_ok(const char *dir, const struct scfg *c)
{
	struct kvt_engine *e;
	int rc = store_engine(dir, c, &e);

	if (rc)
		print_error("create: %s\n", kvt_last_error_message());
	assert_int_equal(rc, 0);
	return e;
}

/* A session of @tenant with key @key and pattern @tag of @n tokens, parked to NVMe and
 * drained. */
static kvt_seq_id
park_session_of(struct kvt_engine *e, uint32_t tenant, uint64_t key, uint32_t tag, uint32_t n)
{
	struct kvt_seq_opts so;
	kvt_seq_id s;

	kvt_seq_opts_init(&so, sizeof so);
	so.session_key = key;
	so.tenant = tenant;
	assert_int_equal(kvt_seq_open(e, &so, &s), 0);
	for (uint32_t p = 0; p < n; p += 8)
		assert_int_equal(tsup_append_write(e, s, tag, p, n - p < 8 ? n - p : 8), 0);
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	return s;
}

/* park_session_of tenant 0. */
static kvt_seq_id
park_session(struct kvt_engine *e, uint64_t key, uint32_t tag, uint32_t n)
{
	return park_session_of(e, 0, key, tag, n);
}

static bool
listed(struct kvt_engine *e, uint64_t key)
{
	uint64_t keys[64];
	int n = kvt_session_list(e, keys, 64);

	assert_true(n >= 0 && n <= 64);
	for (int i = 0; i < n; i++)
		if (keys[i] == key)
			return true;
	return false;
}

static kvt_seq_id
restore_ok(struct kvt_engine *e, uint64_t key, uint32_t tag, uint64_t n_tokens)
{
	struct kvt_seq_info info;
	kvt_seq_id s = 0;
	int rc = kvt_seq_restore(e, key, NULL, &s);

	if (rc)
		print_error("restore %#llx: %s\n", (unsigned long long)key,
			    kvt_last_error_message());
	assert_int_equal(rc, 0);
	assert_int_equal(kvt_seq_info(e, s, &info), 0);
	assert_int_equal(info.n_tokens, n_tokens);
	assert_int_equal(info.parked, 1);
	assert_int_equal(info.blocks_in[KVT_TIER_NVME], info.n_blocks);
	assert_int_equal(kvt_seq_resume(e, s), 0);
	assert_int_equal(tsup_verify(e, s, tag), 0);
	tsup_check_engine(e);
	return s;
}

static void
file_mode_0600(const char *dir, const char *name)
{
	char path[600];
	struct stat st;

	snprintf(path, sizeof path, "%s/%s", dir, name);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
}

static void
roundtrip(int codec)
{
	struct scfg c = { .codec = codec };
	char *dir = tsup_mkdtemp();
	struct kvt_engine *e = store_engine_ok(dir, &c);
	struct kvt_stats st = { .size = sizeof st };
	kvt_seq_id s;

	park_session(e, 0x1111, 3, 21);
	park_session(e, 0x2222, 4, 8);
	s = park_session(e, 0, 5, 8); /* no key: never published */
	(void)s;
	assert_int_equal(kvt_engine_stats(e, &st), 0);
	if (codec != KVT_CODEC_NONE) {
		assert_true(st.codec_blocks > 0);
		assert_true(st.codec_stored_bytes < st.codec_raw_bytes);
	} else {
		assert_int_equal(st.codec_stored_bytes, st.codec_raw_bytes);
	}
	assert_int_equal(kvt_session_list(e, NULL, 0), 0); /* all open here */
	kvt_engine_destroy(e);
	file_mode_0600(dir, "kvtier.store");
	file_mode_0600(dir, "kvtier.journal");

	e = store_engine_ok(dir, &c);
	assert_int_equal(kvt_session_list(e, NULL, 0), 2);
	assert_true(listed(e, 0x1111) && listed(e, 0x2222));
	s = restore_ok(e, 0x1111, 3, 21);
	assert_int_equal(kvt_seq_restore(e, 0x1111, NULL, &s), KVT_EBUSY);
	assert_int_equal(kvt_seq_restore(e, 0x3333, NULL, &s), -ENOENT);
	assert_false(listed(e, 0x1111));
	/* grow it and park it again: the new state is what the next restart finds */
	s = 0;
	assert_int_equal(kvt_seq_restore(e, 0x2222, NULL, &s), 0);
	assert_int_equal(tsup_append_write(e, s, 4, 8, 6), 0);
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);

	e = store_engine_ok(dir, &c);
	assert_int_equal(kvt_session_list(e, NULL, 0), 2);
	restore_ok(e, 0x2222, 4, 14);
	restore_ok(e, 0x1111, 3, 21);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

static void
test_restore_raw(void **state)
{
	(void)state;
	roundtrip(KVT_CODEC_NONE);
}

static void
test_restore_codec(void **state)
{
	(void)state;
	roundtrip(KVT_CODEC_SHUF_LZ4);
	roundtrip(KVT_CODEC_BYTE_LZ4);
	roundtrip(KVT_CODEC_CSHUF_LZ4);
}

static void
expect_refused(const char *dir, const struct scfg *c, int code, const char *what)
{
	struct kvt_engine *e;

	assert_int_equal(store_engine(dir, c, &e), code);
	assert_null(e);
	if (!strstr(kvt_last_error_message(), what))
		print_error("message: %s\n", kvt_last_error_message());
	assert_non_null(strstr(kvt_last_error_message(), what));
}

static void
test_fingerprint_mismatch(void **state)
{
	struct scfg c = { .codec = KVT_CODEC_SHUF_LZ4 };
	struct scfg other_tpb = { .codec = KVT_CODEC_SHUF_LZ4, .tpb = 2 };
	struct scfg other_codec = { .codec = KVT_CODEC_LZ4 };
	struct scfg other_cap = { .codec = KVT_CODEC_SHUF_LZ4, .nvme_blocks = 32 };
	char *dir = tsup_mkdtemp(), path[600];
	struct kvt_engine *e = store_engine_ok(dir, &c);
	uint8_t b = 0;
	int fd;

	park_session(e, 7, 1, 4);
	kvt_engine_destroy(e);
	expect_refused(dir, &other_tpb, KVT_EFORMAT, "tokens_per_block");
	expect_refused(dir, &other_codec, KVT_EFORMAT, "codec");
	expect_refused(dir, &other_cap, KVT_EFORMAT, "capacity");
	/* refusing left the store as it was */
	e = store_engine_ok(dir, &c);
	restore_ok(e, 7, 1, 4);
	/* a second engine on the same store while the first holds it */
	expect_refused(dir, &c, -EBUSY, "in use");
	kvt_engine_destroy(e);
	/* a damaged superblock (the version field) */
	snprintf(path, sizeof path, "%s/kvtier.store", dir);
	fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &b, 1, 8), 1);
	b ^= 1;
	assert_int_equal(pwrite(fd, &b, 1, 8), 1);
	close(fd);
	expect_refused(dir, &c, KVT_EFORMAT, "checksum");
	tsup_rmdir(dir);
}

/* Overwrite the header of the slot that holds block 0 of the only stored session. */
static void
damage_first_block(const char *dir, struct kvt_engine *e, uint64_t key)
{
	struct kvt_store_sess *rec = kvt_store_find(e->store, key);
	char path[600];
	uint8_t junk[16] = { 0xde, 0xad };
	int fd;

	assert_non_null(rec);
	snprintf(path, sizeof path, "%s/kvtier.store", dir);
	fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, junk, sizeof junk,
				(off_t)(KVT_FMT_DATA_OFF + (uint64_t)rec->blocks[0].slot * SLOT_BYTES + 16)),
			 (ssize_t)sizeof junk);
	close(fd);
}

static void
test_damaged_session_absent(void **state)
{
	struct scfg c = { 0 };
	char *dir = tsup_mkdtemp();
	struct kvt_engine *e = store_engine_ok(dir, &c);
	kvt_seq_id s;

	park_session(e, 0xabc, 2, 12);
	park_session(e, 0xdef, 6, 12);
	kvt_engine_destroy(e);
	e = store_engine_ok(dir, &c);
	damage_first_block(dir, e, 0xabc);
	assert_int_equal(kvt_seq_restore(e, 0xabc, NULL, &s), -ENOENT);
	assert_non_null(strstr(kvt_last_error_message(), "did not survive"));
	assert_false(listed(e, 0xabc));
	restore_ok(e, 0xdef, 6, 12);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	e = store_engine_ok(dir, &c); /* the drop was durable; 0xdef stays */
	assert_int_equal(kvt_session_list(e, NULL, 0), 1);
	assert_true(listed(e, 0xdef));
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

static void
test_close_drop_and_full(void **state)
{
	struct scfg c = { .nvme_blocks = 8 };
	char *dir = tsup_mkdtemp();
	struct kvt_engine *e = store_engine_ok(dir, &c);
	struct kvt_stats st = { .size = sizeof st };
	kvt_seq_id s;

	s = park_session(e, 1, 1, 8);
	assert_int_equal(kvt_seq_close(e, s), 0); /* a closed conversation is not kept */
	park_session(e, 2, 2, 8);
	park_session(e, 3, 3, 12);
	kvt_engine_destroy(e);
	e = store_engine_ok(dir, &c);
	assert_int_equal(kvt_session_list(e, NULL, 0), 2);
	assert_false(listed(e, 1));
	assert_int_equal(kvt_session_drop(e, 2), 0);
	assert_int_equal(kvt_session_drop(e, 2), -ENOENT);
	assert_int_equal(kvt_engine_stats(e, &st), 0);
	assert_int_equal(st.tier[KVT_TIER_NVME].used_slots, 3); /* session 3 keeps its slots */
	/* 8 slots: parking 7 new blocks needs 2 of session 3's: it is given up, whole */
	park_session(e, 4, 4, 28);
	assert_int_equal(kvt_session_list(e, NULL, 0), 0);
	assert_int_equal(kvt_seq_restore(e, 3, NULL, &s), -ENOENT);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	e = store_engine_ok(dir, &c);
	assert_int_equal(kvt_session_list(e, NULL, 0), 1);
	restore_ok(e, 4, 4, 28);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

static int flips;

static void
flip_reads(void *arg, bool is_write, uint32_t slot, void *buf, size_t len, uint64_t off, int *res)
{
	(void)arg;
	(void)slot;
	(void)off;
	if (!is_write && len > 200) {
		((uint8_t *)buf)[4096 + 150] ^= 0x10; /* inside the (encoded) payload */
		flips++;
	}
	(void)res;
}

static void
test_bitflip_codec(void **state)
{
	static const struct kvt_nvme_fault_hooks hooks = { .on_complete = flip_reads };
	struct scfg c = { .codec = KVT_CODEC_SHUF_LZ4 };
	struct kvt_stats st = { .size = sizeof st };
	char *dir = tsup_mkdtemp();
	struct kvt_engine *e;
	kvt_seq_id s;

	(void)state;
	kvt_test_nvme_hooks = &hooks;
	e = store_engine_ok(dir, &c);
	s = park_session(e, 9, 9, 16);
	assert_int_equal(kvt_engine_stats(e, &st), 0);
	assert_true(st.codec_blocks > 0);
	assert_int_equal(kvt_seq_resume(e, s), 0);
	assert_int_equal(tsup_verify(e, s, 9), KVT_ELOST);
	assert_int_equal(kvt_engine_stats(e, &st), 0);
	assert_true(flips > 0);
	assert_int_equal(st.checksum_failed, (uint64_t)flips);
	assert_int_equal(st.checksum_verified, 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	kvt_test_nvme_hooks = NULL;
	tsup_rmdir(dir);
}

static int fate_mode; /* 1: delay every other CQE; 2: lose every read's; 3: lose writes' */
static unsigned fate_seen;

static int
fate_engine(void *arg, bool is_write, uint32_t slot)
{
	(void)arg;
	(void)slot;
	fate_seen++;
	if (fate_mode == 1 && fate_seen % 2)
		return KVT_NVME_FATE_DELAY;
	if ((fate_mode == 2 && !is_write) || (fate_mode == 3 && is_write))
		return KVT_NVME_FATE_LOSE;
	return KVT_NVME_FATE_NORMAL;
}

/* Late completions change nothing; a lost read completion is a clean KVT_ELOST (recompute), a
 * lost write leaves the blocks where they were; no hang, the engine stays consistent. */
static void
test_lost_and_late_completions(void **state)
{
	static const struct kvt_nvme_fault_hooks hooks = { .fate = fate_engine,
							   .io_timeout_ms = 50 };
	struct scfg c = { .codec = KVT_CODEC_SHUF_LZ4 };
	struct kvt_stats st = { .size = sizeof st };
	struct kvt_seq_info info;
	char *dir = tsup_mkdtemp();
	struct kvt_engine *e;
	kvt_seq_id a, b;

	(void)state;
	kvt_test_nvme_hooks = &hooks;
	e = store_engine_ok(dir, &c);
	kvt_test_nvme_hooks = NULL;
	fate_mode = 1;
	a = park_session(e, 1, 1, 24);
	assert_int_equal(kvt_seq_resume(e, a), 0);
	assert_int_equal(tsup_verify(e, a, 1), 0);
	/* lost writes: -ETIMEDOUT, the blocks stay in HOST/HBM, nothing lost */
	fate_mode = 3;
	b = park_session(e, 2, 2, 8);
	assert_int_equal(kvt_seq_info(e, b, &info), 0);
	assert_int_equal(info.blocks_in[KVT_TIER_NVME], 0);
	assert_true(info.blocks_in[KVT_TIER_HOST] + info.blocks_in[KVT_TIER_HBM] >= info.n_blocks);
	fate_mode = 0;
	assert_int_equal(tsup_verify(e, b, 2), 0);
	/* lost reads: the blocks are lost, the caller is told, nothing wrong is served */
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	fate_mode = 2;
	assert_int_equal(tsup_verify(e, a, 1), KVT_ELOST);
	fate_mode = 0;
	assert_int_equal(kvt_engine_stats(e, &st), 0);
	assert_true(st.io_errors >= 3);
	assert_true(st.blocks_lost > 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* A volume that runs out of space (thin/CoW): clean NVMe copies are given up, the blocks that
 * could not be written stay above, nothing is lost, and writes work again afterwards. */
static void
test_enospc_gives_back_clean_copies(void **state)
{
	struct scfg c = { 0 };
	struct kvt_stats st = { .size = sizeof st };
	struct kvt_seq_info info;
	char *dir = tsup_mkdtemp();
	struct kvt_engine *e;
	kvt_seq_id a, b;

	(void)state;
	kvt_test_nvme_hooks = &tsup_enospc_hooks;
	e = store_engine_ok(dir, &c);
	kvt_test_nvme_hooks = NULL;
	a = park_session(e, 1, 1, 16);           /* 4 blocks on NVMe */
	assert_int_equal(tsup_verify(e, a, 1), 0); /* back in HBM: NVMe copies are clean now */
	tsup_enospc_writes = 1;
	b = park_session(e, 2, 2, 8);
	assert_int_equal(kvt_engine_stats(e, &st), 0);
	assert_true(st.io_errors >= 1);
	assert_true(st.tier[KVT_TIER_NVME].evictions >= 4); /* a's clean copies given up */
	assert_int_equal(kvt_seq_info(e, b, &info), 0);
	assert_int_equal(info.blocks_in[KVT_TIER_NVME], 0);
	assert_int_equal(tsup_verify(e, a, 1), 0);
	assert_int_equal(tsup_verify(e, b, 2), 0);
	tsup_check_engine(e);
	tsup_enospc_writes = 0;
	assert_int_equal(kvt_seq_park(e, b, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_info(e, b, &info), 0);
	assert_int_equal(info.blocks_in[KVT_TIER_NVME], info.n_blocks);
	assert_int_equal(tsup_verify(e, b, 2), 0);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

static void
test_torn_journal_tail(void **state)
{
	struct scfg c = { 0 };
	char *dir = tsup_mkdtemp(), path[600];
	struct kvt_engine *e = store_engine_ok(dir, &c);
	static const uint8_t junk[40] = { 'K', 'V', 'T', 'R', 1, 0, 0, 0, 0xff };
	int fd;

	park_session(e, 5, 5, 9);
	kvt_engine_destroy(e);
	snprintf(path, sizeof path, "%s/kvtier.journal", dir);
	fd = open(path, O_WRONLY | O_APPEND);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
	close(fd);
	e = store_engine_ok(dir, &c);
	restore_ok(e, 5, 5, 9);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* A session restored for a tenant with an NVMe budget counts its NVMe slots in that budget
 * (6 blocks parked: 6 slots), and gives them back when closed. */
static void
test_restore_counts_in_budget(void **state)
{
	struct scfg c = { .codec = 0 };
	char *dir = tsup_mkdtemp();
	struct kvt_engine *e = store_engine_ok(dir, &c);
	struct kvt_seq_opts so;
	uint64_t used[KVT_TIER_COUNT];
	kvt_seq_id s = 0;

	(void)state;
	park_session_of(e, 7, 0x1111, 3, 21);
	kvt_engine_destroy(e);
	e = store_engine_ok(dir, &c);
	assert_int_equal(kvt_tenant_set_budget(e, 7, KVT_TIER_NVME, 1000), 0);
	kvt_seq_opts_init(&so, sizeof so);
	so.tenant = 7;
	assert_int_equal(kvt_seq_restore(e, 0x1111, &so, &s), 0);
	assert_int_equal(kvt_tenant_usage(e, 7, used), 0);
	assert_int_equal(used[KVT_TIER_NVME], 6);
	tsup_check_engine(e);
	assert_int_equal(kvt_seq_close(e, s), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_tenant_usage(e, 7, used), 0);
	assert_int_equal(used[KVT_TIER_NVME], 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* Whether kvt_session_list_tenant(@tenant) names @key (and agrees with its count). */
static bool
listed_for(struct kvt_engine *e, uint32_t tenant, uint64_t key)
{
	uint64_t keys[64];
	int n = kvt_session_list_tenant(e, tenant, keys, 64);
	bool found = false;

	assert_true(n >= 0 && n <= 64);
	assert_int_equal(kvt_session_list_tenant(e, tenant, NULL, 0), n);
	for (int i = 0; i < n; i++)
		found |= keys[i] == key;
	return found;
}

/* Hardening 6: stored sessions keep their tenant across a restart. kvt_seq_restore takes the
 * tenant from the record and refuses another (-EPERM; it used to give the caller the session,
 * under the caller's tenant), kvt_session_list_tenant lists only the tenant's sessions,
 * kvt_session_drop_tenant refuses another tenant's; the operator's kvt_session_list and
 * kvt_session_drop still see every tenant. */
static void
test_sessions_across_tenants(void **state)
{
	struct scfg c = { .codec = 0 };
	char *dir = tsup_mkdtemp();
	struct kvt_engine *e = store_engine_ok(dir, &c);
	struct kvt_seq_opts so;
	struct kvt_seq_info info;
	uint64_t keys[8];
	kvt_seq_id s = 0;

	(void)state;
	park_session_of(e, 3, 0x31, 4, 10);
	park_session_of(e, 3, 0x32, 5, 6);
	park_session_of(e, 4, 0x41, 6, 9);
	kvt_engine_destroy(e);
	e = store_engine_ok(dir, &c);
	/* list: per tenant, and all of them for the operator */
	assert_int_equal(kvt_session_list(e, keys, 8), 3);
	assert_int_equal(kvt_session_list_tenant(e, 3, keys, 8), 2);
	assert_true(listed_for(e, 3, 0x31) && listed_for(e, 3, 0x32) && !listed_for(e, 3, 0x41));
	assert_true(listed_for(e, 4, 0x41) && !listed_for(e, 4, 0x31));
	assert_int_equal(kvt_session_list_tenant(e, 5, keys, 8), 0);
	assert_int_equal(kvt_session_list_tenant(NULL, 3, keys, 8), -EINVAL);
	/* restore: another tenant (and the default tenant 0) is refused, nothing changes */
	kvt_seq_opts_init(&so, sizeof so);
	so.tenant = 4;
	assert_int_equal(kvt_seq_restore(e, 0x31, &so, &s), -EPERM);
	assert_non_null(strstr(kvt_last_error_message(), "another tenant"));
	assert_int_equal(s, 0);
	assert_int_equal(kvt_seq_restore(e, 0x31, NULL, &s), -EPERM);
	assert_true(listed_for(e, 3, 0x31));
	tsup_check_engine(e);
	/* drop: another tenant is refused and the session stays */
	assert_int_equal(kvt_session_drop_tenant(e, 4, 0x32), -EPERM);
	assert_true(listed_for(e, 3, 0x32));
	assert_int_equal(kvt_session_drop_tenant(e, 4, 0x99), -ENOENT);
	/* the owner restores (with its tenant) and drops */
	so.tenant = 3;
	assert_int_equal(kvt_seq_restore(e, 0x31, &so, &s), 0);
	assert_int_equal(kvt_seq_info(e, s, &info), 0);
	assert_int_equal(info.tenant, 3);
	assert_int_equal(kvt_seq_resume(e, s), 0);
	assert_int_equal(tsup_verify(e, s, 4), 0);
	assert_false(listed_for(e, 3, 0x31)); /* open: not restorable */
	assert_int_equal(kvt_session_drop_tenant(e, 3, 0x32), 0);
	assert_false(listed_for(e, 3, 0x32));
	assert_int_equal(kvt_session_list_tenant(e, 3, keys, 8), 0);
	/* the operator's drop takes any tenant's */
	assert_int_equal(kvt_session_drop(e, 0x41), 0);
	assert_int_equal(kvt_session_list(e, keys, 8), 0);
	assert_int_equal(kvt_seq_close(e, s), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_restore_raw),
		cmocka_unit_test(test_restore_codec),
		cmocka_unit_test(test_fingerprint_mismatch),
		cmocka_unit_test(test_damaged_session_absent),
		cmocka_unit_test(test_close_drop_and_full),
		cmocka_unit_test(test_bitflip_codec),
		cmocka_unit_test(test_torn_journal_tail),
		cmocka_unit_test(test_lost_and_late_completions),
		cmocka_unit_test(test_enospc_gives_back_clean_copies),
		cmocka_unit_test(test_restore_counts_in_budget),
		cmocka_unit_test(test_sessions_across_tenants),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
