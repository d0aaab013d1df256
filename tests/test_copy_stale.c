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

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_append_overtakes_slow_copy),
		cmocka_unit_test(test_append_after_fast_copy),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
