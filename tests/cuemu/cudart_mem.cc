/* SPDX-License-Identifier: MIT */
/*
 * tests/cuemu/cudart_mem.cc - the emulated CUDA runtime's memory: allocations (device,
 * pinned host, registered host) in a registry of address ranges, copies and memsets checked
 * against it at call time and run in stream order on the stream's worker.
 *
 * Device memory is host memory (256-byte aligned, poisoned with CUEMU_POISON_DEV like real
 * uninitialised memory) counted against the emulated HBM size; under AddressSanitizer the
 * slack up to the next 256 bytes is poisoned for it too, so a kernel reading past the end of
 * an allocation is reported even where the rounding would hide it. Under UVA a pinned or
 * registered host range is also a valid device pointer, as on a real system. A copy whose
 * kind says a side is device must lie inside one live device, pinned or registered allocation;
 * a side said to be host must not be (part of) a device allocation; no side may run past the
 * end of an allocation it starts in. Synchronous calls follow CUDA's rules: cudaMemcpy waits
 * except device to device; cudaMemset returns at once for device memory.
 */
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cudart_int.h"

#if defined(__has_include)
#if __has_include(<sanitizer/asan_interface.h>)
#include <sanitizer/asan_interface.h> /* no-op macros unless built with AddressSanitizer */
#endif
#endif
#ifndef ASAN_POISON_MEMORY_REGION
#define ASAN_POISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#define ASAN_UNPOISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#endif

#define CUEMU_DEV_ALIGN 256u     /* cudaMalloc alignment (real: at least 256) */
#define CUEMU_HOST_ALIGN 4096u   /* cudaHostAlloc alignment: pages */
#define CUEMU_POISON_DEV 0xff    /* fresh cudaMalloc bytes (NaN as f16/bf16/f32) */
#define CUEMU_POISON_HOST 0xfe   /* fresh cudaHostAlloc bytes (NaN as f16/bf16) */

/* what an allocation is */
enum cuemu_kind {
	CUEMU_KDEV,    /* cudaMalloc */
	CUEMU_KPINNED, /* cudaHostAlloc / cudaMallocHost */
	CUEMU_KREG,    /* cudaHostRegister (not ours to free) */
};

/* one allocation of the registry */
struct cuemu_alloc {
	size_t len;      /* bytes requested (copies are checked against it) */
	size_t charged;  /* bytes counted against the HBM size (device only) */
	cuemu_kind kind; /* what it is */
};

/* the registry: allocated once, never freed (reachable for LeakSanitizer) */
struct cuemu_mem {
	std::mutex mu;                          /* guards the rest */
	std::map<uintptr_t, cuemu_alloc> allocs; /* by start address */
	size_t used = 0;                        /* HBM bytes charged */
};

static cuemu_mem *
cuemu_mem_get(void)
{
	static cuemu_mem *m = new cuemu_mem;

	return m;
}

/* how a range relates to the registry */
enum cuemu_where {
	CUEMU_NONE_OF = 0, /* touches no allocation: pageable host memory */
	CUEMU_INSIDE = 1,  /* wholly inside one allocation */
	CUEMU_ACROSS = -1, /* overlaps an allocation's end or start (or wraps) */
};

/* Where [p, p + n) lies (n > 0); *kind gets the allocation's kind if inside one. Lock held. */
static cuemu_where
cuemu_where_is(cuemu_mem *m, uintptr_t p, size_t n, cuemu_kind *kind)
{
	if (n > UINTPTR_MAX - p)
		return CUEMU_ACROSS;
	auto it = m->allocs.upper_bound(p);
	if (it != m->allocs.end() && it->first < p + n)
		return CUEMU_ACROSS; /* an allocation starts inside the range */
	if (it == m->allocs.begin())
		return CUEMU_NONE_OF;
	--it;
	if (p >= it->first + it->second.len)
		return CUEMU_NONE_OF;
	if (p + n > it->first + it->second.len)
		return CUEMU_ACROSS;
	*kind = it->second.kind;
	return CUEMU_INSIDE;
}

