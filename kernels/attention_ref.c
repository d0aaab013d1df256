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

/* Address of the K row of KV head kvh at position t (V is at + v_offset). */
static inline const unsigned char *
attn_k_row(const struct kvt_paged_kv *kv, uint64_t t, uint32_t kvh, size_t esize)
{
	uint32_t slot = kv->table[t / kv->tokens_per_block];

	return (const unsigned char *)kv->k_base + (uint64_t)slot * kv->block_stride +
	       (t % kv->tokens_per_block) * kv->token_stride +
	       (uint64_t)kvh * kv->head_dim * esize;
}

/* Validate the arguments shared by decode and partial. Returns 0 or -EINVAL (with message). */
static int
attn_check(const struct kvt_paged_kv *kv, const float *q, uint32_t n_heads, uint64_t t0,
	   uint64_t t1, const float *scratch, const float *out)
{
	size_t esize;

	if (!kv || !q || !scratch || !out)
		return kvt_err(-EINVAL, "attention: NULL kv, q, scratch or out");
	if (!kv->k_base || !kv->table)
		return kvt_err(-EINVAL, "attention: NULL k_base or block table");
	if (kv->dtype == KVT_DTYPE_F32)
		esize = 4;
	else if (kv->dtype == KVT_DTYPE_F16 || kv->dtype == KVT_DTYPE_BF16)
		esize = 2;
	else
		return kvt_err(-EINVAL, "attention: unsupported K/V dtype %d", (int)kv->dtype);
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
	if (t0 >= t1)
		return kvt_err(-EINVAL, "attention: empty window [%llu, %llu)",
			       (unsigned long long)t0, (unsigned long long)t1);
	return 0;
}

/*
 * One query head over the window [t0, t1): att (t1 - t0 floats) receives the probabilities,
 * out (head_dim) the normalised output, *m the max score and *l the softmax denominator.
 * Exactly llama2.c's order; over [0, seq_len) this is its attention loop for one head.
 */
static void
attn_head(const struct kvt_paged_kv *kv, const float *q, uint32_t kvh, uint64_t t0, uint64_t t1,
	  float *att, float *out, float *m, float *l)
{
	enum kvt_dtype dt = kv->dtype;
	size_t esize = dt == KVT_DTYPE_F32 ? 4 : 2;
	uint64_t n = t1 - t0, t;
	uint32_t i, d = kv->head_dim;
	const unsigned char *k, *v;
	float score, max_val, sum, a;

	for (t = 0; t < n; t++) {
		k = attn_k_row(kv, t0 + t, kvh, esize);
		score = 0.0f;
		for (i = 0; i < d; i++)
			score += q[i] * attn_elem(dt, k, i);
		score /= sqrtf((float)d);
		att[t] = score;
	}
	/* softmax (llama2.c softmax()) */
	max_val = att[0];
	for (t = 1; t < n; t++)
		if (att[t] > max_val)
			max_val = att[t];
	sum = 0.0f;
	for (t = 0; t < n; t++) {
		att[t] = expf(att[t] - max_val);
		sum += att[t];
	}
	for (t = 0; t < n; t++)
		att[t] /= sum;
	/* weighted sum of V */
	memset(out, 0, (size_t)d * sizeof(float));
	for (t = 0; t < n; t++) {
		v = attn_k_row(kv, t0 + t, kvh, esize) + kv->v_offset;
		a = att[t];
		for (i = 0; i < d; i++)
			out[i] += a * attn_elem(dt, v, i);
	}
	*m = max_val;
	*l = sum;
}

int
kvt_attn_decode_ref(const struct kvt_paged_kv *kv, const float *q, uint32_t n_heads,
		    uint64_t seq_len, float *scratch, float *out)
{
	float m, l;
	uint32_t h, kv_mul, d;
	int rc;

	rc = attn_check(kv, q, n_heads, 0, seq_len, scratch, out);
	if (rc)
		return rc;
	kv_mul = n_heads / kv->n_kv_heads;
	d = kv->head_dim;
	for (h = 0; h < n_heads; h++)
		attn_head(kv, q + (size_t)h * d, h / kv_mul, 0, seq_len, scratch,
			  out + (size_t)h * d, &m, &l);
	return 0;
}

int
kvt_attn_partial_ref(const struct kvt_paged_kv *kv, const float *q, uint32_t n_heads,
		     uint64_t t0, uint64_t t1, float *scratch, float *out, float *m, float *l)
{
	uint32_t h, kv_mul, d;
	int rc;

	rc = attn_check(kv, q, n_heads, t0, t1, scratch, out);
	if (rc)
		return rc;
	if (!m || !l)
		return kvt_err(-EINVAL, "kvt_attn_partial_ref: NULL m or l");
	kv_mul = n_heads / kv->n_kv_heads;
	d = kv->head_dim;
	for (h = 0; h < n_heads; h++)
		attn_head(kv, q + (size_t)h * d, h / kv_mul, t0, t1, scratch,
			  out + (size_t)h * d, &m[h], &l[h]);
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
		mx = ma[h] > mb[h] ? ma[h] : mb[h];
		wa = la[h] * expf(ma[h] - mx);
		wb = lb[h] * expf(mb[h] - mx);
		sum = wa + wb;
		o = oa + (size_t)h * head_dim;
		for (i = 0; i < head_dim; i++)
			o[i] = (o[i] * wa + ob[(size_t)h * head_dim + i] * wb) / sum;
		ma[h] = mx;
		la[h] = sum;
	}
}
