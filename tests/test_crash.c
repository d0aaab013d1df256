/* SPDX-License-Identifier: MIT */
/*
 * tests/test_crash.c - crash consistency of the persistent NVMe store. Each trial forks a child
 * that opens the store, restores every stored session, and loops: restore a stored session or
 * open a new one, append tokens (K/V pattern determined by the session key and the position),
 * park it to NVMe, sometimes drain or close one. Through a pipe the child tells the parent
 * each version it is about to park, each version that a drain + poll has published (durable),
 * and each close. The parent SIGKILLs it after a random delay, then opens the store itself and
 * checks every key against that log (kvtier.h "Persistent sessions": a session comes back as of
 * its last completed park): a session reported durable and not changed since must come back
 * whole and byte-exact at exactly that version (every block verified by checksum and compared
 * with the pattern); anything restored must be a version the child announced; a key may be
 * absent only if it was never published or was closed since. The same store and the model
 * carry over from trial to trial. Total runtime is a few seconds. A second run does the same
 * with the codec off and the HOST header room forced on (kvt_test_host_room_min_block): every
 * block then goes to disk as ONE zero-copy IO [header page | data] from its HOST slot. A third
 * (150 trials, hardening 1) has the sessions share system prompts (test_kill9_trials_shared).
 * KVT_CRASH_SEED=n fixes the seed (the kill moments still vary).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine_impl.h"
#include "kvtier.h"
#include "support/kvt_test.h"
#include "tiers/tier_nvme.h"

#define CRASH_TRIALS 100
#define CRASH_KEYS 6        /* session keys 1..CRASH_KEYS */
#define CRASH_MAX_TOKENS 60 /* a session grows up to this, then starts over */
#define CRASH_ROOM_TRIALS 60 /* trials of the one-IO (header room) run */

static int crash_codec = KVT_CODEC_SHUF_LZ4; /* the store's codec (children inherit it) */
static bool crash_shared;       /* shared-prompt run: sessions start with a system prompt that
                                   they attach from each other (kvt_seq_attach_prefix) */
static uint32_t crash_pcache;   /* opts.prefix_cache of the engines (children inherit it) */
static unsigned crash_max_ms = 42; /* a child is killed 2 .. crash_max_ms - 1 ms after its fork */

#define CRASH_SHARED_TRIALS 150
#define CRASH_PROMPT 8u   /* tokens of a system prompt: two full blocks */
#define CRASH_PROMPTS 2u  /* prompts; session key k starts with prompt k % CRASH_PROMPTS */

/* Shared-prompt run: the K/V tag of position @pos of session @key (the prompt's below
 * CRASH_PROMPT, the session's own after), and its token id (prompts differ, sessions too). */
static uint32_t
crash_tag(uint64_t key, uint64_t pos)
{
	return crash_shared && pos < CRASH_PROMPT ? 50 + (uint32_t)(key % CRASH_PROMPTS) :
						    (uint32_t)key;
}

static int32_t
crash_token(uint64_t key, uint64_t pos)
{
	return (int32_t)(crash_tag(key, pos) * 1000 + pos);
}

static int
crash_engine(const char *dir, struct kvt_engine **e)
{
	struct kvt_engine_opts o;
	uint64_t bb = tsup_block_bytes();

	tsup_opts_init(&o);
	o.hbm_bytes = 32 * bb;
	o.host_bytes = 16 * bb;
	o.nvme_dir = dir;
	o.nvme_bytes = (crash_shared ? 1024 : 160) * 4096ull; /* shared: never full (no session
								 given up for room) */
	o.nvme_persist = 1;
	o.nvme_codec = crash_codec;
	o.nvme_codec_min_saving = 0.05f;
	o.high_watermark = o.low_watermark = 1.0f;
	o.prefix_cache = crash_pcache;
	*e = NULL;
	return kvt_engine_create(&o, e);
}

/*
 * What the child tells the parent, through a pipe, in the order it happens. A report is written
 * BEFORE the call it announces (so a SIGKILL between the two only widens what is acceptable) or,
 * for CRASH_DURABLE, AFTER the engine has made the version durable (so it is always true).
 */