/** kvt_cuemu_addressable() - see cuemu.h. */
int
kvt_cuemu_addressable(const void *p, size_t n)
{
	cuemu_mem *m = cuemu_mem_get();
	cuemu_kind k = CUEMU_KDEV;
	std::lock_guard<std::mutex> lk(m->mu);

	if (n == 0)
		n = 1;
	return p != nullptr && cuemu_where_is(m, (uintptr_t)p, n, &k) == CUEMU_INSIDE;
}

/* ------------------------------------------------------------------------------------------ */
/* allocation                                                                                   */

/** cudaMalloc() - @size bytes of device memory, poisoned; size 0 gives NULL. */
cudaError_t
cudaMalloc(void **devPtr, size_t size)
{
	cudaError_t e = cuemu_enter("cudaMalloc", CUEMU_STICKY);
	cuemu_mem *m = cuemu_mem_get();
	size_t charged = (size + CUEMU_DEV_ALIGN - 1) & ~(size_t)(CUEMU_DEV_ALIGN - 1);
	void *p;

	if (e == cudaSuccess && devPtr == nullptr)
		e = cudaErrorInvalidValue;
	if (e != cudaSuccess)
		return cuemu_ret(e);
	if (size == 0) {
		*devPtr = nullptr;
		return cudaSuccess;
	}
	{
		std::lock_guard<std::mutex> lk(m->mu); /* reserve first, poison unlocked */
		size_t limit = cuemu_hbm_bytes();

		if (charged < size || m->used > limit || charged > limit - m->used)
			return cuemu_ret(cudaErrorMemoryAllocation);
		m->used += charged;
	}
	p = aligned_alloc(CUEMU_DEV_ALIGN, charged);
	if (p != nullptr) {
		memset(p, CUEMU_POISON_DEV, charged);
		ASAN_POISON_MEMORY_REGION((char *)p + size, charged - size); /* the slack */
	}
	std::lock_guard<std::mutex> lk(m->mu);
	if (p == nullptr) {
		m->used -= charged;
		return cuemu_ret(cudaErrorMemoryAllocation);
	}
	m->allocs[(uintptr_t)p] = cuemu_alloc{ size, charged, CUEMU_KDEV };
	*devPtr = p;
	return cudaSuccess;
}

size_t
cuemu_hbm_used(void)
{
	cuemu_mem *m = cuemu_mem_get();
	std::lock_guard<std::mutex> lk(m->mu);

	return m->used;
}

/* cudaFree / cudaFreeHost: synchronise the device, then release @p of @kind. */
static cudaError_t
cuemu_free(const char *api, void *p, cuemu_kind kind)
{
	cudaError_t e = cuemu_enter(api, CUEMU_DEV);
	cuemu_mem *m = cuemu_mem_get();

	if (e != cudaSuccess)
		return cuemu_ret(e);
	if (p == nullptr)
		return cuemu_ret(cuemu_sticky());
	cuemu_drain(); /* as CUDA does: no queued work may still use it */
	{
		std::lock_guard<std::mutex> lk(m->mu);
		auto it = m->allocs.find((uintptr_t)p);
		if (it == m->allocs.end() || it->second.kind != kind)
			return cuemu_ret(cudaErrorInvalidValue);
		m->used -= it->second.charged;
		if (kind == CUEMU_KDEV) /* cudaMalloc's slack, poisoned for AddressSanitizer */
			ASAN_UNPOISON_MEMORY_REGION((char *)p + it->second.len,
						    it->second.charged - it->second.len);
		m->allocs.erase(it);
	}
	free(p);
	return cuemu_ret(cuemu_sticky());
}

/** cudaFree() - release device memory (NULL: nothing); synchronises the device first. */
cudaError_t
cudaFree(void *devPtr)
{
	return cuemu_free("cudaFree", devPtr, CUEMU_KDEV);
}

/** cudaFreeHost() - release pinned host memory; synchronises the device first. */
cudaError_t
cudaFreeHost(void *ptr)
{
	return cuemu_free("cudaFreeHost", ptr, CUEMU_KPINNED);
}

