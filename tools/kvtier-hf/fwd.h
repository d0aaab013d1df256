/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-hf/fwd.h - the forward passes of hf.h's families, one position at a time, in
 * float32 as transformers computes them (the same operations in the same order as far as a
 * sequential C loop allows; torch sums its matmuls in another order: see the tolerance in
 * tests/test_hf_models.c). Attention is left to the caller, which feeds every attended
 * position's stored K (and V) to kvhf_attn_add in position order.
 */
#ifndef KVHF_FWD_H
#define KVHF_FWD_H

#include "hf.h"

struct kvhf_state {
	float *x;      /* [hidden] residual */
	float *xn;     /* [hidden] normalised */
	float *t1;     /* [max(hidden, inter, heads * v)] scratch */
	float *h1, *h2; /* [inter] */
	float *q;      /* [n_heads][qk dim] query of this position (after rope) */
	float *k, *v;  /* [kv_width] this position's K and V as stored (MLA: latent + k_rope;
	                  v unused) */
	float *acc;    /* [n_heads][v dim] attention accumulator, then output */
	float *mx, *sum; /* [n_heads] online softmax */
	float *kh, *vh; /* MLA: one head's k_nope and v of one position */
	float *logits; /* [vocab] */
	float *qr;     /* deepseek with q_lora_rank: [q_lora_rank] q_a_layernorm(q_a_proj(xn)) */
	float *iq;     /* deepseek_v32: [index_n_heads][index_head_dim] the indexer's query */
	float *iw;     /* [index_n_heads] its head weights (x index_n_heads^-0.5) */
	float *ik;     /* [index_head_dim] this position's indexer key */
	float *gate;   /* [n_heads][head_dim] qwen3_next: the attention output gate */
	/* qwen3_next linear attention (gdn.c): scratch of one layer's step */
	float *lin_proj; /* [2 nk dk + 2 nv dv + 2 nv]: in_proj_qkvz then in_proj_ba */
	float *lin_mix;  /* [2][conv_dim]: the conv input [q | k | v], then its output */
	float *lin_gb;   /* [4][nv]: b, a, g, beta */
	float *lin_core; /* [2 nv dv + 2 dk]: z, the delta rule's output, its scratch */
	int vdim, qkdim;
};

int kvhf_state_init(struct kvhf_state *s, const struct kvhf_model *m);
void kvhf_state_fini(struct kvhf_state *s);

/** kvhf_fwd_embed() - x = embedding of @token (Gemma: times sqrt(hidden)). */
void kvhf_fwd_embed(const struct kvhf_model *m, struct kvhf_state *s, int32_t token);
/** kvhf_fwd_qkv() - layer @l up to q, k, v of position @pos; resets the attention. */
void kvhf_fwd_qkv(const struct kvhf_model *m, struct kvhf_state *s, uint32_t l, uint32_t pos);
/**
 * kvhf_fwd_index() - deepseek_v32's lightning indexer of layer @l at @pos, after kvhf_fwd_qkv
 * (transformers' DeepseekV32Indexer): s->iq = wq_b(q latent) per head, s->ik = k_norm
 * (LayerNorm with bias, eps 1e-6) of wk(xn), both with the default (half-split, not
 * interleaved) rope on their first qk_rope_head_dim channels; s->iw = weights_proj(xn) x
 * index_n_heads^-0.5. Score them with kernels/sparse.h kvt_dsa_index_scores_ref (scale
 * index_head_dim^-0.5).
 */
void kvhf_fwd_index(const struct kvhf_model *m, struct kvhf_state *s, uint32_t l, uint32_t pos);
/** kvhf_attn_add() - one attended position's stored @k / @v (kv_width floats each). */
void kvhf_attn_add(const struct kvhf_model *m, struct kvhf_state *s, uint32_t l, const float *k,
		   const float *v);
/**
 * kvhf_mla_absorb() - MLA's absorbed query of layer @l (kernels/attention.h): q_lat[h] =
 * W_UK[h]^T q_nope[h] ([n_heads][kv_lora_rank]), q_pe[h] the rotated rope part
 * ([n_heads][qk_rope]). After kvhf_fwd_qkv.
 */
