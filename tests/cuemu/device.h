/* SPDX-License-Identifier: MIT */
/*
 * tests/cuemu/device.h - the device side of the CUDA-on-CPU emulation (see cuemu.h): what a
 * kernels/ *.cu file needs to compile as C++ with the host compiler and run on CPU threads.
 * KVT_CUDA_EMU builds force-include it (-include) into every .cu file, before anything else.
 *
 * - __global__, __device__, __host__, __forceinline__, __launch_bounds__ are plain C++.
 * - __shared__ is `static thread_local`: the blocks of one launch run one after another on
 *   their stream's worker thread, the threads of a block as fibers of that one OS thread, so
 *   the threads of a running block share it and two streams' kernels (two workers) do not.
 *   It is not fresh per block, though: zeroed once per worker thread, it keeps what the
 *   previous block (or an earlier launch on that worker) wrote, so a read before the block's
 *   own write goes unnoticed (a GPU gives undefined values there).
 *   Dynamic shared memory (KVT_EXTERN_SHARED of kernels/launch_cuda.h) is a per-worker buffer,
 *   filled with 0xff bytes (NaN floats) before each block runs; NULL when the launch asked for
 *   none, and under ASan its bytes past the launch's size are poisoned.
 * - threadIdx, blockIdx, blockDim, gridDim are the running fiber's; warpSize is 32.
 * - __syncthreads and the warp intrinsics (__shfl*_sync, __ballot_sync, __any_sync,
 *   __all_sync, __syncwarp) are rendezvous points: a fiber waits there until every thread of
 *   its block (every lane of its mask) has arrived. A thread that leaves while others wait, a
 *   mask that differs between lanes or names a lane that does not exist is a kernel fault
 *   (kvt_cuemu_kernel_fault), and the rest of the grid is abandoned. Threads meet on the
 *   operation and mask, not the call site: two different __syncthreads() (or two shuffles of
 *   the same mask) in divergent branches release each other.
 * - Loads (__ldg, __ldcs) are plain loads; %globaltimer is kvt_cuemu_globaltimer(). Only the
 *   intrinsics the kernels use exist (no atomics, fences, __constant__, other casts or cache
 *   hints): a kernel that needs another adds it here.
 * - A launch (KVT_CUDA_LAUNCH, KVT_CUDA_LAUNCH_KERNEL of kernels/launch_cuda.h) checks the
 *   configuration as the device does, copies the arguments by value and queues the grid on
 *   the stream (exec.cc); the worker checks that each pointer argument is device-addressable,
 *   the top-level ones only (not pointers inside a struct argument such as attn_params).
 * C++17, host compiler only.
 */
#ifndef KVT_TESTS_CUEMU_DEVICE_H
#define KVT_TESTS_CUEMU_DEVICE_H

#ifndef __cplusplus
#error "tests/cuemu/device.h is for the .cu files compiled as C++ (KVT_CUDA_EMU builds)"
#endif

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <math.h> /* nvcc makes the math functions visible in every .cu file */

#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuemu.h"

#undef warpSize
#define warpSize 32

/* ---- storage and function qualifiers ---- */
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __shared__ static thread_local
#define __launch_bounds__(...)

