/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-bench/nvme.c - `kvtier-bench nvme`: the NVMe tier against fio on the same
 * filesystem.
 *
 *  1. Block-sized demote (write) and promote (read) through the NVMe tier itself (io_uring,
 *     O_DIRECT, raw blocks zero-copy from and to registered HOST memory laid out as the
 *     engine's, or through the staging buffers with --staged; header + checksum per block, read
 *     verification included), at each block size and queue depth, next to fio (io_uring
 *     engine, O_DIRECT, same directory, block size and depth, sequential), with the
 *     kvtier/fio ratio.
 *  2. Park and resume of N sessions of 4k tokens through the whole engine (emulated device):
 *     park = HBM -> HOST -> NVMe until durable on NVMe, resume = NVMe -> HOST -> HBM until a
 *     batch holding the session is ready; tokens/s and GB/s, and the ratio to fio at the
 *     engine's block size and queue depth; for the single layout and a hybrid one (a FULL
 *     and a STATE group, nvme_hybrid.c).
 *  3. The codec table on real K/V (nvme_codec.c).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "bench.h"
#include "kvtier.h"
#include "nvme_int.h"
#include "tiers/tier_nvme.h"
#include "util.h"

#define NB_MAX_LIST 8
#define NB_MODEL "../shared/data/models/stories260K.bin"
#define NB_TOK "../shared/data/models/tok512.bin"

struct nb_opts {
	const char *dir;              /* where the tier's and fio's files go */
	size_t bs[NB_MAX_LIST];       /* block sizes (IO sizes), bytes */
	uint32_t n_bs;                /* entries */
	uint32_t qd[NB_MAX_LIST];     /* queue depths */
	uint32_t n_qd;                /* entries */
	uint64_t bytes;               /* bytes per measurement */
	uint32_t sessions;            /* park/resume sessions */
	uint32_t tokens;              /* tokens per session */
	uint32_t host_blocks;         /* park/resume: HOST tier size in 2 MiB blocks */
	bool fio;                     /* run fio next to kvtier */
	bool tier, park, codec;       /* which parts run */
	const char *model, *tok;      /* codec table inputs */
	int nvme_codec;               /* park/resume: the engine's NVMe codec */
	uint32_t workers;             /* the NVMe tier's worker threads (engine's nvme_workers) */
	bool staged;                  /* tier table, park/resume: no zero-copy (IO through
	                                 staging) */
	uint32_t layout;              /* park/resume: NB_LAYOUT_* bits (--layout) */
};

#define NB_LAYOUT_SINGLE 1u /* the single layout: 32 layers in one FULL group */
#define NB_LAYOUT_HYBRID 2u /* a FULL + a STATE group (nvme_hybrid.c) */

/* engine/engine.c's test hook: --staged refuses the HOST registration with it. */
extern const struct kvt_nvme_fault_hooks *kvt_test_nvme_hooks;

/* ---- fio ----------------------------------------------------------------------------------- */

/* bw_bytes of the "read" or "write" section of fio's JSON. */
static double
nb_fio_bw(const char *json, bool write)
{
	const char *p = strstr(json, write ? "\"write\" :" : "\"read\" :");

	p = p ? strstr(p, "\"bw_bytes\"") : NULL;
	p = p ? strchr(p, ':') : NULL;
	return p ? strtod(p + 1, NULL) : 0;
}

/* Run fio once; returns bytes/s or 0 when fio failed. */
static double
nb_fio(const struct nb_opts *o, size_t bs, uint32_t qd, uint64_t bytes, bool write)
{
	char cmd[1024], *json = NULL;
	size_t len = 0, cap = 0;
	double bw;
	FILE *p;

	snprintf(cmd, sizeof cmd,
		 "fio --name=kvtb --filename=%s/kvtier-bench-fio.dat --size=%llu --bs=%zu "
		 "--iodepth=%u --ioengine=io_uring --direct=1 --rw=%s --output-format=json "
		 "2>/dev/null", o->dir, (unsigned long long)bytes, bs, qd,
		 write ? "write" : "read");
	p = popen(cmd, "r");
	if (!p)
		return 0;
	for (;;) {
		if (len + 4096 + 1 > cap) {
			char *n = realloc(json, cap = cap * 2 + 8192);

			if (!n)
				break;
			json = n;
		}
		size_t got = fread(json + len, 1, 4096, p);

		if (got == 0)
			break;
		len += got;
	}
	pclose(p);
	if (!json)
		return 0;
	json[len] = '\0';
	bw = nb_fio_bw(json, write);
	free(json);
	return bw;
}

