/* SPDX-License-Identifier: MIT */
/*
 * tests/test_nvme.c - the NVME tier (tiers/tier_nvme.c) on a real file under $KVT_TEST_TMP (or
 * /tmp): O_DIRECT + io_uring round trips, verification, injected faults and short IO through the
 * completion hook, and open's failure paths.
 *
 * This binary interposes open(), fallocate() and statx() (defined below; the executable's
 * definitions win over libc's for the statically linked library) so that a filesystem refusing
 * O_DIRECT or needing a larger alignment, a full disk and a filesystem without fallocate can be
 * simulated; they pass through to the real system calls unless a test arms them.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/kvtier.h"
#include "tiers/tier_nvme.h"
#include "support/kvt_test.h"

#define BLOCK 10000u /* slot = 16384: the header page, then the block and padding (3 pages) */
#define SLOT 16384u
#define SUPER KVT_FMT_DATA_OFF /* the superblock (and room to 1 MiB) before slot 0 */
#define HDR 4096u    /* payload offset in a slot: after the header page */
#define NSLOTS 48u
#define QD 4u

/* ---- interposed system calls ---------------------------------------------------------------- */

static int fake_odirect_einval; /* open(O_DIRECT) creates the file, then fails EINVAL (tmpfs) */
static int fake_fallocate_errno; /* fallocate fails with this errno when non-zero */
static int fake_no_tmpfile;      /* open(O_TMPFILE) fails EOPNOTSUPP (a filesystem without) */
static int fake_dio_align;       /* statx reports this O_DIRECT offset alignment when >= 0 */

int
open(const char *path, int flags, ...)
{
	unsigned mode = 0;
	va_list ap;
	long fd;

	if (flags & O_CREAT) {
		va_start(ap, flags);
		mode = va_arg(ap, unsigned);
		va_end(ap);
	}
	if (fake_no_tmpfile && (flags & O_TMPFILE) == O_TMPFILE) {
		errno = EOPNOTSUPP;
		return -1;
	}
	if (fake_odirect_einval && (flags & O_DIRECT)) {
		fd = syscall(SYS_openat, AT_FDCWD, path, flags & ~O_DIRECT, mode);
		if (fd >= 0)
			close((int)fd);
		errno = EINVAL;
		return -1;
	}
	return (int)syscall(SYS_openat, AT_FDCWD, path, flags, mode);
}

int
fallocate(int fd, int mode, off_t off, off_t len)
{
	if (fake_fallocate_errno) {
		errno = fake_fallocate_errno;
		return -1;
	}
	return (int)syscall(SYS_fallocate, fd, mode, off, len);
}

int
statx(int dirfd, const char *path, int flags, unsigned mask, struct statx *stx)
{
	long r = syscall(SYS_statx, dirfd, path, flags, mask, stx);

	if (r == 0 && fake_dio_align >= 0 && (mask & STATX_DIOALIGN)) {
		stx->stx_mask |= STATX_DIOALIGN;
		stx->stx_dio_offset_align = (uint32_t)fake_dio_align;
		stx->stx_dio_mem_align = (uint32_t)fake_dio_align;
	}
	return (int)r;
}

/* ---- fixture -------------------------------------------------------------------------------- */

struct fx {
	char dir[PATH_MAX]; /* fresh temporary directory */
};

static int
fx_setup(void **state)
{
	const char *base = getenv("KVT_TEST_TMP");
	struct fx *f = calloc(1, sizeof *f);

	if (!f)
		return -1;
	if (!base || !*base)
		base = "/tmp";
	snprintf(f->dir, sizeof f->dir, "%s/nvme-XXXXXX", base);
	if (!mkdtemp(f->dir)) {
		free(f);
		return -1;
	}
	fake_odirect_einval = 0;
	fake_no_tmpfile = 0;
	fake_fallocate_errno = 0;
	fake_dio_align = -1;
	*state = f;
	return 0;
}

/* The directory must be empty again: every tier removed its file. */
static int
fx_teardown(void **state)
{
	struct fx *f = *state;
	int r = rmdir(f->dir);

	if (r != 0)
		fprintf(stderr, "leftover files in %s\n", f->dir);
	free(f);
	return r;
}

static struct kvt_nvme_opts
fx_opts(const struct fx *f, const struct kvt_nvme_fault_hooks *hooks)
{
	struct kvt_nvme_opts o = {
		.dir = f->dir,
		.capacity_bytes = (uint64_t)NSLOTS * SLOT + SLOT - 1, /* rounded down */
		.block_bytes = BLOCK,
		.queue_depth = QD,
		.hooks = hooks,
	};
	return o;
}

static struct kvt_nvme *
fx_open(const struct fx *f, const struct kvt_nvme_fault_hooks *hooks)
{
	struct kvt_nvme_opts o = fx_opts(f, hooks);
	struct kvt_nvme *n = NULL;
	char err[256];

	assert_int_equal(kvt_nvme_open(&o, &n, err, sizeof err), 0);
	assert_non_null(n);
	assert_int_equal(kvt_nvme_n_slots(n), NSLOTS);
	assert_int_equal(kvt_nvme_slot_bytes(n), SLOT);
	assert_int_equal(kvt_nvme_free_qd(n), QD);
	return n;
}

static void
fill_random(uint8_t *p, size_t len, uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;

	for (size_t i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (uint8_t)(x >> 24);
	}
}

/* ---- IO pump: submit a list, reaping whenever the queue is full ------------------------------ */

struct io {
	uint32_t slot;  /* slot */
	uint64_t key;   /* key written / expected */
	bool write;     /* write or read */
	void *buf;      /* src or dst, BLOCK bytes */
};

#define NO_RES INT_MIN

static size_t
pump_reap(struct kvt_nvme *n, const struct io *ios, size_t count, int *res)
{
	struct kvt_nvme_cqe c[3];
	int got = kvt_nvme_reap(n, c, 3, true);

	assert_true(got > 0);
	for (int i = 0; i < got; i++) {
		uint64_t idx = c[i].user_data ^ 0xabcd000000000000ull;

		assert_true(idx < count);
		assert_int_equal(res[idx], NO_RES); /* exactly one completion per IO */
		assert_int_equal(c[i].slot, ios[idx].slot);
		assert_int_equal(c[i].is_write, ios[idx].write);
		res[idx] = c[i].res;
	}
	return (size_t)got;
}

