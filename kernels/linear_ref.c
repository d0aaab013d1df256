/* SPDX-License-Identifier: MIT */
/*
 * kernels/linear_ref.c - C reference of the Gated DeltaNet decode steps (see linear.h): the
 * gated delta rule recurrence and the causal short convolution, state updated in place.
 *
 * The loops follow transformers' torch_recurrent_gated_delta_rule and causal_conv1d_update
 * step for step in fp32 (decay, then the memory read, then the rank-1 write, then the output
 * read); state elements of F16/BF16 are widened on load and rounded (to nearest even) on store.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "tiers/base/error.h"
#include "kernels/attention.h"
#include "kernels/linear.h"

/* Element size of a state dtype, 0 when unsupported. */
static size_t
lin_elem_size(enum kvt_dtype dt)
{
	switch (dt) {
	case KVT_DTYPE_F32: return 4;
	case KVT_DTYPE_F16:
	case KVT_DTYPE_BF16: return 2;
	default: return 0;
	}
}

static inline float
lin_load(enum kvt_dtype dt, const unsigned char *base, size_t i)
{
	float f;
	uint16_t h;

	if (dt == KVT_DTYPE_F32) {
		memcpy(&f, base + i * 4, 4);
		return f;
	}
	memcpy(&h, base + i * 2, 2);
	return dt == KVT_DTYPE_F16 ? kvt_f16_to_f32(h) : kvt_bf16_to_f32(h);
}

static inline void
lin_store(enum kvt_dtype dt, unsigned char *base, size_t i, float f)
{
	uint16_t h;

	if (dt == KVT_DTYPE_F32) {
		memcpy(base + i * 4, &f, 4);
		return;
	}
	h = dt == KVT_DTYPE_F16 ? kvt_f32_to_f16(f) : kvt_f32_to_bf16(f);
	memcpy(base + i * 2, &h, 2);
}

static int
gdn_check(const struct kvt_gdn_shape *s)
{
	if (!s)
		return kvt_err(-EINVAL, "gated delta rule: NULL shape");
	if (!s->n_k_heads || !s->n_v_heads || !s->k_dim || !s->v_dim ||
	    s->n_v_heads % s->n_k_heads)
		return kvt_err(-EINVAL, "gated delta rule: n_k_heads %u, n_v_heads %u (a multiple "
			       "of n_k_heads), k_dim %u, v_dim %u must be >= 1", s->n_k_heads,
			       s->n_v_heads, s->k_dim, s->v_dim);
	if (!lin_elem_size(s->dtype))
		return kvt_err(-EINVAL, "gated delta rule: unsupported state dtype %d",
			       (int)s->dtype);
	return 0;
}

uint64_t
kvt_gdn_state_bytes(const struct kvt_gdn_shape *s)
{
	if (!s || !s->n_k_heads || !s->n_v_heads || !s->k_dim || !s->v_dim ||
	    s->n_v_heads % s->n_k_heads || !lin_elem_size(s->dtype))
		return 0;
	return (uint64_t)s->n_v_heads * s->k_dim * s->v_dim * lin_elem_size(s->dtype);
}

/* torch.nn.functional.softplus with beta 1, threshold 20 */
static float
lin_softplus(float x)
{
	return x > 20.0f ? x : log1pf(expf(x));
}

int
kvt_gdn_gates_ref(const float *A_log, const float *dt_bias, const float *a, const float *b,
		  uint32_t n_v_heads, float *g, float *beta)
{
	if (!A_log || !dt_bias || !a || !b || !g || !beta || !n_v_heads)
		return kvt_err(-EINVAL, "gated delta rule gates: NULL pointer or n_v_heads 0");
	for (uint32_t h = 0; h < n_v_heads; h++) {
		g[h] = -expf(A_log[h]) * lin_softplus(a[h] + dt_bias[h]);
		beta[h] = 1.0f / (1.0f + expf(-b[h]));
	}
	return 0;
}

/* dst = x * 1/sqrt(sum x^2 + eps) (when norm), times mul */
static void
lin_l2norm(float *dst, const float *x, uint32_t n, int norm, float mul)
{
	float inv = 1.0f;

	if (norm) {
		float ss = 0.0f;

		for (uint32_t i = 0; i < n; i++)
			ss += x[i] * x[i];
		inv = 1.0f / sqrtf(ss + KVT_GDN_L2NORM_EPS);
	}
	for (uint32_t i = 0; i < n; i++)
		dst[i] = x[i] * inv * mul;
}

