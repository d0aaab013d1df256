/* SPDX-License-Identifier: MIT */
/*
 * tests/test_prefix.c - prefix sharing: sequences with the same prompt share sealed blocks
 * (refcounted, immutable) and read the same K/V; a forced hash collision is caught by the
 * token comparison; tenants never share, whatever salt they are given (the tenant is part of the
 * key), extra keys separate adapters;
 * a freed block leaves the index before its slots are reused; refcounts return to zero after
 * every sequence closes; divergence inside a block gets its own copy; cached prefixes survive
 * their sequence with prefix_cache and are found in the tier they were parked to; blocks are
 * sealed at park and at the next append too, not only at a batch release; a tenant budget set
 * after a sequence record was reused counts no other tenant's blocks.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine_impl.h"
#include "support/kvt_test.h"

#define T (TSUP_TPB)

/* Append tokens base+pos for pos in [first, first+n) and write K/V pattern @tag there. No cmocka
 * assertion (worker threads call it): -EINVAL for n > 64, a failure after the append printed. */
static int
pfx_append(struct kvt_engine *e, kvt_seq_id s, uint32_t tag, int32_t base, uint64_t first,
	   size_t n)
{
	struct kvt_geometry g;
	int64_t map[64];
	int32_t tok[64] = { 0 };
	uint32_t l, i;
	size_t t;
	int rc;

	if (n > 64) {
		fprintf(stderr, "pfx_append: %zu tokens, at most 64\n", n);
		return -EINVAL;
	}
	for (t = 0; t < n; t++)
		tok[t] = base + (int32_t)(first + t);
	rc = kvt_seq_append(e, s, tok, n, map);
	if (rc)
		return rc;
	rc = kvt_engine_geometry(e, &g);
	if (rc) {
		fprintf(stderr, "pfx_append: kvt_engine_geometry: %d %s\n", rc,
			kvt_last_error_message());
		return rc;
	}
	for (t = 0; t < n; t++)
		for (l = 0; l < TSUP_LAYERS; l++) {
			float *k, *v;

			kvt_kv_addr(&g, l, map[t], (void **)&k, (void **)&v);
			for (i = 0; i < TSUP_HEADS * TSUP_DIM; i++) {
				k[i] = tsup_val(tag, first + t, l, 0, i);
				v[i] = tsup_val(tag, first + t, l, 1, i);
			}
		}
	return 0;
}

static void
prompt(int32_t *tok, int32_t base, size_t n)
{
	for (size_t i = 0; i < n; i++)
		tok[i] = base + (int32_t)i;
}


/* A writes 3 full blocks + 2 tokens; returns A. */
static kvt_seq_id
seq_a(struct kvt_engine *e, const struct kvt_seq_opts *o, uint32_t tag, int32_t base)
{
	kvt_seq_id a;

	assert_int_equal(kvt_seq_open(e, o, &a), 0);
	assert_int_equal(pfx_append(e, a, tag, base, 0, 3 * T + 2), 0);
	assert_int_equal(tsup_verify(e, a, tag), 0); /* release: the sealed blocks are shared */
	return a;
}

