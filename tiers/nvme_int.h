/* SPDX-License-Identifier: MIT */
/*
 * tiers/nvme_int.h - the NVME tier's internal state, shared by tier_nvme.c (open, files,
 * superblock, close), nvme_info.c (accessors, sync, the slot table), nvme_io.c (submission,
 * completion), nvme_seal.c (sealing writes, verifying reads) and nvme_work.c (the worker pool).
 * Not installed.
 */
#ifndef KVT_TIERS_NVME_INT_H
#define KVT_TIERS_NVME_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <liburing.h>

#include "tiers/codec.h"
#include "tiers/format.h"
#include "tiers/tier_nvme.h"

#define NVME_ALIGN KVT_FMT_ALIGN   /* O_DIRECT alignment of offsets, lengths and buffers */
#define NVME_HDR KVT_FMT_BLKHDR_BYTES /* block header at the start of every slot */
#define NVME_HPAGE KVT_FMT_HDR_PAGE  /* header page: the payload starts at this slot offset */
#define NVME_HUGE ((size_t)2 << 20) /* staging arena alignment: a transparent huge page */
#define NVME_MAX_REG (1ull << 30)  /* io_uring's limit on one registered buffer */
#define NVME_MAX_QD 4096u          /* largest queue depth accepted */
#define NVME_MAX_BLOCK_BYTES (1u << 30) /* one IO's byte count must fit the int of a CQE */
#define NVME_CLOSE_BATCH 32u       /* completions discarded per reap while closing */
#define NVME_STORE_NAME "kvtier.store" /* the persistent store's file under dir */


/* One IO in flight; qd of them live in kvt_nvme.reqs, free ones on kvt_nvme.free_stack. */
struct nvme_req {
	uint8_t *buf;       /* staging buffer: slot_bytes, 4 KiB aligned, part of the arena */
	uint8_t *data;      /* zero-copy: the HOST slot the payload moves from/to directly
	                       (slot bytes [NVME_HPAGE, len)); NULL = all through buf. A get
	                       is zero-copy only with header room (whole) */
	uint32_t data_index; /* zero-copy: registered buffer index of data's HOST chunk */
	bool whole;         /* zero-copy, one IO through the HOST slot's header room (data -
	                       NVME_HPAGE): a put seals the header page there, a get reads it
	                       there; all len bytes move from/to there */
	uint32_t piece;     /* bytes the SQE in flight moves (from done on) */
	bool tabled;        /* kvt_nvme_put/get: the slot table is the write's record (put:
	                       set at completion) and the read's expectation (get) */
	void *dst;          /* reads: the caller's buffer; raw: written after verification,
	                       encoded: decoded into, then verified (garbage on failure) */
	uint64_t user_data; /* caller's tag, returned in the completion */
	uint64_t key;       /* writes: stored in the header; reads: expected there */
	uint32_t slot;      /* slot in the file */
	uint32_t len;       /* bytes this IO moves: header + payload rounded up to 4 KiB */
	uint32_t done;      /* bytes known transferred, a multiple of NVME_ALIGN */
	uint32_t stored;    /* writes: payload bytes written */
	uint32_t want_tag;  /* get: the write tag the slot table expects in the header */
	uint32_t want_lenc; /* get: the length code it expects (0 = not a get: no table) */
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
	bool late_due;      /* HELD, then timed out: its kept CQE is handed in at the next reap */
	struct kvt_nvme_wmeta meta; /* writes handed to a worker: the header's fields */
	int vres;           /* reads verified by a worker: the result (0 or KVT_ECORRUPT ...) */
	char verr[160];     /* ... and its message (kvt_err is per thread: raised again by the
	                       reaper when it hands the completion out) */
};

/* One thread of the worker pool (kvt_nvme_opts.workers): seals (checksums, encodes) writes and
 * verifies (decodes) reads, without the tier's lock, with buffers of its own. */
struct nvme_worker {
	struct kvt_nvme *n;  /* the tier */
	pthread_t thr;       /* the thread */
	uint8_t *scratch;    /* codec scratch: kvt_codec_scratch_bytes(block_bytes) */
	uint8_t *enc;        /* codec output: block_bytes */
};

/* The slot table: what the latest completed kvt_nvme_put of each slot stored, 6 bytes a slot in
 * two arrays (kvt_nvme.tag, kvt_nvme.lenc): the write's tag (kvt_fmt_write_tag of its header key)
 * and its length code (kvt_fmt_lenc: codec and how many pages a read moves; 0 = unknown: never
 * written through kvt_nvme_put, being rewritten, or the write failed). Every read moves the
 * header page too and checks the header against both, and the data against the header's
 * checksum, so the table needs no checksum of its own. */

