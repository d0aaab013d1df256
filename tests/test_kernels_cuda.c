/* SPDX-License-Identifier: MIT */
/*
 * tests/test_kernels_cuda.c - the CUDA kernels (kernels/attention.cu, kernels/gather.cu) on a
 * real GPU against the C reference: paged decode attention for every dtype, several shapes
 * (vectorised and generic kernels, the 1- and 2-warp paths of large head_dim, GQA groups of 1,
 * 2 and 4 heads per block, rows that leave lanes idle) and split counts, the partial launcher,
 * block gather/scatter into device and mapped pinned host memory, and int8/fp8 quantization with
 * per-group scales, against the C references (quantization byte for byte).
 * Outputs are poisoned (NaN, 0xa5) before each run, so an element never written fails; inputs
 * are fresh random values each run (seed printed; KVT_TEST_SEED repeats one). KVT_TEST_QUICK=1
 * runs a small subset (for compute-sanitizer).
 *
 * Exits 77 (skip) in builds without CUDA (KVT_WITH_CUDA not passed to tests) and on machines
 * without a usable GPU. Meant to run on a lent GPU machine, also under compute-sanitizer.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/attention.h"
#include "kernels/gather.h"
#include "kernels/quant.h"
#include "support/kv_fixture.h"
#include "support/kvt_test.h"

#ifdef KVT_WITH_CUDA
#include <cuda_runtime.h>

#include "kernels/kernels_cuda.h"

#define TKC_OK(call) assert_int_equal((int)(call), (int)cudaSuccess)

/* cudaMalloc + copy of len bytes of src (src NULL: zeroed). */
static void *
tkc_upload(const void *src, size_t len)
{
	void *d = NULL;

	TKC_OK(cudaMalloc(&d, len));
	if (src)
		TKC_OK(cudaMemcpy(d, src, len, cudaMemcpyHostToDevice));
	else
		TKC_OK(cudaMemset(d, 0, len));
	return d;
}

/* pad 0 and rows of 16-byte multiples take the vectorised kernel, the others the generic one */
static const struct kvt_test_kv_shape tkc_shapes[] = {
	{ 8, 4, 8, 1, 37, 0 },      { 8, 4, 8, 7, 50, 12 },    { 32, 8, 128, 16, 1000, 0 },
	{ 32, 8, 128, 7, 33, 0 },   { 4, 4, 256, 16, 300, 4 }, { 4, 2, 1500, 16, 40, 0 },
	{ 2, 1, 4096, 16, 40, 0 },  { 8, 1, 32, 7, 1, 0 },     { 12, 4, 64, 16, 777, 0 },
	{ 16, 16, 96, 5, 300, 0 },  { 40, 5, 80, 16, 513, 0 }, { 16, 2, 256, 16, 2100, 0 },
};

/* Fresh inputs every run unless KVT_TEST_SEED is set; the seed is printed to reproduce. */
static uint64_t
tkc_seed(void)
{
	static uint64_t seed;
	const char *e;

	if (seed)
		return seed;
	e = getenv("KVT_TEST_SEED");
	seed = e && *e ? strtoull(e, NULL, 0) : (uint64_t)time(NULL) * 2654435761u + 1;
	if (!seed)
		seed = 1;
	print_message("random seed %llu (set KVT_TEST_SEED to repeat)\n",
		      (unsigned long long)seed);
	return seed;
}

/* The fixture's K/V, table and q on the device; dkv addresses them. */
struct tkc_dev {
	void *hbm;                /* device copy of the fake HBM */
	uint32_t *table;          /* device copy of the block table */
	float *q;                 /* device [n_heads][head_dim] */
	struct kvt_paged_kv dkv;  /* b->kv with device pointers */
};

static void
tkc_dev_upload(struct tkc_dev *d, const struct kvt_test_kv *b, const struct kvt_test_kv_shape *s)
{
	d->hbm = tkc_upload(b->hbm, b->hbm_bytes);
	d->table = tkc_upload(b->table, b->n_blocks * sizeof(uint32_t));
	d->q = tkc_upload(b->q, (size_t)s->n_heads * s->head_dim * sizeof(float));
	d->dkv = b->kv;
	d->dkv.k_base = (char *)d->hbm + ((const unsigned char *)b->kv.k_base - b->hbm);
	d->dkv.table = d->table;
}

static void
tkc_dev_free(struct tkc_dev *d)
{
	cudaFree(d->hbm);
	cudaFree(d->table);
	cudaFree(d->q);
}

static void
tkc_download(void *dst, const void *src, size_t len)
{
	TKC_OK(cudaMemcpy(dst, src, len, cudaMemcpyDeviceToHost));
}

