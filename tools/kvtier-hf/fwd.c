/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-hf/fwd.c - the families' forward passes in f32 (see fwd.h and hf.h): modelled
 * on transformers 4.57's modeling_llama/mistral/qwen2/gemma3/deepseek_v3 (eager attention),
 * 5's modeling_deepseek_v32 (the indexer's projections; its selection is in dsa.c) and
 * modeling_qwen3_next's full-attention layers (its linear-attention layers: gdn.c).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fwd.h"
#include "util.h"

int
kvhf_state_init(struct kvhf_state *s, const struct kvhf_model *m)
{
	size_t H = (size_t)m->hidden, I = (size_t)m->inter, nh = (size_t)m->n_heads, big;

	memset(s, 0, sizeof(*s));
	if (m->family == KVHF_DEEPSEEK) {
		s->qkdim = m->qk_nope + m->qk_rope;
		s->vdim = m->v_head_dim;
	} else {
		s->qkdim = s->vdim = m->head_dim;
	}
	big = H > I ? H : I;
	if (big < nh * (size_t)s->vdim)
		big = nh * (size_t)s->vdim;
	if (m->attn_gate && big < 2 * nh * (size_t)m->head_dim)
		big = 2 * nh * (size_t)m->head_dim;
	if (big < (size_t)m->q_lora_rank)
		big = (size_t)m->q_lora_rank;
	if (big < m->kv_width)
		big = m->kv_width;
	s->x = calloc(H, sizeof(float));
	s->xn = calloc(H, sizeof(float));
	s->t1 = calloc(big, sizeof(float));
	s->h1 = calloc(I, sizeof(float));
	s->h2 = calloc(I, sizeof(float));
	s->q = calloc(nh * (size_t)s->qkdim, sizeof(float));
	s->k = calloc(m->kv_width, sizeof(float));
	s->v = calloc(m->kv_width, sizeof(float));
	s->acc = calloc(nh * (size_t)s->vdim, sizeof(float));
	s->mx = calloc(nh, sizeof(float));
	s->sum = calloc(nh, sizeof(float));
	s->kh = calloc((size_t)s->qkdim + 1, sizeof(float));
	s->vh = calloc((size_t)s->vdim + 1, sizeof(float));
	s->logits = calloc((size_t)m->vocab, sizeof(float));
	s->qr = calloc((size_t)m->q_lora_rank + 1, sizeof(float));
	s->iq = calloc((size_t)m->index_n_heads * (size_t)m->index_head_dim + 1, sizeof(float));
	s->iw = calloc((size_t)m->index_n_heads + 1, sizeof(float));
	s->ik = calloc(2 * (size_t)m->index_head_dim + 1, sizeof(float));
	s->gate = calloc(nh * (size_t)s->vdim, sizeof(float));
	if (m->n_linear) {
		size_t nk = (size_t)m->lin_nk, nv = (size_t)m->lin_nv;
		size_t dk = (size_t)m->lin_dk, dv = (size_t)m->lin_dv;

		s->lin_proj = calloc(2 * nk * dk + 2 * nv * dv + 2 * nv, sizeof(float));
		s->lin_mix = calloc(2 * (size_t)m->conv_dim, sizeof(float));
		s->lin_gb = calloc(4 * nv, sizeof(float));
		s->lin_core = calloc(2 * nv * dv + 2 * dk, sizeof(float));
	}
	if (!s->qr || !s->iq || !s->iw || !s->ik ||
	    !s->x || !s->xn || !s->t1 || !s->h1 || !s->h2 || !s->q || !s->k || !s->v || !s->acc ||
	    !s->mx || !s->sum || !s->kh || !s->vh || !s->logits || !s->gate ||
	    (m->n_linear && (!s->lin_proj || !s->lin_mix || !s->lin_gb || !s->lin_core))) {
		kvhf_state_fini(s);
		return kvtr_err(-ENOMEM, "out of memory for the activations");
	}
	return 0;
}

