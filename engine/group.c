/* SPDX-License-Identifier: MIT */
/*
 * engine/group.c - layer groups (issue 16): an engine whose model is a list of layer groups is
 * a front (struct kvt_engine with e->grp set) over one core engine per storage group (FULL,
 * WINDOW, LATENT), each a complete engine of the single-layout kind with exactly the group's
 * slot size: one pool per group (docs/ARCHITECTURE.md "Layer groups"). The public calls fan out
 * group by group; a public sequence is one core sequence per storage group, named by the id of
 * the first storage group's one.
 *
 * Locking: grp->lock guards the front's tables (sequences, batches) and is never held across
 * a core call; a core call takes its own engine lock. A public sequence being worked on by a
 * fanned-out call is marked busy, so that another thread's call on it answers KVT_EBUSY
 * instead of interleaving with it group by group.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "engine_impl.h"

#define GRP_MAX_DIM 4096u

struct kvt_grp_seq {
	kvt_seq_id id[KVT_MAX_GROUPS]; /* core sequence per storage group; 0 for ALIAS */
	uint8_t open;
	uint8_t busy;                  /* a fanned-out call works on it */
};

struct kvt_grp {
	uint32_t n;                       /* groups */
	uint32_t first;                   /* first storage group: its ids are the public ones */
	uint32_t n_layers;                /* model layers */
	uint32_t tpb;                     /* tokens per block, common */
	struct kvt_group g[KVT_MAX_GROUPS]; /* the descriptors (layers/alias_of point into lay) */
	struct kvt_engine *core[KVT_MAX_GROUPS]; /* pools; NULL for ALIAS groups */
	uint32_t src[KVT_MAX_GROUPS];     /* ALIAS: the one group its layers read, KVT_NIL when
	                                     several; a storage group: itself */
	uint32_t *lay;                    /* owned copies of layers[] and alias_of[] */
	uint32_t *lgroup;                 /* [n_layers] group storing each model layer (an ALIAS
	                                     layer: its source's) */
	uint32_t *lindex;                 /* [n_layers] its index in that group's layers[] */
	pthread_mutex_t lock;             /* guards what follows */
	struct kvt_grp_seq *seqs;         /* [cap_seqs] by the public id's low 32 bits */
	uint32_t cap_seqs;
	uint32_t n_open;                  /* public sequences open */
	uint32_t n_batches;               /* front batches not yet released */
	struct kvt_batch *batches;        /* their list (destroy frees those never released) */
};

static bool
grp_storage(enum kvt_group_kind k)
{
	return k == KVT_GROUP_FULL || k == KVT_GROUP_WINDOW || k == KVT_GROUP_LATENT ||
	       k == KVT_GROUP_STATE;
}

/* A STATE group's pool is a windowed engine whose window is the two newest tokens: the state
 * after the token before the next query (the one a step reads) and the next query's own block
 * (the one it writes) stay; older blocks leave, or stay cached as checkpoints. */
#define GRP_STATE_WINDOW 2u

/* Offset of tensor @t within one layer's state of STATE group @g (tensors in order, each at
 * its element size's alignment) and, into *bytes, its size; t = n_state: the layer's bytes. */
static uint64_t
grp_state_off(const struct kvt_group *g, uint32_t t, uint64_t *bytes)
{
	uint64_t off = 0, n = 0;
	uint32_t j, d;

	for (j = 0; j <= t && j < g->n_state; j++) {
		size_t es = kvt_dtype_size(g->state[j].dtype);

		off = (off + n + es - 1) / es * es;
		n = es;
		for (d = 0; d < g->state[j].n_dims; d++)
			n *= g->state[j].shape[d];
		if (j == t)
			break;
	}
	if (t >= g->n_state) {
		off += n;
		n = 0;
	}
	if (bytes)
		*bytes = n;
	return off;
}

static const char *
grp_kind_name(enum kvt_group_kind k)
{
	switch (k) {
	case KVT_GROUP_FULL: return "FULL";
	case KVT_GROUP_WINDOW: return "WINDOW";
	case KVT_GROUP_LATENT: return "LATENT";
	case KVT_GROUP_ALIAS: return "ALIAS";
	case KVT_GROUP_STATE: return "STATE";
	case KVT_GROUP_SIDECAR: return "SIDECAR";
	}
	return "?";
}

/* Re-raise the calling thread's last error @rc with "group @g: " in front of its message. */
static int
grp_err(int rc, uint32_t g)
{
	char keep[512];

	snprintf(keep, sizeof keep, "%s", kvt_last_error_message());
	return kvt_err(rc, "group %u: %s", g, keep);
}

void
kvt_group_init(struct kvt_group *g, size_t size)
{
	struct kvt_group d;

	if (!g)
		return;
	memset(&d, 0, sizeof d);
	d.size = size;
	d.kind = KVT_GROUP_FULL;
	d.dtype = KVT_DTYPE_F16;
	memcpy(g, &d, size < sizeof d ? size : sizeof d);
}

/* ---- create / destroy ---------------------------------------------------------------------- */

/* The core layout of storage group @g and its V elements per head. */
static void
grp_core_layout(const struct kvt_grp *G, const struct kvt_group *g, struct kvt_layout *l,
		uint32_t *v_dim)
{
	memset(l, 0, sizeof *l);
	l->n_layers = g->n_layers;
	l->dtype = g->dtype;
	l->tokens_per_block = G->tpb;
	if (g->kind == KVT_GROUP_STATE) {
		/* opaque bytes per layer (kvt_engine_create_core's layer_bytes); the element
		 * type of the first tensor for the codec's shuffle */
		l->n_kv_heads = 1;
		l->head_dim = 1;
		l->dtype = g->state[0].dtype;
		*v_dim = 0;
	} else if (g->kind == KVT_GROUP_LATENT) {
		l->n_kv_heads = 1;
		l->head_dim = g->latent_dim;
		*v_dim = 0;
	} else {
		l->n_kv_heads = g->n_kv_heads;
		l->head_dim = g->head_dim;
		*v_dim = g->v_head_dim ? g->v_head_dim : g->head_dim;
	}
}

/* Bytes per layer of a block that SIDECAR group @g adds to its parent's. */
static uint64_t
grp_sc_bytes(const struct kvt_grp *G, const struct kvt_group *g)
{
	return (uint64_t)G->tpb * g->sidecar_token_bytes + g->sidecar_block_bytes;
}

/* The SIDECAR group following group @p, or KVT_NIL. */
static uint32_t
grp_sidecar_of(const struct kvt_grp *G, uint32_t p)
{
	uint32_t i;

	for (i = 0; i < G->n; i++)
		if (G->g[i].kind == KVT_GROUP_SIDECAR && G->g[i].parent == p)
			return i;
	return KVT_NIL;
}

/* Bytes of one block of storage group @g (all its layers). */
static uint64_t
grp_block_bytes(const struct kvt_grp *G, const struct kvt_group *g)
{
	struct kvt_layout l;
	uint32_t v;

	uint32_t sc = grp_sidecar_of(G, (uint32_t)(g - G->g));

	if (g->kind == KVT_GROUP_STATE)
		return grp_state_off(g, g->n_state, NULL) * g->n_layers;
	grp_core_layout(G, g, &l, &v);
	return ((uint64_t)l.tokens_per_block * l.n_kv_heads * ((uint64_t)l.head_dim + v) *
		kvt_dtype_size(l.dtype) + (sc == KVT_NIL ? 0 : grp_sc_bytes(G, &G->g[sc]))) *
	       l.n_layers;
}

/* Check the state tensors of STATE group @g (index @i). */
static int
grp_check_state(const struct kvt_group *g, uint32_t i)
{
	uint64_t elems;
	uint32_t j, d;

	if (g->n_state < 1 || g->n_state > KVT_GROUP_MAX_STATE)
		return kvt_err(-EINVAL, "group %u: n_state %u out of range 1..%u (state tensors per "
			       "layer)", i, g->n_state, KVT_GROUP_MAX_STATE);
	for (j = 0; j < g->n_state; j++) {
		const struct kvt_state_tensor *t = &g->state[j];

		if (!kvt_dtype_size(t->dtype))
			return kvt_err(-EINVAL, "group %u: state tensor %u: unknown element type %d",
				       i, j, (int)t->dtype);
		if (t->n_dims < 1 || t->n_dims > 4)
			return kvt_err(-EINVAL, "group %u: state tensor %u: n_dims %u out of range "
				       "1..4", i, j, t->n_dims);
		elems = 1;
		for (d = 0; d < t->n_dims; d++) {
			if (t->shape[d] < 1 || t->shape[d] > (1u << 20))
				return kvt_err(-EINVAL, "group %u: state tensor %u: shape[%u] = %u "
					       "out of range 1..%u", i, j, d, t->shape[d], 1u << 20);
			elems *= t->shape[d];
			if (elems > (1ull << 30))
				return kvt_err(-EINVAL, "group %u: state tensor %u: more than 2^30 "
					       "elements", i, j);
		}
	}
	elems = grp_state_off(g, g->n_state, NULL);
	if (elems * g->n_layers > KVT_ENGINE_MAX_BLOCK_BYTES)
		return kvt_err(-EINVAL, "group %u: a block of %llu state bytes per layer x %u "
			       "layers exceeds the block limit of %llu bytes", i,
			       (unsigned long long)elems, g->n_layers,
			       (unsigned long long)KVT_ENGINE_MAX_BLOCK_BYTES);
	return 0;
}

/* SIDECAR group @i alone (its parent is checked once every group is: grp_check_parents). */
static int
grp_check_sidecar(const struct kvt_grp *G, uint32_t i)
{
	const struct kvt_group *g = &G->g[i];

	if (g->parent >= G->n || g->parent == i)
		return kvt_err(-EINVAL, "group %u: parent %u is not another group (the engine has "
			       "%u)", i, g->parent, G->n);
	if (g->sidecar_token_bytes > (1u << 16) || g->sidecar_block_bytes > (1u << 24))
		return kvt_err(-EINVAL, "group %u: sidecar_token_bytes %llu (at most 65536) or "
			       "sidecar_block_bytes %llu (at most 16 MiB) out of range", i,
			       (unsigned long long)g->sidecar_token_bytes,
			       (unsigned long long)g->sidecar_block_bytes);
	if (g->sidecar_summary > KVT_SUMMARY_K_MINMAX)
		return kvt_err(-EINVAL, "group %u: unknown sidecar_summary %u", i,
			       g->sidecar_summary);
	if (g->sidecar_summary && (g->sidecar_token_bytes || g->sidecar_block_bytes))
		return kvt_err(-EINVAL, "group %u: a summary sidecar (sidecar_summary %u) is kvtier's: "
			       "sidecar_token_bytes and sidecar_block_bytes must be 0", i,
			       g->sidecar_summary);
	if (!g->sidecar_summary && !g->sidecar_token_bytes && !g->sidecar_block_bytes)
		return kvt_err(-EINVAL, "group %u: a SIDECAR group needs sidecar_token_bytes or "
			       "sidecar_block_bytes", i);
	if (g->tokens_per_block && g->tokens_per_block != G->tpb)
		return kvt_err(KVT_ENOTSUP, "group %u: tokens_per_block %u differs from the "
			       "layout's %u (per-group block sizes are not supported yet)", i,
			       g->tokens_per_block, G->tpb);
	return 0;
}

/* Every SIDECAR group's parent: a FULL, WINDOW or LATENT group followed by no other sidecar,
 * whose layers it names (or n_layers 0: the parent's). */
