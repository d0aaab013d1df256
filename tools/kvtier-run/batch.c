/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-run/batch.c - one decode step through kvtier, as a server's model runner does
 * it: cut the active sessions into groups that fit in HBM, append each session's token
 * (kvt_seq_append gives the slot to write its K/V), prepare the batch, then per layer wait for
 * the layer's blocks, compute q/k/v, store the new K/V, run paged attention through the block
 * table and the FFN; release. Sessions larger than HBM are walked in windows; lost blocks
 * (KVT_ELOST) are recomputed from the token history.
 */
#include <errno.h>
#include <string.h>

#include "kernels/attention.h"
#include "run_int.h"

#define BATCH_MAX_RETRY 16 /* KVT_ELOST answers tolerated for one group in one step */
#define BATCH_COPY_IN 1.5   /* copy_ratio above which copies are the bottleneck ... */
#define BATCH_COPY_OUT 1.25 /* ... and below which they no longer are (hysteresis) */

int
run_nofit(int rc)
{
	return rc == KVT_ETOOBIG || rc == -ENOSPC;
}

uint32_t
run_blocks(const struct run_ctx *c, uint32_t positions)
{
	return (positions + c->geo.tokens_per_block - 1) / c->geo.tokens_per_block;
}

int
run_handle_lost(struct run_ctx *c, struct run_sess *s)
{
	struct kvt_seq_info info;
	uint32_t have = s->n_kv + (s->appended ? 1u : 0u);
	int rc;

	memset(&info, 0, sizeof(info));
	rc = kvt_seq_info(c->e, s->id, &info);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_seq_info");
	if (info.n_tokens >= have)
		return 0;
	fprintf(c->log, "kvtier-run: note: session %u lost KV blocks (checksum or I/O error): "
		"sequence truncated to %llu of %u tokens; re-prefilling from the token history\n",
		s->idx + 1, (unsigned long long)info.n_tokens, have);
	c->r->reprefill_positions += s->n_kv - (uint32_t)info.n_tokens;
	s->n_kv = (uint32_t)info.n_tokens;
	s->appended = 0;
	return 0;
}

int
run_append(struct run_ctx *c, struct run_sess *s)
{
	for (int attempt = 0; attempt < BATCH_MAX_RETRY; attempt++) {
		int rc;

		if (s->appended)
			return 0;
		rc = kvt_seq_append(c->e, s->id, &s->hist[s->n_kv], 1, &s->slot);
		if (rc == 0) {
			s->appended = 1;
			s->slot_stale = 0;
			return 0;
		}
		if (rc != KVT_ELOST)
			return kvtr_err_kvt(rc, "kvt_seq_append");
		c->r->lost_events++;
		rc = run_handle_lost(c, s);
		if (rc)
			return rc;
	}
	return kvtr_err(KVT_ELOST, "session %u kept losing KV blocks on append", s->idx + 1);
}

/* Appends for every session of the group and prepares it, recovering from KVT_ELOST. */
static int
batch_prepare_group(struct run_ctx *c, struct run_sess **g, uint32_t n, struct kvt_batch **b)
{
	for (int attempt = 0; attempt < BATCH_MAX_RETRY; attempt++) {
		int rc;

		for (uint32_t i = 0; i < n; i++) {
			rc = run_append(c, g[i]);
			if (rc)
				return rc;
			c->ids[i] = g[i]->id;
		}
		rc = kvt_batch_prepare(c->e, c->ids, n, b);
		if (rc == 0)
			return 0;
		/* "on failure nothing stays pinned": appended blocks may move before the retry */
		for (uint32_t i = 0; i < n; i++)
			g[i]->slot_stale = 1;
		if (rc != KVT_ELOST)
			return kvtr_err_kvt(rc, "kvt_batch_prepare");
		c->r->lost_events++;
		for (uint32_t i = 0; i < n; i++) {
			rc = run_handle_lost(c, g[i]);
			if (rc)
				return rc;
		}
	}
	return kvtr_err(KVT_ELOST, "a batch of %u session(s) kept losing KV blocks", n);
}

int
run_check_slot(struct run_ctx *c, struct run_sess *s, uint32_t last_slot)
{
	uint32_t tpb = c->geo.tokens_per_block;
	int64_t want = (int64_t)last_slot * tpb + (int64_t)(s->n_kv % tpb);

	if (s->slot == want)
		return 0;
	if (!s->slot_stale)
		return kvtr_err(-EPROTO, "engine bug: session %u's slot mapping %lld from "
				"kvt_seq_append disagrees with its block table (slot %u, expected "
				"mapping %lld)", s->idx + 1, (long long)s->slot, last_slot,
				(long long)want);
	c->r->slot_remaps++;
	s->slot = want;
	return 0;
}

