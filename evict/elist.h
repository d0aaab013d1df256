/* SPDX-License-Identifier: MIT */
/*
 * evict/elist.h - doubly linked lists of ids threaded through a shared array of 32-bit links
 * (internal to evict/). Several lists (priority classes, ARC's T1/T2/B1/B2) share one link
 * array; an id is on at most one of them. Head = hottest, tail = coldest. Links are ids, not
 * pointers, so the array can grow with realloc.
 */
#ifndef KVT_EVICT_ELIST_H
#define KVT_EVICT_ELIST_H

#include <errno.h>
#include <stdint.h>

#include "tiers/base/alloc.h"
#include "evict.h"

struct kvt_elist {
	uint32_t head; /* hottest id or KVT_NIL */
	uint32_t tail; /* coldest id or KVT_NIL */
	uint32_t n;    /* ids on the list */
};

/* Grow ev->link from ev->cap to @n_ids entries (> ev->cap), the new ones on no list. The
 * caller grows its own per-id arrays and then sets ev->cap. 0 or -ENOMEM (link unchanged). */
static inline int
kvt_elist_links_grow(struct kvt_evict *ev, uint32_t n_ids)
{
	struct kvt_lru_link *p = kvt_realloc(ev->link, (size_t)n_ids * sizeof *p);

	if (!p)
		return -ENOMEM;
	for (uint32_t i = ev->cap; i < n_ids; i++)
		p[i].prev = p[i].next = KVT_NIL;
	ev->link = p;
	return 0;
}

/* Free ev->link and forget the instance's ids (the policy frees ev->priv first). */
static inline void
kvt_elist_links_free(struct kvt_evict *ev)
{
	kvt_free(ev->link);
	ev->link = NULL;
	ev->priv = NULL;
	ev->cap = ev->n = 0;
}

static inline void
kvt_elist_init(struct kvt_elist *l)
{
	l->head = l->tail = KVT_NIL;
	l->n = 0;
}

/* Put @id (on no list) at the hot end of @l. */
static inline void
kvt_elist_push_head(struct kvt_elist *l, struct kvt_lru_link *k, uint32_t id)
{
	k[id].prev = KVT_NIL;
	k[id].next = l->head;
	if (l->head != KVT_NIL)
		k[l->head].prev = id;
	else
		l->tail = id;
	l->head = id;
	l->n++;
}

/* Put @id (on no list) at the cold end of @l. */
static inline void
kvt_elist_push_tail(struct kvt_elist *l, struct kvt_lru_link *k, uint32_t id)
{
	k[id].next = KVT_NIL;
	k[id].prev = l->tail;
	if (l->tail != KVT_NIL)
		k[l->tail].next = id;
	else
		l->head = id;
	l->tail = id;
	l->n++;
}

/* Take @id off @l (it must be on it). */
static inline void
kvt_elist_unlink(struct kvt_elist *l, struct kvt_lru_link *k, uint32_t id)
{
	if (k[id].prev != KVT_NIL)
		k[k[id].prev].next = k[id].next;
	else
		l->head = k[id].next;
	if (k[id].next != KVT_NIL)
		k[k[id].next].prev = k[id].prev;
	else
		l->tail = k[id].prev;
	k[id].prev = k[id].next = KVT_NIL;
	l->n--;
}

#endif /* KVT_EVICT_ELIST_H */
