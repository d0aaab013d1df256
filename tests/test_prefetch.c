/* SPDX-License-Identifier: MIT */
/*
 * tests/test_prefetch.c - schedule hints, layer-wise promotion and streaming (issue 3): bad
 * input to hints, hints under delayed and reordered completions, a sequence closed or parked
 * while its prefetch is in flight, hinted blocks spared by eviction (and taken as a last resort),
 * a layer wait that waits for its layer only (stopped between two layers on the emulated
 * device), HBM too small for a window, the prefetch counters and histograms, and the real model
 * decoding 400 tokens through an HBM of two blocks with prefetch: the text of the unlimited run.
 * The real-model group exits 77 (skipped) when ../shared/data is absent.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "engine/engine_impl.h"
#include "support/kvt_test.h"
#include "support/run_util.h"
#include "tools/kvtier-run/model.h"
#include "tools/kvtier-run/tokenizer.h"
#include "tools/kvtier-run/util.h"


/* 0 when layer @l of every token of entry 0 holds the pattern @tag, else 1. */
static int
layer_ok(const struct kvt_block_table *bt, uint32_t l, uint32_t tag)
{
	uint64_t pos0 = (uint64_t)bt->first_block[0] * TSUP_TPB;

	for (uint64_t t = 0; t < bt->seq_len[0]; t++) {
		uint32_t slot = bt->indices[bt->indptr[0] + t / TSUP_TPB];
		float *k, *v;

		kvt_kv_addr(&bt->geo, l, (int64_t)slot * TSUP_TPB + (int64_t)(t % TSUP_TPB),
			    (void **)&k, (void **)&v);
		for (uint32_t j = 0; j < TSUP_HEADS * TSUP_DIM; j++)
			if (k[j] != tsup_val(tag, pos0 + t, l, 0, j) ||
			    v[j] != tsup_val(tag, pos0 + t, l, 1, j))
				return 1;
	}
	return 0;
}

/* Prepare @s, then per layer: wait for it and check it (nothing else), release. */
static void
verify_layerwise(struct kvt_engine *e, kvt_seq_id s, uint32_t tag)
{
	struct kvt_block_table bt;
	struct kvt_batch *b;

	assert_int_equal(kvt_batch_prepare(e, &s, 1, &b), 0);
	assert_int_equal(kvt_batch_block_table(b, &bt), 0);
	for (uint32_t l = 0; l < TSUP_LAYERS; l++) {
		assert_int_equal(kvt_batch_wait_layer(b, l, NULL), 0);
		assert_int_equal(layer_ok(&bt, l, tag), 0);
	}
	assert_int_equal(kvt_batch_release(b, NULL), 0);
}

