/* SPDX-License-Identifier: MIT */
/*
 * tests/test_ext_remote.c - the REMOTE tier below the external pool (issue 19 item 1; kvtier.h
 * "External-pool mode", REMOTE): two engines (two servers of a fleet) on one real
 * redis-server the test starts (tests/support/redis_server.c), each with a caller-owned pool
 * in vLLM's per-layer layout. A block stored in A is written through (per remote_write: all,
 * seen twice, none) and found by B: B's lookup misses, queues one fetch, a later lookup hits
 * and the load brings every byte A stored into B's pool. Faults: a value overwritten with
 * garbage (a miss, never wrong bytes), another tenant, another geometry (segment sizes), a
 * hash missing there (asked again only after the negative-cache second), HOST too small for
 * the run, a stopped server while a fetch is in flight and the pool unregistered meanwhile.
 * After each: kvt_engine_check passes and the engine is usable. Written against kvtier.h and
 * the test support only. Skips (77) without redis-server.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvtier.h"
#include "support/kvt_test.h"
#include "support/redis_server.h"

#define SEG 256u /* K (or V) bytes of one layer of one block in the test pool */
#define NB 32u   /* caller blocks */

static struct tsrv srv;

/* A caller pool in vLLM's per-layer layout: layer l is [2][NB][seg bytes]. */
struct pool {
	uint8_t *mem[TSUP_LAYERS];
	struct kvt_ext_layer lay[TSUP_LAYERS];
	uint32_t seg;
	uint32_t id;
};

static void
pool_make_seg(struct kvt_engine *e, struct pool *p, uint32_t segb)
{
	struct kvt_ext_opts o;
	int rc;

	p->seg = segb;
	for (uint32_t l = 0; l < TSUP_LAYERS; l++) {
		p->mem[l] = calloc(2, (size_t)NB * segb);
		assert_non_null(p->mem[l]);
		p->lay[l] = (struct kvt_ext_layer){ .base = (uintptr_t)p->mem[l],
						    .block_stride = segb, .k_offset = 0,
						    .v_offset = (uint64_t)NB * segb, .k_bytes = segb,
						    .v_bytes = segb, .n_layers = 1 };
	}
	kvt_ext_opts_init(&o, sizeof o);
	o.n_blocks = NB;
	o.n_entries = TSUP_LAYERS;
	o.layers = p->lay;
	rc = kvt_ext_register(e, &o, &p->id);
	if (rc)
		print_error("register: %s\n", kvt_last_error_message());
	assert_int_equal(rc, 0);
}

static void
pool_make(struct kvt_engine *e, struct pool *p)
{
	pool_make_seg(e, p, SEG);
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
	return p->mem[l] + ((size_t)kv * NB + blk) * p->seg;
}

static uint8_t
pat(uint32_t tag, uint32_t l, uint32_t kv, uint32_t i)
{
	return (uint8_t)(tag * 131u + l * 17u + kv * 7u + i * 3u + (i >> 8));
}

static void
fill(struct pool *p, uint32_t blk, uint32_t tag)
{
	for (uint32_t l = 0; l < TSUP_LAYERS; l++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t i = 0; i < p->seg; i++)
				seg(p, l, kv, blk)[i] = pat(tag, l, kv, i);
}

static bool
holds(struct pool *p, uint32_t blk, uint32_t tag)
{
	for (uint32_t l = 0; l < TSUP_LAYERS; l++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t i = 0; i < p->seg; i++)
				if (seg(p, l, kv, blk)[i] != pat(tag, l, kv, i))
					return false;
	return true;
}

static void
wipe(struct pool *p, uint32_t blk)
{
	for (uint32_t l = 0; l < TSUP_LAYERS; l++)
		for (uint32_t kv = 0; kv < 2; kv++)
			memset(seg(p, l, kv, blk), 0xee, p->seg);
}

