/* SPDX-License-Identifier: MIT */
/*
 * tests/test_cuemu_exec.c - the kernel half of the CUDA-on-CPU emulation (tests/cuemu/exec.cc,
 * device.h) with the self-test kernels of tests/cuemu/exec_selftest.cu: every shuffle flavour
 * (segment widths, partial masks, 8-byte values), ballot/any/all, static and dynamic shared
 * memory across barriers (also with KVT_CUEMU_ORDER=reverse), NULL dynamic shared memory for a
 * launch that asked for none; every kernel fault - a thread returning while its block waits at
 * __syncthreads or its warp waits for it in a shuffle, __syncthreads after a thread returned,
 * a shuffle mask that differs between lanes, leaves out the caller, names lanes that do not
 * exist or that returned, a bad width, a shuffle from a lane outside the mask, a deadlock of a
 * barrier against a shuffle, a pointer argument into pageable memory - each reported with its
 * kind, made the sticky error, the rest of the grid dropped (nothing written); and the
 * launch-time checks (block size, shared memory, injected launch failures) that queue nothing.
 *
 * Exits 77 (skip) in builds without the emulation (KVT_CUDA_EMU).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>

#ifndef KVT_CUDA_EMU

int
main(void)
{
	printf("test_cuemu_exec: skipped: not a KVT_CUDA_EMU build\n");
	return 77;
}

#else

#include <stdlib.h>
#include <string.h>

#include "cuemu/exec_selftest.h"

#define TCE_OK(call) assert_int_equal((int)(call), (int)cudaSuccess)

/* The expected st_warp_kernel results of global thread t (blocks of 64 threads). */
static void
tce_warp_want(int t, int *o)
{
	const int lane = t % 64 % 32, base = t - lane;

	o[0] = base + lane * 7 % 32;
	o[1] = lane % 8 >= 3 ? t - 3 : t;
	o[2] = lane % 16 + 5 < 16 ? t + 5 : t;
	o[3] = base + (lane ^ 6);
	o[4] = 0x49249249;
	o[5] = 1 + 2 + 0;
	o[6] = lane < 16 ? base + (lane ^ 1) : -1;
	o[7] = base + 31 - lane;
}

static void
test_warp_ops(void **state)
{
	enum { N = 2 * 64 };
	int *d = NULL, got[N * 8], want[8];

	(void)state;
	TCE_OK(cudaMalloc((void **)&d, sizeof got));
	TCE_OK(cudaMemset(d, 0xa5, sizeof got));
	TCE_OK(kvt_cuemu_selftest(KVT_CUEMU_ST_WARP, 2, 64, 0, d, NULL, NULL));
	TCE_OK(cudaDeviceSynchronize());
	TCE_OK(cudaMemcpy(got, d, sizeof got, cudaMemcpyDeviceToHost));
	for (int t = 0; t < N; t++) {
		tce_warp_want(t, want);
		for (int k = 0; k < 8; k++)
			if (got[t * 8 + k] != want[k])
				fail_msg("thread %d result %d: %d, want %d", t, k, got[t * 8 + k],
					 want[k]);
	}
	TCE_OK(cudaFree(d));
}

/* 3 blocks of 96 threads (3 warps): out[i] = 3 * in[the block's last - i] */
static void
tce_reverse(const char *order)
{
	enum { B = 96, N = 3 * B };
	int in[N], out[N], *din = NULL, *dout = NULL;

	if (order)
		setenv("KVT_CUEMU_ORDER", order, 1);
	for (int i = 0; i < N; i++)
		in[i] = i * 7 + 1;
	TCE_OK(cudaMalloc((void **)&din, sizeof in));
	TCE_OK(cudaMalloc((void **)&dout, sizeof out));
	TCE_OK(cudaMemcpy(din, in, sizeof in, cudaMemcpyHostToDevice));
	TCE_OK(cudaMemset(dout, 0, sizeof out));
	TCE_OK(kvt_cuemu_selftest(KVT_CUEMU_ST_REVERSE, 3, B, B * sizeof(int), din, dout, NULL));
	TCE_OK(cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost));
	for (int i = 0; i < N; i++)
		assert_int_equal(out[i], 3 * in[i / B * B + B - 1 - i % B]);
	TCE_OK(cudaFree(din));
	TCE_OK(cudaFree(dout));
	unsetenv("KVT_CUEMU_ORDER");
}

