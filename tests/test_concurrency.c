/* SPDX-License-Identifier: MIT */
/*
 * tests/test_concurrency.c - the public API from several threads at once against one engine
 * with small tiers, the emulated device's delay knob on, and a poller thread; every thread
 * checks its sequences' bytes after every step. Meant to run under ThreadSanitizer.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>
#include <cmocka.h>

#include "engine/engine_impl.h"
#include "support/kvt_test.h"

#define N_THREADS 4
#define SEQS_PER_THREAD 2
#define STEPS 12

struct worker {
	struct kvt_engine *e;     /* shared engine */
	uint32_t id;              /* thread number */
	int failures;             /* data mismatches or unexpected errors */
	char first[256];          /* what failed first */
};

static void
worker_fail(struct worker *w, const char *what, int rc)
{
	if (!w->failures++)
		snprintf(w->first, sizeof w->first, "%s: %d %s", what, rc,
			 kvt_last_error_message());
}

static atomic_int stop_poller;

/* Retry while other threads hold HBM pinned (-ENOSPC is "not now", not "never"). */
static int
retry(int rc)
{
	if (rc == -ENOSPC)
		usleep(100); /* 100000 tries: ~10 s, even on a loaded machine */
	return rc == -ENOSPC;
}

static void *
worker_main(void *arg)
{
	struct worker *w = arg;
	kvt_seq_id s[SEQS_PER_THREAD];
	uint64_t len[SEQS_PER_THREAD] = { 0 };
	uint32_t i, step, tag;
	int rc, tries;

	for (i = 0; i < SEQS_PER_THREAD; i++)
		if ((rc = kvt_seq_open(w->e, NULL, &s[i])))
			worker_fail(w, "open", rc);
	for (step = 0; step < STEPS; step++) {
		for (i = 0; i < SEQS_PER_THREAD; i++) {
			size_t n = 1 + (step + i) % 3;

			tag = w->id * 10 + i + 1;
			tries = 0;
			while (retry(rc = tsup_append_write(w->e, s[i], tag, len[i], n)) &&
			       tries++ < 100000)
				;
			if (rc) {
				worker_fail(w, "append", rc);
				continue;
			}
			len[i] += n;
			tries = 0;
			while (retry(rc = tsup_verify(w->e, s[i], tag)) && tries++ < 100000)
				;
			if (rc)
				worker_fail(w, "verify", rc);
			if ((step + i) % 5 == 0 &&
			    (rc = kvt_seq_park(w->e, s[i], step % 2 ? KVT_TIER_NVME : KVT_TIER_HOST)))
				worker_fail(w, "park", rc);
			if ((step + i) % 7 == 0 && (rc = kvt_seq_resume(w->e, s[i])))
				worker_fail(w, "resume", rc);
		}
	}
	for (i = 0; i < SEQS_PER_THREAD; i++)
		if ((rc = kvt_seq_close(w->e, s[i])))
			worker_fail(w, "close", rc);
	return NULL;
}

static void *
poller_main(void *arg)
{
	struct kvt_engine *e = arg;
	struct kvt_stats st = { .size = sizeof st };

	while (!atomic_load(&stop_poller)) {
		(void)kvt_engine_poll(e, 0);
		(void)kvt_engine_stats(e, &st);
		sched_yield();
	}
	return NULL;
}

static void
test_threads_share_engine(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 24, .host_blocks = 12, .nvme_blocks = 256,
			      .delay_us = 50 };
	struct worker w[N_THREADS];
	pthread_t th[N_THREADS], poller;
	struct kvt_engine *e;
	struct kvt_stats st = { .size = sizeof st };
	char *dir;
	uint32_t i;

	(void)state;
	e = tsup_engine(&c, &dir);
	atomic_store(&stop_poller, 0);
	assert_int_equal(pthread_create(&poller, NULL, poller_main, e), 0);
	for (i = 0; i < N_THREADS; i++) {
		w[i] = (struct worker){ .e = e, .id = i };
		assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
	}
	/* every thread joined before any assertion: a failing one must not leave the others
	 * running on the engine while cmocka moves on */
	for (i = 0; i < N_THREADS; i++)
		pthread_join(th[i], NULL);
	atomic_store(&stop_poller, 1);
	pthread_join(poller, NULL);
	for (i = 0; i < N_THREADS; i++) {
		if (w[i].failures)
			print_error("thread %u: %d failures, first: %s\n", i, w[i].failures,
				    w[i].first);
		assert_int_equal(w[i].failures, 0);
	}
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_engine_check(e), 0);
	assert_int_equal(kvt_engine_stats(e, &st), 0);
	assert_int_equal(st.seqs_open, 0);
	assert_int_equal(st.checksum_failed, 0);
	assert_true(st.blocks_moved[KVT_MOVE_HOST_TO_NVME] > 0);
	assert_int_equal(st.tier[KVT_TIER_HBM].used_slots, 0);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_threads_share_engine),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
