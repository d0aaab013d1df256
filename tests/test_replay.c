/* SPDX-License-Identifier: MIT */
/*
 * tests/test_replay.c - tools/kvtier-replay: trace loading (Mooncake JSONL through cJSON, Azure
 * CSV), the metadata-only simulation over kvtier's policies, and Belady MIN as an upper bound
 * of every policy on a small hand-made trace and (when the shared data is there) on the first
 * 1,500 requests of the Mooncake conversation trace.
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
#include "tools/kvtier-replay/replay_data.h"
#include "tools/kvtier-run/util.h"

static char *
write_tmp(const char *text)
{
	const char *d = getenv("KVT_TEST_TMP");
	char *path = malloc(512);
	FILE *f;
	int fd;

	snprintf(path, 512, "%s/replayXXXXXX", d ? d : "/tmp");
	fd = mkstemp(path);
	assert_true(fd >= 0);
	f = fdopen(fd, "w");
	fputs(text, f);
	fclose(f);
	return path;
}

/* The replayer counts a parent dropped while its child is cached: with 2 LRU blocks, r2 = [1 2]
 * brings child 2 in first (children before parents) and the make-room pushes out parent 1, the
 * coldest (then 1 comes back and 9 goes). With room for all, nothing is dropped. */
static void
test_orphan_count(void **state)
{
	char *p = write_tmp(
		"{\"timestamp\": 0, \"input_length\": 512, \"output_length\": 1, "
		"\"hash_ids\": [1]}\n"
		"{\"timestamp\": 1, \"input_length\": 512, \"output_length\": 1, "
		"\"hash_ids\": [9]}\n"
		"{\"timestamp\": 2, \"input_length\": 1024, \"output_length\": 1, "
		"\"hash_ids\": [1, 2]}\n");
	uint64_t cap[RP_TIERS] = { 2, 0, 0 };
	struct rp_result r;
	struct rp_trace t;

	(void)state;
	assert_int_equal(rp_trace_load(p, 16, 0, &t), 0);
	assert_int_equal(rp_sim_run(&t, &kvt_evict_lru_ops, cap, NULL, &r), 0);
	assert_int_equal(r.orphaned, 1);
	assert_int_equal(r.evictions[0], 2);
	cap[0] = 3;
	assert_int_equal(rp_sim_run(&t, &kvt_evict_lru_ops, cap, NULL, &r), 0);
	assert_int_equal(r.orphaned, 0);
	rp_trace_free(&t);
	unlink(p);
	free(p);
}

static void
test_mooncake_small(void **state)
{
	/* r0 = [0 1 2], r1 continues r0 with 3, r2 shares only block 0, r3 = r1 again */
	char *p = write_tmp(
		"{\"timestamp\": 0, \"input_length\": 1300, \"output_length\": 5, \"hash_ids\": [0, 1, 2]}\n"
		"{\"timestamp\": 5, \"input_length\": 1600, \"output_length\": 5, \"hash_ids\": [0, 1, 2, 3]}\n"
		"{\"timestamp\": 9, \"input_length\": 700, \"output_length\": 5, \"hash_ids\": [0, 4]}\n"
		"{\"timestamp\": 12, \"input_length\": 1600, \"output_length\": 5, "
		"\"hash_ids\": [0, 1, 2, 3]}\n");
	uint64_t cap[RP_TIERS] = { 100, 0, 0 };
	struct rp_result r, m;
	struct rp_trace t;

	(void)state;
	assert_int_equal(rp_trace_load(p, 16, 0, &t), 0);
	assert_int_equal(t.n_req, 4);
	assert_int_equal(t.n_ids, 13);
	assert_int_equal(t.block_tokens, 512);
	assert_int_equal(rp_block_tokens(&t, &t.req[0], 2), 1300 - 1024);
	assert_int_equal(rp_sim_run(&t, &kvt_evict_lru_ops, cap, NULL, &r), 0);
	/* infinite cache: r1 hits 3 blocks, r2 1, r3 4 */
	assert_int_equal(rp_hits(&r), 8);
	assert_int_equal(rp_hit_tokens(&r), 3 * 512 + 512 + 1600); /* the hitting request's tokens */
	assert_int_equal(rp_min_run(&t, 100, NULL, &m), 0);
	assert_int_equal(rp_hits(&m), 8);
	/* two HBM blocks and a HOST tier: hits are found below and promoted */
	cap[0] = 2;
	cap[1] = 8;
	assert_int_equal(rp_sim_run(&t, &kvt_evict_arc_ops, cap, NULL, &r), 0);
	assert_int_equal(rp_hits(&r), 8);
	assert_true(r.hit_blocks[1] > 0);
	assert_true(r.moved_blocks[0] > 0 && r.moved_blocks[3] > 0);
	/* clock (--policies clock: id keys, grown by reserve) through the same tiers */
	assert_int_equal(rp_sim_run(&t, kvt_evict_by_name("clock"), cap, NULL, &r), 0);
	assert_string_equal(r.policy, "clock");
	assert_int_equal(rp_hits(&r), 8);
	assert_true(r.evictions[0] > 0);
	rp_trace_free(&t);
	unlink(p);
	free(p);
}

