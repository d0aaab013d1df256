/* SPDX-License-Identifier: MIT */
/*
 * tests/test_store_prefix.c - what the persistent NVMe store keeps per block, through the engine:
 * bit flips that the codec cannot see (a mantissa byte of a raw block, an LZ4 literal) caught by
 * the checksum and never served; the block's prefix key stored as its content hash; and shared
 * prefix blocks found again after a restart (confirmed by tokens, never by key alone).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <string.h>

#include "engine/engine_impl.h"
#include "support/kvt_test.h"
#include "tiers/codec.h"

#define SLOT_BYTES 4096u /* 128-byte header + a 1024-byte test block, rounded up */

static int dur_codec; /* nvme_codec of dur_engine */
static const struct kvt_nvme_fault_hooks *dur_hooks; /* NVMe hooks of dur_engine */

static struct kvt_engine *
dur_engine(const char *dir, uint32_t nvme_blocks)
{
	struct kvt_engine_opts o;

	tsup_store_opts(&o, dir, (uint64_t)nvme_blocks * SLOT_BYTES);
	o.nvme_codec = dur_codec;
	o.nvme_codec_min_saving = 0.05f;
	return tsup_create(&o, dur_hooks);
}

static void
dur_park(struct kvt_engine *e, kvt_seq_id s)
{
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	tsup_check_engine(e);
}

/* Bit flips that the codec does not notice: one in a mantissa byte of a raw block, one in a
 * literal of the first LZ4 sequence of an encoded block (it still decodes, to other bytes). */
static struct {
	int mode;          /* 1: flip the raw block's first mantissa byte; 2: an LZ4 literal */
	unsigned flipped;  /* reads changed */
	unsigned decodes;  /* mode 2: of those, still decodable after the flip */
} bf;

static void
bf_hook(void *arg, bool is_write, uint32_t slot, void *buf, size_t len, uint64_t off, int *res)
{
	static uint8_t out[8192], scratch[65536];
	struct kvt_fmt_blkhdr h;
	uint8_t *p = (uint8_t *)buf + KVT_FMT_HDR_PAGE;
	size_t lit, at = 1;

	(void)arg, (void)slot;
	if (is_write || !bf.mode || *res < 0)
		return;
	/* every read starts at its slot: the header page comes in with the payload */
	assert_int_equal((off - KVT_FMT_DATA_OFF) %
			 (4096 + ((tsup_block_bytes() + 4095) & ~(size_t)4095)), 0);
	if (kvt_fmt_blkhdr_decode(buf, len, &h) != 0)
		return;
	assert_true(tsup_block_bytes() <= sizeof out);
	assert_true(kvt_codec_scratch_bytes(tsup_block_bytes()) <= sizeof scratch);
	if (bf.mode == 1) {
		assert_int_equal(h.codec, KVT_CODEC_NONE);
		p[0] ^= 0x01; /* lowest mantissa byte of the first (little-endian) float */
		bf.flipped++;
		return;
	}
	assert_int_not_equal(h.codec, KVT_CODEC_NONE);
	lit = p[0] >> 4; /* the first LZ4 token: its literal run follows */
	if (lit == 15)
		while (lit += p[at], p[at++] == 255)
			;
	assert_true(lit > 0 && at + lit <= h.stored_len);
	p[at] ^= 0x01;
	bf.flipped++;
	if (kvt_codec_decode((int)h.codec, sizeof(float), p, h.stored_len, out,
			     tsup_block_bytes(), scratch) == 0)
		bf.decodes++;
}

