/* SPDX-License-Identifier: MIT */
/*
 * engine/seq.c - sequences: open, close, append, park, resume, info.
 *
 * A sequence id is (generation << 32) | index. Closing bumps the generation, so a stale id is
 * answered with KVT_ECLOSED (like a closed file descriptor) instead of touching freed memory.
 */
#include <errno.h>
#include <string.h>

#include "engine_impl.h"

#define SEQ_MAX_APPEND (1u << 20)

static kvt_seq_id
seq_make_id(uint32_t idx, uint32_t gen)
{
	return ((uint64_t)gen << 32) | idx;
}

struct kvt_seqrec *
kvt_seq_lookup(struct kvt_engine *e, kvt_seq_id id, uint32_t *idx)
{
	uint32_t i = (uint32_t)id, gen = (uint32_t)(id >> 32);

	if (i >= e->cap_seqs || !e->seqs[i].open || e->seqs[i].gen != gen)
		return NULL;
	if (idx)
		*idx = i;
	return &e->seqs[i];
}

void
kvt_seq_opts_init(struct kvt_seq_opts *o, size_t size)
{
	struct kvt_seq_opts d = { .opts_size = size, .tenant = 0, .priority = 50 };

	if (!o)
		return;
	memcpy(o, &d, size < sizeof d ? size : sizeof d);
}

static int
seq_grow_table(struct kvt_engine *e)
{
	uint32_t ncap = e->cap_seqs ? e->cap_seqs * 2 : 64, i;
	struct kvt_seqrec *ns;

	if (ncap <= e->cap_seqs || ncap >= KVT_NIL)
		return kvt_err(-ENOMEM, "sequence table full");
	ns = kvt_realloc(e->seqs, (size_t)ncap * sizeof *ns);
	if (!ns)
		return kvt_err(-ENOMEM, "growing the sequence table to %u", ncap);
	memset(ns + e->cap_seqs, 0, (size_t)(ncap - e->cap_seqs) * sizeof *ns);
	for (i = ncap; i-- > e->cap_seqs;) {
		ns[i].gen = 1;
		ns[i].next_free = e->seq_free;
		e->seq_free = i;
	}
	e->seqs = ns;
	e->cap_seqs = ncap;
	return 0;
}

int
kvt_seq_open(struct kvt_engine *e, const struct kvt_seq_opts *o, kvt_seq_id *out)
{
	struct kvt_seq_opts opts;
	struct kvt_seqrec *s;
	uint32_t idx;
	int rc = 0;

	if (!e || !out)
		return kvt_err(-EINVAL, "kvt_seq_open: engine and out must not be NULL");
	*out = 0;
	kvt_seq_opts_init(&opts, sizeof opts);
	if (o) {
		if (o->opts_size < offsetof(struct kvt_seq_opts, priority) + 1 ||
		    o->opts_size > 4096)
			return kvt_err(-EINVAL, "kvt_seq_opts.opts_size %zu is not a valid size",
				       o->opts_size);
		memcpy(&opts, o, o->opts_size < sizeof opts ? o->opts_size : sizeof opts);
	}
	if (opts.priority > 100)
		return kvt_err(-EINVAL, "priority %u is out of range 0..100", opts.priority);
	kvt_lock(e);
	if (e->seq_free == KVT_NIL)
		rc = seq_grow_table(e);
	if (rc == 0) {
		idx = e->seq_free;
		s = &e->seqs[idx];
		e->seq_free = s->next_free;
		s->open = 1;
		s->tenant = opts.tenant;
		s->priority = opts.priority;
		s->n_tokens = 0;
		s->n_blocks = 0;
		s->n_wpins = 0;
		s->parked = s->in_batch = 0;
		s->hint_no = 0;
		e->n_open_seqs++;
		*out = seq_make_id(idx, s->gen);
	}
	kvt_unlock(e);
	return rc;
}

void
kvt_seq_unpin_writes(struct kvt_engine *e, struct kvt_seqrec *s)
{
	uint32_t i;

	for (i = 0; i < s->n_wpins; i++)
		kvt_block_unpin(e, s->wpins[i]);
	s->n_wpins = 0;
}

void
kvt_seq_truncate(struct kvt_engine *e, struct kvt_seqrec *s, uint32_t first_lost)
{
	uint64_t tpb = e->layout.tokens_per_block;
	uint32_t i;

	if (first_lost >= s->n_blocks)
		return;
	kvt_seq_unpin_writes(e, s);
	for (i = first_lost; i < s->n_blocks; i++)
		kvt_block_kill(e, s->blocks[i]);
	s->n_blocks = first_lost;
	if (s->n_tokens > (uint64_t)first_lost * tpb)
		s->n_tokens = (uint64_t)first_lost * tpb;
}

