/* SPDX-License-Identifier: MIT */
/*
 * tools/gpu-bench/attn.c - paged decode attention (kvt_attn_decode_cuda, split-KV; and the
 * split partial of a streamed window, kvt_attn_partial_split_cuda) of one sequence over a scrambled block table in the block-first layout (4 layers, layer 1 read, so
 * every block piece sits at a stride), against a device-to-device cudaMemcpyAsync of the same
 * number of bytes. Bandwidths: attention = K/V bytes read / time; copy = 2 x bytes / time (it
 * reads and writes each byte). GPU-side time (cudaEvent), warm-up, median of --reps.
 * Shape: 32 query heads, 8 KV heads, head_dim 128 (Llama-3-8B), 16-token blocks.
 * Issue 16: a sliding window (4096 + 4 sinks) at the longest length against a full decode of
 * as many positions, and MLA decode in the absorbed form (512 + 64 bf16 latent, 16 and 128
 * heads) against a D2D copy of the latent bytes; reported, no targets.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gb.h"

#ifdef KVT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "engine/kvtier.h"
#include "kernels/kernels_cuda.h"

#define GBA_H 32u
#define GBA_HKV 8u
#define GBA_D 128u
#define GBA_TPB 16u
#define GBA_LAYERS 4u

/* Buffers of one measurement. */
struct gba {
	void *hbm;            /* slots */
	void *dst;            /* D2D copy destination */
	uint32_t *table;      /* device block table */
	float *q, *out, *work; /* device query, result, split scratch */
	float *ml;            /* device [2][GBA_H]: a partial's m and l */
	cudaEvent_t e0, e1;   /* timing */
	cudaStream_t s;       /* stream */
	int n_sm;             /* SMs */
	uint32_t reps;        /* repetitions */
};

/* Median GPU time (ms) of: the attention (copy == 0), the D2D copy of @bytes (copy == 1), or
 * the split partial of the window [seq / 4, seq) (copy == 2; m and l in a->ml). */
static int
gba_time(struct gba *a, const struct kvt_paged_kv *kv, uint64_t seq, uint32_t splits, int copy,
	 uint64_t bytes, double *ms)
{
	double t[64];
	uint32_t r;
	cudaError_t e;

	for (r = 0; r <= a->reps && r < 64; r++) { /* round 0 is the warm-up */
		float f = 0.0f;

		if ((e = cudaEventRecord(a->e0, a->s)) != cudaSuccess)
			return gb_fail("cudaEventRecord", e);
		if (copy == 2) {
			if (kvt_attn_partial_split_cuda(kv, a->q, GBA_H, seq / 4, seq, splits,
							a->work, a->out, a->ml, a->ml + GBA_H,
							a->s)) {
				fprintf(stderr, "gpu-bench attn: %s\n", kvt_last_error_message());
				return 1;
			}
		} else if (copy) {
			e = cudaMemcpyAsync(a->dst, a->hbm, bytes, cudaMemcpyDeviceToDevice, a->s);
			if (e != cudaSuccess)
				return gb_fail("cudaMemcpyAsync D2D", e);
		} else if (kvt_attn_decode_cuda(kv, a->q, GBA_H, seq, splits, a->work, a->out,
						a->s)) {
			fprintf(stderr, "gpu-bench attn: %s\n", kvt_last_error_message());
			return 1;
		}
		if ((e = cudaEventRecord(a->e1, a->s)) != cudaSuccess ||
		    (e = cudaEventSynchronize(a->e1)) != cudaSuccess ||
		    (e = cudaEventElapsedTime(&f, a->e0, a->e1)) != cudaSuccess)
			return gb_fail("timing", e);
		if (r)
			t[r - 1] = f;
	}
	*ms = gb_median(t, r - 1);
	return 0;
}