void
run_kv_view(const struct run_ctx *c, const struct kvt_block_table *bt, uint32_t i,
	      uint32_t l, struct kvt_paged_kv *kv)
{
	memset(kv, 0, sizeof(*kv)); /* no window, dense table */
	kv->k_base = (const char *)bt->geo.hbm_base + (uint64_t)l * bt->geo.layer_block_bytes;
	kv->v_offset = bt->geo.v_offset;
	kv->block_stride = bt->geo.block_bytes;
	kv->token_stride = bt->geo.token_bytes;
	kv->table = bt->indices + bt->indptr[i];
	kv->tokens_per_block = bt->geo.tokens_per_block;
	kv->n_kv_heads = (uint32_t)c->m->cfg.n_kv_heads;
	kv->head_dim = c->m->head_size;
	kv->dtype = c->o->kv_dtype;
}

int
run_store_kv(struct run_ctx *c, struct run_sess *s, uint32_t l, const float *kf, const float *vf)
{
	void *k, *v;
	int rc;

	kvt_kv_addr(&c->geo, l, s->slot, &k, &v);
	if (c->dev)
		return run_dev_store(c, k, v, kf, vf);
	rc = kvt_store_f32(c->o->kv_dtype, k, kf, c->m->kv_dim);
	if (rc == 0)
		rc = kvt_store_f32(c->o->kv_dtype, v, vf, c->m->kv_dim);
	if (rc)
		return kvtr_err(rc, "kvt_store_f32: cannot store K/V as dtype %d", c->o->kv_dtype);
	return 0;
}

/* Checks the block table row of a whole-sequence batch and fixes up the slot. */
static int
batch_check_row(struct run_ctx *c, struct run_sess *s, const struct kvt_block_table *bt,
		uint32_t i)
{
	uint32_t nb = bt->indptr[i + 1] - bt->indptr[i];

	if (bt->seq_len[i] != (uint64_t)s->n_kv + 1 || nb != run_blocks(c, s->n_kv + 1) ||
	    bt->first_block[i] != 0)
		return kvtr_err(-EPROTO, "engine bug: block table row %u (session %u) covers %llu "
				"tokens in %u blocks from block %u; expected %u tokens", i,
				s->idx + 1, (unsigned long long)bt->seq_len[i], nb,
				bt->first_block[i], s->n_kv + 1);
	return run_check_slot(c, s, bt->indices[bt->indptr[i + 1] - 1]);
}

/* The forward pass of a prepared group, layer by layer. */
static int
batch_forward_group(struct run_ctx *c, struct run_sess **g, uint32_t n, struct kvt_batch *b,
		    const struct kvt_block_table *bt)
{
	const struct kvtr_model *m = c->m;
	int rc;

	for (uint32_t i = 0; i < n; i++)
		kvtr_fwd_embed(m, &g[i]->st, g[i]->hist[g[i]->n_kv]);
	for (uint32_t l = 0; l < (uint32_t)m->cfg.n_layers; l++) {
		rc = kvt_batch_wait_layer(b, l, NULL);
		if (rc)
			return kvtr_err_kvt(rc, "kvt_batch_wait_layer");
		for (uint32_t i = 0; i < n; i++) {
			struct run_sess *s = g[i];
			struct kvt_paged_kv kv;

			kvtr_fwd_qkv(m, &s->st, l, s->n_kv);
			rc = run_store_kv(c, s, l, s->st.k, s->st.v);
			if (rc)
				return rc;
			run_kv_view(c, bt, i, l, &kv);
			if (c->dev) /* HBM is GPU memory: the CUDA kernel */
				rc = run_dev_attn(c, &kv, s->st.q, (uint64_t)s->n_kv + 1,
						  s->st.xb, NULL);
			else if ((rc = kvt_attn_decode_ref(&kv, s->st.q, (uint32_t)m->cfg.n_heads,
							   (uint64_t)s->n_kv + 1, s->st.att,
							   s->st.xb)) != 0)
				rc = kvtr_err(rc, "kvt_attn_decode_ref failed (%d)", rc);
			if (rc)
				return rc;
			kvtr_fwd_ffn(m, &s->st, l);
		}
	}
	for (uint32_t i = 0; i < n; i++)
		kvtr_fwd_logits(m, &g[i]->st);
	return 0;
}

