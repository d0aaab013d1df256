/* SPDX-License-Identifier: MIT */
/*
 * tests/test_prefetch_wait.c - a host-side kvt_batch_wait_layer() does not hold the engine lock
 * while it blocks: with the batch's copies held back on the emulated device, one thread waits
 * for layer 0 while another thread's engine calls (stats, an append to another sequence, a
 * hint, a poll) complete; then the copies are let go and the wait returns with the layer's
 * bytes in place. A watchdog releases the held stream after a few seconds, so that a wait
 * holding the lock makes the test fail instead of hang.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "engine/engine_impl.h"
#include "support/kvt_test.h"

#define WAIT_WATCHDOG_S 5 /* the watchdog lets the copies go after this long */

/* The waiting thread and the watchdog. */
struct waitctx {
	pthread_mutex_t lock;   /* guards the flags below */
	pthread_cond_t cond;    /* signalled when a flag changes */
	struct kvt_engine *e;   /* engine whose h2d stream is held */
	struct kvt_batch *b;    /* batch the waiter waits on */
	bool entered;           /* the waiter is about to call kvt_batch_wait_layer */
	bool waited;            /* ... and it returned */
	int rc;                 /* what it returned */
	bool others_done;       /* the other thread's calls completed */
	bool fired;             /* the watchdog had to let the copies go */
};

static void
ctx_set(struct waitctx *w, bool *flag)
{
	pthread_mutex_lock(&w->lock);
	*flag = true;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
}

static bool
ctx_get(struct waitctx *w, const bool *flag)
{
	bool v;

	pthread_mutex_lock(&w->lock);
	v = *flag;
	pthread_mutex_unlock(&w->lock);
	return v;
}

static void *
waiter_main(void *arg)
{
	struct waitctx *w = arg;
	int rc;

	ctx_set(w, &w->entered);
	rc = kvt_batch_wait_layer(w->b, 0, NULL);
	pthread_mutex_lock(&w->lock);
	w->rc = rc;
	w->waited = true;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

/* Lets the held copies go when the other thread's calls have not completed in time. */
static void *
watchdog_main(void *arg)
{
	struct waitctx *w = arg;
	struct timespec ts;
	int rc = 0;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += WAIT_WATCHDOG_S;
	pthread_mutex_lock(&w->lock);
	while (!w->others_done && rc == 0)
		rc = pthread_cond_timedwait(&w->cond, &w->lock, &ts);
	if (!w->others_done) {
		w->fired = true;
		kvt_device_emu_stream_hold(w->e->dev, w->e->h2d.s, false);
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}


static void
test_wait_layer_releases_lock(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 8, .host_blocks = 16, .no_watermarks = true };
	struct waitctx w = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };
	struct timespec nap = { .tv_sec = 0, .tv_nsec = 50 * 1000 * 1000 };
	struct kvt_engine *e;
	pthread_t waiter, dog;
	kvt_seq_id a, other;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	a = tsup_seq_written(e, 1, 12); /* 3 blocks */
	other = tsup_seq_written(e, 2, 5); /* 2 blocks, stays in HBM */
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_blocks_in(e, a, KVT_TIER_HBM), 0);
	/* a's copies up are queued but do not run */
	assert_int_equal(kvt_device_emu_stream_hold(e->dev, e->h2d.s, true), 0);
	assert_int_equal(kvt_batch_prepare(e, &a, 1, &w.b), 0);
	w.e = e;
	assert_int_equal(pthread_create(&dog, NULL, watchdog_main, &w), 0);
	assert_int_equal(pthread_create(&waiter, NULL, waiter_main, &w), 0);
	pthread_mutex_lock(&w.lock);
	while (!w.entered)
		pthread_cond_wait(&w.cond, &w.lock);
	pthread_mutex_unlock(&w.lock);
	nanosleep(&nap, NULL); /* let it block in the wait (no assertion depends on how long) */

	/* other engine calls complete while the copies are still held */
	(void)tsup_stats(e);
	assert_int_equal(tsup_append_write(e, other, 2, 5, 1), 0);
	assert_int_equal(kvt_engine_hint(e, &other, 1, 1), 0);
	assert_int_equal(kvt_engine_poll(e, 0), 0);
	assert_false(ctx_get(&w, &w.fired));  /* they did not need the copies to land */
	assert_false(ctx_get(&w, &w.waited)); /* and the wait is still waiting for them */
	ctx_set(&w, &w.others_done);
	pthread_join(dog, NULL);
	assert_false(w.fired);

	/* let the copies go; a drain retires the group (and recycles its events) while the
	 * waiter may still be waking up: it must look again, not trust what it saw */
	assert_int_equal(kvt_device_emu_stream_hold(e->dev, e->h2d.s, false), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	pthread_join(waiter, NULL);
	assert_int_equal(w.rc, 0);
	assert_true(tsup_stats(e).stalls >= 1); /* layer 0 was not there when asked for */
	assert_true(tsup_stats(e).stall_ns > 0);
	assert_int_equal(kvt_batch_release(w.b, NULL), 0);
	assert_int_equal(tsup_verify(e, a, 1), 0);
	assert_int_equal(tsup_verify(e, other, 2), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* Two threads wait on layers of their own batches at once while the copies are held; both
 * return once they are let go, each batch's layers in place. */
struct pair_arg {
	struct kvt_batch *b; /* batch to wait on, every layer */
	int rc;              /* first failure, 0 */
};

static void *
pair_main(void *arg)
{
	struct pair_arg *p = arg;

	for (uint32_t l = 0; l < TSUP_LAYERS && p->rc == 0; l++)
		p->rc = kvt_batch_wait_layer(p->b, l, NULL);
	return NULL;
}

static void
test_two_waiters(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 8, .host_blocks = 16, .no_watermarks = true };
	struct timespec nap = { .tv_sec = 0, .tv_nsec = 20 * 1000 * 1000 };
	struct pair_arg pa = { 0 }, pb = { 0 };
	struct kvt_engine *e;
	pthread_t ta, tb;
	kvt_seq_id a, b;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	a = tsup_seq_written(e, 3, 8);
	b = tsup_seq_written(e, 4, 8);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_seq_park(e, b, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_device_emu_stream_hold(e->dev, e->h2d.s, true), 0);
	assert_int_equal(kvt_batch_prepare(e, &a, 1, &pa.b), 0);
	assert_int_equal(kvt_batch_prepare(e, &b, 1, &pb.b), 0);
	assert_int_equal(pthread_create(&ta, NULL, pair_main, &pa), 0);
	assert_int_equal(pthread_create(&tb, NULL, pair_main, &pb), 0);
	nanosleep(&nap, NULL);
	assert_int_equal(kvt_device_emu_stream_hold(e->dev, e->h2d.s, false), 0);
	pthread_join(ta, NULL);
	pthread_join(tb, NULL);
	assert_int_equal(pa.rc, 0);
	assert_int_equal(pb.rc, 0);
	assert_int_equal(kvt_batch_release(pa.b, NULL), 0);
	assert_int_equal(kvt_batch_release(pb.b, NULL), 0);
	assert_int_equal(tsup_verify(e, a, 3), 0);
	assert_int_equal(tsup_verify(e, b, 4), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_wait_layer_releases_lock),
		cmocka_unit_test(test_two_waiters),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
