/* SPDX-License-Identifier: MIT */
/*
 * transfer/device_cuda.c - the CUDA device backend (built only with KVT_WITH_CUDA): plain C over
 * the CUDA runtime API. cudaMalloc for HBM, cudaHostAlloc(portable) for the HOST tier,
 * non-blocking streams (a struct kvt_stream * IS the cudaStream_t), timing-free events, and one
 * cudaMemcpyBatchAsync per copy batch (CUDA 12.8+), never one call per block.
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
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "error.h"
#include "transfer/device.h"

#define CUDA_BATCH_STACK 64u /* copies handled without a heap allocation in copy_batch_async */
#define CUDA_BATCH_MAX 4096u  /* copies per cudaMemcpyBatchAsync call (no documented limit) */

struct cuda_dev {
	struct kvt_device dev;   /* the public part; first member, so d == &c->dev */
	int ordinal;             /* CUDA device ordinal */
	pthread_mutex_t err_lock; /* serialises writes of dev.errmsg / dev.last_error */
	atomic_int no_batch;     /* 1 once cudaMemcpyBatchAsync refused a valid batch: loop */
};

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
	return 0;
}

static void
cuda_mem_free(struct kvt_device *d, void *p)
{
	struct cuda_dev *c = cuda_dev_of(d);
	cudaError_t err;

	if (p == NULL || cuda_enter(c) != 0)
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
	return 0;
}

static void
cuda_host_free(struct kvt_device *d, void *p, size_t len)
{
	struct cuda_dev *c = cuda_dev_of(d);
	cudaError_t err;

	(void)len;
	if (p == NULL || cuda_enter(c) != 0)
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

/* The per-copy fallback: used where the batch API is missing, refused, or not allowed (the legacy
 * default stream, which cudaMemcpyBatchAsync rejects). */
static int
cuda_copy_loop(struct cuda_dev *c, cudaStream_t s, void *const *dst, const void *const *src,
	       const size_t *len, size_t n)
{
	cudaError_t err;
	size_t i;

	for (i = 0; i < n; i++) {
		err = cudaMemcpyAsync(dst[i], src[i], len[i], cudaMemcpyDefault, s);
		if (err != cudaSuccess)
			return cuda_fail(c, err, "cudaMemcpyAsync");
	}
	return 0;
}

/*
 * Queue n (> 0, all non-empty) copies on s as one batch (chunks of CUDA_BATCH_MAX). If the
 * driver refuses the batch API itself (cudaErrorNotSupported, or cudaErrorInvalidValue for a
 * batch the loop then copies fine), the device falls back to the loop for good and says so in
 * kvt_device_cuda_batched(); any other error is returned.
 */
static int
cuda_copy_submit(struct cuda_dev *c, cudaStream_t s, void *const *dst, const void *const *src,
		 const size_t *len, size_t n)
{
#if CUDART_VERSION >= 12080
	struct cudaMemcpyAttributes attr;
	size_t attr_idx = 0, done = 0;
	cudaError_t err = cudaSuccess;

	if (s == NULL || s == cudaStreamLegacy || atomic_load(&c->no_batch))
		return cuda_copy_loop(c, s, dst, src, len, n);
	memset(&attr, 0, sizeof attr);
	/* sources are read in stream order: a copy may read what earlier work on s produced */
	attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
	attr.flags = cudaMemcpyFlagDefault;
	while (done < n && err == cudaSuccess) {
		size_t m = n - done < CUDA_BATCH_MAX ? n - done : CUDA_BATCH_MAX;
#if CUDART_VERSION >= 13000
		err = cudaMemcpyBatchAsync(dst + done, src + done, len + done, m, &attr, &attr_idx,
					   1, s);
#else
		size_t fail_idx = 0;

		err = cudaMemcpyBatchAsync((void **)(dst + done), (void **)(src + done),
					   (size_t *)(len + done), m, &attr, &attr_idx, 1,
					   &fail_idx, s);
#endif
		if (err == cudaSuccess)
			done += m;
	}
	if (err == cudaSuccess)
		return 0;
	if (err != cudaErrorNotSupported && err != cudaErrorInvalidValue)
		return cuda_fail(c, err, "cudaMemcpyBatchAsync");
	(void)cudaGetLastError(); /* maybe not an error of ours: try the loop */
	if (cuda_copy_loop(c, s, dst + done, src + done, len + done, n - done) != 0)
		return kvt_err(KVT_EDEVICE, "cudaMemcpyBatchAsync: %s (%s), and one copy at a "
			       "time failed too: %s", cudaGetErrorString(err),
			       cudaGetErrorName(err), c->dev.errmsg);
	atomic_store(&c->no_batch, 1);
	return 0;
#else
	return cuda_copy_loop(c, s, dst, src, len, n);
#endif
}

int
kvt_device_cuda_batched(struct kvt_device *d)
{
	if (!d || d->ops != &cuda_ops)
		return kvt_err(KVT_ENOTSUP, "not the CUDA device");
#if CUDART_VERSION >= 12080
	return !atomic_load(&cuda_dev_of(d)->no_batch);
#else
	return 0;
#endif
}

static int
cuda_copy_batch_async(struct kvt_device *d, struct kvt_stream *stream, const struct kvt_copy *v,
		      uint32_t n)
{
	struct cuda_dev *c = cuda_dev_of(d);
	void *dst_stack[CUDA_BATCH_STACK];
	const void *src_stack[CUDA_BATCH_STACK];
	size_t len_stack[CUDA_BATCH_STACK];
	void **dst = dst_stack;
	const void **src = src_stack;
	size_t *len = len_stack;
	void *heap = NULL;
	size_t m = 0;
	uint32_t i;
	int rc;

	if (v == NULL && n != 0)
		return kvt_err(-EINVAL, "cuda copy_batch_async: v is NULL, n %u", n);
	if (n > CUDA_BATCH_STACK) {
		heap = malloc((size_t)n * (sizeof *dst + sizeof *src + sizeof *len));
		if (heap == NULL)
			return kvt_err(-ENOMEM, "cuda copy_batch_async: no memory for %u copies",
				       n);
		dst = heap;
		src = (const void **)(dst + n);
		len = (size_t *)(void *)(src + n);
	}
	for (i = 0; i < n; i++) {
		if (v[i].len == 0)
			continue; /* the batch API rejects empty copies */
		dst[m] = v[i].dst;
		src[m] = v[i].src;
		len[m] = v[i].len;
		m++;
	}
	rc = m == 0 ? 0 : cuda_copy_submit(c, cuda_stream_of(stream), dst, src, len, m);
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
