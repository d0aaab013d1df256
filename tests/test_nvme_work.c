/* SPDX-License-Identifier: MIT */
/*
 * tests/test_nvme_work.c - the NVME tier's worker pool (tiers/nvme_work.c): reads are verified
 * (and decoded) on worker threads, and a read whose IO is complete is neither handed out by
 * kvt_nvme_reap() nor made valid by the engine before its verification finished (a test hook
 * holds verification back); bit flips are still detected with workers, zero-copy and staged,
 * raw and encoded, many blocks at once.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine_impl.h"
#include "support/kvt_test.h"
#include "tiers/format.h"
#include "tiers/tier_nvme.h"

#define BLOCK 16384u /* raw blocks: 4 KiB multiple */
#define NSLOTS 16u
#define QD 8u
#define HOLD_MS 5000 /* the gate lets a held verification go after this (never a hang) */

/* The gate: before_verify blocks while hold is set; entered counts verifications begun. */
static struct {
	pthread_mutex_t mu;  /* guards the rest */
	pthread_cond_t cv;   /* broadcast on every change */
	bool hold;           /* hold verifications back */
	unsigned entered;    /* verifications begun */
	unsigned timeouts;   /* held ones that went on after HOLD_MS (a test bug or a hang) */
	int flip;            /* on_complete flips a byte in every read piece */
} gate = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, 0, 0, 0 };

static void
gate_before_verify(void *arg, uint32_t slot)
{
	struct timespec ts;
	int r = 0;

	(void)arg, (void)slot;
	tsup_deadline_ms(&ts, HOLD_MS);
	pthread_mutex_lock(&gate.mu);
	gate.entered++;
	pthread_cond_broadcast(&gate.cv);
	while (gate.hold && r != ETIMEDOUT)
		r = pthread_cond_timedwait(&gate.cv, &gate.mu, &ts);
	gate.timeouts += r == ETIMEDOUT;
	pthread_mutex_unlock(&gate.mu);
}

static void
gate_on_complete(void *arg, bool is_write, uint32_t slot, void *buf, size_t len, uint64_t off,
		 int *res)
{
	/* a staged read's piece starts with the header page, a zero-copy one is the payload */
	size_t at = (off - KVT_FMT_DATA_OFF) % (BLOCK + 4096) == 0 ? 4096 + 8 : 8;

	(void)arg, (void)slot;
	pthread_mutex_lock(&gate.mu);
	if (gate.flip && !is_write && *res > 0 && at < len)
		((uint8_t *)buf)[at] ^= 0x10;
	pthread_mutex_unlock(&gate.mu);
}

static const struct kvt_nvme_fault_hooks gate_hooks = {
	.before_verify = gate_before_verify,
	.on_complete = gate_on_complete,
};

static void
gate_set(bool hold, int flip)
{
	pthread_mutex_lock(&gate.mu);
	gate.hold = hold;
	gate.flip = flip;
	if (hold)
		gate.entered = 0;
	pthread_cond_broadcast(&gate.cv);
	pthread_mutex_unlock(&gate.mu);
}

/* Reap without waiting until @k verifications have begun (or ~5 s): the reap that sees a read's
 * CQE hands it to a worker. Nothing may come out meanwhile. Returns how many have begun. */
static unsigned
gate_reap_until(struct kvt_nvme *n, unsigned k)
{
	struct kvt_nvme_cqe c[QD];
	unsigned got = 0;

	for (int i = 0; i < 5000; i++) {
		assert_int_equal(kvt_nvme_reap(n, c, QD, false), 0);
		pthread_mutex_lock(&gate.mu);
		got = gate.entered;
		pthread_mutex_unlock(&gate.mu);
		if (got >= k)
			break;
		usleep(1000);
	}
	return got;
}

/* Wait until @k verifications have begun (or 5 s); returns how many have. */
static unsigned
gate_wait_entered(unsigned k)
{
	struct timespec ts;
	unsigned got;
	int r = 0;

	tsup_deadline_ms(&ts, 5000);
	pthread_mutex_lock(&gate.mu);
	while (gate.entered < k && r != ETIMEDOUT)
		r = pthread_cond_timedwait(&gate.cv, &gate.mu, &ts);
	got = gate.entered;
	pthread_mutex_unlock(&gate.mu);
	return got;
}

static unsigned
gate_timeouts(void)
{
	unsigned t;

	pthread_mutex_lock(&gate.mu);
	t = gate.timeouts;
	pthread_mutex_unlock(&gate.mu);
	return t;
}

static void
fill(uint8_t *p, size_t len, uint32_t seed)
{
	/* bf16-like halves (compressible for the codec), varied by seed */
	for (size_t i = 0; i < len; i++)
		p[i] = (i & 1) ? (uint8_t)(0x3c + (i >> 12) % 3) : (uint8_t)(i * 131u + seed * 7u);
}

