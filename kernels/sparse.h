/* SPDX-License-Identifier: MIT */
/*
 * kernels/sparse.h - sparse decode attention (internal, C reference): attention over a selected
 * list of blocks, and the Quest page summary and score that pick such a list (issue 17: SIDECAR
 * groups and sparse selection).
 *
 * Selected-block attention. A decode step that reads only some blocks of a sequence (the
 * blocks holding the top-k tokens of DeepSeek Sparse Attention's lightning indexer, DeepSeek-
 * V3.2-Exp technical report; Quest's top pages; plus the sinks and recent window the caller
 * always wants) passes the block indices it selected, strictly ascending: @blocks[n_blocks],
 * each < ceil(seq_len / tokens_per_block).
 * The tokens attended are the positions of the selected blocks that are < seq_len and visible
 * (kv->window, kv->sink as in attention.h; window 0: all), in ascending order. The arithmetic
 * is that of kvt_attn_decode_ref() (kvt_attn_latent_decode_ref() for MLA) over exactly those
 * tokens, in the same order, so the result is bit-identical to dense attention over a
 * contiguous copy of the same tokens, and to kvt_attn_decode_ref() when every block holding a
 * visible position is selected. Blocks are found through the kvt_paged_kv / kvt_paged_latent
 * conventions: with pos == NULL table[b] is the slot of block b; with pos, the slot of block b
 * is table[i] for pos[i] == b (binary search; a selected block missing from pos is -EINVAL).
 * Only the selected blocks' table entries and K/V rows are read. One selection serves all heads
 * (DSA's indexer picks tokens per query token, shared by the heads; with Quest's per-head
 * scores the caller merges the heads' choices, e.g. the union over a KV head's group).
 *
 * Quest (Tang et al. 2024, "Quest: Query-Aware Sparsity for Efficient Long-Context LLM
 * Inference", arXiv 2406.10774, sec. 3.2-3.3). The summary of a block is, per KV head and
 * channel i, the element-wise min and max of K over the block's tokens (the valid ones: a last
 * partial block has seq_len mod tokens_per_block), stored as fp32:
 *   summary[block][kv_head][0][i] = min_t K[t][kv_head][i], [1][i] = max_t K[t][kv_head][i]
 * i.e. [n_kv_heads][2][head_dim] floats per block. The score of a block for query head h (KV
 * head h / (n_heads / n_kv_heads)) is the upper bound of q . k over the block:
 *   score[h][b] = sum_i max(q[h][i] * min_i, q[h][i] * max_i)   (i ascending, fp32)
 * (no 1/sqrt(head_dim): a positive factor does not change the ranking). For MLA latents the
 * summary is taken over the latent vector [c_kv | k_pe] (one "KV head" of kv_lora_rank +
 * rope_dim channels) and the query is [q_lat | q_pe]; build it with kvt_quest_summary_ref() on
 * a kvt_paged_kv that has n_kv_heads 1 and head_dim kv_lora_rank + rope_dim.
 *
 * The GPU versions (KVT_WITH_CUDA builds) are in kernels/kernels_cuda.h; they match these
 * within fp32 rounding (summaries exactly: min and max round nothing).
 * Every function here is a pure function of its inputs; thread-safe.
 */
#ifndef KVT_KERNELS_SPARSE_H
#define KVT_KERNELS_SPARSE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/attention.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * kvt_attn_select_ref() - GQA decode attention of one query token (at seq_len - 1) over the
 * visible tokens of the selected blocks (see above).
 * @kv:       paged K/V of one layer (attention.h); kv->seq_len 0 or seq_len.
 * @q:        [n_heads][head_dim] fp32.
 * @n_heads:  a positive multiple of kv->n_kv_heads.
 * @seq_len:  positions of the sequence, >= 1.
 * @blocks:   [n_blocks] selected block indices, strictly ascending, each < ceil(seq_len / tpb).
 * @n_blocks: >= 1.
 * @scratch:  >= n_blocks * tokens_per_block floats.
 * @out:      [n_heads][head_dim] fp32. When no selected token is visible (e.g. only blocks
 *            outside the window were selected) out is 0.
 * Returns 0 or -EINVAL (with a message): what kvt_attn_decode_ref() refuses, NULL blocks,
 * n_blocks 0, blocks not strictly ascending or past the sequence, a selected block not in pos.
 */
int kvt_attn_select_ref(const struct kvt_paged_kv *kv, const float *q, uint32_t n_heads,
			uint64_t seq_len, const uint32_t *blocks, uint32_t n_blocks,
			float *scratch, float *out);

/**
 * kvt_attn_latent_select_ref() - MLA decode attention in the absorbed form (attention.h) over
 * the visible tokens of the selected blocks. Arguments as kvt_attn_latent_decode_ref() plus
 * @blocks and @n_blocks as kvt_attn_select_ref(); @scratch >= n_blocks * tokens_per_block
 * floats; out [n_heads][kv_lora_rank] in latent space (0 when no selected token is visible).
 * Returns 0 or -EINVAL (as kvt_attn_latent_decode_ref() and kvt_attn_select_ref()).
 */
int kvt_attn_latent_select_ref(const struct kvt_paged_latent *kv, const float *q_lat,
			       const float *q_pe, uint32_t n_heads, uint64_t seq_len,
			       const uint32_t *blocks, uint32_t n_blocks, float scale,
			       float *scratch, float *out);