static void
nb_fio_clean(const struct nb_opts *o)
{
	char path[1024];

	snprintf(path, sizeof path, "%s/kvtier-bench-fio.dat", o->dir);
	unlink(path);
}

/* ---- the tier alone ------------------------------------------------------------------------ */

/* The HOST memory of a tier point: its slots, as the engine lays them out (tier_nvme.h). */
struct nb_host {
	uint8_t *base;  /* 2 MiB aligned, transparent huge pages asked for; NULL = staged */
	size_t len;     /* bytes */
	size_t stride;  /* bytes between slots */
	size_t off;     /* a block's data offset in its slot */
};

/* Write (or read) every slot of @n once through kvt_nvme_put/get (as the engine does: zero-copy
 * from and to @h's slot of the same number, or through staging from @src/@dst when @h has no
 * memory), keeping @qd IOs in flight. Returns bytes/s or -1. */
static double
nb_tier_pass(struct kvt_nvme *n, uint32_t qd, const struct nb_host *h, uint8_t *src,
	     uint8_t *dst, bool write)
{
	struct kvt_nvme_wmeta m = { .index = 0 };
	struct kvt_nvme_cqe c[64];
	uint32_t slots = kvt_nvme_n_slots(n), next = 0, done = 0;
	double t0 = kvtr_now();
	int r;

	while (done < slots) {
		while (next < slots && kvt_nvme_free_qd(n) > 0) {
			uint8_t *hs = h->base ? h->base + next * h->stride + h->off : NULL;

			r = write ? kvt_nvme_put(n, next, hs ? hs : src, &m, next)
				  : kvt_nvme_get(n, next, hs ? hs : dst, next);
			if (r)
				return -1;
			next++;
		}
		r = kvt_nvme_reap(n, c, qd < 64 ? qd : 64, true);
		if (r < 0)
			return -1;
		for (int i = 0; i < r; i++)
			if (c[i].res != 0) {
				fprintf(stderr, "nvme bench: IO failed: %s\n",
					kvt_strerror(c[i].res));
				return -1;
			}
		done += (uint32_t)r;
	}
	return (double)slots * (double)kvt_nvme_slot_bytes(n) / (kvtr_now() - t0);
}

/* HOST memory for @slots slots of @bs-byte IOs (block_bytes = bs - 4096), laid out as the
 * engine lays out its HOST tier for blocks this large: a 4 KiB header room, then the data.
 * Returns 0 or -ENOMEM. */
static int
nb_host_alloc(struct nb_host *h, size_t bs, uint32_t slots)
{
	size_t huge = (size_t)2 << 20;

	h->stride = bs; /* header room, then the data: one IO per put */
	h->off = KVT_FMT_HDR_PAGE;
	h->len = ((size_t)slots * h->stride + huge - 1) & ~(huge - 1);
	if (posix_memalign((void **)&h->base, huge, h->len))
		return -ENOMEM;
	(void)madvise(h->base, h->len, MADV_HUGEPAGE);
	for (size_t i = 0; i < h->len; i++)
		h->base[i] = (uint8_t)(i * 2654435761u >> 13);
	return 0;
}

static int
nb_tier_point(const struct nb_opts *o, size_t bs, uint32_t qd, double *w, double *rd)
{
	struct nb_host h = { 0 };
	struct kvt_nvme_opts no = {
		.dir = o->dir,
		.capacity_bytes = o->bytes,
		.block_bytes = bs - KVT_FMT_HDR_PAGE, /* one IO of exactly bs bytes (header page) */
		.queue_depth = qd,
		.workers = o->workers,
	};
	struct kvt_nvme *n = NULL;
	char err[256];
	uint8_t *src = malloc(bs), *dst = malloc(bs);
	int rc = src && dst ? 0 : -ENOMEM;

	if (rc == 0 && !o->staged)
		rc = nb_host_alloc(&h, bs, (uint32_t)(o->bytes / bs) + 1);
	if (rc == 0) {
		for (size_t i = 0; i < bs; i++)
			src[i] = (uint8_t)(i * 2654435761u >> 13);
		no.host_base = h.base;
		no.host_len = h.len;
		no.host_stride = h.stride;
		no.host_data_off = h.off;
		rc = kvt_nvme_open(&no, &n, err, sizeof err);
		if (rc)
			fprintf(stderr, "nvme bench: %s\n", err);
	}
	if (rc == 0 && h.base && !kvt_nvme_zero_copy(n))
		fprintf(stderr, "nvme bench: no zero-copy: %s\n", kvt_nvme_zc_reason(n));
	if (rc == 0) {
		*w = nb_tier_pass(n, qd, &h, src, dst, true);
		*rd = nb_tier_pass(n, qd, &h, src, dst, false);
		kvt_nvme_close(n);
		rc = *w < 0 || *rd < 0 ? -EIO : 0;
	}
	free(h.base);
	free(src);
	free(dst);
	return rc;
}

