/* SPDX-License-Identifier: MIT */
/*
 * engine/engine_impl.h - the engine's internal state (not installed).
 *
 * Blocks and their copies
 * -----------------------
 * Every block of every sequence is a struct kvt_block in one dense array (ids are indices, so
 * the array can grow with realloc and ids can feed LRU links and block tables). Per tier a block
 * has a copy state:
 *
 *     ABSENT --(alloc slot, submit copy/IO into it)--> INFLIGHT --(completion ok)--> PRESENT
 *        ^                                                  |                          |
 *        +------------------(completion failed / stale)-----+----(evict: free slot)----+
 *
 * and contents that appends change. An append drops the PRESENT copies below HBM (HBM always
 * holds the newest bytes when present: appends happen there) and marks the INFLIGHT ones stale
 * (kvt_copy_mark_stale(): the fourth value of the copy's 2-bit state; a copy started from a
 * stale one is stale too), and a transfer whose destination is stale when it completes is
 * dropped, so a copy is *valid* exactly when it is PRESENT, and an INFLIGHT copy will be valid
 * unless it is stale (kvt_copy_stale()). A PRESENT HOST copy that a transfer still reads (a
 * HOST->NVMe write, a HOST->HBM copy) is not dropped by an append but turned INFLIGHT and stale:
 * its slot goes when the last of those transfers completes. No version number is
 * kept: nothing but "appended to since" is ever asked of one.
 *
 * A block is *busy* while any transfer reads or writes one of its copies (b->busy counts them);
 * it is *pinned* while a batch or an append holds it (b->pins). Eviction picks only blocks that
 * are neither (DESIGN.md invariant 3); a slot is freed only by the completion of the transfer
 * that uses it, never while it is in flight (invariant 1). A copy that is the only valid one is
 * demoted before its slot is freed (invariant 4); NVMe reads are verified (invariant 5).
 *
 * Locking: one engine mutex (e->lock) guards everything here. Device streams and the io_uring
 * run on other threads/in the kernel but never touch this state; completions are processed by
 * whichever API call polls or waits, under the lock.
 */
#ifndef KVT_ENGINE_IMPL_H
#define KVT_ENGINE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "tiers/base/alloc.h"
#include "tiers/base/clock.h"
#include "tiers/base/error.h"
#include "evict/evict.h"
#include "kvtier.h"
#include "tiers/slots.h"
#include "tiers/store.h"
#include "tiers/tier_nvme.h"
#include "transfer/device.h"

enum kvt_copy_state { KVT_COPY_ABSENT = 0, KVT_COPY_INFLIGHT = 1, KVT_COPY_PRESENT = 2 };

#define KVT_ENGINE_MAX_BLOCK_BYTES (1ull << 30) /* one block of more than 1 GiB is a mistake */
#define KVT_SLOT_QUARANTINED (KVT_NIL - 1) /* owner of a slot kept out of use for good */
#define KVT_SLOT_STORED (KVT_NIL - 2) /* owner of an NVMe slot of a restorable stored session */
/* owner of an NVMe slot that no block uses but that a journal record which may be durable still
 * names: it returns to the allocator once a superseding record is committed (engine/persist.c) */
#define KVT_SLOT_PENDING (KVT_NIL - 3)
/* an owner entry that names a block (not free, quarantined, stored or pending) */
#define KVT_OWNER_IS_BLOCK(o) ((o) < KVT_SLOT_PENDING)

/* Laid out for size (44 bytes, 4-byte aligned; 10,000 parked sessions hold 20,000 of them): the
 * prefix key as four 32-bit words (a uint64_t pair would align the record to 8 and pad it to
 * 48), then 32- and 16-bit fields, then one-bit fields. The NVMe copy's write fields live per
 * NVMe slot in the tier; what only a block with an HBM copy needs lives per HBM slot
 * (engine->hbm_h2d_seqno). The copy state per tier is 2 bits (kvt_copy_state(), never read
 * directly): enum kvt_copy_state, or KVT_COPY_RAW_STALE, an INFLIGHT copy appended to since its
 * transfer started (kvt_copy_stale(): its completion drops it). busy fits in 2 bits: every
 * transfer of a block writes a copy in another tier (its destination is INFLIGHT until the
 * transfer completes, and a tier holds one copy), so at most KVT_TIER_COUNT run at once
 * (xfer_start refuses more than KVT_BUSY_MAX all the same). The position in the creating
 * sequence is 24 bits: a sequence holds at most KVT_SEQ_MAX_BLOCKS blocks. */
#define KVT_BUSY_MAX 3u
#define KVT_SEQ_MAX_BLOCKS ((1u << 24) - 1u)
#define KVT_COPY_RAW_STALE 3u /* raw copy state: INFLIGHT, and stale (see above) */
struct kvt_block {
	uint32_t hash[4];                  /* prefix key (engine/prefix.c) when hashed: XXH3-128
	                                      of (parent's key, its tokens, salt, extra key),
	                                      as the uint64_t pair kvt_blk_key() returns; what
	                                      the prefix index and the NVMe store look blocks
	                                      up by */
	uint32_t slot[KVT_TIER_COUNT];     /* slot per tier, KVT_NIL when ABSENT */
	union {
		uint32_t seq;              /* creating sequence's index (its tokens back the
		                              prefix index entry while it holds the block) */
		uint32_t next_free;        /* free-list link when !live (seq is unused then) */
	};
	uint16_t hint_no;                  /* kvt_hint_stamp() of the latest hint announcing it
	                                      (for any sequence holding it); 0 = none: reclaim
	                                      spares it while set (engine/hint.c) */
	uint16_t pins;                     /* batch pins + append (write) pins */
	uint16_t refs;                     /* sequences referencing it (0 = cached only) */
	uint16_t dead : 1;                 /* owner gone: free once busy drops to 0 */
	uint16_t lost : 1;                 /* no valid copy left anywhere: must be recomputed */
	uint16_t protect : 1;              /* kept in its tiers by the engine (schedule
	                                      hints): eviction skips it like a pin */
	uint16_t wanted : 1;               /* asked back to HBM (resume, prepare, append) since
	                                      its last demotion started: a demotion in flight
	                                      keeps its source and stops where it is */
	uint16_t hashed : 1;               /* hash is set (a full block of known tokens) */
	uint16_t indexed : 1;              /* in the prefix index (shareable) */
	uint16_t written : 1;              /* appended to at least once (has contents) */
	uint16_t promoted : 1;             /* promoted to HBM since its last access by a batch
	                                      (stats.repromotions, engine/batch.c) */
	uint16_t copies : 2 * KVT_TIER_COUNT; /* raw copy state, 2 bits per tier (see above) */
	uint16_t busy : 2;                 /* transfers in flight on its copies (see above) */
	uint32_t index : 24;               /* position within the sequence */
	uint32_t tslot : 7;                /* 1 + its tenant's budget entry, 0 = none */
	uint32_t live : 1;                 /* owned by a sequence (or dying) */
};

/* The state of @b's copy in @tier (a stale INFLIGHT copy reads as INFLIGHT). */
static inline enum kvt_copy_state
kvt_copy_state(const struct kvt_block *b, int tier)
{
	unsigned raw = b->copies >> (2 * tier) & 3u;

	return raw == KVT_COPY_RAW_STALE ? KVT_COPY_INFLIGHT : (enum kvt_copy_state)raw;
}

/* Is @b's copy in @tier INFLIGHT with older bytes (appended to since its transfer started)? */
static inline bool
kvt_copy_stale(const struct kvt_block *b, int tier)
{
	return (b->copies >> (2 * tier) & 3u) == KVT_COPY_RAW_STALE;
}

/* Whether a transfer in flight reads @b's HOST copy: only a HOST->NVMe write or a HOST->HBM copy
 * does, and their destinations are INFLIGHT while they run. */
static inline bool
kvt_host_has_reader(const struct kvt_block *b)
{
	return kvt_copy_state(b, KVT_TIER_NVME) == KVT_COPY_INFLIGHT ||
	       kvt_copy_state(b, KVT_TIER_HBM) == KVT_COPY_INFLIGHT;
}

/* Is @b's copy in @tier valid (PRESENT: PRESENT copies are current, see above)? Inline: the
 * decode path (prepare, reclaim walks) asks it per block and tier. */
static inline bool
kvt_copy_valid(const struct kvt_block *b, int tier)
{
	return kvt_copy_state(b, tier) == KVT_COPY_PRESENT;
}

/* Does a copy of @b hold its current bytes, or will one once its transfer lands (PRESENT, or
 * INFLIGHT and not stale, in some tier)? */
static inline bool
kvt_block_current(const struct kvt_block *b)
{
	int t;

	for (t = 0; t < KVT_TIER_COUNT; t++)
		if (kvt_copy_state(b, t) != KVT_COPY_ABSENT && !kvt_copy_stale(b, t))
			return true;
	return false;
}

