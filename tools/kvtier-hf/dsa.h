/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-hf/dsa.h - DeepSeek Sparse Attention in kvtier-hf's runner (deepseek_v32, hf.h):
 * where the indexer keys of the stored tokens live, and the selection of the tokens (and so
 * the blocks) one query attends to.
 *
 * The indexer keys. Each token of each layer has, besides its MLA latent (in kvtier's LATENT
 * group), one indexer key of index_head_dim f32 that later queries score. They are a SIDECAR
 * group of the LATENT group (kvhf_model_groups; engine/kvtier.h "SIDECAR groups"):
 * index_head_dim x 4 bytes per token and layer inside the latent's own blocks, so they are
 * demoted, checksummed, parked, stored (the persistent store), restored, shared by prefix and
 * evicted with the latents, never apart from them. run.c:
 *   - writes, at a step's commit, each layer's key of the appended token through the latent's
 *     slot mapping (kvt_group_sidecar's offset in the layer, token (m % tpb) x 4 x dim), in
 *     the batch that stores the latent, before the release;
 *   - reads, per layer at position pos, the keys of positions 0..pos-1 with
 *     kvt_seq_sidecar_read over all the sequence's blocks (the engine's host mirror: no block
 *     is brought up, whatever its tier), the position's own key from the step. A block only on
 *     NVMe whose mirror this engine never filled (after kvt_seq_restore, or a prefix hit on
 *     such a block) answers -EAGAIN: those blocks are found (one-block reads), prepared once
 *     (one-block ranges, at most hbm_slots - 1 per batch; the prepare's read from NVMe fills
 *     the mirror) and the read is retried (kvhf_result.dsa_key_prepared counts them).
 * Costs: the latent's block grows by n_layers x tpb x 4 x index_head_dim bytes (64 B a token
 * and layer here against 160 B of latent) in every tier; the mirror holds the same per block
 * record in host memory (engine/kvtier.h).
 *
 * Selection (transformers' DeepseekV32Indexer, eager): the query at pos scores the keys of
 * positions 0..pos (its own included: the causal mask), kvt_dsa_index_scores_ref; the top
 * min(index_topk, pos + 1) positions are selected, ascending (kvt_topk_blocks: ties to the lower
 * position; transformers' torch.topk leaves ties unspecified, the fixture's min_topk_margin says
 * its reference has none). Positions < index_topk select everything visible.
 */
#ifndef KVHF_DSA_H
#define KVHF_DSA_H

#include <stdint.h>

#include "kvtier.h"

/**
 * hf_dsa_select() - the positions the query at @pos attends to: @keys [pos + 1][dim] (0..pos),
 * the indexer's query @q [n_heads][dim] and head weights @w [n_heads]; @scores [pos + 1]
 * scratch; @out receives min(topk, pos + 1) positions ascending. Returns that count or -EINVAL.
 */
int hf_dsa_select(const float *q, const float *w, uint32_t n_heads, uint32_t dim,
		  const float *keys, uint32_t pos, uint32_t topk, float *scores, uint32_t *out);

#endif /* KVHF_DSA_H */