/* The transparent huge page mode ("always", "madvise", "never"; "?" when unknown) into @buf:
 * fio's buffers get huge pages only with "always", kvtier's also with "madvise". */
static const char *
nb_thp_mode(char *buf, size_t len)
{
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
	char line[128] = "", *a, *b;

	snprintf(buf, len, "?");
	if (!f)
		return buf;
	if (fgets(line, sizeof line, f) && (a = strchr(line, '[')) && (b = strchr(a, ']'))) {
		*b = '\0';
		snprintf(buf, len, "%s", a + 1);
	}
	fclose(f);
	return buf;
}

/* "fio GB/s | ratio |" of one point, "- | - |" when fio did not run (--no-fio, no fio, failed). */
static void
nb_fio_cols(double fio, double kvtier)
{
	if (fio > 0)
		printf("%.2f | %.2f |", fio / 1e9, kvtier / fio);
	else
		printf("- | - |");
}

static int
nb_tier_table(const struct nb_opts *o)
{
	char thp[32];

	printf("\nNVMe tier vs fio (io_uring, O_DIRECT, sequential, %llu MiB per point, "
	       "dir %s, %s, %u workers, THP %s)\n\n", (unsigned long long)(o->bytes >> 20), o->dir,
	       o->staged ? "staged: no zero-copy" : "zero-copy from HOST memory", o->workers,
	       nb_thp_mode(thp, sizeof thp));
	printf("| block | QD | kvtier write GB/s | fio write GB/s | ratio | kvtier read GB/s "
	       "| fio read GB/s | ratio |\n|---|---|---|---|---|---|---|---|\n");
	for (uint32_t b = 0; b < o->n_bs; b++)
		for (uint32_t q = 0; q < o->n_qd; q++) {
			double w = 0, r = 0, fw = 0, fr = 0;
			size_t bs = o->bs[b];
			int rc = nb_tier_point(o, bs, o->qd[q], &w, &r);

			if (rc)
				return rc;
			if (o->fio) {
				fw = nb_fio(o, bs, o->qd[q], o->bytes, true);
				fr = nb_fio(o, bs, o->qd[q], o->bytes, false);
				nb_fio_clean(o);
			}
			printf("| %zu KiB | %u | %.2f | ", bs >> 10, o->qd[q], w / 1e9);
			nb_fio_cols(fw, w);
			printf(" %.2f | ", r / 1e9);
			nb_fio_cols(fr, r);
			printf("\n");
			fflush(stdout);
		}
	return 0;
}

/* ---- park and resume through the engine ---------------------------------------------------- */

void
kvtb_fill_bf16(uint8_t *p, size_t n, uint64_t seed)
{
	uint64_t x = seed | 1;

	for (size_t i = 0; i + 8 <= n; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		/* bf16-like: sign and exponent bytes narrow, mantissa bytes noisy */
		x = (x & 0x00ff00ff00ff00ffull) | 0x3c003c003c003c00ull;
		memcpy(p + i, &x, 8);
	}
}

int
kvtb_park_nvme(struct kvt_engine *e, kvt_seq_id s, uint32_t *reparks)
{
	struct kvt_seq_info in;
	int rc = kvt_seq_park(e, s, KVT_TIER_NVME), k;

	if (rc == 0)
		rc = kvt_engine_drain(e);
	for (k = 0; rc == 0 && k < 8; k++) {
		rc = kvt_seq_info(e, s, &in);
		/* a park that finished leaves no copy above NVMe (a STATE group's n_blocks counts
		 * the positions whose checkpoints left: blocks_in, not n_blocks, tells) */
		if (rc || in.blocks_in[KVT_TIER_NVME] >= in.n_blocks ||
		    (in.blocks_in[KVT_TIER_HBM] == 0 && in.blocks_in[KVT_TIER_HOST] == 0))
			break;
		/* blocks left above NVMe: the engine used to leave those beyond its NVMe queue
		 * depth in HOST only (fixed: the backlog of engine/xfer.c); counted, parked again */
		(*reparks)++;
		rc = kvt_seq_park(e, s, KVT_TIER_NVME);
		if (rc == 0)
			rc = kvt_engine_drain(e);
	}
	return rc;
}

