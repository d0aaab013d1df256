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
 * the ghost lists' room), victims come in plain LRU order. A cache that holds most of its
 * working set never gathers that much history, so it behaves exactly as LRU, where LRU is close
 * to optimal; ARC takes over where LRU is weak, for good (the first time the ghosts reach that
 * much: a tier that was once under that pressure keeps ARC's order). Measured on the Mooncake
 * trace (docs/PERF.md): never below LRU from 1k to 64k blocks (plain ARC was 0.03 points below
 * at 48k and 64k), 1.53x LRU at 4k. Until then the residents are on one list in recency order
 * (each tagged T1 or T2, so the split is known) and the victim walk follows it; when the
 * evidence is in, one pass splits it into T1 and T2, each in its recency order. (An earlier
 * version kept T1 and T2 apart from the start and took the older tail by a 4-byte clock stamp
 * per key; the single list gives the same first victim without it, and its victim walk is
 * strict recency order where the earlier one walked the list with the older tail first.)
 *
 * Prefix structure: a parent block is worth at least as much as its children (a child is only
 * reachable through its parent). The engine and the replayer touch a request's blocks from the
 * last to the first, so the parent is always the more recently used.
 *
 * Engine mapping: insert = a copy appeared in this tier (a ghost hit when it was evicted from
 * this tier recently), access = a batch used it, remove = the copy left this tier (remembered as
 * a ghost), forget = the block was freed (its id now names other content: no ghost).
 *
 * Memory: the resident lists live in arrays indexed by key (the copy's slot with slot keys,
 * else the id: links 8 B and a 2-bit tag per key, 8.25 B); the ghosts B1 and B2, which have no
 * slot, live in a pool of entries (links, id, list: 13 B) found by id through an open-addressing
 * hash (linear probing, deletion by backward shift, at most half full), grown on demand and
 * bounded by the ghost lists' room (ARC_GHOST_MULT x capacity each).
 */
#include <errno.h>
#include <string.h>

#include "engine/alloc.h"
#include "elist.h"

enum { ARC_T1 = 0, ARC_T2 = 1, ARC_B1 = 2, ARC_B2 = 3, ARC_NONE = 0xff };
#define ARC_TAG_NONE 3u      /* a key's 2-bit tag when it is on no resident list */
#define ARC_GHOST_MULT 4u
#define ARC_LEARN_HITS 4096.0 /* p can cross a whole tier within this many ghost hits */
#define ARC_EVIDENCE_DIV 2u   /* ARC order once the ghosts hold >= 1/this of their room */

struct arc_state {
	uint8_t *tag;            /* [(cap + 3) / 4] 2 bits per key: ARC_T1, ARC_T2 or
	                            ARC_TAG_NONE (arc_tag()) */
	struct kvt_elist l[4];   /* T1, T2 (resident, over keys; empty until evidence), B1, B2
	                            (ghosts, over entries) */
	struct kvt_elist lru;    /* before evidence: all residents, in recency order */
	bool evidence;           /* the ghosts once held 1/ARC_EVIDENCE_DIV of their room: T1
	                            and T2 are apart (and lru empty) for good */
	double p;                /* target size of T1, 0..capacity */
	struct kvt_lru_link *glink; /* [gcap] ghost entries' list links */
	uint32_t *gid;           /* [gcap] the ghost's id; a free entry: the next free one */
	uint8_t *gtag;           /* [gcap] ARC_B1, ARC_B2, or ARC_NONE (free) */
	uint32_t gcap;           /* ghost entries */
	uint32_t gfree;          /* first free entry or KVT_NIL */
	uint32_t *ghash;         /* [hcap] entry of a ghost, by id; KVT_NIL = empty */
	uint32_t hcap;           /* power of two (0 before the first ghost) */
};

static struct arc_state *
arc_st(const struct kvt_evict *ev)
{
	return ev->priv;
}

/* The resident list of key @k (ARC_T1, ARC_T2) or ARC_NONE. */
static uint8_t
arc_tag(const struct arc_state *st, uint32_t k)
{
	unsigned v = st->tag[k / 4] >> (2 * (k % 4)) & 3u;

	return v == ARC_TAG_NONE ? ARC_NONE : (uint8_t)v;
}

static void
arc_tag_set(struct arc_state *st, uint32_t k, uint8_t to)
{
	unsigned v = to == ARC_NONE ? ARC_TAG_NONE : to, sh = 2 * (k % 4);

	st->tag[k / 4] = (uint8_t)((st->tag[k / 4] & ~(3u << sh)) | v << sh);
}

/* The list a resident tagged @tag is on: its own once there is evidence, else the LRU list. */
static struct kvt_elist *
arc_res_list(struct arc_state *st, uint8_t tag)
{
	return st->evidence ? &st->l[tag] : &st->lru;
}

static bool
arc_contains(const struct kvt_evict *ev, uint32_t id)
{
	uint32_t k = kvt_evict_key(ev, id);

	return k < ev->cap && arc_tag(arc_st(ev), k) <= ARC_T2;
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
		kvt_elist_init(&st->lru);
		st->p = ev->capacity / 5.0; /* no evidence yet: T1 may keep a fifth */
		st->gfree = KVT_NIL;
		ev->priv = st;
	}
	if (ev->keys)
		n_ids = ev->capacity; /* keys are slots: as many as the tier has */
	if (n_ids <= old)
		return 0;
	if (kvt_elist_links_grow(ev, n_ids))
		return -ENOMEM;
	if (!(p = kvt_realloc(st->tag, ((size_t)n_ids + 3) / 4)))
		return -ENOMEM;
	st->tag = p;
	/* new bytes: every key untagged (the keys past cap in the old last byte already are) */
	memset(st->tag + ((size_t)old + 3) / 4, 0xff,
	       ((size_t)n_ids + 3) / 4 - ((size_t)old + 3) / 4);
	ev->cap = n_ids;
	return 0;
}

