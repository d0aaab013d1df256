/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-hf/dsa.h - DeepSeek Sparse Attention in kvtier-hf's runner (deepseek_v32, hf.h):
 * the indexer keys of every stored token (the "sidecar"), and the selection of the tokens (and
 * so the blocks) one query attends to.
 *
 * The sidecar. Each token of each layer has, besides its MLA latent (in kvtier's LATENT
 * group), one indexer key of index_head_dim floats that later queries score. The engine has no
 * SIDECAR groups yet, so the runner keeps them here, per sequence a plain array [n_layers][cap]
 * [dim] in process memory, behind these few calls: open, the row of a position, commit (the
 * token was appended), attach (prefix sharing: the attached tokens' keys are the owner's),
 * save / load (the persistent store: the keys of a parked session, beside the store). Moving
 * them into engine groups later replaces this file's bodies, not its callers. What this does
 * not do that a SIDECAR group would: tier the keys (they stay resident: index_head_dim floats a
 * token and layer, 64 B here against 160 B of latent), or publish them with the engine's park
 * (hf_sidecar_save writes and fsyncs its own file; run.c calls it after the park is drained).
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

#define HF_SIDECAR_SEQS 4 /* sequences one run holds at once (prefix sharing: 2) */

struct hf_sidecar_seq {
	kvt_seq_id seq;       /* 0: free */
	uint32_t n;           /* committed positions */
	float *keys;          /* [n_layers][cap][dim] */
};

struct hf_sidecar {
	uint32_t n_layers, dim, cap; /* cap: positions per sequence */
	struct hf_sidecar_seq s[HF_SIDECAR_SEQS];
};

/** hf_sidecar_init() - room for HF_SIDECAR_SEQS sequences of @cap positions. 0 or -ENOMEM. */
int hf_sidecar_init(struct hf_sidecar *sc, uint32_t n_layers, uint32_t dim, uint32_t cap);
void hf_sidecar_fini(struct hf_sidecar *sc);
/** hf_sidecar_open() - an empty entry for @seq. 0, -EEXIST, -ENOSPC (all entries taken). */
int hf_sidecar_open(struct hf_sidecar *sc, kvt_seq_id seq);
/** hf_sidecar_close() - frees @seq's entry (absent: nothing). */
void hf_sidecar_close(struct hf_sidecar *sc, kvt_seq_id seq);
/**
 * hf_sidecar_row() - where position @pos's key of @layer goes / is: [dim] floats; @pos at most
 * the committed count (the position being computed). NULL when @seq has no entry or @pos is
 * past that or cap. Keys of positions 0..pos are contiguous (stride dim) from row 0.
 */
float *hf_sidecar_row(struct hf_sidecar *sc, kvt_seq_id seq, uint32_t layer, uint32_t pos);
/** hf_sidecar_commit() - position @pos of @seq is stored: n = pos + 1. 0, -ENOENT, -EINVAL. */
int hf_sidecar_commit(struct hf_sidecar *sc, kvt_seq_id seq, uint32_t pos);
/** hf_sidecar_attach() - @dst's first @n keys (every layer) are @src's. 0, -ENOENT, -EINVAL. */
int hf_sidecar_attach(struct hf_sidecar *sc, kvt_seq_id dst, kvt_seq_id src, uint32_t n);
/**
 * hf_sidecar_save() - @seq's committed keys to @path (written to a temporary name, fsynced,
 * renamed); hf_sidecar_load() - into @seq's entry (opened, empty), which then holds the saved
 * count. Both return 0 or a negative code with kvtr_last_error() set (-ENOENT, -EIO,
 * KVT_EFORMAT: not a sidecar file of this geometry).
 */
int hf_sidecar_save(const struct hf_sidecar *sc, kvt_seq_id seq, const char *path);
int hf_sidecar_load(struct hf_sidecar *sc, kvt_seq_id seq, const char *path);

/**
 * hf_dsa_select() - the positions the query at @pos attends to: @keys [pos + 1][dim] (0..pos),
 * the indexer's query @q [n_heads][dim] and head weights @w [n_heads]; @scores [pos + 1]
 * scratch; @out receives min(topk, pos + 1) positions ascending. Returns that count or -EINVAL.
 */
int hf_dsa_select(const float *q, const float *w, uint32_t n_heads, uint32_t dim,
		  const float *keys, uint32_t pos, uint32_t topk, float *scores, uint32_t *out);

#endif /* KVHF_DSA_H */
