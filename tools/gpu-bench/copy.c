/* SPDX-License-Identifier: MIT */
/*
 * tools/gpu-bench/copy.c - batched block copies through kvtier's CUDA device backend
 * (copy_batch_async: one cudaMemcpyBatchAsync per batch) between pinned HOST slots and HBM
 * slots in scrambled order, at 256 KiB .. 4 MiB blocks, against one large cudaMemcpyAsync of
 * the same bytes (the link's peak in this run). GPU-side time (cudaEvent), one warm-up, median
 * of --reps. The first batched H2D is checked byte for byte. Then the fallback path (the copy
 * kernel over mapped pinned memory, kvt_copy_batch_cuda(), used where cudaMemcpyBatchAsync is
 * not) at 256 KiB and 1 MiB, its first batch checked too; its rows carry no target.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gb.h"

#ifdef KVT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "engine/kvtier.h"
#include "transfer/device.h"

/* Everything a copy measurement needs. */
struct gbc {
	struct kvt_device *d;     /* the CUDA device backend */
	struct kvt_stream *s;     /* its stream (a cudaStream_t) */
	cudaEvent_t e0, e1;       /* timing events */
	unsigned char *host;      /* pinned, total bytes */
	unsigned char *dev;       /* device, total bytes */
	uint64_t total;           /* bytes moved per measurement */
	uint32_t reps;            /* measured repetitions */
	struct kvt_copy *v;       /* copy list */
	uint32_t *ph, *pd;        /* slot permutations of host and device */
};

/* GPU time (ms) of one copy of c->total bytes: direction @dir (0 H2D, 1 D2H), one large
 * cudaMemcpyAsync (bs 0) or a batch of bs-byte blocks between the permuted slots. */
static int
gbc_time(struct gbc *c, int dir, uint64_t bs, double *ms)
{
	uint32_t n = bs ? (uint32_t)(c->total / bs) : 0;
	cudaError_t e;
	float f = 0.0f;
	int rc = 0;

	if ((e = cudaEventRecord(c->e0, (cudaStream_t)(void *)c->s)) != cudaSuccess)
		return gb_fail("cudaEventRecord", e);
	if (!bs) {
		e = dir ? cudaMemcpyAsync(c->host, c->dev, c->total, cudaMemcpyDeviceToHost,
					  (cudaStream_t)(void *)c->s)
			: cudaMemcpyAsync(c->dev, c->host, c->total, cudaMemcpyHostToDevice,
					  (cudaStream_t)(void *)c->s);
		if (e != cudaSuccess)
			return gb_fail("cudaMemcpyAsync", e);
	} else {
		for (uint32_t i = 0; i < n; i++) {
			unsigned char *h = c->host + (uint64_t)c->ph[i] * bs;
			unsigned char *g = c->dev + (uint64_t)c->pd[i] * bs;

			c->v[i] = (struct kvt_copy){ .dst = dir ? (void *)h : (void *)g,
						     .src = dir ? (void *)g : (void *)h,
						     .len = bs };
		}
		rc = c->d->ops->copy_batch_async(c->d, c->s, c->v, n);
		if (rc) {
			fprintf(stderr, "gpu-bench: copy_batch_async: %s\n",
				kvt_last_error_message());
			return 1;
		}
	}
	if ((e = cudaEventRecord(c->e1, (cudaStream_t)(void *)c->s)) != cudaSuccess ||
	    (e = cudaEventSynchronize(c->e1)) != cudaSuccess ||
	    (e = cudaEventElapsedTime(&f, c->e0, c->e1)) != cudaSuccess)
		return gb_fail("timing a copy", e);
	*ms = f;
	return 0;
}

/* GB/s of a direction and block size (0 = one large copy): warm-up, median of reps. */
static int
gbc_measure(struct gbc *c, int dir, uint64_t bs, double *gbs)
{
	double t[64], ms = 0.0;
	uint32_t r;

	if (gbc_time(c, dir, bs, &ms))
		return 1;
	for (r = 0; r < c->reps && r < 64; r++)
		if (gbc_time(c, dir, bs, &t[r]))
			return 1;
	ms = gb_median(t, r);
	*gbs = (double)c->total / (ms * 1e-3) / 1e9;
	return 0;
}

