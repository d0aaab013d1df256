/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-replay/replay.h - trace replay against kvtier's eviction policies.
 *
 * A trace is a list of requests, each a prompt of input_length tokens cut into blocks whose
 * ids name the whole prefix up to and including that block (Mooncake's hash_ids), so equal ids
 * are reusable prefix KV. The metadata-only replay (sim.c) runs kvtier's own evict/ policies
 * over the whole trace with no bytes moved; min.c is the offline Belady MIN bound; hybrid.c
 * the checkpoint bytes of a linear-attention state at each reused prefix.
 */
#ifndef KVT_REPLAY_H
#define KVT_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "evict/evict.h"

struct rp_req {
	uint64_t t_ms;      /* arrival, ms from the start of the trace */
	uint32_t in_tokens; /* prompt tokens */
	uint32_t out_tokens; /* generated tokens */
	uint32_t first;     /* index of its first block id in rp_trace.ids */
	uint32_t n;         /* blocks */
};

struct rp_trace {
	struct rp_req *req;   /* [n_req] */
	uint32_t n_req;       /* requests */
	uint32_t *ids;        /* all block ids, request after request */
	uint64_t n_ids;       /* entries of ids (block references) */
	uint32_t max_id;      /* largest id + 1 */
	uint32_t block_tokens; /* tokens per block (512 for Mooncake) */
	int has_ids;          /* 1: block ids from the trace (Mooncake); 0: made up (CSV) */
	uint32_t short_ids;   /* Mooncake requests with fewer hash_ids than
	                         ceil(input_length / 512) (warned about once at load) */
};

/* Load a Mooncake JSONL (cJSON) or Azure CSV trace (by content: '{' first). @block_tokens is
 * used for CSV traces (each request gets fresh ids: no reuse is known). @limit: 0 = all
 * requests. Mooncake requests with fewer hash_ids than ceil(input_length / 512) are loaded
 * as they are (their blocks are the ids given), counted in t->short_ids and named by one
 * warning line on stderr at the end. Returns 0 or -1 with a message on stderr. */
int rp_trace_load(const char *path, uint32_t block_tokens, uint32_t limit, struct rp_trace *t);
void rp_trace_free(struct rp_trace *t);

/* Tokens of block k of request r (the last block is usually partial). */
uint32_t rp_block_tokens(const struct rp_trace *t, const struct rp_req *r, uint32_t k);

#define RP_TIERS 3

struct rp_result {
	char policy[16];                  /* "lru", "arc", "prio", "clock", "min" */
	int tiered;                       /* 1: part of the tiered run (MIN: at the sum) */
	uint64_t cap[RP_TIERS];           /* capacity per tier, blocks (0 = absent) */
	uint64_t refs;                    /* block references */
	uint64_t tokens;                  /* prompt tokens */
	uint64_t hit_blocks[RP_TIERS];    /* prefix-hit blocks found in each tier */
	uint64_t hit_tokens[RP_TIERS];    /* their tokens (prefill saved) */
	uint64_t evictions[RP_TIERS];     /* copies pushed out of each tier */
	uint64_t moved_blocks[4];         /* blocks moved per enum kvt_move direction */
	uint64_t orphaned;                /* blocks dropped from every tier while one of their
	                                     children (next block of a request) was cached:
	                                     a parent evicted before its child (sim.c only) */
};

/* Progress callback: done of total requests. */
typedef void (*rp_progress_fn)(uint64_t done, uint64_t total);

/* Replay @t through one policy instance per tier (exclusive tiers: HBM -> HOST -> NVME on
 * eviction, promoted to HBM on a hit). Returns 0 or -ENOMEM. */
int rp_sim_run(const struct rp_trace *t, const struct kvt_evict_ops *ops,
	       const uint64_t cap[RP_TIERS], rp_progress_fn pf, struct rp_result *out);

/* Belady MIN (with bypass) at one capacity: the offline optimum of the hit ratio. */
int rp_min_run(const struct rp_trace *t, uint64_t cap, rp_progress_fn pf, struct rp_result *out);

/* Sum over tiers of hit blocks / tokens. */
uint64_t rp_hits(const struct rp_result *r);
uint64_t rp_hit_tokens(const struct rp_result *r);

/* ---- multi-node replay (multi.c): N nodes, each with its own HBM/HOST/NVME tiers, sharing one
 * REMOTE tier (issue 18, items 5 and 6). Metadata only, like rp_sim_run. */

#define RP_REMOTE RP_TIERS          /* index of REMOTE in rp_multi_result's hit arrays */
#define RP_UNBOUNDED UINT64_MAX     /* rp_multi_opts.remote_cap: no capacity limit */

enum rp_split {
	RP_SPLIT_CONVERSATION = 0, /* node = hash(conversation key): hash_ids[1], see rp_conv_key */
	RP_SPLIT_REQUEST = 1,      /* node = hash(request index): no affinity (a round-robin router) */
};

enum rp_admit {
	RP_ADMIT_ALL = 0,        /* every offered block is written (within the budget) */
	RP_ADMIT_SEEN_TWICE = 1, /* only a block seen by a second request: NVMe counts the
				    node's own requests, REMOTE every node's */
};

struct rp_multi_opts {
	uint32_t nodes;          /* N >= 1 */
	uint32_t split;          /* enum rp_split */
	uint64_t cap[RP_TIERS];  /* per-node capacities, blocks (HBM >= 1) */
	uint64_t remote_cap;     /* REMOTE blocks: 0 = no shared tier, RP_UNBOUNDED = no limit */
	uint64_t block_bytes;    /* bytes of one block (network and NVMe bytes) */
	uint64_t budget[2];      /* write budget, bytes/s: [0] NVMe (per node), [1] REMOTE (the
				    fleet's puts), <= 2^40; 0 = none. Token bucket on trace time, full at
				    t 0, depth one period of budget or one block, whichever is more */
	uint64_t period_ms;      /* the budget's period (bucket depth), ms, <= 3600000; 0 = 1000 */
	uint32_t admit;          /* enum rp_admit, for both NVMe and REMOTE writes */
};

struct rp_multi_result {
	char policy[16];                 /* local tiers' policy */
	struct rp_multi_opts o;          /* as run */
	uint64_t refs, tokens;           /* block references, prompt tokens */
	uint64_t hit_blocks[RP_TIERS + 1]; /* prefix hits per tier, [RP_REMOTE] from REMOTE */
	uint64_t hit_tokens[RP_TIERS + 1]; /* their tokens */
	uint64_t puts, gets;             /* blocks written to / read from REMOTE */
	uint64_t nvme_writes;            /* blocks written to NVMe (HOST -> NVMe demotions) */
	uint64_t nvme_refused;           /* demotions dropped by the admission or the budget */
	uint64_t remote_refused;         /* puts not made by the admission or the budget */
	uint64_t remote_evictions;       /* blocks REMOTE's LRU pushed out */
	uint64_t cross_hits;             /* REMOTE hits on a block another node wrote */
};

/* Conversation key of request @r: its second block id (the first after the system prompt that
 * every Mooncake request shares; an id names its whole prefix, so requests with one key are
 * turns of one conversation), or its only id. The trace carries no conversation id. */
uint32_t rp_conv_key(const struct rp_trace *t, const struct rp_req *r);
/* Node of request number @i under @o (a stable hash, splitmix64, of the key mod nodes). */
uint32_t rp_multi_node(const struct rp_trace *t, uint32_t i, const struct rp_multi_opts *o);

/* Replay @t across @o->nodes nodes, each with its own @ops instances over @o->cap, sharing one
 * REMOTE (LRU, like Redis's allkeys-lru) when @o->remote_cap > 0. Per request: the leading run
 * of blocks found in the node's tiers or in REMOTE are hits (a local copy first); then every
 * block is brought to the node's HBM as rp_sim_run does; then the blocks REMOTE lacks are
 * offered to it in prefix order (stopping at the first one not written: a child without its
 * parent is unreachable), written if the admission and the budget let them (first writer wins).
 * HOST overflow goes to NVMe only if admitted. Returns 0, -EINVAL (bad options) or -ENOMEM. */
int rp_multi_run(const struct rp_trace *t, const struct kvt_evict_ops *ops,
		 const struct rp_multi_opts *o, struct rp_multi_result *out);
/* Sum over the local tiers and REMOTE of hit blocks / tokens. */
uint64_t rp_multi_hits(const struct rp_multi_result *r);
uint64_t rp_multi_hit_tokens(const struct rp_multi_result *r);

/* ---- hybrid layouts (hybrid.c, issue 17): a model whose linear-attention layers keep a
 * fixed-size state per sequence (a STATE group, engine/kvtier.h "STATE groups") next to its
 * attention layers' per-token KV. A prefix hit must resume the state where the hit ends, so it
 * can only end at a block boundary whose checkpoint (the state after that block's last token,
 * one per full block in the engine) the cache kept. Metadata only, over an unbounded prefix
 * cache (every block and checkpoint of an earlier request is still there): what the trace's
 * reuse is worth and what the checkpoints cost, before any eviction. */

struct rp_hybrid_result {
	uint32_t every;           /* checkpoints after every this many blocks (>= 1) */
	uint64_t tokens;          /* prompt tokens of the trace */
	uint64_t attn_hit_tokens; /* prefix-hit tokens of an attention-only model: the leading run
				     of blocks an earlier request had (the last one may be
				     partial), as rp_sim_run counts them with room for all */
	uint64_t hit_tokens;      /* the hybrid's: the hit ends at the last checkpoint at or before
				     that run's end (whole blocks only) */
	uint64_t hit_reqs;        /* requests with hit_tokens > 0 */
	uint64_t cached_blocks;   /* distinct blocks of the trace (the cache at the end) */
	uint64_t cached_tokens;   /* their tokens (a partial block counts its tokens) */
	uint64_t ckpts;           /* distinct checkpoints written: a full block at position
				     k (1-based) with k % every == 0 (all kept: unbounded) */
	uint64_t reused_blocks;   /* distinct blocks inside at least one hybrid hit */
	uint64_t reused_tokens;   /* their tokens */
	uint64_t reused_ckpts;    /* checkpoints after those blocks: what the reused prefixes need
				     kept (a reused prefix ends at one; those inside it serve
				     shorter shares) */
	uint64_t end_ckpts;       /* distinct checkpoints that ended at least one hit */
};

/* Replay @t (requests in order) with checkpoints after every @every blocks (1 = the engine's
 * one per full block). Per request: the attention-only hit h = the leading run of its blocks
 * seen before; the hybrid hit = blocks up to the last position k <= h whose block is full and
 * carries a checkpoint (stored by an earlier request); then its blocks and its checkpoints
 * (full blocks at k % @every == 0) enter the cache. 0, -EINVAL (@every 0) or -ENOMEM. */
int rp_hybrid_run(const struct rp_trace *t, uint32_t every, struct rp_hybrid_result *out);

/* Bytes of one hybrid layout: one checkpoint = the STATE group's state of one sequence (all
 * linear layers), the attention KV of one token (all attention layers). */
struct rp_hybrid_bytes {
	double state_bytes;      /* bytes of one checkpoint (> 0) */
	double attn_token_bytes; /* attention KV bytes of one token (> 0) */
};

/* The figures of one result under @b (bytes as doubles, ratios plain). */
struct rp_hybrid_fig {
	double ckpt_bytes;            /* ckpts x state_bytes: every checkpoint kept */
	double attn_bytes;            /* cached_tokens x attn_token_bytes: the attention KV kept */
	double ckpt_per_reused_token; /* reused_ckpts x state_bytes / reused_tokens: the
					 checkpoint bytes the reused prefixes need per token
					 they make reusable (0 without reuse) */
	double ratio_reused;          /* that / attn_token_bytes: checkpoint bytes per byte of
					 attention KV the hits unlock */
	double kept_per_reused_token; /* ckpt_bytes / reused_tokens: every checkpoint kept,
					 per reusable token (0 without reuse) */
	double hit_frac;              /* hit_tokens / attn_hit_tokens (1 when the latter is 0) */
};
void rp_hybrid_figures(const struct rp_hybrid_result *r, const struct rp_hybrid_bytes *b,
		       struct rp_hybrid_fig *f);

/* Table of @n results under @b on @f, one line per checkpoint interval. */
void rp_print_hybrid(FILE *f, const struct rp_hybrid_result *r, size_t n,
		     const struct rp_hybrid_bytes *b);

/* @b from a Hugging Face config.json with linear-attention layers (kvtier-calc's reader:
 * seq_state_bytes and token_bytes of kvc_compute); fields of @b already > 0 are kept (the
 * explicit options win). 0, or -1 with a message on stderr (unreadable, no linear layers). */
int rp_hybrid_from_model(const char *path, struct rp_hybrid_bytes *b);

#endif /* KVT_REPLAY_H */
