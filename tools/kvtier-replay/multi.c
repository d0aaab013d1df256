/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-replay/multi.c - metadata-only replay across N nodes sharing one REMOTE tier.
 *
 * Each node is the tier stack of sim.c (its own evict/ instance per tier, exclusive tiers,
 * HBM -> HOST -> NVME on eviction, promoted to HBM on a hit). The requests are split across
 * the nodes by a stable hash of their conversation key (or of their index). One REMOTE tier,
 * an LRU over block ids as Redis's allkeys-lru (or unbounded), holds every block any node wrote
 * to it. Writes to NVMe and to REMOTE pass an admission rule and a token-bucket write budget
 * clocked by the trace's timestamps (issue 18, items 5 and 6).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replay.h"

#define RP_MAX_NODES 4096

/* Token bucket in bytes: @rate bytes/s, @depth bytes, refilled on trace time (ms). */
struct rp_bucket {
	uint64_t rate;  /* bytes per second; 0 = no budget */
	uint64_t depth; /* most bytes held */
	uint64_t level; /* bytes available */
	uint64_t rem;   /* refill remainder, byte-milliseconds (< 1000) */
	uint64_t t_ms;  /* time of the last refill */
};

struct rp_node {
	struct kvt_evict ev[RP_TIERS]; /* policy per tier */
	uint64_t used[RP_TIERS];       /* blocks held per tier */
	uint8_t *where;                /* [max_id] tier + 1 holding the id, 0 = none */
	uint8_t *seen;                 /* [max_id] requests of this node that named the id (sat.) */
	struct rp_bucket nvme;         /* NVMe write budget */
};

struct rp_multi {
	const struct rp_multi_opts *o;
	struct rp_node *node;          /* [nodes] */
	struct kvt_evict rev;          /* REMOTE's LRU (bounded REMOTE only) */
	uint8_t *in_remote;            /* [max_id] 1: REMOTE holds the id */
	uint16_t *owner;               /* [max_id] node that wrote it */
	uint8_t *seen;                 /* [max_id] requests of any node that named the id (sat.) */
	uint64_t remote_used;          /* blocks in REMOTE */
	struct rp_bucket remote;       /* REMOTE write budget */
	uint64_t now_ms;               /* trace time of the request being replayed */
	struct rp_multi_result *r;
};

static void
rp_bucket_init(struct rp_bucket *b, uint64_t rate, uint64_t period_ms, uint64_t block_bytes,
	       uint64_t t_ms)
{
	uint64_t per = rate * (period_ms ? period_ms : 1000) / 1000; /* < 2^40 x 2^22 */

	memset(b, 0, sizeof *b);
	b->rate = rate;
	b->depth = per > block_bytes ? per : block_bytes; /* one period, or one block */
	b->level = b->depth;
	b->t_ms = t_ms;
}

/* Take @bytes from @b at trace time @t_ms: 1 if there were enough (or no budget), else 0. */
static int
rp_bucket_take(struct rp_bucket *b, uint64_t t_ms, uint64_t bytes)
{
	uint64_t dt, acc;

	if (!b->rate)
		return 1;
	dt = t_ms > b->t_ms ? t_ms - b->t_ms : 0;
	b->t_ms = t_ms > b->t_ms ? t_ms : b->t_ms;
	if (dt > (UINT64_MAX - 1000) / b->rate || dt >= b->depth / b->rate * 1000 + 1000) {
		b->level = b->depth; /* refilled whatever it held */
		b->rem = 0;
	} else {
		acc = b->rate * dt + b->rem;
		b->rem = acc % 1000;
		b->level += acc / 1000;
		if (b->level >= b->depth) {
			b->level = b->depth;
			b->rem = 0;
		}
	}
	if (b->level < bytes)
		return 0;
	b->level -= bytes;
	return 1;
}

static uint64_t
rp_mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

uint32_t
rp_conv_key(const struct rp_trace *t, const struct rp_req *r)
{
	if (!r->n)
		return UINT32_MAX;
	return t->ids[r->first + (r->n > 1 ? 1 : 0)];
}

uint32_t
rp_multi_node(const struct rp_trace *t, uint32_t i, const struct rp_multi_opts *o)
{
	uint64_t key = o->split == RP_SPLIT_REQUEST ? i : rp_conv_key(t, &t->req[i]);

	return o->nodes > 1 ? (uint32_t)(rp_mix64(key) % o->nodes) : 0;
}

