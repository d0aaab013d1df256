/* SPDX-License-Identifier: MIT */
/*
 * tests/test_store_shared.c - durable sessions that share prefix blocks (hardening 1), through
 * the public API. Session A (key 1) holds a prompt of 10 tokens (K/V tag 1); session B (key 2)
 * attaches A's two full blocks (8 tokens) and adds 6 tokens of its own (tag 2), by
 * kvt_seq_attach_prefix in the same run (from HBM/HOST or from the prefix cache after A closed),
 * or from A's stored record after a restart. Both are parked to NVMe in every order of
 * close/park/attach/drop, the engine is restarted (destroyed cleanly, or the process dies
 * without destroying it: a simulated kill -9), and every session whose park + drain returned 0
 * and that was not closed or dropped since must restore byte-exact, the others must be gone.
 *
 * Each run of an engine is a forked child (the store is flock'ed per process); the child checks
 * with CK (no cmocka in the child) and exits 0 when all held.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/engine_impl.h" /* kvt_engine_check: the invariants, between steps */
#include "kvtier.h"
#include "support/kvt_test.h"

#define SH_PROMPT 8u  /* tokens B shares with A: two full blocks */
#define SH_A_LEN 10u  /* A's tokens (tag 1) */
#define SH_B_OWN 6u   /* B's own tokens after the prompt (tag 2) */

#define CK(x)                                                                                  \
	do {                                                                                   \
		if (!(x)) {                                                                    \
			fprintf(stderr, "child: %s:%d: %s (%s)\n", __FILE__, __LINE__, #x,     \
				kvt_last_error_message());                                     \
			_exit(2);                                                              \
		}                                                                              \
	} while (0)

enum sh_op {
	SH_END = 0,
	SH_OPEN_A,    /* open A (key 1) and write its 10 tokens */
	SH_PARK_A,    /* park A to NVMe, drain */
	SH_CLOSE_A,   /* kvt_seq_close(A) */
	SH_DETACH_A,  /* kvt_seq_detach(A): the sequence goes, the stored session stays */
	SH_DROP_A,    /* kvt_session_drop(1) (A stored, not open) */
	SH_RESTORE_A, /* kvt_seq_restore(1), resume, verify byte-exact */
	SH_GONE_A,    /* kvt_seq_restore(1) returns -ENOENT */
	SH_ATTACH_B,  /* open B (key 2), attach A's prompt (8 tokens found), write 6 more */
	SH_PARK_B,
	SH_CLOSE_B,
	SH_DROP_B,
	SH_RESTORE_B,
	SH_GONE_B,
	SH_VERIFY,    /* verify every open sequence (resumes it) */
	SH_RESTART,   /* end of this run: clean destroy, or die (crash mode) */
};

struct sh_run {
	struct kvt_engine *e;
	kvt_seq_id a, b; /* open sequences (0 = none) */
};

static int sh_prefix_cache; /* opts.prefix_cache of the engines */

static struct kvt_engine *
sh_engine(const char *dir)
{
	struct kvt_engine_opts o;
	struct kvt_engine *e = NULL;

	tsup_store_opts(&o, dir, 64ull * 8192);
	o.prefix_cache = (uint32_t)sh_prefix_cache;
	CK(kvt_engine_create(&o, &e) == 0);
	return e;
}

