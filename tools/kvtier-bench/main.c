/* SPDX-License-Identifier: MIT */
/*
 * kvtier-bench: kvtier's benchmarks, one mode per subsystem. Each mode measures kvtier against the
 * limit measured in the same run (memcpy, fio, the copy bandwidth) and prints ratios.
 *
 *   kvtier-bench <mode> [options]     (kvtier-bench <mode> --help for a mode's options)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

static const struct kvtb_mode kvtb_modes[] = {
	/* { "name", entry, "one-line summary" }, one line per mode, sorted by name */
	{ "decode", kvtb_decode_main, "sessions 4x HBM: resident vs offloaded vs prefetch" },
	{ "ext", kvtb_ext_main, "external-pool store/load vs memcpy, lookup of a 32k prompt" },
	{ "lock", kvtb_lock_main, "prepare p99 of resident sequences while others load from NVMe" },
	{ "nvme", kvtb_nvme_main, "NVMe tier vs fio, park/resume to NVMe, codec on real K/V" },
	{ "remote", kvtb_remote_main, "REMOTE tier's Redis client vs redis-benchmark" },
	{ NULL, NULL, NULL },
};

static void
kvtb_usage(FILE *f)
{
	fprintf(f, "usage: kvtier-bench <mode> [options]\nmodes:\n");
	for (const struct kvtb_mode *m = kvtb_modes; m->name; m++)
		fprintf(f, "  %-8s %s\n", m->name, m->summary);
	fprintf(f, "Exit status of every mode: 0 done; 2 usage error (bad option or value),\n"
		   "before anything runs; 1 the run failed.\n");
}

int
main(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		kvtb_usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	for (const struct kvtb_mode *m = kvtb_modes; m->name; m++)
		if (!strcmp(argv[1], m->name))
			return m->main(argc - 1, argv + 1);
	fprintf(stderr, "kvtier-bench: unknown mode '%s'\n", argv[1]);
	kvtb_usage(stderr);
	return 2;
}

int
kvtb_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

double
kvtb_median(double *v, uint32_t n)
{
	if (!n)
		return 0;
	qsort(v, n, sizeof *v, kvtb_cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
