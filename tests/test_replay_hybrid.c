/* SPDX-License-Identifier: MIT */
/*
 * tests/test_replay_hybrid.c - kvtier-replay's checkpoint accounting of hybrid layouts
 * (tools/kvtier-replay/hybrid.c, issue 17): on a seven-request trace whose figures are worked
 * out by hand below, at checkpoints every 1, 2, 4 and 16 blocks; against a brute-force
 * reference that compares each request with every earlier one (no per-id flags) on that trace
 * and on the first 400 requests of the Mooncake conversation trace; the attention-only hits
 * against rp_sim_run with room for every block; Qwen3-Next-80B's bytes from kvtier-calc's
 * reader (36 linear layers x (conv 8192 x 3 + 32 x 128 x 128) x 2 bytes; 12 attention layers
 * x 2 KV heads x 256 x K+V x 2 bytes); the CLI.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tools/kvtier-replay/replay.h"

#define BT 512 /* Mooncake's block tokens */

static char *
write_tmp(const char *text)
{
	const char *d = getenv("KVT_TEST_TMP");
	char *path = malloc(512);
	FILE *f;
	int fd;

	snprintf(path, 512, "%s/hybridXXXXXX", d ? d : "/tmp");
	fd = mkstemp(path);
	assert_true(fd >= 0);
	f = fdopen(fd, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
	return path;
}

/*
 * The trace (512-token blocks; "4f" = 4 full blocks, "+264" = a partial last block):
 *   r0 [0 1 2 3]    2048 tokens  4f        nothing cached
 *   r1 [0 1 2 5]    1800         3f +264   shares 0 1 2 with r0
 *   r2 [0 1 2 3 4]  2560         5f        shares 0 1 2 3
 *   r3 [0 1 2 3]    2048         4f        shares all of r0
 *   r4 [0 6]        1000         1f +488   shares 0
 *   r5 [7]          300          +300      nothing
 *   r6 [0 1 2 5]    1800         3f +264   r1 again: shares all, its last block partial
 * Attention-only hits (leading shared run, partial block included):
 *   r1 3 x 512, r2 4 x 512, r3 4 x 512, r4 512, r6 3 x 512 + 264.
 */
#define HY_REQ(ts, len, ids) \
	"{\"timestamp\": " #ts ", \"input_length\": " #len ", \"output_length\": 1, " \
	"\"hash_ids\": [" ids "]}\n"
static const char hy_trace[] =
	HY_REQ(0, 2048, "0, 1, 2, 3")
	HY_REQ(1, 1800, "0, 1, 2, 5")
	HY_REQ(2, 2560, "0, 1, 2, 3, 4")
	HY_REQ(3, 2048, "0, 1, 2, 3")
	HY_REQ(4, 1000, "0, 6")
	HY_REQ(5, 300, "7")
	HY_REQ(6, 1800, "0, 1, 2, 5");

static const uint64_t hy_attn_hits = 3 * BT + 4 * BT + 4 * BT + BT + (3 * BT + 264);
/* distinct blocks 0..7: ids 0-3 and 4 full, 5 has 264 tokens, 6 488, 7 300 */
static const uint64_t hy_cached_tokens = 5 * BT + 264 + 488 + 300;

static void
hy_load(struct rp_trace *t, char **path)
{
	*path = write_tmp(hy_trace);
	assert_int_equal(rp_trace_load(*path, BT, 0, t), 0);
	assert_int_equal(t->n_req, 7);
}

static void
hy_free(struct rp_trace *t, char *path)
{
	rp_trace_free(t);
	unlink(path);
	free(path);
}

/*
 * Every block (N = 1): r0 stores checkpoints after ids 0 1 2 3, r2 after 4; 5, 6, 7 are never
 * full. Every hit ends at its shared run's last full block: r1 3, r2 4, r3 4, r4 1, r6 3 blocks
 * (r6 loses its 264 partial tokens). Reused blocks: 0 1 2 (r1) and 3 (r2), 4 checkpoints on
 * them; r1, r2/r3 and r4 end at 2, 3 and 0: 3 end checkpoints.
 */
static void
test_every_block(void **state)
{
	struct rp_hybrid_bytes b = { .state_bytes = 1000, .attn_token_bytes = 2 };
	struct rp_hybrid_result r;
	struct rp_hybrid_fig f;
	struct rp_trace t;
	char *p;

	(void)state;
	hy_load(&t, &p);
	assert_int_equal(rp_hybrid_run(&t, 1, &r), 0);
	assert_int_equal(r.every, 1);
	assert_int_equal(r.tokens, 2048 + 1800 + 2560 + 2048 + 1000 + 300 + 1800);
	assert_int_equal(r.attn_hit_tokens, hy_attn_hits);
	assert_int_equal(r.hit_tokens, (3 + 4 + 4 + 1 + 3) * BT);
	assert_int_equal(r.hit_reqs, 5);
	assert_int_equal(r.cached_blocks, 8);
	assert_int_equal(r.cached_tokens, hy_cached_tokens);
	assert_int_equal(r.ckpts, 5);
	assert_int_equal(r.reused_blocks, 4);
	assert_int_equal(r.reused_tokens, 4 * BT);
	assert_int_equal(r.reused_ckpts, 4);
	assert_int_equal(r.end_ckpts, 3);

	rp_hybrid_figures(&r, &b, &f);
	assert_true(f.ckpt_bytes == 5 * 1000.0);
	assert_true(f.attn_bytes == (double)hy_cached_tokens * 2);
	/* one checkpoint per reused block: 1000 bytes per 512 tokens */
	assert_true(f.ckpt_per_reused_token == 1000.0 / BT);
	assert_true(f.ratio_reused == 1000.0 / BT / 2);
	assert_true(f.kept_per_reused_token == 5000.0 / (4 * BT));
	assert_true(f.hit_frac == (double)(15 * BT) / (double)hy_attn_hits);
	rp_print_hybrid(stdout, &r, 1, &b);
	hy_free(&t, p);
}

/*
 * Every 2 blocks: checkpoints after positions 2 and 4 only: ids 1 and 3 (r0); r2's id 4 sits at
 * position 5. r1 ends at 1 (2 blocks), r2 and r3 at 3 (4), r4 at none (its run is 1 block),
 * r6 at 1 (2). Reused: 0 1 (r1), 2 3 (r2): 4 blocks, 2 checkpoints.
 * Every 4: the one checkpoint after id 3: r2 and r3 hit 4 blocks, the others nothing; reused
 * 0 1 2 3 with 1 checkpoint. Every 16: no request has 16 full blocks: nothing.
 */
static void
test_every_n(void **state)
{
	struct rp_hybrid_bytes b = { .state_bytes = 1000, .attn_token_bytes = 2 };
	struct rp_hybrid_result r;
	struct rp_hybrid_fig f;
	struct rp_trace t;
	char *p;

	(void)state;
	hy_load(&t, &p);
	assert_int_equal(rp_hybrid_run(&t, 2, &r), 0);
	assert_int_equal(r.attn_hit_tokens, hy_attn_hits);
	assert_int_equal(r.hit_tokens, (2 + 4 + 4 + 0 + 2) * BT);
	assert_int_equal(r.hit_reqs, 4);
	assert_int_equal(r.ckpts, 2);
	assert_int_equal(r.reused_blocks, 4);
	assert_int_equal(r.reused_ckpts, 2);
	assert_int_equal(r.end_ckpts, 2);
	rp_hybrid_figures(&r, &b, &f);
	assert_true(f.ckpt_per_reused_token == 2 * 1000.0 / (4 * BT));

	assert_int_equal(rp_hybrid_run(&t, 4, &r), 0);
	assert_int_equal(r.hit_tokens, 2 * 4 * BT);
	assert_int_equal(r.hit_reqs, 2);
	assert_int_equal(r.ckpts, 1);
	assert_int_equal(r.reused_tokens, 4 * BT);
	assert_int_equal(r.reused_ckpts, 1);
	assert_int_equal(r.end_ckpts, 1);
	rp_hybrid_figures(&r, &b, &f);
	assert_true(f.ckpt_bytes == 1000.0);
	assert_true(f.ckpt_per_reused_token == 1000.0 / (4 * BT));
	assert_true(f.hit_frac == (double)(8 * BT) / (double)hy_attn_hits);

	assert_int_equal(rp_hybrid_run(&t, 16, &r), 0);
	assert_int_equal(r.hit_tokens, 0);
	assert_int_equal(r.ckpts, 0);
	assert_int_equal(r.reused_tokens, 0);
	assert_int_equal(r.attn_hit_tokens, hy_attn_hits); /* the attention side is N-free */
	rp_hybrid_figures(&r, &b, &f);
	assert_true(f.ckpt_per_reused_token == 0 && f.kept_per_reused_token == 0);
	assert_true(f.hit_frac == 0);

	assert_int_equal(rp_hybrid_run(&t, 0, &r), -EINVAL);
	hy_free(&t, p);
}

/*
 * The reference: for request i, its shared run h with all earlier requests (the longest common
 * prefix of ids with any of them), and its hit: the largest k <= h such that some earlier
 * request j had the same id at position k - 1 as a full block with k % every == 0 (it wrote
 * that checkpoint). Quadratic, no state carried between requests.
 */
static void
ref_run(const struct rp_trace *t, uint32_t every, uint64_t *attn, uint64_t *hit)
{
	uint32_t i, j, k;

	*attn = *hit = 0;
	for (i = 0; i < t->n_req; i++) {
		const struct rp_req *q = &t->req[i];
		const uint32_t *a = t->ids + q->first;
		uint32_t h = 0, end = 0;

		for (j = 0; j < i; j++) {
			const struct rp_req *o = &t->req[j];
			const uint32_t *b = t->ids + o->first;

			for (k = 0; k < q->n && k < o->n && a[k] == b[k]; k++)
				;
			h = k > h ? k : h;
		}
		for (j = 0; j < i; j++) {
			const struct rp_req *o = &t->req[j];
			const uint32_t *b = t->ids + o->first;

			for (k = 1; k <= h && k <= o->n; k++)
				if (b[k - 1] == a[k - 1] && k % every == 0 && k > end &&
				    rp_block_tokens(t, o, k - 1) == BT &&
				    rp_block_tokens(t, q, k - 1) == BT)
					end = k;
		}
		for (k = 0; k < h; k++)
			*attn += rp_block_tokens(t, q, k);
		for (k = 0; k < end; k++)
			*hit += rp_block_tokens(t, q, k);
	}
}

static void
check_against_ref(const struct rp_trace *t)
{
	static const uint32_t every[] = { 1, 2, 3, 4, 16 };
	struct rp_hybrid_result r;
	uint64_t attn, hit;

	for (size_t n = 0; n < sizeof every / sizeof every[0]; n++) {
		ref_run(t, every[n], &attn, &hit);
		assert_int_equal(rp_hybrid_run(t, every[n], &r), 0);
		assert_int_equal(r.attn_hit_tokens, attn);
		assert_int_equal(r.hit_tokens, hit);
	}
}

/* The mooncake conversation trace ($KVT_SHARED_DATA, else ../shared/data); skips without it. */
static void
hy_mooncake_path(char *path, size_t size)
{
	const char *d = getenv("KVT_SHARED_DATA");

	snprintf(path, size, "%s/traces/mooncake_fast25_conversation_first30min.jsonl",
		 d ? d : "../shared/data");
	if (access(path, R_OK) != 0)
		skip();
}

/* The flags of hybrid.c against the reference, on the tiny trace and on 400 real requests;
 * the attention-only hits equal rp_sim_run's with room for every block (LRU never evicts). */
static void
test_reference(void **state)
{
	uint64_t cap[RP_TIERS] = { 0, 0, 0 };
	struct rp_hybrid_result h;
	struct rp_result s;
	struct rp_trace t;
	char path[1024], *p;

	(void)state;
	hy_load(&t, &p);
	check_against_ref(&t);
	hy_free(&t, p);

	hy_mooncake_path(path, sizeof path);
	assert_int_equal(rp_trace_load(path, BT, 400, &t), 0);
	check_against_ref(&t);
	cap[0] = t.max_id;
	assert_int_equal(rp_sim_run(&t, &kvt_evict_lru_ops, cap, NULL, &s), 0);
	assert_int_equal(rp_hybrid_run(&t, 1, &h), 0);
	assert_int_equal(rp_hit_tokens(&s), h.attn_hit_tokens);
	assert_true(h.hit_tokens > 0 && h.hit_tokens <= h.attn_hit_tokens);
	rp_trace_free(&t);
}

/* Qwen3-Next-80B-A3B: per linear layer conv_dim = 2 x 16 x 128 + 32 x 128 = 8192, state
 * 8192 x 3 + 32 x 128 x 128 = 548864 elements, bf16: 1097728 bytes, 36 layers; attention:
 * 12 layers x 2 heads x 256 x 2 (K, V) x 2 bytes per token. An explicit figure wins. */
static void
test_model_bytes(void **state)
{
	char path[4096];
	const char *slash = strrchr(__FILE__, '/');
	struct rp_hybrid_bytes b = { 0, 0 };

	(void)state;
	snprintf(path, sizeof path, "%.*s/data/configs/qwen3-next-80b-a3b.json",
		 slash ? (int)(slash - __FILE__) : 1, slash ? __FILE__ : ".");
	assert_int_equal(rp_hybrid_from_model(path, &b), 0);
	assert_true(b.state_bytes == 36.0 * (8192 * 3 + 32 * 128 * 128) * 2);
	assert_true(b.attn_token_bytes == 12.0 * 2 * 256 * 2 * 2);
	b.attn_token_bytes = 7;
	assert_int_equal(rp_hybrid_from_model(path, &b), 0);
	assert_true(b.attn_token_bytes == 7);
	snprintf(path, sizeof path, "%.*s/data/configs/llama-3-8b.json",
		 slash ? (int)(slash - __FILE__) : 1, slash ? __FILE__ : ".");
	b.state_bytes = 0;
	assert_int_equal(rp_hybrid_from_model(path, &b), -1); /* no linear layers */
}

/* Runs kvtier-replay (beside the test binary, $KVT_RUN's directory) with @args; its stdout
 * and stderr into @out. The exit status, or -1 when the binary is not there. */
static int
replay_cli(const char *args, char *out, size_t size)
{
	const char *run = getenv("KVT_RUN");
	char bin[1024], cmd[4096];
	size_t len = 0, got;
	FILE *p;
	int st;

	if (!run || !strrchr(run, '/'))
		return -1;
	snprintf(bin, sizeof bin, "%.*s/kvtier-replay", (int)(strrchr(run, '/') - run), run);
	if (access(bin, X_OK))
		return -1;
	snprintf(cmd, sizeof cmd, "%s %s 2>&1", bin, args);
	p = popen(cmd, "r");
	assert_non_null(p);
	while (len + 1 < size && (got = fread(out + len, 1, size - 1 - len, p)) > 0)
		len += got;
	out[len] = '\0';
	while (fgetc(p) != EOF)
		;
	st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* The table from explicit bytes (rows 1, 4, 16 and --checkpoint-every 2); the usage errors. */
static void
test_cli(void **state)
{
	char *p = write_tmp(hy_trace);
	char args[1024], out[8192];
	int rc;

	(void)state;
	snprintf(args, sizeof args, "%s --state-bytes 1000 --attn-token-bytes 2 "
		 "--checkpoint-every 2", p);
	rc = replay_cli(args, out, sizeof out);
	if (rc == -1) {
		unlink(p);
		free(p);
		skip();
	}
	assert_int_equal(rc, 0);
	assert_non_null(strstr(out, "== checkpoints every N blocks"));
	assert_non_null(strstr(out, "\n2 ")); /* the extra row */
	snprintf(args, sizeof args, "%s --state-bytes 1000", p);
	assert_int_equal(replay_cli(args, out, sizeof out), 2);
	assert_non_null(strstr(out, "--attn-token-bytes"));
	snprintf(args, sizeof args, "%s --state-bytes 1000 --attn-token-bytes 2 "
		 "--checkpoint-every 0", p);
	assert_int_equal(replay_cli(args, out, sizeof out), 2);
	assert_non_null(strstr(out, "--checkpoint-every"));
	unlink(p);
	free(p);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_block),
		cmocka_unit_test(test_every_n),
		cmocka_unit_test(test_reference),
		cmocka_unit_test(test_model_bytes),
		cmocka_unit_test(test_cli),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
