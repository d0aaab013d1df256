/* SPDX-License-Identifier: MIT */
/*
 * tests/test_remote_prefix.c - the REMOTE tier driven by the engine's prefix paths (issue 18,
 * items 1-4): write-through of sealed prefix blocks (policies all / seen twice / none, first
 * writer wins), remote prefix hits (kvt_seq_match_prefix announces one pipelined lookup, the
 * verified blocks land in HOST, kvt_seq_attach_prefix shares them; what has not landed is a
 * miss), tenants, the write budgets (REMOTE and NVMe: writes refused, hits lost), and the
 * faults against a real redis-server the test starts (tests/support/redis_server.c): a value
 * overwritten with garbage / another layout's / another tenant's bytes, the server killed
 * mid-batch and restarted, allkeys-lru eviction while values are read, SIGSTOP, DEBUG SLEEP.
 * Each: no wrong bytes (every attached block is compared with its pattern), no hang, the
 * engine usable, the counters say so. Written against engine/kvtier.h only (plus the test
 * support, which uses only kvtier.h), as the unseen fault programs are. Skips (77) without
 * redis-server, except the NVMe budget test, which needs none.
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
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvtier.h"
#include "support/kvt_test.h"
#include "support/redis_server.h"

static struct tsrv srv;

struct eng_cfg {
	uint32_t write;        /* enum kvt_remote_write */
	uint32_t tpb;          /* 0: TSUP_TPB */
	uint64_t remote_budget;
	uint32_t period_ms;
	uint32_t op_timeout_ms; /* 0: 300 */
	int prefix_cache;
};

static struct kvt_engine *
eng(uint16_t port, const struct eng_cfg *c)
{
	struct kvt_engine_opts o;
	struct kvt_engine *e = NULL;

	tsup_opts_init(&o);
	if (c && c->tpb)
		o.layout.tokens_per_block = c->tpb;
	o.hbm_bytes = 16 * tsup_block_bytes();
	o.host_bytes = 16 * tsup_block_bytes();
	o.remote_host = "127.0.0.1";
	o.remote_port = port;
	o.remote_model_id = "test-model@1";
	o.remote_connect_timeout_ms = 500;
	o.remote_op_timeout_ms = c && c->op_timeout_ms ? c->op_timeout_ms : 300;
	if (c) {
		o.remote_write = c->write;
		o.remote_write_budget = c->remote_budget;
		o.write_budget_period_ms = c->period_ms ? c->period_ms : 1000;
		o.prefix_cache = (uint32_t)c->prefix_cache;
	}
	if (kvt_engine_create(&o, &e)) {
		print_error("create: %s\n", kvt_last_error_message());
		return NULL;
	}
	return e;
}

/* After a restart on the same port: the server answering is the one this test started (not
 * another program's that took the port meanwhile: the tests FLUSHALL it). */
