/* SPDX-License-Identifier: MIT */
/*
 * tiers/tier_nvme.c - the NVME tier: one file of fixed-size slots, O_DIRECT, io_uring. This file
 * opens it (options, directory, the slot file or the persistent store with its superblock and
 * lock, fallocate, staging buffers, the ring, the worker pool) and closes it; the accessors and
 * the slot table are in nvme_info.c, the IO in nvme_io.c. The slot layout and the contract are
 * in tier_nvme.h.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <liburing.h>

#include "tiers/base/error.h"
#include "tiers/codec.h"
#include "tiers/nvme_int.h"
#include "tiers/store.h"

/* Distinguishes the slot files of several tiers opened by one process. */
static atomic_uint nvme_file_counter;

/* ---- open ---------------------------------------------------------------------------------- */

/* Record the message with kvt_err() and copy the same text into err. Returns code. */
static int KVT_PRINTF(4, 5)
nvme_open_fail(int code, char *err, size_t errlen, const char *fmt, ...)
{
	char msg[400];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	kvt_err(code, "%s", msg);
	if (err && errlen > 0)
		snprintf(err, errlen, "%s", kvt_last_error_message());
	return code;
}


static int
nvme_validate(const struct kvt_nvme_opts *o, size_t *slot_bytes, uint32_t *n_slots, char *err,
	      size_t errlen)
{
	uint64_t slots;
	size_t sb;

	if (!o || !o->dir)
		return nvme_open_fail(-EINVAL, err, errlen, "nvme: %s is NULL",
				      o ? "dir" : "opts");
	if (o->block_bytes == 0 || o->block_bytes > NVME_MAX_BLOCK_BYTES)
		return nvme_open_fail(-EINVAL, err, errlen,
				      "nvme block_bytes %zu out of range 1..%u", o->block_bytes,
				      NVME_MAX_BLOCK_BYTES);
	if (o->workers > KVT_NVME_MAX_WORKERS)
		return nvme_open_fail(-EINVAL, err, errlen, "nvme workers %u out of range 0..%u",
				      o->workers, KVT_NVME_MAX_WORKERS);
	if (o->queue_depth == 0 || o->queue_depth > NVME_MAX_QD)
		return nvme_open_fail(-EINVAL, err, errlen, "nvme queue_depth %u out of range 1..%u",
				      o->queue_depth, NVME_MAX_QD);
	if (o->codec < KVT_CODEC_NONE || o->codec > KVT_CODEC_CSHUF_LZ4)
		return nvme_open_fail(-EINVAL, err, errlen, "nvme codec %d unknown", o->codec);
	if (!(o->min_saving >= 0 && o->min_saving < 1))
		return nvme_open_fail(-EINVAL, err, errlen,
				      "nvme codec min_saving %g not in [0, 1)", o->min_saving);
	sb = (size_t)kvt_fmt_slot_bytes(o->block_bytes);
	slots = o->capacity_bytes / sb;
	if (slots == 0)
		return nvme_open_fail(-EINVAL, err, errlen,
				      "nvme capacity %llu bytes is below one slot of %zu bytes "
				      "(a 4 KiB header page + block_bytes %zu rounded up to 4 KiB)",
				      (unsigned long long)o->capacity_bytes, sb, o->block_bytes);
	if (slots > UINT32_MAX)
		return nvme_open_fail(-EINVAL, err, errlen,
				      "nvme capacity %llu bytes holds %llu slots, more than 2^32-1",
				      (unsigned long long)o->capacity_bytes,
				      (unsigned long long)slots);
	if (sb > SIZE_MAX / o->queue_depth)
		return nvme_open_fail(-ENOMEM, err, errlen, "nvme staging: %u x %zu bytes overflows",
				      o->queue_depth, sb);
	*slot_bytes = sb;
	*n_slots = (uint32_t)slots;
	return 0;
}

