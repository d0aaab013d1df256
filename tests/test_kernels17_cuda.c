/* SPDX-License-Identifier: MIT */
/*
 * tests/test_kernels17_cuda.c - issue 17's CUDA kernels (kernels/sparse_linear.cu) against
 * their C references (kernels/linear.h, kernels/sparse.h): the gated delta rule over many
 * steps (F32 and BF16 states, the state compared too), the short convolution, attention over a
 * random block selection (GQA with and without a window, MLA latent), the Quest summary
 * (exactly) and score, DSA's attention over token lists (gaps inside blocks, one token, none,
 * block positions, errors) and its indexer's scores. Outputs are poisoned (0xff: NaN) before
 * each launch.
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

/* Device copies of a token-list case's inputs and outputs. */
struct tk_tok_dev {
	float *q_lat, *q_pe, *work, *out, *m, *l;
	uint32_t *tokens;
};

/*
 * One token list on the GPU against the reference (out, m, l within 1e-5 of max |want|; the
 * device outputs poisoned first), @dkv the device view of @hkv.
 */
static void
tk_tokens_run(const struct kvt_paged_latent *hkv, const struct kvt_paged_latent *dkv,
	      const float *q_lat, const float *q_pe, uint32_t h, const uint32_t *tok, uint32_t n,
	      float scale, struct tk_tok_dev *d, const char *what)
{
	const uint32_t r = hkv->kv_lora_rank;
	const size_t n_out = (size_t)h * r;
	float *want = malloc(n_out * 4), *got = malloc(n_out * 4), *scratch = malloc(n * 4 + 4);
	float *mw = malloc(h * 4), *lw = malloc(h * 4), *mg = malloc(h * 4), *lg = malloc(h * 4);
	double em = 0, scale_m = 1;

	assert_true(want && got && scratch && mw && lw && mg && lg);
	assert_int_equal(kvt_attn_latent_tokens_partial_ref(hkv, q_lat, q_pe, h, tok, n, scale,
							    scratch, want, mw, lw), 0);
	if (n)
		TK_OK(cudaMemcpy(d->tokens, tok, n * 4, cudaMemcpyHostToDevice));
	TK_OK(cudaMemset(d->out, 0xff, n_out * 4));
	TK_OK(cudaMemset(d->m, 0xff, h * 4));
	TK_OK(cudaMemset(d->l, 0xff, h * 4));
	if (kvt_attn_latent_tokens_partial_cuda(dkv, d->q_lat, d->q_pe, h, n ? d->tokens : NULL,
						n, scale, n ? d->work : NULL, d->out, d->m, d->l,
						NULL))
		fail_msg("%s: kvt_attn_latent_tokens_partial_cuda: %s", what,
			 kvt_last_error_message());
	tk_down(got, d->out, n_out * 4);
	tk_down(mg, d->m, h * 4);
	tk_down(lg, d->l, h * 4);
	if (!n) {
		for (size_t i = 0; i < n_out; i++)
			assert_true(got[i] == 0.0f);
		for (uint32_t i = 0; i < h; i++) {
			assert_true(isinf(mg[i]) && mg[i] < 0 && isinf(mw[i]) && mw[i] < 0);
			assert_true(lg[i] == 0.0f && lw[i] == 0.0f);
		}
	} else {
		for (uint32_t i = 0; i < h; i++) {
			em = fmax(em, fabs((double)mg[i] - mw[i]));
			scale_m = fmax(scale_m, fabs((double)mw[i]));
			if (mg[i] != mg[i])
				em = INFINITY;
		}
		if (!(kvt_test_kv_relerr(got, want, n_out) <= 1e-5) ||
		    !(kvt_test_kv_relerr(lg, lw, h) <= 1e-5) || !(em <= 1e-5 * scale_m))
			fail_msg("%s (h %u r %u rope %u tpb %u dtype %d, %u tokens): out relerr %g, "
				 "l relerr %g, m err %g", what, h, r, hkv->rope_dim,
				 hkv->tokens_per_block, (int)hkv->dtype, n,
				 kvt_test_kv_relerr(got, want, n_out),
				 kvt_test_kv_relerr(lg, lw, h), em);
	}
	free(want);
	free(got);
	free(scratch);
	free(mw);
	free(lw);
	free(mg);
	free(lg);
}

