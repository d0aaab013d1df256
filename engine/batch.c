/* SPDX-License-Identifier: MIT */
/*
 * engine/batch.c - one forward step: prepare (pin and promote), block table, per-layer wait,
 * release.
 *
 * Prepare first pins every block of the batch, so that making room can never evict one of
 * them; then starts NVMe reads for blocks that live only on NVMe (each read verifies its
 * checksum; a block that fails is lost and its sequence is truncated there: the caller sees
 * KVT_ELOST and recomputes); and allocates HBM slots (demoting the least recently used unpinned
 * blocks) for blocks in HOST, submitting their host-to-device copies as one batched copy. The batch remembers the copy group it must wait for; the copies
 * complete in stream order, so waiting for the last group covers all earlier ones.
 */
#include <errno.h>
#include <string.h>

#include "engine_impl.h"

#define BATCH_MAX_SEQS 65536u
#define BATCH_ROUNDS_BASE 256u  /* prepare rounds allowed: this + BATCH_ROUNDS_PER * blocks */
#define BATCH_ROUNDS_PER 64u

static void
batch_free(struct kvt_batch *b)
{
	kvt_free(b->pos_cache);
	kvt_free(b); /* one allocation holds the batch and its arrays */
}

/* Take prepared batch @b off e->batches (engine lock held). */
static void
batch_unlink(struct kvt_engine *e, struct kvt_batch *b)
{
	if (b->prev)
		b->prev->next = b->next;
	else
		e->batches = b->next;
	if (b->next)
		b->next->prev = b->prev;
	b->prev = b->next = NULL;
}

void
kvt_batch_free_all(struct kvt_engine *e)
{
	while (e->batches) {
		struct kvt_batch *b = e->batches;

		batch_unlink(e, b);
		batch_free(b);
	}
}

/* The batch and all its arrays in one allocation: prepare runs once per decode step. */
static struct kvt_batch *
batch_alloc(uint32_t n, uint32_t n_blocks)
{
	size_t u32 = sizeof(uint32_t), off = sizeof(struct kvt_batch);
	size_t o_seq_len, o_seqidx, o_pinned, o_indptr, o_indices, o_last, o_first, o_pos;
	struct kvt_batch *b;
	char *p;

	off = (off + 7) & ~(size_t)7;
	o_seq_len = off;
	off += (size_t)n * sizeof(uint64_t);
	o_seqidx = off;
	off += (size_t)n * u32;
	o_pinned = off;
	off += (size_t)n_blocks * u32;
	o_indptr = off;
	off += ((size_t)n + 1) * u32;
	o_indices = off;
	off += (size_t)n_blocks * u32;
	o_last = off;
	off += (size_t)n * u32;
	o_first = off;
	off += (size_t)n * u32;
	o_pos = off;
	off += (size_t)n_blocks * u32;
	p = kvt_calloc(1, off);
	if (!p)
		return NULL;
	b = (struct kvt_batch *)(void *)p;
	b->n = n;
	b->seq_len = (uint64_t *)(void *)(p + o_seq_len);
	b->seqidx = (uint32_t *)(void *)(p + o_seqidx);
	b->pinned = (uint32_t *)(void *)(p + o_pinned);
	b->indptr = (uint32_t *)(void *)(p + o_indptr);
	b->indices = (uint32_t *)(void *)(p + o_indices);
	b->last_len = (uint32_t *)(void *)(p + o_last);
	b->first_block = (uint32_t *)(void *)(p + o_first);
	b->pos = (uint32_t *)(void *)(p + o_pos);
	return b;
}

/* Check entry @i of the ranges and resolve it to the window [first, first + count). Only
 * entries of one sequence can overlap, so an entry is compared with the earlier ones only when
 * an earlier entry named its sequence (s->seen): one entry per sequence costs O(n), not O(n^2)
 * (prepare runs every decode step). */
