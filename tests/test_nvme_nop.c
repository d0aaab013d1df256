/* SPDX-License-Identifier: MIT */
/*
 * tests/test_nvme_nop.c - the NVME tier's wake-up NOP (kvt_nvme_poke, tiers/nvme_io.c) when its
 * submit is refused or only partly taken (the submit_cap hook): the NOP is no IO. A flush that
 * hands only the NOP to the kernel submits no IO; an IO whose completion was lost still times
 * out while the NOP waits in the SQ; a waiting reap with nothing in the kernel (the NOP and an
 * IO stuck in the SQ) returns instead of waiting for ever, and the IO goes once submits work.
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/kvt_test.h"
#include "tiers/nvme_int.h"
#include "tiers/tier_nvme.h"

#define BLOCK 4096u
#define SLOT 8192u /* header page + BLOCK */
#define NSLOTS 8u
#define QD 4u

/* The hooks' state: what submit_cap answers, what it and fate saw. */
static struct {
	int cap;          /* submit_cap's answer: -errno, a count, or INT32_MAX (all) */
	uint32_t last;    /* the SQEs it was last shown */
	unsigned submits; /* its calls */
	bool lose;        /* fate: lose the next CQE */
	unsigned fates;   /* fate's calls */
} hk;

static int
hk_submit_cap(void *arg, uint32_t sqes)
{
	(void)arg;
	hk.last = sqes;
	hk.submits++;
	return hk.cap;
}

static int
hk_fate(void *arg, bool is_write, uint32_t slot)
{
	(void)arg, (void)is_write, (void)slot;
	hk.fates++;
	if (!hk.lose)
		return KVT_NVME_FATE_NORMAL;
	hk.lose = false;
	return KVT_NVME_FATE_LOSE;
}

static int
nfx_setup(void **state)
{
	return tsup_nvme_fx_setup(state, 4096, "nvmenop");
}

static struct kvt_nvme *
nopen(struct tsup_nvme_fx *f, uint32_t timeout_ms)
{
	static struct kvt_nvme_fault_hooks hooks;
	struct kvt_nvme_opts o = {
		.dir = f->dir,
		.capacity_bytes = (uint64_t)NSLOTS * SLOT,
		.block_bytes = BLOCK,
		.queue_depth = QD,
		.hooks = &hooks,
	};
	struct kvt_nvme *n = NULL;

	memset(&hk, 0, sizeof hk);
	hk.cap = INT32_MAX;
	hooks = (struct kvt_nvme_fault_hooks){ .submit_cap = hk_submit_cap, .fate = hk_fate,
					       .io_timeout_ms = timeout_ms };
	assert_int_equal(kvt_nvme_open(&o, &n, NULL, 0), 0);
	return n;
}

/* A wake-up NOP, as a worker sends one (mu held). */
static void
poke(struct kvt_nvme *n)
{
	pthread_mutex_lock(&n->mu);
	kvt_nvme_poke(n);
	pthread_mutex_unlock(&n->mu);
}

/* SQ [write 0, NOP, write 1], taken one SQE at a time: the flush that takes the NOP submits no
 * IO, the others one each; both writes complete, nothing is left in flight. */
static void
test_nop_partial_submits(void **state)
{
	struct kvt_nvme *n = nopen(*state, 0);
	uint8_t src[BLOCK];

	memset(src, 0x3c, sizeof src);
	hk.cap = -EBUSY;
	assert_int_equal(kvt_nvme_submit_write(n, 0, src, 10, 0), 0);
	poke(n); /* its submit refused: the NOP stays in the SQ behind write 0 */
	assert_int_equal(hk.last, 2);
	assert_int_equal(kvt_nvme_flush(n), -EBUSY);
	assert_int_equal(kvt_nvme_submit_write(n, 1, src, 11, 1), 0);
	hk.cap = 1;
	assert_int_equal(kvt_nvme_flush(n), 1); /* write 0 */
	assert_int_equal(hk.last, 3);
	assert_int_equal(kvt_nvme_flush(n), 0); /* the NOP: no IO */
	assert_int_equal(hk.last, 2);
	hk.cap = INT32_MAX;
	assert_int_equal(kvt_nvme_flush(n), 1); /* write 1 */
	assert_int_equal(hk.last, 1);
	hk.submits = 0;
	assert_int_equal(kvt_nvme_flush(n), 0);
	assert_int_equal(hk.submits, 0); /* nothing left in the SQ to submit */
	tsup_nvme_reap_all(n, 2, 0);
	assert_int_equal(kvt_nvme_inflight(n), 0);
	assert_int_equal(kvt_nvme_free_qd(n), QD);
	kvt_nvme_close(n);
}