/* Run @ios; res[i] receives IO i's completion result. Returns how often submit said -EAGAIN. */
static unsigned
pump(struct kvt_nvme *n, const struct io *ios, size_t count, int *res)
{
	size_t seen = 0;
	unsigned eagain = 0;
	int r;

	for (size_t i = 0; i < count; i++)
		res[i] = NO_RES;
	for (size_t i = 0; i < count; i++) {
		uint64_t ud = i ^ 0xabcd000000000000ull; /* high bits survive the round trip */

		for (;;) {
			if (ios[i].write)
				r = kvt_nvme_submit_write(n, ios[i].slot, ios[i].buf, ios[i].key, ud);
			else
				r = kvt_nvme_submit_read(n, ios[i].slot, ios[i].buf, ios[i].key, ud);
			if (r == 0)
				break;
			assert_int_equal(r, -EAGAIN);
			assert_int_equal(kvt_nvme_free_qd(n), 0);
			eagain++;
			seen += pump_reap(n, ios, count, res);
		}
	}
	while (seen < count)
		seen += pump_reap(n, ios, count, res);
	assert_int_equal(kvt_nvme_inflight(n), 0);
	assert_int_equal(kvt_nvme_free_qd(n), QD);
	return eagain;
}

/* Write @pattern-seeded random blocks to slots [0, k), keys 1000 + slot; all must succeed. */
static void
write_slots(struct kvt_nvme *n, uint32_t k, uint8_t *bufs)
{
	struct io ios[NSLOTS];
	int res[NSLOTS];

	for (uint32_t i = 0; i < k; i++) {
		fill_random(bufs + (size_t)i * BLOCK, BLOCK, i + 1);
		ios[i] = (struct io){ .slot = i, .key = 1000 + i, .write = true,
				      .buf = bufs + (size_t)i * BLOCK };
	}
	pump(n, ios, k, res);
	for (uint32_t i = 0; i < k; i++)
		assert_int_equal(res[i], 0);
}

/* Read one slot through the pump; returns the completion result. */
static int
read_one(struct kvt_nvme *n, uint32_t slot, uint64_t key, void *dst)
{
	struct io io = { .slot = slot, .key = key, .write = false, .buf = dst };
	int res;

	pump(n, &io, 1, &res);
	return res;
}

/* Read one slot with the raw API (for tiers whose free queue depth shrank). */
static int
read_one_nopump(struct kvt_nvme *n, uint32_t slot, uint64_t key, void *dst)
{
	struct kvt_nvme_cqe c;

	assert_int_equal(kvt_nvme_submit_read(n, slot, dst, key, 77), 0);
	assert_int_equal(kvt_nvme_reap(n, &c, 1, true), 1);
	assert_int_equal(c.user_data, 77);
	return c.res;
}

/* ---- round trips ---------------------------------------------------------------------------- */

static void
test_round_trip(void **state)
{
	struct fx *f = *state;
	struct kvt_nvme *n = fx_open(f, NULL);
	uint8_t *src = malloc((size_t)NSLOTS * BLOCK), *dst = malloc((size_t)NSLOTS * BLOCK);
	struct io ios[NSLOTS];
	int res[NSLOTS];

	assert_non_null(src);
	assert_non_null(dst);
	write_slots(n, NSLOTS, src);
	/* read back in reverse order, through a queue of 4: -EAGAIN/reap cycles happen */
	memset(dst, 0x5a, (size_t)NSLOTS * BLOCK);
	for (uint32_t i = 0; i < NSLOTS; i++)
		ios[i] = (struct io){ .slot = NSLOTS - 1 - i, .key = 1000 + NSLOTS - 1 - i,
				      .buf = dst + (size_t)(NSLOTS - 1 - i) * BLOCK };
	assert_true(pump(n, ios, NSLOTS, res) > 0);
	for (uint32_t i = 0; i < NSLOTS; i++)
		assert_int_equal(res[i], 0);
	assert_memory_equal(src, dst, (size_t)NSLOTS * BLOCK);
	/* overwrite one slot with new data and key; the old key no longer reads */
	fill_random(src, BLOCK, 777);
	ios[0] = (struct io){ .slot = 0, .key = 42, .write = true, .buf = src };
	pump(n, ios, 1, res);
	assert_int_equal(res[0], 0);
	assert_int_equal(read_one(n, 0, 1000, dst), KVT_ECORRUPT);
	assert_int_equal(read_one(n, 0, 42, dst), 0);
	assert_memory_equal(src, dst, BLOCK);
	kvt_nvme_close(n);
	free(src);
	free(dst);
}

/* Entries of @dir whose name starts with "kvtier-". */
static int
dir_slot_files(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;

	assert_non_null(d);
	while ((de = readdir(d)))
		n += strncmp(de->d_name, "kvtier-", 7) == 0;
	closedir(d);
	return n;
}

static void
test_file_mode_size_and_removal(void **state)
{
	struct fx *f = *state;
	struct kvt_nvme *n = fx_open(f, NULL);
	struct kvt_nvme *n2 = fx_open(f, NULL);
	struct stat st, st2;

	/* the private file has no name from its creation on (hardening 8): reached through
	 * /proc/self/fd while the tier is open */
	assert_int_equal(dir_slot_files(f->dir), 0);
	assert_non_null(strstr(kvt_nvme_path(n), "/proc/self/fd/"));
	assert_int_equal(stat(kvt_nvme_path(n), &st), 0);
	assert_int_equal(stat(kvt_nvme_path(n2), &st2), 0);
	assert_true(st.st_ino != st2.st_ino); /* two tiers, two files */
	assert_true(S_ISREG(st.st_mode));
	assert_int_equal(st.st_nlink, 0);
	assert_int_equal(st.st_mode & 07777, 0600);
	assert_int_equal(st.st_size, (off_t)(SUPER + NSLOTS * SLOT));
	assert_true((uint64_t)st.st_blocks * 512 >= (uint64_t)NSLOTS * SLOT); /* reserved */
	kvt_nvme_close(n);
	kvt_nvme_close(n2);
	assert_int_equal(dir_slot_files(f->dir), 0);
	/* without O_TMPFILE: a named file, unlinked as soon as it is created */
	fake_no_tmpfile = 1;
	n = fx_open(f, NULL);
	assert_int_equal(dir_slot_files(f->dir), 0);
	assert_int_equal(stat(kvt_nvme_path(n), &st), 0);
	assert_int_equal(st.st_nlink, 0);
	assert_int_equal(st.st_mode & 07777, 0600);
	kvt_nvme_close(n);
	assert_int_equal(dir_slot_files(f->dir), 0);
}

/* Remove the "kvtier-" entries of @dir. */
static void
rm_slot_files(const char *dir)
{
	char path[PATH_MAX + 300];
	DIR *d = opendir(dir);
	struct dirent *de;

	while (d && (de = readdir(d)))
		if (strncmp(de->d_name, "kvtier-", 7) == 0) {
			snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
			unlink(path);
		}
	if (d)
		closedir(d);
}

