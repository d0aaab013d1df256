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
 *
 * Window and sinks (attention.h): the host turns the range attended into the visible positions,
 * at most two runs [a0, a0 + na) (sinks) and [b0, ...) (window); the kernels split the n
 * visible positions as one run of "virtual" indices v (v < na: position a0 + v, else b0 + v -
 * na), so only visible rows and table entries are read and the splits stay balanced. With block
 * positions (pos) each thread finds the table entries of blocks a0 / tpb and b0 / tpb once by
 * binary search; the blocks of each run follow them entry by entry (the contract: every block
 * holding a visible position is listed, pos strictly ascending).
 *
 * MLA latent (attn_lat_kernel, absorbed form of attention.h): thread block (g, s) takes up to HG
 * query heads over window s; tiles of TT latent rows are widened into shared memory once and
 * serve all HG heads (the rows are shared by every head, as in MQA): scores by warps (one
 * (head, row) dot per warp and step), an online-softmax update per head, then the accumulators
 * acc[HG][rank] (shared memory, one element per thread and step) are rescaled and updated.
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
	uint32_t head_dim;        /* elements per head (latent: kv_lora_rank) */
	float sqrt_d;             /* sqrtf(head_dim); scores are divided by it, as in the ref */
	/* visible positions: t_begin/t_end above are virtual indices into these runs */
	uint64_t a0, na;          /* run A: positions a0 .. a0 + na - 1 */
	uint64_t b0;              /* run B: virtual v >= na is position b0 + (v - na) */
	uint64_t pos_end;         /* one past the last position read */
	const uint32_t *pos;      /* device [n_entries] block positions, or NULL (dense table) */
	uint32_t n_entries;
	/* latent only */
	const float *q_pe;        /* device [n_heads][rope_dim], or NULL */
	uint32_t rope_dim;
	float scale;              /* scores are multiplied by it */
};

