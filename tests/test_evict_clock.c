/* SPDX-License-Identifier: MIT */
/*
 * tests/test_evict_clock.c - the GCLOCK policy (evict/clock.c): its victim order on scripted
 * sequences (a frequently used copy outlives cold ones, a copy used once survives one sweep,
 * a skipped victim comes back at the end of the hand's next round, a removal that is no
 * eviction leaves the hand alone, even right after a full walk, while an eviction (ops V5)
 * sweeps), its full walk against a literal GCLOCK model (a hand stepping key by key) after
 * every step of random inserts, uses, removals and evictions with skips, keyed by id and by
 * slot; its memory (a quarter byte per key); and the engine's choice of it for the NVMe tier.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "engine/engine_impl.h"
#include "evict/evict.h"
#include "support/kvt_test.h"

#define NIDS 256u  /* ids of the random test */
#define NSLOTS 40u /* slots of its slot-keyed tier */
#define REF_NONE UINT64_MAX

/* Walk the victims into @out (at most @max); returns how many. */
static uint32_t
walk(struct kvt_evict *ev, uint32_t *out, uint32_t max)
{
	uint32_t n = 0, id;

	for (id = ev->ops->victim_first(ev); id != KVT_NIL && n < max;
	     id = ev->ops->victim_next(ev, id))
		out[n++] = id;
	return n;
}

/* The walk is exactly @want[0..n). */
static void
expect_walk(struct kvt_evict *ev, const uint32_t *want, uint32_t n)
{
	uint32_t got[64], m = walk(ev, got, 64), i;

	assert_int_equal(m, n);
	assert_int_equal(ev->n, n);
	for (i = 0; i < n; i++)
		assert_int_equal(got[i], want[i]);
}

/* Evict the first victim (the engine's drop: an eviction right after the walk offered it). */
static uint32_t
evict_first(struct kvt_evict *ev)
{
	uint32_t v = ev->ops->victim_first(ev);

	assert_int_not_equal(v, KVT_NIL);
	kvt_evict_evicted(ev, v);
	return v;
}

#define EXPECT(ev, ...)                                                                     \
	do {                                                                                \
		const uint32_t w_[] = { __VA_ARGS__ };                                      \
		expect_walk(ev, w_, sizeof w_ / sizeof w_[0]);                              \
	} while (0)

/* A scripted sequence over 8 id keys, the hand starting at key 0. */
static void
test_clock_scripted(void **state)
{
	struct kvt_evict ev;
	uint32_t i, v;

	(void)state;
	assert_int_equal(kvt_evict_init(&ev, &kvt_evict_clock_ops, 8, 8), 0);
	for (i = 0; i < 6; i++)
		ev.ops->insert(&ev, i);
	EXPECT(&ev, 0, 1, 2, 3, 4, 5); /* all at counter 0: from the hand on */
	ev.ops->access(&ev, 2);
	ev.ops->access(&ev, 2);
	ev.ops->access(&ev, 2); /* capped at 2 */
	ev.ops->access(&ev, 4);
	EXPECT(&ev, 0, 1, 3, 5, 4, 2); /* by counter, then distance from the hand */
	assert_int_equal(evict_first(&ev), 0);
	EXPECT(&ev, 1, 3, 5, 4, 2);
	assert_int_equal(evict_first(&ev), 1);
	/* the hand (now at 2) passes 2 on its way to 3: 2's counter drops to 1; hand at 4 */
	assert_int_equal(evict_first(&ev), 3);
	EXPECT(&ev, 5, 4, 2);
	/* the hand passes 4 (used once) on its way to 5: 4 drops to 0 and goes next */
	assert_int_equal(evict_first(&ev), 5);
	EXPECT(&ev, 4, 2);
	/* hand at 6: new copies at keys 6 and 7 come before 4 (a round away), and key 0 after */
	ev.ops->insert(&ev, 6);
	ev.ops->insert(&ev, 7);
	ev.ops->insert(&ev, 0);
	EXPECT(&ev, 6, 7, 0, 4, 2);
	/* the caller skips 6 (pinned) and evicts 7: the hand passes 6 (counter 0 stays 0) and
	 * stops past 7; 6 comes back at the end of the next round, after 0 and 4 */
	v = ev.ops->victim_first(&ev);
	assert_int_equal(v, 6);
	v = ev.ops->victim_next(&ev, v);
	assert_int_equal(v, 7);
	kvt_evict_evicted(&ev, 7);
	EXPECT(&ev, 0, 4, 6, 2);
	/* a removal that is no eviction leaves the hand at 0: 2 keeps its counter 1 (a sweep to
	 * 4 would have dropped it to 0) */
	ev.ops->insert(&ev, 1);
	ev.ops->remove(&ev, 4);
	EXPECT(&ev, 0, 1, 6, 2);
	/* re-inserting a listed copy is a use: 6 joins 2 at counter 1, nearer the hand after */
	ev.ops->insert(&ev, 6);
	EXPECT(&ev, 0, 1, 2, 6);
	ev.ops->insert(&ev, 0);
	ev.ops->insert(&ev, 0);
	EXPECT(&ev, 1, 2, 6, 0); /* 0 at counter 2 */
	assert_false(ev.ops->contains(&ev, 4));
	assert_true(ev.ops->contains(&ev, 6));
	assert_null(ev.ops->forget);
	assert_null(ev.ops->rank);
	ev.ops->fini(&ev);
}

