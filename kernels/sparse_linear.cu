/* SPDX-License-Identifier: MIT */
/*
 * kernels/sparse_linear.cu - the issue-17 decode kernels on the GPU (see kernels_cuda.h): the
 * gated delta rule step and the short convolution (kernels/linear.h), attention over selected
 * blocks, the Quest summary and score, DSA's attention over a token list and its lightning
 * indexer's scores (kernels/sparse.h). Plain first versions: correct and simple (fp32
 * accumulation, one thread block per head), not tuned.
 *
 * Gated delta rule: thread block h takes value head h; its threads normalise q and k of the key
 * head into shared memory, then each thread owns columns j of the state (columns evolve
 * independently: linear.h), reading its column twice as the reference does.
 * Selected attention: thread block h takes query head h; threads stride over the n_blocks *
 * tokens_per_block candidate positions, writing each score (or -inf for a position past the
 * sequence or outside the window) to @work [n_heads][n_blocks * tpb]; a block-wide max and sum
 * follow, then each thread owns output elements. Quest: one thread block per listed block,
 * threads over the (KV head, channel) pairs; the score: one thread per (head, block).
 * Token list (DSA): thread block h takes query head h, threads stride over the listed tokens
 * (scores into @work [n_heads][n_tokens]), then own output elements, as selected attention.
 * Indexer: one thread per key.
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

#define SL_THREADS 128u

static __device__ __forceinline__ float
sl_ld(const void *base, uint64_t i, int dt)
{
	if (dt == KVT_DTYPE_F32)
		return ((const float *)base)[i];
	if (dt == KVT_DTYPE_F16)
		return __half2float(((const __half *)base)[i]);
	return __bfloat162float(((const __nv_bfloat16 *)base)[i]);
}

static __device__ __forceinline__ void
sl_st(void *base, uint64_t i, int dt, float x)
{
	if (dt == KVT_DTYPE_F32)
		((float *)base)[i] = x;
	else if (dt == KVT_DTYPE_F16)
		((__half *)base)[i] = __float2half_rn(x);
	else
		((__nv_bfloat16 *)base)[i] = __float2bfloat16_rn(x);
}

static uint32_t
sl_esize(enum kvt_dtype dt)
{
	return dt == KVT_DTYPE_F32 ? 4u : dt == KVT_DTYPE_F16 || dt == KVT_DTYPE_BF16 ? 2u : 0u;
}

/* ---- gated delta rule ---------------------------------------------------------------------- */

__global__ void
gdn_kernel(void *state, const float *q, const float *k, const float *v, const float *g,
	   const float *beta, float *out, uint32_t group, uint32_t dk, uint32_t dv, int dt,
	   int l2norm)
{
	KVT_EXTERN_SHARED(float, gdn_smem); /* qn [dk], kn [dk] */
	const uint32_t h = blockIdx.x, kh = h / group;
	float *qn = gdn_smem, *kn = gdn_smem + dk;
	const uint64_t base = (uint64_t)h * dk * dv;
	const float decay = expf(g[h]);

	if (threadIdx.x == 0) {
		float sq = 0.0f, sk = 0.0f, iq = 1.0f, ik = 1.0f;

		for (uint32_t i = 0; i < dk; i++) {
			sq += q[(uint64_t)kh * dk + i] * q[(uint64_t)kh * dk + i];
			sk += k[(uint64_t)kh * dk + i] * k[(uint64_t)kh * dk + i];
		}
		if (l2norm) {
			iq = 1.0f / sqrtf(sq + KVT_GDN_L2NORM_EPS);
			ik = 1.0f / sqrtf(sk + KVT_GDN_L2NORM_EPS);
		}
		for (uint32_t i = 0; i < dk; i++) {
			qn[i] = q[(uint64_t)kh * dk + i] * iq * (1.0f / sqrtf((float)dk));
			kn[i] = k[(uint64_t)kh * dk + i] * ik;
		}
	}
	__syncthreads();
	for (uint32_t j = threadIdx.x; j < dv; j += blockDim.x) {
		float m = 0.0f, o = 0.0f, delta;

		for (uint32_t i = 0; i < dk; i++)
			m += sl_ld(state, base + (uint64_t)i * dv + j, dt) * decay * kn[i];
		delta = (v[(uint64_t)h * dv + j] - m) * beta[h];
		for (uint32_t i = 0; i < dk; i++) {
			uint64_t e = base + (uint64_t)i * dv + j;
			float x = sl_ld(state, e, dt) * decay + kn[i] * delta;

			sl_st(state, e, dt, x);
			o += x * qn[i];
		}
		out[(uint64_t)h * dv + j] = o;
	}
}

