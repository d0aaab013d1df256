/* SPDX-License-Identifier: MIT */
/*
 * tiers/tier_nvme.c - the NVME tier: one file of fixed-size slots, O_DIRECT, io_uring. The slot
 * layout and the contract are in tier_nvme.h.
 *
 * Life of an IO: submit_* takes a request context (with its staging buffer) off a free stack,
 * fills the staging buffer (writes) and queues one SQE whose user_data is the request. reap()
 * hands queued SQEs to the kernel, then takes CQEs one at a time; each CQE belongs to exactly one
 * request, which either finishes (one completion out, the request back on the free stack) or is
 * continued with a new SQE for its remaining bytes. A request thus owns at most one SQE or one
 * in-kernel IO at any time, so at most queue_depth CQEs are ever pending in a CQ of twice that.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <liburing.h>
#include <xxhash.h>

#include "engine/error.h"
#include "tiers/codec.h"
#include "tiers/format.h"
#include "tiers/tier_nvme.h"

#define NVME_ALIGN KVT_FMT_ALIGN   /* O_DIRECT alignment of offsets, lengths and buffers */
#define NVME_HDR KVT_FMT_BLKHDR_BYTES /* block header at the start of every slot */
#define NVME_MAX_QD 4096u          /* largest queue depth accepted */
#define NVME_MAX_BLOCK_BYTES (1u << 30) /* one IO's byte count must fit the int of a CQE */
#define NVME_CLOSE_BATCH 32u       /* completions discarded per reap while closing */
#define NVME_STORE_NAME "kvtier.store" /* the persistent store's file under dir */

/* Distinguishes the slot files of several tiers opened by one process. */
static atomic_uint nvme_file_counter;

/* One IO in flight; qd of them live in kvt_nvme.reqs, free ones on kvt_nvme.free_stack. */
struct nvme_req {
	uint8_t *buf;       /* staging buffer: slot_bytes, 4 KiB aligned, part of the arena */
	void *dst;          /* reads: the caller's buffer, written only after verification */
	uint64_t user_data; /* caller's tag, returned in the completion */
	uint64_t key;       /* writes: stored in the header; reads: expected there */
	uint32_t slot;      /* slot in the file */
	uint32_t len;       /* bytes this IO moves: header + payload rounded up to 4 KiB */
	uint32_t done;      /* bytes known transferred, a multiple of NVME_ALIGN */
	uint32_t stored;    /* writes: payload bytes written; reads: expected (0 = unknown) */
	uint32_t codec;     /* writes: codec of the payload */
	uint64_t sum;       /* writes: XXH3-64 of the raw block */
	uint32_t stalls;    /* consecutive pieces that did not reach the next 4 KiB boundary */
	uint32_t index;     /* position in reqs[], also the registered buffer index */
	bool is_write;      /* write (true) or read */
	bool busy;          /* taken off the free stack */
	uint8_t parked;     /* enum nvme_parked: where a request not in the kernel's hands is */
	int delayed_res;    /* NVME_DELAYED: the result to hand in later */
	uint64_t delay_gen; /* NVME_DELAYED: reap generation it was delayed in */
	uint64_t deadline;  /* ns (CLOCK_MONOTONIC) by which its current piece must complete */
	struct kvt_nvme_wmeta meta; /* writes handed to the encoder: the header's fields */
};

/* A busy request is in the SQ, in the kernel, or parked in one of these states. */
enum nvme_parked {
	NVME_ACTIVE = 0,    /* queued or in the kernel */
	NVME_DELAYED = 1,   /* its CQE was kept back by the fate hook: handed in at a later reap */
	NVME_LOST = 2,      /* its CQE was dropped by the fate hook: it will time out */
	NVME_ABANDONED = 3, /* timed out while the kernel holds it: recycled if its CQE comes */
	NVME_RETIRED = 4,   /* timed out after its CQE was lost: never used again */
	NVME_ENCODING = 5,  /* a write waiting for (or in) the encoder thread */
};