/* A removal that is no eviction (a block freed, rewritten, demoted by its owner) right after a
 * full walk (kvt_engine_check's) leaves the hand and the other counters alone: the walk's order
 * stays, less the removed copies. */
static void
test_clock_remove_after_walk(void **state)
{
	struct kvt_evict ev;
	uint32_t i;

	(void)state;
	assert_int_equal(kvt_evict_init(&ev, &kvt_evict_clock_ops, 8, 8), 0);
	for (i = 0; i < 6; i++)
		ev.ops->insert(&ev, i);
	ev.ops->access(&ev, 1);
	ev.ops->access(&ev, 4);
	ev.ops->access(&ev, 4);
	EXPECT(&ev, 0, 2, 3, 5, 1, 4); /* a full walk: every copy offered */
	/* 3 is freed: a sweep to it would take the hand past 0, 1, 2 (1 down to 0) to 4, and
	 * the order would be 5, 0, 1, 2, 4 */
	ev.ops->remove(&ev, 3);
	EXPECT(&ev, 0, 2, 5, 1, 4);
	ev.ops->remove(&ev, 0);
	EXPECT(&ev, 2, 5, 1, 4);
	/* an eviction of the walk's first victim still sweeps: the hand passes 1 (down to 0) on
	 * its way to 2 and stops at 3 */
	assert_int_equal(evict_first(&ev), 2);
	EXPECT(&ev, 5, 1, 4);
	/* so does one after the full walk (the engine's clean-first reclaim collects the walk's
	 * candidates, then evicts): 1 is taken, the hand passes 4 (down to 1) and 5 */
	EXPECT(&ev, 5, 1, 4);
	kvt_evict_evicted(&ev, 1);
	EXPECT(&ev, 5, 4);
	assert_int_equal(ev.ops->abi_version, KVT_EVICT_OPS_V5);
	ev.ops->fini(&ev);
}

/* ---- slot keys: a map of the test's own, slots handed out LIFO like tiers/slots.c */

struct tmap {
	uint32_t slot_of[NIDS]; /* id -> slot or KVT_NIL */
	uint32_t id_of[NSLOTS]; /* slot -> id or KVT_NIL */
	uint32_t free[NSLOTS];  /* stack of free slots */
	uint32_t n_free;        /* entries on free */
	uint32_t n_slots;       /* slots in use by the test (<= NSLOTS) */
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
	return key < NSLOTS ? m->id_of[key] : KVT_NIL;
}

static void
tmap_init(struct tmap *m, uint32_t n_slots)
{
	uint32_t i;

	memset(m->slot_of, 0xff, sizeof m->slot_of);
	memset(m->id_of, 0xff, sizeof m->id_of);
	for (i = 0; i < n_slots; i++)
		m->free[i] = n_slots - 1 - i; /* slot 0 on top */
	m->n_free = m->n_slots = n_slots;
}

/* A frequently used copy outlives a stream of cold ones through a full slot-keyed tier; the
 * cold ones leave in the order they came (FIFO: each new one takes the slot just freed). */
