/* SPDX-License-Identifier: MIT */
/*
 * tests/test_sidecar.c - SIDECAR layer groups (issue 17 item 2; engine/kvtier.h "SIDECAR
 * groups"): per-token and per-block metadata stored in the parent group's blocks (an indexer's
 * keys, a page summary), moving with them, and a host mirror read without bringing the blocks
 * up. A FULL group of 2 layers carries a sidecar of 8 bytes per token and 16 per block and
 * layer; the caller writes K/V and sidecar bytes derived from (tag, position, layer). Checked:
 * descriptors (each bad one a clear error), the layout inside the parent's block and the
 * tables, exact bytes through demotion to HOST and NVMe and park/resume (through the tables
 * and through kvt_seq_sidecar_read, the latter moving no block), prefix hits sharing them, a
 * persistent store across kill -9 (the mirror refilled by the first prepare), reads of a
 * block being written, and the Quest page summary kvtier keeps itself (KVT_SUMMARY_K_MINMAX).
 */
#include <errno.h>
#include <pthread.h>
#include <math.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdarg.h>
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
#define NL 2u
#define KV_DIM 4u
#define SC_TOK 8u
#define SC_BLK 16u
#define KV_LAYER (TPB * 2u * KV_DIM * 4u)            /* K and V of one layer of a block */
#define SC_LAYER (TPB * SC_TOK + SC_BLK)
#define BB (NL * (KV_LAYER + SC_LAYER))

static const uint32_t layers[] = { 0, 1 };

static void
sc_groups(struct kvt_group *g)
{
	kvt_group_init(&g[0], sizeof g[0]);
	kvt_group_init(&g[1], sizeof g[1]);
	g[0].kind = KVT_GROUP_FULL;
	g[0].n_layers = NL;
	g[0].layers = layers;
	g[0].n_kv_heads = 1;
	g[0].head_dim = KV_DIM;
	g[0].dtype = KVT_DTYPE_F32;
	g[1].kind = KVT_GROUP_SIDECAR;
	g[1].parent = 0;
	g[1].sidecar_token_bytes = SC_TOK;
	g[1].sidecar_block_bytes = SC_BLK;
}

static void
sc_opts(struct kvt_engine_opts *o, struct kvt_group *g, uint32_t hbm, uint32_t host,
	const char *dir)
{
	sc_groups(g);
	kvt_engine_opts_init(o, sizeof *o);
	o->layout.n_layers = NL;
	o->layout.tokens_per_block = TPB;
	o->groups = g;
	o->n_groups = 2;
	o->hbm_bytes = (uint64_t)hbm * BB + BB / 2;
	o->host_bytes = host ? (uint64_t)host * BB + BB / 2 : 0;
	o->prefix_cache = 1;
	if (dir) {
		o->nvme_dir = dir;
		o->nvme_bytes = 8u << 20;
	}
}

static struct kvt_engine *
sc_create(const struct kvt_engine_opts *o)
{
	struct kvt_engine *e = NULL;
	int rc = kvt_engine_create(o, &e);

	if (rc)
		fprintf(stderr, "create: %s\n", kvt_last_error_message());
	assert_int_equal(rc, 0);
	return e;
}

static int32_t
tok_of(uint32_t tag, uint64_t pos)
{
	return (int32_t)(tag * 1000u + (uint32_t)pos);
}

/* The sidecar byte @i of token @pos (per-token part) of layer @l. */
static uint8_t
tok_byte(uint32_t tag, uint64_t pos, uint32_t l, uint32_t i)
{
	return (uint8_t)(tag * 31u + pos * 7u + l * 101u + i * 13u + 1u);
}

/* The per-block part of block @blk of layer @l when it holds @n tokens: depends on them. */
static uint8_t
blk_byte(uint32_t tag, uint64_t blk, uint32_t l, uint32_t i, uint32_t n)
{
	return (uint8_t)(tag * 17u + blk * 5u + l * 3u + i * 11u + n * 29u + 7u);
}

/* Check @got, the sidecar of layer @l of block @blk of a sequence of @len tokens of @tag:
 * the tokens it holds and its per-block part (the rest of a partial block is whatever the
 * slot held: kvtier does not clear slots). */
static void
sc_expect(const uint8_t *got, uint32_t tag, uint64_t blk, uint32_t l, uint64_t len)
{
	uint32_t t, i, n = (uint32_t)(len - blk * TPB < TPB ? len - blk * TPB : TPB);
	uint8_t want[SC_LAYER];

	memset(want, 0, sizeof want);
	for (t = 0; t < n; t++)
		for (i = 0; i < SC_TOK; i++)
			want[t * SC_TOK + i] = tok_byte(tag, blk * TPB + t, l, i);
	for (i = 0; i < SC_BLK; i++)
		want[TPB * SC_TOK + i] = blk_byte(tag, blk, l, i, n);
	assert_memory_equal(got, want, n * SC_TOK);
	assert_memory_equal(got + TPB * SC_TOK, want + TPB * SC_TOK, SC_BLK);
}