int
run_hint(struct run_ctx *c, const struct kvt_seq_range *r)
{
	int rc;

	if (!c->o->prefetch)
		return 0;
	if (r)
		rc = kvt_engine_hint_ranges(c->e, r, 1, 1);
	else if (c->n_hint) {
		/* the blocks that appends write come up first, in their own copy group, and stay
		 * spared: an append never waits behind the rest of a batch or for a demotion */
		rc = c->n_hint_last ? kvt_engine_hint_ranges(c->e, c->hint_last, c->n_hint_last, 1)
				    : 0;
		if (rc == 0 || rc == KVT_ETOOBIG)
			rc = c->n_hint_part ? kvt_engine_hint_ranges(c->e, c->hint_part,
								     c->n_hint_part, 1)
					    : kvt_engine_hint(c->e, c->hint_ids, c->n_hint, 1);
	} else {
		return 0;
	}
	/* a next group larger than HBM is decoded by windows: nothing to announce as a whole */
	if (rc == 0 || rc == KVT_ETOOBIG)
		return 0;
	return kvtr_err_kvt(rc, "kvt_engine_hint");
}

void
run_done(struct run_ctx *c, struct run_sess *s)
{
	s->appended = 0;
	s->slot_stale = 0;
	s->n_kv++;
	s->computed = 1;
	c->r->positions++;
}

/* One group: prepare, forward, release. Returns 0, a no-fit code (split), or an error. */
static int
batch_run_group(struct run_ctx *c, struct run_sess **g, uint32_t n)
{
	struct kvt_block_table bt;
	struct kvt_batch *b = NULL;
	int rc, rc2;

	rc = batch_prepare_group(c, g, n, &b);
	if (rc)
		return rc;
	c->r->batches++;
	rc = run_hint(c, NULL); /* the next group's copies overlap this group's compute */
	memset(&bt, 0, sizeof(bt));
	if (rc == 0 && (rc = kvt_batch_block_table(b, &bt)) != 0)
		rc = kvtr_err_kvt(rc, "kvt_batch_block_table");
	for (uint32_t i = 0; rc == 0 && i < n; i++)
		rc = batch_check_row(c, g[i], &bt, i);
	if (rc == 0)
		rc = batch_forward_group(c, g, n, b, &bt);
	rc2 = kvt_batch_release(b, NULL);
	if (rc == 0 && rc2)
		rc = kvtr_err_kvt(rc2, "kvt_batch_release");
	if (rc)
		return run_nofit(rc) ? -EIO : rc; /* a no-fit here is not a split request */
	for (uint32_t i = 0; i < n; i++)
		run_done(c, g[i]);
	return 0;
}

/*
 * Memory pressure, as a server meets it: park (swap out) every other session that holds no
 * pins, so that their blocks leave HBM and the HOST staging slots, and wait for the copies.
 * They come back when their own group is prepared.
 */
static int
batch_preempt_others(struct run_ctx *c, const struct run_sess *keep)
{
	int rc;

	for (uint32_t i = 0; i < c->o->sessions; i++) {
		struct run_sess *q = &c->ss[i];

		if (q == keep || q->appended || !q->id)
			continue;
		/* a park that finds no room below now may find it once queued copies land */
		for (int attempt = 0; attempt < 4; attempt++) {
			rc = kvt_seq_park(c->e, q->id, c->park_tier);
			if (rc != -ENOSPC)
				break;
			rc = kvt_engine_drain(c->e);
			if (rc)
				return kvtr_err_kvt(rc, "kvt_engine_drain");
			rc = -ENOSPC;
		}
		if (rc == 0)
			c->r->preemptions++;
		else if (rc != -ENOSPC && rc != KVT_EBUSY)
			return kvtr_err_kvt(rc, "kvt_seq_park (preempting)");
	}
	rc = kvt_engine_drain(c->e);
	return rc ? kvtr_err_kvt(rc, "kvt_engine_drain") : 0;
}

/*
 * A group whose blocks fit in HBM but was refused (-ENOSPC / KVT_ETOOBIG): let the transfers in
 * flight finish and retry; then preempt the other sessions and retry. Returns the last answer
 * (a no-fit code when the group must be split).
 */
