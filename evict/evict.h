/* SPDX-License-Identifier: MIT */
/*
 * evict/evict.h - the eviction policy interface (internal).
 *
 * One policy instance per tier ranks the blocks that have a copy in that tier. The engine tells
 * it when a copy appears (insert), is used (access) or goes away (remove), and asks for victims
 * from the cold end (victim_first / victim_next). The policy does not know about pins or
 * transfers in flight: the engine skips those while walking (DESIGN.md invariant 3), so a block
 * that becomes unpinned keeps its recency rank.
 *
 * Block ids are dense indices into the engine's block array; the policy grows its per-id
 * metadata on demand through reserve(). Not thread-safe: called under the engine mutex.
 */
#ifndef KVT_EVICT_EVICT_H
#define KVT_EVICT_EVICT_H

#include <stdbool.h>
#include <stdint.h>

#define KVT_NIL UINT32_MAX
#define KVT_EVICT_OPS_V1 1u

struct kvt_evict;

struct kvt_evict_ops {
	uint32_t abi_version;                                   /* KVT_EVICT_OPS_V1; first */
	const char *name;                                       /* "lru" */
	int (*reserve)(struct kvt_evict *ev, uint32_t n_ids);   /* ids < n_ids usable; 0/-ENOMEM */
	void (*fini)(struct kvt_evict *ev);                     /* free metadata */
	void (*insert)(struct kvt_evict *ev, uint32_t id);      /* copy appeared: hottest */
	void (*access)(struct kvt_evict *ev, uint32_t id);      /* copy used */
	void (*remove)(struct kvt_evict *ev, uint32_t id);      /* copy gone (no-op if absent) */
	bool (*contains)(const struct kvt_evict *ev, uint32_t id);
	uint32_t (*victim_first)(const struct kvt_evict *ev);   /* coldest id or KVT_NIL */
	uint32_t (*victim_next)(const struct kvt_evict *ev, uint32_t id); /* next warmer or NIL */
};

/** LRU state: a circular doubly linked list through per-id links, sentinel at index n_ids. */
struct kvt_lru_link {
	uint32_t prev; /* warmer neighbour's id (towards head), KVT_NIL when not listed */
	uint32_t next; /* colder neighbour's id (towards tail), KVT_NIL when not listed */
};

struct kvt_evict {
	const struct kvt_evict_ops *ops; /* policy vtable */
	struct kvt_lru_link *link;       /* [cap + 1]; link[cap] is the sentinel (head/tail) */
	uint32_t cap;                    /* ids < cap are valid */
	uint32_t n;                      /* ids currently listed */
};

/** The LRU policy (evict/lru.c): insert/access move to the head, victims from the tail. */
extern const struct kvt_evict_ops kvt_evict_lru_ops;

/** Initialise @ev with @ops and room for @n_ids ids. Returns 0 or -ENOMEM. */
int kvt_evict_init(struct kvt_evict *ev, const struct kvt_evict_ops *ops, uint32_t n_ids);

#endif /* KVT_EVICT_EVICT_H */