static uint64_t
hash_of(uint32_t i)
{
	return 0x5eed000000000000ull ^ ((uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull);
}

/* An engine of a fleet: REMOTE on the test's server, @host_blocks of HOST. */
static struct kvt_engine *
eng(uint32_t write, uint32_t host_blocks)
{
	struct kvt_engine_opts o;

	tsup_opts_init(&o);
	o.hbm_bytes = tsup_block_bytes();
	o.host_bytes = (uint64_t)host_blocks * tsup_block_bytes();
	o.remote_host = "127.0.0.1";
	o.remote_port = srv.port;
	o.remote_model_id = "ext-model@1";
	o.remote_connect_timeout_ms = 500;
	o.remote_op_timeout_ms = 300;
	o.remote_write = write;
	o.high_watermark = o.low_watermark = 1.0f; /* no background demotion: HOST-only engines
						      would drop stored blocks */
	return tsup_create(&o, NULL);
}

static void
flushall(void)
{
	char line[256];

	assert_int_equal(tsrv_cli(&srv, line, sizeof line, "FLUSHALL"), 0);
}

static long
dbsize(void)
{
	char line[64];

	assert_int_equal(tsrv_cli(&srv, line, sizeof line, "DBSIZE"), 0);
	return atol(line);
}

/* Store caller blocks @ids under @h (pattern tag = 100 + index into hash_of) and finish. */
static struct kvt_ext_done
store(struct kvt_engine *e, struct pool *p, uint32_t tenant, const uint64_t *h,
      const uint32_t *ids, size_t n)
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
	assert_int_equal(d.n_failed, 0);
	return d;
}

/* Load @h into caller blocks @to (wiped first); asserts every block loads. */
static void
load(struct kvt_engine *e, struct pool *p, uint32_t tenant, const uint64_t *h,
     const uint32_t *to, size_t n)
{
	struct kvt_ext_fail f[NB];
	struct kvt_ext_done d;
	uint64_t job;

	if (!n)
		return;
	for (size_t i = 0; i < n; i++)
		wipe(p, to[i]);
	assert_int_equal(kvt_ext_load(e, p->id, tenant, h, to, n, 0, &job), 0);
	d = tsup_ext_finish(e, p->id, job, f, NB);
	for (uint32_t i = 0; i < d.n_failed; i++)
		print_error("load: block %u failed: %s\n", f[d.failed_first + i].block_id,
			    kvt_strerror(f[d.failed_first + i].err));
	assert_int_equal(d.kind, KVT_EXT_LOAD);
	assert_int_equal(d.n_failed, 0);
}

static size_t
lookup(struct kvt_engine *e, struct pool *p, uint32_t tenant, const uint64_t *h, size_t n,
       enum kvt_tier *tier)
{
	size_t hits = SIZE_MAX;

	assert_int_equal(kvt_ext_lookup(e, p->id, tenant, h, n, &hits, tier), 0);
	assert_true(hits <= n);
	return hits;
}

/* The remote worker's fetches landed (kvt_engine_drain waits for them), then a lookup. */
static size_t
lookup_after_fetch(struct kvt_engine *e, struct pool *p, uint32_t tenant, const uint64_t *h,
		   size_t n)
{
	assert_int_equal(kvt_engine_drain(e), 0);
	return lookup(e, p, tenant, h, n, NULL);
}

static struct kvt_ext_stats
xstats(struct kvt_engine *e, struct pool *p)
{
	struct kvt_ext_stats s = { .size = sizeof s };

	assert_int_equal(kvt_ext_stats(e, p->id, &s), 0);
	return s;
}

/* A stores n blocks (caller blocks 0..n-1, tags 100+i) of tenant @tenant under hash_of(i). */
static void
a_stores(struct kvt_engine *a, struct pool *pa, uint32_t tenant, uint32_t n, uint64_t *h)
{
	uint32_t ids[NB];

	for (uint32_t i = 0; i < n; i++) {
		ids[i] = i;
		h[i] = hash_of(i);
		fill(pa, i, 100 + i);
	}
	store(a, pa, tenant, h, ids, n);
	assert_int_equal(kvt_engine_drain(a), 0); /* the write-through puts are done */
}

/* remote_write ALL: A's stored blocks are in redis once each; B misses, fetches, hits, loads
 * every byte; kvt_ext_inflight tells pending meanwhile; a store in B of the fetched hashes is
 * a skip; B's stats and the engine's counters say so. */