/* Set the state of @b's copy in @tier (not stale). */
static inline void
kvt_copy_state_set(struct kvt_block *b, int tier, enum kvt_copy_state s)
{
	b->copies = (uint16_t)((b->copies & ~(3u << (2 * tier))) | (unsigned)s << (2 * tier));
}

/* Mark @b's INFLIGHT copy in @tier stale (no effect on a copy in another state). */
static inline void
kvt_copy_mark_stale(struct kvt_block *b, int tier)
{
	if (kvt_copy_state(b, tier) == KVT_COPY_INFLIGHT)
		b->copies = (uint16_t)(b->copies | KVT_COPY_RAW_STALE << (2 * tier));
}

/* @b's prefix key into @h (meaningful when b->hashed). */
static inline void
kvt_blk_key(const struct kvt_block *b, uint64_t h[2])
{
	memcpy(h, b->hash, sizeof b->hash);
}

/* Set @b's prefix key to @h. */
static inline void
kvt_blk_set_key(struct kvt_block *b, const uint64_t h[2])
{
	memcpy(b->hash, h, sizeof b->hash);
}

/* The 16-bit stamp of hint number @no (never 0, which means "none"): two hints 65,535 apart
 * share a stamp, which can only end the sparing of a block early (engine/hint.c). */
static inline uint16_t
kvt_hint_stamp(uint64_t no)
{
	return (uint16_t)no ? (uint16_t)no : 1;
}

#define KVT_BCHUNK_SHIFT 8u                   /* block records per chunk: 1 << this */
#define KVT_BCHUNK (1u << KVT_BCHUNK_SHIFT)

#define KVT_MAX_BUDGETS 64 /* tenants with a tier budget */
_Static_assert(KVT_MAX_BUDGETS < 128, "struct kvt_block.tslot is 7 bits");
_Static_assert(sizeof(struct kvt_block) == 44, "struct kvt_block is laid out for 44 bytes");

/* With an NVME tier, HOST slots of blocks of at least this many bytes get a 4 KiB header room
 * in front of the data (host_data_off): a raw block then goes to the disk as ONE IO [header
 * page | data] from the HOST slot. The room costs 4 KiB per HOST slot, at most 6.25% of HOST
 * memory from here up; smaller blocks (where it would cost more) keep the two-IO zero-copy
 * write (header page from staging, then the data). */
#define KVT_HOST_ROOM_MIN_BLOCK ((uint64_t)64 << 10)

/* A tenant with a budget: blocks it may keep per tier, and blocks it holds there. */
struct kvt_budget {
	uint32_t tenant;                 /* tenant id */
	uint64_t max[KVT_TIER_COUNT];    /* slots it may hold per tier; 0 = unlimited */
	uint64_t used[KVT_TIER_COUNT];   /* slots its blocks hold (present or being written) */
};

/* One sealed block in the prefix index (its key is the block's hash), 4 bytes: KVT_PFX_EMPTY,
 * KVT_PFX_TOMB (deleted), a block id below KVT_PFX_OWNED (its tokens borrowed from its creator
 * sequence, b->seq at b->index), or KVT_PFX_OWNED | k: the block has its own copy of its tokens
 * in pool entry k, and pool_block[k] names the block. */
#define KVT_PFX_EMPTY KVT_NIL
#define KVT_PFX_TOMB (KVT_NIL - 1)
#define KVT_PFX_OWNED 0x80000000u /* block ids stay below it (KVT_MAX_BLOCKS) */
#define KVT_MAX_BLOCKS KVT_PFX_OWNED

/* The prefix index: open addressing over a table 70-80% full (engine/prefix.c), plus a pool of
 * token copies for the indexed blocks whose creator sequence has dropped them. */
struct kvt_prefix {
	uint32_t *tab;          /* [cap] entries (see KVT_PFX_OWNED) */
	uint64_t cap;           /* slots (0 before first use) */
	uint64_t n;             /* live entries */
	uint64_t tombs;         /* deleted entries still in probe chains */
	uint64_t collisions;    /* keys found whose tokens differed */
	uint64_t owned;         /* entries with their own token copy (pool entries in use) */
	int32_t *pool;          /* [pool_cap * tokens_per_block] token copies */
	uint32_t *pool_block;   /* [pool_cap] block owning the entry; a free entry: the next
	                           free one (KVT_NIL ends the list) */
	uint32_t pool_free;     /* first free pool entry, KVT_NIL = none */
	uint32_t pool_cap;      /* pool entries */
	uint32_t n_pool_free;   /* free pool entries */
	uint32_t *pool_tenant;  /* [pool_cap] tenant of the block of a pool entry in use (its
	                           creator's, kept when the creator dropped it) */
};

/* The block an index entry @v (neither empty nor deleted) names. */
static inline uint32_t
kvt_pentry_block(const struct kvt_prefix *p, uint32_t v)
{
	return v & KVT_PFX_OWNED ? p->pool_block[v & ~KVT_PFX_OWNED] : v;
}

/* Laid out for size (128 bytes): 64-bit fields and pointers first. */
struct kvt_seqrec {
	uint64_t salt[2];   /* prefix key material: kvt_prefix_salt(tenant, salt, extra key) */
	uint64_t last_use_ns; /* last append/prepare/resume (idle parking) */
	uint64_t n_tokens;  /* tokens held */
	uint64_t cap_tokens; /* capacity of tokens[] (exact while parked) */
	uint64_t session_key; /* caller's session key (0 = none): published when parked to NVMe */
	uint64_t hint_no;   /* e->hint_seq of its latest hint; 0 = not hinted */
	uint32_t *blocks;   /* [n_blocks] block ids */
	int32_t *tokens;    /* [n_tokens] token ids (-1 when not given); also what the prefix
	                       index compares for the indexed blocks this sequence created */
	uint32_t *wpins;    /* block ids pinned by appends since the last release */
	uint32_t gen;       /* generation: high half of the kvt_seq_id; bumped on close */
	uint32_t retention_ms; /* priority of new blocks falls back after this long; 0 = never */
	uint32_t tenant;    /* tenant id */
	uint32_t n_blocks;  /* blocks in use (ceil(n_tokens / tpb)) */
	uint32_t cap_blocks; /* capacity of blocks[] (exact while parked) */
	uint32_t n_wpins;   /* entries in wpins */
	uint32_t cap_wpins; /* capacity of wpins (0 while parked) */
	uint32_t next_free; /* free-list link when closed */
	uint32_t hint_first; /* hinted blocks [hint_first, hint_end) are spared by reclaim */
	uint32_t hint_end;   /* ... until a batch prepared after the hint is released */
	uint32_t rel_no;     /* e->rel_next at its latest batch release (0 = none): the
	                        rotation's victim order (engine/hint.c, kvt_rot_victims) */
	uint8_t priority;   /* 0..100 */
	unsigned open : 1;  /* 1 while open */
	unsigned parked : 1; /* 1 after park until resume/append/prepare */
	unsigned in_batch : 1; /* 1 while an unreleased batch holds it */
	unsigned in_call : 1;  /* 1 while an append or park of it may sleep (lock released) */
	unsigned pub_pending : 1; /* parked to NVMe, to be published once all blocks are there */
	unsigned rot_part : 1; /* 1: its latest batch held only a window of it (no MRU order) */
	unsigned seen : 1;     /* already named by an earlier entry of the batch being checked
	                          (engine/batch.c; 0 outside batch_check) */
	unsigned tail_hashed : 1; /* windowed: its struct kvt_winseq tail holds the prefix key
	                             of hole first_live - 1 (what block first_live chains to) */
};

/* A windowed engine's per-sequence window state, beside the sequence table (e->winseq, indexed
 * like e->seqs) so that struct kvt_seqrec stays 128 bytes for engines without a window. */
#define KVT_CKPT_ASKS 4u /* checkpoints one sequence may have asked for and not yet reached */
struct kvt_winseq {
	uint64_t tail[2];    /* prefix key of hole first_live - 1 while the record's tail_hashed */
	uint32_t first_live; /* blocks [kvt_win_sink_blocks, first_live) are holes, KVT_NIL in
	                        blocks[]: out of the window of its next query, dropped; 0 (or
	                        below the sinks) = none (engine/window.c) */
	uint32_t n_ask;      /* a STATE pool: checkpoints asked (kvt_win_ask) not yet kept */
	uint32_t ask[KVT_CKPT_ASKS]; /* their block indices */
};

enum kvt_xfer_kind { KVT_X_D2H = 0, KVT_X_H2N = 1, KVT_X_N2H = 2, KVT_X_H2D = 3 };

/* One block moving between two tiers. */
struct kvt_xfer {
	uint32_t block;     /* block id */
	uint32_t src_slot;  /* slot read */
	uint32_t dst_slot;  /* slot written */
	uint8_t kind;       /* enum kvt_xfer_kind (== enum kvt_move) */
	uint8_t evict_src;  /* drop the source copy when this completes (demotion) */
	uint8_t then_nvme;  /* D2H: continue down to NVMe when done (park to NVMe) */
	uint8_t then_hbm;   /* N2H: continue up to HBM when done (resume) */
	uint8_t prefetch;   /* issued ahead of need (hint, resume): so is its continuation */
	uint32_t kept;      /* D2H: leading tokens the destination holds good already (a
	                       shadow): only tokens [kept, upto) are copied; 0 = all */
	uint32_t upto;      /* D2H with kept: the block's tokens when it was queued */
	uint64_t t_issue;   /* kvt_now_ns() when created (promotion latency) */
	struct kvt_xfer *next; /* list link (device group / free list) */
};

