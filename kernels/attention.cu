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
#include "tiers/base/error.h"
}
#include "kernels/kernels_cuda.h"
#include "kernels/launch_cuda.h"

#define ATTN_MAX_HEAD_DIM 4096u

/* Test knob (kvt_attn_cuda_force_generic): 1 = never take the vectorised kernel. */
static volatile int attn_force_generic;

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
	KVT_EXTERN_SHARED(float, attn_smem);
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

/* ------------------------------------------------------------------------------------------ */
/* The vectorised kernel (the fast path): 16-byte loads, several query heads per KV row read.   */

/* Widen 16 bytes of K/V into VEC = 16 / sizeof(T) floats. */
static __device__ __forceinline__ void
attn_widen(const uint4 &r, float *f, const float *)
{
	f[0] = __uint_as_float(r.x);
	f[1] = __uint_as_float(r.y);
	f[2] = __uint_as_float(r.z);
	f[3] = __uint_as_float(r.w);
}

static __device__ __forceinline__ void
attn_widen(const uint4 &r, float *f, const __half *)
{
	const __half2 *h = (const __half2 *)&r;

	for (int i = 0; i < 4; i++) {
		float2 x = __half22float2(h[i]);

		f[2 * i] = x.x;
		f[2 * i + 1] = x.y;
	}
}

static __device__ __forceinline__ void
attn_widen(const uint4 &r, float *f, const __nv_bfloat16 *)
{
	const __nv_bfloat162 *h = (const __nv_bfloat162 *)&r;

	for (int i = 0; i < 4; i++) {
		float2 x = __bfloat1622float2(h[i]);

		f[2 * i] = x.x;
		f[2 * i + 1] = x.y;
	}
}

/*
 * Queue the loads of position t's 16-byte pieces of K and V for this lane (zeros when the lane
 * has nothing to read: past the window, or past the row).
 */
template <typename T>
static __device__ __forceinline__ void
attn_vec_load(const attn_params &p, uint64_t t, uint64_t t1, bool active, uint64_t row_off,
	      uint4 *k, uint4 *v)
{
	*k = make_uint4(0u, 0u, 0u, 0u);
	*v = *k;
	if (t < t1 && active) {
		/* 32-bit division when positions fit (64-bit division is a long software loop) */
		const uint64_t blk = t1 <= 0xffffffffu ? (uint32_t)t / p.tokens_per_block
						      : t / p.tokens_per_block;
		const uint64_t slot = p.table[blk];
		const char *row = p.k_base + slot * p.block_stride +
				  (t - blk * p.tokens_per_block) * p.token_stride + row_off;

		*k = __ldg((const uint4 *)row);
		*v = __ldg((const uint4 *)(row + p.v_offset));
	}
}

/*
 * One position for HG query heads: scores from this lane's VEC elements summed over the gp lanes
 * of its group (xor shuffles below gp stay inside the group), then the online-softmax update.
 * Every lane of the warp calls it (the shuffles need all 32); lanes whose position is past the
 * window (t >= t1, uniform within a group) update nothing.
 */
template <typename T, int HG>
static __device__ __forceinline__ void
attn_vec_step(const attn_params &p, uint32_t gp, bool live, const uint4 &kr, const uint4 &vr,
	      const float (*q)[16 / sizeof(T)], float (*acc)[16 / sizeof(T)], float *m, float *l)
{
	constexpr int VEC = 16 / sizeof(T);
	float kf[VEC], vf[VEC];

	attn_widen(kr, kf, (const T *)0);
	attn_widen(vr, vf, (const T *)0);
#pragma unroll
	for (int j = 0; j < HG; j++) {
		float dot = 0.0f;

#pragma unroll
		for (int e = 0; e < VEC; e++)
			dot += q[j][e] * kf[e];
		for (uint32_t off = gp >> 1; off > 0; off >>= 1)
			dot += __shfl_xor_sync(0xffffffffu, dot, off);
		if (live) {
			float s = dot / p.sqrt_d;
			float mn = fmaxf(m[j], s);
			float alpha = expf(m[j] - mn); /* 0 for the first position (m = -inf) */
			float ex = expf(s - mn);

			l[j] = l[j] * alpha + ex;
#pragma unroll
			for (int e = 0; e < VEC; e++)
				acc[j][e] = acc[j][e] * alpha + ex * vf[e];
			m[j] = mn;
		}
	}
}

