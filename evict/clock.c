/* SPDX-License-Identifier: MIT */
/*
 * evict/clock.c - generalized CLOCK (GCLOCK), the engine's policy for the NVMe tier.
 *
 * GCLOCK (A. J. Smith, "Sequentiality and prefetching in database systems", ACM TODS 3(3),
 * 1978; W. Effelsberg and T. Haerder, "Principles of database buffer management", ACM TODS
 * 9(4), 1984): every copy has a small use counter, incremented on each use up to a maximum
 * (CLK_MAX_COUNT = 2 here); to find a victim a hand sweeps the keys cyclically, decrementing
 * every non-zero counter it passes, and takes the first copy whose counter is 0.
 *
 * Why here: the NVMe tier is the last one (its eviction drops the copy), so ARC's ghosts are of
 * little use there (a block dropped from the last tier is usually freed, and forgotten), and its
 * 8.25 bytes per slot were most of the metadata of a block parked on NVMe. GCLOCK keeps 2 bits
 * per key (4 keys a byte, 32 a word: 0 = not listed, 1 + counter for a listed key) and the hand.
 *
 * Order without mutation. With the hand at h, a key k at cyclic distance d(k) = (k - h) mod cap
 * whose counter is c(k) is reached by the sweep with a counter of 0 on its (c(k) + 1)-th visit,
 * after c(k) * cap + d(k) keys have been passed: GCLOCK's next victim is the key with the least
 * position pos(k) = c(k) * cap + d(k), i.e. by (counter, distance from the hand). The victim
 * walk (victim_first / victim_next) gives the listed keys in increasing pos - every key exactly
 * once, counter class by counter class, each scanned from the hand - and changes nothing, so a
 * caller may skip ids and stop anywhere, and a full walk (engine/check.c) sees every listed id.
 *
 * Aging when a walked copy goes. GCLOCK's sweep to a victim v moves the hand to v + 1 and passes
 * every key at a distance below d(v) c(v) + 1 times and every other key c(v) times, decrementing
 * each time. For any key k after v in the walk (c(k) > c(v) when d(k) < d(v), c(k) >= c(v)
 * otherwise) no counter goes below 0, and pos(k) drops by exactly pos(v) + 1 either way:
 *   d(k) > d(v): (c(k) - c(v)) * cap + d(k) - d(v) - 1
 *   d(k) < d(v): (c(k) - c(v) - 1) * cap + d(k) + cap - d(v) - 1
 * So applying that sweep when v is evicted keeps the order of the keys after v: evicting the
 * first victim is exactly a GCLOCK step, and a walk in progress (engine/tenant.c evicts while it
 * walks) continues correctly. The keys before v in the walk are those the caller skipped
 * (pinned, busy, dirty ones while clean ones go first): the sweep passes them as GCLOCK passes a
 * frame it may not evict, their counters decremented to no less than 0; they come again later
 * in the order (a walk that evicts as it goes, as engine/tenant.c's, may meet them again before
 * it ends: its scan budget bounds it). The sweep is applied by evict() (ops V5: the engine says
 * which removals are evictions) when the key was offered by the current walk: its pos is at most
 * the furthest pos the walk has offered since victim_first (that mark moves down with each
 * sweep; an insert, a use or a growth of the key space clears it: the engine evicts right after
 * its walk, before any copy comes or is used; a demotion's source, evicted when the copy below
 * has landed, is mostly past it and then just cleared). remove() (a block freed or rewritten,
 * a copy lost) only clears the key, whatever the walk offered (kvt_engine_check's full walk
 * offers every key): a frame emptied outside the sweep does not move GCLOCK's hand.
 *
 * Cost: the walk scans the words from the hand, 32 keys at a time, skipping counter classes
 * that are empty (a count per class). A sweep with c(v) = 0 rewrites the words between the hand
 * and v, which the walk scanned to reach v. With c(v) >= 1 it rewrites the whole array, but only
 * when no key with counter 0 was taken: either the walk scanned the whole array for one (the
 * same cost) or there was none, and then every listed counter drops by at least 1, a pass paid
 * for by the increments that raised them (O(1) amortized per use when the tier is full).
 *
 * Insert: counter 0. A copy reaches NVMe when the tier above evicted it (it has been judged cold
 * twice) and most blocks of prefix-cache traces are used once; the slot allocator reuses the
 * slot just freed (LIFO), right behind the hand, so a new copy still waits a full round, and
 * copies nobody reads from NVMe leave in FIFO order. Both counter steps are left for reuse: a
 * copy read once survives one more round, read twice or more two. (Entering at 1 gave 9.12%
 * prefix hits instead of 9.54% on the Mooncake data-mode run of docs/PERF.md.) An insert of a
 * listed key (arc: a use) counts as a use. access: counter + 1, capped. forget, rank: none.
 *
 * Keys: slots with kvt_evict_use_slots (capacity keys, whatever the number of blocks: a quarter
 * byte per slot), else ids, grown by reserve() (tools/kvtier-replay). Not thread-safe: called
 * under the engine mutex.
 */