/* A write whose CQE is lost times out (-ETIMEDOUT) although a wake-up NOP, refused, waits in the
 * SQ: the NOP is no IO that must be submitted before deadlines count. */
static void
test_nop_refused_timeouts_go_on(void **state)
{
	struct kvt_nvme *n = nopen(*state, 50);
	struct kvt_nvme_cqe c[QD];
	uint8_t src[BLOCK];
	int r = 0;

	memset(src, 0x5a, sizeof src);
	hk.lose = true;
	assert_int_equal(kvt_nvme_submit_write(n, 2, src, 12, 7), 0);
	assert_int_equal(kvt_nvme_flush(n), 1); /* in the kernel */
	hk.cap = -EAGAIN;
	poke(n);
	for (int i = 0; i < 5000 && r == 0; i++) {
		r = kvt_nvme_reap(n, c, QD, false);
		if (r == 0)
			usleep(1000);
	}
	assert_int_equal(r, 1);
	assert_int_equal(hk.fates, 1); /* its CQE came and was lost */
	assert_int_equal(c[0].user_data, 7);
	assert_int_equal(c[0].res, -ETIMEDOUT);
	assert_int_equal(kvt_nvme_inflight(n), 0);
	hk.cap = INT32_MAX;
	assert_int_equal(kvt_nvme_reap(n, c, QD, false), 0); /* the NOP goes: no completion */
	kvt_nvme_close(n); /* the retired buffer is freed: nothing leaks under ASan */
}

static void
hang_alarm(int sig)
{
	static const char m[] = "kvt_nvme_reap(wait) hung on a refused wake-up NOP\n";

	(void)sig;
	if (write(2, m, sizeof m - 1) < 0)
		_exit(3);
	_exit(3);
}

/* A write and a NOP both stuck in the SQ (submits refused), nothing in the kernel: a waiting
 * reap has nothing to wait for and returns 0 (no endless wait); once submits work, the next
 * reap hands both over and the write completes. */
static void
test_nop_refused_reap_returns(void **state)
{
	struct kvt_nvme *n = nopen(*state, 0);
	struct kvt_nvme_cqe c[QD];
	uint8_t src[BLOCK];

	memset(src, 0xa5, sizeof src);
	hk.cap = -EBUSY;
	assert_int_equal(kvt_nvme_submit_write(n, 3, src, 13, 9), 0);
	poke(n);
	signal(SIGALRM, hang_alarm);
	alarm(10);
	assert_int_equal(kvt_nvme_reap(n, c, QD, true), 0);
	alarm(0);
	assert_int_equal(kvt_nvme_inflight(n), 1);
	hk.cap = INT32_MAX;
	assert_int_equal(kvt_nvme_reap(n, c, QD, true), 1);
	assert_int_equal(c[0].user_data, 9);
	assert_int_equal(c[0].res, 0);
	assert_int_equal(kvt_nvme_free_qd(n), QD);
	kvt_nvme_close(n);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_nop_partial_submits, nfx_setup,
						tsup_nvme_fx_teardown),
		cmocka_unit_test_setup_teardown(test_nop_refused_timeouts_go_on, nfx_setup,
						tsup_nvme_fx_teardown),
		cmocka_unit_test_setup_teardown(test_nop_refused_reap_returns, nfx_setup,
						tsup_nvme_fx_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
