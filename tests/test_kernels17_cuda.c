/* SPDX-License-Identifier: MIT */
/*
 * tests/test_kernels17_cuda.c - issue 17's CUDA kernels (kernels/sparse_linear.cu) against
 * their C references (kernels/linear.h, kernels/sparse.h): the gated delta rule over many
 * steps (F32 and BF16 states, the state compared too), the short convolution, attention over a
 * random block selection (GQA with and without a window, MLA latent), the Quest summary
 * (exactly) and score. Outputs are poisoned (0xff: NaN) before each launch.
 * Exits 77 without KVT_WITH_CUDA or a usable GPU; in KVT_CUDA_EMU builds it runs on the
 * emulation (ctest -L cuda).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/linear.h"
#include "kernels/sparse.h"
#include "support/kv_fixture.h"

#ifdef KVT_WITH_CUDA
#include <cuda_runtime.h>

#include "kernels/kernels_cuda.h"

#define TK_OK(call) assert_int_equal((int)(call), (int)cudaSuccess)

static void *
tk_up(const void *src, size_t len)
{
	void *d = NULL;

	TK_OK(cudaMalloc(&d, len ? len : 1));
	if (src && len)
		TK_OK(cudaMemcpy(d, src, len, cudaMemcpyHostToDevice));
	else
		TK_OK(cudaMemset(d, 0xff, len ? len : 1));
	return d;
}

static void
tk_down(void *dst, const void *src, size_t len)
{
	TK_OK(cudaDeviceSynchronize());
	TK_OK(cudaMemcpy(dst, src, len, cudaMemcpyDeviceToHost));
}

static void
tk_gdn_case(uint32_t nk, uint32_t nv, uint32_t dk, uint32_t dv, enum kvt_dtype dt,
	    uint32_t steps, double tol, uint64_t *rng)
{
	const struct kvt_gdn_shape s = { nk, nv, dk, dv, dt, 1 };
	const size_t sb = kvt_gdn_state_bytes(&s), nq = (size_t)nk * dk, no = (size_t)nv * dv;
	unsigned char *st = calloc(sb, 1), *st_got = malloc(sb);
	float *q = malloc(nq * 4), *k = malloc(nq * 4), *v = malloc(no * 4), *g = malloc(nv * 4);
	float *beta = malloc(nv * 4), *want = malloc(no * 4), *got = malloc(no * 4);
	float *scratch = malloc(2 * dk * 4), *sw = malloc(sb / (dt == KVT_DTYPE_F32 ? 4 : 2) * 4);
	float *sg = malloc(sb / (dt == KVT_DTYPE_F32 ? 4 : 2) * 4);
	void *dst = tk_up(st, sb);
	float *dq = tk_up(NULL, nq * 4), *dk_ = tk_up(NULL, nq * 4), *dv_ = tk_up(NULL, no * 4);
	float *dg = tk_up(NULL, nv * 4), *db = tk_up(NULL, nv * 4), *dout = tk_up(NULL, no * 4);

	assert_true(st && st_got && q && k && v && g && beta && want && got && scratch && sw && sg);
	for (uint32_t t = 0; t < steps; t++) {
		for (size_t i = 0; i < nq; i++) {
			q[i] = kvt_test_kv_uniform(rng, 1.0f);
			k[i] = kvt_test_kv_uniform(rng, 1.0f);
		}
		for (size_t i = 0; i < no; i++)
			v[i] = kvt_test_kv_uniform(rng, 1.0f);
		for (uint32_t h = 0; h < nv; h++) {
			g[h] = -0.3f - 0.3f * kvt_test_kv_uniform(rng, 1.0f);
			beta[h] = 0.5f + 0.45f * kvt_test_kv_uniform(rng, 1.0f);
		}
		assert_int_equal(kvt_gdn_step_ref(&s, st, q, k, v, g, beta, scratch, want), 0);
		TK_OK(cudaMemcpy(dq, q, nq * 4, cudaMemcpyHostToDevice));
		TK_OK(cudaMemcpy(dk_, k, nq * 4, cudaMemcpyHostToDevice));
		TK_OK(cudaMemcpy(dv_, v, no * 4, cudaMemcpyHostToDevice));
		TK_OK(cudaMemcpy(dg, g, nv * 4, cudaMemcpyHostToDevice));
		TK_OK(cudaMemcpy(db, beta, nv * 4, cudaMemcpyHostToDevice));
		TK_OK(cudaMemset(dout, 0xff, no * 4));
		if (kvt_gdn_step_cuda(&s, dst, dq, dk_, dv_, dg, db, dout, NULL))
			fail_msg("kvt_gdn_step_cuda: %s", kvt_last_error_message());
		tk_down(got, dout, no * 4);
		if (!(kvt_test_kv_relerr(got, want, no) <= tol))
			fail_msg("gdn cuda dtype %d step %u: relerr %g", (int)dt, t,
				 kvt_test_kv_relerr(got, want, no));
	}
	tk_down(st_got, dst, sb);
	assert_int_equal(kvt_load_f32(dt, sw, st, sb / (dt == KVT_DTYPE_F32 ? 4 : 2)), 0);
	assert_int_equal(kvt_load_f32(dt, sg, st_got, sb / (dt == KVT_DTYPE_F32 ? 4 : 2)), 0);
	if (!(kvt_test_kv_relerr(sg, sw, sb / (dt == KVT_DTYPE_F32 ? 4 : 2)) <= tol))
		fail_msg("gdn cuda dtype %d: state relerr %g", (int)dt,
			 kvt_test_kv_relerr(sg, sw, sb / (dt == KVT_DTYPE_F32 ? 4 : 2)));
	cudaFree(dst);
	cudaFree(dq);
	cudaFree(dk_);
	cudaFree(dv_);
	cudaFree(dg);
	cudaFree(db);
	cudaFree(dout);
	free(st);
	free(st_got);
	free(q);
	free(k);
	free(v);
	free(g);
	free(beta);
	free(want);
	free(got);
	free(scratch);
	free(sw);
	free(sg);
}

static void
test_gdn_cuda(void **state)
{
	uint64_t rng = 0x17;

	(void)state;
	tk_gdn_case(2, 4, 16, 16, KVT_DTYPE_F32, 12, 1e-5, &rng);
	tk_gdn_case(1, 2, 130, 200, KVT_DTYPE_F32, 4, 1e-5, &rng); /* v_dim > the threads */
	tk_gdn_case(2, 4, 16, 16, KVT_DTYPE_BF16, 8, 2e-2, &rng);
}

