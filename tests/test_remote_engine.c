/* SPDX-License-Identifier: MIT */
/*
 * tests/test_remote_engine.c - the engine side of the REMOTE tier (issue 18, items 1 and 4):
 * sessions published by one engine (kvt_seq_publish_remote) and reopened by another engine in
 * another process (kvt_seq_restore_remote; fork + exec of this binary) through one
 * redis-server this test starts (tests/support/redis_server.c); another tenant misses;
 * garbage, flipped bytes or a FLUSHALL are -ENOENT, never wrong bytes; a SIGSTOPped server
 * costs the worker its timeouts, the engine stays usable; a dead server at create fails
 * clearly. Skips (77) without redis-server.
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

static struct kvt_engine *
remote_engine(uint16_t port, int *rc_out)
{
	struct kvt_engine_opts o;
	struct kvt_engine *e = NULL;
	int rc;

	tsup_opts_init(&o);
	o.hbm_bytes = 16 * tsup_block_bytes();
	o.host_bytes = 8 * tsup_block_bytes();
	o.remote_host = "127.0.0.1";
	o.remote_port = port;
	o.remote_model_id = "test-model@1";
	o.remote_connect_timeout_ms = 500;
	o.remote_op_timeout_ms = 300;
	rc = kvt_engine_create(&o, &e);
	if (rc_out)
		*rc_out = rc;
	else if (rc)
		print_error("create: %s\n", kvt_last_error_message());
	return e;
}

/* Publish session @key (tenant @tenant, @n tokens of pattern @tag) and drain; the sequence is
 * closed afterwards (the remote copy is a snapshot). Returns the stats after the drain. */