/* Every bad input: a clear error, nothing hinted, the engine still usable. */
static void
test_hint_bad_input(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 2, .host_blocks = 8 };
	struct kvt_seq_range r;
	struct kvt_engine *e;
	kvt_seq_id a, gone, two[2];
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	a = tsup_seq_written(e, 1, 8); /* 2 blocks */
	assert_int_equal(kvt_seq_open(e, NULL, &gone), 0);
	assert_int_equal(kvt_seq_close(e, gone), 0);
	assert_int_equal(kvt_engine_hint(NULL, &a, 1, 1), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "NULL"));
	assert_int_equal(kvt_engine_hint(e, NULL, 1, 1), -EINVAL);
	assert_int_equal(kvt_engine_hint(e, &a, 0, 1), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "1..65536"));
	assert_int_equal(kvt_engine_hint(e, &a, 65537, 1), -EINVAL);
	assert_int_equal(kvt_engine_hint_ranges(e, NULL, 1, 0), -EINVAL);
	two[0] = a;
	two[1] = gone;
	assert_int_equal(kvt_engine_hint(e, two, 2, 1), KVT_ECLOSED);
	assert_non_null(strstr(kvt_last_error_message(), "not open"));
	r.seq = a;
	r.first_block = 2;
	r.n_blocks = 1;
	assert_int_equal(kvt_engine_hint_ranges(e, &r, 1, 1), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "past the end"));
	/* two sequences of 2 blocks can never be one batch in 2 HBM slots */
	two[1] = tsup_seq_written(e, 2, 8);
	assert_int_equal(kvt_engine_hint(e, two, 2, 0), KVT_ETOOBIG);
	assert_non_null(strstr(kvt_last_error_message(), "HBM has 2 slots"));
	assert_int_equal(tsup_stats(e).hints, 0);
	/* ... but staging them in HOST (steps ahead >= 2) is fine */
	assert_int_equal(kvt_engine_hint(e, two, 2, 2), 0);
	assert_int_equal(tsup_stats(e).hints, 1);
	assert_int_equal(tsup_verify(e, a, 1), 0);
	assert_int_equal(tsup_verify(e, two[1], 2), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* A hint brings parked blocks up at once, in one copy group; the prepare that follows finds
 * them ready and promotes nothing twice; the counters say so. */
static void
test_hint_prefetches(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 4, .host_blocks = 8, .no_watermarks = true };
	struct kvt_engine *e;
	struct kvt_stats st, s0;
	uint64_t bb = tsup_block_bytes(), lat = 0, g0;
	kvt_seq_id a;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	a = tsup_seq_written(e, 1, 12); /* 3 blocks */
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	s0 = tsup_stats(e); /* the appends' batches counted accesses too */
	g0 = e->h2d.submitted;
	assert_int_equal(tsup_blocks_in(e, a, KVT_TIER_HBM), 0);
	assert_int_equal(kvt_engine_hint(e, &a, 1, 1), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_blocks_in(e, a, KVT_TIER_HBM), 3);
	st = tsup_stats(e);
	assert_int_equal(st.hints, 1);
	assert_int_equal(st.tier[KVT_TIER_HBM].bytes_prefetched, 3 * bb);
	assert_int_equal(st.tier[KVT_TIER_HBM].bytes_on_demand, 0);
	assert_int_equal(e->h2d.submitted, g0 + 1); /* one group for the three blocks */
	verify_layerwise(e, a, 1);
	st = tsup_stats(e);
	assert_int_equal(st.blocks_moved[KVT_MOVE_HOST_TO_HBM], 3); /* none promoted twice */
	assert_int_equal(st.accesses - s0.accesses, 3);
	assert_int_equal(st.accesses_ready - s0.accesses_ready, 3);
	assert_int_equal(st.tier[KVT_TIER_HBM].hits - s0.tier[KVT_TIER_HBM].hits, 3);
	assert_int_equal(st.tier[KVT_TIER_HBM].misses - s0.tier[KVT_TIER_HBM].misses, 0);
	assert_int_equal(st.tier[KVT_TIER_HBM].promote_count, 3);
	for (int i = 0; i < KVT_LAT_BUCKETS; i++)
		lat += st.tier[KVT_TIER_HBM].promote_lat[i];
	assert_int_equal(lat, 3);
	assert_true(st.tier[KVT_TIER_HBM].promote_ns_sum > 0);
	/* without a hint: the same accesses are misses, the bytes on demand */
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	verify_layerwise(e, a, 1);
	st = tsup_stats(e);
	assert_int_equal(st.accesses - s0.accesses, 6);
	assert_int_equal(st.accesses_ready - s0.accesses_ready, 3);
	assert_int_equal(st.tier[KVT_TIER_HBM].misses - s0.tier[KVT_TIER_HBM].misses, 3);
	assert_int_equal(st.tier[KVT_TIER_HBM].bytes_on_demand, 3 * bb);
	assert_int_equal(st.tier[KVT_TIER_HOST].hits - s0.tier[KVT_TIER_HOST].hits, 3);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* steps_ahead >= 2 reads NVMe-only blocks into HOST and leaves HBM alone; the latency of those
 * promotions into HOST is recorded. */
static void
test_hint_stages_nvme(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 4, .host_blocks = 4, .nvme_blocks = 8,
			      .no_watermarks = true };
	struct kvt_engine *e;
	struct kvt_stats st;
	kvt_seq_id a;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	a = tsup_seq_written(e, 3, 8);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_blocks_in(e, a, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_hint(e, &a, 1, 3), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_blocks_in(e, a, KVT_TIER_HOST), 2);
	assert_int_equal(tsup_blocks_in(e, a, KVT_TIER_HBM), 0);
	st = tsup_stats(e);
	assert_int_equal(st.tier[KVT_TIER_HOST].promote_count, 2);
	assert_int_equal(st.tier[KVT_TIER_HOST].bytes_prefetched, 2 * tsup_block_bytes());
	assert_int_equal(st.tier[KVT_TIER_HBM].promote_count, 0);
	verify_layerwise(e, a, 3);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* Hints and batches of several sequences interleaved, completions delayed and reordered
 * across streams: every layer read after its wait holds the right bytes. */
static void
test_prefetch_delayed_reordered(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 4, .host_blocks = 16, .delay_us = 800 };
	kvt_seq_id s[4];
	struct kvt_engine *e;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	for (uint32_t i = 0; i < 4; i++) {
		s[i] = tsup_seq_written(e, 10 + i, 8);
		assert_int_equal(kvt_seq_park(e, s[i], KVT_TIER_HOST), 0);
	}
	for (uint32_t round = 0; round < 6; round++) {
		for (uint32_t i = 0; i < 4; i++) {
			struct kvt_block_table bt;
			struct kvt_batch *b;
			kvt_seq_id next = s[(i + 1) % 4];

			assert_int_equal(kvt_batch_prepare(e, &s[i], 1, &b), 0);
			/* the next sequence's copies run while this one is "computed" */
			assert_int_equal(kvt_engine_hint(e, &next, 1, 1), 0);
			assert_int_equal(kvt_batch_block_table(b, &bt), 0);
			for (uint32_t l = 0; l < TSUP_LAYERS; l++) {
				assert_int_equal(kvt_batch_wait_layer(b, l, NULL), 0);
				assert_int_equal(layer_ok(&bt, l, 10 + i), 0);
			}
			assert_int_equal(kvt_batch_release(b, NULL), 0);
		}
	}
	assert_true(tsup_stats(e).tier[KVT_TIER_HBM].bytes_prefetched > 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* A sequence closed while its prefetch is in flight: its HBM slots stay taken until the copies
 * have finished, then are freed; nothing hangs. */
static void
test_close_while_prefetching(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 4, .host_blocks = 8, .no_watermarks = true };
	struct kvt_engine *e;
	kvt_seq_id a, b;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	a = tsup_seq_written(e, 1, 12);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_device_emu_stream_hold(e->dev, e->h2d.s, true), 0);
	assert_int_equal(kvt_engine_hint(e, &a, 1, 1), 0);
	assert_int_equal(tsup_stats(e).tier[KVT_TIER_HBM].used_slots, 3);
	assert_int_equal(kvt_seq_close(e, a), 0);
	assert_int_equal(kvt_engine_poll(e, 0), 0);
	assert_int_equal(tsup_stats(e).tier[KVT_TIER_HBM].used_slots, 3); /* copies still writing */
	assert_true(tsup_stats(e).transfers_in_flight > 0);
	tsup_check_engine(e);
	assert_int_equal(kvt_device_emu_stream_hold(e->dev, e->h2d.s, false), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_stats(e).tier[KVT_TIER_HBM].used_slots, 0);
	assert_int_equal(tsup_stats(e).tier[KVT_TIER_HOST].used_slots, 0);
	b = tsup_seq_written(e, 2, 16); /* all four slots are usable again */
	assert_int_equal(tsup_verify(e, b, 2), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* A hint for a sequence that is then parked (and its copies still in flight): the park wins,
 * the bytes are intact, and the hint no longer spares its blocks. */
static void
test_hint_then_park(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 4, .host_blocks = 8, .delay_us = 300,
			      .no_watermarks = true };
	struct kvt_engine *e;
	kvt_seq_id a, b;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	a = tsup_seq_written(e, 1, 8);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_engine_hint(e, &a, 1, 1), 0);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_blocks_in(e, a, KVT_TIER_HBM), 0);
	assert_int_equal(e->seqs[(uint32_t)a].hint_no, 0);
	/* a sequence needing all of HBM gets it */
	b = tsup_seq_written(e, 2, 16);
	assert_int_equal(tsup_verify(e, b, 2), 0);
	assert_int_equal(tsup_verify(e, a, 1), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* Hinted blocks are spared when room is made for another hint, but a batch that can get room
 * no other way takes them. */
static void
test_hint_spares_announced(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 4, .host_blocks = 16, .no_watermarks = true };
	struct kvt_batch *bb;
	struct kvt_engine *e;
	kvt_seq_id a, b, d;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	a = tsup_seq_written(e, 1, 8);
	b = tsup_seq_written(e, 2, 8);
	d = tsup_seq_written(e, 3, 8);
	for (int i = 0; i < 3; i++)
		assert_int_equal(kvt_seq_park(e, i == 0 ? a : i == 1 ? b : d, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_batch_prepare(e, &b, 1, &bb), 0); /* B pinned: 2 slots */
	assert_int_equal(kvt_engine_hint(e, &a, 1, 1), 0);     /* A announced: 2 slots */
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_engine_hint(e, &d, 1, 1), 0);     /* no room without taking A */
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_blocks_in(e, a, KVT_TIER_HBM), 2);
	assert_int_equal(tsup_blocks_in(e, d, KVT_TIER_HBM), 0);
	assert_int_equal(kvt_batch_release(bb, NULL), 0);
	/* B released: D's next hint takes B's slots, A stays */
	assert_int_equal(kvt_engine_hint(e, &d, 1, 1), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_blocks_in(e, a, KVT_TIER_HBM), 2);
	assert_int_equal(tsup_blocks_in(e, d, KVT_TIER_HBM), 2);
	assert_int_equal(tsup_blocks_in(e, b, KVT_TIER_HBM), 0);
	/* B's batch now needs A's or D's slots, both announced: it takes them */
	assert_int_equal(tsup_verify(e, b, 2), 0);
	assert_int_equal(tsup_verify(e, a, 1), 0);
	assert_int_equal(tsup_verify(e, d, 3), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* Releases a held stream after a few seconds unless told not to: a wait that waits for more
 * than its layer then returns (late) and the test fails, instead of hanging. */
struct watchdog {
	pthread_mutex_t lock;   /* guards done */
	pthread_cond_t cond;    /* signalled when done is set */
	bool done;              /* the test got past the wait */
	struct kvt_engine *e;   /* engine whose h2d stream is held */
	bool fired;             /* the watchdog had to release the stream */
};

static void *
watchdog_main(void *arg)
{
	struct watchdog *w = arg;
	struct timespec ts;
	int rc = 0;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 5;
	pthread_mutex_lock(&w->lock);
	while (!w->done && rc == 0)
		rc = pthread_cond_timedwait(&w->cond, &w->lock, &ts);
	if (!w->done) {
		w->fired = true;
		kvt_device_emu_stream_hold(w->e->dev, w->e->h2d.s, false);
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

/* kvt_batch_wait_layer(0) returns once layer 0's copies landed while layer 1's are still held
 * back on the copy stream; layer 1 then waits for its own. */
static void
test_wait_layer_waits_only_its_layer(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 4, .host_blocks = 8, .no_watermarks = true };
	struct watchdog w = { .lock = PTHREAD_MUTEX_INITIALIZER,
			      .cond = PTHREAD_COND_INITIALIZER };
	struct kvt_block_table bt;
	struct kvt_engine *e;
	struct kvt_batch *b;
	void *stream;
	pthread_t th;
	kvt_seq_id a;
	char *dir;

	(void)state;
	assert_true(TSUP_LAYERS >= 2);
	e = tsup_engine(&c, &dir);
	a = tsup_seq_written(e, 7, 12);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	/* junk where the copies land, so that a layer not yet copied cannot look right */
	memset(e->hbm_base, 0xab, e->slots[KVT_TIER_HBM].n_slots * e->block_bytes);
	assert_int_equal(e->n_lgroups, TSUP_LAYERS);
	assert_int_equal(kvt_device_emu_stream_hold(e->dev, e->h2d.s, true), 0);
	assert_int_equal(kvt_batch_prepare(e, &a, 1, &b), 0);
	assert_int_equal(kvt_batch_block_table(b, &bt), 0);
	/* the stream holds: copy layer 0, event 0 | copy layer 1, event 1; run the first two */
	assert_int_equal(kvt_device_emu_stream_step(e->dev, e->h2d.s, 2), 0);
	w.e = e;
	assert_int_equal(pthread_create(&th, NULL, watchdog_main, &w), 0);
	assert_int_equal(kvt_batch_wait_layer(b, 0, NULL), 0);
	pthread_mutex_lock(&w.lock);
	w.done = true;
	pthread_cond_signal(&w.cond);
	pthread_mutex_unlock(&w.lock);
	pthread_join(th, NULL);
	assert_false(w.fired); /* the wait did not need layer 1 */
	assert_int_equal(layer_ok(&bt, 0, 7), 0);
	assert_int_equal(layer_ok(&bt, 1, 7), 1); /* still on its way */
	assert_true(tsup_stats(e).stalls == 0); /* layer 0 had landed: no stall */
	/* a device-side wait on layer 1 does not block the host */
	assert_int_equal(kvt_engine_stream_create(e, &stream), 0);
	assert_int_equal(kvt_batch_wait_layer(b, 1, stream), 0);
	assert_int_equal(layer_ok(&bt, 1, 7), 1);
	assert_int_equal(kvt_device_emu_stream_hold(e->dev, e->h2d.s, false), 0);
	assert_int_equal(kvt_engine_stream_sync(e, stream), 0); /* ran after layer 1's event */
	assert_int_equal(kvt_batch_wait_layer(b, 1, NULL), 0);
	assert_int_equal(layer_ok(&bt, 1, 7), 0);
	assert_int_equal(kvt_batch_release(b, stream), 0);
	kvt_engine_stream_destroy(e, stream);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* HBM smaller than a window: prepare and hint say so (KVT_ETOOBIG), nothing waits forever,
 * and windows of one block still stream the sequence through. */
static void
test_window_larger_than_hbm(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 2, .host_blocks = 8, .delay_us = 100 };
	struct kvt_seq_range r;
	struct kvt_engine *e;
	struct kvt_batch *b;
	kvt_seq_id a;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	a = tsup_seq_written(e, 5, 16); /* 4 blocks through 2 slots */
	r.seq = a;
	r.first_block = 0;
	r.n_blocks = 3;
	assert_int_equal(kvt_batch_prepare_ranges(e, &r, 1, &b), KVT_ETOOBIG);
	assert_null(b);
	assert_non_null(strstr(kvt_last_error_message(), "HBM has 2 slots"));
	assert_int_equal(kvt_engine_hint_ranges(e, &r, 1, 1), KVT_ETOOBIG);
	assert_int_equal(kvt_engine_hint(e, &a, 1, 0), KVT_ETOOBIG);
	/* window w computed while w + 1 arrives */
	for (uint32_t w = 0; w < 4; w++) {
		struct kvt_block_table bt;
		struct kvt_seq_range nx = { .seq = a, .first_block = w + 1, .n_blocks = 1 };

		r.first_block = w;
		r.n_blocks = 1;
		assert_int_equal(kvt_batch_prepare_ranges(e, &r, 1, &b), 0);
		if (w + 1 < 4)
			assert_int_equal(kvt_engine_hint_ranges(e, &nx, 1, 1), 0);
		assert_int_equal(kvt_batch_block_table(b, &bt), 0);
		for (uint32_t l = 0; l < TSUP_LAYERS; l++) {
			assert_int_equal(kvt_batch_wait_layer(b, l, NULL), 0);
			assert_int_equal(layer_ok(&bt, l, 5), 0);
		}
		assert_int_equal(kvt_batch_release(b, NULL), 0);
	}
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* The cycle of small tiers: HBM holds a dirty block (its only copy), HOST holds the batch's
 * own block (staged from NVMe by a hint): making room in HBM needs room in HOST, which the
 * batch's block takes. Prepare trades the staged copy (NVMe still has it) for the demotion. */
static void
test_prepare_breaks_tier_cycle(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 1, .host_blocks = 1, .nvme_blocks = 8,
			      .no_watermarks = true };
	struct kvt_engine *e;
	kvt_seq_id a, b;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	a = tsup_seq_written(e, 1, 4);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	b = tsup_seq_written(e, 2, 4); /* dirty, in the only HBM slot */
	assert_int_equal(kvt_engine_hint(e, &a, 1, 2), 0); /* A staged in the only HOST slot */
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_blocks_in(e, a, KVT_TIER_HOST), 1);
	assert_int_equal(tsup_verify(e, a, 1), 0);
	assert_int_equal(tsup_verify(e, b, 2), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* ------------------------------------------------------------------------------------------ */
/* the real model                                                                               */

static struct kvtr_model pf_model;
static struct kvtr_tokenizer pf_tok;

static int
pf_run(struct kvtr_run_result *r, uint32_t hbm_blocks, int prefetch, uint32_t delay_us)
{
	struct kvtr_run_opts o;
	uint64_t block = 16ull * (uint64_t)pf_model.cfg.n_layers * 2 * pf_model.kv_dim * 4;

	kvtr_run_opts_init(&o);
	o.model = &pf_model;
	o.tok = &pf_tok;
	o.steps = 400;
	o.temperature = 0.0f;
	o.tokens_per_block = 16;
	o.hbm_bytes = hbm_blocks * block;
	o.prefetch = prefetch;
	o.emu_delay_us = delay_us;
	return kvtr_run(&o, r);
}

/* One session generates 400 tokens with HBM holding two blocks (every layer of each), the
 * sequence streamed through by windows with the next window prefetched: the text is the
 * unlimited run's, token for token. */
static void
test_model_two_blocks_400_tokens(void **state)
{
	struct kvtr_run_result all, two;

	(void)state;
	assert_int_equal(pf_run(&all, 0, 0, 0), 0);
	if (pf_run(&two, 2, 1, 20) != 0)
		fail_msg("kvtr_run: %s", kvtr_last_error());
	assert_true(all.out[0].n_tokens > 300);
	assert_false(rutil_tokens_differ(&all, &two));
	assert_string_equal(all.out[0].text, two.out[0].text);
	assert_int_equal(two.geo.hbm_slots, 2);
	assert_true(two.windowed_positions > 300);
	assert_true(two.stats.hints > 0);
	assert_true(two.stats.tier[KVT_TIER_HBM].bytes_prefetched > 0);
	kvtr_run_result_free(&all);
	kvtr_run_result_free(&two);
}

/* An HBM of one block cannot hold a window and the new token's block: a clear error up front. */
static void
test_model_hbm_one_block(void **state)
{
	struct kvtr_run_result r;

	(void)state;
	assert_int_equal(pf_run(&r, 1, 1, 0), KVT_ETOOBIG);
	assert_non_null(strstr(kvtr_last_error(), "windows need at least 2 slots"));
	kvtr_run_result_free(&r);
}

int
main(void)
{
	const struct CMUnitTest engine_tests[] = {
		cmocka_unit_test(test_hint_bad_input),
		cmocka_unit_test(test_hint_prefetches),
		cmocka_unit_test(test_hint_stages_nvme),
		cmocka_unit_test(test_prefetch_delayed_reordered),
		cmocka_unit_test(test_close_while_prefetching),
		cmocka_unit_test(test_hint_then_park),
		cmocka_unit_test(test_hint_spares_announced),
		cmocka_unit_test(test_wait_layer_waits_only_its_layer),
		cmocka_unit_test(test_window_larger_than_hbm),
		cmocka_unit_test(test_prepare_breaks_tier_cycle),
	};
	const struct CMUnitTest model_tests[] = {
		cmocka_unit_test(test_model_two_blocks_400_tokens),
		cmocka_unit_test(test_model_hbm_one_block),
	};
	const char *model = rutil_model_file("stories260K.bin");
	const char *tok = rutil_model_file("tok512.bin");
	int rc;

	rc = cmocka_run_group_tests_name("prefetch_engine", engine_tests, NULL, NULL);
	if (rc)
		return rc;
	if (!model || !tok) {
		printf("SKIPPED: the real-model tests: ../shared/data not found (looked in %s)\n",
		       rutil_data_dir());
		return 77;
	}
	if (kvtr_model_load(model, &pf_model) != 0 ||
	    kvtr_tokenizer_load(tok, pf_model.cfg.vocab_size, &pf_tok) != 0) {
		printf("cannot load the real model: %s\n", kvtr_last_error());
		return 1;
	}
	rc = cmocka_run_group_tests_name("prefetch_model", model_tests, NULL, NULL);
	kvtr_tokenizer_free(&pf_tok);
	kvtr_model_free(&pf_model);
	return rc;
}
