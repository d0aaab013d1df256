/* SPDX-License-Identifier: MIT */
/*
 * tests/test_prefetch_hints.c - what hints protect and start, and what prefetch coverage counts:
 * a hint spares the shared prompt blocks of the announced sequence (created by another, since
 * closed) and no longer protects them once that sequence is closed, even when an unrelated
 * sequence reuses the creator's index and is announced; tenant budget enforcement spares
 * announced blocks; a hint's copies are in flight as soon as kvt_engine_hint returns; a batch
 * whose layer wait stalls counts none of its prefetched accesses as ready; a block promoted
 * twice for one use is counted (stats.repromotions); the rotation's victim order keeps shared
 * prompt blocks.
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
	a = tsup_seq_written(e, 1, 2 * TSUP_TPB);
	for (int t = 0; t < 2 * TSUP_TPB; t++)
		tok[t] = t; /* the tokens tsup_append_write records */
	assert_int_equal(kvt_seq_open(e, NULL, &b), 0);
	assert_int_equal(kvt_seq_attach_prefix(e, b, tok, 2 * TSUP_TPB, &at), 0);
	assert_int_equal(at, 2 * TSUP_TPB);
	shared[0] = e->seqs[(uint32_t)b].blocks[0];
	shared[1] = e->seqs[(uint32_t)b].blocks[1];
	assert_int_equal(kvt_blk(e, shared[0])->seq, (uint32_t)a); /* created by A */
	assert_int_equal(kvt_seq_close(e, a), 0);
	d = tsup_seq_written(e, 3, 2 * TSUP_TPB);
	assert_int_equal((uint32_t)d, (uint32_t)a); /* D reuses A's index */
	assert_int_equal(kvt_seq_park(e, b, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_seq_park(e, d, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_blocks_in(e, b, KVT_TIER_HBM), 0);
	assert_int_equal(kvt_engine_hint(e, &b, 1, 1), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_blocks_in(e, b, KVT_TIER_HBM), 2);
	/* two sequences of two blocks each need all of HBM in turn: B's announced blocks stay,
	 * the unannounced X goes when Y needs room */
	(void)tsup_seq_written(e, 4, 2 * TSUP_TPB);
	(void)tsup_seq_written(e, 5, 2 * TSUP_TPB);
	assert_int_equal(tsup_blocks_in(e, b, KVT_TIER_HBM), 2);
	assert_true(kvt_hint_spares(e, kvt_blk(e, shared[0]), KVT_TIER_HBM));
	/* B closes: the blocks stay cached (indexed), unannounced, whatever D is told */
	assert_int_equal(kvt_seq_close(e, b), 0);
	assert_int_equal(kvt_engine_hint(e, &d, 1, 1), 0);
	assert_true(kvt_blk(e, shared[0])->live);
	assert_false(kvt_hint_spares(e, kvt_blk(e, shared[0]), KVT_TIER_HBM));
	assert_false(kvt_hint_spares(e, kvt_blk(e, shared[1]), KVT_TIER_HBM));
	assert_int_equal(tsup_verify(e, d, 3), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* The rotation's victim order (hints in use) keeps shared prompt blocks: they count as in the
 * rotation while shared, and while another sequence holds them after their creator closed, and
 * are never the released creator's "furthest next use" victims; cached-only ones are not. */
static void
test_rotation_keeps_shared(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 8, .host_blocks = 16, .no_watermarks = true };
	struct kvt_engine *e;
	struct kvt_batch *bt;
	kvt_seq_id a, b;
	int32_t tok[2 * TSUP_TPB];
	uint32_t shared, own, out[16], n, i;
	uint64_t at = 0;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	e->opts.prefix_cache = 1;
	a = tsup_seq_written(e, 1, 3 * TSUP_TPB); /* 2 prompt blocks + 1 of its own */
	for (int t = 0; t < 2 * TSUP_TPB; t++)
		tok[t] = t;
	assert_int_equal(kvt_seq_open(e, NULL, &b), 0);
	assert_int_equal(kvt_seq_attach_prefix(e, b, tok, 2 * TSUP_TPB, &at), 0);
	assert_int_equal(at, 2 * TSUP_TPB);
	shared = e->seqs[(uint32_t)b].blocks[0];
	own = e->seqs[(uint32_t)a].blocks[2];
	assert_int_equal(kvt_blk(e, shared)->refs, 2);
	assert_int_equal(kvt_engine_hint(e, &b, 1, 1), 0); /* hints in use: the rotation is on */
	assert_non_null(e->rel_ring);
	assert_true(kvt_rot_member(e, kvt_blk(e, shared)));
	/* A runs and is released: its own block is a rotation victim, the shared ones are not */
	assert_int_equal(kvt_batch_prepare(e, &a, 1, &bt), 0);
	assert_int_equal(kvt_batch_release(bt, NULL), 0);
	n = kvt_rot_victims(e, out, 16);
	for (i = 0; i < n; i++)
		assert_int_not_equal(out[i], shared);
	assert_true(n >= 1 && out[0] == own); /* its last block first */
	/* A closes: B still holds the prompt */
	assert_int_equal(kvt_seq_close(e, a), 0);
	assert_int_equal(kvt_blk(e, shared)->refs, 1);
	assert_true(kvt_rot_member(e, kvt_blk(e, shared)));
	/* B closes: cached only, out of the rotation */
	assert_int_equal(kvt_seq_close(e, b), 0);
	assert_true(kvt_blk(e, shared)->live);
	assert_false(kvt_rot_member(e, kvt_blk(e, shared)));
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* A caller that prepares a sequence once per layer and once more for its appended block (tools/
 * kvtier-hf) gives the rotation one turn per sequence, not a new step per prepare: the repeated
 * prepares begin no step and take no new place in the release order, and the partial prepare of
 * the last block leaves the sequence in the rotation. The victim is then the last block of the
 * sequence whose turn came last (before this fix: the per-layer prepares restarted the step at
 * every layer and the partial one took each sequence out of the rotation, so HBM fell back to
 * LRU, the worst order for a cycle). */
static void
test_rotation_turn_per_layer(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 8, .host_blocks = 16, .no_watermarks = true };
	struct kvt_engine *e;
	struct kvt_batch *bt;
	kvt_seq_id s[3];
	uint32_t out[16], n, i, j, rel, start;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	for (i = 0; i < 3; i++)
		s[i] = tsup_seq_written(e, 1 + i, 2 * TSUP_TPB);
	assert_int_equal(kvt_engine_hint(e, &s[0], 1, 1), 0); /* hints in use: the rotation */
	for (int step = 0; step < 2; step++) {
		for (i = 0; i < 3; i++) {
			struct kvt_seqrec *r = &e->seqs[(uint32_t)s[i]];
			struct kvt_seq_range last = { .seq = s[i], .first_block = 1, .n_blocks = 1 };

			assert_int_equal(kvt_batch_prepare(e, &s[i], 1, &bt), 0); /* layer 0 */
			assert_int_equal(kvt_batch_release(bt, NULL), 0);
			rel = r->rel_no;
			start = e->step_start;
			for (j = 0; j < 2; j++) { /* layers 1 and 2: the same turn */
				assert_int_equal(kvt_batch_prepare(e, &s[i], 1, &bt), 0);
				assert_int_equal(kvt_batch_release(bt, NULL), 0);
			}
			assert_int_equal(kvt_batch_prepare_ranges(e, &last, 1, &bt), 0);
			assert_int_equal(kvt_batch_release(bt, NULL), 0);
			assert_int_equal(e->step_start, start);
			assert_int_equal(r->rel_no, rel);
			assert_int_equal(r->rot_part, 0);
			assert_true(kvt_rot_member(e, kvt_blk(e, r->blocks[0])));
		}
	}
	/* one release per turn: the second step began at the first sequence's second turn */
	assert_int_equal(e->rel_next, 6);
	assert_int_equal(e->step_start, 3);
	n = kvt_rot_victims(e, out, 16);
	assert_int_equal(n, 6);
	assert_int_equal(out[0], e->seqs[(uint32_t)s[2]].blocks[1]); /* last turn, last block */
	assert_int_equal(out[1], e->seqs[(uint32_t)s[2]].blocks[0]);
	assert_int_equal(out[2], e->seqs[(uint32_t)s[1]].blocks[1]);
	for (i = 0; i < 3; i++)
		assert_int_equal(tsup_verify(e, s[i], 1 + i), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* Two ranges of one sequence in one hint: both are announced (the second does not replace the
 * first), and a later hint of the sequence replaces both. */
static void
test_hint_two_ranges_one_seq(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 8, .host_blocks = 16, .no_watermarks = true };
	struct kvt_engine *e;
	struct kvt_seq_range r[2];
	kvt_seq_id a;
	uint32_t *blk;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	a = tsup_seq_written(e, 1, 4 * TSUP_TPB);
	blk = e->seqs[(uint32_t)a].blocks;
	r[0] = (struct kvt_seq_range){ .seq = a, .first_block = 0, .n_blocks = 1 };
	r[1] = (struct kvt_seq_range){ .seq = a, .first_block = 2, .n_blocks = 1 };
	assert_int_equal(kvt_engine_hint_ranges(e, r, 2, 1), 0);
	assert_true(kvt_hint_spares(e, kvt_blk(e, blk[0]), KVT_TIER_HBM));
	assert_true(kvt_hint_spares(e, kvt_blk(e, blk[2]), KVT_TIER_HBM));
	assert_false(kvt_hint_spares(e, kvt_blk(e, blk[1]), KVT_TIER_HBM));
	assert_false(kvt_hint_spares(e, kvt_blk(e, blk[3]), KVT_TIER_HBM));
	/* a new hint of block 3 alone replaces the two ranges */
	r[0] = (struct kvt_seq_range){ .seq = a, .first_block = 3, .n_blocks = 1 };
	assert_int_equal(kvt_engine_hint_ranges(e, r, 1, 1), 0);
	assert_false(kvt_hint_spares(e, kvt_blk(e, blk[0]), KVT_TIER_HBM));
	assert_false(kvt_hint_spares(e, kvt_blk(e, blk[2]), KVT_TIER_HBM));
	assert_true(kvt_hint_spares(e, kvt_blk(e, blk[3]), KVT_TIER_HBM));
	assert_int_equal(kvt_engine_drain(e), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* A hint's copies are submitted before kvt_engine_hint returns (the copy stream is held, so
 * they are still in flight); the batch that follows finds them on their way, and a stream wait
 * on a layer whose copies have not landed is a stall: none of the batch's accesses count as
 * ready (coverage), although all of its blocks were prefetched. */
static void
test_stream_wait_stall_not_ready(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 4, .host_blocks = 8, .no_watermarks = true };
	struct kvt_block_table bt;
	struct kvt_stats s0, st;
	struct kvt_engine *e;
	struct kvt_batch *b;
	uint64_t g0;
	void *stream;
	kvt_seq_id a;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	a = tsup_seq_written(e, 5, 3 * TSUP_TPB);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_device_emu_stream_hold(e->dev, e->h2d.s, true), 0);
	g0 = e->h2d.submitted;
	s0 = tsup_stats(e);
	assert_int_equal(kvt_engine_hint(e, &a, 1, 1), 0);
	assert_int_equal(e->h2d.submitted, g0 + 1); /* one group, queued on the copy stream */
	assert_true(kvt_xfer_inflight(e));
	for (uint32_t i = 0; i < 3; i++)
		assert_int_equal(kvt_copy_state(kvt_blk(e, e->seqs[(uint32_t)a].blocks[i]),
						KVT_TIER_HBM),
				 KVT_COPY_INFLIGHT);
	assert_int_equal(kvt_batch_prepare(e, &a, 1, &b), 0);
	assert_int_equal(e->h2d.submitted, g0 + 1); /* nothing promoted twice */
	assert_int_equal(kvt_batch_block_table(b, &bt), 0);
	assert_int_equal(kvt_engine_stream_create(e, &stream), 0);
	for (uint32_t l = 0; l < TSUP_LAYERS; l++)
		assert_int_equal(kvt_batch_wait_layer(b, l, stream), 0); /* copies held: stall */
	assert_int_equal(kvt_device_emu_stream_hold(e->dev, e->h2d.s, false), 0);
	assert_int_equal(kvt_engine_stream_sync(e, stream), 0);
	assert_int_equal(tsup_check_entry(&bt, 0, 5), 0);
	assert_int_equal(kvt_batch_release(b, stream), 0);
	kvt_engine_stream_destroy(e, stream);
	st = tsup_stats(e);
	assert_int_equal(st.accesses - s0.accesses, 3);
	assert_int_equal(st.accesses_ready - s0.accesses_ready, 0);
	assert_true(st.stalls > s0.stalls);
	/* the same with the copies landed before the waits: all three ready */
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_engine_hint(e, &a, 1, 1), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	s0 = tsup_stats(e);
	assert_int_equal(tsup_verify(e, a, 5), 0);
	st = tsup_stats(e);
	assert_int_equal(st.accesses_ready - s0.accesses_ready, 3);
	assert_int_equal(st.stalls, s0.stalls);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* A tenant over its HBM budget after a release demotes its unannounced blocks, not the ones a
 * hint just brought up for the next step. */
static void
test_budget_spares_announced(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 8, .host_blocks = 16, .no_watermarks = true };
	struct kvt_seq_opts so;
	struct kvt_engine *e;
	kvt_seq_id a, b;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	kvt_seq_opts_init(&so, sizeof so);
	so.tenant = 1;
	for (int i = 0; i < 2; i++) {
		kvt_seq_id *s = i ? &b : &a;

		assert_int_equal(kvt_seq_open(e, &so, s), 0);
		assert_int_equal(tsup_append_write(e, *s, 1 + (uint32_t)i, 0, 2 * TSUP_TPB), 0);
		assert_int_equal(tsup_verify(e, *s, 1 + (uint32_t)i), 0);
	}
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_tenant_set_budget(e, 1, KVT_TIER_HBM, 2), 0);
	assert_int_equal(kvt_engine_hint(e, &a, 1, 1), 0); /* A for the next step: 4 in HBM */
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_blocks_in(e, a, KVT_TIER_HBM), 2);
	assert_int_equal(tsup_verify(e, b, 2), 0); /* B's step: its release enforces the budget */
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_blocks_in(e, a, KVT_TIER_HBM), 2);
	assert_int_equal(tsup_blocks_in(e, b, KVT_TIER_HBM), 0);
	assert_int_equal(tsup_verify(e, a, 1), 0); /* A's step: served, the budget holds again */
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_true(tsup_blocks_in(e, a, KVT_TIER_HBM) + tsup_blocks_in(e, b, KVT_TIER_HBM) <= 2);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* stats.repromotions counts a block promoted again before a batch used its first promotion;
 * a hint followed by its batch promotes each block once, in one copy group. */
