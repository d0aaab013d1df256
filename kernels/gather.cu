/* SPDX-License-Identifier: MIT */
/*
 * kernels/gather.cu - batched block gather/scatter between block-first slots and a packed
 * staging buffer, one launch for many blocks (see kernels_cuda.h).
 *
 * Why a kernel: one cudaMemcpyAsync per block costs 5-7 us of launch overhead, and layer-wise
 * transfers move many small pieces; a single kernel reading a slot list moves them all, and
 * when the staging buffer is mapped pinned host memory it copies over PCIe directly (zero-copy).
 *
 * Grid: y walks the pieces (grid-stride when n > 65535), x walks the words of one piece
 * (grid-stride). Word = 16 bytes (uint4) when every address and length is 16-byte aligned,
 * else 1 byte.
 */
#include <cuda_runtime.h>
#include <errno.h>
#include <stdint.h>

extern "C" {
#include "error.h"
}
#include "kernels/kernels_cuda.h"

#define GATHER_THREADS 256u
#define GATHER_MAX_X 1024u   /* blocks along a piece; more pieces in flight beat longer rows */
#define GATHER_MAX_Y 65535u  /* gridDim.y limit */

/*
 * Copy piece i: packed[i * words ...] <-> slots base[slots[i] * stride_w + offset_w ...].
 * to_packed selects the direction (gather when true). Strides and offsets are in words.
 */
template <typename W>
__global__ void
gather_kernel(W *packed, W *base, uint64_t stride_w, uint64_t offset_w, uint64_t words,
	      const uint32_t *slots, uint32_t n, bool to_packed)
{
	for (uint64_t i = blockIdx.y; i < n; i += gridDim.y) {
		W *slot = base + (uint64_t)slots[i] * stride_w + offset_w;
		W *pk = packed + i * words;

		for (uint64_t j = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; j < words;
		     j += (uint64_t)gridDim.x * blockDim.x) {
			if (to_packed)
				pk[j] = slot[j];
			else
				slot[j] = pk[j];
		}
	}
}

/* Checks, picks the word size and launches. Returns 0, -EINVAL or KVT_EDEVICE. */
static int
gather_launch(void *packed, void *base, uint64_t slot_stride, uint64_t offset, uint64_t len,
	      const uint32_t *slots, uint32_t n, bool to_packed, cudaStream_t stream)
{
	const char *what = to_packed ? "gather" : "scatter";
	uint64_t wsize, words, xblocks;

	if (!n)
		return 0;
	if (!packed || !base || !slots)
		return kvt_err(-EINVAL, "%s blocks (cuda): NULL buffer or slot list", what);
	if (!len || offset + len < offset || offset + len > slot_stride)
		return kvt_err(-EINVAL,
			       "%s blocks (cuda): range offset %llu len %llu outside slot of %llu",
			       what, (unsigned long long)offset, (unsigned long long)len,
			       (unsigned long long)slot_stride);
	wsize = (((uintptr_t)packed | (uintptr_t)base | slot_stride | offset | len) % 16) ? 1 : 16;
	words = len / wsize;
	xblocks = (words + GATHER_THREADS - 1) / GATHER_THREADS;
	if (xblocks > GATHER_MAX_X)
		xblocks = GATHER_MAX_X;
	dim3 grid((unsigned)xblocks, n < GATHER_MAX_Y ? n : GATHER_MAX_Y);
	if (wsize == 16)
		gather_kernel<uint4><<<grid, GATHER_THREADS, 0, stream>>>(
			(uint4 *)packed, (uint4 *)base, slot_stride / 16, offset / 16, words, slots,
			n, to_packed);
	else
		gather_kernel<unsigned char><<<grid, GATHER_THREADS, 0, stream>>>(
			(unsigned char *)packed, (unsigned char *)base, slot_stride, offset, words,
			slots, n, to_packed);
	cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess)
		return kvt_err(KVT_EDEVICE, "%s blocks kernel launch: %s", what,
			       cudaGetErrorString(e));
	return 0;
}

extern "C" int
kvt_gather_blocks_cuda(void *dst, const void *base, uint64_t slot_stride, uint64_t offset,
		       uint64_t len, const uint32_t *slots, uint32_t n, cudaStream_t stream)
{
	/* the kernel only reads through base when gathering */
	return gather_launch(dst, const_cast<void *>(base), slot_stride, offset, len, slots, n,
			     true, stream);
}

extern "C" int
kvt_scatter_blocks_cuda(void *base, uint64_t slot_stride, uint64_t offset, uint64_t len,
			const void *src, const uint32_t *slots, uint32_t n, cudaStream_t stream)
{
	/* the kernel only reads through src when scattering */
	return gather_launch(const_cast<void *>(src), base, slot_stride, offset, len, slots, n,
			     false, stream);
}