static int
batch_check_one(struct kvt_engine *e, const struct kvt_seq_range *r, size_t i, uint32_t *seqidx,
		uint32_t *first, uint32_t *count, uint32_t *live)
{
	struct kvt_seqrec *s = kvt_seq_lookup(e, r[i].seq, &seqidx[i]);
	size_t j;

	if (!s)
		return kvt_err(KVT_ECLOSED, "batch entry %zu: sequence %#llx is not open", i,
			       (unsigned long long)r[i].seq);
	if (s->in_batch)
		return kvt_err(KVT_EBUSY, "batch entry %zu: sequence %#llx is in another "
			       "unreleased batch", i, (unsigned long long)r[i].seq);
	if (s->in_call)
		return kvt_err(KVT_EBUSY, "batch entry %zu: sequence %#llx is in use by another "
			       "thread's call (an append, park or prepare of it waiting for a "
			       "transfer)", i, (unsigned long long)r[i].seq);
	if (s->n_blocks == 0)
		return kvt_err(-EINVAL, "batch entry %zu: sequence %#llx holds no tokens; "
			       "append before preparing", i, (unsigned long long)r[i].seq);
	if (r[i].first_block >= s->n_blocks ||
	    (uint64_t)r[i].first_block + r[i].n_blocks > s->n_blocks)
		return kvt_err(-EINVAL, "batch entry %zu: blocks [%u, +%u) past the end of the "
			       "sequence (%u blocks)", i, r[i].first_block, r[i].n_blocks,
			       s->n_blocks);
	first[i] = r[i].first_block;
	count[i] = r[i].n_blocks ? r[i].n_blocks : s->n_blocks - r[i].first_block;
	*live = kvt_seq_live_in(e, s, first[i], first[i] + count[i]); /* holes: none pinned */
	for (j = 0; s->seen && j < i; j++)
		if (seqidx[j] == seqidx[i] && first[i] < first[j] + count[j] &&
		    first[j] < first[i] + count[i])
			return kvt_err(-EINVAL, "batch entries %zu and %zu overlap in sequence "
				       "%#llx", j, i, (unsigned long long)r[i].seq);
	s->seen = 1;
	return 0;
}

/* Check the ranges and resolve them to [first, first + count) block windows. */
static int
batch_check(struct kvt_engine *e, const struct kvt_seq_range *r, size_t n, uint32_t *seqidx,
	    uint32_t *first, uint32_t *count, uint32_t *total)
{
	uint32_t live = 0;
	size_t i, done;
	uint64_t sum = 0;
	int rc = 0;

	for (done = 0; done < n; done++) {
		rc = batch_check_one(e, r, done, seqidx, first, count, &live);
		if (rc)
			break;
		sum += live;
	}
	for (i = 0; i < done; i++) /* the entries that set s->seen */
		e->seqs[seqidx[i]].seen = 0;
	if (rc)
		return rc;
	if (sum > e->slots[KVT_TIER_HBM].n_slots - e->quarantined[KVT_TIER_HBM])
		return kvt_err(KVT_ETOOBIG, "the batch needs %llu blocks in HBM at once; HBM has "
			       "%u slots (prepare fewer sequences, or windows of them)",
			       (unsigned long long)sum,
			       e->slots[KVT_TIER_HBM].n_slots - e->quarantined[KVT_TIER_HBM]);
	*total = (uint32_t)sum;
	return 0;
}

/*
 * One round's step for block @id (pinned, not in HBM): start its NVMe read or its
 * host-to-device copy if room allows. Returns 0 (moved, or lost: progress), -ENOSPC/-EAGAIN
 * (not now), or a hard error. *pending is 1 while the block still needs a later round.
 */
static int
batch_promote_one(struct kvt_engine *e, uint32_t id, bool wait, uint32_t *pending)
{
	struct kvt_block *k = kvt_blk(e, id);
	uint32_t slot;
	int rc;

	*pending = 1;
	if (kvt_copy_state(k, KVT_TIER_HOST) == KVT_COPY_INFLIGHT)
		return -EAGAIN; /* a read (or demotion) into HOST is under way */
	if (kvt_copy_valid(k, KVT_TIER_HOST)) {
		rc = kvt_promote_from_host(e, id, wait);
	} else if (kvt_copy_valid(k, KVT_TIER_NVME)) {
		/* a round that may wait may also take announced blocks' HOST copies (hints are
		 * a forecast; this batch runs now), never another batch block's (protected) */
		rc = kvt_room_for_copy(e, id, KVT_TIER_NVME, KVT_TIER_HOST, wait);
		if (rc == 1)
			return -EAGAIN; /* another thread may have started its read meanwhile */
		if (rc == 0)
			rc = kvt_slot_alloc(e, KVT_TIER_HOST, id, &slot);
		if (rc == 0)
			rc = kvt_xfer_n2h(e, id, slot, false, true);
	} else {
		kvt_block_check_lost(e, id);
		return k->lost ? 0 : -ENOSPC;
	}
	/* a block whose host-to-device copy is now queued is done here: kvt_batch_wait_layer()
	 * waits for it, prepare does not */
	if (kvt_copy_state(kvt_blk(e, id), KVT_TIER_HBM) == KVT_COPY_INFLIGHT)
		*pending = 0;
	return rc;
}

/*
 * The cycle of small tiers: HBM is full of dirty blocks (their only copy), so making room
 * means demoting one into HOST, and HOST is full of this batch's own blocks waiting to go up
 * (pinned: reclaim keeps them). A batch block whose HOST copy duplicates its NVMe copy gives
 * its HOST slot to the coldest HBM victim's demotion, and is read back from NVMe in a later
 * round, when the victim has gone on down. Returns 1 when a demotion started, else 0.
 */
