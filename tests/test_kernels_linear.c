/* SPDX-License-Identifier: MIT */
/*
 * tests/test_kernels_linear.c - the Gated DeltaNet decode kernels' C reference
 * (kernels/linear.h): the gated delta rule step against a matrix-form implementation in double
 * precision written here (S' = d S + beta kn (v - d S^T kn)^T, out = S'^T qn) over many steps,
 * for F32/F16/BF16 states and GQA-style key-head sharing; the delta rule's defining property
 * (a written value is read back by its key, an orthogonal key's write leaves it alone, decay
 * scales it); the gates' formulas; the short convolution step against a direct causal
 * convolution of the whole sequence (zero left padding, as transformers); argument errors.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/linear.h"
#include "support/kv_fixture.h"

static double
tl_round(enum kvt_dtype dt, double x)
{
	if (dt == KVT_DTYPE_F16)
		return kvt_f16_to_f32(kvt_f32_to_f16((float)x));
	if (dt == KVT_DTYPE_BF16)
		return kvt_bf16_to_f32(kvt_f32_to_bf16((float)x));
	return x;
}

/* The naive step in double: S [nv][dk][dv], rounded to dt after the step like the kernel. */
static void
tl_naive_gdn(const struct kvt_gdn_shape *s, double *S, const float *q, const float *k,
	     const float *v, const float *g, const float *beta, double *out)
{
	const uint32_t dk = s->k_dim, dv = s->v_dim, grp = s->n_v_heads / s->n_k_heads;
	double *qn = malloc(dk * sizeof(double)), *kn = malloc(dk * sizeof(double));
	double *u = malloc(dv * sizeof(double));

	assert_true(qn && kn && u);
	for (uint32_t h = 0; h < s->n_v_heads; h++) {
		const float *qh = q + (size_t)(h / grp) * dk, *kh = k + (size_t)(h / grp) * dk;
		double *Sh = S + (size_t)h * dk * dv, nq = 0, nk = 0, d = exp((double)g[h]);

		for (uint32_t i = 0; i < dk; i++) {
			nq += (double)qh[i] * qh[i];
			nk += (double)kh[i] * kh[i];
		}
		nq = s->l2norm ? 1.0 / sqrt(nq + 1e-6) : 1.0;
		nk = s->l2norm ? 1.0 / sqrt(nk + 1e-6) : 1.0;
		for (uint32_t i = 0; i < dk; i++) {
			qn[i] = qh[i] * nq / sqrt((double)dk);
			kn[i] = kh[i] * nk;
		}
		/* u = v - d S^T kn ; S = d S + beta kn u^T ; out = S^T qn */
		for (uint32_t j = 0; j < dv; j++) {
			double m = 0;

			for (uint32_t i = 0; i < dk; i++)
				m += Sh[(size_t)i * dv + j] * kn[i];
			u[j] = v[(size_t)h * dv + j] - d * m;
		}
		for (uint32_t i = 0; i < dk; i++)
			for (uint32_t j = 0; j < dv; j++) {
				double *e = &Sh[(size_t)i * dv + j];

				*e = tl_round(s->dtype, d * *e + beta[h] * kn[i] * u[j]);
			}
		for (uint32_t j = 0; j < dv; j++) {
			double o = 0;

			for (uint32_t i = 0; i < dk; i++)
				o += Sh[(size_t)i * dv + j] * qn[i];
			out[(size_t)h * dv + j] = o;
		}
	}
	free(qn);
	free(kn);
	free(u);
}