/* One shape and dtype: both kernels at every split count against the reference. */
static void
tkc_decode_case(const struct kvt_test_kv_shape *s, enum kvt_dtype dt, uint64_t *rng, size_t si)
{
	static const uint32_t splits[] = { 1, 3, 64, 5000 };
	const size_t n_splits = kvt_test_quick() ? 2 : sizeof splits / sizeof splits[0];
	size_t n = (size_t)s->n_heads * s->head_dim, pi;
	float *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
	float *scratch = malloc(s->seq_len * sizeof(float)), *dout;
	struct kvt_test_kv b;
	struct tkc_dev d;
	int generic;

	assert_true(want && got && scratch);
	kvt_test_kv_build(&b, s, dt, rng);
	assert_int_equal(kvt_attn_decode_ref(&b.kv, b.q, s->n_heads, s->seq_len, scratch, want),
			 0);
	tkc_dev_upload(&d, &b, s);
	dout = tkc_upload(NULL, n * sizeof(float));
	for (generic = 0; generic < 2; generic++) {
		kvt_attn_cuda_force_generic(generic);
		for (pi = 0; pi < n_splits; pi++) {
			size_t wf = kvt_attn_cuda_work_floats(s->n_heads, s->head_dim, splits[pi]);
			float *work = wf ? tkc_upload(NULL, wf * sizeof(float)) : NULL;
			double err;

			if (work) /* poison: a partial never written would be NaN */
				TKC_OK(cudaMemset(work, 0xff, wf * sizeof(float)));
			TKC_OK(cudaMemset(dout, 0xff, n * sizeof(float))); /* NaN */
			assert_int_equal(kvt_attn_decode_cuda(&d.dkv, d.q, s->n_heads, s->seq_len,
							      splits[pi], work, dout, NULL), 0);
			TKC_OK(cudaDeviceSynchronize());
			tkc_download(got, dout, n * sizeof(float));
			err = kvt_test_kv_relerr(got, want, n);
			if (!(err <= 1e-4))
				fail_msg("shape %zu dtype %d splits %u %s kernel: relerr %g", si,
					 (int)dt, splits[pi], generic ? "generic" : "default", err);
			cudaFree(work);
		}
	}
	kvt_attn_cuda_force_generic(0);
	cudaFree(dout);
	tkc_dev_free(&d);
	kvt_test_kv_free(&b);
	free(want);
	free(got);
	free(scratch);
}

static void
test_decode_vs_ref(void **state)
{
	static const enum kvt_dtype dts[] = { KVT_DTYPE_F32, KVT_DTYPE_F16, KVT_DTYPE_BF16 };
	const size_t n_shapes = kvt_test_quick() ? 4 : sizeof tkc_shapes / sizeof tkc_shapes[0];
	uint64_t rng = tkc_seed();
	size_t si, di;

	(void)state;
	for (si = 0; si < n_shapes; si++)
		for (di = 0; di < 3; di++)
			tkc_decode_case(&tkc_shapes[si], dts[di], &rng, si);
}

/*
 * One window [t0, t1) of a 32-head, Hkv 8, d 128 sequence of @seq_len positions: out, m and l of
 * both kernels against kvt_attn_partial_ref(), at each of @splits (0: kvt_attn_partial_cuda(),
 * else kvt_attn_partial_split_cuda() with that many splits). Work and outputs are poisoned (NaN).
 */
