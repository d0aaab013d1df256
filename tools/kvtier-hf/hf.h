/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-hf/hf.h - kvtier-hf: Hugging Face transformers models (what save_pretrained
 * writes: config.json + model.safetensors) run in C float32 with their KV only in kvtier
 * (issue 16 item 6, the independent oracle's runner).
 *
 * Families (config.json "model_type"):
 *   gemma3_text   Gemma 3 text: (1 + w) RMSNorms, embedding x sqrt(hidden), q/k norms,
 *                 query_pre_attn_scalar, final logit softcapping (attn_logit_softcapping is
 *                 ignored, as transformers' Gemma 3 attention ignores it), sliding and full
 *                 layers (layer_types, or sliding_window_pattern), local/global rope theta,
 *                 GeGLU (gelu tanh) MLP with pre/post feed-forward norms.
 *   mistral       Llama-style with sliding_window applied in every layer (null = full).
 *   qwen2         the same with q/k/v biases; sliding layers from layer_types (or
 *                 use_sliding_window and max_window_layers).
 *   llama         Llama (full attention), for completeness.
 *   deepseek_v3   MLA (q_lora_rank or a plain q_proj, kv_lora_rank, qk_nope/qk_rope/v head
 *                 dims, interleaved rope when rope_interleave), dense SwiGLU MLP in every layer
 *                 (first_k_dense_replace >= num_hidden_layers; MoE layers are refused).
 *   deepseek_v32  DeepSeek-V3.2, DeepSeek Sparse Attention (transformers 5's
 *                 DeepseekV32Attention / DeepseekV32Indexer, eager): MLA as deepseek_v3
 *                 (q_lora_rank required, interleaved rope) plus per layer a lightning indexer
 *                 (index_topk, index_n_heads, index_head_dim): query wq_b(q latent) per head,
 *                 key k_norm(wk(x)) (LayerNorm with bias, eps 1e-6), both with the default
 *                 half-split rope on their first qk_rope_head_dim channels; score of key t =
 *                 sum_h weights_proj(x)[h] / sqrt(index_n_heads) * relu(q_h . k_t /
 *                 sqrt(index_head_dim)) over the positions 0..pos (causal, its own included);
 *                 the query attends to its top index_topk positions only (all of them while
 *                 pos < index_topk). rope_parameters (default rope_type) give rope_theta;
 *                 head_dim must equal qk_rope_head_dim; mlp_layer_types all "dense".
 *   qwen3_next    Qwen3-Next (transformers' modeling_qwen3_next.py): zero-centred (1 + w)
 *                 RMSNorms, linear_attention layers (Gated DeltaNet: in_proj_qkvz / in_proj_ba
 *                 grouped per key head, causal depthwise conv1d + SiLU over [q | k | v],
 *                 l2-normalised q and k, g = -exp(A_log) softplus(a + dt_bias), beta =
 *                 sigmoid(b), the recurrent gated delta rule, a gated RMSNorm (w, not 1 + w)
 *                 by SiLU(z), out_proj: gdn.c with kernels/linear.h) and full_attention layers
 *                 (layer_types, else every full_attention_interval-th) with q/k norms, an
 *                 output gate (q_proj gives per head [query | gate]; o_proj of attn x
 *                 sigmoid(gate)) and partial rotary (rope_parameters.partial_rotary_factor: the
 *                 first head_dim x factor dims of each head); dense SwiGLU MLP in every layer
 *                 (mlp_only_layers, or num_experts 0; MoE layers are refused).
 * Weights f32, f16 or bf16 (converted to f32 at load); rope_scaling must be null and
 * rope_parameters.rope_type "default" (refused otherwise: none of the yarn/llama3 variants is
 * implemented).
 *
 * KV in kvtier: layer groups (kvhf_model_groups, engine/kvtier.h "Layer groups"): FULL for the
 * full-attention layers, WINDOW (window = sliding_window) for the sliding ones, LATENT for
 * MLA (one K-only vector per token and layer: the normalised latent c_kv (kv_lora_rank) and the
 * roped k_rope (qk_rope_head_dim); V is not stored), ALIAS for KV-shared layers (no storage;
 * kvt_layer_group maps them to their source), STATE for the linear-attention layers (per layer
 * two f32 tensors: the convolution state [conv_dim][K - 1] and the delta rule's matrix
 * [n_v_heads][k_dim][v_dim], kernels/linear.h's layouts; engine/kvtier.h "STATE groups").
 * Attention goes through the kernels of
 * kernels/attention.h: per window of blocks, the group's table (slot ids and block positions)
 * to kvt_attn_partial_ref with the layer's window, or kvt_attn_latent_partial_ref in MLA's
 * absorbed form (q_nope x W_UK, output in latent space, W_UV applied after), partials merged
 * with kvt_attn_merge, the position's own K/V last. deepseek_v32 (tools/kvtier-hf/dsa.h):
 * the indexer keys (index_head_dim f32 per token and layer) in a SIDECAR group of the LATENT
 * group (engine/kvtier.h "SIDECAR groups": inside the latent's blocks, tiered, parked, stored
 * and shared with them), read for scoring with kvt_seq_sidecar_read (no block brought up);
 * per layer the indexer picks the positions, only the blocks holding the stored ones are
 * prepared (one-block ranges, at most hbm_slots - 1 per batch) and only the picked tokens
 * attended, masked within a block (kernels/sparse.h kvt_attn_latent_tokens_partial_ref), the
 * own latent merged when picked; kvhf_result.dsa_* count the blocks read against dense
 * attention's; no contiguous or single-layout mode, no kvhf_run_multi. opts.single_layout
 * keeps the engine's single geometry instead (MLA as the K of a 1-head layout, V allocated
 * unused; every block of a sliding layer kept), for comparison.
 *
 * One position at a time (prompt tokens too), as window.c of kvtier-run does it: per layer,
 * attention over the sequence's stored positions (from pos + 1 - window for a sliding layer)
 * walks windows of at most hbm_slots - 1 blocks of the smallest group (kvt_batch_prepare_ranges,
 * kvt_batch_group_table, kvt_batch_wait_group_layer), then the position's own K/V (kept aside);
 * after the last layer the position is appended (kvt_seq_append_groups) and its K/V of every
 * storing layer stored in one batch holding the last block. A linear-attention layer reads no
 * other position: before the position's layers the runner copies the state after the previous
 * token out of its STATE block (block (pos - 1) / tokens_per_block, zeros at position 0) into
 * a working copy, the layers update the copy in place (fwd.h kvhf_fwd_gdn), and the commit
 * writes it into the appended token's block (a checkpoint when that block is full), in the
 * same batch as the K/V. Errors: 0 or a negative code with kvtr_last_error() set (util.h).
 */
#ifndef KVHF_H
#define KVHF_H

#include <stdint.h>
#include <stdio.h>

#include "kvtier.h"

enum kvhf_family {
	KVHF_LLAMA = 0, /* llama, mistral, qwen2 */
	KVHF_GEMMA3 = 1,
	KVHF_DEEPSEEK = 2,
	KVHF_QWEN3NEXT = 3,
};

/** One layer's weights (f32, row-major [out][in] as torch's Linear). NULL = absent. */
struct kvhf_layer {
	const float *in_norm, *post_attn_norm, *pre_ffn_norm, *post_ffn_norm;
	const float *wq, *wk, *wv, *wo, *bq, *bk, *bv;
	const float *q_norm, *k_norm;              /* gemma3, qwen3_next: [head_dim] */
	const float *q_a, *q_a_norm, *q_b;         /* deepseek: q_lora_rank path */
	const float *kv_a, *kv_a_norm, *kv_b;      /* deepseek: MLA */
	const float *ix_wq_b;                      /* deepseek_v32 indexer: [ih * id][q_lora] */
	const float *ix_wk;                        /* [id][hidden] */
	const float *ix_kn_w, *ix_kn_b;            /* k_norm (LayerNorm, eps 1e-6): [id] */
	const float *ix_wproj;                     /* weights_proj: [ih][hidden] */
	const float *gate, *up, *down;
	int sliding;                               /* 1: attends to the last sliding_window
	                                              positions only */
	float rope_theta;                          /* this layer's rope base */
	int kv_src;                                /* the layer whose K/V this one attends to:
	                                              itself, or (cross-layer KV sharing, Gemma
	                                              3n's num_kv_shared_layers) an earlier layer
	                                              of the same type; its own k/v projections
	                                              are then not used */
	/* qwen3_next linear_attention (Gated DeltaNet; no K/V, no attention weights above) */
	int linear;                                /* 1: a linear-attention layer */
	int lin_idx;                               /* its index among the linear layers (model
	                                              order); -1 for the others */
	const float *qkvz;                         /* in_proj_qkvz [2 nk dk + 2 nv dv][hidden] */
	const float *ba;                           /* in_proj_ba [2 nv][hidden] */
	const float *conv_w;                       /* conv1d.weight [conv_dim][1][K] */
	const float *A_log, *dt_bias;              /* [nv] */
	const float *lin_norm;                     /* the gated RMSNorm's weight [dv] */
	const float *out_proj;                     /* [hidden][nv dv] */
};

/** A loaded model. */
struct kvhf_model {
	enum kvhf_family family;
	char model_type[32];
	int vocab, hidden, inter, n_layers, n_heads, n_kv_heads, head_dim;
	float eps;
	int sliding_window;          /* 0 = none */
	float attn_scale;            /* multiplier of q.k */
	float final_softcap;         /* Gemma's final_logit_softcapping; 0 = off */
	int q_lora_rank, kv_lora_rank, qk_nope, qk_rope, v_head_dim; /* deepseek */
	int rope_interleave;         /* deepseek */
	int dsa;                     /* deepseek_v32: the lightning indexer picks the tokens */
	int index_topk, index_n_heads, index_head_dim; /* deepseek_v32 (ih, id) */
	int rotary_dim;              /* rope dims of each head (its first ones): head_dim, or
	                                qwen3_next's head_dim x partial_rotary_factor */
	int attn_gate;               /* qwen3_next: q_proj gives [query | gate] per head, the
	                                attention output is multiplied by sigmoid(gate) */
	int n_linear;                /* qwen3_next: linear-attention layers */
	int lin_nk, lin_nv, lin_dk, lin_dv; /* linear_num_key/value_heads, _key/value_head_dim */
	int conv_kernel;             /* linear_conv_kernel_dim K */
	int conv_dim;                /* 2 nk dk + nv dv */
	int max_pos;                 /* max_position_embeddings */
	const float *embed, *norm, *lm_head;
	struct kvhf_layer *layers;   /* [n_layers] */
	uint32_t kv_heads_stored, kv_head_dim_stored; /* engine layout (MLA: 1, rank + rope) */
	uint32_t kv_width;           /* floats of one token's K in one layer */
	int kv_shared_layers;        /* the last this many layers read an earlier layer's K/V
	                                (kvhf_model_share_kv); 0 = none */
	/* private */
	float *f32;                  /* all tensors converted to f32 */
	void *tensors;               /* name index */
	uint32_t n_tensors;
};

/** kvhf_model_load() - read DIR/config.json and DIR/model.safetensors. */
int kvhf_model_load(const char *dir, struct kvhf_model **out);
/**
 * kvhf_model_share_kv() - cross-layer KV sharing as Gemma 3n's num_kv_shared_layers (the rule
 * of transformers' Gemma3nTextAttention): the last @n_shared layers store no K/V of their own;
 * layer i of them attends to the K/V of the last layer before them that has the same type
 * (sliding or full). Also read from config.json's num_kv_shared_layers (any family but
 * deepseek_v3). No transformers reference exists for such a model here: the check is against
 * kvhf_run()'s contiguous mode (opts.contiguous). Returns 0, or KVT_EFORMAT when @n_shared
 * leaves no storing layer or a shared layer has no earlier layer of its type, KVT_ENOTSUP for
 * MLA (its latent is per layer).
 */
int kvhf_model_share_kv(struct kvhf_model *m, int n_shared);
/**
 * The model's KV as kvtier layer groups (engine/kvtier.h "Layer groups"), in the order of
 * kvtier-calc's struct kvc_group: FULL (the full-attention layers that store K/V), WINDOW (the
 * sliding ones: window = sliding_window, no sinks), LATENT (deepseek_v3: every layer, one
 * K-only vector of kv_lora_rank + qk_rope_head_dim floats: V is not stored), ALIAS (the
 * KV-shared layers, alias_of = kv_src), STATE (the linear-attention layers: n_state 2, tensor
 * 0 the convolution state [conv_dim][K - 1], tensor 1 the recurrent state [nv][dk][dv], both
 * F32); kinds without layers are left out; then, for deepseek_v32, a SIDECAR group whose
 * parent is the LATENT group: index_head_dim x 4 bytes per token and layer (the indexer's f32
 * key), no per-block bytes. f32 K/V, the layout's tokens_per_block, share 0 (kvhf_run sets
 * the shares; a SIDECAR group has no pool and no share).
 */
#define KVHF_MAX_GROUPS 5
struct kvhf_groups {
	uint32_t n;
	struct kvt_group g[KVHF_MAX_GROUPS];
	uint32_t *layers;            /* the groups' layer lists (g[i].layers point into it) */
	uint32_t *alias_of;          /* the ALIAS group's sources */
};

/**
 * kvhf_model_groups() - fill @gs for @m. Returns 0, -ENOMEM, or -EINVAL (deepseek_v32 without
 * a LATENT group); free with kvhf_groups_free.
 */
int kvhf_model_groups(const struct kvhf_model *m, struct kvhf_groups *gs);
void kvhf_groups_free(struct kvhf_groups *gs);

/**
 * kvhf_group_kv_bytes() - bytes the groups' blocks of @positions tokens take when every block
 * is kept (whole blocks; ALIAS none; STATE one slot of all its layers' states per block, i.e.
 * every checkpoint kept), per group into @per_group when not NULL: the base of the tier
 * fractions and of the capacity shares.
 */
uint64_t kvhf_group_kv_bytes(const struct kvhf_groups *gs, uint32_t tokens_per_block,
			     uint32_t positions, uint64_t *per_group);

/** kvhf_model_free() - NULL ok. */
void kvhf_model_free(struct kvhf_model *m);

/**
 * kvhf_safetensors_f32() - read the tensor @name of the safetensors file @path into a new f32
 * array (*out, free()); *n receives its element count; shape (up to 4 dims) into @shape/@ndim
 * when not NULL. Returns 0, -ENOENT (no such tensor), KVT_EFORMAT (bad file), -ENOMEM, -EIO.
 */
int kvhf_safetensors_f32(const char *path, const char *name, float **out, uint64_t *n,
			 uint64_t *shape, int *ndim);

/** What to run. kvhf_opts_init() gives the defaults. */
struct kvhf_opts {
	const struct kvhf_model *model;
	const int32_t *prompt;       /* prompt ids, n_prompt >= 1 */
	uint32_t n_prompt;
	uint32_t gen;                /* greedy tokens to generate after the prompt */
	uint32_t tokens_per_block;   /* default 16 */
	uint64_t hbm_bytes, host_bytes, nvme_bytes; /* 0 = HBM: twice the sequence's blocks (all
	                                 of it stays in HBM, below the demotion watermark); HOST
	                                 and NVMe: room for all of it */
	float hbm_frac, host_frac;   /* > 0 (instead of hbm_bytes / host_bytes): each group's
	                                pool gets this fraction of the KV the run's sequences hold
	                                in it (whole blocks: all of them for FULL and LATENT, the
	                                window-bound for WINDOW, as kvtier-calc, the 2 live blocks
	                                for STATE), at least 2 HBM and 1 HOST blocks; the shares
	                                follow the HBM sizes */
	int no_host;                 /* 1: no HOST tier */
	const char *nvme_dir;        /* NULL = a temp dir */
	uint32_t park_every;         /* park (to NVMe) and resume the sequence after every this
	                                many positions (a "turn"); 0 = never */
	int prefix_share;            /* 1: a second sequence with the same prompt attaches the
	                                first's blocks (kvt_seq_attach_prefix) and is run too: both
	                                must give the same tokens */
	int persist;                 /* 1: persistent store in nvme_dir (must be given): a child
	                                process (fork) decodes positions [0, stop_after) with the
	                                sequence opened under session_key, parks it to NVMe, drains
	                                (the park is published) and raises SIGKILL (kill -9: no
	                                destroy); this process then opens a new engine on the store,
	                                finds the session (kvt_session_list), restores it
	                                (kvt_seq_restore), decodes the rest, closes and drops it.
	                                A session left under the key by an earlier run is dropped
	                                first */
	uint32_t stop_after;         /* persist: positions before the kill; 0 = n_prompt + gen / 2 */
	uint64_t session_key;        /* persist: default 0x4b56484600000001 */
	int contiguous;              /* 1: no kvtier at all: every layer's K/V of every position
	                                in one plain array, attention over it in position order
	                                (the same float operations in the same order as through
	                                kvtier: logits bit-identical). The reference of models
	                                transformers cannot give one for (kv_shared_layers).
	                                Not with park_every, prefix_share or persist */
	int single_layout;           /* 1: the engine's single layout (no groups): every layer K
	                                and V of kv_heads_stored x kv_head_dim_stored (MLA: the
	                                latent as the K of 1 head, V allocated and unused; sliding
	                                layers keep every block), as before layer groups; not
	                                for qwen3_next (KVT_ENOTSUP: a state has no place in it) */
	uint32_t sessions;           /* kvhf_run_multi: sequences the tiers are sized for
	                                (0: 1, or 2 with prefix_share) */
	const float *shares;         /* NULL: each group's share of every tier in proportion to
	                                its KV (kvhf_group_kv_bytes); else [n_groups] shares */
	uint64_t emu_copy_bytes_per_s; /* the emulated device's copy bandwidth; 0 = unlimited */
	uint32_t emu_lazy;           /* kvt_engine_opts.emu_lazy (--emu-lazy) */
	int report;                  /* 1: fill kvhf_result.mem (slots in use per group after
	                                every position; not with prefix_share or persist) */
	int close_first;             /* prefix_share: close the first sequence before the second
	                                attaches, so the prompt's blocks are held only by the
	                                prefix cache (reuse after the owner left, and past the
	                                window) */
	float *state_out;            /* models with linear-attention layers: when not NULL,
	                                [n_linear][conv + rec floats] (fwd.h "Gated DeltaNet")
	                                receives their state after the last position of the
	                                (first, or restored) sequence as kvtier holds it: read
	                                back from the STATE block of the last token, as a next
	                                position would read it (contiguous: the plain copy) */
	FILE *log;                   /* notes; NULL = stderr */
	int dsa_park_selected;       /* deepseek_v32: in every layer of every step with stored
	                                positions, before the indexer reads the keys and
	                                chooses, park the sequence to NVMe (and drain; not
	                                resumed; checked: every block on NVMe only): the keys
	                                are read from the engine's mirror (the blocks moved
	                                across those reads counted in dsa_key_moved) and each
	                                selected block is read back from NVMe */
	int dsa_prefetch;            /* deepseek_v32, the previous step's selection as the
	                                predictor of the next (kvt_engine_hint_ranges,
	                                steps_ahead 1; the first half, quarter... when a hint
	                                exceeds HBM): 0 none; 1 after every step's commit, the
	                                blocks all its layers' selections read; 2 per layer, one
	                                ahead: when layer l's first window is prepared, the
	                                blocks layer l + 1 read at its last step, and after the
	                                commit those of layer 0 */
	double *pos_s;               /* NULL, or [n_prompt + gen] receiving each position's wall
	                                time in seconds (kvtr_now: the forward pass, the
	                                attention through kvtier, the commit and the hint)
	                                for the positions this process ran */
	int32_t *topk_out;           /* deepseek_v32: NULL, or [n_layers][n_prompt + gen]
	                                [index_topk] receiving the positions the indexer selected
	                                for every layer and position (ascending, -1 padded: a
	                                position p < index_topk - 1 selects p + 1). With
	                                prefix_share the second sequence's overwrite the first's
	                                from the attached positions on; with persist only the
	                                positions after the restore are written (the child's
	                                are lost with it) */
};

/**
 * What one storage group of the engine held (opts.report): slots in use in all its tiers
 * together (kvt_engine_group_stats; a block with copies in two tiers counts twice, so with
 * the default all-in-HBM placement it is the blocks held), after every position.
 */
struct kvhf_group_mem {
	enum kvt_group_kind kind;
	uint32_t n_layers;
	uint64_t block_bytes;        /* the group's slot */
	uint32_t peak_slots;         /* the most slots in use after any position */
	uint32_t end_slots;          /* after the last position */
	uint64_t bound_blocks;       /* kvtier-calc's figure: the blocks a sequence of the run's
	                                positions holds at most (FULL, LATENT ceil(P / tpb);
	                                WINDOW min(that, ceil(sink / tpb) + ceil(window / tpb) +
	                                1); STATE 2: the live blocks, the state read and the one
	                                written, whatever P); ALIAS 0 */
};

/** Results. Free with kvhf_result_free(). */
struct kvhf_result {
	int32_t *tokens;             /* [n_tokens]: prompt then generated */
	uint32_t n_tokens;
	float *logits;               /* [n_tokens - 1][vocab]: logits after each position */
	uint32_t n_logits;
	uint64_t positions;          /* forward passes */
	uint64_t windows;            /* window batches prepared */
	uint64_t parks;              /* park + resume cycles between turns */
	uint64_t prefix_tokens;      /* prefix_share: tokens the second sequence attached */
	uint64_t restored_tokens;    /* persist: tokens of the restored session */
	struct kvt_stats stats;      /* engine counters at the end */
	uint64_t group_moved[KVT_MAX_GROUPS][KVT_MOVE_COUNT]; /* per storage group: its pool's
	                                blocks_moved at the end (kvt_engine_group_stats) */
	struct kvt_geometry geo;     /* slots and block bytes of group 0 (the rest: zero) */
	uint32_t n_groups;           /* the engine's groups */
	struct kvhf_group_mem mem[KVT_MAX_GROUPS]; /* opts.report: per group */
	uint64_t peak_bytes;         /* opts.report: the most bytes in use in all groups and
	                                tiers together after any position */
	uint64_t bound_bytes;        /* sum of bound_blocks x block_bytes */
	/* deepseek_v32: blocks the attention had to have resident (prepared), summed over the
	 * steps (positions; with prefix_share both sequences'), the step's own block left out
	 * (its latent is aside until the step's commit) */
	uint64_t dsa_blocks;         /* per step the distinct blocks any layer's selection read
	                                (a LATENT block holds every layer's latent) */
	uint64_t dense_blocks;       /* per step the blocks dense attention reads: all stored,
	                                ceil(pos / tokens_per_block) */
	uint64_t dsa_layer_blocks;   /* per step and layer the blocks its selection read */
	uint64_t dense_layer_blocks; /* per step and layer ceil(pos / tokens_per_block) */
	uint64_t dsa_parks;          /* opts.dsa_park_selected: parks done */
	uint64_t dsa_key_reads;      /* kvt_seq_sidecar_read calls over all of a sequence's
	                                blocks (per step and layer with stored positions, and
	                                the retries) */
	uint64_t dsa_key_prepared;   /* blocks prepared because their keys answered -EAGAIN
	                                (only on NVMe, never read by this engine: a restore) */
	uint64_t dsa_hinted;         /* opts.dsa_prefetch: blocks of the accepted hints */
	uint64_t dsa_key_moved;      /* opts.dsa_park_selected: blocks the engine moved while
	                                the keys were read (kvt_engine_stats blocks_moved, all
	                                directions, before and after each read) */
	uint64_t touched[KVT_MAX_GROUPS]; /* kvhf_run_multi: distinct blocks of each group the
	                                steps so far read or wrote (per step and session: the
	                                blocks from the first one a layer of the group reads to
	                                the one the position is appended to) */
};

void kvhf_opts_init(struct kvhf_opts *o);
/** kvhf_run() - run; @r zeroed first; free it in every case. */
int kvhf_run(const struct kvhf_opts *o, struct kvhf_result *r);
void kvhf_result_free(struct kvhf_result *r);

/**
 * kvhf_run_multi() - @o->sessions sequences decode together, position by position in lock step
 * (step p runs position p of every session, session 0 first), each fed its own prompt of
 * @o->n_prompt tokens (o->prompt ignored: session s's token i is a fixed function of s and i),
 * with @o's tiers (o->hbm_bytes 0: all resident) and, when @prefetch > 0, a hint of the next
 * @prefetch (at most 8) sessions' blocks (kvt_engine_hint_ranges, steps_ahead 1: from the
 * first block a layer of each reads; the next one alone when they do not fit in HBM) before
 * each session computes, as a server announces its next batches. @hook runs after
 * every step with the engine (for the benchmark's clock and counters). @argmax receives
 * [sessions][n_prompt] the argmax of the logits after every position (the "text" the three
 * runs of the benchmark must agree on); r->mem (slots per group at the end) and r->n_groups
 * are filled. Returns 0 or a negative code (kvtr_last_error()).
 */
int kvhf_run_multi(const struct kvhf_opts *o, int prefetch,
		   void (*hook)(void *arg, struct kvt_engine *e, uint32_t step,
				const struct kvhf_result *r),
		   void *hook_arg, int32_t *argmax, struct kvhf_result *r);

/**
 * kvhf_bench_decode() - the decode benchmark (bench.c): @base->sessions sessions of
 * @base->n_prompt positions, runs (a) resident, (b) offloaded to 1/@ratio of the KV in HBM,
 * (c) the same with prefetch hints, @repeat rounds, measured from step @measure_from (0: the
 * last quarter), emulated copy @bandwidth bytes/s (0: memcpy / 4). Prints the table on
 * stdout; (c) hints @depth sessions ahead. Returns 0, or a negative code (the runs disagree:
 * -EPROTO).
 */
int kvhf_bench_decode(const struct kvhf_opts *base, uint32_t ratio, uint32_t measure_from,
		      uint32_t repeat, uint64_t bandwidth, uint32_t depth);

/** kvhf_memcpy_bw() - the best of 5 memcpy's of 64 MiB, bytes/s (1e9 without the memory). */
double kvhf_memcpy_bw(void);

/**
 * Figures of kvhf_bench_sparse(), per run: (a) resident, (b) HBM 25%, (c) (b) + prefetch of
 * the step's blocks (dsa_prefetch 1), (d) (b) + prefetch one layer ahead (dsa_prefetch 2).
 */
#define KVHF_SPARSE_RUNS 4
struct kvhf_sparse_bench {
	uint32_t context, gen;       /* positions before the measured decode steps, decode steps */
	uint32_t blocks;             /* LATENT blocks of the sequence at the end */
	uint32_t hbm_slots;          /* (b)-(d): the LATENT group's HBM slots */
	double step_ms[KVHF_SPARSE_RUNS]; /* median over the repeats of the mean decode-step
	                                time, ms */
	uint64_t h2d[KVHF_SPARSE_RUNS]; /* HOST -> HBM blocks moved (the last repeat) */
	uint64_t stalls[KVHF_SPARSE_RUNS]; /* engine stalls (the last repeat) */
	uint64_t accesses[KVHF_SPARSE_RUNS], ready[KVHF_SPARSE_RUNS]; /* block accesses, of
	                                those ready (the last repeat) */
	uint64_t hinted[KVHF_SPARSE_RUNS]; /* blocks hinted (the last repeat) */
};

/**
 * kvhf_bench_sparse() - the sparse decode benchmark of issue 17 (bench_sparse.c) on a
 * deepseek_v32 model @base->model (tokens_per_block from @base): one sequence whose first
 * 16 x index_topk positions (the context) are @path[i % @n_path], then @gen greedy decode steps,
 * run (a) all resident, (b) with HBM holding at most 25% of the sequence's blocks at the end
 * (floor, at least 2; the rest in HOST), (c), (d) as (b) with opts.dsa_prefetch 1, 2; @repeat
 * rounds, interleaved; emulated copy @bandwidth bytes/s (0: kvhf_memcpy_bw() / 4). Prints on
 * @out the per-run median of the mean decode-step time, its ratio to (a), the copies, stalls and
 * coverage, and the load average (/proc/loadavg) before and after; @res (NULL ok) receives
 * the figures. Returns 0, -EINVAL (not deepseek_v32, no path, context + gen past
 * max_position_embeddings), -EPROTO (a run's tokens differ from (a)'s), or a run's error.
 */
int kvhf_bench_sparse(const struct kvhf_opts *base, const int32_t *path, uint32_t n_path,
		      uint32_t gen, uint32_t repeat, uint64_t bandwidth, FILE *out,
		      struct kvhf_sparse_bench *res);

/** The reference written by tools/hf-fixtures/gen.py. */
struct kvhf_ref {
	int32_t *prompt;
	uint32_t n_prompt;
	int32_t *gen;
	uint32_t n_gen;
	float *logits;               /* [n_logits][vocab] */
	uint32_t n_logits, vocab;
	double min_margin;
};

/** kvhf_ref_load() - DIR/reference.json and its logits file. */
int kvhf_ref_load(const char *dir, struct kvhf_ref *ref);
/**
 * kvhf_ref_resplit() - make the first @n_prompt tokens of the reference path (prompt, then
 * generated) the prompt and the rest the generated part: the logits are the same (a causal
 * model's logits after position p depend on tokens 0..p only), so a run with a longer prompt
 * checks against the same reference. @n_prompt in [ref->n_prompt, n_prompt + n_gen - 1];
 * returns 0, -EINVAL otherwise, -ENOMEM.
 */
int kvhf_ref_resplit(struct kvhf_ref *ref, uint32_t n_prompt);
void kvhf_ref_free(struct kvhf_ref *ref);

/** kvhf_argmax() - the first index of the largest of @x [n] (the runner's greedy choice). */
int32_t kvhf_argmax(const float *x, int n);

/**
 * kvhf_check() - compare @r with @ref: every token identical (prompt and generated), every
 * logit within @tol (absolute). *max_diff receives the largest absolute difference over the
 * logit rows both paths share: every row, or, when a token differs, the rows of the positions
 * before the first one that does. Returns 0, or KVT_EFORMAT with the message saying what
 * differs (the first differing token's position and both tokens, and whether the reference's
 * own logits chose ours there; else the worst logit and both values).
 */
int kvhf_check(const struct kvhf_ref *ref, const struct kvhf_result *r, double tol,
	       double *max_diff);

/*
 * Logit tolerance of the check (see tests/test_hf_models.c for the measured differences: 2e-6
 * to 1.1e-5 on the committed fixtures, float32 on both sides, sums in other orders). Not a
 * bound for every shape: a Gated DeltaNet model whose state grows large drifts further, and
 * transformers disagrees with itself there too (tools/hf-fixtures/variants.py's
 * qwen3-next-eq-heads, seed 5: its token-by-token cached decode, the recurrent rule kvtier-hf
 * runs, differs from its own full chunked pass by up to 8.3e-4; kvtier-hf from the latter by
 * 6.2e-4). --tol sets another.
 */
#define KVHF_TOL 1e-4

/**
 * kvhf_kv_bytes() - bytes of K/V the engine's layer groups take for @positions tokens of @m
 * with @tokens_per_block (whole blocks of every group, WINDOW groups counted as if they kept
 * every block; LATENT K only; ALIAS nothing): what the tier fractions are taken of. With
 * @positions 1: one block of every group; linear-attention layers store no K/V and count
 * nothing. kvhf_kv_bytes_single() - the same for the single layout (every layer K and V of
 * kv_width floats).
 */
uint64_t kvhf_kv_bytes(const struct kvhf_model *m, uint32_t tokens_per_block,
		       uint32_t positions);
uint64_t kvhf_kv_bytes_single(const struct kvhf_model *m, uint32_t tokens_per_block,
			      uint32_t positions);

#endif /* KVHF_H */
