/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-hf/run.c - the decode loop of kvtier-hf with the KV only in kvtier (hf.h):
 * windows of blocks per layer, the position's own K/V aside, append and store last (the order
 * of kvtier-run's window.c), parking between turns, prefix sharing, the persistent store with
 * a kill -9 in the middle.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dsa.h"
#include "fwd.h"
#include "kernels/attention.h"
#include "kernels/sparse.h"
#include "hf.h"
#include "util.h"

/* One storage group of the engine as the runner uses it. */
struct hf_grp {
	struct kvt_group_geometry geo;
	uint32_t k_floats, v_floats; /* floats of one token's K and V in one layer (v 0: none) */
	uint64_t kv_blocks;          /* blocks of the run's positions (the fractions' base) */
};

struct hf_run {
	const struct kvhf_opts *o;
	const struct kvhf_model *m;
	struct kvhf_result *r;
	FILE *log;
	struct kvt_engine *e;
	struct kvhf_state st;
	float *side;          /* [n_layers][2][kv_width]: this position's K/V */
	float *kv;            /* contiguous mode: [n_layers][positions][2][kv_width] */
	uint32_t P;           /* positions of the run */
	uint32_t cap;         /* blocks per window */
	uint32_t tpb;
	uint32_t n_groups;    /* the engine's groups (1 for the single layout) */
	struct hf_grp grp[KVT_MAX_GROUPS];
	uint32_t *lgroup, *lidx; /* [n_layers] (group, layer in group) of each layer's K/V */
	int64_t slots[KVT_MAX_GROUPS]; /* the appended token's slot mapping per group */
	/* linear-attention state (qwen3_next; fwd.h "Gated DeltaNet") */
	float *lin;           /* [n_linear][conv + rec floats]: the working copy (through kvtier:
	                         loaded from the STATE block before each position, stored into the
	                         appended token's block; contiguous: kept for the whole run) */
	uint64_t lin_floats;  /* conv + rec floats of one layer */
	uint32_t sgroup;      /* the STATE group (UINT32_MAX: none) */
	uint64_t st_off[2], st_bytes[2]; /* its tensors within a layer's state (conv, rec) */
	/* attention through the kernels */
	float *q;             /* [n_heads][qk dim]: the query (scaled for the kernel) / q_lat */
	float *qpe;           /* MLA: [n_heads][rope] */
	float *po, *pm, *pl;  /* a partial: [n_heads][width], [n_heads], [n_heads] */
	float *ao, *am, *al;  /* the merged partials */
	float *scratch;       /* [max(P, tpb * cap)] */
	int have;             /* ao holds a partial */
	char tmpdir[4096];
	struct kvhf_groups groups;
	/* deepseek_v32 (dsa.h) */
	uint32_t scgroup;     /* the indexer keys' SIDECAR group (UINT32_MAX: none) */
	uint64_t sc_off;      /* its bytes' offset in each layer of a LATENT block */
	float *ikey;          /* [n_layers][index_head_dim] this position's indexer keys */
	float *keys;          /* [(P / tpb + 2) x tpb][index_head_dim]: one layer's keys read */
	struct kvt_seq_range *kranges; /* [P / tpb + 1]: blocks whose keys need a prepare */
	uint32_t *sel;        /* [index_topk] the selected positions */
	float *iscores;       /* [P] index scores */
	void *tkwork;         /* [P] x 16 bytes: hf_torch_topk's pairs */
	struct kvt_seq_range *ranges; /* [index_topk] one-block ranges */
	uint32_t *stamp;      /* [blocks] the last step (pos + 1) that read each block */
	struct kvt_seq_range *pf; /* [P / tpb + 1] opts.dsa_prefetch: the step's blocks, in
	                             the order its layers first read them */
	uint32_t n_pf;
	struct kvt_seq_range *psel; /* [n_layers][index_topk] opts.dsa_prefetch 2: the blocks
	                               each layer's selection read at its last step */
	uint32_t *n_psel;     /* [n_layers] */
	struct kvt_seq_range *hbuf; /* [P / tpb + 2] a hint's ranges */
};

void
kvhf_opts_init(struct kvhf_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->tokens_per_block = 16;
	o->session_key = UINT64_C(0x4b56484600000001);
}

uint64_t
kvhf_kv_bytes_single(const struct kvhf_model *m, uint32_t tpb, uint32_t positions)
{
	uint64_t blocks = ((uint64_t)positions + tpb - 1) / tpb;

	return blocks * tpb * (uint64_t)m->n_layers * 2 * m->kv_width * sizeof(float);
}

uint64_t
kvhf_kv_bytes(const struct kvhf_model *m, uint32_t tpb, uint32_t positions)
{
	uint64_t blocks = ((uint64_t)positions + tpb - 1) / tpb, per_token = 0;

	for (int l = 0; l < m->n_layers; l++)
		if (m->layers[l].kv_src == l && !m->layers[l].linear) /* ALIAS layers store
									nothing; MLA no V */
			per_token += (m->family == KVHF_DEEPSEEK ? 1 : 2) * (uint64_t)m->kv_width *
				     sizeof(float);
	return blocks * tpb * per_token;
}

static void
hf_engine_log(void *arg, int level, const char *msg)
{
	FILE *f = arg;

	if (level <= KVT_LOG_WARN)
		fprintf(f, "kvtier-hf: kvtier %s: %s\n", level == KVT_LOG_ERROR ? "error" : "warning",
			msg);
}

/* Bytes of one token of one layer of group @g of @gs (K + V). */
static uint64_t
hf_group_token_bytes(const struct kvt_group *g)
{
	switch (g->kind) {
	case KVT_GROUP_LATENT:
		return (uint64_t)g->latent_dim * sizeof(float);
	case KVT_GROUP_FULL:
	case KVT_GROUP_WINDOW:
		return (uint64_t)g->n_kv_heads *
		       (g->head_dim + (g->v_head_dim ? g->v_head_dim : g->head_dim)) * sizeof(float);
	default:
		return 0;
	}
}

/*
 * Bytes a SIDECAR group of @gs[0..n) adds to each layer of a block of its parent @parent
 * (engine/kvtier.h "SIDECAR groups": tpb x token bytes + block bytes), 0 without one.
 */
static uint64_t
hf_sidecar_layer_bytes(const struct kvt_group *gs, uint32_t n, uint32_t parent, uint32_t tpb)
{
	uint64_t b = 0;

	for (uint32_t i = 0; i < n; i++)
		if (gs[i].kind == KVT_GROUP_SIDECAR && gs[i].parent == parent)
			b += (uint64_t)tpb * gs[i].sidecar_token_bytes + gs[i].sidecar_block_bytes;
	return b;
}

/*
 * Bytes of one block (slot) of group @g with @tpb tokens per block: K/V of its layers' tokens,
 * or (STATE) its layers' states, each tensor at its element size's alignment (engine/kvtier.h
 * "STATE groups"; the runner's tensors are all F32). ALIAS 0.
 */
static uint64_t
hf_group_block_bytes(const struct kvt_group *g, uint32_t tpb)
{
	uint64_t layer = 0;

	if (g->kind == KVT_GROUP_SIDECAR) /* no pool: its bytes are its parent's */
		return 0;
	if (g->kind != KVT_GROUP_STATE)
		return (uint64_t)tpb * g->n_layers * hf_group_token_bytes(g);
	for (uint32_t t = 0; t < g->n_state; t++) {
		uint64_t n = kvt_dtype_size(g->state[t].dtype);

		layer = (layer + n - 1) / n * n;
		for (uint32_t d = 0; d < g->state[t].n_dims; d++)
			n *= g->state[t].shape[d];
		layer += n;
	}
	return (uint64_t)g->n_layers * layer;
}

uint64_t
kvhf_group_kv_bytes(const struct kvhf_groups *gs, uint32_t tpb, uint32_t positions,
		    uint64_t *per_group)
{
	uint64_t blocks = ((uint64_t)positions + tpb - 1) / tpb, sum = 0;

	for (uint32_t i = 0; i < gs->n; i++) {
		uint64_t b = blocks * (hf_group_block_bytes(&gs->g[i], tpb) +
				       gs->g[i].n_layers * hf_sidecar_layer_bytes(gs->g, gs->n, i,
										   tpb));

		if (per_group)
			per_group[i] = b;
		sum += b;
	}
	return sum;
}

/*
 * The STATE group @gi of the engine: where its two tensors lie in a layer's state
 * (kvt_group_state_tensor), checked against the model's conv and rec sizes.
 */
static int
hf_state_geometry(struct hf_run *c, uint32_t gi)
{
	const uint64_t want[2] = { kvhf_gdn_conv_floats(c->m) * sizeof(float),
				   kvhf_gdn_rec_floats(c->m) * sizeof(float) };
	const struct kvt_group_geometry *g = &c->grp[gi].geo;

	if (c->sgroup != UINT32_MAX)
		return kvtr_err(-EPROTO, "engine bug: two STATE groups (%u and %u)", c->sgroup, gi);
	c->sgroup = gi;
	for (uint32_t t = 0; t < 2; t++) {
		int rc = kvt_group_state_tensor(c->e, gi, t, &c->st_off[t], &c->st_bytes[t]);

		if (rc)
			return kvtr_err_kvt(rc, "kvt_group_state_tensor");
		if (c->st_bytes[t] != want[t] ||
		    c->st_off[t] + c->st_bytes[t] > g->layer_block_bytes)
			return kvtr_err(-EPROTO, "engine bug: STATE tensor %u at offset %llu, %llu "
					"bytes, in a layer's %llu (the model's: %llu bytes)", t,
					(unsigned long long)c->st_off[t],
					(unsigned long long)c->st_bytes[t],
					(unsigned long long)g->layer_block_bytes,
					(unsigned long long)want[t]);
	}
	return 0;
}

/* Layer @l's conv and rec state in the STATE block at @blk (the block's host address). */
static void
hf_state_ptrs(const struct hf_run *c, char *blk, uint32_t l, char **conv, char **rec)
{
	char *p = blk + (uint64_t)c->lidx[l] * c->grp[c->sgroup].geo.layer_block_bytes;

	*conv = p + c->st_off[0];
	*rec = p + c->st_off[1];
}

/*
 * The working copy c->lin of every linear layer's state before position @pos of @seq: zeros
 * at position 0; else copied out of the STATE block of token pos - 1 (engine/kvtier.h "STATE
 * groups": the state after the sequence's newest token), prepared as a one-block range. The
 * contiguous mode keeps its copy: nothing to do.
 */
