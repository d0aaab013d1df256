/* SPDX-License-Identifier: MIT */
/* tools/kvtier-replay/out.h - output of kvtier-replay (table, CSV, JSON, plot, progress). */
#ifndef KVT_REPLAY_OUT_H
#define KVT_REPLAY_OUT_H

#include <stddef.h>
#include <stdio.h>

#include "replay.h"

/* A table of @n results, one line each; @block_bytes converts blocks moved to GiB. */
void rp_print_table(FILE *f, const struct rp_result *r, size_t n, uint64_t block_bytes);
/* CSV / JSON files of the same results (bytes moved per direction). 0 or -1 (message). */
int rp_write_csv(const char *path, const struct rp_result *r, size_t n, uint64_t block_bytes);
int rp_write_json(const char *path, const struct rp_result *r, size_t n, uint64_t block_bytes);
/* PNG of hit ratio vs capacity, one line per policy, through a generated gnuplot script
 * (@ratio is [n_caps][n_pols]); x ticks at the sweep's capacities @caps. With @tiered (the
 * tiered run's ratio per policy, at @tiers[0] + [1] + [2] blocks; NULL = none) one point per
 * policy at that total. Writes PNG.dat and PNG.gp beside @png; on success prints "plot written
 * to PNG" on stdout. -1 with a clear message when gnuplot is absent or fails. */
int rp_plot(const char *png, const char *trace, const uint64_t *caps, size_t n_caps,
	    const char *const *pols, size_t n_pols, const double *ratio,
	    const uint64_t tiers[RP_TIERS], const double *tiered);
/* Progress bar on stderr, only when it is a terminal. */
void rp_progress(uint64_t done, uint64_t total);

/* Multi-node runs (multi.c): one line per result; the budget table compares each budgeted
 * run @b[i] with its unbudgeted twin @base[i] (writes saved, hits lost); --json of the runs,
 * @run[i] naming each ("alone", "shared", "budget"). 0 or -1 (message). */
void rp_print_multi(FILE *f, const struct rp_multi_result *r, size_t n);
void rp_print_budget(FILE *f, const struct rp_multi_result *base, const struct rp_multi_result *b,
		     size_t n);
int rp_write_multi_json(const char *path, const struct rp_multi_result *r,
			const char *const *run, size_t n);

#endif /* KVT_REPLAY_OUT_H */