static void
arc_fini(struct kvt_evict *ev)
{
	struct arc_state *st = ev->priv;

	if (st) {
		kvt_free(st->tag);
		kvt_free(st->glink);
		kvt_free(st->gid);
		kvt_free(st->gtag);
		kvt_free(st->ghash);
		kvt_free(st);
	}
	kvt_elist_links_free(ev);
}

static uint64_t
arc_meta_bytes(const struct kvt_evict *ev)
{
	const struct arc_state *st = arc_st(ev);

	if (!st)
		return 0;
	return sizeof *st + (uint64_t)ev->cap * sizeof *ev->link + ((uint64_t)ev->cap + 3) / 4 +
	       (uint64_t)st->gcap * (sizeof *st->glink + sizeof *st->gid + 1) +
	       (uint64_t)st->hcap * sizeof *st->ghash;
}

/* ---- ghosts: entries of B1/B2 found by id */

static uint32_t
arc_home(const struct arc_state *st, uint32_t id)
{
	return (uint32_t)(((uint64_t)id * 0x9E3779B97F4A7C15ull) >> 32) & (st->hcap - 1);
}

/* Position in ghash of @id's entry, or of the empty bucket where it would go. */
static uint32_t
arc_hpos(const struct arc_state *st, uint32_t id)
{
	uint32_t i = arc_home(st, id);

	while (st->ghash[i] != KVT_NIL && st->gid[st->ghash[i]] != id)
		i = (i + 1) & (st->hcap - 1);
	return i;
}

static uint32_t
arc_ghost_find(const struct arc_state *st, uint32_t id)
{
	return st->hcap ? st->ghash[arc_hpos(st, id)] : KVT_NIL;
}

/* Rehash into a table of @ncap buckets. 0 or -ENOMEM (table unchanged). */
static int
arc_hash_grow(struct arc_state *st, uint32_t ncap)
{
	uint32_t *old = st->ghash, ocap = st->hcap, i;
	uint32_t *nh = kvt_malloc((size_t)ncap * sizeof *nh);

	if (!nh)
		return -ENOMEM;
	memset(nh, 0xff, (size_t)ncap * sizeof *nh);
	st->ghash = nh;
	st->hcap = ncap;
	for (i = 0; i < ocap; i++)
		if (old[i] != KVT_NIL)
			nh[arc_hpos(st, st->gid[old[i]])] = old[i];
	kvt_free(old);
	return 0;
}