static void
test_repromotions_counted(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 4, .host_blocks = 8, .no_watermarks = true };
	struct kvt_stats s0, st;
	struct kvt_engine *e;
	kvt_seq_id a;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	a = tsup_seq_written(e, 6, 3 * TSUP_TPB);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	s0 = tsup_stats(e);
	assert_int_equal(kvt_engine_hint(e, &a, 1, 1), 0);
	assert_int_equal(tsup_verify(e, a, 6), 0);
	st = tsup_stats(e);
	assert_int_equal(st.repromotions, s0.repromotions);
	assert_int_equal(st.h2d_groups - s0.h2d_groups, 1);
	assert_int_equal(st.batches - s0.batches, 1);
	assert_int_equal(st.blocks_moved[KVT_MOVE_HOST_TO_HBM] -
			 s0.blocks_moved[KVT_MOVE_HOST_TO_HBM], 3);
	/* announced, promoted, taken back down before its batch: the batch promotes it again */
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	s0 = tsup_stats(e);
	assert_int_equal(kvt_engine_hint(e, &a, 1, 1), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_verify(e, a, 6), 0);
	st = tsup_stats(e);
	assert_int_equal(st.repromotions - s0.repromotions, 3);
	assert_int_equal(st.h2d_groups - s0.h2d_groups, 2);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* Counts the HBM victim walk's steps (the engine's LRU underneath). */
