/* SPDX-License-Identifier: MIT */
/*
 * tiers/nvme_io.c - the NVME tier's IO: submission (batched SQEs over registered staging buffers
 * and the registered file), handing work to the worker pool (nvme_work.c), completion (short IO
 * continued, verification (nvme_seal.c), late/lost completions and deadlines) and reaping. The
 * contract is in tier_nvme.h, the state in nvme_int.h.
 *
 * Life of an IO: submit_* takes a request context (with its staging buffer) off a free stack,
 * fills the staging buffer (writes) and queues one SQE whose user_data is the request. reap()
 * hands queued SQEs to the kernel, then takes CQEs one at a time; each CQE belongs to exactly one
 * request, which either finishes (one completion out, the request back on the free stack) or is
 * continued with a new SQE for its remaining bytes. A request thus owns at most one SQE or one
 * in-kernel IO at any time, so at most queue_depth CQEs are ever pending in a CQ of twice that.
 */
#include <errno.h>
#include <string.h>
#include <time.h>

#include <liburing.h>

#include "tiers/base/clock.h"
#include "tiers/base/error.h"
#include "tiers/nvme_int.h"

/* ---- submission ---------------------------------------------------------------------------- */

/*
 * io_uring_submit the @sqes SQEs in the SQ, or what the test hook submit_cap makes of it: a
 * refusal, or a partial submit (the SQ tail published as io_uring_submit does, liburing 2.x,
 * and only the first k entered; the others go with the next submit). Returns the SQEs taken or
 * -errno.
 */
static int
nvme_submit(struct kvt_nvme *n, uint32_t sqes)
{
	struct io_uring_sq *sq = &n->ring.sq;
	int cap;

	if (!n->hooks.submit_cap)
		return io_uring_submit(&n->ring);
	cap = n->hooks.submit_cap(n->hooks.arg, sqes);
	if (cap < 0)
		return cap;
	if ((uint32_t)cap >= sqes)
		return io_uring_submit(&n->ring);
	if (cap == 0)
		return 0;
	if (sq->sqe_head != sq->sqe_tail) {
		sq->sqe_head = sq->sqe_tail;
		io_uring_smp_store_release(sq->ktail, sq->sqe_tail);
	}
	return io_uring_enter((unsigned)n->ring.ring_fd, (unsigned)cap, 0, 0, NULL);
}

/*
 * io_uring_submit the queued SQEs: the requests' (queued) and a wake-up NOP's (nop_queued). The
 * kernel takes them in order, so the NOP is among the r taken when more than the nop_ahead
 * request SQEs in front of it were. Returns the requests' SQEs taken or -errno (nothing taken).
 */
static int
nvme_flush(struct kvt_nvme *n)
{
	uint32_t sqes = n->queued + (n->nop_queued ? 1u : 0u), took;
	int r;

	if (sqes == 0)
		return 0;
	r = nvme_submit(n, sqes);
	if (r < 0)
		return r;
	took = (uint32_t)r < sqes ? (uint32_t)r : sqes;
	if (n->nop_queued && took > n->nop_ahead) {
		n->nop_queued = false;
		took--;
	} else if (n->nop_queued) {
		n->nop_ahead -= took;
	}
	n->queued -= took;
	return (int)took;
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
	return n->qd - n->n_free - n->queued - n->n_parked - n->n_encoding - n->n_verifying;
}

/* The buffer of @req's current piece (from done on): staging, or the HOST slot (zero-copy
 * payload; a one-IO put: its header room and payload); *idx its registered buffer index, *len
 * the piece's bytes. */
static uint8_t *
nvme_piece(const struct nvme_req *req, int *idx, unsigned *len)
{
	*idx = (int)req->index;
	*len = req->len - req->done;
	if (!req->data)
		return req->buf + req->done;
	if (req->whole) {
		*idx = (int)req->data_index;
		return req->data - NVME_HPAGE + req->done;
	}
	if (req->done < NVME_HPAGE) {
		*len = NVME_HPAGE - req->done; /* the header page first */
		return req->buf + req->done;
	}
	*idx = (int)req->data_index;
	return req->data + (req->done - NVME_HPAGE);
}

