/* SPDX-License-Identifier: MIT */
/*
 * engine/residency.c - where blocks live: making room in a tier, demotion and promotion.
 *
 * Making room (kvt_reclaim) walks the tier's eviction list from its cold end and, for each
 * evictable block (not pinned, no transfer in flight: DESIGN.md invariant 3):
 *   - drops the copy at once when a valid copy exists in another tier ("clean"), or
 *   - demotes it one tier down (HBM -> HOST by a batched device copy, HOST -> NVME by io_uring)
 *     and frees the slot when that copy has completed (invariants 1 and 4).
 * Demotion needs a slot below, so making room in HBM may make room in HOST, which may make room
 * on NVMe: the cascade HBM -> HOST -> NVME. NVMe copies can only be dropped when the block is
 * valid higher up; a block that cannot be stored anywhere makes the caller fail with -ENOSPC and
 * nothing is lost.
 *
 * Callers that may block (prepare, append, park) pass may_wait; completion handlers and
 * background demotion do not, and simply do less when the tier below is full.
 * All functions require e->lock.
 */
#include <errno.h>

#include "engine_impl.h"

#define RECLAIM_SCAN_MAX 1024u /* LRU entries one pass may look at beyond the deficit */

static bool
valid_elsewhere(const struct kvt_block *b, int tier)
{
	int t;

	for (t = 0; t < KVT_TIER_COUNT; t++)
		if (t != tier && kvt_copy_valid(b, t))
			return true;
	return false;
}

/* No tier below @tier to demote into: its evictions drop the copy or refuse. */
static bool
last_tier(const struct kvt_engine *e, int tier)
{
	return tier == KVT_TIER_NVME || !e->slots[tier + 1].n_slots;
}

/* The NVMe write budget (issue 18 item 5) for the demotion of @id's HOST copy: a cached block
 * (refs 0) over budget is dropped (true); a live sequence's only copy is written and charged. */
static bool
wb_refuse_nvme(struct kvt_engine *e, uint32_t id)
{
	struct kvt_block *b = kvt_blk(e, id);
	uint32_t tenant = 0;
	uint64_t k[2] = { 0, 0 };
	bool cached = b->refs == 0 && !b->busy && !b->pins && b->hashed &&
		      kvt_prefix_tenant(e, id, &tenant);

	if (cached)
		kvt_blk_key(b, k);
	if (kvt_wb_admit(e, KVT_WB_NVME, e->block_bytes, cached && (kvt_key_flags(e, k, tenant) &
								    KVT_KEY_EVID),
			 !cached, cached ? k : NULL, tenant))
		return false;
	kvt_block_uncache_evicted(e, id, KVT_TIER_HOST);
	return true;
}

/* Free @id's copy in @tier: 1 = slot free now, 0 = demotion submitted, <0 = cannot. */
int
kvt_evict_one(struct kvt_engine *e, int tier, uint32_t id, bool may_wait)
{
	uint32_t slot, pins, kept;
	int rc;

	if (valid_elsewhere(kvt_blk(e, id), tier)) {
		kvt_copy_evict(e, id, tier);
		return 1;
	}
	if (last_tier(e, tier)) {
		if (kvt_blk(e, id)->refs == 0) { /* a cached prefix block nobody holds: drop it */
			kvt_block_uncache_evicted(e, id, tier);
			return 1;
		}
		return -ENOSPC;
	}
	/* the only valid copy: demote it. Pin it while room is made below, so the cascade
	 * cannot pick it again (or drop its other copies) halfway. */
	if (tier == KVT_TIER_HOST && !may_wait && kvt_nvme_free_qd(e->nvme) == 0)
		return -EAGAIN; /* no IO slot: do not make room below for nothing */
	if (tier == KVT_TIER_HOST && e->wb && wb_refuse_nvme(e, id))
		return 1; /* over the NVMe write budget: a cached block is dropped instead */
	kvt_blk(e, id)->wanted = 0;
	pins = kvt_blk(e, id)->pins;
	kvt_block_pin(e, id);
	rc = kvt_room_for_copy(e, id, tier, tier + 1, may_wait);
	/* the copy went meanwhile (an append dropped it, another thread demoted it), or, in
	 * HBM, the block was pinned meanwhile (a batch, or an append whose caller may be
	 * writing it now: a copy taken now would be marked current and miss those tokens):
	 * no victim any more, the caller counts slots afresh */
	if (rc == 1 || (rc == 0 && valid_elsewhere(kvt_blk(e, id), tier)) ||
	    (rc == 0 && tier == KVT_TIER_HBM && kvt_blk(e, id)->pins > pins + 1)) {
		kvt_block_unpin(e, id);
		return 0;
	}
	if (rc == 0 && tier == KVT_TIER_HBM) {
		rc = kvt_slot_alloc_d2h(e, id, &slot, &kept);
		if (rc == 0)
			rc = kvt_xfer_d2h(e, id, slot, kept, true, false);
	} else if (rc == 0) {
		rc = kvt_slot_alloc(e, tier + 1, id, &slot);
		if (rc == 0)
			rc = kvt_xfer_h2n(e, id, slot, true, may_wait);
	}
	kvt_block_unpin(e, id);
	if (rc == -ENOSPC && kvt_blk(e, id)->refs == 0 && !kvt_blk(e, id)->busy &&
	    !kvt_blk(e, id)->pins) {
		kvt_block_uncache_evicted(e, id, tier); /* a cached block, no room below */
		return 1;
	}
	return rc;
}

