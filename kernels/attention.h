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
 * Sliding window and sinks (struct kvt_paged_kv window, sink): the query at position q (decode:
 * q = seq_len - 1) sees key k when q - window < k <= q, or k < sink; window 0 = every k <= q.
 * This is transformers' sliding_window mask (masking_utils.sliding_window_overlay: kv_idx >
 * q_idx - sliding_window, and causal), which tools/kvtier-hf/fwd.c applies (lo = pos + 1 -
 * sliding_window), plus StreamingLLM's sink tokens (Xiao et al. 2023, "Efficient Streaming
 * Language Models with Attention Sinks": the first `sink` tokens stay visible). gpt-oss's learned
 * sinks are not tokens but one logit s_h per head in the softmax denominator: merge a partial
 * (o = 0, m = s_h, l = 1) with kvt_attn_merge() to apply them. The visible keys are read in
 * ascending position order and nothing else is read (no K/V, no table entry of an invisible
 * block), so the result is bit-identical to the loop above over the visible positions only.
 *
 * Block positions (struct kvt_paged_kv pos): with pos == NULL table[b] is the slot of block b
 * (positions b * tpb .. b * tpb + tpb - 1) and the table needs valid entries for visible blocks
 * only; with pos, table[i] is the slot of block pos[i], pos strictly ascending, and it must list
 * every block that holds a visible position of the range attended (the reference checks this).
 *
 * The GPU versions (KVT_WITH_CUDA builds) are declared in kernels/kernels_cuda.h; they compute
 * the same function with fp32 accumulation and match this reference within fp32 rounding.
 *
 * MLA decode in the absorbed form (LATENT layer groups; struct kvt_paged_latent,
 * kvt_attn_latent_*): DeepSeek-V2 (arXiv 2405.04434) sec. 2.1.2-2.1.3 and transformers'
 * DeepseekV3Attention cache per token and layer one vector [c_kv (kv_lora_rank) | k_pe
 * (qk_rope_head_dim)], k_pe already rotated, shared by all heads. With W_UK absorbed into the
 * query (DeepSeek-V2 sec. 2.1.2 "we can absorb W^UK into W^Q"; vLLM's MLA backends and FlashMLA
 * do the same) head h has q_lat[h] = W_UK[h]^T q_nope[h] (kv_lora_rank) and q_pe[h] (rope, rotated):
 *   score_h(t) = (q_lat[h] . c_kv(t) + q_pe[h] . k_pe(t)) * scale
 * which equals q_nope . k_nope + q_pe . k_pe of the expanded model (k_nope = W_UK c_kv) times
 * scale. scale is the caller's: 1/sqrt(qk_nope_head_dim + qk_rope_head_dim), times mscale^2 with
 * YaRN rope scaling (transformers' DeepseekV3Attention: softmax_scale * mscale * mscale). The
 * output stays in latent space: out[h] = sum_t p_h(t) c_kv(t) (kv_lora_rank); the caller applies
 * W_UV (then o_proj): W_UV[h] out[h] = sum_t p_h(t) v_h(t), as the non-absorbed form.
 * Arithmetic, in this order (fp32): s = 0; s += q_lat[i] * c[i] for i ascending; s += q_pe[j] *
 * kpe[j] for j ascending; s *= scale; softmax and the weighted sum as above. Split-KV partials
 * (o [n_heads][kv_lora_rank], m, l) merge with kvt_attn_merge(n_heads, kv_lora_rank, ...).
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
	/* Sliding window and sinks (WINDOW layer groups; all 0 = full attention, as before). */
	uint64_t window;          /* keys visible from the query at q: q - window < k <= q; 0 = all */
	uint64_t sink;            /* with a window: keys k < sink are visible too */
	const uint32_t *pos;      /* NULL: table entry i holds block i (positions i * tpb ..);
				   * else [n_entries] block positions, strictly ascending: entry i
				   * of table holds block pos[i] (the table lists live blocks only) */
	uint32_t n_entries;       /* entries of table and pos when pos != NULL; else ignored */
	uint64_t seq_len;         /* partials: the query sits at seq_len - 1 (for the window);
				   * 0 = t1. Decode uses its own seq_len and refuses another one */
};

/**
 * kvt_attn_decode_ref() - attention of one query token over positions [0, seq_len), of which
 * only the visible ones (window, sink: see above; the query at seq_len - 1) are read.
 * @kv:      paged K/V of one layer.
 * @q:       [n_heads][head_dim] fp32 query.
 * @n_heads: query heads; a multiple of kv->n_kv_heads.
 * @seq_len: tokens to attend over, >= 1.
 * @scratch: >= seq_len floats of work space (attention scores); with a window, the number of
 *           visible positions is enough (<= window + sink).
 * @out:     [n_heads][head_dim] fp32 result.
 * Returns 0 or -EINVAL (with a message): a NULL pointer, n_heads not a positive multiple of
 * n_kv_heads, seq_len 0, head_dim or tokens_per_block 0, token_stride smaller than one token's K,
 * dtype other than F32/F16/BF16, kv->seq_len neither 0 nor seq_len, pos not strictly ascending
 * (or n_entries 0), a visible block missing from pos. The table must cover every visible
 * position; K/V need no particular alignment. Pure function of its inputs; thread-safe.
 */
int kvt_attn_decode_ref(const struct kvt_paged_kv *kv, const float *q, uint32_t n_heads,
			uint64_t seq_len, float *scratch, float *out);

