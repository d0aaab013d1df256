/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-run/forward.h - the Llama forward pass on the CPU in fp32, with llama2.c's
 * arithmetic in llama2.c's order (run.c's forward()): RMSNorm (eps 1e-5f), matmuls as
 * row-by-row dot products, RoPE with freq = 1 / 10000^(head_dim / head_size) over pairs
 * (i, i+1), grouped-query attention, SwiGLU, residuals, final RMSNorm and the classifier. The
 * same pieces serve two KV stores:
 *   - the reference: a plain contiguous KV cache and llama2.c's own attention loop
 *     (kvtr_forward_contig), the "forward pass that does not use kvtier";
 *   - kvtier blocks: runner.c calls kvtr_fwd_embed, then per layer kvtr_fwd_qkv, stores
 *     s->k / s->v where kvtier says, runs the paged attention (kernels/attention.h) into
 *     s->xb, then kvtr_fwd_ffn; finally kvtr_fwd_logits.
 * Because both use the same operations in the same order on the same fp32 values, greedy
 * decoding gives byte-identical text (and llama2.c's).
 */
#ifndef KVTR_FORWARD_H
#define KVTR_FORWARD_H

#include <stdint.h>

#include "kvtier.h"
#include "model.h"

/** Activations of one sequence during one position (llama2.c's RunState minus the cache). */
struct kvtr_state {
	float *x;      /* [dim] residual stream */
	float *xb;     /* [dim] branch buffer; attention output (n_heads x head_size) */
	float *xb2;    /* [dim] */
	float *hb;     /* [hidden_dim] */
	float *hb2;    /* [hidden_dim] */
	float *q;      /* [dim] query, after RoPE */
	float *k;      /* [kv_dim] key of this position, after RoPE */
	float *v;      /* [kv_dim] value of this position */
	float *att;    /* [n_heads][seq_len] scores (llama2.c); also the paged kernels' scratch */
	float *logits; /* [vocab_size] */
};

/**
 * A contiguous KV cache for the reference path: [n_layers][seq_len][kv_dim] each, fp32. With
 * @dtype F16 or BF16 every stored value is rounded through that type (kvt_store_f32 then
 * kvt_load_f32, kernels/attention.h), so the cache holds exactly what kvtier's paged kernels
 * read back from blocks of that dtype.
 */
struct kvtr_kvcache {
	float *k;             /* keys */
	float *v;             /* values */
	enum kvt_dtype dtype; /* rounding of stored K/V: F32 (none, the default), F16 or BF16 */
};

/** kvtr_state_init() - allocate for @m. Returns 0 or -ENOMEM. */
int kvtr_state_init(struct kvtr_state *s, const struct kvtr_model *m);
/** kvtr_state_fini() - free; the struct is zeroed. */
void kvtr_state_fini(struct kvtr_state *s);

/** kvtr_kvcache_init() - allocate a zeroed contiguous cache of dtype F32 (set c->dtype after
 * to round through F16/BF16). Returns 0 or -ENOMEM. */
int kvtr_kvcache_init(struct kvtr_kvcache *c, const struct kvtr_model *m);
/** kvtr_kvcache_fini() - free; the struct is zeroed. */
void kvtr_kvcache_fini(struct kvtr_kvcache *c);

/** kvtr_fwd_embed() - x = token_embedding[token]. @token in [0, vocab). */
void kvtr_fwd_embed(const struct kvtr_model *m, struct kvtr_state *s, int32_t token);

/**
 * kvtr_fwd_qkv() - layer @l up to the new K/V: xb = rmsnorm(x); q, k, v = matmuls; RoPE at
 * position @pos applied to q (all dim) and k (first kv_dim).
 */
void kvtr_fwd_qkv(const struct kvtr_model *m, struct kvtr_state *s, uint32_t l, uint32_t pos);

/**
 * kvtr_fwd_attn_contig() - llama2.c's attention loop for layer @l at @pos over the contiguous
 * cache (which must already hold this position's K/V): s->xb = attention output.
 */
void kvtr_fwd_attn_contig(const struct kvtr_model *m, struct kvtr_state *s,
			  const struct kvtr_kvcache *c, uint32_t l, uint32_t pos);

/**
 * kvtr_fwd_ffn() - the rest of layer @l, given the attention output in s->xb: output
 * projection, residual, RMSNorm, SwiGLU FFN, residual.
 */
void kvtr_fwd_ffn(const struct kvtr_model *m, struct kvtr_state *s, uint32_t l);

/** kvtr_fwd_logits() - final RMSNorm and classifier into s->logits. */
void kvtr_fwd_logits(const struct kvtr_model *m, struct kvtr_state *s);

/**
 * kvtr_forward_contig() - one whole position on the contiguous cache, exactly llama2.c's
 * forward(token, pos) (with c->dtype F32; otherwise K/V rounded as stored): s->logits is the
 * result. @pos < seq_len, @token < vocab.
 */
void kvtr_forward_contig(const struct kvtr_model *m, struct kvtr_state *s,
			 struct kvtr_kvcache *c, int32_t token, uint32_t pos);

#endif /* KVTR_FORWARD_H */