/* Evict candidates in order until @need slots are free or coming; only clean copies (a valid
 * copy elsewhere: dropping them costs nothing) when @clean_only. */
static void
reclaim_evict(struct kvt_engine *e, int tier, const uint32_t *cand, uint32_t n, uint32_t need,
	      bool may_wait, bool clean_only, bool *below_full, int *progress)
{
	struct kvt_slots *sl = &e->slots[tier];
	uint32_t i;
	int rc;

	for (i = 0; i < n && sl->n_free + e->demoting[tier] < need; i++) {
		struct kvt_block *b = kvt_blk(e, cand[i]);

		if (!kvt_copy_evictable(b, tier))
			continue;
		if ((clean_only || *below_full) && !valid_elsewhere(b, tier)) {
			if (clean_only || b->refs || b->pins)
				continue;
			/* a cached block nobody references, and no room below (or no tier
			 * below): it is dropped, never skipped (issue 15, item 2) */
			kvt_block_uncache_evicted(e, cand[i], tier);
			(*progress)++;
			continue;
		}
		rc = kvt_evict_one(e, tier, cand[i], may_wait);
		if (rc >= 0)
			(*progress)++;
		else if (rc == -ENOSPC && !last_tier(e, tier))
			*below_full = true; /* (the last tier's refusals cost nothing to ask) */
	}
}

/*
 * Evict from the candidates (in victim order) until @need slots are free or coming: clean ones
 * first, then dirty ones, class by class when the policy ranks its victims (priorities: a clean
 * copy of a higher class never goes before a dirty one of a lower class). The dirty ones of the
 * last class seen go only when the window is @full (more clean ones of that class may follow).
 */
static void
reclaim_ranked(struct kvt_engine *e, int tier, const uint32_t *cand, uint32_t n, uint32_t need,
	       bool may_wait, bool full, bool *below_full, int *progress)
{
	const struct kvt_evict *ev = &e->evict[tier];
	struct kvt_slots *sl = &e->slots[tier];
	uint32_t i = 0, j, r;

	if (ev->ops->abi_version < KVT_EVICT_OPS_V3 || !ev->ops->rank) {
		reclaim_evict(e, tier, cand, n, need, may_wait, true, below_full, progress);
		if (full)
			reclaim_evict(e, tier, cand, n, need, may_wait, false, below_full,
				      progress);
		return;
	}
	while (i < n && sl->n_free + e->demoting[tier] < need) {
		r = ev->ops->rank(ev, cand[i]);
		for (j = i + 1; j < n && ev->ops->rank(ev, cand[j]) == r; j++)
			;
		reclaim_evict(e, tier, cand + i, j - i, need, may_wait, true, below_full,
			      progress);
		if (j < n || full)
			reclaim_evict(e, tier, cand + i, j - i, need, may_wait, false, below_full,
				      progress);
		i = j;
	}
}

