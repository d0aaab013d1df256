/* SPDX-License-Identifier: MIT */
/*
 * kernels/attention_ref.c - C reference of paged decode attention (see attention.h), the
 * split-KV partial and merge, and the fp16/bf16 element conversions.
 *
 * The arithmetic follows llama2.c's run.c step for step (score: fp32 dot over head_dim in
 * ascending i, then divided by sqrtf(head_dim); softmax: max, expf(x - max) with a running sum in
 * t order, then each divided by the sum; output: zeroed, then out[i] += p * v[i] in t order), so
 * with F32 storage the result is bit-identical to that contiguous loop compiled with the same
 * flags. The CUDA kernels (attention.cu) compute the same function in a different order and are
 * compared against this within fp tolerance.
 *
 * Elements are read with memcpy(): the K/V region is raw bytes of any alignment, and this keeps
 * UBSan quiet while compiling to plain loads.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "tiers/base/error.h"
#include "kernels/attention.h"

/* ---- element conversions ------------------------------------------------------------------ */

static uint32_t
attn_f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof u);
	return u;
}

static float
attn_bits_f32(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof f);
	return f;
}

/*
 * fp32 -> fp16, round to nearest, ties to even. Layout: fp32 s|e8|m23 (bias 127),
 * fp16 s|e5|m10 (bias 15). Normal fp16 covers [2^-14, 65504]; below that the fp16 subnormals
 * are multiples of 2^-24; 65520 (half way from 65504 to 2^16) and above round to infinity.
 */
uint16_t
kvt_f32_to_f16(float f)
{
	uint32_t x = attn_f32_bits(f);
	uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
	uint32_t e, m, shift, q, rem, half;

	x &= 0x7fffffffu;
	if (x > 0x7f800000u) /* NaN: keep the top payload bits, force quiet so it stays NaN */
		return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
	if (x >= 0x477ff000u) /* >= 65520 (or inf) */
		return (uint16_t)(sign | 0x7c00u);
	if (x >= 0x38800000u) { /* normal fp16: rebias 127 -> 15, round 13 dropped bits */
		x += 0xfffu + ((x >> 13) & 1u);
		x -= 112u << 23;
		return (uint16_t)(sign | (x >> 13));
	}
	/* fp16 subnormal (or zero): q = round(|f| / 2^-24). |f| = m * 2^(e - 150). */
	e = x >> 23;
	if (e < 102) /* |f| < 2^-25: rounds to zero */
		return sign;
	m = (x & 0x7fffffu) | 0x800000u;
	shift = 126 - e; /* 14..24 */
	q = m >> shift;
	rem = m & ((1u << shift) - 1u);
	half = 1u << (shift - 1);
	if (rem > half || (rem == half && (q & 1u)))
		q++; /* may carry into 0x400, the smallest normal: still the right encoding */
	return (uint16_t)(sign | q);
}

/* fp16 -> fp32, exact. */
float
kvt_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t e = (h >> 10) & 0x1fu;
	uint32_t m = h & 0x3ffu;

	if (e == 0x1f) /* inf or NaN (payload kept) */
		return attn_bits_f32(sign | 0x7f800000u | (m << 13));
	if (e == 0) {
		if (m == 0)
			return attn_bits_f32(sign);
		/* subnormal m * 2^-24: normalise into an fp32 normal */
		e = 127 - 14;
		while (!(m & 0x400u)) {
			m <<= 1;
			e--;
		}
		m &= 0x3ffu;
		return attn_bits_f32(sign | (e << 23) | (m << 13));
	}
	return attn_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* fp32 -> bf16 (the top 16 bits of fp32), round to nearest, ties to even; NaN stays NaN. */
uint16_t
kvt_f32_to_bf16(float f)
{
	uint32_t x = attn_f32_bits(f);

	if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: rounding could carry it into inf */
		return (uint16_t)((x >> 16) | 0x40u);
	x += 0x7fffu + ((x >> 16) & 1u); /* overflow of the max finite carries into inf: right */
	return (uint16_t)(x >> 16);
}

/* bf16 -> fp32, exact. */
float
kvt_bf16_to_f32(uint16_t h)
{
	return attn_bits_f32((uint32_t)h << 16);
}