/* Append @n tokens of @tag from @from to @s, writing K/V and the sidecar through the slot
 * mappings (the sidecar row is the parent's), prepare and release. Returns 0 or the failing
 * call's code (1: the sidecar row is not the parent's); no cmocka assert (a forked child). */
static int
sc_append_rc(struct kvt_engine *e, kvt_seq_id s, uint32_t tag, uint64_t from, uint32_t n)
{
	struct kvt_group_geometry geo, pg;
	struct kvt_batch *b = NULL;
	int32_t tok[64];
	int64_t map[2 * 64];
	uint64_t off = 0, tb = 0, bb = 0;
	uint32_t j, l, i;
	int rc;

	if (n > 64)
		return -EINVAL;
	for (j = 0; j < n; j++)
		tok[j] = tok_of(tag, from + j);
	rc = kvt_seq_append_groups(e, s, tok, n, map);
	if (rc)
		return rc;
	for (j = 0; j < n; j++)
		if (map[n + j] != map[j])
			return 1;
	rc = kvt_group_geometry(e, 1, &geo);
	if (!rc)
		rc = kvt_group_geometry(e, 0, &pg); /* K/V: the parent's geometry */
	if (!rc)
		rc = kvt_group_sidecar(e, 1, &off, &tb, &bb);
	if (!rc)
		rc = kvt_batch_prepare(e, &s, 1, &b);
	if (rc)
		return rc;
	for (j = 0; j < n; j++) {
		uint64_t pos = from + j, m = (uint64_t)map[j];
		uint8_t *blk = (uint8_t *)geo.hbm_base + m / TPB * geo.block_bytes;

		for (l = 0; l < NL; l++) {
			uint8_t *sc = blk + l * geo.layer_block_bytes + off;
			float *k, *v;

			for (i = 0; i < SC_TOK; i++)
				sc[m % TPB * tb + i] = tok_byte(tag, pos, l, i);
			for (i = 0; i < SC_BLK; i++)
				sc[TPB * tb + i] = blk_byte(tag, pos / TPB, l, i,
							    (uint32_t)(pos % TPB + 1));
			kvt_group_kv_addr(&pg, l, (int64_t)m, (void **)&k, (void **)&v);
			for (i = 0; i < KV_DIM; i++) {
				k[i] = (float)tok[j] + (float)(l * 10 + i);
				v[i] = -(float)tok[j] - (float)(l * 10 + i);
			}
		}
	}
	{
		int r2 = kvt_batch_release(b, NULL);

		return rc ? rc : r2;
	}
}

static void
sc_append(struct kvt_engine *e, kvt_seq_id s, uint32_t tag, uint64_t from, uint32_t n)
{
	int rc = sc_append_rc(e, s, tag, from, n);

	if (rc)
		fprintf(stderr, "append: %d %s\n", rc, rc < 0 ? kvt_last_error_message() : "");
	assert_int_equal(rc, 0);
}

/* Every block's sidecar of @s (@len tokens of @tag) read by kvt_seq_sidecar_read, exact. */
static void
sc_check_read(struct kvt_engine *e, kvt_seq_id s, uint32_t tag, uint64_t len)
{
	uint32_t nb = (uint32_t)((len + TPB - 1) / TPB), j, l;
	uint8_t *got = malloc((size_t)nb * SC_LAYER);

	assert_non_null(got);
	for (l = 0; l < NL; l++) {
		int rc = kvt_seq_sidecar_read(e, s, 1, l, 0, nb, got);

		if (rc)
			fprintf(stderr, "sidecar_read: %s\n", kvt_last_error_message());
		assert_int_equal(rc, 0);
		for (j = 0; j < nb; j++)
			sc_expect(got + (size_t)j * SC_LAYER, tag, j, l, len);
	}
	free(got);
}

/* Prepare @s whole and check K/V and sidecar of every block through the tables. */
static void
sc_check_table(struct kvt_engine *e, kvt_seq_id s, uint32_t tag, uint64_t len)
{
	struct kvt_group_table t, ts;
	struct kvt_batch *b = NULL;
	uint32_t k, l;

	assert_int_equal(kvt_batch_prepare(e, &s, 1, &b), 0);
	for (l = 0; l < NL; l++)
		assert_int_equal(kvt_batch_wait_group_layer(b, 1, l, NULL), 0);
	assert_int_equal(kvt_batch_group_table(b, 0, &t), 0);
	assert_int_equal(kvt_batch_group_table(b, 1, &ts), 0);
	assert_int_equal(ts.group, 0); /* the parent's table */
	assert_ptr_equal(ts.indices, t.indices);
	for (k = t.indptr[0]; k < t.indptr[1]; k++) {
		uint8_t *blk = (uint8_t *)t.geo.hbm_base + (uint64_t)t.indices[k] * t.geo.block_bytes;
		uint32_t pos = t.block_pos[k];

		for (l = 0; l < NL; l++) {
			const float *kk = (const float *)(const void *)(blk +
								  l * t.geo.layer_block_bytes);

			sc_expect(blk + l * t.geo.layer_block_bytes + KV_LAYER, tag, pos, l, len);
			assert_true(kk[0] == (float)tok_of(tag, (uint64_t)pos * TPB) + (float)(l * 10));
		}
	}
	assert_int_equal(kvt_batch_release(b, NULL), 0);
}