/*
 * Evictable copies of @tier that hints do not spare, from the cold end of its eviction list, at
 * most @max. Returns how many were put in @out.
 */
static uint32_t
reclaim_collect(struct kvt_engine *e, int tier, uint32_t *out, uint32_t max)
{
	struct kvt_evict *ev = &e->evict[tier];
	uint32_t id, n = 0;

	for (id = ev->ops->victim_first(ev); id != KVT_NIL && n < max;
	     id = ev->ops->victim_next(ev, id)) {
		const struct kvt_block *b = kvt_blk(e, id);

		if (!kvt_copy_evictable(b, tier) || kvt_hint_spares(e, b, tier))
			continue;
		out[n++] = id;
	}
	return n;
}

/*
 * One walk of HBM's eviction list from the cold end, for the rotation's order: evictable copies
 * that hints do not spare, those outside the rotation into @out (at most @max_out) and those in
 * it into @in (at most @max_in). Once either group is full the walk looks only until @scan
 * entries have been looked at, so a reclaim costs O(window), not O(HBM), whether HBM holds
 * nothing but the rotation (the decode steady state) or mostly idle blocks outside it. Returns
 * whether @in may be short for that reason (the list went on): the caller walks again for it
 * if it needs it.
 */
static bool
rot_collect(struct kvt_engine *e, uint32_t *out, uint32_t max_out, uint32_t *n_out,
	    uint32_t *in, uint32_t max_in, uint32_t *n_in, uint32_t scan)
{
	struct kvt_evict *ev = &e->evict[KVT_TIER_HBM];
	uint32_t id, looked = 0, no = 0, ni = 0;
	bool cut = false;

	for (id = ev->ops->victim_first(ev); id != KVT_NIL;
	     id = ev->ops->victim_next(ev, id)) {
		const struct kvt_block *b = kvt_blk(e, id);

		if ((no == max_out && ni == max_in) ||
		    (looked >= scan && (no == max_out || ni == max_in))) {
			cut = ni < max_in;
			break;
		}
		looked++;
		if (!kvt_copy_evictable(b, KVT_TIER_HBM) || kvt_hint_spares(e, b, KVT_TIER_HBM))
			continue;
		if (kvt_rot_member(e, b)) {
			if (ni < max_in)
				in[ni++] = id;
		} else if (no < max_out) {
			out[no++] = id;
		}
	}
	*n_out = no;
	*n_in = ni;
	return cut;
}

/* The first @max of @c[0..n) still evictable (earlier evictions took some), in order, in place:
 * what a walk made now would collect. */
static uint32_t
rot_live(struct kvt_engine *e, uint32_t *c, uint32_t n, uint32_t max)
{
	uint32_t i, k = 0;

	for (i = 0; i < n && k < max; i++)
		if (kvt_copy_evictable(kvt_blk(e, c[i]), KVT_TIER_HBM))
			c[k++] = c[i];
	return k;
}

/*
 * HBM under the rotation's order (engine/hint.c): blocks outside the rotation (LRU, clean ones
 * first, dirty ones too: an idle block's demotion costs less than a block the cycle will need),
 * then the rotation's, furthest next use first, then the rest (LRU, the next needed last).
 * Within the rotation clean copies go first. A dirty one's slot is free only once its demotion
 * has landed, so a caller that cannot wait (a hint) takes a clean copy of the rest before it;
 * one that can (prepare, append) takes the dirty one first (Belady's choice).
 * @cand holds 4 * @limit entries; one walk of the list collects both groups (rot_collect).
 */