static void
test_conv_cuda(void **state)
{
	const uint32_t C = 300, K = 4, T = 9;
	const struct kvt_conv_shape s = { C, K, KVT_DTYPE_F32, 1 };
	float st[300 * 3] = { 0 }, stg[300 * 3], x[300], w[300 * 4], bias[300], want[300], got[300];
	uint64_t rng = 0xc0;
	void *dst = tk_up(st, sizeof st);
	float *dx = tk_up(NULL, sizeof x), *dw, *dbias, *dout = tk_up(NULL, sizeof got);

	(void)state;
	for (uint32_t i = 0; i < C * K; i++)
		w[i] = kvt_test_kv_uniform(&rng, 1.0f);
	for (uint32_t i = 0; i < C; i++)
		bias[i] = kvt_test_kv_uniform(&rng, 0.5f);
	dw = tk_up(w, sizeof w);
	dbias = tk_up(bias, sizeof bias);
	for (uint32_t t = 0; t < T; t++) {
		for (uint32_t i = 0; i < C; i++)
			x[i] = kvt_test_kv_uniform(&rng, 2.0f);
		assert_int_equal(kvt_conv_step_ref(&s, st, x, w, bias, want), 0);
		TK_OK(cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice));
		assert_int_equal(kvt_conv_step_cuda(&s, dst, dx, dw, dbias, dout, NULL), 0);
		tk_down(got, dout, sizeof got);
		assert_true(kvt_test_kv_relerr(got, want, C) <= 1e-6);
	}
	tk_down(stg, dst, sizeof stg);
	assert_memory_equal(stg, st, sizeof st); /* the shifted state: copies, exact */
	assert_int_equal(kvt_conv_step_cuda(&s, dst, dx, dw, NULL, dx, NULL), -EINVAL);
	cudaFree(dst);
	cudaFree(dx);
	cudaFree(dw);
	cudaFree(dbias);
	cudaFree(dout);
}

