/* SPDX-License-Identifier: MIT */
/*
 * transfer/device_cuda.c - the CUDA device backend (built only with KVT_WITH_CUDA): plain C over
 * the CUDA runtime API. cudaMalloc for HBM, cudaHostAlloc(portable) for the HOST tier,
 * non-blocking streams (a struct kvt_stream * IS the cudaStream_t), timing-free events, and one
 * cudaMemcpyBatchAsync per copy batch (CUDA 12.8+), never one call per block. Where that API is
 * absent, refused or not allowed, a copy kernel (kvt_copy_batch_cuda(), one launch per 128
 * copies) moves the copies within the device's own arenas (transfer/copy_plan.h); only memory
 * the GPU cannot address goes through one cudaMemcpyAsync per copy.
 *
 * Errors: every failing CUDA call stores "cudaXxx: message (cudaErrorName)" in d->errmsg and
 * the raw cudaError_t in d->last_error (under cuda_dev.err_lock), clears the runtime's
 * last-error state (so a later cudaGetLastError() after a kernel launch does not report our
 * failure) and returns kvt_err(KVT_EDEVICE, "cudaXxx: message (name)"). Nothing aborts.
 *
 * Every entry that creates or frees something first makes the device current on the calling
 * thread (cudaSetDevice), because the caller may be any thread of the host process.
 */
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "tiers/base/error.h"
#include "kernels/kernels_cuda.h"
#include "transfer/copy_plan.h"
#include "transfer/device.h"

#define CUDA_BATCH_STACK 32u /* copies handled without a heap allocation in copy_batch_async */
#define CUDA_BATCH_MAX 4096u  /* copies per cudaMemcpyBatchAsync call (no documented limit) */

struct cuda_dev {
	struct kvt_device dev;   /* the public part; first member, so d == &c->dev */
	int ordinal;             /* CUDA device ordinal */
	pthread_mutex_t err_lock; /* serialises writes of dev.errmsg / dev.last_error */
	atomic_int no_batch;     /* 1 once cudaMemcpyBatchAsync refused a valid batch: kernel */
	atomic_int forced;       /* enum kvt_cuda_copy_path a test forces; AUTO = none */
	atomic_uint_fast64_t copies[KVT_CUDA_COPY_PATHS]; /* copies queued by each path */
	struct kvt_copy_ranges ranges; /* this device's arenas: what the copy kernel may touch */
};

/* cuda_copy_kernel() passes struct kvt_copy arrays as struct kvt_cuda_copy arrays */
_Static_assert(sizeof(struct kvt_copy) == sizeof(struct kvt_cuda_copy) &&
		       offsetof(struct kvt_copy, dst) == offsetof(struct kvt_cuda_copy, dst) &&
		       offsetof(struct kvt_copy, src) == offsetof(struct kvt_cuda_copy, src) &&
		       offsetof(struct kvt_copy, len) == offsetof(struct kvt_cuda_copy, len) &&
		       sizeof(size_t) == sizeof(uint64_t),
	       "struct kvt_copy and struct kvt_cuda_copy differ");

static const struct kvt_device_ops cuda_ops;

static struct cuda_dev *
cuda_dev_of(struct kvt_device *d)
{
	return (struct cuda_dev *)d;
}

static cudaStream_t
cuda_stream_of(struct kvt_stream *s)
{
	return (cudaStream_t)(void *)s;
}

static cudaEvent_t
cuda_event_of(struct kvt_event *e)
{
	return (cudaEvent_t)(void *)e;
}

/* Record err for @what in d and in the thread's last error; returns KVT_EDEVICE. */
static int
cuda_fail(struct cuda_dev *c, cudaError_t err, const char *what)
{
	const char *msg = cudaGetErrorString(err);

	(void)cudaGetLastError(); /* reset the runtime's non-sticky last error */
	pthread_mutex_lock(&c->err_lock);
	snprintf(c->dev.errmsg, sizeof c->dev.errmsg, "%s: %s (%s)", what, msg,
		 cudaGetErrorName(err));
	c->dev.last_error = (int)err;
	pthread_mutex_unlock(&c->err_lock);
	return kvt_err(KVT_EDEVICE, "%s: %s (%s)", what, msg, cudaGetErrorName(err));
}