/* Queue one SQE for the rest of @req's current piece: bytes [done, end of piece) of its slot. */
int
kvt_nvme_queue_rest(struct kvt_nvme *n, struct nvme_req *req)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&n->ring);
	unsigned len;
	int bi;
	uint8_t *buf = nvme_piece(req, &bi, &len);
	uint64_t off = nvme_slot_off(n, req->slot) + req->done;
	int fd = n->fixed_file ? 0 : n->fd;

	if (!sqe) {
		/* Not expected: every request owns at most one SQE and the SQ has qd entries. */
		(void)nvme_flush(n);
		sqe = io_uring_get_sqe(&n->ring);
		if (!sqe)
			return kvt_err(-EAGAIN, "nvme: submission queue full");
	}
	if (req->is_write && n->fixed_bufs)
		io_uring_prep_write_fixed(sqe, fd, buf, len, off, bi);
	else if (req->is_write)
		io_uring_prep_write(sqe, fd, buf, len, off);
	else if (n->fixed_bufs)
		io_uring_prep_read_fixed(sqe, fd, buf, len, off, bi);
	else
		io_uring_prep_read(sqe, fd, buf, len, off);
	req->piece = len;
	n->st.sqes++;
	if (n->fixed_file)
		io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE);
	io_uring_sqe_set_data(sqe, req);
	req->deadline = kvt_now_ns() + n->timeout_ns;
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
		return kvt_err(-EIO,
			       "nvme %s: every staging buffer is held by an IO that timed out", what);
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
	req->data = NULL;
	req->whole = false;
	req->tabled = false;
	req->want_lenc = 0;
	*reqp = req;
	return 0;
}

static void nvme_room_mark(struct kvt_nvme *n, const void *p, bool on);

static void
nvme_req_put(struct kvt_nvme *n, struct nvme_req *req)
{
	if (req->whole)
		nvme_room_mark(n, req->data, false);
	req->whole = false;
	req->busy = false;
	n->free_stack[n->n_free++] = req->index;
}

/*
 * Wake a reaper blocked in the CQ wait (a NOP completes at once; its CQE carries no request and
 * is skipped). The NOP is no request's SQE: it is kept apart from queued, so a refused or partial
 * submit leaves no phantom IO in the counts; a NOP still in the SQ goes with the next flush, and
 * one is enough (no second is queued behind it).
 */
void
kvt_nvme_poke(struct kvt_nvme *n)
{
	struct io_uring_sqe *sqe;

	if (!n->nop_queued) {
		sqe = io_uring_get_sqe(&n->ring);
		if (!sqe)
			return;
		io_uring_prep_nop(sqe);
		io_uring_sqe_set_data(sqe, NULL);
		n->nop_queued = true;
		n->nop_ahead = n->queued;
	}
	(void)nvme_flush(n);
}

/* io_uring_submit the queued SQEs (mu held): the workers' way to nvme_flush. */
int
kvt_nvme_submit_queued(struct kvt_nvme *n)
{
	return nvme_flush(n);
}

/*
 * Whether the block at @p (block_bytes, read or written as round_up(block_bytes, 4096)) lies in
 * the registered HOST memory within one registered chunk, 4 KiB aligned: then *idx is the
 * chunk's buffer index.
 */
static bool
nvme_zc_span(const struct kvt_nvme *n, const void *p, uint32_t *idx)
{
	uintptr_t a = (uintptr_t)p, base = (uintptr_t)n->host_base;
	size_t need = n->slot_bytes - NVME_HPAGE; /* round_up(block_bytes, 4 KiB) */
	size_t off, c, end;

	if (!n->host_base || a < base || a - base >= n->host_len || a % NVME_ALIGN)
		return false;
	off = a - base;
	c = off / n->host_chunk;
	end = (c + 1) * n->host_chunk < n->host_len ? (c + 1) * n->host_chunk : n->host_len;
	if (off + need > end)
		return false;
	*idx = n->qd + (uint32_t)c;
	return true;
}

