/* SPDX-License-Identifier: MIT */
/*
 * kernels/quant.cu - int8 / fp8 e4m3 KV quantization with one fp32 scale per group, on the GPU
 * (see kernels/quant.h for the arithmetic, kernels_cuda.h for the launchers). Quantize: one
 * thread block per group (grid-stride over groups): amax by warp shuffles and shared memory,
 * then every element divided by the scale and converted. Dequantize: elementwise, grid-stride.
 * Every operation is exactly rounded (IEEE division, rintf, the hardware's RNE fp8 convert),
 * so the results equal the C reference's bytes.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <stdint.h>

extern "C" {
#include "tiers/base/error.h"
}
#include "kernels/kernels_cuda.h"
#include "kernels/launch_cuda.h"
#include "kernels/quant.h"

#define QUANT_THREADS 256u
#define QUANT_MAX_GRID 65535u

static __device__ __forceinline__ float
quant_ld(const float *p, uint64_t i)
{
	return p[i];
}

static __device__ __forceinline__ float
quant_ld(const __half *p, uint64_t i)
{
	return __half2float(p[i]);
}

static __device__ __forceinline__ float
quant_ld(const __nv_bfloat16 *p, uint64_t i)
{
	return __bfloat162float(p[i]);
}

static __device__ __forceinline__ void
quant_st(float *p, uint64_t i, float x)
{
	p[i] = x;
}

static __device__ __forceinline__ void
quant_st(__half *p, uint64_t i, float x)
{
	p[i] = __float2half_rn(x);
}

static __device__ __forceinline__ void
quant_st(__nv_bfloat16 *p, uint64_t i, float x)
{
	p[i] = __float2bfloat16_rn(x);
}

/* block (QUANT_THREADS) per group: scales[g] and q[g][0..group) */
template <typename T>
__global__ void
quant_kernel(const T *src, uint64_t n_groups, uint32_t group, bool int8, uint8_t *q,
	     float *scales)
{
	__shared__ float warp_max[QUANT_THREADS / 32];
	__shared__ float scale_s;

	for (uint64_t g = blockIdx.x; g < n_groups; g += gridDim.x) {
		const T *x = src + g * group;
		float amax = 0.0f;

		for (uint32_t i = threadIdx.x; i < group; i += blockDim.x)
			amax = fmaxf(amax, fabsf(quant_ld(x, i)));
		for (int off = 16; off > 0; off >>= 1)
			amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
		if ((threadIdx.x & 31u) == 0)
			warp_max[threadIdx.x / 32u] = amax;
		__syncthreads();
		if (threadIdx.x == 0) {
			float m = 0.0f;

			for (uint32_t w = 0; w < blockDim.x / 32u; w++)
				m = fmaxf(m, warp_max[w]);
			scale_s = m / (int8 ? 127.0f : 448.0f);
			scales[g] = scale_s;
		}
		__syncthreads();
		const float scale = scale_s;
		for (uint32_t i = threadIdx.x; i < group; i += blockDim.x) {
			float y = scale > 0.0f ? quant_ld(x, i) / scale : 0.0f;
			uint8_t v;

			if (int8)
				v = (uint8_t)(int8_t)fminf(fmaxf(rintf(y), -127.0f), 127.0f);
			else
				v = (uint8_t)__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3);
			q[g * group + i] = v;
		}
		__syncthreads(); /* scale_s and warp_max are reused by the next group */
	}
}

template <typename T>
__global__ void
dequant_kernel(const uint8_t *q, const float *scales, uint64_t n_groups, uint32_t group,
	       bool int8, T *dst)
{
	const uint64_t n = n_groups * group;

	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		float v;

		if (int8) {
			v = (float)(int8_t)q[i];
		} else {
			__half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)q[i], __NV_E4M3);

			v = __half2float(__half(h));
		}
		quant_st(dst, i, v * scales[i / group]);
	}
}

extern "C" int
kvt_quant_cuda(enum kvt_dtype qt, enum kvt_dtype src_t, const void *src, uint64_t n_groups,
	       uint32_t group, void *q, float *scales, cudaStream_t stream)
{
	int rc = kvt_quant_check("kvt_quant_cuda", qt, src_t, src, q, scales, group);
	const bool int8 = qt == KVT_DTYPE_INT8;
	unsigned grid;

	if (rc || !n_groups)
		return rc;
	grid = (unsigned)(n_groups < QUANT_MAX_GRID ? n_groups : QUANT_MAX_GRID);
	if (src_t == KVT_DTYPE_F32)
		KVT_CUDA_LAUNCH(grid, QUANT_THREADS, 0, stream, quant_kernel<float>)(
			(const float *)src, n_groups, group, int8, (uint8_t *)q, scales);
	else if (src_t == KVT_DTYPE_F16)
		KVT_CUDA_LAUNCH(grid, QUANT_THREADS, 0, stream, quant_kernel<__half>)(
			(const __half *)src, n_groups, group, int8, (uint8_t *)q, scales);
	else
		KVT_CUDA_LAUNCH(grid, QUANT_THREADS, 0, stream, quant_kernel<__nv_bfloat16>)(
			(const __nv_bfloat16 *)src, n_groups, group, int8, (uint8_t *)q, scales);
	return kvt_cuda_launched("quantize");
}

extern "C" int
kvt_dequant_cuda(enum kvt_dtype qt, const void *q, const float *scales, uint64_t n_groups,
		 uint32_t group, enum kvt_dtype dst_t, void *dst, cudaStream_t stream)
{
	int rc = kvt_quant_check("kvt_dequant_cuda", qt, dst_t, q, scales, dst, group);
	const bool int8 = qt == KVT_DTYPE_INT8;
	const uint64_t n = n_groups * group;
	unsigned grid;

	if (rc || !n)
		return rc;
	grid = (unsigned)((n + QUANT_THREADS - 1) / QUANT_THREADS < QUANT_MAX_GRID
				  ? (n + QUANT_THREADS - 1) / QUANT_THREADS : QUANT_MAX_GRID);
	if (dst_t == KVT_DTYPE_F32)
		KVT_CUDA_LAUNCH(grid, QUANT_THREADS, 0, stream, dequant_kernel<float>)(
			(const uint8_t *)q, scales, n_groups, group, int8, (float *)dst);
	else if (dst_t == KVT_DTYPE_F16)
		KVT_CUDA_LAUNCH(grid, QUANT_THREADS, 0, stream, dequant_kernel<__half>)(
			(const uint8_t *)q, scales, n_groups, group, int8, (__half *)dst);
	else
		KVT_CUDA_LAUNCH(grid, QUANT_THREADS, 0, stream, dequant_kernel<__nv_bfloat16>)(
			(const uint8_t *)q, scales, n_groups, group, int8, (__nv_bfloat16 *)dst);
	return kvt_cuda_launched("dequantize");
}