/* Make c's device current on this thread. */
static int
cuda_enter(struct cuda_dev *c)
{
	cudaError_t err = cudaSetDevice(c->ordinal);

	return err == cudaSuccess ? 0 : cuda_fail(c, err, "cudaSetDevice");
}

/* ------------------------------------------------------------------------------------------ */
/* memory                                                                                       */

static int
cuda_mem_alloc(struct kvt_device *d, size_t len, void **out)
{
	struct cuda_dev *c = cuda_dev_of(d);
	cudaError_t err;
	int rc;

	if (out != NULL)
		*out = NULL;
	if (out == NULL || len == 0)
		return kvt_err(-EINVAL, "cuda mem_alloc: len %zu, out %p", len, (void *)out);
	rc = cuda_enter(c);
	if (rc != 0)
		return rc;
	err = cudaMalloc(out, len);
	if (err != cudaSuccess) {
		*out = NULL;
		return cuda_fail(c, err, "cudaMalloc");
	}
	(void)kvt_copy_ranges_add(&c->ranges, *out, len); /* when full: cudaMemcpyAsync */
	return 0;
}

static void
cuda_mem_free(struct kvt_device *d, void *p)
{
	struct cuda_dev *c = cuda_dev_of(d);
	cudaError_t err;

	if (p == NULL)
		return;
	(void)kvt_copy_ranges_remove(&c->ranges, p);
	if (cuda_enter(c) != 0)
		return;
	err = cudaFree(p);
	if (err != cudaSuccess)
		cuda_fail(c, err, "cudaFree");
}

static int
cuda_host_alloc(struct kvt_device *d, size_t len, void **out, bool *pinned)
{
	struct cuda_dev *c = cuda_dev_of(d);
	cudaError_t err;
	int rc;

	if (out != NULL)
		*out = NULL;
	if (pinned != NULL)
		*pinned = false;
	if (out == NULL || pinned == NULL || len == 0)
		return kvt_err(-EINVAL, "cuda host_alloc: len %zu, out %p, pinned %p", len,
			       (void *)out, (void *)pinned);
	rc = cuda_enter(c);
	if (rc != 0)
		return rc;
	/* portable: pinned for every CUDA context of the process, not just this device's */
	err = cudaHostAlloc(out, len, cudaHostAllocPortable);
	if (err != cudaSuccess) {
		*out = NULL;
		return cuda_fail(c, err, "cudaHostAlloc");
	}
	*pinned = true;
	/* mapped into the device's address space under UVA: the copy kernel may touch it */
	(void)kvt_copy_ranges_add(&c->ranges, *out, len);
	return 0;
}

static void
cuda_host_free(struct kvt_device *d, void *p, size_t len)
{
	struct cuda_dev *c = cuda_dev_of(d);
	cudaError_t err;

	(void)len;
	if (p == NULL)
		return;
	(void)kvt_copy_ranges_remove(&c->ranges, p);
	if (cuda_enter(c) != 0)
		return;
	err = cudaFreeHost(p);
	if (err != cudaSuccess)
		cuda_fail(c, err, "cudaFreeHost");
}

/* ------------------------------------------------------------------------------------------ */
/* streams                                                                                      */

static int
cuda_stream_create(struct kvt_device *d, struct kvt_stream **out)
{
	struct cuda_dev *c = cuda_dev_of(d);
	cudaStream_t s = NULL;
	cudaError_t err;
	int rc;

	if (out == NULL)
		return kvt_err(-EINVAL, "cuda stream_create: out is NULL");
	*out = NULL;
	rc = cuda_enter(c);
	if (rc != 0)
		return rc;
	/* non-blocking: never implicitly synchronised with the legacy default stream */
	err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
	if (err != cudaSuccess)
		return cuda_fail(c, err, "cudaStreamCreateWithFlags");
	*out = (struct kvt_stream *)(void *)s;
	return 0;
}

