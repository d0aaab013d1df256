/* SPDX-License-Identifier: MIT */
/*
 * engine/check.c - kvt_engine_check(): walk every block, slot, list and counter and verify
 * that they agree (SQLite's pcache asserts, jemalloc's debug walks). Used by the tests after
 * every scenario, including under fault injection.
 */
#include <errno.h>

#include "engine_impl.h"

/* The free list threaded through the slot entries and the shadows (tiers/slots.h): n_free
 * distinct free slots between them (a shadow is never on the list too), then the list's end,
 * and n_shadow shadow entries each on its owner's place. */
static int
check_free_list(const struct kvt_slots *sl)
{
	uint32_t s = sl->head, n = 0, n_sh = 0, i;
	uint64_t *seen = kvt_calloc(((size_t)sl->n_slots + 63) / 64 + 1, sizeof *seen);
	int rc = 0;

	if (!seen)
		return -ENOMEM;
	for (; s != KVT_SLOTS_FREE && n <= sl->n_free && !rc; s = sl->ent[s], n++) {
		if (s >= sl->n_slots || kvt_slots_is_used(sl, s) || (seen[s / 64] >> (s % 64) & 1))
			rc = -EINVAL;
		else
			seen[s / 64] |= 1ull << (s % 64);
	}
	if (!rc && s != KVT_SLOTS_FREE)
		rc = -EINVAL;
	for (i = 0; sl->sh && i < KVT_SLOTS_SHADOWS && !rc; i++) {
		s = sl->sh[i].slot;
		if (s == KVT_SLOTS_FREE)
			continue;
		n_sh++;
		if (s >= sl->n_slots || kvt_slots_is_used(sl, s) || (seen[s / 64] >> (s % 64) & 1) ||
		    sl->sh[i].owner % KVT_SLOTS_SHADOWS != i || sl->sh[i].valid == 0)
			rc = -EINVAL;
		else
			seen[s / 64] |= 1ull << (s % 64);
	}
	if (!rc && (n_sh != sl->n_shadow || n + n_sh != sl->n_free))
		rc = -EINVAL;
	kvt_free(seen);
	return rc;
}

static int
check_tiers(struct kvt_engine *e)
{
	uint32_t s, used, id;
	int t;

	for (t = 0; t < KVT_TIER_COUNT; t++) {
		used = 0;
		for (s = 0; s < e->slots[t].n_slots; s++) {
			id = kvt_owner(e, t, s);
			if (id == KVT_NIL) {
				if (kvt_persist_named(e, t, s))
					return kvt_err(-EINVAL, "NVMe slot %u is free but a journal "
						       "record names it", s);
				continue;
			}
			used++;
			if (id == KVT_SLOT_QUARANTINED || id == KVT_SLOT_STORED ||
			    id == KVT_SLOT_PENDING)
				continue;
			if (id >= e->cap_blocks || !kvt_blk(e, id)->live)
				return kvt_err(-EINVAL, "tier %d slot %u owned by dead block %u", t, s,
					       id);
			if (kvt_blk(e, id)->slot[t] != s ||
			    kvt_copy_state(kvt_blk(e, id), t) == KVT_COPY_ABSENT)
				return kvt_err(-EINVAL, "tier %d slot %u: owner block %u points to "
					       "slot %u state %u", t, s, id, kvt_blk(e, id)->slot[t],
					       kvt_copy_state(kvt_blk(e, id), t));
		}
		if (used != e->slots[t].n_slots - e->slots[t].n_free)
			return kvt_err(-EINVAL, "tier %d: %u slots owned, allocator says %u", t,
				       used, e->slots[t].n_slots - e->slots[t].n_free);
		if (check_free_list(&e->slots[t]))
			return kvt_err(-EINVAL, "tier %d: free list broken", t);
	}
	return 0;
}

/* Each tier's eviction list, walked in victim order, gives every PRESENT copy once and nothing
 * else (its ids are live blocks owning the slot their key names). */
static int
check_lists(struct kvt_engine *e)
{
	uint32_t id, n, present;
	int t;

	for (t = 0; t < KVT_TIER_COUNT; t++) {
		struct kvt_evict *ev = &e->evict[t];

		present = 0;
		for (id = 0; id < e->cap_blocks; id++)
			present += kvt_blk(e, id)->live &&
				   kvt_copy_state(kvt_blk(e, id), t) == KVT_COPY_PRESENT;
		n = 0;
		for (id = ev->ops->victim_first(ev); id != KVT_NIL; id = ev->ops->victim_next(ev, id)) {
			if (id >= e->cap_blocks || !kvt_blk(e, id)->live ||
			    kvt_copy_state(kvt_blk(e, id), t) != KVT_COPY_PRESENT)
				return kvt_err(-EINVAL, "tier %d: eviction list holds %u, not a "
					       "present copy", t, id);
			if (++n > present)
				break;
		}
		if (n != present || ev->n != present)
			return kvt_err(-EINVAL, "tier %d: %u present copies, eviction list walks "
				       "%u and counts %u", t, present, n, ev->n);
	}
	return 0;
}