static cudaError_t
cuemu_host_alloc(const char *api, void **pHost, size_t size, unsigned flags)
{
	cudaError_t e = cuemu_enter(api, CUEMU_STICKY);
	const unsigned all = cudaHostAllocPortable | cudaHostAllocMapped |
			     cudaHostAllocWriteCombined;
	size_t len = (size + CUEMU_HOST_ALIGN - 1) & ~(size_t)(CUEMU_HOST_ALIGN - 1);
	cuemu_mem *m = cuemu_mem_get();
	void *p;

	if (e == cudaSuccess && (pHost == nullptr || (flags & ~all) != 0))
		e = cudaErrorInvalidValue;
	if (e != cudaSuccess)
		return cuemu_ret(e);
	if (size == 0) {
		*pHost = nullptr;
		return cudaSuccess;
	}
	if (len < size || (p = aligned_alloc(CUEMU_HOST_ALIGN, len)) == nullptr)
		return cuemu_ret(cudaErrorMemoryAllocation);
	memset(p, CUEMU_POISON_HOST, len);
	std::lock_guard<std::mutex> lk(m->mu);
	m->allocs[(uintptr_t)p] = cuemu_alloc{ size, 0, CUEMU_KPINNED };
	*pHost = p;
	return cudaSuccess;
}

/** cudaHostAlloc() - pinned host memory, also a device pointer (UVA); any cudaHostAlloc flags. */
cudaError_t
cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
	return cuemu_host_alloc("cudaHostAlloc", pHost, size, flags);
}

/** cudaMallocHost() - cudaHostAlloc(ptr, size, cudaHostAllocDefault). */
cudaError_t
cudaMallocHost(void **ptr, size_t size)
{
	return cuemu_host_alloc("cudaMallocHost", ptr, size, cudaHostAllocDefault);
}

/** cudaHostRegister() - make [@ptr, @ptr + @size) pinned (a device pointer too). */
cudaError_t
cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
	cudaError_t e = cuemu_enter("cudaHostRegister", CUEMU_STICKY);
	const unsigned all = cudaHostRegisterPortable | cudaHostRegisterMapped |
			     cudaHostRegisterIoMemory | cudaHostRegisterReadOnly;
	cuemu_mem *m = cuemu_mem_get();
	cuemu_kind k;

	if (e == cudaSuccess && (ptr == nullptr || size == 0 || (flags & ~all) != 0))
		e = cudaErrorInvalidValue;
	if (e != cudaSuccess)
		return cuemu_ret(e);
	std::lock_guard<std::mutex> lk(m->mu);
	if (cuemu_where_is(m, (uintptr_t)ptr, size, &k) != CUEMU_NONE_OF)
		return cuemu_ret(cudaErrorHostMemoryAlreadyRegistered);
	m->allocs[(uintptr_t)ptr] = cuemu_alloc{ size, 0, CUEMU_KREG };
	return cudaSuccess;
}

/** cudaHostUnregister() - undo cudaHostRegister(@ptr, ...). */
cudaError_t
cudaHostUnregister(void *ptr)
{
	cudaError_t e = cuemu_enter("cudaHostUnregister", CUEMU_STICKY);
	cuemu_mem *m = cuemu_mem_get();

	if (e != cudaSuccess)
		return cuemu_ret(e);
	std::lock_guard<std::mutex> lk(m->mu);
	auto it = m->allocs.find((uintptr_t)ptr);
	if (it == m->allocs.end() || it->second.kind != CUEMU_KREG)
		return cuemu_ret(cudaErrorHostMemoryNotRegistered);
	m->allocs.erase(it);
	return cudaSuccess;
}