static void
test_share_and_refcounts(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 16, .host_blocks = 16 };
	struct kvt_seq_info ia, ib;
	struct kvt_engine *e;
	int32_t tok[5 * T];
	uint64_t m = 0;
	enum kvt_tier tier;
	kvt_seq_id a, b;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	a = seq_a(e, NULL, 1, 1000);
	prompt(tok, 1000, 5 * T);
	assert_int_equal(kvt_seq_match_prefix(e, NULL, tok, 5 * T, &m, &tier), 0);
	assert_int_equal(m, 3 * T);
	assert_int_equal(tier, KVT_TIER_HBM);
	assert_int_equal(kvt_seq_open(e, NULL, &b), 0);
	assert_int_equal(kvt_seq_attach_prefix(e, b, tok, 5 * T, &m), 0);
	assert_int_equal(m, 3 * T);
	assert_int_equal(kvt_seq_attach_prefix(e, b, tok, 5 * T, &m), -EINVAL); /* not empty */
	assert_int_equal(tsup_stats(e).shared_blocks, 3);
	assert_int_equal(tsup_stats(e).prefix_hit_blocks, 3);
	assert_int_equal(tsup_stats(e).prefix_hit_tokens, 3 * T);
	assert_int_equal(tsup_stats(e).tier[KVT_TIER_HBM].prefix_hit_blocks, 3);
	/* B prefills only the rest, and reads A's K/V for the shared blocks */
	assert_int_equal(pfx_append(e, b, 1, 1000, 3 * T, 2 * T), 0);
	assert_int_equal(tsup_verify(e, b, 1), 0);
	assert_int_equal(kvt_seq_info(e, a, &ia), 0);
	assert_int_equal(kvt_seq_info(e, b, &ib), 0);
	assert_int_equal(ib.n_tokens, 5 * T);
	tsup_check_engine(e); /* refcount = referencing sequences, for every block */
	/* shared blocks survive A's park and close */
	assert_int_equal(kvt_seq_park(e, b, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_verify(e, a, 1), 0);
	assert_int_equal(kvt_seq_close(e, a), 0);
	assert_int_equal(tsup_stats(e).shared_blocks, 0);
	tsup_check_engine(e);
	assert_int_equal(tsup_verify(e, b, 1), 0);
	assert_int_equal(kvt_seq_close(e, b), 0);
	tsup_check_engine(e);
	assert_int_equal(kvt_engine_drain(e), 0);
	/* back to zero: nothing referenced, nothing held (prefix_cache off) */
	assert_int_equal(tsup_stats(e).tier[KVT_TIER_HBM].used_slots, 0);
	assert_int_equal(tsup_stats(e).tier[KVT_TIER_HOST].used_slots, 0);
	assert_int_equal(e->n_live_blocks, 0);
	assert_int_equal(e->prefix.n, 0); /* freed blocks left the index */
	assert_int_equal(kvt_seq_match_prefix(e, NULL, tok, 5 * T, &m, &tier), 0);
	assert_int_equal(m, 0);
	assert_int_equal(tier, KVT_TIER_COUNT);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

static void
const_hash(const uint64_t parent[2], const int32_t *tokens, uint32_t n, const uint64_t salt[2],
	   uint64_t out[2])
{
	(void)parent;
	(void)tokens;
	(void)n;
	(void)salt;
	out[0] = 42;
	out[1] = 42;
}

/* cmocka teardown: the hash hook back to XXH3 even when the test failed half-way (a test left
 * with the hook set would fail every later one). */
static int
pfx_hook_reset(void **state)
{
	(void)state;
	kvt_test_prefix_hash = NULL;
	return 0;
}

static void
test_forced_collision(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 16, .host_blocks = 16 };
	struct kvt_engine *e;
	int32_t tok[4 * T];
	uint64_t m = 1;
	kvt_seq_id a, f;
	char *dir;

	(void)state;
	kvt_test_prefix_hash = const_hash; /* every block gets the same key */
	e = tsup_engine(&c, &dir);
	a = seq_a(e, NULL, 1, 1000);
	prompt(tok, 5000, 4 * T); /* other tokens */
	assert_int_equal(kvt_seq_open(e, NULL, &f), 0);
	assert_int_equal(kvt_seq_attach_prefix(e, f, tok, 4 * T, &m), 0);
	assert_int_equal(m, 0); /* the key matched, the tokens did not: no KV of A served */
	assert_true(e->prefix.collisions > 0);
	assert_int_equal(pfx_append(e, f, 2, 5000, 0, 4 * T), 0);
	assert_int_equal(tsup_verify(e, f, 2), 0);
	assert_int_equal(tsup_verify(e, a, 1), 0);
	/* same tokens still match through the same (constant) key */
	prompt(tok, 1000, 4 * T);
	assert_int_equal(kvt_seq_match_prefix(e, NULL, tok, 4 * T, &m, NULL), 0);
	assert_int_equal(m, T);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	kvt_test_prefix_hash = NULL;
	tsup_rmdir(dir);
}

