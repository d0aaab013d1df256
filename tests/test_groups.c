/* SPDX-License-Identifier: MIT */
/*
 * tests/test_groups.c - layer groups (issue 16): every group kind, bad descriptors (each a clear
 * error), one pool per group (exact slot sizes, the capacity split), the layer map with ALIAS
 * layers, per-group slot mappings and block tables whose bytes survive offload to HOST and NVMe
 * and park/resume, fanned-out calls that fail in one group leaving nothing half-done, prefix
 * sharing per group, tenant budgets, statistics totals.
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "kvtier.h"
#include "support/kvt_test.h"

#define TPB 4u

/* The test model: 7 layers, tpb 4, f32.
 *   group 0 FULL    layers {0, 2}: 2 KV heads, K head 8, V head 4 (K and V token bytes differ)
 *   group 1 LATENT  layer  {1}:    latent 24 (K only)
 *   group 2 WINDOW  layer  {3}:    1 KV head of 8, window 8, sink 4
 *   group 3 ALIAS   layers {4, 5}: of layers 1 and 0 (two source groups)
 *   group 4 ALIAS   layer  {6}:    of layer 2 (group 0's layer 1) */
#define NL 7u
#define NG 5u
static const uint32_t g0_layers[] = { 0, 2 }, g1_layers[] = { 1 }, g2_layers[] = { 3 };
static const uint32_t g3_layers[] = { 4, 5 }, g3_src[] = { 1, 0 };
static const uint32_t g4_layers[] = { 6 }, g4_src[] = { 2 };

/* block bytes of the storage groups */
#define BB0 (TPB * (2 * 8 + 2 * 4) * 4 * 2)
#define BB1 (TPB * 24 * 4)
#define BB2 (TPB * (8 + 8) * 4)

static void
model_groups(struct kvt_group *g)
{
	uint32_t i;

	for (i = 0; i < NG; i++)
		kvt_group_init(&g[i], sizeof g[i]);
	g[0].kind = KVT_GROUP_FULL;
	g[0].n_layers = 2;
	g[0].layers = g0_layers;
	g[0].n_kv_heads = 2;
	g[0].head_dim = 8;
	g[0].v_head_dim = 4;
	g[0].dtype = KVT_DTYPE_F32;
	g[1].kind = KVT_GROUP_LATENT;
	g[1].n_layers = 1;
	g[1].layers = g1_layers;
	g[1].latent_dim = 24;
	g[1].dtype = KVT_DTYPE_F32;
	g[2].kind = KVT_GROUP_WINDOW;
	g[2].n_layers = 1;
	g[2].layers = g2_layers;
	g[2].n_kv_heads = 1;
	g[2].head_dim = 8;
	g[2].window = 8;
	g[2].sink = 4;
	g[2].dtype = KVT_DTYPE_F32;
	g[3].kind = KVT_GROUP_ALIAS;
	g[3].n_layers = 2;
	g[3].layers = g3_layers;
	g[3].alias_of = g3_src;
	g[4].kind = KVT_GROUP_ALIAS;
	g[4].n_layers = 1;
	g[4].layers = g4_layers;
	g[4].alias_of = g4_src;
}

/* Options for the model with @hbm, @host, @nvme blocks per storage group (exact: the shares
 * are set from the block sizes, each pool with half a block of slack against rounding). */
static void
model_opts(struct kvt_engine_opts *o, struct kvt_group *g, uint32_t hbm, uint32_t host,
	   const char *nvme_dir, uint32_t nvme)
{
	double sum = (double)BB0 + BB1 + BB2;

	model_groups(g);
	kvt_engine_opts_init(o, sizeof *o);
	o->layout.n_layers = NL;
	o->layout.tokens_per_block = TPB;
	o->groups = g;
	o->n_groups = NG;
	g[0].share = (float)(BB0 / sum);
	g[1].share = (float)(BB1 / sum);
	g[2].share = (float)(BB2 / sum);
	/* pool g gets share_g x total = (blocks + 0.5) x its block bytes */
	o->hbm_bytes = (uint64_t)((hbm + 0.5) * sum);
	o->host_bytes = host ? (uint64_t)((host + 0.5) * sum) : 0;
	if (nvme_dir) {
		o->nvme_dir = nvme_dir;
		/* NVMe slots are 8 KiB for these blocks: enough for @nvme in the smallest pool */
		o->nvme_bytes = (uint64_t)((double)nvme * 8192.0 * sum / (double)BB2) + 8192;
	}
}

static struct kvt_engine *
model_create(struct kvt_engine_opts *o)
{
	struct kvt_engine *e = NULL;
	int rc = kvt_engine_create(o, &e);

	if (rc)
		fprintf(stderr, "create: %s (%s)\n", kvt_strerror(rc), kvt_last_error_message());
	assert_int_equal(rc, 0);
	return e;
}

/* The value of element @j of token @pos's K (@v 0) or V (@v 1) in layer @l of group @g. */
static float
pat(uint32_t tag, uint64_t pos, uint32_t g, uint32_t l, uint32_t j, int v)
{
	return (float)(tag * 100003u + pos * 131u + g * 17u + l * 7u + j * 3u + (unsigned)v);
}

/* Append @n tokens (ids tag*1000 + position) to @s and write every storage group's K/V.
 * Returns the append's error, or 1 (printed) when the rest goes wrong: no cmocka assertion,
 * test_threads' workers call it. */
static int
model_append(struct kvt_engine *e, kvt_seq_id s, uint32_t tag, uint64_t at, size_t n)
{
	int64_t map[NG * 64];
	int32_t tok[64];
	uint32_t g, l, j;
	size_t i;
	int rc;

	if (n > 64) {
		fprintf(stderr, "model_append: %zu tokens, at most 64\n", n);
		return 1;
	}
	for (i = 0; i < n; i++)
		tok[i] = (int32_t)(tag * 1000u + at + i);
	rc = kvt_seq_append_groups(e, s, tok, n, map);
	if (rc)
		return rc;
	for (g = 0; g < NG; g++) {
		struct kvt_group_geometry geo;

		if ((rc = kvt_group_geometry(e, g, &geo))) {
			fprintf(stderr, "model_append: kvt_group_geometry(%u): %d\n", g, rc);
			return 1;
		}
		if (geo.kind == KVT_GROUP_ALIAS) {
			for (i = 0; i < n; i++)
				if (map[g * n + i] != -1) {
					fprintf(stderr, "model_append: ALIAS group %u row %zu: %lld, "
						"not -1\n", g, i, (long long)map[g * n + i]);
					return 1;
				}
			continue;
		}
		for (i = 0; i < n; i++)
			for (l = 0; l < geo.n_layers; l++) {
				void *k, *v;

				kvt_group_kv_addr(&geo, l, map[g * n + i], &k, &v);
				for (j = 0; j < geo.k_token_bytes / 4; j++)
					((float *)k)[j] = pat(tag, at + i, g, l, j, 0);
				if (geo.v_token_bytes) {
					for (j = 0; j < geo.v_token_bytes / 4; j++)
						((float *)v)[j] = pat(tag, at + i, g, l, j, 1);
				} else if (v) {
					fprintf(stderr, "model_append: group %u has no V, yet an "
						"address for it\n", g);
					return 1;
				}
			}
	}
	return 0;
}

/* Count, through batch @b's group tables, the places where entry @i does not hold tokens of
 * sequence tag @tag (0: every byte as written). No cmocka assertion: worker threads call it, and
 * a cmocka failure outside the test's own thread cannot report itself. */
