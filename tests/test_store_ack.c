/* SPDX-License-Identifier: MIT */
/*
 * tests/test_store_ack.c - a journal tail that was acknowledged durable and is then gone is
 * damage, not a torn tail (hardening 11): the store's superblock records the journal length
 * known durable; at open a journal cut below it, zeroed in it, or missing is reported (warning),
 * kept as kvtier.journal.damaged, and what verifies is restored. A normal restart, clean or after
 * kill -9, reports nothing.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvtier.h"
#include "support/kvt_test.h"

static char ack_log[2048]; /* warnings logged by the engine */

static void
ack_log_fn(void *arg, int level, const char *msg)
{
	(void)arg;
	if (level <= KVT_LOG_WARN && strlen(ack_log) + strlen(msg) + 2 < sizeof ack_log) {
		strcat(ack_log, msg);
		strcat(ack_log, "\n");
	}
}

static struct kvt_engine *
ack_engine(const char *dir)
{
	struct kvt_engine_opts o;

	tsup_store_opts(&o, dir, 64ull * 8192);
	o.log = ack_log_fn;
	return tsup_create(&o, NULL);
}

/* Publish sessions 1..3 (each parked and drained: acknowledged durable), then end the engine:
 * destroyed, or (@crash) the process dies without destroying it. */
