/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-hf/bench.c - `kvtier-hf --bench-decode`: the decode benchmark of kvtier-bench
 * decode (tools/kvtier-bench/decode.c) on a Hugging Face model run with layer groups (issue 16
 * Targets: a 4x-oversubscribed decode of the SWA and MLA fixtures).
 *
 * Many sessions decode together in lock step (kvhf_run_multi), three ways, on the emulated
 * device with a copy bandwidth limit:
 *   (a) resident   HBM holds every session's KV (the default tiers: no copies),
 *   (b) offloaded  HBM holds 1/ratio of the KV the sessions hold at the end of (a) (per group:
 *                  each group's share of every tier is its part of that KV), the rest in HOST;
 *                  every promotion is waited for,
 *   (c) prefetch   as (b), the next session's blocks hinted while one computes.
 * Measured over the last quarter of the steps (--measure-from): step time, coverage (block
 * accesses found ready / all, stats.accesses_ready / accesses), stalls, promotions, and the
 * bound: the time the copy bandwidth alone needs for the bytes a step must move into HBM,
 * sum over groups of (distinct blocks a step touches - the group's HBM slots) x its slot
 * bytes (0 where they fit; kvhf_result.touched: every layer of a group reads the same blocks,
 * so the engine's accesses count each block once per layer and once for the append). Each run is repeated --repeat times interleaved, the fastest counts.
 * The argmax after every position of every session must be the same in the three runs.
 * Default bandwidth: the measured memcpy bandwidth / 4, as kvtier-bench decode.
 * With --emu-lazy (kvhf_opts.emu_lazy) the emulated copies run on the thread that observes
 * them, the decoding one: a line then gives the time their memcpy takes at the measured
 * memcpy rate (the bytes (c)'s measured steps moved both ways), which a GPU's copy engine
 * would not take from the host, and (c)'s ratio without it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf.h"
#include "util.h"

#define HB_RUNS 3

struct hb_probe {
	uint32_t from;               /* first measured step */
	uint32_t n_groups;
	double t_from, t_last;
	uint32_t last_step;
	struct kvt_stats s0[KVT_MAX_GROUPS + 1], s1[KVT_MAX_GROUPS + 1]; /* per group, total */
	uint64_t touched0[KVT_MAX_GROUPS], touched1[KVT_MAX_GROUPS]; /* kvhf_result.touched */
};

struct hb_run {
	const char *name;
	struct hb_probe p;
	struct kvhf_result r;
	int32_t *argmax;
};

double
kvhf_memcpy_bw(void)
{
	size_t len = 64u << 20;
	char *a = malloc(len), *b = malloc(len);
	double best = 0.0;

	if (!a || !b) {
		free(a);
		free(b);
		return 1e9;
	}
	memset(a, 1, len);
	memset(b, 2, len);
	for (int i = 0; i < 5; i++) {
		double t0 = kvtr_now(), dt;

		memcpy(i % 2 ? a : b, i % 2 ? b : a, len);
		dt = kvtr_now() - t0;
		if (dt > 0 && (double)len / dt > best)
			best = (double)len / dt;
	}
	free(a);
	free(b);
	return best;
}

static void
hb_stats(struct kvt_engine *e, uint32_t n_groups, struct kvt_stats *s)
{
	for (uint32_t g = 0; g <= n_groups; g++) {
		memset(&s[g], 0, sizeof(s[g]));
		s[g].size = sizeof(s[g]);
		if ((g < n_groups ? kvt_engine_group_stats(e, g, &s[g])
				  : kvt_engine_stats(e, &s[g])) != 0)
			memset(&s[g], 0, sizeof(s[g]));
	}
}

static void
hb_hook(void *arg, struct kvt_engine *e, uint32_t step, const struct kvhf_result *r)
{
	struct hb_probe *p = arg;
	int n = kvt_engine_n_groups(e);

	if (step + 1 < p->from)
		return;
	p->n_groups = n > 0 && n <= KVT_MAX_GROUPS ? (uint32_t)n : 0;
	if (step + 1 == p->from) {
		hb_stats(e, p->n_groups, p->s0);
		memcpy(p->touched0, r->touched, sizeof(p->touched0));
		p->t_from = kvtr_now();
	} else {
		p->t_last = kvtr_now();
		p->last_step = step;
		hb_stats(e, p->n_groups, p->s1); /* the last step's stay */
		memcpy(p->touched1, r->touched, sizeof(p->touched1));
	}
}

static double
hb_steps(const struct hb_run *x)
{
	return (double)(x->p.last_step + 1 - x->p.from);
}

static double
hb_step_ms(const struct hb_run *x)
{
	return (x->p.t_last - x->p.t_from) * 1e3 / hb_steps(x);
}

/* The copy-bandwidth bound of a measured step, ms (0 for a resident run). */
static double
hb_bound_ms(const struct hb_run *x, double bw)
{
	double ms = 0.0, n = hb_steps(x);

	for (uint32_t g = 0; g < x->p.n_groups; g++) {
		const struct kvhf_group_mem *gm = &x->r.mem[g];
		double acc = (double)(x->p.touched1[g] - x->p.touched0[g]) / n;
		double hbm = (double)x->p.s1[g].tier[KVT_TIER_HBM].slots;

		if (gm->block_bytes && acc > hbm)
			ms += (acc - hbm) * (double)gm->block_bytes / bw * 1e3;
	}
	return ms;
}

/* Bytes the measured steps of @x copied between tiers, per step, through the emulated device
 * (HOST <-> HBM, both ways, every group). */
static double
hb_copied_bytes(const struct hb_run *x)
{
	double bytes = 0.0, n = hb_steps(x);

	for (uint32_t g = 0; g < x->p.n_groups; g++) {
		const struct kvt_stats *s0 = &x->p.s0[g], *s1 = &x->p.s1[g];
		/* bytes, not blocks x block_bytes: a demotion into a shadow copies a part */
		bytes += (double)(s1->bytes_moved[KVT_MOVE_HOST_TO_HBM] -
				  s0->bytes_moved[KVT_MOVE_HOST_TO_HBM] +
				  s1->bytes_moved[KVT_MOVE_HBM_TO_HOST] -
				  s0->bytes_moved[KVT_MOVE_HBM_TO_HOST]);
	}
	return bytes / n;
}

static void
hb_print(const struct hb_run *x, double bw, double base, int offloaded)
{
	const struct kvt_stats *s0 = &x->p.s0[x->p.n_groups], *s1 = &x->p.s1[x->p.n_groups];
	double n = hb_steps(x), ms = hb_step_ms(x);
	uint64_t acc = s1->accesses - s0->accesses, ready = s1->accesses_ready - s0->accesses_ready;

	printf("%-14s %9.3f %8.2f%% %9.2f %9.1f %9.1f %9.1f %7.2f %8.2f %9.3f %7.3f\n", x->name, ms,
	       acc ? 100.0 * (double)ready / (double)acc : 100.0,
	       (double)(s1->stalls - s0->stalls) / n,
	       (double)(s1->blocks_moved[KVT_MOVE_HOST_TO_HBM] -
			s0->blocks_moved[KVT_MOVE_HOST_TO_HBM]) / n,
	       (double)(s1->blocks_moved[KVT_MOVE_HBM_TO_HOST] -
			s0->blocks_moved[KVT_MOVE_HBM_TO_HOST]) / n,
	       (double)acc / n, (double)(s1->batches - s0->batches) / n,
	       (double)(s1->repromotions - s0->repromotions) / n,
	       offloaded ? hb_bound_ms(x, bw) : 0.0, base > 0 ? ms / base : 1.0);
}

/*
 * HBM of the offloaded runs: each group's KV held at the end of (a) (@r, @kv_end bytes in all)
 * divided by @ratio, but at least 2.5 of its slots (a step reads one block and writes one: a
 * STATE group's 2 live slots, whatever the ratio; the half for the float shares); *hbm the sum,
 * @shares each group's part of it.
 */
static void
hb_offload_hbm(const struct kvhf_result *r, uint64_t kv_end, uint32_t ratio, float *shares,
	       uint64_t *hbm)
{
	double g_hbm[KVT_MAX_GROUPS] = { 0 }, sum = 0.0;

	for (uint32_t g = 0; g < r->n_groups; g++) {
		double blk = (double)r->mem[g].block_bytes;

		g_hbm[g] = (double)r->mem[g].end_slots * blk / (double)ratio;
		if (blk > 0 && g_hbm[g] < 2.5 * blk)
			g_hbm[g] = 2.5 * blk;
		sum += g_hbm[g];
	}
	(void)kv_end;
	for (uint32_t g = 0; g < r->n_groups; g++)
		shares[g] = sum > 0 ? (float)(g_hbm[g] / sum) : 0.0f;
	*hbm = (uint64_t)sum;
}

int
kvhf_bench_decode(const struct kvhf_opts *base, uint32_t ratio, uint32_t measure_from,
		  uint32_t repeat, uint64_t bandwidth, uint32_t depth)
{
	struct hb_run runs[HB_RUNS] = { { .name = "(a) resident" }, { .name = "(b) offloaded" },
					{ .name = "(c) prefetch" } };
	double mbw = kvhf_memcpy_bw(), bw = bandwidth ? (double)bandwidth : mbw / 4.0;
	uint32_t S = base->sessions, P = base->n_prompt;
	size_t na = (size_t)S * P;
	float shares[KVT_MAX_GROUPS];
	uint64_t kv_end = 0, hbm = 0;
	int rc = 0, same = 1;

	if (!measure_from)
		measure_from = P - P / 4;
	if (measure_from < 2 || measure_from >= P)
		return kvtr_err(-EINVAL, "--measure-from %u must be in [2, %u)", measure_from, P);
	printf("kvtier-hf --bench-decode: %s, %u sessions x %u positions, %u tokens/block, ratio "
	       "%u; emulated copy bandwidth %.3f GB/s%s%s; measured steps %u..%u; fastest of %u; "
	       "(c) hints %u session(s) ahead\n", base->model->model_type, S, P,
	       base->tokens_per_block, ratio, bw / 1e9, bandwidth ? "" : " (memcpy / 4)",
	       base->emu_lazy ? ", lazy emulated streams" : "", measure_from, P, repeat, depth);
	for (uint32_t k = 0; k < repeat && rc == 0; k++) {
		for (int i = 0; i < HB_RUNS && rc == 0; i++) {
			struct hb_run cur = { .name = runs[i].name };
			struct kvhf_opts o = *base;

			cur.p.from = measure_from;
			cur.argmax = calloc(na, sizeof(int32_t));
			if (!cur.argmax) {
				rc = kvtr_err(-ENOMEM, "out of memory");
				break;
			}
			o.emu_copy_bytes_per_s = (uint64_t)bw;
			if (i > 0) {
				o.hbm_bytes = hbm;
				o.host_bytes = 2 * kv_end + 2 * hbm;
				o.shares = shares;
			}
			rc = kvhf_run_multi(&o, i == 2 ? (int)depth : 0, hb_hook, &cur.p, cur.argmax, &cur.r);
			if (rc) {
				fprintf(stderr, "kvtier-hf: %s: %s\n", cur.name, kvtr_last_error());
				free(cur.argmax);
				break;
			}
			if (i == 0 && k == 0) { /* (b), (c): HBM = the KV held at the end / ratio */
				for (uint32_t g = 0; g < cur.r.n_groups; g++)
					kv_end += (uint64_t)cur.r.mem[g].end_slots *
						  cur.r.mem[g].block_bytes;
				hb_offload_hbm(&cur.r, kv_end, ratio, shares, &hbm);
				printf("KV held at the end of (a): %llu bytes in %u group(s); HBM for "
				       "(b), (c): %llu bytes\n", (unsigned long long)kv_end,
				       cur.r.n_groups, (unsigned long long)hbm);
			}
			if (k == 0 || hb_step_ms(&cur) < hb_step_ms(&runs[i])) {
				free(runs[i].argmax);
				runs[i] = cur;
			} else {
				free(cur.argmax);
			}
		}
	}
	if (rc == 0) {
		double a = hb_step_ms(&runs[0]), c = hb_step_ms(&runs[2]);
		double bound = hb_bound_ms(&runs[2], bw), floor = a > bound ? a : bound;

		printf("%-14s %9s %9s %9s %9s %9s %9s %7s %8s %9s %7s\n", "run", "step_ms",
		       "coverage", "stalls/st", "h2d/step", "d2h/step", "acc/step", "bat/st",
		       "repro/st", "bound_ms", "vs_(a)");
		for (int i = 0; i < HB_RUNS; i++)
			hb_print(&runs[i], bw, a, i > 0);
		for (int i = 1; i < HB_RUNS; i++)
			if (memcmp(runs[0].argmax, runs[i].argmax, na * sizeof(int32_t)))
				same = 0;
		printf("(c)/(a) = %.3f; copy bound %.3f ms per step vs %.3f ms of compute: "
		       "(c)/max((a), bound) = %.3f\n", c / a, bound, a, c / floor);
		if (base->emu_lazy) { /* the copies' memcpy ran on the decoding thread */
			double cp = hb_copied_bytes(&runs[2]) / mbw * 1e3;

			printf("lazy streams: the emulated copies' memcpy (%.0f bytes per step of "
			       "(c), HOST->HBM and HBM->HOST) = %.3f ms at the measured memcpy rate "
			       "(%.2f GB/s) ran on the decoding thread (a GPU's copy engine costs "
			       "the host nothing): ((c) - that)/max((a), bound) = %.3f\n",
			       hb_copied_bytes(&runs[2]), cp, mbw / 1e9, (c - cp) / floor);
		}
		printf("argmax of every position of (a), (b), (c) identical: %s\n",
		       same ? "yes" : "NO");
		if (!same)
			rc = kvtr_err(-EPROTO, "the three runs gave different argmax sequences");
	}
	for (int i = 0; i < HB_RUNS; i++)
		free(runs[i].argmax);
	return rc;
}
