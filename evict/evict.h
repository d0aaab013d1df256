/* SPDX-License-Identifier: MIT */
/*
 * evict/evict.h - the eviction policy interface (internal).
 *
 * One policy instance per tier ranks the blocks that have a copy in that tier. The engine tells
 * it when a copy appears (insert), is used (access) or goes away (remove; evict when it was
 * evicted, V5), and asks for victims from the cold end (victim_first / victim_next). The
 * policy does not know about pins or transfers in flight: the engine skips those while walking
 * (DESIGN.md invariant 3), so a block that becomes unpinned keeps its rank. Blocks the engine
 * protects (pinned by a batch or an append, or named by a schedule hint) are skipped the same
 * way: see kvt_copy_evictable().
 *
 * Block ids are dense indices into the engine's block array (in tools/kvtier-replay: the trace's
 * block hash ids); the policy grows its per-id metadata on demand through reserve().
 *
 * Slot keys (kvt_evict_use_slots): the engine tells lru, arc and clock how to map a listed id to
 * the tier slot its copy occupies and back. They then keep their per-copy state in arrays
 * indexed by slot (capacity entries, whatever the number of blocks: a small HBM tier costs
 * almost nothing) and ignore reserve(); arc keeps its ghosts (ids that left the tier) in queues
 * of ids with an id hash of their own (under 11 bytes a ghost with the lists full). The ids in
 * and out of the ops are block ids either way, and the
 * order of victims of lru and arc is the same (clock's hand sweeps keys in key order, so its
 * victims follow the slots). prio keeps per-id state (its priorities are set before a copy
 * exists).
 * Not thread-safe: called under the engine mutex.
 *
 * Policies (enum kvt_evict_policy in kvtier.h):
 *   lru   evict/lru.c   least recently used.
 *   prio  evict/prio.c  priority LRU with retention (TensorRT-LLM's KvCacheRetentionConfig): a
 *                       priority 0..100 per block and a time after which it falls back to the
 *                       default; lowest priority first, LRU within a priority.
 *   arc   evict/arc.c   adaptive replacement (Megiddo & Modha, FAST'03) with ghost lists four
 *                       times the tier's capacity: learns from the workload how much room blocks
 *                       used once deserve against blocks used again; LRU order until its ghosts
 *                       hold twice the tier's capacity (no evidence yet, or a cache that holds
 *                       its working set).
 *   clock evict/clock.c generalized CLOCK (GCLOCK): a 2-bit use counter per copy (0..2), a hand
 *                       sweeping the keys; victims by (counter, distance from the hand). The
 *                       engine's NVMe tier under lru, arc and the default (a quarter byte per
 *                       slot; ghosts are of little use in the last tier); prio keeps prio on
 *                       NVMe (priorities must survive parking). HBM and HOST use the chosen one.
 * The offline Belady MIN oracle lives in tools/kvtier-replay (it needs the future).
 */
#ifndef KVT_EVICT_EVICT_H
#define KVT_EVICT_EVICT_H

#include <stdbool.h>
#include <stdint.h>

#define KVT_NIL UINT32_MAX
#define KVT_EVICT_OPS_V1 1u
#define KVT_EVICT_OPS_V2 2u /* adds set_prio and forget */
#define KVT_EVICT_OPS_V3 3u /* adds rank */
#define KVT_EVICT_OPS_V4 4u /* adds meta_bytes */
#define KVT_EVICT_OPS_V5 5u /* adds evict */

#define KVT_EVICT_PRIO_DEFAULT 50u /* priority of a block nobody gave one */
#define KVT_EVICT_PRIO_MAX 100u

struct kvt_evict;

struct kvt_evict_ops {
	uint32_t abi_version;                                   /* KVT_EVICT_OPS_V*; first */
	const char *name;                                       /* "lru", "prio", "arc", "clock" */
	int (*reserve)(struct kvt_evict *ev, uint32_t n_ids);   /* ids < n_ids usable; 0/-ENOMEM */
	void (*fini)(struct kvt_evict *ev);                     /* free metadata */
	void (*insert)(struct kvt_evict *ev, uint32_t id);      /* copy appeared */
	void (*access)(struct kvt_evict *ev, uint32_t id);      /* copy used */
	void (*remove)(struct kvt_evict *ev, uint32_t id);      /* copy gone (no-op if absent) */
	bool (*contains)(const struct kvt_evict *ev, uint32_t id);
	uint32_t (*victim_first)(struct kvt_evict *ev);         /* coldest id or KVT_NIL */
	uint32_t (*victim_next)(struct kvt_evict *ev, uint32_t id); /* next warmer or NIL */
	/* V2. set_prio: give @id priority 0..100 until the clock reaches @until_ns (0 = for
	 * good), then KVT_EVICT_PRIO_DEFAULT; may be called before insert (remembered). NULL for
	 * policies without priorities. forget: the id now names other content (the block was
	 * freed): drop its history (ghost entries, priority). NULL when there is none. */
	void (*set_prio)(struct kvt_evict *ev, uint32_t id, uint8_t prio, uint64_t until_ns);
	void (*forget)(struct kvt_evict *ev, uint32_t id);
	/* V3. rank: @id's eviction class (a listed id); the victim walk gives every id of a lower
	 * class before any of a higher one, and the engine's clean-first preference applies only
	 * among ids of one class (a clean high-priority copy is not dropped while dirty
	 * low-priority ones stay). NULL: one class (plain recency policies). */
	uint32_t (*rank)(const struct kvt_evict *ev, uint32_t id);
	/* V4. meta_bytes: host bytes the instance holds (NULL: links only). */
	uint64_t (*meta_bytes)(const struct kvt_evict *ev);
	/* V5. evict: like remove, for a copy the engine evicted (dropped to make room, or the
	 * source of a demotion once the copy below landed: what its stats count as evictions);
	 * remove is then every other way a copy goes (a block freed or rewritten, a copy above one
	 * already safe below dropped by a park, a copy lost). NULL: remove stands for both (the
	 * engine calls it through kvt_evict_evicted). */
	void (*evict)(struct kvt_evict *ev, uint32_t id);
};

