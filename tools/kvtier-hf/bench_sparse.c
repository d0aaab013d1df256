/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-hf/bench_sparse.c - `kvtier-hf --bench-sparse`: the sparse decode target of
 * issue 17 on the DeepSeek-V3.2 fixture (hf.h kvhf_bench_sparse). One sequence decodes at a
 * context of 16 x index_topk positions, three ways, in one process:
 *   (a) resident  every block in HBM (the default tiers: no copies),
 *   (b) HBM 25%   HBM holds floor(blocks / 4) of the sequence's LATENT blocks at the end (at
 *                 least 2), the rest in HOST: every block a layer's selection reads that is
 *                 not in HBM is promoted by its prepare (the indexer keys are read from the
 *                 engine's mirror: no block comes up to score),
 *   (c) pf step   as (b), the blocks of each step's selections hinted for the next step
 *                 after its commit (kvhf_opts.dsa_prefetch 1: the previous selection as the
 *                 predictor),
 *   (d) pf layer  as (b), each layer's previous-step blocks hinted one layer ahead (when the
 *                 layer before it has prepared its own; dsa_prefetch 2).
 * Per run the mean wall time of the decode steps (kvhf_opts.pos_s of the positions after the
 * context), the median over --repeat rounds (a to d interleaved), the ratio to (a); the
 * greedy tokens of (b) to (d) must be (a)'s. The engine's counters (HOST -> HBM blocks per
 * position, stalls, coverage: accesses found ready) are the whole run's, context included.
 * The emulated device copies at --bandwidth (default memcpy / 4, as --bench-decode); the
 * runner's kernels are the CPU references. The load average is printed before and after:
 * the machine may be shared, the figures are only as quiet as it was.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf.h"
#include "util.h"

#define BS_RUNS KVHF_SPARSE_RUNS

static const char *const bs_names[BS_RUNS] = { "(a) resident", "(b) HBM 25%",
					       "(c) pf step", "(d) pf layer" };

/* /proc/loadavg's first three fields into @out (or "?"). */
static void
bs_loadavg(char *out, size_t len)
{
	FILE *f = fopen("/proc/loadavg", "r");
	double a = 0, b = 0, c = 0;

	if (f && fscanf(f, "%lf %lf %lf", &a, &b, &c) == 3)
		snprintf(out, len, "%.2f %.2f %.2f", a, b, c);
	else
		snprintf(out, len, "?");
	if (f)
		fclose(f);
}