/* First entry of pos[0..n) (ascending) that is >= blk. */
static __device__ uint32_t
attn_lower_bound(const uint32_t *pos, uint32_t n, uint64_t blk)
{
	uint32_t lo = 0, hi = n;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (pos[mid] < blk)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Table entries of the first blocks of the two runs (block positions only). */
struct attn_map {
	uint64_t ablk, bblk;      /* a0 / tpb, b0 / tpb */
	uint32_t ea, eb;          /* their entries */
};

static __device__ __forceinline__ attn_map
attn_map_make(const attn_params &p)
{
	attn_map mp;

	mp.ablk = p.a0 / p.tokens_per_block;
	mp.bblk = p.b0 / p.tokens_per_block;
	mp.ea = p.pos && p.na ? attn_lower_bound(p.pos, p.n_entries, mp.ablk) : 0;
	mp.eb = p.pos ? attn_lower_bound(p.pos, p.n_entries, mp.bblk) : 0;
	return mp;
}

/* Position of virtual index v. */
static __device__ __forceinline__ uint64_t
attn_pos_of(const attn_params &p, uint64_t v)
{
	return v < p.na ? p.a0 + v : p.b0 + (v - p.na);
}

/* Slot of block blk (which holds a visible position). */
static __device__ __forceinline__ uint64_t
attn_slot(const attn_params &p, const attn_map &mp, uint64_t blk)
{
	if (!p.pos)
		return p.table[blk];
	return p.table[blk >= mp.bblk ? mp.eb + (blk - mp.bblk) : mp.ea + (blk - mp.ablk)];
}

/* Address of visible position t's row (K of KV head 0; the latent vector). */
static __device__ __forceinline__ const char *
attn_row(const attn_params &p, const attn_map &mp, uint64_t t)
{
	const uint64_t blk = p.pos_end <= 0xffffffffu ? (uint32_t)t / p.tokens_per_block
						      : t / p.tokens_per_block;

	return p.k_base + attn_slot(p, mp, blk) * p.block_stride +
	       (t - blk * p.tokens_per_block) * p.token_stride;
}

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
attn_warp_window(const attn_params &p, const attn_map &mp, const float *qs, float *acc,
		 uint32_t kvh, uint64_t t0, uint64_t t1, uint32_t warp, uint32_t nwarps,
		 float *m_out, float *l_out)
{
	const uint32_t lane = threadIdx.x & 31u, d = p.head_dim;
	float m = -INFINITY, l = 0.0f;

	for (uint64_t vi = t0 + warp; vi < t1; vi += nwarps) {
		const char *row = attn_row(p, mp, attn_pos_of(p, vi)) + (uint64_t)kvh * d * sizeof(T);
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
	const attn_map mp = attn_map_make(p);
	float m, l;

	for (uint32_t i = threadIdx.x; i < d; i += blockDim.x)
		qs[i] = p.q[(size_t)h * d + i];
	for (uint32_t i = threadIdx.x; i < nwarps * d; i += blockDim.x)
		acc[i] = 0.0f;
	__syncthreads();
	attn_warp_window<T>(p, mp, qs, acc + (size_t)warp * d, h / p.kv_mul, t0, t1, warp, nwarps,
			    &m, &l);
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
attn_vec_load(const attn_params &p, const attn_map &mp, uint64_t t, uint64_t t1, bool active,
	      uint64_t row_off, uint4 *k, uint4 *v)
{
	*k = make_uint4(0u, 0u, 0u, 0u);
	*v = *k;
	if (t < t1 && active) {
		/* attn_row: 32-bit division when positions fit (64-bit is a long software loop) */
		const char *row = attn_row(p, mp, attn_pos_of(p, t)) + row_off;

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
	const attn_map mp = attn_map_make(p);
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

		attn_vec_load<T>(p, mp, ta, t1, active, row_off, &ka, &va);
		attn_vec_load<T>(p, mp, tc, t1, active, row_off, &kc, &vc);
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

/* grid n_heads, block 128: an empty partial (no visible position): out 0, m -inf, l 0. */
__global__ void
attn_empty_kernel(uint32_t d, float *out, float *m, float *l)
{
	const uint32_t h = blockIdx.x;

	for (uint32_t i = threadIdx.x; i < d; i += blockDim.x)
		out[(size_t)h * d + i] = 0.0f;
	if (threadIdx.x == 0) {
		m[h] = -INFINITY;
		l[h] = 0.0f;
	}
}

/*
 * The visible positions of [t0, t1) (attention.h; the same computation as attention_ref.c's
 * attn_pg_visible) into p's runs; p->t_begin = 0, p->t_end = their count (0: none visible).
 * @field: the struct's seq_len (0 = t1); @decode: a decode call (t1 is its seq_len).
 * Returns 0 or -EINVAL.
 */
static int
attn_cuda_visible(uint64_t field, uint64_t window, uint64_t sink, const uint32_t *pos,
		  uint32_t n_entries, uint64_t t0, uint64_t t1, int decode, attn_params *p)
{
	uint64_t q, lo = 0, s_end, a1, b0;

	if (t0 >= t1)
		return kvt_err(-EINVAL, "attention (cuda): empty window [%llu, %llu)",
			       (unsigned long long)t0, (unsigned long long)t1);
	if (decode && field && field != t1)
		return kvt_err(-EINVAL, "attention (cuda): kv->seq_len %llu differs from seq_len "
			       "%llu", (unsigned long long)field, (unsigned long long)t1);
	if (field && t1 > field)
		return kvt_err(-EINVAL, "attention (cuda): window [%llu, %llu) passes the query's "
			       "seq_len %llu", (unsigned long long)t0, (unsigned long long)t1,
			       (unsigned long long)field);
	if (pos && !n_entries)
		return kvt_err(-EINVAL, "attention (cuda): block positions given with n_entries 0");
	q = (field ? field : t1) - 1;
	if (window && q + 1 > window)
		lo = q + 1 - window;
	s_end = sink < lo ? sink : lo;
	a1 = t1 < s_end ? t1 : s_end;
	b0 = t0 > lo ? t0 : lo;
	p->a0 = t0;
	p->na = a1 > t0 ? a1 - t0 : 0;
	p->b0 = b0;
	p->t_begin = 0;
	p->t_end = p->na + (t1 > b0 ? t1 - b0 : 0);
	p->pos_end = t1;
	p->pos = pos;
	p->n_entries = n_entries;
	p->q_pe = NULL;
	p->rope_dim = 0;
	p->scale = 1.0f;
	return 0;
}

/* Host-side argument checks shared by the launchers; fills the common part of *p. */
static int
attn_cuda_check(const struct kvt_paged_kv *kv, const float *q, uint32_t n_heads, uint64_t t0,
		uint64_t t1, int decode, const float *out, attn_params *p)
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
	if (attn_cuda_visible(kv->seq_len, kv->window, kv->sink, kv->pos, kv->n_entries, t0, t1,
			      decode, p))
		return -EINVAL;
	p->k_base = (const char *)kv->k_base;
	p->v_offset = kv->v_offset;
	p->block_stride = kv->block_stride;
	p->token_stride = kv->token_stride;
	p->table = kv->table;
	p->q = q;
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
typedef int (*attn_launch_fn)(enum kvt_dtype dtype, const attn_params &p, uint32_t n_windows,
			      cudaStream_t stream);

static int
attn_cuda_run(enum kvt_dtype dtype, attn_params p, uint32_t n_splits, float *work, float *out,
	      float *m, float *l, cudaStream_t stream, attn_launch_fn launch)
{
	const uint64_t len = p.t_end - p.t_begin;
	uint64_t n_win;
	int rc;

	if (!n_splits || n_splits > KVT_ATTN_CUDA_MAX_SPLITS)
		return kvt_err(-EINVAL, "attention (cuda): n_splits %u not in 1..%u", n_splits,
			       KVT_ATTN_CUDA_MAX_SPLITS);
	if (n_splits > 1 && !work)
		return kvt_err(-EINVAL, "attention (cuda): NULL work with %u splits", n_splits);
	if (!len) { /* a partial with no visible position (a decode always sees its query) */
		KVT_CUDA_LAUNCH(p.n_heads, 128, 0, stream, attn_empty_kernel)(p.head_dim, out, m,
									       l);
		return kvt_cuda_launched("attention (empty partial)");
	}
	p.chunk = (len + n_splits - 1) / n_splits;
	n_win = (len + p.chunk - 1) / p.chunk; /* <= n_splits, no empty window */
	if (n_win == 1) {
		p.o = out;
		p.m = m;
		p.l = l;
		return launch(dtype, p, 1, stream);
	}
	/* work layout (within the n_splits-sized buffer): o [n_win][H][d], m [n_win][H], l */
	p.o = work;
	p.m = work + n_win * p.n_heads * p.head_dim;
	p.l = p.m + n_win * p.n_heads;
	rc = launch(dtype, p, (uint32_t)n_win, stream);
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

	rc = attn_cuda_check(kv, q, n_heads, 0, seq_len, 1, out, &p);
	if (rc)
		return rc;
	return attn_cuda_run(kv->dtype, p, n_splits, work, out, NULL, NULL, stream,
			     attn_cuda_launch_split);
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

	rc = attn_cuda_check(kv, q, n_heads, t0, t1, 0, out, &p);
	if (rc)
		return rc;
	if (!m || !l)
		return kvt_err(-EINVAL, "attention (cuda): NULL m or l");
	return attn_cuda_run(kv->dtype, p, n_splits, work, out, m, l, stream,
			     attn_cuda_launch_split);
}
/* ------------------------------------------------------------------------------------------ */
/* MLA latent, absorbed form (attention.h): one latent row per position, shared by all heads.   */

#define ATTN_LAT_MAX_DIM 2048u   /* kv_lora_rank + rope_dim */
#define ATTN_LAT_SMEM (48u << 10) /* dynamic shared memory per block, bytes */

/* Shared floats of attn_lat_kernel for hg heads, tiles of tt rows of d = r + rope elements. */
static size_t
attn_lat_smem_floats(uint32_t hg, uint32_t tt, uint32_t d, uint32_t r)
{
	return (size_t)hg * d + (size_t)tt * d + (size_t)hg * tt + (size_t)hg * r + 3u * hg;
}

/*
 * grid (ceil(n_heads / hg), n_windows), block 256 threads (8 warps), dynamic shared memory
 * attn_lat_smem_floats(hg, tt, d, r) floats. Block (g, s) computes the partials of heads
 * g*hg .. (those < n_heads) over window s of the visible positions (virtual indices), tile by
 * tile of tt <= 32 rows. Shared: q [hg][d] (q_lat | q_pe), tile [tt][d], sc [hg][tt] (scores,
 * then probabilities), acc [hg][r], m, l, alpha [hg].
 */
template <typename T>
__global__ void __launch_bounds__(256)
attn_lat_kernel(attn_params p, uint32_t hg, uint32_t tt)
{
	KVT_EXTERN_SHARED(float, attn_lsmem);
	const uint32_t r = p.head_dim, rp = p.rope_dim, d = r + rp;
	const uint32_t nthr = blockDim.x, nwarps = nthr / 32u, warp = threadIdx.x / 32u;
	const uint32_t lane = threadIdx.x & 31u, h0 = blockIdx.x * hg, s = blockIdx.y;
	const uint32_t nh = p.n_heads - h0 < hg ? p.n_heads - h0 : hg;
	const uint64_t t0 = p.t_begin + (uint64_t)s * p.chunk;
	const uint64_t t1 = t0 + p.chunk < p.t_end ? t0 + p.chunk : p.t_end;
	const attn_map mp = attn_map_make(p);
	float *qs = attn_lsmem, *tile = qs + (size_t)hg * d, *sc = tile + (size_t)tt * d;
	float *acc = sc + (size_t)hg * tt, *sm = acc + (size_t)hg * r, *sl = sm + hg;
	float *sa = sl + hg;

	for (uint32_t x = threadIdx.x; x < nh * d; x += nthr) {
		const uint32_t j = x / d, i = x % d;

		qs[x] = i < r ? p.q[(size_t)(h0 + j) * r + i] : p.q_pe[(size_t)(h0 + j) * rp + i - r];
	}
	for (uint32_t x = threadIdx.x; x < nh * r; x += nthr)
		acc[x] = 0.0f;
	for (uint32_t j = threadIdx.x; j < nh; j += nthr) {
		sm[j] = -INFINITY;
		sl[j] = 0.0f;
	}
	__syncthreads();
	for (uint64_t tb = t0; tb < t1; tb += tt) {
		const uint32_t nt = t1 - tb < tt ? (uint32_t)(t1 - tb) : tt;

		/* the tile's rows, widened; row u of the tile by threads in row-major order */
		for (uint32_t x = threadIdx.x; x < nt * d; x += nthr) {
			const uint32_t u = x / d, i = x % d;
			const T *row = (const T *)attn_row(p, mp, attn_pos_of(p, tb + u));

			tile[x] = attn_ld(row + i);
		}
		__syncthreads();
		/* scores: one (head, row) pair per warp and step (warp-uniform loop) */
		for (uint32_t pr = warp; pr < nh * tt; pr += nwarps) {
			const uint32_t j = pr / tt, u = pr % tt;
			float dot = 0.0f;

			if (u < nt)
				for (uint32_t i = lane; i < d; i += 32)
					dot += qs[(size_t)j * d + i] * tile[(size_t)u * d + i];
			dot = attn_warp_sum(dot);
			if (lane == 0)
				sc[(size_t)j * tt + u] = u < nt ? dot * p.scale : -INFINITY;
		}
		__syncthreads();
		/* online softmax per head: lane u holds row u (tt <= 32) */
		for (uint32_t j = warp; j < nh; j += nwarps) {
			float x = lane < tt ? sc[(size_t)j * tt + lane] : -INFINITY, mx = x;

			for (int off = 16; off > 0; off >>= 1)
				mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
			const float mn = fmaxf(sm[j], mx); /* finite: the tile has a row */
			const float e = lane < nt ? expf(x - mn) : 0.0f;
			const float sum = attn_warp_sum(e);

			if (lane < tt)
				sc[(size_t)j * tt + lane] = e;
			if (lane == 0) {
				const float alpha = attn_scale(sm[j], mn);

				sl[j] = sl[j] * alpha + sum;
				sa[j] = alpha;
				sm[j] = mn;
			}
		}
		__syncthreads();
		for (uint32_t x = threadIdx.x; x < nh * r; x += nthr) {
			const uint32_t j = x / r, i = x % r;
			float a = acc[x] * sa[j];

			for (uint32_t u = 0; u < nt; u++)
				a += sc[(size_t)j * tt + u] * tile[(size_t)u * d + i];
			acc[x] = a;
		}
		__syncthreads();
	}
	for (uint32_t x = threadIdx.x; x < nh * r; x += nthr) {
		const uint32_t j = x / r, i = x % r;

		p.o[((size_t)s * p.n_heads + h0 + j) * r + i] = acc[x] / sl[j];
	}
	if (p.m)
		for (uint32_t j = threadIdx.x; j < nh; j += nthr) {
			p.m[(size_t)s * p.n_heads + h0 + j] = sm[j];
			p.l[(size_t)s * p.n_heads + h0 + j] = sl[j];
		}
}

/* Heads per block and rows per tile of attn_lat_kernel: 8 heads, 16 rows, halved to fit. */
static void
attn_lat_shape(uint32_t n_heads, uint32_t d, uint32_t r, uint32_t *hg, uint32_t *tt)
{
	*hg = n_heads < 8 ? n_heads : 8;
	*tt = 16;
	while (attn_lat_smem_floats(*hg, *tt, d, r) * sizeof(float) > ATTN_LAT_SMEM) {
		if (*tt > 4)
			*tt /= 2;
		else if (*hg > 1)
			*hg = (*hg + 1) / 2;
		else
			*tt /= 2; /* d <= ATTN_LAT_MAX_DIM: fits at hg 1, tt 2 */
	}
}

static int
attn_lat_launch(enum kvt_dtype dtype, const attn_params &p, uint32_t n_windows,
		cudaStream_t stream)
{
	const uint32_t d = p.head_dim + p.rope_dim;
	uint32_t hg, tt;

	attn_lat_shape(p.n_heads, d, p.head_dim, &hg, &tt);
	const size_t smem = attn_lat_smem_floats(hg, tt, d, p.head_dim) * sizeof(float);
	dim3 grid((p.n_heads + hg - 1) / hg, n_windows), block(256);

	if (dtype == KVT_DTYPE_F32)
		KVT_CUDA_LAUNCH(grid, block, smem, stream, attn_lat_kernel<float>)(p, hg, tt);
	else if (dtype == KVT_DTYPE_F16)
		KVT_CUDA_LAUNCH(grid, block, smem, stream, attn_lat_kernel<__half>)(p, hg, tt);
	else
		KVT_CUDA_LAUNCH(grid, block, smem, stream, attn_lat_kernel<__nv_bfloat16>)(p, hg,
											   tt);
	return kvt_cuda_launched("latent attention");
}

/* Host checks of the latent launchers (as kvt_attn_latent_*_ref, plus alignment, sizes). */
static int
attn_lat_check(const struct kvt_paged_latent *kv, const float *q_lat, const float *q_pe,
	       uint32_t n_heads, uint64_t t0, uint64_t t1, int decode, float scale,
	       const float *out, attn_params *p)
{
	uint64_t esize;

	if (!kv || !q_lat || !out || !kv->base || !kv->table)
		return kvt_err(-EINVAL, "latent attention (cuda): NULL kv, q_lat, out, base or "
			       "table");
	if (kv->rope_dim && !q_pe)
		return kvt_err(-EINVAL, "latent attention (cuda): NULL q_pe with rope_dim %u",
			       kv->rope_dim);
	switch (kv->dtype) {
	case KVT_DTYPE_F32: esize = 4; break;
	case KVT_DTYPE_F16: esize = 2; break;
	case KVT_DTYPE_BF16: esize = 2; break;
	default: return kvt_err(-EINVAL, "latent attention (cuda): unsupported dtype %d",
				(int)kv->dtype);
	}
	if (!n_heads || !kv->kv_lora_rank || !kv->tokens_per_block ||
	    (uint64_t)kv->kv_lora_rank + kv->rope_dim > ATTN_LAT_MAX_DIM)
		return kvt_err(-EINVAL, "latent attention (cuda): n_heads %u, tokens_per_block %u "
			       "(> 0), kv_lora_rank %u + rope_dim %u (1..%u)", n_heads,
			       kv->tokens_per_block, kv->kv_lora_rank, kv->rope_dim,
			       ATTN_LAT_MAX_DIM);
	if (kv->token_stride < ((uint64_t)kv->kv_lora_rank + kv->rope_dim) * esize)
		return kvt_err(-EINVAL, "latent attention (cuda): token_stride %llu < one vector",
			       (unsigned long long)kv->token_stride);
	if (((uintptr_t)kv->base | kv->block_stride | kv->token_stride) % esize)
		return kvt_err(-EINVAL, "latent attention (cuda): base or strides not aligned to "
			       "%llu", (unsigned long long)esize);
	if (!(scale > 0.0f) || !isfinite(scale))
		return kvt_err(-EINVAL, "latent attention (cuda): scale %g must be finite and > 0",
			       (double)scale);
	if (attn_cuda_visible(kv->seq_len, kv->window, kv->sink, kv->pos, kv->n_entries, t0, t1,
			      decode, p))
		return -EINVAL;
	p->k_base = (const char *)kv->base;
	p->v_offset = 0;
	p->block_stride = kv->block_stride;
	p->token_stride = kv->token_stride;
	p->table = kv->table;
	p->q = q_lat;
	p->q_pe = q_pe;
	p->rope_dim = kv->rope_dim;
	p->scale = scale;
	p->tokens_per_block = kv->tokens_per_block;
	p->n_heads = n_heads;
	p->kv_mul = n_heads;
	p->head_dim = kv->kv_lora_rank;
	p->sqrt_d = 1.0f;
	return 0;
}

extern "C" uint32_t
kvt_attn_latent_cuda_splits(uint32_t n_heads, uint64_t n_visible, int n_sm)
{
	uint64_t blocks_per_win = n_heads ? (n_heads + 7u) / 8u : 1;
	uint64_t want = ((uint64_t)(n_sm > 0 ? n_sm : 1) * 4 + blocks_per_win - 1) /
			blocks_per_win;
	uint64_t most = (n_visible + 255) / 256;

	if (want > most)
		want = most;
	if (want < 1)
		want = 1;
	if (want > KVT_ATTN_CUDA_MAX_SPLITS)
		want = KVT_ATTN_CUDA_MAX_SPLITS;
	return (uint32_t)want;
}

extern "C" size_t
kvt_attn_latent_cuda_work_floats(uint32_t n_heads, uint32_t kv_lora_rank, uint32_t n_splits)
{
	return kvt_attn_cuda_work_floats(n_heads, kv_lora_rank, n_splits);
}

extern "C" int
kvt_attn_latent_decode_cuda(const struct kvt_paged_latent *kv, const float *q_lat,
			    const float *q_pe, uint32_t n_heads, uint64_t seq_len, float scale,
			    uint32_t n_splits, float *work, float *out, cudaStream_t stream)
{
	attn_params p;
	int rc;

	rc = attn_lat_check(kv, q_lat, q_pe, n_heads, 0, seq_len, 1, scale, out, &p);
	if (rc)
		return rc;
	return attn_cuda_run(kv->dtype, p, n_splits, work, out, NULL, NULL, stream,
			     attn_lat_launch);
}

extern "C" int
kvt_attn_latent_partial_cuda(const struct kvt_paged_latent *kv, const float *q_lat,
			     const float *q_pe, uint32_t n_heads, uint64_t t0, uint64_t t1,
			     float scale, uint32_t n_splits, float *work, float *out, float *m,
			     float *l, cudaStream_t stream)
{
	attn_params p;
	int rc;

	rc = attn_lat_check(kv, q_lat, q_pe, n_heads, t0, t1, 0, scale, out, &p);
	if (rc)
		return rc;
	if (!m || !l)
		return kvt_err(-EINVAL, "latent attention (cuda): NULL m or l");
	return attn_cuda_run(kv->dtype, p, n_splits, work, out, m, l, stream, attn_lat_launch);
}
