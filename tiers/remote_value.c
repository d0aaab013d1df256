/* SPDX-License-Identifier: MIT */
/*
 * tiers/remote_value.c - the REMOTE tier's values of KV blocks (docs/FORMAT.md "REMOTE values"):
 * namespaces, keys, the 128-byte header and its parser, and the batched block put/get on a
 * kvt_remote client. A value is trusted only after every field of its header, the echo of its
 * key and the XXH3-64 of its payload (and of the decoded block) checked; anything else is a
 * miss, deleted best effort, never served.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "tiers/base/error.h"
#include "tiers/codec.h"
#include "tiers/format.h"
#include "tiers/remote.h"

static const uint8_t rv_magic[8] = { 'K', 'V', 'T', 'R', 'M', 'T', '0', '1' };
#define RV_MAX_BLOCK ((512ull << 20) - KVT_RV_HDR_BYTES) /* Redis's largest value */

/* header field offsets */
enum {
	RH_MAGIC = 0, RH_VERSION = 8, RH_CODEC = 12, RH_NS = 16, RH_TENANT = 32, RH_ZERO1 = 36,
	RH_HASH = 40, RH_LAYOUT = 56, RH_RAW = 64, RH_STORED = 72, RH_PSUM = 80, RH_RSUM = 88,
	RH_ZERO2 = 96, RH_SELF = 120,
};

static void
rv_u32(XXH3_state_t *st, uint32_t v)
{
	uint8_t b[4];

	kvt_put_le32(b, v);
	XXH3_128bits_update(st, b, 4);
}

int
kvt_rv_ns_init(struct kvt_rv_ns *ns, const struct kvt_rv_desc *d)
{
	const struct kvt_layout *l = &d->layout;
	size_t mlen = d->model_id ? strlen(d->model_id) : 0;
	size_t esz = kvt_dtype_size(l->dtype);
	uint8_t b[8 + 6 * 4 + 8];
	XXH128_canonical_t c;
	XXH3_state_t st;
	uint64_t bb;

	if (mlen == 0 || mlen > 1024)
		return kvt_err(-EINVAL, "remote namespace: model_id of %zu bytes (1..1024: the "
			       "model and weights identity)", mlen);
	if (!esz || l->n_layers < 1 || l->n_layers > 4096 || l->n_kv_heads < 1 ||
	    l->n_kv_heads > 4096 || l->head_dim < 1 || l->head_dim > 4096 ||
	    l->tokens_per_block < 1 || l->tokens_per_block > 65536)
		return kvt_err(-EINVAL, "remote namespace: bad layout (layers %u, kv heads %u, "
			       "head_dim %u, dtype %d, tokens_per_block %u)", l->n_layers,
			       l->n_kv_heads, l->head_dim, (int)l->dtype, l->tokens_per_block);
	bb = (uint64_t)l->n_layers * 2 * l->tokens_per_block * l->n_kv_heads * l->head_dim * esz;
	if (bb > RV_MAX_BLOCK)
		return kvt_err(-EINVAL, "remote namespace: blocks of %llu bytes exceed a Redis "
			       "value (512 MiB with the header)", (unsigned long long)bb);
	if (d->codec > KVT_CODEC_CSHUF_LZ4)
		return kvt_err(-EINVAL, "remote namespace: unknown codec %u", d->codec);
	if (d->tp_size < 1 || d->tp_rank >= d->tp_size || d->pp_size < 1 ||
	    d->pp_rank >= d->pp_size)
		return kvt_err(-EINVAL, "remote namespace: shard tp %u/%u pp %u/%u (rank < size, "
			       "size >= 1)", d->tp_rank, d->tp_size, d->pp_rank, d->pp_size);
	memset(ns, 0, sizeof *ns);
	ns->block_bytes = bb;
	ns->codec = d->codec;
	ns->min_saving = 0.1;
	kvt_codec_geom_of_layout(l, &ns->geom);
	/* the layout fingerprint: the format version, the layout, the block bytes */
	kvt_put_le32(b, KVT_RV_VERSION);
	kvt_put_le32(b + 4, l->n_layers);
	kvt_put_le32(b + 8, l->n_kv_heads);
	kvt_put_le32(b + 12, l->head_dim);
	kvt_put_le32(b + 16, (uint32_t)l->dtype);
	kvt_put_le32(b + 20, l->tokens_per_block);
	kvt_put_le64(b + 24, bb);
	ns->layout_fp = XXH3_64bits(b, 32);
	/* the namespace: "kvtier-remote", the fingerprint's fields, the model, codec, shard */
	XXH3_128bits_reset(&st);
	XXH3_128bits_update(&st, "kvtier-remote", 13);
	XXH3_128bits_update(&st, b, 32);
	rv_u32(&st, (uint32_t)mlen);
	XXH3_128bits_update(&st, d->model_id, mlen);
	rv_u32(&st, d->codec);
	rv_u32(&st, d->tp_rank);
	rv_u32(&st, d->tp_size);
	rv_u32(&st, d->pp_rank);
	rv_u32(&st, d->pp_size);
	XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st));
	memcpy(ns->id, c.digest, 16);
	return 0;
}