static int kill_log_n;
static char kill_log[512];

static void
kill_log_fn(void *arg, int level, const char *msg)
{
	(void)arg;
	if (level == KVT_LOG_WARN && strstr(msg, "slot files of dead processes")) {
		kill_log_n++;
		snprintf(kill_log, sizeof kill_log, "%s", msg);
	}
}

/*
 * Hardening 8: an engine's private slot file does not outlive a SIGKILL of its process (it has
 * no name), and a stale "kvtier-<pid>-<n>.slots" of a dead process (an older kvtier's, or a
 * crash inside the create) is removed at the next create, with a warning; files of live
 * processes and other names stay.
 */
static void
test_slot_file_gone_after_sigkill(void **state)
{
	struct fx *f = *state;
	struct kvt_engine_opts o;
	struct kvt_engine *e = NULL;
	char path[PATH_MAX + 64], live[PATH_MAX + 64], other[PATH_MAX + 64], c;
	int pfd[2], fd, named, left;
	ssize_t got;
	pid_t pid;

	tsup_opts_init(&o);
	o.hbm_bytes = 4 * tsup_block_bytes();
	o.host_bytes = 4 * tsup_block_bytes();
	o.nvme_dir = f->dir;
	o.nvme_bytes = 64ull << 20;
	assert_int_equal(pipe(pfd), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(pfd[0]);
		if (kvt_engine_create(&o, &e) != 0) {
			fprintf(stderr, "child: %s\n", kvt_last_error_message());
			_exit(1);
		}
		(void)!write(pfd[1], "r", 1);
		for (;;)
			pause();
	}
	close(pfd[1]);
	got = read(pfd[0], &c, 1); /* its engine (and slot file) exists */
	close(pfd[0]);
	named = dir_slot_files(f->dir);
	assert_int_equal(kill(pid, SIGKILL), 0); /* before any assertion can skip it */
	assert_int_equal(waitpid(pid, NULL, 0), pid);
	left = dir_slot_files(f->dir);
	if (left) /* (what the old code left: cleaned, so the teardown does not fail too) */
		rm_slot_files(f->dir);
	assert_int_equal(got, 1);
	assert_int_equal(named, 0);
	assert_int_equal(left, 0);

	/* what an older kvtier left: the dead child's pid, a live process's, another name */
	snprintf(path, sizeof path, "%s/kvtier-%ld-3.slots", f->dir, (long)pid);
	snprintf(live, sizeof live, "%s/kvtier-%ld-0.slots", f->dir, (long)getppid());
	snprintf(other, sizeof other, "%s/kvtier-%ld-0.slots.keep", f->dir, (long)pid);
	const char *const planted[] = { path, live, other };
	for (int i = 0; i < 3; i++) {
		fd = open(planted[i], O_WRONLY | O_CREAT | O_EXCL, 0600);
		assert_true(fd >= 0);
		close(fd);
	}
	o.log = kill_log_fn;
	assert_int_equal(kvt_engine_create(&o, &e), 0);
	assert_int_equal(access(path, F_OK), -1);
	assert_int_equal(access(live, F_OK), 0);
	assert_int_equal(access(other, F_OK), 0);
	assert_int_equal(kill_log_n, 1);
	assert_non_null(strstr(kill_log, "removed 1 slot files"));
	assert_non_null(strstr(kill_log, strrchr(path, '/') + 1));
	kvt_engine_destroy(e);
	assert_int_equal(unlink(live), 0);
	assert_int_equal(unlink(other), 0);
}

static void
test_submit_args_and_queue_full(void **state)
{
	struct fx *f = *state;
	struct kvt_nvme *n = fx_open(f, NULL);
	struct kvt_nvme_cqe c[QD];
	uint8_t buf[BLOCK] = { 1 };

	assert_int_equal(kvt_nvme_submit_write(n, NSLOTS, buf, 1, 0), -EINVAL);
	assert_true(strstr(kvt_last_error_message(), "out of range") != NULL);
	assert_int_equal(kvt_nvme_submit_read(n, UINT32_MAX, buf, 1, 0), -EINVAL);
	assert_int_equal(kvt_nvme_submit_write(n, 0, NULL, 1, 0), -EINVAL);
	assert_int_equal(kvt_nvme_submit_read(n, 0, NULL, 1, 0), -EINVAL);
	assert_int_equal(kvt_nvme_reap(n, NULL, 1, false), -EINVAL);
	assert_int_equal(kvt_nvme_inflight(n), 0);
	/* nothing in flight: a waiting reap returns at once */
	assert_int_equal(kvt_nvme_reap(n, c, QD, true), 0);
	for (uint32_t i = 0; i < QD; i++)
		assert_int_equal(kvt_nvme_submit_write(n, i, buf, i, i), 0);
	assert_int_equal(kvt_nvme_submit_write(n, QD, buf, 1, 0), -EAGAIN);
	assert_int_equal(kvt_nvme_submit_read(n, 0, buf, 1, 0), -EAGAIN);
	assert_int_equal(kvt_nvme_inflight(n), QD);
	assert_int_equal(kvt_nvme_free_qd(n), 0);
	assert_int_equal(kvt_nvme_flush(n), (int)QD);
	assert_int_equal(kvt_nvme_flush(n), 0);
	/* reap one at a time: the other ready CQEs stay in the ring, none is lost */
	for (uint32_t i = 0; i < QD; i++) {
		assert_int_equal(kvt_nvme_reap(n, c, 1, true), 1);
		assert_int_equal(c[0].res, 0);
		assert_int_equal(kvt_nvme_free_qd(n), i + 1);
	}
	assert_int_equal(kvt_nvme_reap(n, c, QD, true), 0);
	kvt_nvme_close(n);
}

static void
test_many_ready_reaped_one_by_one(void **state)
{
	struct fx *f = *state;
	struct kvt_nvme_opts o = fx_opts(f, NULL);
	struct kvt_nvme *n = NULL;
	struct kvt_nvme_cqe c;
	uint8_t buf[BLOCK];
	bool seen[NSLOTS] = { false };

	o.queue_depth = NSLOTS;
	assert_int_equal(kvt_nvme_open(&o, &n, NULL, 0), 0);
	fill_random(buf, BLOCK, 9);
	for (uint32_t i = 0; i < NSLOTS; i++)
		assert_int_equal(kvt_nvme_submit_write(n, i, buf, 7, i), 0);
	for (uint32_t i = 0; i < NSLOTS; i++) {
		assert_int_equal(kvt_nvme_reap(n, &c, 1, true), 1);
		assert_true(c.user_data < NSLOTS);
		assert_false(seen[c.user_data]);
		seen[c.user_data] = true;
		assert_int_equal(c.res, 0);
	}
	assert_int_equal(kvt_nvme_inflight(n), 0);
	kvt_nvme_close(n);
}