/* Compare every token of @s with the pattern: tag @t0 below @split, @t1 from there on. */
static int
sh_verify(struct kvt_engine *e, kvt_seq_id s, uint64_t n, uint64_t split, uint32_t t0,
	  uint32_t t1)
{
	struct kvt_block_table bt;
	struct kvt_batch *b = NULL;
	int rc;

	if ((rc = kvt_seq_resume(e, s)) != 0 || (rc = kvt_batch_prepare(e, &s, 1, &b)) != 0)
		return rc;
	for (uint32_t l = 0; l < TSUP_LAYERS && rc == 0; l++)
		rc = kvt_batch_wait_layer(b, l, NULL);
	if (rc == 0 && (rc = kvt_batch_block_table(b, &bt)) == 0 && bt.seq_len[0] != n)
		rc = -EINVAL;
	for (uint64_t t = 0; rc == 0 && t < bt.seq_len[0]; t++) {
		uint32_t slot = bt.indices[bt.indptr[0] + t / TSUP_TPB], tag = t < split ? t0 : t1;
		int64_t m = (int64_t)slot * TSUP_TPB + (int64_t)(t % TSUP_TPB);

		for (uint32_t l = 0; l < TSUP_LAYERS && rc == 0; l++) {
			float *k, *v;

			kvt_kv_addr(&bt.geo, l, m, (void **)&k, (void **)&v);
			for (uint32_t j = 0; j < TSUP_HEADS * TSUP_DIM; j++)
				if (k[j] != tsup_val(tag, t, l, 0, j) ||
				    v[j] != tsup_val(tag, t, l, 1, j)) {
					fprintf(stderr, "child: pos %llu layer %u: wrong K/V\n",
						(unsigned long long)t, l);
					rc = -EBADMSG;
					break;
				}
		}
	}
	if (b)
		(void)kvt_batch_release(b, NULL);
	return rc;
}

/* Append and write @n tokens of tag @tag from @pos, a block at a time, each sealed by a batch
 * (as a model step would): full blocks enter the prefix index. */
static void
sh_write(struct kvt_engine *e, kvt_seq_id s, uint32_t tag, uint32_t pos, uint32_t n)
{
	for (uint32_t end = pos + n; pos < end;) {
		uint32_t k = TSUP_TPB - pos % TSUP_TPB;
		struct kvt_seq_range r = { .seq = s, .first_block = pos / TSUP_TPB, .n_blocks = 1 };
		struct kvt_batch *b;

		k = k < end - pos ? k : end - pos;
		CK(tsup_append_write(e, s, tag, pos, k) == 0);
		CK(kvt_batch_prepare_ranges(e, &r, 1, &b) == 0);
		CK(kvt_batch_release(b, NULL) == 0);
		pos += k;
	}
}

static void
sh_park(struct kvt_engine *e, kvt_seq_id s)
{
	CK(kvt_seq_park(e, s, KVT_TIER_NVME) == 0);
	CK(kvt_engine_drain(e) == 0); /* park + drain returned 0: durable from here on */
	CK(kvt_engine_check(e) == 0);
}

static void
sh_restore(struct sh_run *r, uint64_t key, kvt_seq_id *s)
{
	int rc = kvt_seq_restore(r->e, key, NULL, s);

	if (rc)
		fprintf(stderr, "child: restore %llu: %s\n", (unsigned long long)key,
			kvt_last_error_message());
	CK(rc == 0);
	if (key == 1)
		CK(sh_verify(r->e, *s, SH_A_LEN, SH_A_LEN, 1, 1) == 0);
	else
		CK(sh_verify(r->e, *s, SH_PROMPT + SH_B_OWN, SH_PROMPT, 1, 2) == 0);
}