static int
grp_check_parents(const struct kvt_grp *G)
{
	uint32_t i, j;

	for (i = 0; i < G->n; i++) {
		const struct kvt_group *g = &G->g[i], *p;

		if (g->kind != KVT_GROUP_SIDECAR)
			continue;
		p = &G->g[g->parent];
		if (p->kind != KVT_GROUP_FULL && p->kind != KVT_GROUP_WINDOW &&
		    p->kind != KVT_GROUP_LATENT)
			return kvt_err(-EINVAL, "group %u: its parent, group %u, is a %s group: a "
				       "sidecar follows a FULL, WINDOW or LATENT group", i, g->parent,
				       grp_kind_name(p->kind));
		if (grp_sidecar_of(G, g->parent) != i)
			return kvt_err(-EINVAL, "group %u: group %u already has a sidecar (group %u)",
				       i, g->parent, grp_sidecar_of(G, g->parent));
		if (g->n_layers == 0)
			continue;
		if (g->n_layers != p->n_layers || !g->layers)
			return kvt_err(-EINVAL, "group %u: a sidecar's layers are its parent's (group "
				       "%u, %u layers): give them, or n_layers 0", i, g->parent,
				       p->n_layers);
		for (j = 0; j < g->n_layers; j++)
			if (g->layers[j] != p->layers[j])
				return kvt_err(-EINVAL, "group %u: layer %u of the sidecar is model "
					       "layer %u, its parent's is %u", i, j, g->layers[j],
					       p->layers[j]);
	}
	return 0;
}

/* Check descriptor @i (copied into G->g[i]) alone; @owner[l] = group claiming model layer l. */
static int
grp_check_one(struct kvt_grp *G, uint32_t i, uint32_t *owner)
{
	struct kvt_group *g = &G->g[i];
	uint32_t j;

	if ((unsigned)g->kind > KVT_GROUP_SIDECAR)
		return kvt_err(-EINVAL, "group %u: unknown kind %d", i, (int)g->kind);
	if (g->kind == KVT_GROUP_SIDECAR)
		return grp_check_sidecar(G, i); /* its layers are its parent's: owned there */
	if (g->n_layers < 1 || g->n_layers > G->n_layers)
		return kvt_err(-EINVAL, "group %u: n_layers %u out of range 1..%u (the model's "
			       "layers)", i, g->n_layers, G->n_layers);
	if (!g->layers)
		return kvt_err(-EINVAL, "group %u: layers is NULL", i);
	if (g->kind == KVT_GROUP_ALIAS && !g->alias_of)
		return kvt_err(-EINVAL, "group %u: an ALIAS group needs alias_of", i);
	for (j = 0; j < g->n_layers; j++) {
		uint32_t l = g->layers[j];

		if (l >= G->n_layers)
			return kvt_err(-EINVAL, "group %u: layer %u out of range (the model has %u "
				       "layers)", i, l, G->n_layers);
		if (owner[l] != KVT_NIL)
			return kvt_err(-EINVAL, "model layer %u is in group %u and in group %u", l,
				       owner[l], i);
		owner[l] = i;
	}
	if (g->kind == KVT_GROUP_ALIAS)
		return 0;
	if (g->tokens_per_block && g->tokens_per_block != G->tpb)
		return kvt_err(KVT_ENOTSUP, "group %u: tokens_per_block %u differs from the "
			       "layout's %u (per-group block sizes are not supported yet)", i,
			       g->tokens_per_block, G->tpb);
	if (!(g->share >= 0.0f && g->share <= 1.0f))
		return kvt_err(-EINVAL, "group %u: share %g out of range 0..1", i, (double)g->share);
	if (g->kind == KVT_GROUP_STATE)
		return grp_check_state(g, i);
	if (!kvt_dtype_size(g->dtype))
		return kvt_err(-EINVAL, "group %u: unknown element type %d", i, (int)g->dtype);
	if (g->kind == KVT_GROUP_LATENT) {
		if (g->latent_dim < 1 || g->latent_dim > GRP_MAX_DIM)
			return kvt_err(-EINVAL, "group %u: latent_dim %u out of range 1..%u", i,
				       g->latent_dim, GRP_MAX_DIM);
		return 0;
	}
	if (g->n_kv_heads < 1 || g->n_kv_heads > GRP_MAX_DIM)
		return kvt_err(-EINVAL, "group %u: n_kv_heads %u out of range 1..%u", i,
			       g->n_kv_heads, GRP_MAX_DIM);
	if (g->head_dim < 1 || g->head_dim > GRP_MAX_DIM)
		return kvt_err(-EINVAL, "group %u: head_dim %u out of range 1..%u", i, g->head_dim,
			       GRP_MAX_DIM);
	if (g->v_head_dim > GRP_MAX_DIM)
		return kvt_err(-EINVAL, "group %u: v_head_dim %u out of range 0..%u", i,
			       g->v_head_dim, GRP_MAX_DIM);
	if (g->kind == KVT_GROUP_WINDOW && g->window < 1)
		return kvt_err(-EINVAL, "group %u: a WINDOW group needs window >= 1 tokens", i);
	return 0;
}

/* Read and check the descriptors; fill G->g (with owned layer arrays), the layer map. */
static int
grp_read(struct kvt_grp *G, const struct kvt_engine_opts *o)
{
	const char *base = (const char *)o->groups;
	uint32_t *owner, i, j, total = 0, off = 0;
	size_t stride;
	int rc = 0;

	if (!o->groups || o->n_groups < 1 || o->n_groups > KVT_MAX_GROUPS)
		return kvt_err(-EINVAL, "%u layer groups (groups %s): must be 1..%u", o->n_groups,
			       o->groups ? "set" : "NULL", KVT_MAX_GROUPS);
	stride = o->groups[0].size;
	if (stride < offsetof(struct kvt_group, n_state) || stride > 65536)
		return kvt_err(-EINVAL, "kvt_group.size %zu: call kvt_group_init", stride);
	G->n = o->n_groups;
	G->n_layers = o->layout.n_layers;
	G->tpb = o->layout.tokens_per_block;
	if (G->n_layers < 1 || G->n_layers > GRP_MAX_DIM)
		return kvt_err(-EINVAL, "layout.n_layers %u out of range 1..%u", G->n_layers,
			       GRP_MAX_DIM);
	if (G->tpb < 1 || G->tpb > 65536)
		return kvt_err(-EINVAL, "tokens_per_block %u out of range 1..65536", G->tpb);
	for (i = 0; i < G->n; i++) {
		const struct kvt_group *src = (const struct kvt_group *)(const void *)(base +
									   i * stride);

		if (src->size != stride)
			return kvt_err(-EINVAL, "group %u: size %zu differs from group 0's %zu", i,
				       src->size, stride);
		kvt_group_init(&G->g[i], sizeof G->g[i]);
		memcpy(&G->g[i], src, stride < sizeof G->g[i] ? stride : sizeof G->g[i]);
		G->g[i].size = sizeof G->g[i];
		if (G->g[i].n_layers <= GRP_MAX_DIM && G->g[i].kind != KVT_GROUP_SIDECAR)
			total += G->g[i].n_layers * (G->g[i].kind == KVT_GROUP_ALIAS ? 2 : 1);
	}
	owner = kvt_malloc((size_t)G->n_layers * sizeof *owner);
	G->lay = kvt_malloc(((size_t)total + 1) * sizeof *G->lay);
	G->lgroup = kvt_malloc((size_t)G->n_layers * sizeof *G->lgroup);
	G->lindex = kvt_malloc((size_t)G->n_layers * sizeof *G->lindex);
	if (!owner || !G->lay || !G->lgroup || !G->lindex) {
		kvt_free(owner);
		return kvt_err(-ENOMEM, "layer group tables");
	}
	for (i = 0; i < G->n_layers; i++)
		owner[i] = KVT_NIL;
	for (i = 0; i < G->n && !rc; i++)
		rc = grp_check_one(G, i, owner);
	if (!rc)
		rc = grp_check_parents(G);
	for (i = 0; i < G->n_layers && !rc; i++)
		if (owner[i] == KVT_NIL)
			rc = kvt_err(-EINVAL, "model layer %u is in no group", i);
	/* ALIAS sources: a layer of a storage group, not an alias, not itself */
	for (i = 0; i < G->n && !rc; i++) {
		struct kvt_group *g = &G->g[i];

		G->src[i] = i;
		if (g->kind != KVT_GROUP_ALIAS)
			continue;
		G->src[i] = KVT_NIL - 1; /* none seen yet */
		for (j = 0; j < g->n_layers && !rc; j++) {
			uint32_t s = g->alias_of[j];

			if (s == g->layers[j])
				rc = kvt_err(-EINVAL, "group %u: layer %u is an alias of itself", i, s);
			else if (s >= G->n_layers)
				rc = kvt_err(-EINVAL, "group %u: layer %u is an alias of layer %u, "
					     "out of range (the model has %u layers)", i,
					     g->layers[j], s, G->n_layers);
			else if (G->g[owner[s]].kind == KVT_GROUP_ALIAS)
				rc = kvt_err(-EINVAL, "group %u: layer %u is an alias of layer %u, "
					     "itself an alias (group %u): name the stored layer",
					     i, g->layers[j], s, owner[s]);
			else if (G->g[owner[s]].kind == KVT_GROUP_STATE)
				rc = kvt_err(-EINVAL, "group %u: layer %u is an alias of layer %u, a "
					     "STATE layer (group %u): only K/V layers (FULL, WINDOW, "
					     "LATENT) can be shared", i, g->layers[j], s, owner[s]);
			else if (G->src[i] == KVT_NIL - 1)
				G->src[i] = owner[s];
			else if (G->src[i] != owner[s])
				G->src[i] = KVT_NIL;
		}
	}
	if (rc) {
		kvt_free(owner);
		return rc;
	}
	/* own copies of the layer arrays, and the layer map */
	for (i = 0; i < G->n; i++) {
		struct kvt_group *g = &G->g[i];

		if (g->kind == KVT_GROUP_SIDECAR)
			continue; /* below: its parent's */
		memcpy(G->lay + off, g->layers, g->n_layers * sizeof *G->lay);
		g->layers = G->lay + off;
		off += g->n_layers;
		if (g->kind == KVT_GROUP_ALIAS) {
			memcpy(G->lay + off, g->alias_of, g->n_layers * sizeof *G->lay);
			g->alias_of = G->lay + off;
			off += g->n_layers;
		} else {
			g->alias_of = NULL;
			for (j = 0; j < g->n_layers; j++) {
				G->lgroup[g->layers[j]] = i;
				G->lindex[g->layers[j]] = j;
			}
		}
	}
	for (i = 0; i < G->n; i++) {
		struct kvt_group *g = &G->g[i];

		if (g->kind == KVT_GROUP_SIDECAR) {
			/* no pool: its bytes are in the parent's blocks, its tables the parent's */
			g->n_layers = G->g[g->parent].n_layers;
			g->layers = G->g[g->parent].layers;
			g->alias_of = NULL;
			G->src[i] = g->parent;
			continue;
		}
		if (g->kind != KVT_GROUP_ALIAS)
			continue;
		for (j = 0; j < g->n_layers; j++) {
			G->lgroup[g->layers[j]] = G->lgroup[g->alias_of[j]];
			G->lindex[g->layers[j]] = G->lindex[g->alias_of[j]];
		}
	}
	kvt_free(owner);
	return 0;
}

/* The most blocks one sequence of WINDOW or STATE group @g holds in HBM at once in decode:
 * its sinks, its window's, and the block being written. */
