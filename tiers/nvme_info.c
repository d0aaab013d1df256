/* SPDX-License-Identifier: MIT */
/*
 * tiers/nvme_info.c - the NVME tier's accessors, data sync, header reads, hole punching, the slot
 * table (kvt_nvme_slot_info/set) and its counters. Opening and closing are in tier_nvme.c, the
 * IO in nvme_io.c; the contract is in tier_nvme.h, the state in nvme_int.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "tiers/base/error.h"
#include "tiers/nvme_int.h"
#include "tiers/store.h"

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

/* Under mu: a reaper may be finishing requests meanwhile without the caller's lock. */
uint32_t
kvt_nvme_free_qd(const struct kvt_nvme *n)
{
	struct kvt_nvme *m = (struct kvt_nvme *)n;
	uint32_t k;

	pthread_mutex_lock(&m->mu);
	k = n->n_free;
	pthread_mutex_unlock(&m->mu);
	return k;
}

const char *
kvt_nvme_path(const struct kvt_nvme *n)
{
	return n->fd_path[0] ? n->fd_path : n->path;
}

uint32_t
kvt_nvme_stale_removed(const struct kvt_nvme *n, const char **first)
{
	if (first)
		*first = n->stale_name;
	return n->stale_removed;
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
	int r;

	if (n->sync_failed)
		return kvt_err(-EIO, "nvme: fdatasync %s failed earlier: its data may be lost",
			       n->path);
	r = kvt_sync_fd(n->fd, KVT_SYNC_DATA);
	if (r == 0)
		return 0;
	n->sync_failed = true; /* the dirty pages may be gone: never report success again */
	return kvt_err(r, "nvme: fdatasync %s: %s", n->path, nvme_strerror(-r, eb, sizeof eb));
}

bool
kvt_nvme_sync_failed(const struct kvt_nvme *n)
{
	return n && n->sync_failed;
}

int
kvt_nvme_read_header(struct kvt_nvme *n, uint32_t slot, struct kvt_fmt_blkhdr *h)
{
	uint64_t off = nvme_slot_off(n, slot);
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

void
kvt_nvme_punch(struct kvt_nvme *n, uint32_t slot)
{
	if (slot < n->n_slots)
		(void)fallocate(n->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				(off_t)nvme_slot_off(n, slot),
				(off_t)n->slot_bytes);
}

/* ---- the slot table and counters ----------------------------------------------------------- */

bool
kvt_nvme_slot_info(struct kvt_nvme *n, uint32_t slot, struct kvt_nvme_slotinfo *out)
{
	bool ok;

	if (!n || slot >= n->n_slots)
		return false;
	pthread_mutex_lock(&n->mu);
	ok = n->lenc[slot] != 0;
	if (ok) {
		out->tag = n->tag[slot];
		out->lenc = n->lenc[slot];
	}
	pthread_mutex_unlock(&n->mu);
	return ok;
}

int
kvt_nvme_slot_set(struct kvt_nvme *n, uint32_t slot, const struct kvt_nvme_slotinfo *in)
{
	uint32_t codec;

	if (!n || !in || slot >= n->n_slots)
		return kvt_err(-EINVAL, "nvme slot set: %s", !n || !in ? "tier or entry is NULL" :
			       "slot out of range");
	codec = kvt_fmt_lenc_codec(in->lenc);
	if (!kvt_fmt_lenc_bytes(in->lenc, n->block_bytes) ||
	    (codec != KVT_CODEC_NONE && codec != (uint32_t)n->codec))
		return kvt_err(-EINVAL, "nvme slot %u: length code %#x names no stored block of "
			       "this tier", slot, in->lenc);
	pthread_mutex_lock(&n->mu);
	n->tag[slot] = in->tag;
	n->lenc[slot] = (uint16_t)in->lenc;
	pthread_mutex_unlock(&n->mu);
	return 0;
}

uint64_t
kvt_nvme_meta_bytes(const struct kvt_nvme *n)
{
	return n ? (uint64_t)n->n_slots * (sizeof *n->tag + sizeof *n->lenc) : 0;
}

void
kvt_nvme_get_stats(struct kvt_nvme *n, struct kvt_nvme_stats *out)
{
	pthread_mutex_lock(&n->mu);
	*out = n->st;
	pthread_mutex_unlock(&n->mu);
}

bool
kvt_nvme_zero_copy(const struct kvt_nvme *n)
{
	return n && n->host_base != NULL;
}

const char *
kvt_nvme_zc_reason(const struct kvt_nvme *n)
{
	return n->zc_reason;
}
