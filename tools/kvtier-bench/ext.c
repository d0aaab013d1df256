/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-bench/ext.c - `kvtier-bench ext`: the external-pool mode (issue 19) against a
 * plain copy of the same bytes, in the same run.
 *
 * A caller pool in vLLM's per-layer layout (one [2, num_blocks, tpb, heads, head_dim] tensor per
 * layer, plain host memory standing in for the GPU on the emulated device), an engine whose HOST
 * tier holds one job's blocks. Per run:
 *   memcpy  the job's segments (one per block, layer, K|V) gathered with memcpy into a buffer
 *           of the same size (one thread: the emulated device copies on one stream thread);
 *   store   kvt_ext_store of the job's blocks under fresh hashes + kvt_ext_wait;
 *   load    kvt_ext_load of them into other block ids + kvt_ext_wait (bytes checked once);
 * then the stored hashes are dropped. Printed per run: GB/s of each and the ratios store/memcpy
 * and load/memcpy; then the medians. Target: both ratios >= 0.9.
 * Lookup: a second engine with a small layout stores a --lookup-tokens prompt's blocks (tpb
 * tokens each), and kvt_ext_lookup of all its hashes (every one a hit: the longest walk) is
 * timed --lookups times: median and p99 in microseconds. Target: well under 1 ms for 32k tokens.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kvtier.h"
#include "util.h"

#define XB_MAX_RUNS 51u

struct xb_opts {
	uint32_t layers, heads, dim, tpb, blocks, runs, lookup_tokens, lookups;
};

static void
xb_usage(FILE *f)
{
	fprintf(f, "usage: kvtier-bench ext [--layers N] [--kv-heads N] [--head-dim N] [--tpb N]\n"
		   "                        [--blocks N] [--runs N] [--lookup-tokens N] "
		   "[--lookups N]\n"
		   "Store and load bandwidth of the external-pool mode (f16 K/V, vLLM per-layer\n"
		   "layout, emulated device) against memcpy of the same segments, and the lookup\n"
		   "time of a prompt's block hashes. Defaults: 8 layers, 8 KV heads, head_dim 128,\n"
		   "tpb 16, 128 blocks per job, 7 runs, 32768 lookup tokens, 2000 lookups.\n");
}

static int
xb_parse(int argc, char **argv, struct xb_opts *o)
{
	for (int i = 1; i < argc; i++) {
		const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int rc;

		if (!strcmp(k, "-h") || !strcmp(k, "--help"))
			return 1;
		if (!v)
			return kvtr_err(-EINVAL, "%s: missing value or unknown option (see --help)",
					k);
		i++;
		if (!strcmp(k, "--layers"))
			rc = kvtr_parse_u32(k, v, 1, 256, &o->layers);
		else if (!strcmp(k, "--kv-heads"))
			rc = kvtr_parse_u32(k, v, 1, 64, &o->heads);
		else if (!strcmp(k, "--head-dim"))
			rc = kvtr_parse_u32(k, v, 1, 512, &o->dim);
		else if (!strcmp(k, "--tpb"))
			rc = kvtr_parse_u32(k, v, 1, 256, &o->tpb);
		else if (!strcmp(k, "--blocks"))
			rc = kvtr_parse_u32(k, v, 1, 65536, &o->blocks);
		else if (!strcmp(k, "--runs"))
			rc = kvtr_parse_u32(k, v, 1, XB_MAX_RUNS, &o->runs);
		else if (!strcmp(k, "--lookup-tokens"))
			rc = kvtr_parse_u32(k, v, 1, 1u << 22, &o->lookup_tokens);
		else if (!strcmp(k, "--lookups"))
			rc = kvtr_parse_u32(k, v, 1, 1000000, &o->lookups);
		else
			rc = kvtr_err(-EINVAL, "unknown option %s (see --help)", k);
		if (rc)
			return rc;
	}
	return 0;
}

static int
xb_fail(const char *what, int rc)
{
	fprintf(stderr, "kvtier-bench ext: %s: %s (%s)\n", what, kvt_strerror(rc),
		kvt_last_error_message());
	return 1;
}

/* Wait for @job and poll it: 0 when it is reported without failures. */
static int
xb_finish(struct kvt_engine *e, uint32_t pool, uint64_t job)
{
	struct kvt_ext_done d[4];
	int rc = kvt_ext_wait(e, pool, job, 600000), n;

	if (rc)
		return rc;
	n = kvt_ext_poll(e, pool, d, 4, NULL, 0);
	if (n < 0)
		return n;
	for (int i = 0; i < n; i++)
		if (d[i].job == job)
			return d[i].status;
	return -EPROTO;
}

