/* SPDX-License-Identifier: MIT */
/*
 * tiers/nvme_work.c - the NVME tier's worker pool (kvt_nvme_opts.workers threads): the CPU work
 * of an IO done outside the tier's lock (and so outside the engine's), several blocks at once.
 *
 * A write's submit queues its request (NVME_ENCODING) on work_q; a worker checksums it (XXH3-64
 * of the raw block), encodes it when a codec is set, writes its header page, and then, under mu,
 * queues and submits its SQE. A read whose last byte has arrived is queued (NVME_VERIFYING) by
 * the reap that saw its CQE; a worker verifies it (the header and checksum, the decode) and puts
 * it (NVME_VERIFIED, with its result) on done_q, waking a reaper that sleeps in the CQ wait; the
 * next kvt_nvme_reap() hands its completion out. Until then the read is neither complete nor
 * free: nothing upstream can treat its destination as valid before it verified.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "tiers/base/error.h"
#include "tiers/codec.h"
#include "tiers/nvme_int.h"

/* Seal a queued write (no lock), then queue and submit its SQE (mu held on return). */
static void
nvme_work_write(struct kvt_nvme *n, struct nvme_worker *w, struct nvme_req *req)
{
	const void *raw = req->data ? (const void *)req->data : req->buf + NVME_HPAGE;
	int r;

	kvt_nvme_seal(n, req, raw, &req->meta, w->scratch, w->enc);
	pthread_mutex_lock(&n->mu);
	n->n_encoding--;
	req->parked = NVME_ACTIVE;
	r = kvt_nvme_queue_rest(n, req);
	if (r == 0) {
		(void)kvt_nvme_submit_queued(n); /* a refusal is retried by the next reap's flush */
		return;
	}
	/* no SQE (not expected): complete it with the error through the delayed path */
	req->parked = NVME_DELAYED;
	req->delayed_res = r;
	req->delay_gen = 0;
	n->n_parked++;
	n->n_delayed++;
	kvt_nvme_poke(n);
}

/* Verify a read whose IO is complete (no lock), then put it on done_q (mu held on return). */
static void
nvme_work_read(struct kvt_nvme *n, struct nvme_worker *w, struct nvme_req *req)
{
	int r;

	if (n->hooks.before_verify)
		n->hooks.before_verify(n->hooks.arg, req->slot);
	kvt_err_clear();
	r = kvt_nvme_verify(n, req, w->scratch);
	pthread_mutex_lock(&n->mu);
	req->vres = r;
	snprintf(req->verr, sizeof req->verr, "%s", r ? kvt_last_error_message() : "");
	req->parked = NVME_VERIFIED;
	n->done_q[(n->done_head + n->done_n++) % n->qd] = req->index;
	if (n->reaper_waiting) {
		n->reaper_waiting = false; /* one wake-up per wait */
		kvt_nvme_poke(n);
	}
}

/* A worker: seal queued writes and verify completed reads until asked to stop. */
static void *
nvme_work_main(void *arg)
{
	struct nvme_worker *w = arg;
	struct kvt_nvme *n = w->n;

	pthread_mutex_lock(&n->mu);
	for (;;) {
		struct nvme_req *req;

		while (!n->work_n && !n->work_stop)
			pthread_cond_wait(&n->work_cv, &n->mu);
		if (!n->work_n)
			break;
		req = &n->reqs[n->work_q[n->work_head]];
		n->work_head = (n->work_head + 1) % n->qd;
		n->work_n--;
		pthread_mutex_unlock(&n->mu);
		if (req->is_write)
			nvme_work_write(n, w, req);
		else
			nvme_work_read(n, w, req);
	}
	pthread_mutex_unlock(&n->mu);
	return NULL;
}

/**
 * kvt_nvme_queue_verify() - hand a read whose IO is complete to the workers (mu held; the
 * reaping thread). It stays busy and in flight (NVME_VERIFYING) until a reap hands it out.
 */
