/* SPDX-License-Identifier: MIT */
/*
 * engine/block.c - block records, their per-tier copies and the slots those copies occupy.
 *
 * Every change of a copy's state goes through the few functions here, which keep the slot
 * allocator, the slot->block owner map, the tier's eviction list and the counters in step.
 * All functions require e->lock.
 */
#include <errno.h>
#include <string.h>

#include "engine_impl.h"

void *
kvt_slot_addr(struct kvt_engine *e, int tier, uint32_t slot)
{
	if (tier == KVT_TIER_HOST)
		return (char *)e->host_base + (uint64_t)slot * e->host_stride + e->host_data_off;
	return (char *)e->hbm_base + (uint64_t)slot * e->block_bytes;
}

bool
kvt_copy_evictable(const struct kvt_block *b, int tier)
{
	if (!b->live || b->dead || b->busy || kvt_copy_state(b, tier) != KVT_COPY_PRESENT)
		return false;
	/* protect guards a copy that is to be read up into HBM; once HBM holds the block, a
	 * copy below is a clean duplicate whatever the flag (it is recomputed per prepare round,
	 * and a copy that landed within the round must not keep its staging slot) */
	if (b->protect && !(tier != KVT_TIER_HBM && kvt_copy_valid(b, KVT_TIER_HBM)) &&
	    !(tier == KVT_TIER_NVME && kvt_copy_valid(b, KVT_TIER_HOST)))
		return false;
	/* a pinned block keeps its HBM copy, and its lower copies too until HBM holds it: after
	 * that a copy below is a clean duplicate and may go. Its HOST copy may also go when NVMe
	 * holds a valid copy (it is read again from there): otherwise a batch whose blocks fill
	 * HOST can never make room in HBM, whose dirty blocks need HOST slots to leave. Callers
	 * about to read a HOST copy protect it (kvt_promote_from_host). Its NVMe copy may go
	 * once HOST holds it (protected there until it is in HBM): with everything else below,
	 * that NVMe slot is the room the cascade needs to bring it up (issue 15, item 3). */
	return b->pins == 0 || (tier != KVT_TIER_HBM && kvt_copy_valid(b, KVT_TIER_HBM)) ||
	       (tier == KVT_TIER_HOST && kvt_copy_valid(b, KVT_TIER_NVME)) ||
	       (tier == KVT_TIER_NVME && kvt_copy_valid(b, KVT_TIER_HOST));
}

/* One more chunk of KVT_BCHUNK records: fewer than KVT_BCHUNK records ever idle. */
static int
block_grow(struct kvt_engine *e)
{
	uint32_t ncap = e->cap_blocks + KVT_BCHUNK, c = e->cap_blocks >> KVT_BCHUNK_SHIFT, i;
	struct kvt_block *nb;
	int t, rc;

	if (ncap < e->cap_blocks || ncap > KVT_MAX_BLOCKS)
		return kvt_err(-ENOMEM, "block table full (%u blocks)", e->cap_blocks);
	if (c == e->cap_bchunks) {
		uint32_t nc = e->cap_bchunks ? e->cap_bchunks * 2 : 16;
		struct kvt_block **nd = kvt_realloc(e->bchunk, (size_t)nc * sizeof *nd);

		if (!nd)
			return kvt_err(-ENOMEM, "growing the block chunk table to %u chunks", nc);
		e->bchunk = nd;
		e->cap_bchunks = nc;
	}
	for (t = 0; t < KVT_TIER_COUNT; t++) {
		if (!e->slots[t].n_slots)
			continue; /* a tier the engine lacks never lists a block */
		rc = e->evict[t].ops->reserve(&e->evict[t], ncap);
		if (rc)
			return kvt_err(rc, "growing the eviction lists to %u blocks", ncap);
	}
	nb = kvt_calloc(KVT_BCHUNK, sizeof *nb);
	if (!nb)
		return kvt_err(-ENOMEM, "growing the block table to %u blocks", ncap);
	rc = kvt_sc_grow(e, c); /* the sidecar mirror's chunk (engine/sidecar.c) */
	if (rc) {
		kvt_free(nb);
		return rc;
	}
	e->bchunk[c] = nb;
	/* push the new ids on the free list, lowest first */
	for (i = ncap; i-- > e->cap_blocks;) {
		nb[i - e->cap_blocks].next_free = e->block_free;
		e->block_free = i;
	}
	e->cap_blocks = ncap;
	return 0;
}

