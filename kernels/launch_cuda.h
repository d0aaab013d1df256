/* SPDX-License-Identifier: MIT */
/*
 * kernels/launch_cuda.h - how the kernels/ .cu files launch kernels, and the check that ends
 * the launchers (internal; included by the kernels/ .cu files only, after error.h).
 *
 * The launch syntax goes through macros so that the same sources also build in a
 * KVT_CUDA_EMU build (tests/cuemu/: compiled as C++ by the host compiler, run on the CPU); in a
 * real CUDA build each macro expands to exactly what it stands for.
 */
#ifndef KVT_KERNELS_LAUNCH_CUDA_H
#define KVT_KERNELS_LAUNCH_CUDA_H

#include <cuda_runtime.h>

#ifndef KVT_CUDA_EMU
/*
 * KVT_CUDA_LAUNCH(grid, block, smem, stream, kernel)(args...) is
 * kernel<<<grid, block, smem, stream>>>(args...); the kernel comes last so that a template-id
 * with commas (attn_vec_kernel<T, 4>) needs no parentheses.
 */
#define KVT_CUDA_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
/* cudaLaunchKernel of @kernel (a __global__ function), its arguments pointed to by @args */
#define KVT_CUDA_LAUNCH_KERNEL(kernel, grid, block, args, smem, stream)                      \
	cudaLaunchKernel((const void *)kernel, grid, block, args, smem, stream)
/* the kernel's dynamic shared memory, as an array of @type */
#define KVT_EXTERN_SHARED(type, name) extern __shared__ type name[]
/* @t (uint64_t) = the GPU's global nanosecond timer */
#define KVT_GLOBALTIMER(t) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t))
#else
/* the emulation's versions (tests/cuemu/device.h, force-included) */
#define KVT_CUDA_LAUNCH(grid, block, smem, stream, ...)                                      \
	kvt_cuemu::launch(#__VA_ARGS__, grid, block, smem, stream, __VA_ARGS__)
#define KVT_CUDA_LAUNCH_KERNEL(kernel, grid, block, args, smem, stream)                      \
	kvt_cuemu::launch_kernel(#kernel, kernel, grid, block, args, smem, stream)
#define KVT_EXTERN_SHARED(type, name)                                                          \
	type *const name = static_cast<type *>(kvt_cuemu_dynamic_smem())
#define KVT_GLOBALTIMER(t) ((t) = kvt_cuemu_globaltimer())
#endif

/*
 * kvt_cuda_launched() - 0 when the kernel launch just queued on this thread succeeded, else
 * KVT_EDEVICE with "<what> kernel launch: <CUDA message> (<CUDA error name>)" recorded. Reads
 * (and so clears) the thread's last CUDA error.
 */
static inline int
kvt_cuda_launched(const char *what)
{
	cudaError_t e = cudaGetLastError();

	if (e != cudaSuccess)
		return kvt_err(KVT_EDEVICE, "%s kernel launch: %s (%s)", what,
			       cudaGetErrorString(e), cudaGetErrorName(e));
	return 0;
}

#endif /* KVT_KERNELS_LAUNCH_CUDA_H */
