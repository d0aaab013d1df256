/* SPDX-License-Identifier: MIT */
/* tools/gpu-bench/util.c - helpers shared by the modes (see gb.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gb.h"
#include "util.h"

#ifdef KVT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

static int
gb_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

double
gb_median(double *v, size_t n)
{
	if (!n)
		return 0.0;
	qsort(v, n, sizeof *v, gb_cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void
gb_result(const char *name, double value, const char *unit, double ratio, double target,
	  int higher_is_better)
{
	const char *verdict = "INFO";

	if (target > 0.0)
		verdict = (higher_is_better ? ratio >= target : ratio <= target) ? "PASS" : "FAIL";
	printf("RESULT %s %.4g %s %.3f %.2f %s\n", name, value, unit, ratio, target, verdict);
	fflush(stdout);
}

int
gb_opt_u64(int argc, char **argv, int *i, const char *key, uint64_t *out)
{
	if (strcmp(argv[*i], key))
		return 0;
	if (*i + 1 >= argc) {
		fprintf(stderr, "gpu-bench: %s needs a value\n", key);
		exit(2);
	}
	if (kvtr_parse_u64(key, argv[*i + 1], 0, UINT64_MAX, out)) {
		fprintf(stderr, "gpu-bench: %s\n", kvtr_last_error());
		exit(2);
	}
	(*i)++;
	return 1;
}

int
gb_fail(const char *what, int cuda_err)
{
#ifdef KVT_WITH_CUDA
	fprintf(stderr, "gpu-bench: %s: %s (%s)\n", what,
		cudaGetErrorString((cudaError_t)cuda_err), cudaGetErrorName((cudaError_t)cuda_err));
#else
	fprintf(stderr, "gpu-bench: %s (error %d)\n", what, cuda_err);
#endif
	return 1;
}
