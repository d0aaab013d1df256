/* SPDX-License-Identifier: MIT */
/*
 * tiers/tier_nvme.h - the NVME tier (internal): one file of fixed-size slots under a directory,
 * opened O_DIRECT and driven by io_uring.
 *
 * On-disk layout (docs/FORMAT.md, tiers/format.h): a 4 KiB superblock (layout fingerprint,
 * format version, epoch), then slot s at 1 MiB + s * slot_bytes, slot_bytes = 4096 +
 * round_up(block_bytes, 4096): a 4 KiB header page holding the 128-byte block header (magic,
 * version, slot, write key, session key, block index, raw and stored length, codec, content
 * hash, XXH3-64 of the raw block, XXH3-64 of the header), then the payload at slot offset 4096
 * (raw, or encoded by tiers/codec.c when that saves at least min_saving), zero padding to the
 * next 4 KiB. A write moves 4096 + round_up(stored, 4096) bytes. Every read reads the header page
 * and verifies: the header (checksum, magic, version, slot, raw length, key or the table's tag
 * and length code), then the payload (decoded when encoded) against the header's raw checksum;
 * any mismatch completes with KVT_ECORRUPT. A slot never written reads as zeros and so fails too.
 *
 * The slot table: for each slot, which write its latest completed kvt_nvme_put() was (6 bytes:
 * the 32-bit write tag, kvt_fmt_write_tag, and the 16-bit length code, kvt_fmt_lenc: codec and
 * the pages a read moves). It is the NVMe copy's metadata: kvt_nvme_get() reads against it (a
 * header with another tag is a lost or misdirected write: two writes of different contents to
 * one slot share a tag with odds of 2^-32), the engine's store records are made from it
 * (kvt_nvme_slot_info) and restored into it (kvt_nvme_slot_set). The checksum that verifies the
 * data is the header's (XXH3-64), read with the data.
 *
 * Zero-copy (raw blocks between the HOST tier and the disk): when the options name the HOST
 * tier's memory (4 KiB aligned, a 4 KiB-multiple slot stride), open registers it with io_uring
 * next to the staging buffers (chunks of whole slots, each <= 1 GiB). Then kvt_nvme_put() of a
 * raw block (no codec) from that memory is zero-copy: with header room (host_data_off 4096) the
 * header page is sealed into the 4 KiB in front of the block in its HOST slot and [header page |
 * payload] goes to the disk slot with ONE WRITE_FIXED straight from the HOST slot (the on-disk
 * slot is the same); without it (or while another put from the same HOST slot is in flight) the
 * header page goes from a staging buffer and the payload with WRITE_FIXED from the HOST slot (two
 * pieces of one IO, in order). kvt_nvme_get() of a slot stored raw into a HOST slot with header
 * room reads [header page | payload] with one READ_FIXED straight into the room and the slot;
 * without room it reads through staging (blocks below 64 KiB, where the engine gives no room: a
 * memcpy of at most 64 KiB), because every read checks the header. The HOST slot must not change
 * while a put is in flight (the engine keeps the block busy), nor its header room be touched by
 * anyone but the tier. When registration fails
 * (RLIMIT_MEMLOCK, ...) everything goes through staging and kvt_nvme_zc_reason() says why.

 * The file is either private (no name: an O_TMPFILE, or a kvtier-<pid>-<n>.slots unlinked right
 * after it is created, so a crash leaves nothing; stale ones of dead processes are removed at
 * open, kvt_nvme_stale_removed) or the persistent store
 * (kvtier.store, kept; opened again if present and its superblock matches, refused with
 * KVT_EFORMAT otherwise; flock'ed so that one process uses it at a time). Each open of the
 * persistent store bumps the superblock's epoch durably: a write key is (epoch << 40) | 40 bits
 * of XXH3(slot, checksum), so keys of different opens never collide (the slot table and the
 * journal keep only its low 32 bits, the write tag, which does not name the epoch: two writes of
 * one slot share a tag only when their contents hash alike, or with odds of 2^-32).
 *
 * CPU work runs on the tier's worker threads (kvt_nvme_opts.workers, when the kernel supports
 * waiting with a timeout without the SQ, IORING_FEAT_EXT_ARG; otherwise inline, on the caller):
 * a write's submit queues it (a staged one copied into its staging buffer first) and returns; a
 * worker checksums it (and encodes it), writes its header, then queues and submits the SQE. A
 * read whose IO completed is queued by the reap that saw its CQE; a worker verifies (and
 * decodes) it without any lock, in parallel with the others, and a later kvt_nvme_reap() hands
 * out its completion: a read is never reported complete (so never made valid by the engine)
 * before it verified. The SQ is shared under an internal mutex.
 *
 * IO that is not zero-copy goes through 4 KiB-aligned staging buffers owned by the tier (one
 * per queue entry, registered with io_uring when the kernel allows it): a write copies the
 * caller's bytes at submit time (the caller's buffer may be reused at once); a raw read copies
 * into the caller's buffer only after verification (on a worker, or in kvt_nvme_reap()); an
 * encoded read decodes into it and then verifies the checksum, so after a failed read (res != 0)
 * the buffer holds garbage and must not be used (the engine frees that destination slot: the
 * copy never becomes present). No memory is allocated per IO.
 *
 * Completions that do not come are timed out (KVT_NVME_IO_TIMEOUT_MS, -ETIMEDOUT); waiting for
 * them uses io_uring_wait_cqe_timeout up to the earliest deadline, never a busy loop.
 *
 * Short reads and writes are continued from where they stopped, rounded down to 4 KiB because
 * O_DIRECT needs aligned offsets (re-transferring a few bytes is harmless). A completion of 0
 * bytes fails with KVT_ESHORTIO at once; one that does not advance a 4 KiB boundary is retried
 * from the same place at most KVT_NVME_MAX_STALLS times, then fails with KVT_ESHORTIO. An IO is
 * never reported as done before all its bytes are transferred (a zero-copy put: the header page,
 * then the payload, each a piece of its own).
 *
 * Submission is batched: submit_* only queue SQEs; kvt_nvme_flush() (and every kvt_nvme_reap())
 * hands them to the kernel. The CQ has twice as many entries as there are staging buffers and at
 * most one IO piece per buffer is in the kernel, so completions can never overflow it.
 *
 * Threading: not thread-safe for its callers (the engine calls it under its mutex); the worker
 * threads are internal.
 */