extern "C" int
kvt_gdn_step_cuda(const struct kvt_gdn_shape *s, void *state, const float *q, const float *k,
		  const float *v, const float *g, const float *beta, float *out,
		  cudaStream_t stream)
{
	if (!s || !state || !q || !k || !v || !g || !beta || !out)
		return kvt_err(-EINVAL, "gated delta rule (cuda): NULL argument");
	if (!kvt_gdn_state_bytes(s))
		return kvt_err(-EINVAL, "gated delta rule (cuda): bad shape or dtype");
	if (s->k_dim > 4096)
		return kvt_err(-EINVAL, "gated delta rule (cuda): k_dim %u > 4096", s->k_dim);
	KVT_CUDA_LAUNCH(dim3(s->n_v_heads), dim3(SL_THREADS), 2 * s->k_dim * sizeof(float), stream,
			gdn_kernel)(state, q, k, v, g, beta, out, s->n_v_heads / s->n_k_heads,
				    s->k_dim, s->v_dim, (int)s->dtype, s->l2norm);
	return kvt_cuda_launched("gated delta rule");
}

/* ---- short convolution --------------------------------------------------------------------- */

__global__ void
conv_kernel(void *state, const float *x, const float *w, const float *bias, float *out,
	    uint32_t channels, uint32_t kernel, int dt, int silu)
{
	const uint32_t km1 = kernel - 1;

	for (uint32_t c = blockIdx.x * blockDim.x + threadIdx.x; c < channels;
	     c += gridDim.x * blockDim.x) {
		const uint64_t base = (uint64_t)c * km1;
		float y = bias ? bias[c] : 0.0f;

		for (uint32_t j = 0; j < km1; j++)
			y += w[(uint64_t)c * kernel + j] * sl_ld(state, base + j, dt);
		y += w[(uint64_t)c * kernel + km1] * x[c];
		for (uint32_t j = 0; j + 1 < km1; j++)
			sl_st(state, base + j, dt, sl_ld(state, base + j + 1, dt));
		sl_st(state, base + km1 - 1, dt, x[c]);
		out[c] = silu ? y / (1.0f + expf(-y)) : y;
	}
}

extern "C" int
kvt_conv_step_cuda(const struct kvt_conv_shape *s, void *state, const float *x,
		   const float *weight, const float *bias, float *out, cudaStream_t stream)
{
	uint32_t blocks;

	if (!s || !state || !x || !weight || !out || out == x)
		return kvt_err(-EINVAL, "short convolution (cuda): NULL argument or out == x");
	if (!kvt_conv_state_bytes(s))
		return kvt_err(-EINVAL, "short convolution (cuda): bad shape or dtype");
	blocks = (s->channels + SL_THREADS - 1) / SL_THREADS;
	blocks = blocks > 65535u ? 65535u : blocks;
	KVT_CUDA_LAUNCH(dim3(blocks), dim3(SL_THREADS), 0, stream, conv_kernel)(
		state, x, weight, bias, out, s->channels, s->kernel, (int)s->dtype, s->silu);
	return kvt_cuda_launched("short convolution");
}

/* ---- selected-block attention -------------------------------------------------------------- */

struct sel_params {
	const char *base;
	uint64_t block_stride, token_stride, v_offset;
	const uint32_t *table, *pos, *blocks;
	uint32_t n_entries, n_blocks, tpb, kv_mul;
	uint64_t seq_len, sink_end, win_begin;
	uint32_t d1;              /* score dims from q1 (head_dim; latent: kv_lora_rank) */
	uint32_t d2;              /* score dims from q2 (latent: rope_dim; GQA: 0) */
	uint32_t head_bytes;      /* GQA: bytes of one KV head's row; latent: 0 */
	int latent, dt;
	float scale;              /* GQA: 1/sqrt(head_dim); latent: the caller's */
	const float *q1, *q2;
	float *work, *out;
};

