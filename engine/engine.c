/* SPDX-License-Identifier: MIT */
/*
 * engine/engine.c - engine lifecycle, options, geometry, progress, streams and statistics.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine_impl.h"

#define ENGINE_MAX_DIM 4096u
#define ENGINE_MAX_TPB 65536u
#define ENGINE_MAX_TIER_BYTES (1ull << 50)   /* 1 PiB */
#define ENGINE_MAX_SLOTS (1u << 30)

const struct kvt_nvme_fault_hooks *kvt_test_nvme_hooks;
uint64_t kvt_test_host_room_min_block = KVT_HOST_ROOM_MIN_BLOCK;

void
kvt_engine_log(struct kvt_engine *e, int level, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (e->opts.log)
		e->opts.log(e->opts.log_arg, level, msg);
	else
		fprintf(stderr, "kvtier: %s: %s\n", level == KVT_LOG_ERROR ? "error" :
			level == KVT_LOG_WARN ? "warning" : "info", msg);
}

size_t
kvt_dtype_size(enum kvt_dtype t)
{
	switch (t) {
	case KVT_DTYPE_F32: return 4;
	case KVT_DTYPE_F16: return 2;
	case KVT_DTYPE_BF16: return 2;
	case KVT_DTYPE_FP8_E4M3: return 1;
	case KVT_DTYPE_INT8: return 1;
	}
	return 0;
}

void
kvt_engine_opts_init(struct kvt_engine_opts *o, size_t size)
{
	struct kvt_engine_opts d;

	if (!o)
		return;
	memset(&d, 0, sizeof d);
	d.opts_size = size;
	d.layout.dtype = KVT_DTYPE_F16;
	d.layout.tokens_per_block = 16;
	d.device = KVT_DEVICE_EMULATED;
	d.high_watermark = 0.95f;
	d.low_watermark = 0.85f;
	d.nvme_queue_depth = 64;
	d.nvme_workers = 2;
	d.nvme_codec_min_saving = 0.1f;
	d.emu_seed = 1;
	d.evict_policy = KVT_EVICT_DEFAULT;
	d.idle_timeout_ms = 0;
	d.idle_target = KVT_TIER_HOST;
	d.remote_port = 6379;
	d.remote_connect_timeout_ms = 1000;
	d.remote_op_timeout_ms = 2000;
	d.group_ref_tokens = 32768;
	d.write_budget_period_ms = 1000;
	memcpy(o, &d, size < sizeof d ? size : sizeof d);
}

/* @v_dim: V elements per head (head_dim for the single layout; 0 = K only, LATENT) */
static int
engine_check_layout(const struct kvt_layout *l, uint32_t v_dim, uint64_t *block_bytes)
{
	size_t es = kvt_dtype_size(l->dtype);
	uint64_t bb = 0;

	if (!es)
		return kvt_err(-EINVAL, "unknown element type %d", (int)l->dtype);
	if (l->n_layers < 1 || l->n_layers > ENGINE_MAX_DIM)
		return kvt_err(-EINVAL, "n_layers %u out of range 1..%u", l->n_layers,
			       ENGINE_MAX_DIM);
	if (l->n_kv_heads < 1 || l->n_kv_heads > ENGINE_MAX_DIM)
		return kvt_err(-EINVAL, "n_kv_heads %u out of range 1..%u", l->n_kv_heads,
			       ENGINE_MAX_DIM);
	if (l->head_dim < 1 || l->head_dim > ENGINE_MAX_DIM)
		return kvt_err(-EINVAL, "head_dim %u out of range 1..%u", l->head_dim,
			       ENGINE_MAX_DIM);
	if (l->tokens_per_block < 1 || l->tokens_per_block > ENGINE_MAX_TPB)
		return kvt_err(-EINVAL, "tokens_per_block %u out of range 1..%u",
			       l->tokens_per_block, ENGINE_MAX_TPB);
	/* each factor is <= 2^16, so the product of four fits in 64 bits before the check */
	if (v_dim > ENGINE_MAX_DIM)
		return kvt_err(-EINVAL, "v_head_dim %u out of range 0..%u", v_dim, ENGINE_MAX_DIM);
	bb = (uint64_t)l->tokens_per_block * l->n_kv_heads * ((uint64_t)l->head_dim + v_dim) * es;
	if (bb > KVT_ENGINE_MAX_BLOCK_BYTES || bb * l->n_layers > KVT_ENGINE_MAX_BLOCK_BYTES)
		return kvt_err(-EINVAL, "a block would be %llu bytes (limit %llu): lower "
			       "tokens_per_block", (unsigned long long)(bb * l->n_layers),
			       (unsigned long long)KVT_ENGINE_MAX_BLOCK_BYTES);
	*block_bytes = bb * l->n_layers;
	return 0;
}

