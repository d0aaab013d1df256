/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-run/runner.h - the decode loop of kvtier-run: sessions, turns and batching,
 * driving kvtier exactly as an inference server would (public API only).
 *
 * Sessions and turns. Every session is one kvtier sequence (kvt_seq_open) and runs a chat of
 * @turns turns. A turn appends BOS and its encoded prompt, then generates, llama2.c-style: one
 * position per step (prompt tokens are fed one per step too), the next token being the next
 * prompt token while in the prompt and a sampled one afterwards; the turn stops when BOS is
 * sampled, after @steps positions of this turn, or at the model's seq_len. Each emitted token
 * is decoded as llama2.c prints it. All sessions run a turn together, interleaved step by step
 * as one batch; a session whose turn ended is parked (kvt_seq_park, to NVMe when there is an
 * NVMe tier, else HOST) and resumed (kvt_seq_resume) when the next turn starts.
 *
 * One step with kvtier. The active sessions are cut into groups whose blocks fit in HBM
 * (geometry.hbm_slots). Per group: kvt_seq_append (one token each, slot mapping out),
 * kvt_batch_prepare, then per layer kvt_batch_wait_layer, q/k/v, the new K/V stored at
 * kvt_kv_addr(slot mapping), paged attention through the block table (kvt_attn_decode_ref),
 * FFN; then kvt_batch_release. A group the engine refuses (KVT_ETOOBIG / -ENOSPC) is split; a
 * session whose blocks alone exceed HBM is decoded by windows of at most hbm_slots - 1 blocks
 * (kvt_batch_prepare_ranges, kvt_attn_partial_ref per window, kvt_attn_merge), each window
 * released before the next. With prefetch, each group's batch is followed at once by a hint
 * of the next group (the step's first group after the last), and each window by a hint of the
 * next window, so those copies overlap the compute; groups then use at most half of what HBM
 * holds beside every active session's last block, and windows half of HBM, so that the one
 * computing and the one arriving fit together. KVT_ELOST (a block failed its checksum)
 * truncates the sequence: the runner re-feeds the lost positions from its own token history (re-prefill) and goes on,
 * with a note on the log stream; the text is unaffected.
 *
 * Reference mode: the same loop with a contiguous KV cache per session and llama2.c's own
 * attention, no kvtier at all. The reference rounds its K/V through kv_dtype (f16/bf16) as
 * kvtier's blocks store them, so both modes give identical tokens for every dtype.
 *
 * A prompt longer than a turn's room (steps, or what is left of seq_len) is cut, with one
 * warning per turn on the log stream saying how many tokens were kept and dropped.
 */
#ifndef KVTR_RUNNER_H
#define KVTR_RUNNER_H

#include <stdint.h>
#include <stdio.h>

#include "kvtier.h"
#include "model.h"
#include "tokenizer.h"

#define KVTR_MAX_SESSIONS 4096
#define KVTR_MAX_TURNS 1000
#define KVTR_MAX_PROMPT 16384 /* bytes */

/** What to run. Fill with kvtr_run_opts_init(), then set fields. */
struct kvtr_run_opts {
	const struct kvtr_model *model;      /* required */
	const struct kvtr_tokenizer *tok;    /* required; vocab must match the model */
	const char *prompt;                  /* every turn's prompt; NULL = built-in prompts */
	uint32_t steps;                      /* positions per turn; 0 or > seq_len: seq_len */
	float temperature;                   /* 0 = greedy */
	float topp;                          /* top-p; <= 0 or >= 1: plain sampling */
	uint64_t seed;                       /* rng seed of session 0 (session i: seed + i); != 0 */
	uint32_t sessions;                   /* 1..KVTR_MAX_SESSIONS */
	uint32_t turns;                      /* 1..KVTR_MAX_TURNS */
	int reference;                       /* 1: contiguous KV, no kvtier */
	uint64_t hbm_bytes;                  /* HBM tier; 0 = room for every session's seq_len */
	uint64_t host_bytes;                 /* HOST tier; 0 = the same */
	const char *nvme_dir;                /* NVMe tier directory; NULL = a temp dir */
	uint64_t nvme_bytes;                 /* NVMe tier; 0 = the same room (4 KiB slots) */
	uint32_t tokens_per_block;           /* kvtier block size in tokens (default 16) */
	enum kvt_dtype kv_dtype;             /* stored K/V type: F32 (default), F16, BF16 */
	uint32_t emu_delay_us;               /* emulated device's delay/reorder knob */
	enum kvt_device_kind device;         /* KVT_DEVICE_EMULATED (default), or KVT_DEVICE_CUDA:
	                                        HBM on the GPU, K/V stored with cudaMemcpy,
	                                        attention by the CUDA kernel (devrun.c) */
	FILE *stream;                        /* text streamed here as generated, sessions == 1
	                                        and turns == 1 only; NULL = not streamed */
	FILE *log;                           /* notes and engine warnings; NULL = stderr */
	void (*step_hook)(void *arg, struct kvt_engine *e, uint64_t step); /* tests: called
	                                        after every kvtier step; NULL = none */
	void *hook_arg;                      /* passed to step_hook */
	enum kvt_codec nvme_codec;           /* codec of blocks written to NVMe (default none) */
	int prefix_share;                    /* 1: a session's first turn attaches the prompt
	                                        blocks another session already computed
	                                        (kvt_seq_attach_prefix) and computes only the rest;
	                                        session 0's first turn runs first so the others
	                                        find it. The text is unchanged */
	int prefetch;                        /* 1: schedule hints (kvt_engine_hint): while one
	                                        group computes, the next group's blocks (or the
	                                        next window's) are promoted; groups and windows
	                                        then take at most half of HBM each */
	uint64_t emu_copy_bytes_per_s;       /* emulated device copy bandwidth; 0 = unlimited */
	uint32_t emu_lazy;                   /* kvt_engine_opts.emu_lazy (kvtier-bench decode
	                                        --emu-lazy) */
	/* REMOTE tier (issue 18, item 4): sessions that move between processes */
	const char *remote_host;             /* Redis server; NULL = none */
	uint16_t remote_port;                /* its port */
	const char *remote_user;             /* ACL user or NULL */
	const char *remote_password;         /* AUTH password or NULL */
	uint32_t remote_save;                /* K > 0: run turns 1..K of the @turns-turn chat,
	                                        then publish every session (session key =
	                                        session number) with kvt_seq_publish_remote */
	uint32_t remote_resume;              /* K > 0: reopen every session from REMOTE
	                                        (kvt_seq_restore_remote), holding turns 1..K,
	                                        and run turns K+1..@turns; greedy only
	                                        (temperature 0: the sampler's state does not
	                                        travel) */
};

/** What one session produced in one turn. */
struct kvtr_turn_out {
	char *text;       /* printed text of the turn (llama2.c's pieces), NUL-terminated */
	int32_t *tokens;  /* tokens emitted in the turn (prompt tokens included), in order */
	uint32_t n_tokens; /* their count */
};

/** Results and figures of a run. Free with kvtr_run_result_free(). */
struct kvtr_run_result {
	uint32_t sessions;            /* as run */
	uint32_t turns;               /* as run */
	struct kvtr_turn_out *out;    /* [sessions * turns], session-major */
	int reference;                /* 1 when run without kvtier */
	struct kvt_stats stats;       /* engine counters after the run (zero for reference) */
	struct kvt_geometry geo;      /* engine geometry (hbm_base meaningless after the run) */
	uint64_t hbm_bytes;           /* tier sizes asked of the engine */
	uint64_t host_bytes;          /* ... */
	uint64_t nvme_bytes;          /* ... */
	uint64_t positions;           /* forward passes (re-prefill included) */
	uint64_t tokens_generated;    /* sampled tokens */
	uint64_t steps;               /* batch steps */
	uint64_t batches;             /* kvt_batch_prepare calls that succeeded (groups) */
	uint64_t group_splits;        /* groups split after KVT_ETOOBIG / -ENOSPC */
	uint64_t windowed_positions;  /* positions decoded by windows */
	uint64_t windows;             /* windows prepared */
	uint64_t lost_events;         /* KVT_ELOST answers */
	uint64_t reprefill_positions; /* positions recomputed after KVT_ELOST */
	uint64_t slot_remaps;         /* appended blocks found in another slot after a release
	                                 or failed prepare (window walk) */
	uint64_t parks;               /* kvt_seq_park calls that succeeded */
	uint64_t park_nospc;          /* parks refused with -ENOSPC (blocks stayed) */
	uint64_t preemptions;         /* sessions parked to make room for another's batch */
	uint64_t kv_tokens;           /* positions with K/V held at the end, all sessions */
	uint64_t kv_blocks;           /* blocks of tokens_per_block they take, all sessions */
	uint64_t prefix_tokens;       /* prompt positions attached, not computed (prefix_share) */
	double elapsed_s;             /* wall time of the decode loop */
	double tok_per_s;             /* positions per second after the first step (llama2.c) */
};

/** kvtr_run_opts_init() - defaults: 256 steps, temperature 1, topp 0.9, 1 session, 1 turn,
 * tokens_per_block 16, fp32 KV, kvtier mode, automatic tier sizes, log = stderr. */
void kvtr_run_opts_init(struct kvtr_run_opts *o);

/**
 * kvtr_run() - run the sessions to the end.
 * @o: options; @r: receives results (zeroed first; free with kvtr_run_result_free() in every
 * case).
 * Returns 0, or a negative code with kvtr_last_error() explaining it: -EINVAL (options),
 * kvt_engine_create's codes (tier sizes, NVMe directory), KVT_ETOOBIG (HBM too small to hold
 * one decode batch: an HBM of one block slot is refused before decoding when a session can
 * outgrow one block), -EIO (@stream could not be written; the run stops there), or any kvtier
 * failure that is not recoverable.
 */
int kvtr_run(const struct kvtr_run_opts *o, struct kvtr_run_result *r);

/** kvtr_run_result_free() - free the texts and tokens; the struct is zeroed. */
void kvtr_run_result_free(struct kvtr_run_result *r);

/**
 * kvtr_builtin_prompt() - the built-in prompt of session @s (0-based) in turn @t (0-based):
 * session 0's first turn is "" (BOS only, llama2.c's default), the others cycle through a
 * short list of story openings. Static string.
 */
const char *kvtr_builtin_prompt(uint32_t s, uint32_t t, uint32_t turns);

/**
 * kvtr_stats_json_write() - write the run's figures as a JSON object to @f, opened for writing
 * by the caller (before the run, so a bad path fails early), and flush it; @path names it in
 * messages. The caller closes @f. See stats_json.c for the keys. Returns 0, -EIO or -ENOMEM.
 */
int kvtr_stats_json_write(FILE *f, const char *path, const struct kvtr_run_opts *o,
			  const struct kvtr_run_result *r);

/**
 * kvtr_summary_write() - the one-line summary of what kvtier did in the run, for stderr:
 * "kvtier: tiers used hbm U/S blocks (B), host ..., nvme ...; blocks moved hbm_to_host N,
 * host_to_nvme N, nvme_to_host N, host_to_hbm N; NVMe checksums verified N, failed N" from
 * @r->stats after the run (used = slots holding blocks at the end, before the sequences are
 * closed), "kvtier: reference run (contiguous KV cache, no kvtier)" for --reference. When
 * @builtin, a second line says the built-in model has random weights. Returns 0 or -EIO.
 */
int kvtr_summary_write(FILE *f, const struct kvtr_run_result *r, int builtin);

#endif /* KVTR_RUNNER_H */
