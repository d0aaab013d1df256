/* SPDX-License-Identifier: MIT */
/*
 * kernels/delay.cu - small kernels for tests and benchmarks of the CUDA path (see
 * kernels_cuda.h): a fill or a copy that first spins for a given time on the GPU (so work on a
 * stream is really still running when the host goes on: the async-ordering tests), and a
 * bandwidth-bound read of a buffer (the weight traffic of a decode step in tools/gpu-bench).
 */
#include <cuda_runtime.h>
#include <errno.h>
#include <stdint.h>

extern "C" {
#include "tiers/base/error.h"
}
#include "kernels/kernels_cuda.h"
#include "kernels/launch_cuda.h"

#define DELAY_THREADS 256u
#define DELAY_BLOCKS 64u

/* Spin until @ns nanoseconds of the GPU's global timer have passed since the kernel began. */
static __device__ void
delay_spin(uint64_t ns)
{
	uint64_t t0, t;

	KVT_GLOBALTIMER(t0);
	do {
		KVT_GLOBALTIMER(t);
	} while (t - t0 < ns);
}

/* After the delay: dst[0..len) = src[0..len) (src NULL: = byte). Every thread spins first. */
__global__ void
delay_kernel(unsigned char *dst, const unsigned char *src, uint64_t len, unsigned char byte,
	     uint64_t ns)
{
	delay_spin(ns);
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < len;
	     i += (uint64_t)gridDim.x * blockDim.x)
		dst[i] = src ? src[i] : byte;
}

static int
delay_launch(void *dst, const void *src, uint64_t len, unsigned char byte, uint64_t ns,
	     cudaStream_t stream)
{
	if (!dst || !len)
		return kvt_err(-EINVAL, "delay kernel: NULL dst or len 0");
	KVT_CUDA_LAUNCH(DELAY_BLOCKS, DELAY_THREADS, 0, stream, delay_kernel)(
		(unsigned char *)dst, (const unsigned char *)src, len, byte, ns);
	return kvt_cuda_launched("delay");
}

extern "C" int
kvt_cuda_delay_fill(void *dst, uint64_t len, unsigned char byte, uint64_t delay_ns,
		    cudaStream_t stream)
{
	return delay_launch(dst, NULL, len, byte, delay_ns, stream);
}

extern "C" int
kvt_cuda_delay_copy(void *dst, const void *src, uint64_t len, uint64_t delay_ns,
		    cudaStream_t stream)
{
	if (!src)
		return kvt_err(-EINVAL, "delay copy: NULL src");
	return delay_launch(dst, src, len, 0, delay_ns, stream);
}

/* sink[blockIdx.x] ^= xor of the 16-byte words this block read (keeps the reads alive). */
__global__ void
read_kernel(const uint4 *src, uint64_t words, uint32_t *sink)
{
	uint32_t x = 0;

	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < words;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		uint4 w = __ldcs(src + i);

		x ^= w.x ^ w.y ^ w.z ^ w.w;
	}
	if (x == 0x9e3779b9u) /* practically never: the compiler cannot drop the loads */
		sink[blockIdx.x % 1024u] = x;
}

extern "C" int
kvt_cuda_read_bytes(const void *src, uint64_t len, uint32_t *sink, int n_sm,
		    cudaStream_t stream)
{
	uint64_t words = len / 16;
	unsigned blocks = (unsigned)((n_sm > 0 ? n_sm : 1) * 8);

	if (!src || !sink || len % 16 || (uintptr_t)src % 16)
		return kvt_err(-EINVAL, "read kernel: NULL buffer, or length/address not 16-byte "
			       "aligned");
	if (!words)
		return 0;
	KVT_CUDA_LAUNCH(blocks, 256, 0, stream, read_kernel)((const uint4 *)src, words, sink);
	return kvt_cuda_launched("read");
}
