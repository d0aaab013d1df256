/* SPDX-License-Identifier: MIT */
/*
 * tests/test_prefetch_stress.c - prepare under random traffic with tiny tiers (HBM 3-5 blocks,
 * HOST 2-5, NVMe 96): appends, hints one and several steps ahead (some never followed by their
 * batch), shared prompt prefixes, parks to HOST and NVMe and batches checked byte for byte. It
 * catches livelocks in prepare (two blocks of one batch taking each other's HOST copies in turn
 * while HBM is full of announced blocks): prepare must end, with the batch resident or with a
 * clear -ENOSPC, never spin. A hang is turned into a failure by an alarm.
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "engine/engine_impl.h"
#include "support/kvt_test.h"

#define STRESS_SEEDS 40u  /* engines, one per seed */
#define STRESS_OPS 300    /* random operations per engine */
#define STRESS_ALARM_S 60 /* the whole test; it takes a few seconds */

static void
stress_alarm(int sig)
{
	static const char msg[] = "test_prefetch_stress: no progress for 60 s (a livelock in "
				  "prepare?)\n";

	(void)sig;
	(void)!write(2, msg, sizeof msg - 1);
	_exit(1);
}

/* Append and prepare @s's first blocks (tag 1): the prompt the others share. */
static void
stress_owner(struct kvt_engine *e, kvt_seq_id s, uint32_t tokens)
{
	for (uint32_t pos = 0; pos < tokens; pos += TSUP_TPB) {
		struct kvt_seq_range rg = { .seq = s, .first_block = pos / TSUP_TPB,
					    .n_blocks = 1 };
		struct kvt_batch *b;

		assert_int_equal(tsup_append_write(e, s, 1, pos, TSUP_TPB), 0);
		assert_int_equal(kvt_batch_prepare_ranges(e, &rg, 1, &b), 0);
		assert_int_equal(kvt_batch_release(b, NULL), 0);
	}
}

/* Prepare @s whole, hint @next meanwhile, check every byte, release. */
static int
stress_step(struct kvt_engine *e, kvt_seq_id s, uint32_t tag, kvt_seq_id next, bool hint)
{
	struct kvt_block_table bt;
	struct kvt_batch *b;
	int rc;

	rc = kvt_batch_prepare(e, &s, 1, &b);
	if (rc)
		return rc;
	if (hint)
		(void)kvt_engine_hint(e, &next, 1, 1); /* may never be followed */
	assert_int_equal(kvt_batch_block_table(b, &bt), 0);
	for (uint32_t l = 0; l < TSUP_LAYERS; l++)
		assert_int_equal(kvt_batch_wait_layer(b, l, NULL), 0);
	for (uint32_t i = 0; i < bt.indptr[1]; i++)
		assert_int_not_equal(bt.indices[i], KVT_NIL);
	assert_int_equal(tsup_check_entry(&bt, 0, tag), 0);
	return kvt_batch_release(b, NULL);
}

/* Append one token to @s and run a batch of its last block. */
static int
stress_append(struct kvt_engine *e, kvt_seq_id s, uint32_t tag, uint32_t *len)
{
	struct kvt_seq_range rg = { .seq = s, .first_block = *len / TSUP_TPB, .n_blocks = 1 };
	struct kvt_batch *b;
	int rc = tsup_append_write(e, s, tag, *len, 1);

	if (rc)
		return rc;
	(*len)++;
	rc = kvt_batch_prepare_ranges(e, &rg, 1, &b);
	return rc ? rc : kvt_batch_release(b, NULL);
}

/* @lazy: the emulated device's lazy streams (no delays then; copies at 64 MB/s, so a block's
 * copy is still on the link when the engine looks at it next) */
static void
stress_one(uint32_t seed, bool lazy)
{
	struct tsup_cfg c = { .hbm_blocks = 3 + seed % 3, .host_blocks = 2 + seed % 4,
			      .nvme_blocks = 96, .delay_us = lazy ? 0 : 50,
			      .bandwidth = lazy ? 64u << 20 : 0, .lazy = lazy };
	int32_t tok[2 * TSUP_TPB];
	struct kvt_engine *e;
	kvt_seq_id s[6];
	uint32_t tag[6], len[6];
	unsigned r = seed;
	char *dir;

	e = tsup_engine(&c, &dir);
	for (int i = 0; i < 6; i++) {
		assert_int_equal(kvt_seq_open(e, NULL, &s[i]), 0);
		tag[i] = i == 0 || i >= 4 ? 1 : 10 + i; /* 4 and 5 share 0's prompt */
		len[i] = 0;
	}
	stress_owner(e, s[0], 2 * TSUP_TPB);
	len[0] = 2 * TSUP_TPB;
	for (int t = 0; t < 2 * TSUP_TPB; t++)
		tok[t] = t;
	for (int i = 4; i < 6; i++) {
		uint64_t at = 0;

		assert_int_equal(kvt_seq_attach_prefix(e, s[i], tok, 2 * TSUP_TPB, &at), 0);
		len[i] = (uint32_t)at;
	}
	for (int it = 0; it < STRESS_OPS; it++) {
		int i = (int)(rand_r(&r) % 6), op = (int)(rand_r(&r) % 10), j, rc = 0;

		if (op < 3) {
			if (len[i] >= 6 * TSUP_TPB)
				continue;
			rc = stress_append(e, s[i], tag[i], &len[i]);
		} else if (op < 5) {
			if (len[i])
				rc = kvt_engine_hint(e, &s[i], 1, rand_r(&r) % 2 ? 1 : 3);
		} else if (op < 6) {
			rc = kvt_seq_park(e, s[i], rand_r(&r) % 2 ? KVT_TIER_HOST : KVT_TIER_NVME);
		} else if (len[i]) {
			j = (int)(rand_r(&r) % 6);
			rc = stress_step(e, s[i], tag[i], s[j], len[j] != 0);
		}
		/* tiny tiers may be too full for a batch (-ENOSPC) or a hint (ETOOBIG); any
		 * other error is a bug */
		if (rc && rc != -ENOSPC && rc != KVT_ETOOBIG && rc != -EAGAIN && rc != KVT_EBUSY)
			fail_msg("seed %u op %d (kind %d): rc %d: %s", seed, it, op, rc,
				 kvt_last_error_message());
		if (it % 50 == 0)
			tsup_check_engine(e);
	}
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

static void
test_stress_tiny_tiers(void **state)
{
	(void)state;
	signal(SIGALRM, stress_alarm);
	alarm(STRESS_ALARM_S);
	for (uint32_t seed = 1; seed <= STRESS_SEEDS; seed++) {
		stress_one(seed, false);
	}
	alarm(0);
}

/* The same traffic on lazy emulated streams (kvt_engine_opts.emu_lazy): a copy's bytes land
 * only when the engine queries or waits for it, so a block used before its copy was observed
 * done shows as wrong bytes, and a wait nobody can end (a copy no thread will run) as the
 * alarm. */
static void
test_stress_tiny_tiers_lazy(void **state)
{
	(void)state;
	signal(SIGALRM, stress_alarm);
	alarm(STRESS_ALARM_S);
	for (uint32_t seed = 1; seed <= STRESS_SEEDS / 2; seed++)
		stress_one(seed, true);
	alarm(0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stress_tiny_tiers),
		cmocka_unit_test(test_stress_tiny_tiers_lazy),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