/**
 * kvt_attn_partial_ref() - split-KV partial over positions [t0, t1) (t0 < t1):
 * out [n_heads][head_dim] normalised within the window, m[n_heads] max score, l[n_heads]
 * sum of exp(score - m). @scratch holds >= t1 - t0 floats. Over [0, seq_len) the output is
 * bit-identical to kvt_attn_decode_ref(). With a window only the visible positions of [t0, t1)
 * count (the query at kv->seq_len - 1, or t1 - 1 when kv->seq_len is 0; t1 <= kv->seq_len);
 * when none is visible the partial is empty: out 0, m -INFINITY, l 0, and nothing is read.
 * Returns 0 or -EINVAL (as kvt_attn_decode_ref(); t1 > kv->seq_len).
 */
int kvt_attn_partial_ref(const struct kvt_paged_kv *kv, const float *q, uint32_t n_heads,
			 uint64_t t0, uint64_t t1, float *scratch, float *out, float *m, float *l);

/**
 * kvt_attn_merge() - merge partial b into partial a in place (log-sum-exp rescaling):
 * m = max(ma, mb); la' = la e^(ma-m); lb' = lb e^(mb-m); o = (oa la' + ob lb') / (la' + lb');
 * l = la' + lb'. Shapes as in kvt_attn_partial_ref. An empty partial (l == 0, from a range with
 * no visible position) leaves the other unchanged; two empties stay empty. Otherwise l > 0 and
 * m finite; merging is exact up to fp32 rounding and order-independent in exact arithmetic.
 */
void kvt_attn_merge(uint32_t n_heads, uint32_t head_dim, float *oa, float *ma, float *la,
		    const float *ob, const float *mb, const float *lb);

/**
 * Where one layer's paged MLA latent of one sequence is (a LATENT group): per token one vector
 * of kv_lora_rank + rope_dim elements of @dtype, [c_kv | k_pe], at
 *   base + slot * block_stride + (t % tokens_per_block) * token_stride
 * (slot the table entry of block t / tokens_per_block, as in struct kvt_paged_kv). window, sink,
 * pos, n_entries and seq_len mean what they mean in struct kvt_paged_kv.
 */
struct kvt_paged_latent {
	const void *base;         /* hbm_base + layer * layer_block_bytes */
	uint64_t block_stride;    /* bytes between consecutive slots (block_bytes) */
	uint64_t token_stride;    /* bytes between tokens within a slot, >= one vector */
	const uint32_t *table;    /* slot ids (see struct kvt_paged_kv table, pos) */
	uint32_t tokens_per_block;
	uint32_t kv_lora_rank;    /* c_kv elements (the output's width), >= 1 */
	uint32_t rope_dim;        /* k_pe elements (qk_rope_head_dim), may be 0 */
	enum kvt_dtype dtype;     /* F32, F16 or BF16 */
	uint64_t window;          /* as struct kvt_paged_kv */
	uint64_t sink;
	const uint32_t *pos;
	uint32_t n_entries;
	uint64_t seq_len;
};

/**
 * kvt_attn_latent_decode_ref() - MLA decode attention (absorbed form, see above) of one query
 * token over the visible positions of [0, seq_len).
 * @kv:      paged latent of one layer.
 * @q_lat:   [n_heads][kv_lora_rank] fp32: q_nope of each head multiplied by its W_UK.
 * @q_pe:    [n_heads][rope_dim] fp32, rotated; may be NULL when rope_dim is 0.
 * @n_heads: query heads, >= 1 (all read the one latent).
 * @seq_len: positions, >= 1; the query at seq_len - 1.
 * @scale:   score scale (1/sqrt(qk_nope + qk_rope), x mscale^2 under YaRN), finite and > 0.
 * @scratch: >= seq_len floats (the visible count is enough).
 * @out:     [n_heads][kv_lora_rank] fp32, in latent space (apply W_UV after).
 * Returns 0 or -EINVAL (with a message): NULL pointer, n_heads, kv_lora_rank, tokens_per_block
 * or seq_len 0, token_stride below one vector, bad dtype or scale, pos as kvt_attn_decode_ref().
 * Pure function; thread-safe.
 */
int kvt_attn_latent_decode_ref(const struct kvt_paged_latent *kv, const float *q_lat,
			       const float *q_pe, uint32_t n_heads, uint64_t seq_len, float scale,
			       float *scratch, float *out);

/**
 * kvt_attn_latent_partial_ref() - the split-KV partial of the visible positions of [t0, t1)
 * (query at kv->seq_len - 1, or t1 - 1 when 0): out [n_heads][kv_lora_rank] normalised within
 * the range, m [n_heads], l [n_heads]; empty (out 0, m -INFINITY, l 0) when nothing is visible.
 * Merge partials with kvt_attn_merge(n_heads, kv_lora_rank, ...). Over [0, seq_len) the output is
 * bit-identical to kvt_attn_latent_decode_ref(). @scratch >= t1 - t0 floats.
 * Returns 0 or -EINVAL (as the decode; t0 >= t1; t1 > kv->seq_len; NULL m or l).
 */
int kvt_attn_latent_partial_ref(const struct kvt_paged_latent *kv, const float *q_lat,
				const float *q_pe, uint32_t n_heads, uint64_t t0, uint64_t t1,
				float scale, float *scratch, float *out, float *m, float *l);

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
