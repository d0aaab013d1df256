/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-replay/out.c - results as a table, CSV, JSON (cJSON) and a gnuplot PNG.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "out.h"

static double
rp_ratio(uint64_t a, uint64_t b)
{
	return b ? (double)a / (double)b : 0.0;
}

void
rp_print_table(FILE *f, const struct rp_result *r, size_t n, uint64_t block_bytes)
{
	size_t i;

	fprintf(f, "%-6s %8s %8s %8s %8s %8s %8s %8s %9s %9s %9s %9s %12s\n", "policy", "hbm",
		"host", "nvme", "hit%", "tok-hit%", "hbm%", "host%", "nvme%", "evict", "GiB-down",
		"GiB-up", "saved-tok");
	for (i = 0; i < n; i++) {
		const struct rp_result *x = &r[i];
		double gib = (double)block_bytes / (1024.0 * 1024 * 1024);

		fprintf(f, "%-6s %8llu %8llu %8llu %8.2f %8.2f %8.2f %8.2f %9.2f %9llu %9.1f %9.1f "
			"%12llu\n", x->policy, (unsigned long long)x->cap[0],
			(unsigned long long)x->cap[1], (unsigned long long)x->cap[2],
			100 * rp_ratio(rp_hits(x), x->refs),
			100 * rp_ratio(rp_hit_tokens(x), x->tokens),
			100 * rp_ratio(x->hit_blocks[0], x->refs),
			100 * rp_ratio(x->hit_blocks[1], x->refs),
			100 * rp_ratio(x->hit_blocks[2], x->refs),
			(unsigned long long)(x->evictions[0] + x->evictions[1] + x->evictions[2]),
			(double)(x->moved_blocks[0] + x->moved_blocks[1]) * gib,
			(double)(x->moved_blocks[2] + x->moved_blocks[3]) * gib,
			(unsigned long long)rp_hit_tokens(x));
	}
}

static const char *const rp_move_names[4] = { "hbm_to_host", "host_to_nvme", "nvme_to_host",
					      "host_to_hbm" };
static const char *const rp_tier_names[RP_TIERS] = { "hbm", "host", "nvme" };

int
rp_write_csv(const char *path, const struct rp_result *r, size_t n, uint64_t block_bytes)
{
	FILE *f = fopen(path, "w");
	size_t i;
	int t;

	if (!f) {
		fprintf(stderr, "kvtier-replay: cannot write --csv %s: %s\n", path,
			strerror(errno));
		return -1;
	}
	fprintf(f, "mode,policy,cap_hbm,cap_host,cap_nvme,refs,tokens,hit_blocks,hit_ratio,"
		"hit_tokens,token_hit_ratio");
	for (t = 0; t < RP_TIERS; t++)
		fprintf(f, ",hit_blocks_%s,hit_tokens_%s,evictions_%s", rp_tier_names[t],
			rp_tier_names[t], rp_tier_names[t]);
	for (t = 0; t < 4; t++)
		fprintf(f, ",bytes_%s", rp_move_names[t]);
	fprintf(f, ",prefill_tokens_saved\n");
	for (i = 0; i < n; i++) {
		const struct rp_result *x = &r[i];

		fprintf(f, "%s,%s,%llu,%llu,%llu,%llu,%llu,%llu,%.6f,%llu,%.6f",
			x->tiered ? "tiers" : "single", x->policy,
			(unsigned long long)x->cap[0], (unsigned long long)x->cap[1],
			(unsigned long long)x->cap[2], (unsigned long long)x->refs,
			(unsigned long long)x->tokens, (unsigned long long)rp_hits(x),
			rp_ratio(rp_hits(x), x->refs), (unsigned long long)rp_hit_tokens(x),
			rp_ratio(rp_hit_tokens(x), x->tokens));
		for (t = 0; t < RP_TIERS; t++)
			fprintf(f, ",%llu,%llu,%llu", (unsigned long long)x->hit_blocks[t],
				(unsigned long long)x->hit_tokens[t],
				(unsigned long long)x->evictions[t]);
		for (t = 0; t < 4; t++)
			fprintf(f, ",%llu", (unsigned long long)(x->moved_blocks[t] * block_bytes));
		fprintf(f, ",%llu\n", (unsigned long long)rp_hit_tokens(x));
	}
	return fclose(f) ? -1 : 0;
}

