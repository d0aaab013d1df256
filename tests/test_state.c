/* SPDX-License-Identifier: MIT */
/*
 * tests/test_state.c - STATE layer groups (issue 17 item 1; engine/kvtier.h "STATE groups"):
 * the per-sequence recurrent state of linear-attention layers, one slot per block holding the
 * state after the block's last token. A toy recurrence stands in for Gated DeltaNet (the
 * model-level proof is tools/kvtier-hf on the transformers fixture): every step reads the
 * state after the previous token from the batch's STATE table and writes the next one into
 * the appended token's block; a reference in plain memory runs the same recurrence. Checked:
 * descriptors (each bad one a clear error), the slot geometry and tensor offsets, exact states
 * through demotion to HOST and NVMe and park/resume with several sequences competing for a
 * small pool, prefix hits that restore a checkpoint byte-exact at, and one token either side
 * of, block boundaries (vLLM #44599), hits never served by a pool lacking the checkpoint, the
 * persistent store across kill -9, host- and NVMe-tier hits, and only the live blocks staying
 * referenced.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "kvtier.h"
#include "support/kvt_test.h"

#define TPB 4u
#define NL 3u /* layers 0, 1: STATE; layer 2: FULL */
#define NG 2u
#define KV_DIM 4u
/* state of one layer: tensor 0 F16 [3] (6 bytes), tensor 1 F32 [2][5] at offset 8 (40 bytes) */
#define S0_N 3u
#define S1_N 10u
#define S_LAYER 48u
#define S_BLOCK (2u * S_LAYER)
#define FULL_BB (TPB * 2u * KV_DIM * 4u)

static const uint32_t full_layers[] = { 2 }, state_layers[] = { 0, 1 };

static void
st_groups(struct kvt_group *g)
{
	kvt_group_init(&g[0], sizeof g[0]);
	kvt_group_init(&g[1], sizeof g[1]);
	g[0].kind = KVT_GROUP_FULL;
	g[0].n_layers = 1;
	g[0].layers = full_layers;
	g[0].n_kv_heads = 1;
	g[0].head_dim = KV_DIM;
	g[0].dtype = KVT_DTYPE_F32;
	g[1].kind = KVT_GROUP_STATE;
	g[1].n_layers = 2;
	g[1].layers = state_layers;
	g[1].n_state = 2;
	g[1].state[0].n_dims = 1;
	g[1].state[0].shape[0] = S0_N;
	g[1].state[0].dtype = KVT_DTYPE_F16;
	g[1].state[1].n_dims = 2;
	g[1].state[1].shape[0] = 2;
	g[1].state[1].shape[1] = 5;
	g[1].state[1].dtype = KVT_DTYPE_F32;
}

/* @full / @state blocks of HBM and HOST per pool (exact shares, half a block of slack). */
static void
st_opts(struct kvt_engine_opts *o, struct kvt_group *g, uint32_t full_hbm, uint32_t state_hbm,
	uint32_t full_host, uint32_t state_host, const char *nvme_dir)
{
	double hbm = (full_hbm + 0.5) * FULL_BB + (state_hbm + 0.5) * S_BLOCK;
	double host = (full_host + 0.5) * FULL_BB + (state_host + 0.5) * S_BLOCK;

	st_groups(g);
	kvt_engine_opts_init(o, sizeof *o);
	o->layout.n_layers = NL;
	o->layout.tokens_per_block = TPB;
	o->groups = g;
	o->n_groups = NG;
	g[0].share = (float)((full_hbm + 0.5) * FULL_BB / hbm);
	g[1].share = (float)((state_hbm + 0.5) * S_BLOCK / hbm);
	o->hbm_bytes = (uint64_t)hbm;
	o->host_bytes = full_host ? (uint64_t)(host * 1.0) : 0;
	o->prefix_cache = 1;
	if (nvme_dir) {
		o->nvme_dir = nvme_dir;
		o->nvme_bytes = 64u << 20;
	}
	/* with HOST the shares must fit HOST too: the state pool gets what its share says */
	if (full_host && state_host * (full_hbm + 0.5) != full_host * (state_hbm + 0.5))
		o->host_bytes = (uint64_t)((full_host + 0.5) * FULL_BB / g[0].share) + 1;
}

static struct kvt_engine *
st_create(const struct kvt_engine_opts *o)
{
	struct kvt_engine *e = NULL;
	int rc = kvt_engine_create(o, &e);

	if (rc)
		fprintf(stderr, "create: %s (%s)\n", kvt_strerror(rc), kvt_last_error_message());
	assert_int_equal(rc, 0);
	return e;
}

/* The toy state: per layer, 3 "f16" counters (stored as uint16 bit patterns of a hash) and 10
 * f32 values; the step mixes in the token and the position, so that any stale, shifted or
 * foreign state shows. */
struct toy {
	uint16_t a[NL][S0_N];
	float b[NL][S1_N];
};

static void
toy_step(struct toy *t, int32_t tok, uint64_t pos)
{
	uint32_t l, j;

	for (l = 0; l < 2; l++) {
		for (j = 0; j < S0_N; j++)
			t->a[l][j] = (uint16_t)(t->a[l][j] * 31u + (uint32_t)tok * 7u + l + j + 1u);
		for (j = 0; j < S1_N; j++)
			t->b[l][j] = t->b[l][j] * 0.5f + (float)((tok + (int32_t)j + (int32_t)l) % 97) +
				     (float)(pos % 13) * 0.25f;
	}
}

static void
toy_store(const struct toy *t, uint8_t *blk)
{
	uint32_t l;

	for (l = 0; l < 2; l++) {
		memset(blk + l * S_LAYER, 0, S_LAYER);
		memcpy(blk + l * S_LAYER, t->a[l], sizeof t->a[l]);
		memcpy(blk + l * S_LAYER + 8, t->b[l], sizeof t->b[l]);
	}
}