static void
test_azure_and_bad_input(void **state)
{
	char *p = write_tmp("TIMESTAMP,ContextTokens,GeneratedTokens\n"
			    "2023-11-16 18:15:46.6805900,374,44\n"
			    "2023-11-16 18:15:50.9951690,1396,109\n");
	char *bad = write_tmp("{\"timestamp\": 0, \"input_length\": \"x\", \"hash_ids\": []}\n");
	struct rp_trace t;

	(void)state;
	assert_int_equal(rp_trace_load(p, 512, 0, &t), 0);
	assert_int_equal(t.n_req, 2);
	assert_int_equal(t.req[1].n, 3);
	assert_int_equal(t.req[1].t_ms, 4314);
	rp_trace_free(&t);
	assert_int_equal(rp_trace_load(bad, 512, 0, &t), -1);
	unlink(bad);
	free(bad);
	/* a file of neither format, a directory: the message names both accepted formats */
	bad = write_tmp("# kvtier\nnot a trace\n");
	assert_int_equal(rp_trace_load(bad, 512, 0, &t), -1);
	assert_non_null(strstr(kvtr_last_error(), "not a trace format"));
	assert_non_null(strstr(kvtr_last_error(), "Mooncake JSONL"));
	assert_non_null(strstr(kvtr_last_error(), "Azure CSV"));
	assert_int_equal(rp_trace_load("/tmp", 512, 0, &t), -1);
	assert_non_null(strstr(kvtr_last_error(), "/tmp is a directory"));
	assert_non_null(strstr(kvtr_last_error(), "Azure CSV"));
	unlink(p);
	unlink(bad);
	free(p);
	free(bad);
}

/* Runs the kvtier-replay binary beside kvtier-run (KVT_RUN) with @args; returns its exit
 * status and its stderr's first line in @msg, or -1 when the binary is not there. */
static int
replay_cli(const char *args, char *msg, size_t cap)
{
	const char *run = getenv("KVT_RUN");
	char cmd[2048];
	const char *slash;
	FILE *p;
	int st;

	if (!run || !(slash = strrchr(run, '/')))
		return -1;
	snprintf(cmd, sizeof cmd, "%.*s/kvtier-replay", (int)(slash - run), run);
	if (access(cmd, X_OK) != 0)
		return -1;
	snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), " %s 2>&1 >/dev/null", args);
	p = popen(cmd, "r");
	assert_non_null(p);
	msg[0] = '\0';
	if (!fgets(msg, (int)cap, p))
		msg[0] = '\0';
	while (fgetc(p) != EOF)
		;
	st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* --limit -1/0/abc: exit 2 naming --limit, never a run of the whole trace. */
