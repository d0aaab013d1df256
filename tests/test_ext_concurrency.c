/* SPDX-License-Identifier: MIT */
/*
 * tests/test_ext_concurrency.c - the external-pool mode under concurrent use: one thread
 * stores new blocks round after round (HOST holds 8 of them, the rest go down to NVMe and the
 * oldest are dropped from there), another loads blocks stored earlier into other block ids and
 * checks every byte, a third touches and looks up; completions are delayed and reordered by
 * the emulated device. A load may miss a block evicted meanwhile (-ENOENT, reported), never
 * bring wrong bytes. Jobs are reported to whichever thread polls: a shared table hands each
 * report to the thread that issued the job. The threads make no cmocka assertion (a failure off
 * the test's thread longjmps into the main thread's frame and reports nothing): they count
 * errors and wrong bytes, each with a line on stderr, checked after the join.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kvtier.h"
#include "support/kv_fixture.h"
#include "support/kvt_test.h"

#define SEG 256u
#define NB 48u
#define ROUNDS 40u
#define PER 8u /* blocks per store round */

static uint8_t *mem[TSUP_LAYERS];
static struct kvt_engine *eng;
static uint32_t pool;
static atomic_uint stored_rounds;
static atomic_bool storer_done; /* the storer returned (the others stop waiting for rounds) */
static atomic_int bad_bytes, errors;

/* reports: job id -> (n_failed, the failed block ids) */
#define REP_CAP 4096
static pthread_mutex_t rep_mu = PTHREAD_MUTEX_INITIALIZER;
static struct rep {
	uint64_t job;
	uint32_t n_failed;
	uint32_t failed[PER];
	int32_t err[PER];
} reps[REP_CAP];
static uint32_t n_reps;

static uint8_t *
seg(uint32_t l, uint32_t kv, uint32_t blk)
{
	return mem[l] + (size_t)kv * NB * SEG + (size_t)blk * SEG;
}

static uint8_t
val(uint32_t tag, uint32_t l, uint32_t kv, uint32_t i)
{
	return (uint8_t)(tag * 131u + l * 17u + kv * 7u + i * 3u + (tag >> 3));
}

static void
fill(uint32_t blk, uint32_t tag)
{
	for (uint32_t l = 0; l < TSUP_LAYERS; l++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t i = 0; i < SEG; i++)
				seg(l, kv, blk)[i] = val(tag, l, kv, i);
}

static bool
holds(uint32_t blk, uint32_t tag)
{
	for (uint32_t l = 0; l < TSUP_LAYERS; l++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t i = 0; i < SEG; i++)
				if (seg(l, kv, blk)[i] != val(tag, l, kv, i))
					return false;
	return true;
}

static uint64_t
hash_of(uint32_t tag)
{
	return 0xabcdef0000000000ull ^ ((uint64_t)tag * 0x9e3779b97f4a7c15ull);
}

/* Count an unexpected result of @who (printed). */
static void
count_error(const char *who, const char *what, long long v)
{
	atomic_fetch_add(&errors, 1);
	fprintf(stderr, "%s: %s: %lld (%s)\n", who, what, v, kvt_last_error_message());
}

/* Poll until @job is reported (by this thread's poll or another's); its record into @out.
 * Returns 0, or -1 when a poll failed (counted, printed; @out not filled). */
static int
await(const char *who, uint64_t job, struct rep *out)
{
	for (;;) {
		struct kvt_ext_done d[16];
		struct kvt_ext_fail f[16 * PER];
		int n, i;

		pthread_mutex_lock(&rep_mu);
		for (uint32_t k = 0; k < n_reps; k++)
			if (reps[k].job == job) {
				*out = reps[k];
				reps[k] = reps[--n_reps];
				pthread_mutex_unlock(&rep_mu);
				return 0;
			}
		pthread_mutex_unlock(&rep_mu);
		(void)kvt_ext_wait(eng, pool, job, 5);
		n = kvt_ext_poll(eng, pool, d, 16, f, 16 * PER);
		if (n < 0) {
			count_error(who, "kvt_ext_poll", n);
			return -1;
		}
		pthread_mutex_lock(&rep_mu);
		if (n_reps + (uint32_t)n > REP_CAP) /* a report dropped: its issuer would spin */
			count_error(who, "report table full, reports", n);
		for (i = 0; i < n && n_reps < REP_CAP; i++) {
			struct rep *r = &reps[n_reps++];

			r->job = d[i].job;
			r->n_failed = d[i].n_failed;
			for (uint32_t k = 0; k < d[i].n_failed && k < PER; k++) {
				r->failed[k] = f[d[i].failed_first + k].block_id;
				r->err[k] = f[d[i].failed_first + k].err;
			}
		}
		pthread_mutex_unlock(&rep_mu);
	}
}

static void *
storer(void *arg)
{
	int rc;

	(void)arg;
	for (uint32_t r = 0; r < ROUNDS; r++) {
		uint32_t ids[PER];
		uint64_t h[PER], job;
		struct rep rep;

		for (uint32_t i = 0; i < PER; i++) {
			ids[i] = i;
			h[i] = hash_of(r * PER + i);
			fill(i, r * PER + i);
		}
		if ((rc = kvt_ext_store(eng, pool, 1, h, ids, PER, NULL, &job))) {
			count_error("storer", "kvt_ext_store", rc);
			continue;
		}
		if (await("storer", job, &rep))
			break; /* the blocks may still be read: stop writing them */
		if (rep.n_failed)
			count_error("storer", "store job's failed blocks", rep.n_failed);
		atomic_store(&stored_rounds, r + 1);
	}
	atomic_store(&storer_done, true);
	return NULL;
}

