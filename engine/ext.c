/* SPDX-License-Identifier: MIT */
/*
 * engine/ext.c - the external-pool mode (issue 19 item 1; kvtier.h "External-pool mode",
 * docs/ARCHITECTURE.md "External-pool mode").
 *
 * The caller owns its device KV pool; kvtier keeps copies of its blocks in the HOST and NVMe
 * tiers. A stored block is an ordinary engine block record (struct kvt_block) that no sequence
 * references: refs 0, creator KVT_EXT_SEQ, its bytes the gathered segments of one caller block
 * (layer 0 K, layer 0 V, layer 1 K, ...). So the tiers' machinery applies unchanged: the HOST
 * copy is listed by the eviction policy, demoted to NVMe by reclaim and the watermarks, dropped
 * from NVMe as any cached block, checksummed (and encoded) on its way to NVMe and verified on
 * the way back, counted in the tenant budgets (tslot) and the engine's stats.
 *
 * This file keeps:
 *   - the index: (tenant, caller hash) -> block id, open addressing (lookup is one probe per
 *     hash, under the lock);
 *   - per block id a side record (struct ext_meta): its key, whether its HOST copy has landed,
 *     how many jobs pin it, a generation (bumped when the block is freed: a job holding an id
 *     of a freed block sees the change) and the error that freed it (a failed NVMe read);
 *   - the jobs. Each job block walks WAIT -> (READ: NVMe read in flight) -> COPY (in a group
 *     of batched copies on the pool's device stream, with one event per group, or per layer
 *     for a layer-wise load) -> DONE | FAIL. Jobs advance in every kvt_ext_* call (and the
 *     engine's completions in kvt_xfer_poll); nothing runs on kvtier's own threads.
 * A job (and a kvt_ext_hold) pins its blocks with b->protect (their copies below HBM are then
 * not evictable, a HOST copy not even when NVMe has one; kvt_copy_evictable), never with
 * b->pins, which counts HBM pins. All of it under e->lock.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <xxhash.h>

#include "engine_impl.h"

#define EXT_POOL_ID 1u            /* the pool of an engine without layer groups; on a grouped
                                     engine group g's pool is g + 1 (kept by its core engine
                                     under EXT_POOL_ID) */
#define EXT_MAX_N 65536u          /* blocks per store or load call */
#define EXT_MAX_BLOCKS (1u << 30) /* caller block ids */
#define EXT_MAX_LAYERS 65536u     /* layers over all entries */
#define EXT_RF_MAX 256u           /* blocks of one REMOTE fetch (one pipelined get) */
#define EXT_NEG 1024u             /* REMOTE misses remembered (direct-mapped) */
#define EXT_NEG_NS 1000000000ull  /* ... for this long: a lookup in that time asks no again */

enum { JB_WAIT = 0, JB_READ = 1, JB_COPY = 2, JB_DONE = 3, JB_FAIL = 4, JB_SKIP = 5 };

/* One block of a job. */
struct ext_jblk {
	uint32_t caller; /* the caller's block id */
	uint32_t block;  /* engine block id (KVT_NIL: none, e.g. a missing hash) */
	uint32_t gen;    /* ext_meta.gen when the job took it */
	uint8_t st;      /* JB_* */
	uint8_t pinned;  /* holds one of the block's job pins */
	int32_t err;     /* JB_FAIL: why */
};

/* Copies submitted together: one batched copy (or one per layer) and its events. */
struct ext_group {
	struct ext_group *next;
	uint32_t *idx;          /* job block indices */
	uint32_t n;             /* entries in idx */
	uint32_t n_ev;          /* events (1, or the layers of a layer-wise load) */
	struct kvt_event *ev[]; /* ev[i]: after layer i's copies (or all of them) */
};

struct ext_job {
	uint64_t id;
	uint32_t kind;     /* enum kvt_ext_kind */
	uint32_t flags;    /* KVT_EXT_LAYERWISE */
	uint32_t tenant;
	uint32_t n;        /* blocks */
	uint32_t n_open;   /* blocks not DONE/FAIL/SKIP */
	uint32_t n_failed;
	uint32_t n_skipped;
	int32_t status;    /* first failure */
	uint32_t waiters;  /* threads asleep on one of its events, the lock released: its groups
	                      are neither retired nor freed, nor the job reported, meanwhile */
	bool used;         /* slot of x->jobs in use */
	bool ended;        /* every block terminal and every group retired */
	struct ext_jblk *b;
	struct ext_group *groups; /* not yet retired */
	struct kvt_event *wait_ev; /* recorded on the caller's stream (store) */
};

/* Side record of an engine block id. */
struct ext_meta {
	uint64_t hash;
	uint32_t tenant;
	uint32_t gen;    /* bumped when the block is freed */
	uint32_t jpins;  /* jobs pinning it */
	uint32_t holds;  /* kvt_ext_hold()s not released yet (the scheduler's protection) */
	int32_t last_err; /* why the block went (a failed NVMe read), 0 = dropped/evicted */
	uint8_t ext;     /* a live stored block of the pool */
	uint8_t landed;  /* its HOST copy landed once (loadable, found by lookup) */
	uint8_t dropped; /* kvt_ext_drop while pinned: uncached at the last unpin */
	uint8_t published; /* a record in the persistent store names pub_slot */
	uint8_t fetching; /* its HOST copy is being fetched from REMOTE (not landed yet) */
	uint32_t hit_gen; /* = lookup_gen: a hit of the current lookup (ext_fetch spares it) */
	uint32_t pub_slot; /* the NVMe slot that record names */
};

/* A REMOTE miss remembered: (tenant, hash) ended a fetch's verified run until @until_ns. */
struct ext_neg {
	uint64_t hash;
	uint64_t until_ns;
	uint32_t tenant;
	uint32_t pad_;
};

struct ext_ent {
	uint64_t hash;
	uint32_t tenant;
	uint32_t block; /* KVT_NIL: empty, KVT_NIL - 1: deleted */
};
#define EXT_EMPTY KVT_NIL
#define EXT_TOMB (KVT_NIL - 1)

/* A layer of the pool, expanded from the entries. */
struct ext_lay {
	uint64_t base;   /* address of block 0's layer */
	uint64_t stride; /* block stride */
	uint64_t k_off, v_off, k_bytes, v_bytes; /* v_bytes 0: no V */
	uint64_t dst;    /* offset of the layer's K in a stored block (V follows) */
};

struct kvt_ext_state {
	uint32_t n_blocks;
	uint32_t n_layers;
	struct ext_lay *lay;
	uint64_t bytes;            /* gathered bytes of one block */
	struct kvt_stream *s_store, *s_load;
	struct ext_ent *tab;
	uint64_t cap, n, tombs;
	struct ext_meta *meta;     /* [cap_meta] by engine block id */
	uint32_t cap_meta;
	struct ext_job *jobs;      /* [max_jobs] */
	uint32_t max_jobs, n_jobs;
	uint64_t next_id;
	struct kvt_copy *cv;       /* scratch copy vector */
	size_t cap_cv;
	uint32_t *scratch;         /* scratch job-block indices */
	size_t cap_scratch;
	struct kvt_ext_stats st;
	uint64_t pers_sig;         /* engine counters at the last persistence scan */
	bool pers_commit;          /* records put or deleted since the last commit */
	/* kvt_ext_removed: a ring of the (tenant, hash) of landed blocks that went */
	struct kvt_ext_removal *gone;
	uint32_t gone_head, gone_n; /* oldest entry, entries held (<= x->gone_cap) */
	uint64_t gone_lost;        /* removals the full ring overwrote since the last drain */
	uint32_t gone_cap;         /* kvt_ext_opts.removed_cap */
	/* the REMOTE tier below the pool (engine/remote.c; kvtier.h "External-pool mode") */
	uint64_t geo_fp;           /* XXH3-64 of the per-layer segment sizes: part of each key */
	bool closing;              /* unregistering: no new REMOTE fetches */
	struct ext_neg neg[EXT_NEG];
	uint32_t lookup_gen;       /* bumped by each kvt_ext_lookup with a REMOTE tier */
	uint32_t *orphans;         /* dropped blocks still held (out of the index: release finds
	                              them here), n_orphans of cap_orphans */
	uint32_t n_orphans, cap_orphans;
	uint32_t fetch_held;       /* HOST slots held by REMOTE fetches in flight */
};
#define EXT_REMOVED_CAP 65536u     /* kvt_ext_opts.removed_cap's default */

/* ---- small helpers */

/* Sleep *us microseconds, the next nap twice as long (up to 1 ms). */
static void
ext_nap(uint32_t *us)
{
	struct timespec ts = { 0, (long)*us * 1000 };

	nanosleep(&ts, NULL);
	if (*us < 1000)
		*us *= 2;
}

static uint64_t
ext_mix(uint64_t h, uint32_t tenant)
{
	uint64_t x = h ^ ((uint64_t)tenant * 0x9e3779b97f4a7c15ull);

	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	return x ^ (x >> 33);
}

/* The persistent store's key of (tenant, hash): invertible given the tenant; 0 = none. */
static uint64_t
ext_key(uint64_t hash, uint32_t tenant)
{
	return hash ^ ext_mix(0x4b56544558543031ull, tenant);
}

/*
 * The REMOTE key (16 bytes, kvt_rv_key's hash) of the caller's @hash in pool @x: XXH3-128 of
 * a tag, the hash and the pool's geometry fingerprint (the segment sizes decide the bytes of
 * a stored block: two servers with the same model and layout but other segments do not share
 * values). Prefix-chain keys of the engine's own sequences are XXH3-128 of token chains:
 * never the same input.
 */
static void
ext_rkey(const struct kvt_ext_state *x, uint64_t hash, uint64_t k[2])
{
	uint8_t in[24];
	XXH128_hash_t h;

	memcpy(in, "KVTEXT01", 8);
	memcpy(in + 8, &hash, 8);
	memcpy(in + 16, &x->geo_fp, 8);
	h = XXH3_128bits(in, sizeof in);
	k[0] = h.low64;
	k[1] = h.high64;
}

static uint64_t
ext_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static struct ext_ent *
ext_find(struct kvt_ext_state *x, uint32_t tenant, uint64_t hash)
{
	uint64_t i, mask;

	if (!x->cap)
		return NULL;
	mask = x->cap - 1;
	for (i = ext_mix(hash, tenant) & mask;; i = (i + 1) & mask) {
		struct ext_ent *t = &x->tab[i];

		if (t->block == EXT_EMPTY)
			return NULL;
		if (t->block != EXT_TOMB && t->hash == hash && t->tenant == tenant)
			return t;
	}
}

static int
ext_tab_grow(struct kvt_ext_state *x)
{
	uint64_t ncap = x->cap ? x->cap : 1024, i;
	struct ext_ent *nt, *old = x->tab;

	while ((x->n + 1) * 4 > ncap * 3)
		ncap *= 2;
	nt = kvt_malloc(ncap * sizeof *nt);
	if (!nt)
		return kvt_err(-ENOMEM, "external pool: index of %llu entries",
			       (unsigned long long)ncap);
	for (i = 0; i < ncap; i++)
		nt[i].block = EXT_EMPTY;
	for (i = 0; i < x->cap; i++) {
		uint64_t j;

		if (old[i].block >= EXT_TOMB)
			continue;
		for (j = ext_mix(old[i].hash, old[i].tenant) & (ncap - 1); nt[j].block != EXT_EMPTY;
		     j = (j + 1) & (ncap - 1))
			;
		nt[j] = old[i];
	}
	kvt_free(old);
	x->tab = nt;
	x->cap = ncap;
	x->tombs = 0;
	return 0;
}

