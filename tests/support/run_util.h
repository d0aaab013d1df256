/* SPDX-License-Identifier: MIT */
/*
 * tests/support/run_util.h - small helpers of the kvtier-run tests (test_run_model.c,
 * test_e2e.c): where the shared data and the kvtier-run binary are, files, running the binary
 * with its output captured. Header-only (static inline) so that test binaries that do not use
 * it are unaffected. Include after <cmocka.h>.
 */
#ifndef KVT_TEST_RUN_UTIL_H
#define KVT_TEST_RUN_UTIL_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tools/kvtier-run/runner.h"

/* 1 when the two runs emitted different tokens somewhere. */
static inline int
rutil_tokens_differ(const struct kvtr_run_result *a, const struct kvtr_run_result *b)
{
	for (size_t i = 0; i < (size_t)a->sessions * a->turns; i++)
		if (a->out[i].n_tokens != b->out[i].n_tokens ||
		    memcmp(a->out[i].tokens, b->out[i].tokens, a->out[i].n_tokens * 4) != 0)
			return 1;
	return 0;
}

/* ../shared/data: $KVT_SHARED_DATA (set by ctest), else relative to this source tree. */
static inline const char *
rutil_data_dir(void)
{
	static char buf[1024];
	const char *env = getenv("KVT_SHARED_DATA");
	const char *slash;

	if (env && *env)
		return env;
	slash = strrchr(__FILE__, '/');
	/* __FILE__ is <src>/tests/support/run_util.h */
	snprintf(buf, sizeof buf, "%.*s/../../../shared/data",
		 (int)(slash ? slash - __FILE__ : 1), slash ? __FILE__ : ".");
	return buf;
}

/* Path of a file in the shared data's models/ folder, or NULL if it is not there. */
static inline const char *
rutil_model_file(const char *name)
{
	static char buf[4][2200];
	static int next;
	char *p = buf[next++ % 4];

	snprintf(p, sizeof buf[0], "%.1024s/models/%.1024s", rutil_data_dir(), name);
	return access(p, R_OK) == 0 ? p : NULL;
}

/* The kvtier-run binary: $KVT_RUN (set by ctest), else next to the test binary; NULL if none. */
static inline const char *
rutil_run_binary(void)
{
	static char buf[1024];
	const char *env = getenv("KVT_RUN");
	ssize_t n;
	char *slash;

	if (env && *env)
		return access(env, X_OK) == 0 ? env : NULL;
	n = readlink("/proc/self/exe", buf, sizeof buf - 16);
	if (n <= 0)
		return NULL;
	buf[n] = '\0';
	slash = strrchr(buf, '/');
	if (!slash)
		return NULL;
	strcpy(slash + 1, "kvtier-run");
	return access(buf, X_OK) == 0 ? buf : NULL;
}

static inline void
rutil_write_file(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");

	assert_non_null(f);
	if (len)
		assert_int_equal(fwrite(data, 1, len, f), len);
	assert_int_equal(fclose(f), 0);
}

/* Whole file, NUL-terminated; *len gets its size (may be NULL). Free with free(). */
static inline char *
rutil_read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long sz;

	assert_non_null(f);
	assert_int_equal(fseek(f, 0, SEEK_END), 0);
	sz = ftell(f);
	assert_true(sz >= 0);
	assert_int_equal(fseek(f, 0, SEEK_SET), 0);
	buf = malloc((size_t)sz + 1);
	assert_non_null(buf);
	if (sz)
		assert_int_equal(fread(buf, 1, (size_t)sz, f), (size_t)sz);
	buf[sz] = '\0';
	fclose(f);
	if (len)
		*len = (size_t)sz;
	return buf;
}

/*
 * Run the kvtier-run binary with @args (already shell-quoted where needed), stdout and stderr
 * captured into files under @dir; returns the exit status (or -1 if it did not exit normally)
 * and the outputs (free them).
 */
static inline int
rutil_run(const char *dir, const char *args, char **out, char **err)
{
	char cmd[16384], o[1200], e[1200];
	const char *bin = rutil_run_binary();
	int st;

	assert_non_null(bin);
	snprintf(o, sizeof o, "%.1024s/stdout.txt", dir);
	snprintf(e, sizeof e, "%.1024s/stderr.txt", dir);
	snprintf(cmd, sizeof cmd, "'%.1024s' %.8192s >'%s' 2>'%s'", bin, args, o, e);
	st = system(cmd);
	*out = rutil_read_file(o, NULL);
	*err = rutil_read_file(e, NULL);
	unlink(o);
	unlink(e);
	if (st == -1 || !WIFEXITED(st))
		return -1;
	return WEXITSTATUS(st);
}

/*
 * Like rutil_run(), but stdout goes to @out_path as given (e.g. "/dev/full"), not captured;
 * returns the exit status (or -1) and stderr (free it).
 */
static inline int
rutil_run_stdout_to(const char *dir, const char *args, const char *out_path, char **err)
{
	char cmd[16384], e[1200];
	const char *bin = rutil_run_binary();
	int st;

	assert_non_null(bin);
	snprintf(e, sizeof e, "%.1024s/stderr.txt", dir);
	snprintf(cmd, sizeof cmd, "'%.1024s' %.8192s >'%.1024s' 2>'%s'", bin, args, out_path, e);
	st = system(cmd);
	*err = rutil_read_file(e, NULL);
	unlink(e);
	if (st == -1 || !WIFEXITED(st))
		return -1;
	return WEXITSTATUS(st);
}

#endif /* KVT_TEST_RUN_UTIL_H */