static void
test_cli_bad_arguments(void **state)
{
	static const char *const bad[] = { "-1", "0", "abc" };
	char *p = write_tmp("TIMESTAMP,ContextTokens,GeneratedTokens\n"
			    "2023-11-16 18:15:46.6805900,374,44\n");
	char args[1024], msg[1024];

	(void)state;
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		int rc;

		snprintf(args, sizeof args, "%s --limit %s", p, bad[i]);
		rc = replay_cli(args, msg, sizeof msg);
		if (rc == -1) { /* no kvtier-replay built beside the test */
			unlink(p);
			free(p);
			skip();
		}
		assert_int_equal(rc, 2);
		assert_non_null(strstr(msg, "--limit"));
	}
	snprintf(args, sizeof args, "%s --hbm 2X", p);
	assert_int_equal(replay_cli(args, msg, sizeof msg), 2); /* usage errors: 2 */
	assert_non_null(strstr(msg, "--hbm: bad capacity '2X'"));
	/* an empty element of a list is refused, not skipped */
	snprintf(args, sizeof args, "%s --sweep 1k,,2k", p);
	assert_int_equal(replay_cli(args, msg, sizeof msg), 2);
	assert_non_null(strstr(msg, "--sweep: empty element in '1k,,2k'"));
	snprintf(args, sizeof args, "%s --policies lru,", p);
	assert_int_equal(replay_cli(args, msg, sizeof msg), 2);
	assert_non_null(strstr(msg, "--policies: empty element"));
	snprintf(args, sizeof args, "%s --limit 1 --hbm 1.5GiB --sweep 1k --bytes-per-token 1K", p);
	assert_int_equal(replay_cli(args, msg, sizeof msg), 0);
	unlink(p);
	free(p);
}

/* Every output path is checked before the run: exit 2, the option and path named, nothing
 * run (no temp file named). */
static void
test_cli_unwritable_outputs(void **state)
{
	static const char *const opts[] = { "--plot", "--csv", "--json" };
	char *p = write_tmp("TIMESTAMP,ContextTokens,GeneratedTokens\n"
			    "2023-11-16 18:15:46.6805900,374,44\n");
	char args[1024], msg[1024], want[256];

	(void)state;
	for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
		int rc;

		snprintf(args, sizeof args, "%s --sweep 1k %s /nonexist/x.out", p, opts[i]);
		rc = replay_cli(args, msg, sizeof msg);
		if (rc == -1) {
			unlink(p);
			free(p);
			skip();
		}
		assert_int_equal(rc, 2);
		snprintf(want, sizeof want, "kvtier-replay: cannot write %s /nonexist/x.out: "
			 "No such file or directory\n", opts[i]);
		assert_string_equal(msg, want);
	}
	snprintf(args, sizeof args, "%s --sweep 1k --csv /tmp", p);
	assert_int_equal(replay_cli(args, msg, sizeof msg), 2);
	assert_string_equal(msg, "kvtier-replay: cannot write --csv /tmp: Is a directory\n");
	unlink(p);
	free(p);
}

/* Reads all of @path into a malloc'd string (NULL when it cannot be read). */
static char *
slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	char *buf;
	size_t n;

	if (!f)
		return NULL;
	buf = calloc(1, 1 << 16);
	assert_non_null(buf);
	n = fread(buf, 1, (1 << 16) - 1, f);
	buf[n] = '\0';
	fclose(f);
	return buf;
}

/* --plot: x ticks at the sweep's capacities (not gnuplot's powers of two), the tiered run
 * plotted at the tiers' total, and stdout says where the PNG went. */