/* One sequence length (and dtype, kernel): prints and RESULTs attention vs copy. */
static int
gba_case(struct gba *a, uint64_t seq, enum kvt_dtype dt, int generic, double target)
{
	const uint64_t esize = 2, tok = (uint64_t)GBA_HKV * GBA_D * esize;
	const uint64_t lbb = 2 * GBA_TPB * tok, bb = GBA_LAYERS * lbb;
	const uint64_t kv_bytes = 2 * seq * tok;
	uint32_t splits = kvt_attn_cuda_splits(GBA_H, GBA_HKV, seq, a->n_sm);
	struct kvt_paged_kv kv = { .k_base = (char *)a->hbm + lbb, .v_offset = GBA_TPB * tok,
				   .block_stride = bb, .token_stride = tok, .table = a->table,
				   .tokens_per_block = GBA_TPB, .n_kv_heads = GBA_HKV,
				   .head_dim = GBA_D, .dtype = dt };
	double t_attn, t_copy, bw_attn, bw_copy;
	char name[96];

	(void)bb;
	kvt_attn_cuda_force_generic(generic);
	if (gba_time(a, &kv, seq, splits, 0, 0, &t_attn) ||
	    gba_time(a, &kv, seq, splits, 1, kv_bytes, &t_copy)) {
		kvt_attn_cuda_force_generic(0);
		return 1;
	}
	kvt_attn_cuda_force_generic(0);
	bw_attn = (double)kv_bytes / (t_attn * 1e-3) / 1e9;
	bw_copy = 2.0 * (double)kv_bytes / (t_copy * 1e-3) / 1e9;
	printf("attn seq %7llu %s%s: %u splits, %.3f ms, %.0f GB/s; D2D copy of %llu MiB: "
	       "%.3f ms, %.0f GB/s (read+write)\n", (unsigned long long)seq,
	       dt == KVT_DTYPE_F16 ? "fp16" : "bf16", generic ? " generic kernel" : "", splits,
	       t_attn, bw_attn, (unsigned long long)(kv_bytes >> 20), t_copy, bw_copy);
	snprintf(name, sizeof name, "attn_%s%s_seq%lluk_vs_d2d", dt == KVT_DTYPE_F16 ? "fp16" :
		 "bf16", generic ? "_generic" : "", (unsigned long long)(seq >> 10));
	gb_result(name, bw_attn, "GB/s", bw_attn / bw_copy, target, 1);
	return 0;
}

/* The split partial of a streamed window, [seq / 4, seq) (a sequence larger than HBM brought
 * in windows), against a D2D copy of the window's bytes: reported, no target. */
static int
gba_case_partial(struct gba *a, uint64_t seq)
{
	const uint64_t tok = (uint64_t)GBA_HKV * GBA_D * 2, lbb = 2 * GBA_TPB * tok;
	const uint64_t win = seq - seq / 4, kv_bytes = 2 * win * tok;
	uint32_t splits = kvt_attn_cuda_splits(GBA_H, GBA_HKV, win, a->n_sm);
	struct kvt_paged_kv kv = { .k_base = (char *)a->hbm + lbb, .v_offset = GBA_TPB * tok,
				   .block_stride = GBA_LAYERS * lbb, .token_stride = tok,
				   .table = a->table, .tokens_per_block = GBA_TPB,
				   .n_kv_heads = GBA_HKV, .head_dim = GBA_D,
				   .dtype = KVT_DTYPE_F16 };
	double t_attn, t_copy, bw_attn, bw_copy;
	char name[96];

	if (gba_time(a, &kv, seq, splits, 2, 0, &t_attn) ||
	    gba_time(a, &kv, seq, splits, 1, kv_bytes, &t_copy))
		return 1;
	bw_attn = (double)kv_bytes / (t_attn * 1e-3) / 1e9;
	bw_copy = 2.0 * (double)kv_bytes / (t_copy * 1e-3) / 1e9;
	printf("attn partial window [%llu, %llu) fp16: %u splits, %.3f ms, %.0f GB/s; D2D copy: "
	       "%.3f ms, %.0f GB/s (read+write)\n", (unsigned long long)(seq / 4),
	       (unsigned long long)seq, splits, t_attn, bw_attn, t_copy, bw_copy);
	snprintf(name, sizeof name, "attn_fp16_partial_win%lluk_vs_d2d",
		 (unsigned long long)(win >> 10));
	gb_result(name, bw_attn, "GB/s", bw_attn / bw_copy, 0, 1);
	return 0;
}