static int
ext_insert(struct kvt_ext_state *x, uint32_t tenant, uint64_t hash, uint32_t block)
{
	uint64_t i, mask;
	int rc;

	if ((x->n + x->tombs + 1) * 4 > x->cap * 3) {
		rc = ext_tab_grow(x);
		if (rc)
			return rc;
	}
	mask = x->cap - 1;
	for (i = ext_mix(hash, tenant) & mask; x->tab[i].block < EXT_TOMB; i = (i + 1) & mask)
		;
	if (x->tab[i].block == EXT_TOMB)
		x->tombs--;
	x->tab[i].hash = hash;
	x->tab[i].tenant = tenant;
	x->tab[i].block = block;
	x->n++;
	return 0;
}

static int
ext_meta_reserve(struct kvt_engine *e, struct kvt_ext_state *x, uint32_t id)
{
	uint32_t ncap = x->cap_meta ? x->cap_meta : 1024;
	struct ext_meta *nm;

	if (id < x->cap_meta)
		return 0;
	while (ncap <= id)
		ncap *= 2;
	if (ncap < e->cap_blocks)
		ncap = e->cap_blocks;
	nm = kvt_realloc(x->meta, (size_t)ncap * sizeof *nm);
	if (!nm)
		return kvt_err(-ENOMEM, "external pool: block records (%u)", ncap);
	memset(nm + x->cap_meta, 0, (size_t)(ncap - x->cap_meta) * sizeof *nm);
	x->meta = nm;
	x->cap_meta = ncap;
	return 0;
}

/*
 * The engine that holds pool @*pool: @e itself, or on a grouped engine the core engine of the
 * group the id names (g + 1), *pool then its id there. An id naming no storage group keeps @e
 * (the grouped front, which holds no pool: ext_get then says -ENOENT).
 */
static struct kvt_engine *
ext_route(struct kvt_engine *e, uint32_t *pool)
{
	struct kvt_engine *c;

	if (!e || !e->grp || *pool == 0)
		return e;
	c = kvt_grp_ext_core(e, *pool - 1, NULL);
	if (!c)
		return e;
	*pool = EXT_POOL_ID;
	return c;
}

static struct kvt_ext_state *
ext_get(struct kvt_engine *e, uint32_t pool, const char *fn)
{
	if (!e->ext || pool != EXT_POOL_ID) {
		kvt_err(-ENOENT, "%s: pool %u is not registered%s", fn, pool,
			e->ext ? "" : " (no kvt_ext_register on this engine)");
		return NULL;
	}
	return e->ext;
}

/* ---- hooks from the engine (block.c, xfer.c) */

/* A landed block's hash stopped being found: remember it for kvt_ext_removed (the oldest entry
 * is overwritten when the ring is full, and counted as lost). */
static void
ext_gone_push(struct kvt_ext_state *x, uint32_t tenant, uint64_t hash)
{
	uint32_t at;

	if (x->gone_n == x->gone_cap) {
		x->gone_head = (x->gone_head + 1) % x->gone_cap;
		x->gone_n--;
		x->gone_lost++;
	}
	at = (x->gone_head + x->gone_n) % x->gone_cap;
	x->gone[at] = (struct kvt_ext_removal){ .hash = hash, .tenant = tenant };
	x->gone_n++;
}

void
kvt_ext_block_freed(struct kvt_engine *e, uint32_t id)
{
	struct kvt_ext_state *x = e->ext;
	struct ext_meta *m;
	struct ext_ent *t;

	if (!x || id >= x->cap_meta || !x->meta[id].ext)
		return;
	m = &x->meta[id];
	if (m->published && e->store) {
		/* its record goes; the slot is reused once the DEL is committed */
		if (kvt_persist_ext_del(e, ext_key(m->hash, m->tenant)) == 0)
			x->pers_commit = true;
		m->published = 0;
	}
	t = ext_find(x, m->tenant, m->hash);
	if (t && t->block == id) {
		t->block = EXT_TOMB;
		x->n--;
		x->tombs++;
		if (m->landed)
			ext_gone_push(x, m->tenant, m->hash);
	}
	if (m->holds) /* freed while held (lost, unregistered): no longer an orphan either */
		for (uint32_t i = 0; i < x->n_orphans; i++)
			if (x->orphans[i] == id) {
				x->orphans[i] = x->orphans[--x->n_orphans];
				break;
			}
	m->ext = 0;
	m->landed = 0;
	m->dropped = 0;
	m->jpins = 0;
	m->holds = 0;
	m->gen++;
}

uint64_t
kvt_ext_session_key(const struct kvt_engine *e, uint32_t id)
{
	const struct kvt_ext_state *x = e->ext;

	if (!x || id >= x->cap_meta || !x->meta[id].ext)
		return 0;
	return ext_key(x->meta[id].hash, x->meta[id].tenant);
}

void
kvt_ext_read_failed(struct kvt_engine *e, uint32_t id, int res)
{
	struct kvt_ext_state *x = e->ext;

	if (x && id < x->cap_meta && x->meta[id].ext)
		x->meta[id].last_err = res == KVT_ECORRUPT ? KVT_ECORRUPT : -EIO;
}

/* ---- the REMOTE tier below the pool */

/* Stored block @id landed (@evidence false), or was stored again or loaded (true): offered for
 * write-through (remote.c decides per opts.remote_write, the budget and the backlog). */
static void
ext_offer(struct kvt_engine *e, struct kvt_ext_state *x, uint32_t id, bool evidence)
{
	uint64_t k[2];

	if (!e->remote || !x->meta[id].ext || !x->meta[id].landed)
		return;
	ext_rkey(x, x->meta[id].hash, k);
	kvt_reng_ext_offer(e, id, x->meta[id].tenant, k, x->bytes, evidence);
}

/*
 * Entry @t names a block being fetched from REMOTE: take it out of the index (a store of its
 * hash copies the caller's bytes instead of trusting a fetch that may miss; a drop means it
 * must not land). The block stays busy until its fetch is reaped, then goes (kvt_ext_fetched
 * finds it no longer the pool's).
 */
static void
ext_detach_fetch(struct kvt_ext_state *x, struct ext_ent *t)
{
	struct ext_meta *m = &x->meta[t->block];

	m->ext = 0;
	m->fetching = 0;
	m->gen++;
	t->block = EXT_TOMB;
	x->n--;
	x->tombs++;
}

bool
kvt_ext_fetching(const struct kvt_engine *e, uint32_t id)
{
	const struct kvt_ext_state *x = e->ext;

	return x && id < x->cap_meta && x->meta[id].ext && x->meta[id].fetching;
}

/* kvt_room_clean's @spare: a hit of the current lookup (its caller loads it from HOST next). */
static bool
ext_spare_hit(const struct kvt_engine *e, uint32_t id, void *arg)
{
	const struct kvt_ext_state *x = arg;

	(void)e;
	return id < x->cap_meta && x->meta[id].ext && x->meta[id].hit_gen == x->lookup_gen;
}

/*
 * Room in HOST for a REMOTE fetch of @want blocks, without losing anything for a guess (the
 * hashes may not be there): kvt_room_clean (free slots, then clean HOST copies), sparing the
 * hits of the current lookup. Fetches in flight hold at most half of HOST, so that stores
 * keep room. Returns the blocks the fetch may take (<= @want).
 */
static uint32_t
ext_fetch_room(struct kvt_engine *e, struct kvt_ext_state *x, uint32_t want)
{
	uint32_t half = e->slots[KVT_TIER_HOST].n_slots / 2;
	uint32_t cap = half > x->fetch_held ? half - x->fetch_held : 0;

	return kvt_room_clean(e, KVT_TIER_HOST, want < cap ? want : cap, ext_spare_hit, x);
}

static struct ext_neg *
ext_neg_slot(struct kvt_ext_state *x, uint32_t tenant, uint64_t hash)
{
	return &x->neg[ext_mix(hash, tenant) & (EXT_NEG - 1)];
}

void
kvt_ext_fetched(struct kvt_engine *e, uint32_t id, bool ok, bool first_miss)
{
	struct kvt_ext_state *x = e->ext;
	struct ext_meta *m;

	if (x && x->fetch_held)
		x->fetch_held--; /* its HOST slot is the pool's stored block, or free again */
	if (!x || id >= x->cap_meta || !x->meta[id].ext || !x->meta[id].fetching) {
		/* detached (a store or a drop of its hash meanwhile: ext_detach_fetch), or no pool
		 * holds it (cannot happen: unregister drains) */
		kvt_block_uncache(e, id);
		return;
	}
	m = &x->meta[id];
	m->fetching = 0;
	if (ok) {
		m->landed = 1; /* found by kvt_ext_lookup, loadable, persisted as a stored one */
		x->st.remote_hit_blocks++;
		return;
	}
	if (first_miss) {
		struct ext_neg *ng = ext_neg_slot(x, m->tenant, m->hash);

		*ng = (struct ext_neg){ .hash = m->hash, .tenant = m->tenant,
					.until_ns = ext_now_ns() + EXT_NEG_NS };
	}
	kvt_block_uncache(e, id); /* kvt_ext_block_freed takes it out of the index */
}

/*
 * Ask REMOTE for the @n hashes that follow a lookup's local run (@hashes[0] missed locally):
 * the leading ones not indexed here get a block record and a HOST slot (INFLIGHT, busy: the
 * remote worker writes it) and one pipelined get, queued; they are in the index meanwhile (a
 * store of the same hash is skipped, lookup and load do not find them) and land, or go, when
 * the worker's result is reaped. Never waits. Returns the blocks asked.
 */
static uint32_t
ext_fetch(struct kvt_engine *e, struct kvt_ext_state *x, uint32_t tenant, const uint64_t *hashes,
	  size_t n)
{
	uint64_t keys[EXT_RF_MAX][2];
	uint32_t ids[EXT_RF_MAX], want, m;
	struct ext_neg *ng;

	if (!n || x->closing || !kvt_reng_can_fetch(e) || ext_find(x, tenant, hashes[0]))
		return 0; /* no REMOTE, or the first one is being stored or fetched already */
	ng = ext_neg_slot(x, tenant, hashes[0]);
	if (ng->hash == hashes[0] && ng->tenant == tenant && ng->until_ns > ext_now_ns())
		return 0; /* missed there a moment ago */
	/* the run first (it ends before a hash stored or in flight here), then room for it */
	want = n < EXT_RF_MAX ? (uint32_t)n : EXT_RF_MAX;
	for (m = 1; m < want; m++)
		if (ext_find(x, tenant, hashes[m]))
			break;
	want = ext_fetch_room(e, x, m);
	for (m = 0; m < want; m++) {
		struct kvt_block *b;
		uint32_t id, slot;

		if (m && ext_find(x, tenant, hashes[m]))
			break; /* stored or in flight here: the fetch ends before it */
		if (kvt_block_new(e, KVT_EXT_SEQ, 0, &id))
			break;
		b = kvt_blk(e, id);
		b->refs = 0;
		b->written = 1;
		b->tslot = kvt_tenant_slot(e, tenant);
		if (ext_meta_reserve(e, x, id) || kvt_slot_alloc(e, KVT_TIER_HOST, id, &slot)) {
			kvt_block_uncache(e, id);
			break;
		}
		b->slot[KVT_TIER_HOST] = slot;
		kvt_copy_state_set(b, KVT_TIER_HOST, KVT_COPY_INFLIGHT);
		b->busy = 1; /* the worker writes the slot: nothing frees or reuses it */
		if (ext_insert(x, tenant, hashes[m], id)) {
			b->busy = 0;
			kvt_copy_fail(e, id, KVT_TIER_HOST);
			kvt_block_uncache(e, id);
			break;
		}
		x->meta[id] = (struct ext_meta){ .hash = hashes[m], .tenant = tenant,
						 .gen = x->meta[id].gen, .ext = 1, .fetching = 1 };
		x->fetch_held++;
		ids[m] = id;
		ext_rkey(x, hashes[m], keys[m]);
	}
	if (m && kvt_reng_ext_fetch(e, tenant, (const uint64_t(*)[2])keys, ids, m)) {
		x->fetch_held -= m;
		for (uint32_t i = 0; i < m; i++) {
			kvt_blk(e, ids[i])->busy = 0;
			kvt_copy_fail(e, ids[i], KVT_TIER_HOST);
			x->meta[ids[i]].fetching = 0;
			kvt_block_uncache(e, ids[i]);
		}
		return 0;
	}
	x->st.remote_fetch_blocks += m;
	return m;
}