/**
 * kvt_attn_latent_tokens_partial_ref() - the split-KV partial (attention.h) of MLA's absorbed
 * attention over an explicit list of token positions: DeepSeek Sparse Attention's selected
 * tokens, which need a mask inside a block (a block may hold selected and unselected tokens;
 * transformers' DeepseekV32Attention attends to the selected ones only). @tokens[n_tokens]
 * strictly ascending, each < kv->seq_len when that is set; the block of token t (t / tpb) is
 * found through table / pos as in kvt_attn_select_ref() and must be there. window and sink
 * are ignored (the list is the visibility). Arithmetic: that of kvt_attn_latent_partial_ref()
 * over the listed tokens in list order, so over a contiguous run of positions it is
 * bit-identical to it. out [n_heads][kv_lora_rank], m and l [n_heads]; n_tokens 0 gives the
 * empty partial (out 0, m -INFINITY, l 0) and reads nothing. @scratch >= n_tokens floats.
 * Returns 0 or -EINVAL (with a message): a NULL pointer (tokens only when n_tokens > 0), a
 * zero dimension, token_stride below one vector, bad dtype or scale, tokens not strictly
 * ascending or past kv->seq_len, pos not strictly ascending, a token's block not in pos.
 */
int kvt_attn_latent_tokens_partial_ref(const struct kvt_paged_latent *kv, const float *q_lat,
				       const float *q_pe, uint32_t n_heads, const uint32_t *tokens,
				       uint32_t n_tokens, float scale, float *scratch, float *out,
				       float *m, float *l);

/**
 * kvt_dsa_index_scores_ref() - DeepSeek Sparse Attention's lightning-indexer scores of one
 * query token against @n keys (transformers' DeepseekV32Indexer, eager path):
 *   scores[t] = sum_h w[h] * relu((q[h] . k[t]) * scale)      (h ascending, i ascending; fp32)
 * @q:       [n_heads][head_dim] the indexer's query (rope applied).
 * @w:       [n_heads] the head weights (weights_proj(x) * n_heads^-0.5).
 * @keys:    [n][key_stride] floats, key t at keys + t * key_stride (its first head_dim used).
 * @scale:   head_dim^-0.5 (the indexer's softmax_scale).
 * @scores:  [n] fp32. The caller masks (causality) by passing only the visible keys, and
 *           picks the top-k with kvt_topk_blocks() (ties to the lower index).
 * Returns 0 or -EINVAL (a NULL pointer, a zero dimension, key_stride < head_dim).
 */
int kvt_dsa_index_scores_ref(const float *q, const float *w, uint32_t n_heads, uint32_t head_dim,
			     float scale, const float *keys, uint64_t key_stride, uint64_t n,
			     float *scores);

/** kvt_quest_summary_floats() - floats of one block's summary: n_kv_heads * 2 * head_dim. */
size_t kvt_quest_summary_floats(uint32_t n_kv_heads, uint32_t head_dim);

/**
 * kvt_quest_summary_ref() - the Quest summaries of the listed blocks of a sequence (see above).
 * @kv:       paged K of one layer (only K is read: v_offset, window, sink are ignored; pos as
 *            in kvt_attn_select_ref()).
 * @seq_len:  positions of the sequence, >= 1 (the last block may be partial).
 * @blocks:   [n_blocks] block indices (any order, repeats allowed), each < ceil(seq_len / tpb).
 * @summary:  [n_blocks][n_kv_heads][2][head_dim] fp32: entry i summarises block blocks[i].
 * Returns 0 or -EINVAL (with a message): a NULL pointer, n_blocks 0, a zero dimension,
 * token_stride below one token's K, a bad dtype, a block past the sequence or not in pos.
 * NaN in K propagates into min and max (fminf/fmaxf would hide it: the comparisons here do not).
 */
int kvt_quest_summary_ref(const struct kvt_paged_kv *kv, uint64_t seq_len,
			  const uint32_t *blocks, uint32_t n_blocks, float *summary);

/**
 * kvt_quest_score_ref() - Quest scores (see above) of @n_blocks summaries for every query head.
 * @summary:  [n_blocks][n_kv_heads][2][head_dim] fp32 (kvt_quest_summary_ref()).
 * @q:        [n_heads][head_dim] fp32; n_heads a positive multiple of n_kv_heads.
 * @scores:   [n_heads][n_blocks] fp32.
 * Returns 0 or -EINVAL (a NULL pointer, a zero count, n_heads not a multiple of n_kv_heads).
 */
int kvt_quest_score_ref(const float *summary, uint32_t n_blocks, uint32_t n_kv_heads,
			uint32_t head_dim, const float *q, uint32_t n_heads, float *scores);

/**
 * kvt_topk_blocks() - the @k highest of @n scores as block indices, ascending (the order
 * kvt_attn_select_ref() wants); ties go to the lower index; NaN scores rank lowest. Token
 * scores work the same way (DSA's top-k tokens for kvt_attn_latent_tokens_partial_ref()). Writes
 * min(k, n) indices to @out and returns that count, or -EINVAL (NULL pointer, n or k 0).
 * O(n k); for the scoring tests and tools, not a hot path.
 */
int kvt_topk_blocks(const float *scores, uint32_t n, uint32_t k, uint32_t *out);

#ifdef __cplusplus
}
#endif

#endif /* KVT_KERNELS_SPARSE_H */