struct kvt_nvme {
	struct io_uring ring;              /* SQ of queue_depth entries, CQ of twice that */
	struct kvt_nvme_fault_hooks hooks; /* copy of the opts' hooks; zeroed when none */
	char *path;                        /* slot file path; owned */
	int fd;                            /* slot file, O_DIRECT; -1 while not open */
	bool ring_ok;                      /* ring initialised (io_uring_queue_exit needed) */
	bool fixed_bufs;                   /* staging registered: READ_FIXED / WRITE_FIXED */
	bool fixed_file;                   /* the file registered: IOSQE_FIXED_FILE, index 0 */
	bool closing;                      /* kvt_nvme_close is draining: discard, never copy */
	bool persist;                      /* the file is the persistent store: kept at close */
	bool unlink_on_free;               /* created by this open: removed if the open fails */
	bool buffered;                     /* O_DIRECT refused, buffered IO asked for instead */
	int codec;                         /* enum kvt_codec of writes */
	double min_saving;                 /* encode kept only when it saves this fraction */
	size_t elem;                       /* element size of the layout, for the shuffles */
	uint8_t *scratch;                  /* codec scratch: block_bytes (engine lock held) */
	uint8_t *enc;                      /* codec output: block_bytes */
	struct kvt_fmt_super sb;           /* the superblock as written/read at open */
	size_t block_bytes;                /* bytes of one block */
	size_t slot_bytes;                 /* bytes of one slot in the file */
	uint32_t n_slots;                  /* slots in the file */
	uint32_t qd;                       /* queue depth: requests and staging buffers */
	uint32_t n_free;                   /* entries of free_stack in use */
	uint32_t queued;                   /* SQEs prepared but not yet taken by the kernel */
	uint32_t n_parked;                 /* busy requests not in the kernel: DELAYED, LOST,
	                                      RETIRED */
	uint32_t n_delayed;                /* of those, DELAYED */
	uint32_t n_lost;                   /* of those, LOST */
	uint32_t n_retired;                /* of those, RETIRED */
	uint32_t n_abandoned;              /* busy requests ABANDONED (still in the kernel) */
	uint64_t reap_gen;                 /* kvt_nvme_reap calls so far */
	/* The encoder thread (codec on): writes are copied to staging at submit, encoded there by
	 * the thread, which then queues and submits their SQEs. mu guards the SQ, queued,
	 * n_encoding, the encode queue and every request's fields between the two threads; the
	 * engine thread holds it while it submits or reaps (not while it waits). */
	pthread_mutex_t mu;                /* see above */
	bool mu_ok;                        /* mu initialised */
	pthread_cond_t enc_cv;             /* signalled when enc_q gets work or enc_stop is set */
	bool enc_on;                       /* the encoder thread runs */
	bool enc_stop;                     /* asks it to exit */
	pthread_t enc_thr;                 /* the thread */
	uint32_t *enc_q;                   /* [qd] ring of request indices to encode */
	uint32_t enc_head, enc_n;          /* ring head and length */
	uint32_t n_encoding;               /* busy requests NVME_ENCODING */
	uint8_t *dscratch;                 /* decode scratch (reaping thread) */
	uint64_t timeout_ns;               /* IO piece deadline */
	uint32_t *free_stack;              /* [qd] indices of free requests */
	struct nvme_req *reqs;             /* [qd] request contexts */
	uint8_t *arena;                    /* [qd][slot_bytes] staging, 4 KiB aligned */
};

static void *nvme_enc_main(void *arg);
static int nvme_submit_read_locked(struct kvt_nvme *n, uint32_t slot, void *dst, uint64_t key,
				   uint32_t stored, uint64_t user_data);

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

/* Thread-safe strerror (the GNU strerror_r, which may return a static string). */
static const char *
nvme_strerror(int e, char *buf, size_t len)
{
	return strerror_r(e, buf, len);
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
	if (o->queue_depth == 0 || o->queue_depth > NVME_MAX_QD)
		return nvme_open_fail(-EINVAL, err, errlen, "nvme queue_depth %u out of range 1..%u",
				      o->queue_depth, NVME_MAX_QD);
	if (o->codec < KVT_CODEC_NONE || o->codec > KVT_CODEC_BYTE_LZ4)
		return nvme_open_fail(-EINVAL, err, errlen, "nvme codec %d unknown", o->codec);
	if (!(o->min_saving >= 0 && o->min_saving < 1))
		return nvme_open_fail(-EINVAL, err, errlen, "nvme codec min_saving %g not in [0, 1)",
				      o->min_saving);
	sb = (o->block_bytes + NVME_HDR + NVME_ALIGN - 1) & ~(size_t)(NVME_ALIGN - 1);
	slots = o->capacity_bytes / sb;
	if (slots == 0)
		return nvme_open_fail(-EINVAL, err, errlen,
				      "nvme capacity %llu bytes is below one slot of %zu bytes "
				      "(block_bytes %zu + 128-byte header, rounded up to 4 KiB)",
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
				      "filesystem at %s refuses O_DIRECT (set nvme_buffered_fallback "
				      "to use buffered IO there)", dir);
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
			fd = nvme_open_path(n, O_CREAT | O_EXCL, o->buffered_fallback);
			e = fd < 0 ? errno : 0;
			n->unlink_on_free = fd >= 0 || e == EINVAL;
		}
	}
	/* EEXIST only when a crashed process with our pid left its file behind: take the next. */
	for (int attempt = 0; !n->persist && attempt < 16 && e == EEXIST; attempt++) {
		snprintf(n->path, len, "%s/kvtier-%ld-%u.slots", dir, (long)getpid(),
			 atomic_fetch_add(&nvme_file_counter, 1u));
		fd = nvme_open_path(n, O_CREAT | O_EXCL, o->buffered_fallback);
		e = fd < 0 ? errno : 0;
	}
	if (fd < 0)
		return nvme_create_fail(n, e, dir, err, errlen);
	n->fd = fd;
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
	s->data_off = KVT_FMT_SUPER_BYTES;
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
	return 0;
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
	uint64_t size = KVT_FMT_SUPER_BYTES + (uint64_t)n->n_slots * n->slot_bytes;
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

	if (posix_memalign(&arena, NVME_ALIGN, arena_bytes) != 0)
		return nvme_open_fail(-ENOMEM, err, errlen, "nvme: %zu bytes of staging buffers",
				      arena_bytes);
	n->arena = arena;
	if (n->codec != KVT_CODEC_NONE) {
		n->scratch = malloc(kvt_codec_scratch_bytes(n->block_bytes));
		n->enc = malloc(n->block_bytes);
		if (!n->scratch || !n->enc)
			return nvme_open_fail(-ENOMEM, err, errlen, "nvme: codec buffers");
	}
	n->enc_q = malloc((size_t)n->qd * sizeof *n->enc_q);
	if (!n->enc_q)
		return nvme_open_fail(-ENOMEM, err, errlen, "nvme: encode queue");
	n->reqs = calloc(n->qd, sizeof *n->reqs);
	n->free_stack = malloc((size_t)n->qd * sizeof *n->free_stack);
	if (!n->reqs || !n->free_stack)
		return nvme_open_fail(-ENOMEM, err, errlen, "nvme: %u request contexts", n->qd);
	for (uint32_t i = 0; i < n->qd; i++) {
		n->reqs[i].buf = n->arena + (size_t)i * n->slot_bytes;
		n->reqs[i].index = i;
		n->free_stack[i] = n->qd - 1 - i;
	}
	n->n_free = n->qd;
	return 0;
}

