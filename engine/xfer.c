/* SPDX-License-Identifier: MIT */
/*
 * engine/xfer.c - the engine's transfer bookkeeping: block copies between tiers and their
 * completions.
 *
 * Device copies (HBM <-> HOST) are collected per direction and submitted as ONE batched copy
 * per flush (copy_batch_async: cudaMemcpyBatchAsync on CUDA), followed by an event; the group
 * of transfers retires when its event has completed. Each direction has its own in-order
 * stream, so groups of one direction retire in order. NVMe IO (HOST <-> NVME) goes through the
 * io_uring of tiers/tier_nvme.c, one IO per block, reaped here.
 *
 * A transfer marks its destination copy INFLIGHT and its block busy when it is created, so
 * neither the destination slot nor the source copy can be evicted or reused until the
 * completion is processed (DESIGN.md invariants 1 and 3). Completions are processed only in
 * kvt_xfer_poll()/kvt_xfer_wait_*(), under the engine lock, never inside the submitting call.
 *
 * Waiting (kvt_xfer_wait_any/_block): a caller never sleeps holding the engine lock. It picks
 * one thing to sleep on (the oldest device-to-host group's event, the NVMe CQ, a host-to-device
 * group's event), marks it as its own (xs->syncing, e->nvme_reaping: exactly one thread sleeps
 * on a stream or reaps the CQ at a time; a group it sleeps on holds a reference, g->waiters, so
 * neither the group nor its events are freed or reused while the lock is released), drops the
 * lock, sleeps, takes the lock again, processes what completed, and broadcasts e->xfer_cv. A
 * caller that finds everything in flight already slept on by others waits on e->xfer_cv
 * instead. Either way it returns to a state that may have changed in any way meanwhile (blocks
 * freed, groups retired by another thread's poll): callers re-check their condition. While a
 * thread reaps the CQ, the others' polls leave it alone (the reaper processes what it gets).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_impl.h"

#define XFER_MAX_LGROUPS 32u /* at most this many layer groups (events) per H2D flush */

static const int xfer_dst_tier[4] = {
	[KVT_X_D2H] = KVT_TIER_HOST,
	[KVT_X_H2N] = KVT_TIER_NVME,
	[KVT_X_N2H] = KVT_TIER_HOST,
	[KVT_X_H2D] = KVT_TIER_HBM,
};

static const int xfer_src_tier[4] = {
	[KVT_X_D2H] = KVT_TIER_HBM,
	[KVT_X_H2N] = KVT_TIER_HOST,
	[KVT_X_N2H] = KVT_TIER_NVME,
	[KVT_X_H2D] = KVT_TIER_HOST,
};

static int
xfer_dev_err(struct kvt_engine *e, int rc, const char *what)
{
	if (rc == KVT_EDEVICE || rc == KVT_ENOTSUP)
		return kvt_err(rc, "%s: %s", what, e->dev->errmsg);
	return kvt_err(rc, "%s failed", what);
}

/* ---- events: a small pool, since every group needs one */

static int
xfer_event_get(struct kvt_engine *e, struct kvt_event **out)
{
	if (e->n_ev_pool) {
		*out = e->ev_pool[--e->n_ev_pool];
		return 0;
	}
	return e->dev->ops->event_create(e->dev, out);
}

static void
xfer_event_put(struct kvt_engine *e, struct kvt_event *ev)
{
	struct kvt_event **np;

	if (e->n_ev_pool == e->cap_ev_pool) {
		uint32_t ncap = e->cap_ev_pool ? e->cap_ev_pool * 2 : 16;

		np = kvt_realloc(e->ev_pool, ncap * sizeof *np);
		if (!np) {
			e->dev->ops->event_destroy(e->dev, ev);
			return;
		}
		e->ev_pool = np;
		e->cap_ev_pool = ncap;
	}
	e->ev_pool[e->n_ev_pool++] = ev;
}

/* ---- transfer records */

static struct kvt_xfer *
xfer_get(struct kvt_engine *e)
{
	struct kvt_xfer *x = e->xfer_free;

	if (x)
		e->xfer_free = x->next;
	else
		x = kvt_malloc(sizeof *x);
	if (x)
		memset(x, 0, sizeof *x);
	return x;
}

static void
xfer_put(struct kvt_engine *e, struct kvt_xfer *x)
{
	x->next = e->xfer_free;
	e->xfer_free = x;
}

/*
 * Create a transfer of block @id into @dst_slot and mark the destination copy in flight. The
 * kvt_xfer_*() entry points own @dst_slot from the call on: if the transfer cannot start, the
 * slot goes back to its tier here, so no caller leaks one on an error path.
 */
static struct kvt_xfer *
xfer_start(struct kvt_engine *e, int kind, uint32_t id, uint32_t dst_slot)
{
	struct kvt_block *b = kvt_blk(e, id);
	int src = xfer_src_tier[kind], dst = xfer_dst_tier[kind];
	struct kvt_xfer *x = b->busy < KVT_BUSY_MAX ? xfer_get(e) : NULL;
	bool old;

	if (!x) {
		kvt_slot_free(e, dst, dst_slot);
		return NULL;
	}
	x->kind = (uint8_t)kind;
	x->block = id;
	x->src_slot = b->slot[src];
	x->dst_slot = dst_slot;
	/* the bytes are current unless the source copy is itself on its way and stale (then
	 * this copy is dropped on completion too) */
	old = kvt_copy_stale(b, src);
	b->slot[dst] = dst_slot;
	kvt_copy_state_set(b, dst, KVT_COPY_INFLIGHT);
	if (old)
		kvt_copy_mark_stale(b, dst);
	b->busy++;
	e->st.transfers_in_flight++;
	x->prefetch = e->prefetching;
	if (kind == KVT_X_H2D || kind == KVT_X_N2H) { /* a promotion: its latency is recorded */
		x->t_issue = kvt_now_ns();
		kvt_stats_record_issue(e, dst, e->block_bytes);
	}
	return x;
}