static void
restart(void)
{
	char line[64];

	assert_int_equal(tsrv_start(&srv, srv.port, srv.extra), 0);
	assert_int_equal(tsrv_cli(&srv, line, sizeof line, "EVAL \"return "
				  "redis.call('INFO', 'server'):match('process_id:(%%d+)')\" 0"), 0);
	assert_int_equal(atoi(line), srv.pid);
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

static int32_t *
toks(uint32_t n)
{
	int32_t *t = malloc(sizeof *t * n);

	assert_non_null(t);
	for (uint32_t i = 0; i < n; i++)
		t[i] = (int32_t)i; /* what tsup_append_write appends */
	return t;
}

/* A sequence of @tenant/@salt with @n tokens of pattern @tag, released through a batch (its
 * full blocks become shareable), left open. */
static kvt_seq_id
sealed_seq(struct kvt_engine *e, uint32_t tenant, uint64_t salt, uint32_t tag, uint32_t n)
{
	kvt_seq_id s = tsup_open(e, tenant, salt, 0);

	assert_int_equal(tsup_append_write(e, s, tag, 0, n), 0);
	assert_int_equal(tsup_verify(e, s, tag), 0); /* a batch: prepare, check, release */
	return s;
}

/* Engine @e, as a second node: announce the prompt (match: the remote lookup), wait for the
 * worker (drain), attach; the attached blocks are compared with pattern @tag. Returns the
 * blocks attached. */
static uint32_t
remote_attach(struct kvt_engine *e, uint32_t tenant, uint64_t salt, uint32_t tag, uint32_t n,
	      bool drain, kvt_seq_id *out)
{
	int32_t *t = toks(n);
	struct kvt_seq_opts so;
	uint64_t matched = 0, att = 0;
	kvt_seq_id s;

	kvt_seq_opts_init(&so, sizeof so);
	so.tenant = tenant;
	so.salt = salt;
	assert_int_equal(kvt_seq_match_prefix(e, &so, t, n, &matched, NULL), 0);
	if (drain)
		assert_int_equal(kvt_engine_drain(e), 0);
	s = tsup_open(e, tenant, salt, 0);
	assert_int_equal(kvt_seq_attach_prefix(e, s, t, n, &att), 0);
	assert_true(att % TSUP_TPB == 0 && att <= n);
	/* the rest is "prefilled" here, then every byte is compared */
	if (att < n)
		assert_int_equal(tsup_append_write(e, s, tag, att, n - att), 0);
	assert_int_equal(tsup_verify(e, s, tag), 0);
	free(t);
	if (out)
		*out = s;
	else
		assert_int_equal(kvt_seq_close(e, s), 0);
	return (uint32_t)(att / TSUP_TPB);
}

/* Policy "all": node A's sealed blocks go remote; node B hits them with one lookup of one
 * round trip, bytes exact; first writer wins (a second writer stores nothing new). */
static void
test_write_through_all(void **state)
{
	struct eng_cfg c = { .write = KVT_REMOTE_WRITE_ALL }, cb = { .prefix_cache = 1 };
	struct kvt_engine *a = eng(srv.port, &c), *b = eng(srv.port, &cb), *a2, *b2;
	struct kvt_stats st;
	uint64_t rt;
	kvt_seq_id s;

	(void)state;
	assert_non_null(a);
	assert_non_null(b);
	flushall();
	s = sealed_seq(a, 3, 0, 21, 5 * TSUP_TPB + 2);
	assert_int_equal(kvt_engine_drain(a), 0);
	st = tsup_stats(a);
	assert_int_equal(st.remote_wt_queued, 5);
	assert_int_equal(st.remote_wt_stored, 5);
	assert_int_equal(st.remote_wt_failed, 0);
	assert_int_equal(dbsize(), 5);
	rt = tsup_stats(b).remote_round_trips;
	assert_int_equal(remote_attach(b, 3, 0, 21, 5 * TSUP_TPB + 2, true, NULL), 5);
	st = tsup_stats(b);
	assert_int_equal(st.remote_lookups, 1);
	assert_int_equal(st.remote_lookup_blocks, 5);
	assert_int_equal(st.remote_hit_blocks, 5);
	assert_int_equal(st.remote_miss_blocks, 0);
	assert_int_equal(st.remote_round_trips - rt, 1); /* one pipelined get for 5 blocks */
	/* a second attach on B is local now: no lookup */
	assert_int_equal(remote_attach(b, 3, 0, 21, 5 * TSUP_TPB, true, NULL), 5);
	assert_int_equal(tsup_stats(b).remote_lookups, 1);
	tsup_check_engine(b);
	/* B's blocks came from REMOTE (REMOTE bit set): B writes none of them back */
	assert_int_equal(tsup_stats(b).remote_wt_queued, 0);
	/* the per-key hint table (16,384 x 24 bytes) is in the metadata figure */
	assert_true(tsup_stats(b).meta_bytes > 16384 * 24);
	/* first writer wins: another node writing other bytes under the same keys (same
	 * tokens, tenant, salt) changes nothing; a third node reads the first writer's bytes */
	assert_int_equal(kvt_seq_close(a, s), 0);
	a2 = eng(srv.port, &c);
	assert_non_null(a2);
	s = sealed_seq(a2, 3, 0, 22, 5 * TSUP_TPB);
	assert_int_equal(kvt_engine_drain(a2), 0);
	assert_int_equal(tsup_stats(a2).remote_wt_stored, 5); /* "already there" counts */
	assert_int_equal(dbsize(), 5);
	assert_int_equal(kvt_seq_close(a2, s), 0);
	kvt_engine_destroy(a2);
	b2 = eng(srv.port, NULL);
	assert_non_null(b2);
	assert_int_equal(remote_attach(b2, 3, 0, 21, 5 * TSUP_TPB, true, NULL), 5);
	kvt_engine_destroy(b2);
	{
		char buf[32768];
		size_t len;

		assert_int_equal(kvt_engine_metrics_text(b, buf, sizeof buf, &len), 0);
		assert_non_null(strstr(buf, "kvtier_remote_hit_blocks_total 5\n"));
		assert_non_null(strstr(buf, "kvtier_remote_lookups_total 1\n"));
	}
	tsup_check_engine(a);
	kvt_engine_destroy(a);
	kvt_engine_destroy(b);
}

/* The default "seen twice": a block sealed once is not put; attached by a second sequence (or
 * sealed again by one that did not attach) it is, once. Policy "none" never puts. */
static void
test_write_through_seen_twice(void **state)
{
	struct kvt_engine *a = eng(srv.port, NULL), *n;
	struct eng_cfg none = { .write = KVT_REMOTE_WRITE_NONE };
	kvt_seq_id s, t, u, w;

	(void)state;
	assert_non_null(a);
	flushall();
	s = sealed_seq(a, 0, 0, 31, 3 * TSUP_TPB + 1);
	assert_int_equal(kvt_engine_drain(a), 0);
	assert_int_equal(dbsize(), 0);
	assert_int_equal(tsup_stats(a).remote_wt_queued, 0);
	/* a second sequence attaches two of them: reuse evidence */
	{
		int32_t *tk = toks(2 * TSUP_TPB);
		uint64_t att = 0;

		t = tsup_open(a, 0, 0, 0);
		assert_int_equal(kvt_seq_attach_prefix(a, t, tk, 2 * TSUP_TPB, &att), 0);
		assert_int_equal(att, 2 * TSUP_TPB);
		free(tk);
	}
	assert_int_equal(kvt_engine_drain(a), 0);
	assert_int_equal(dbsize(), 2);
	assert_int_equal(tsup_stats(a).remote_wt_stored, 2);
	/* sealed again, by a sequence that did not attach, while the first is indexed (another
	 * salt = other keys: tenant 0, salt 5) */
	u = sealed_seq(a, 0, 5, 32, 2 * TSUP_TPB);
	assert_int_equal(kvt_engine_drain(a), 0);
	assert_int_equal(dbsize(), 2);
	w = sealed_seq(a, 0, 5, 32, 2 * TSUP_TPB);
	assert_int_equal(kvt_engine_drain(a), 0);
	assert_int_equal(dbsize(), 4);
	assert_int_equal(kvt_seq_close(a, w), 0);
	assert_int_equal(tsup_stats(a).remote_wt_queued, 4);
	/* a third sequence attaching the same blocks puts nothing again (REMOTE bit) */
	{
		int32_t *tk = toks(2 * TSUP_TPB);
		uint64_t att = 0;
		kvt_seq_id v = tsup_open(a, 0, 0, 0);

		assert_int_equal(kvt_seq_attach_prefix(a, v, tk, 2 * TSUP_TPB, &att), 0);
		assert_int_equal(kvt_seq_close(a, v), 0);
		free(tk);
	}
	assert_int_equal(kvt_engine_drain(a), 0);
	assert_int_equal(tsup_stats(a).remote_wt_queued, 4);
	assert_int_equal(kvt_seq_close(a, s), 0);
	assert_int_equal(kvt_seq_close(a, t), 0);
	assert_int_equal(kvt_seq_close(a, u), 0);
	tsup_check_engine(a);
	kvt_engine_destroy(a);

	flushall();
	n = eng(srv.port, &none);
	assert_non_null(n);
	s = sealed_seq(n, 0, 0, 33, 3 * TSUP_TPB);
	t = sealed_seq(n, 0, 0, 33, 3 * TSUP_TPB);
	assert_int_equal(kvt_engine_drain(n), 0);
	assert_int_equal(dbsize(), 0);
	assert_int_equal(tsup_stats(n).remote_wt_queued, 0);
	assert_int_equal(kvt_seq_close(n, s), 0);
	assert_int_equal(kvt_seq_close(n, t), 0);
	kvt_engine_destroy(n);
}

/* A session restored from REMOTE (kvt_seq_restore_remote) has its blocks' REMOTE bits set: a
 * node writing through every sealed block does not put them back. */
static void
test_restore_no_rewrite(void **state)
{
	struct eng_cfg c = { .write = KVT_REMOTE_WRITE_ALL };
	struct kvt_engine *a = eng(srv.port, NULL), *b = eng(srv.port, &c);
	struct kvt_seq_opts so;
	kvt_seq_id s;

	(void)state;
	assert_non_null(a);
	assert_non_null(b);
	flushall();
	s = tsup_open(a, 0, 0, 0x77);
	assert_int_equal(tsup_append_write(a, s, 35, 0, 3 * TSUP_TPB + 1), 0);
	assert_int_equal(kvt_seq_publish_remote(a, s), 0);
	assert_int_equal(kvt_engine_drain(a), 0);
	assert_int_equal(tsup_stats(a).remote_publishes, 1);
	assert_int_equal(kvt_seq_close(a, s), 0);
	kvt_seq_opts_init(&so, sizeof so);
	assert_int_equal(kvt_seq_restore_remote(b, 0x77, &so, &s), 0);
	assert_int_equal(tsup_verify(b, s, 35), 0); /* a release: the blocks become shareable */
	assert_int_equal(kvt_engine_drain(b), 0);
	assert_int_equal(tsup_stats(b).remote_wt_queued, 0);
	assert_int_equal(kvt_seq_close(b, s), 0);
	kvt_engine_destroy(a);
	kvt_engine_destroy(b);
}

/* Blocks landed from REMOTE sit in HOST and come up through the existing machinery: a hint of
 * the attached sequence promotes them to HBM ahead of its prepare. */
static void
test_remote_then_hint(void **state)
{
	struct eng_cfg c = { .write = KVT_REMOTE_WRITE_ALL };
	struct kvt_engine *a = eng(srv.port, &c), *b = eng(srv.port, NULL);
	struct kvt_seq_opts so;
	int32_t *tk = toks(5 * TSUP_TPB);
	uint64_t m = 0, att = 0;
	enum kvt_tier tier = KVT_TIER_COUNT;
	kvt_seq_id s, t;

	(void)state;
	assert_non_null(a);
	assert_non_null(b);
	flushall();
	s = sealed_seq(a, 0, 0, 37, 5 * TSUP_TPB);
	assert_int_equal(kvt_engine_drain(a), 0);
	kvt_seq_opts_init(&so, sizeof so);
	assert_int_equal(kvt_seq_match_prefix(b, &so, tk, 5 * TSUP_TPB, &m, NULL), 0);
	assert_int_equal(m, 0); /* nothing usable yet: the lookup is announced */
	assert_int_equal(kvt_engine_drain(b), 0);
	assert_int_equal(kvt_seq_match_prefix(b, &so, tk, 5 * TSUP_TPB, &m, &tier), 0);
	assert_int_equal(m, 5 * TSUP_TPB);
	assert_int_equal(tier, KVT_TIER_HOST);
	t = tsup_open(b, 0, 0, 0);
	assert_int_equal(kvt_seq_attach_prefix(b, t, tk, 5 * TSUP_TPB, &att), 0);
	assert_int_equal(att, 5 * TSUP_TPB);
	assert_int_equal(tsup_blocks_in(b, t, KVT_TIER_HOST), 5);
	assert_int_equal(tsup_blocks_in(b, t, KVT_TIER_HBM), 0);
	assert_int_equal(kvt_engine_hint(b, &t, 1, 1), 0);
	assert_int_equal(kvt_engine_drain(b), 0);
	assert_int_equal(tsup_blocks_in(b, t, KVT_TIER_HBM), 5);
	assert_int_equal(tsup_verify(b, t, 37), 0);
	assert_int_equal(kvt_seq_close(b, t), 0);
	assert_int_equal(kvt_seq_close(a, s), 0);
	free(tk);
	tsup_check_engine(b);
	kvt_engine_destroy(a);
	kvt_engine_destroy(b);
}

/* Tenants: B of another tenant (same tokens) misses, B of the same tenant hits. A lookup that
 * finds nothing attaches nothing and the engine goes on. */
static void
test_tenant(void **state)
{
	struct eng_cfg c = { .write = KVT_REMOTE_WRITE_ALL };
	struct kvt_engine *a = eng(srv.port, &c), *b = eng(srv.port, NULL);
	kvt_seq_id s;

	(void)state;
	assert_non_null(a);
	assert_non_null(b);
	flushall();
	s = sealed_seq(a, 7, 0, 41, 4 * TSUP_TPB);
	assert_int_equal(kvt_engine_drain(a), 0);
	assert_int_equal(remote_attach(b, 8, 0, 41, 4 * TSUP_TPB, true, NULL), 0);
	assert_int_equal(tsup_stats(b).remote_hit_blocks, 0);
	assert_int_equal(tsup_stats(b).remote_miss_blocks, 4);
	assert_int_equal(remote_attach(b, 7, 0, 41, 4 * TSUP_TPB, true, NULL), 4);
	assert_int_equal(kvt_seq_close(a, s), 0);
	tsup_check_engine(b);
	kvt_engine_destroy(a);
	kvt_engine_destroy(b);
}

/* Values overwritten with garbage, with another layout's value, with another tenant's bytes:
 * each is a miss (deleted), never served; the longest verified prefix is attached. */
static void
test_bad_values(void **state)
{
	struct eng_cfg c = { .write = KVT_REMOTE_WRITE_ALL };
	struct eng_cfg c8 = { .write = KVT_REMOTE_WRITE_ALL, .tpb = 2 * TSUP_TPB };
	struct kvt_engine *a = eng(srv.port, &c), *b = eng(srv.port, NULL), *l;
	char line[512];
	kvt_seq_id s, t;

	(void)state;
	assert_non_null(a);
	assert_non_null(b);
	/* garbage: every value of tenant 1 */
	flushall();
	s = sealed_seq(a, 1, 0, 51, 3 * TSUP_TPB);
	assert_int_equal(kvt_engine_drain(a), 0);
	assert_int_equal(dbsize(), 3);
	assert_int_equal(tsrv_cli(&srv, line, sizeof line, "EVAL \"local k = redis.call('KEYS', "
				  "'kvt1:*') for _, x in ipairs(k) do redis.call('SETRANGE', x, 300, "
				  "'garbage') end return #k\" 0"), 0);
	assert_int_equal(atoi(line), 3);
	assert_int_equal(remote_attach(b, 1, 0, 51, 3 * TSUP_TPB, true, NULL), 0);
	assert_true(tsup_stats(b).remote_bad_values >= 1);
	assert_int_equal(tsup_stats(b).remote_hit_blocks, 0);
	assert_int_equal(kvt_seq_close(a, s), 0);

	/* another tenant's bytes under this tenant's keys: tenant 2's values copied over tenant
	 * 1's (same tokens, same layout; salt 2: keys A has not put yet) */
	flushall();
	s = sealed_seq(a, 1, 2, 52, 2 * TSUP_TPB);
	t = sealed_seq(a, 2, 2, 53, 2 * TSUP_TPB);
	assert_int_equal(kvt_engine_drain(a), 0);
	assert_int_equal(dbsize(), 4);
	/* keys are "kvt1:<ns>:<tenant>:<hash>": overwrite every tenant-1 key with a tenant-2
	 * value */
	assert_int_equal(tsrv_cli(&srv, line, sizeof line, "EVAL \"local a = redis.call('KEYS', "
				  "'kvt1:*:00000001:*') local b = redis.call('KEYS', "
				  "'kvt1:*:00000002:*') for i, x in ipairs(a) do redis.call('SET', x, "
				  "redis.call('GET', b[i])) end return #a\" 0"), 0);
	assert_int_equal(atoi(line), 2);
	assert_int_equal(remote_attach(b, 1, 2, 52, 2 * TSUP_TPB, true, NULL), 0);
	/* tenant 2's own values are intact: hits */
	assert_int_equal(remote_attach(b, 2, 2, 53, 2 * TSUP_TPB, true, NULL), 2);
	assert_int_equal(kvt_seq_close(a, s), 0);
	assert_int_equal(kvt_seq_close(a, t), 0);

	/* another layout's value (8 tokens per block: another namespace and block size) under
	 * our key */
	flushall();
	l = eng(srv.port, &c8);
	assert_non_null(l);
	t = tsup_open(l, 1, 3, 0);
	assert_int_equal(tsup_append_write(l, t, 54, 0, 2 * 2 * TSUP_TPB), 0);
	/* (the test pattern assumes TSUP_TPB: its bytes are not checked here) a park makes
	 * the blocks shareable, and so written through */
	assert_int_equal(kvt_seq_park(l, t, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(l), 0);
	s = sealed_seq(a, 1, 3, 55, 2 * TSUP_TPB);
	assert_int_equal(kvt_engine_drain(a), 0);
	assert_int_equal(dbsize(), 4);
	assert_int_equal(tsrv_cli(&srv, line, sizeof line, "EVAL \"local k = redis.call('KEYS', "
				  "'kvt1:*') local o = {} for _, x in ipairs(k) do if "
				  "redis.call('STRLEN', x) > %llu then o[#o+1] = x end end local n = 0 "
				  "for _, x in ipairs(k) do if redis.call('STRLEN', x) <= %llu then "
				  "n = n + 1 redis.call('SET', x, redis.call('GET', o[1])) end end "
				  "return n\" 0", (unsigned long long)(tsup_block_bytes() + 128),
				  (unsigned long long)(tsup_block_bytes() + 128)), 0);
	assert_int_equal(atoi(line), 2);
	assert_int_equal(remote_attach(b, 1, 3, 55, 2 * TSUP_TPB, true, NULL), 0);
	assert_int_equal(tsup_stats(b).remote_hit_blocks, 2);
	assert_int_equal(kvt_seq_close(a, s), 0);
	assert_int_equal(kvt_seq_close(l, t), 0);
	tsup_check_engine(b);
	kvt_engine_destroy(l);
	kvt_engine_destroy(a);
	kvt_engine_destroy(b);
}

/* The server killed mid-batch (the lookup queued, the server gone before the worker sends)
 * and restarted on its port: the lookup is a miss, the drain returns, the engine keeps working
 * locally, and once the breaker's trial reconnects lookups hit again. */
static void
test_server_killed(void **state)
{
	struct eng_cfg c = { .write = KVT_REMOTE_WRITE_ALL };
	struct kvt_engine *a = eng(srv.port, &c), *b = eng(srv.port, NULL);
	struct kvt_stats st;
	uint32_t got = 0;
	kvt_seq_id s, t;

	(void)state;
	assert_non_null(a);
	assert_non_null(b);
	flushall();
	s = sealed_seq(a, 0, 0, 61, 4 * TSUP_TPB);
	assert_int_equal(kvt_engine_drain(a), 0);
	assert_int_equal(dbsize(), 4);
	tsrv_kill(&srv);
	assert_int_equal(remote_attach(b, 0, 0, 61, 4 * TSUP_TPB, true, &t), 0);
	st = tsup_stats(b);
	assert_int_equal(st.remote_hit_blocks, 0);
	assert_true(st.remote_errors >= 1);
	/* write-through while the server is down: failed, counted, never blocking */
	assert_int_equal(kvt_seq_close(a, s), 0);
	s = sealed_seq(a, 0, 9, 62, 3 * TSUP_TPB);
	assert_int_equal(kvt_engine_drain(a), 0);
	assert_int_equal(tsup_stats(a).remote_wt_failed, 3);
	/* the engine is usable meanwhile */
	assert_int_equal(tsup_verify(b, t, 61), 0);
	assert_int_equal(kvt_seq_close(b, t), 0);
	restart();
	/* an empty server after the restart: write the blocks again (their REMOTE bit was
	 * cleared by the failure), then B hits once the breaker lets the client reconnect */
	for (int i = 0; i < 200 && !got; i++) {
		assert_int_equal(kvt_seq_close(a, s), 0);
		s = sealed_seq(a, 0, 9, 62, 3 * TSUP_TPB);
		assert_int_equal(kvt_engine_drain(a), 0);
		got = remote_attach(b, 0, 9, 62, 3 * TSUP_TPB, true, NULL);
		if (!got)
			usleep(50000);
	}
	assert_int_equal(got, 3);
	assert_int_equal(kvt_seq_close(a, s), 0);
	tsup_check_engine(a);
	tsup_check_engine(b);
	kvt_engine_destroy(a);
	kvt_engine_destroy(b);
}

/* Killed mid-batch: the server is stopped while the worker waits for the replies of a lookup
 * and of a write-through it sent, then SIGKILLed (a reset under a pending batch): both fail
 * clearly, the drain returns, nothing is attached, the engine goes on; restarted, it serves. */
static void
test_killed_mid_batch(void **state)
{
	struct eng_cfg c = { .write = KVT_REMOTE_WRITE_ALL, .op_timeout_ms = 5000 };
	struct kvt_engine *a = eng(srv.port, &c), *b = eng(srv.port, &c), *d;
	struct kvt_stats st;
	uint32_t got = 0;
	kvt_seq_id s, t, u;

	(void)state;
	assert_non_null(a);
	assert_non_null(b);
	flushall();
	s = sealed_seq(a, 0, 0, 65, 4 * TSUP_TPB);
	assert_int_equal(kvt_engine_drain(a), 0);
	tsrv_signal(&srv, SIGSTOP);
	/* B: a lookup (the attach does not wait for it) and a write-through of its own blocks */
	assert_int_equal(remote_attach(b, 0, 0, 65, 4 * TSUP_TPB, false, &t), 0);
	u = sealed_seq(b, 0, 11, 66, 3 * TSUP_TPB);
	usleep(100000); /* ordering only: the worker has written its pipelines by now */
	/* SIGKILL while stopped (tsrv_kill would SIGCONT first, letting it answer) */
	tsrv_signal(&srv, SIGKILL);
	tsrv_kill(&srv);
	assert_int_equal(kvt_engine_drain(b), 0);
	st = tsup_stats(b);
	assert_int_equal(st.remote_hit_blocks, 0);
	assert_int_equal(st.remote_miss_blocks, 4);
	print_message("mid-batch: wt queued %llu stored %llu failed %llu errors %llu lookups %llu "
		      "%llu bad %llu\n",
		      (unsigned long long)st.remote_wt_queued, (unsigned long long)st.remote_wt_stored,
		      (unsigned long long)st.remote_wt_failed, (unsigned long long)st.remote_errors,
		      (unsigned long long)st.remote_lookups,
		      (unsigned long long)st.remote_lookup_blocks,
		      (unsigned long long)st.remote_bad_values);
	/* the 4 blocks B prefilled itself (policy all) and u's 3 */
	assert_int_equal(st.remote_wt_failed, 7);
	assert_int_equal(st.remote_wt_stored, 0);
	assert_true(st.remote_errors >= 1);
	assert_int_equal(tsup_verify(b, t, 65), 0);
	assert_int_equal(tsup_verify(b, u, 66), 0);
	assert_int_equal(kvt_seq_close(b, t), 0);
	assert_int_equal(kvt_seq_close(b, u), 0);
	tsup_check_engine(b);
	restart();
	/* B writes the blocks to the emptied server once its breaker lets it reconnect (a
	 * failed put cleared their REMOTE bits); a fresh node then hits them, exact */
	for (int i = 0; i < 200 && dbsize() < 4; i++) {
		u = sealed_seq(b, 0, 0, 65, 4 * TSUP_TPB);
		assert_int_equal(kvt_seq_close(b, u), 0);
		assert_int_equal(kvt_engine_drain(b), 0);
		if (dbsize() < 4)
			usleep(50000);
	}
	assert_int_equal(dbsize(), 4);
	d = eng(srv.port, NULL);
	assert_non_null(d);
	got = remote_attach(d, 0, 0, 65, 4 * TSUP_TPB, true, NULL);
	assert_int_equal(got, 4);
	kvt_engine_destroy(d);
	assert_int_equal(kvt_seq_close(a, s), 0);
	tsup_check_engine(a);
	kvt_engine_destroy(a);
	kvt_engine_destroy(b);
}

/* A remote prefix lookup is a guess: the room for it loses nothing. HOST (no NVMe) full of a
 * closed sequence's cached prefix blocks; a match of other tokens asks REMOTE, which has none
 * of them: every cached block is still matched afterwards (the lookup used to evict them to
 * make room for the fetch). */
static void
test_lookup_loses_no_cached_block(void **state)
{
	struct eng_cfg c = { .write = KVT_REMOTE_WRITE_NONE, .prefix_cache = 1 };
	struct kvt_engine *e = eng(srv.port, &c);
	int32_t *t = toks(16 * TSUP_TPB);
	struct kvt_seq_opts so;
	uint64_t matched = 0;
	kvt_seq_id s;

	(void)state;
	assert_non_null(e);
	flushall();
	s = sealed_seq(e, 1, 0, 81, 16 * TSUP_TPB);
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_close(e, s), 0);
	kvt_seq_opts_init(&so, sizeof so);
	so.tenant = 1;
	assert_int_equal(kvt_seq_match_prefix(e, &so, t, 16 * TSUP_TPB, &matched, NULL), 0);
	assert_int_equal(matched, 16 * TSUP_TPB);
	for (uint64_t salt = 5; salt < 9; salt++) {
		so.salt = salt; /* other keys: local misses, REMOTE asked */
		assert_int_equal(kvt_seq_match_prefix(e, &so, t, 16 * TSUP_TPB, &matched, NULL), 0);
		assert_int_equal(kvt_engine_drain(e), 0);
	}
	so.salt = 0;
	assert_int_equal(kvt_seq_match_prefix(e, &so, t, 16 * TSUP_TPB, &matched, NULL), 0);
	assert_int_equal(matched, 16 * TSUP_TPB);
	assert_int_equal(remote_attach(e, 1, 0, 81, 16 * TSUP_TPB, false, NULL), 16);
	tsup_check_engine(e);
	free(t);
	kvt_engine_destroy(e);
}

/* A 3-master Redis Cluster: write-through spreads the blocks over the masters, a lookup of all
 * of them is one round trip (no redirect) and exact. */
static void
test_cluster(void **state)
{
	struct tsrv cl[3];
	struct eng_cfg c = { .write = KVT_REMOTE_WRITE_ALL };
	struct kvt_engine *a, *b;
	uint64_t rt;
	kvt_seq_id s;

	(void)state;
	memset(cl, 0, sizeof cl);
	assert_int_equal(tsrv_cluster(cl, 3), 0);
	a = eng(cl[0].port, &c);
	b = eng(cl[2].port, NULL);
	assert_non_null(a);
	assert_non_null(b);
	s = sealed_seq(a, 4, 0, 67, 12 * TSUP_TPB);
	assert_int_equal(kvt_engine_drain(a), 0);
	assert_int_equal(tsup_stats(a).remote_wt_stored, 12);
	rt = tsup_stats(b).remote_round_trips;
	assert_int_equal(remote_attach(b, 4, 0, 67, 12 * TSUP_TPB, true, NULL), 12);
	assert_true(tsup_stats(b).remote_round_trips - rt <= 2);
	assert_int_equal(kvt_seq_close(a, s), 0);
	tsup_check_engine(b);
	kvt_engine_destroy(a);
	kvt_engine_destroy(b);
	for (int i = 0; i < 3; i++)
		tsrv_kill(&cl[i]);
}

/* A SIGSTOPped server (a partition): the match returns at once, the attach does not wait for
 * the lookup (the blocks in flight are recomputed: late), the drain ends within the timeouts,
 * the engine works locally throughout. */
static void
test_stopped_server(void **state)
{
	struct eng_cfg c = { .write = KVT_REMOTE_WRITE_ALL };
	struct kvt_engine *a = eng(srv.port, &c), *b = eng(srv.port, NULL);
	struct kvt_stats st;
	kvt_seq_id s, t, u;

	(void)state;
	assert_non_null(a);
	assert_non_null(b);
	flushall();
	s = sealed_seq(a, 0, 0, 71, 4 * TSUP_TPB);
	assert_int_equal(kvt_engine_drain(a), 0);
	tsrv_signal(&srv, SIGSTOP);
	/* no drain between match and attach: the lookup is still in flight (the server is
	 * stopped), so the attach gets nothing and never waits */
	assert_int_equal(remote_attach(b, 0, 0, 71, 4 * TSUP_TPB, false, &t), 0);
	st = tsup_stats(b);
	assert_int_equal(st.remote_late_blocks, 1);
	tsup_check_engine(b); /* with the fetch's INFLIGHT HOST copies */
	u = tsup_seq_written(b, 72, 9);
	assert_int_equal(tsup_verify(b, u, 72), 0);
	assert_int_equal(kvt_engine_drain(b), 0); /* bounded by the op timeout */
	st = tsup_stats(b);
	assert_int_equal(st.remote_hit_blocks, 0);
	assert_int_equal(st.remote_miss_blocks, 4);
	tsrv_signal(&srv, SIGCONT);
	assert_int_equal(kvt_seq_close(b, t), 0);
	assert_int_equal(kvt_seq_close(b, u), 0);
	assert_int_equal(kvt_seq_close(a, s), 0);
	tsup_check_engine(b);
	kvt_engine_destroy(a);
	kvt_engine_destroy(b);
}

/* A slow server (DEBUG SLEEP longer than the op timeout): the lookup times out (a miss), the
 * engine goes on; after the sleep, lookups hit again. */
static void
test_slow_server(void **state)
{
	struct eng_cfg c = { .write = KVT_REMOTE_WRITE_ALL };
	struct kvt_engine *a = eng(srv.port, &c), *b = eng(srv.port, NULL);
	char line[64];
	uint32_t got = 0;
	kvt_seq_id s;
	pid_t pid;
	int st;

	(void)state;
	assert_non_null(a);
	assert_non_null(b);
	flushall();
	s = sealed_seq(a, 0, 0, 81, 3 * TSUP_TPB);
	assert_int_equal(kvt_engine_drain(a), 0);
	fflush(NULL);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(tsrv_cli(&srv, line, sizeof line, "DEBUG SLEEP 1.5") ? 1 : 0);
	/* give the child's DEBUG SLEEP time to reach the server (ordering only: what is
	 * asserted holds either way: exact bytes or a miss, no hang) */
	usleep(300000);
	got = remote_attach(b, 0, 0, 81, 3 * TSUP_TPB, true, NULL);
	assert_true(got == 0 || got == 3);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0); /* DEBUG is enabled (setup) */
	/* deterministic slowness: CLIENT PAUSE answers at once, then every client waits past
	 * the 300 ms op timeout: the lookup misses, the engine goes on */
	assert_int_equal(tsrv_cli(&srv, line, sizeof line, "CLIENT PAUSE 1500 ALL"), 0);
	assert_int_equal(remote_attach(b, 0, 0, 81, 3 * TSUP_TPB, true, NULL), 0);
	assert_true(tsup_stats(b).remote_errors >= 1);
	got = 0;
	for (int i = 0; i < 200 && got != 3; i++) {
		got = remote_attach(b, 0, 0, 81, 3 * TSUP_TPB, true, NULL);
		if (got != 3)
			usleep(50000);
	}
	assert_int_equal(got, 3);
	assert_int_equal(kvt_seq_close(a, s), 0);
	tsup_check_engine(b);
	kvt_engine_destroy(a);
	kvt_engine_destroy(b);
}

