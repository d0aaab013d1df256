/* SPDX-License-Identifier: MIT */
/*
 * tests/test_engine_reclaim.c - engine behaviour found by kvtier-run (tools/kvtier-run), each
 * reduced to a few public API calls.
 *
 * Reclaim must look past a victim it cannot evict. When HBM's least recently used block is
 * dirty (its only copy is in HBM) and HOST is full of the batch's own pinned blocks, that block
 * cannot be demoted; a clean block further up the LRU list (valid on NVMe) can simply be dropped,
 * so the batch fits. kvtier-run hit this with 3 sessions, 6 HBM and 4 HOST slots: prepare
 * answered -ENOSPC ("no room to bring the batch into HBM") although HBM held clean copies.
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

/* HBM 2 slots, HOST 1, NVMe 8; no background demotion, so only the test moves blocks. */
static struct kvt_engine *
reclaim_engine(char **dir)
{
	struct tsup_cfg c = { .hbm_blocks = 2, .host_blocks = 1, .nvme_blocks = 8,
			      .no_watermarks = true };

	return tsup_engine(&c, dir);
}

static void
test_reclaim_skips_undemotable_victim(void **state)
{
	struct kvt_seq_info info;
	struct kvt_engine *e;
	kvt_seq_id x, y, z;
	char *dir;
	int rc;

	(void)state;
	e = reclaim_engine(&dir);
	assert_int_equal(kvt_seq_open(e, NULL, &x), 0);
	assert_int_equal(kvt_seq_open(e, NULL, &y), 0);
	assert_int_equal(kvt_seq_open(e, NULL, &z), 0);
	/* Y: one full block, parked to NVMe, then brought back: valid in HBM and on NVMe */
	assert_int_equal(tsup_append_write(e, y, 2, 0, TSUP_TPB), 0);
	assert_int_equal(tsup_verify(e, y, 2), 0);
	assert_int_equal(kvt_seq_park(e, y, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_verify(e, y, 2), 0);
	/* Z: one block parked to HOST (its only copy; takes the single HOST slot) */
	assert_int_equal(tsup_append_write(e, z, 3, 0, TSUP_TPB), 0);
	assert_int_equal(tsup_verify(e, z, 3), 0);
	assert_int_equal(kvt_seq_park(e, z, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	/* X: a partial block, only in HBM (dirty); then Y is used again so X is the LRU tail */
	assert_int_equal(tsup_append_write(e, x, 1, 0, 2), 0);
	assert_int_equal(tsup_verify(e, x, 1), 0);
	assert_int_equal(tsup_verify(e, y, 2), 0);
	assert_int_equal(kvt_seq_info(e, y, &info), 0);
	assert_int_equal(info.blocks_in[KVT_TIER_HBM], 1);
	assert_int_equal(info.blocks_in[KVT_TIER_NVME], 1); /* Y's HBM copy is clean */
	assert_int_equal(kvt_seq_info(e, z, &info), 0);
	assert_int_equal(info.blocks_in[KVT_TIER_HOST], 1);
	assert_int_equal(info.blocks_in[KVT_TIER_HBM], 0);
	/* Z fits: dropping Y's clean HBM copy makes room. Expected 0; the engine says -ENOSPC
	 * (it tries only the LRU tail, X, whose demotion finds HOST full of Z's pinned block). */
	rc = tsup_verify(e, z, 3);
	if (rc)
		print_error("prepare(Z): %d %s\n", rc, kvt_last_error_message());
	if (rc == 0) {
		rc = tsup_verify(e, x, 1); /* and X's dirty block was not lost on the way */
		if (rc)
			print_error("prepare(X): %d %s\n", rc, kvt_last_error_message());
	}
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
	assert_int_equal(rc, 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reclaim_skips_undemotable_victim),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