static int
engine_check_opts(const struct kvt_engine_opts *o, uint64_t bb)
{
	if (o->hbm_bytes < bb || o->hbm_bytes > ENGINE_MAX_TIER_BYTES)
		return kvt_err(-EINVAL, "HBM capacity %llu bytes must hold at least one block "
			       "(%llu bytes) and be at most %llu", (unsigned long long)o->hbm_bytes,
			       (unsigned long long)bb, (unsigned long long)ENGINE_MAX_TIER_BYTES);
	if (o->host_bytes && (o->host_bytes < bb || o->host_bytes > ENGINE_MAX_TIER_BYTES))
		return kvt_err(-EINVAL, "HOST capacity %llu bytes must be 0 or hold at least one "
			       "block (%llu bytes) and be at most %llu",
			       (unsigned long long)o->host_bytes, (unsigned long long)bb,
			       (unsigned long long)ENGINE_MAX_TIER_BYTES);
	if (o->nvme_dir && (o->nvme_bytes == 0 || o->nvme_bytes > ENGINE_MAX_TIER_BYTES))
		return kvt_err(-EINVAL, "NVME capacity %llu bytes is out of range",
			       (unsigned long long)o->nvme_bytes);
	if (o->nvme_dir && !o->host_bytes)
		return kvt_err(-EINVAL, "an NVME tier needs a HOST tier to stage blocks through");
	if (o->hbm_bytes / bb > ENGINE_MAX_SLOTS || o->host_bytes / bb > ENGINE_MAX_SLOTS)
		return kvt_err(-EINVAL, "more than %u slots in one tier", ENGINE_MAX_SLOTS);
	if (!(o->low_watermark > 0.0f && o->low_watermark <= o->high_watermark &&
	      o->high_watermark <= 1.0f))
		return kvt_err(-EINVAL, "watermarks must satisfy 0 < low (%g) <= high (%g) <= 1",
			       (double)o->low_watermark, (double)o->high_watermark);
	if (o->opts_size > offsetof(struct kvt_engine_opts, nvme_codec) &&
	    (o->nvme_codec < KVT_CODEC_NONE || o->nvme_codec > KVT_CODEC_CSHUF_LZ4))
		return kvt_err(-EINVAL, "nvme_codec %d unknown", (int)o->nvme_codec);
	if (o->opts_size > offsetof(struct kvt_engine_opts, nvme_codec_min_saving) &&
	    !(o->nvme_codec_min_saving >= 0.0f && o->nvme_codec_min_saving < 1.0f))
		return kvt_err(-EINVAL, "nvme_codec_min_saving %g must be in [0, 1)",
			       (double)o->nvme_codec_min_saving);
	if (o->opts_size > offsetof(struct kvt_engine_opts, nvme_persist) &&
	    (o->nvme_persist < 0 || o->nvme_persist > 1))
		return kvt_err(-EINVAL, "nvme_persist %d must be 0 or 1", o->nvme_persist);
	if (o->opts_size > offsetof(struct kvt_engine_opts, evict_policy) &&
	    o->evict_policy > KVT_EVICT_ARC)
		return kvt_err(-EINVAL, "unknown eviction policy %u", o->evict_policy);
	if (o->opts_size > offsetof(struct kvt_engine_opts, idle_target) &&
	    o->idle_target != KVT_TIER_HOST && o->idle_target != KVT_TIER_NVME)
		return kvt_err(-EINVAL, "idle_target %u: must be KVT_TIER_HOST or KVT_TIER_NVME",
			       o->idle_target);
	if (o->opts_size > offsetof(struct kvt_engine_opts, nvme_workers) &&
	    o->nvme_workers > 16)
		return kvt_err(-EINVAL, "nvme_workers %u out of range 0..16", o->nvme_workers);
	if (o->opts_size > offsetof(struct kvt_engine_opts, remote_write) &&
	    o->remote_write > KVT_REMOTE_WRITE_NONE)
		return kvt_err(-EINVAL, "remote_write %u: must be KVT_REMOTE_WRITE_SEEN_TWICE, "
			       "_ALL or _NONE", o->remote_write);
	if (o->opts_size > offsetof(struct kvt_engine_opts, remote_no_fetch) &&
	    o->remote_no_fetch > 1)
		return kvt_err(-EINVAL, "remote_no_fetch %u must be 0 or 1", o->remote_no_fetch);
	if (o->opts_size > offsetof(struct kvt_engine_opts, emu_lazy) && o->emu_lazy > 1)
		return kvt_err(-EINVAL, "emu_lazy %u must be 0 or 1", o->emu_lazy);
	if (o->device != KVT_DEVICE_EMULATED && o->device != KVT_DEVICE_CUDA)
		return kvt_err(-EINVAL, "unknown device kind %d", (int)o->device);
	return 0;
}

