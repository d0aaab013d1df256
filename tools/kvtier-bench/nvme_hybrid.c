/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-bench/nvme_hybrid.c - park/resume of hybrid sessions (issue 17): a FULL group
 * and a STATE group (engine/kvtier.h "STATE groups") parked to NVMe and resumed to HBM, for
 * the park/resume table of `kvtier-bench nvme`.
 *
 * The layout is Qwen3-Next's scaled to the bench: of the bench's 32 layers every 4th is full
 * attention (8 layers, the bench's 8 KV heads x head_dim 128, bf16; Qwen3-Next-80B: 12 of 48)
 * and the other 24 are Gated DeltaNet layers with Qwen3-Next-80B's own state per layer: the
 * convolution's last K - 1 = 3 inputs of conv_dim = 2 x 16 x 128 + 32 x 128 = 8192 channels and
 * the delta rule's 32 x 128 x 128 matrix, bf16 (1,097,728 bytes a layer, 25.1 MiB a slot).
 * Blocks hold 64 tokens, so a FULL block is 2 MiB as the single layout's (the same IO size as
 * the fio reference). A session is prefilled in chunks of one block, each append writing its
 * block's K/V and the state after its last token (the engine then keeps only the live state
 * slot: the checkpoints of older blocks leave, no prefix cache here), then parked: its FULL
 * blocks and its live state slot go to NVMe; resume brings both back until a batch holding the
 * session has every layer of both groups ready.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvtier.h"
#include "nvme_int.h"
#include "tiers/tier_nvme.h"
#include "util.h"

#define HY_LAYERS 32
#define HY_FULL_EVERY 4 /* layer i is full attention iff (i + 1) % 4 == 0 (Qwen3-Next) */
#define HY_TPB 64
#define HY_CONV_DIM (2 * 16 * 128 + 32 * 128)
#define HY_CONV_KEEP 3 /* linear_conv_kernel_dim 4, less one */
#define HY_HBM_STATE 4 /* state slots of HBM: the live 1-2 and room for the next append */
#define HY_HOST_STATE 8

struct hy_layers {
	uint32_t full[HY_LAYERS];  /* model layers of the FULL group */
	uint32_t state[HY_LAYERS]; /* of the STATE group */
	uint32_t n_full, n_state;  /* entries */
};

/* The two groups into @g (layer lists in @l, which must outlive the engine's create). */
static void
hy_groups(struct kvt_group g[2], struct hy_layers *l)
{
	uint32_t i;

	l->n_full = l->n_state = 0;
	for (i = 0; i < HY_LAYERS; i++) {
		if ((i + 1) % HY_FULL_EVERY == 0)
			l->full[l->n_full++] = i;
		else
			l->state[l->n_state++] = i;
	}
	kvt_group_init(&g[0], sizeof g[0]);
	kvt_group_init(&g[1], sizeof g[1]);
	g[0].kind = KVT_GROUP_FULL;
	g[0].n_layers = l->n_full;
	g[0].layers = l->full;
	g[0].n_kv_heads = 8;
	g[0].head_dim = 128;
	g[0].dtype = KVT_DTYPE_BF16;
	g[1].kind = KVT_GROUP_STATE;
	g[1].n_layers = l->n_state;
	g[1].layers = l->state;
	g[1].n_state = 2;
	g[1].state[0] = (struct kvt_state_tensor){ .n_dims = 2,
						   .shape = { HY_CONV_DIM, HY_CONV_KEEP },
						   .dtype = KVT_DTYPE_BF16 };
	g[1].state[1] = (struct kvt_state_tensor){ .n_dims = 3, .shape = { 32, 128, 128 },
						   .dtype = KVT_DTYPE_BF16 };
}

/* Bytes of one slot of each group, as the engine lays them out (no padding but alignment). */
static void
hy_slot_bytes(const struct hy_layers *l, double *full, double *state)
{
	*full = (double)l->n_full * HY_TPB * 8 * 128 * 2 * 2;
	*state = (double)l->n_state * (HY_CONV_DIM * HY_CONV_KEEP * 2.0 + 32 * 128 * 128 * 2.0);
}