static void
toy_load(struct toy *t, const uint8_t *blk)
{
	uint32_t l;

	memset(t, 0, sizeof *t);
	for (l = 0; l < 2; l++) {
		memcpy(t->a[l], blk + l * S_LAYER, sizeof t->a[l]);
		memcpy(t->b[l], blk + l * S_LAYER + 8, sizeof t->b[l]);
	}
}

static int32_t
tok_of(uint32_t tag, uint64_t pos)
{
	return (int32_t)(tag * 1000u + (uint32_t)(pos % 500u));
}

/* The reference state after tokens [0, n) of prompt @tag. */
static void
toy_ref(struct toy *t, uint32_t tag, uint64_t n)
{
	uint64_t p;

	memset(t, 0, sizeof *t);
	for (p = 0; p < n; p++)
		toy_step(t, tok_of(tag, p), p);
}

/* The STATE table entry of block position @pos in batch entry @i, or NULL. */
static uint8_t *
st_block(struct kvt_batch *b, uint32_t i, uint32_t pos)
{
	struct kvt_group_table t;
	uint32_t k;

	if (kvt_batch_group_table(b, 1, &t) != 0)
		return NULL;
	for (k = t.indptr[i]; k < t.indptr[i + 1]; k++)
		if (t.block_pos[k] == pos)
			return (uint8_t *)t.geo.hbm_base + (uint64_t)t.indices[k] * t.geo.block_bytes;
	return NULL;
}

/*
 * One decode step of sequence @s (tokens of @tag) holding @n tokens: append token n, prepare,
 * read the state after token n - 1 (zeros at n = 0) from its block, step, write the new state
 * into token n's block, write its K/V, release. Returns 0, or the failing call's code, or 1
 * (printed) when the state read is not the reference.
 */
static int
st_step(struct kvt_engine *e, kvt_seq_id s, uint32_t tag, uint64_t n)
{
	struct kvt_group_geometry fg, sg;
	struct kvt_batch *b = NULL;
	struct toy t, ref;
	int64_t map[NG];
	int32_t tok = tok_of(tag, n);
	uint8_t *prev, *next;
	float *k, *v;
	uint32_t j;
	int rc;

	rc = kvt_seq_append_groups(e, s, &tok, 1, map);
	if (rc)
		return rc;
	rc = kvt_batch_prepare(e, &s, 1, &b);
	if (rc)
		return rc;
	rc = kvt_batch_wait_layer(b, 0, NULL);
	if (!rc)
		rc = kvt_batch_wait_layer(b, 1, NULL);
	if (rc)
		goto out;
	memset(&t, 0, sizeof t);
	if (n > 0) {
		prev = st_block(b, 0, (uint32_t)((n - 1) / TPB));
		if (!prev) {
			fprintf(stderr, "step %llu: no live block for token %llu\n",
				(unsigned long long)n, (unsigned long long)n - 1);
			rc = 1;
			goto out;
		}
		toy_load(&t, prev);
	}
	toy_ref(&ref, tag, n);
	if (memcmp(&t, &ref, sizeof t) != 0) {
		fprintf(stderr, "step %llu of tag %u: the state read is not the reference\n",
			(unsigned long long)n, tag);
		rc = 1;
		goto out;
	}
	toy_step(&t, tok, n);
	next = st_block(b, 0, (uint32_t)(n / TPB));
	rc = kvt_group_geometry(e, 1, &sg);
	if (rc)
		goto out;
	/* the slot mapping of the append names the table's block of token n */
	if (!next || map[1] < 0 ||
	    next != (uint8_t *)sg.hbm_base + (uint64_t)map[1] / TPB * sg.block_bytes) {
		fprintf(stderr, "step %llu: token %llu's block is not in the table\n",
			(unsigned long long)n, (unsigned long long)n);
		rc = 1;
		goto out;
	}
	toy_store(&t, next);
	rc = kvt_group_geometry(e, 0, &fg);
	if (rc)
		goto out;
	kvt_group_kv_addr(&fg, 0, map[0], (void **)&k, (void **)&v);
	for (j = 0; j < KV_DIM; j++) {
		k[j] = (float)tok + (float)j;
		v[j] = -(float)tok - (float)j;
	}
out:
	{
		int r2 = kvt_batch_release(b, NULL);

		return rc ? rc : r2;
	}
}

/* Decode tokens [from, to) of @tag into @s, asserting each step. */
static void
st_run(struct kvt_engine *e, kvt_seq_id s, uint32_t tag, uint64_t from, uint64_t to)
{
	uint64_t n;

	for (n = from; n < to; n++) {
		int rc = st_step(e, s, tag, n);

		if (rc)
			fprintf(stderr, "step %llu: %s (%s)\n", (unsigned long long)n,
				rc > 0 ? "mismatch" : kvt_strerror(rc),
				rc > 0 ? "" : kvt_last_error_message());
		assert_int_equal(rc, 0);
	}
}

static void
expect_refused(struct kvt_group *g, int code, const char *msg)
{
	struct kvt_engine_opts o;
	struct kvt_engine *e = NULL;
	int rc;

	kvt_engine_opts_init(&o, sizeof o);
	o.layout.n_layers = NL;
	o.layout.tokens_per_block = TPB;
	o.groups = g;
	o.n_groups = NG;
	o.hbm_bytes = 1 << 20;
	rc = kvt_engine_create(&o, &e);
	if (rc != code || !strstr(kvt_last_error_message(), msg))
		fprintf(stderr, "want %d \"%s\", got %d \"%s\"\n", code, msg, rc,
			kvt_last_error_message());
	assert_int_equal(rc, code);
	assert_non_null(strstr(kvt_last_error_message(), msg));
	assert_null(e);
}