static void
tkc_partial_case(uint32_t seq_len, enum kvt_dtype dt, uint64_t t0, uint64_t t1,
		 const uint32_t *splits, size_t n_splits, uint64_t seed)
{
	const struct kvt_test_kv_shape s = { 32, 8, 128, 16, seq_len, 0 };
	const size_t n = 32 * 128;
	float *o = malloc(n * sizeof(float)), *go = malloc(n * sizeof(float));
	float *scratch = malloc(seq_len * sizeof(float));
	float m[32], l[32], gm[32], gl[32], *dbuf;
	struct kvt_test_kv b;
	struct tkc_dev d;
	uint64_t rng = seed;
	size_t pi;
	int i, generic;

	assert_true(o && go && scratch);
	kvt_test_kv_build(&b, &s, dt, &rng);
	tkc_dev_upload(&d, &b, &s);
	dbuf = tkc_upload(NULL, (n + 64) * sizeof(float));
	assert_int_equal(kvt_attn_partial_ref(&b.kv, b.q, 32, t0, t1, scratch, o, m, l), 0);
	for (generic = 0; generic < 2; generic++) {
		kvt_attn_cuda_force_generic(generic);
		for (pi = 0; pi < n_splits; pi++) {
			size_t wf = kvt_attn_cuda_work_floats(32, 128, splits[pi]);
			float *work = wf ? tkc_upload(NULL, wf * sizeof(float)) : NULL;

			if (work)
				TKC_OK(cudaMemset(work, 0xff, wf * sizeof(float)));
			TKC_OK(cudaMemset(dbuf, 0xff, (n + 64) * sizeof(float)));
			if (splits[pi] == 0)
				assert_int_equal(kvt_attn_partial_cuda(&d.dkv, d.q, 32, t0, t1, dbuf,
								       dbuf + n, dbuf + n + 32,
								       NULL), 0);
			else
				assert_int_equal(kvt_attn_partial_split_cuda(&d.dkv, d.q, 32, t0, t1,
									     splits[pi], work,
									     dbuf, dbuf + n,
									     dbuf + n + 32,
									     NULL), 0);
			TKC_OK(cudaDeviceSynchronize());
			tkc_download(go, dbuf, n * sizeof(float));
			tkc_download(gm, dbuf + n, sizeof gm);
			tkc_download(gl, dbuf + n + 32, sizeof gl);
			if (!(kvt_test_kv_relerr(go, o, n) <= 1e-4))
				fail_msg("splits %u %s: relerr %g", splits[pi],
					 generic ? "generic" : "default",
					 kvt_test_kv_relerr(go, o, n));
			for (i = 0; i < 32; i++) {
				assert_float_equal(gm[i], m[i], 1e-5f * (1.0f + fabsf(m[i])));
				assert_float_equal(gl[i], l[i], 1e-4f * l[i]);
			}
			cudaFree(work);
		}
	}
	kvt_attn_cuda_force_generic(0);
	cudaFree(dbuf);
	tkc_dev_free(&d);
	kvt_test_kv_free(&b);
	free(o);
	free(go);
	free(scratch);
}

/* kvt_attn_partial_cuda: a bf16 window that does not start at 0 nor end on a block boundary. */
static void
test_partial_vs_ref(void **state)
{
	static const uint32_t one[] = { 0 };

	(void)state;
	tkc_partial_case(200, KVT_DTYPE_BF16, 17, 150, one, 1, tkc_seed() + 5);
}

/* The split partial of an fp16 window, at split counts that give 1, 3 and 64 sub-windows (and
 * more than the window has positions). */
static void
test_partial_split_vs_ref(void **state)
{
	static const uint32_t splits[] = { 1, 3, 64, 1000 };

	(void)state;
	tkc_partial_case(700, KVT_DTYPE_F16, 33, 650, splits, kvt_test_quick() ? 3 : 4,
			 tkc_seed() + 9);
}

/* One gather + scatter round of n slots at [offset, offset + len) of each, staging in dst. */
static void
tkc_gather_case(uint64_t offset, uint64_t len, int mapped_host)
{
	enum { N_SLOTS = 20, N = 5, STRIDE = 4096 + 64 };
	static const uint32_t slots[N] = { 7, 3, 19, 0, 12 };
	unsigned char *host = malloc(N_SLOTS * STRIDE), *want = malloc(N * len);
	unsigned char *got = malloc(N * len), *back = malloc(N_SLOTS * STRIDE);
	unsigned char *dslots, *stage;
	uint32_t *dids;
	uint64_t rng = tkc_seed() + offset * 31 + len;
	size_t i;

	assert_true(host && want && got && back);
	for (i = 0; i < N_SLOTS * STRIDE; i++)
		host[i] = (unsigned char)kvt_test_kv_rand(&rng);
	assert_int_equal(kvt_gather_blocks_ref(want, host, STRIDE, offset, len, slots, N), 0);
	dslots = tkc_upload(host, N_SLOTS * STRIDE);
	dids = tkc_upload(slots, sizeof slots);
	if (mapped_host) {
		TKC_OK(cudaHostAlloc((void **)&stage, N * len, cudaHostAllocMapped));
		memset(stage, 0xa5, N * len); /* poison: every byte must be written */
	} else {
		stage = tkc_upload(NULL, N * len);
		TKC_OK(cudaMemset(stage, 0xa5, N * len));
	}
	assert_int_equal(kvt_gather_blocks_cuda(stage, dslots, STRIDE, offset, len, dids, N, NULL),
			 0);
	TKC_OK(cudaDeviceSynchronize());
	if (mapped_host)
		memcpy(got, stage, N * len);
	else
		tkc_download(got, stage, N * len);
	assert_memory_equal(got, want, N * len);
	/* scatter the pieces back, reversed, into zeroed slots; untouched bytes stay zero */
	memset(back, 0, N_SLOTS * STRIDE);
	TKC_OK(cudaMemset(dslots, 0, N_SLOTS * STRIDE));
	{
		uint32_t rev[N];

		for (i = 0; i < N; i++)
			rev[i] = slots[N - 1 - i];
		assert_int_equal(kvt_scatter_blocks_ref(back, STRIDE, offset, len, want, rev, N),
				 0);
		TKC_OK(cudaMemcpy(dids, rev, sizeof rev, cudaMemcpyHostToDevice));
	}
	if (mapped_host)
		memcpy(stage, want, N * len);
	else
		TKC_OK(cudaMemcpy(stage, want, N * len, cudaMemcpyHostToDevice));
	assert_int_equal(kvt_scatter_blocks_cuda(dslots, STRIDE, offset, len, stage, dids, N, NULL),
			 0);
	TKC_OK(cudaDeviceSynchronize());
	tkc_download(host, dslots, N_SLOTS * STRIDE);
	assert_memory_equal(host, back, N_SLOTS * STRIDE);
	if (mapped_host)
		cudaFreeHost(stage);
	else
		cudaFree(stage);
	cudaFree(dslots);
	cudaFree(dids);
	free(host);
	free(want);
	free(got);
	free(back);
}