static int
batch_break_cycle(struct kvt_engine *e, struct kvt_batch *b)
{
	struct kvt_evict *ev = &e->evict[KVT_TIER_HBM];
	uint32_t i, x = KVT_NIL, y = KVT_NIL, id;

	for (i = 0; i < b->n_pinned && x == KVT_NIL; i++) {
		struct kvt_block *k = kvt_blk(e, b->pinned[i]);

		if (!k->busy && kvt_copy_state(k, KVT_TIER_HBM) == KVT_COPY_ABSENT &&
		    kvt_copy_valid(k, KVT_TIER_HOST) && kvt_copy_valid(k, KVT_TIER_NVME))
			x = b->pinned[i];
	}
	for (id = ev->ops->victim_first(ev); id != KVT_NIL && y == KVT_NIL;
	     id = ev->ops->victim_next(ev, id))
		if (kvt_copy_evictable(kvt_blk(e, id), KVT_TIER_HBM))
			y = id;
	if (x == KVT_NIL || y == KVT_NIL)
		return 0;
	kvt_copy_drop(e, x, KVT_TIER_HOST);
	return kvt_evict_one(e, KVT_TIER_HBM, y, false) >= 0;
}

/*
 * The other cycle (issue 15, item 3): a batch block lives only on NVMe and needs a HOST slot,
 * HOST is full of blocks whose only copy is there (their demotion finds NVMe full of blocks
 * that are theirs alone), and HBM has a free slot. Nothing else moves a block up that no batch
 * asked for, so the coldest HOST-only block outside the batch is copied into the free HBM
 * slot: once it lands its HOST copy is a clean duplicate that reclaim drops, and the NVMe read
 * gets its slot (its NVMe copy then becomes droppable room for the cascade, kvt_copy_evictable).
 * Returns 1 when a copy started, else 0.
 */
static int
batch_hoist(struct kvt_engine *e, struct kvt_batch *b)
{
	struct kvt_evict *ev = &e->evict[KVT_TIER_HOST];
	uint32_t i, id;
	bool want = false;

	if (!e->slots[KVT_TIER_HBM].n_free || !e->slots[KVT_TIER_HOST].n_slots)
		return 0;
	for (i = 0; i < b->n_pinned && !want; i++) {
		const struct kvt_block *k = kvt_blk(e, b->pinned[i]);

		want = !k->lost && kvt_copy_state(k, KVT_TIER_HBM) == KVT_COPY_ABSENT &&
		       kvt_copy_state(k, KVT_TIER_HOST) == KVT_COPY_ABSENT &&
		       kvt_copy_valid(k, KVT_TIER_NVME);
	}
	if (!want)
		return 0;
	for (id = ev->ops->victim_first(ev); id != KVT_NIL; id = ev->ops->victim_next(ev, id)) {
		const struct kvt_block *k = kvt_blk(e, id);

		if (!k->pins && kvt_copy_evictable(k, KVT_TIER_HOST) &&
		    kvt_copy_state(k, KVT_TIER_HBM) == KVT_COPY_ABSENT)
			break;
	}
	if (id == KVT_NIL || kvt_promote_from_host(e, id, false) != 0)
		return 0;
	return kvt_xfer_flush(e) == 0;
}

/*
 * The cycle's third shape: HBM full of blocks whose only copy is there, HOST full of this
 * batch's blocks whose only copy is in HOST (protected: reclaim keeps them), NVMe with room.
 * One such batch block's HOST copy is written to NVMe, kept in HOST: once it lands,
 * batch_break_cycle() can trade its HOST slot for the HBM victim's demotion. Returns 1 when the
 * write started, else 0.
 */
static int
batch_stage_down(struct kvt_engine *e, struct kvt_batch *b)
{
	uint32_t i, x = KVT_NIL, slot;

	if (!e->slots[KVT_TIER_NVME].n_slots)
		return 0;
	for (i = 0; i < b->n_pinned && x == KVT_NIL; i++) {
		const struct kvt_block *k = kvt_blk(e, b->pinned[i]);

		if (!k->busy && kvt_copy_state(k, KVT_TIER_HBM) == KVT_COPY_ABSENT &&
		    kvt_copy_valid(k, KVT_TIER_HOST) &&
		    kvt_copy_state(k, KVT_TIER_NVME) == KVT_COPY_ABSENT)
			x = b->pinned[i];
	}
	if (x == KVT_NIL || kvt_reclaim(e, KVT_TIER_NVME, 1, false) != 0 ||
	    kvt_slot_alloc(e, KVT_TIER_NVME, x, &slot) != 0)
		return 0;
	return kvt_xfer_h2n(e, x, slot, false, true) == 0;
}