/*
 * Whether a zero-copy put (get) of the block at @p (in the registered HOST memory) can be one IO
 * from (into) its slot's header room: the HOST memory has header room, @p is a slot's data, and
 * no other put or get in flight (or timed out, still the kernel's) uses that room (a caller
 * putting one HOST slot to two disk slots at once; the engine never does). mu held.
 */
static bool
nvme_zc_room(const struct kvt_nvme *n, const void *p)
{
	size_t off = (size_t)((uintptr_t)p - (uintptr_t)n->host_base), hs;

	if (n->host_off != NVME_HPAGE || off < NVME_HPAGE || (off - NVME_HPAGE) % n->host_stride)
		return false;
	hs = (off - NVME_HPAGE) / n->host_stride;
	return !(n->room_busy[hs / 64] >> (hs % 64) & 1u);
}

/* Mark (@on) or clear the header room of the HOST slot whose data is at @p (a whole request's
 * data, so nvme_zc_room held). mu held. */
static void
nvme_room_mark(struct kvt_nvme *n, const void *p, bool on)
{
	size_t hs = ((size_t)((uintptr_t)p - (uintptr_t)n->host_base) - NVME_HPAGE) /
		    n->host_stride;
	uint64_t bit = 1ull << (hs % 64);

	n->room_busy[hs / 64] = on ? n->room_busy[hs / 64] | bit : n->room_busy[hs / 64] & ~bit;
}

static int
nvme_submit_write_locked(struct kvt_nvme *n, uint32_t slot, const void *src,
			 const struct kvt_nvme_wmeta *m, uint64_t user_data, bool tabled)
{
	struct nvme_req *req;
	uint32_t idx;
	int r;

	if (!m)
		return kvt_err(-EINVAL, "nvme write: meta is NULL");
	r = nvme_req_get(n, slot, src, "write", &req);
	if (r != 0)
		return r;
	req->is_write = true;
	req->key = m->key;
	req->user_data = user_data;
	req->tabled = tabled;
	if (tabled)
		n->lenc[slot] = 0; /* being rewritten: unknown until it completes */
	if (tabled && n->codec == KVT_CODEC_NONE && nvme_zc_span(n, src, &idx)) {
		req->data = (uint8_t *)(uintptr_t)src;
		req->data_index = idx;
		req->whole = nvme_zc_room(n, src);
		if (req->whole)
			nvme_room_mark(n, src, true);
		n->st.zc_writes++;
		n->st.zc_one_io += req->whole;
	} else {
		n->st.staged_writes++;
	}
	if (n->n_workers) {
		/* a worker checksums (and encodes) it; a staged write is copied now (the caller's
		 * buffer may change at once), a zero-copy one's HOST slot stays put until it is
		 * complete */
		if (!req->data)
			memcpy(req->buf + NVME_HPAGE, src, n->block_bytes);
		req->meta = *m;
		req->parked = NVME_ENCODING;
		n->n_encoding++;
		n->work_q[(n->work_head + n->work_n++) % n->qd] = req->index;
		pthread_cond_signal(&n->work_cv);
		return 0;
	}
	kvt_nvme_seal(n, req, src, m, n->scratch, NULL);
	r = kvt_nvme_queue_rest(n, req);
	if (r != 0)
		nvme_req_put(n, req);
	return r;
}

/* kvt_nvme_submit_write_meta (@tabled false) and kvt_nvme_put (true): take mu around the
 * submit. */
static int
nvme_submit_write(struct kvt_nvme *n, uint32_t slot, const void *src,
		  const struct kvt_nvme_wmeta *m, uint64_t user_data, bool tabled)
{
	int r;

	if (!n)
		return kvt_err(-EINVAL, "nvme %s: tier is NULL", tabled ? "put" : "write");
	pthread_mutex_lock(&n->mu);
	r = nvme_submit_write_locked(n, slot, src, m, user_data, tabled);
	pthread_mutex_unlock(&n->mu);
	return r;
}

int
kvt_nvme_submit_write_meta(struct kvt_nvme *n, uint32_t slot, const void *src,
			   const struct kvt_nvme_wmeta *m, uint64_t user_data)
{
	return nvme_submit_write(n, slot, src, m, user_data, false);
}

