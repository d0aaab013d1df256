/* SPDX-License-Identifier: MIT */
/*
 * tests/test_attn_cublas.c - the CUDA paged decode attention against an independent computation
 * with cuBLAS: the same K/V (as stored, widened to fp32) copied contiguous per KV head, scores
 * = Q K^T / sqrt(d) as one strided-batched GEMM over the KV heads (the query heads of a group
 * are the GEMM's columns), softmax on the host in double, out = P V as a second batched GEMM,
 * all fp32 (CUBLAS_COMPUTE_32F: no TF32).
 *
 * cuBLAS is loaded at run time (dlopen: $KVT_CUBLAS_LIB, else libcublas.so.13, .so.12, .so), so
 * no test binary needs libcublas to start; without it this test says so and skips (77), as it
 * does without CUDA in the build or without a GPU.
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

#ifdef KVT_WITH_CUDA
#include <dlfcn.h>

#include <cublas_api.h>
#include <cuda_runtime.h>

#include "kernels/attention.h"
#include "kernels/kernels_cuda.h"
#include "support/kv_fixture.h"
#include "support/kvt_test.h"

#define TAC_OK(call) assert_int_equal((int)(call), (int)cudaSuccess)

typedef cublasStatus_t (*tac_create_fn)(cublasHandle_t *);
typedef cublasStatus_t (*tac_destroy_fn)(cublasHandle_t);
typedef cublasStatus_t (*tac_gemm_fn)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
				      int, int, const void *, const void *, cudaDataType, int,
				      long long, const void *, cudaDataType, int, long long,
				      const void *, void *, cudaDataType, int, long long, int,
				      cublasComputeType_t, cublasGemmAlgo_t);

static struct {
	void *lib;              /* dlopen handle */
	tac_create_fn create;   /* cublasCreate_v2 */
	tac_destroy_fn destroy; /* cublasDestroy_v2 */
	tac_gemm_fn gemm;       /* cublasGemmStridedBatchedEx */
	cublasHandle_t h;       /* the handle */
} tac;

/* Load cuBLAS; 0 when it is usable. */
static int
tac_load(void)
{
	const char *names[] = { getenv("KVT_CUBLAS_LIB"), "libcublas.so.13", "libcublas.so.12",
				"libcublas.so" };
	size_t i;

	for (i = 0; i < sizeof names / sizeof names[0] && !tac.lib; i++)
		if (names[i] && *names[i])
			tac.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
	if (!tac.lib) {
		printf("test_attn_cublas: cannot load cuBLAS (%s)\n", dlerror());
		return -1;
	}
	tac.create = (tac_create_fn)dlsym(tac.lib, "cublasCreate_v2");
	tac.destroy = (tac_destroy_fn)dlsym(tac.lib, "cublasDestroy_v2");
	tac.gemm = (tac_gemm_fn)dlsym(tac.lib, "cublasGemmStridedBatchedEx");
	if (!tac.create || !tac.destroy || !tac.gemm) {
		printf("test_attn_cublas: cuBLAS lacks a symbol (%s)\n", dlerror());
		return -1;
	}
	if (tac.create(&tac.h) != CUBLAS_STATUS_SUCCESS) {
		printf("test_attn_cublas: cublasCreate failed\n");
		return -1;
	}
	return 0;
}

static void *
tac_dev(const void *src, size_t len)
{
	void *d = NULL;

	TAC_OK(cudaMalloc(&d, len));
	if (src)
		TAC_OK(cudaMemcpy(d, src, len, cudaMemcpyHostToDevice));
	return d;
}

