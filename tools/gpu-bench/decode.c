/* SPDX-License-Identifier: MIT */
/*
 * tools/gpu-bench/decode.c - decode step time through the engine's batch API on the CUDA
 * device, all-resident vs oversubscribed (the sessions' KV is --oversub times the HBM budget).
 *
 * --seqs sequences of --tokens tokens each (KV written once, fp16, 8 KV heads x 128, 16-token
 * blocks of --layers layers) are cut into 2 x oversub groups; two groups fit in the
 * oversubscribed HBM budget. One decode step = every group once, pipelined as a server would:
 *   prepare(group g+1)  -- its promotions start on kvtier's H2D stream (prefetch)
 *   per layer l: kvt_batch_wait_layer(b_g, l, compute stream); the attention kernel of each
 *                sequence of g; a read of --weights-mib MiB (the layer's matmul weight traffic)
 *   release(b_g, compute stream)
 * Same code for both engines; only the HBM size differs. Host wall time per step (the compute
 * stream synchronised at the end of each step), warm-up step, median of --steps.
 * Also printed: the bytes promoted per step and the time the PCIe link needs for them at the
 * H2D peak measured here (a floor no prefetch can beat), and overlap = max(resident, floor) /
 * oversubscribed (1.0 = copies fully hidden behind compute, or the link saturated).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gb.h"

#ifdef KVT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "engine/kvtier.h"
#include "kernels/kernels_cuda.h"
#include "util.h"

#define GBD_H 32u
#define GBD_HKV 8u
#define GBD_D 128u
#define GBD_TPB 16u
#define GBD_TABLES 2u /* pinned staging buffers for block tables */

struct gbd_cfg {
	uint64_t seqs, tokens, layers, weights_mib, steps, oversub; /* options */
	int n_sm;                                                   /* SMs */
};

/* One engine's run. */
struct gbd {
	const struct gbd_cfg *c;   /* options */
	struct kvt_engine *e;      /* engine */
	struct kvt_geometry g;     /* its geometry */
	kvt_seq_id *ids;           /* [seqs] */
	cudaStream_t cs;           /* the "server" compute stream (from the engine) */
	void *weights;             /* device, weights_mib MiB */
	uint32_t *sink;            /* device [1024] */
	float *q, *out, *work;     /* device attention buffers */
	uint32_t *dtab;            /* device block tables of a group [seqs per group][blocks] */
	uint32_t *htab[GBD_TABLES]; /* pinned staging of those */
	cudaEvent_t tab_ev[GBD_TABLES]; /* recorded after each staging upload */
	uint32_t tab_next;         /* staging buffer to use next */
	uint32_t splits;           /* attention splits */
};

static uint64_t
gbd_block_bytes(const struct gbd_cfg *c)
{
	return (uint64_t)c->layers * 2 * GBD_TPB * GBD_HKV * GBD_D * 2;
}

static uint64_t
gbd_blocks_per_seq(const struct gbd_cfg *c)
{
	return (c->tokens + GBD_TPB - 1) / GBD_TPB;
}

static int
gbd_kvt(const char *what)
{
	fprintf(stderr, "gpu-bench decode: %s: %s\n", what, kvt_last_error_message());
	return 1;
}

/* Engine with @hbm_blocks HBM slots and room for everything in HOST. */
static int
gbd_engine(struct gbd *d, uint64_t hbm_blocks)
{
	const struct gbd_cfg *c = d->c;
	const uint64_t bb = gbd_block_bytes(c), all = c->seqs * gbd_blocks_per_seq(c);
	struct kvt_engine_opts o;
	void *st = NULL;

	kvt_engine_opts_init(&o, sizeof o);
	o.layout = (struct kvt_layout){ .n_layers = (uint32_t)c->layers, .n_kv_heads = GBD_HKV,
					.head_dim = GBD_D, .dtype = KVT_DTYPE_F16,
					.tokens_per_block = GBD_TPB };
	o.hbm_bytes = hbm_blocks * bb;
	o.host_bytes = (all + 16) * bb;
	o.device = KVT_DEVICE_CUDA;
	/* no background demotion: a resident run must stay resident, and the oversubscribed one
	 * makes room on demand (the prefetching prepare evicts the group released before) */
	o.high_watermark = 1.0f;
	o.low_watermark = 1.0f;
	if (kvt_engine_create(&o, &d->e))
		return gbd_kvt("kvt_engine_create");
	if (kvt_engine_geometry(d->e, &d->g) || kvt_engine_stream_create(d->e, &st))
		return gbd_kvt("engine geometry/stream");
	d->cs = (cudaStream_t)st;
	return 0;
}

