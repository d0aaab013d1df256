/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-replay/sim.c - metadata-only replay through kvtier's own eviction policies.
 *
 * One evict/ instance per tier, exactly as the engine uses them (insert, access, remove,
 * victim_first), over exclusive tiers: a request's leading run of cached blocks are its prefix
 * hits (counted in the tier they are found in); then every block of the request is brought to
 * HBM (promoted from below, or prefilled), last block first so that a parent is always more
 * recently used than its children; HBM overflow is demoted to HOST, HOST overflow to NVME, and
 * NVME overflow is dropped. It also counts how often a block leaves the cache while one of its
 * children (the next block of a request that used it) is still cached: a parent is worth at
 * least its children, since a child is only reachable through it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replay.h"

struct sim {
	struct kvt_evict ev[RP_TIERS]; /* policy per tier */
	uint64_t cap[RP_TIERS];        /* capacity per tier, blocks */
	uint64_t used[RP_TIERS];       /* blocks held per tier */
	uint8_t *where;                /* [max_id] tier + 1 holding the id, 0 = none */
	uint32_t *parent;              /* [max_id] the id's parent (block before it), KVT_NIL */
	uint32_t *kids;                /* [max_id] cached children of the id */
	struct rp_result *r;           /* counters */
};

static void sim_make_room(struct sim *s, int t);

static void
sim_put(struct sim *s, int t, uint32_t id)
{
	s->ev[t].ops->insert(&s->ev[t], id);
	s->where[id] = (uint8_t)(t + 1);
	s->used[t]++;
}

/* @id leaves tier @t: evicted (@evicted), or promoted out of it. */
static void
sim_take(struct sim *s, int t, uint32_t id, bool evicted)
{
	if (evicted)
		kvt_evict_evicted(&s->ev[t], id);
	else
		s->ev[t].ops->remove(&s->ev[t], id);
	s->where[id] = 0;
	s->used[t]--;
}

static void
sim_make_room(struct sim *s, int t)
{
	while (s->used[t] > s->cap[t]) {
		uint32_t v = s->ev[t].ops->victim_first(&s->ev[t]);

		if (v == KVT_NIL)
			return;
		sim_take(s, t, v, true);
		s->r->evictions[t]++;
		if (t + 1 < RP_TIERS && s->cap[t + 1]) {
			sim_put(s, t + 1, v);
			s->r->moved_blocks[t == 0 ? 0 : 1]++; /* HBM->HOST, HOST->NVME */
			sim_make_room(s, t + 1);
		} else { /* out of the cache */
			s->r->orphaned += s->kids[v] > 0;
			if (s->parent[v] != KVT_NIL)
				s->kids[s->parent[v]]--;
		}
	}
}

static void
sim_request(struct sim *s, const struct rp_trace *tr, const struct rp_req *q)
{
	const uint32_t *ids = tr->ids + q->first;
	uint32_t k;
	int t;

	for (k = 0; k < q->n && s->where[ids[k]]; k++) {
		t = s->where[ids[k]] - 1;
		s->r->hit_blocks[t]++;
		s->r->hit_tokens[t] += rp_block_tokens(tr, q, k);
	}
	for (k = q->n; k-- > 0;) {
		uint32_t id = ids[k];

		if (k && s->parent[id] == KVT_NIL)
			s->parent[id] = ids[k - 1];
		t = s->where[id] - 1;
		if (t < 0 && s->parent[id] != KVT_NIL)
			s->kids[s->parent[id]]++; /* enters the cache */
		if (t == 0) {
			s->ev[0].ops->access(&s->ev[0], id);
			continue;
		}
		if (t > 0) {
			sim_take(s, t, id, false);
			if (t == 2)
				s->r->moved_blocks[2]++; /* NVME->HOST */
			s->r->moved_blocks[3]++;         /* HOST->HBM */
		}
		sim_put(s, 0, id);
		sim_make_room(s, 0);
	}
}

int
rp_sim_run(const struct rp_trace *tr, const struct kvt_evict_ops *ops,
	   const uint64_t cap[RP_TIERS], rp_progress_fn pf, struct rp_result *r)
{
	struct sim s;
	uint32_t i;
	int t, rc = 0;

	memset(&s, 0, sizeof s);
	memset(r, 0, sizeof *r);
	snprintf(r->policy, sizeof r->policy, "%s", ops->name);
	s.r = r;
	s.where = calloc(tr->max_id ? tr->max_id : 1, 1);
	s.parent = malloc((tr->max_id ? tr->max_id : 1) * sizeof *s.parent);
	s.kids = calloc(tr->max_id ? tr->max_id : 1, sizeof *s.kids);
	if (!s.where || !s.parent || !s.kids) {
		rc = -ENOMEM;
		goto out;
	}
	memset(s.parent, 0xff, (tr->max_id ? tr->max_id : 1) * sizeof *s.parent);
	for (t = 0; t < RP_TIERS; t++) {
		s.cap[t] = r->cap[t] = cap[t];
		if (cap[t] && (rc = kvt_evict_init(&s.ev[t], ops, tr->max_id,
						   (uint32_t)(cap[t] < UINT32_MAX ? cap[t] :
							      UINT32_MAX))) != 0)
			goto out;
	}
	for (i = 0; i < tr->n_req; i++) {
		r->refs += tr->req[i].n;
		r->tokens += tr->req[i].in_tokens;
		sim_request(&s, tr, &tr->req[i]);
		if (pf && (i % 256 == 0 || i + 1 == tr->n_req))
			pf(i + 1, tr->n_req);
	}
out:
	for (t = 0; t < RP_TIERS; t++)
		if (s.ev[t].ops)
			s.ev[t].ops->fini(&s.ev[t]);
	free(s.where);
	free(s.parent);
	free(s.kids);
	return rc;
}

uint64_t
rp_hits(const struct rp_result *r)
{
	return r->hit_blocks[0] + r->hit_blocks[1] + r->hit_blocks[2];
}

uint64_t
rp_hit_tokens(const struct rp_result *r)
{
	return r->hit_tokens[0] + r->hit_tokens[1] + r->hit_tokens[2];
}