void
kvhf_state_fini(struct kvhf_state *s)
{
	free(s->x);
	free(s->xn);
	free(s->t1);
	free(s->h1);
	free(s->h2);
	free(s->q);
	free(s->k);
	free(s->v);
	free(s->acc);
	free(s->mx);
	free(s->sum);
	free(s->kh);
	free(s->vh);
	free(s->logits);
	free(s->qr);
	free(s->iq);
	free(s->iw);
	free(s->ik);
	free(s->gate);
	free(s->lin_proj);
	free(s->lin_mix);
	free(s->lin_gb);
	free(s->lin_core);
	memset(s, 0, sizeof(*s));
}

void
kvhf_fwd_rmsnorm(const struct kvhf_model *m, float *o, const float *x, const float *w, int n)
{
	int zc = m->family == KVHF_GEMMA3 || m->family == KVHF_QWEN3NEXT;
	float ss = 0.0f, r;

	for (int i = 0; i < n; i++)
		ss += x[i] * x[i];
	r = 1.0f / sqrtf(ss / (float)n + m->eps);
	for (int i = 0; i < n; i++)
		o[i] = zc ? (x[i] * r) * (1.0f + w[i]) : w[i] * (x[i] * r);
}

#define fwd_rmsnorm kvhf_fwd_rmsnorm
#define fwd_linear kvhf_fwd_matvec

void
kvhf_fwd_matvec(float *y, const float *x, const float *w, const float *b, int n, int d)
{
	for (int i = 0; i < d; i++) {
		const float *row = w + (size_t)i * (size_t)n;
		float acc = 0.0f;

		for (int j = 0; j < n; j++)
			acc += row[j] * x[j];
		y[i] = b ? acc + b[i] : acc;
	}
}

/*
 * Default rope (rotate_half) of a rotary part of @d at @pos with @theta: ceil(d / 2)
 * frequencies theta^(-2i / d) over the first 2 x ceil(d / 2) elements (transformers' default
 * rope: inv_freq = 1 / base^(arange(0, d, 2) / d), cos/sin of twice that many dims, so an
 * odd d rotates d + 1 elements).
 */
static void
fwd_rope(float *x, int d, uint32_t pos, float theta)
{
	int half = (d + 1) / 2;

	for (int i = 0; i < half; i++) {
		float inv = 1.0f / powf(theta, (float)(2 * i) / (float)d);
		float a = (float)pos * inv, c = cosf(a), s = sinf(a);
		float x0 = x[i], x1 = x[i + half];

		x[i] = x0 * c + (-x1) * s;
		x[i + half] = x1 * c + x0 * s;
	}
}

/* DeepSeek's interleaved rope: de-interleave (x0, x2, ..., x1, x3, ...), then rotate_half. */
static void
fwd_rope_interleave(float *x, float *tmp, int d, uint32_t pos, float theta)
{
	for (int i = 0; i < d / 2; i++) {
		tmp[i] = x[2 * i];
		tmp[i + d / 2] = x[2 * i + 1];
	}
	memcpy(x, tmp, (size_t)d * sizeof(float));
	fwd_rope(x, d, pos, theta);
}

void
kvhf_fwd_embed(const struct kvhf_model *m, struct kvhf_state *s, int32_t token)
{
	const float *e = m->embed + (size_t)token * (size_t)m->hidden;

	if (m->family == KVHF_GEMMA3) {
		float scale = (float)sqrt((double)m->hidden);

		for (int i = 0; i < m->hidden; i++)
			s->x[i] = e[i] * scale;
	} else {
		memcpy(s->x, e, (size_t)m->hidden * sizeof(float));
	}
}

static void
fwd_attn_reset(const struct kvhf_model *m, struct kvhf_state *s)
{
	memset(s->acc, 0, (size_t)m->n_heads * (size_t)s->vdim * sizeof(float));
	for (int h = 0; h < m->n_heads; h++) {
		s->mx[h] = -INFINITY;
		s->sum[h] = 0.0f;
	}
}