static int
batch_run_group_hard(struct run_ctx *c, struct run_sess **g, uint32_t n)
{
	int rc = batch_run_group(c, g, n);

	if (!run_nofit(rc))
		return rc;
	rc = kvt_engine_drain(c->e);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_engine_drain");
	rc = batch_run_group(c, g, n);
	if (!run_nofit(rc))
		return rc;
	rc = batch_preempt_others(c, g[0]);
	return rc ? rc : batch_run_group(c, g, n);
}

static int
batch_fail_single(struct run_ctx *c, struct run_sess *s, int rc)
{
	char why[512];

	snprintf(why, sizeof(why), "%s", kvtr_last_error());
	return kvtr_err(rc, "cannot place session %u's %u blocks in HBM (%u slots, %u HOST "
			"slots): %s", s->idx + 1, run_blocks(c, s->n_kv + 1), c->geo.hbm_slots,
			c->geo.host_slots, why);
}

/* Greedy group of consecutive sessions from act[i] whose blocks fit in @slots, each holding
 * @ahead positions more than it has now (1: this step's); *need gets their blocks. */
static uint32_t
batch_plan(struct run_ctx *c, struct run_sess **act, uint32_t n, uint32_t i, uint32_t maxg,
	   uint32_t slots, uint32_t ahead, uint32_t *need)
{
	uint32_t cnt = 0;

	*need = 0;
	while (i + cnt < n && cnt < maxg) {
		uint32_t bn = run_blocks(c, act[i + cnt]->n_kv + ahead);

		if (cnt > 0 && *need + bn > slots)
			break;
		*need += bn;
		cnt++;
	}
	return cnt;
}

/*
 * Copy-bound prefetch: of what the next group @g[0..n) misses in HBM, announce only as much as
 * keeps the copy stream busy while this group computes (its missing blocks / copy_ratio, plus
 * one); its prepare brings the rest, into the slots this group frees at release. Every slot a
 * group holds ahead of its prepare is one the engine cannot keep resident across steps. Under
 * the rotation's victim order (engine/hint.c) a session misses its blocks from the end: the
 * announced ranges start after its resident ones (its growing last block stays resident).
 */
static void
batch_plan_part(struct run_ctx *c, struct run_sess **g, uint32_t n)
{
	struct kvt_seq_info info[8];
	uint32_t miss = 0, budget;

	if (n > 8)
		return; /* large groups: not a copy-bound window; announce them whole */
	for (uint32_t k = 0; k < n; k++) {
		memset(&info[k], 0, sizeof(info[k]));
		if (kvt_seq_info(c->e, g[k]->id, &info[k]) != 0)
			return;
		miss += info[k].n_blocks - info[k].blocks_in[KVT_TIER_HBM];
	}
	budget = (uint32_t)((double)miss / c->copy_ratio) + 1;
	for (uint32_t k = 0; k < n && budget; k++) {
		uint32_t nb = info[k].n_blocks, in = info[k].blocks_in[KVT_TIER_HBM];
		uint32_t first = in ? in - 1 : 0, len = nb - in;

		if (in >= nb) /* else first + len <= nb */
			continue;
		if (len > budget)
			len = budget;
		budget -= len;
		c->hint_part[c->n_hint_part++] = (struct kvt_seq_range){
			.seq = g[k]->id, .first_block = first, .n_blocks = len };
	}
	if (!c->n_hint_part) /* nothing missing: announce the group whole */
		c->hint_part[c->n_hint_part++] = (struct kvt_seq_range){ .seq = g[0]->id };
}

/* Prefetch: the group after [i, i + cnt), wrapping to the step's first, into c->hint_ids. */
static void
batch_plan_next(struct run_ctx *c, struct run_sess **act, uint32_t n, uint32_t i, uint32_t maxg,
		uint32_t slots)
{
	uint32_t need, cnt;

	uint32_t ahead = 1;

	c->n_hint = 0;
	c->n_hint_last = 0;
	if (!c->o->prefetch)
		return;
	if (i >= n) {
		/* the next step's first group: every session will hold one position more */
		i = 0;
		ahead = 2;
	}
	cnt = batch_plan(c, act, n, i, maxg, slots, ahead, &need);
	for (uint32_t k = 0; k < cnt; k++)
		c->hint_ids[c->n_hint++] = act[i + k]->id;
	c->n_hint_part = 0;
	if (c->copy_bound)
		batch_plan_part(c, act + i, cnt);
	/* every active session's growing block (n_kv / tpb) stays spared in HBM, so that no
	 * append waits for it: the next group's first, then the others' */
	for (uint32_t k = 0; k < n; k++) {
		const struct run_sess *s = act[(i + k) % n];
		uint32_t tpb = c->geo.tokens_per_block;

		if (s->appended || s->n_kv % tpb)
			c->hint_last[c->n_hint_last++] = (struct kvt_seq_range){
				.seq = s->id, .first_block = s->n_kv / tpb, .n_blocks = 1 };
	}
}

