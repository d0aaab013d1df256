/* SPDX-License-Identifier: MIT */
/*
 * kernels/gather.h - C reference of the block gather/scatter kernels (kernels/gather.cu,
 * launchers in kernels/kernels_cuda.h): a byte range of each of n block-first slots to or from
 * a packed staging buffer. Used on CPU and by the GPU tests as the expected result.
 */
#ifndef KVT_KERNELS_GATHER_H
#define KVT_KERNELS_GATHER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/**
 * kvt_gather_check() - the argument checks of every gather/scatter entry point (C reference
 * and CUDA launchers): buffers @a, @b and @slots not NULL, [offset, offset + len) a non-empty
 * range within @slot_stride. @what names the caller in the message. Returns 0 or -EINVAL with
 * a message. Pure (thread-safe).
 */
int kvt_gather_check(const char *what, const void *a, const void *b, uint64_t slot_stride,
		     uint64_t offset, uint64_t len, const uint32_t *slots);

/**
 * kvt_gather_blocks_ref() - for i in 0..n-1:
 *   dst[i * len .. (i + 1) * len) = base[slots[i] * slot_stride + offset .. + len).
 * @dst: [n][len] bytes, not overlapping the source ranges.  @base: slot 0.
 * @slot_stride: bytes between slots; @offset, @len: the range within each slot, len >= 1,
 * offset + len <= slot_stride.  @slots: [n] slot ids.  n == 0 does nothing.
 * Returns 0 or -EINVAL (NULL pointer with n > 0, range outside the slot), with a message.
 */
int kvt_gather_blocks_ref(void *dst, const void *base, uint64_t slot_stride, uint64_t offset,
			  uint64_t len, const uint32_t *slots, uint32_t n);

/**
 * kvt_scatter_blocks_ref() - the inverse: base[slots[i] * slot_stride + offset .. + len) =
 * src[i * len .. (i + 1) * len). Slot ids distinct. Arguments and returns as the gather.
 */
int kvt_scatter_blocks_ref(void *base, uint64_t slot_stride, uint64_t offset, uint64_t len,
			   const void *src, const uint32_t *slots, uint32_t n);

#ifdef __cplusplus
}
#endif

#endif /* KVT_KERNELS_GATHER_H */