static int
nvme_check_dir(const char *dir, char *err, size_t errlen)
{
	struct stat st;
	char eb[128];
	int e;

	if (stat(dir, &st) != 0) {
		e = errno;
		if (e == ENOENT)
			return nvme_open_fail(-ENOENT, err, errlen, "nvme dir %s does not exist",
					      dir);
		if (e == ENOTDIR || e == EACCES)
			return nvme_open_fail(-e, err, errlen, "nvme dir %s: %s", dir,
					      nvme_strerror(e, eb, sizeof eb));
		return nvme_open_fail(-e, err, errlen, "nvme dir %s: stat: %s", dir,
				      nvme_strerror(e, eb, sizeof eb));
	}
	if (!S_ISDIR(st.st_mode))
		return nvme_open_fail(-ENOTDIR, err, errlen, "nvme dir %s is not a directory", dir);
	if (access(dir, W_OK | X_OK) != 0) {
		e = errno;
		return nvme_open_fail(-EACCES, err, errlen, "nvme dir %s is not writable: %s", dir,
				      nvme_strerror(e, eb, sizeof eb));
	}
	return 0;
}

/* open(2) of the slot file with O_DIRECT, or buffered when O_DIRECT is refused and allowed. */
static int
nvme_open_path(struct kvt_nvme *n, int flags, bool fallback)
{
	int fd = open(n->path, flags | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);

	if (fd < 0 && errno == EINVAL && fallback) {
		fd = open(n->path, (flags & ~O_EXCL) | O_RDWR | O_CLOEXEC, 0600);
		n->buffered = fd >= 0;
	}
	return fd;
}

static int
nvme_create_fail(struct kvt_nvme *n, int e, const char *dir, char *err, size_t errlen)
{
	char eb[128];

	if (e == EINVAL) {
		/* The file is created before O_DIRECT is checked (tmpfs): remove it again. */
		if (n->unlink_on_free || !n->persist)
			unlink(n->path);
		return nvme_open_fail(-EINVAL, err, errlen,
				      "filesystem at %s refuses O_DIRECT (set "
				      "nvme_buffered_fallback to use buffered IO there)", dir);
	}
	if (e == EACCES || e == EPERM || e == EROFS)
		return nvme_open_fail(-EACCES, err, errlen, "nvme: cannot create %s: %s", n->path,
				      nvme_strerror(e, eb, sizeof eb));
	return nvme_open_fail(-e, err, errlen, "nvme: cannot create %s: %s", n->path,
			      nvme_strerror(e, eb, sizeof eb));
}

/*
 * Lock the store against a second process. A process that just died (crash, SIGKILL) may hold the
 * lock a little longer: its io_uring is torn down asynchronously and keeps the file open until
 * its IO finished, so a restart retries for up to NVME_LOCK_WAIT_MS before calling it in use.
 */
#define NVME_LOCK_WAIT_MS 3000
static int
nvme_lock(int fd)
{
	struct timespec ts = { 0, 5 * 1000 * 1000 };

	for (int waited = 0;; waited += 5) {
		if (flock(fd, LOCK_EX | LOCK_NB) == 0)
			return 0;
		if (errno != EWOULDBLOCK || waited >= NVME_LOCK_WAIT_MS)
			return -1;
		nanosleep(&ts, NULL);
	}
}

/* Remove a "kvtier.store.tmp" a crash left behind (0), unless a live creator holds its lock
 * (-1). */
static int
nvme_drop_stale_tmp(const char *tmp)
{
	int fd = open(tmp, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return 0;
	if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		close(fd);
		return -1;
	}
	unlink(tmp);
	close(fd);
	return 0;
}

/*
 * Remove the private slot files that dead processes left in @dir: "kvtier-<pid>-<n>.slots" whose
 * pid is no process (kill(pid, 0) fails with ESRCH). Files of this kvtier never have a name for
 * longer than the open that creates them (nvme_create_private); these are an older version's, or
 * of a crash inside that open. Best effort; counted in n->stale_removed for the engine's log.
 */