#ifndef KVT_TIERS_TIER_NVME_H
#define KVT_TIERS_TIER_NVME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"
#include "tiers/format.h"

struct kvt_nvme;

/** Retries of a short IO that made no 4 KiB-aligned progress before it fails (KVT_ESHORTIO). */
#define KVT_NVME_MAX_STALLS 3u

/**
 * Test hook: sees every completed IO (each piece of a continued short IO too) before the tier
 * interprets it, and may change it. Called from kvt_nvme_reap(), on its thread.
 */
struct kvt_nvme_fault_hooks {
	/* Called when an IO completes with result *res (bytes or -errno) over buf (the staging
	 * buffer, len bytes at file offset off). May rewrite *res (inject -EIO, -ENOSPC, a short
	 * count) or flip bytes in buf (reads). is_write says which. */
	void (*on_complete)(void *arg, bool is_write, uint32_t slot, void *buf, size_t len,
			    uint64_t off, int *res);
	void *arg;
	/* Called first for every CQE (NULL: always normal). KVT_NVME_FATE_LOSE drops the CQE as if
	 * the kernel never posted it: the IO then times out. KVT_NVME_FATE_DELAY keeps it and hands
	 * it in at a later reap: a late, reordered completion. */
	int (*fate)(void *arg, bool is_write, uint32_t slot);
	uint32_t io_timeout_ms; /* deadline of one IO piece; 0 = KVT_NVME_IO_TIMEOUT_MS */
	bool refuse_register;   /* registering the HOST memory fails as if over RLIMIT_MEMLOCK */
	/* Called on the thread that verifies a read whose IO is complete (a worker, or the
	 * reaper without workers), before it verifies: a test delays verification with it to
	 * check that nothing is handed out (nor, in the engine, made valid) before. */
	void (*before_verify)(void *arg, uint32_t slot);
	/* Called before each io_uring_submit of the tier's SQ (mu held) with the SQEs waiting in
	 * it (NULL: always all). Returns how many of them the kernel takes, in order: all (>=
	 * @sqes), only the first k (0 <= k < @sqes: a partial submit, the rest wait for the next
	 * one), or a negative errno refusing the submit as the kernel may (-EAGAIN, -EBUSY:
	 * nothing taken). */
	int (*submit_cap)(void *arg, uint32_t sqes);
};