static __device__ uint64_t
sel_slot(const sel_params &p, uint32_t b)
{
	uint32_t lo = 0, hi;

	if (!p.pos)
		return p.table[b];
	hi = p.n_entries;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (p.pos[mid] < b)
			lo = mid + 1;
		else
			hi = mid;
	}
	return p.table[lo]; /* present: checked by the caller (sparse.h contract) */
}

/* Block-wide reduction (max or sum) of x over SL_THREADS threads. */
static __device__ float
sel_reduce(float x, float *red, int is_max)
{
	red[threadIdx.x] = x;
	__syncthreads();
	for (uint32_t off = SL_THREADS / 2; off > 0; off >>= 1) {
		if (threadIdx.x < off)
			red[threadIdx.x] = is_max ? fmaxf(red[threadIdx.x], red[threadIdx.x + off])
						  : red[threadIdx.x] + red[threadIdx.x + off];
		__syncthreads();
	}
	x = red[0];
	__syncthreads();
	return x;
}

__global__ void
sel_kernel(sel_params p)
{
	__shared__ float red[SL_THREADS];
	const uint32_t h = blockIdx.x;
	const uint64_t n = (uint64_t)p.n_blocks * p.tpb;
	const uint64_t hoff = p.latent ? 0 : (uint64_t)(h / p.kv_mul) * p.head_bytes;
	const float *q1 = p.q1 + (uint64_t)h * p.d1, *q2 = p.q2 ? p.q2 + (uint64_t)h * p.d2 : NULL;
	float *sc = p.work + (uint64_t)h * n, mx = -INFINITY, sum = 0.0f;
	const uint32_t od = p.d1;

	for (uint64_t idx = threadIdx.x; idx < n; idx += blockDim.x) {
		const uint32_t b = p.blocks[idx / p.tpb];
		const uint64_t t = (uint64_t)b * p.tpb + idx % p.tpb;
		float s = -INFINITY;

		if (t < p.seq_len && (t < p.sink_end || t >= p.win_begin)) {
			const char *row = p.base + sel_slot(p, b) * p.block_stride +
					  (t % p.tpb) * p.token_stride + hoff;

			s = 0.0f;
			for (uint32_t i = 0; i < p.d1; i++)
				s += q1[i] * sl_ld(row, i, p.dt);
			for (uint32_t i = 0; i < p.d2; i++)
				s += q2[i] * sl_ld(row, p.d1 + i, p.dt);
			s *= p.scale;
		}
		sc[idx] = s;
		mx = fmaxf(mx, s);
	}
	mx = sel_reduce(mx, red, 1);
	for (uint64_t idx = threadIdx.x; idx < n; idx += blockDim.x) {
		float e = mx == -INFINITY ? 0.0f : expf(sc[idx] - mx);

		sc[idx] = e;
		sum += e;
	}
	sum = sel_reduce(sum, red, 0); /* also orders the writes to sc before the reads below */
	for (uint32_t i = threadIdx.x; i < od; i += blockDim.x) {
		float o = 0.0f;

		for (uint64_t idx = 0; idx < n; idx++) {
			const uint32_t b = p.blocks[idx / p.tpb];
			const uint64_t t = (uint64_t)b * p.tpb + idx % p.tpb;
			const char *row;

			if (sc[idx] == 0.0f)
				continue; /* invisible (or underflowed: adds nothing) */
			row = p.base + sel_slot(p, b) * p.block_stride + (t % p.tpb) * p.token_stride +
			      hoff + (p.latent ? 0 : p.v_offset);
			o += sc[idx] * sl_ld(row, i, p.dt);
		}
		p.out[(uint64_t)h * od + i] = sum > 0.0f ? o / sum : 0.0f;
	}
}

