/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-bench/remote.c - `kvtier-bench remote`: the REMOTE tier's client (tiers/remote.h)
 * against redis-benchmark on the same server, in the same run.
 *
 * For each block size (default 256 KiB and 2 MiB): batched put and get of --blocks blocks
 * (default 64) through kvt_remote_put_blocks / kvt_remote_get_blocks (one pipelined round
 * each; header + XXH3 checks included), and redis-benchmark -t set,get -d SIZE -P BLOCKS -c 1
 * (one connection, the same pipeline depth and value size). Several runs (--runs), medians,
 * the ratio kvtier / redis-benchmark (payload bytes per second; kvtier's 128-byte header is not
 * counted), round trips per batch from the client's counter, and the p99 of a get batch's
 * latency over every batch of every run. The server is one this mode starts on a free
 * loopback port (redis-server, no persistence), or --host/--port.
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "kvtier.h"
#include "tiers/remote.h"
#include "util.h"

#define RB_MAX_SIZES 4
#define RB_MAX_RUNS 64

struct rb_opts {
	const char *host;          /* server; NULL: start one */
	uint16_t port;             /* its port */
	uint64_t sizes[RB_MAX_SIZES]; /* block sizes */
	uint32_t n_sizes;          /* entries */
	uint32_t blocks;           /* blocks per batch (and redis-benchmark's -P) */
	uint32_t runs;             /* runs per size */
	uint32_t gets;             /* get batches per run */
	bool redis_benchmark;      /* run redis-benchmark next to it */
};

static void
rb_usage(FILE *f)
{
	fprintf(f, "usage: kvtier-bench remote [--host H --port P] [--sizes 256K,2M] "
		   "[--blocks 64] [--runs 5]\n"
		   "         [--gets 10] [--no-redis-benchmark]\n"
		   "Without --host a redis-server is started on a free loopback port (no\n"
		   "persistence, maxmemory 4gb allkeys-lru) and killed at the end. --sizes: block\n"
		   "sizes (K/M suffixes; each must be a layout's block: 256K and 2M are; others are\n"
		   "refused); --blocks: blocks per batch, also redis-benchmark's pipeline depth\n"
		   "(-P); --runs: runs per size (medians); --gets: get batches per run (the p99\n"
		   "is over all of them).\n"
		   "Exit status: 0 done; 2 usage error, before anything runs; 1 the run failed.\n");
}

/* A layout whose blocks are @bytes (f16, 128-dim heads). */
static int
rb_layout(uint64_t bytes, struct kvt_layout *l)
{
	*l = (struct kvt_layout){ .n_kv_heads = 8, .head_dim = 128, .dtype = KVT_DTYPE_F16,
				  .tokens_per_block = 16 };
	/* n_layers * 2 * 16 * 8 * 128 * 2 = n_layers * 64 KiB */
	if (bytes < (64u << 10) || bytes % (64u << 10) || bytes / (64u << 10) > 4096)
		return kvtr_err(-EINVAL, "--sizes: %llu bytes is not a multiple of 64 KiB "
				"(64 KiB..256 MiB)", (unsigned long long)bytes);
	l->n_layers = (uint32_t)(bytes / (64u << 10));
	return 0;
}

/* redis-benchmark's requests/s of SET and GET (--csv). Returns 0 or -1. */
static int
rb_redis_benchmark(const struct rb_opts *o, const char *host, uint16_t port, uint64_t size,
		   bool cluster, double *set_rps, double *get_rps)
{
	char cmd[512], line[512];
	FILE *p;

	*set_rps = *get_rps = 0;
	snprintf(cmd, sizeof cmd, "redis-benchmark -h %s -p %u -t set,get -d %llu -P %u -c 1 "
		 "-n %u --csv%s 2>/dev/null", host, port, (unsigned long long)size, o->blocks,
		 o->blocks * 10, cluster ? " --cluster" : "");
	p = popen(cmd, "r");
	if (!p)
		return -1;
	while (fgets(line, sizeof line, p)) {
		double v = 0;

		if (!strncmp(line, "\"SET\",\"", 7))
			*set_rps = (v = strtod(line + 7, NULL));
		else if (!strncmp(line, "\"GET\",\"", 7))
			*get_rps = (v = strtod(line + 7, NULL));
	}
	pclose(p);
	return *set_rps > 0 && *get_rps > 0 ? 0 : -1;
}

struct rb_point {
	double put[RB_MAX_RUNS], get[RB_MAX_RUNS];  /* kvtier GB/s per run (get: median batch) */
	double rset[RB_MAX_RUNS], rget[RB_MAX_RUNS]; /* redis-benchmark GB/s per run */
	double *lat;                                 /* every get batch's seconds */
	uint32_t n_lat;                              /* entries */
	double rt_put, rt_get;                       /* round trips per batch */
};

