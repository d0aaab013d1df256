/* SPDX-License-Identifier: MIT */
/*
 * tools/gpu-bench/gb.h - shared pieces of gpu-bench, the GPU benchmarks that tools/gpu-check
 * runs (copy bandwidth, attention bandwidth, oversubscribed decode). CUDA builds only; without
 * KVT_WITH_CUDA every mode prints that and exits 77.
 *
 * Output: human-readable lines, plus one machine-readable line per figure:
 *   RESULT <name> <value> <unit> <ratio> <target-ratio> <PASS|FAIL|INFO>
 * (ratio = value against the reference measured in the same run; INFO = no target).
 */
#ifndef GB_H
#define GB_H

#include <stddef.h>
#include <stdint.h>

/** One mode: entry point and summary. */
struct gb_mode {
	const char *name;                  /* argv[1] */
	int (*main)(int argc, char **argv); /* argv[0] is the mode name */
	const char *summary;               /* one line for --help */
};

int gb_copy_main(int argc, char **argv);   /* copy.c */
int gb_attn_main(int argc, char **argv);   /* attn.c */
int gb_decode_main(int argc, char **argv); /* decode.c */
int gb_probe_main(int argc, char **argv);  /* main.c: device, driver and runtime versions */

/** Median of n doubles (sorts @v in place); 0 for n == 0. */
double gb_median(double *v, size_t n);

/** Print one RESULT line (see above) and the human line before it. */
void gb_result(const char *name, double value, const char *unit, double ratio, double target,
	       int higher_is_better);

/** Parse "--key value" options of decimal integers (kvtr_parse_u64): returns 1 when argv[*i]
 * was @key (value in *out); a missing or malformed value exits with status 2. */
int gb_opt_u64(int argc, char **argv, int *i, const char *key, uint64_t *out);

/** Print "gpu-bench: <what>: <cuda message>" to stderr; returns 1 (the exit status). */
int gb_fail(const char *what, int cuda_err);

#endif /* GB_H */
