/* SPDX-License-Identifier: MIT */
/*
 * tests/cuemu/cudart_dev.cc - the emulated device's description: an H200 (132 SMs, compute
 * capability 9.0) whose global memory is the emulated HBM size (KVT_CUEMU_HBM_MIB).
 * cudaDeviceGetAttribute answers the attributes below; any other valid one is refused with
 * cudaErrorInvalidValue and a line on stderr, so a caller that needs it is noticed.
 */
#include <cstdio>
#include <cstring>

#include "cudart_int.h"

#define CUEMU_NAME "kvtier cuemu (CPU emulation of an H200)"
#define CUEMU_SMEM_BLOCK (48 * 1024)      /* default shared memory per block */
#define CUEMU_SMEM_OPTIN (227 * 1024)     /* opt-in shared memory per block */
#define CUEMU_SMEM_SM (228 * 1024)        /* shared memory per SM */
#define CUEMU_L2 (50 * 1024 * 1024)       /* L2 cache bytes */

/* one attribute's value */
struct cuemu_attr {
	cudaDeviceAttr a; /* attribute */
	int v;            /* value */
};

static const cuemu_attr cuemu_attrs[] = {
	{ cudaDevAttrMaxThreadsPerBlock, 1024 },
	{ cudaDevAttrMaxBlockDimX, 1024 },
	{ cudaDevAttrMaxBlockDimY, 1024 },
	{ cudaDevAttrMaxBlockDimZ, 64 },
	{ cudaDevAttrMaxGridDimX, 2147483647 },
	{ cudaDevAttrMaxGridDimY, 65535 },
	{ cudaDevAttrMaxGridDimZ, 65535 },
	{ cudaDevAttrMaxSharedMemoryPerBlock, CUEMU_SMEM_BLOCK },
	{ cudaDevAttrTotalConstantMemory, 65536 },
	{ cudaDevAttrWarpSize, 32 },
	{ cudaDevAttrMaxPitch, 2147483647 },
	{ cudaDevAttrMaxRegistersPerBlock, 65536 },
	{ cudaDevAttrClockRate, 1980000 },
	{ cudaDevAttrTextureAlignment, 512 },
	{ cudaDevAttrGpuOverlap, 1 },
	{ cudaDevAttrMultiProcessorCount, 132 },
	{ cudaDevAttrKernelExecTimeout, 0 },
	{ cudaDevAttrIntegrated, 0 },
	{ cudaDevAttrCanMapHostMemory, 1 },
	{ cudaDevAttrComputeMode, 0 },
	{ cudaDevAttrConcurrentKernels, 1 },
	{ cudaDevAttrEccEnabled, 1 },
	{ cudaDevAttrPciBusId, 0 },
	{ cudaDevAttrPciDeviceId, 0 },
	{ cudaDevAttrPciDomainId, 0 },
	{ cudaDevAttrTccDriver, 0 },
	{ cudaDevAttrMemoryClockRate, 2619000 },
	{ cudaDevAttrGlobalMemoryBusWidth, 6144 },
	{ cudaDevAttrL2CacheSize, CUEMU_L2 },
	{ cudaDevAttrMaxThreadsPerMultiProcessor, 2048 },
	{ cudaDevAttrAsyncEngineCount, 3 },
	{ cudaDevAttrUnifiedAddressing, 1 },
	{ cudaDevAttrComputeCapabilityMajor, 9 },
	{ cudaDevAttrComputeCapabilityMinor, 0 },
	{ cudaDevAttrStreamPrioritiesSupported, 1 },
	{ cudaDevAttrGlobalL1CacheSupported, 1 },
	{ cudaDevAttrLocalL1CacheSupported, 1 },
	{ cudaDevAttrMaxSharedMemoryPerMultiprocessor, CUEMU_SMEM_SM },
	{ cudaDevAttrMaxRegistersPerMultiprocessor, 65536 },
	{ cudaDevAttrManagedMemory, 1 },
	{ cudaDevAttrIsMultiGpuBoard, 0 },
	{ cudaDevAttrMultiGpuBoardGroupID, 0 },
	{ cudaDevAttrHostNativeAtomicSupported, 0 },
	{ cudaDevAttrPageableMemoryAccess, 0 },
	{ cudaDevAttrConcurrentManagedAccess, 1 },
	{ cudaDevAttrComputePreemptionSupported, 1 },
	{ cudaDevAttrCanUseHostPointerForRegisteredMem, 1 },
	{ cudaDevAttrCooperativeLaunch, 1 },
	{ cudaDevAttrMaxSharedMemoryPerBlockOptin, CUEMU_SMEM_OPTIN },
	{ cudaDevAttrHostRegisterSupported, 1 },
	{ cudaDevAttrPageableMemoryAccessUsesHostPageTables, 0 },
	{ cudaDevAttrDirectManagedMemAccessFromHost, 0 },
	{ cudaDevAttrMaxBlocksPerMultiprocessor, 32 },
	{ cudaDevAttrReservedSharedMemoryPerBlock, 1024 },
	{ cudaDevAttrMemoryPoolsSupported, 1 },
	{ cudaDevAttrClusterLaunch, 1 },
	{ cudaDevAttrNumaConfig, 0 },
	{ cudaDevAttrNumaId, -1 },
	{ cudaDevAttrHostNumaId, -1 },
	{ cudaDevAttrMpsEnabled, 0 },
};