/* 1 when every float of x[0..n) is NaN. */
static int
tk_all_nan(const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (x[i] == x[i])
			return 0;
	return 1;
}

/*
 * DSA's token lists on a fixture's latent (rows [c_kv (r) | k_pe (rope)]): a random subset with
 * gaps inside blocks (the rows left out overwritten with NaN, so reading one shows), one token,
 * a contiguous run longer than the thread block, the empty list; with a dense table and with
 * block positions (only the blocks holding a listed token); then tokens the host cannot check
 * (past kv->seq_len, a block missing from pos): NaN outputs, no stray read (ASan).
 */
static void
tk_tokens_case(uint32_t h, uint32_t r, uint32_t rope, uint32_t tpb, uint32_t seq,
	       enum kvt_dtype dt, uint64_t *rng)
{
	const struct kvt_test_kv_shape s = { 1, 1, r + rope, tpb, seq, 4 };
	const size_t n_out = (size_t)h * r, esize = dt == KVT_DTYPE_F32 ? 4 : 2;
	const size_t row = (size_t)(r + rope) * esize;
	const float scale = 1.0f / sqrtf((float)(r + rope));
	float *q_lat = malloc(n_out * 4), *q_pe = malloc(((size_t)h * rope + 1) * 4);
	float *got = malloc(n_out * 4), mg[64], lg[64];
	uint32_t *tok = malloc(seq * sizeof(uint32_t)), *run = malloc(seq * sizeof(uint32_t));
	uint32_t *live, *pos, n = 0, n_run = 0, nb = 0, one;
	struct kvt_paged_latent lk, dl;
	struct kvt_test_kv b;
	struct tk_tok_dev d;
	uint32_t *dlive, *dpos, *dtable;
	void *hbm;

	assert_true(h <= 64 && q_lat && q_pe && got && tok && run);
	kvt_test_kv_build(&b, &s, dt, rng);
	for (size_t i = 0; i < n_out; i++)
		q_lat[i] = kvt_test_kv_uniform(rng, 2.0f);
	for (size_t i = 0; i < (size_t)h * rope; i++)
		q_pe[i] = kvt_test_kv_uniform(rng, 2.0f);
	for (uint32_t t = seq / 4; t < seq; t++)
		run[n_run++] = t;
	for (uint32_t t = 0; t < seq; t++) {
		unsigned char *p = (unsigned char *)b.kv.k_base +
				   (uint64_t)b.table[t / tpb] * b.kv.block_stride +
				   (t % tpb) * b.kv.token_stride;

		if (kvt_test_kv_rand(rng) % 3 == 0 || (n == 0 && t == seq - 1))
			tok[n++] = t;
		else if (t < seq / 4)
			memset(p, 0xff, row); /* left out, and not in the run either */
	}
	assert_true(n >= 2 && n < seq);
	hbm = tk_up(b.hbm, b.hbm_bytes);
	dtable = tk_up(b.table, b.n_blocks * 4);
	d.q_lat = tk_up(q_lat, n_out * 4);
	d.q_pe = rope ? tk_up(q_pe, (size_t)h * rope * 4) : NULL;
	d.tokens = tk_up(NULL, seq * 4);
	d.work = tk_up(NULL, kvt_attn_latent_tokens_cuda_work_floats(h, seq) * 4);
	d.out = tk_up(NULL, n_out * 4);
	d.m = tk_up(NULL, h * 4);
	d.l = tk_up(NULL, h * 4);
	lk = (struct kvt_paged_latent){ .base = b.kv.k_base, .block_stride = b.kv.block_stride,
					.token_stride = b.kv.token_stride, .table = b.table,
					.tokens_per_block = tpb, .kv_lora_rank = r,
					.rope_dim = rope, .dtype = dt, .seq_len = seq,
					.window = 5, .sink = 1 /* ignored */ };
	dl = lk;
	dl.base = (char *)hbm + ((const unsigned char *)b.kv.k_base - b.hbm);
	dl.table = dtable;
	tk_tokens_run(&lk, &dl, q_lat, q_pe, h, tok, n, scale, &d, "subset");
	one = tok[n / 2];
	tk_tokens_run(&lk, &dl, q_lat, q_pe, h, &one, 1, scale, &d, "one token");
	tk_tokens_run(&lk, &dl, q_lat, q_pe, h, run, n_run, scale, &d, "run");
	tk_tokens_run(&lk, &dl, q_lat, q_pe, h, NULL, 0, scale, &d, "empty");
	lk.seq_len = dl.seq_len = 0; /* unbounded: the list alone */
	tk_tokens_run(&lk, &dl, q_lat, q_pe, h, tok, n, scale, &d, "subset, seq_len 0");
	lk.seq_len = dl.seq_len = seq;

