/* SPDX-License-Identifier: MIT */
/*
 * kernels/attention.h - paged decode attention and its helpers (internal, C reference).
 *
 * Paged decode attention for one query token of one sequence, grouped-query attention:
 * query head h reads KV head h / (n_heads / n_kv_heads). K/V are read through a block table of
 * HBM slot ids in the block-first layout of kvtier (see kvtier.h: struct kvt_geometry): the K of
 * token t of layer l is at
 *   k_base + table[t / tokens_per_block] * block_stride + (t % tokens_per_block) * token_stride
 * with k_base = hbm_base + l * layer_block_bytes, and V at the same address + v_offset.
 *
 * Arithmetic (so results are bit-identical to a plain contiguous-KV loop written the same way,
 * llama2.c's run.c): scores[t] = (sum_i q[i] * k[i], i ascending, fp32) / sqrtf(head_dim);
 * softmax: max, then expf(x - max) summed in t order, then divided; out[i] = sum_t p[t] * v[t][i]
 * in t order. K/V of type fp16/bf16 are widened to fp32 before use.
 *
 * Split-KV (FlashDecoding, Dao et al. 2023; the log-sum-exp merge of Milakov & Gimelshein 2018,
 * "Online normalizer calculation for softmax"): a window of positions [t0, t1) yields a partial
 * (o, m, l): o the normalised output over the window, m the max score, l = sum exp(s - m);
 * kvt_attn_merge() combines partials exactly.
 *
 * The GPU versions (KVT_WITH_CUDA builds) are declared in kernels/kernels_cuda.h; they compute
 * the same function with fp32 accumulation and match this reference within fp32 rounding.
 */
#ifndef KVT_KERNELS_ATTENTION_H
#define KVT_KERNELS_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Where one layer's paged K/V of one sequence is. */
struct kvt_paged_kv {
	const void *k_base;       /* hbm_base + layer * layer_block_bytes */
	uint64_t v_offset;        /* V = K + v_offset */
	uint64_t block_stride;    /* bytes between consecutive slots (block_bytes) */
	uint64_t token_stride;    /* bytes between tokens within a slot (token_bytes) */
	const uint32_t *table;    /* [ceil(seq_len / tokens_per_block)] slot ids */
	uint32_t tokens_per_block;
	uint32_t n_kv_heads;
	uint32_t head_dim;
	enum kvt_dtype dtype;     /* F32, F16 or BF16 */
};

/**
 * kvt_attn_decode_ref() - attention of one query token over positions [0, seq_len).
 * @kv:      paged K/V of one layer.
 * @q:       [n_heads][head_dim] fp32 query.
 * @n_heads: query heads; a multiple of kv->n_kv_heads.
 * @seq_len: tokens to attend over, >= 1.
 * @scratch: >= seq_len floats of work space (attention scores).
 * @out:     [n_heads][head_dim] fp32 result.
 * Returns 0 or -EINVAL (with a message): a NULL pointer, n_heads not a positive multiple of
 * n_kv_heads, seq_len 0, head_dim or tokens_per_block 0, token_stride smaller than one token's K,
 * dtype other than F32/F16/BF16. The table must cover every position read; K/V need no
 * particular alignment. Pure function of its inputs; thread-safe.
 */
int kvt_attn_decode_ref(const struct kvt_paged_kv *kv, const float *q, uint32_t n_heads,
			uint64_t seq_len, float *scratch, float *out);

/**
 * kvt_attn_partial_ref() - split-KV partial over positions [t0, t1) (t0 < t1):
 * out [n_heads][head_dim] normalised within the window, m[n_heads] max score, l[n_heads]
 * sum of exp(score - m). @scratch holds >= t1 - t0 floats. Over [0, seq_len) the output is
 * bit-identical to kvt_attn_decode_ref(). Returns 0 or -EINVAL.
 */
int kvt_attn_partial_ref(const struct kvt_paged_kv *kv, const float *q, uint32_t n_heads,
			 uint64_t t0, uint64_t t1, float *scratch, float *out, float *m, float *l);

/**
 * kvt_attn_merge() - merge partial b into partial a in place (log-sum-exp rescaling):
 * m = max(ma, mb); la' = la e^(ma-m); lb' = lb e^(mb-m); o = (oa la' + ob lb') / (la' + lb');
 * l = la' + lb'. Shapes as in kvt_attn_partial_ref. Partials come from non-empty windows (l > 0,
 * m finite); merging is exact up to fp32 rounding and order-independent in exact arithmetic.
 */
void kvt_attn_merge(uint32_t n_heads, uint32_t head_dim, float *oa, float *ma, float *la,
		    const float *ob, const float *mb, const float *lb);

/* Element conversions (round-to-nearest-even), used by the reference kernels and tools. */
uint16_t kvt_f32_to_f16(float f);
float kvt_f16_to_f32(uint16_t h);
uint16_t kvt_f32_to_bf16(float f);
float kvt_bf16_to_f32(uint16_t h);

/** Store n fp32 values as @dtype (F32/F16/BF16) at dst. Returns 0 or -EINVAL. */
int kvt_store_f32(enum kvt_dtype dtype, void *dst, const float *src, size_t n);
/** Load n values of @dtype from src as fp32. Returns 0 or -EINVAL. */
int kvt_load_f32(enum kvt_dtype dtype, float *dst, const void *src, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* KVT_KERNELS_ATTENTION_H */