static uint64_t
grp_bound_blocks(const struct kvt_grp *G, const struct kvt_group *g)
{
	uint64_t win = g->kind == KVT_GROUP_STATE ? GRP_STATE_WINDOW : g->window;
	uint64_t sink = g->kind == KVT_GROUP_STATE ? 0 : g->sink;

	return (sink + G->tpb - 1) / G->tpb + (win + G->tpb - 1) / G->tpb + 1;
}

/* The fraction of each tier storage group @i's pool gets (docs/ARCHITECTURE.md), of an HBM
 * tier of @hbm_bytes. */
static int
grp_shares(const struct kvt_grp *G, uint64_t ref_tokens, uint64_t hbm_bytes, double *share)
{
	double sum = 0.0;
	uint32_t i, n_set = 0, n_storage = 0;

	for (i = 0; i < G->n; i++) {
		if (!grp_storage(G->g[i].kind))
			continue;
		n_storage++;
		n_set += G->g[i].share > 0.0f;
		sum += G->g[i].share;
	}
	if (n_set && n_set != n_storage)
		return kvt_err(-EINVAL, "share is set in %u of the %u storage groups: set it in "
			       "all of them or in none", n_set, n_storage);
	if (n_set) {
		if (sum > 1.0 + 1e-6)
			return kvt_err(-EINVAL, "the groups' shares sum to %g, more than 1", sum);
		for (i = 0; i < G->n; i++)
			share[i] = grp_storage(G->g[i].kind) ? G->g[i].share : 0.0;
		return 0;
	}
	/* default: the bytes each group needs for ref_tokens tokens of context; a WINDOW group
	 * at most its window's blocks */
	sum = 0.0;
	for (i = 0; i < G->n; i++) {
		const struct kvt_group *g = &G->g[i];
		uint64_t blocks = (ref_tokens + G->tpb - 1) / G->tpb;

		share[i] = 0.0;
		if (!grp_storage(g->kind))
			continue;
		if (g->kind == KVT_GROUP_WINDOW || g->kind == KVT_GROUP_STATE) {
			uint64_t w = grp_bound_blocks(G, g);

			if (w < blocks)
				blocks = w;
		}
		share[i] = (double)grp_block_bytes(G, g) * (double)(blocks ? blocks : 1);
		sum += share[i];
	}
	for (i = 0; i < G->n; i++)
		share[i] /= sum;
	/* a WINDOW or STATE pool must hold one sequence's bound in HBM (a prepare needs it all
	 * at once), however small its part of ref_tokens' bytes: the floor is taken from the
	 * other pools in proportion to their shares (when the floors leave room for them) */
	if (hbm_bytes) {
		double fixed = 0.0, rest = 0.0, need[KVT_MAX_GROUPS];

		for (i = 0; i < G->n; i++) {
			const struct kvt_group *g = &G->g[i];

			need[i] = 0.0;
			if (g->kind == KVT_GROUP_WINDOW || g->kind == KVT_GROUP_STATE)
				need[i] = ((double)grp_bound_blocks(G, g) + 0.5) *
					  (double)grp_block_bytes(G, g) / (double)hbm_bytes;
			if (need[i] > share[i])
				fixed += need[i];
			else
				rest += share[i];
		}
		if (fixed > 0.0 && fixed < 1.0 && rest > 0.0)
			for (i = 0; i < G->n; i++)
				share[i] = need[i] > share[i] ? need[i] :
					   share[i] * (1.0 - fixed) / rest;
	}
	return 0;
}

/* What a failed create must take back in @dir: "<dir>/group<g>" for the storage groups after
 * the first (the first's store is in @dir itself), and whether it, and a store in it, existed
 * before (a store found there is never removed). */
struct grp_made {
	uint32_t n;                     /* groups */
	uint32_t first;                 /* the first storage group */
	bool storage[KVT_MAX_GROUPS];
	bool dir_new[KVT_MAX_GROUPS];   /* the group's subdirectory did not exist */
	bool store_new[KVT_MAX_GROUPS]; /* nor its kvtier.store */
};

static void
grp_made_path(const char *dir, uint32_t g, bool first, const char *file, char *out, size_t len)
{
	if (first)
		snprintf(out, len, "%s%s%s", dir, file ? "/" : "", file ? file : "");
	else
		snprintf(out, len, "%s/group%u%s%s", dir, g, file ? "/" : "", file ? file : "");
}

/* Note, before the pools are created, what exists in @dir. */
static void
grp_made_before(const struct kvt_grp *G, const char *dir, struct grp_made *m)
{
	char p[4096];
	uint32_t i;

	memset(m, 0, sizeof *m);
	m->n = G->n;
	m->first = KVT_NIL;
	for (i = 0; i < G->n; i++) {
		bool first;

		if (!grp_storage(G->g[i].kind))
			continue;
		first = m->first == KVT_NIL;
		if (first)
			m->first = i;
		m->storage[i] = true;
		grp_made_path(dir, i, first, NULL, p, sizeof p);
		m->dir_new[i] = !first && access(p, F_OK) != 0;
		grp_made_path(dir, i, first, "kvtier.store", p, sizeof p);
		m->store_new[i] = access(p, F_OK) != 0;
	}
}

/* A failed create: remove the stores and directories it made (the pools are destroyed). */
static void
grp_made_undo(const char *dir, const struct grp_made *m)
{
	char p[4096];
	uint32_t i;

	for (i = 0; i < m->n; i++) {
		if (!m->storage[i])
			continue;
		if (m->store_new[i]) {
			grp_made_path(dir, i, i == m->first, "kvtier.store", p, sizeof p);
			(void)unlink(p);
			grp_made_path(dir, i, i == m->first, "kvtier.journal", p, sizeof p);
			(void)unlink(p);
		}
		if (m->dir_new[i]) {
			grp_made_path(dir, i, false, NULL, p, sizeof p);
			(void)rmdir(p);
		}
	}
}

/* "<dir>/group<g>", created (0700) when absent; the caller frees it. */
static int
grp_subdir(const char *dir, uint32_t g, char **out)
{
	size_t len = strlen(dir) + 32;
	char *p = kvt_malloc(len);

	*out = NULL;
	if (!p)
		return kvt_err(-ENOMEM, "nvme_dir of group %u", g);
	snprintf(p, len, "%s/group%u", dir, g);
	if (mkdir(p, 0700) != 0 && errno != EEXIST) {
		int e = errno;

		kvt_free(p);
		return kvt_err(-e, "group %u: creating its NVMe directory %s/group%u: %s", g, dir, g,
			       strerror(e));
	}
	*out = p;
	return 0;
}

static void grp_free(struct kvt_engine *e);

/* The fingerprint of the layer groups (docs/FORMAT.md, superblock): XXH3-64 of every field
 * that shapes what a group's store holds or how its bytes are read; never 0 (0 = no groups). */
static uint64_t
grp_fingerprint(const struct kvt_grp *G)
{
	XXH3_state_t *st = XXH3_createState();
	uint64_t h = 0;
	uint32_t i, w[12];

	if (!st)
		return 1;
	XXH3_64bits_reset(st);
	w[0] = G->n;
	w[1] = G->n_layers;
	w[2] = G->tpb;
	XXH3_64bits_update(st, w, 3 * sizeof *w);
	for (i = 0; i < G->n; i++) {
		const struct kvt_group *g = &G->g[i];

		memset(w, 0, sizeof w);
		w[0] = (uint32_t)g->kind;
		w[1] = g->n_layers;
		w[2] = (uint32_t)g->dtype;
		w[3] = g->n_kv_heads;
		w[4] = g->head_dim;
		w[5] = g->v_head_dim ? g->v_head_dim : g->head_dim;
		w[6] = g->latent_dim;
		w[7] = g->kind == KVT_GROUP_WINDOW ? g->window : 0;
		w[8] = g->kind == KVT_GROUP_WINDOW ? g->sink : 0;
		if (g->kind == KVT_GROUP_SIDECAR) {
			w[2] = g->parent;
			w[3] = (uint32_t)g->sidecar_token_bytes;
			w[4] = (uint32_t)g->sidecar_block_bytes;
			w[5] = g->sidecar_summary;
			w[6] = 0;
		} else if (g->kind == KVT_GROUP_ALIAS || g->kind == KVT_GROUP_STATE)
			w[2] = w[3] = w[4] = w[5] = w[6] = 0;
		else if (g->kind == KVT_GROUP_LATENT)
			w[3] = w[4] = w[5] = 0;
		else
			w[6] = 0;
		XXH3_64bits_update(st, w, 9 * sizeof *w);
		if (g->kind == KVT_GROUP_STATE) {
			uint32_t j, t[6];

			for (j = 0; j < g->n_state; j++) {
				t[0] = g->state[j].n_dims;
				memcpy(t + 1, g->state[j].shape, sizeof g->state[j].shape);
				t[5] = (uint32_t)g->state[j].dtype;
				XXH3_64bits_update(st, t, sizeof t);
			}
		}
		XXH3_64bits_update(st, g->layers, g->n_layers * sizeof *g->layers);
		if (g->alias_of)
			XXH3_64bits_update(st, g->alias_of, g->n_layers * sizeof *g->alias_of);
	}
	h = XXH3_64bits_digest(st);
	XXH3_freeState(st);
	return h ? h : 1;
}