static int
check_blocks(struct kvt_engine *e)
{
	uint64_t busy = 0;
	uint32_t id, pinned = 0, live = 0;
	int t;

	for (id = 0; id < e->cap_blocks; id++) {
		struct kvt_block *b = kvt_blk(e, id);

		if (!b->live)
			continue;
		live++;
		busy += kvt_reng_fetching(e, id) ? 0 : b->busy; /* a REMOTE fetch is no transfer */
		pinned += b->pins > 0;
		if (b->dead && !b->busy && !b->pins)
			return kvt_err(-EINVAL, "block %u is dead and idle but not freed", id);
		for (t = 0; t < KVT_TIER_COUNT; t++) {
			bool listed = e->evict[t].ops->contains(&e->evict[t], id);

			if ((kvt_copy_state(b, t) == KVT_COPY_ABSENT) != (b->slot[t] == KVT_NIL))
				return kvt_err(-EINVAL, "block %u tier %d: state %u with slot %u", id,
					       t, kvt_copy_state(b, t), b->slot[t]);
			if (listed != (kvt_copy_state(b, t) == KVT_COPY_PRESENT))
				return kvt_err(-EINVAL, "block %u tier %d: state %u but %s the "
					       "eviction list", id, t, kvt_copy_state(b, t),
					       listed ? "on" : "not on");
			if (kvt_copy_state(b, t) != KVT_COPY_ABSENT &&
			    kvt_owner(e, t, b->slot[t]) != id)
				return kvt_err(-EINVAL, "block %u tier %d slot %u owned by %u", id, t,
					       b->slot[t], kvt_owner(e, t, b->slot[t]));
		}
	}
	if (busy != e->st.transfers_in_flight)
		return kvt_err(-EINVAL, "%llu transfers counted on blocks, %llu in flight",
			       (unsigned long long)busy,
			       (unsigned long long)e->st.transfers_in_flight);
	if (pinned != e->hbm_pinned)
		return kvt_err(-EINVAL, "%u blocks pinned, counter says %u", pinned, e->hbm_pinned);
	if (live != e->n_live_blocks)
		return kvt_err(-EINVAL, "%u live blocks, counter says %u", live, e->n_live_blocks);
	return 0;
}

/* The block the prefix index finds by @b's key (no token check). */
static uint32_t
check_key_block(struct kvt_engine *e, const struct kvt_block *b)
{
	uint64_t h[2];

	kvt_blk_key(b, h);
	return kvt_prefix_key_block(e, h);
}

/* Every block's refcount equals the sequences referencing it; unreferenced live blocks are
 * cached prefix blocks (in the index); shared_blocks counts blocks with refs > 1. */
static int
check_refs(struct kvt_engine *e)
{
	uint32_t *cnt = kvt_calloc(e->cap_blocks ? e->cap_blocks : 1, sizeof *cnt);
	uint32_t i, j, shared = 0;
	int rc = 0;

	if (!cnt)
		return kvt_err(-ENOMEM, "check: refcount array");
	for (i = 0; i < e->cap_seqs; i++)
		for (j = 0; e->seqs[i].open && j < e->seqs[i].n_blocks; j++)
			if (e->seqs[i].blocks[j] != KVT_NIL) /* a hole: out of the window */
				cnt[e->seqs[i].blocks[j]]++;
	for (i = 0; i < e->cap_blocks && !rc; i++) {
		struct kvt_block *b = kvt_blk(e, i);

		if (!b->live || b->dead)
			continue;
		shared += b->refs > 1;
		if (b->refs != cnt[i])
			rc = kvt_err(-EINVAL, "block %u: refcount %u, referenced by %u sequences", i,
				     b->refs, cnt[i]);
		else if (!b->refs && !b->indexed && b->seq != KVT_EXT_SEQ &&
			 !kvt_reng_fetching(e, i)) /* REMOTE fetch, external pool */
			rc = kvt_err(-EINVAL, "block %u: unreferenced but not a cached prefix block",
				     i);
		else if (b->indexed && check_key_block(e, b) != i)
			rc = kvt_err(-EINVAL, "block %u: marked indexed, the index says otherwise", i);
	}
	for (j = 0; !rc && j < e->n_budgets; j++) {
		int t;

		for (t = 0; t < KVT_TIER_COUNT && !rc; t++) {
			uint64_t n = 0;

			for (i = 0; i < e->slots[t].n_slots; i++)
				n += KVT_OWNER_IS_BLOCK(kvt_owner(e, t, i)) &&
				     kvt_blk(e, kvt_owner(e, t, i))->tslot == j + 1;
			if (n != e->budget[j].used[t])
				rc = kvt_err(-EINVAL, "tenant %u tier %d: %llu slots held, budget "
					     "counts %llu", e->budget[j].tenant, t,
					     (unsigned long long)n,
					     (unsigned long long)e->budget[j].used[t]);
		}
	}
	if (!rc && shared != e->st.shared_blocks)
		rc = kvt_err(-EINVAL, "%u shared blocks, counter says %llu", shared,
			     (unsigned long long)e->st.shared_blocks);
	kvt_free(cnt);
	return rc;
}