static void
xstream_queue(struct kvt_xstream *xs, struct kvt_xfer *x)
{
	x->next = xs->pending;
	xs->pending = x;
	xs->n_pending++;
}

/* Tokens in block @id now: its sequence's count past the block's start, at most a block (a
 * whole block when the block is not its sequence's any more). */
static uint32_t
xfer_block_fill(const struct kvt_engine *e, uint32_t id)
{
	const struct kvt_block *b = kvt_blk((struct kvt_engine *)e, id);
	uint64_t tpb = e->layout.tokens_per_block, start = (uint64_t)b->index * tpb;
	const struct kvt_seqrec *s;

	if (b->seq >= e->cap_seqs)
		return (uint32_t)tpb;
	s = &e->seqs[b->seq];
	if (b->index >= s->n_blocks || s->blocks[b->index] != id || s->n_tokens <= start)
		return (uint32_t)tpb;
	return s->n_tokens - start < tpb ? (uint32_t)(s->n_tokens - start) : (uint32_t)tpb;
}

int
kvt_xfer_d2h(struct kvt_engine *e, uint32_t id, uint32_t host_slot, uint32_t kept,
	     bool evict_src, bool then_nvme)
{
	struct kvt_xfer *x = xfer_start(e, KVT_X_D2H, id, host_slot);

	if (!x)
		return kvt_err(-ENOMEM, "transfer record");
	x->kept = kept < e->layout.tokens_per_block ? kept : 0;
	x->upto = x->kept ? xfer_block_fill(e, id) : 0;
	/* nothing new (or the sequence is not known), or too little kept to be worth 2 copies a
	 * layer instead of one (under a quarter of the written tokens): all of it */
	if (x->upto <= x->kept || (uint64_t)x->kept * 4 < x->upto)
		x->kept = 0;
	x->evict_src = evict_src;
	x->then_nvme = then_nvme;
	if (evict_src)
		e->demoting[KVT_TIER_HBM]++;
	xstream_queue(&e->d2h, x);
	return 0;
}

int
kvt_xfer_h2d(struct kvt_engine *e, uint32_t id, uint32_t hbm_slot)
{
	struct kvt_xfer *x = xfer_start(e, KVT_X_H2D, id, hbm_slot);

	if (!x)
		return kvt_err(-ENOMEM, "transfer record");
	xstream_queue(&e->h2d, x);
	return 0;
}

static void xfer_complete(struct kvt_engine *e, struct kvt_xfer *x, int res, uint64_t now);

/*
 * Submit @x's IO. While the queue is full, a caller that may wait (@may_wait) waits for a
 * completion (the lock released: the block itself is busy, so safe); one that may not (a
 * completion's follow-up, a prefetch) gets -EAGAIN and the transfer is undone (-ECANCELED: the
 * source copy stays, nothing counts as an IO error).
 */
static int
xfer_nvme_submit(struct kvt_engine *e, struct kvt_xfer *x, bool may_wait)
{
	struct kvt_block *b = kvt_blk(e, x->block);
	struct kvt_nvme_wmeta m = { .index = b->index };
	int rc;

	if (!b->dead && b->seq < e->cap_seqs)
		m.session = e->seqs[b->seq].session_key;
	else if (b->seq == KVT_EXT_SEQ)
		m.session = kvt_ext_session_key(e, x->block); /* its record's key (persist.c) */
	if (b->hashed)
		memcpy(m.hash, b->hash, sizeof m.hash); /* its prefix key: the content hash */
	for (;;) {
		if (x->kind == KVT_X_H2N)
			rc = kvt_nvme_put(e->nvme, x->dst_slot,
					  kvt_slot_addr(e, KVT_TIER_HOST, x->src_slot), &m,
					  (uint64_t)(uintptr_t)x);
		else
			rc = kvt_nvme_get(e->nvme, x->src_slot,
					  kvt_slot_addr(e, KVT_TIER_HOST, x->dst_slot),
					  (uint64_t)(uintptr_t)x);
		if (rc != -EAGAIN)
			break;
		if (!may_wait) {
			xfer_complete(e, x, -ECANCELED, 0);
			return -EAGAIN;
		}
		/* queue full: finish something first (the block itself is busy, so safe) */
		rc = kvt_xfer_wait_any(e);
		if (rc < 0)
			break;
	}
	if (rc < 0) {
		xfer_complete(e, x, rc, 0);
		return kvt_err(rc, "submitting NVMe %s", x->kind == KVT_X_H2N ? "write" : "read");
	}
	e->nvme_inflight++;
	return 0;
}

/* A caller that must not block gets -EAGAIN (and its slot back) while the IO queue is full. */
static int
xfer_nvme_room(struct kvt_engine *e, int dst, uint32_t dst_slot, bool may_wait)
{
	if (may_wait || kvt_nvme_free_qd(e->nvme) > 0)
		return 0;
	kvt_slot_free(e, dst, dst_slot);
	return -EAGAIN;
}

int
kvt_xfer_h2n(struct kvt_engine *e, uint32_t id, uint32_t nvme_slot, bool evict_src,
	     bool may_wait)
{
	struct kvt_xfer *x;

	if (xfer_nvme_room(e, KVT_TIER_NVME, nvme_slot, may_wait))
		return -EAGAIN;
	x = xfer_start(e, KVT_X_H2N, id, nvme_slot);
	if (!x)
		return kvt_err(-ENOMEM, "transfer record");
	/* the tier's slot table records the write (key, checksum, stored length) when it
	 * completes; bytes an earlier block left in the slot can never verify against it */
	x->evict_src = evict_src;
	if (evict_src)
		e->demoting[KVT_TIER_HOST]++;
	return xfer_nvme_submit(e, x, may_wait);
}