static void
test_cli_plot(void **state)
{
	char *p = write_tmp(
		"{\"timestamp\": 0, \"input_length\": 1300, \"output_length\": 5, "
		"\"hash_ids\": [0, 1, 2]}\n"
		"{\"timestamp\": 5, \"input_length\": 1600, \"output_length\": 5, "
		"\"hash_ids\": [0, 1, 2, 3]}\n");
	const char *run = getenv("KVT_RUN"), *slash = run ? strrchr(run, '/') : NULL;
	char cmd[2048], png[600], path[700], want[700], *out, *gp, *dat, *img;
	FILE *f;

	(void)state;
	if (!slash || system("command -v gnuplot >/dev/null 2>&1") != 0) {
		unlink(p);
		free(p);
		skip();
	}
	snprintf(png, sizeof png, "%s.png", p);
	snprintf(cmd, sizeof cmd, "%.*s/kvtier-replay %s --sweep 2,5 --hbm 1 --host 1 --nvme 1 "
		 "--plot %s 2>/dev/null", (int)(slash - run), run, p, png);
	f = popen(cmd, "r");
	assert_non_null(f);
	out = calloc(1, 1 << 16);
	assert_non_null(out);
	assert_true(fread(out, 1, (1 << 16) - 1, f) > 0);
	assert_int_equal(pclose(f), 0);
	snprintf(want, sizeof want, "plot written to %s\n", png);
	assert_non_null(strstr(out, want));
	snprintf(path, sizeof path, "%s.gp", png);
	gp = slurp(path);
	assert_non_null(gp);
	assert_non_null(strstr(gp, "set xtics ('2' 2, '5' 5, '3' 3)"));
	assert_non_null(strstr(gp, "index 1 using 1:2 with points"));
	assert_non_null(strstr(gp, "title 'lru tiered: HBM 1 + HOST 1 + NVME 1'"));
	snprintf(path, sizeof path, "%s.dat", png);
	dat = slurp(path);
	assert_non_null(dat);
	assert_non_null(strstr(dat, "\n\n\n# tiered: HBM 1 + HOST 1 + NVME 1 blocks\n3 "));
	img = slurp(png);
	assert_non_null(img);
	assert_memory_equal(img, "\x89PNG", 4);
	free(img);
	free(dat);
	free(gp);
	free(out);
	unlink(png);
	unlink(path);
	snprintf(path, sizeof path, "%s.gp", png);
	unlink(path);
	unlink(p);
	free(p);
}

/* A Mooncake request with fewer hash_ids than ceil(input_length / 512) loads as given, is
 * counted, and the load prints one warning line naming how many. */
static void
test_short_hash_ids(void **state)
{
	char *p = write_tmp(
		"{\"timestamp\": 0, \"input_length\": 1300, \"output_length\": 5, "
		"\"hash_ids\": [0, 1]}\n"
		"{\"timestamp\": 1, \"input_length\": 1024, \"output_length\": 5, "
		"\"hash_ids\": [0, 1]}\n"
		"{\"timestamp\": 2, \"input_length\": 513, \"output_length\": 5, "
		"\"hash_ids\": [7]}\n");
	char args[1024], msg[1024];
	struct rp_trace t;
	int rc;

	(void)state;
	assert_int_equal(rp_trace_load(p, 512, 0, &t), 0);
	assert_int_equal(t.n_req, 3);
	assert_int_equal(t.short_ids, 2);
	assert_int_equal(t.req[0].n, 2);
	rp_trace_free(&t);
	snprintf(args, sizeof args, "%s --sweep 1k", p);
	rc = replay_cli(args, msg, sizeof msg);
	if (rc != -1) {
		assert_int_equal(rc, 0);
		assert_non_null(strstr(msg, "kvtier-replay: warning: "));
		assert_non_null(strstr(msg, ": 2 requests have fewer hash_ids than "
					"ceil(input_length / 512)"));
	}
	unlink(p);
	free(p);
}

/* The Mooncake conversation trace ($KVT_SHARED_DATA, else ../shared/data) into @path; skips
 * the calling test when it is not there. */
static void
rp_mooncake_path(char *path, size_t size)
{
	const char *d = getenv("KVT_SHARED_DATA");

	snprintf(path, size, "%s/traces/mooncake_fast25_conversation_first30min.jsonl",
		 d ? d : "../shared/data");
	if (access(path, R_OK) != 0)
		skip();
}

/* Data mode: real bytes through an engine with small tiers; every shared block read back
 * equals what its first writer wrote, and hits are found below HBM too. */
