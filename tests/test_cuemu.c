/* SPDX-License-Identifier: MIT */
/*
 * tests/test_cuemu.c - the CUDA-on-CPU emulation's runtime half (tests/cuemu/cudart*.cc) on
 * its own: stream order (also under KVT_CUEMU_DELAY_US's random delays); async work really
 * runs later; cross-stream waits through events (and that a re-record does not move a wait
 * already queued); the legacy default stream against
 * blocking and non-blocking streams; a destroyed stream finishing its work; the range checks of
 * copies and memsets; cudaFree errors; the HBM limit; cudaMemcpyBatchAsync's validation and its
 * one-operation execution; error names; the sticky error of a kernel fault; fault injection;
 * runtime calls from stream work refused; KVT_CUEMU_DEVICES=0; the device's description.
 *
 * Streams are held with a "gate": a closure queued by kvt_cuemu_enqueue that blocks its worker
 * until the test opens it, so what is late is late by construction, never by timing.
 *
 * Exits 77 (skip) in builds without the emulation (KVT_CUDA_EMU).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>

#ifndef KVT_CUDA_EMU

int
main(void)
{
	printf("test_cuemu: skipped: not a KVT_CUDA_EMU build\n");
	return 77;
}

#else

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuemu/cuemu.h"

#ifdef __SANITIZE_ADDRESS__ /* GCC's and Clang's -fsanitize=address */
#include <sanitizer/asan_interface.h>
#endif

#define TCU_OK(call) assert_int_equal((int)(call), (int)cudaSuccess)
#define TCU_ERR(call, err) assert_int_equal((int)(call), (int)(err))

/* a closure that holds its stream until opened */
struct tcu_gate {
	pthread_mutex_t mu; /* guards open, ran, dropped */
	pthread_cond_t cv;  /* open changed */
	int open;           /* 1: the closure may return */
	int ran;            /* the closure ran */
	int dropped;        /* its drop callback ran */
};

#define TCU_GATES 4

/*
 * Gates live in a pool, not on a test's stack: when a test fails while holding a stream, the
 * teardown opens its gates (the blocked worker still uses them) and the next test runs.
 */
static struct tcu_gate tcu_gates[TCU_GATES];
static int tcu_ngates;

static struct tcu_gate *
tcu_gate_new(void)
{
	struct tcu_gate *g;

	assert_true(tcu_ngates < TCU_GATES); /* before counting: teardown destroys tcu_ngates */
	g = &tcu_gates[tcu_ngates++];
	memset(g, 0, sizeof *g);
	pthread_mutex_init(&g->mu, NULL);
	pthread_cond_init(&g->cv, NULL);
	return g;
}

static void
tcu_gate_run(void *ctx)
{
	struct tcu_gate *g = ctx;

	pthread_mutex_lock(&g->mu);
	g->ran = 1;
	while (!g->open)
		pthread_cond_wait(&g->cv, &g->mu);
	pthread_mutex_unlock(&g->mu);
}

static void
tcu_gate_drop(void *ctx)
{
	struct tcu_gate *g = ctx;

	pthread_mutex_lock(&g->mu);
	g->dropped++;
	pthread_mutex_unlock(&g->mu);
}

/* Queue gate @g on @s: work queued after it waits until tcu_gate_open. */
static void
tcu_gate_hold(struct tcu_gate *g, cudaStream_t s)
{
	TCU_OK(kvt_cuemu_enqueue(s, tcu_gate_run, tcu_gate_drop, g));
}

