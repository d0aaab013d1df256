/* SPDX-License-Identifier: MIT */
/*
 * tests/test_remote.c - the REMOTE tier's client and values (tiers/remote*.c) against real
 * redis-server instances the test starts itself on loopback ports (tests/support/
 * redis_server.c): a single server and a 3-master cluster. Skips (77) without redis-server.
 *
 *   - the value format: every header field checked (no server);
 *   - 64 blocks of 256 KiB round trip, in one round trip each way; first writer wins; codec;
 *   - cluster: keys on all three masters, slots as the server computes them, ASK during a
 *     slot migration and MOVED after it (two round trips at most);
 *   - faults: a server killed mid-batch and restarted (reconnect), a full server evicting
 *     (allkeys-lru) while values are read, values overwritten with garbage / another layout's /
 *     another tenant's value (misses, deleted), a partition (SIGSTOP: timeouts, the breaker
 *     opens, fails fast, recovers after SIGCONT), a slow server (DEBUG SLEEP).
 * Outcomes only: no assertion on time.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <xxhash.h>

#include "engine/kvtier.h"
#include "support/redis_server.h"
#include "tiers/remote.h"

#define NB 64
static const struct kvt_layout L256 = { .n_layers = 4, .n_kv_heads = 2, .head_dim = 128,
					.dtype = KVT_DTYPE_F16, .tokens_per_block = 64 };
static struct tsrv single;

static uint64_t rng_s = 0x9E3779B97F4A7C15ull;

static uint64_t
rng(void)
{
	rng_s ^= rng_s << 13;
	rng_s ^= rng_s >> 7;
	rng_s ^= rng_s << 17;
	return rng_s;
}

/* n blocks of @bytes with random content and random hashes. */
struct blocks {
	uint32_t n;
	size_t bytes;
	uint8_t (*hash)[16];
	uint8_t **src, **dst;
	int *res;
};

static void
blocks_make(struct blocks *b, uint32_t n, size_t bytes, bool kvlike)
{
	b->n = n;
	b->bytes = bytes;
	b->hash = calloc(n, 16);
	b->src = calloc(n, sizeof *b->src);
	b->dst = calloc(n, sizeof *b->dst);
	b->res = calloc(n, sizeof *b->res);
	assert_non_null(b->hash);
	assert_non_null(b->res);
	for (uint32_t i = 0; i < n; i++) {
		b->src[i] = malloc(bytes);
		b->dst[i] = malloc(bytes);
		assert_non_null(b->src[i]);
		assert_non_null(b->dst[i]);
		for (int k = 0; k < 16; k++)
			b->hash[i][k] = (uint8_t)rng();
		for (size_t k = 0; k + 8 <= bytes; k += 8) {
			uint64_t v = rng();

			if (kvlike) /* f16 values of one narrow exponent range */
				v = (v & 0x03ff03ff03ff03ffull) | 0x3800380038003800ull;
			memcpy(b->src[i] + k, &v, 8);
		}
	}
}

static void
blocks_free(struct blocks *b)
{
	for (uint32_t i = 0; i < b->n; i++) {
		free(b->src[i]);
		free(b->dst[i]);
	}
	free(b->src);
	free(b->dst);
	free(b->hash);
	free(b->res);
}

static void
ns_make(struct kvt_rv_ns *ns, const struct kvt_layout *l, uint32_t codec, const char *model)
{
	struct kvt_rv_desc d = { .model_id = model, .layout = *l, .codec = codec, .tp_size = 1,
				 .pp_size = 1 };

	assert_int_equal(kvt_rv_ns_init(ns, &d), 0);
}

static struct kvt_remote *
client(uint16_t port, uint32_t op_ms, uint32_t fails)
{
	struct kvt_remote_opts o = { .host = "127.0.0.1", .port = port, .op_timeout_ms = op_ms,
				     .connect_timeout_ms = op_ms, .breaker_failures = fails,
				     .breaker_backoff_ms = 300 };
	struct kvt_remote *r = NULL;
	int rc = kvt_remote_open(&o, &r);

	if (rc)
		fprintf(stderr, "open: %s\n", kvt_last_error_message());
	assert_int_equal(rc, 0);
	return r;
}

static uint64_t
rounds(struct kvt_remote *r)
{
	struct kvt_remote_stats st;

	kvt_remote_stats(r, &st);
	return st.round_trips;
}

/* Every block with res 1 has its exact bytes; returns how many. */
static uint32_t
check_hits(const struct blocks *b)
{
	uint32_t hits = 0;

	for (uint32_t i = 0; i < b->n; i++)
		if (b->res[i] == 1) {
			assert_memory_equal(b->dst[i], b->src[i], b->bytes);
			hits++;
		}
	return hits;
}

/* ---- no server ----------------------------------------------------------------------------- */

static void
test_slots_crc16(void **state)
{
	/* Redis Cluster spec's test vector, and its hash-tag rules */
	assert_int_equal(kvt_remote_crc16("123456789", 9), 0x31C3);
	assert_int_equal(kvt_remote_key_slot("{user1000}.following", 20),
			 kvt_remote_key_slot("user1000", 8));
	assert_int_equal(kvt_remote_key_slot("foo{}{bar}", 10),
			 kvt_remote_crc16("foo{}{bar}", 10) & 16383);
	assert_int_equal(kvt_remote_key_slot("foo{{bar}}zap", 13),
			 kvt_remote_key_slot("{bar", 4));
	assert_int_equal(kvt_remote_key_slot("foo{bar}{zap}", 13), kvt_remote_key_slot("bar", 3));
}