/* Median GPU time (ms) of @fn(a, ctx) (round 0 the warm-up). */
static int
gba_time_fn(struct gba *a, int (*fn)(struct gba *, const void *), const void *ctx, double *ms)
{
	double t[64];
	uint32_t r;
	cudaError_t e;

	for (r = 0; r <= a->reps && r < 64; r++) {
		float f = 0.0f;

		if ((e = cudaEventRecord(a->e0, a->s)) != cudaSuccess)
			return gb_fail("cudaEventRecord", e);
		if (fn(a, ctx)) {
			fprintf(stderr, "gpu-bench attn: %s\n", kvt_last_error_message());
			return 1;
		}
		if ((e = cudaEventRecord(a->e1, a->s)) != cudaSuccess ||
		    (e = cudaEventSynchronize(a->e1)) != cudaSuccess ||
		    (e = cudaEventElapsedTime(&f, a->e0, a->e1)) != cudaSuccess)
			return gb_fail("timing", e);
		if (r)
			t[r - 1] = f;
	}
	*ms = gb_median(t, r - 1);
	return 0;
}

/* A latent decode of one measurement (issue 16). */
struct gba_lat {
	struct kvt_paged_latent kv;
	const float *q_lat, *q_pe;
	float *work, *out;
	uint32_t n_heads, splits;
	uint64_t seq;
	float scale;
};

static int
gba_lat_run(struct gba *a, const void *ctx)
{
	const struct gba_lat *c = ctx;

	return kvt_attn_latent_decode_cuda(&c->kv, c->q_lat, c->q_pe, c->n_heads, c->seq, c->scale,
					   c->splits, c->work, c->out, a->s);
}

/*
 * MLA decode in the absorbed form (DeepSeek-V2/V3 widths: kv_lora_rank 512 + rope 64, bf16,
 * @h heads) over @seq positions of the same slots (one latent row per token where the K/V test
 * layout has a K row): latent bytes read / time, against a D2D copy of those bytes. Reported.
 */
static int
gba_case_latent(struct gba *a, uint64_t seq, uint32_t h)
{
	const uint64_t tok = (uint64_t)GBA_HKV * GBA_D * 2, lbb = 2 * GBA_TPB * tok;
	const uint32_t r = 512, rope = 64;
	const uint64_t lat_bytes = seq * (r + rope) * 2;
	struct gba_lat c = { .kv = { .base = (char *)a->hbm + lbb, .block_stride = GBA_LAYERS * lbb,
				     .token_stride = (r + rope) * 2, .table = a->table,
				     .tokens_per_block = GBA_TPB, .kv_lora_rank = r,
				     .rope_dim = rope, .dtype = KVT_DTYPE_BF16 },
			     .n_heads = h, .seq = seq, .scale = 0.0721f };
	double t_attn = 0.0, t_copy = 0.0, bw_attn, bw_copy;
	float *ql = NULL, *work = NULL, *out = NULL;
	char name[96];
	cudaError_t e;
	int rc = 1;

	c.splits = kvt_attn_latent_cuda_splits(h, seq, a->n_sm);
	if ((e = cudaMalloc((void **)&ql, (size_t)h * (r + rope) * sizeof(float))) ||
	    (e = cudaMalloc((void **)&out, (size_t)h * r * sizeof(float))) ||
	    (e = cudaMalloc((void **)&work, (kvt_attn_latent_cuda_work_floats(h, r, c.splits) +
					     1) * sizeof(float))) ||
	    (e = cudaMemset(ql, 0, (size_t)h * (r + rope) * sizeof(float)))) {
		gb_fail("latent buffers", e);
		goto out;
	}
	c.q_lat = ql;
	c.q_pe = ql + (size_t)h * r;
	c.work = work;
	c.out = out;
	if (gba_time_fn(a, gba_lat_run, &c, &t_attn) ||
	    gba_time(a, NULL, seq, 1, 1, lat_bytes, &t_copy))
		goto out;
	bw_attn = (double)lat_bytes / (t_attn * 1e-3) / 1e9;
	bw_copy = 2.0 * (double)lat_bytes / (t_copy * 1e-3) / 1e9;
	printf("attn MLA latent seq %llu, %u heads, 512+64 bf16: %u splits, %.3f ms, %.0f GB/s; "
	       "D2D copy: %.3f ms, %.0f GB/s (read+write)\n", (unsigned long long)seq, h,
	       c.splits, t_attn, bw_attn, t_copy, bw_copy);
	snprintf(name, sizeof name, "attn_mla_bf16_h%u_seq%lluk_vs_d2d", h,
		 (unsigned long long)(seq >> 10));
	gb_result(name, bw_attn, "GB/s", bw_attn / bw_copy, 0, 1);
	rc = 0;
out:
	cudaFree(ql);
	cudaFree(out);
	cudaFree(work);
	return rc;
}