static void
nvme_reclaim_stale(struct kvt_nvme *n, const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	char path[4096];

	if (!d)
		return;
	while ((de = readdir(d))) {
		unsigned long pid = 0;
		unsigned int k = 0;
		int end = 0;

		if (sscanf(de->d_name, "kvtier-%lu-%u.slots%n", &pid, &k, &end) != 2 ||
		    de->d_name[end] != '\0' || pid == 0 || pid > INT32_MAX ||
		    (pid_t)pid == getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
			continue;
		if (snprintf(path, sizeof path, "%s/%s", dir, de->d_name) >= (int)sizeof path ||
		    unlink(path) != 0)
			continue;
		if (n->stale_removed++ == 0)
			snprintf(n->stale_name, sizeof n->stale_name, "%.60s", de->d_name);
	}
	closedir(d);
}

/*
 * The private slot file: an O_TMPFILE in @dir where the filesystem has them, else a
 * "kvtier-<pid>-<n>.slots" unlinked right after it is created; either way it has no name from
 * then on, so that a crash (kill -9) frees its space with the last descriptor instead of leaving
 * a file of the tier's full size behind. Nothing opens it by name later (io_uring registers the
 * descriptor). Returns the descriptor, or -1 with errno and n->path naming what failed.
 */
static int
nvme_create_private(struct kvt_nvme *n, const char *dir, size_t len, bool fallback)
{
	int fd, e = EEXIST;

	nvme_reclaim_stale(n, dir);
#ifdef O_TMPFILE
	snprintf(n->path, len, "%s/(unnamed slot file)", dir);
	fd = open(dir, O_TMPFILE | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
	if (fd < 0 && errno == EINVAL && fallback) {
		fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
		n->buffered = fd >= 0;
	}
	if (fd >= 0)
		return fd;
	/* no O_TMPFILE there (or O_DIRECT refused: the named file reports it) */
#endif
	/* EEXIST only when a crashed process with our pid left its file behind: take the next. */
	for (int attempt = 0; attempt < 16 && e == EEXIST; attempt++) {
		snprintf(n->path, len, "%s/kvtier-%ld-%u.slots", dir, (long)getpid(),
			 atomic_fetch_add(&nvme_file_counter, 1u));
		fd = nvme_open_path(n, O_CREAT | O_EXCL, fallback);
		e = fd < 0 ? errno : 0;
	}
	if (fd < 0) {
		errno = e;
		return -1;
	}
	(void)unlink(n->path);
	return fd;
}

static int
nvme_create_file(struct kvt_nvme *n, const struct kvt_nvme_opts *o, char *err, size_t errlen)
{
	const char *dir = o->dir;
	size_t len = strlen(dir) + 64;
	char eb[128];
	int fd = -1, e = EEXIST;

	n->path = malloc(len);
	if (!n->path)
		return nvme_open_fail(-ENOMEM, err, errlen, "nvme: path of %zu bytes", len);
	if (n->persist) {
		snprintf(n->path, len, "%s/%s", dir, NVME_STORE_NAME);
		fd = nvme_open_path(n, 0, o->buffered_fallback);
		e = fd < 0 ? errno : 0;
		if (fd < 0 && e == ENOENT) {
			/* created under a temporary name, renamed once its superblock is durable
			 * (nvme_setup_file): a crash never leaves a store that cannot be opened */
			n->final_path = n->path;
			n->path = malloc(len + 4);
			if (!n->path)
				return nvme_open_fail(-ENOMEM, err, errlen, "nvme: path");
			snprintf(n->path, len + 4, "%s/%s.tmp", dir, NVME_STORE_NAME);
			if (nvme_drop_stale_tmp(n->path) != 0)
				return nvme_open_fail(-EBUSY, err, errlen, "nvme store %s is being "
						      "created by another process", n->final_path);
			fd = nvme_open_path(n, O_CREAT | O_EXCL, o->buffered_fallback);
			e = fd < 0 ? errno : 0;
			n->unlink_on_free = fd >= 0 || e == EINVAL;
			if (e == EEXIST)
				return nvme_open_fail(-EBUSY, err, errlen, "nvme store %s is being "
						      "created by another process", n->final_path);
		}
	}
	if (!n->persist) {
		fd = nvme_create_private(n, dir, len, o->buffered_fallback);
		e = fd < 0 ? errno : 0;
	}
	if (fd < 0)
		return nvme_create_fail(n, e, dir, err, errlen);
	n->fd = fd;
	if (!n->persist)
		snprintf(n->fd_path, sizeof n->fd_path, "/proc/self/fd/%d", fd);
	if (n->persist && nvme_lock(fd) != 0) {
		e = errno;
		return nvme_open_fail(e == EWOULDBLOCK ? -EBUSY : -e, err, errlen,
				      "nvme store %s is in use by another process", n->path);
	}
	/* Exactly 0600 whatever the umask: KV cache contents are private. */
	if ((n->unlink_on_free || !n->persist) && fchmod(fd, 0600) != 0) {
		e = errno;
		return nvme_open_fail(-e, err, errlen, "nvme: chmod %s: %s", n->path,
				      nvme_strerror(e, eb, sizeof eb));
	}
	return 0;
}

/* The superblock this open expects (epoch and id filled in later). */
static void
nvme_super_want(const struct kvt_nvme *n, const struct kvt_nvme_opts *o, struct kvt_fmt_super *s)
{
	memset(s, 0, sizeof *s);
	s->version = KVT_FMT_VERSION;
	s->n_layers = o->layout.n_layers;
	s->n_kv_heads = o->layout.n_kv_heads;
	s->head_dim = o->layout.head_dim;
	s->dtype = (uint32_t)o->layout.dtype;
	s->tokens_per_block = o->layout.tokens_per_block;
	s->codec = (uint32_t)o->codec;
	s->block_bytes = n->block_bytes;
	s->slot_bytes = n->slot_bytes;
	s->n_slots = n->n_slots;
	s->data_off = KVT_FMT_DATA_OFF;
	s->groups_fp = o->groups_fp;
	s->group = o->group;
}

/* Write n->sb at offset 0; with @durable, fdatasync it (and the directory entry). */
static int
nvme_super_write(struct kvt_nvme *n, bool durable, char *err, size_t errlen)
{
	void *buf = NULL;
	char eb[128];
	ssize_t w;
	int e;

	if (posix_memalign(&buf, NVME_ALIGN, KVT_FMT_SUPER_BYTES) != 0)
		return nvme_open_fail(-ENOMEM, err, errlen, "nvme: superblock buffer");
	kvt_fmt_super_encode(&n->sb, buf);
	w = pwrite(n->fd, buf, KVT_FMT_SUPER_BYTES, 0);
	e = w < 0 ? errno : EIO;
	free(buf);
	if (w != (ssize_t)KVT_FMT_SUPER_BYTES)
		return nvme_open_fail(-e, err, errlen, "nvme: writing the superblock of %s: %s",
				      n->path, nvme_strerror(e, eb, sizeof eb));
	if (durable && fdatasync(n->fd) != 0) {
		e = errno;
		return nvme_open_fail(-e, err, errlen, "nvme: fdatasync %s: %s", n->path,
				      nvme_strerror(e, eb, sizeof eb));
	}
	if (durable)
		kvt_sync_note(KVT_SYNC_SUPER, 0, NULL, 0);
	return 0;
}

void
kvt_nvme_journal_known(const struct kvt_nvme *n, uint64_t *gen, uint64_t *len)
{
	*gen = n->sb.journal_gen;
	*len = n->sb.journal_len;
}

int
kvt_nvme_note_journal(struct kvt_nvme *n, uint64_t gen, uint64_t len)
{
	char err[256];
	int rc;

	if (!n->persist || (n->sb.journal_gen == gen && n->sb.journal_len == len))
		return 0;
	n->sb.journal_gen = gen;
	n->sb.journal_len = len;
	rc = nvme_super_write(n, false, err, sizeof err);
	return rc ? kvt_err(rc, "%s", err) : 0;
}

/* An existing store: read its superblock, refuse it if it does not match, bump its epoch. */
static int
nvme_super_load(struct kvt_nvme *n, const struct kvt_fmt_super *want, char *err, size_t errlen)
{
	void *buf = NULL;
	char eb[128];
	ssize_t r;
	int e, rc;

	if (posix_memalign(&buf, NVME_ALIGN, KVT_FMT_SUPER_BYTES) != 0)
		return nvme_open_fail(-ENOMEM, err, errlen, "nvme: superblock buffer");
	r = pread(n->fd, buf, KVT_FMT_SUPER_BYTES, 0);
	e = r < 0 ? errno : 0;
	if (r < 0) {
		free(buf);
		return nvme_open_fail(-e, err, errlen, "nvme: reading the superblock of %s: %s",
				      n->path, nvme_strerror(e, eb, sizeof eb));
	}
	if (r < (ssize_t)KVT_FMT_SUPER_BYTES)
		memset((uint8_t *)buf + r, 0, KVT_FMT_SUPER_BYTES - (size_t)r);
	rc = kvt_fmt_super_decode(buf, KVT_FMT_SUPER_BYTES, &n->sb);
	free(buf);
	if (rc == 0)
		rc = kvt_fmt_super_match(&n->sb, want, n->path);
	if (rc != 0)
		return nvme_open_fail(rc, err, errlen, "nvme store %s not used: %s", n->path,
				      kvt_last_error_message());
	n->sb.epoch++;
	return nvme_super_write(n, true, err, errlen);
}

static uint64_t
nvme_random64(void)
{
	uint64_t v = 0;

	if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v)
		v = (uint64_t)getpid() * 0x9E3779B97F4A7C15ull ^ (uint64_t)time(NULL);
	return v ? v : 1;
}

/*
 * O_DIRECT needs offsets, lengths and buffer addresses aligned to what the filesystem reports;
 * the slot layout and the staging buffers provide 4 KiB. Refuse at open a file that needs more
 * (or reports no direct IO at all) rather than fail every IO with -EINVAL later. Filesystems
 * that do not report it (tmpfs) are trusted.
 */
static int
nvme_check_dio(struct kvt_nvme *n, const char *dir, char *err, size_t errlen)
{
#ifdef STATX_DIOALIGN
	struct statx stx;

	memset(&stx, 0, sizeof stx);
	if (statx(n->fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) != 0 ||
	    !(stx.stx_mask & STATX_DIOALIGN))
		return 0;
	if (stx.stx_dio_offset_align == 0)
		return nvme_open_fail(-EINVAL, err, errlen, "filesystem at %s refuses O_DIRECT",
				      dir);
	if (NVME_ALIGN % stx.stx_dio_offset_align != 0 ||
	    (stx.stx_dio_mem_align && NVME_ALIGN % stx.stx_dio_mem_align != 0))
		return nvme_open_fail(-EINVAL, err, errlen,
				      "filesystem at %s needs O_DIRECT alignment of %u (offsets) "
				      "and %u (memory) bytes; the NVME tier provides %u",
				      dir, stx.stx_dio_offset_align, stx.stx_dio_mem_align,
				      NVME_ALIGN);
#else
	(void)n;
	(void)dir;
	(void)err;
	(void)errlen;
#endif
	return 0;
}

/* Reserve the file's blocks up front, so that a full disk fails here and not mid-run. */
static int
nvme_reserve(struct kvt_nvme *n, char *err, size_t errlen)
{
	uint64_t size = KVT_FMT_DATA_OFF + (uint64_t)n->n_slots * n->slot_bytes;
	char eb[128];
	int e;

	if (fallocate(n->fd, 0, 0, (off_t)size) == 0)
		return 0;
	e = errno;
	if ((e == EOPNOTSUPP || e == ENOSYS) && ftruncate(n->fd, (off_t)size) == 0)
		return 0;
	if (e == EOPNOTSUPP || e == ENOSYS)
		e = errno;
	if (e == ENOSPC || e == EFBIG || e == EDQUOT)
		return nvme_open_fail(-ENOSPC, err, errlen,
				      "nvme: cannot reserve %llu bytes (%u slots) in %s: %s",
				      (unsigned long long)size, n->n_slots, n->path,
				      nvme_strerror(e, eb, sizeof eb));
	return nvme_open_fail(-e, err, errlen, "nvme: fallocate %s: %s", n->path,
			      nvme_strerror(e, eb, sizeof eb));
}

static int
nvme_alloc_staging(struct kvt_nvme *n, char *err, size_t errlen)
{
	size_t arena_bytes = (size_t)n->qd * n->slot_bytes;
	void *arena = NULL;

	/* 2 MiB aligned with transparent huge pages asked for: an IO's buffer is then a few
	 * physically contiguous pages, not hundreds of 4 KiB ones (fewer DMA segments) */
	arena_bytes = (arena_bytes + NVME_HUGE - 1) & ~(size_t)(NVME_HUGE - 1);
	if (posix_memalign(&arena, NVME_HUGE, arena_bytes) != 0)
		return nvme_open_fail(-ENOMEM, err, errlen, "nvme: %zu bytes of staging buffers",
				      arena_bytes);
	(void)madvise(arena, arena_bytes, MADV_HUGEPAGE);
	n->arena = arena;
	if (n->codec != KVT_CODEC_NONE) {
		n->scratch = malloc(kvt_codec_scratch_bytes(n->block_bytes));
		if (!n->scratch)
			return nvme_open_fail(-ENOMEM, err, errlen, "nvme: codec buffers");
	}
	n->work_q = malloc((size_t)n->qd * sizeof *n->work_q);
	n->done_q = malloc((size_t)n->qd * sizeof *n->done_q);
	if (!n->work_q || !n->done_q)
		return nvme_open_fail(-ENOMEM, err, errlen, "nvme: worker queues");
	n->reqs = calloc(n->qd, sizeof *n->reqs);
	n->free_stack = malloc((size_t)n->qd * sizeof *n->free_stack);
	n->late_slots = malloc((size_t)n->qd * sizeof *n->late_slots);
	n->late_bufs = malloc((size_t)n->qd * sizeof *n->late_bufs);
	n->tag = calloc(n->n_slots, sizeof *n->tag);
	n->lenc = calloc(n->n_slots, sizeof *n->lenc);
	if (!n->reqs || !n->free_stack || !n->late_slots || !n->late_bufs || !n->tag || !n->lenc)
		return nvme_open_fail(-ENOMEM, err, errlen, "nvme: %u request contexts", n->qd);
	for (uint32_t i = 0; i < n->qd; i++) {
		n->reqs[i].buf = n->arena + (size_t)i * n->slot_bytes;
		n->reqs[i].index = i;
		n->free_stack[i] = n->qd - 1 - i;
	}
	n->n_free = n->qd;
	return 0;
}

/*
 * Check the HOST memory of the options for zero-copy IO and cut it into chunks of whole slots
 * of at most 1 GiB (io_uring's limit per registered buffer). Returns the number of chunks, or 0
 * with n->zc_reason set.
 */
static uint32_t
nvme_host_chunks(struct kvt_nvme *n, const struct kvt_nvme_opts *o)
{
	size_t need = (n->block_bytes + NVME_ALIGN - 1) & ~(size_t)(NVME_ALIGN - 1);
	size_t per, chunks;

	if (!o->host_base || !o->host_len) {
		snprintf(n->zc_reason, sizeof n->zc_reason, "no HOST memory given");
		return 0;
	}
	if (o->host_data_off != 0 && o->host_data_off != NVME_HPAGE) {
		snprintf(n->zc_reason, sizeof n->zc_reason,
			 "HOST data offset %zu is neither 0 nor %u", o->host_data_off,
			 (unsigned)NVME_HPAGE);
		return 0;
	}
	if ((uintptr_t)o->host_base % NVME_ALIGN || o->host_stride % NVME_ALIGN ||
	    o->host_stride < o->host_data_off + need) {
		snprintf(n->zc_reason, sizeof n->zc_reason,
			 "HOST memory not 4 KiB aligned (stride %zu, data offset %zu, block %zu)",
			 o->host_stride, o->host_data_off, n->block_bytes);
		return 0;
	}
	per = (size_t)(NVME_MAX_REG / o->host_stride);
	chunks = per ? (o->host_len + per * o->host_stride - 1) / (per * o->host_stride) : 0;
	if (!per || chunks + n->qd > 16384) {
		snprintf(n->zc_reason, sizeof n->zc_reason,
			 "HOST memory (%zu bytes, stride %zu) does not fit io_uring's buffer table",
			 o->host_len, o->host_stride);
		return 0;
	}
	n->host_chunk = per * o->host_stride;
	return (uint32_t)chunks;
}

/* Register the staging buffers and, when possible, the HOST memory (zero-copy) with the ring. */
static void
nvme_register(struct kvt_nvme *n, const struct kvt_nvme_opts *o)
{
	uint32_t nc = nvme_host_chunks(n, o);
	struct iovec *iov = malloc((size_t)(n->qd + nc) * sizeof *iov);
	struct rlimit rl;
	char eb[128];
	int r;

	if (!iov) {
		snprintf(n->zc_reason, sizeof n->zc_reason, "no memory for the buffer table");
		return;
	}
	for (uint32_t i = 0; i < n->qd; i++) {
		iov[i].iov_base = n->reqs[i].buf;
		iov[i].iov_len = n->slot_bytes;
	}
	for (uint32_t c = 0; c < nc; c++) {
		size_t off = (size_t)c * n->host_chunk;

		iov[n->qd + c].iov_base = (uint8_t *)o->host_base + off;
		iov[n->qd + c].iov_len = o->host_len - off < n->host_chunk ? o->host_len - off
									   : n->host_chunk;
	}
	r = nc && n->hooks.refuse_register ? -ENOMEM
		: nc ? io_uring_register_buffers(&n->ring, iov, n->qd + nc) : -1;
	if (r == 0) {
		n->fixed_bufs = true;
		n->host_base = o->host_base;
		n->host_len = o->host_len;
		n->host_stride = o->host_stride;
		n->host_off = o->host_data_off;
		n->zc_reason[0] = '\0';
		if (n->host_off) {
			n->room_busy = calloc((o->host_len / o->host_stride + 63) / 64, 8);
			if (!n->room_busy)
				n->host_off = 0; /* no room bookkeeping: two-piece puts, staged gets */
		}
	} else if (nc) {
		getrlimit(RLIMIT_MEMLOCK, &rl);
		snprintf(n->zc_reason, sizeof n->zc_reason,
			 "registering %zu bytes of HOST memory with io_uring failed: %s "
			 "(RLIMIT_MEMLOCK %llu bytes%s)", o->host_len,
			 nvme_strerror(-r, eb, sizeof eb), (unsigned long long)rl.rlim_cur,
			 n->hooks.refuse_register ? ", refused by a test hook" : "");
	}
	/* Staging alone: registered buffers save the kernel a page walk per IO. Optional: without
	 * them (memlock limits, buffers over 1 GiB) plain READ/WRITE do the same job. */
	if (r != 0)
		n->fixed_bufs = io_uring_register_buffers(&n->ring, iov, n->qd) == 0;
	free(iov);
}

static int
nvme_ring_init(struct kvt_nvme *n, const struct kvt_nvme_opts *o, char *err, size_t errlen)
{
	char eb[128];
	int r;

	r = io_uring_queue_init(n->qd, &n->ring, 0);
	if (r < 0)
		return nvme_open_fail(r, err, errlen, "nvme: io_uring_queue_init(%u): %s", n->qd,
				      nvme_strerror(-r, eb, sizeof eb));
	n->ring_ok = true;
	nvme_register(n, o);
	/* a registered file spares the kernel an fget/fput per IO; optional too */
	n->fixed_file = io_uring_register_files(&n->ring, &n->fd, 1) == 0;
	return 0;
}

/* Free everything of @n; the arena only if @free_arena (the kernel may still write it). */
static void
nvme_free(struct kvt_nvme *n, bool free_arena)
{
	if (n->ring_ok)
		io_uring_queue_exit(&n->ring);
	if (n->fd >= 0) {
		if (n->unlink_on_free) /* a store being created (a private file has no name) */
			unlink(n->path);
		close(n->fd); /* drops the flock too */
	}
	if (free_arena)
		free(n->arena);
	free(n->scratch);
	free(n->work_q);
	free(n->done_q);
	if (n->mu_ok) {
		pthread_mutex_destroy(&n->mu);
		pthread_cond_destroy(&n->work_cv);
	}
	free(n->reqs);
	free(n->free_stack);
	free(n->late_slots);
	free(n->late_bufs);
	free(n->room_busy);
	free(n->tag);
	free(n->lenc);
	free(n->path);
	free(n->final_path);
	free(n);
}

/* After the file is open: reserve its space and write (new) or check (existing) the superblock. */
static int
nvme_setup_file(struct kvt_nvme *n, const struct kvt_nvme_opts *o, char *err, size_t errlen)
{
	struct kvt_fmt_super want;
	bool fresh = !n->persist || n->unlink_on_free;
	int r = 0;

	nvme_super_want(n, o, &want);
	if (!n->buffered)
		r = nvme_check_dio(n, o->dir, err, errlen);
	if (r == 0 && fresh)
		r = nvme_reserve(n, err, errlen);
	if (r != 0)
		return r;
	if (!fresh) {
		r = nvme_super_load(n, &want, err, errlen);
		/* a store that matches gets its space reserved again (slots punched out after
		 * ENOSPC, or a copy made without it); one refused is never modified */
		return r ? r : nvme_reserve(n, err, errlen);
	}
	n->sb = want;
	n->sb.epoch = 1;
	n->sb.store_id = nvme_random64();
	r = nvme_super_write(n, n->persist, err, errlen);
	if (r == 0 && n->final_path) {
		char eb[128];
		int e;

		if (rename(n->path, n->final_path) != 0) {
			e = errno;
			return nvme_open_fail(-e, err, errlen, "nvme: rename %s: %s", n->path,
					      nvme_strerror(e, eb, sizeof eb));
		}
		free(n->path);
		n->path = n->final_path;
		n->final_path = NULL;
	}
	if (r == 0 && n->persist)
		kvt_fsync_dir(o->dir); /* the new file's entry durable before anything refers to it */
	return r;
}

int
kvt_nvme_open(const struct kvt_nvme_opts *o, struct kvt_nvme **out, char *err, size_t errlen)
{
	struct kvt_nvme *n;
	size_t slot_bytes = 0;
	uint32_t n_slots = 0;
	int r;

	if (err && errlen > 0)
		err[0] = '\0';
	if (!out)
		return nvme_open_fail(-EINVAL, err, errlen, "nvme: out is NULL");
	*out = NULL;
	r = nvme_validate(o, &slot_bytes, &n_slots, err, errlen);
	if (r == 0)
		r = nvme_check_dir(o->dir, err, errlen);
	if (r != 0)
		return r;
	n = calloc(1, sizeof *n);
	if (!n)
		return nvme_open_fail(-ENOMEM, err, errlen, "nvme: tier object");
	n->fd = -1;
	pthread_mutex_init(&n->mu, NULL);
	pthread_cond_init(&n->work_cv, NULL);
	n->mu_ok = true;
	n->block_bytes = o->block_bytes;
	n->slot_bytes = slot_bytes;
	n->n_slots = n_slots;
	n->qd = o->queue_depth;
	n->persist = o->persist;
	n->codec = o->codec;
	n->min_saving = o->min_saving;
	kvt_codec_geom_of_layout(&o->layout, &n->geom);
	if (o->hooks)
		n->hooks = *o->hooks;
	n->timeout_ns = (uint64_t)(n->hooks.io_timeout_ms ? n->hooks.io_timeout_ms
							  : KVT_NVME_IO_TIMEOUT_MS) * 1000000ull;
	r = nvme_create_file(n, o, err, errlen);
	if (r == 0)
		r = nvme_setup_file(n, o, err, errlen);
	if (r == 0)
		r = nvme_alloc_staging(n, err, errlen);
	if (r == 0)
		r = nvme_ring_init(n, o, err, errlen);
	if (r != 0) {
		nvme_free(n, true);
		return r;
	}
	n->unlink_on_free = false;
	/* checksums, the codec and verification run on worker threads when the ring can wait
	 * with a timeout without using the SQ (IORING_FEAT_EXT_ARG): the SQ is then shared with
	 * them under mu. Without (or when no thread starts) all of it runs inline. */
	if (o->workers && (n->ring.features & IORING_FEAT_EXT_ARG))
		(void)kvt_nvme_workers_start(n, o->workers);
	*out = n;
	return 0;
}

void
kvt_nvme_close(struct kvt_nvme *n)
{
	struct kvt_nvme_cqe sink[NVME_CLOSE_BATCH];
	bool drained = true;
	int r;

	if (!n)
		return;
	n->closing = true;
	/* retired requests' CQEs were consumed (only the fate hook loses them): their buffers are
	 * free of the kernel; abandoned ones may still be written by it */
	while (n->n_free + n->n_retired < n->qd) {
		r = kvt_nvme_reap(n, sink, NVME_CLOSE_BATCH, true);
		if (r > 0)
			continue;
		/* reap(wait) returns 0 only when the kernel holds nothing: the rest is stuck in
		 * the SQ (submit keeps failing), or the ring is broken (r < 0). */
		drained = false;
		kvt_err(r < 0 ? r : -EIO,
			"nvme close: %u IOs could not be waited for; staging buffers leaked",
			n->qd - n->n_free);
		break;
	}
	kvt_nvme_workers_stop(n);
	nvme_free(n, drained);
}