static void
test_gather_scatter(void **state)
{
	(void)state;
	tkc_gather_case(0, 4096 + 64, 0);  /* whole blocks, 16-byte words */
	tkc_gather_case(1040, 1040, 0);    /* one "layer", 16-byte words */
	tkc_gather_case(3, 1001, 0);       /* unaligned: bytes */
	tkc_gather_case(0, 4096 + 64, 1);  /* into mapped pinned host memory */
	tkc_gather_case(5, 77, 1);
}
/* One quantize + dequantize round on the GPU against the reference, bytes compared. */
static void
tkc_quant_case(enum kvt_dtype qt, enum kvt_dtype ft, uint64_t ng, uint32_t group, uint64_t *rng)
{
	const size_t n = (size_t)ng * group, es = ft == KVT_DTYPE_F32 ? 4 : 2;
	float *x = malloc(n * sizeof(float)), *sc = malloc(ng * sizeof(float));
	float *gsc = malloc(ng * sizeof(float));
	unsigned char *src = malloc(n * es), *q = malloc(n), *gq = malloc(n);
	unsigned char *back = malloc(n * es), *gback = malloc(n * es);
	void *dsrc, *dq, *dsc, *dback;
	size_t i;

	assert_true(x && sc && gsc && src && q && gq && back && gback);
	for (i = 0; i < n; i++) /* groups of very different magnitudes, some values zero */
		x[i] = (i % 97 == 3) ? 0.0f : kvt_test_kv_uniform(rng, 1.0f) *
			ldexpf(1.0f, (int)((i / group) % 20) - 10);
	assert_int_equal(kvt_store_f32(ft, src, x, n), 0);
	assert_int_equal(kvt_quant_ref(qt, ft, src, ng, group, q, sc), 0);
	assert_int_equal(kvt_dequant_ref(qt, q, sc, ng, group, ft, back), 0);
	dsrc = tkc_upload(src, n * es);
	dq = tkc_upload(NULL, n);
	dsc = tkc_upload(NULL, ng * sizeof(float));
	dback = tkc_upload(NULL, n * es);
	TKC_OK(cudaMemset(dq, 0xa5, n));
	TKC_OK(cudaMemset(dsc, 0xff, ng * sizeof(float)));
	TKC_OK(cudaMemset(dback, 0xff, n * es));
	assert_int_equal(kvt_quant_cuda(qt, ft, dsrc, ng, group, dq, dsc, NULL), 0);
	assert_int_equal(kvt_dequant_cuda(qt, dq, dsc, ng, group, ft, dback, NULL), 0);
	TKC_OK(cudaDeviceSynchronize());
	tkc_download(gq, dq, n);
	tkc_download(gsc, dsc, ng * sizeof(float));
	tkc_download(gback, dback, n * es);
	for (i = 0; i < ng; i++)
		if (memcmp(&gsc[i], &sc[i], sizeof(float)))
			fail_msg("qt %d ft %d: scale %zu is %g, reference %g", (int)qt, (int)ft, i,
				 gsc[i], sc[i]);
	for (i = 0; i < n; i++)
		if (gq[i] != q[i])
			fail_msg("qt %d ft %d group %u: code %zu is 0x%02x, reference 0x%02x",
				 (int)qt, (int)ft, group, i, gq[i], q[i]);
	assert_memory_equal(gback, back, n * es);
	cudaFree(dsrc);
	cudaFree(dq);
	cudaFree(dsc);
	cudaFree(dback);
	free(x);
	free(sc);
	free(gsc);
	free(src);
	free(q);
	free(gq);
	free(back);
	free(gback);
}

