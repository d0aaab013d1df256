/* SPDX-License-Identifier: MIT */
/*
 * tests/test_evict_arc.c - ARC's ghost lists (evict/arc.c) against a reference: a plain ARC
 * written here with its five lists as arrays (T1, T2, the single LRU list before evidence, B1,
 * B2; shifted with memmove, searched linearly). Thousands of random inserts (new ids and ghost
 * hits), uses, evictions, removals and forgets at small capacities, so that the ghost lists
 * trim all the time and their queues compact and grow; after every step the whole victim walk
 * must be the reference's, every id's membership too, and meta_bytes stays within the ghost
 * lists' room. And what a ghost costs once both lists are full: at most 11 bytes.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "evict/evict.h"

#define RMAX 1024u /* ids of a reference run, and the longest reference list */
#define RNONE 0xffu /* an id on no resident list */

/* One reference list: id[0] is the coldest (tail), id[n - 1] the hottest (head). */
struct rlist {
	uint32_t id[RMAX]; /* ids, coldest first */
	uint32_t n;        /* ids on the list */
};

/* The reference ARC (the rules of evict/arc.c's header, one array per list). */
struct rarc {
	struct rlist t[2];   /* T1, T2 once there is evidence */
	struct rlist lru;    /* before evidence: all residents */
	struct rlist b[2];   /* ghosts B1, B2 */
	uint8_t tag[RMAX];   /* 0 (T1), 1 (T2) or RNONE */
	bool evidence;       /* the ghosts once held half their room */
	double p;            /* target size of T1 */
	uint32_t capacity;   /* slots of the tier */
	uint32_t n;          /* residents */
};

static int
rl_find(const struct rlist *l, uint32_t id)
{
	for (uint32_t i = 0; i < l->n; i++)
		if (l->id[i] == id)
			return (int)i;
	return -1;
}

static void
rl_del(struct rlist *l, uint32_t i)
{
	memmove(&l->id[i], &l->id[i + 1], (l->n - i - 1) * sizeof l->id[0]);
	l->n--;
}

static void
rl_push(struct rlist *l, uint32_t id)
{
	assert_true(l->n < RMAX);
	l->id[l->n++] = id;
}

static struct rlist *
ref_list(struct rarc *r, uint8_t tag)
{
	return r->evidence ? &r->t[tag] : &r->lru;
}

static void
ref_put(struct rarc *r, uint32_t id, uint8_t to)
{
	if (r->tag[id] != RNONE) {
		struct rlist *l = ref_list(r, r->tag[id]);

		rl_del(l, (uint32_t)rl_find(l, id));
		r->n--;
	}
	r->tag[id] = to;
	rl_push(ref_list(r, to), id);
	r->n++;
}

static void
ref_drop(struct rarc *r, uint32_t id)
{
	struct rlist *l = ref_list(r, r->tag[id]);

	rl_del(l, (uint32_t)rl_find(l, id));
	r->tag[id] = RNONE;
	r->n--;
}

static void
ref_insert(struct rarc *r, uint32_t id)
{
	double c = r->capacity, scale = c > 4096.0 ? c / 4096.0 : 1.0;
	double b1 = r->b[0].n ? r->b[0].n : 1, b2 = r->b[1].n ? r->b[1].n : 1;
	int g0 = rl_find(&r->b[0], id), g1 = rl_find(&r->b[1], id);

	if (r->tag[id] != RNONE) {
		ref_put(r, id, 1);
	} else if (g0 >= 0) {
		r->p += scale * (b2 / b1 > 1.0 ? b2 / b1 : 1.0);
		if (r->p > c)
			r->p = c;
		rl_del(&r->b[0], (uint32_t)g0);
		ref_put(r, id, 1);
	} else if (g1 >= 0) {
		r->p -= scale * (b1 / b2 > 1.0 ? b1 / b2 : 1.0);
		if (r->p < 0)
			r->p = 0;
		rl_del(&r->b[1], (uint32_t)g1);
		ref_put(r, id, 1);
	} else {
		ref_put(r, id, 0);
	}
}