static void
test_barrier_shared(void **state)
{
	(void)state;
	tce_reverse(NULL);
	tce_reverse("reverse");
}

/* st_smem_kernel on 32 threads with @smem bytes: every thread's answer is @want */
static void
tce_smem(int *d, size_t smem, int want)
{
	int got[32];

	TCE_OK(cudaMemset(d, 0, sizeof got));
	TCE_OK(kvt_cuemu_selftest(KVT_CUEMU_ST_SMEM, 1, 32, smem, d, NULL, NULL));
	TCE_OK(cudaMemcpy(got, d, sizeof got, cudaMemcpyDeviceToHost));
	for (int i = 0; i < 32; i++)
		assert_int_equal(got[i], want);
}

/* a launch without dynamic shared memory sees NULL, also after one with some on its worker */
static void
test_dynamic_smem_none(void **state)
{
	int *d = NULL;

	(void)state;
	TCE_OK(cudaMalloc((void **)&d, 32 * sizeof(int)));
	tce_smem(d, 0, 1);
	tce_smem(d, 4096, 2);
	tce_smem(d, 0, 1);
	tce_smem(d, 4, 2);
	TCE_OK(cudaFree(d));
}

/*
 * Launch a faulting kernel on 2 blocks of @block threads: the launch succeeds, the sync
 * reports the fault (its message says @kind), all is reset. When @arg is device memory (room
 * for 2 * @block ints) it is poisoned first and must stay so: every fault kernel faults before
 * a thread of block 0 writes, and block 1 is dropped.
 */
static void
tce_fault(int which, unsigned block, void *arg, const char *kind)
{
	const int dev = kvt_cuemu_addressable(arg, 2 * block * sizeof(int));
	int got[2 * 64];
	char msg[1024];

	assert_true(block <= 64);
	if (dev)
		TCE_OK(cudaMemset(arg, 0xa5, 2 * block * sizeof(int)));
	TCE_OK(kvt_cuemu_selftest(which, 2, block, 0, arg, NULL, NULL));
	assert_int_equal((int)cudaDeviceSynchronize(), (int)cudaErrorLaunchFailure);
	assert_int_equal((int)cudaGetLastError(), (int)cudaErrorLaunchFailure);
	kvt_cuemu_last_fault(msg, sizeof msg);
	if (!strstr(msg, kind))
		fail_msg("fault '%s' does not say '%s'", msg, kind);
	print_message("(as expected: %s)\n", msg);
	kvt_cuemu_reset();
	TCE_OK(cudaDeviceSynchronize());
	if (!dev)
		return;
	TCE_OK(cudaMemcpy(got, arg, 2 * block * sizeof(int), cudaMemcpyDeviceToHost));
	for (unsigned i = 0; i < 2 * block; i++)
		if (got[i] != (int)0xa5a5a5a5)
			fail_msg("thread %u of block %u wrote %d after the fault", i % block,
				 i / block, got[i]);
}

