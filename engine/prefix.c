/* SPDX-License-Identifier: MIT */
/*
 * engine/prefix.c - prefix sharing: the content-addressed index of sealed blocks.
 *
 * A sealed block is a full block whose tokens are all known. Its key is a hash chain:
 *     h(block i) = XXH3-128(h(block i-1) || tokens of block i || m)
 *     m = XXH3-128(u32 tenant || u32 0 || u64 salt || u64 extra key)   (kvt_prefix_salt)
 * with h(block -1) = 0, so a key names the whole prefix up to and including the block. The
 * tenant is hashed WITH the salt (a fixed-width input, so distinct (tenant, salt, extra key)
 * triples are distinct inputs): no salt value a caller picks makes two tenants' keys equal
 * (the salt used to stand in for the tenant, and tenant 8 with salt (1 << 63) | 1 met tenant
 * 1). Different adapters / model revisions (different extra keys) never meet either. And
 * every hit compares the entry's tenant (its creator's, kept in the pool with the tokens once
 * the creator dropped it) with the caller's: isolation never rests on the hash alone. The key
 * lives in the block record (struct kvt_block.hash, 16 bytes, also what the NVMe store can use
 * to find a block by content after a restart).
 *
 * The index maps key -> block id (open addressing, linear probing, tombstones; the key itself
 * is read from the block record, not stored twice) over a table of any size (a key's home is
 * its hash scaled to the table, not masked), kept between 70% and 80% full: when entries and
 * tombstones would pass 80%, the live entries are rehashed into a table they fill to 70% (it
 * grows by about a seventh, or shrinks after many removals). 4-byte entries thus cost 5 to
 * 5.7 bytes per indexed block; a failed lookup probes about 13 entries at 80% (linear probing:
 * (1 + 1 / (1 - load)^2) / 2), each a read of a block record's key. It can reach each sealed
 * block's tokens: a
 * lookup that finds the key compares the tokens too, so a hash collision is counted and
 * answered as a miss, never with another prefix's KV. Tokens are kept once: while the sequence
 * that created the block (b->seq, position b->index) holds it, the entry borrows that
 * sequence's token array (tok == KVT_NIL); when that sequence drops the block while it stays
 * indexed (cached, or shared by others), kvt_prefix_detach() gives the entry its own copy in a
 * pool of tokens_per_block-sized entries (no allocation per block; the pool keeps its high
 * water mark). An entry is 4 bytes: the key is read from the block record, and an entry with
 * its own tokens names its pool entry, whose pool_block names the block (KVT_PFX_OWNED).
 *
 * A block enters the index when the write pin of the append that filled it is released (its
 * K/V are written by then) and leaves it in kvt_block_try_free() before any of its slots is
 * freed, so a slot reused for other content is never reachable through the index.
 * All functions require e->lock.
 */
#include <errno.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "engine_impl.h"
#include "evict/bits.h"

#define PFX_EMPTY KVT_PFX_EMPTY
#define PFX_TOMB KVT_PFX_TOMB

void (*kvt_test_prefix_hash)(const uint64_t parent[2], const int32_t *tokens, uint32_t n,
			     const uint64_t salt[2], uint64_t out[2]);

void
kvt_prefix_hash(const uint64_t parent[2], const int32_t *tokens, uint32_t n,
		const uint64_t salt[2], uint64_t out[2])
{
	XXH3_state_t st;
	XXH128_hash_t h;

	if (kvt_test_prefix_hash) {
		kvt_test_prefix_hash(parent, tokens, n, salt, out);
		return;
	}
	XXH3_128bits_reset(&st);
	XXH3_128bits_update(&st, parent, 16);
	XXH3_128bits_update(&st, tokens, (size_t)n * sizeof *tokens);
	XXH3_128bits_update(&st, salt, 16);
	h = XXH3_128bits_digest(&st);
	out[0] = h.low64;
	out[1] = h.high64;
}

