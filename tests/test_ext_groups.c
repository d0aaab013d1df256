/* SPDX-License-Identifier: MIT */
/*
 * tests/test_ext_groups.c - external pools per layer group (issue 19; kvtier.h "External-pool
 * mode"): a server with a hybrid model registers one device pool per KV cache group (vLLM's
 * HybridKVCacheCoordinator, SGLang's hybrid pools). On a grouped engine the pool of storage
 * group g has id g + 1 and lives in that group's pool engine: its geometry is the group's, its
 * keys (tenant, hash) are its own (the same hash in two groups is two blocks), and every call
 * (store, lookup, load, poll, wait, drop, unregister, stats, and kvt_engine_poll's progress)
 * concerns that group only. ALIAS and SIDECAR groups have no pool and are refused with advice.
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "engine/engine_impl.h"
#include "support/kvt_test.h"

#define TPB 4u
#define NB 16u /* caller blocks per pool */

/* The model: 4 layers, tpb 4, f32.
 *   group 0 FULL    layers {0, 2}: 2 KV heads of 8: K = V = 4 x 2 x 8 x 4 = 256 B per layer
 *   group 1 LATENT  layer  {1}:    latent 24: 384 B per layer (K only)
 *   group 2 ALIAS   layer  {3}:    of layer 0
 *   group 3 SIDECAR of group 1:    4 bytes per token and layer (the indexer's keys) */
#define NG 4u
static const uint32_t g0_layers[] = { 0, 2 }, g1_layers[] = { 1 }, g2_layers[] = { 3 };
static const uint32_t g2_src[] = { 0 };
#define SEG0 256u /* group 0: K (and V) bytes of a layer of a block */
#define SEG1 384u /* group 1: the latent of a layer of a block */

static void
model(struct kvt_engine_opts *o, struct kvt_group *g, const char *dir, bool persist)
{
	for (uint32_t i = 0; i < NG; i++)
		kvt_group_init(&g[i], sizeof g[i]);
	g[0].kind = KVT_GROUP_FULL;
	g[0].n_layers = 2;
	g[0].layers = g0_layers;
	g[0].n_kv_heads = 2;
	g[0].head_dim = 8;
	g[0].dtype = KVT_DTYPE_F32;
	g[0].share = 0.5f;
	g[1].kind = KVT_GROUP_LATENT;
	g[1].n_layers = 1;
	g[1].layers = g1_layers;
	g[1].latent_dim = 24;
	g[1].dtype = KVT_DTYPE_F32;
	g[1].share = 0.5f;
	g[2].kind = KVT_GROUP_ALIAS;
	g[2].n_layers = 1;
	g[2].layers = g2_layers;
	g[2].alias_of = g2_src;
	g[3].kind = KVT_GROUP_SIDECAR;
	g[3].parent = 1;
	g[3].sidecar_token_bytes = 4;
	kvt_engine_opts_init(o, sizeof *o);
	o->layout.n_layers = 4;
	o->layout.tokens_per_block = TPB;
	o->groups = g;
	o->n_groups = NG;
	o->hbm_bytes = 2 * 4 * 1024;  /* a few blocks per pool: this mode does not use HBM */
	o->host_bytes = 2 * 4 * 1024; /* 4 of group 0's 1 KiB blocks, 10 of group 1's */
	if (dir) {
		o->nvme_dir = dir;
		o->nvme_bytes = 2 * 64 * 8192;
		o->nvme_persist = persist;
		if (persist)
			o->high_watermark = o->low_watermark = 1.0f;
	}
}

/* A caller pool of @nl layers, each a tensor [kv][NB][seg bytes] (vLLM's per-layer layout; K
 * only when !kv: MLA's [NB][seg]). */
struct pool {
	uint32_t nl, seg, kv; /* layers, bytes per segment, 1 (K only) or 2 (K and V) */
	uint8_t *mem[2];
	struct kvt_ext_layer lay[2];
	uint32_t id;
};