enum crash_op {
	CRASH_INTENT = 1, /* about to park @key at @n tokens: it may become durable from now on */
	CRASH_DURABLE,    /* the park of @key at @n tokens is published (drain + poll returned) */
	CRASH_CLOSE,      /* about to close @key: record dropped (the DEL may not be durable) */
	CRASH_RESTORED,   /* @key was restored at startup with @n tokens */
};

struct crash_rep {
	uint32_t op;  /* enum crash_op */
	uint32_t key; /* session key, 1..CRASH_KEYS */
	uint32_t n;   /* tokens (K/V at position p is tsup_val(key, p, ...): n fingerprints it) */
};

/* Per key, the set of states the store may hold: bit n = restored with n tokens, bit 0 = absent. */
typedef uint64_t crash_mask;

struct crash_child {
	kvt_seq_id open_ids[CRASH_KEYS + 1]; /* open sequence per key (0 = none) */
	uint32_t pend[CRASH_KEYS + 1];       /* tokens of a successful park not yet confirmed */
	int fd;                              /* write end of the report pipe */
	unsigned rnd;                        /* rand_r state */
};

static void
crash_report(struct crash_child *c, uint32_t op, uint64_t key, uint32_t n)
{
	struct crash_rep r = { op, (uint32_t)key, n };

	/* < PIPE_BUF: atomic; blocking on a full pipe only delays the call it announces */
	if (write(c->fd, &r, sizeof r) != (ssize_t)sizeof r)
		_exit(5);
}

/* After a successful drain + poll, every session parked since is published: say so. */
static void
crash_confirm(struct crash_child *c, struct kvt_engine *e)
{
	for (uint64_t k = 1; k <= CRASH_KEYS; k++) {
		/* drain + poll published it (the shared run's tier never fills, so the park's
		 * writes all found room): a report of a session not published would be false */
		if (c->pend[k] && c->open_ids[k] &&
		    e->seqs[(uint32_t)c->open_ids[k]].pub_pending) {
			fprintf(stderr, "child: session %llu parked at %u tokens is not published "
				"after drain + poll\n", (unsigned long long)k, c->pend[k]);
			_exit(6);
		}
		if (c->pend[k])
			crash_report(c, CRASH_DURABLE, k, c->pend[k]);
		c->pend[k] = 0;
	}
}

/* Append @n tokens of session @key from @pos (crash_token) and write their K/V (crash_tag), a
 * block at a time, each sealed by a batch as a model step would: full prompt blocks enter the
 * prefix index, where later sessions attach them. Returns 0 or an error code. */
static int
crash_write(struct kvt_engine *e, kvt_seq_id s, uint64_t key, uint64_t pos, uint32_t n)
{
	struct kvt_geometry g;
	int64_t map[TSUP_TPB];
	int32_t tok[TSUP_TPB];
	int rc = kvt_engine_geometry(e, &g);

	for (uint64_t end = pos + n; rc == 0 && pos < end;) {
		uint32_t k = TSUP_TPB - (uint32_t)(pos % TSUP_TPB);
		struct kvt_seq_range r = { .seq = s, .first_block = (uint32_t)(pos / TSUP_TPB),
					   .n_blocks = 1 };
		struct kvt_batch *b;

		k = k < end - pos ? k : (uint32_t)(end - pos);
		for (uint32_t t = 0; t < k; t++)
			tok[t] = crash_token(key, pos + t);
		if ((rc = kvt_seq_append(e, s, tok, k, map)) != 0)
			break;
		for (uint32_t t = 0; t < k; t++)
			for (uint32_t l = 0; l < TSUP_LAYERS; l++) {
				float *kk, *vv;

				kvt_kv_addr(&g, l, map[t], (void **)&kk, (void **)&vv);
				for (uint32_t i = 0; i < TSUP_HEADS * TSUP_DIM; i++) {
					kk[i] = tsup_val(crash_tag(key, pos + t), pos + t, l, 0, i);
					vv[i] = tsup_val(crash_tag(key, pos + t), pos + t, l, 1, i);
				}
			}
		if ((rc = kvt_batch_prepare_ranges(e, &r, 1, &b)) != 0)
			break;
		rc = kvt_batch_release(b, NULL);
		pos += k;
	}
	return rc;
}

