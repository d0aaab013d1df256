/* SPDX-License-Identifier: MIT */
/* kvtier-bench: the modes' entry points. */
#ifndef KVTIER_BENCH_H
#define KVTIER_BENCH_H

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

#endif