static void
pool_init(struct pool *p, uint32_t nl, uint32_t seg, uint32_t kv)
{
	memset(p, 0, sizeof *p);
	p->nl = nl;
	p->seg = seg;
	p->kv = kv;
	for (uint32_t l = 0; l < nl; l++) {
		p->mem[l] = calloc(kv, (size_t)NB * seg);
		assert_non_null(p->mem[l]);
		p->lay[l] = (struct kvt_ext_layer){ .base = (uintptr_t)p->mem[l],
						    .block_stride = seg, .k_offset = 0,
						    .v_offset = kv == 2 ? (uint64_t)NB * seg
									: KVT_EXT_NO_V,
						    .k_bytes = seg, .v_bytes = kv == 2 ? seg : 0,
						    .n_layers = 1 };
	}
}

/* Register @p for layer group @g of @e; returns the call's result (p->id set on success). */
static int
pool_register(struct kvt_engine *e, struct pool *p, uint32_t g)
{
	struct kvt_ext_opts o;

	kvt_ext_opts_init(&o, sizeof o);
	o.n_blocks = NB;
	o.n_entries = p->nl;
	o.layers = p->lay;
	o.layer_group = g;
	return kvt_ext_register(e, &o, &p->id);
}

static void
pool_free(struct pool *p)
{
	for (uint32_t l = 0; l < p->nl; l++)
		free(p->mem[l]);
}

static uint8_t *
seg(struct pool *p, uint32_t l, uint32_t kv, uint32_t blk)
{
	return p->mem[l] + ((size_t)kv * NB + blk) * p->seg;
}

static uint8_t
pat(uint32_t tag, uint32_t l, uint32_t kv, uint32_t i)
{
	return (uint8_t)(tag * 131u + l * 17u + kv * 7u + i * 3u + (i >> 8));
}

static void
fill(struct pool *p, uint32_t blk, uint32_t tag)
{
	for (uint32_t l = 0; l < p->nl; l++)
		for (uint32_t kv = 0; kv < p->kv; kv++)
			for (uint32_t i = 0; i < p->seg; i++)
				seg(p, l, kv, blk)[i] = pat(tag, l, kv, i);
}

static bool
holds(struct pool *p, uint32_t blk, uint32_t tag)
{
	for (uint32_t l = 0; l < p->nl; l++)
		for (uint32_t kv = 0; kv < p->kv; kv++)
			for (uint32_t i = 0; i < p->seg; i++)
				if (seg(p, l, kv, blk)[i] != pat(tag, l, kv, i))
					return false;
	return true;
}

static void
wipe(struct pool *p, uint32_t blk)
{
	for (uint32_t l = 0; l < p->nl; l++)
		for (uint32_t kv = 0; kv < p->kv; kv++)
			memset(seg(p, l, kv, blk), 0xee, p->seg);
}