int
kvt_xfer_n2h(struct kvt_engine *e, uint32_t id, uint32_t host_slot, bool then_hbm, bool may_wait)
{
	struct kvt_xfer *x;

	if (xfer_nvme_room(e, KVT_TIER_HOST, host_slot, may_wait))
		return -EAGAIN;
	x = xfer_start(e, KVT_X_N2H, id, host_slot);
	if (!x)
		return kvt_err(-ENOMEM, "transfer record");
	x->then_hbm = then_hbm;
	return xfer_nvme_submit(e, x, may_wait);
}

/* ---- completion: the only place where an INFLIGHT copy becomes PRESENT or goes away */

/* Copy descriptors of @x's demotion into @v (NULL: only counted): the whole block, or, when
 * its destination holds the first x->kept tokens already (a shadow), per layer the K rows
 * and the V rows of tokens [kept, upto) (the rows past upto hold nothing yet; block-first layout, docs/ARCHITECTURE.md "Data
 * layout"; a shadow exists only in pools of K/V rows without sidecar bytes). Returns how
 * many; *bytes (may be NULL) their length. */
static uint32_t
xfer_d2h_pieces(struct kvt_engine *e, const struct kvt_xfer *x, struct kvt_copy *v,
		uint64_t *bytes)
{
	uint64_t tpb = e->layout.tokens_per_block, k = x->kept, sum = 0; /* tokens */
	char *dst, *src;
	uint32_t l, n = 0;

	if (!k) {
		if (v) {
			v[0].dst = kvt_slot_addr(e, KVT_TIER_HOST, x->dst_slot);
			v[0].src = kvt_slot_addr(e, KVT_TIER_HBM, x->src_slot);
			v[0].len = e->block_bytes;
		}
		if (bytes)
			*bytes = e->block_bytes;
		return 1;
	}
	for (l = 0; l < e->layout.n_layers; l++) {
		uint64_t base = (uint64_t)l * e->layer_block_bytes;
		uint64_t off[2] = { base + k * e->token_bytes,
				    base + tpb * e->token_bytes + k * e->v_token_bytes };
		uint64_t len[2] = { (x->upto - k) * e->token_bytes,
				    (x->upto - k) * e->v_token_bytes };

		for (int kv = 0; kv < 2; kv++) {
			if (!len[kv])
				continue; /* a LATENT pool: K only */
			if (v) {
				dst = (char *)kvt_slot_addr(e, KVT_TIER_HOST, x->dst_slot);
				src = (char *)kvt_slot_addr(e, KVT_TIER_HBM, x->src_slot);
				v[n].dst = dst + off[kv];
				v[n].src = src + off[kv];
				v[n].len = len[kv];
			}
			sum += len[kv];
			n++;
		}
	}
	if (bytes)
		*bytes = sum;
	return n;
}

static void
xfer_count_move(struct kvt_engine *e, const struct kvt_xfer *x)
{
	uint64_t bytes = e->block_bytes;

	if (x->kind == KVT_X_D2H && x->kept)
		xfer_d2h_pieces(e, x, NULL, &bytes);
	e->st.blocks_moved[x->kind]++;
	e->st.bytes_moved[x->kind] += bytes;
}

/* A park's block, now in HOST, on to NVMe: the slot the park kept free for it (its promise
 * ended in xfer_complete). -EAGAIN: the IO queue is full (the slot went back). */
static int
xfer_park_down(struct kvt_engine *e, uint32_t id)
{
	uint32_t slot;
	int rc = kvt_reclaim(e, KVT_TIER_NVME, 1, false);

	if (rc == 0)
		rc = kvt_slot_alloc(e, KVT_TIER_NVME, id, &slot);
	if (rc == 0)
		rc = kvt_xfer_h2n(e, id, slot, true, false);
	return rc;
}

/* Keep @id for a write when the queue has room (a failed allocation costs the write only: the
 * block stays in HOST, as when its park could not reach NVMe). */
static void
xfer_backlog_add(struct kvt_engine *e, uint32_t id)
{
	if (e->n_backlog == e->cap_backlog) {
		uint32_t nc = e->cap_backlog ? 2 * e->cap_backlog : 64;
		uint32_t *nb = kvt_realloc(e->nvme_backlog, (size_t)nc * sizeof *nb);

		if (!nb)
			return;
		e->nvme_backlog = nb;
		e->cap_backlog = nc;
	}
	e->nvme_backlog[e->n_backlog++] = id;
}

uint32_t
kvt_xfer_backlog_kick(struct kvt_engine *e)
{
	uint32_t i = 0, keep = 0;

	while (i < e->n_backlog) {
		uint32_t id = e->nvme_backlog[i++];
		struct kvt_block *b = kvt_blk(e, id);

		/* still a park's block to write: alive, in HOST only below HBM, nobody using it */
		if (!b->live || b->dead || b->pins || b->wanted || b->busy ||
		    kvt_copy_state(b, KVT_TIER_HOST) != KVT_COPY_PRESENT ||
		    kvt_copy_state(b, KVT_TIER_NVME) != KVT_COPY_ABSENT ||
		    kvt_copy_state(b, KVT_TIER_HBM) != KVT_COPY_ABSENT)
			continue;
		if (kvt_nvme_free_qd(e->nvme) == 0 || xfer_park_down(e, id) == -EAGAIN) {
			e->nvme_backlog[keep++] = id; /* the queue is full: later */
			break;
		}
	}
	while (i < e->n_backlog)
		e->nvme_backlog[keep++] = e->nvme_backlog[i++];
	e->n_backlog = keep;
	return keep;
}

