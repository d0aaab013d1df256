/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-hf/gdn.c - Qwen3-Next's linear-attention layer (Gated DeltaNet) for one position
 * in f32, as transformers' modeling_qwen3_next.py Qwen3NextGatedDeltaNet.forward computes its
 * one-token (cached) path, on a state the caller owns (fwd.h "Gated DeltaNet"). The recurrences
 * themselves are kernels/linear.h's (the C references the GPU kernels are checked against).
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "fwd.h"
#include "kernels/linear.h"
#include "util.h"

uint64_t
kvhf_gdn_conv_floats(const struct kvhf_model *m)
{
	return m->n_linear ? (uint64_t)m->conv_dim * (uint64_t)(m->conv_kernel - 1) : 0;
}

uint64_t
kvhf_gdn_rec_floats(const struct kvhf_model *m)
{
	return m->n_linear ? (uint64_t)m->lin_nv * (uint64_t)m->lin_dk * (uint64_t)m->lin_dv : 0;
}

/*
 * Qwen3NextRMSNormGated over one value head: x * rsqrt(mean(x^2) + eps), times the weight,
 * times silu(z) = z * sigmoid(z) (F.silu), in place over @n floats.
 */
static void
gdn_norm_gated(float *x, const float *z, const float *w, int n, float eps)
{
	float ss = 0.0f, r;

	for (int i = 0; i < n; i++)
		ss += x[i] * x[i];
	r = 1.0f / sqrtf(ss / (float)n + eps);
	for (int i = 0; i < n; i++)
		x[i] = (w[i] * (x[i] * r)) * (z[i] / (1.0f + expf(-z[i])));
}

int
kvhf_fwd_gdn(const struct kvhf_model *m, struct kvhf_state *s, uint32_t l, float *conv,
	     float *rec)
{
	const struct kvhf_layer *L = &m->layers[l];
	const int H = m->hidden, nk = m->lin_nk, nv = m->lin_nv, dk = m->lin_dk, dv = m->lin_dv;
	const int r = nv / nk, per = 2 * dk + 2 * r * dv, kd = nk * dk;
	const struct kvt_conv_shape cs = { .channels = (uint32_t)m->conv_dim,
					   .kernel = (uint32_t)m->conv_kernel,
					   .dtype = KVT_DTYPE_F32, .silu = 1 };
	const struct kvt_gdn_shape gs = { .n_k_heads = (uint32_t)nk, .n_v_heads = (uint32_t)nv,
					  .k_dim = (uint32_t)dk, .v_dim = (uint32_t)dv,
					  .dtype = KVT_DTYPE_F32, .l2norm = 1 };
	float *qkvz = s->lin_proj, *ba = qkvz + (size_t)nk * per;
	float *mix = s->lin_mix, *co = mix + m->conv_dim;
	float *b = s->lin_gb, *a = b + nv, *g = a + nv, *beta = g + nv;
	float *z = s->lin_core, *core = z + (size_t)nv * dv, *scratch = core + (size_t)nv * dv;
	int rc;

	kvhf_fwd_rmsnorm(m, s->xn, s->x, L->in_norm, H);
	kvhf_fwd_matvec(qkvz, s->xn, L->qkvz, NULL, H, nk * per);
	kvhf_fwd_matvec(ba, s->xn, L->ba, NULL, H, 2 * nv);
	/*
	 * fix_query_key_value_ordering: in_proj_qkvz is [nk][q dk | k dk | v r dv | z r dv] and
	 * in_proj_ba [nk][b r | a r]; value head kh * r + j belongs to key head kh. The conv input
	 * is [q of every key head | k of every key head | v of every value head].
	 */
	for (int kh = 0; kh < nk; kh++) {
		const float *p = qkvz + (size_t)kh * per;

		memcpy(mix + kh * dk, p, (size_t)dk * sizeof(float));
		memcpy(mix + kd + kh * dk, p + dk, (size_t)dk * sizeof(float));
		memcpy(mix + 2 * kd + kh * r * dv, p + 2 * dk, (size_t)r * dv * sizeof(float));
		memcpy(z + (size_t)kh * r * dv, p + 2 * dk + r * dv,
		       (size_t)r * dv * sizeof(float));
		memcpy(b + kh * r, ba + 2 * kh * r, (size_t)r * sizeof(float));
		memcpy(a + kh * r, ba + 2 * kh * r + r, (size_t)r * sizeof(float));
	}
	rc = kvt_conv_step_ref(&cs, conv, mix, L->conv_w, NULL, co);
	if (rc == 0)
		rc = kvt_gdn_gates_ref(L->A_log, L->dt_bias, a, b, (uint32_t)nv, g, beta);
	if (rc == 0)
		rc = kvt_gdn_step_ref(&gs, rec, co, co + kd, co + 2 * kd, g, beta, scratch, core);
	if (rc)
		return kvtr_err(rc, "layer %u: Gated DeltaNet kernel: %s", l,
				kvt_last_error_message());
	for (int h = 0; h < nv; h++)
		gdn_norm_gated(core + (size_t)h * dv, z + (size_t)h * dv, L->lin_norm, dv, m->eps);
	kvhf_fwd_matvec(s->t1, core, L->out_proj, NULL, nv * dv, H);
	for (int i = 0; i < H; i++)
		s->x[i] += s->t1[i];
	kvhf_fwd_mlp(m, s, l);
	return 0;
}