static int
sel_launch(sel_params &p, uint32_t n_heads, cudaStream_t stream)
{
	KVT_CUDA_LAUNCH(dim3(n_heads), dim3(SL_THREADS), 0, stream, sel_kernel)(p);
	return kvt_cuda_launched("selected attention");
}

extern "C" size_t
kvt_attn_select_cuda_work_floats(uint32_t n_heads, uint32_t n_blocks, uint32_t tpb)
{
	return (size_t)n_heads * n_blocks * tpb;
}

static int
sel_common(sel_params *p, const uint32_t *blocks, uint32_t n_blocks, uint64_t seq_len,
	   uint64_t window, uint64_t sink, float *work, float *out)
{
	if (!blocks || !n_blocks || !work || !out || !seq_len)
		return kvt_err(-EINVAL, "selected attention (cuda): NULL blocks, work or out, "
			       "n_blocks or seq_len 0");
	p->blocks = blocks;
	p->n_blocks = n_blocks;
	p->seq_len = seq_len;
	kvt_attn_visible(window, sink, seq_len, &p->sink_end, &p->win_begin);
	p->work = work;
	p->out = out;
	return 0;
}

extern "C" int
kvt_attn_select_cuda(const struct kvt_paged_kv *kv, const float *q, uint32_t n_heads,
		     uint64_t seq_len, const uint32_t *blocks, uint32_t n_blocks, float *work,
		     float *out, cudaStream_t stream)
{
	sel_params p = {};
	uint32_t esz;
	int rc;

	if (!kv || !q || !kv->k_base || !kv->table)
		return kvt_err(-EINVAL, "selected attention (cuda): NULL kv, q, k_base or table");
	esz = sl_esize(kv->dtype);
	if (!esz || !n_heads || !kv->n_kv_heads || n_heads % kv->n_kv_heads || !kv->head_dim ||
	    !kv->tokens_per_block ||
	    kv->token_stride < (uint64_t)kv->n_kv_heads * kv->head_dim * esz ||
	    (kv->seq_len && kv->seq_len != seq_len) || (kv->pos && !kv->n_entries))
		return kvt_err(-EINVAL, "selected attention (cuda): bad dtype, heads, head_dim, "
			       "tokens_per_block, token_stride, seq_len or block positions");
	if ((rc = sel_common(&p, blocks, n_blocks, seq_len, kv->window, kv->sink, work, out)))
		return rc;
	p.base = (const char *)kv->k_base;
	p.block_stride = kv->block_stride;
	p.token_stride = kv->token_stride;
	p.v_offset = kv->v_offset;
	p.table = kv->table;
	p.pos = kv->pos;
	p.n_entries = kv->n_entries;
	p.tpb = kv->tokens_per_block;
	p.kv_mul = n_heads / kv->n_kv_heads;
	p.d1 = kv->head_dim;
	p.head_bytes = kv->head_dim * esz;
	p.dt = (int)kv->dtype;
	p.scale = 1.0f / sqrtf((float)kv->head_dim);
	p.q1 = q;
	return sel_launch(p, n_heads, stream);
}

extern "C" int
kvt_attn_latent_select_cuda(const struct kvt_paged_latent *kv, const float *q_lat,
			    const float *q_pe, uint32_t n_heads, uint64_t seq_len,
			    const uint32_t *blocks, uint32_t n_blocks, float scale, float *work,
			    float *out, cudaStream_t stream)
{
	sel_params p = {};
	uint32_t esz;
	int rc;

	if (!kv || !q_lat || !kv->base || !kv->table || (kv->rope_dim && !q_pe))
		return kvt_err(-EINVAL, "selected latent attention (cuda): NULL kv, q_lat, base, "
			       "table or q_pe");
	esz = sl_esize(kv->dtype);
	if (!esz || !n_heads || !kv->kv_lora_rank || !kv->tokens_per_block ||
	    kv->token_stride < ((uint64_t)kv->kv_lora_rank + kv->rope_dim) * esz ||
	    !(scale > 0.0f) || !isfinite(scale) || (kv->seq_len && kv->seq_len != seq_len) ||
	    (kv->pos && !kv->n_entries))
		return kvt_err(-EINVAL, "selected latent attention (cuda): bad dtype, n_heads, "
			       "kv_lora_rank, tokens_per_block, token_stride, scale, seq_len or "
			       "block positions");
	if ((rc = sel_common(&p, blocks, n_blocks, seq_len, kv->window, kv->sink, work, out)))
		return rc;
	p.base = (const char *)kv->base;
	p.block_stride = kv->block_stride;
	p.token_stride = kv->token_stride;
	p.table = kv->table;
	p.pos = kv->pos;
	p.n_entries = kv->n_entries;
	p.tpb = kv->tokens_per_block;
	p.kv_mul = 1;
	p.d1 = kv->kv_lora_rank;
	p.d2 = kv->rope_dim;
	p.latent = 1;
	p.dt = (int)kv->dtype;
	p.scale = scale;
	p.q1 = q_lat;
	p.q2 = kv->rope_dim ? q_pe : NULL;
	return sel_launch(p, n_heads, stream);
}