/* KVT_NVME_FATE_LATE keeps the CQE until its IO has timed out and hands it in at the reap after
 * that: the kernel completing an IO already reported -ETIMEDOUT. */
enum { KVT_NVME_FATE_NORMAL = 0, KVT_NVME_FATE_LOSE = 1, KVT_NVME_FATE_DELAY = 2,
       KVT_NVME_FATE_LATE = 3 };

/*
 * An IO piece whose completion has not come within this time is completed with -ETIMEDOUT. Its
 * staging buffer stays out of use until the kernel's completion arrives after all (then it is
 * recycled silently); one that never arrives is leaked at close rather than freed under the
 * kernel. The slot of a timed-out write must not be written again before the kernel is done with
 * the late write (it could land over the new one): the caller keeps it out of use until
 * kvt_nvme_late_writes() returns it. Likewise the caller's buffer of a timed-out zero-copy read
 * (cqe.buf_late: the kernel may still write it) until kvt_nvme_late_reads() returns it.
 */
#define KVT_NVME_IO_TIMEOUT_MS 30000u

struct kvt_nvme_opts {
	const char *dir;            /* directory; must exist and be writable */
	struct kvt_layout layout;   /* the model layout (fingerprint, element size); may be zero */
	int codec;                  /* enum kvt_codec of writes (KVT_CODEC_NONE = raw) */
	double min_saving;          /* keep an encoding only if it saves this fraction (0..1) */
	bool persist;               /* open or create "<dir>/kvtier.store" and keep it */
	bool buffered_fallback;     /* O_DIRECT refused: use buffered IO instead of failing */
	uint64_t capacity_bytes;    /* rounded down to whole slots; must hold >= 1 slot */
	size_t block_bytes;         /* bytes of one block */
	uint32_t queue_depth;       /* io_uring entries and staging buffers; 1..4096 */
	const struct kvt_nvme_fault_hooks *hooks; /* NULL in production; copied at open */
	void *host_base;            /* HOST tier memory for zero-copy IO (NULL = none); must
	                               outlive the tier; 4 KiB aligned */
	size_t host_len;            /* its bytes */
	size_t host_stride;         /* bytes between HOST slots: a multiple of 4096 that holds
	                               host_data_off + round_up(block_bytes, 4096) (else no
	                               zero-copy) */
	size_t host_data_off;       /* where a block's data starts in its HOST slot: 0, or
	                               KVT_FMT_HDR_PAGE (4096): header room, the 4 KiB in front
	                               of the data are the tier's (a zero-copy put seals the
	                               header page there and writes [header page | data] as one
	                               IO, a zero-copy get reads them there in one IO); the data
	                               pointers given to put/get are slot start + host_data_off */
	uint32_t workers;           /* threads that checksum and encode writes and verify and
	                               decode reads, in parallel and outside the tier's lock
	                               (KVT_NVME_MAX_WORKERS at most); 0 = all of it inline, on
	                               the thread that submits or reaps */
	uint64_t groups_fp;         /* layer groups fingerprint of the superblock (0 = none) */
	uint32_t group;             /* the group the store holds */
};

