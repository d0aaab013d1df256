/* SPDX-License-Identifier: MIT */
/*
 * evict/prio.c - priority LRU with retention, one instance per tier.
 *
 * The semantics of TensorRT-LLM's KvCacheRetentionConfig: every block has a priority 0..100
 * (KVT_EVICT_PRIO_DEFAULT when nobody set one) and optionally a time after which its priority
 * falls back to the default. Victims are taken from the lowest priority first and, within a
 * priority, least recently used first. A block whose retention ran out becomes the coldest
 * block of the default class (it is old: it had been kept only for its priority).
 *
 * One LRU list per priority (101 lists sharing one link array). Priorities are remembered per
 * id even while the id has no copy in this tier, so a block keeps its priority when it moves
 * between tiers (a parked session keeps its priorities). Expiry is lazy: the earliest deadline
 * is tracked and the lists are walked only when the clock passes it.
 */
#include <errno.h>
#include <string.h>

#include "tiers/base/alloc.h"
#include "elist.h"

#define PRIO_NONE 0xffu /* list tag: not listed */
#define PRIO_LISTS (KVT_EVICT_PRIO_MAX + 1)

struct prio_state {
	uint8_t *list;      /* [cap] list the id is on (its effective priority) or PRIO_NONE */
	uint8_t *prio;      /* [cap] priority set for the id */
	uint64_t *until;    /* [cap] clock value when prio falls back to the default; 0 = never */
	struct kvt_elist l[PRIO_LISTS]; /* one LRU list per priority */
	uint64_t next_expiry; /* earliest until of a listed id; UINT64_MAX = none */
};

static struct prio_state *
prio_st(const struct kvt_evict *ev)
{
	return ev->priv;
}

static bool
prio_contains(const struct kvt_evict *ev, uint32_t id)
{
	return id < ev->cap && prio_st(ev)->list[id] != PRIO_NONE;
}

static int
prio_reserve(struct kvt_evict *ev, uint32_t n_ids)
{
	struct prio_state *st = ev->priv;
	uint32_t old = ev->cap, i;
	void *p;

	if (!st) {
		st = kvt_calloc(1, sizeof *st);
		if (!st)
			return -ENOMEM;
		for (i = 0; i < PRIO_LISTS; i++)
			kvt_elist_init(&st->l[i]);
		st->next_expiry = UINT64_MAX;
		ev->priv = st;
	}
	if (n_ids <= old)
		return 0;
	if (n_ids - old < old / 8) /* the engine grows by small chunks: grow by an eighth */
		n_ids = old + old / 8 < old ? UINT32_MAX - 1 : old + old / 8;
	if (kvt_elist_links_grow(ev, n_ids))
		return -ENOMEM;
	if (!(p = kvt_realloc(st->list, n_ids)))
		return -ENOMEM;
	st->list = p;
	if (!(p = kvt_realloc(st->prio, n_ids)))
		return -ENOMEM;
	st->prio = p;
	if (!(p = kvt_realloc(st->until, (size_t)n_ids * sizeof *st->until)))
		return -ENOMEM;
	st->until = p;
	for (i = old; i < n_ids; i++) {
		st->list[i] = PRIO_NONE;
		st->prio[i] = KVT_EVICT_PRIO_DEFAULT;
		st->until[i] = 0;
	}
	ev->cap = n_ids;
	return 0;
}

static void
prio_fini(struct kvt_evict *ev)
{
	struct prio_state *st = ev->priv;

	if (st) {
		kvt_free(st->list);
		kvt_free(st->prio);
		kvt_free(st->until);
		kvt_free(st);
	}
	kvt_elist_links_free(ev);
}

/* The priority @id has now (its own until it expires, then the default). */
static uint8_t
prio_effective(struct prio_state *st, uint32_t id, uint64_t now)
{
	if (st->until[id] && now >= st->until[id]) {
		st->prio[id] = KVT_EVICT_PRIO_DEFAULT;
		st->until[id] = 0;
	}
	return st->prio[id];
}

