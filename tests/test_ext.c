/* SPDX-License-Identifier: MIT */
/*
 * tests/test_ext.c - the external-pool mode (issue 19 item 1, kvtier.h "External-pool mode"):
 * a caller-owned pool (plain host memory on the emulated device) in vLLM's per-layer layout
 * [2, num_blocks, ...], a cross-layer layout and an MLA-like K-only layout; every byte stored
 * comes back into other block ids, through HOST and through NVMe; lookup counts the leading
 * run; a block corrupted on NVMe is the only one reported failed; bad input gets clear errors.
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/engine_impl.h"
#include "support/kvt_test.h"

#define SEG 256u /* K (or V) bytes of one layer of one block in the test layout */
#define NB 32u   /* caller blocks */

/* A caller pool in vLLM's per-layer layout: layer l is a tensor [2][NB][SEG bytes]. */
struct pool {
	uint8_t *mem[TSUP_LAYERS];
	struct kvt_ext_layer lay[TSUP_LAYERS];
	uint32_t id;
};

static void
pool_make_cap(struct kvt_engine *e, struct pool *p, uint32_t removed_cap)
{
	struct kvt_ext_opts o;
	uint32_t l;
	int rc;

	for (l = 0; l < TSUP_LAYERS; l++) {
		p->mem[l] = calloc(2, NB * SEG);
		assert_non_null(p->mem[l]);
		p->lay[l] = (struct kvt_ext_layer){ .base = (uintptr_t)p->mem[l],
						    .block_stride = SEG, .k_offset = 0,
						    .v_offset = NB * SEG, .k_bytes = SEG,
						    .v_bytes = SEG, .n_layers = 1 };
	}
	kvt_ext_opts_init(&o, sizeof o);
	o.n_blocks = NB;
	o.n_entries = TSUP_LAYERS;
	o.layers = p->lay;
	if (removed_cap)
		o.removed_cap = removed_cap;
	rc = kvt_ext_register(e, &o, &p->id);
	if (rc)
		print_error("register: %s\n", kvt_last_error_message());
	assert_int_equal(rc, 0);
	assert_int_not_equal(p->id, 0);
}

static void
pool_make(struct kvt_engine *e, struct pool *p)
{
	pool_make_cap(e, p, 0);
}

static void
pool_free(struct pool *p)
{
	for (uint32_t l = 0; l < TSUP_LAYERS; l++)
		free(p->mem[l]);
}

static uint8_t *
seg(struct pool *p, uint32_t l, uint32_t kv, uint32_t blk)
{
	return p->mem[l] + (size_t)kv * NB * SEG + (size_t)blk * SEG;
}

/* Fill caller block @blk with the pattern of @tag. */
static void
fill(struct pool *p, uint32_t blk, uint32_t tag)
{
	for (uint32_t l = 0; l < TSUP_LAYERS; l++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t i = 0; i < SEG; i++)
				seg(p, l, kv, blk)[i] = (uint8_t)(tag * 131u + l * 17u + kv * 7u +
								  i * 3u + (i >> 8));
}

static bool
holds(struct pool *p, uint32_t blk, uint32_t tag)
{
	for (uint32_t l = 0; l < TSUP_LAYERS; l++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t i = 0; i < SEG; i++)
				if (seg(p, l, kv, blk)[i] != (uint8_t)(tag * 131u + l * 17u +
								       kv * 7u + i * 3u + (i >> 8)))
					return false;
	return true;
}

static void
wipe(struct pool *p, uint32_t blk)
{
	for (uint32_t l = 0; l < TSUP_LAYERS; l++)
		for (uint32_t kv = 0; kv < 2; kv++)
			memset(seg(p, l, kv, blk), 0xee, SEG);
}

static uint64_t
hash_of(uint32_t i)
{
	return 0x1234567800000000ull ^ ((uint64_t)i * 0x9e3779b97f4a7c15ull);
}


static struct kvt_engine *
engine(uint32_t host_blocks, uint32_t nvme_blocks, char **dir,
       const struct kvt_nvme_fault_hooks *hooks)
{
	struct kvt_engine_opts o;

	tsup_opts_init(&o);
	o.hbm_bytes = tsup_block_bytes();
	o.host_bytes = (uint64_t)host_blocks * tsup_block_bytes();
	*dir = NULL;
	if (nvme_blocks) {
		*dir = tsup_mkdtemp();
		o.nvme_dir = *dir;
		o.nvme_bytes = (uint64_t)nvme_blocks * (4096 + 4096);
	}
	return tsup_create(&o, hooks);
}

static void
store_ids(struct kvt_engine *e, struct pool *p, uint32_t tenant, const uint32_t *ids,
	  const uint64_t *h, size_t n)
{
	struct kvt_ext_fail f[NB];
	struct kvt_ext_done d;
	uint64_t job;
	int rc = kvt_ext_store(e, p->id, tenant, h, ids, n, NULL, &job);

	if (rc)
		print_error("store: %s\n", kvt_last_error_message());
	assert_int_equal(rc, 0);
	d = tsup_ext_finish(e, p->id, job, f, NB);
	assert_int_equal(d.kind, KVT_EXT_STORE);
	assert_int_equal(d.status, 0);
	assert_int_equal(d.n_failed, 0);
}

/* Store blocks 0..7 under hash_of(0..7), load them into 8..15 (and 31..24): every byte. */
static void
roundtrip(uint32_t host_blocks, uint32_t nvme_blocks, uint32_t flags)
{
	char *dir;
	struct kvt_engine *e = engine(host_blocks, nvme_blocks, &dir, NULL);
	struct pool p;
	uint32_t ids[8], to[8], i;
	uint64_t h[8], job;
	struct kvt_ext_fail f[8];
	struct kvt_ext_done d;

	pool_make(e, &p);
	for (i = 0; i < 8; i++) {
		ids[i] = i;
		h[i] = hash_of(i);
		fill(&p, i, i + 1);
	}
	store_ids(e, &p, 0, ids, h, 8);
	assert_int_equal(kvt_engine_drain(e), 0);
	tsup_check_engine(e);
	for (int round = 0; round < 2; round++) {
		for (i = 0; i < 8; i++) {
			to[i] = round ? 31 - i : 8 + i;
			wipe(&p, to[i]);
		}
		assert_int_equal(kvt_ext_load(e, p.id, 0, h, to, 8, flags, &job), 0);
		if (flags & KVT_EXT_LAYERWISE)
			for (uint32_t l = 0; l < TSUP_LAYERS; l++)
				assert_int_equal(kvt_ext_wait_layer(e, p.id, job, l, NULL), 0);
		d = tsup_ext_finish(e, p.id, job, f, 8);
		for (i = 0; i < d.n_failed; i++)
			print_error("load: block %u failed: %s\n", f[d.failed_first + i].block_id,
				    kvt_strerror(f[d.failed_first + i].err));
		assert_int_equal(d.kind, KVT_EXT_LOAD);
		assert_int_equal(d.n_failed, 0);
		assert_int_equal(d.status, 0);
		for (i = 0; i < 8; i++)
			assert_true(holds(&p, to[i], i + 1));
	}
	/* the sources were not touched */
	for (i = 0; i < 8; i++)
		assert_true(holds(&p, i, i + 1));
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	pool_free(&p);
	tsup_rmdir(dir);
}