static void
reclaim_rot(struct kvt_engine *e, uint32_t *cand, uint32_t limit, uint32_t need, bool may_wait,
	    bool full, bool *below_full, int *progress)
{
	struct kvt_slots *sl = &e->slots[KVT_TIER_HBM];
	uint32_t n, *rot = cand + limit, *rest = cand + 2 * limit, n_rot, n_rest, unused;
	bool cut;

#define ROT_DONE() (sl->n_free + e->demoting[KVT_TIER_HBM] >= need)
	/* the rest: up to 2 * limit, as the rotation's own victims may take some first */
	cut = rot_collect(e, cand, limit, &n, rest, 2 * limit, &n_rest, limit + RECLAIM_SCAN_MAX);
	reclaim_evict(e, KVT_TIER_HBM, cand, n, need, may_wait, true, below_full, progress);
	reclaim_evict(e, KVT_TIER_HBM, cand, n, need, may_wait, false, below_full, progress);
	if (ROT_DONE() || e->bg_reclaim)
		return;
	n_rot = kvt_rot_victims(e, rot, limit);
	reclaim_evict(e, KVT_TIER_HBM, rot, n_rot, need, may_wait, true, below_full, progress);
	if (ROT_DONE())
		return;
	if (cut) /* rare: the blocks outside the rotation did not do; the rest, all of it */
		(void)rot_collect(e, NULL, 0, &unused, rest, 2 * limit, &n_rest, UINT32_MAX);
	if (!may_wait) {
		n_rest = rot_live(e, rest, n_rest, limit);
		reclaim_evict(e, KVT_TIER_HBM, rest, n_rest, need, may_wait, true, below_full,
			      progress);
		if (ROT_DONE())
			return;
	}
	reclaim_evict(e, KVT_TIER_HBM, rot, n_rot, need, may_wait, false, below_full, progress);
	if (ROT_DONE())
		return;
	n_rest = rot_live(e, rest, n_rest, limit);
	reclaim_ranked(e, KVT_TIER_HBM, rest, n_rest, need, may_wait, full, below_full, progress);
#undef ROT_DONE
}

/*
 * One pass over the tier's LRU from the cold end (in HBM, once hints are in use: the rotation's
 * order, see engine/hint.c). Candidates are collected first (evicting
 * changes the list being walked). Clean copies go first (CFLRU: dropping one is free, while a
 * dirty one costs a demotion now and a promotion when it is next used, the fate of every
 * sequence's growing last block under plain LRU); dirty ones are demoted only when the window
 * looked at holds too few clean ones; under a policy that ranks its victims (priorities) this
 * holds within each class only, see reclaim_ranked(). (A tier left full of dirty blocks needs
 * room below for every eviction; when the batch's own blocks fill that room, prepare breaks the cycle, see
 * batch_break_cycle() in batch.c.) A victim that cannot go (its demotion finds no room
 * below) is skipped rather than a reason to give up; after the first such refusal only clean
 * copies are tried (the tier below is full: asking again for every dirty victim would cost
 * O(this tier x tier below)). The first window looks only a little past the deficit; when that
 * is not enough, at most RECLAIM_SCAN_MAX more candidates are collected, so one call is bounded
 * whatever the tier's size (entries that cannot go, pinned or spared by a hint, aside).
 */
static int
reclaim_pass(struct kvt_engine *e, int tier, uint32_t need, bool may_wait, int *progress)
{
	struct kvt_slots *sl = &e->slots[tier];
	struct kvt_evict *ev = &e->evict[tier];
	uint32_t stackc[40], *cand, n, cap, limit, deficit = need - sl->n_free - e->demoting[tier];
	bool full = false, below_full = false, rot;
	int rc;

	/* a policy that ranks its victims (priorities) keeps its own order */
	rot = tier == KVT_TIER_HBM && e->rel_ring &&
	      !(ev->ops->abi_version >= KVT_EVICT_OPS_V3 && ev->ops->rank);

	limit = deficit + 8;
	for (;;) {
		if (limit >= ev->n || limit >= deficit + RECLAIM_SCAN_MAX) {
			limit = ev->n < deficit + RECLAIM_SCAN_MAX ? ev->n : deficit + RECLAIM_SCAN_MAX;
			full = true;
		}
		/* the common case (one slot wanted) needs no allocation on the decode path */
		cap = rot ? 4 * limit : limit;
		cand = cap <= 40 ? stackc : kvt_malloc((size_t)cap * sizeof *cand);
		if (!cand)
			return kvt_err(-ENOMEM, "eviction candidates");
		if (rot) {
			reclaim_rot(e, cand, limit, need, may_wait, full, &below_full, progress);
		} else {
			n = reclaim_collect(e, tier, cand, limit);
			reclaim_ranked(e, tier, cand, n, need, may_wait, full, &below_full,
				       progress);
		}
		if (cand != stackc)
			kvt_free(cand);
		if (full || sl->n_free + e->demoting[tier] >= need)
			break;
		limit = deficit + RECLAIM_SCAN_MAX; /* not enough near the tail: look further */
	}
	/* the demotions start now; promotions collected by the caller stay one batch */
	rc = kvt_xfer_flush_down(e);
	return rc;
}

