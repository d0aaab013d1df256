/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-replay/hybrid.c - checkpoint memory of a hybrid (linear + full attention)
 * layout on a trace's prefix reuse (issue 17).
 *
 * A linear-attention layer's state after token t summarises tokens 0..t, so a prefix hit of k
 * blocks is usable only if the state after block k - 1 was kept: the engine's STATE group
 * stores it as the block's slot (one checkpoint per full block, cached and evicted like blocks;
 * engine/kvtier.h "STATE groups"). Keeping one after every block costs a whole state per block;
 * keeping one every N blocks costs N times less but a hit then ends at the last checkpoint at
 * or before the shared length, and the blocks past it are prefilled again. This file counts
 * both over an unbounded cache, for a few N, and puts the bytes next to the attention KV the
 * hits make reusable. It models prefix reuse as sim.c does (the leading run of a request's
 * block ids that an earlier request had), without capacities.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replay.h"
#include "tools/kvtier-calc/calc.h"
#include "util.h"

#define HY_SEEN 1u   /* the id was a block of an earlier request */
#define HY_CKPT 2u   /* a checkpoint after that block was stored */
#define HY_REUSED 4u /* the block was inside a hybrid hit */
#define HY_ENDED 8u  /* its checkpoint ended a hit */

/* One request against the cache @fl ([max_id] HY_* bits), then into it. */
static void
hy_request(const struct rp_trace *t, const struct rp_req *q, uint32_t every, uint8_t *fl,
	   struct rp_hybrid_result *r)
{
	const uint32_t *ids = t->ids + q->first;
	uint32_t h, k, end = 0;
	uint64_t tok;

	for (h = 0; h < q->n && (fl[ids[h]] & HY_SEEN); h++)
		r->attn_hit_tokens += rp_block_tokens(t, q, h);
	for (k = h; k > 0; k--)
		if ((fl[ids[k - 1]] & HY_CKPT) && rp_block_tokens(t, q, k - 1) == t->block_tokens) {
			end = k;
			break;
		}
	if (end) {
		r->hit_reqs++;
		fl[ids[end - 1]] |= HY_ENDED;
	}
	for (k = 0; k < q->n; k++) {
		uint8_t *f = &fl[ids[k]];

		tok = rp_block_tokens(t, q, k);
		if (k < end) {
			r->hit_tokens += tok;
			if (!(*f & HY_REUSED)) {
				*f |= HY_REUSED;
				r->reused_blocks++;
				r->reused_tokens += tok;
				r->reused_ckpts += (*f & HY_CKPT) != 0;
			}
		}
		if (!(*f & HY_SEEN)) {
			*f |= HY_SEEN;
			r->cached_blocks++;
			r->cached_tokens += tok;
		}
		if (!(*f & HY_CKPT) && tok == t->block_tokens && (k + 1) % every == 0) {
			*f |= HY_CKPT;
			r->ckpts++;
			/* a block reused before its checkpoint existed (it was partial or between
			 * checkpoints then) now has one inside a reused prefix */
			r->reused_ckpts += (*f & HY_REUSED) != 0;
		}
	}
}

int
rp_hybrid_run(const struct rp_trace *t, uint32_t every, struct rp_hybrid_result *r)
{
	uint8_t *fl;
	uint32_t i;

	memset(r, 0, sizeof *r);
	if (!every)
		return -EINVAL;
	r->every = every;
	fl = calloc(t->max_id ? t->max_id : 1, 1);
	if (!fl)
		return -ENOMEM;
	for (i = 0; i < t->n_req; i++) {
		r->tokens += t->req[i].in_tokens;
		hy_request(t, &t->req[i], every, fl, r);
	}
	for (i = 0; i < t->max_id; i++)
		r->end_ckpts += (fl[i] & HY_ENDED) != 0;
	free(fl);
	return 0;
}

void
rp_hybrid_figures(const struct rp_hybrid_result *r, const struct rp_hybrid_bytes *b,
		  struct rp_hybrid_fig *f)
{
	memset(f, 0, sizeof *f);
	f->ckpt_bytes = (double)r->ckpts * b->state_bytes;
	f->attn_bytes = (double)r->cached_tokens * b->attn_token_bytes;
	if (r->reused_tokens) {
		f->ckpt_per_reused_token =
			(double)r->reused_ckpts * b->state_bytes / (double)r->reused_tokens;
		f->kept_per_reused_token = f->ckpt_bytes / (double)r->reused_tokens;
	}
	f->ratio_reused = f->ckpt_per_reused_token / b->attn_token_bytes;
	f->hit_frac = r->attn_hit_tokens ? (double)r->hit_tokens / (double)r->attn_hit_tokens : 1;
}

void
rp_print_hybrid(FILE *f, const struct rp_hybrid_result *r, size_t n,
		const struct rp_hybrid_bytes *b)
{
	const double gib = 1024.0 * 1024 * 1024;
	struct rp_hybrid_fig x;
	size_t i;

	fprintf(f, "%-6s %9s %8s %9s %9s %8s %12s %11s %8s %11s %12s %7s %12s\n", "every",
		"ckpts", "ended", "ckpt-GiB", "attn-GiB", "ckpt/kv", "reused-tok", "ckpt-B/tok", "x-attn",
		"kept-B/tok", "hit-tok", "of-attn", "lost-tok");
	for (i = 0; i < n; i++) {
		rp_hybrid_figures(&r[i], b, &x);
		fprintf(f, "%-6u %9llu %8llu %9.2f %9.2f %8.3f %12llu %11.0f %8.3f %11.0f %12llu "
			"%6.1f%% %12llu\n", r[i].every, (unsigned long long)r[i].ckpts,
			(unsigned long long)r[i].end_ckpts, x.ckpt_bytes / gib,
			x.attn_bytes / gib, x.attn_bytes > 0 ? x.ckpt_bytes / x.attn_bytes : 0,
			(unsigned long long)r[i].reused_tokens, x.ckpt_per_reused_token,
			x.ratio_reused, x.kept_per_reused_token,
			(unsigned long long)r[i].hit_tokens, 100 * x.hit_frac,
			(unsigned long long)(r[i].attn_hit_tokens - r[i].hit_tokens));
	}
}

int
rp_hybrid_from_model(const char *path, struct rp_hybrid_bytes *b)
{
	struct kvc_model m;
	struct kvc_query q;
	struct kvc_result res;
	int rc;

	kvc_model_init(&m);
	rc = kvc_model_load(path, &m);
	if (rc == 0)
		rc = kvc_model_finish(&m);
	kvc_query_init(&q);
	if (rc == 0)
		rc = kvc_compute(&m, &q, &res);
	if (rc) {
		fprintf(stderr, "kvtier-replay: --hybrid %s: %s\n", path, kvtr_last_error());
		return -1;
	}
	if (!res.linear_layers || !(res.seq_state_bytes > 0)) {
		fprintf(stderr, "kvtier-replay: --hybrid %s: the model has no linear-attention "
			"layers (no state to checkpoint)\n", path);
		return -1;
	}
	if (!(b->state_bytes > 0))
		b->state_bytes = res.seq_state_bytes;
	if (!(b->attn_token_bytes > 0))
		b->attn_token_bytes = res.token_bytes;
	if (!(b->attn_token_bytes > 0)) {
		fprintf(stderr, "kvtier-replay: --hybrid %s: the model has no attention layers "
			"(give --attn-token-bytes)\n", path);
		return -1;
	}
	return 0;
}