/* Move every listed id whose retention ran out to the cold end of the default class. */
static void
prio_expire(struct kvt_evict *ev)
{
	struct prio_state *st = prio_st(ev);
	uint64_t now, next = UINT64_MAX;
	uint32_t p, id, nx;

	if (st->next_expiry == UINT64_MAX)
		return;
	now = ev->now_ns();
	if (now < st->next_expiry)
		return;
	for (p = 0; p < PRIO_LISTS; p++) {
		if (p == KVT_EVICT_PRIO_DEFAULT)
			continue;
		for (id = st->l[p].head; id != KVT_NIL; id = nx) {
			nx = ev->link[id].next;
			if (!st->until[id])
				continue;
			if (now < st->until[id]) {
				next = st->until[id] < next ? st->until[id] : next;
				continue;
			}
			kvt_elist_unlink(&st->l[p], ev->link, id);
			(void)prio_effective(st, id, now);
			kvt_elist_push_tail(&st->l[KVT_EVICT_PRIO_DEFAULT], ev->link, id);
			st->list[id] = KVT_EVICT_PRIO_DEFAULT;
		}
	}
	st->next_expiry = next;
}

static void
prio_unlink(struct kvt_evict *ev, uint32_t id)
{
	struct prio_state *st = prio_st(ev);

	kvt_elist_unlink(&st->l[st->list[id]], ev->link, id);
	st->list[id] = PRIO_NONE;
	ev->n--;
}

static void
prio_insert(struct kvt_evict *ev, uint32_t id)
{
	struct prio_state *st = prio_st(ev);
	uint8_t p;

	if (id >= ev->cap)
		return;
	prio_expire(ev);
	if (st->list[id] != PRIO_NONE)
		prio_unlink(ev, id);
	p = prio_effective(st, id, st->until[id] ? ev->now_ns() : 0);
	kvt_elist_push_head(&st->l[p], ev->link, id);
	st->list[id] = p;
	ev->n++;
	if (st->until[id] && st->until[id] < st->next_expiry)
		st->next_expiry = st->until[id];
}

static void
prio_access(struct kvt_evict *ev, uint32_t id)
{
	if (prio_contains(ev, id))
		prio_insert(ev, id);
}

static void
prio_remove(struct kvt_evict *ev, uint32_t id)
{
	if (prio_contains(ev, id))
		prio_unlink(ev, id);
}

static uint32_t
prio_first_from(const struct prio_state *st, uint32_t p)
{
	for (; p < PRIO_LISTS; p++)
		if (st->l[p].tail != KVT_NIL)
			return st->l[p].tail;
	return KVT_NIL;
}

static uint32_t
prio_victim_first(struct kvt_evict *ev)
{
	prio_expire(ev);
	return prio_first_from(prio_st(ev), 0);
}

static uint32_t
prio_victim_next(struct kvt_evict *ev, uint32_t id)
{
	struct prio_state *st = prio_st(ev);

	if (!prio_contains(ev, id))
		return KVT_NIL;
	if (ev->link[id].prev != KVT_NIL)
		return ev->link[id].prev;
	return prio_first_from(st, st->list[id] + 1u);
}

static void
prio_set(struct kvt_evict *ev, uint32_t id, uint8_t prio, uint64_t until_ns)
{
	struct prio_state *st = prio_st(ev);

	if (id >= ev->cap)
		return;
	st->prio[id] = prio > KVT_EVICT_PRIO_MAX ? KVT_EVICT_PRIO_MAX : prio;
	st->until[id] = until_ns;
	if (st->list[id] != PRIO_NONE)
		prio_insert(ev, id); /* re-rank it in its new class; a retention set is a use */
}

static void
prio_forget(struct kvt_evict *ev, uint32_t id)
{
	struct prio_state *st = prio_st(ev);

	if (id >= ev->cap)
		return;
	prio_remove(ev, id);
	st->prio[id] = KVT_EVICT_PRIO_DEFAULT;
	st->until[id] = 0;
}

/* The class of a listed id: the priority list it is on (its effective priority). */
static uint32_t
prio_rank(const struct kvt_evict *ev, uint32_t id)
{
	return id < ev->cap ? prio_st(ev)->list[id] : PRIO_NONE;
}

static uint64_t
prio_meta_bytes(const struct kvt_evict *ev)
{
	const struct prio_state *st = prio_st(ev);

	/* per id: links, list, priority and retention deadline */
	return st ? sizeof *st + (uint64_t)ev->cap * (sizeof *ev->link + 2 + sizeof *st->until) :
		    0;
}

const struct kvt_evict_ops kvt_evict_prio_ops = {
	.abi_version = KVT_EVICT_OPS_V4,
	.name = "prio",
	.reserve = prio_reserve,
	.fini = prio_fini,
	.insert = prio_insert,
	.access = prio_access,
	.remove = prio_remove,
	.contains = prio_contains,
	.victim_first = prio_victim_first,
	.victim_next = prio_victim_next,
	.set_prio = prio_set,
	.forget = prio_forget,
	.rank = prio_rank,
	.meta_bytes = prio_meta_bytes,
};