static void
test_share_all(void **state)
{
	struct kvt_engine *a = eng(KVT_REMOTE_WRITE_ALL, 16), *b = eng(KVT_REMOTE_WRITE_ALL, 16);
	struct pool pa, pb;
	uint64_t h[6];
	uint32_t to[4] = { 20, 9, 30, 4 }, src[4] = { 0, 1, 2, 3 };
	size_t hits, pending;
	enum kvt_tier tier;
	struct kvt_ext_stats xs;
	struct kvt_ext_done d;

	(void)state;
	flushall();
	pool_make(a, &pa);
	pool_make(b, &pb);
	a_stores(a, &pa, 0, 4, h);
	assert_int_equal(dbsize(), 4);
	/* stored again in A: already there (first writer wins): nothing new */
	d = store(a, &pa, 0, h, src, 4);
	assert_int_equal(d.n_skipped, 4);
	assert_int_equal(kvt_engine_drain(a), 0);
	assert_int_equal(dbsize(), 4);

	/* B: the first lookup misses locally and asks REMOTE */
	assert_int_equal(lookup(b, &pb, 0, h, 4, &tier), 0);
	assert_int_equal(tier, KVT_TIER_COUNT);
	assert_int_equal(xstats(b, &pb).remote_fetch_blocks, 4);
	/* meanwhile: on their way, or landed (then hits) */
	assert_int_equal(kvt_ext_inflight(b, pb.id, 0, h, 4, &hits, &pending), 0);
	assert_int_equal(hits + pending, 4);
	/* a second lookup while they are in flight asks nothing more */
	(void)lookup(b, &pb, 0, h, 4, NULL);
	assert_int_equal(xstats(b, &pb).remote_fetch_blocks, 4);
	assert_int_equal(lookup_after_fetch(b, &pb, 0, h, 4), 4);
	assert_int_equal(lookup(b, &pb, 0, h, 4, &tier), 4);
	assert_int_equal(tier, KVT_TIER_HOST);
	assert_int_equal(kvt_ext_inflight(b, pb.id, 0, h, 4, &hits, &pending), 0);
	assert_int_equal(hits, 4);
	assert_int_equal(pending, 0);
	xs = xstats(b, &pb);
	assert_int_equal(xs.remote_hit_blocks, 4);
	assert_int_equal(xs.stored_blocks, 4);
	assert_int_equal(tsup_stats(b).remote_hit_blocks, 4);
	load(b, &pb, 0, h, to, 4);
	for (uint32_t i = 0; i < 4; i++)
		assert_true(holds(&pb, to[i], 100 + i));
	/* storing them in B now: they are stored (skipped), B writes nothing new */
	for (uint32_t i = 0; i < 4; i++)
		fill(&pb, i, 100 + i);
	d = store(b, &pb, 0, h, src, 4);
	assert_int_equal(d.n_skipped, 4);
	assert_int_equal(kvt_engine_drain(b), 0);
	assert_int_equal(dbsize(), 4);
	tsup_check_engine(a);
	tsup_check_engine(b);
	assert_int_equal(kvt_ext_unregister(b, pb.id), 0);
	assert_int_equal(kvt_ext_unregister(a, pa.id), 0);
	kvt_engine_destroy(a);
	kvt_engine_destroy(b);
	pool_free(&pa);
	pool_free(&pb);
}

/* A hash REMOTE does not have: the fetch ends there; the next lookup within the negative
 * cache's second does not ask again, one after it does; the run before it still lands. */
