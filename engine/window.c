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