/** cudaPointerGetAttributes() - what @ptr is: device, host (pinned/registered), unregistered. */
cudaError_t
cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr)
{
	cudaError_t e = cuemu_enter("cudaPointerGetAttributes", CUEMU_STICKY);
	cuemu_mem *m = cuemu_mem_get();
	cuemu_kind k = CUEMU_KDEV;

	if (e == cudaSuccess && attributes == nullptr)
		e = cudaErrorInvalidValue;
	if (e != cudaSuccess)
		return cuemu_ret(e);
	memset(attributes, 0, sizeof *attributes);
	std::lock_guard<std::mutex> lk(m->mu);
	if (ptr == nullptr || cuemu_where_is(m, (uintptr_t)ptr, 1, &k) != CUEMU_INSIDE) {
		attributes->type = cudaMemoryTypeUnregistered;
		attributes->device = cudaInvalidDeviceId;
		return cudaSuccess;
	}
	attributes->type = k == CUEMU_KDEV ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
	attributes->device = 0;
	attributes->devicePointer = (void *)ptr;
	attributes->hostPointer = k == CUEMU_KDEV ? nullptr : (void *)ptr;
	return cudaSuccess;
}

/** cudaMemGetInfo() - free and total emulated HBM bytes. */
cudaError_t
cudaMemGetInfo(size_t *free_b, size_t *total)
{
	cudaError_t e = cuemu_enter("cudaMemGetInfo", CUEMU_STICKY);
	size_t t = cuemu_hbm_bytes(), u = cuemu_hbm_used();

	if (e == cudaSuccess && (free_b == nullptr || total == nullptr))
		e = cudaErrorInvalidValue;
	if (e != cudaSuccess)
		return cuemu_ret(e);
	*free_b = u < t ? t - u : 0;
	*total = t;
	return cudaSuccess;
}

/* ------------------------------------------------------------------------------------------ */
/* copies and memsets                                                                           */

/* what the checks learned about one copy */
struct cuemu_copy {
	void *dst;       /* destination */
	const void *src; /* source */
	size_t n;        /* bytes (0: nothing to do) */
	bool dst_dev;    /* dst is in a device allocation */
	bool src_dev;    /* src is in a device allocation */
	bool src_pageable; /* src is in no allocation: staged at call time */
};

/* Check one side of a copy; @dev_side: the kind says it is device memory. Lock held. */
static cudaError_t
cuemu_check_side(cuemu_mem *m, const void *p, size_t n, int dev_side, bool *is_dev, bool *pg)
{
	cuemu_kind k = CUEMU_KREG;
	cuemu_where w;

	if (p == nullptr)
		return cudaErrorInvalidValue;
	w = cuemu_where_is(m, (uintptr_t)p, n, &k);
	*is_dev = w == CUEMU_INSIDE && k == CUEMU_KDEV;
	*pg = w == CUEMU_NONE_OF;
	if (w == CUEMU_ACROSS)
		return cudaErrorInvalidValue; /* runs past an allocation's end (or into one) */
	if (dev_side == 1 && w != CUEMU_INSIDE)
		return cudaErrorInvalidValue; /* said device: not device-addressable */
	if (dev_side == 0 && *is_dev)
		return cudaErrorInvalidValue; /* said host: is device memory */
	return cudaSuccess;
}

/* Check a copy of @n bytes of @kind (@n 0: the kind only, as CUDA does); fills *c. */
static cudaError_t
cuemu_check_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cuemu_copy *c)
{
	static const int dst_dev[] = { 0, 1, 0, 1, -1 }; /* by kind: 1 device, 0 host, -1 any */
	static const int src_dev[] = { 0, 0, 1, 1, -1 };
	cuemu_mem *m = cuemu_mem_get();
	bool pg = false;
	cudaError_t e;

	if ((unsigned)kind > (unsigned)cudaMemcpyDefault)
		return cudaErrorInvalidMemcpyDirection;
	*c = cuemu_copy{ dst, src, n, false, false, false };
	if (n == 0)
		return cudaSuccess;
	std::lock_guard<std::mutex> lk(m->mu);
	e = cuemu_check_side(m, dst, n, dst_dev[kind], &c->dst_dev, &pg);
	if (e == cudaSuccess)
		e = cuemu_check_side(m, src, n, src_dev[kind], &c->src_dev, &c->src_pageable);
	return e;
}

/*
 * The operation that performs @c: pageable sources are staged now, as the driver does (for a
 * synchronous copy, which waits for it, the same as reading them later).
 */
