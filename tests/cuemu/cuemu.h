/* SPDX-License-Identifier: MIT */
/*
 * tests/cuemu/cuemu.h - the CUDA-on-CPU emulation (KVT_CUDA_EMU builds only; test
 * infrastructure, never part of a real build).
 *
 * A KVT_CUDA_EMU build compiles the library's CUDA code unchanged in logic -
 * transfer/device_cuda.c against the CUDA runtime API, kernels/ *.cu as C++ by the host
 * compiler - and links it against this emulation instead of libcudart, so the CUDA backend,
 * the kernels and the GPU tests run on a machine without a GPU:
 *   - tests/cuemu/cudart.cc: the CUDA runtime API functions kvtier and its tests call (memory,
 *     streams as in-order worker threads, events, cudaStreamWaitEvent, cudaMemcpyBatchAsync,
 *     errors, device attributes of an H200), with fault injection for the error paths.
 *   - tests/cuemu/exec.cc + device.h: the kernel side. A launch is queued on its stream; the
 *     stream's worker runs the grid block by block, the threads of a block as fibers, with
 *     __syncthreads and warp shuffles as real rendezvous points.
 * It checks logic (indexing, ordering, error paths), not speed or the GPU's memory model;
 * results of a run under it say "emulated", never "on a GPU".
 *
 * This header is the contract between the two halves; it is includable from C and C++.
 */
#ifndef KVT_TESTS_CUEMU_H
#define KVT_TESTS_CUEMU_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/** A unit of stream work: run(ctx) in stream order on the stream's worker thread. */
typedef void (*kvt_cuemu_fn)(void *ctx);

/**
 * kvt_cuemu_enqueue() - queue @run(@ctx) on stream @s (NULL: the legacy default stream), in
 * order with the copies, memsets and event records queued there. @drop(@ctx), when not NULL,
 * is called once after @run returned, or instead of it if the work is discarded. Destroying
 * the stream with the work pending is legal, as in CUDA: it still runs. Discarded are: every
 * operation not yet started when a kernel fault makes an error sticky (whenever it was
 * queued), and what is still queued at process exit.
 * Returns cudaSuccess; cudaErrorInvalidValue (@run NULL), cudaErrorCudartUnloading (the
 * runtime was shut down at process exit, whatever @s) or cudaErrorInvalidResourceHandle
 * (unknown stream), @drop then being called at once. Thread-safe. Provided by cudart.cc.
 */
cudaError_t kvt_cuemu_enqueue(cudaStream_t s, kvt_cuemu_fn run, kvt_cuemu_fn drop, void *ctx);

/**
 * kvt_cuemu_set_error() - record @e as the calling thread's last CUDA error (what the next
 * cudaGetLastError()/cudaPeekAtLastError() returns), as a failed launch does. cudaSuccess and
 * cudaErrorNotReady are not errors: they are ignored and leave a pending error in place, as
 * every runtime call of the emulation does. Thread-safe.
 */
void kvt_cuemu_set_error(cudaError_t e);

/**
 * kvt_cuemu_kernel_fault() - called on a stream worker when a running kernel did something
 * that is an error on a GPU (a thread left while others wait at __syncthreads, a shuffle with
 * lanes missing, a launch-time shape the device refuses...): prints "cuemu: kernel fault:
 * <msg>" to stderr and makes cudaErrorLaunchFailure the sticky error of the context, returned
 * by every later synchronising call, as a real device fault does. Thread-safe.
 */
void kvt_cuemu_kernel_fault(const char *msg);

/**
 * kvt_cuemu_fail() - fault injection for tests: the calls number @after+1 .. @after+@count
 * (counted from now) of the runtime function named @api (e.g. "cudaMemcpyBatchAsync",
 * "cudaMalloc", "launch" for kernel launches) fail with @err instead of running. @count 0
 * clears the rule of @api. Returns 0, or -1 for an unknown @api name. Thread-safe.
 */
int kvt_cuemu_fail(const char *api, cudaError_t err, unsigned after, unsigned count);

/** kvt_cuemu_reset() - clear every fault rule and the sticky error (tests, between cases). */
void kvt_cuemu_reset(void);

/**
 * kvt_cuemu_fail_check() - the start of a runtime call named @api that cudart.cc does not
 * implement itself ("launch": a kernel launch by the kernel half's shim). Counts the call for
 * kvt_cuemu_fail() and returns the error it must fail with: an injected one, else
 * cudaErrorNoDevice (KVT_CUEMU_DEVICES=0), cudaErrorCudartUnloading (process exit) or the
 * sticky cudaErrorLaunchFailure; cudaSuccess if it may run. A failure is also recorded as the
 * thread's last error. Thread-safe. Provided by cudart.cc.
 */
cudaError_t kvt_cuemu_fail_check(const char *api);

/**
 * kvt_cuemu_addressable() - 1 if [@p, @p + @len) (@len 0: the byte at @p) lies inside one live
 * allocation a kernel may touch: cudaMalloc memory, or pinned (cudaHostAlloc/cudaMallocHost)
 * or registered (cudaHostRegister) host memory, which under UVA is a device pointer too; 0
 * otherwise (pageable host memory, freed memory, past an allocation's end). Thread-safe.
 * Provided by cudart_mem.cc.
 */
int kvt_cuemu_addressable(const void *p, size_t len);

/**
 * kvt_cuemu_last_fault() - copy the message of the latest kvt_cuemu_kernel_fault() (empty if
 * none yet; kvt_cuemu_reset() keeps it) into @buf of @len bytes, truncated to fit. For tests.
 * Thread-safe. Provided by cudart.cc.
 */
void kvt_cuemu_last_fault(char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* KVT_TESTS_CUEMU_H */
