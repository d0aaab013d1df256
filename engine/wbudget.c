/* SPDX-License-Identifier: MIT */
/*
 * engine/wbudget.c - the write budget of the lower tiers (issue 18, item 5) and the table of
 * per-key hints that the REMOTE tier and the budget read (items 1-3).
 *
 * Keys. A direct-mapped table of KVT_KEYTAB entries (prefix key + tenant -> flags), allocated
 * when the engine has a REMOTE tier or a write budget: KVT_KEY_EVID (reuse evidence: the block
 * was attached by a second sequence or sealed again by another), KVT_KEY_RBIT (the REMOTE bit:
 * put to REMOTE, or seen there by a lookup; a hint only, a get verifies), KVT_KEY_REFUSED(w)
 * (a write of it to lower tier w was refused by the budget: a later miss of it is a hit lost).
 * A key that lands on a slot held by another key replaces it: the flags are hints, never
 * correctness (a forgotten REMOTE bit costs one more SET NX, which the server answers "there").
 * The struct kvt_block record has no spare bit (44 bytes, asserted), hence a table by content.
 *
 * Budget. One token bucket per lower tier (KVT_WB_NVME, KVT_WB_REMOTE): it fills at
 * budget bytes per write_budget_period_ms up to one period's budget (or one block, if larger),
 * full at create. A write with reuse evidence is admitted while the bucket holds its bytes; one
 * without only while half the bucket would be left (the other half is kept for blocks with
 * evidence). A write that must happen (a live sequence's only copy) is admitted and charged
 * (the level may go below zero: later optional writes wait for the refill).
 * All functions require e->lock (or a single-threaded create / destroy).
 */
#include <errno.h>
#include <string.h>

#include "engine_impl.h"
#include "tiers/base/alloc.h"
#include "tiers/base/clock.h"
#include "tiers/base/error.h"

#define KVT_KEYTAB 16384u

struct kvt_keyent {
	uint64_t k[2];
	uint32_t tenant;
	uint32_t flags; /* 0: empty */
};

struct kvt_wbucket {
	uint64_t rate;  /* bytes per period; 0 = unlimited */
	int64_t level;  /* bytes that may be written now */
	uint64_t last_ns;
};

struct kvt_wb {
	struct kvt_keyent tab[KVT_KEYTAB];
	struct kvt_wbucket b[2];
	uint64_t period_ns;
};

static int64_t
wb_burst(const struct kvt_engine *e, const struct kvt_wbucket *b)
{
	return (int64_t)(b->rate > e->block_bytes ? b->rate : e->block_bytes);
}

int
kvt_wb_open(struct kvt_engine *e)
{
	const struct kvt_engine_opts *o = &e->opts;
	struct kvt_wb *w;

	if (!e->remote && !o->nvme_write_budget && !o->remote_write_budget)
		return 0;
	w = kvt_calloc(1, sizeof *w);
	if (!w)
		return kvt_err(-ENOMEM, "write budget and key table");
	w->period_ns = (uint64_t)(o->write_budget_period_ms ? o->write_budget_period_ms : 1000) *
		       1000000ull;
	w->b[KVT_WB_NVME].rate = o->nvme_write_budget;
	w->b[KVT_WB_REMOTE].rate = o->remote_write_budget;
	for (int i = 0; i < 2; i++) {
		w->b[i].level = wb_burst(e, &w->b[i]);
		w->b[i].last_ns = kvt_now_ns();
	}
	e->wb = w;
	return 0;
}

void
kvt_wb_close(struct kvt_engine *e)
{
	kvt_free(e->wb);
	e->wb = NULL;
}

uint64_t
kvt_wb_meta_bytes(const struct kvt_engine *e)
{
	return e->wb ? sizeof *e->wb : 0;
}

static struct kvt_keyent *
key_slot(struct kvt_engine *e, const uint64_t k[2], uint32_t tenant)
{
	uint64_t h = k[0] ^ (k[1] * 0x9e3779b97f4a7c15ull) ^ tenant;

	return &e->wb->tab[(h ^ (h >> 29)) % KVT_KEYTAB];
}

uint32_t
kvt_key_flags(struct kvt_engine *e, const uint64_t k[2], uint32_t tenant)
{
	const struct kvt_keyent *t;

	if (!e->wb)
		return 0;
	t = key_slot(e, k, tenant);
	return t->flags && t->k[0] == k[0] && t->k[1] == k[1] && t->tenant == tenant ? t->flags :
										     0;
}

void
kvt_key_mark(struct kvt_engine *e, const uint64_t k[2], uint32_t tenant, uint32_t set,
	     uint32_t clear)
{
	struct kvt_keyent *t;

	if (!e->wb)
		return;
	t = key_slot(e, k, tenant);
	if (!t->flags || t->k[0] != k[0] || t->k[1] != k[1] || t->tenant != tenant) {
		if (!set)
			return;
		t->k[0] = k[0];
		t->k[1] = k[1];
		t->tenant = tenant;
		t->flags = 0;
	}
	t->flags = (t->flags | set) & ~clear;
}

bool
kvt_wb_admit(struct kvt_engine *e, int w, uint64_t bytes, bool evidence, bool must,
	     const uint64_t k[2], uint32_t tenant)
{
	struct kvt_wbucket *b;
	uint64_t now;
	int64_t burst;

	if (!e->wb || !e->wb->b[w].rate)
		return true;
	b = &e->wb->b[w];
	burst = wb_burst(e, b);
	now = kvt_now_ns();
	if (now > b->last_ns) {
		/* refill: rate bytes per period, at most one burst */
		long double add = (long double)(now - b->last_ns) * (long double)b->rate /
				  (long double)e->wb->period_ns;

		b->level = add >= (long double)burst ? burst :
			   b->level + (int64_t)add > burst ? burst : b->level + (int64_t)add;
		b->last_ns = now;
	}
	if (must || (evidence ? b->level >= (int64_t)bytes :
				b->level - (int64_t)bytes >= burst / 2)) {
		b->level -= (int64_t)bytes;
		e->st.wb_admitted_bytes[w] += bytes;
		if (k)
			kvt_key_mark(e, k, tenant, 0, KVT_KEY_REFUSED(w));
		return true;
	}
	e->st.wb_refused[w]++;
	e->st.wb_refused_bytes[w] += bytes;
	if (k)
		kvt_key_mark(e, k, tenant, KVT_KEY_REFUSED(w), 0);
	return false;
}

void
kvt_wb_miss(struct kvt_engine *e, int w, const uint64_t k[2], uint32_t tenant)
{
	if (kvt_key_flags(e, k, tenant) & KVT_KEY_REFUSED(w)) {
		e->st.wb_hits_lost[w]++;
		kvt_key_mark(e, k, tenant, 0, KVT_KEY_REFUSED(w)); /* counted once */
	}
}
