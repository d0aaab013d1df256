/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-replay/replay.h - trace replay against kvtier's eviction policies.
 *
 * A trace is a list of requests, each a prompt of input_length tokens cut into blocks whose
 * ids name the whole prefix up to and including that block (Mooncake's hash_ids), so equal ids
 * are reusable prefix KV. The metadata-only replay (sim.c) runs kvtier's own evict/ policies
 * over the whole trace with no bytes moved; min.c is the offline Belady MIN bound.
 */
#ifndef KVT_REPLAY_H
#define KVT_REPLAY_H

#include <stdbool.h>
#include <stdint.h>

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

#endif /* KVT_REPLAY_H */
