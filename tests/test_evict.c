/* SPDX-License-Identifier: MIT */
/*
 * tests/test_evict.c - eviction policies (evict/): priority and retention semantics with an
 * injected clock, ARC's split between blocks used once and used again, the victim walk of every
 * policy against a reference model under random operations, and engine-level checks: priorities
 * decide what leaves HBM, random moves across all tiers keep every slot and list consistent,
 * idle sequences are parked by kvt_engine_poll, metadata bytes are reported.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine_impl.h"
#include "evict/evict.h"
#include "support/kvt_test.h"
#include "tiers/tier_nvme.h"

static uint64_t fake_now;

static uint64_t
fake_clock(void)
{
	return fake_now;
}

/* Walk the victims from the cold end into @out (at most @max); returns how many. */
static uint32_t
walk(struct kvt_evict *ev, uint32_t *out, uint32_t max)
{
	uint32_t n = 0, id;

	for (id = ev->ops->victim_first(ev); id != KVT_NIL && n < max;
	     id = ev->ops->victim_next(ev, id))
		out[n++] = id;
	return n;
}

static void
test_prio_high_outlives_low(void **state)
{
	struct kvt_evict ev;
	uint32_t order[16], i, n;

	(void)state;
	assert_int_equal(kvt_evict_init(&ev, &kvt_evict_prio_ops, 16, 16), 0);
	ev.now_ns = fake_clock;
	fake_now = 1000;
	for (i = 0; i < 10; i++) {
		if (i < 5)
			ev.ops->set_prio(&ev, i, 90, 0); /* before insert: remembered */
		ev.ops->insert(&ev, i);
	}
	ev.ops->set_prio(&ev, 9, 10, 0);
	n = walk(&ev, order, 16);
	assert_int_equal(n, 10);
	assert_int_equal(order[0], 9); /* priority 10 first */
	for (i = 1; i < 5; i++)
		assert_int_equal(order[i], 4 + i); /* then the default class, LRU: 5, 6, 7, 8 */
	for (i = 5; i < 10; i++)
		assert_true(order[i] < 5); /* the priority-90 blocks last */
	/* a use inside a class does not lift it over a higher class */
	ev.ops->access(&ev, 5);
	n = walk(&ev, order, 16);
	assert_int_equal(order[4], 5);
	assert_true(order[5] < 5);
	ev.ops->fini(&ev);
}

static void
test_prio_retention_falls_back(void **state)
{
	struct kvt_evict ev;
	uint32_t order[8], n;

	(void)state;
	assert_int_equal(kvt_evict_init(&ev, &kvt_evict_prio_ops, 8, 8), 0);
	ev.now_ns = fake_clock;
	fake_now = 100;
	ev.ops->insert(&ev, 0);
	ev.ops->insert(&ev, 1);
	ev.ops->set_prio(&ev, 2, 100, 500); /* top priority until t = 500 */
	ev.ops->insert(&ev, 2);
	ev.ops->access(&ev, 0);
	fake_now = 499;
	n = walk(&ev, order, 8);
	assert_int_equal(n, 3);
	assert_int_equal(order[2], 2); /* still protected by its priority */
	fake_now = 500;
	n = walk(&ev, order, 8);
	assert_int_equal(n, 3);
	assert_int_equal(order[0], 2); /* expired: the coldest of the default class */
	assert_int_equal(order[1], 1);
	assert_int_equal(order[2], 0);
	/* it stays default afterwards (no resurrection on insert) */
	ev.ops->remove(&ev, 2);
	ev.ops->insert(&ev, 2);
	n = walk(&ev, order, 8);
	assert_int_equal(order[2], 2); /* hottest by recency only */
	ev.ops->fini(&ev);
}

static void
test_prio_survives_moves(void **state)
{
	struct kvt_evict ev;
	uint32_t order[8];

	(void)state;
	assert_int_equal(kvt_evict_init(&ev, &kvt_evict_prio_ops, 8, 8), 0);
	ev.ops->set_prio(&ev, 3, 80, 0);
	ev.ops->insert(&ev, 3);
	ev.ops->remove(&ev, 3); /* demoted to another tier and back: keeps its priority */
	ev.ops->insert(&ev, 4);
	ev.ops->insert(&ev, 3);
	ev.ops->insert(&ev, 5);
	assert_int_equal(walk(&ev, order, 8), 3);
	assert_int_equal(order[2], 3);
	ev.ops->forget(&ev, 3); /* freed: the id's next life starts at the default */
	ev.ops->insert(&ev, 3);
	assert_int_equal(walk(&ev, order, 8), 3);
	assert_int_equal(order[0], 4);
	assert_int_equal(order[2], 3);
	ev.ops->fini(&ev);
}

