/* SPDX-License-Identifier: MIT */
/*
 * tests/cuemu/cudart_dev.cc - the emulated CUDA runtime's fault injection, error names, and
 * device: one H200 (132 SMs, compute capability 9.0) whose global memory is the emulated HBM
 * size (KVT_CUEMU_HBM_MIB), runtime and driver version 13000. cudaDeviceGetAttribute answers
 * the attributes of its table; any other valid one is refused with cudaErrorInvalidValue and
 * a line on stderr, so a caller that needs it is noticed.
 */
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cudart_int.h"

#define CUEMU_NAME "kvtier cuemu (CPU emulation of an H200)"
#define CUEMU_SMEM_BLOCK (48 * 1024)      /* default shared memory per block */
#define CUEMU_SMEM_OPTIN (227 * 1024)     /* opt-in shared memory per block */
#define CUEMU_SMEM_SM (228 * 1024)        /* shared memory per SM */
#define CUEMU_L2 (50 * 1024 * 1024)       /* L2 cache bytes */
#define CUEMU_VERSION 13000               /* driver and runtime version reported */

static thread_local int cuemu_cur_dev;   /* the thread's current device */

/* ------------------------------------------------------------------------------------------ */
/* fault injection                                                                              */

/* every name kvt_cuemu_fail() accepts; "launch" is the kernel half's */
static const char *const cuemu_api_names[] = {
	"cudaDeviceGetAttribute", "cudaDeviceSynchronize", "cudaDriverGetVersion",
	"cudaEventCreate", "cudaEventCreateWithFlags", "cudaEventDestroy", "cudaEventElapsedTime",
	"cudaEventQuery", "cudaEventRecord", "cudaEventSynchronize", "cudaFree", "cudaFreeHost",
	"cudaGetDevice", "cudaGetDeviceCount", "cudaGetDeviceProperties", "cudaHostAlloc",
	"cudaHostRegister", "cudaHostUnregister", "cudaLaunchKernel", "cudaMalloc",
	"cudaMallocHost", "cudaMemGetInfo", "cudaMemcpy", "cudaMemcpyAsync",
	"cudaMemcpyBatchAsync", "cudaMemset", "cudaMemsetAsync", "cudaPointerGetAttributes",
	"cudaRuntimeGetVersion", "cudaSetDevice", "cudaStreamCreate", "cudaStreamCreateWithFlags",
	"cudaStreamDestroy", "cudaStreamQuery", "cudaStreamSynchronize", "cudaStreamWaitEvent",
	"launch",
};
#define CUEMU_NAPI (sizeof cuemu_api_names / sizeof cuemu_api_names[0])

/* one kvt_cuemu_fail() rule */
struct cuemu_rule {
	cudaError_t err; /* what the failing calls return */
	unsigned after;  /* calls that still succeed */
	unsigned count;  /* calls that fail after those; 0: no rule */
	unsigned calls;  /* calls counted since the rule was set */
};

static std::mutex cuemu_rule_mu;                 /* guards cuemu_rules */
static cuemu_rule cuemu_rules[CUEMU_NAPI];       /* by index in cuemu_api_names */
static std::atomic<int> cuemu_nrules{ 0 };       /* rules set (fast path: none) */

static int
cuemu_api_index(const char *api)
{
	for (size_t i = 0; api != nullptr && i < CUEMU_NAPI; i++)
		if (strcmp(api, cuemu_api_names[i]) == 0)
			return (int)i;
	return -1;
}

cudaError_t
cuemu_injected(const char *api)
{
	if (cuemu_nrules.load() == 0)
		return cudaSuccess;
	int i = cuemu_api_index(api);
	std::lock_guard<std::mutex> lk(cuemu_rule_mu);
	if (i < 0 || cuemu_rules[i].count == 0)
		return cudaSuccess;
	cuemu_rule &r = cuemu_rules[i];
	unsigned n = ++r.calls;
	return n > r.after && n - r.after <= r.count ? r.err : cudaSuccess;
}

int
kvt_cuemu_fail(const char *api, cudaError_t err, unsigned after, unsigned count)
{
	int i = cuemu_api_index(api);

	if (i < 0)
		return -1;
	std::lock_guard<std::mutex> lk(cuemu_rule_mu);
	if (cuemu_rules[i].count != 0)
		cuemu_nrules--;
	cuemu_rules[i] = cuemu_rule{ err, after, count, 0 };
	if (count != 0)
		cuemu_nrules++;
	return 0;
}