/* ---- verification --------------------------------------------------------------------------- */

static void
test_wrong_key_and_unwritten_slot(void **state)
{
	struct fx *f = *state;
	struct kvt_nvme *n = fx_open(f, NULL);
	uint8_t *src = malloc((size_t)2 * BLOCK), dst[BLOCK], ref[BLOCK];

	assert_non_null(src);
	write_slots(n, 2, src);
	memset(ref, 0xab, BLOCK);
	memcpy(dst, ref, BLOCK);
	assert_int_equal(read_one(n, 1, 1000, dst), KVT_ECORRUPT); /* slot 1 has key 1001 */
	assert_true(strstr(kvt_last_error_message(), "key") != NULL);
	assert_memory_equal(dst, ref, BLOCK);
	assert_int_equal(read_one(n, 5, 1005, dst), KVT_ECORRUPT); /* never written: zeros */
	assert_memory_equal(dst, ref, BLOCK);
	assert_int_equal(read_one(n, 1, 1001, dst), 0);
	assert_memory_equal(dst, src + BLOCK, BLOCK);
	kvt_nvme_close(n);
	free(src);
}

struct fault {
	int mode;          /* what to do, FAULT_* */
	size_t flip_at;    /* FAULT_FLIP: byte offset within the slot */
	unsigned calls;    /* hook calls seen */
	unsigned faulted;  /* calls that changed something */
	uint8_t retried[NSLOTS]; /* FAULT_SMALL_ONCE: the slot's IO was faulted, let its retry pass */
	uint8_t saved[SLOT];     /* FAULT_MISPLACED: slot 0 as last written */
};

enum {
	FAULT_NONE,
	FAULT_FLIP,        /* reads: flip bit 3 of byte flip_at of the slot */
	FAULT_EIO_WRITE,   /* writes complete with -EIO */
	FAULT_ENOSPC_WRITE, /* writes complete with -ENOSPC */
	FAULT_EIO_READ,    /* reads complete with -EIO */
	FAULT_HALF,        /* the first piece of every IO reports half its bytes */
	FAULT_SMALL_ONCE,  /* the first try of every IO reports 100 bytes */
	FAULT_SMALL_ALWAYS, /* every piece reports 100 bytes */
	FAULT_ZERO,        /* every piece reports 0 bytes */
	FAULT_MISPLACED,   /* reads of slot 1 return what was written to slot 0 */
	FAULT_TOO_MANY,    /* every IO reports a page more than it asked for */
};

static void
fault_hook(void *arg, bool is_write, uint32_t slot, void *buf, size_t len, uint64_t off,
	   int *res)
{
	struct fault *ft = arg;
	size_t start = (size_t)(off - SUPER - (uint64_t)slot * SLOT); /* where buf is in the slot */
	bool first = start == 0;

	ft->calls++;
	assert_true(off >= SUPER + (uint64_t)slot * SLOT && start + len <= SLOT);
	assert_int_equal(*res, (int)len); /* the real IO always moved everything here */
	if (is_write && slot == 0 && first)
		memcpy(ft->saved, buf, len);
	switch (ft->mode) {
	case FAULT_MISPLACED:
		if (!is_write && slot == 1 && first) {
			memcpy(buf, ft->saved, len); /* a valid block, with the key asked for */
			ft->faulted++;
		}
		return;
	case FAULT_TOO_MANY:
		*res = (int)len + 4096;
		ft->faulted++;
		return;
	case FAULT_FLIP:
		if (!is_write && ft->flip_at >= start && ft->flip_at < start + len) {
			((uint8_t *)buf)[ft->flip_at - start] ^= 0x08;
			ft->faulted++;
		}
		return;
	case FAULT_EIO_WRITE:
	case FAULT_ENOSPC_WRITE:
		if (is_write) {
			*res = ft->mode == FAULT_EIO_WRITE ? -EIO : -ENOSPC;
			ft->faulted++;
		}
		return;
	case FAULT_EIO_READ:
		if (!is_write) {
			*res = -EIO;
			ft->faulted++;
		}
		return;
	case FAULT_HALF:
		if (first) {
			*res = (int)(len / 2);
			ft->faulted++;
		}
		return;
	case FAULT_SMALL_ONCE:
		/* the retry starts at byte 0 too: fault every other first piece of a slot */
		if (first && !ft->retried[slot]) {
			*res = 100;
			ft->faulted++;
		}
		if (first)
			ft->retried[slot] ^= 1;
		return;
	case FAULT_SMALL_ALWAYS:
		*res = 100;
		ft->faulted++;
		return;
	case FAULT_ZERO:
		*res = 0;
		ft->faulted++;
		return;
	default:
		return;
	}
}

static void
test_bit_flip_on_read(void **state)
{
	static const size_t where[] = {
		HDR, HDR + BLOCK / 2, HDR + BLOCK - 1, /* data */
		0, 9, 13, 17, 25, 33,              /* magic, version, slot, key, session, index */
		37, 41, 45, 49, 65,                /* raw and stored length, codec, hash, data sum */
		121,                               /* header checksum */
	};
	struct fx *f = *state;
	struct fault ft = { .mode = FAULT_NONE };
	struct kvt_nvme_fault_hooks hooks = { .on_complete = fault_hook, .arg = &ft };
	struct kvt_nvme *n = fx_open(f, &hooks);
	uint8_t src[BLOCK], dst[BLOCK], ref[BLOCK];

	write_slots(n, 1, src);
	memset(ref, 0xcd, BLOCK);
	for (size_t i = 0; i < sizeof where / sizeof where[0]; i++) {
		ft.mode = FAULT_FLIP;
		ft.flip_at = where[i];
		ft.faulted = 0;
		memcpy(dst, ref, BLOCK);
		assert_int_equal(read_one(n, 0, 1000, dst), KVT_ECORRUPT);
		assert_int_equal(ft.faulted, 1);
		assert_memory_equal(dst, ref, BLOCK); /* never wrong KV in the caller's buffer */
	}
	ft.mode = FAULT_NONE; /* the flips were in staging only: the slot is intact */
	assert_int_equal(read_one(n, 0, 1000, dst), 0);
	assert_memory_equal(dst, src, BLOCK);
	kvt_nvme_close(n);
}

