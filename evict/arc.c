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
 * else the id: links 8 B and a 2-bit tag per key, 8.25 B). The ghosts B1 and B2, which have no
 * slot, are never used in place: each list is a FIFO of ids with removals in the middle (hits,
 * forgets). Each lives in a queue of 4-byte ids (struct arc_fifo: a removed ghost leaves a
 * tombstone; when the queue reaches its end the live ids move down, O(n) once per eighth of it),
 * of at most 9/8 of the list's room (ARC_GHOST_MULT x capacity) + 16; one hash of 4-byte buckets
 * (the list and the position in its queue; the id is read from the queue) finds them by id
 * (linear probing, deletion by backward shift, a table of any size up to the one that holds both
 * full lists at most 3/4 loaded). Both grow on demand, so a tier that never evicts has none. With
 * both lists full a ghost costs 4.5 B of queue and 5.33 B of hash: 9.83 B (10.9 B at 16 slots,
 * where the 16 spare ids weigh; tests/test_evict_arc.c), where the earlier pool of 13-byte
 * entries with a hash at most half full took 21 B at best and up to 42 B.
 */
#include <errno.h>
#include <string.h>

#include "tiers/base/alloc.h"
#include "bits.h"
#include "elist.h"

enum { ARC_T1 = 0, ARC_T2 = 1, ARC_B1 = 2, ARC_B2 = 3, ARC_NONE = 0xff };
#define ARC_TAG_NONE 3u      /* a key's 2-bit tag when it is on no resident list */
#define ARC_GHOST_MULT 4u
#define ARC_LEARN_HITS 4096.0 /* p can cross a whole tier within this many ghost hits */
#define ARC_EVIDENCE_DIV 2u   /* ARC order once the ghosts hold >= 1/this of their room */
#define ARC_POS_MASK 0x7fffffffu /* a hash bucket: the ghost's position; above it its list */
#define ARC_FIFO_MIN 64u      /* first size of a ghost queue */
#define ARC_HASH_MIN 128u     /* first size of the ghost hash */

/* One ghost list, oldest first: ids in the order they left the tier, in a queue of 4-byte
 * slots that grows at hi and loses its oldest at lo. A ghost removed in the middle leaves a
 * tombstone (KVT_NIL) that lo and hi skip; when hi reaches the end the live ids move down to
 * the start (the hash learns their new positions), or the queue grows when that would free
 * less than an eighth of it. */
struct arc_fifo {
	uint32_t *id;            /* [cap] ghost ids at [lo, hi); KVT_NIL = a tombstone */
	uint32_t cap;            /* slots (grows by doubling up to arc_state.fmax) */
	uint32_t lo;             /* the oldest ghost's slot (a live one while n > 0) */
	uint32_t hi;             /* one past the newest's slot (a live one below it) */
	uint32_t n;              /* ghosts on the list */
};

struct arc_state {
	uint64_t *tag;           /* [kvt_bits2_words(cap)] 2 bits per key: ARC_T1, ARC_T2 or
	                            ARC_TAG_NONE (arc_tag()) */
	struct kvt_elist l[2];   /* T1, T2 (resident, over keys; empty until evidence) */
	struct kvt_elist lru;    /* before evidence: all residents, in recency order */
	bool evidence;           /* the ghosts once held 1/ARC_EVIDENCE_DIV of their room: T1
	                            and T2 are apart (and lru empty) for good */
	double p;                /* target size of T1, 0..capacity */
	struct arc_fifo g[2];    /* the ghost lists B1 (g[0]) and B2 (g[1]) */
	uint64_t gmax;           /* room of each ghost list: ARC_GHOST_MULT x capacity */
	uint32_t fmax;           /* most slots of a ghost queue: gmax + gmax / 8 + 16 */
	uint32_t *ghash;         /* [hcap] ghosts by id: list << 31 | position; KVT_NIL = empty
	                            (the id is read from the queue) */
	uint32_t hcap;           /* buckets (0 before the first ghost; up to hmax) */
	uint32_t hmax;           /* buckets that keep both lists full at most 3/4 loaded */
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
	unsigned v = kvt_bits2_get(st->tag, k);

	return v == ARC_TAG_NONE ? ARC_NONE : (uint8_t)v;
}