static void
test_quant_vs_ref(void **state)
{
	static const enum kvt_dtype qts[] = { KVT_DTYPE_INT8, KVT_DTYPE_FP8_E4M3 };
	static const enum kvt_dtype fts[] = { KVT_DTYPE_F32, KVT_DTYPE_F16, KVT_DTYPE_BF16 };
	static const uint32_t shapes[][2] = { { 1, 1 }, { 7, 300 }, { 300, 2048 }, { 3, 5000 } };
	const size_t ns = kvt_test_quick() ? 2 : 4;
	uint64_t rng = tkc_seed() + 77;

	(void)state;
	for (size_t k = 0; k < 2; k++)
		for (size_t f = 0; f < 3; f++)
			for (size_t sh = 0; sh < ns; sh++)
				tkc_quant_case(qts[k], fts[f], shapes[sh][0], shapes[sh][1], &rng);
}

/* ---- window + sinks, MLA latent (issue 16) ------------------------------------------------ */

/*
 * Decode with (window, sink) on a fixture whose invisible rows and blocks are NaN (a kernel that
 * reads outside the window fails), with the dense table and with a table of the visible blocks
 * plus some others (pos), both kernels, splits 1, 3, 64: against kvt_attn_decode_ref().
 * Then the split-KV partials of views of @wb blocks (absolute positions, pos, kv.seq_len) on the
 * GPU, merged on the host: against the decode; a view with no visible position must come back
 * empty (out 0, m -inf, l 0).
 */