int
kvt_grp_create(const struct kvt_engine_opts *o, struct kvt_engine **out)
{
	struct kvt_engine_opts co;
	double share[KVT_MAX_GROUPS];
	struct grp_made made = { 0 };
	struct kvt_engine *e;
	struct kvt_grp *G;
	uint64_t ref, fp;
	uint32_t i;
	int rc;

	*out = NULL;
	kvt_engine_opts_init(&co, sizeof co);
	memcpy(&co, o, o->opts_size < sizeof co ? o->opts_size : sizeof co);
	co.opts_size = sizeof co;
	if (co.remote_host)
		return kvt_err(KVT_ENOTSUP, "remote_host with layer groups: the REMOTE tier is not "
			       "per group yet");
	e = kvt_calloc(1, sizeof *e);
	G = kvt_calloc(1, sizeof *G);
	if (!e || !G) {
		kvt_free(e);
		kvt_free(G);
		return kvt_err(-ENOMEM, "grouped engine");
	}
	e->grp = G;
	pthread_mutex_init(&e->lock, NULL);
	pthread_cond_init(&e->xfer_cv, NULL);
	pthread_mutex_init(&G->lock, NULL);
	e->opts = co;
	e->opts.nvme_dir = NULL;
	e->opts.groups = NULL;
	e->layout = co.layout;
	rc = grp_read(G, &co);
	ref = co.group_ref_tokens ? co.group_ref_tokens : 32768;
	if (!rc)
		rc = grp_shares(G, ref, co.hbm_bytes, share);
	if (!rc && co.nvme_dir)
		grp_made_before(G, co.nvme_dir, &made);
	fp = rc ? 0 : grp_fingerprint(G);
	G->first = KVT_NIL;
	for (i = 0; i < G->n && !rc; i++) {
		const struct kvt_group *g = &G->g[i];
		struct kvt_engine_opts go = co;
		char *dir = NULL;
		uint32_t v, v_sc;

		if (!grp_storage(g->kind))
			continue;
		grp_core_layout(G, g, &go.layout, &v);
		go.groups = NULL;
		go.n_groups = 0;
		go.hbm_bytes = (uint64_t)((double)co.hbm_bytes * share[i]);
		go.host_bytes = (uint64_t)((double)co.host_bytes * share[i]);
		go.nvme_bytes = (uint64_t)((double)co.nvme_bytes * share[i]);
		if (co.nvme_dir && G->first != KVT_NIL) {
			rc = grp_subdir(co.nvme_dir, i, &dir);
			if (rc)
				break;
			go.nvme_dir = dir;
		}
		if (co.host_bytes && !go.host_bytes)
			go.host_bytes = 1; /* refused below with the group's block size */
		v_sc = grp_sidecar_of(G, i);
		rc = kvt_engine_create_core(&go, v, g->kind == KVT_GROUP_STATE ?
						  grp_state_off(g, g->n_state, NULL) : 0,
					    v_sc == KVT_NIL ? 0 : grp_sc_bytes(G, &G->g[v_sc]),
					    G->first == KVT_NIL ? NULL : G->core[G->first]->dev,
					    fp, i, &G->core[i]);
		kvt_free(dir);
		if (!rc && v_sc != KVT_NIL && G->g[v_sc].sidecar_summary)
			kvt_sc_summarize(G->core[i]); /* before its first block */
		if (!rc && g->kind == KVT_GROUP_STATE)
			G->core[i]->ckpt_every = g->checkpoint_every; /* engine/window.c */
		if (!rc && g->kind == KVT_GROUP_STATE &&
		    G->core[i]->slots[KVT_TIER_HBM].n_slots < GRP_STATE_WINDOW)
			rc = kvt_err(-EINVAL, "HBM holds %u state slot(s): a decoding sequence needs "
				     "2 at once (the state it reads and the one it writes): give the "
				     "group more of HBM", G->core[i]->slots[KVT_TIER_HBM].n_slots);
		if (rc) {
			rc = kvt_err(rc, "group %u (%s, %.1f%% of each tier): %s", i,
				     grp_kind_name(g->kind), 100.0 * share[i],
				     kvt_last_error_message());
			break;
		}
		if (g->kind == KVT_GROUP_WINDOW || g->kind == KVT_GROUP_STATE) {
			rc = g->kind == KVT_GROUP_STATE ?
				     kvt_engine_set_window(G->core[i], GRP_STATE_WINDOW, 0) :
				     kvt_engine_set_window(G->core[i], g->window, g->sink);
			if (rc) {
				rc = kvt_err(rc, "group %u (WINDOW %u, sink %u): %s", i, g->window,
					     g->sink, kvt_last_error_message());
				break;
			}
		}
		if (G->first == KVT_NIL)
			G->first = i;
	}
	if (!rc && G->first == KVT_NIL)
		rc = kvt_err(-EINVAL, "no group stores anything (every group is an ALIAS)");
	if (rc) {
		char keep[512];

		snprintf(keep, sizeof keep, "%s", kvt_last_error_message());
		grp_free(e);
		if (made.n)
			grp_made_undo(co.nvme_dir, &made); /* nothing half-made left */
		return kvt_err(rc, "%s", keep);
	}
	e->dev = G->core[G->first]->dev; /* the streams of kvt_engine_stream_create */
	e->dev_borrowed = true;
	*out = e;
	return 0;
}

static void
grp_free(struct kvt_engine *e)
{
	struct kvt_grp *G = e->grp;
	uint32_t i;

	while (G->batches) {
		struct kvt_batch *b = G->batches;

		G->batches = b->next;
		kvt_free(b); /* the core batches go with their engines */
	}
	/* the pool owning the device last */
	for (i = G->n; i-- > 0;)
		if (G->core[i] && i != G->first)
			kvt_engine_destroy(G->core[i]);
	if (G->first != KVT_NIL && G->core[G->first])
		kvt_engine_destroy(G->core[G->first]);
	kvt_free(G->seqs);
	kvt_free(G->lay);
	kvt_free(G->lgroup);
	kvt_free(G->lindex);
	pthread_mutex_destroy(&G->lock);
	kvt_free(G);
	pthread_cond_destroy(&e->xfer_cv);
	pthread_mutex_destroy(&e->lock);
	kvt_free(e);
}

void
kvt_grp_destroy(struct kvt_engine *e)
{
	grp_free(e);
}

/* ---- queries ------------------------------------------------------------------------------ */

int
kvt_engine_n_groups(const struct kvt_engine *e)
{
	if (!e)
		return kvt_err(-EINVAL, "kvt_engine_n_groups: engine is NULL");
	return e->grp ? (int)e->grp->n : 1;
}

/* Geometry of core engine @c as group @kind. */
static void
grp_core_geometry(const struct kvt_engine *c, struct kvt_group_geometry *g)
{
	size_t es = kvt_dtype_size(c->layout.dtype);

	g->n_layers = c->layout.n_layers;
	g->hbm_base = c->hbm_base;
	g->block_bytes = c->block_bytes;
	g->layer_block_bytes = c->layer_block_bytes;
	g->k_token_bytes = c->token_bytes;
	g->v_token_bytes = c->v_token_bytes;
	g->v_offset = c->v_token_bytes ? (uint64_t)c->layout.tokens_per_block * c->token_bytes : 0;
	g->tokens_per_block = c->layout.tokens_per_block;
	g->n_kv_heads = c->layout.n_kv_heads;
	g->head_dim = c->layout.head_dim;
	g->v_head_dim = (uint32_t)(c->v_token_bytes / es / c->layout.n_kv_heads);
	g->dtype = c->layout.dtype;
	g->hbm_slots = c->slots[KVT_TIER_HBM].n_slots;
	g->host_slots = c->slots[KVT_TIER_HOST].n_slots;
	g->nvme_slots = c->slots[KVT_TIER_NVME].n_slots;
}

int
kvt_group_geometry(const struct kvt_engine *e, uint32_t group, struct kvt_group_geometry *out)
{
	const struct kvt_group *g;

	if (!e || !out)
		return kvt_err(-EINVAL, "kvt_group_geometry: engine and out must not be NULL");
	memset(out, 0, sizeof *out);
	if (!e->grp) {
		if (group != 0)
			return kvt_err(-EINVAL, "group %u out of range (the engine has 1 group)",
				       group);
		out->kind = KVT_GROUP_FULL;
		grp_core_geometry(e, out);
		return 0;
	}
	if (group >= e->grp->n)
		return kvt_err(-EINVAL, "group %u out of range (the engine has %u groups)", group,
			       e->grp->n);
	g = &e->grp->g[group];
	out->kind = g->kind;
	if (g->kind == KVT_GROUP_SIDECAR) {
		/* the parent's pool: slots, block and layer bytes (kvt_group_sidecar: where) */
		grp_core_geometry(e->grp->core[g->parent], out);
		out->kind = KVT_GROUP_SIDECAR;
		out->k_token_bytes = out->v_token_bytes = out->v_offset = 0;
		out->n_kv_heads = out->head_dim = out->v_head_dim = 0;
		return 0;
	}
	if (!e->grp->core[group]) {
		out->n_layers = g->n_layers;
		out->tokens_per_block = e->grp->tpb;
		return 0;
	}
	grp_core_geometry(e->grp->core[group], out);
	if (g->kind == KVT_GROUP_WINDOW) {
		out->window = g->window;
		out->sink = g->sink;
	} else if (g->kind == KVT_GROUP_STATE) {
		out->n_kv_heads = 0;
		out->head_dim = 0;
		out->v_head_dim = 0;
	}
	return 0;
}

int
kvt_group_state_tensor(const struct kvt_engine *e, uint32_t group, uint32_t tensor,
		       uint64_t *offset, uint64_t *bytes)
{
	const struct kvt_group *g;

	if (!e || !e->grp || group >= e->grp->n)
		return kvt_err(-EINVAL, "kvt_group_state_tensor: group %u is not a group of this "
			       "engine", group);
	g = &e->grp->g[group];
	if (g->kind != KVT_GROUP_STATE)
		return kvt_err(-EINVAL, "kvt_group_state_tensor: group %u is a %s group, not STATE",
			       group, grp_kind_name(g->kind));
	if (tensor >= g->n_state)
		return kvt_err(-EINVAL, "kvt_group_state_tensor: tensor %u out of range (group %u "
			       "has %u)", tensor, group, g->n_state);
	if (offset)
		*offset = grp_state_off(g, tensor, bytes);
	else if (bytes)
		(void)grp_state_off(g, tensor, bytes);
	return 0;
}

int
kvt_group_sidecar(const struct kvt_engine *e, uint32_t group, uint64_t *offset,
		  uint64_t *token_bytes, uint64_t *block_bytes)
{
	const struct kvt_group *g;

	if (!e || !e->grp || group >= e->grp->n)
		return kvt_err(-EINVAL, "kvt_group_sidecar: group %u is not a group of this engine",
			       group);
	g = &e->grp->g[group];
	if (g->kind != KVT_GROUP_SIDECAR)
		return kvt_err(-EINVAL, "kvt_group_sidecar: group %u is a %s group, not SIDECAR",
			       group, grp_kind_name(g->kind));
	if (offset)
		*offset = e->grp->core[g->parent]->sc_off;
	if (token_bytes)
		*token_bytes = g->sidecar_token_bytes;
	if (block_bytes)
		*block_bytes = g->sidecar_summary ? e->grp->core[g->parent]->sc_rec :
						    g->sidecar_block_bytes;
	return 0;
}

int
kvt_layer_group(const struct kvt_engine *e, uint32_t layer, uint32_t *group,
		uint32_t *layer_in_group)
{
	uint32_t n;

	if (!e)
		return kvt_err(-EINVAL, "kvt_layer_group: engine is NULL");
	n = e->grp ? e->grp->n_layers : e->layout.n_layers;
	if (layer >= n)
		return kvt_err(-EINVAL, "layer %u out of range (the model has %u layers)", layer, n);
	if (group)
		*group = e->grp ? e->grp->lgroup[layer] : 0;
	if (layer_in_group)
		*layer_in_group = e->grp ? e->grp->lindex[layer] : layer;
	return 0;
}

/* ---- sequences ---------------------------------------------------------------------------- */

/* The entry of public id @id, or NULL (G->lock held). */
static struct kvt_grp_seq *
grp_seq_find(struct kvt_grp *G, kvt_seq_id id)
{
	uint32_t idx = (uint32_t)id;

	if (!id || idx >= G->cap_seqs || !G->seqs[idx].open || G->seqs[idx].id[G->first] != id)
		return NULL;
	return &G->seqs[idx];
}

/* What grp_seq_enter does with a sequence busy in another thread's fanned-out call. */
enum grp_enter {
	GRP_LOOK,  /* read its ids all the same (info, tokens, hints: no change made) */
	GRP_CHECK, /* KVT_EBUSY (prepare: the pools' in_batch marks guard it afterwards) */
	GRP_TAKE,  /* KVT_EBUSY; else mark it busy until grp_seq_leave (calls that change it) */
};

/* The core ids of public sequence @id into @ids, as @mode says. */
static int
grp_seq_enter(struct kvt_grp *G, kvt_seq_id id, kvt_seq_id *ids, enum grp_enter mode)
{
	struct kvt_grp_seq *q;
	int rc = 0;

	pthread_mutex_lock(&G->lock);
	q = grp_seq_find(G, id);
	if (!q)
		rc = kvt_err(KVT_ECLOSED, "sequence %#llx is not open", (unsigned long long)id);
	else if (q->busy && mode != GRP_LOOK)
		rc = kvt_err(KVT_EBUSY, "sequence %#llx is busy in another thread's call",
			     (unsigned long long)id);
	else {
		memcpy(ids, q->id, sizeof q->id);
		if (mode == GRP_TAKE)
			q->busy = 1;
	}
	pthread_mutex_unlock(&G->lock);
	return rc;
}

static void
grp_seq_leave(struct kvt_grp *G, kvt_seq_id id)
{
	struct kvt_grp_seq *q;

	pthread_mutex_lock(&G->lock);
	q = grp_seq_find(G, id);
	if (q)
		q->busy = 0;
	pthread_mutex_unlock(&G->lock);
}