/* A value of block @hash of @tenant in @ns with payload @pay (raw), as put_blocks makes it. */
static uint8_t *
value_make(const struct kvt_rv_ns *ns, uint32_t tenant, const uint8_t *hash, const uint8_t *pay,
	   size_t *len)
{
	struct kvt_rv_hdr h = { .tenant = tenant, .codec = KVT_CODEC_NONE,
				.layout_fp = ns->layout_fp, .raw_len = ns->block_bytes,
				.stored_len = ns->block_bytes };
	uint8_t *v = malloc(KVT_RV_HDR_BYTES + ns->block_bytes);

	assert_non_null(v);
	memcpy(h.ns, ns->id, 16);
	memcpy(h.hash, hash, 16);
	memcpy(v + KVT_RV_HDR_BYTES, pay, ns->block_bytes);
	h.payload_sum = h.raw_sum = XXH3_64bits(pay, ns->block_bytes);
	kvt_rv_hdr_encode(&h, v);
	*len = KVT_RV_HDR_BYTES + ns->block_bytes;
	return v;
}

static void
test_value_checks(void **state)
{
	struct kvt_layout l2 = L256;
	struct kvt_rv_ns ns, ns_model, ns_layout, ns_shard;
	struct kvt_rv_desc d = { .model_id = "m", .layout = L256, .tp_rank = 1, .tp_size = 2,
				 .pp_size = 1 };
	uint8_t hash[16] = { 1, 2, 3 }, other[16] = { 9 };
	struct blocks b;
	struct kvt_rv_hdr h;
	char k1[KVT_RV_KEY_MAX], k2[KVT_RV_KEY_MAX];
	uint8_t *v, *w;
	size_t len;

	ns_make(&ns, &L256, KVT_CODEC_NONE, "model-a@1");
	ns_make(&ns_model, &L256, KVT_CODEC_NONE, "model-a@2");
	l2.dtype = KVT_DTYPE_BF16;
	ns_make(&ns_layout, &l2, KVT_CODEC_NONE, "model-a@1");
	assert_int_equal(kvt_rv_ns_init(&ns_shard, &d), 0);
	assert_int_equal(ns.block_bytes, 256u << 10);
	/* everything the bytes depend on is in the namespace */
	assert_memory_not_equal(ns.id, ns_model.id, 16);
	assert_memory_not_equal(ns.id, ns_layout.id, 16);
	assert_memory_not_equal(ns.id, ns_shard.id, 16);
	assert_int_not_equal(ns.layout_fp, ns_layout.layout_fp);
	/* keys: tenant and hash in them, no braces (slots spread) */
	assert_int_equal(kvt_rv_key(&ns, 1, hash, k1), 79);
	assert_int_equal(kvt_rv_key(&ns, 2, hash, k2), 79);
	assert_string_not_equal(k1, k2);
	assert_null(strchr(k1, '{'));
	d.tp_rank = 2;
	assert_int_equal(kvt_rv_ns_init(&ns_shard, &d), -EINVAL);
	d.tp_rank = 0;
	d.model_id = "";
	assert_int_equal(kvt_rv_ns_init(&ns_shard, &d), -EINVAL);

	/* a good value from the encoder's fields */
	blocks_make(&b, 1, ns.block_bytes, false);
	v = value_make(&ns, 7, hash, b.src[0], &len);
	assert_int_equal(kvt_rv_parse(&ns, 7, hash, v, len, &h), 0);
	assert_int_equal(h.stored_len, ns.block_bytes);
	/* each check */
	assert_int_equal(kvt_rv_parse(&ns, 8, hash, v, len, NULL), KVT_ECORRUPT);   /* tenant */
	assert_int_equal(kvt_rv_parse(&ns, 7, other, v, len, NULL), KVT_ECORRUPT);  /* hash */
	assert_int_equal(kvt_rv_parse(&ns_model, 7, hash, v, len, NULL), KVT_ECORRUPT);
	assert_int_equal(kvt_rv_parse(&ns_layout, 7, hash, v, len, NULL), KVT_ECORRUPT);
	assert_int_equal(kvt_rv_parse(&ns, 7, hash, v, len - 1, NULL), KVT_ECORRUPT); /* short */
	assert_int_equal(kvt_rv_parse(&ns, 7, hash, v, 100, NULL), KVT_ECORRUPT);
	w = malloc(len + 1);
	assert_non_null(w);
	memcpy(w, v, len);
	w[len] = 0;
	assert_int_equal(kvt_rv_parse(&ns, 7, hash, w, len + 1, NULL), KVT_ECORRUPT); /* long */
	for (size_t off = 0; off < KVT_RV_HDR_BYTES; off += 3) { /* any header byte */
		memcpy(w, v, len);
		w[off] ^= 0x40;
		assert_int_equal(kvt_rv_parse(&ns, 7, hash, w, len, NULL), KVT_ECORRUPT);
	}
	memcpy(w, v, len);
	w[len - 5] ^= 1; /* a payload bit */
	assert_int_equal(kvt_rv_parse(&ns, 7, hash, w, len, NULL), KVT_ECORRUPT);
	free(w);
	free(v);
	blocks_free(&b);
}