static void
tkc_window_case(const struct kvt_test_kv_shape *s, enum kvt_dtype dt, uint64_t window,
		uint64_t sink, uint32_t wb, uint64_t *rng)
{
	static const uint32_t splits[] = { 1, 3, 64 };
	const size_t n_splits = kvt_test_quick() ? 2 : 3;
	size_t n = (size_t)s->n_heads * s->head_dim, pi;
	float *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
	float *ob = malloc(n * sizeof(float)), *scratch = malloc(s->seq_len * sizeof(float));
	float *ma = malloc(s->n_heads * sizeof(float)), *la = malloc(s->n_heads * sizeof(float));
	float *mb = malloc(s->n_heads * sizeof(float)), *lb = malloc(s->n_heads * sizeof(float));
	uint32_t *ctab = malloc((s->seq_len / s->tpb + 1) * sizeof(uint32_t));
	uint32_t *cpos = malloc((s->seq_len / s->tpb + 1) * sizeof(uint32_t)), ne = 0;
	uint32_t *dctab, *dcpos, *dwpos;
	float *dout, *dm, *dl;
	struct kvt_test_kv b;
	struct tkc_dev d;
	struct kvt_paged_kv kv;
	int generic, first = 1;

	assert_true(want && got && ob && scratch && ma && la && mb && lb && ctab && cpos);
	kvt_test_kv_build(&b, s, dt, rng);
	kvt_test_kv_poison(&b, window, sink, s->seq_len - 1);
	kv = b.kv;
	kv.window = window;
	kv.sink = sink;
	assert_int_equal(kvt_attn_decode_ref(&kv, b.q, s->n_heads, s->seq_len, scratch, want), 0);
	for (uint32_t blk = 0; blk < b.n_blocks; blk++) {
		int vis = 0;

		for (uint64_t t = (uint64_t)blk * s->tpb; t < (uint64_t)(blk + 1) * s->tpb; t++)
			vis |= kvt_test_visible(window, sink, s->seq_len - 1, t);
		if (vis || blk % 3 == 2) {
			ctab[ne] = b.table[blk];
			cpos[ne++] = blk;
		}
	}
	tkc_dev_upload(&d, &b, s);
	dctab = tkc_upload(ctab, ne * sizeof(uint32_t));
	dcpos = tkc_upload(cpos, ne * sizeof(uint32_t));
	dwpos = tkc_upload(NULL, b.n_blocks * sizeof(uint32_t));
	dout = tkc_upload(NULL, n * sizeof(float));
	dm = tkc_upload(NULL, s->n_heads * sizeof(float));
	dl = tkc_upload(NULL, s->n_heads * sizeof(float));
	d.dkv.window = window;
	d.dkv.sink = sink;
	for (int tab = 0; tab < 2; tab++) {
		struct kvt_paged_kv dk = d.dkv;

		if (tab) {
			dk.table = dctab;
			dk.pos = dcpos;
			dk.n_entries = ne;
		}
		for (generic = 0; generic < 2; generic++) {
			kvt_attn_cuda_force_generic(generic);
			for (pi = 0; pi < n_splits; pi++) {
				size_t wf = kvt_attn_cuda_work_floats(s->n_heads, s->head_dim,
								      splits[pi]);
				float *work = wf ? tkc_upload(NULL, wf * sizeof(float)) : NULL;
				double err;

				if (work)
					TKC_OK(cudaMemset(work, 0xff, wf * sizeof(float)));
				TKC_OK(cudaMemset(dout, 0xff, n * sizeof(float)));
				assert_int_equal(kvt_attn_decode_cuda(&dk, d.q, s->n_heads,
								      s->seq_len, splits[pi], work,
								      dout, NULL), 0);
				TKC_OK(cudaDeviceSynchronize());
				tkc_download(got, dout, n * sizeof(float));
				err = kvt_test_kv_relerr(got, want, n);
				if (!(err <= 1e-4))
					fail_msg("window %llu sink %llu seq %u dtype %d %s table, "
						 "splits %u %s: relerr %g", (unsigned long long)window,
						 (unsigned long long)sink, s->seq_len, (int)dt,
						 tab ? "pos" : "dense", splits[pi],
						 generic ? "generic" : "default", err);
				cudaFree(work);
			}
		}
	}
	kvt_attn_cuda_force_generic(0);
	/* streamed partials of views of wb blocks, merged on the host */
	{
		uint32_t *wpos = malloc(b.n_blocks * sizeof(uint32_t));

		assert_non_null(wpos);
		for (uint32_t i = 0; i < b.n_blocks; i++)
			wpos[i] = i;
		TKC_OK(cudaMemcpy(dwpos, wpos, b.n_blocks * sizeof(uint32_t),
				  cudaMemcpyHostToDevice));
		free(wpos);
	}
	for (uint32_t ws = 0; ws < b.n_blocks; ws += wb) {
		uint32_t nb = b.n_blocks - ws < wb ? b.n_blocks - ws : wb;
		uint64_t t0 = (uint64_t)ws * s->tpb, t1 = (uint64_t)(ws + nb) * s->tpb, nv = 0;
		struct kvt_paged_kv dk = d.dkv;

		t1 = t1 < s->seq_len ? t1 : s->seq_len;
		for (uint64_t t = t0; t < t1; t++)
			nv += (uint64_t)kvt_test_visible(window, sink, s->seq_len - 1, t);
		dk.table = d.table + ws;
		dk.pos = dwpos + ws;
		dk.n_entries = nb;
		dk.seq_len = s->seq_len;
		TKC_OK(cudaMemset(dout, 0xff, n * sizeof(float)));
		TKC_OK(cudaMemset(dm, 0xff, s->n_heads * sizeof(float)));
		TKC_OK(cudaMemset(dl, 0xff, s->n_heads * sizeof(float)));
		assert_int_equal(kvt_attn_partial_cuda(&dk, d.q, s->n_heads, t0, t1, dout, dm, dl,
						       NULL), 0);
		TKC_OK(cudaDeviceSynchronize());
		tkc_download(first ? got : ob, dout, n * sizeof(float));
		tkc_download(first ? ma : mb, dm, s->n_heads * sizeof(float));
		tkc_download(first ? la : lb, dl, s->n_heads * sizeof(float));
		if (!nv)
			for (uint32_t h = 0; h < s->n_heads; h++) {
				const float *o = first ? got : ob;

				assert_true((first ? la : lb)[h] == 0.0f);
				assert_true((first ? ma : mb)[h] == -INFINITY);
				for (uint32_t i = 0; i < s->head_dim; i++)
					assert_true(o[(size_t)h * s->head_dim + i] == 0.0f);
			}
		if (!first)
			kvt_attn_merge(s->n_heads, s->head_dim, got, ma, la, ob, mb, lb);
		first = 0;
	}
	if (!(kvt_test_kv_relerr(got, want, n) <= 1e-4))
		fail_msg("window %llu sink %llu: streamed partials relerr %g",
			 (unsigned long long)window, (unsigned long long)sink,
			 kvt_test_kv_relerr(got, want, n));
	cudaFree(dctab);
	cudaFree(dcpos);
	cudaFree(dwpos);
	cudaFree(dout);
	cudaFree(dm);
	cudaFree(dl);
	tkc_dev_free(&d);
	kvt_test_kv_free(&b);
	free(want);
	free(got);
	free(ob);
	free(scratch);
	free(ma);
	free(la);
	free(mb);
	free(lb);
	free(ctab);
	free(cpos);
}

