/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-replay/data.c - data mode: the trace through a real engine (emulated device,
 * HOST memory, an NVMe file), with prefix sharing on and real bytes in every tier.
 *
 * Each request is a sequence: its tokens are made up from the trace's block ids (equal ids =
 * equal tokens, so equal prefixes hash alike), kvt_seq_attach_prefix() takes what is cached, the
 * rest is appended block by block with a byte pattern derived from (block id, token) written as
 * its K/V, each block prepared and released (which publishes it), then the sequence closes and
 * its blocks stay cached (prefix_cache). The first and last attached blocks are read back through
 * a one-block window and compared with the pattern: shared KV served from any tier must be the
 * bytes its first writer wrote. Requests run one after another.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replay.h"
#include "replay_data.h"
#include "util.h"

/* The token j of block id (equal for every request holding that block). */
static int32_t
dm_token(uint32_t id, uint32_t j)
{
	return (int32_t)(((uint64_t)id * 1031u + j) & 0x3fffffff);
}

static uint8_t
dm_byte(uint32_t id, uint32_t j, uint32_t b)
{
	return (uint8_t)(id * 131u + j * 7u + b);
}

/* Write (or, with @check, compare) the pattern of token j of block id at its slot mapping. */
static int
dm_kv(const struct kvt_geometry *g, int64_t map, uint32_t id, uint32_t j, int check)
{
	uint8_t *k, *v;
	uint32_t b;

	kvt_kv_addr(g, 0, map, (void **)&k, (void **)&v);
	for (b = 0; b < g->token_bytes; b++) {
		uint8_t want = dm_byte(id, j, b), wantv = (uint8_t)(255u - want);

		if (!check) {
			k[b] = want;
			v[b] = wantv;
		} else if (k[b] != want || v[b] != wantv) {
			return 1;
		}
	}
	return 0;
}

/* Prepare the one-block window @blk of @s, optionally compare it, release. */
static int
dm_window(struct kvt_engine *e, kvt_seq_id s, uint32_t blk, uint32_t id, uint32_t ntok,
	  int check, uint64_t *bad)
{
	struct kvt_seq_range r = { .seq = s, .first_block = blk, .n_blocks = 1 };
	struct kvt_block_table bt;
	struct kvt_batch *b;
	uint32_t j;
	int rc;

	rc = kvt_batch_prepare_ranges(e, &r, 1, &b);
	if (rc)
		return rc;
	rc = kvt_batch_wait_layer(b, 0, NULL);
	if (rc == 0 && check && kvt_batch_block_table(b, &bt) == 0)
		for (j = 0; j < ntok; j++)
			if (dm_kv(&bt.geo, (int64_t)bt.indices[0] * bt.geo.tokens_per_block + j, id, j,
				  1)) {
				(*bad)++;
				break;
			}
	(void)kvt_batch_release(b, NULL);
	return rc;
}

static int
dm_request(struct kvt_engine *e, const struct kvt_geometry *g, const struct rp_trace *tr,
	   const struct rp_req *q, int32_t *tok, int64_t *map, struct rp_data_result *out)
{
	const uint32_t *ids = tr->ids + q->first;
	uint32_t tpb = tr->block_tokens, k, j, n;
	uint64_t a = 0;
	kvt_seq_id s;
	int rc;

	for (k = 0; k < q->n; k++)
		for (j = 0; j < rp_block_tokens(tr, q, k); j++)
			tok[(uint64_t)k * tpb + j] = dm_token(ids[k], j);
	if ((rc = kvt_seq_open(e, NULL, &s)) != 0)
		return rc;
	rc = kvt_seq_attach_prefix(e, s, tok, q->in_tokens, &a);
	if (rc == 0 && a) {
		out->verified += 1 + (a > tpb);
		rc = dm_window(e, s, 0, ids[0], tpb, 1, &out->mismatches);
		if (rc == 0 && a > tpb)
			rc = dm_window(e, s, (uint32_t)(a / tpb) - 1, ids[a / tpb - 1], tpb, 1,
				       &out->mismatches);
	}
	for (k = (uint32_t)(a / tpb); rc == 0 && k < q->n; k++) {
		n = rp_block_tokens(tr, q, k);
		if (!n)
			break;
		rc = kvt_seq_append(e, s, tok + (uint64_t)k * tpb, n, map);
		for (j = 0; rc == 0 && j < n; j++)
			dm_kv(g, map[j], ids[k], j, 0);
		if (rc == 0)
			rc = dm_window(e, s, k, ids[k], n, 0, NULL); /* release: publishes it */
	}
	out->attached_tokens += a;
	(void)kvt_seq_close(e, s);
	return rc;
}

int
rp_data_run(const struct rp_trace *tr, const struct rp_data_opts *o, rp_progress_fn pf,
	    struct rp_data_result *out)
{
	struct kvt_engine_opts eo;
	struct kvt_engine *e = NULL;
	struct kvt_geometry g;
	uint64_t bb;
	int32_t *tok = NULL;
	int64_t *map = NULL;
	uint32_t i, maxn = 0;
	int rc;

	memset(out, 0, sizeof *out);
	out->st.size = sizeof out->st;
	if (tr->block_tokens > 65536)
		return -EINVAL;
	kvt_engine_opts_init(&eo, sizeof eo);
	eo.layout = (struct kvt_layout){ 1, 1, 8, KVT_DTYPE_F16, tr->block_tokens };
	bb = 2ull * tr->block_tokens * 8 * 2;
	eo.hbm_bytes = o->cap[0] * bb;
	eo.host_bytes = o->cap[1] * bb;
	eo.nvme_dir = o->cap[2] ? o->nvme_dir : NULL;
	eo.nvme_bytes = o->cap[2] * ((bb + 64 + 4095) / 4096 * 4096);
	eo.evict_policy = o->policy;
	eo.prefix_cache = 1;
	eo.log = NULL;
	for (i = 0; i < tr->n_req; i++)
		maxn = tr->req[i].n > maxn ? tr->req[i].n : maxn;
	tok = malloc(((size_t)maxn + 1) * tr->block_tokens * sizeof *tok);
	map = malloc((size_t)tr->block_tokens * sizeof *map);
	if (!tok || !map) {
		free(tok);
		free(map);
		return -ENOMEM;
	}
	rc = kvt_engine_create(&eo, &e);
	if (rc == 0)
		rc = kvt_engine_geometry(e, &g);
	for (i = 0; rc == 0 && i < tr->n_req; i++) {
		out->refs += tr->req[i].n;
		out->tokens += tr->req[i].in_tokens;
		rc = dm_request(e, &g, tr, &tr->req[i], tok, map, out);
		if (rc == 0 && i % 8 == 0)
			rc = kvt_engine_poll(e, 0) < 0 ? -EIO : 0;
		if (pf && (i % 16 == 0 || i + 1 == tr->n_req))
			pf(i + 1, tr->n_req);
	}
	if (rc) {
		kvtr_err_kvt(rc, "data mode");
		fprintf(stderr, "kvtier-replay: %s\n", kvtr_last_error());
	}
	if (e) {
		(void)kvt_engine_drain(e);
		(void)kvt_engine_stats(e, &out->st);
		out->block_bytes = bb;
	}
	kvt_engine_destroy(e);
	free(tok);
	free(map);
	return rc;
}
