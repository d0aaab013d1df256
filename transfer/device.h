/* SPDX-License-Identifier: MIT */
/*
 * transfer/device.h - the device backend interface (internal).
 *
 * Two implementations, chosen at run time so one test binary can run both (ggml-backend):
 *   transfer/device_emu.c   always built. "Device memory" is ordinary host memory; a stream is a
 *                           worker thread executing its queue in order; an event is a
 *                           completion counter. Copies really happen later, on the stream's
 *                           thread, so a missing wait shows up as wrong bytes in tests.
 *   transfer/device_cuda.c  built when KVT_WITH_CUDA: cudaMalloc, cudaHostAlloc, streams, events.
 *
 * Every function returns 0 or a negative code (KVT_EDEVICE with the backend's message in
 * d->errmsg); none aborts. Thread-safety: all entries may be called from any thread.
 * d->errmsg and d->last_error are written (under a backend lock) by whichever thread fails last;
 * read them only where no other thread can fail meanwhile. The per-thread, always-safe source is
 * kvt_last_error_message(), which every failure also sets. -EAGAIN from event_query is a state,
 * not a failure, and sets no message.
 */
#ifndef KVT_TRANSFER_DEVICE_H
#define KVT_TRANSFER_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVT_DEVICE_OPS_V1 1u

struct kvt_device;
struct kvt_stream; /* backend-defined; on CUDA it is the cudaStream_t itself */
struct kvt_event;  /* backend-defined */

/** One contiguous copy. Addresses may be device or host memory; the backend works it out. */
struct kvt_copy {
	void *dst;       /* destination */
	const void *src; /* source */
	size_t len;      /* bytes */
};

/** What a backend can do (data, as in ggml's dev caps). */
struct kvt_device_caps {
	bool async;              /* copies complete after the call returns */
	bool device_mem_is_host; /* device pointers may be dereferenced by the CPU (emulated) */
	bool pinned_host;        /* host_alloc returns page-locked memory */
};

struct kvt_device_ops {
	uint32_t abi_version; /* KVT_DEVICE_OPS_V1; always first */
	const char *name;     /* "emulated" or "cuda" */
	void (*destroy)(struct kvt_device *d); /* waits for all streams; frees d */
	/* device memory (HBM) */
	int (*mem_alloc)(struct kvt_device *d, size_t len, void **out);
	void (*mem_free)(struct kvt_device *d, void *p);
	/* host memory for the HOST tier: pinned when possible. *pinned says whether it is;
	 * emulated: mmap + mlock, falling back to plain mmap when mlock is refused. */
	int (*host_alloc)(struct kvt_device *d, size_t len, void **out, bool *pinned);
	void (*host_free)(struct kvt_device *d, void *p, size_t len);
	/* streams: in-order queues */
	int (*stream_create)(struct kvt_device *d, struct kvt_stream **out);
	void (*stream_destroy)(struct kvt_device *d, struct kvt_stream *s); /* syncs first */
	/* queue n copies on s as one operation (cudaMemcpyBatchAsync or a gather kernel on CUDA;
	 * never one call per copy). The copies run after everything queued earlier on s; their
	 * order within the batch is unspecified (no copy may depend on another of the batch).
	 * v is read during the call only (the caller may reuse it at once); the memory it points
	 * to must stay valid and untouched until the copies complete (stream_sync or an event).
	 * n == 0 and len == 0 entries are allowed and do nothing. */
	int (*copy_batch_async)(struct kvt_device *d, struct kvt_stream *s, const struct kvt_copy *v,
				uint32_t n);
	int (*stream_sync)(struct kvt_device *d, struct kvt_stream *s);
	/* events: record marks the current end of s's queue; query/sync refer to the latest
	 * record; stream_wait_event makes s wait (device-side) for the latest record of e. */
	int (*event_create)(struct kvt_device *d, struct kvt_event **out);
	void (*event_destroy)(struct kvt_device *d, struct kvt_event *e);
	int (*event_record)(struct kvt_device *d, struct kvt_event *e, struct kvt_stream *s);
	int (*event_query)(struct kvt_device *d, struct kvt_event *e); /* 0 done, -EAGAIN not yet */
	int (*event_sync)(struct kvt_device *d, struct kvt_event *e);
	int (*stream_wait_event)(struct kvt_device *d, struct kvt_stream *s, struct kvt_event *e);
};