/* ---- Quest --------------------------------------------------------------------------------- */

__global__ void
quest_summary_kernel(sel_params p, uint32_t n_kv_heads, uint32_t d, float *summary)
{
	const uint32_t b = p.blocks[blockIdx.x];
	const uint64_t t0 = (uint64_t)b * p.tpb;
	const uint64_t t1 = t0 + p.tpb < p.seq_len ? t0 + p.tpb : p.seq_len;
	const char *slot = p.base + sel_slot(p, b) * p.block_stride;
	float *sb = summary + (uint64_t)blockIdx.x * n_kv_heads * 2 * d;

	for (uint32_t e = threadIdx.x; e < n_kv_heads * d; e += blockDim.x) {
		const uint32_t kh = e / d, i = e % d;
		float mn = 0.0f, mx = 0.0f;

		for (uint64_t t = t0; t < t1; t++) {
			float x = sl_ld(slot + (t - t0) * p.token_stride, e, p.dt);

			if (t == t0 || x < mn || x != x)
				mn = x;
			if (t == t0 || x > mx || x != x)
				mx = x;
		}
		sb[(uint64_t)kh * 2 * d + i] = mn;
		sb[(uint64_t)kh * 2 * d + d + i] = mx;
	}
}

extern "C" int
kvt_quest_summary_cuda(const struct kvt_paged_kv *kv, uint64_t seq_len, const uint32_t *blocks,
		       uint32_t n_blocks, float *summary, cudaStream_t stream)
{
	sel_params p = {};
	uint32_t esz;

	if (!kv || !kv->k_base || !kv->table || !blocks || !summary || !n_blocks || !seq_len)
		return kvt_err(-EINVAL, "quest summary (cuda): NULL argument, n_blocks or seq_len "
			       "0");
	esz = sl_esize(kv->dtype);
	if (!esz || !kv->n_kv_heads || !kv->head_dim || !kv->tokens_per_block ||
	    kv->token_stride < (uint64_t)kv->n_kv_heads * kv->head_dim * esz ||
	    (kv->pos && !kv->n_entries) || n_blocks > 0x7fffffffu)
		return kvt_err(-EINVAL, "quest summary (cuda): bad dtype, shape or token_stride");
	p.base = (const char *)kv->k_base;
	p.block_stride = kv->block_stride;
	p.token_stride = kv->token_stride;
	p.table = kv->table;
	p.pos = kv->pos;
	p.n_entries = kv->n_entries;
	p.tpb = kv->tokens_per_block;
	p.blocks = blocks;
	p.n_blocks = n_blocks;
	p.seq_len = seq_len;
	p.dt = (int)kv->dtype;
	KVT_CUDA_LAUNCH(dim3(n_blocks), dim3(SL_THREADS), 0, stream, quest_summary_kernel)(
		p, kv->n_kv_heads, kv->head_dim, summary);
	return kvt_cuda_launched("quest summary");
}