void
kvhf_fwd_qkv(const struct kvhf_model *m, struct kvhf_state *s, uint32_t l, uint32_t pos)
{
	const struct kvhf_layer *L = &m->layers[l];
	int H = m->hidden, nh = m->n_heads, hd = m->head_dim, kvd = m->n_kv_heads * hd;

	fwd_rmsnorm(m, s->xn, s->x, L->in_norm, H);
	fwd_attn_reset(m, s);
	if (m->family == KVHF_DEEPSEEK) {
		int qkd = s->qkdim, r = m->kv_lora_rank, dr = m->qk_rope;

		if (m->q_lora_rank) {
			fwd_linear(s->t1, s->xn, L->q_a, NULL, H, m->q_lora_rank);
			fwd_rmsnorm(m, s->qr, s->t1, L->q_a_norm, m->q_lora_rank);
			fwd_linear(s->q, s->qr, L->q_b, NULL, m->q_lora_rank, nh * qkd);
		} else {
			fwd_linear(s->q, s->xn, L->wq, NULL, H, nh * qkd);
		}
		fwd_linear(s->k, s->xn, L->kv_a, NULL, H, r + dr);
		fwd_rmsnorm(m, s->k, s->k, L->kv_a_norm, r);
		for (int h = 0; h < nh; h++) {
			float *qr = s->q + (size_t)h * (size_t)qkd + m->qk_nope;

			if (m->rope_interleave)
				fwd_rope_interleave(qr, s->t1, dr, pos, L->rope_theta);
			else
				fwd_rope(qr, dr, pos, L->rope_theta);
		}
		if (m->rope_interleave)
			fwd_rope_interleave(s->k + r, s->t1, dr, pos, L->rope_theta);
		else
			fwd_rope(s->k + r, dr, pos, L->rope_theta);
		return;
	}
	if (m->attn_gate) { /* Qwen3NextAttention: per head [query | gate] */
		fwd_linear(s->t1, s->xn, L->wq, NULL, H, 2 * nh * hd);
		for (int h = 0; h < nh; h++) {
			memcpy(s->q + h * hd, s->t1 + 2 * h * hd, (size_t)hd * sizeof(float));
			memcpy(s->gate + h * hd, s->t1 + (2 * h + 1) * hd,
			       (size_t)hd * sizeof(float));
		}
	} else {
		fwd_linear(s->q, s->xn, L->wq, L->bq, H, nh * hd);
	}
	fwd_linear(s->k, s->xn, L->wk, L->bk, H, kvd);
	fwd_linear(s->v, s->xn, L->wv, L->bv, H, kvd);
	if (L->q_norm) {
		for (int h = 0; h < nh; h++)
			fwd_rmsnorm(m, s->q + h * hd, s->q + h * hd, L->q_norm, hd);
		for (int h = 0; h < m->n_kv_heads; h++)
			fwd_rmsnorm(m, s->k + h * hd, s->k + h * hd, L->k_norm, hd);
	}
	for (int h = 0; h < nh; h++) /* partial rotary: the first rotary_dim of each head */
		fwd_rope(s->q + h * hd, m->rotary_dim, pos, L->rope_theta);
	for (int h = 0; h < m->n_kv_heads; h++)
		fwd_rope(s->k + h * hd, m->rotary_dim, pos, L->rope_theta);
}