static void
test_clock_hot_outlives_cold(void **state)
{
	static struct tmap m;
	struct kvt_evict_keys keys = { tmap_key, tmap_id, &m, 0 };
	struct kvt_evict ev;
	uint32_t id, v, s, next_cold = 1;

	(void)state;
	tmap_init(&m, 8);
	assert_int_equal(kvt_evict_init(&ev, &kvt_evict_clock_ops, 16, 8), 0);
	assert_int_equal(kvt_evict_use_slots(&ev, &keys), 0);
	for (id = 0; id < 200; id++) {
		if (!m.n_free) { /* full: evict, as the engine does */
			v = ev.ops->victim_first(&ev);
			assert_int_not_equal(v, 0); /* never the hot one */
			assert_int_equal(v, next_cold++); /* the oldest cold one */
			s = m.slot_of[v];
			kvt_evict_evicted(&ev, v);
			m.slot_of[v] = KVT_NIL;
			m.id_of[s] = KVT_NIL;
			m.free[m.n_free++] = s;
		}
		s = m.free[--m.n_free];
		m.slot_of[id] = s;
		m.id_of[s] = id;
		ev.ops->insert(&ev, id);
		if (id % 4 == 0)
			ev.ops->access(&ev, 0); /* the hot one, used every 4 new copies */
		assert_true(ev.ops->contains(&ev, 0));
	}
	assert_int_equal(ev.n, 8);
	assert_int_equal(next_cold, 200 - 7);
	ev.ops->fini(&ev);
}

/* ---- the literal model: a hand stepping key by key, decrementing what it passes */

struct ref {
	uint8_t in[NIDS];  /* key listed */
	uint8_t cnt[NIDS]; /* its counter 0..2 */
	uint32_t cap;      /* keys */
	uint32_t hand;     /* next key the hand reaches */
	uint64_t mark;     /* furthest position the walk offered (clock.c's rule), REF_NONE */
};

static uint64_t
ref_pos(const struct ref *r, uint32_t k)
{
	return (uint64_t)r->cnt[k] * r->cap + (k + r->cap - r->hand) % r->cap;
}

/* The listed keys in GCLOCK's order: by position. Returns how many. */
static uint32_t
ref_order(const struct ref *r, uint32_t *out)
{
	uint32_t n = 0, i, j, t;

	for (i = 0; i < r->cap; i++)
		if (r->in[i])
			out[n++] = i;
	for (i = 1; i < n; i++) /* insertion sort: positions are distinct */
		for (j = i; j > 0 && ref_pos(r, out[j - 1]) > ref_pos(r, out[j]); j--) {
			t = out[j];
			out[j] = out[j - 1];
			out[j - 1] = t;
		}
	return n;
}

static void
ref_use(struct ref *r, uint32_t k)
{
	if (!r->in[k])
		return;
	r->mark = REF_NONE;
	if (r->cnt[k] < 2)
		r->cnt[k]++;
}

static void
ref_insert(struct ref *r, uint32_t k)
{
	if (r->in[k]) {
		ref_use(r, k);
		return;
	}
	r->in[k] = 1;
	r->cnt[k] = 0;
	r->mark = REF_NONE;
}

/* Remove @k; an eviction (@evicted) the walk offered has GCLOCK's hand sweep to it first, one
 * key at a time. */
static void
ref_remove(struct ref *r, uint32_t k, bool evicted)
{
	uint64_t steps = 0;
	uint32_t h;

	if (!r->in[k])
		return;
	if (evicted && r->mark != REF_NONE && ref_pos(r, k) <= r->mark) {
		for (h = r->hand; !(h == k && r->cnt[k] == 0); h = (h + 1) % r->cap, steps++)
			if (r->in[h] && r->cnt[h]) /* a counter of 0 it cannot take: passed */
				r->cnt[h]--;
		steps++; /* past @k */
		r->hand = (k + 1) % r->cap;
		r->mark = r->mark >= steps ? r->mark - steps : REF_NONE;
	}
	r->in[k] = 0;
}

struct rig {
	struct kvt_evict ev; /* under test */
	struct ref r;        /* the model, over keys */
	struct tmap *m;      /* slot keys or NULL (id keys) */
	uint32_t listed[NIDS]; /* ids listed */
	uint32_t n;          /* entries of listed */
};

static uint32_t
rig_key(const struct rig *g, uint32_t id)
{
	return g->m ? g->m->slot_of[id] : id;
}

static uint32_t
rig_id(const struct rig *g, uint32_t k)
{
	return g->m ? g->m->id_of[k] : k;
}

/* The full walk is the model's order, every listed id once; ev->n and contains agree. The
 * walk's mark ends at the last position (clock.c's rule, mirrored). */