static void
tl_gdn_case(uint32_t nk, uint32_t nv, uint32_t dk, uint32_t dv, enum kvt_dtype dt, int l2,
	    uint32_t steps, double tol, uint64_t *rng)
{
	const struct kvt_gdn_shape s = { nk, nv, dk, dv, dt, l2 };
	const size_t ns = (size_t)nv * dk * dv, esize = dt == KVT_DTYPE_F32 ? 4 : 2;
	unsigned char *state = calloc(ns, esize);
	double *S = calloc(ns, sizeof(double)), *want = malloc((size_t)nv * dv * sizeof(double));
	float *q = malloc((size_t)nk * dk * 4), *k = malloc((size_t)nk * dk * 4);
	float *v = malloc((size_t)nv * dv * 4), *g = malloc(nv * 4), *beta = malloc(nv * 4);
	float *out = malloc((size_t)nv * dv * 4), *scratch = malloc(2 * dk * 4);
	double worst = 0, scale = 0;

	assert_true(state && S && want && q && k && v && g && beta && out && scratch);
	assert_int_equal(kvt_gdn_state_bytes(&s), ns * esize);
	for (uint32_t t = 0; t < steps; t++) {
		for (size_t i = 0; i < (size_t)nk * dk; i++) {
			q[i] = kvt_test_kv_uniform(rng, 1.0f);
			k[i] = kvt_test_kv_uniform(rng, 1.0f);
		}
		for (size_t i = 0; i < (size_t)nv * dv; i++)
			v[i] = kvt_test_kv_uniform(rng, 1.0f);
		for (uint32_t h = 0; h < nv; h++) {
			g[h] = -0.3f - 0.3f * kvt_test_kv_uniform(rng, 1.0f); /* decay 0.55..0.85 */
			beta[h] = 0.5f + 0.45f * kvt_test_kv_uniform(rng, 1.0f);
		}
		assert_int_equal(kvt_gdn_step_ref(&s, state, q, k, v, g, beta, scratch, out), 0);
		tl_naive_gdn(&s, S, q, k, v, g, beta, want);
		for (size_t i = 0; i < (size_t)nv * dv; i++) {
			double e = fabs(out[i] - want[i]);

			if (!(e <= worst))
				worst = e;
			if (fabs(want[i]) > scale)
				scale = fabs(want[i]);
		}
	}
	/* the state itself, after all steps */
	for (size_t i = 0; i < ns; i++) {
		float x;

		assert_int_equal(kvt_load_f32(dt, &x, state + i * esize, 1), 0);
		if (!(fabs(x - S[i]) <= tol * 4))
			fail_msg("state[%zu] %g, naive %g (dtype %d)", i, (double)x, S[i], (int)dt);
	}
	if (!(scale > 0.05 && worst / scale <= tol))
		fail_msg("gdn nk %u nv %u dk %u dv %u dtype %d l2 %d: relerr %g (scale %g)", nk, nv,
			 dk, dv, (int)dt, l2, worst / scale, scale);
	free(state);
	free(S);
	free(want);
	free(q);
	free(k);
	free(v);
	free(g);
	free(beta);
	free(out);
	free(scratch);
}

static void
test_gdn_vs_naive(void **st)
{
	uint64_t rng = 17;

	(void)st;
	tl_gdn_case(2, 4, 16, 16, KVT_DTYPE_F32, 1, 40, 1e-5, &rng); /* the fixture's shape */
	tl_gdn_case(1, 1, 5, 3, KVT_DTYPE_F32, 1, 30, 1e-5, &rng);
	tl_gdn_case(3, 3, 8, 12, KVT_DTYPE_F32, 0, 30, 1e-5, &rng); /* no l2norm */
	tl_gdn_case(2, 8, 32, 24, KVT_DTYPE_F32, 1, 20, 1e-5, &rng);
	/* 16-bit states: the naive state is rounded the same way; rounding ties may differ */
	tl_gdn_case(2, 4, 16, 16, KVT_DTYPE_BF16, 1, 20, 2e-2, &rng);
	tl_gdn_case(2, 4, 16, 16, KVT_DTYPE_F16, 1, 20, 3e-3, &rng);
}

/* The delta rule stores v under key k: reading with q = k returns v (here / sqrt(dk)). */
static void
test_gdn_retrieves_what_it_wrote(void **st)
{
	enum { DK = 4, DV = 3 };
	const struct kvt_gdn_shape s = { 1, 1, DK, DV, KVT_DTYPE_F32, 1 };
	float state[DK * DV] = { 0 }, scratch[2 * DK], out[DV];
	const float k1[DK] = { 2, 0, 0, 0 }, k2[DK] = { 0, 0, 3, 0 };
	const float v1[DV] = { 1, -2, 0.5f }, v2[DV] = { 4, 4, -4 };
	const float g0 = 0.0f, one = 1.0f, zero = 0.0f, ghalf = logf(0.5f);
	const float r = 1.0f / sqrtf((float)DK);

	(void)st;
	/* write (k1, v1) with beta 1, no decay; the output reads k1 back */
	assert_int_equal(kvt_gdn_step_ref(&s, state, k1, k1, v1, &g0, &one, scratch, out), 0);
	for (int j = 0; j < DV; j++)
		assert_float_equal(out[j], v1[j] * r, 1e-6);
	/* write (k2, v2): k2 is orthogonal to k1, so reading k1 still gives v1 */
	assert_int_equal(kvt_gdn_step_ref(&s, state, k1, k2, v2, &g0, &one, scratch, out), 0);
	for (int j = 0; j < DV; j++)
		assert_float_equal(out[j], v1[j] * r, 1e-6);
	/* beta 0 writes nothing; g = log 0.5 halves the state: reading k2 gives v2 / 2 */
	assert_int_equal(kvt_gdn_step_ref(&s, state, k2, k1, v1, &ghalf, &zero, scratch, out), 0);
	for (int j = 0; j < DV; j++)
		assert_float_equal(out[j], v2[j] * r * 0.5f, 1e-6);
	/* overwrite k1 with beta 1: the delta rule replaces (not adds to) the value under k1 */
	assert_int_equal(kvt_gdn_step_ref(&s, state, k1, k1, v2, &g0, &one, scratch, out), 0);
	for (int j = 0; j < DV; j++)
		assert_float_equal(out[j], v2[j] * r, 1e-6);
}