int
kvt_store_f32(enum kvt_dtype dtype, void *dst, const float *src, size_t n)
{
	unsigned char *d = dst;
	uint16_t h;
	size_t i;

	if (n && (!dst || !src))
		return kvt_err(-EINVAL, "kvt_store_f32: NULL buffer for %zu values", n);
	switch (dtype) {
	case KVT_DTYPE_F32:
		if (n)
			memcpy(dst, src, n * sizeof(float));
		return 0;
	case KVT_DTYPE_F16:
	case KVT_DTYPE_BF16:
		for (i = 0; i < n; i++) {
			h = dtype == KVT_DTYPE_F16 ? kvt_f32_to_f16(src[i])
						   : kvt_f32_to_bf16(src[i]);
			memcpy(d + i * 2, &h, 2);
		}
		return 0;
	default:
		return kvt_err(-EINVAL, "kvt_store_f32: unsupported dtype %d", (int)dtype);
	}
}

int
kvt_load_f32(enum kvt_dtype dtype, float *dst, const void *src, size_t n)
{
	const unsigned char *s = src;
	uint16_t h;
	size_t i;

	if (n && (!dst || !src))
		return kvt_err(-EINVAL, "kvt_load_f32: NULL buffer for %zu values", n);
	switch (dtype) {
	case KVT_DTYPE_F32:
		if (n)
			memcpy(dst, src, n * sizeof(float));
		return 0;
	case KVT_DTYPE_F16:
	case KVT_DTYPE_BF16:
		for (i = 0; i < n; i++) {
			memcpy(&h, s + i * 2, 2);
			dst[i] = dtype == KVT_DTYPE_F16 ? kvt_f16_to_f32(h) : kvt_bf16_to_f32(h);
		}
		return 0;
	default:
		return kvt_err(-EINVAL, "kvt_load_f32: unsupported dtype %d", (int)dtype);
	}
}

/* ---- attention ---------------------------------------------------------------------------- */

/*
 * The paging of one layer, common to struct kvt_paged_kv and struct kvt_paged_latent, and the
 * visible positions of the range attended: [a0, a1) (sinks) then [b0, b1) (the window, or all),
 * ascending and disjoint; ea / eb the table entries of blocks a0 / tpb and b0 / tpb.
 */
struct attn_pg {
	const unsigned char *base;
	uint64_t block_stride, token_stride;
	const uint32_t *table;
	const uint32_t *pos;
	uint32_t n_entries, tpb;
	uint64_t a0, a1, b0, b1;
	uint32_t ea, eb;
};

/* Element i of a K or V row of @dtype (checked by attn_check) at p, widened to fp32. */
static inline float
attn_elem(enum kvt_dtype dtype, const unsigned char *p, uint32_t i)
{
	float f;
	uint16_t h;

	if (dtype == KVT_DTYPE_F32) {
		memcpy(&f, p + (size_t)i * 4, 4);
		return f;
	}
	memcpy(&h, p + (size_t)i * 2, 2);
	return dtype == KVT_DTYPE_F16 ? kvt_f16_to_f32(h) : kvt_bf16_to_f32(h);
}

/* Address of position t's row (visible, so its block's entry is known: attn_pg_check). */
static inline const unsigned char *
attn_row(const struct attn_pg *pg, uint64_t t)
{
	uint64_t blk = t / pg->tpb, e;

	if (!pg->pos)
		e = blk;
	else if (blk >= pg->b0 / pg->tpb && pg->b0 < pg->b1)
		e = pg->eb + (blk - pg->b0 / pg->tpb);
	else
		e = pg->ea + (blk - pg->a0 / pg->tpb);
	return pg->base + (uint64_t)pg->table[e] * pg->block_stride +
	       (t % pg->tpb) * pg->token_stride;
}

/* Position of the j-th visible position (j < attn_n_visible). */
static inline uint64_t
attn_vpos(const struct attn_pg *pg, uint64_t j)
{
	uint64_t na = pg->a1 - pg->a0;

	return j < na ? pg->a0 + j : pg->b0 + (j - na);
}

static inline uint64_t
attn_n_visible(const struct attn_pg *pg)
{
	return (pg->a1 - pg->a0) + (pg->b1 - pg->b0);
}

/*
 * Entry of block blk in pos[0..n) (strictly ascending), checking that blocks blk .. last follow
 * it one by one. Returns 0 or -EINVAL.
 */