/* The policy of @tier's instance under opts.evict_policy @p: the chosen one, except that the
 * NVMe tier (the last one: its evictions drop the copy, so ARC's ghosts are of little use there)
 * runs GCLOCK, 2 bits per slot, under LRU and ARC; PRIO stays PRIO there (priorities must
 * survive parking). */
static const struct kvt_evict_ops *
engine_policy(uint32_t p, int tier)
{
	if (p == KVT_EVICT_PRIO)
		return &kvt_evict_prio_ops;
	if (tier == KVT_TIER_NVME)
		return &kvt_evict_clock_ops;
	return p == KVT_EVICT_LRU ? &kvt_evict_lru_ops
				  : &kvt_evict_arc_ops; /* KVT_EVICT_DEFAULT, KVT_EVICT_ARC */
}

/* Slot keys of the eviction policies: a block's copy in tier @arg sits in slot b->slot[arg]. */
static uint32_t
engine_evict_key(const void *ctx, uint32_t arg, uint32_t id)
{
	const struct kvt_engine *e = ctx;

	return id < e->cap_blocks ? kvt_blk(e, id)->slot[arg] : KVT_NIL;
}

static uint32_t
engine_evict_id(const void *ctx, uint32_t arg, uint32_t key)
{
	return kvt_owner(ctx, (int)arg, key);
}

static int
engine_tier_init(struct kvt_engine *e, int tier, uint32_t n)
{
	int rc;

	if (kvt_slots_init(&e->slots[tier], n))
		return kvt_err(-ENOMEM, "slot allocator of %u slots", n);
	if (tier == KVT_TIER_HBM) {
		e->hbm_h2d_seqno = kvt_calloc(n ? n : 1, sizeof *e->hbm_h2d_seqno);
		if (!e->hbm_h2d_seqno)
			return kvt_err(-ENOMEM, "h2d group map of %u HBM slots", n);
	}
	rc = kvt_evict_init(&e->evict[tier], engine_policy(e->opts.evict_policy, tier), 256,
			    n);
	if (rc == 0) {
		e->evkeys[tier] = (struct kvt_evict_keys){ engine_evict_key, engine_evict_id, e,
							   (uint32_t)tier };
		rc = kvt_evict_use_slots(&e->evict[tier], &e->evkeys[tier]);
	}
	return rc ? kvt_err(rc, "eviction list") : 0;
}

static int
engine_open_device(struct kvt_engine *e)
{
	const struct kvt_engine_opts *o = &e->opts;
	struct kvt_emu_opts eo = {
		.max_delay_us = o->emu_max_delay_us,
		.seed = o->emu_seed,
		.copy_bytes_per_s = o->emu_copy_bytes_per_s,
		.lazy = o->emu_lazy != 0,
	};
	uint64_t hbm = (uint64_t)e->slots[KVT_TIER_HBM].n_slots * e->block_bytes;
	int rc;

	if (e->dev)
		rc = 0; /* borrowed: the grouped engine's pools share one device */
	else if (o->device == KVT_DEVICE_CUDA)
		rc = kvt_device_cuda_create(o->cuda_device, &e->dev);
	else
		rc = kvt_device_emu_create(&eo, &e->dev);
	if (rc)
		return rc == KVT_ENOTSUP || rc == KVT_EDEVICE ? rc :
			kvt_err(rc, "creating the %s device", o->device ? "CUDA" : "emulated");
	rc = e->dev->ops->mem_alloc(e->dev, hbm, &e->hbm_base);
	if (rc)
		return kvt_err(rc, "allocating %llu bytes of HBM%s%s", (unsigned long long)hbm,
			       e->dev->errmsg[0] ? ": " : "", e->dev->errmsg);
	if (e->slots[KVT_TIER_HOST].n_slots) {
		/* with an NVME tier, HOST slots start on 4 KiB boundaries: their blocks move by
		 * O_DIRECT straight to and from the disk (zero-copy, tiers/tier_nvme.h); large
		 * blocks get a 4 KiB header room in front (one IO per NVMe write) */
		e->host_data_off = e->nvme_dir && e->block_bytes >= kvt_test_host_room_min_block
					   ? KVT_FMT_HDR_PAGE : 0;
		e->host_stride = e->nvme_dir ? e->host_data_off +
						       ((e->block_bytes + 4095) & ~(uint64_t)4095)
					     : e->block_bytes;
		e->host_len = (size_t)e->slots[KVT_TIER_HOST].n_slots * e->host_stride;
		rc = e->dev->ops->host_alloc(e->dev, e->host_len, &e->host_base, &e->host_pinned);
		if (rc)
			return kvt_err(rc, "allocating %zu bytes of HOST memory", e->host_len);
		if (!e->host_pinned)
			kvt_engine_log(e, KVT_LOG_WARN, "HOST tier (%zu bytes) is not pinned: mlock "
				       "was refused (raise RLIMIT_MEMLOCK, ulimit -l); copies from it "
				       "will be slower", e->host_len);
	}
	return kvt_xfer_init(e);
}