static void
test_gdn_gates(void **st)
{
	const float A_log[3] = { 0.0f, 1.0f, -2.0f }, dt_bias[3] = { 0.5f, -1.0f, 0.0f };
	const float a[3] = { 0.1f, 30.0f, -5.0f }, b[3] = { 0.0f, 2.0f, -3.0f };
	float g[3], beta[3];

	(void)st;
	assert_int_equal(kvt_gdn_gates_ref(A_log, dt_bias, a, b, 3, g, beta), 0);
	for (int h = 0; h < 3; h++) {
		double x = (double)a[h] + dt_bias[h];
		double sp = x > 20 ? x : log1p(exp(x));

		assert_float_equal(g[h], -exp((double)A_log[h]) * sp, 1e-5 * (1 + fabs(g[h])));
		assert_float_equal(beta[h], 1.0 / (1.0 + exp(-(double)b[h])), 1e-6);
	}
	assert_float_equal(g[1], -exp(1.0) * 29.0, 1e-4); /* softplus above 20 is the identity */
	assert_int_equal(kvt_gdn_gates_ref(A_log, dt_bias, a, b, 0, g, beta), -EINVAL);
	assert_int_equal(kvt_gdn_gates_ref(NULL, dt_bias, a, b, 3, g, beta), -EINVAL);
}

static void
test_gdn_errors(void **st)
{
	struct kvt_gdn_shape s = { 2, 4, 4, 4, KVT_DTYPE_F32, 1 };
	float state[4 * 4 * 4], q[8] = { 1 }, k[8] = { 1 }, v[16] = { 1 }, g[4] = { 0 };
	float beta[4] = { 1, 1, 1, 1 }, scratch[8], out[16];
	float keep[4 * 4 * 4];

	(void)st;
	for (int i = 0; i < 64; i++)
		state[i] = keep[i] = (float)i;
	assert_int_equal(kvt_gdn_step_ref(NULL, state, q, k, v, g, beta, scratch, out), -EINVAL);
	assert_int_equal(kvt_gdn_step_ref(&s, NULL, q, k, v, g, beta, scratch, out), -EINVAL);
	assert_int_equal(kvt_gdn_step_ref(&s, state, q, k, v, g, NULL, scratch, out), -EINVAL);
	assert_int_equal(kvt_gdn_step_ref(&s, state, q, k, v, g, beta, NULL, out), -EINVAL);
	s.n_v_heads = 3; /* not a multiple of n_k_heads */
	assert_int_equal(kvt_gdn_step_ref(&s, state, q, k, v, g, beta, scratch, out), -EINVAL);
	assert_int_equal(kvt_gdn_state_bytes(&s), 0);
	s.n_v_heads = 4;
	s.k_dim = 0;
	assert_int_equal(kvt_gdn_step_ref(&s, state, q, k, v, g, beta, scratch, out), -EINVAL);
	s.k_dim = 4;
	s.dtype = KVT_DTYPE_INT8;
	assert_int_equal(kvt_gdn_step_ref(&s, state, q, k, v, g, beta, scratch, out), -EINVAL);
	assert_int_equal(kvt_gdn_state_bytes(&s), 0);
	assert_memory_equal(state, keep, sizeof state); /* nothing written on error */
	s.dtype = KVT_DTYPE_BF16;
	assert_int_equal(kvt_gdn_state_bytes(&s), 4 * 4 * 4 * 2);
}

