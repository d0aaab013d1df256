/* SPDX-License-Identifier: MIT */
/*
 * tests/consumer/main.c - a program built only from an installed kvtier (<kvtier.h> and
 * libkvtier through pkg-config or find_package(kvtier)): one sequence's whole life on the
 * emulated device - append and write K/V, prepare, read it back through the block table,
 * release, park to HOST, resume, read again, metrics, close. Exits 0 and prints
 * "kvtier consumer ok <version>" when every check passes, 1 with a message otherwise.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvtier.h>

#define CONS_TOKENS 10 /* 3 blocks of 4 */

#define CHECK(cond)                                                                                \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "consumer: %s failed (line %d): %s\n", #cond, __LINE__,    \
				kvt_last_error_message());                                         \
			return 1;                                                                  \
		}                                                                                  \
	} while (0)

/* The float written as element 0 of token t's K (kv 0) or V (kv 1) in layer l. */
static float
cons_val(int t, uint32_t l, int kv)
{
	return (float)(t * 100 + (int)l * 10 + kv);
}

/* Read token t of a prepared one-sequence batch back through its block table. */
static int
cons_read(const struct kvt_block_table *bt, int t, uint32_t l, int kv, float *out)
{
	uint32_t tpb = bt->geo.tokens_per_block;
	uint32_t slot = bt->indices[bt->indptr[0] + (uint32_t)t / tpb];
	void *k, *v;

	kvt_kv_addr(&bt->geo, l, (int64_t)slot * tpb + t % tpb, &k, &v);
	memcpy(out, kv ? v : k, sizeof *out);
	return 0;
}

static int
cons_verify(struct kvt_engine *e, kvt_seq_id s)
{
	struct kvt_block_table bt;
	struct kvt_batch *b;
	float f;

	CHECK(kvt_batch_prepare(e, &s, 1, &b) == 0);
	CHECK(kvt_batch_block_table(b, &bt) == 0);
	CHECK(bt.n_seqs == 1 && bt.indptr[1] == 3 && bt.seq_len[0] == CONS_TOKENS);
	CHECK(bt.last_block_len[0] == 2);
	for (uint32_t l = 0; l < bt.geo.n_layers; l++) {
		CHECK(kvt_batch_wait_layer(b, l, NULL) == 0);
		for (int t = 0; t < CONS_TOKENS; t++) {
			cons_read(&bt, t, l, 0, &f);
			CHECK(f == cons_val(t, l, 0));
			cons_read(&bt, t, l, 1, &f);
			CHECK(f == cons_val(t, l, 1));
		}
	}
	CHECK(kvt_batch_release(b, NULL) == 0);
	return 0;
}

static int
cons_run(struct kvt_engine *e)
{
	struct kvt_geometry g;
	struct kvt_seq_info info;
	int64_t map[CONS_TOKENS];
	int32_t tokens[CONS_TOKENS];
	kvt_seq_id s;
	char text[16384];
	size_t len;

	CHECK(kvt_engine_geometry(e, &g) == 0);
	CHECK(kvt_seq_open(e, NULL, &s) == 0);
	for (int t = 0; t < CONS_TOKENS; t++)
		tokens[t] = 1000 + t;
	CHECK(kvt_seq_append(e, s, tokens, CONS_TOKENS, map) == 0);
	for (int t = 0; t < CONS_TOKENS; t++)
		for (uint32_t l = 0; l < g.n_layers; l++) {
			void *k, *v;
			float fk = cons_val(t, l, 0), fv = cons_val(t, l, 1);

			kvt_kv_addr(&g, l, map[t], &k, &v);
			memcpy(k, &fk, sizeof fk);
			memcpy(v, &fv, sizeof fv);
		}
	if (cons_verify(e, s))
		return 1;
	CHECK(kvt_seq_park(e, s, KVT_TIER_HOST) == 0);
	CHECK(kvt_engine_drain(e) == 0);
	CHECK(kvt_seq_info(e, s, &info) == 0);
	CHECK(info.parked == 1 && info.n_tokens == CONS_TOKENS);
	CHECK(info.blocks_in[KVT_TIER_HBM] == 0 && info.blocks_in[KVT_TIER_HOST] == 3);
	CHECK(kvt_seq_resume(e, s) == 0);
	if (cons_verify(e, s))
		return 1;
	CHECK(kvt_engine_metrics_text(e, text, sizeof text, &len) == 0);
	CHECK(strstr(text, "kvtier_blocks_moved_total{direction=\"hbm_to_host\"} 3\n") != NULL);
	CHECK(kvt_seq_close(e, s) == 0);
	CHECK(kvt_seq_close(e, s) == KVT_ECLOSED);
	return 0;
}

int
main(void)
{
	struct kvt_engine_opts o;
	struct kvt_engine *e;
	char want[32];
	int rc;

	snprintf(want, sizeof want, "%d.%d.%d", KVT_VERSION_MAJOR, KVT_VERSION_MINOR,
		 KVT_VERSION_PATCH);
	if (strcmp(kvt_version(), want) != 0) {
		fprintf(stderr, "consumer: header %s, library %s\n", want, kvt_version());
		return 1;
	}
	kvt_engine_opts_init(&o, sizeof o);
	o.layout = (struct kvt_layout){ .n_layers = 2, .n_kv_heads = 2, .head_dim = 8,
					.dtype = KVT_DTYPE_F32, .tokens_per_block = 4 };
	o.hbm_bytes = 8 * 1024;
	o.host_bytes = 8 * 1024;
	o.high_watermark = o.low_watermark = 1.0f;
	if (kvt_engine_create(&o, &e) != 0) {
		fprintf(stderr, "consumer: kvt_engine_create: %s\n", kvt_last_error_message());
		return 1;
	}
	rc = cons_run(e);
	kvt_engine_destroy(e);
	if (rc == 0)
		printf("kvtier consumer ok %s\n", kvt_version());
	return rc;
}