/* ---- a single server ----------------------------------------------------------------------- */

static void
test_roundtrip_64(void **state)
{
	struct kvt_remote *r = client(single.port, 10000, 3);
	struct kvt_rv_ns ns;
	struct blocks b;
	uint64_t r0;

	ns_make(&ns, &L256, KVT_CODEC_NONE, "roundtrip");
	blocks_make(&b, NB, ns.block_bytes, false);
	assert_false(kvt_remote_is_cluster(r));
	r0 = rounds(r);
	assert_int_equal(kvt_remote_put_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					       (const void *const *)b.src, NB, b.res), NB);
	assert_int_equal(rounds(r) - r0, 1);
	for (uint32_t i = 0; i < NB; i++)
		assert_int_equal(b.res[i], 1);
	r0 = rounds(r);
	assert_int_equal(kvt_remote_get_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					       (void *const *)b.dst, NB, b.res), NB);
	assert_int_equal(rounds(r) - r0, 1);
	assert_int_equal(check_hits(&b), NB);
	/* first writer wins: a second put stores nothing and says so */
	assert_int_equal(kvt_remote_put_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					       (const void *const *)b.dst, NB, b.res), NB);
	for (uint32_t i = 0; i < NB; i++)
		assert_int_equal(b.res[i], 0);
	assert_int_equal(kvt_remote_exists_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash, NB,
						  b.res), NB);
	/* another tenant sees nothing of it; a lookup's leading run stops at the first miss */
	assert_int_equal(kvt_remote_get_blocks(r, &ns, 2, (const uint8_t(*)[16])b.hash,
					       (void *const *)b.dst, NB, b.res), 0);
	for (uint32_t i = 0; i < NB; i++)
		assert_int_equal(b.res[i], 0);
	b.hash[5][0] ^= 1;
	assert_int_equal(kvt_remote_get_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					       (void *const *)b.dst, NB, b.res), 5);
	assert_int_equal(b.res[5], 0);
	assert_int_equal(b.res[6], 1);
	kvt_remote_close(r);
	blocks_free(&b);
}

static void
test_codec_roundtrip(void **state)
{
	struct kvt_remote *r = client(single.port, 10000, 3);
	struct kvt_remote_stats st;
	struct kvt_rv_ns ns;
	struct blocks b;

	ns_make(&ns, &L256, KVT_CODEC_CSHUF_LZ4, "codec");
	blocks_make(&b, 8, ns.block_bytes, true);
	assert_int_equal(kvt_remote_put_blocks(r, &ns, 3, (const uint8_t(*)[16])b.hash,
					       (const void *const *)b.src, 8, b.res), 8);
	kvt_remote_stats(r, &st);
	assert_true(st.bytes_out < 8 * ns.block_bytes); /* encoded: fewer bytes than raw */
	assert_int_equal(kvt_remote_get_blocks(r, &ns, 3, (const uint8_t(*)[16])b.hash,
					       (void *const *)b.dst, 8, b.res), 8);
	assert_int_equal(check_hits(&b), 8);
	kvt_remote_close(r);
	blocks_free(&b);
}

/* kvt_remote_get consumer: keep a copy of the value. */
struct grab {
	uint8_t *v;
	size_t len;
};

static int
grab_take(void *arg, uint32_t i, const void *val, size_t len)
{
	struct grab *g = arg;

	g->v = malloc(len);
	memcpy(g->v, val, len);
	g->len = len;
	return 1;
}

/* Replace the value of @key with @len bytes of @v. */
static void
overwrite(struct kvt_remote *r, const char *key, const void *v, size_t len)
{
	size_t kl = strlen(key);
	struct kvt_remote_val val = { { v }, { len } };
	int res;

	assert_int_equal(kvt_remote_del(r, &key, &kl, 1, &res), 1);
	assert_int_equal(kvt_remote_put(r, &key, &kl, &val, 1, &res), 1);
	assert_int_equal(res, 1);
}

