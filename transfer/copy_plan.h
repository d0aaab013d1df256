/* SPDX-License-Identifier: MIT */
/*
 * transfer/copy_plan.h - which copies of a batch a copy kernel may perform (internal).
 *
 * The CUDA backend's fallback for a copy batch, where cudaMemcpyBatchAsync is absent (CUDA <
 * 12.8), refused by the driver, or not allowed (the legacy default stream), is one copy kernel
 * launch per KVT_COPY_KERNEL_CHUNK (128) copies (kernels/gather.cu, kvt_copy_batch_cuda()). A
 * kernel can only touch memory that the GPU can address: the backend's own cudaMalloc arenas
 * and its cudaHostAlloc regions (mapped into the device address space under UVA). This module
 * keeps those ranges and splits a batch into the copies whose source and destination both lie
 * in them (the kernel's) and the rest (one cudaMemcpyAsync each, which handles pageable memory
 * too). Pure C with no CUDA in it, so the split is tested on machines without a GPU
 * (tests/test_device.c).
 */
#ifndef KVT_TRANSFER_COPY_PLAN_H
#define KVT_TRANSFER_COPY_PLAN_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transfer/device.h"

#define KVT_COPY_RANGES_MAX 64u /* arenas a device tracks (the engine allocates 2-4) */

/** One memory range the GPU can address: [lo, hi). */
struct kvt_mem_range {
	uintptr_t lo; /* first byte */
	uintptr_t hi; /* one past the last byte */
};

/** The ranges of one device; a lock guards them (allocation and copy threads differ). */
struct kvt_copy_ranges {
	pthread_mutex_t lock;                       /* guards r and n */
	struct kvt_mem_range r[KVT_COPY_RANGES_MAX]; /* unordered, non-overlapping */
	uint32_t n;                                 /* entries in use */
};

/** Initialise @cr (empty). Returns 0 or -ENOMEM when the lock cannot be created. */
int kvt_copy_ranges_init(struct kvt_copy_ranges *cr);

/** Destroy @cr's lock. */
void kvt_copy_ranges_fini(struct kvt_copy_ranges *cr);

/**
 * kvt_copy_ranges_add() - record [p, p + len) as addressable by kernels. Returns 0; -EINVAL
 * (p NULL, len 0, wrap-around, or overlapping a recorded range); -ENOSPC when
 * KVT_COPY_RANGES_MAX are recorded (the memory then simply goes through cudaMemcpyAsync: the
 * caller may ignore the error). Thread-safe.
 */
int kvt_copy_ranges_add(struct kvt_copy_ranges *cr, const void *p, size_t len);

/**
 * kvt_copy_ranges_remove() - forget the range that starts at @p (before it is freed).
 * Returns 0, or -ENOENT when no range starts there. Thread-safe.
 */
int kvt_copy_ranges_remove(struct kvt_copy_ranges *cr, const void *p);

/**
 * kvt_copy_ranges_split() - split @v[0..n) (non-empty copies) into @kern (both ends inside
 * recorded ranges, each copy wholly inside one range) and @rest (the others), keeping the
 * order within each. @kern and @rest have room for n entries each. Returns the number put in
 * @kern; *n_rest gets the rest. Copies of one batch are independent (the engine never puts two
 * copies with overlapping destinations, or a source that another copy writes, in one batch), so
 * performing the two parts in either order on one stream gives the same bytes. Thread-safe.
 */
uint32_t kvt_copy_ranges_split(struct kvt_copy_ranges *cr, const struct kvt_copy *v, uint32_t n,
			       struct kvt_copy *kern, struct kvt_copy *rest, uint32_t *n_rest);

#endif /* KVT_TRANSFER_COPY_PLAN_H */