/* out [n_heads][d] by cuBLAS from the widened K/V of b. */
static void
tac_cublas_attn(const struct kvt_test_kv *b, const struct kvt_test_kv_shape *s, float *out)
{
	const int d = (int)s->head_dim, S = (int)s->seq_len, G = (int)s->n_kv_heads;
	const int M = (int)(s->n_heads / s->n_kv_heads), kvd = G * d;
	const size_t kvn = (size_t)G * S * d;
	float *kc = malloc(kvn * sizeof(float)), *vc = malloc(kvn * sizeof(float));
	float *sc = malloc((size_t)G * M * S * sizeof(float));
	float *dk, *dv, *dq, *ds, *dout;
	const float alpha = 1.0f / sqrtf((float)d), one = 1.0f, zero = 0.0f;
	int g, t, i;

	assert_true(kc && vc && sc);
	for (g = 0; g < G; g++)
		for (t = 0; t < S; t++)
			for (i = 0; i < d; i++) {
				size_t to = ((size_t)g * S + t) * d + i;
				size_t from = (size_t)t * kvd + (size_t)g * d + i;

				kc[to] = b->kw[from];
				vc[to] = b->vw[from];
			}
	dk = tac_dev(kc, kvn * sizeof(float));
	dv = tac_dev(vc, kvn * sizeof(float));
	dq = tac_dev(b->q, (size_t)s->n_heads * d * sizeof(float));
	ds = tac_dev(NULL, (size_t)G * M * S * sizeof(float));
	dout = tac_dev(NULL, (size_t)s->n_heads * d * sizeof(float));
	/* scores^T (col-major S x M per group) = K (d x S col-major, transposed) * Q (d x M) */
	assert_int_equal(tac.gemm(tac.h, CUBLAS_OP_T, CUBLAS_OP_N, S, M, d, &alpha, dk, CUDA_R_32F,
				  d, (long long)S * d, dq, CUDA_R_32F, d, (long long)M * d, &zero,
				  ds, CUDA_R_32F, S, (long long)M * S, G, CUBLAS_COMPUTE_32F,
				  CUBLAS_GEMM_DEFAULT), CUBLAS_STATUS_SUCCESS);
	TAC_OK(cudaMemcpy(sc, ds, (size_t)G * M * S * sizeof(float), cudaMemcpyDeviceToHost));
	for (g = 0; g < G * M; g++) { /* softmax of each row [S], in double */
		float *r = sc + (size_t)g * S;
		double mx = -INFINITY, sum = 0.0;

		for (t = 0; t < S; t++)
			mx = r[t] > mx ? r[t] : mx;
		for (t = 0; t < S; t++)
			sum += exp((double)r[t] - mx);
		for (t = 0; t < S; t++)
			r[t] = (float)(exp((double)r[t] - mx) / sum);
	}
	TAC_OK(cudaMemcpy(ds, sc, (size_t)G * M * S * sizeof(float), cudaMemcpyHostToDevice));
	/* out^T (col-major d x M per group) = V (d x S col-major) * P (S x M) */
	assert_int_equal(tac.gemm(tac.h, CUBLAS_OP_N, CUBLAS_OP_N, d, M, S, &one, dv, CUDA_R_32F, d,
				  (long long)S * d, ds, CUDA_R_32F, S, (long long)M * S, &zero,
				  dout, CUDA_R_32F, d, (long long)M * d, G, CUBLAS_COMPUTE_32F,
				  CUBLAS_GEMM_DEFAULT), CUBLAS_STATUS_SUCCESS);
	TAC_OK(cudaMemcpy(out, dout, (size_t)s->n_heads * d * sizeof(float),
			  cudaMemcpyDeviceToHost));
	cudaFree(dk);
	cudaFree(dv);
	cudaFree(dq);
	cudaFree(ds);
	cudaFree(dout);
	free(kc);
	free(vc);
	free(sc);
}