/* A full server evicting (allkeys-lru, small maxmemory) while values are read: every prompt
 * attaches only verified blocks (a prefix of its chain), bytes exact; some are gone. */
static void
test_lru_eviction(void **state)
{
	struct tsrv small = { 0 };
	struct eng_cfg c = { .write = KVT_REMOTE_WRITE_ALL };
	struct kvt_engine *a, *b;
	uint32_t hits = 0, total = 0;
	char line[64];

	(void)state;
	assert_int_equal(tsrv_start(&small, 0, "--maxmemory 2mb --maxmemory-policy allkeys-lru"),
			 0);
	a = eng(small.port, &c);
	b = eng(small.port, NULL);
	assert_non_null(a);
	assert_non_null(b);
	/* 400 prompts of 8 blocks (each ~1.2 KiB with the header and key): far past 2 MiB */
	for (uint32_t p = 0; p < 400; p++) {
		kvt_seq_id s = sealed_seq(a, 0, 1000 + p, 90, 8 * TSUP_TPB);

		assert_int_equal(kvt_seq_close(a, s), 0);
		if (p % 32 == 31)
			assert_int_equal(kvt_engine_drain(a), 0);
	}
	assert_int_equal(kvt_engine_drain(a), 0);
	assert_int_equal(tsrv_cli(&small, line, sizeof line, "INFO stats"), 0);
	for (uint32_t p = 0; p < 400; p += 7) {
		hits += remote_attach(b, 0, 1000 + p, 90, 8 * TSUP_TPB, true, NULL);
		total += 8;
	}
	print_message("lru: %u of %u blocks hit\n", hits, total);
	assert_true(hits < total);
	assert_true(hits > 0);
	tsup_check_engine(b);
	kvt_engine_destroy(a);
	kvt_engine_destroy(b);
	tsrv_kill(&small);
}

