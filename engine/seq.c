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
#define SEQ_PARK_PIN_WAITS 1000u /* waits for a block pinned for a moment by another thread */

static kvt_seq_id
seq_make_id(uint32_t idx, uint32_t gen)
{
	return ((uint64_t)gen << 32) | idx;
}

/* The id of record @s as messages print it (%#llx), as the caller knows it. */
#define SEQ_ID_ARG(s) ((unsigned long long)seq_make_id((uint32_t)((s) - e->seqs), (s)->gen))

/* KVT_EBUSY for a call on sequence @id while another thread's append, park, prepare or detach
 * of it sleeps with the lock released (s->in_call): it must not change under that call. */
static int
seq_err_in_call(kvt_seq_id id)
{
	return kvt_err(KVT_EBUSY, "sequence %#llx is in use by another thread's call (an append, "
		       "park or prepare of it waiting for a transfer)", (unsigned long long)id);
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
	struct kvt_seq_opts d = { .opts_size = size, .tenant = 0, .priority = 50,
				  .retention_ms = 0, .salt = 0, .extra_key = 0 };

	if (!o)
		return;
	memcpy(o, &d, size < sizeof d ? size : sizeof d);
}

int
kvt_seq_opts_copy(struct kvt_seq_opts *dst, const struct kvt_seq_opts *o)
{
	kvt_seq_opts_init(dst, sizeof *dst);
	if (o) {
		if (o->opts_size < offsetof(struct kvt_seq_opts, priority) + 1 ||
		    o->opts_size > 4096)
			return kvt_err(-EINVAL, "kvt_seq_opts.opts_size %zu is not a valid size",
				       o->opts_size);
		memcpy(dst, o, o->opts_size < sizeof *dst ? o->opts_size : sizeof *dst);
	}
	if (dst->priority > 100)
		return kvt_err(-EINVAL, "priority %u is out of range 0..100", dst->priority);
	return 0;
}

/* Prefix key material: the tenant, the salt and the extra key (adapter id, model revision)
 * hashed together (kvt_prefix_salt), so sequences share only within one tenant, with equal
 * salts and extra keys; no salt value reaches another tenant's blocks. */
static void
seq_salt(const struct kvt_seq_opts *o, uint64_t salt[2])
{
	kvt_prefix_salt(o->tenant, o->salt, o->extra_key, salt);
}