void
kvt_prefix_salt(uint32_t tenant, uint64_t salt, uint64_t extra_key, uint64_t out[2])
{
	uint8_t in[24] = { 0 }; /* u32 tenant, u32 zero, u64 salt, u64 extra key */
	XXH128_hash_t h;

	memcpy(in, &tenant, sizeof tenant);
	memcpy(in + 8, &salt, sizeof salt);
	memcpy(in + 16, &extra_key, sizeof extra_key);
	h = XXH3_128bits(in, sizeof in);
	out[0] = h.low64;
	out[1] = h.high64;
}

#define PFX_LOAD_MAX 8 /* tenths: entries + tombstones at most this full */
#define PFX_LOAD_NEW 7 /* tenths: a rehashed table is this full */
#define PFX_MIN_CAP 1024u

/* Home of key @h in a table of @cap (<= UINT32_MAX) entries: 32 well-mixed bits of its hash
 * scaled to cap. */
static uint64_t
pfx_home(const uint64_t h[2], uint64_t cap)
{
	return kvt_hash_home(h[0] ^ (h[1] >> 7), (uint32_t)cap);
}

/* The entry after @i in a table of @cap entries (wrapping). */
static uint64_t
pfx_next(uint64_t i, uint64_t cap)
{
	return i + 1 == cap ? 0 : i + 1;
}

/* The block entry @v names (see KVT_PFX_OWNED). */
static uint32_t
pfx_block(const struct kvt_engine *e, uint32_t v)
{
	return kvt_pentry_block(&e->prefix, v);
}

/* The tenant of the block entry @v names: kept with its own copy, or its creator sequence's. */
static uint32_t
pfx_tenant(const struct kvt_engine *e, uint32_t v)
{
	if (v & KVT_PFX_OWNED)
		return e->prefix.pool_tenant[v & ~KVT_PFX_OWNED];
	return e->seqs[kvt_blk(e, v)->seq].tenant;
}

/* The tokens of the block entry @v names: its own copy, or its creator sequence's. */
static const int32_t *
pfx_tokens(const struct kvt_engine *e, uint32_t v)
{
	const struct kvt_block *b;

	if (v & KVT_PFX_OWNED)
		return e->prefix.pool +
		       (uint64_t)(v & ~KVT_PFX_OWNED) * e->layout.tokens_per_block;
	b = kvt_blk(e, v);
	return e->seqs[b->seq].tokens + (uint64_t)b->index * e->layout.tokens_per_block;
}

/* Rehash the live entries (and one more to come) into a table they fill to PFX_LOAD_NEW tenths,
 * dropping the tombstones. 0 or -ENOMEM (table unchanged). */
static int
pfx_rehash(struct kvt_engine *e)
{
	struct kvt_prefix *p = &e->prefix;
	uint64_t ncap = ((p->n + 1) * 10 + PFX_LOAD_NEW - 1) / PFX_LOAD_NEW, i, j;
	uint32_t *nt, *old = p->tab;

	if (ncap < PFX_MIN_CAP)
		ncap = PFX_MIN_CAP;
	if (ncap > UINT32_MAX)
		return -ENOMEM; /* the home is computed in 32-bit steps */
	nt = kvt_malloc(ncap * sizeof *nt);
	if (!nt)
		return -ENOMEM;
	for (i = 0; i < ncap; i++)
		nt[i] = PFX_EMPTY;
	p->tab = nt;
	for (i = 0; i < p->cap; i++) {
		uint64_t h[2];

		if (old[i] >= PFX_TOMB)
			continue;
		kvt_blk_key(kvt_blk(e, pfx_block(e, old[i])), h);
		for (j = pfx_home(h, ncap); nt[j] != PFX_EMPTY; j = pfx_next(j, ncap))
			;
		nt[j] = old[i];
	}
	p->cap = ncap;
	p->tombs = 0;
	kvt_free(old);
	return 0;
}

/* The entry holding key @h, or NULL. */
static uint32_t *
pfx_find_key(struct kvt_engine *e, const uint64_t h[2])
{
	struct kvt_prefix *p = &e->prefix;
	uint64_t i;

	if (!p->cap)
		return NULL;
	for (i = pfx_home(h, p->cap); p->tab[i] != PFX_EMPTY; i = pfx_next(i, p->cap)) {
		uint64_t k[2];

		if (p->tab[i] == PFX_TOMB)
			continue;
		kvt_blk_key(kvt_blk(e, pfx_block(e, p->tab[i])), k);
		if (k[0] == h[0] && k[1] == h[1])
			return &p->tab[i];
	}
	return NULL;
}