/*
 * While prepare runs, the HOST copy of every batch block not yet in HBM is protected: making
 * room for one of them (an NVMe read into HOST, a demotion from HBM) must not drop a sibling's
 * staged copy, or two blocks can take each other's HOST slot in turn for ever, each read
 * looking like headway. Blocks that have reached HBM (or are on their way) give their HOST copy
 * up again. batch_break_cycle() is the one place that drops a staged copy, by design.
 * @on false clears the marks of every block of the batch (prepare ends).
 */
static void
batch_protect(struct kvt_engine *e, struct kvt_batch *b, bool on)
{
	uint32_t i;

	for (i = 0; i < b->n_pinned; i++) {
		struct kvt_block *k = kvt_blk(e, b->pinned[i]);

		k->protect = on && !k->lost &&
			     kvt_copy_state(k, KVT_TIER_HBM) == KVT_COPY_ABSENT;
	}
}

/* The youngest copy group carrying one of the batch's blocks: groups retire in order, so its
 * layer events cover every older one; 0 when everything was already in HBM. */
static void
batch_set_need(struct kvt_engine *e, struct kvt_batch *b)
{
	uint32_t i;

	for (i = 0; i < b->n_pinned; i++) {
		struct kvt_block *k = kvt_blk(e, b->pinned[i]);

		if (kvt_copy_state(k, KVT_TIER_HBM) == KVT_COPY_INFLIGHT &&
		    e->hbm_h2d_seqno[k->slot[KVT_TIER_HBM]] > b->need_h2d)
			b->need_h2d = e->hbm_h2d_seqno[k->slot[KVT_TIER_HBM]];
	}
	if (b->need_h2d <= e->h2d.retired)
		b->need_h2d = 0;
}

/*
 * Phases 2 and 3: bring every pinned block into HBM. NVMe-only blocks are read into HOST
 * (checksums verified on completion), HOST-valid blocks are copied up in one batched copy per
 * round. Small tiers can make this circular (the HOST slots a demotion from HBM needs are
 * holding the batch's own blocks on their way up), so it runs in rounds: do what room allows,
 * wait for a completion (an H2D that lands makes its block's HOST copy droppable), repeat;
 * when nothing moves and nothing is in flight, batch_break_cycle() trades a staged copy.
 * Rounds first make room without waiting, so that every block that can go up now joins one
 * copy group; only a round that moved nothing lets reclaim wait (and take blocks that hints
 * announced, before any of the batch's own staged copies is given up).
 * Headway: a host-to-device copy always counts; an NVMe read counts only while the batch has
 * read no more blocks than it holds (plus the re-reads that cycle breaks cause), so reads that
 * undo each other cannot keep the loop from waiting and breaking cycles. The rounds are capped
 * all the same (-EDEADLK, never a hang).
 * Ends when every block is in HBM or on its way (or lost); -ENOSPC when nothing can move.
 */
static int
batch_make_resident(struct kvt_engine *e, struct kvt_batch *b)
{
	uint32_t i, pending, progress, one, reads = 0, breaks = 0, rounds = 0;
	uint32_t max_rounds = BATCH_ROUNDS_BASE + BATCH_ROUNDS_PER * b->n_pinned;
	bool wait = false;
	uint64_t t0;
	int rc;

	for (;; rounds++) {
		/* rounds spent waiting for other threads' transfers while blocks that are not
		 * this batch's are pinned (other batches, appends not yet released, moves in
		 * progress) are "not now", as when nothing is in flight: -ENOSPC, retry after
		 * releases. Without such pins the loop is the batch's alone: a bug */
		if (rounds > max_rounds && e->hbm_pinned > b->n_pinned)
			return kvt_err(-ENOSPC, "no room to bring the batch into HBM in %u rounds: "
				       "%u blocks pinned with this batch's %u (by other batches, "
				       "appends not yet released, moves in progress), %u HBM "
				       "slots", rounds, e->hbm_pinned, b->n_pinned,
				       e->slots[KVT_TIER_HBM].n_slots);
		if (rounds > max_rounds)
			return kvt_err(-EDEADLK, "prepare made no headway in %u rounds (%u blocks, "
				       "%u NVMe reads): a bug, please report it", rounds,
				       b->n_pinned, reads);
		pending = progress = 0;
		batch_protect(e, b, true);
		kvt_reclaim_for(e, KVT_TIER_HBM, b->pinned, b->n_pinned);
		for (i = 0; i < b->n_pinned; i++) {
			struct kvt_block *k = kvt_blk(e, b->pinned[i]);

			if (kvt_copy_state(k, KVT_TIER_HBM) != KVT_COPY_ABSENT || k->lost)
				continue;
			rc = batch_promote_one(e, b->pinned[i], wait, &one);
			pending += one;
			if (rc == 0 && (!one || kvt_blk(e, b->pinned[i])->lost ||
					++reads <= b->n_pinned + breaks))
				progress++;
			else if (rc && rc != -ENOSPC && rc != -EAGAIN)
				return kvt_err(rc, "promoting a block of the batch");
		}
		rc = kvt_xfer_flush(e);
		if (rc)
			return rc;
		if (!pending)
			break;
		if (!progress && !wait) {
			wait = true;
			continue;
		}
		wait = false;
		if (!progress && !kvt_xfer_inflight(e)) {
			batch_protect(e, b, true);
			if (!batch_hoist(e, b) && !batch_break_cycle(e, b) &&
			    !batch_stage_down(e, b))
				return kvt_err(-ENOSPC, "no room to bring the batch into HBM: %u "
					       "blocks pinned, %u HBM slots, %u HOST slots",
					       e->hbm_pinned, e->slots[KVT_TIER_HBM].n_slots,
					       e->slots[KVT_TIER_HOST].n_slots);
			breaks++;
		}
		t0 = kvt_now_ns();
		rc = kvt_xfer_wait_any(e);
		e->st.stalls++;
		e->st.stall_ns += kvt_now_ns() - t0;
		if (rc < 0)
			return rc;
	}
	batch_set_need(e, b);
	return 0;
}