	/* block positions: only the blocks holding a listed token */
	live = malloc(b.n_blocks * sizeof(uint32_t));
	pos = malloc(b.n_blocks * sizeof(uint32_t));
	assert_true(live && pos);
	for (uint32_t i = 0; i < n; i++)
		if (!nb || pos[nb - 1] != tok[i] / tpb) {
			pos[nb] = tok[i] / tpb;
			live[nb++] = b.table[tok[i] / tpb];
		}
	dlive = tk_up(live, nb * 4);
	dpos = tk_up(pos, nb * 4);
	lk.table = live;
	lk.pos = pos;
	lk.n_entries = nb;
	dl.table = dlive;
	dl.pos = dpos;
	dl.n_entries = nb;
	tk_tokens_run(&lk, &dl, q_lat, q_pe, h, tok, n, scale, &d, "subset, pos");
	tk_tokens_run(&lk, &dl, q_lat, q_pe, h, &tok[n - 1], 1, scale, &d, "one token, pos");
	tk_tokens_run(&lk, &dl, q_lat, q_pe, h, NULL, 0, scale, &d, "empty, pos");

	/* what the host cannot see: the reference refuses, the kernel writes NaN */
	if (nb > 1) { /* the last listed token's block missing from pos */
		lk.n_entries = dl.n_entries = nb - 1;
		assert_int_equal(kvt_attn_latent_tokens_partial_ref(&lk, q_lat, q_pe, h, tok, n,
								    scale, got, got, mg, lg),
				 -EINVAL);
		TK_OK(cudaMemcpy(d.tokens, tok, n * 4, cudaMemcpyHostToDevice));
		assert_int_equal(kvt_attn_latent_tokens_partial_cuda(&dl, d.q_lat, d.q_pe, h,
								     d.tokens, n, scale, d.work,
								     d.out, d.m, d.l, NULL), 0);
		tk_down(got, d.out, n_out * 4);
		tk_down(mg, d.m, h * 4);
		tk_down(lg, d.l, h * 4);
		assert_true(tk_all_nan(got, n_out) && tk_all_nan(mg, h) && tk_all_nan(lg, h));
		lk.n_entries = dl.n_entries = nb;
	}
	dl.pos = NULL;
	dl.table = dtable;
	dl.n_entries = 0;
	one = seq; /* past kv->seq_len */
	TK_OK(cudaMemcpy(d.tokens, &one, 4, cudaMemcpyHostToDevice));
	assert_int_equal(kvt_attn_latent_tokens_partial_cuda(&dl, d.q_lat, d.q_pe, h, d.tokens, 1,
							     scale, d.work, d.out, d.m, d.l, NULL),
			 0);
	tk_down(got, d.out, n_out * 4);
	tk_down(mg, d.m, h * 4);
	assert_true(tk_all_nan(got, n_out) && tk_all_nan(mg, h));

	cudaFree(hbm);
	cudaFree(dtable);
	cudaFree(dlive);
	cudaFree(dpos);
	cudaFree(d.q_lat);
	cudaFree(d.q_pe);
	cudaFree(d.tokens);
	cudaFree(d.work);
	cudaFree(d.out);
	cudaFree(d.m);
	cudaFree(d.l);
	kvt_test_kv_free(&b);
	free(live);
	free(pos);
	free(q_lat);
	free(q_pe);
	free(got);
	free(tok);
	free(run);
}

static void
test_tokens_cuda(void **state)
{
	uint64_t rng = 0xd5a17;

	(void)state;
	tk_tokens_case(4, 32, 8, 4, 127, KVT_DTYPE_F32, &rng); /* the deepseek-v32 fixture's */
	tk_tokens_case(16, 64, 16, 8, 300, KVT_DTYPE_BF16, &rng);
	tk_tokens_case(3, 24, 0, 5, 40, KVT_DTYPE_F16, &rng); /* no rope part */
	tk_tokens_case(2, 512, 64, 64, 200, KVT_DTYPE_BF16, &rng); /* DeepSeek-V3.2's latent */
	tk_tokens_case(5, 130, 2, 16, 170, KVT_DTYPE_F32, &rng); /* r past the thread block */
}