/* Random permutation of 0..n-1 (xorshift, fixed seed). */
static void
gbc_perm(uint32_t *p, uint32_t n, uint64_t seed)
{
	for (uint32_t i = 0; i < n; i++)
		p[i] = i;
	for (uint32_t i = n - 1; i > 0; i--) {
		seed ^= seed << 13;
		seed ^= seed >> 7;
		seed ^= seed << 17;
		uint32_t j = (uint32_t)(seed % (i + 1)), x = p[i];

		p[i] = p[j];
		p[j] = x;
	}
}

/* One batched H2D of 1 MiB blocks, then the device copy compared block by block. */
static int
gbc_verify(struct gbc *c)
{
	const uint64_t bs = 1u << 20, n = c->total / bs;
	unsigned char *back = malloc(c->total);
	double ms;
	cudaError_t e;
	int bad = 0;

	if (!back)
		return gb_fail("no memory for the check", 0);
	for (uint64_t i = 0; i < c->total / 8; i++)
		((uint64_t *)(void *)c->host)[i] = i * 0x9e3779b97f4a7c15ull;
	gbc_perm(c->ph, (uint32_t)n, 11);
	gbc_perm(c->pd, (uint32_t)n, 12);
	if (gbc_time(c, 0, bs, &ms)) {
		free(back);
		return 1;
	}
	if ((e = cudaMemcpy(back, c->dev, c->total, cudaMemcpyDeviceToHost)) != cudaSuccess) {
		free(back);
		return gb_fail("cudaMemcpy (check)", e);
	}
	for (uint64_t i = 0; i < n && !bad; i++)
		bad = memcmp(back + c->pd[i] * bs, c->host + c->ph[i] * bs, bs) != 0;
	free(back);
	printf("batched H2D of %llu x 1 MiB blocks: content %s\n", (unsigned long long)n,
	       bad ? "WRONG" : "verified");
	if (bad)
		gb_result("copy_batched_content", 0, "ok", 0, 1, 1);
	return bad;
}

/* The copy-kernel fallback: checked once, then H2D/D2H at 256 KiB and 1 MiB against the peak. */
static int
gbc_kernel_rows(struct gbc *c, const double peak[2])
{
	static const uint64_t sizes[] = { 256u << 10, 1u << 20 };
	double bw;
	char name[64];
	int rc;

	if (kvt_device_cuda_copy_path(c->d, KVT_CUDA_COPY_KERNEL, NULL) != 0)
		return fprintf(stderr, "gpu-bench: %s\n", kvt_last_error_message()), 1;
	rc = gbc_verify(c);
	for (size_t k = 0; !rc && k < sizeof sizes / sizeof sizes[0]; k++) {
		gbc_perm(c->ph, (uint32_t)(c->total / sizes[k]), 21 + k);
		gbc_perm(c->pd, (uint32_t)(c->total / sizes[k]), 23 + k);
		for (int dir = 0; !rc && dir < 2; dir++) {
			rc = gbc_measure(c, dir, sizes[k], &bw);
			snprintf(name, sizeof name, "copy_%s_kernel_%lluKiB", dir ? "d2h" : "h2d",
				 (unsigned long long)(sizes[k] >> 10));
			if (!rc)
				gb_result(name, bw, "GB/s", bw / peak[dir], 0, 1);
		}
	}
	(void)kvt_device_cuda_copy_path(c->d, KVT_CUDA_COPY_AUTO, NULL);
	return rc;
}