static int
hf_state_load(struct hf_run *c, kvt_seq_id seq, uint32_t pos)
{
	const struct kvhf_model *m = c->m;
	uint32_t blk, gi = c->sgroup;
	struct kvt_seq_range range;
	struct kvt_group_table t;
	struct kvt_batch *b = NULL;
	char *base = NULL;
	int rc, rc2;

	if (!m->n_linear || c->kv)
		return 0;
	if (pos == 0) {
		memset(c->lin, 0, (size_t)m->n_linear * c->lin_floats * sizeof(float));
		return 0;
	}
	blk = (pos - 1) / c->tpb;
	range.seq = seq;
	range.first_block = blk;
	range.n_blocks = 1;
	rc = kvt_batch_prepare_ranges(c->e, &range, 1, &b);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_batch_prepare_ranges (the state block)");
	memset(&t, 0, sizeof(t));
	rc = kvt_batch_group_table(b, gi, &t);
	if (rc)
		rc = kvtr_err_kvt(rc, "kvt_batch_group_table (STATE)");
	for (uint32_t i = rc ? 0 : t.indptr[0]; rc == 0 && i < t.indptr[1]; i++)
		if (t.block_pos[i] == blk)
			base = (char *)t.geo.hbm_base + (uint64_t)t.indices[i] * t.geo.block_bytes;
	if (rc == 0 && !base)
		rc = kvtr_err(-EPROTO, "engine bug: the STATE table of block %u of a sequence of %u "
			      "tokens has no entry of that block (%u entries)", blk, pos,
			      t.indptr[1] - t.indptr[0]);
	for (uint32_t l = 0; rc == 0 && l < (uint32_t)m->n_layers; l++) {
		float *w = c->lin + (size_t)m->layers[l].lin_idx * c->lin_floats;
		char *cv, *rv;

		if (!m->layers[l].linear)
			continue;
		rc = kvt_batch_wait_group_layer(b, gi, c->lidx[l], NULL);
		if (rc) {
			rc = kvtr_err_kvt(rc, "kvt_batch_wait_group_layer (STATE)");
			break;
		}
		hf_state_ptrs(c, base, l, &cv, &rv);
		memcpy(w, cv, c->st_bytes[0]);
		memcpy(w + kvhf_gdn_conv_floats(m), rv, c->st_bytes[1]);
	}
	rc2 = kvt_batch_release(b, NULL);
	if (rc == 0 && rc2)
		rc = kvtr_err_kvt(rc2, "kvt_batch_release");
	return rc;
}

/* opts.state_out: the state after position @P - 1 of @seq, as the next position would load it. */
static int
hf_state_out(struct hf_run *c, kvt_seq_id seq, uint32_t P)
{
	int rc;

	if (!c->o->state_out || !c->m->n_linear)
		return 0;
	rc = hf_state_load(c, seq, P);
	if (rc == 0)
		memcpy(c->o->state_out, c->lin,
		       (size_t)c->m->n_linear * c->lin_floats * sizeof(float));
	return rc;
}

/*
 * The indexer keys' SIDECAR group @gi of the engine (dsa.h): its offset in a layer of the
 * LATENT block (kvt_group_sidecar), checked: index_head_dim f32 per token, nothing per block,
 * room in the layer.
 */
static int
hf_sidecar_geometry(struct hf_run *c, uint32_t gi)
{
	uint64_t tb = 0, bb = 0, want = (uint64_t)c->m->index_head_dim * sizeof(float);
	int rc;

	if (!c->m->dsa || c->scgroup != UINT32_MAX)
		return kvtr_err(-EPROTO, "engine bug: an unexpected SIDECAR group %u", gi);
	rc = kvt_group_sidecar(c->e, gi, &c->sc_off, &tb, &bb);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_group_sidecar");
	if (tb != want || bb != 0 ||
	    c->sc_off + c->tpb * tb > c->grp[gi].geo.layer_block_bytes)
		return kvtr_err(-EPROTO, "engine bug: the indexer keys' SIDECAR group has %llu "
				"bytes per token, %llu per block at offset %llu of a %llu-byte "
				"layer (wanted %llu per token)", (unsigned long long)tb,
				(unsigned long long)bb, (unsigned long long)c->sc_off,
				(unsigned long long)c->grp[gi].geo.layer_block_bytes,
				(unsigned long long)want);
	c->scgroup = gi;
	return 0;
}

static int
hf_engine_create(struct hf_run *c, int persist)
{
	const struct kvhf_opts *o = c->o;
	const struct kvhf_model *m = c->m;
	uint32_t P = o->n_prompt + o->gen, tpb = o->tokens_per_block;
	uint64_t nseq = o->sessions ? o->sessions : o->prefix_share ? 2 : 1;
	uint64_t nblocks = nseq * ((P + tpb - 1) / tpb);
	uint64_t kv_g[KVT_MAX_GROUPS] = { 0 }, kv_sum, hbm, host, nvme = 0, blk_sum = 0;
	uint64_t frac_hbm = 0, frac_host = 0;
	struct kvt_group g[KVT_MAX_GROUPS];
	struct kvt_engine_opts eo;
	int rc;

	kvt_engine_opts_init(&eo, sizeof(eo));
	eo.layout.n_layers = (uint32_t)m->n_layers;
	eo.layout.tokens_per_block = tpb;
	if (o->single_layout) { /* one FULL layout: MLA as a 1-head K (V unused) */
		eo.layout.n_kv_heads = m->kv_heads_stored;
		eo.layout.head_dim = m->kv_head_dim_stored;
		eo.layout.dtype = KVT_DTYPE_F32;
		kv_sum = kvhf_kv_bytes_single(m, tpb, P) * nseq;
		blk_sum = kvhf_kv_bytes_single(m, tpb, 1);
	} else {
		memcpy(g, c->groups.g, sizeof(g[0]) * c->groups.n);
		kv_sum = kvhf_group_kv_bytes(&c->groups, tpb, P, kv_g) * nseq;
		if (o->hbm_frac > 0 || o->host_frac > 0) { /* per group: the KV it holds */
			uint64_t hb = 0, hs = 0, mx = 0, blocks = (P + tpb - 1) / tpb;
			uint64_t need[KVT_MAX_GROUPS] = { 0 }, hneed[KVT_MAX_GROUPS] = { 0 };

			for (uint32_t i = 0; i < c->groups.n; i++) {
				uint64_t blk = hf_group_block_bytes(&g[i], tpb) + g[i].n_layers *
					       hf_sidecar_layer_bytes(g, c->groups.n, i, tpb);
				uint64_t held = blocks, n;

				if (!blk)
					continue;
				if (g[i].kind == KVT_GROUP_WINDOW) {
					uint64_t b = (g[i].sink + tpb - 1) / tpb +
						     (g[i].window + tpb - 1) / tpb + 1;

					held = b < held ? b : held;
				}
				if (g[i].kind == KVT_GROUP_STATE) /* the two live blocks */
					held = held < 2 ? held : 2;
				held *= nseq;
				n = (uint64_t)((double)held * o->hbm_frac);
				need[i] = (n > 2 ? n : 2) * blk;
				n = (uint64_t)((double)held * o->host_frac);
				hneed[i] = (n > 1 ? n : 1) * blk;
				hb += need[i];
				if (blk > mx)
					mx = blk;
			}
			for (uint32_t i = 0; i < c->groups.n; i++) {
				if (!need[i])
					continue;
				g[i].share = (float)((double)need[i] / (double)hb);
				/* HOST follows the same shares: enough for every group's need */
				if ((uint64_t)((double)hneed[i] / g[i].share) > hs)
					hs = (uint64_t)((double)hneed[i] / g[i].share);
			}
			frac_hbm = hb + mx;
			frac_host = hs + mx;
		}
		for (uint32_t i = 0; i < c->groups.n; i++) {
			uint64_t blk = hf_group_block_bytes(&g[i], tpb) + g[i].n_layers *
				       hf_sidecar_layer_bytes(g, c->groups.n, i, tpb);

			blk_sum += blk;
			if (blk && !frac_hbm)
				g[i].share = o->shares ? o->shares[i] :
					     (float)((double)kv_g[i] * (double)nseq / (double)kv_sum);
			/* NVMe slots: a 4 KiB header page + the block rounded up to 4 KiB
			 * (tiers/tier_nvme.h), the group's share of the tier holding them all */
			if (blk && g[i].share > 0) {
				uint64_t need = (uint64_t)((double)((nblocks + 1) *
						 (4096 + (blk + 4095) / 4096 * 4096)) /
						 g[i].share) + 4096;

				if (need > nvme)
					nvme = need;
			}
		}
		eo.groups = g;
		eo.n_groups = c->groups.n;
	}
	/* all in HBM by default: twice the blocks, below the high watermark (no demotion);
	 * a block of every group's slack for the float shares */
	hbm = o->hbm_bytes ? o->hbm_bytes : frac_hbm ? frac_hbm : 2 * kv_sum + 2 * blk_sum;
	host = o->no_host ? 0 : o->host_bytes ? o->host_bytes : frac_host ? frac_host
								  : kv_sum + 2 * blk_sum;
	if (o->single_layout)
		nvme = (nblocks + 1) * (4096 + (blk_sum + 4095) / 4096 * 4096);
	eo.hbm_bytes = hbm;
	eo.host_bytes = host;
	eo.nvme_bytes = o->nvme_bytes ? o->nvme_bytes : nvme;
	if (o->nvme_dir) {
		eo.nvme_dir = o->nvme_dir;
	} else {
		const char *base = getenv("TMPDIR");

		if (!c->tmpdir[0]) {
			snprintf(c->tmpdir, sizeof(c->tmpdir), "%s/kvtier-hf.XXXXXX",
				 base && *base ? base : "/tmp");
			if (!mkdtemp(c->tmpdir)) {
				c->tmpdir[0] = '\0';
				return kvtr_err(-errno, "cannot create a temporary NVMe directory: %s",
						strerror(errno));
			}
		}
		eo.nvme_dir = c->tmpdir;
	}
	eo.nvme_persist = persist;
	eo.emu_copy_bytes_per_s = o->emu_copy_bytes_per_s;
	eo.emu_lazy = o->emu_lazy;
	eo.prefix_cache = o->prefix_share ? 1 : 0;
	eo.log = hf_engine_log;
	eo.log_arg = c->log;
	rc = kvt_engine_create(&eo, &c->e);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_engine_create");
	rc = kvt_engine_n_groups(c->e);
	if (rc < 1 || rc > KVT_MAX_GROUPS)
		return kvtr_err(-EPROTO, "engine bug: kvt_engine_n_groups gives %d", rc);
	c->n_groups = (uint32_t)rc;
	c->cap = UINT32_MAX;
	c->tpb = tpb;
	c->sgroup = UINT32_MAX;
	c->scgroup = UINT32_MAX;
	for (uint32_t i = 0; i < c->n_groups; i++) {
		struct hf_grp *hg = &c->grp[i];

		rc = kvt_group_geometry(c->e, i, &hg->geo);
		if (rc)
			return kvtr_err_kvt(rc, "kvt_group_geometry");
		if (hg->geo.kind == KVT_GROUP_ALIAS)
			continue;
		if (hg->geo.kind == KVT_GROUP_SIDECAR) {
			rc = hf_sidecar_geometry(c, i);
			if (rc)
				return rc;
			continue;
		}
		if (hg->geo.kind == KVT_GROUP_STATE) {
			rc = hf_state_geometry(c, i);
			if (rc)
				return rc;
			continue;
		}
		hg->k_floats = (uint32_t)(hg->geo.k_token_bytes / sizeof(float));
		hg->v_floats = (uint32_t)(hg->geo.v_token_bytes / sizeof(float));
		if (hg->geo.hbm_slots < 2 && P > tpb)
			return kvtr_err(KVT_ETOOBIG, "group %u's HBM holds %u block slot(s): windows "
					"need at least 2 (%llu bytes)", i, hg->geo.hbm_slots,
					(unsigned long long)(2 * hg->geo.block_bytes));
		if (hg->geo.hbm_slots - 1 < c->cap)
			c->cap = hg->geo.hbm_slots > 1 ? hg->geo.hbm_slots - 1 : 1;
		if (i == 0 || c->r->geo.block_bytes == 0) {
			c->r->geo.hbm_slots = hg->geo.hbm_slots;
			c->r->geo.host_slots = hg->geo.host_slots;
			c->r->geo.nvme_slots = hg->geo.nvme_slots;
			c->r->geo.block_bytes = hg->geo.block_bytes;
		}
	}
	c->r->n_groups = c->n_groups;
	for (uint32_t l = 0; l < (uint32_t)m->n_layers; l++) {
		uint32_t src = (uint32_t)m->layers[l].kv_src, gi, li, ga, la;

		if (m->layers[l].linear) {
			rc = kvt_layer_group(c->e, l, &gi, &li);
			if (rc)
				return kvtr_err_kvt(rc, "kvt_layer_group");
			if (gi != c->sgroup || li >= c->grp[gi].geo.n_layers)
				return kvtr_err(-EPROTO, "engine bug: linear-attention layer %u maps "
						"to group %u layer %u, the STATE group is %u", l, gi,
						li, c->sgroup);
			c->lgroup[l] = gi;
			c->lidx[l] = li;
			continue;
		}
		rc = kvt_layer_group(c->e, src, &gi, &li);
		if (rc == 0)
			rc = kvt_layer_group(c->e, l, &ga, &la);
		if (rc)
			return kvtr_err_kvt(rc, "kvt_layer_group");
		if (!o->single_layout && (ga != gi || la != li))
			return kvtr_err(-EPROTO, "engine bug: layer %u (reading layer %u's K/V) maps to "
					"group %u layer %u, its source to group %u layer %u", l, src, ga,
					la, gi, li);
		if (gi >= c->n_groups || c->grp[gi].geo.kind == KVT_GROUP_ALIAS ||
		    li >= c->grp[gi].geo.n_layers)
			return kvtr_err(-EPROTO, "engine bug: layer %u maps to group %u layer %u", l,
					gi, li);
		c->lgroup[l] = gi;
		c->lidx[l] = li;
		if (m->dsa && (c->scgroup == UINT32_MAX || c->groups.g[c->scgroup].parent != gi))
			return kvtr_err(-EPROTO, "engine bug: layer %u's latent is in group %u, not "
					"in the parent of the indexer keys' SIDECAR group", l, gi);
		if (c->grp[gi].k_floats != m->kv_width ||
		    (c->grp[gi].v_floats && c->grp[gi].v_floats != m->kv_width))
			return kvtr_err(-EPROTO, "engine bug: group %u stores %u + %u floats per "
					"token, the model's K/V are %u + %u", gi, c->grp[gi].k_floats,
					c->grp[gi].v_floats, m->kv_width,
					m->family == KVHF_DEEPSEEK ? 0 : m->kv_width);
	}
	return 0;
}