/* The single layout's park/resume (32 layers x 8 KV heads x 128, bf16, 16-token 2 MiB blocks)
 * into @r. Returns 0 or a kvtier error (kvtr_last_error() set). */
static int
nb_pr_single(const struct nb_opts *o, struct nb_pr_result *r)
{
	static const struct kvt_nvme_fault_hooks staged_hooks = { .refuse_register = true };
	struct kvt_stats st0 = { .size = sizeof st0 }, st1 = { .size = sizeof st1 };
	struct kvt_engine_opts eo;
	struct kvt_engine *e = NULL;
	struct kvt_geometry g;
	kvt_seq_id *ids = calloc(o->sessions, sizeof *ids);
	int64_t *map = malloc(o->tokens * sizeof *map);
	uint32_t blocks_per = 0;
	int rc;

	memset(r, 0, sizeof *r);
	kvt_engine_opts_init(&eo, sizeof eo);
	eo.layout = (struct kvt_layout){ .n_layers = 32, .n_kv_heads = 8, .head_dim = 128,
					 .dtype = KVT_DTYPE_BF16, .tokens_per_block = 16 };
	blocks_per = (o->tokens + 15) / 16;
	eo.hbm_bytes = (uint64_t)(blocks_per + 1) << 21; /* 2 MiB blocks */
	eo.host_bytes = (uint64_t)o->host_blocks << 21;
	eo.nvme_dir = o->dir;
	eo.nvme_bytes = (uint64_t)(o->sessions * blocks_per + 8) * ((2u << 20) + 4096);
	eo.high_watermark = eo.low_watermark = 1.0f;
	eo.nvme_codec = o->nvme_codec;
	eo.nvme_workers = o->workers;
	if (!ids || !map) {
		rc = -ENOMEM;
		goto out;
	}
	if (o->staged)
		kvt_test_nvme_hooks = &staged_hooks;
	rc = kvt_engine_create(&eo, &e);
	kvt_test_nvme_hooks = NULL;
	if (rc == 0)
		rc = kvt_engine_geometry(e, &g);
	if (rc == 0)
		rc = kvt_engine_stats(e, &st0);
	for (uint32_t s = 0; rc == 0 && s < o->sessions; s++) {
		double t0;

		rc = kvt_seq_open(e, NULL, &ids[s]);
		if (rc == 0)
			rc = kvt_seq_append(e, ids[s], NULL, o->tokens, map);
		for (uint32_t t = 0; rc == 0 && t < o->tokens; t += 16)
			kvtb_fill_bf16((uint8_t *)g.hbm_base +
				       (uint64_t)(map[t] / 16) * g.block_bytes, g.block_bytes,
				       s * 100003u + t);
		t0 = kvtr_now();
		if (rc == 0)
			rc = kvtb_park_nvme(e, ids[s], &r->reparks);
		r->tp += kvtr_now() - t0;
	}
	if (rc == 0)
		rc = kvt_engine_stats(e, &st1);
	if (rc == 0) {
		r->nvme_w = (double)(st1.bytes_moved[KVT_MOVE_HOST_TO_NVME] -
				     st0.bytes_moved[KVT_MOVE_HOST_TO_NVME]);
		st0 = st1;
	}
	for (uint32_t s = 0; rc == 0 && s < o->sessions; s++) {
		struct kvt_batch *b = NULL;
		double t0 = kvtr_now();

		rc = kvt_seq_resume(e, ids[s]);
		if (rc == 0)
			rc = kvt_batch_prepare(e, &ids[s], 1, &b);
		if (rc == 0)
			rc = kvt_batch_wait_layer(b, 31, NULL);
		r->tr += kvtr_now() - t0;
		if (b)
			kvt_batch_release(b, NULL);
	}
	if (rc == 0)
		rc = kvt_engine_stats(e, &st1);
	if (rc == 0) {
		r->nvme_r = (double)(st1.bytes_moved[KVT_MOVE_NVME_TO_HOST] -
				     st0.bytes_moved[KVT_MOVE_NVME_TO_HOST]);
		r->full_blocks = (uint64_t)o->sessions * blocks_per;
		r->full_block_bytes = g.block_bytes;
		r->bytes = (double)r->full_blocks * (double)g.block_bytes;
	} else {
		kvtr_err_kvt(rc, "park/resume");
	}
out:
	kvt_engine_destroy(e);
	free(ids);
	free(map);
	return rc;
}