/*
 * One flush of a direction's collected transfers and the events recorded after it. D2H: one
 * batched copy of whole blocks, one event. H2D: one batched copy per layer group (layers
 * [g * layers_per_group, (g + 1) * layers_per_group) of every block of the group, in layer
 * order), each followed by its own event, so that layer l is usable once ev[l /
 * layers_per_group] has completed; the group retires (its blocks become PRESENT) only when the
 * last event has, i.e. when every layer landed.
 */
struct kvt_xgroup {
	struct kvt_xfer *xfers;   /* its transfers */
	uint64_t seqno;           /* position in its stream's order, from 1 */
	struct kvt_xgroup *next;  /* next younger group on the same stream */
	uint32_t n_ev;            /* events in ev[] (layer groups; 1 for D2H) */
	uint32_t waiters;         /* threads sleeping on one of its events, the engine lock
	                             released: it (and its events) is freed by the last one */
	bool retired;             /* retired (off its stream) while waiters held it */
	struct kvt_event *ev[];   /* ev[i]: recorded after layer group i; ev[n_ev - 1]: all */
};

/* An in-order device stream owned by the engine, with its queue of groups in flight. */
struct kvt_xstream {
	struct kvt_stream *s;       /* device stream */
	struct kvt_xgroup *head;    /* oldest group not yet retired */
	struct kvt_xgroup *tail;    /* youngest */
	struct kvt_xfer *pending;   /* transfers collected but not yet submitted */
	uint32_t n_pending;         /* entries in pending */
	bool syncing;               /* a thread sleeps on one of its groups (lock released) */
	uint64_t submitted;         /* seqno of the last submitted group */
	uint64_t retired;           /* seqno of the last retired group */
};

struct kvt_batch {
	struct kvt_engine *e;      /* owner */
	struct kvt_batch *prev, *next; /* e->batches: prepared, not yet released (destroy frees
	                              those the caller never released) */
	uint32_t n;                /* ranges */
	uint32_t *seqidx;          /* [n] sequence indices */
	uint32_t *pinned;          /* block ids pinned by this batch */
	uint32_t n_pinned;         /* entries in pinned */
	uint64_t need_h2d;         /* h2d group whose layer events make the blocks usable (0 =
	                              every block was PRESENT when prepared) */
	uint32_t layers_ready;     /* layers [0, layers_ready) known landed (per-layer progress) */
	uint32_t n_ready;          /* blocks PRESENT in HBM when prepared (coverage) */
	uint32_t n_early;          /* blocks already on their way up when prepared (prefetched) */
	uint8_t stalled;           /* a wait of this batch found its copies unfinished */
	uint64_t hint_mark;        /* e->hint_seq at prepare: hints up to it end at release */
	uint32_t rel_mark;         /* e->rel_next at prepare (kvt_rot_continues) */
	uint8_t rot_cont;          /* prepared as its sequences' continuing turn (the latest
	                              releases were theirs): no new step, no new release order */
	uint32_t *indptr;          /* [n + 1] */
	uint32_t *indices;         /* [indptr[n]] */
	uint32_t *last_len;        /* [n] */
	uint64_t *seq_len;         /* [n] */
	uint32_t *first_block;     /* [n] */
	/* ---- layer groups (issue 16, engine/group.c) */
	uint32_t *block_pos;       /* [indptr[n]] each entry's block position in its sequence, set
	                              by a table that skips blocks (WINDOW); NULL: consecutive from
	                              first_block (kvt_batch_group_table fills pos_cache then) */
	uint32_t *pos_cache;       /* kvt_freed with the batch */
	struct kvt_batch **gsub;   /* grouped engine's batch: [n_groups] core batches (NULL for
	                              ALIAS groups); the arrays above are unused then */
	uint32_t *pos;             /* [indptr[n]] block position of each entry in its sequence
	                              (kvt_batch_block_pos) */
};

#define KVT_HINT_DEFER 64u /* hinted blocks a later call promotes (engine/hint.c) */