void
cuemu_rules_clear(void)
{
	std::lock_guard<std::mutex> lk(cuemu_rule_mu);

	for (cuemu_rule &r : cuemu_rules)
		r = cuemu_rule{ cudaSuccess, 0, 0, 0 };
	cuemu_nrules = 0;
}

/* ------------------------------------------------------------------------------------------ */
/* errors                                                                                       */

/* a cudaError_t's name and message as libcudart has them */
struct cuemu_errname {
	cudaError_t e;   /* the code */
	const char *nm;  /* cudaGetErrorName */
	const char *msg; /* cudaGetErrorString */
};

#define CUEMU_E(code, msg) { code, #code, msg }
static const cuemu_errname cuemu_errnames[] = {
	CUEMU_E(cudaSuccess, "no error"),
	CUEMU_E(cudaErrorInvalidValue, "invalid argument"),
	CUEMU_E(cudaErrorMemoryAllocation, "out of memory"),
	CUEMU_E(cudaErrorInitializationError, "initialization error"),
	CUEMU_E(cudaErrorCudartUnloading, "driver shutting down"),
	CUEMU_E(cudaErrorInvalidConfiguration, "invalid configuration argument"),
	CUEMU_E(cudaErrorInvalidPitchValue, "invalid pitch argument"),
	CUEMU_E(cudaErrorInvalidSymbol, "invalid device symbol"),
	CUEMU_E(cudaErrorInvalidHostPointer, "invalid host pointer"),
	CUEMU_E(cudaErrorInvalidDevicePointer, "invalid device pointer"),
	CUEMU_E(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy"),
	CUEMU_E(cudaErrorInsufficientDriver,
		"CUDA driver version is insufficient for CUDA runtime version"),
	CUEMU_E(cudaErrorMissingConfiguration, "__global__ function call is not configured"),
	CUEMU_E(cudaErrorInvalidDeviceFunction, "invalid device function"),
	CUEMU_E(cudaErrorNoDevice, "no CUDA-capable device is detected"),
	CUEMU_E(cudaErrorInvalidDevice, "invalid device ordinal"),
	CUEMU_E(cudaErrorInvalidKernelImage, "device kernel image is invalid"),
	CUEMU_E(cudaErrorNoKernelImageForDevice,
		"no kernel image is available for execution on the device"),
	CUEMU_E(cudaErrorInvalidResourceHandle, "invalid resource handle"),
	CUEMU_E(cudaErrorIllegalState, "the operation cannot be performed in the present state"),
	CUEMU_E(cudaErrorSymbolNotFound, "named symbol not found"),
	CUEMU_E(cudaErrorNotReady, "device not ready"),
	CUEMU_E(cudaErrorIllegalAddress, "an illegal memory access was encountered"),
	CUEMU_E(cudaErrorLaunchOutOfResources, "too many resources requested for launch"),
	CUEMU_E(cudaErrorLaunchTimeout, "the launch timed out and was terminated"),
	CUEMU_E(cudaErrorAssert, "device-side assert triggered"),
	CUEMU_E(cudaErrorHostMemoryAlreadyRegistered,
		"part or all of the requested memory range is already mapped"),
	CUEMU_E(cudaErrorHostMemoryNotRegistered,
		"pointer does not correspond to a registered memory region"),
	CUEMU_E(cudaErrorHardwareStackError, "hardware stack error"),
	CUEMU_E(cudaErrorIllegalInstruction, "an illegal instruction was encountered"),
	CUEMU_E(cudaErrorMisalignedAddress, "misaligned address"),
	CUEMU_E(cudaErrorInvalidAddressSpace,
		"operation not supported on global/shared address space"),
	CUEMU_E(cudaErrorInvalidPc, "invalid program counter"),
	CUEMU_E(cudaErrorLaunchFailure, "unspecified launch failure"),
	CUEMU_E(cudaErrorCooperativeLaunchTooLarge, "too many blocks in cooperative launch"),
	CUEMU_E(cudaErrorNotPermitted, "operation not permitted"),
	CUEMU_E(cudaErrorNotSupported, "operation not supported"),
	CUEMU_E(cudaErrorTimeout, "wait operation timed out"),
	CUEMU_E(cudaErrorUnknown, "unknown error"),
};
#undef CUEMU_E

static const cuemu_errname *
cuemu_errname_of(cudaError_t e)
{
	for (const cuemu_errname &n : cuemu_errnames)
		if (n.e == e)
			return &n;
	return nullptr;
}

/** cudaGetErrorName() - the enum name of @error, or "unrecognized error code". */
const char *
cudaGetErrorName(cudaError_t error)
{
	const cuemu_errname *n = cuemu_errname_of(error);

	return n != nullptr ? n->nm : "unrecognized error code";
}

/** cudaGetErrorString() - libcudart's message for @error, or "unrecognized error code". */
const char *
cudaGetErrorString(cudaError_t error)
{
	const cuemu_errname *n = cuemu_errname_of(error);

	return n != nullptr ? n->msg : "unrecognized error code";
}

int
cuemu_ndev(void)
{
	const char *v = getenv("KVT_CUEMU_DEVICES");

	return v != nullptr && strcmp(v, "0") == 0 ? 0 : 1;
}

size_t
cuemu_hbm_bytes(void)
{
	const char *v = getenv("KVT_CUEMU_HBM_MIB");
	char *end = nullptr;
	unsigned long long mib = v != nullptr ? strtoull(v, &end, 10) : 0;

	if (v == nullptr || end == v || *end != '\0' || mib == 0 || mib > (1ull << 30))
		mib = 8192;
	return (size_t)mib << 20;
}

/* ------------------------------------------------------------------------------------------ */
/* device                                                                                       */

/** cudaLaunchKernel() - refused: kernels launch through the kernel half's shim (device.h). */
cudaError_t
cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
		 cudaStream_t stream)
{
	cudaError_t e = cuemu_enter("cudaLaunchKernel", CUEMU_STICKY);

	(void)func, (void)gridDim, (void)blockDim, (void)args, (void)sharedMem, (void)stream;
	return cuemu_ret(e != cudaSuccess ? e : cudaErrorNotSupported);
}