static void
tcu_gate_open(struct tcu_gate *g)
{
	pthread_mutex_lock(&g->mu);
	g->open = 1;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

static int
tcu_gate_get(struct tcu_gate *g, int *dropped)
{
	int ran;

	pthread_mutex_lock(&g->mu);
	ran = g->ran;
	*dropped = g->dropped;
	pthread_mutex_unlock(&g->mu);
	return ran;
}

/* a closure appending its number to a log (stream order) */
struct tcu_log {
	int n;        /* entries */
	int v[64];    /* entries, in run order */
};

struct tcu_entry {
	struct tcu_log *log; /* the log */
	int i;               /* the number */
};

static void
tcu_log_run(void *ctx)
{
	struct tcu_entry *e = ctx;

	e->log->v[e->log->n++] = e->i;
}

static cudaStream_t
tcu_stream(unsigned flags)
{
	cudaStream_t s = NULL;

	TCU_OK(cudaStreamCreateWithFlags(&s, flags));
	assert_non_null(s);
	return s;
}

static int
tcu_setup(void **state)
{
	(void)state;
	kvt_cuemu_reset();
	return 0;
}

static int
tcu_teardown(void **state)
{
	(void)state;
	kvt_cuemu_reset();
	for (int i = 0; i < tcu_ngates; i++)
		tcu_gate_open(&tcu_gates[i]);
	(void)cudaDeviceSynchronize();
	for (int i = 0; i < tcu_ngates; i++) {
		pthread_mutex_destroy(&tcu_gates[i].mu);
		pthread_cond_destroy(&tcu_gates[i].cv);
	}
	tcu_ngates = 0;
	(void)cudaGetLastError();
	return 0;
}

/* A non-blocking stream created under KVT_CUEMU_DELAY_US=@us (NULL: as the environment is). */
static cudaStream_t
tcu_stream_delayed(const char *us)
{
	const char *was = getenv("KVT_CUEMU_DELAY_US");
	char saved[32];
	cudaStream_t s;

	if (us == NULL)
		return tcu_stream(cudaStreamNonBlocking);
	assert_true(was == NULL || strlen(was) < sizeof saved);
	snprintf(saved, sizeof saved, "%s", was != NULL ? was : "");
	assert_int_equal(setenv("KVT_CUEMU_DELAY_US", us, 1), 0);
	s = tcu_stream(cudaStreamNonBlocking);
	assert_int_equal(was != NULL ? setenv("KVT_CUEMU_DELAY_US", saved, 1) :
					unsetenv("KVT_CUEMU_DELAY_US"), 0);
	return s;
}

/*
 * Work on one stream runs in the order it was queued, closures and copies alike, also when
 * each operation starts after a random delay (@delay_us: KVT_CUEMU_DELAY_US for the streams);
 * a stream waiting on its event sees all of it.
 */
static void
tcu_stream_order(const char *delay_us)
{
	cudaStream_t a = tcu_stream_delayed(delay_us), b = tcu_stream_delayed(delay_us);
	struct tcu_log log = { 0 };
	struct tcu_entry e[48];
	unsigned char *h, *h2, *d;
	cudaEvent_t ev;

	TCU_OK(cudaMallocHost((void **)&h, 64));
	TCU_OK(cudaMallocHost((void **)&h2, 64));
	TCU_OK(cudaMalloc((void **)&d, 64));
	TCU_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
	memset(h2, 0, 64);
	for (int i = 0; i < 48; i++) {
		e[i] = (struct tcu_entry){ &log, i };
		TCU_OK(kvt_cuemu_enqueue(a, tcu_log_run, NULL, &e[i]));
		/* each copy sees the memset queued just before it, not a later one */
		TCU_OK(cudaMemsetAsync(d, i, 64, a));
		TCU_OK(cudaMemcpyAsync(h + i, d + i, 1, cudaMemcpyDeviceToHost, a));
	}
	TCU_OK(cudaEventRecord(ev, a));
	TCU_OK(cudaStreamWaitEvent(b, ev, 0));
	TCU_OK(cudaMemcpyAsync(h2, d, 64, cudaMemcpyDeviceToHost, b));
	TCU_OK(cudaStreamSynchronize(b)); /* only b: its wait covers all of a's work */
	assert_int_equal(log.n, 48);
	for (int i = 0; i < 48; i++) {
		assert_int_equal(log.v[i], i);
		assert_int_equal(h[i], i);
	}
	for (int i = 0; i < 64; i++)
		assert_int_equal(h2[i], 47);
	TCU_OK(cudaEventDestroy(ev));
	TCU_OK(cudaStreamDestroy(a));
	TCU_OK(cudaStreamDestroy(b));
	TCU_OK(cudaFree(d));
	TCU_OK(cudaFreeHost(h));
	TCU_OK(cudaFreeHost(h2));
}

static void
test_stream_order(void **state)
{
	(void)state;
	tcu_stream_order(NULL);
}

static void
test_delayed_order(void **state)
{
	(void)state;
	tcu_stream_order("300");
}

/* An async copy runs on the worker later: right after the call the destination is stale. */
static void
test_async_is_late(void **state)
{
	cudaStream_t s = tcu_stream(0);
	unsigned char *pin, *dev, page[256];
	struct tcu_gate *g = tcu_gate_new();
	cudaEvent_t ev;
	int dropped;

	(void)state;
	TCU_OK(cudaHostAlloc((void **)&pin, 256, cudaHostAllocPortable));
	TCU_OK(cudaMalloc((void **)&dev, 256));
	TCU_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
	memset(pin, 1, 256);
	memset(page, 2, sizeof page);
	TCU_OK(cudaMemcpy(dev, pin, 256, cudaMemcpyHostToDevice)); /* synchronous */
	tcu_gate_hold(g, s);
	memset(pin, 9, 256);
	TCU_OK(cudaMemcpyAsync(pin, dev, 128, cudaMemcpyDeviceToHost, s));
	/* pageable source: staged at the call, so changing it afterwards does not matter */
	TCU_OK(cudaMemcpyAsync(dev + 128, page, 128, cudaMemcpyHostToDevice, s));
	memset(page, 3, sizeof page);
	TCU_OK(cudaEventRecord(ev, s));
	assert_int_equal(pin[0], 9); /* stale: the copy has not run */
	TCU_ERR(cudaEventQuery(ev), cudaErrorNotReady);
	TCU_ERR(cudaStreamQuery(s), cudaErrorNotReady);
	TCU_OK(cudaGetLastError()); /* not-ready is not an error */
	tcu_gate_open(g);
	TCU_OK(cudaEventSynchronize(ev));
	TCU_OK(cudaEventQuery(ev));
	TCU_OK(cudaStreamQuery(s));
	assert_int_equal(pin[0], 1);
	assert_int_equal(pin[127], 1);
	assert_int_equal(pin[128], 9);
	TCU_OK(cudaMemcpy(pin, dev + 128, 128, cudaMemcpyDeviceToHost));
	assert_int_equal(pin[0], 2);
	assert_int_equal(tcu_gate_get(g, &dropped), 1);
	assert_int_equal(dropped, 1); /* drop runs after run, once */
	TCU_OK(cudaEventDestroy(ev));
	TCU_OK(cudaStreamDestroy(s));
	TCU_OK(cudaFree(dev));
	TCU_OK(cudaFreeHost(pin));
}

/* B waits for A's record: B's copy sees A's writes; a later re-record does not move the wait. */
static void
test_event_wait(void **state)
{
	cudaStream_t a = tcu_stream(cudaStreamNonBlocking), b = tcu_stream(cudaStreamNonBlocking);
	cudaStream_t c = tcu_stream(cudaStreamNonBlocking);
	unsigned char *dev, *pin;
	struct tcu_gate *g = tcu_gate_new();
	cudaEvent_t ev, never;

	(void)state;
	TCU_OK(cudaMalloc((void **)&dev, 64));
	TCU_OK(cudaMallocHost((void **)&pin, 64));
	TCU_OK(cudaEventCreate(&ev));
	TCU_OK(cudaEventCreate(&never));
	tcu_gate_hold(g, a);
	TCU_OK(cudaMemsetAsync(dev, 7, 64, a));
	TCU_OK(cudaEventRecord(ev, a));
	TCU_OK(cudaStreamWaitEvent(b, ev, 0));
	TCU_OK(cudaStreamWaitEvent(b, never, 0)); /* never recorded: no wait */
	TCU_OK(cudaMemcpyAsync(pin, dev, 64, cudaMemcpyDeviceToHost, b));
	TCU_OK(cudaEventRecord(ev, c)); /* re-record on an idle stream */
	TCU_OK(cudaEventSynchronize(ev)); /* the new record is complete ... */
	TCU_ERR(cudaStreamQuery(b), cudaErrorNotReady); /* ... b still waits for a's */
	TCU_ERR(cudaStreamQuery(a), cudaErrorNotReady);
	tcu_gate_open(g);
	TCU_OK(cudaStreamSynchronize(b));
	for (int i = 0; i < 64; i++)
		assert_int_equal(pin[i], 7);
	TCU_OK(cudaEventDestroy(ev));
	TCU_OK(cudaEventDestroy(never));
	TCU_ERR(cudaEventQuery(ev), cudaErrorInvalidResourceHandle);
	TCU_OK(cudaStreamDestroy(a));
	TCU_OK(cudaStreamDestroy(b));
	TCU_OK(cudaStreamDestroy(c));
	TCU_OK(cudaFree(dev));
	TCU_OK(cudaFreeHost(pin));
}

/* The legacy stream waits for blocking streams and they for it; non-blocking ones do not. */
static void
test_legacy_stream(void **state)
{
	cudaStream_t blk = tcu_stream(0), blk2 = tcu_stream(0);
	cudaStream_t nb = tcu_stream(cudaStreamNonBlocking);
	unsigned char *dev, *pin;
	struct tcu_gate *g = tcu_gate_new();

	(void)state;
	TCU_OK(cudaMalloc((void **)&dev, 64));
	TCU_OK(cudaMallocHost((void **)&pin, 64));
	TCU_OK(cudaMemset(dev, 0, 64));
	TCU_OK(cudaDeviceSynchronize()); /* cudaMemset of device memory returns at once */
	tcu_gate_hold(g, blk);
	TCU_OK(cudaMemsetAsync(dev, 5, 32, NULL)); /* legacy: after blk's gate */
	TCU_OK(cudaMemsetAsync(dev + 32, 6, 32, blk2)); /* blocking: after the legacy memset */
	TCU_OK(cudaMemcpyAsync(pin, dev, 64, cudaMemcpyDeviceToHost, nb)); /* no waiting */
	TCU_OK(cudaStreamSynchronize(nb));
	TCU_ERR(cudaStreamQuery(NULL), cudaErrorNotReady);
	TCU_ERR(cudaStreamQuery(blk2), cudaErrorNotReady);
	for (int i = 0; i < 64; i++)
		assert_int_equal(pin[i], 0);
	tcu_gate_open(g);
	TCU_OK(cudaStreamSynchronize(blk2));
	TCU_OK(cudaMemcpy(pin, dev, 64, cudaMemcpyDeviceToHost));
	assert_int_equal(pin[0], 5);
	assert_int_equal(pin[63], 6);
	TCU_OK(cudaStreamDestroy(blk));
	TCU_OK(cudaStreamDestroy(blk2));
	TCU_OK(cudaStreamDestroy(nb));
	TCU_OK(cudaFree(dev));
	TCU_OK(cudaFreeHost(pin));
}

/* A destroyed stream still finishes its queued work; its handle is then invalid. */
static void
test_stream_destroy_pending(void **state)
{
	cudaStream_t s = tcu_stream(cudaStreamNonBlocking);
	struct tcu_log log = { 0 };
	struct tcu_entry e = { &log, 42 };
	struct tcu_gate *g = tcu_gate_new();
	int dropped;

	(void)state;
	tcu_gate_hold(g, s);
	TCU_OK(kvt_cuemu_enqueue(s, tcu_log_run, NULL, &e));
	TCU_OK(cudaStreamDestroy(s)); /* returns at once */
	TCU_ERR(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
	TCU_ERR(cudaGetLastError(), cudaErrorInvalidResourceHandle);
	TCU_OK(cudaGetLastError()); /* cleared */
	TCU_ERR(cudaStreamDestroy(s), cudaErrorInvalidResourceHandle);
	TCU_ERR(kvt_cuemu_enqueue(s, tcu_log_run, tcu_gate_drop, g),
		cudaErrorInvalidResourceHandle);
	(void)tcu_gate_get(g, &dropped);
	assert_int_equal(dropped, 1); /* the refused closure's drop, at once */
	tcu_gate_open(g);
	TCU_OK(cudaDeviceSynchronize());
	assert_int_equal(log.n, 1);
	assert_int_equal(log.v[0], 42);
	tcu_gate_get(g, &dropped);
	assert_int_equal(dropped, 2);
}

/* Copies and memsets are checked against the allocations at the call. */
static void
test_range_checks(void **state)
{
	unsigned char *dev, *dev2, host[256];
	cudaStream_t s = tcu_stream(cudaStreamNonBlocking);

	(void)state;
	memset(host, 0, sizeof host);
	TCU_OK(cudaMalloc((void **)&dev, 100));
	TCU_OK(cudaMalloc((void **)&dev2, 100));
	TCU_OK(cudaMemcpy(dev, host, 100, cudaMemcpyHostToDevice));
	TCU_ERR(cudaMemcpy(host, dev, 101, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
	TCU_ERR(cudaGetLastError(), cudaErrorInvalidValue);
	TCU_ERR(cudaMemcpy(dev + 50, host, 51, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
	TCU_ERR(cudaMemcpyAsync(dev + 99, host, 2, cudaMemcpyDefault, s), cudaErrorInvalidValue);
	TCU_ERR(cudaMemcpy(host, host + 128, 16, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
	TCU_ERR(cudaMemcpy(dev, host, 16, cudaMemcpyDeviceToDevice), cudaErrorInvalidValue);
	TCU_ERR(cudaMemcpy(dev, dev2, 16, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
	TCU_ERR(cudaMemcpy(dev, host, 16, (enum cudaMemcpyKind)7),
		cudaErrorInvalidMemcpyDirection);
	TCU_ERR(cudaMemset(dev + 1, 0, 100), cudaErrorInvalidValue);
	TCU_ERR(cudaMemsetAsync(host, 0, 16, s), cudaErrorInvalidValue);
	TCU_OK(cudaMemcpy(NULL, NULL, 0, cudaMemcpyHostToDevice)); /* empty: fine */
	TCU_OK(cudaMemcpyAsync(dev2, dev, 100, cudaMemcpyDefault, s));
	TCU_OK(cudaStreamSynchronize(s)); /* s is non-blocking: not ordered with the next */
	TCU_OK(cudaMemcpy(dev2, dev, 100, cudaMemcpyDeviceToDevice)); /* returns at once */
	TCU_OK(cudaMemcpy(host, dev2, 100, cudaMemcpyDefault));
	assert_int_equal(host[99], 0);
	TCU_ERR(cudaMemcpyAsync(dev, host, 1, cudaMemcpyDefault, (cudaStream_t)(uintptr_t)0x40),
		cudaErrorInvalidResourceHandle);
	TCU_OK(cudaStreamDestroy(s));
	TCU_OK(cudaFree(dev));
	TCU_ERR(cudaMemcpy(dev, host, 16, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
	TCU_OK(cudaFree(dev2));
}

/* cudaFree errors, poisoned fresh memory (and slack), the HBM limit, pointer attributes. */
static void
test_memory(void **state)
{
	unsigned char *dev, *pin, host[64];
	struct cudaPointerAttributes pa;
	size_t fr, tot;
	void *p = NULL, *q = NULL;

	(void)state;
	TCU_OK(cudaMalloc((void **)&dev, 64));
	assert_int_equal((uintptr_t)dev % 256, 0);
	TCU_OK(cudaMemcpy(host, dev, 64, cudaMemcpyDeviceToHost));
	for (int i = 0; i < 64; i++)
		assert_int_not_equal(host[i], 0); /* poisoned, like uninitialised memory */
#ifdef __SANITIZE_ADDRESS__
	/* the rounding slack up to 256 bytes is out of bounds for AddressSanitizer */
	assert_int_equal(__asan_address_is_poisoned(dev + 63), 0);
	assert_int_equal(__asan_address_is_poisoned(dev + 64), 1);
	assert_int_equal(__asan_address_is_poisoned(dev + 255), 1);
#endif
	TCU_OK(cudaPointerGetAttributes(&pa, dev + 8));
	assert_int_equal(pa.type, cudaMemoryTypeDevice);
	TCU_OK(cudaPointerGetAttributes(&pa, host));
	assert_int_equal(pa.type, cudaMemoryTypeUnregistered);
	TCU_OK(cudaHostAlloc((void **)&pin, 64, cudaHostAllocMapped));
	TCU_OK(cudaPointerGetAttributes(&pa, pin));
	assert_int_equal(pa.type, cudaMemoryTypeHost);
	assert_ptr_equal(pa.devicePointer, pin); /* UVA: the same address */
	assert_int_equal(kvt_cuemu_addressable(pin, 64), 1);
	assert_int_equal(kvt_cuemu_addressable(pin, 65), 0);
	assert_int_equal(kvt_cuemu_addressable(host, 1), 0);
	TCU_ERR(cudaFree(pin), cudaErrorInvalidValue);
	TCU_ERR(cudaFreeHost(dev), cudaErrorInvalidValue);
	TCU_OK(cudaFreeHost(pin));
	TCU_OK(cudaFree(NULL));
	TCU_OK(cudaFree(dev));
	TCU_ERR(cudaFree(dev), cudaErrorInvalidValue); /* double free */
	TCU_ERR(cudaFree(host), cudaErrorInvalidValue);
	TCU_OK(cudaHostRegister(host, sizeof host, cudaHostRegisterDefault));
	TCU_ERR(cudaHostRegister(host + 8, 8, 0), cudaErrorHostMemoryAlreadyRegistered);
	TCU_OK(cudaHostUnregister(host));
	TCU_ERR(cudaHostUnregister(host), cudaErrorHostMemoryNotRegistered);
	TCU_ERR(cudaMalloc(&p, (size_t)1 << 40), cudaErrorMemoryAllocation);
	setenv("KVT_CUEMU_HBM_MIB", "1", 1);
	TCU_OK(cudaMemGetInfo(&fr, &tot));
	assert_int_equal(tot, 1 << 20);
	TCU_OK(cudaMalloc(&p, 768 << 10));
	TCU_ERR(cudaMalloc(&q, 512 << 10), cudaErrorMemoryAllocation);
	TCU_OK(cudaFree(p));
	TCU_OK(cudaMalloc(&q, 512 << 10));
	TCU_OK(cudaFree(q));
	unsetenv("KVT_CUEMU_HBM_MIB");
	TCU_OK(cudaMalloc(&p, 0));
	assert_null(p);
}

/*
 * cudaMemcpyBatchAsync: validated as documented, then one stream operation; the source access
 * orders (Stream: read in stream order; DuringApiCall and Any: at the call).
 */
static void
test_batch(void **state)
{
	cudaStream_t s = tcu_stream(cudaStreamNonBlocking);
	unsigned char *dev, *pin, page[16];
	struct cudaMemcpyAttributes at[3];
	size_t idx[3] = { 0, 1, 2 }, sz[3] = { 16, 16, 16 }, sz0[3] = { 16, 0, 16 };
	void *dst[3];
	const void *src[3];
	struct tcu_gate *g = tcu_gate_new();

	(void)state;
	TCU_OK(cudaMalloc((void **)&dev, 64));
	TCU_OK(cudaMallocHost((void **)&pin, 128));
	memset(at, 0, sizeof at);
	at[0].srcAccessOrder = cudaMemcpySrcAccessOrderAny; /* CUDA may read at the call: we do */
	at[1].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
	at[2].srcAccessOrder = cudaMemcpySrcAccessOrderDuringApiCall;
	memset(pin, 1, 16);
	memset(pin + 16, 2, 16);
	memset(page, 3, sizeof page);
	dst[0] = dev;
	src[0] = pin;
	dst[1] = dev + 16;
	src[1] = pin + 16;
	dst[2] = dev + 32;
	src[2] = page;
	TCU_ERR(cudaMemcpyBatchAsync(dst, src, sz, 0, at, idx, 1, s), cudaErrorInvalidValue);
	TCU_ERR(cudaMemcpyBatchAsync(dst, src, sz, 3, at, idx, 0, s), cudaErrorInvalidValue);
	TCU_ERR(cudaMemcpyBatchAsync(dst, src, sz, 3, at, idx, 3, NULL), cudaErrorInvalidValue);
	TCU_ERR(cudaMemcpyBatchAsync(dst, src, sz, 3, at, idx, 3, cudaStreamLegacy),
		cudaErrorInvalidValue);
	TCU_ERR(cudaMemcpyBatchAsync(dst, src, sz0, 3, at, idx, 3, s), cudaErrorInvalidValue);
	idx[0] = 1;
	TCU_ERR(cudaMemcpyBatchAsync(dst, src, sz, 3, at, idx, 3, s), cudaErrorInvalidValue);
	idx[0] = 0;
	idx[1] = 0;
	TCU_ERR(cudaMemcpyBatchAsync(dst, src, sz, 3, at, idx, 3, s), cudaErrorInvalidValue);
	idx[1] = 1;
	idx[2] = 3;
	TCU_ERR(cudaMemcpyBatchAsync(dst, src, sz, 3, at, idx, 3, s), cudaErrorInvalidValue);
	idx[2] = 2;
	TCU_ERR(cudaMemcpyBatchAsync(dst, src, sz, 2, at, idx, 3, s), cudaErrorInvalidValue);
	at[2].srcAccessOrder = cudaMemcpySrcAccessOrderInvalid;
	TCU_ERR(cudaMemcpyBatchAsync(dst, src, sz, 3, at, idx, 3, s), cudaErrorInvalidValue);
	at[2].srcAccessOrder = cudaMemcpySrcAccessOrderDuringApiCall;
	dst[2] = dev + 56; /* runs past the allocation's end */
	TCU_ERR(cudaMemcpyBatchAsync(dst, src, sz, 3, at, idx, 3, s), cudaErrorInvalidValue);
	dst[2] = dev + 32;
	TCU_ERR(cudaMemcpyBatchAsync(dst, src, sz, 3, at, idx, 3, (cudaStream_t)(uintptr_t)0x40),
		cudaErrorInvalidResourceHandle);
	tcu_gate_hold(g, s);
	TCU_OK(cudaMemcpyBatchAsync(dst, src, sz, 3, at, idx, 3, s));
	memset(pin, 6, 16);           /* Any: read at the call here */
	memset(page, 4, sizeof page); /* DuringApiCall: already read */
	memset(pin + 16, 5, 16);      /* Stream order: read when the batch runs */
	TCU_ERR(cudaStreamQuery(s), cudaErrorNotReady);
	tcu_gate_open(g);
	TCU_OK(cudaStreamSynchronize(s));
	TCU_OK(cudaMemcpy(pin + 32, dev, 48, cudaMemcpyDeviceToHost));
	assert_int_equal(pin[32], 1);
	assert_int_equal(pin[48], 5);
	assert_int_equal(pin[64 + 15], 3);
	TCU_OK(cudaStreamDestroy(s));
	TCU_OK(cudaFree(dev));
	TCU_OK(cudaFreeHost(pin));
}

/* Event timing: refused without timing or records, not ready while pending. */
static void
test_event_timing(void **state)
{
	cudaStream_t s = tcu_stream(cudaStreamNonBlocking);
	cudaEvent_t a, b, nt;
	struct tcu_gate *g = tcu_gate_new();
	float ms = -1;

	(void)state;
	TCU_OK(cudaEventCreate(&a));
	TCU_OK(cudaEventCreate(&b));
	TCU_OK(cudaEventCreateWithFlags(&nt, cudaEventDisableTiming));
	TCU_ERR(cudaEventCreateWithFlags(&nt, 0x40), cudaErrorInvalidValue);
	TCU_OK(cudaEventQuery(a)); /* never recorded */
	TCU_ERR(cudaEventElapsedTime(&ms, a, b), cudaErrorInvalidResourceHandle);
	TCU_OK(cudaEventRecord(a, s));
	tcu_gate_hold(g, s);
	TCU_OK(cudaEventRecord(b, s));
	TCU_OK(cudaEventRecord(nt, s));
	TCU_ERR(cudaEventElapsedTime(&ms, a, b), cudaErrorNotReady);
	tcu_gate_open(g);
	TCU_OK(cudaEventSynchronize(b));
	TCU_OK(cudaEventElapsedTime(&ms, a, b));
	assert_true(ms >= 0);
	TCU_ERR(cudaEventElapsedTime(&ms, a, nt), cudaErrorInvalidResourceHandle);
	TCU_OK(cudaEventDestroy(a));
	TCU_OK(cudaEventDestroy(b));
	TCU_OK(cudaEventDestroy(nt));
	TCU_ERR(cudaEventDestroy(nt), cudaErrorInvalidResourceHandle);
	TCU_ERR(cudaEventRecord(nt, s), cudaErrorInvalidResourceHandle);
	TCU_OK(cudaStreamDestroy(s));
}

static void *
tcu_other_thread(void *arg)
{
	int *out = arg;
	int dev = -1;

	out[0] = (int)cudaPeekAtLastError(); /* the main thread's error is not ours */
	out[1] = (int)cudaGetDevice(&dev);
	out[2] = dev;
	return NULL;
}

/* Error names and messages; the last error is per thread. */
static void
test_errors(void **state)
{
	pthread_t t;
	int out[3] = { -1, -1, -1 };

	(void)state;
	assert_string_equal(cudaGetErrorName(cudaSuccess), "cudaSuccess");
	assert_string_equal(cudaGetErrorName(cudaErrorInvalidValue), "cudaErrorInvalidValue");
	assert_string_equal(cudaGetErrorString(cudaErrorInvalidValue), "invalid argument");
	assert_string_equal(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory");
	assert_string_equal(cudaGetErrorName(cudaErrorLaunchFailure), "cudaErrorLaunchFailure");
	assert_string_equal(cudaGetErrorString(cudaErrorLaunchFailure),
			    "unspecified launch failure");
	assert_string_equal(cudaGetErrorName((cudaError_t)12345), "unrecognized error code");
	assert_string_equal(cudaGetErrorString((cudaError_t)12345), "unrecognized error code");
	TCU_ERR(cudaSetDevice(1), cudaErrorInvalidDevice);
	TCU_ERR(cudaPeekAtLastError(), cudaErrorInvalidDevice);
	kvt_cuemu_set_error(cudaSuccess); /* not an error: the pending one stays */
	TCU_ERR(cudaPeekAtLastError(), cudaErrorInvalidDevice);
	assert_int_equal(pthread_create(&t, NULL, tcu_other_thread, out), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_equal(out[0], cudaSuccess);
	assert_int_equal(out[1], cudaSuccess);
	assert_int_equal(out[2], 0);
	TCU_ERR(cudaGetLastError(), cudaErrorInvalidDevice);
	TCU_OK(cudaGetLastError());
	TCU_ERR(cudaLaunchKernel(NULL, (dim3){ 1, 1, 1 }, (dim3){ 1, 1, 1 }, NULL, 0, NULL),
		cudaErrorNotSupported);
	TCU_ERR(cudaGetLastError(), cudaErrorNotSupported);
}

/*
 * A kernel fault is sticky: every operation not started yet is dropped (also those queued before
 * the fault), every sync fails, until the reset.
 */
static void
test_sticky_fault(void **state)
{
	cudaStream_t s = tcu_stream(cudaStreamNonBlocking);
	struct tcu_gate *g = tcu_gate_new(), *g2 = tcu_gate_new();
	void *p = NULL;
	int dropped;

	(void)state;
	tcu_gate_hold(g, s);
	TCU_OK(kvt_cuemu_enqueue(s, tcu_gate_run, tcu_gate_drop, g2));
	kvt_cuemu_kernel_fault("test_cuemu: a deliberate fault");
	tcu_gate_open(g);
	TCU_ERR(cudaStreamSynchronize(s), cudaErrorLaunchFailure);
	TCU_ERR(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
	TCU_ERR(cudaMalloc(&p, 64), cudaErrorLaunchFailure);
	TCU_ERR(cudaMemsetAsync(p, 0, 1, s), cudaErrorLaunchFailure);
	TCU_ERR(kvt_cuemu_fail_check("launch"), cudaErrorLaunchFailure);
	TCU_ERR(cudaGetLastError(), cudaErrorLaunchFailure);
	TCU_ERR(cudaGetLastError(), cudaErrorLaunchFailure); /* sticky: not cleared */
	assert_int_equal(tcu_gate_get(g2, &dropped), 0); /* not started at the fault: dropped */
	assert_int_equal(dropped, 1);
	kvt_cuemu_reset();
	TCU_OK(cudaGetLastError());
	TCU_OK(cudaDeviceSynchronize());
	TCU_OK(kvt_cuemu_fail_check("launch"));
	TCU_OK(cudaMalloc(&p, 64));
	TCU_OK(cudaFree(p));
	TCU_OK(cudaStreamDestroy(s));
}

/* kvt_cuemu_fail: calls after+1 .. after+count fail with the error, the others run. */
static void
test_fault_injection(void **state)
{
	void *p[4] = { NULL, NULL, NULL, NULL };

	(void)state;
	assert_int_equal(kvt_cuemu_fail("cudaNoSuchCall", cudaErrorUnknown, 0, 1), -1);
	assert_int_equal(kvt_cuemu_fail("cudaMalloc", cudaErrorMemoryAllocation, 1, 2), 0);
	TCU_OK(cudaMalloc(&p[0], 16));
	TCU_ERR(cudaMalloc(&p[1], 16), cudaErrorMemoryAllocation);
	TCU_ERR(cudaMalloc(&p[2], 16), cudaErrorMemoryAllocation);
	TCU_ERR(cudaGetLastError(), cudaErrorMemoryAllocation);
	TCU_OK(cudaMalloc(&p[3], 16));
	assert_null(p[1]);
	assert_null(p[2]);
	TCU_OK(cudaFree(p[0]));
	TCU_OK(cudaFree(p[3]));
	assert_int_equal(kvt_cuemu_fail("launch", cudaErrorLaunchOutOfResources, 0, 1), 0);
	TCU_ERR(kvt_cuemu_fail_check("launch"), cudaErrorLaunchOutOfResources);
	TCU_ERR(cudaPeekAtLastError(), cudaErrorLaunchOutOfResources);
	TCU_OK(kvt_cuemu_fail_check("launch"));
	assert_int_equal(kvt_cuemu_fail("cudaDeviceSynchronize", cudaErrorIllegalAddress, 0, 5),
			 0);
	TCU_ERR(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
	assert_int_equal(kvt_cuemu_fail("cudaDeviceSynchronize", cudaSuccess, 0, 0), 0);
	TCU_OK(cudaDeviceSynchronize());
}

static void
tcu_call_runtime(void *ctx)
{
	int *out = ctx;

	out[0] = (int)cudaDeviceSynchronize(); /* would wait for itself */
	out[1] = (int)cudaGetErrorString(cudaSuccess)[0]; /* no context needed: fine */
}

/* Stream work must not call the runtime (as CUDA host callbacks must not): refused. */
static void
test_runtime_from_stream_work(void **state)
{
	cudaStream_t s = tcu_stream(cudaStreamNonBlocking);
	int out[2] = { -1, -1 };

	(void)state;
	TCU_OK(kvt_cuemu_enqueue(s, tcu_call_runtime, NULL, out));
	TCU_OK(cudaStreamSynchronize(s));
	assert_int_equal(out[0], cudaErrorNotPermitted);
	assert_int_equal(out[1], 'n');
	TCU_OK(cudaStreamDestroy(s));
}

/* KVT_CUEMU_DEVICES=0: no device, as on a machine without a GPU. */
static void
test_no_device(void **state)
{
	int n = -1;
	void *p = NULL;

	(void)state;
	setenv("KVT_CUEMU_DEVICES", "0", 1);
	TCU_ERR(cudaGetDeviceCount(&n), cudaErrorNoDevice);
	assert_int_equal(n, 0);
	TCU_ERR(cudaMalloc(&p, 16), cudaErrorNoDevice);
	TCU_ERR(cudaSetDevice(0), cudaErrorNoDevice);
	unsetenv("KVT_CUEMU_DEVICES");
	TCU_OK(cudaGetDeviceCount(&n));
	assert_int_equal(n, 1);
	TCU_OK(cudaSetDevice(0));
}

/* The device describes an H200. */
static void
test_device_props(void **state)
{
	struct cudaDeviceProp p;
	int v = 0;

	(void)state;
	TCU_OK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0));
	assert_int_equal(v, 132);
	TCU_OK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, 0));
	assert_int_equal(v, 9);
	TCU_OK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
	assert_int_equal(v, 227 * 1024);
	TCU_ERR(cudaDeviceGetAttribute(&v, cudaDevAttrWarpSize, 1), cudaErrorInvalidDevice);
	TCU_OK(cudaGetDeviceProperties(&p, 0));
	assert_non_null(strstr(p.name, "cuemu"));
	assert_int_equal(p.warpSize, 32);
	assert_int_equal(p.maxThreadsPerMultiProcessor, 2048);
	assert_int_equal(p.sharedMemPerBlock, 48 * 1024);
	assert_int_equal(p.totalGlobalMem, (size_t)8192 << 20);
	TCU_OK(cudaRuntimeGetVersion(&v));
	assert_int_equal(v, 13000);
	TCU_OK(cudaDriverGetVersion(&v));
	assert_int_equal(v, 13000);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_stream_order, tcu_setup, tcu_teardown),
		cmocka_unit_test_setup_teardown(test_delayed_order, tcu_setup, tcu_teardown),
		cmocka_unit_test_setup_teardown(test_async_is_late, tcu_setup, tcu_teardown),
		cmocka_unit_test_setup_teardown(test_event_wait, tcu_setup, tcu_teardown),
		cmocka_unit_test_setup_teardown(test_legacy_stream, tcu_setup, tcu_teardown),
		cmocka_unit_test_setup_teardown(test_stream_destroy_pending, tcu_setup,
						tcu_teardown),
		cmocka_unit_test_setup_teardown(test_range_checks, tcu_setup, tcu_teardown),
		cmocka_unit_test_setup_teardown(test_memory, tcu_setup, tcu_teardown),
		cmocka_unit_test_setup_teardown(test_batch, tcu_setup, tcu_teardown),
		cmocka_unit_test_setup_teardown(test_event_timing, tcu_setup, tcu_teardown),
		cmocka_unit_test_setup_teardown(test_errors, tcu_setup, tcu_teardown),
		cmocka_unit_test_setup_teardown(test_sticky_fault, tcu_setup, tcu_teardown),
		cmocka_unit_test_setup_teardown(test_fault_injection, tcu_setup, tcu_teardown),
		cmocka_unit_test_setup_teardown(test_runtime_from_stream_work, tcu_setup,
						tcu_teardown),
		cmocka_unit_test_setup_teardown(test_no_device, tcu_setup, tcu_teardown),
		cmocka_unit_test_setup_teardown(test_device_props, tcu_setup, tcu_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif /* KVT_CUDA_EMU */