void
kvhf_fwd_index(const struct kvhf_model *m, struct kvhf_state *s, uint32_t l, uint32_t pos)
{
	const struct kvhf_layer *L = &m->layers[l];
	int ih = m->index_n_heads, id = m->index_head_dim, H = m->hidden, dr = m->qk_rope;
	float mean = 0.0f, var = 0.0f, r, hs = 1.0f / sqrtf((float)ih);

	fwd_linear(s->iq, s->qr, L->ix_wq_b, NULL, m->q_lora_rank, ih * id);
	for (int h = 0; h < ih; h++) /* q_rot = the first qk_rope channels, rotate_half */
		fwd_rope(s->iq + (size_t)h * (size_t)id, dr, pos, L->rope_theta);
	fwd_linear(s->ik, s->xn, L->ix_wk, NULL, H, id);
	/* nn.LayerNorm: (x - mean) / sqrt(var + eps) * w + b, biased variance */
	for (int i = 0; i < id; i++)
		mean += s->ik[i];
	mean /= (float)id;
	for (int i = 0; i < id; i++)
		var += (s->ik[i] - mean) * (s->ik[i] - mean);
	var /= (float)id;
	r = 1.0f / sqrtf(var + 1e-6f);
	for (int i = 0; i < id; i++)
		s->ik[i] = (s->ik[i] - mean) * r * L->ix_kn_w[i] + L->ix_kn_b[i];
	fwd_rope(s->ik, dr, pos, L->rope_theta);
	fwd_linear(s->iw, s->xn, L->ix_wproj, NULL, H, ih);
	for (int h = 0; h < ih; h++)
		s->iw[h] *= hs;
}

/* Online softmax: one more score @sc with value @v for head @h. */
static void
fwd_attn_acc(struct kvhf_state *s, int h, float sc, const float *v)
{
	float *acc = s->acc + (size_t)h * (size_t)s->vdim, p;

	if (sc > s->mx[h]) {
		float f = expf(s->mx[h] - sc); /* 0 the first time */

		for (int i = 0; i < s->vdim; i++)
			acc[i] *= f;
		s->sum[h] *= f;
		s->mx[h] = sc;
	}
	p = expf(sc - s->mx[h]);
	s->sum[h] += p;
	for (int i = 0; i < s->vdim; i++)
		acc[i] += p * v[i];
}

void
kvhf_attn_add(const struct kvhf_model *m, struct kvhf_state *s, uint32_t l, const float *k,
	      const float *v)
{
	const struct kvhf_layer *L = &m->layers[l];
	int nh = m->n_heads;

	if (m->family == KVHF_DEEPSEEK) {
		int r = m->kv_lora_rank, dn = m->qk_nope, dv = m->v_head_dim, dr = m->qk_rope;

		for (int h = 0; h < nh; h++) {
			const float *q = s->q + (size_t)h * (size_t)s->qkdim;
			const float *wb = L->kv_b + (size_t)h * (size_t)(dn + dv) * (size_t)r;
			float sc = 0.0f;

			/* k_nope and v of this head: kv_b_proj of the latent */
			fwd_linear(s->kh, k, wb, NULL, r, dn);
			fwd_linear(s->vh, k, wb + (size_t)dn * (size_t)r, NULL, r, dv);
			for (int i = 0; i < dn; i++)
				sc += q[i] * s->kh[i];
			for (int i = 0; i < dr; i++)
				sc += q[dn + i] * k[r + i];
			fwd_attn_acc(s, h, sc * m->attn_scale, s->vh);
		}
		return;
	}
	for (int h = 0; h < nh; h++) {
		int kvh = h / (nh / m->n_kv_heads), hd = m->head_dim;
		const float *q = s->q + (size_t)h * (size_t)hd, *kk = k + (size_t)kvh * (size_t)hd;
		float sc = 0.0f;

		for (int i = 0; i < hd; i++)
			sc += q[i] * kk[i];
		fwd_attn_acc(s, h, sc * m->attn_scale, v + (size_t)kvh * (size_t)hd);
	}
}

void
kvhf_mla_absorb(const struct kvhf_model *m, const struct kvhf_state *s, uint32_t l,
		float *q_lat, float *q_pe)
{
	const struct kvhf_layer *L = &m->layers[l];
	int r = m->kv_lora_rank, dn = m->qk_nope, dv = m->v_head_dim, dr = m->qk_rope;

	for (int h = 0; h < m->n_heads; h++) {
		const float *q = s->q + (size_t)h * (size_t)s->qkdim;
		const float *wk = L->kv_b + (size_t)h * (size_t)(dn + dv) * (size_t)r;
		float *ql = q_lat + (size_t)h * (size_t)r;

		for (int j = 0; j < r; j++)
			ql[j] = 0.0f;
		for (int i = 0; i < dn; i++) /* row i of W_UK[h] is [r] */
			for (int j = 0; j < r; j++)
				ql[j] += q[i] * wk[(size_t)i * (size_t)r + j];
		memcpy(q_pe + (size_t)h * (size_t)dr, q + dn, (size_t)dr * sizeof(float));
	}
}

