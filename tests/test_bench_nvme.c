/* SPDX-License-Identifier: MIT */
/*
 * tests/test_bench_nvme.c - `kvtier-bench nvme` (and decode's parser) refuses bad arguments
 * before measuring anything: exit status 2 and a message naming the argument
 * (kvtr_last_error(), also printed).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include <stdlib.h>
#include <unistd.h>
#include "support/run_util.h"
#include "tools/kvtier-bench/bench.h"
#include "tools/kvtier-bench/nvme_int.h"
#include "tools/kvtier-run/util.h"

/* Runs `kvtier-bench nvme ARGS...` in-process; returns its exit status. */
static int
bn_run(int argc, ...)
{
	char *argv[16];
	va_list ap;

	argv[0] = (char *)"nvme";
	va_start(ap, argc);
	for (int i = 1; i <= argc; i++)
		argv[i] = va_arg(ap, char *);
	va_end(ap);
	argv[argc + 1] = NULL;
	return kvtb_nvme_main(argc + 1, argv);
}

static void
bn_expect(int rc, const char *needle)
{
	assert_int_equal(rc, 2);
	if (!strstr(kvtr_last_error(), needle))
		fail_msg("'%s' not in '%s'", needle, kvtr_last_error());
}

static void
test_bad_values_named(void **state)
{
	(void)state;
	bn_expect(bn_run(2, "--codec", "zip"), "--codec: unknown codec 'zip'");
	bn_expect(bn_run(2, "--only", "foo"), "--only: unknown part 'foo'");
	bn_expect(bn_run(2, "--bs", "7"), "--bs");
	bn_expect(bn_run(2, "--bs", "12k,7"), "--bs");
	bn_expect(bn_run(2, "--bs", "12345"), "multiple of 4096");
	bn_expect(bn_run(2, "--qd", "0"), "--qd");
	bn_expect(bn_run(2, "--qd", "1,x"), "--qd");
	bn_expect(bn_run(2, "--mib", "0"), "--mib");
	bn_expect(bn_run(2, "--sessions", "-1"), "--sessions");
	bn_expect(bn_run(1, "--mib"), "--mib: missing value");
	bn_expect(bn_run(2, "--host-blocks", "8"), "--host-blocks");
	bn_expect(bn_run(2, "--layout", "mixed"), "--layout: unknown layout 'mixed'");
	bn_expect(bn_run(2, "--host-blocks", "1e9"), "--host-blocks");
	bn_expect(bn_run(1, "--host-blocks"), "--host-blocks: missing value");
}

static void
test_unknown_option(void **state)
{
	(void)state;
	bn_expect(bn_run(1, "--bogus"), "unknown option '--bogus'");
	bn_expect(bn_run(2, "--bogus", "1"), "unknown option '--bogus'");
	bn_expect(bn_run(1, "stray"), "unexpected argument 'stray'");
}

/* kvtier-bench decode names an unknown option as such (not "missing value"); usage errors
 * exit 2 as nvme's do, a run that fails (a model file that is not there) 1 */
static void
test_decode_unknown_option(void **state)
{
	char *argv[] = { (char *)"decode", (char *)"--bogus", NULL };
	char *argv2[] = { (char *)"decode", (char *)"--steps", NULL };
	char *argv3[] = { (char *)"decode", (char *)"--model", (char *)"/nonexistent", NULL };

	(void)state;
	assert_int_equal(kvtb_decode_main(2, argv), 2);
	assert_non_null(strstr(kvtr_last_error(), "unknown option --bogus"));
	assert_int_equal(kvtb_decode_main(2, argv2), 2);
	assert_non_null(strstr(kvtr_last_error(), "--steps: missing value"));
	assert_int_equal(kvtb_decode_main(3, argv3), 1);
	assert_non_null(strstr(kvtr_last_error(), "/nonexistent"));
}

/* kvtier-bench decode says where it is on stderr: the first step of every run of every round
 * ("round R/N, RUN: step 1/STEPS"; further lines every few seconds are not asserted). */