/* Open the sequences and write their KV (device memset), one sequence at a time. */
static int
gbd_fill(struct gbd *d)
{
	const struct gbd_cfg *c = d->c;
	int64_t *map = malloc(c->tokens * sizeof *map);
	struct kvt_batch *b;
	cudaError_t e;

	if (!map)
		return gbd_kvt("no memory");
	for (uint64_t i = 0; i < c->seqs; i++) {
		if (kvt_seq_open(d->e, NULL, &d->ids[i]) ||
		    kvt_seq_append(d->e, d->ids[i], NULL, c->tokens, map))
			return free(map), gbd_kvt("open/append");
		for (uint64_t t = 0; t < c->tokens; t += GBD_TPB) {
			void *blk = (char *)d->g.hbm_base +
				    (uint64_t)(map[t] / GBD_TPB) * d->g.block_bytes;

			if ((e = cudaMemsetAsync(blk, 0x3c, d->g.block_bytes, d->cs)))
				return free(map), gb_fail("cudaMemsetAsync", e);
		}
		if (kvt_batch_prepare(d->e, &d->ids[i], 1, &b) || kvt_batch_release(b, d->cs))
			return free(map), gbd_kvt("prepare/release after the write");
	}
	free(map);
	if (kvt_engine_drain(d->e) || kvt_engine_stream_sync(d->e, d->cs))
		return gbd_kvt("drain");
	return 0;
}

/* Upload group @gi's block tables (rows of n blocks) to d->dtab on the compute stream. */
static int
gbd_tables(struct gbd *d, struct kvt_batch *b, uint64_t n_in_group)
{
	const uint64_t nb = gbd_blocks_per_seq(d->c);
	uint32_t k = d->tab_next++ % GBD_TABLES;
	struct kvt_block_table bt;
	cudaError_t e;

	if (kvt_batch_block_table(b, &bt))
		return gbd_kvt("kvt_batch_block_table");
	if ((e = cudaEventSynchronize(d->tab_ev[k]))) /* its previous upload has run */
		return gb_fail("cudaEventSynchronize", e);
	for (uint64_t i = 0; i < n_in_group; i++) {
		if (bt.indptr[i + 1] - bt.indptr[i] != nb)
			return gbd_kvt("unexpected block table row");
		memcpy(d->htab[k] + i * nb, bt.indices + bt.indptr[i], nb * sizeof(uint32_t));
	}
	if ((e = cudaMemcpyAsync(d->dtab, d->htab[k], n_in_group * nb * sizeof(uint32_t),
				 cudaMemcpyHostToDevice, d->cs)) ||
	    (e = cudaEventRecord(d->tab_ev[k], d->cs)))
		return gb_fail("block table upload", e);
	return 0;
}