static int
engine_open_nvme(struct kvt_engine *e)
{
	struct kvt_nvme_opts no = {
		.dir = e->nvme_dir,
		.capacity_bytes = e->opts.nvme_bytes,
		.block_bytes = e->block_bytes,
		.queue_depth = e->opts.nvme_queue_depth ? e->opts.nvme_queue_depth : 64,
		.workers = e->opts.nvme_workers,
		.hooks = kvt_test_nvme_hooks,
		.layout = e->layout,
		.codec = e->opts.nvme_codec,
		.min_saving = e->opts.nvme_codec_min_saving,
		.persist = e->opts.nvme_persist == 1,
		.buffered_fallback = e->opts.nvme_buffered_fallback != 0,
		.host_base = e->host_base,
		.host_len = e->host_len,
		.host_stride = e->host_stride,
		.host_data_off = e->host_data_off,
		.groups_fp = e->groups_fp,
		.group = e->group_index,
	};
	const char *stale;
	char msg[256] = "";
	int rc;

	rc = kvt_nvme_open(&no, &e->nvme, msg, sizeof msg);
	if (rc)
		return rc; /* kvt_nvme_open's message names the directory and the cause */
	if (kvt_nvme_stale_removed(e->nvme, &stale))
		kvt_engine_log(e, KVT_LOG_WARN, "removed %u slot files of dead processes from %s "
			       "(%s, ...), left by a crash", kvt_nvme_stale_removed(e->nvme, NULL),
			       e->nvme_dir, stale);
	if (kvt_nvme_buffered(e->nvme))
		kvt_engine_log(e, KVT_LOG_WARN, "the filesystem at %s refuses O_DIRECT: the NVME "
			       "tier uses buffered IO (page cache) as nvme_buffered_fallback asks",
			       e->nvme_dir);
	if (!kvt_nvme_zero_copy(e->nvme))
		kvt_engine_log(e, KVT_LOG_WARN, "NVME tier: zero-copy IO is off (%s); blocks go "
			       "through staging buffers, one memcpy each way",
			       kvt_nvme_zc_reason(e->nvme));
	rc = engine_tier_init(e, KVT_TIER_NVME, kvt_nvme_n_slots(e->nvme));
	if (rc == 0 && kvt_nvme_persistent(e->nvme))
		rc = kvt_persist_open(e);
	return rc;
}

int
kvt_engine_create(const struct kvt_engine_opts *o, struct kvt_engine **out)
{
	if (!out)
		return kvt_err(-EINVAL, "kvt_engine_create: out is NULL");
	*out = NULL;
	if (!o)
		return kvt_err(-EINVAL, "kvt_engine_create: options are NULL");
	if (o->opts_size < offsetof(struct kvt_engine_opts, log) || o->opts_size > 65536)
		return kvt_err(-EINVAL, "kvt_engine_opts.opts_size %zu: call kvt_engine_opts_init",
			       o->opts_size);
	if (o->opts_size > offsetof(struct kvt_engine_opts, groups) && (o->groups || o->n_groups))
		return kvt_grp_create(o, out); /* engine/group.c */
	return kvt_engine_create_core(o, o->layout.head_dim, 0, 0, NULL, 0, 0, out);
}