void kvhf_mla_absorb(const struct kvhf_model *m, const struct kvhf_state *s, uint32_t l,
		     float *q_lat, float *q_pe);
/**
 * kvhf_attn_set() - the attention output of layer @l from a kernel (normalised): MLA's
 * [n_heads][kv_lora_rank] in latent space, W_UV applied here; else [n_heads][head_dim].
 */
void kvhf_attn_set(const struct kvhf_model *m, struct kvhf_state *s, uint32_t l, const float *out);
/**
 * kvhf_fwd_rest() - normalise the attention, the output gate (qwen3_next), o_proj, norms,
 * residual, then kvhf_fwd_mlp, of layer @l.
 */
void kvhf_fwd_rest(const struct kvhf_model *m, struct kvhf_state *s, uint32_t l);
/** kvhf_fwd_mlp() - the second half of layer @l: pre-MLP norm, SwiGLU / GeGLU, norm, residual. */
void kvhf_fwd_mlp(const struct kvhf_model *m, struct kvhf_state *s, uint32_t l);
/** kvhf_fwd_logits() - final norm, lm_head, final softcapping into s->logits. */
void kvhf_fwd_logits(const struct kvhf_model *m, struct kvhf_state *s);

/**
 * kvhf_fwd_rmsnorm() - o[n] = RMSNorm(x[n]) with weight w: x * rsqrt(mean(x^2) + eps) times w
 * (Llama) or times (1 + w) (Gemma 3, Qwen3-Next: zero-centred). @o may be @x.
 * kvhf_fwd_matvec() - y[d] = W[d][n] x[n] (+ b[d] when not NULL), row-major W, sequential sums.
 */
void kvhf_fwd_rmsnorm(const struct kvhf_model *m, float *o, const float *x, const float *w, int n);
void kvhf_fwd_matvec(float *y, const float *x, const float *w, const float *b, int n, int d);

/*
 * Gated DeltaNet (qwen3_next linear_attention; gdn.c). A linear layer's per-sequence state is
 * two f32 arrays in kernels/linear.h's layouts: conv [conv_dim][K - 1] (the previous K - 1
 * inputs of the short convolution, oldest first) and rec [nv][dk][dv] (the delta rule's
 * matrix), both zero before the sequence's first token. The forward reads and updates them in
 * place and does not care where they live: the runner (run.c) gives a working copy that it
 * loads from and stores into the layer's STATE block in kvtier around each position, the
 * contiguous mode one array per layer kept for the whole run.
 */

/**
 * kvhf_gdn_conv_floats(), kvhf_gdn_rec_floats() - floats of one linear layer's conv / rec state
 * (conv_dim x (K - 1), nv x dk x dv); 0 for a model without linear layers.
 */
uint64_t kvhf_gdn_conv_floats(const struct kvhf_model *m);
uint64_t kvhf_gdn_rec_floats(const struct kvhf_model *m);

/**
 * kvhf_fwd_gdn() - linear-attention layer @l (m->layers[l].linear) of the position whose
 * residual is in s->x, as transformers' Qwen3NextDecoderLayer with Qwen3NextGatedDeltaNet's
 * one-token path: input RMSNorm, in_proj_qkvz / in_proj_ba split per key head
 * (fix_query_key_value_ordering), the conv step with SiLU over [q | k | v]
 * (kvt_conv_step_ref), the gates (kvt_gdn_gates_ref), the gated delta rule with l2-normalised
 * q and k (kvt_gdn_step_ref), the gated RMSNorm per value head (w x norm(o) x silu(z)),
 * out_proj, residual, then kvhf_fwd_mlp. @conv, @rec: the layer's state (above), updated.
 * Returns 0, or a kernel's -EINVAL (shapes the loader accepted never give it).
 */
int kvhf_fwd_gdn(const struct kvhf_model *m, struct kvhf_state *s, uint32_t l, float *conv,
		 float *rec);

#endif /* KVHF_FWD_H */