/* The table: peak, then each block size in both directions, then the kernel fallback. */
static int
gbc_run(struct gbc *c)
{
	static const uint64_t sizes[] = { 256u << 10, 1u << 20, 2u << 20, 4u << 20 };
	double peak[2], bw;
	char name[64];

	if (gbc_verify(c))
		return 1;
	if (kvt_device_cuda_batched(c->d) != 1)
		printf("NOTE: the driver refused cudaMemcpyBatchAsync: the batched rows below "
		       "measure the copy kernel (the fallback), not the batch API\n");
	for (int dir = 0; dir < 2; dir++) {
		if (gbc_measure(c, dir, 0, &peak[dir]))
			return 1;
		snprintf(name, sizeof name, "copy_%s_peak_single_memcpy", dir ? "d2h" : "h2d");
		gb_result(name, peak[dir], "GB/s", 1.0, 0, 1);
	}
	for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
		uint32_t n = (uint32_t)(c->total / sizes[k]);

		gbc_perm(c->ph, n, 3 + k);
		gbc_perm(c->pd, n, 5 + k);
		for (int dir = 0; dir < 2; dir++) {
			if (gbc_measure(c, dir, sizes[k], &bw))
				return 1;
			snprintf(name, sizeof name, "copy_%s_batched_%lluKiB", dir ? "d2h" : "h2d",
				 (unsigned long long)(sizes[k] >> 10));
			gb_result(name, bw, "GB/s", bw / peak[dir],
				  sizes[k] >= (1u << 20) ? 0.9 : 0, 1);
		}
	}
	return gbc_kernel_rows(c, peak);
}

int
gb_copy_main(int argc, char **argv)
{
	uint64_t mib = 1024, reps = 5;
	struct gbc c = { 0 };
	bool pinned = false;
	int rc = 1;

	for (int i = 1; i < argc; i++) {
		if (gb_opt_u64(argc, argv, &i, "--total-mib", &mib) ||
		    gb_opt_u64(argc, argv, &i, "--reps", &reps))
			continue;
		fprintf(stderr, "usage: gpu-bench copy [--total-mib N (1024)] [--reps N (5)]\n");
		return 2;
	}
	if (mib < 4 || mib % 4 || reps < 1)
		return fprintf(stderr, "gpu-bench copy: --total-mib a multiple of 4, --reps "
			       ">= 1\n"), 2;
	c.total = mib << 20;
	c.reps = (uint32_t)reps;
	if (kvt_device_cuda_create(0, &c.d)) {
		fprintf(stderr, "gpu-bench copy: %s\n", kvt_last_error_message());
		return 77;
	}
	c.v = malloc((c.total / (256u << 10)) * sizeof *c.v);
	c.ph = malloc((c.total / (256u << 10)) * sizeof *c.ph);
	c.pd = malloc((c.total / (256u << 10)) * sizeof *c.pd);
	if (!c.v || !c.ph || !c.pd)
		fprintf(stderr, "gpu-bench copy: out of memory\n");
	else if (c.d->ops->host_alloc(c.d, c.total, (void **)&c.host, &pinned) ||
		 c.d->ops->mem_alloc(c.d, c.total, (void **)&c.dev) ||
		 c.d->ops->stream_create(c.d, &c.s))
		fprintf(stderr, "gpu-bench copy: %s\n", kvt_last_error_message());
	else if (cudaEventCreate(&c.e0) != cudaSuccess || cudaEventCreate(&c.e1) != cudaSuccess)
		fprintf(stderr, "gpu-bench copy: cudaEventCreate failed\n");
	else {
		printf("copy: %llu MiB per measurement, pinned host %s, median of %u\n",
		       (unsigned long long)mib, pinned ? "yes" : "NO", c.reps);
		rc = gbc_run(&c);
	}
	if (c.e0)
		cudaEventDestroy(c.e0);
	if (c.e1)
		cudaEventDestroy(c.e1);
	if (c.s)
		c.d->ops->stream_destroy(c.d, c.s);
	if (c.dev)
		c.d->ops->mem_free(c.d, c.dev);
	if (c.host)
		c.d->ops->host_free(c.d, c.host, c.total);
	kvt_device_destroy(c.d);
	free(c.v);
	free(c.ph);
	free(c.pd);
	return rc;
}
#else
int
gb_copy_main(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	printf("gpu-bench copy: built without CUDA\n");
	return 77;
}
#endif