static void
rig_check(struct rig *g)
{
	uint32_t want[NIDS], got[NIDS + 1], n, m, i;

	n = ref_order(&g->r, want);
	m = walk(&g->ev, got, NIDS + 1);
	assert_int_equal(m, n);
	assert_int_equal(g->ev.n, n);
	assert_int_equal(g->n, n);
	for (i = 0; i < n; i++)
		assert_int_equal(got[i], rig_id(g, want[i]));
	g->r.mark = n ? ref_pos(&g->r, want[n - 1]) : REF_NONE;
	for (i = 0; i < NIDS; i++) {
		uint32_t k = rig_key(g, i);

		assert_int_equal(g->ev.ops->contains(&g->ev, i), k != KVT_NIL && g->r.in[k]);
	}
}

static void
rig_insert(struct rig *g, uint32_t id)
{
	uint32_t k = rig_key(g, id);

	if (k == KVT_NIL) { /* slot keys: a new copy takes the slot on top of the stack */
		if (!g->m->n_free)
			return;
		k = g->m->free[--g->m->n_free];
		g->m->slot_of[id] = k;
		g->m->id_of[k] = id;
	}
	if (!g->r.in[k])
		g->listed[g->n++] = id;
	g->ev.ops->insert(&g->ev, id);
	ref_insert(&g->r, k);
}

/* Remove listed id listed[@i], evicted or not (its slot given back after the policy saw the
 * removal). */
static void
rig_remove_at(struct rig *g, uint32_t i, bool evicted)
{
	uint32_t id = g->listed[i], k = rig_key(g, id);

	if (evicted)
		kvt_evict_evicted(&g->ev, id);
	else
		g->ev.ops->remove(&g->ev, id);
	ref_remove(&g->r, k, evicted);
	g->listed[i] = g->listed[--g->n];
	if (g->m) {
		g->m->slot_of[id] = KVT_NIL;
		g->m->id_of[k] = KVT_NIL;
		g->m->free[g->m->n_free++] = k;
	}
}

static void
rig_evict_id(struct rig *g, uint32_t id)
{
	uint32_t i;

	for (i = 0; i < g->n; i++)
		if (g->listed[i] == id) {
			rig_remove_at(g, i, true);
			return;
		}
	fail();
}

/* An eviction by a caller that skips @skip victims (pinned, busy) and may stop early: walk to
 * the victim, checking the walk against the model's order, and remove it. */
static void
rig_evict(struct rig *g, uint32_t skip)
{
	uint32_t want[NIDS], n = ref_order(&g->r, want), i, id;

	if (!n)
		return;
	if (skip >= n)
		skip = n - 1;
	id = g->ev.ops->victim_first(&g->ev);
	g->r.mark = ref_pos(&g->r, want[0]);
	for (i = 0; i < skip; i++) {
		assert_int_equal(id, rig_id(g, want[i]));
		id = g->ev.ops->victim_next(&g->ev, id);
		g->r.mark = ref_pos(&g->r, want[i + 1]);
	}
	assert_int_equal(id, rig_id(g, want[skip]));
	rig_evict_id(g, id);
}

/* Thousands of random steps (1-3 operations each), the full walk checked after every step. */
static void
random_rig(struct tmap *m)
{
	static struct rig g;
	struct kvt_evict_keys keys = { tmap_key, tmap_id, m, 0 };
	unsigned seed = 12345;
	uint32_t step, j, cap = m ? NSLOTS : 96;

	memset(&g, 0, sizeof g);
	g.m = m;
	g.r.cap = cap;
	g.r.mark = REF_NONE;
	assert_int_equal(kvt_evict_init(&g.ev, &kvt_evict_clock_ops, cap, NSLOTS), 0);
	if (m) {
		tmap_init(m, NSLOTS);
		assert_int_equal(kvt_evict_use_slots(&g.ev, &keys), 0);
		assert_int_equal(g.ev.ops->reserve(&g.ev, NIDS), 0); /* slot keys: no growth */
	}
	assert_int_equal(g.ev.cap, cap);
	for (step = 0; step < 6000; step++) {
		uint32_t ops = 1 + (uint32_t)rand_r(&seed) % 3;

		if (!m && step == 3000) { /* id keys: the key space grows (replayer: reserve) */
			assert_int_equal(g.ev.ops->reserve(&g.ev, NIDS), 0);
			g.r.cap = NIDS;
			g.r.mark = REF_NONE;
		}
		for (j = 0; j < ops; j++) {
			uint32_t op = (uint32_t)rand_r(&seed) % 10;
			uint32_t id = (uint32_t)rand_r(&seed) % (m ? NIDS : g.r.cap);

			if (op <= 2 || !g.n) {
				if (!m && g.n * 2 > g.r.cap && op <= 1) /* keep some keys free */
					continue;
				rig_insert(&g, id);
			} else if (op <= 4) {
				id = g.listed[(uint32_t)rand_r(&seed) % g.n];
				g.ev.ops->access(&g.ev, id);
				ref_use(&g.r, rig_key(&g, id));
			} else if (op == 5) { /* a copy freed or rewritten: no eviction */
				rig_remove_at(&g, (uint32_t)rand_r(&seed) % g.n, false);
			} else {
				/* evictions: mostly the first victim, some after skips */
				rig_evict(&g, rand_r(&seed) % 3 ? 0 : (uint32_t)rand_r(&seed) % 5);
			}
		}
		rig_check(&g);
	}
	g.ev.ops->fini(&g.ev);
}