static int
hf_nofit(int rc)
{
	return rc == KVT_ETOOBIG || rc == -ENOSPC;
}

/* Merges the partial (po, pm, pl) into (ao, am, al) of @width per head. */
static void
hf_merge(struct hf_run *c, uint32_t width)
{
	uint32_t nh = (uint32_t)c->m->n_heads;

	if (!c->have) {
		memcpy(c->ao, c->po, (size_t)nh * width * sizeof(float));
		memcpy(c->am, c->pm, nh * sizeof(float));
		memcpy(c->al, c->pl, nh * sizeof(float));
		c->have = 1;
		return;
	}
	kvt_attn_merge(nh, width, c->ao, c->am, c->al, c->po, c->pm, c->pl);
}

/*
 * The kernel's partial over positions [t0, t1) of layer @kl's K/V in the HBM blocks of
 * @table's first sequence (group @gi), for the query at @pos with @window (0: full), merged.
 */
static int
hf_partial(struct hf_run *c, uint32_t l, uint32_t gi, uint32_t li, const struct kvt_group_table *t,
	   uint64_t t0, uint64_t t1, uint32_t pos, uint32_t window)
{
	const struct kvhf_model *m = c->m;
	const struct kvt_group_geometry *g = &t->geo;
	uint32_t off = t->indptr[0], n = t->indptr[1] - t->indptr[0];
	const char *base = (const char *)g->hbm_base + (uint64_t)li * g->layer_block_bytes;
	int rc;

	(void)l;
	(void)gi;
	if (n == 0 || t0 >= t1)
		return 0;
	if (m->family == KVHF_DEEPSEEK) {
		struct kvt_paged_latent kv;

		memset(&kv, 0, sizeof(kv));
		kv.base = base;
		kv.block_stride = g->block_bytes;
		kv.token_stride = g->k_token_bytes;
		kv.table = t->indices + off;
		kv.tokens_per_block = g->tokens_per_block;
		kv.kv_lora_rank = (uint32_t)m->kv_lora_rank;
		kv.rope_dim = (uint32_t)m->qk_rope;
		kv.dtype = KVT_DTYPE_F32;
		kv.window = window;
		kv.pos = t->block_pos + off;
		kv.n_entries = n;
		kv.seq_len = (uint64_t)pos + 1;
		rc = kvt_attn_latent_partial_ref(&kv, c->q, c->qpe, (uint32_t)m->n_heads, t0, t1,
						 m->attn_scale, c->scratch, c->po, c->pm, c->pl);
		if (rc)
			return kvtr_err_kvt(rc, "kvt_attn_latent_partial_ref");
		hf_merge(c, (uint32_t)m->kv_lora_rank);
	} else {
		struct kvt_paged_kv kv;

		memset(&kv, 0, sizeof(kv));
		kv.k_base = base;
		kv.v_offset = g->v_offset;
		kv.block_stride = g->block_bytes;
		kv.token_stride = g->k_token_bytes;
		kv.table = t->indices + off;
		kv.tokens_per_block = g->tokens_per_block;
		kv.n_kv_heads = (uint32_t)m->n_kv_heads;
		kv.head_dim = (uint32_t)m->head_dim;
		kv.dtype = KVT_DTYPE_F32;
		kv.window = window;
		kv.pos = t->block_pos + off;
		kv.n_entries = n;
		kv.seq_len = (uint64_t)pos + 1;
		rc = kvt_attn_partial_ref(&kv, c->q, (uint32_t)m->n_heads, t0, t1, c->scratch,
					  c->po, c->pm, c->pl);
		if (rc)
			return kvtr_err_kvt(rc, "kvt_attn_partial_ref");
		hf_merge(c, (uint32_t)m->head_dim);
	}
	return 0;
}

/* The partial of this position's own K/V (kept aside in @side), merged last. */
static int
hf_self_partial(struct hf_run *c, const float *side)
{
	static const uint32_t table0[1] = { 0 };
	const struct kvhf_model *m = c->m;
	uint32_t kw = m->kv_width;
	int rc;

	if (m->family == KVHF_DEEPSEEK) {
		struct kvt_paged_latent kv;

		memset(&kv, 0, sizeof(kv));
		kv.base = side;
		kv.block_stride = kw * sizeof(float);
		kv.token_stride = kw * sizeof(float);
		kv.table = table0;
		kv.tokens_per_block = 1;
		kv.kv_lora_rank = (uint32_t)m->kv_lora_rank;
		kv.rope_dim = (uint32_t)m->qk_rope;
		kv.dtype = KVT_DTYPE_F32;
		rc = kvt_attn_latent_partial_ref(&kv, c->q, c->qpe, (uint32_t)m->n_heads, 0, 1,
						 m->attn_scale, c->scratch, c->po, c->pm, c->pl);
		if (rc)
			return kvtr_err_kvt(rc, "kvt_attn_latent_partial_ref (own K)");
		hf_merge(c, (uint32_t)m->kv_lora_rank);
	} else {
		struct kvt_paged_kv kv;

		memset(&kv, 0, sizeof(kv));
		kv.k_base = side;
		kv.v_offset = kw * sizeof(float);
		kv.block_stride = 2 * kw * sizeof(float);
		kv.token_stride = kw * sizeof(float);
		kv.table = table0;
		kv.tokens_per_block = 1;
		kv.n_kv_heads = (uint32_t)m->n_kv_heads;
		kv.head_dim = (uint32_t)m->head_dim;
		kv.dtype = KVT_DTYPE_F32;
		rc = kvt_attn_partial_ref(&kv, c->q, (uint32_t)m->n_heads, 0, 1, c->scratch, c->po,
					  c->pm, c->pl);
		if (rc)
			return kvtr_err_kvt(rc, "kvt_attn_partial_ref (own K/V)");
		hf_merge(c, (uint32_t)m->head_dim);
	}
	return 0;
}

/*
 * Attention of layer @l at @pos over the stored positions [lo, pos) of @seq, read from the
 * K/V of layer @kl (@l itself, or the layer it shares K/V with), by windows of blocks: the
 * contiguous mode loops over its array; through kvtier each window's group table goes to the
 * kernel (kvt_attn_partial_ref / kvt_attn_latent_partial_ref, window given), partials merged.
 */