static void
test_bad_state_descriptors(void **state)
{
	struct kvt_group g[NG];

	(void)state;
	st_groups(g);
	g[1].n_state = 0;
	expect_refused(g, -EINVAL, "group 1: n_state 0 out of range 1..4");
	st_groups(g);
	g[1].n_state = 5;
	expect_refused(g, -EINVAL, "group 1: n_state 5 out of range 1..4");
	st_groups(g);
	g[1].state[1].n_dims = 0;
	expect_refused(g, -EINVAL, "group 1: state tensor 1: n_dims 0 out of range 1..4");
	st_groups(g);
	g[1].state[0].n_dims = 5;
	expect_refused(g, -EINVAL, "state tensor 0: n_dims 5");
	st_groups(g);
	g[1].state[1].shape[1] = 0;
	expect_refused(g, -EINVAL, "group 1: state tensor 1: shape[1] = 0 out of range");
	st_groups(g);
	g[1].state[0].dtype = (enum kvt_dtype)99;
	expect_refused(g, -EINVAL, "group 1: state tensor 0: unknown element type 99");
	st_groups(g);
	g[1].state[1].n_dims = 3;
	g[1].state[1].shape[0] = 1u << 20;
	g[1].state[1].shape[1] = 1u << 10;
	g[1].state[1].shape[2] = 2;
	expect_refused(g, -EINVAL, "more than 2^30 elements");
	/* coarser checkpoints than a block are not there yet: said so */
	st_groups(g);
	g[1].tokens_per_block = 2 * TPB;
	expect_refused(g, KVT_ENOTSUP, "group 1: tokens_per_block 8 differs");
	/* a state too big for the block limit (1 GiB): 2^28 f32 elements x 2 layers x 2 */
	st_groups(g);
	g[1].state[1].n_dims = 2;
	g[1].state[1].shape[0] = 1u << 14;
	g[1].state[1].shape[1] = 1u << 14;
	g[1].n_state = 2;
	g[1].state[0].shape[0] = 1u << 20;
	g[1].state[0].n_dims = 2;
	g[1].state[0].shape[1] = 1u << 8;
	g[1].state[0].dtype = KVT_DTYPE_F32;
	expect_refused(g, -EINVAL, "exceeds the block limit");
	/* an ALIAS of a STATE layer: nothing per token to share (4 layers: FULL {2}, STATE
	 * {0, 1}, ALIAS {3} reading layer 0) */
	{
		static const uint32_t al[] = { 3 }, src[] = { 0 };
		struct kvt_group g3[3];
		struct kvt_engine_opts o;
		struct kvt_engine *e = NULL;

		st_groups(g3);
		kvt_group_init(&g3[2], sizeof g3[2]);
		g3[2].kind = KVT_GROUP_ALIAS;
		g3[2].n_layers = 1;
		g3[2].layers = al;
		g3[2].alias_of = src;
		kvt_engine_opts_init(&o, sizeof o);
		o.layout.n_layers = NL + 1;
		o.layout.tokens_per_block = TPB;
		o.groups = g3;
		o.n_groups = 3;
		o.hbm_bytes = 1 << 20;
		assert_int_equal(kvt_engine_create(&o, &e), -EINVAL);
		assert_non_null(strstr(kvt_last_error_message(), "a STATE layer"));
		assert_null(e);
	}
	/* a STATE pool of one HBM slot: no decode step could hold the two it needs */
	{
		struct kvt_engine_opts o;
		struct kvt_engine *e = NULL;

		st_opts(&o, g, 8, 1, 0, 0, NULL);
		g[1].share = (float)(1.2 * S_BLOCK / (double)o.hbm_bytes);
		g[0].share = 1.0f - g[1].share;
		assert_int_equal(kvt_engine_create(&o, &e), -EINVAL);
		assert_non_null(strstr(kvt_last_error_message(), "needs 2 at once"));
		assert_null(e);
	}
}