/* ---- pins */

static void
ext_pin(struct kvt_engine *e, struct kvt_ext_state *x, struct ext_jblk *jb)
{
	x->meta[jb->block].jpins++;
	/* protect: its copies below HBM are not evictable while they are its only ones;
	 * wanted: a demotion in flight keeps its HOST copy (a scatter may read it) */
	kvt_blk(e, jb->block)->protect = 1;
	kvt_blk(e, jb->block)->wanted = 1;
	jb->pinned = 1;
}

static void
ext_unpin(struct kvt_engine *e, struct kvt_ext_state *x, struct ext_jblk *jb)
{
	struct ext_meta *m = &x->meta[jb->block];

	if (!jb->pinned)
		return;
	jb->pinned = 0;
	if (m->gen != jb->gen || !m->ext || --m->jpins || m->holds)
		return; /* another job's pin, or a hold, keeps it */
	kvt_blk(e, jb->block)->protect = 0;
	if (m->dropped)
		kvt_block_uncache(e, jb->block);
}

/* ---- jobs */

static struct ext_job *
ext_job_find(struct kvt_ext_state *x, uint64_t id)
{
	uint32_t i;

	for (i = 0; i < x->max_jobs; i++)
		if (x->jobs[i].used && x->jobs[i].id == id)
			return &x->jobs[i];
	return NULL;
}

static void
jb_fail(struct ext_job *j, struct ext_jblk *jb, int err)
{
	jb->st = JB_FAIL;
	jb->err = err;
	j->n_open--;
	j->n_failed++;
	if (!j->status)
		j->status = err;
}

static void
ext_group_free(struct kvt_engine *e, struct ext_group *g)
{
	uint32_t i;

	for (i = 0; i < g->n_ev; i++)
		if (g->ev[i])
			e->dev->ops->event_destroy(e->dev, g->ev[i]);
	kvt_free(g->idx);
	kvt_free(g);
}

static void
ext_job_release(struct kvt_engine *e, struct kvt_ext_state *x, struct ext_job *j)
{
	uint32_t i;

	while (j->groups) {
		struct ext_group *g = j->groups;

		j->groups = g->next;
		ext_group_free(e, g);
	}
	for (i = 0; i < j->n; i++)
		ext_unpin(e, x, &j->b[i]);
	if (j->wait_ev)
		e->dev->ops->event_destroy(e->dev, j->wait_ev);
	kvt_free(j->b);
	memset(j, 0, sizeof *j);
	x->n_jobs--;
}

static int
ext_cv_reserve(struct kvt_ext_state *x, size_t n)
{
	struct kvt_copy *nv;
	uint32_t *ns;

	if (n > x->cap_cv) {
		nv = kvt_realloc(x->cv, n * sizeof *nv);
		if (!nv)
			return kvt_err(-ENOMEM, "external pool: %zu copy descriptors", n);
		x->cv = nv;
		x->cap_cv = n;
	}
	if (n > x->cap_scratch) {
		ns = kvt_realloc(x->scratch, n * sizeof *ns);
		if (!ns)
			return kvt_err(-ENOMEM, "external pool: %zu indices", n);
		x->scratch = ns;
		x->cap_scratch = n;
	}
	return 0;
}

/* Caller address of layer @l's K (@v: V) of caller block @c. */
static inline char *
ext_addr(const struct ext_lay *L, uint32_t c, bool v)
{
	return (char *)(uintptr_t)(L->base + (uint64_t)c * L->stride + (v ? L->v_off : L->k_off));
}

/* Fill the copies of layer @l of the blocks @idx[0..n) of @j into x->cv from @at on. */
static uint32_t
ext_fill_layer(struct kvt_engine *e, struct kvt_ext_state *x, struct ext_job *j,
	       const uint32_t *idx, uint32_t n, uint32_t l, uint32_t at)
{
	const struct ext_lay *L = &x->lay[l];
	bool store = j->kind == KVT_EXT_STORE;
	uint32_t i;

	for (i = 0; i < n; i++) {
		const struct ext_jblk *jb = &j->b[idx[i]];
		char *host = (char *)kvt_slot_addr(e, KVT_TIER_HOST,
						   kvt_blk(e, jb->block)->slot[KVT_TIER_HOST]) +
			     L->dst;
		char *dev = ext_addr(L, jb->caller, false);

		x->cv[at].dst = store ? (void *)host : (void *)dev;
		x->cv[at].src = store ? (const void *)dev : (const void *)host;
		x->cv[at++].len = L->k_bytes;
		if (L->v_bytes) {
			dev = ext_addr(L, jb->caller, true);
			host += L->k_bytes;
			x->cv[at].dst = store ? (void *)host : (void *)dev;
			x->cv[at].src = store ? (const void *)dev : (const void *)host;
			x->cv[at++].len = L->v_bytes;
		}
	}
	return at;
}

/* Queue the copies of the job blocks @idx[0..n) (their HOST slots set) as one group. */
static int
ext_submit(struct kvt_engine *e, struct kvt_ext_state *x, struct ext_job *j, uint32_t *idx,
	   uint32_t n)
{
	bool layered = j->kind == KVT_EXT_LOAD && (j->flags & KVT_EXT_LAYERWISE);
	uint32_t n_ev = layered ? x->n_layers : 1, l, at = 0, i;
	struct kvt_stream *s = j->kind == KVT_EXT_STORE ? x->s_store : x->s_load;
	struct ext_group *g;
	int rc = 0;

	rc = ext_cv_reserve(x, (size_t)n * x->n_layers * 2);
	if (rc)
		return rc;
	g = kvt_calloc(1, sizeof *g + n_ev * sizeof g->ev[0]);
	if (!g || !(g->idx = kvt_malloc(n * sizeof *g->idx))) {
		kvt_free(g);
		return kvt_err(-ENOMEM, "external pool: copy group of %u blocks", n);
	}
	memcpy(g->idx, idx, n * sizeof *idx);
	g->n = n;
	g->n_ev = n_ev;
	if (j->wait_ev) {
		rc = e->dev->ops->stream_wait_event(e->dev, s, j->wait_ev);
		if (rc) {
			ext_group_free(e, g);
			return rc;
		}
	}
	for (l = 0; l < x->n_layers && !rc; l++) {
		at = ext_fill_layer(e, x, j, idx, n, l, at);
		if (layered || l + 1 == x->n_layers) {
			uint32_t k = layered ? l : 0;

			rc = e->dev->ops->copy_batch_async(e->dev, s, x->cv, at);
			at = 0;
			if (!rc)
				rc = e->dev->ops->event_create(e->dev, &g->ev[k]);
			if (!rc)
				rc = e->dev->ops->event_record(e->dev, g->ev[k], s);
		}
	}
	if (rc) {
		/* copies may be queued: wait for them before the slots can go */
		(void)e->dev->ops->stream_sync(e->dev, s);
		ext_group_free(e, g);
		return rc;
	}
	for (i = 0; i < n; i++)
		j->b[idx[i]].st = JB_COPY;
	g->next = j->groups;
	j->groups = g;
	return 0;
}

/* A store block got its slot or not. 0, or <0 to retry later (-EAGAIN) / fail it. */
static int
ext_store_slot(struct kvt_engine *e, struct kvt_ext_state *x, struct ext_job *j,
	       struct ext_jblk *jb)
{
	struct kvt_block *b = kvt_blk(e, jb->block);
	uint32_t slot;
	int rc;

	(void)x;
	(void)j;
	b->protect = 1; /* not picked by its own reclaim (it has no copy yet anyway) */
	rc = kvt_reclaim(e, KVT_TIER_HOST, 1, false);
	if (rc == 0)
		rc = kvt_slot_alloc(e, KVT_TIER_HOST, jb->block, &slot);
	if (rc == 0) {
		b->slot[KVT_TIER_HOST] = slot;
		kvt_copy_state_set(b, KVT_TIER_HOST, KVT_COPY_INFLIGHT);
	}
	return rc;
}

/* A store block that will not be stored: its (copy-less) block goes. */
static void
ext_store_abandon(struct kvt_engine *e, struct kvt_ext_state *x, struct ext_jblk *jb)
{
	struct kvt_block *b = kvt_blk(e, jb->block);

	if (kvt_copy_state(b, KVT_TIER_HOST) == KVT_COPY_INFLIGHT)
		kvt_copy_fail(e, jb->block, KVT_TIER_HOST);
	ext_unpin(e, x, jb);
	b->protect = 0;
	kvt_block_uncache(e, jb->block);
}

/* Copies of the pool in flight (groups or NVMe reads): their completions free or unpin HOST
 * slots, so a full HOST is "not now" rather than "never" while there are any. */
static bool
ext_busy(const struct kvt_ext_state *x)
{
	uint32_t i, k;

	for (i = 0; i < x->max_jobs; i++) {
		const struct ext_job *j = &x->jobs[i];

		if (!j->used || j->ended)
			continue;
		if (j->groups)
			return true;
		for (k = 0; k < j->n; k++)
			if (j->b[k].st == JB_READ)
				return true;
	}
	return false;
}

/*
 * Start what can start of job @j's waiting blocks. Phase 0: only the loads whose blocks are in
 * HOST (their scatters), phase 1: the rest (stores' slots, NVMe reads), so that the HOST slots
 * the pool itself pins are already on their way out when the rest asks for room.
 */
