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