int
kvt_engine_create_core(const struct kvt_engine_opts *o, uint32_t v_dim, uint64_t layer_bytes,
		       uint64_t sidecar_bytes, struct kvt_device *dev, uint64_t groups_fp,
		       uint32_t group, struct kvt_engine **out)
{
	struct kvt_engine *e;
	uint64_t bb = 0;
	int rc, t;

	*out = NULL;
	rc = engine_check_layout(&o->layout, v_dim, &bb);
	if (!rc && layer_bytes) {
		/* a STATE group's pool: a block is one state per layer, whatever the tokens */
		if (layer_bytes > KVT_ENGINE_MAX_BLOCK_BYTES / o->layout.n_layers)
			rc = kvt_err(-EINVAL, "a state of %llu bytes per layer x %u layers exceeds "
				     "the block limit of %llu bytes", (unsigned long long)layer_bytes,
				     o->layout.n_layers,
				     (unsigned long long)KVT_ENGINE_MAX_BLOCK_BYTES);
		bb = layer_bytes * o->layout.n_layers;
	}
	if (!rc && sidecar_bytes) {
		/* a SIDECAR group's bytes after each layer's K/V (engine/sidecar.c) */
		uint64_t lb = bb / o->layout.n_layers;

		if (sidecar_bytes > KVT_ENGINE_MAX_BLOCK_BYTES / o->layout.n_layers - lb)
			rc = kvt_err(-EINVAL, "%llu sidecar bytes per layer after %llu bytes of K/V "
				     "x %u layers exceed the block limit of %llu bytes",
				     (unsigned long long)sidecar_bytes, (unsigned long long)lb,
				     o->layout.n_layers,
				     (unsigned long long)KVT_ENGINE_MAX_BLOCK_BYTES);
		bb = (lb + sidecar_bytes) * o->layout.n_layers;
	}
	if (!rc)
		rc = engine_check_opts(o, bb);
	if (rc)
		return rc;
	e = kvt_calloc(1, sizeof *e);
	if (!e)
		return kvt_err(-ENOMEM, "engine");
	kvt_engine_opts_init(&e->opts, sizeof e->opts);
	memcpy(&e->opts, o, o->opts_size < sizeof e->opts ? o->opts_size : sizeof e->opts);
	e->opts.opts_size = sizeof e->opts;
	pthread_mutex_init(&e->lock, NULL);
	pthread_cond_init(&e->xfer_cv, NULL);
	e->layout = o->layout;
	e->block_bytes = bb;
	e->layer_block_bytes = bb / o->layout.n_layers;
	e->sc_len = sidecar_bytes;
	e->sc_rec = sidecar_bytes;
	e->sc_off = e->layer_block_bytes - sidecar_bytes;
	e->token_bytes = layer_bytes ? 0 : (uint64_t)o->layout.n_kv_heads * o->layout.head_dim *
					   kvt_dtype_size(o->layout.dtype);
	e->v_token_bytes = layer_bytes ? 0 : (uint64_t)o->layout.n_kv_heads * v_dim *
					     kvt_dtype_size(o->layout.dtype);
	e->dev = dev; /* a device shared by the pools of a grouped engine, or NULL: our own */
	e->dev_borrowed = dev != NULL;
	e->groups_fp = groups_fp;
	e->group_index = group;
	e->block_free = KVT_NIL;
	e->seq_free = KVT_NIL;
	e->prefix.pool_free = KVT_NIL;
	if (o->nvme_dir && !(e->nvme_dir = strdup(o->nvme_dir))) {
		rc = kvt_err(-ENOMEM, "nvme_dir");
		goto fail;
	}
	e->opts.nvme_dir = e->nvme_dir;
	rc = engine_tier_init(e, KVT_TIER_HBM, (uint32_t)(o->hbm_bytes / bb));
	if (!rc)
		rc = engine_tier_init(e, KVT_TIER_HOST, (uint32_t)(o->host_bytes / bb));
	/* a pool of K/V rows keeps the HOST copies appends make old as shadows, so that the
	 * next demotion copies only the tokens written since (engine/block.c, xfer.c) */
	if (!rc && e->slots[KVT_TIER_HOST].n_slots && e->token_bytes && !e->sc_len)
		rc = kvt_slots_shadow_enable(&e->slots[KVT_TIER_HOST]);
	if (!rc)
		rc = engine_open_device(e);
	if (!rc && e->nvme_dir)
		rc = engine_open_nvme(e);
	else if (!rc)
		rc = engine_tier_init(e, KVT_TIER_NVME, 0);
	if (!rc && o->opts_size > offsetof(struct kvt_engine_opts, remote_host) && o->remote_host)
		rc = kvt_reng_open(e);
	if (!rc)
		rc = kvt_wb_open(e);
	if (rc)
		goto fail;
	for (t = 0; t < KVT_TIER_COUNT; t++)
		e->st.tier[t].slots = e->slots[t].n_slots;
	*out = e;
	return 0;
fail:
	{
		/* keep the message of the failure, not of the teardown */
		char keep[512];

		snprintf(keep, sizeof keep, "%s", kvt_last_error_message());
		kvt_engine_destroy(e);
		kvt_err(rc, "%s", strchr(keep, ':') ? strchr(keep, ':') + 2 : keep);
	}
	return rc;
}