static void
test_clock_random_ids(void **state)
{
	(void)state;
	random_rig(NULL);
}

static void
test_clock_random_slots(void **state)
{
	static struct tmap m;

	(void)state;
	random_rig(&m);
}

/* A quarter byte per key (plus the hand and counts): per slot with slot keys, whatever the
 * ids; per id otherwise, grown by reserve. */
static void
test_clock_meta_bytes(void **state)
{
	static struct tmap m;
	struct kvt_evict_keys keys = { tmap_key, tmap_id, &m, 0 };
	struct kvt_evict ev;
	uint64_t b;

	(void)state;
	tmap_init(&m, NSLOTS);
	assert_int_equal(kvt_evict_init(&ev, &kvt_evict_clock_ops, 16, 1000), 0);
	assert_int_equal(kvt_evict_use_slots(&ev, &keys), 0);
	assert_int_equal(ev.cap, 1000);
	b = kvt_evict_meta_bytes(&ev);
	assert_true(b >= 1000 / 4 && b <= 1000 / 4 + 8 + 64);
	assert_int_equal(ev.ops->reserve(&ev, 1u << 20), 0); /* ids do not grow it */
	assert_int_equal(kvt_evict_meta_bytes(&ev), b);
	ev.ops->fini(&ev);
	assert_int_equal(kvt_evict_init(&ev, &kvt_evict_clock_ops, 16, 8), 0);
	b = kvt_evict_meta_bytes(&ev);
	assert_true(b <= 16 / 4 + 8 + 64);
	assert_int_equal(ev.ops->reserve(&ev, 40000), 0);
	assert_int_equal(ev.cap, 40000);
	assert_true(kvt_evict_meta_bytes(&ev) >= 10000 && kvt_evict_meta_bytes(&ev) <= 10000 + 64);
	ev.ops->fini(&ev);
	assert_ptr_equal(kvt_evict_by_name("clock"), &kvt_evict_clock_ops);
}

/* The engine's NVMe tier runs clock under lru, arc and the default, prio under prio; HBM and
 * HOST run the chosen policy. */
static void
test_clock_engine_nvme_tier(void **state)
{
	static const uint32_t pol[] = { KVT_EVICT_DEFAULT, KVT_EVICT_LRU, KVT_EVICT_ARC,
					KVT_EVICT_PRIO };
	static const struct kvt_evict_ops *const up[] = { &kvt_evict_arc_ops, &kvt_evict_lru_ops,
							  &kvt_evict_arc_ops, &kvt_evict_prio_ops };
	struct kvt_engine *e;
	char *dir;
	size_t i;

	(void)state;
	for (i = 0; i < sizeof pol / sizeof pol[0]; i++) {
		struct tsup_cfg c = { .hbm_blocks = 4, .host_blocks = 4, .nvme_blocks = 64,
				      .policy = pol[i] };

		e = tsup_engine(&c, &dir);
		assert_ptr_equal(e->evict[KVT_TIER_HBM].ops, up[i]);
		assert_ptr_equal(e->evict[KVT_TIER_HOST].ops, up[i]);
		assert_ptr_equal(e->evict[KVT_TIER_NVME].ops, pol[i] == KVT_EVICT_PRIO ?
			&kvt_evict_prio_ops : &kvt_evict_clock_ops);
		if (pol[i] != KVT_EVICT_PRIO) /* keyed by slot: a quarter byte per NVMe slot */
			assert_true(kvt_evict_meta_bytes(&e->evict[KVT_TIER_NVME]) <= 64 / 4 + 64);
		kvt_engine_destroy(e);
		tsup_rmdir(dir);
	}
}