/** LRU state: a circular doubly linked list through per-id links, sentinel at index n_ids. */
struct kvt_lru_link {
	uint32_t prev; /* warmer neighbour's id (towards head), KVT_NIL when not listed */
	uint32_t next; /* colder neighbour's id (towards tail), KVT_NIL when not listed */
};

/* Slot keys of one tier (see kvt_evict_use_slots): both maps see only ids with a copy (or a
 * copy being made) in the tier, and keys < kvt_evict.capacity. */
struct kvt_evict_keys {
	uint32_t (*key_of)(const void *ctx, uint32_t arg, uint32_t id); /* slot of id's copy or
	                                                                   KVT_NIL */
	uint32_t (*id_of)(const void *ctx, uint32_t arg, uint32_t key); /* id owning a slot */
	const void *ctx;                                                /* passed to both */
	uint32_t arg;                                                   /* passed to both */
};

struct kvt_evict {
	const struct kvt_evict_ops *ops; /* policy vtable */
	const struct kvt_evict_keys *keys; /* slot keys (lru, arc, clock) or NULL: per-id arrays */
	struct kvt_lru_link *link;       /* lru: [cap + 1]; link[cap] is the sentinel */
	uint32_t cap;                    /* ids (keys with slot keys) < cap are valid */
	uint32_t n;                      /* ids currently listed (copies present) */
	uint32_t capacity;               /* slots of the tier (arc sizes its ghosts by it) */
	void *priv;                      /* prio/arc/clock: policy-private state */
	uint64_t (*now_ns)(void);        /* clock of retention times (tests inject one) */
};

/** The LRU policy (evict/lru.c): insert/access move to the head, victims from the tail. */
extern const struct kvt_evict_ops kvt_evict_lru_ops;
/** Priority LRU with retention (evict/prio.c). */
extern const struct kvt_evict_ops kvt_evict_prio_ops;
/** Adaptive replacement with ghost lists (evict/arc.c). */
extern const struct kvt_evict_ops kvt_evict_arc_ops;
/** Generalized CLOCK, 2 bits per key (evict/clock.c): the engine's NVMe tier under lru/arc. */
extern const struct kvt_evict_ops kvt_evict_clock_ops;

/**
 * kvt_evict_init() - initialise @ev with @ops and room for @n_ids ids.
 * @capacity: slots of the tier the instance ranks (>= 1; arc's ghost lists are 4x this).
 * The clock is CLOCK_MONOTONIC (kvt_evict_clock_ns); tests may set ev->now_ns afterwards.
 * Returns 0 or -ENOMEM.
 */
int kvt_evict_init(struct kvt_evict *ev, const struct kvt_evict_ops *ops, uint32_t n_ids,
		   uint32_t capacity);

/**
 * kvt_evict_use_slots() - key @ev's per-copy state by slot through @keys (kept by the caller,
 * alive as long as @ev) instead of by id, for lru, arc and clock (prio keeps per-id arrays and
 * ignores it). Call right after kvt_evict_init, before any insert. Returns 0 or -ENOMEM.
 */
int kvt_evict_use_slots(struct kvt_evict *ev, const struct kvt_evict_keys *keys);

/** kvt_evict_meta_bytes() - host bytes @ev's policy holds (links, per-copy state, ghosts). */
uint64_t kvt_evict_meta_bytes(const struct kvt_evict *ev);

/* Key of @id in @ev: its slot with slot keys (KVT_NIL when none), else @id itself. */
static inline uint32_t
kvt_evict_key(const struct kvt_evict *ev, uint32_t id)
{
	return ev->keys ? ev->keys->key_of(ev->keys->ctx, ev->keys->arg, id) : id;
}

/* Id owning key @k (KVT_NIL passes through). */
static inline uint32_t
kvt_evict_id(const struct kvt_evict *ev, uint32_t k)
{
	if (k == KVT_NIL || !ev->keys)
		return k;
	return ev->keys->id_of(ev->keys->ctx, ev->keys->arg, k);
}

/* @id's copy went as an eviction: ops->evict where the policy has one (V5), else ops->remove. */
static inline void
kvt_evict_evicted(struct kvt_evict *ev, uint32_t id)
{
	if (ev->ops->abi_version >= KVT_EVICT_OPS_V5 && ev->ops->evict)
		ev->ops->evict(ev, id);
	else
		ev->ops->remove(ev, id);
}

/** kvt_evict_by_name() - the ops named @name ("lru", "prio", "arc", "clock") or NULL. */
const struct kvt_evict_ops *kvt_evict_by_name(const char *name);

/** CLOCK_MONOTONIC in nanoseconds: the default clock of retention times. */
uint64_t kvt_evict_clock_ns(void);

#endif /* KVT_EVICT_EVICT_H */