static int
nvme_ring_init(struct kvt_nvme *n, char *err, size_t errlen)
{
	struct iovec *iov;
	char eb[128];
	int r;

	r = io_uring_queue_init(n->qd, &n->ring, 0);
	if (r < 0)
		return nvme_open_fail(r, err, errlen, "nvme: io_uring_queue_init(%u): %s", n->qd,
				      nvme_strerror(-r, eb, sizeof eb));
	n->ring_ok = true;
	/* Registered buffers save the kernel a page walk per IO. Optional: without them (memlock
	 * limits, buffers over 1 GiB) plain READ/WRITE do the same job. */
	iov = malloc((size_t)n->qd * sizeof *iov);
	if (!iov)
		return 0;
	for (uint32_t i = 0; i < n->qd; i++) {
		iov[i].iov_base = n->reqs[i].buf;
		iov[i].iov_len = n->slot_bytes;
	}
	n->fixed_bufs = io_uring_register_buffers(&n->ring, iov, n->qd) == 0;
	free(iov);
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
		if (!n->persist || n->unlink_on_free)
			unlink(n->path);
		close(n->fd); /* drops the flock too */
	}
	if (free_arena)
		free(n->arena);
	free(n->scratch);
	free(n->enc);
	free(n->dscratch);
	free(n->enc_q);
	if (n->mu_ok) {
		pthread_mutex_destroy(&n->mu);
		pthread_cond_destroy(&n->enc_cv);
	}
	free(n->reqs);
	free(n->free_stack);
	free(n->path);
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
	if (!fresh)
		return nvme_super_load(n, &want, err, errlen);
	n->sb = want;
	n->sb.epoch = 1;
	n->sb.store_id = nvme_random64();
	r = nvme_super_write(n, n->persist, err, errlen);
	if (r == 0 && n->persist) {
		/* the new file's directory entry must be durable before anything refers to it */
		int dfd = open(o->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

		if (dfd >= 0) {
			(void)fsync(dfd);
			close(dfd);
		}
	}
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
	pthread_cond_init(&n->enc_cv, NULL);
	n->mu_ok = true;
	n->block_bytes = o->block_bytes;
	n->slot_bytes = slot_bytes;
	n->n_slots = n_slots;
	n->qd = o->queue_depth;
	n->persist = o->persist;
	n->codec = o->codec;
	n->min_saving = o->min_saving;
	n->elem = kvt_dtype_size(o->layout.dtype);
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
		r = nvme_ring_init(n, err, errlen);
	if (r != 0) {
		nvme_free(n, true);
		return r;
	}
	n->unlink_on_free = false;
	/* the codec runs on a thread of its own when the ring can wait with a timeout without
	 * using the SQ (IORING_FEAT_EXT_ARG): the SQ is then shared with that thread under mu */
	if (n->codec != KVT_CODEC_NONE && (n->ring.features & IORING_FEAT_EXT_ARG))
		n->enc_on = pthread_create(&n->enc_thr, NULL, nvme_enc_main, n) == 0;
	*out = n;
	return 0;
}

/* ---- submission ---------------------------------------------------------------------------- */

/* io_uring_submit the queued SQEs. Returns the number taken by the kernel or -errno. */
static int
nvme_flush(struct kvt_nvme *n)
{
	int r;

	if (n->queued == 0)
		return 0;
	r = io_uring_submit(&n->ring);
	if (r < 0)
		return r;
	n->queued -= (uint32_t)r < n->queued ? (uint32_t)r : n->queued;
	return r;
}

/* Like nvme_flush, but a transient refusal (retried at the next flush) is not an error. */
static int
nvme_flush_soft(struct kvt_nvme *n)
{
	char eb[128];
	int r = nvme_flush(n);

	if (r == -EAGAIN || r == -EBUSY || r == -EINTR)
		return 0;
	if (r < 0)
		return kvt_err(r, "nvme: io_uring_submit: %s", nvme_strerror(-r, eb, sizeof eb));
	return r;
}

/* IOs the kernel holds: requests in use whose SQE it has taken. Only these can complete. */
static uint32_t
nvme_in_kernel(const struct kvt_nvme *n)
{
	return n->qd - n->n_free - n->queued - n->n_parked - n->n_encoding;
}