/* Truncate every sequence of the batch at its first lost block. Returns how many were. */
static uint32_t
batch_truncate_lost(struct kvt_engine *e, struct kvt_batch *b)
{
	uint32_t i, j, n = 0;

	for (i = 0; i < b->n; i++) {
		struct kvt_seqrec *s = &e->seqs[b->seqidx[i]];

		for (j = 0; j < s->n_blocks; j++) {
			if (s->blocks[j] != KVT_NIL && kvt_blk(e, s->blocks[j])->lost) {
				kvt_seq_truncate(e, s, j);
				n++;
				break;
			}
		}
	}
	return n;
}

static void
batch_unpin(struct kvt_engine *e, struct kvt_batch *b)
{
	uint32_t i;

	for (i = 0; i < b->n_pinned; i++)
		kvt_block_unpin(e, b->pinned[i]);
	b->n_pinned = 0;
}

static void
batch_fill_table(struct kvt_engine *e, struct kvt_batch *b, const uint32_t *first,
		 const uint32_t *count)
{
	uint32_t tpb = e->layout.tokens_per_block, i, j, k = 0;

	for (i = 0; i < b->n; i++) {
		struct kvt_seqrec *s = &e->seqs[b->seqidx[i]];
		uint64_t begin = (uint64_t)first[i] * tpb;
		uint64_t end = (uint64_t)(first[i] + count[i]) * tpb;

		if (end > s->n_tokens)
			end = s->n_tokens;
		b->indptr[i] = k;
		for (j = first[i]; j < first[i] + count[i]; j++) {
			if (s->blocks[j] == KVT_NIL)
				continue; /* a hole: out of the window, not in the table */
			b->pos[k] = j;
			b->indices[k++] = kvt_blk(e, s->blocks[j])->slot[KVT_TIER_HBM];
		}
		b->first_block[i] = first[i];
		b->seq_len[i] = end - begin;
		b->last_len[i] = (uint32_t)(end - (uint64_t)(first[i] + count[i] - 1) * tpb);
	}
	b->indptr[b->n] = k;
}

void
kvt_promo_note(struct kvt_engine *e, uint32_t id)
{
	struct kvt_block *b = kvt_blk(e, id);

	if (b->promoted)
		e->st.repromotions++;
	b->promoted = 1;
}

void
kvt_promo_access(struct kvt_engine *e, uint32_t id)
{
	kvt_blk(e, id)->promoted = 0;
}

/* Phase 1 bookkeeping of one block: LRU order and where the access finds it (coverage). */
static void
batch_classify(struct kvt_engine *e, struct kvt_batch *b, uint32_t id)
{
	struct kvt_block *k = kvt_blk(e, id);
	enum kvt_copy_state hbm = kvt_copy_state(k, KVT_TIER_HBM); /* read once: per block */

	if (hbm == KVT_COPY_PRESENT) {
		e->evict[KVT_TIER_HBM].ops->access(&e->evict[KVT_TIER_HBM], id);
		b->n_ready++;
		return;
	}
	if (hbm == KVT_COPY_INFLIGHT) {
		b->n_early++; /* prefetched: ready if the waits find it landed */
		return;
	}
	/* must be promoted now: found in HOST, or read from NVMe first */
	if (kvt_copy_state(k, KVT_TIER_HOST) != KVT_COPY_ABSENT)
		e->st.tier[KVT_TIER_HOST].hits++;
	else
		e->st.tier[KVT_TIER_HOST].misses++;
}

/* At release: the batch's accesses, and those that found their block ready (no stall). */
static void
batch_count_accesses(struct kvt_engine *e, const struct kvt_batch *b)
{
	uint32_t ready = b->n_ready + (b->stalled ? 0 : b->n_early);

	e->st.accesses += b->n_pinned;
	e->st.accesses_ready += ready;
	e->st.tier[KVT_TIER_HBM].hits += ready;
	e->st.tier[KVT_TIER_HBM].misses += b->n_pinned - ready;
}