void
kvt_nvme_queue_verify(struct kvt_nvme *n, struct nvme_req *req)
{
	req->parked = NVME_VERIFYING;
	n->n_verifying++;
	n->work_q[(n->work_head + n->work_n++) % n->qd] = req->index;
	pthread_cond_signal(&n->work_cv);
}

/**
 * kvt_nvme_deliver_verified() - finish up to @max verified reads into @out, oldest first (mu
 * held; the reaping thread). A failed one's message is raised again on this thread. Returns the
 * completions written.
 */
uint32_t
kvt_nvme_deliver_verified(struct kvt_nvme *n, struct kvt_nvme_cqe *out, uint32_t max)
{
	uint32_t got = 0;

	while (got < max && n->done_n) {
		struct nvme_req *req = &n->reqs[n->done_q[n->done_head]];

		n->done_head = (n->done_head + 1) % n->qd;
		n->done_n--;
		n->n_verifying--;
		req->parked = NVME_ACTIVE;
		if (req->vres)
			(void)kvt_err(req->vres, "%s", req->verr);
		kvt_nvme_finish(n, req, req->vres, &out[got++]);
	}
	return got;
}

/* Free the workers' buffers (threads already joined or never started). */
static void
nvme_work_free(struct kvt_nvme *n, uint32_t count)
{
	for (uint32_t i = 0; i < count; i++) {
		free(n->workers[i].scratch);
		free(n->workers[i].enc);
	}
	free(n->workers);
	n->workers = NULL;
}

/**
 * kvt_nvme_workers_start() - start @count worker threads (at most KVT_NVME_MAX_WORKERS), each
 * with its own codec buffers. Called by kvt_nvme_open before any IO. On failure the threads
 * started so far are kept (fewer workers); with none, everything runs inline. Returns 0 or
 * -ENOMEM / the pthread_create error (n_workers says how many run).
 */
int
kvt_nvme_workers_start(struct kvt_nvme *n, uint32_t count)
{
	size_t sb = kvt_codec_scratch_bytes(n->block_bytes);
	uint32_t i;
	int r = 0;

	if (count > KVT_NVME_MAX_WORKERS)
		count = KVT_NVME_MAX_WORKERS;
	n->workers = calloc(count, sizeof *n->workers);
	if (!n->workers)
		return kvt_err(-ENOMEM, "nvme: %u workers", count);
	for (i = 0; i < count; i++) {
		struct nvme_worker *w = &n->workers[i];

		w->n = n;
		/* decode scratch always: a header may name a codec the tier does not write */
		w->scratch = malloc(sb);
		w->enc = n->codec != KVT_CODEC_NONE ? malloc(n->block_bytes) : NULL;
		if (!w->scratch || (n->codec != KVT_CODEC_NONE && !w->enc))
			r = kvt_err(-ENOMEM, "nvme: codec buffers of worker %u", i);
		else if ((r = pthread_create(&w->thr, NULL, nvme_work_main, w)) != 0)
			r = kvt_err(-r, "nvme: starting worker %u: error %d", i, r);
		if (r != 0) {
			free(w->scratch);
			free(w->enc);
			w->scratch = w->enc = NULL;
			break;
		}
		n->n_workers++;
	}
	if (n->n_workers == 0)
		nvme_work_free(n, 0);
	return r;
}

/**
 * kvt_nvme_workers_stop() - stop and join the workers (their queue is empty once all IO has
 * completed: kvt_nvme_close reaps first), free their buffers.
 */
void
kvt_nvme_workers_stop(struct kvt_nvme *n)
{
	uint32_t count = n->n_workers;

	if (!count)
		return;
	pthread_mutex_lock(&n->mu);
	n->work_stop = true;
	pthread_cond_broadcast(&n->work_cv);
	pthread_mutex_unlock(&n->mu);
	for (uint32_t i = 0; i < count; i++)
		pthread_join(n->workers[i].thr, NULL);
	n->n_workers = 0;
	nvme_work_free(n, count);
}