static void
test_injected_errors(void **state)
{
	struct fx *f = *state;
	struct fault ft = { .mode = FAULT_EIO_WRITE };
	struct kvt_nvme_fault_hooks hooks = { .on_complete = fault_hook, .arg = &ft };
	struct kvt_nvme *n = fx_open(f, &hooks);
	uint8_t src[BLOCK], dst[BLOCK], ref[BLOCK];
	struct io io = { .slot = 3, .key = 5, .write = true, .buf = src };
	int res;

	fill_random(src, BLOCK, 3);
	pump(n, &io, 1, &res);
	assert_int_equal(res, -EIO);
	ft.mode = FAULT_ENOSPC_WRITE;
	pump(n, &io, 1, &res);
	assert_int_equal(res, -ENOSPC);
	ft.mode = FAULT_NONE;
	pump(n, &io, 1, &res);
	assert_int_equal(res, 0);
	ft.mode = FAULT_EIO_READ;
	memset(ref, 0x11, BLOCK);
	memcpy(dst, ref, BLOCK);
	assert_int_equal(read_one(n, 3, 5, dst), -EIO);
	assert_memory_equal(dst, ref, BLOCK);
	ft.mode = FAULT_NONE; /* the tier is still usable */
	assert_int_equal(read_one(n, 3, 5, dst), 0);
	assert_memory_equal(dst, src, BLOCK);
	kvt_nvme_close(n);
}

/* Write 8 slots and read them back under fault @mode; all must succeed and round-trip. */
static void
short_round_trip(struct fx *f, int mode, unsigned pieces_per_io)
{
	enum { K = 8 };
	struct fault ft = { .mode = mode };
	struct kvt_nvme_fault_hooks hooks = { .on_complete = fault_hook, .arg = &ft };
	struct kvt_nvme *n = fx_open(f, &hooks);
	uint8_t *src = malloc((size_t)K * BLOCK), *dst = calloc(K, BLOCK);
	struct io ios[K];
	int res[K];

	assert_non_null(src);
	assert_non_null(dst);
	write_slots(n, K, src);
	assert_int_equal(ft.calls, K * pieces_per_io);
	for (uint32_t i = 0; i < K; i++)
		ios[i] = (struct io){ .slot = i, .key = 1000 + i, .buf = dst + (size_t)i * BLOCK };
	pump(n, ios, K, res);
	for (uint32_t i = 0; i < K; i++)
		assert_int_equal(res[i], 0);
	assert_memory_equal(src, dst, (size_t)K * BLOCK);
	assert_int_equal(ft.calls, 2 * K * pieces_per_io);
	assert_int_equal(ft.faulted, 2 * K); /* one short piece per IO, continued */
	kvt_nvme_close(n);
	free(src);
	free(dst);
}

static void
test_short_io_half(void **state)
{
	/* half of 16384 = 8192: continued from there */
	short_round_trip(*state, FAULT_HALF, 2);
}

static void
test_short_io_below_alignment(void **state)
{
	/* 100 bytes reach no 4 KiB boundary: retried from the start once */
	short_round_trip(*state, FAULT_SMALL_ONCE, 2);
}

static void
test_short_io_no_progress(void **state)
{
	struct fx *f = *state;
	struct fault ft = { .mode = FAULT_ZERO };
	struct kvt_nvme_fault_hooks hooks = { .on_complete = fault_hook, .arg = &ft };
	struct kvt_nvme *n = fx_open(f, &hooks);
	uint8_t src[BLOCK], dst[BLOCK], ref[BLOCK];
	struct io io = { .slot = 1, .key = 9, .write = true, .buf = src };
	int res;

	fill_random(src, BLOCK, 1);
	pump(n, &io, 1, &res);
	assert_int_equal(res, KVT_ESHORTIO);
	assert_int_equal(ft.calls, 1);
	ft.mode = FAULT_NONE;
	pump(n, &io, 1, &res);
	assert_int_equal(res, 0);
	ft.mode = FAULT_ZERO;
	memset(ref, 0x77, BLOCK);
	memcpy(dst, ref, BLOCK);
	assert_int_equal(read_one(n, 1, 9, dst), KVT_ESHORTIO);
	assert_memory_equal(dst, ref, BLOCK);
	/* pieces that never reach a 4 KiB boundary: retried, then given up */
	ft.mode = FAULT_SMALL_ALWAYS;
	ft.calls = 0;
	assert_int_equal(read_one(n, 1, 9, dst), KVT_ESHORTIO);
	assert_int_equal(ft.calls, KVT_NVME_MAX_STALLS + 1);
	assert_memory_equal(dst, ref, BLOCK);
	kvt_nvme_close(n);
}

/* ---- close ---------------------------------------------------------------------------------- */

static void
test_close_with_io_in_flight(void **state)
{
	struct fx *f = *state;
	struct kvt_nvme *n = fx_open(f, NULL);
	uint8_t src[QD * BLOCK], dst[QD * BLOCK], ref[QD * BLOCK];
	char path[PATH_MAX];

	write_slots(n, QD, src);
	memset(ref, 0x3c, sizeof ref);
	memcpy(dst, ref, sizeof dst);
	/* queued but never submitted */
	for (uint32_t i = 0; i < QD; i++)
		assert_int_equal(kvt_nvme_submit_read(n, i, dst + i * BLOCK, 1000 + i, i), 0);
	kvt_nvme_close(n);
	assert_memory_equal(dst, ref, sizeof dst); /* completions discarded, dst not written */

	/* submitted to the kernel, mixed reads and writes */
	n = fx_open(f, NULL);
	snprintf(path, sizeof path, "%s", kvt_nvme_path(n));
	assert_int_equal(kvt_nvme_submit_write(n, 0, src, 1, 0), 0);
	assert_int_equal(kvt_nvme_submit_write(n, 1, src, 1, 1), 0);
	assert_int_equal(kvt_nvme_flush(n), 2);
	assert_int_equal(kvt_nvme_submit_read(n, 0, dst, 1, 2), 0);
	assert_int_equal(kvt_nvme_inflight(n), 3);
	kvt_nvme_close(n); /* ASan reports a leak if anything is not freed */
	assert_memory_equal(dst, ref, BLOCK);
	assert_int_equal(access(path, F_OK), -1);
	assert_int_equal(errno, ENOENT);
}

/* ---- open failures -------------------------------------------------------------------------- */

/* Open must fail with @code, set *out to NULL, and report the same message both ways. */
static void
open_fails(const struct kvt_nvme_opts *o, int code, const char *needle)
{
	struct kvt_nvme *n = (struct kvt_nvme *)(uintptr_t)1;
	char err[256];

	assert_int_equal(kvt_nvme_open(o, &n, err, sizeof err), code);
	assert_null(n);
	assert_string_equal(err, kvt_last_error_message());
	if (needle && !strstr(err, needle))
		fail_msg("message \"%s\" lacks \"%s\"", err, needle);
}