static void
test_data_mode(void **state)
{
	const char *tmp = getenv("KVT_TEST_TMP");
	struct rp_data_opts o = { .cap = { 32, 64, 2048 }, .nvme_dir = tmp ? tmp : "/tmp",
				  .policy = KVT_EVICT_ARC };
	struct rp_data_result r;
	char path[1024];
	struct rp_trace t;

	(void)state;
	rp_mooncake_path(path, sizeof path);
	assert_int_equal(rp_trace_load(path, 512, 800, &t), 0);
	assert_int_equal(rp_data_run(&t, &o, NULL, &r), 0);
	print_message("data mode, 800 requests: %llu hit blocks (HBM %llu HOST %llu NVMe %llu), "
		      "%llu verified\n", (unsigned long long)r.st.prefix_hit_blocks,
		      (unsigned long long)r.st.tier[0].prefix_hit_blocks,
		      (unsigned long long)r.st.tier[1].prefix_hit_blocks,
		      (unsigned long long)r.st.tier[2].prefix_hit_blocks,
		      (unsigned long long)r.verified);
	assert_int_equal(r.mismatches, 0);
	assert_true(r.verified > 100);
	assert_true(r.st.tier[2].prefix_hit_blocks > 0);
	assert_true(r.st.blocks_moved[KVT_MOVE_NVME_TO_HOST] > 0);
	assert_int_equal(r.st.checksum_failed, 0);
	assert_int_equal(r.attached_tokens, r.st.prefix_hit_tokens);
	rp_trace_free(&t);
}

/* On the real trace: MIN bounds every policy; arc beats lru by 1.4x at 4k blocks. */
static void
test_mooncake_prefix(void **state)
{
	char path[1024];
	uint64_t cap[RP_TIERS] = { 4000, 0, 0 };
	struct rp_result lru, arc, prio, min;
	struct rp_trace t;

	(void)state;
	rp_mooncake_path(path, sizeof path);
	assert_int_equal(rp_trace_load(path, 512, 0, &t), 0);
	assert_int_equal(rp_sim_run(&t, &kvt_evict_lru_ops, cap, NULL, &lru), 0);
	assert_int_equal(rp_sim_run(&t, &kvt_evict_arc_ops, cap, NULL, &arc), 0);
	assert_int_equal(rp_sim_run(&t, &kvt_evict_prio_ops, cap, NULL, &prio), 0);
	assert_int_equal(rp_min_run(&t, cap[0], NULL, &min), 0);
	assert_true(rp_hits(&min) >= rp_hits(&arc));
	assert_true(rp_hits(&min) >= rp_hits(&lru));
	assert_true(rp_hits(&arc) * 10 > rp_hits(&lru) * 14);
	assert_int_equal(rp_hits(&prio), rp_hits(&lru)); /* no priorities given: LRU */
	print_message("whole trace @4k: lru %llu arc %llu min %llu of %llu\n",
		      (unsigned long long)rp_hits(&lru), (unsigned long long)rp_hits(&arc),
		      (unsigned long long)rp_hits(&min), (unsigned long long)lru.refs);
	rp_trace_free(&t);
}

/* Multi-node (issue 18, item 6): two conversations on two nodes (keys 1 and 2: the test checks
 * they land apart), r0 = [0 1 10] and r2 = [0 1 10 11] on X, r1 = [0 2] and r3 = [0 2 20] on Y.
 * HBM of 2 blocks, no lower tiers. Alone: r2 hits 0 1 (10 was pushed out of X's HBM by r0
 * itself), r3 hits 0 2: 4. Sharing an unbounded REMOTE: r1 gets 0 from it (X wrote it: one
 * cross-node hit), r2 gets 10 back from it: 6 hits, 2 from REMOTE, 6 puts (every block once).
 * REMOTE of 2 blocks (LRU): every block is pushed out before it is wanted again: 4 hits, 9
 * evictions. One node, same HBM: 3 alone, 6 with REMOTE (3 of them from it, none cross-node). */