struct kvt_device {
	const struct kvt_device_ops *ops; /* vtable */
	struct kvt_device_caps caps;      /* capabilities */
	void *ctx;                        /* backend state */
	char errmsg[256];                 /* last backend error message (e.g. CUDA's) */
	int last_error;                   /* last raw backend error (cudaError_t), 0 if none */
};

/** Options of the emulated device. */
struct kvt_emu_opts {
	uint32_t max_delay_us;    /* each queued op first sleeps uniform 0..max_delay_us (test knob:
	                             delays and reorders completions across streams) */
	uint64_t seed;            /* RNG seed for those delays (per-stream streams derive from it) */
	uint64_t copy_bytes_per_s; /* bandwidth limit of copies (sleep len/bw); 0 = unlimited */
	bool lazy;                /* submits wake no worker: ops run when a thread observes them
	                             (event_query runs those the simulated link has finished,
	                             event_sync/stream_sync all up to the one waited for, a WAIT
	                             the recording stream's first); ignored with max_delay_us.
	                             For benchmarks: no thread hand-off per submit (see
	                             device_emu.c). Default false */
};

/**
 * Create the emulated device.
 * @o:   knobs, copied; NULL = no delay, seed 1, unlimited bandwidth.
 * @out: receives the device; NULL on failure. Destroy with kvt_device_destroy(), which drains
 *       every stream still alive and frees every stream, event, mem_alloc block and host_alloc
 *       mapping still alive.
 * caps: async, device_mem_is_host, pinned_host = whether a probe mlock() of one page succeeded
 * at create time (host_alloc's *pinned is the answer for each allocation).
 * Semantics (see device_emu.c): each stream is a worker thread running its queue in order; copy
 * batches are copied at submit and executed later on that thread; an event refers to its latest
 * record, stream_wait_event to the record that was latest when it was called. A thread in
 * event_sync or stream_sync whose stream is idle (no op running, not held) runs the ops queued
 * there when its wait began itself, in order, unless max_delay_us is set
 * (kvt_device_emu_stream_helped counts them); an op that waits for an event not yet done, and
 * what follows it, is left to the worker.
 * Returns 0, -EINVAL (out NULL), -ENOMEM.
 */
int kvt_device_emu_create(const struct kvt_emu_opts *o, struct kvt_device **out);

/**
 * Test knob of the emulated device: while @hold is true, @s's worker starts no further operation
 * (the one running, if any, finishes). Lets tests keep work "in flight" deterministically.
 * stream_sync/event_sync/stream_destroy on work behind a hold (on s, or on a stream that waits
 * for an event recorded on s) block until it is released; stream_destroy(s) releases s's own
 * hold, and destroy releases every hold before draining. Thread-safe.
 * Returns 0, -EINVAL (s NULL), KVT_ENOTSUP (@d is not the emulated device).
 */
int kvt_device_emu_stream_hold(struct kvt_device *d, struct kvt_stream *s, bool hold);

/**
 * Test knob of the emulated device: let the held stream @s run exactly @n_ops more queued
 * operations (a copy batch, an event record or a wait each count one), then hold it again.
 * Returns once they have run (or the queue is empty), so a test can stop a batch of layer-wise
 * copies between two layers deterministically. kvt_device_emu_stream_hold(d, s, false) releases
 * it for good. Returns 0, -EINVAL (s NULL, n_ops 0, s not held), KVT_ENOTSUP (not emulated).
 */
int kvt_device_emu_stream_step(struct kvt_device *d, struct kvt_stream *s, uint32_t n_ops);

