/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-bench/nvme_codec.c - the codec table of `kvtier-bench nvme`: real K/V blocks from
 * stories260K (decoded by kvtier-run's loop; the blocks are copied out of the HBM tier after the
 * last step), compressed block by block as the NVMe tier does, one core.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <lz4.h>
#ifdef KVTB_WITH_ZSTD
#include <zstd.h>
#endif

#include "model.h"
#include "nvme_int.h"
#include "runner.h"

/* seed of the sampled codec run (session i: NB_CODEC_SEED + i): the table is reproducible */
#define NB_CODEC_SEED 1
#include "tiers/codec.h"
#include "tokenizer.h"
#include "util.h"

#define CODEC_MIN_TIME 0.2 /* seconds each measurement runs at least */

struct codec_dump {
	uint8_t *snap;     /* copy of the HBM tier at the latest step */
	size_t snap_bytes; /* its size */
	size_t block;      /* bytes per block */
};

static void
codec_hook(void *arg, struct kvt_engine *e, uint64_t step)
{
	struct codec_dump *d = arg;
	struct kvt_geometry g;
	size_t n;

	(void)step;
	if (kvt_engine_geometry(e, &g) != 0)
		return;
	n = (size_t)g.hbm_slots * g.block_bytes;
	if (n != d->snap_bytes) {
		free(d->snap);
		d->snap = malloc(n);
		d->snap_bytes = d->snap ? n : 0;
	}
	d->block = g.block_bytes;
	if (d->snap)
		memcpy(d->snap, g.hbm_base, n);
}

/*
 * Keep the blocks that hold K/V: the run's kv_blocks slots from slot 0 (HBM has room for every
 * session, so nothing was evicted and slots were taken in order; the rest of the tier is
 * uninitialised device memory), minus any all-zero block. Returns their count, packed.
 */
static size_t
codec_pack(struct codec_dump *d, uint64_t kv_blocks)
{
	size_t n = 0, end = d->block ? (size_t)kv_blocks * d->block : 0;

	if (end > d->snap_bytes)
		end = d->snap_bytes;
	for (size_t off = 0; d->block && off + d->block <= end; off += d->block) {
		const uint8_t *b = d->snap + off;
		size_t i = 0;

		while (i < d->block && !b[i])
			i++;
		if (i < d->block)
			memmove(d->snap + n++ * d->block, b, d->block);
	}
	return n;
}

static int
codec_dump_run(const struct kvtr_model *m, const struct kvtr_tokenizer *t, enum kvt_dtype dt,
	       unsigned sessions, struct codec_dump *d, uint64_t *kv_blocks)
{
	struct kvtr_run_opts o;
	struct kvtr_run_result r;
	FILE *devnull = fopen("/dev/null", "w");
	int rc;

	kvtr_run_opts_init(&o);
	o.model = m;
	o.tok = t;
	o.sessions = sessions;
	o.steps = 0; /* seq_len */
	/* the same K/V on every run: sampled (temperature 1, so that sessions differ) with the
	 * fixed seed NB_CODEC_SEED, session i with NB_CODEC_SEED + i */
	o.temperature = 1.0f;
	o.seed = NB_CODEC_SEED;
	o.kv_dtype = dt;
	o.step_hook = codec_hook;
	o.hook_arg = d;
	o.log = devnull;
	rc = kvtr_run(&o, &r);
	*kv_blocks = r.kv_blocks;
	kvtr_run_result_free(&r);
	if (devnull)
		fclose(devnull);
	return rc;
}

enum { C_LZ4, C_SHUF, C_BYTE, C_CSHUF, C_ZSTD, C_COUNT };
static const char *const codec_names[C_COUNT] = { "lz4", "shuffle+lz4", "byteshuffle+lz4",
						  "cshuf+lz4", "zstd -1" };

static const int codec_map[C_COUNT] = { KVT_CODEC_LZ4, KVT_CODEC_SHUF_LZ4, KVT_CODEC_BYTE_LZ4,
					 KVT_CODEC_CSHUF_LZ4, 0 };

/* Compress every block once into out + i * cap; len[i] = payload bytes, 0 when not smaller. */
static void
codec_enc(int c, const uint8_t *blocks, size_t n, size_t bb, const struct kvt_codec_geom *g,
	  uint8_t *out,
	  size_t cap, uint8_t *scr, int64_t *len)
{
	for (size_t i = 0; i < n; i++) {
		const uint8_t *src = blocks + i * bb;

		len[i] = 0;
		if (c == C_ZSTD) {
#ifdef KVTB_WITH_ZSTD
			size_t z = ZSTD_compress(out + i * cap, cap, src, bb, 1);

			len[i] = ZSTD_isError(z) || z >= bb ? 0 : (int64_t)z;
#endif
		} else {
			len[i] = kvt_codec_encode_geom(codec_map[c], g, src, bb, out + i * cap,
						       cap, scr, 0.0);
		}
	}
}