static void
test_arc_keeps_reused(void **state)
{
	struct kvt_evict ev;
	uint32_t order[16], n, i;

	(void)state;
	assert_int_equal(kvt_evict_init(&ev, &kvt_evict_arc_ops, 16, 4), 0);
	for (i = 6; i < 14; i++) { /* history: ghosts of 2x the capacity, ARC order from now */
		ev.ops->insert(&ev, i);
		ev.ops->remove(&ev, i);
	}
	ev.ops->insert(&ev, 0);
	ev.ops->insert(&ev, 1);
	ev.ops->access(&ev, 0); /* used again: T2 */
	ev.ops->access(&ev, 1);
	for (i = 2; i < 6; i++)
		ev.ops->insert(&ev, i); /* used once: T1 */
	n = walk(&ev, order, 16);
	assert_int_equal(n, 6);
	assert_int_equal(order[0], 2); /* blocks used once go first, oldest first */
	assert_int_equal(order[4], 0);
	assert_int_equal(order[5], 1);
	/* evicted from T1 and asked for again: a ghost hit goes straight to T2 */
	ev.ops->remove(&ev, 2);
	assert_false(ev.ops->contains(&ev, 2));
	assert_int_equal(ev.n, 5);
	ev.ops->insert(&ev, 2);
	n = walk(&ev, order, 16);
	assert_int_equal(order[n - 1], 2);
	/* a forgotten id is no ghost: it comes back as used once */
	ev.ops->remove(&ev, 3);
	ev.ops->forget(&ev, 3);
	ev.ops->insert(&ev, 3);
	n = walk(&ev, order, 16);
	assert_int_not_equal(order[n - 1], 3);
	ev.ops->fini(&ev);
}

/* Until the ghosts first hold twice the tier's capacity, ARC evicts in LRU order (one list in
 * recency order); from then on, by its T1/T2 split. */
static void
test_arc_lru_until_evidence(void **state)
{
	struct kvt_evict cold, warm;
	uint32_t i;

	(void)state;
	assert_int_equal(kvt_evict_init(&cold, &kvt_evict_arc_ops, 64, 10), 0);
	assert_int_equal(kvt_evict_init(&warm, &kvt_evict_arc_ops, 64, 10), 0);
	for (i = 10; i < 30; i++) { /* 20 ghosts: 2 x capacity */
		warm.ops->insert(&warm, i);
		warm.ops->remove(&warm, i);
	}
	for (i = 0; i < 2; i++) {
		struct kvt_evict *ev = i ? &warm : &cold;

		ev->ops->insert(ev, 0);
		ev->ops->insert(ev, 1);
		ev->ops->access(ev, 0); /* T2 = [0], T1 = [1] */
		ev->ops->insert(ev, 2); /* T1 = [2 1]: 2 <= T1's target (a fifth of 10) */
	}
	assert_int_equal(cold.ops->victim_first(&cold), 1); /* least recently used */
	assert_int_equal(warm.ops->victim_first(&warm), 0); /* T1 within its target: T2 */
	cold.ops->access(&cold, 1); /* T2 = [1 0], T1 = [2]: 0 is now the least recently used */
	assert_int_equal(cold.ops->victim_first(&cold), 0);
	/* a ghost hit leaves one ghost fewer than 2 x capacity: the evidence stays (ARC order for
	 * good; 10 goes to T2 and p grows to 3, so T1 = [2 1] is within it: T2's tail) */
	warm.ops->insert(&warm, 10);
	assert_int_equal(warm.ops->victim_first(&warm), 0);
	/* the LRU walk before evidence visits every resident once, least recent first */
	assert_int_equal(cold.ops->victim_next(&cold, 0), 2);
	assert_int_equal(cold.ops->victim_next(&cold, 2), 1);
	assert_int_equal(cold.ops->victim_next(&cold, 1), KVT_NIL);
	cold.ops->fini(&cold);
	warm.ops->fini(&warm);
}

/* Random insert/access/remove/set_prio/forget against a reference set: the victim walk visits
 * every listed id exactly once and nothing else, and n counts them. */
static void
random_policy(const struct kvt_evict_ops *ops)
{
	enum { N = 200 };
	struct kvt_evict ev;
	uint8_t in[N] = { 0 }, seen[N];
	uint32_t order[N + 8], i, n, listed = 0;
	unsigned seed = 7;

	assert_int_equal(kvt_evict_init(&ev, ops, 16, 32), 0);
	ev.now_ns = fake_clock;
	fake_now = 0;
	assert_int_equal(ops->reserve(&ev, N), 0);
	for (int step = 0; step < 20000; step++) {
		uint32_t id = (uint32_t)rand_r(&seed) % N, op = (uint32_t)rand_r(&seed) % 6;

		fake_now += (uint64_t)(rand_r(&seed) % 10);
		if (op <= 1) {
			listed += !in[id];
			ops->insert(&ev, id);
			in[id] = 1;
		} else if (op == 2 && in[id]) { /* the engine uses only copies it has */
			ops->access(&ev, id);
		} else if (op == 3) {
			listed -= in[id];
			ops->remove(&ev, id);
			in[id] = 0;
		} else if (op == 4 && ops->set_prio) {
			ops->set_prio(&ev, id, (uint8_t)(rand_r(&seed) % 101),
				      rand_r(&seed) % 2 ? fake_now + 50 : 0);
		} else if (op == 5 && ops->forget) {
			listed -= in[id];
			ops->forget(&ev, id);
			in[id] = 0;
		}
		if (step % 97)
			continue;
		n = walk(&ev, order, N + 8);
		assert_int_equal(n, listed);
		assert_int_equal(ev.n, listed);
		memset(seen, 0, sizeof seen);
		for (i = 0; i < n; i++) {
			assert_true(in[order[i]]);
			assert_false(seen[order[i]]);
			seen[order[i]] = 1;
		}
		for (i = 0; i < N; i++)
			assert_int_equal(ops->contains(&ev, i), in[i]);
	}
	ops->fini(&ev);
}