static char *
rv_hex(char *o, const uint8_t *p, size_t n)
{
	static const char hx[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++) {
		*o++ = hx[p[i] >> 4];
		*o++ = hx[p[i] & 15];
	}
	return o;
}

size_t
kvt_rv_key(const struct kvt_rv_ns *ns, uint32_t tenant, const uint8_t hash[16], char *out)
{
	uint8_t t[4] = { (uint8_t)(tenant >> 24), (uint8_t)(tenant >> 16), (uint8_t)(tenant >> 8),
			 (uint8_t)tenant };
	char *o = out;

	memcpy(o, "kvt1:", 5);
	o = rv_hex(o + 5, ns->id, 16);
	*o++ = ':';
	o = rv_hex(o, t, 4);
	*o++ = ':';
	o = rv_hex(o, hash, 16);
	*o = '\0';
	return (size_t)(o - out);
}

void
kvt_rv_hdr_encode(const struct kvt_rv_hdr *h, uint8_t *out)
{
	memset(out, 0, KVT_RV_HDR_BYTES);
	memcpy(out + RH_MAGIC, rv_magic, 8);
	kvt_put_le32(out + RH_VERSION, KVT_RV_VERSION);
	kvt_put_le32(out + RH_CODEC, h->codec);
	memcpy(out + RH_NS, h->ns, 16);
	kvt_put_le32(out + RH_TENANT, h->tenant);
	memcpy(out + RH_HASH, h->hash, 16);
	kvt_put_le64(out + RH_LAYOUT, h->layout_fp);
	kvt_put_le64(out + RH_RAW, h->raw_len);
	kvt_put_le64(out + RH_STORED, h->stored_len);
	kvt_put_le64(out + RH_PSUM, h->payload_sum);
	kvt_put_le64(out + RH_RSUM, h->raw_sum);
	kvt_put_le64(out + RH_SELF, XXH3_64bits(out, RH_SELF));
}

static bool
rv_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
}

int
kvt_rv_parse(const struct kvt_rv_ns *ns, uint32_t tenant, const uint8_t hash[16],
	     const void *val, size_t len, struct kvt_rv_hdr *out)
{
	const uint8_t *b = val;
	struct kvt_rv_hdr h;

	if (len < KVT_RV_HDR_BYTES)
		return kvt_err(KVT_ECORRUPT, "remote value: %zu bytes, shorter than its header", len);
	if (memcmp(b + RH_MAGIC, rv_magic, 8))
		return kvt_err(KVT_ECORRUPT, "remote value: bad magic");
	if (kvt_get_le32(b + RH_VERSION) != KVT_RV_VERSION)
		return kvt_err(KVT_ECORRUPT, "remote value: format version %u, this kvtier reads %u",
			       kvt_get_le32(b + RH_VERSION), KVT_RV_VERSION);
	if (XXH3_64bits(b, RH_SELF) != kvt_get_le64(b + RH_SELF))
		return kvt_err(KVT_ECORRUPT, "remote value: header checksum mismatch");
	if (!rv_zero(b + RH_ZERO1, 4) || !rv_zero(b + RH_ZERO2, RH_SELF - RH_ZERO2))
		return kvt_err(KVT_ECORRUPT, "remote value: reserved header bytes not zero");
	memcpy(h.ns, b + RH_NS, 16);
	memcpy(h.hash, b + RH_HASH, 16);
	h.codec = kvt_get_le32(b + RH_CODEC);
	h.tenant = kvt_get_le32(b + RH_TENANT);
	h.layout_fp = kvt_get_le64(b + RH_LAYOUT);
	h.raw_len = kvt_get_le64(b + RH_RAW);
	h.stored_len = kvt_get_le64(b + RH_STORED);
	h.payload_sum = kvt_get_le64(b + RH_PSUM);
	h.raw_sum = kvt_get_le64(b + RH_RSUM);
	if (memcmp(h.ns, ns->id, 16))
		return kvt_err(KVT_ECORRUPT, "remote value: written for another namespace (model, "
			       "layout, codec or shard)");
	if (h.tenant != tenant)
		return kvt_err(KVT_ECORRUPT, "remote value: tenant %u's, read as tenant %u's",
			       h.tenant, tenant);
	if (memcmp(h.hash, hash, 16))
		return kvt_err(KVT_ECORRUPT, "remote value: another block's (hash echoed differs)");
	if (h.layout_fp != ns->layout_fp)
		return kvt_err(KVT_ECORRUPT, "remote value: layout fingerprint %016llx, expected "
			       "%016llx", (unsigned long long)h.layout_fp,
			       (unsigned long long)ns->layout_fp);
	if (h.raw_len != ns->block_bytes)
		return kvt_err(KVT_ECORRUPT, "remote value: raw length %llu, blocks are %llu bytes",
			       (unsigned long long)h.raw_len, (unsigned long long)ns->block_bytes);
	if (h.codec > KVT_CODEC_CSHUF_LZ4 ||
	    (h.codec == KVT_CODEC_NONE ? h.stored_len != h.raw_len || h.raw_sum != h.payload_sum
				       : h.stored_len >= h.raw_len || h.stored_len == 0))
		return kvt_err(KVT_ECORRUPT, "remote value: codec %u with %llu stored bytes of %llu",
			       h.codec, (unsigned long long)h.stored_len,
			       (unsigned long long)h.raw_len);
	if (len - KVT_RV_HDR_BYTES != h.stored_len)
		return kvt_err(KVT_ECORRUPT, "remote value: %zu payload bytes, header says %llu",
			       len - KVT_RV_HDR_BYTES, (unsigned long long)h.stored_len);
	if (XXH3_64bits(b + KVT_RV_HDR_BYTES, h.stored_len) != h.payload_sum)
		return kvt_err(KVT_ECORRUPT, "remote value: payload checksum mismatch");
	if (out)
		*out = h;
	return 0;
}