uint32_t
kvt_prefix_key_block(struct kvt_engine *e, const uint64_t h[2])
{
	uint32_t *pe = pfx_find_key(e, h);

	return pe ? pfx_block(e, *pe) : KVT_NIL;
}

uint32_t
kvt_prefix_find(struct kvt_engine *e, const uint64_t h[2], const int32_t *tokens,
		uint32_t tenant)
{
	uint32_t *pe = pfx_find_key(e, h);
	uint32_t tpb = e->layout.tokens_per_block;

	if (!pe)
		return KVT_NIL;
	/* same key, other tokens or another tenant: never share it. The tenant is in the key
	 * too (kvt_prefix_salt), but XXH3 is no cryptographic hash: isolation must not rest
	 * on it alone. */
	if (pfx_tenant(e, *pe) != tenant ||
	    memcmp(pfx_tokens(e, *pe), tokens, (size_t)tpb * sizeof *tokens) != 0) {
		e->prefix.collisions++;
		return KVT_NIL;
	}
	return pfx_block(e, *pe);
}

bool
kvt_prefix_tenant(struct kvt_engine *e, uint32_t id, uint32_t *tenant)
{
	uint32_t *pe;
	uint64_t h[2];

	if (!kvt_blk(e, id)->indexed)
		return false;
	kvt_blk_key(kvt_blk(e, id), h);
	pe = pfx_find_key(e, h);
	if (!pe || pfx_block(e, *pe) != id)
		return false;
	*tenant = pfx_tenant(e, *pe);
	return true;
}

int
kvt_prefix_insert(struct kvt_engine *e, uint32_t id)
{
	struct kvt_prefix *p = &e->prefix;
	struct kvt_block *b = kvt_blk(e, id);
	uint64_t i, h[2];

	kvt_blk_key(b, h);
	if (b->indexed || pfx_find_key(e, h))
		return 0; /* already there (same content elsewhere, or a collision): not shared */
	if ((p->n + p->tombs + 1) * 10 > p->cap * PFX_LOAD_MAX && pfx_rehash(e))
		return -ENOMEM;
	for (i = pfx_home(h, p->cap); p->tab[i] < PFX_TOMB; i = pfx_next(i, p->cap))
		;
	if (p->tab[i] == PFX_TOMB)
		p->tombs--;
	p->tab[i] = id; /* tokens borrowed from b->seq until it drops the block */
	p->n++;
	b->indexed = 1;
	return 0;
}

/* Room for one more token copy in the pool (below). */
static int pfx_pool_grow(struct kvt_engine *e);

int
kvt_prefix_insert_owned(struct kvt_engine *e, uint32_t id, const int32_t *tokens,
			uint32_t tenant)
{
	struct kvt_prefix *p = &e->prefix;
	uint32_t tpb = e->layout.tokens_per_block, k;
	uint64_t i, h[2];

	kvt_blk_key(kvt_blk(e, id), h);
	if (kvt_blk(e, id)->indexed || pfx_find_key(e, h))
		return -EEXIST;
	if (!p->n_pool_free && pfx_pool_grow(e))
		return -ENOMEM;
	if ((p->n + p->tombs + 1) * 10 > p->cap * PFX_LOAD_MAX && pfx_rehash(e))
		return -ENOMEM;
	k = p->pool_free;
	p->pool_free = p->pool_block[k];
	p->n_pool_free--;
	memcpy(p->pool + (uint64_t)k * tpb, tokens, (size_t)tpb * sizeof *p->pool);
	p->pool_tenant[k] = tenant;
	p->pool_block[k] = id;
	p->owned++;
	for (i = pfx_home(h, p->cap); p->tab[i] < PFX_TOMB; i = pfx_next(i, p->cap))
		;
	if (p->tab[i] == PFX_TOMB)
		p->tombs--;
	p->tab[i] = KVT_PFX_OWNED | k;
	p->n++;
	kvt_blk(e, id)->indexed = 1;
	return 0;
}