static void
test_multi_shared(void **state)
{
	char *p = write_tmp(
		"{\"timestamp\": 0, \"input_length\": 1500, \"output_length\": 1, \"hash_ids\": [0, 1, 10]}\n"
		"{\"timestamp\": 1, \"input_length\": 1000, \"output_length\": 1, \"hash_ids\": [0, 2]}\n"
		"{\"timestamp\": 2, \"input_length\": 2000, \"output_length\": 1, "
		"\"hash_ids\": [0, 1, 10, 11]}\n"
		"{\"timestamp\": 3, \"input_length\": 1500, \"output_length\": 1, \"hash_ids\": [0, 2, 20]}\n");
	struct rp_multi_opts o = { .nodes = 2, .cap = { 2, 0, 0 }, .block_bytes = 1000 };
	struct rp_multi_result r;
	struct rp_trace t;

	(void)state;
	assert_int_equal(rp_trace_load(p, 16, 0, &t), 0);
	assert_int_equal(rp_conv_key(&t, &t.req[2]), 1);
	assert_int_equal(rp_multi_node(&t, 0, &o), rp_multi_node(&t, 2, &o));
	assert_int_equal(rp_multi_node(&t, 1, &o), rp_multi_node(&t, 3, &o));
	assert_int_not_equal(rp_multi_node(&t, 0, &o), rp_multi_node(&t, 1, &o));
	assert_int_equal(rp_multi_run(&t, &kvt_evict_lru_ops, &o, &r), 0); /* alone */
	assert_int_equal(rp_multi_hits(&r), 4);
	assert_int_equal(r.hit_blocks[RP_REMOTE] + r.cross_hits + r.puts + r.gets, 0);
	o.remote_cap = RP_UNBOUNDED;
	assert_int_equal(rp_multi_run(&t, &kvt_evict_lru_ops, &o, &r), 0);
	assert_int_equal(rp_multi_hits(&r), 6);
	assert_int_equal(r.hit_blocks[RP_REMOTE], 2);
	assert_int_equal(r.hit_tokens[RP_REMOTE], 512 + 512);
	assert_int_equal(r.cross_hits, 1);
	assert_int_equal(r.gets, 2);
	assert_int_equal(r.puts, 6);
	assert_int_equal(r.remote_evictions, 0);
	o.remote_cap = 2;
	assert_int_equal(rp_multi_run(&t, &kvt_evict_lru_ops, &o, &r), 0);
	assert_int_equal(rp_multi_hits(&r), 4);
	assert_int_equal(r.hit_blocks[RP_REMOTE], 0);
	assert_int_equal(r.remote_evictions, 9); /* 1 + 2 + 3 + 3: r2 and r3 write 0 again */
	o.nodes = 1;
	o.remote_cap = 0;
	assert_int_equal(rp_multi_run(&t, &kvt_evict_lru_ops, &o, &r), 0);
	assert_int_equal(rp_multi_hits(&r), 3); /* r1, r2 and r3 hit 0 only (r1's 2 pushed 1 out) */
	o.remote_cap = RP_UNBOUNDED;
	assert_int_equal(rp_multi_run(&t, &kvt_evict_lru_ops, &o, &r), 0);
	assert_int_equal(rp_multi_hits(&r), 6); /* + 1 10 for r2 and 2 for r3 from REMOTE */
	assert_int_equal(r.hit_blocks[RP_REMOTE], 3);
	assert_int_equal(r.cross_hits, 0);
	o.nodes = 0; /* bad options: -EINVAL */
	assert_int_equal(rp_multi_run(&t, &kvt_evict_lru_ops, &o, &r), -EINVAL);
	rp_trace_free(&t);
	unlink(p);
	free(p);
}

/* Write budget (issue 18, item 5): blocks of 100 bytes, REMOTE budget 200 B/s (bucket depth
 * 200, full at t 0). r0 (t 0) offers 1..5: 1 and 2 written, the rest refused; r1 (t 500 ms:
 * +100 bytes) writes 3 and stops at 4; r2 (t 10 s: full again) writes 7: exactly 4 puts, 400
 * bytes, against 7 without. "seen twice": r0's blocks are refused, r1 writes the re-seen
 * 1..5 only (not 6), r2's 7 is refused. NVMe budget of 100 B/s over HBM 1 + HOST 1: of the
 * two demotions at t 0 only the first gets to NVMe, so r1 finds one block fewer. */