/*
 * The filesystem said ENOSPC to an NVMe write (a thin or copy-on-write volume; the slots were
 * reserved with fallocate, so only such filesystems do): demote less and give space back.
 * Background demotion to NVMe pauses for a while, and clean NVMe copies (valid in another tier)
 * are dropped, coldest first, with their slots' space punched out of the file. Dirty copies and
 * stored sessions stay: nothing referenced is lost; a block that can go nowhere makes its
 * operation fail with -ENOSPC.
 */
void
kvt_nvme_enospc(struct kvt_engine *e)
{
	struct kvt_evict *ev = &e->evict[KVT_TIER_NVME];
	uint32_t cand[KVT_ENOSPC_DROP], n = 0, id;
	uint64_t now = kvt_now_ns();
	bool quiet = e->nvme_backoff_until > now; /* said so already in this episode */

	e->nvme_backoff_until = now + KVT_ENOSPC_BACKOFF_NS;
	for (id = ev->ops->victim_first(ev); id != KVT_NIL && n < KVT_ENOSPC_DROP;
	     id = ev->ops->victim_next(ev, id))
		if (kvt_copy_evictable(kvt_blk(e, id), KVT_TIER_NVME) &&
		    valid_elsewhere(kvt_blk(e, id), KVT_TIER_NVME))
			cand[n++] = id;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t slot = kvt_blk(e, cand[i])->slot[KVT_TIER_NVME];

		kvt_copy_evict(e, cand[i], KVT_TIER_NVME);
		/* a slot a published record still names keeps its data (restorable after a
		 * crash); it is punched never, the others now */
		if (!kvt_persist_named(e, KVT_TIER_NVME, slot))
			kvt_nvme_punch(e->nvme, slot);
	}
	if (!quiet || n)
		kvt_engine_log(e, KVT_LOG_WARN, "NVMe write refused for lack of space: %u clean "
			       "NVMe copies dropped, background demotion to NVMe paused", n);
}

static int
reclaim_run(struct kvt_engine *e, int tier, uint32_t need, bool may_wait)
{
	struct kvt_slots *sl = &e->slots[tier];
	int rc, progress;

	/* NVMe slots promised to parks' blocks on their way down are not for others */
	if (tier == KVT_TIER_NVME)
		need += e->nvme_promised;
	if (need > sl->n_slots)
		return -ENOSPC;
	for (;;) {
		if (sl->n_free >= need)
			return 0;
		progress = 0;
		if (sl->n_free + e->demoting[tier] < need) {
			rc = reclaim_pass(e, tier, need, may_wait, &progress);
			if (rc)
				return rc;
		}
		if (sl->n_free >= need)
			return 0;
		/* nothing to evict now: if transfers are in flight, their completions may make
		 * copies evictable (an H2D that lands makes its HOST copy a clean duplicate), so
		 * a caller that may wait waits for them before calling the tier full */
		if (!progress && !e->demoting[tier] && (!may_wait || !kvt_xfer_inflight(e))) {
			/* a full NVMe tier gives up restorable stored sessions, oldest first */
			if (tier == KVT_TIER_NVME && kvt_persist_reclaim(e, need - sl->n_free) > 0)
				continue;
			return -ENOSPC;
		}
		if (!may_wait)
			return -EAGAIN;
		rc = kvt_xfer_wait_any(e);
		if (rc < 0)
			return rc;
	}
}

/*
 * Blocks announced by hints (engine/hint.c) are spared; a caller that must have room now
 * (may_wait: prepare, append, park) takes them as a last resort rather than fail.
 */