/* One run of one size: put a batch of new blocks, get it --gets times, delete it. */
static int
rb_run(const struct rb_opts *o, struct kvt_remote *r, const struct kvt_rv_ns *ns,
       uint8_t **src, uint8_t **dst, uint8_t (*hash)[16], int *res, struct rb_point *pt,
       uint32_t run)
{
	struct kvt_remote_stats s0, s1;
	double bytes = (double)o->blocks * (double)ns->block_bytes, t, g[256];
	char (*keys)[KVT_RV_KEY_MAX] = malloc((size_t)o->blocks * KVT_RV_KEY_MAX);
	const char **kp = malloc(o->blocks * sizeof *kp);
	size_t *kl = malloc(o->blocks * sizeof *kl);
	int rc = 0, got;

	if (!keys || !kp || !kl) {
		free(keys), free(kp), free(kl);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < o->blocks; i++) {
		for (int k = 0; k < 16; k++)
			hash[i][k] = (uint8_t)rand();
		kl[i] = kvt_rv_key(ns, 1, hash[i], keys[i]);
		kp[i] = keys[i];
	}
	kvt_remote_stats(r, &s0);
	t = kvtr_now();
	got = kvt_remote_put_blocks(r, ns, 1, (const uint8_t(*)[16])hash,
				    (const void *const *)src, o->blocks, res);
	pt->put[run] = bytes / (kvtr_now() - t) / 1e9;
	kvt_remote_stats(r, &s1);
	pt->rt_put += (double)(s1.round_trips - s0.round_trips);
	if (got != (int)o->blocks)
		rc = kvtr_err(-EIO, "put: %d of %u blocks stored: %s", got, o->blocks,
			      kvt_last_error_message());
	for (uint32_t k = 0; rc == 0 && k < o->gets; k++) {
		kvt_remote_stats(r, &s0);
		t = kvtr_now();
		got = kvt_remote_get_blocks(r, ns, 1, (const uint8_t(*)[16])hash,
					    (void *const *)dst, o->blocks, res);
		g[k] = kvtr_now() - t;
		kvt_remote_stats(r, &s1);
		pt->rt_get += (double)(s1.round_trips - s0.round_trips);
		pt->lat[pt->n_lat++] = g[k];
		if (got != (int)o->blocks)
			rc = kvtr_err(-EIO, "get: %d of %u blocks verified: %s", got, o->blocks,
				      kvt_last_error_message());
	}
	if (rc == 0 && memcmp(src[0], dst[0], ns->block_bytes))
		rc = kvtr_err(-EIO, "get: block 0 came back with other bytes");
	if (rc == 0)
		pt->get[run] = bytes / kvtb_median(g, o->gets) / 1e9;
	(void)kvt_remote_del(r, kp, kl, o->blocks, NULL);
	free(keys), free(kp), free(kl);
	return rc;
}

