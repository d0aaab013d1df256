/* SPDX-License-Identifier: MIT */
/*
 * tiers/tier_nvme.h - the NVME tier (internal): one file of fixed-size slots under a directory,
 * opened O_DIRECT and driven by io_uring.
 *
 * On-disk slot layout (slot_bytes = round_up(block_bytes + sizeof trailer, 4096)):
 *   [0, block_bytes)                 the block's bytes
 *   [..., slot_bytes - 64)           zero padding
 *   [slot_bytes - 64, slot_bytes)    trailer: magic, format version, key, block_bytes,
 *                                    XXH3-64 checksum of the data, checksum of the trailer
 * Every read verifies magic, key, length and checksum; any mismatch completes with
 * KVT_ECORRUPT, never with data copied into the caller's buffer.
 *
 * IO goes through 4 KiB-aligned staging buffers owned by the tier (one per queue entry): a write
 * copies the caller's bytes at submit time (the caller's buffer may be reused at once); a read
 * copies into the caller's buffer only after verification, in kvt_nvme_reap(). Short reads and
 * writes are continued from where they stopped; one that makes no progress fails with
 * KVT_ESHORTIO. Never reported as done before all bytes are transferred.
 *
 * Threading: not thread-safe; the engine calls it under its mutex.
 */
#ifndef KVT_TIERS_TIER_NVME_H
#define KVT_TIERS_TIER_NVME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvt_nvme;

/** Test hook: sees every completed IO before the tier interprets it, and may change it. */
struct kvt_nvme_fault_hooks {
	/* Called when an IO completes with result *res (bytes or -errno) over buf (the staging
	 * buffer, len bytes at file offset off). May rewrite *res (inject -EIO, -ENOSPC, a short
	 * count) or flip bytes in buf (reads). is_write says which. */
	void (*on_complete)(void *arg, bool is_write, uint32_t slot, void *buf, size_t len,
			    uint64_t off, int *res);
	void *arg;
};

struct kvt_nvme_opts {
	const char *dir;            /* directory; must exist and be writable */
	uint64_t capacity_bytes;    /* rounded down to whole slots; must hold >= 1 slot */
	size_t block_bytes;         /* bytes of one block */
	uint32_t queue_depth;       /* io_uring entries and staging buffers; 1..4096 */
	const struct kvt_nvme_fault_hooks *hooks; /* NULL in production */
};

/** One finished IO. */
struct kvt_nvme_cqe {
	uint64_t user_data; /* as submitted */
	int res;            /* 0 ok; -EIO, -ENOSPC ..., KVT_ESHORTIO, KVT_ECORRUPT */
	bool is_write;      /* which kind it was */
	uint32_t slot;      /* the slot */
};

/**
 * Open the tier: creates "<dir>/kvtier-<pid>-<counter>.slots" mode 0600, O_DIRECT, reserves its
 * size with fallocate, sets up io_uring. On failure returns -errno (-ENOENT, -EACCES, -ENOTDIR,
 * -EINVAL for O_DIRECT refused or zero slots, -ENOMEM) and writes a message to err.
 */
int kvt_nvme_open(const struct kvt_nvme_opts *o, struct kvt_nvme **out, char *err, size_t errlen);

/** Wait for all IO in flight (their completions are discarded), close and unlink the file. */
void kvt_nvme_close(struct kvt_nvme *n);

uint32_t kvt_nvme_n_slots(const struct kvt_nvme *n);
size_t kvt_nvme_slot_bytes(const struct kvt_nvme *n);
uint32_t kvt_nvme_inflight(const struct kvt_nvme *n);
/** Free staging buffers: a submit when this is 0 returns -EAGAIN (reap first). */
uint32_t kvt_nvme_free_qd(const struct kvt_nvme *n);

/**
 * Queue a write of block_bytes from @src into @slot, tagged with @key (stored in the trailer and
 * checked on read). @src is copied before return. Returns 0 (a completion will come from reap),
 * -EAGAIN (queue full), -EINVAL (slot out of range).
 */
int kvt_nvme_submit_write(struct kvt_nvme *n, uint32_t slot, const void *src, uint64_t key,
			  uint64_t user_data);

/**
 * Queue a read of @slot into @dst (block_bytes). @dst is written only if the data verify
 * (during the kvt_nvme_reap() that returns this completion). Returns 0, -EAGAIN, -EINVAL.
 */
int kvt_nvme_submit_read(struct kvt_nvme *n, uint32_t slot, void *dst, uint64_t key,
			 uint64_t user_data);

/**
 * Reap up to @max completions into @out. With @wait, blocks until at least one completion
 * arrives if any IO is in flight (io_uring_wait_cqe, no busy loop). Continues short IO
 * internally. Returns the number written to out (>= 0) or a negative code of the ring itself.
 */
int kvt_nvme_reap(struct kvt_nvme *n, struct kvt_nvme_cqe *out, uint32_t max, bool wait);

#endif /* KVT_TIERS_TIER_NVME_H */
