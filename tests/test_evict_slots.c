/* SPDX-License-Identifier: MIT */
/*
 * tests/test_evict_slots.c - eviction policies keyed by slot (kvt_evict_use_slots): lru and arc
 * with their per-copy state indexed by the slot a copy occupies (and arc's ghosts in their own
 * id hash) must choose exactly the victims they choose with per-id arrays, under random
 * inserts, uses, removals, evictions and forgets; their memory depends on the capacity, not on
 * the ids.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "evict/evict.h"

#define NIDS 4096u /* ids */
#define CAP 48u    /* slots of the tier */

struct tmap {
	uint32_t slot_of[NIDS]; /* id -> slot or KVT_NIL */
	uint32_t id_of[CAP];    /* slot -> id or KVT_NIL */
	uint32_t free[CAP];     /* stack of free slots */
	uint32_t n_free;        /* entries on free */
};

static uint32_t
tmap_key(const void *ctx, uint32_t arg, uint32_t id)
{
	const struct tmap *m = ctx;

	(void)arg;
	return id < NIDS ? m->slot_of[id] : KVT_NIL;
}

static uint32_t
tmap_id(const void *ctx, uint32_t arg, uint32_t key)
{
	const struct tmap *m = ctx;

	(void)arg;
	return key < CAP ? m->id_of[key] : KVT_NIL;
}

/* Both instances give the same victims, in the same order, and list the same count. */
static void
same_walk(struct kvt_evict *a, struct kvt_evict *b)
{
	uint32_t x = a->ops->victim_first(a), y = b->ops->victim_first(b), n = 0;

	assert_int_equal(a->n, b->n);
	while (x != KVT_NIL || y != KVT_NIL) {
		assert_int_equal(x, y);
		assert_true(++n <= a->n);
		x = a->ops->victim_next(a, x);
		y = b->ops->victim_next(b, y);
	}
	assert_int_equal(n, a->n);
}

static void
put(struct kvt_evict *a, struct kvt_evict *b, struct tmap *m, uint32_t id)
{
	uint32_t s = m->free[--m->n_free];

	m->slot_of[id] = s;
	m->id_of[s] = id;
	a->ops->insert(a, id);
	b->ops->insert(b, id);
}

static void
take(struct kvt_evict *a, struct kvt_evict *b, struct tmap *m, uint32_t id)
{
	uint32_t s = m->slot_of[id];

	a->ops->remove(a, id);
	b->ops->remove(b, id); /* before its slot goes, as the engine does */
	m->slot_of[id] = KVT_NIL;
	m->id_of[s] = KVT_NIL;
	m->free[m->n_free++] = s;
}

static void
keyed_matches_ids(const struct kvt_evict_ops *ops)
{
	static struct tmap m;
	struct kvt_evict_keys keys = { tmap_key, tmap_id, &m, 0 };
	struct kvt_evict a, b;
	uint32_t i, id, v;

	memset(m.slot_of, 0xff, sizeof m.slot_of);
	memset(m.id_of, 0xff, sizeof m.id_of);
	for (i = 0; i < CAP; i++)
		m.free[i] = CAP - 1 - i;
	m.n_free = CAP;
	srand(7);
	assert_int_equal(kvt_evict_init(&a, ops, NIDS, CAP), 0);
	assert_int_equal(kvt_evict_init(&b, ops, NIDS, CAP), 0);
	assert_int_equal(kvt_evict_use_slots(&b, &keys), 0);
	assert_int_equal(b.cap, CAP); /* per slot, not per id */
	for (i = 0; i < 40000; i++) {
		id = (uint32_t)rand() % (rand() % 4 ? 160u : NIDS); /* a hot set and a long tail */
		if (m.slot_of[id] != KVT_NIL) {
			assert_true(a.ops->contains(&a, id) && b.ops->contains(&b, id));
			if (rand() % 3) {
				a.ops->access(&a, id);
				b.ops->access(&b, id);
			} else {
				take(&a, &b, &m, id);
			}
		} else {
			assert_false(b.ops->contains(&b, id));
			if (rand() % 16 == 0 && ops->forget) {
				a.ops->forget(&a, id);
				b.ops->forget(&b, id);
				continue;
			}
			if (!m.n_free) { /* full: the coldest goes */
				v = a.ops->victim_first(&a);
				assert_int_equal(v, b.ops->victim_first(&b));
				take(&a, &b, &m, v);
			}
			put(&a, &b, &m, id);
		}
		if (i % 64 == 0)
			same_walk(&a, &b);
	}
	same_walk(&a, &b);
	assert_true(kvt_evict_meta_bytes(&b) > 0);
	a.ops->fini(&a);
	b.ops->fini(&b);
}

static void
test_keyed_lru(void **state)
{
	(void)state;
	keyed_matches_ids(&kvt_evict_lru_ops);
}

static void
test_keyed_arc(void **state)
{
	(void)state;
	keyed_matches_ids(&kvt_evict_arc_ops);
}

/* A keyed arc's resident state is per slot; its ghosts are bounded by their lists' room. */
static void
test_keyed_arc_memory(void **state)
{
	static struct tmap m;
	struct kvt_evict_keys keys = { tmap_key, tmap_id, &m, 0 };
	struct kvt_evict b;
	uint32_t i, bytes;

	(void)state;
	memset(m.slot_of, 0xff, sizeof m.slot_of);
	memset(m.id_of, 0xff, sizeof m.id_of);
	assert_int_equal(kvt_evict_init(&b, &kvt_evict_arc_ops, 16, CAP), 0);
	assert_int_equal(kvt_evict_use_slots(&b, &keys), 0);
	assert_int_equal(b.ops->reserve(&b, NIDS), 0); /* ids do not grow it */
	assert_int_equal(b.cap, CAP);
	bytes = (uint32_t)kvt_evict_meta_bytes(&b);
	for (i = 0; i < NIDS; i++) { /* every id in once, then out: ghosts */
		m.slot_of[i] = 0;
		m.id_of[0] = i;
		b.ops->insert(&b, i);
		b.ops->remove(&b, i);
		m.slot_of[i] = KVT_NIL;
	}
	assert_int_equal(b.n, 0);
	/* ghosts: at most 4 x capacity per list, under 11 bytes each (queue slot and hash bucket) */
	assert_true(kvt_evict_meta_bytes(&b) - bytes <= 2u * 4 * CAP * 11 + 1024);
	b.ops->fini(&b);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_keyed_lru),
		cmocka_unit_test(test_keyed_arc),
		cmocka_unit_test(test_keyed_arc_memory),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