static void
arc_tag_set(struct arc_state *st, uint32_t k, uint8_t to)
{
	kvt_bits2_set(st->tag, k, to == ARC_NONE ? ARC_TAG_NONE : to);
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
	uint64_t room;

	if (!st) {
		st = kvt_calloc(1, sizeof *st);
		if (!st)
			return -ENOMEM;
		for (i = 0; i < 2; i++)
			kvt_elist_init(&st->l[i]);
		kvt_elist_init(&st->lru);
		st->p = ev->capacity / 5.0; /* no evidence yet: T1 may keep a fifth */
		st->gmax = (uint64_t)ev->capacity * ARC_GHOST_MULT;
		room = st->gmax + st->gmax / 8 + 16;
		st->fmax = room < ARC_POS_MASK ? (uint32_t)room : ARC_POS_MASK;
		room = ((2 * st->gmax + 1) * 4 + 2) / 3; /* both lists full, one more: 3/4 */
		st->hmax = room < UINT32_MAX ? (uint32_t)room : UINT32_MAX;
		ev->priv = st;
	}
	if (ev->keys)
		n_ids = ev->capacity; /* keys are slots: as many as the tier has */
	if (n_ids <= old)
		return 0;
	if (kvt_elist_links_grow(ev, n_ids))
		return -ENOMEM;
	/* new words: every key untagged (the keys past cap in the old last word already are) */
	if (kvt_bits2_grow(&st->tag, old, n_ids, 0xff))
		return -ENOMEM;
	ev->cap = n_ids;
	return 0;
}

