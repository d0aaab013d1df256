/* SPDX-License-Identifier: MIT */
/* tools/kvtier-replay/replay_data.h - data mode: the trace through a real engine (data.c). */
#ifndef KVT_REPLAY_DATA_H
#define KVT_REPLAY_DATA_H

#include "kvtier.h"
#include "replay.h"

struct rp_data_opts {
	uint64_t cap[RP_TIERS]; /* blocks per tier (HOST required for NVMe) */
	const char *nvme_dir;   /* directory of the NVMe file (cap[2] > 0) */
	uint32_t policy;        /* enum kvt_evict_policy */
};

struct rp_data_result {
	struct kvt_stats st;      /* engine counters at the end */
	uint64_t refs, tokens;    /* block references and prompt tokens replayed */
	uint64_t attached_tokens; /* prompt tokens served from cached blocks */
	uint64_t verified;        /* shared blocks read back and compared */
	uint64_t mismatches;      /* of those, bytes that differed (must be 0) */
	uint64_t block_bytes;     /* bytes of one block in this engine */
};

/* Replay @tr (requests one after another) through an engine with prefix sharing and a
 * prefix cache, 1 layer x 1 head x 8 f16 elements per token. 0 or a kvtier error. */
int rp_data_run(const struct rp_trace *tr, const struct rp_data_opts *o, rp_progress_fn pf,
		struct rp_data_result *out);

#endif /* KVT_REPLAY_DATA_H */