int
kvt_reclaim(struct kvt_engine *e, int tier, uint32_t need, bool may_wait)
{
	int rc = reclaim_run(e, tier, need, may_wait);

	if (rc == -ENOSPC && may_wait && !e->evict_hinted) {
		e->evict_hinted = true;
		rc = reclaim_run(e, tier, need, may_wait);
		e->evict_hinted = false;
	}
	return rc;
}

/**
 * kvt_reclaim_for() - before promoting the blocks @ids[0..n) into @tier (HBM or HOST) one by
 * one, make room for all those that are valid one tier down in one pass (no waiting): clean copies go at once and every dirty victim's
 * demotion starts together, instead of one demotion per block, each blocking the next block's
 * room until it lands. Best effort; the per-block reclaim that follows does the rest.
 */
void
kvt_reclaim_for(struct kvt_engine *e, int tier, const uint32_t *ids, uint32_t n)
{
	uint32_t i, want = 0;

	for (i = 0; i < n; i++) {
		const struct kvt_block *b;

		if (ids[i] == KVT_NIL)
			continue; /* a hole of a windowed sequence (engine/window.c) */
		b = kvt_blk(e, ids[i]);
		/* only blocks that can go up now: one still below @tier + 1 would hold its slot
		 * idle, and making room for it early can take the room its own read needs */
		if (!b->lost && kvt_copy_state(b, tier) == KVT_COPY_ABSENT &&
		    kvt_copy_valid(b, tier + 1))
			want++;
	}
	if (want > e->slots[tier].n_slots)
		want = e->slots[tier].n_slots;
	if (want > e->slots[tier].n_free)
		(void)kvt_reclaim(e, tier, want, false);
}

uint32_t
kvt_room_clean(struct kvt_engine *e, int tier, uint32_t want,
	       bool (*spare)(const struct kvt_engine *e, uint32_t id, void *arg), void *arg)
{
	struct kvt_slots *sl = &e->slots[tier];
	struct kvt_evict *ev = &e->evict[tier];
	uint32_t cand[KVT_ROOM_CLEAN_MAX], nc = 0, seen = 0, need;

	if (want > KVT_ROOM_CLEAN_MAX)
		want = KVT_ROOM_CLEAN_MAX;
	if (sl->n_free >= want)
		return want;
	need = want - sl->n_free;
	for (uint32_t id = ev->ops->victim_first(ev); id != KVT_NIL && nc < need &&
	     seen < want + 64; id = ev->ops->victim_next(ev, id), seen++) {
		const struct kvt_block *b = kvt_blk(e, id);

		if (kvt_copy_evictable(b, tier) && valid_elsewhere(b, tier) &&
		    !kvt_hint_spares(e, b, tier) && !(spare && spare(e, id, arg)))
			cand[nc++] = id; /* collected first: evicting changes the list walked */
	}
	for (uint32_t i = 0; i < nc; i++)
		kvt_copy_evict(e, cand[i], tier);
	return sl->n_free < want ? sl->n_free : want;
}

int
kvt_room_for_copy(struct kvt_engine *e, uint32_t id, int src, int dst, bool may_wait)
{
	int rc = kvt_reclaim(e, dst, 1, may_wait);
	const struct kvt_block *b = kvt_blk(e, id);

	/* a wait released the lock: another thread may have made (or started) that copy, or
	 * the source copy may have gone */
	if (rc == 0 && (kvt_copy_state(b, dst) != KVT_COPY_ABSENT || !kvt_copy_valid(b, src)))
		return 1;
	return rc;
}

int
kvt_promote_from_host(struct kvt_engine *e, uint32_t id, bool may_wait)
{
	uint8_t was = kvt_blk(e, id)->protect;
	uint32_t slot;
	int rc;

	/* its HOST copy is about to be read: the cascade must not drop it, even where a valid
	 * NVMe copy would make it droppable for a pinned block (kvt_copy_evictable) */
	kvt_blk(e, id)->protect = 1;
	rc = kvt_reclaim(e, KVT_TIER_HBM, 1, may_wait);
	kvt_blk(e, id)->protect = was;
	/* a wait released the lock: another thread may have promoted it meanwhile (done), or
	 * its HOST copy gone (-EAGAIN: look again) */
	if (rc == 0 && kvt_copy_state(kvt_blk(e, id), KVT_TIER_HBM) != KVT_COPY_ABSENT)
		return 0;
	if (rc == 0 && !kvt_copy_valid(kvt_blk(e, id), KVT_TIER_HOST))
		return -EAGAIN;
	if (rc == 0)
		rc = kvt_slot_alloc(e, KVT_TIER_HBM, id, &slot);
	if (rc == 0)
		rc = kvt_xfer_h2d(e, id, slot);
	if (rc == 0)
		kvt_promo_note(e, id);
	return rc;
}