/** Most worker threads a tier runs (kvt_nvme_opts.workers). */
#define KVT_NVME_MAX_WORKERS 16u

/** IO counters of the tier (kvt_nvme_stats). */
struct kvt_nvme_stats {
	uint64_t zc_writes;     /* puts whose payload went straight from a HOST slot */
	uint64_t zc_reads;      /* gets whose payload went straight into a HOST slot */
	uint64_t staged_writes; /* writes through a staging buffer */
	uint64_t staged_reads;  /* reads through a staging buffer */
	uint64_t zc_one_io;     /* of zc_writes, those written as one IO [header page | data]
	                           from the HOST slot's header room (host_data_off) */
	uint64_t sqes;          /* IO pieces handed to the kernel (reads and writes; a
	                           continued short IO adds one) */
};

/** The NVMe copy's metadata of one slot (kvt_nvme_slot_info / kvt_nvme_slot_set). */
struct kvt_nvme_slotinfo {
	uint32_t tag;    /* the write's tag: kvt_fmt_write_tag() of its header's write key */
	uint32_t lenc;   /* its length code: kvt_fmt_lenc(codec, stored length, block_bytes) */
};

/** One finished IO. */
struct kvt_nvme_cqe {
	uint64_t user_data; /* as submitted */
	int res;            /* 0 ok; -EIO, -ENOSPC ..., KVT_ESHORTIO, KVT_ECORRUPT */
	bool is_write;      /* which kind it was */
	uint32_t slot;      /* the slot */
	uint32_t stored;    /* writes: payload bytes stored (raw_len when raw) */
	uint32_t codec;     /* writes: codec of the payload */
	uint64_t sum;       /* writes: XXH3-64 of the raw block */
	bool buf_late;      /* reads that timed out (-ETIMEDOUT) zero-copy: the kernel may
	                       still write the caller's buffer; keep it out of use until
	                       kvt_nvme_late_reads() returns it (never, if its CQE never comes) */
};

/** What a write records in the block header besides the data. */
struct kvt_nvme_wmeta {
	uint64_t key;     /* write key, checked on read */
	uint64_t session; /* session key (0 = none) */
	uint32_t index;   /* block index in the session */
	uint8_t hash[16]; /* content hash (zeros when unknown) */
};

/**
 * Open the tier: creates the private slot file in <dir> (an O_TMPFILE, else
 * "<dir>/kvtier-<pid>-<counter>.slots" unlinked at once; first removing such files of dead
 * processes) (or opens/creates the persistent
 * "<dir>/kvtier.store") mode 0600, O_DIRECT, reserves its size with fallocate (ftruncate where
 * fallocate is not supported), writes (or reads and checks) the superblock, sets up io_uring.
 * A new store is built as "kvtier.store.tmp" and renamed once its superblock is durable (a stale
 * .tmp is removed first); an existing one that matches has its space reserved again.
 * @o:      options; copied (dir and hooks too), the caller may free them afterwards.
 * @out:    receives the tier; NULL on failure.
 * @err:    receives the failure message (the same text as kvt_last_error_message()); may be
 *          NULL. @errlen: its size.
 * Returns 0, or -errno: -EINVAL (bad options, capacity below one slot or above 2^32-1 slots,
 * filesystem refuses O_DIRECT or, per statx, needs an alignment that does not divide 4 KiB),
 * -ENOENT (no dir), -ENOTDIR, -EACCES (dir not writable, also on a read-only filesystem),
 * -ENOSPC (fallocate could not reserve the space), -ENOMEM, KVT_EFORMAT (an existing store
 * was made for another layout/geometry/codec/version), -EBUSY (another process holds the store),
 * or the error of io_uring_queue_init. Nothing is left behind on failure (a file created by this
 * call is removed; an existing store is never modified when refused).
 */