int
kvt_seq_close(struct kvt_engine *e, kvt_seq_id id)
{
	struct kvt_seqrec *s;
	uint32_t idx, i;

	if (!e)
		return kvt_err(-EINVAL, "kvt_seq_close: engine is NULL");
	kvt_lock(e);
	s = kvt_seq_lookup(e, id, &idx);
	if (!s) {
		kvt_unlock(e);
		return kvt_err(KVT_ECLOSED, "sequence %#llx is not open", (unsigned long long)id);
	}
	if (s->in_batch) {
		kvt_unlock(e);
		return kvt_err(KVT_EBUSY, "sequence %#llx is in an unreleased batch",
			       (unsigned long long)id);
	}
	kvt_seq_unpin_writes(e, s);
	/* blocks with transfers in flight are freed by those completions, never before */
	for (i = 0; i < s->n_blocks; i++)
		kvt_block_kill(e, s->blocks[i]);
	s->n_blocks = 0;
	s->n_tokens = 0;
	s->hint_no = 0;
	s->open = 0;
	s->gen++;
	if (s->gen == 0)
		s->gen = 1;
	s->next_free = e->seq_free;
	e->seq_free = idx;
	e->n_open_seqs--;
	kvt_unlock(e);
	return 0;
}

static int
seq_reserve(struct kvt_seqrec *s, uint64_t n_tokens, uint32_t n_blocks, uint32_t n_wpins)
{
	void *p;

	if (n_tokens > s->cap_tokens) {
		uint64_t c = s->cap_tokens ? s->cap_tokens : 64;

		while (c < n_tokens)
			c *= 2;
		if (!(p = kvt_realloc(s->tokens, c * sizeof *s->tokens)))
			return -ENOMEM;
		s->tokens = p;
		s->cap_tokens = c;
	}
	if (n_blocks > s->cap_blocks) {
		uint32_t c = s->cap_blocks ? s->cap_blocks : 8;

		while (c < n_blocks)
			c *= 2;
		if (!(p = kvt_realloc(s->blocks, c * sizeof *s->blocks)))
			return -ENOMEM;
		s->blocks = p;
		s->cap_blocks = c;
	}
	if (n_wpins > s->cap_wpins) {
		uint32_t c = s->cap_wpins ? s->cap_wpins : 4;

		while (c < n_wpins)
			c *= 2;
		if (!(p = kvt_realloc(s->wpins, c * sizeof *s->wpins)))
			return -ENOMEM;
		s->wpins = p;
		s->cap_wpins = c;
	}
	return 0;
}

static bool
seq_has_wpin(const struct kvt_seqrec *s, uint32_t block)
{
	uint32_t i;

	for (i = 0; i < s->n_wpins; i++)
		if (s->wpins[i] == block)
			return true;
	return false;
}

static void
seq_add_wpin(struct kvt_engine *e, struct kvt_seqrec *s, uint32_t block)
{
	if (seq_has_wpin(s, block))
		return;
	kvt_block_pin(e, block);
	s->wpins[s->n_wpins++] = block;
}

/* Bring the partially filled last block into HBM and wait until its copy is there. */
static int
seq_ready_last(struct kvt_engine *e, struct kvt_seqrec *s, uint32_t *block)
{
	uint32_t id = s->blocks[s->n_blocks - 1];
	int rc;

	for (;;) {
		struct kvt_block *b = &e->blocks[id];

		if (kvt_copy_valid(b, KVT_TIER_HBM) && !b->busy)
			break;
		if (kvt_copy_valid(b, KVT_TIER_HBM) ||
		    b->state[KVT_TIER_HBM] == KVT_COPY_INFLIGHT) {
			/* a copy in or out of HBM is in flight: a stall of the append */
			uint64_t t0 = kvt_now_ns();

			rc = kvt_xfer_wait_block(e, id);
			e->st.stalls++;
			e->st.stall_ns += kvt_now_ns() - t0;
		} else {
			rc = kvt_promote_hbm(e, id, true);
		}
		if (rc < 0)
			return rc;
	}
	*block = id;
	return 0;
}

