/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-replay/min.c - Belady's MIN with bypass: the offline optimum, for the replayer
 * only (it reads the future). On a miss the cached block whose next use is farthest away is
 * evicted, unless the missing block's own next use is even farther: then it is not cached at
 * all. Among blocks with the same next use the deeper one (a child) goes first. A max-heap of
 * (next use, depth) keys with lazy deletion: an entry is live while it matches the id's key.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replay.h"

#define MIN_NEVER UINT64_MAX

struct min_ent {
	uint64_t key; /* next use request index << 8 | depth (0..255) */
	uint32_t id;  /* block id */
};

struct min_heap {
	struct min_ent *a; /* binary max-heap */
	uint64_t n, cap;   /* entries / capacity */
};

static int
mh_push(struct min_heap *h, uint64_t key, uint32_t id)
{
	uint64_t i;

	if (h->n == h->cap) {
		void *p = realloc(h->a, (h->cap = h->cap ? h->cap * 2 : 4096) * sizeof *h->a);

		if (!p)
			return -ENOMEM;
		h->a = p;
	}
	i = h->n++;
	while (i && h->a[(i - 1) / 2].key < key) {
		h->a[i] = h->a[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	h->a[i].key = key;
	h->a[i].id = id;
	return 0;
}

static struct min_ent
mh_pop(struct min_heap *h)
{
	struct min_ent top = h->a[0], last = h->a[--h->n];
	uint64_t i = 0, c;

	while ((c = 2 * i + 1) < h->n) {
		if (c + 1 < h->n && h->a[c + 1].key > h->a[c].key)
			c++;
		if (h->a[c].key <= last.key)
			break;
		h->a[i] = h->a[c];
		i = c;
	}
	if (h->n)
		h->a[i] = last;
	return top;
}

/* next[j]: index of the next request referencing the id of reference j, MIN_NEVER if none. */
static uint64_t *
min_next_uses(const struct rp_trace *tr)
{
	uint64_t *next = malloc((tr->n_ids ? tr->n_ids : 1) * sizeof *next);
	uint64_t *last = malloc((tr->max_id ? tr->max_id : 1) * sizeof *last);
	uint64_t j;
	uint32_t i, k;

	if (!next || !last) {
		free(next);
		free(last);
		return NULL;
	}
	/* backwards: when request i is reached, last[] holds the next request after i */
	for (j = 0; j < tr->max_id; j++)
		last[j] = MIN_NEVER;
	for (i = tr->n_req; i-- > 0;) {
		for (k = 0; k < tr->req[i].n; k++) {
			j = tr->req[i].first + k;
			next[j] = last[tr->ids[j]];
		}
		for (k = 0; k < tr->req[i].n; k++)
			last[tr->ids[tr->req[i].first + k]] = i;
	}
	free(last);
	return next;
}

int
rp_min_run(const struct rp_trace *tr, uint64_t cap, rp_progress_fn pf, struct rp_result *r)
{
	uint64_t *next = min_next_uses(tr), *cur, used = 0;
	struct min_heap h = { 0 };
	uint32_t i, k;
	int rc = 0;

	memset(r, 0, sizeof *r);
	snprintf(r->policy, sizeof r->policy, "min");
	r->cap[0] = cap;
	cur = calloc(tr->max_id ? tr->max_id : 1, sizeof *cur); /* live key + 1, 0 = not cached */
	if (!next || !cur) {
		rc = -ENOMEM;
		goto out;
	}
	for (i = 0; i < tr->n_req && rc == 0; i++) {
		const struct rp_req *q = &tr->req[i];

		r->refs += q->n;
		r->tokens += q->in_tokens;
		for (k = 0; k < q->n && cur[tr->ids[q->first + k]]; k++) {
			r->hit_blocks[0]++;
			r->hit_tokens[0] += rp_block_tokens(tr, q, k);
		}
		for (k = q->n; k-- > 0 && rc == 0;) {
			uint32_t id = tr->ids[q->first + k];
			uint64_t nx = next[q->first + k];
			uint64_t key = nx == MIN_NEVER ? MIN_NEVER : nx << 8 | (k < 255 ? k : 255);

			if (!cur[id]) {
				if (nx == MIN_NEVER)
					continue; /* never used again: bypass */
				while (used >= cap && h.n) {
					struct min_ent top = h.a[0];

					if (cur[top.id] != top.key + 1) {
						(void)mh_pop(&h); /* stale entry */
						continue;
					}
					if (top.key <= key)
						break;
					(void)mh_pop(&h);
					cur[top.id] = 0;
					used--;
					r->evictions[0]++;
				}
				if (used >= cap)
					continue; /* bypass: everything cached is needed sooner */
				used++;
			}
			if (nx == MIN_NEVER) {
				cur[id] = 0; /* cached but never used again: free it now */
				used--;
				continue;
			}
			cur[id] = key + 1;
			rc = mh_push(&h, key, id);
		}
		if (pf && (i % 256 == 0 || i + 1 == tr->n_req))
			pf(i + 1, tr->n_req);
	}
out:
	free(h.a);
	free(cur);
	free(next);
	return rc;
}