static int
batch_prepare_locked(struct kvt_engine *e, const struct kvt_seq_range *r, size_t n,
		     struct kvt_batch **out)
{
	uint32_t *tmp = kvt_malloc(3 * n * sizeof *tmp), total = 0, i, j;
	uint32_t *first, *count, *seqidx;
	struct kvt_batch *b;
	int rc;

	if (!tmp)
		return kvt_err(-ENOMEM, "batch of %zu sequences", n);
	first = tmp; /* (no arithmetic on a NULL tmp: UBSan) */
	count = tmp + n;
	seqidx = tmp + 2 * n;
	/* retire the copies that landed (their blocks count as ready, their sources as clean);
	 * bounded, so a prepare of resident blocks does not process others' IO at length */
	rc = kvt_xfer_poll(e, KVT_XFER_POLL_BOUND);
	if (rc >= 0)
		rc = batch_check(e, r, n, seqidx, first, count, &total);
	if (rc) {
		kvt_free(tmp);
		return rc;
	}
	b = batch_alloc((uint32_t)n, total);
	if (!b) {
		kvt_free(tmp);
		return kvt_err(-ENOMEM, "batch of %zu sequences", n);
	}
	b->e = e;
	b->hint_mark = e->hint_seq;
	b->rel_mark = e->rel_next;
	b->rot_cont = kvt_rot_continues(e, seqidx, (uint32_t)n);
	memcpy(b->seqidx, seqidx, n * sizeof *seqidx);
	/* phase 1: pin (and count as used: the LRU order follows use) */
	for (i = 0; i < n; i++) {
		struct kvt_seqrec *s = &e->seqs[seqidx[i]];
		/* every block a coming query reads: a windowed sequence's holes, and the live
		 * blocks that have left its window (its next append drops them), are not part of
		 * it (issue 16: the rotation lost each session once every block of tokens) */
		uint32_t lo = kvt_win_sink_blocks(e) ? 0 : kvt_win_next_first(e, s);

		kvt_rot_prepared(e, s, first[i] <= lo && first[i] + count[i] == s->n_blocks,
				 b->rot_cont);
		s->in_call = 1; /* waits release the lock: no other call changes it meanwhile */
		for (j = first[i]; j < first[i] + count[i]; j++) {
			uint32_t id = s->blocks[j];

			if (id == KVT_NIL)
				continue; /* a hole: out of the window */
			kvt_block_pin(e, id);
			kvt_blk(e, id)->wanted = 1;
			b->pinned[b->n_pinned++] = id;
			batch_classify(e, b, id);
		}
	}
	if (e->hbm_pinned > e->slots[KVT_TIER_HBM].n_slots) {
		uint32_t wp = kvt_seq_wpinned(e);

		/* name the cause: appends' write pins (released by a batch of their sequence or a
		 * park) are not batches */
		rc = wp ? kvt_err(-ENOSPC, "HBM is pinned: %u blocks pinned with this batch's %u, "
				  "%u slots; %u of them are pinned by appends that no batch release "
				  "or park of their sequence has unpinned yet", e->hbm_pinned,
				  b->n_pinned, e->slots[KVT_TIER_HBM].n_slots, wp) :
			  kvt_err(-ENOSPC, "HBM is pinned by other batches: %u blocks pinned with "
				  "this batch's %u, %u slots", e->hbm_pinned, b->n_pinned,
				  e->slots[KVT_TIER_HBM].n_slots);
		goto fail;
	}
	rc = batch_make_resident(e, b);
	batch_protect(e, b, false);
	if (rc == 0 && batch_truncate_lost(e, b))
		rc = kvt_err(KVT_ELOST, "KV blocks failed their checksum or could not be read; the "
			     "affected sequences were truncated (see kvt_seq_info) and must be "
			     "recomputed from there");
	if (rc)
		goto fail;
	batch_fill_table(e, b, first, count);
	for (i = 0; i < b->n_pinned; i++)
		kvt_promo_access(e, b->pinned[i]); /* this use consumes its promotion */
	kvt_hint_retry(e); /* the next batch's copies that found no room at their hint */
	for (i = 0; i < n; i++) {
		e->seqs[seqidx[i]].in_call = 0;
		e->seqs[seqidx[i]].in_batch = 1;
		e->seqs[seqidx[i]].parked = 0;
		e->seqs[seqidx[i]].last_use_ns = kvt_now_ns();
	}
	e->n_batches++;
	e->st.batches++;
	b->next = e->batches;
	if (b->next)
		b->next->prev = b;
	e->batches = b;
	*out = b;
	kvt_free(tmp);
	return 0;
fail:
	for (i = 0; i < n; i++)
		e->seqs[seqidx[i]].in_call = 0;
	batch_unpin(e, b);
	batch_free(b);
	kvt_free(tmp);
	return rc;
}