static void
ref_remove(struct rarc *r, uint32_t id)
{
	uint8_t g;

	if (r->tag[id] == RNONE)
		return;
	g = r->tag[id];
	ref_drop(r, id);
	rl_push(&r->b[g], id);
	while (r->b[g].n > 4 * r->capacity)
		rl_del(&r->b[g], 0);
	if (!r->evidence && (r->b[0].n + r->b[1].n) * 2 >= r->capacity * 4) {
		r->evidence = true;
		for (uint32_t i = 0; i < r->lru.n; i++)
			rl_push(&r->t[r->tag[r->lru.id[i]]], r->lru.id[i]);
		r->lru.n = 0;
	}
}

static void
ref_forget(struct rarc *r, uint32_t id)
{
	int g;

	if (r->tag[id] != RNONE)
		ref_drop(r, id);
	for (uint32_t b = 0; b < 2; b++)
		if ((g = rl_find(&r->b[b], id)) >= 0)
			rl_del(&r->b[b], (uint32_t)g);
}

/* The reference's victim walk into @out; returns its length. */
static uint32_t
ref_walk(const struct rarc *r, uint32_t *out)
{
	uint32_t n = 0, f, i;

	if (!r->evidence) {
		for (i = 0; i < r->lru.n; i++)
			out[n++] = r->lru.id[i];
		return n;
	}
	f = !r->t[1].n ? 0 : !r->t[0].n ? 1 : (double)r->t[0].n > r->p ? 0 : 1;
	for (i = 0; i < r->t[f].n; i++)
		out[n++] = r->t[f].id[i];
	for (i = 0; i < r->t[f ^ 1].n; i++)
		out[n++] = r->t[f ^ 1].id[i];
	return n;
}

static uint32_t
walk(struct kvt_evict *ev, uint32_t *out, uint32_t max)
{
	uint32_t n = 0, id;

	for (id = ev->ops->victim_first(ev); id != KVT_NIL && n < max;
	     id = ev->ops->victim_next(ev, id))
		out[n++] = id;
	return n;
}

/* Host bytes the ghosts of a tier of @capacity slots may take at most: two queues of 9/8 of a
 * list's room (4 x capacity) and 16 more ids, and a hash at most 3/4 full with both lists full
 * and one more, 4 bytes per slot and bucket. */
static uint64_t
ghost_room_bytes(uint32_t capacity)
{
	uint64_t g = 4ull * capacity;

	return 4 * (2 * (g + g / 8 + 16) + ((2 * g + 1) * 4 + 2) / 3);
}

/* After each step: the same victims in the same order, the same members, bytes in bounds. */
static void
check_same(struct kvt_evict *ev, const struct rarc *r, uint32_t nids, uint64_t base,
	   uint64_t *last)
{
	static uint32_t got[RMAX + 8], want[RMAX];
	uint32_t n = walk(ev, got, RMAX + 8), m = ref_walk(r, want);
	uint64_t mb = kvt_evict_meta_bytes(ev);

	assert_int_equal(n, m);
	assert_memory_equal(got, want, (size_t)n * sizeof got[0]);
	assert_int_equal(ev->n, r->n);
	for (uint32_t i = 0; i < nids; i++)
		assert_int_equal(ev->ops->contains(ev, i), r->tag[i] != RNONE);
	assert_true(mb >= *last); /* the ghost lists' memory grows, never shrinks */
	assert_true(mb <= base + ghost_room_bytes(r->capacity));
	*last = mb;
}

/* A random ghost id of @r (B1 or B2), or KVT_NIL when there is none. */
static uint32_t
any_ghost(const struct rarc *r, unsigned *seed)
{
	uint32_t n = r->b[0].n + r->b[1].n, i;

	if (!n)
		return KVT_NIL;
	i = (uint32_t)rand_r(seed) % n;
	return i < r->b[0].n ? r->b[0].id[i] : r->b[1].id[i - r->b[0].n];
}