/* The forward pass of one prepared group on the compute stream, then its release. */
static int
gbd_group(struct gbd *d, struct kvt_batch *b, uint64_t n_in_group)
{
	const struct gbd_cfg *c = d->c;
	const uint64_t nb = gbd_blocks_per_seq(c);

	if (gbd_tables(d, b, n_in_group))
		return 1;
	for (uint32_t l = 0; l < c->layers; l++) {
		if (kvt_batch_wait_layer(b, l, d->cs))
			return gbd_kvt("kvt_batch_wait_layer");
		for (uint64_t i = 0; i < n_in_group; i++) {
			struct kvt_paged_kv kv = {
				.k_base = (char *)d->g.hbm_base + l * d->g.layer_block_bytes,
				.v_offset = d->g.v_offset, .block_stride = d->g.block_bytes,
				.token_stride = d->g.token_bytes, .table = d->dtab + i * nb,
				.tokens_per_block = GBD_TPB, .n_kv_heads = GBD_HKV,
				.head_dim = GBD_D, .dtype = KVT_DTYPE_F16 };

			if (kvt_attn_decode_cuda(&kv, d->q, GBD_H, c->tokens, d->splits, d->work,
						 d->out, d->cs))
				return gbd_kvt("kvt_attn_decode_cuda");
		}
		if (c->weights_mib && kvt_cuda_read_bytes(d->weights, c->weights_mib << 20,
							  d->sink, c->n_sm, d->cs))
			return gbd_kvt("kvt_cuda_read_bytes");
	}
	if (kvt_batch_release(b, d->cs))
		return gbd_kvt("kvt_batch_release");
	return 0;
}

/* Steps: warm-up + c->steps measured; *ms median step time, *promoted bytes per step. */
static int
gbd_steps(struct gbd *d, double *ms, double *promoted)
{
	const struct gbd_cfg *c = d->c;
	const uint64_t groups = 2 * c->oversub, per = c->seqs / groups;
	struct kvt_stats s0 = { .size = sizeof s0 }, s1 = { .size = sizeof s1 };
	struct kvt_batch *cur = NULL, *next = NULL;
	double t[64];
	uint64_t st;

	if (kvt_batch_prepare(d->e, d->ids, per, &cur))
		return gbd_kvt("kvt_batch_prepare (first)");
	for (st = 0; st <= c->steps; st++) {
		double t0 = kvtr_now();

		if (st == 1 && kvt_engine_stats(d->e, &s0))
			return gbd_kvt("stats");
		for (uint64_t g = 0; g < groups; g++) {
			uint64_t ng = (g + 1) % groups;

			if (kvt_batch_prepare(d->e, d->ids + ng * per, per, &next))
				return gbd_kvt("kvt_batch_prepare (prefetch of the next group)");
			if (gbd_group(d, cur, per))
				return 1;
			cur = next;
		}
		if (kvt_engine_stream_sync(d->e, d->cs))
			return gbd_kvt("stream sync");
		if (st)
			t[st - 1] = (kvtr_now() - t0) * 1e3;
	}
	if (kvt_engine_stats(d->e, &s1) || kvt_batch_release(cur, d->cs) ||
	    kvt_engine_drain(d->e))
		return gbd_kvt("end of the steps");
	*ms = gb_median(t, c->steps);
	*promoted = (double)(s1.bytes_moved[KVT_MOVE_HOST_TO_HBM] -
			     s0.bytes_moved[KVT_MOVE_HOST_TO_HBM]) / (double)c->steps;
	return 0;
}

/* Device buffers of one engine run. */
static int
gbd_alloc(struct gbd *d)
{
	const struct gbd_cfg *c = d->c;
	const uint64_t per = c->seqs / (2 * c->oversub), nb = gbd_blocks_per_seq(c);
	size_t wf;
	cudaError_t e;

	d->splits = kvt_attn_cuda_splits(GBD_H, GBD_HKV, c->tokens, c->n_sm);
	wf = kvt_attn_cuda_work_floats(GBD_H, GBD_D, d->splits) + 64;
	if ((e = cudaMalloc(&d->weights, (c->weights_mib ? c->weights_mib : 1) << 20)) ||
	    (e = cudaMemset(d->weights, 0, (c->weights_mib ? c->weights_mib : 1) << 20)) ||
	    (e = cudaMalloc((void **)&d->sink, 1024 * sizeof(uint32_t))) ||
	    (e = cudaMalloc((void **)&d->q, GBD_H * GBD_D * sizeof(float))) ||
	    (e = cudaMemset(d->q, 0, GBD_H * GBD_D * sizeof(float))) ||
	    (e = cudaMalloc((void **)&d->out, GBD_H * GBD_D * sizeof(float))) ||
	    (e = cudaMalloc((void **)&d->work, wf * sizeof(float))) ||
	    (e = cudaMalloc((void **)&d->dtab, per * nb * sizeof(uint32_t))))
		return gb_fail("decode buffers", e);
	for (uint32_t k = 0; k < GBD_TABLES; k++)
		if ((e = cudaMallocHost((void **)&d->htab[k], per * nb * sizeof(uint32_t))) ||
		    (e = cudaEventCreateWithFlags(&d->tab_ev[k], cudaEventDisableTiming)))
			return gb_fail("decode staging", e);
	return cudaDeviceSynchronize() == cudaSuccess ? 0 : gb_fail("decode setup sync", 0);
}

