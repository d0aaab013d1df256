/* SPDX-License-Identifier: MIT */
/*
 * gpu-bench: the GPU benchmarks of kvtier (run by tools/gpu-check on a machine with a GPU).
 *
 *   gpu-bench probe                 device, driver and runtime versions (exit 77: no GPU)
 *   gpu-bench copy   [options]      batched H2D/D2H block copies vs one large cudaMemcpy
 *   gpu-bench attn   [options]      paged decode attention bandwidth vs a D2D copy
 *   gpu-bench decode [options]      decode step time: all-resident vs 4x oversubscribed
 *
 * Each mode prints human lines and RESULT lines (see gb.h). Built without CUDA: exit 77.
 */
#include <stdio.h>
#include <string.h>

#include "gb.h"

#ifdef KVT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

static const struct gb_mode gb_modes[] = {
	{ "probe", gb_probe_main, "device, driver and runtime versions (exit 77: no GPU)" },
	{ "copy", gb_copy_main, "batched H2D/D2H block copies vs one large cudaMemcpy" },
	{ "attn", gb_attn_main, "paged decode attention bandwidth vs a device-to-device copy" },
	{ "decode", gb_decode_main, "decode step: all-resident vs 4x oversubscribed + prefetch" },
	{ NULL, NULL, NULL },
};

int
gb_probe_main(int argc, char **argv)
{
#ifdef KVT_WITH_CUDA
	struct cudaDeviceProp p;
	int drv = 0, rt = 0, n = 0;
	cudaError_t e;

	(void)argc;
	(void)argv;
	cudaDriverGetVersion(&drv);
	cudaRuntimeGetVersion(&rt);
	printf("CUDA driver API %d.%d, runtime %d.%d (this build)\n", drv / 1000, drv % 1000 / 10,
	       rt / 1000, rt % 1000 / 10);
	e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n == 0) {
		printf("no usable GPU: %s (%s)%s\n", e ? cudaGetErrorString(e) : "0 devices",
		       e ? cudaGetErrorName(e) : "", drv && drv < rt ?
		       " -- the driver is older than the runtime this was built with" : "");
		return 77;
	}
	e = cudaGetDeviceProperties(&p, 0);
	if (e != cudaSuccess)
		return gb_fail("cudaGetDeviceProperties", e);
	printf("device 0 of %d: %s, sm_%d%d, %d SMs, %.1f GiB, L2 %.0f MiB\n", n, p.name, p.major,
	       p.minor, p.multiProcessorCount, (double)p.totalGlobalMem / (1u << 30),
	       (double)p.l2CacheSize / (1u << 20));
	return 0;
#else
	(void)argc;
	(void)argv;
	printf("gpu-bench: built without CUDA\n");
	return 77;
#endif
}

static void
gb_usage(FILE *f)
{
	fprintf(f, "usage: gpu-bench <mode> [options]   (gpu-bench <mode> --help)\nmodes:\n");
	for (const struct gb_mode *m = gb_modes; m->name; m++)
		fprintf(f, "  %-7s %s\n", m->name, m->summary);
}

int
main(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		gb_usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	for (const struct gb_mode *m = gb_modes; m->name; m++)
		if (!strcmp(argv[1], m->name))
			return m->main(argc - 1, argv + 1);
	fprintf(stderr, "gpu-bench: unknown mode '%s'\n", argv[1]);
	gb_usage(stderr);
	return 2;
}