void
kvt_engine_destroy(struct kvt_engine *e)
{
	int t;

	if (!e)
		return;
	if (e->grp) {
		kvt_grp_destroy(e); /* engine/group.c */
		return;
	}
	kvt_reng_close(e);
	kvt_ext_fini(e); /* the external pool's copies read and write the caller's memory */
	kvt_lock(e);
	if (e->dev)
		kvt_xfer_fini(e);
	kvt_persist_close(e); /* publishes sessions whose park completed, then closes */
	kvt_unlock(e);
	if (e->sc_stream)
		e->dev->ops->stream_destroy(e->dev, e->sc_stream);
	if (e->nvme)
		kvt_nvme_close(e->nvme);
	if (e->dev) {
		if (e->host_base)
			e->dev->ops->host_free(e->dev, e->host_base, e->host_len);
		if (e->hbm_base)
			e->dev->ops->mem_free(e->dev, e->hbm_base);
		if (!e->dev_borrowed)
			kvt_device_destroy(e->dev);
	}
	for (t = 0; t < KVT_TIER_COUNT; t++) {
		kvt_slots_fini(&e->slots[t]);
		if (e->evict[t].ops)
			e->evict[t].ops->fini(&e->evict[t]);
	}
	for (uint32_t i = 0; i < e->cap_seqs; i++) {
		kvt_free(e->seqs[i].blocks);
		kvt_free(e->seqs[i].tokens);
		kvt_free(e->seqs[i].wpins);
	}
	kvt_free(e->seqs);
	for (uint32_t c = 0; c < e->cap_blocks >> KVT_BCHUNK_SHIFT; c++)
		kvt_free(e->bchunk[c]);
	kvt_free(e->bchunk);
	kvt_free(e->nvme_backlog);
	kvt_sc_fini(e);
	kvt_batch_free_all(e); /* batches the caller never released */
	kvt_free(e->hbm_h2d_seqno);
	kvt_free(e->rel_ring);
	kvt_free(e->winseq);
	kvt_prefix_fini(e);
	kvt_wb_close(e);
	free(e->nvme_dir);
	pthread_cond_destroy(&e->xfer_cv);
	pthread_mutex_destroy(&e->lock);
	kvt_free(e);
}

int
kvt_engine_geometry(const struct kvt_engine *e, struct kvt_geometry *g)
{
	if (!e || !g)
		return kvt_err(-EINVAL, "kvt_engine_geometry: engine and out must not be NULL");
	if (e->grp)
		return kvt_err(-EINVAL, "kvt_engine_geometry: the engine has layer groups: use "
			       "kvt_group_geometry");
	memset(g, 0, sizeof *g);
	g->hbm_base = e->hbm_base;
	g->block_bytes = e->block_bytes;
	g->layer_block_bytes = e->layer_block_bytes;
	g->v_offset = (uint64_t)e->layout.tokens_per_block * e->token_bytes;
	g->token_bytes = e->token_bytes;
	g->tokens_per_block = e->layout.tokens_per_block;
	g->n_layers = e->layout.n_layers;
	g->hbm_slots = e->slots[KVT_TIER_HBM].n_slots;
	g->host_slots = e->slots[KVT_TIER_HOST].n_slots;
	g->nvme_slots = e->slots[KVT_TIER_NVME].n_slots;
	return 0;
}