static void
arc_fini(struct kvt_evict *ev)
{
	struct arc_state *st = ev->priv;

	if (st) {
		kvt_free(st->tag);
		kvt_free(st->g[0].id);
		kvt_free(st->g[1].id);
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
	return sizeof *st + (uint64_t)ev->cap * sizeof *ev->link +
	       (uint64_t)kvt_bits2_words(ev->cap) * sizeof *st->tag +
	       ((uint64_t)st->g[0].cap + st->g[1].cap) * sizeof *st->g[0].id +
	       (uint64_t)st->hcap * sizeof *st->ghash;
}

/* ---- ghosts: B1/B2 as queues of ids, found by id through one hash */

/* The id of the ghost hash bucket value @v names. */
static uint32_t
arc_hid(const struct arc_state *st, uint32_t v)
{
	return st->g[v >> 31].id[v & ARC_POS_MASK];
}

static uint32_t
arc_home(const struct arc_state *st, uint32_t id)
{
	return kvt_hash_home(id, st->hcap);
}

/* Position in ghash of @id's bucket, or of the empty bucket where it would go. */
static uint32_t
arc_hpos(const struct arc_state *st, uint32_t id)
{
	uint32_t i = arc_home(st, id);

	while (st->ghash[i] != KVT_NIL && arc_hid(st, st->ghash[i]) != id)
		i = i + 1 == st->hcap ? 0 : i + 1;
	return i;
}

/* The bucket of ghost @id, or KVT_NIL when @id is no ghost. */
static uint32_t
arc_ghost_find(const struct arc_state *st, uint32_t id)
{
	uint32_t i;

	if (!st->hcap)
		return KVT_NIL;
	i = arc_hpos(st, id);
	return st->ghash[i] != KVT_NIL ? i : KVT_NIL;
}

/* The next size of a table of @cur entries: @min at first, then doubled, never above @max. */
static uint32_t
arc_grow_cap(uint32_t cur, uint32_t min, uint32_t max)
{
	uint32_t n = cur ? (cur > max / 2 ? max : cur * 2) : min;

	return n > max ? max : n;
}

/* Rehash into a larger table (doubled, at most hmax buckets). 0 or -ENOMEM (unchanged). */
static int
arc_hash_grow(struct arc_state *st)
{
	uint32_t *old = st->ghash, ocap = st->hcap, i;
	uint32_t ncap = arc_grow_cap(ocap, ARC_HASH_MIN, st->hmax);
	uint32_t *nh;

	if (ncap <= ocap || !(nh = kvt_malloc((size_t)ncap * sizeof *nh)))
		return -ENOMEM;
	memset(nh, 0xff, (size_t)ncap * sizeof *nh);
	st->ghash = nh;
	st->hcap = ncap;
	for (i = 0; i < ocap; i++)
		if (old[i] != KVT_NIL)
			nh[arc_hpos(st, arc_hid(st, old[i]))] = old[i];
	kvt_free(old);
	return 0;
}

/* Queue @b is at its end: move its live ids down to the start (rewriting their buckets), or
 * grow it when that would free less than an eighth. 0, or -ENOMEM when it has no room. */
static int
arc_fifo_room(struct arc_state *st, uint32_t b)
{
	struct arc_fifo *f = &st->g[b];
	uint32_t ncap, i, j = 0, id;
	void *p;

	if (f->cap - f->n < f->cap / 8 + 1 && f->cap < st->fmax) {
		ncap = arc_grow_cap(f->cap, ARC_FIFO_MIN, st->fmax);
		if ((p = kvt_realloc(f->id, (size_t)ncap * sizeof *f->id))) {
			f->id = p;
			f->cap = ncap;
			return 0;
		}
	}
	if (f->n == f->cap)
		return -ENOMEM;
	for (i = f->lo; i < f->hi; i++) {
		if ((id = f->id[i]) == KVT_NIL)
			continue;
		/* the buckets of ids moved so far name their new slots, the others their old */
		st->ghash[arc_hpos(st, id)] = b << 31 | j;
		f->id[j++] = id;
	}
	f->lo = 0;
	f->hi = j;
	return 0;
}

/* Remember @id as a ghost at the hot end of list @to (ARC_B1 or ARC_B2). Out of memory: the id
 * is forgotten instead (a ghost is a hint, never needed for correctness). */
static void
arc_ghost_add(struct arc_state *st, uint32_t id, uint8_t to)
{
	uint32_t used = st->g[0].n + st->g[1].n, b = to - ARC_B1;
	struct arc_fifo *f = &st->g[b];

	if ((uint64_t)(used + 1) * 4 > (uint64_t)st->hcap * 3 && arc_hash_grow(st))
		return;
	if (f->hi == f->cap && arc_fifo_room(st, b))
		return;
	f->id[f->hi] = id;
	st->ghash[arc_hpos(st, id)] = b << 31 | f->hi;
	f->hi++;
	f->n++;
}

/* Drop the ghost of bucket @i (off the hash, a tombstone in its queue). */
static void
arc_ghost_del(struct arc_state *st, uint32_t i)
{
	uint32_t v = st->ghash[i], j = i, k;
	struct arc_fifo *f = &st->g[v >> 31];

	st->ghash[i] = KVT_NIL;
	/* backward shift: close the gap for the buckets probed past it */
	for (;;) {
		j = j + 1 == st->hcap ? 0 : j + 1;
		if (st->ghash[j] == KVT_NIL)
			break;
		k = arc_home(st, arc_hid(st, st->ghash[j]));
		if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
			continue;
		st->ghash[i] = st->ghash[j];
		st->ghash[j] = KVT_NIL;
		i = j;
	}
	f->id[v & ARC_POS_MASK] = KVT_NIL;
	if (!--f->n) {
		f->lo = f->hi = 0;
		return;
	}
	while (f->id[f->lo] == KVT_NIL)
		f->lo++;
	while (f->id[f->hi - 1] == KVT_NIL)
		f->hi--;
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
	uint64_t ghosts = (uint64_t)st->g[0].n + st->g[1].n;
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
	struct arc_fifo *f = &st->g[g - ARC_B1];

	while (f->n > st->gmax)
		arc_ghost_del(st, arc_hpos(st, f->id[f->lo]));
}

static void
arc_insert(struct kvt_evict *ev, uint32_t id)
{
	struct arc_state *st = arc_st(ev);
	double c = ev->capacity, b1, b2, scale = c > ARC_LEARN_HITS ? c / ARC_LEARN_HITS : 1.0;
	uint32_t k = kvt_evict_key(ev, id), g;

	if (k >= ev->cap)
		return;
	b1 = st->g[0].n ? st->g[0].n : 1;
	b2 = st->g[1].n ? st->g[1].n : 1;
	if (arc_tag(st, k) <= ARC_T2) {
		arc_res_put(ev, k, ARC_T2);
		return;
	}
	g = arc_ghost_find(st, id);
	if (g == KVT_NIL) {
		arc_res_put(ev, k, ARC_T1);
		return;
	}
	if (st->ghash[g] >> 31 == 0) { /* evicted from T1 too early: T1 deserves more room */
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