/* Shared-prompt run: a new session of @key starts with its system prompt, attached from the
 * sessions (open, cached or stored) that have it, the rest of it written. */
static int
crash_start_shared(struct kvt_engine *e, kvt_seq_id s, uint64_t key)
{
	int32_t tok[CRASH_PROMPT];
	uint64_t got = 0;
	int rc;

	for (uint32_t t = 0; t < CRASH_PROMPT; t++)
		tok[t] = crash_token(key, t);
	rc = kvt_seq_attach_prefix(e, s, tok, CRASH_PROMPT, &got);
	if (rc == 0 && got < CRASH_PROMPT)
		rc = crash_write(e, s, key, got, CRASH_PROMPT - (uint32_t)got);
	return rc;
}

/* One step of the child's workload on session @key. Returns 0 or an error code. */
static int
child_step(struct kvt_engine *e, uint64_t key, struct crash_child *c)
{
	struct kvt_seq_opts so;
	struct kvt_seq_info info;
	kvt_seq_id s = c->open_ids[key];
	uint32_t add = 1 + rand_r(&c->rnd) % 9, last = c->pend[key];
	int rc = 0;

	c->pend[key] = 0; /* changed from here on: its last park is no longer confirmable */
	if (!s) {
		rc = kvt_seq_restore(e, key, NULL, &s);
		if (rc == -ENOENT) {
			kvt_seq_opts_init(&so, sizeof so);
			so.session_key = key;
			rc = kvt_seq_open(e, &so, &s);
			if (rc == 0 && crash_shared && (rc = crash_start_shared(e, s, key)) != 0)
				(void)kvt_seq_close(e, s);
		}
		if (rc)
			return rc;
		c->open_ids[key] = s;
	}
	if ((rc = kvt_seq_info(e, s, &info)))
		return rc;
	if (info.n_tokens + add > CRASH_MAX_TOKENS || rand_r(&c->rnd) % 16 == 0) {
		c->open_ids[key] = 0; /* start this conversation over */
		crash_report(c, CRASH_CLOSE, key, 0);
		return kvt_seq_close(e, s);
	}
	if (crash_shared && rand_r(&c->rnd) % 8 == 0) {
		/* detach: the sequence goes, its stored session stays; a park in flight is
		 * published first, so the last park is durable once this returns 0 */
		if (kvt_seq_detach(e, s) != 0) {
			c->pend[key] = last; /* not published (no room): stays open, unchanged */
			return 0;
		}
		c->open_ids[key] = 0;
		if (last)
			crash_report(c, CRASH_DURABLE, key, last);
		return 0;
	}
	rc = crash_shared ? crash_write(e, s, key, info.n_tokens, add) :
			    tsup_append_write(e, s, (uint32_t)key, info.n_tokens, add);
	if (rc)
		return rc;
	crash_report(c, CRASH_INTENT, key, info.n_tokens + add);
	rc = kvt_seq_park(e, s, KVT_TIER_NVME);
	if (rc == 0)
		c->pend[key] = info.n_tokens + add;
	if (rc == 0 && rand_r(&c->rnd) % 2)
		rc = kvt_engine_poll(e, 0) < 0 ? -EIO : 0;
	return rc;
}

/*
 * Restore every stored session first: an open session's record is never given up to make room
 * (kvt_persist_reclaim drops only records not open), so from then on the only ways a record
 * changes are the parks and closes the child reports.
 */