static void
xfer_complete_down(struct kvt_engine *e, struct kvt_xfer *x, int res, bool current,
		   uint64_t now)
{
	struct kvt_block *b = kvt_blk(e, x->block);
	int dst = xfer_dst_tier[x->kind], src = xfer_src_tier[x->kind];

	if (res < 0 && res != -ECANCELED && x->kind == KVT_X_H2N)
		e->st.io_errors++;
	if (res == -ENOSPC && x->kind == KVT_X_H2N)
		kvt_nvme_enospc(e);
	if (res == -ETIMEDOUT && x->kind == KVT_X_H2N &&
	    kvt_copy_state(b, dst) == KVT_COPY_INFLIGHT) {
		/* the kernel still owns the write: a new write to the slot could be overwritten
		 * by it, so the slot stays out of use until its late completion comes */
		kvt_slot_quarantine(e, dst, b->slot[dst], x->block);
		e->nvme_late++;
		return;
	}
	if (res < 0 || !current) {
		/* failed or stale: the destination is not findable, its slot goes back; the
		 * source copy stays (case d: nothing referenced is lost) */
		kvt_copy_fail(e, x->block, dst);
		return;
	}
	kvt_copy_set_present(e, x->block, dst);
	xfer_count_move(e, x);
	if (e->sc_rec && x->kind == KVT_X_D2H) /* a host copy of the block: its sidecar's mirror */
		kvt_sc_fill(e, x->block, kvt_slot_addr(e, KVT_TIER_HOST, b->slot[KVT_TIER_HOST]));
	if (x->kind == KVT_X_H2N)
		kvt_stats_record_lat(&e->st.nvme_write, now - x->t_issue);
	/* a demotion frees the source once the copy below is safe, unless it got pinned or
	 * another transfer uses it meanwhile */
	if (x->evict_src && !b->wanted && b->pins == 0 && b->busy == 0 &&
	    kvt_copy_state(b, src) == KVT_COPY_PRESENT) {
		kvt_copy_evict(e, x->block, src);
	}
	if (x->then_nvme && e->nvme && b->pins == 0 && !b->wanted &&
	    xfer_park_down(e, x->block) == -EAGAIN)
		xfer_backlog_add(e, x->block);
}

/*
 * @x, which read @x's block's HOST copy, completed: a HOST copy appended to while transfers
 * read it was left INFLIGHT and stale (kvt_block_bump_ver); once no transfer reads it any more
 * (no HOST->NVMe write, no HOST->HBM copy in flight) its slot is released.
 */
static void
xfer_release_src(struct kvt_engine *e, struct kvt_xfer *x)
{
	struct kvt_block *b = kvt_blk(e, x->block);

	if (kvt_copy_stale(b, KVT_TIER_HOST) && b->slot[KVT_TIER_HOST] == x->src_slot &&
	    !kvt_host_has_reader(b))
		kvt_copy_fail(e, x->block, KVT_TIER_HOST);
}

/* @x ended with @res (0 or a negative code), seen at clock @now (kvt_now_ns(), read once per
 * retired group or reaped batch; unused when @res < 0). */
static void
xfer_complete(struct kvt_engine *e, struct kvt_xfer *x, int res, uint64_t now)
{
	struct kvt_block *b = kvt_blk(e, x->block);
	bool current = !b->dead && !kvt_copy_stale(b, xfer_dst_tier[x->kind]);
	uint32_t id = x->block;

	b->busy--;
	e->st.transfers_in_flight--;
	if (x->evict_src)
		e->demoting[xfer_src_tier[x->kind]]--;
	if (x->then_nvme && e->nvme_promised) /* whatever the outcome (seq.c, park) */
		e->nvme_promised--;
	switch (x->kind) {
	case KVT_X_D2H:
	case KVT_X_H2N:
		xfer_complete_down(e, x, res, current, now);
		break;
	case KVT_X_H2D:
		if (res == 0 && current) {
			kvt_copy_set_present(e, id, KVT_TIER_HBM);
			xfer_count_move(e, x);
			kvt_stats_record_promote(e, KVT_TIER_HBM, now - x->t_issue);
		} else {
			kvt_copy_fail(e, id, KVT_TIER_HBM);
		}
		break;
	case KVT_X_N2H:
		if (res == 0)
			e->st.checksum_verified++;
		else if (res == KVT_ECORRUPT)
			e->st.checksum_failed++;
		else if (res != -ECANCELED)
			e->st.io_errors++;
		if (res == 0 && current) {
			kvt_copy_set_present(e, id, KVT_TIER_HOST);
			xfer_count_move(e, x);
			if (e->sc_rec) /* a host copy of the block: its sidecar's mirror */
				kvt_sc_fill(e, id, kvt_slot_addr(e, KVT_TIER_HOST,
								 b->slot[KVT_TIER_HOST]));
			kvt_stats_record_promote(e, KVT_TIER_HOST, now - x->t_issue);
			if (x->then_hbm) {
				bool was = e->prefetching;

				e->prefetching = x->prefetch;
				kvt_promote_hbm(e, id, false);
				e->prefetching = was;
			}
		} else {
			kvt_copy_fail(e, id, KVT_TIER_HOST);
			/* bytes on NVMe that do not verify are worthless: drop them, and if no
			 * other copy exists the block is lost (the caller sees a miss) */
			if (res < 0 && res != -ECANCELED &&
			    kvt_copy_state(b, KVT_TIER_NVME) == KVT_COPY_PRESENT)
				kvt_copy_drop(e, id, KVT_TIER_NVME);
			if (res < 0 && res != -ECANCELED && b->seq == KVT_EXT_SEQ)
				kvt_ext_read_failed(e, id, res);
			kvt_block_check_lost(e, id);
		}
		break;
	}
	if (x->kind == KVT_X_H2N || x->kind == KVT_X_H2D)
		xfer_release_src(e, x);
	xfer_put(e, x);
	kvt_block_try_free(e, id);
}