int
kvt_promote_hbm(struct kvt_engine *e, uint32_t id, bool may_wait)
{
	struct kvt_block *b = kvt_blk(e, id);
	uint32_t slot;
	int rc = 0;

	kvt_block_pin(e, id); /* the lookup pins it: scenario (c) of the v0 issue */
	kvt_blk(e, id)->wanted = 1; /* a demotion still in flight keeps its HBM copy */
	for (;;) {
		b = kvt_blk(e, id);
		if (b->lost) {
			rc = KVT_ELOST;
			break;
		}
		if (kvt_copy_state(b, KVT_TIER_HBM) != KVT_COPY_ABSENT)
			break;
		if (kvt_copy_valid(b, KVT_TIER_HOST)) {
			rc = kvt_promote_from_host(e, id, may_wait);
			if (rc == -EAGAIN && may_wait)
				continue; /* its HOST copy went while the lock was released */
			break;
		}
		if (kvt_copy_state(b, KVT_TIER_HOST) == KVT_COPY_INFLIGHT) {
			/* an NVMe read (or a demotion) into HOST is under way */
			if (!may_wait) {
				rc = -EAGAIN;
				break;
			}
			rc = kvt_xfer_wait_any(e);
			if (rc < 0)
				break;
			continue;
		}
		if (kvt_copy_valid(b, KVT_TIER_NVME)) {
			rc = kvt_room_for_copy(e, id, KVT_TIER_NVME, KVT_TIER_HOST, may_wait);
			if (rc == 1)
				continue; /* another thread's read may be under way */
			if (rc == 0)
				rc = kvt_slot_alloc(e, KVT_TIER_HOST, id, &slot);
			if (rc == 0)
				rc = kvt_xfer_n2h(e, id, slot, true, may_wait);
			if (rc || !may_wait)
				break;
			continue;
		}
		kvt_block_check_lost(e, id);
		rc = kvt_blk(e, id)->lost ? KVT_ELOST : -ENOSPC;
		break;
	}
	kvt_block_unpin(e, id);
	return rc;
}

int
kvt_demote_to(struct kvt_engine *e, uint32_t id, int target, bool may_wait)
{
	struct kvt_block *b;
	uint32_t slot, kept;
	int rc = 0, t;

	while (kvt_blk(e, id)->busy) {
		if (!may_wait)
			return -EAGAIN;
		rc = kvt_xfer_wait_any(e);
		if (rc < 0)
			return rc;
	}
	b = kvt_blk(e, id);
	if (b->pins)
		return KVT_EBUSY;
	b->wanted = 0; /* parked: its demotion goes all the way */
	if (kvt_copy_valid(b, target) ||
	    (target == KVT_TIER_HOST && kvt_copy_valid(b, KVT_TIER_NVME))) {
		/* already safe at or below the target: drop what is above it */
		for (t = 0; t < target; t++)
			kvt_copy_drop(e, id, t);
		return 0;
	}
	if (target == KVT_TIER_NVME && kvt_copy_valid(b, KVT_TIER_HOST)) {
		kvt_copy_drop(e, id, KVT_TIER_HBM);
		kvt_block_pin(e, id);
		rc = kvt_room_for_copy(e, id, KVT_TIER_HOST, KVT_TIER_NVME, may_wait);
		if (rc == 1) {
			/* another thread started (or undid) the same demotion meanwhile: it goes
			 * on from there */
			kvt_block_unpin(e, id);
			return 0;
		}
		if (rc == 0)
			rc = kvt_slot_alloc(e, KVT_TIER_NVME, id, &slot);
		if (rc == 0)
			rc = kvt_xfer_h2n(e, id, slot, true, may_wait);
		kvt_block_unpin(e, id);
		return rc;
	}
	if (!kvt_copy_valid(b, KVT_TIER_HBM))
		return 0; /* nothing to demote (an empty block) */
	kvt_block_pin(e, id);
	rc = kvt_room_for_copy(e, id, KVT_TIER_HBM, KVT_TIER_HOST, may_wait);
	if (rc == 1) {
		/* as above: the demotion may have been started by another thread meanwhile */
		kvt_block_unpin(e, id);
		return 0;
	}
	if (rc == 0)
		rc = kvt_slot_alloc_d2h(e, id, &slot, &kept);
	if (rc == 0)
		rc = kvt_xfer_d2h(e, id, slot, kept, true, target == KVT_TIER_NVME);
	if (rc == 0 && target == KVT_TIER_NVME && e->slots[KVT_TIER_NVME].n_slots)
		e->nvme_promised++; /* its NVMe slot stays free until the copy lands */
	kvt_block_unpin(e, id);
	return rc;
}