/* The REMOTE write budget: with room for about two blocks per (long) period, blocks without
 * reuse evidence are admitted only while half the bucket stays; refused writes are counted
 * (bytes saved) and a later lookup that misses one is a hit lost. */
static void
test_remote_budget(void **state)
{
	uint64_t vb = tsup_block_bytes() + 128;
	struct eng_cfg c = { .write = KVT_REMOTE_WRITE_ALL, .remote_budget = 2 * vb,
			     .period_ms = 3600000 };
	struct kvt_engine *a = eng(srv.port, &c);
	struct kvt_stats st;
	kvt_seq_id s;

	(void)state;
	assert_non_null(a);
	flushall();
	s = sealed_seq(a, 0, 0, 95, 5 * TSUP_TPB);
	assert_int_equal(kvt_engine_drain(a), 0);
	st = tsup_stats(a);
	assert_int_equal(st.remote_wt_queued, 1);
	assert_int_equal(st.wb_refused[1], 4);
	assert_int_equal(st.wb_refused_bytes[1], 4 * vb);
	assert_int_equal(st.wb_admitted_bytes[1], vb);
	assert_int_equal(dbsize(), 1);
	/* with evidence (a second sequence attaches) one more fits: the other half */
	{
		int32_t *tk = toks(5 * TSUP_TPB);
		uint64_t att = 0;
		kvt_seq_id t = tsup_open(a, 0, 0, 0);

		assert_int_equal(kvt_seq_attach_prefix(a, t, tk, 5 * TSUP_TPB, &att), 0);
		assert_int_equal(att, 5 * TSUP_TPB);
		assert_int_equal(kvt_seq_close(a, t), 0);
		free(tk);
	}
	assert_int_equal(kvt_engine_drain(a), 0);
	st = tsup_stats(a);
	assert_int_equal(st.remote_wt_queued, 2);
	assert_int_equal(dbsize(), 2);
	/* the local copies go (no prefix cache); a lookup finds blocks 0 and 1 remotely and
	 * misses block 2, whose write was refused: a hit lost */
	assert_int_equal(kvt_seq_close(a, s), 0);
	assert_int_equal(remote_attach(a, 0, 0, 95, 5 * TSUP_TPB, true, NULL), 2);
	st = tsup_stats(a);
	assert_int_equal(st.wb_hits_lost[1], 1);
	{
		char buf[32768];
		size_t len;

		assert_int_equal(kvt_engine_metrics_text(a, buf, sizeof buf, &len), 0);
		assert_non_null(strstr(buf, "kvtier_write_budget_hits_lost_total"
					    "{target=\"remote\"} 1\n"));
	}
	tsup_check_engine(a);
	kvt_engine_destroy(a);
}