static void
test_open_bad_options(void **state)
{
	struct fx *f = *state;
	struct kvt_nvme_opts o;
	struct kvt_nvme *n = NULL;

	o = fx_opts(f, NULL);
	o.dir = NULL;
	open_fails(&o, -EINVAL, "dir");
	open_fails(NULL, -EINVAL, "opts");
	o = fx_opts(f, NULL);
	o.block_bytes = 0;
	open_fails(&o, -EINVAL, "block_bytes");
	o = fx_opts(f, NULL);
	o.queue_depth = 0;
	open_fails(&o, -EINVAL, "queue_depth");
	o.queue_depth = 4097;
	open_fails(&o, -EINVAL, "queue_depth");
	o = fx_opts(f, NULL);
	o.capacity_bytes = SLOT - 1; /* below one slot */
	open_fails(&o, -EINVAL, "below one slot");
	o.capacity_bytes = 0;
	open_fails(&o, -EINVAL, "below one slot");
	o.capacity_bytes = SLOT; /* exactly one slot is fine */
	assert_int_equal(kvt_nvme_open(&o, &n, NULL, 0), 0);
	assert_int_equal(kvt_nvme_n_slots(n), 1);
	kvt_nvme_close(n);
	o.capacity_bytes = (uint64_t)SLOT << 32; /* 2^32 slots */
	open_fails(&o, -EINVAL, "2^32");
	o = fx_opts(f, NULL);
	o.queue_depth = 4096; /* the largest depth is accepted */
	o.block_bytes = 100;
	assert_int_equal(kvt_nvme_open(&o, &n, NULL, 0), 0);
	assert_int_equal(kvt_nvme_slot_bytes(n), 8192); /* header page + one data page */
	assert_int_equal(kvt_nvme_free_qd(n), 4096);
	kvt_nvme_close(n);
	assert_int_equal(kvt_nvme_open(&o, NULL, NULL, 0), -EINVAL);
}

static void
test_open_bad_dirs(void **state)
{
	struct fx *f = *state;
	struct kvt_nvme_opts o = fx_opts(f, NULL);
	char path[PATH_MAX + 32];
	int fd;

	snprintf(path, sizeof path, "%s/missing", f->dir);
	o.dir = path;
	open_fails(&o, -ENOENT, "does not exist");
	snprintf(path, sizeof path, "%s/file", f->dir);
	fd = creat(path, 0600);
	assert_true(fd >= 0);
	close(fd);
	open_fails(&o, -ENOTDIR, "not a directory");
	snprintf(path, sizeof path, "%s/file/below", f->dir);
	open_fails(&o, -ENOTDIR, NULL);
	snprintf(path, sizeof path, "%s/file", f->dir);
	assert_int_equal(unlink(path), 0);
}

/* In a child without root's powers if need be: an unwritable dir gives -EACCES. */
static void
test_open_unwritable_dir(void **state)
{
	struct fx *f = *state;
	char path[PATH_MAX + 32];
	pid_t pid;
	int status = -1;

	snprintf(path, sizeof path, "%s/ro", f->dir);
	assert_int_equal(mkdir(path, 0500), 0);
	assert_int_equal(chmod(f->dir, 0755), 0); /* so that an unprivileged child can reach it */
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct kvt_nvme_opts o = fx_opts(f, NULL);
		struct kvt_nvme *n = NULL;
		char err[256];
		int r;

		if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0))
			_exit(77);
		if (access(f->dir, X_OK) != 0)
			_exit(77); /* a parent directory is closed to the unprivileged user */
		o.dir = path;
		r = kvt_nvme_open(&o, &n, err, sizeof err);
		_exit(r == -EACCES && n == NULL && strstr(err, "not writable") ? 0 : 1);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_int_equal(rmdir(path), 0);
	assert_true(WIFEXITED(status));
	if (WEXITSTATUS(status) == 77)
		skip();
	assert_int_equal(WEXITSTATUS(status), 0);
}

static void
test_open_odirect_refused(void **state)
{
	struct fx *f = *state;
	struct kvt_nvme_opts o = fx_opts(f, NULL);
	char msg[PATH_MAX + 64];

	fake_odirect_einval = 1;
	snprintf(msg, sizeof msg, "filesystem at %s refuses O_DIRECT", f->dir);
	open_fails(&o, -EINVAL, msg);
	fake_odirect_einval = 0;
	/* the file created before the refusal is gone: teardown's rmdir checks it */
	fake_dio_align = 0; /* statx: "no direct IO on this file" */
	open_fails(&o, -EINVAL, msg);
	fake_dio_align = 8192;
	open_fails(&o, -EINVAL, "alignment of 8192");
	fake_dio_align = 3000; /* does not divide 4 KiB */
	open_fails(&o, -EINVAL, "alignment of 3000");
	fake_dio_align = -1;
}

/* Buffered IO only when asked for: then the round trip works without O_DIRECT. */
static void
test_open_buffered_fallback(void **state)
{
	struct fx *f = *state;
	struct kvt_nvme_opts o = fx_opts(f, NULL);
	struct kvt_nvme *n;
	uint8_t src[BLOCK], dst[BLOCK];

	o.buffered_fallback = true;
	fake_odirect_einval = 1;
	assert_int_equal(kvt_nvme_open(&o, &n, NULL, 0), 0);
	fake_odirect_einval = 0;
	assert_true(kvt_nvme_buffered(n));
	write_slots(n, 1, src);
	assert_int_equal(read_one(n, 0, 1000, dst), 0);
	assert_memory_equal(src, dst, BLOCK);
	kvt_nvme_close(n);
	assert_int_equal(kvt_nvme_open(&o, &n, NULL, 0), 0); /* O_DIRECT works: used */
	assert_false(kvt_nvme_buffered(n));
	kvt_nvme_close(n);
}

struct fates {
	int mode;          /* 0 none, 1 delay every other CQE, 2 lose the next write of slot 2 */
	unsigned seen;     /* CQEs offered */
	unsigned changed;  /* CQEs delayed or lost */
};

static int
fate_hook(void *arg, bool is_write, uint32_t slot)
{
	struct fates *ft = arg;

	ft->seen++;
	if (ft->mode == 1 && ft->seen % 2) {
		ft->changed++;
		return KVT_NVME_FATE_DELAY;
	}
	if (ft->mode == 3 && is_write && slot == 1) {
		ft->mode = 0;
		ft->changed++;
		return KVT_NVME_FATE_LATE;
	}
	if (ft->mode == 2 && is_write && slot == 2) {
		ft->mode = 0;
		ft->changed++;
		return KVT_NVME_FATE_LOSE;
	}
	return KVT_NVME_FATE_NORMAL;
}