/**
 * Test knob of the emulated device: how many threads sleep in event_sync right now, waiting for
 * a record not yet done (lets a test see that a thread has reached its wait). Thread-safe.
 * Returns the count; 0 when @d is not the emulated device.
 */
uint32_t kvt_device_emu_sleepers(struct kvt_device *d);

/**
 * Test knob of the emulated device: the timer sleeps made for @s's simulated link time
 * (copy_bytes_per_s set) so far, by its worker or a waiter running its ops; a copy whose link
 * time has already passed when its turn comes makes none, nor does a waiter's wait shorter than
 * 50 us (it spins). Thread-safe (a count read as it stands). Returns 0 when @d is not the
 * emulated device or @s is NULL.
 */
uint64_t kvt_device_emu_stream_sleeps(struct kvt_device *d, struct kvt_stream *s);

/**
 * Test knob of the emulated device: the ops of @s run so far by a thread waiting in event_sync
 * or stream_sync instead of by @s's worker (see kvt_device_emu_create). Thread-safe (a count
 * read as it stands). Returns 0 when @d is not the emulated device or @s is NULL.
 */
uint64_t kvt_device_emu_stream_helped(struct kvt_device *d, struct kvt_stream *s);

/**
 * Create the CUDA device on @ordinal. Returns 0; KVT_ENOTSUP in builds without CUDA;
 * KVT_EDEVICE when no usable GPU is present (message "no CUDA device: ..." in
 * kvt_last_error_message()) or its context cannot be created; -EINVAL for an ordinal out of
 * range. *out is NULL on failure. caps: async, pinned_host; device memory is not host memory.
 * destroy waits for the device (cudaDeviceSynchronize) but frees only d: streams, events and
 * memory are the caller's to free first.
 */
int kvt_device_cuda_create(int ordinal, struct kvt_device **out);

/**
 * kvt_device_cuda_batched() - 1 while @d's copy batches go through cudaMemcpyBatchAsync, 0 once
 * the driver refused that API and batches went to the copy kernel (or the runtime predates
 * 12.8, or a test forced another path). KVT_ENOTSUP when @d is not the CUDA device or CUDA is
 * not built in.
 */
int kvt_device_cuda_batched(struct kvt_device *d);

/** How the CUDA device performs a copy batch (kvt_device_cuda_copy_path()). */
enum kvt_cuda_copy_path {
	KVT_CUDA_COPY_AUTO = 0,      /* the batch API where allowed, else the copy kernel */
	KVT_CUDA_COPY_BATCH_API = 1, /* cudaMemcpyBatchAsync (CUDA 12.8+) */
	KVT_CUDA_COPY_KERNEL = 2,    /* kvt_copy_batch_cuda(): one launch per 128 copies */
	KVT_CUDA_COPY_LOOP = 3,      /* one cudaMemcpyAsync per copy (memory the GPU can't see) */
	KVT_CUDA_COPY_PATHS = 4
};

/**
 * kvt_device_cuda_copy_path() - test and benchmark knob of the CUDA device: make every later
 * copy batch of @d take @path (KVT_CUDA_COPY_AUTO restores the normal choice;
 * KVT_CUDA_COPY_BATCH_API means AUTO), and read in @counts (may be NULL) the copies queued so
 * far by each path, indexed by enum kvt_cuda_copy_path (counts[AUTO] stays 0). Under
 * KVT_CUDA_COPY_KERNEL, copies outside the device's arenas still go one at a time (LOOP).
 * Thread-safe; a batch being submitted meanwhile may take either path. Returns 0, -EINVAL (path
 * out of range), KVT_ENOTSUP (@d is not the CUDA device, or no CUDA in the build).
 */
int kvt_device_cuda_copy_path(struct kvt_device *d, enum kvt_cuda_copy_path path,
			      uint64_t counts[KVT_CUDA_COPY_PATHS]);

/** Convenience: destroy d (NULL ok). */
static inline void
kvt_device_destroy(struct kvt_device *d)
{
	if (d)
		d->ops->destroy(d);
}

#endif /* KVT_TRANSFER_DEVICE_H */