static int
child_restore_all(struct kvt_engine *e, struct crash_child *c)
{
	uint64_t keys[CRASH_KEYS + 8];
	int n = kvt_session_list(e, keys, CRASH_KEYS + 8);

	if (n < 0 || n > CRASH_KEYS)
		return n < 0 ? n : -E2BIG;
	for (int i = 0; i < n; i++) {
		struct kvt_seq_info info;
		kvt_seq_id s;
		int rc = kvt_seq_restore(e, keys[i], NULL, &s);

		if (rc == -ENOENT)
			continue; /* the parent's model says whether that was allowed */
		if (rc || (rc = kvt_seq_info(e, s, &info)))
			return rc;
		c->open_ids[keys[i]] = s;
		crash_report(c, CRASH_RESTORED, keys[i], (uint32_t)info.n_tokens);
	}
	return 0;
}

static void __attribute__((noreturn))
child_main(const char *dir, unsigned seed, int fd)
{
	struct crash_child c = { .fd = fd, .rnd = seed };
	struct kvt_engine *e;
	int rc = crash_engine(dir, &e);

	if (rc == 0)
		rc = child_restore_all(e, &c);
	if (rc) {
		fprintf(stderr, "child: start: %s\n", kvt_last_error_message());
		_exit(3);
	}
	for (;;) {
		uint64_t key = 1 + rand_r(&c.rnd) % CRASH_KEYS;

		rc = child_step(e, key, &c);
		if (rc && rc != -ENOSPC) {
			fprintf(stderr, "child: step: %s (%s)\n", kvt_strerror(rc),
				kvt_last_error_message());
			_exit(4);
		}
		if (rand_r(&c.rnd) % 4 == 0 && kvt_engine_drain(e) == 0 &&
		    kvt_engine_poll(e, 0) >= 0)
			crash_confirm(&c, e);
	}
}

/* Apply the child's reports to the model of acceptable states @ok. */
static void
crash_apply(int fd, crash_mask *ok, unsigned *confirmed)
{
	struct crash_rep r;
	ssize_t got;

	while ((got = read(fd, &r, sizeof r)) == (ssize_t)sizeof r) {
		assert_true(r.key >= 1 && r.key <= CRASH_KEYS && r.n <= CRASH_MAX_TOKENS);
		switch (r.op) {
		case CRASH_INTENT:
			ok[r.key] |= 1ull << r.n;
			break;
		case CRASH_DURABLE:
			assert_true(r.n > 0);
			ok[r.key] = 1ull << r.n; /* published: nothing older, not absent */
			(*confirmed)++;
			break;
		case CRASH_CLOSE:
			ok[r.key] |= 1; /* absent once the DEL is durable, the last version until */
			break;
		case CRASH_RESTORED:
			if (!(ok[r.key] & (1ull << r.n)))
				print_error("child restored session %u with %u tokens: not a "
					    "version it published\n", r.key, r.n);
			assert_true(ok[r.key] & (1ull << r.n));
			ok[r.key] = 1ull << r.n;
			break;
		default:
			fail_msg("bad report op %u", r.op);
		}
	}
	assert_int_equal(got, 0);
}

struct crash_count {
	unsigned recovered;  /* sessions restored byte-exact */
	unsigned required;   /* of those, ones absence would have failed (confirmed durable) */
	unsigned absent;     /* keys absent, absence allowed (never durable, or closed) */
	unsigned confirmed;  /* CRASH_DURABLE reports received */
};

/* Whether @key is in @keys[0..n). */
static bool
crash_listed(const uint64_t *keys, int n, uint64_t key)
{
	for (int i = 0; i < n; i++)
		if (keys[i] == key)
			return true;
	return false;
}

/* Shared-prompt run: read every token of the sequence @s of session @key (checksums verified)
 * and compare it with the pattern (crash_tag). 0, a read error, or -EBADMSG (wrong bytes). */