static void
test_bad_values(void **state)
{
	struct kvt_remote *r = client(single.port, 10000, 3);
	struct kvt_layout lb = L256;
	struct kvt_rv_ns ns, nsb;
	struct kvt_remote_stats st;
	struct blocks b;
	char key[4][KVT_RV_KEY_MAX], okey[KVT_RV_KEY_MAX];
	const char *kp[4];
	size_t kl[4];
	struct grab g = { 0 };
	int res[4];

	ns_make(&ns, &L256, KVT_CODEC_NONE, "bad");
	lb.n_layers = 2; lb.tokens_per_block = 128; /* another layout of the same bytes */
	ns_make(&nsb, &lb, KVT_CODEC_NONE, "bad");
	assert_int_equal(nsb.block_bytes, ns.block_bytes);
	blocks_make(&b, 8, ns.block_bytes, false);
	assert_int_equal(kvt_remote_put_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					       (const void *const *)b.src, 8, b.res), 8);
	for (int i = 0; i < 4; i++) {
		kl[i] = kvt_rv_key(&ns, 1, b.hash[i], key[i]);
		kp[i] = key[i];
	}
	/* block 0: garbage */
	overwrite(r, key[0], "garbage, not a kvtier value", 27);
	/* block 1: another layout's value of the same hash and tenant */
	assert_int_equal(kvt_remote_put_blocks(r, &nsb, 1, (const uint8_t(*)[16])&b.hash[1],
					       (const void *const *)&b.src[1], 1, res), 1);
	kl[3] = kvt_rv_key(&nsb, 1, b.hash[1], okey);
	kp[3] = okey;
	assert_int_equal(kvt_remote_get(r, &kp[3], &kl[3], 1, grab_take, &g, res), 1);
	overwrite(r, key[1], g.v, g.len);
	free(g.v);
	/* block 2: tenant 2's value of the same block (its key echoed: tenant 2) */
	assert_int_equal(kvt_remote_put_blocks(r, &ns, 2, (const uint8_t(*)[16])&b.hash[2],
					       (const void *const *)&b.src[2], 1, res), 1);
	kl[3] = kvt_rv_key(&ns, 2, b.hash[2], okey);
	assert_int_equal(kvt_remote_get(r, &kp[3], &kl[3], 1, grab_take, &g, res), 1);
	overwrite(r, key[2], g.v, g.len);
	free(g.v);
	/* block 3: one payload bit flipped */
	kl[3] = kvt_rv_key(&ns, 1, b.hash[3], key[3]);
	kp[3] = key[3];
	assert_int_equal(kvt_remote_get(r, &kp[3], &kl[3], 1, grab_take, &g, res), 1);
	g.v[g.len / 2] ^= 0x10;
	overwrite(r, key[3], g.v, g.len);
	free(g.v);

	for (uint32_t i = 0; i < 8; i++)
		memset(b.dst[i], 0, b.bytes);
	assert_int_equal(kvt_remote_get_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					       (void *const *)b.dst, 8, b.res), 0);
	for (uint32_t i = 0; i < 8; i++)
		assert_int_equal(b.res[i], i < 4 ? 0 : 1);
	assert_int_equal(check_hits(&b), 4);
	kvt_remote_stats(r, &st);
	assert_int_equal(st.bad_values, 4);
	/* deleted (best effort: sent with the next round, here the flush) */
	assert_int_equal(kvt_remote_flush(r), 0);
	kvt_remote_stats(r, &st);
	assert_int_equal(st.deletes, 4);
	assert_int_equal(kvt_remote_exists(r, kp, kl, 4, res), 0);
	for (int i = 0; i < 4; i++)
		assert_int_equal(res[i], 0);
	kvt_remote_close(r);
	blocks_free(&b);
}

/* A connection that sends DEBUG SLEEP @secs and does not wait for its reply. */
static redisContext *
sleep_server(uint16_t port, const char *secs)
{
	redisContext *c = redisConnect("127.0.0.1", port);
	int done = 0;

	redisReply *rep;

	assert_non_null(c);
	assert_int_equal(c->err, 0);
	/* a round trip first: the server has accepted this connection and reads it, so the
	 * sleep is read before any command written after it on an older connection */
	rep = redisCommand(c, "PING");
	assert_non_null(rep);
	freeReplyObject(rep);
	assert_int_equal(redisAppendCommand(c, "DEBUG SLEEP %s", secs), REDIS_OK);
	while (!done)
		assert_int_equal(redisBufferWrite(c, &done), REDIS_OK);
	return c;
}

static void
test_slow_server(void **state)
{
	struct kvt_remote *r = client(single.port, 10000, 3);
	struct kvt_remote_stats st;
	struct kvt_rv_ns ns;
	struct blocks b;
	redisContext *c;
	redisReply *rep;

	ns_make(&ns, &L256, KVT_CODEC_NONE, "slow");
	blocks_make(&b, 4, ns.block_bytes, false);
	assert_int_equal(kvt_remote_put_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					       (const void *const *)b.src, 4, b.res), 4);
	/* slower than usual, within the timeout: served */
	c = sleep_server(single.port, "0.5");
	assert_int_equal(kvt_remote_get_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					       (void *const *)b.dst, 4, b.res), 4);
	assert_int_equal(check_hits(&b), 4);
	redisFree(c);
	kvt_remote_close(r);
	/* slower than the timeout: the call returns with -ETIMEDOUT, no bytes served */
	r = client(single.port, 300, 3);
	c = sleep_server(single.port, "3");
	assert_int_equal(kvt_remote_get_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					       (void *const *)b.dst, 4, b.res), 0);
	for (int i = 0; i < 4; i++)
		assert_int_equal(b.res[i], -ETIMEDOUT);
	kvt_remote_stats(r, &st);
	assert_true(st.timeouts >= 1);
	assert_false(kvt_remote_breaker_open(r, NULL, 0)); /* one failure of three */
	assert_int_equal(redisGetReply(c, (void **)&rep), REDIS_OK); /* the sleep is over */
	freeReplyObject(rep);
	redisFree(c);
	/* and the next call reconnects and is served */
	assert_int_equal(kvt_remote_get_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					       (void *const *)b.dst, 4, b.res), 4);
	assert_int_equal(check_hits(&b), 4);
	kvt_remote_stats(r, &st);
	assert_true(st.reconnects >= 1);
	kvt_remote_close(r);
	blocks_free(&b);
}