#include <errno.h>

#include "tiers/base/alloc.h"
#include "bits.h"
#include "evict.h"

#define CLK_MAX_COUNT 2u                 /* counters are 0..2 */
#define CLK_VALS (CLK_MAX_COUNT + 1)     /* counter classes */
#define CLK_LO 0x5555555555555555ull     /* the low bit of every 2-bit field */
#define CLK_NONE UINT64_MAX              /* no walk mark */

struct clock_state {
	uint64_t *w;          /* [kvt_bits2_words(cap)] 2 bits per key (evict/bits.h: key k in
	                         w[k / 32] bits 2 (k % 32)): 0 not listed, else 1 + its counter */
	uint64_t mark;        /* furthest pos offered by the walk since victim_first, or CLK_NONE */
	uint32_t hand;        /* key the sweep reaches next (< ev->cap) */
	uint32_t nc[CLK_VALS]; /* listed keys per counter */
};

enum clk_op { CLK_DEC, CLK_ZERO }; /* what a sweep does to the counters it passes */

static struct clock_state *
clk_st(const struct kvt_evict *ev)
{
	return ev->priv;
}

static unsigned
clk_get(const struct clock_state *st, uint32_t k)
{
	return kvt_bits2_get(st->w, k);
}

static void
clk_set(struct clock_state *st, uint32_t k, unsigned v)
{
	kvt_bits2_set(st->w, k, v);
}

/* Low bits of the fields of @x equal to @v (0..3). */
static uint64_t
clk_eq(uint64_t x, unsigned v)
{
	uint64_t y = x ^ (CLK_LO * v);

	return ~(y | y >> 1) & CLK_LO;
}

/* Low bits of the fields of word @i whose keys are in [@from, @to). */
static uint64_t
clk_span(uint32_t i, uint64_t from, uint64_t to)
{
	uint64_t lo = (uint64_t)i * 32, m = CLK_LO;

	if (from > lo)
		m &= CLK_LO << (2 * (from - lo));
	if (to < lo + 32)
		m &= CLK_LO >> (2 * (lo + 32 - to));
	return m;
}

static uint32_t
clk_dist(const struct kvt_evict *ev, uint32_t k)
{
	uint32_t h = clk_st(ev)->hand;

	return k >= h ? k - h : k + (ev->cap - h);
}

/* Sweep position of listed key @k: keys the sweep passes before it takes @k. */
static uint64_t
clk_pos(const struct kvt_evict *ev, uint32_t k)
{
	return (uint64_t)(clk_get(clk_st(ev), k) - 1) * ev->cap + clk_dist(ev, k);
}

/* First key in [@from, @to) whose field is @v, or KVT_NIL. */
static uint32_t
clk_find(const struct clock_state *st, unsigned v, uint64_t from, uint64_t to)
{
	uint32_t i;
	uint64_t m;

	for (i = (uint32_t)(from / 32); (uint64_t)i * 32 < to; i++) {
		m = clk_eq(st->w[i], v) & clk_span(i, from, to);
		if (m)
			return i * 32 + (uint32_t)__builtin_ctzll(m) / 2;
	}
	return KVT_NIL;
}

/* First key whose field is @v among the @len keys from @start on, cyclically, or KVT_NIL. */
static uint32_t
clk_find_cyc(const struct kvt_evict *ev, unsigned v, uint32_t start, uint32_t len)
{
	uint64_t end = (uint64_t)start + len;
	uint32_t k;

	if (end <= ev->cap)
		return clk_find(clk_st(ev), v, start, end);
	k = clk_find(clk_st(ev), v, start, ev->cap);
	return k != KVT_NIL ? k : clk_find(clk_st(ev), v, 0, end - ev->cap);
}