static struct kvt_stats
publish(struct kvt_engine *e, uint64_t key, uint32_t tenant, uint32_t tag, uint32_t n)
{
	kvt_seq_id s = tsup_open(e, tenant, 0, key);

	assert_int_equal(tsup_append_write(e, s, tag, 0, n), 0);
	assert_int_equal(kvt_seq_publish_remote(e, s), 0);
	assert_int_equal(kvt_seq_close(e, s), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	return tsup_stats(e);
}

/* The child's side (a fresh process image: this binary exec'ed with --restore-child): its own
 * engine restores @key as @tenant and compares with pattern @tag (and @n tokens when != 0).
 * Exit status: 0 restored exact, 10 + -rc for a failed restore, 2 wrong bytes, 3 a broken
 * engine, 5 wrong length. */
static int
restore_child_main(uint16_t port, uint64_t key, uint32_t tenant, uint32_t tag, uint64_t n)
{
	struct kvt_engine *e = remote_engine(port, NULL);
	struct kvt_seq_opts so;
	struct kvt_seq_info in;
	kvt_seq_id s = 0;
	int rc;

	if (!e)
		return 3;
	kvt_seq_opts_init(&so, sizeof so);
	so.tenant = tenant;
	rc = kvt_seq_restore_remote(e, key, &so, &s);
	if (rc) {
		/* the engine stays usable after a miss */
		kvt_seq_id t;

		kvt_seq_opts_init(&so, sizeof so);
		if (kvt_seq_open(e, &so, &t) || tsup_append_write(e, t, 99, 0, 9) ||
		    tsup_verify(e, t, 99) != 0)
			return 3;
		kvt_engine_destroy(e);
		return rc < 0 && rc > -100 ? 10 - rc : 4;
	}
	if (kvt_seq_info(e, s, &in) || (n && in.n_tokens != n))
		return 5;
	rc = tsup_verify(e, s, tag);
	kvt_engine_destroy(e);
	return rc == 0 ? 0 : 2;
}

/* Restore in another process (fork + exec of this binary); its exit status as above. */
static int
child_restore_n(uint64_t key, uint32_t tenant, uint32_t tag, uint64_t n)
{
	char a[5][32];
	pid_t pid;
	int st = 0;

	snprintf(a[0], sizeof a[0], "%u", srv.port);
	snprintf(a[1], sizeof a[1], "%llu", (unsigned long long)key);
	snprintf(a[2], sizeof a[2], "%u", tenant);
	snprintf(a[3], sizeof a[3], "%u", tag);
	snprintf(a[4], sizeof a[4], "%llu", (unsigned long long)n);
	fflush(NULL);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		execl("/proc/self/exe", "test_remote_engine", "--restore-child", a[0], a[1], a[2],
		      a[3], a[4], (char *)NULL);
		_exit(127);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	return WEXITSTATUS(st);
}

static int
child_restore(uint64_t key, uint32_t tenant, uint32_t tag)
{
	return child_restore_n(key, tenant, tag, 0);
}

static void
flushall(void)
{
	char line[256];

	assert_int_equal(tsrv_cli(&srv, line, sizeof line, "FLUSHALL"), 0);
}

/* The first key matching @pattern (redis-cli KEYS). */
static void
first_key(const char *pattern, char *out, size_t cap)
{
	assert_int_equal(tsrv_cli(&srv, out, cap, "KEYS %s", pattern), 0);
	assert_true(strncmp(out, "kvt1:", 5) == 0);
}

/* Published in this process, restored exact in another; full blocks and a partial one. */
static void
test_two_processes(void **state)
{
	struct kvt_engine *e = remote_engine(srv.port, NULL);
	struct kvt_stats st;

	(void)state;
	assert_non_null(e);
	flushall();
	/* block values are content-addressed (tokens, salt, tenant): the test's patterns of
	 * the same tokens differ, so each pattern goes under its own tenant */
	st = publish(e, 0x51, 7, 7, 4 * TSUP_TPB + 2);
	assert_int_equal(st.remote_publishes, 1);
	assert_int_equal(st.remote_publish_failed, 0);
	assert_int_equal(st.remote_blocks_put, 4);
	assert_true(st.remote_bytes_out > 4 * tsup_block_bytes());
	assert_int_equal(child_restore_n(0x51, 7, 7, 4 * TSUP_TPB + 2), 0);
	/* an exact multiple of the block size: no partial block */
	st = publish(e, 0x52, 8, 8, 3 * TSUP_TPB);
	assert_int_equal(st.remote_publishes, 2);
	assert_int_equal(child_restore_n(0x52, 8, 8, 3 * TSUP_TPB), 0);
	/* a session longer than HBM (16 blocks) comes back block by block */
	st = publish(e, 0x53, 9, 9, 15 * TSUP_TPB + 1);
	assert_int_equal(st.remote_publishes, 3);
	assert_int_equal(child_restore_n(0x53, 9, 9, 15 * TSUP_TPB + 1), 0);
	/* a second publish of the same key replaces its session value */
	st = publish(e, 0x51, 7, 7, 2 * TSUP_TPB + 3);
	assert_int_equal(child_restore_n(0x51, 7, 7, 2 * TSUP_TPB + 3), 0);
	/* an unknown key misses */
	assert_int_equal(child_restore(0x99, 0, 7), 10 + ENOENT);
	kvt_engine_destroy(e);
}

/* Tenant in every key: another tenant's restore misses; the owner's works. */
static void
test_tenant(void **state)
{
	struct kvt_engine *e = remote_engine(srv.port, NULL);

	(void)state;
	assert_non_null(e);
	flushall();
	(void)publish(e, 0x61, 5, 3, 3 * TSUP_TPB + 1);
	assert_int_equal(child_restore(0x61, 6, 3), 10 + ENOENT);
	assert_int_equal(child_restore(0x61, 0, 3), 10 + ENOENT);
	assert_int_equal(child_restore(0x61, 5, 3), 0);
	kvt_engine_destroy(e);
}

/* Garbage, one flipped byte, a corrupted block value, a FLUSHALL: -ENOENT, never wrong bytes. */
static void
test_bad_values(void **state)
{
	struct kvt_engine *e = remote_engine(srv.port, NULL);
	char key[256], line[256];
	struct kvt_stats st;

	(void)state;
	assert_non_null(e);
	flushall();
	(void)publish(e, 0x71, 0, 4, 3 * TSUP_TPB + 2);
	first_key("kvt1:*:s:*", key, sizeof key);
	assert_int_equal(tsrv_cli(&srv, line, sizeof line, "SET %s garbage", key), 0);
	assert_int_equal(child_restore(0x71, 0, 4), 10 + ENOENT);

	(void)publish(e, 0x71, 0, 4, 3 * TSUP_TPB + 2);
	assert_int_equal(tsrv_cli(&srv, line, sizeof line, "SETRANGE %s 100 Z", key), 0);
	assert_int_equal(child_restore(0x71, 0, 4), 10 + ENOENT);

	/* a block value (keys without ":s:") overwritten with another block's bytes */
	flushall();
	(void)publish(e, 0x72, 0, 5, 3 * TSUP_TPB);
	assert_int_equal(child_restore(0x72, 0, 5), 0);
	assert_int_equal(tsrv_cli(&srv, key, sizeof key, "EVAL \"local k = redis.call('KEYS', "
				  "'kvt1:*') for _, x in ipairs(k) do if not string.find(x, ':s:') "
				  "then redis.call('SETRANGE', x, 200, 'garbage') return x end end "
				  "return ''\" 0"), 0);
	assert_true(strncmp(key, "kvt1:", 5) == 0);
	assert_int_equal(child_restore(0x72, 0, 5), 10 + ENOENT);

	(void)publish(e, 0x73, 0, 6, 2 * TSUP_TPB + 1);
	flushall();
	assert_int_equal(child_restore(0x73, 0, 6), 10 + ENOENT);
	st = tsup_stats(e);
	assert_int_equal(st.remote_publish_failed, 0);
	kvt_engine_destroy(e);
}

/* Another salt: the recomputed prefix keys differ from the published ones: -EINVAL. */
static void
test_salt(void **state)
{
	struct kvt_engine *e = remote_engine(srv.port, NULL);
	struct kvt_seq_opts so;
	kvt_seq_id s = 1;

	(void)state;
	assert_non_null(e);
	flushall();
	(void)publish(e, 0x81, 0, 2, 2 * TSUP_TPB);
	kvt_seq_opts_init(&so, sizeof so);
	so.salt = 12345;
	assert_int_equal(kvt_seq_restore_remote(e, 0x81, &so, &s), -EINVAL);
	assert_int_equal(s, 0);
	assert_non_null(strstr(kvt_last_error_message(), "prefix key differs"));
	kvt_seq_opts_init(&so, sizeof so);
	/* the worker's message comes back to the caller's thread */
	assert_int_equal(kvt_seq_restore_remote(e, 0x8888, &so, &s), -ENOENT);
	assert_non_null(strstr(kvt_last_error_message(), "is not in the REMOTE tier"));
	assert_int_equal(kvt_seq_restore_remote(e, 0x81, &so, &s), 0);
	assert_int_equal(tsup_verify(e, s, 2), 0);
	assert_int_equal(kvt_seq_close(e, s), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
}

/* Errors of the calls themselves; a publish needs a session key and the tokens. */
static void
test_errors(void **state)
{
	struct kvt_engine *e = remote_engine(srv.port, NULL), *plain;
	struct kvt_engine_opts o;
	kvt_seq_id s, t;

	(void)state;
	assert_non_null(e);
	s = tsup_seq_written(e, 1, 5);
	assert_int_equal(kvt_seq_publish_remote(e, s), -EINVAL); /* no session key */
	assert_int_equal(kvt_seq_close(e, s), 0);
	assert_int_equal(kvt_seq_publish_remote(e, s), KVT_ECLOSED);
	assert_int_equal(kvt_seq_restore_remote(e, 0, NULL, &t), -EINVAL);
	tsup_opts_init(&o);
	o.hbm_bytes = 4 * tsup_block_bytes();
	plain = tsup_create(&o, NULL);
	assert_int_equal(kvt_seq_restore_remote(plain, 1, NULL, &t), -ENODEV);
	kvt_engine_destroy(plain);
	/* remote_host without a model id */
	o.remote_host = "127.0.0.1";
	o.remote_port = srv.port;
	assert_int_equal(kvt_engine_create(&o, &plain), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "remote_model_id"));
	kvt_engine_destroy(e);
}

/* What an attacker found (2026-12-02): an empty session publishes (no NULL memcpy: UBSan); a
 * key of ours holding a list or a hash is a miss (-ENOENT, counted as a bad value), not -EPROTO;
 * kvt_seq_match_prefix checks opts_size as kvt_seq_open does; a put of a block already there
 * extends its TTL, so a session published later does not outlive its blocks. */
static void
test_attacker_findings(void **state)
{
	struct kvt_engine *e = remote_engine(srv.port, NULL);
	struct kvt_seq_opts so;
	char key[256], line[256];
	struct kvt_stats st0, st;
	uint64_t matched = 0;
	kvt_seq_id s;
	long ttl;

	(void)state;
	assert_non_null(e);
	flushall();
	s = tsup_open(e, 0, 0, 0x91);
	assert_int_equal(kvt_seq_publish_remote(e, s), 0);
	assert_int_equal(kvt_seq_close(e, s), 0);
	assert_int_equal(kvt_engine_drain(e), 0);

	assert_int_equal(tsup_stats(e).remote_publish_failed, 0);
	/* a list under the session key, then a hash under a block key */
	flushall();
	(void)publish(e, 0x92, 0, 3, 2 * TSUP_TPB);
	first_key("kvt1:*:s:*", key, sizeof key);
	assert_int_equal(tsrv_cli(&srv, line, sizeof line, "DEL %s", key), 0);
	assert_int_equal(tsrv_cli(&srv, line, sizeof line, "RPUSH %s a b", key), 0);
	st0 = tsup_stats(e);
	kvt_seq_opts_init(&so, sizeof so);
	assert_int_equal(kvt_seq_restore_remote(e, 0x92, &so, &s), -ENOENT);
	st = tsup_stats(e);
	assert_true(st.remote_bad_values > st0.remote_bad_values);
	flushall();
	(void)publish(e, 0x93, 0, 4, 2 * TSUP_TPB);
	assert_int_equal(tsrv_cli(&srv, key, sizeof key, "EVAL \"local k = redis.call('KEYS', "
				  "'kvt1:*') for _, x in ipairs(k) do if not string.find(x, ':s:') "
				  "then redis.call('DEL', x) redis.call('HSET', x, 'f', 'v') return x end "
				  "end return ''\" 0"), 0);
	assert_true(strncmp(key, "kvt1:", 5) == 0);
	assert_int_equal(kvt_seq_restore_remote(e, 0x93, &so, &s), -ENOENT);
	/* the engine is usable */
	s = tsup_seq_written(e, 1, 5);
	assert_int_equal(tsup_verify(e, s, 1), 0);
	assert_int_equal(kvt_seq_close(e, s), 0);

	so.opts_size = 3;
	assert_int_equal(kvt_seq_match_prefix(e, &so, NULL, 0, &matched, NULL), -EINVAL);
	so.opts_size = 100000;
	assert_int_equal(kvt_seq_match_prefix(e, &so, NULL, 0, &matched, NULL), -EINVAL);
	kvt_engine_destroy(e);

	/* TTL: blocks put again by a later publish get the later expiry */
	{
		struct kvt_engine_opts o;

		flushall();
		tsup_opts_init(&o);
		o.hbm_bytes = 16 * tsup_block_bytes();
		o.host_bytes = 8 * tsup_block_bytes();
		o.remote_host = "127.0.0.1";
		o.remote_port = srv.port;
		o.remote_model_id = "test-model@1";
		o.remote_ttl_ms = 1000000;
		e = tsup_create(&o, NULL);
		(void)publish(e, 0x94, 0, 5, 2 * TSUP_TPB);
		assert_int_equal(tsrv_cli(&srv, key, sizeof key, "EVAL \"local k = redis.call("
					  "'KEYS', 'kvt1:*') for _, x in ipairs(k) do if not "
					  "string.find(x, ':s:') then redis.call('PEXPIRE', x, 5000) "
					  "return x end end return ''\" 0"), 0);
		assert_true(strncmp(key, "kvt1:", 5) == 0);
		(void)publish(e, 0x95, 0, 5, 2 * TSUP_TPB); /* the same blocks */
		assert_int_equal(tsrv_cli(&srv, line, sizeof line, "PTTL %s", key), 0);
		ttl = strtol(line, NULL, 10);
		assert_true(ttl > 500000); /* extended to the TTL, not left at 5 s */
		kvt_engine_destroy(e);
	}
}

/* Nothing listening: create fails clearly (documented choice). */
static void
test_dead_server_at_create(void **state)
{
	struct tsrv dead = { 0 };
	int rc = 0;

	(void)state;
	assert_int_equal(tsrv_start(&dead, 0, ""), 0);
	tsrv_kill(&dead);
	assert_null(remote_engine(dead.port, &rc));
	assert_int_equal(rc, -ECONNREFUSED);
	assert_non_null(strstr(kvt_last_error_message(), "127.0.0.1"));
}

/* The server SIGSTOPped during the publish: the call returns at once (queued), the drain
 * within the client's timeouts, the job fails (not published), the local tiers keep working. */
static void
test_stopped_server(void **state)
{
	struct kvt_engine *e = remote_engine(srv.port, NULL);
	struct kvt_seq_opts so;
	struct kvt_stats st;
	kvt_seq_id s, t;

	(void)state;
	assert_non_null(e);
	flushall();
	kvt_seq_opts_init(&so, sizeof so);
	so.session_key = 0x91;
	assert_int_equal(kvt_seq_open(e, &so, &s), 0);
	assert_int_equal(tsup_append_write(e, s, 12, 0, 3 * TSUP_TPB + 1), 0);
	tsrv_signal(&srv, SIGSTOP);
	assert_int_equal(kvt_seq_publish_remote(e, s), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	st = tsup_stats(e);
	assert_int_equal(st.remote_publishes, 0);
	assert_int_equal(st.remote_publish_failed, 1);
	assert_true(st.remote_errors >= 1);
	{
		char buf[16384];
		size_t len;

		assert_int_equal(kvt_engine_metrics_text(e, buf, sizeof buf, &len), 0);
		assert_non_null(strstr(buf, "kvtier_remote_publish_failures_total 1\n"));
		assert_non_null(strstr(buf, "kvtier_remote_publishes_total 0\n"));
	}
	/* local tiers keep working while the server is stopped */
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_resume(e, s), 0);
	assert_int_equal(tsup_verify(e, s, 12), 0);
	t = tsup_seq_written(e, 13, 6);
	assert_int_equal(tsup_verify(e, t, 13), 0);
	/* a restore while stopped fails (timeout or breaker), leaving nothing open */
	kvt_seq_opts_init(&so, sizeof so);
	assert_true(kvt_seq_restore_remote(e, 0x91, &so, &t) < 0);
	assert_int_equal(t, 0);
	tsrv_signal(&srv, SIGCONT);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	/* it was simply not published */
	assert_int_equal(child_restore(0x91, 0, 12), 10 + ENOENT);
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
main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_two_processes),
		cmocka_unit_test(test_tenant),
		cmocka_unit_test(test_bad_values),
		cmocka_unit_test(test_salt),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_attacker_findings),
		cmocka_unit_test(test_dead_server_at_create),
		cmocka_unit_test(test_stopped_server),
	};

	signal(SIGPIPE, SIG_IGN);
	if (argc == 7 && strcmp(argv[1], "--restore-child") == 0)
		return restore_child_main((uint16_t)atoi(argv[2]), strtoull(argv[3], NULL, 10),
					  (uint32_t)atoi(argv[4]), (uint32_t)atoi(argv[5]),
					  strtoull(argv[6], NULL, 10));
	if (!tsrv_available()) {
		printf("test_remote_engine: redis-server or redis-cli not on PATH: skipped\n");
		return 77;
	}
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
