/* SPDX-License-Identifier: MIT */
/*
 * evict/lru.c - least-recently-used eviction, one instance per tier.
 *
 * A circular doubly linked list threaded through a dense array of links indexed by block id,
 * with a sentinel at index cap (SQLite pcache1's PGroup.lru, jemalloc's ql): head = most
 * recently used, tail = least. Links are 32-bit ids rather than pointers: half the size, and the
 * array can be grown with realloc because nothing points into it. When the array grows the
 * sentinel moves from index cap to the new cap, so its neighbours are re-pointed. With slot keys
 * (kvt_evict_use_slots) the array is indexed by slot instead and never grows.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tiers/base/alloc.h"
#include "tiers/base/clock.h"
#include "evict.h"

static inline uint32_t
lru_sentinel(const struct kvt_evict *ev)
{
	return ev->cap;
}

static bool
lru_contains(const struct kvt_evict *ev, uint32_t id)
{
	uint32_t k = kvt_evict_key(ev, id);

	return k < ev->cap && ev->link[k].prev != KVT_NIL;
}

static void
lru_unlink(struct kvt_evict *ev, uint32_t id)
{
	struct kvt_lru_link *l = &ev->link[id];

	ev->link[l->prev].next = l->next;
	ev->link[l->next].prev = l->prev;
	l->prev = l->next = KVT_NIL;
	ev->n--;
}

static void
lru_push_head(struct kvt_evict *ev, uint32_t id)
{
	uint32_t s = lru_sentinel(ev);
	uint32_t old = ev->link[s].next;

	ev->link[id].prev = s;
	ev->link[id].next = old;
	ev->link[old].prev = id;
	ev->link[s].next = id;
	ev->n++;
}

static int
lru_reserve(struct kvt_evict *ev, uint32_t n_ids)
{
	struct kvt_lru_link *nl;
	uint32_t old = ev->cap, i;

	if (ev->keys)
		n_ids = ev->capacity; /* keys are slots: as many as the tier has */
	if (n_ids <= ev->cap && ev->link)
		return 0;
	if (n_ids < old)
		n_ids = old;
	nl = kvt_realloc(ev->link, ((size_t)n_ids + 1) * sizeof *nl);
	if (!nl)
		return -ENOMEM;
	if (!ev->link) {
		/* first call: an empty ring whose sentinel points to itself */
		nl[n_ids].prev = nl[n_ids].next = n_ids;
	} else {
		/* move the sentinel from index old to index n_ids and fix its neighbours */
		nl[n_ids] = nl[old];
		if (nl[n_ids].next == old) {
			nl[n_ids].next = nl[n_ids].prev = n_ids;
		} else {
			nl[nl[n_ids].next].prev = n_ids;
			nl[nl[n_ids].prev].next = n_ids;
		}
	}
	for (i = ev->link ? old : 0; i < n_ids; i++)
		nl[i].prev = nl[i].next = KVT_NIL;
	ev->link = nl;
	ev->cap = n_ids;
	return 0;
}

static void
lru_fini(struct kvt_evict *ev)
{
	kvt_free(ev->link);
	ev->link = NULL;
	ev->cap = ev->n = 0;
}

static void
lru_insert(struct kvt_evict *ev, uint32_t id)
{
	uint32_t k = kvt_evict_key(ev, id);

	if (k >= ev->cap)
		return;
	if (ev->link[k].prev != KVT_NIL)
		lru_unlink(ev, k);
	lru_push_head(ev, k);
}

static void
lru_remove(struct kvt_evict *ev, uint32_t id)
{
	if (lru_contains(ev, id))
		lru_unlink(ev, kvt_evict_key(ev, id));
}

static uint32_t
lru_victim_first(struct kvt_evict *ev)
{
	uint32_t t = ev->link[lru_sentinel(ev)].prev;

	return t == lru_sentinel(ev) ? KVT_NIL : kvt_evict_id(ev, t);
}

static uint32_t
lru_victim_next(struct kvt_evict *ev, uint32_t id)
{
	uint32_t t;

	if (!lru_contains(ev, id))
		return KVT_NIL;
	t = ev->link[kvt_evict_key(ev, id)].prev;
	return t == lru_sentinel(ev) ? KVT_NIL : kvt_evict_id(ev, t);
}

static uint64_t
lru_meta_bytes(const struct kvt_evict *ev)
{
	return ev->link ? ((uint64_t)ev->cap + 1) * sizeof *ev->link : 0;
}

const struct kvt_evict_ops kvt_evict_lru_ops = {
	.abi_version = KVT_EVICT_OPS_V4,
	.name = "lru",
	.reserve = lru_reserve,
	.fini = lru_fini,
	.insert = lru_insert,
	.access = lru_insert, /* LRU: a use makes the copy the hottest */
	.remove = lru_remove,
	.contains = lru_contains,
	.victim_first = lru_victim_first,
	.victim_next = lru_victim_next,
	.set_prio = NULL, /* plain LRU ignores priorities */
	.forget = NULL,
	.rank = NULL,
	.meta_bytes = lru_meta_bytes,
};

uint64_t
kvt_evict_clock_ns(void)
{
	return kvt_now_ns();
}

const struct kvt_evict_ops *
kvt_evict_by_name(const char *name)
{
	static const struct kvt_evict_ops *const all[] = {
		&kvt_evict_lru_ops, &kvt_evict_prio_ops, &kvt_evict_arc_ops, &kvt_evict_clock_ops,
	};
	size_t i;

	for (i = 0; name && i < sizeof all / sizeof all[0]; i++)
		if (!strcmp(all[i]->name, name))
			return all[i];
	return NULL;
}

int
kvt_evict_init(struct kvt_evict *ev, const struct kvt_evict_ops *ops, uint32_t n_ids,
	       uint32_t capacity)
{
	memset(ev, 0, sizeof *ev);
	ev->ops = ops;
	ev->capacity = capacity ? capacity : 1;
	ev->now_ns = kvt_evict_clock_ns;
	return ops->reserve(ev, n_ids ? n_ids : 16);
}

int
kvt_evict_use_slots(struct kvt_evict *ev, const struct kvt_evict_keys *keys)
{
	if (ev->ops != &kvt_evict_lru_ops && ev->ops != &kvt_evict_arc_ops &&
	    ev->ops != &kvt_evict_clock_ops)
		return 0; /* per-id state (prio): keys unused */
	/* nothing is listed yet: start over with arrays of capacity entries, indexed by slot */
	ev->ops->fini(ev);
	ev->keys = keys;
	return ev->ops->reserve(ev, ev->capacity);
}

uint64_t
kvt_evict_meta_bytes(const struct kvt_evict *ev)
{
	if (!ev->ops)
		return 0;
	if (ev->ops->abi_version >= KVT_EVICT_OPS_V4 && ev->ops->meta_bytes)
		return ev->ops->meta_bytes(ev);
	return (uint64_t)ev->cap * sizeof *ev->link;
}