/* ---- batched blocks ------------------------------------------------------------------------ */

/* Per-batch arrays: keys and their lengths (one allocation). */
struct rv_keys {
	char *buf;           /* n keys of KVT_RV_KEY_MAX bytes */
	const char **keys;   /* n pointers into buf */
	size_t *lens;        /* n lengths */
};

static int
rv_keys_make(struct rv_keys *k, const struct kvt_rv_ns *ns, uint32_t tenant,
	     const uint8_t (*hashes)[16], uint32_t n)
{
	k->buf = malloc((size_t)n * (KVT_RV_KEY_MAX + sizeof *k->keys + sizeof *k->lens));
	if (!k->buf)
		return kvt_err(-ENOMEM, "remote: no memory for %u keys", n);
	k->keys = (const char **)(void *)(k->buf + (size_t)n * KVT_RV_KEY_MAX);
	k->lens = (size_t *)(void *)(k->keys + n);
	for (uint32_t i = 0; i < n; i++) {
		char *key = k->buf + (size_t)i * KVT_RV_KEY_MAX;

		k->lens[i] = kvt_rv_key(ns, tenant, hashes[i], key);
		k->keys[i] = key;
	}
	return 0;
}

static int
rv_check(const struct kvt_remote *r, const struct kvt_rv_ns *ns, const uint8_t (*hashes)[16],
	 const void *bufs, uint32_t n, const int *res)
{
	if (!r || !ns || !hashes || !bufs || !res || n == 0 || n > 65536 || !ns->block_bytes)
		return kvt_err(-EINVAL, "remote blocks: bad batch (n %u, 1..65536, non-NULL "
			       "arrays, an initialised namespace)", n);
	return 0;
}