/* Whether two of the PER @tags are equal. */
static bool
dup(const uint32_t *tags)
{
	for (uint32_t i = 0; i < PER; i++)
		for (uint32_t k = 0; k < i; k++)
			if (tags[k] == tags[i])
				return true;
	return false;
}

static void *
loader(void *arg)
{
	uint64_t rng = (uintptr_t)arg;
	int rc;

	for (uint32_t it = 0; it < ROUNDS * 2; it++) {
		uint32_t have = atomic_load(&stored_rounds), ids[PER], tags[PER];
		uint64_t h[PER], job;
		struct rep rep;

		if (!have) {
			if (atomic_load(&storer_done))
				return NULL; /* nothing was stored (counted by the storer) */
			it--;
			continue;
		}
		for (uint32_t i = 0; i < PER; i++) {
			/* recent rounds mostly (still stored), some old ones (evicted) */
			tags[i] = (uint32_t)(kvt_test_kv_rand(&rng) % (have * PER));
			for (uint32_t k = 0; k < i; k++)
				if (tags[k] == tags[i])
					tags[i] = (tags[i] + 1) % (have * PER);
			ids[i] = PER + (uint32_t)(uintptr_t)arg % 2 * PER + i;
			h[i] = hash_of(tags[i]);
			memset(seg(0, 0, ids[i]), 0, SEG);
		}
		rc = kvt_ext_load(eng, pool, 1, h, ids, PER, it % 2 ? KVT_EXT_LAYERWISE : 0, &job);
		if (rc) {
			/* a duplicate tag made by the fix-up above collides: skip the round */
			if (rc != -EINVAL || !dup(tags))
				count_error("loader", "kvt_ext_load", rc);
			continue;
		}
		if (await("loader", job, &rep))
			return NULL;
		for (uint32_t i = 0; i < PER; i++) {
			bool failed = false;

			for (uint32_t k = 0; k < rep.n_failed && k < PER; k++)
				failed |= rep.failed[k] == ids[i];
			if (!failed && !holds(ids[i], tags[i])) {
				atomic_fetch_add(&bad_bytes, 1);
				fprintf(stderr, "loader %u: block %u loaded for tag %u: wrong bytes\n",
					(unsigned)(uintptr_t)arg, ids[i], tags[i]);
			}
		}
	}
	return NULL;
}

static void *
looker(void *arg)
{
	int rc;

	(void)arg;
	while (atomic_load(&stored_rounds) < ROUNDS && !atomic_load(&storer_done)) {
		uint64_t h[64];
		size_t hits;

		for (uint32_t i = 0; i < 64; i++)
			h[i] = hash_of(i);
		if ((rc = kvt_ext_lookup(eng, pool, 1, h, 64, &hits, NULL)))
			count_error("looker", "kvt_ext_lookup", rc);
		else if (hits > 64)
			count_error("looker", "kvt_ext_lookup hits of 64", (long long)hits);
		(void)kvt_ext_touch(eng, pool, 1, h, 8);
	}
	return NULL;
}

static void
test_concurrent_store_load(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_ext_layer lay[TSUP_LAYERS];
	struct kvt_ext_opts xo;
	pthread_t t[4];
	char *dir = tsup_mkdtemp();

	(void)state;
	tsup_opts_init(&o);
	o.hbm_bytes = tsup_block_bytes();
	o.host_bytes = 8 * tsup_block_bytes();
	o.nvme_dir = dir;
	o.nvme_bytes = 64 * 8192;
	o.emu_max_delay_us = 200;
	o.nvme_workers = 2;
	eng = tsup_create(&o, NULL);
	for (uint32_t l = 0; l < TSUP_LAYERS; l++) {
		mem[l] = calloc(2, NB * SEG);
		assert_non_null(mem[l]);
		lay[l] = (struct kvt_ext_layer){ .base = (uintptr_t)mem[l], .block_stride = SEG,
						 .v_offset = NB * SEG, .k_bytes = SEG,
						 .v_bytes = SEG, .n_layers = 1 };
	}
	kvt_ext_opts_init(&xo, sizeof xo);
	xo.n_blocks = NB;
	xo.n_entries = TSUP_LAYERS;
	xo.layers = lay;
	assert_int_equal(kvt_ext_register(eng, &xo, &pool), 0);
	atomic_store(&stored_rounds, 0);
	atomic_store(&storer_done, false);
	assert_int_equal(pthread_create(&t[0], NULL, storer, NULL), 0);
	assert_int_equal(pthread_create(&t[1], NULL, loader, (void *)(uintptr_t)2), 0);
	assert_int_equal(pthread_create(&t[2], NULL, loader, (void *)(uintptr_t)3), 0);
	assert_int_equal(pthread_create(&t[3], NULL, looker, NULL), 0);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	assert_int_equal(atomic_load(&errors), 0);
	assert_int_equal(atomic_load(&bad_bytes), 0);
	{
		struct kvt_ext_stats st = { .size = sizeof st };

		assert_int_equal(kvt_ext_stats(eng, pool, &st), 0);
		assert_int_equal(st.blocks_stored, ROUNDS * PER);
		assert_true(st.blocks_loaded > 0);
	}
	tsup_check_engine(eng);
	kvt_engine_destroy(eng);
	for (uint32_t l = 0; l < TSUP_LAYERS; l++)
		free(mem[l]);
	tsup_rmdir(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_concurrent_store_load),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