static int
ext_advance_job(struct kvt_engine *e, struct kvt_ext_state *x, struct ext_job *j, int phase)
{
	uint32_t i, n = 0;
	bool full = false; /* HOST has no slot now: the rest waits for the next advance */
	int rc;

	if (j->ended)
		return 0;
	rc = ext_cv_reserve(x, (size_t)j->n * x->n_layers * 2);
	if (rc)
		return rc;
	if (phase == 1) {
		/* room for all the blocks that need a HOST slot in one pass: every dirty victim's
		 * demotion starts together (kvt_reclaim_for's reasoning), not one per advance */
		struct kvt_slots *sl = &e->slots[KVT_TIER_HOST];
		uint32_t want = 0;

		for (i = 0; i < j->n; i++)
			want += j->b[i].st == JB_WAIT &&
				(j->kind == KVT_EXT_STORE ||
				 kvt_copy_state(kvt_blk(e, j->b[i].block), KVT_TIER_HOST) ==
					 KVT_COPY_ABSENT);
		if (want > sl->n_slots / 2)
			want = sl->n_slots / 2;
		if (want > 1 && sl->n_free < want)
			(void)kvt_reclaim(e, KVT_TIER_HOST, want, false);
	}
	for (i = 0; i < j->n; i++) {
		struct ext_jblk *jb = &j->b[i];
		struct ext_meta *m;
		struct kvt_block *b;
		uint32_t slot;

		if (jb->st != JB_WAIT && jb->st != JB_READ)
			continue;
		m = &x->meta[jb->block];
		if (m->gen != jb->gen || !m->ext) {
			/* freed under the job: a failed NVMe read, or no room */
			jb->pinned = 0;
			jb_fail(j, jb, m->last_err ? m->last_err : -ENOENT);
			continue;
		}
		b = kvt_blk(e, jb->block);
		if (phase == 0 && (j->kind == KVT_EXT_STORE || !kvt_copy_valid(b, KVT_TIER_HOST)))
			continue;
		if (j->kind == KVT_EXT_STORE) {
			if (full)
				continue;
			rc = ext_store_slot(e, x, j, jb);
			if (rc == -EAGAIN || (rc == -ENOSPC && (n || ext_busy(x)))) {
				full = true;
				continue;
			}
			if (rc) {
				ext_store_abandon(e, x, jb);
				jb_fail(j, jb, rc == -ENOSPC ? -ENOSPC : rc);
				continue;
			}
			x->scratch[n++] = i;
			continue;
		}
		if (kvt_copy_valid(b, KVT_TIER_HOST)) {
			x->scratch[n++] = i;
			continue;
		}
		if (kvt_copy_state(b, KVT_TIER_HOST) == KVT_COPY_INFLIGHT)
			continue; /* being read (by this job or another) */
		if (!kvt_copy_valid(b, KVT_TIER_NVME)) {
			jb_fail(j, jb, m->last_err ? m->last_err : -ENOENT);
			continue;
		}
		if (full)
			continue;
		rc = kvt_reclaim(e, KVT_TIER_HOST, 1, false);
		if (rc == 0)
			rc = kvt_slot_alloc(e, KVT_TIER_HOST, jb->block, &slot);
		if (rc == 0)
			rc = kvt_xfer_n2h(e, jb->block, slot, false, false);
		if (rc == 0) {
			jb->st = JB_READ;
			continue;
		}
		if (rc == -EAGAIN || (rc == -ENOSPC && (n || ext_busy(x)))) {
			full = true; /* no room or IO slot now: retried at the next advance */
			continue;
		}
		jb_fail(j, jb, rc);
	}
	if (n) {
		rc = ext_submit(e, x, j, x->scratch, n);
		if (rc) {
			for (i = 0; i < n; i++) {
				struct ext_jblk *jb = &j->b[x->scratch[i]];

				if (j->kind == KVT_EXT_STORE)
					ext_store_abandon(e, x, jb);
				jb_fail(j, jb, rc);
			}
		}
	}
	return 0;
}

/* Retire the groups whose copies have all landed. */
static void
ext_retire(struct kvt_engine *e, struct kvt_ext_state *x, struct ext_job *j)
{
	struct ext_group **pg = &j->groups;

	if (j->waiters)
		return; /* the last sleeper retires them */
	while (*pg) {
		struct ext_group *g = *pg;
		uint32_t i;
		int rc = e->dev->ops->event_query(e->dev, g->ev[g->n_ev - 1]);

		if (rc == -EAGAIN) {
			pg = &g->next;
			continue;
		}
		for (i = 0; i < g->n; i++) {
			struct ext_jblk *jb = &j->b[g->idx[i]];
			struct ext_meta *m = &x->meta[jb->block];

			if (rc) {
				if (j->kind == KVT_EXT_STORE)
					ext_store_abandon(e, x, jb);
				jb_fail(j, jb, rc);
				continue;
			}
			jb->st = JB_DONE;
			j->n_open--;
			if (j->kind == KVT_EXT_STORE) {
				kvt_copy_set_present(e, jb->block, KVT_TIER_HOST);
				x->st.blocks_stored++;
				x->st.bytes_stored += x->bytes;
				if (!m->dropped) { /* dropped meanwhile: it goes at the unpin */
					m->landed = 1;
					ext_offer(e, x, jb->block, false);
				}
				ext_unpin(e, x, jb);
			} else {
				x->st.blocks_loaded++;
				x->st.bytes_loaded += x->bytes;
				ext_offer(e, x, jb->block, true); /* reuse: its HOST copy is valid */
				ext_unpin(e, x, jb); /* landed: its copies below may go */
			}
		}
		*pg = g->next;
		ext_group_free(e, g);
	}
	if (!j->n_open && !j->groups && !j->ended) {
		uint32_t i;

		j->ended = true;
		for (i = 0; i < j->n; i++)
			ext_unpin(e, x, &j->b[i]);
	}
}

/*
 * With the persistent store: every stored block is written through to NVMe (a clean copy; its
 * HOST copy stays) and, once that write completed, published as a one-block record (data
 * durable first: one kvt_nvme_sync for all of them, then the PUTs, then one commit). A block
 * whose NVMe copy went (evicted while its HOST copy stays) loses its record. Runs when the
 * engine's NVMe counters moved since the last scan (or a store landed).
 */
static void
ext_persist(struct kvt_engine *e, struct kvt_ext_state *x, bool force)
{
	uint64_t sig = e->st.blocks_moved[KVT_MOVE_HOST_TO_NVME] + e->st.evictions +
		       e->st.tier[KVT_TIER_NVME].evictions + e->st.blocks_lost + x->st.blocks_stored +
		       x->st.remote_hit_blocks;
	bool synced = false, full = false;
	uint32_t id;

	if (!e->store || (!force && sig == x->pers_sig && !x->pers_commit))
		return;
	x->pers_sig = sig;
	for (id = 0; id < x->cap_meta && id < e->cap_blocks; id++) {
		struct ext_meta *m = &x->meta[id];
		struct kvt_block *b = kvt_blk(e, id);
		uint32_t slot;

		if (!m->ext || !m->landed || m->dropped || b->dead)
			continue;
		if (kvt_copy_valid(b, KVT_TIER_NVME)) {
			if (m->published && m->pub_slot == b->slot[KVT_TIER_NVME])
				continue;
			if (!synced) {
				if (kvt_nvme_sync(e->nvme) != 0)
					break; /* nothing published over data not durable */
				synced = true;
			}
			if (ext_key(m->hash, m->tenant) &&
			    kvt_persist_ext_put(e, ext_key(m->hash, m->tenant), m->tenant, id) == 0) {
				m->published = 1;
				m->pub_slot = b->slot[KVT_TIER_NVME];
				x->pers_commit = true;
			}
			continue;
		}
		if (kvt_copy_state(b, KVT_TIER_NVME) == KVT_COPY_INFLIGHT)
			continue;
		if (m->published) {
			if (kvt_persist_ext_del(e, ext_key(m->hash, m->tenant)) == 0)
				x->pers_commit = true;
			m->published = 0;
		}
		/* write through: a clean NVMe copy of the HOST one (no waiting, no demotion) */
		if (full || !kvt_copy_valid(b, KVT_TIER_HOST) || b->busy)
			continue;
		if (kvt_reclaim(e, KVT_TIER_NVME, 1, false) != 0 ||
		    kvt_slot_alloc(e, KVT_TIER_NVME, id, &slot) != 0 ||
		    kvt_xfer_h2n(e, id, slot, false, false) != 0)
			full = true; /* the next scan tries again */
	}
	if (x->pers_commit && kvt_persist_ext_commit(e) == 0)
		x->pers_commit = false;
}

/* Process the engine's completions and advance every job. */
static void
ext_progress(struct kvt_engine *e, struct kvt_ext_state *x)
{
	uint32_t i;
	bool stored = false;

	(void)kvt_xfer_poll(e, 0);
	if (e->remote)
		kvt_reng_reap(e); /* REMOTE fetches that landed: stored blocks now */
	for (int phase = 0; phase < 2 && x->n_jobs; phase++) /* kvt_engine_poll: often none */
		for (i = 0; i < x->max_jobs; i++) {
			struct ext_job *j = &x->jobs[i];

			if (!j->used || j->ended)
				continue;
			ext_retire(e, x, j);
			(void)ext_advance_job(e, x, j, phase);
			ext_retire(e, x, j);
			stored |= j->kind == KVT_EXT_STORE;
		}
	if (stored)
		kvt_watermarks(e); /* HOST above its high watermark: demote to NVMe */
	ext_persist(e, x, false);
	kvt_reng_kick(e); /* the write-through snapshots taken: to the remote worker */
	(void)kvt_xfer_flush(e);
}

void
kvt_ext_progress(struct kvt_engine *e)
{
	if (e->ext)
		ext_progress(e, e->ext);
}

/* ---- geometry checks */

__extension__ typedef __int128 ext_i128;

/* floor(a / b) and ceil(a / b) for b > 0 */
static ext_i128
ext_fdiv(ext_i128 a, ext_i128 b)
{
	ext_i128 q = a / b;

	return (a % b != 0 && a < 0) ? q - 1 : q;
}

static ext_i128
ext_cdiv(ext_i128 a, ext_i128 b)
{
	return -ext_fdiv(-a, b);
}

/* Do strided segment families f and g (start a, length l, stride s, n blocks) overlap? */
static bool
ext_fam_overlap(uint64_t a1, uint64_t l1, uint64_t s1, uint64_t a2, uint64_t l2, uint64_t s2,
		uint32_t n, bool *unsure)
{
	ext_i128 e1 = (ext_i128)a1 + (ext_i128)(n - 1) * s1 + l1;
	ext_i128 e2 = (ext_i128)a2 + (ext_i128)(n - 1) * s2 + l2;
	ext_i128 d, kmin, kmax;

	if (e1 <= a2 || e2 <= a1)
		return false; /* extents apart */
	if (n == 1)
		return true;
	if (s1 != s2) {
		*unsure = true;
		return false;
	}
	/* block i of f meets block j of g iff -l2 < d + k * s < l1 for k = j - i, |k| < n */
	d = (ext_i128)a2 - (ext_i128)a1;
	kmin = ext_fdiv(-(ext_i128)l2 - d, s1) + 1;
	kmax = ext_cdiv((ext_i128)l1 - d, s1) - 1;
	if (kmin < -(ext_i128)(n - 1))
		kmin = -(ext_i128)(n - 1);
	if (kmax > (ext_i128)(n - 1))
		kmax = (ext_i128)(n - 1);
	return kmin <= kmax;
}

/* Exact check of two families with different strides: walk f's blocks (bounded work). */
static bool
ext_fam_overlap_walk(uint64_t a1, uint64_t l1, uint64_t s1, uint64_t a2, uint64_t l2,
		     uint64_t s2, uint32_t n)
{
	uint32_t i;

	for (i = 0; i < n; i++) {
		ext_i128 p = (ext_i128)a1 + (ext_i128)i * s1; /* [p, p + l1) */
		ext_i128 jlo, jhi;

		/* blocks j of g with a2 + j*s2 < p + l1 and a2 + j*s2 + l2 > p */
		jhi = (p + l1 - a2 - 1);
		if (jhi < 0)
			continue;
		jhi /= s2;
		jlo = p - a2 - l2 + 1;
		jlo = jlo <= 0 ? 0 : (jlo + s2 - 1) / s2;
		if (jhi > n - 1)
			jhi = n - 1;
		if (jlo <= jhi)
			return true;
	}
	return false;
}

