/* SPDX-License-Identifier: MIT */
/*
 * engine/hint.c - schedule hints: the server announces which sequences (or windows of them) the
 * next batches will hold, and the engine starts their promotions at once, so that the copies
 * overlap the compute of the current step.
 *
 * A hint records, per sequence, the announced block range and the hint's number (e->hint_seq),
 * and stamps that number on every block of the range (shared prefix blocks included, whichever
 * sequence created them). Until a batch prepared after the hint is released (or the sequence is
 * parked, closed or truncated), reclaim spares the stamped blocks' copies in HBM and HOST:
 * making room for one announced batch never evicts another's blocks, nor those of the batches
 * running now (they are pinned). Announcements are a
 * forecast: a caller that must have room now (prepare, append: may_wait) evicts hinted blocks as
 * a last resort rather than fail.
 *
 * Promotions: steps_ahead 0 or 1 brings the blocks to HBM (NVMe reads first, continuing up when
 * they land; HOST copies go up as one batched copy per layer group, in layer order); steps_ahead
 * >= 2 only stages NVMe-only blocks in HOST, since HBM is better spent on the batches nearer in
 * time. Best effort: when a tier has no evictable room without waiting, the rest is left to the
 * prepare that follows. All of it is counted as prefetched bytes (engine/stats.c).
 *
 * The rotation: a server that hints runs its sessions in a cycle (every decode step holds the
 * active sessions in the same order), and under a cyclic schedule the block whose next use is
 * furthest is the one used last (Belady), the opposite of LRU's choice. From the first hint on,
 * the engine remembers the order of batch releases per sequence (s->rel_no, e->rel_ring) and
 * where steps begin (a step ends when a sequence released in it is prepared again); making room
 * in HBM then takes (1) blocks of sequences outside the rotation (not used in this step or the
 * previous one), least recently used first; (2) blocks of the rotation, the sequence released
 * last first and its last block first; (3) anything else evictable, LRU. What (2) leaves alone
 * is a resident set that the cycle never moves: each step promotes only what the streaming
 * window (the batch computing and the one announced) cannot leave in place.
 */
#include <errno.h>
#include <string.h>

#include "engine_impl.h"

#define HINT_MAX_RANGES 65536u /* as kvt_batch_prepare */

/**
 * kvt_hint_spares() - whether reclaim must leave @b's copy in @tier alone because a hint
 * announced the block for a coming batch: the hint stamps the block itself, so a shared prefix
 * block is spared for every sequence that announces it, whoever created it. Only the copy
 * the block will be served from is spared: once it is valid in HBM, its HOST copy is a clean
 * duplicate and goes like any other (else HOST, the staging tier, fills with such duplicates
 * and the blocks still on NVMe cannot come up). Requires e->lock.
 */
bool
kvt_hint_spares(const struct kvt_engine *e, const struct kvt_block *b, int tier)
{
	if (e->evict_hinted || tier == KVT_TIER_NVME || b->hint_no == 0)
		return false;
	return !(tier == KVT_TIER_HOST && kvt_copy_valid(b, KVT_TIER_HBM));
}

/**
 * kvt_hint_drop() - @s's hint no longer holds: unstamp the blocks of its range that carry its
 * number (a later hint of another sequence holding the same block keeps its stamp). Requires
 * e->lock.
 */
void
kvt_hint_drop(struct kvt_engine *e, struct kvt_seqrec *s)
{
	uint32_t j, end = s->hint_end < s->n_blocks ? s->hint_end : s->n_blocks;

	if (!s->hint_no)
		return;
	for (j = s->hint_first; j < end; j++)
		if (s->blocks[j] != KVT_NIL && /* a hole: out of the window */
		    kvt_blk(e, s->blocks[j])->hint_no == kvt_hint_stamp(s->hint_no))
			kvt_blk(e, s->blocks[j])->hint_no = 0;
	s->hint_no = 0;
}

/**
 * kvt_hint_end() - a batch holding @s, prepared when e->hint_seq was @mark, is released: a hint
 * given before that prepare has been served and ends; a later one (for the next step) stays.
 */