static unsigned
model_mismatches(struct kvt_batch *b, uint32_t i, uint32_t tag)
{
	uint32_t g, l, j, k, t;
	unsigned bad = 0;

	for (l = 0; l < NL; l++)
		bad += kvt_batch_wait_layer(b, l, NULL) != 0;
	for (g = 0; g < 3; g++) {
		struct kvt_group_table tb;

		if (kvt_batch_group_table(b, g, &tb) || tb.group != g)
			return bad + 1;
		for (k = tb.indptr[i]; k < tb.indptr[i + 1]; k++) {
			uint32_t ntok = k + 1 == tb.indptr[i + 1] ? tb.last_block_len[i] : TPB;

			if (!tb.window) /* consecutive; a WINDOW group's table skips dropped blocks */
				bad += tb.block_pos[k] != tb.first_block[i] + (k - tb.indptr[i]);
			else
				bad += !(k == tb.indptr[i] ? tb.block_pos[k] >= tb.first_block[i] :
					 tb.block_pos[k] > tb.block_pos[k - 1]);
			for (t = 0; t < ntok; t++)
				for (l = 0; l < tb.geo.n_layers; l++) {
					const char *blk = (const char *)tb.geo.hbm_base +
							  (uint64_t)tb.indices[k] * tb.geo.block_bytes +
							  l * tb.geo.layer_block_bytes;
					const float *kp = (const float *)(const void *)(blk +
								t * tb.geo.k_token_bytes);
					const float *vp = (const float *)(const void *)(blk +
								tb.geo.v_offset + t * tb.geo.v_token_bytes);
					uint64_t pos = (uint64_t)tb.block_pos[k] * TPB + t;

					for (j = 0; j < tb.geo.k_token_bytes / 4; j++)
						bad += kp[j] != pat(tag, pos, g, l, j, 0);
					for (j = 0; j < tb.geo.v_token_bytes / 4; j++)
						bad += vp[j] != pat(tag, pos, g, l, j, 1);
				}
		}
	}
	return bad;
}

/* Check, through batch @b's group tables, that entry @i holds tokens of sequence tag @tag. */
static void
model_check(struct kvt_engine *e, struct kvt_batch *b, uint32_t i, uint32_t tag)
{
	(void)e;
	assert_int_equal(model_mismatches(b, i, tag), 0);
}

/* Prepare @s alone, check its bytes, release. */
static void
model_verify(struct kvt_engine *e, kvt_seq_id s, uint32_t tag)
{
	struct kvt_batch *b = NULL;
	int rc = kvt_batch_prepare(e, &s, 1, &b);

	if (rc)
		fprintf(stderr, "prepare: %s (%s)\n", kvt_strerror(rc), kvt_last_error_message());
	assert_int_equal(rc, 0);
	model_check(e, b, 0, tag);
	assert_int_equal(kvt_batch_release(b, NULL), 0);
}

/* Prepare + release @s (unpins its appends: they become shareable). */
static void
model_step(struct kvt_engine *e, kvt_seq_id s)
{
	struct kvt_batch *b = NULL;

	assert_int_equal(kvt_batch_prepare(e, &s, 1, &b), 0);
	assert_int_equal(kvt_batch_release(b, NULL), 0);
}

static void
test_no_groups_is_one_full_group(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 8 };
	struct kvt_group_geometry gg;
	struct kvt_group_table tb;
	struct kvt_geometry geo;
	struct kvt_batch *b = NULL;
	struct kvt_engine *e;
	int64_t map[6];
	uint32_t g, lig;
	kvt_seq_id s;
	char *dir = NULL;

	(void)state;
	e = tsup_engine(&c, &dir);
	assert_int_equal(kvt_engine_n_groups(e), 1);
	assert_int_equal(kvt_engine_geometry(e, &geo), 0);
	assert_int_equal(kvt_group_geometry(e, 0, &gg), 0);
	assert_int_equal(gg.kind, KVT_GROUP_FULL);
	assert_ptr_equal(gg.hbm_base, geo.hbm_base);
	assert_int_equal(gg.block_bytes, geo.block_bytes);
	assert_int_equal(gg.layer_block_bytes, geo.layer_block_bytes);
	assert_int_equal(gg.k_token_bytes, geo.token_bytes);
	assert_int_equal(gg.v_token_bytes, geo.token_bytes);
	assert_int_equal(gg.v_offset, geo.v_offset);
	assert_int_equal(gg.v_head_dim, TSUP_DIM);
	assert_int_equal(gg.hbm_slots, 8);
	assert_int_equal(kvt_group_geometry(e, 1, &gg), -EINVAL);
	assert_int_equal(kvt_layer_group(e, 1, &g, &lig), 0);
	assert_int_equal(g, 0);
	assert_int_equal(lig, 1);
	assert_int_equal(kvt_layer_group(e, TSUP_LAYERS, &g, &lig), -EINVAL);
	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	assert_int_equal(kvt_seq_append_groups(e, s, NULL, 6, map), 0);
	assert_int_equal(kvt_batch_prepare(e, &s, 1, &b), 0);
	assert_int_equal(kvt_batch_group_table(b, 0, &tb), 0);
	assert_int_equal(tb.n_seqs, 1);
	assert_int_equal(tb.indptr[1], 2);
	assert_int_equal(tb.block_pos[0], 0);
	assert_int_equal(tb.block_pos[1], 1);
	assert_int_equal(tb.indices[0], (uint32_t)(map[0] / TSUP_TPB));
	assert_int_equal(tb.last_block_len[0], 2);
	assert_int_equal(tb.window, 0);
	assert_int_equal(kvt_batch_group_table(b, 1, &tb), -EINVAL);
	assert_int_equal(kvt_batch_wait_group_layer(b, 0, 1, NULL), 0);
	assert_int_equal(kvt_batch_wait_group_layer(b, 1, 0, NULL), -EINVAL);
	assert_int_equal(kvt_batch_release(b, NULL), 0);
	assert_int_equal(kvt_seq_close(e, s), 0);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* create with @g[0..n) over @nl layers must fail with @code and a message containing @msg */
static void
expect_refused(struct kvt_group *g, uint32_t n, uint32_t nl, int code, const char *msg)
{
	struct kvt_engine_opts o;
	struct kvt_engine *e = (struct kvt_engine *)&o;
	int rc;

	kvt_engine_opts_init(&o, sizeof o);
	o.layout.n_layers = nl;
	o.layout.tokens_per_block = TPB;
	o.hbm_bytes = 1 << 20;
	o.groups = g;
	o.n_groups = n;
	rc = kvt_engine_create(&o, &e);
	if (rc != code || !strstr(kvt_last_error_message(), msg))
		fprintf(stderr, "expected %d \"%s\", got %d \"%s\"\n", code, msg, rc,
			kvt_last_error_message());
	assert_int_equal(rc, code);
	assert_null(e);
	assert_non_null(strstr(kvt_last_error_message(), msg));
}