void
kvhf_attn_set(const struct kvhf_model *m, struct kvhf_state *s, uint32_t l, const float *out)
{
	const struct kvhf_layer *L = &m->layers[l];

	if (m->family == KVHF_DEEPSEEK) {
		int r = m->kv_lora_rank, dn = m->qk_nope, dv = m->v_head_dim;

		for (int h = 0; h < m->n_heads; h++) {
			const float *wv = L->kv_b + ((size_t)h * (size_t)(dn + dv) + (size_t)dn) *
						    (size_t)r;

			fwd_linear(s->acc + (size_t)h * (size_t)dv, out + (size_t)h * (size_t)r, wv,
				   NULL, r, dv);
		}
	} else {
		memcpy(s->acc, out, (size_t)m->n_heads * (size_t)s->vdim * sizeof(float));
	}
	for (int h = 0; h < m->n_heads; h++)
		s->sum[h] = 1.0f;
}

static float
fwd_gelu_tanh(float x)
{
	const float k = 0.7978845608028654f; /* sqrt(2 / pi) */

	return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

void
kvhf_fwd_rest(const struct kvhf_model *m, struct kvhf_state *s, uint32_t l)
{
	const struct kvhf_layer *L = &m->layers[l];
	int H = m->hidden, nv = m->n_heads * s->vdim;

	for (int h = 0; h < m->n_heads; h++)
		for (int i = 0; i < s->vdim; i++)
			s->acc[h * s->vdim + i] /= s->sum[h];
	if (m->attn_gate) /* attn_output * torch.sigmoid(gate) */
		for (int i = 0; i < nv; i++)
			s->acc[i] *= 1.0f / (1.0f + expf(-s->gate[i]));
	fwd_linear(s->t1, s->acc, L->wo, NULL, nv, H);
	if (m->family == KVHF_GEMMA3)
		fwd_rmsnorm(m, s->t1, s->t1, L->post_attn_norm, H);
	for (int i = 0; i < H; i++)
		s->x[i] += s->t1[i];
	kvhf_fwd_mlp(m, s, l);
}

void
kvhf_fwd_mlp(const struct kvhf_model *m, struct kvhf_state *s, uint32_t l)
{
	const struct kvhf_layer *L = &m->layers[l];
	int H = m->hidden, I = m->inter;

	fwd_rmsnorm(m, s->xn, s->x, m->family == KVHF_GEMMA3 ? L->pre_ffn_norm
							     : L->post_attn_norm, H);
	fwd_linear(s->h1, s->xn, L->gate, NULL, H, I);
	fwd_linear(s->h2, s->xn, L->up, NULL, H, I);
	for (int i = 0; i < I; i++) {
		float g = s->h1[i];

		g = m->family == KVHF_GEMMA3 ? fwd_gelu_tanh(g) : g / (1.0f + expf(-g));
		s->h1[i] = g * s->h2[i];
	}
	fwd_linear(s->t1, s->h1, L->down, NULL, I, H);
	if (m->family == KVHF_GEMMA3)
		fwd_rmsnorm(m, s->t1, s->t1, L->post_ffn_norm, H);
	for (int i = 0; i < H; i++)
		s->x[i] += s->t1[i];
}

void
kvhf_fwd_logits(const struct kvhf_model *m, struct kvhf_state *s)
{
	fwd_rmsnorm(m, s->xn, s->x, m->norm, m->hidden);
	fwd_linear(s->logits, s->xn, m->lm_head, NULL, m->hidden, m->vocab);
	if (m->final_softcap > 0.0f)
		for (int i = 0; i < m->vocab; i++)
			s->logits[i] = tanhf(s->logits[i] / m->final_softcap) * m->final_softcap;
}