static int
rb_size(const struct rb_opts *o, struct kvt_remote *r, const char *host, uint16_t port,
	uint64_t size)
{
	struct kvt_rv_desc d = { .model_id = "kvtier-bench-remote", .tp_size = 1, .pp_size = 1 };
	struct rb_point pt = { .n_lat = 0 };
	uint8_t **src = calloc(o->blocks, sizeof *src), **dst = calloc(o->blocks, sizeof *dst);
	uint8_t (*hash)[16] = calloc(o->blocks, 16);
	int *res = calloc(o->blocks, sizeof *res);
	struct kvt_rv_ns ns;
	int rc = rb_layout(size, &d.layout);

	pt.lat = calloc((size_t)o->runs * o->gets, sizeof *pt.lat);
	if (rc == 0 && (!src || !dst || !hash || !res || !pt.lat))
		rc = -ENOMEM;
	if (rc == 0 && kvt_rv_ns_init(&ns, &d))
		rc = kvtr_err(-EINVAL, "%s", kvt_last_error_message());
	for (uint32_t i = 0; rc == 0 && i < o->blocks; i++) {
		src[i] = malloc(size);
		dst[i] = malloc(size);
		if (!src[i] || !dst[i]) {
			rc = -ENOMEM;
			break;
		}
		for (uint64_t k = 0; k < size; k++)
			src[i][k] = (uint8_t)(k * 2654435761u >> 13 ^ i);
	}
	for (uint32_t run = 0; rc == 0 && run < o->runs; run++) {
		double srps, grps;

		rc = rb_run(o, r, &ns, src, dst, hash, res, &pt, run);
		if (rc == 0 && o->redis_benchmark) {
			if (rb_redis_benchmark(o, host, port, size, kvt_remote_is_cluster(r), &srps,
					       &grps))
				rc = kvtr_err(-EIO, "redis-benchmark failed (is it installed?)");
			pt.rset[run] = srps * (double)size / 1e9;
			pt.rget[run] = grps * (double)size / 1e9;
		}
	}
	if (rc == 0) {
		double put = kvtb_median(pt.put, o->runs), get = kvtb_median(pt.get, o->runs);
		double rs = o->redis_benchmark ? kvtb_median(pt.rset, o->runs) : 0;
		double rg = o->redis_benchmark ? kvtb_median(pt.rget, o->runs) : 0;
		uint32_t i99 = (uint32_t)((pt.n_lat - 1) * 0.99 + 0.5);

		qsort(pt.lat, pt.n_lat, sizeof *pt.lat, kvtb_cmp_double);
		printf("%-7s put  %8.3f  %8.3f  %6.2fx  %5.2f       -\n",
		       size >= (1u << 20) ? "2 MiB" : "256 KiB", put, rs, rs ? put / rs : 0,
		       pt.rt_put / o->runs);
		printf("%-7s get  %8.3f  %8.3f  %6.2fx  %5.2f  %8.2f\n",
		       size >= (1u << 20) ? "2 MiB" : "256 KiB", get, rg, rg ? get / rg : 0,
		       pt.rt_get / ((double)o->runs * o->gets), pt.lat[i99] * 1e3);
	}
	for (uint32_t i = 0; src && dst && i < o->blocks; i++) {
		free(src[i]);
		free(dst[i]);
	}
	free(src), free(dst), free(hash), free(res), free(pt.lat);
	return rc;
}

/* Start redis-server on a free port (daemonized, pid file). Returns its pid or -1. */
static pid_t
rb_server(uint16_t *port)
{
	char cmd[512], pidf[128];

	for (int t = 0; t < 50; t++) {
		struct kvt_remote *r = NULL;
		struct kvt_remote_opts ro = { .cluster = -1 };
		FILE *f;
		pid_t pid = 0;

		*port = (uint16_t)(20000 + (getpid() * 7 + t * 7919) % 25000);
		ro.port = *port;
		if (kvt_remote_open(&ro, &r) == 0) { /* taken */
			kvt_remote_close(r);
			continue;
		}
		snprintf(pidf, sizeof pidf, "/tmp/kvtier-bench-redis-%u.pid", *port);
		snprintf(cmd, sizeof cmd, "redis-server --port %u --bind 127.0.0.1 --save '' "
			 "--appendonly no --daemonize yes --pidfile %s --dir /tmp --maxmemory 4gb "
			 "--maxmemory-policy allkeys-lru --logfile /dev/null", *port, pidf);
		if (system(cmd) != 0)
			return -1;
		for (int w = 0; w < 100 && pid <= 0; w++) {
			usleep(50000);
			f = fopen(pidf, "r");
			if (f) {
				if (fscanf(f, "%d", &pid) != 1)
					pid = 0;
				fclose(f);
			}
		}
		if (pid > 0) {
			for (int w = 0; w < 100; w++) {
				if (kvt_remote_open(&ro, &r) == 0) {
					kvt_remote_close(r);
					return pid;
				}
				usleep(50000);
			}
			kill(pid, SIGKILL);
		}
		return -1;
	}
	return -1;
}