static void
rp_node_put(struct rp_node *n, int t, uint32_t id)
{
	n->ev[t].ops->insert(&n->ev[t], id);
	n->where[id] = (uint8_t)(t + 1);
	n->used[t]++;
}

static void
rp_node_take(struct rp_node *n, int t, uint32_t id, bool evicted)
{
	if (evicted)
		kvt_evict_evicted(&n->ev[t], id);
	else
		n->ev[t].ops->remove(&n->ev[t], id);
	n->where[id] = 0;
	n->used[t]--;
}

/* May @id go to @n's NVMe now? Counts the write or the refusal. */
static int
rp_nvme_admit(struct rp_multi *m, struct rp_node *n, uint32_t id)
{
	if ((m->o->admit == RP_ADMIT_SEEN_TWICE && n->seen[id] < 2) ||
	    !rp_bucket_take(&n->nvme, m->now_ms, m->o->block_bytes)) {
		m->r->nvme_refused++;
		return 0;
	}
	m->r->nvme_writes++;
	return 1;
}

static void
rp_node_make_room(struct rp_multi *m, struct rp_node *n, int t)
{
	while (n->used[t] > m->o->cap[t]) {
		uint32_t v = n->ev[t].ops->victim_first(&n->ev[t]);

		if (v == KVT_NIL)
			return;
		rp_node_take(n, t, v, true);
		if (t + 1 < RP_TIERS && m->o->cap[t + 1] && (t + 1 < 2 || rp_nvme_admit(m, n, v))) {
			rp_node_put(n, t + 1, v);
			rp_node_make_room(m, n, t + 1);
		}
	}
}

/* Write @id to REMOTE for node @ni: 1 written, 0 refused by the admission or the budget. */
static int
rp_remote_put(struct rp_multi *m, uint32_t ni, uint32_t id)
{
	const struct rp_multi_opts *o = m->o;

	if ((o->admit == RP_ADMIT_SEEN_TWICE && m->seen[id] < 2) ||
	    !rp_bucket_take(&m->remote, m->now_ms, o->block_bytes))
		return 0;
	m->in_remote[id] = 1;
	m->owner[id] = (uint16_t)ni;
	m->r->puts++;
	if (o->remote_cap == RP_UNBOUNDED)
		return 1;
	m->rev.ops->insert(&m->rev, id);
	m->remote_used++;
	while (m->remote_used > o->remote_cap) {
		uint32_t v = m->rev.ops->victim_first(&m->rev);

		if (v == KVT_NIL)
			break;
		kvt_evict_evicted(&m->rev, v);
		m->in_remote[v] = 0;
		m->remote_used--;
		m->r->remote_evictions++;
	}
	return 1;
}

static void
rp_multi_request(struct rp_multi *m, const struct rp_trace *tr, uint32_t qi)
{
	const struct rp_req *q = &tr->req[qi];
	const uint32_t *ids = tr->ids + q->first;
	uint32_t ni = rp_multi_node(tr, qi, m->o), k;
	struct rp_node *n = &m->node[ni];
	struct rp_multi_result *r = m->r;
	bool remote = m->o->remote_cap > 0, refused = false;
	int t;

	m->now_ms = q->t_ms;
	for (k = 0; k < q->n; k++) {
		uint32_t id = ids[k];

		if (n->where[id]) {
			t = n->where[id] - 1;
		} else if (remote && m->in_remote[id]) {
			t = RP_REMOTE;
			r->gets++;
			r->cross_hits += m->owner[id] != ni;
			if (m->o->remote_cap != RP_UNBOUNDED)
				m->rev.ops->access(&m->rev, id);
		} else {
			break;
		}
		r->hit_blocks[t]++;
		r->hit_tokens[t] += rp_block_tokens(tr, q, k);
	}
	for (k = 0; k < q->n; k++) { /* sightings (saturating) */
		n->seen[ids[k]] += n->seen[ids[k]] < UINT8_MAX;
		m->seen[ids[k]] += m->seen[ids[k]] < UINT8_MAX;
	}
	for (k = q->n; k-- > 0;) { /* to HBM, last block first (as sim.c) */
		uint32_t id = ids[k];

		t = n->where[id] - 1;
		if (t == 0) {
			n->ev[0].ops->access(&n->ev[0], id);
			continue;
		}
		if (t > 0)
			rp_node_take(n, t, id, false);
		rp_node_put(n, 0, id);
		rp_node_make_room(m, n, 0);
	}
	if (!remote)
		return;
	for (k = 0; k < q->n; k++) { /* offer what REMOTE lacks, parents first */
		uint32_t id = ids[k];

		if (m->in_remote[id])
			continue;
		if (refused || !rp_remote_put(m, ni, id)) {
			refused = true; /* a child without its parent is never reached */
			r->remote_refused++;
		}
	}
}

