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
	kvt_seq_id s = tsup_open(e, tenant, 0, key);

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

/* ---- hardening 5: journal records whose checksum verifies but whose fields do not --------- */

enum jm_field { JM_NTOKENS, JM_SLOT, JM_LENC, JM_KEY, JM_SEQNO, JM_PRIORITY };

struct jm_case {
	const char *what;
	enum jm_field field;
	uint64_t value;
};

/* Rewrite the journal in @dir through the format's own encoder (every checksum recomputed), with
 * field @m of the PUT of @key (block 1 for slot and length code) set to m->value. */
static void
journal_mutate(const char *dir, uint64_t key, const struct jm_case *m)
{
	char path[600];
	uint8_t *in, *out;
	size_t off = KVT_FMT_JHDR_BYTES, o = KVT_FMT_JHDR_BYTES, used, cap;
	struct kvt_fmt_rec r;
	struct stat sb;
	int fd, hits = 0;

	snprintf(path, sizeof path, "%s/kvtier.journal", dir);
	fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(fstat(fd, &sb), 0);
	cap = (size_t)sb.st_size + 4096;
	in = malloc((size_t)sb.st_size);
	out = calloc(1, cap);
	assert_non_null(in);
	assert_non_null(out);
	assert_int_equal(pread(fd, in, (size_t)sb.st_size, 0), sb.st_size);
	memcpy(out, in, KVT_FMT_JHDR_BYTES);
	while (kvt_fmt_rec_decode(in + off, (size_t)sb.st_size - off, &r, &used) == 0) {
		struct kvt_fmt_blkref b[16];
		int32_t tok[256];
		uint64_t nt = r.n_tokens, seqno = r.seqno, sess = r.session;
		uint32_t prio = r.priority;

		off += used;
		if (r.type == KVT_FMT_REC_DEL) {
			kvt_fmt_del_encode(out + o, r.seqno, r.session);
			o += kvt_fmt_del_bytes();
			continue;
		}
		assert_true(r.n_blocks <= 16 && r.n_tokens <= 64);
		for (uint32_t i = 0; i < r.n_blocks; i++)
			kvt_fmt_rec_block(&r, i, &b[i]);
		for (uint64_t i = 0; i < 256; i++)
			tok[i] = i < r.n_tokens ? kvt_fmt_rec_token(&r, i) : (int32_t)i;
		if (r.session == key) {
			hits++;
			switch (m->field) {
			case JM_NTOKENS: nt = m->value; break;
			case JM_SLOT: b[1].slot = (uint32_t)m->value; break;
			case JM_LENC: b[1].lenc = (uint32_t)m->value; break;
			case JM_KEY: sess = m->value; break;
			case JM_SEQNO: seqno = m->value; break;
			case JM_PRIORITY: prio = (uint32_t)m->value; break;
			}
		}
		assert_true(nt <= 256);
		assert_true(o + kvt_fmt_put_bytes(r.n_blocks, nt) <= cap);
		kvt_fmt_put_encode(out + o, seqno, sess, r.tenant, prio, b, r.n_blocks, tok, nt);
		o += kvt_fmt_put_bytes(r.n_blocks, nt);
	}
	assert_int_equal(off, (size_t)sb.st_size);
	assert_int_equal(hits, 1);
	assert_int_equal(ftruncate(fd, 0), 0);
	assert_int_equal(pwrite(fd, out, o, 0), (ssize_t)o);
	close(fd);
	free(in);
	free(out);
}

static char jm_log[4096];

static void
jm_log_fn(void *arg, int level, const char *msg)
{
	(void)arg;
	if (level <= KVT_LOG_WARN && strlen(jm_log) + strlen(msg) + 2 < sizeof jm_log) {
		strcat(jm_log, msg);
		strcat(jm_log, "\n");
	}
}

/*
 * One bad field per case, in a record whose checksum verifies (rewritten by the encoder): the
 * session is dropped at open with a warning naming the field, reads as absent (not listed,
 * restore -ENOENT), and the other session of the journal restores and grows as before. Before
 * the checks, a session with more tokens than its blocks hold restored and its next append
 * wrote past the sequence's block array (ASan: heap-buffer-overflow), one with too few tokens
 * broke the engine's invariants, the others were listed though they could never restore, and a
 * priority out of range ended the replay there (losing every later session).
 */