static void
test_window_vs_ref(void **state)
{
	/* vectorised (16-byte rows) and generic (pad, odd head_dim) kernels, GQA 1/2/4 per block */
	static const struct kvt_test_kv_shape shapes[] = {
		{ 8, 4, 8, 4, 61, 0 }, { 32, 8, 128, 16, 300, 0 }, { 8, 2, 24, 7, 90, 4 },
		{ 4, 4, 256, 16, 130, 0 },
	};
	static const uint64_t ws[][2] = { { 1, 0 }, { 16, 0 }, { 17, 4 }, { 40, 1 }, { 5, 20 } };
	static const enum kvt_dtype dts[] = { KVT_DTYPE_F32, KVT_DTYPE_F16, KVT_DTYPE_BF16 };
	const size_t nsh = kvt_test_quick() ? 2 : 4, nw = kvt_test_quick() ? 2 : 5;
	uint64_t rng = tkc_seed() + 1600;

	(void)state;
	for (size_t si = 0; si < nsh; si++)
		for (size_t wi = 0; wi < nw; wi++)
			tkc_window_case(&shapes[si], dts[(si + wi) % 3], ws[wi][0], ws[wi][1],
					(uint32_t)(wi % 3) + 1, &rng);
}

/*
 * MLA latent (absorbed form): decode at splits 1, 3, 64 and streamed partials over views of two
 * blocks (pos, absolute positions) merged on the host, against kvt_attn_latent_decode_ref();
 * the latent vectors are the fixture's K rows [c_kv | k_pe] (one KV head of r + rope elements).
 */
static void
tkc_latent_case(uint32_t h, uint32_t r, uint32_t rope, uint32_t tpb, uint32_t seq, uint32_t pad,
		enum kvt_dtype dt, uint64_t window, uint64_t sink, uint64_t *rng)
{
	static const uint32_t splits[] = { 1, 3, 64 };
	const size_t n_splits = kvt_test_quick() ? 2 : 3;
	const struct kvt_test_kv_shape s = { 1, 1, r + rope, tpb, seq, pad };
	const size_t n = (size_t)h * r;
	const float scale = 1.0f / sqrtf((float)(r / 4 + rope));
	float *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
	float *ob = malloc(n * sizeof(float)), *scratch = malloc(seq * sizeof(float));
	float *q_lat = malloc(n * sizeof(float)), *q_pe = malloc(((size_t)h * rope + 1) * 4);
	float *ma = malloc(h * sizeof(float)), *la = malloc(h * sizeof(float));
	float *mb = malloc(h * sizeof(float)), *lb = malloc(h * sizeof(float));
	float *dql, *dqp, *dout, *dm, *dl;
	uint32_t *dwpos, *wpos;
	struct kvt_paged_latent lk, dk;
	struct kvt_test_kv b;
	struct tkc_dev d;
	int first = 1;