static void
test_roundtrip_host(void **state)
{
	(void)state;
	roundtrip(16, 0, 0);
}

/* HOST holds 2 blocks: the other 6 go down to NVMe and are read back (checksums verified) */
static void
test_roundtrip_nvme(void **state)
{
	(void)state;
	roundtrip(2, 32, 0);
	roundtrip(3, 32, KVT_EXT_LAYERWISE);
}

static void
test_roundtrip_layerwise(void **state)
{
	(void)state;
	roundtrip(16, 0, KVT_EXT_LAYERWISE);
}

/* One cross-layer tensor [NB][TSUP_LAYERS][2][SEG] (a single entry), and a K-only layout. */
static void
test_cross_layer_and_k_only(void **state)
{
	char *dir;
	struct kvt_engine *e = engine(16, 0, &dir, NULL);
	size_t bstride = (size_t)TSUP_LAYERS * 2 * SEG;
	uint8_t *mem = malloc(NB * bstride);
	struct kvt_ext_layer L = { .base = (uintptr_t)mem, .block_stride = bstride,
				   .layer_stride = 2 * SEG, .k_offset = 0, .v_offset = SEG,
				   .k_bytes = SEG, .v_bytes = SEG, .n_layers = TSUP_LAYERS };
	struct kvt_ext_opts o;
	uint32_t pool, src[3] = { 0, 1, 2 }, dst[3] = { 9, 5, 20 };
	uint64_t h[3] = { 11, 12, 13 }, job;
	struct kvt_ext_done d;
	struct kvt_ext_fail f[3];
	size_t i;

	(void)state;
	assert_non_null(mem);
	for (i = 0; i < NB * bstride; i++)
		mem[i] = (uint8_t)(i * 7 + (i >> 9));
	kvt_ext_opts_init(&o, sizeof o);
	o.n_blocks = NB;
	o.n_entries = 1;
	o.layers = &L;
	assert_int_equal(kvt_ext_register(e, &o, &pool), 0);
	assert_int_equal(kvt_ext_store(e, pool, 0, h, src, 3, NULL, &job), 0);
	d = tsup_ext_finish(e, pool, job, f, 3);
	assert_int_equal(d.n_failed, 0);
	assert_int_equal(kvt_ext_load(e, pool, 0, h, dst, 3, 0, &job), 0);
	d = tsup_ext_finish(e, pool, job, f, 3);
	assert_int_equal(d.n_failed, 0);
	for (i = 0; i < 3; i++)
		assert_memory_equal(mem + dst[i] * bstride, mem + src[i] * bstride, bstride);
	assert_int_equal(kvt_ext_unregister(e, pool), 0);

	/* K only (MLA latent): v_offset KVT_EXT_NO_V, the pages of one tensor [NB][SEG] */
	L = (struct kvt_ext_layer){ .base = (uintptr_t)mem, .block_stride = SEG, .k_bytes = SEG,
				    .v_offset = KVT_EXT_NO_V, .n_layers = 1 };
	assert_int_equal(kvt_ext_register(e, &o, &pool), 0);
	assert_int_equal(kvt_ext_store(e, pool, 0, h, src, 3, NULL, &job), 0);
	assert_int_equal(tsup_ext_finish(e, pool, job, f, 3).n_failed, 0);
	assert_int_equal(kvt_ext_load(e, pool, 0, h, dst, 3, 0, &job), 0);
	assert_int_equal(tsup_ext_finish(e, pool, job, f, 3).n_failed, 0);
	for (i = 0; i < 3; i++)
		assert_memory_equal(mem + dst[i] * SEG, mem + src[i] * SEG, SEG);
	tsup_check_engine(e);
	kvt_engine_destroy(e); /* frees the registered pool */
	free(mem);
	tsup_rmdir(dir);
}

/* lookup counts the LEADING stored hashes, per tenant; skipped and dropped hashes */
static void
test_lookup_leading(void **state)
{
	char *dir;
	struct kvt_engine *e = engine(16, 0, &dir, NULL);
	struct pool p;
	uint32_t ids[4] = { 0, 1, 2, 4 };
	uint64_t h[6], job;
	enum kvt_tier tier;
	size_t hits;
	struct kvt_ext_fail f[4];
	struct kvt_ext_done d;

	(void)state;
	pool_make(e, &p);
	for (int i = 0; i < 6; i++)
		h[i] = hash_of(100 + i);
	{
		uint64_t hs[4] = { h[0], h[1], h[2], h[4] };

		store_ids(e, &p, 7, ids, hs, 4);
	}
	assert_int_equal(kvt_ext_lookup(e, p.id, 7, h, 6, &hits, &tier), 0);
	assert_int_equal(hits, 3);
	assert_int_equal(tier, KVT_TIER_HOST);
	assert_int_equal(kvt_ext_lookup(e, p.id, 7, h + 4, 2, &hits, NULL), 0);
	assert_int_equal(hits, 1);
	/* another tenant sees none of them */
	assert_int_equal(kvt_ext_lookup(e, p.id, 8, h, 6, &hits, &tier), 0);
	assert_int_equal(hits, 0);
	assert_int_equal(tier, KVT_TIER_COUNT);
	/* storing them again skips them */
	assert_int_equal(kvt_ext_store(e, p.id, 7, h, ids, 2, NULL, &job), 0);
	d = tsup_ext_finish(e, p.id, job, f, 4);
	assert_int_equal(d.n_skipped, 2);
	assert_int_equal(d.n_failed, 0);
	/* touch finds 3 of 4, drop makes the run end at h[1] */
	assert_int_equal(kvt_ext_touch(e, p.id, 7, h, 4), 3);
	assert_int_equal(kvt_ext_drop(e, p.id, 7, h + 1, 1), 1);
	assert_int_equal(kvt_ext_lookup(e, p.id, 7, h, 6, &hits, NULL), 0);
	assert_int_equal(hits, 1);
	/* a load of a missing hash fails that block alone */
	{
		uint32_t to[3] = { 10, 11, 12 };
		uint64_t hl[3] = { h[0], h[1], h[2] };

		fill(&p, 0, 5);
		assert_int_equal(kvt_ext_store(e, p.id, 7, hl, ids, 1, NULL, &job), 0);
		d = tsup_ext_finish(e, p.id, job, f, 4); /* h[0] already there: skipped */
		assert_int_equal(kvt_ext_load(e, p.id, 7, hl, to, 3, 0, &job), 0);
		/* no room for its failure: -ENOSPC, the job stays for the next poll */
		assert_int_equal(kvt_ext_wait(e, p.id, job, 60000), 0);
		assert_int_equal(kvt_ext_poll(e, p.id, &d, 1, NULL, 0), -ENOSPC);
		assert_int_equal(d.job, job);
		assert_int_equal(d.n_failed, 1);
		d = tsup_ext_finish(e, p.id, job, f, 4);
		assert_int_equal(d.n_failed, 1);
		assert_int_equal(f[d.failed_first].block_id, 11);
		assert_int_equal(f[d.failed_first].err, -ENOENT);
		assert_int_equal(d.status, -ENOENT);
	}
	{
		struct kvt_ext_stats st = { .size = sizeof st };

		assert_int_equal(kvt_ext_stats(e, p.id, &st), 0);
		assert_int_equal(st.stored_blocks, 3);
		assert_int_equal(st.blocks_stored, 4);
		assert_int_equal(st.lookups, 4);
	}
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	pool_free(&p);
	tsup_rmdir(dir);
}