static int
ext_check_geometry(struct kvt_engine *e, const struct kvt_ext_opts *o, struct ext_lay **out,
		   uint32_t *n_layers, uint64_t *bytes)
{
	uint64_t total = 0, sum = 0;
	struct ext_lay *lay;
	uint32_t i, k, l = 0, *ent;
	int rc = 0;

	for (i = 0; i < o->n_entries; i++) {
		const struct kvt_ext_layer *L = &o->layers[i];

		if (L->n_layers == 0 || L->block_stride == 0 || L->k_bytes == 0 || L->reserved)
			return kvt_err(-EINVAL, "kvt_ext_register: entry %u: %s", i,
				       L->n_layers == 0 ? "n_layers is 0" :
				       L->block_stride == 0 ? "block_stride is 0" :
				       L->k_bytes == 0 ? "k_bytes is 0" : "reserved is not 0");
		if (L->n_layers > 1 && L->layer_stride == 0)
			return kvt_err(-EINVAL, "kvt_ext_register: entry %u: %u layers with "
				       "layer_stride 0 (they would overlap)", i, L->n_layers);
		if ((L->v_offset == KVT_EXT_NO_V) != (L->v_bytes == 0))
			return kvt_err(-EINVAL, "kvt_ext_register: entry %u: v_offset %s but "
				       "v_bytes %llu", i, L->v_offset == KVT_EXT_NO_V ?
				       "KVT_EXT_NO_V" : "given",
				       (unsigned long long)L->v_bytes);
		if (L->base == 0)
			return kvt_err(-EINVAL, "kvt_ext_register: entry %u: base address is 0", i);
		total += L->n_layers;
		if (total > EXT_MAX_LAYERS)
			return kvt_err(-EINVAL, "kvt_ext_register: more than %u layers", EXT_MAX_LAYERS);
	}
	lay = kvt_calloc(total, sizeof *lay);
	ent = kvt_calloc(total, sizeof *ent);
	if (!lay || !ent) {
		kvt_free(lay);
		kvt_free(ent);
		return kvt_err(-ENOMEM, "kvt_ext_register: %llu layers", (unsigned long long)total);
	}
	for (i = 0; i < o->n_entries; i++) {
		const struct kvt_ext_layer *L = &o->layers[i];

		for (k = 0; k < L->n_layers; k++, l++) {
			ext_i128 end = (ext_i128)L->base + (ext_i128)k * L->layer_stride +
				       (ext_i128)(o->n_blocks - 1) * L->block_stride;
			ext_i128 ek = end + L->k_offset + L->k_bytes;
			ext_i128 ev = L->v_bytes ? end + L->v_offset + L->v_bytes : 0;

			if (ek > (ext_i128)UINT64_MAX || ev > (ext_i128)UINT64_MAX) {
				rc = kvt_err(-EINVAL, "kvt_ext_register: entry %u layer %u: block "
					     "%u's segments end past the address space", i, k,
					     o->n_blocks - 1);
				goto out;
			}
			lay[l].base = L->base + (uint64_t)k * L->layer_stride;
			lay[l].stride = L->block_stride;
			lay[l].k_off = L->k_offset;
			lay[l].v_off = L->v_bytes ? L->v_offset : 0;
			lay[l].k_bytes = L->k_bytes;
			lay[l].v_bytes = L->v_bytes;
			lay[l].dst = sum;
			ent[l] = i;
			sum += L->k_bytes + L->v_bytes;
		}
	}
	if (sum > e->block_bytes) {
		rc = kvt_err(-EINVAL, "kvt_ext_register: a block's segments hold %llu bytes, more "
			     "than the engine's block_bytes %llu (the layout sizes the slots)",
			     (unsigned long long)sum, (unsigned long long)e->block_bytes);
		goto out;
	}
	/* no two segments of any blocks overlap: families (layer, K|V) pairwise */
	{
		uint32_t nf = (uint32_t)total * 2, f, g;
		uint64_t work = 0;

		for (f = 0; f < nf && !rc; f++) {
			const struct ext_lay *A = &lay[f / 2];
			uint64_t la = f & 1 ? A->v_bytes : A->k_bytes;
			uint64_t aa = A->base + (f & 1 ? A->v_off : A->k_off);

			if (!la)
				continue;
			if (o->n_blocks > 1 && la > A->stride) {
				rc = kvt_err(-EINVAL, "kvt_ext_register: entry %u layer %u: %s of "
					     "%llu bytes exceeds block_stride %llu (blocks overlap)",
					     ent[f / 2], f / 2, f & 1 ? "V" : "K",
					     (unsigned long long)la, (unsigned long long)A->stride);
				break;
			}
			for (g = f + 1; g < nf; g++) {
				const struct ext_lay *B = &lay[g / 2];
				uint64_t lb = g & 1 ? B->v_bytes : B->k_bytes;
				uint64_t ab = B->base + (g & 1 ? B->v_off : B->k_off);
				bool unsure = false, hit;

				if (!lb)
					continue;
				hit = ext_fam_overlap(aa, la, A->stride, ab, lb, B->stride,
						      o->n_blocks, &unsure);
				if (unsure) {
					work += o->n_blocks;
					if (work > (1ull << 26)) {
						rc = kvt_err(-EINVAL, "kvt_ext_register: layers %u "
							     "and %u interleave with different "
							     "strides: too costly to verify, not "
							     "supported", f / 2, g / 2);
						break;
					}
					hit = ext_fam_overlap_walk(aa, la, A->stride, ab, lb,
								   B->stride, o->n_blocks);
				}
				if (hit) {
					rc = kvt_err(-EINVAL, "kvt_ext_register: the %s of layer %u "
						     "(entry %u) and the %s of layer %u (entry %u) "
						     "overlap for some block ids", f & 1 ? "V" : "K",
						     f / 2, ent[f / 2], g & 1 ? "V" : "K", g / 2,
						     ent[g / 2]);
					break;
				}
			}
		}
	}
out:
	kvt_free(ent);
	if (rc) {
		kvt_free(lay);
		return rc;
	}
	*out = lay;
	*n_layers = (uint32_t)total;
	*bytes = sum;
	return 0;
}

/* ---- the API */

/*
 * The persistent store's records of external blocks (stored by an earlier process, or by this
 * one before the pool was unregistered) become the pool's blocks: each checked against its
 * NVMe header (kvt_persist_ext_adopt), its NVMe copy the stored slot. One that fails the
 * check stays an ordinary record.
 */
static void
ext_adopt_all(struct kvt_engine *e, struct kvt_ext_state *x)
{
	uint32_t i, id, n = 0;

	for (i = 0; i < kvt_store_count(e->store); i++) {
		struct kvt_store_sess *rec = kvt_store_at(e->store, i);
		uint64_t hash = rec->key ^ ext_mix(0x4b56544558543031ull, rec->tenant);
		struct kvt_block *b;

		if (!kvt_persist_ext_rec(e, rec) || ext_find(x, rec->tenant, hash))
			continue;
		if (kvt_persist_ext_adopt(e, rec, &id) != 0)
			continue;
		if (ext_meta_reserve(e, x, id) != 0 || ext_insert(x, rec->tenant, hash, id) != 0) {
			kvt_blk(e, id)->refs = 0;
			kvt_block_uncache(e, id);
			continue;
		}
		b = kvt_blk(e, id);
		b->refs = 0;
		b->tslot = kvt_tenant_slot(e, rec->tenant);
		x->meta[id] = (struct ext_meta){ .hash = hash, .tenant = rec->tenant,
						 .gen = x->meta[id].gen, .ext = 1, .landed = 1,
						 .published = 1, .pub_slot = b->slot[KVT_TIER_NVME] };
		n++;
	}
	if (n)
		kvt_engine_log(e, KVT_LOG_INFO, "external pool: %u blocks found in the persistent "
			       "store %s", n, e->nvme_dir);
}


void
kvt_ext_opts_init(struct kvt_ext_opts *o, size_t size)
{
	struct kvt_ext_opts d = { 0 };

	if (!o)
		return;
	d.opts_size = size;
	d.max_jobs = 4096;
	d.removed_cap = EXT_REMOVED_CAP;
	memcpy(o, &d, size < sizeof d ? size : sizeof d);
}

static void
ext_free(struct kvt_engine *e, struct kvt_ext_state *x)
{
	if (x->s_store)
		e->dev->ops->stream_destroy(e->dev, x->s_store);
	if (x->s_load)
		e->dev->ops->stream_destroy(e->dev, x->s_load);
	kvt_free(x->lay);
	kvt_free(x->tab);
	kvt_free(x->meta);
	kvt_free(x->jobs);
	kvt_free(x->cv);
	kvt_free(x->scratch);
	kvt_free(x->gone);
	kvt_free(x->orphans);
	kvt_free(x);
}

int
kvt_ext_register(struct kvt_engine *e, const struct kvt_ext_opts *o, uint32_t *pool)
{
	struct kvt_ext_opts oo;
	struct kvt_ext_state *x;
	int rc;

	if (pool)
		*pool = 0;
	if (!e || !o || !pool)
		return kvt_err(-EINVAL, "kvt_ext_register: engine, opts and pool must not be NULL");
	if (o->opts_size < offsetof(struct kvt_ext_opts, layer_group) || o->opts_size > 4096)
		return kvt_err(-EINVAL, "kvt_ext_register: opts_size %zu (kvt_ext_opts_init)",
			       o->opts_size);
	kvt_ext_opts_init(&oo, sizeof oo);
	memcpy(&oo, o, o->opts_size < sizeof oo ? o->opts_size : sizeof oo);
	if (oo.n_blocks == 0 || oo.n_blocks > EXT_MAX_BLOCKS)
		return kvt_err(-EINVAL, "kvt_ext_register: n_blocks %u out of 1..%u", oo.n_blocks,
			       EXT_MAX_BLOCKS);
	if (oo.n_entries == 0 || oo.n_entries > KVT_EXT_MAX_ENTRIES || !oo.layers)
		return kvt_err(-EINVAL, "kvt_ext_register: %u entries%s (1..%u)", oo.n_entries,
			       oo.layers ? "" : " and layers NULL", KVT_EXT_MAX_ENTRIES);
	if (e->grp) { /* the group's own pool engine holds it (pool id g + 1) */
		uint32_t g = oo.layer_group;
		struct kvt_engine *c = kvt_grp_ext_core(e, g, "kvt_ext_register");

		if (!c)
			return -EINVAL;
		oo.layer_group = 0;
		oo.opts_size = sizeof oo;
		rc = kvt_ext_register(c, &oo, pool);
		if (rc == 0)
			*pool = g + 1;
		return rc;
	}
	if (oo.layer_group != 0)
		return kvt_err(-EINVAL, "kvt_ext_register: layer_group %u on an engine without "
			       "layer groups (only 0)", oo.layer_group);
	if (oo.max_jobs == 0 || oo.max_jobs > (1u << 20))
		return kvt_err(-EINVAL, "kvt_ext_register: max_jobs %u out of 1..%u", oo.max_jobs,
			       1u << 20);
	if (oo.removed_cap == 0)
		oo.removed_cap = EXT_REMOVED_CAP; /* an old caller's reserved zeros */
	if (oo.removed_cap > (1u << 24))
		return kvt_err(-EINVAL, "kvt_ext_register: removed_cap %u out of 1..%u",
			       oo.removed_cap, 1u << 24);
	x = kvt_calloc(1, sizeof *x);
	if (!x)
		return kvt_err(-ENOMEM, "kvt_ext_register: pool state");
	kvt_lock(e);
	if (e->ext) {
		rc = kvt_err(-EEXIST, "kvt_ext_register: a pool is already registered (one per "
			     "engine, one per layer group of a grouped engine)");
		goto fail;
	}
	if (!e->slots[KVT_TIER_HOST].n_slots) {
		rc = kvt_err(-ENODEV, "kvt_ext_register: the engine has no HOST tier (host_bytes "
			     "0): stored blocks live in HOST and NVMe");
		goto fail;
	}
	rc = ext_check_geometry(e, &oo, &x->lay, &x->n_layers, &x->bytes);
	if (rc)
		goto fail;
	{
		XXH3_state_t *hs = XXH3_createState();

		if (!hs) {
			rc = kvt_err(-ENOMEM, "kvt_ext_register: hash state");
			goto fail;
		}
		XXH3_64bits_reset(hs);
		for (uint32_t l = 0; l < x->n_layers; l++) {
			uint64_t kv[2] = { x->lay[l].k_bytes, x->lay[l].v_bytes };

			XXH3_64bits_update(hs, kv, sizeof kv);
		}
		x->geo_fp = XXH3_64bits_digest(hs);
		XXH3_freeState(hs);
	}
	x->n_blocks = oo.n_blocks;
	x->max_jobs = oo.max_jobs;
	x->next_id = 1;
	x->jobs = kvt_calloc(oo.max_jobs, sizeof *x->jobs);
	x->gone_cap = oo.removed_cap;
	x->gone = kvt_calloc(x->gone_cap, sizeof *x->gone);
	if (!x->jobs || !x->gone) {
		rc = kvt_err(-ENOMEM, "kvt_ext_register: %u job records and the removal ring",
			     oo.max_jobs);
		goto fail;
	}
	rc = ext_meta_reserve(e, x, e->cap_blocks ? e->cap_blocks - 1 : 0);
	if (!rc)
		rc = e->dev->ops->stream_create(e->dev, &x->s_store);
	if (!rc)
		rc = e->dev->ops->stream_create(e->dev, &x->s_load);
	if (rc)
		goto fail;
	e->ext = x;
	if (e->store)
		ext_adopt_all(e, x);
	kvt_unlock(e);
	*pool = EXT_POOL_ID;
	return 0;
fail:
	kvt_unlock(e);
	ext_free(e, x);
	return rc;
}