int
kvt_engine_poll(struct kvt_engine *e, uint32_t max)
{
	int rc;

	if (!e)
		return kvt_err(-EINVAL, "kvt_engine_poll: engine is NULL");
	if (e->grp)
		return kvt_grp_poll(e, max);
	kvt_lock(e);
	rc = kvt_xfer_flush(e);
	if (rc == 0)
		rc = kvt_xfer_poll(e, max);
	if (rc >= 0 && e->opts.idle_timeout_ms)
		kvt_seq_idle_scan(e);
	if (rc >= 0 && e->n_budgets)
		kvt_tenant_enforce(e);
	if (rc >= 0 && e->remote)
		kvt_reng_reap(e);
	if (rc >= 0 && e->ext)
		kvt_ext_progress(e); /* the external pool's jobs (kvtier.h: every engine call) */
	if (rc >= 0) {
		/* completions may have queued follow-ups (a read that continues up to HBM) */
		int rc2 = kvt_xfer_flush(e);

		if (rc2)
			rc = rc2;
	}
	kvt_unlock(e);
	return rc;
}

/*
 * The most blocks one sequence may hold (issue 15, item 3): every tier's usable slots (less
 * those quarantined for good) less the reserve R, one slot per tier below HBM (R = 2 with HOST
 * and NVMe, 1 with HOST only, 0 with HBM alone). A window of W blocks (W <= HBM) of a sequence
 * within it is always readable: with everything else below, R free slots are the room that
 * moving a block down the cascade and one back up needs at each tier boundary while its copy
 * is in flight. Appends past it are KVT_ETOOBIG (kvtier.h, kvt_seq_append).
 */
uint32_t
kvt_seq_max_blocks(const struct kvt_engine *e)
{
	uint64_t total = 0, reserve = 0;
	int t;

	for (t = 0; t < KVT_TIER_COUNT; t++) {
		if (!e->slots[t].n_slots)
			continue;
		total += e->slots[t].n_slots - e->quarantined[t];
		reserve += t != KVT_TIER_HBM;
	}
	total = total > reserve ? total - reserve : 0;
	return total < KVT_SEQ_MAX_BLOCKS ? (uint32_t)total : KVT_SEQ_MAX_BLOCKS;
}

int
kvt_engine_drain(struct kvt_engine *e)
{
	int rc = 0;

	if (!e)
		return kvt_err(-EINVAL, "kvt_engine_drain: engine is NULL");
	if (e->grp)
		return kvt_grp_drain(e);
	if (e->remote)
		kvt_reng_drain(e);
	kvt_lock(e);
	for (;;) {
		while (rc >= 0 && (kvt_xfer_inflight(e) || e->d2h.n_pending || e->h2d.n_pending))
			rc = kvt_xfer_wait_any(e);
		/* parks' NVMe writes that found the queue full (submitted as IOs complete): the
		 * rest, until none is left or none could be submitted */
		if (rc < 0 || !e->n_backlog)
			break;
		kvt_xfer_backlog_kick(e);
		if (!kvt_xfer_inflight(e))
			break;
	}
	kvt_unlock(e);
	return rc < 0 ? rc : 0;
}

int
kvt_engine_stream_create(struct kvt_engine *e, void **stream)
{
	struct kvt_stream *s = NULL;
	int rc;

	if (!e || !stream)
		return kvt_err(-EINVAL, "kvt_engine_stream_create: engine and out must not be NULL");
	rc = e->dev->ops->stream_create(e->dev, &s);
	*stream = s;
	return rc; /* the device recorded the message (no engine lock here: errmsg is not read) */
}

int
kvt_engine_stream_memcpy_async(struct kvt_engine *e, void *stream, void *dst, const void *src,
			       size_t len)
{
	struct kvt_copy c = { .dst = dst, .src = src, .len = len };
	int rc;

	if (!e || !stream || !dst || !src)
		return kvt_err(-EINVAL, "kvt_engine_stream_memcpy_async: NULL argument");
	rc = e->dev->ops->copy_batch_async(e->dev, stream, &c, 1);
	return rc;
}

int
kvt_engine_stream_sync(struct kvt_engine *e, void *stream)
{
	int rc;

	if (!e || !stream)
		return kvt_err(-EINVAL, "kvt_engine_stream_sync: NULL argument");
	rc = e->dev->ops->stream_sync(e->dev, stream);
	return rc;
}

void
kvt_engine_stream_destroy(struct kvt_engine *e, void *stream)
{
	if (e && stream)
		e->dev->ops->stream_destroy(e->dev, stream);
}