/* A free ghost entry (the pool doubled when none is left), or KVT_NIL when out of memory. */
static uint32_t
arc_ghost_entry(struct arc_state *st)
{
	uint32_t g, ncap, i;
	void *p;

	if (st->gfree == KVT_NIL) {
		ncap = st->gcap ? st->gcap * 2 : 64;
		if (ncap <= st->gcap)
			return KVT_NIL;
		if (!(p = kvt_realloc(st->glink, (size_t)ncap * sizeof *st->glink)))
			return KVT_NIL;
		st->glink = p;
		if (!(p = kvt_realloc(st->gid, (size_t)ncap * sizeof *st->gid)))
			return KVT_NIL;
		st->gid = p;
		if (!(p = kvt_realloc(st->gtag, ncap)))
			return KVT_NIL;
		st->gtag = p;
		for (i = ncap; i-- > st->gcap;) {
			st->gtag[i] = ARC_NONE;
			st->glink[i].prev = st->glink[i].next = KVT_NIL;
			st->gid[i] = st->gfree;
			st->gfree = i;
		}
		st->gcap = ncap;
	}
	g = st->gfree;
	st->gfree = st->gid[g];
	return g;
}

/* Remember @id as a ghost at the hot end of list @to (ARC_B1 or ARC_B2). Out of memory: the id
 * is forgotten instead (a ghost is a hint, never needed for correctness). */
static void
arc_ghost_add(struct arc_state *st, uint32_t id, uint8_t to)
{
	uint32_t used = st->l[ARC_B1].n + st->l[ARC_B2].n, g;

	if ((uint64_t)(used + 1) * 2 > st->hcap &&
	    arc_hash_grow(st, st->hcap ? st->hcap * 2 : 128))
		return;
	g = arc_ghost_entry(st);
	if (g == KVT_NIL)
		return;
	st->gid[g] = id;
	st->gtag[g] = to;
	st->ghash[arc_hpos(st, id)] = g;
	kvt_elist_push_head(&st->l[to], st->glink, g);
}

/* Drop ghost entry @g (off its list and the hash, back to the pool). */
static void
arc_ghost_del(struct arc_state *st, uint32_t g)
{
	uint32_t m = st->hcap - 1, i = arc_hpos(st, st->gid[g]), j = i, k;

	kvt_elist_unlink(&st->l[st->gtag[g]], st->glink, g);
	st->gtag[g] = ARC_NONE;
	st->ghash[i] = KVT_NIL;
	/* backward shift: close the gap for the entries probed past it */
	for (;;) {
		j = (j + 1) & m;
		if (st->ghash[j] == KVT_NIL)
			break;
		k = arc_home(st, st->gid[st->ghash[j]]);
		if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
			continue;
		st->ghash[i] = st->ghash[j];
		st->ghash[j] = KVT_NIL;
		i = j;
	}
	st->gid[g] = st->gfree;
	st->gfree = g;
}

/* ---- residents: T1/T2 over keys */

/* Put key @k (listed or not) at the hot end of resident list @to (inserted or used now). */
static void
arc_res_put(struct kvt_evict *ev, uint32_t k, uint8_t to)
{
	struct arc_state *st = arc_st(ev);
	uint8_t tag = arc_tag(st, k);

	if (tag != ARC_NONE) {
		kvt_elist_unlink(arc_res_list(st, tag), ev->link, k);
		ev->n--;
	}
	arc_tag_set(st, k, to);
	kvt_elist_push_head(arc_res_list(st, to), ev->link, k);
	ev->n++;
}

static void
arc_res_drop(struct kvt_evict *ev, uint32_t k)
{
	struct arc_state *st = arc_st(ev);

	kvt_elist_unlink(arc_res_list(st, arc_tag(st, k)), ev->link, k);
	arc_tag_set(st, k, ARC_NONE);
	ev->n--;
}

/* The evidence is in once the ghosts hold 1/ARC_EVIDENCE_DIV of their room: split the LRU list
 * into T1 and T2 by tag, oldest first, so each keeps its recency order. */
static void
arc_check_evidence(struct kvt_evict *ev)
{
	struct arc_state *st = arc_st(ev);
	uint64_t ghosts = (uint64_t)st->l[ARC_B1].n + st->l[ARC_B2].n;
	uint32_t k;

	if (st->evidence ||
	    ghosts * ARC_EVIDENCE_DIV < (uint64_t)ev->capacity * ARC_GHOST_MULT)
		return;
	st->evidence = true;
	while ((k = st->lru.tail) != KVT_NIL) {
		kvt_elist_unlink(&st->lru, ev->link, k);
		kvt_elist_push_head(&st->l[arc_tag(st, k)], ev->link, k);
	}
}

/* Keep each ghost list at most ARC_GHOST_MULT x capacity long: forget its oldest ids. */
static void
arc_trim_ghost(struct kvt_evict *ev, uint8_t g)
{
	struct arc_state *st = arc_st(ev);
	uint64_t max = (uint64_t)ev->capacity * ARC_GHOST_MULT;

	while (st->l[g].n > max)
		arc_ghost_del(st, st->l[g].tail);
}