static void
test_bad_descriptors(void **state)
{
	static const uint32_t l01[] = { 0, 1 }, l1[] = { 1 }, l2[] = { 2 }, self[] = { 2 };
	static const uint32_t src_alias[] = { 2 }, l3[] = { 3 }, far[] = { 9 };
	struct kvt_group g[KVT_MAX_GROUPS + 1];
	uint32_t i;

	(void)state;
	model_groups(g);
	/* a layer in two groups */
	g[1].layers = g0_layers;
	g[1].n_layers = 1;
	expect_refused(g, NG, NL, -EINVAL, "model layer 0 is in group 0 and in group 1");
	/* a layer in none */
	model_groups(g);
	g[4].n_layers = 0;
	expect_refused(g, NG, NL, -EINVAL, "group 4: n_layers 0");
	expect_refused(g, NG - 1, NL, -EINVAL, "model layer 6 is in no group");
	/* layer out of range */
	model_groups(g);
	g[4].layers = far;
	expect_refused(g, NG, NL, -EINVAL, "group 4: layer 9 out of range");
	/* alias of an alias, of itself, out of range, without alias_of */
	model_groups(g);
	{
		static const uint32_t of_alias[] = { 4 };

		g[4].alias_of = of_alias;
		expect_refused(g, NG, NL, -EINVAL, "itself an alias");
	}
	model_groups(g);
	g[4].layers = g4_layers;
	{
		static const uint32_t of_self[] = { 6 };

		g[4].alias_of = of_self;
		expect_refused(g, NG, NL, -EINVAL, "group 4: layer 6 is an alias of itself");
	}
	model_groups(g);
	g[4].alias_of = far;
	expect_refused(g, NG, NL, -EINVAL, "is an alias of layer 9, out of range");
	model_groups(g);
	g[4].alias_of = NULL;
	expect_refused(g, NG, NL, -EINVAL, "group 4: an ALIAS group needs alias_of");
	/* window 0 */
	model_groups(g);
	g[2].window = 0;
	expect_refused(g, NG, NL, -EINVAL, "group 2: a WINDOW group needs window >= 1");
	/* zero sizes */
	model_groups(g);
	g[0].head_dim = 0;
	expect_refused(g, NG, NL, -EINVAL, "group 0: head_dim 0 out of range");
	model_groups(g);
	g[0].n_kv_heads = 0;
	expect_refused(g, NG, NL, -EINVAL, "group 0: n_kv_heads 0 out of range");
	model_groups(g);
	g[1].latent_dim = 0;
	expect_refused(g, NG, NL, -EINVAL, "group 1: latent_dim 0 out of range");
	model_groups(g);
	g[1].dtype = (enum kvt_dtype)42;
	expect_refused(g, NG, NL, -EINVAL, "group 1: unknown element type 42");
	/* too many groups, none, NULL */
	for (i = 0; i < KVT_MAX_GROUPS + 1; i++) {
		static uint32_t one[KVT_MAX_GROUPS + 1];

		one[i] = i;
		kvt_group_init(&g[i], sizeof g[i]);
		g[i].n_layers = 1;
		g[i].layers = &one[i];
		g[i].n_kv_heads = 1;
		g[i].head_dim = 4;
	}
	expect_refused(g, KVT_MAX_GROUPS + 1, KVT_MAX_GROUPS + 1, -EINVAL,
		       "17 layer groups (groups set): must be 1..16");
	expect_refused(NULL, 2, 2, -EINVAL, "groups NULL");
	/* a SIDECAR descriptor is checked as one (tests/test_sidecar.c; STATE groups:
	 * tests/test_state.c) */
	model_groups(g);
	g[4].kind = KVT_GROUP_SIDECAR;
	expect_refused(g, NG, NL, -EINVAL, "group 4: a SIDECAR group needs sidecar_token_bytes");
	g[4].kind = (enum kvt_group_kind)77;
	expect_refused(g, NG, NL, -EINVAL, "group 4: unknown kind 77");
	/* per-group block sizes are not supported yet */
	model_groups(g);
	g[2].tokens_per_block = 8;
	expect_refused(g, NG, NL, KVT_ENOTSUP, "group 2: tokens_per_block 8 differs");
	/* shares: all or none, at most 1 in sum */
	model_groups(g);
	g[0].share = 0.5f;
	expect_refused(g, NG, NL, -EINVAL, "share is set in 1 of the 3 storage groups");
	g[1].share = 0.5f;
	g[2].share = 0.5f;
	expect_refused(g, NG, NL, -EINVAL, "shares sum to 1.5");
	/* a bad size field */
	model_groups(g);
	g[0].size = 8;
	expect_refused(g, NG, NL, -EINVAL, "kvt_group.size 8");
	/* only aliases: nothing stored (the second one names the first, the first itself) */
	kvt_group_init(&g[0], sizeof g[0]);
	g[0].kind = KVT_GROUP_ALIAS;
	g[0].n_layers = 2;
	g[0].layers = l01;
	g[0].alias_of = l01;
	expect_refused(g, 1, 2, -EINVAL, "group 0: layer 0 is an alias of itself");
	(void)l1;
	(void)l2;
	(void)self;
	(void)src_alias;
	(void)l3;
}

static void
test_pool_too_small_names_group(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_engine *e = NULL;

	(void)state;
	model_opts(&o, g, 4, 0, NULL, 0);
	g[0].share = 0.98f; /* group 2 gets 1% of HBM: less than one block */
	g[1].share = 0.01f;
	g[2].share = 0.01f;
	assert_int_equal(kvt_engine_create(&o, &e), -EINVAL);
	assert_null(e);
	assert_non_null(strstr(kvt_last_error_message(), "group 1 (LATENT"));
	assert_non_null(strstr(kvt_last_error_message(), "HBM capacity"));
	/* the REMOTE tier is not per group yet */
	model_opts(&o, g, 4, 0, NULL, 0);
	o.remote_host = "127.0.0.1";
	assert_int_equal(kvt_engine_create(&o, &e), KVT_ENOTSUP);
	assert_null(e);
}

static void
test_geometry_and_layer_map(void **state)
{
	static const uint32_t want_g[NL] = { 0, 1, 0, 2, 1, 0, 0 };
	static const uint32_t want_l[NL] = { 0, 0, 1, 0, 0, 0, 1 };
	struct kvt_group_geometry gg;
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_geometry geo;
	struct kvt_engine *e;
	struct kvt_stats st, sg;
	uint64_t slots = 0;
	uint32_t l, grp, lig, i;
	kvt_seq_id s;
	int64_t map[1];

	(void)state;
	model_opts(&o, g, 6, 0, NULL, 0);
	e = model_create(&o);
	assert_int_equal(kvt_engine_n_groups(e), NG);
	/* FULL with its own V width: K and V token bytes differ */
	assert_int_equal(kvt_group_geometry(e, 0, &gg), 0);
	assert_int_equal(gg.kind, KVT_GROUP_FULL);
	assert_int_equal(gg.n_layers, 2);
	assert_int_equal(gg.k_token_bytes, 2 * 8 * 4);
	assert_int_equal(gg.v_token_bytes, 2 * 4 * 4);
	assert_int_equal(gg.v_offset, TPB * 2 * 8 * 4);
	assert_int_equal(gg.layer_block_bytes, BB0 / 2);
	assert_int_equal(gg.block_bytes, BB0);
	assert_int_equal(gg.v_head_dim, 4);
	assert_int_equal(gg.hbm_slots, 6);
	/* LATENT: K only, half the bytes of K + V of that width */
	assert_int_equal(kvt_group_geometry(e, 1, &gg), 0);
	assert_int_equal(gg.kind, KVT_GROUP_LATENT);
	assert_int_equal(gg.k_token_bytes, 24 * 4);
	assert_int_equal(gg.v_token_bytes, 0);
	assert_int_equal(gg.v_offset, 0);
	assert_int_equal(gg.block_bytes, BB1);
	assert_int_equal(gg.head_dim, 24);
	assert_int_equal(gg.v_head_dim, 0);
	assert_int_equal(gg.hbm_slots, 6);
	/* WINDOW */
	assert_int_equal(kvt_group_geometry(e, 2, &gg), 0);
	assert_int_equal(gg.kind, KVT_GROUP_WINDOW);
	assert_int_equal(gg.block_bytes, BB2);
	assert_int_equal(gg.window, 8);
	assert_int_equal(gg.sink, 4);
	assert_int_equal(gg.hbm_slots, 6);
	/* ALIAS: no storage */
	assert_int_equal(kvt_group_geometry(e, 3, &gg), 0);
	assert_int_equal(gg.kind, KVT_GROUP_ALIAS);
	assert_int_equal(gg.n_layers, 2);
	assert_int_equal(gg.block_bytes, 0);
	assert_null(gg.hbm_base);
	assert_int_equal(kvt_group_geometry(e, NG, &gg), -EINVAL);
	/* ALIAS layers map to their source's (group, layer-in-group) */
	for (l = 0; l < NL; l++) {
		assert_int_equal(kvt_layer_group(e, l, &grp, &lig), 0);
		assert_int_equal(grp, want_g[l]);
		assert_int_equal(lig, want_l[l]);
	}
	assert_int_equal(kvt_layer_group(e, NL, &grp, &lig), -EINVAL);
	/* the single-geometry calls refuse, naming the per-group ones */
	assert_int_equal(kvt_engine_geometry(e, &geo), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "kvt_group_geometry"));
	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	assert_int_equal(kvt_seq_append(e, s, NULL, 1, map), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "kvt_seq_append_groups"));
	/* stats: the totals are the pools' sums; an ALIAS group has none */
	memset(&st, 0, sizeof st);
	st.size = sizeof st;
	assert_int_equal(kvt_engine_stats(e, &st), 0);
	for (i = 0; i < NG; i++) {
		memset(&sg, 0, sizeof sg);
		sg.size = sizeof sg;
		assert_int_equal(kvt_engine_group_stats(e, i, &sg), 0);
		slots += sg.tier[KVT_TIER_HBM].slots;
		if (i >= 3)
			assert_int_equal(sg.tier[KVT_TIER_HBM].capacity_bytes, 0);
	}
	assert_int_equal(slots, 18);
	assert_int_equal(st.tier[KVT_TIER_HBM].slots, 18);
	assert_int_equal(st.tier[KVT_TIER_HBM].capacity_bytes, 6 * (BB0 + BB1 + BB2));
	assert_int_equal(st.seqs_open, 1);
	assert_int_equal(kvt_seq_close(e, s), 0);
	kvt_engine_destroy(e);
}

