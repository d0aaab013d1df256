/* SPDX-License-Identifier: MIT */
/*
 * tests/test_faults.c - the engine under injected failures: every allocation in a workload
 * failing in turn (SQLite's "fail the Nth call" loop), and device calls failing (a copy event
 * that cannot be recorded, a caller's stream that cannot be ordered, a sticky device error at
 * destroy). Each time: a clean negative return, no slot leaked or reused under a copy, no wrong
 * bytes, and the engine keeps working. The allocation loop runs twice: the second time with the
 * HOST header room forced on (kvt_test_host_room_min_block: one-IO zero-copy NVMe writes).
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

#define FS_SEQS 3

/* One workload: appends, parks to both tiers, batches, resumes. Every call may fail; what
 * succeeded is recorded in len[] so the data can be checked afterwards. */
static void
fault_workload(struct kvt_engine *e, kvt_seq_id *s, uint64_t *len)
{
	uint32_t round, i;

	for (round = 0; round < 3; round++) {
		for (i = 0; i < FS_SEQS; i++) {
			size_t n = 3 + round + i;

			if (tsup_append_write(e, s[i], i + 1, len[i], n) == 0)
				len[i] += n;
			if (len[i])
				(void)tsup_verify(e, s[i], i + 1);
			if ((round + i) % 2)
				(void)kvt_seq_park(e, s[i], KVT_TIER_NVME);
			else
				(void)kvt_seq_park(e, s[i], KVT_TIER_HOST);
		}
		for (i = 0; i < FS_SEQS; i++)
			(void)kvt_seq_resume(e, s[i]);
		(void)kvt_engine_poll(e, 0);
	}
}

static void
test_every_allocation_fails_in_turn(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 6, .host_blocks = 3, .nvme_blocks = 64,
			      .delay_us = 20 };
	struct kvt_seq_info info;
	uint32_t n, i, hit = 0;
	int persist;

	(void)state;
	for (persist = 0; persist < 2; persist++) {
		for (n = 1; n < 2000; n++) {
			kvt_seq_id s[FS_SEQS];
			uint64_t len[FS_SEQS] = { 0 };
			struct kvt_engine *e;
			char *dir;
			bool reached;

			e = tsup_engine(&c, &dir);
			for (i = 0; i < FS_SEQS; i++)
				assert_int_equal(kvt_seq_open(e, NULL, &s[i]), 0);
			kvt_test_alloc_failed = 0;
			kvt_test_alloc_persist = persist;
			kvt_test_alloc_countdown = (int)n;
			fault_workload(e, s, len);
			reached = kvt_test_alloc_failed > 0;
			kvt_test_alloc_countdown = 0;
			kvt_test_alloc_persist = 0;
			/* whatever failed, the engine is consistent, nothing appended is lost,
			 * and it works again */
			assert_int_equal(kvt_engine_drain(e), 0);
			tsup_check_engine(e);
			for (i = 0; i < FS_SEQS; i++) {
				assert_int_equal(kvt_seq_info(e, s[i], &info), 0);
				assert_int_equal(info.n_tokens, len[i]);
				if (len[i])
					assert_int_equal(tsup_verify(e, s[i], i + 1), 0);
				assert_int_equal(tsup_append_write(e, s[i], i + 1, len[i], 2), 0);
				assert_int_equal(tsup_verify(e, s[i], i + 1), 0);
			}
			tsup_check_engine(e);
			kvt_engine_destroy(e);
			tsup_rmdir(dir);
			if (!reached)
				break; /* the workload ran to its end without reaching the fault */
			hit++;
		}
		assert_true(n > 10); /* the workload does allocate */
	}
	print_message("failed %u allocation points\n", hit);
}

/* ---- device faults, injected by wrapping the device's vtable */

static struct kvt_device_ops fault_ops;
static const struct kvt_device_ops *real_ops;
static struct kvt_engine *fault_engine;
static int fail_record; /* 1: every event_record fails; 2: only the release's */
static volatile int sticky;

static int
fault_event_record(struct kvt_device *d, struct kvt_event *ev, struct kvt_stream *s)
{
	if (fail_record == 1 || (fail_record == 2 && ev == fault_engine->compute_ev)) {
		snprintf(d->errmsg, sizeof d->errmsg, "injected event_record failure");
		return KVT_EDEVICE;
	}
	return real_ops->event_record(d, ev, s);
}

static int
fault_event_query(struct kvt_device *d, struct kvt_event *ev)
{
	if (sticky) {
		snprintf(d->errmsg, sizeof d->errmsg, "injected sticky error");
		return KVT_EDEVICE;
	}
	return real_ops->event_query(d, ev);
}

static int
fault_event_sync(struct kvt_device *d, struct kvt_event *ev)
{
	if (sticky) {
		snprintf(d->errmsg, sizeof d->errmsg, "injected sticky error");
		return KVT_EDEVICE;
	}
	return real_ops->event_sync(d, ev);
}

static void
fault_hook(struct kvt_engine *e)
{
	fault_engine = e;
	real_ops = e->dev->ops;
	fault_ops = *real_ops;
	fault_ops.event_record = fault_event_record;
	fault_ops.event_query = fault_event_query;
	fault_ops.event_sync = fault_event_sync;
	e->dev->ops = &fault_ops;
	fail_record = 0;
	sticky = 0;
}