	assert_true(want && got && ob && scratch && q_lat && q_pe && ma && la && mb && lb);
	kvt_test_kv_build(&b, &s, dt, rng);
	kvt_test_kv_poison(&b, window, sink, seq - 1);
	for (size_t i = 0; i < n; i++)
		q_lat[i] = kvt_test_kv_uniform(rng, 2.0f);
	for (size_t i = 0; i < (size_t)h * rope; i++)
		q_pe[i] = kvt_test_kv_uniform(rng, 2.0f);
	lk = (struct kvt_paged_latent){ .base = b.kv.k_base, .block_stride = b.kv.block_stride,
					.token_stride = b.kv.token_stride, .table = b.table,
					.tokens_per_block = tpb, .kv_lora_rank = r,
					.rope_dim = rope, .dtype = dt, .window = window,
					.sink = sink };
	assert_int_equal(kvt_attn_latent_decode_ref(&lk, q_lat, q_pe, h, seq, scale, scratch,
						    want), 0);
	tkc_dev_upload(&d, &b, &s);
	dql = tkc_upload(q_lat, n * sizeof(float));
	dqp = tkc_upload(q_pe, ((size_t)h * rope + 1) * sizeof(float));
	dout = tkc_upload(NULL, n * sizeof(float));
	dm = tkc_upload(NULL, h * sizeof(float));
	dl = tkc_upload(NULL, h * sizeof(float));
	wpos = malloc(b.n_blocks * sizeof(uint32_t));
	assert_non_null(wpos);
	for (uint32_t i = 0; i < b.n_blocks; i++)
		wpos[i] = i;
	dwpos = tkc_upload(wpos, b.n_blocks * sizeof(uint32_t));
	dk = lk;
	dk.base = d.dkv.k_base;
	dk.table = d.table;
	for (size_t pi = 0; pi < n_splits; pi++) {
		size_t wf = kvt_attn_latent_cuda_work_floats(h, r, splits[pi]);
		float *work = wf ? tkc_upload(NULL, wf * sizeof(float)) : NULL;
		double err;

		if (work)
			TKC_OK(cudaMemset(work, 0xff, wf * sizeof(float)));
		TKC_OK(cudaMemset(dout, 0xff, n * sizeof(float)));
		if (kvt_attn_latent_decode_cuda(&dk, dql, rope ? dqp : NULL, h, seq, scale,
						splits[pi], work, dout, NULL))
			fail_msg("kvt_attn_latent_decode_cuda: %s", kvt_last_error_message());
		TKC_OK(cudaDeviceSynchronize());
		tkc_download(got, dout, n * sizeof(float));
		err = kvt_test_kv_relerr(got, want, n);
		if (!(err <= 1e-4))
			fail_msg("latent h %u r %u rope %u seq %u dtype %d window %llu sink %llu "
				 "splits %u: relerr %g", h, r, rope, seq, (int)dt,
				 (unsigned long long)window, (unsigned long long)sink, splits[pi],
				 err);
		cudaFree(work);
	}
	for (uint32_t ws = 0; ws < b.n_blocks; ws += 2) {
		uint32_t nb = b.n_blocks - ws < 2 ? b.n_blocks - ws : 2;
		uint64_t t0 = (uint64_t)ws * tpb, t1 = (uint64_t)(ws + nb) * tpb;
		struct kvt_paged_latent vk = dk;
		size_t wf = kvt_attn_latent_cuda_work_floats(h, r, 3);
		float *work = tkc_upload(NULL, wf * sizeof(float));

		t1 = t1 < seq ? t1 : seq;
		vk.table = d.table + ws;
		vk.pos = dwpos + ws;
		vk.n_entries = nb;
		vk.seq_len = seq;
		assert_int_equal(kvt_attn_latent_partial_cuda(&vk, dql, dqp, h, t0, t1, scale, 3,
							      work, dout, dm, dl, NULL), 0);
		TKC_OK(cudaDeviceSynchronize());
		tkc_download(first ? got : ob, dout, n * sizeof(float));
		tkc_download(first ? ma : mb, dm, h * sizeof(float));
		tkc_download(first ? la : lb, dl, h * sizeof(float));
		if (!first)
			kvt_attn_merge(h, r, got, ma, la, ob, mb, lb);
		first = 0;
		cudaFree(work);
	}
	if (!(kvt_test_kv_relerr(got, want, n) <= 1e-4))
		fail_msg("latent h %u r %u: streamed partials relerr %g", h, r,
			 kvt_test_kv_relerr(got, want, n));
	cudaFree(dql);
	cudaFree(dqp);
	cudaFree(dout);
	cudaFree(dm);
	cudaFree(dl);
	cudaFree(dwpos);
	tkc_dev_free(&d);
	kvt_test_kv_free(&b);
	free(wpos);
	free(want);
	free(got);
	free(ob);
	free(scratch);
	free(q_lat);
	free(q_pe);
	free(ma);
	free(la);
	free(mb);
	free(lb);
}

static void
test_latent_vs_ref(void **state)
{
	uint64_t rng = tkc_seed() + 1640;

	(void)state;
	/* DeepSeek-V2/V3 widths (512 + 64), 16 heads: tiles shrink to fit shared memory */
	tkc_latent_case(16, 512, 64, 16, 100, 0, KVT_DTYPE_BF16, 0, 0, &rng);
	tkc_latent_case(16, 512, 64, 16, 150, 0, KVT_DTYPE_F16, 40, 4, &rng);
	tkc_latent_case(3, 24, 8, 5, 37, 4, KVT_DTYPE_F32, 9, 2, &rng); /* partial head group */
	if (kvt_test_quick())
		return;
	tkc_latent_case(1, 8, 0, 1, 20, 0, KVT_DTYPE_F32, 0, 0, &rng); /* no rope part */
	tkc_latent_case(20, 64, 16, 8, 70, 0, KVT_DTYPE_BF16, 13, 0, &rng);
	tkc_latent_case(2, 1984, 64, 16, 40, 0, KVT_DTYPE_F32, 0, 0, &rng); /* widest: 2048 */
}
#endif /* KVT_WITH_CUDA */

int
main(void)
{
#ifdef KVT_WITH_CUDA
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_decode_vs_ref),
		cmocka_unit_test(test_partial_vs_ref),
		cmocka_unit_test(test_partial_split_vs_ref),
		cmocka_unit_test(test_gather_scatter),
		cmocka_unit_test(test_quant_vs_ref),
		cmocka_unit_test(test_window_vs_ref),
		cmocka_unit_test(test_latent_vs_ref),
	};
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		printf("test_kernels_cuda: no usable GPU: skipped\n");
		return 77;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
#else
	printf("test_kernels_cuda: built without KVT_WITH_CUDA: skipped\n");
	return 77;
#endif
}