/* The fixture's HOST memory (f->host) is NSLOTS * BLOCK bytes: a registered "HOST tier". */
static int
wfx_setup(void **state)
{
	return tsup_nvme_fx_setup(state, (size_t)NSLOTS * BLOCK, "nvmework");
}

static int
wfx_teardown(void **state)
{
	gate_set(false, 0);
	return tsup_nvme_fx_teardown(state);
}

static struct kvt_nvme *
wopen(struct tsup_nvme_fx *f, int codec, uint32_t workers, bool zero_copy)
{
	struct kvt_nvme_opts o = {
		.dir = f->dir,
		.capacity_bytes = (uint64_t)NSLOTS * (BLOCK + 4096),
		.block_bytes = BLOCK,
		.queue_depth = QD,
		.codec = codec,
		.hooks = &gate_hooks,
		.host_base = zero_copy ? f->host : NULL,
		.host_len = zero_copy ? (size_t)NSLOTS * BLOCK : 0,
		.host_stride = BLOCK,
		.workers = workers,
	};
	struct kvt_nvme *n = NULL;

	assert_int_equal(kvt_nvme_open(&o, &n, NULL, 0), 0);
	return n;
}

/* Reap (waiting) until @k completions are in @c; returns how many failed. */
static unsigned
wreap(struct kvt_nvme *n, struct kvt_nvme_cqe *c, unsigned k)
{
	unsigned got = 0, bad = 0;

	while (got < k) {
		int r = kvt_nvme_reap(n, c + got, k - got, true);

		assert_true(r > 0);
		got += (unsigned)r;
	}
	for (unsigned i = 0; i < k; i++)
		bad += c[i].res != 0;
	return bad;
}

/* Put blocks 0..k-1 from HOST slots 0..k-1 into NVMe slots 0..k-1, all in flight at once. */
static void
wput_all(struct kvt_nvme *n, struct tsup_nvme_fx *f, unsigned k)
{
	struct kvt_nvme_cqe c[QD];

	for (unsigned i = 0; i < k; i++) {
		struct kvt_nvme_wmeta m = { .session = 1, .index = i };

		fill(f->host + (size_t)i * BLOCK, BLOCK, i + 1);
		assert_int_equal(kvt_nvme_put(n, i, f->host + (size_t)i * BLOCK, &m, i), 0);
	}
	assert_int_equal(wreap(n, c, k), 0);
}

/* A read held before verification: its IO is done, yet no reap hands it out until it is let
 * go; then it completes with the right bytes. Zero-copy (the HOST slot is the destination). */
static void
test_no_completion_before_verify(void **state)
{
	struct tsup_nvme_fx *f = *state;
	struct kvt_nvme *n = wopen(f, KVT_CODEC_NONE, 2, true);
	uint8_t *dst = f->host + (size_t)8 * BLOCK;
	struct kvt_nvme_cqe c[QD];
	uint8_t want[BLOCK];

	assert_true(kvt_nvme_zero_copy(n));
	wput_all(n, f, 1);
	memcpy(want, f->host, BLOCK);
	gate_set(true, 0);
	assert_int_equal(kvt_nvme_get(n, 0, dst, 77), 0);
	assert_int_equal(kvt_nvme_flush(n), 1);
	/* the IO completes and reaches a worker's verification, which is held */
	assert_int_equal(gate_reap_until(n, 1), 1);
	for (int i = 0; i < 20; i++) {
		assert_int_equal(kvt_nvme_reap(n, c, QD, false), 0); /* not handed out */
		usleep(1000);
	}
	assert_int_equal(kvt_nvme_inflight(n), 1);
	gate_set(false, 0);
	assert_int_equal(wreap(n, c, 1), 0);
	assert_int_equal(c[0].user_data, 77);
	assert_memory_equal(dst, want, BLOCK);
	assert_int_equal(gate_timeouts(), 0);
	kvt_nvme_close(n);
}

/* Bit flips in reads are detected by the workers, for every block of a full queue, and the
 * reason reaches the reaping thread's kvt_last_error_message(); clean reads verify. */
static void
check_flips(struct tsup_nvme_fx *f, int codec, bool zero_copy)
{
	struct kvt_nvme *n = wopen(f, codec, 3, zero_copy);
	struct kvt_nvme_cqe c[QD];
	uint8_t *dst = f->host + (size_t)QD * BLOCK;

	wput_all(n, f, QD);
	for (int flip = 1; flip >= 0; flip--) {
		gate_set(false, flip);
		memset(dst, 0, (size_t)QD * BLOCK);
		for (unsigned i = 0; i < QD; i++)
			assert_int_equal(kvt_nvme_get(n, i, dst + (size_t)i * BLOCK, 100 + i), 0);
		assert_int_equal(wreap(n, c, QD), flip ? QD : 0);
		for (unsigned i = 0; i < QD; i++) {
			assert_int_equal(c[i].res, flip ? KVT_ECORRUPT : 0);
			if (!flip)
				assert_memory_equal(dst + (size_t)(c[i].user_data - 100) * BLOCK,
						    f->host + (size_t)(c[i].user_data - 100) * BLOCK,
						    BLOCK);
		}
		if (flip)
			assert_non_null(strstr(kvt_last_error_message(), "nvme slot"));
	}
	kvt_nvme_close(n);
}