/* The append itself, under the lock, with arguments checked. */
static int
seq_append_locked(struct kvt_engine *e, uint32_t sidx, const int32_t *tokens, size_t n,
		  int64_t *slot_mapping)
{
	struct kvt_seqrec *s = &e->seqs[sidx];
	uint32_t tpb = e->layout.tokens_per_block, first_new = s->n_blocks, i, id, slot;
	uint64_t end = s->n_tokens + n, pos;
	uint32_t need_blocks = (uint32_t)((end + tpb - 1) / tpb);
	uint32_t touched = need_blocks - (uint32_t)(s->n_tokens / tpb);
	uint32_t slots = e->slots[KVT_TIER_HBM].n_slots, pinned_after;
	int rc;

	/* the blocks this append pins: the touched ones (the partial last block may already be
	 * write-pinned by an earlier append) plus those earlier write pins */
	pinned_after = s->n_wpins + touched;
	if (touched && s->n_tokens % tpb && seq_has_wpin(s, s->blocks[s->n_blocks - 1]))
		pinned_after--;
	if (touched > slots)
		return kvt_err(KVT_ETOOBIG,
			       "appending %zu tokens needs %u HBM blocks at once; HBM has %u slots "
			       "(append fewer tokens per call)", n, touched, slots);
	if (pinned_after > slots)
		return kvt_err(-ENOSPC,
			       "appending %zu tokens would hold %u blocks pinned for writing; HBM has "
			       "%u slots: release a batch holding this sequence first", n,
			       pinned_after, slots);
	if (seq_reserve(s, end, need_blocks, s->n_wpins + touched))
		return kvt_err(-ENOMEM, "growing sequence arrays to %llu tokens",
			       (unsigned long long)end);
	if (s->n_tokens % tpb) {
		rc = seq_ready_last(e, s, &id);
		if (rc == KVT_ELOST)
			kvt_seq_truncate(e, s, s->n_blocks - 1);
		if (rc)
			return kvt_err(rc, "bringing the last block of the sequence into HBM");
		seq_add_wpin(e, s, id);
		kvt_block_bump_ver(e, id);
	}
	for (i = first_new; i < need_blocks; i++) {
		rc = kvt_block_new(e, sidx, i, &id);
		if (rc)
			goto undo;
		kvt_block_pin(e, id);
		rc = kvt_reclaim(e, KVT_TIER_HBM, 1, true);
		if (rc == 0)
			rc = kvt_slot_alloc(e, KVT_TIER_HBM, id, &slot);
		if (rc) {
			kvt_block_unpin(e, id);
			kvt_block_kill(e, id);
			rc = kvt_err(rc, "no HBM slot for a new block (%u of %u HBM slots pinned)",
				     e->hbm_pinned, e->slots[KVT_TIER_HBM].n_slots);
			goto undo;
		}
		e->blocks[id].slot[KVT_TIER_HBM] = slot;
		kvt_block_bump_ver(e, id);
		kvt_copy_set_present(e, id, KVT_TIER_HBM, e->blocks[id].ver);
		s->blocks[s->n_blocks++] = id;
		s->wpins[s->n_wpins++] = id; /* pinned above */
	}
	for (pos = s->n_tokens; pos < end; pos++) {
		id = s->blocks[pos / tpb];
		slot_mapping[pos - s->n_tokens] =
			(int64_t)e->blocks[id].slot[KVT_TIER_HBM] * tpb + (int64_t)(pos % tpb);
		s->tokens[pos] = tokens ? tokens[pos - s->n_tokens] : -1;
	}
	s->n_tokens = end;
	s->parked = 0;
	return 0;
undo:
	/* new blocks go away again; the partial block keeps its pin until release */
	while (s->n_blocks > first_new) {
		id = s->blocks[--s->n_blocks];
		s->n_wpins--;
		kvt_block_unpin(e, id);
		kvt_block_kill(e, id);
	}
	return rc;
}

int
kvt_seq_append(struct kvt_engine *e, kvt_seq_id id, const int32_t *tokens, size_t n,
	       int64_t *slot_mapping)
{
	uint32_t idx;
	int rc;

	if (!e || !slot_mapping)
		return kvt_err(-EINVAL, "kvt_seq_append: engine and slot_mapping must not be NULL");
	if (n == 0 || n > SEQ_MAX_APPEND)
		return kvt_err(-EINVAL, "kvt_seq_append: n = %zu tokens, must be 1..%u", n,
			       SEQ_MAX_APPEND);
	kvt_lock(e);
	if (!kvt_seq_lookup(e, id, &idx))
		rc = kvt_err(KVT_ECLOSED, "sequence %#llx is not open", (unsigned long long)id);
	else if (e->seqs[idx].in_batch)
		rc = kvt_err(KVT_EBUSY, "sequence %#llx is in an unreleased batch",
			     (unsigned long long)id);
	else
		rc = seq_append_locked(e, idx, tokens, n, slot_mapping);
	kvt_unlock(e);
	return rc;
}