static void
gbd_free(struct gbd *d)
{
	if (d->e && d->cs)
		kvt_engine_stream_destroy(d->e, d->cs);
	kvt_engine_destroy(d->e);
	cudaFree(d->weights);
	cudaFree(d->sink);
	cudaFree(d->q);
	cudaFree(d->out);
	cudaFree(d->work);
	cudaFree(d->dtab);
	for (uint32_t k = 0; k < GBD_TABLES; k++) {
		cudaFreeHost(d->htab[k]);
		if (d->tab_ev[k])
			cudaEventDestroy(d->tab_ev[k]);
	}
	free(d->ids);
	memset(d, 0, sizeof *d);
}

/* One engine with @hbm_blocks slots: setup, fill, steps, teardown. */
static int
gbd_run(const struct gbd_cfg *c, uint64_t hbm_blocks, double *ms, double *promoted)
{
	struct gbd d;
	int rc;

	memset(&d, 0, sizeof d);
	d.c = c;
	d.ids = calloc(c->seqs, sizeof *d.ids);
	rc = !d.ids || gbd_alloc(&d) || gbd_engine(&d, hbm_blocks) || gbd_fill(&d) ||
	     gbd_steps(&d, ms, promoted);
	gbd_free(&d);
	return rc;
}

/* H2D GB/s of one 256 MiB pinned cudaMemcpyAsync (the floor's link speed). */
static int
gbd_h2d_peak(double *gbs)
{
	const size_t n = 256u << 20;
	void *h = NULL, *g = NULL;
	cudaEvent_t e0 = NULL, e1 = NULL;
	float f = 0.0f, best = 1e30f;
	cudaError_t e;

	if ((e = cudaMallocHost(&h, n)) || (e = cudaMalloc(&g, n)) ||
	    (e = cudaEventCreate(&e0)) || (e = cudaEventCreate(&e1)))
		return gb_fail("peak setup", e);
	for (int r = 0; r < 4 && !e; r++) {
		if (!(e = cudaEventRecord(e0, 0)) &&
		    !(e = cudaMemcpyAsync(g, h, n, cudaMemcpyHostToDevice, 0)) &&
		    !(e = cudaEventRecord(e1, 0)) && !(e = cudaEventSynchronize(e1)) &&
		    !(e = cudaEventElapsedTime(&f, e0, e1)))
			best = f < best ? f : best;
	}
	cudaEventDestroy(e0);
	cudaEventDestroy(e1);
	cudaFreeHost(h);
	cudaFree(g);
	if (e)
		return gb_fail("peak copy", e);
	*gbs = (double)n / (best * 1e-3) / 1e9;
	return 0;
}