static void
sh_step(struct sh_run *r, int op)
{
	struct kvt_seq_opts so;
	int32_t tok[SH_A_LEN];
	uint64_t got = 0;
	kvt_seq_id s;

	switch (op) {
	case SH_OPEN_A:
		kvt_seq_opts_init(&so, sizeof so);
		so.session_key = 1;
		CK(kvt_seq_open(r->e, &so, &r->a) == 0);
		sh_write(r->e, r->a, 1, 0, SH_A_LEN);
		break;
	case SH_PARK_A:
		sh_park(r->e, r->a);
		break;
	case SH_PARK_B:
		sh_park(r->e, r->b);
		break;
	case SH_CLOSE_A:
		CK(kvt_seq_close(r->e, r->a) == 0);
		r->a = 0;
		break;
	case SH_CLOSE_B:
		CK(kvt_seq_close(r->e, r->b) == 0);
		r->b = 0;
		break;
	case SH_DETACH_A:
		CK(kvt_seq_detach(r->e, r->a) == 0);
		r->a = 0;
		break;
	case SH_DROP_A:
	case SH_DROP_B:
		CK(kvt_session_drop(r->e, op == SH_DROP_A ? 1 : 2) == 0);
		break;
	case SH_RESTORE_A:
		sh_restore(r, 1, &r->a);
		break;
	case SH_RESTORE_B:
		sh_restore(r, 2, &r->b);
		break;
	case SH_GONE_A:
	case SH_GONE_B:
		CK(kvt_seq_restore(r->e, op == SH_GONE_A ? 1 : 2, NULL, &s) == -ENOENT);
		break;
	case SH_ATTACH_B:
		for (uint32_t i = 0; i < SH_A_LEN; i++)
			tok[i] = (int32_t)i; /* tsup_append_write's tokens are the positions */
		kvt_seq_opts_init(&so, sizeof so);
		so.session_key = 2;
		CK(kvt_seq_open(r->e, &so, &r->b) == 0);
		CK(kvt_seq_attach_prefix(r->e, r->b, tok, SH_A_LEN, &got) == 0);
		CK(got == SH_PROMPT);
		sh_write(r->e, r->b, 2, SH_PROMPT, SH_B_OWN);
		break;
	case SH_VERIFY:
		if (r->a)
			CK(sh_verify(r->e, r->a, SH_A_LEN, SH_A_LEN, 1, 1) == 0);
		if (r->b)
			CK(sh_verify(r->e, r->b, SH_PROMPT + SH_B_OWN, SH_PROMPT, 1, 2) == 0);
		break;
	default:
		CK(!"bad op");
	}
	CK(kvt_engine_check(r->e) == 0);
}

/* Run @ops from @*pc up to the next SH_RESTART or SH_END in one child process; @crash: the
 * child ends without kvt_engine_destroy. */
static void
sh_run_child(const char *dir, const int *ops, int *pc, bool crash)
{
	int status, end;
	pid_t pid;

	for (end = *pc; ops[end] != SH_END && ops[end] != SH_RESTART; end++)
		;
	fflush(NULL);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct sh_run r = { .e = sh_engine(dir) };

		for (int i = *pc; i < end; i++)
			sh_step(&r, ops[i]);
		if (!crash)
			kvt_engine_destroy(r.e);
		_exit(0); /* crash: the engine is never destroyed, as after kill -9 */
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		fail_msg("run starting at step %d failed (status %#x)", *pc, status);
	*pc = ops[end] == SH_RESTART ? end + 1 : end;
}

static void
sh_scenario(const int *ops, int prefix_cache)
{
	for (int crash = 0; crash < 2; crash++) {
		char *dir = tsup_mkdtemp();
		int pc = 0;

		sh_prefix_cache = prefix_cache;
		while (ops[pc] != SH_END)
			sh_run_child(dir, ops, &pc, crash != 0);
		tsup_rmdir(dir);
	}
	sh_prefix_cache = 0;
}

#define R SH_RESTART

/* B attaches in the same run; both parked; after a restart both restore, in either order. */
static void
test_same_run_both_parked(void **state)
{
	static const int a_first[] = { SH_OPEN_A, SH_ATTACH_B, SH_PARK_A, SH_PARK_B, R,
				       SH_RESTORE_A, SH_RESTORE_B, R, SH_RESTORE_B, SH_RESTORE_A,
				       SH_END };
	static const int b_first[] = { SH_OPEN_A, SH_PARK_A, SH_ATTACH_B, SH_PARK_B, R,
				       SH_RESTORE_B, SH_RESTORE_A, SH_VERIFY, SH_END };

	(void)state;
	sh_scenario(a_first, 0);
	sh_scenario(b_first, 0);
}

/* The creator is closed (record deleted) before or after the sharer is parked: the sharer
 * still restores, the creator is gone. */