int
kvt_gdn_step_ref(const struct kvt_gdn_shape *s, void *state, const float *q, const float *k,
		 const float *v, const float *g, const float *beta, float *scratch, float *out)
{
	int rc = gdn_check(s);

	if (rc)
		return rc;
	if (!state || !q || !k || !v || !g || !beta || !scratch || !out)
		return kvt_err(-EINVAL, "gated delta rule: NULL state, q, k, v, g, beta, scratch "
			       "or out");

	const uint32_t dk = s->k_dim, dv = s->v_dim, group = s->n_v_heads / s->n_k_heads;
	const float qscale = 1.0f / sqrtf((float)dk);
	float *qn = scratch, *kn = scratch + dk;
	unsigned char *st = state;

	for (uint32_t h = 0; h < s->n_v_heads; h++) {
		const uint32_t kh = h / group;
		const size_t base = (size_t)h * dk * dv;
		const float decay = expf(g[h]);

		lin_l2norm(qn, q + (size_t)kh * dk, dk, s->l2norm, qscale);
		lin_l2norm(kn, k + (size_t)kh * dk, dk, s->l2norm, 1.0f);
		/*
		 * Column by column (columns are independent): the decayed S[i][j] (recomputed the
		 * same way in the second loop, so the state is rounded once per step), the memory
		 * read kv_mem = sum_i S[i][j] kn[i], delta, the rank-1 write and the output read.
		 */
		for (uint32_t j = 0; j < dv; j++) {
			float m = 0.0f, o = 0.0f, delta;

			for (uint32_t i = 0; i < dk; i++)
				m += lin_load(s->dtype, st, base + (size_t)i * dv + j) * decay *
				     kn[i];
			delta = (v[(size_t)h * dv + j] - m) * beta[h];
			for (uint32_t i = 0; i < dk; i++) {
				size_t e = base + (size_t)i * dv + j;
				float x = lin_load(s->dtype, st, e) * decay + kn[i] * delta;

				lin_store(s->dtype, st, e, x);
				o += x * qn[i];
			}
			out[(size_t)h * dv + j] = o;
		}
	}
	return 0;
}

static int
conv_check(const struct kvt_conv_shape *s)
{
	if (!s)
		return kvt_err(-EINVAL, "short convolution: NULL shape");
	if (!s->channels || s->kernel < 2 || s->kernel > 64)
		return kvt_err(-EINVAL, "short convolution: channels %u must be >= 1, kernel %u in "
			       "2..64", s->channels, s->kernel);
	if (!lin_elem_size(s->dtype))
		return kvt_err(-EINVAL, "short convolution: unsupported state dtype %d",
			       (int)s->dtype);
	return 0;
}

uint64_t
kvt_conv_state_bytes(const struct kvt_conv_shape *s)
{
	if (!s || !s->channels || s->kernel < 2 || s->kernel > 64 || !lin_elem_size(s->dtype))
		return 0;
	return (uint64_t)s->channels * (s->kernel - 1) * lin_elem_size(s->dtype);
}

int
kvt_conv_step_ref(const struct kvt_conv_shape *s, void *state, const float *x,
		  const float *weight, const float *bias, float *out)
{
	int rc = conv_check(s);

	if (rc)
		return rc;
	if (!state || !x || !weight || !out)
		return kvt_err(-EINVAL, "short convolution: NULL state, x, weight or out");
	if (out == x)
		return kvt_err(-EINVAL, "short convolution: out aliases x");

	const uint32_t km1 = s->kernel - 1;
	unsigned char *st = state;

	for (uint32_t c = 0; c < s->channels; c++) {
		const float *w = weight + (size_t)c * s->kernel;
		const size_t base = (size_t)c * km1;
		float y = bias ? bias[c] : 0.0f;
		float prev = 0.0f;

		for (uint32_t j = 0; j < km1; j++)
			y += w[j] * lin_load(s->dtype, st, base + j);
		y += w[km1] * x[c];
		/* shift left by one, append x */
		for (uint32_t j = 0; j + 1 < km1; j++) {
			prev = lin_load(s->dtype, st, base + j + 1);
			lin_store(s->dtype, st, base + j, prev);
		}
		lin_store(s->dtype, st, base + km1 - 1, x[c]);
		out[c] = s->silu ? y / (1.0f + expf(-y)) : y;
	}
	return 0;
}
