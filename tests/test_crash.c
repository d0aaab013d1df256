/* SPDX-License-Identifier: MIT */
/*
 * tests/test_crash.c - crash consistency of the persistent NVMe store. Each trial forks a child
 * that opens the store and loops: restore a stored session or open a new one, append tokens
 * (K/V pattern determined by the session key and the position), park it to NVMe, sometimes close
 * or drop one. The parent SIGKILLs it after a random delay, then opens the store itself and
 * restores every listed session: each must come back whole and byte-exact (every block verified
 * by checksum and compared with the pattern) or be cleanly absent (-ENOENT); nothing else. The
 * same store carries over from trial to trial. Total runtime is a few seconds.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvtier.h"
#include "support/kvt_test.h"

#define CRASH_TRIALS 100
#define CRASH_KEYS 6        /* session keys 1..CRASH_KEYS */
#define CRASH_MAX_TOKENS 60 /* a session grows up to this, then starts over */

static int
crash_engine(const char *dir, struct kvt_engine **e)
{
	struct kvt_engine_opts o;
	uint64_t bb = tsup_block_bytes();

	kvt_engine_opts_init(&o, sizeof o);
	o.layout.n_layers = TSUP_LAYERS;
	o.layout.n_kv_heads = TSUP_HEADS;
	o.layout.head_dim = TSUP_DIM;
	o.layout.dtype = KVT_DTYPE_F32;
	o.layout.tokens_per_block = TSUP_TPB;
	o.hbm_bytes = 32 * bb;
	o.host_bytes = 16 * bb;
	o.nvme_dir = dir;
	o.nvme_bytes = 160 * 4096ull;
	o.nvme_persist = 1;
	o.nvme_codec = KVT_CODEC_SHUF_LZ4;
	o.nvme_codec_min_saving = 0.05f;
	o.high_watermark = o.low_watermark = 1.0f;
	*e = NULL;
	return kvt_engine_create(&o, e);
}

/* One step of the child's workload on session @key. Returns 0 or an error code. */
static int
child_step(struct kvt_engine *e, uint64_t key, kvt_seq_id *open_ids, unsigned *rnd)
{
	struct kvt_seq_opts so;
	struct kvt_seq_info info;
	kvt_seq_id s = open_ids[key];
	uint32_t add = 1 + rand_r(rnd) % 9;
	int rc = 0;

	if (!s) {
		rc = kvt_seq_restore(e, key, NULL, &s);
		if (rc == -ENOENT) {
			kvt_seq_opts_init(&so, sizeof so);
			so.session_key = key;
			rc = kvt_seq_open(e, &so, &s);
		}
		if (rc)
			return rc;
		open_ids[key] = s;
	}
	if ((rc = kvt_seq_info(e, s, &info)))
		return rc;
	if (info.n_tokens + add > CRASH_MAX_TOKENS || rand_r(rnd) % 16 == 0) {
		open_ids[key] = 0; /* start this conversation over */
		return kvt_seq_close(e, s);
	}
	rc = tsup_append_write(e, s, (uint32_t)key, info.n_tokens, add);
	if (rc == 0)
		rc = kvt_seq_park(e, s, KVT_TIER_NVME);
	if (rc == 0 && rand_r(rnd) % 2)
		rc = kvt_engine_poll(e, 0) < 0 ? -EIO : 0;
	return rc;
}

static void __attribute__((noreturn))
child_main(const char *dir, unsigned seed)
{
	kvt_seq_id open_ids[CRASH_KEYS + 1] = { 0 };
	struct kvt_engine *e;
	unsigned rnd = seed;
	int rc = crash_engine(dir, &e);

	if (rc) {
		fprintf(stderr, "child: create: %s\n", kvt_last_error_message());
		_exit(3);
	}
	for (;;) {
		uint64_t key = 1 + rand_r(&rnd) % CRASH_KEYS;

		rc = child_step(e, key, open_ids, &rnd);
		if (rc && rc != -ENOSPC) {
			fprintf(stderr, "child: step: %s (%s)\n", kvt_strerror(rc),
				kvt_last_error_message());
			_exit(4);
		}
		if (rand_r(&rnd) % 8 == 0)
			(void)kvt_engine_drain(e);
	}
}

/* After a crash: every listed session is restored whole and exact, or absent. */
static void
check_store(const char *dir, unsigned *recovered, unsigned *absent)
{
	struct kvt_engine *e;
	uint64_t keys[CRASH_KEYS + 8];
	int n, rc;

	rc = crash_engine(dir, &e);
	if (rc)
		print_error("create after crash: %s\n", kvt_last_error_message());
	assert_int_equal(rc, 0);
	n = kvt_session_list(e, keys, CRASH_KEYS + 8);
	assert_true(n >= 0 && n <= CRASH_KEYS);
	for (int i = 0; i < n; i++) {
		struct kvt_seq_info info;
		kvt_seq_id s;

		assert_true(keys[i] >= 1 && keys[i] <= CRASH_KEYS);
		rc = kvt_seq_restore(e, keys[i], NULL, &s);
		if (rc == -ENOENT) {
			(*absent)++;
			continue;
		}
		if (rc)
			print_error("restore: %s\n", kvt_last_error_message());
		assert_int_equal(rc, 0);
		assert_int_equal(kvt_seq_info(e, s, &info), 0);
		assert_true(info.n_tokens > 0 && info.n_tokens <= CRASH_MAX_TOKENS);
		/* every block is read, verified by checksum and compared with the pattern */
		rc = tsup_verify(e, s, (uint32_t)keys[i]);
		if (rc)
			print_error("session %llu: %s\n", (unsigned long long)keys[i],
				    kvt_strerror(rc));
		assert_int_equal(rc, 0);
		(*recovered)++;
	}
	tsup_check_engine(e);
	kvt_engine_destroy(e);
}

static void
test_kill9_trials(void **state)
{
	char *dir = tsup_mkdtemp();
	unsigned recovered = 0, absent = 0, seed = (unsigned)time(NULL);
	struct timespec ts;

	(void)state;
	print_message("crash test seed %u\n", seed);
	for (int t = 0; t < CRASH_TRIALS; t++) {
		int status;
		pid_t pid = fork();

		assert_true(pid >= 0);
		if (pid == 0)
			child_main(dir, seed + (unsigned)t);
		ts.tv_sec = 0;
		ts.tv_nsec = (long)(2 + rand_r(&seed) % 40) * 1000000L;
		nanosleep(&ts, NULL);
		kill(pid, SIGKILL);
		assert_int_equal(waitpid(pid, &status, 0), pid);
		/* the child must have been killed, not have failed on its own */
		if (!WIFSIGNALED(status))
			print_error("child exited with %d\n", WEXITSTATUS(status));
		assert_true(WIFSIGNALED(status));
		check_store(dir, &recovered, &absent);
	}
	print_message("crash test: %d trials, %u sessions recovered exactly, %u cleanly absent, "
		      "0 corrupt\n", CRASH_TRIALS, recovered, absent);
	assert_true(recovered > 0);
	tsup_rmdir(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kill9_trials),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