int kvt_nvme_open(const struct kvt_nvme_opts *o, struct kvt_nvme **out, char *err, size_t errlen);

/**
 * Wait for all IO in flight (their completions are discarded, read destinations are not
 * written), close the file (unlink it unless persistent), free @n. NULL is accepted. If the
 * ring fails so that in-flight IO cannot be waited for, the staging buffers are leaked rather
 * than freed under the kernel's feet.
 */
void kvt_nvme_close(struct kvt_nvme *n);

/** Number of slots in the file (capacity_bytes / slot_bytes). */
uint32_t kvt_nvme_n_slots(const struct kvt_nvme *n);
/** Bytes one slot takes in the file: 4096 + round_up(block_bytes, 4096). */
size_t kvt_nvme_slot_bytes(const struct kvt_nvme *n);
/** IOs submitted whose completion has not been returned by kvt_nvme_reap() yet (timed-out ones
 * excluded: their completion was returned, -ETIMEDOUT). */
uint32_t kvt_nvme_inflight(const struct kvt_nvme *n);
/** Free staging buffers: a submit when this is 0 returns -EAGAIN (reap first). Timed-out IOs
 * keep theirs until the kernel completes them after all. */
uint32_t kvt_nvme_free_qd(const struct kvt_nvme *n);

/**
 * Queue a write of block_bytes from @src into @slot, tagged with @key (stored in the header and
 * checked on read). @src is copied before return. The IO is queued, not yet submitted (see
 * kvt_nvme_flush). Returns 0 (exactly one completion will come from reap), -EAGAIN (no free
 * staging buffer: reap first), -EINVAL (slot out of range, src NULL); nothing is queued on error.
 */
int kvt_nvme_submit_write(struct kvt_nvme *n, uint32_t slot, const void *src, uint64_t key,
			  uint64_t user_data);

/**
 * Queue a read of @slot into @dst (block_bytes). @dst is written before the kvt_nvme_reap() that
 * returns this completion returns (by that reap, or by a worker after the IO; so it must stay
 * valid until then): with the verified bytes, or, when the completion fails, with nothing (raw
 * blocks) or undefined bytes (encoded blocks are decoded into it before the checksum can be
 * compared). Never while closing.
 * Returns 0 (exactly one completion will come from reap), -EAGAIN, -EINVAL (slot, dst NULL).
 */
int kvt_nvme_submit_read(struct kvt_nvme *n, uint32_t slot, void *dst, uint64_t key,
			 uint64_t user_data);

/**
 * Hand every queued IO to the kernel (io_uring_submit). kvt_nvme_reap() does this itself; call
 * it to start IO early when no reap follows soon. Returns the number of IOs submitted (>= 0;
 * an internal wake-up NOP handed over with them is not one) or the ring's negative error
 * (-EAGAIN/-EBUSY: try again after reaping); unsubmitted IO stays queued.
 */
int kvt_nvme_flush(struct kvt_nvme *n);

/** kvt_nvme_flush() without a message on failure (for a caller that has already returned its
 * own result: the engine submitting after its lock is released; a later reap reports it). */
int kvt_nvme_flush_quiet(struct kvt_nvme *n);

/**
 * Like kvt_nvme_submit_write, with the header's session, index and content hash. The block is
 * encoded with the tier's codec when that pays (on a worker, or here without workers).
 */
int kvt_nvme_submit_write_meta(struct kvt_nvme *n, uint32_t slot, const void *src,
			       const struct kvt_nvme_wmeta *m, uint64_t user_data);

/**
 * Like kvt_nvme_submit_read, reading only 4096 + round_up(@stored, 4096) bytes when @stored (the
 * payload length its write completion reported) is not 0. A header that disagrees fails the read.
 */
int kvt_nvme_submit_read_len(struct kvt_nvme *n, uint32_t slot, void *dst, uint64_t key,
			     uint32_t stored, uint64_t user_data);