/*
 * A sliding window of 4096 positions plus 4 sinks at the end of a @seq-position fp16 sequence:
 * its time against the full decode of the window's length (it should read only the window).
 */
static int
gba_case_window(struct gba *a, uint64_t seq)
{
	const uint64_t tok = (uint64_t)GBA_HKV * GBA_D * 2, lbb = 2 * GBA_TPB * tok;
	const uint64_t win = 4096, vis = win + 4;
	struct kvt_paged_kv kv = { .k_base = (char *)a->hbm + lbb, .v_offset = GBA_TPB * tok,
				   .block_stride = GBA_LAYERS * lbb, .token_stride = tok,
				   .table = a->table, .tokens_per_block = GBA_TPB,
				   .n_kv_heads = GBA_HKV, .head_dim = GBA_D,
				   .dtype = KVT_DTYPE_F16 };
	uint32_t splits = kvt_attn_cuda_splits(GBA_H, GBA_HKV, vis, a->n_sm);
	double t_win = 0.0, t_full = 0.0;

	if (seq <= vis)
		return 0;
	if (gba_time(a, &kv, vis, splits, 0, 0, &t_full))
		return 1;
	kv.window = win;
	kv.sink = 4;
	if (gba_time(a, &kv, seq, splits, 0, 0, &t_win))
		return 1;
	printf("attn fp16 window %llu + 4 sinks at seq %llu: %.3f ms; full decode of %llu "
	       "positions: %.3f ms (ratio %.2f)\n", (unsigned long long)win,
	       (unsigned long long)seq, t_win, (unsigned long long)vis, t_full, t_win / t_full);
	gb_result("attn_fp16_window4k_vs_full4k", t_win, "ms", t_win / t_full, 0, 1);
	return 0;
}

static int
gba_run(struct gba *a, uint64_t max_seq)
{
	static const uint64_t seqs[] = { 4096, 32768, 131072 };
	int rc = 0;

	for (size_t i = 0; i < 3 && !rc; i++)
		if (seqs[i] <= max_seq)
			rc = gba_case(a, seqs[i], KVT_DTYPE_F16, 0, seqs[i] >= 32768 ? 0.8 : 0);
	if (!rc)
		rc = gba_case(a, max_seq, KVT_DTYPE_BF16, 0, 0.8);
	if (!rc)
		rc = gba_case(a, max_seq, KVT_DTYPE_F16, 1, 0);
	if (!rc)
		rc = gba_case_partial(a, max_seq);
	if (!rc)
		rc = gba_case_window(a, max_seq);
	if (!rc)
		rc = gba_case_latent(a, max_seq, 16);
	if (!rc)
		rc = gba_case_latent(a, max_seq, 128);
	return rc;
}