/* ---- device groups */

/* Copy descriptors of layer group @lg (all layers when @lg is UINT32_MAX: a demotion's, whose
 * transfers may copy a part, xfer_d2h_pieces) of every transfer. Returns how many. */
static uint32_t
xstream_fill(struct kvt_engine *e, struct kvt_xfer *list, uint32_t lg, struct kvt_copy *v)
{
	uint64_t off = 0, len = e->block_bytes;
	struct kvt_xfer *x;
	uint32_t i = 0, l0, l1;

	if (lg == UINT32_MAX) {
		for (x = list; x; x = x->next)
			i += xfer_d2h_pieces(e, x, v + i, NULL);
		return i;
	}
	{
		l0 = lg * e->layers_per_group;
		l1 = l0 + e->layers_per_group;
		if (l1 > e->layout.n_layers)
			l1 = e->layout.n_layers;
		off = (uint64_t)l0 * e->layer_block_bytes;
		len = (uint64_t)(l1 - l0) * e->layer_block_bytes;
	}
	for (x = list; x; x = x->next, i++) {
		v[i].dst = (char *)kvt_slot_addr(e, xfer_dst_tier[x->kind], x->dst_slot) + off;
		v[i].src = (char *)kvt_slot_addr(e, xfer_src_tier[x->kind], x->src_slot) + off;
		v[i].len = len;
	}
	return i;
}

/*
 * Queue the group's copies and events: one batched copy per layer group (H2D, in layer order)
 * or one for whole blocks (D2H), each followed by an event record. Returns 0, or the failure
 * with *queued telling whether some copies may have been queued, and the events recorded so far
 * given back to the pool.
 */
static int
xstream_submit(struct kvt_engine *e, struct kvt_xstream *xs, struct kvt_xgroup *g,
	       struct kvt_copy *v, uint32_t n, bool *queued)
{
	bool layered = xs == &e->h2d;
	uint32_t i;
	int rc = 0;

	for (i = 0; i < g->n_ev && !rc; i++) {
		n = xstream_fill(e, g->xfers, layered ? i : UINT32_MAX, v);
		rc = e->dev->ops->copy_batch_async(e->dev, xs->s, v, n);
		/* a batch that failed part-way may have queued some copies (a per-copy
		 * fallback): they must finish before their slots can be freed */
		*queued = true;
		if (rc)
			break;
		rc = xfer_event_get(e, &g->ev[i]);
		if (rc == 0) {
			rc = e->dev->ops->event_record(e->dev, g->ev[i], xs->s);
			if (rc) {
				xfer_event_put(e, g->ev[i]);
				g->ev[i] = NULL;
			}
		}
	}
	if (rc)
		for (i = 0; i < g->n_ev; i++)
			if (g->ev[i])
				xfer_event_put(e, g->ev[i]);
	return rc;
}

static int
xstream_flush(struct kvt_engine *e, struct kvt_xstream *xs)
{
	struct kvt_copy stackv[64], *v = stackv;
	struct kvt_xgroup *g;
	struct kvt_xfer *x, *list = xs->pending;
	uint32_t n = xs->n_pending, n_ev = xs == &e->h2d ? e->n_lgroups : 1;
	bool queued = false;
	int rc;

	if (!n)
		return 0;
	xs->pending = NULL;
	xs->n_pending = 0;
	if (xs == &e->d2h) /* descriptors: a partial demotion has one per layer and K or V */
		for (n = 0, x = list; x; x = x->next)
			n += xfer_d2h_pieces(e, x, NULL, NULL);
	if (n > 64 && !(v = kvt_malloc(n * sizeof *v))) {
		rc = kvt_err(-ENOMEM, "copy descriptors");
		goto fail;
	}
	g = kvt_calloc(1, sizeof *g + n_ev * sizeof g->ev[0]);
	if (!g) {
		rc = kvt_err(-ENOMEM, "transfer group");
		goto fail;
	}
	g->n_ev = n_ev;
	g->xfers = list;
	rc = xstream_submit(e, xs, g, v, n, &queued);
	if (rc) {
		kvt_free(g);
		rc = xfer_dev_err(e, rc, "submitting a batched copy");
		goto fail;
	}
	if (v != stackv)
		kvt_free(v);
	g->seqno = ++xs->submitted;
	for (x = list; x; x = x->next)
		if (x->kind == KVT_X_H2D)
			e->hbm_h2d_seqno[x->dst_slot] = g->seqno;
	if (xs->tail)
		xs->tail->next = g;
	else
		xs->head = g;
	xs->tail = g;
	return 0;
fail:
	if (v != stackv)
		kvt_free(v);
	if (queued && e->dev->ops->stream_sync(e->dev, xs->s) != 0) {
		/* copies may still be running and nobody can tell when they end: keep their
		 * slots out of use for good rather than hand them out (DESIGN.md invariant 1) */
		for (x = list; x; x = x->next)
			kvt_slot_quarantine(e, xfer_dst_tier[x->kind], x->dst_slot, x->block);
	}
	while (list) {
		x = list;
		list = x->next;
		xfer_complete(e, x, rc, 0);
	}
	return rc;
}

/* The NVMe IO collected so far is submitted when the lock is released (kvt_unlock), or by the
 * next reap, whichever comes first: io_uring_submit is never run under the engine lock. */
static int
xfer_nvme_flush(struct kvt_engine *e)
{
	if (e->nvme && e->nvme_inflight)
		e->nvme_defer = true;
	return 0;
}