static void
test_tenants_and_keys(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 16, .host_blocks = 16 };
	struct kvt_seq_opts o1, o2;
	struct kvt_engine *e;
	int32_t tok[4 * T];
	uint64_t m;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	kvt_seq_opts_init(&o1, sizeof o1);
	kvt_seq_opts_init(&o2, sizeof o2);
	o1.tenant = 1;
	o2.tenant = 2;
	(void)seq_a(e, &o1, 1, 1000);
	prompt(tok, 1000, 4 * T);
	assert_int_equal(kvt_seq_match_prefix(e, &o1, tok, 4 * T, &m, NULL), 0);
	assert_int_equal(m, 3 * T);
	assert_int_equal(kvt_seq_match_prefix(e, &o2, tok, 4 * T, &m, NULL), 0);
	assert_int_equal(m, 0); /* other tenant: never */
	assert_int_equal(kvt_seq_match_prefix(e, NULL, tok, 4 * T, &m, NULL), 0);
	assert_int_equal(m, 0); /* tenant 0 either */
	/* two tenants given one salt do not share either: the tenant is part of the key */
	o1.salt = o2.salt = 77;
	(void)seq_a(e, &o1, 1, 1000);
	assert_int_equal(kvt_seq_match_prefix(e, &o2, tok, 4 * T, &m, NULL), 0);
	assert_int_equal(m, 0);
	assert_int_equal(kvt_seq_match_prefix(e, &o1, tok, 4 * T, &m, NULL), 0);
	assert_int_equal(m, 3 * T); /* the tenant itself does, under that salt */
	o2.tenant = 1; /* and so does a sequence of tenant 1 with salt 77 */
	assert_int_equal(kvt_seq_match_prefix(e, &o2, tok, 4 * T, &m, NULL), 0);
	assert_int_equal(m, 3 * T);
	/* another adapter / model revision does not */
	o2.extra_key = 5;
	assert_int_equal(kvt_seq_match_prefix(e, &o2, tok, 4 * T, &m, NULL), 0);
	assert_int_equal(m, 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* Hardening 6: no salt value reaches another tenant's blocks. The salt used to stand in for the
 * tenant (0 meant (1 << 63) | tenant), so tenant 8 given salt 0x8000000000000001 matched and
 * attached tenant 1's KV; and a salt of tenant 1 chosen as another tenant's default did too. */
static void
test_salt_cannot_reach_other_tenant(void **state)
{
	static const uint64_t salts[] = { 0, 1, 8, 0x8000000000000001ull, 0x8000000000000008ull,
					  UINT64_MAX };
	struct tsup_cfg c = { .hbm_blocks = 16, .host_blocks = 16 };
	struct kvt_seq_opts o1, o8;
	struct kvt_engine *e;
	int32_t tok[4 * T];
	uint64_t m = 0;
	kvt_seq_id x;
	char *dir;
	size_t i;

	(void)state;
	e = tsup_engine(&c, &dir);
	kvt_seq_opts_init(&o1, sizeof o1);
	kvt_seq_opts_init(&o8, sizeof o8);
	o1.tenant = 1;
	o8.tenant = 8;
	(void)seq_a(e, &o1, 1, 1000); /* tenant 1, default salt: 3 sealed blocks */
	prompt(tok, 1000, 4 * T);
	assert_int_equal(kvt_seq_match_prefix(e, &o1, tok, 4 * T, &m, NULL), 0);
	assert_int_equal(m, 3 * T); /* the owner finds them */
	for (i = 0; i < sizeof salts / sizeof *salts; i++) {
		o8.salt = salts[i];
		m = 1;
		assert_int_equal(kvt_seq_match_prefix(e, &o8, tok, 4 * T, &m, NULL), 0);
		assert_int_equal(m, 0);
		assert_int_equal(kvt_seq_open(e, &o8, &x), 0);
		m = 1;
		assert_int_equal(kvt_seq_attach_prefix(e, x, tok, 4 * T, &m), 0);
		assert_int_equal(m, 0); /* nothing of tenant 1's KV attached */
		assert_int_equal(tsup_stats(e).shared_blocks, 0);
		assert_int_equal(kvt_seq_close(e, x), 0);
	}
	/* tenant 1 itself with a salt: another key space than its default salt */
	o1.salt = 0x8000000000000001ull;
	assert_int_equal(kvt_seq_match_prefix(e, &o1, tok, 4 * T, &m, NULL), 0);
	assert_int_equal(m, 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* Hardening 10: a server that prefills and parks without ever preparing a batch gets prefix
 * sharing: blocks are sealed at park (their K/V are written by then), and a block filled by an
 * earlier append is sealed at the next append; the block the latest append filled is not (its
 * K/V may not be written yet) until a release or a park. */
static void
test_sealed_without_batch(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 16, .host_blocks = 16 };
	struct kvt_engine *e;
	int32_t tok[4 * T];
	uint64_t m = 0;
	kvt_seq_id a, b, d;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	/* prefill, park: no batch */
	assert_int_equal(kvt_seq_open(e, NULL, &a), 0);
	assert_int_equal(pfx_append(e, a, 1, 1000, 0, 3 * T + 2), 0);
	prompt(tok, 1000, 4 * T);
	assert_int_equal(kvt_seq_match_prefix(e, NULL, tok, 4 * T, &m, NULL), 0);
	assert_int_equal(m, 0); /* just appended: the K/V may not be written yet */
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_match_prefix(e, NULL, tok, 4 * T, &m, NULL), 0);
	assert_int_equal(m, 3 * T);
	assert_int_equal(kvt_seq_open(e, NULL, &b), 0);
	assert_int_equal(kvt_seq_attach_prefix(e, b, tok, 4 * T, &m), 0);
	assert_int_equal(m, 3 * T);
	assert_int_equal(pfx_append(e, b, 1, 1000, 3 * T, T), 0);
	assert_int_equal(tsup_verify(e, b, 1), 0); /* A's K/V, then its own */
	tsup_check_engine(e);
	/* prefill two blocks, then one more block (a decode step without a batch): the first
	 * two are sealed by the second append, the third only by the release */
	assert_int_equal(kvt_seq_open(e, NULL, &d), 0);
	assert_int_equal(pfx_append(e, d, 2, 5000, 0, 2 * T), 0);
	assert_int_equal(pfx_append(e, d, 2, 5000, 2 * T, T), 0);
	prompt(tok, 5000, 4 * T);
	assert_int_equal(kvt_seq_match_prefix(e, NULL, tok, 4 * T, &m, NULL), 0);
	assert_int_equal(m, 2 * T);
	assert_int_equal(tsup_verify(e, d, 2), 0); /* the release seals the third */
	assert_int_equal(kvt_seq_match_prefix(e, NULL, tok, 4 * T, &m, NULL), 0);
	assert_int_equal(m, 3 * T);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* Hardening 7: a budget set for a tenant whose sequence reuses the record of a closed sequence
 * of another tenant (whose blocks stay cached) charged those blocks to the new tenant, and the
 * old tenant's budget kept counting them: kvt_engine_check() found "tenant 0 tier 0: 0 slots
 * held, budget counts 2". */
static void
test_budget_after_record_reuse(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_seq_opts so;
	uint64_t used[KVT_TIER_COUNT];
	struct kvt_engine *e;
	kvt_seq_id a, b;

	(void)state;
	kvt_engine_opts_init(&o, sizeof o);
	o.layout = (struct kvt_layout){ TSUP_LAYERS, TSUP_HEADS, TSUP_DIM, KVT_DTYPE_F32, T };
	o.hbm_bytes = 8 * tsup_block_bytes();
	o.host_bytes = 8 * tsup_block_bytes();
	o.prefix_cache = 1;
	assert_int_equal(kvt_engine_create(&o, &e), 0);
	assert_int_equal(kvt_tenant_set_budget(e, 0, KVT_TIER_HBM, 100), 0);
	assert_int_equal(kvt_seq_open(e, NULL, &a), 0); /* tenant 0 */
	assert_int_equal(pfx_append(e, a, 1, 1000, 0, 2 * T), 0);
	assert_int_equal(tsup_verify(e, a, 1), 0); /* sealed: they stay cached after close */
	assert_int_equal(kvt_seq_close(e, a), 0);
	assert_int_equal(kvt_tenant_usage(e, 0, used), 0);
	assert_int_equal(used[KVT_TIER_HBM], 2);
	kvt_seq_opts_init(&so, sizeof so);
	so.tenant = 5;
	assert_int_equal(kvt_seq_open(e, &so, &b), 0);
	assert_int_equal((uint32_t)b, (uint32_t)a); /* the same sequence record */
	assert_int_equal(kvt_tenant_set_budget(e, 5, KVT_TIER_HBM, 100), 0);
	tsup_check_engine(e);
	assert_int_equal(kvt_tenant_usage(e, 0, used), 0);
	assert_int_equal(used[KVT_TIER_HBM], 2); /* still tenant 0's cached blocks */
	assert_int_equal(kvt_tenant_usage(e, 5, used), 0);
	assert_int_equal(used[KVT_TIER_HBM], 0);
	/* tenant 5's own blocks count for it */
	assert_int_equal(pfx_append(e, b, 2, 7000, 0, T), 0);
	assert_int_equal(kvt_tenant_usage(e, 5, used), 0);
	assert_int_equal(used[KVT_TIER_HBM], 1);
	/* and a budget set once a tenant's sequence holds blocks counts them */
	so.tenant = 6;
	assert_int_equal(kvt_seq_close(e, b), 0);
	assert_int_equal(kvt_seq_open(e, &so, &b), 0);
	assert_int_equal(pfx_append(e, b, 3, 9000, 0, 2 * T), 0);
	assert_int_equal(kvt_tenant_set_budget(e, 6, KVT_TIER_HBM, 100), 0);
	assert_int_equal(kvt_tenant_usage(e, 6, used), 0);
	assert_int_equal(used[KVT_TIER_HBM], 2);
	tsup_check_engine(e);
	assert_int_equal(kvt_seq_close(e, b), 0);
	tsup_check_engine(e);
	/* cached blocks of a closed sequence count for its tenant when its budget comes later */
	so.tenant = 9;
	assert_int_equal(kvt_seq_open(e, &so, &b), 0);
	assert_int_equal(pfx_append(e, b, 4, 11000, 0, T), 0);
	assert_int_equal(tsup_verify(e, b, 4), 0);
	assert_int_equal(kvt_seq_close(e, b), 0);
	assert_int_equal(kvt_tenant_set_budget(e, 9, KVT_TIER_HBM, 100), 0);
	assert_int_equal(kvt_tenant_usage(e, 9, used), 0);
	assert_int_equal(used[KVT_TIER_HBM], 1);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
}

/* Hardening 6: the index compares tenants on every hit, so isolation does not rest on the hash
 * (XXH3 is not cryptographic): with every key forced equal, tenant 2 never gets tenant 1's
 * block, neither while its creator holds it (tenant read from the creator) nor once the creator
 * closed and another sequence of tenant 1 keeps it (tenant kept with the pool's tokens). */
static void
test_index_compares_tenant(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 16, .host_blocks = 16 };
	struct kvt_seq_opts o1, o2;
	struct kvt_engine *e;
	int32_t tok[4 * T];
	uint64_t m;
	kvt_seq_id a, b, x;
	char *dir;

	(void)state;
	kvt_test_prefix_hash = const_hash; /* every key 42, whatever tenant and salt */
	e = tsup_engine(&c, &dir);
	kvt_seq_opts_init(&o1, sizeof o1);
	kvt_seq_opts_init(&o2, sizeof o2);
	o1.tenant = 1;
	o2.tenant = 2;
	a = seq_a(e, &o1, 1, 1000); /* block 0 indexed (the others share its key: not) */
	prompt(tok, 1000, 4 * T);
	assert_int_equal(kvt_seq_match_prefix(e, &o1, tok, 4 * T, &m, NULL), 0);
	assert_int_equal(m, T);
	m = 1;
	assert_int_equal(kvt_seq_match_prefix(e, &o2, tok, 4 * T, &m, NULL), 0);
	assert_int_equal(m, 0);
	assert_int_equal(kvt_seq_open(e, &o2, &x), 0);
	m = 1;
	assert_int_equal(kvt_seq_attach_prefix(e, x, tok, 4 * T, &m), 0);
	assert_int_equal(m, 0);
	assert_int_equal(kvt_seq_close(e, x), 0);
	/* tenant 1's b keeps block 0; its creator a closes: the entry owns its tokens now */
	assert_int_equal(kvt_seq_open(e, &o1, &b), 0);
	assert_int_equal(kvt_seq_attach_prefix(e, b, tok, 4 * T, &m), 0);
	assert_int_equal(m, T);
	assert_int_equal(kvt_seq_close(e, a), 0);
	assert_int_equal(e->prefix.owned, 1);
	m = 1;
	assert_int_equal(kvt_seq_match_prefix(e, &o2, tok, 4 * T, &m, NULL), 0);
	assert_int_equal(m, 0);
	assert_int_equal(kvt_seq_open(e, &o2, &x), 0); /* may reuse a's record */
	m = 1;
	assert_int_equal(kvt_seq_attach_prefix(e, x, tok, 4 * T, &m), 0);
	assert_int_equal(m, 0);
	assert_int_equal(kvt_seq_match_prefix(e, &o1, tok, 4 * T, &m, NULL), 0);
	assert_int_equal(m, T);
	assert_int_equal(tsup_verify(e, b, 1), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	kvt_test_prefix_hash = NULL;
	tsup_rmdir(dir);
}

/* Divergence inside a block: only the full blocks before it are shared; a prompt shorter than
 * one block shares nothing; tokens not given share nothing (v0). */
static void
test_divergence(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 16, .host_blocks = 16 };
	struct kvt_engine *e;
	int32_t tok[4 * T];
	int64_t map[T];
	uint64_t m;
	kvt_seq_id a, h, v;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	a = seq_a(e, NULL, 1, 1000);
	prompt(tok, 1000, 4 * T);
	tok[T + 1] = -7; /* differs inside block 1 */
	assert_int_equal(kvt_seq_open(e, NULL, &h), 0);
	assert_int_equal(kvt_seq_attach_prefix(e, h, tok, 4 * T, &m), 0);
	assert_int_equal(m, T);
	assert_int_equal(tsup_stats(e).shared_blocks, 1);
	assert_int_equal(kvt_seq_match_prefix(e, NULL, tok, T - 1, &m, NULL), 0);
	assert_int_equal(m, 0);
	assert_int_equal(kvt_seq_open(e, NULL, &v), 0);
	assert_int_equal(kvt_seq_append(e, v, NULL, T, map), 0); /* no tokens: not hashed */
	assert_int_equal(kvt_seq_close(e, v), 0);
	assert_int_equal(kvt_seq_close(e, h), 0);
	assert_int_equal(kvt_seq_close(e, a), 0);
	tsup_check_engine(e);
	assert_int_equal(e->n_live_blocks, 0);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* Open @n two-block sequences from prompt number @first on (distinct tokens, hashed and indexed),
 * parked to HOST. */
static void
churn_open(struct kvt_engine *e, kvt_seq_id *s, int first, int n, int tpb)
{
	int32_t tok[2 * 16];
	int64_t map[2 * 16];
	int i, j;

	for (i = 0; i < n; i++) {
		struct kvt_batch *b;

		for (j = 0; j < 2 * tpb; j++)
			tok[j] = (first + i) * 64 + j;
		assert_int_equal(kvt_seq_open(e, NULL, &s[i]), 0);
		assert_int_equal(kvt_seq_append(e, s[i], tok, 2 * (size_t)tpb, map), 0);
		assert_int_equal(kvt_batch_prepare(e, &s[i], 1, &b), 0);
		assert_int_equal(kvt_batch_release(b, NULL), 0);
		assert_int_equal(kvt_seq_park(e, s[i], KVT_TIER_HOST), 0);
		if (i % 16 == 0)
			assert_true(kvt_engine_poll(e, 0) >= 0);
	}
	assert_int_equal(kvt_engine_drain(e), 0);
}

/* Does prompt number @k (two blocks) match in full? */
static bool
churn_found(struct kvt_engine *e, int k, int tpb)
{
	int32_t tok[2 * 16];
	enum kvt_tier tier;
	uint64_t m = 0;
	int j;

	for (j = 0; j < 2 * tpb; j++)
		tok[j] = k * 64 + j;
	assert_int_equal(kvt_seq_match_prefix(e, NULL, tok, 2 * (size_t)tpb, &m, &tier), 0);
	return m == 2 * (uint64_t)tpb;
}

/* The index table (any size, linear probing, tombstones) through growth, removals and the
 * rehash that drops tombstones: every indexed block is found by its key (tsup_check_engine),
 * removed prompts are not, and the table stays 70-80% full: never more than 80% counting
 * tombstones, and a rehash sizes it for 70% of the live entries. */
static void
test_index_churn(void **state)
{
	enum { NS = 1500, TPB = 16 };
	struct kvt_engine_opts o;
	struct kvt_engine *e;
	static kvt_seq_id s[2 * NS];
	uint64_t bb = 2ull * TPB * 8 * 2, cap;
	int i, round;

	(void)state;
	kvt_engine_opts_init(&o, sizeof o);
	o.layout = (struct kvt_layout){ 1, 1, 8, KVT_DTYPE_F16, TPB };
	o.hbm_bytes = 64 * bb;
	o.host_bytes = (uint64_t)(2 * NS + 64) * bb;
	assert_int_equal(kvt_engine_create(&o, &e), 0);
	churn_open(e, s, 0, NS, TPB);
	assert_int_equal(e->prefix.n, 2 * NS);
	assert_int_equal(e->prefix.tombs, 0);
	assert_true((e->prefix.n + e->prefix.tombs) * 10 <= e->prefix.cap * 8);
	assert_true(e->prefix.cap * 7 <= (e->prefix.n + 1) * 10 + 7); /* grown to fit, no more */
	assert_true(e->prefix.cap > 1024); /* it grew */
	tsup_check_engine(e);
	for (round = 0; round < 3; round++) {
		int base = (round + 1) * NS;

		/* close all but every tenth sequence: their entries become tombstones */
		for (i = 0; i < NS; i++)
			if (i % 10)
				assert_int_equal(kvt_seq_close(e, s[i]), 0);
		assert_true((e->prefix.n + e->prefix.tombs) * 10 <= e->prefix.cap * 8);
		tsup_check_engine(e);
		assert_false(churn_found(e, base - NS + 1, TPB));
		assert_true(churn_found(e, 10, TPB)); /* kept open */
		/* new prompts reuse the room: a rehash drops the tombstones */
		for (i = 0; i < NS; i++)
			if (i % 10)
				churn_open(e, &s[i], base + i, 1, TPB);
		assert_int_equal(e->prefix.n, 2 * NS);
		assert_true(e->prefix.tombs < 2 * NS);
		assert_true((e->prefix.n + e->prefix.tombs) * 10 <= e->prefix.cap * 8);
		tsup_check_engine(e);
		for (i = 0; i < NS; i++) {
			assert_int_equal(churn_found(e, i % 10 ? base + i : i, TPB), true);
			if (i % 10)
				assert_false(churn_found(e, base - NS + i, TPB));
		}
	}
	/* most sequences gone: the next rehash shrinks the table to fit what is left */
	for (i = 0; i < NS; i++)
		if (i % 10)
			assert_int_equal(kvt_seq_close(e, s[i]), 0);
	cap = e->prefix.cap;
	churn_open(e, s + NS, 10 * NS, NS / 2, TPB);
	assert_int_equal(e->prefix.n, 2 * (NS / 10 + NS / 2));
	assert_true(e->prefix.cap < cap);
	assert_true(e->prefix.cap * 7 <= (e->prefix.n + 1) * 10 + 7);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
}

/* prefix_cache: sealed blocks outlive their sequence, are found in the tier they were parked
 * to, and when eviction frees them they leave the index before their slots are reused. */
static void
test_cache_and_free(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_engine *e;
	int32_t tok[4 * T];
	enum kvt_tier tier;
	uint64_t m;
	kvt_seq_id a, b, x[6];
	int i;

	(void)state;
	kvt_engine_opts_init(&o, sizeof o);
	o.layout = (struct kvt_layout){ TSUP_LAYERS, TSUP_HEADS, TSUP_DIM, KVT_DTYPE_F32, T };
	o.hbm_bytes = 4 * tsup_block_bytes();
	o.host_bytes = 4 * tsup_block_bytes();
	o.prefix_cache = 1;
	o.evict_policy = KVT_EVICT_LRU; /* the eviction order below is LRU's */
	assert_int_equal(kvt_engine_create(&o, &e), 0);
	a = seq_a(e, NULL, 1, 1000);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_close(e, a), 0);
	tsup_check_engine(e);
	prompt(tok, 1000, 4 * T);
	assert_int_equal(kvt_seq_match_prefix(e, NULL, tok, 4 * T, &m, &tier), 0);
	assert_int_equal(m, 3 * T);
	assert_int_equal(tier, KVT_TIER_HOST);
	assert_int_equal(kvt_seq_open(e, NULL, &b), 0);
	assert_int_equal(kvt_seq_attach_prefix(e, b, tok, 4 * T, &m), 0);
	assert_int_equal(m, 3 * T);
	assert_int_equal(tsup_stats(e).tier[KVT_TIER_HOST].prefix_hit_blocks, 3);
	assert_int_equal(pfx_append(e, b, 1, 1000, 3 * T, T), 0);
	assert_int_equal(tsup_verify(e, b, 1), 0); /* brought up from HOST, same K/V */
	assert_int_equal(kvt_seq_close(e, b), 0);
	/* other sequences fill both tiers: the cached blocks are evicted and freed */
	for (i = 0; i < 6; i++) {
		assert_int_equal(kvt_seq_open(e, NULL, &x[i]), 0);
		assert_int_equal(pfx_append(e, x[i], 10 + i, 100000 * (i + 1), 0, T), 0);
		assert_int_equal(tsup_verify(e, x[i], 10 + i), 0);
		assert_int_equal(kvt_engine_drain(e), 0);
		tsup_check_engine(e); /* indexed blocks are live, their keys point at them */
	}
	assert_int_equal(kvt_seq_match_prefix(e, NULL, tok, 4 * T, &m, NULL), 0);
	assert_int_equal(m, 0); /* block 0 was the coldest: gone, so is the prefix */
	for (i = 0; i < 6; i++) {
		assert_int_equal(tsup_verify(e, x[i], 10 + i), 0);
		assert_int_equal(kvt_seq_close(e, x[i]), 0);
	}
	tsup_check_engine(e);
	kvt_engine_destroy(e);
}

/* Threads open sequences on one shared prompt, attach it, append their own tail, read it all
 * back, park/resume and close, while a poller runs: under TSan this checks the locking of the
 * refcounts and the index; every thread checks its bytes (shared ones are the owner's). */
struct pfx_worker {
	struct kvt_engine *e; /* shared engine */
	uint32_t id;          /* thread number */
	int failures;         /* unexpected results (each printed: no cmocka assertion in a
			         worker thread, the test checks the count after the join) */
	uint64_t attached;    /* tokens attached in all */
};

static int
pfx_retry(int rc)
{
	if (rc == -ENOSPC)
		usleep(100);
	return rc == -ENOSPC;
}

/* Count a failure of @w unless @bad is 0: @what returned @rc in iteration @it. */
static void
pfx_fail(struct pfx_worker *w, bool bad, int it, const char *what, long long rc)
{
	if (!bad)
		return;
	w->failures++;
	fprintf(stderr, "pfx worker %u it %d: %s: %lld (%s)\n", w->id, it, what, rc,
		kvt_last_error_message());
}

static void *
pfx_worker_main(void *arg)
{
	struct pfx_worker *w = arg;
	int32_t tok[4 * T];
	kvt_seq_id s;
	uint64_t a;
	int it, rc, tries;

	prompt(tok, 1000, 4 * T);
	for (it = 0; it < 20; it++) {
		if ((rc = kvt_seq_open(w->e, NULL, &s))) {
			pfx_fail(w, true, it, "open", rc);
			continue;
		}
		a = 0;
		rc = kvt_seq_attach_prefix(w->e, s, tok, 4 * T, &a);
		pfx_fail(w, rc != 0, it, "attach_prefix", rc);
		pfx_fail(w, a % T != 0, it, "attached tokens not whole blocks", (long long)a);
		w->attached += a;
		tries = 0;
		rc = 0;
		while (a < 4 * T && pfx_retry(rc = pfx_append(w->e, s, 1, 1000, a, 4 * T - a)) &&
		       tries++ < 100000)
			;
		pfx_fail(w, rc != 0, it, "append", rc);
		if (rc == 0) {
			tries = 0;
			while (pfx_retry(rc = tsup_verify(w->e, s, 1)) && tries++ < 100000)
				;
			pfx_fail(w, rc != 0, it, "verify", rc);
		}
		if ((it + w->id) % 3 == 0) {
			rc = kvt_seq_park(w->e, s, it % 2 ? KVT_TIER_NVME : KVT_TIER_HOST);
			pfx_fail(w, rc != 0, it, "park", rc);
			rc = kvt_seq_resume(w->e, s);
			pfx_fail(w, rc != 0, it, "resume", rc);
		}
		rc = kvt_seq_close(w->e, s);
		pfx_fail(w, rc != 0, it, "close", rc);
	}
	return NULL;
}

static volatile int pfx_stop;

static void *
pfx_poller(void *arg)
{
	while (!__atomic_load_n(&pfx_stop, __ATOMIC_ACQUIRE))
		(void)kvt_engine_poll(arg, 0);
	return NULL;
}

static void
test_threads_share_prompt(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 24, .host_blocks = 16, .nvme_blocks = 128,
			      .delay_us = 30 };
	struct pfx_worker w[4];
	pthread_t th[4], poller;
	struct kvt_engine *e;
	kvt_seq_id a;
	uint64_t attached = 0;
	char *dir;
	int i;

	(void)state;
	e = tsup_engine(&c, &dir);
	a = seq_a(e, NULL, 1, 1000); /* the owner: 3 sealed blocks stay referenced */
	__atomic_store_n(&pfx_stop, 0, __ATOMIC_RELEASE);
	assert_int_equal(pthread_create(&poller, NULL, pfx_poller, e), 0);
	for (i = 0; i < 4; i++) {
		w[i] = (struct pfx_worker){ .e = e, .id = (uint32_t)i };
		assert_int_equal(pthread_create(&th[i], NULL, pfx_worker_main, &w[i]), 0);
	}
	for (i = 0; i < 4; i++) /* all joined before any assertion */
		pthread_join(th[i], NULL);
	__atomic_store_n(&pfx_stop, 1, __ATOMIC_RELEASE);
	pthread_join(poller, NULL);
	for (i = 0; i < 4; i++) {
		assert_int_equal(w[i].failures, 0);
		attached += w[i].attached;
	}
	assert_true(attached >= 4 * 20 * 3 * T); /* every sequence found the owner's blocks */
	assert_int_equal(kvt_engine_drain(e), 0);
	tsup_check_engine(e);
	assert_int_equal(tsup_stats(e).shared_blocks, 0);
	assert_int_equal(tsup_verify(e, a, 1), 0);
	assert_int_equal(kvt_seq_close(e, a), 0);
	tsup_check_engine(e);
	assert_int_equal(e->n_live_blocks, 0);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* A prompt length far beyond anything the tiers hold (2^62 tokens, a caller's bug or an
 * attacker's) is bounded by the tiers' slots: no huge allocation (it was (n / tpb) * 4 bytes:
 * ASan aborted with allocation-size-too-big, a plain build returned -ENOMEM), just no match. */
static void
test_match_huge_n(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 4, .host_blocks = 4 };
	int32_t tok[TSUP_TPB];
	uint64_t matched = 7;
	enum kvt_tier tier;
	struct kvt_engine *e;
	char *dir;
	uint32_t i;

	(void)state;
	for (i = 0; i < TSUP_TPB; i++)
		tok[i] = (int32_t)(1000 + i); /* cached nowhere: the walk stops at block 0 */
	e = tsup_engine(&c, &dir);
	assert_int_equal(kvt_seq_match_prefix(e, NULL, tok, (size_t)1 << 62, &matched, &tier), 0);
	assert_int_equal(matched, 0);
	assert_int_equal(tier, KVT_TIER_COUNT);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_share_and_refcounts),
		cmocka_unit_test_teardown(test_forced_collision, pfx_hook_reset),
		cmocka_unit_test(test_tenants_and_keys),
		cmocka_unit_test(test_salt_cannot_reach_other_tenant),
		cmocka_unit_test(test_sealed_without_batch),
		cmocka_unit_test(test_budget_after_record_reuse),
		cmocka_unit_test_teardown(test_index_compares_tenant, pfx_hook_reset),
		cmocka_unit_test(test_divergence),
		cmocka_unit_test(test_index_churn),
		cmocka_unit_test(test_cache_and_free),
		cmocka_unit_test(test_threads_share_prompt),
		cmocka_unit_test(test_match_huge_n),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
