/* SPDX-License-Identifier: MIT */
/*
 * tests/test_copy_stale.c - copies that an append overtakes (engine/block.c, engine/xfer.c):
 * blocks keep no version numbers, only a stale bit per tier for an in-flight copy appended to
 * since it started. A copy of a partial block on its way down when more tokens are appended
 * must never become a valid copy: after the append the block has no valid HOST copy, the stale
 * transfer's completion drops what it wrote, and parking and reading the block back returns
 * every token, the appended ones included.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "engine/engine_impl.h"
#include "support/kvt_test.h"

static void
append_overtakes_copy(uint32_t delay_us)
{
	struct tsup_cfg c = { .hbm_blocks = 8, .host_blocks = 16, .delay_us = delay_us,
			      .no_watermarks = true };
	struct kvt_engine *e;
	struct kvt_block *b;
	char *dir;
	kvt_seq_id s;
	uint32_t idx;
	bool inflight;

	e = tsup_engine(&c, &dir);
	assert_non_null(e);
	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	assert_int_equal(tsup_append_write(e, s, 7, 0, TSUP_TPB / 2), 0); /* a partial block */
	assert_int_equal(tsup_verify(e, s, 7), 0);
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_HOST), 0); /* its copy down starts */
	assert_non_null(kvt_seq_lookup(e, s, &idx));
	b = kvt_blk(e, e->seqs[idx].blocks[0]);
	inflight = kvt_copy_state(b, KVT_TIER_HOST) == KVT_COPY_INFLIGHT;
	print_message("delay %u us: the copy down %s when the append came\n", delay_us,
		      inflight ? "was on its way" : "had landed");
	assert_int_equal(tsup_append_write(e, s, 7, TSUP_TPB / 2, 1), 0);
	/* whether the copy had landed (dropped by the append) or is still on its way (now
	 * stale), the block has no valid HOST copy */
	assert_false(kvt_copy_valid(b, KVT_TIER_HOST));
	if (kvt_copy_state(b, KVT_TIER_HOST) == KVT_COPY_INFLIGHT)
		assert_true(inflight && kvt_copy_stale(b, KVT_TIER_HOST));
	assert_int_equal(kvt_engine_drain(e), 0);
	/* its completion dropped it */
	assert_int_equal(kvt_copy_state(b, KVT_TIER_HOST), KVT_COPY_ABSENT);
	assert_true(kvt_copy_valid(b, KVT_TIER_HBM));
	tsup_check_engine(e);
	/* down and back up: every token, the appended one included */
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_copy_state(b, KVT_TIER_HBM), KVT_COPY_ABSENT);
	assert_int_equal(tsup_verify(e, s, 7), 0);
	tsup_check_engine(e);
	assert_int_equal(kvt_seq_close(e, s), 0);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

static void
test_append_overtakes_slow_copy(void **state)
{
	(void)state;
	append_overtakes_copy(20000); /* the copy is very likely still on its way */
}

static void
test_append_after_fast_copy(void **state)
{
	(void)state;
	append_overtakes_copy(0);
}

/* Rows of token @pos in HOST slot @slot (K, then V, every layer) equal pattern @tag? */
static bool
host_rows_are(struct kvt_engine *e, uint32_t slot, uint32_t pos, uint32_t tag)
{
	const char *blk = kvt_slot_addr(e, KVT_TIER_HOST, slot);

	for (uint32_t l = 0; l < e->layout.n_layers; l++) {
		const float *k = (const float *)(blk + l * e->layer_block_bytes + pos * e->token_bytes);
		const float *v = (const float *)(blk + l * e->layer_block_bytes +
						 TSUP_TPB * e->token_bytes + pos * e->v_token_bytes);

		for (uint32_t i = 0; i < e->token_bytes / sizeof(float); i++)
			if (k[i] != tsup_val(tag, pos, l, 0, i) || v[i] != tsup_val(tag, pos, l, 1, i))
				return false;
	}
	return true;
}

