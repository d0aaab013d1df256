/* SPDX-License-Identifier: MIT */
/*
 * tests/test_prefetch_hints.c - what hints protect and start, and what prefetch coverage counts:
 * a hint spares the shared prompt blocks of the announced sequence (created by another, since
 * closed) and no longer protects them once that sequence is closed, even when an unrelated
 * sequence reuses the creator's index and is announced; tenant budget enforcement spares
 * announced blocks; a hint's copies are in flight as soon as kvt_engine_hint returns; a batch
 * whose layer wait stalls counts none of its prefetched accesses as ready.
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

#include "engine/engine_impl.h"
#include "support/kvt_test.h"

static inline struct kvt_stats
hints_stats(struct kvt_engine *e)
{
	struct kvt_stats st;

	memset(&st, 0, sizeof st);
	st.size = sizeof st;
	assert_int_equal(kvt_engine_stats(e, &st), 0);
	return st;
}

/* An open sequence of @tokens tokens (pattern @tag), a batch per block (write pins released). */
static kvt_seq_id
hints_seq(struct kvt_engine *e, uint32_t tag, uint32_t tokens)
{
	kvt_seq_id s;

	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	for (uint32_t pos = 0; pos < tokens; pos += TSUP_TPB) {
		struct kvt_seq_range r = { .seq = s, .first_block = pos / TSUP_TPB, .n_blocks = 1 };
		struct kvt_batch *b;

		assert_int_equal(tsup_append_write(e, s, tag, pos, TSUP_TPB), 0);
		assert_int_equal(kvt_batch_prepare_ranges(e, &r, 1, &b), 0);
		assert_int_equal(kvt_batch_release(b, NULL), 0);
	}
	return s;
}

static uint32_t
hints_in(struct kvt_engine *e, kvt_seq_id s, int tier)
{
	struct kvt_seq_info info;

	assert_int_equal(kvt_seq_info(e, s, &info), 0);
	return info.blocks_in[tier];
}

/* B attached A's prompt (2 blocks A created), A closed: a hint for B spares those blocks; once B
 * is closed, a hint for D (which reuses A's index) does not protect the cached blocks. */
static void
test_hint_spares_shared_prefix(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 4, .host_blocks = 16, .no_watermarks = true };
	struct kvt_engine *e;
	kvt_seq_id a, b, d;
	int32_t tok[2 * TSUP_TPB];
	uint32_t shared[2];
	uint64_t at = 0;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	e->opts.prefix_cache = 1; /* closed sequences leave their indexed blocks cached */
	a = hints_seq(e, 1, 2 * TSUP_TPB);
	for (int t = 0; t < 2 * TSUP_TPB; t++)
		tok[t] = t; /* the tokens tsup_append_write records */
	assert_int_equal(kvt_seq_open(e, NULL, &b), 0);
	assert_int_equal(kvt_seq_attach_prefix(e, b, tok, 2 * TSUP_TPB, &at), 0);
	assert_int_equal(at, 2 * TSUP_TPB);
	shared[0] = e->seqs[(uint32_t)b].blocks[0];
	shared[1] = e->seqs[(uint32_t)b].blocks[1];
	assert_int_equal(e->blocks[shared[0]].seq, (uint32_t)a); /* created by A */
	assert_int_equal(kvt_seq_close(e, a), 0);
	d = hints_seq(e, 3, 2 * TSUP_TPB);
	assert_int_equal((uint32_t)d, (uint32_t)a); /* D reuses A's index */
	assert_int_equal(kvt_seq_park(e, b, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_seq_park(e, d, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(hints_in(e, b, KVT_TIER_HBM), 0);
	assert_int_equal(kvt_engine_hint(e, &b, 1, 1), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(hints_in(e, b, KVT_TIER_HBM), 2);
	/* two sequences of two blocks each need all of HBM in turn: B's announced blocks stay,
	 * the unannounced X goes when Y needs room */
	(void)hints_seq(e, 4, 2 * TSUP_TPB);
	(void)hints_seq(e, 5, 2 * TSUP_TPB);
	assert_int_equal(hints_in(e, b, KVT_TIER_HBM), 2);
	assert_true(kvt_hint_spares(e, &e->blocks[shared[0]], KVT_TIER_HBM));
	/* B closes: the blocks stay cached (indexed), unannounced, whatever D is told */
	assert_int_equal(kvt_seq_close(e, b), 0);
	assert_int_equal(kvt_engine_hint(e, &d, 1, 1), 0);
	assert_true(e->blocks[shared[0]].live);
	assert_false(kvt_hint_spares(e, &e->blocks[shared[0]], KVT_TIER_HBM));
	assert_false(kvt_hint_spares(e, &e->blocks[shared[1]], KVT_TIER_HBM));
	assert_int_equal(tsup_verify(e, d, 3), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hint_spares_shared_prefix),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