int
kvt_nvme_put(struct kvt_nvme *n, uint32_t slot, const void *src, const struct kvt_nvme_wmeta *m,
	     uint64_t user_data)
{
	return nvme_submit_write(n, slot, src, m, user_data, true);
}

int
kvt_nvme_get(struct kvt_nvme *n, uint32_t slot, void *dst, uint64_t user_data)
{
	struct nvme_req *req;
	uint64_t pay;
	uint32_t idx, lenc;
	int r;

	if (!n || slot >= n->n_slots)
		return kvt_err(-EINVAL, "nvme get: %s", n ? "slot out of range" : "tier is NULL");
	pthread_mutex_lock(&n->mu);
	lenc = n->lenc[slot];
	pay = kvt_fmt_lenc_bytes(lenc, n->block_bytes);
	r = pay ? nvme_req_get(n, slot, dst, "read", &req)
		: kvt_err(KVT_ECORRUPT, "nvme slot %u: no completed write recorded", slot);
	if (r != 0) {
		pthread_mutex_unlock(&n->mu);
		return r;
	}
	req->is_write = false;
	req->tabled = true;
	req->want_tag = n->tag[slot];
	req->want_lenc = lenc;
	req->user_data = user_data;
	req->dst = dst;
	req->stored = 0;
	req->len = nvme_io_len(n, (uint32_t)pay);
	if (kvt_fmt_lenc_codec(lenc) == KVT_CODEC_NONE && nvme_zc_span(n, dst, &idx) &&
	    nvme_zc_room(n, dst)) {
		/* [header page | payload] in one IO, straight into the HOST slot and its room */
		req->data = dst;
		req->data_index = idx;
		req->whole = true;
		nvme_room_mark(n, dst, true);
		n->st.zc_reads++;
	} else {
		n->st.staged_reads++;
	}
	r = kvt_nvme_queue_rest(n, req);
	if (r != 0)
		nvme_req_put(n, req);
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

int
kvt_nvme_submit_read_len(struct kvt_nvme *n, uint32_t slot, void *dst, uint64_t key,
			 uint32_t stored, uint64_t user_data)
{
	struct nvme_req *req;
	int r;

	if (!n)
		return kvt_err(-EINVAL, "nvme read: tier is NULL");
	pthread_mutex_lock(&n->mu);
	r = nvme_req_get(n, slot, dst, "read", &req);
	if (r != 0) {
		pthread_mutex_unlock(&n->mu);
		return r;
	}
	req->is_write = false;
	req->key = key;
	req->user_data = user_data;
	req->dst = dst;
	req->stored = stored;
	req->len = stored ? nvme_io_len(n, stored) : (uint32_t)n->slot_bytes;
	n->st.staged_reads++;
	r = kvt_nvme_queue_rest(n, req);
	if (r != 0)
		nvme_req_put(n, req);
	pthread_mutex_unlock(&n->mu);
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

int
kvt_nvme_flush_quiet(struct kvt_nvme *n)
{
	int r;

	if (!n)
		return -EINVAL;
	pthread_mutex_lock(&n->mu);
	r = nvme_flush(n);
	pthread_mutex_unlock(&n->mu);
	return r;
}

/* ---- completion ---------------------------------------------------------------------------- */

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
	return kvt_nvme_queue_rest(n, req);
}

/*
 * Interpret one CQE of @req with result @res. Returns 1 when @req finished (*c filled, @req back
 * on the free stack), 0 when it was continued with a new SQE.
 */
static int
nvme_complete(struct kvt_nvme *n, struct nvme_req *req, int res, struct kvt_nvme_cqe *c)
{
	size_t left = req->piece;
	char eb[128];

	if (n->hooks.on_complete) {
		unsigned plen;
		int bi;
		uint8_t *pbuf = nvme_piece(req, &bi, &plen);

		n->hooks.on_complete(n->hooks.arg, req->is_write, req->slot, pbuf, left,
				     nvme_slot_off(n, req->slot) + req->done, &res);
	}
	if (res >= 0 && (size_t)res == left && req->done + left < req->len && !n->closing) {
		/* this piece is done (a zero-copy put's header page): on to the payload */
		req->done += (uint32_t)left;
		req->stalls = 0;
		res = kvt_nvme_queue_rest(n, req);
		if (res == 0)
			return 0;
	} else if (res < 0) {
		kvt_err(res, "nvme %s of slot %u: %s", req->is_write ? "write" : "read", req->slot,
			nvme_strerror(-res, eb, sizeof eb));
	} else if ((size_t)res < left) {
		res = nvme_continue(n, req, (size_t)res);
		if (res == 0)
			return 0;
	} else if ((size_t)res > left) {
		res = kvt_err(-EIO, "nvme slot %u: %d bytes done of %zu asked", req->slot, res,
			      left);
	} else if (req->done + left < req->len) {
		res = kvt_err(KVT_ESHORTIO, "nvme slot %u: closing mid-IO", req->slot);
	} else if (req->is_write || n->closing) {
		res = 0;
	} else if (n->n_workers) {
		/* a worker verifies it; a reap hands it out (kvt_nvme_deliver_verified) */
		kvt_nvme_queue_verify(n, req);
		return 0;
	} else {
		if (n->hooks.before_verify)
			n->hooks.before_verify(n->hooks.arg, req->slot);
		res = kvt_nvme_verify(n, req, NULL);
	}
	kvt_nvme_finish(n, req, res, c);
	return 1;
}

/* Finish @req with @res: a put's slot table entry, the completion @c, the request freed. */
void
kvt_nvme_finish(struct kvt_nvme *n, struct nvme_req *req, int res, struct kvt_nvme_cqe *c)
{
	if (req->is_write && req->tabled && res == 0) {
		n->tag[req->slot] = kvt_fmt_write_tag(req->key);
		n->lenc[req->slot] = (uint16_t)kvt_fmt_lenc(req->codec, req->stored, n->block_bytes);
	}
	c->user_data = req->user_data;
	c->stored = req->is_write ? req->stored : 0;
	c->codec = req->is_write ? req->codec : 0;
	c->sum = req->is_write ? req->sum : 0;
	c->res = res;
	c->is_write = req->is_write;
	c->buf_late = false;
	c->slot = req->slot;
	nvme_req_put(n, req);
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
		/* its timeout was reported long ago: the buffer is the kernel's no more, nor (a
		 * write) the slot, nor (a zero-copy read) the caller's HOST buffer: the caller may
		 * use them again (kvt_nvme_late_writes, kvt_nvme_late_reads) */
		if (req->is_write && n->n_late_slots < n->qd)
			n->late_slots[n->n_late_slots++] = req->slot; /* else: stays quarantined */
		else if (!req->is_write && req->data && n->n_late_bufs < n->qd)
			n->late_bufs[n->n_late_bufs++] = req->dst; /* else: stays quarantined */
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
	if (fate == KVT_NVME_FATE_LATE) {
		req->parked = NVME_HELD;
		req->delayed_res = res;
		n->n_parked++;
		n->n_held++;
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

/* Hand in the kept CQEs of HELD requests that have timed out since (late completions). */
static void
nvme_deliver_late(struct kvt_nvme *n)
{
	struct kvt_nvme_cqe unused;

	for (uint32_t i = 0; i < n->qd && n->n_late_due; i++) {
		struct nvme_req *req = &n->reqs[i];

		if (!req->busy || !req->late_due)
			continue;
		req->late_due = false;
		n->n_late_due--;
		(void)nvme_cqe(n, req, req->delayed_res, &unused); /* ABANDONED: recycled */
	}
}

/* Whether @req's deadline counts: its piece is queued or in the kernel, or its CQE was lost or
 * held back by the fate hook. */
static bool
nvme_can_expire(const struct nvme_req *req)
{
	return req->busy && (req->parked == NVME_ACTIVE || req->parked == NVME_LOST ||
			     req->parked == NVME_HELD);
}

/* Time out IO pieces past their deadline (only while nothing waits in the SQ). */
static uint32_t
nvme_expire(struct kvt_nvme *n, struct kvt_nvme_cqe *out, uint32_t max)
{
	uint64_t now = kvt_now_ns();
	uint32_t got = 0;

	for (uint32_t i = 0; i < n->qd && n->queued == 0 && got < max; i++) {
		struct nvme_req *req = &n->reqs[i];

		if (!nvme_can_expire(req) || req->deadline > now)
			continue;
		kvt_err(-ETIMEDOUT, "nvme %s of slot %u: no completion within %llu ms",
			req->is_write ? "write" : "read", req->slot,
			(unsigned long long)(n->timeout_ns / 1000000));
		nvme_fill(req, -ETIMEDOUT, &out[got]);
		/* a zero-copy read: the kernel may still write the caller's buffer */
		out[got++].buf_late = !req->is_write && req->data != NULL;
		if (req->parked == NVME_LOST) {
			n->n_lost--;
			n->n_retired++;
			req->parked = NVME_RETIRED; /* stays counted in n_parked */
		} else if (req->parked == NVME_HELD) {
			/* the kernel finished it, but only the next reap may say so */
			n->n_held--;
			n->n_parked--;
			n->n_abandoned++;
			n->n_late_due++;
			req->late_due = true;
			req->parked = NVME_ABANDONED;
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
	uint64_t now = kvt_now_ns(), first = UINT64_MAX, d;

	for (uint32_t i = 0; i < n->qd; i++) {
		const struct nvme_req *req = &n->reqs[i];

		if (nvme_can_expire(req) && req->deadline < first)
			first = req->deadline;
	}
	d = first == UINT64_MAX ? n->timeout_ns : first > now ? first - now : 0;
	if ((n->n_delayed || n->n_encoding || n->n_verifying || n->queued || n->n_late_due) &&
	    d > 1000000)
		d = 1000000; /* a worker's submit failure parked one, a write is being sealed, a
			      * read verified, or a submit was refused (retried by the next
			      * flush): look again soon */
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
	       n->n_verifying > 0 || n->n_delayed > 0 || n->n_held > 0;
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
	if (n->n_late_due)
		nvme_deliver_late(n);
	if (n->n_delayed)
		got += nvme_deliver_delayed(n, out, max, false);
	n->reap_gen++;
	while (got < max) {
		if (n->done_n) {
			got += kvt_nvme_deliver_verified(n, out + got, max - got);
			if (got == max)
				break;
		}
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
			/* a worker may submit meanwhile: never wait holding mu; one that finishes a
			 * verification wakes us (a NOP) */
			n->reaper_waiting = true;
			pthread_mutex_unlock(&n->mu);
			r = io_uring_wait_cqe_timeout(&n->ring, &cqe, &ts);
			pthread_mutex_lock(&n->mu);
			n->reaper_waiting = false;
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

int
kvt_nvme_reap_try(struct kvt_nvme *n, struct kvt_nvme_cqe *out, uint32_t max)
{
	int r;

	if (!n || (!out && max > 0))
		return kvt_err(-EINVAL, "nvme reap: %s is NULL", n ? "out" : "tier");
	if (pthread_mutex_trylock(&n->mu) != 0)
		return -EBUSY; /* a submitter or worker holds it: a state, no message */
	r = nvme_reap_locked(n, out, max, false);
	pthread_mutex_unlock(&n->mu);
	return r;
}

uint32_t
kvt_nvme_late_writes(struct kvt_nvme *n, uint32_t *slots, uint32_t max)
{
	uint32_t k = 0;

	pthread_mutex_lock(&n->mu);
	while (k < max && n->n_late_slots)
		slots[k++] = n->late_slots[--n->n_late_slots];
	pthread_mutex_unlock(&n->mu);
	return k;
}

uint32_t
kvt_nvme_late_reads(struct kvt_nvme *n, void **bufs, uint32_t max)
{
	uint32_t k = 0;

	pthread_mutex_lock(&n->mu);
	while (k < max && n->n_late_bufs)
		bufs[k++] = n->late_bufs[--n->n_late_bufs];
	pthread_mutex_unlock(&n->mu);
	return k;
}

bool
kvt_nvme_abandoned(const struct kvt_nvme *n)
{
	struct kvt_nvme *m = (struct kvt_nvme *)n;
	bool a;

	pthread_mutex_lock(&m->mu);
	a = n->n_abandoned > 0;
	pthread_mutex_unlock(&m->mu);
	return a;
}