/* Wait for every job's copies (lock held: the streams need nothing of the engine). */
static void
ext_quiesce(struct kvt_engine *e, struct kvt_ext_state *x)
{
	uint32_t i;

	(void)e->dev->ops->stream_sync(e->dev, x->s_store);
	(void)e->dev->ops->stream_sync(e->dev, x->s_load);
	for (i = 0; i < x->max_jobs; i++)
		if (x->jobs[i].used)
			ext_retire(e, x, &x->jobs[i]);
}

/* Blocks of @x: no longer pool blocks, stay cached (landed) or go (not landed). */
static void
ext_detach_all(struct kvt_engine *e, struct kvt_ext_state *x, bool destroying)
{
	uint32_t i;

	for (i = 0; i < x->max_jobs; i++) {
		struct ext_job *j = &x->jobs[i];
		uint32_t k;

		if (!j->used)
			continue;
		for (k = 0; k < j->n && !destroying; k++) {
			struct ext_jblk *jb = &j->b[k];

			if (j->kind == KVT_EXT_STORE && (jb->st == JB_WAIT || jb->st == JB_COPY) &&
			    x->meta[jb->block].gen == jb->gen && x->meta[jb->block].ext)
				ext_store_abandon(e, x, jb);
		}
		if (!destroying)
			ext_job_release(e, x, j);
	}
}

int
kvt_ext_unregister(struct kvt_engine *e, uint32_t pool)
{
	struct kvt_ext_state *x;
	uint32_t id;

	if (!e)
		return kvt_err(-EINVAL, "kvt_ext_unregister: engine is NULL");
	e = ext_route(e, &pool);
	kvt_lock(e);
	x = ext_get(e, pool, "kvt_ext_unregister");
	if (!x) {
		kvt_unlock(e);
		return -ENOENT;
	}
	if (x->closing) {
		kvt_unlock(e);
		return kvt_err(-ENOENT, "kvt_ext_unregister: pool %u is being unregistered by "
			       "another call", pool);
	}
	x->closing = true; /* no new REMOTE fetch; a second unregister is refused */
	if (e->remote) {
		/* REMOTE fetches in flight write HOST slots of the pool's blocks: let them land
		 * (each bounded by the client's timeouts) */
		kvt_unlock(e);
		kvt_reng_drain(e);
		kvt_lock(e);
		kvt_reng_reap(e);
	}
	for (uint32_t us = 5;;) {
		bool sleepers = false;

		for (id = 0; id < x->max_jobs; id++)
			sleepers |= x->jobs[id].used && x->jobs[id].waiters;
		if (!sleepers)
			break;
		kvt_unlock(e);
		ext_nap(&us);
		kvt_lock(e);
	}
	(void)kvt_xfer_poll(e, 0);
	ext_quiesce(e, x);
	ext_detach_all(e, x, false);
	/* stored blocks stay cached in their tiers, unreachable by key: free them, as this
	 * version keeps no index without a pool. Their records go now (a block whose transfer
	 * is in flight is freed only when it ends, after the pool is gone), in one commit. */
	for (id = 0; id < x->cap_meta && id < e->cap_blocks; id++)
		if (x->meta[id].ext) {
			struct ext_meta *m = &x->meta[id];

			if (m->published && e->store) {
				if (kvt_persist_ext_del(e, ext_key(m->hash, m->tenant)) == 0)
					x->pers_commit = true;
				m->published = 0;
			}
			kvt_blk(e, id)->protect = 0;
			kvt_block_uncache(e, id);
		}
	if (x->pers_commit && e->store && kvt_persist_ext_commit(e) == 0)
		x->pers_commit = false;
	e->ext = NULL;
	kvt_unlock(e);
	ext_free(e, x);
	return 0;
}

void
kvt_ext_fini(struct kvt_engine *e)
{
	struct kvt_ext_state *x = e->ext;
	uint32_t i;

	if (!x)
		return;
	(void)e->dev->ops->stream_sync(e->dev, x->s_store);
	(void)e->dev->ops->stream_sync(e->dev, x->s_load);
	if (e->store) {
		/*
		 * Every stored block is published before the engine goes: the first scan starts
		 * the write-through of the blocks only in HOST (ext_persist), the drain lets those
		 * writes land, the second scan publishes them (data synced first) and commits. A
		 * write that fails or finds no NVMe room leaves its block unpublished: the next
		 * process does not find it (a miss, never wrong bytes).
		 */
		kvt_lock(e);
		(void)kvt_xfer_poll(e, 0);
		for (i = 0; i < x->max_jobs; i++)
			if (x->jobs[i].used)
				ext_retire(e, x, &x->jobs[i]);
		ext_persist(e, x, true);
		(void)kvt_xfer_flush(e);
		kvt_unlock(e);
		(void)kvt_engine_drain(e);
		kvt_lock(e);
		(void)kvt_xfer_poll(e, 0);
		ext_persist(e, x, true);
		kvt_unlock(e);
	}
	for (i = 0; i < x->max_jobs; i++) {
		struct ext_job *j = &x->jobs[i];

		while (j->used && j->groups) {
			struct ext_group *g = j->groups;

			j->groups = g->next;
			ext_group_free(e, g);
		}
		if (j->used && j->wait_ev)
			e->dev->ops->event_destroy(e->dev, j->wait_ev);
		if (j->used)
			kvt_free(j->b);
	}
	e->ext = NULL;
	ext_free(e, x);
}

/* Common checks of store and load; @what names the call. */
static int
ext_check_ids(struct kvt_ext_state *x, const uint64_t *hashes, const uint32_t *ids, size_t n,
	      const char *what)
{
	size_t i;

	if (n && (!hashes || !ids))
		return kvt_err(-EINVAL, "%s: hashes and block_ids must not be NULL (n %zu)", what,
			       n);
	if (n > EXT_MAX_N)
		return kvt_err(-EINVAL, "%s: n %zu > %u blocks per call", what, n, EXT_MAX_N);
	for (i = 0; i < n; i++)
		if (ids[i] >= x->n_blocks)
			return kvt_err(-EINVAL, "%s: block_ids[%zu] = %u, the pool has %u blocks",
				       what, i, ids[i], x->n_blocks);
	if (n > 1) {
		/* duplicates: a bitmap over the ids, a sort of the hashes */
		uint64_t *bm = kvt_calloc((x->n_blocks + 63) / 64, sizeof *bm);
		int rc = 0;

		if (!bm)
			return kvt_err(-ENOMEM, "%s: duplicate check", what);
		for (i = 0; i < n && !rc; i++) {
			if (bm[ids[i] / 64] >> (ids[i] % 64) & 1)
				rc = kvt_err(-EINVAL, "%s: block id %u given twice", what, ids[i]);
			bm[ids[i] / 64] |= 1ull << (ids[i] % 64);
		}
		kvt_free(bm);
		if (rc)
			return rc;
	}
	return 0;
}

static int
ext_cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static int
ext_check_hash_dups(const uint64_t *hashes, size_t n, const char *what)
{
	uint64_t *s;
	size_t i;
	int rc = 0;

	if (n < 2)
		return 0;
	s = kvt_malloc(n * sizeof *s);
	if (!s)
		return kvt_err(-ENOMEM, "%s: duplicate check", what);
	memcpy(s, hashes, n * sizeof *s);
	qsort(s, n, sizeof *s, ext_cmp_u64);
	for (i = 1; i < n && !rc; i++)
		if (s[i] == s[i - 1])
			rc = kvt_err(-EINVAL, "%s: hash %#llx given twice", what,
				     (unsigned long long)s[i]);
	kvt_free(s);
	return rc;
}

static struct ext_job *
ext_job_new(struct kvt_ext_state *x, uint32_t kind, size_t n, const char *what, int *rc)
{
	uint32_t i;

	if (x->n_jobs >= x->max_jobs) {
		*rc = kvt_err(-EAGAIN, "%s: %u jobs in flight or unreported (max_jobs): poll them",
			      what, x->n_jobs);
		return NULL;
	}
	for (i = 0; i < x->max_jobs && x->jobs[i].used; i++)
		;
	x->jobs[i].b = kvt_calloc(n ? n : 1, sizeof *x->jobs[i].b);
	if (!x->jobs[i].b) {
		*rc = kvt_err(-ENOMEM, "%s: job of %zu blocks", what, n);
		return NULL;
	}
	x->jobs[i].used = true;
	x->jobs[i].kind = kind;
	x->jobs[i].n = (uint32_t)n;
	x->jobs[i].n_open = (uint32_t)n;
	x->jobs[i].id = x->next_id++;
	x->n_jobs++;
	return &x->jobs[i];
}

int
kvt_ext_store(struct kvt_engine *e, uint32_t pool, uint32_t tenant, const uint64_t *hashes,
	      const uint32_t *block_ids, size_t n, void *stream, uint64_t *job)
{
	struct kvt_ext_state *x;
	struct ext_job *j;
	size_t i;
	int rc;

	if (job)
		*job = 0;
	if (!e || !job)
		return kvt_err(-EINVAL, "kvt_ext_store: engine and job must not be NULL");
	e = ext_route(e, &pool);
	kvt_lock(e);
	x = ext_get(e, pool, "kvt_ext_store");
	if (!x) {
		kvt_unlock(e);
		return -ENOENT;
	}
	rc = ext_check_ids(x, hashes, block_ids, n, "kvt_ext_store");
	if (!rc)
		rc = ext_check_hash_dups(hashes, n, "kvt_ext_store");
	j = rc ? NULL : ext_job_new(x, KVT_EXT_STORE, n, "kvt_ext_store", &rc);
	if (!j)
		goto out;
	j->tenant = tenant;
	if (stream) {
		rc = e->dev->ops->event_create(e->dev, &j->wait_ev);
		if (!rc)
			rc = e->dev->ops->event_record(e->dev, j->wait_ev,
						       (struct kvt_stream *)stream);
		if (rc) {
			ext_job_release(e, x, j);
			goto out;
		}
	}
	for (i = 0; i < n; i++) {
		struct ext_jblk *jb = &j->b[i];
		struct ext_ent *t = ext_find(x, tenant, hashes[i]);
		struct kvt_block *b;
		uint32_t id;

		jb->caller = block_ids[i];
		jb->block = KVT_NIL;
		if (t && x->meta[t->block].fetching) {
			ext_detach_fetch(x, t); /* the caller's bytes win over a fetch that may miss */
			t = NULL;
		}
		if (t) {
			jb->st = JB_SKIP;
			j->n_skipped++;
			j->n_open--;
			ext_offer(e, x, t->block, true); /* stored again: reuse evidence */
			continue;
		}
		rc = kvt_block_new(e, KVT_EXT_SEQ, 0, &id);
		if (!rc)
			rc = ext_meta_reserve(e, x, id);
		if (!rc) {
			rc = ext_insert(x, tenant, hashes[i], id);
			if (rc) {
				kvt_blk(e, id)->refs = 0;
				kvt_block_uncache(e, id);
			}
		}
		if (rc) {
			/* no record: this block fails, the others go on */
			jb_fail(j, jb, rc);
			rc = 0;
			continue;
		}
		b = kvt_blk(e, id);
		b->refs = 0;
		b->written = 1;
		b->tslot = kvt_tenant_slot(e, tenant);
		x->meta[id] = (struct ext_meta){ .hash = hashes[i], .tenant = tenant,
						 .gen = x->meta[id].gen, .ext = 1 };
		jb->block = id;
		jb->gen = x->meta[id].gen;
		ext_pin(e, x, jb);
	}
	x->st.blocks_skipped += j->n_skipped;
	*job = j->id;
	ext_progress(e, x);
out:
	kvt_unlock(e);
	return rc;
}