static uint64_t
nvme_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Queue one SQE for the rest of @req's IO: bytes [done, len) of its slot. */
static int
nvme_queue_rest(struct kvt_nvme *n, struct nvme_req *req)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&n->ring);
	uint8_t *buf = req->buf + req->done;
	unsigned len = req->len - req->done;
	uint64_t off = KVT_FMT_SUPER_BYTES + (uint64_t)req->slot * n->slot_bytes + req->done;
	int fd = n->fixed_file ? 0 : n->fd;

	if (!sqe) {
		/* Not expected: every request owns at most one SQE and the SQ has qd entries. */
		(void)nvme_flush(n);
		sqe = io_uring_get_sqe(&n->ring);
		if (!sqe)
			return kvt_err(-EAGAIN, "nvme: submission queue full");
	}
	if (req->is_write && n->fixed_bufs)
		io_uring_prep_write_fixed(sqe, fd, buf, len, off, (int)req->index);
	else if (req->is_write)
		io_uring_prep_write(sqe, fd, buf, len, off);
	else if (n->fixed_bufs)
		io_uring_prep_read_fixed(sqe, fd, buf, len, off, (int)req->index);
	else
		io_uring_prep_read(sqe, fd, buf, len, off);
	if (n->fixed_file)
		io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE);
	io_uring_sqe_set_data(sqe, req);
	req->deadline = nvme_now_ns() + n->timeout_ns;
	n->queued++;
	return 0;
}

/* Validate a submit and take a free request. Returns 0 with *reqp set, or a negative code. */
static int
nvme_req_get(struct kvt_nvme *n, uint32_t slot, const void *buf, const char *what,
	     struct nvme_req **reqp)
{
	struct nvme_req *req;

	if (!n || !buf)
		return kvt_err(-EINVAL, "nvme %s: %s is NULL", what, n ? "buffer" : "tier");
	if (slot >= n->n_slots)
		return kvt_err(-EINVAL, "nvme %s: slot %u out of range (%u slots)", what, slot,
			       n->n_slots);
	if (n->n_free == 0 && kvt_nvme_inflight(n) == 0)
		return kvt_err(-EIO, "nvme %s: every staging buffer is held by an IO that timed out",
			       what);
	if (n->n_free == 0)
		return kvt_err(-EAGAIN, "nvme %s: all %u staging buffers busy; reap first", what,
			       n->qd);
	req = &n->reqs[n->free_stack[--n->n_free]];
	req->busy = true;
	req->parked = NVME_ACTIVE;
	req->slot = slot;
	req->done = 0;
	req->stalls = 0;
	req->dst = NULL;
	*reqp = req;
	return 0;
}

static void
nvme_req_put(struct kvt_nvme *n, struct nvme_req *req)
{
	req->busy = false;
	n->free_stack[n->n_free++] = req->index;
}

static uint32_t
nvme_io_len(const struct kvt_nvme *n, uint32_t stored)
{
	size_t l = (NVME_HDR + (size_t)stored + NVME_ALIGN - 1) & ~(size_t)(NVME_ALIGN - 1);

	return (uint32_t)(l < n->slot_bytes ? l : n->slot_bytes);
}

/*
 * Fill @req's staging buffer: the block (encoded when that pays) after the header, zero padding
 * to the IO length, and the header. Sets req->len, stored, codec, sum.
 */
/*
 * Fill @req's staging buffer: the block @raw (encoded when that pays) after the header, zero
 * padding to the IO length, and the header. @raw may be the staging buffer's payload area itself
 * (encoder thread); then @encbuf (block_bytes) receives the encoding first. Sets req->len, stored,
 * codec, sum.
 */
static void
nvme_seal(struct kvt_nvme *n, struct nvme_req *req, const void *raw,
	  const struct kvt_nvme_wmeta *m, uint8_t *scratch, uint8_t *encbuf)
{
	uint8_t *payload = req->buf + NVME_HDR;
	uint8_t *eout = raw == payload ? encbuf : payload;
	struct kvt_fmt_blkhdr h;
	int64_t enc = 0;

	memset(&h, 0, sizeof h);
	h.sum = XXH3_64bits(raw, n->block_bytes);
	if (n->codec != KVT_CODEC_NONE)
		enc = kvt_codec_encode(n->codec, n->elem, raw, n->block_bytes, eout, n->block_bytes,
				       scratch, n->min_saving);
	if (enc > 0) {
		if (eout != payload)
			memcpy(payload, eout, (size_t)enc);
		h.codec = (uint32_t)n->codec;
		h.stored_len = (uint32_t)enc;
	} else {
		if (raw != payload)
			memcpy(payload, raw, n->block_bytes);
		h.codec = KVT_CODEC_NONE;
		h.stored_len = (uint32_t)n->block_bytes;
	}
	req->len = nvme_io_len(n, h.stored_len);
	memset(payload + h.stored_len, 0, req->len - NVME_HDR - h.stored_len);
	h.slot = req->slot;
	h.key = m->key;
	h.session = m->session;
	h.index = m->index;
	h.raw_len = (uint32_t)n->block_bytes;
	memcpy(h.hash, m->hash, sizeof h.hash);
	kvt_fmt_blkhdr_encode(&h, req->buf);
	req->stored = h.stored_len;
	req->codec = h.codec;
	req->sum = h.sum;
}

/* Wake a reaper blocked in the CQ wait (a NOP completes at once; its CQE carries no request). */
static void
nvme_poke(struct kvt_nvme *n)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&n->ring);

	if (!sqe)
		return;
	io_uring_prep_nop(sqe);
	io_uring_sqe_set_data(sqe, NULL);
	n->queued++;
	(void)nvme_flush(n);
}