int
rp_write_json(const char *path, const struct rp_result *r, size_t n, uint64_t block_bytes)
{
	cJSON *arr = cJSON_CreateArray();
	char *txt;
	FILE *f;
	size_t i;
	int t, rc = -1;

	for (i = 0; arr && i < n; i++) {
		const struct rp_result *x = &r[i];
		cJSON *o = cJSON_CreateObject(), *tiers = cJSON_CreateArray(), *mv;

		cJSON_AddItemToArray(arr, o);
		cJSON_AddStringToObject(o, "policy", x->policy);
		cJSON_AddStringToObject(o, "mode", x->tiered ? "tiers" : "single");
		cJSON_AddNumberToObject(o, "refs", (double)x->refs);
		cJSON_AddNumberToObject(o, "tokens", (double)x->tokens);
		cJSON_AddNumberToObject(o, "hit_ratio", rp_ratio(rp_hits(x), x->refs));
		cJSON_AddNumberToObject(o, "token_hit_ratio", rp_ratio(rp_hit_tokens(x), x->tokens));
		cJSON_AddNumberToObject(o, "prefill_tokens_saved", (double)rp_hit_tokens(x));
		cJSON_AddItemToObject(o, "tiers", tiers);
		for (t = 0; t < RP_TIERS; t++) {
			cJSON *to = cJSON_CreateObject();

			cJSON_AddItemToArray(tiers, to);
			cJSON_AddStringToObject(to, "tier", rp_tier_names[t]);
			cJSON_AddNumberToObject(to, "capacity_blocks", (double)x->cap[t]);
			cJSON_AddNumberToObject(to, "hit_blocks", (double)x->hit_blocks[t]);
			cJSON_AddNumberToObject(to, "hit_tokens", (double)x->hit_tokens[t]);
			cJSON_AddNumberToObject(to, "evictions", (double)x->evictions[t]);
		}
		mv = cJSON_CreateObject();
		cJSON_AddItemToObject(o, "bytes_moved", mv);
		for (t = 0; t < 4; t++)
			cJSON_AddNumberToObject(mv, rp_move_names[t],
						(double)(x->moved_blocks[t] * block_bytes));
	}
	txt = arr ? cJSON_Print(arr) : NULL;
	f = txt ? fopen(path, "w") : NULL;
	if (f) {
		fputs(txt, f);
		fputc('\n', f);
		rc = fclose(f) ? -1 : 0;
	} else if (txt) {
		fprintf(stderr, "kvtier-replay: cannot write --json %s: %s\n", path,
			strerror(errno));
	}
	free(txt);
	cJSON_Delete(arr);
	return rc;
}

/* --plot @png could not be written: its helper file @file names why; returns -1. */
static int
rp_plot_fail(const char *png, const char *file)
{
	fprintf(stderr, "kvtier-replay: cannot write --plot %s (its data file %s): %s\n", png,
		file, strerror(errno));
	return -1;
}

