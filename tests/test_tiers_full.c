/* SPDX-License-Identifier: MIT */
/*
 * tests/test_tiers_full.c - full tiers (issue 15, items 2 and 3), through the public API.
 *
 * Item 2: a full NVMe tier must still drop cached blocks nobody references (prefix_cache=1):
 * a park to NVMe that returns 0 has its blocks on NVMe once drained, and a keyed session parked
 * that way is in the store after a restart.
 * Item 3: whatever fits in the tiers combined, less the documented reserve (one slot per tier
 * below HBM, kvtier.h kvt_seq_append), reads back through windows of any size that fits HBM;
 * a sequence that can never fit is answered KVT_ETOOBIG at once, the sequence unchanged.
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "support/kvt_test.h"

/* One NVMe slot of the test layout: a 4 KiB header page + the 1 KiB block rounded up. */
#define NVME_SLOT_BYTES 8192u

struct shape {
	uint32_t hbm, host, nvme; /* slots per tier (host, nvme: 0 = none) */
	uint32_t prefix_cache;
	bool persist;             /* nvme_persist in dir */
	bool no_watermarks;
};

static struct kvt_engine *
shape_engine(const struct shape *sh, const char *dir)
{
	struct kvt_engine_opts o;
	struct kvt_geometry g;
	struct kvt_engine *e;

	tsup_opts_init(&o);
	o.hbm_bytes = (uint64_t)sh->hbm * tsup_block_bytes();
	o.host_bytes = (uint64_t)sh->host * tsup_block_bytes();
	o.emu_seed = 42;
	o.prefix_cache = sh->prefix_cache;
	if (sh->no_watermarks)
		o.high_watermark = o.low_watermark = 1.0f;
	if (sh->nvme) {
		o.nvme_dir = dir;
		o.nvme_bytes = (uint64_t)sh->nvme * NVME_SLOT_BYTES;
		o.nvme_persist = sh->persist;
	}
	e = tsup_create(&o, NULL);
	assert_int_equal(kvt_engine_geometry(e, &g), 0);
	assert_int_equal(g.hbm_slots, sh->hbm);
	assert_int_equal(g.host_slots, sh->host);
	assert_int_equal(g.nvme_slots, sh->nvme);
	return e;
}

/* Prepare blocks [first, first + n) of @s, wait, compare with pattern @tag, release. 0, 1 on a
 * data mismatch, or prepare's error (printed). */
static int
verify_window(struct kvt_engine *e, kvt_seq_id s, uint32_t tag, uint32_t first, uint32_t n)
{
	struct kvt_seq_range r = { .seq = s, .first_block = first, .n_blocks = n };
	struct kvt_block_table bt;
	struct kvt_batch *b = NULL;
	uint32_t l;
	int rc;

	rc = kvt_batch_prepare_ranges(e, &r, 1, &b);
	if (rc) {
		print_error("prepare blocks [%u, +%u): %d %s\n", first, n, rc,
			    kvt_last_error_message());
		return rc;
	}
	for (l = 0; l < TSUP_LAYERS && rc == 0; l++)
		rc = kvt_batch_wait_layer(b, l, NULL);
	if (rc == 0) {
		assert_int_equal(kvt_batch_block_table(b, &bt), 0);
		assert_int_equal(bt.first_block[0], first);
		rc = tsup_check_entry(&bt, 0, tag);
		if (rc)
			print_error("blocks [%u, +%u): bytes differ\n", first, n);
	}
	assert_int_equal(kvt_batch_release(b, NULL), 0);
	return rc;
}

/* Read all @n_blocks of @s through windows of @win blocks (the last one may be shorter). */
static int
verify_windows(struct kvt_engine *e, kvt_seq_id s, uint32_t tag, uint32_t n_blocks, uint32_t win)
{
	uint32_t first;
	int rc = 0;

	for (first = 0; first < n_blocks && rc == 0; first += win)
		rc = verify_window(e, s, tag, first,
				   n_blocks - first < win ? n_blocks - first : win);
	return rc;
}

/* Append @n_blocks full blocks to the open @s (pattern @tag) one at a time, each released by a
 * one-block batch of it (as a server's prefill in chunks). Returns the first error, or 0. */
static int
write_blocks(struct kvt_engine *e, kvt_seq_id s, uint32_t tag, uint32_t from, uint32_t n_blocks)
{
	uint32_t i;
	int rc;

	for (i = from; i < from + n_blocks; i++) {
		struct kvt_seq_range r = { .seq = s, .first_block = i, .n_blocks = 1 };
		struct kvt_batch *b;

		rc = tsup_append_write(e, s, tag, (uint64_t)i * TSUP_TPB, TSUP_TPB);
		if (rc) {
			print_error("append of block %u: %d %s\n", i, rc,
				    kvt_last_error_message());
			return rc;
		}
		rc = kvt_batch_prepare_ranges(e, &r, 1, &b);
		if (rc) {
			print_error("prepare of block %u: %d %s\n", i, rc,
				    kvt_last_error_message());
			return rc;
		}
		assert_int_equal(kvt_batch_release(b, NULL), 0);
	}
	return 0;
}