struct kvt_engine {
	pthread_mutex_t lock;               /* guards everything below */
	pthread_cond_t xfer_cv;             /* broadcast when a thread that slept on IO or a
	                                       copy (lock released) has processed completions */
	uint64_t xfer_gen;                  /* bumped with each such broadcast */
	bool nvme_reaping;                  /* a thread sleeps in the NVMe reap (lock released):
	                                       the CQ is its alone until it is back */
	bool nvme_defer;                    /* NVMe IO queued: kvt_unlock submits it, after the
	                                       lock is released (io_uring_submit may do the
	                                       block-layer work inline: never under the lock) */
	atomic_uint nvme_submitting;        /* threads in that submission now (polls that must
	                                       not wait leave the tier alone meanwhile) */
	struct kvt_engine_opts opts;        /* copy of the options (nvme_dir points to nvme_dir) */
	char *nvme_dir;                     /* owned copy */
	struct kvt_layout layout;           /* model layout */
	uint64_t block_bytes;               /* bytes of one block, all layers */
	uint64_t layer_block_bytes;         /* bytes of one layer of one block */
	uint64_t token_bytes;               /* K (or V) bytes of one token in one layer */
	struct kvt_device *dev;             /* device backend */
	void *hbm_base;                     /* HBM slots (device memory) */
	void *host_base;                    /* HOST slots */
	size_t host_len;                    /* bytes of host_base */
	size_t host_stride;                 /* bytes between HOST slots: block_bytes; with an
	                                       NVME tier host_data_off + block_bytes rounded up
	                                       to 4 KiB (O_DIRECT, zero-copy) */
	size_t host_data_off;               /* where a block's data starts in its HOST slot:
	                                       4096 (header room for one-IO NVMe writes) with an
	                                       NVME tier and blocks of >= KVT_HOST_ROOM_MIN_BLOCK
	                                       bytes, else 0 (kvt_slot_addr adds it) */
	bool host_pinned;                   /* host_base is page-locked */
	struct kvt_nvme *nvme;              /* NVME tier or NULL */
	struct kvt_reng *remote;            /* REMOTE tier's worker (engine/remote.c) or NULL */
	struct kvt_wb *wb;                  /* write budgets and per-key hints (engine/wbudget.c)
	                                       or NULL */
	struct kvt_slots slots[KVT_TIER_COUNT]; /* slot allocators (n_slots 0 = tier absent);
	                                       they also keep each slot's owner (kvt_owner) */
	struct kvt_evict evict[KVT_TIER_COUNT]; /* eviction policy per tier */
	struct kvt_evict_keys evkeys[KVT_TIER_COUNT]; /* its slot keys: b->slot[tier] and back */
	struct kvt_xstream d2h;             /* HBM -> HOST copies */
	struct kvt_xstream h2d;             /* HOST -> HBM copies */
	uint32_t layers_per_group;          /* layers per H2D layer group (events per group) */
	uint32_t n_lgroups;                 /* layer groups: ceil(n_layers / layers_per_group) */
	uint64_t hint_seq;                  /* hints given so far (orders hints and batches) */
	uint32_t hint_defer[KVT_HINT_DEFER]; /* hinted blocks (HOST-valid) that found no HBM
	                                       room a hint could take without waiting (the
	                                       victim's demotion still in flight): promoted by
	                                       kvt_hint_retry once room is there */
	uint32_t n_hint_defer;              /* entries in hint_defer */
	uint64_t *hbm_h2d_seqno;            /* [HBM slots] h2d group carrying the latest
	                                       host-to-device copy into the slot (valid while
	                                       its block's HBM copy is INFLIGHT) */
	bool prefetching;                   /* promotions issued now are ahead of need (hint,
	                                       resume): counted as prefetched bytes */
	bool bg_reclaim;                    /* the reclaim running is background demotion
	                                       (kvt_watermarks): under the rotation it leaves
	                                       the rotation's blocks alone (engine/residency.c) */
	bool evict_hinted;                  /* reclaim may take blocks of hinted ranges (set only
	                                       for a waiting caller's last resort) */
	struct kvt_event *compute_ev;       /* recorded on the caller's stream at release */
	struct kvt_event **ev_pool;         /* free events */
	uint32_t n_ev_pool, cap_ev_pool;    /* entries / capacity */
	struct kvt_xfer *xfer_free;         /* free transfer records */
	uint32_t nvme_inflight;             /* NVMe IOs submitted, not reaped */
	uint32_t *nvme_backlog;             /* blocks a park sends to NVMe whose HOST -> NVMe
	                                       write found the IO queue full: written as IOs
	                                       complete (kvt_xfer_backlog_kick) */
	uint32_t n_backlog, cap_backlog;
	struct kvt_block **bchunk;          /* [cap_bchunks] chunks of KVT_BCHUNK block records
	                                       (kvt_blk): the table grows a chunk at a time,
	                                       records never move */
	uint32_t cap_bchunks;               /* entries of bchunk (the first cap_blocks /
	                                       KVT_BCHUNK point to chunks) */
	uint32_t cap_blocks;                /* block records (a multiple of KVT_BCHUNK) */
	uint32_t block_free;                /* free list head (KVT_NIL = none) */
	uint32_t n_live_blocks;             /* blocks live */
	struct kvt_seqrec *seqs;            /* [cap_seqs] */
	uint32_t cap_seqs;                  /* capacity */
	uint32_t seq_free;                  /* free list head */
	uint32_t n_open_seqs;               /* open sequences */
	uint32_t n_batches;                 /* unreleased batches */
	struct kvt_batch *batches;          /* prepared, not yet released (list) */
	uint32_t hbm_pinned;                /* blocks pinned (their HBM slots are spoken for) */
	uint32_t quarantined[KVT_TIER_COUNT]; /* slots kept out of use after device failures */
	uint32_t demoting[KVT_TIER_COUNT];  /* demotions in flight whose source slot in that
	                                       tier is freed on completion */
	struct kvt_stats st;                /* counters (size unused internally; evictions
	                                       is derived by kvt_engine_stats) */
	struct kvt_store *store;            /* journal of published sessions (nvme_persist) */
	bool pub_check;                     /* a publish may be due (see engine/persist.c) */
	uint64_t *slot_tenants;             /* [NVMe slots] (store only): which tenants' stored
	                                       sessions name the slot (persist_slot_tenants) */
	uint64_t slot_tenants_at;           /* kvt_store_changes() + 1 it was built at; 0 = none */
	uint8_t *nvme_named;                /* [NVMe slots] (store only): 1 while a journal
	                                       record that may be durable names the slot */
	uint32_t *pend;                     /* NVMe slots whose naming record was superseded
	                                       by one not yet committed */
	uint32_t n_pend, cap_pend;          /* entries / capacity of pend */
	uint32_t nvme_late;                 /* NVMe slots quarantined by a timed-out write
	                                       until the kernel's late completion comes */
	uint32_t host_late;                 /* HOST slots quarantined by a timed-out zero-copy
	                                       NVMe read (the kernel may still write them)
	                                       until its late completion comes */
	uint64_t nvme_backoff_until;        /* ns: no background demotion to NVMe before this
	                                       (set by an ENOSPC write) */
	uint64_t idle_next_ns;              /* next idle scan (kvt_engine_poll) */
	uint32_t nvme_promised;             /* NVMe slots kept free for parks' blocks on their
	                                       way down (a HBM->HOST copy whose write to NVMe
	                                       starts when it lands): other NVMe allocations
	                                       leave them (engine/residency.c, seq.c) */
	struct kvt_prefix prefix;           /* index of sealed blocks (engine/prefix.c) */
	struct kvt_budget budget[KVT_MAX_BUDGETS]; /* per-tenant tier budgets (engine/tenant.c) */
	uint32_t n_budgets;                 /* entries in budget */
	uint32_t rel_next;                  /* batch releases of sequences so far (s->rel_no) */
	uint32_t step_start;                /* rel_next when the current step began: a step
	                                       ends when a sequence released in it is prepared
	                                       again (the rotation came around) */
	uint32_t prev_step_start;           /* ... when the previous step began */
	uint32_t *rel_ring;                 /* [KVT_REL_RING] seq index by rel_no % size
	                                       (allocated at the first hint) */
	/* ---- layer groups (issue 16, engine/group.c) */
	uint64_t v_token_bytes;             /* V bytes of one token in one layer (token_bytes is
	                                       K's): differs with a FULL group's v_head_dim, 0
	                                       for a LATENT group's pool (K only) */
	bool dev_borrowed;                  /* dev belongs to the grouped engine (not destroyed
	                                       with this pool) */
	uint64_t groups_fp;                 /* a pool of a grouped engine: the groups'
	                                       fingerprint in its store's superblock; else 0 */
	uint32_t group_index;               /* ... and its group */
	struct kvt_grp *grp;                /* non-NULL: this is a grouped engine, a front over
	                                       one core engine per storage group; none of the
	                                       fields above but dev is used then */
	/* SIDECAR (issue 17, engine/sidecar.c): per layer of a block, sc_len bytes at sc_off
	 * after the layer's K/V that move with the block; a host mirror of them per block
	 * record for reading without bringing the block up */
	uint64_t sc_off;                    /* offset of the sidecar in a layer of a block */
	uint64_t sc_len;                    /* its bytes per layer; 0 = none in the block */
	uint64_t sc_rec;                    /* mirror bytes per layer: sc_len, or a summary's
	                                       (sc_summary); 0 = no mirror */
	bool sc_summary;                    /* the mirror holds the Quest summary of K */
	uint8_t **sc_chunk;                 /* [cap_bchunks]: KVT_BCHUNK valid bytes, then
	                                       KVT_BCHUNK x n_layers x sc_rec mirror bytes */
	uint8_t *sc_tmp;                    /* [block_bytes]: an HBM block read for the mirror */
	struct kvt_stream *sc_stream;       /* reads of HBM copies (created at the first) */
	uint32_t win_tokens;                /* sliding window in tokens (0 = full attention):
	                                       kvt_engine_set_window (engine/window.c) */
	uint32_t win_sink;                  /* leading tokens always visible (window only) */
	uint32_t ckpt_every;                /* a STATE pool: index every this-th full block
	                                       (0, 1: all; KVT_CHECKPOINT_ASKED: none but the
	                                       asked ones) */
	bool seq_opened;                    /* a sequence was opened: the window is fixed */
	struct kvt_winseq *winseq;          /* windowed: [cap_seqs], grown with the sequence
	                                       table; NULL without a window */
	struct kvt_ext_state *ext;          /* the external pool (engine/ext.c) or NULL */
};

#define KVT_REL_RING 4096u /* releases remembered for the rotation's victim order */

/* ---- engine.c */
/* Create one core engine of layout o->layout with @v_dim V elements per head (0: K only) on
 * device @dev (NULL: its own). @layer_bytes != 0: a STATE group's pool, whose block is
 * @layer_bytes per layer whatever the layout's heads and tokens (no per-token K/V).
 * @sidecar_bytes != 0: each layer of a block carries that many sidecar bytes after its K/V
 * (a SIDECAR group's, engine/sidecar.c). */
int kvt_engine_create_core(const struct kvt_engine_opts *o, uint32_t v_dim, uint64_t layer_bytes,
			   uint64_t sidecar_bytes, struct kvt_device *dev, uint64_t groups_fp,
			   uint32_t group, struct kvt_engine **out);
/* ---- sidecar.c */
/* Make the mirror of core @e hold the Quest summary of each block's K (before its first
 * block). */
void kvt_sc_summarize(struct kvt_engine *e);
/* Grow the mirror with the block table's chunk @c (a chunk of KVT_BCHUNK records). */
int kvt_sc_grow(struct kvt_engine *e, uint32_t c);
/* Block @id's mirror no longer holds its bytes (a new block, or one appended to). */
void kvt_sc_invalidate(struct kvt_engine *e, uint32_t id);
/* Block @id's bytes are at @blk (a host-visible copy of the whole block): mirror them. */
void kvt_sc_fill(struct kvt_engine *e, uint32_t id, const void *blk);
/* Copy the sidecar of layer @layer of blocks [@first, @first + @n) of sequence @id into @dst
 * ([n][sc_len]); kvt_seq_sidecar_read()'s core (engine/kvtier.h). Takes the lock. */
int kvt_sc_read(struct kvt_engine *e, kvt_seq_id id, uint32_t layer, uint32_t first, uint32_t n,
		void *dst);
void kvt_sc_fini(struct kvt_engine *e);
void kvt_engine_log(struct kvt_engine *e, int level, const char *fmt, ...) KVT_PRINTF(3, 4);
/* The most blocks one sequence may hold: all tiers' usable slots less one per tier below HBM
 * (the reserve; kvtier.h kvt_seq_append). */
uint32_t kvt_seq_max_blocks(const struct kvt_engine *e);

/* ---- engine/block.c: blocks, copies, slots */
int kvt_block_new(struct kvt_engine *e, uint32_t seq, uint32_t index, uint32_t *out);
void kvt_block_kill(struct kvt_engine *e, uint32_t id);  /* a referencing sequence drops it */
void kvt_block_ref(struct kvt_engine *e, uint32_t id);   /* one more sequence references it */
void kvt_block_uncache(struct kvt_engine *e, uint32_t id); /* free a cached (refs 0) block */
/* kvt_block_uncache of a block whose copy in @tier was evicted: counted in the tier's
 * evictions; the policy of @tier is told (kvt_evict_evicted) when the block is freed now. */
