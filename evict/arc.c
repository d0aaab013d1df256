/* SPDX-License-Identifier: MIT */
/*
 * evict/arc.c - adaptive replacement (Megiddo and Modha, "ARC", FAST'03), one instance per tier.
 *
 * Why: on prefix-cache workloads most blocks are used by one request only (76.6% of the distinct
 * blocks of the Mooncake conversation trace), and LRU lets them push out the prefixes that
 * conversations come back to. ARC keeps blocks used once (T1) apart from blocks used again (T2)
 * and remembers the ids it recently evicted from each (ghost lists B1, B2). A ghost hit says
 * which side was evicted too early, and moves the target size p of T1 towards it: the policy
 * learns the split from the workload instead of a fixed ratio. Ghosts are ids only, so they are
 * kept four times the tier's capacity (measured on the Mooncake trace: 1x gives 10.9% hits at
 * 4k blocks, 4x 13.2%, LRU 8.6%). Two changes to the paper's rule, both measured on that
 * trace: p starts at a fifth of the tier (not 0), and each ghost hit moves p by at least
 * capacity/4096, so a large tier learns its split within a few thousand ghost hits instead of
 * never (at 32k blocks the paper's +1 steps left T2 untouched for the whole trace: 2% below
 * LRU; now 0.2% above).
 *
 * Evidence first: until the tier has evicted enough to hold ghosts of twice its capacity (half
 * the ghost lists' room), victims come in plain LRU order (the older of T1's and T2's tails, by
 * a per-id clock of the last insert or use). A cache that holds most of its working set never
 * gathers that much history, so it behaves exactly as LRU, where LRU is close to optimal; ARC
 * takes over where LRU is weak. Measured on the Mooncake trace (docs/PERF.md): never below LRU
 * from 1k to 64k blocks (plain ARC was 0.03 points below at 48k and 64k), 1.53x LRU at 4k.
 * In LRU order the victim walk goes through the list with the older tail first, then the other.
 *
 * Prefix structure: a parent block is worth at least as much as its children (a child is only
 * reachable through its parent). The engine and the replayer touch a request's blocks from the
 * last to the first, so the parent is always the more recently used.
 *
 * Engine mapping: insert = a copy appeared in this tier (a ghost hit when it was evicted from
 * this tier recently), access = a batch used it, remove = the copy left this tier (remembered as
 * a ghost), forget = the block was freed (its id now names other content: no ghost).
 */
#include <errno.h>
#include <string.h>

#include "engine/alloc.h"
#include "elist.h"

enum { ARC_T1 = 0, ARC_T2 = 1, ARC_B1 = 2, ARC_B2 = 3, ARC_NONE = 0xff };
#define ARC_GHOST_MULT 4u
#define ARC_LEARN_HITS 4096.0 /* p can cross a whole tier within this many ghost hits */
#define ARC_EVIDENCE_DIV 2u   /* ARC order once the ghosts hold >= 1/this of their room */

struct arc_state {
	uint8_t *tag;          /* [cap] list of the id (ARC_T1..ARC_B2) or ARC_NONE */
	struct kvt_elist l[4]; /* T1, T2 (resident), B1, B2 (ghosts) */
	double p;              /* target size of T1, 0..capacity */
	uint32_t *stamp;       /* [cap] clock at the id's last insert or use (LRU order) */
	uint32_t clock;        /* inserts and uses so far (wraps; ages are differences) */
};

static struct arc_state *
arc_st(const struct kvt_evict *ev)
{
	return ev->priv;
}

static bool
arc_contains(const struct kvt_evict *ev, uint32_t id)
{
	return id < ev->cap && arc_st(ev)->tag[id] <= ARC_T2;
}

static int
arc_reserve(struct kvt_evict *ev, uint32_t n_ids)
{
	struct arc_state *st = ev->priv;
	uint32_t old = ev->cap, i;
	void *p;

	if (!st) {
		st = kvt_calloc(1, sizeof *st);
		if (!st)
			return -ENOMEM;
		for (i = 0; i < 4; i++)
			kvt_elist_init(&st->l[i]);
		st->p = ev->capacity / 5.0; /* no evidence yet: T1 may keep a fifth */
		ev->priv = st;
	}
	if (n_ids <= old)
		return 0;
	if (kvt_elist_links_grow(ev, n_ids))
		return -ENOMEM;
	if (!(p = kvt_realloc(st->tag, n_ids)))
		return -ENOMEM;
	st->tag = p;
	if (!(p = kvt_realloc(st->stamp, (size_t)n_ids * sizeof *st->stamp)))
		return -ENOMEM;
	st->stamp = p;
	for (i = old; i < n_ids; i++) {
		st->tag[i] = ARC_NONE;
		st->stamp[i] = 0;
	}
	ev->cap = n_ids;
	return 0;
}

static void
arc_fini(struct kvt_evict *ev)
{
	struct arc_state *st = ev->priv;

	if (st) {
		kvt_free(st->tag);
		kvt_free(st->stamp);
		kvt_free(st);
	}
	kvt_elist_links_free(ev);
}