static void
test_random_lru(void **state)
{
	(void)state;
	random_policy(&kvt_evict_lru_ops);
}

static void
test_random_prio(void **state)
{
	(void)state;
	random_policy(&kvt_evict_prio_ops);
}

static void
test_random_arc(void **state)
{
	(void)state;
	random_policy(&kvt_evict_arc_ops);
}

/* Engine: with the prio policy, a full HBM gives up the low-priority sequence's blocks. */
static void
test_engine_priority_decides(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 4, .host_blocks = 16, .no_watermarks = true,
			      .policy = KVT_EVICT_PRIO };
	struct kvt_seq_opts so;
	struct kvt_seq_info ia, ib;
	struct kvt_engine *e;
	kvt_seq_id a, b, x;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	kvt_seq_opts_init(&so, sizeof so);
	so.priority = 90;
	assert_int_equal(kvt_seq_open(e, &so, &a), 0);
	so.priority = 10;
	assert_int_equal(kvt_seq_open(e, &so, &b), 0);
	assert_int_equal(tsup_append_write(e, a, 1, 0, 2 * TSUP_TPB), 0);
	assert_int_equal(tsup_verify(e, a, 1), 0);
	assert_int_equal(tsup_append_write(e, b, 2, 0, 2 * TSUP_TPB), 0);
	assert_int_equal(tsup_verify(e, b, 2), 0);
	/* a is older than b: LRU would evict a; priority keeps it */
	assert_int_equal(kvt_seq_open(e, NULL, &x), 0);
	assert_int_equal(tsup_append_write(e, x, 3, 0, 2 * TSUP_TPB), 0);
	assert_int_equal(tsup_verify(e, x, 3), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_info(e, a, &ia), 0);
	assert_int_equal(kvt_seq_info(e, b, &ib), 0);
	assert_int_equal(ia.blocks_in[KVT_TIER_HBM], 2);
	assert_int_equal(ib.blocks_in[KVT_TIER_HBM], 0);
	assert_int_equal(ib.blocks_in[KVT_TIER_HOST], 2);
	/* a token range loses its priority: now a's blocks are the cheapest */
	assert_int_equal(kvt_seq_set_priority(e, a, 0, 0, 0, 0), 0);
	assert_int_equal(kvt_seq_set_priority(e, a, 0, 99, 5, 0), -EINVAL);
	assert_int_equal(kvt_seq_set_priority(e, a, 0, 0, 101, 0), -EINVAL);
	/* from its end to its end: an empty range, a no-op; one token past it: an error */
	assert_int_equal(kvt_seq_set_priority(e, a, 2 * TSUP_TPB, 0, 90, 0), 0);
	assert_int_equal(kvt_seq_set_priority(e, a, 2 * TSUP_TPB + 1, 0, 90, 0), -EINVAL);
	assert_int_equal(tsup_verify(e, b, 2), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_info(e, a, &ia), 0);
	assert_int_equal(ia.blocks_in[KVT_TIER_HBM], 0);
	assert_int_equal(tsup_verify(e, a, 1), 0); /* and nothing was lost */
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* Engine, prio policy: a clean copy of a priority-100 block (valid in HOST too) stays in HBM
 * while dirty priority-0 blocks are there to demote: clean-first holds only within a class. */
