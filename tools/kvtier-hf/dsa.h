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
 * min(index_topk, pos + 1) positions are selected, ascending. Exact ties (ReLU zeros, common
 * with few indexer heads) are broken as torch.topk breaks them in the reference's single
 * forward pass over the whole path (hf_torch_topk; run.c passes n_pass = the positions of
 * that pass, n_prompt + gen - 1): its CPU topk is libstdc++'s nth_element, whose choice among
 * equal values depends on the row's length, so a pass of another length (transformers' own
 * per-step greedy passes, or its cached decode) may choose others: gen.py then warns that the
 * argmax of its full pass differs from its greedy path, and no runner can match both (the
 * check says so). Near-ties (below the float error of a sum in another order) are not
 * reproducible: reference.json's min_topk_margin gives the smallest gap. Positions <
 * index_topk select everything visible.
 */
#ifndef KVHF_DSA_H
#define KVHF_DSA_H

#include <stdint.h>

#include "kvtier.h"

/**
 * hf_dsa_select() - the positions the query at @pos attends to: @keys [pos + 1][dim] (0..pos),
 * the indexer's query @q [n_heads][dim] and head weights @w [n_heads]; @scores [pos + 1]
 * scratch; @out receives min(topk, pos + 1) positions ascending. Returns that count or -EINVAL.
 * @n_pass 0: ties go to the lower position (kvt_topk_blocks). @n_pass > 0 (with @work of
 * max(n_pass, pos + 1) x 16 bytes): the choice transformers makes in one forward pass over
 * @n_pass positions, its row @pos masked past @pos (hf_torch_topk), which differs from the
 * lower position only where index scores tie exactly (ReLU zeros: a query whose heads all
 * score a key <= 0 gives it exactly 0).
 */
int hf_dsa_select(const float *q, const float *w, uint32_t n_heads, uint32_t dim,
		  const float *keys, uint32_t pos, uint32_t topk, uint32_t n_pass, float *scores,
		  void *work, uint32_t *out);

/**
 * hf_torch_topk() - the members of torch.topk(row, k) (CPU, float32, largest) where the row is
 * @row [n_valid] followed by n - n_valid entries below every value (a causal mask's finfo.min
 * added): libstdc++'s std::nth_element (k x 64 > n) or std::partial_sort (else) over
 * (value, index) pairs compared by value, as ATen's topk_impl_loop calls them, so that ties
 * are broken as torch breaks them (checked against torch by tools/hf-fixtures/topk_ties.py's
 * fixture: tests/test_hf_dsa.c). @work: n x 16 bytes. @out receives the members below
 * n_valid, ascending (at most min(k, n_valid)); returns their count, or -EINVAL for a NULL
 * pointer, n or k 0, or n_valid > n. A k above n is n.
 */
int hf_torch_topk(const float *row, uint32_t n, uint32_t k, uint32_t n_valid, void *work,
		  uint32_t *out);

#endif /* KVHF_DSA_H */