static uint64_t
hash_of(uint32_t i)
{
	return 0x5a5a000000000000ull ^ ((uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull);
}


/* Store caller blocks 0..n-1 of @p (filled with tags tag0 + i) under hash_of(0..n-1). */
static void
store_n(struct kvt_engine *e, struct pool *p, uint32_t n, uint32_t tag0)
{
	uint32_t ids[NB];
	uint64_t h[NB], job;
	struct kvt_ext_fail f[NB];
	struct kvt_ext_done d;
	int rc;

	for (uint32_t i = 0; i < n; i++) {
		ids[i] = i;
		h[i] = hash_of(i);
		fill(p, i, tag0 + i);
	}
	rc = kvt_ext_store(e, p->id, 0, h, ids, n, NULL, &job);
	if (rc)
		print_error("store: %s\n", kvt_last_error_message());
	assert_int_equal(rc, 0);
	d = tsup_ext_finish(e, p->id, job, f, NB);
	assert_int_equal(d.status, 0);
	assert_int_equal(d.n_failed, 0);
}

/* Load hash_of(0..n-1) into caller blocks NB-1, NB-2, ... of @p; asserts no failure and
 * every byte (tags tag0 + i). */
static void
load_check(struct kvt_engine *e, struct pool *p, uint32_t n, uint32_t tag0)
{
	uint32_t to[NB];
	uint64_t h[NB], job;
	struct kvt_ext_fail f[NB];
	struct kvt_ext_done d;

	for (uint32_t i = 0; i < n; i++) {
		to[i] = NB - 1 - i;
		h[i] = hash_of(i);
		wipe(p, to[i]);
	}
	assert_int_equal(kvt_ext_load(e, p->id, 0, h, to, n, 0, &job), 0);
	d = tsup_ext_finish(e, p->id, job, f, NB);
	assert_int_equal(d.status, 0);
	assert_int_equal(d.n_failed, 0);
	for (uint32_t i = 0; i < n; i++)
		assert_true(holds(p, to[i], tag0 + i));
}

static size_t
hits_of(struct kvt_engine *e, uint32_t pool, uint32_t n, enum kvt_tier *tier)
{
	uint64_t h[NB];
	size_t hits = 99;

	for (uint32_t i = 0; i < n; i++)
		h[i] = hash_of(i);
	assert_int_equal(kvt_ext_lookup(e, pool, 0, h, n, &hits, tier), 0);
	return hits;
}

static struct kvt_engine *
create(const struct kvt_engine_opts *o, const struct kvt_nvme_fault_hooks *hooks)
{
	return tsup_create(o, hooks);
}

/* The two pools of the model, registered: @p0 for group 0 (2 layers, K and V), @p1 for
 * group 1 (the latent, K only). */
static void
two_pools(struct kvt_engine *e, struct pool *p0, struct pool *p1)
{
	pool_init(p0, 2, SEG0, 2);
	pool_init(p1, 1, SEG1, 1);
	assert_int_equal(pool_register(e, p0, 0), 0);
	assert_int_equal(pool_register(e, p1, 1), 0);
}

/* ---- registration: one pool per storage group; what has no pool is refused with advice */
static void
test_register_per_group(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_engine *e, *plain;
	struct pool p0, p1, x;
	uint32_t ids[1] = { 0 };
	uint64_t h[1] = { 1 }, job;
	size_t hits;

	(void)state;
	model(&o, g, NULL, false);
	e = create(&o, NULL);
	pool_init(&p0, 2, SEG0, 2);
	pool_init(&p1, 1, SEG1, 1);
	pool_init(&x, 1, SEG1, 1);
	/* before: -ENODEV "no HOST tier", the grouped front holding no tiers of its own */
	assert_int_equal(pool_register(e, &p0, 0), 0);
	assert_int_equal(p0.id, 1);
	assert_int_equal(pool_register(e, &p1, 1), 0);
	assert_int_equal(p1.id, 2);
	assert_int_equal(pool_register(e, &x, 0), -EEXIST);
	assert_int_equal(x.id, 0);
	assert_int_equal(pool_register(e, &x, 1), -EEXIST);
	assert_int_equal(pool_register(e, &x, 2), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "ALIAS"));
	assert_int_equal(pool_register(e, &x, 3), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "SIDECAR"));
	assert_non_null(strstr(kvt_last_error_message(), "parent"));
	assert_int_equal(pool_register(e, &x, 4), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "out of range"));
	assert_int_equal(pool_register(e, &x, UINT32_MAX), -EINVAL);
	/* ids naming no pool: 0, the ALIAS and SIDECAR groups' g + 1, past the groups */
	for (uint32_t id = 0; id <= 6; id++) {
		if (id == 1 || id == 2)
			continue;
		assert_int_equal(kvt_ext_lookup(e, id, 0, h, 1, &hits, NULL), -ENOENT);
		assert_int_equal(kvt_ext_store(e, id, 0, h, ids, 1, NULL, &job), -ENOENT);
		assert_int_equal(kvt_ext_unregister(e, id), -ENOENT);
	}
	assert_int_equal(kvt_ext_unregister(e, UINT32_MAX), -ENOENT);
	kvt_engine_destroy(e);

	/* group 0's geometry (2 layers x 512 B) is larger than group 1's block (384 B + its
	 * sidecar): refused there, as any pool larger than its engine's block */
	model(&o, g, NULL, false);
	e = create(&o, NULL);
	assert_int_equal(pool_register(e, &p0, 1), -EINVAL);
	assert_int_equal(pool_register(e, &p0, 0), 0);
	kvt_engine_destroy(e);

	/* an engine without layer groups: layer_group 0 only */
	tsup_opts_init(&o);
	o.hbm_bytes = tsup_block_bytes();
	o.host_bytes = 8 * tsup_block_bytes();
	plain = create(&o, NULL);
	assert_int_equal(pool_register(plain, &p1, 1), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "layer_group"));
	kvt_engine_destroy(plain);
	pool_free(&p0);
	pool_free(&p1);
	pool_free(&x);
}