static void
ack_publish(const char *dir, bool crash)
{
	int status;
	pid_t pid;

	fflush(NULL);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct kvt_engine *e = ack_engine(dir);

		for (uint64_t k = 1; k <= 3; k++) {
			kvt_seq_id s = tsup_session_written(e, k, (uint32_t)k, 6);

			if (kvt_seq_park(e, s, KVT_TIER_NVME) != 0 || kvt_engine_drain(e) != 0 ||
			    kvt_engine_poll(e, 0) < 0)
				_exit(2);
		}
		if (!crash)
			kvt_engine_destroy(e);
		_exit(0);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void
ack_path(const char *dir, const char *name, char *out, size_t n)
{
	snprintf(out, n, "%s/%s", dir, name);
}

/* Open the store, expecting @want restorable sessions among 1..3 and (@warn) a warning. */
static void
ack_check(const char *dir, unsigned want, bool warn)
{
	struct kvt_engine *e;
	unsigned n = 0;
	kvt_seq_id s;

	ack_log[0] = 0;
	e = ack_engine(dir);
	if (warn)
		assert_non_null(strstr(ack_log, "acknowledged durable"));
	else if (ack_log[0])
		fail_msg("unexpected warning: %s", ack_log);
	for (uint64_t k = 1; k <= 3; k++) {
		int rc = kvt_seq_restore(e, k, NULL, &s);

		if (rc == -ENOENT)
			continue;
		assert_int_equal(rc, 0);
		assert_int_equal(kvt_seq_resume(e, s), 0);
		assert_int_equal(tsup_verify(e, s, (uint32_t)k), 0);
		assert_int_equal(kvt_seq_detach(e, s), 0);
		n++;
	}
	assert_int_equal(n, want);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
}

enum ack_damage { ACK_CUT, ACK_ZERO, ACK_MISSING };

static void
ack_case(bool crash, int damage)
{
	char *dir = tsup_mkdtemp(), path[600], kept[600];
	struct stat sb;
	int fd;

	ack_publish(dir, crash);
	ack_path(dir, "kvtier.journal", path, sizeof path);
	ack_path(dir, "kvtier.journal.damaged", kept, sizeof kept);
	assert_int_equal(stat(path, &sb), 0);
	assert_true(sb.st_size > 128);
	if (damage == ACK_CUT) {
		/* cut inside the last PUT: a torn tail, were it not acknowledged */
		assert_int_equal(truncate(path, sb.st_size - 8), 0);
	} else if (damage == ACK_ZERO) {
		static const uint8_t zero[64];

		fd = open(path, O_WRONLY);
		assert_true(fd >= 0);
		assert_int_equal(pwrite(fd, zero, sizeof zero, sb.st_size - 64), 64);
		close(fd);
	} else {
		assert_int_equal(unlink(path), 0);
	}
	/* sessions 1 and 2 verify (none without a journal); 3 is gone, and that is said */
	ack_check(dir, damage == ACK_MISSING ? 0 : 2, true);
	if (damage != ACK_MISSING) {
		assert_int_equal(stat(kept, &sb), 0); /* the journal as it was, kept */
		assert_int_equal(unlink(kept), 0);
	}
	/* the compacted journal is acknowledged now: no more warning */
	ack_check(dir, damage == ACK_MISSING ? 0 : 2, false);
	tsup_rmdir(dir);
}

/* Two damage events in a row keep two copies: the first one's moves to .damaged.1 when the
 * second is kept as .damaged (the second copy used to replace the first, losing its evidence). */
static void
test_damage_twice_keeps_both(void **state)
{
	char *dir = tsup_mkdtemp(), path[600], kept[600], kept1[600];
	struct stat sb, sb0, sb1;

	(void)state;
	ack_publish(dir, true);
	ack_path(dir, "kvtier.journal", path, sizeof path);
	ack_path(dir, "kvtier.journal.damaged", kept, sizeof kept);
	ack_path(dir, "kvtier.journal.damaged.1", kept1, sizeof kept1);
	assert_int_equal(stat(path, &sb), 0);
	assert_int_equal(truncate(path, sb.st_size - 8), 0); /* session 3 cut */
	ack_check(dir, 2, true);
	assert_int_equal(stat(kept, &sb0), 0);
	assert_int_equal(stat(path, &sb), 0);
	assert_int_equal(truncate(path, sb.st_size - 8), 0); /* the compacted one cut: 2 gone */
	ack_check(dir, 1, true);
	assert_int_equal(stat(kept1, &sb1), 0);   /* the first damage's copy, moved */
	assert_int_equal(sb1.st_size, sb0.st_size);
	assert_int_equal(stat(kept, &sb), 0);     /* the second's */
	assert_int_not_equal(sb.st_ino, sb1.st_ino);
	assert_int_equal(unlink(kept), 0);
	assert_int_equal(unlink(kept1), 0);
	tsup_rmdir(dir);
}

/* Nothing damaged: restarts (clean and after kill -9) warn about nothing, keep nothing. */
static void
test_normal_restart_silent(void **state)
{
	char *dir = tsup_mkdtemp(), kept[600];
	struct stat sb;

	(void)state;
	ack_publish(dir, false);
	ack_check(dir, 3, false);
	ack_check(dir, 3, false);
	ack_path(dir, "kvtier.journal.damaged", kept, sizeof kept);
	assert_int_not_equal(stat(kept, &sb), 0);
	tsup_rmdir(dir);
	dir = tsup_mkdtemp();
	ack_publish(dir, true);
	ack_check(dir, 3, false);
	ack_check(dir, 3, false);
	ack_path(dir, "kvtier.journal.damaged", kept, sizeof kept);
	assert_int_not_equal(stat(kept, &sb), 0);
	tsup_rmdir(dir);
}

static void
test_cut_after_clean_close(void **state)
{
	(void)state;
	ack_case(false, ACK_CUT);
}

static void
test_cut_after_kill(void **state)
{
	(void)state;
	ack_case(true, ACK_CUT);
}

static void
test_zeroed_tail(void **state)
{
	(void)state;
	ack_case(false, ACK_ZERO);
	ack_case(true, ACK_ZERO);
}

static void
test_journal_missing(void **state)
{
	(void)state;
	ack_case(false, ACK_MISSING);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_normal_restart_silent),
		cmocka_unit_test(test_damage_twice_keeps_both),
		cmocka_unit_test(test_cut_after_clean_close),
		cmocka_unit_test(test_cut_after_kill),
		cmocka_unit_test(test_zeroed_tail),
		cmocka_unit_test(test_journal_missing),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