static void
test_flips_detected_zero_copy(void **state)
{
	check_flips(*state, KVT_CODEC_NONE, true);
}

static void
test_flips_detected_staged_codec(void **state)
{
	check_flips(*state, KVT_CODEC_SHUF_LZ4, false);
}

/* Closing with verifications held back: close waits for them (no leak, no use after free). */
static void
test_close_while_verifying(void **state)
{
	struct tsup_nvme_fx *f = *state;
	struct kvt_nvme *n = wopen(f, KVT_CODEC_SHUF_LZ4, 2, false);

	wput_all(n, f, 4);
	gate_set(true, 0);
	for (unsigned i = 0; i < 4; i++)
		assert_int_equal(kvt_nvme_get(n, i, f->host + (size_t)(8 + i) * BLOCK, i), 0);
	assert_int_equal(kvt_nvme_flush(n), 4);
	assert_true(gate_reap_until(n, 2) >= 1);
	gate_set(false, 0);
	kvt_nvme_close(n); /* drains the held and queued verifications */
	assert_int_equal(gate_timeouts(), 0);
}

/* Through the engine: while a resumed block's verification is held, none of the session's
 * blocks is valid in HOST or HBM, however often the engine polls; once let go, the session
 * prepares with the right data. */
static void
test_engine_not_valid_before_verify(void **state)
{
	struct tsup_cfg cfg = { .hbm_blocks = 8, .host_blocks = 8, .nvme_blocks = 16 };
	struct kvt_seq_info si;
	struct kvt_engine *e;
	char *dir = NULL;
	kvt_seq_id s;

	(void)state;
	kvt_test_nvme_hooks = &gate_hooks;
	e = tsup_engine(&cfg, &dir);
	kvt_test_nvme_hooks = NULL;
	s = tsup_session_written(e, 0, 5, 6 * TSUP_TPB);
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_info(e, s, &si), 0);
	assert_int_equal(si.blocks_in[KVT_TIER_NVME], 6);
	assert_int_equal(si.blocks_in[KVT_TIER_HOST] + si.blocks_in[KVT_TIER_HBM], 0);
	gate_set(true, 0);
	assert_int_equal(kvt_seq_resume(e, s), 0);
	/* poll until a read reached its (held) verification, then 30 more times */
	for (int i = 0, after = 0; i < 5000 && after < 30; i++) {
		assert_true(kvt_engine_poll(e, 0) >= 0);
		assert_int_equal(kvt_seq_info(e, s, &si), 0);
		assert_int_equal(si.blocks_in[KVT_TIER_HOST] + si.blocks_in[KVT_TIER_HBM], 0);
		after += gate_wait_entered(0) > 0;
		usleep(1000);
	}
	assert_true(gate_wait_entered(1) >= 1);
	gate_set(false, 0);
	assert_int_equal(tsup_verify(e, s, 5), 0); /* made valid, with the right bytes */
	assert_int_equal(gate_timeouts(), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* nvme_workers out of range is refused with a message; 0 (inline) works. */
static void
test_engine_workers_option(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_engine *e = NULL;

	(void)state;
	kvt_engine_opts_init(&o, sizeof o);
	assert_int_equal(o.nvme_workers, 2);
	o.layout = (struct kvt_layout){ .n_layers = 1, .n_kv_heads = 1, .head_dim = 64,
					.dtype = KVT_DTYPE_F16, .tokens_per_block = 16 };
	o.hbm_bytes = 1 << 20;
	o.nvme_workers = 17;
	assert_int_equal(kvt_engine_create(&o, &e), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "nvme_workers"));
	o.nvme_workers = 0;
	assert_int_equal(kvt_engine_create(&o, &e), 0);
	kvt_engine_destroy(e);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_no_completion_before_verify, wfx_setup,
						wfx_teardown),
		cmocka_unit_test_setup_teardown(test_flips_detected_zero_copy, wfx_setup,
						wfx_teardown),
		cmocka_unit_test_setup_teardown(test_flips_detected_staged_codec, wfx_setup,
						wfx_teardown),
		cmocka_unit_test_setup_teardown(test_close_while_verifying, wfx_setup,
						wfx_teardown),
		cmocka_unit_test(test_engine_not_valid_before_verify),
		cmocka_unit_test(test_engine_workers_option),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
