/* SPDX-License-Identifier: MIT */
/*
 * kernels/attention.cu - paged decode attention on the GPU (see kernels_cuda.h, attention.h).
 *
 * Split-KV (FlashDecoding): the positions [t_begin, t_end) are cut into windows of `chunk`
 * positions; thread block (h, s) of attn_split_kernel reduces window s of query head h to a
 * partial (o normalised, m max score, l = sum exp(score - m)). Inside a block, warp w takes the
 * positions t_begin + s*chunk + w, + nwarps, ... and keeps its own online-softmax state (running
 * max m_w, denominator l_w, unnormalised accumulator acc_w[head_dim] in shared memory, each
 * element owned by one lane); the warps' states are then merged with the log-sum-exp rule. With
 * more than one window, attn_merge_kernel merges the windows' partials of each head the same
 * way. All arithmetic is fp32; K/V elements are widened on load.
 *
 * Memory: each position's K row (head_dim contiguous elements of one KV head) is read by one
 * warp, lanes striding by one element, so a warp's loads are coalesced within the row.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "error.h"
}
#include "kernels/kernels_cuda.h"

#define ATTN_MAX_HEAD_DIM 4096u

/* Everything a split kernel needs; passed by value. */
struct attn_params {
	const char *k_base;       /* layer's K of slot 0 (device) */
	uint64_t v_offset;        /* V = K + v_offset, bytes */
	uint64_t block_stride;    /* bytes between slots */
	uint64_t token_stride;    /* bytes between tokens of a slot */
	const uint32_t *table;    /* device [ceil(t_end / tokens_per_block)] slot ids */
	const float *q;           /* device [n_heads][head_dim] */
	float *o;                 /* device [n_windows][n_heads][head_dim] normalised partials */
	float *m;                 /* device [n_windows][n_heads] max scores, or NULL */
	float *l;                 /* device [n_windows][n_heads] denominators, or NULL */
	uint64_t t_begin;         /* first position */
	uint64_t t_end;           /* one past the last position */
	uint64_t chunk;           /* positions per window */
	uint32_t tokens_per_block; /* tokens per slot */
	uint32_t n_heads;         /* query heads */
	uint32_t kv_mul;          /* query heads per KV head */
	uint32_t head_dim;        /* elements per head */
	float sqrt_d;             /* sqrtf(head_dim); scores are divided by it, as in the ref */
};

static __device__ __forceinline__ float
attn_ld(const float *p)
{
	return *p;
}

static __device__ __forceinline__ float
attn_ld(const __half *p)
{
	return __half2float(*p);
}

static __device__ __forceinline__ float
attn_ld(const __nv_bfloat16 *p)
{
	return __bfloat162float(*p);
}

static __device__ __forceinline__ float
attn_warp_sum(float x)
{
	/* butterfly: every lane ends with the same value (fp addition is commutative) */
	for (int off = 16; off > 0; off >>= 1)
		x += __shfl_xor_sync(0xffffffffu, x, off);
	return x;
}

/*
 * Scale of a state with max m relative to the overall max mx: e^(m - mx), 0 for an empty state
 * (m = -inf, which would otherwise give e^(-inf - -inf) = NaN). A NaN score still propagates.
 */
static __device__ __forceinline__ float
attn_scale(float m, float mx)
{
	return m == -INFINITY ? 0.0f : expf(m - mx);
}

/* One warp's online softmax over its positions of the window [t0, t1). */
template <typename T>
static __device__ void
attn_warp_window(const attn_params &p, const float *qs, float *acc, uint32_t kvh, uint64_t t0,
		 uint64_t t1, uint32_t warp, uint32_t nwarps, float *m_out, float *l_out)
{
	const uint32_t lane = threadIdx.x & 31u, d = p.head_dim;
	float m = -INFINITY, l = 0.0f;

	for (uint64_t t = t0 + warp; t < t1; t += nwarps) {
		const uint64_t slot = p.table[t / p.tokens_per_block];
		const char *row = p.k_base + slot * p.block_stride +
				  (t % p.tokens_per_block) * p.token_stride +
				  (uint64_t)kvh * d * sizeof(T);
		const T *k = (const T *)row;
		const T *v = (const T *)(row + p.v_offset);
		float dot = 0.0f;

		for (uint32_t i = lane; i < d; i += 32)
			dot += qs[i] * attn_ld(k + i);
		float s = attn_warp_sum(dot) / p.sqrt_d;
		float mn = fmaxf(m, s);
		float alpha = expf(m - mn); /* 0 for the first position (m = -inf) */
		float e = expf(s - mn);

		l = l * alpha + e;
		for (uint32_t i = lane; i < d; i += 32)
			acc[i] = acc[i] * alpha + e * attn_ld(v + i);
		m = mn;
	}
	*m_out = m;
	*l_out = l;
}

/*
 * grid (n_heads, n_windows), block 32 * nwarps threads, dynamic shared memory
 * (head_dim * (1 + nwarps) + 2 * nwarps) floats: q, the warps' accumulators, their m and l.
 */