__global__ void
quest_score_kernel(const float *summary, uint32_t n_blocks, uint32_t n_kv_heads, uint32_t d,
		   const float *q, uint32_t n_heads, float *scores)
{
	const uint64_t n = (uint64_t)n_heads * n_blocks;
	const uint32_t kv_mul = n_heads / n_kv_heads;

	for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
	     e += (uint64_t)gridDim.x * blockDim.x) {
		const uint32_t h = (uint32_t)(e / n_blocks), b = (uint32_t)(e % n_blocks);
		const float *mn = summary + ((uint64_t)b * n_kv_heads + h / kv_mul) * 2 * d;
		const float *mx = mn + d, *qh = q + (uint64_t)h * d;
		float s = 0.0f;

		for (uint32_t i = 0; i < d; i++) {
			float lo = qh[i] * mn[i], hi = qh[i] * mx[i];

			s += hi > lo || hi != hi ? hi : lo;
		}
		scores[e] = s;
	}
}

extern "C" int
kvt_quest_score_cuda(const float *summary, uint32_t n_blocks, uint32_t n_kv_heads,
		     uint32_t head_dim, const float *q, uint32_t n_heads, float *scores,
		     cudaStream_t stream)
{
	uint64_t n = (uint64_t)n_heads * n_blocks, g;

	if (!summary || !q || !scores || !n_blocks || !n_kv_heads || !head_dim || !n_heads ||
	    n_heads % n_kv_heads)
		return kvt_err(-EINVAL, "quest score (cuda): NULL argument or bad counts");
	g = (n + SL_THREADS - 1) / SL_THREADS;
	g = g > 65535u ? 65535u : g;
	KVT_CUDA_LAUNCH(dim3((uint32_t)g), dim3(SL_THREADS), 0, stream, quest_score_kernel)(
		summary, n_blocks, n_kv_heads, head_dim, q, n_heads, scores);
	return kvt_cuda_launched("quest score");
}

/* ---- DSA: attention over a token list, the lightning indexer -------------------------------- */

struct tok_params {
	const char *base;
	uint64_t block_stride, token_stride, seq_len; /* seq_len 0: tokens unbounded */
	const uint32_t *table, *pos, *tokens;
	uint32_t n_entries, n_tokens, tpb, r, pe;
	int dt;
	float scale;
	const float *q_lat, *q_pe;
	float *work, *out, *m, *l;
};

/*
 * Row of token t, or NULL when the sparse.h contract is broken in a way the host could not see
 * (t past kv->seq_len, its block not in pos): the launch then writes NaN instead of reading
 * outside the arrays. Without pos the table entry is trusted, as the reference does.
 */
static __device__ const char *
tok_row(const tok_params &p, uint32_t t)
{
	const uint32_t b = t / p.tpb;
	uint64_t slot;

	if (p.seq_len && t >= p.seq_len)
		return NULL;
	if (!p.pos) {
		slot = p.table[b];
	} else {
		uint32_t lo = 0, hi = p.n_entries;

		while (lo < hi) {
			uint32_t mid = lo + (hi - lo) / 2;

			if (p.pos[mid] < b)
				lo = mid + 1;
			else
				hi = mid;
		}
		if (lo >= p.n_entries || p.pos[lo] != b)
			return NULL;
		slot = p.table[lo];
	}
	return p.base + slot * p.block_stride + (uint64_t)(t % p.tpb) * p.token_stride;
}

/*
 * Thread block h: query head h. Threads stride over the listed tokens j, each score a
 * sequential dot product (i ascending, as the reference) into work[h][j]; block-wide max, then
 * each thread's exponentials and a tree sum, then work[h][j] = exp / sum (the reference's
 * normalised weights); each thread then owns output elements i, summed over j ascending.
 */