/* engine/engine.c's test hook: staged refuses the HOST registration with it. */
extern const struct kvt_nvme_fault_hooks *kvt_test_nvme_hooks;

/* Tier bytes for shares @f (FULL) and 1 - @f (STATE) that hold @nf FULL and @ns STATE slots of
 * @bf / @bs bytes (+ @extra per slot: the NVMe header page), half a slot of slack each. */
static uint64_t
hy_tier_bytes(double f, double nf, double bf, double ns, double bs, double extra)
{
	double a = (nf + 0.5) * (bf + extra) / f, b = (ns + 0.5) * (bs + extra) / (1 - f);

	return (uint64_t)(a > b ? a : b) + 1;
}

static int
hy_engine(const struct nb_hybrid_opts *o, struct kvt_group g[2], struct hy_layers *l,
	  uint32_t blocks_per, struct kvt_engine **e)
{
	static const struct kvt_nvme_fault_hooks hy_staged_hooks = { .refuse_register = true };
	struct kvt_engine_opts eo;
	double bf, bs, f;
	int rc;

	hy_groups(g, l);
	hy_slot_bytes(l, &bf, &bs);
	kvt_engine_opts_init(&eo, sizeof eo);
	eo.layout.n_layers = HY_LAYERS;
	eo.layout.tokens_per_block = HY_TPB;
	eo.groups = g;
	eo.n_groups = 2;
	f = (blocks_per + 1.5) * bf / ((blocks_per + 1.5) * bf + (HY_HBM_STATE + 0.5) * bs);
	g[0].share = (float)f;
	g[1].share = (float)(1 - f);
	eo.hbm_bytes = hy_tier_bytes(f, blocks_per + 1, bf, HY_HBM_STATE, bs, 0);
	eo.host_bytes = hy_tier_bytes(f, o->host_blocks, bf, HY_HOST_STATE, bs, 0);
	eo.nvme_dir = o->dir;
	eo.nvme_bytes = hy_tier_bytes(f, (double)o->sessions * blocks_per + 8, bf,
				      2.0 * o->sessions + 4, bs, 4096 * 2);
	eo.high_watermark = eo.low_watermark = 1.0f;
	eo.nvme_codec = o->nvme_codec;
	eo.nvme_workers = o->workers;
	if (o->staged)
		kvt_test_nvme_hooks = &hy_staged_hooks;
	rc = kvt_engine_create(&eo, e);
	kvt_test_nvme_hooks = NULL;
	return rc;
}

/* Prefill session @s in one-block chunks: each chunk's FULL block and the state after its last
 * token written (the state only for the last chunk: the others' leave at the next append). */
static int
hy_prefill(struct kvt_engine *e, kvt_seq_id s, uint32_t tokens, uint32_t seed,
	   const struct kvt_group_geometry geo[2])
{
	int64_t map[2 * HY_TPB];
	uint32_t t, n;
	int rc = 0;

	for (t = 0; rc == 0 && t < tokens; t += n) {
		n = tokens - t < HY_TPB ? tokens - t : HY_TPB;
		rc = kvt_seq_append_groups(e, s, NULL, n, map);
		if (rc)
			break;
		kvtb_fill_bf16((uint8_t *)geo[0].hbm_base +
			       (uint64_t)(map[0] / HY_TPB) * geo[0].block_bytes,
			       geo[0].block_bytes, seed * 100003u + t);
		if (t + n == tokens)
			kvtb_fill_bf16((uint8_t *)geo[1].hbm_base +
				       (uint64_t)(map[n + n - 1] / HY_TPB) * geo[1].block_bytes,
				       geo[1].block_bytes, seed * 7919u + t + 1);
	}
	return rc;
}

