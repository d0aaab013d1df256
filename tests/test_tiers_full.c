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

/* The blocks a sequence may hold in @sh: the tiers' slots less one per tier below HBM. */
static uint32_t
shape_limit(const struct shape *sh)
{
	return sh->hbm + sh->host + sh->nvme - (sh->host != 0) - (sh->nvme != 0);
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
		struct kvt_stats st = tsup_stats(e);

		print_error("prepare blocks [%u, +%u): %d %s (seq: HBM %u HOST %u NVMe %u; used "
			    "%u/%u/%u)\n", first, n, rc, kvt_last_error_message(),
			    tsup_blocks_in(e, s, 0), tsup_blocks_in(e, s, 1), tsup_blocks_in(e, s, 2),
			    st.tier[0].used_slots, st.tier[1].used_slots, st.tier[2].used_slots);
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

/* Append @n tokens from token @pos to @s (pattern @tag), then release their write pin with a
 * one-block batch of its last block. */
static int
append_released(struct kvt_engine *e, kvt_seq_id s, uint32_t tag, uint64_t pos, uint32_t n)
{
	struct kvt_seq_range r = { .seq = s, .first_block = (uint32_t)((pos + n - 1) / TSUP_TPB),
				   .n_blocks = 1 };
	struct kvt_batch *b;
	int rc = tsup_append_write(e, s, tag, pos, n);

	if (rc)
		return rc;
	rc = kvt_batch_prepare_ranges(e, &r, 1, &b);
	if (rc) {
		print_error("prepare after append at %llu: %d %s\n", (unsigned long long)pos, rc,
			    kvt_last_error_message());
		return rc;
	}
	return kvt_batch_release(b, NULL);
}

/* ---- item 3 */

/* HBM 32, HOST 32, NVMe 64 slots and one 124-block session: every window size reads it back. */
static void
test_deadlock_124_windows(void **state)
{
	static const uint32_t wins[] = { 1, 2, 8, 16 };
	struct shape sh = { .hbm = 32, .host = 32, .nvme = 64 };
	char *dir = tsup_mkdtemp();
	struct kvt_engine *e;
	kvt_seq_id s;
	uint32_t w;

	(void)state;
	e = shape_engine(&sh, dir);
	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	assert_int_equal(write_blocks(e, s, 7, 0, 124), 0);
	tsup_check_engine(e);
	for (w = 0; w < sizeof wins / sizeof *wins; w++) {
		assert_int_equal(verify_windows(e, s, 7, 124, wins[w]), 0);
		tsup_check_engine(e);
	}
	/* and backwards, one block at a time (every block comes from the far end) */
	for (w = 124; w-- > 0;)
		assert_int_equal(verify_window(e, s, 7, w, 1), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* A sequence that can never fit: the append that would exceed the limit is KVT_ETOOBIG at once
 * and leaves the sequence as it was (readable, same length). */
static void
test_never_fits_etoobig(void **state)
{
	struct shape sh = { .hbm = 32, .host = 32, .nvme = 64 };
	uint32_t limit = shape_limit(&sh);
	char *dir = tsup_mkdtemp();
	struct kvt_seq_info info;
	struct kvt_engine *e;
	int64_t map[2 * TSUP_TPB];
	int32_t tok[2 * TSUP_TPB];
	kvt_seq_id s;
	int rc;

	(void)state;
	for (uint32_t i = 0; i < 2 * TSUP_TPB; i++)
		tok[i] = (int32_t)i;
	e = shape_engine(&sh, dir);
	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	/* up to one token short of the limit, then a partial last block */
	assert_int_equal(write_blocks(e, s, 3, 0, limit - 1), 0);
	assert_int_equal(append_released(e, s, 3, (uint64_t)(limit - 1) * TSUP_TPB,
					 TSUP_TPB - 1), 0);
	/* one more token fills the limit's last block; the next token would need one more */
	assert_int_equal(append_released(e, s, 3, (uint64_t)limit * TSUP_TPB - 1, 1), 0);
	rc = kvt_seq_append(e, s, tok, 1, map);
	if (rc != KVT_ETOOBIG)
		print_error("append past the limit: %d %s\n", rc, kvt_last_error_message());
	assert_int_equal(rc, KVT_ETOOBIG);
	/* twice: never "not now" */
	assert_int_equal(kvt_seq_append(e, s, tok, 2 * TSUP_TPB, map), KVT_ETOOBIG);
	assert_int_equal(kvt_seq_info(e, s, &info), 0);
	assert_int_equal(info.n_blocks, limit);
	assert_int_equal(info.n_tokens, (uint64_t)limit * TSUP_TPB);
	assert_int_equal(verify_windows(e, s, 3, limit, 8), 0);
	assert_int_equal(verify_windows(e, s, 3, limit, 1), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* An HBM-only engine: a sequence longer than HBM is KVT_ETOOBIG, not -ENOSPC for ever. */
static void
test_never_fits_hbm_only(void **state)
{
	struct shape sh = { .hbm = 4 };
	struct kvt_engine *e;
	int64_t map[TSUP_TPB];
	int32_t tok[TSUP_TPB] = { 0 };
	kvt_seq_id s;

	(void)state;
	e = shape_engine(&sh, NULL);
	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	assert_int_equal(write_blocks(e, s, 5, 0, 4), 0);
	assert_int_equal(kvt_seq_append(e, s, tok, 1, map), KVT_ETOOBIG);
	assert_int_equal(verify_windows(e, s, 5, 4, 4), 0);
	kvt_engine_destroy(e);
}

static uint64_t
rnd(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

/* Random small shapes: a sequence of up to the limit's blocks (the last block sometimes
 * partial) reads back exactly through random windows; one block more is KVT_ETOOBIG. */
static void
test_random_small_shapes(void **state)
{
	uint64_t x = 0x9e3779b97f4a7c15ull;
	uint32_t rounds = kvt_test_quick() ? 40 : 300, r;

	(void)state;
	for (r = 0; r < rounds; r++) {
		struct shape sh = { .hbm = 1 + (uint32_t)(rnd(&x) % 5),
				    .host = (uint32_t)(rnd(&x) % 5),
				    .nvme = (uint32_t)(rnd(&x) % 7),
				    .no_watermarks = rnd(&x) % 2 };
		char *dir;

		if (!sh.host)
			sh.nvme = 0; /* an NVME tier stages through HOST */
		dir = sh.nvme ? tsup_mkdtemp() : NULL;
		uint32_t limit, n, i, tail, wins;
		struct kvt_engine *e;
		int64_t map[TSUP_TPB];
		int32_t tok[TSUP_TPB] = { 0 };
		kvt_seq_id s;

		e = shape_engine(&sh, dir);
		limit = shape_limit(&sh);
		n = 1 + (uint32_t)(rnd(&x) % limit);
		if (rnd(&x) % 3 == 0)
			n = limit;
		tail = 1 + (uint32_t)(rnd(&x) % TSUP_TPB); /* tokens of the last block */
		print_message("shape %u: HBM %u HOST %u NVMe %u, %u blocks (limit %u)\n", r,
			      sh.hbm, sh.host, sh.nvme, n, limit);
		assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
		assert_int_equal(write_blocks(e, s, 11 + r, 0, n - 1), 0);
		assert_int_equal(append_released(e, s, 11 + r, (uint64_t)(n - 1) * TSUP_TPB,
						 tail), 0);
		for (wins = 0; wins < 4; wins++) {
			uint32_t w = 1 + (uint32_t)(rnd(&x) % sh.hbm);

			assert_int_equal(verify_windows(e, s, 11 + r, n, w), 0);
			tsup_check_engine(e);
		}
		if (n == limit) {
			if (tail < TSUP_TPB) /* fill the last block: still within the limit */
				assert_int_equal(append_released(e, s, 11 + r,
								 (uint64_t)(n - 1) * TSUP_TPB +
									 tail,
								 TSUP_TPB - tail), 0);
			assert_int_equal(kvt_seq_append(e, s, tok, 1, map), KVT_ETOOBIG);
			tail = TSUP_TPB;
		}
		for (i = n; i-- > 0;)
			assert_int_equal(verify_window(e, s, 11 + r, i, 1), 0);
		tsup_check_engine(e);
		kvt_engine_destroy(e);
		if (dir)
			tsup_rmdir(dir);
	}
}

/* ---- item 2 */

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
	a = tsup_open(e, 0, 1, 0);
	assert_int_equal(write_blocks(e, a, 1, 0, 4), 0);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_blocks_in(e, a, KVT_TIER_NVME), 4);
	b = tsup_open(e, 0, 2, 0);
	assert_int_equal(write_blocks(e, b, 2, 0, 4), 0);
	assert_int_equal(kvt_seq_park(e, b, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_blocks_in(e, b, KVT_TIER_NVME), 4);
	assert_int_equal(kvt_seq_close(e, b), 0); /* 4 cached blocks, on NVMe only */
	assert_int_equal(tsup_stats(e).tier[KVT_TIER_NVME].used_slots, 8);
	c = tsup_open(e, 0, 3, 0xc0ffee);
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
	a = tsup_open(e, 0, 1, 0);
	assert_int_equal(write_blocks(e, a, 1, 0, 4), 0);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_NVME), 0);
	b = tsup_open(e, 0, 2, 0);
	assert_int_equal(write_blocks(e, b, 2, 0, 4), 0);
	assert_int_equal(kvt_seq_park(e, b, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	c = tsup_open(e, 0, 3, 0xbeef);
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

/*
 * Two parks to NVMe back to back while the first one's blocks are still on their way down
 * (HBM -> HOST, slow copies): the NVMe slots the first one found free stay kept for it, so the
 * second one cannot take them. Each park that returns 0 has all its blocks on NVMe after drain;
 * one that cannot fit says -ENOSPC.
 */
static void
test_park_keeps_nvme_room(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_engine *e;
	char *dir = tsup_mkdtemp();
	kvt_seq_id a, b;
	int ra, rb;

	(void)state;
	tsup_opts_init(&o);
	o.hbm_bytes = 8 * tsup_block_bytes();
	o.host_bytes = 8 * tsup_block_bytes();
	o.nvme_dir = dir;
	o.nvme_bytes = 6 * NVME_SLOT_BYTES;
	o.emu_copy_bytes_per_s = 1u << 20; /* 1 ms a block: the copies are in flight for a while */
	o.high_watermark = o.low_watermark = 1.0f;
	e = tsup_create(&o, NULL);
	a = tsup_open(e, 0, 1, 0);
	b = tsup_open(e, 0, 2, 0);
	assert_int_equal(write_blocks(e, a, 1, 0, 4), 0);
	assert_int_equal(write_blocks(e, b, 2, 0, 3), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	ra = kvt_seq_park(e, a, KVT_TIER_NVME);
	rb = kvt_seq_park(e, b, KVT_TIER_NVME);
	assert_int_equal(kvt_engine_drain(e), 0);
	print_message("park A %d, park B %d; A on NVMe %u, B on NVMe %u\n", ra, rb,
		      tsup_blocks_in(e, a, KVT_TIER_NVME), tsup_blocks_in(e, b, KVT_TIER_NVME));
	assert_int_equal(ra, 0);
	assert_int_equal(tsup_blocks_in(e, a, KVT_TIER_NVME), 4);
	if (rb == 0)
		assert_int_equal(tsup_blocks_in(e, b, KVT_TIER_NVME), 3);
	assert_int_equal(rb, -ENOSPC);
	tsup_check_engine(e);
	assert_int_equal(verify_windows(e, a, 1, 4, 4), 0);
	assert_int_equal(verify_windows(e, b, 2, 3, 3), 0);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_full_nvme_drops_cached),
		cmocka_unit_test(test_full_nvme_park_fails_clearly),
		cmocka_unit_test(test_park_keeps_nvme_room),
		cmocka_unit_test(test_deadlock_124_windows),
		cmocka_unit_test(test_never_fits_etoobig),
		cmocka_unit_test(test_never_fits_hbm_only),
		cmocka_unit_test(test_random_small_shapes),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