/* ---- servers of their own ------------------------------------------------------------------ */

struct killer {
	struct tsrv *s;
	useconds_t after;
};

static void *
killer_main(void *arg)
{
	struct killer *k = arg;

	usleep(k->after);
	tsrv_kill(k->s);
	return NULL;
}

static void
test_killed_mid_batch(void **state)
{
	struct tsrv s = { 0 };
	struct killer k = { &s, 300000 };
	struct kvt_remote *r;
	struct kvt_remote_stats st;
	struct kvt_rv_ns ns;
	struct blocks b;
	pthread_t t;
	redisContext *c;
	uint16_t port;
	int got;

	assert_int_equal(tsrv_start(&s, 0, NULL), 0);
	port = s.port;
	r = client(port, 10000, 5);
	ns_make(&ns, &L256, KVT_CODEC_NONE, "killed");
	blocks_make(&b, NB, ns.block_bytes, false);
	assert_int_equal(kvt_remote_put_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					       (const void *const *)b.src, NB, b.res), NB);
	/* the server holds the batch (asleep) when it is killed: no reply ever comes */
	c = sleep_server(port, "5");
	assert_int_equal(pthread_create(&t, NULL, killer_main, &k), 0);
	got = kvt_remote_get_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
				    (void *const *)b.dst, NB, b.res);
	pthread_join(t, NULL);
	redisFree(c);
	assert_true(got >= 0);
	for (uint32_t i = 0; i < NB; i++)
		assert_true(b.res[i] == 1 || b.res[i] < 0);
	check_hits(&b); /* whatever was served is exact */
	/* restarted (empty: no persistence): a reconnect, then puts and gets work again */
	assert_int_equal(tsrv_start(&s, port, NULL), 0);
	got = kvt_remote_get_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
				    (void *const *)b.dst, NB, b.res);
	for (int t2 = 0; t2 < 20 && b.res[0] < 0; t2++) { /* a breaker may still be open */
		usleep(200000);
		got = kvt_remote_get_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					    (void *const *)b.dst, NB, b.res);
	}
	assert_int_equal(got, 0);
	for (uint32_t i = 0; i < NB; i++)
		assert_int_equal(b.res[i], 0); /* misses: the data went with the server */
	assert_int_equal(kvt_remote_put_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					       (const void *const *)b.src, NB, b.res), NB);
	assert_int_equal(kvt_remote_get_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					       (void *const *)b.dst, NB, b.res), NB);
	assert_int_equal(check_hits(&b), NB);
	kvt_remote_stats(r, &st);
	assert_true(st.reconnects >= 1);
	assert_true(st.errors >= 1);
	kvt_remote_close(r);
	tsrv_kill(&s);
	blocks_free(&b);
}

static void
test_full_evicting(void **state)
{
	struct tsrv s = { 0 };
	struct kvt_remote *r;
	struct kvt_rv_ns ns;
	struct blocks b;
	uint32_t hits = 0, misses = 0;

	assert_int_equal(tsrv_start(&s, 0, "--maxmemory 6mb --maxmemory-policy allkeys-lru"), 0);
	r = client(s.port, 10000, 3);
	ns_make(&ns, &L256, KVT_CODEC_NONE, "evict");
	blocks_make(&b, NB, ns.block_bytes, false); /* 16 MiB into 6 MiB */
	for (uint32_t i = 0; i < NB; i += 8) {
		int put = kvt_remote_put_blocks(r, &ns, 1, (const uint8_t(*)[16])&b.hash[i],
						(const void *const *)&b.src[i], 8, &b.res[i]);

		assert_true(put >= 0);
		for (uint32_t k = i; k < i + 8; k++) /* stored, or refused for memory */
			assert_true(b.res[k] == 1 || b.res[k] == -ENOSPC);
		/* read everything put so far while the server evicts */
		assert_true(kvt_remote_get_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
						  (void *const *)b.dst, i + 8, b.res) >= 0);
		for (uint32_t k = 0; k < i + 8; k++)
			assert_true(b.res[k] == 0 || b.res[k] == 1);
		hits += check_hits(&b); /* every hit exact */
		for (uint32_t k = 0; k < i + 8; k++)
			misses += b.res[k] == 0;
	}
	assert_true(hits > 0);
	assert_true(misses > 0); /* it did evict */
	kvt_remote_close(r);
	tsrv_kill(&s);
	blocks_free(&b);
}