static const struct kvt_evict_ops *walk_base;
static uint64_t walk_steps;

enum { WALK_SEQS = 48, WALK_BLOCKS = 64, WALK_HBM = WALK_SEQS * WALK_BLOCKS };

static uint32_t
walk_next(struct kvt_evict *ev, uint32_t id)
{
	walk_steps++;
	return walk_base->victim_next(ev, id);
}

/* An engine with HBM for WALK_SEQS sequences of WALK_BLOCKS blocks, and those sequences written
 * (pattern i + 1); with @run_now each also runs once now (before any hint: outside the
 * rotation). */
static struct kvt_engine *
walk_engine(kvt_seq_id *s, bool run_now, char **dir)
{
	struct tsup_cfg c = { .hbm_blocks = WALK_HBM, .host_blocks = 2 * WALK_HBM,
			      .no_watermarks = true };
	struct kvt_engine *e = tsup_engine(&c, dir);
	struct kvt_batch *bt;

	for (uint32_t i = 0; i < WALK_SEQS; i++) {
		assert_int_equal(kvt_seq_open(e, NULL, &s[i]), 0);
		for (uint32_t pos = 0; pos < WALK_BLOCKS * TSUP_TPB; pos += 16 * TSUP_TPB)
			assert_int_equal(tsup_append_write(e, s[i], i + 1, pos, 16 * TSUP_TPB), 0);
		if (run_now) {
			assert_int_equal(kvt_batch_prepare(e, &s[i], 1, &bt), 0);
			assert_int_equal(kvt_batch_release(bt, NULL), 0);
		}
	}
	return e;
}