static void
bitflip_case(int codec, int mode)
{
	static const struct kvt_nvme_fault_hooks hooks = { .on_complete = bf_hook };
	struct kvt_stats st = { .size = sizeof st };
	char *dir = tsup_mkdtemp();
	struct kvt_seq_info info;
	struct kvt_engine *e;
	kvt_seq_id a;

	memset(&bf, 0, sizeof bf);
	dur_codec = codec;
	dur_hooks = &hooks;
	e = dur_engine(dir, 16);
	dur_hooks = NULL;
	dur_codec = 0;
	a = tsup_session_written(e, 0, 1, 8);
	dur_park(e, a);
	bf.mode = mode;
	assert_int_equal(kvt_seq_resume(e, a), 0);
	assert_int_equal(tsup_verify(e, a, 1), KVT_ELOST); /* detected, never served */
	bf.mode = 0;
	assert_int_equal(kvt_engine_stats(e, &st), 0);
	assert_true(bf.flipped > 0);
	assert_int_equal(st.checksum_failed, bf.flipped);
	assert_int_equal(st.checksum_verified, 0);
	if (mode == 2)
		assert_int_equal(bf.decodes, bf.flipped); /* the codec could not tell */
	assert_int_equal(kvt_seq_info(e, a, &info), 0);
	assert_int_equal(info.blocks_in[KVT_TIER_HOST], 0); /* no failed read left present */
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

static void
test_bitflip_raw_mantissa(void **state)
{
	(void)state;
	bitflip_case(KVT_CODEC_NONE, 1);
}

static void
test_bitflip_lz4_literal(void **state)
{
	(void)state;
	bitflip_case(KVT_CODEC_SHUF_LZ4, 2);
}

/* A parked session's full blocks carry their prefix key as content hash, in the block header
 * and the journal record, so a restarted engine can look them up (kvt_store_find_hash). */
static void
test_content_hash_stored(void **state)
{
	char *dir = tsup_mkdtemp();
	struct kvt_store_sess *ss = NULL;
	struct kvt_fmt_blkhdr h;
	struct kvt_seqrec *sr;
	struct kvt_engine *e;
	uint64_t hash[2];
	uint32_t idx = 99;
	kvt_seq_id a;

	(void)state;
	e = dur_engine(dir, 16);
	a = tsup_session_written(e, 5, 5, 8);
	sr = &e->seqs[(uint32_t)a];
	assert_true(kvt_blk(e, sr->blocks[1])->hashed);
	memcpy(hash, kvt_blk(e, sr->blocks[1])->hash, sizeof hash);
	dur_park(e, a);
	kvt_engine_destroy(e);
	e = dur_engine(dir, 16);
	assert_true(kvt_store_find_hash(e->store, (const uint8_t *)hash, &ss, &idx));
	assert_int_equal(ss->key, 5);
	assert_int_equal(idx, 1);
	assert_int_equal(kvt_nvme_read_header(e->nvme, ss->blocks[1].slot, &h), 0);
	assert_memory_equal(h.hash, hash, sizeof hash);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* Shared prefix blocks are found again after a restart: a prompt parked in a stored session is
 * matched and attached by a new sequence (read back byte-exact from the stored slots, confirmed
 * by tokens), and restoring the stored session afterwards shares those blocks. */
static void
test_prefix_found_after_restart(void **state)
{
	char *dir = tsup_mkdtemp();
	struct kvt_engine *e;
	enum kvt_tier tier;
	int32_t tok[10], other[10];
	uint64_t got = 0;
	kvt_seq_id a, c, d;

	(void)state;
	for (int i = 0; i < 10; i++)
		tok[i] = other[i] = i; /* tsup_append_write's tokens are the positions */
	other[5] = 99;
	e = dur_engine(dir, 16);
	a = tsup_session_written(e, 9, 9, 10); /* blocks 0 and 1 full, 2 partial */
	dur_park(e, a);
	kvt_engine_destroy(e);

	e = dur_engine(dir, 16);
	assert_int_equal(kvt_seq_match_prefix(e, NULL, tok, 10, &got, &tier), 0);
	assert_int_equal(got, 8);
	assert_int_equal(tier, KVT_TIER_NVME);
	assert_int_equal(kvt_seq_match_prefix(e, NULL, other, 10, &got, &tier), 0);
	assert_int_equal(got, 4); /* block 1's tokens differ: its key does too */
	assert_int_equal(kvt_seq_open(e, NULL, &c), 0);
	assert_int_equal(kvt_seq_attach_prefix(e, c, tok, 10, &got), 0);
	assert_int_equal(got, 8);
	assert_int_equal(tsup_verify(e, c, 9), 0); /* K/V read back from the stored slots */
	tsup_check_engine(e);
	/* a second sequence shares the blocks now in memory */
	assert_int_equal(kvt_seq_open(e, NULL, &d), 0);
	assert_int_equal(kvt_seq_attach_prefix(e, d, tok, 10, &got), 0);
	assert_int_equal(got, 8);
	assert_int_equal(tsup_verify(e, d, 9), 0);
	/* the stored session itself still restores whole, sharing those blocks */
	tsup_restore(e, 9, 9, &a);
	assert_int_equal(tsup_append_write(e, c, 9, 8, 2), 0); /* c grows past the prefix */
	assert_int_equal(tsup_verify(e, c, 9), 0);
	assert_int_equal(kvt_seq_close(e, d), 0);
	assert_int_equal(kvt_seq_close(e, a), 0);
	assert_int_equal(tsup_verify(e, c, 9), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* Hardening 6 after a restart: a session stored by tenant 1 (default salt) is found by tenant 1's
 * prompts but never by tenant 8's, whatever salt tenant 8 gives: not with salt
 * 0x8000000000000001, which used to be tenant 1's derived salt (same keys), and not by key
 * alone either (the record's tenant is compared). */
static void
test_prefix_after_restart_per_tenant(void **state)
{
	static const uint64_t salts[] = { 0, 1, 0x8000000000000001ull };
	char *dir = tsup_mkdtemp();
	struct kvt_seq_opts o1, o8;
	struct kvt_engine *e;
	int32_t tok[10];
	uint64_t got = 0;
	kvt_seq_id a, c;

	(void)state;
	for (int i = 0; i < 10; i++)
		tok[i] = i; /* tsup_append_write's tokens are the positions */
	kvt_seq_opts_init(&o1, sizeof o1);
	kvt_seq_opts_init(&o8, sizeof o8);
	o1.tenant = 1;
	o1.session_key = 9;
	o8.tenant = 8;
	e = dur_engine(dir, 16);
	assert_int_equal(kvt_seq_open(e, &o1, &a), 0);
	assert_int_equal(tsup_append_write(e, a, 9, 0, 10), 0);
	dur_park(e, a);
	kvt_engine_destroy(e);

	e = dur_engine(dir, 16);
	for (size_t i = 0; i < sizeof salts / sizeof *salts; i++) {
		o8.salt = salts[i];
		got = 1;
		assert_int_equal(kvt_seq_match_prefix(e, &o8, tok, 10, &got, NULL), 0);
		assert_int_equal(got, 0);
		assert_int_equal(kvt_seq_open(e, &o8, &c), 0);
		got = 1;
		assert_int_equal(kvt_seq_attach_prefix(e, c, tok, 10, &got), 0);
		assert_int_equal(got, 0);
		assert_int_equal(kvt_seq_close(e, c), 0);
	}
	tsup_check_engine(e);
	o1.session_key = 0;
	assert_int_equal(kvt_seq_match_prefix(e, &o1, tok, 10, &got, NULL), 0);
	assert_int_equal(got, 8); /* the owner's prompts find it */
	assert_int_equal(kvt_seq_open(e, &o1, &c), 0);
	assert_int_equal(kvt_seq_attach_prefix(e, c, tok, 10, &got), 0);
	assert_int_equal(got, 8);
	assert_int_equal(tsup_verify(e, c, 9), 0);
	assert_int_equal(kvt_seq_close(e, c), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* Key collisions across tenants: with every key equal (chain_only_hash below ignores the salt
 * material, so tenant 2's keys are tenant 1's), a stored session of tenant 1 is still never
 * attached by tenant 2: kvt_persist_prefix compares the record's tenant. */
static void chain_only_hash(const uint64_t parent[2], const int32_t *tokens, uint32_t n,
			    const uint64_t salt[2], uint64_t out[2]);

static void
test_prefix_after_restart_tenant_not_key(void **state)
{
	char *dir = tsup_mkdtemp();
	struct kvt_seq_opts o1, o2;
	struct kvt_engine *e;
	int32_t tok[8];
	uint64_t got = 1;
	kvt_seq_id a, c;

	(void)state;
	for (int i = 0; i < 8; i++)
		tok[i] = i;
	kvt_seq_opts_init(&o1, sizeof o1);
	kvt_seq_opts_init(&o2, sizeof o2);
	o1.tenant = 1;
	o1.session_key = 9;
	o2.tenant = 2;
	kvt_test_prefix_hash = chain_only_hash;
	e = dur_engine(dir, 16);
	assert_int_equal(kvt_seq_open(e, &o1, &a), 0);
	assert_int_equal(tsup_append_write(e, a, 9, 0, 8), 0);
	dur_park(e, a);
	kvt_engine_destroy(e);
	e = dur_engine(dir, 16);
	assert_int_equal(kvt_seq_match_prefix(e, &o2, tok, 8, &got, NULL), 0);
	assert_int_equal(got, 0);
	assert_int_equal(kvt_seq_open(e, &o2, &c), 0);
	assert_int_equal(kvt_seq_attach_prefix(e, c, tok, 8, &got), 0);
	assert_int_equal(got, 0);
	o1.session_key = 0;
	assert_int_equal(kvt_seq_match_prefix(e, &o1, tok, 8, &got, NULL), 0);
	assert_int_equal(got, 8); /* same keys, same tenant: found */
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	kvt_test_prefix_hash = NULL;
	tsup_rmdir(dir);
}

/* Every block's key depends only on its parent's: keys collide for any two prompts. */
static void
chain_only_hash(const uint64_t parent[2], const int32_t *tokens, uint32_t n,
		const uint64_t salt[2], uint64_t out[2])
{
	(void)tokens, (void)n, (void)salt;
	out[0] = parent[0] * 31 + 7;
	out[1] = parent[1] + 1;
}

/* A stored block whose key matches but whose tokens differ is never attached. */
static void
test_prefix_after_restart_needs_tokens(void **state)
{
	char *dir = tsup_mkdtemp();
	struct kvt_engine *e;
	int32_t other[8];
	uint64_t got = 1;
	kvt_seq_id a, c;

	(void)state;
	for (int i = 0; i < 8; i++)
		other[i] = i;
	other[6] = 77; /* block 1 differs */
	kvt_test_prefix_hash = chain_only_hash;
	e = dur_engine(dir, 16);
	a = tsup_session_written(e, 9, 9, 8);
	dur_park(e, a);
	kvt_engine_destroy(e);
	e = dur_engine(dir, 16);
	assert_int_equal(kvt_seq_open(e, NULL, &c), 0);
	assert_int_equal(kvt_seq_attach_prefix(e, c, other, 8, &got), 0);
	assert_int_equal(got, 4); /* block 0 only: same key as block 1, other tokens */
	assert_int_equal(tsup_verify(e, c, 9), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	kvt_test_prefix_hash = NULL;
	tsup_rmdir(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bitflip_raw_mantissa),
		cmocka_unit_test(test_bitflip_lz4_literal),
		cmocka_unit_test(test_content_hash_stored),
		cmocka_unit_test(test_prefix_found_after_restart),
		cmocka_unit_test(test_prefix_after_restart_needs_tokens),
		cmocka_unit_test(test_prefix_after_restart_per_tenant),
		cmocka_unit_test(test_prefix_after_restart_tenant_not_key),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