/* A busy request is in the SQ, in the kernel, or parked in one of these states. */
enum nvme_parked {
	NVME_ACTIVE = 0,    /* queued or in the kernel */
	NVME_DELAYED = 1,   /* its CQE was kept back by the fate hook: handed in at a later reap */
	NVME_LOST = 2,      /* its CQE was dropped by the fate hook: it will time out */
	NVME_ABANDONED = 3, /* timed out while the kernel holds it: recycled if its CQE comes */
	NVME_RETIRED = 4,   /* timed out after its CQE was lost: never used again */
	NVME_ENCODING = 5,  /* a write waiting for (or in) a worker's seal */
	NVME_HELD = 6,      /* its CQE was kept back by the fate hook (LATE) until it times out */
	NVME_VERIFYING = 7, /* a read whose IO is done, queued for (or in) a worker's verify */
	NVME_VERIFIED = 8,  /* ... verified (vres): on the done queue until a reap hands it out */
};

struct kvt_nvme {
	struct io_uring ring;              /* SQ of queue_depth entries, CQ of twice that */
	struct kvt_nvme_fault_hooks hooks; /* copy of the opts' hooks; zeroed when none */
	char *path;                        /* slot file path; owned */
	char *final_path;                  /* creating a store: its name once the superblock
	                                      is durable (path is "<name>.tmp"); owned */
	int fd;                            /* slot file, O_DIRECT; -1 while not open */
	bool ring_ok;                      /* ring initialised (io_uring_queue_exit needed) */
	bool fixed_bufs;                   /* staging registered: READ_FIXED / WRITE_FIXED */
	bool fixed_file;                   /* the file registered: IOSQE_FIXED_FILE, index 0 */
	bool closing;                      /* kvt_nvme_close is draining: discard, never copy */
	bool persist;                      /* the file is the persistent store: kept at close */
	bool unlink_on_free;               /* created by this open: removed if the open fails */
	char fd_path[40];                  /* private slot file: "/proc/self/fd/<fd>", the only
	                                      name it has once created (kvt_nvme_path) */
	uint32_t stale_removed;            /* open: slot files of dead processes removed */
	char stale_name[64];               /* open: the first of them */
	bool buffered;                     /* O_DIRECT refused, buffered IO asked for instead */
	bool sync_failed;                  /* an fdatasync failed: kvt_nvme_sync fails for good */
	int codec;                         /* enum kvt_codec of writes */
	double min_saving;                 /* encode kept only when it saves this fraction */
	struct kvt_codec_geom geom;        /* tile geometry of the layout, for the codec */
	uint8_t *scratch;                  /* codec scratch (kvt_codec_scratch_bytes) of inline
	                                      seals and verifies (no workers; mu held):
	                                      allocated at open when the tier encodes, else at
	                                      the first decode */
	struct kvt_fmt_super sb;           /* the superblock as written/read at open */
	size_t block_bytes;                /* bytes of one block */
	size_t slot_bytes;                 /* bytes of one slot in the file */
	uint32_t n_slots;                  /* slots in the file */
	uint32_t qd;                       /* queue depth: requests and staging buffers */
	uint32_t n_free;                   /* entries of free_stack in use */
	uint32_t queued;                   /* requests' SQEs prepared but not yet taken by the
	                                      kernel (a wake-up NOP's is not counted here) */
	bool nop_queued;                   /* a wake-up NOP (kvt_nvme_poke) waits in the SQ */
	uint32_t nop_ahead;                /* ... behind this many of the queued SQEs */
	uint32_t n_parked;                 /* busy requests not in the kernel: DELAYED, LOST,
	                                      RETIRED, HELD */
	uint32_t n_delayed;                /* of those, DELAYED */
	uint32_t n_lost;                   /* of those, LOST */
	uint32_t n_retired;                /* of those, RETIRED */
	uint32_t n_abandoned;              /* busy requests ABANDONED (still in the kernel) */
	uint32_t n_held;                   /* busy requests HELD (counted in n_parked) */
	uint32_t n_late_due;               /* ABANDONED requests with late_due set */
	uint32_t *late_slots;              /* [qd] slots of abandoned writes whose CQE came */
	uint32_t n_late_slots;             /* entries in late_slots */
	void **late_bufs;                  /* [qd] HOST buffers of abandoned zero-copy reads whose
	                                      CQE came (kvt_nvme_late_reads) */
	uint32_t n_late_bufs;              /* entries in late_bufs */
	uint64_t reap_gen;                 /* kvt_nvme_reap calls so far */
	/* The worker pool (opts.workers threads): writes are queued at submit (staged ones copied
	 * to staging first), sealed by a worker (checksum, encoding, header), which then queues and
	 * submits their SQEs; reads whose IO completed are queued by the reaper, verified (and
	 * decoded) by a worker and put on the done queue, which the next reap hands out. mu guards
	 * the SQ, queued, the counters, both queues and every request's fields between the
	 * threads; a worker does not hold it while it seals or verifies. The engine thread holds it
	 * while it submits or reaps (not while it waits). */
	pthread_mutex_t mu;                /* see above */
	bool mu_ok;                        /* mu initialised */
	pthread_cond_t work_cv;            /* signalled when work_q gets work or work_stop is set */
	struct nvme_worker *workers;       /* [n_workers] */
	uint32_t n_workers;                /* threads running (0 = all inline, on the caller) */
	bool work_stop;                    /* asks them to exit */
	uint32_t *work_q;                  /* [qd] ring of request indices to seal or verify */
	uint32_t work_head, work_n;        /* ring head and length */
	uint32_t *done_q;                  /* [qd] ring of verified reads */
	uint32_t done_head, done_n;        /* ring head and length */
	uint32_t n_encoding;               /* busy requests NVME_ENCODING */
	uint32_t n_verifying;              /* busy requests NVME_VERIFYING or NVME_VERIFIED */
	bool reaper_waiting;               /* a reap sleeps in the CQ wait: a worker that puts a
	                                      read on done_q wakes it (a NOP) */
	uint64_t timeout_ns;               /* IO piece deadline */
	uint32_t *free_stack;              /* [qd] indices of free requests */
	struct nvme_req *reqs;             /* [qd] request contexts */
	uint8_t *arena;                    /* [qd][slot_bytes] staging, 4 KiB aligned */
	uint32_t *tag;                     /* [n_slots] the slot table's write tags (guarded by
	                                      mu; see above) */
	uint16_t *lenc;                    /* [n_slots] its length codes (0 = unknown) */
	/* Zero-copy: the HOST tier's memory, registered with io_uring after the staging buffers
	 * (buffer index qd + c for chunk c of host_chunk bytes, each <= 1 GiB, whole slots). */
	uint8_t *host_base;                /* HOST tier memory; NULL = no zero-copy */
	size_t host_len;                   /* its bytes */
	size_t host_chunk;                 /* bytes per registered chunk (a multiple of stride) */
	size_t host_stride;                /* bytes between HOST slots */
	size_t host_off;                   /* a block's data offset in its HOST slot: 0, or
	                                      NVME_HPAGE (header room: one-IO puts and gets) */
	uint64_t *room_busy;               /* header room: a bit per HOST slot whose room a whole
	                                      request uses (busy, or timed out while the kernel
	                                      still has it); guarded by mu */
	char zc_reason[160];               /* why zero-copy is off ("" when on) */
	struct kvt_nvme_stats st;          /* IO counters (guarded by mu) */
};


