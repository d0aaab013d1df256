/* SPDX-License-Identifier: MIT */
/*
 * tests/cuemu/exec_selftest.h - kernels that exercise the emulation's kernel half (exec.cc):
 * warp intrinsics, barriers and shared memory, and the faults a GPU does not forgive. Compiled
 * into test_cuemu_exec only (KVT_CUDA_EMU builds); includable from C.
 */
#ifndef KVT_TESTS_CUEMU_EXEC_SELFTEST_H
#define KVT_TESTS_CUEMU_EXEC_SELFTEST_H

#include <stddef.h>

#include "cuemu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* the self-test kernels */
enum kvt_cuemu_st {
	KVT_CUEMU_ST_WARP,       /* @a int [threads][8]: shuffles, ballot, any/all per thread */
	KVT_CUEMU_ST_REVERSE,    /* @b[i] = 3 * @a[block's last - i] via static + dynamic smem */
	KVT_CUEMU_ST_EXIT_EARLY, /* thread 5 returns, the others __syncthreads: a fault */
	KVT_CUEMU_ST_MASK,       /* lane 3 shuffles with another mask than lanes 0-2: a fault */
	KVT_CUEMU_ST_DEADLOCK,   /* odd threads at __syncthreads, even ones at a shuffle */
	KVT_CUEMU_ST_TOUCH,      /* writes @a[thread]: a fault unless @a is device memory */
	KVT_CUEMU_ST_SMEM,       /* @a[thread] = 1 if the dynamic shared memory is NULL, else 2 */
	/* faults of the warp and barrier rules; each would write @a[global thread] after it */
	KVT_CUEMU_ST_OWN_LANE,   /* lane 2 shuffles with a mask that leaves it out */
	KVT_CUEMU_ST_NO_LANE,    /* a full-warp shuffle in a block of fewer than 32 threads */
	KVT_CUEMU_ST_RETURNED,   /* lane 0 returns, then the others shuffle with the full mask */
	KVT_CUEMU_ST_LEAVE_WARP, /* lane 1 returns while lane 0 waits for it in a shuffle */
	KVT_CUEMU_ST_WIDTH,      /* a shuffle of width 3 */
	KVT_CUEMU_ST_OUTSIDE,    /* lanes 0-15 (mask 0xffff) shuffle from lane 20 */
	KVT_CUEMU_ST_SYNC_EXITED, /* thread 0 returns, then the others __syncthreads */
};

/**
 * kvt_cuemu_selftest() - launch self-test kernel @which (enum kvt_cuemu_st) with @grid x 1 x 1
 * blocks of @block x 1 x 1 threads and @smem bytes of dynamic shared memory on @s, with the
 * arguments @a and @b as that kernel reads them. Returns what the launch returned.
 */
cudaError_t kvt_cuemu_selftest(int which, unsigned grid, unsigned block, size_t smem, void *a,
			       void *b, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* KVT_TESTS_CUEMU_EXEC_SELFTEST_H */