/*
 * grid (n_heads / HG, n_windows), block 32 * nwarps threads (nwarps <= 8), dynamic shared
 * memory nwarps * HG * (head_dim + 2) floats. Block (g, s) computes the partials of query heads
 * g*HG .. g*HG + HG - 1 (all reading one KV head) over window s. A position's row of one KV head
 * is head_dim * sizeof(T) bytes = G 16-byte pieces (G <= 32); gp = G rounded up to a power of
 * two lanes read one position (lane i of the group the i-th piece), so a warp reads 32 / gp
 * positions at once, two rounds of loads in flight per lane. Each lane keeps its VEC elements of
 * q, and its own online-softmax state (m, l, acc) for each head in registers; the states are
 * merged across the warp's groups with shuffles, then across warps in shared memory.
 */
template <typename T, int HG>
__global__ void __launch_bounds__(256)
attn_vec_kernel(attn_params p, uint32_t gp)
{
	constexpr int VEC = 16 / sizeof(T);
	KVT_EXTERN_SHARED(float, attn_vsmem);
	const uint32_t d = p.head_dim, nwarps = blockDim.x / 32u, warp = threadIdx.x / 32u;
	const uint32_t lane = threadIdx.x & 31u, sub = lane / gp, gl = lane % gp;
	const uint32_t npos = 32u / gp, h0 = blockIdx.x * HG, s = blockIdx.y;
	const bool active = gl * VEC < d;
	const uint64_t row_off = ((uint64_t)(h0 / p.kv_mul) * d + gl * VEC) * sizeof(T);
	const uint64_t t0 = p.t_begin + (uint64_t)s * p.chunk;
	const uint64_t t1 = t0 + p.chunk < p.t_end ? t0 + p.chunk : p.t_end;
	const uint64_t stride = (uint64_t)nwarps * npos;
	float q[HG][VEC], acc[HG][VEC], m[HG], l[HG];

#pragma unroll
	for (int j = 0; j < HG; j++) {
		m[j] = -INFINITY;
		l[j] = 0.0f;
#pragma unroll
		for (int e = 0; e < VEC; e++) {
			q[j][e] = active ? p.q[(size_t)(h0 + j) * d + gl * VEC + e] : 0.0f;
			acc[j][e] = 0.0f;
		}
	}
	/* warp-uniform loop: every lane runs every round, so the shuffles see all 32 lanes */
	for (uint64_t tb = t0 + (uint64_t)warp * npos; tb < t1; tb += 2 * stride) {
		const uint64_t ta = tb + sub, tc = tb + stride + sub;
		uint4 ka, va, kc, vc;

		attn_vec_load<T>(p, ta, t1, active, row_off, &ka, &va);
		attn_vec_load<T>(p, tc, t1, active, row_off, &kc, &vc);
		attn_vec_step<T, HG>(p, gp, ta < t1, ka, va, q, acc, m, l);
		attn_vec_step<T, HG>(p, gp, tc < t1, kc, vc, q, acc, m, l);
	}
	/* merge the warp's position groups: lanes gl, gl + gp, ... hold the same elements */
	for (uint32_t off = gp; off < 32u; off <<= 1) {
#pragma unroll
		for (int j = 0; j < HG; j++) {
			float mo = __shfl_xor_sync(0xffffffffu, m[j], off);
			float lo = __shfl_xor_sync(0xffffffffu, l[j], off);
			float mn = fmaxf(m[j], mo);
			float sa = attn_scale(m[j], mn), sb = attn_scale(mo, mn);

			l[j] = l[j] * sa + lo * sb;
#pragma unroll
			for (int e = 0; e < VEC; e++) {
				float ao = __shfl_xor_sync(0xffffffffu, acc[j][e], off);

				acc[j][e] = acc[j][e] * sa + ao * sb;
			}
			m[j] = mn;
		}
	}
	float *sacc = attn_vsmem, *sm = sacc + (size_t)nwarps * HG * d, *sl = sm + nwarps * HG;
	if (sub == 0 && active) {
#pragma unroll
		for (int j = 0; j < HG; j++) {
#pragma unroll
			for (int e = 0; e < VEC; e++)
				sacc[((size_t)warp * HG + j) * d + gl * VEC + e] = acc[j][e];
		}
	}
	if (lane == 0) {
#pragma unroll
		for (int j = 0; j < HG; j++) {
			sm[warp * HG + j] = m[j];
			sl[warp * HG + j] = l[j];
		}
	}
	__syncthreads();
	/* merge the warps: element i of head h0 + j */
	for (uint32_t x = threadIdx.x; x < HG * d; x += blockDim.x) {
		const uint32_t j = x / d, i = x % d;
		float mx = -INFINITY, lsum = 0.0f, o = 0.0f;

		for (uint32_t w = 0; w < nwarps; w++)
			mx = fmaxf(mx, sm[w * HG + j]);
		for (uint32_t w = 0; w < nwarps; w++) {
			float sc = attn_scale(sm[w * HG + j], mx);

			lsum += sl[w * HG + j] * sc;
			o += sacc[((size_t)w * HG + j) * d + i] * sc;
		}
		p.o[((size_t)s * p.n_heads + h0 + j) * d + i] = o / lsum;
		if (i == 0 && p.m) {
			p.m[(size_t)s * p.n_heads + h0 + j] = mx;
			p.l[(size_t)s * p.n_heads + h0 + j] = lsum;
		}
	}
}