static void
test_bad_record_fields(void **state)
{
	static const struct jm_case cases[] = {
		{ "more tokens than its blocks hold", JM_NTOKENS, 3 * TSUP_TPB * 5 + 1 },
		{ "one token more than its blocks hold", JM_NTOKENS, 3 * TSUP_TPB + 1 },
		{ "a last block without tokens", JM_NTOKENS, 2 * TSUP_TPB },
		{ "no tokens, three blocks", JM_NTOKENS, 0 },
		{ "slot == the tier's slots", JM_SLOT, 64 },
		{ "slot 0xffffffff", JM_SLOT, 0xffffffffu },
		{ "length code 0 (unknown)", JM_LENC, 0 },
		{ "length code of a codec the store does not write", JM_LENC,
		  KVT_FMT_LENC_KNOWN | KVT_CODEC_LZ4 << 12 | 7 },
		{ "length code with bits above 16", JM_LENC, 0x18000u | KVT_FMT_LENC_QMAX },
		{ "session key 0", JM_KEY, 0 },
		{ "seqno 0", JM_SEQNO, 0 },
		{ "seqno 2^64-1", JM_SEQNO, UINT64_MAX },
		{ "priority 101", JM_PRIORITY, 101 },
		{ "priority 2^32-1", JM_PRIORITY, UINT32_MAX },
	};
	struct scfg c = { 0 };

	(void)state;
	for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
		const struct jm_case *m = &cases[k];
		uint64_t victim = m->field == JM_KEY ? m->value : 0xa1;
		char *dir = tsup_mkdtemp();
		struct kvt_engine_opts o;
		struct kvt_engine *e = store_engine_ok(dir, &c);
		struct kvt_seq_info info;
		bool was_listed;
		kvt_seq_id s = 0;
		int rc;

		print_message("case: %s\n", m->what);
		park_session(e, 0xa1, 2, 12); /* 3 blocks of TSUP_TPB tokens; its PUT comes first */
		park_session(e, 0xb2, 6, 9);
		kvt_engine_destroy(e);
		journal_mutate(dir, 0xa1, m);
		tsup_store_opts(&o, dir, 64ull * SLOT_BYTES);
		o.log = jm_log_fn;
		jm_log[0] = '\0';
		e = NULL;
		assert_int_equal(kvt_engine_create(&o, &e), 0);
		was_listed = listed(e, victim);
		rc = kvt_seq_restore(e, victim, NULL, &s);
		if (rc == 0) {
			/* what a caller would do next (the overflow happened here) */
			assert_int_equal(kvt_seq_info(e, s, &info), 0);
			(void)kvt_seq_resume(e, s);
			(void)tsup_append_write(e, s, 2, info.n_tokens, 5);
			tsup_check_engine(e);
		}
		assert_false(was_listed);
		assert_int_equal(rc, -ENOENT);
		assert_non_null(strstr(jm_log, "dropped"));
		s = restore_ok(e, 0xb2, 6, 9);
		assert_int_equal(tsup_append_write(e, s, 6, 9, 5), 0);
		assert_int_equal(tsup_verify(e, s, 6), 0);
		tsup_check_engine(e);
		kvt_engine_destroy(e);
		tsup_rmdir(dir);
	}
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

/* Append to the journal in @dir, through the format's own encoder (checksum recomputed), a copy
 * of the PUT of @key with only its session key set to @fkey and its tenant to @ftenant (and the
 * next seqno): a forged record naming another tenant's blocks. */