static int
xb_bandwidth(const struct xb_opts *o)
{
	uint64_t page = (uint64_t)o->tpb * o->heads * o->dim * 2, nb = 2ull * o->blocks;
	uint64_t job_bytes = (uint64_t)o->blocks * o->layers * 2 * page;
	struct kvt_ext_layer *lay = calloc(o->layers, sizeof *lay);
	uint8_t **mem = calloc(o->layers, sizeof *mem), *buf = malloc(job_bytes);
	uint32_t *src = malloc(o->blocks * sizeof *src), *dst = malloc(o->blocks * sizeof *dst);
	uint64_t *h = malloc(o->blocks * sizeof *h);
	double tm[XB_MAX_RUNS], ts[XB_MAX_RUNS], tl[XB_MAX_RUNS], rs[XB_MAX_RUNS], rl[XB_MAX_RUNS];
	struct kvt_engine_opts eo;
	struct kvt_ext_opts xo;
	struct kvt_engine *e = NULL;
	uint32_t pool, l, i, r;
	int rc = 0;

	if (!lay || !mem || !buf || !src || !dst || !h) {
		fprintf(stderr, "kvtier-bench ext: out of memory\n");
		return 1;
	}
	kvt_engine_opts_init(&eo, sizeof eo);
	eo.layout = (struct kvt_layout){ o->layers, o->heads, o->dim, KVT_DTYPE_F16, o->tpb };
	eo.hbm_bytes = (uint64_t)o->layers * 2 * page;
	eo.host_bytes = job_bytes + eo.hbm_bytes;
	eo.high_watermark = eo.low_watermark = 1.0f;
	rc = kvt_engine_create(&eo, &e);
	if (rc)
		return xb_fail("kvt_engine_create", rc);
	for (l = 0; l < o->layers; l++) {
		mem[l] = malloc(2 * nb * page);
		if (!mem[l]) {
			fprintf(stderr, "kvtier-bench ext: out of memory\n");
			return 1;
		}
		for (uint64_t k = 0; k < 2 * nb * page; k++)
			mem[l][k] = (uint8_t)(k * 13 + l);
		lay[l] = (struct kvt_ext_layer){ .base = (uintptr_t)mem[l], .block_stride = page,
						 .v_offset = nb * page, .k_bytes = page,
						 .v_bytes = page, .n_layers = 1 };
	}
	memset(buf, 1, job_bytes);
	kvt_ext_opts_init(&xo, sizeof xo);
	xo.n_blocks = (uint32_t)nb;
	xo.n_entries = o->layers;
	xo.layers = lay;
	rc = kvt_ext_register(e, &xo, &pool);
	if (rc)
		return xb_fail("kvt_ext_register", rc);
	for (i = 0; i < o->blocks; i++) {
		src[i] = i;
		dst[i] = o->blocks + (i * 7919u) % o->blocks; /* scattered destinations */
	}
	/* a warm-up store and load (page faults of the HOST slots) */
	printf("ext: %u layers x K,V of %llu B: %.1f MiB per block, %u blocks per job "
	       "(%.1f MiB)\n", o->layers, (unsigned long long)page,
	       o->layers * 2.0 * page / 1048576.0, o->blocks, job_bytes / 1048576.0);
	printf("%4s %10s %10s %10s %8s %8s\n", "run", "memcpy", "store", "load", "st/cpy",
	       "ld/cpy");
	for (r = 0; r <= o->runs && !rc; r++) {
		uint64_t job, at = 0;
		double t0, t1, t2, t3;

		for (i = 0; i < o->blocks; i++)
			h[i] = ((uint64_t)r << 32 | i) * 0x9e3779b97f4a7c15ull + 1;
		t0 = kvtr_now();
		for (i = 0; i < o->blocks; i++)
			for (l = 0; l < o->layers; l++) {
				memcpy(buf + at, mem[l] + (uint64_t)src[i] * page, page);
				at += page;
				memcpy(buf + at, mem[l] + nb * page + (uint64_t)src[i] * page, page);
				at += page;
			}
		t1 = kvtr_now();
		rc = kvt_ext_store(e, pool, 0, h, src, o->blocks, NULL, &job);
		if (!rc)
			rc = xb_finish(e, pool, job);
		if (rc)
			return xb_fail("store", rc);
		t2 = kvtr_now();
		rc = kvt_ext_load(e, pool, 0, h, dst, o->blocks, 0, &job);
		if (!rc)
			rc = xb_finish(e, pool, job);
		if (rc)
			return xb_fail("load", rc);
		t3 = kvtr_now();
		if (r == 1) /* every byte came back into the other ids (checked once) */
			for (i = 0; i < o->blocks && !rc; i++)
				for (l = 0; l < o->layers && !rc; l++)
					if (memcmp(mem[l] + (uint64_t)dst[i] * page,
						   mem[l] + (uint64_t)src[i] * page, page) ||
					    memcmp(mem[l] + nb * page + (uint64_t)dst[i] * page,
						   mem[l] + nb * page + (uint64_t)src[i] * page,
						   page)) {
						fprintf(stderr, "kvtier-bench ext: block %u layer "
							"%u differs after the load\n", i, l);
						rc = 1;
					}
		(void)kvt_ext_drop(e, pool, 0, h, o->blocks);
		if (r == 0)
			continue; /* warm-up */
		tm[r - 1] = job_bytes / (t1 - t0) / 1e9;
		ts[r - 1] = job_bytes / (t2 - t1) / 1e9;
		tl[r - 1] = job_bytes / (t3 - t2) / 1e9;
		rs[r - 1] = ts[r - 1] / tm[r - 1];
		rl[r - 1] = tl[r - 1] / tm[r - 1];
		printf("%4u %8.2f GB/s %6.2f GB/s %6.2f GB/s %8.3f %8.3f\n", r, tm[r - 1],
		       ts[r - 1], tl[r - 1], rs[r - 1], rl[r - 1]);
	}
	if (!rc)
		printf("median %6.2f GB/s %6.2f GB/s %6.2f GB/s %8.3f %8.3f  (target: >= 0.9)\n",
		       kvtb_median(tm, o->runs), kvtb_median(ts, o->runs), kvtb_median(tl, o->runs),
		       kvtb_median(rs, o->runs), kvtb_median(rl, o->runs));
	kvt_engine_destroy(e);
	for (l = 0; l < o->layers; l++)
		free(mem[l]);
	free(mem);
	free(lay);
	free(buf);
	free(src);
	free(dst);
	free(h);
	return rc ? 1 : 0;
}