/* The host checks: each refused as the reference refuses it (-EINVAL), nothing queued. */
static void
test_tokens_cuda_errors(void **state)
{
	enum { H = 2, R = 16, PE = 4, TPB = 4, SEQ = 12 };
	float *base = tk_up(NULL, 64 * 4 * (R + PE) * 4), *ql = tk_up(NULL, H * R * 4);
	float *qp = tk_up(NULL, H * PE * 4), *work = tk_up(NULL, H * SEQ * 4);
	float *out = tk_up(NULL, H * R * 4), *m = tk_up(NULL, H * 4), *l = tk_up(NULL, H * 4);
	static const uint32_t table[3] = { 2, 0, 1 }, tok[2] = { 1, 9 }, pos[3] = { 0, 1, 2 };
	uint32_t *dtable = tk_up(table, sizeof table), *dtok = tk_up(tok, sizeof tok);
	const struct kvt_paged_latent good = { .base = base, .block_stride = TPB * (R + PE) * 4,
					       .token_stride = (R + PE) * 4, .table = dtable,
					       .tokens_per_block = TPB, .kv_lora_rank = R,
					       .rope_dim = PE, .dtype = KVT_DTYPE_F32,
					       .seq_len = SEQ };
	struct kvt_paged_latent kv;
	float hs[512], ho[H * R], hm[H], hl[H];
	const float sc = 0.25f;

	(void)state;
#define TK_EINVAL(kvp, qlp, qpp, nh, tp, n, s, wp, op, mp, lp)                                    \
	do {                                                                                      \
		assert_int_equal(kvt_attn_latent_tokens_partial_cuda(kvp, qlp, qpp, nh, tp, n, s,  \
								     wp, op, mp, lp, NULL),      \
				 -EINVAL);                                                        \
	} while (0)
	TK_EINVAL(NULL, ql, qp, H, dtok, 2, sc, work, out, m, l);
	TK_EINVAL(&good, NULL, qp, H, dtok, 2, sc, work, out, m, l);
	TK_EINVAL(&good, ql, NULL, H, dtok, 2, sc, work, out, m, l); /* rope_dim 4 */
	TK_EINVAL(&good, ql, qp, H, NULL, 2, sc, work, out, m, l);
	TK_EINVAL(&good, ql, qp, H, dtok, 2, sc, NULL, out, m, l);
	TK_EINVAL(&good, ql, qp, H, dtok, 2, sc, work, NULL, m, l);
	TK_EINVAL(&good, ql, qp, H, dtok, 2, sc, work, out, NULL, l);
	TK_EINVAL(&good, ql, qp, H, dtok, 2, sc, work, out, m, NULL);
	TK_EINVAL(&good, ql, qp, 0, dtok, 2, sc, work, out, m, l);
	TK_EINVAL(&good, ql, qp, H, dtok, 2, 0.0f, work, out, m, l);
	TK_EINVAL(&good, ql, qp, H, dtok, 2, INFINITY, work, out, m, l);
	TK_EINVAL(&good, ql, qp, H, dtok, 2, NAN, work, out, m, l);
	/* the same refused by the reference (host copies of the shapes) */
	kv = good;
	kv.table = table;
	assert_int_equal(kvt_attn_latent_tokens_partial_ref(&kv, hs, NULL, H, tok, 2, sc, hs, ho,
							    hm, hl), -EINVAL);
	assert_int_equal(kvt_attn_latent_tokens_partial_ref(&kv, hs, hs, 0, tok, 2, sc, hs, ho,
							    hm, hl), -EINVAL);
	assert_int_equal(kvt_attn_latent_tokens_partial_ref(&kv, hs, hs, H, tok, 2, 0.0f, hs, ho,
							    hm, hl), -EINVAL);
	kv = good;
	kv.base = NULL;
	TK_EINVAL(&kv, ql, qp, H, dtok, 2, sc, work, out, m, l);
	kv = good;
	kv.table = NULL;
	TK_EINVAL(&kv, ql, qp, H, dtok, 2, sc, work, out, m, l);
	kv = good;
	kv.kv_lora_rank = 0;
	TK_EINVAL(&kv, ql, qp, H, dtok, 2, sc, work, out, m, l);
	kv = good;
	kv.tokens_per_block = 0;
	TK_EINVAL(&kv, ql, qp, H, dtok, 2, sc, work, out, m, l);
	kv = good;
	kv.dtype = KVT_DTYPE_INT8;
	TK_EINVAL(&kv, ql, qp, H, dtok, 2, sc, work, out, m, l);
	kv = good;
	kv.token_stride = (R + PE) * 4 - 4; /* below one vector */
	TK_EINVAL(&kv, ql, qp, H, dtok, 2, sc, work, out, m, l);
	kv.table = table;
	kv.base = hs;
	assert_int_equal(kvt_attn_latent_tokens_partial_ref(&kv, hs, hs, H, tok, 2, sc, hs, ho,
							    hm, hl), -EINVAL);
	kv = good;
	kv.pos = pos; /* n_entries 0 */
	TK_EINVAL(&kv, ql, qp, H, dtok, 2, sc, work, out, m, l);
	kv = good;
	kv.dtype = KVT_DTYPE_BF16;
	kv.token_stride = (R + PE) * 2 + 1; /* odd: not a multiple of 2 bytes */
	TK_EINVAL(&kv, ql, qp, H, dtok, 2, sc, work, out, m, l);
	kv = good;
	kv.base = (char *)base + 2; /* f32 at 2 bytes */
	TK_EINVAL(&kv, ql, qp, H, dtok, 2, sc, work, out, m, l);
#undef TK_EINVAL
	/* n_tokens 0: tokens and work may be NULL, pos unread */
	kv = good;
	kv.pos = pos;
	assert_int_equal(kvt_attn_latent_tokens_partial_cuda(&kv, ql, qp, H, NULL, 0, sc, NULL,
							     out, m, l, NULL), 0);
	tk_down(hm, m, sizeof hm);
	assert_true(isinf(hm[0]) && hm[0] < 0 && isinf(hm[1]) && hm[1] < 0);
	assert_int_equal(kvt_attn_latent_tokens_cuda_work_floats(H, SEQ), H * SEQ);
	cudaFree(base);
	cudaFree(ql);
	cudaFree(qp);
	cudaFree(work);
	cudaFree(out);
	cudaFree(m);
	cudaFree(l);
	cudaFree(dtable);
	cudaFree(dtok);
}