static void
journal_forge(const char *dir, uint64_t key, uint64_t fkey, uint32_t ftenant)
{
	char path[600];
	uint8_t *in, *out;
	size_t off = KVT_FMT_JHDR_BYTES, used, n;
	uint64_t max_seqno = 0, nt = 0;
	struct kvt_fmt_blkref b[16];
	int32_t tok[64];
	uint32_t nb = 0, prio = 0;
	struct kvt_fmt_rec r;
	struct stat sb;
	int fd, hits = 0;

	snprintf(path, sizeof path, "%s/kvtier.journal", dir);
	fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(fstat(fd, &sb), 0);
	in = malloc((size_t)sb.st_size);
	assert_non_null(in);
	assert_int_equal(pread(fd, in, (size_t)sb.st_size, 0), sb.st_size);
	while (kvt_fmt_rec_decode(in + off, (size_t)sb.st_size - off, &r, &used) == 0) {
		off += used;
		if (r.seqno > max_seqno)
			max_seqno = r.seqno;
		if (r.type != KVT_FMT_REC_PUT || r.session != key)
			continue;
		hits++;
		assert_true(r.n_blocks <= 16 && r.n_tokens <= 64);
		nb = r.n_blocks;
		nt = r.n_tokens;
		prio = r.priority;
		for (uint32_t i = 0; i < nb; i++)
			kvt_fmt_rec_block(&r, i, &b[i]);
		for (uint64_t i = 0; i < nt; i++)
			tok[i] = kvt_fmt_rec_token(&r, i);
	}
	assert_int_equal(off, (size_t)sb.st_size);
	assert_int_equal(hits, 1);
	n = kvt_fmt_put_bytes(nb, nt);
	out = calloc(1, n);
	assert_non_null(out);
	kvt_fmt_put_encode(out, max_seqno + 1, fkey, ftenant, prio, b, nb, tok, nt);
	assert_int_equal(pwrite(fd, out, n, sb.st_size), (ssize_t)n);
	close(fd);
	free(in);
	free(out);
}

static int
restore_as(struct kvt_engine *e, uint32_t tenant, uint64_t key, kvt_seq_id *s)
{
	struct kvt_seq_opts so;

	kvt_seq_opts_init(&so, sizeof so);
	so.tenant = tenant;
	*s = 0;
	return kvt_seq_restore(e, key, &so, s);
}

/* Forged record: a copy of tenant 0's PUT (session 1) renamed session 6 of tenant 1, checksum
 * recomputed. Its blocks' headers name session 1 and carry the record's content hashes (the
 * shared-prefix path), so restore used to give tenant 1 tenant 0's bytes, and the same blocks
 * when session 1 was restored first. Now restoring 6 as tenant 1 fails (-EPERM), in either
 * order, and neither session is dropped; session 1 restores byte-exact. */
static void
test_forged_record_of_another_tenant(void **state)
{
	struct scfg c = { .codec = 0 };
	char *dir = tsup_mkdtemp();
	struct kvt_engine *e = store_engine_ok(dir, &c);
	kvt_seq_id s1, s6;

	(void)state;
	park_session(e, 1, 2, 3 * TSUP_TPB); /* full blocks: each carries a content hash */
	kvt_engine_destroy(e);
	journal_forge(dir, 1, 6, 1);
	for (int order = 0; order < 2; order++) {
		print_message("order: %s first\n", order ? "session 1" : "the forged session 6");
		e = store_engine_ok(dir, &c);
		assert_true(listed_for(e, 0, 1) && listed_for(e, 1, 6));
		s1 = 0;
		if (order == 1)
			s1 = restore_ok(e, 1, 2, 3 * TSUP_TPB);
		assert_int_equal(restore_as(e, 1, 6, &s6), -EPERM);
		assert_int_equal(s6, 0);
		assert_non_null(strstr(kvt_last_error_message(), "tenant"));
		assert_true(listed_for(e, 1, 6)); /* refused, not dropped */
		tsup_check_engine(e);
		if (order == 0)
			s1 = restore_ok(e, 1, 2, 3 * TSUP_TPB);
		/* and again, session 1's blocks now live in memory */
		assert_int_equal(restore_as(e, 1, 6, &s6), -EPERM);
		assert_int_equal(tsup_verify(e, s1, 2), 0);
		tsup_check_engine(e);
		assert_int_equal(kvt_seq_detach(e, s1), 0);
		assert_int_equal(kvt_engine_drain(e), 0);
		assert_true(listed_for(e, 0, 1) && listed_for(e, 1, 6));
		kvt_engine_destroy(e);
	}
	tsup_rmdir(dir);
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
		cmocka_unit_test(test_bad_record_fields),
		cmocka_unit_test(test_lost_and_late_completions),
		cmocka_unit_test(test_enospc_gives_back_clean_copies),
		cmocka_unit_test(test_restore_counts_in_budget),
		cmocka_unit_test(test_sessions_across_tenants),
		cmocka_unit_test(test_forged_record_of_another_tenant),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