extern "C" {

/* One emulated thread's built-in indices (exec.cc owns them). */
struct kvt_cuemu_thread {
	uint3 tid;      /* threadIdx */
	uint3 bid;      /* blockIdx */
	dim3 bdim;      /* blockDim */
	dim3 gdim;      /* gridDim */
};

/* The running fiber's indices; valid inside a kernel only. */
extern __thread const struct kvt_cuemu_thread *kvt_cuemu_self;

/* Operations of kvt_cuemu_warp(). */
enum kvt_cuemu_warp_op {
	KVT_CUEMU_SHFL_IDX,  /* __shfl_sync */
	KVT_CUEMU_SHFL_UP,   /* __shfl_up_sync */
	KVT_CUEMU_SHFL_DOWN, /* __shfl_down_sync */
	KVT_CUEMU_SHFL_XOR,  /* __shfl_xor_sync */
	KVT_CUEMU_BALLOT,    /* __ballot_sync: bit i set when lane i's value is not 0 */
	KVT_CUEMU_SYNCWARP,  /* __syncwarp */
};

/**
 * kvt_cuemu_warp() - a warp rendezvous of the calling kernel thread: waits until every lane
 * of @mask has called it with the same @op and @mask, then returns what @op gives this lane:
 * a shuffle the @val (up to 8 bytes) of the lane that PTX shfl.sync selects with @b and the
 * lane-segment @width, a ballot the mask of lanes whose @val was not 0. Kernel threads only.
 */
uint64_t kvt_cuemu_warp(unsigned mask, int op, uint64_t val, int b, int width);

/** kvt_cuemu_syncthreads() - __syncthreads: waits until every thread of the block arrived. */
void kvt_cuemu_syncthreads(void);

/**
 * kvt_cuemu_dynamic_smem() - the running block's dynamic shared memory (64-byte aligned), NULL
 * when the launch asked for none. Under ASan the bytes past the launch's size are poisoned.
 */
void *kvt_cuemu_dynamic_smem(void);

/**
 * kvt_cuemu_globaltimer() - %globaltimer, ns: the real clock, except that the first read of
 * each thread of a grid returns the grid's start, as if all threads had started together (the
 * emulation runs them one after another: a spin of N ns then costs N ns, not N per thread).
 */
uint64_t kvt_cuemu_globaltimer(void);

/* A grid to queue: the launch configuration and the work of one thread. */
struct kvt_cuemu_grid {
	const char *name;           /* the kernel, as written at the launch site */
	dim3 grid;                  /* gridDim */
	dim3 block;                 /* blockDim */
	size_t smem;                /* dynamic shared memory, bytes */
	kvt_cuemu_fn thread;        /* runs one thread: thread(ctx) */
	kvt_cuemu_fn drop;          /* frees ctx once the grid ran or was discarded */
	void *ctx;                  /* the arguments, copied at launch */
	const void *const *ptrs;    /* the kernel's pointer arguments (checked addressable) */
	unsigned n_ptrs;            /* entries of ptrs */
};

/**
 * kvt_cuemu_launch() - check @g's configuration as the device does (block <= 1024 threads
 * within 1024 x 1024 x 64, grid x < 2^31, y and z <= 65535, no dimension 0, dynamic shared
 * memory <= 48 KiB) and the "launch" fault rule, then queue the grid on @s. On failure
 * nothing is queued, g->drop(g->ctx) is called at once and the error is also the thread's
 * last error (as a failed <<<>>> launch). Returns cudaSuccess or the error.
 */
cudaError_t kvt_cuemu_launch(const struct kvt_cuemu_grid *g, cudaStream_t s);

} /* extern "C" */

/* ---- built-in variables ---- */
#define threadIdx (static_cast<const uint3 &>(kvt_cuemu_self->tid))
#define blockIdx (static_cast<const uint3 &>(kvt_cuemu_self->bid))
#define blockDim (static_cast<const dim3 &>(kvt_cuemu_self->bdim))
#define gridDim (static_cast<const dim3 &>(kvt_cuemu_self->gdim))

/* ---- synchronisation and warp intrinsics ---- */
static inline void
__syncthreads(void)
{
	kvt_cuemu_syncthreads();
}

static inline void
__syncwarp(unsigned mask = 0xffffffffu)
{
	(void)kvt_cuemu_warp(mask, KVT_CUEMU_SYNCWARP, 0, 0, warpSize);
}

namespace kvt_cuemu {

template <typename T>
static inline uint64_t
to_bits(const T &v)
{
	static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
		      "warp shuffles move at most 8 bytes of a trivially copyable type");
	uint64_t u = 0;

	std::memcpy(&u, &v, sizeof(T));
	return u;
}

template <typename T>
static inline T
from_bits(uint64_t u)
{
	T v;

	std::memcpy(&v, &u, sizeof(T));
	return v;
}

} /* namespace kvt_cuemu */

template <typename T>
static inline T
__shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize)
{
	return kvt_cuemu::from_bits<T>(kvt_cuemu_warp(mask, KVT_CUEMU_SHFL_IDX,
						      kvt_cuemu::to_bits(var), src_lane, width));
}

template <typename T>
static inline T
__shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize)
{
	return kvt_cuemu::from_bits<T>(kvt_cuemu_warp(mask, KVT_CUEMU_SHFL_UP,
						      kvt_cuemu::to_bits(var), (int)delta, width));
}

template <typename T>
static inline T
__shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize)
{
	return kvt_cuemu::from_bits<T>(kvt_cuemu_warp(mask, KVT_CUEMU_SHFL_DOWN,
						      kvt_cuemu::to_bits(var), (int)delta, width));
}

template <typename T>
static inline T
__shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize)
{
	return kvt_cuemu::from_bits<T>(kvt_cuemu_warp(mask, KVT_CUEMU_SHFL_XOR,
						      kvt_cuemu::to_bits(var), lane_mask, width));
}