static int
rb_parse(int argc, char **argv, struct rb_opts *o)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		uint32_t u;
		int rc = 0;

		if (!strcmp(a, "-h") || !strcmp(a, "--help"))
			return 1;
		if (!strcmp(a, "--no-redis-benchmark")) {
			o->redis_benchmark = false;
			continue;
		}
		if (!v)
			return kvtr_err(-EINVAL, "%s: missing value (see --help)", a);
		i++;
		if (!strcmp(a, "--host")) {
			o->host = v;
		} else if (!strcmp(a, "--port")) {
			rc = kvtr_parse_u32("--port", v, 1, 65535, &u);
			o->port = (uint16_t)u;
		} else if (!strcmp(a, "--blocks")) {
			rc = kvtr_parse_u32("--blocks", v, 1, 1024, &o->blocks);
		} else if (!strcmp(a, "--runs")) {
			rc = kvtr_parse_u32("--runs", v, 1, RB_MAX_RUNS, &o->runs);
		} else if (!strcmp(a, "--gets")) {
			rc = kvtr_parse_u32("--gets", v, 1, 256, &o->gets);
		} else if (!strcmp(a, "--sizes")) {
			char buf[256], *save = NULL;

			snprintf(buf, sizeof buf, "%s", v);
			o->n_sizes = 0;
			for (char *t = strtok_r(buf, ",", &save); t && rc == 0;
			     t = strtok_r(NULL, ",", &save)) {
				struct kvt_layout l;

				if (o->n_sizes == RB_MAX_SIZES)
					return kvtr_err(-EINVAL, "--sizes: at most %d", RB_MAX_SIZES);
				rc = kvtr_parse_bytes("--sizes", t, 1, 256u << 20,
						      &o->sizes[o->n_sizes]);
				if (rc == 0)
					rc = rb_layout(o->sizes[o->n_sizes++], &l);
			}
			if (rc == 0 && o->n_sizes == 0)
				rc = kvtr_err(-EINVAL, "--sizes: empty");
		} else {
			return kvtr_err(-EINVAL, "unknown option '%s' (see --help)", a);
		}
		if (rc)
			return rc;
	}
	if (!o->host != !o->port)
		return kvtr_err(-EINVAL, "--host and --port go together");
	return 0;
}

/* The 1, 5 and 15 minute load averages ("1.20 0.98 0.77"), or "". */
static void
rb_loadavg(char *out, size_t cap)
{
	FILE *f = fopen("/proc/loadavg", "r");
	int sp = 0;

	out[0] = '\0';
	if (f) {
		if (!fgets(out, (int)cap, f))
			out[0] = '\0';
		fclose(f);
	}
	for (char *p = out; *p; p++)
		if (*p == '\n' || (*p == ' ' && ++sp == 3)) {
			*p = '\0';
			break;
		}
}

int
kvtb_remote_main(int argc, char **argv)
{
	struct rb_opts o = { .sizes = { 256u << 10, 2u << 20 }, .n_sizes = 2, .blocks = 64,
			     .runs = 5, .gets = 10, .redis_benchmark = true };
	struct kvt_remote_opts ro = { .op_timeout_ms = 30000, .connect_timeout_ms = 5000 };
	struct kvt_remote *r = NULL;
	char la0[128], la1[128];
	const char *host;
	pid_t pid = 0;
	int rc = rb_parse(argc, argv, &o);

	if (rc == 1) {
		rb_usage(stdout);
		return 0;
	}
	if (rc) {
		fprintf(stderr, "kvtier-bench remote: %s\n", kvtr_last_error());
		return 2;
	}
	if (o.redis_benchmark && system("command -v redis-benchmark >/dev/null 2>&1") != 0) {
		fprintf(stderr, "kvtier-bench remote: redis-benchmark not found (apt-get install "
				"redis-tools): kvtier figures only\n");
		o.redis_benchmark = false;
	}
	if (!o.host) {
		pid = rb_server(&o.port);
		if (pid <= 0) {
			fprintf(stderr, "kvtier-bench remote: could not start redis-server (apt-get "
					"install redis-server, or give --host/--port)\n");
			return 1;
		}
	}
	host = o.host ? o.host : "127.0.0.1";
	ro.host = host;
	ro.port = o.port;
	rc = kvt_remote_open(&ro, &r);
	rb_loadavg(la0, sizeof la0);
	if (rc == 0) {
		printf("kvtier-bench remote: server %s:%u%s%s, %u blocks per batch, %u runs, %u "
		       "gets per run\n", host, o.port, pid ? " (started here)" : "",
		       kvt_remote_is_cluster(r) ? " (cluster)" : "", o.blocks, o.runs, o.gets);
		printf("GB/s of payload; ratio = kvtier / redis-benchmark (-P %u -c 1, same "
		       "size); rt = round trips per batch\n", o.blocks);
		printf("size    op     kvtier  r-bench    ratio     rt  p99 ms\n");
	} else {
		fprintf(stderr, "kvtier-bench remote: %s\n", kvt_last_error_message());
	}
	for (uint32_t s = 0; rc == 0 && s < o.n_sizes; s++) {
		rc = rb_size(&o, r, host, o.port, o.sizes[s]);
		if (rc)
			fprintf(stderr, "kvtier-bench remote: %s\n", kvtr_last_error());
	}
	rb_loadavg(la1, sizeof la1);
	if (rc == 0)
		printf("load average: %s at start, %s at end\n", la0, la1);
	kvt_remote_close(r);
	if (pid > 0) {
		kill(pid, SIGTERM);
		for (int w = 0; w < 100 && kill(pid, 0) == 0; w++)
			usleep(20000);
	}
	return rc ? 1 : 0;
}
