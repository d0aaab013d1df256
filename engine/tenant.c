/* SPDX-License-Identifier: MIT */
/*
 * engine/tenant.c - per-tenant tier budgets.
 *
 * A tenant given a budget gets an entry in e->budget (at most KVT_MAX_BUDGETS); each block of
 * it carries 1 + that index (b->tslot, set when the block is created or when the budget is first
 * set), and every slot allocated or released for the block is counted in the entry (block.c).
 * Enforcement is soft and runs where the engine already does background work (after a release,
 * in poll): a tenant above its budget in HBM or HOST has its unpinned blocks, coldest first in
 * the tier's policy order, demoted one tier down without waiting; on NVMe only cached prefix
 * blocks (referenced by no sequence) can be dropped. All functions require e->lock.
 */
#include <errno.h>

#include "engine_impl.h"

#define TENANT_SCAN_MAX 4096u /* policy entries one enforcement pass may look at per tier */

uint8_t
kvt_tenant_slot(const struct kvt_engine *e, uint32_t tenant)
{
	uint32_t i;

	for (i = 0; i < e->n_budgets; i++)
		if (e->budget[i].tenant == tenant)
			return (uint8_t)(i + 1);
	return 0;
}

void
kvt_tenant_account(struct kvt_engine *e, uint32_t block, int tier, int delta)
{
	uint8_t ts = kvt_blk(e, block)->tslot;

	if (!ts)
		return;
	if (delta > 0)
		e->budget[ts - 1].used[tier]++;
	else if (e->budget[ts - 1].used[tier])
		e->budget[ts - 1].used[tier]--;
}

/* Demote blocks of over-budget tenants out of @tier (no waiting). */
static void
tenant_enforce_tier(struct kvt_engine *e, int tier)
{
	struct kvt_evict *ev = &e->evict[tier];
	uint32_t going[KVT_MAX_BUDGETS] = { 0 }; /* demotions submitted per tenant this pass */
	uint32_t id, next, seen = 0;

	for (id = ev->ops->victim_first(ev); id != KVT_NIL && seen < TENANT_SCAN_MAX; id = next) {
		struct kvt_block *b = kvt_blk(e, id);
		uint32_t k = b->tslot ? b->tslot - 1u : 0;
		struct kvt_budget *bu = b->tslot ? &e->budget[k] : NULL;

		next = ev->ops->victim_next(ev, id);
		seen++;
		/* announced blocks stay: the budget is met again when their batch is released */
		if (!bu || !bu->max[tier] || bu->used[tier] - going[k] <= bu->max[tier] ||
		    !kvt_copy_evictable(b, tier) || kvt_hint_spares(e, b, tier))
			continue;
		/* 1: the copy is gone now (counted by the slot release); 0: a demotion whose
		 * completion frees the slot */
		if (kvt_evict_one(e, tier, id, false) == 0)
			going[k]++;
	}
}

void
kvt_tenant_enforce(struct kvt_engine *e)
{
	uint32_t i;
	int t, over;

	for (t = 0; t < KVT_TIER_COUNT; t++) {
		over = 0;
		for (i = 0; i < e->n_budgets; i++)
			over |= e->budget[i].max[t] && e->budget[i].used[t] > e->budget[i].max[t];
		if (over && e->slots[t].n_slots)
			tenant_enforce_tier(e, t);
	}
	(void)kvt_xfer_flush(e);
}

/*
 * A new budget entry @ts for @tenant: tag the blocks the tenant's open sequences hold and count
 * their slots. Not by the blocks' creator index (b->seq): once the creator closed, its record
 * may be reused by another tenant's sequence, and a block already counted in another entry
 * would then be counted twice (kvt_engine_check: "0 slots held, budget counts 2"). Blocks are
 * shared only within a tenant (the index compares tenants), so whoever holds one is of its
 * tenant; cached blocks no sequence holds are the tenant's when the prefix index says so (it
 * keeps the creator's tenant with their tokens). A block already tagged keeps its entry.
 */
static void
tenant_tag(struct kvt_engine *e, uint32_t tenant, uint8_t ts)
{
	struct kvt_budget *bu = &e->budget[ts - 1];
	uint32_t i, j, owner;
	int t;

	for (i = 0; i < e->cap_seqs; i++) {
		const struct kvt_seqrec *s = &e->seqs[i];

		if (!s->open || s->tenant != tenant)
			continue;
		for (j = 0; j < s->n_blocks; j++) {
			struct kvt_block *b = kvt_blk(e, s->blocks[j]);

			if (!b->live || b->tslot)
				continue;
			b->tslot = ts;
			for (t = 0; t < KVT_TIER_COUNT; t++)
				bu->used[t] += kvt_copy_state(b, t) != KVT_COPY_ABSENT;
		}
	}
	for (i = 0; i < e->cap_blocks; i++) { /* cached blocks (refs 0) */
		struct kvt_block *b = kvt_blk(e, i);

		if (!b->live || b->dead || b->refs || b->tslot || !kvt_prefix_tenant(e, i, &owner) ||
		    owner != tenant)
			continue;
		b->tslot = ts;
		for (t = 0; t < KVT_TIER_COUNT; t++)
			bu->used[t] += kvt_copy_state(b, t) != KVT_COPY_ABSENT;
	}
}

int
kvt_tenant_set_budget(struct kvt_engine *e, uint32_t tenant, enum kvt_tier tier,
		      uint64_t max_blocks)
{
	uint8_t ts;

	if (!e)
		return kvt_err(-EINVAL, "kvt_tenant_set_budget: engine is NULL");
	if (e->grp)
		return kvt_grp_tenant_set_budget(e, tenant, tier, max_blocks);
	if ((int)tier < 0 || tier >= KVT_TIER_COUNT)
		return kvt_err(-EINVAL, "tier %d is not a tier", (int)tier);
	kvt_lock(e);
	ts = kvt_tenant_slot(e, tenant);
	if (!ts) {
		if (e->n_budgets == KVT_MAX_BUDGETS) {
			kvt_unlock(e);
			return kvt_err(-ENOSPC, "%u tenants have budgets already", KVT_MAX_BUDGETS);
		}
		ts = (uint8_t)++e->n_budgets;
		e->budget[ts - 1] = (struct kvt_budget){ .tenant = tenant };
		tenant_tag(e, tenant, ts);
	}
	e->budget[ts - 1].max[tier] = max_blocks;
	kvt_unlock(e);
	return 0;
}

int
kvt_tenant_usage(struct kvt_engine *e, uint32_t tenant, uint64_t *used)
{
	uint8_t ts;
	int t;

	if (!e || !used)
		return kvt_err(-EINVAL, "kvt_tenant_usage: engine and used must not be NULL");
	if (e->grp)
		return kvt_grp_tenant_usage(e, tenant, used);
	kvt_lock(e);
	ts = kvt_tenant_slot(e, tenant);
	if (ts)
		for (t = 0; t < KVT_TIER_COUNT; t++)
			used[t] = e->budget[ts - 1].used[t];
	kvt_unlock(e);
	return ts ? 0 : kvt_err(-ENOENT, "tenant %u has no budget", tenant);
}