static inline unsigned
__ballot_sync(unsigned mask, int pred)
{
	return (unsigned)kvt_cuemu_warp(mask, KVT_CUEMU_BALLOT, pred != 0, 0, warpSize);
}

static inline int
__any_sync(unsigned mask, int pred)
{
	return __ballot_sync(mask, pred) != 0;
}

static inline int
__all_sync(unsigned mask, int pred)
{
	return __ballot_sync(mask, pred) == mask;
}

/* ---- loads with cache hints (those the kernels use): plain loads here ---- */
#define KVT_CUEMU_LOAD(name)                                                                   \
	template <typename T>                                                                  \
	static inline T name(const T *p)                                                       \
	{                                                                                      \
		return *p;                                                                     \
	}
KVT_CUEMU_LOAD(__ldg)
KVT_CUEMU_LOAD(__ldcs)
#undef KVT_CUEMU_LOAD

/* ---- bit casts ---- */
static inline float
__uint_as_float(unsigned x)
{
	return kvt_cuemu::from_bits<float>(x);
}

/* ---- launches ---- */
namespace kvt_cuemu {

/* A launch's copy of the kernel's arguments. */
template <typename... P>
struct grid_args {
	void (*kernel)(P...);              /* the kernel */
	std::tuple<P...> args;             /* its arguments, copied at launch */
	const void *ptrs[sizeof...(P) + 1]; /* the pointer arguments, for the addressable check */

	static void
	thread(void *ctx)
	{
		grid_args *g = static_cast<grid_args *>(ctx);

		std::apply(g->kernel, g->args);
	}

	static void
	drop(void *ctx)
	{
		delete static_cast<grid_args *>(ctx);
	}
};

/* Note @v in @out[*n] when it is a pointer (the launch checks that it is addressable). */
template <typename T>
static inline void
note_pointer(const T &v, const void **out, unsigned *n)
{
	if constexpr (std::is_pointer<T>::value)
		out[(*n)++] = (const void *)v;
}

/* Collect the pointer arguments of @args into @out; returns their number. */
template <typename... P, size_t... I>
static inline unsigned
pointer_args(const std::tuple<P...> &args, const void **out, std::index_sequence<I...>)
{
	unsigned n = 0;

	(void)args;
	(void)out;
	(note_pointer(std::get<I>(args), out, &n), ...);
	return n;
}

/* The launch of one kernel: KVT_CUDA_LAUNCH(...)(args) calls operator() with the args. */
template <typename... P>
struct launcher {
	const char *name;       /* the kernel, as written */
	void (*kernel)(P...);   /* the kernel */
	dim3 grid;              /* gridDim */
	dim3 block;             /* blockDim */
	size_t smem;            /* dynamic shared memory bytes */
	cudaStream_t stream;    /* where it goes */

	cudaError_t
	operator()(P... a) const
	{
		return launch(new grid_args<P...>{ kernel, std::tuple<P...>(a...), {} });
	}

	cudaError_t
	launch(grid_args<P...> *c) const
	{
		struct kvt_cuemu_grid g = { name, grid, block, smem, grid_args<P...>::thread,
					    grid_args<P...>::drop, c, c->ptrs, 0 };

		g.n_ptrs = pointer_args(c->args, c->ptrs, std::index_sequence_for<P...>{});
		return kvt_cuemu_launch(&g, stream);
	}
};

template <typename... P>
static inline launcher<P...>
launch(const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
       void (*kernel)(P...))
{
	return launcher<P...>{ name, kernel, grid, block, smem, stream };
}

/* cudaLaunchKernel with the kernel's type known: the arguments are read from @args[i]. */
template <typename... P, size_t... I>
static inline cudaError_t
launch_kernel_args(const launcher<P...> &l, void **args, std::index_sequence<I...>)
{
	(void)args;
	return l.launch(new grid_args<P...>{
		l.kernel, std::tuple<P...>(*static_cast<P *>(args[I])...), {} });
}

template <typename... P>
static inline cudaError_t
launch_kernel(const char *name, void (*kernel)(P...), dim3 grid, dim3 block, void **args,
	      size_t smem, cudaStream_t stream)
{
	return launch_kernel_args(launch(name, grid, block, smem, stream, kernel), args,
				  std::index_sequence_for<P...>{});
}

} /* namespace kvt_cuemu */

#endif /* KVT_TESTS_CUEMU_DEVICE_H */