/* HBM full: a new sequence's first block (pattern 99) needs one HBM slot; the victim walk of
 * that reclaim looks at a window (about 1024 + the deficit), not at all WALK_HBM blocks. */
static kvt_seq_id
walk_one_block(struct kvt_engine *e)
{
	struct kvt_evict_ops counting = *e->evict[KVT_TIER_HBM].ops;
	kvt_seq_id x;

	assert_int_equal(e->slots[KVT_TIER_HBM].n_free, 0);
	walk_base = e->evict[KVT_TIER_HBM].ops;
	counting.victim_next = walk_next;
	e->evict[KVT_TIER_HBM].ops = &counting;
	walk_steps = 0;
	assert_int_equal(kvt_seq_open(e, NULL, &x), 0);
	assert_int_equal(tsup_append_write(e, x, 99, 0, TSUP_TPB), 0);
	e->evict[KVT_TIER_HBM].ops = walk_base;
	print_message("walk steps: %llu\n", (unsigned long long)walk_steps);
	assert_true(walk_steps > 0);
	assert_true(walk_steps < WALK_HBM / 2);
	assert_int_equal(kvt_engine_drain(e), 0);
	return x;
}

/* Under the rotation, making room for one block looks at a bounded part of the HBM list, not
 * all of it, when every HBM block belongs to the rotation (the decode steady state: the search
 * for blocks outside the rotation used to walk the whole list on every reclaim). The victim is
 * the rotation's furthest next use: the last block of the sequence released last. */