static void
test_partial_and_negative(void **state)
{
	struct kvt_engine *a = eng(KVT_REMOTE_WRITE_ALL, 16), *b = eng(KVT_REMOTE_WRITE_NONE, 16);
	struct pool pa, pb;
	uint64_t h[6];
	uint32_t to[2] = { 7, 8 };
	uint64_t asked;
	struct timespec ts = { .tv_sec = 1, .tv_nsec = 200000000 };

	(void)state;
	flushall();
	pool_make(a, &pa);
	pool_make(b, &pb);
	a_stores(a, &pa, 0, 2, h);
	h[2] = hash_of(2); /* nowhere */
	h[3] = hash_of(3);
	assert_int_equal(lookup(b, &pb, 0, h, 4, NULL), 0);
	assert_int_equal(lookup_after_fetch(b, &pb, 0, h, 4), 2);
	assert_int_equal(xstats(b, &pb).remote_hit_blocks, 2);
	assert_true(tsup_stats(b).remote_miss_blocks >= 1);
	load(b, &pb, 0, h, to, 2);
	assert_true(holds(&pb, 7, 100));
	assert_true(holds(&pb, 8, 101));
	/* h[2] missed a moment ago: not asked again */
	asked = tsup_stats(b).remote_lookups;
	assert_int_equal(lookup(b, &pb, 0, h, 4, NULL), 2);
	assert_int_equal(lookup_after_fetch(b, &pb, 0, h, 4), 2);
	assert_int_equal(tsup_stats(b).remote_lookups, asked);
	/* after the negative cache's second it is asked again (and still missing) */
	nanosleep(&ts, NULL);
	assert_int_equal(lookup(b, &pb, 0, h, 4, NULL), 2);
	assert_int_equal(tsup_stats(b).remote_lookups, asked + 1);
	assert_int_equal(lookup_after_fetch(b, &pb, 0, h, 4), 2);
	/* B writes nothing (NONE), even for the blocks it loaded */
	assert_int_equal(dbsize(), 2);
	tsup_check_engine(b);
	kvt_engine_destroy(a);
	kvt_engine_destroy(b);
	pool_free(&pa);
	pool_free(&pb);
}

/* remote_write SEEN_TWICE (the default): a block stored once is not put; stored again (a
 * skip) or loaded, it is. NONE: never. */
static void
test_seen_twice_and_none(void **state)
{
	struct kvt_engine *a = eng(KVT_REMOTE_WRITE_SEEN_TWICE, 16);
	struct kvt_engine *n = eng(KVT_REMOTE_WRITE_NONE, 16);
	struct pool pa, pn;
	uint64_t h[4];
	uint32_t ids[4] = { 0, 1, 2, 3 }, to[2] = { 10, 11 };

	(void)state;
	flushall();
	pool_make(a, &pa);
	pool_make(n, &pn);
	a_stores(a, &pa, 0, 4, h);
	assert_int_equal(dbsize(), 0);
	/* stored again: h[0], h[1] seen twice */
	assert_int_equal(store(a, &pa, 0, h, ids, 2).n_skipped, 2);
	assert_int_equal(kvt_engine_drain(a), 0);
	assert_int_equal(dbsize(), 2);
	/* loaded: h[2] seen twice */
	load(a, &pa, 0, h + 2, to, 1);
	assert_true(holds(&pa, 10, 102));
	assert_int_equal(kvt_engine_drain(a), 0);
	assert_int_equal(dbsize(), 3);
	assert_true(tsup_stats(a).remote_wt_stored >= 3);

	flushall();
	a_stores(n, &pn, 0, 4, h);
	assert_int_equal(store(n, &pn, 0, h, ids, 4).n_skipped, 4);
	load(n, &pn, 0, h, to, 2);
	assert_int_equal(kvt_engine_drain(n), 0);
	assert_int_equal(dbsize(), 0);
	assert_int_equal(tsup_stats(n).remote_wt_queued, 0);
	tsup_check_engine(a);
	tsup_check_engine(n);
	kvt_engine_destroy(a);
	kvt_engine_destroy(n);
	pool_free(&pa);
	pool_free(&pn);
}

/* Bytes in redis are untrusted: every value overwritten with garbage is a miss (never loaded,
 * deleted); one bad value in the middle ends the verified run there. Another tenant and
 * another geometry never share. B stays usable: its own stores and loads work. */