/* The default split: by each group's bytes for group_ref_tokens of context, a WINDOW group
 * counted for what its window bounds (sink 4 + window 8 at tpb 4: 1 + 2 + 1 = 4 blocks). */
static void
test_default_split(void **state)
{
	struct kvt_group_geometry g0, g1, g2;
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_engine *e;
	double w0, w1, w2, sum;
	uint64_t total = 64ull * (BB0 + BB1) + 4ull * BB2 * 16;

	(void)state;
	model_opts(&o, g, 4, 0, NULL, 0);
	g[0].share = g[1].share = g[2].share = 0.0f;
	o.group_ref_tokens = 64 * TPB; /* 64 blocks of context */
	o.hbm_bytes = total;
	e = model_create(&o);
	assert_int_equal(kvt_group_geometry(e, 0, &g0), 0);
	assert_int_equal(kvt_group_geometry(e, 1, &g1), 0);
	assert_int_equal(kvt_group_geometry(e, 2, &g2), 0);
	w0 = 64.0 * BB0;
	w1 = 64.0 * BB1;
	w2 = 4.0 * BB2;
	sum = w0 + w1 + w2;
	assert_int_equal(g0.hbm_slots, (uint32_t)((double)total * (w0 / sum) / BB0));
	assert_int_equal(g1.hbm_slots, (uint32_t)((double)total * (w1 / sum) / BB1));
	assert_int_equal(g2.hbm_slots, (uint32_t)((double)total * (w2 / sum) / BB2));
	/* the WINDOW pool holds its window's blocks for as many sequences as the others hold
	 * contexts: within one slot of a quarter of the FULL pool's 64-block contexts */
	assert_true(g2.hbm_slots * 16 >= g0.hbm_slots - 16 && g2.hbm_slots * 16 <= g0.hbm_slots + 16);
	kvt_engine_destroy(e);
}

/* The default split gives a WINDOW pool at least one sequence's window bound in HBM however
 * small its part of group_ref_tokens' bytes (4 MiB of HBM, window 16, 8-token blocks: it
 * used to get 2 slots where every prepare needs 3, KVT_ETOOBIG), and a sequence decodes. */
static void
test_default_split_window_floor(void **state)
{
	static const uint32_t fl[] = { 0 }, wl[] = { 1 };
	struct kvt_group g[2];
	struct kvt_group_geometry gw;
	struct kvt_engine_opts o;
	struct kvt_engine *e = NULL;
	kvt_seq_id s;
	uint32_t t;

	(void)state;
	kvt_group_init(&g[0], sizeof g[0]);
	kvt_group_init(&g[1], sizeof g[1]);
	g[0].kind = KVT_GROUP_FULL;
	g[0].layers = fl;
	g[1].kind = KVT_GROUP_WINDOW;
	g[1].layers = wl;
	g[1].window = 16;
	for (t = 0; t < 2; t++) {
		g[t].n_layers = 1;
		g[t].n_kv_heads = 2;
		g[t].head_dim = 64;
		g[t].dtype = KVT_DTYPE_F16;
	}
	kvt_engine_opts_init(&o, sizeof o);
	o.layout.n_layers = 2;
	o.layout.tokens_per_block = 8;
	o.groups = g;
	o.n_groups = 2;
	o.hbm_bytes = 4u << 20;
	assert_int_equal(kvt_engine_create(&o, &e), 0);
	assert_int_equal(kvt_group_geometry(e, 1, &gw), 0);
	/* ceil(16 / 8) + 1 blocks */
	assert_true(gw.hbm_slots >= 3);
	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	for (t = 0; t < 40; t++) {
		struct kvt_batch *b = NULL;
		int32_t tok = (int32_t)t;
		int64_t map[2];

		assert_int_equal(kvt_seq_append_groups(e, s, &tok, 1, map), 0);
		assert_int_equal(kvt_batch_prepare(e, &s, 1, &b), 0);
		assert_int_equal(kvt_batch_release(b, NULL), 0);
	}
	assert_int_equal(kvt_seq_close(e, s), 0);
	kvt_engine_destroy(e);
}

/* Bytes of every group written through the per-group slot mappings come back through the
 * per-group tables, from HBM, after demotion to HOST and NVMe, and after a park to NVMe. */