/* Apply @op to the listed keys in [@from, @to), keeping the per-class counts. */
static void
clk_apply(struct clock_state *st, enum clk_op op, uint64_t from, uint64_t to)
{
	uint64_t x, h, l, nx, span;
	uint32_t i;
	unsigned v;

	for (i = (uint32_t)(from / 32); (uint64_t)i * 32 < to; i++) {
		x = st->w[i];
		span = clk_span(i, from, to);
		h = x >> 1 & CLK_LO;
		l = x & CLK_LO;
		/* decrement: 3 -> 2, 2 -> 1 (1 and 0 stay); zero: every listed field -> 1 */
		nx = op == CLK_DEC ? (h & l) << 1 | (l ^ h) : (h | l);
		nx = (x & ~(span | span << 1)) | (nx & (span | span << 1));
		for (v = 1; v <= CLK_VALS; v++)
			st->nc[v - 1] += (uint32_t)__builtin_popcountll(clk_eq(nx, v) & span) -
					 (uint32_t)__builtin_popcountll(clk_eq(x, v) & span);
		st->w[i] = nx;
	}
}

/* Apply @op to the @len keys from @start on, cyclically. */
static void
clk_apply_cyc(struct kvt_evict *ev, enum clk_op op, uint32_t start, uint32_t len)
{
	uint64_t end = (uint64_t)start + len;

	if (end <= ev->cap) {
		clk_apply(clk_st(ev), op, start, end);
		return;
	}
	clk_apply(clk_st(ev), op, start, ev->cap);
	clk_apply(clk_st(ev), op, 0, end - ev->cap);
}

/*
 * GCLOCK's sweep that takes listed key @k: the keys before it (distance below d(k)) are passed
 * c(k) + 1 times, the others c(k) times, each pass decrementing (not below 0); the hand moves
 * past @k and the walk's mark down by pos(k) + 1 (see the header). @k itself is left as it is.
 */
static void
clk_sweep_to(struct kvt_evict *ev, uint32_t k)
{
	struct clock_state *st = clk_st(ev);
	unsigned c = clk_get(st, k) - 1;
	uint32_t d = clk_dist(ev, k), next = k + 1 == ev->cap ? 0 : k + 1;
	uint64_t shift = clk_pos(ev, k) + 1;

	clk_apply_cyc(ev, c == 0 ? CLK_DEC : CLK_ZERO, st->hand, d);
	if (c > 0)
		clk_apply_cyc(ev, c == 1 ? CLK_DEC : CLK_ZERO, next, ev->cap - 1 - d);
	st->mark = st->mark != CLK_NONE && st->mark >= shift ? st->mark - shift : CLK_NONE;
	st->hand = next;
}

static bool
clock_contains(const struct kvt_evict *ev, uint32_t id)
{
	uint32_t k = kvt_evict_key(ev, id);

	return k < ev->cap && clk_get(clk_st(ev), k) != 0;
}

static int
clock_reserve(struct kvt_evict *ev, uint32_t n_ids)
{
	struct clock_state *st = ev->priv;

	if (!st) {
		st = kvt_calloc(1, sizeof *st);
		if (!st)
			return -ENOMEM;
		st->mark = CLK_NONE;
		ev->priv = st;
	}
	if (ev->keys)
		n_ids = ev->capacity; /* keys are slots: as many as the tier has */
	if (n_ids <= ev->cap)
		return 0;
	if (kvt_bits2_grow(&st->w, ev->cap, n_ids, 0))
		return -ENOMEM;
	ev->cap = n_ids; /* the new keys sit between the old last key and key 0 */
	st->mark = CLK_NONE; /* distances changed */
	return 0;
}

static void
clock_fini(struct kvt_evict *ev)
{
	struct clock_state *st = ev->priv;

	if (st) {
		kvt_free(st->w);
		kvt_free(st);
	}
	ev->priv = NULL;
	ev->cap = ev->n = 0;
}

static uint64_t
clock_meta_bytes(const struct kvt_evict *ev)
{
	const struct clock_state *st = clk_st(ev);

	return st ? sizeof *st + (uint64_t)kvt_bits2_words(ev->cap) * sizeof *st->w : 0;
}