int
kvt_block_new(struct kvt_engine *e, uint32_t seq, uint32_t index, uint32_t *out)
{
	struct kvt_block *b;
	uint32_t id;
	int t, rc;

	if (index > KVT_SEQ_MAX_BLOCKS - 1u)
		return kvt_err(KVT_ETOOBIG, "block %u of a sequence: at most %u blocks per "
			       "sequence", index, KVT_SEQ_MAX_BLOCKS);
	if (e->block_free == KVT_NIL) {
		rc = block_grow(e);
		if (rc)
			return rc;
	}
	id = e->block_free;
	b = kvt_blk(e, id);
	e->block_free = b->next_free;
	memset(b, 0, sizeof *b);
	for (t = 0; t < KVT_TIER_COUNT; t++)
		b->slot[t] = KVT_NIL;
	b->live = 1;
	b->refs = 1;
	/* a shadow a dead block of this id left in HOST holds another block's bytes */
	kvt_slots_shadow_clamp(&e->slots[KVT_TIER_HOST], id, 0);
	kvt_sc_invalidate(e, id);
	b->tslot = seq < e->cap_seqs ? kvt_tenant_slot(e, e->seqs[seq].tenant) : 0;
	b->seq = seq;
	b->index = index; /* b->seq above is also the free-list link: set once live */
	e->n_live_blocks++;
	if (seq < e->cap_seqs && e->seqs[seq].priority != KVT_EVICT_PRIO_DEFAULT)
		kvt_block_set_prio(e, id, e->seqs[seq].priority, e->seqs[seq].retention_ms ?
				   e->evict[0].now_ns() + e->seqs[seq].retention_ms * 1000000ull :
				   0);
	*out = id;
	return 0;
}

int
kvt_slot_alloc(struct kvt_engine *e, int tier, uint32_t block, uint32_t *slot)
{
	int rc = kvt_slots_alloc(&e->slots[tier], slot);

	if (rc)
		return rc;
	kvt_owner_set(e, tier, *slot, block);
	kvt_tenant_account(e, block, tier, 1);
	return 0;
}

void
kvt_slot_free(struct kvt_engine *e, int tier, uint32_t slot)
{
	if (KVT_OWNER_IS_BLOCK(kvt_owner(e, tier, slot)))
		kvt_tenant_account(e, kvt_owner(e, tier, slot), tier, -1);
	if (kvt_persist_named(e, tier, slot)) {
		/* a published record may still name it: freed once superseded durably */
		kvt_owner_set(e, tier, slot, KVT_SLOT_PENDING);
		return;
	}
	kvt_owner_set(e, tier, slot, KVT_NIL);
	kvt_slots_free(&e->slots[tier], slot);
}

void
kvt_slot_quarantine(struct kvt_engine *e, int tier, uint32_t slot, uint32_t block)
{
	struct kvt_block *b = kvt_blk(e, block);

	kvt_tenant_account(e, block, tier, -1);
	kvt_owner_set(e, tier, slot, KVT_SLOT_QUARANTINED);
	if (b->slot[tier] == slot) {
		b->slot[tier] = KVT_NIL;
		kvt_copy_state_set(b, tier, KVT_COPY_ABSENT);
	}
	e->quarantined[tier]++;
}

/* Free @id's PRESENT copy in @tier; its policy hears an eviction (@evicted) or a removal. */
static void
copy_drop(struct kvt_engine *e, uint32_t id, int tier, bool evicted)
{
	struct kvt_block *b = kvt_blk(e, id);

	if (kvt_copy_state(b, tier) != KVT_COPY_PRESENT)
		return;
	if (evicted)
		kvt_evict_evicted(&e->evict[tier], id);
	else
		e->evict[tier].ops->remove(&e->evict[tier], id);
	kvt_slot_free(e, tier, b->slot[tier]);
	b->slot[tier] = KVT_NIL;
	kvt_copy_state_set(b, tier, KVT_COPY_ABSENT);
}

void
kvt_copy_drop(struct kvt_engine *e, uint32_t id, int tier)
{
	copy_drop(e, id, tier, false);
}

void
kvt_copy_evict(struct kvt_engine *e, uint32_t id, int tier)
{
	copy_drop(e, id, tier, true);
	e->st.tier[tier].evictions++;
}