/* Step through a sequence from a zero state; compare with the direct causal convolution. */
static void
tl_conv_case(uint32_t C, uint32_t K, enum kvt_dtype dt, int silu, int with_bias, uint32_t T,
	     uint64_t *rng)
{
	const struct kvt_conv_shape s = { C, K, dt, silu };
	const size_t esize = dt == KVT_DTYPE_F32 ? 4 : 2;
	unsigned char *state = calloc((size_t)C * (K - 1), esize);
	float *x = malloc((size_t)T * C * 4), *w = malloc((size_t)C * K * 4);
	float *bias = malloc(C * 4), *out = malloc(C * 4), sv;

	assert_true(state && x && w && bias && out);
	assert_int_equal(kvt_conv_state_bytes(&s), (uint64_t)C * (K - 1) * esize);
	for (size_t i = 0; i < (size_t)T * C; i++)
		x[i] = kvt_test_kv_uniform(rng, 2.0f);
	for (size_t i = 0; i < (size_t)C * K; i++)
		w[i] = kvt_test_kv_uniform(rng, 1.0f);
	for (uint32_t c = 0; c < C; c++)
		bias[c] = kvt_test_kv_uniform(rng, 0.5f);
	for (uint32_t t = 0; t < T; t++) {
		assert_int_equal(kvt_conv_step_ref(&s, state, x + (size_t)t * C, w,
						   with_bias ? bias : NULL, out), 0);
		for (uint32_t c = 0; c < C; c++) {
			double y = with_bias ? bias[c] : 0.0;

			/* tap j sees input t - (K - 1) + j; past inputs as the state stores them */
			for (uint32_t j = 0; j < K; j++) {
				int64_t src = (int64_t)t - (int64_t)(K - 1) + j;
				double xv = src < 0 ? 0.0 : x[(size_t)src * C + c];

				if (j + 1 < K)
					xv = tl_round(dt, xv);
				y += (double)w[(size_t)c * K + j] * xv;
			}
			if (silu)
				y = y / (1.0 + exp(-y));
			if (!(fabs(out[c] - y) <= 1e-5 * (1 + fabs(y))))
				fail_msg("conv C %u K %u dtype %d t %u c %u: %g, want %g", C, K,
					 (int)dt, t, c, (double)out[c], y);
		}
	}
	/* the state holds the last K - 1 inputs, oldest first */
	for (uint32_t c = 0; c < C; c++)
		for (uint32_t j = 0; j + 1 < K; j++) {
			int64_t src = (int64_t)T - (int64_t)(K - 1) + j;
			double want = src < 0 ? 0.0 : tl_round(dt, x[(size_t)src * C + c]);

			assert_int_equal(kvt_load_f32(dt, &sv, state + ((size_t)c * (K - 1) + j) *
							      esize, 1), 0);
			assert_float_equal(sv, want, 0.0);
		}
	free(state);
	free(x);
	free(w);
	free(bias);
	free(out);
}

static void
test_conv_vs_direct(void **st)
{
	uint64_t rng = 1717;

	(void)st;
	tl_conv_case(128, 4, KVT_DTYPE_F32, 1, 0, 30, &rng); /* the fixture's conv_dim */
	tl_conv_case(7, 2, KVT_DTYPE_F32, 0, 1, 9, &rng);
	tl_conv_case(5, 6, KVT_DTYPE_F32, 1, 1, 3, &rng); /* fewer steps than the kernel */
	tl_conv_case(33, 4, KVT_DTYPE_BF16, 1, 0, 20, &rng);
	tl_conv_case(33, 4, KVT_DTYPE_F16, 1, 1, 20, &rng);
}

static void
test_conv_errors(void **st)
{
	struct kvt_conv_shape s = { 4, 4, KVT_DTYPE_F32, 1 };
	float state[12] = { 0 }, x[4] = { 1, 2, 3, 4 }, w[16] = { 1 }, out[4];

	(void)st;
	assert_int_equal(kvt_conv_step_ref(NULL, state, x, w, NULL, out), -EINVAL);
	assert_int_equal(kvt_conv_step_ref(&s, NULL, x, w, NULL, out), -EINVAL);
	assert_int_equal(kvt_conv_step_ref(&s, state, x, NULL, NULL, out), -EINVAL);
	assert_int_equal(kvt_conv_step_ref(&s, state, x, w, NULL, x), -EINVAL); /* alias */
	s.kernel = 1;
	assert_int_equal(kvt_conv_step_ref(&s, state, x, w, NULL, out), -EINVAL);
	assert_int_equal(kvt_conv_state_bytes(&s), 0);
	s.kernel = 65;
	assert_int_equal(kvt_conv_step_ref(&s, state, x, w, NULL, out), -EINVAL);
	s.kernel = 4;
	s.channels = 0;
	assert_int_equal(kvt_conv_step_ref(&s, state, x, w, NULL, out), -EINVAL);
	s.channels = 4;
	s.dtype = (enum kvt_dtype)99;
	assert_int_equal(kvt_conv_step_ref(&s, state, x, w, NULL, out), -EINVAL);
	for (int i = 0; i < 12; i++)
		assert_float_equal(state[i], 0.0f, 0.0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_gdn_vs_naive),
		cmocka_unit_test(test_gdn_retrieves_what_it_wrote),
		cmocka_unit_test(test_gdn_gates),
		cmocka_unit_test(test_gdn_errors),
		cmocka_unit_test(test_conv_vs_direct),
		cmocka_unit_test(test_conv_errors),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