static void
fault_unhook(struct kvt_engine *e)
{
	e->dev->ops = real_ops;
}

/* A batched copy was queued, then its event could not be recorded: the copy is still running,
 * so its destination slot must not go to anyone else (found by review: B's block was
 * overwritten by A's late copy). */
static void
test_copy_event_failure_keeps_slot(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 2, .host_blocks = 4, .bandwidth = 10000,
			      .no_watermarks = true };
	struct kvt_engine *e;
	struct kvt_batch *b = NULL;
	kvt_seq_id a, x;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	fault_hook(e);
	assert_int_equal(kvt_seq_open(e, NULL, &a), 0);
	assert_int_equal(kvt_seq_open(e, NULL, &x), 0);
	assert_int_equal(tsup_append_write(e, a, 1, 0, TSUP_TPB), 0);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	fail_record = 1;
	assert_int_equal(kvt_batch_prepare(e, &a, 1, &b), KVT_EDEVICE);
	assert_null(b);
	assert_non_null(strstr(kvt_last_error_message(), "injected event_record failure"));
	fail_record = 0;
	tsup_check_engine(e);
	assert_int_equal(tsup_append_write(e, x, 2, 0, TSUP_TPB), 0);
	usleep(200000); /* any copy still running would land now */
	assert_int_equal(tsup_verify(e, x, 2), 0);
	assert_int_equal(tsup_verify(e, a, 1), 0); /* A itself is intact in HOST */
	tsup_check_engine(e);
	fault_unhook(e);
	kvt_engine_destroy(e);
}

/* The release could not order the copies after the caller's stream: the engine must wait for
 * that stream before demoting anything it wrote. */
static void
test_release_ordering_failure(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 1, .host_blocks = 4, .bandwidth = 64u << 20 };
	static char big_src[4 << 20], big_dst[4 << 20];
	static float kv[TSUP_TPB][TSUP_LAYERS][2][TSUP_HEADS * TSUP_DIM];
	struct kvt_geometry g;
	struct kvt_engine *e;
	struct kvt_batch *bat;
	int64_t map[TSUP_TPB];
	kvt_seq_id a;
	uint32_t t, l, i;
	void *w, *k, *v;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	fault_hook(e);
	assert_int_equal(kvt_engine_geometry(e, &g), 0);
	assert_int_equal(kvt_engine_stream_create(e, &w), 0);
	assert_int_equal(kvt_seq_open(e, NULL, &a), 0);
	assert_int_equal(kvt_seq_append(e, a, NULL, TSUP_TPB, map), 0);
	assert_int_equal(kvt_batch_prepare(e, &a, 1, &bat), 0);
	/* the K/V writes sit on the caller's stream behind ~60 ms of other work */
	assert_int_equal(kvt_engine_stream_memcpy_async(e, w, big_dst, big_src, sizeof big_src), 0);
	for (t = 0; t < TSUP_TPB; t++) {
		for (l = 0; l < TSUP_LAYERS; l++) {
			kvt_kv_addr(&g, l, map[t], &k, &v);
			for (i = 0; i < TSUP_HEADS * TSUP_DIM; i++) {
				kv[t][l][0][i] = tsup_val(9, t, l, 0, i);
				kv[t][l][1][i] = tsup_val(9, t, l, 1, i);
			}
			assert_int_equal(kvt_engine_stream_memcpy_async(e, w, k, kv[t][l][0],
									 sizeof kv[t][l][0]), 0);
			assert_int_equal(kvt_engine_stream_memcpy_async(e, w, v, kv[t][l][1],
									 sizeof kv[t][l][1]), 0);
		}
	}
	fail_record = 2;
	assert_int_equal(kvt_batch_release(bat, w), KVT_EDEVICE);
	fail_record = 0;
	/* HBM is above its watermark, so the block is demoted right away */
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_verify(e, a, 9), 0);
	tsup_check_engine(e);
	kvt_engine_stream_destroy(e, w);
	fault_unhook(e);
	kvt_engine_destroy(e);
}

static void
destroy_alarm(int sig)
{
	static const char m[] = "kvt_engine_destroy hung on a sticky device error\n";

	(void)sig;
	if (write(2, m, sizeof m - 1) < 0)
		_exit(3);
	_exit(3);
}

/* A sticky device error (every event query fails): drain reports it, destroy returns. */
static void
test_destroy_after_sticky_error(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 2, .host_blocks = 2, .bandwidth = 10000,
			      .no_watermarks = true };
	struct kvt_engine *e;
	kvt_seq_id a;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	fault_hook(e);
	assert_int_equal(kvt_seq_open(e, NULL, &a), 0);
	assert_int_equal(tsup_append_write(e, a, 1, 0, TSUP_TPB), 0);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0); /* a slow copy in flight */
	sticky = 1;
	assert_int_equal(kvt_engine_drain(e), KVT_EDEVICE);
	signal(SIGALRM, destroy_alarm);
	alarm(10);
	kvt_engine_destroy(e);
	alarm(0);
	sticky = 0;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_allocation_fails_in_turn),
		cmocka_unit_test_setup_teardown(test_every_allocation_fails_in_turn, tsup_room_on,
						tsup_room_off),
		cmocka_unit_test(test_copy_event_failure_keeps_slot),
		cmocka_unit_test(test_release_ordering_failure),
		cmocka_unit_test(test_destroy_after_sticky_error),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