static void
test_faults(void **state)
{
	int *d = NULL, *pageable = calloc(64, sizeof(int)), got[64];

	(void)state;
	assert_non_null(pageable);
	TCE_OK(cudaMalloc((void **)&d, 2 * 64 * sizeof(int)));
	tce_fault(KVT_CUEMU_ST_EXIT_EARLY, 64, d, "thread (5,0,0) of block (0,0,0): returned while "
		  "5 thread(s) wait at __syncthreads");
	tce_fault(KVT_CUEMU_ST_MASK, 32, d, "thread (3,0,0) of block (0,0,0): __shfl_xor_sync "
		  "with mask 0x7fffffff while lanes 0x00000007");
	tce_fault(KVT_CUEMU_ST_DEADLOCK, 64, d, "deadlock in block (0,0,0): 32 thread(s) wait");
	tce_fault(KVT_CUEMU_ST_OWN_LANE, 32, d, "thread (2,0,0) of block (0,0,0): __shfl_sync "
		  "with mask 0xfffffffb, which leaves out its own lane 2");
	tce_fault(KVT_CUEMU_ST_NO_LANE, 16, d, "thread (0,0,0) of block (0,0,0): __shfl_xor_sync "
		  "with mask 0xffffffff naming lanes that do not exist (the warp has lanes "
		  "0x0000ffff)");
	tce_fault(KVT_CUEMU_ST_RETURNED, 64, d, "thread (1,0,0) of block (0,0,0): __shfl_sync "
		  "with mask 0xffffffff, but lanes 0x00000001 of it returned");
	tce_fault(KVT_CUEMU_ST_LEAVE_WARP, 32, d, "thread (1,0,0) of block (0,0,0): returned "
		  "while lanes 0x00000001 of its warp wait for it in __shfl_sync with mask "
		  "0xffffffff");
	tce_fault(KVT_CUEMU_ST_WIDTH, 32, d, "thread (0,0,0) of block (0,0,0): __shfl_sync with "
		  "width 3");
	tce_fault(KVT_CUEMU_ST_OUTSIDE, 32, d, "thread (0,0,0) of block (0,0,0): shuffles from "
		  "lane 20, outside the mask 0x0000ffff");
	tce_fault(KVT_CUEMU_ST_SYNC_EXITED, 64, d, "thread (1,0,0) of block (0,0,0): reaches "
		  "__syncthreads, but 1 thread(s) of its block returned before it (the latest: "
		  "thread (0,0,0))");
	tce_fault(KVT_CUEMU_ST_TOUCH, 64, pageable, "is not device-addressable");
	for (int i = 0; i < 64; i++)
		assert_int_equal(pageable[i], 0); /* the grid was dropped before it ran */
	/* after the reset kernels run again */
	TCE_OK(cudaMemset(d, 0, 64 * sizeof(int)));
	TCE_OK(kvt_cuemu_selftest(KVT_CUEMU_ST_TOUCH, 1, 64, 0, d, NULL, NULL));
	TCE_OK(cudaMemcpy(got, d, sizeof got, cudaMemcpyDeviceToHost));
	for (int i = 0; i < 64; i++)
		assert_int_equal(got[i], 1);
	TCE_OK(cudaFree(d));
	free(pageable);
}

/* A refused launch returns @err, leaves it as the last error and queues nothing. */
static void
tce_refused(int *d, unsigned block, size_t smem, cudaError_t err)
{
	int got[64];

	TCE_OK(cudaMemset(d, 0, sizeof got));
	assert_int_equal((int)kvt_cuemu_selftest(KVT_CUEMU_ST_TOUCH, 1, block, smem, d, NULL,
						 NULL), (int)err);
	assert_int_equal((int)cudaGetLastError(), (int)err);
	TCE_OK(cudaGetLastError()); /* not sticky */
	TCE_OK(cudaMemcpy(got, d, sizeof got, cudaMemcpyDeviceToHost));
	for (int i = 0; i < 64; i++)
		assert_int_equal(got[i], 0);
}

static void
test_launch_checks(void **state)
{
	int *d = NULL;

	(void)state;
	TCE_OK(cudaMalloc((void **)&d, 2048 * sizeof(int)));
	tce_refused(d, 1025, 0, cudaErrorInvalidConfiguration);
	tce_refused(d, 0, 0, cudaErrorInvalidConfiguration);
	tce_refused(d, 64, (48u << 10) + 1, cudaErrorInvalidValue);
	assert_int_equal(kvt_cuemu_fail("launch", cudaErrorLaunchOutOfResources, 0, 1), 0);
	tce_refused(d, 64, 0, cudaErrorLaunchOutOfResources);
	/* the rule is used up: the same launch runs (1024 threads, 48 KiB are the limits) */
	TCE_OK(kvt_cuemu_selftest(KVT_CUEMU_ST_TOUCH, 1, 1024, 48u << 10, d, NULL, NULL));
	TCE_OK(cudaDeviceSynchronize());
	TCE_OK(cudaFree(d));
	kvt_cuemu_reset();
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_warp_ops),
		cmocka_unit_test(test_barrier_shared),
		cmocka_unit_test(test_dynamic_smem_none),
		cmocka_unit_test(test_faults),
		cmocka_unit_test(test_launch_checks),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif /* KVT_CUDA_EMU */