static void
expect_refused(struct kvt_group *g, uint32_t n, int code, const char *msg)
{
	struct kvt_engine_opts o;
	struct kvt_engine *e = NULL;
	int rc;

	kvt_engine_opts_init(&o, sizeof o);
	o.layout.n_layers = NL;
	o.layout.tokens_per_block = TPB;
	o.groups = g;
	o.n_groups = n;
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
test_bad_descriptors(void **state)
{
	static const uint32_t l0[] = { 0 }, l1[] = { 1 }, swapped[] = { 1, 0 };
	struct kvt_group g[3];

	(void)state;
	sc_groups(g);
	g[1].parent = 1;
	expect_refused(g, 2, -EINVAL, "group 1: parent 1 is not another group");
	sc_groups(g);
	g[1].parent = 7;
	expect_refused(g, 2, -EINVAL, "group 1: parent 7 is not another group");
	sc_groups(g);
	g[1].sidecar_token_bytes = g[1].sidecar_block_bytes = 0;
	expect_refused(g, 2, -EINVAL, "needs sidecar_token_bytes or sidecar_block_bytes");
	sc_groups(g);
	g[1].sidecar_token_bytes = 1u << 17;
	expect_refused(g, 2, -EINVAL, "out of range");
	sc_groups(g);
	g[1].tokens_per_block = 2 * TPB;
	expect_refused(g, 2, KVT_ENOTSUP, "tokens_per_block 8 differs");
	/* its layers are the parent's, in order */
	sc_groups(g);
	g[1].n_layers = NL;
	g[1].layers = swapped;
	expect_refused(g, 2, -EINVAL, "layer 0 of the sidecar is model layer 1, its parent's is 0");
	sc_groups(g);
	g[1].n_layers = 1;
	g[1].layers = l0;
	expect_refused(g, 2, -EINVAL, "a sidecar's layers are its parent's");
	/* a parent that stores no K/V per token */
	sc_groups(g);
	g[0].n_layers = 1;
	g[0].layers = l0;
	g[2] = g[1];
	g[1] = g[0];
	g[1].layers = l1;
	g[1].kind = KVT_GROUP_ALIAS;
	g[1].alias_of = l0;
	g[2].parent = 1;
	expect_refused(g, 3, -EINVAL, "its parent, group 1, is a ALIAS group");
	/* two sidecars on one parent; a sidecar of a sidecar */
	sc_groups(g);
	g[2] = g[1];
	expect_refused(g, 3, -EINVAL, "group 0 already has a sidecar");
	g[2].parent = 1;
	expect_refused(g, 3, -EINVAL, "its parent, group 1, is a SIDECAR group");
}

static void
test_layout_and_tables(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[2];
	struct kvt_group_geometry pg, sg;
	struct kvt_engine *e;
	uint64_t off = 0, tb = 0, bb = 0;
	uint32_t grp = 9, lig = 9;
	kvt_seq_id s;

	(void)state;
	sc_opts(&o, g, 16, 0, NULL);
	e = sc_create(&o);
	assert_int_equal(kvt_engine_n_groups(e), 2);
	assert_int_equal(kvt_group_geometry(e, 0, &pg), 0);
	assert_int_equal(kvt_group_geometry(e, 1, &sg), 0);
	assert_int_equal(pg.layer_block_bytes, KV_LAYER + SC_LAYER);
	assert_int_equal(pg.block_bytes, BB);
	assert_int_equal(pg.v_offset, TPB * KV_DIM * 4);
	assert_int_equal(pg.hbm_slots, 16);
	assert_int_equal(sg.kind, KVT_GROUP_SIDECAR);
	assert_ptr_equal(sg.hbm_base, pg.hbm_base);
	assert_int_equal(sg.block_bytes, BB);
	assert_int_equal(sg.layer_block_bytes, pg.layer_block_bytes);
	assert_int_equal(sg.hbm_slots, 16);
	assert_int_equal(sg.n_layers, NL);
	assert_int_equal(sg.k_token_bytes, 0);
	assert_int_equal(kvt_group_sidecar(e, 1, &off, &tb, &bb), 0);
	assert_int_equal(off, KV_LAYER);
	assert_int_equal(tb, SC_TOK);
	assert_int_equal(bb, SC_BLK);
	assert_int_equal(kvt_group_sidecar(e, 0, &off, NULL, NULL), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "FULL group, not SIDECAR"));
	assert_int_equal(kvt_group_sidecar(e, 2, NULL, NULL, NULL), -EINVAL);
	/* the model's layers belong to the parent */
	assert_int_equal(kvt_layer_group(e, 1, &grp, &lig), 0);
	assert_int_equal(grp, 0);
	assert_int_equal(lig, 1);
	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	sc_append(e, s, 3, 0, 2 * TPB + 1);
	sc_check_table(e, s, 3, 2 * TPB + 1);
	sc_check_read(e, s, 3, 2 * TPB + 1);
	/* a block being written reads as it is now: decode on and read again */
	sc_append(e, s, 3, 2 * TPB + 1, 1);
	sc_check_read(e, s, 3, 2 * TPB + 2);
	/* bad reads */
	{
		uint8_t buf[4 * SC_LAYER];

		assert_int_equal(kvt_seq_sidecar_read(e, s, 1, NL, 0, 1, buf), -EINVAL);
		assert_non_null(strstr(kvt_last_error_message(), "layer 2 out of range"));
		assert_int_equal(kvt_seq_sidecar_read(e, s, 1, 0, 2, 2, buf), -EINVAL);
		assert_non_null(strstr(kvt_last_error_message(), "past the sequence's 3 blocks"));
		assert_int_equal(kvt_seq_sidecar_read(e, s, 0, 0, 0, 1, buf), -EINVAL);
		assert_int_equal(kvt_seq_sidecar_read(e, s, 1, 0, 0, 1, NULL), -EINVAL);
		assert_int_equal(kvt_seq_sidecar_read(e, s, 1, 0, 0, 0, NULL), -EINVAL);
		assert_int_equal(kvt_seq_sidecar_read(e, s + 99, 1, 0, 0, 1, buf), KVT_ECLOSED);
		assert_int_equal(kvt_seq_sidecar_read(e, s, 1, 0, 0, 0, buf), 0);
	}
	assert_int_equal(kvt_seq_close(e, s), 0);
	kvt_engine_destroy(e);
}