static int
crash_verify(struct kvt_engine *e, kvt_seq_id s, uint64_t key)
{
	struct kvt_block_table bt;
	struct kvt_batch *b = NULL;
	int rc = kvt_batch_prepare(e, &s, 1, &b);

	for (uint32_t l = 0; rc == 0 && l < TSUP_LAYERS; l++)
		rc = kvt_batch_wait_layer(b, l, NULL);
	if (rc == 0)
		rc = kvt_batch_block_table(b, &bt);
	for (uint64_t t = 0; rc == 0 && t < bt.seq_len[0]; t++) {
		uint32_t slot = bt.indices[bt.indptr[0] + t / TSUP_TPB];
		int64_t m = (int64_t)slot * TSUP_TPB + (int64_t)(t % TSUP_TPB);

		for (uint32_t l = 0; rc == 0 && l < TSUP_LAYERS; l++) {
			float *k, *v;

			kvt_kv_addr(&bt.geo, l, m, (void **)&k, (void **)&v);
			for (uint32_t j = 0; j < TSUP_HEADS * TSUP_DIM; j++)
				if (k[j] != tsup_val(crash_tag(key, t), t, l, 0, j) ||
				    v[j] != tsup_val(crash_tag(key, t), t, l, 1, j)) {
					print_error("session %llu pos %llu layer %u: K %g V %g\n",
						    (unsigned long long)key, (unsigned long long)t, l,
						    k[j], v[j]);
					rc = -EBADMSG;
					break;
				}
		}
	}
	if (b)
		assert_int_equal(kvt_batch_release(b, NULL), 0);
	return rc;
}

/*
 * After a crash: each key's state must be one @ok allows. A session reported durable (and not
 * changed since) must come back whole and byte-exact at exactly that version; any restored
 * session must be a version the child announced; absent only where that is allowed. @ok then
 * holds exactly the state found, for the next trial.
 */
static void
check_store(const char *dir, crash_mask *ok, struct crash_count *cnt)
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
	for (int i = 0; i < n; i++)
		assert_true(keys[i] >= 1 && keys[i] <= CRASH_KEYS);
	for (uint64_t k = 1; k <= CRASH_KEYS; k++) {
		struct kvt_seq_info info;
		kvt_seq_id s;

		rc = crash_listed(keys, n, k) ? kvt_seq_restore(e, k, NULL, &s) : -ENOENT;
		if (rc == -ENOENT) {
			if (!(ok[k] & 1))
				print_error("session %llu lost: it was published with %d tokens (%s)\n",
					    (unsigned long long)k, __builtin_ctzll(ok[k]),
					    kvt_last_error_message());
			assert_true(ok[k] & 1);
			ok[k] = 1;
			cnt->absent++;
			continue;
		}
		if (rc)
			print_error("restore: %s\n", kvt_last_error_message());
		assert_int_equal(rc, 0);
		assert_int_equal(kvt_seq_info(e, s, &info), 0);
		assert_true(info.n_tokens > 0 && info.n_tokens <= CRASH_MAX_TOKENS);
		if (!(ok[k] & (1ull << info.n_tokens)))
			print_error("session %llu restored with %u tokens: allowed mask %#llx\n",
				    (unsigned long long)k, (unsigned)info.n_tokens,
				    (unsigned long long)ok[k]);
		assert_true(ok[k] & (1ull << info.n_tokens));
		/* every block is read, verified by checksum and compared with the pattern */
		rc = crash_shared ? crash_verify(e, s, k) : tsup_verify(e, s, (uint32_t)k);
		if (rc)
			print_error("session %llu: %s\n", (unsigned long long)k, kvt_strerror(rc));
		assert_int_equal(rc, 0);
		cnt->required += !(ok[k] & 1);
		ok[k] = 1ull << info.n_tokens;
		cnt->recovered++;
	}
	tsup_check_engine(e);
	kvt_engine_destroy(e);
}