/* ---- two pools of different geometry: byte-exact, keys per group, drop and unregister */
static void
test_groups_independent(void **state)
{
	char *dir = tsup_mkdtemp();
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_engine *e;
	struct pool p0, p1;
	struct kvt_ext_stats s0 = { .size = sizeof s0 }, s1 = { .size = sizeof s1 };
	struct kvt_stats st;
	uint64_t h;

	(void)state;
	model(&o, g, dir, false);
	e = create(&o, NULL);
	two_pools(e, &p0, &p1);
	/* the same hashes in both groups, other bytes: 8 blocks each, more than HOST holds
	 * (4 and 10), so some come back from NVMe */
	store_n(e, &p0, 8, 10);
	store_n(e, &p1, 8, 50);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(hits_of(e, p0.id, 8, NULL), 8);
	assert_int_equal(hits_of(e, p1.id, 8, NULL), 8);
	load_check(e, &p0, 8, 10);
	load_check(e, &p1, 8, 50);
	assert_int_equal(kvt_ext_stats(e, p0.id, &s0), 0);
	assert_int_equal(kvt_ext_stats(e, p1.id, &s1), 0);
	assert_int_equal(s0.stored_blocks, 8);
	assert_int_equal(s1.stored_blocks, 8);
	assert_int_equal(s0.bytes_stored, 8 * 2 * 2 * SEG0);
	assert_int_equal(s1.bytes_stored, 8 * SEG1);
	assert_int_equal(s0.bytes_loaded, 8 * 2 * 2 * SEG0);
	assert_int_equal(s1.bytes_loaded, 8 * SEG1);
	/* both groups' blocks are the engine's: its totals are the groups' sums, and group 0's 8
	 * blocks in 4 HOST slots went to NVMe at least 4 times (group 1's fit: whether they
	 * move too is the watermarks' timing) */
	st = tsup_stats(e);
	{
		struct kvt_stats a = { .size = sizeof a }, b = { .size = sizeof b };

		assert_int_equal(kvt_engine_group_stats(e, 0, &a), 0);
		assert_int_equal(kvt_engine_group_stats(e, 1, &b), 0);
		assert_true(a.blocks_moved[KVT_MOVE_HOST_TO_NVME] >= 4);
		assert_int_equal(st.blocks_moved[KVT_MOVE_HOST_TO_NVME],
				 a.blocks_moved[KVT_MOVE_HOST_TO_NVME] +
					 b.blocks_moved[KVT_MOVE_HOST_TO_NVME]);
	}

	/* drop hash 2 in group 0 only */
	h = hash_of(2);
	assert_int_equal(kvt_ext_drop(e, p0.id, 0, &h, 1), 1);
	assert_int_equal(hits_of(e, p0.id, 8, NULL), 2);
	assert_int_equal(hits_of(e, p1.id, 8, NULL), 8);
	/* unregister group 0's pool: group 1's goes on */
	assert_int_equal(kvt_ext_unregister(e, p0.id), 0);
	assert_int_equal(kvt_ext_unregister(e, p0.id), -ENOENT);
	{
		size_t hits;

		assert_int_equal(kvt_ext_lookup(e, p0.id, 0, &h, 1, &hits, NULL), -ENOENT);
	}
	assert_int_equal(kvt_ext_stats(e, p1.id, &s1), 0);
	assert_int_equal(s1.stored_blocks, 8);
	load_check(e, &p1, 8, 50);
	/* and group 0 takes a pool again, empty */
	assert_int_equal(pool_register(e, &p0, 0), 0);
	assert_int_equal(hits_of(e, p0.id, 8, NULL), 0);
	store_n(e, &p0, 3, 90);
	load_check(e, &p0, 3, 90);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	pool_free(&p0);
	pool_free(&p1);
	tsup_rmdir(dir);
}