int
rp_multi_run(const struct rp_trace *tr, const struct kvt_evict_ops *ops,
	     const struct rp_multi_opts *o, struct rp_multi_result *r)
{
	uint32_t n_ids = tr->max_id ? tr->max_id : 1, i, ni;
	uint64_t t0 = tr->n_req ? tr->req[0].t_ms : 0;
	struct rp_multi m;
	int t, rc = 0;

	memset(r, 0, sizeof *r);
	if (!o->nodes || o->nodes > RP_MAX_NODES || !o->cap[0] || !o->block_bytes ||
	    o->split > RP_SPLIT_REQUEST || o->admit > RP_ADMIT_SEEN_TWICE ||
	    o->budget[0] > (UINT64_C(1) << 40) || o->budget[1] > (UINT64_C(1) << 40) ||
	    o->period_ms > 3600000)
		return -EINVAL;
	memset(&m, 0, sizeof m);
	snprintf(r->policy, sizeof r->policy, "%s", ops->name);
	r->o = *o;
	m.o = o;
	m.r = r;
	m.node = calloc(o->nodes, sizeof *m.node);
	m.in_remote = calloc(n_ids, 1);
	m.owner = calloc(n_ids, sizeof *m.owner);
	m.seen = calloc(n_ids, 1);
	if (!m.node || !m.in_remote || !m.owner || !m.seen) {
		rc = -ENOMEM;
		goto out;
	}
	for (ni = 0; ni < o->nodes; ni++) {
		struct rp_node *n = &m.node[ni];

		n->where = calloc(n_ids, 1);
		n->seen = calloc(n_ids, 1);
		if (!n->where || !n->seen) {
			rc = -ENOMEM;
			goto out;
		}
		rp_bucket_init(&n->nvme, o->budget[0], o->period_ms, o->block_bytes, t0);
		for (t = 0; t < RP_TIERS; t++)
			if (o->cap[t] && (rc = kvt_evict_init(&n->ev[t], ops, n_ids,
							      (uint32_t)(o->cap[t] < UINT32_MAX ?
									 o->cap[t] : UINT32_MAX))))
				goto out;
	}
	rp_bucket_init(&m.remote, o->budget[1], o->period_ms, o->block_bytes, t0);
	if (o->remote_cap && o->remote_cap != RP_UNBOUNDED &&
	    (rc = kvt_evict_init(&m.rev, &kvt_evict_lru_ops, n_ids,
				 (uint32_t)(o->remote_cap < UINT32_MAX ? o->remote_cap :
									 UINT32_MAX))))
		goto out;
	for (i = 0; i < tr->n_req; i++) {
		r->refs += tr->req[i].n;
		r->tokens += tr->req[i].in_tokens;
		rp_multi_request(&m, tr, i);
	}
out:
	if (m.node)
		for (ni = 0; ni < o->nodes; ni++) {
			for (t = 0; t < RP_TIERS; t++)
				if (m.node[ni].ev[t].ops)
					m.node[ni].ev[t].ops->fini(&m.node[ni].ev[t]);
			free(m.node[ni].where);
			free(m.node[ni].seen);
		}
	if (m.rev.ops)
		m.rev.ops->fini(&m.rev);
	free(m.node);
	free(m.in_remote);
	free(m.owner);
	free(m.seen);
	return rc;
}

uint64_t
rp_multi_hits(const struct rp_multi_result *r)
{
	return r->hit_blocks[0] + r->hit_blocks[1] + r->hit_blocks[2] + r->hit_blocks[RP_REMOTE];
}

uint64_t
rp_multi_hit_tokens(const struct rp_multi_result *r)
{
	return r->hit_tokens[0] + r->hit_tokens[1] + r->hit_tokens[2] + r->hit_tokens[RP_REMOTE];
}
