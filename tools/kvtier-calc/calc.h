/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-calc/calc.h - kvtier-calc, the KV-cache capacity planner: a model's KV geometry
 * (from a Hugging Face config.json or flags) -> bytes per token and per block, totals for a
 * context length and batch, and how many sessions fit in HBM (after the weights), host memory
 * and NVMe.
 *
 * The formula: a layer that stores its own K and V keeps, per token,
 *   MHA/GQA/MQA  n_kv_heads x (head_dim + v_head_dim) x dtype bytes   (= 2 x H_kv x D x bytes)
 *   MLA          (kv_lora_rank + qk_rope_head_dim) x dtype bytes      (latent + rope key; no V)
 * A sliding-window layer keeps at most `window` tokens; a layer that shares another layer's KV
 * (Gemma 3n's num_kv_shared_layers, cross-layer attention) keeps none. So a sequence of S tokens
 * takes sum over layers of min(S, window_l) x layer_token_bytes, which for plain models is the
 * well-known B x H_kv x S x D x 2 x L x bytes (B = batch). A window-aware paged cache rounds
 * each layer's tokens up to whole blocks ("paged"). kvtier's single layout stores every layer
 * of every token in blocks of tokens_per_block, and an NVMe slot is the block plus a 64-byte
 * trailer rounded up to 4 KiB: the sessions that fit are counted with that footprint. With
 * layer groups (issue 16) kvtier keeps one pool per group: struct kvc_group gives each group's
 * slot and the blocks a sequence holds at most (window-bound for WINDOW, latent-only for
 * LATENT, nothing for ALIAS), printed as "kvtier groups".
 * A linear-attention layer (Gated DeltaNet: Qwen3-Next, Qwen3.5) keeps no per-token KV but a
 * fixed-size state per sequence: the causal short convolution's last K - 1 inputs,
 * conv_dim x (K - 1) with conv_dim = 2 x k_heads x k_dim + v_heads x v_dim (q, k and v are
 * convolved together), and the delta rule's matrix state v_heads x k_dim x v_dim
 * (transformers' Qwen3NextGatedDeltaNet: conv_state [batch, conv_dim, K] of which K - 1 carry
 * over, recurrent_state [batch, v_heads, k_dim, v_dim]), in the state dtype. These layers form
 * one STATE group: 2 slots per decoding sequence (its layers' states after the previous
 * token and after this one; engine/kvtier.h "STATE groups"), whatever the context.
 */
#ifndef KVC_CALC_H
#define KVC_CALC_H

#include <stdint.h>
#include <stdio.h>

#define KVC_MAX_LAYERS 1024

/** Attention flavour of the model's KV cache. */
enum kvc_attn { KVC_ATTN_MHA = 0, KVC_ATTN_GQA = 1, KVC_ATTN_MQA = 2, KVC_ATTN_MLA = 3 };

/** A model's KV geometry. 0 in a field means "not given" until kvc_model_finish(). */
struct kvc_model {
	char name[128];           /* model_type / _name_or_path, or "custom" */
	uint32_t n_layers;        /* num_hidden_layers */
	uint32_t n_heads;         /* num_attention_heads */
	uint32_t n_kv_heads;      /* num_key_value_heads (0 = n_heads: MHA) */
	uint32_t hidden;          /* hidden_size */
	uint32_t head_dim;        /* K head dim (0 = hidden / n_heads) */
	uint32_t v_head_dim;      /* V head dim (0 = head_dim) */
	uint32_t kv_lora_rank;    /* MLA latent width; > 0 makes the model MLA */
	uint32_t rope_dim;        /* MLA qk_rope_head_dim (the decoupled rope key) */
	uint32_t sliding_window;  /* window of the sliding layers, tokens (0 = none) */
	uint32_t full_every;      /* > 0 without layer types: layer i is full attention iff
	                             (i + 1) % full_every == 0, the others slide (Gemma 2: 2,
	                             Gemma 3: sliding_window_pattern 6); 0: all slide */
	uint32_t kv_shared_layers; /* the last this many layers reuse earlier layers' KV */
	double kv_dtype_bytes;    /* bytes per stored K/V element (2 for bf16/fp16) */
	double weight_dtype_bytes; /* bytes per weight (torch_dtype; 0 = kv_dtype_bytes) */
	char kv_dtype[16];        /* name of the KV dtype used: "bf16" (default), the config's,
	                             or --kv-dtype's */
	char kv_dtype_why[112];   /* why that one (printed with it): "default", "torch_dtype
	                             bfloat16 in config.json", "--kv-dtype", or the float32
	                             rule of kvc_model_from_json */
	uint8_t layer_sliding[KVC_MAX_LAYERS]; /* 1: layer i uses the sliding window */
	uint8_t layer_linear[KVC_MAX_LAYERS];  /* 1: layer i is linear attention (Gated DeltaNet):
	                             a fixed-size state per sequence, no per-token KV */
	int layer_types_given;    /* 1: layer_sliding / layer_linear were set from the config */
	/* linear attention (Qwen3-Next / Qwen3.5 Gated DeltaNet layers; 0 = none) */
	uint32_t lin_k_heads;     /* linear_num_key_heads */
	uint32_t lin_v_heads;     /* linear_num_value_heads */
	uint32_t lin_k_dim;       /* linear_key_head_dim */
	uint32_t lin_v_dim;       /* linear_value_head_dim */
	uint32_t lin_conv_kernel; /* linear_conv_kernel_dim (0 = 4, transformers' default) */
	uint32_t full_attn_interval; /* without layer_types: layer i is full attention iff
	                             (i + 1) % this == 0, the others linear (Qwen3-Next: 4) */
	double state_dtype_bytes; /* bytes per state element (0 = kv_dtype_bytes) */
	char state_dtype[16];     /* its name ("" = the KV dtype's) */
};

/** What to compute. */
struct kvc_query {
	uint64_t context;          /* tokens per sequence */
	uint64_t batch;            /* sequences */
	uint32_t tokens_per_block; /* kvtier block size in tokens */
	uint64_t hbm_bytes;        /* GPU memory budget (0 = not asked) */
	uint64_t host_bytes;       /* host memory budget for KV (0 = not asked) */
	uint64_t nvme_bytes;       /* NVMe budget for KV (0 = not asked) */
	uint64_t weight_bytes;     /* model weights in HBM; 0 = params x weight dtype */
	double params;             /* parameter count (for the weights); 0 = unknown */
	double hbm_util;           /* fraction of HBM usable for weights + KV (default 1.0) */
};

/*
 * kvtier's layer groups (issue 16; engine/kvtier.h "Layer groups"): the layers that store
 * their own KV form at most three storage groups, FULL (full attention), WINDOW (the sliding
 * layers) and LATENT (MLA: every storing layer), and the KV-shared layers one ALIAS group
 * (no storage). Each storage group is one pool whose slot is exactly the group's block:
 * n_layers x tokens_per_block x (K + V token bytes of one layer). A sequence of S tokens
 * holds at most ceil(S / tpb) blocks of a FULL or LATENT group and
 * min(ceil(S / tpb), ceil(sink / tpb) + ceil(window / tpb) + 1) of a WINDOW group (the window
 * of the next query, q - window < k <= q, spans at most ceil(window / tpb) + 1 blocks; sinks
 * are whole blocks of their own): the bound the engine's default capacity split and its
 * dropping of out-of-window blocks work with. tools/kvtier-hf builds the same groups for the
 * models it runs (tests/test_hf_models.c checks that its engine allocates these figures).
 */
enum kvc_group_kind {
	KVC_GROUP_FULL = 0,
	KVC_GROUP_WINDOW = 1,
	KVC_GROUP_LATENT = 2,
	KVC_GROUP_ALIAS = 3,
	KVC_GROUP_STATE = 4,
};
#define KVC_MAX_GROUPS 5

/** One group's figures for one sequence of the query's context. */
struct kvc_group {
	enum kvc_group_kind kind;
	uint32_t n_layers;         /* model layers in the group */
	uint32_t window;           /* WINDOW: tokens; else 0 */
	uint32_t sink;             /* WINDOW: sink tokens (0: configs give none); else 0 */
	double layer_token_bytes;  /* one token of one layer (K + V; LATENT: the latent);
	                              ALIAS, STATE 0 */
	double layer_state_bytes;  /* STATE: one layer's state of one sequence; else 0 */
	double block_bytes;        /* the pool's slot: n_layers x tpb x layer_token_bytes
	                              (STATE: n_layers x layer_state_bytes, one state) */
	uint64_t max_blocks;       /* blocks one sequence of `context` tokens holds at most
	                              (STATE: 2, the live slots) */
	double seq_bytes;          /* max_blocks x block_bytes */
	double seq_token_bytes;    /* the tokens themselves, no block rounding: min(context,
	                              window + sink) (WINDOW) or context tokens x n_layers x
	                              layer_token_bytes */
	uint64_t nvme_slot_bytes;  /* 4096 + round_up(block_bytes, 4096); ALIAS 0 */
};

/** The answers. Bytes are exact (double where fractional dtypes are possible). */
struct kvc_result {
	enum kvc_attn attn;         /* flavour */
	uint32_t kv_layers;         /* layers that store their own KV (not linear, not shared) */
	uint32_t sliding_layers;    /* of those, sliding-window ones */
	uint32_t linear_layers;     /* linear-attention layers (state, no per-token KV) */
	double layer_state_bytes;   /* one linear layer's state of one sequence */
	double seq_state_bytes;     /* all linear layers' states of one sequence (context-free) */
	double state_tokens;        /* seq_state_bytes / token_bytes: the attention tokens whose
	                               KV weighs as much as one sequence's state */
	double layer_token_bytes;   /* one layer, one token */
	double token_bytes;         /* all KV layers, one token, no window (the formula's) */
	double block_bytes;         /* token_bytes x tokens_per_block */
	double seq_bytes;           /* one sequence of `context` tokens, windows honoured, plus
	                               seq_state_bytes (so also seq_paged_bytes and
	                               seq_full_bytes) */
	double seq_paged_bytes;     /* the same, each layer rounded up to whole blocks */
	double seq_full_bytes;      /* one sequence without windows and sharing (what a cache
	                               that ignores them would take) */
	uint64_t seq_blocks;        /* kvtier blocks of one sequence: ceil(context / tpb) */
	uint64_t nvme_slot_bytes;   /* kvtier NVMe slot: 4096 + round_up(block_bytes, 4096) (the
	                               header page, then the block: kvt_fmt_slot_bytes) */
	double seq_kvtier_bytes;    /* kvtier footprint in HBM or host: seq_blocks x block, plus
	                               seq_state_bytes (the sessions that fit count both) */
	double seq_nvme_bytes;      /* kvtier footprint on NVMe: seq_blocks x NVMe slot, plus
	                               the state's slot (4096 + its bytes rounded up to 4 KiB) */
	double batch_bytes;         /* seq_bytes x batch */
	double batch_paged_bytes;   /* seq_paged_bytes x batch */
	double weight_bytes;        /* weights in HBM */
	double hbm_kv_bytes;        /* HBM left for KV: hbm x util - weights (>= 0) */
	uint64_t fit_hbm;           /* sessions of `context` tokens that fit there (kvtier) */
	uint64_t fit_host;          /* ... in the host budget */
	uint64_t fit_nvme;          /* ... in the NVMe budget */
	uint64_t fit_total;         /* sum */
	/* kvtier with layer groups (see struct kvc_group) */
	uint32_t n_groups;          /* groups, in the order FULL, WINDOW, LATENT, ALIAS, STATE
	                               (absent kinds skipped) */
	struct kvc_group groups[KVC_MAX_GROUPS];
	double seq_group_bytes;     /* sum of the groups' seq_bytes: what one sequence holds at
	                               most in all tiers together (each block counted once) */
	double seq_group_token_bytes; /* sum of seq_token_bytes */
	double seq_common_slot_bytes; /* the same blocks in one pool with a common slot (the
	                                largest group's block, vLLM's page-size unification):
	                                sum of max_blocks x that slot; the per-group pools' saving
	                                is this minus seq_group_bytes */
};

/** kvc_model_init() - zero @m (no layer sliding, no sharing, 2-byte KV named "bf16", why
 * "default"). */
void kvc_model_init(struct kvc_model *m);

/**
 * kvc_model_from_json() - read a Hugging Face config.json text into @m (fields the config does
 * not have are left as they are). Understands text_config nesting (multimodal configs), the
 * usual aliases (n_layer, n_head, num_kv_heads, multi_query, n_embd), kv_lora_rank and
 * qk_rope_head_dim (MLA), sliding_window with use_sliding_window, layer_types,
 * sliding_window_pattern (Gemma 3) or model_type gemma2 (alternating), num_kv_shared_layers,
 * linear attention (layer_types "linear_attention", or full_attention_interval, with
 * linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, linear_value_head_dim,
 * linear_conv_kernel_dim: Qwen3-Next, Qwen3.5), torch_dtype / dtype. A torch_dtype of float32 (or fp32, float) is not what a server runs
 * (vLLM, SGLang and TGI load such checkpoints in bf16): the KV and the weights are then
 * counted as bf16, and kv_dtype_why says so ("torch_dtype float32 in config.json; servers run
 * bf16: --kv-dtype to override"); --kv-dtype fp32 asks for 4 bytes.
 * Returns 0 or -EINVAL (not JSON, not an object, a field of the wrong type or out of range),
 * with a message in kvtr_last_error().
 */
int kvc_model_from_json(const char *text, struct kvc_model *m);

/** kvc_model_load() - kvc_model_from_json() of a file. Also -ENOENT/-EIO on read errors. */
int kvc_model_load(const char *path, struct kvc_model *m);

/**
 * kvc_model_finish() - fill what follows from the rest (n_kv_heads = n_heads, head_dim =
 * hidden / n_heads, v_head_dim = head_dim) and check the geometry.
 * Returns 0 or -EINVAL saying what is missing or inconsistent.
 */
int kvc_model_finish(struct kvc_model *m);

/** kvc_query_init() - defaults: context 4096, batch 1, 16 tokens per block, util 1.0. */
void kvc_query_init(struct kvc_query *q);

/** kvc_compute() - the numbers for a finished model. Returns 0 or -EINVAL (bad query). */
int kvc_compute(const struct kvc_model *m, const struct kvc_query *q, struct kvc_result *r);

/** kvc_dtype_bytes() - bytes of a dtype name (fp16, bf16, float16, bfloat16, fp32, float32,
 * fp8, fp8_e4m3, fp8_e5m2, int8, int4, fp4); 0 for an unknown name. */
double kvc_dtype_bytes(const char *name);

/** kvc_parse_bytes() - "80G", "1.5T", "512MiB", "4096": binary K/M/G/T/P suffixes, optional
 * "iB"/"B". Returns 0 or -EINVAL (message in kvtr_last_error()). */
int kvc_parse_bytes(const char *what, const char *s, uint64_t *out);

/** kvc_parse_count() - "8.03e9", "8B", "70b", "560M", "7000000000". Returns 0 or -EINVAL. */
int kvc_parse_count(const char *what, const char *s, double *out);

/** kvc_print_text() / kvc_print_json() - the report, human-readable or one JSON object. */
void kvc_print_text(FILE *f, const struct kvc_model *m, const struct kvc_query *q,
		    const struct kvc_result *r);
int kvc_print_json(FILE *f, const struct kvc_model *m, const struct kvc_query *q,
		   const struct kvc_result *r);

/**
 * kvc_cli() - the whole command line of kvtier-calc (argv[0] is the program name): report on
 * @out, errors on @err. Returns the exit status: 0, 1 (a computation or output failed), 2 (bad
 * usage). Uses getopt_long (resets optind), so not thread-safe.
 */
int kvc_cli(int argc, char **argv, FILE *out, FILE *err);

#endif /* KVC_CALC_H */