/* Random selection of a fixture's blocks: GQA (window or not) and the latent view. */
static void
tk_select_case(const struct kvt_test_kv_shape *s, enum kvt_dtype dt, uint64_t window,
	       uint64_t sink, uint32_t rope, uint64_t *rng)
{
	struct kvt_test_kv b;
	const int latent = rope != 0;
	const uint32_t h = s->n_heads, d = s->head_dim, r = latent ? d - rope : d;
	const size_t n_out = (size_t)h * r;
	float *want = malloc(n_out * 4), *got = malloc(n_out * 4);
	float *scratch = malloc(((size_t)s->seq_len + s->tpb) * 4);
	uint32_t *sel, n_sel = 0;
	void *hbm;
	uint32_t *dtable, *dsel;
	float *dq, *dqpe = NULL, *dout, *work;
	const float scale = 0.3f;

	assert_true(want && got && scratch);
	kvt_test_kv_build(&b, s, dt, rng);
	sel = malloc(b.n_blocks * sizeof *sel);
	assert_non_null(sel);
	for (uint32_t i = 0; i < b.n_blocks; i++)
		if (kvt_test_kv_rand(rng) % 3)
			sel[n_sel++] = i;
	if (!n_sel)
		sel[n_sel++] = b.n_blocks - 1;
	hbm = tk_up(b.hbm, b.hbm_bytes);
	dtable = tk_up(b.table, b.n_blocks * 4);
	dsel = tk_up(sel, n_sel * 4);
	dout = tk_up(NULL, n_out * 4);
	work = tk_up(NULL, kvt_attn_select_cuda_work_floats(h, n_sel, s->tpb) * 4);
	if (!latent) {
		struct kvt_paged_kv kv = b.kv, dkv;

		kv.window = window;
		kv.sink = sink;
		dkv = kv;
		dkv.k_base = (char *)hbm + ((const unsigned char *)b.kv.k_base - b.hbm);
		dkv.table = dtable;
		dq = tk_up(b.q, (size_t)h * d * 4);
		assert_int_equal(kvt_attn_select_ref(&kv, b.q, h, s->seq_len, sel, n_sel, scratch,
						     want), 0);
		if (kvt_attn_select_cuda(&dkv, dq, h, s->seq_len, dsel, n_sel, work, dout, NULL))
			fail_msg("kvt_attn_select_cuda: %s", kvt_last_error_message());
	} else {
		/* latent: K rows as [c_kv (d - rope) | k_pe (rope)], one head's q split likewise */
		struct kvt_paged_latent lk = { .base = b.kv.k_base, .block_stride = b.kv.block_stride,
					       .token_stride = b.kv.token_stride, .table = b.table,
					       .tokens_per_block = s->tpb, .kv_lora_rank = r,
					       .rope_dim = rope, .dtype = dt, .window = window,
					       .sink = sink };
		struct kvt_paged_latent dl = lk;
		float *ql = malloc(n_out * 4), *qp = malloc((size_t)h * rope * 4);

		assert_true(ql && qp);
		for (size_t i = 0; i < n_out; i++)
			ql[i] = kvt_test_kv_uniform(rng, 2.0f);
		for (size_t i = 0; i < (size_t)h * rope; i++)
			qp[i] = kvt_test_kv_uniform(rng, 2.0f);
		dl.base = (char *)hbm + ((const unsigned char *)b.kv.k_base - b.hbm);
		dl.table = dtable;
		dq = tk_up(ql, n_out * 4);
		dqpe = tk_up(qp, (size_t)h * rope * 4);
		assert_int_equal(kvt_attn_latent_select_ref(&lk, ql, qp, h, s->seq_len, sel, n_sel,
							    scale, scratch, want), 0);
		if (kvt_attn_latent_select_cuda(&dl, dq, dqpe, h, s->seq_len, dsel, n_sel, scale,
						work, dout, NULL))
			fail_msg("kvt_attn_latent_select_cuda: %s", kvt_last_error_message());
		free(ql);
		free(qp);
	}
	tk_down(got, dout, n_out * 4);
	if (!(kvt_test_kv_relerr(got, want, n_out) <= 1e-5))
		fail_msg("select cuda h %u d %u tpb %u seq %u dtype %d window %llu rope %u: "
			 "relerr %g", h, d, s->tpb, s->seq_len, (int)dt,
			 (unsigned long long)window, rope, kvt_test_kv_relerr(got, want, n_out));
	cudaFree(hbm);
	cudaFree(dtable);
	cudaFree(dsel);
	cudaFree(dout);
	cudaFree(work);
	cudaFree(dq);
	cudaFree(dqpe);
	kvt_test_kv_free(&b);
	free(sel);
	free(want);
	free(got);
	free(scratch);
}

