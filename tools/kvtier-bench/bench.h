/* SPDX-License-Identifier: MIT */
/* kvtier-bench: the modes' entry points. */
#ifndef KVTIER_BENCH_H
#define KVTIER_BENCH_H

#include <stdint.h>

struct kvtb_mode {
	const char *name;                    /* argv[1] that selects the mode */
	int (*main)(int argc, char **argv);  /* argv[0] is the mode name; returns the exit code */
	const char *summary;                 /* one line for the usage text */
};

/* one declaration per mode, each defined in tools/kvtier-bench/<mode>.c */
int kvtb_nvme_main(int argc, char **argv);
int kvtb_decode_main(int argc, char **argv); /* decode.c: prefetch coverage and step time */
int kvtb_lock_main(int argc, char **argv); /* lock.c: resident prepare p99 while others load */
int kvtb_remote_main(int argc, char **argv); /* remote.c: Redis client vs redis-benchmark */
int kvtb_ext_main(int argc, char **argv); /* ext.c: external-pool mode vs memcpy, lookup */

/* The median of @v[0..n) (sorted in place; the mean of the middle two for even n; 0 for n 0). */
double kvtb_median(double *v, uint32_t n);
/* qsort comparator of doubles, ascending. */
int kvtb_cmp_double(const void *a, const void *b);

#endif
