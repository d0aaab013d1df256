/* SPDX-License-Identifier: MIT */
/*
 * tests/test_run_remote.c - kvtier-run's sessions that move between processes (issue 18, item
 * 3/4): two kvtier-run processes sharing one redis-server (started here, tests/support/
 * redis_server.c); the first runs turn 1 of N sessions and publishes them (--remote-save 1),
 * the second, a fresh process with another NVMe dir, reopens them (--remote-resume 1) and
 * runs turn 2; together they print exactly what one process running both turns prints.
 * stories260K from ../shared/data (skipped visibly without it); 77 without redis-server.
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
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "support/redis_server.h"
#include "support/run_util.h"

static struct tsrv srv;
static char tmp[512];

static int
cmp_lines(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The lines of @text sorted, joined again (free it). */
static char *
sorted(const char *text)
{
	char *copy = strdup(text), *lines[256], *save = NULL, *out;
	size_t n = 0, len = 0;

	assert_non_null(copy);
	for (char *l = strtok_r(copy, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
		assert_true(n < 256);
		lines[n++] = l;
		len += strlen(l) + 1;
	}
	qsort(lines, n, sizeof *lines, cmp_lines);
	out = calloc(1, len + 1);
	assert_non_null(out);
	for (size_t i = 0; i < n; i++) {
		strcat(out, lines[i]);
		strcat(out, "\n");
	}
	free(copy);
	return out;
}

static void
test_two_processes(void **state)
{
	const char *model = rutil_model_file("stories260K.bin");
	const char *tok = rutil_model_file("tok512.bin");
	char args[4096], a1[5200], a2[5200], d1[600], d2[600], line[64];
	char *one, *p1, *p2, *err, *both, *want;

	(void)state;
	if (!model || !tok) {
		print_message("SKIPPED: ../shared/data (stories260K.bin, tok512.bin) not found\n");
		skip();
	}
	snprintf(args, sizeof args, "--model '%s' --tokenizer '%s' --temperature 0 --sessions 3 "
		 "--turns 2 --steps 48 --tokens-per-block 8", model, tok);
	snprintf(d1, sizeof d1, "%s/n1", tmp);
	snprintf(d2, sizeof d2, "%s/n2", tmp);
	assert_int_equal(mkdir(d1, 0700), 0);
	assert_int_equal(mkdir(d2, 0700), 0);
	/* one process, both turns */
	assert_int_equal(rutil_run(tmp, args, &one, &err), 0);
	free(err);
	/* the second process alone, with nothing published: fails clearly, prints nothing */
	snprintf(a2, sizeof a2, "%s --nvme-dir '%s' --remote 127.0.0.1:%u --remote-resume 1", args,
		 d2, srv.port);
	assert_int_equal(rutil_run(tmp, a2, &p2, &err), 1);
	assert_non_null(strstr(err, "kvt_seq_restore_remote"));
	assert_string_equal(p2, "");
	free(p2);
	free(err);
	/* turn 1 here, published ... */
	snprintf(a1, sizeof a1, "%s --nvme-dir '%s' --remote 127.0.0.1:%u --remote-save 1", args,
		 d1, srv.port);
	assert_int_equal(rutil_run(tmp, a1, &p1, &err), 0);
	free(err);
	assert_null(strstr(p1, "turn 2]"));
	assert_non_null(strstr(p1, "[session 3 turn 1]"));
	/* ... turn 2 in a fresh process */
	assert_int_equal(rutil_run(tmp, a2, &p2, &err), 0);
	free(err);
	assert_null(strstr(p2, "turn 1]"));
	assert_non_null(strstr(p2, "[session 3 turn 2]"));
	both = malloc(strlen(p1) + strlen(p2) + 1);
	assert_non_null(both);
	strcpy(both, p1);
	strcat(both, p2);
	free(p1);
	free(p2);
	p1 = sorted(both);
	want = sorted(one);
	assert_string_equal(p1, want);
	free(p1);
	free(want);
	free(both);
	free(one);
	/* the session values are on the server (3 sessions) */
	assert_int_equal(tsrv_cli(&srv, line, sizeof line, "EVAL \"return #redis.call('KEYS', "
				  "'kvt1:*:s:*')\" 0"), 0);
	assert_string_equal(line, "3");
	rmdir(d1);
	rmdir(d2);
}

/* A bad --remote value is a usage error (exit 2); a bad combination fails the run (exit 1)
 * before any session runs, with a message. */
static void
test_flags(void **state)
{
	char *out, *err, args[256];

	(void)state;
	assert_int_equal(rutil_run(tmp, "--turns 2 --remote-resume 1 --temperature 0", &out, &err),
			 1);
	assert_non_null(strstr(err, "--remote"));
	free(out);
	free(err);
	assert_int_equal(rutil_run(tmp, "--turns 2 --remote 127.0.0.1 --remote-save 1", &out,
				   &err), 2);
	assert_non_null(strstr(err, "HOST:PORT"));
	free(out);
	free(err);
	snprintf(args, sizeof args, "--turns 2 --remote 127.0.0.1:%u --remote-resume 1", srv.port);
	assert_int_equal(rutil_run(tmp, args, &out, &err), 1);
	assert_non_null(strstr(err, "--temperature 0"));
	free(out);
	free(err);
}

static int
group_setup(void **state)
{
	const char *base = getenv("KVT_TEST_TMP");

	(void)state;
	if (base)
		mkdir(base, 0700);
	snprintf(tmp, sizeof tmp, "%s/run_remote-XXXXXX", base && *base ? base : "/tmp");
	if (!mkdtemp(tmp))
		return -1;
	return tsrv_start(&srv, 0, "");
}

static int
group_teardown(void **state)
{
	(void)state;
	tsrv_kill(&srv);
	rmdir(tmp);
	return 0;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_two_processes),
		cmocka_unit_test(test_flags),
	};

	signal(SIGPIPE, SIG_IGN);
	if (!tsrv_available()) {
		printf("test_run_remote: redis-server or redis-cli not on PATH: skipped\n");
		return 77;
	}
	if (!rutil_run_binary()) {
		printf("test_run_remote: kvtier-run not built: skipped\n");
		return 77;
	}
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