void
kvt_hint_end(struct kvt_engine *e, struct kvt_seqrec *s, uint64_t mark)
{
	if (s->hint_no && s->hint_no <= mark)
		kvt_hint_drop(e, s);
}

/**
 * kvt_rot_continues() - whether a batch of the sequences @seqidx[0..n) continues their turn:
 * each was released before and the latest n releases are theirs (their n distinct release
 * numbers fill [rel_next - n + 1, rel_next]). A caller that prepares a sequence once per layer
 * (or once more for the block its append writes) releases and prepares the same sequences
 * back to back; that is one turn of the rotation, not a new step. Requires e->lock.
 */
bool
kvt_rot_continues(const struct kvt_engine *e, const uint32_t *seqidx, uint32_t n)
{
	uint32_t i, lo = UINT32_MAX;

	if (!e->rel_ring || n == 0 || e->rel_next < n)
		return false;
	for (i = 0; i < n; i++) {
		uint32_t r = e->seqs[seqidx[i]].rel_no;

		if (r == 0)
			return false;
		if (r < lo)
			lo = r;
	}
	return e->rel_next - lo + 1 == n;
}

/**
 * kvt_rot_prepared() - @s joins a batch being prepared; @whole: the batch holds every live
 * block of it; @cont: the batch continues its turn (kvt_rot_continues). A sequence released in
 * the current step comes round again: a new step begins. A continuing batch begins none, and a
 * partial one (the appended block alone) leaves the sequence's standing as its turn set it.
 * Requires e->lock.
 */
void
kvt_rot_prepared(struct kvt_engine *e, struct kvt_seqrec *s, bool whole, bool cont)
{
	if (!e->rel_ring)
		return;
	if (cont) {
		if (whole)
			s->rot_part = 0;
		return;
	}
	if (whole && s->rel_no > e->step_start && s->rel_no <= e->rel_next) {
		e->prev_step_start = e->step_start;
		e->step_start = e->rel_next;
	}
	s->rot_part = !whole;
}

/**
 * kvt_rot_released() - the batch holding @s (index @idx) is released: it is now the rotation's
 * most recently used sequence (@keep: it already is, a continuing batch's release). Requires
 * e->lock.
 */
void
kvt_rot_released(struct kvt_engine *e, struct kvt_seqrec *s, uint32_t idx, bool keep)
{
	if (!e->rel_ring || (keep && s->rel_no))
		return;
	if (e->rel_next == UINT32_MAX) { /* wrapped: forget the order, start again */
		e->rel_next = 0;
		e->step_start = e->prev_step_start = 0;
	}
	s->rel_no = ++e->rel_next;
	e->rel_ring[s->rel_no % KVT_REL_RING] = idx;
}

bool
kvt_rot_member(const struct kvt_engine *e, const struct kvt_block *b)
{
	const struct kvt_seqrec *s;

	if (!e->rel_ring)
		return false;
	if (b->refs > 1)
		return true; /* shared (a system prompt): the next sequence of the cycle may use it */
	if (b->seq >= e->cap_seqs)
		return false;
	s = &e->seqs[b->seq];
	if (!s->open)
		return b->refs > 0; /* its creator closed; the sequence holding it may be in it */
	return !s->rot_part && s->rel_no > e->prev_step_start && s->rel_no <= e->rel_next;
}