/*
 * The leading run of @hashes[0..n) stored for @tenant (landed, a valid HOST or NVMe copy): its
 * length; *@slow (may be NULL) gets the slowest tier it comes from (KVT_TIER_COUNT: empty).
 * With a REMOTE tier each hit is marked with lookup_gen (ext_fetch makes no room from it).
 */
static size_t
ext_run(struct kvt_engine *e, struct kvt_ext_state *x, uint32_t tenant, const uint64_t *hashes,
	size_t n, enum kvt_tier *slow)
{
	enum kvt_tier tr = KVT_TIER_COUNT;
	size_t i;

	for (i = 0; i < n; i++) {
		struct ext_ent *t = ext_find(x, tenant, hashes[i]);
		const struct kvt_block *b;

		if (!t || !x->meta[t->block].landed)
			break;
		b = kvt_blk(e, t->block);
		if (kvt_copy_valid(b, KVT_TIER_HOST)) {
			if (tr == KVT_TIER_COUNT)
				tr = KVT_TIER_HOST;
		} else if (kvt_copy_valid(b, KVT_TIER_NVME)) {
			tr = KVT_TIER_NVME;
		} else {
			break;
		}
		if (e->remote)
			x->meta[t->block].hit_gen = x->lookup_gen;
	}
	if (slow)
		*slow = tr;
	return i;
}

int
kvt_ext_lookup(struct kvt_engine *e, uint32_t pool, uint32_t tenant, const uint64_t *hashes,
	       size_t n, size_t *hits, enum kvt_tier *tier)
{
	struct kvt_ext_state *x;
	enum kvt_tier slow;
	size_t i;

	if (hits)
		*hits = 0;
	if (tier)
		*tier = KVT_TIER_COUNT;
	if (!e || !hits || (n && !hashes))
		return kvt_err(-EINVAL, "kvt_ext_lookup: engine, hits and hashes (n %zu) must not "
			       "be NULL", n);
	e = ext_route(e, &pool);
	kvt_lock(e);
	x = ext_get(e, pool, "kvt_ext_lookup");
	if (!x) {
		kvt_unlock(e);
		return -ENOENT;
	}
	if (e->remote) {
		kvt_reng_reap(e); /* REMOTE fetches that landed are hits now */
		x->lookup_gen++;
	}
	i = ext_run(e, x, tenant, hashes, n, &slow);
	x->st.lookups++;
	x->st.lookup_hashes += n;
	x->st.lookup_hits += i;
	if (i < n && e->remote)
		(void)ext_fetch(e, x, tenant, hashes + i, n - i); /* the rest, from REMOTE */
	kvt_unlock(e);
	*hits = i;
	if (tier)
		*tier = slow;
	return 0;
}

int
kvt_ext_inflight(struct kvt_engine *e, uint32_t pool, uint32_t tenant, const uint64_t *hashes,
		 size_t n, size_t *hits, size_t *pending)
{
	struct kvt_ext_state *x;
	size_t i, k;

	if (hits)
		*hits = 0;
	if (pending)
		*pending = 0;
	if (!e || !hits || !pending || (n && !hashes))
		return kvt_err(-EINVAL, "kvt_ext_inflight: engine, hits, pending and hashes (n %zu) "
			       "must not be NULL", n);
	e = ext_route(e, &pool);
	kvt_lock(e);
	x = ext_get(e, pool, "kvt_ext_inflight");
	if (!x) {
		kvt_unlock(e);
		return -ENOENT;
	}
	if (e->remote)
		kvt_reng_reap(e); /* fetches that landed are hits now */
	i = ext_run(e, x, tenant, hashes, n, NULL);
	for (k = i; k < n; k++) {
		struct ext_ent *t = ext_find(x, tenant, hashes[k]);

		if (!t || x->meta[t->block].landed)
			break; /* absent, or landed after a gap: the run of blocks on their way ends */
	}
	kvt_unlock(e);
	*hits = i;
	*pending = k - i;
	return 0;
}

int
kvt_ext_removed(struct kvt_engine *e, uint32_t pool, struct kvt_ext_removal *out, size_t max,
		uint64_t *lost)
{
	struct kvt_ext_state *x;
	size_t i;

	if (lost)
		*lost = 0;
	if (!e || !lost || (max && !out))
		return kvt_err(-EINVAL, "kvt_ext_removed: engine, lost and out (max %zu) must not "
			       "be NULL", max);
	if (max > INT_MAX)
		max = INT_MAX;
	e = ext_route(e, &pool);
	kvt_lock(e);
	x = ext_get(e, pool, "kvt_ext_removed");
	if (!x) {
		kvt_unlock(e);
		return -ENOENT;
	}
	for (i = 0; i < max && x->gone_n; i++) {
		out[i] = x->gone[x->gone_head];
		x->gone_head = (x->gone_head + 1) % x->gone_cap;
		x->gone_n--;
	}
	*lost = x->gone_lost;
	x->gone_lost = 0;
	kvt_unlock(e);
	return (int)i;
}

int
kvt_ext_load(struct kvt_engine *e, uint32_t pool, uint32_t tenant, const uint64_t *hashes,
	     const uint32_t *block_ids, size_t n, uint32_t flags, uint64_t *job)
{
	struct kvt_ext_state *x;
	struct ext_job *j;
	size_t i;
	int rc;

	if (job)
		*job = 0;
	if (!e || !job)
		return kvt_err(-EINVAL, "kvt_ext_load: engine and job must not be NULL");
	if (flags & ~KVT_EXT_LAYERWISE)
		return kvt_err(-EINVAL, "kvt_ext_load: unknown flags %#x", flags);
	e = ext_route(e, &pool);
	kvt_lock(e);
	x = ext_get(e, pool, "kvt_ext_load");
	if (!x) {
		kvt_unlock(e);
		return -ENOENT;
	}
	rc = ext_check_ids(x, hashes, block_ids, n, "kvt_ext_load");
	j = rc ? NULL : ext_job_new(x, KVT_EXT_LOAD, n, "kvt_ext_load", &rc);
	if (!j)
		goto out;
	j->tenant = tenant;
	j->flags = flags;
	for (i = 0; i < n; i++) {
		struct ext_jblk *jb = &j->b[i];
		struct ext_ent *t = ext_find(x, tenant, hashes[i]);

		jb->caller = block_ids[i];
		jb->block = KVT_NIL;
		if (!t || !x->meta[t->block].landed) {
			jb_fail(j, jb, -ENOENT);
			continue;
		}
		jb->block = t->block;
		jb->gen = x->meta[t->block].gen;
		ext_pin(e, x, jb);
		for (int tr = KVT_TIER_HOST; tr < KVT_TIER_COUNT; tr++)
			if (kvt_copy_valid(kvt_blk(e, t->block), tr))
				e->evict[tr].ops->access(&e->evict[tr], t->block);
	}
	*job = j->id;
	ext_progress(e, x);
out:
	kvt_unlock(e);
	return rc;
}

int
kvt_ext_poll(struct kvt_engine *e, uint32_t pool, struct kvt_ext_done *done, size_t cap,
	     struct kvt_ext_fail *fails, size_t fails_cap)
{
	struct kvt_ext_state *x;
	size_t nf = 0, nd = 0;
	uint32_t i;
	int rc = 0;

	if (!e || (cap && !done) || (fails_cap && !fails))
		return kvt_err(-EINVAL, "kvt_ext_poll: NULL engine, or NULL done/fails with a "
			       "capacity");
	e = ext_route(e, &pool);
	kvt_lock(e);
	x = ext_get(e, pool, "kvt_ext_poll");
	if (!x) {
		kvt_unlock(e);
		return -ENOENT;
	}
	ext_progress(e, x);
	for (i = 0; i < x->max_jobs && nd < cap; i++) {
		struct ext_job *j = &x->jobs[i];
		struct kvt_ext_done *d;
		uint32_t k;

		if (!j->used || !j->ended || j->waiters)
			continue;
		if (nf + j->n_failed > fails_cap) {
			if (nd == 0) {
				memset(&done[0], 0, sizeof done[0]);
				done[0].job = j->id;
				done[0].kind = j->kind;
				done[0].n_blocks = j->n;
				done[0].n_failed = j->n_failed;
				rc = kvt_err(-ENOSPC, "kvt_ext_poll: job %llu has %u failed blocks, "
					     "fails_cap is %zu", (unsigned long long)j->id,
					     j->n_failed, fails_cap);
			}
			break;
		}
		d = &done[nd++];
		d->job = j->id;
		d->status = j->status;
		d->kind = j->kind;
		d->n_blocks = j->n;
		d->n_failed = j->n_failed;
		d->n_skipped = j->n_skipped;
		d->failed_first = (uint32_t)nf;
		for (k = 0; k < j->n; k++)
			if (j->b[k].st == JB_FAIL) {
				fails[nf].block_id = j->b[k].caller;
				fails[nf++].err = j->b[k].err;
			}
		x->st.blocks_failed += j->n_failed;
		if (j->kind == KVT_EXT_STORE)
			x->st.store_jobs++;
		else
			x->st.load_jobs++;
		ext_job_release(e, x, j);
	}
	kvt_unlock(e);
	return rc ? rc : (int)nd;
}

/* Wait (the lock released while asleep) until job @id has ended or, with @layer != UINT32_MAX,
 * until all its blocks are issued and layer @layer landed. */