#define GRP_FOR_STORAGE(G, i) for (i = 0; i < (G)->n; i++) if ((G)->core[i])

static int grp_seq_register(struct kvt_grp *G, const kvt_seq_id *ids, kvt_seq_id *out);

/* After the pools' sequences @ids were opened (or restored) with result @rc: enter the public
 * sequence, or, on any failure, let the pools' sequences go with @undo (close, or detach to keep
 * a store's records), keeping the failure's message. */
static int
grp_seq_finish(struct kvt_grp *G, int rc, const kvt_seq_id *ids, kvt_seq_id *out,
	       int (*undo)(struct kvt_engine *, kvt_seq_id))
{
	char keep[512];
	uint32_t i;

	if (!rc)
		rc = grp_seq_register(G, ids, out);
	if (!rc)
		return 0;
	snprintf(keep, sizeof keep, "%s", kvt_last_error_message());
	GRP_FOR_STORAGE(G, i)
		if (ids[i])
			(void)undo(G->core[i], ids[i]);
	return kvt_err(rc, "%s", keep);
}

int
kvt_grp_seq_open(struct kvt_engine *e, const struct kvt_seq_opts *o, kvt_seq_id *out)
{
	struct kvt_grp *G = e->grp;
	kvt_seq_id ids[KVT_MAX_GROUPS] = { 0 };
	uint32_t i;
	int rc = 0;

	if (!out)
		return kvt_err(-EINVAL, "kvt_seq_open: out is NULL");
	*out = 0;
	GRP_FOR_STORAGE(G, i) {
		rc = kvt_seq_open(G->core[i], o, &ids[i]);
		if (rc) {
			rc = grp_err(rc, i);
			break;
		}
	}
	return grp_seq_finish(G, rc, ids, out, kvt_seq_close);
}

/* Enter the public sequence whose pools' sequences are @ids; *out = its id. */
static int
grp_seq_register(struct kvt_grp *G, const kvt_seq_id *ids, kvt_seq_id *out)
{
	uint32_t idx = (uint32_t)ids[G->first];
	int rc = 0;

	pthread_mutex_lock(&G->lock);
	if (idx >= G->cap_seqs) {
		uint32_t cap = G->cap_seqs ? G->cap_seqs : 16;
		struct kvt_grp_seq *n;

		while (cap <= idx)
			cap *= 2;
		n = kvt_realloc(G->seqs, (size_t)cap * sizeof *n);
		if (!n)
			rc = kvt_err(-ENOMEM, "sequence table of %u entries", cap);
		else {
			memset(n + G->cap_seqs, 0, (size_t)(cap - G->cap_seqs) * sizeof *n);
			G->seqs = n;
			G->cap_seqs = cap;
		}
	}
	if (!rc) {
		memcpy(G->seqs[idx].id, ids, sizeof G->seqs[idx].id);
		G->seqs[idx].open = 1;
		G->seqs[idx].busy = 0;
		G->n_open++;
		*out = ids[G->first];
	}
	pthread_mutex_unlock(&G->lock);
	return rc;
}

int
kvt_grp_seq_close(struct kvt_engine *e, kvt_seq_id id, bool keep)
{
	struct kvt_grp *G = e->grp;
	kvt_seq_id ids[KVT_MAX_GROUPS];
	struct kvt_grp_seq *q;
	uint32_t i;
	int rc;

	rc = grp_seq_enter(G, id, ids, GRP_TAKE);
	if (rc)
		return rc;
	/* the first pool decides (KVT_EBUSY: a batch pins it); the others follow */
	rc = keep ? kvt_seq_detach(G->core[G->first], ids[G->first]) :
		    kvt_seq_close(G->core[G->first], ids[G->first]);
	if (rc) {
		rc = grp_err(rc, G->first);
		grp_seq_leave(G, id);
		return rc;
	}
	GRP_FOR_STORAGE(G, i) {
		int r;

		if (i == G->first)
			continue;
		r = keep ? kvt_seq_detach(G->core[i], ids[i]) : kvt_seq_close(G->core[i], ids[i]);
		if (r && !rc)
			rc = grp_err(r, i);
	}
	pthread_mutex_lock(&G->lock);
	q = &G->seqs[(uint32_t)id];
	q->open = 0;
	q->busy = 0;
	G->n_open--;
	pthread_mutex_unlock(&G->lock);
	return rc;
}

/*
 * Take back the last append of core sequence @id of pool @c: it held @old tokens before.
 * The blocks that append created go (they are the last write pins: an append adds its new
 * blocks to the write pins last); the partially filled block it extended keeps its pin until
 * the next release (as a failed append leaves it) and loses a key the append gave it.
 */
static void
grp_unappend(struct kvt_engine *c, kvt_seq_id id, uint64_t old)
{
	uint32_t tpb = c->layout.tokens_per_block, keep, idx;
	struct kvt_seqrec *s;

	kvt_lock(c);
	s = kvt_seq_lookup(c, id, &idx);
	if (s && s->n_tokens > old) {
		keep = (uint32_t)((old + tpb - 1) / tpb);
		while (s->n_blocks > keep) {
			uint32_t b = s->blocks[--s->n_blocks];

			if (s->n_wpins && s->wpins[s->n_wpins - 1] == b)
				s->n_wpins--;
			kvt_block_unpin(c, b);
			kvt_block_kill(c, b);
		}
		if (old % tpb && s->n_blocks) {
			struct kvt_block *b = kvt_blk(c, s->blocks[s->n_blocks - 1]);

			if (!b->indexed)
				b->hashed = 0; /* partial again: no key */
		}
		s->n_tokens = old;
	}
	kvt_unlock(c);
}

/* Tokens core sequence @id holds (0 when closed). */
static uint64_t
grp_core_tokens(struct kvt_engine *c, kvt_seq_id id)
{
	struct kvt_seq_info in;

	return kvt_seq_info(c, id, &in) ? 0 : in.n_tokens;
}

/*
 * Bring every pool's sequence of @ids to one length, the longest they can all serve: after a
 * KVT_ELOST truncated one pool, or a restore whose pools' stores held different versions (a
 * park that failed in one pool, a crash between two pools' publishes). A FULL or LATENT pool
 * can stop at any token (its K/V are per token); a windowed pool only where its next query's
 * window is still held (else kvt_seq_truncate takes it back to its sinks); a STATE pool only
 * at a block boundary whose block it still holds (a partial block holds the state after its
 * last token, not after an earlier one). So the target only shrinks: repeat until they agree.
 */
static void
grp_equalize(struct kvt_grp *G, const kvt_seq_id *ids)
{
	uint64_t min, n, max;
	uint32_t i, idx;

	for (;;) {
		min = UINT64_MAX;
		max = 0;
		GRP_FOR_STORAGE(G, i) {
			n = grp_core_tokens(G->core[i], ids[i]);
			min = n < min ? n : min;
			max = n > max ? n : max;
		}
		if (min == max || min == UINT64_MAX)
			return;
		GRP_FOR_STORAGE(G, i) {
			struct kvt_engine *c = G->core[i];
			struct kvt_seqrec *s;

			kvt_lock(c);
			s = kvt_seq_lookup(c, ids[i], &idx);
			if (s && s->n_tokens > min) {
				bool state = G->g[i].kind == KVT_GROUP_STATE;
				uint32_t keep = (uint32_t)(state ? min / G->tpb :
							   (min + G->tpb - 1) / G->tpb);

				/* a block shared by prefix cannot become partial (an append would
				 * write into it): drop it too */
				if (!state && min % G->tpb && keep <= s->n_blocks &&
				    s->blocks[keep - 1] != KVT_NIL &&
				    kvt_blk(c, s->blocks[keep - 1])->indexed)
					keep--;
				kvt_seq_truncate(c, s, keep);
				if (!state && s->n_tokens > min) {
					/* a partial last block again: no key, as an undone append */
					struct kvt_block *b = kvt_blk(c, s->blocks[s->n_blocks - 1]);

					if (!b->indexed)
						b->hashed = 0;
					s->n_tokens = min;
				}
			}
			kvt_unlock(c);
		}
	}
}

int
kvt_seq_append_groups(struct kvt_engine *e, kvt_seq_id id, const int32_t *tokens, size_t n,
		      int64_t *slot_mapping)
{
	kvt_seq_id ids[KVT_MAX_GROUPS];
	uint64_t old[KVT_MAX_GROUPS];
	struct kvt_grp *G;
	uint32_t i, j;
	int rc = 0;

	if (!e || !slot_mapping)
		return kvt_err(-EINVAL, "kvt_seq_append_groups: engine and slot_mapping must not be "
			       "NULL");
	if (!e->grp)
		return kvt_seq_append(e, id, tokens, n, slot_mapping);
	G = e->grp;
	if (n == 0 || n > (1u << 20))
		return kvt_err(-EINVAL, "kvt_seq_append_groups: n = %zu tokens, must be 1..%u", n,
			       1u << 20);
	rc = grp_seq_enter(G, id, ids, GRP_TAKE);
	if (rc)
		return rc;
	for (i = 0; i < G->n; i++) {
		if (!G->core[i]) {
			/* ALIAS: -1; SIDECAR: its parent's row, filled below */
			for (j = 0; j < n; j++)
				slot_mapping[(size_t)i * n + j] = -1;
			continue;
		}
		old[i] = grp_core_tokens(G->core[i], ids[i]);
		rc = kvt_seq_append(G->core[i], ids[i], tokens, n, slot_mapping + (size_t)i * n);
		if (rc)
			break;
	}
	if (rc) {
		uint32_t failed = i;

		rc = grp_err(rc, failed);
		if (rc == KVT_ELOST)
			grp_equalize(G, ids);
		else
			for (i = 0; i < failed; i++)
				if (G->core[i])
					grp_unappend(G->core[i], ids[i], old[i]);
	} else {
		for (i = 0; i < G->n; i++)
			if (G->g[i].kind == KVT_GROUP_SIDECAR)
				memcpy(slot_mapping + (size_t)i * n,
				       slot_mapping + (size_t)G->g[i].parent * n, n * sizeof *slot_mapping);
	}
	grp_seq_leave(G, id);
	return rc;
}

int
kvt_grp_seq_park(struct kvt_engine *e, kvt_seq_id id, enum kvt_tier target, bool resume)
{
	struct kvt_grp *G = e->grp;
	kvt_seq_id ids[KVT_MAX_GROUPS];
	uint32_t i;
	int rc, first = 0;

	rc = grp_seq_enter(G, id, ids, GRP_TAKE);
	if (rc)
		return rc;
	GRP_FOR_STORAGE(G, i) {
		rc = resume ? kvt_seq_resume(G->core[i], ids[i])
			    : kvt_seq_park(G->core[i], ids[i], target);
		if (rc && !first)
			first = grp_err(rc, i);
		if (rc == KVT_ECLOSED || rc == KVT_EBUSY || rc == -EINVAL)
			break; /* the same answer in every pool: nothing moved */
	}
	grp_seq_leave(G, id);
	return first;
}

int
kvt_grp_seq_info(struct kvt_engine *e, kvt_seq_id id, struct kvt_seq_info *out)
{
	struct kvt_grp *G = e->grp;
	kvt_seq_id ids[KVT_MAX_GROUPS];
	struct kvt_seq_info in;
	uint32_t i;
	int rc, t;

	if (!out)
		return kvt_err(-EINVAL, "kvt_seq_info: out is NULL");
	rc = grp_seq_enter(G, id, ids, GRP_LOOK);
	if (rc)
		return rc;
	rc = kvt_seq_info(G->core[G->first], ids[G->first], out);
	if (rc)
		return grp_err(rc, G->first);
	GRP_FOR_STORAGE(G, i) {
		if (i == G->first)
			continue;
		if (kvt_seq_info(G->core[i], ids[i], &in) != 0)
			return grp_err(KVT_ECLOSED, i);
		out->n_blocks += in.n_blocks;
		for (t = 0; t < KVT_TIER_COUNT; t++)
			out->blocks_in[t] += in.blocks_in[t];
		out->parked = out->parked && in.parked;
	}
	return 0;
}