static void
test_untrusted_values(void **state)
{
	struct kvt_engine *a = eng(KVT_REMOTE_WRITE_ALL, 16), *b = eng(KVT_REMOTE_WRITE_NONE, 16);
	struct kvt_engine *g = eng(KVT_REMOTE_WRITE_NONE, 16);
	struct pool pa, pb, pg;
	uint64_t h[4];
	uint32_t to[4] = { 12, 13, 14, 15 }, own = 5;
	char line[512];

	(void)state;
	flushall();
	pool_make(a, &pa);
	pool_make(b, &pb);
	pool_make_seg(g, &pg, SEG / 2); /* same model and layout, other segments */
	a_stores(a, &pa, 1, 4, h);
	assert_int_equal(dbsize(), 4);

	/* another tenant: nothing */
	assert_int_equal(lookup(b, &pb, 2, h, 4, NULL), 0);
	assert_int_equal(lookup_after_fetch(b, &pb, 2, h, 4), 0);
	assert_int_equal(xstats(b, &pb).remote_hit_blocks, 0);
	/* another geometry: other keys, nothing */
	assert_int_equal(lookup(g, &pg, 1, h, 4, NULL), 0);
	assert_int_equal(lookup_after_fetch(g, &pg, 1, h, 4), 0);
	assert_int_equal(xstats(g, &pg).remote_hit_blocks, 0);
	assert_int_equal(tsup_stats(g).remote_bad_values, 0);

	/* every value garbage past its header */
	assert_int_equal(tsrv_cli(&srv, line, sizeof line, "EVAL \"local k = redis.call('KEYS', "
				  "'kvt1:*') for _, x in ipairs(k) do redis.call('SETRANGE', x, 300, "
				  "'garbage') end return #k\" 0"), 0);
	assert_int_equal(atoi(line), 4);
	assert_int_equal(lookup(b, &pb, 1, h, 4, NULL), 0);
	assert_int_equal(lookup_after_fetch(b, &pb, 1, h, 4), 0);
	assert_true(tsup_stats(b).remote_bad_values >= 1);
	assert_int_equal(xstats(b, &pb).remote_hit_blocks, 0);
	tsup_check_engine(b);

	/* fresh values; then only the third one garbage: the first two land */
	flushall();
	a_stores(a, &pa, 3, 4, h);
	assert_int_equal(dbsize(), 4);
	/* one of the four (which key is whose is not visible from outside) garbage: the run B
	 * gets ends before it, and what it gets is byte-exact */
	assert_int_equal(tsrv_cli(&srv, line, sizeof line, "EVAL \"local k = redis.call('KEYS', "
				  "'kvt1:*') redis.call('SETRANGE', k[1], 200, 'garbage') return #k\" "
				  "0"), 0);
	assert_int_equal(atoi(line), 4);
	{
		uint64_t bad = tsup_stats(b).remote_bad_values;
		size_t got;

		assert_int_equal(lookup(b, &pb, 3, h, 4, NULL), 0);
		got = lookup_after_fetch(b, &pb, 3, h, 4);
		assert_true(got < 4);
		assert_int_equal(tsup_stats(b).remote_bad_values, bad + 1);
		load(b, &pb, 3, h, to, got);
		for (uint32_t i = 0; i < got; i++)
			assert_true(holds(&pb, to[i], 100 + i));
	}
	/* B is usable: a block of its own stores and loads */
	fill(&pb, own, 7);
	{
		uint64_t mine = 0xabcdefull;
		uint32_t dst = 31;

		store(b, &pb, 3, &mine, &own, 1);
		load(b, &pb, 3, &mine, &dst, 1);
		assert_true(holds(&pb, 31, 7));
	}
	tsup_check_engine(a);
	tsup_check_engine(b);
	tsup_check_engine(g);
	kvt_engine_destroy(a);
	kvt_engine_destroy(b);
	kvt_engine_destroy(g);
	pool_free(&pa);
	pool_free(&pb);
	pool_free(&pg);
}

/* B's HOST has 3 free blocks for a run of 8: the fetch takes what fits (the rest is asked by
 * a later lookup), what lands loads exactly. */
