/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-run/forward.c - llama2.c's forward pass, split at the KV store so the same
 * arithmetic runs over a contiguous cache or over kvtier's paged blocks. Every loop keeps
 * llama2.c's order of floating-point operations; do not "optimise" them.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "kernels/attention.h"
#include "sampler.h"
#include "util.h"

int
kvtr_state_init(struct kvtr_state *s, const struct kvtr_model *m)
{
	const struct kvtr_config *p = &m->cfg;

	memset(s, 0, sizeof(*s));
	s->x = calloc((size_t)p->dim, sizeof(float));
	s->xb = calloc((size_t)p->dim, sizeof(float));
	s->xb2 = calloc((size_t)p->dim, sizeof(float));
	s->hb = calloc((size_t)p->hidden_dim, sizeof(float));
	s->hb2 = calloc((size_t)p->hidden_dim, sizeof(float));
	s->q = calloc((size_t)p->dim, sizeof(float));
	s->k = calloc(m->kv_dim, sizeof(float));
	s->v = calloc(m->kv_dim, sizeof(float));
	s->att = calloc((size_t)p->n_heads * (size_t)p->seq_len, sizeof(float));
	s->logits = calloc((size_t)p->vocab_size, sizeof(float));
	if (!s->x || !s->xb || !s->xb2 || !s->hb || !s->hb2 || !s->q || !s->k || !s->v ||
	    !s->att || !s->logits) {
		kvtr_state_fini(s);
		return kvtr_err(-ENOMEM, "out of memory for the activations");
	}
	return 0;
}

void
kvtr_state_fini(struct kvtr_state *s)
{
	free(s->x);
	free(s->xb);
	free(s->xb2);
	free(s->hb);
	free(s->hb2);
	free(s->q);
	free(s->k);
	free(s->v);
	free(s->att);
	free(s->logits);
	memset(s, 0, sizeof(*s));
}

int
kvtr_kvcache_init(struct kvtr_kvcache *c, const struct kvtr_model *m)
{
	size_t n = (size_t)m->cfg.n_layers * (size_t)m->cfg.seq_len * m->kv_dim;

	c->dtype = KVT_DTYPE_F32;
	c->k = calloc(n, sizeof(float));
	c->v = calloc(n, sizeof(float));
	if (!c->k || !c->v) {
		kvtr_kvcache_fini(c);
		return kvtr_err(-ENOMEM, "out of memory for a contiguous KV cache (%zu floats)",
				2 * n);
	}
	return 0;
}

void
kvtr_kvcache_fini(struct kvtr_kvcache *c)
{
	free(c->k);
	free(c->v);
	c->k = NULL;
	c->v = NULL;
}

static void
fwd_rmsnorm(float *o, const float *x, const float *weight, int size)
{
	float ss = 0.0f;

	for (int j = 0; j < size; j++)
		ss += x[j] * x[j];
	ss /= size;
	ss += 1e-5f;
	ss = 1.0f / sqrtf(ss);
	for (int j = 0; j < size; j++)
		o[j] = weight[j] * (ss * x[j]);
}

/* W (d,n) @ x (n,) -> xout (d,) */
static void
fwd_matmul(float *xout, const float *x, const float *w, int n, int d)
{
	for (int i = 0; i < d; i++) {
		float val = 0.0f;

		for (int j = 0; j < n; j++)
			val += w[(size_t)i * (size_t)n + (size_t)j] * x[j];
		xout[i] = val;
	}
}

void
kvtr_fwd_embed(const struct kvtr_model *m, struct kvtr_state *s, int32_t token)
{
	size_t dim = (size_t)m->cfg.dim;

	memcpy(s->x, m->w.tok_emb + (size_t)token * dim, dim * sizeof(float));
}

void
kvtr_fwd_qkv(const struct kvtr_model *m, struct kvtr_state *s, uint32_t l, uint32_t pos)
{
	int dim = m->cfg.dim, kv_dim = (int)m->kv_dim, head_size = (int)m->head_size;
	size_t L = l;

	fwd_rmsnorm(s->xb, s->x, m->w.rms_att + L * (size_t)dim, dim);
	fwd_matmul(s->q, s->xb, m->w.wq + L * (size_t)dim * (size_t)dim, dim, dim);
	fwd_matmul(s->k, s->xb, m->w.wk + L * (size_t)dim * (size_t)kv_dim, dim, kv_dim);
	fwd_matmul(s->v, s->xb, m->w.wv + L * (size_t)dim * (size_t)kv_dim, dim, kv_dim);
	/* RoPE: complex-valued rotation of q and k in each head */
	for (int i = 0; i < dim; i += 2) {
		int head_dim = i % head_size;
		float freq = 1.0f / powf(10000.0f, head_dim / (float)head_size);
		float val = (float)pos * freq;
		float fcr = cosf(val);
		float fci = sinf(val);
		int rotn = i < kv_dim ? 2 : 1; /* 2 = q and k, 1 = q only */

		for (int v = 0; v < rotn; v++) {
			float *vec = v == 0 ? s->q : s->k;
			float v0 = vec[i];
			float v1 = vec[i + 1];

			vec[i] = v0 * fcr - v1 * fci;
			vec[i + 1] = v0 * fci + v1 * fcr;
		}
	}
}