static void
cuda_stream_destroy(struct kvt_device *d, struct kvt_stream *s)
{
	struct cuda_dev *c = cuda_dev_of(d);
	cudaError_t err;

	if (s == NULL)
		return;
	err = cudaStreamSynchronize(cuda_stream_of(s));
	if (err != cudaSuccess)
		cuda_fail(c, err, "cudaStreamSynchronize");
	err = cudaStreamDestroy(cuda_stream_of(s));
	if (err != cudaSuccess)
		cuda_fail(c, err, "cudaStreamDestroy");
}

/* One cudaMemcpyAsync per copy: copies the kernel cannot do (memory the GPU cannot address). */
static int
cuda_copy_loop(struct cuda_dev *c, cudaStream_t s, const struct kvt_copy *v, uint32_t n)
{
	cudaError_t err;

	for (uint32_t i = 0; i < n; i++) {
		err = cudaMemcpyAsync(v[i].dst, v[i].src, v[i].len, cudaMemcpyDefault, s);
		if (err != cudaSuccess)
			return cuda_fail(c, err, "cudaMemcpyAsync");
	}
	atomic_fetch_add(&c->copies[KVT_CUDA_COPY_LOOP], n);
	return 0;
}

/*
 * The fallback where the batch API is absent, refused or not allowed: the copies within the
 * device's arenas (all of the engine's) go to one copy-kernel launch per KVT_COPY_KERNEL_CHUNK,
 * the rest one cudaMemcpyAsync each (transfer/copy_plan.h). @tmp has room for 2n copies.
 */
static int
cuda_copy_kernel(struct cuda_dev *c, cudaStream_t s, const struct kvt_copy *v, uint32_t n,
		 struct kvt_copy *tmp)
{
	uint32_t nr = 0, nk = kvt_copy_ranges_split(&c->ranges, v, n, tmp, tmp + n, &nr);
	int rc, cerr = 0, cur = -1;
	cudaError_t err;

	if (nk) {
		/* a kernel launches on the thread's current device, which must be ours (the
		 * copies themselves would run on any device); put it back afterwards */
		err = cudaGetDevice(&cur);
		if (err == cudaSuccess && cur != c->ordinal)
			err = cudaSetDevice(c->ordinal);
		if (err != cudaSuccess)
			return cuda_fail(c, err, "cudaSetDevice (copy kernel)");
		/* struct kvt_copy and struct kvt_cuda_copy have the same members: see the
		 * static assertion at the top of the file */
		rc = kvt_copy_batch_cuda((const struct kvt_cuda_copy *)(const void *)tmp, nk, s,
					 &cerr);
		if (cur != c->ordinal)
			(void)cudaSetDevice(cur);
		if (rc != 0 && cerr)
			return cuda_fail(c, (cudaError_t)cerr, "cudaLaunchKernel (copy batch)");
		if (rc != 0)
			return rc;
		atomic_fetch_add(&c->copies[KVT_CUDA_COPY_KERNEL], nk);
	}
	return nr ? cuda_copy_loop(c, s, tmp + n, nr) : 0;
}

#if CUDART_VERSION >= 12080
/*
 * Queue v[0..n) (non-empty copies) as cudaMemcpyBatchAsync calls of at most CUDA_BATCH_MAX.
 * Returns 0, or a CUDA error; *done gets the copies queued before it.
 */
static cudaError_t
cuda_copy_batch_api(cudaStream_t s, const struct kvt_copy *v, uint32_t n, void **dst,
		    const void **src, size_t *len, uint32_t *done)
{
	struct cudaMemcpyAttributes attr;
	size_t attr_idx = 0;
	cudaError_t err = cudaSuccess;

	for (uint32_t i = 0; i < n; i++) {
		dst[i] = v[i].dst;
		src[i] = v[i].src;
		len[i] = v[i].len;
	}
	memset(&attr, 0, sizeof attr);
	/* sources are read in stream order: a copy may read what earlier work on s produced */
	attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
	attr.flags = cudaMemcpyFlagDefault;
	*done = 0;
	while (*done < n && err == cudaSuccess) {
		uint32_t m = n - *done < CUDA_BATCH_MAX ? n - *done : CUDA_BATCH_MAX;
#if CUDART_VERSION >= 13000
		err = cudaMemcpyBatchAsync(dst + *done, src + *done, len + *done, m, &attr,
					   &attr_idx, 1, s);
#else
		size_t fail_idx = 0;

		err = cudaMemcpyBatchAsync((void **)(dst + *done), (void **)(src + *done),
					   len + *done, m, &attr, &attr_idx, 1, &fail_idx, s);
#endif
		if (err == cudaSuccess)
			*done += m;
	}
	return err;
}
#endif