static int
hf_attend_stored(struct hf_run *c, kvt_seq_id seq, uint32_t kl, uint32_t l, uint32_t lo,
		 uint32_t pos, uint32_t window)
{
	uint32_t tpb = c->tpb, fb = lo / (tpb ? tpb : 1), nb, gi, li;

	if (c->kv) { /* contiguous: the same positions in the same order */
		uint32_t kw = c->m->kv_width;

		for (uint32_t j = lo; j < pos; j++) {
			const float *k = c->kv + ((size_t)kl * c->P + j) * 2 * kw;

			kvhf_attn_add(c->m, &c->st, l, k, k + kw);
		}
		return 0;
	}
	gi = c->lgroup[kl];
	li = c->lidx[kl];
	nb = (pos + tpb - 1) / tpb;
	for (uint32_t ws = fb; ws < nb;) {
		uint32_t wn = nb - ws < c->cap ? nb - ws : c->cap;
		struct kvt_seq_range range;
		struct kvt_group_table t;
		struct kvt_batch *b = NULL;
		uint64_t t0, t1;
		int rc, rc2;

		for (;;) {
			range.seq = seq;
			range.first_block = ws;
			range.n_blocks = wn;
			rc = kvt_batch_prepare_ranges(c->e, &range, 1, &b);
			if (rc == 0 || !hf_nofit(rc) || wn == 1)
				break;
			wn /= 2;
			c->cap = wn;
		}
		if (rc)
			return kvtr_err_kvt(rc, "kvt_batch_prepare_ranges");
		c->r->windows++;
		memset(&t, 0, sizeof(t));
		rc = kvt_batch_group_table(b, gi, &t);
		if (rc)
			rc = kvtr_err_kvt(rc, "kvt_batch_group_table");
		for (uint32_t i = t.indptr ? t.indptr[0] : 0; rc == 0 && i < t.indptr[1]; i++)
			if (t.n_seqs != 1 || t.block_pos[i] < ws || t.block_pos[i] >= ws + wn ||
			    (i > t.indptr[0] && t.block_pos[i] <= t.block_pos[i - 1]))
				rc = kvtr_err(-EPROTO, "engine bug: window [%u, +%u) of group %u has "
					      "an entry of block %u", ws, wn, gi, t.block_pos[i]);
		if (rc == 0 && (rc = kvt_batch_wait_group_layer(b, gi, li, NULL)) != 0)
			rc = kvtr_err_kvt(rc, "kvt_batch_wait_group_layer");
		t0 = (uint64_t)ws * tpb > lo ? (uint64_t)ws * tpb : lo;
		t1 = (uint64_t)(ws + wn) * tpb < pos ? (uint64_t)(ws + wn) * tpb : pos;
		if (rc == 0)
			rc = hf_partial(c, l, gi, li, &t, t0, t1, pos, window);
		rc2 = kvt_batch_release(b, NULL);
		if (rc == 0 && rc2)
			rc = kvtr_err_kvt(rc2, "kvt_batch_release");
		if (rc)
			return rc;
		ws += wn;
	}
	return 0;
}