int
kvt_batch_prepare_ranges(struct kvt_engine *e, const struct kvt_seq_range *ranges, size_t n,
			 struct kvt_batch **out)
{
	int rc;

	if (out)
		*out = NULL;
	if (!e || !ranges || !out)
		return kvt_err(-EINVAL, "kvt_batch_prepare: engine, sequences and out must not be "
			       "NULL");
	if (n == 0 || n > BATCH_MAX_SEQS)
		return kvt_err(-EINVAL, "kvt_batch_prepare: %zu sequences, must be 1..%u", n,
			       BATCH_MAX_SEQS);
	if (e->grp)
		return kvt_grp_batch_prepare(e, ranges, n, out);
	kvt_lock(e);
	rc = batch_prepare_locked(e, ranges, n, out);
	kvt_unlock(e);
	return rc;
}

int
kvt_batch_prepare(struct kvt_engine *e, const kvt_seq_id *seqs, size_t n, struct kvt_batch **out)
{
	struct kvt_seq_range *r;
	size_t i;
	int rc;

	if (out)
		*out = NULL;
	if (!seqs || n == 0 || n > BATCH_MAX_SEQS)
		return kvt_err(-EINVAL, "kvt_batch_prepare: %zu sequences (seqs %s), must be 1..%u",
			       n, seqs ? "set" : "NULL", BATCH_MAX_SEQS);
	r = kvt_calloc(n, sizeof *r);
	if (!r)
		return kvt_err(-ENOMEM, "batch of %zu sequences", n);
	for (i = 0; i < n; i++)
		r[i].seq = seqs[i];
	rc = kvt_batch_prepare_ranges(e, r, n, out);
	kvt_free(r);
	return rc;
}

const uint32_t *
kvt_batch_block_pos(const struct kvt_batch *b)
{
	return b ? b->pos : NULL;
}

int
kvt_batch_block_table(const struct kvt_batch *b, struct kvt_block_table *out)
{
	if (!b || !out)
		return kvt_err(-EINVAL, "kvt_batch_block_table: batch and out must not be NULL");
	if (b->gsub)
		return kvt_err(-EINVAL, "kvt_batch_block_table: the engine has layer groups: use "
			       "kvt_batch_group_table");
	out->n_seqs = b->n;
	out->indptr = b->indptr;
	out->indices = b->indices;
	out->last_block_len = b->last_len;
	out->seq_len = b->seq_len;
	out->first_block = b->first_block;
	return kvt_engine_geometry(b->e, &out->geo);
}

/*
 * The event to wait for before layer @layer of @b is usable, or NULL in *ev when every copy of
 * the batch has retired (copies that landed are retired first). Requires e->lock.
 */
static int
batch_layer_event(struct kvt_engine *e, struct kvt_batch *b, uint32_t layer,
		  struct kvt_event **ev)
{
	int rc;

	*ev = NULL;
	if (b->need_h2d && e->h2d.retired < b->need_h2d) {
		rc = kvt_xfer_poll(e, 0);
		if (rc < 0)
			return rc;
		kvt_hint_retry(e);
	}
	if (!b->need_h2d || e->h2d.retired >= b->need_h2d) {
		b->layers_ready = e->layout.n_layers; /* every copy of the batch has retired */
		return 0;
	}
	/* the group is not retired, so it is still queued: its layer event only (copies are
	 * in stream order: earlier groups and layers come first) */
	*ev = kvt_xfer_h2d_event(e, b->need_h2d, layer);
	return 0;
}

/*
 * Wait for layer @layer of @b; called and returns with e->lock held. A device-side wait
 * (@stream) is queued under the lock (the host does not block). A host wait blocks with the
 * lock released, so that other threads' engine calls (stats, hints, other sequences' appends
 * and batches, completions) go on meanwhile; once it returns, the lock is taken again and the
 * state looked at afresh: the group may have retired meanwhile (another thread's poll). The
 * sleeper holds the group (kvt_xfer_sleep_h2d), so its event is neither freed nor recorded
 * again under it. A wait that found the layer not landed is one stall, however many rounds it
 * takes.
 */
static int
batch_wait_locked(struct kvt_engine *e, struct kvt_batch *b, uint32_t layer, void *stream)
{
	struct kvt_event *ev;
	bool counted = false;
	uint64_t t0;
	int rc;

	for (;;) {
		rc = batch_layer_event(e, b, layer, &ev);
		if (rc || !ev)
			return rc;
		rc = e->dev->ops->event_query(e->dev, ev);
		if (rc != -EAGAIN)
			return rc;
		if (!counted) {
			/* the layer was not ready when asked for: a stall (coverage counts the
			 * batch as not ready) */
			e->st.stalls++;
			b->stalled = 1;
			counted = true;
		}
		if (stream) /* the caller's stream waits, the host does not (the stall's
			     * length is the device's to know) */
			return e->dev->ops->stream_wait_event(e->dev, stream, ev);
		t0 = kvt_now_ns();
		rc = kvt_xfer_sleep_h2d(e, b->need_h2d, layer);
		e->st.stall_ns += kvt_now_ns() - t0;
		if (rc)
			return rc;
	}
}