/** cudaDeviceGetAttribute() - one attribute of device 0 (an H200); see the table above. */
cudaError_t
cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
	cudaError_t e = cuemu_enter("cudaDeviceGetAttribute", CUEMU_DEV);

	if (e == cudaSuccess && device != 0)
		e = cudaErrorInvalidDevice;
	if (e == cudaSuccess && value == nullptr)
		e = cudaErrorInvalidValue;
	if (e != cudaSuccess)
		return cuemu_ret(e);
	for (const cuemu_attr &a : cuemu_attrs) {
		if (a.a == attr) {
			*value = a.v;
			return cudaSuccess;
		}
	}
	fprintf(stderr, "cuemu: cudaDeviceGetAttribute: attribute %d is not emulated\n",
		(int)attr);
	return cuemu_ret(cudaErrorInvalidValue);
}

/** cudaGetDeviceProperties() - device 0's description (an H200, memory = the HBM size). */
cudaError_t
cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
	cudaError_t e = cuemu_enter("cudaGetDeviceProperties", CUEMU_DEV);

	if (e == cudaSuccess && device != 0)
		e = cudaErrorInvalidDevice;
	if (e == cudaSuccess && prop == nullptr)
		e = cudaErrorInvalidValue;
	if (e != cudaSuccess)
		return cuemu_ret(e);
	cudaDeviceProp &p = *prop;

	memset(prop, 0, sizeof *prop);
	snprintf(p.name, sizeof p.name, "%s", CUEMU_NAME);
	memcpy(p.uuid.bytes, "kvtier-cuemu-h2", sizeof p.uuid.bytes);
	p.totalGlobalMem = cuemu_hbm_bytes();
	p.sharedMemPerBlock = CUEMU_SMEM_BLOCK;
	p.regsPerBlock = 65536;
	p.warpSize = 32;
	p.memPitch = 2147483647;
	p.maxThreadsPerBlock = 1024;
	p.maxThreadsDim[0] = 1024;
	p.maxThreadsDim[1] = 1024;
	p.maxThreadsDim[2] = 64;
	p.maxGridSize[0] = 2147483647;
	p.maxGridSize[1] = 65535;
	p.maxGridSize[2] = 65535;
	p.totalConstMem = 65536;
	p.major = 9;
	p.minor = 0;
	p.textureAlignment = 512;
	p.texturePitchAlignment = 32;
	p.multiProcessorCount = 132;
	p.canMapHostMemory = 1;
	p.concurrentKernels = 1;
	p.ECCEnabled = 1;
	p.asyncEngineCount = 3;
	p.unifiedAddressing = 1;
	p.memoryBusWidth = 6144;
	p.l2CacheSize = CUEMU_L2;
	p.maxThreadsPerMultiProcessor = 2048;
	p.streamPrioritiesSupported = 1;
	p.globalL1CacheSupported = 1;
	p.localL1CacheSupported = 1;
	p.sharedMemPerMultiprocessor = CUEMU_SMEM_SM;
	p.regsPerMultiprocessor = 65536;
	p.managedMemory = 1;
	p.concurrentManagedAccess = 1;
	p.computePreemptionSupported = 1;
	p.canUseHostPointerForRegisteredMem = 1;
	p.cooperativeLaunch = 1;
	p.sharedMemPerBlockOptin = CUEMU_SMEM_OPTIN;
	p.maxBlocksPerMultiProcessor = 32;
	p.reservedSharedMemPerBlock = 1024;
	p.hostRegisterSupported = 1;
	p.memoryPoolsSupported = 1;
	p.clusterLaunch = 1;
	p.deviceNumaId = -1;
	p.hostNumaId = -1;
	return cudaSuccess;
}