static void
test_multi_budget(void **state)
{
	char *p = write_tmp(
		"{\"timestamp\": 0, \"input_length\": 2560, \"output_length\": 1, "
		"\"hash_ids\": [1, 2, 3, 4, 5]}\n"
		"{\"timestamp\": 500, \"input_length\": 3072, \"output_length\": 1, "
		"\"hash_ids\": [1, 2, 3, 4, 5, 6]}\n"
		"{\"timestamp\": 10000, \"input_length\": 512, \"output_length\": 1, "
		"\"hash_ids\": [7]}\n");
	char *q = write_tmp(
		"{\"timestamp\": 0, \"input_length\": 2048, \"output_length\": 1, "
		"\"hash_ids\": [1, 2, 3, 4]}\n"
		"{\"timestamp\": 1, \"input_length\": 2048, \"output_length\": 1, "
		"\"hash_ids\": [1, 2, 3, 4]}\n");
	struct rp_multi_opts o = { .nodes = 1, .cap = { 100, 0, 0 }, .block_bytes = 100,
				   .remote_cap = RP_UNBOUNDED };
	struct rp_multi_result r, b;
	struct rp_trace t;

	(void)state;
	assert_int_equal(rp_trace_load(p, 16, 0, &t), 0);
	assert_int_equal(rp_multi_run(&t, &kvt_evict_lru_ops, &o, &r), 0);
	assert_int_equal(r.puts, 7);
	assert_int_equal(r.remote_refused, 0);
	o.budget[1] = 200;
	assert_int_equal(rp_multi_run(&t, &kvt_evict_lru_ops, &o, &b), 0);
	assert_int_equal(b.puts * b.o.block_bytes, 400);
	assert_int_equal(b.remote_refused, 3 + 3);
	assert_int_equal(rp_multi_hits(&b), rp_multi_hits(&r)); /* one node: HBM holds all */
	o.period_ms = 500; /* depth 100: r0 writes 1, r1 2, r2 7 */
	assert_int_equal(rp_multi_run(&t, &kvt_evict_lru_ops, &o, &b), 0);
	assert_int_equal(b.puts, 3);
	o.period_ms = 0;
	o.budget[1] = 0;
	o.admit = RP_ADMIT_SEEN_TWICE;
	assert_int_equal(rp_multi_run(&t, &kvt_evict_lru_ops, &o, &b), 0);
	assert_int_equal(b.puts, 5);
	assert_int_equal(b.remote_refused, 5 + 1 + 1);
	rp_trace_free(&t);
	/* NVMe: r0 brings 4 3 2 1 into HBM 1; HOST 1 demotes 4 (written) then 3 (no budget left,
	 * dropped); r1 finds 1 (HBM) 2 (HOST) and stops at 3; without budget 3 and 4 are on NVMe */
	assert_int_equal(rp_trace_load(q, 16, 0, &t), 0);
	memset(&o, 0, sizeof o);
	o.nodes = 1;
	o.cap[0] = o.cap[1] = 1;
	o.cap[2] = 10;
	o.block_bytes = 100;
	assert_int_equal(rp_multi_run(&t, &kvt_evict_lru_ops, &o, &r), 0);
	assert_int_equal(rp_multi_hits(&r), 4);
	assert_int_equal(r.nvme_writes, 2 + 4); /* r1's promotions demote 4 more */
	o.budget[0] = 100;
	assert_int_equal(rp_multi_run(&t, &kvt_evict_lru_ops, &o, &b), 0);
	assert_int_equal(rp_multi_hits(&b), 2);
	assert_int_equal(b.nvme_writes * b.o.block_bytes, 100); /* t 1 ms: 0.1 byte refilled */
	assert_int_equal(b.nvme_refused, 5);
	o.budget[0] = 0;
	o.admit = RP_ADMIT_SEEN_TWICE; /* r0's demotions are first sightings: none written */
	assert_int_equal(rp_multi_run(&t, &kvt_evict_lru_ops, &o, &b), 0);
	assert_int_equal(rp_multi_hits(&b), 2);
	assert_int_equal(b.nvme_refused, 2);
	assert_int_equal(b.nvme_writes, 4); /* r1's, of blocks seen twice */
	rp_trace_free(&t);
	unlink(p);
	unlink(q);
	free(p);
	free(q);
}

