/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-run/window.c - decoding one position of a session whose blocks do not fit in
 * HBM at once (the long-context case), with kvt_batch_prepare_ranges and split-KV attention.
 *
 * Order of a windowed position P (the sequence holds positions 0..P-1, all written):
 *   per layer l: q/k/v of P; walk windows of at most hbm_slots - 1 complete blocks
 *     [0, blocks(P)): prepare the window, wait for layer l, partial attention
 *     (kvt_attn_partial_ref), release; then the partial of P's own K/V (a one-token paged view
 *     of the values kept aside, stored as the KV dtype exactly as the engine would hold them);
 *     merge all (kvt_attn_merge), in position order; FFN.
 *   then: kvt_seq_append(P) and one batch holding the last block, in which the K/V of every
 *   layer are stored, then released.
 * With prefetch (runner.h), windows hold at most half of HBM, and as soon as a window is
 * prepared the next one (of this layer, else the first of the next layer) is announced with
 * kvt_engine_hint_ranges: its promotion runs while this window's partial is computed, and its
 * blocks are spared by eviction until its own batch is released.
 * Why append last: kvtier takes the K/V written into an appended block as part of the block
 * only until the first release of a batch holding the sequence (the append's write pin); the
 * windows are such batches, so the new K/V must not be written before them.
 */
#include <errno.h>
#include <string.h>

#include "run_int.h"

#define WIN_MAX_RETRY 16

/* P's own K/V as a one-token paged view over c->tokblk. */
static int
win_self_view(struct run_ctx *c, const float *k, const float *v, struct kvt_paged_kv *kv)
{
	static const uint32_t table0[1] = { 0 };
	size_t tb = c->geo.token_bytes;
	int rc;

	rc = kvt_store_f32(c->o->kv_dtype, c->tokblk, k, c->m->kv_dim);
	if (rc == 0)
		rc = kvt_store_f32(c->o->kv_dtype, (char *)c->tokblk + tb, v, c->m->kv_dim);
	if (rc)
		return kvtr_err(rc, "kvt_store_f32: cannot convert K/V to dtype %d",
				c->o->kv_dtype);
	memset(kv, 0, sizeof(*kv)); /* no window, dense table */
	kv->k_base = c->tokblk;
	kv->v_offset = tb;
	kv->block_stride = 2 * tb;
	kv->token_stride = tb;
	kv->table = table0;
	kv->tokens_per_block = 1;
	kv->n_kv_heads = (uint32_t)c->m->cfg.n_kv_heads;
	kv->head_dim = c->m->head_size;
	kv->dtype = c->o->kv_dtype;
	return 0;
}

/* Partial attention of s's query into (wo, wm, wl) when first, else merged into them. */
static int
win_partial(struct run_ctx *c, struct run_sess *s, const struct kvt_paged_kv *kv, uint64_t len,
	    int first)
{
	uint32_t nh = (uint32_t)c->m->cfg.n_heads;
	int rc;

	if (run_dev_owns(c, kv->k_base)) { /* blocks in GPU memory: the CUDA kernel */
		rc = run_dev_attn(c, kv, s->st.q, len, first ? c->wo : c->po,
				  first ? c->wm : c->pm);
		if (rc)
			return rc;
	} else {
		rc = kvt_attn_partial_ref(kv, s->st.q, nh, 0, len, s->st.att,
					  first ? c->wo : c->po, first ? c->wm : c->pm,
					  first ? c->wl : c->pl);
		if (rc)
			return kvtr_err(rc, "kvt_attn_partial_ref failed (%d)", rc);
	}
	if (!first)
		kvt_attn_merge(nh, c->m->head_size, c->wo, c->wm, c->wl, c->po, c->pm, c->pl);
	return 0;
}

/* Prepares blocks [ws, ws + *wn) of @s, halving *wn while HBM is pinned by others. */
static int
win_prepare(struct run_ctx *c, struct run_sess *s, uint32_t ws, uint32_t *wn,
	    struct kvt_batch **b)
{
	for (;;) {
		struct kvt_seq_range range = { .seq = s->id, .first_block = ws, .n_blocks = *wn };
		int rc = kvt_batch_prepare_ranges(c->e, &range, 1, b);

		if (rc == 0)
			return 0;
		if (run_nofit(rc) && *wn > 1) {
			*wn /= 2;
			continue;
		}
		if (rc == KVT_ELOST)
			c->r->lost_events++;
		return kvtr_err_kvt(rc, "kvt_batch_prepare_ranges");
	}
}

/*
 * Prefetch: announce the window after [ws, ws + wn) of layer @l: the next window of this layer,
 * else the first of the next layer (the same blocks come back: block-first slots hold every
 * layer, but HBM holds only two windows), so its copies overlap this window's compute.
 */
static int
win_hint_next(struct run_ctx *c, struct run_sess *s, uint32_t l, uint32_t ws, uint32_t wn,
	      uint32_t nold, uint32_t cap)
{
	struct kvt_seq_range r = { .seq = s->id, .first_block = ws + wn, .n_blocks = 0 };

	if (r.first_block >= nold) {
		if (l + 1 >= (uint32_t)c->m->cfg.n_layers || ws == 0)
			return 0; /* the last window, or one window holds them all */
		r.first_block = 0;
	}
	r.n_blocks = nold - r.first_block < cap ? nold - r.first_block : cap;
	return run_hint(c, &r);
}

/* One window of complete blocks for layer @l. *wn may shrink (HBM busy). */
static int
win_one(struct run_ctx *c, struct run_sess *s, uint32_t l, uint32_t ws, uint32_t *wn, int first,
	uint32_t nold, uint32_t cap)
{
	uint32_t tpb = c->geo.tokens_per_block, pos = s->n_kv;
	struct kvt_block_table bt;
	struct kvt_paged_kv kv;
	struct kvt_batch *b = NULL;
	uint64_t want;
	int rc, rc2;

	rc = win_prepare(c, s, ws, wn, &b);
	if (rc)
		return rc;
	c->r->windows++;
	rc = win_hint_next(c, s, l, ws, *wn, nold, cap);
	if (rc) {
		kvt_batch_release(b, NULL);
		return rc;
	}
	want = ((uint64_t)(ws + *wn) * tpb < pos ? (uint64_t)(ws + *wn) * tpb : pos) -
	       (uint64_t)ws * tpb;
	memset(&bt, 0, sizeof(bt));
	rc = kvt_batch_block_table(b, &bt);
	if (rc)
		rc = kvtr_err_kvt(rc, "kvt_batch_block_table");
	else if (bt.n_seqs != 1 || bt.first_block[0] != ws ||
		 bt.indptr[1] - bt.indptr[0] != *wn || bt.seq_len[0] != want)
		rc = kvtr_err(-EPROTO, "engine bug: window [%u, +%u) of session %u has a block "
			      "table of %u blocks from %u covering %llu tokens (expected %llu)", ws,
			      *wn, s->idx + 1, bt.indptr[1] - bt.indptr[0], bt.first_block[0],
			      (unsigned long long)bt.seq_len[0], (unsigned long long)want);
	if (rc == 0 && (rc = kvt_batch_wait_layer(b, l, NULL)) != 0)
		rc = kvtr_err_kvt(rc, "kvt_batch_wait_layer");
	if (rc == 0) {
		run_kv_view(c, &bt, 0, l, &kv);
		rc = win_partial(c, s, &kv, bt.seq_len[0], first);
	}
	rc2 = kvt_batch_release(b, NULL);
	if (rc == 0 && rc2)
		rc = kvtr_err_kvt(rc2, "kvt_batch_release");
	return rc;
}

/* Attention of layer @l: every window of complete blocks, then P itself; result in s->st.xb. */
static int
win_layer(struct run_ctx *c, struct run_sess *s, uint32_t l, uint32_t nold, uint32_t *cap)
{
	const float *k = c->side + (size_t)l * 2 * c->m->kv_dim, *v = k + c->m->kv_dim;
	struct kvt_paged_kv self;
	int first = 1, rc;

	for (uint32_t ws = 0; ws < nold; first = 0) {
		uint32_t wn = nold - ws < *cap ? nold - ws : *cap, asked = wn;

		rc = win_one(c, s, l, ws, &wn, first, nold, *cap);
		if (rc)
			return rc;
		if (wn < asked)
			*cap = wn; /* HBM was busy: keep the smaller windows */
		ws += wn;
	}
	rc = win_self_view(c, k, v, &self);
	if (rc == 0)
		rc = win_partial(c, s, &self, 1, first);
	if (rc == 0)
		memcpy(s->st.xb, c->wo, (size_t)c->m->cfg.dim * sizeof(float));
	return rc;
}

/* Append P and store the K/V of every layer in one batch holding the last block. */
static int
win_commit(struct run_ctx *c, struct run_sess *s)
{
	uint32_t tpb = c->geo.tokens_per_block, pos = s->n_kv, kvd = c->m->kv_dim;
	uint32_t last = run_blocks(c, pos + 1) - 1;
	struct kvt_seq_range range;
	struct kvt_block_table bt;
	struct kvt_batch *b = NULL;
	int rc, rc2;

	rc = run_append(c, s);
	if (rc)
		return rc;
	range.seq = s->id;
	range.first_block = last;
	range.n_blocks = 1;
	rc = kvt_batch_prepare_ranges(c->e, &range, 1, &b);
	if (rc) {
		s->slot_stale = 1;
		if (rc == KVT_ELOST)
			c->r->lost_events++;
		return kvtr_err_kvt(rc, "kvt_batch_prepare_ranges (new token's block)");
	}
	memset(&bt, 0, sizeof(bt));
	rc = kvt_batch_block_table(b, &bt);
	if (rc)
		rc = kvtr_err_kvt(rc, "kvt_batch_block_table");
	else if (bt.seq_len[0] != (uint64_t)pos + 1 - (uint64_t)last * tpb)
		rc = kvtr_err(-EPROTO, "engine bug: the new token's block of session %u covers "
			      "%llu tokens, expected %llu", s->idx + 1,
			      (unsigned long long)bt.seq_len[0],
			      (unsigned long long)(pos + 1 - (uint64_t)last * tpb));
	if (rc == 0)
		rc = run_check_slot(c, s, bt.indices[0]);
	for (uint32_t l = 0; rc == 0 && l < (uint32_t)c->m->cfg.n_layers; l++) {
		const float *k = c->side + (size_t)l * 2 * kvd;

		rc = kvt_batch_wait_layer(b, l, NULL);
		if (rc)
			rc = kvtr_err_kvt(rc, "kvt_batch_wait_layer");
		else
			rc = run_store_kv(c, s, l, k, k + kvd);
	}
	rc2 = kvt_batch_release(b, NULL);
	if (rc == 0 && rc2)
		rc = kvtr_err_kvt(rc2, "kvt_batch_release");
	return rc;
}

/* The forward pass of position s->n_kv with windowed attention; logits in s->st.logits. */
static int
win_forward(struct run_ctx *c, struct run_sess *s, uint32_t cap)
{
	const struct kvtr_model *m = c->m;
	uint32_t pos = s->n_kv, nold = run_blocks(c, pos);
	size_t kvd = m->kv_dim;
	int rc = 0;

	kvtr_fwd_embed(m, &s->st, s->hist[pos]);
	for (uint32_t l = 0; rc == 0 && l < (uint32_t)m->cfg.n_layers; l++) {
		float *side = c->side + (size_t)l * 2 * kvd;

		kvtr_fwd_qkv(m, &s->st, l, pos);
		memcpy(side, s->st.k, kvd * sizeof(float));
		memcpy(side + kvd, s->st.v, kvd * sizeof(float));
		rc = win_layer(c, s, l, nold, &cap);
		if (rc == 0)
			kvtr_fwd_ffn(m, &s->st, l);
	}
	if (rc == 0)
		kvtr_fwd_logits(m, &s->st);
	return rc;
}

int
run_windowed(struct run_ctx *c, struct run_sess *s)
{
	uint32_t slots = c->geo.hbm_slots;

	if (s->appended)
		return kvtr_err(-EINVAL, "internal: windowed decode of an appended session");
	if (slots < 2)
		return kvtr_err(KVT_ETOOBIG, "HBM holds %u block slot(s): too small to hold one "
				"decode batch of session %u (%u blocks; windows need at least 2 "
				"slots); raise --hbm", slots, s->idx + 1,
				run_blocks(c, s->n_kv + 1));
	for (int attempt = 0; attempt < WIN_MAX_RETRY; attempt++) {
		/* prefetch: the window computing and the next one arriving share HBM */
		int rc = win_forward(c, s, c->o->prefetch ? slots / 2 : slots - 1);

		if (rc == 0)
			rc = win_commit(c, s);
		if (rc == KVT_ELOST) {
			rc = run_handle_lost(c, s);
			if (rc)
				return rc;
			continue;
		}
		if (rc)
			return rc;
		c->r->windowed_positions++;
		run_done(c, s);
		return 0;
	}
	return kvtr_err(KVT_ELOST, "session %u kept losing KV blocks", s->idx + 1);
}