static void
arc_insert(struct kvt_evict *ev, uint32_t id)
{
	struct arc_state *st = arc_st(ev);
	double c = ev->capacity, b1, b2, scale = c > ARC_LEARN_HITS ? c / ARC_LEARN_HITS : 1.0;
	uint32_t k = kvt_evict_key(ev, id), g;

	if (k >= ev->cap)
		return;
	b1 = st->l[ARC_B1].n ? st->l[ARC_B1].n : 1;
	b2 = st->l[ARC_B2].n ? st->l[ARC_B2].n : 1;
	if (arc_tag(st, k) <= ARC_T2) {
		arc_res_put(ev, k, ARC_T2);
		return;
	}
	g = arc_ghost_find(st, id);
	if (g == KVT_NIL) {
		arc_res_put(ev, k, ARC_T1);
		return;
	}
	if (st->gtag[g] == ARC_B1) { /* evicted from T1 too early: T1 deserves more room */
		st->p += scale * (b2 / b1 > 1.0 ? b2 / b1 : 1.0);
		if (st->p > c)
			st->p = c;
	} else { /* evicted from T2 too early */
		st->p -= scale * (b1 / b2 > 1.0 ? b1 / b2 : 1.0);
		if (st->p < 0)
			st->p = 0;
	}
	arc_ghost_del(st, g);
	arc_res_put(ev, k, ARC_T2);
}

static void
arc_access(struct kvt_evict *ev, uint32_t id)
{
	if (arc_contains(ev, id))
		arc_res_put(ev, kvt_evict_key(ev, id), ARC_T2);
}

static void
arc_remove(struct kvt_evict *ev, uint32_t id)
{
	struct arc_state *st = arc_st(ev);
	uint32_t k;
	uint8_t g;

	if (!arc_contains(ev, id))
		return;
	k = kvt_evict_key(ev, id);
	g = arc_tag(st, k) == ARC_T1 ? ARC_B1 : ARC_B2;
	arc_res_drop(ev, k);
	arc_ghost_add(st, id, g);
	arc_trim_ghost(ev, g);
	arc_check_evidence(ev);
}

static void
arc_forget(struct kvt_evict *ev, uint32_t id)
{
	struct arc_state *st = arc_st(ev);
	uint32_t g;

	if (arc_contains(ev, id))
		arc_res_drop(ev, kvt_evict_key(ev, id));
	g = arc_ghost_find(st, id);
	if (g != KVT_NIL)
		arc_ghost_del(st, g);
}

/* With evidence, the list victims come from first: T1 while it is above its target p, else T2
 * (the other when that one is empty). */
static uint8_t
arc_first_list(const struct kvt_evict *ev)
{
	const struct arc_state *st = arc_st(ev);

	if (!st->l[ARC_T2].n)
		return ARC_T1;
	if (!st->l[ARC_T1].n)
		return ARC_T2;
	return (double)st->l[ARC_T1].n > st->p ? ARC_T1 : ARC_T2;
}

static uint32_t
arc_victim_first(struct kvt_evict *ev)
{
	struct arc_state *st = arc_st(ev);
	uint8_t f;

	if (!st->evidence) /* LRU order: the least recently inserted or used */
		return kvt_evict_id(ev, st->lru.tail);
	f = arc_first_list(ev);
	return kvt_evict_id(ev, st->l[f].tail != KVT_NIL ? st->l[f].tail : st->l[f ^ 1].tail);
}

static uint32_t
arc_victim_next(struct kvt_evict *ev, uint32_t id)
{
	struct arc_state *st = arc_st(ev);
	uint32_t k;
	uint8_t f;

	if (!arc_contains(ev, id))
		return KVT_NIL;
	k = kvt_evict_key(ev, id);
	if (ev->link[k].prev != KVT_NIL)
		return kvt_evict_id(ev, ev->link[k].prev);
	if (!st->evidence)
		return KVT_NIL; /* the head of the LRU list: all walked */
	f = arc_first_list(ev);
	return arc_tag(st, k) == f ? kvt_evict_id(ev, st->l[f ^ 1].tail) : KVT_NIL;
}

const struct kvt_evict_ops kvt_evict_arc_ops = {
	.abi_version = KVT_EVICT_OPS_V4,
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
	.rank = NULL,
	.meta_bytes = arc_meta_bytes,
};