static void
test_rotation_walk_bounded(void **state)
{
	struct kvt_engine *e;
	struct kvt_batch *bt;
	kvt_seq_id s[WALK_SEQS], x;
	struct kvt_seq_info info;
	uint32_t last, i;
	char *dir;

	(void)state;
	e = walk_engine(s, false, &dir);
	assert_int_equal(kvt_engine_hint(e, &s[0], 1, 1), 0); /* hints in use: the rotation */
	for (i = 0; i < WALK_SEQS; i++) { /* one step: each runs whole and is released */
		assert_int_equal(kvt_batch_prepare(e, &s[i], 1, &bt), 0);
		assert_int_equal(kvt_batch_release(bt, NULL), 0);
	}
	last = e->seqs[(uint32_t)s[WALK_SEQS - 1]].blocks[WALK_BLOCKS - 1];
	assert_true(kvt_rot_member(e, kvt_blk(e, last)));
	x = walk_one_block(e);
	assert_int_equal(kvt_copy_state(kvt_blk(e, last), KVT_TIER_HBM), KVT_COPY_ABSENT);
	assert_int_equal(kvt_seq_info(e, s[WALK_SEQS - 1], &info), 0);
	assert_int_equal(info.blocks_in[KVT_TIER_HBM], WALK_BLOCKS - 1);
	assert_int_equal(tsup_verify(e, s[WALK_SEQS - 1], WALK_SEQS), 0); /* demoted, not lost */
	assert_int_equal(tsup_verify(e, x, 99), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* The other case: HBM mostly idle blocks outside the rotation (sequences run before any hint),
 * the rotation one sequence that ran last (the hot end of the list). Making room for one block
 * still looks at a window: blocks outside the rotation are found at the cold end, and the walk
 * does not go on to the rotation's blocks behind all of them. */
static void
test_rotation_walk_bounded_idle(void **state)
{
	struct kvt_engine *e;
	struct kvt_batch *bt;
	kvt_seq_id s[WALK_SEQS], x;
	uint32_t first;
	char *dir;

	(void)state;
	e = walk_engine(s, true, &dir);
	assert_int_equal(kvt_engine_hint(e, &s[WALK_SEQS - 1], 1, 1), 0);
	assert_int_equal(kvt_batch_prepare(e, &s[WALK_SEQS - 1], 1, &bt), 0);
	assert_int_equal(kvt_batch_release(bt, NULL), 0);
	first = e->seqs[(uint32_t)s[0]].blocks[0];
	assert_false(kvt_rot_member(e, kvt_blk(e, first)));
	assert_true(kvt_rot_member(e, kvt_blk(e, e->seqs[(uint32_t)s[WALK_SEQS - 1]].blocks[0])));
	x = walk_one_block(e);
	/* the coldest block outside the rotation went (demoted: its only copy), not the rotation's */
	assert_int_equal(kvt_copy_state(kvt_blk(e, first), KVT_TIER_HBM), KVT_COPY_ABSENT);
	assert_int_equal(tsup_verify(e, s[0], 1), 0);
	assert_int_equal(tsup_verify(e, x, 99), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hint_spares_shared_prefix),
		cmocka_unit_test(test_rotation_keeps_shared),
		cmocka_unit_test(test_rotation_turn_per_layer),
		cmocka_unit_test(test_hint_two_ranges_one_seq),
		cmocka_unit_test(test_stream_wait_stall_not_ready),
		cmocka_unit_test(test_budget_spares_announced),
		cmocka_unit_test(test_repromotions_counted),
		cmocka_unit_test(test_rotation_walk_bounded),
		cmocka_unit_test(test_rotation_walk_bounded_idle),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
