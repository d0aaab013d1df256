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
 *
 * kvt_copy_batch_cuda() is the same idea for a list of arbitrary (dst, src, len) copies: the
 * CUDA backend's fallback where cudaMemcpyBatchAsync cannot be used. The copy list travels in
 * the launch's parameters (KVT_COPY_KERNEL_CHUNK copies, 3 KiB, under the 4 KiB parameter limit
 * of every CUDA version), so no device buffer has to outlive the launch.
 */
#include <cuda_runtime.h>
#include <errno.h>
#include <stdint.h>

extern "C" {
#include "tiers/base/error.h"
}
#include "kernels/gather.h"
#include "kernels/kernels_cuda.h"
#include "kernels/launch_cuda.h"

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
	const char *what = to_packed ? "gather blocks" : "scatter blocks";
	uint64_t wsize, words, xblocks;
	int rc;

	if (!n)
		return 0;
	rc = kvt_gather_check(to_packed ? "gather blocks (cuda)" : "scatter blocks (cuda)", packed,
			      base, slot_stride, offset, len, slots);
	if (rc)
		return rc;
	wsize = (((uintptr_t)packed | (uintptr_t)base | slot_stride | offset | len) % 16) ? 1 : 16;
	words = len / wsize;
	xblocks = (words + GATHER_THREADS - 1) / GATHER_THREADS;
	if (xblocks > GATHER_MAX_X)
		xblocks = GATHER_MAX_X;
	dim3 grid((unsigned)xblocks, n < GATHER_MAX_Y ? n : GATHER_MAX_Y);
	if (wsize == 16)
		KVT_CUDA_LAUNCH(grid, GATHER_THREADS, 0, stream, gather_kernel<uint4>)(
			(uint4 *)packed, (uint4 *)base, slot_stride / 16, offset / 16, words, slots,
			n, to_packed);
	else
		KVT_CUDA_LAUNCH(grid, GATHER_THREADS, 0, stream, gather_kernel<unsigned char>)(
			(unsigned char *)packed, (unsigned char *)base, slot_stride, offset, words,
			slots, n, to_packed);
	return kvt_cuda_launched(what);
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

/* One launch's copies, passed by value. */
struct copy_chunk {
	struct kvt_cuda_copy c[KVT_COPY_KERNEL_CHUNK]; /* the copies; n used */
};

/*
 * Copy ch.c[i] for i = blockIdx.y, y + gridDim.y, ... < n; x walks its words. When both
 * addresses are multiples of 16 the body moves 16-byte words and the last len % 16 bytes one by
 * one; otherwise every byte one by one (rare: the engine copies whole blocks or layer pieces
 * between 256-byte aligned arenas).
 */
__global__ void
copy_batch_kernel(const struct copy_chunk ch, uint32_t n)
{
	for (uint32_t i = blockIdx.y; i < n; i += gridDim.y) {
		const struct kvt_cuda_copy cp = ch.c[i];
		uint64_t start = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
		uint64_t step = (uint64_t)gridDim.x * blockDim.x, body = 0;
		unsigned char *d = (unsigned char *)cp.dst;
		const unsigned char *s = (const unsigned char *)cp.src;

		if ((((uintptr_t)cp.dst | (uintptr_t)cp.src) % 16) == 0) {
			body = cp.len / 16;
			for (uint64_t j = start; j < body; j += step)
				((uint4 *)cp.dst)[j] = ((const uint4 *)cp.src)[j];
			body *= 16;
		}
		for (uint64_t j = body + start; j < cp.len; j += step)
			d[j] = s[j];
	}
}

extern "C" int
kvt_copy_batch_cuda(const struct kvt_cuda_copy *v, uint32_t n, cudaStream_t stream,
		    int *cuda_error)
{
	struct copy_chunk ch;

	if (cuda_error)
		*cuda_error = 0;
	if (n && !v)
		return kvt_err(-EINVAL, "copy batch (cuda): NULL copy list for %u copies", n);
	for (uint32_t done = 0; done < n;) {
		uint32_t m = n - done < KVT_COPY_KERNEL_CHUNK ? n - done : KVT_COPY_KERNEL_CHUNK;
		uint64_t most = 0, xblocks, xcap;

		for (uint32_t i = 0; i < m; i++) {
			if (!v[done + i].dst || !v[done + i].src)
				return kvt_err(-EINVAL, "copy batch (cuda): copy %u has a NULL "
					       "address", done + i);
			ch.c[i] = v[done + i];
			most = v[done + i].len > most ? v[done + i].len : most;
		}
		/* enough thread blocks per copy to cover the longest in 16-byte words, but about
		 * 4096 in all: a few copies each get many, many copies share the GPU */
		xblocks = (most / 16 + GATHER_THREADS - 1) / GATHER_THREADS;
		xcap = 4096u / m;
		xblocks = xblocks < 1 ? 1 : xblocks > xcap ? xcap : xblocks; /* xcap >= 32 */
		/* cudaLaunchKernel, not <<<>>>: the stub's one-time kernel lookup is a function
		 * static, and the library's host code may be called from many threads at once */
		void *args[] = { &ch, &m };
		cudaError_t e = KVT_CUDA_LAUNCH_KERNEL(copy_batch_kernel,
						       dim3((unsigned)xblocks, m),
						       dim3(GATHER_THREADS), args, 0, stream);
		if (e != cudaSuccess) {
			(void)cudaGetLastError(); /* clear the non-sticky launch error */
			if (cuda_error)
				*cuda_error = (int)e;
			return kvt_err(KVT_EDEVICE, "cudaLaunchKernel (copy batch): %s (%s)",
				       cudaGetErrorString(e), cudaGetErrorName(e));
		}
		done += m;
	}
	return 0;
}
