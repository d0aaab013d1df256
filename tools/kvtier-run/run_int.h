/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-run/run_int.h - state shared by runner.c (sessions, turns, engine setup) and
 * batch.c (one kvtier decode step: groups, windows, lost-block recovery). Internal.
 */
#ifndef KVTR_RUN_INT_H
#define KVTR_RUN_INT_H

#include <stdint.h>

#include "forward.h"
#include "kernels/attention.h"
#include "runner.h"
#include "sampler.h"
#include "util.h"

struct run_dev;

/** One session: a kvtier sequence plus everything needed to decode and recompute it. */
struct run_sess {
	uint32_t idx;              /* 0-based session number */
	kvt_seq_id id;             /* kvtier sequence (0 in reference mode) */
	struct kvtr_state st;      /* activations */
	struct kvtr_sampler samp;  /* sampler with its own rng */
	struct kvtr_kvcache cache; /* reference mode only: contiguous KV */
	int32_t *hist;             /* [seq_len] token fed at each position */
	uint32_t n_hist;           /* tokens known: positions fed or to feed */
	uint32_t n_kv;             /* positions whose K/V is stored; n_hist - 1 when caught up */
	int32_t *turn_toks;        /* [strlen(prompt) + 2] BOS + encoded prompt of the turn */
	uint32_t n_turn_toks;      /* their count */
	uint32_t turn_start;       /* position of the turn's BOS */
	uint32_t turn;             /* current turn, 0-based */
	int in_turn;               /* 1 while the turn generates */
	struct kvtr_str text;      /* text of the current turn */
	int32_t *out_toks;         /* [seq_len] tokens emitted in the current turn */
	uint32_t n_out;            /* their count */
	int appended;              /* 1: hist[n_kv] is appended to the sequence, K/V unwritten */
	int64_t slot;              /* its slot mapping entry from kvt_seq_append */
	int slot_stale;            /* 1: a release or failed prepare happened since the append */
	int computed;              /* 1: this step computed position n_kv - 1 (logits valid) */
};

/** The whole run. */
struct run_ctx {
	const struct kvtr_run_opts *o;  /* options */
	struct kvtr_run_result *r;      /* results and counters */
	const struct kvtr_model *m;     /* model */
	FILE *log;                      /* notes */
	uint32_t steps;                 /* effective positions per turn */
	struct kvt_engine *e;           /* NULL in reference mode */
	struct kvt_geometry geo;        /* engine geometry */
	enum kvt_tier park_tier;        /* NVME when configured, else HOST */
	struct run_sess *ss;            /* [sessions] */
	struct run_sess **act;          /* [sessions] scratch: active sessions of a step */
	kvt_seq_id *ids;                /* [sessions] scratch: ids of a group */
	float *wo, *wm, *wl;            /* merged window partial: [dim], [n_heads], [n_heads];
	                                   wl == wm + n_heads (run_dev_attn's [2][n_heads]) */
	float *po, *pm, *pl;            /* one window's partial, same shapes and layout */
	float *side;                    /* [n_layers][2][kv_dim] K/V of the windowed position */
	void *tokblk;                   /* [2][token_bytes]: that position's K/V as stored */
	uint32_t cut_warned;            /* turn + 1 of the last "prompt cut" warning, 0 = none */
	char tmpdir[4096];              /* temp NVMe dir we created ("" if none) */
	char model_id[160];             /* REMOTE namespace of the model (--remote) */
	struct run_dev *dev;            /* --device cuda state (devrun.c), NULL otherwise */
	kvt_seq_id *hint_ids;           /* [sessions] prefetch: the next group's sequences */
	uint32_t n_hint;                /* their count (0 = nothing to announce) */
	struct kvt_seq_range *hint_last; /* [sessions] the active sessions' growing blocks */
	uint32_t n_hint_last;           /* their count (hinted before the next group) */
	struct kvt_seq_range *hint_part; /* [sessions] copy-bound prefetch: the next group's
	                                    blocks to bring ahead (a part of what it misses) */
	uint32_t n_hint_part;           /* their count (used instead of hint_ids when > 0) */
	double copy_ratio;              /* prefetch: measured step time / compute time (copy
	                                   time over compute time when copies are the
	                                   bottleneck), smoothed; 0 = not measured yet */
	int copy_bound;                 /* copies are the bottleneck: small window, partial
	                                   announcements (batch.c; with hysteresis) */
};