/*
 * The lightning indexer's scores on the GPU against the reference (within 1e-5 of max |want|),
 * q and w staged in shared memory and not (n_heads * (head_dim + 1) > 12288), a key every head
 * scores below 0 (exactly 0 both ways); n 0 writes nothing; the reference's errors.
 */
static void
tk_dsa_case(uint32_t nh, uint32_t d, uint64_t n, uint64_t stride, uint64_t *rng)
{
	float *q = malloc((size_t)nh * d * 4), *w = malloc(nh * 4);
	float *keys = malloc(n * stride * 4), *want = malloc(n * 4), *got = malloc(n * 4);
	float *dq, *dw, *dkeys, *dsc;
	const float scale = 1.0f / sqrtf((float)d);
	const uint64_t neg = n / 2;

	assert_true(q && w && keys && want && got && n > 1);
	for (size_t i = 0; i < (size_t)nh * d; i++)
		q[i] = kvt_test_kv_uniform(rng, 1.0f) + 0.25f; /* mostly positive */
	for (uint32_t i = 0; i < nh; i++)
		w[i] = kvt_test_kv_uniform(rng, 1.0f) * (1.0f / sqrtf((float)nh));
	for (size_t i = 0; i < n * stride; i++)
		keys[i] = kvt_test_kv_uniform(rng, 1.0f);
	for (uint32_t i = 0; i < d; i++)
		keys[neg * stride + i] = -2.0f; /* q . k < 0 for every head whose q sums > 0 */
	for (uint32_t hh = 0; hh < nh; hh++) {
		float sum = 0.0f;

		for (uint32_t i = 0; i < d; i++)
			sum += q[(size_t)hh * d + i];
		if (sum <= 0.0f)
			q[(size_t)hh * d] += 1.0f - sum; /* make it so */
	}
	dq = tk_up(q, (size_t)nh * d * 4);
	dw = tk_up(w, nh * 4);
	dkeys = tk_up(keys, n * stride * 4);
	dsc = tk_up(NULL, n * 4);
	assert_int_equal(kvt_dsa_index_scores_ref(q, w, nh, d, scale, keys, stride, n, want), 0);
	if (kvt_dsa_index_scores_cuda(dq, dw, nh, d, scale, dkeys, stride, n, dsc, NULL))
		fail_msg("kvt_dsa_index_scores_cuda: %s", kvt_last_error_message());
	tk_down(got, dsc, n * 4);
	if (!(kvt_test_kv_relerr(got, want, n) <= 1e-5))
		fail_msg("dsa scores cuda h %u d %u n %llu stride %llu: relerr %g", nh, d,
			 (unsigned long long)n, (unsigned long long)stride,
			 kvt_test_kv_relerr(got, want, n));
	assert_true(want[neg] == 0.0f && got[neg] == 0.0f);
	/* n 0: nothing written, keys may be NULL */
	TK_OK(cudaMemset(dsc, 0xff, n * 4));
	assert_int_equal(kvt_dsa_index_scores_cuda(dq, dw, nh, d, scale, NULL, stride, 0, dsc,
						   NULL), 0);
	tk_down(got, dsc, n * 4);
	assert_true(tk_all_nan(got, n));
	cudaFree(dq);
	cudaFree(dw);
	cudaFree(dkeys);
	cudaFree(dsc);
	free(q);
	free(w);
	free(keys);
	free(want);
	free(got);
}