/** cudaGetDeviceCount() - 1 (0 and cudaErrorNoDevice under KVT_CUEMU_DEVICES=0). */
cudaError_t
cudaGetDeviceCount(int *count)
{
	cudaError_t e = cuemu_enter("cudaGetDeviceCount", CUEMU_NONE);

	if (e == cudaSuccess && count == nullptr)
		e = cudaErrorInvalidValue;
	if (e != cudaSuccess)
		return cuemu_ret(e);
	*count = cuemu_ndev();
	return cuemu_ret(*count == 0 ? cudaErrorNoDevice : cudaSuccess);
}

/* cudaErrorInvalidDevice unless @device is 0. */
static cudaError_t
cuemu_check_dev(int device)
{
	return device == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}

/** cudaSetDevice() - make @device (0 only) current on this thread. */
cudaError_t
cudaSetDevice(int device)
{
	cudaError_t e = cuemu_enter("cudaSetDevice", CUEMU_DEV);

	if (e == cudaSuccess)
		e = cuemu_check_dev(device);
	if (e == cudaSuccess)
		cuemu_cur_dev = device;
	return cuemu_ret(e);
}

/* The body of the int queries: *@out = @v after cuemu_enter(@api, @need), NULL refused. */
static cudaError_t
cuemu_put_int(const char *api, cuemu_need need, int *out, int v)
{
	cudaError_t e = cuemu_enter(api, need);

	if (e == cudaSuccess && out == nullptr)
		e = cudaErrorInvalidValue;
	if (e == cudaSuccess)
		*out = v;
	return cuemu_ret(e);
}

/** cudaGetDevice() - the thread's current device. */
cudaError_t
cudaGetDevice(int *device)
{
	return cuemu_put_int("cudaGetDevice", CUEMU_DEV, device, cuemu_cur_dev);
}

/** cudaDriverGetVersion() - 13000. */
cudaError_t
cudaDriverGetVersion(int *driverVersion)
{
	return cuemu_put_int("cudaDriverGetVersion", CUEMU_NONE, driverVersion, CUEMU_VERSION);
}

/** cudaRuntimeGetVersion() - 13000. */
cudaError_t
cudaRuntimeGetVersion(int *runtimeVersion)
{
	return cuemu_put_int("cudaRuntimeGetVersion", CUEMU_NONE, runtimeVersion, CUEMU_VERSION);
}

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

	if (e == cudaSuccess)
		e = cuemu_check_dev(device);
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

	if (e == cudaSuccess)
		e = cuemu_check_dev(device);
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