/* The kernel (vectorised and generic, 1 split and the chosen split count) vs cuBLAS. */
static void
tac_case(const struct kvt_test_kv_shape *s, enum kvt_dtype dt, uint64_t *rng, int n_sm)
{
	const size_t n = (size_t)s->n_heads * s->head_dim;
	float *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
	uint32_t splits[2] = { 1, kvt_attn_cuda_splits(s->n_heads, s->n_kv_heads, s->seq_len,
						       n_sm) };
	struct kvt_test_kv b;
	struct kvt_paged_kv kv;
	void *hbm, *table, *q, *dout, *work;
	int generic, k;

	assert_true(want && got);
	kvt_test_kv_build(&b, s, dt, rng);
	tac_cublas_attn(&b, s, want);
	hbm = tac_dev(b.hbm, b.hbm_bytes);
	table = tac_dev(b.table, b.n_blocks * sizeof(uint32_t));
	q = tac_dev(b.q, n * sizeof(float));
	dout = tac_dev(NULL, n * sizeof(float));
	work = tac_dev(NULL, kvt_attn_cuda_work_floats(s->n_heads, s->head_dim, splits[1]) *
				     sizeof(float) + 16);
	kv = b.kv;
	kv.k_base = (char *)hbm + ((const unsigned char *)b.kv.k_base - b.hbm);
	kv.table = table;
	for (generic = 0; generic < 2; generic++) {
		kvt_attn_cuda_force_generic(generic);
		for (k = 0; k < 2; k++) {
			double err;

			TAC_OK(cudaMemset(dout, 0xff, n * sizeof(float)));
			assert_int_equal(kvt_attn_decode_cuda(&kv, q, s->n_heads, s->seq_len,
							      splits[k], work, dout, NULL), 0);
			TAC_OK(cudaDeviceSynchronize());
			TAC_OK(cudaMemcpy(got, dout, n * sizeof(float), cudaMemcpyDeviceToHost));
			err = kvt_test_kv_relerr(got, want, n);
			print_message("  H=%u Hkv=%u d=%u S=%u dtype %d %s splits %u: "
				      "relerr %.2e\n", s->n_heads, s->n_kv_heads, s->head_dim,
				      s->seq_len, (int)dt, generic ? "generic" : "default",
				      splits[k], err);
			if (!(err <= 2e-4))
				fail_msg("kernel vs cuBLAS: relerr %g", err);
		}
	}
	kvt_attn_cuda_force_generic(0);
	cudaFree(hbm);
	cudaFree(table);
	cudaFree(q);
	cudaFree(dout);
	cudaFree(work);
	kvt_test_kv_free(&b);
	free(want);
	free(got);
}

static void
test_attn_vs_cublas(void **state)
{
	static const struct kvt_test_kv_shape shapes[] = {
		{ 32, 8, 128, 16, 3000, 0 }, { 16, 16, 64, 16, 513, 0 },
		{ 8, 1, 256, 32, 2000, 0 },  { 12, 4, 64, 7, 300, 0 },
		{ 4, 2, 96, 16, 100, 4 },
	};
	static const enum kvt_dtype dts[] = { KVT_DTYPE_F16, KVT_DTYPE_BF16, KVT_DTYPE_F16,
					      KVT_DTYPE_F32, KVT_DTYPE_BF16 };
	const char *e = getenv("KVT_TEST_SEED");
	uint64_t rng = e && *e ? strtoull(e, NULL, 0) : (uint64_t)time(NULL);
	size_t i, ns = kvt_test_quick() ? 2 : sizeof shapes / sizeof shapes[0];
	int n_sm = 0;

	(void)state;
	TAC_OK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
	print_message("random seed %llu (KVT_TEST_SEED repeats it)\n", (unsigned long long)rng);
	for (i = 0; i < ns; i++)
		tac_case(&shapes[i], dts[i], &rng, n_sm);
}
#endif /* KVT_WITH_CUDA */

int
main(void)
{
#ifdef KVT_WITH_CUDA
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_attn_vs_cublas),
	};
	int n = 0, rc;

#ifdef KVT_CUDA_EMU
	/* the real cuBLAS would call the real driver: nothing to compare with on the emulation */
	printf("test_attn_cublas: emulated CUDA (KVT_CUDA_EMU): cuBLAS needs a real GPU: "
	       "skipped\n");
	return 77;
#endif
	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		printf("test_attn_cublas: no usable GPU: skipped\n");
		return 77;
	}
	if (tac_load() != 0) {
		printf("test_attn_cublas: skipped (no cuBLAS)\n");
		return 77;
	}
	rc = cmocka_run_group_tests(tests, NULL, NULL);
	tac.destroy(tac.h);
	return rc;
#else
	printf("test_attn_cublas: built without KVT_WITH_CUDA: skipped\n");
	return 77;
#endif
}