static void
offload_roundtrip(enum kvt_codec codec)
{
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_seq_info in;
	struct kvt_engine *e;
	kvt_seq_id s[3];
	char *dir = tsup_mkdtemp();
	char sub[600];
	uint32_t i, k;

	model_opts(&o, g, 12, 12, dir, 40);
	o.nvme_codec = codec;
	o.nvme_codec_min_saving = 0.0f; /* keep every encoding */
	e = model_create(&o);
	for (i = 0; i < 3; i++) {
		assert_int_equal(kvt_seq_open(e, NULL, &s[i]), 0);
		for (k = 0; k < 4; k++) {
			assert_int_equal(model_append(e, s[i], i + 1, k * 10, 10), 0);
			model_step(e, s[i]);
		}
	}
	assert_int_equal(kvt_seq_info(e, s[0], &in), 0);
	assert_int_equal(in.n_tokens, 40);
	assert_int_equal(in.n_blocks, 3 * 10); /* 10 blocks in each storage group */
	/* 3 x 10 blocks per pool of 12 HBM + 12 HOST slots: some are on NVMe */
	for (i = 0; i < 3; i++)
		model_verify(e, s[i], i + 1);
	/* park one to NVMe: every group's blocks go there */
	assert_int_equal(kvt_seq_park(e, s[1], KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_info(e, s[1], &in), 0);
	/* FULL and LATENT keep 10 blocks; WINDOW (window 8, sink 4) its sink block and blocks 5..9
	 * (block j goes when (j + 1) * TPB <= q + 1 - window, q = 30: engine/window.c) */
	assert_int_equal(in.blocks_in[KVT_TIER_NVME], 10 + 10 + 6);
	assert_int_equal(in.blocks_in[KVT_TIER_HBM], 0);
	assert_int_equal(in.parked, 1);
	if (codec != KVT_CODEC_NONE) {
		struct kvt_stats st;

		memset(&st, 0, sizeof st);
		st.size = sizeof st;
		assert_int_equal(kvt_engine_stats(e, &st), 0);
		assert_true(st.codec_blocks > 0); /* some blocks were stored encoded */
	}
	assert_int_equal(kvt_seq_resume(e, s[1]), 0);
	model_verify(e, s[1], 2);
	/* appending after the park continues every group's last block */
	assert_int_equal(model_append(e, s[1], 2, 40, 3), 0);
	model_verify(e, s[1], 2);
	for (i = 0; i < 3; i++)
		assert_int_equal(kvt_seq_close(e, s[i]), 0);
	kvt_engine_destroy(e);
	/* group 0's file in nvme_dir, the others' in group<g>: all removed */
	for (i = 1; i < 3; i++) {
		snprintf(sub, sizeof sub, "%s/group%u", dir, i);
		assert_int_equal(rmdir(sub), 0);
	}
	tsup_rmdir(dir);
}

static void
test_offload_roundtrip(void **state)
{
	(void)state;
	offload_roundtrip(KVT_CODEC_NONE);
}

/* The codec sees each pool's own geometry (a K-only LATENT block, a FULL block whose V is
 * narrower than its K): lossless all the same. */
static void
test_offload_roundtrip_codec(void **state)
{
	(void)state;
	offload_roundtrip(KVT_CODEC_CSHUF_LZ4);
	offload_roundtrip(KVT_CODEC_SHUF_LZ4);
}

/* Two sequences in one batch: every group's table, and the ALIAS groups' tables. */
static void
test_batch_tables(void **state)
{
	struct kvt_group_table t0, t4, t3;
	struct kvt_seq_range r[2];
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_block_table bt;
	struct kvt_batch *b = NULL;
	struct kvt_engine *e;
	kvt_seq_id s[2];
	uint32_t i;

	(void)state;
	model_opts(&o, g, 16, 0, NULL, 0);
	e = model_create(&o);
	for (i = 0; i < 2; i++) {
		assert_int_equal(kvt_seq_open(e, NULL, &s[i]), 0);
		assert_int_equal(model_append(e, s[i], 7 + i, 0, 22), 0);
		model_step(e, s[i]);
	}
	r[0] = (struct kvt_seq_range){ s[0], 0, 0 };
	r[1] = (struct kvt_seq_range){ s[1], 2, 3 }; /* blocks 2..4 */
	assert_int_equal(kvt_batch_prepare_ranges(e, r, 2, &b), 0);
	model_check(e, b, 0, 7);
	model_check(e, b, 1, 8);
	assert_int_equal(kvt_batch_group_table(b, 0, &t0), 0);
	assert_int_equal(t0.n_seqs, 2);
	assert_int_equal(t0.indptr[1], 6);
	assert_int_equal(t0.indptr[2], 9);
	assert_int_equal(t0.block_pos[6], 2);
	assert_int_equal(t0.first_block[1], 2);
	assert_int_equal(t0.last_block_len[0], 2);
	assert_int_equal(t0.last_block_len[1], TPB);
	/* group 4 (ALIAS of a layer of group 0): group 0's table */
	assert_int_equal(kvt_batch_group_table(b, 4, &t4), 0);
	assert_int_equal(t4.group, 0);
	assert_ptr_equal(t4.indices, t0.indices);
	assert_int_equal(t4.geo.block_bytes, BB0);
	/* group 3 reads two groups: ask per layer */
	assert_int_equal(kvt_batch_group_table(b, 3, &t3), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "kvt_layer_group"));
	assert_int_equal(kvt_batch_group_table(b, NG, &t3), -EINVAL);
	assert_int_equal(kvt_batch_block_table(b, &bt), -EINVAL);
	assert_int_equal(kvt_batch_wait_group_layer(b, 1, 0, NULL), 0);
	assert_int_equal(kvt_batch_wait_group_layer(b, 3, 0, NULL), -EINVAL);
	assert_int_equal(kvt_batch_wait_layer(b, NL, NULL), -EINVAL);
	/* a sequence in the batch stays whole: append and close refuse in every group */
	{
		int64_t map[NG];

		assert_int_equal(kvt_seq_append_groups(e, s[0], NULL, 1, map), KVT_EBUSY);
		assert_int_equal(kvt_seq_close(e, s[0]), KVT_EBUSY);
	}
	assert_int_equal(kvt_batch_release(b, NULL), 0);
	for (i = 0; i < 2; i++)
		assert_int_equal(kvt_seq_close(e, s[i]), 0);
	kvt_engine_destroy(e);
}

/* An append that fails in a later group is taken back from the groups that had made it: the
 * sequence is as it was, in every pool (its length, its blocks, the pools' slots). */
static void
test_append_failure_undone(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_seq_info in;
	struct kvt_stats sg;
	struct kvt_engine *e;
	int64_t map[NG * 20];
	kvt_seq_id s;

	(void)state;
	model_opts(&o, g, 8, 0, NULL, 0);
	/* group 2's pool: 2 HBM slots; the others 8 */
	g[0].share = (float)(8.0 * BB0 / (8.0 * (BB0 + BB1) + 2.0 * BB2 + 0.5 * BB2));
	g[1].share = (float)(8.0 * BB1 / (8.0 * (BB0 + BB1) + 2.0 * BB2 + 0.5 * BB2));
	g[2].share = (float)(2.5 * BB2 / (8.0 * (BB0 + BB1) + 2.0 * BB2 + 0.5 * BB2));
	o.hbm_bytes = (uint64_t)(8.0 * (BB0 + BB1) + 2.5 * BB2) + 64;
	e = model_create(&o);
	{
		struct kvt_group_geometry gg;

		assert_int_equal(kvt_group_geometry(e, 2, &gg), 0);
		assert_int_equal(gg.hbm_slots, 2);
		assert_int_equal(kvt_group_geometry(e, 0, &gg), 0);
		assert_int_equal(gg.hbm_slots, 8);
	}
	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	assert_int_equal(model_append(e, s, 1, 0, 2), 0); /* a partial block */
	/* 12 more tokens span 4 blocks (2 + 12 = 14): group 2's HBM has 2 slots */
	assert_int_equal(kvt_seq_append_groups(e, s, NULL, 12, map), KVT_ETOOBIG);
	assert_non_null(strstr(kvt_last_error_message(), "group 2:"));
	assert_int_equal(kvt_seq_info(e, s, &in), 0);
	assert_int_equal(in.n_tokens, 2);
	assert_int_equal(in.n_blocks, 3); /* one block in each storage group */
	memset(&sg, 0, sizeof sg);
	sg.size = sizeof sg;
	assert_int_equal(kvt_engine_group_stats(e, 0, &sg), 0);
	assert_int_equal(sg.tier[KVT_TIER_HBM].used_slots, 1);
	assert_int_equal(kvt_engine_group_stats(e, 1, &sg), 0);
	assert_int_equal(sg.tier[KVT_TIER_HBM].used_slots, 1);
	/* the engine stays usable and the bytes of the first tokens are intact */
	assert_int_equal(model_append(e, s, 1, 2, 4), 0);
	model_verify(e, s, 1);
	assert_int_equal(kvt_seq_info(e, s, &in), 0);
	assert_int_equal(in.n_tokens, 6);
	assert_int_equal(in.n_blocks, 6);
	assert_int_equal(kvt_seq_close(e, s), 0);
	kvt_engine_destroy(e);
}