void kvt_block_uncache_evicted(struct kvt_engine *e, uint32_t id, int tier);
void kvt_block_try_free(struct kvt_engine *e, uint32_t id); /* frees a dead, idle block */
bool kvt_copy_evictable(const struct kvt_block *b, int tier); /* may reclaim pick this copy */
int kvt_slot_alloc(struct kvt_engine *e, int tier, uint32_t block, uint32_t *slot);
/* Give @slot of @tier back (an NVMe slot a journal record may still name waits as
 * KVT_SLOT_PENDING), undoing kvt_slot_alloc's tenant accounting. */
void kvt_slot_free(struct kvt_engine *e, int tier, uint32_t slot);
/* A slot a failed device copy may still be writing: never handed out again (leaked on purpose);
 * the block's copy there is forgotten. */
void kvt_slot_quarantine(struct kvt_engine *e, int tier, uint32_t slot, uint32_t block);
void kvt_copy_drop(struct kvt_engine *e, uint32_t id, int tier); /* free a PRESENT copy */
/* kvt_copy_drop of an eviction (making room), counted in the tier's evictions here; the
 * policy hears it through kvt_evict_evicted, every other drop through ops->remove. */
void kvt_copy_evict(struct kvt_engine *e, uint32_t id, int tier);
void kvt_copy_set_present(struct kvt_engine *e, uint32_t id, int tier); /* current bytes */
void kvt_copy_fail(struct kvt_engine *e, uint32_t id, int tier); /* an INFLIGHT copy failed */
/* Contents change from token @kept of the block on (an append; 0 = a new block): copies below
 * HBM are dropped, a HOST copy with @kept > 0 kept as a shadow (engine/block.c). */
void kvt_block_bump_ver(struct kvt_engine *e, uint32_t id, uint32_t kept);
/* Whether @e keeps shadows of HOST copies (a pool whose blocks are K/V rows of tokens). */
bool kvt_shadow_on(const struct kvt_engine *e);
/* A HOST slot for demoting @id from HBM: its shadow when it has one (*kept = the tokens
 * there still good, which the copy skips), else a fresh one (*kept = 0). 0 or -ENOSPC. */
int kvt_slot_alloc_d2h(struct kvt_engine *e, uint32_t id, uint32_t *slot, uint32_t *kept);
void kvt_block_pin(struct kvt_engine *e, uint32_t id);
void kvt_block_unpin(struct kvt_engine *e, uint32_t id);
void kvt_block_check_lost(struct kvt_engine *e, uint32_t id);
/* Give block @id priority @prio until @until_ns (0 = for good) in every tier's policy. */
void kvt_block_set_prio(struct kvt_engine *e, uint32_t id, uint8_t prio, uint64_t until_ns);
void *kvt_slot_addr(struct kvt_engine *e, int tier, uint32_t slot);

/* ---- engine/prefix.c: the content-addressed index of sealed blocks */
void kvt_prefix_hash(const uint64_t parent[2], const int32_t *tokens, uint32_t n,
		     const uint64_t salt[2], uint64_t out[2]);
/* The key material of a sequence (struct kvt_seqrec.salt): XXH3-128 of (tenant, salt, extra
 * key), so the tenant is part of every prefix key whatever salt the caller gives. */
void kvt_prefix_salt(uint32_t tenant, uint64_t salt, uint64_t extra_key, uint64_t out[2]);
/* The indexed block with key @h, tokens @tokens and tenant @tenant, or KVT_NIL (a key found with
 * other tokens or of another tenant counts as a collision: never shared). */
uint32_t kvt_prefix_find(struct kvt_engine *e, const uint64_t h[2], const int32_t *tokens,
			 uint32_t tenant);
/* Whether indexed block @id's tenant is known to the index (always, for an indexed block):
 * into *tenant. */
bool kvt_prefix_tenant(struct kvt_engine *e, uint32_t id, uint32_t *tenant);
uint32_t kvt_prefix_key_block(struct kvt_engine *e, const uint64_t h[2]); /* no token check */
/* Index sealed block @id; its tokens are borrowed from its creator sequence (b->seq). */
int kvt_prefix_insert(struct kvt_engine *e, uint32_t id);
/* Index block @id (no creator sequence: a REMOTE fetch) with its own copy of @tokens and
 * @tenant. 0, -EEXIST (its key is indexed already), -ENOMEM. */
int kvt_prefix_insert_owned(struct kvt_engine *e, uint32_t id, const int32_t *tokens,
			    uint32_t tenant);
/* Block @id's creator sequence drops it (close, truncate): an indexed block that stays gets
 * its own token copy (-ENOMEM: it leaves the index instead). */
int kvt_prefix_detach(struct kvt_engine *e, uint32_t id);
void kvt_prefix_remove(struct kvt_engine *e, uint32_t id);
void kvt_prefix_fini(struct kvt_engine *e);
uint64_t kvt_prefix_meta_bytes(const struct kvt_engine *e);  /* table, without tokens */
uint64_t kvt_prefix_token_bytes(const struct kvt_engine *e); /* the entries' own tokens */
/* Match the full blocks of @tokens against the index: fills ids[0..k) and returns k. */
uint32_t kvt_prefix_walk(struct kvt_engine *e, const int32_t *tokens, uint64_t n,
			 const uint64_t salt[2], uint32_t tenant, uint32_t *ids, uint32_t max);
/* kvt_prefix_walk of a windowed engine: only the sinks and the window before the hit boundary
 * must be found; ids[] gets KVT_NIL for the blocks between, *tail the key of the last of them
 * (see engine/prefix.c). Returns the blocks of the hit. */
uint32_t kvt_prefix_walk_window(struct kvt_engine *e, const int32_t *tokens, uint64_t n,
				const uint64_t salt[2], uint32_t tenant, uint32_t *ids,
				uint32_t max, uint64_t tail[2]);
/* Test hook: when set, replaces XXH3-128 (tests force collisions through it). */
extern void (*kvt_test_prefix_hash)(const uint64_t parent[2], const int32_t *tokens, uint32_t n,
				    const uint64_t salt[2], uint64_t out[2]);

/* ---- engine/tenant.c: per-tenant tier budgets */
uint8_t kvt_tenant_slot(const struct kvt_engine *e, uint32_t tenant); /* 1 + index or 0 */
void kvt_tenant_account(struct kvt_engine *e, uint32_t block, int tier, int delta);
void kvt_tenant_enforce(struct kvt_engine *e); /* demote over-budget tenants' blocks */

/* ---- engine/residency.c: making room, demotion and promotion */
int kvt_reclaim(struct kvt_engine *e, int tier, uint32_t need, bool may_wait);
/* Room for a copy of block @id from tier @src into @dst: one slot of @dst reclaimed (waiting if
 * @may_wait). A wait releases the lock, so then the block's @dst copy must still be ABSENT and
 * its @src copy valid, else 1 (another thread moved it: look again). 0, 1 or reclaim's code
 * (-EAGAIN without @may_wait when it would have to wait, -ENOSPC, ...). */
int kvt_room_for_copy(struct kvt_engine *e, uint32_t id, int src, int dst, bool may_wait);
/* Free @id's copy in @tier: 1 = slot free now, 0 = demotion submitted, <0 = cannot. */
int kvt_evict_one(struct kvt_engine *e, int tier, uint32_t id, bool may_wait);
int kvt_demote_to(struct kvt_engine *e, uint32_t id, int target, bool may_wait);
int kvt_promote_hbm(struct kvt_engine *e, uint32_t id, bool may_wait);
/* Block @id's valid HOST copy goes up: room in HBM (its HOST copy protected meanwhile), a slot,
 * the host-to-device copy queued for the next kvt_xfer_flush() (counted by kvt_promo_note).
 * 0, or <0 as kvt_reclaim (nothing queued then). Requires e->lock. */
int kvt_promote_from_host(struct kvt_engine *e, uint32_t id, bool may_wait);
void kvt_reclaim_for(struct kvt_engine *e, int tier, const uint32_t *ids, uint32_t n);
/* Room for @want (<= KVT_ROOM_CLEAN_MAX) speculative copies in @tier that loses nothing: the
 * free slots, plus those of clean copies (valid in another tier), coldest first in the tier's
 * policy (at most @want + 64 looked at), except those @spare (may be NULL) keeps. No demotion
 * started, nothing dropped that is the last copy. Returns the slots free now, <= @want.
 * Requires e->lock. (The REMOTE fetches of prefix lookups and of the external pool: a guess
 * must not cost a block.) */
#define KVT_ROOM_CLEAN_MAX 256u
uint32_t kvt_room_clean(struct kvt_engine *e, int tier, uint32_t want,
			bool (*spare)(const struct kvt_engine *e, uint32_t id, void *arg),
			void *arg);
void kvt_watermarks(struct kvt_engine *e);
#define KVT_ENOSPC_DROP 16u                  /* clean NVMe copies dropped per ENOSPC write */
#define KVT_ENOSPC_BACKOFF_NS 200000000ull   /* background NVMe demotion paused this long */
void kvt_nvme_enospc(struct kvt_engine *e);  /* an NVMe write failed with -ENOSPC */