static void
test_same_run_creator_closed(void **state)
{
	static const int before[] = { SH_OPEN_A, SH_PARK_A, SH_ATTACH_B, SH_CLOSE_A, SH_PARK_B, R,
				      SH_GONE_A, SH_RESTORE_B, SH_END };
	static const int after[] = { SH_OPEN_A, SH_PARK_A, SH_ATTACH_B, SH_PARK_B, SH_CLOSE_A, R,
				     SH_GONE_A, SH_RESTORE_B, SH_CLOSE_B, R, SH_GONE_A, SH_GONE_B,
				     SH_END };
	static const int sharer_closed[] = { SH_OPEN_A, SH_ATTACH_B, SH_PARK_B, SH_PARK_A,
					     SH_CLOSE_B, R, SH_GONE_B, SH_RESTORE_A, SH_END };

	(void)state;
	sh_scenario(before, 0);
	sh_scenario(after, 0);
	sh_scenario(sharer_closed, 0);
}

/* With the prefix cache, A's blocks outlive A's close; B attaches them from the cache. */
static void
test_prefix_cache_after_close(void **state)
{
	static const int ops[] = { SH_OPEN_A, SH_PARK_A, SH_CLOSE_A, SH_ATTACH_B, SH_PARK_B, R,
				   SH_GONE_A, SH_RESTORE_B, SH_END };
	static const int kept[] = { SH_OPEN_A, SH_PARK_A, SH_DETACH_A, SH_ATTACH_B, SH_PARK_B, R,
				    SH_RESTORE_A, SH_RESTORE_B, SH_END };

	(void)state;
	sh_scenario(ops, 1);
	sh_scenario(kept, 1);
}

/* B attaches from A's stored record after a restart (the documented path). */
static void
test_attach_from_store(void **state)
{
	static const int both[] = { SH_OPEN_A, SH_PARK_A, R, SH_ATTACH_B, SH_PARK_B, R,
				    SH_RESTORE_A, SH_RESTORE_B, R, SH_RESTORE_B, SH_RESTORE_A,
				    SH_END };
	static const int drop_creator[] = { SH_OPEN_A, SH_PARK_A, R, SH_ATTACH_B, SH_PARK_B,
					    SH_DROP_A, R, SH_GONE_A, SH_RESTORE_B, SH_END };
	static const int drop_after[] = { SH_OPEN_A, SH_PARK_A, R, SH_ATTACH_B, SH_PARK_B, R,
					  SH_DROP_A, SH_RESTORE_B, R, SH_GONE_A, SH_RESTORE_B,
					  SH_END };
	static const int restore_close[] = { SH_OPEN_A, SH_PARK_A, R, SH_ATTACH_B, SH_PARK_B,
					     SH_RESTORE_A, SH_CLOSE_A, R, SH_GONE_A, SH_RESTORE_B,
					     SH_END };
	static const int sharer_dropped[] = { SH_OPEN_A, SH_PARK_A, R, SH_ATTACH_B, SH_PARK_B, R,
					      SH_DROP_B, R, SH_GONE_B, SH_RESTORE_A, SH_END };

	(void)state;
	sh_scenario(both, 0);
	sh_scenario(drop_creator, 0);
	sh_scenario(drop_after, 0);
	sh_scenario(restore_close, 0);
	sh_scenario(sharer_dropped, 0);
}

/* A restored in the second run, B attaches the restored blocks from memory. */
static void
test_attach_restored(void **state)
{
	static const int ops[] = { SH_OPEN_A, SH_PARK_A, R, SH_RESTORE_A, SH_ATTACH_B, SH_PARK_B,
				   SH_PARK_A, R, SH_RESTORE_B, SH_RESTORE_A, SH_END };
	static const int detach[] = { SH_OPEN_A, SH_PARK_A, R, SH_RESTORE_A, SH_ATTACH_B,
				      SH_PARK_A, SH_DETACH_A, SH_PARK_B, R, SH_RESTORE_A,
				      SH_RESTORE_B, SH_END };

	(void)state;
	sh_scenario(ops, 0);
	sh_scenario(detach, 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_same_run_both_parked),
		cmocka_unit_test(test_same_run_creator_closed),
		cmocka_unit_test(test_prefix_cache_after_close),
		cmocka_unit_test(test_attach_from_store),
		cmocka_unit_test(test_attach_restored),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