int
rp_plot(const char *png, const char *trace, const uint64_t *caps, size_t n_caps,
	const char *const *pols, size_t n_pols, const double *ratio,
	const uint64_t tiers[RP_TIERS], const double *tiered)
{
	char dat[4096], gp[4096], cmd[8400];
	uint64_t total = tiers[0] + tiers[1] + tiers[2];
	const char *base;
	FILE *f;
	size_t c, p;
	int rc;

	if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
		fprintf(stderr, "kvtier-replay: gnuplot not found: no plot written (install gnuplot, "
			"or plot the CSV yourself)\n");
		return -1;
	}
	snprintf(dat, sizeof dat, "%s.dat", png);
	snprintf(gp, sizeof gp, "%s.gp", png);
	if (!(f = fopen(dat, "w")))
		return rp_plot_fail(png, dat);
	fprintf(f, "# capacity_blocks");
	for (p = 0; p < n_pols; p++)
		fprintf(f, " %s", pols[p]);
	fprintf(f, "\n");
	for (c = 0; c < n_caps; c++) {
		fprintf(f, "%llu", (unsigned long long)caps[c]);
		for (p = 0; p < n_pols; p++)
			fprintf(f, " %.6f", 100 * ratio[c * n_pols + p]);
		fprintf(f, "\n");
	}
	if (tiered) { /* gnuplot's index 1: the tiered run, at the tiers' total */
		fprintf(f, "\n\n# tiered: HBM %llu + HOST %llu + NVME %llu blocks\n%llu",
			(unsigned long long)tiers[0], (unsigned long long)tiers[1],
			(unsigned long long)tiers[2], (unsigned long long)total);
		for (p = 0; p < n_pols; p++)
			fprintf(f, " %.6f", 100 * tiered[p]);
		fprintf(f, "\n");
	}
	fclose(f);
	if (!(f = fopen(gp, "w")))
		return rp_plot_fail(png, gp);
	base = strrchr(trace, '/');
	fprintf(f, "set terminal pngcairo noenhanced size 900,600\nset output '%s'\n", png);
	fprintf(f, "set title 'prefix-hit ratio vs capacity: %s'\n", base ? base + 1 : trace);
	fprintf(f, "set logscale x 2\nset xlabel 'cache capacity (blocks)'\n"
		"set ylabel 'prefix-hit ratio (%% of block references)'\nset key right bottom\n"
		"set grid\nset xtics (");
	/* ticks where the points are: the sweep's capacities (and the tiered run's total) */
	for (c = 0; c < n_caps; c++)
		fprintf(f, "%s'%llu' %llu", c ? ", " : "", (unsigned long long)caps[c],
			(unsigned long long)caps[c]);
	if (tiered)
		fprintf(f, "%s'%llu' %llu", n_caps ? ", " : "", (unsigned long long)total,
			(unsigned long long)total);
	fprintf(f, ") rotate by -30\nset offsets graph 0.03, graph 0.03, 0, 0\nplot ");
	for (p = 0; p < n_pols; p++)
		fprintf(f, "%s'%s' index 0 using 1:%zu with linespoints lc %zu pt 7 title '%s'",
			p ? ", " : "", dat, p + 2, p + 1, pols[p]);
	for (p = 0; tiered && p < n_pols; p++)
		fprintf(f, ", '%s' index 1 using 1:%zu with points lc %zu pt 5 ps 2 "
			"title '%s tiered: HBM %llu + HOST %llu + NVME %llu'", dat, p + 2, p + 1,
			pols[p], (unsigned long long)tiers[0], (unsigned long long)tiers[1],
			(unsigned long long)tiers[2]);
	fprintf(f, "\n");
	fclose(f);
	snprintf(cmd, sizeof cmd, "gnuplot '%s'", gp);
	rc = system(cmd);
	if (rc != 0) {
		fprintf(stderr, "kvtier-replay: gnuplot failed (%d); script %s kept\n", rc, gp);
		return -1;
	}
	printf("plot written to %s\n", png);
	return 0;
}

void
rp_progress(uint64_t done, uint64_t total)
{
	int w = 40, k;

	if (!isatty(STDERR_FILENO) || total == 0)
		return;
	k = (int)(done * (uint64_t)w / total);
	fprintf(stderr, "\r[");
	for (int i = 0; i < w; i++)
		fputc(i < k ? '=' : ' ', stderr);
	fprintf(stderr, "] %3d%%", (int)(done * 100 / total));
	if (done == total)
		fprintf(stderr, "\r%*s\r", w + 30, "");
}

/* ---- multi-node runs (multi.c) */