static void
test_geometry(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_group_geometry geo;
	struct kvt_engine *e;
	uint64_t off = 1, bytes = 1;

	(void)state;
	st_opts(&o, g, 8, 5, 0, 0, NULL);
	e = st_create(&o);
	assert_int_equal(kvt_group_geometry(e, 1, &geo), 0);
	assert_int_equal(geo.kind, KVT_GROUP_STATE);
	assert_int_equal(geo.n_layers, 2);
	assert_int_equal(geo.layer_block_bytes, S_LAYER);
	assert_int_equal(geo.block_bytes, S_BLOCK);
	assert_int_equal(geo.k_token_bytes, 0);
	assert_int_equal(geo.v_token_bytes, 0);
	assert_int_equal(geo.n_kv_heads, 0);
	assert_int_equal(geo.window, 0);
	assert_int_equal(geo.tokens_per_block, TPB);
	assert_int_equal(geo.hbm_slots, 5);
	assert_int_equal(kvt_group_state_tensor(e, 1, 0, &off, &bytes), 0);
	assert_int_equal(off, 0);
	assert_int_equal(bytes, 6);
	assert_int_equal(kvt_group_state_tensor(e, 1, 1, &off, &bytes), 0);
	assert_int_equal(off, 8); /* f32 after 6 bytes of f16: aligned to 4 */
	assert_int_equal(bytes, 40);
	assert_int_equal(kvt_group_state_tensor(e, 1, 1, NULL, &bytes), 0);
	assert_int_equal(bytes, 40);
	assert_int_equal(kvt_group_state_tensor(e, 1, 2, &off, &bytes), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "tensor 2 out of range"));
	assert_int_equal(kvt_group_state_tensor(e, 0, 0, &off, &bytes), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "FULL group, not STATE"));
	assert_int_equal(kvt_group_state_tensor(e, 2, 0, &off, &bytes), -EINVAL);
	assert_int_equal(kvt_group_state_tensor(NULL, 1, 0, &off, &bytes), -EINVAL);
	{
		uint32_t grp = 9, lig = 9;

		assert_int_equal(kvt_layer_group(e, 1, &grp, &lig), 0);
		assert_int_equal(grp, 1);
		assert_int_equal(lig, 1);
	}
	kvt_engine_destroy(e);
	/* the default split sizes a STATE pool for its two live blocks (grp_bound_blocks), not
	 * for ref tokens */
	st_groups(g);
	kvt_engine_opts_init(&o, sizeof o);
	o.layout.n_layers = NL;
	o.layout.tokens_per_block = TPB;
	o.groups = g;
	o.n_groups = NG;
	o.group_ref_tokens = 4096;
	o.hbm_bytes = 1 << 20;
	e = st_create(&o);
	assert_int_equal(kvt_group_geometry(e, 1, &geo), 0);
	{
		struct kvt_group_geometry fg;
		double want = 2.0 * S_BLOCK / (2.0 * S_BLOCK + 1024.0 * FULL_BB);

		assert_int_equal(kvt_group_geometry(e, 0, &fg), 0);
		assert_true(geo.hbm_slots >= (uint32_t)(want * (1 << 20) / S_BLOCK) - 1);
		assert_true(geo.hbm_slots <= (uint32_t)(want * (1 << 20) / S_BLOCK) + 1);
	}
	kvt_engine_destroy(e);
}

/* Three sequences decode in turns with a STATE pool of 5 HBM slots and 4 HOST slots, the rest
 * on NVMe: states go down and come back exact; only the live blocks stay referenced. */