/* The encoder thread: encode queued writes in their staging buffers, then queue and submit. */
static void *
nvme_enc_main(void *arg)
{
	struct kvt_nvme *n = arg;

	pthread_mutex_lock(&n->mu);
	for (;;) {
		struct nvme_req *req;
		int r;

		while (!n->enc_n && !n->enc_stop)
			pthread_cond_wait(&n->enc_cv, &n->mu);
		if (!n->enc_n)
			break;
		req = &n->reqs[n->enc_q[n->enc_head]];
		n->enc_head = (n->enc_head + 1) % n->qd;
		n->enc_n--;
		pthread_mutex_unlock(&n->mu);
		nvme_seal(n, req, req->buf + NVME_HDR, &req->meta, n->scratch, n->enc);
		pthread_mutex_lock(&n->mu);
		n->n_encoding--;
		req->parked = NVME_ACTIVE;
		r = nvme_queue_rest(n, req);
		if (r == 0) {
			(void)nvme_flush(n); /* a refusal is retried by the next reap's flush */
			continue;
		}
		/* no SQE (not expected): complete it with the error through the delayed path */
		req->parked = NVME_DELAYED;
		req->delayed_res = r;
		req->delay_gen = 0;
		n->n_parked++;
		n->n_delayed++;
		nvme_poke(n);
	}
	pthread_mutex_unlock(&n->mu);
	return NULL;
}

static int
nvme_submit_write_locked(struct kvt_nvme *n, uint32_t slot, const void *src,
			 const struct kvt_nvme_wmeta *m, uint64_t user_data)
{
	struct nvme_req *req;
	int r;

	if (!m)
		return kvt_err(-EINVAL, "nvme write: meta is NULL");
	r = nvme_req_get(n, slot, src, "write", &req);
	if (r != 0)
		return r;
	req->is_write = true;
	req->key = m->key;
	req->user_data = user_data;
	if (n->enc_on) {
		/* copy now (the caller's buffer may change at once), encode on the thread */
		memcpy(req->buf + NVME_HDR, src, n->block_bytes);
		req->meta = *m;
		req->parked = NVME_ENCODING;
		n->n_encoding++;
		n->enc_q[(n->enc_head + n->enc_n++) % n->qd] = req->index;
		pthread_cond_signal(&n->enc_cv);
		return 0;
	}
	nvme_seal(n, req, src, m, n->scratch, NULL);
	r = nvme_queue_rest(n, req);
	if (r != 0)
		nvme_req_put(n, req);
	return r;
}

int
kvt_nvme_submit_write_meta(struct kvt_nvme *n, uint32_t slot, const void *src,
			   const struct kvt_nvme_wmeta *m, uint64_t user_data)
{
	int r;

	if (!n)
		return kvt_err(-EINVAL, "nvme write: tier is NULL");
	pthread_mutex_lock(&n->mu);
	r = nvme_submit_write_locked(n, slot, src, m, user_data);
	pthread_mutex_unlock(&n->mu);
	return r;
}

int
kvt_nvme_submit_read_len(struct kvt_nvme *n, uint32_t slot, void *dst, uint64_t key,
			 uint32_t stored, uint64_t user_data)
{
	int r;

	if (!n)
		return kvt_err(-EINVAL, "nvme read: tier is NULL");
	pthread_mutex_lock(&n->mu);
	r = nvme_submit_read_locked(n, slot, dst, key, stored, user_data);
	pthread_mutex_unlock(&n->mu);
	return r;
}

int
kvt_nvme_submit_write(struct kvt_nvme *n, uint32_t slot, const void *src, uint64_t key,
		      uint64_t user_data)
{
	struct kvt_nvme_wmeta m = { .key = key };

	return kvt_nvme_submit_write_meta(n, slot, src, &m, user_data);
}

static int
nvme_submit_read_locked(struct kvt_nvme *n, uint32_t slot, void *dst, uint64_t key,
			uint32_t stored, uint64_t user_data)
{
	struct nvme_req *req;
	int r = nvme_req_get(n, slot, dst, "read", &req);

	if (r != 0)
		return r;
	req->is_write = false;
	req->key = key;
	req->user_data = user_data;
	req->dst = dst;
	req->stored = stored;
	req->len = stored ? nvme_io_len(n, stored) : (uint32_t)n->slot_bytes;
	r = nvme_queue_rest(n, req);
	if (r != 0)
		nvme_req_put(n, req);
	return r;
}

int
kvt_nvme_submit_read(struct kvt_nvme *n, uint32_t slot, void *dst, uint64_t key,
		     uint64_t user_data)
{
	return kvt_nvme_submit_read_len(n, slot, dst, key, 0, user_data);
}

int
kvt_nvme_flush(struct kvt_nvme *n)
{
	char eb[128];
	int r;

	if (!n)
		return kvt_err(-EINVAL, "nvme flush: tier is NULL");
	pthread_mutex_lock(&n->mu);
	r = nvme_flush(n);
	pthread_mutex_unlock(&n->mu);
	if (r < 0)
		return kvt_err(r, "nvme: io_uring_submit: %s", nvme_strerror(-r, eb, sizeof eb));
	return r;
}

/* ---- completion ---------------------------------------------------------------------------- */