template <typename T>
__global__ void
attn_split_kernel(attn_params p)
{
	extern __shared__ float attn_smem[];
	const uint32_t h = blockIdx.x, s = blockIdx.y, d = p.head_dim;
	const uint32_t nwarps = blockDim.x / 32u, warp = threadIdx.x / 32u;
	float *qs = attn_smem, *acc = qs + d, *wm = acc + (size_t)nwarps * d, *wl = wm + nwarps;
	const uint64_t t0 = p.t_begin + (uint64_t)s * p.chunk;
	const uint64_t t1 = t0 + p.chunk < p.t_end ? t0 + p.chunk : p.t_end;
	float m, l;

	for (uint32_t i = threadIdx.x; i < d; i += blockDim.x)
		qs[i] = p.q[(size_t)h * d + i];
	for (uint32_t i = threadIdx.x; i < nwarps * d; i += blockDim.x)
		acc[i] = 0.0f;
	__syncthreads();
	attn_warp_window<T>(p, qs, acc + (size_t)warp * d, h / p.kv_mul, t0, t1, warp, nwarps, &m,
			    &l);
	if ((threadIdx.x & 31u) == 0) {
		wm[warp] = m;
		wl[warp] = l;
	}
	__syncthreads();

	float mx = -INFINITY, lsum = 0.0f;
	for (uint32_t w = 0; w < nwarps; w++)
		mx = fmaxf(mx, wm[w]);
	for (uint32_t w = 0; w < nwarps; w++)
		lsum += wl[w] * attn_scale(wm[w], mx);
	float *o = p.o + ((size_t)s * p.n_heads + h) * d;
	for (uint32_t i = threadIdx.x; i < d; i += blockDim.x) {
		float x = 0.0f;
		for (uint32_t w = 0; w < nwarps; w++)
			x += acc[(size_t)w * d + i] * attn_scale(wm[w], mx);
		o[i] = x / lsum;
	}
	if (threadIdx.x == 0 && p.m) {
		p.m[(size_t)s * p.n_heads + h] = mx;
		p.l[(size_t)s * p.n_heads + h] = lsum;
	}
}

/* grid n_heads, block 128: out[h] = merge of the n_windows partials of head h. */
__global__ void
attn_merge_kernel(const float *o, const float *m, const float *l, uint32_t n_windows,
		  uint32_t n_heads, uint32_t d, float *out)
{
	const uint32_t h = blockIdx.x;
	float mx = -INFINITY, lsum = 0.0f;

	for (uint32_t s = 0; s < n_windows; s++)
		mx = fmaxf(mx, m[(size_t)s * n_heads + h]);
	for (uint32_t s = 0; s < n_windows; s++)
		lsum += l[(size_t)s * n_heads + h] * attn_scale(m[(size_t)s * n_heads + h], mx);
	for (uint32_t i = threadIdx.x; i < d; i += blockDim.x) {
		float x = 0.0f;
		for (uint32_t s = 0; s < n_windows; s++) {
			size_t sh = (size_t)s * n_heads + h;
			x += o[sh * d + i] * (l[sh] * attn_scale(m[sh], mx));
		}
		out[(size_t)h * d + i] = x / lsum;
	}
}

/* Host-side argument checks shared by the launchers; fills the common part of *p. */
static int
attn_cuda_check(const struct kvt_paged_kv *kv, const float *q, uint32_t n_heads, uint64_t t0,
		uint64_t t1, const float *out, attn_params *p)
{
	uint64_t esize;

	if (!kv || !q || !out || !kv->k_base || !kv->table)
		return kvt_err(-EINVAL, "attention (cuda): NULL kv, q, out, k_base or table");
	switch (kv->dtype) {
	case KVT_DTYPE_F32: esize = 4; break;
	case KVT_DTYPE_F16: esize = 2; break;
	case KVT_DTYPE_BF16: esize = 2; break;
	default: return kvt_err(-EINVAL, "attention (cuda): unsupported dtype %d", (int)kv->dtype);
	}
	if (!n_heads || !kv->n_kv_heads || n_heads % kv->n_kv_heads)
		return kvt_err(-EINVAL,
			       "attention (cuda): n_heads %u must be a positive multiple of "
			       "n_kv_heads %u", n_heads, kv->n_kv_heads);
	if (!kv->head_dim || kv->head_dim > ATTN_MAX_HEAD_DIM || !kv->tokens_per_block)
		return kvt_err(-EINVAL,
			       "attention (cuda): head_dim %u (1..%u), tokens_per_block %u (> 0)",
			       kv->head_dim, ATTN_MAX_HEAD_DIM, kv->tokens_per_block);
	if (kv->token_stride < (uint64_t)kv->n_kv_heads * kv->head_dim * esize)
		return kvt_err(-EINVAL, "attention (cuda): token_stride %llu < one token's K",
			       (unsigned long long)kv->token_stride);
	if (((uintptr_t)kv->k_base | kv->v_offset | kv->block_stride | kv->token_stride) % esize)
		return kvt_err(-EINVAL, "attention (cuda): K/V base or strides not aligned to %llu",
			       (unsigned long long)esize);
	if (t0 >= t1)
		return kvt_err(-EINVAL, "attention (cuda): empty window [%llu, %llu)",
			       (unsigned long long)t0, (unsigned long long)t1);
	p->k_base = (const char *)kv->k_base;
	p->v_offset = kv->v_offset;
	p->block_stride = kv->block_stride;
	p->token_stride = kv->token_stride;
	p->table = kv->table;
	p->q = q;
	p->t_begin = t0;
	p->t_end = t1;
	p->tokens_per_block = kv->tokens_per_block;
	p->n_heads = n_heads;
	p->kv_mul = n_heads / kv->n_kv_heads;
	p->head_dim = kv->head_dim;
	p->sqrt_d = sqrtf((float)kv->head_dim);
	return 0;
}