/* ---- the engine's calls: each tier's policy wrapped, counting evictions and removals */

static const struct kvt_evict_ops *wrap_orig[KVT_TIER_COUNT]; /* the tier's own ops */
static struct kvt_evict_ops wrap_ops[KVT_TIER_COUNT];        /* theirs, V5, counted */
static uint64_t wrap_evicts[KVT_TIER_COUNT], wrap_removes[KVT_TIER_COUNT];

static int
wrap_tier(const struct kvt_evict *ev)
{
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		if (ev->ops == &wrap_ops[t])
			return t;
	fail();
	return 0;
}

static void
wrap_remove(struct kvt_evict *ev, uint32_t id)
{
	int t = wrap_tier(ev);

	wrap_removes[t] += ev->ops->contains(ev, id);
	wrap_orig[t]->remove(ev, id);
}

static void
wrap_evict(struct kvt_evict *ev, uint32_t id)
{
	int t = wrap_tier(ev);

	wrap_evicts[t] += ev->ops->contains(ev, id);
	if (wrap_orig[t]->abi_version >= KVT_EVICT_OPS_V5 && wrap_orig[t]->evict)
		wrap_orig[t]->evict(ev, id);
	else
		wrap_orig[t]->remove(ev, id);
}

/* The engine tells each tier's policy every eviction it counts as one (ops->evict) and every
 * other removal (freed blocks) as a remove: sessions pushed down through small tiers and read
 * back, then closed. */
static void
test_clock_engine_says_evict(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 4, .host_blocks = 4, .nvme_blocks = 12 };
	struct kvt_engine *e;
	struct kvt_stats st;
	kvt_seq_id s[6];
	uint64_t removes = 0, evicts = 0;
	char *dir;
	int t;

	(void)state;
	e = tsup_engine(&c, &dir);
	for (t = 0; t < KVT_TIER_COUNT; t++) {
		wrap_orig[t] = e->evict[t].ops;
		wrap_ops[t] = *wrap_orig[t];
		wrap_ops[t].abi_version = KVT_EVICT_OPS_V5;
		wrap_ops[t].remove = wrap_remove;
		wrap_ops[t].evict = wrap_evict;
		e->evict[t].ops = &wrap_ops[t];
		wrap_evicts[t] = wrap_removes[t] = 0;
	}
	for (uint32_t i = 0; i < 6; i++)
		s[i] = tsup_seq_written(e, 10 + i, 2 * TSUP_TPB);
	for (uint32_t i = 0; i < 6; i++)
		assert_int_equal(tsup_verify(e, s[i], 10 + i), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	tsup_check_engine(e); /* full walks of every tier: no removal follows one as an eviction */
	st = tsup_stats(e);
	for (t = 0; t < KVT_TIER_COUNT; t++) {
		assert_int_equal(wrap_evicts[t], st.tier[t].evictions);
		evicts += wrap_evicts[t];
	}
	for (t = 0; t < KVT_TIER_COUNT; t++)
		assert_true(wrap_evicts[t] > 0); /* every tier made room */
	for (uint32_t i = 0; i < 6; i++)
		assert_int_equal(kvt_seq_close(e, s[i]), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	st = tsup_stats(e);
	for (t = 0; t < KVT_TIER_COUNT; t++) {
		assert_int_equal(wrap_evicts[t], st.tier[t].evictions); /* closing evicts nothing */
		assert_int_equal(e->evict[t].n, 0);
		removes += wrap_removes[t];
	}
	print_message("evictions %llu (nvme %llu), removals %llu\n", (unsigned long long)evicts,
		      (unsigned long long)wrap_evicts[KVT_TIER_NVME],
		      (unsigned long long)removes);
	assert_true(removes > 0);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_clock_scripted),
		cmocka_unit_test(test_clock_remove_after_walk),
		cmocka_unit_test(test_clock_hot_outlives_cold),
		cmocka_unit_test(test_clock_random_ids),
		cmocka_unit_test(test_clock_random_slots),
		cmocka_unit_test(test_clock_meta_bytes),
		cmocka_unit_test(test_clock_engine_nvme_tier),
		cmocka_unit_test(test_clock_engine_says_evict),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