/* Decode every block that was kept; returns 0 or -1 when one does not round-trip. */
static int
codec_dec(int c, const uint8_t *blocks, size_t n, size_t bb, const struct kvt_codec_geom *g,
	  const uint8_t *out,
	  size_t cap, uint8_t *scr, const int64_t *len, uint8_t *back, bool check)
{
	for (size_t i = 0; i < n; i++) {
		if (len[i] <= 0)
			continue;
		if (c == C_ZSTD) {
#ifdef KVTB_WITH_ZSTD
			(void)ZSTD_decompress(back, bb, out + i * cap, (size_t)len[i]);
#endif
		} else if (kvt_codec_decode_geom(codec_map[c], g, out + i * cap, (size_t)len[i], back,
					    bb, scr) != 0) {
			return -1;
		}
		if (check && memcmp(back, blocks + i * bb, bb))
			return -1;
	}
	return 0;
}

static void
codec_row(FILE *f, const char *dt, int c, const uint8_t *blocks, size_t n, size_t bb,
	  const struct kvt_codec_geom *g)
{
	size_t cap = bb * 2 + 1024, stored = 0, kept = 0;
	uint8_t *out = malloc(n * cap), *scr = malloc(bb), *back = malloc(bb);
	int64_t *len = calloc(n, sizeof *len);
	double t0, tc = 1e30, td = 1e30;
	unsigned reps = 0;

	if (!out || !scr || !back || !len)
		goto done;
	/* the best of repeated passes: the machine may be shared, the codec's speed is its best */
	t0 = kvtr_now();
	while (kvtr_now() - t0 < CODEC_MIN_TIME || reps < 3) {
		double a = kvtr_now(), b2, c2;

		codec_enc(c, blocks, n, bb, g, out, cap, scr, len);
		b2 = kvtr_now();
		if (codec_dec(c, blocks, n, bb, g, out, cap, scr, len, back, reps == 0)) {
			fprintf(f, "| %-5s | %-16s | round trip FAILED |\n", dt, codec_names[c]);
			goto done;
		}
		c2 = kvtr_now();
		tc = b2 - a < tc ? b2 - a : tc;
		td = c2 - b2 < td ? c2 - b2 : td;
		reps++;
	}
	for (size_t i = 0; i < n; i++) {
		stored += len[i] > 0 ? (size_t)len[i] : bb;
		kept += len[i] > 0 ? bb : 0;
	}
	fprintf(f, "| %-5s | %-16s | %6.3fx | %3.0f%% | %8.0f | ", dt, codec_names[c],
		(double)(n * bb) / (double)stored, 100.0 * (double)kept / (double)(n * bb),
		(double)(n * bb) / tc / 1e6);
	if (kept)
		fprintf(f, "%8.0f |\n", (double)kept / td / 1e6);
	else
		fprintf(f, "       - |\n");
done:
	free(out);
	free(scr);
	free(back);
	free(len);
}

int
kvtb_codec_table(FILE *f, const char *model, const char *tokp, unsigned sessions)
{
	static const enum kvt_dtype dts[3] = { KVT_DTYPE_F32, KVT_DTYPE_F16, KVT_DTYPE_BF16 };
	static const char *const dtn[3] = { "fp32", "fp16", "bf16" };
	struct kvtr_model m;
	struct kvtr_tokenizer t;
	int rc = kvtr_model_load(model, &m);

	if (rc)
		return rc;
	rc = kvtr_tokenizer_load(tokp, m.cfg.vocab_size, &t);
	if (rc) {
		kvtr_model_free(&m);
		return rc;
	}
	fprintf(f, "\ncodec on real K/V (%s, %u sessions x seq_len sampled at temperature 1 with "
		"seed %d + session, blocks of 16 tokens, "
		"each block compressed alone, one core, best of repeated passes; comp: MB/s of raw "
		"bytes offered, decomp: of raw bytes decoded; ratio with every block stored raw "
		"when its encoding is not smaller)\n\n", model, sessions, NB_CODEC_SEED);
	fprintf(f, "| K/V   | codec            | ratio   | blocks smaller | comp MB/s | "
		   "decomp MB/s |\n");
	fprintf(f, "|-------|------------------|---------|------|----------|----------|\n");
	for (int i = 0; i < 3 && rc == 0; i++) {
		struct codec_dump d = { 0 };
		uint64_t kvb = 0;
		size_t n;

		rc = codec_dump_run(&m, &t, dts[i], sessions, &d, &kvb);
		n = rc == 0 ? codec_pack(&d, kvb) : 0;
		for (int c = 0; c < C_COUNT && n; c++) {
#ifndef KVTB_WITH_ZSTD
			if (c == C_ZSTD)
				continue;
#endif
			struct kvt_codec_geom g = { kvt_dtype_size(dts[i]), 16,
						    (size_t)m.cfg.n_kv_heads * m.head_size };

			codec_row(f, dtn[i], c, d.snap, n, d.block, &g);
		}
		free(d.snap);
	}
	kvtr_tokenizer_free(&t);
	kvtr_model_free(&m);
	return rc;
}
