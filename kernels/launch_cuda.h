/* SPDX-License-Identifier: MIT */
/*
 * kernels/launch_cuda.h - the check that ends the kernel launchers (internal; included by the
 * kernels/ .cu files only, after error.h).
 */
#ifndef KVT_KERNELS_LAUNCH_CUDA_H
#define KVT_KERNELS_LAUNCH_CUDA_H

#include <cuda_runtime.h>

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