static int
ext_wait(struct kvt_engine *e, uint32_t pool, uint64_t id, uint32_t layer, uint32_t timeout_ms,
	 void *stream, const char *fn)
{
	uint64_t deadline = kvt_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	uint32_t us = 5;
	int rc;

	e = ext_route(e, &pool);
	kvt_lock(e);
	for (;;) {
		struct kvt_ext_state *x = ext_get(e, pool, fn);
		struct ext_job *j;

		if (!x) {
			rc = -ENOENT;
			break;
		}
		j = ext_job_find(x, id);
		if (!j) {
			rc = kvt_err(-ENOENT, "%s: no job %llu (never issued, or already reported "
				     "by kvt_ext_poll)", fn, (unsigned long long)id);
			break;
		}
		if (layer != UINT32_MAX && (j->kind != KVT_EXT_LOAD || layer >= x->n_layers)) {
			rc = kvt_err(-EINVAL, "%s: %s", fn, j->kind != KVT_EXT_LOAD ?
				     "a store job has no layers to wait for" : "layer out of range");
			break;
		}
		ext_progress(e, x);
		if (j->ended) {
			rc = 0;
			break;
		}
		if (layer != UINT32_MAX && (j->flags & KVT_EXT_LAYERWISE)) {
			/* every block issued (or failed), and layer @layer of every group done */
			bool issued = true, landed = true;
			struct ext_group *g;
			uint32_t k;

			for (k = 0; k < j->n && issued; k++)
				issued = j->b[k].st >= JB_COPY;
			for (g = j->groups; g && issued && landed; g = g->next)
				landed = e->dev->ops->event_query(e->dev, g->ev[layer]) != -EAGAIN;
			if (issued && stream) {
				rc = 0;
				for (g = j->groups; g && !rc; g = g->next)
					rc = e->dev->ops->stream_wait_event(
						e->dev, (struct kvt_stream *)stream, g->ev[layer]);
				break;
			}
			if (issued && landed) {
				rc = 0;
				break;
			}
		}
		if (timeout_ms != UINT32_MAX && kvt_now_ns() >= deadline) {
			rc = 1;
		} else {
			/* copies in flight: sleep on the oldest unfinished event, the lock released
			 * (the group stays while j->waiters is set); else nap and look again */
			struct kvt_event *ev = NULL;
			struct ext_group *g;

			for (g = j->groups; g && !ev; g = g->next) {
				struct kvt_event *c = g->ev[layer != UINT32_MAX &&
							    (j->flags & KVT_EXT_LAYERWISE) ?
							    layer : g->n_ev - 1];

				if (e->dev->ops->event_query(e->dev, c) == -EAGAIN)
					ev = c;
			}
			if (ev && timeout_ms) {
				j->waiters++;
				kvt_unlock(e);
				(void)e->dev->ops->event_sync(e->dev, ev);
				kvt_lock(e);
				j->waiters--;
				continue;
			}
			rc = 0;
		}
		if (rc) {
			rc = timeout_ms ? kvt_err(-ETIMEDOUT, "%s: job %llu not done after %u ms",
						  fn, (unsigned long long)id, timeout_ms) :
					  kvt_err(-ETIMEDOUT, "%s: job %llu not done", fn,
						  (unsigned long long)id);
			break;
		}
		kvt_unlock(e);
		ext_nap(&us);
		kvt_lock(e);
	}
	kvt_unlock(e);
	return rc;
}

int
kvt_ext_wait(struct kvt_engine *e, uint32_t pool, uint64_t job, uint32_t timeout_ms)
{
	if (!e)
		return kvt_err(-EINVAL, "kvt_ext_wait: engine is NULL");
	return ext_wait(e, pool, job, UINT32_MAX, timeout_ms == UINT32_MAX ? timeout_ms - 1 :
			timeout_ms, NULL, "kvt_ext_wait");
}

int
kvt_ext_wait_layer(struct kvt_engine *e, uint32_t pool, uint64_t job, uint32_t layer,
		   void *stream)
{
	if (!e)
		return kvt_err(-EINVAL, "kvt_ext_wait_layer: engine is NULL");
	if (layer == UINT32_MAX)
		return kvt_err(-EINVAL, "kvt_ext_wait_layer: layer out of range");
	return ext_wait(e, pool, job, layer, UINT32_MAX, stream, "kvt_ext_wait_layer");
}

enum ext_op { EXT_TOUCH, EXT_DROP, EXT_HOLD, EXT_RELEASE };

/* Remember held block @id, out of the index, for kvt_ext_release (rare: a drop or clear of a
 * block a scheduler promised to load). Returns false when memory is refused (the hold is then
 * given up: the block goes when its jobs end). */
static bool
ext_orphan_add(struct kvt_ext_state *x, uint32_t id)
{
	if (x->n_orphans == x->cap_orphans) {
		uint32_t ncap = x->cap_orphans ? 2 * x->cap_orphans : 16;
		uint32_t *no = kvt_realloc(x->orphans, ncap * sizeof *no);

		if (!no)
			return false;
		x->orphans = no;
		x->cap_orphans = ncap;
	}
	x->orphans[x->n_orphans++] = id;
	return true;
}

/*
 * Stored (or being stored) block @id of entry @t stops being found (a drop, a clear): out of
 * the index at once (lookups, loads and holds do not find it, a store of its hash stores
 * anew), reported removed if it had landed, its persistent record deleted; the block itself
 * is freed now, or, while a job pins it or a hold keeps it, at the last unpin / release
 * (dropped; a held one is found by kvt_ext_release among the orphans).
 */
static void
ext_forget(struct kvt_engine *e, struct kvt_ext_state *x, struct ext_ent *t)
{
	uint32_t id = t->block;
	struct ext_meta *m = &x->meta[id];

	t->block = EXT_TOMB;
	x->n--;
	x->tombs++;
	if (m->landed)
		ext_gone_push(x, m->tenant, m->hash);
	m->landed = 0; /* so kvt_ext_block_freed reports it no second time */
	m->dropped = 1;
	if (m->published && e->store) {
		if (kvt_persist_ext_del(e, ext_key(m->hash, m->tenant)) == 0)
			x->pers_commit = true;
		m->published = 0;
	}
	if (m->holds && !ext_orphan_add(x, id)) {
		m->holds = 0; /* no room to remember it: the hold ends here */
		if (!m->jpins)
			kvt_blk(e, id)->protect = 0;
	}
	if (!m->jpins && !m->holds)
		kvt_block_uncache(e, id); /* freed now, or when its transfer in flight ends */
}

/* Held block @id of (@tenant, @hash): the index's, or an orphan (kvt_ext_release). */
static uint32_t
ext_held(struct kvt_ext_state *x, uint32_t tenant, uint64_t hash, uint32_t *orphan_at)
{
	struct ext_ent *t;

	*orphan_at = UINT32_MAX;
	for (uint32_t i = 0; i < x->n_orphans; i++) {
		const struct ext_meta *m = &x->meta[x->orphans[i]];

		if (m->hash == hash && m->tenant == tenant && m->holds) {
			*orphan_at = i; /* the older hold first */
			return x->orphans[i];
		}
	}
	t = ext_find(x, tenant, hash);
	return t && x->meta[t->block].holds ? t->block : KVT_NIL;
}

static int
ext_hint(struct kvt_engine *e, uint32_t pool, uint32_t tenant, const uint64_t *hashes,
	 size_t n, enum ext_op op, const char *fn)
{
	struct kvt_ext_state *x;
	size_t i;
	int found = 0;

	if (!e || (n && !hashes))
		return kvt_err(-EINVAL, "%s: engine and hashes (n %zu) must not be NULL", fn, n);
	if (n > (size_t)INT32_MAX)
		return kvt_err(-EINVAL, "%s: n %zu too large", fn, n);
	e = ext_route(e, &pool);
	kvt_lock(e);
	x = ext_get(e, pool, fn);
	if (!x) {
		kvt_unlock(e);
		return -ENOENT;
	}
	for (i = 0; i < n; i++) {
		struct ext_ent *t = ext_find(x, tenant, hashes[i]);
		struct ext_meta *m;
		uint32_t id;
		int tr;

		if (op == EXT_DROP && t && x->meta[t->block].fetching) {
			ext_detach_fetch(x, t); /* dropped: it must not land */
			continue;
		}
		if (op == EXT_RELEASE) {
			uint32_t at;

			id = ext_held(x, tenant, hashes[i], &at);
			if (id == KVT_NIL)
				continue;
			m = &x->meta[id];
			found++;
			if (--m->holds)
				continue;
			if (at != UINT32_MAX) /* its last hold: no longer an orphan */
				x->orphans[at] = x->orphans[--x->n_orphans];
			if (m->jpins)
				continue;
			kvt_blk(e, id)->protect = 0;
			if (m->dropped)
				kvt_block_uncache(e, id);
			continue;
		}
		if (!t || !x->meta[t->block].landed) {
			if (op == EXT_HOLD)
				break; /* the leading run only: the caller knows what it holds */
			continue;
		}
		id = t->block;
		found++;
		if (op == EXT_DROP) {
			ext_forget(e, x, t);
			continue;
		}
		if (op == EXT_HOLD) {
			/* as a job's pin: no copy below HBM that is its only one is evicted, a
			 * demotion in flight keeps its HOST copy */
			x->meta[id].holds++;
			kvt_blk(e, id)->protect = 1;
			kvt_blk(e, id)->wanted = 1;
		}
		/* a touch, and a hold (a use too): the eviction policy sees an access */
		for (tr = KVT_TIER_HOST; tr < KVT_TIER_COUNT; tr++)
			if (kvt_copy_valid(kvt_blk(e, id), tr))
				e->evict[tr].ops->access(&e->evict[tr], id);
	}
	kvt_unlock(e);
	return found;
}

int
kvt_ext_touch(struct kvt_engine *e, uint32_t pool, uint32_t tenant, const uint64_t *hashes,
	      size_t n)
{
	return ext_hint(e, pool, tenant, hashes, n, EXT_TOUCH, "kvt_ext_touch");
}

int
kvt_ext_drop(struct kvt_engine *e, uint32_t pool, uint32_t tenant, const uint64_t *hashes,
	     size_t n)
{
	return ext_hint(e, pool, tenant, hashes, n, EXT_DROP, "kvt_ext_drop");
}

int
kvt_ext_hold(struct kvt_engine *e, uint32_t pool, uint32_t tenant, const uint64_t *hashes,
	     size_t n)
{
	return ext_hint(e, pool, tenant, hashes, n, EXT_HOLD, "kvt_ext_hold");
}

int
kvt_ext_release(struct kvt_engine *e, uint32_t pool, uint32_t tenant, const uint64_t *hashes,
		size_t n)
{
	return ext_hint(e, pool, tenant, hashes, n, EXT_RELEASE, "kvt_ext_release");
}

int
kvt_ext_clear(struct kvt_engine *e, uint32_t pool, uint32_t tenant)
{
	struct kvt_ext_state *x;
	int n = 0;

	if (!e)
		return kvt_err(-EINVAL, "kvt_ext_clear: engine is NULL");
	e = ext_route(e, &pool);
	kvt_lock(e);
	x = ext_get(e, pool, "kvt_ext_clear");
	if (!x) {
		kvt_unlock(e);
		return -ENOENT;
	}
	for (uint32_t id = 0; id < x->cap_meta; id++) {
		struct ext_meta *m = &x->meta[id];

		struct ext_ent *t;

		if (!m->ext || m->dropped || (tenant != KVT_EXT_ALL_TENANTS && m->tenant != tenant))
			continue;
		t = ext_find(x, m->tenant, m->hash);
		if (!t || t->block != id)
			continue; /* not the pool's entry (cannot happen: every live block is) */
		if (m->fetching) {
			ext_detach_fetch(x, t); /* it must not land */
			continue;
		}
		n += m->landed; /* a store in flight goes at its last unpin, never landed */
		ext_forget(e, x, t);
	}
	kvt_unlock(e);
	return n;
}

int
kvt_ext_stats(struct kvt_engine *e, uint32_t pool, struct kvt_ext_stats *out)
{
	struct kvt_ext_state *x;
	struct kvt_ext_stats s;

	if (!e || !out || out->size < sizeof(size_t) || out->size > 4096)
		return kvt_err(-EINVAL, "kvt_ext_stats: NULL, or size not set");
	e = ext_route(e, &pool);
	kvt_lock(e);
	x = ext_get(e, pool, "kvt_ext_stats");
	if (!x) {
		kvt_unlock(e);
		return -ENOENT;
	}
	s = x->st;
	s.stored_blocks = 0;
	s.persisted_blocks = 0;
	for (uint32_t id = 0; id < x->cap_meta; id++) {
		s.stored_blocks += x->meta[id].ext && x->meta[id].landed;
		s.persisted_blocks += x->meta[id].ext && x->meta[id].published;
	}
	kvt_unlock(e);
	s.size = out->size;
	memcpy(out, &s, out->size < sizeof s ? out->size : sizeof s);
	return 0;
}