/* ---- a block corrupted on NVMe: only it fails */

static int corrupt_reads; /* reads to corrupt (each flips a byte of the data) */
static int reads_seen;

static void
corrupt_hook(void *arg, bool is_write, uint32_t slot, void *buf, size_t len, uint64_t off,
	     int *res)
{
	(void)arg, (void)slot, (void)off;
	if (is_write || *res <= 0)
		return;
	reads_seen++;
	/* slots of 8 KiB from 1 MiB on: [header page | data page]; flip a byte of the data */
	if (corrupt_reads > 0 && len >= 8192) {
		corrupt_reads--;
		((uint8_t *)buf)[4096 + 10] ^= 0x40;
	} else if (corrupt_reads > 0 && off % 8192 == 4096) {
		corrupt_reads--;
		((uint8_t *)buf)[10] ^= 0x40;
	}
}

static const struct kvt_nvme_fault_hooks corrupt_hooks = { .on_complete = corrupt_hook };

static void
test_corrupt_block_only_it_fails(void **state)
{
	char *dir;
	struct kvt_engine *e;
	struct pool p;
	uint32_t ids[8], to[8], i, bad;
	uint64_t h[8], job;
	struct kvt_ext_fail f[8];
	struct kvt_ext_done d;
	struct kvt_stats st;
	size_t hits;

	(void)state;
	e = engine(2, 32, &dir, &corrupt_hooks);
	pool_make(e, &p);
	for (i = 0; i < 8; i++) {
		ids[i] = i;
		h[i] = hash_of(200 + i);
		fill(&p, i, 40 + i);
	}
	store_ids(e, &p, 3, ids, h, 8);
	assert_int_equal(kvt_engine_drain(e), 0);
	st = tsup_stats(e);
	assert_true(st.blocks_moved[KVT_MOVE_HOST_TO_NVME] >= 6);
	for (i = 0; i < 8; i++) {
		to[i] = 16 + i;
		wipe(&p, to[i]);
	}
	corrupt_reads = 1;
	reads_seen = 0;
	assert_int_equal(kvt_ext_load(e, p.id, 3, h, to, 8, 0, &job), 0);
	d = tsup_ext_finish(e, p.id, job, f, 8);
	assert_true(reads_seen >= 1);
	assert_int_equal(corrupt_reads, 0);
	assert_int_equal(d.n_failed, 1);
	assert_int_equal(d.status, KVT_ECORRUPT);
	assert_int_equal(f[d.failed_first].err, KVT_ECORRUPT);
	bad = f[d.failed_first].block_id;
	assert_true(bad >= 16 && bad < 24);
	for (i = 0; i < 8; i++)
		if (to[i] != bad)
			assert_true(holds(&p, to[i], 40 + i));
	st = tsup_stats(e);
	assert_int_equal(st.checksum_failed, 1);
	/* the corrupt block is gone: lookup stops there, a second load fails it as missing */
	assert_int_equal(kvt_ext_lookup(e, p.id, 3, h, 8, &hits, NULL), 0);
	assert_int_equal(hits, bad - 16);
	assert_int_equal(kvt_ext_load(e, p.id, 3, h + (bad - 16), &to[bad - 16], 1, 0, &job), 0);
	d = tsup_ext_finish(e, p.id, job, f, 8);
	assert_int_equal(d.n_failed, 1);
	assert_int_equal(f[d.failed_first].err, -ENOENT);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	pool_free(&p);
	tsup_rmdir(dir);
}

/* ---- bad input */

static int
reg(struct kvt_engine *e, const struct kvt_ext_layer *L, uint32_t n, uint32_t nb, uint32_t *id)
{
	struct kvt_ext_opts o;

	kvt_ext_opts_init(&o, sizeof o);
	o.n_blocks = nb;
	o.n_entries = n;
	o.layers = L;
	return kvt_ext_register(e, &o, id);
}

static void
expect_msg(int rc, int code, const char *needle)
{
	assert_int_equal(rc, code);
	if (!strstr(kvt_last_error_message(), needle))
		fail_msg("message \"%s\" lacks \"%s\"", kvt_last_error_message(), needle);
}