void
kvt_copy_set_present(struct kvt_engine *e, uint32_t id, int tier)
{
	struct kvt_block *b = kvt_blk(e, id);

	kvt_copy_state_set(b, tier, KVT_COPY_PRESENT);
	e->evict[tier].ops->insert(&e->evict[tier], id);
}

void
kvt_copy_fail(struct kvt_engine *e, uint32_t id, int tier)
{
	struct kvt_block *b = kvt_blk(e, id);

	if (kvt_copy_state(b, tier) != KVT_COPY_INFLIGHT)
		return;
	kvt_slot_free(e, tier, b->slot[tier]);
	b->slot[tier] = KVT_NIL;
	kvt_copy_state_set(b, tier, KVT_COPY_ABSENT);
}

/* Is @b's HOST copy PRESENT and the source of a transfer in flight? Only a HOST->NVMe write
 * (a zero-copy one reads the slot in place, its worker checksums it) or a HOST->HBM copy reads
 * it, and their destinations are INFLIGHT while they run. */
static bool
host_copy_read(const struct kvt_block *b)
{
	return b->busy && kvt_copy_state(b, KVT_TIER_HOST) == KVT_COPY_PRESENT &&
	       kvt_host_has_reader(b);
}

bool
kvt_shadow_on(const struct kvt_engine *e)
{
	return e->slots[KVT_TIER_HOST].sh != NULL;
}

/*
 * @id's PRESENT HOST copy, made old by an append that leaves its first @kept tokens as they
 * are, leaves the tier as a shadow (tiers/slots.h): its slot is free, but handed out only when
 * no other slot is, so the next demotion of the block into it copies only the tokens from
 * @kept on (kvt_slot_alloc_d2h). Otherwise (no shadows, nothing kept) dropped as before.
 */
static void
copy_shadow(struct kvt_engine *e, uint32_t id, uint32_t kept)
{
	struct kvt_block *b = kvt_blk(e, id);
	uint32_t slot = b->slot[KVT_TIER_HOST];

	if (!kept || !kvt_shadow_on(e) || kvt_persist_named(e, KVT_TIER_HOST, slot)) {
		kvt_copy_drop(e, id, KVT_TIER_HOST);
		return;
	}
	e->evict[KVT_TIER_HOST].ops->remove(&e->evict[KVT_TIER_HOST], id);
	kvt_tenant_account(e, id, KVT_TIER_HOST, -1);
	kvt_owner_set(e, KVT_TIER_HOST, slot, KVT_NIL);
	kvt_slots_free_shadow(&e->slots[KVT_TIER_HOST], slot, id, kept);
	b->slot[KVT_TIER_HOST] = KVT_NIL;
	kvt_copy_state_set(b, KVT_TIER_HOST, KVT_COPY_ABSENT);
}

int
kvt_slot_alloc_d2h(struct kvt_engine *e, uint32_t id, uint32_t *slot, uint32_t *kept)
{
	*kept = 0;
	if (kvt_slots_claim_shadow(&e->slots[KVT_TIER_HOST], id, slot, kept) == 0) {
		kvt_owner_set(e, KVT_TIER_HOST, *slot, id);
		kvt_tenant_account(e, id, KVT_TIER_HOST, 1);
		return 0;
	}
	return kvt_slot_alloc(e, KVT_TIER_HOST, id, slot);
}

void
kvt_block_bump_ver(struct kvt_engine *e, uint32_t id, uint32_t kept)
{
	struct kvt_block *b = kvt_blk(e, id);
	int t;

	b->written = 1;
	kvt_sc_invalidate(e, id);
	/* tokens from @kept on change: a shadow keeps at most the ones before */
	kvt_slots_shadow_clamp(&e->slots[KVT_TIER_HOST], id, kept);
	if (host_copy_read(b)) {
		/* a transfer still reads the HOST slot: it must not be freed (and reused) under
		 * it. The copy is invalid from now on: INFLIGHT and stale, off the eviction list,
		 * its slot released when the last transfer reading it completes
		 * (xfer_release_src, engine/xfer.c) */
		e->evict[KVT_TIER_HOST].ops->remove(&e->evict[KVT_TIER_HOST], id);
		kvt_copy_state_set(b, KVT_TIER_HOST, KVT_COPY_INFLIGHT);
	}
	/* copies below HBM now hold old bytes: drop them (in-flight ones are dropped by their
	 * completion, which sees the version mismatch) */
	if (kvt_copy_state(b, KVT_TIER_HOST) == KVT_COPY_PRESENT)
		copy_shadow(e, id, kept);
	for (t = KVT_TIER_HOST + 1; t < KVT_TIER_COUNT; t++)
		if (kvt_copy_state(b, t) == KVT_COPY_PRESENT)
			kvt_copy_drop(e, id, t);
	for (t = 0; t < KVT_TIER_COUNT; t++)
		kvt_copy_mark_stale(b, t); /* an INFLIGHT copy */
}