/* ---- kvt_engine_poll advances the pools' jobs (kvtier.h: "every engine call") */
static void
test_engine_poll_advances_jobs(void **state)
{
	char *dir = tsup_mkdtemp();
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_engine *e;
	struct pool p0, p1;
	uint32_t to0[8], to1[8], i;
	uint64_t h[8], j0, j1;
	int k;
	bool done = false;

	(void)state;
	model(&o, g, dir, false);
	e = create(&o, NULL);
	two_pools(e, &p0, &p1);
	store_n(e, &p0, 8, 20);
	store_n(e, &p1, 8, 60);
	assert_int_equal(kvt_engine_drain(e), 0);
	for (i = 0; i < 8; i++) {
		h[i] = hash_of(i);
		to0[i] = 8 + i;
		to1[i] = 8 + i;
		wipe(&p0, to0[i]);
		wipe(&p1, to1[i]);
	}
	/* blocks past HOST's room are on NVMe: a load reads them, then copies; with no other
	 * call than kvt_engine_poll both jobs must get there */
	assert_int_equal(kvt_ext_load(e, p0.id, 0, h, to0, 8, 0, &j0), 0);
	assert_int_equal(kvt_ext_load(e, p1.id, 0, h, to1, 8, 0, &j1), 0);
	for (k = 0; k < 20000 && !done; k++) {
		struct kvt_ext_stats s0 = { .size = sizeof s0 }, s1 = { .size = sizeof s1 };

		assert_true(kvt_engine_poll(e, 0) >= 0);
		/* read-only counters (advance nothing): a load's blocks count once its copies
		 * landed and the job retired; the caller blocks are not read before that (the
		 * device may still be writing them) */
		assert_int_equal(kvt_ext_stats(e, p0.id, &s0), 0);
		assert_int_equal(kvt_ext_stats(e, p1.id, &s1), 0);
		done = s0.blocks_loaded == 8 && s1.blocks_loaded == 8;
		if (!done)
			usleep(500);
	}
	assert_true(done);
	for (i = 0; i < 8; i++) {
		assert_true(holds(&p0, to0[i], 20 + i));
		assert_true(holds(&p1, to1[i], 60 + i));
	}
	{
		struct kvt_ext_done d;
		struct kvt_ext_fail f[8];

		d = tsup_ext_finish(e, p0.id, j0, f, 8);
		assert_int_equal(d.n_failed, 0);
		d = tsup_ext_finish(e, p1.id, j1, f, 8);
		assert_int_equal(d.n_failed, 0);
	}
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	pool_free(&p0);
	pool_free(&p1);
	tsup_rmdir(dir);
}

/* ---- the same on an engine without groups: kvt_engine_poll alone finishes a load whose
 * blocks are on NVMe (read, then copied into the caller's blocks) */