int
kvt_remote_put_blocks(struct kvt_remote *r, const struct kvt_rv_ns *ns, uint32_t tenant,
		      const uint8_t (*hashes)[16], const void *const *src, uint32_t n, int *res)
{
	struct kvt_remote_val *v = NULL;
	uint8_t *hdr = NULL, *scratch = NULL;
	void **enc = NULL;
	struct rv_keys k = { 0 };
	int rc = rv_check(r, ns, hashes, src, n, res);

	if (rc == 0)
		rc = rv_keys_make(&k, ns, tenant, hashes, n);
	if (rc == 0) {
		v = calloc(n, sizeof *v);
		hdr = malloc((size_t)n * KVT_RV_HDR_BYTES);
		enc = ns->codec ? calloc(n, sizeof *enc) : NULL;
		scratch = ns->codec ? malloc(kvt_codec_scratch_bytes(ns->block_bytes)) : NULL;
		if (!v || !hdr || (ns->codec && (!enc || !scratch)))
			rc = kvt_err(-ENOMEM, "remote: no memory for a put of %u blocks", n);
	}
	for (uint32_t i = 0; rc == 0 && i < n; i++) {
		struct kvt_rv_hdr h = { .tenant = tenant, .layout_fp = ns->layout_fp,
					.raw_len = ns->block_bytes, .codec = KVT_CODEC_NONE };
		const void *pay = src[i];
		int64_t got = 0;

		memcpy(h.ns, ns->id, 16);
		memcpy(h.hash, hashes[i], 16);
		h.raw_sum = XXH3_64bits(src[i], ns->block_bytes);
		if (ns->codec) {
			enc[i] = malloc(ns->block_bytes);
			if (!enc[i]) {
				rc = kvt_err(-ENOMEM, "remote: no memory to encode a block");
				break;
			}
			got = kvt_codec_encode_geom((int)ns->codec, &ns->geom, src[i],
						    ns->block_bytes, enc[i], ns->block_bytes,
						    scratch, ns->min_saving);
		}
		if (got > 0) {
			h.codec = ns->codec;
			h.stored_len = (uint64_t)got;
			pay = enc[i];
			h.payload_sum = XXH3_64bits(pay, h.stored_len);
		} else {
			h.stored_len = ns->block_bytes;
			h.payload_sum = h.raw_sum;
		}
		kvt_rv_hdr_encode(&h, hdr + (size_t)i * KVT_RV_HDR_BYTES);
		v[i] = (struct kvt_remote_val){ { hdr + (size_t)i * KVT_RV_HDR_BYTES, pay },
						{ KVT_RV_HDR_BYTES, h.stored_len } };
	}
	if (rc == 0)
		rc = kvt_remote_put(r, k.keys, k.lens, v, n, res);
	for (uint32_t i = 0; enc && i < n; i++)
		free(enc[i]);
	free(enc);
	free(scratch);
	free(hdr);
	free(v);
	free(k.buf);
	return rc;
}

/* The consumer of kvt_remote_get_blocks(): verify, then copy or decode into the block's dst. */
struct rv_get {
	const struct kvt_rv_ns *ns;  /* namespace */
	uint32_t tenant;             /* tenant */
	const uint8_t (*hashes)[16]; /* block hashes */
	void *const *dst;            /* destinations */
	void *scratch;               /* codec scratch, allocated on the first encoded value */
};

static int
rv_take(void *arg, uint32_t i, const void *val, size_t len)
{
	struct rv_get *g = arg;
	const struct kvt_rv_ns *ns = g->ns;
	const uint8_t *pay = (const uint8_t *)val + KVT_RV_HDR_BYTES;
	struct kvt_rv_hdr h;

	if (kvt_rv_parse(ns, g->tenant, g->hashes[i], val, len, &h))
		return 0;
	if (h.codec == KVT_CODEC_NONE) {
		memcpy(g->dst[i], pay, h.stored_len);
		return 1;
	}
	if (!g->scratch && !(g->scratch = malloc(kvt_codec_scratch_bytes(ns->block_bytes))))
		return kvt_err(-ENOMEM, "remote: no memory to decode a block"), 0;
	if (kvt_codec_decode_geom((int)h.codec, &ns->geom, pay, h.stored_len, g->dst[i],
				  ns->block_bytes, g->scratch))
		return kvt_err(KVT_ECORRUPT, "remote value: payload does not decode"), 0;
	if (XXH3_64bits(g->dst[i], ns->block_bytes) != h.raw_sum)
		return kvt_err(KVT_ECORRUPT, "remote value: decoded block checksum mismatch"), 0;
	return 1;
}

int
kvt_remote_get_blocks(struct kvt_remote *r, const struct kvt_rv_ns *ns, uint32_t tenant,
		      const uint8_t (*hashes)[16], void *const *dst, uint32_t n, int *res)
{
	struct rv_get g = { .ns = ns, .tenant = tenant, .hashes = hashes, .dst = dst };
	struct rv_keys k = { 0 };
	int rc = rv_check(r, ns, hashes, dst, n, res);

	if (rc == 0)
		rc = rv_keys_make(&k, ns, tenant, hashes, n);
	if (rc == 0)
		rc = kvt_remote_get(r, k.keys, k.lens, n, rv_take, &g, res);
	free(g.scratch);
	free(k.buf);
	return rc;
}

int
kvt_remote_exists_blocks(struct kvt_remote *r, const struct kvt_rv_ns *ns, uint32_t tenant,
			 const uint8_t (*hashes)[16], uint32_t n, int *res)
{
	struct rv_keys k = { 0 };
	int rc = rv_check(r, ns, hashes, hashes, n, res ? res : (const int *)hashes);

	if (rc == 0)
		rc = rv_keys_make(&k, ns, tenant, hashes, n);
	if (rc == 0)
		rc = kvt_remote_exists(r, k.keys, k.lens, n, res);
	free(k.buf);
	return rc;
}