/**
 * Write the block at @src into @slot for the engine: like kvt_nvme_submit_write_meta, but the
 * write key is derived (m->key is ignored) and the slot table records the write when it
 * completes successfully (it forgets the slot at once: a read of it fails until then). Raw
 * blocks (no codec) in the registered HOST memory go zero-copy (@src must then stay unchanged
 * until the completion); others are copied to staging before return. Errors as submit_write.
 */
int kvt_nvme_put(struct kvt_nvme *n, uint32_t slot, const void *src,
		 const struct kvt_nvme_wmeta *m, uint64_t user_data);

/**
 * Read @slot into @dst (block_bytes) against the slot table: the header page and the payload
 * pages its length code names, one IO; the header must carry the table's write tag and length
 * code (else the slot holds another write: a lost or misdirected one), the raw block the
 * header's XXH3-64. A slot stored raw whose @dst is a HOST slot's data with header room
 * (host_data_off 4096) is read zero-copy, [header page | payload] straight into the room and the
 * slot (after a failure @dst holds garbage); others through staging. Returns 0 (one completion
 * will come), -EAGAIN, -EINVAL (slot, dst), KVT_ECORRUPT (the table knows no completed write of
 * @slot; nothing queued).
 */
int kvt_nvme_get(struct kvt_nvme *n, uint32_t slot, void *dst, uint64_t user_data);

/** The slot table's entry of @slot into *@out: true, or false when it knows none. Locks. */
bool kvt_nvme_slot_info(struct kvt_nvme *n, uint32_t slot, struct kvt_nvme_slotinfo *out);
/**
 * Set @slot's table entry (restoring a stored block after a restart). Returns 0 or -EINVAL (slot
 * out of range; a length code that is not valid for this tier's block_bytes, or names a codec
 * other than NONE and the tier's). Whether the entry is the slot's write shows at the first read
 * (a header with another tag or length code fails it with KVT_ECORRUPT). Locks.
 */
int kvt_nvme_slot_set(struct kvt_nvme *n, uint32_t slot, const struct kvt_nvme_slotinfo *in);
/** Host bytes of the slot table (6 per slot), for the engine's metadata accounting. */
uint64_t kvt_nvme_meta_bytes(const struct kvt_nvme *n);
/** Copy the IO counters into *@out. Locks. */
void kvt_nvme_get_stats(struct kvt_nvme *n, struct kvt_nvme_stats *out);
/** Whether the HOST memory is registered (zero-copy puts and gets). */
bool kvt_nvme_zero_copy(const struct kvt_nvme *n);
/** Why zero-copy is off: "" when on, "no HOST memory given" ... (owned by @n). */
const char *kvt_nvme_zc_reason(const struct kvt_nvme *n);

/**
 * Read and parse the header of @slot synchronously (pread; for restore, not for the data path).
 * Returns 0, KVT_ECORRUPT (no valid header), or -errno of the read.
 */
int kvt_nvme_read_header(struct kvt_nvme *n, uint32_t slot, struct kvt_fmt_blkhdr *h);

/** Give the filesystem back the space of free @slot (FALLOC_FL_PUNCH_HOLE; best effort: thin
 * and copy-on-write volumes regain it). The slot stays usable. */
void kvt_nvme_punch(struct kvt_nvme *n, uint32_t slot);

/**
 * Slots of writes that timed out (-ETIMEDOUT) and whose late completion has come since: they may
 * be written again. Writes up to @max of them to @slots; returns how many. Thread: the reaper's.
 */
uint32_t kvt_nvme_late_writes(struct kvt_nvme *n, uint32_t *slots, uint32_t max);
/**
 * Buffers of zero-copy reads (kvt_nvme_get into the HOST memory) that timed out (-ETIMEDOUT with
 * buf_late set) and whose late completion has come since: the kernel writes them no more, they
 * may be used again. Writes up to @max of them (the dst given to kvt_nvme_get) to @bufs; returns
 * how many. Thread: the reaper's.
 */