static int
hy_resume(struct kvt_engine *e, kvt_seq_id s, const struct hy_layers *l)
{
	struct kvt_batch *b = NULL;
	int rc = kvt_seq_resume(e, s);

	if (rc == 0)
		rc = kvt_batch_prepare(e, &s, 1, &b);
	if (rc == 0)
		rc = kvt_batch_wait_group_layer(b, 0, l->n_full - 1, NULL);
	if (rc == 0)
		rc = kvt_batch_wait_group_layer(b, 1, l->n_state - 1, NULL);
	if (b)
		kvt_batch_release(b, NULL);
	return rc;
}

int
kvtb_park_resume_hybrid(const struct nb_hybrid_opts *o, struct nb_pr_result *r)
{
	struct kvt_group g[2];
	struct hy_layers l;
	struct kvt_group_geometry geo[2];
	struct kvt_stats st0 = { .size = sizeof st0 }, st1 = { .size = sizeof st1 };
	struct kvt_stats sg = { .size = sizeof sg };
	struct kvt_engine *e = NULL;
	kvt_seq_id *ids = calloc(o->sessions, sizeof *ids);
	uint32_t blocks_per = (o->tokens + HY_TPB - 1) / HY_TPB;
	char path[1100];
	int rc = ids ? 0 : -ENOMEM;

	memset(r, 0, sizeof *r);
	if (rc == 0)
		rc = hy_engine(o, g, &l, blocks_per, &e);
	if (rc)
		kvtr_err_kvt(rc, "hybrid engine");
	for (int i = 0; rc == 0 && i < 2; i++)
		rc = kvt_group_geometry(e, (uint32_t)i, &geo[i]);
	if (rc == 0)
		rc = kvt_engine_stats(e, &st0);
	for (uint32_t s = 0; rc == 0 && s < o->sessions; s++) {
		double t0;

		rc = kvt_seq_open(e, NULL, &ids[s]);
		if (rc == 0)
			rc = hy_prefill(e, ids[s], o->tokens, s, geo);
		t0 = kvtr_now();
		if (rc == 0)
			rc = kvtb_park_nvme(e, ids[s], &r->reparks);
		r->tp += kvtr_now() - t0;
	}
	if (rc == 0)
		rc = kvt_engine_stats(e, &st1);
	if (rc == 0) {
		r->nvme_w = (double)(st1.bytes_moved[KVT_MOVE_HOST_TO_NVME] -
				     st0.bytes_moved[KVT_MOVE_HOST_TO_NVME]);
		st0 = st1;
	}
	for (uint32_t s = 0; rc == 0 && s < o->sessions; s++) {
		double t0 = kvtr_now();

		rc = hy_resume(e, ids[s], &l);
		r->tr += kvtr_now() - t0;
	}
	if (rc == 0)
		rc = kvt_engine_stats(e, &st1);
	if (rc == 0)
		rc = kvt_engine_group_stats(e, 1, &sg);
	if (rc == 0) {
		r->nvme_r = (double)(st1.bytes_moved[KVT_MOVE_NVME_TO_HOST] -
				     st0.bytes_moved[KVT_MOVE_NVME_TO_HOST]);
		r->full_block_bytes = geo[0].block_bytes;
		r->state_block_bytes = geo[1].block_bytes;
		r->full_blocks = (uint64_t)o->sessions * blocks_per;
		r->state_blocks = sg.blocks_moved[KVT_MOVE_HOST_TO_NVME];
		r->bytes = (double)r->full_blocks * (double)geo[0].block_bytes +
			   (double)r->state_blocks * (double)geo[1].block_bytes;
	} else if (e) {
		kvtr_err_kvt(rc, "hybrid park/resume");
	}
	kvt_engine_destroy(e);
	snprintf(path, sizeof path, "%s/group1", o->dir);
	(void)rmdir(path); /* the STATE pool's NVMe directory, when the engine left it empty */
	free(ids);
	return rc;
}