void
kvtr_fwd_attn_contig(const struct kvtr_model *m, struct kvtr_state *s,
		     const struct kvtr_kvcache *c, uint32_t l, uint32_t pos)
{
	int kv_dim = (int)m->kv_dim, head_size = (int)m->head_size;
	int kv_mul = m->cfg.n_heads / m->cfg.n_kv_heads;
	size_t loff = (size_t)l * (size_t)m->cfg.seq_len * (size_t)kv_dim;

	for (int h = 0; h < m->cfg.n_heads; h++) {
		const float *q = s->q + h * head_size;
		float *att = s->att + (size_t)h * (size_t)m->cfg.seq_len;
		float *xb = s->xb + h * head_size;

		for (uint32_t t = 0; t <= pos; t++) {
			const float *k = c->k + loff + (size_t)t * (size_t)kv_dim +
					 (size_t)((h / kv_mul) * head_size);
			float score = 0.0f;

			for (int i = 0; i < head_size; i++)
				score += q[i] * k[i];
			score /= sqrtf((float)head_size);
			att[t] = score;
		}
		kvtr_softmax(att, (int32_t)pos + 1);
		memset(xb, 0, (size_t)head_size * sizeof(float));
		for (uint32_t t = 0; t <= pos; t++) {
			const float *v = c->v + loff + (size_t)t * (size_t)kv_dim +
					 (size_t)((h / kv_mul) * head_size);
			float a = att[t];

			for (int i = 0; i < head_size; i++)
				xb[i] += a * v[i];
		}
	}
}

void
kvtr_fwd_ffn(const struct kvtr_model *m, struct kvtr_state *s, uint32_t l)
{
	int dim = m->cfg.dim, hidden_dim = m->cfg.hidden_dim;
	size_t L = l;

	fwd_matmul(s->xb2, s->xb, m->w.wo + L * (size_t)dim * (size_t)dim, dim, dim);
	for (int i = 0; i < dim; i++)
		s->x[i] += s->xb2[i];
	fwd_rmsnorm(s->xb, s->x, m->w.rms_ffn + L * (size_t)dim, dim);
	/* self.w2(F.silu(self.w1(x)) * self.w3(x)) */
	fwd_matmul(s->hb, s->xb, m->w.w1 + L * (size_t)dim * (size_t)hidden_dim, dim, hidden_dim);
	fwd_matmul(s->hb2, s->xb, m->w.w3 + L * (size_t)dim * (size_t)hidden_dim, dim,
		   hidden_dim);
	for (int i = 0; i < hidden_dim; i++)
		s->hb[i] = s->hb[i] * (1.0f / (1.0f + expf(-s->hb[i])));
	for (int i = 0; i < hidden_dim; i++)
		s->hb[i] = s->hb[i] * s->hb2[i];
	fwd_matmul(s->xb, s->hb, m->w.w2 + L * (size_t)dim * (size_t)hidden_dim, hidden_dim, dim);
	for (int i = 0; i < dim; i++)
		s->x[i] += s->xb[i];
}

void
kvtr_fwd_logits(const struct kvtr_model *m, struct kvtr_state *s)
{
	fwd_rmsnorm(s->x, s->x, m->w.rms_final, m->cfg.dim);
	fwd_matmul(s->logits, s->x, m->w.wcls, m->cfg.dim, m->cfg.vocab_size);
}

/* Rounds x[0..n) through @dtype in place, as a store to and load from a kvtier block would. */
static void
fwd_round_kv(enum kvt_dtype dtype, float *x, size_t n)
{
	if (dtype == KVT_DTYPE_F32)
		return;
	for (size_t i = 0; i < n; i++) {
		uint16_t h = 0;

		/* F16/BF16 (checked by kvtr_run): neither call can fail */
		(void)kvt_store_f32(dtype, &h, &x[i], 1);
		(void)kvt_load_f32(dtype, &x[i], &h, 1);
	}
}

void
kvtr_forward_contig(const struct kvtr_model *m, struct kvtr_state *s, struct kvtr_kvcache *c,
		    int32_t token, uint32_t pos)
{
	size_t kv_dim = m->kv_dim;

	kvtr_fwd_embed(m, s, token);
	for (uint32_t l = 0; l < (uint32_t)m->cfg.n_layers; l++) {
		size_t off = ((size_t)l * (size_t)m->cfg.seq_len + pos) * kv_dim;

		kvtr_fwd_qkv(m, s, l, pos);
		memcpy(c->k + off, s->k, kv_dim * sizeof(float));
		memcpy(c->v + off, s->v, kv_dim * sizeof(float));
		fwd_round_kv(c->dtype, c->k + off, kv_dim);
		fwd_round_kv(c->dtype, c->v + off, kv_dim);
		kvtr_fwd_attn_contig(m, s, c, l, pos);
		kvtr_fwd_ffn(m, s, l);
	}
	kvtr_fwd_logits(m, s);
}