static void
test_engine_poll_advances_jobs_ungrouped(void **state)
{
	char *dir = tsup_mkdtemp();
	struct kvt_engine_opts o;
	struct kvt_engine *e;
	struct kvt_ext_done d;
	struct kvt_ext_fail f[8];
	struct pool p;
	uint32_t to[6], i;
	uint64_t h[6], job;
	bool done = false;

	(void)state;
	tsup_opts_init(&o);
	o.hbm_bytes = tsup_block_bytes();
	o.host_bytes = 2 * tsup_block_bytes();
	o.nvme_dir = dir;
	o.nvme_bytes = 64 * 8192;
	e = create(&o, NULL);
	pool_init(&p, 2, SEG0, 2); /* 2 x 512 B: the engine's 1 KiB block */
	assert_int_equal(pool_register(e, &p, 0), 0);
	assert_int_equal(p.id, 1);
	store_n(e, &p, 6, 25);
	assert_int_equal(kvt_engine_drain(e), 0);
	for (i = 0; i < 6; i++) {
		h[i] = hash_of(i);
		to[i] = 8 + i;
		wipe(&p, to[i]);
	}
	assert_int_equal(kvt_ext_load(e, p.id, 0, h, to, 6, 0, &job), 0);
	for (int k = 0; k < 20000 && !done; k++) {
		struct kvt_ext_stats st = { .size = sizeof st };

		assert_true(kvt_engine_poll(e, 0) >= 0);
		assert_int_equal(kvt_ext_stats(e, p.id, &st), 0); /* read-only, as above */
		done = st.blocks_loaded == 6;
		if (!done)
			usleep(500);
	}
	assert_true(done);
	for (i = 0; i < 6; i++)
		assert_true(holds(&p, to[i], 25 + i));
	d = tsup_ext_finish(e, p.id, job, f, 8);
	assert_int_equal(d.n_failed, 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	pool_free(&p);
	tsup_rmdir(dir);
}

/* ---- a restart on the same store: each group's pool finds its own blocks */
static void
test_restart_per_group(void **state)
{
	char *dir = tsup_mkdtemp();
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_engine *e;
	struct pool p0, p1, q0, q1;
	struct kvt_ext_stats s = { .size = sizeof s };
	struct kvt_ext_done d;
	struct kvt_ext_fail f[8];
	enum kvt_tier tier;
	int k;

	(void)state;
	model(&o, g, dir, true);
	e = create(&o, NULL);
	two_pools(e, &p0, &p1);
	store_n(e, &p0, 4, 30);
	store_n(e, &p1, 6, 70);
	for (k = 0; k < 1000; k++) { /* written through and published */
		uint64_t a, b;

		assert_int_equal(kvt_engine_drain(e), 0);
		assert_true(kvt_ext_poll(e, p0.id, &d, 1, f, 8) >= 0);
		assert_true(kvt_ext_poll(e, p1.id, &d, 1, f, 8) >= 0);
		assert_int_equal(kvt_ext_stats(e, p0.id, &s), 0);
		a = s.persisted_blocks;
		assert_int_equal(kvt_ext_stats(e, p1.id, &s), 0);
		b = s.persisted_blocks;
		if (a == 4 && b == 6)
			break;
	}
	assert_int_equal(kvt_ext_stats(e, p1.id, &s), 0);
	assert_int_equal(s.persisted_blocks, 6);
	tsup_check_engine(e);
	kvt_engine_destroy(e);

	/* a new process: the same groups and store, new pools (other memory) */
	model(&o, g, dir, true);
	e = create(&o, NULL);
	pool_init(&q0, 2, SEG0, 2);
	pool_init(&q1, 1, SEG1, 1);
	assert_int_equal(pool_register(e, &q1, 1), 0); /* any order */
	assert_int_equal(pool_register(e, &q0, 0), 0);
	assert_int_equal(hits_of(e, q0.id, 6, &tier), 4);
	assert_int_equal(hits_of(e, q1.id, 6, &tier), 6);
	assert_int_equal(tier, KVT_TIER_NVME);
	load_check(e, &q0, 4, 30);
	load_check(e, &q1, 6, 70);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	pool_free(&p0);
	pool_free(&p1);
	pool_free(&q0);
	pool_free(&q1);
	tsup_rmdir(dir);
}

/* ---- a block corrupted on NVMe in one group: only it fails, the other group is untouched */
static int corrupt_reads;

static void
corrupt_hook(void *arg, bool is_write, uint32_t slot, void *buf, size_t len, uint64_t off,
	     int *res)
{
	(void)arg, (void)slot;
	if (is_write || *res <= 0 || corrupt_reads <= 0)
		return;
	/* slots of 8 KiB: [header page | data page]; flip a byte of the data */
	if (len >= 8192) {
		corrupt_reads--;
		((uint8_t *)buf)[4096 + 10] ^= 0x40;
	} else if (off % 8192 == 4096) {
		corrupt_reads--;
		((uint8_t *)buf)[10] ^= 0x40;
	}
}

static const struct kvt_nvme_fault_hooks corrupt_hooks = { .on_complete = corrupt_hook };

static void
test_corrupt_block_one_group(void **state)
{
	char *dir = tsup_mkdtemp();
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_engine *e;
	struct pool p0, p1;
	uint32_t to[8], i, bad;
	uint64_t h[8], job;
	struct kvt_ext_fail f[8];
	struct kvt_ext_done d;

	(void)state;
	model(&o, g, dir, false);
	o.host_bytes = 2 * 1024; /* HOST: 1 block of group 0, 2 of group 1: the rest on NVMe */
	e = create(&o, &corrupt_hooks);
	two_pools(e, &p0, &p1);
	store_n(e, &p0, 6, 40);
	store_n(e, &p1, 6, 80);
	assert_int_equal(kvt_engine_drain(e), 0);
	for (i = 0; i < 6; i++) {
		h[i] = hash_of(i);
		to[i] = 8 + i;
		wipe(&p1, to[i]);
	}
	corrupt_reads = 1;
	assert_int_equal(kvt_ext_load(e, p1.id, 0, h, to, 6, 0, &job), 0);
	d = tsup_ext_finish(e, p1.id, job, f, 8);
	assert_int_equal(corrupt_reads, 0);
	assert_int_equal(d.n_failed, 1);
	assert_int_equal(d.status, KVT_ECORRUPT);
	assert_int_equal(f[d.failed_first].err, KVT_ECORRUPT);
	bad = f[d.failed_first].block_id;
	assert_true(bad >= 8 && bad < 14);
	for (i = 0; i < 6; i++)
		if (to[i] != bad)
			assert_true(holds(&p1, to[i], 80 + i));
	/* the corrupt block left group 1 only: group 0 still has all six, byte-exact */
	assert_int_equal(hits_of(e, p1.id, 6, NULL), bad - 8);
	assert_int_equal(hits_of(e, p0.id, 6, NULL), 6);
	load_check(e, &p0, 6, 40);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	pool_free(&p0);
	pool_free(&p1);
	tsup_rmdir(dir);
}

/* ---- touch, removed and wait_layer route by pool id too: each group's own */
static void
test_touch_removed_wait_layer_per_group(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_engine *e;
	struct pool p0, p1;
	struct kvt_ext_removal r[8];
	struct kvt_ext_fail f[8];
	struct kvt_ext_done d;
	uint64_t h[2] = { hash_of(0), hash_of(1) }, lost = 99, job;
	uint32_t to[2] = { NB - 1, NB - 2 };

	(void)state;
	model(&o, g, NULL, false);
	e = create(&o, NULL);
	two_pools(e, &p0, &p1);
	store_n(e, &p0, 2, 11);
	store_n(e, &p1, 1, 51); /* group 1 holds hash_of(0) only */
	assert_int_equal(kvt_ext_touch(e, p0.id, 0, h, 2), 2);
	assert_int_equal(kvt_ext_touch(e, p1.id, 0, h, 2), 1);
	assert_int_equal(kvt_ext_touch(e, 3, 0, h, 2), -ENOENT); /* the ALIAS group's g + 1 */
	/* a drop in group 0 is reported by group 0's feed only */
	assert_int_equal(kvt_ext_removed(e, p0.id, r, 8, &lost), 0);
	assert_int_equal(kvt_ext_removed(e, p1.id, r, 8, &lost), 0);
	assert_int_equal(kvt_ext_drop(e, p0.id, 0, &h[1], 1), 1);
	assert_int_equal(kvt_ext_removed(e, p1.id, r, 8, &lost), 0);
	assert_int_equal(lost, 0);
	assert_int_equal(kvt_ext_removed(e, p0.id, r, 8, &lost), 1);
	assert_true(r[0].hash == h[1]);
	assert_int_equal(kvt_ext_removed(e, 4, r, 8, &lost), -ENOENT); /* SIDECAR's g + 1 */
	/* a layerwise load in each group: wait_layer knows each pool's layers (2 and 1) */
	wipe(&p0, to[0]);
	wipe(&p1, to[0]);
	assert_int_equal(kvt_ext_load(e, p1.id, 0, h, to, 1, KVT_EXT_LAYERWISE, &job), 0);
	assert_int_equal(kvt_ext_wait_layer(e, p1.id, job, 1, NULL), -EINVAL);
	assert_int_equal(kvt_ext_wait_layer(e, p1.id, job, 0, NULL), 0);
	assert_true(holds(&p1, to[0], 51));
	d = tsup_ext_finish(e, p1.id, job, f, 8);
	assert_int_equal(d.n_failed, 0);
	assert_int_equal(kvt_ext_load(e, p0.id, 0, h, to, 1, KVT_EXT_LAYERWISE, &job), 0);
	assert_int_equal(kvt_ext_wait_layer(e, p0.id, job, 1, NULL), 0);
	assert_int_equal(kvt_ext_wait_layer(e, p0.id, job, 0, NULL), 0);
	assert_int_equal(kvt_ext_wait_layer(e, p1.id, job + 1000, 0, NULL), -ENOENT);
	d = tsup_ext_finish(e, p0.id, job, f, 8);
	assert_int_equal(d.n_failed, 0);
	assert_true(holds(&p0, to[0], 11));
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	pool_free(&p0);
	pool_free(&p1);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_register_per_group),
		cmocka_unit_test(test_groups_independent),
		cmocka_unit_test(test_engine_poll_advances_jobs),
		cmocka_unit_test(test_engine_poll_advances_jobs_ungrouped),
		cmocka_unit_test(test_restart_per_group),
		cmocka_unit_test(test_corrupt_block_one_group),
		cmocka_unit_test(test_touch_removed_wait_layer_per_group),
	};

	return cmocka_run_group_tests(tests, tsup_room_on, tsup_room_off);
}