/*
 * Under the rotation (engine/hint.c), HBM over its high watermark: write back (the HBM copy
 * stays) the dirty copies among the first @want victims the rotation's order would take, so
 * that when a hint's reclaim takes them, which cannot wait, their slots are free at once
 * instead of after a demotion. They are the blocks of the sequences released last (each
 * session's growing block, written by its append), whose next use is a cycle away; evicting
 * them now instead (background demotion's way) would lose them when the same sequence is
 * prepared again at once (a caller that prepares once per layer). At most KVT_ROT_WB per call.
 */
#define KVT_ROT_WB 16u
static void
rot_writeback(struct kvt_engine *e, uint32_t want)
{
	uint32_t ids[KVT_ROT_WB], n, i, slot, kept;
	int rc;

	n = kvt_rot_victims(e, ids, want < KVT_ROT_WB ? want : KVT_ROT_WB);
	for (i = 0; i < n; i++) {
		struct kvt_block *b = kvt_blk(e, ids[i]);

		if (b->busy || valid_elsewhere(b, KVT_TIER_HBM) ||
		    kvt_copy_state(b, KVT_TIER_HOST) != KVT_COPY_ABSENT ||
		    !kvt_copy_valid(b, KVT_TIER_HBM))
			continue; /* clean already, or on its way */
		kvt_block_pin(e, ids[i]); /* the cascade below must not pick it */
		rc = kvt_room_for_copy(e, ids[i], KVT_TIER_HBM, KVT_TIER_HOST, false);
		if (rc == 0)
			rc = kvt_slot_alloc_d2h(e, ids[i], &slot, &kept);
		if (rc == 0)
			rc = kvt_xfer_d2h(e, ids[i], slot, kept, false, false);
		kvt_block_unpin(e, ids[i]);
		if (rc < 0)
			break; /* HOST has no room without waiting: the demotion will wait */
	}
}

void
kvt_watermarks(struct kvt_engine *e)
{
	int t;

	if (e->n_budgets)
		kvt_tenant_enforce(e);
	for (t = KVT_TIER_HBM; t < KVT_TIER_NVME; t++) {
		struct kvt_slots *sl = &e->slots[t];
		uint32_t used = sl->n_slots - sl->n_free;
		uint32_t want_free;

		if (!sl->n_slots || used <= (uint32_t)(e->opts.high_watermark * sl->n_slots))
			continue;
		if (t == KVT_TIER_HOST && e->nvme_backoff_until > kvt_now_ns())
			continue; /* the disk said ENOSPC lately: demote less */
		want_free = sl->n_slots - (uint32_t)(e->opts.low_watermark * sl->n_slots);
		/* background: no waiting; completions free the slots later */
		e->bg_reclaim = true;
		(void)kvt_reclaim(e, t, want_free, false);
		e->bg_reclaim = false;
		if (t == KVT_TIER_HBM && e->rel_ring &&
		    !(e->evict[t].ops->abi_version >= KVT_EVICT_OPS_V3 && e->evict[t].ops->rank))
			rot_writeback(e, want_free);
	}
}