/* Host time the engine has spent waiting for copies so far (stats.stall_ns). */
static uint64_t
batch_stall_ns(struct run_ctx *c)
{
	struct kvt_stats st;

	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	return kvt_engine_stats(c->e, &st) == 0 ? st.stall_ns : 0;
}

/*
 * Prefetch: blocks per group. The group computing and the one arriving must fit in HBM
 * together, beside the growing (dirty) last block of every active session, which would
 * otherwise be demoted to make room and come back on demand at its next append: at most half
 * of what is left. That is the window when compute is the bottleneck (the copies hide behind
 * it, and big groups absorb the jitter). When the copies are (c->copy_bound: c->copy_ratio =
 * step time / compute time went above BATCH_COPY_IN and has not fallen below BATCH_COPY_OUT
 * since), a bigger window does not move bytes faster, and every slot it holds is
 * one the engine cannot keep resident across steps (under the rotation's victim order,
 * engine/hint.c, each step promotes about accesses - (HBM - window) blocks): the window shrinks
 * by that ratio (a session that fits only alone still runs as a group of one).
 */
static uint32_t
batch_window(const struct run_ctx *c, uint32_t n)
{
	uint32_t slots = c->geo.hbm_slots, half = slots;

	if (c->o->prefetch && slots >= 2)
		half = (slots - (n < slots / 2 ? n : slots / 2)) / 2;
	if (c->o->prefetch && c->copy_bound)
		half = (uint32_t)((double)half / c->copy_ratio);
	return half ? half : 1;
}

/* Prefetch: fold one step's step time and copy wait time into c->copy_ratio. */
static void
batch_measure(struct run_ctx *c, uint64_t step_ns, uint64_t stall_ns)
{
	double r;

	if (!c->o->prefetch || step_ns == 0)
		return;
	if (stall_ns >= step_ns)
		stall_ns = step_ns - step_ns / 16; /* the compute is never free */
	r = (double)step_ns / (double)(step_ns - stall_ns);
	c->copy_ratio = c->copy_ratio > 0 ? 0.75 * c->copy_ratio + 0.25 * r : r;
	if (c->copy_ratio > BATCH_COPY_IN)
		c->copy_bound = 1;
	else if (c->copy_ratio < BATCH_COPY_OUT)
		c->copy_bound = 0;
}

int
run_step_kvt(struct run_ctx *c, struct run_sess **act, uint32_t n)
{
	uint32_t i = 0, maxg = n, slots = c->geo.hbm_slots, half = batch_window(c, n);
	uint64_t t0 = c->o->prefetch ? kvtr_now_ns() : 0;
	uint64_t w0 = c->o->prefetch ? batch_stall_ns(c) : 0;
	int rc;

	if (c->o->prefetch) {
		/* balanced groups: a small last group would leave the next step's first group
		 * too little compute to arrive behind */
		uint64_t total = 0, k;

		for (uint32_t j = 0; j < n; j++)
			total += run_blocks(c, act[j]->n_kv + 1);
		k = (total + half - 1) / half;
		if (k > 1 && (n + k - 1) / k < maxg)
			maxg = (uint32_t)((n + k - 1) / k);
	}
	for (uint32_t k = 0; k < n; k++)
		act[k]->computed = 0;
	while (i < n) {
		uint32_t cnt, need;

		cnt = batch_plan(c, act, n, i, maxg, half, 1, &need);
		batch_plan_next(c, act, n, i + cnt, maxg, half);
		if (cnt == 1 && need > slots && !act[i]->appended) {
			/* larger than HBM: decoded by windows (window.c) */
			rc = run_windowed(c, act[i]);
			if (rc)
				return rc;
			i++;
			continue;
		}
		rc = batch_run_group_hard(c, act + i, cnt);
		if (run_nofit(rc)) {
			c->r->group_splits++;
			if (cnt > 1) {
				maxg = cnt / 2;
				continue;
			}
			rc = batch_fail_single(c, act[i], rc);
		}
		if (rc)
			return rc;
		i += cnt;
	}
	if (c->o->prefetch)
		batch_measure(c, kvtr_now_ns() - t0, batch_stall_ns(c) - w0);
	return 0;
}