static void
test_host_small(void **state)
{
	struct kvt_engine *a = eng(KVT_REMOTE_WRITE_ALL, 16), *b = eng(KVT_REMOTE_WRITE_NONE, 3);
	struct pool pa, pb;
	uint64_t h[8];
	uint32_t to[8] = { 10, 11, 12, 13, 14, 15, 16, 17 };
	size_t got;

	(void)state;
	flushall();
	pool_make(a, &pa);
	pool_make(b, &pb);
	a_stores(a, &pa, 0, 8, h);
	assert_int_equal(dbsize(), 8);
	assert_int_equal(lookup(b, &pb, 0, h, 8, NULL), 0);
	got = lookup_after_fetch(b, &pb, 0, h, 8);
	assert_true(got >= 1 && got <= 3);
	assert_true(xstats(b, &pb).remote_fetch_blocks <= 3);
	load(b, &pb, 0, h, to, got);
	for (uint32_t i = 0; i < got; i++)
		assert_true(holds(&pb, to[i], 100 + i));
	tsup_check_engine(b);
	kvt_engine_destroy(a);
	kvt_engine_destroy(b);
	pool_free(&pa);
	pool_free(&pb);
}

/* The server stopped (SIGSTOP) while B's fetch is in flight; the pool is unregistered
 * meanwhile: the call returns (the fetch ends by the client's timeout), nothing leaks, the
 * engine checks clean, a new pool works once the server runs again. */
static void
test_unregister_with_fetch(void **state)
{
	struct kvt_engine *a = eng(KVT_REMOTE_WRITE_ALL, 16), *b = eng(KVT_REMOTE_WRITE_NONE, 16);
	struct pool pa, pb, pb2;
	uint64_t h[4];
	uint32_t to[4] = { 3, 2, 1, 0 };
	size_t hits, pending;

	(void)state;
	flushall();
	pool_make(a, &pa);
	pool_make(b, &pb);
	a_stores(a, &pa, 0, 4, h);
	tsrv_signal(&srv, SIGSTOP);
	assert_int_equal(lookup(b, &pb, 0, h, 4, NULL), 0);
	assert_int_equal(kvt_ext_inflight(b, pb.id, 0, h, 4, &hits, &pending), 0);
	assert_int_equal(hits, 0);
	assert_int_equal(pending, 4);
	assert_int_equal(kvt_ext_unregister(b, pb.id), 0);
	tsrv_signal(&srv, SIGCONT);
	assert_int_equal(kvt_ext_lookup(b, pb.id, 0, h, 4, &hits, NULL), -ENOENT);
	tsup_check_engine(b);
	pool_free(&pb);
	/* a new pool on B, the server back: shared again (after the breaker lets it) */
	pool_make(b, &pb2);
	for (int tries = 0; tries < 50; tries++) {
		struct timespec ts = { .tv_sec = 0, .tv_nsec = 100000000 };

		(void)lookup(b, &pb2, 0, h, 4, NULL);
		if (lookup_after_fetch(b, &pb2, 0, h, 4) == 4)
			break;
		nanosleep(&ts, NULL);
	}
	assert_int_equal(lookup(b, &pb2, 0, h, 4, NULL), 4);
	load(b, &pb2, 0, h, to, 4);
	for (uint32_t i = 0; i < 4; i++)
		assert_true(holds(&pb2, to[i], 100 + i));
	tsup_check_engine(b);
	kvt_engine_destroy(a);
	kvt_engine_destroy(b);
	pool_free(&pa);
	pool_free(&pb2);
}

/* While B's fetch is in flight (server stopped): a store of one of its hashes copies the
 * caller's bytes (a fetch may miss: the store must not be lost to it), a drop of another
 * means it never lands; the others land. */