static int
check_seqs(struct kvt_engine *e)
{
	uint32_t i, j, tpb = e->layout.tokens_per_block, open = 0, live;

	for (i = 0; i < e->cap_seqs; i++) {
		struct kvt_seqrec *s = &e->seqs[i];

		if (!s->open)
			continue;
		open++;
		if (s->n_blocks != (s->n_tokens + tpb - 1) / tpb)
			return kvt_err(-EINVAL, "sequence %u: %llu tokens in %u blocks", i,
				       (unsigned long long)s->n_tokens, s->n_blocks);
		live = kvt_seq_first_live(e, s);
		if (live > kvt_win_sink_blocks(e) && !e->win_tokens)
			return kvt_err(-EINVAL, "sequence %u has holes without a window", i);
		for (j = 0; j < s->n_blocks; j++) {
			struct kvt_block *b;
			/* holes are exactly [sink blocks, first_live) (engine/window.c) */
			bool hole = j >= kvt_win_sink_blocks(e) && j < live;

			if (hole != (s->blocks[j] == KVT_NIL))
				return kvt_err(-EINVAL, "sequence %u block %u: %s, its window says "
					       "otherwise (first live %u, %u sink blocks)", i, j,
					       hole ? "live" : "a hole", live,
					       kvt_win_sink_blocks(e));
			if (hole)
				continue;
			b = kvt_blk(e, s->blocks[j]);
			if (!b->live || b->dead || b->index != j || !b->refs)
				return kvt_err(-EINVAL, "sequence %u block %u (id %u) does not belong "
					       "to it", i, j, s->blocks[j]);
		}
	}
	if (open != e->n_open_seqs)
		return kvt_err(-EINVAL, "%u open sequences, counter says %u", open, e->n_open_seqs);
	return check_refs(e);
}

/* Every index entry names a live indexed block; a borrowed entry's creator sequence is open
 * and still holds the block where b->index says (so its tokens are there); owned entries use
 * distinct pool entries, and pool entries are either owned or free. */
static int
check_prefix(struct kvt_engine *e)
{
	const struct kvt_prefix *p = &e->prefix;
	uint64_t i, n = 0, owned = 0;

	uint32_t k, nfree = 0;

	for (i = 0; i < p->cap; i++) {
		uint32_t v = p->tab[i], id, tok = KVT_NIL;
		const struct kvt_block *b;
		const struct kvt_seqrec *s;

		if (v >= KVT_PFX_TOMB)
			continue;
		n++;
		if (v & KVT_PFX_OWNED) {
			tok = v & ~KVT_PFX_OWNED;
			if (tok >= p->pool_cap)
				return kvt_err(-EINVAL, "prefix entry %llu: token pool entry %u of "
					       "%u", (unsigned long long)i, tok, p->pool_cap);
		}
		id = kvt_pentry_block(p, v);
		b = id < e->cap_blocks ? kvt_blk(e, id) : NULL;
		if (!b || !b->live || !b->indexed)
			return kvt_err(-EINVAL, "prefix entry %llu: block %u is not a live indexed "
				       "block", (unsigned long long)i, id);
		if (tok != KVT_NIL) {
			owned++;
			continue;
		}
		s = b->seq < e->cap_seqs ? &e->seqs[b->seq] : NULL;
		if (!s || !s->open || b->index >= s->n_blocks || s->blocks[b->index] != id)
			return kvt_err(-EINVAL, "prefix entry of block %u borrows the tokens of "
				       "sequence %u, which does not hold it", id, b->seq);
	}
	/* the free pool entries: a list of n_pool_free distinct entries */
	for (k = p->pool_free; k != KVT_NIL && nfree <= p->n_pool_free; k = p->pool_block[k]) {
		if (k >= p->pool_cap)
			return kvt_err(-EINVAL, "free token pool entry %u of %u", k, p->pool_cap);
		nfree++;
	}
	if (nfree != p->n_pool_free)
		return kvt_err(-EINVAL, "token pool: %u entries on the free list, counter %u",
			       nfree, p->n_pool_free);
	if (n != p->n || owned != p->owned || owned + p->n_pool_free != p->pool_cap)
		return kvt_err(-EINVAL, "prefix index: %llu entries (counter %llu), %llu owning "
			       "tokens (counter %llu), %u free of %u pool entries",
			       (unsigned long long)n, (unsigned long long)p->n,
			       (unsigned long long)owned, (unsigned long long)p->owned,
			       p->n_pool_free, p->pool_cap);
	return 0;
}

int
kvt_engine_check(struct kvt_engine *e)
{
	int rc;

	if (e->grp) /* a grouped engine's front holds no tiers: each pool's */
		return kvt_grp_check(e);
	kvt_lock(e);
	rc = check_tiers(e);
	if (!rc)
		rc = check_blocks(e);
	if (!rc)
		rc = check_lists(e);
	if (!rc)
		rc = check_seqs(e);
	if (!rc)
		rc = check_prefix(e);
	kvt_unlock(e);
	return rc;
}