static void
test_partition(void **state)
{
	struct tsrv s = { 0 };
	struct kvt_remote *r;
	struct kvt_remote_stats st;
	struct kvt_rv_ns ns;
	struct blocks b;
	int got = -1;

	assert_int_equal(tsrv_start(&s, 0, NULL), 0);
	r = client(s.port, 500, 2);
	ns_make(&ns, &L256, KVT_CODEC_NONE, "partition");
	blocks_make(&b, 8, ns.block_bytes, false);
	assert_int_equal(kvt_remote_put_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					       (const void *const *)b.src, 8, b.res), 8);
	tsrv_signal(&s, SIGSTOP);
	/* 1: the reply times out; 2: the reconnect's PING times out: the breaker opens */
	for (int call = 0; call < 2; call++) {
		assert_int_equal(kvt_remote_get_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
						       (void *const *)b.dst, 8, b.res), 0);
		for (int i = 0; i < 8; i++)
			assert_true(b.res[i] == -ETIMEDOUT);
	}
	assert_true(kvt_remote_breaker_open(r, NULL, 0));
	/* 3: fails fast, the server is not asked */
	assert_int_equal(kvt_remote_get_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					       (void *const *)b.dst, 8, b.res), 0);
	for (int i = 0; i < 8; i++)
		assert_int_equal(b.res[i], -EAGAIN);
	kvt_remote_stats(r, &st);
	assert_true(st.timeouts >= 2);
	assert_int_equal(st.breaker_trips, 1);
	assert_int_equal(st.fast_fails, 8);
	tsrv_signal(&s, SIGCONT);
	/* recovers: after the backoff, one trial reconnects and closes the breaker */
	for (int t = 0; t < 100 && got != 8; t++) {
		usleep(100000);
		got = kvt_remote_get_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					    (void *const *)b.dst, 8, b.res);
	}
	assert_int_equal(got, 8);
	assert_int_equal(check_hits(&b), 8);
	assert_false(kvt_remote_breaker_open(r, NULL, 0));
	kvt_remote_close(r);
	tsrv_kill(&s);
	blocks_free(&b);
}

static void
test_auth_ttl(void **state)
{
	struct tsrv s = { 0 };
	struct kvt_remote_opts o = { .host = "127.0.0.1", .op_timeout_ms = 10000,
				     .connect_timeout_ms = 10000, .ttl_ms = 600000 };
	struct kvt_remote *r = NULL;
	struct kvt_rv_ns ns;
	struct blocks b;
	char key[KVT_RV_KEY_MAX], out[64];

	assert_int_equal(tsrv_start(&s, 0, "--requirepass pw-default "
				   "--user kvt on '>pw-kvt' '~kvt1:*' '&*' '+@all'"), 0);
	o.port = s.port;
	/* no password, a wrong one, a wrong user: refused with -EACCES */
	assert_int_equal(kvt_remote_open(&o, &r), -EACCES);
	assert_null(r);
	o.password = "wrong";
	assert_int_equal(kvt_remote_open(&o, &r), -EACCES);
	o.user = "nobody";
	assert_int_equal(kvt_remote_open(&o, &r), -EACCES);
	/* the ACL user, whose keys are kvt1:* */
	o.user = "kvt";
	o.password = "pw-kvt";
	assert_int_equal(kvt_remote_open(&o, &r), 0);
	ns_make(&ns, &L256, KVT_CODEC_NONE, "auth");
	blocks_make(&b, 4, ns.block_bytes, false);
	assert_int_equal(kvt_remote_put_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					       (const void *const *)b.src, 4, b.res), 4);
	assert_int_equal(kvt_remote_get_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					       (void *const *)b.dst, 4, b.res), 4);
	assert_int_equal(check_hits(&b), 4);
	kvt_remote_close(r);
	/* the default user's password; the puts carried PX 600000 */
	o.user = NULL;
	o.password = "pw-default";
	assert_int_equal(kvt_remote_open(&o, &r), 0);
	kvt_rv_key(&ns, 1, b.hash[0], key);
	assert_int_equal(tsrv_cli(&s, out, sizeof out, "-a pw-default --no-auth-warning PTTL %s",
				  key), 0);
	assert_true(atoi(out) > 0 && atoi(out) <= 600000);
	kvt_remote_close(r);
	tsrv_kill(&s);
	blocks_free(&b);
}

/* ---- a fake server: replies no Redis sends ------------------------------------------------ */

struct fake {
	int lfd;                 /* listening socket */
	uint16_t port;           /* its port */
	pthread_mutex_t mu;      /* guards script */
	const char *script;      /* the reply to the first command after PING */
	bool close_after;        /* close the connection after it */
	bool stop;               /* the thread ends at the next accept */
};

static void *
fake_main(void *arg)
{
	struct fake *f = arg;

	for (;;) {
		int fd = accept(f->lfd, NULL, NULL);
		char buf[65536];
		int n_read = 0;
		ssize_t n;

		if (fd < 0)
			return NULL;
		pthread_mutex_lock(&f->mu);
		if (f->stop) {
			pthread_mutex_unlock(&f->mu);
			close(fd);
			return NULL;
		}
		pthread_mutex_unlock(&f->mu);
		while ((n = read(fd, buf, sizeof buf)) > 0) {
			const char *rep = ":0\r\n";
			bool cl = false;

			if (n_read == 0) {
				rep = "+PONG\r\n";
			} else if (n_read == 1) {
				pthread_mutex_lock(&f->mu);
				rep = f->script;
				cl = f->close_after;
				pthread_mutex_unlock(&f->mu);
			}
			n_read++;
			if (write(fd, rep, strlen(rep)) < 0 || cl)
				break;
		}
		close(fd);
	}
}