static void
test_engine_priority_beats_clean_first(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 4, .host_blocks = 16, .no_watermarks = true,
			      .policy = KVT_EVICT_PRIO };
	struct kvt_seq_opts so;
	struct kvt_seq_info info;
	struct kvt_engine *e;
	kvt_seq_id h, l[4];
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	kvt_seq_opts_init(&so, sizeof so);
	so.priority = 100;
	assert_int_equal(kvt_seq_open(e, &so, &h), 0);
	assert_int_equal(tsup_append_write(e, h, 1, 0, TSUP_TPB), 0);
	assert_int_equal(tsup_verify(e, h, 1), 0);
	assert_int_equal(kvt_seq_park(e, h, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_verify(e, h, 1), 0); /* back in HBM, its HOST copy kept: clean */
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_info(e, h, &info), 0);
	assert_int_equal(info.blocks_in[KVT_TIER_HBM], 1);
	assert_int_equal(info.blocks_in[KVT_TIER_HOST], 1);
	so.priority = 0;
	for (int i = 0; i < 4; i++) { /* the fourth needs a slot: a dirty priority-0 one goes */
		assert_int_equal(kvt_seq_open(e, &so, &l[i]), 0);
		assert_int_equal(tsup_append_write(e, l[i], 2 + (uint32_t)i, 0, TSUP_TPB), 0);
		assert_int_equal(tsup_verify(e, l[i], 2 + (uint32_t)i), 0);
	}
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_info(e, h, &info), 0);
	assert_int_equal(info.blocks_in[KVT_TIER_HBM], 1);
	assert_int_equal(kvt_seq_info(e, l[0], &info), 0);
	assert_int_equal(info.blocks_in[KVT_TIER_HBM], 0);
	assert_int_equal(info.blocks_in[KVT_TIER_HOST], 1);
	for (int i = 0; i < 4; i++)
		assert_int_equal(tsup_verify(e, l[i], 2 + (uint32_t)i), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* Random appends, parks, resumes, batches and closes over HBM, HOST and NVMe with every policy:
 * after every step each tier's slots add up (free + used = capacity), every copy is on exactly
 * its tier's list and every slot has one owner (kvt_engine_check), and all data reads back. */
static void
random_moves(uint32_t policy)
{
	enum { NS = 6 };
	struct tsup_cfg c = { .hbm_blocks = 6, .host_blocks = 10, .nvme_blocks = 24,
			      .policy = policy };
	kvt_seq_id s[NS] = { 0 };
	uint64_t len[NS] = { 0 };
	unsigned seed = 11 + policy;
	struct kvt_engine *e;
	char *dir;
	int step, rc;

	e = tsup_engine(&c, &dir);
	for (step = 0; step < 400; step++) {
		uint32_t i = (uint32_t)rand_r(&seed) % NS, op = (uint32_t)rand_r(&seed) % 6;

		if (!s[i]) {
			assert_int_equal(kvt_seq_open(e, NULL, &s[i]), 0);
			len[i] = 0;
		}
		if (op <= 1 && len[i] < 5 * TSUP_TPB) {
			size_t n = 1 + (size_t)rand_r(&seed) % TSUP_TPB;

			rc = tsup_append_write(e, s[i], i + 1, len[i], n);
			assert_true(rc == 0 || rc == -ENOSPC);
			if (rc == 0) {
				len[i] += n;
				assert_int_equal(tsup_verify(e, s[i], i + 1), 0);
			}
		} else if (op == 2) {
			rc = kvt_seq_park(e, s[i], rand_r(&seed) % 2 ? KVT_TIER_HOST : KVT_TIER_NVME);
			assert_true(rc == 0 || rc == -ENOSPC);
		} else if (op == 3) {
			assert_int_equal(kvt_seq_resume(e, s[i]), 0);
		} else if (op == 4 && len[i]) {
			rc = tsup_verify(e, s[i], i + 1);
			assert_true(rc == 0 || rc == -ENOSPC);
		} else if (op == 5) {
			assert_int_equal(kvt_seq_close(e, s[i]), 0);
			s[i] = 0;
		}
		if (step % 3 == 0)
			assert_true(kvt_engine_poll(e, 0) >= 0);
		tsup_check_engine(e);
	}
	assert_int_equal(kvt_engine_drain(e), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

static void
test_random_moves_lru(void **state)
{
	(void)state;
	random_moves(KVT_EVICT_LRU);
}

static void
test_random_moves_prio(void **state)
{
	(void)state;
	random_moves(KVT_EVICT_PRIO);
}

static void
test_random_moves_arc(void **state)
{
	(void)state;
	random_moves(KVT_EVICT_ARC);
}

/* An idle sequence is parked by kvt_engine_poll once idle_timeout_ms has passed. */
static void
test_idle_parking(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_engine *e;
	struct kvt_seq_info info;
	struct kvt_stats st = { .size = sizeof st };
	kvt_seq_id s;
	int64_t map[TSUP_TPB * 2];
	int i;

	(void)state;
	kvt_engine_opts_init(&o, sizeof o);
	o.layout = (struct kvt_layout){ TSUP_LAYERS, TSUP_HEADS, TSUP_DIM, KVT_DTYPE_F32,
					 TSUP_TPB };
	o.hbm_bytes = 8 * tsup_block_bytes();
	o.host_bytes = 8 * tsup_block_bytes();
	o.idle_timeout_ms = 1;
	o.idle_target = 7;
	assert_int_equal(kvt_engine_create(&o, &e), -EINVAL); /* bad target refused */
	o.idle_target = KVT_TIER_HOST;
	assert_int_equal(kvt_engine_create(&o, &e), 0);
	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	assert_int_equal(kvt_seq_append(e, s, NULL, TSUP_TPB * 2, map), 0);
	for (i = 0; i < 2000; i++) { /* up to 2 s: the test waits, it does not time anything */
		struct timespec ts = { 0, 1000000 };

		assert_true(kvt_engine_poll(e, 0) >= 0);
		assert_int_equal(kvt_seq_info(e, s, &info), 0);
		if (info.parked)
			break;
		nanosleep(&ts, NULL);
	}
	assert_int_equal(info.parked, 1);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_info(e, s, &info), 0);
	assert_int_equal(info.blocks_in[KVT_TIER_HBM], 0);
	assert_int_equal(info.blocks_in[KVT_TIER_HOST], 2);
	assert_int_equal(kvt_engine_stats(e, &st), 0);
	assert_true(st.idle_parked >= 1);
	kvt_engine_destroy(e);
}

/* Per-tenant budgets: a tenant above its HBM budget is demoted after its releases (and by
 * poll when the budget comes later); other tenants keep theirs; nothing is lost. */
static void
test_tenant_budget(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 16, .host_blocks = 32, .no_watermarks = true };
	struct kvt_seq_opts so;
	struct kvt_seq_info info;
	struct kvt_engine *e;
	uint64_t used[KVT_TIER_COUNT];
	kvt_seq_id a, b, d;
	char *dir;
	int i;

	(void)state;
	e = tsup_engine(&c, &dir);
	assert_int_equal(kvt_tenant_set_budget(e, 1, KVT_TIER_HBM, 4), 0);
	assert_int_equal(kvt_tenant_set_budget(e, 1, (enum kvt_tier)7, 4), -EINVAL);
	assert_int_equal(kvt_tenant_usage(e, 9, used), -ENOENT);
	kvt_seq_opts_init(&so, sizeof so);
	so.tenant = 1;
	assert_int_equal(kvt_seq_open(e, &so, &a), 0);
	so.tenant = 2;
	assert_int_equal(kvt_seq_open(e, &so, &b), 0);
	so.tenant = 3;
	assert_int_equal(kvt_seq_open(e, &so, &d), 0);
	for (i = 0; i < 4; i++) { /* 8 blocks each, two at a time */
		assert_int_equal(tsup_append_write(e, a, 1, (uint64_t)i * 2 * TSUP_TPB,
						   2 * TSUP_TPB), 0);
		assert_int_equal(tsup_verify(e, a, 1), 0);
		assert_int_equal(tsup_append_write(e, b, 2, (uint64_t)i * 2 * TSUP_TPB,
						   2 * TSUP_TPB), 0);
		assert_int_equal(tsup_verify(e, b, 2), 0);
	}
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_tenant_usage(e, 1, used), 0);
	assert_true(used[KVT_TIER_HBM] <= 4);
	assert_int_equal(kvt_seq_info(e, a, &info), 0);
	assert_true(info.blocks_in[KVT_TIER_HBM] <= 4);
	assert_int_equal(info.blocks_in[KVT_TIER_HOST] + info.blocks_in[KVT_TIER_HBM] >= 8, 1);
	assert_int_equal(kvt_seq_info(e, b, &info), 0);
	assert_int_equal(info.blocks_in[KVT_TIER_HBM], 8); /* no budget: untouched */
	tsup_check_engine(e);
	/* a budget given later is applied by poll */
	assert_int_equal(tsup_append_write(e, d, 3, 0, 4 * TSUP_TPB), 0);
	assert_int_equal(tsup_verify(e, d, 3), 0);
	assert_int_equal(kvt_tenant_set_budget(e, 3, KVT_TIER_HBM, 1), 0);
	assert_true(kvt_engine_poll(e, 0) >= 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_info(e, d, &info), 0);
	assert_true(info.blocks_in[KVT_TIER_HBM] <= 1);
	tsup_check_engine(e);
	assert_int_equal(tsup_verify(e, a, 1), 0);
	assert_int_equal(tsup_verify(e, d, 3), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* meta_bytes is reported; print the per-block figure of a 10,000-block engine. */
static void
test_meta_bytes(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 64, .host_blocks = 64 };
	struct kvt_stats st = { .size = sizeof st };
	struct kvt_engine *e;
	kvt_seq_id s;
	char *dir;
	int i;

	(void)state;
	e = tsup_engine(&c, &dir);
	for (i = 0; i < 16; i++) {
		assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
		assert_int_equal(tsup_append_write(e, s, 1, 0, 2 * TSUP_TPB), 0);
		assert_int_equal(kvt_seq_park(e, s, KVT_TIER_HOST), 0);
		assert_int_equal(kvt_engine_drain(e), 0);
	}
	assert_int_equal(kvt_engine_stats(e, &st), 0);
	assert_true(st.meta_bytes > sizeof(struct kvt_block) * st.meta_block_records);
	print_message("meta: %llu bytes, %llu block records, sizeof(struct kvt_block) %zu\n",
		      (unsigned long long)st.meta_bytes,
		      (unsigned long long)st.meta_block_records, sizeof(struct kvt_block));
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* Open @ns sessions of two full @tpb-token blocks each (distinct prompts: nothing shared;
 * tokens given, so every block is hashed and indexed), run each once and park it to @tier. */
static void
meta_park_sessions(struct kvt_engine *e, int ns, int tpb, int tier)
{
	int32_t *tok = malloc(2 * (size_t)tpb * sizeof *tok);
	int64_t *map = malloc(2 * (size_t)tpb * sizeof *map);
	kvt_seq_id s;

	assert_non_null(tok);
	assert_non_null(map);
	for (int i = 0; i < ns; i++) {
		struct kvt_batch *b;

		for (int j = 0; j < 2 * tpb; j++)
			tok[j] = i * 64 + j;
		assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
		assert_int_equal(kvt_seq_append(e, s, tok, 2 * (size_t)tpb, map), 0);
		assert_int_equal(kvt_batch_prepare(e, &s, 1, &b), 0);
		assert_int_equal(kvt_batch_release(b, NULL), 0);
		assert_int_equal(kvt_seq_park(e, s, tier), 0);
		if (i % 16 == 0)
			assert_true(kvt_engine_poll(e, 0) >= 0);
	}
	assert_int_equal(kvt_engine_drain(e), 0);
	free(tok);
	free(map);
}

/* 10,000 parked two-block sessions (16-token blocks, tokens given so blocks are hashed and
 * indexed): what host metadata they cost, per block and per session. Printed for docs/PERF.md;
 * asserts issue 5's target (at most 64 bytes per block, block ids and token ids aside) and the
 * parts' bounds. */
static void
test_meta_10k_sessions(void **state)
{
	enum { NS = 10000, TPB = 16 };
	struct kvt_engine_opts o;
	struct kvt_stats st = { .size = sizeof st };
	struct kvt_engine *e;
	uint64_t bb, blocks, sess, rec, idx, evl = 0, slm = 0, perblk;
	int j, t;

	(void)state;
	kvt_engine_opts_init(&o, sizeof o);
	o.layout = (struct kvt_layout){ 1, 1, 8, KVT_DTYPE_F16, TPB };
	bb = 2ull * TPB * 8 * 2;
	o.hbm_bytes = 64 * bb;
	o.host_bytes = (uint64_t)(2 * NS + 64) * bb;
	assert_int_equal(kvt_engine_create(&o, &e), 0);
	meta_park_sessions(e, NS, TPB, KVT_TIER_HOST);
	assert_int_equal(kvt_engine_stats(e, &st), 0);
	blocks = 2ull * NS;
	/* the sessions' share: their records and block-id arrays; the rest is per block */
	sess = (uint64_t)e->cap_seqs * sizeof(struct kvt_seqrec);
	for (j = 0; j < (int)e->cap_seqs; j++)
		sess += ((uint64_t)e->seqs[j].cap_blocks + e->seqs[j].cap_wpins) * sizeof(uint32_t);
	print_message("10k parked sessions, 16-token blocks: metadata %llu bytes = %.1f "
		      "bytes/block all in (%.1f bytes/session); of it per block %.1f (block "
		      "record, prefix index, eviction lists, slot maps; %llu records allocated) "
		      "and per session %.1f (sequence record and block ids); token ids %llu "
		      "bytes = %.1f bytes/block (4 per token); sizeof(kvt_block) %zu, "
		      "sizeof(kvt_seqrec) %zu\n",
		      (unsigned long long)st.meta_bytes, (double)st.meta_bytes / (double)blocks,
		      (double)st.meta_bytes / NS, (double)(st.meta_bytes - sess) / (double)blocks,
		      (unsigned long long)st.meta_block_records, (double)sess / NS,
		      (unsigned long long)st.meta_token_bytes,
		      (double)st.meta_token_bytes / (double)blocks, sizeof(struct kvt_block),
		      sizeof(struct kvt_seqrec));
	/* the per-block share, part by part */
	rec = (uint64_t)e->cap_blocks * sizeof(struct kvt_block);
	idx = kvt_prefix_meta_bytes(e);
	for (t = 0; t < KVT_TIER_COUNT; t++) {
		evl += kvt_evict_meta_bytes(&e->evict[t]);
		slm += kvt_slots_meta_bytes(&e->slots[t]);
	}
	perblk = st.meta_bytes - sess;
	print_message("per block: records %.1f, prefix index %.1f, eviction lists %.1f (HBM %llu "
		      "bytes), slot maps %.1f, rest %.1f\n", (double)rec / (double)blocks,
		      (double)idx / (double)blocks, (double)evl / (double)blocks,
		      (unsigned long long)kvt_evict_meta_bytes(&e->evict[KVT_TIER_HBM]),
		      (double)slm / (double)blocks,
		      (double)(perblk - rec - idx - evl - slm) / (double)blocks);
	/* tokens once, exact-size while parked: 2 blocks x 16 tokens x 4 bytes per session */
	assert_int_equal(st.meta_token_bytes, blocks * TPB * sizeof(int32_t));
	/* issue 5's target, at most 64 bytes per block, met: 44-byte records in chunks, 4-byte
	 * index entries in a table 70-80% full, ARC's links and a 2-bit tag per HOST slot (a
	 * 64-slot HBM costs next to nothing), one 4-byte owner entry per slot */
	assert_int_equal(sizeof(struct kvt_block), 44);
	assert_true(rec <= (blocks + KVT_BCHUNK) * sizeof(struct kvt_block));
	assert_true(idx * 7 <= (blocks + 1) * 4 * 10 + 28); /* 4-byte entries, table <= n / 0.7 */
	/* HOST: links 8 bytes + 2 bits per slot, no ghosts yet (nothing evicted) */
	assert_true(kvt_evict_meta_bytes(&e->evict[KVT_TIER_HOST]) <=
		    (uint64_t)e->slots[KVT_TIER_HOST].n_slots * 33 / 4 + 256);
	/* HBM: 8.25 bytes per slot, ghosts of 4x its 64 slots per list (under 11 bytes each) */
	assert_true(kvt_evict_meta_bytes(&e->evict[KVT_TIER_HBM]) <
		    64 * 9 + 2 * 4 * 64 * 11 + 1024);
	assert_true(slm <= (blocks + 2 * TPB * 64) * 5);
	assert_true(perblk <= 64 * blocks);
	assert_true(sess <= 148 * (uint64_t)NS);
	kvt_engine_destroy(e);
}

/* The same 10,000 sessions parked to NVMe (HOST 256 slots, so HOST evicts and its ARC gathers
 * ghosts): what a block kept only on NVMe costs in host memory. Printed for docs/PERF.md; the
 * bound asserted is what this build reaches, not issue 5's 64 (that is met for HOST-parked
 * sessions, test_meta_10k_sessions). */
static void
test_meta_10k_nvme(void **state)
{
	enum { NS = 10000, TPB = 16 };
	struct kvt_engine_opts o;
	struct kvt_stats st = { .size = sizeof st };
	struct kvt_engine *e;
	uint64_t bb, blocks, sess, perblk, evl[KVT_TIER_COUNT], slm = 0, nvm;
	char *dir = tsup_mkdtemp();
	int j, t;

	(void)state;
	kvt_engine_opts_init(&o, sizeof o);
	o.layout = (struct kvt_layout){ 1, 1, 8, KVT_DTYPE_F16, TPB };
	bb = 2ull * TPB * 8 * 2;
	o.hbm_bytes = 64 * bb;
	o.host_bytes = 256 * bb;
	o.nvme_dir = dir;
	o.nvme_bytes = (uint64_t)(2 * NS + 512) * (4096 + 4096); /* header page + data page */
	assert_int_equal(kvt_engine_create(&o, &e), 0);
	meta_park_sessions(e, NS, TPB, KVT_TIER_NVME);
	assert_int_equal(kvt_engine_stats(e, &st), 0);
	blocks = 2ull * NS;
	/* all on NVMe but what HOST (256 slots) still holds */
	assert_true(st.tier[KVT_TIER_NVME].used_slots + st.tier[KVT_TIER_HOST].used_slots >=
		    blocks);
	assert_true(st.tier[KVT_TIER_NVME].used_slots >= blocks - 256);
	sess = (uint64_t)e->cap_seqs * sizeof(struct kvt_seqrec);
	for (j = 0; j < (int)e->cap_seqs; j++)
		sess += ((uint64_t)e->seqs[j].cap_blocks + e->seqs[j].cap_wpins) * sizeof(uint32_t);
	for (t = 0; t < KVT_TIER_COUNT; t++) {
		evl[t] = kvt_evict_meta_bytes(&e->evict[t]);
		slm += kvt_slots_meta_bytes(&e->slots[t]);
	}
	nvm = kvt_nvme_meta_bytes(e->nvme);
	perblk = st.meta_bytes - sess;
	print_message("10k sessions parked to NVMe: per block %.1f (records %.1f, prefix index "
		      "%.1f, eviction lists HBM/HOST/NVMe %.1f/%.1f/%.1f, slot maps %.1f, NVMe slot "
		      "table %.1f), per session %.1f\n", (double)perblk / (double)blocks,
		      (double)e->cap_blocks * sizeof(struct kvt_block) / (double)blocks,
		      (double)kvt_prefix_meta_bytes(e) / (double)blocks,
		      (double)evl[0] / (double)blocks, (double)evl[1] / (double)blocks,
		      (double)evl[2] / (double)blocks, (double)slm / (double)blocks,
		      (double)nvm / (double)blocks, (double)sess / NS);
	assert_true(nvm <= 6 * (uint64_t)e->slots[KVT_TIER_NVME].n_slots + 4096);
	/* the NVMe tier runs GCLOCK (2 bits per slot) under the default policy: at most 0.3
	 * bytes per block (ARC's 8.25 per slot made it 8.5) */
	assert_ptr_equal(e->evict[KVT_TIER_NVME].ops, &kvt_evict_clock_ops);
	assert_true(evl[KVT_TIER_NVME] * 10 <= 3 * blocks);
	assert_true(perblk <= 64 * blocks);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* Open a sequence, append @n tokens @tok (given: hashed), prepare and release a batch so that
 * its full blocks enter the prefix index. */
static kvt_seq_id
kept_seq(struct kvt_engine *e, const int32_t *tok, size_t n)
{
	int64_t map[64];
	struct kvt_batch *b;
	kvt_seq_id s;

	assert_true(n <= 64);
	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	assert_int_equal(kvt_seq_append(e, s, tok, n, map), 0);
	assert_int_equal(kvt_batch_prepare(e, &s, 1, &b), 0);
	assert_int_equal(kvt_batch_release(b, NULL), 0);
	return s;
}

/* Tokens are kept once: the index borrows them from the sequence that created the block, and
 * when that sequence closes while the blocks stay (shared, then cached) they get their own copy,
 * so a sequence reusing the closed one's record (and token array) with other tokens neither
 * breaks the hits of the first prompt nor is taken for them. */
static void
test_prefix_tokens_kept_once(void **state)
{
	enum { TPB = 16 };
	struct kvt_engine_opts o;
	struct kvt_stats st = { .size = sizeof st };
	struct kvt_engine *e;
	int32_t p[2 * TPB], q[2 * TPB];
	kvt_seq_id a, b, c, d;
	uint64_t m;
	int j;

	(void)state;
	kvt_engine_opts_init(&o, sizeof o);
	o.layout = (struct kvt_layout){ 1, 1, 8, KVT_DTYPE_F16, TPB };
	o.hbm_bytes = 64 * (2ull * TPB * 8 * 2);
	o.host_bytes = 64 * (2ull * TPB * 8 * 2);
	o.prefix_cache = 1;
	assert_int_equal(kvt_engine_create(&o, &e), 0);
	for (j = 0; j < 2 * TPB; j++) {
		p[j] = 1000 + j;
		q[j] = 5000 + j;
	}
	a = kept_seq(e, p, 2 * TPB);
	assert_int_equal(e->prefix.n, 2);
	assert_int_equal(e->prefix.owned, 0); /* borrowed from a */
	assert_int_equal(kvt_engine_stats(e, &st), 0);
	assert_int_equal(st.meta_token_bytes, e->seqs[0].cap_tokens * sizeof(int32_t));
	assert_int_equal(kvt_seq_open(e, NULL, &b), 0);
	assert_int_equal(kvt_seq_attach_prefix(e, b, p, 2 * TPB, &m), 0);
	assert_int_equal(m, 2 * TPB);
	assert_int_equal(kvt_seq_close(e, a), 0); /* b still shares both blocks */
	assert_int_equal(e->prefix.owned, 2);
	c = kept_seq(e, q, 2 * TPB); /* takes a's record: its token array now holds q */
	assert_int_equal(e->prefix.n, 4);
	assert_int_equal(kvt_seq_open(e, NULL, &d), 0);
	assert_int_equal(kvt_seq_attach_prefix(e, d, p, 2 * TPB, &m), 0);
	assert_int_equal(m, 2 * TPB);
	assert_int_equal(e->prefix.collisions, 0);
	assert_int_equal(kvt_seq_close(e, b), 0);
	assert_int_equal(kvt_seq_close(e, d), 0);
	assert_int_equal(kvt_seq_close(e, c), 0); /* all four blocks cached, tokens owned */
	assert_int_equal(e->prefix.owned, 4);
	assert_int_equal(kvt_seq_open(e, NULL, &a), 0);
	assert_int_equal(kvt_seq_attach_prefix(e, a, q, 2 * TPB, &m), 0);
	assert_int_equal(m, 2 * TPB);
	assert_int_equal(kvt_seq_close(e, a), 0);
	assert_int_equal(kvt_seq_match_prefix(e, NULL, p, 2 * TPB, &m, NULL), 0);
	assert_int_equal(m, 2 * TPB);
	assert_int_equal(e->prefix.collisions, 0);
	assert_int_equal(kvt_engine_stats(e, &st), 0);
	assert_true(st.meta_token_bytes >= 4 * TPB * sizeof(int32_t));
	tsup_check_engine(e);
	kvt_engine_destroy(e);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_prio_high_outlives_low),
		cmocka_unit_test(test_prio_retention_falls_back),
		cmocka_unit_test(test_prio_survives_moves),
		cmocka_unit_test(test_arc_keeps_reused),
		cmocka_unit_test(test_arc_lru_until_evidence),
		cmocka_unit_test(test_random_lru),
		cmocka_unit_test(test_random_prio),
		cmocka_unit_test(test_random_arc),
		cmocka_unit_test(test_engine_priority_decides),
		cmocka_unit_test(test_engine_priority_beats_clean_first),
		cmocka_unit_test(test_random_moves_lru),
		cmocka_unit_test(test_random_moves_prio),
		cmocka_unit_test(test_random_moves_arc),
		cmocka_unit_test(test_idle_parking),
		cmocka_unit_test(test_tenant_budget),
		cmocka_unit_test(test_meta_bytes),
		cmocka_unit_test(test_meta_10k_sessions),
		cmocka_unit_test(test_meta_10k_nvme),
		cmocka_unit_test(test_prefix_tokens_kept_once),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