static void
test_store_drop_while_fetching(void **state)
{
	struct kvt_engine *a = eng(KVT_REMOTE_WRITE_ALL, 16), *b = eng(KVT_REMOTE_WRITE_NONE, 16);
	struct pool pa, pb;
	uint64_t h[4];
	uint32_t own = 6, to[4] = { 20, 21, 22, 23 };
	size_t hits, pending;
	struct kvt_ext_done d;

	(void)state;
	flushall();
	pool_make(a, &pa);
	pool_make(b, &pb);
	a_stores(a, &pa, 0, 4, h);
	tsrv_signal(&srv, SIGSTOP);
	assert_int_equal(lookup(b, &pb, 0, h, 4, NULL), 0);
	assert_int_equal(kvt_ext_inflight(b, pb.id, 0, h, 4, &hits, &pending), 0);
	assert_int_equal(pending, 4);
	fill(&pb, own, 9);
	d = store(b, &pb, 0, h, &own, 1);
	assert_int_equal(d.n_skipped, 0);
	assert_int_equal(kvt_ext_drop(b, pb.id, 0, h + 1, 1), 0);
	tsup_check_engine(b);
	tsrv_signal(&srv, SIGCONT);
	assert_int_equal(kvt_engine_drain(b), 0);
	/* h[0]: B's own bytes; h[1]: not there; h[2], h[3]: landed */
	assert_int_equal(kvt_ext_inflight(b, pb.id, 0, h, 4, &hits, &pending), 0);
	assert_int_equal(hits, 1);
	assert_int_equal(pending, 0);
	assert_int_equal(kvt_ext_inflight(b, pb.id, 0, h + 2, 2, &hits, &pending), 0);
	if (hits != 2) /* the stopped server timed the fetch out: nothing landed */
		assert_int_equal(xstats(b, &pb).remote_hit_blocks, 0);
	else
		assert_int_equal(xstats(b, &pb).remote_hit_blocks, 2);
	/* the engine's counter says the same: the detached two are misses (redundant) */
	assert_int_equal(tsup_stats(b).remote_hit_blocks, xstats(b, &pb).remote_hit_blocks);
	load(b, &pb, 0, h, to, 1);
	assert_true(holds(&pb, 20, 9));
	if (hits == 2) {
		load(b, &pb, 0, h + 2, to + 2, 2);
		assert_true(holds(&pb, 22, 102));
		assert_true(holds(&pb, 23, 103));
	}
	tsup_check_engine(b);
	kvt_engine_destroy(a);
	kvt_engine_destroy(b);
	pool_free(&pa);
	pool_free(&pb);
}

/* A lookup that misses makes room for its fetch without losing anything: on a HOST-only
 * engine whose HOST holds the pool's own stored blocks, a lookup of hashes REMOTE does not
 * have evicts none of them; a lookup whose run is longer than HOST never evicts the hits it
 * just reported (each lookup's hits load), and the run grows to what HOST can hold. */
static void
test_fetch_room_loses_nothing(void **state)
{
	struct kvt_engine *a = eng(KVT_REMOTE_WRITE_ALL, 16), *b = eng(KVT_REMOTE_WRITE_NONE, 8);
	struct kvt_engine *c = eng(KVT_REMOTE_WRITE_NONE, 4);
	struct pool pa, pb, pc;
	uint64_t h[8], other[8], lost = 0;
	uint32_t ids[8], to[8];
	struct kvt_ext_removal rm[16];
	size_t got, prev = 0;

	(void)state;
	flushall();
	pool_make(a, &pa);
	pool_make(b, &pb);
	pool_make(c, &pc);
	/* B: 8 blocks of its own fill HOST */
	for (uint32_t i = 0; i < 8; i++) {
		ids[i] = i;
		h[i] = hash_of(50 + i);
		other[i] = hash_of(90 + i);
		to[i] = 16 + i;
		fill(&pb, i, 30 + i);
	}
	store(b, &pb, 0, h, ids, 8);
	assert_int_equal(xstats(b, &pb).stored_blocks, 8);
	assert_int_equal(kvt_ext_removed(b, pb.id, rm, 16, &lost), 0);
	for (int round = 0; round < 4; round++) {
		assert_int_equal(lookup(b, &pb, 0, other, 8, NULL), 0); /* nowhere */
		assert_int_equal(kvt_engine_drain(b), 0);
	}
	assert_int_equal(xstats(b, &pb).stored_blocks, 8);
	assert_int_equal(kvt_ext_removed(b, pb.id, rm, 16, &lost), 0);
	assert_int_equal(lost, 0);
	load(b, &pb, 0, h, to, 8);
	for (uint32_t i = 0; i < 8; i++)
		assert_true(holds(&pb, 16 + i, 30 + i));

	/* C: HOST of 4 blocks, REMOTE has an 8-block run */
	a_stores(a, &pa, 0, 8, h);
	for (int step = 0; step < 6; step++) {
		got = lookup(c, &pc, 0, h, 8, NULL);
		assert_true(got >= prev); /* the hits of one lookup are not taken by the next */
		load(c, &pc, 0, h, to, got); /* this lookup's hits load, every one */
		for (uint32_t i = 0; i < got; i++)
			assert_true(holds(&pc, to[i], 100 + i));
		prev = got;
		assert_int_equal(kvt_engine_drain(c), 0);
	}
	assert_int_equal(prev, 4); /* as much of the run as HOST holds */
	tsup_check_engine(b);
	tsup_check_engine(c);
	kvt_engine_destroy(a);
	kvt_engine_destroy(b);
	kvt_engine_destroy(c);
	pool_free(&pa);
	pool_free(&pb);
	pool_free(&pc);
}