static void
test_select_cuda(void **state)
{
	static const struct kvt_test_kv_shape gqa[] = {
		{ 4, 2, 16, 4, 37, 0 }, { 8, 8, 8, 16, 130, 4 }, { 16, 2, 64, 16, 300, 0 },
	};
	const struct kvt_test_kv_shape mla = { 4, 1, 40, 16, 128, 0 };
	uint64_t rng = 0x5e1;

	(void)state;
	for (size_t i = 0; i < 3; i++) {
		tk_select_case(&gqa[i], KVT_DTYPE_F32, 0, 0, 0, &rng);
		tk_select_case(&gqa[i], KVT_DTYPE_BF16, 20, 3, 0, &rng);
	}
	tk_select_case(&mla, KVT_DTYPE_F32, 0, 0, 8, &rng); /* the fixture's 32 + 8 */
	tk_select_case(&mla, KVT_DTYPE_F16, 50, 4, 8, &rng);
}

static void
test_quest_cuda(void **state)
{
	const struct kvt_test_kv_shape s = { 8, 2, 16, 16, 100, 0 };
	struct kvt_test_kv b;
	uint64_t rng = 0x9e;
	uint32_t blocks[7] = { 6, 0, 3, 5, 1, 2, 4 };
	const size_t per = kvt_quest_summary_floats(2, 16);
	float want[7 * 64], got[7 * 64], sw[8 * 7], sg[8 * 7];
	void *hbm;
	uint32_t *dtable, *dblocks;
	float *dsum, *dq, *dsc;
	struct kvt_paged_kv dkv;

	(void)state;
	kvt_test_kv_build(&b, &s, KVT_DTYPE_BF16, &rng);
	assert_int_equal(b.n_blocks, 7);
	hbm = tk_up(b.hbm, b.hbm_bytes);
	dtable = tk_up(b.table, 7 * 4);
	dblocks = tk_up(blocks, sizeof blocks);
	dsum = tk_up(NULL, 7 * per * 4);
	dq = tk_up(b.q, 8 * 16 * 4);
	dsc = tk_up(NULL, sizeof sg);
	dkv = b.kv;
	dkv.k_base = (char *)hbm + ((const unsigned char *)b.kv.k_base - b.hbm);
	dkv.table = dtable;
	assert_int_equal(kvt_quest_summary_ref(&b.kv, 100, blocks, 7, want), 0);
	assert_int_equal(kvt_quest_summary_cuda(&dkv, 100, dblocks, 7, dsum, NULL), 0);
	tk_down(got, dsum, 7 * per * 4);
	assert_memory_equal(got, want, 7 * per * 4);
	assert_int_equal(kvt_quest_score_ref(want, 7, 2, 16, b.q, 8, sw), 0);
	assert_int_equal(kvt_quest_score_cuda(dsum, 7, 2, 16, dq, 8, dsc, NULL), 0);
	tk_down(sg, dsc, sizeof sg);
	assert_true(kvt_test_kv_relerr(sg, sw, 56) <= 1e-6);
	assert_int_equal(kvt_quest_score_cuda(dsum, 7, 2, 16, dq, 3, dsc, NULL), -EINVAL);
	cudaFree(hbm);
	cudaFree(dtable);
	cudaFree(dblocks);
	cudaFree(dsum);
	cudaFree(dq);
	cudaFree(dsc);
	kvt_test_kv_free(&b);
}
#endif /* KVT_WITH_CUDA */

int
main(void)
{
#ifdef KVT_WITH_CUDA
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_gdn_cuda),
		cmocka_unit_test(test_conv_cuda),
		cmocka_unit_test(test_select_cuda),
		cmocka_unit_test(test_quest_cuda),
	};
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		printf("test_kernels17_cuda: no usable GPU: skipped\n");
		return 77;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
#else
	printf("test_kernels17_cuda: built without KVT_WITH_CUDA: skipped\n");
	return 77;
#endif
}