/* Four sequences in an HBM of 6 blocks and a HOST of 6, the rest on NVMe: the sidecars come
 * back exact through the tables, and kvt_seq_sidecar_read reads every block wherever it is
 * without moving any. A park to NVMe and back keeps them. */
static void
test_offload_and_reads_move_nothing(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[2];
	struct kvt_stats st0, st1;
	struct kvt_seq_info in;
	struct kvt_engine *e;
	char *dir = tsup_mkdtemp();
	kvt_seq_id s[4];
	uint32_t i, k;

	(void)state;
	sc_opts(&o, g, 6, 6, dir);
	o.prefix_cache = 0;
	e = sc_create(&o);
	for (i = 0; i < 4; i++) {
		assert_int_equal(kvt_seq_open(e, NULL, &s[i]), 0);
		for (k = 0; k < 5; k++)
			sc_append(e, s[i], 10 + i, k * 3, 3);
	}
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_info(e, s[0], &in), 0);
	assert_true(in.blocks_in[KVT_TIER_NVME] > 0); /* the first sequence went down */
	memset(&st0, 0, sizeof st0);
	st0.size = sizeof st0;
	assert_int_equal(kvt_engine_stats(e, &st0), 0);
	for (i = 0; i < 4; i++)
		sc_check_read(e, s[i], 10 + i, 15);
	memset(&st1, 0, sizeof st1);
	st1.size = sizeof st1;
	assert_int_equal(kvt_engine_stats(e, &st1), 0);
	for (k = 0; k < KVT_MOVE_COUNT; k++)
		assert_int_equal(st1.blocks_moved[k], st0.blocks_moved[k]);
	for (i = 0; i < 4; i++)
		sc_check_table(e, s[i], 10 + i, 15);
	assert_int_equal(kvt_seq_park(e, s[2], KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_info(e, s[2], &in), 0);
	assert_int_equal(in.blocks_in[KVT_TIER_HBM] + in.blocks_in[KVT_TIER_HOST], 0);
	sc_check_read(e, s[2], 12, 15);
	assert_int_equal(kvt_seq_resume(e, s[2]), 0);
	sc_append(e, s[2], 12, 15, 2);
	sc_check_table(e, s[2], 12, 17);
	sc_check_read(e, s[2], 12, 17);
	for (i = 0; i < 4; i++)
		assert_int_equal(kvt_seq_close(e, s[i]), 0);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* A prefix hit shares the blocks, sidecars included: the attached sequence reads them (the
 * mirror is the block's) and through its tables, then decodes on. */
static void
test_prefix_hit_shares_sidecars(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[2];
	struct kvt_engine *e;
	int32_t tok[32];
	uint64_t a = 0, p;
	kvt_seq_id s, r;

	(void)state;
	sc_opts(&o, g, 16, 8, NULL);
	e = sc_create(&o);
	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	sc_append(e, s, 5, 0, 3 * TPB + 2);
	assert_int_equal(kvt_seq_close(e, s), 0);
	for (p = 0; p < 3 * TPB + 2; p++)
		tok[p] = tok_of(5, p);
	assert_int_equal(kvt_seq_open(e, NULL, &r), 0);
	assert_int_equal(kvt_seq_attach_prefix(e, r, tok, 3 * TPB + 1, &a), 0);
	assert_int_equal(a, 3 * TPB);
	sc_check_read(e, r, 5, 3 * TPB);
	sc_append(e, r, 5, 3 * TPB, 2);
	sc_check_table(e, r, 5, 3 * TPB + 2);
	sc_check_read(e, r, 5, 3 * TPB + 2);
	assert_int_equal(kvt_seq_close(e, r), 0);
	kvt_engine_destroy(e);
}

/* The persistent store: a session parked in a child killed with SIGKILL is restored with its
 * sidecars; the mirror is empty then (-EAGAIN for blocks only on NVMe) until a prepare brings
 * them up, and every byte is the one written. A store of another sidecar size is refused. */
static void
store_kill_restore(enum kvt_codec codec)
{
	struct kvt_engine_opts o;
	struct kvt_group g[2];
	struct kvt_seq_opts so;
	struct kvt_engine *e;
	char *dir = tsup_mkdtemp();
	uint8_t buf[8 * SC_LAYER];
	uint64_t keys[2];
	kvt_seq_id s, r;
	pid_t pid;
	int st = 0;

	sc_opts(&o, g, 16, 8, dir);
	o.nvme_persist = 1;
	o.prefix_cache = 0;
	o.nvme_codec = codec; /* encoded on NVMe: the mirror is filled from the decoded bytes */
	o.nvme_codec_min_saving = 0.0f;
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		/* no cmocka asserts would reach the parent: exit codes */
		if (kvt_engine_create(&o, &e))
			_exit(2);
		kvt_seq_opts_init(&so, sizeof so);
		so.session_key = 91;
		if (kvt_seq_open(e, &so, &s))
			_exit(3);
		if (sc_append_rc(e, s, 8, 0, 4 * TPB + 1))
			_exit(4);
		if (kvt_seq_park(e, s, KVT_TIER_NVME) || kvt_engine_drain(e))
			_exit(5);
		kill(getpid(), SIGKILL);
		_exit(6);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	e = sc_create(&o);
	assert_int_equal(kvt_session_list(e, keys, 2), 1);
	assert_int_equal(kvt_seq_restore(e, 91, NULL, &r), 0);
	assert_int_equal(kvt_seq_sidecar_read(e, r, 1, 0, 0, 5, buf), -EAGAIN);
	assert_non_null(strstr(kvt_last_error_message(), "only on NVMe"));
	sc_check_table(e, r, 8, 4 * TPB + 1);
	sc_check_read(e, r, 8, 4 * TPB + 1);
	sc_append(e, r, 8, 4 * TPB + 1, 3);
	sc_check_read(e, r, 8, 4 * TPB + 4);
	assert_int_equal(kvt_seq_close(e, r), 0);
	kvt_engine_destroy(e);
	g[1].sidecar_block_bytes = SC_BLK + 4;
	assert_int_equal(kvt_engine_create(&o, &e), KVT_EFORMAT);
	tsup_rmdir(dir);
}

static void
test_store_kill_restore(void **state)
{
	(void)state;
	store_kill_restore(KVT_CODEC_NONE);
}

static void
test_store_kill_restore_codec(void **state)
{
	(void)state;
	store_kill_restore(KVT_CODEC_LZ4);
}

/* Threads: one decodes a sequence while another reads a second sequence's sidecars over and
 * over while the first's appends push its blocks down; every read is exact. No cmocka assert
 * in the threads: they return counts. */
struct sc_thr {
	struct kvt_engine *e;
	kvt_seq_id s;
	uint32_t tag, rounds;
	uint64_t len;
	int rc;
	uint32_t bad;
};

static void *
sc_decoder(void *arg)
{
	struct sc_thr *t = arg;
	uint32_t k;

	for (k = 0; k < t->rounds && !t->rc; k++)
		t->rc = sc_append_rc(t->e, t->s, t->tag, t->len + k, 1);
	return NULL;
}

static void *
sc_reader(void *arg)
{
	struct sc_thr *t = arg;
	uint32_t nb = (uint32_t)((t->len + TPB - 1) / TPB), k, j, l, i;
	uint8_t *got = malloc((size_t)nb * SC_LAYER);

	if (!got) {
		t->rc = -ENOMEM;
		return NULL;
	}
	for (k = 0; k < t->rounds && !t->rc; k++)
		for (l = 0; l < NL && !t->rc; l++) {
			t->rc = kvt_seq_sidecar_read(t->e, t->s, 1, l, 0, nb, got);
			for (j = 0; j < nb && !t->rc; j++) {
				uint32_t n = (uint32_t)(t->len - (uint64_t)j * TPB < TPB ?
							t->len - (uint64_t)j * TPB : TPB);

				for (i = 0; i < n * SC_TOK; i++)
					t->bad += got[(size_t)j * SC_LAYER + i] !=
						  tok_byte(t->tag, (uint64_t)j * TPB + i / SC_TOK, l,
							   i % SC_TOK);
				for (i = 0; i < SC_BLK; i++)
					t->bad += got[(size_t)j * SC_LAYER + TPB * SC_TOK + i] !=
						  blk_byte(t->tag, j, l, i, n);
			}
		}
	free(got);
	return NULL;
}

static void
test_threads_read_while_decoding(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[2];
	struct kvt_engine *e;
	struct sc_thr d, r;
	pthread_t td, tr;
	char *dir = tsup_mkdtemp();
	kvt_seq_id a, b;

	(void)state;
	sc_opts(&o, g, 16, 8, dir); /* a's 11 blocks and b's 8 do not fit 16 HBM slots */
	o.prefix_cache = 0;
	e = sc_create(&o);
	assert_int_equal(kvt_seq_open(e, NULL, &a), 0);
	assert_int_equal(kvt_seq_open(e, NULL, &b), 0);
	sc_append(e, b, 21, 0, 7 * TPB + 2);
	sc_append(e, a, 20, 0, 2);
	d = (struct sc_thr){ .e = e, .s = a, .tag = 20, .rounds = 40, .len = 2 };
	r = (struct sc_thr){ .e = e, .s = b, .tag = 21, .rounds = 60, .len = 7 * TPB + 2 };
	assert_int_equal(pthread_create(&td, NULL, sc_decoder, &d), 0);
	assert_int_equal(pthread_create(&tr, NULL, sc_reader, &r), 0);
	assert_int_equal(pthread_join(td, NULL), 0);
	assert_int_equal(pthread_join(tr, NULL), 0);
	if (d.rc || r.rc)
		fprintf(stderr, "decoder %d, reader %d\n", d.rc, r.rc);
	assert_int_equal(d.rc, 0);
	assert_int_equal(r.rc, 0);
	assert_int_equal(r.bad, 0);
	{
		struct kvt_seq_info in;

		assert_int_equal(kvt_seq_info(e, b, &in), 0); /* b's blocks went down meanwhile */
		assert_true(in.blocks_in[KVT_TIER_HOST] + in.blocks_in[KVT_TIER_NVME] > 0);
	}
	sc_check_read(e, a, 20, 42);
	assert_int_equal(kvt_seq_close(e, a), 0);
	assert_int_equal(kvt_seq_close(e, b), 0);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* Per-group sparse prepares: with FULL (+ its sidecar) and WINDOW groups, a step prepares in
 * the FULL pool only two selected blocks (one-block ranges, through the sidecar's group id)
 * while a second batch holds the WINDOW group's window of the same sequence; each table lists
 * just its blocks, the other group answers -EINVAL, and both release. */
static void
test_prepare_per_group(void **state)
{
	static const uint32_t l0[] = { 0 }, l1[] = { 1 };
	struct kvt_engine_opts o;
	struct kvt_group g[3];
	struct kvt_group_table t;
	struct kvt_batch *bf = NULL, *bw = NULL;
	struct kvt_seq_range sel[2];
	struct kvt_engine *e;
	int32_t tok[40];
	int64_t map[3 * TPB];
	kvt_seq_id s;
	uint32_t j;

	(void)state;
	sc_groups(g);
	g[0].n_layers = 1;
	g[0].layers = l0;
	g[2] = g[1];
	g[1] = g[0];
	g[1].kind = KVT_GROUP_WINDOW;
	g[1].layers = l1;
	g[1].window = 2 * TPB;
	g[2].parent = 0;
	kvt_engine_opts_init(&o, sizeof o);
	o.layout.n_layers = NL;
	o.layout.tokens_per_block = TPB;
	o.groups = g;
	o.n_groups = 3;
	o.hbm_bytes = 1 << 20;
	e = sc_create(&o);
	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	for (j = 0; j < 40; j++)
		tok[j] = (int32_t)j;
	for (j = 0; j < 40; j += TPB) { /* a block per step: the WINDOW pool is small */
		assert_int_equal(kvt_seq_append_groups(e, s, tok + j, TPB, map), 0);
		assert_int_equal(kvt_batch_prepare(e, &s, 1, &bf), 0);
		assert_int_equal(kvt_batch_release(bf, NULL), 0);
	}
	sel[0] = (struct kvt_seq_range){ .seq = s, .first_block = 2, .n_blocks = 1 };
	sel[1] = (struct kvt_seq_range){ .seq = s, .first_block = 7, .n_blocks = 1 };
	assert_int_equal(kvt_batch_prepare_group(e, 2, sel, 2, &bf), 0);
	{
		struct kvt_seq_range w = { .seq = s, .first_block = 7, .n_blocks = 3 };

		assert_int_equal(kvt_batch_prepare_group(e, 1, &w, 1, &bw), 0);
	}
	/* one table entry per range, of one block each */
	assert_int_equal(kvt_batch_group_table(bf, 0, &t), 0);
	assert_int_equal(t.n_seqs, 2);
	assert_int_equal(t.indptr[2], 2);
	assert_int_equal(t.block_pos[t.indptr[0]], 2);
	assert_int_equal(t.block_pos[t.indptr[1]], 7);
	assert_int_equal(kvt_batch_group_table(bf, 2, &t), 0); /* the sidecar: the parent's */
	assert_int_equal(t.indptr[2], 2);
	assert_int_equal(kvt_batch_group_table(bf, 1, &t), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "not in this batch"));
	assert_int_equal(kvt_batch_wait_group_layer(bf, 1, 0, NULL), -EINVAL);
	assert_int_equal(kvt_batch_wait_layer(bf, 1, NULL), -EINVAL);
	assert_int_equal(kvt_batch_wait_layer(bf, 0, NULL), 0);
	assert_int_equal(kvt_batch_group_table(bw, 1, &t), 0);
	assert_int_equal(t.indptr[1], 3);
	assert_int_equal(kvt_batch_group_table(bw, 0, &t), -EINVAL);
	/* the same pool twice for one sequence: busy, as any second batch */
	{
		struct kvt_batch *b2 = NULL;

		assert_int_equal(kvt_batch_prepare_group(e, 0, sel, 1, &b2), KVT_EBUSY);
		assert_null(b2);
	}
	assert_int_equal(kvt_batch_release(bf, NULL), 0);
	assert_int_equal(kvt_batch_release(bw, NULL), 0);
	assert_int_equal(kvt_batch_prepare_group(e, 3, sel, 1, &bf), -EINVAL);
	assert_int_equal(kvt_seq_close(e, s), 0);
	kvt_engine_destroy(e);
}

/*
 * A summary sidecar (KVT_SUMMARY_K_MINMAX): kvtier keeps per block, layer and KV head the
 * element-wise min and max of K (Quest), checked against a min/max taken here over the K
 * values the test wrote: for full and partial blocks, after more tokens land in the last
 * block, and for blocks demoted to NVMe (read without moving them). A LATENT parent has one
 * head of latent_dim. Bad combinations are refused.
 */
#define QH 2u
#define QD 3u

static float
q_val(uint32_t tag, uint64_t pos, uint32_t l, uint32_t h, uint32_t i)
{
	uint32_t x = (uint32_t)(tag * 2654435761u ^ (uint32_t)pos * 40503u ^ l * 977u ^ h * 131u ^
				i * 7919u);

	return (float)(x % 2001u) / 100.0f - 10.0f;
}

static void
q_append(struct kvt_engine *e, kvt_seq_id s, uint32_t tag, uint64_t from, uint32_t n)
{
	struct kvt_group_geometry pg;
	struct kvt_batch *b = NULL;
	int32_t tok[16];
	int64_t map[2 * 16];
	uint32_t j, l, h, i;

	for (j = 0; j < n; j++)
		tok[j] = tok_of(tag, from + j);
	assert_int_equal(kvt_seq_append_groups(e, s, tok, n, map), 0);
	assert_int_equal(kvt_group_geometry(e, 0, &pg), 0);
	assert_int_equal(kvt_batch_prepare(e, &s, 1, &b), 0);
	for (j = 0; j < n; j++)
		for (l = 0; l < NL; l++) {
			float *k, *v;

			kvt_group_kv_addr(&pg, l, map[j], (void **)&k, (void **)&v);
			for (h = 0; h < pg.n_kv_heads; h++)
				for (i = 0; i < pg.head_dim; i++)
					k[h * pg.head_dim + i] = q_val(tag, from + j, l, h, i);
		}
	assert_int_equal(kvt_batch_release(b, NULL), 0);
}

/* Check the summaries of every block of @s (@len tokens of @tag; @nh heads of @hd). */
static void
q_check(struct kvt_engine *e, kvt_seq_id s, uint32_t tag, uint64_t len, uint32_t nh,
	uint32_t hd)
{
	uint32_t nb = (uint32_t)((len + TPB - 1) / TPB), j, l, h, i;
	uint64_t per = (uint64_t)nh * 2 * hd;
	float *got = malloc(nb * per * sizeof *got);

	assert_non_null(got);
	for (l = 0; l < NL; l++) {
		int rc = kvt_seq_sidecar_read(e, s, 1, l, 0, nb, got);

		if (rc)
			fprintf(stderr, "summary read: %s\n", kvt_last_error_message());
		assert_int_equal(rc, 0);
		for (j = 0; j < nb; j++)
			for (h = 0; h < nh; h++)
				for (i = 0; i < hd; i++) {
					float mn = INFINITY, mx = -INFINITY;
					uint64_t p;

					for (p = (uint64_t)j * TPB; p < len && p < (uint64_t)(j + 1) * TPB;
					     p++) {
						float x = q_val(tag, p, l, h, i);

						mn = x < mn ? x : mn;
						mx = x > mx ? x : mx;
					}
					assert_true(got[j * per + h * 2 * hd + i] == mn);
					assert_true(got[j * per + h * 2 * hd + hd + i] == mx);
				}
	}
	free(got);
}

static void
test_summary_sidecar(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_group g[2];
	struct kvt_seq_info in;
	struct kvt_engine *e;
	char *dir = tsup_mkdtemp();
	uint64_t off = 1, tb = 1, bb = 0;
	kvt_seq_id s[3];
	uint32_t i;

	(void)state;
	sc_groups(g);
	g[0].n_kv_heads = QH;
	g[0].head_dim = QD;
	g[1].sidecar_token_bytes = g[1].sidecar_block_bytes = 0;
	g[1].sidecar_summary = KVT_SUMMARY_K_MINMAX;
	kvt_engine_opts_init(&o, sizeof o);
	o.layout.n_layers = NL;
	o.layout.tokens_per_block = TPB;
	o.groups = g;
	o.n_groups = 2;
	o.hbm_bytes = 6 * (NL * TPB * 2 * QH * QD * 4) + 8;
	o.host_bytes = 4 * (NL * TPB * 2 * QH * QD * 4) + 8;
	o.nvme_dir = dir;
	o.nvme_bytes = 8u << 20;
	e = sc_create(&o);
	assert_int_equal(kvt_group_sidecar(e, 1, &off, &tb, &bb), 0);
	assert_int_equal(tb, 0);
	assert_int_equal(bb, QH * 2 * QD * 4);
	{
		struct kvt_group_geometry pg;

		assert_int_equal(kvt_group_geometry(e, 0, &pg), 0);
		assert_int_equal(pg.layer_block_bytes, TPB * 2 * QH * QD * 4); /* nothing added */
	}
	for (i = 0; i < 3; i++) {
		assert_int_equal(kvt_seq_open(e, NULL, &s[i]), 0);
		q_append(e, s[i], 50 + i, 0, 3);
		q_check(e, s[i], 50 + i, 3, QH, QD); /* a partial block */
		q_append(e, s[i], 50 + i, 3, 6);
		q_check(e, s[i], 50 + i, 9, QH, QD); /* the last block grew */
	}
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_info(e, s[0], &in), 0);
	assert_true(in.blocks_in[KVT_TIER_NVME] > 0);
	for (i = 0; i < 3; i++)
		q_check(e, s[i], 50 + i, 9, QH, QD);
	for (i = 0; i < 3; i++)
		assert_int_equal(kvt_seq_close(e, s[i]), 0);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
	/* a LATENT parent: one head of latent_dim */
	sc_groups(g);
	g[0].kind = KVT_GROUP_LATENT;
	g[0].latent_dim = 5;
	g[1].sidecar_token_bytes = g[1].sidecar_block_bytes = 0;
	g[1].sidecar_summary = KVT_SUMMARY_K_MINMAX;
	o.nvme_dir = NULL;
	o.host_bytes = 0;
	o.hbm_bytes = 1 << 20;
	e = sc_create(&o);
	assert_int_equal(kvt_group_sidecar(e, 1, NULL, NULL, &bb), 0);
	assert_int_equal(bb, 2 * 5 * 4);
	assert_int_equal(kvt_seq_open(e, NULL, &s[0]), 0);
	q_append(e, s[0], 60, 0, 7);
	q_check(e, s[0], 60, 7, 1, 5);
	assert_int_equal(kvt_seq_close(e, s[0]), 0);
	kvt_engine_destroy(e);
	/* refused: bytes with a summary, an unknown summary */
	sc_groups(g);
	g[1].sidecar_summary = KVT_SUMMARY_K_MINMAX;
	expect_refused(g, 2, -EINVAL, "sidecar_token_bytes and sidecar_block_bytes must be 0");
	sc_groups(g);
	g[1].sidecar_summary = 9;
	expect_refused(g, 2, -EINVAL, "unknown sidecar_summary 9");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bad_descriptors),
		cmocka_unit_test(test_layout_and_tables),
		cmocka_unit_test(test_offload_and_reads_move_nothing),
		cmocka_unit_test(test_prefix_hit_shares_sidecars),
		cmocka_unit_test(test_store_kill_restore),
		cmocka_unit_test(test_store_kill_restore_codec),
		cmocka_unit_test(test_summary_sidecar),
		cmocka_unit_test(test_prepare_per_group),
		cmocka_unit_test(test_threads_read_while_decoding),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