uint32_t kvt_nvme_late_reads(struct kvt_nvme *n, void **bufs, uint32_t max);
/** Whether IOs that timed out are still in the kernel (a reap may bring their late CQEs). */
bool kvt_nvme_abandoned(const struct kvt_nvme *n);

/** Make every completed write durable (fdatasync of the file). 0 or -errno. A failure is final
 * (dirty pages may have been dropped): every later call fails with -EIO. */
int kvt_nvme_sync(struct kvt_nvme *n);
/** Whether an fdatasync of the file failed (kvt_nvme_sync fails from then on). */
bool kvt_nvme_sync_failed(const struct kvt_nvme *n);

/** The superblock's epoch of this open (persistent store: bumped at every open; else 1). */
uint64_t kvt_nvme_epoch(const struct kvt_nvme *n);
/** What the superblock said at open about the journal: the generation and length last known
 * durable (kvt_nvme_note_journal; 0, 0 = unknown, as in stores of older builds). */
void kvt_nvme_journal_known(const struct kvt_nvme *n, uint64_t *gen, uint64_t *len);
/**
 * kvt_nvme_note_journal() - record in the store's superblock that journal generation @gen is
 * durable up to @len bytes. Written, not synced: it becomes durable with the next kvt_nvme_sync()
 * (so it never claims more than was durable; after a power loss it may lag by one commit).
 * No-op for a private slot file. 0 or -errno (with a message).
 */
int kvt_nvme_note_journal(struct kvt_nvme *n, uint64_t gen, uint64_t len);
/** The superblock's store id (random at creation). */
uint64_t kvt_nvme_store_id(const struct kvt_nvme *n);
/** Whether the file was opened without O_DIRECT (buffered fallback). */
bool kvt_nvme_buffered(const struct kvt_nvme *n);
/** Whether this is the persistent store (kept on close). */
bool kvt_nvme_persistent(const struct kvt_nvme *n);

/** Path of the slot file (owned by @n, valid until kvt_nvme_close). The private slot file has
 * no name in its directory (O_TMPFILE, or unlinked right after it was created, so that a crash
 * leaves nothing behind): its path is "/proc/self/fd/<fd>", valid while the tier is open. */
const char *kvt_nvme_path(const struct kvt_nvme *n);
/** Slot files ("kvtier-<pid>-<n>.slots") of dead processes that the open of this private tier
 * removed from its directory, with *@first (may be NULL) the name of the first ("" if none). */
uint32_t kvt_nvme_stale_removed(const struct kvt_nvme *n, const char **first);

/**
 * Reap up to @max completions into @out. With @wait, blocks until at least one completion
 * arrives if any IO is in flight (io_uring_wait_cqe, no busy loop). Continues short IO
 * internally. A read's completion comes only after it verified (raw staged reads are copied to
 * their dst then; with workers that happened on a worker thread). Each submitted IO yields exactly
 * one completion. A failed completion's detail ("nvme slot 7: key 0x5, expected 0x6") is left in
 * kvt_last_error_message(). Returns the number written to out (>= 0) or a negative code of the
 * ring itself (-EINVAL for out == NULL with max > 0).
 */
int kvt_nvme_reap(struct kvt_nvme *n, struct kvt_nvme_cqe *out, uint32_t max, bool wait);

/**
 * kvt_nvme_reap(@n, @out, @max, false), unless another thread holds the tier's mutex (a
 * submission or a worker's hand-over in progress): then -EBUSY at once (no message), so that a
 * caller that must not wait never waits for someone else's io_uring_submit. Thread-safe.
 */
int kvt_nvme_reap_try(struct kvt_nvme *n, struct kvt_nvme_cqe *out, uint32_t max);

#endif /* KVT_TIERS_TIER_NVME_H */