static int
xb_lookup(const struct xb_opts *o)
{
	uint32_t n = (o->lookup_tokens + o->tpb - 1) / o->tpb, pool, i, chunk = 4096;
	struct kvt_ext_layer lay = { .block_stride = 64, .k_bytes = 32, .v_offset = 32,
				     .v_bytes = 32, .n_layers = 1 };
	uint64_t *h = malloc((size_t)n * sizeof *h);
	double *t = malloc((size_t)o->lookups * sizeof *t);
	uint8_t *mem = calloc(chunk, 64);
	uint32_t *ids = malloc(chunk * sizeof *ids);
	struct kvt_engine_opts eo;
	struct kvt_ext_opts xo;
	struct kvt_engine *e;
	size_t hits = 0;
	int rc;

	if (!h || !t || !mem || !ids) {
		fprintf(stderr, "kvtier-bench ext: out of memory\n");
		return 1;
	}
	kvt_engine_opts_init(&eo, sizeof eo);
	/* 1 layer, 1 head of 8 f16 elements, 2 tokens per block: 64-byte blocks */
	eo.layout = (struct kvt_layout){ 1, 1, 8, KVT_DTYPE_F16, 2 };
	eo.hbm_bytes = 64;
	eo.host_bytes = (uint64_t)(n + 16) * 64;
	eo.high_watermark = eo.low_watermark = 1.0f;
	rc = kvt_engine_create(&eo, &e);
	if (rc)
		return xb_fail("kvt_engine_create (lookup)", rc);
	lay.base = (uintptr_t)mem;
	kvt_ext_opts_init(&xo, sizeof xo);
	xo.n_blocks = chunk;
	xo.n_entries = 1;
	xo.layers = &lay;
	rc = kvt_ext_register(e, &xo, &pool);
	if (rc)
		return xb_fail("kvt_ext_register (lookup)", rc);
	for (i = 0; i < n; i++)
		h[i] = (uint64_t)i * 0x9e3779b97f4a7c15ull ^ 0x5555;
	for (i = 0; i < n && !rc; i += chunk) {
		uint32_t k = n - i < chunk ? n - i : chunk;
		uint64_t job;

		for (uint32_t j = 0; j < k; j++)
			ids[j] = j;
		rc = kvt_ext_store(e, pool, 0, h + i, ids, k, NULL, &job);
		if (!rc)
			rc = xb_finish(e, pool, job);
	}
	if (rc)
		return xb_fail("store (lookup)", rc);
	for (i = 0; i < o->lookups && !rc; i++) {
		double t0 = kvtr_now();

		rc = kvt_ext_lookup(e, pool, 0, h, n, &hits, NULL);
		t[i] = (kvtr_now() - t0) * 1e6;
		if (!rc && hits != n) {
			fprintf(stderr, "kvtier-bench ext: lookup found %zu of %u\n", hits, n);
			rc = 1;
		}
	}
	if (!rc) {
		qsort(t, o->lookups, sizeof *t, kvtb_cmp_double);
		printf("lookup: %u tokens = %u hashes (all hits), %u lookups: median %.1f us, "
		       "p99 %.1f us (target: well under 1000 us)\n", o->lookup_tokens, n,
		       o->lookups, kvtb_median(t, o->lookups),
		       t[(size_t)(o->lookups * 0.99) < o->lookups ? (size_t)(o->lookups * 0.99) :
							      o->lookups - 1]);
	}
	kvt_engine_destroy(e);
	free(h);
	free(t);
	free(mem);
	free(ids);
	return rc ? 1 : 0;
}

int
kvtb_ext_main(int argc, char **argv)
{
	struct xb_opts o = { .layers = 8, .heads = 8, .dim = 128, .tpb = 16, .blocks = 128,
			     .runs = 7, .lookup_tokens = 32768, .lookups = 2000 };
	int rc = xb_parse(argc, argv, &o);

	if (rc) {
		xb_usage(rc > 0 ? stdout : stderr);
		if (rc < 0)
			fprintf(stderr, "kvtier-bench ext: %s\n", kvt_last_error_message());
		return rc > 0 ? 0 : 2;
	}
	rc = xb_bandwidth(&o);
	if (!rc)
		rc = xb_lookup(&o);
	return rc;
}