/* Launch attn_split_kernel over n_windows windows for the dtype; returns 0 or KVT_EDEVICE. */
static int
attn_cuda_launch_split(enum kvt_dtype dtype, const attn_params &p, uint32_t n_windows,
		       cudaStream_t stream)
{
	const uint32_t d = p.head_dim;
	const uint32_t nwarps = d <= 1024 ? 4 : d <= 2048 ? 2 : 1; /* keeps smem <= 32 KiB */
	const size_t smem = ((size_t)d * (1 + nwarps) + 2 * nwarps) * sizeof(float);
	dim3 grid(p.n_heads, n_windows), block(32 * nwarps);

	if (dtype == KVT_DTYPE_F32)
		attn_split_kernel<float><<<grid, block, smem, stream>>>(p);
	else if (dtype == KVT_DTYPE_F16)
		attn_split_kernel<__half><<<grid, block, smem, stream>>>(p);
	else
		attn_split_kernel<__nv_bfloat16><<<grid, block, smem, stream>>>(p);
	cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess)
		return kvt_err(KVT_EDEVICE, "attention split kernel launch: %s",
			       cudaGetErrorString(e));
	return 0;
}

extern "C" size_t
kvt_attn_cuda_work_floats(uint32_t n_heads, uint32_t head_dim, uint32_t n_splits)
{
	if (n_splits <= 1)
		return 0;
	return (size_t)n_splits * n_heads * ((size_t)head_dim + 2);
}

extern "C" int
kvt_attn_decode_cuda(const struct kvt_paged_kv *kv, const float *q, uint32_t n_heads,
		     uint64_t seq_len, uint32_t n_splits, float *work, float *out,
		     cudaStream_t stream)
{
	attn_params p;
	uint64_t n_win;
	int rc;

	rc = attn_cuda_check(kv, q, n_heads, 0, seq_len, out, &p);
	if (rc)
		return rc;
	if (!n_splits || n_splits > KVT_ATTN_CUDA_MAX_SPLITS)
		return kvt_err(-EINVAL, "attention (cuda): n_splits %u not in 1..%u", n_splits,
			       KVT_ATTN_CUDA_MAX_SPLITS);
	if (n_splits > 1 && !work)
		return kvt_err(-EINVAL, "attention (cuda): NULL work with %u splits", n_splits);
	p.chunk = (seq_len + n_splits - 1) / n_splits;
	n_win = (seq_len + p.chunk - 1) / p.chunk; /* <= n_splits, no empty window */
	if (n_win == 1) {
		p.o = out;
		p.m = NULL;
		p.l = NULL;
		return attn_cuda_launch_split(kv->dtype, p, 1, stream);
	}
	/* work layout (within the n_splits-sized buffer): o [n_win][H][d], m [n_win][H], l */
	p.o = work;
	p.m = work + n_win * n_heads * kv->head_dim;
	p.l = p.m + n_win * n_heads;
	rc = attn_cuda_launch_split(kv->dtype, p, (uint32_t)n_win, stream);
	if (rc)
		return rc;
	attn_merge_kernel<<<n_heads, 128, 0, stream>>>(p.o, p.m, p.l, (uint32_t)n_win, n_heads,
						       kv->head_dim, out);
	cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess)
		return kvt_err(KVT_EDEVICE, "attention merge kernel launch: %s",
			       cudaGetErrorString(e));
	return 0;
}

extern "C" int
kvt_attn_partial_cuda(const struct kvt_paged_kv *kv, const float *q, uint32_t n_heads,
		      uint64_t t0, uint64_t t1, float *out, float *m, float *l,
		      cudaStream_t stream)
{
	attn_params p;
	int rc;

	rc = attn_cuda_check(kv, q, n_heads, t0, t1, out, &p);
	if (rc)
		return rc;
	if (!m || !l)
		return kvt_err(-EINVAL, "attention (cuda): NULL m or l");
	p.chunk = t1 - t0;
	p.o = out;
	p.m = m;
	p.l = l;
	return attn_cuda_launch_split(kv->dtype, p, 1, stream);
}