int
kvt_seq_park(struct kvt_engine *e, kvt_seq_id id, enum kvt_tier target)
{
	struct kvt_seqrec *s;
	uint32_t idx, i;
	int rc = 0, t = (int)target;

	if (!e)
		return kvt_err(-EINVAL, "kvt_seq_park: engine is NULL");
	if (t != KVT_TIER_HOST && t != KVT_TIER_NVME)
		return kvt_err(-EINVAL, "park target %d: must be KVT_TIER_HOST or KVT_TIER_NVME", t);
	kvt_lock(e);
	s = kvt_seq_lookup(e, id, &idx);
	if (!s) {
		rc = kvt_err(KVT_ECLOSED, "sequence %#llx is not open", (unsigned long long)id);
		goto out;
	}
	if (s->in_batch) {
		rc = kvt_err(KVT_EBUSY, "sequence %#llx is in an unreleased batch",
			     (unsigned long long)id);
		goto out;
	}
	/* a tier the engine lacks: the next one down, or up when there is none below */
	while (t < KVT_TIER_COUNT && !e->slots[t].n_slots)
		t++;
	if (t == KVT_TIER_COUNT)
		t = KVT_TIER_HOST;
	if (!e->slots[t].n_slots) {
		rc = kvt_err(-ENOSPC, "no HOST or NVME tier to park sequence %#llx in",
			     (unsigned long long)id);
		goto out;
	}
	kvt_seq_unpin_writes(e, s);
	s->hint_no = 0; /* parked: whatever was announced for it no longer holds */
	for (i = 0; i < s->n_blocks && rc == 0; i++) {
		rc = kvt_demote_to(e, s->blocks[i], t, true);
		if (rc == -ENOSPC)
			rc = kvt_err(-ENOSPC, "no room below HBM to park block %u of sequence %#llx",
				     i, (unsigned long long)id);
	}
	if (rc == 0)
		rc = kvt_xfer_flush(e);
	if (rc == 0)
		s->parked = 1;
out:
	kvt_unlock(e);
	return rc;
}

int
kvt_seq_resume(struct kvt_engine *e, kvt_seq_id id)
{
	struct kvt_seqrec *s;
	uint32_t idx, i;
	int rc = 0;

	if (!e)
		return kvt_err(-EINVAL, "kvt_seq_resume: engine is NULL");
	kvt_lock(e);
	s = kvt_seq_lookup(e, id, &idx);
	if (!s) {
		rc = kvt_err(KVT_ECLOSED, "sequence %#llx is not open", (unsigned long long)id);
		goto out;
	}
	s->parked = 0;
	/* best effort, in order: NVMe reads are started first since they are slowest; blocks
	 * already in HOST go up as room allows. Prepare finishes whatever is left. */
	e->prefetching = true; /* ahead of the next prepare: counted as prefetched */
	for (i = 0; i < s->n_blocks; i++)
		if (kvt_promote_hbm(e, s->blocks[i], false) == KVT_ELOST)
			break; /* reported by the next prepare, which truncates */
	e->prefetching = false;
	rc = kvt_xfer_flush(e);
out:
	kvt_unlock(e);
	return rc;
}

int
kvt_seq_info(struct kvt_engine *e, kvt_seq_id id, struct kvt_seq_info *out)
{
	struct kvt_seqrec *s;
	uint32_t i;
	int t;

	if (!e || !out)
		return kvt_err(-EINVAL, "kvt_seq_info: engine and out must not be NULL");
	kvt_lock(e);
	s = kvt_seq_lookup(e, id, NULL);
	if (!s) {
		kvt_unlock(e);
		return kvt_err(KVT_ECLOSED, "sequence %#llx is not open", (unsigned long long)id);
	}
	memset(out, 0, sizeof *out);
	out->n_tokens = s->n_tokens;
	out->n_blocks = s->n_blocks;
	out->tenant = s->tenant;
	out->priority = s->priority;
	out->parked = s->parked;
	for (i = 0; i < s->n_blocks; i++)
		for (t = 0; t < KVT_TIER_COUNT; t++)
			out->blocks_in[t] += kvt_copy_valid(&e->blocks[s->blocks[i]], t);
	kvt_unlock(e);
	return 0;
}