int
kvt_grp_seq_tokens(struct kvt_engine *e, kvt_seq_id id, uint64_t first, int32_t *out, size_t n)
{
	struct kvt_grp *G = e->grp;
	kvt_seq_id ids[KVT_MAX_GROUPS];
	int rc = grp_seq_enter(G, id, ids, GRP_LOOK);

	return rc ? rc : kvt_seq_tokens(G->core[G->first], ids[G->first], first, out, n);
}

int
kvt_grp_seq_set_priority(struct kvt_engine *e, kvt_seq_id id, uint64_t first_token,
			 uint64_t n_tokens, uint8_t priority, uint32_t duration_ms)
{
	struct kvt_grp *G = e->grp;
	kvt_seq_id ids[KVT_MAX_GROUPS];
	uint32_t i;
	int rc;

	rc = grp_seq_enter(G, id, ids, GRP_TAKE);
	if (rc)
		return rc;
	GRP_FOR_STORAGE(G, i) {
		rc = kvt_seq_set_priority(G->core[i], ids[i], first_token, n_tokens, priority,
					  duration_ms);
		if (rc) {
			rc = grp_err(rc, i); /* checked alike in every pool: the first refuses */
			break;
		}
	}
	grp_seq_leave(G, id);
	return rc;
}

/*
 * Every pool's longest hit must end at the same boundary, and a WINDOW or STATE pool serves a
 * boundary only where the blocks its window reads there (a STATE pool: the checkpoint) are
 * kept, not at every boundary below its longest: the shortest pool's boundary may be one
 * another pool cannot serve. So each pool is asked for its longest hit within the shortest so
 * far until all of them give the same (it only shrinks: a few rounds at most).
 */
int
kvt_grp_seq_match_prefix(struct kvt_engine *e, const struct kvt_seq_opts *o, const int32_t *tokens,
			 size_t n, uint64_t *matched_tokens, enum kvt_tier *tier)
{
	struct kvt_grp *G = e->grp;
	uint64_t cap = n, min, m;
	enum kvt_tier slow, t;
	bool agree;
	uint32_t i;
	int rc;

	if (!matched_tokens)
		return kvt_err(-EINVAL, "kvt_seq_match_prefix: matched_tokens is NULL");
	do {
		min = cap;
		agree = true;
		slow = KVT_TIER_HBM;
		GRP_FOR_STORAGE(G, i) {
			rc = kvt_seq_match_prefix(G->core[i], o, tokens, (size_t)cap, &m, &t);
			if (rc)
				return grp_err(rc, i);
			if (i != G->first && m != min)
				agree = false;
			if (i == G->first || m < min)
				min = m;
			if (m && t != KVT_TIER_COUNT && t > slow)
				slow = t;
		}
		cap = min;
	} while (!agree && cap);
	*matched_tokens = cap;
	if (tier)
		*tier = cap ? slow : KVT_TIER_COUNT;
	return 0;
}

/* Empty core sequence @id of pool @c again (an attach taken back). */
static void
grp_core_empty(struct kvt_engine *c, kvt_seq_id id)
{
	struct kvt_seqrec *s;
	uint32_t idx;

	kvt_lock(c);
	s = kvt_seq_lookup(c, id, &idx);
	if (s)
		kvt_seq_truncate(c, s, 0);
	kvt_unlock(c);
}

int
kvt_grp_seq_attach_prefix(struct kvt_engine *e, kvt_seq_id id, const int32_t *tokens, size_t n,
			  uint64_t *attached_tokens)
{
	struct kvt_grp *G = e->grp;
	kvt_seq_id ids[KVT_MAX_GROUPS];
	uint64_t cap = n, min, m = 0;
	bool agree;
	uint32_t i;
	int rc;

	if (!attached_tokens)
		return kvt_err(-EINVAL, "kvt_seq_attach_prefix: attached_tokens is NULL");
	*attached_tokens = 0;
	rc = grp_seq_enter(G, id, ids, GRP_TAKE);
	if (rc)
		return rc;
	/* as match_prefix: every pool attaches the same boundary, or they all start again
	 * empty from the shortest (a pool truncated to a boundary whose window blocks it
	 * dropped would hold fewer tokens than the others, or a STATE pool no checkpoint) */
	do {
		min = cap;
		agree = true;
		GRP_FOR_STORAGE(G, i) {
			rc = kvt_seq_attach_prefix(G->core[i], ids[i], tokens, (size_t)cap, &m);
			if (rc) {
				rc = grp_err(rc, i);
				break;
			}
			if (i != G->first && m != min)
				agree = false;
			if (i == G->first || m < min)
				min = m;
		}
		if (rc || !agree)
			GRP_FOR_STORAGE(G, i)
				grp_core_empty(G->core[i], ids[i]);
		cap = min;
	} while (!rc && !agree && cap);
	if (!rc && agree)
		*attached_tokens = cap;
	grp_seq_leave(G, id);
	return rc;
}

int
kvt_seq_sidecar_read(struct kvt_engine *e, kvt_seq_id id, uint32_t group,
		     uint32_t layer_in_group, uint32_t first_block, uint32_t n_blocks, void *dst)
{
	kvt_seq_id ids[KVT_MAX_GROUPS];
	struct kvt_grp *G;
	uint32_t p;
	int rc;

	if (!e || !dst)
		return kvt_err(-EINVAL, "kvt_seq_sidecar_read: engine and dst must not be NULL");
	G = e->grp;
	if (!G || group >= G->n || G->g[group].kind != KVT_GROUP_SIDECAR)
		return kvt_err(-EINVAL, "kvt_seq_sidecar_read: group %u is not a SIDECAR group of "
			       "this engine", group);
	rc = grp_seq_enter(G, id, ids, GRP_LOOK);
	if (rc)
		return rc;
	p = G->g[group].parent;
	rc = kvt_sc_read(G->core[p], ids[p], layer_in_group, first_block, n_blocks, dst);
	return rc ? grp_err(rc, p) : 0;
}

int
kvt_seq_checkpoint(struct kvt_engine *e, kvt_seq_id id, uint64_t n_tokens)
{
	kvt_seq_id ids[KVT_MAX_GROUPS];
	struct kvt_grp *G;
	uint32_t i, tpb;
	int rc;

	if (!e)
		return kvt_err(-EINVAL, "kvt_seq_checkpoint: engine is NULL");
	G = e->grp;
	tpb = G ? G->tpb : e->layout.tokens_per_block;
	if (n_tokens < tpb || n_tokens / tpb > KVT_SEQ_MAX_BLOCKS)
		return kvt_err(-EINVAL, "kvt_seq_checkpoint: %llu tokens: no block boundary at or "
			       "below it (blocks of %u tokens)", (unsigned long long)n_tokens, tpb);
	if (!G) /* no STATE group: every block is kept; only the id is checked */
		return kvt_win_ask(e, id, (uint32_t)(n_tokens / tpb - 1));
	rc = grp_seq_enter(G, id, ids, GRP_TAKE);
	if (rc)
		return rc;
	GRP_FOR_STORAGE(G, i) {
		if (G->g[i].kind != KVT_GROUP_STATE)
			continue;
		rc = kvt_win_ask(G->core[i], ids[i], (uint32_t)(n_tokens / tpb - 1));
		if (rc) {
			rc = grp_err(rc, i);
			break;
		}
	}
	grp_seq_leave(G, id);
	return rc;
}

/* ---- tenants ------------------------------------------------------------------------------ */

int
kvt_grp_tenant_set_budget(struct kvt_engine *e, uint32_t tenant, enum kvt_tier tier,
			  uint64_t max_blocks)
{
	struct kvt_grp *G = e->grp;
	uint32_t i;
	int rc;

	GRP_FOR_STORAGE(G, i) {
		rc = kvt_tenant_set_budget(G->core[i], tenant, tier, max_blocks);
		if (rc)
			return grp_err(rc, i);
	}
	return 0;
}

int
kvt_grp_tenant_usage(struct kvt_engine *e, uint32_t tenant, uint64_t *used)
{
	struct kvt_grp *G = e->grp;
	uint64_t u[KVT_TIER_COUNT];
	uint32_t i;
	int rc, t;

	if (!used)
		return kvt_err(-EINVAL, "kvt_tenant_usage: used is NULL");
	memset(used, 0, KVT_TIER_COUNT * sizeof *used);
	GRP_FOR_STORAGE(G, i) {
		rc = kvt_tenant_usage(G->core[i], tenant, u);
		if (rc)
			return grp_err(rc, i);
		for (t = 0; t < KVT_TIER_COUNT; t++)
			used[t] += u[t];
	}
	return 0;
}

/* ---- batches ------------------------------------------------------------------------------ */

/* Prepare ranges @r in the pool of storage group @only, or in every pool (@only KVT_NIL). */
static int
grp_batch_prepare(struct kvt_engine *e, const struct kvt_seq_range *r, size_t n, uint32_t only,
		  struct kvt_batch **out);

int
kvt_grp_batch_prepare(struct kvt_engine *e, const struct kvt_seq_range *r, size_t n,
		      struct kvt_batch **out)
{
	return grp_batch_prepare(e, r, n, KVT_NIL, out);
}

int
kvt_batch_prepare_group(struct kvt_engine *e, uint32_t group, const struct kvt_seq_range *ranges,
			size_t n, struct kvt_batch **out)
{
	struct kvt_grp *G;

	if (out)
		*out = NULL;
	if (!e || !ranges || !out)
		return kvt_err(-EINVAL, "kvt_batch_prepare_group: engine, ranges and out must not "
			       "be NULL");
	G = e->grp;
	if (!G) {
		if (group != 0)
			return kvt_err(-EINVAL, "group %u out of range (the engine has 1 group)",
				       group);
		return kvt_batch_prepare_ranges(e, ranges, n, out);
	}
	if (group >= G->n)
		return kvt_err(-EINVAL, "group %u out of range (the engine has %u groups)", group,
			       G->n);
	if (G->g[group].kind == KVT_GROUP_SIDECAR)
		group = G->g[group].parent; /* its bytes are in the parent's blocks */
	if (!G->core[group])
		return kvt_err(-EINVAL, "group %u is an ALIAS group: it has no blocks of its own "
			       "(prepare its source's)", group);
	if (n == 0 || n > 65536)
		return kvt_err(-EINVAL, "kvt_batch_prepare_group: %zu ranges, must be 1..65536", n);
	return grp_batch_prepare(e, ranges, n, group, out);
}

static int
grp_batch_prepare(struct kvt_engine *e, const struct kvt_seq_range *r, size_t n, uint32_t only,
		  struct kvt_batch **out)
{
	struct kvt_grp *G = e->grp;
	struct kvt_seq_range *cr = NULL;
	kvt_seq_id *all = NULL;
	struct kvt_batch *b;
	uint32_t i, g;
	size_t k;
	int rc = 0;