/* Prefix sharing per group: a second sequence with the same prompt attaches the blocks of
 * every group (each pool's index), and their bytes are the first one's. */
static void
test_prefix_per_group(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_stats sg;
	struct kvt_engine *e;
	int32_t tok[16];
	uint64_t matched = 0, attached = 0;
	enum kvt_tier tier;
	kvt_seq_id a, b;
	uint32_t i;

	(void)state;
	model_opts(&o, g, 16, 0, NULL, 0);
	o.prefix_cache = 1;
	e = model_create(&o);
	assert_int_equal(kvt_seq_open(e, NULL, &a), 0);
	assert_int_equal(model_append(e, a, 3, 0, 14), 0);
	model_step(e, a);
	assert_int_equal(kvt_seq_close(e, a), 0);
	for (i = 0; i < 16; i++)
		tok[i] = (int32_t)(3 * 1000 + i);
	assert_int_equal(kvt_seq_match_prefix(e, NULL, tok, 16, &matched, &tier), 0);
	assert_int_equal(matched, 12); /* the three full blocks */
	assert_int_equal(tier, KVT_TIER_HBM);
	{
		struct kvt_seq_opts so;

		kvt_seq_opts_init(&so, sizeof so);
		so.tenant = 9; /* another tenant shares nothing */
		assert_int_equal(kvt_seq_match_prefix(e, &so, tok, 16, &matched, &tier), 0);
		assert_int_equal(matched, 0);
		assert_int_equal(tier, KVT_TIER_COUNT);
	}
	assert_int_equal(kvt_seq_open(e, NULL, &b), 0);
	assert_int_equal(kvt_seq_attach_prefix(e, b, tok, 16, &attached), 0);
	assert_int_equal(attached, 12);
	for (i = 0; i < 3; i++) {
		memset(&sg, 0, sizeof sg);
		sg.size = sizeof sg;
		assert_int_equal(kvt_engine_group_stats(e, i, &sg), 0);
		assert_int_equal(sg.prefix_hit_blocks, 3);
	}
	assert_int_equal(model_append(e, b, 3, 12, 2), 0);
	model_verify(e, b, 3); /* the attached blocks hold sequence a's bytes (same tag) */
	/* attach to a sequence that is not empty: refused, nothing changes */
	assert_int_equal(kvt_seq_attach_prefix(e, b, tok, 16, &attached), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "group 0:"));
	assert_int_equal(kvt_seq_close(e, b), 0);
	kvt_engine_destroy(e);
}

/* Tenant budgets apply to each group's pool; the usage is their sum. */
static void
test_tenant_budget_groups(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_seq_opts so;
	struct kvt_engine *e;
	uint64_t used[KVT_TIER_COUNT];
	kvt_seq_id s;

	(void)state;
	model_opts(&o, g, 16, 16, NULL, 0);
	e = model_create(&o);
	assert_int_equal(kvt_tenant_usage(e, 5, used), -ENOENT);
	assert_int_equal(kvt_tenant_set_budget(e, 5, KVT_TIER_HBM, 2), 0);
	kvt_seq_opts_init(&so, sizeof so);
	so.tenant = 5;
	assert_int_equal(kvt_seq_open(e, &so, &s), 0);
	assert_int_equal(model_append(e, s, 4, 0, 16), 0);
	model_step(e, s); /* the release enforces the budget */
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_engine_poll(e, 0) >= 0, 1);
	assert_int_equal(kvt_tenant_usage(e, 5, used), 0);
	assert_int_equal(used[KVT_TIER_HBM], 3 * 2);   /* 2 per pool */
	assert_int_equal(used[KVT_TIER_HOST], 3 * 2);  /* the 4 blocks of each pool: 2 moved */
	model_verify(e, s, 4);
	assert_int_equal(kvt_tenant_set_budget(e, 5, KVT_TIER_COUNT, 1), -EINVAL);
	assert_int_equal(kvt_seq_close(e, s), 0);
	kvt_engine_destroy(e);
}

/* Calls on sequences that are not open, and closed ids used again, answer KVT_ECLOSED. */
static void
test_closed_ids(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_seq_info in;
	struct kvt_batch *b = NULL;
	struct kvt_engine *e;
	int64_t map[NG];
	int32_t t;
	kvt_seq_id s, s2;

	(void)state;
	model_opts(&o, g, 8, 0, NULL, 0);
	e = model_create(&o);
	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	assert_int_equal(kvt_seq_close(e, s), 0);
	assert_int_equal(kvt_seq_close(e, s), KVT_ECLOSED);
	assert_int_equal(kvt_seq_info(e, s, &in), KVT_ECLOSED);
	assert_int_equal(kvt_seq_append_groups(e, s, NULL, 1, map), KVT_ECLOSED);
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_HOST), KVT_ECLOSED);
	assert_int_equal(kvt_seq_tokens(e, s, 0, &t, 0), KVT_ECLOSED);
	assert_int_equal(kvt_batch_prepare(e, &s, 1, &b), KVT_ECLOSED);
	assert_null(b);
	assert_int_equal(kvt_seq_open(e, NULL, &s2), 0);
	assert_true(s2 != s); /* same slot, new generation */
	assert_int_equal(kvt_seq_info(e, s, &in), KVT_ECLOSED);
	assert_int_equal(kvt_seq_append_groups(e, s2, NULL, 0, map), -EINVAL);
	assert_int_equal(kvt_seq_append_groups(e, s2, NULL, 1, NULL), -EINVAL);
	assert_int_equal(model_append(e, s2, 1, 0, 5), 0);
	assert_int_equal(kvt_seq_tokens(e, s2, 4, &t, 1), 0);
	assert_int_equal(t, 1004);
	assert_int_equal(kvt_seq_park(e, s2, KVT_TIER_HBM), -EINVAL);
	assert_int_equal(kvt_seq_close(e, s2), 0);
	kvt_engine_destroy(e);
}

/* Persistent sessions with groups: each group's pool publishes into its own store; a session
 * parked to NVMe survives kill -9 of the process and is restored whole, with every group's
 * bytes. */