/* @trials kill -9 trials on a fresh store in @dir (removed after). */
static void
crash_trials(char *dir, int trials)
{
	crash_mask ok[CRASH_KEYS + 1];
	struct crash_count cnt = { 0 };
	unsigned seed = getenv("KVT_CRASH_SEED") ? (unsigned)atoi(getenv("KVT_CRASH_SEED")) :
							(unsigned)time(NULL);
	struct timespec ts;

	for (int k = 0; k <= CRASH_KEYS; k++)
		ok[k] = 1; /* empty store: every key absent */
	print_message("crash test seed %u\n", seed);
	for (int t = 0; t < trials; t++) {
		int status, p[2];
		pid_t pid;

		assert_int_equal(pipe(p), 0);
		(void)fcntl(p[1], F_SETPIPE_SZ, 1 << 20); /* best effort: fewer blocked writes */
		if (crash_shared)
			crash_pcache = (unsigned)t & 1; /* odd trials: with the prefix cache */
		pid = fork();
		assert_true(pid >= 0);
		if (pid == 0) {
			close(p[0]);
			child_main(dir, seed + (unsigned)t, p[1]);
		}
		close(p[1]);
		ts.tv_sec = 0;
		/* until a session came back once, let the child run longer (a loaded machine
		 * starts it slowly): the trials must reach the parks */
		ts.tv_nsec = (long)(2 + rand_r(&seed) % ((cnt.recovered ? 1 : 4) * crash_max_ms -
							 2)) * 1000000L;
		nanosleep(&ts, NULL);
		kill(pid, SIGKILL);
		assert_int_equal(waitpid(pid, &status, 0), pid);
		/* the child must have been killed, not have failed on its own */
		if (!WIFSIGNALED(status))
			print_error("child exited with %d\n", WEXITSTATUS(status));
		assert_true(WIFSIGNALED(status));
		crash_apply(p[0], ok, &cnt.confirmed);
		close(p[0]);
		check_store(dir, ok, &cnt);
	}
	print_message("crash test: %d trials, %u durable reports, %u sessions recovered exactly "
		      "(%u of them required), %u cleanly absent, 0 lost, 0 corrupt\n", trials,
		      cnt.confirmed, cnt.recovered, cnt.required, cnt.absent);
	assert_true(cnt.required > 0);
	tsup_rmdir(dir);
}

static void
test_kill9_trials(void **state)
{
	(void)state;
	crash_trials(tsup_mkdtemp(), CRASH_TRIALS);
}

/* The same with raw blocks written as one IO from the HOST slot's header room; first checks
 * that this store's engine takes that path. */
static void
test_kill9_trials_one_io(void **state)
{
	char *dir = tsup_mkdtemp();
	struct kvt_nvme_stats st;
	struct kvt_engine *e;
	kvt_seq_id s;

	(void)state;
	crash_codec = KVT_CODEC_NONE;
	kvt_test_host_room_min_block = 1;
	assert_int_equal(crash_engine(dir, &e), 0);
	assert_int_equal(e->host_data_off, 4096);
	s = tsup_session_written(e, 0, 1, 3 * TSUP_TPB);
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	kvt_nvme_get_stats(e->nvme, &st);
	assert_int_equal(st.zc_one_io, 3);
	assert_int_equal(st.sqes, 3);
	assert_int_equal(kvt_seq_close(e, s), 0);
	kvt_engine_destroy(e);
	crash_trials(dir, CRASH_ROOM_TRIALS);
	kvt_test_host_room_min_block = KVT_HOST_ROOM_MIN_BLOCK;
	crash_codec = KVT_CODEC_SHUF_LZ4;
}

/*
 * Hardening 1: the sessions share system prompts. A new session of key k attaches prompt
 * k % CRASH_PROMPTS (8 tokens, two blocks) from whoever has it (an open sequence, the prefix
 * cache in odd trials, or a stored session after a restart) and writes the rest; sessions are
 * also detached (kvt_seq_detach: stored session kept, the last park published first) and
 * restored later. 150 SIGKILLs at random moments: every session reported durable comes back
 * byte-exact (shared prompt blocks included), none serves wrong bytes.
 */
static void
test_kill9_trials_shared(void **state)
{
	(void)state;
	crash_shared = true;
	crash_max_ms = 80; /* the workload's first parks come after engine create and restores */
	crash_trials(tsup_mkdtemp(), CRASH_SHARED_TRIALS);
	crash_max_ms = 42;
	crash_pcache = 0;
	crash_shared = false;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kill9_trials),
		cmocka_unit_test(test_kill9_trials_one_io),
		cmocka_unit_test(test_kill9_trials_shared),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