static cuemu_op
cuemu_copy_op(const cuemu_copy &c)
{
	cuemu_op op;
	void *dst = c.dst;

	if (c.src_pageable) {
		auto buf = std::make_shared<std::vector<unsigned char>>(
			(const unsigned char *)c.src, (const unsigned char *)c.src + c.n);
		op.run = [dst, buf] { memcpy(dst, buf->data(), buf->size()); };
	} else {
		const void *src = c.src;
		size_t n = c.n;
		op.run = [dst, src, n] { memcpy(dst, src, n); };
	}
	return op;
}

/*
 * cudaMemcpy (@sync: on the legacy stream, waits unless device to device) and cudaMemcpyAsync:
 * check, then queue the copy on @stream.
 */
static cudaError_t
cuemu_memcpy(const char *api, void *dst, const void *src, size_t n, cudaMemcpyKind kind,
	     cudaStream_t stream, bool sync)
{
	cudaError_t e = cuemu_enter(api, CUEMU_STICKY);
	cuemu_record mark;
	cuemu_copy c;

	if (e == cudaSuccess)
		e = cuemu_check_copy(dst, src, n, kind, &c);
	if (e != cudaSuccess || n == 0)
		return cuemu_ret(e);
	e = cuemu_submit(stream, cuemu_copy_op(c), &mark);
	if (e == cudaSuccess && sync && !(c.dst_dev && c.src_dev))
		e = cuemu_wait(mark);
	return cuemu_ret(e);
}

/** cudaMemcpy() - copy on the legacy stream; returns when done, except device to device. */
cudaError_t
cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
	return cuemu_memcpy("cudaMemcpy", dst, src, count, kind, nullptr, true);
}

/** cudaMemcpyAsync() - copy in @stream's order (pageable sources are staged at the call). */
cudaError_t
cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
		cudaStream_t stream)
{
	return cuemu_memcpy("cudaMemcpyAsync", dst, src, count, kind, stream, false);
}

/* Check the batch's attributes per the CUDA 13 documentation. */
static cudaError_t
cuemu_check_attrs(size_t count, const cudaMemcpyAttributes *attrs, const size_t *idx,
		  size_t num)
{
	if (attrs == nullptr || idx == nullptr || num == 0 || num > count || idx[0] != 0)
		return cudaErrorInvalidValue;
	for (size_t k = 0; k < num; k++) {
		if (k > 0 && idx[k] <= idx[k - 1])
			return cudaErrorInvalidValue;
		if (idx[k] >= count)
			return cudaErrorInvalidValue;
		if (attrs[k].srcAccessOrder != cudaMemcpySrcAccessOrderStream &&
		    attrs[k].srcAccessOrder != cudaMemcpySrcAccessOrderDuringApiCall &&
		    attrs[k].srcAccessOrder != cudaMemcpySrcAccessOrderAny)
			return cudaErrorInvalidValue;
		if ((attrs[k].flags & ~(unsigned)cudaMemcpyFlagPreferOverlapWithCompute) != 0)
			return cudaErrorInvalidValue;
	}
	return cudaSuccess;
}

/* one copy of a batch, as queued */
struct cuemu_bcopy {
	void *dst;                                        /* destination */
	const void *src;                                  /* source (unless staged) */
	size_t n;                                         /* bytes */
	std::shared_ptr<std::vector<unsigned char>> buf;  /* staged source, or NULL */
};

/**
 * cudaMemcpyBatchAsync() - @count copies as one operation of @stream (not the legacy stream).
 * Every copy is checked like cudaMemcpyAsync(cudaMemcpyDefault) and must be non-empty; the
 * attributes as documented (attrsIdxs[0] 0, increasing, < count; a valid srcAccessOrder).
 * Sources with cudaMemcpySrcAccessOrderDuringApiCall, and with cudaMemcpySrcAccessOrderAny
 * (which lets CUDA read them at any time, the call's included), are read during the call. The
 * copies of a batch run in reverse order (CUDA promises none), so dependent copies in one batch
 * show up.
 */