/* Submit collected demotions (device-to-host copies, NVMe IO), leaving host-to-device copies
 * collected: making room for one block of a batch must not cut the batch's promotions into
 * one copy group per block. */
int
kvt_xfer_flush_down(struct kvt_engine *e)
{
	int rc1 = xstream_flush(e, &e->d2h);
	int rc3 = xfer_nvme_flush(e);

	return rc1 ? rc1 : rc3;
}

int
kvt_xfer_flush(struct kvt_engine *e)
{
	int rc1 = xstream_flush(e, &e->d2h);
	int rc2 = xstream_flush(e, &e->h2d);
	int rc3 = xfer_nvme_flush(e);

	return rc1 ? rc1 : rc2 ? rc2 : rc3;
}

/* A retired group's events go back to the pool and the group is freed, unless a thread still
 * sleeps on one of its events (the last one to come back frees it: xstream_sleep). */
static void
xgroup_release(struct kvt_engine *e, struct kvt_xgroup *g)
{
	if (g->waiters) {
		g->retired = true;
		return;
	}
	for (uint32_t i = 0; i < g->n_ev; i++)
		xfer_event_put(e, g->ev[i]);
	kvt_free(g);
}

static void
xstream_retire_head(struct kvt_engine *e, struct kvt_xstream *xs)
{
	struct kvt_xgroup *g = xs->head;
	struct kvt_xfer *x;
	uint64_t now = kvt_now_ns(); /* one clock read for the whole group */

	xs->head = g->next;
	if (!xs->head)
		xs->tail = NULL;
	g->next = NULL;
	xs->retired = g->seqno;
	while ((x = g->xfers)) {
		g->xfers = x->next;
		xfer_complete(e, x, 0, now);
	}
	xgroup_release(e, g);
}

static int
xstream_poll(struct kvt_engine *e, struct kvt_xstream *xs, uint32_t max, int *done)
{
	int rc;

	while (xs->head && (!max || (uint32_t)*done < max)) {
		rc = e->dev->ops->event_query(e->dev, xs->head->ev[xs->head->n_ev - 1]);
		if (rc == -EAGAIN)
			break;
		if (rc)
			return xfer_dev_err(e, rc, "querying a copy event");
		xstream_retire_head(e, xs);
		(*done)++;
	}
	return 0;
}

/* A write landed (the tier's slot table now says how it was stored: the read asks for that
 * much, the store's record carries it): count the codec's effect. */
static void
xfer_note_write(struct kvt_engine *e, struct kvt_xfer *x, const struct kvt_nvme_cqe *c)
{
	struct kvt_block *b = kvt_blk(e, x->block);

	e->st.codec_raw_bytes += e->block_bytes;
	e->st.codec_stored_bytes += c->stored;
	e->st.codec_blocks += c->codec != KVT_CODEC_NONE;
	if (kvt_copy_stale(b, KVT_TIER_NVME)) /* appended to meanwhile: dropped on completion */
		return;
	/* the write may be the last one a parked session waits for: its creator's (b->seq), or
	 * any other sequence sharing the block, whether its creator is still open or not; the
	 * check is one scan of the sequences per poll */
	if (e->store)
		e->pub_check = true;
}

/*
 * A zero-copy read into @x's HOST slot timed out while the kernel may still write the slot: it
 * stays out of use (quarantined) until the late completion comes (xfer_nvme_late), so that no
 * other block's copy placed there can be overwritten by the abandoned read.
 */
static void
xfer_host_late(struct kvt_engine *e, struct kvt_xfer *x)
{
	struct kvt_block *b = kvt_blk(e, x->block);

	if (kvt_copy_state(b, KVT_TIER_HOST) != KVT_COPY_INFLIGHT ||
	    b->slot[KVT_TIER_HOST] != x->dst_slot)
		return;
	kvt_slot_quarantine(e, KVT_TIER_HOST, x->dst_slot, x->block);
	e->host_late++;
}

/* @slot of @tier, quarantined by a timed-out IO whose late completion came (*@late of them
 * outstanding): back to the allocator. Anything else (a slot out of range, not quarantined) is
 * left alone. */
static void
xfer_unquarantine(struct kvt_engine *e, int tier, uint32_t slot, uint32_t *late)
{
	if (slot >= e->slots[tier].n_slots || !*late ||
	    kvt_owner(e, tier, slot) != KVT_SLOT_QUARANTINED)
		return;
	kvt_owner_set(e, tier, slot, KVT_NIL);
	kvt_slots_free(&e->slots[tier], slot);
	e->quarantined[tier]--;
	(*late)--;
}

/* Slots quarantined by timed-out writes (NVMe) and zero-copy reads (HOST; the tier names the
 * slot's data address) whose late completion came: back to the allocator. */
static void
xfer_nvme_late(struct kvt_engine *e)
{
	void *bufs[32];
	uint32_t sl[32], k;

	while ((k = kvt_nvme_late_writes(e->nvme, sl, 32)) > 0)
		for (uint32_t i = 0; i < k; i++)
			xfer_unquarantine(e, KVT_TIER_NVME, sl[i], &e->nvme_late);
	while ((k = kvt_nvme_late_reads(e->nvme, bufs, 32)) > 0)
		for (uint32_t i = 0; i < k; i++)
			xfer_unquarantine(e, KVT_TIER_HOST,
					  (uint32_t)(((char *)bufs[i] - (char *)e->host_base -
						      e->host_data_off) / e->host_stride),
					  &e->host_late);
}