static void
rp_remote_name(char *buf, size_t cap, uint64_t remote_cap)
{
	if (!remote_cap)
		snprintf(buf, cap, "none");
	else if (remote_cap == RP_UNBOUNDED)
		snprintf(buf, cap, "unbounded");
	else
		snprintf(buf, cap, "%llu", (unsigned long long)remote_cap);
}

void
rp_print_multi(FILE *f, const struct rp_multi_result *r, size_t n)
{
	double gib = 1.0 / (1024.0 * 1024 * 1024);
	char rem[32];
	size_t i;

	fprintf(f, "%-6s %5s %10s %7s %8s %7s %7s %8s %9s %9s %9s %8s\n", "policy", "nodes",
		"remote", "hit%", "tok-hit%", "local%", "remote%", "cross", "put-GiB", "get-GiB",
		"nvme-GiB", "r-evict");
	for (i = 0; i < n; i++) {
		const struct rp_multi_result *x = &r[i];
		uint64_t bb = x->o.block_bytes, local = x->hit_blocks[0] + x->hit_blocks[1] +
							    x->hit_blocks[2];

		rp_remote_name(rem, sizeof rem, x->o.remote_cap);
		fprintf(f, "%-6s %5u %10s %7.2f %8.2f %7.2f %7.2f %8llu %9.1f %9.1f %9.1f %8llu\n",
			x->policy, x->o.nodes, rem, 100 * rp_ratio(rp_multi_hits(x), x->refs),
			100 * rp_ratio(rp_multi_hit_tokens(x), x->tokens),
			100 * rp_ratio(local, x->refs),
			100 * rp_ratio(x->hit_blocks[RP_REMOTE], x->refs),
			(unsigned long long)x->cross_hits,
			(double)x->puts * (double)bb * gib, (double)x->gets * (double)bb * gib,
			(double)x->nvme_writes * (double)bb * gib,
			(unsigned long long)x->remote_evictions);
	}
}

void
rp_print_budget(FILE *f, const struct rp_multi_result *base, const struct rp_multi_result *b,
		size_t n)
{
	double gib = 1.0 / (1024.0 * 1024 * 1024);
	size_t i;

	fprintf(f, "%-6s %5s %9s %9s %9s %9s %9s %9s %10s %9s %9s\n", "policy", "nodes",
		"nvme-GiB", "budgeted", "put-GiB", "budgeted", "saved-GiB", "saved%", "hits-lost",
		"hit%-lost", "tok%-lost");
	for (i = 0; i < n; i++) {
		const struct rp_multi_result *x = &base[i], *y = &b[i];
		double bb = (double)x->o.block_bytes;
		uint64_t wx = x->nvme_writes + x->puts, wy = y->nvme_writes + y->puts;
		int64_t lost = (int64_t)rp_multi_hits(x) - (int64_t)rp_multi_hits(y);
		int64_t tlost = (int64_t)rp_multi_hit_tokens(x) - (int64_t)rp_multi_hit_tokens(y);

		fprintf(f, "%-6s %5u %9.1f %9.1f %9.1f %9.1f %9.1f %9.2f %10lld %9.2f %9.2f\n",
			x->policy, x->o.nodes, (double)x->nvme_writes * bb * gib,
			(double)y->nvme_writes * bb * gib, (double)x->puts * bb * gib,
			(double)y->puts * bb * gib, ((double)wx - (double)wy) * bb * gib,
			wx ? 100.0 * ((double)wx - (double)wy) / (double)wx : 0.0, (long long)lost,
			x->refs ? 100.0 * (double)lost / (double)x->refs : 0.0,
			x->tokens ? 100.0 * (double)tlost / (double)x->tokens : 0.0);
	}
}