uint32_t
kvt_rot_victims(struct kvt_engine *e, uint32_t *out, uint32_t max)
{
	uint32_t r, low, n = 0, j, seen = 0;

	if (!e->rel_ring)
		return 0;
	low = e->rel_next > KVT_REL_RING ? e->rel_next - KVT_REL_RING : 0;
	if (low < e->prev_step_start)
		low = e->prev_step_start;
	/* an open sequence has one entry of its own (its latest release) and the ring's others
	 * are stale: past n_open_seqs of them nothing is left to find. (One sequence decoding by
	 * layer ranges releases once a layer and begins no step: a walk of the whole ring at each
	 * reclaim was 7% of a sparse decode's time.) */
	for (r = e->rel_next; r > low && n < max && seen < e->n_open_seqs; r--) {
		uint32_t idx = e->rel_ring[r % KVT_REL_RING];
		struct kvt_seqrec *s = idx < e->cap_seqs ? &e->seqs[idx] : NULL;

		if (!s || !s->open || s->rel_no != r)
			continue; /* a later release of it comes first */
		seen++;
		if (s->in_batch || s->rot_part)
			continue; /* it is in use */
		for (j = s->n_blocks; j > 0 && n < max; j--) {
			uint32_t id = s->blocks[j - 1];
			const struct kvt_block *b;

			if (id == KVT_NIL)
				continue; /* a hole: out of the window */
			b = kvt_blk(e, id);
			/* its own blocks only; a shared one is needed again within the cycle */
			if (b->seq == idx && b->refs <= 1 && kvt_copy_evictable(b, KVT_TIER_HBM) &&
			    !kvt_hint_spares(e, b, KVT_TIER_HBM))
				out[n++] = id;
		}
	}
	return n;
}

/* NVMe-only block: start its read into HOST (no waiting). */
static int
hint_stage(struct kvt_engine *e, uint32_t id)
{
	struct kvt_block *b = kvt_blk(e, id);
	uint32_t slot;
	int rc;

	if (b->lost || kvt_copy_state(b, KVT_TIER_HBM) != KVT_COPY_ABSENT ||
	    kvt_copy_state(b, KVT_TIER_HOST) != KVT_COPY_ABSENT ||
	    !kvt_copy_valid(b, KVT_TIER_NVME))
		return 0;
	kvt_block_pin(e, id); /* making room below must not pick it */
	rc = kvt_reclaim(e, KVT_TIER_HOST, 1, false);
	if (rc == 0)
		rc = kvt_slot_alloc(e, KVT_TIER_HOST, id, &slot);
	if (rc == 0)
		rc = kvt_xfer_n2h(e, id, slot, false, false);
	kvt_block_unpin(e, id);
	return rc;
}

/* Remember hinted block @id (no HBM room for it now) for kvt_hint_retry; the oldest entry
 * makes way when the list is full. */
static void
hint_defer(struct kvt_engine *e, uint32_t id)
{
	uint32_t i;

	for (i = 0; i < e->n_hint_defer; i++)
		if (e->hint_defer[i] == id)
			return;
	if (e->n_hint_defer == KVT_HINT_DEFER) {
		memmove(e->hint_defer, e->hint_defer + 1,
			(KVT_HINT_DEFER - 1) * sizeof e->hint_defer[0]);
		e->n_hint_defer--;
	}
	e->hint_defer[e->n_hint_defer++] = id;
}

/* A clean HBM copy of the rotation that may go now (its next use is furthest: Belady), or
 * KVT_NIL. */
static uint32_t
retry_victim(struct kvt_engine *e)
{
	uint32_t ids[16], n, i;

	n = kvt_rot_victims(e, ids, 16);
	for (i = 0; i < n; i++) {
		const struct kvt_block *b = kvt_blk(e, ids[i]);

		if (!b->busy && (kvt_copy_valid(b, KVT_TIER_HOST) || kvt_copy_valid(b, KVT_TIER_NVME)))
			return ids[i];
	}
	return KVT_NIL;
}

/**
 * kvt_hint_retry() - promote the hinted blocks that found no HBM room at their hint (the victim
 * a hint would take was dirty, its demotion not landed, or every copy was spared), in the order
 * they were hinted, while their hint holds. Room is a free slot or a clean copy of the rotation
 * (dropped: it costs nothing), never a demotion or a wait; the sequences in a batch are not the
 * rotation's victims, so the caller's current batch keeps its blocks. Called after a prepare
 * and at layer waits, i.e. while the current batch computes: a server that gives its hints
 * before a batch and prepares only once per step sees the copy start at its next call instead of
 * at the next batch's prepare. Requires e->lock.
 */