/* Two rows (park, resume) of one layout's figures, with fio's in the same run. */
static void
nb_pr_rows(const char *layout, const struct nb_opts *o, const struct nb_pr_result *r, double fw,
	   double fr)
{
	double tok = o->sessions * (double)o->tokens;

	printf("| %s | park to NVMe (written) | %.0f | %.2f | %.3f | ", layout, tok / r->tp,
	       r->bytes / r->tp / 1e9, r->nvme_w / 1e9);
	nb_fio_cols(fw, r->bytes / r->tp);
	printf("\n| %s | resume to HBM (ready) | %.0f | %.2f | %.3f | ", layout, tok / r->tr,
	       r->bytes / r->tr / 1e9, r->nvme_r / 1e9);
	nb_fio_cols(fr, r->bytes / r->tr);
	printf("\n");
}

static int
nb_park_resume(const struct nb_opts *o)
{
	struct nb_hybrid_opts ho = {
		.dir = o->dir, .sessions = o->sessions, .tokens = o->tokens,
		.host_blocks = o->host_blocks, .workers = o->workers,
		.nvme_codec = o->nvme_codec, .staged = o->staged,
	};
	struct nb_pr_result single, hybrid;
	double fw = 0, fr = 0, fb = 0;
	char thp[32];
	int rc = 0;

	if (o->layout & NB_LAYOUT_SINGLE)
		rc = nb_pr_single(o, &single);
	if (rc == 0 && (o->layout & NB_LAYOUT_HYBRID))
		rc = kvtb_park_resume_hybrid(&ho, &hybrid);
	if (rc) {
		fprintf(stderr, "nvme bench: %s\n", kvtr_last_error());
		return rc;
	}
	if (o->fio) { /* the device's reference, over the larger of the layouts' bytes */
		fb = o->layout & NB_LAYOUT_SINGLE ? single.bytes : 0;
		if ((o->layout & NB_LAYOUT_HYBRID) && hybrid.bytes > fb)
			fb = hybrid.bytes;
		fw = nb_fio(o, 2u << 20, 64, (uint64_t)fb, true);
		fr = nb_fio(o, 2u << 20, 64, (uint64_t)fb, false);
		nb_fio_clean(o);
	}
	printf("\npark/resume: %u sessions x %u tokens (QD 64, HOST %u blocks, codec %s, %u "
	       "workers%s, THP %s)\n", o->sessions, o->tokens, o->host_blocks,
	       o->nvme_codec == KVT_CODEC_SHUF_LZ4 ? "shuf-lz4" :
	       o->nvme_codec == KVT_CODEC_CSHUF_LZ4 ? "cshuf-lz4" : "off", o->workers,
	       o->staged ? ", staged: no zero-copy" : "", nb_thp_mode(thp, sizeof thp));
	if (o->layout & NB_LAYOUT_SINGLE)
		printf("  single: 32 layers, 8 KV heads, head_dim 128, bf16, 16-token 2 MiB blocks "
		       "(%llu blocks)\n", (unsigned long long)single.full_blocks);
	if (o->layout & NB_LAYOUT_HYBRID)
		printf("  hybrid: FULL 8 layers (every 4th) of 8 KV heads x 128 bf16, 64-token "
		       "%.1f MiB blocks (%llu); STATE 24 layers of Qwen3-Next-80B's Gated DeltaNet "
		       "state (conv 8192 x 3 + 32 x 128 x 128, bf16), %.1f MiB slots (%llu parked: "
		       "the live ones), %.1f%% of the bytes\n", hybrid.full_block_bytes / 1048576.0,
		       (unsigned long long)hybrid.full_blocks,
		       hybrid.state_block_bytes / 1048576.0,
		       (unsigned long long)hybrid.state_blocks,
		       100.0 * (double)hybrid.state_blocks * (double)hybrid.state_block_bytes /
			       hybrid.bytes);
	if ((o->layout & NB_LAYOUT_SINGLE ? single.reparks : 0) +
	    (o->layout & NB_LAYOUT_HYBRID ? hybrid.reparks : 0))
		printf("  parks repeated until every block was on NVMe: single %u, hybrid %u (a "
		       "park + drain left blocks in HOST only; the time is the park's)\n",
		       o->layout & NB_LAYOUT_SINGLE ? single.reparks : 0,
		       o->layout & NB_LAYOUT_HYBRID ? hybrid.reparks : 0);
	printf("\n| layout | phase | tokens/s | GB/s | NVMe GB moved | fio GB/s (2 MiB, QD 64) "
	       "| ratio |\n|---|---|---|---|---|---|---|\n");
	if (o->layout & NB_LAYOUT_SINGLE)
		nb_pr_rows("single", o, &single, fw, fr);
	if (o->layout & NB_LAYOUT_HYBRID)
		nb_pr_rows("hybrid", o, &hybrid, fw, fr);
	return 0;
}