/*
 * Queue n (> 0, all non-empty) copies on s: one cudaMemcpyBatchAsync per CUDA_BATCH_MAX where
 * allowed; else (CUDA < 12.8, the legacy/NULL stream, the driver refused the API, or a test
 * forced it) the copy kernel. A refusal of the batch API itself (cudaErrorNotSupported, or
 * cudaErrorInvalidValue for a batch the fallback then copies fine) switches the device to the
 * kernel for good, visible in kvt_device_cuda_batched(); any other error is returned. @tmp has
 * room for 2n copies (used as 3n pointer-sized words by the batch API).
 */
static int
cuda_copy_submit(struct cuda_dev *c, cudaStream_t s, const struct kvt_copy *v, uint32_t n,
		 struct kvt_copy *tmp)
{
	int forced = atomic_load(&c->forced);

	if (forced == KVT_CUDA_COPY_LOOP)
		return cuda_copy_loop(c, s, v, n);
	if (forced == KVT_CUDA_COPY_KERNEL)
		return cuda_copy_kernel(c, s, v, n, tmp);
#if CUDART_VERSION >= 12080
	if (s != NULL && s != cudaStreamLegacy && !atomic_load(&c->no_batch)) {
		void **dst = (void **)(void *)tmp;
		uint32_t done = 0;
		cudaError_t err = cuda_copy_batch_api(s, v, n, dst, (const void **)(dst + n),
						      (size_t *)(void *)(dst + 2 * n), &done);

		atomic_fetch_add(&c->copies[KVT_CUDA_COPY_BATCH_API], done);
		if (err == cudaSuccess)
			return 0;
		if (err != cudaErrorNotSupported && err != cudaErrorInvalidValue)
			return cuda_fail(c, err, "cudaMemcpyBatchAsync");
		(void)cudaGetLastError(); /* maybe not an error of ours: try the fallback */
		if (cuda_copy_kernel(c, s, v + done, n - done, tmp) != 0) {
			char why[256]; /* kvt_err writes the buffer this message lives in */

			snprintf(why, sizeof why, "%s", kvt_last_error_message());
			return kvt_err(KVT_EDEVICE, "cudaMemcpyBatchAsync: %s (%s), and the "
				       "fallback failed too: %s", cudaGetErrorString(err),
				       cudaGetErrorName(err), why);
		}
		atomic_store(&c->no_batch, 1);
		return 0;
	}
#endif
	return cuda_copy_kernel(c, s, v, n, tmp);
}

int
kvt_device_cuda_batched(struct kvt_device *d)
{
	if (!d || d->ops != &cuda_ops)
		return kvt_err(KVT_ENOTSUP, "not the CUDA device");
#if CUDART_VERSION >= 12080
	return !atomic_load(&cuda_dev_of(d)->no_batch) &&
	       atomic_load(&cuda_dev_of(d)->forced) == KVT_CUDA_COPY_AUTO;
#else
	return 0;
#endif
}

int
kvt_device_cuda_copy_path(struct kvt_device *d, enum kvt_cuda_copy_path path,
			  uint64_t counts[KVT_CUDA_COPY_PATHS])
{
	struct cuda_dev *c;

	if (!d || d->ops != &cuda_ops)
		return kvt_err(KVT_ENOTSUP, "not the CUDA device");
	if ((unsigned)path >= KVT_CUDA_COPY_PATHS)
		return kvt_err(-EINVAL, "CUDA copy path %d unknown", (int)path);
	c = cuda_dev_of(d);
	/* forcing the batch API is the normal choice: it is used wherever it is allowed */
	atomic_store(&c->forced, path == KVT_CUDA_COPY_BATCH_API ? KVT_CUDA_COPY_AUTO : (int)path);
	for (int i = 0; counts && i < KVT_CUDA_COPY_PATHS; i++)
		counts[i] = atomic_load(&c->copies[i]);
	return 0;
}