/* Thread-safe strerror (the GNU strerror_r, which may return a static string). */
static inline const char *
nvme_strerror(int e, char *buf, size_t len)
{
	return strerror_r(e, buf, len);
}

/* File offset of byte 0 of @slot. */
static inline uint64_t
nvme_slot_off(const struct kvt_nvme *n, uint32_t slot)
{
	return KVT_FMT_DATA_OFF + (uint64_t)slot * n->slot_bytes;
}

/* Bytes an IO of a slot moves when @stored payload bytes follow the header page: rounded up to
 * 4 KiB, at most the slot. */
static inline uint32_t
nvme_io_len(const struct kvt_nvme *n, uint32_t stored)
{
	size_t l = NVME_HPAGE + (((size_t)stored + NVME_ALIGN - 1) & ~(size_t)(NVME_ALIGN - 1));

	return (uint32_t)(l < n->slot_bytes ? l : n->slot_bytes);
}

/* nvme_work.c: start the pool of @count workers (0 or a failure: inline), stop and join it (all
 * IO must have completed), and hand out verified reads (mu held; returns those written). */
int kvt_nvme_workers_start(struct kvt_nvme *n, uint32_t count);
void kvt_nvme_workers_stop(struct kvt_nvme *n);
uint32_t kvt_nvme_deliver_verified(struct kvt_nvme *n, struct kvt_nvme_cqe *out, uint32_t max);
/* A verified read of @req goes out: queue it on done_q (worker, mu held). */
void kvt_nvme_queue_verify(struct kvt_nvme *n, struct nvme_req *req);

/* nvme_seal.c, inline or on a worker (no mu): seal a write, verify a read into its destination
 * (@scratch: codec scratch). nvme_io.c, for the workers (mu held): queue the rest of an IO,
 * submit, wake a waiting reaper, and finish a request into a completion. */
void kvt_nvme_seal(struct kvt_nvme *n, struct nvme_req *req, const void *raw,
		   const struct kvt_nvme_wmeta *m, uint8_t *scratch, uint8_t *encbuf);
int kvt_nvme_verify(struct kvt_nvme *n, const struct nvme_req *req, uint8_t *scratch);
int kvt_nvme_queue_rest(struct kvt_nvme *n, struct nvme_req *req);
int kvt_nvme_submit_queued(struct kvt_nvme *n);
void kvt_nvme_poke(struct kvt_nvme *n);
void kvt_nvme_finish(struct kvt_nvme *n, struct nvme_req *req, int res, struct kvt_nvme_cqe *c);

#endif /* KVT_TIERS_NVME_INT_H */