static void
test_bad_input(void **state)
{
	char *dir;
	struct kvt_engine *e = engine(16, 0, &dir, NULL);
	static uint8_t mem[2 * NB * SEG * 4];
	uintptr_t b = (uintptr_t)mem;
	struct kvt_ext_layer L[2] = {
		{ .base = b, .block_stride = SEG, .v_offset = NB * SEG, .k_bytes = SEG,
		  .v_bytes = SEG, .n_layers = 1 },
		{ .base = b + 2 * NB * SEG, .block_stride = SEG, .v_offset = NB * SEG,
		  .k_bytes = SEG, .v_bytes = SEG, .n_layers = 1 },
	}, M[2];
	uint32_t id = 99, ids[2] = { 0, 1 };
	uint64_t h[2] = { 1, 2 }, job = 5;
	size_t hits;
	struct kvt_ext_done d[2];

	(void)state;
	/* no pool registered */
	expect_msg(kvt_ext_store(e, 1, 0, h, ids, 2, NULL, &job), -ENOENT, "not registered");
	assert_int_equal(job, 0);
	expect_msg(kvt_ext_lookup(e, 1, 0, h, 2, &hits, NULL), -ENOENT, "not registered");
	expect_msg(kvt_ext_poll(e, 1, d, 2, NULL, 0), -ENOENT, "not registered");
	expect_msg(kvt_ext_unregister(e, 1), -ENOENT, "not registered");
	/* zero strides and sizes */
	memcpy(M, L, sizeof M);
	M[1].block_stride = 0;
	expect_msg(reg(e, M, 2, NB, &id), -EINVAL, "block_stride is 0");
	assert_int_equal(id, 0);
	memcpy(M, L, sizeof M);
	M[0].k_bytes = 0;
	expect_msg(reg(e, M, 2, NB, &id), -EINVAL, "k_bytes is 0");
	memcpy(M, L, sizeof M);
	M[0].n_layers = 2;
	expect_msg(reg(e, M, 1, NB, &id), -EINVAL, "layer_stride 0");
	/* overlapping layouts: V on top of K of other blocks; a stride below the segment; two
	 * layers on the same memory; a segment past the block's stride */
	memcpy(M, L, sizeof M);
	M[0].v_offset = 3 * SEG;
	expect_msg(reg(e, M, 2, NB, &id), -EINVAL, "overlap");
	memcpy(M, L, sizeof M);
	M[0].block_stride = SEG / 2;
	expect_msg(reg(e, M, 2, NB, &id), -EINVAL, "exceeds block_stride");
	memcpy(M, L, sizeof M);
	M[1].base = L[0].base + 64;
	expect_msg(reg(e, M, 2, NB, &id), -EINVAL, "overlap");
	/* interleaved without overlap is fine: K/V of two layers in one [NB][4][SEG] tensor */
	memcpy(M, L, sizeof M);
	M[0] = (struct kvt_ext_layer){ .base = b, .block_stride = 4 * SEG, .v_offset = SEG,
				       .k_bytes = SEG, .v_bytes = SEG, .n_layers = 1 };
	M[1] = M[0];
	M[1].base = b + 2 * SEG;
	assert_int_equal(reg(e, M, 2, NB, &id), 0);
	assert_int_equal(kvt_ext_unregister(e, id), 0);
	M[1].base = b + SEG; /* its K on layer 0's V */
	expect_msg(reg(e, M, 2, NB, &id), -EINVAL, "overlap");
	/* more bytes than a slot holds; the V flag without bytes */
	memcpy(M, L, sizeof M);
	M[0].k_bytes = M[0].v_bytes = SEG; /* fine */
	M[0].n_layers = 3;
	M[0].layer_stride = 2 * NB * SEG * 2;
	expect_msg(reg(e, M, 1, NB, &id), -EINVAL, "block_bytes");
	memcpy(M, L, sizeof M);
	M[0].v_offset = KVT_EXT_NO_V;
	expect_msg(reg(e, M, 2, NB, &id), -EINVAL, "v_bytes");
	expect_msg(reg(e, L, 2, 0, &id), -EINVAL, "n_blocks");
	expect_msg(reg(e, L, 0, NB, &id), -EINVAL, "entries");
	/* a good one; a second is refused */
	assert_int_equal(reg(e, L, 2, NB, &id), 0);
	{
		uint32_t id2;

		expect_msg(reg(e, L, 2, NB, &id2), -EEXIST, "already registered");
	}
	/* ids out of range, duplicates, NULLs, flags, a wrong pool id */
	ids[1] = NB;
	expect_msg(kvt_ext_store(e, id, 0, h, ids, 2, NULL, &job), -EINVAL, "block_ids[1]");
	expect_msg(kvt_ext_load(e, id, 0, h, ids, 2, 0, &job), -EINVAL, "block_ids[1]");
	ids[1] = 0;
	expect_msg(kvt_ext_store(e, id, 0, h, ids, 2, NULL, &job), -EINVAL, "given twice");
	ids[1] = 1;
	h[1] = h[0];
	expect_msg(kvt_ext_store(e, id, 0, h, ids, 2, NULL, &job), -EINVAL, "given twice");
	h[1] = 2;
	expect_msg(kvt_ext_store(e, id, 0, NULL, ids, 2, NULL, &job), -EINVAL, "NULL");
	expect_msg(kvt_ext_load(e, id, 0, h, ids, 2, 8, &job), -EINVAL, "flags");
	expect_msg(kvt_ext_store(e, id + 1, 0, h, ids, 2, NULL, &job), -ENOENT, "pool");
	expect_msg(kvt_ext_wait(e, id, 12345, 0), -ENOENT, "no job");
	expect_msg(kvt_ext_lookup(e, id, 0, NULL, 2, &hits, NULL), -EINVAL, "NULL");
	/* nothing was queued by the refused calls; the engine is still usable */
	assert_int_equal(kvt_ext_poll(e, id, d, 2, NULL, 0), 0);
	assert_int_equal(kvt_ext_store(e, id, 0, h, ids, 2, NULL, &job), 0);
	assert_int_equal(kvt_ext_wait(e, id, job, 60000), 0);
	{
		struct kvt_ext_fail f[2];

		assert_int_equal(kvt_ext_poll(e, id, d, 2, f, 2), 1);
		assert_int_equal(d[0].n_failed, 0);
	}
	/* the job was reported: waiting for it again is an error */
	expect_msg(kvt_ext_wait(e, id, job, 0), -ENOENT, "no job");
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* ---- restart with a persistent store: the blocks stored before are hits after it */
static void
test_restart_persistent_hits(void **state)
{
	char *dir = tsup_mkdtemp();
	struct kvt_engine_opts o;
	struct kvt_engine *e;
	struct pool p, q;
	uint32_t ids[6], to[6], i;
	uint64_t h[6], job;
	struct kvt_ext_fail f[6];
	struct kvt_ext_done d;
	struct kvt_ext_stats st = { .size = sizeof st };
	size_t hits;
	enum kvt_tier tier;

	(void)state;
	tsup_store_opts(&o, dir, 32 * 8192);
	e = tsup_create(&o, NULL);
	pool_make(e, &p);
	for (i = 0; i < 6; i++) {
		ids[i] = i;
		h[i] = hash_of(300 + i);
		fill(&p, i, 60 + i);
	}
	store_ids(e, &p, 4, ids, h, 6);
	/* written through to NVMe and published: poll (progress) until all six are */
	for (int k = 0; k < 1000; k++) {
		assert_int_equal(kvt_engine_drain(e), 0);
		assert_true(kvt_ext_poll(e, p.id, &d, 1, f, 6) >= 0);
		assert_int_equal(kvt_ext_stats(e, p.id, &st), 0);
		if (st.persisted_blocks == 6)
			break;
	}
	assert_int_equal(st.persisted_blocks, 6);
	tsup_check_engine(e);
	kvt_engine_destroy(e);

	/* a new process: same store; a new pool (other memory) */
	e = tsup_create(&o, NULL);
	pool_make(e, &q);
	assert_int_equal(kvt_ext_lookup(e, q.id, 4, h, 6, &hits, &tier), 0);
	assert_int_equal(hits, 6);
	assert_int_equal(tier, KVT_TIER_NVME);
	assert_int_equal(kvt_ext_lookup(e, q.id, 5, h, 6, &hits, NULL), 0);
	assert_int_equal(hits, 0); /* another tenant */
	for (i = 0; i < 6; i++) {
		to[i] = 20 + i;
		wipe(&q, to[i]);
	}
	assert_int_equal(kvt_ext_load(e, q.id, 4, h, to, 6, 0, &job), 0);
	d = tsup_ext_finish(e, q.id, job, f, 6);
	assert_int_equal(d.n_failed, 0);
	for (i = 0; i < 6; i++)
		assert_true(holds(&q, to[i], 60 + i));
	/* the records are the pool's: not sessions a caller may list or restore */
	{
		uint64_t keys[8];

		assert_int_equal(kvt_session_list(e, keys, 8), 0);
	}
	/* a dropped block is gone after the next restart too */
	assert_int_equal(kvt_ext_drop(e, q.id, 4, h + 5, 1), 1);
	assert_int_equal(kvt_ext_poll(e, q.id, &d, 1, f, 6), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	e = tsup_create(&o, NULL);
	pool_free(&q);
	pool_make(e, &q);
	assert_int_equal(kvt_ext_lookup(e, q.id, 4, h, 6, &hits, NULL), 0);
	assert_int_equal(hits, 5);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	pool_free(&p);
	pool_free(&q);
	tsup_rmdir(dir);
}

/* Stored, then the engine destroyed at once (the write-through to NVMe not started or not
 * landed): destroy finishes and publishes it, so the next process finds every block (the
 * SGLang backend's restart test failed this way: 1 of 6 found). */
static void
test_destroy_publishes_stored(void **state)
{
	char *dir = tsup_mkdtemp();
	struct kvt_engine_opts o;
	struct kvt_engine *e;
	struct pool p, q;
	uint32_t ids[6], to[6], i;
	uint64_t h[6], job;
	struct kvt_ext_fail f[6];
	struct kvt_ext_done d;
	size_t hits;

	(void)state;
	tsup_store_opts(&o, dir, 32 * 8192);
	e = tsup_create(&o, NULL);
	pool_make(e, &p);
	for (i = 0; i < 6; i++) {
		ids[i] = i;
		h[i] = hash_of(700 + i);
		fill(&p, i, 90 + i);
	}
	store_ids(e, &p, 2, ids, h, 6);
	kvt_engine_destroy(e); /* no poll, no drain before */
	e = tsup_create(&o, NULL);
	pool_make(e, &q);
	assert_int_equal(kvt_ext_lookup(e, q.id, 2, h, 6, &hits, NULL), 0);
	assert_int_equal(hits, 6);
	for (i = 0; i < 6; i++) {
		to[i] = 10 + i;
		wipe(&q, to[i]);
	}
	assert_int_equal(kvt_ext_load(e, q.id, 2, h, to, 6, 0, &job), 0);
	d = tsup_ext_finish(e, q.id, job, f, 6);
	assert_int_equal(d.n_failed, 0);
	for (i = 0; i < 6; i++)
		assert_true(holds(&q, to[i], 90 + i));
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	pool_free(&p);
	pool_free(&q);
	tsup_rmdir(dir);
}

/* ---- kvt_ext_removed: the exact removal feed a scheduler's mirror of the store is kept by */

/* 1 if @h is stored for @tenant (kvt_ext_lookup of it alone). */
static size_t
stored(struct kvt_engine *e, struct pool *p, uint32_t tenant, uint64_t h)
{
	size_t hits = 0;

	assert_int_equal(kvt_ext_lookup(e, p->id, tenant, &h, 1, &hits, NULL), 0);
	return hits;
}

static void
test_removed_feed(void **state)
{
	char *dir;
	struct kvt_engine *e = engine(16, 0, &dir, NULL); /* HOST only: 16 blocks */
	struct pool p;
	struct kvt_ext_removal out[64];
	uint32_t ids[8];
	uint64_t h[48], lost = 7;
	bool gone[48] = { false };
	int n, total = 0;

	(void)state;
	pool_make(e, &p);
	/* nothing removed yet */
	assert_int_equal(kvt_ext_removed(e, p.id, out, 64, &lost), 0);
	assert_int_equal(lost, 0);
	for (uint32_t i = 0; i < 48; i++)
		h[i] = hash_of(300 + i);
	/* 6 jobs of 8 blocks into 16 HOST slots: at least 32 stored blocks are evicted */
	for (uint32_t r = 0; r < 6; r++) {
		for (uint32_t i = 0; i < 8; i++) {
			ids[i] = i;
			fill(&p, i, r * 8 + i);
		}
		store_ids(e, &p, 3, ids, h + r * 8, 8);
	}
	while ((n = kvt_ext_removed(e, p.id, out, 5, &lost)) > 0) { /* drained 5 at a time */
		assert_int_equal(lost, 0);
		for (int k = 0; k < n; k++) {
			int i = -1;

			for (int j = 0; j < 48; j++)
				if (h[j] == out[k].hash)
					i = j;
			assert_true(i >= 0);
			assert_int_equal(out[k].tenant, 3);
			assert_false(gone[i]); /* each removal once */
			gone[i] = true;
			total++;
		}
	}
	assert_int_equal(n, 0);
	assert_true(total >= 32);
	/* the feed is exact: reported <=> not found */
	for (uint32_t i = 0; i < 48; i++)
		assert_int_equal(stored(e, &p, 3, h[i]), gone[i] ? 0 : 1);
	/* a drop is reported; a drop of an absent hash is not */
	for (uint32_t i = 0; i < 48; i++)
		if (!gone[i]) {
			assert_int_equal(kvt_ext_drop(e, p.id, 3, &h[i], 1), 1);
			assert_int_equal(kvt_ext_drop(e, p.id, 3, &h[i], 1), 0);
			assert_int_equal(kvt_ext_removed(e, p.id, out, 64, &lost), 1);
			assert_true(out[0].hash == h[i]);
			assert_int_equal(stored(e, &p, 3, h[i]), 0);
			break;
		}
	/* bad input */
	assert_int_equal(kvt_ext_removed(e, p.id, NULL, 1, &lost), -EINVAL);
	assert_int_equal(kvt_ext_removed(e, p.id, out, 1, NULL), -EINVAL);
	assert_int_equal(kvt_ext_removed(NULL, p.id, out, 1, &lost), -EINVAL);
	assert_int_equal(kvt_ext_removed(e, p.id + 1, out, 1, &lost), -ENOENT);
	assert_int_equal(kvt_ext_removed(e, p.id, NULL, 0, &lost), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	pool_free(&p);
	tsup_rmdir(dir);
}

/* A drop while a load pins the block (a slow emulated link keeps the load in flight): the
 * removal is reported at the drop (lookup stops finding it then), not again at the free. */
static void
test_removed_drop_while_loading(void **state)
{
	char *dir;
	struct kvt_engine_opts o;
	struct kvt_engine *e;
	struct pool p;
	struct kvt_ext_removal out[4];
	struct kvt_ext_fail f[2];
	uint32_t id0 = 0, to = 20;
	uint64_t h = hash_of(900), job, lost;

	(void)state;
	tsup_opts_init(&o);
	o.hbm_bytes = tsup_block_bytes();
	o.host_bytes = 16ull * tsup_block_bytes();
	o.emu_copy_bytes_per_s = 20000; /* a block's copy takes about 0.2 s */
	dir = NULL;
	e = tsup_create(&o, NULL);
	pool_make(e, &p);
	fill(&p, 0, 9);
	store_ids(e, &p, 1, &id0, &h, 1);
	assert_int_equal(kvt_ext_load(e, p.id, 1, &h, &to, 1, 0, &job), 0);
	assert_int_equal(kvt_ext_drop(e, p.id, 1, &h, 1), 1);
	assert_int_equal(stored(e, &p, 1, h), 0);
	assert_int_equal(kvt_ext_removed(e, p.id, out, 4, &lost), 1);
	assert_true(out[0].hash == h);
	(void)tsup_ext_finish(e, p.id, job, f, 2);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_ext_poll(e, p.id, NULL, 0, NULL, 0), 0);
	assert_int_equal(kvt_ext_removed(e, p.id, out, 4, &lost), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	pool_free(&p);
	tsup_rmdir(dir);
}

/* A ring of 4 that is not drained: the oldest removals are overwritten and counted lost. */
static void
test_removed_overflow(void **state)
{
	char *dir;
	struct kvt_engine *e = engine(8, 0, &dir, NULL);
	struct pool p;
	struct kvt_ext_removal out[8];
	uint32_t ids[8];
	uint64_t h[24], lost = 0;
	int n;

	(void)state;
	pool_make_cap(e, &p, 4);
	for (uint32_t i = 0; i < 24; i++)
		h[i] = hash_of(500 + i);
	for (uint32_t r = 0; r < 3; r++) {
		for (uint32_t i = 0; i < 8; i++) {
			ids[i] = i;
			fill(&p, i, r * 8 + i);
		}
		store_ids(e, &p, 0, ids, h + r * 8, 8);
	}
	n = kvt_ext_removed(e, p.id, out, 8, &lost);
	assert_int_equal(n, 4);
	assert_true(lost >= 12); /* 16 or more evicted, 4 held */
	for (int k = 0; k < n; k++)
		assert_int_equal(stored(e, &p, 0, out[k].hash), 0);
	/* the count is reset by the drain */
	assert_int_equal(kvt_ext_removed(e, p.id, out, 8, &lost), 0);
	assert_int_equal(lost, 0);
	kvt_engine_destroy(e);
	pool_free(&p);
	tsup_rmdir(dir);
	/* removed_cap out of range */
	{
		struct kvt_engine *e2 = engine(8, 0, &dir, NULL);
		struct kvt_ext_opts o;
		uint32_t id;

		pool_make(e2, &p); /* for the layers */
		kvt_engine_destroy(e2);
		pool_free(&p);
		e2 = engine(8, 0, &dir, NULL);
		kvt_ext_opts_init(&o, sizeof o);
		o.n_blocks = NB;
		o.n_entries = TSUP_LAYERS;
		o.layers = p.lay;
		o.removed_cap = (1u << 24) + 1;
		assert_int_equal(kvt_ext_register(e2, &o, &id), -EINVAL);
		assert_non_null(strstr(kvt_last_error_message(), "removed_cap"));
		kvt_engine_destroy(e2);
		tsup_rmdir(dir);
	}
}

/* ---- kvt_ext_hold / kvt_ext_release / kvt_ext_clear (vLLM's prepare_load ... complete_load,
 * reset_cache) */

static struct kvt_engine *
engine_flat(uint32_t host_blocks)
{
	struct kvt_engine_opts o;

	tsup_opts_init(&o);
	o.hbm_bytes = tsup_block_bytes();
	o.host_bytes = (uint64_t)host_blocks * tsup_block_bytes();
	o.high_watermark = o.low_watermark = 1.0f; /* HOST-only: no background drops */
	return tsup_create(&o, NULL);
}

/* A store job of @n blocks (ids @ids, hashes @h); returns its record, failures in @f. */
static struct kvt_ext_done
store_job(struct kvt_engine *e, struct pool *p, uint32_t tenant, const uint32_t *ids,
	  const uint64_t *h, size_t n, struct kvt_ext_fail *f)
{
	uint64_t job;

	assert_int_equal(kvt_ext_store(e, p->id, tenant, h, ids, n, NULL, &job), 0);
	return tsup_ext_finish(e, p->id, job, f, NB);
}

/* HOST (no NVMe) full of held blocks: a store that needs room fails alone (-ENOSPC) instead
 * of evicting what a scheduler promised to load; after the release it finds room. */
static void
test_hold_protects_promised_loads(void **state)
{
	struct kvt_engine *e = engine_flat(4);
	struct pool p;
	uint32_t ids[4] = { 0, 1, 2, 3 }, more[2] = { 4, 5 }, to[4] = { 10, 11, 12, 13 };
	uint64_t h[4], h2[2] = { hash_of(40), hash_of(41) }, job;
	struct kvt_ext_fail f[NB];
	struct kvt_ext_done d;

	(void)state;
	pool_make(e, &p);
	for (uint32_t i = 0; i < 6; i++)
		fill(&p, i, 70 + i);
	for (uint32_t i = 0; i < 4; i++)
		h[i] = hash_of(30 + i);
	d = store_job(e, &p, 0, ids, h, 4, f);
	assert_int_equal(d.n_failed, 0);
	assert_int_equal(kvt_ext_hold(e, p.id, 0, h, 4), 4);
	d = store_job(e, &p, 0, more, h2, 2, f);
	assert_int_equal(d.n_failed, 2);
	assert_int_equal(f[d.failed_first].err, -ENOSPC);
	{
		size_t hits = 0;

		assert_int_equal(kvt_ext_lookup(e, p.id, 0, h, 4, &hits, NULL), 0);
		assert_int_equal(hits, 4);
	}
	for (uint32_t i = 0; i < 4; i++)
		wipe(&p, to[i]);
	assert_int_equal(kvt_ext_load(e, p.id, 0, h, to, 4, 0, &job), 0);
	d = tsup_ext_finish(e, p.id, job, f, NB);
	assert_int_equal(d.n_failed, 0);
	for (uint32_t i = 0; i < 4; i++)
		assert_true(holds(&p, to[i], 70 + i));
	/* not held / absent: ignored */
	assert_int_equal(kvt_ext_release(e, p.id, 0, h2, 2), 0);
	assert_int_equal(kvt_ext_hold(e, p.id, 0, h2, 2), 0);
	assert_int_equal(kvt_ext_release(e, p.id, 0, h, 4), 4);
	assert_int_equal(kvt_ext_release(e, p.id, 0, h, 4), 0); /* one hold each: ended */
	d = store_job(e, &p, 0, more, h2, 2, f);
	assert_int_equal(d.n_failed, 0);
	tsup_check_engine(e);
	assert_int_equal(kvt_ext_hold(NULL, p.id, 0, h, 1), -EINVAL);
	assert_int_equal(kvt_ext_release(e, p.id, 0, NULL, 1), -EINVAL);
	assert_int_equal(kvt_ext_hold(e, p.id + 9, 0, h, 1), -ENOENT);
	kvt_engine_destroy(e);
	pool_free(&p);
}

/* A held block that is dropped is not found at once and is freed at its last release; held
 * twice, it takes two releases. */
static void
test_drop_while_held(void **state)
{
	struct kvt_engine *e = engine_flat(8);
	struct pool p;
	uint32_t ids[2] = { 0, 1 };
	uint64_t h[2] = { hash_of(50), hash_of(51) };
	struct kvt_ext_fail f[NB];
	struct kvt_ext_stats st = { .size = sizeof st };
	struct kvt_ext_removal rm[4];
	uint64_t lost;
	size_t hits;

	(void)state;
	pool_make(e, &p);
	fill(&p, 0, 1);
	fill(&p, 1, 2);
	assert_int_equal(store_job(e, &p, 0, ids, h, 2, f).n_failed, 0);
	assert_int_equal(kvt_ext_removed(e, p.id, rm, 4, &lost), 0);
	assert_int_equal(kvt_ext_hold(e, p.id, 0, h, 1), 1);
	assert_int_equal(kvt_ext_hold(e, p.id, 0, h, 1), 1);
	assert_int_equal(kvt_ext_drop(e, p.id, 0, h, 1), 1);
	assert_int_equal(kvt_ext_lookup(e, p.id, 0, h, 2, &hits, NULL), 0);
	assert_int_equal(hits, 0);
	assert_int_equal(kvt_ext_removed(e, p.id, rm, 4, &lost), 1); /* reported once, now */
	assert_int_equal(kvt_ext_release(e, p.id, 0, h, 1), 1);
	assert_int_equal(kvt_ext_stats(e, p.id, &st), 0);
	assert_int_equal(st.stored_blocks, 1); /* still held once: freed at the last release */
	assert_int_equal(kvt_ext_release(e, p.id, 0, h, 1), 1);
	assert_int_equal(kvt_ext_stats(e, p.id, &st), 0);
	assert_int_equal(st.stored_blocks, 1); /* h[1] */
	assert_int_equal(kvt_ext_removed(e, p.id, rm, 4, &lost), 0); /* no second report */
	assert_int_equal(kvt_ext_release(e, p.id, 0, h, 1), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	pool_free(&p);
}

/* kvt_ext_clear: one tenant's blocks, then all; a load job in flight keeps its blocks until
 * it ends (and loads them); a store in flight is dropped when it lands. */
static void
test_clear(void **state)
{
	struct kvt_engine *e = engine_flat(16);
	struct pool p;
	uint32_t ids[5] = { 0, 1, 2, 3, 4 }, to[3] = { 20, 21, 22 };
	uint64_t h[5], job;
	struct kvt_ext_fail f[NB];
	struct kvt_ext_done d;
	struct kvt_ext_stats st = { .size = sizeof st };
	size_t hits;

	(void)state;
	pool_make(e, &p);
	for (uint32_t i = 0; i < 5; i++) {
		h[i] = hash_of(60 + i);
		fill(&p, i, 90 + i);
	}
	assert_int_equal(store_job(e, &p, 1, ids, h, 3, f).n_failed, 0);
	assert_int_equal(store_job(e, &p, 2, ids + 3, h + 3, 2, f).n_failed, 0);
	/* a load of tenant 1's blocks in flight, then the clear */
	for (uint32_t i = 0; i < 3; i++)
		wipe(&p, to[i]);
	assert_int_equal(kvt_ext_load(e, p.id, 1, h, to, 3, 0, &job), 0);
	assert_int_equal(kvt_ext_clear(e, p.id, 1), 3);
	assert_int_equal(kvt_ext_lookup(e, p.id, 1, h, 3, &hits, NULL), 0);
	assert_int_equal(hits, 0);
	d = tsup_ext_finish(e, p.id, job, f, NB);
	assert_int_equal(d.n_failed, 0);
	for (uint32_t i = 0; i < 3; i++)
		assert_true(holds(&p, to[i], 90 + i));
	assert_int_equal(kvt_ext_lookup(e, p.id, 2, h + 3, 2, &hits, NULL), 0);
	assert_int_equal(hits, 2);
	assert_int_equal(kvt_ext_clear(e, p.id, KVT_EXT_ALL_TENANTS), 2);
	assert_int_equal(kvt_ext_stats(e, p.id, &st), 0);
	assert_int_equal(st.stored_blocks, 0);
	/* a store in flight when the clear comes: it lands and goes, never a hit */
	assert_int_equal(kvt_ext_store(e, p.id, 3, h, ids, 2, NULL, &job), 0);
	assert_true(kvt_ext_clear(e, p.id, 3) >= 0);
	d = tsup_ext_finish(e, p.id, job, f, NB);
	assert_int_equal(kvt_ext_lookup(e, p.id, 3, h, 2, &hits, NULL), 0);
	assert_int_equal(hits, 0);
	assert_int_equal(kvt_ext_clear(NULL, p.id, 0), -EINVAL);
	assert_int_equal(kvt_ext_clear(e, p.id + 9, 0), -ENOENT);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	pool_free(&p);
}

/* A drop or clear of a block whose transfer is in flight (here: its NVMe write-through, which
 * the poll that lands a store starts with nvme_persist) takes it out at once: lookups and
 * loads no longer find it, a second clear finds nothing, and a store of the hash stores anew
 * (the block used to stay findable, dead, and be freed under a load that used it). A store of
 * a dropped-but-held hash stores anew too, and the release frees only the old block. */
static void
test_forget_busy_and_held(void **state)
{
	char *dir = tsup_mkdtemp();
	struct kvt_engine_opts o;
	struct kvt_engine *e;
	struct pool p;
	uint32_t ids[2] = { 0, 1 }, to[2] = { 20, 21 };
	uint64_t h[2] = { hash_of(80), hash_of(81) }, job;
	struct kvt_ext_fail f[NB];
	struct kvt_ext_done d;
	size_t hits;

	(void)state;
	tsup_store_opts(&o, dir, 64 * 8192);
	o.hbm_bytes = tsup_block_bytes();
	e = tsup_create(&o, NULL);
	pool_make(e, &p);
	fill(&p, 0, 5);
	fill(&p, 1, 6);
	assert_int_equal(store_job(e, &p, 0, ids, h, 2, f).n_failed, 0);
	assert_int_equal(kvt_ext_clear(e, p.id, 0), 2);
	assert_int_equal(kvt_ext_lookup(e, p.id, 0, h, 2, &hits, NULL), 0);
	assert_int_equal(hits, 0);
	assert_int_equal(kvt_ext_clear(e, p.id, 0), 0);
	assert_int_equal(kvt_ext_load(e, p.id, 0, h, to, 2, 0, &job), 0);
	d = tsup_ext_finish(e, p.id, job, f, NB);
	assert_int_equal(d.n_failed, 2);
	assert_int_equal(f[d.failed_first].err, -ENOENT);
	assert_int_equal(kvt_engine_drain(e), 0);
	tsup_check_engine(e);
	/* stored anew, loads its bytes */
	assert_int_equal(store_job(e, &p, 0, ids, h, 2, f).n_skipped, 0);
	assert_int_equal(kvt_ext_lookup(e, p.id, 0, h, 2, &hits, NULL), 0);
	assert_int_equal(hits, 2);
	wipe(&p, 20);
	wipe(&p, 21);
	assert_int_equal(kvt_ext_load(e, p.id, 0, h, to, 2, 0, &job), 0);
	assert_int_equal(tsup_ext_finish(e, p.id, job, f, NB).n_failed, 0);
	assert_true(holds(&p, 20, 5));
	assert_true(holds(&p, 21, 6));
	/* held, cleared, stored again: a new block; the release ends the old one's hold only */
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_ext_hold(e, p.id, 0, h, 2), 2);
	assert_int_equal(kvt_ext_clear(e, p.id, 0), 2);
	fill(&p, 0, 7);
	d = store_job(e, &p, 0, ids, h, 1, f);
	assert_int_equal(d.n_skipped, 0);
	assert_int_equal(d.n_failed, 0);
	assert_int_equal(kvt_ext_release(e, p.id, 0, h, 2), 2);
	assert_int_equal(kvt_ext_lookup(e, p.id, 0, h, 2, &hits, NULL), 0);
	assert_int_equal(hits, 1);
	wipe(&p, 20);
	assert_int_equal(kvt_ext_load(e, p.id, 0, h, to, 1, 0, &job), 0);
	assert_int_equal(tsup_ext_finish(e, p.id, job, f, NB).n_failed, 0);
	assert_true(holds(&p, 20, 7));
	assert_int_equal(kvt_engine_drain(e), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	pool_free(&p);
	tsup_rmdir(dir);
}

/* kvt_ext_unregister deletes the pool's records from the persistent store (kvtier.h), also
 * of blocks whose NVMe write is still in flight: after a restart nothing of it is a hit. */
static void
test_unregister_deletes_records(void **state)
{
	char *dir = tsup_mkdtemp();
	struct kvt_engine_opts o;
	struct kvt_engine *e;
	struct pool p, q;
	uint32_t ids[4] = { 0, 1, 2, 3 };
	uint64_t h[4];
	struct kvt_ext_fail f[NB];
	struct kvt_ext_stats st = { .size = sizeof st };
	size_t hits = 9;

	(void)state;
	tsup_store_opts(&o, dir, 32 * 8192);
	e = tsup_create(&o, NULL);
	pool_make(e, &p);
	for (uint32_t i = 0; i < 4; i++) {
		h[i] = hash_of(400 + i);
		fill(&p, i, 10 + i);
	}
	assert_int_equal(store_job(e, &p, 0, ids, h, 2, f).n_failed, 0);
	for (int k = 0; k < 1000; k++) { /* the first two published */
		assert_int_equal(kvt_engine_drain(e), 0);
		assert_true(kvt_ext_poll(e, p.id, NULL, 0, NULL, 0) >= 0);
		assert_int_equal(kvt_ext_stats(e, p.id, &st), 0);
		if (st.persisted_blocks == 2)
			break;
	}
	assert_int_equal(st.persisted_blocks, 2);
	/* two more, their write-through in flight at the unregister */
	assert_int_equal(store_job(e, &p, 0, ids + 2, h + 2, 2, f).n_failed, 0);
	assert_int_equal(kvt_ext_unregister(e, p.id), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	e = tsup_create(&o, NULL);
	pool_make(e, &q);
	assert_int_equal(kvt_ext_lookup(e, q.id, 0, h, 4, &hits, NULL), 0);
	assert_int_equal(hits, 0);
	assert_int_equal(kvt_ext_lookup(e, q.id, 0, h + 2, 2, &hits, NULL), 0);
	assert_int_equal(hits, 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	pool_free(&p);
	pool_free(&q);
	tsup_rmdir(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip_host),
		cmocka_unit_test(test_roundtrip_nvme),
		cmocka_unit_test(test_roundtrip_layerwise),
		cmocka_unit_test(test_cross_layer_and_k_only),
		cmocka_unit_test(test_lookup_leading),
		cmocka_unit_test(test_corrupt_block_only_it_fails),
		cmocka_unit_test(test_bad_input),
		cmocka_unit_test(test_restart_persistent_hits),
		cmocka_unit_test(test_destroy_publishes_stored),
		cmocka_unit_test(test_removed_feed),
		cmocka_unit_test(test_removed_drop_while_loading),
		cmocka_unit_test(test_removed_overflow),
		cmocka_unit_test(test_hold_protects_promised_loads),
		cmocka_unit_test(test_drop_while_held),
		cmocka_unit_test(test_clear),
		cmocka_unit_test(test_forget_busy_and_held),
		cmocka_unit_test(test_unregister_deletes_records),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