/* The codec path (inline: no workers): writes come back with a smaller
 * stored length, reads of that length decode to the original, and a flipped payload bit is
 * caught after decoding. */
static void
test_codec_round_trip(void **state)
{
	struct fx *f = *state;
	struct fault ft = { .mode = FAULT_NONE };
	struct kvt_nvme_fault_hooks hooks = { .on_complete = fault_hook, .arg = &ft };
	struct kvt_nvme_opts o = fx_opts(f, &hooks);
	struct kvt_nvme_cqe c[QD];
	struct kvt_nvme *n;
	uint8_t *src = malloc((size_t)NSLOTS * BLOCK), dst[BLOCK];
	uint32_t stored[NSLOTS];
	int got;

	o.codec = KVT_CODEC_SHUF_LZ4;
	o.min_saving = 0.1;
	o.layout.dtype = KVT_DTYPE_BF16;
	assert_int_equal(kvt_nvme_open(&o, &n, NULL, 0), 0);
	for (uint32_t i = 0; i < NSLOTS; i++) {
		uint8_t *b = src + (size_t)i * BLOCK;

		fill_random(b, BLOCK, i + 9);
		for (uint32_t j = 1; j < BLOCK; j += 2)
			b[j] = (uint8_t)(0x3c + (b[j] & 1)); /* narrow sign/exponent bytes */
	}
	for (uint32_t base = 0; base < NSLOTS; base += QD) {
		for (uint32_t i = base; i < base + QD; i++)
			assert_int_equal(kvt_nvme_submit_write(n, i, src + (size_t)i * BLOCK,
							       50 + i, i), 0);
		for (got = 0; got < (int)QD;) {
			int r = kvt_nvme_reap(n, c, QD, true);

			assert_true(r > 0);
			for (int k = 0; k < r; k++) {
				assert_int_equal(c[k].res, 0);
				assert_int_equal(c[k].codec, KVT_CODEC_SHUF_LZ4);
				assert_true(c[k].stored < BLOCK * 9 / 10);
				stored[c[k].user_data] = c[k].stored;
			}
			got += r;
		}
	}
	for (uint32_t i = 0; i < NSLOTS; i++) {
		memset(dst, 0, BLOCK);
		assert_int_equal(kvt_nvme_submit_read_len(n, i, dst, 50 + i, stored[i], 1), 0);
		assert_int_equal(kvt_nvme_reap(n, c, 1, true), 1);
		assert_int_equal(c[0].res, 0);
		assert_memory_equal(dst, src + (size_t)i * BLOCK, BLOCK);
	}
	/* a wrong stored length, and a flipped payload bit, are both refused */
	assert_int_equal(kvt_nvme_submit_read_len(n, 3, dst, 53, stored[3] + 8, 1), 0);
	assert_int_equal(kvt_nvme_reap(n, c, 1, true), 1);
	assert_int_equal(c[0].res, KVT_ECORRUPT);
	ft.mode = FAULT_FLIP;
	ft.flip_at = HDR + stored[3] / 2;
	assert_int_equal(kvt_nvme_submit_read_len(n, 3, dst, 53, stored[3], 1), 0);
	assert_int_equal(kvt_nvme_reap(n, c, 1, true), 1);
	assert_int_equal(c[0].res, KVT_ECORRUPT);
	assert_int_equal(ft.faulted, 1);
	kvt_nvme_close(n);
	free(src);
}

/* Late (reordered) completions: every IO still completes exactly once, with the right data. */
static void
test_delayed_completions(void **state)
{
	struct fx *f = *state;
	struct fates ft = { .mode = 1 };
	struct kvt_nvme_fault_hooks hooks = { .fate = fate_hook, .arg = &ft };
	struct kvt_nvme *n = fx_open(f, &hooks);
	uint8_t *src = malloc((size_t)NSLOTS * BLOCK), *dst = malloc(BLOCK);

	write_slots(n, NSLOTS, src); /* pump checks one completion per IO */
	for (uint32_t i = 0; i < NSLOTS; i += 7) {
		assert_int_equal(read_one(n, i, 1000 + i, dst), 0);
		assert_memory_equal(dst, src + (size_t)i * BLOCK, BLOCK);
	}
	assert_true(ft.changed > NSLOTS / 2);
	kvt_nvme_close(n);
	free(src);
	free(dst);
}

/* A completion that never comes: the IO times out with -ETIMEDOUT (not a hang), its buffer is
 * retired, everything else goes on; when every buffer is retired, submits fail with -EIO. */
static void
test_lost_completion(void **state)
{
	struct fx *f = *state;
	struct fates ft = { .mode = 2 };
	struct kvt_nvme_fault_hooks hooks = { .fate = fate_hook, .arg = &ft, .io_timeout_ms = 50 };
	struct kvt_nvme *n = fx_open(f, &hooks);
	struct kvt_nvme_cqe c[QD];
	uint8_t src[BLOCK], dst[BLOCK];
	int res[QD] = { 1, 1, 1, 1 }, got = 0, r;

	fill_random(src, BLOCK, 5);
	for (uint32_t i = 0; i < QD; i++)
		assert_int_equal(kvt_nvme_submit_write(n, i, src, 1000 + i, i), 0);
	while (got < (int)QD) {
		r = kvt_nvme_reap(n, c, QD, true);
		assert_true(r > 0);
		for (int i = 0; i < r; i++)
			res[c[i].user_data] = c[i].res;
		got += r;
	}
	assert_int_equal(ft.changed, 1);
	assert_int_equal(res[0], 0);
	assert_int_equal(res[2], -ETIMEDOUT);
	assert_non_null(strstr(kvt_last_error_message(), "no completion within 50 ms"));
	assert_int_equal(kvt_nvme_inflight(n), 0);
	assert_int_equal(kvt_nvme_free_qd(n), QD - 1); /* the lost one's buffer is retired */
	assert_int_equal(read_one_nopump(n, 2, 1002, dst), 0); /* the write itself happened */
	assert_memory_equal(src, dst, BLOCK);
	/* lose every buffer: then submits fail instead of waiting forever */
	for (uint32_t k = 0; k < QD - 1; k++) {
		ft.mode = 2;
		assert_int_equal(kvt_nvme_submit_write(n, 2, src, 7, 0), 0);
		assert_int_equal(kvt_nvme_reap(n, c, 1, true), 1);
		assert_int_equal(c[0].res, -ETIMEDOUT);
	}
	assert_int_equal(kvt_nvme_free_qd(n), 0);
	assert_int_equal(kvt_nvme_submit_write(n, 0, src, 7, 0), -EIO);
	assert_int_equal(kvt_nvme_reap(n, c, 1, true), 0); /* nothing to wait for: no hang */
	kvt_nvme_close(n); /* retired buffers are freed: no leak under ASan */
}