static int
bs_cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* The median of @v[0..n) (sorted in place). */
static double
bs_median(double *v, uint32_t n)
{
	qsort(v, n, sizeof(*v), bs_cmp);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

int
kvhf_bench_sparse(const struct kvhf_opts *base, const int32_t *path, uint32_t n_path,
		  uint32_t gen, uint32_t repeat, uint64_t bandwidth, FILE *out,
		  struct kvhf_sparse_bench *res)
{
	const struct kvhf_model *m = base->model;
	struct kvhf_sparse_bench b;
	struct kvhf_groups gs;
	uint32_t C, P, tpb = base->tokens_per_block;
	int32_t *prompt = NULL, *tokens = NULL;
	double *pos_s = NULL, *ms = NULL, bw;
	uint64_t blk;
	char la0[64], la1[64];
	int rc = 0;

	memset(&b, 0, sizeof(b));
	if (!m || !m->dsa || !path || !n_path || !gen || !repeat || tpb < 1)
		return kvtr_err(-EINVAL, "--bench-sparse: a deepseek_v32 model, a token path, "
				">= 1 decode step and >= 1 repeat");
	C = 16 * (uint32_t)m->index_topk;
	P = C + gen;
	if (P > (uint32_t)m->max_pos)
		return kvtr_err(-EINVAL, "--bench-sparse: a context of %u + %u steps exceeds "
				"max_position_embeddings %d", C, gen, m->max_pos);
	rc = kvhf_model_groups(m, &gs);
	if (rc)
		return rc;
	blk = kvhf_group_kv_bytes(&gs, tpb, 1, NULL); /* one LATENT block with its keys */
	kvhf_groups_free(&gs);
	b.context = C;
	b.gen = gen;
	b.blocks = (P + tpb - 1) / tpb;
	bw = bandwidth ? (double)bandwidth : kvhf_memcpy_bw() / 4.0;
	prompt = calloc(C, sizeof(int32_t));
	tokens = calloc(P, sizeof(int32_t));
	pos_s = calloc(P, sizeof(double));
	ms = calloc((size_t)BS_RUNS * repeat, sizeof(double));
	if (!prompt || !tokens || !pos_s || !ms) {
		rc = kvtr_err(-ENOMEM, "out of memory");
		goto out;
	}
	for (uint32_t i = 0; i < C; i++)
		prompt[i] = path[i % n_path];
	bs_loadavg(la0, sizeof(la0));
	fprintf(out, "kvtier-hf --bench-sparse: %s, top-%d, context %u positions (16 x top-k), "
		"%u decode steps, %u tokens/block (%u blocks of %llu bytes at the end), emulated "
		"copy bandwidth %.3f GB/s%s%s, median of %u; loadavg %s\n", m->model_type,
		m->index_topk, C, gen, tpb, b.blocks, (unsigned long long)blk, bw / 1e9,
		bandwidth ? "" : " (memcpy / 4)",
		base->emu_lazy ? " on lazy streams (--emu-lazy: each copy's memcpy runs on the "
				 "decoding thread)" : "", repeat, la0);
	for (uint32_t k = 0; k < repeat && rc == 0; k++) {
		for (int i = 0; i < BS_RUNS && rc == 0; i++) {
			struct kvhf_opts o = *base;
			struct kvhf_result r;
			double sum = 0.0;

			o.prompt = prompt;
			o.n_prompt = C;
			o.gen = gen;
			o.pos_s = pos_s;
			o.emu_copy_bytes_per_s = (uint64_t)bw;
			o.hbm_frac = o.host_frac = 0.0f;
			o.hbm_bytes = 0;
			o.dsa_prefetch = i >= 2 ? i - 1 : 0;
			if (i > 0) { /* at most 25% of the blocks in HBM, the rest in HOST */
				uint64_t slots = b.blocks / 4 > 2 ? b.blocks / 4 : 2;

				o.hbm_bytes = slots * blk;
			}
			rc = kvhf_run(&o, &r);
			if (rc) {
				fprintf(stderr, "kvtier-hf: %s: %s\n", bs_names[i],
					kvtr_last_error());
				kvhf_result_free(&r);
				break;
			}
			for (uint32_t p = C; p < P; p++)
				sum += pos_s[p];
			ms[(size_t)i * repeat + k] = sum * 1e3 / gen;
			if (i == 0 && k == 0) {
				memcpy(tokens, r.tokens, (size_t)P * sizeof(int32_t));
			} else if (memcmp(tokens, r.tokens, (size_t)P * sizeof(int32_t))) {
				rc = kvtr_err(-EPROTO, "--bench-sparse: %s (round %u) decoded "
					      "other tokens than (a)", bs_names[i], k + 1);
			}
			if (i > 0) {
				b.hbm_slots = r.geo.hbm_slots;
				if ((uint64_t)b.hbm_slots * 4 > b.blocks && b.blocks >= 8)
					rc = kvtr_err(-EPROTO, "--bench-sparse: HBM got %u "
						      "slots, more than 25%% of %u blocks",
						      b.hbm_slots, b.blocks);
			}
			b.h2d[i] = r.stats.blocks_moved[KVT_MOVE_HOST_TO_HBM];
			b.stalls[i] = r.stats.stalls;
			b.accesses[i] = r.stats.accesses;
			b.ready[i] = r.stats.accesses_ready;
			b.hinted[i] = r.dsa_hinted;
			kvhf_result_free(&r);
		}
	}
	if (rc)
		goto out;
	for (int i = 0; i < BS_RUNS; i++)
		b.step_ms[i] = bs_median(ms + (size_t)i * repeat, repeat);
	bs_loadavg(la1, sizeof(la1));
	fprintf(out, "HBM of (b) to (d): %u slots of the %u blocks (%.1f%%), the rest in HOST\n",
		b.hbm_slots, b.blocks, 100.0 * b.hbm_slots / b.blocks);
	fprintf(out, "%-14s %10s %8s %10s %10s %8s %10s\n", "run", "step_ms", "vs_(a)", "h2d/pos",
		"hinted/pos", "stalls", "coverage");
	for (int i = 0; i < BS_RUNS; i++)
		fprintf(out, "%-14s %10.4f %8.3f %10.2f %10.2f %8llu %9.2f%%\n", bs_names[i],
			b.step_ms[i], b.step_ms[0] > 0 ? b.step_ms[i] / b.step_ms[0] : 0.0,
			(double)b.h2d[i] / P, (double)b.hinted[i] / P,
			(unsigned long long)b.stalls[i],
			b.accesses[i] ? 100.0 * (double)b.ready[i] / (double)b.accesses[i] : 100.0);
	fprintf(out, "greedy tokens of all runs identical: yes; loadavg after %s\n", la1);
	if (res)
		*res = b;
out:
	free(prompt);
	free(tokens);
	free(pos_s);
	free(ms);
	return rc;
}