/* ---- options ------------------------------------------------------------------------------- */

static int
nb_list(const char *what, const char *s, uint64_t *v, uint32_t *n, bool size)
{
	char item[64];
	const char *end;
	size_t len;
	int rc;

	*n = 0;
	for (;;) {
		end = strchr(s, ',');
		len = end ? (size_t)(end - s) : strlen(s);
		if (*n == NB_MAX_LIST)
			return kvtr_err(-EINVAL, "%s: more than %d values", what, NB_MAX_LIST);
		if (len >= sizeof item)
			return kvtr_err(-EINVAL, "%s: '%.*s' is too long", what, (int)len, s);
		memcpy(item, s, len);
		item[len] = '\0';
		rc = size ? kvtr_parse_bytes(what, item, 8192, 64u << 20, &v[*n])
			  : kvtr_parse_u64(what, item, 1, 1024, &v[*n]);
		if (rc)
			return rc;
		if (size && v[*n] % 4096)
			return kvtr_err(-EINVAL, "%s: %s is not a multiple of 4096 (O_DIRECT)", what,
					item);
		(*n)++;
		if (!end)
			return 0;
		s = end + 1;
	}
}

static void
nb_usage(FILE *f)
{
	fprintf(f, "usage: kvtier-bench nvme [--dir DIR] [--bs 256k,1m,2m] [--qd 1,16,64] "
		   "[--mib 256]\n"
		   "         [--sessions 2] [--tokens 4096] [--codec none|shuf-lz4|cshuf-lz4] [--no-fio]\n"
		   "         [--only tier|park|codec] [--workers 2] [--staged] [--host-blocks 256]\n"
		   "         [--layout single|hybrid|both]\n"
		   "         [--model stories260K.bin --tokenizer tok512.bin]\n"
		   "DIR (default .) must exist and be on the filesystem to measure (on tmpfs the\n"
		   "figures are memory figures: a warning says so). --bs: 8 KiB..64 MiB, multiples\n"
		   "of 4 KiB (K/M suffixes); --qd: 1..1024. Without fio (or with --no-fio) the fio\n"
		   "columns read \"-\". --workers: the NVMe tier's threads that checksum, encode,\n"
		   "verify and decode (0 = inline, under the lock). The tier table moves blocks\n"
		   "as the engine does, zero-copy from and to HOST memory (huge pages asked for);\n"
		   "--staged: the tier table and park/resume through the staging buffers instead\n"
		   "(for comparison). The header names the THP mode: fio's buffers get huge pages\n"
		   "only with \"always\". --host-blocks: the HOST tier of park/resume, in 2 MiB\n"
		   "blocks (16..65536; at least 2x the queue depth of 64 keeps every read slot busy).\n"
		   "--mib: bytes per tier-table point; at least the largest --bs.\n"
		   "--layout: the park/resume sessions' layout (default both): single (32 layers\n"
		   "of K/V), hybrid (8 FULL layers + 24 STATE layers with Qwen3-Next's Gated\n"
		   "DeltaNet state; the state group's NVMe file in DIR/group1).\n"
		   "The NVMe tier's file in DIR is 1 MiB (superblock area) + its slots, each a\n"
		   "4 KiB header page + the block rounded up to 4 KiB: larger than the tier's\n"
		   "capacity (kvt_engine_opts.nvme_bytes) by up to 1 MiB.\n"
		   "Exit status: 0 done; 2 usage error (bad option or value, --dir, --model),\n"
		   "before anything runs; 1 the run failed.\n");
}