int
rp_write_multi_json(const char *path, const struct rp_multi_result *r,
		    const char *const *run, size_t n)
{
	static const char *const tier[RP_TIERS + 1] = { "hbm", "host", "nvme", "remote" };
	cJSON *arr = cJSON_CreateArray();
	char *txt, rem[32];
	FILE *f;
	size_t i;
	int t, rc = -1;

	for (i = 0; arr && i < n; i++) {
		const struct rp_multi_result *x = &r[i];
		double bb = (double)x->o.block_bytes;
		cJSON *o = cJSON_CreateObject(), *h = cJSON_CreateObject();

		cJSON_AddItemToArray(arr, o);
		cJSON_AddStringToObject(o, "run", run[i]);
		cJSON_AddStringToObject(o, "policy", x->policy);
		cJSON_AddNumberToObject(o, "nodes", x->o.nodes);
		cJSON_AddStringToObject(o, "split", x->o.split == RP_SPLIT_REQUEST ? "request" :
										   "conversation");
		rp_remote_name(rem, sizeof rem, x->o.remote_cap);
		cJSON_AddStringToObject(o, "remote_capacity_blocks", rem);
		cJSON_AddNumberToObject(o, "cap_hbm", (double)x->o.cap[0]);
		cJSON_AddNumberToObject(o, "cap_host", (double)x->o.cap[1]);
		cJSON_AddNumberToObject(o, "cap_nvme", (double)x->o.cap[2]);
		cJSON_AddNumberToObject(o, "block_bytes", bb);
		cJSON_AddNumberToObject(o, "write_budget_nvme_bytes_per_s", (double)x->o.budget[0]);
		cJSON_AddNumberToObject(o, "write_budget_remote_bytes_per_s", (double)x->o.budget[1]);
		cJSON_AddNumberToObject(o, "write_budget_period_ms",
					(double)(x->o.period_ms ? x->o.period_ms : 1000));
		cJSON_AddStringToObject(o, "admit", x->o.admit == RP_ADMIT_SEEN_TWICE ? "seen-twice" :
										       "all");
		cJSON_AddNumberToObject(o, "refs", (double)x->refs);
		cJSON_AddNumberToObject(o, "tokens", (double)x->tokens);
		cJSON_AddNumberToObject(o, "hit_ratio", rp_ratio(rp_multi_hits(x), x->refs));
		cJSON_AddNumberToObject(o, "token_hit_ratio",
					rp_ratio(rp_multi_hit_tokens(x), x->tokens));
		cJSON_AddItemToObject(o, "hit_blocks", h);
		for (t = 0; t <= RP_TIERS; t++)
			cJSON_AddNumberToObject(h, tier[t], (double)x->hit_blocks[t]);
		h = cJSON_CreateObject();
		cJSON_AddItemToObject(o, "hit_tokens", h);
		for (t = 0; t <= RP_TIERS; t++)
			cJSON_AddNumberToObject(h, tier[t], (double)x->hit_tokens[t]);
		cJSON_AddNumberToObject(o, "cross_node_hits", (double)x->cross_hits);
		cJSON_AddNumberToObject(o, "remote_puts", (double)x->puts);
		cJSON_AddNumberToObject(o, "remote_gets", (double)x->gets);
		cJSON_AddNumberToObject(o, "network_put_bytes", (double)x->puts * bb);
		cJSON_AddNumberToObject(o, "network_get_bytes", (double)x->gets * bb);
		cJSON_AddNumberToObject(o, "remote_refused", (double)x->remote_refused);
		cJSON_AddNumberToObject(o, "remote_evictions", (double)x->remote_evictions);
		cJSON_AddNumberToObject(o, "nvme_writes", (double)x->nvme_writes);
		cJSON_AddNumberToObject(o, "nvme_write_bytes", (double)x->nvme_writes * bb);
		cJSON_AddNumberToObject(o, "nvme_refused", (double)x->nvme_refused);
	}
	txt = arr ? cJSON_Print(arr) : NULL;
	f = txt ? fopen(path, "w") : NULL;
	if (f) {
		fputs(txt, f);
		fputc('\n', f);
		rc = fclose(f) ? -1 : 0;
	} else if (txt) {
		fprintf(stderr, "kvtier-replay: cannot write --json %s: %s\n", path,
			strerror(errno));
	}
	free(txt);
	cJSON_Delete(arr);
	return rc;
}