static int
seq_grow_table(struct kvt_engine *e)
{
	/* grown by an eighth (at least 64): at most 12.5% of the records idle, amortised O(1) */
	uint32_t ncap = e->cap_seqs + (e->cap_seqs / 8 > 64 ? e->cap_seqs / 8 : 64), i;
	struct kvt_seqrec *ns;

	if (ncap <= e->cap_seqs || ncap >= KVT_NIL)
		return kvt_err(-ENOMEM, "sequence table full");
	if (e->win_tokens) { /* the windowed engine's per-sequence window state */
		struct kvt_winseq *nw = kvt_realloc(e->winseq, (size_t)ncap * sizeof *nw);

		if (!nw)
			return kvt_err(-ENOMEM, "growing the window state to %u sequences", ncap);
		memset(nw + e->cap_seqs, 0, (size_t)(ncap - e->cap_seqs) * sizeof *nw);
		e->winseq = nw;
	}
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

/* Take a free sequence record and open it with @opts (checked). Lock held. */
int
kvt_seq_open_locked(struct kvt_engine *e, const struct kvt_seq_opts *opts, uint32_t *out)
{
	struct kvt_seqrec *s;
	uint32_t idx;
	int rc = 0;

	if (e->seq_free == KVT_NIL)
		rc = seq_grow_table(e);
	if (rc)
		return rc;
	idx = e->seq_free;
	s = &e->seqs[idx];
	e->seq_free = s->next_free;
	s->open = 1;
	s->tenant = opts->tenant;
	s->priority = opts->priority;
	s->session_key = opts->session_key;
	s->pub_pending = 0;
	s->retention_ms = opts->retention_ms;
	s->hint_no = 0;
	s->rel_no = 0;
	s->rot_part = 0;
	s->last_use_ns = kvt_now_ns();
	seq_salt(opts, s->salt);
	s->n_tokens = 0;
	s->n_blocks = 0;
	s->n_wpins = 0;
	s->parked = s->in_batch = 0;
	kvt_seq_set_first_live(e, s, 0);
	if (e->winseq)
		e->winseq[idx].n_ask = 0;
	s->tail_hashed = 0;
	e->n_open_seqs++;
	e->seq_opened = true; /* the window (kvt_engine_set_window) is fixed from here on */
	*out = idx;
	return 0;
}

/* A new sequence may take session key @key: none open has it, and the store has no session
 * under it (that one is reopened with kvt_seq_restore, or dropped first). Lock held. */
static int
seq_key_free(struct kvt_engine *e, uint64_t key)
{
	if (!key)
		return 0;
	for (uint32_t i = 0; i < e->cap_seqs; i++)
		if (e->seqs[i].open && e->seqs[i].session_key == key)
			return kvt_err(KVT_EBUSY, "session key %#llx is in use by an open sequence",
				       (unsigned long long)key);
	if (e->store && kvt_store_find(e->store, key))
		return kvt_err(-EEXIST, "session key %#llx names a stored session: restore it "
			       "(kvt_seq_restore) or drop it (kvt_session_drop) first",
			       (unsigned long long)key);
	return 0;
}

int
kvt_seq_open(struct kvt_engine *e, const struct kvt_seq_opts *o, kvt_seq_id *out)
{
	struct kvt_seq_opts opts;
	uint32_t idx;
	int rc;

	if (!e || !out)
		return kvt_err(-EINVAL, "kvt_seq_open: engine and out must not be NULL");
	if (e->grp)
		return kvt_grp_seq_open(e, o, out);
	*out = 0;
	rc = kvt_seq_opts_copy(&opts, o);
	if (rc)
		return rc;
	kvt_lock(e);
	rc = seq_key_free(e, opts.session_key);
	if (rc == 0)
		rc = kvt_seq_open_locked(e, &opts, &idx);
	if (rc == 0)
		*out = seq_make_id(idx, e->seqs[idx].gen);
	kvt_unlock(e);
	return rc;
}

/* Hash the blocks of s that are full by token @end and whose tokens are all known, each chained
 * to its parent's key (sealed blocks are immutable: appends only touch the partial last one). */
static void
seq_hash_blocks(struct kvt_engine *e, struct kvt_seqrec *s, uint64_t from, uint64_t end)
{
	static const uint64_t zero[2] = { 0, 0 };
	uint32_t tpb = e->layout.tokens_per_block, k, i;
	uint64_t ph[2], h[2];

	for (k = (uint32_t)(from / tpb); (uint64_t)(k + 1) * tpb <= end; k++) {
		struct kvt_block *b = kvt_blk(e, s->blocks[k]);
		const struct kvt_block *p = k && s->blocks[k - 1] != KVT_NIL ?
					    kvt_blk(e, s->blocks[k - 1]) : NULL;
		const int32_t *tok = s->tokens + (uint64_t)k * tpb;

		if (b->hashed)
			continue;
		if (p && !p->hashed)
			return;
		/* the parent dropped out of the window (a hole): its key was kept */
		if (k && !p && (!s->tail_hashed || k != kvt_seq_first_live(e, s)))
			return;
		for (i = 0; i < tpb; i++)
			if (tok[i] < 0)
				return; /* tokens not given: v0 behaviour, no sharing */
		if (p)
			kvt_blk_key(p, ph);
		else if (k)
			memcpy(ph, kvt_win_tail(e, s), sizeof ph);
		kvt_prefix_hash(k ? ph : zero, tok, tpb, s->salt, h);
		kvt_blk_set_key(b, h);
		b->hashed = 1;
	}
}

void
kvt_seq_publish(struct kvt_engine *e, struct kvt_seqrec *s)
{
	uint32_t i;

	for (i = 0; i < s->n_wpins; i++) {
		struct kvt_block *b = kvt_blk(e, s->wpins[i]);

		/* only the creator indexes a block (its tokens are borrowed from s) */
		if (b->hashed && !b->indexed && !b->lost && b->live && !b->dead &&
		    b->seq < e->cap_seqs && &e->seqs[b->seq] == s &&
		    (e->ckpt_every <= 1 || kvt_win_keep(e, s, b->index))) {
			uint64_t h[2];
			bool again;

			kvt_blk_key(b, h);
			/* the same key indexed already: sealed a second time (reuse evidence) */
			again = kvt_prefix_key_block(e, h) != KVT_NIL;
			/* -ENOMEM only costs sharing: the block stays private */
			(void)kvt_prefix_insert(e, s->wpins[i]);
			if (e->remote) /* write-through (issue 18 item 1) */
				kvt_reng_sealed(e, s->wpins[i], again);
		}
	}
	if (e->remote)
		kvt_reng_kick(e);
}

uint32_t
kvt_seq_wpinned(const struct kvt_engine *e)
{
	uint32_t i, n = 0;

	for (i = 0; i < e->cap_seqs; i++)
		if (e->seqs[i].open)
			n += e->seqs[i].n_wpins;
	return n;
}

void
kvt_seq_unpin_writes(struct kvt_engine *e, struct kvt_seqrec *s)
{
	uint32_t i;

	for (i = 0; i < s->n_wpins; i++)
		kvt_block_unpin(e, s->wpins[i]);
	s->n_wpins = 0;
}

/* @s drops block @id: an indexed block it created keeps its tokens (kvt_prefix_detach). */
static void
seq_drop_block(struct kvt_engine *e, struct kvt_seqrec *s, uint32_t id)
{
	uint32_t owner = kvt_blk(e, id)->seq;

	if (owner < e->cap_seqs && &e->seqs[owner] == s)
		(void)kvt_prefix_detach(e, id); /* -ENOMEM: left the index, still correct */
	kvt_block_kill(e, id);
}

/* Take block @id out of @s's write pins (it leaves the sequence). */
static void
seq_drop_wpin(struct kvt_engine *e, struct kvt_seqrec *s, uint32_t id)
{
	uint32_t i;

	for (i = 0; i < s->n_wpins; i++) {
		if (s->wpins[i] == id) {
			s->wpins[i] = s->wpins[--s->n_wpins];
			kvt_block_unpin(e, id);
			return;
		}
	}
}

void
kvt_win_advance(struct kvt_engine *e, struct kvt_seqrec *s, uint64_t q)
{
	uint32_t lo = kvt_win_first_block(e, q), j = kvt_win_sink_blocks(e);

	if (lo > s->n_blocks)
		lo = s->n_blocks;
	if (j < kvt_seq_first_live(e, s))
		j = kvt_seq_first_live(e, s);
	for (; j < lo; j++) {
		uint32_t id = s->blocks[j];
		struct kvt_block *b;

		if (id == KVT_NIL)
			continue;
		b = kvt_blk(e, id);
		if (j + 1 == lo) { /* the next block chains to its key */
			s->tail_hashed = b->hashed;
			kvt_blk_key(b, kvt_win_tail(e, s));
		}
		if (s->hint_no && b->hint_no == kvt_hint_stamp(s->hint_no))
			b->hint_no = 0; /* no longer this sequence's to spare */
		seq_drop_wpin(e, s, id);
		seq_drop_block(e, s, id);
		s->blocks[j] = KVT_NIL;
	}
	if (lo > kvt_seq_first_live(e, s))
		kvt_seq_set_first_live(e, s, lo);
}

void
kvt_seq_truncate(struct kvt_engine *e, struct kvt_seqrec *s, uint32_t first_lost)
{
	uint64_t tpb = e->layout.tokens_per_block;
	uint32_t i, sink = kvt_win_sink_blocks(e);

	if (first_lost >= s->n_blocks)
		return;
	/* a windowed sequence whose new next query would read holes (blocks already dropped)
	 * can only go on from its sinks: it is truncated there */
	if (kvt_seq_first_live(e, s) > sink && first_lost > sink &&
	    kvt_win_first_block(e, (uint64_t)first_lost * tpb) < kvt_seq_first_live(e, s))
		first_lost = sink;
	kvt_seq_unpin_writes(e, s);
	kvt_hint_drop(e, s); /* what was announced is gone in part: announce again */
	for (i = first_lost; i < s->n_blocks; i++)
		if (s->blocks[i] != KVT_NIL)
			seq_drop_block(e, s, s->blocks[i]);
	s->n_blocks = first_lost;
	if (kvt_seq_first_live(e, s) > first_lost) {
		kvt_seq_set_first_live(e, s, 0);
		s->tail_hashed = 0;
	}
	if (s->n_tokens > (uint64_t)first_lost * tpb)
		s->n_tokens = (uint64_t)first_lost * tpb;
}

/* Close the open sequence @s (index @idx), engine lock held: @keep (detach) leaves its
 * published record restorable instead of deleting it. */
static void
seq_close_locked(struct kvt_engine *e, struct kvt_seqrec *s, uint32_t idx, bool keep)
{
	uint32_t i;

	kvt_seq_unpin_writes(e, s);
	if (keep)
		kvt_persist_keep(e, s);
	else
		kvt_persist_forget(e, s);
	kvt_hint_drop(e, s);
	/* blocks with transfers in flight are freed by those completions, never before */
	for (i = 0; i < s->n_blocks; i++)
		if (s->blocks[i] != KVT_NIL) /* a hole: dropped out of the window */
			seq_drop_block(e, s, s->blocks[i]);
	s->n_blocks = 0;
	kvt_seq_set_first_live(e, s, 0);
	s->tail_hashed = 0;
	s->n_tokens = 0;
	s->hint_no = 0;
	s->open = 0;
	s->gen++;
	if (s->gen == 0)
		s->gen = 1;
	s->next_free = e->seq_free;
	e->seq_free = idx;
	e->n_open_seqs--;
}

static int
seq_close_or_detach(struct kvt_engine *e, kvt_seq_id id, bool keep)
{
	const char *fn = keep ? "kvt_seq_detach" : "kvt_seq_close";
	struct kvt_seqrec *s;
	bool publish;
	uint32_t idx;
	int rc = 0;

	if (!e)
		return kvt_err(-EINVAL, "%s: engine is NULL", fn);
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
	if (s->in_call) {
		kvt_unlock(e);
		return seq_err_in_call(id);
	}
	/* detach: a park still in flight is finished and published first; a wait releases the
	 * lock, so no other call changes the sequence meanwhile (in_call) and its record is
	 * looked up again after each (the table may have moved) */
	publish = keep && s->pub_pending && s->parked;
	if (publish)
		s->in_call = 1;
	while (publish && rc >= 0 && s->pub_pending &&
	       (kvt_xfer_inflight(e) || e->d2h.n_pending || e->h2d.n_pending)) {
		rc = kvt_xfer_wait_any(e);
		s = &e->seqs[idx];
	}
	s->in_call = 0;
	if (publish && rc >= 0 && s->pub_pending)
		kvt_persist_publish(e);
	if (publish && (s->pub_pending || kvt_store_failed(e->store))) {
		rc = kvt_err(rc < 0 ? rc : -EIO, "kvt_seq_detach: the park of sequence %#llx "
			     "(session %#llx) could not be published; it stays open",
			     (unsigned long long)id, (unsigned long long)s->session_key);
		kvt_unlock(e);
		return rc;
	}
	seq_close_locked(e, s, idx, keep);
	kvt_unlock(e);
	return 0;
}

int
kvt_seq_close(struct kvt_engine *e, kvt_seq_id id)
{
	if (e && e->grp)
		return kvt_grp_seq_close(e, id, false);
	return seq_close_or_detach(e, id, false);
}

int
kvt_seq_detach(struct kvt_engine *e, kvt_seq_id id)
{
	if (e && e->grp)
		return kvt_grp_seq_close(e, id, true);
	return seq_close_or_detach(e, id, true);
}

int
kvt_seq_reserve(struct kvt_seqrec *s, uint64_t n_tokens, uint32_t n_blocks, uint32_t n_wpins)
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
		struct kvt_block *b = kvt_blk(e, id);

		if (kvt_copy_valid(b, KVT_TIER_HBM) && !b->busy)
			break;
		if (kvt_copy_state(b, KVT_TIER_HBM) != KVT_COPY_ABSENT) {
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
	uint32_t slots = e->slots[KVT_TIER_HBM].n_slots, pinned_after, held;
	int rc;

	/* blocks that earlier appends filled have their K/V written by now (the caller writes
	 * them before appending again): they become shareable */
	kvt_seq_publish(e, s);
	/* a windowed sequence drops the blocks no query from this append's first on reads */
	kvt_win_advance(e, s, s->n_tokens);
	/* the blocks this append pins: the touched ones (the partial last block may already be
	 * write-pinned by an earlier append) plus those earlier write pins */
	pinned_after = s->n_wpins + touched;
	if (touched && s->n_tokens % tpb && seq_has_wpin(s, s->blocks[s->n_blocks - 1]))
		pinned_after--;
	if (end > (uint64_t)KVT_SEQ_MAX_BLOCKS * tpb)
		return kvt_err(KVT_ETOOBIG, "appending %zu tokens makes the sequence longer "
			       "than %u blocks (the most a block record can place)", n,
			       KVT_SEQ_MAX_BLOCKS);
	held = need_blocks - (first_new - kvt_seq_live_in(e, s, 0, first_new)); /* no holes */
	if (held > kvt_seq_max_blocks(e))
		return kvt_err(KVT_ETOOBIG, "appending %zu tokens makes the sequence hold %u "
			       "blocks (holes out of its window not counted); it may hold at most "
			       "%u (all tiers' slots less the reserve of one per tier below HBM): it "
			       "could never be read back", n, held, kvt_seq_max_blocks(e));
	if (touched > slots)
		return kvt_err(KVT_ETOOBIG,
			       "appending %zu tokens needs %u HBM blocks at once; HBM has %u slots "
			       "(append fewer tokens per call)", n, touched, slots);
	if (pinned_after > slots)
		return kvt_err(-ENOSPC,
			       "appending %zu tokens would hold %u blocks pinned for writing; HBM has "
			       "%u slots: release a batch holding this sequence first", n,
			       pinned_after, slots);
	if (kvt_seq_reserve(s, end, need_blocks, s->n_wpins + touched))
		return kvt_err(-ENOMEM, "growing sequence arrays to %llu tokens",
			       (unsigned long long)end);
	if (s->n_tokens % tpb) {
		rc = seq_ready_last(e, s, &id);
		s = &e->seqs[sidx]; /* the wait released the lock: the table may have moved */
		if (rc == KVT_ELOST)
			kvt_seq_truncate(e, s, s->n_blocks - 1);
		if (rc)
			return kvt_err(rc, "bringing the last block of the sequence into HBM");
		seq_add_wpin(e, s, id);
		kvt_block_bump_ver(e, id, (uint32_t)(s->n_tokens % tpb));
	}
	for (i = first_new; i < need_blocks; i++) {
		rc = kvt_block_new(e, sidx, i, &id);
		if (rc)
			goto undo;
		kvt_block_pin(e, id);
		rc = kvt_reclaim(e, KVT_TIER_HBM, 1, true);
		s = &e->seqs[sidx]; /* as above */
		if (rc == 0)
			rc = kvt_slot_alloc(e, KVT_TIER_HBM, id, &slot);
		if (rc) {
			kvt_block_unpin(e, id);
			kvt_block_kill(e, id);
			rc = kvt_err(rc, "no HBM slot for a new block (%u of %u HBM slots pinned, "
				     "%u of them by appends no batch release or park has unpinned "
				     "yet, the others by unreleased batches)", e->hbm_pinned,
				     e->slots[KVT_TIER_HBM].n_slots, kvt_seq_wpinned(e));
			goto undo;
		}
		kvt_blk(e, id)->slot[KVT_TIER_HBM] = slot;
		kvt_block_bump_ver(e, id, 0);
		kvt_copy_set_present(e, id, KVT_TIER_HBM);
		s->blocks[s->n_blocks++] = id;
		s->wpins[s->n_wpins++] = id; /* pinned above */
	}
	for (pos = s->n_tokens; pos < end; pos++) {
		id = s->blocks[pos / tpb];
		slot_mapping[pos - s->n_tokens] =
			(int64_t)kvt_blk(e, id)->slot[KVT_TIER_HBM] * tpb + (int64_t)(pos % tpb);
		s->tokens[pos] = tokens ? tokens[pos - s->n_tokens] : -1;
	}
	seq_hash_blocks(e, s, s->n_tokens, end);
	s->n_tokens = end;
	s->parked = 0;
	s->last_use_ns = kvt_now_ns();
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
	if (e->grp)
		return kvt_err(-EINVAL, "kvt_seq_append: the engine has layer groups: use "
			       "kvt_seq_append_groups (one slot mapping per group)");
	if (n == 0 || n > SEQ_MAX_APPEND)
		return kvt_err(-EINVAL, "kvt_seq_append: n = %zu tokens, must be 1..%u", n,
			       SEQ_MAX_APPEND);
	kvt_lock(e);
	if (!kvt_seq_lookup(e, id, &idx))
		rc = kvt_err(KVT_ECLOSED, "sequence %#llx is not open", (unsigned long long)id);
	else if (e->seqs[idx].in_batch)
		rc = kvt_err(KVT_EBUSY, "sequence %#llx is in an unreleased batch",
			     (unsigned long long)id);
	else if (e->seqs[idx].in_call)
		rc = seq_err_in_call(id);
	else {
		/* waits inside release the lock: no other call changes the sequence meanwhile */
		e->seqs[idx].in_call = 1;
		rc = seq_append_locked(e, idx, tokens, n, slot_mapping);
		e->seqs[idx].in_call = 0;
	}
	kvt_unlock(e);
	return rc;
}

int
kvt_seq_park(struct kvt_engine *e, kvt_seq_id id, enum kvt_tier target)
{
	struct kvt_seqrec *s;
	uint32_t idx;
	int rc = 0, t = (int)target;

	if (!e)
		return kvt_err(-EINVAL, "kvt_seq_park: engine is NULL");
	if (t != KVT_TIER_HOST && t != KVT_TIER_NVME)
		return kvt_err(-EINVAL, "park target %d: must be KVT_TIER_HOST or KVT_TIER_NVME", t);
	if (e->grp)
		return kvt_grp_seq_park(e, id, target, false);
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
	if (s->in_call) {
		rc = seq_err_in_call(id);
		goto out;
	}
	rc = kvt_seq_park_locked(e, s, t);
out:
	kvt_unlock(e);
	return rc;
}

/* A parked sequence keeps exact-size arrays (thousands of them may sit idle): its token and
 * block arrays shrink to what it holds, its write-pin array (empty after parking) goes. A
 * failed shrink keeps the larger array. */
static void
seq_shrink(struct kvt_seqrec *s)
{
	void *p;

	if (s->cap_tokens > s->n_tokens && s->n_tokens &&
	    (p = kvt_realloc(s->tokens, s->n_tokens * sizeof *s->tokens))) {
		s->tokens = p;
		s->cap_tokens = s->n_tokens;
	}
	if (s->cap_blocks > s->n_blocks && s->n_blocks &&
	    (p = kvt_realloc(s->blocks, (size_t)s->n_blocks * sizeof *s->blocks))) {
		s->blocks = p;
		s->cap_blocks = s->n_blocks;
	}
	if (!s->n_wpins) {
		kvt_free(s->wpins);
		s->wpins = NULL;
		s->cap_wpins = 0;
	}
}

/* Whether block @id of a sequence parked to NVMe still needs an NVMe slot: it has contents and
 * no NVMe copy that is, or will be, current; a block pinned by another sequence's batch (shared)
 * stays where it is. */
static bool
seq_needs_nvme(struct kvt_engine *e, uint32_t id)
{
	const struct kvt_block *b = kvt_blk(e, id);

	if (b->lost || b->pins || !kvt_block_current(b))
		return false;
	return kvt_copy_state(b, KVT_TIER_NVME) == KVT_COPY_ABSENT ||
	       kvt_copy_stale(b, KVT_TIER_NVME);
}

/*
 * Before a park to NVMe moves anything: the NVMe slots its blocks need, made free now (cached
 * blocks nobody references, clean duplicates and restorable stored sessions go); -ENOSPC with a
 * message when the tier cannot hold them (nothing moved then). The blocks that go from HBM
 * reach NVMe in two steps (HBM -> HOST, then HOST -> NVMe when that copy lands): each keeps its
 * NVMe slot free meanwhile (e->nvme_promised, which every other NVMe allocation leaves), so a
 * park that returns 0 has every block on NVMe, or on its way there, once its copies complete.
 */
static int
seq_park_nvme_room(struct kvt_engine *e, struct kvt_seqrec *s)
{
	struct kvt_slots *sl = &e->slots[KVT_TIER_NVME];
	uint32_t i, need = 0;

	for (i = 0; i < s->n_blocks; i++)
		need += s->blocks[i] != KVT_NIL && seq_needs_nvme(e, s->blocks[i]);
	if ((uint64_t)need + e->nvme_promised <= sl->n_free ||
	    kvt_reclaim(e, KVT_TIER_NVME, need, true) == 0)
		return 0;
	if (need > sl->n_slots)
		return kvt_err(-ENOSPC, "sequence %#llx cannot be parked to NVMe: %u of its blocks need "
			       "NVMe slots, the tier has %u (park it to HOST); nothing moved",
			       SEQ_ID_ARG(s), need, sl->n_slots);
	return kvt_err(-ENOSPC, "no room on NVMe to park sequence %#llx: %u blocks need NVMe slots, "
		       "%u of %u are free (%u kept for other parks on their way down) and the rest "
		       "hold live blocks; nothing moved", SEQ_ID_ARG(s), need, sl->n_free,
		       sl->n_slots, e->nvme_promised);
}

int
kvt_seq_park_locked(struct kvt_engine *e, struct kvt_seqrec *s, int t)
{
	uint64_t t0 = kvt_now_ns();
	uint32_t i, tries, sidx = (uint32_t)(s - e->seqs);
	int rc = 0;

	/* a tier the engine lacks: the next one down, or up when there is none below */
	while (t < KVT_TIER_COUNT && !e->slots[t].n_slots)
		t++;
	if (t == KVT_TIER_COUNT)
		t = KVT_TIER_HOST;
	if (!e->slots[t].n_slots)
		return kvt_err(-ENOSPC, "no HOST or NVME tier to park sequence %#llx in",
			       SEQ_ID_ARG(s));
	kvt_seq_publish(e, s); /* K/V written by now (the park copies them): shareable */
	kvt_seq_unpin_writes(e, s);
	kvt_hint_drop(e, s); /* parked: whatever was announced for it no longer holds */
	/* a wait (for NVMe room, in a demotion) releases the lock: no other call changes the
	 * sequence meanwhile, and its record is looked up again after each (the table may have
	 * moved) */
	s->in_call = 1;
	if (t == KVT_TIER_NVME)
		rc = seq_park_nvme_room(e, s);
	s = &e->seqs[sidx];
	for (i = 0, tries = 0; i < s->n_blocks && rc == 0; i++) {
		if (s->blocks[i] == KVT_NIL)
			continue; /* a hole: out of the window, nothing to move */
		rc = kvt_demote_to(e, s->blocks[i], t, true);
		s = &e->seqs[sidx];
		if (rc == KVT_EBUSY && kvt_blk(e, s->blocks[i])->refs > 1)
			rc = 0; /* shared, and in another sequence's batch: it stays for that one */
		if (rc == KVT_EBUSY && tries++ < SEQ_PARK_PIN_WAITS) {
			/* pinned for a moment by another thread's eviction or promotion that
			 * sleeps (lock released) on a transfer: once that moves, look again */
			rc = kvt_xfer_wait_any(e);
			s = &e->seqs[sidx];
			if (rc >= 0) {
				rc = 0;
				i--;
			}
		}
		if (rc == -ENOSPC)
			rc = kvt_err(-ENOSPC, "no room below HBM to park block %u of sequence %#llx",
				     i, SEQ_ID_ARG(s));
		else if (rc == KVT_EBUSY)
			rc = kvt_err(KVT_EBUSY, "block %u of sequence %#llx stayed pinned by another "
				     "thread's transfer through %u waits: park it again later", i,
				     SEQ_ID_ARG(s), SEQ_PARK_PIN_WAITS);
	}
	s->in_call = 0;
	if (rc == 0)
		rc = kvt_xfer_flush(e);
	if (rc == 0) {
		s->parked = 1;
		seq_shrink(s);
		if (t == KVT_TIER_NVME)
			kvt_persist_parked(e, s);
		kvt_stats_record_lat(&e->st.park, kvt_now_ns() - t0);
	}
	return rc;
}


int
kvt_seq_resume(struct kvt_engine *e, kvt_seq_id id)
{
	struct kvt_seqrec *s;
	uint64_t t0;
	uint32_t idx, i;
	int rc = 0;

	if (!e)
		return kvt_err(-EINVAL, "kvt_seq_resume: engine is NULL");
	if (e->grp)
		return kvt_grp_seq_park(e, id, KVT_TIER_HBM, true);
	kvt_lock(e);
	t0 = kvt_now_ns();
	s = kvt_seq_lookup(e, id, &idx);
	if (!s) {
		rc = kvt_err(KVT_ECLOSED, "sequence %#llx is not open", (unsigned long long)id);
		goto out;
	}
	if (s->in_call) {
		rc = seq_err_in_call(id);
		goto out;
	}
	s->parked = 0;
	s->last_use_ns = kvt_now_ns();
	/* best effort, in order: NVMe reads are started first since they are slowest; blocks
	 * already in HOST go up as room allows. Prepare finishes whatever is left. */
	e->prefetching = true; /* ahead of the next prepare: counted as prefetched */
	for (i = 0; i < s->n_blocks; i++)
		if (s->blocks[i] != KVT_NIL && /* a hole: out of the window */
		    kvt_promote_hbm(e, s->blocks[i], false) == KVT_ELOST)
			break; /* reported by the next prepare, which truncates */
	e->prefetching = false;
	rc = kvt_xfer_flush(e);
	if (rc == 0)
		kvt_stats_record_lat(&e->st.resume, kvt_now_ns() - t0);
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
	if (e->grp)
		return kvt_grp_seq_info(e, id, out);
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
		for (t = 0; t < KVT_TIER_COUNT && s->blocks[i] != KVT_NIL; t++)
			out->blocks_in[t] += kvt_copy_valid(kvt_blk(e, s->blocks[i]), t);
	kvt_unlock(e);
	return 0;
}

int
kvt_seq_set_priority(struct kvt_engine *e, kvt_seq_id id, uint64_t first_token,
		     uint64_t n_tokens, uint8_t priority, uint32_t duration_ms)
{
	uint64_t tpb, end, until;
	struct kvt_seqrec *s;
	uint32_t b;
	int rc = 0;

	if (!e)
		return kvt_err(-EINVAL, "kvt_seq_set_priority: engine is NULL");
	if (e->grp)
		return kvt_grp_seq_set_priority(e, id, first_token, n_tokens, priority, duration_ms);
	if (priority > KVT_EVICT_PRIO_MAX)
		return kvt_err(-EINVAL, "priority %u is out of range 0..100", priority);
	kvt_lock(e);
	s = kvt_seq_lookup(e, id, NULL);
	if (!s) {
		rc = kvt_err(KVT_ECLOSED, "sequence %#llx is not open", (unsigned long long)id);
		goto out;
	}
	end = n_tokens ? first_token + n_tokens : s->n_tokens;
	if (!n_tokens && first_token == s->n_tokens)
		goto out; /* "from here to the end" of what is there: an empty range, nothing to do */
	if (first_token >= s->n_tokens || end > s->n_tokens || end < first_token) {
		rc = kvt_err(-EINVAL, "token range %llu+%llu is past the sequence's %llu tokens",
			     (unsigned long long)first_token, (unsigned long long)n_tokens,
			     (unsigned long long)s->n_tokens);
		goto out;
	}
	tpb = e->layout.tokens_per_block;
	until = duration_ms ? e->evict[0].now_ns() + duration_ms * 1000000ull : 0; /* policy clock */
	for (b = (uint32_t)(first_token / tpb); b < (uint32_t)((end + tpb - 1) / tpb); b++)
		if (s->blocks[b] != KVT_NIL) /* a hole: out of the window */
			kvt_block_set_prio(e, s->blocks[b], priority, until);
out:
	kvt_unlock(e);
	return rc;
}

void
kvt_seq_idle_scan(struct kvt_engine *e)
{
	uint64_t now = kvt_now_ns(), idle = e->opts.idle_timeout_ms * 1000000ull;
	uint32_t i;

	/* a scan costs O(open sequences): at most four per timeout period */
	if (now < e->idle_next_ns)
		return;
	e->idle_next_ns = now + idle / 4;
	for (i = 0; i < e->cap_seqs; i++) {
		struct kvt_seqrec *s = &e->seqs[i];

		if (!s->open || s->parked || s->in_batch || s->in_call || !s->n_blocks ||
		    now - s->last_use_ns < idle)
			continue;
		/* best effort: a sequence that cannot move now is tried again next scan */
		if (kvt_seq_park_locked(e, s, (int)e->opts.idle_target) == 0)
			e->st.idle_parked++;
	}
}

/* The fastest tier holding a valid copy of @b (KVT_TIER_COUNT: only in flight). */
static int
seq_best_tier(const struct kvt_block *b)
{
	int t;

	for (t = 0; t < KVT_TIER_COUNT; t++)
		if (kvt_copy_valid(b, t))
			return t;
	return KVT_TIER_COUNT;
}

int
kvt_seq_match_prefix(struct kvt_engine *e, const struct kvt_seq_opts *o, const int32_t *tokens,
		     size_t n, uint64_t *matched_tokens, enum kvt_tier *tier)
{
	struct kvt_seq_opts opts;
	uint32_t *ids, k, i, tpb;
	uint64_t salt[2], nb, cap, tail[2];
	int rc;
	int worst = KVT_TIER_HBM;

	if (!e || (!tokens && n) || !matched_tokens)
		return kvt_err(-EINVAL, "kvt_seq_match_prefix: engine, tokens and matched_tokens "
			       "must not be NULL");
	if (e->grp)
		return kvt_grp_seq_match_prefix(e, o, tokens, n, matched_tokens, tier);
	rc = kvt_seq_opts_copy(&opts, o); /* the size checked as kvt_seq_open does */
	if (rc)
		return rc;
	seq_salt(&opts, salt);
	tpb = e->layout.tokens_per_block;
	*matched_tokens = 0;
	if (tier)
		*tier = KVT_TIER_COUNT;
	if (n < tpb)
		return 0;
	/* no match is longer than the tiers have slots (a stored session's blocks are NVMe
	 * slots too): bound the walk, whatever @n says (the slot counts never change) */
	nb = n / tpb;
	for (i = 0, cap = 0; i < KVT_TIER_COUNT; i++)
		cap += e->slots[i].n_slots;
	if (e->win_tokens) /* a windowed hit holds only its window: holes take no slot */
		cap = KVT_SEQ_MAX_BLOCKS;
	if (nb > cap)
		nb = cap;
	ids = kvt_malloc(nb * sizeof *ids);
	if (!ids)
		return kvt_err(-ENOMEM, "prefix match of %zu tokens", n);
	kvt_lock(e);
	if (e->remote)
		kvt_reng_reap(e); /* remote fetches that landed are local hits now */
	if (e->win_tokens)
		k = kvt_prefix_walk_window(e, tokens, n, salt, opts.tenant, ids, (uint32_t)nb,
					   tail);
	else
		k = kvt_prefix_walk(e, tokens, n, salt, opts.tenant, ids, (uint32_t)nb);
	for (i = 0; i < k; i++) {
		int t = ids[i] == KVT_NIL ? KVT_TIER_HBM : seq_best_tier(kvt_blk(e, ids[i]));

		worst = t > worst ? t : worst;
	}
	/* the rest may be in a session stored before a restart: on NVMe (a windowed engine:
	 * a longer hit whose window a stored session holds) */
	if (e->win_tokens) {
		i = kvt_persist_prefix_window(e, opts.tenant, tokens, n, salt, k, (uint32_t)nb,
					      UINT32_MAX, NULL, NULL);
		if (i > k) {
			k = i;
			worst = KVT_TIER_NVME;
		}
	} else {
		i = kvt_persist_prefix(e, opts.tenant, tokens, salt, k, (uint32_t)nb, UINT32_MAX,
				       NULL);
		if (i)
			worst = KVT_TIER_NVME;
		k += i;
	}
	/* the rest may be in REMOTE: one pipelined lookup, asynchronous (issue 18 item 2) */
	if (e->remote)
		(void)kvt_reng_lookup(e, tokens, n, salt, opts.tenant, k, (uint32_t)nb);
	kvt_unlock(e);
	kvt_free(ids);
	*matched_tokens = (uint64_t)k * tpb;
	if (tier && k)
		*tier = (enum kvt_tier)(worst < KVT_TIER_COUNT ? worst : KVT_TIER_NVME);
	return 0;
}

static int
seq_attach_locked(struct kvt_engine *e, struct kvt_seqrec *s, const int32_t *tokens, size_t n,
		  uint64_t *attached)
{
	uint32_t tpb = e->layout.tokens_per_block, k, i, mem, lo = 0;
	uint64_t max = n / tpb, tail[2];
	uint32_t *ids;

	if (s->in_call)
		return seq_err_in_call(seq_make_id((uint32_t)(s - e->seqs), s->gen));
	if (s->n_tokens || s->in_batch)
		return kvt_err(-EINVAL, "attach a prefix only to an empty sequence not in a batch");
	if (max > kvt_seq_max_blocks(e) && !e->win_tokens)
		max = kvt_seq_max_blocks(e); /* a chain longer than the limit: only once slots
					      * were quarantined for good since it was made */
	if (max > KVT_SEQ_MAX_BLOCKS) /* a windowed hit holds only its window */
		max = KVT_SEQ_MAX_BLOCKS;
	if (!max)
		return 0;
	ids = kvt_malloc((size_t)max * sizeof *ids);
	if (!ids || kvt_seq_reserve(s, (uint64_t)max * tpb, max, 0)) {
		kvt_free(ids);
		return kvt_err(-ENOMEM, "attaching a prefix of %llu blocks", (unsigned long long)max);
	}
	if (e->remote)
		kvt_reng_reap(e); /* remote fetches that landed are local hits now */
	if (e->win_tokens) {
		/* only the sinks and the window before the boundary (engine/window.c); the
		 * blocks between are holes, block lo chains to the key of hole lo - 1 */
		k = mem = kvt_prefix_walk_window(e, tokens, n, s->salt, s->tenant, ids,
						 (uint32_t)max, tail);
		/* or a longer one a session stored before a restart holds: its blocks made
		 * for s (already its own), in place of those */
		i = kvt_persist_prefix_window(e, s->tenant, tokens, n, s->salt, k, (uint32_t)max,
					      (uint32_t)(s - e->seqs), ids, tail);
		if (i > k)
			k = i, mem = 0;
		lo = kvt_win_first_block(e, (uint64_t)k * tpb);
		kvt_seq_set_first_live(e, s, lo);
		s->tail_hashed = lo > kvt_win_sink_blocks(e);
		memcpy(kvt_win_tail(e, s), tail, sizeof tail);
	} else {
		k = kvt_prefix_walk(e, tokens, n, s->salt, s->tenant, ids, (uint32_t)max);
		/* after it, blocks of a session stored before a restart: made for s (already
		 * its own) */
		mem = k;
		k += kvt_persist_prefix(e, s->tenant, tokens, s->salt, k, (uint32_t)max,
					(uint32_t)(s - e->seqs), ids);
	}
	for (i = 0; i < k; i++) {
		struct kvt_block *b;
		int t;

		s->blocks[i] = ids[i];
		if (ids[i] == KVT_NIL)
			continue; /* a hole: out of the window */
		b = kvt_blk(e, ids[i]);
		t = seq_best_tier(b);
		if (i < mem)
			kvt_block_ref(e, ids[i]);
		if (t < KVT_TIER_COUNT) {
			e->st.tier[t].prefix_hit_blocks++;
			e->evict[t].ops->access(&e->evict[t], ids[i]);
		}
	}
	if (e->remote) {
		/* a second sequence attached them: reuse evidence (write-through, item 1) */
		for (i = 0; i < mem; i++)
			kvt_reng_sealed(e, ids[i], true);
		kvt_reng_kick(e);
		if (k < max) /* stopped at a block still in flight from REMOTE? */
			kvt_reng_note_late(e, tokens, n, s->salt, s->tenant, k);
	}
	memcpy(s->tokens, tokens, (size_t)k * tpb * sizeof *tokens);
	s->n_blocks = k;
	s->n_tokens = (uint64_t)k * tpb;
	e->st.prefix_hit_blocks += kvt_seq_live_in(e, s, 0, k); /* holes: not served */
	e->st.prefix_hit_tokens += (uint64_t)k * tpb;
	kvt_free(ids);
	*attached = s->n_tokens;
	return 0;
}

int
kvt_seq_attach_prefix(struct kvt_engine *e, kvt_seq_id id, const int32_t *tokens, size_t n,
		      uint64_t *attached_tokens)
{
	struct kvt_seqrec *s;
	int rc;

	if (!e || (!tokens && n) || !attached_tokens)
		return kvt_err(-EINVAL, "kvt_seq_attach_prefix: engine, tokens and attached_tokens "
			       "must not be NULL");
	if (e->grp)
		return kvt_grp_seq_attach_prefix(e, id, tokens, n, attached_tokens);
	*attached_tokens = 0;
	kvt_lock(e);
	s = kvt_seq_lookup(e, id, NULL);
	if (!s)
		rc = kvt_err(KVT_ECLOSED, "sequence %#llx is not open", (unsigned long long)id);
	else
		rc = seq_attach_locked(e, s, tokens, n, attached_tokens);
	kvt_unlock(e);
	return rc;
}