/**
 * run_step_kvt() - one decode step of every session in @act[0..n) through kvtier: each gets
 * one more position computed (s->n_kv + 1, logits in s->st.logits) unless it lost blocks, in
 * which case its n_kv went down and it recomputes in later steps. Returns 0 or a fatal code.
 */
int run_step_kvt(struct run_ctx *c, struct run_sess **act, uint32_t n);

/* Helpers of batch.c shared with window.c. All return 0 or a negative code with the message
 * set (kvtr_last_error). */

/** run_nofit() - 1 for the engine's "does not fit" answers (KVT_ETOOBIG, -ENOSPC). */
int run_nofit(int rc);

/** run_blocks() - blocks holding @positions tokens. */
uint32_t run_blocks(const struct run_ctx *c, uint32_t positions);

/**
 * run_handle_lost() - after KVT_ELOST: if the engine truncated @s (kvt_seq_info), go back to
 * where its K/V is intact (s->n_kv lowered, not appended); the lost positions are fed again from
 * s->hist in this and later steps (re-prefill).
 */
int run_handle_lost(struct run_ctx *c, struct run_sess *s);

/** run_append() - kvt_seq_append of hist[n_kv] unless already appended (slot in s->slot);
 * recovers from KVT_ELOST. */
int run_append(struct run_ctx *c, struct run_sess *s);

/**
 * run_check_slot() - the appended token's slot must be where the block table puts the
 * sequence's last block (@last_slot). A difference is an engine bug (-EPROTO) unless the slot
 * is stale (after a failed prepare), in which case the table wins and it is counted.
 */
int run_check_slot(struct run_ctx *c, struct run_sess *s, uint32_t last_slot);

/** run_kv_view() - the paged view of row @i of @bt for layer @l (kernels/attention.h). */
void run_kv_view(const struct run_ctx *c, const struct kvt_block_table *bt, uint32_t i,
		 uint32_t l, struct kvt_paged_kv *kv);

/** run_store_kv() - store @k/@v [kv_dim] of layer @l at kvt_kv_addr(s->slot), as kv_dtype. */
int run_store_kv(struct run_ctx *c, struct run_sess *s, uint32_t l, const float *k,
		 const float *v);

/** run_hint() - prefetch mode: announce the next group (c->hint_ids) or @r (a window) to the
 * engine. Refusals that only mean "cannot help now" are ignored; bugs are returned. */
int run_hint(struct run_ctx *c, const struct kvt_seq_range *r);

/** run_done() - the position is computed: n_kv++, logits valid, not appended. */
void run_done(struct run_ctx *c, struct run_sess *s);

/**
 * run_windowed() - one position of a session larger than HBM (window.c): attention over its
 * complete blocks by windows of at most hbm_slots - 1 blocks plus the position's own K/V, then
 * append and store the new K/V in one batch. @s must not be appended.
 */
int run_windowed(struct run_ctx *c, struct run_sess *s);

/* The --device cuda path (devrun.c). Each returns 0 or a negative code with the message set;
 * without CUDA in the build they refuse with KVT_ENOTSUP. */

/** run_dev_init() - device buffers when o->device is CUDA (else nothing; c->dev stays NULL). */
int run_dev_init(struct run_ctx *c);
/** run_dev_fini() - free them (NULL ok). */
void run_dev_fini(struct run_ctx *c);
/** run_dev_owns() - 1 when c->dev is set and @p lies in kvtier's HBM (GPU memory). */
int run_dev_owns(const struct run_ctx *c, const void *p);
/** run_dev_store() - store [kv_dim] @kf/@vf as kv_dtype at device addresses @k/@v. */
int run_dev_store(struct run_ctx *c, void *k, void *v, const float *kf, const float *vf);
/**
 * run_dev_attn() - attention of host query @q [n_heads][head_dim] over positions [0, len) of
 * @kv (device K/V, host table) with the CUDA kernel; host @out [n_heads][head_dim]. With @ml
 * (host [2][n_heads]: the max, then the sum; c->wm/c->wl and c->pm/c->pl are laid out so) the
 * split-KV partial (kvt_attn_partial_ref's outputs), copied back in one cudaMemcpy; with NULL
 * the normalised result (kvt_attn_decode_ref's). Synchronous.
 */
int run_dev_attn(struct run_ctx *c, const struct kvt_paged_kv *kv, const float *q, uint64_t len,
		 float *out, float *ml);

#endif /* KVTR_RUN_INT_H */