/* Bad input to kvt_ext_inflight and bad REMOTE options: clear errors. */
static void
test_inflight_bad_input(void **state)
{
	struct kvt_engine *b = eng(KVT_REMOTE_WRITE_NONE, 4);
	struct pool pb;
	uint64_t h = 1;
	size_t hits, pending;

	(void)state;
	pool_make(b, &pb);
	assert_int_equal(kvt_ext_inflight(NULL, pb.id, 0, &h, 1, &hits, &pending), -EINVAL);
	assert_int_equal(kvt_ext_inflight(b, pb.id, 0, NULL, 1, &hits, &pending), -EINVAL);
	assert_int_equal(kvt_ext_inflight(b, pb.id, 0, &h, 1, NULL, &pending), -EINVAL);
	assert_int_equal(kvt_ext_inflight(b, pb.id, 0, &h, 1, &hits, NULL), -EINVAL);
	assert_int_equal(kvt_ext_inflight(b, pb.id + 7, 0, &h, 1, &hits, &pending), -ENOENT);
	assert_int_equal(kvt_ext_inflight(b, pb.id, 0, NULL, 0, &hits, &pending), 0);
	assert_int_equal(hits, 0);
	assert_int_equal(pending, 0);
	kvt_engine_destroy(b);
	pool_free(&pb);
	{
		struct kvt_engine_opts o;
		struct kvt_engine *x = NULL;

		tsup_opts_init(&o);
		o.hbm_bytes = tsup_block_bytes();
		o.remote_host = "127.0.0.1";
		o.remote_port = srv.port;
		o.remote_model_id = "ext-model@1";
		o.remote_write = 7;
		assert_int_equal(kvt_engine_create(&o, &x), -EINVAL);
		assert_non_null(strstr(kvt_last_error_message(), "remote_write"));
		o.remote_write = KVT_REMOTE_WRITE_ALL;
		o.remote_no_fetch = 5;
		assert_int_equal(kvt_engine_create(&o, &x), -EINVAL);
		assert_null(x);
	}
}

static int
group_setup(void **state)
{
	(void)state;
	return tsrv_start(&srv, 0, "--maxmemory 64mb --maxmemory-policy allkeys-lru");
}

static int
group_teardown(void **state)
{
	(void)state;
	tsrv_kill(&srv);
	return 0;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_share_all),
		cmocka_unit_test(test_partial_and_negative),
		cmocka_unit_test(test_seen_twice_and_none),
		cmocka_unit_test(test_untrusted_values),
		cmocka_unit_test(test_host_small),
		cmocka_unit_test(test_unregister_with_fetch),
		cmocka_unit_test(test_store_drop_while_fetching),
		cmocka_unit_test(test_fetch_room_loses_nothing),
		cmocka_unit_test(test_inflight_bad_input),
	};

	signal(SIGPIPE, SIG_IGN);
	if (!tsrv_available()) {
		printf("test_ext_remote: redis-server or redis-cli not on PATH: skipped\n");
		return 77;
	}
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