/* Allocates for @max_seq positions, fills, runs; frees in every case. */
static int
gba_setup_run(struct gba *a, uint64_t max_seq)
{
	const uint64_t tok = (uint64_t)GBA_HKV * GBA_D * 2, bb = GBA_LAYERS * 2 * GBA_TPB * tok;
	const uint32_t nb = (uint32_t)((max_seq + GBA_TPB - 1) / GBA_TPB), ns = nb + 16;
	uint32_t *perm = malloc(ns * sizeof *perm);
	float *q = malloc(GBA_H * GBA_D * sizeof *q);
	uint64_t x = 88172645463325252ull;
	uint32_t most = kvt_attn_cuda_splits(GBA_H, GBA_HKV, max_seq, a->n_sm);
	size_t wf = kvt_attn_cuda_work_floats(GBA_H, GBA_D, most) + 64;
	cudaError_t e;
	int rc = 1;

	if (!perm || !q)
		goto out;
	for (uint32_t i = 0; i < ns; i++)
		perm[i] = i;
	for (uint32_t i = ns - 1; i > 0; i--) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		uint32_t j = (uint32_t)(x % (i + 1)), t = perm[i];
		perm[i] = perm[j], perm[j] = t;
	}
	for (uint32_t i = 0; i < GBA_H * GBA_D; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		q[i] = (float)(x >> 40) / 16777216.0f - 0.5f;
	}
	if ((e = cudaMalloc(&a->hbm, (size_t)ns * bb)) != cudaSuccess ||
	    (e = cudaMalloc(&a->dst, (size_t)2 * max_seq * tok)) != cudaSuccess ||
	    (e = cudaMalloc((void **)&a->table, nb * sizeof(uint32_t))) != cudaSuccess ||
	    (e = cudaMalloc((void **)&a->q, GBA_H * GBA_D * sizeof(float))) != cudaSuccess ||
	    (e = cudaMalloc((void **)&a->out, GBA_H * GBA_D * sizeof(float))) != cudaSuccess ||
	    (e = cudaMalloc((void **)&a->work, wf * sizeof(float))) != cudaSuccess ||
	    (e = cudaMalloc((void **)&a->ml, 2 * GBA_H * sizeof(float))) != cudaSuccess ||
	    (e = cudaMemset(a->hbm, 0x3c, (size_t)ns * bb)) != cudaSuccess || /* fp16 ~1.06 */
	    (e = cudaMemcpy(a->table, perm, nb * sizeof(uint32_t), cudaMemcpyHostToDevice)) ||
	    (e = cudaMemcpy(a->q, q, GBA_H * GBA_D * sizeof(float), cudaMemcpyHostToDevice)) ||
	    (e = cudaDeviceSynchronize()) != cudaSuccess) {
		gb_fail("allocating and filling the attention buffers", e);
		goto out;
	}
	printf("attn: H %u, Hkv %u, d %u, %u-token blocks of %llu KiB (%u layers), scrambled "
	       "table, median of %u\n", GBA_H, GBA_HKV, GBA_D, GBA_TPB,
	       (unsigned long long)(bb >> 10), GBA_LAYERS, a->reps);
	rc = gba_run(a, max_seq);
out:
	cudaFree(a->hbm);
	cudaFree(a->dst);
	cudaFree(a->table);
	cudaFree(a->q);
	cudaFree(a->out);
	cudaFree(a->work);
	cudaFree(a->ml);
	free(perm);
	free(q);
	return rc;
}

int
gb_attn_main(int argc, char **argv)
{
	uint64_t max_seq = 131072, reps = 10;
	struct gba a;
	cudaError_t e;
	int rc, n = 0;

	memset(&a, 0, sizeof a);
	for (int i = 1; i < argc; i++) {
		if (gb_opt_u64(argc, argv, &i, "--max-seq", &max_seq) ||
		    gb_opt_u64(argc, argv, &i, "--reps", &reps))
			continue;
		fprintf(stderr, "usage: gpu-bench attn [--max-seq N (131072)] [--reps N (10)]\n");
		return 2;
	}
	if (max_seq < 16 || max_seq > (1u << 24) || reps < 1 || reps > 63)
		return fprintf(stderr, "gpu-bench attn: --max-seq 16..16M, --reps 1..63\n"), 2;
	if (cudaGetDeviceCount(&n) != cudaSuccess || !n)
		return printf("gpu-bench attn: no usable GPU\n"), 77;
	a.reps = (uint32_t)reps;
	if ((e = cudaDeviceGetAttribute(&a.n_sm, cudaDevAttrMultiProcessorCount, 0)) ||
	    (e = cudaStreamCreateWithFlags(&a.s, cudaStreamNonBlocking)) ||
	    (e = cudaEventCreate(&a.e0)) || (e = cudaEventCreate(&a.e1)))
		return gb_fail("attn setup", e);
	rc = gba_setup_run(&a, max_seq);
	cudaEventDestroy(a.e0);
	cudaEventDestroy(a.e1);
	cudaStreamDestroy(a.s);
	return rc;
}
#else
int
gb_attn_main(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	printf("gpu-bench attn: built without CUDA\n");
	return 77;
}
#endif