static void
test_dsa_scores_cuda(void **state)
{
	uint64_t rng = 0x1de17;
	float *dq = tk_up(NULL, 64 * 4), *dw = tk_up(NULL, 8 * 4), *dk = tk_up(NULL, 64 * 4);
	float *dsc = tk_up(NULL, 8 * 4), hq[64], hw[8], hk[64], hs[8];

	(void)state;
	tk_dsa_case(5, 12, 40, 14, &rng);
	tk_dsa_case(64, 128, 700, 128, &rng); /* DeepSeek-V3.2's indexer: 64 heads of 128 */
	tk_dsa_case(100, 128, 300, 130, &rng); /* q and w not staged */
	tk_dsa_case(1, 1, 200, 1, &rng);
	/* errors, as the reference */
	memset(hq, 0, sizeof hq);
	memset(hw, 0, sizeof hw);
	memset(hk, 0, sizeof hk);
	assert_int_equal(kvt_dsa_index_scores_cuda(NULL, dw, 2, 8, 0.5f, dk, 8, 8, dsc, NULL),
			 -EINVAL);
	assert_int_equal(kvt_dsa_index_scores_cuda(dq, NULL, 2, 8, 0.5f, dk, 8, 8, dsc, NULL),
			 -EINVAL);
	assert_int_equal(kvt_dsa_index_scores_cuda(dq, dw, 2, 8, 0.5f, NULL, 8, 8, dsc, NULL),
			 -EINVAL);
	assert_int_equal(kvt_dsa_index_scores_cuda(dq, dw, 2, 8, 0.5f, dk, 8, 8, NULL, NULL),
			 -EINVAL);
	assert_int_equal(kvt_dsa_index_scores_cuda(dq, dw, 0, 8, 0.5f, dk, 8, 8, dsc, NULL),
			 -EINVAL);
	assert_int_equal(kvt_dsa_index_scores_cuda(dq, dw, 2, 0, 0.5f, dk, 8, 8, dsc, NULL),
			 -EINVAL);
	assert_int_equal(kvt_dsa_index_scores_cuda(dq, dw, 2, 8, 0.5f, dk, 7, 8, dsc, NULL),
			 -EINVAL);
	assert_int_equal(kvt_dsa_index_scores_ref(hq, hw, 2, 8, 0.5f, NULL, 8, 8, hs), -EINVAL);
	assert_int_equal(kvt_dsa_index_scores_ref(hq, hw, 2, 0, 0.5f, hk, 8, 8, hs), -EINVAL);
	assert_int_equal(kvt_dsa_index_scores_ref(hq, hw, 2, 8, 0.5f, hk, 7, 8, hs), -EINVAL);
	assert_int_equal(kvt_dsa_index_scores_ref(hq, hw, 2, 8, 0.5f, NULL, 8, 0, hs), 0);
	cudaFree(dq);
	cudaFree(dw);
	cudaFree(dk);
	cudaFree(dsc);
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
		cmocka_unit_test(test_tokens_cuda),
		cmocka_unit_test(test_tokens_cuda_errors),
		cmocka_unit_test(test_dsa_scores_cuda),
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