static void
arc_move(struct kvt_evict *ev, uint32_t id, uint8_t to)
{
	struct arc_state *st = arc_st(ev);
	uint8_t from = st->tag[id];

	if (from != ARC_NONE) {
		kvt_elist_unlink(&st->l[from], ev->link, id);
		ev->n -= from <= ARC_T2;
	}
	st->tag[id] = to;
	if (to <= ARC_T2)
		st->stamp[id] = ++st->clock; /* inserted or used now */
	if (to != ARC_NONE) {
		kvt_elist_push_head(&st->l[to], ev->link, id);
		ev->n += to <= ARC_T2;
	}
}

/* Keep each ghost list at most ARC_GHOST_MULT x capacity long: forget its oldest ids. */
static void
arc_trim_ghost(struct kvt_evict *ev, uint8_t g)
{
	struct arc_state *st = arc_st(ev);
	uint64_t max = (uint64_t)ev->capacity * ARC_GHOST_MULT;

	while (st->l[g].n > max)
		arc_move(ev, st->l[g].tail, ARC_NONE);
}

static void
arc_insert(struct kvt_evict *ev, uint32_t id)
{
	struct arc_state *st = arc_st(ev);
	double c = ev->capacity, b1, b2, scale = c > ARC_LEARN_HITS ? c / ARC_LEARN_HITS : 1.0;

	if (id >= ev->cap)
		return;
	b1 = st->l[ARC_B1].n ? st->l[ARC_B1].n : 1;
	b2 = st->l[ARC_B2].n ? st->l[ARC_B2].n : 1;
	switch (st->tag[id]) {
	case ARC_T1:
	case ARC_T2:
		arc_move(ev, id, ARC_T2);
		break;
	case ARC_B1: /* evicted from T1 too early: T1 deserves more room */
		st->p += scale * (b2 / b1 > 1.0 ? b2 / b1 : 1.0);
		if (st->p > c)
			st->p = c;
		arc_move(ev, id, ARC_T2);
		break;
	case ARC_B2: /* evicted from T2 too early */
		st->p -= scale * (b1 / b2 > 1.0 ? b1 / b2 : 1.0);
		if (st->p < 0)
			st->p = 0;
		arc_move(ev, id, ARC_T2);
		break;
	default:
		arc_move(ev, id, ARC_T1);
	}
}

static void
arc_access(struct kvt_evict *ev, uint32_t id)
{
	if (arc_contains(ev, id))
		arc_move(ev, id, ARC_T2);
}

static void
arc_remove(struct kvt_evict *ev, uint32_t id)
{
	struct arc_state *st = arc_st(ev);
	uint8_t g;

	if (!arc_contains(ev, id))
		return;
	g = st->tag[id] == ARC_T1 ? ARC_B1 : ARC_B2;
	arc_move(ev, id, g);
	arc_trim_ghost(ev, g);
}

static void
arc_forget(struct kvt_evict *ev, uint32_t id)
{
	if (id < ev->cap)
		arc_move(ev, id, ARC_NONE);
}

/* The list victims come from first: while the ghosts hold less than 1/ARC_EVIDENCE_DIV of their
 * room, the one whose tail is older (LRU order); then T1 while it is above its target p, else
 * T2. */
static uint8_t
arc_first_list(const struct kvt_evict *ev)
{
	const struct arc_state *st = arc_st(ev);
	uint64_t ghosts = (uint64_t)st->l[ARC_B1].n + st->l[ARC_B2].n;

	if (!st->l[ARC_T2].n)
		return ARC_T1;
	if (!st->l[ARC_T1].n)
		return ARC_T2;
	if (ghosts * ARC_EVIDENCE_DIV < (uint64_t)ev->capacity * ARC_GHOST_MULT)
		return (uint32_t)(st->clock - st->stamp[st->l[ARC_T2].tail]) >
			       (uint32_t)(st->clock - st->stamp[st->l[ARC_T1].tail]) ?
			       ARC_T2 : ARC_T1;
	return (double)st->l[ARC_T1].n > st->p ? ARC_T1 : ARC_T2;
}

static uint32_t
arc_victim_first(struct kvt_evict *ev)
{
	struct arc_state *st = arc_st(ev);
	uint8_t f = arc_first_list(ev);

	return st->l[f].tail != KVT_NIL ? st->l[f].tail : st->l[f ^ 1].tail;
}

static uint32_t
arc_victim_next(struct kvt_evict *ev, uint32_t id)
{
	struct arc_state *st = arc_st(ev);
	uint8_t f;

	if (!arc_contains(ev, id))
		return KVT_NIL;
	if (ev->link[id].prev != KVT_NIL)
		return ev->link[id].prev;
	f = arc_first_list(ev);
	return st->tag[id] == f ? st->l[f ^ 1].tail : KVT_NIL;
}

const struct kvt_evict_ops kvt_evict_arc_ops = {
	.abi_version = KVT_EVICT_OPS_V2,
	.name = "arc",
	.reserve = arc_reserve,
	.fini = arc_fini,
	.insert = arc_insert,
	.access = arc_access,
	.remove = arc_remove,
	.contains = arc_contains,
	.victim_first = arc_victim_first,
	.victim_next = arc_victim_next,
	.set_prio = NULL,
	.forget = arc_forget,
};