static void
test_offload_exact(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_seq_info in;
	struct kvt_stats st;
	struct kvt_engine *e;
	kvt_seq_id s[3];
	char *dir = tsup_mkdtemp();
	uint64_t n;
	uint32_t i;

	(void)state;
	st_opts(&o, g, 64, 5, 64, 4, dir);
	o.prefix_cache = 0;
	e = st_create(&o);
	for (i = 0; i < 3; i++)
		assert_int_equal(kvt_seq_open(e, NULL, &s[i]), 0);
	for (n = 0; n < 30; n++)
		for (i = 0; i < 3; i++) {
			st_run(e, s[i], 10 + i, n, n + 1);
			if (n % 7 == 6 && i == 1) {
				/* park to NVMe and back between turns */
				assert_int_equal(kvt_seq_park(e, s[i], KVT_TIER_NVME), 0);
				assert_int_equal(kvt_seq_resume(e, s[i]), 0);
			}
		}
	st.size = sizeof st;
	assert_int_equal(kvt_engine_group_stats(e, 1, &st), 0);
	assert_true(st.tier[KVT_TIER_HOST].evictions + st.tier[KVT_TIER_HBM].evictions > 0);
	for (i = 0; i < 3; i++) {
		assert_int_equal(kvt_seq_info(e, s[i], &in), 0);
		assert_int_equal(in.n_tokens, 30);
	}
	/* the STATE pool holds at most 2 live blocks per sequence (no prefix cache), each with
	 * at most a copy per tier: 18 slots in use at most, where the 24 blocks the sequences
	 * went through would take 24 at least */
	st.size = sizeof st;
	assert_int_equal(kvt_engine_group_stats(e, 1, &st), 0);
	assert_true(st.tier[KVT_TIER_HBM].used_slots + st.tier[KVT_TIER_HOST].used_slots +
			    st.tier[KVT_TIER_NVME].used_slots <= 3 * 2 * 3);
	for (i = 0; i < 3; i++)
		assert_int_equal(kvt_seq_close(e, s[i]), 0);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* Decode prompt @tag to @len tokens in a new sequence and close it: its checkpoints stay
 * cached. */
static void
st_prefill_close(struct kvt_engine *e, uint32_t tag, uint64_t len)
{
	kvt_seq_id s;

	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	st_run(e, s, tag, 0, len);
	assert_int_equal(kvt_seq_close(e, s), 0);
}

/* A prompt of @len tokens that shares the cached prompt: the hit asked with the prompt less
 * its last token ends at the checkpoint before it; the attached state is the reference at
 * the hit, and decoding on from there stays exact. Returns the hit. */
static uint64_t
st_hit(struct kvt_engine *e, uint32_t tag, uint64_t len, uint64_t go_on)
{
	int32_t tok[256];
	uint64_t m = 0, a = 0;
	enum kvt_tier tier;
	kvt_seq_id s;
	uint64_t p;

	for (p = 0; p < len; p++)
		tok[p] = tok_of(tag, p);
	assert_int_equal(kvt_seq_match_prefix(e, NULL, tok, len - 1, &m, &tier), 0);
	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	assert_int_equal(kvt_seq_attach_prefix(e, s, tok, len - 1, &a), 0);
	assert_int_equal(a, m);
	assert_true(a % TPB == 0 && a <= len - 1);
	/* st_step checks the restored checkpoint against the reference at a */
	st_run(e, s, tag, a, len + go_on);
	assert_int_equal(kvt_seq_close(e, s), 0);
	return a;
}

/* vLLM #44599: prompts ending exactly on a block boundary and one token either side. */
static void
test_checkpoint_hits_at_boundaries(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_engine *e;
	struct kvt_stats st;

	(void)state;
	st_opts(&o, g, 64, 40, 0, 0, NULL);
	e = st_create(&o);
	st_prefill_close(e, 5, 7 * TPB);
	/* exactly 6 blocks: the hit of its first 23 tokens ends at 5 blocks */
	assert_int_equal(st_hit(e, 5, 6 * TPB, 3), 5 * TPB);
	/* one more: the hit ends at 6 blocks */
	assert_int_equal(st_hit(e, 5, 6 * TPB + 1, 3), 6 * TPB);
	/* one less */
	assert_int_equal(st_hit(e, 5, 6 * TPB - 1, 3), 5 * TPB);
	/* 2 tokens: no whole block to hit */
	assert_int_equal(st_hit(e, 5, 2, 2), 0);
	/* a prompt that shares the first 9 tokens (mid-block) reuses the checkpoint at 8 */
	{
		int32_t tok[40];
		uint64_t m = 0, p;

		for (p = 0; p < 40; p++)
			tok[p] = p < 9 ? tok_of(5, p) : tok_of(6, p);
		assert_int_equal(kvt_seq_match_prefix(e, NULL, tok, 39, &m, NULL), 0);
		assert_int_equal(m, 2 * TPB);
	}
	st.size = sizeof st;
	assert_int_equal(kvt_engine_group_stats(e, 1, &st), 0);
	assert_true(st.prefix_hit_blocks > 0);
	kvt_engine_destroy(e);
}

/* Checkpoints live in the STATE pool's prefix cache, evicted like blocks: with a pool of 6
 * HBM and a few HOST slots most of the 36 checkpoints of six closed prompts go while the FULL
 * pool keeps every block. A hit then ends only where the STATE pool still has the checkpoint
 * (every group attaches the same boundary: the pools agree), restored exact by st_hit; the
 * most recent prompts (asked first) still hit. */
static void
test_hits_only_where_checkpoints_are(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_engine *e;
	uint32_t tag, hits = 0, lost = 0;

	(void)state;
	st_opts(&o, g, 256, 6, 256, 4, NULL);
	e = st_create(&o);
	for (tag = 20; tag < 26; tag++)
		st_prefill_close(e, tag, 6 * TPB + 2);
	for (tag = 25; tag >= 20; tag--) {
		uint64_t a = st_hit(e, tag, 6 * TPB + 2, 2);

		hits += a > 0;
		lost += a < 6 * TPB;
	}
	assert_true(hits > 0);
	/* 36 checkpoints do not fit 6 + 4 slots: some prompts lost their last one */
	assert_true(lost > 0);
	kvt_engine_destroy(e);
}

/* SGLang #39830 / vLLM #41515: a hit served from HOST and from NVMe restores the checkpoint
 * exact. The prompt is parked to the tier before it closes: its live blocks (the checkpoint
 * of the last whole block among them) are cached there. */
static void
test_host_and_nvme_tier_hits(void **state)
{
	static const enum kvt_tier tiers[] = { KVT_TIER_HOST, KVT_TIER_NVME };
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_engine *e;
	char *dir = tsup_mkdtemp();
	uint32_t i;

	(void)state;
	st_opts(&o, g, 64, 16, 64, 16, dir);
	e = st_create(&o);
	for (i = 0; i < 2; i++) {
		uint32_t tag = 40 + i;
		int32_t tok[64];
		uint64_t m = 0, p;
		enum kvt_tier where = KVT_TIER_COUNT;
		kvt_seq_id s;

		assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
		st_run(e, s, tag, 0, 5 * TPB + 1);
		assert_int_equal(kvt_seq_park(e, s, tiers[i]), 0);
		assert_int_equal(kvt_engine_drain(e), 0);
		assert_int_equal(kvt_seq_close(e, s), 0);
		for (p = 0; p < 5 * TPB + 1; p++)
			tok[p] = tok_of(tag, p);
		assert_int_equal(kvt_seq_match_prefix(e, NULL, tok, 5 * TPB, &m, &where), 0);
		assert_int_equal(m, 5 * TPB);
		assert_int_equal(where, tiers[i]);
		assert_int_equal(st_hit(e, tag, 5 * TPB + 1, 3), 5 * TPB);
	}
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* STATE pool slots in use in every tier together. */
static uint32_t
st_state_slots(struct kvt_engine *e)
{
	struct kvt_stats st;

	memset(&st, 0, sizeof st);
	st.size = sizeof st;
	assert_int_equal(kvt_engine_group_stats(e, 1, &st), 0);
	return st.tier[KVT_TIER_HBM].used_slots + st.tier[KVT_TIER_HOST].used_slots +
	       st.tier[KVT_TIER_NVME].used_slots;
}

/* The hit of prompt @tag's first @n tokens (asked with @n - 1, as st_hit). */
static uint64_t
st_match(struct kvt_engine *e, uint32_t tag, uint64_t n)
{
	int32_t tok[256];
	uint64_t m = 0, p;

	for (p = 0; p < n; p++)
		tok[p] = tok_of(tag, p);
	assert_int_equal(kvt_seq_match_prefix(e, NULL, tok, n - 1, &m, NULL), 0);
	return m;
}

/* checkpoint_every 3: only boundaries at multiples of 3 blocks keep their checkpoint (a third
 * of the memory); a hit ends at the last of them at or below the shared part, restored exact. */
static void
test_checkpoint_every_nth(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_engine *e;
	uint32_t every1;

	(void)state;
	st_opts(&o, g, 64, 40, 0, 0, NULL);
	e = st_create(&o);
	st_prefill_close(e, 7, 9 * TPB + 1);
	every1 = st_state_slots(e);
	kvt_engine_destroy(e);
	st_opts(&o, g, 64, 40, 0, 0, NULL);
	g[1].checkpoint_every = 3;
	e = st_create(&o);
	st_prefill_close(e, 7, 9 * TPB + 1);
	/* every block kept: 9 checkpoints; every third: 3 */
	assert_int_equal(every1, 9);
	assert_int_equal(st_state_slots(e), 3);
	assert_int_equal(st_match(e, 7, 9 * TPB + 1), 9 * TPB);
	assert_int_equal(st_match(e, 7, 8 * TPB + 2), 6 * TPB);
	assert_int_equal(st_match(e, 7, 6 * TPB), 3 * TPB); /* asked with 23 tokens: 3 blocks */
	assert_int_equal(st_match(e, 7, 2 * TPB + 3), 0);
	assert_int_equal(st_hit(e, 7, 8 * TPB + 2, 3), 6 * TPB);
	kvt_engine_destroy(e);
}

/* KVT_CHECKPOINT_ASKED: none kept but where the server asks (the end of a shared system
 * prompt of 10 tokens: the boundary at 8), asked before the prefill or while the block is
 * still held; errors for a passed boundary, too short a length, too many asks. */
static void
test_checkpoint_asked(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_engine *e;
	kvt_seq_id s;

	(void)state;
	st_opts(&o, g, 64, 40, 0, 0, NULL);
	g[1].checkpoint_every = KVT_CHECKPOINT_ASKED;
	e = st_create(&o);
	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	assert_int_equal(kvt_seq_checkpoint(e, s, 10), 0); /* boundary 8 */
	assert_int_equal(kvt_seq_checkpoint(e, s, TPB - 1), -EINVAL);
	st_run(e, s, 8, 0, 5 * TPB + 1);
	/* 21 tokens held: the live blocks are 4 (tokens 16..19, full) and 5; block 3 (the
	 * boundary at 16) left at the window's pass, not kept: too late to ask for it */
	assert_int_equal(kvt_seq_checkpoint(e, s, 4 * TPB), -ENOENT);
	assert_non_null(strstr(kvt_last_error_message(), "ask before"));
	/* the boundary at 20 (block 4, full, still held): kept now */
	assert_int_equal(kvt_seq_checkpoint(e, s, 5 * TPB), 0);
	assert_int_equal(kvt_seq_checkpoint(e, s, 40), 0);
	assert_int_equal(kvt_seq_checkpoint(e, s, 44), 0);
	assert_int_equal(kvt_seq_checkpoint(e, s, 48), 0);
	assert_int_equal(kvt_seq_checkpoint(e, s, 52), 0);
	assert_int_equal(kvt_seq_checkpoint(e, s, 56), -ENOSPC);
	assert_int_equal(kvt_seq_close(e, s), 0);
	assert_int_equal(kvt_seq_checkpoint(e, s, 8), KVT_ECLOSED);
	/* kept: the boundaries at 8 and 20 only */
	assert_int_equal(st_state_slots(e), 2);
	assert_int_equal(st_match(e, 8, 5 * TPB + 1), 5 * TPB);
	assert_int_equal(st_match(e, 8, 5 * TPB), 2 * TPB);
	assert_int_equal(st_hit(e, 8, 4 * TPB + 3, 2), 2 * TPB);
	kvt_engine_destroy(e);
}

/*
 * Prefix hits after a restart from a stored session: a session that stopped on a block
 * boundary stored its state there (its live STATE block is that checkpoint) and its FULL
 * blocks; a restarted engine's new sequence with that prompt attaches both pools at that
 * boundary, the state restored exact (st_hit decodes on from it, checking every step). One
 * that stopped inside a block stored no checkpoint at a boundary: no hit, never a wrong state.
 * (Before: windowed and STATE pools never looked at the store, so the pools agreed on 0.)
 */
static void
test_store_prefix_after_restart(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_seq_opts so;
	struct kvt_engine *e;
	char *dir = tsup_mkdtemp();
	int32_t tok[64];
	kvt_seq_id s;
	uint64_t m, p;

	(void)state;
	st_opts(&o, g, 32, 8, 32, 8, dir);
	o.nvme_persist = 1;
	e = st_create(&o);
	kvt_seq_opts_init(&so, sizeof so);
	so.session_key = 78;
	assert_int_equal(kvt_seq_open(e, &so, &s), 0);
	st_run(e, s, 40, 0, 4 * TPB); /* stops on a boundary */
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_detach(e, s), 0);
	so.session_key = 79;
	assert_int_equal(kvt_seq_open(e, &so, &s), 0);
	st_run(e, s, 41, 0, 4 * TPB + 3); /* stops inside block 4 */
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_detach(e, s), 0);
	kvt_engine_destroy(e);

	e = st_create(&o); /* a restart */
	assert_int_equal(st_hit(e, 40, 4 * TPB + 1, 5), 4 * TPB);
	for (p = 0; p < 4 * TPB + 3; p++)
		tok[p] = tok_of(41, p);
	assert_int_equal(kvt_seq_match_prefix(e, NULL, tok, 4 * TPB + 3, &m, NULL), 0);
	assert_int_equal(m, 0);
	/* the sessions themselves still restore and decode on */
	assert_int_equal(kvt_seq_restore(e, 78, NULL, &s), 0);
	st_run(e, s, 40, 4 * TPB, 5 * TPB);
	assert_int_equal(kvt_seq_close(e, s), 0);
	assert_int_equal(kvt_seq_restore(e, 79, NULL, &s), 0);
	st_run(e, s, 41, 4 * TPB + 3, 5 * TPB);
	assert_int_equal(kvt_seq_close(e, s), 0);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* The persistent store: a sequence parked to NVMe in a child killed with SIGKILL is restored
 * by a new engine with its live state, and decodes on exact. */
static void
test_store_kill_restore(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_seq_opts so;
	struct kvt_seq_info in;
	struct kvt_engine *e;
	char *dir = tsup_mkdtemp();
	uint64_t keys[4];
	kvt_seq_id s, r;
	pid_t pid;
	int st = 0;
	char sub[600], f[700];

	(void)state;
	st_opts(&o, g, 32, 8, 32, 8, dir);
	o.nvme_persist = 1;
	o.prefix_cache = 0;
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		if (kvt_engine_create(&o, &e))
			_exit(2);
		kvt_seq_opts_init(&so, sizeof so);
		so.session_key = 77;
		if (kvt_seq_open(e, &so, &s))
			_exit(3);
		for (uint64_t n = 0; n < 4 * TPB + 3; n++)
			if (st_step(e, s, 30, n))
				_exit(4);
		if (kvt_seq_park(e, s, KVT_TIER_NVME) || kvt_engine_drain(e))
			_exit(5);
		kill(getpid(), SIGKILL);
		_exit(6);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	e = st_create(&o);
	assert_int_equal(kvt_session_list(e, keys, 4), 1);
	assert_int_equal(keys[0], 77);
	assert_int_equal(kvt_seq_restore(e, 77, NULL, &r), 0);
	assert_int_equal(kvt_seq_info(e, r, &in), 0);
	assert_int_equal(in.n_tokens, 4 * TPB + 3);
	st_run(e, r, 30, 4 * TPB + 3, 7 * TPB);
	assert_int_equal(kvt_seq_close(e, r), 0);
	kvt_engine_destroy(e);
	/* a store of other state shapes is refused */
	g[1].state[1].shape[1] = 6;
	assert_int_equal(kvt_engine_create(&o, &e), KVT_EFORMAT);
	assert_non_null(strstr(kvt_last_error_message(), "made for other layer groups"));
	snprintf(sub, sizeof sub, "%s/group1", dir);
	snprintf(f, sizeof f, "%s/kvtier.store", sub);
	unlink(f);
	snprintf(f, sizeof f, "%s/kvtier.journal", sub);
	unlink(f);
	assert_int_equal(rmdir(sub), 0);
	tsup_rmdir(dir);
}

/* A prefill chunk: append tokens [@n, @n + @k) of @tag at once and write, into every block
 * they touch, the state after the chunk's last token in it (and their K/V). */
static void
st_chunk(struct kvt_engine *e, kvt_seq_id s, uint32_t tag, uint64_t n, uint32_t k)
{
	struct kvt_group_geometry fg;
	struct kvt_batch *b = NULL;
	int32_t tok[32];
	int64_t map[NG * 32];
	uint64_t j, p;
	uint32_t i;

	assert_true(k <= 32);
	for (i = 0; i < k; i++)
		tok[i] = tok_of(tag, n + i);
	assert_int_equal(kvt_seq_append_groups(e, s, tok, k, map), 0);
	assert_int_equal(kvt_batch_prepare(e, &s, 1, &b), 0);
	for (j = n / TPB; j <= (n + k - 1) / TPB; j++) {
		uint64_t last = (j + 1) * TPB < n + k ? (j + 1) * TPB : n + k;
		uint8_t *blk = st_block(b, 0, (uint32_t)j);
		struct toy t;

		assert_non_null(blk);
		toy_ref(&t, tag, last);
		toy_store(&t, blk);
	}
	assert_int_equal(kvt_group_geometry(e, 0, &fg), 0);
	for (p = n; p < n + k; p++) {
		float *kk, *vv;

		kvt_group_kv_addr(&fg, 0, map[p - n], (void **)&kk, (void **)&vv);
		for (i = 0; i < KV_DIM; i++) {
			kk[i] = (float)tok[p - n] + (float)i;
			vv[i] = -(float)tok[p - n] - (float)i;
		}
	}
	assert_int_equal(kvt_batch_release(b, NULL), 0);
}

/* A park that fails in the STATE pool (its NVMe share full) after the FULL pool published a
 * newer version: the pools' stores hold different lengths of the session. The restore gives
 * the longest length every pool serves (never FULL's 18 tokens with a 9-token state), and
 * the state read there is the reference: decoding on stays exact. */
static void
test_restore_of_mixed_versions(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_seq_opts so;
	struct kvt_seq_info in;
	struct kvt_group_geometry sg;
	struct kvt_engine *e;
	char *dir = tsup_mkdtemp();
	kvt_seq_id s;
	int rc;

	(void)state;
	st_groups(g);
	kvt_engine_opts_init(&o, sizeof o);
	o.layout.n_layers = NL;
	o.layout.tokens_per_block = TPB;
	o.groups = g;
	o.n_groups = NG;
	g[0].share = 0.96f;
	g[1].share = 0.04f;
	o.hbm_bytes = 1 << 16;
	o.host_bytes = 1 << 16;
	o.nvme_dir = dir;
	o.nvme_bytes = 8192 * 100;
	o.nvme_persist = 1;
	e = st_create(&o);
	assert_int_equal(kvt_group_geometry(e, 1, &sg), 0);
	assert_true(sg.nvme_slots >= 2 && sg.nvme_slots < 4);
	kvt_seq_opts_init(&so, sizeof so);
	so.session_key = 7;
	assert_int_equal(kvt_seq_open(e, &so, &s), 0);
	/* prefill chunks of 9: each holds the 3 blocks it touched until the next append */
	st_chunk(e, s, 70, 0, 9);
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	st_chunk(e, s, 70, 9, 9);
	rc = kvt_seq_park(e, s, KVT_TIER_NVME);
	assert_int_equal(rc, -ENOSPC); /* in the STATE pool; FULL's part went down */
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_detach(e, s), 0);
	assert_int_equal(kvt_seq_restore(e, 7, NULL, &s), 0);
	assert_int_equal(kvt_seq_info(e, s, &in), 0);
	assert_true(in.n_tokens <= 9);
	/* st_step checks the state it reads at n_tokens against the reference */
	st_run(e, s, 70, in.n_tokens, 5 * TPB);
	assert_int_equal(kvt_seq_close(e, s), 0);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* KVT_ELOST in the FULL pool (a corrupt block on NVMe) truncates the STATE pool to a length it
 * can serve too (a block boundary whose state it holds, or 0): every group agrees, and the
 * caller's recompute from kvt_seq_info's n_tokens reads the reference state there. */
static void
test_lost_block_keeps_groups_equal(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_seq_opts so;
	struct kvt_seq_info in;
	struct kvt_batch *b = NULL;
	struct kvt_engine *e;
	char *dir = tsup_mkdtemp(), path[700];
	uint8_t x[8];
	kvt_seq_id s;
	int fd, k, rc;

	(void)state;
	st_opts(&o, g, 32, 8, 32, 8, dir);
	o.nvme_persist = 1;
	o.prefix_cache = 0;
	e = st_create(&o);
	kvt_seq_opts_init(&so, sizeof so);
	so.session_key = 9;
	assert_int_equal(kvt_seq_open(e, &so, &s), 0);
	st_run(e, s, 80, 0, 5 * TPB + 2);
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_detach(e, s), 0);
	kvt_engine_destroy(e);
	/* flip bytes in the data of the FULL store's first slot (after its 1 MiB of metadata
	 * and the slot's 4 KiB header page) */
	snprintf(path, sizeof path, "%s/kvtier.store", dir);
	fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, x, 8, (1 << 20) + 4096), 8);
	for (k = 0; k < 8; k++)
		x[k] ^= 0x5a;
	assert_int_equal(pwrite(fd, x, 8, (1 << 20) + 4096), 8);
	close(fd);
	e = st_create(&o);
	assert_int_equal(kvt_seq_restore(e, 9, NULL, &s), 0);
	rc = kvt_batch_prepare(e, &s, 1, &b);
	assert_int_equal(rc, KVT_ELOST);
	assert_int_equal(kvt_seq_info(e, s, &in), 0);
	assert_true(in.n_tokens < 5 * TPB + 2);
	if (in.n_tokens) { /* the groups agree: a prepare of what is left works */
		assert_int_equal(kvt_batch_prepare(e, &s, 1, &b), 0);
		assert_int_equal(kvt_batch_release(b, NULL), 0);
	}
	st_run(e, s, 80, in.n_tokens, 6 * TPB);
	assert_int_equal(kvt_seq_close(e, s), 0);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* A create with a persistent store that fails at a later group (its pool cannot hold one
 * block) leaves no store, journal or group directory behind: a corrected retry on the same
 * directory works (it used to find the first groups' stores, "made for another capacity"). */
static void
test_failed_create_leaves_nothing(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[NG];
	struct kvt_engine *e = NULL;
	char *dir = tsup_mkdtemp();
	struct dirent *d;
	DIR *dh;
	int n = 0;

	(void)state;
	st_opts(&o, g, 32, 8, 32, 8, dir);
	o.nvme_persist = 1;
	g[0].share = 0.999f;
	g[1].share = 0.001f; /* the STATE pool: less than a block */
	assert_int_equal(kvt_engine_create(&o, &e), -EINVAL);
	assert_null(e);
	dh = opendir(dir);
	assert_non_null(dh);
	while ((d = readdir(dh)) != NULL)
		n += strcmp(d->d_name, ".") && strcmp(d->d_name, "..");
	closedir(dh);
	assert_int_equal(n, 0);
	st_opts(&o, g, 32, 8, 32, 8, dir);
	o.nvme_persist = 1;
	e = st_create(&o);
	kvt_engine_destroy(e);
	/* a failure again now (the first store refuses the other capacity, or the STATE pool
	 * its size) leaves the existing stores alone */
	g[0].share = 0.999f;
	g[1].share = 0.001f;
	assert_true(kvt_engine_create(&o, &e) < 0);
	assert_null(e);
	st_opts(&o, g, 32, 8, 32, 8, dir);
	o.nvme_persist = 1;
	e = st_create(&o); /* the store made above opens */
	kvt_engine_destroy(e);
	{
		char sub[600], f[700];

		snprintf(f, sizeof f, "%s/kvtier.store", dir);
		assert_int_equal(unlink(f), 0);
		snprintf(f, sizeof f, "%s/kvtier.journal", dir);
		unlink(f);
		snprintf(sub, sizeof sub, "%s/group1", dir);
		snprintf(f, sizeof f, "%s/kvtier.store", sub);
		assert_int_equal(unlink(f), 0);
		snprintf(f, sizeof f, "%s/kvtier.journal", sub);
		unlink(f);
		assert_int_equal(rmdir(sub), 0);
	}
	tsup_rmdir(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bad_state_descriptors),
		cmocka_unit_test(test_geometry),
		cmocka_unit_test(test_offload_exact),
		cmocka_unit_test(test_checkpoint_hits_at_boundaries),
		cmocka_unit_test(test_hits_only_where_checkpoints_are),
		cmocka_unit_test(test_host_and_nvme_tier_hits),
		cmocka_unit_test(test_checkpoint_every_nth),
		cmocka_unit_test(test_checkpoint_asked),
		cmocka_unit_test(test_store_kill_restore),
		cmocka_unit_test(test_store_prefix_after_restart),
		cmocka_unit_test(test_restore_of_mixed_versions),
		cmocka_unit_test(test_lost_block_keeps_groups_equal),
		cmocka_unit_test(test_failed_create_leaves_nothing),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