static int
cuda_copy_batch_async(struct kvt_device *d, struct kvt_stream *stream, const struct kvt_copy *v,
		      uint32_t n)
{
	struct cuda_dev *c = cuda_dev_of(d);
	struct kvt_copy stack[3 * CUDA_BATCH_STACK];
	struct kvt_copy *nz = stack, *heap = NULL;
	uint32_t m = 0;
	int rc;

	if (v == NULL && n != 0)
		return kvt_err(-EINVAL, "cuda copy_batch_async: v is NULL, n %u", n);
	if (n > CUDA_BATCH_STACK) {
		heap = malloc((size_t)n * 3 * sizeof *heap);
		if (heap == NULL)
			return kvt_err(-ENOMEM, "cuda copy_batch_async: no memory for %u copies",
				       n);
		nz = heap;
	}
	for (uint32_t i = 0; i < n; i++)
		if (v[i].len != 0) /* the batch API rejects empty copies */
			nz[m++] = v[i];
	rc = m == 0 ? 0 : cuda_copy_submit(c, cuda_stream_of(stream), nz, m, nz + m);
	free(heap);
	return rc;
}

static int
cuda_stream_sync(struct kvt_device *d, struct kvt_stream *s)
{
	cudaError_t err = cudaStreamSynchronize(cuda_stream_of(s));

	return err == cudaSuccess ? 0 : cuda_fail(cuda_dev_of(d), err, "cudaStreamSynchronize");
}

/* ------------------------------------------------------------------------------------------ */
/* events                                                                                       */

static int
cuda_event_create(struct kvt_device *d, struct kvt_event **out)
{
	struct cuda_dev *c = cuda_dev_of(d);
	cudaEvent_t e = NULL;
	cudaError_t err;
	int rc;

	if (out == NULL)
		return kvt_err(-EINVAL, "cuda event_create: out is NULL");
	*out = NULL;
	rc = cuda_enter(c);
	if (rc != 0)
		return rc;
	err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
	if (err != cudaSuccess)
		return cuda_fail(c, err, "cudaEventCreateWithFlags");
	*out = (struct kvt_event *)(void *)e;
	return 0;
}

static void
cuda_event_destroy(struct kvt_device *d, struct kvt_event *e)
{
	cudaError_t err;

	if (e == NULL)
		return;
	/* legal with a record in flight: the runtime frees the event once it completes */
	err = cudaEventDestroy(cuda_event_of(e));
	if (err != cudaSuccess)
		cuda_fail(cuda_dev_of(d), err, "cudaEventDestroy");
}

static int
cuda_event_record(struct kvt_device *d, struct kvt_event *e, struct kvt_stream *s)
{
	cudaError_t err;

	if (e == NULL)
		return kvt_err(-EINVAL, "cuda event_record: event is NULL");
	err = cudaEventRecord(cuda_event_of(e), cuda_stream_of(s));
	return err == cudaSuccess ? 0 : cuda_fail(cuda_dev_of(d), err, "cudaEventRecord");
}

static int
cuda_event_query(struct kvt_device *d, struct kvt_event *e)
{
	cudaError_t err;

	if (e == NULL)
		return kvt_err(-EINVAL, "cuda event_query: event is NULL");
	err = cudaEventQuery(cuda_event_of(e));
	if (err == cudaSuccess)
		return 0;
	if (err == cudaErrorNotReady) {
		(void)cudaGetLastError(); /* not an error: pending */
		return -EAGAIN;
	}
	return cuda_fail(cuda_dev_of(d), err, "cudaEventQuery");
}

static int
cuda_event_sync(struct kvt_device *d, struct kvt_event *e)
{
	cudaError_t err;

	if (e == NULL)
		return kvt_err(-EINVAL, "cuda event_sync: event is NULL");
	err = cudaEventSynchronize(cuda_event_of(e));
	return err == cudaSuccess ? 0 : cuda_fail(cuda_dev_of(d), err, "cudaEventSynchronize");
}