static void
clock_access(struct kvt_evict *ev, uint32_t id)
{
	struct clock_state *st = clk_st(ev);
	uint32_t k = kvt_evict_key(ev, id);
	unsigned v;

	if (k >= ev->cap || !(v = clk_get(st, k)))
		return;
	st->mark = CLK_NONE; /* a use: the walk before it is over */
	if (v == CLK_VALS)
		return;
	clk_set(st, k, v + 1);
	st->nc[v - 1]--;
	st->nc[v]++;
}

static void
clock_insert(struct kvt_evict *ev, uint32_t id)
{
	struct clock_state *st = clk_st(ev);
	uint32_t k = kvt_evict_key(ev, id);

	if (k >= ev->cap)
		return;
	if (clk_get(st, k)) { /* listed: a use */
		clock_access(ev, id);
		return;
	}
	clk_set(st, k, 1);
	st->nc[0]++;
	ev->n++;
	st->mark = CLK_NONE; /* the new key may sit inside the walked part */
}

/* Unlist @id; an eviction (@evicted) of a key the current walk offered sweeps the hand to it
 * first (see the header). */
static void
clk_unlist(struct kvt_evict *ev, uint32_t id, bool evicted)
{
	struct clock_state *st = clk_st(ev);
	uint32_t k = kvt_evict_key(ev, id);
	unsigned v;

	if (k >= ev->cap || !(v = clk_get(st, k)))
		return;
	if (evicted && st->mark != CLK_NONE && clk_pos(ev, k) <= st->mark)
		clk_sweep_to(ev, k); /* GCLOCK's step that takes it (@k left as it is) */
	clk_set(st, k, 0);
	st->nc[v - 1]--;
	ev->n--;
}

static void
clock_remove(struct kvt_evict *ev, uint32_t id)
{
	clk_unlist(ev, id, false);
}

static void
clock_evict(struct kvt_evict *ev, uint32_t id)
{
	clk_unlist(ev, id, true);
}

static uint32_t
clock_victim_first(struct kvt_evict *ev)
{
	struct clock_state *st = clk_st(ev);
	uint32_t k = KVT_NIL;
	unsigned v;

	for (v = 1; v <= CLK_VALS && k == KVT_NIL; v++)
		if (st->nc[v - 1])
			k = clk_find_cyc(ev, v, st->hand, ev->cap);
	st->mark = k == KVT_NIL ? CLK_NONE : clk_pos(ev, k);
	return kvt_evict_id(ev, k);
}

static uint32_t
clock_victim_next(struct kvt_evict *ev, uint32_t id)
{
	struct clock_state *st = clk_st(ev);
	uint32_t k = kvt_evict_key(ev, id), n = KVT_NIL, d;
	unsigned v;

	if (k >= ev->cap || !(v = clk_get(st, k)))
		return KVT_NIL;
	/* the rest of @k's class: after it, up to the hand */
	d = clk_dist(ev, k);
	if (d + 1 < ev->cap)
		n = clk_find_cyc(ev, v, k + 1 == ev->cap ? 0 : k + 1, ev->cap - 1 - d);
	/* then the next class that has keys, from the hand */
	for (v++; v <= CLK_VALS && n == KVT_NIL; v++)
		if (st->nc[v - 1])
			n = clk_find_cyc(ev, v, st->hand, ev->cap);
	if (n != KVT_NIL && st->mark != CLK_NONE && clk_pos(ev, n) > st->mark)
		st->mark = clk_pos(ev, n);
	return kvt_evict_id(ev, n);
}

const struct kvt_evict_ops kvt_evict_clock_ops = {
	.abi_version = KVT_EVICT_OPS_V5,
	.name = "clock",
	.reserve = clock_reserve,
	.fini = clock_fini,
	.insert = clock_insert,
	.access = clock_access,
	.remove = clock_remove,
	.contains = clock_contains,
	.victim_first = clock_victim_first,
	.victim_next = clock_victim_next,
	.set_prio = NULL,
	.forget = NULL, /* no history: a freed block's copy was removed already */
	.rank = NULL,
	.meta_bytes = clock_meta_bytes,
	.evict = clock_evict,
};
