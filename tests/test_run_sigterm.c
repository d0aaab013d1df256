/* SPDX-License-Identifier: MIT */
/*
 * tests/test_run_sigterm.c - hardening 8: kvtier-run killed by SIGTERM (or SIGKILL) while it
 * runs in its default temporary NVMe directory ($TMPDIR/kvtier-run.XXXXXX) leaves nothing under
 * TMPDIR: the engine's slot file has no name and the empty directory is removed right after the
 * engine is created. Exits 77 (skipped) without the kvtier-run binary or ../shared/data.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "support/kvt_test.h"
#include "support/run_util.h"

/* Entries of @dir (not . and ..). */
static int
entries(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;

	assert_non_null(d);
	while ((de = readdir(d)))
		n += strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0;
	closedir(d);
	return n;
}

/* Whether process @pid has a descriptor open on a file under @dir: its engine's slot file. */
static bool
has_file_under(pid_t pid, const char *dir)
{
	char fds[64], link[PATH_MAX + 64], target[PATH_MAX];
	struct dirent *de;
	DIR *d;
	bool found = false;

	snprintf(fds, sizeof fds, "/proc/%ld/fd", (long)pid);
	d = opendir(fds);
	while (d && !found && (de = readdir(d))) {
		ssize_t n;

		snprintf(link, sizeof link, "%s/%s", fds, de->d_name);
		n = readlink(link, target, sizeof target - 1);
		if (n <= 0)
			continue;
		target[n] = '\0';
		found = strncmp(target, dir, strlen(dir)) == 0 && strstr(target, "/kvtier-run.");
	}
	if (d)
		closedir(d);
	return found;
}

static void
kill_case(int sig)
{
	const char *bin = rutil_run_binary(), *model = rutil_model_file("stories260K.bin");
	const char *tok = rutil_model_file("tok512.bin");
	struct timespec ts = { 0, 2 * 1000 * 1000 };
	char *tmp;
	int status, polls;
	pid_t pid;

	if (!bin || !model || !tok) {
		print_message("SKIPPED: kvtier-run binary or ../shared/data not found\n");
		skip();
	}
	tmp = tsup_mkdtemp();
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY);

		setenv("TMPDIR", tmp, 1);
		dup2(null, 1);
		dup2(null, 2);
		/* slow enough (emulated device delay) to be caught running */
		execl(bin, bin, "--model", model, "--tokenizer", tok, "--steps", "256",
		      "--sessions", "8", "--turns", "8", "--emu-delay-us", "2000", (char *)NULL);
		_exit(127);
	}
	/* until its engine exists (its slot file open) and its directory is gone (removed right
	 * after the create: a kill inside the create may still leave it, empty); bounded, not
	 * timed: 10000 polls */
	for (polls = 0; polls < 10000 && !(has_file_under(pid, tmp) && entries(tmp) == 0);
	     polls++) {
		if (waitpid(pid, &status, WNOHANG) == pid) {
			tsup_rmdir(tmp);
			fail_msg("kvtier-run exited (status %#x) before it was seen running",
				 status);
		}
		nanosleep(&ts, NULL);
	}
	assert_int_equal(kill(pid, sig), 0);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(polls < 10000);
	assert_true(WIFSIGNALED(status) && WTERMSIG(status) == sig);
	assert_int_equal(entries(tmp), 0); /* no kvtier-run.XXXXXX, no slot file */
	tsup_rmdir(tmp);
}

static void
test_sigterm_leaves_nothing(void **state)
{
	(void)state;
	kill_case(SIGTERM);
}

static void
test_sigkill_leaves_nothing(void **state)
{
	(void)state;
	kill_case(SIGKILL);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sigterm_leaves_nothing),
		cmocka_unit_test(test_sigkill_leaves_nothing),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
