/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-bench/lock.c - `kvtier-bench lock`: does a resident sequence wait for other
 * sequences' NVMe loads? (hardening item 4: no call waits for IO holding the engine lock)
 *
 * One engine (emulated device, an NVME tier in --dir). N resident sequences (in HBM, never
 * demoted) are prepared and released in a loop by one thread, the prober, with --gap-us between
 * two prepares (a decode step's compute); the latency of each kvt_batch_prepare is recorded.
 * Each run has two phases of --seconds each, back to back in the same process:
 *   (a) idle     nothing else goes on;
 *   (b) loading  --loaders threads keep loading sequences from NVMe: each parks its session to
 *                NVMe (kvt_seq_park + kvt_engine_drain: HOST copies gone), then prepares it
 *                (NVMe -> HOST -> HBM), waits for its last layer, releases it, and again.
 * Printed per run: p50 and p99 of prepare in (a) and (b), the p99 ratio (b)/(a), the p99
 * difference, the sessions loaded and blocks read from NVMe in (b), and the load average; then
 * the medians over the runs. Target: p99 (b) <= 1.2 x p99 (a) and <= p99 (a) + 1 ms.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "kvtier.h"
#include "util.h"

#define LK_MAX_LOADERS 16u
#define LK_MAX_RUNS 51u
#define LK_RES_BLOCKS 4u /* blocks per resident sequence */

struct lk_opts {
	const char *dir;     /* --dir: the NVMe tier's file */
	uint32_t resident;   /* --resident: resident sequences */
	uint32_t loaders;    /* --loaders: loading threads */
	uint32_t tokens;     /* --tokens: tokens per loaded session */
	uint32_t runs;       /* --runs */
	double seconds;      /* --seconds per phase */
	uint32_t gap_us;     /* --gap-us between two prepares of the prober */
	uint32_t workers;    /* --workers: the NVMe tier's threads */
};

struct lk_loader {
	struct kvt_engine *e;
	kvt_seq_id s;         /* its session */
	atomic_bool *stop;    /* set when the phase ends */
	uint64_t loads;       /* sessions loaded */
	int rc;               /* first failure */
};

struct lk_phase {
	double p50_ms, p99_ms; /* prepare latency */
	uint64_t n;            /* prepares measured */
	uint64_t loads;        /* (b): sessions loaded */
	uint64_t nvme_blocks;  /* (b): blocks read from NVMe */
};

static int
lk_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static void
lk_sleep_us(uint32_t us)
{
	struct timespec ts = { .tv_sec = us / 1000000u, .tv_nsec = (long)(us % 1000000u) * 1000L };

	if (us)
		nanosleep(&ts, NULL);
}

/* Append @n tokens to @s; the K/V bytes are left as they are (the bench times bookkeeping). */
static int
lk_fill(struct kvt_engine *e, kvt_seq_id s, uint32_t n)
{
	int64_t *map = malloc(n * sizeof *map);
	int rc;

	if (!map)
		return -ENOMEM;
	rc = kvt_seq_append(e, s, NULL, n, map);
	free(map);
	return rc;
}

static void *
lk_loader_main(void *arg)
{
	struct lk_loader *l = arg;
	struct kvt_batch *b;
	int rc = 0;

	while (!rc && !atomic_load(l->stop)) {
		rc = kvt_seq_park(l->e, l->s, KVT_TIER_NVME);
		if (!rc)
			rc = kvt_engine_drain(l->e); /* on NVMe only: the prepare reads it back */
		if (!rc)
			rc = kvt_batch_prepare(l->e, &l->s, 1, &b);
		if (!rc) {
			rc = kvt_batch_wait_layer(b, 7, NULL);
			kvt_batch_release(b, NULL);
		}
		if (!rc)
			l->loads++;
	}
	if (rc)
		kvtr_err_kvt(rc, "loader");
	l->rc = rc;
	return NULL;
}

/* The prober for @seconds: prepare/release the resident sequences in turn. */
static int
lk_probe(struct kvt_engine *e, const kvt_seq_id *res, const struct lk_opts *o,
	 struct lk_phase *ph)
{
	uint64_t cap = 1u << 16, n = 0, *lat = malloc(cap * sizeof *lat);
	double end = kvtr_now() + o->seconds;
	int rc = 0;

	if (!lat)
		return kvtr_err(-ENOMEM, "latency samples");
	for (uint32_t i = 0; !rc && kvtr_now() < end; i = (i + 1) % o->resident) {
		struct kvt_batch *b;
		uint64_t t0 = kvtr_now_ns(), t1;

		rc = kvt_batch_prepare(e, &res[i], 1, &b);
		t1 = kvtr_now_ns();
		if (rc) {
			kvtr_err_kvt(rc, "prepare of a resident sequence");
			break;
		}
		kvt_batch_release(b, NULL);
		if (n == cap) {
			uint64_t *nl = realloc(lat, (cap *= 2) * sizeof *lat);

			if (!nl) {
				rc = kvtr_err(-ENOMEM, "latency samples");
				break;
			}
			lat = nl;
		}
		lat[n++] = t1 - t0;
		lk_sleep_us(o->gap_us);
	}
	if (!rc && n) {
		qsort(lat, n, sizeof *lat, lk_cmp);
		ph->n = n;
		ph->p50_ms = lat[n / 2] / 1e6;
		ph->p99_ms = lat[n - 1 - n / 100] / 1e6;
	}
	free(lat);
	return rc;
}

static int
lk_stats(struct kvt_engine *e, struct kvt_stats *s)
{
	memset(s, 0, sizeof *s);
	s->size = sizeof *s;
	return kvt_engine_stats(e, s);
}

/* One run: a fresh engine, phase (a), then phase (b). */
static int
lk_run(const struct lk_opts *o, struct lk_phase *pa, struct lk_phase *pb)
{
	uint32_t bpl = (o->tokens + 15) / 16, i;
	struct lk_loader ld[LK_MAX_LOADERS];
	pthread_t th[LK_MAX_LOADERS];
	kvt_seq_id res[256];
	struct kvt_engine_opts eo;
	struct kvt_engine *e = NULL;
	struct kvt_stats s0, s1;
	atomic_bool stop = false;
	uint32_t started = 0;
	int rc;

	kvt_engine_opts_init(&eo, sizeof eo);
	/* 8 layers, 8 KV heads, head_dim 128, bf16, 16 tokens: 512 KiB blocks */
	eo.layout = (struct kvt_layout){ .n_layers = 8, .n_kv_heads = 8, .head_dim = 128,
					 .dtype = KVT_DTYPE_BF16, .tokens_per_block = 16 };
	eo.hbm_bytes = (uint64_t)(o->resident * LK_RES_BLOCKS + o->loaders * bpl + 8) << 19;
	eo.host_bytes = (uint64_t)(o->loaders * bpl * 2 + 16) << 19;
	eo.nvme_dir = o->dir;
	eo.nvme_bytes = (uint64_t)(o->loaders * bpl * 2 + 16) * ((512u << 10) + 4096);
	eo.high_watermark = eo.low_watermark = 1.0f;
	eo.nvme_workers = o->workers;
	rc = kvt_engine_create(&eo, &e);
	if (rc)
		return kvtr_err_kvt(rc, "engine");
	for (i = 0; !rc && i < o->resident; i++) {
		rc = kvt_seq_open(e, NULL, &res[i]);
		if (!rc)
			rc = lk_fill(e, res[i], LK_RES_BLOCKS * 16);
	}
	for (i = 0; !rc && i < o->loaders; i++) {
		ld[i] = (struct lk_loader){ .e = e, .stop = &stop };
		rc = kvt_seq_open(e, NULL, &ld[i].s);
		if (!rc)
			rc = lk_fill(e, ld[i].s, o->tokens);
	}
	if (rc) {
		kvtr_err_kvt(rc, "setting up the sequences");
		goto out;
	}
	rc = lk_probe(e, res, o, pa);
	if (!rc)
		rc = lk_stats(e, &s0);
	for (i = 0; !rc && i < o->loaders; i++, started++)
		if (pthread_create(&th[i], NULL, lk_loader_main, &ld[i]))
			rc = kvtr_err(-EAGAIN, "starting a loader thread");
	if (!rc)
		rc = lk_probe(e, res, o, pb);
	atomic_store(&stop, true);
	for (i = 0; i < started; i++) {
		pthread_join(th[i], NULL);
		if (!rc && ld[i].rc)
			rc = ld[i].rc;
		pb->loads += ld[i].loads;
	}
	if (!rc)
		rc = lk_stats(e, &s1);
	if (!rc)
		pb->nvme_blocks = s1.blocks_moved[KVT_MOVE_NVME_TO_HOST] - s0.blocks_moved[KVT_MOVE_NVME_TO_HOST];
out:
	kvt_engine_destroy(e);
	return rc;
}

static void
lk_usage(FILE *f)
{
	fprintf(f, "usage: kvtier-bench lock [--dir DIR] [--resident 10] [--loaders 2] "
		   "[--tokens 512]\n"
		   "         [--runs 5] [--seconds 1] [--gap-us 100] [--workers 2]\n"
		   "The p99 latency of kvt_batch_prepare of --resident fully resident sequences (4\n"
		   "blocks of 512 KiB each), (a) with nothing else going on and (b) while --loaders\n"
		   "threads keep parking a --tokens session to NVMe and loading it back, --seconds\n"
		   "each, --runs runs (medians printed). DIR (default .) holds the NVMe tier's file.\n"
		   "Target: p99 (b) <= 1.2 x p99 (a) and <= p99 (a) + 1 ms.\n"
		   "Exit status: 0 done; 2 usage error (bad option or value), before anything\n"
		   "runs; 1 the run failed.\n");
}

static int
lk_parse(int argc, char **argv, struct lk_opts *o)
{
	for (int i = 1; i < argc; i++) {
		const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		float secs;
		int rc;

		if (!strcmp(k, "-h") || !strcmp(k, "--help"))
			return 1;
		if (!v)
			return kvtr_err(-EINVAL, "%s: missing value or unknown option (see --help)",
					k);
		i++;
		if (!strcmp(k, "--dir"))
			o->dir = v, rc = 0;
		else if (!strcmp(k, "--resident"))
			rc = kvtr_parse_u32(k, v, 1, 256, &o->resident);
		else if (!strcmp(k, "--loaders"))
			rc = kvtr_parse_u32(k, v, 0, LK_MAX_LOADERS, &o->loaders);
		else if (!strcmp(k, "--tokens"))
			rc = kvtr_parse_u32(k, v, 16, 1u << 16, &o->tokens);
		else if (!strcmp(k, "--runs"))
			rc = kvtr_parse_u32(k, v, 1, LK_MAX_RUNS, &o->runs);
		else if (!strcmp(k, "--gap-us"))
			rc = kvtr_parse_u32(k, v, 0, 1000000, &o->gap_us);
		else if (!strcmp(k, "--workers"))
			rc = kvtr_parse_u32(k, v, 0, 16, &o->workers);
		else if (!strcmp(k, "--seconds")) {
			rc = kvtr_parse_float(k, v, 0.01f, 600.0f, &secs);
			o->seconds = secs;
		} else
			rc = kvtr_err(-EINVAL, "unknown option %s (see --help)", k);
		if (rc)
			return rc;
	}
	if (access(o->dir, W_OK))
		return kvtr_err(-EINVAL, "--dir %s: not a writable directory", o->dir);
	return 0;
}

int
kvtb_lock_main(int argc, char **argv)
{
	struct lk_opts o = { .dir = ".", .resident = 10, .loaders = 2, .tokens = 512, .runs = 5,
			     .seconds = 1.0, .gap_us = 100, .workers = 2 };
	double a99[LK_MAX_RUNS], b99[LK_MAX_RUNS], a50[LK_MAX_RUNS], b50[LK_MAX_RUNS];
	double ratio[LK_MAX_RUNS], diff[LK_MAX_RUNS], la[3] = { 0 };
	int rc = lk_parse(argc, argv, &o);
	uint32_t r;

	if (rc == 1) {
		lk_usage(stdout);
		return 0;
	}
	if (rc) {
		fprintf(stderr, "kvtier-bench lock: %s\n", kvtr_last_error());
		return 2;
	}
	printf("lock: %u resident sequences (4 x 512 KiB blocks) prepared/released, gap %u us; "
	       "%u loader threads (%u-token sessions NVMe -> HBM), %u NVMe workers, %.2f s per "
	       "phase, %u runs\n\n", o.resident, o.gap_us, o.loaders, o.tokens, o.workers,
	       o.seconds, o.runs);
	printf("| run | (a) idle p50 ms | (a) p99 ms | (b) loading p50 ms | (b) p99 ms | p99 "
	       "ratio | p99 diff ms | loads | NVMe blocks read | loadavg |\n");
	printf("|---|---|---|---|---|---|---|---|---|---|\n");
	for (r = 0; r < o.runs; r++) {
		struct lk_phase pa = { 0 }, pb = { 0 };

		rc = lk_run(&o, &pa, &pb);
		if (rc) {
			fprintf(stderr, "kvtier-bench lock: %s\n", kvtr_last_error());
			return 1;
		}
		if (getloadavg(la, 3) < 1)
			la[0] = -1;
		a50[r] = pa.p50_ms, a99[r] = pa.p99_ms, b50[r] = pb.p50_ms, b99[r] = pb.p99_ms;
		ratio[r] = pa.p99_ms > 0 ? pb.p99_ms / pa.p99_ms : 0;
		diff[r] = pb.p99_ms - pa.p99_ms;
		printf("| %u | %.4f | %.4f | %.4f | %.4f | %.2f | %+.4f | %llu | %llu | %.2f |\n",
		       r + 1, pa.p50_ms, pa.p99_ms, pb.p50_ms, pb.p99_ms, ratio[r], diff[r],
		       (unsigned long long)pb.loads, (unsigned long long)pb.nvme_blocks, la[0]);
		fflush(stdout);
	}
	{
		double mr = kvtb_median(ratio, o.runs), md = kvtb_median(diff, o.runs);

		printf("| median | %.4f | %.4f | %.4f | %.4f | %.2f | %+.4f | | | %.2f |\n\n",
		       kvtb_median(a50, o.runs), kvtb_median(a99, o.runs), kvtb_median(b50, o.runs),
		       kvtb_median(b99, o.runs), mr, md, la[0]);
		printf("target p99 (b) <= 1.2 x (a) and <= (a) + 1 ms: %s\n",
		       mr <= 1.2 && md <= 1.0 ? "met" : mr <= 1.2 || md <= 1.0 ?
		       (md <= 1.0 ? "1 ms met, 1.2x missed" : "1.2x met, 1 ms missed") : "missed");
	}
	return 0;
}