	*out = NULL;
	b = kvt_calloc(1, sizeof *b + G->n * sizeof *b->gsub);
	cr = kvt_calloc(n, sizeof *cr);
	all = kvt_calloc(n * KVT_MAX_GROUPS, sizeof *all);
	if (!b || !cr || !all) {
		rc = kvt_err(-ENOMEM, "batch of %zu sequences", n);
		goto out;
	}
	b->e = e;
	b->n = (uint32_t)n;
	b->gsub = (struct kvt_batch **)(void *)(b + 1);
	/* the core ids of every range's sequence (looked at, not marked busy: the pools'
	 * in_batch marks guard the sequences from here on) */
	for (k = 0; k < n && !rc; k++)
		rc = grp_seq_enter(G, r[k].seq, all + k * KVT_MAX_GROUPS, GRP_CHECK);
	for (g = 0; g < G->n && !rc; g++) {
		if (!G->core[g] || (only != KVT_NIL && g != only))
			continue;
		for (k = 0; k < n; k++) {
			cr[k] = r[k];
			cr[k].seq = all[k * KVT_MAX_GROUPS + g];
		}
		rc = kvt_batch_prepare_ranges(G->core[g], cr, n, &b->gsub[g]);
		if (rc)
			rc = grp_err(rc, g);
	}
	if (rc) {
		/* nothing half-done: the pools that prepared give their pins back (not a
		 * release: that would seal the sequences' appended blocks) */
		for (i = 0; i < G->n; i++)
			if (b && b->gsub && b->gsub[i])
				kvt_batch_abandon(b->gsub[i]);
		if (rc == KVT_ELOST)
			for (k = 0; k < n; k++)
				grp_equalize(G, all + k * KVT_MAX_GROUPS);
		kvt_free(b);
		goto out;
	}
	pthread_mutex_lock(&G->lock);
	b->next = G->batches;
	if (b->next)
		b->next->prev = b;
	G->batches = b;
	G->n_batches++;
	pthread_mutex_unlock(&G->lock);
	*out = b;
out:
	kvt_free(cr);
	kvt_free(all);
	return rc;
}

int
kvt_grp_hint(struct kvt_engine *e, const struct kvt_seq_range *r, size_t n, uint32_t steps_ahead)
{
	struct kvt_grp *G = e->grp;
	struct kvt_seq_range *cr = kvt_calloc(n, sizeof *cr);
	kvt_seq_id *all = kvt_calloc(n * KVT_MAX_GROUPS, sizeof *all);
	uint32_t g;
	size_t k;
	int rc = 0, first = 0;

	if (!cr || !all) {
		kvt_free(cr);
		kvt_free(all);
		return kvt_err(-ENOMEM, "hint of %zu ranges", n);
	}
	for (k = 0; k < n && !rc; k++)
		rc = grp_seq_enter(G, r[k].seq, all + k * KVT_MAX_GROUPS, GRP_LOOK);
	for (g = 0; g < G->n && !rc; g++) {
		if (!G->core[g])
			continue;
		for (k = 0; k < n; k++) {
			cr[k] = r[k];
			cr[k].seq = all[k * KVT_MAX_GROUPS + g];
		}
		/* best effort, as in one engine: every pool is hinted, the first error told */
		first = kvt_engine_hint_ranges(G->core[g], cr, n, steps_ahead);
		if (first) {
			first = grp_err(first, g);
			if (first == -EINVAL || first == KVT_ETOOBIG)
				break; /* the ranges themselves: the same in every pool */
		}
	}
	kvt_free(cr);
	kvt_free(all);
	return rc ? rc : first;
}

int
kvt_batch_group_table(const struct kvt_batch *b, uint32_t group, struct kvt_group_table *out)
{
	struct kvt_batch *c;
	struct kvt_grp *G;
	uint32_t g = group, i, k;
	int rc;

	if (!b || !out)
		return kvt_err(-EINVAL, "kvt_batch_group_table: batch and out must not be NULL");
	memset(out, 0, sizeof *out);
	G = b->e->grp;
	if (!G) {
		if (group != 0)
			return kvt_err(-EINVAL, "group %u out of range (the engine has 1 group)",
				       group);
		c = (struct kvt_batch *)b;
	} else {
		if (group >= G->n)
			return kvt_err(-EINVAL, "group %u out of range (the engine has %u groups)",
				       group, G->n);
		g = G->src[group];
		if (g == KVT_NIL)
			return kvt_err(-EINVAL, "group %u is an ALIAS group whose layers read "
				       "several groups: ask kvt_layer_group per layer", group);
		c = b->gsub[g];
		if (!c)
			return kvt_err(-EINVAL, "group %u's pool is not in this batch (prepared for "
				       "another group: kvt_batch_prepare_group)", group);
	}
	rc = kvt_group_geometry(b->e, g, &out->geo);
	if (rc)
		return rc;
	if (!c->block_pos && c->pos)
		c->block_pos = c->pos; /* the core's positions (holes of a WINDOW group skipped) */
	if (!c->block_pos && !c->pos_cache) {
		c->pos_cache = kvt_malloc(((size_t)c->indptr[c->n] + 1) * sizeof *c->pos_cache);
		if (!c->pos_cache)
			return kvt_err(-ENOMEM, "block positions of %u entries", c->indptr[c->n]);
		for (i = 0; i < c->n; i++)
			for (k = c->indptr[i]; k < c->indptr[i + 1]; k++)
				c->pos_cache[k] = c->first_block[i] + (k - c->indptr[i]);
	}
	out->group = g;
	out->n_seqs = c->n;
	out->indptr = c->indptr;
	out->indices = c->indices;
	out->block_pos = c->block_pos ? c->block_pos : c->pos_cache;
	out->last_block_len = c->last_len;
	out->seq_len = c->seq_len;
	out->first_block = c->first_block;
	out->window = out->geo.window;
	out->sink = out->geo.sink;
	return 0;
}

int
kvt_batch_wait_group_layer(struct kvt_batch *b, uint32_t group, uint32_t layer_in_group,
			   void *stream)
{
	struct kvt_grp *G;

	if (!b)
		return kvt_err(-EINVAL, "kvt_batch_wait_group_layer: batch is NULL");
	G = b->e->grp;
	if (!G) {
		if (group != 0)
			return kvt_err(-EINVAL, "group %u out of range (the engine has 1 group)",
				       group);
		return kvt_batch_wait_layer(b, layer_in_group, stream);
	}
	if (group >= G->n)
		return kvt_err(-EINVAL, "group %u out of range (the engine has %u groups)", group,
			       G->n);
	if (G->g[group].kind == KVT_GROUP_SIDECAR)
		group = G->g[group].parent; /* its bytes come with the parent's layers */
	if (!b->gsub[group])
		return kvt_err(-EINVAL, G->core[group] ? "group %u's pool is not in this batch "
			       "(prepared for another group: kvt_batch_prepare_group)" :
			       "group %u is an ALIAS group: wait for its source layers", group);
	return kvt_batch_wait_layer(b->gsub[group], layer_in_group, stream);
}

int
kvt_grp_batch_wait_layer(struct kvt_batch *b, uint32_t layer, void *stream)
{
	struct kvt_grp *G = b->e->grp;

	if (layer >= G->n_layers)
		return kvt_err(-EINVAL, "layer %u out of range (model has %u)", layer, G->n_layers);
	if (!b->gsub[G->lgroup[layer]])
		return kvt_err(-EINVAL, "layer %u's group (%u) is not in this batch (prepared for "
			       "another group: kvt_batch_prepare_group)", layer, G->lgroup[layer]);
	return kvt_batch_wait_layer(b->gsub[G->lgroup[layer]], G->lindex[layer], stream);
}

int
kvt_grp_batch_release(struct kvt_batch *b, void *stream)
{
	struct kvt_grp *G = b->e->grp;
	uint32_t g;
	int rc, first = 0;

	for (g = 0; g < G->n; g++) {
		if (!b->gsub[g])
			continue;
		rc = kvt_batch_release(b->gsub[g], stream);
		if (rc && !first)
			first = grp_err(rc, g);
	}
	pthread_mutex_lock(&G->lock);
	if (b->prev)
		b->prev->next = b->next;
	else
		G->batches = b->next;
	if (b->next)
		b->next->prev = b->prev;
	G->n_batches--;
	pthread_mutex_unlock(&G->lock);
	kvt_free(b);
	return first;
}

/* ---- progress and statistics -------------------------------------------------------------- */

int
kvt_grp_check(struct kvt_engine *e)
{
	struct kvt_grp *G = e->grp;
	uint32_t g;
	int rc;

	GRP_FOR_STORAGE(G, g) {
		rc = kvt_engine_check(G->core[g]);
		if (rc)
			return grp_err(rc, g);
	}
	return 0;
}

struct kvt_engine *
kvt_grp_ext_core(struct kvt_engine *e, uint32_t g, const char *fn)
{
	struct kvt_grp *G = e->grp;

	if (g < G->n && G->core[g])
		return G->core[g];
	if (!fn)
		return NULL;
	if (g >= G->n)
		kvt_err(-EINVAL, "%s: layer_group %u out of range (the engine has %u groups)", fn,
			g, G->n);
	else if (G->g[g].kind == KVT_GROUP_ALIAS)
		kvt_err(-EINVAL, "%s: layer group %u is an ALIAS group: its layers read another "
			"group's KV and it has no pool; register the group it aliases", fn, g);
	else /* the only other kind without a pool */
		kvt_err(-EINVAL, "%s: layer group %u is a SIDECAR group: its bytes live in its "
			"parent group's blocks; register the parent group (its block_bytes include "
			"the sidecar)", fn, g);
	return NULL;
}

int
kvt_grp_poll(struct kvt_engine *e, uint32_t max)
{
	struct kvt_grp *G = e->grp;
	uint32_t g;
	int rc, n = 0;

	GRP_FOR_STORAGE(G, g) {
		rc = kvt_engine_poll(G->core[g], max);
		if (rc < 0)
			return grp_err(rc, g);
		n += rc;
	}
	return n;
}

int
kvt_grp_drain(struct kvt_engine *e)
{
	struct kvt_grp *G = e->grp;
	uint32_t g;
	int rc;

	GRP_FOR_STORAGE(G, g) {
		rc = kvt_engine_drain(G->core[g]);
		if (rc)
			return grp_err(rc, g);
	}
	return 0;
}

/* The statistics are 64-bit counters but for these 32-bit fields (summed as such). */
_Static_assert(offsetof(struct kvt_tier_stats, slots) == 16 &&
		       offsetof(struct kvt_tier_stats, evictions) == 24 &&
		       sizeof(struct kvt_tier_stats) % 8 == 0,
	       "struct kvt_tier_stats: two u64, two u32, then u64 only");
_Static_assert((sizeof(struct kvt_stats) - offsetof(struct kvt_stats, transfers_in_flight)) % 8 ==
		       0 && offsetof(struct kvt_stats, batches_open) ==
		       offsetof(struct kvt_stats, seqs_open) + 4,
	       "struct kvt_stats: u64 counters but seqs_open and batches_open");

static void
grp_sum_u64(void *dst, const void *src, size_t from, size_t to)
{
	uint64_t a, b;
	size_t o;

	for (o = from; o + 8 <= to; o += 8) {
		memcpy(&a, (char *)dst + o, 8);
		memcpy(&b, (const char *)src + o, 8);
		a += b;
		memcpy((char *)dst + o, &a, 8);
	}
}