/* Process @n reaped NVMe completions (lock held). */
static void
xfer_nvme_done(struct kvt_engine *e, const struct kvt_nvme_cqe *cqe, int n, int *done)
{
	uint64_t now = n ? kvt_now_ns() : 0; /* one clock read per reaped batch */

	for (int i = 0; i < n; i++) {
		struct kvt_xfer *x = (struct kvt_xfer *)(uintptr_t)cqe[i].user_data;

		e->nvme_inflight--;
		if (cqe[i].is_write && cqe[i].res == 0)
			xfer_note_write(e, x, &cqe[i]);
		if (!cqe[i].is_write && cqe[i].buf_late)
			xfer_host_late(e, x);
		xfer_complete(e, x, cqe[i].res, now);
		(*done)++;
	}
	if (n && e->n_backlog) /* room in the queue again: the parks' writes that waited */
		kvt_xfer_backlog_kick(e);
}

/*
 * Reap up to @max (0 = all there are) NVMe completions and process them. @wait (only where no
 * other thread can run: kvt_xfer_fini) blocks for one with the lock held. Nothing while another
 * thread reaps the CQ with the lock released (it processes what it gets).
 */
static int
xfer_nvme_poll(struct kvt_engine *e, uint32_t max, bool wait, int *done)
{
	struct kvt_nvme_cqe cqe[32];
	uint32_t want;
	int n;

	if (!e->nvme || e->nvme_reaping || (!e->nvme_inflight && !e->nvme_late && !e->host_late))
		return 0;
	if (!e->nvme_inflight)
		wait = false; /* only late completions of timed-out IO to pick up */
	if (!wait && atomic_load(&e->nvme_submitting))
		return 0; /* another thread is in io_uring_submit: not worth waiting for */
	do {
		want = 32;
		if (max && max - (uint32_t)*done < want)
			want = max - (uint32_t)*done;
		n = wait ? kvt_nvme_reap(e->nvme, cqe, want, true) :
			   kvt_nvme_reap_try(e->nvme, cqe, want);
		if (n == -EBUSY && !wait)
			return 0; /* the tier is busy submitting: the next poll reaps */
		if (n < 0)
			return kvt_err(n, "reaping NVMe completions");
		wait = false;
		xfer_nvme_done(e, cqe, n, done);
	} while (n == (int)want && (!max || (uint32_t)*done < max));
	if (e->nvme_late || e->host_late)
		xfer_nvme_late(e);
	return 0;
}

/* Another thread's sleep processed completions: wake those waiting for one (lock held). */
static void
xfer_wake(struct kvt_engine *e)
{
	e->xfer_gen++;
	pthread_cond_broadcast(&e->xfer_cv);
}

/* Everything in flight is slept on by other threads: wait (lock released by the condition
 * variable) until one of them has processed completions. */
static int
xfer_await_other(struct kvt_engine *e)
{
	uint64_t gen = e->xfer_gen;

	if (e->nvme_defer) {
		/* IO queued under the lock goes to the kernel first (kvt_unlock submits it): the
		 * reaper may sleep until an IO timeout, and this caller's read may be what it
		 * waits for */
		kvt_unlock(e);
		kvt_lock(e);
	}
	while (gen == e->xfer_gen)
		pthread_cond_wait(&e->xfer_cv, &e->lock);
	return 1;
}

/* Sleep until event @i of group @g of @xs has completed, the lock released (called and returns
 * with it held; the group is held by a reference meanwhile, so its event stays valid). */
static int
xstream_sleep(struct kvt_engine *e, struct kvt_xstream *xs, struct kvt_xgroup *g, uint32_t i)
{
	struct kvt_event *ev = g->ev[i];
	int rc;

	g->waiters++;
	xs->syncing = true;
	kvt_unlock(e);
	rc = e->dev->ops->event_sync(e->dev, ev);
	kvt_lock(e);
	xs->syncing = false;
	if (--g->waiters == 0 && g->retired)
		xgroup_release(e, g);
	return rc;
}

/* Sleep in the NVMe reap until a completion comes (or an IO times out), the lock released and
 * the CQ this thread's alone meanwhile; then process what came. */
static int
xfer_nvme_sleep(struct kvt_engine *e, int *done)
{
	struct kvt_nvme_cqe cqe[32];
	int n;

	e->nvme_reaping = true;
	kvt_unlock(e);
	n = kvt_nvme_reap(e->nvme, cqe, 32, true);
	kvt_lock(e);
	e->nvme_reaping = false;
	if (n < 0)
		return kvt_err(n, "reaping NVMe completions");
	xfer_nvme_done(e, cqe, n, done);
	return 0;
}

int
kvt_xfer_poll(struct kvt_engine *e, uint32_t max)
{
	int done = 0, rc;

	rc = xstream_poll(e, &e->d2h, max, &done);
	if (!rc)
		rc = xstream_poll(e, &e->h2d, max, &done);
	if (!rc)
		rc = xfer_nvme_poll(e, max, false, &done);
	if (e->pub_check)
		kvt_persist_publish(e);
	return rc ? rc : done;
}

int
kvt_xfer_wait_any(struct kvt_engine *e)
{
	int rc, done = 0;

	rc = kvt_xfer_flush(e);
	if (rc)
		return rc;
	if (e->d2h.head && !e->d2h.syncing) {
		rc = xstream_sleep(e, &e->d2h, e->d2h.head, 0);
	} else if (e->nvme && e->nvme_inflight && !e->nvme_reaping) {
		rc = xfer_nvme_sleep(e, &done);
		if (rc) {
			xfer_wake(e);
			return rc;
		}
	} else if (e->h2d.head && !e->h2d.syncing) {
		rc = xstream_sleep(e, &e->h2d, e->h2d.head, e->h2d.head->n_ev - 1);
	} else if (e->d2h.head || e->h2d.head || e->nvme_inflight) {
		return xfer_await_other(e);
	} else {
		return 0;
	}
	if (rc) {
		xfer_wake(e);
		return xfer_dev_err(e, rc, "waiting for a transfer");
	}
	rc = kvt_xfer_poll(e, 0);
	xfer_wake(e);
	return rc < 0 ? rc : done + rc + 1;
}