/* A whole valid block (right key, checksums fine) found in the wrong slot is refused; so is a
 * completion that claims more bytes than were asked for (never reported as success). */
static void
test_misplaced_block_and_overlong_io(void **state)
{
	struct fx *f = *state;
	struct fault ft = { .mode = FAULT_NONE };
	struct kvt_nvme_fault_hooks hooks = { .on_complete = fault_hook, .arg = &ft };
	struct kvt_nvme *n = fx_open(f, &hooks);
	uint8_t src[2 * BLOCK], dst[BLOCK], ref[BLOCK];
	struct io io = { .slot = 3, .key = 5, .write = true, .buf = src };
	int res;

	write_slots(n, 2, src); /* slot 0: key 1000, slot 1: key 1001 */
	ft.mode = FAULT_MISPLACED;
	memset(ref, 0xcd, BLOCK);
	memcpy(dst, ref, BLOCK);
	assert_int_equal(read_one(n, 1, 1000, dst), KVT_ECORRUPT);
	assert_int_equal(ft.faulted, 1);
	assert_non_null(strstr(kvt_last_error_message(), "written to slot 0"));
	assert_memory_equal(dst, ref, BLOCK);
	ft.mode = FAULT_TOO_MANY;
	pump(n, &io, 1, &res);
	assert_int_equal(res, -EIO);
	assert_non_null(strstr(kvt_last_error_message(), "asked"));
	assert_int_equal(read_one(n, 0, 1000, dst), -EIO);
	assert_memory_equal(dst, ref, BLOCK);
	ft.mode = FAULT_NONE;
	assert_int_equal(read_one(n, 0, 1000, dst), 0);
	kvt_nvme_close(n);
}

/* A write whose completion comes after its timeout: -ETIMEDOUT first; its staging buffer stays
 * out of use until the kernel's (late) CQE arrives, and only then is its slot reported free
 * for writing again. */
static void
test_late_completion_after_timeout(void **state)
{
	struct fx *f = *state;
	struct fates ft = { .mode = 3 };
	struct kvt_nvme_fault_hooks hooks = { .fate = fate_hook, .arg = &ft, .io_timeout_ms = 30 };
	struct kvt_nvme *n = fx_open(f, &hooks);
	struct kvt_nvme_cqe c[QD];
	uint8_t src[BLOCK];
	uint32_t sl[QD];

	fill_random(src, BLOCK, 6);
	assert_int_equal(kvt_nvme_submit_write(n, 1, src, 77, 5), 0);
	assert_int_equal(kvt_nvme_reap(n, c, QD, true), 1);
	assert_int_equal(c[0].res, -ETIMEDOUT);
	assert_int_equal(ft.changed, 1);
	assert_int_equal(kvt_nvme_free_qd(n), QD - 1); /* the kernel still has its buffer */
	assert_true(kvt_nvme_abandoned(n));
	assert_int_equal(kvt_nvme_late_writes(n, sl, QD), 0); /* slot not yet reusable */
	/* the late CQE (at the next reap, or when a disk slower than 30 ms is done): no
	 * completion is returned for it */
	for (int i = 0; i < 20000 && kvt_nvme_free_qd(n) < QD; i++) {
		assert_int_equal(kvt_nvme_reap(n, c, QD, false), 0);
		usleep(1000);
	}
	assert_int_equal(kvt_nvme_free_qd(n), QD);
	assert_false(kvt_nvme_abandoned(n));
	assert_int_equal(kvt_nvme_late_writes(n, sl, QD), 1);
	assert_int_equal(sl[0], 1);
	assert_int_equal(kvt_nvme_late_writes(n, sl, QD), 0);
	kvt_nvme_close(n);
}

static void
test_open_dio_align_ok(void **state)
{
	struct fx *f = *state;
	struct kvt_nvme *n;
	uint8_t src[BLOCK], dst[BLOCK];

	fake_dio_align = 4096; /* a 4Kn device */
	n = fx_open(f, NULL);
	fake_dio_align = -1;
	write_slots(n, 1, src);
	assert_int_equal(read_one(n, 0, 1000, dst), 0);
	assert_memory_equal(src, dst, BLOCK);
	kvt_nvme_close(n);
}

static void
test_open_fallocate(void **state)
{
	struct fx *f = *state;
	struct kvt_nvme_opts o = fx_opts(f, NULL);
	struct kvt_nvme *n = NULL;
	uint8_t src[BLOCK], dst[BLOCK];
	struct stat st;

	fake_fallocate_errno = ENOSPC;
	open_fails(&o, -ENOSPC, "cannot reserve");
	fake_fallocate_errno = EFBIG;
	open_fails(&o, -ENOSPC, "cannot reserve");
	fake_fallocate_errno = EIO;
	open_fails(&o, -EIO, "fallocate");
	/* a filesystem without fallocate: ftruncate sizes the file */
	fake_fallocate_errno = EOPNOTSUPP;
	assert_int_equal(kvt_nvme_open(&o, &n, NULL, 0), 0);
	fake_fallocate_errno = 0;
	assert_int_equal(stat(kvt_nvme_path(n), &st), 0);
	assert_int_equal(st.st_size, (off_t)(SUPER + NSLOTS * SLOT));
	write_slots(n, 1, src);
	assert_int_equal(read_one(n, 0, 1000, dst), 0);
	assert_memory_equal(src, dst, BLOCK);
	kvt_nvme_close(n);
}

int
main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)
	const struct CMUnitTest tests[] = {
		T(test_round_trip),
		T(test_file_mode_size_and_removal),
		T(test_slot_file_gone_after_sigkill),
		T(test_submit_args_and_queue_full),
		T(test_many_ready_reaped_one_by_one),
		T(test_wrong_key_and_unwritten_slot),
		T(test_bit_flip_on_read),
		T(test_injected_errors),
		T(test_short_io_half),
		T(test_short_io_below_alignment),
		T(test_short_io_no_progress),
		T(test_close_with_io_in_flight),
		T(test_open_bad_options),
		T(test_open_bad_dirs),
		T(test_open_unwritable_dir),
		T(test_open_odirect_refused),
		T(test_open_dio_align_ok),
		T(test_open_fallocate),
		T(test_open_buffered_fallback),
		T(test_codec_round_trip),
		T(test_delayed_completions),
		T(test_lost_completion),
		T(test_late_completion_after_timeout),
		T(test_misplaced_block_and_overlong_io),
	};
#undef T

	return cmocka_run_group_tests(tests, NULL, NULL);
}