static int
cuda_stream_wait_event(struct kvt_device *d, struct kvt_stream *s, struct kvt_event *e)
{
	cudaError_t err;

	if (e == NULL)
		return kvt_err(-EINVAL, "cuda stream_wait_event: event is NULL");
	/* device-side: the host returns at once, s waits for e's latest record */
	err = cudaStreamWaitEvent(cuda_stream_of(s), cuda_event_of(e), 0);
	return err == cudaSuccess ? 0 : cuda_fail(cuda_dev_of(d), err, "cudaStreamWaitEvent");
}

/* ------------------------------------------------------------------------------------------ */
/* device                                                                                       */

static void
cuda_destroy(struct kvt_device *d)
{
	struct cuda_dev *c = cuda_dev_of(d);

	/* wait for the work we queued; never cudaDeviceReset: the host process shares the
	 * primary context */
	if (cuda_enter(c) == 0)
		(void)cudaDeviceSynchronize();
	(void)cudaGetLastError();
	pthread_mutex_destroy(&c->err_lock);
	kvt_copy_ranges_fini(&c->ranges);
	free(c);
}

int
kvt_device_cuda_create(int ordinal, struct kvt_device **out)
{
	struct cuda_dev *c;
	cudaError_t err;
	int count = 0;

	if (out == NULL)
		return kvt_err(-EINVAL, "kvt_device_cuda_create: out is NULL");
	*out = NULL;
	err = cudaGetDeviceCount(&count);
	if (err != cudaSuccess) {
		(void)cudaGetLastError();
		return kvt_err(KVT_EDEVICE, "no CUDA device: cudaGetDeviceCount: %s (%s)",
			       cudaGetErrorString(err), cudaGetErrorName(err));
	}
	if (count == 0)
		return kvt_err(KVT_EDEVICE, "no CUDA device: cudaGetDeviceCount found none");
	if (ordinal < 0 || ordinal >= count)
		return kvt_err(-EINVAL, "CUDA device %d out of range (%d devices)", ordinal, count);
	c = calloc(1, sizeof *c);
	if (c == NULL)
		return kvt_err(-ENOMEM, "kvt_device_cuda_create: no memory");
	if (pthread_mutex_init(&c->err_lock, NULL) != 0) {
		free(c);
		return kvt_err(-ENOMEM, "kvt_device_cuda_create: cannot initialise a lock");
	}
	if (kvt_copy_ranges_init(&c->ranges) != 0) {
		pthread_mutex_destroy(&c->err_lock);
		free(c);
		return kvt_err(-ENOMEM, "kvt_device_cuda_create: cannot initialise a lock");
	}
	c->ordinal = ordinal;
	c->dev.ops = &cuda_ops;
	c->dev.ctx = c;
	c->dev.caps.async = true;
	c->dev.caps.device_mem_is_host = false;
	c->dev.caps.pinned_host = true;
	/* create the context now, so a broken driver fails here and not on the first copy */
	err = cudaSetDevice(ordinal);
	if (err == cudaSuccess)
		err = cudaFree(NULL);
	if (err != cudaSuccess) {
		int rc = cuda_fail(c, err, "CUDA context creation");

		pthread_mutex_destroy(&c->err_lock);
		kvt_copy_ranges_fini(&c->ranges);
		free(c);
		return rc;
	}
	*out = &c->dev;
	return 0;
}

static const struct kvt_device_ops cuda_ops = {
	.abi_version = KVT_DEVICE_OPS_V1,
	.name = "cuda",
	.destroy = cuda_destroy,
	.mem_alloc = cuda_mem_alloc,
	.mem_free = cuda_mem_free,
	.host_alloc = cuda_host_alloc,
	.host_free = cuda_host_free,
	.stream_create = cuda_stream_create,
	.stream_destroy = cuda_stream_destroy,
	.copy_batch_async = cuda_copy_batch_async,
	.stream_sync = cuda_stream_sync,
	.event_create = cuda_event_create,
	.event_destroy = cuda_event_destroy,
	.event_record = cuda_event_record,
	.event_query = cuda_event_query,
	.event_sync = cuda_event_sync,
	.stream_wait_event = cuda_stream_wait_event,
};