static void
fake_start(struct fake *f, pthread_t *t)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t al = sizeof a;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	f->lfd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(f->lfd >= 0);
	assert_int_equal(bind(f->lfd, (struct sockaddr *)&a, sizeof a), 0);
	assert_int_equal(listen(f->lfd, 8), 0);
	assert_int_equal(getsockname(f->lfd, (struct sockaddr *)&a, &al), 0);
	f->port = ntohs(a.sin_port);
	pthread_mutex_init(&f->mu, NULL);
	assert_int_equal(pthread_create(t, NULL, fake_main, f), 0);
}

static void
test_bad_replies(void **state)
{
	static const struct {
		const char *script; /* the reply to a GET */
		bool close_after;   /* then EOF */
		int res;            /* the key's result */
	} cases[] = {
		{ "*2\r\n:1\r\n:2\r\n", false, -EPROTO },     /* an array */
		{ ":7\r\n", false, -EPROTO },                     /* an integer */
		{ "+OK\r\n", false, -EPROTO },                    /* a status */
		{ "!!! not RESP\r\n", false, -EPROTO },           /* protocol garbage */
		{ "$100\r\nabc", true, -ECONNRESET },             /* a value cut short */
		{ "$99999999999999999999\r\n", true, -EPROTO },   /* a length out of range */
		{ "-MOVED 1 127.0.0.1:1\r\n", false, -EPROTO },   /* a redirect, not a cluster */
		{ "-OOM command not allowed\r\n", false, -ENOSPC },
		{ "$5\r\nhello\r\n", false, 0 },                 /* a bad value: a miss */
		{ "$-1\r\n", false, 0 },                           /* nil */
	};
	struct fake f = { 0 };
	struct kvt_rv_ns ns;
	struct blocks b;
	pthread_t t;

	fake_start(&f, &t);
	ns_make(&ns, &L256, KVT_CODEC_NONE, "fake");
	blocks_make(&b, 1, ns.block_bytes, false);
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		struct kvt_remote_opts o = { .host = "127.0.0.1", .port = f.port, .cluster = -1,
					     .op_timeout_ms = 10000, .connect_timeout_ms = 10000 };
		struct kvt_remote *r = NULL;
		int got;

		pthread_mutex_lock(&f.mu);
		f.script = cases[c].script;
		f.close_after = cases[c].close_after;
		pthread_mutex_unlock(&f.mu);
		assert_int_equal(kvt_remote_open(&o, &r), 0);
		got = kvt_remote_get_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					    (void *const *)b.dst, 1, b.res);
		if (b.res[0] != cases[c].res)
			fprintf(stderr, "case %zu: res %d (%s)\n", c, b.res[0],
				kvt_last_error_message());
		assert_int_equal(got, 0);
		assert_int_equal(b.res[0], cases[c].res);
		kvt_remote_close(r);
	}
	pthread_mutex_lock(&f.mu);
	f.stop = true;
	pthread_mutex_unlock(&f.mu);
	{ /* wake the accept */
		struct kvt_remote_opts o = { .port = f.port, .cluster = -1 };
		struct kvt_remote *r = NULL;

		(void)kvt_remote_open(&o, &r);
		kvt_remote_close(r);
	}
	pthread_join(t, NULL);
	close(f.lfd);
	pthread_mutex_destroy(&f.mu);
	blocks_free(&b);
}

/* ---- a cluster ----------------------------------------------------------------------------- */

static int
cli_int(const struct tsrv *s, const char *fmt, const char *arg)
{
	char out[256], cmd[512];

	snprintf(cmd, sizeof cmd, fmt, arg);
	assert_int_equal(tsrv_cli(s, out, sizeof out, "%s", cmd), 0);
	return atoi(out);
}