void
kvt_prefix_remove(struct kvt_engine *e, uint32_t id)
{
	struct kvt_block *b = kvt_blk(e, id);
	struct kvt_prefix *p = &e->prefix;
	uint64_t h[2];
	uint32_t *pe;

	if (!b->indexed)
		return;
	kvt_blk_key(b, h);
	pe = pfx_find_key(e, h);
	if (pe && pfx_block(e, *pe) == id) {
		if (*pe & KVT_PFX_OWNED) { /* its pool entry goes back on the free list */
			p->pool_block[*pe & ~KVT_PFX_OWNED] = p->pool_free;
			p->pool_free = *pe & ~KVT_PFX_OWNED;
			p->n_pool_free++;
			p->owned--;
		}
		*pe = PFX_TOMB;
		e->prefix.n--;
		e->prefix.tombs++;
	}
	b->indexed = 0;
}

/* Room for one more token copy in the pool (grown by an eighth, at least 64 entries). */
static int
pfx_pool_grow(struct kvt_engine *e)
{
	struct kvt_prefix *p = &e->prefix;
	uint32_t tpb = e->layout.tokens_per_block;
	uint32_t ncap = p->pool_cap + (p->pool_cap / 8 > 64 ? p->pool_cap / 8 : 64), i;
	void *np;

	if (ncap >= KVT_PFX_TOMB - KVT_PFX_OWNED || ncap < p->pool_cap)
		return -ENOMEM;
	if (!(np = kvt_realloc(p->pool_block, (size_t)ncap * sizeof *p->pool_block)))
		return -ENOMEM;
	p->pool_block = np;
	if (!(np = kvt_realloc(p->pool, (size_t)ncap * tpb * sizeof *p->pool)))
		return -ENOMEM;
	p->pool = np;
	if (!(np = kvt_realloc(p->pool_tenant, (size_t)ncap * sizeof *p->pool_tenant)))
		return -ENOMEM;
	p->pool_tenant = np;
	for (i = ncap; i-- > p->pool_cap;) { /* lowest new entry first */
		p->pool_block[i] = p->pool_free;
		p->pool_free = i;
		p->n_pool_free++;
	}
	p->pool_cap = ncap;
	return 0;
}

int
kvt_prefix_detach(struct kvt_engine *e, uint32_t id)
{
	uint32_t tpb = e->layout.tokens_per_block, k;
	struct kvt_prefix *p = &e->prefix;
	uint64_t h[2];
	uint32_t *pe;

	if (!kvt_blk(e, id)->indexed)
		return 0;
	kvt_blk_key(kvt_blk(e, id), h);
	pe = pfx_find_key(e, h);
	if (!pe || *pe != id) /* not its entry, or it owns its tokens already */
		return 0;
	if (!p->n_pool_free && pfx_pool_grow(e)) {
		kvt_prefix_remove(e, id); /* unshareable, never wrong */
		return -ENOMEM;
	}
	k = p->pool_free;
	p->pool_free = p->pool_block[k];
	p->n_pool_free--;
	memcpy(p->pool + (uint64_t)k * tpb, pfx_tokens(e, *pe), (size_t)tpb * sizeof *p->pool);
	p->pool_tenant[k] = pfx_tenant(e, *pe); /* the creator's, while it still holds it */
	p->pool_block[k] = id;
	*pe = KVT_PFX_OWNED | k;
	p->owned++;
	return 0;
}

void
kvt_prefix_fini(struct kvt_engine *e)
{
	kvt_free(e->prefix.pool);
	kvt_free(e->prefix.pool_block);
	kvt_free(e->prefix.pool_tenant);
	kvt_free(e->prefix.tab);
	memset(&e->prefix, 0, sizeof e->prefix);
	e->prefix.pool_free = KVT_NIL;
}

uint64_t
kvt_prefix_meta_bytes(const struct kvt_engine *e)
{
	return e->prefix.cap * sizeof *e->prefix.tab +
	       (uint64_t)e->prefix.pool_cap *
		       (sizeof *e->prefix.pool_block + sizeof *e->prefix.pool_tenant);
}