void
kvt_hint_retry(struct kvt_engine *e)
{
	struct kvt_slots *sl = &e->slots[KVT_TIER_HBM];
	uint32_t i, k = 0;
	bool was = e->prefetching, issued = false;

	if (!e->n_hint_defer)
		return;
	e->prefetching = true;
	for (i = 0; i < e->n_hint_defer; i++) {
		uint32_t id = e->hint_defer[i], v;
		struct kvt_block *b = kvt_blk(e, id);

		if (!b->live || b->dead || b->lost || b->hint_no == 0 ||
		    kvt_copy_state(b, KVT_TIER_HBM) != KVT_COPY_ABSENT ||
		    !kvt_copy_valid(b, KVT_TIER_HOST))
			continue; /* gone, no longer announced, on its way, or not staged yet */
		if (sl->n_free == 0 && (v = retry_victim(e)) != KVT_NIL)
			kvt_copy_evict(e, v, KVT_TIER_HBM);
		if (sl->n_free == 0 || kvt_promote_hbm(e, id, false) != 0) {
			e->hint_defer[k++] = id; /* still waiting for room */
			continue;
		}
		issued = true;
	}
	e->n_hint_defer = k;
	e->prefetching = was;
	if (issued)
		(void)kvt_xfer_flush(e);
}

/* Check the ranges; *hbm_blocks receives the blocks they cover. */
static int
hint_check(struct kvt_engine *e, const struct kvt_seq_range *r, size_t n, uint64_t *hbm_blocks)
{
	uint64_t sum = 0;
	size_t i;

	for (i = 0; i < n; i++) {
		struct kvt_seqrec *s = kvt_seq_lookup(e, r[i].seq, NULL);

		if (!s)
			return kvt_err(KVT_ECLOSED, "hint entry %zu: sequence %#llx is not open", i,
				       (unsigned long long)r[i].seq);
		if (s->n_blocks == 0 && r[i].first_block == 0 && r[i].n_blocks == 0)
			continue; /* nothing stored yet: nothing to bring */
		if (r[i].first_block >= s->n_blocks ||
		    (uint64_t)r[i].first_block + r[i].n_blocks > s->n_blocks)
			return kvt_err(-EINVAL, "hint entry %zu: blocks [%u, +%u) past the end "
				       "of the sequence (%u blocks)", i, r[i].first_block,
				       r[i].n_blocks, s->n_blocks);
		sum += kvt_seq_live_in(e, s, r[i].first_block, r[i].n_blocks ?
				       r[i].first_block + r[i].n_blocks : s->n_blocks);
	}
	*hbm_blocks = sum;
	return 0;
}