static void
differential(uint32_t capacity, int steps, unsigned seed)
{
	static struct rarc r;
	static uint32_t order[RMAX + 8];
	uint32_t nids = 12 * capacity + 8, id, n;
	struct kvt_evict ev;
	uint64_t base, last;

	assert_true(nids <= RMAX);
	memset(&r, 0, sizeof r);
	memset(r.tag, RNONE, sizeof r.tag);
	r.capacity = capacity;
	r.p = capacity / 5.0;
	assert_int_equal(kvt_evict_init(&ev, &kvt_evict_arc_ops, nids, capacity), 0);
	base = last = kvt_evict_meta_bytes(&ev);
	for (int step = 0; step < steps; step++) {
		uint32_t op = (uint32_t)rand_r(&seed) % 100;

		id = (uint32_t)rand_r(&seed) % nids;
		if (op < 45) { /* a copy appears: a new id, or a ghost's (a hit) */
			if (op >= 30 && (n = any_ghost(&r, &seed)) != KVT_NIL)
				id = n;
			if (r.tag[id] == RNONE && ev.n >= capacity) { /* full: evict first */
				n = ev.ops->victim_first(&ev); /* the reference's: checked */
				ev.ops->remove(&ev, n);
				ref_remove(&r, n);
				check_same(&ev, &r, nids, base, &last);
			}
			ev.ops->insert(&ev, id);
			ref_insert(&r, id);
		} else if (op < 60) { /* a batch uses a copy (one it has) */
			if (r.tag[id] == RNONE)
				continue;
			ev.ops->access(&ev, id);
			ref_insert(&r, id);
		} else if (op < 75) { /* an eviction somewhere in the walk */
			if (!(n = walk(&ev, order, RMAX + 8)))
				continue;
			id = op < 70 ? order[0] : order[(uint32_t)rand_r(&seed) % n];
			ev.ops->remove(&ev, id);
			ref_remove(&r, id);
		} else if (op < 85) { /* a copy leaves (or nothing, when there is none) */
			ev.ops->remove(&ev, id);
			ref_remove(&r, id);
		} else { /* a block is freed: mostly a ghost's */
			if (op < 95 && (n = any_ghost(&r, &seed)) != KVT_NIL)
				id = n;
			ev.ops->forget(&ev, id);
			ref_forget(&r, id);
		}
		check_same(&ev, &r, nids, base, &last);
	}
	assert_true(r.evidence); /* the runs reach ARC's order */
	ev.ops->fini(&ev);
}

/* Random steps at capacities of 1 to 40 slots (ghost lists of 4 to 160 ids, ids 12 x the
 * capacity): lists trim, queues compact and grow, the hash grows, ghosts hit and are forgotten
 * in the middle of their lists. */
static void
test_arc_ghosts_match_reference(void **state)
{
	static const uint32_t caps[] = { 1, 2, 3, 5, 8, 16, 40 };

	(void)state;
	for (unsigned i = 0; i < sizeof caps / sizeof caps[0]; i++)
		differential(caps[i], 4000, 17 + i);
}

/* Both ghost lists full (4 x capacity each): bytes per ghost above what the instance holds
 * with no ghost, after many times that many evictions (the queues compacted often). */
static void
test_arc_ghost_bytes(void **state)
{
	static const uint32_t caps[] = { 16, 64, 256, 1000, 4096, 65536 };

	(void)state;
	for (unsigned c = 0; c < sizeof caps / sizeof caps[0]; c++) {
		uint32_t cap = caps[c], nids = 24 * cap, ghosts = 8 * cap, id;
		struct kvt_evict ev;
		uint64_t base, full;
		double per;

		assert_int_equal(kvt_evict_init(&ev, &kvt_evict_arc_ops, nids, cap), 0);
		base = kvt_evict_meta_bytes(&ev);
		for (id = 0; id < nids; id++) { /* odd ids used twice: ghosts of B2, even of B1 */
			ev.ops->insert(&ev, id);
			if (id % 2)
				ev.ops->access(&ev, id);
			ev.ops->remove(&ev, id);
		}
		full = kvt_evict_meta_bytes(&ev);
		per = (double)(full - base) / ghosts;
		print_message("arc capacity %u: %u ghosts, %.2f bytes each\n", cap, ghosts, per);
		assert_true(full - base >= 8ull * ghosts); /* an id and a bucket each, at least */
		assert_true(full - base <= 11ull * ghosts);
		ev.ops->fini(&ev);
	}
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_arc_ghosts_match_reference),
		cmocka_unit_test(test_arc_ghost_bytes),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