static void
test_cluster(void **state)
{
	struct tsrv cl[3] = { { 0 } };
	char ids[3][128], key[KVT_RV_KEY_MAX], out[256], s_str[16];
	struct kvt_remote *r;
	struct kvt_remote_stats st;
	struct kvt_rv_ns ns;
	struct blocks b;
	int total = 0, a = -1, bn;
	uint16_t slot;
	uint64_t r0;

	assert_int_equal(tsrv_cluster(cl, 3), 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(tsrv_cli(&cl[i], ids[i], sizeof ids[i], "CLUSTER MYID"), 0);
	r = client(cl[1].port, 10000, 3);
	assert_true(kvt_remote_is_cluster(r));
	ns_make(&ns, &L256, KVT_CODEC_NONE, "cluster");
	blocks_make(&b, NB, ns.block_bytes, false);
	r0 = rounds(r);
	assert_int_equal(kvt_remote_put_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					       (const void *const *)b.src, NB, b.res), NB);
	assert_int_equal(rounds(r) - r0, 1); /* one round over the three masters */
	for (int i = 0; i < 3; i++) { /* keys on every master */
		int n = cli_int(&cl[i], "DBSIZE%s", "");

		assert_true(n > 0);
		total += n;
	}
	assert_int_equal(total, NB);
	for (uint32_t i = 0; i < 8; i++) { /* our slots are the server's */
		kvt_rv_key(&ns, 1, b.hash[i], key);
		assert_int_equal(cli_int(&cl[0], "CLUSTER KEYSLOT %s", key),
				 kvt_remote_key_slot(key, strlen(key)));
	}
	assert_int_equal(cli_int(&cl[0], "CLUSTER KEYSLOT %s", "a{tag}b"),
			 kvt_remote_key_slot("a{tag}b", 7));
	r0 = rounds(r);
	assert_int_equal(kvt_remote_get_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					       (void *const *)b.dst, NB, b.res), NB);
	assert_int_equal(rounds(r) - r0, 1);
	assert_int_equal(check_hits(&b), NB);

	/* ASK: block 0's slot migrating from its master a to bn, its key already moved */
	kvt_rv_key(&ns, 1, b.hash[0], key);
	slot = kvt_remote_key_slot(key, strlen(key));
	snprintf(s_str, sizeof s_str, "%u", slot);
	for (int i = 0; i < 3; i++)
		if (cli_int(&cl[i], "CLUSTER COUNTKEYSINSLOT %s", s_str) > 0)
			a = i;
	assert_true(a >= 0);
	bn = (a + 1) % 3;
	assert_int_equal(tsrv_cli(&cl[bn], out, sizeof out, "CLUSTER SETSLOT %u IMPORTING %s",
				  slot, ids[a]), 0);
	assert_string_equal(out, "OK");
	assert_int_equal(tsrv_cli(&cl[a], out, sizeof out, "CLUSTER SETSLOT %u MIGRATING %s",
				  slot, ids[bn]), 0);
	assert_string_equal(out, "OK");
	assert_int_equal(tsrv_cli(&cl[a], out, sizeof out, "MIGRATE 127.0.0.1 %u %s 0 5000",
				  cl[bn].port, key), 0);
	assert_string_equal(out, "OK");
	memset(b.dst[0], 0, b.bytes);
	r0 = rounds(r);
	assert_int_equal(kvt_remote_get_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					       (void *const *)b.dst, NB, b.res), NB);
	assert_int_equal(rounds(r) - r0, 2);
	assert_int_equal(check_hits(&b), NB);
	kvt_remote_stats(r, &st);
	assert_true(st.asks >= 1);
	assert_int_equal(st.moved, 0);

	/* MOVED: the migration finished (every key of the slot moved, the slot given to bn) */
	while (cli_int(&cl[a], "CLUSTER COUNTKEYSINSLOT %s", s_str) > 0) {
		char k2[256];

		assert_int_equal(tsrv_cli(&cl[a], k2, sizeof k2, "CLUSTER GETKEYSINSLOT %u 1",
					  slot), 0);
		assert_int_equal(tsrv_cli(&cl[a], out, sizeof out,
					  "MIGRATE 127.0.0.1 %u %s 0 5000", cl[bn].port, k2), 0);
		assert_string_equal(out, "OK");
	}
	for (int k = 0; k < 3; k++) {
		int i = (bn + k) % 3;

		assert_int_equal(tsrv_cli(&cl[i], out, sizeof out, "CLUSTER SETSLOT %u NODE %s",
					  slot, ids[bn]), 0);
		assert_string_equal(out, "OK");
	}
	memset(b.dst[0], 0, b.bytes);
	r0 = rounds(r);
	assert_int_equal(kvt_remote_get_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					       (void *const *)b.dst, NB, b.res), NB);
	assert_true(rounds(r) - r0 <= 2);
	assert_int_equal(check_hits(&b), NB);
	kvt_remote_stats(r, &st);
	assert_true(st.moved >= 1);
	assert_true(st.slot_refreshes >= 2);
	/* the map is fresh now: one round again */
	r0 = rounds(r);
	assert_int_equal(kvt_remote_get_blocks(r, &ns, 1, (const uint8_t(*)[16])b.hash,
					       (void *const *)b.dst, NB, b.res), NB);
	assert_int_equal(rounds(r) - r0, 1);
	kvt_remote_close(r);
	for (int i = 0; i < 3; i++)
		tsrv_kill(&cl[i]);
	blocks_free(&b);
}

static int
group_setup(void **state)
{
	return tsrv_start(&single, 0, "--maxmemory 256mb --maxmemory-policy allkeys-lru");
}

static int
group_teardown(void **state)
{
	tsrv_kill(&single);
	return 0;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_slots_crc16),
		cmocka_unit_test(test_value_checks),
		cmocka_unit_test(test_roundtrip_64),
		cmocka_unit_test(test_codec_roundtrip),
		cmocka_unit_test(test_bad_values),
		cmocka_unit_test(test_slow_server),
		cmocka_unit_test(test_killed_mid_batch),
		cmocka_unit_test(test_full_evicting),
		cmocka_unit_test(test_partition),
		cmocka_unit_test(test_auth_ttl),
		cmocka_unit_test(test_bad_replies),
		cmocka_unit_test(test_cluster),
	};

	signal(SIGPIPE, SIG_IGN);
	if (!tsrv_available()) {
		printf("test_remote: redis-server or redis-cli not on PATH (apt-get install "
		       "redis-server): skipped\n");
		return 77;
	}
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