/*
 * Check a fully read staging buffer: its header, then the payload decoded into the caller's
 * buffer (raw payloads are checked in the staging buffer first). Returns 0 or KVT_ECORRUPT.
 */
static int
nvme_verify(struct kvt_nvme *n, const struct nvme_req *req)
{
	struct kvt_fmt_blkhdr h;
	uint32_t slot = req->slot;
	int rc = kvt_fmt_blkhdr_decode(req->buf, req->len, &h);

	if (rc != 0)
		return kvt_err(KVT_ECORRUPT, "nvme slot %u: %s", slot, kvt_last_error_message());
	if (h.slot != slot)
		return kvt_err(KVT_ECORRUPT, "nvme slot %u: holds a block written to slot %u",
			       slot, h.slot);
	if (h.raw_len != n->block_bytes)
		return kvt_err(KVT_ECORRUPT, "nvme slot %u: block_bytes %u, expected %zu", slot,
			       h.raw_len, n->block_bytes);
	if (h.key != req->key)
		return kvt_err(KVT_ECORRUPT, "nvme slot %u: key %#llx, expected %#llx", slot,
			       (unsigned long long)h.key, (unsigned long long)req->key);
	if ((req->stored && h.stored_len != req->stored) ||
	    NVME_HDR + (size_t)h.stored_len > req->len)
		return kvt_err(KVT_ECORRUPT, "nvme slot %u: %u bytes stored, %u expected", slot,
			       h.stored_len, req->stored);
	if (h.codec == KVT_CODEC_NONE) {
		if (XXH3_64bits(req->buf + NVME_HDR, n->block_bytes) != h.sum)
			return kvt_err(KVT_ECORRUPT, "nvme slot %u: data checksum mismatch", slot);
		memcpy(req->dst, req->buf + NVME_HDR, n->block_bytes);
		return 0;
	}
	if (!n->dscratch && !(n->dscratch = malloc(kvt_codec_scratch_bytes(n->block_bytes))))
		return kvt_err(-ENOMEM, "nvme slot %u: codec scratch", slot);
	rc = kvt_codec_decode((int)h.codec, n->elem, req->buf + NVME_HDR, h.stored_len, req->dst,
			      n->block_bytes, n->dscratch);
	if (rc != 0)
		return kvt_err(KVT_ECORRUPT, "nvme slot %u: %s", slot, kvt_last_error_message());
	if (XXH3_64bits(req->dst, n->block_bytes) != h.sum)
		return kvt_err(KVT_ECORRUPT, "nvme slot %u: data checksum mismatch after decoding",
			       slot);
	return 0;
}

/*
 * A piece of @req's IO moved @got bytes, fewer than asked. Continue from the last 4 KiB
 * boundary reached (O_DIRECT needs aligned offsets). Returns 0 when a new SQE is queued, or the
 * code to complete @req with.
 */
static int
nvme_continue(struct kvt_nvme *n, struct nvme_req *req, size_t got)
{
	const char *what = req->is_write ? "write" : "read";
	size_t reached = (req->done + got) & ~(size_t)(NVME_ALIGN - 1);

	if (got == 0)
		return kvt_err(KVT_ESHORTIO, "nvme %s of slot %u: no progress at byte %u of %u",
			       what, req->slot, req->done, req->len);
	if (n->closing)
		return kvt_err(KVT_ESHORTIO, "nvme %s of slot %u: short while closing", what,
			       req->slot);
	if (reached == req->done) {
		if (++req->stalls > KVT_NVME_MAX_STALLS)
			return kvt_err(KVT_ESHORTIO,
				       "nvme %s of slot %u: stuck at byte %u of %u after %u retries",
				       what, req->slot, req->done, req->len, req->stalls - 1);
	} else {
		req->stalls = 0;
		req->done = (uint32_t)reached;
	}
	return nvme_queue_rest(n, req);
}

/*
 * Interpret one CQE of @req with result @res. Returns 1 when @req finished (*c filled, @req back
 * on the free stack), 0 when it was continued with a new SQE.
 */
static int
nvme_complete(struct kvt_nvme *n, struct nvme_req *req, int res, struct kvt_nvme_cqe *c)
{
	size_t left = req->len - req->done;
	uint64_t off = KVT_FMT_SUPER_BYTES + (uint64_t)req->slot * n->slot_bytes + req->done;
	char eb[128];

	if (n->hooks.on_complete)
		n->hooks.on_complete(n->hooks.arg, req->is_write, req->slot, req->buf + req->done,
				     left, off, &res);
	if (res < 0) {
		kvt_err(res, "nvme %s of slot %u: %s", req->is_write ? "write" : "read", req->slot,
			nvme_strerror(-res, eb, sizeof eb));
	} else if ((size_t)res < left) {
		res = nvme_continue(n, req, (size_t)res);
		if (res == 0)
			return 0;
	} else if ((size_t)res > left) {
		res = kvt_err(-EIO, "nvme slot %u: %d bytes done of %zu asked", req->slot, res,
			      left);
	} else if (req->is_write || n->closing) {
		res = 0;
	} else {
		res = nvme_verify(n, req);
	}
	c->user_data = req->user_data;
	c->stored = req->is_write ? req->stored : 0;
	c->codec = req->is_write ? req->codec : 0;
	c->sum = req->is_write ? req->sum : 0;
	c->res = res;
	c->is_write = req->is_write;
	c->slot = req->slot;
	nvme_req_put(n, req);
	return 1;
}