static int
gbd_report(const struct gbd_cfg *c, double res, double over, double promoted, double peak)
{
	double floor_ms = promoted / (peak * 1e9) * 1e3;
	double best = res > floor_ms ? res : floor_ms;
	char vs[64], eff[64];

	/* the shape in the names: gpu-check runs a link-bound and a compute-covered one */
	snprintf(vs, sizeof vs, "decode_oversub_vs_resident_w%llu",
		 (unsigned long long)c->weights_mib);
	snprintf(eff, sizeof eff, "decode_oversub_overlap_efficiency_w%llu",
		 (unsigned long long)c->weights_mib);

	printf("decode step, %llux oversubscribed: %.2f ms (%.2fx); promoted %.2f GiB per step\n",
	       (unsigned long long)c->oversub, over, over / res, promoted / (1u << 30));
	printf("  link floor for those bytes at %.1f GB/s H2D: %.2f ms; overlap efficiency "
	       "max(resident, floor) / oversubscribed = %.2f\n", peak, floor_ms, best / over);
	gb_result(vs, over, "ms", over / res, 1.15, 0);
	gb_result(eff, best / over, "x", best / over, 0, 1);
	return 0;
}

int
gb_decode_main(int argc, char **argv)
{
	struct gbd_cfg c = { .seqs = 32, .tokens = 4096, .layers = 8, .weights_mib = 256,
			     .steps = 3, .oversub = 4 };
	double res = 0, over = 0, pr0 = 0, promoted = 0, peak = 0;
	uint64_t all, groups;
	int n = 0;

	for (int i = 1; i < argc; i++) {
		if (gb_opt_u64(argc, argv, &i, "--seqs", &c.seqs) ||
		    gb_opt_u64(argc, argv, &i, "--tokens", &c.tokens) ||
		    gb_opt_u64(argc, argv, &i, "--layers", &c.layers) ||
		    gb_opt_u64(argc, argv, &i, "--weights-mib", &c.weights_mib) ||
		    gb_opt_u64(argc, argv, &i, "--steps", &c.steps) ||
		    gb_opt_u64(argc, argv, &i, "--oversub", &c.oversub))
			continue;
		fprintf(stderr, "usage: gpu-bench decode [--seqs 32] [--tokens 4096] [--layers 8] "
			"[--weights-mib 256] [--steps 3] [--oversub 4]\n");
		return 2;
	}
	groups = 2 * c.oversub;
	if (!c.oversub || !c.seqs || c.seqs % groups || !c.tokens || c.tokens % GBD_TPB ||
	    !c.layers || c.layers > 256 || !c.steps || c.steps > 63 || c.tokens > (1u << 20))
		return fprintf(stderr, "gpu-bench decode: --seqs a multiple of 2 x oversub, "
			       "--tokens a multiple of 16, --steps 1..63\n"), 2;
	if (cudaGetDeviceCount(&n) != cudaSuccess || !n)
		return printf("gpu-bench decode: no usable GPU\n"), 77;
	if (cudaDeviceGetAttribute(&c.n_sm, cudaDevAttrMultiProcessorCount, 0) ||
	    gbd_h2d_peak(&peak))
		return 1;
	all = c.seqs * gbd_blocks_per_seq(&c);
	printf("decode: %llu seqs x %llu tokens, %llu layers, blocks of %llu KiB, KV %.2f GiB, "
	       "%llu groups, weights %llu MiB per layer\n", (unsigned long long)c.seqs,
	       (unsigned long long)c.tokens, (unsigned long long)c.layers,
	       (unsigned long long)(gbd_block_bytes(&c) >> 10),
	       (double)(all * gbd_block_bytes(&c)) / (1u << 30), (unsigned long long)groups,
	       (unsigned long long)c.weights_mib);
	printf("H2D peak (one 256 MiB pinned cudaMemcpyAsync): %.1f GB/s\n", peak);
	/* each figure is printed once measured: a failure of the oversubscribed run still
	 * leaves the resident one in the log (and in gpu-check's table) */
	if (gbd_run(&c, all + 8, &res, &pr0))
		return 1;
	printf("decode step, all-resident:      %.2f ms\n", res);
	gb_result("decode_resident_step", res, "ms", 1.0, 0, 0);
	if (gbd_run(&c, all / c.oversub + 8, &over, &promoted))
		return 1;
	return gbd_report(&c, res, over, promoted, peak);
}
#else
int
gb_decode_main(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	printf("gpu-bench decode: built without CUDA\n");
	return 77;
}
#endif