static void
test_store_kill_restore(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_seq_opts so;
	struct kvt_seq_info in;
	struct kvt_engine *e;
	char *dir = tsup_mkdtemp();
	char sub[600];
	uint64_t keys[4];
	kvt_seq_id s, r;
	pid_t pid;
	int st = 0;
	uint32_t i;

	(void)state;
	model_opts(&o, g, 12, 12, dir, 40);
	o.nvme_persist = 1;
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		/* the child: publish session 42 (and an unparked 43), then die without a word */
		if (kvt_engine_create(&o, &e))
			_exit(2);
		kvt_seq_opts_init(&so, sizeof so);
		so.session_key = 42;
		so.tenant = 3;
		if (kvt_seq_open(e, &so, &s) || model_append(e, s, 6, 0, 30))
			_exit(3);
		model_step(e, s);
		if (kvt_seq_park(e, s, KVT_TIER_NVME) || kvt_engine_drain(e))
			_exit(4);
		so.session_key = 43;
		if (kvt_seq_open(e, &so, &s) || model_append(e, s, 7, 0, 8))
			_exit(5);
		kill(getpid(), SIGKILL);
		_exit(6);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	e = model_create(&o);
	assert_int_equal(kvt_session_list(e, keys, 4), 1);
	assert_int_equal(keys[0], 42);
	assert_int_equal(kvt_session_list_tenant(e, 3, keys, 4), 1);
	assert_int_equal(kvt_session_list_tenant(e, 4, keys, 4), 0);
	/* another tenant is refused, nothing changes */
	kvt_seq_opts_init(&so, sizeof so);
	so.tenant = 4;
	assert_int_equal(kvt_seq_restore(e, 42, &so, &r), -EPERM);
	assert_int_equal(kvt_session_list(e, keys, 4), 1);
	so.tenant = 3;
	assert_int_equal(kvt_seq_restore(e, 43, &so, &r), -ENOENT);
	assert_int_equal(kvt_seq_restore(e, 42, &so, &r), 0);
	assert_int_equal(kvt_seq_info(e, r, &in), 0);
	assert_int_equal(in.n_tokens, 30);
	assert_int_equal(in.blocks_in[KVT_TIER_NVME], 3 * 8);
	assert_int_equal(kvt_session_list(e, keys, 4), 0); /* open now */
	model_verify(e, r, 6);
	/* detach keeps it, drop removes it from every group's store */
	assert_int_equal(kvt_seq_detach(e, r), 0);
	assert_int_equal(kvt_session_list(e, keys, 4), 1);
	assert_int_equal(kvt_session_drop_tenant(e, 4, 42), -EPERM);
	assert_int_equal(kvt_session_drop(e, 42), 0);
	assert_int_equal(kvt_session_drop(e, 42), -ENOENT);
	assert_int_equal(kvt_session_list(e, keys, 4), 0);
	kvt_engine_destroy(e);
	/* the store is refused by an engine of other groups (a window that changes no block
	 * size), and by a single-layout engine */
	g[2].window = 16;
	assert_int_equal(kvt_engine_create(&o, &e), KVT_EFORMAT);
	assert_non_null(strstr(kvt_last_error_message(), "made for other layer groups"));
	{
		struct kvt_engine_opts so1;

		tsup_store_opts(&so1, dir, 1 << 20);
		assert_int_equal(kvt_engine_create(&so1, &e), KVT_EFORMAT);
		assert_non_null(strstr(kvt_last_error_message(),
				       "made for a layer group of an engine with groups"));
	}
	for (i = 1; i < 3; i++) {
		snprintf(sub, sizeof sub, "%s/group%u", dir, i);
		{
			char f[700];

			snprintf(f, sizeof f, "%s/kvtier.store", sub);
			unlink(f);
			snprintf(f, sizeof f, "%s/kvtier.journal", sub);
			unlink(f);
		}
		assert_int_equal(rmdir(sub), 0);
	}
	tsup_rmdir(dir);
}

/* A session that one group's store lacks (its park never reached that group) is not
 * durable: not listed, not restored; the other groups' parts stay, harmless. */
static void
test_store_partial_session_absent(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_seq_opts so;
	struct kvt_engine *e;
	char *dir = tsup_mkdtemp();
	char f[700];
	uint64_t keys[4];
	kvt_seq_id s, r;
	uint32_t i;

	(void)state;
	model_opts(&o, g, 12, 12, dir, 40);
	o.nvme_persist = 1;
	e = model_create(&o);
	kvt_seq_opts_init(&so, sizeof so);
	so.session_key = 9;
	assert_int_equal(kvt_seq_open(e, &so, &s), 0);
	assert_int_equal(model_append(e, s, 2, 0, 12), 0);
	model_step(e, s);
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_detach(e, s), 0);
	kvt_engine_destroy(e);
	/* group 2's store loses the session: its store and journal removed */
	snprintf(f, sizeof f, "%s/group2/kvtier.store", dir);
	assert_int_equal(unlink(f), 0);
	snprintf(f, sizeof f, "%s/group2/kvtier.journal", dir);
	assert_int_equal(unlink(f), 0);
	e = model_create(&o);
	assert_int_equal(kvt_session_list(e, keys, 4), 0);
	assert_int_equal(kvt_seq_restore(e, 9, NULL, &r), -ENOENT);
	assert_non_null(strstr(kvt_last_error_message(), "durable only when every group's store"));
	/* the groups that had restored it let it go: the engine is usable, no sequence open */
	{
		struct kvt_stats st;

		memset(&st, 0, sizeof st);
		st.size = sizeof st;
		assert_int_equal(kvt_engine_stats(e, &st), 0);
		assert_int_equal(st.seqs_open, 0);
	}
	assert_int_equal(kvt_session_drop(e, 9), 0); /* the parts that are there go */
	kvt_engine_destroy(e);
	for (i = 1; i < 3; i++) {
		snprintf(f, sizeof f, "%s/group%u/kvtier.store", dir, i);
		unlink(f);
		snprintf(f, sizeof f, "%s/group%u/kvtier.journal", dir, i);
		unlink(f);
		snprintf(f, sizeof f, "%s/group%u", dir, i);
		assert_int_equal(rmdir(f), 0);
	}
	tsup_rmdir(dir);
}

/* The metrics text of a grouped engine: the totals as for one engine, then per-group series. */
static void
test_metrics_per_group(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_engine *e;
	char small[16], line[160];
	size_t len = 0, need = 0;
	char *buf;
	kvt_seq_id s;

	(void)state;
	model_opts(&o, g, 8, 0, NULL, 0);
	e = model_create(&o);
	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	assert_int_equal(model_append(e, s, 1, 0, 6), 0);
	assert_int_equal(kvt_engine_metrics_text(e, small, sizeof small, &need), -ENOSPC);
	assert_string_equal(small, "");
	buf = malloc(need);
	assert_non_null(buf);
	assert_int_equal(kvt_engine_metrics_text(e, buf, need, &len), 0);
	assert_int_equal(len + 1, need);
	assert_non_null(strstr(buf, "kvtier_tier_slots{tier=\"hbm\"} 24\n"));
	snprintf(line, sizeof line, "kvtier_group_slot_bytes{group=\"1\",kind=\"LATENT\","
		 "layers=\"1\"} %u\n", BB1);
	assert_non_null(strstr(buf, line));
	assert_non_null(strstr(buf, "kvtier_group_slot_bytes{group=\"3\",kind=\"ALIAS\","
				    "layers=\"2\"} 0\n"));
	assert_non_null(strstr(buf, "kvtier_group_used_slots{group=\"2\",kind=\"WINDOW\","
				    "tier=\"hbm\"} 2\n"));
	assert_non_null(strstr(buf, "# TYPE kvtier_group_evictions_total counter\n"));
	free(buf);
	assert_int_equal(kvt_seq_close(e, s), 0);
	kvt_engine_destroy(e);
}

/* Threads on one grouped engine: each runs its own sequences through append, prepare, check and
 * release while another parks and re-prioritises a sequence the first appends to: every call
 * answers 0 or KVT_EBUSY (the sequence is in another thread's fanned-out call or batch), never
 * half a call, and every byte reads back. The header's contract says an append's K/V are written
 * before a park of that sequence (the park copies them), so the worker holds @wlock from its
 * append of s[0] until the K/V are written, and the parker takes it around each park; a park
 * still races the worker's prepares, batches and releases of the sequence. */
struct thr_arg {
	struct kvt_engine *e;
	kvt_seq_id s[2];
	uint32_t tag;
	int rounds;
	pthread_mutex_t *wlock; /* append + write of s[0] vs park (NULL: none) */
	int busy;     /* KVT_EBUSY answers seen (parker) */
	int bad;      /* other failures */
};

/* Count a failure of @a's thread (no cmocka assertion in a worker thread: the test checks
 * the counts after joining), with a line saying what. */