void
kvt_block_pin(struct kvt_engine *e, uint32_t id)
{
	struct kvt_block *b = kvt_blk(e, id);

	if (b->pins++ == 0)
		e->hbm_pinned++;
}

void
kvt_block_unpin(struct kvt_engine *e, uint32_t id)
{
	struct kvt_block *b = kvt_blk(e, id);

	if (b->pins == 0)
		return;
	if (--b->pins == 0)
		e->hbm_pinned--;
	kvt_block_try_free(e, id);
}

void
kvt_block_check_lost(struct kvt_engine *e, uint32_t id)
{
	struct kvt_block *b = kvt_blk(e, id);

	/* an empty block (no token written yet) has nothing to lose */
	if (!b->live || b->dead || b->lost || kvt_block_current(b) || !b->written)
		return;
	b->lost = 1;
	e->st.blocks_lost++;
	if (b->refs == 0)
		kvt_block_uncache(e, id); /* a cached prefix block nobody needs any more */
}

/* Free a dead, idle block now: every copy goes (the one in @evicted_tier, if >= 0, as an
 * eviction its policy hears of; the others as removals). */
static void
block_free(struct kvt_engine *e, uint32_t id, int evicted_tier)
{
	struct kvt_block *b = kvt_blk(e, id);
	int t;

	/* out of the prefix index before any slot can be reused */
	kvt_prefix_remove(e, id);
	if (b->seq == KVT_EXT_SEQ)
		kvt_ext_block_freed(e, id); /* out of the external pool's index too */
	for (t = 0; t < KVT_TIER_COUNT; t++) {
		copy_drop(e, id, t, t == evicted_tier);
		if (e->evict[t].ops->forget) /* the id will name other content: no history */
			e->evict[t].ops->forget(&e->evict[t], id);
	}
	b->live = 0;
	b->dead = 0;
	b->next_free = e->block_free;
	e->block_free = id;
	e->n_live_blocks--;
}

void
kvt_block_try_free(struct kvt_engine *e, uint32_t id)
{
	const struct kvt_block *b = kvt_blk(e, id);

	if (b->live && b->dead && !b->busy && !b->pins)
		block_free(e, id, -1);
}

void
kvt_block_set_prio(struct kvt_engine *e, uint32_t id, uint8_t prio, uint64_t until_ns)
{
	int t;

	for (t = 0; t < KVT_TIER_COUNT; t++)
		if (e->evict[t].ops->set_prio)
			e->evict[t].ops->set_prio(&e->evict[t], id, prio, until_ns);
}

void
kvt_block_kill(struct kvt_engine *e, uint32_t id)
{
	struct kvt_block *b = kvt_blk(e, id);

	if (b->refs > 1) { /* another sequence still references it */
		if (--b->refs == 1)
			e->st.shared_blocks--;
		return;
	}
	b->refs = 0;
	if (e->opts.prefix_cache && b->indexed && !b->lost && !b->dead)
		return; /* kept as a cached prefix block until eviction drops it */
	b->dead = 1;
	kvt_block_try_free(e, id);
}

void
kvt_block_ref(struct kvt_engine *e, uint32_t id)
{
	struct kvt_block *b = kvt_blk(e, id);

	if (b->refs++ == 1)
		e->st.shared_blocks++;
}

/* A cached (refs 0) block is forgotten: freed now when idle, else when its last pin or
 * transfer ends (kvt_block_try_free). */
static void
block_uncache(struct kvt_engine *e, uint32_t id, int evicted_tier)
{
	struct kvt_block *b = kvt_blk(e, id);

	if (b->refs || !b->live || b->dead)
		return;
	b->dead = 1;
	if (!b->busy && !b->pins)
		block_free(e, id, evicted_tier);
}

void
kvt_block_uncache(struct kvt_engine *e, uint32_t id)
{
	block_uncache(e, id, -1);
}

void
kvt_block_uncache_evicted(struct kvt_engine *e, uint32_t id, int tier)
{
	block_uncache(e, id, tier);
	e->st.tier[tier].evictions++;
}