/**
 * kvt_xfer_wait_block() - block until the transfers in flight on block @id have progressed:
 * for a host-to-device copy into it, until its own copy group has landed (not whatever else
 * is oldest), otherwise until any completion. Completions are processed. Returns >= 0 or a
 * negative code.
 */
int
kvt_xfer_wait_block(struct kvt_engine *e, uint32_t id)
{
	struct kvt_block *b = kvt_blk(e, id);
	struct kvt_xgroup *g;
	uint64_t want;
	int rc;

	if (kvt_copy_state(b, KVT_TIER_HBM) != KVT_COPY_INFLIGHT)
		return kvt_xfer_wait_any(e);
	rc = kvt_xfer_flush(e);
	if (rc)
		return rc;
	want = e->hbm_h2d_seqno[b->slot[KVT_TIER_HBM]];
	for (g = e->h2d.head; g && g->seqno < want; g = g->next)
		;
	if (g && g->seqno == want) {
		if (e->h2d.syncing)
			return xfer_await_other(e);
		rc = xstream_sleep(e, &e->h2d, g, g->n_ev - 1);
		if (rc) {
			xfer_wake(e);
			return xfer_dev_err(e, rc, "waiting for a host-to-device copy");
		}
	}
	rc = kvt_xfer_poll(e, 0);
	xfer_wake(e);
	return rc;
}

struct kvt_event *
kvt_xfer_h2d_event(struct kvt_engine *e, uint64_t seqno, uint32_t layer)
{
	struct kvt_xgroup *g;

	for (g = e->h2d.head; g; g = g->next)
		if (g->seqno >= seqno)
			return g->ev[layer / e->layers_per_group];
	return NULL;
}

int
kvt_xfer_sleep_h2d(struct kvt_engine *e, uint64_t seqno, uint32_t layer)
{
	struct kvt_xgroup *g;
	struct kvt_event *ev;
	int rc;

	for (g = e->h2d.head; g && g->seqno < seqno; g = g->next)
		;
	if (!g)
		return 0; /* retired: landed */
	ev = g->ev[layer / e->layers_per_group];
	g->waiters++; /* neither the group nor its events go while the lock is released */
	kvt_unlock(e);
	rc = e->dev->ops->event_sync(e->dev, ev);
	kvt_lock(e);
	if (--g->waiters == 0 && g->retired)
		xgroup_release(e, g);
	return rc;
}

uint64_t
kvt_xfer_inflight(const struct kvt_engine *e)
{
	return e->st.transfers_in_flight;
}

int
kvt_xfer_init(struct kvt_engine *e)
{
	uint32_t L = e->layout.n_layers;
	int rc;

	/* one layer per group up to XFER_MAX_LGROUPS layers; beyond, neighbours share a group
	 * (an event per layer costs a record per layer per flush) */
	e->layers_per_group = (L + XFER_MAX_LGROUPS - 1) / XFER_MAX_LGROUPS;
	e->n_lgroups = (L + e->layers_per_group - 1) / e->layers_per_group;
	rc = e->dev->ops->stream_create(e->dev, &e->d2h.s);
	if (!rc)
		rc = e->dev->ops->stream_create(e->dev, &e->h2d.s);
	if (!rc)
		rc = e->dev->ops->event_create(e->dev, &e->compute_ev);
	if (rc)
		return xfer_dev_err(e, rc, "creating copy streams");
	return 0;
}

static void
xstream_forget(struct kvt_engine *e, struct kvt_xstream *xs)
{
	struct kvt_xgroup *g;
	struct kvt_xfer *x;

	while ((g = xs->head)) {
		xs->head = g->next;
		while ((x = g->xfers)) {
			g->xfers = x->next;
			kvt_free(x);
		}
		for (uint32_t i = 0; i < g->n_ev; i++)
			e->dev->ops->event_destroy(e->dev, g->ev[i]);
		kvt_free(g);
	}
	xs->tail = NULL;
	while ((x = xs->pending)) {
		xs->pending = x->next;
		kvt_free(x);
	}
	xs->n_pending = 0;
}

void
kvt_xfer_fini(struct kvt_engine *e)
{
	struct kvt_xfer *x;

	/* wait for everything in flight; on an error nothing more can be learnt about those
	 * transfers (a sticky device error): stop, and the streams' destruction syncs them */
	while (kvt_xfer_inflight(e) > 0 || e->d2h.n_pending || e->h2d.n_pending)
		if (kvt_xfer_wait_any(e) <= 0)
			break;
	/* NVMe IO does not depend on the device: reap it all, so no record is left behind */
	while (e->nvme_inflight) {
		int done = 0;

		if (xfer_nvme_poll(e, 0, true, &done) < 0)
			break;
	}
	if (e->d2h.s)
		e->dev->ops->stream_destroy(e->dev, e->d2h.s);
	if (e->h2d.s)
		e->dev->ops->stream_destroy(e->dev, e->h2d.s);
	/* groups left after an error: their streams are gone, so nothing runs any more */
	xstream_forget(e, &e->d2h);
	xstream_forget(e, &e->h2d);
	if (e->compute_ev)
		e->dev->ops->event_destroy(e->dev, e->compute_ev);
	while (e->n_ev_pool)
		e->dev->ops->event_destroy(e->dev, e->ev_pool[--e->n_ev_pool]);
	kvt_free(e->ev_pool);
	while ((x = e->xfer_free)) {
		e->xfer_free = x->next;
		kvt_free(x);
	}
}
