/* SPDX-License-Identifier: MIT */
/*
 * engine/window.c - sliding-window semantics of a core engine (issue 16 item 3).
 *
 * A windowed engine (kvt_engine_set_window) serves attention that reads, for the query at
 * position q, the keys k with q - window < k <= q (transformers' masking_utils sliding window)
 * plus the first `sink` tokens (StreamingLLM). The layer-group engine makes one such core
 * engine per WINDOW group.
 */
#include <errno.h>

#include "engine_impl.h"

int
kvt_engine_set_window(struct kvt_engine *e, uint32_t window, uint32_t sink)
{
	int rc = 0;

	if (!e)
		return kvt_err(-EINVAL, "kvt_engine_set_window: engine is NULL");
	if (!window && sink)
		return kvt_err(-EINVAL, "kvt_engine_set_window: sink %u tokens without a window "
			       "(window 0 is full attention, which sees every token)", sink);
	kvt_lock(e);
	if (e->seq_opened)
		rc = kvt_err(-EINVAL, "kvt_engine_set_window: a sequence was already opened on "
			     "this engine; set the window right after kvt_engine_create");
	else {
		e->win_tokens = window;
		e->win_sink = sink;
	}
	kvt_unlock(e);
	return rc;
}

uint32_t
kvt_win_sink_blocks(const struct kvt_engine *e)
{
	uint32_t tpb = e->layout.tokens_per_block;

	return e->win_tokens ? (uint32_t)(((uint64_t)e->win_sink + tpb - 1) / tpb) : 0;
}

uint32_t
kvt_win_first_block(const struct kvt_engine *e, uint64_t q)
{
	/* the window of q: q - window < k <= q, i.e. k >= q + 1 - window */
	if (!e->win_tokens || q + 1 <= e->win_tokens)
		return 0;
	return (uint32_t)((q + 1 - e->win_tokens) / e->layout.tokens_per_block);
}

uint32_t
kvt_win_next_first(const struct kvt_engine *e, const struct kvt_seqrec *s)
{
	uint32_t lo = kvt_win_first_block(e, s->n_tokens), fl = kvt_seq_first_live(e, s);

	if (lo > s->n_blocks)
		lo = s->n_blocks;
	return lo > fl ? lo : fl;
}

uint32_t
kvt_seq_live_in(const struct kvt_engine *e, const struct kvt_seqrec *s, uint32_t first,
		uint32_t end)
{
	uint32_t lo = kvt_win_sink_blocks(e), hi = kvt_seq_first_live(e, s);

	if (lo < first)
		lo = first;
	if (hi > end)
		hi = end;
	return hi > lo ? end - first - (hi - lo) : end - first;
}

/* ---- a STATE pool's checkpoints (kvtier.h "STATE groups": checkpoint_every) */

bool
kvt_win_keep(struct kvt_engine *e, struct kvt_seqrec *s, uint32_t index)
{
	struct kvt_winseq *w;
	uint32_t i;

	if (e->ckpt_every <= 1)
		return true;
	if (e->ckpt_every != KVT_CHECKPOINT_ASKED && (index + 1u) % e->ckpt_every == 0)
		return true;
	if (!e->winseq)
		return false;
	w = &e->winseq[s - e->seqs];
	for (i = 0; i < w->n_ask; i++)
		if (w->ask[i] == index) {
			w->ask[i] = w->ask[--w->n_ask];
			return true;
		}
	return false;
}

int
kvt_win_ask(struct kvt_engine *e, kvt_seq_id id, uint32_t index)
{
	struct kvt_seqrec *s;
	struct kvt_winseq *w;
	uint32_t idx, i;
	int rc = 0;

	kvt_lock(e);
	s = kvt_seq_lookup(e, id, &idx);
	if (!s) {
		rc = kvt_err(KVT_ECLOSED, "sequence %#llx is not open", (unsigned long long)id);
		goto out;
	}
	if (!e->winseq || e->ckpt_every <= 1)
		goto out; /* every full block is kept */
	w = &e->winseq[idx];
	if (index < s->n_blocks) {
		uint32_t b = s->blocks[index];
		struct kvt_block *blk;

		if (b == KVT_NIL) {
			rc = kvt_err(-ENOENT, "the state at token %llu left the sequence already "
				     "(block %u was dropped): ask before the sequence passes it",
				     (unsigned long long)(index + 1ull) * e->layout.tokens_per_block,
				     index);
			goto out;
		}
		blk = kvt_blk(e, b);
		if (blk->indexed)
			goto out;
		for (i = 0; i < s->n_wpins; i++)
			if (s->wpins[i] == b)
				break;
		if (i == s->n_wpins && blk->hashed && blk->written) {
			/* full and published without being kept: keep it now */
			(void)kvt_prefix_insert(e, b); /* -ENOMEM only costs the checkpoint */
			goto out;
		}
	}
	for (i = 0; i < w->n_ask; i++)
		if (w->ask[i] == index)
			goto out;
	if (w->n_ask == KVT_CKPT_ASKS) {
		rc = kvt_err(-ENOSPC, "%u checkpoints of this sequence are asked and not reached "
			     "yet: at most %u", w->n_ask, KVT_CKPT_ASKS);
		goto out;
	}
	w->ask[w->n_ask++] = index;
out:
	kvt_unlock(e);
	return rc;
}