__global__ void
tok_kernel(tok_params p)
{
	__shared__ float red[SL_THREADS];
	const uint32_t h = blockIdx.x, n = p.n_tokens;
	const float *ql = p.q_lat + (uint64_t)h * p.r;
	const float *qp = p.pe ? p.q_pe + (uint64_t)h * p.pe : NULL;
	float *att = p.work + (uint64_t)h * n, *o = p.out + (uint64_t)h * p.r;
	float mx = -INFINITY, sum = 0.0f, bad = 0.0f;

	if (!n) { /* the empty partial; reads nothing */
		for (uint32_t i = threadIdx.x; i < p.r; i += blockDim.x)
			o[i] = 0.0f;
		if (threadIdx.x == 0) {
			p.m[h] = -INFINITY;
			p.l[h] = 0.0f;
		}
		return;
	}
	for (uint32_t j = threadIdx.x; j < n; j += blockDim.x) {
		const char *c = tok_row(p, p.tokens[j]);
		float s = 0.0f;

		if (!c) {
			bad = 1.0f;
			att[j] = 0.0f;
			continue;
		}
		for (uint32_t i = 0; i < p.r; i++)
			s += ql[i] * sl_ld(c, i, p.dt);
		for (uint32_t i = 0; i < p.pe; i++)
			s += qp[i] * sl_ld(c, p.r + i, p.dt);
		s *= p.scale;
		att[j] = s;
		mx = fmaxf(mx, s);
	}
	if (sel_reduce(bad, red, 1) != 0.0f) { /* uniform: every thread reads red[0] */
		for (uint32_t i = threadIdx.x; i < p.r; i += blockDim.x)
			o[i] = NAN;
		if (threadIdx.x == 0)
			p.m[h] = p.l[h] = NAN;
		return;
	}
	mx = sel_reduce(mx, red, 1);
	for (uint32_t j = threadIdx.x; j < n; j += blockDim.x) {
		float e = expf(att[j] - mx);

		att[j] = e;
		sum += e;
	}
	sum = sel_reduce(sum, red, 0);
	for (uint32_t j = threadIdx.x; j < n; j += blockDim.x)
		att[j] /= sum;
	__syncthreads();
	for (uint32_t i = threadIdx.x; i < p.r; i += blockDim.x) {
		float acc = 0.0f;

		for (uint32_t j = 0; j < n; j++)
			acc += att[j] * sl_ld(tok_row(p, p.tokens[j]), i, p.dt);
		o[i] = acc;
	}
	if (threadIdx.x == 0) {
		p.m[h] = mx;
		p.l[h] = sum;
	}
}

extern "C" size_t
kvt_attn_latent_tokens_cuda_work_floats(uint32_t n_heads, uint32_t n_tokens)
{
	return (size_t)n_heads * n_tokens;
}

extern "C" int
kvt_attn_latent_tokens_partial_cuda(const struct kvt_paged_latent *kv, const float *q_lat,
				    const float *q_pe, uint32_t n_heads, const uint32_t *tokens,
				    uint32_t n_tokens, float scale, float *work, float *out,
				    float *m, float *l, cudaStream_t stream)
{
	tok_params p = {};
	uint32_t esz;

	if (!kv || !q_lat || !out || !m || !l || (n_tokens && (!tokens || !work)))
		return kvt_err(-EINVAL, "token-list latent attention (cuda): NULL argument");
	if (!kv->base || !kv->table)
		return kvt_err(-EINVAL, "token-list latent attention (cuda): NULL base or block "
			       "table");
	if (kv->rope_dim && !q_pe)
		return kvt_err(-EINVAL, "token-list latent attention (cuda): NULL q_pe with "
			       "rope_dim %u", kv->rope_dim);
	esz = sl_esize(kv->dtype);
	if (!esz)
		return kvt_err(-EINVAL, "token-list latent attention (cuda): unsupported dtype %d",
			       (int)kv->dtype);
	if (!n_heads || !kv->kv_lora_rank || !kv->tokens_per_block)
		return kvt_err(-EINVAL, "token-list latent attention (cuda): n_heads %u, "
			       "kv_lora_rank %u, tokens_per_block %u must be > 0", n_heads,
			       kv->kv_lora_rank, kv->tokens_per_block);
	if (kv->token_stride < ((uint64_t)kv->kv_lora_rank + kv->rope_dim) * esz)
		return kvt_err(-EINVAL, "token-list latent attention (cuda): token_stride %llu < "
			       "one latent vector", (unsigned long long)kv->token_stride);
	if (((uintptr_t)kv->base | kv->block_stride | kv->token_stride) % esz)
		return kvt_err(-EINVAL, "token-list latent attention (cuda): base or strides not "
			       "aligned to %u", esz);
	if (!(scale > 0.0f) || !isfinite(scale))
		return kvt_err(-EINVAL, "token-list latent attention (cuda): scale %g must be "
			       "finite and > 0", (double)scale);
	if (n_tokens && kv->pos && !kv->n_entries)
		return kvt_err(-EINVAL, "token-list latent attention (cuda): block positions with "
			       "n_entries 0");
	p.base = (const char *)kv->base;
	p.block_stride = kv->block_stride;
	p.token_stride = kv->token_stride;
	p.seq_len = kv->seq_len;
	p.table = kv->table;
	p.pos = kv->pos;
	p.tokens = tokens;
	p.n_entries = kv->n_entries;
	p.n_tokens = n_tokens;
	p.tpb = kv->tokens_per_block;
	p.r = kv->kv_lora_rank;
	p.pe = kv->rope_dim;
	p.dt = (int)kv->dtype;
	p.scale = scale;
	p.q_lat = q_lat;
	p.q_pe = kv->rope_dim ? q_pe : NULL;
	p.work = work;
	p.out = out;
	p.m = m;
	p.l = l;
	KVT_CUDA_LAUNCH(dim3(n_heads), dim3(SL_THREADS), 0, stream, tok_kernel)(p);
	return kvt_cuda_launched("token-list latent attention");
}