/* Add the counters of @s to @acc. */
static void
grp_stats_add(struct kvt_stats *acc, const struct kvt_stats *s)
{
	int t;

	for (t = 0; t < KVT_TIER_COUNT; t++) {
		struct kvt_tier_stats *a = &acc->tier[t];
		const struct kvt_tier_stats *b = &s->tier[t];

		a->capacity_bytes += b->capacity_bytes;
		a->used_bytes += b->used_bytes;
		a->slots += b->slots;
		a->used_slots += b->used_slots;
		grp_sum_u64(a, b, offsetof(struct kvt_tier_stats, evictions), sizeof *a);
	}
	grp_sum_u64(acc, s, offsetof(struct kvt_stats, blocks_moved),
		    offsetof(struct kvt_stats, seqs_open));
	grp_sum_u64(acc, s, offsetof(struct kvt_stats, transfers_in_flight), sizeof *acc);
}

int
kvt_grp_stats(struct kvt_engine *e, struct kvt_stats *out)
{
	struct kvt_grp *G = e->grp;
	struct kvt_stats acc, s;
	size_t size = out->size;
	uint32_t g;
	int rc;

	memset(&acc, 0, sizeof acc);
	GRP_FOR_STORAGE(G, g) {
		memset(&s, 0, sizeof s);
		s.size = sizeof s;
		rc = kvt_engine_stats(G->core[g], &s);
		if (rc)
			return grp_err(rc, g);
		grp_stats_add(&acc, &s);
	}
	pthread_mutex_lock(&G->lock);
	acc.seqs_open = G->n_open;
	acc.batches_open = G->n_batches;
	pthread_mutex_unlock(&G->lock);
	acc.size = size;
	memcpy(out, &acc, size < sizeof acc ? size : sizeof acc);
	return 0;
}

int
kvt_engine_group_stats(struct kvt_engine *e, uint32_t group, struct kvt_stats *out)
{
	size_t size;

	if (!e || !out)
		return kvt_err(-EINVAL, "kvt_engine_group_stats: engine and out must not be NULL");
	if (!e->grp) {
		if (group != 0)
			return kvt_err(-EINVAL, "group %u out of range (the engine has 1 group)",
				       group);
		return kvt_engine_stats(e, out);
	}
	if (group >= e->grp->n)
		return kvt_err(-EINVAL, "group %u out of range (the engine has %u groups)", group,
			       e->grp->n);
	if (e->grp->core[group])
		return kvt_engine_stats(e->grp->core[group], out);
	size = out->size;
	if (size < offsetof(struct kvt_stats, evictions) || size > 65536)
		return kvt_err(-EINVAL, "kvt_stats.size %zu: set it to sizeof(struct kvt_stats)",
			       size);
	memset(out, 0, size < sizeof *out ? size : sizeof *out);
	out->size = size;
	return 0;
}

/* ---- persistent sessions ------------------------------------------------------------------ */

static int
grp_key_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* The restorable sessions of pool @c (of @tenant, or every tenant when @any), sorted, in a new
 * array *keys of *n. */
static int
grp_core_list(struct kvt_engine *c, bool any, uint32_t tenant, uint64_t **keys, size_t *n)
{
	int rc, m;

	*keys = NULL;
	*n = 0;
	for (;;) {
		rc = any ? kvt_session_list(c, NULL, 0) : kvt_session_list_tenant(c, tenant, NULL, 0);
		if (rc <= 0)
			return rc;
		kvt_free(*keys);
		*keys = kvt_malloc((size_t)rc * sizeof **keys);
		if (!*keys)
			return kvt_err(-ENOMEM, "session list of %d keys", rc);
		m = any ? kvt_session_list(c, *keys, (size_t)rc) :
			  kvt_session_list_tenant(c, tenant, *keys, (size_t)rc);
		if (m < 0) {
			kvt_free(*keys);
			*keys = NULL;
			return m;
		}
		if (m <= rc) {
			*n = (size_t)m;
			qsort(*keys, *n, sizeof **keys, grp_key_cmp);
			return 0;
		}
	}
}

/* kvt_session_list(_tenant) of a grouped engine: a session is durable only when every group's
 * store has it, so the list is the intersection of the pools' lists. */
int
kvt_grp_session_list(struct kvt_engine *e, bool any, uint32_t tenant, uint64_t *keys, size_t cap)
{
	struct kvt_grp *G = e->grp;
	uint64_t *have = NULL, *other = NULL;
	size_t n = 0, m, i, k;
	uint32_t g;
	int rc;

	rc = grp_core_list(G->core[G->first], any, tenant, &have, &n);
	GRP_FOR_STORAGE(G, g) {
		if (rc || g == G->first || !n)
			continue;
		rc = grp_core_list(G->core[g], any, tenant, &other, &m);
		for (i = k = 0; !rc && i < n; i++)
			if (m && bsearch(&have[i], other, m, sizeof *other, grp_key_cmp))
				have[k++] = have[i];
		if (!rc)
			n = k;
		kvt_free(other);
		other = NULL;
	}
	if (!rc)
		for (i = 0; i < n && i < cap; i++)
			keys[i] = have[i];
	kvt_free(have);
	if (rc)
		return rc;
	return n > INT32_MAX ? INT32_MAX : (int)n;
}

int
kvt_grp_seq_restore(struct kvt_engine *e, uint64_t key, const struct kvt_seq_opts *o,
		    kvt_seq_id *out)
{
	struct kvt_grp *G = e->grp;
	kvt_seq_id ids[KVT_MAX_GROUPS] = { 0 };
	uint32_t i;
	int rc = 0;

	*out = 0;
	GRP_FOR_STORAGE(G, i) {
		rc = kvt_seq_restore(G->core[i], key, o, &ids[i]);
		if (rc == -ENOENT && i != G->first)
			rc = kvt_err(-ENOENT, "group %u: session %#llx is not in this group's store "
				     "(a session is durable only when every group's store has it: "
				     "it was not restored)", i, (unsigned long long)key);
		else if (rc)
			rc = grp_err(rc, i);
		if (rc)
			break;
	}
	/* pools whose stores held different versions of the session (a park that failed in
	 * one pool, a crash between the pools' publishes): the longest length all can serve */
	if (!rc)
		grp_equalize(G, ids);
	/* the groups restored so far let their sequence go, keeping their records */
	return grp_seq_finish(G, rc, ids, out, kvt_seq_detach);
}

int
kvt_grp_session_drop(struct kvt_engine *e, bool any, uint32_t tenant, uint64_t key)
{
	struct kvt_grp *G = e->grp;
	uint32_t i;
	int rc, first;

	first = any ? kvt_session_drop(G->core[G->first], key) :
		      kvt_session_drop_tenant(G->core[G->first], tenant, key);
	if (first && first != -ENOENT)
		return grp_err(first, G->first); /* open, another tenant's: nothing dropped */
	GRP_FOR_STORAGE(G, i) {
		if (i == G->first)
			continue;
		rc = any ? kvt_session_drop(G->core[i], key) :
			   kvt_session_drop_tenant(G->core[i], tenant, key);
		if (rc == 0)
			first = 0; /* a part of it was there: dropped */
		else if (rc != -ENOENT)
			return grp_err(rc, i);
	}
	return first ? kvt_err(-ENOENT, "session %#llx is not in the store",
			       (unsigned long long)key) : 0;
}

/* ---- metrics ------------------------------------------------------------------------------ */

static const char *const grp_tier_name[KVT_TIER_COUNT] = { "hbm", "host", "nvme" };

/* The per-group families of a grouped engine's metrics text into @f (see kvtier.h). */
static void
grp_metrics_groups(struct kvt_grp *G, const struct kvt_stats *gs, FILE *f)
{
	static const struct {
		const char *name, *type, *help;
		int what; /* 0 slots, 1 used slots, 2 evictions */
	} fam[] = {
		{ "kvtier_group_slots", "gauge", "slots of the group's pool per tier", 0 },
		{ "kvtier_group_used_slots", "gauge", "slots of the group's pool in use per tier", 1 },
		{ "kvtier_group_evictions_total", "counter",
		  "copies dropped from the group's pool to make room, per tier", 2 },
	};
	uint32_t g, k;
	int t;

	fprintf(f, "# HELP kvtier_group_slot_bytes bytes of one slot (block) of the group's pool "
		"(0: an ALIAS group, no storage)\n# TYPE kvtier_group_slot_bytes gauge\n");
	for (g = 0; g < G->n; g++)
		fprintf(f, "kvtier_group_slot_bytes{group=\"%u\",kind=\"%s\",layers=\"%u\"} %llu\n",
			g, grp_kind_name(G->g[g].kind), G->g[g].n_layers,
			(unsigned long long)(G->core[g] ? G->core[g]->block_bytes : 0));
	for (k = 0; k < sizeof fam / sizeof fam[0]; k++) {
		fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", fam[k].name, fam[k].help, fam[k].name,
			fam[k].type);
		for (g = 0; g < G->n; g++)
			for (t = 0; G->core[g] && t < KVT_TIER_COUNT; t++) {
				const struct kvt_tier_stats *ts = &gs[g].tier[t];
				uint64_t v = fam[k].what == 0 ? ts->slots :
					     fam[k].what == 1 ? ts->used_slots : ts->evictions;

				fprintf(f, "%s{group=\"%u\",kind=\"%s\",tier=\"%s\"} %llu\n",
					fam[k].name, g, grp_kind_name(G->g[g].kind),
					grp_tier_name[t], (unsigned long long)v);
			}
	}
	fprintf(f, "# HELP kvtier_group_prefix_hit_blocks_total sealed blocks of the group found "
		"and shared through its pool's prefix index\n"
		"# TYPE kvtier_group_prefix_hit_blocks_total counter\n");
	for (g = 0; g < G->n; g++)
		if (G->core[g])
			fprintf(f, "kvtier_group_prefix_hit_blocks_total{group=\"%u\",kind=\"%s\"} "
				"%llu\n", g, grp_kind_name(G->g[g].kind),
				(unsigned long long)gs[g].prefix_hit_blocks);
}

int
kvt_grp_metrics_text(struct kvt_engine *e, char *buf, size_t cap, size_t *len)
{
	struct kvt_grp *G = e->grp;
	struct kvt_stats tot, gs[KVT_MAX_GROUPS];
	char *part = NULL, *head = NULL;
	size_t plen = 0, hlen = 0, need;
	uint32_t g;
	FILE *f;
	int rc;

	memset(&tot, 0, sizeof tot);
	tot.size = sizeof tot;
	rc = kvt_grp_stats(e, &tot);
	for (g = 0; g < G->n && !rc; g++) {
		memset(&gs[g], 0, sizeof gs[g]);
		gs[g].size = sizeof gs[g];
		if (G->core[g])
			rc = kvt_engine_stats(G->core[g], &gs[g]);
	}
	if (rc)
		return rc;
	/* the totals, as for one engine */
	rc = kvt_stats_metrics_text(&tot, NULL, 0, &hlen);
	if (rc != -ENOSPC && rc != 0)
		return rc;
	head = kvt_malloc(hlen + 1);
	f = open_memstream(&part, &plen);
	if (!head || !f) {
		kvt_free(head);
		if (f)
			fclose(f);
		free(part);
		return kvt_err(-ENOMEM, "metrics text");
	}
	rc = kvt_stats_metrics_text(&tot, head, hlen + 1, &hlen);
	grp_metrics_groups(G, gs, f);
	fclose(f);
	if (rc == 0 && !part)
		rc = kvt_err(-ENOMEM, "metrics text");
	if (rc == 0) {
		need = hlen + plen + 1;
		if (need > cap) {
			if (cap)
				buf[0] = 0;
			*len = need;
			rc = kvt_err(-ENOSPC, "metrics text: %zu bytes needed, the buffer has %zu",
				     need, cap);
		} else {
			memcpy(buf, head, hlen);
			memcpy(buf + hlen, part, plen + 1);
			*len = hlen + plen;
		}
	}
	kvt_free(head);
	free(part);
	return rc;
}