/* Free every batch not yet released (kvt_engine_destroy; engine lock not needed then). */
void kvt_batch_free_all(struct kvt_engine *e);

/* ---- engine/xfer.c: submission and completion */
int kvt_xfer_init(struct kvt_engine *e);
void kvt_xfer_fini(struct kvt_engine *e);
/* HBM -> HOST into @host_slot; @kept: leading tokens the slot holds good already (its shadow,
 * kvt_slot_alloc_d2h): only the rest of each layer's K and V rows is copied. */
int kvt_xfer_d2h(struct kvt_engine *e, uint32_t id, uint32_t host_slot, uint32_t kept,
		 bool evict_src, bool then_nvme);
int kvt_xfer_h2d(struct kvt_engine *e, uint32_t id, uint32_t hbm_slot);
/* Submit the parked blocks waiting for room in the NVMe IO queue (lock held); the ones no
 * longer to write leave the backlog. Returns how many remain. */
uint32_t kvt_xfer_backlog_kick(struct kvt_engine *e);
int kvt_xfer_h2n(struct kvt_engine *e, uint32_t id, uint32_t nvme_slot, bool evict_src,
		 bool may_wait);
int kvt_xfer_n2h(struct kvt_engine *e, uint32_t id, uint32_t host_slot, bool then_hbm,
		 bool may_wait);
int kvt_xfer_flush(struct kvt_engine *e);             /* submit collected device copies */
int kvt_xfer_flush_down(struct kvt_engine *e);        /* ... demotions only (not H2D) */
int kvt_xfer_poll(struct kvt_engine *e, uint32_t max); /* process ready completions */
/* Completions a call that need not wait processes at most (kvt_xfer_poll's max). */
#define KVT_XFER_POLL_BOUND 64u
/* Block for >= 1 completion, the lock released while asleep (state may change meanwhile). */
int kvt_xfer_wait_any(struct kvt_engine *e);
int kvt_xfer_wait_block(struct kvt_engine *e, uint32_t id); /* ... for the copy into @id */
/* Sleep, the lock released, until layer @layer of the youngest host-to-device group from
 * @seqno on has landed (that group held meanwhile: its event is never freed or reused under
 * the sleeper). 0 or the device's code. */
int kvt_xfer_sleep_h2d(struct kvt_engine *e, uint64_t seqno, uint32_t layer);
uint64_t kvt_xfer_inflight(const struct kvt_engine *e);
/* Event after layer @layer's copies of h2d group @seqno (NULL when that group has retired). */
struct kvt_event *kvt_xfer_h2d_event(struct kvt_engine *e, uint64_t seqno, uint32_t layer);

/* ---- engine/stats.c */
void kvt_stats_record_promote(struct kvt_engine *e, int tier, uint64_t ns);
void kvt_stats_record_lat(struct kvt_lat_hist *h, uint64_t ns);
void kvt_stats_record_issue(struct kvt_engine *e, int tier, uint64_t bytes);

/* ---- engine/hint.c */
bool kvt_hint_spares(const struct kvt_engine *e, const struct kvt_block *b, int tier);
void kvt_hint_end(struct kvt_engine *e, struct kvt_seqrec *s, uint64_t mark);
/* Block @id's host-to-device copy was just queued / it was accessed by a batch (counts
 * stats.repromotions). Requires e->lock. */
void kvt_promo_note(struct kvt_engine *e, uint32_t id);
void kvt_promo_access(struct kvt_engine *e, uint32_t id);
/* Promote the hinted blocks that found no room at their hint, into room free now or made by
 * dropping clean copies of the rotation (kvt_rot_victims); never waits. Requires e->lock. */
void kvt_hint_retry(struct kvt_engine *e);
/* @s's hint no longer holds (parked, closed, truncated): unstamp its blocks. Requires e->lock. */
void kvt_hint_drop(struct kvt_engine *e, struct kvt_seqrec *s);
/* Rotation bookkeeping: whether a batch of the sequences @seqidx[0..n) continues their turn
 * (the latest n releases were exactly theirs: a caller that prepares a sequence once per layer,
 * or once more for its appended block); @s is prepared (@whole: every live block of it, from
 * its first, or first in-window, block to its last; @cont: kvt_rot_continues) / released (@keep:
 * a continuing batch with no release since its prepare: the order stays as it was). */
bool kvt_rot_continues(const struct kvt_engine *e, const uint32_t *seqidx, uint32_t n);
void kvt_rot_prepared(struct kvt_engine *e, struct kvt_seqrec *s, bool whole, bool cont);
void kvt_rot_released(struct kvt_engine *e, struct kvt_seqrec *s, uint32_t idx, bool keep);
/* Whether @b belongs to the rotation: shared (refs > 1), held by a sequence other than its
 * closed creator, or its creator was used in this step or the previous one. */
bool kvt_rot_member(const struct kvt_engine *e, const struct kvt_block *b);
/* Up to @max HBM victims of the rotation, furthest next use first (Belady for a cyclic
 * schedule: the sequence released last, its last block first). Returns how many. */
uint32_t kvt_rot_victims(struct kvt_engine *e, uint32_t *out, uint32_t max);

/* ---- engine/seq.c */
struct kvt_seqrec *kvt_seq_lookup(struct kvt_engine *e, kvt_seq_id id, uint32_t *idx);
void kvt_seq_unpin_writes(struct kvt_engine *e, struct kvt_seqrec *s);
/* HBM blocks write-pinned by appends of open sequences (no release or park since): what an
 * -ENOSPC message names besides batches. O(sequences); for error paths. */
uint32_t kvt_seq_wpinned(const struct kvt_engine *e);
/* At release: put the sequence's write-pinned hashed blocks (K/V now written) in the index. */
void kvt_seq_publish(struct kvt_engine *e, struct kvt_seqrec *s);
void kvt_seq_truncate(struct kvt_engine *e, struct kvt_seqrec *s, uint32_t first_lost);
int kvt_seq_park_locked(struct kvt_engine *e, struct kvt_seqrec *s, int target);
void kvt_seq_idle_scan(struct kvt_engine *e); /* park sequences idle for idle_timeout_ms */
uint64_t kvt_meta_bytes(const struct kvt_engine *e); /* host metadata kvtier holds, no tokens */
uint64_t kvt_meta_token_bytes(const struct kvt_engine *e); /* host bytes of token ids */

/* Test hook: when set before kvt_engine_create, the NVME tier is opened with these fault hooks
 * (tests/ inject EIO, short IO and bit flips through it). NULL in production. */
extern const struct kvt_nvme_fault_hooks *kvt_test_nvme_hooks;
/* Test hook: with an NVME tier, blocks of at least this many bytes get the HOST header room
 * (one-IO zero-copy writes); KVT_HOST_ROOM_MIN_BLOCK in production. Tests set it (before
 * kvt_engine_create) to 1 to take that path with their small layouts. */
extern uint64_t kvt_test_host_room_min_block;
/* Test hook: when nonzero, counts down at each block a prefix attach or restore makes from a
 * stored session (engine/persist.c persist_adopt), which fails (-ENOMEM) when it reaches 0.
 * 0 in production. */
extern uint32_t kvt_test_adopt_fail;

/* ---- engine/persist.c: published sessions of the persistent NVMe store */
int kvt_persist_open(struct kvt_engine *e);   /* after the NVME tier opened: journal, slots */
void kvt_persist_close(struct kvt_engine *e); /* publish what is due, close the journal */

/* ---- engine/remote.c (issue 18): the REMOTE tier's worker thread */
int kvt_reng_open(struct kvt_engine *e);   /* at create, with opts.remote_host */
void kvt_reng_close(struct kvt_engine *e); /* at destroy, before the lock: joins the worker */
void kvt_reng_reap(struct kvt_engine *e);  /* under the lock: completions -> stats */
void kvt_reng_drain(struct kvt_engine *e); /* without the lock: waits for queued jobs */
/* Write-through (item 1), under the lock: sealed block @id became shareable or was seen again
 * (@evidence: attached by a second sequence, or sealed by another); per opts.remote_write its
 * bytes are snapshotted into the pending write-through job. kvt_reng_kick queues that job: call
 * it before the lock is released. */
void kvt_reng_sealed(struct kvt_engine *e, uint32_t id, bool evidence);
void kvt_reng_kick(struct kvt_engine *e);
/* Remote prefix lookup (item 2), under the lock: the full blocks @k.. of @tokens (@n tokens) that
 * missed locally are fetched asynchronously into HOST slots (INFLIGHT, written by the worker);
 * they enter the prefix index as cached blocks when reaped verified. Returns the blocks asked. */
uint32_t kvt_reng_lookup(struct kvt_engine *e, const int32_t *tokens, uint64_t n,
			 const uint64_t salt[2], uint32_t tenant, uint32_t k, uint32_t max);