/* One option with a value; returns 0, or -EINVAL with kvtr_last_error() naming it. */
static int
nb_opt(struct nb_opts *o, const char *a, const char *val)
{
	uint64_t v[NB_MAX_LIST];
	uint32_t n;
	int rc = 0;

	if (!strcmp(a, "--dir")) {
		o->dir = val;
	} else if (!strcmp(a, "--bs")) {
		rc = nb_list("--bs", val, v, &n, true);
		for (o->n_bs = 0; rc == 0 && o->n_bs < n; o->n_bs++)
			o->bs[o->n_bs] = (size_t)v[o->n_bs];
	} else if (!strcmp(a, "--qd")) {
		rc = nb_list("--qd", val, v, &n, false);
		for (o->n_qd = 0; rc == 0 && o->n_qd < n; o->n_qd++)
			o->qd[o->n_qd] = (uint32_t)v[o->n_qd];
	} else if (!strcmp(a, "--mib")) {
		rc = kvtr_parse_u64("--mib", val, 1, 1u << 20, &v[0]);
		o->bytes = rc ? o->bytes : v[0] << 20;
	} else if (!strcmp(a, "--sessions")) {
		rc = kvtr_parse_u32("--sessions", val, 1, 4096, &o->sessions);
	} else if (!strcmp(a, "--host-blocks")) {
		rc = kvtr_parse_u32("--host-blocks", val, 16, 65536, &o->host_blocks);
	} else if (!strcmp(a, "--workers")) {
		rc = kvtr_parse_u32("--workers", val, 0, KVT_NVME_MAX_WORKERS, &o->workers);
	} else if (!strcmp(a, "--tokens")) {
		rc = kvtr_parse_u32("--tokens", val, 1, 1u << 22, &o->tokens);
	} else if (!strcmp(a, "--only")) {
		o->tier = !strcmp(val, "tier");
		o->park = !strcmp(val, "park");
		o->codec = !strcmp(val, "codec");
		if (!o->tier && !o->park && !o->codec)
			rc = kvtr_err(-EINVAL, "--only: unknown part '%s' (tier, park or codec)",
				      val);
	} else if (!strcmp(a, "--codec")) {
		if (!strcmp(val, "shuf-lz4") || !strcmp(val, "shuf_lz4"))
			o->nvme_codec = KVT_CODEC_SHUF_LZ4;
		else if (!strcmp(val, "cshuf-lz4") || !strcmp(val, "cshuf_lz4"))
			o->nvme_codec = KVT_CODEC_CSHUF_LZ4;
		else if (!strcmp(val, "none") || !strcmp(val, "off"))
			o->nvme_codec = KVT_CODEC_NONE;
		else
			rc = kvtr_err(-EINVAL, "--codec: unknown codec '%s' (none, shuf-lz4 or "
				      "cshuf-lz4)", val);
	} else if (!strcmp(a, "--layout")) {
		o->layout = !strcmp(val, "single") ? NB_LAYOUT_SINGLE :
			    !strcmp(val, "hybrid") ? NB_LAYOUT_HYBRID :
			    !strcmp(val, "both") ? NB_LAYOUT_SINGLE | NB_LAYOUT_HYBRID : 0;
		if (!o->layout)
			rc = kvtr_err(-EINVAL, "--layout: unknown layout '%s' (single, hybrid or "
				      "both)", val);
	} else if (!strcmp(a, "--model")) {
		o->model = val;
	} else if (!strcmp(a, "--tokenizer")) {
		o->tok = val;
	} else {
		rc = kvtr_err(-EINVAL, "unknown option '%s' (see --help)", a);
	}
	return rc;
}

/* Is @a one of the options that take a value? */
static bool
nb_valued(const char *a)
{
	static const char *const names[] = { "--dir", "--bs", "--qd", "--mib", "--sessions",
					      "--tokens", "--only", "--codec", "--model",
					      "--tokenizer", "--workers", "--host-blocks",
					      "--layout" };

	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if (!strcmp(a, names[i]))
			return true;
	return false;
}