cudaError_t
cudaMemcpyBatchAsync(void *const *dsts, const void *const *srcs, const size_t *sizes,
		     size_t count, struct cudaMemcpyAttributes *attrs, size_t *attrsIdxs,
		     size_t numAttrs, cudaStream_t stream)
{
	cudaError_t e = cuemu_enter("cudaMemcpyBatchAsync", CUEMU_STICKY);
	auto v = std::make_shared<std::vector<cuemu_bcopy>>();
	cuemu_op op;
	size_t k = 0;

	if (e == cudaSuccess && (count == 0 || dsts == nullptr || srcs == nullptr ||
				 sizes == nullptr))
		e = cudaErrorInvalidValue;
	if (e == cudaSuccess && (stream == nullptr || stream == cudaStreamLegacy))
		e = cudaErrorInvalidValue; /* "must not be legacy NULL stream" */
	if (e == cudaSuccess)
		e = cuemu_check_attrs(count, attrs, attrsIdxs, numAttrs);
	if (e != cudaSuccess)
		return cuemu_ret(e);
	v->reserve(count);
	for (size_t i = 0; i < count && e == cudaSuccess; i++) {
		cuemu_copy c;

		while (k + 1 < numAttrs && attrsIdxs[k + 1] <= i)
			k++;
		if (sizes[i] == 0)
			e = cudaErrorInvalidValue; /* an empty copy is refused in a batch */
		else
			e = cuemu_check_copy(dsts[i], srcs[i], sizes[i], cudaMemcpyDefault, &c);
		if (e != cudaSuccess)
			break;
		v->push_back(cuemu_bcopy{ dsts[i], srcs[i], sizes[i], nullptr });
		if (attrs[k].srcAccessOrder != cudaMemcpySrcAccessOrderStream)
			v->back().buf = std::make_shared<std::vector<unsigned char>>(
				(const unsigned char *)srcs[i],
				(const unsigned char *)srcs[i] + sizes[i]);
	}
	if (e != cudaSuccess)
		return cuemu_ret(e);
	op.run = [v] {
		for (size_t i = v->size(); i-- > 0;) {
			const cuemu_bcopy &c = (*v)[i];
			memcpy(c.dst, c.buf ? c.buf->data() : c.src, c.n);
		}
	};
	return cuemu_ret(cuemu_submit(stream, std::move(op), nullptr));
}

/* Check a memset of [@p, @p + @n) (n > 0); *dev: it is device memory. */
static cudaError_t
cuemu_check_set(void *p, size_t n, bool *dev)
{
	cuemu_mem *m = cuemu_mem_get();
	cuemu_kind k = CUEMU_KREG;
	std::lock_guard<std::mutex> lk(m->mu);

	if (p == nullptr || cuemu_where_is(m, (uintptr_t)p, n, &k) != CUEMU_INSIDE)
		return cudaErrorInvalidValue;
	*dev = k == CUEMU_KDEV;
	return cudaSuccess;
}

/*
 * cudaMemset (@sync: on the legacy stream, waits unless the target is device memory) and
 * cudaMemsetAsync: check, then queue the fill on @stream.
 */
static cudaError_t
cuemu_memset(const char *api, void *p, int value, size_t n, cudaStream_t stream, bool sync)
{
	cudaError_t e = cuemu_enter(api, CUEMU_STICKY);
	cuemu_record mark;
	cuemu_op op;
	bool dev = false;

	if (e != cudaSuccess || n == 0)
		return cuemu_ret(e);
	e = cuemu_check_set(p, n, &dev);
	if (e != cudaSuccess)
		return cuemu_ret(e);
	op.run = [p, value, n] { memset(p, value, n); };
	e = cuemu_submit(stream, std::move(op), &mark);
	if (e == cudaSuccess && sync && !dev)
		e = cuemu_wait(mark); /* pinned host target: synchronous */
	return cuemu_ret(e);
}

/** cudaMemset() - fill on the legacy stream; returns at once for device memory (as CUDA). */
cudaError_t
cudaMemset(void *devPtr, int value, size_t count)
{
	return cuemu_memset("cudaMemset", devPtr, value, count, nullptr, true);
}

/** cudaMemsetAsync() - fill in @stream's order. */
cudaError_t
cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
	return cuemu_memset("cudaMemsetAsync", devPtr, value, count, stream, false);
}