/* The external pool's side (engine/ext.c), under the lock. kvt_reng_ext_offer: stored block
 * @id (key @k of @tenant: ext.c's REMOTE key of the caller's hash; its first @used bytes are the
 * block's) landed (@evidence false) or was stored again / loaded (true): written through per
 * opts.remote_write, as kvt_reng_sealed. kvt_reng_can_fetch: a REMOTE tier to fetch from.
 * kvt_reng_ext_fetch: the @n (<= 256) blocks @ids (HOST slots INFLIGHT, busy) are fetched under
 * @keys by one pipelined get; reaped, each goes back to kvt_ext_fetched (verified and in the
 * leading run, or not). Returns 0, -ENOMEM (nothing queued: the caller undoes the blocks). */
void kvt_reng_ext_offer(struct kvt_engine *e, uint32_t id, uint32_t tenant, const uint64_t k[2],
			uint64_t used, bool evidence);
bool kvt_reng_can_fetch(const struct kvt_engine *e);
int kvt_reng_ext_fetch(struct kvt_engine *e, uint32_t tenant, const uint64_t (*keys)[2],
		       const uint32_t *ids, uint32_t n);
/* Whether block @id is an INFLIGHT remote fetch (kvt_engine_check); whether the prefix key of
 * block @k of @tokens is being fetched (an attach that stopped there: stats.remote_late_blocks). */
bool kvt_reng_fetching(const struct kvt_engine *e, uint32_t id);
void kvt_reng_note_late(struct kvt_engine *e, const int32_t *tokens, uint64_t n,
			const uint64_t salt[2], uint32_t tenant, uint32_t k);

/* ---- engine/wbudget.c (issue 18 item 5): lower tiers' write budgets, per-key hints */
enum { KVT_WB_NVME = 0, KVT_WB_REMOTE = 1 };
#define KVT_KEY_EVID 1u            /* reuse evidence: seen twice */
#define KVT_KEY_RBIT 2u            /* put to REMOTE or seen there (a hint) */
#define KVT_KEY_REFUSED(w) (4u << (w)) /* a write to lower tier w was refused */
int kvt_wb_open(struct kvt_engine *e);   /* at create, after kvt_reng_open */
void kvt_wb_close(struct kvt_engine *e);
uint64_t kvt_wb_meta_bytes(const struct kvt_engine *e); /* for kvt_stats.meta_bytes */
uint32_t kvt_key_flags(struct kvt_engine *e, const uint64_t k[2], uint32_t tenant);
void kvt_key_mark(struct kvt_engine *e, const uint64_t k[2], uint32_t tenant, uint32_t set,
		  uint32_t clear);
/* A write of @bytes to lower tier @w (key @k of @tenant, or NULL): true = admitted (charged).
 * @must: it has to happen (charged, never refused). */
bool kvt_wb_admit(struct kvt_engine *e, int w, uint64_t bytes, bool evidence, bool must,
		  const uint64_t k[2], uint32_t tenant);
/* A lookup of tier @w missed key @k: a hit lost when its write had been refused. */
void kvt_wb_miss(struct kvt_engine *e, int w, const uint64_t k[2], uint32_t tenant);
void kvt_persist_publish(struct kvt_engine *e); /* publish sessions whose park completed */
void kvt_persist_forget(struct kvt_engine *e, struct kvt_seqrec *s); /* seq closed: DEL */
void kvt_persist_keep(struct kvt_engine *e, struct kvt_seqrec *s); /* seq detached: restorable */
void kvt_persist_parked(struct kvt_engine *e, struct kvt_seqrec *s); /* parked to NVMe */
int kvt_persist_reclaim(struct kvt_engine *e, uint32_t need); /* free stored sessions' slots */
/*
 * Prefix blocks after a restart: the restorable stored session whose block @k carries the prefix
 * key that block k of @tokens chains to (salt @salt), its tokens equal to @tokens up to there;
 * then its following blocks while keys and tokens keep matching, up to block @max and each
 * header checked. Returns how many blocks from @k on match. With @seq (a sequence index, not
 * UINT32_MAX) they become new blocks of it in ids[k..], refs 1, their NVMe copy the stored slot
 * (which the record keeps naming: restoring that session later shares them), in the prefix
 * index. Needs tokens up to block max. Only sessions stored for @tenant are used (the record's
 * tenant, compared as well as the key).
 */
/*
 * kvt_persist_prefix() of a windowed engine (engine/window.c; a STATE pool is one): the longest
 * boundary K in (@k, @max] (and K * tpb <= @n) at which a restorable session stored for @tenant
 * before a restart, its tokens equal to @tokens up to K * tpb, holds what a hit of K blocks
 * reads, as stored blocks whose keys and headers check: the sink blocks below the window and
 * [kvt_win_first_block(K * tpb), K) (the rest may be its holes). Returns K, or 0 when no stored
 * session serves a boundary above @k. With @seq (a sequence index, not UINT32_MAX) the blocks
 * read become new blocks of it in ids[0..K) (KVT_NIL for the others), refs 1, their NVMe copy
 * the stored slot, in the prefix index, and *tail the key of block first - 1 when first > 0
 * (what block first chains to); on a failure to make them nothing is made, @ids and @tail are
 * left as they were and 0 is returned. Cost: per stored session of the tenant, a token
 * compare of the common blocks, then per candidate boundary (longest first) the key and owner
 * tests of the blocks it reads; each block's NVMe header is read at most once per call. Runs
 * under the engine lock, as the FULL walk's store lookup does.
 */
uint32_t kvt_persist_prefix_window(struct kvt_engine *e, uint32_t tenant, const int32_t *tokens,
				   uint64_t n, const uint64_t salt[2], uint32_t k, uint32_t max,
				   uint32_t seq, uint32_t *ids, uint64_t tail[2]);
uint32_t kvt_persist_prefix(struct kvt_engine *e, uint32_t tenant, const int32_t *tokens,
			    const uint64_t salt[2], uint32_t k, uint32_t max, uint32_t seq,
			    uint32_t *ids);
/* An NVMe slot named by a journal record that may be durable: kept out of the allocator. */
static inline bool
kvt_persist_named(const struct kvt_engine *e, int tier, uint32_t slot)
{
	return tier == KVT_TIER_NVME && e->nvme_named && e->nvme_named[slot];
}

/* ---- engine/seq.c (internal) */
/* The caller's options @o (NULL: the defaults) as a full struct in @dst: fields @o's opts_size
 * leaves out keep kvt_seq_opts_init()'s defaults. 0, or -EINVAL (kvt_err) when opts_size does
 * not reach priority or is over 4096, or priority is over 100. */
int kvt_seq_opts_copy(struct kvt_seq_opts *dst, const struct kvt_seq_opts *o);
int kvt_seq_open_locked(struct kvt_engine *e, const struct kvt_seq_opts *o, uint32_t *idx);
/* grow a sequence's arrays to hold n_tokens, n_blocks and n_wpins; 0 or -ENOMEM */
int kvt_seq_reserve(struct kvt_seqrec *s, uint64_t n_tokens, uint32_t n_blocks, uint32_t n_wpins);

/* ---- engine/window.c: sliding-window semantics (issue 16 item 3; internal)
 * Make @e a sliding-window engine: the key at position k is visible from the query at position
 * q iff q - @window < k <= q (transformers' masking_utils sliding window), and the first @sink
 * tokens are always visible (StreamingLLM sinks). Blocks wholly out of the window of a
 * sequence's next query, and not sink blocks, leave the sequence at its appends. @window 0
 * (with @sink 0) is full attention, the default. Only before the first sequence is opened:
 * -EINVAL (kvt_err) after that, or for a @sink without a @window, or a NULL engine. Takes
 * e->lock. */
int kvt_engine_set_window(struct kvt_engine *e, uint32_t window, uint32_t sink);
/* Leading blocks of a sequence holding sink tokens (0 without a window): never dropped. */
uint32_t kvt_win_sink_blocks(const struct kvt_engine *e);
/* The first block holding a key of the window (past the sinks) that the query at token
 * position @q reads: 0 without a window. */
uint32_t kvt_win_first_block(const struct kvt_engine *e, uint64_t q);
/* The first block past @s's sinks that a coming query reads: that of the query at position
 * n_tokens (the one its next append writes), or the first live one if higher. The live blocks
 * below it have left the window and wait for that append to drop them (0 without a window). */
uint32_t kvt_win_next_first(const struct kvt_engine *e, const struct kvt_seqrec *s);
/* Entries of @s->blocks[first, end) that are not holes (all of them without a window). */
uint32_t kvt_seq_live_in(const struct kvt_engine *e, const struct kvt_seqrec *s, uint32_t first,
			 uint32_t end);
/* The block position of each entry of @b's block table (struct kvt_block_table.indices),
 * [indptr[n_seqs]]: consecutive for a full-attention engine; a windowed one lists only live
 * blocks (its sinks, then the window's). seq_len of a whole-sequence entry stays the
 * sequence's token count, so the query's position is seq_len - 1. Lives until release. */