/* Returns 0, 1 for --help, or -EINVAL with kvtr_last_error() naming the bad argument. */
static int
nb_parse(int argc, char **argv, struct nb_opts *o)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		int rc;

		if (!strcmp(a, "-h") || !strcmp(a, "--help"))
			return 1;
		if (!strcmp(a, "--no-fio")) {
			o->fio = false;
			continue;
		}
		if (!strcmp(a, "--staged")) {
			o->staged = true;
			continue;
		}
		if (strncmp(a, "--", 2))
			return kvtr_err(-EINVAL, "unexpected argument '%s' (see --help)", a);
		if (!nb_valued(a))
			return kvtr_err(-EINVAL, "unknown option '%s' (see --help)", a);
		if (i + 1 == argc)
			return kvtr_err(-EINVAL, "%s: missing value", a);
		rc = nb_opt(o, a, argv[++i]);
		if (rc)
			return rc;
	}
	return 0;
}

/* The tier table opens a tier of --mib bytes per point: it must hold one IO of each --bs
 * (the tier's slot of a bs-byte IO is bs bytes: a 4 KiB header page + bs - 4 KiB of data).
 * Returns 0 or -EINVAL with kvtr_last_error() naming both options. */
static int
nb_check_sizes(const struct nb_opts *o)
{
	size_t max = 0;

	for (uint32_t b = 0; b < o->n_bs; b++)
		max = o->bs[b] > max ? o->bs[b] : max;
	if (o->bytes < max)
		return kvtr_err(-EINVAL, "--mib %llu is below one block of --bs %zu KiB: give "
				"--mib %zu or more, or smaller --bs",
				(unsigned long long)(o->bytes >> 20), max >> 10,
				(max + (1u << 20) - 1) >> 20);
	return 0;
}

/* The directory must exist and be writable; on tmpfs (or ramfs) the figures are not a
 * disk's: a warning says so. Returns 0 or -errno with kvtr_last_error() set. */
static int
nb_check_dir(const char *dir)
{
	struct statfs fs;
	struct stat st;

	if (stat(dir, &st))
		return kvtr_err(-errno, "--dir %s: %s", dir, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return kvtr_err(-ENOTDIR, "--dir %s: not a directory", dir);
	if (access(dir, W_OK | X_OK))
		return kvtr_err(-errno, "--dir %s: not writable: %s", dir, strerror(errno));
	if (statfs(dir, &fs) == 0 && (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC))
		fprintf(stderr, "kvtier-bench nvme: warning: %s is on tmpfs (memory): its figures "
				"are not disk figures, and O_DIRECT may be refused\n", dir);
	return 0;
}

int
kvtb_nvme_main(int argc, char **argv)
{
	struct nb_opts o = {
		.dir = ".", .bs = { 256u << 10, 1u << 20, 2u << 20 }, .n_bs = 3,
		.qd = { 1, 16, 64 }, .n_qd = 3, .bytes = 256ull << 20, .sessions = 2,
		.host_blocks = 256, .workers = 2, .layout = NB_LAYOUT_SINGLE | NB_LAYOUT_HYBRID,
		.tokens = 4096, .fio = true, .tier = true, .park = true, .codec = true,
		.model = NB_MODEL, .tok = NB_TOK,
	};
	int rc = nb_parse(argc, argv, &o);

	if (rc == 1) {
		nb_usage(stdout);
		return 0;
	}
	if (rc == 0 && o.tier)
		rc = nb_check_sizes(&o);
	if (rc == 0 && (o.tier || o.park))
		rc = nb_check_dir(o.dir);
	if (rc == 0 && o.codec && (access(o.model, R_OK) || access(o.tok, R_OK)))
		rc = kvtr_err(-ENOENT, "codec table: cannot read %s: %s (give --model and "
			      "--tokenizer)", access(o.model, R_OK) ? o.model : o.tok,
			      strerror(errno));
	if (rc) {
		fprintf(stderr, "kvtier-bench nvme: %s\n", kvtr_last_error());
		return 2;
	}
	if (o.fio && system("fio --version > /dev/null 2>&1") != 0) {
		fprintf(stderr, "kvtier-bench nvme: fio not found (apt-get install fio): "
				"kvtier figures only\n");
		o.fio = false;
	}
	rc = o.tier ? nb_tier_table(&o) : 0;
	if (rc == 0 && o.park)
		rc = nb_park_resume(&o);
	if (rc == 0 && o.codec) {
		rc = kvtb_codec_table(stdout, o.model, o.tok, 4);
		if (rc)
			fprintf(stderr, "kvtier-bench nvme: codec table: %s: %s\n", o.model,
				kvt_strerror(rc));
		return rc ? 1 : 0;
	}
	if (rc)
		fprintf(stderr, "kvtier-bench nvme: %s\n", kvt_strerror(rc));
	return rc ? 1 : 0;
}