/* Record the hint and start the promotions, in range order. */
static int
hint_apply(struct kvt_engine *e, const struct kvt_seq_range *r, size_t n, uint32_t steps_ahead)
{
	bool to_hbm = steps_ahead <= 1;
	size_t i;
	uint32_t j, end;
	int rc = 0;

	/* copies that landed since the last call free their blocks for eviction */
	rc = kvt_xfer_poll(e, 0);
	if (rc < 0)
		return rc;
	rc = 0;
	if (!e->rel_ring && !(e->rel_ring = kvt_calloc(KVT_REL_RING, sizeof *e->rel_ring)))
		return kvt_err(-ENOMEM, "rotation order of %u releases", KVT_REL_RING);
	e->hint_seq++;
	e->st.hints++;
	e->prefetching = true;
	for (i = 0; i < n; i++) {
		struct kvt_seqrec *s = kvt_seq_lookup(e, r[i].seq, NULL);

		end = r[i].n_blocks ? r[i].first_block + r[i].n_blocks : s->n_blocks;
		if (s->hint_no != e->hint_seq) {
			kvt_hint_drop(e, s); /* its earlier announcement is replaced */
			s->hint_no = e->hint_seq;
			s->hint_first = r[i].first_block;
			s->hint_end = end;
		} else { /* another range of it in this call: the announcement spans both */
			s->hint_first = r[i].first_block < s->hint_first ? r[i].first_block
									 : s->hint_first;
			s->hint_end = end > s->hint_end ? end : s->hint_end;
		}
		for (j = r[i].first_block; j < end; j++)
			if (s->blocks[j] != KVT_NIL) /* a hole: out of the window */
				kvt_blk(e, s->blocks[j])->hint_no = kvt_hint_stamp(e->hint_seq);
	}
	for (i = 0; i < n && rc == 0; i++) {
		struct kvt_seqrec *s = kvt_seq_lookup(e, r[i].seq, NULL);

		end = r[i].n_blocks ? r[i].first_block + r[i].n_blocks : s->n_blocks;
		if (to_hbm && end > r[i].first_block)
			kvt_reclaim_for(e, KVT_TIER_HBM, s->blocks + r[i].first_block,
					end - r[i].first_block);
		for (j = r[i].first_block; j < end && rc == 0; j++) {
			uint32_t id = s->blocks[j];

			if (id == KVT_NIL)
				continue; /* a hole: out of the window */
			if (to_hbm) {
				rc = kvt_promote_hbm(e, id, false);
				/* no room in HBM without waiting: stage it in HOST; when
				 * nothing in HBM can go at all, stage the rest too */
				if (rc == -ENOSPC || rc == -EAGAIN) {
					to_hbm = rc == -EAGAIN;
					rc = hint_stage(e, id);
					hint_defer(e, id);
				}
			} else {
				rc = hint_stage(e, id);
				if (steps_ahead <= 1)
					hint_defer(e, id);
			}
			if (rc == -ENOSPC || rc == -EAGAIN || rc == KVT_ELOST)
				rc = 0; /* best effort; prepare reports what matters */
		}
	}
	e->prefetching = false;
	if (rc == 0)
		rc = kvt_xfer_flush(e);
	return rc;
}

int
kvt_engine_hint_ranges(struct kvt_engine *e, const struct kvt_seq_range *ranges, size_t n,
		       uint32_t steps_ahead)
{
	uint64_t blocks = 0;
	uint32_t usable;
	int rc;

	if (!e || !ranges)
		return kvt_err(-EINVAL, "kvt_engine_hint: engine and sequences must not be NULL");
	if (n == 0 || n > HINT_MAX_RANGES)
		return kvt_err(-EINVAL, "kvt_engine_hint: %zu sequences, must be 1..%u", n,
			       HINT_MAX_RANGES);
	if (e->grp)
		return kvt_grp_hint(e, ranges, n, steps_ahead);
	kvt_lock(e);
	rc = hint_check(e, ranges, n, &blocks);
	usable = e->slots[KVT_TIER_HBM].n_slots - e->quarantined[KVT_TIER_HBM];
	if (rc == 0 && steps_ahead <= 1 && blocks > usable)
		rc = kvt_err(KVT_ETOOBIG, "the hinted batch needs %llu blocks in HBM at once; HBM "
			     "has %u slots (hint what one batch will hold: fewer sequences, or "
			     "windows of them)", (unsigned long long)blocks, usable);
	if (rc == 0)
		rc = hint_apply(e, ranges, n, steps_ahead);
	kvt_unlock(e);
	return rc;
}

int
kvt_engine_hint(struct kvt_engine *e, const kvt_seq_id *seqs, size_t n, uint32_t steps_ahead)
{
	struct kvt_seq_range stackr[64], *r = stackr;
	size_t i;
	int rc;

	if (!e || !seqs)
		return kvt_err(-EINVAL, "kvt_engine_hint: engine and sequences must not be NULL");
	if (n == 0 || n > HINT_MAX_RANGES)
		return kvt_err(-EINVAL, "kvt_engine_hint: %zu sequences, must be 1..%u", n,
			       HINT_MAX_RANGES);
	if (n > 64 && !(r = kvt_calloc(n, sizeof *r)))
		return kvt_err(-ENOMEM, "hint of %zu sequences", n);
	for (i = 0; i < n; i++) {
		r[i].seq = seqs[i];
		r[i].first_block = 0;
		r[i].n_blocks = 0;
	}
	rc = kvt_engine_hint_ranges(e, r, n, steps_ahead);
	if (r != stackr)
		kvt_free(r);
	return rc;
}