static void
thr_bad(struct thr_arg *a, int round, const char *what, int rc)
{
	a->bad++;
	fprintf(stderr, "test_threads: tag %u round %d: %s: %d %s\n", a->tag, round, what, rc,
		kvt_last_error_message());
}

static void *
thr_worker(void *p)
{
	struct thr_arg *a = p;
	uint64_t at[2] = { 0, 0 };
	int r, i, rc;

	for (r = 0; r < a->rounds; r++) {
		struct kvt_batch *b = NULL;

		for (i = 0; i < 2; i++) {
			do {
				if (a->wlock && i == 0)
					pthread_mutex_lock(a->wlock);
				rc = model_append(a->e, a->s[i], a->tag + (uint32_t)i, at[i], 3);
				if (a->wlock && i == 0)
					pthread_mutex_unlock(a->wlock);
			} while (rc == KVT_EBUSY);
			if (rc) {
				thr_bad(a, r, "append", rc);
				return NULL;
			}
			at[i] += 3;
		}
		do /* -ENOSPC: "not now", the other threads' batches and appends pin HBM */
			rc = kvt_batch_prepare(a->e, a->s, 2, &b);
		while (rc == KVT_EBUSY || rc == -ENOSPC);
		if (rc) {
			thr_bad(a, r, "prepare", rc);
			return NULL;
		}
		for (i = 0; i < 2; i++) {
			unsigned bad = model_mismatches(b, (uint32_t)i, a->tag + (uint32_t)i);

			if (bad) {
				fprintf(stderr, "test_threads: tag %u round %d: entry %d: %u places "
					"differ from what was written\n", a->tag, r, i, bad);
				a->bad += (int)bad;
			}
		}
		if ((rc = kvt_batch_release(b, NULL)))
			thr_bad(a, r, "release", rc);
	}
	return NULL;
}

static void *
thr_parker(void *p)
{
	struct thr_arg *a = p;
	int r, rc;

	for (r = 0; r < a->rounds; r++) {
		pthread_mutex_lock(a->wlock);
		rc = r % 2 ? kvt_seq_park(a->e, a->s[0], KVT_TIER_HOST)
			   : kvt_seq_set_priority(a->e, a->s[0], 0, 0, 60, 0);
		pthread_mutex_unlock(a->wlock);
		if (rc == KVT_EBUSY)
			a->busy++;
		else if (rc)
			thr_bad(a, r, r % 2 ? "park" : "set_priority", rc);
		(void)kvt_engine_poll(a->e, 0);
	}
	return NULL;
}

static void
test_threads(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	pthread_mutex_t wlock = PTHREAD_MUTEX_INITIALIZER;
	struct thr_arg w[2], pk;
	pthread_t t[3];
	struct kvt_engine *e;
	uint32_t i, k;

	(void)state;
	model_opts(&o, g, 24, 24, NULL, 0);
	e = model_create(&o);
	for (i = 0; i < 2; i++) {
		w[i] = (struct thr_arg){ .e = e, .tag = 10 + 2 * i, .rounds = 10 };
		for (k = 0; k < 2; k++)
			assert_int_equal(kvt_seq_open(e, NULL, &w[i].s[k]), 0);
	}
	w[0].wlock = &wlock;
	pk = (struct thr_arg){ .e = e, .s = { w[0].s[0] }, .rounds = 200, .wlock = &wlock };
	assert_int_equal(pthread_create(&t[0], NULL, thr_worker, &w[0]), 0);
	assert_int_equal(pthread_create(&t[1], NULL, thr_worker, &w[1]), 0);
	assert_int_equal(pthread_create(&t[2], NULL, thr_parker, &pk), 0);
	for (i = 0; i < 3; i++)
		assert_int_equal(pthread_join(t[i], NULL), 0);
	assert_int_equal(w[0].bad + w[1].bad + pk.bad, 0);
	for (i = 0; i < 2; i++)
		for (k = 0; k < 2; k++) {
			struct kvt_seq_info in;

			assert_int_equal(kvt_seq_info(e, w[i].s[k], &in), 0);
			assert_int_equal(in.n_tokens, 30);
			model_verify(e, w[i].s[k], w[i].tag + k);
			assert_int_equal(kvt_seq_close(e, w[i].s[k]), 0);
		}
	kvt_engine_destroy(e);
}

/* A prepare that fails in a later group gives back what the earlier groups prepared: no batch,
 * no pins, the sequence free for the next call in every group. */
static void
test_prepare_failure_undone(void **state)
{
	double sum = 8.0 * (BB0 + BB1) + 2.5 * BB2;
	struct kvt_group_geometry gg;
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_batch *b = NULL;
	struct kvt_stats st;
	struct kvt_engine *e;
	kvt_seq_id s;

	(void)state;
	model_opts(&o, g, 8, 0, NULL, 0);
	g[0].share = (float)(8.0 * BB0 / sum);
	g[1].share = (float)(8.0 * BB1 / sum);
	g[2].share = (float)(2.5 * BB2 / sum);
	o.hbm_bytes = (uint64_t)sum + 64;
	o.host_bytes = 4 * o.hbm_bytes;
	e = model_create(&o);
	assert_int_equal(kvt_group_geometry(e, 2, &gg), 0);
	assert_int_equal(gg.hbm_slots, 2);
	assert_true(gg.host_slots >= 8);
	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	assert_int_equal(model_append(e, s, 4, 0, 4), 0);
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_HOST), 0);
	assert_int_equal(model_append(e, s, 4, 4, 4), 0);
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_HOST), 0);
	assert_int_equal(model_append(e, s, 4, 8, 2), 0);
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	/* 3 blocks: group 0 and 1 prepare them, group 2's HBM has 2 slots */
	assert_int_equal(kvt_batch_prepare(e, &s, 1, &b), KVT_ETOOBIG);
	assert_null(b);
	assert_non_null(strstr(kvt_last_error_message(), "group 2:"));
	memset(&st, 0, sizeof st);
	st.size = sizeof st;
	assert_int_equal(kvt_engine_stats(e, &st), 0);
	assert_int_equal(st.batches_open, 0);
	assert_int_equal(kvt_engine_group_stats(e, 0, &st), 0);
	assert_int_equal(st.batches_open, 0);
	/* nothing holds the sequence: park, then windows that fit, then close */
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_HOST), 0);
	{
		struct kvt_seq_range r = { s, 1, 2 };

		assert_int_equal(kvt_batch_prepare_ranges(e, &r, 1, &b), 0);
		model_check(e, b, 0, 4);
		assert_int_equal(kvt_batch_release(b, NULL), 0);
	}
	assert_int_equal(kvt_seq_close(e, s), 0);
	kvt_engine_destroy(e);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_no_groups_is_one_full_group),
		cmocka_unit_test(test_bad_descriptors),
		cmocka_unit_test(test_pool_too_small_names_group),
		cmocka_unit_test(test_geometry_and_layer_map),
		cmocka_unit_test(test_default_split),
		cmocka_unit_test(test_default_split_window_floor),
		cmocka_unit_test(test_offload_roundtrip),
		cmocka_unit_test(test_offload_roundtrip_codec),
		cmocka_unit_test(test_batch_tables),
		cmocka_unit_test(test_append_failure_undone),
		cmocka_unit_test(test_prepare_failure_undone),
		cmocka_unit_test(test_prefix_per_group),
		cmocka_unit_test(test_tenant_budget_groups),
		cmocka_unit_test(test_closed_ids),
		cmocka_unit_test(test_store_kill_restore),
		cmocka_unit_test(test_threads),
		cmocka_unit_test(test_metrics_per_group),
		cmocka_unit_test(test_store_partial_session_absent),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