/* grid n_heads, block 128: out[h] = merge of the n_windows partials of head h; with m_out and
 * l_out (a split partial), also the merged window's max score and denominator. */
__global__ void
attn_merge_kernel(const float *o, const float *m, const float *l, uint32_t n_windows,
		  uint32_t n_heads, uint32_t d, float *out, float *m_out, float *l_out)
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
	if (m_out && threadIdx.x == 0) {
		m_out[h] = mx;
		l_out[h] = lsum;
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

static int attn_cuda_launch_generic(enum kvt_dtype dtype, const attn_params &p,
				    uint32_t n_windows, cudaStream_t stream);

/* Heads per block of the vectorised kernel: the largest of 4, 2, 1 dividing kv_mul. */
static uint32_t
attn_vec_heads(uint32_t kv_mul)
{
	return kv_mul % 4 == 0 ? 4 : kv_mul % 2 == 0 ? 2 : 1;
}

/*
 * Whether the vectorised kernel applies: a KV row is a whole number of 16-byte pieces, at most
 * 32 of them (head_dim <= 256 for fp16/bf16, <= 128 for fp32), and every address it forms is
 * 16-byte aligned.
 */
static bool
attn_vec_ok(const attn_params &p, uint64_t esize)
{
	const uint64_t row = (uint64_t)p.head_dim * esize;

	return row % 16 == 0 && row / 16 <= 32 &&
	       ((uintptr_t)p.k_base | p.v_offset | p.block_stride | p.token_stride) % 16 == 0;
}

template <typename T>
static void
attn_vec_launch(const attn_params &p, uint32_t n_windows, cudaStream_t stream)
{
	const uint32_t g = p.head_dim * (uint32_t)sizeof(T) / 16u, hg = attn_vec_heads(p.kv_mul);
	uint32_t gp = 1;

	while (gp < g)
		gp <<= 1;
	/* 8 warps, or 4 when the shared state would pass 32 KiB (hg * d > 1024) */
	const uint32_t nwarps = hg * p.head_dim <= 1024u ? 8u : 4u;
	const size_t smem = (size_t)nwarps * hg * (p.head_dim + 2u) * sizeof(float);
	dim3 grid(p.n_heads / hg, n_windows), block(32u * nwarps);

	if (hg == 4)
		KVT_CUDA_LAUNCH(grid, block, smem, stream, attn_vec_kernel<T, 4>)(p, gp);
	else if (hg == 2)
		KVT_CUDA_LAUNCH(grid, block, smem, stream, attn_vec_kernel<T, 2>)(p, gp);
	else
		KVT_CUDA_LAUNCH(grid, block, smem, stream, attn_vec_kernel<T, 1>)(p, gp);
}

/* Launch the partials of n_windows windows for the dtype; returns 0 or KVT_EDEVICE. */
static int
attn_cuda_launch_split(enum kvt_dtype dtype, const attn_params &p, uint32_t n_windows,
		       cudaStream_t stream)
{
	const uint64_t esize = dtype == KVT_DTYPE_F32 ? 4 : 2;

	if (attn_vec_ok(p, esize) && !attn_force_generic) {
		if (dtype == KVT_DTYPE_F32)
			attn_vec_launch<float>(p, n_windows, stream);
		else if (dtype == KVT_DTYPE_F16)
			attn_vec_launch<__half>(p, n_windows, stream);
		else
			attn_vec_launch<__nv_bfloat16>(p, n_windows, stream);
		return kvt_cuda_launched("attention");
	}
	return attn_cuda_launch_generic(dtype, p, n_windows, stream);
}

/* The generic kernel: any head_dim up to 4096, any element-aligned addresses. */
static int
attn_cuda_launch_generic(enum kvt_dtype dtype, const attn_params &p, uint32_t n_windows,
			 cudaStream_t stream)
{
	const uint32_t d = p.head_dim;
	const uint32_t nwarps = d <= 1024 ? 4 : d <= 2048 ? 2 : 1; /* keeps smem <= 32 KiB */
	const size_t smem = ((size_t)d * (1 + nwarps) + 2 * nwarps) * sizeof(float);
	dim3 grid(p.n_heads, n_windows), block(32 * nwarps);

	if (dtype == KVT_DTYPE_F32)
		KVT_CUDA_LAUNCH(grid, block, smem, stream, attn_split_kernel<float>)(p);
	else if (dtype == KVT_DTYPE_F16)
		KVT_CUDA_LAUNCH(grid, block, smem, stream, attn_split_kernel<__half>)(p);
	else
		KVT_CUDA_LAUNCH(grid, block, smem, stream, attn_split_kernel<__nv_bfloat16>)(p);
	return kvt_cuda_launched("attention split");
}

extern "C" void
kvt_attn_cuda_force_generic(int on)
{
	attn_force_generic = on != 0;
}

extern "C" uint32_t
kvt_attn_cuda_splits(uint32_t n_heads, uint32_t n_kv_heads, uint64_t seq_len, int n_sm)
{
	uint32_t kv_mul = n_kv_heads && n_heads % n_kv_heads == 0 ? n_heads / n_kv_heads : 1;
	uint64_t blocks_per_win = n_heads ? (n_heads + attn_vec_heads(kv_mul) - 1) /
						    attn_vec_heads(kv_mul) : 1;
	uint64_t want = ((uint64_t)(n_sm > 0 ? n_sm : 1) * 4 + blocks_per_win - 1) /
			blocks_per_win;
	uint64_t most = (seq_len + 255) / 256; /* windows of >= 256 positions */

	if (want > most)
		want = most;
	if (want < 1)
		want = 1;
	if (want > KVT_ATTN_CUDA_MAX_SPLITS)
		want = KVT_ATTN_CUDA_MAX_SPLITS;
	return (uint32_t)want;
}

extern "C" size_t
kvt_attn_cuda_work_floats(uint32_t n_heads, uint32_t head_dim, uint32_t n_splits)
{
	if (n_splits <= 1)
		return 0;
	return (size_t)n_splits * n_heads * ((size_t)head_dim + 2);
}

/*
 * After attn_cuda_check: [p.t_begin, p.t_end) in n_splits windows (fewer when short, never an
 * empty one), each reduced by attn_split_kernel; one window writes out (and m, l) directly, more
 * are merged from @work by attn_merge_kernel, which also writes m and l when given (a partial).
 */
static int
attn_cuda_run(enum kvt_dtype dtype, attn_params p, uint32_t n_splits, float *work, float *out,
	      float *m, float *l, cudaStream_t stream)
{
	const uint64_t len = p.t_end - p.t_begin;
	uint64_t n_win;
	int rc;

	if (!n_splits || n_splits > KVT_ATTN_CUDA_MAX_SPLITS)
		return kvt_err(-EINVAL, "attention (cuda): n_splits %u not in 1..%u", n_splits,
			       KVT_ATTN_CUDA_MAX_SPLITS);
	if (n_splits > 1 && !work)
		return kvt_err(-EINVAL, "attention (cuda): NULL work with %u splits", n_splits);
	p.chunk = (len + n_splits - 1) / n_splits;
	n_win = (len + p.chunk - 1) / p.chunk; /* <= n_splits, no empty window */
	if (n_win == 1) {
		p.o = out;
		p.m = m;
		p.l = l;
		return attn_cuda_launch_split(dtype, p, 1, stream);
	}
	/* work layout (within the n_splits-sized buffer): o [n_win][H][d], m [n_win][H], l */
	p.o = work;
	p.m = work + n_win * p.n_heads * p.head_dim;
	p.l = p.m + n_win * p.n_heads;
	rc = attn_cuda_launch_split(dtype, p, (uint32_t)n_win, stream);
	if (rc)
		return rc;
	KVT_CUDA_LAUNCH(p.n_heads, 128, 0, stream, attn_merge_kernel)(
		p.o, p.m, p.l, (uint32_t)n_win, p.n_heads, p.head_dim, out, m, l);
	return kvt_cuda_launched("attention merge");
}

extern "C" int
kvt_attn_decode_cuda(const struct kvt_paged_kv *kv, const float *q, uint32_t n_heads,
		     uint64_t seq_len, uint32_t n_splits, float *work, float *out,
		     cudaStream_t stream)
{
	attn_params p;
	int rc;

	rc = attn_cuda_check(kv, q, n_heads, 0, seq_len, out, &p);
	if (rc)
		return rc;
	return attn_cuda_run(kv->dtype, p, n_splits, work, out, NULL, NULL, stream);
}

extern "C" int
kvt_attn_partial_cuda(const struct kvt_paged_kv *kv, const float *q, uint32_t n_heads,
		      uint64_t t0, uint64_t t1, float *out, float *m, float *l,
		      cudaStream_t stream)
{
	return kvt_attn_partial_split_cuda(kv, q, n_heads, t0, t1, 1, NULL, out, m, l, stream);
}

extern "C" int
kvt_attn_partial_split_cuda(const struct kvt_paged_kv *kv, const float *q, uint32_t n_heads,
			    uint64_t t0, uint64_t t1, uint32_t n_splits, float *work, float *out,
			    float *m, float *l, cudaStream_t stream)
{
	attn_params p;
	int rc;

	rc = attn_cuda_check(kv, q, n_heads, t0, t1, out, &p);
	if (rc)
		return rc;
	if (!m || !l)
		return kvt_err(-EINVAL, "attention (cuda): NULL m or l");
	return attn_cuda_run(kv->dtype, p, n_splits, work, out, m, l, stream);
}