/* Largest q + w kept in shared memory by the indexer kernel (floats; 48 KiB). */
#define DSA_SMEM_FLOATS 12288u

/*
 * One thread per key (grid-stride): the reference's sum over heads of its sequential dot
 * products, in its order. q and w are staged in shared memory when they fit.
 */
__global__ void
dsa_kernel(const float *q, const float *w, uint32_t n_heads, uint32_t d, float scale,
	   const float *keys, uint64_t key_stride, uint64_t n, float *scores, int staged)
{
	KVT_EXTERN_SHARED(float, dsa_smem); /* staged: q [n_heads][d], w [n_heads] */
	const uint64_t nq = (uint64_t)n_heads * d;
	const float *qs = q, *ws = w;

	if (staged) {
		for (uint64_t e = threadIdx.x; e < nq + n_heads; e += blockDim.x)
			dsa_smem[e] = e < nq ? q[e] : w[e - nq];
		__syncthreads();
		qs = dsa_smem;
		ws = dsa_smem + nq;
	}
	for (uint64_t t = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; t < n;
	     t += (uint64_t)gridDim.x * blockDim.x) {
		const float *k = keys + t * key_stride;
		float s = 0.0f;

		for (uint32_t h = 0; h < n_heads; h++) {
			const float *qh = qs + (uint64_t)h * d;
			float dot = 0.0f;

			for (uint32_t i = 0; i < d; i++)
				dot += qh[i] * k[i];
			dot *= scale;
			s += ws[h] * (dot > 0.0f ? dot : 0.0f);
		}
		scores[t] = s;
	}
}

extern "C" int
kvt_dsa_index_scores_cuda(const float *q, const float *w, uint32_t n_heads, uint32_t head_dim,
			  float scale, const float *keys, uint64_t key_stride, uint64_t n,
			  float *scores, cudaStream_t stream)
{
	uint64_t g, nsm;
	int staged;

	if (!q || !w || !scores || (n && !keys))
		return kvt_err(-EINVAL, "DSA index scores (cuda): NULL argument");
	if (!n_heads || !head_dim || key_stride < head_dim)
		return kvt_err(-EINVAL, "DSA index scores (cuda): n_heads %u, head_dim %u must be "
			       "> 0 and key_stride %llu >= head_dim", n_heads, head_dim,
			       (unsigned long long)key_stride);
	if (!n)
		return 0;
	nsm = (uint64_t)n_heads * head_dim + n_heads;
	staged = nsm <= DSA_SMEM_FLOATS;
	g = (n + SL_THREADS - 1) / SL_THREADS;
	g = g > 65535u ? 65535u : g;
	KVT_CUDA_LAUNCH(dim3((uint32_t)g), dim3(SL_THREADS), staged ? nsm * sizeof(float) : 0,
			stream, dsa_kernel)(q, w, n_heads, head_dim, scale, keys, key_stride, n,
					    scores, staged);
	return kvt_cuda_launched("DSA index scores");
}