uint64_t
kvt_prefix_token_bytes(const struct kvt_engine *e)
{
	return (uint64_t)e->prefix.pool_cap * e->layout.tokens_per_block * sizeof(int32_t);
}

/* Is @id a live sealed block usable by a new sequence? */
static bool
pfx_usable(const struct kvt_block *b)
{
	return b->live && !b->dead && !b->lost && kvt_block_current(b);
}

uint32_t
kvt_prefix_walk(struct kvt_engine *e, const int32_t *tokens, uint64_t n, const uint64_t salt[2],
		uint32_t tenant, uint32_t *ids, uint32_t max)
{
	uint32_t tpb = e->layout.tokens_per_block, k, id;
	uint64_t h[2] = { 0, 0 };

	for (k = 0; k < max && (uint64_t)(k + 1) * tpb <= n; k++) {
		e->st.prefix_lookups++;
		kvt_prefix_hash(h, tokens + (uint64_t)k * tpb, tpb, salt, h);
		id = kvt_prefix_find(e, h, tokens + (uint64_t)k * tpb, tenant);
		if (id == KVT_NIL || !pfx_usable(kvt_blk(e, id))) {
			kvt_wb_miss(e, KVT_WB_NVME, h, tenant); /* write budget: a hit lost? */
			break;
		}
		if (ids)
			ids[k] = id;
	}
	return k;
}

/*
 * The prefix walk of a windowed engine (engine/window.c): a hit of K full blocks needs only
 * what the query at position K * tpb reads, the sink blocks below its window and the window's
 * blocks [kvt_win_first_block(K * tpb), K), not the blocks between (dropped by the sequences
 * that made them, perhaps evicted since). Every key still chains over every token before it,
 * so a block found is one of this prefix, never of another. The longest such K <= @max is
 * returned, ids[0..K) holding the blocks (KVT_NIL for those not needed), and *tail the key of
 * block first - 1 when first > 0 (what block first chains to).
 */
uint32_t
kvt_prefix_walk_window(struct kvt_engine *e, const int32_t *tokens, uint64_t n,
		       const uint64_t salt[2], uint32_t tenant, uint32_t *ids, uint32_t max,
		       uint64_t tail[2])
{
	uint32_t tpb = e->layout.tokens_per_block, nsink = kvt_win_sink_blocks(e);
	uint32_t k, id, run = 0, sinkrun = 0, best = 0, lo, j;
	uint64_t h[2] = { 0, 0 }, *keys;

	if ((uint64_t)max * tpb > n)
		max = (uint32_t)(n / tpb);
	if (!max)
		return 0;
	keys = kvt_malloc((size_t)max * sizeof h);
	if (!keys)
		return 0; /* no memory: no hit, which is always correct */
	for (k = 0; k < max; k++) {
		e->st.prefix_lookups++;
		kvt_prefix_hash(h, tokens + (uint64_t)k * tpb, tpb, salt, h);
		memcpy(keys + 2 * (size_t)k, h, sizeof h);
		id = kvt_prefix_find(e, h, tokens + (uint64_t)k * tpb, tenant);
		if (id != KVT_NIL && !pfx_usable(kvt_blk(e, id)))
			id = KVT_NIL;
		ids[k] = id;
		run = id != KVT_NIL ? run + 1 : 0; /* found blocks ending at k */
		if (id != KVT_NIL && sinkrun == k)
			sinkrun++;                 /* found blocks from 0 */
		lo = kvt_win_first_block(e, (uint64_t)(k + 1) * tpb);
		if (run >= k + 1 - lo && sinkrun >= (nsink < lo ? nsink : lo))
			best = k + 1;
	}
	lo = kvt_win_first_block(e, (uint64_t)best * tpb);
	for (j = nsink; j < lo; j++)
		ids[j] = KVT_NIL; /* out of the window: not taken */
	if (lo)
		memcpy(tail, keys + 2 * (size_t)(lo - 1), 2 * sizeof *tail);
	kvt_free(keys);
	return best;
}