/* ---- item 2 */

static kvt_seq_id
salted_seq(struct kvt_engine *e, uint64_t salt, uint64_t key)
{
	struct kvt_seq_opts so;
	kvt_seq_id s;

	kvt_seq_opts_init(&so, sizeof so);
	so.salt = salt;
	so.session_key = key;
	assert_int_equal(kvt_seq_open(e, &so, &s), 0);
	return s;
}

/*
 * NVMe 8 slots: a live session A's 4 blocks only there (the coldest), then 4 cached blocks
 * nobody references (B, closed). A keyed session C parked to NVMe needs 4 slots: the cached
 * blocks must go. The park returns 0, so after drain its blocks are on NVMe, and after a restart
 * the store has it.
 */
static void
test_full_nvme_drops_cached(void **state)
{
	struct shape sh = { .hbm = 8, .host = 4, .nvme = 8, .prefix_cache = 1, .persist = true,
			    .no_watermarks = true };
	char *dir = tsup_mkdtemp();
	struct kvt_engine *e;
	kvt_seq_id a, b, c;
	uint64_t keys[4];
	int rc;

	(void)state;
	e = shape_engine(&sh, dir);
	a = salted_seq(e, 1, 0);
	assert_int_equal(write_blocks(e, a, 1, 0, 4), 0);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_blocks_in(e, a, KVT_TIER_NVME), 4);
	b = salted_seq(e, 2, 0);
	assert_int_equal(write_blocks(e, b, 2, 0, 4), 0);
	assert_int_equal(kvt_seq_park(e, b, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_blocks_in(e, b, KVT_TIER_NVME), 4);
	assert_int_equal(kvt_seq_close(e, b), 0); /* 4 cached blocks, on NVMe only */
	assert_int_equal(tsup_stats(e).tier[KVT_TIER_NVME].used_slots, 8);
	c = salted_seq(e, 3, 0xc0ffee);
	assert_int_equal(write_blocks(e, c, 3, 0, 4), 0);
	rc = kvt_seq_park(e, c, KVT_TIER_NVME);
	if (rc)
		print_error("park C: %d %s\n", rc, kvt_last_error_message());
	assert_int_equal(rc, 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_blocks_in(e, c, KVT_TIER_NVME), 4);
	assert_int_equal(tsup_blocks_in(e, c, KVT_TIER_HOST), 0);
	assert_int_equal(tsup_blocks_in(e, a, KVT_TIER_NVME), 4); /* A kept */
	tsup_check_engine(e);
	assert_int_equal(verify_windows(e, a, 1, 4, 4), 0);
	kvt_engine_destroy(e);
	/* after a restart C is in the store, byte-exact */
	e = shape_engine(&sh, dir);
	assert_int_equal(kvt_session_list(e, keys, 4), 1);
	assert_int_equal(keys[0], 0xc0ffee);
	tsup_restore(e, 0xc0ffee, 3, &c);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/*
 * NVMe full of live sessions' blocks only (nothing cached, nothing stored): a park to NVMe has
 * no room. It fails with -ENOSPC at once and a message, the sequence stays readable; it does not
 * return 0 with its blocks left in HOST.
 */
static void
test_full_nvme_park_fails_clearly(void **state)
{
	struct shape sh = { .hbm = 8, .host = 4, .nvme = 8, .prefix_cache = 1, .persist = true,
			    .no_watermarks = true };
	char *dir = tsup_mkdtemp();
	struct kvt_engine *e;
	kvt_seq_id a, b, c;
	uint64_t keys[4];
	int rc;

	(void)state;
	e = shape_engine(&sh, dir);
	a = salted_seq(e, 1, 0);
	assert_int_equal(write_blocks(e, a, 1, 0, 4), 0);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_NVME), 0);
	b = salted_seq(e, 2, 0);
	assert_int_equal(write_blocks(e, b, 2, 0, 4), 0);
	assert_int_equal(kvt_seq_park(e, b, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	c = salted_seq(e, 3, 0xbeef);
	assert_int_equal(write_blocks(e, c, 3, 0, 3), 0);
	rc = kvt_seq_park(e, c, KVT_TIER_NVME);
	assert_int_equal(kvt_engine_drain(e), 0);
	if (rc == 0) /* then it must be on NVMe */
		assert_int_equal(tsup_blocks_in(e, c, KVT_TIER_NVME), 3);
	assert_int_equal(rc, -ENOSPC);
	assert_non_null(strstr(kvt_last_error_message(), "NVMe"));
	tsup_check_engine(e);
	assert_int_equal(verify_windows(e, c, 3, 3, 3), 0);
	assert_int_equal(verify_windows(e, a, 1, 4, 4), 0);
	assert_int_equal(verify_windows(e, b, 2, 4, 4), 0);
	kvt_engine_destroy(e);
	e = shape_engine(&sh, dir);
	assert_int_equal(kvt_session_list(e, keys, 4), 0); /* C was never published */
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_full_nvme_drops_cached),
		cmocka_unit_test(test_full_nvme_park_fails_clearly),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