/* Write pattern @tag into token @pos's rows of block @id's HBM copy (what a kernel does). */
static void
hbm_rows_write(struct kvt_engine *e, uint32_t id, uint32_t pos, uint32_t tag)
{
	char *blk = kvt_slot_addr(e, KVT_TIER_HBM, kvt_blk(e, id)->slot[KVT_TIER_HBM]);

	for (uint32_t l = 0; l < e->layout.n_layers; l++) {
		float *k = (float *)(blk + l * e->layer_block_bytes + pos * e->token_bytes);
		float *v = (float *)(blk + l * e->layer_block_bytes + TSUP_TPB * e->token_bytes +
				     pos * e->v_token_bytes);

		for (uint32_t i = 0; i < e->token_bytes / sizeof(float); i++) {
			k[i] = tsup_val(tag, pos, l, 0, i);
			v[i] = tsup_val(tag, pos, l, 1, i);
		}
	}
}

/*
 * An append to a block with a clean HOST copy keeps that copy as a shadow (tiers/slots.h): the
 * next demotion copies only the tokens written since, into the same slot, and the block reads
 * back whole. A later append from an earlier token (the count went back) lowers what the
 * shadow keeps: without that, the rewritten token would come back old.
 */
static void
test_shadow_demotes_only_new_tokens(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 8, .host_blocks = 16, .no_watermarks = true };
	uint64_t row = 0, before;
	struct kvt_stats st = { .size = sizeof st };
	struct kvt_engine *e;
	struct kvt_block *b;
	uint32_t idx, id, slot;
	char *dir;
	kvt_seq_id s;

	(void)state;
	e = tsup_engine(&c, &dir);
	assert_non_null(e);
	assert_true(kvt_shadow_on(e));
	for (uint32_t l = 0; l < e->layout.n_layers; l++)
		row += e->token_bytes + e->v_token_bytes; /* one token, every layer */
	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	assert_int_equal(tsup_append_write(e, s, 7, 0, 2), 0);
	assert_int_equal(tsup_verify(e, s, 7), 0);
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_resume(e, s), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_non_null(kvt_seq_lookup(e, s, &idx));
	id = e->seqs[idx].blocks[0];
	b = kvt_blk(e, id);
	assert_true(kvt_copy_valid(b, KVT_TIER_HBM) && kvt_copy_valid(b, KVT_TIER_HOST));
	slot = b->slot[KVT_TIER_HOST];
	/* the append: the HOST copy leaves the tier, its slot kept as the block's shadow */
	assert_int_equal(tsup_append_write(e, s, 7, 2, 1), 0);
	assert_int_equal(kvt_copy_state(b, KVT_TIER_HOST), KVT_COPY_ABSENT);
	assert_int_equal(e->slots[KVT_TIER_HOST].n_shadow, 1);
	tsup_check_engine(e);
	assert_int_equal(tsup_verify(e, s, 7), 0);
	assert_int_equal(kvt_engine_stats(e, &st), 0);
	before = st.bytes_moved[KVT_MOVE_HBM_TO_HOST];
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_engine_stats(e, &st), 0);
	/* one token's rows moved, into the shadow's slot */
	assert_int_equal(st.bytes_moved[KVT_MOVE_HBM_TO_HOST] - before, row);
	assert_true(row < e->block_bytes);
	assert_int_equal(b->slot[KVT_TIER_HOST], slot);
	assert_int_equal(e->slots[KVT_TIER_HOST].n_shadow, 0);
	for (uint32_t p = 0; p < 3; p++)
		assert_true(host_rows_are(e, slot, p, 7));
	assert_int_equal(tsup_verify(e, s, 7), 0);
	tsup_check_engine(e);

	/* the count goes back: token 1 on is written again (pattern 9), after a shadow was
	 * made by the append of token 3 (keeping tokens 0..2) */
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_true(kvt_copy_valid(b, KVT_TIER_HOST));
	assert_int_equal(tsup_append_write(e, s, 7, 3, 1), 0);
	assert_int_equal(e->slots[KVT_TIER_HOST].n_shadow, 1);
	assert_int_equal(tsup_verify(e, s, 7), 0);
	kvt_lock(e);
	e->seqs[idx].n_tokens = 1; /* what an undone grouped append does (engine/group.c) */
	kvt_block_bump_ver(e, id, 1);
	kvt_unlock(e);
	for (uint32_t p = 1; p < 4; p++)
		hbm_rows_write(e, id, p, 9);
	e->seqs[idx].n_tokens = 4;
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_true(host_rows_are(e, b->slot[KVT_TIER_HOST], 0, 7));
	for (uint32_t p = 1; p < 4; p++)
		assert_true(host_rows_are(e, b->slot[KVT_TIER_HOST], p, 9));
	tsup_check_engine(e);
	assert_int_equal(kvt_seq_close(e, s), 0);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/*
 * A shadow that keeps under a quarter of the block's written tokens is not worth 2 copies a
 * layer: the demotion moves the whole block (into the claimed slot); one that keeps a quarter
 * or more moves only the new rows. 16 tokens a block: 1 kept of 16 moves the block, 4 of 16
 * moves 12 tokens' rows.
 */