/* The NVMe write budget (no server needed): cached prefix blocks (prefix_cache, refs 0) that
 * HOST evicts are dropped instead of written once the bucket is spent; a live sequence's only
 * copies are always written (and charged); a later prompt missing a dropped block counts a
 * hit lost. */
static void
test_nvme_budget(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_engine *e;
	char *dir = tsup_mkdtemp();
	struct kvt_stats st;
	kvt_seq_id s, live;

	(void)state;
	tsup_opts_init(&o);
	o.hbm_bytes = 8 * tsup_block_bytes();
	o.host_bytes = 4 * tsup_block_bytes();
	o.nvme_dir = dir;
	o.nvme_bytes = 64 * (4096 + 4096);
	o.prefix_cache = 1;
	o.nvme_write_budget = 2 * tsup_block_bytes();
	o.write_budget_period_ms = 3600000;
	o.high_watermark = 1.0f;
	o.low_watermark = 1.0f;
	e = tsup_create(&o, NULL);
	assert_non_null(e);
	/* 4 cached blocks (the sequence closes) */
	s = sealed_seq(e, 0, 0, 96, 4 * TSUP_TPB);
	assert_int_equal(kvt_seq_close(e, s), 0);
	/* a live sequence of 16 blocks pushes everything down through HOST to NVMe */
	live = tsup_seq_written(e, 97, 16 * TSUP_TPB);
	assert_int_equal(kvt_engine_drain(e), 0);
	st = tsup_stats(e);
	print_message("nvme budget: admitted %llu refused %llu (%llu bytes)\n",
		      (unsigned long long)st.wb_admitted_bytes[0],
		      (unsigned long long)st.wb_refused[0],
		      (unsigned long long)st.wb_refused_bytes[0]);
	assert_true(st.wb_refused[0] >= 1);
	assert_int_equal(st.wb_refused_bytes[0], st.wb_refused[0] * tsup_block_bytes());
	/* the prompt again: it misses at the first dropped block, a hit lost */
	{
		int32_t *tk = toks(4 * TSUP_TPB);
		uint64_t m = 0;

		assert_int_equal(kvt_seq_match_prefix(e, NULL, tk, 4 * TSUP_TPB, &m, NULL), 0);
		assert_true(m < 4 * TSUP_TPB);
		free(tk);
	}
	st = tsup_stats(e);
	assert_int_equal(st.wb_hits_lost[0], 1);
	assert_int_equal(kvt_seq_close(e, live), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
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
	const struct CMUnitTest local[] = {
		cmocka_unit_test(test_nvme_budget),
	};
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_write_through_all),
		cmocka_unit_test(test_write_through_seen_twice),
		cmocka_unit_test(test_tenant),
		cmocka_unit_test(test_restore_no_rewrite),
		cmocka_unit_test(test_remote_then_hint),
		cmocka_unit_test(test_bad_values),
		cmocka_unit_test(test_remote_budget),
		cmocka_unit_test(test_stopped_server),
		cmocka_unit_test(test_slow_server),
		cmocka_unit_test(test_lru_eviction),
		cmocka_unit_test(test_server_killed),
		cmocka_unit_test(test_killed_mid_batch),
		cmocka_unit_test(test_cluster),
		cmocka_unit_test(test_lookup_loses_no_cached_block),
	};
	int rc;

	signal(SIGPIPE, SIG_IGN);
	rc = cmocka_run_group_tests(local, NULL, NULL);
	if (rc)
		return rc;
	if (!tsrv_available()) {
		printf("test_remote_prefix: redis-server or redis-cli not on PATH: skipped\n");
		return 77;
	}
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