/* Appends position @pos (token @tok) and stores its K/V of every storing layer. */
static int
hf_commit(struct hf_run *c, kvt_seq_id seq, uint32_t pos, int32_t tok)
{
	const struct kvhf_model *m = c->m;
	uint32_t tpb = c->tpb, kw = m->kv_width;
	struct kvt_seq_range range;
	struct kvt_batch *b = NULL;
	int rc, rc2;

	if (c->kv) {
		for (uint32_t l = 0; l < (uint32_t)m->n_layers; l++)
			memcpy(c->kv + ((size_t)l * c->P + pos) * 2 * kw, c->side + (size_t)l * 2 * kw,
			       2 * kw * sizeof(float));
		return 0;
	}
	rc = kvt_seq_append_groups(c->e, seq, &tok, 1, c->slots);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_seq_append_groups");
	range.seq = seq;
	range.first_block = pos / tpb;
	range.n_blocks = 1;
	rc = kvt_batch_prepare_ranges(c->e, &range, 1, &b);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_batch_prepare_ranges (the new token's block)");
	for (uint32_t gi = 0; rc == 0 && gi < c->n_groups; gi++) {
		struct kvt_group_table t;

		if (c->grp[gi].geo.kind == KVT_GROUP_ALIAS)
			continue;
		if (c->grp[gi].geo.kind == KVT_GROUP_SIDECAR) { /* its row is its parent's */
			uint32_t pg = c->groups.g[gi].parent;

			if (c->slots[gi] != c->slots[pg])
				rc = kvtr_err(-EPROTO, "engine bug: position %u's slot mapping is "
					      "%lld in the SIDECAR group %u, %lld in its parent %u",
					      pos, (long long)c->slots[gi], gi,
					      (long long)c->slots[pg], pg);
			continue;
		}
		memset(&t, 0, sizeof(t));
		rc = kvt_batch_group_table(b, gi, &t);
		if (rc)
			rc = kvtr_err_kvt(rc, "kvt_batch_group_table");
		else if (t.indptr[1] - t.indptr[0] < 1 || c->slots[gi] < 0 ||
			 (uint64_t)c->slots[gi] / tpb != t.indices[t.indptr[1] - 1] ||
			 t.block_pos[t.indptr[1] - 1] != pos / tpb ||
			 (t.geo.kind != KVT_GROUP_STATE &&
			  (uint64_t)c->slots[gi] % tpb != pos % tpb))
			rc = kvtr_err(-EPROTO, "engine bug: position %u was appended at slot mapping "
				      "%lld of group %u, but its block is not the table's last entry",
				      pos, (long long)c->slots[gi], gi);
	}
	for (uint32_t l = 0; rc == 0 && l < (uint32_t)m->n_layers; l++) {
		const float *kv = c->side + (size_t)l * 2 * kw;
		uint32_t gi = c->lgroup[l], li = c->lidx[l];
		const struct hf_grp *g = &c->grp[gi];
		void *k, *v;

		if (m->layers[l].kv_src != (int)l && !c->o->single_layout)
			continue; /* ALIAS: no storage */
		rc = kvt_batch_wait_group_layer(b, gi, li, NULL);
		if (rc) {
			rc = kvtr_err_kvt(rc, "kvt_batch_wait_group_layer");
			break;
		}
		if (m->layers[l].linear) { /* the state after this token into its block */
			const float *w = c->lin + (size_t)m->layers[l].lin_idx * c->lin_floats;
			char *cv, *rv;

			hf_state_ptrs(c, (char *)g->geo.hbm_base + (uint64_t)c->slots[gi] / tpb *
				      g->geo.block_bytes, l, &cv, &rv);
			memcpy(cv, w, c->st_bytes[0]);
			memcpy(rv, w + kvhf_gdn_conv_floats(m), c->st_bytes[1]);
			continue;
		}
		if (m->layers[l].kv_src != (int)l) /* the single layout's slot of an aliasing
						      layer: written zero */
			kv = NULL;
		kvt_group_kv_addr(&g->geo, li, c->slots[gi], &k, &v);
		if (kv)
			memcpy(k, kv, kw * sizeof(float));
		else
			memset(k, 0, kw * sizeof(float));
		if (m->dsa) { /* the indexer key, in the same block (dsa.h) */
			uint64_t sm = (uint64_t)c->slots[gi], kb = (uint64_t)m->index_head_dim *
								   sizeof(float);

			memcpy((char *)g->geo.hbm_base + sm / tpb * g->geo.block_bytes +
			       (uint64_t)li * g->geo.layer_block_bytes + c->sc_off + sm % tpb * kb,
			       c->ikey + (size_t)l * m->index_head_dim, kb);
		}
		if (v && kv && m->family != KVHF_DEEPSEEK)
			memcpy(v, kv + kw, g->v_floats * sizeof(float));
		else if (v) /* MLA in the single layout: V unused */
			memset(v, 0, g->v_floats * sizeof(float));
	}
	rc2 = kvt_batch_release(b, NULL);
	if (rc == 0 && rc2)
		rc = kvtr_err_kvt(rc2, "kvt_batch_release");
	return rc;
}

/* The query of layer @l for the kernels: MLA's absorbed q_lat / q_pe, else q scaled so that
 * the kernel's 1/sqrt(head_dim) gives the model's attn_scale. */
static void
hf_kernel_query(struct hf_run *c, uint32_t l)
{
	const struct kvhf_model *m = c->m;
	size_t nq = (size_t)m->n_heads * (size_t)c->st.qkdim;

	if (m->family == KVHF_DEEPSEEK) {
		kvhf_mla_absorb(m, &c->st, l, c->q, c->qpe);
		return;
	}
	memcpy(c->q, c->st.q, nq * sizeof(float));
	{
		float f = m->attn_scale * sqrtf((float)m->head_dim);

		if (f != 1.0f)
			for (size_t i = 0; i < nq; i++)
				c->q[i] *= f;
	}
}

/*
 * The partial over the selected stored positions @tok[0..n) (ascending, all < @pos) whose
 * blocks are the @nr one-block ranges @rg[0..nr) (ascending), prepared in one batch *@bp,
 * of layer @l (group gi, layer li of it), merged into (ao, am, al).
 */
static int
hf_dsa_window(struct hf_run *c, uint32_t l, const struct kvt_seq_range *rg, uint32_t nr,
	      const uint32_t *tok, uint32_t n, uint32_t pos, struct kvt_batch **bp)
{
	const struct kvhf_model *m = c->m;
	uint32_t gi = c->lgroup[l], li = c->lidx[l], off, ne;
	struct kvt_paged_latent kv;
	struct kvt_group_table t;
	int rc;

	memset(&t, 0, sizeof(t));
	rc = kvt_batch_group_table(*bp, gi, &t);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_batch_group_table");
	if (t.n_seqs != nr)
		return kvtr_err(-EPROTO, "engine bug: %u one-block ranges gave a table of %u", nr,
				t.n_seqs);
	for (uint32_t j = 0; j < nr; j++)
		if (t.indptr[j + 1] - t.indptr[j] != 1 ||
		    t.block_pos[t.indptr[j]] != rg[j].first_block)
			return kvtr_err(-EPROTO, "engine bug: the range of block %u has %u entries "
					"(first at block %u)", rg[j].first_block,
					t.indptr[j + 1] - t.indptr[j], t.block_pos[t.indptr[j]]);
	rc = kvt_batch_wait_group_layer(*bp, gi, li, NULL);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_batch_wait_group_layer");
	off = t.indptr[0];
	ne = t.indptr[nr] - off;
	memset(&kv, 0, sizeof(kv));
	kv.base = (const char *)t.geo.hbm_base + (uint64_t)li * t.geo.layer_block_bytes;
	kv.block_stride = t.geo.block_bytes;
	kv.token_stride = t.geo.k_token_bytes;
	kv.table = t.indices + off;
	kv.pos = t.block_pos + off;
	kv.n_entries = ne;
	kv.tokens_per_block = t.geo.tokens_per_block;
	kv.kv_lora_rank = (uint32_t)m->kv_lora_rank;
	kv.rope_dim = (uint32_t)m->qk_rope;
	kv.dtype = KVT_DTYPE_F32;
	kv.seq_len = pos; /* the stored positions */
	rc = kvt_attn_latent_tokens_partial_ref(&kv, c->q, c->qpe, (uint32_t)m->n_heads, tok, n,
						m->attn_scale, c->scratch, c->po, c->pm, c->pl);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_attn_latent_tokens_partial_ref");
	hf_merge(c, (uint32_t)m->kv_lora_rank);
	return 0;
}

/* Park @seq to NVMe, drain, and fill @si with what it holds where. */
static int
hf_park_nvme(struct hf_run *c, kvt_seq_id seq, struct kvt_seq_info *si)
{
	int rc = kvt_seq_park(c->e, seq, KVT_TIER_NVME);

	if (rc)
		return kvtr_err_kvt(rc, "kvt_seq_park");
	rc = kvt_engine_drain(c->e);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_engine_drain");
	rc = kvt_seq_info(c->e, seq, si);
	return rc ? kvtr_err_kvt(rc, "kvt_seq_info") : 0;
}

/*
 * opts.dsa_park_selected: the sequence's blocks (the latents with their indexer keys, dsa.h)
 * parked to NVMe before the indexer reads the keys and chooses: checked to have every block
 * on NVMe and none in HBM or HOST (a park to NVMe leaves no other copy), the sequence not
 * resumed, so the keys come from the engine's mirror and the prepare reads each selected
 * block back from NVMe.
 */
static int
hf_dsa_park(struct hf_run *c, kvt_seq_id seq)
{
	struct kvt_seq_info si;
	int rc = hf_park_nvme(c, seq, &si);

	if (rc)
		return rc;
	if (si.blocks_in[KVT_TIER_HBM] || si.blocks_in[KVT_TIER_HOST] ||
	    si.blocks_in[KVT_TIER_NVME] != si.n_blocks)
		return kvtr_err(-EPROTO, "engine bug: a sequence parked to NVMe has %u blocks in "
				"HBM, %u in HOST, %u of %u on NVMe", si.blocks_in[KVT_TIER_HBM],
				si.blocks_in[KVT_TIER_HOST], si.blocks_in[KVT_TIER_NVME],
				si.n_blocks);
	c->r->dsa_parks++;
	return 0;
}

/* The engine's blocks moved so far, every direction summed (0 when the stats fail). */
static uint64_t
hf_moved(struct hf_run *c)
{
	struct kvt_stats st;
	uint64_t n = 0;

	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	if (kvt_engine_stats(c->e, &st))
		return 0;
	for (int d = 0; d < KVT_MOVE_COUNT; d++)
		n += st.blocks_moved[d];
	return n;
}

/*
 * The blocks [0, @nb) of @seq whose indexer keys kvt_seq_sidecar_read refuses with -EAGAIN
 * (only on NVMe, the mirror never filled in this engine) are prepared once, by windows of at
 * most c->cap one-block ranges, and released: the prepare's read from NVMe fills the mirror.
 * The other blocks' keys of layer @li land in c->keys on the way. Counts r->dsa_key_prepared.
 */
static int
hf_dsa_keys_prepare(struct hf_run *c, kvt_seq_id seq, uint32_t li, uint32_t nb)
{
	uint32_t dim = (uint32_t)c->m->index_head_dim, nr = 0;
	int rc;

	for (uint32_t b = 0; b < nb; b++) {
		rc = kvt_seq_sidecar_read(c->e, seq, c->scgroup, li, b, 1,
					  c->keys + (size_t)b * c->tpb * dim);
		if (rc == -EAGAIN) {
			c->kranges[nr].seq = seq;
			c->kranges[nr].first_block = b;
			c->kranges[nr].n_blocks = 1;
			nr++;
		} else if (rc) {
			return kvtr_err_kvt(rc, "kvt_seq_sidecar_read (one block)");
		}
	}
	for (uint32_t w = 0; w < nr;) {
		uint32_t wn = nr - w < c->cap ? nr - w : c->cap;
		struct kvt_batch *bt = NULL;

		for (;;) {
			rc = kvt_batch_prepare_ranges(c->e, c->kranges + w, wn, &bt);
			if (rc == 0 || !hf_nofit(rc) || wn == 1)
				break;
			wn /= 2;
			c->cap = wn;
		}
		if (rc)
			return kvtr_err_kvt(rc, "kvt_batch_prepare_ranges (blocks whose indexer keys "
					    "are only on NVMe)");
		rc = kvt_batch_release(bt, NULL);
		if (rc)
			return kvtr_err_kvt(rc, "kvt_batch_release");
		w += wn;
	}
	c->r->dsa_key_prepared += nr;
	return 0;
}

/*
 * The indexer keys of layer @l for the query at @pos into c->keys [pos + 1][dim]: positions
 * 0..pos-1 read from the SIDECAR group (kvt_seq_sidecar_read over the sequence's blocks, no
 * block brought up; -EAGAIN: hf_dsa_keys_prepare, then once more), then the position's own
 * (c->ikey, computed this step) at row pos. opts.dsa_park_selected: the blocks the reads
 * moved into r->dsa_key_moved (a read moves none: the test's evidence).
 */
static int
hf_dsa_keys(struct hf_run *c, kvt_seq_id seq, uint32_t l, uint32_t pos)
{
	uint32_t dim = (uint32_t)c->m->index_head_dim, nb = (pos + c->tpb - 1) / c->tpb;
	uint64_t m0 = 0;
	int rc = 0;

	for (int tries = 0; nb && tries < 2; tries++) {
		if (c->o->dsa_park_selected)
			m0 = hf_moved(c);
		rc = kvt_seq_sidecar_read(c->e, seq, c->scgroup, c->lidx[l], 0, nb, c->keys);
		if (c->o->dsa_park_selected)
			c->r->dsa_key_moved += hf_moved(c) - m0;
		c->r->dsa_key_reads++;
		if (rc != -EAGAIN || tries)
			break;
		rc = hf_dsa_keys_prepare(c, seq, c->lidx[l], nb);
		if (rc)
			return rc;
	}
	if (rc)
		return kvtr_err_kvt(rc, "kvt_seq_sidecar_read (the indexer keys)");
	memcpy(c->keys + (size_t)pos * dim, c->ikey + (size_t)l * dim, dim * sizeof(float));
	return 0;
}

/*
 * A hint of block @tail of @seq (the sequence's newest: the one most likely selected; none
 * when UINT32_MAX) then the @n one-block ranges @rg (kvt_engine_hint_ranges, steps_ahead 1:
 * promoted to HBM now, without waiting, and spared by the room-making until the next batch
 * prepared is released); KVT_ETOOBIG (more than HBM holds): the first half, and so on.
 * Counts r->dsa_hinted (blocks of accepted hints).
 */
static int
hf_dsa_hint(struct hf_run *c, kvt_seq_id seq, uint32_t tail, const struct kvt_seq_range *rg,
	    uint32_t n)
{
	uint32_t k = 0;
	int rc = 0;

	if (tail != UINT32_MAX) {
		c->hbuf[k].seq = seq;
		c->hbuf[k].first_block = tail;
		c->hbuf[k++].n_blocks = 1;
	}
	for (uint32_t i = 0; i < n; i++)
		if (rg[i].first_block != tail)
			c->hbuf[k++] = rg[i];
	n = k;
	while (n) {
		rc = kvt_engine_hint_ranges(c->e, c->hbuf, n, 1);
		if (rc != KVT_ETOOBIG)
			break;
		n /= 2;
	}
	if (rc == KVT_ETOOBIG)
		return 0;
	if (rc)
		return kvtr_err_kvt(rc, "kvt_engine_hint_ranges (the predicted blocks)");
	c->r->dsa_hinted += n;
	return 0;
}

/*
 * DeepSeek Sparse Attention of layer @l at @pos (dsa.h): this position's indexer key kept for
 * the commit, the stored keys read (hf_dsa_keys), the top-k positions of 0..pos, the blocks
 * holding the stored ones prepared by windows of at most c->cap one-block ranges
 * (kvt_batch_prepare_ranges) and only the selected tokens of each attended
 * (kvt_attn_latent_tokens_partial_ref), then the position's own latent (@side) when it is
 * selected. Counts the blocks read (r->dsa_*).
 */
static int
hf_dsa_attend(struct hf_run *c, kvt_seq_id seq, uint32_t l, uint32_t pos, const float *side)
{
	const struct kvhf_model *m = c->m;
	uint32_t dim = (uint32_t)m->index_head_dim, tpb = c->tpb, n, ns, nblk = 0;
	int rc;

	memcpy(c->ikey + (size_t)l * dim, c->st.ik, dim * sizeof(float));
	if (c->o->dsa_park_selected && pos && (rc = hf_dsa_park(c, seq)) != 0)
		return rc;
	rc = hf_dsa_keys(c, seq, l, pos);
	if (rc)
		return rc;
	rc = hf_dsa_select(c->st.iq, c->st.iw, (uint32_t)m->index_n_heads, dim, c->keys, pos,
			   (uint32_t)m->index_topk, c->P - 1, c->iscores, c->tkwork, c->sel);
	if (rc < 1)
		return rc < 0 ? rc : kvtr_err(-EPROTO, "the indexer selected nothing");
	n = (uint32_t)rc;
	if (c->o->topk_out) {
		int32_t *o = c->o->topk_out + ((size_t)l * c->P + pos) * (size_t)m->index_topk;

		for (uint32_t i = 0; i < (uint32_t)m->index_topk; i++)
			o[i] = i < n ? (int32_t)c->sel[i] : -1;
	}
	ns = c->sel[n - 1] == pos ? n - 1 : n; /* stored positions selected */
	hf_kernel_query(c, l);
	c->have = 0;
	for (uint32_t i = 0; i < ns; i++) { /* the blocks holding them, ascending */
		uint32_t b = c->sel[i] / tpb;

		if (nblk && c->ranges[nblk - 1].first_block == b)
			continue;
		c->ranges[nblk].seq = seq;
		c->ranges[nblk].first_block = b;
		c->ranges[nblk].n_blocks = 1;
		nblk++;
		if (c->stamp[b] != pos + 1) { /* first layer of this step to read it */
			c->stamp[b] = pos + 1;
			c->r->dsa_blocks++;
			c->pf[c->n_pf++] = c->ranges[nblk - 1];
		}
	}
	c->r->dsa_layer_blocks += nblk;
	c->r->dense_layer_blocks += (pos + tpb - 1) / tpb;
	if (c->psel) { /* this layer's blocks: the next step's prediction for it */
		memcpy(c->psel + (size_t)l * m->index_topk, c->ranges, nblk * sizeof(*c->ranges));
		c->n_psel[l] = nblk;
	}
	for (uint32_t w = 0, t0 = 0; w < nblk;) {
		uint32_t wn = nblk - w < c->cap ? nblk - w : c->cap, t1 = t0;
		int rc2;
		struct kvt_batch *b = NULL;

		for (;;) {
			rc = kvt_batch_prepare_ranges(c->e, c->ranges + w, wn, &b);
			if (rc == 0 || !hf_nofit(rc) || wn == 1)
				break;
			wn /= 2;
			c->cap = wn;
		}
		if (rc)
			return kvtr_err_kvt(rc, "kvt_batch_prepare_ranges (selected blocks)");
		c->r->windows++;
		if (w == 0 && c->o->dsa_prefetch == 2 && l + 1 < (uint32_t)m->n_layers &&
		    (rc = hf_dsa_hint(c, seq, (pos - 1) / tpb,
				      c->psel + (size_t)(l + 1) * m->index_topk,
				      c->n_psel[l + 1])) != 0) { /* the next layer's, one ahead */
			kvt_batch_release(b, NULL);
			return rc;
		}
		while (t1 < ns && c->sel[t1] / tpb <= c->ranges[w + wn - 1].first_block)
			t1++;
		rc = hf_dsa_window(c, l, c->ranges + w, wn, c->sel + t0, t1 - t0, pos, &b);
		rc2 = kvt_batch_release(b, NULL);
		if (rc == 0 && rc2)
			rc = kvtr_err_kvt(rc2, "kvt_batch_release");
		if (rc)
			return rc;
		t0 = t1;
		w += wn;
	}
	if (ns < n && (rc = hf_self_partial(c, side)) != 0)
		return rc;
	kvhf_attn_set(m, &c->st, l, c->ao);
	return 0;
}

/*
 * opts.dsa_prefetch, after a step's commit, the predictor being that consecutive queries
 * select much the same tokens: 1, the blocks all this step's selections read (c->pf, in the
 * order the layers first read them) hinted for the next step; 2, those of layer 0's selection
 * only (the later layers' are hinted one layer ahead, hf_dsa_attend). Resets c->pf.
 */
static int
hf_dsa_prefetch(struct hf_run *c, kvt_seq_id seq, uint32_t pos)
{
	uint32_t n = c->n_pf;

	c->n_pf = 0;
	if (c->o->dsa_prefetch == 1)
		return hf_dsa_hint(c, seq, pos / c->tpb, c->pf, n);
	if (c->o->dsa_prefetch == 2)
		return hf_dsa_hint(c, seq, pos / c->tpb, c->psel, c->n_psel[0]);
	return 0;
}

/* One position: forward pass of @tok at @pos with attention through kvtier, then commit. */
static int
hf_position(struct hf_run *c, kvt_seq_id seq, uint32_t pos, int32_t tok)
{
	const struct kvhf_model *m = c->m;
	uint32_t kw = m->kv_width;
	int rc;

	rc = hf_state_load(c, seq, pos);
	if (rc)
		return rc;
	kvhf_fwd_embed(m, &c->st, tok);
	for (uint32_t l = 0; l < (uint32_t)m->n_layers; l++) {
		uint32_t lo = 0, kl = (uint32_t)m->layers[l].kv_src, window = 0;
		float *side = c->side + (size_t)kl * 2 * kw;

		if (m->layers[l].linear) { /* on the working copy of its state */
			float *w = c->lin + (size_t)m->layers[l].lin_idx * c->lin_floats;

			rc = kvhf_fwd_gdn(m, &c->st, l, w, w + kvhf_gdn_conv_floats(m));
			if (rc)
				return rc;
			continue;
		}
		kvhf_fwd_qkv(m, &c->st, l, pos);
		if (m->dsa) { /* the indexer's tokens only (dsa.h) */
			memcpy(side, c->st.k, kw * sizeof(float));
			kvhf_fwd_index(m, &c->st, l, pos);
			rc = hf_dsa_attend(c, seq, l, pos, side);
			if (rc)
				return rc;
			kvhf_fwd_rest(m, &c->st, l);
			continue;
		}
		if (kl == l) { /* a KV-shared layer reads its source's (computed before it) */
			memcpy(side, c->st.k, kw * sizeof(float));
			memcpy(side + kw, c->st.v, kw * sizeof(float));
		}
		if (m->layers[l].sliding) {
			window = (uint32_t)m->sliding_window;
			if (pos + 1 > window)
				lo = pos + 1 - window;
		}
		if (!c->kv)
			hf_kernel_query(c, l);
		c->have = 0;
		rc = hf_attend_stored(c, seq, kl, l, lo, pos, window);
		if (rc)
			return rc;
		if (c->kv) {
			kvhf_attn_add(m, &c->st, l, side, side + kw);
		} else {
			rc = hf_self_partial(c, side);
			if (rc)
				return rc;
			kvhf_attn_set(m, &c->st, l, c->ao);
		}
		kvhf_fwd_rest(m, &c->st, l);
	}
	kvhf_fwd_logits(m, &c->st);
	c->r->positions++;
	if (m->dsa)
		c->r->dense_blocks += (pos + c->tpb - 1) / c->tpb;
	rc = hf_commit(c, seq, pos, tok);
	if (rc == 0 && m->dsa)
		rc = hf_dsa_prefetch(c, seq, pos);
	return rc;
}

/* opts.report: slots in use per group after a position. */
static int
hf_measure(struct hf_run *c)
{
	uint64_t total = 0;

	for (uint32_t i = 0; i < c->n_groups; i++) {
		struct kvhf_group_mem *g = &c->r->mem[i];
		struct kvt_stats st;
		uint32_t used = 0;
		int rc;

		if (c->grp[i].geo.kind == KVT_GROUP_ALIAS || c->grp[i].geo.kind == KVT_GROUP_SIDECAR)
			continue; /* no pool of its own (a SIDECAR's bytes are in its parent's) */
		memset(&st, 0, sizeof(st));
		st.size = sizeof(st);
		rc = kvt_engine_group_stats(c->e, i, &st);
		if (rc)
			return kvtr_err_kvt(rc, "kvt_engine_group_stats");
		for (int t = 0; t < KVT_TIER_COUNT; t++)
			used += st.tier[t].used_slots;
		g->end_slots = used;
		if (used > g->peak_slots)
			g->peak_slots = used;
		total += (uint64_t)used * g->block_bytes;
	}
	if (total > c->r->peak_bytes)
		c->r->peak_bytes = total;
	return 0;
}

/* opts.report: the groups' kinds, slots and kvtier-calc's bound for @P positions. */
static void
hf_mem_init(struct hf_run *c, uint32_t P)
{
	uint64_t tpb = c->tpb, blocks = (P + tpb - 1) / tpb;

	c->r->bound_bytes = 0;
	for (uint32_t i = 0; i < c->n_groups; i++) {
		struct kvhf_group_mem *g = &c->r->mem[i];
		const struct kvt_group_geometry *geo = &c->grp[i].geo;

		memset(g, 0, sizeof(*g));
		g->kind = geo->kind;
		g->n_layers = geo->n_layers;
		if (geo->kind == KVT_GROUP_ALIAS || geo->kind == KVT_GROUP_SIDECAR)
			continue;
		g->block_bytes = geo->block_bytes;
		g->bound_blocks = geo->kind == KVT_GROUP_STATE ? 2 : blocks; /* the 2 live slots */
		if (geo->kind == KVT_GROUP_WINDOW) {
			uint64_t b = (geo->sink + tpb - 1) / tpb + (geo->window + tpb - 1) / tpb + 1;

			if (b < g->bound_blocks)
				g->bound_blocks = b;
		}
		c->r->bound_bytes += g->bound_blocks * g->block_bytes;
	}
}

int32_t
kvhf_argmax(const float *x, int n)
{
	int32_t best = 0;

	for (int i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return best;
}

static int
hf_park_resume(struct hf_run *c, kvt_seq_id seq)
{
	struct kvt_seq_info si;
	int rc = hf_park_nvme(c, seq, &si);

	if (rc)
		return rc;
	if (si.blocks_in[KVT_TIER_HBM] != 0 || !si.parked)
		return kvtr_err(-EPROTO, "engine bug: a parked sequence has %u blocks in HBM "
				"(parked %u)", si.blocks_in[KVT_TIER_HBM], si.parked);
	rc = kvt_seq_resume(c->e, seq);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_seq_resume");
	c->r->parks++;
	return 0;
}

/*
 * Positions [from, to) of @seq: position p's input is tokens[p] (a prompt token or the previous
 * step's argmax, written into tokens[p + 1] when p + 1 is past the prompt); logits to
 * r->logits[p]. Parks and resumes every park_every positions.
 */
static int
hf_decode(struct hf_run *c, kvt_seq_id seq, int32_t *tokens, float *logits, uint32_t from,
	  uint32_t to)
{
	const struct kvhf_opts *o = c->o;
	uint32_t P = o->n_prompt + o->gen;
	int rc;

	for (uint32_t p = from; p < to; p++) {
		double t0 = o->pos_s ? kvtr_now() : 0.0;

		rc = hf_position(c, seq, p, tokens[p]);
		if (o->pos_s)
			o->pos_s[p] = kvtr_now() - t0;
		if (rc == 0 && o->report)
			rc = hf_measure(c);
		if (rc)
			return rc;
		if (p + 1 < P) {
			memcpy(logits + (size_t)p * (size_t)c->m->vocab, c->st.logits,
			       (size_t)c->m->vocab * sizeof(float));
			if (p + 1 >= o->n_prompt)
				tokens[p + 1] = kvhf_argmax(c->st.logits, c->m->vocab);
		}
		if (o->park_every && (p + 1) % o->park_every == 0 && p + 1 < to) {
			rc = hf_park_resume(c, seq);
			if (rc)
				return rc;
		}
	}
	return 0;
}

static int
hf_open(struct hf_run *c, uint64_t key, kvt_seq_id *seq)
{
	struct kvt_seq_opts so;
	int rc;

	kvt_seq_opts_init(&so, sizeof(so));
	so.session_key = key;
	rc = kvt_seq_open(c->e, &so, seq);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_seq_open");
	return 0;
}

/* Prefix sharing: a second sequence attaches the prompt's blocks and computes the rest. */
static int
hf_prefix_second(struct hf_run *c, kvt_seq_id *first, const int32_t *tokens,
		 const float *logits)
{
	uint32_t P = c->o->n_prompt + c->o->gen, V = (uint32_t)c->m->vocab;
	int32_t *t2 = malloc((size_t)P * sizeof(int32_t));
	float *l2 = malloc((size_t)P * V * sizeof(float));
	kvt_seq_id s2 = 0;
	uint64_t a = 0;
	int rc;

	if (!t2 || !l2) {
		rc = kvtr_err(-ENOMEM, "out of memory");
		goto out;
	}
	memcpy(t2, tokens, (size_t)c->o->n_prompt * sizeof(int32_t));
	if (c->o->close_first && *first) {
		rc = kvt_seq_close(c->e, *first);
		*first = 0;
		if (rc) {
			rc = kvtr_err_kvt(rc, "kvt_seq_close (the first sequence)");
			goto out;
		}
	}
	rc = hf_open(c, 0, &s2);
	if (rc)
		goto out;
	rc = kvt_seq_attach_prefix(c->e, s2, t2, c->o->n_prompt - 1, &a);
	if (rc) {
		rc = kvtr_err_kvt(rc, "kvt_seq_attach_prefix");
		goto out;
	}
	c->r->prefix_tokens = a;
	if (a == 0) {
		rc = kvtr_err(-EPROTO, "prefix sharing: nothing of the %u-token prompt was attached",
			      c->o->n_prompt);
		goto out;
	}
	memcpy(l2, logits, (size_t)a * V * sizeof(float));
	rc = hf_decode(c, s2, t2, l2, (uint32_t)a, P);
	if (rc)
		goto out;
	for (uint32_t p = 0; p < P; p++)
		if (t2[p] != tokens[p]) {
			rc = kvtr_err(KVT_EFORMAT, "prefix sharing: the sequence that attached %llu "
				      "tokens has token %d at position %u, the first one %d",
				      (unsigned long long)a, t2[p], p, tokens[p]);
			goto out;
		}
	/* the result is the second sequence's (its attached positions are the first's) */
	memcpy(c->r->logits, l2, (size_t)(P - 1) * V * sizeof(float));
out:
	if (s2)
		kvt_seq_close(c->e, s2);
	free(t2);
	free(l2);
	return rc;
}

static void
hf_teardown(struct hf_run *c)
{
	if (c->e) {
		c->r->stats.size = sizeof(c->r->stats);
		(void)kvt_engine_stats(c->e, &c->r->stats);
		for (uint32_t g = 0; g < c->n_groups; g++) {
			struct kvt_stats gs;

			memset(&gs, 0, sizeof(gs));
			gs.size = sizeof(gs);
			if (kvt_engine_group_stats(c->e, g, &gs) == 0)
				memcpy(c->r->group_moved[g], gs.blocks_moved,
				       sizeof(c->r->group_moved[g]));
		}
	}
	kvt_engine_destroy(c->e);
	c->e = NULL;
}

/*
 * Persistent store: phase A in a child process (positions [0, stop), park to NVMe, drain:
 * published; then SIGKILL itself), phase B here: a new engine on the same store, the session
 * restored by key, the rest decoded.
 */
static int
hf_persist(struct hf_run *c, int32_t *tokens, float *logits)
{
	const struct kvhf_opts *o = c->o;
	uint32_t P = o->n_prompt + o->gen, V = (uint32_t)c->m->vocab;
	uint32_t stop = o->stop_after ? o->stop_after : o->n_prompt + o->gen / 2;
	size_t shm_len = (size_t)P * sizeof(int32_t) + (size_t)P * V * sizeof(float);
	char *shm;
	kvt_seq_id seq = 0;
	uint64_t keys[4];
	struct kvt_seq_info si;
	pid_t pid;
	int rc, st = 0, n;

	if (!o->nvme_dir)
		return kvtr_err(-EINVAL, "the persistent store needs an NVMe directory");
	if (stop < 1 || stop >= P)
		return kvtr_err(-EINVAL, "stop_after %u out of range [1, %u)", stop, P);
	shm = mmap(NULL, shm_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (shm == MAP_FAILED)
		return kvtr_err(-errno, "mmap: %s", strerror(errno));
	memcpy(shm, tokens, (size_t)P * sizeof(int32_t));
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		munmap(shm, shm_len);
		return kvtr_err(-errno, "fork: %s", strerror(errno));
	}
	if (pid == 0) {
		int32_t *ct = (int32_t *)shm;
		float *cl = (float *)(shm + (size_t)P * sizeof(int32_t));

		rc = hf_engine_create(c, 1);
		if (rc == 0) { /* a session of an earlier run under the key: start afresh */
			rc = kvt_session_drop(c->e, o->session_key);
			if (rc == -ENOENT)
				rc = 0;
			else if (rc)
				rc = kvtr_err_kvt(rc, "kvt_session_drop");
		}
		if (rc == 0)
			rc = hf_open(c, o->session_key, &seq);
		if (rc == 0)
			rc = hf_decode(c, seq, ct, cl, 0, stop);
		if (rc == 0 && (rc = kvt_seq_park(c->e, seq, KVT_TIER_NVME)) != 0)
			rc = kvtr_err_kvt(rc, "kvt_seq_park");
		if (rc == 0 && (rc = kvt_engine_drain(c->e)) != 0)
			rc = kvtr_err_kvt(rc, "kvt_engine_drain");
		if (rc) {
			fprintf(c->log, "kvtier-hf: before the kill: %s\n", kvtr_last_error());
			_exit(1);
		}
		raise(SIGKILL); /* kill -9: no destroy, nothing flushed on the way out */
		_exit(2);
	}
	if (waitpid(pid, &st, 0) != pid) {
		munmap(shm, shm_len);
		return kvtr_err(-errno, "waitpid: %s", strerror(errno));
	}
	memcpy(tokens, shm, (size_t)P * sizeof(int32_t));
	memcpy(logits, shm + (size_t)P * sizeof(int32_t), (size_t)stop * V * sizeof(float));
	munmap(shm, shm_len);
	if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL)
		return kvtr_err(-EIO, "the child that fills the store did not die of SIGKILL "
				"(status %d): see its message above", st);
	rc = hf_engine_create(c, 1);
	if (rc)
		return rc;
	n = kvt_session_list(c->e, keys, 4);
	if (n != 1 || keys[0] != o->session_key)
		return kvtr_err(-ENOENT, "after kill -9 the store lists %d session(s), expected "
				"the one with key %llx", n, (unsigned long long)o->session_key);
	rc = kvt_seq_restore(c->e, o->session_key, NULL, &seq);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_seq_restore");
	rc = kvt_seq_info(c->e, seq, &si);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_seq_info");
	c->r->restored_tokens = si.n_tokens;
	if (si.n_tokens != stop)
		return kvtr_err(-EPROTO, "the restored session holds %llu tokens, %u were parked",
				(unsigned long long)si.n_tokens, stop);
	rc = hf_decode(c, seq, tokens, logits, stop, P);
	if (rc == 0)
		rc = hf_state_out(c, seq, P);
	if (rc == 0) {
		kvt_seq_close(c->e, seq);
		rc = kvt_session_drop(c->e, o->session_key);
		if (rc == -ENOENT)
			rc = 0;
		else if (rc)
			rc = kvtr_err_kvt(rc, "kvt_session_drop");
	}
	return rc;
}

int
kvhf_run(const struct kvhf_opts *o, struct kvhf_result *r)
{
	struct hf_run c;
	uint32_t P;
	kvt_seq_id seq = 0;
	int rc = 0;

	memset(r, 0, sizeof(*r));
	memset(&c, 0, sizeof(c));
	if (!o->model || !o->prompt || o->n_prompt < 1)
		return kvtr_err(-EINVAL, "no model or no prompt");
	if (o->tokens_per_block < 1 || o->tokens_per_block > 65536)
		return kvtr_err(-EINVAL, "tokens per block %u out of range [1, 65536]",
				o->tokens_per_block);
	if (!(o->hbm_frac >= 0 && o->hbm_frac <= 1 && o->host_frac >= 0 && o->host_frac <= 1))
		return kvtr_err(-EINVAL, "tier fractions %g, %g out of [0, 1]", (double)o->hbm_frac,
				(double)o->host_frac);
	P = o->n_prompt + o->gen;
	if (o->contiguous && (o->park_every || o->prefix_share || o->persist))
		return kvtr_err(-EINVAL, "the contiguous mode keeps no KV in kvtier: no parking, "
				"prefix sharing or persistent store with it");
	if (o->report && (o->prefix_share || o->persist || o->contiguous))
		return kvtr_err(-EINVAL, "the memory report measures one sequence in one engine: "
				"not with prefix sharing, the persistent store or the contiguous mode");
	if (o->close_first && !o->prefix_share)
		return kvtr_err(-EINVAL, "close_first is a prefix-sharing option");
	if (o->model->dsa && (o->contiguous || o->single_layout))
		return kvtr_err(-EINVAL, "deepseek_v32 runs with layer groups through kvtier only "
				"(no contiguous or single-layout mode): its indexer keys are a "
				"SIDECAR group of the latents");
	if (o->single_layout && o->model->n_linear)
		return kvtr_err(KVT_ENOTSUP, "the single layout has no place for the state of %s's "
				"%d linear-attention layers (a STATE group does)",
				o->model->model_type, o->model->n_linear);
	if (P > (uint32_t)o->model->max_pos)
		return kvtr_err(-EINVAL, "%u positions exceed max_position_embeddings %d", P,
				o->model->max_pos);
	for (uint32_t i = 0; i < o->n_prompt; i++)
		if (o->prompt[i] < 0 || o->prompt[i] >= o->model->vocab)
			return kvtr_err(-EINVAL, "prompt token %d at %u is not in [0, %d)",
					o->prompt[i], i, o->model->vocab);
	c.o = o;
	c.m = o->model;
	c.r = r;
	c.log = o->log ? o->log : stderr;
	c.P = P;
	if (!o->contiguous && !o->single_layout) {
		rc = kvhf_model_groups(c.m, &c.groups);
		if (rc)
			return rc;
	}
	if (!o->contiguous) {
		size_t nh = (size_t)c.m->n_heads, w = (size_t)c.m->head_dim + 1;
		size_t sc = P > 64 * o->tokens_per_block ? P : 64 * (size_t)o->tokens_per_block;

		if (c.m->family == KVHF_DEEPSEEK)
			w = (size_t)c.m->kv_lora_rank + (size_t)c.m->qk_rope + 1;
		if ((size_t)c.m->qk_nope + (size_t)c.m->qk_rope + 1 > w)
			w = (size_t)c.m->qk_nope + (size_t)c.m->qk_rope + 1;
		c.lgroup = calloc((size_t)c.m->n_layers, sizeof(uint32_t));
		c.lidx = calloc((size_t)c.m->n_layers, sizeof(uint32_t));
		c.q = calloc(nh * w, sizeof(float));
		c.qpe = calloc(nh * ((size_t)c.m->qk_rope + 1), sizeof(float));
		c.po = calloc(nh * w, sizeof(float));
		c.ao = calloc(nh * w, sizeof(float));
		c.pm = calloc(nh, sizeof(float));
		c.pl = calloc(nh, sizeof(float));
		c.am = calloc(nh, sizeof(float));
		c.al = calloc(nh, sizeof(float));
		c.scratch = calloc(sc, sizeof(float));
		if (!c.lgroup || !c.lidx || !c.q || !c.qpe || !c.po || !c.ao || !c.pm || !c.pl ||
		    !c.am || !c.al || !c.scratch) {
			rc = kvtr_err(-ENOMEM, "out of memory");
			goto out_free;
		}
	}
	if (c.m->dsa) {
		uint32_t tk = (uint32_t)c.m->index_topk, tpb = o->tokens_per_block;
		size_t dim = (size_t)c.m->index_head_dim;

		c.sel = calloc(tk, sizeof(uint32_t));
		c.ranges = calloc(tk, sizeof(*c.ranges));
		c.iscores = calloc(P, sizeof(float));
		c.tkwork = calloc(P, 16);
		c.stamp = calloc(P / tpb + 1, sizeof(uint32_t));
		c.ikey = calloc((size_t)c.m->n_layers * dim, sizeof(float));
		c.keys = calloc(((size_t)P / tpb + 2) * tpb * dim, sizeof(float));
		c.kranges = calloc(P / tpb + 1, sizeof(*c.kranges));
		c.pf = calloc(P / tpb + 1, sizeof(*c.pf));
		c.hbuf = calloc(P / tpb + 2, sizeof(*c.hbuf));
		if (o->dsa_prefetch == 2) {
			c.psel = calloc((size_t)c.m->n_layers * tk, sizeof(*c.psel));
			c.n_psel = calloc((size_t)c.m->n_layers, sizeof(uint32_t));
		}
		if (!c.sel || !c.ranges || !c.iscores || !c.tkwork || !c.stamp || !c.ikey || !c.keys ||
		    !c.kranges || !c.pf || !c.hbuf ||
		    (o->dsa_prefetch == 2 && (!c.psel || !c.n_psel))) {
			rc = kvtr_err(-ENOMEM, "out of memory");
			goto out_free;
		}
	}
	if (o->contiguous &&
	    !(c.kv = calloc((size_t)c.m->n_layers * P * 2 * c.m->kv_width, sizeof(float)))) {
		rc = kvtr_err(-ENOMEM, "out of memory for the contiguous KV of %u positions", P);
		goto out_free;
	}
	r->tokens = calloc(P, sizeof(int32_t));
	r->logits = calloc((size_t)P * (size_t)c.m->vocab, sizeof(float));
	c.side = calloc((size_t)c.m->n_layers * 2 * c.m->kv_width, sizeof(float));
	c.lin_floats = kvhf_gdn_conv_floats(c.m) + kvhf_gdn_rec_floats(c.m);
	c.lin = calloc((size_t)c.m->n_linear * c.lin_floats + 1, sizeof(float));
	if (!r->tokens || !r->logits || !c.side || !c.lin) {
		rc = kvtr_err(-ENOMEM, "out of memory for %u positions", P);
		goto out_free;
	}
	memcpy(r->tokens, o->prompt, (size_t)o->n_prompt * sizeof(int32_t));
	r->n_tokens = P;
	r->n_logits = P - 1;
	rc = kvhf_state_init(&c.st, c.m);
	if (rc == 0 && o->persist) {
		rc = hf_persist(&c, r->tokens, r->logits);
	} else if (rc == 0 && o->contiguous) {
		rc = hf_decode(&c, 0, r->tokens, r->logits, 0, P);
		if (rc == 0)
			rc = hf_state_out(&c, 0, P);
	} else if (rc == 0) {
		rc = hf_engine_create(&c, 0);
		if (rc == 0 && o->report)
			hf_mem_init(&c, P);
		if (rc == 0)
			rc = hf_open(&c, 0, &seq);
		if (rc == 0)
			rc = hf_decode(&c, seq, r->tokens, r->logits, 0, P);
		if (rc == 0)
			rc = hf_state_out(&c, seq, P);
		if (rc == 0 && o->prefix_share)
			rc = hf_prefix_second(&c, &seq, r->tokens, r->logits);
		if (rc == 0 && (rc = kvt_engine_drain(c.e)) != 0)
			rc = kvtr_err_kvt(rc, "kvt_engine_drain");
	}
	hf_teardown(&c);
	if (c.tmpdir[0])
		rmdir(c.tmpdir);
	kvhf_state_fini(&c.st);
out_free:
	free(c.side);
	free(c.lin);
	free(c.kv);
	free(c.lgroup);
	free(c.lidx);
	free(c.q);
	free(c.qpe);
	free(c.po);
	free(c.ao);
	free(c.pm);
	free(c.pl);
	free(c.am);
	free(c.al);
	free(c.scratch);
	free(c.sel);
	free(c.ranges);
	free(c.iscores);
	free(c.tkwork);
	free(c.stamp);
	free(c.ikey);
	free(c.keys);
	free(c.kranges);
	free(c.pf);
	free(c.psel);
	free(c.hbuf);
	free(c.n_psel);
	kvhf_groups_free(&c.groups);
	return rc;
}

/* The first block any layer of a sequence reads at position @pos (0 with a full layer). */
static uint32_t
hf_first_block(const struct hf_run *c, uint32_t pos)
{
	uint32_t fb = UINT32_MAX;

	for (int l = 0; l < c->m->n_layers; l++) {
		uint32_t lo = 0, w = (uint32_t)c->m->sliding_window;

		if (c->m->layers[l].sliding && pos + 1 > w)
			lo = pos + 1 - w;
		if (lo / c->tpb < fb)
			fb = lo / c->tpb;
	}
	return fb;
}

int
kvhf_run_multi(const struct kvhf_opts *o, int prefetch,
	       void (*hook)(void *arg, struct kvt_engine *e, uint32_t step,
			    const struct kvhf_result *r),
	       void *hook_arg, int32_t *argmax, struct kvhf_result *r)
{
	struct hf_run c;
	uint32_t S = o->sessions, P = o->n_prompt, V;
	kvt_seq_id *seqs = NULL;
	int32_t *toks = NULL;
	size_t nh, w;
	int rc = 0;

	memset(r, 0, sizeof(*r));
	memset(&c, 0, sizeof(c));
	if (!o->model || S < 1 || P < 2 || o->gen || o->single_layout || o->prefix_share ||
	    o->persist || o->contiguous || o->park_every || o->tokens_per_block < 1 ||
	    o->model->dsa)
		return kvtr_err(-EINVAL, "kvhf_run_multi: a model, >= 1 session, >= 2 prompt "
				"positions, no generation, groups, none of the single-sequence "
				"checks, no deepseek_v32");
	if (P > (uint32_t)o->model->max_pos)
		return kvtr_err(-EINVAL, "%u positions exceed max_position_embeddings %d", P,
				o->model->max_pos);
	c.o = o;
	c.m = o->model;
	c.r = r;
	c.log = o->log ? o->log : stderr;
	c.P = P;
	V = (uint32_t)c.m->vocab;
	nh = (size_t)c.m->n_heads;
	w = (size_t)c.m->head_dim + (size_t)c.m->kv_lora_rank + (size_t)c.m->qk_nope +
	    (size_t)c.m->qk_rope + 1;
	rc = kvhf_model_groups(c.m, &c.groups);
	if (rc)
		return rc;
	seqs = calloc(S, sizeof(*seqs));
	toks = calloc((size_t)S * P, sizeof(int32_t));
	c.lgroup = calloc((size_t)c.m->n_layers, sizeof(uint32_t));
	c.lidx = calloc((size_t)c.m->n_layers, sizeof(uint32_t));
	c.q = calloc(nh * w, sizeof(float));
	c.qpe = calloc(nh * ((size_t)c.m->qk_rope + 1), sizeof(float));
	c.po = calloc(nh * w, sizeof(float));
	c.ao = calloc(nh * w, sizeof(float));
	c.pm = calloc(nh, sizeof(float));
	c.pl = calloc(nh, sizeof(float));
	c.am = calloc(nh, sizeof(float));
	c.al = calloc(nh, sizeof(float));
	c.scratch = calloc(P + 64 * (size_t)o->tokens_per_block, sizeof(float));
	c.side = calloc((size_t)c.m->n_layers * 2 * c.m->kv_width, sizeof(float));
	c.lin_floats = kvhf_gdn_conv_floats(c.m) + kvhf_gdn_rec_floats(c.m);
	c.lin = calloc((size_t)c.m->n_linear * c.lin_floats + 1, sizeof(float));
	if (!seqs || !toks || !c.lgroup || !c.lidx || !c.q || !c.qpe || !c.po || !c.ao || !c.pm ||
	    !c.pl || !c.am || !c.al || !c.scratch || !c.side || !c.lin) {
		rc = kvtr_err(-ENOMEM, "out of memory");
		goto out;
	}
	for (uint32_t s = 0; s < S; s++) /* fixed prompts, distinct per session */
		for (uint32_t i = 0; i < P; i++)
			toks[(size_t)s * P + i] = (int32_t)(3 + ((uint64_t)s * 131 + (uint64_t)i * 17 +
							 (uint64_t)i * i % 7) % (V > 3 ? V - 3 : 1));
	rc = kvhf_state_init(&c.st, c.m);
	if (rc == 0)
		rc = hf_engine_create(&c, 0);
	if (rc == 0)
		hf_mem_init(&c, P);
	for (uint32_t s = 0; rc == 0 && s < S; s++)
		rc = hf_open(&c, 0, &seqs[s]);
	for (uint32_t p = 0; rc == 0 && p < P; p++) {
		for (uint32_t s = 0; rc == 0 && s < S; s++) {
			if (prefetch) { /* the next sessions' blocks come up while this one
					   computes; one with nothing to read yet is left out */
				struct kvt_seq_range rg[8];
				uint32_t nr = 0;
				int hr;

				for (uint32_t d = 1; d <= (uint32_t)prefetch && d <= 8 && d < S + 1;
				     d++) {
					uint32_t ns = (s + d) % S, np = p + (s + d) / S;
					uint32_t fb = hf_first_block(&c, np);

					if (np >= P || ns == s || (uint64_t)fb * c.tpb >= np)
						continue;
					rg[nr].seq = seqs[ns];
					rg[nr].first_block = fb;
					rg[nr].n_blocks = 0;
					nr++;
				}
				hr = nr ? kvt_engine_hint_ranges(c.e, rg, nr, 1) : 0;
				if (hr == KVT_ETOOBIG && nr > 1) /* too much: the next one only */
					hr = kvt_engine_hint_ranges(c.e, rg, 1, 1);
				if (hr && hr != KVT_ETOOBIG) {
					rc = kvtr_err_kvt(hr, "kvt_engine_hint_ranges");
					break;
				}
			}
			rc = hf_position(&c, seqs[s], p, toks[(size_t)s * P + p]);
			if (rc == 0)
				argmax[(size_t)s * P + p] = kvhf_argmax(c.st.logits, c.m->vocab);
		}
		for (uint32_t g = 0; rc == 0 && g < c.n_groups; g++) {
			const struct kvt_group_geometry *geo = &c.grp[g].geo;
			uint32_t first = 0;

			if (geo->kind == KVT_GROUP_ALIAS || geo->kind == KVT_GROUP_SIDECAR)
				continue;
			if (geo->kind == KVT_GROUP_WINDOW && p + 1 > geo->window)
				first = (p + 1 - geo->window) / c.tpb;
			if (geo->kind == KVT_GROUP_STATE) /* the block read, the one written */
				first = p ? (p - 1) / c.tpb : 0;
			r->touched[g] += (uint64_t)S * (p / c.tpb - first + 1);
		}
		if (rc == 0)
			rc = hf_measure(&c);
		if (rc == 0 && hook)
			hook(hook_arg, c.e, p + 1, r);
	}
	if (rc == 0 && (rc = kvt_engine_drain(c.e)) != 0)
		rc = kvtr_err_kvt(rc, "kvt_engine_drain");
	hf_teardown(&c);
	if (c.tmpdir[0])
		rmdir(c.tmpdir);
out:
	kvhf_state_fini(&c.st);
	free(seqs);
	free(toks);
	free(c.side);
	free(c.lin);
	free(c.lgroup);
	free(c.lidx);
	free(c.q);
	free(c.qpe);
	free(c.po);
	free(c.ao);
	free(c.pm);
	free(c.pl);
	free(c.am);
	free(c.al);
	free(c.scratch);
	kvhf_groups_free(&c.groups);
	return rc;
}

void
kvhf_result_free(struct kvhf_result *r)
{
	free(r->tokens);
	free(r->logits);
	memset(r, 0, sizeof(*r));
}