static void
test_decode_progress(void **state)
{
	const char *model = rutil_model_file("stories260K.bin");
	const char *tok = rutil_model_file("tok512.bin");
	static const char *const want[] = {
		"kvtier-bench decode: round 1/2, (a) resident: step 1/16\n",
		"kvtier-bench decode: round 1/2, (b) offloaded: step 1/16\n",
		"kvtier-bench decode: round 1/2, (c) prefetch: step 1/16\n",
		"kvtier-bench decode: round 2/2, (c) prefetch: step 1/16\n",
	};
	char path[] = "/tmp/kvt-bench-progress-XXXXXX", buf[8192];
	int fd, saved, rc;
	ssize_t n;

	(void)state;
	if (!model || !tok) {
		print_message("SKIPPED: no stories260K model in the shared data\n");
		skip();
	}
	{
		char *argv[] = { (char *)"decode", (char *)"--model", (char *)model,
				 (char *)"--tokenizer", (char *)tok, (char *)"--sessions",
				 (char *)"2", (char *)"--steps", (char *)"16",
				 (char *)"--tokens-per-block", (char *)"4", (char *)"--ratio",
				 (char *)"2", (char *)"--repeat", (char *)"2", NULL };

		fd = mkstemp(path);
		assert_true(fd >= 0);
		fflush(stderr);
		saved = dup(STDERR_FILENO);
		assert_true(saved >= 0);
		assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
		rc = kvtb_decode_main(15, argv);
		fflush(stderr);
		assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
		close(saved);
	}
	assert_int_equal(rc, 0);
	n = pread(fd, buf, sizeof buf - 1, 0);
	assert_true(n > 0);
	buf[n] = '\0';
	close(fd);
	unlink(path);
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
		if (!strstr(buf, want[i]))
			fail_msg("stderr lacks \"%s\":\n%s", want[i], buf);
}

/* --mib must hold one IO of the largest --bs: refused before the table starts */
static void
test_mib_below_block(void **state)
{
	(void)state;
	bn_expect(bn_run(6, "--only", "tier", "--bs", "64m", "--mib", "16"),
		  "--mib 16 is below one block of --bs 65536 KiB: give --mib 64 or more");
	bn_expect(bn_run(6, "--only", "tier", "--bs", "256k,3m", "--mib", "2"),
		  "--mib 2 is below one block of --bs 3072 KiB: give --mib 3 or more");
}

static void
test_missing_paths(void **state)
{
	(void)state;
	bn_expect(bn_run(2, "--dir", "/nonexistent"), "--dir /nonexistent: No such file");
	bn_expect(bn_run(4, "--only", "codec", "--model", "/nonexistent"),
		  "cannot read /nonexistent");
	bn_expect(bn_run(4, "--only", "tier", "--dir", "/etc/hostname"), "not a directory");
}

/* The hybrid park/resume (issue 17 B) moves what its layout holds, all of it through NVMe:
 * FULL blocks of 8 layers x 64 tokens x 8 KV heads x 128 x K+V x 2 bytes, STATE slots of 24
 * layers x (conv 8192 x 3 + recurrent 32 x 128 x 128) x 2 bytes (Qwen3-Next's per layer),
 * 130 tokens = 3 blocks per session, and at most the 2 live state slots per session. */
static void
test_hybrid_park_resume(void **state)
{
	const char *d = getenv("KVT_TEST_TMP");
	struct nb_hybrid_opts o = { .dir = d ? d : "/tmp", .sessions = 2, .tokens = 130,
				    .host_blocks = 16, .workers = 1 };
	struct nb_pr_result r;
	const double full = 8.0 * 64 * 8 * 128 * 2 * 2, st = 24.0 * (8192 * 3 + 32 * 128 * 128) * 2;

	(void)state;
	if (kvtb_park_resume_hybrid(&o, &r))
		fail_msg("hybrid park/resume: %s", kvtr_last_error());
	assert_true((double)r.full_block_bytes == full);
	assert_true((double)r.state_block_bytes == st);
	assert_int_equal(r.full_blocks, 2 * 3);
	assert_true(r.state_blocks >= 2 && r.state_blocks <= 2 * 2);
	assert_true(r.bytes == 6 * full + (double)r.state_blocks * st);
	assert_true(r.nvme_w == r.bytes); /* every block parked reached NVMe */
	assert_true(r.nvme_r == r.bytes); /* and every one came back from there */
	assert_true(r.tp > 0 && r.tr > 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bad_values_named),
		cmocka_unit_test(test_unknown_option),
		cmocka_unit_test(test_missing_paths),
		cmocka_unit_test(test_decode_unknown_option),
		cmocka_unit_test(test_decode_progress),
		cmocka_unit_test(test_mib_below_block),
		cmocka_unit_test(test_hybrid_park_resume),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