/* Fill @c for a completion of @req with @res (no verification: failures and timeouts). */
static void
nvme_fill(const struct nvme_req *req, int res, struct kvt_nvme_cqe *c)
{
	memset(c, 0, sizeof *c);
	c->user_data = req->user_data;
	c->res = res;
	c->is_write = req->is_write;
	c->slot = req->slot;
}

/*
 * One CQE of @req arrived: recycle an abandoned request, apply the fate hook (lose, delay), or
 * interpret it. Returns the completions written to @c (0 or 1).
 */
static int
nvme_cqe(struct kvt_nvme *n, struct nvme_req *req, int res, struct kvt_nvme_cqe *c)
{
	int fate;

	if (req->parked == NVME_ABANDONED) {
		/* its timeout was reported long ago: the buffer is the kernel's no more */
		n->n_abandoned--;
		req->parked = NVME_ACTIVE;
		nvme_req_put(n, req);
		return 0;
	}
	fate = n->hooks.fate ? n->hooks.fate(n->hooks.arg, req->is_write, req->slot) : 0;
	if (fate == KVT_NVME_FATE_LOSE) {
		req->parked = NVME_LOST;
		n->n_parked++;
		n->n_lost++;
		return 0;
	}
	if (fate == KVT_NVME_FATE_DELAY) {
		req->parked = NVME_DELAYED;
		req->delayed_res = res;
		req->delay_gen = n->reap_gen;
		n->n_parked++;
		n->n_delayed++;
		return 0;
	}
	return nvme_complete(n, req, res, c);
}

/* Hand in delayed CQEs (those kept back before this reap, or all with @all). */
static uint32_t
nvme_deliver_delayed(struct kvt_nvme *n, struct kvt_nvme_cqe *out, uint32_t max, bool all)
{
	uint32_t got = 0;

	for (uint32_t i = 0; i < n->qd && n->n_delayed && got < max; i++) {
		struct nvme_req *req = &n->reqs[i];

		if (!req->busy || req->parked != NVME_DELAYED ||
		    (!all && req->delay_gen >= n->reap_gen))
			continue;
		req->parked = NVME_ACTIVE;
		n->n_parked--;
		n->n_delayed--;
		got += (uint32_t)nvme_complete(n, req, req->delayed_res, &out[got]);
	}
	return got;
}

/* Time out IO pieces past their deadline (only while nothing waits in the SQ). */
static uint32_t
nvme_expire(struct kvt_nvme *n, struct kvt_nvme_cqe *out, uint32_t max)
{
	uint64_t now = nvme_now_ns();
	uint32_t got = 0;

	for (uint32_t i = 0; i < n->qd && n->queued == 0 && got < max; i++) {
		struct nvme_req *req = &n->reqs[i];

		if (!req->busy || req->deadline > now ||
		    (req->parked != NVME_ACTIVE && req->parked != NVME_LOST))
			continue;
		kvt_err(-ETIMEDOUT, "nvme %s of slot %u: no completion within %llu ms",
			req->is_write ? "write" : "read", req->slot,
			(unsigned long long)(n->timeout_ns / 1000000));
		nvme_fill(req, -ETIMEDOUT, &out[got++]);
		if (req->parked == NVME_LOST) {
			n->n_lost--;
			n->n_retired++;
			req->parked = NVME_RETIRED; /* stays counted in n_parked */
		} else {
			n->n_abandoned++;
			req->parked = NVME_ABANDONED;
		}
	}
	return got;
}

/* How long a waiting reap may sleep: until the earliest deadline of an IO that can time out. */
static void
nvme_wait_span(const struct kvt_nvme *n, struct __kernel_timespec *ts)
{
	uint64_t now = nvme_now_ns(), first = UINT64_MAX, d;

	for (uint32_t i = 0; i < n->qd; i++) {
		const struct nvme_req *req = &n->reqs[i];

		if (req->busy && (req->parked == NVME_ACTIVE || req->parked == NVME_LOST) &&
		    req->deadline < first)
			first = req->deadline;
	}
	d = first == UINT64_MAX ? n->timeout_ns : first > now ? first - now : 0;
	if (n->n_delayed && d > 1000000)
		d = 1000000; /* an encoder failure parked one: hand it in soon */
	if (d < 1000000)
		d = 1000000; /* at least 1 ms */
	ts->tv_sec = (long long)(d / 1000000000ull);
	ts->tv_nsec = (long long)(d % 1000000000ull);
}

/* Whether a waiting reap has anything to wait for (a CQE that can come, or a deadline). */
static bool
nvme_waitable(const struct kvt_nvme *n)
{
	return nvme_in_kernel(n) > n->n_abandoned || n->n_lost > 0 || n->n_encoding > 0 ||
	       n->n_delayed > 0;
}