int
kvt_engine_stats(struct kvt_engine *e, struct kvt_stats *out)
{
	struct kvt_stats s;
	size_t size;
	int t;

	if (!e || !out)
		return kvt_err(-EINVAL, "kvt_engine_stats: engine and out must not be NULL");
	size = out->size;
	if (size < offsetof(struct kvt_stats, evictions) || size > 65536)
		return kvt_err(-EINVAL, "kvt_stats.size %zu: set it to sizeof(struct kvt_stats)",
			       size);
	if (e->grp)
		return kvt_grp_stats(e, out);
	kvt_lock(e);
	(void)kvt_xfer_poll(e, KVT_XFER_POLL_BOUND); /* bounded: stats never wait for others' IO */
	if (e->remote)
		kvt_reng_reap(e);
	s = e->st;
	s.evictions = 0; /* the sum over tiers, derived here */
	for (t = 0; t < KVT_TIER_COUNT; t++) {
		uint64_t sb = t == KVT_TIER_NVME && e->nvme ? kvt_nvme_slot_bytes(e->nvme) :
			      e->block_bytes;

		s.tier[t].slots = e->slots[t].n_slots;
		s.tier[t].used_slots = e->slots[t].n_slots - e->slots[t].n_free;
		s.tier[t].capacity_bytes = (uint64_t)s.tier[t].slots * sb;
		s.tier[t].used_bytes = (uint64_t)s.tier[t].used_slots * sb;
		s.evictions += s.tier[t].evictions;
	}
	s.seqs_open = e->n_open_seqs;
	s.meta_bytes = kvt_meta_bytes(e);
	s.meta_block_records = e->cap_blocks;
	s.meta_token_bytes = kvt_meta_token_bytes(e);
	s.batches_open = e->n_batches;
	s.h2d_groups = e->h2d.submitted;
	kvt_unlock(e);
	s.size = size;
	memcpy(out, &s, size < sizeof s ? size : sizeof s);
	return 0;
}

uint64_t
kvt_meta_bytes(const struct kvt_engine *e)
{
	uint64_t m = sizeof *e + (uint64_t)e->cap_blocks * sizeof(struct kvt_block) +
		     (uint64_t)e->cap_bchunks * sizeof *e->bchunk +
		     (uint64_t)e->cap_seqs * sizeof *e->seqs;
	uint32_t i;

	if (e->winseq) /* a windowed engine's per-sequence state (engine/window.c) */
		m += (uint64_t)e->cap_seqs * sizeof *e->winseq;
	int t;

	m += kvt_prefix_meta_bytes(e);
	m += kvt_wb_meta_bytes(e); /* the per-key hint table (REMOTE tier or write budgets) */
	m += kvt_nvme_meta_bytes(e->nvme); /* the NVMe copies' metadata, 6 bytes per slot */
	/* per HBM slot: the h2d group of the copy into it */
	m += (uint64_t)e->slots[KVT_TIER_HBM].n_slots * sizeof *e->hbm_h2d_seqno;
	/* the persistent store's per-NVMe-slot naming flags and its pending-slot list */
	if (e->nvme_named)
		m += e->slots[KVT_TIER_NVME].n_slots;
	m += (uint64_t)e->cap_pend * sizeof *e->pend;
	for (t = 0; t < KVT_TIER_COUNT; t++) {
		const struct kvt_evict *ev = &e->evict[t];

		/* owner map (free list threaded through it) and allocated bits */
		m += kvt_slots_meta_bytes(&e->slots[t]);
		/* links and per-copy state (per slot; prio: per id), arc's ghosts */
		m += kvt_evict_meta_bytes(ev);
	}
	for (i = 0; i < e->cap_seqs; i++) {
		const struct kvt_seqrec *s = &e->seqs[i];

		m += (uint64_t)s->cap_blocks * sizeof *s->blocks +
		     (uint64_t)s->cap_wpins * sizeof *s->wpins;
	}
	return m;
}

uint64_t
kvt_meta_token_bytes(const struct kvt_engine *e)
{
	uint64_t m = kvt_prefix_token_bytes(e);
	uint32_t i;

	for (i = 0; i < e->cap_seqs; i++)
		m += e->seqs[i].cap_tokens * sizeof *e->seqs[i].tokens;
	return m;
}

const char *
kvt_version(void)
{
#define KVT_STR2(x) #x
#define KVT_STR(x) KVT_STR2(x)
	return KVT_STR(KVT_VERSION_MAJOR) "." KVT_STR(KVT_VERSION_MINOR) "." KVT_STR(
		KVT_VERSION_PATCH);
}
