/* SPDX-License-Identifier: MIT */
/*
 * tests/cuemu/exec_selftest.cu - the self-test kernels of exec_selftest.h (compiled as C++ with
 * device.h force-included, like kernels/ *.cu in a KVT_CUDA_EMU build).
 */
#include "exec_selftest.h"

/* per thread: idx, up 3 in 8-lane segments, down 5 in 16, xor 6, ballot, all/any, a partial
 * mask, a double */
__global__ void
st_warp_kernel(int *out)
{
	const int t = (int)(blockIdx.x * blockDim.x + threadIdx.x), lane = (int)threadIdx.x & 31;
	int *o = out + (size_t)t * 8;

	o[0] = __shfl_sync(0xffffffffu, t, (lane * 7) % 32);
	o[1] = __shfl_up_sync(0xffffffffu, t, 3, 8);
	o[2] = __shfl_down_sync(0xffffffffu, t, 5, 16);
	o[3] = __shfl_xor_sync(0xffffffffu, t, 6);
	o[4] = (int)__ballot_sync(0xffffffffu, lane % 3 == 0);
	o[5] = __all_sync(0xffffffffu, t >= 0) + 2 * __any_sync(0xffffffffu, lane == 31) +
	       4 * __all_sync(0xffffffffu, lane != 7);
	o[6] = lane < 16 ? __shfl_xor_sync(0x0000ffffu, t, 1) : -1;
	o[7] = (int)(2.0 * __shfl_sync(0xffffffffu, 0.5 * t, 31 - lane));
	__syncwarp();
}

/* out[i] = 3 * in[the block's last - i]: static and dynamic shared memory, two barriers */
__global__ void
st_reverse_kernel(const int *in, int *out)
{
	__shared__ int s[1024];
	int *d = static_cast<int *>(kvt_cuemu_dynamic_smem());
	const unsigned t = threadIdx.x, n = blockDim.x, base = blockIdx.x * n;

	s[t] = in[base + t];
	__syncthreads();
	d[t] = 2 * s[n - 1 - t];
	__syncthreads();
	out[base + t] = d[t] + s[n - 1 - t];
}

__global__ void
st_exit_early_kernel(int *out)
{
	if (threadIdx.x == 5)
		return;
	__syncthreads();
	out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

__global__ void
st_mask_kernel(int *out)
{
	const unsigned m = threadIdx.x == 3 ? 0x7fffffffu : 0xffffffffu;

	out[blockIdx.x * blockDim.x + threadIdx.x] = __shfl_xor_sync(m, (int)threadIdx.x, 1);
}

__global__ void
st_deadlock_kernel(int *out)
{
	if (threadIdx.x & 1)
		__syncthreads();
	else
		out[blockIdx.x * blockDim.x + threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
}

/* breaks the warp or barrier rule @rule (KVT_CUEMU_ST_OWN_LANE...), then writes its result */
__global__ void
st_rule_kernel(int *out, int rule)
{
	const unsigned t = threadIdx.x, lane = t & 31u;
	int v = (int)t;

	switch (rule) {
	case KVT_CUEMU_ST_OWN_LANE:
		v = __shfl_sync(~(1u << 2), v, 0);
		break;
	case KVT_CUEMU_ST_NO_LANE:
		v = __shfl_xor_sync(0xffffffffu, v, 1);
		break;
	case KVT_CUEMU_ST_RETURNED:
		if (lane == 0)
			return;
		v = __shfl_sync(0xffffffffu, v, 1);
		break;
	case KVT_CUEMU_ST_LEAVE_WARP:
		if (lane == 1)
			return;
		v = __shfl_sync(0xffffffffu, v, 1);
		break;
	case KVT_CUEMU_ST_WIDTH:
		v = __shfl_sync(0xffffffffu, v, 0, 3);
		break;
	case KVT_CUEMU_ST_OUTSIDE:
		if (lane >= 16)
			return;
		v = __shfl_sync(0x0000ffffu, v, 20);
		break;
	default: /* KVT_CUEMU_ST_SYNC_EXITED */
		if (t == 0)
			return;
		__syncthreads();
		break;
	}
	out[blockIdx.x * blockDim.x + t] = v;
}

__global__ void
st_touch_kernel(int *p)
{
	p[threadIdx.x] = 1;
}

__global__ void
st_smem_kernel(int *out)
{
	out[threadIdx.x] = kvt_cuemu_dynamic_smem() ? 2 : 1;
}

/** kvt_cuemu_selftest() - see exec_selftest.h. */
extern "C" cudaError_t
kvt_cuemu_selftest(int which, unsigned grid, unsigned block, size_t smem, void *a, void *b,
		   cudaStream_t s)
{
	int *ia = static_cast<int *>(a), *ib = static_cast<int *>(b);

#define ST_LAUNCH(kernel, ...) kvt_cuemu::launch(#kernel, grid, block, smem, s, kernel)(__VA_ARGS__)
	switch (which) {
	case KVT_CUEMU_ST_WARP:
		return ST_LAUNCH(st_warp_kernel, ia);
	case KVT_CUEMU_ST_REVERSE:
		return ST_LAUNCH(st_reverse_kernel, ia, ib);
	case KVT_CUEMU_ST_EXIT_EARLY:
		return ST_LAUNCH(st_exit_early_kernel, ia);
	case KVT_CUEMU_ST_MASK:
		return ST_LAUNCH(st_mask_kernel, ia);
	case KVT_CUEMU_ST_DEADLOCK:
		return ST_LAUNCH(st_deadlock_kernel, ia);
	case KVT_CUEMU_ST_SMEM:
		return ST_LAUNCH(st_smem_kernel, ia);
	case KVT_CUEMU_ST_OWN_LANE:
	case KVT_CUEMU_ST_NO_LANE:
	case KVT_CUEMU_ST_RETURNED:
	case KVT_CUEMU_ST_LEAVE_WARP:
	case KVT_CUEMU_ST_WIDTH:
	case KVT_CUEMU_ST_OUTSIDE:
	case KVT_CUEMU_ST_SYNC_EXITED:
		return ST_LAUNCH(st_rule_kernel, ia, which);
	default:
		return ST_LAUNCH(st_touch_kernel, ia);
	}
#undef ST_LAUNCH
}