const uint32_t *kvt_batch_block_pos(const struct kvt_batch *b);
/* Windowed engine: @s drops the blocks that neither the query at position @q nor any later one
 * reads (wholly before the window, not sinks): their reference (and write pin) goes; an indexed
 * block stays cached (refs 0) when prefix_cache keeps it, else it leaves every tier. No-op
 * without a window. Requires e->lock (engine/seq.c). */
void kvt_win_advance(struct kvt_engine *e, struct kvt_seqrec *s, uint64_t q);
/* The tail key of sequence record @s (2 words; windowed engines only). */
static inline uint64_t *
kvt_win_tail(const struct kvt_engine *e, const struct kvt_seqrec *s)
{
	return e->winseq[s - e->seqs].tail;
}

/* The first live block past @s's holes (struct kvt_winseq; 0 without a window). */
static inline uint32_t
kvt_seq_first_live(const struct kvt_engine *e, const struct kvt_seqrec *s)
{
	return e->winseq ? e->winseq[s - e->seqs].first_live : 0;
}

/* Set it (a no-op without a window, where it is always 0). */
static inline void
kvt_seq_set_first_live(struct kvt_engine *e, struct kvt_seqrec *s, uint32_t v)
{
	if (e->winseq)
		e->winseq[s - e->seqs].first_live = v;
}
/* A STATE pool's checkpoint policy (engine/window.c, kvtier.h "STATE groups"): which full
 * blocks its sequences index (keep cached) when published. */
bool kvt_win_keep(struct kvt_engine *e, struct kvt_seqrec *s, uint32_t index);
/* Keep the checkpoint of block @index of sequence @id (kvt_seq_checkpoint). Takes the lock. */
int kvt_win_ask(struct kvt_engine *e, kvt_seq_id id, uint32_t index);
/* ---- engine/ext.c: the external-pool mode (issue 19). Its stored blocks are cached blocks
 * (refs 0) whose creator is KVT_EXT_SEQ (no sequence) */
#define KVT_EXT_SEQ (KVT_NIL - 1)
void kvt_ext_block_freed(struct kvt_engine *e, uint32_t id); /* block.c: block @id freed */
void kvt_ext_read_failed(struct kvt_engine *e, uint32_t id, int res); /* xfer.c: NVMe read */
void kvt_ext_fini(struct kvt_engine *e); /* destroy: wait for the pool's copies, free it */
/* Advance the external pool's jobs and persistence (kvt_engine_poll); requires e->lock. */
void kvt_ext_progress(struct kvt_engine *e);
/* remote.c: fetched block @id landed verified (@ok) or not (@first_miss: it ended the verified
 * run: the pool remembers the miss for a while, so repeated lookups do not ask again) */
void kvt_ext_fetched(struct kvt_engine *e, uint32_t id, bool ok, bool first_miss);
/* Whether block @id is still the pool's REMOTE fetch (not detached by a store or a drop). */
bool kvt_ext_fetching(const struct kvt_engine *e, uint32_t id);
/* The session key the NVMe header of external block @id carries (its record's key), 0 = none. */
uint64_t kvt_ext_session_key(const struct kvt_engine *e, uint32_t id);
/* engine/persist.c for ext.c: records of one external block (KVT_EXT_TOKEN tokens) */
#define KVT_EXT_TOKEN ((int32_t)0x80584b56) /* "VKX" + 0x80: no tokenizer's id */
struct kvt_store_sess;
bool kvt_persist_ext_rec(const struct kvt_engine *e, const struct kvt_store_sess *rec);
int kvt_persist_ext_put(struct kvt_engine *e, uint64_t key, uint32_t tenant, uint32_t id);
int kvt_persist_ext_del(struct kvt_engine *e, uint64_t key);
int kvt_persist_ext_commit(struct kvt_engine *e);
int kvt_persist_ext_adopt(struct kvt_engine *e, struct kvt_store_sess *rec, uint32_t *id);

/* ---- engine/check.c: consistency walk for tests (returns 0 or -EINVAL with a message) */
int kvt_engine_check(struct kvt_engine *e);

/* Block record @id (< e->cap_blocks). Records never move: the pointer stays valid until the
 * engine is destroyed. */
static inline struct kvt_block *
kvt_blk(const struct kvt_engine *e, uint32_t id)
{
	return &e->bchunk[id >> KVT_BCHUNK_SHIFT][id & (KVT_BCHUNK - 1)];
}

/* The owner of @slot of @tier: a block id, a KVT_SLOT_* marker, or KVT_NIL when free. The map
 * lives in the slot allocator's entries (tiers/slots.h), whose free ones link the free list. */
static inline uint32_t
kvt_owner(const struct kvt_engine *e, int tier, uint32_t slot)
{
	return kvt_slots_owner(&e->slots[tier], slot);
}

/* Set the owner of allocated @slot of @tier (see kvt_owner; a free slot keeps none). */
static inline void
kvt_owner_set(struct kvt_engine *e, int tier, uint32_t slot, uint32_t owner)
{
	kvt_slots_set_owner(&e->slots[tier], slot, owner);
}

static inline void
kvt_lock(struct kvt_engine *e)
{
	pthread_mutex_lock(&e->lock);
}

/* Release the lock; NVMe IO queued under it (e->nvme_defer) is handed to the kernel after. */
static inline void
kvt_unlock(struct kvt_engine *e)
{
	bool submit = e->nvme_defer;

	e->nvme_defer = false;
	if (submit)
		atomic_fetch_add(&e->nvme_submitting, 1u);
	pthread_mutex_unlock(&e->lock);
	if (submit) {
		(void)kvt_nvme_flush_quiet(e->nvme); /* a failure: the next reap reports it */
		atomic_fetch_sub(&e->nvme_submitting, 1u);
	}
}

/* ---- engine/group.c: layer groups (the front over one core engine per storage group) */
int kvt_grp_create(const struct kvt_engine_opts *o, struct kvt_engine **out);
void kvt_grp_destroy(struct kvt_engine *e);
int kvt_grp_seq_open(struct kvt_engine *e, const struct kvt_seq_opts *o, kvt_seq_id *out);
int kvt_grp_seq_close(struct kvt_engine *e, kvt_seq_id id, bool keep);
int kvt_grp_seq_park(struct kvt_engine *e, kvt_seq_id id, enum kvt_tier target, bool resume);
int kvt_grp_seq_info(struct kvt_engine *e, kvt_seq_id id, struct kvt_seq_info *out);
int kvt_grp_seq_tokens(struct kvt_engine *e, kvt_seq_id id, uint64_t first, int32_t *out,
		       size_t n);
int kvt_grp_seq_set_priority(struct kvt_engine *e, kvt_seq_id id, uint64_t first_token,
			     uint64_t n_tokens, uint8_t priority, uint32_t duration_ms);
int kvt_grp_seq_match_prefix(struct kvt_engine *e, const struct kvt_seq_opts *o,
			     const int32_t *tokens, size_t n, uint64_t *matched_tokens,
			     enum kvt_tier *tier);
int kvt_grp_seq_attach_prefix(struct kvt_engine *e, kvt_seq_id id, const int32_t *tokens,
			      size_t n, uint64_t *attached_tokens);
int kvt_grp_tenant_set_budget(struct kvt_engine *e, uint32_t tenant, enum kvt_tier tier,
			      uint64_t max_blocks);
int kvt_grp_tenant_usage(struct kvt_engine *e, uint32_t tenant, uint64_t *used);
int kvt_grp_batch_prepare(struct kvt_engine *e, const struct kvt_seq_range *r, size_t n,
			  struct kvt_batch **out);
int kvt_grp_hint(struct kvt_engine *e, const struct kvt_seq_range *r, size_t n,
		 uint32_t steps_ahead);
int kvt_grp_batch_wait_layer(struct kvt_batch *b, uint32_t layer, void *stream);
int kvt_grp_batch_release(struct kvt_batch *b, void *stream);
int kvt_grp_poll(struct kvt_engine *e, uint32_t max);
int kvt_grp_check(struct kvt_engine *e); /* kvt_engine_check of every pool */
/* The pool of storage group @g of grouped engine @e for an external pool (engine/ext.c), or
 * NULL with the error set (-EINVAL: out of range, an ALIAS or SIDECAR group, with advice). */
struct kvt_engine *kvt_grp_ext_core(struct kvt_engine *e, uint32_t g, const char *fn);
int kvt_grp_drain(struct kvt_engine *e);
int kvt_grp_stats(struct kvt_engine *e, struct kvt_stats *out);
int kvt_grp_session_list(struct kvt_engine *e, bool any, uint32_t tenant, uint64_t *keys,
			 size_t cap);
int kvt_grp_seq_restore(struct kvt_engine *e, uint64_t key, const struct kvt_seq_opts *o,
			kvt_seq_id *out);
int kvt_grp_metrics_text(struct kvt_engine *e, char *buf, size_t cap, size_t *len);
int kvt_grp_session_drop(struct kvt_engine *e, bool any, uint32_t tenant, uint64_t key);
/* ---- engine/batch.c */
void kvt_batch_abandon(struct kvt_batch *b);

#endif /* KVT_ENGINE_IMPL_H */