static int
attn_pos_find(const uint32_t *pos, uint32_t n, uint64_t blk, uint64_t last, uint32_t *entry)
{
	uint32_t lo = 0, hi = n, mid;
	uint64_t j;

	while (lo < hi) {
		mid = lo + (hi - lo) / 2;
		if (pos[mid] < blk)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (j = 0; j <= last - blk; j++)
		if (lo + j >= n || pos[lo + j] != blk + j)
			return kvt_err(-EINVAL, "attention: block %llu holds a visible position but "
				       "is not in the table's block positions",
				       (unsigned long long)(blk + j));
	*entry = lo;
	return 0;
}

/*
 * Fill the visible ranges of [t0, t1) from the query at q (attention.h: q - window < k <= q, or
 * k < sink) and check the block positions. t1 <= q + 1. Returns 0 or -EINVAL.
 */
static int
attn_pg_visible(struct attn_pg *pg, uint64_t window, uint64_t sink, uint64_t q, uint64_t t0,
		uint64_t t1)
{
	uint64_t lo = 0, s_end;
	uint32_t i;
	int rc;

	if (window && q + 1 > window)
		lo = q + 1 - window;
	s_end = sink < lo ? sink : lo; /* no window: lo 0, no separate sink range */
	pg->a0 = t0;
	pg->a1 = t1 < s_end ? t1 : s_end;
	if (pg->a1 < pg->a0)
		pg->a1 = pg->a0;
	pg->b0 = t0 > lo ? t0 : lo;
	pg->b1 = t1;
	if (pg->b1 < pg->b0)
		pg->b1 = pg->b0;
	pg->ea = pg->eb = 0;
	if (!pg->pos)
		return 0;
	if (!pg->n_entries)
		return kvt_err(-EINVAL, "attention: block positions given with n_entries 0");
	for (i = 1; i < pg->n_entries; i++)
		if (pg->pos[i] <= pg->pos[i - 1])
			return kvt_err(-EINVAL, "attention: block positions not strictly ascending "
				       "at entry %u (%u after %u)", i, pg->pos[i], pg->pos[i - 1]);
	if (pg->a0 < pg->a1 &&
	    (rc = attn_pos_find(pg->pos, pg->n_entries, pg->a0 / pg->tpb,
				(pg->a1 - 1) / pg->tpb, &pg->ea)) != 0)
		return rc;
	if (pg->b0 < pg->b1 &&
	    (rc = attn_pos_find(pg->pos, pg->n_entries, pg->b0 / pg->tpb,
				(pg->b1 - 1) / pg->tpb, &pg->eb)) != 0)
		return rc;
	return 0;
}

/*
 * The query position of a range [t0, t1) given the struct's seq_len field (0 = t1) and, for a
 * decode, the call's seq_len (@decode != 0: t1 is it). Returns 0 or -EINVAL.
 */
static int
attn_query_pos(uint64_t field, uint64_t t0, uint64_t t1, int decode, uint64_t *q)
{
	if (t0 >= t1)
		return kvt_err(-EINVAL, "attention: empty window [%llu, %llu)",
			       (unsigned long long)t0, (unsigned long long)t1);
	if (decode && field && field != t1)
		return kvt_err(-EINVAL, "attention: kv->seq_len %llu differs from seq_len %llu",
			       (unsigned long long)field, (unsigned long long)t1);
	if (field && t1 > field)
		return kvt_err(-EINVAL, "attention: window [%llu, %llu) passes the query's "
			       "seq_len %llu", (unsigned long long)t0, (unsigned long long)t1,
			       (unsigned long long)field);
	*q = (field ? field : t1) - 1;
	return 0;
}

static int
attn_esize(enum kvt_dtype dtype, size_t *esize)
{
	if (dtype == KVT_DTYPE_F32)
		*esize = 4;
	else if (dtype == KVT_DTYPE_F16 || dtype == KVT_DTYPE_BF16)
		*esize = 2;
	else
		return kvt_err(-EINVAL, "attention: unsupported K/V dtype %d", (int)dtype);
	return 0;
}

/* Validate the arguments shared by decode and partial, fill *pg. Returns 0 or -EINVAL. */
static int
attn_check(const struct kvt_paged_kv *kv, const float *q, uint32_t n_heads, uint64_t t0,
	   uint64_t t1, int decode, const float *scratch, const float *out, struct attn_pg *pg)
{
	uint64_t qpos;
	size_t esize = 0;
	int rc;

	if (!kv || !q || !scratch || !out)
		return kvt_err(-EINVAL, "attention: NULL kv, q, scratch or out");
	if (!kv->k_base || !kv->table)
		return kvt_err(-EINVAL, "attention: NULL k_base or block table");
	if ((rc = attn_esize(kv->dtype, &esize)) != 0)
		return rc;
	if (!n_heads || !kv->n_kv_heads || n_heads % kv->n_kv_heads)
		return kvt_err(-EINVAL,
			       "attention: n_heads %u must be a positive multiple of n_kv_heads %u",
			       n_heads, kv->n_kv_heads);
	if (!kv->head_dim || !kv->tokens_per_block)
		return kvt_err(-EINVAL, "attention: head_dim %u, tokens_per_block %u must be > 0",
			       kv->head_dim, kv->tokens_per_block);
	if (kv->token_stride < (uint64_t)kv->n_kv_heads * kv->head_dim * esize)
		return kvt_err(-EINVAL, "attention: token_stride %llu < one token's K (%llu bytes)",
			       (unsigned long long)kv->token_stride,
			       (unsigned long long)kv->n_kv_heads * kv->head_dim * esize);
	if ((rc = attn_query_pos(kv->seq_len, t0, t1, decode, &qpos)) != 0)
		return rc;
	pg->base = kv->k_base;
	pg->block_stride = kv->block_stride;
	pg->token_stride = kv->token_stride;
	pg->table = kv->table;
	pg->pos = kv->pos;
	pg->n_entries = kv->n_entries;
	pg->tpb = kv->tokens_per_block;
	return attn_pg_visible(pg, kv->window, kv->sink, qpos, t0, t1);
}

/* Softmax of att[0..n) in place (llama2.c softmax()); *m the max, *l the sum. n >= 1. */
static void
attn_softmax(float *att, uint64_t n, float *m, float *l)
{
	float max_val = att[0], sum = 0.0f;
	uint64_t t;

	for (t = 1; t < n; t++)
		if (att[t] > max_val)
			max_val = att[t];
	for (t = 0; t < n; t++) {
		att[t] = expf(att[t] - max_val);
		sum += att[t];
	}
	for (t = 0; t < n; t++)
		att[t] /= sum;
	*m = max_val;
	*l = sum;
}

/* An empty partial (no visible position): out 0, m -inf, l 0. */
static void
attn_empty(uint32_t n_heads, uint32_t d, float *out, float *m, float *l)
{
	uint32_t h;

	memset(out, 0, (size_t)n_heads * d * sizeof(float));
	for (h = 0; h < n_heads; h++) {
		m[h] = -INFINITY;
		l[h] = 0.0f;
	}
}

/*
 * One query head over the visible positions of pg (n >= 1 of them): att (n floats) receives
 * the probabilities, out (head_dim) the normalised output, *m the max score and *l the softmax
 * denominator. Exactly llama2.c's order; over [0, seq_len) this is its attention loop for one
 * head, and with a window the same loop over the visible positions only.
 */
static void
attn_head(const struct kvt_paged_kv *kv, const struct attn_pg *pg, const float *q, uint32_t kvh,
	  float *att, float *out, float *m, float *l)
{
	enum kvt_dtype dt = kv->dtype;
	size_t esize = dt == KVT_DTYPE_F32 ? 4 : 2;
	uint64_t n = attn_n_visible(pg), t;
	uint64_t hoff = (uint64_t)kvh * kv->head_dim * esize;
	uint32_t i, d = kv->head_dim;
	const unsigned char *k, *v;
	float score, a;

	for (t = 0; t < n; t++) {
		k = attn_row(pg, attn_vpos(pg, t)) + hoff;
		score = 0.0f;
		for (i = 0; i < d; i++)
			score += q[i] * attn_elem(dt, k, i);
		score /= sqrtf((float)d);
		att[t] = score;
	}
	attn_softmax(att, n, m, l);
	/* weighted sum of V */
	memset(out, 0, (size_t)d * sizeof(float));
	for (t = 0; t < n; t++) {
		v = attn_row(pg, attn_vpos(pg, t)) + hoff + kv->v_offset;
		a = att[t];
		for (i = 0; i < d; i++)
			out[i] += a * attn_elem(dt, v, i);
	}
}

int
kvt_attn_decode_ref(const struct kvt_paged_kv *kv, const float *q, uint32_t n_heads,
		    uint64_t seq_len, float *scratch, float *out)
{
	struct attn_pg pg;
	float m, l;
	uint32_t h, kv_mul, d;
	int rc;

	rc = attn_check(kv, q, n_heads, 0, seq_len, 1, scratch, out, &pg);
	if (rc)
		return rc;
	kv_mul = n_heads / kv->n_kv_heads;
	d = kv->head_dim;
	for (h = 0; h < n_heads; h++) /* the query's own position is always visible */
		attn_head(kv, &pg, q + (size_t)h * d, h / kv_mul, scratch, out + (size_t)h * d, &m,
			  &l);
	return 0;
}

int
kvt_attn_partial_ref(const struct kvt_paged_kv *kv, const float *q, uint32_t n_heads,
		     uint64_t t0, uint64_t t1, float *scratch, float *out, float *m, float *l)
{
	struct attn_pg pg;
	uint32_t h, kv_mul, d;
	int rc;

	rc = attn_check(kv, q, n_heads, t0, t1, 0, scratch, out, &pg);
	if (rc)
		return rc;
	if (!m || !l)
		return kvt_err(-EINVAL, "kvt_attn_partial_ref: NULL m or l");
	kv_mul = n_heads / kv->n_kv_heads;
	d = kv->head_dim;
	if (!attn_n_visible(&pg)) {
		attn_empty(n_heads, d, out, m, l);
		return 0;
	}
	for (h = 0; h < n_heads; h++)
		attn_head(kv, &pg, q + (size_t)h * d, h / kv_mul, scratch, out + (size_t)h * d,
			  &m[h], &l[h]);
	return 0;
}

/* ---- MLA latent (absorbed form) ----------------------------------------------------------- */

static int
attn_latent_check(const struct kvt_paged_latent *kv, const float *q_lat, const float *q_pe,
		  uint32_t n_heads, uint64_t t0, uint64_t t1, int decode, float scale,
		  const float *scratch, const float *out, struct attn_pg *pg)
{
	uint64_t qpos;
	size_t esize = 0;
	int rc;

	if (!kv || !q_lat || !scratch || !out)
		return kvt_err(-EINVAL, "latent attention: NULL kv, q_lat, scratch or out");
	if (!kv->base || !kv->table)
		return kvt_err(-EINVAL, "latent attention: NULL base or block table");
	if (kv->rope_dim && !q_pe)
		return kvt_err(-EINVAL, "latent attention: NULL q_pe with rope_dim %u",
			       kv->rope_dim);
	if ((rc = attn_esize(kv->dtype, &esize)) != 0)
		return rc;
	if (!n_heads || !kv->kv_lora_rank || !kv->tokens_per_block)
		return kvt_err(-EINVAL, "latent attention: n_heads %u, kv_lora_rank %u, "
			       "tokens_per_block %u must be > 0", n_heads, kv->kv_lora_rank,
			       kv->tokens_per_block);
	if (kv->token_stride < ((uint64_t)kv->kv_lora_rank + kv->rope_dim) * esize)
		return kvt_err(-EINVAL, "latent attention: token_stride %llu < one latent vector "
			       "(%llu bytes)", (unsigned long long)kv->token_stride,
			       (unsigned long long)((uint64_t)kv->kv_lora_rank + kv->rope_dim) *
				       esize);
	if (!(scale > 0.0f) || !isfinite(scale))
		return kvt_err(-EINVAL, "latent attention: scale %g must be finite and > 0",
			       (double)scale);
	if ((rc = attn_query_pos(kv->seq_len, t0, t1, decode, &qpos)) != 0)
		return rc;
	pg->base = kv->base;
	pg->block_stride = kv->block_stride;
	pg->token_stride = kv->token_stride;
	pg->table = kv->table;
	pg->pos = kv->pos;
	pg->n_entries = kv->n_entries;
	pg->tpb = kv->tokens_per_block;
	return attn_pg_visible(pg, kv->window, kv->sink, qpos, t0, t1);
}

/* One head of the absorbed MLA over the visible positions (n >= 1), the order of attention.h. */
static void
attn_latent_head(const struct kvt_paged_latent *kv, const struct attn_pg *pg, const float *ql,
		 const float *qp, float scale, float *att, float *out, float *m, float *l)
{
	enum kvt_dtype dt = kv->dtype;
	uint64_t n = attn_n_visible(pg), t;
	uint32_t i, r = kv->kv_lora_rank, pe = kv->rope_dim;
	const unsigned char *c;
	float score, a;

	for (t = 0; t < n; t++) {
		c = attn_row(pg, attn_vpos(pg, t));
		score = 0.0f;
		for (i = 0; i < r; i++)
			score += ql[i] * attn_elem(dt, c, i);
		for (i = 0; i < pe; i++)
			score += qp[i] * attn_elem(dt, c, r + i);
		score *= scale;
		att[t] = score;
	}
	attn_softmax(att, n, m, l);
	memset(out, 0, (size_t)r * sizeof(float));
	for (t = 0; t < n; t++) {
		c = attn_row(pg, attn_vpos(pg, t));
		a = att[t];
		for (i = 0; i < r; i++)
			out[i] += a * attn_elem(dt, c, i);
	}
}

int
kvt_attn_latent_decode_ref(const struct kvt_paged_latent *kv, const float *q_lat,
			   const float *q_pe, uint32_t n_heads, uint64_t seq_len, float scale,
			   float *scratch, float *out)
{
	struct attn_pg pg;
	float m, l;
	uint32_t h;
	int rc;

	rc = attn_latent_check(kv, q_lat, q_pe, n_heads, 0, seq_len, 1, scale, scratch, out, &pg);
	if (rc)
		return rc;
	for (h = 0; h < n_heads; h++)
		attn_latent_head(kv, &pg, q_lat + (size_t)h * kv->kv_lora_rank,
				 q_pe ? q_pe + (size_t)h * kv->rope_dim : NULL, scale, scratch,
				 out + (size_t)h * kv->kv_lora_rank, &m, &l);
	return 0;
}

int
kvt_attn_latent_partial_ref(const struct kvt_paged_latent *kv, const float *q_lat,
			    const float *q_pe, uint32_t n_heads, uint64_t t0, uint64_t t1,
			    float scale, float *scratch, float *out, float *m, float *l)
{
	struct attn_pg pg;
	uint32_t h;
	int rc;

	rc = attn_latent_check(kv, q_lat, q_pe, n_heads, t0, t1, 0, scale, scratch, out, &pg);
	if (rc)
		return rc;
	if (!m || !l)
		return kvt_err(-EINVAL, "kvt_attn_latent_partial_ref: NULL m or l");
	if (!attn_n_visible(&pg)) {
		attn_empty(n_heads, kv->kv_lora_rank, out, m, l);
		return 0;
	}
	for (h = 0; h < n_heads; h++)
		attn_latent_head(kv, &pg, q_lat + (size_t)h * kv->kv_lora_rank,
				 q_pe ? q_pe + (size_t)h * kv->rope_dim : NULL, scale, scratch,
				 out + (size_t)h * kv->kv_lora_rank, &m[h], &l[h]);
	return 0;
}

void
kvt_attn_merge(uint32_t n_heads, uint32_t head_dim, float *oa, float *ma, float *la,
	       const float *ob, const float *mb, const float *lb)
{
	uint32_t h, i;
	float mx, wa, wb, sum;
	float *o;

	for (h = 0; h < n_heads; h++) {
		o = oa + (size_t)h * head_dim;
		if (lb[h] == 0.0f) /* b empty: a unchanged */
			continue;
		if (la[h] == 0.0f) { /* a empty: take b */
			memcpy(o, ob + (size_t)h * head_dim, (size_t)head_dim * sizeof(float));
			ma[h] = mb[h];
			la[h] = lb[h];
			continue;
		}
		mx = ma[h] > mb[h] ? ma[h] : mb[h];
		wa = la[h] * expf(ma[h] - mx);
		wb = lb[h] * expf(mb[h] - mx);
		sum = wa + wb;
		for (i = 0; i < head_dim; i++)
			o[i] = (o[i] * wa + ob[(size_t)h * head_dim + i] * wb) / sum;
		ma[h] = mx;
		la[h] = sum;
	}
}