int
kvt_batch_wait_layer(struct kvt_batch *b, uint32_t layer, void *stream)
{
	struct kvt_engine *e;
	uint32_t lpg;
	int rc;

	if (!b)
		return kvt_err(-EINVAL, "kvt_batch_wait_layer: batch is NULL");
	if (b->gsub)
		return kvt_grp_batch_wait_layer(b, layer, stream);
	e = b->e;
	if (layer >= e->layout.n_layers)
		return kvt_err(-EINVAL, "layer %u out of range (model has %u)", layer,
			       e->layout.n_layers);
	if (layer < b->layers_ready)
		return 0; /* known landed: no lock, no polling (decode calls this per layer) */
	kvt_lock(e);
	lpg = e->layers_per_group;
	rc = batch_wait_locked(e, b, layer, stream);
	if (rc)
		rc = kvt_err(rc, "waiting for layer %u's copies: %s", layer, e->dev->errmsg);
	else if (!stream && b->layers_ready < (layer / lpg + 1) * lpg)
		b->layers_ready = (layer / lpg + 1) * lpg;
	kvt_unlock(e);
	return rc;
}

int
kvt_batch_release(struct kvt_batch *b, void *stream)
{
	struct kvt_engine *e;
	uint32_t i;
	bool keep;
	int rc = 0;

	if (!b)
		return kvt_err(-EINVAL, "kvt_batch_release: batch is NULL");
	if (b->gsub)
		return kvt_grp_batch_release(b, stream);
	e = b->e;
	kvt_lock(e);
	if (stream) {
		/* every later copy that reads or overwrites an HBM slot runs after the work the
		 * caller queued on its stream: the K/V it wrote, the kernels that read slots */
		rc = e->dev->ops->event_record(e->dev, e->compute_ev, stream);
		if (rc == 0)
			rc = e->dev->ops->stream_wait_event(e->dev, e->d2h.s, e->compute_ev);
		if (rc == 0)
			rc = e->dev->ops->stream_wait_event(e->dev, e->h2d.s, e->compute_ev);
		if (rc) {
			rc = kvt_err(rc, "ordering copies after the caller's stream: %s",
				     e->dev->errmsg);
			/* the device-side order could not be set up: wait for the stream on the
			 * host instead, so no copy reads K/V before it is written; if even that
			 * fails the bytes are unknown, and the blocks stay pinned for good
			 * (never demoted, never served by a later copy) */
			if (e->dev->ops->stream_sync(e->dev, stream) != 0) {
				b->n_pinned = 0;
				for (i = 0; i < b->n; i++)
					e->seqs[b->seqidx[i]].in_batch = 0;
				e->n_batches--;
				batch_unlink(e, b);
				kvt_unlock(e);
				batch_free(b);
				return rc;
			}
		}
	}
	/* copies of this batch still in flight keep their blocks busy, so nothing demotes them
	 * before they land */
	batch_count_accesses(e, b);
	batch_unpin(e, b);
	keep = b->rot_cont && e->rel_next == b->rel_mark; /* nothing released since */
	for (i = 0; i < b->n; i++) {
		struct kvt_seqrec *s = &e->seqs[b->seqidx[i]];

		s->in_batch = 0;
		kvt_rot_released(e, s, b->seqidx[i], keep);
		kvt_seq_publish(e, s); /* its written sealed blocks become shareable */
		kvt_seq_unpin_writes(e, s);
		kvt_hint_end(e, s, b->hint_mark);
	}
	e->n_batches--;
	batch_unlink(e, b);
	kvt_watermarks(e);
	(void)kvt_xfer_flush(e);
	kvt_unlock(e);
	batch_free(b);
	return rc;
}

/* Give back the pins of prepared batch @b and free it without releasing it: its sequences'
 * appended blocks stay write-pinned and unsealed (a grouped engine's prepare that failed in
 * another group, engine/group.c). */
void
kvt_batch_abandon(struct kvt_batch *b)
{
	struct kvt_engine *e = b->e;
	uint32_t i;

	kvt_lock(e);
	batch_unpin(e, b);
	for (i = 0; i < b->n; i++)
		e->seqs[b->seqidx[i]].in_batch = 0;
	e->n_batches--;
	e->st.batches--;
	batch_unlink(e, b);
	kvt_unlock(e);
	batch_free(b);
}