static void
test_shadow_quarter_rule(void **state)
{
	static const int32_t toks[16] = { 0 };
	int64_t map[16];
	struct kvt_stats st = { .size = sizeof st };
	struct kvt_engine_opts o;
	struct kvt_engine *e;
	uint64_t row, bb, before;
	kvt_seq_id s;

	(void)state;
	for (uint32_t kept = 1; kept <= 4; kept += 3) {
		tsup_opts_init(&o);
		o.layout.tokens_per_block = 16;
		row = (uint64_t)TSUP_LAYERS * 2 * TSUP_HEADS * TSUP_DIM * sizeof(float);
		bb = 16 * row;
		o.hbm_bytes = 4 * bb;
		o.host_bytes = 4 * bb;
		o.high_watermark = o.low_watermark = 1.0f;
		e = NULL;
		assert_int_equal(kvt_engine_create(&o, &e), 0);
		assert_true(kvt_shadow_on(e));
		assert_int_equal(e->block_bytes, bb);
		assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
		assert_int_equal(kvt_seq_append(e, s, toks, kept, map), 0);
		assert_int_equal(kvt_seq_park(e, s, KVT_TIER_HOST), 0);
		assert_int_equal(kvt_engine_drain(e), 0);
		assert_int_equal(kvt_seq_resume(e, s), 0);
		assert_int_equal(kvt_engine_drain(e), 0);
		assert_int_equal(kvt_seq_append(e, s, toks, 16 - kept, map), 0);
		assert_int_equal(e->slots[KVT_TIER_HOST].n_shadow, 1);
		assert_int_equal(kvt_engine_stats(e, &st), 0);
		before = st.bytes_moved[KVT_MOVE_HBM_TO_HOST];
		assert_int_equal(kvt_seq_park(e, s, KVT_TIER_HOST), 0);
		assert_int_equal(kvt_engine_drain(e), 0);
		assert_int_equal(kvt_engine_stats(e, &st), 0);
		assert_int_equal(st.bytes_moved[KVT_MOVE_HBM_TO_HOST] - before,
				 kept == 1 ? bb : (16 - kept) * row);
		tsup_check_engine(e);
		assert_int_equal(kvt_seq_close(e, s), 0);
		kvt_engine_destroy(e);
	}
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_append_overtakes_slow_copy),
		cmocka_unit_test(test_append_after_fast_copy),
		cmocka_unit_test(test_shadow_demotes_only_new_tokens),
		cmocka_unit_test(test_shadow_quarter_rule),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