static int
nvme_reap_locked(struct kvt_nvme *n, struct kvt_nvme_cqe *out, uint32_t max, bool wait)
{
	struct __kernel_timespec ts;
	struct io_uring_cqe *cqe;
	struct nvme_req *req;
	uint32_t got = 0;
	char eb[128];
	int r, res;

	r = nvme_flush_soft(n);
	if (r < 0)
		return r;
	if (n->n_delayed)
		got += nvme_deliver_delayed(n, out, max, false);
	n->reap_gen++;
	while (got < max) {
		r = io_uring_peek_cqe(&n->ring, &cqe);
		if (r == -EAGAIN) {
			/* Nothing ready: time out what is overdue; block only if asked to, nothing
			 * was reaped yet, and an IO can still complete or time out. */
			got += nvme_expire(n, out + got, max - got);
			if (wait && got == 0 && n->n_delayed)
				got += nvme_deliver_delayed(n, out, max, true);
			if (!wait || got > 0 || !nvme_waitable(n))
				break;
			nvme_wait_span(n, &ts);
			/* the encoder thread may submit meanwhile: never wait holding mu */
			pthread_mutex_unlock(&n->mu);
			r = io_uring_wait_cqe_timeout(&n->ring, &cqe, &ts);
			pthread_mutex_lock(&n->mu);
			if (r == -EINTR || r == -ETIME)
				continue;
		}
		if (r < 0) {
			if (got > 0)
				break;
			return kvt_err(r, "nvme: io_uring wait: %s",
				       nvme_strerror(-r, eb, sizeof eb));
		}
		req = io_uring_cqe_get_data(cqe);
		res = cqe->res;
		io_uring_cqe_seen(&n->ring, cqe);
		if (!req)
			continue;
		got += (uint32_t)nvme_cqe(n, req, res, &out[got]);
		/* A continued short IO queued an SQE: hand it over before we may wait. */
		r = nvme_flush_soft(n);
		if (r < 0)
			return got > 0 ? (int)got : r;
	}
	return (int)got;
}

int
kvt_nvme_reap(struct kvt_nvme *n, struct kvt_nvme_cqe *out, uint32_t max, bool wait)
{
	int r;

	if (!n || (!out && max > 0))
		return kvt_err(-EINVAL, "nvme reap: %s is NULL", n ? "out" : "tier");
	pthread_mutex_lock(&n->mu);
	r = nvme_reap_locked(n, out, max, wait);
	pthread_mutex_unlock(&n->mu);
	return r;
}

/* Stop and join the encoder thread (its queue is empty once all IO has completed). */
static void
nvme_enc_stop(struct kvt_nvme *n)
{
	if (!n->enc_on)
		return;
	pthread_mutex_lock(&n->mu);
	n->enc_stop = true;
	pthread_cond_signal(&n->enc_cv);
	pthread_mutex_unlock(&n->mu);
	pthread_join(n->enc_thr, NULL);
	n->enc_on = false;
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
	nvme_enc_stop(n);
	nvme_free(n, drained);
}

/* ---- accessors ----------------------------------------------------------------------------- */

uint32_t
kvt_nvme_n_slots(const struct kvt_nvme *n)
{
	return n->n_slots;
}

size_t
kvt_nvme_slot_bytes(const struct kvt_nvme *n)
{
	return n->slot_bytes;
}

uint32_t
kvt_nvme_inflight(const struct kvt_nvme *n)
{
	return n->qd - n->n_free - n->n_retired - n->n_abandoned;
}

uint32_t
kvt_nvme_free_qd(const struct kvt_nvme *n)
{
	return n->n_free;
}

const char *
kvt_nvme_path(const struct kvt_nvme *n)
{
	return n->path;
}

uint64_t
kvt_nvme_epoch(const struct kvt_nvme *n)
{
	return n->sb.epoch;
}

uint64_t
kvt_nvme_store_id(const struct kvt_nvme *n)
{
	return n->sb.store_id;
}

bool
kvt_nvme_buffered(const struct kvt_nvme *n)
{
	return n->buffered;
}

bool
kvt_nvme_persistent(const struct kvt_nvme *n)
{
	return n->persist;
}

int
kvt_nvme_sync(struct kvt_nvme *n)
{
	char eb[128];
	int e;

	if (fdatasync(n->fd) == 0)
		return 0;
	e = errno;
	return kvt_err(-e, "nvme: fdatasync %s: %s", n->path, nvme_strerror(e, eb, sizeof eb));
}

int
kvt_nvme_read_header(struct kvt_nvme *n, uint32_t slot, struct kvt_fmt_blkhdr *h)
{
	uint64_t off = KVT_FMT_SUPER_BYTES + (uint64_t)slot * n->slot_bytes;
	void *buf = NULL;
	char eb[128];
	ssize_t r;
	int e, rc;

	if (slot >= n->n_slots)
		return kvt_err(KVT_ECORRUPT, "nvme: slot %u out of range (%u slots)", slot,
			       n->n_slots);
	if (posix_memalign(&buf, NVME_ALIGN, NVME_ALIGN) != 0)
		return kvt_err(-ENOMEM, "nvme: header buffer");
	r = pread(n->fd, buf, NVME_ALIGN, (off_t)off);
	e = errno;
	if (r < (ssize_t)NVME_HDR) {
		free(buf);
		if (r < 0)
			return kvt_err(-e, "nvme: reading the header of slot %u: %s", slot,
				       nvme_strerror(e, eb, sizeof eb));
		return kvt_err(-EIO, "nvme: short read of the header of slot %u", slot);
	}
	rc = kvt_fmt_blkhdr_decode(buf, (size_t)r, h);
	free(buf);
	if (rc == 0 && h->slot != slot)
		rc = kvt_err(KVT_ECORRUPT, "slot %u holds a header of slot %u", slot, h->slot);
	return rc;
}