/* The CLI of the multi-node runs: bad values are usage errors (2) naming the option; a run
 * writes the three runs per node count to --json. */
static void
test_cli_nodes(void **state)
{
	char *p = write_tmp(
		"{\"timestamp\": 0, \"input_length\": 1500, \"output_length\": 1, \"hash_ids\": [0, 1, 10]}\n"
		"{\"timestamp\": 1, \"input_length\": 1000, \"output_length\": 1, \"hash_ids\": [0, 2]}\n");
	char args[1024], msg[1024], json[600], buf[8192];
	const char *d = getenv("KVT_TEST_TMP");
	size_t len;
	FILE *f;
	int rc;

	(void)state;
	snprintf(args, sizeof args, "%s --nodes 0", p);
	rc = replay_cli(args, msg, sizeof msg);
	if (rc == -1) {
		unlink(p);
		free(p);
		skip();
	}
	assert_int_equal(rc, 2);
	assert_non_null(strstr(msg, "--nodes"));
	snprintf(args, sizeof args, "%s --remote 10", p); /* not silently ignored */
	assert_int_equal(replay_cli(args, msg, sizeof msg), 2);
	assert_non_null(strstr(msg, "give --nodes too"));
	snprintf(args, sizeof args, "%s --nodes 2 --remote 0", p);
	assert_int_equal(replay_cli(args, msg, sizeof msg), 2);
	assert_non_null(strstr(msg, "--remote: bad capacity '0'"));
	snprintf(args, sizeof args, "%s --nodes 2 --admit maybe", p);
	assert_int_equal(replay_cli(args, msg, sizeof msg), 2);
	assert_non_null(strstr(msg, "--admit"));
	snprintf(args, sizeof args, "%s --nodes 2 --write-budget-remote -5", p);
	assert_int_equal(replay_cli(args, msg, sizeof msg), 2);
	assert_non_null(strstr(msg, "--write-budget-remote"));
	snprintf(args, sizeof args, "%s --nodes 2 --write-budget-period 0", p);
	assert_int_equal(replay_cli(args, msg, sizeof msg), 2);
	assert_non_null(strstr(msg, "--write-budget-period"));
	snprintf(json, sizeof json, "%s/replay_nodes_%d.json", d ? d : "/tmp", (int)getpid());
	snprintf(args, sizeof args, "%s --nodes 1,2 --write-budget-remote 64MiB/s --json %s", p,
		 json);
	assert_int_equal(replay_cli(args, msg, sizeof msg), 0);
	f = fopen(json, "r");
	assert_non_null(f);
	len = fread(buf, 1, sizeof buf - 1, f);
	buf[len] = '\0';
	fclose(f);
	assert_non_null(strstr(buf, "\"run\":\t\"alone\""));
	assert_non_null(strstr(buf, "\"run\":\t\"budget\""));
	assert_non_null(strstr(buf, "\"network_put_bytes\""));
	assert_non_null(strstr(buf, "\"cross_node_hits\":\t1")); /* 2 nodes: r1 gets block 0 */
	unlink(json);
	unlink(p);
	free(p);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_mooncake_small),
		cmocka_unit_test(test_orphan_count),
		cmocka_unit_test(test_azure_and_bad_input),
		cmocka_unit_test(test_cli_bad_arguments),
		cmocka_unit_test(test_cli_unwritable_outputs),
		cmocka_unit_test(test_cli_plot),
		cmocka_unit_test(test_short_hash_ids),
		cmocka_unit_test(test_mooncake_prefix),
		cmocka_unit_test(test_data_mode),
		cmocka_unit_test(test_multi_shared),
		cmocka_unit_test(test_multi_budget),
		cmocka_unit_test(test_cli_nodes),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
