/* SPDX-License-Identifier: MIT */
/*
 * tiers/format.c - encoders and parsers of the NVMe store's on-disk format (see format.h and
 * docs/FORMAT.md). Every parser bounds-checks against the length it is given and verifies a
 * checksum before trusting any other field.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */

/* Checksum compares. A fuzzing build (libFuzzer's convention) skips them, so that mutated inputs
 * reach the field checks behind them instead of all failing at the checksum. */
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
#define FMT_SUM_BAD(have, want) ((void)(have), (void)(want), 0)
#else
#define FMT_SUM_BAD(have, want) ((have) != (want))
#endif
#include <xxhash.h>

#include "tiers/base/error.h"
#include "tiers/codec.h"
#include "tiers/format.h"

static const uint8_t fmt_super_magic[8] = { 'K', 'V', 'T', 'S', 'T', 'O', 'R', 'E' };
static const uint8_t fmt_blk_magic[8] = { 'K', 'V', 'T', 'B', 'L', 'K', '0', '2' };
static const uint8_t fmt_j_magic[8] = { 'K', 'V', 'T', 'J', 'R', 'N', 'L', '2' };
#define FMT_REC_MAGIC 0x5254564bu /* "KVTR" */

/* superblock field offsets */
enum {
	SB_MAGIC = 0, SB_VERSION = 8, SB_LAYERS = 12, SB_HEADS = 16, SB_DIM = 20, SB_DTYPE = 24,
	SB_TPB = 28, SB_CODEC = 32, SB_BLOCK = 40, SB_SLOT = 48, SB_NSLOTS = 56, SB_DATA = 64,
	SB_EPOCH = 72, SB_ID = 80, SB_JGEN = 88, SB_JLEN = 96, SB_GROUPS = 104,
	SB_GROUP = 112, SB_SUM = 248, SB_END = 256,
};

/* block header field offsets */
enum {
	BH_MAGIC = 0, BH_VERSION = 8, BH_SLOT = 12, BH_KEY = 16, BH_SESSION = 24, BH_INDEX = 32,
	BH_RAW = 36, BH_STORED = 40, BH_CODEC = 44, BH_HASH = 48, BH_SUM = 64, BH_SELF = 120,
};

/* journal record header: magic, type, payload length, reserved, seqno, checksum */
enum { RH_MAGIC = 0, RH_TYPE = 4, RH_LEN = 8, RH_RSV = 12, RH_SEQ = 16, RH_SUM = 24 };

void
kvt_put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

void
kvt_put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

uint32_t
kvt_get_le32(const uint8_t *p)
{
	uint32_t v = 0;

	for (int i = 0; i < 4; i++)
		v |= (uint32_t)p[i] << (8 * i);
	return v;
}

uint64_t
kvt_get_le64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

/* ---- superblock ---------------------------------------------------------------------------- */

void
kvt_fmt_super_encode(const struct kvt_fmt_super *s, uint8_t *out)
{
	memset(out, 0, KVT_FMT_SUPER_BYTES);
	memcpy(out + SB_MAGIC, fmt_super_magic, 8);
	kvt_put_le32(out + SB_VERSION, s->version);
	kvt_put_le32(out + SB_LAYERS, s->n_layers);
	kvt_put_le32(out + SB_HEADS, s->n_kv_heads);
	kvt_put_le32(out + SB_DIM, s->head_dim);
	kvt_put_le32(out + SB_DTYPE, s->dtype);
	kvt_put_le32(out + SB_TPB, s->tokens_per_block);
	kvt_put_le32(out + SB_CODEC, s->codec);
	kvt_put_le64(out + SB_BLOCK, s->block_bytes);
	kvt_put_le64(out + SB_SLOT, s->slot_bytes);
	kvt_put_le64(out + SB_NSLOTS, s->n_slots);
	kvt_put_le64(out + SB_DATA, s->data_off);
	kvt_put_le64(out + SB_EPOCH, s->epoch);
	kvt_put_le64(out + SB_ID, s->store_id);
	kvt_put_le64(out + SB_JGEN, s->journal_gen);
	kvt_put_le64(out + SB_JLEN, s->journal_len);
	kvt_put_le64(out + SB_GROUPS, s->groups_fp);
	kvt_put_le32(out + SB_GROUP, s->group);
	kvt_put_le64(out + SB_SUM, XXH3_64bits(out, SB_SUM));
}

int
kvt_fmt_super_decode(const uint8_t *b, size_t len, struct kvt_fmt_super *s)
{
	if (!b || len < KVT_FMT_SUPER_BYTES)
		return kvt_err(KVT_EFORMAT, "superblock: %zu bytes, need %u", len,
			       KVT_FMT_SUPER_BYTES);
	if (memcmp(b + SB_MAGIC, fmt_super_magic, 8) != 0)
		return kvt_err(KVT_EFORMAT, "not a kvtier store (bad superblock magic)");
	if (FMT_SUM_BAD(XXH3_64bits(b, SB_SUM), kvt_get_le64(b + SB_SUM)))
		return kvt_err(KVT_EFORMAT, "superblock checksum mismatch");
	memset(s, 0, sizeof *s);
	s->version = kvt_get_le32(b + SB_VERSION);
	s->n_layers = kvt_get_le32(b + SB_LAYERS);
	s->n_kv_heads = kvt_get_le32(b + SB_HEADS);
	s->head_dim = kvt_get_le32(b + SB_DIM);
	s->dtype = kvt_get_le32(b + SB_DTYPE);
	s->tokens_per_block = kvt_get_le32(b + SB_TPB);
	s->codec = kvt_get_le32(b + SB_CODEC);
	s->block_bytes = kvt_get_le64(b + SB_BLOCK);
	s->slot_bytes = kvt_get_le64(b + SB_SLOT);
	s->n_slots = kvt_get_le64(b + SB_NSLOTS);
	s->data_off = kvt_get_le64(b + SB_DATA);
	s->epoch = kvt_get_le64(b + SB_EPOCH);
	s->store_id = kvt_get_le64(b + SB_ID);
	s->journal_gen = kvt_get_le64(b + SB_JGEN); /* 0 in stores of older builds: unknown */
	s->journal_len = kvt_get_le64(b + SB_JLEN);
	s->groups_fp = kvt_get_le64(b + SB_GROUPS);
	s->group = kvt_get_le32(b + SB_GROUP);
	if (s->version != KVT_FMT_VERSION)
		return kvt_err(KVT_EFORMAT, "store format version %u, this kvtier reads %u",
			       s->version, KVT_FMT_VERSION);
	if (s->slot_bytes == 0 || s->slot_bytes % KVT_FMT_ALIGN ||
	    s->block_bytes > UINT32_MAX || s->slot_bytes != kvt_fmt_slot_bytes(s->block_bytes) ||
	    s->n_slots == 0 ||
	    s->n_slots > UINT32_MAX || s->data_off != KVT_FMT_DATA_OFF)
		return kvt_err(KVT_EFORMAT, "superblock geometry is inconsistent");
	return 0;
}

/* The name of a value of a stored enum: @names[@v], or "#v" in @buf for an unknown one. (Own
 * tables: the parsers link alone into the fuzz targets, without the codec.) */
static const char *
fmt_enum_name(const char *const *names, uint32_t n, uint32_t v, char *buf, size_t len)
{
	if (v < n)
		return names[v];
	snprintf(buf, len, "#%u", v);
	return buf;
}

static const char *const fmt_dtypes[] = { "f32", "f16", "bf16", "fp8_e4m3", "int8" };
static const char *const fmt_codecs[] = { "none", "lz4", "shuf-lz4", "byte-lz4", "cshuf-lz4" };
#define FMT_N(a) ((uint32_t)(sizeof(a) / sizeof((a)[0])))

#define FMT_MATCH(field, what)                                                                  \
	do {                                                                                    \
		if (have->field != want->field)                                                 \
			return kvt_err(KVT_EFORMAT,                                             \
				       "store %s was made for %s %llu, this engine has %llu; "  \
				       "not used (choose another nvme_dir or remove it)",      \
				       path, what, (unsigned long long)have->field,             \
				       (unsigned long long)want->field);                       \
	} while (0)

int
kvt_fmt_super_match(const struct kvt_fmt_super *have, const struct kvt_fmt_super *want,
		    const char *path)
{
	char b1[16], b2[16];

	if (have->groups_fp != want->groups_fp || have->group != want->group) {
		if (!have->groups_fp || !want->groups_fp)
			return kvt_err(KVT_EFORMAT, "store %s was made for %s, this engine has %s; "
				       "not used (choose another nvme_dir or remove it)", path,
				       have->groups_fp ? "a layer group of an engine with groups" :
							 "a single layout (no layer groups)",
				       want->groups_fp ? "layer groups" : "a single layout");
		return kvt_err(KVT_EFORMAT, "store %s was made for other layer groups (fingerprint "
			       "%016llx, group %u; this engine: %016llx, group %u); not used "
			       "(choose another nvme_dir or remove it)", path,
			       (unsigned long long)have->groups_fp, have->group,
			       (unsigned long long)want->groups_fp, want->group);
	}
	FMT_MATCH(n_layers, "n_layers");
	FMT_MATCH(n_kv_heads, "n_kv_heads");
	FMT_MATCH(head_dim, "head_dim");
	if (have->dtype != want->dtype)
		return kvt_err(KVT_EFORMAT, "store %s was made for dtype %s, this engine has %s; not "
			       "used (choose another nvme_dir or remove it)", path,
			       fmt_enum_name(fmt_dtypes, FMT_N(fmt_dtypes), have->dtype, b1, sizeof b1),
			       fmt_enum_name(fmt_dtypes, FMT_N(fmt_dtypes), want->dtype, b2, sizeof b2));
	FMT_MATCH(tokens_per_block, "tokens_per_block");
	if (have->codec != want->codec)
		return kvt_err(KVT_EFORMAT, "store %s was made for codec %s, this engine has %s; not "
			       "used (choose another nvme_dir or remove it)", path,
			       fmt_enum_name(fmt_codecs, FMT_N(fmt_codecs), have->codec, b1, sizeof b1),
			       fmt_enum_name(fmt_codecs, FMT_N(fmt_codecs), want->codec, b2, sizeof b2));
	FMT_MATCH(block_bytes, "block_bytes");
	FMT_MATCH(slot_bytes, "slot_bytes");
	FMT_MATCH(n_slots, "slots (capacity)");
	return 0;
}

uint64_t
kvt_fmt_write_key(uint64_t epoch, uint32_t slot, uint64_t sum)
{
	uint8_t b[12];

	kvt_put_le32(b, slot);
	kvt_put_le64(b + 4, sum);
	return (epoch << 40) | (XXH3_64bits(b, sizeof b) & ((1ull << 40) - 1));
}

uint32_t
kvt_fmt_lenc(uint32_t codec, uint32_t stored, uint64_t block_bytes)
{
	uint64_t d = (block_bytes + KVT_FMT_ALIGN - 1) / KVT_FMT_ALIGN;
	uint64_t p = ((uint64_t)stored + KVT_FMT_ALIGN - 1) / KVT_FMT_ALIGN;
	uint64_t q = d ? (p * KVT_FMT_LENC_QMAX + d - 1) / d : KVT_FMT_LENC_QMAX;

	if (q < 1)
		q = 1;
	if (q > KVT_FMT_LENC_QMAX || codec == KVT_CODEC_NONE)
		q = KVT_FMT_LENC_QMAX;
	return KVT_FMT_LENC_KNOWN | (codec & 7u) << 12 | (uint32_t)q;
}

uint64_t
kvt_fmt_lenc_bytes(uint32_t lenc, uint64_t block_bytes)
{
	uint64_t d = (block_bytes + KVT_FMT_ALIGN - 1) / KVT_FMT_ALIGN;
	uint32_t q = lenc & KVT_FMT_LENC_QMAX, codec = kvt_fmt_lenc_codec(lenc);

	if (!(lenc & KVT_FMT_LENC_KNOWN) || lenc >> 16 || codec > KVT_CODEC_CSHUF_LZ4 || q == 0 ||
	    (codec == KVT_CODEC_NONE && q != KVT_FMT_LENC_QMAX))
		return 0;
	return (q * d + KVT_FMT_LENC_QMAX - 1) / KVT_FMT_LENC_QMAX * KVT_FMT_ALIGN;
}

uint64_t
kvt_fmt_slot_bytes(uint64_t block_bytes)
{
	uint64_t mask = KVT_FMT_ALIGN - 1;

	return KVT_FMT_HDR_PAGE + ((block_bytes + mask) & ~mask);
}

/* ---- block header -------------------------------------------------------------------------- */

void
kvt_fmt_blkhdr_encode(const struct kvt_fmt_blkhdr *h, uint8_t *out)
{
	memset(out, 0, KVT_FMT_BLKHDR_BYTES);
	memcpy(out + BH_MAGIC, fmt_blk_magic, 8);
	kvt_put_le32(out + BH_VERSION, KVT_FMT_VERSION);
	kvt_put_le32(out + BH_SLOT, h->slot);
	kvt_put_le64(out + BH_KEY, h->key);
	kvt_put_le64(out + BH_SESSION, h->session);
	kvt_put_le32(out + BH_INDEX, h->index);
	kvt_put_le32(out + BH_RAW, h->raw_len);
	kvt_put_le32(out + BH_STORED, h->stored_len);
	kvt_put_le32(out + BH_CODEC, h->codec);
	memcpy(out + BH_HASH, h->hash, 16);
	kvt_put_le64(out + BH_SUM, h->sum);
	kvt_put_le64(out + BH_SELF, XXH3_64bits(out, BH_SELF));
}

int
kvt_fmt_blkhdr_decode(const uint8_t *b, size_t len, struct kvt_fmt_blkhdr *h)
{
	if (!b || len < KVT_FMT_BLKHDR_BYTES)
		return kvt_err(KVT_ECORRUPT, "block header: %zu bytes", len);
	if (memcmp(b + BH_MAGIC, fmt_blk_magic, 8) != 0)
		return kvt_err(KVT_ECORRUPT, "no block header (bad magic)");
	if (FMT_SUM_BAD(XXH3_64bits(b, BH_SELF), kvt_get_le64(b + BH_SELF)))
		return kvt_err(KVT_ECORRUPT, "block header checksum mismatch");
	if (kvt_get_le32(b + BH_VERSION) != KVT_FMT_VERSION)
		return kvt_err(KVT_ECORRUPT, "block header version %u, expected %u",
			       kvt_get_le32(b + BH_VERSION), KVT_FMT_VERSION);
	h->slot = kvt_get_le32(b + BH_SLOT);
	h->key = kvt_get_le64(b + BH_KEY);
	h->session = kvt_get_le64(b + BH_SESSION);
	h->index = kvt_get_le32(b + BH_INDEX);
	h->raw_len = kvt_get_le32(b + BH_RAW);
	h->stored_len = kvt_get_le32(b + BH_STORED);
	h->codec = kvt_get_le32(b + BH_CODEC);
	memcpy(h->hash, b + BH_HASH, 16);
	h->sum = kvt_get_le64(b + BH_SUM);
	if (h->codec > KVT_CODEC_CSHUF_LZ4 || h->stored_len == 0 || h->raw_len == 0 ||
	    (h->codec == KVT_CODEC_NONE && h->stored_len != h->raw_len) ||
	    (h->codec != KVT_CODEC_NONE && h->stored_len >= h->raw_len))
		return kvt_err(KVT_ECORRUPT, "block header: codec %u, %u bytes stored for %u",
			       h->codec, h->stored_len, h->raw_len);
	return 0;
}

/* ---- journal ------------------------------------------------------------------------------- */

void
kvt_fmt_jhdr_encode(uint64_t store_id, uint8_t *out)
{
	kvt_fmt_jhdr_encode_gen(store_id, 0, out);
}

void
kvt_fmt_jhdr_encode_gen(uint64_t store_id, uint64_t gen, uint8_t *out)
{
	memset(out, 0, KVT_FMT_JHDR_BYTES);
	memcpy(out, fmt_j_magic, 8);
	kvt_put_le32(out + 8, KVT_FMT_VERSION);
	kvt_put_le64(out + 16, store_id);
	kvt_put_le64(out + 24, gen);
	kvt_put_le64(out + 56, XXH3_64bits(out, 56));
}

uint64_t
kvt_fmt_jhdr_gen(const uint8_t *b)
{
	return kvt_get_le64(b + 24);
}

uint32_t
kvt_fmt_jhdr_version(const uint8_t *b, size_t len)
{
	if (!b || len < KVT_FMT_JHDR_BYTES || memcmp(b, fmt_j_magic, 8) != 0 ||
	    FMT_SUM_BAD(XXH3_64bits(b, 56), kvt_get_le64(b + 56)))
		return 0;
	return kvt_get_le32(b + 8);
}

int
kvt_fmt_jhdr_decode(const uint8_t *b, size_t len, uint64_t *store_id)
{
	uint32_t ver = kvt_fmt_jhdr_version(b, len);

	if (ver == 0)
		return kvt_err(KVT_EFORMAT, "not a kvtier journal (%s)",
			       b && len >= KVT_FMT_JHDR_BYTES && !memcmp(b, fmt_j_magic, 8) ?
			       "header checksum mismatch" : "bad magic");
	if (ver != KVT_FMT_VERSION)
		return kvt_err(KVT_EFORMAT, "journal format version %u, this kvtier reads %u", ver,
			       KVT_FMT_VERSION);
	*store_id = kvt_get_le64(b + 16);
	return 0;
}

static size_t
fmt_pad8(size_t n)
{
	return (n + 7) & ~(size_t)7;
}

size_t
kvt_fmt_put_bytes(uint32_t n_blocks, uint64_t n_tokens)
{
	uint64_t p = KVT_FMT_PUT_FIXED + (uint64_t)n_blocks * KVT_FMT_PUT_BLOCK + n_tokens * 4;

	if (n_tokens > KVT_FMT_MAX_REC || p > KVT_FMT_MAX_REC)
		return 0;
	return KVT_FMT_RECHDR_BYTES + fmt_pad8((size_t)p);
}

size_t
kvt_fmt_del_bytes(void)
{
	return KVT_FMT_RECHDR_BYTES + 8;
}

/* Fill the record header of a record of @plen payload bytes (already written) and seal it. */
static void
fmt_rec_seal(uint8_t *out, uint32_t type, size_t plen, uint64_t seqno)
{
	XXH3_state_t st;

	kvt_put_le32(out + RH_MAGIC, FMT_REC_MAGIC);
	kvt_put_le32(out + RH_TYPE, type);
	kvt_put_le32(out + RH_LEN, (uint32_t)plen);
	kvt_put_le32(out + RH_RSV, 0);
	kvt_put_le64(out + RH_SEQ, seqno);
	XXH3_64bits_reset(&st);
	XXH3_64bits_update(&st, out, RH_SUM);
	XXH3_64bits_update(&st, out + KVT_FMT_RECHDR_BYTES, plen);
	kvt_put_le64(out + RH_SUM, XXH3_64bits_digest(&st));
}

void
kvt_fmt_put_encode(uint8_t *out, uint64_t seqno, uint64_t session, uint32_t tenant,
		   uint32_t priority, const struct kvt_fmt_blkref *blocks, uint32_t n_blocks,
		   const int32_t *tokens, uint64_t n_tokens)
{
	size_t total = kvt_fmt_put_bytes(n_blocks, n_tokens);
	uint8_t *p = out + KVT_FMT_RECHDR_BYTES, *q;

	memset(out, 0, total);
	kvt_put_le64(p, session);
	kvt_put_le64(p + 8, n_tokens);
	kvt_put_le32(p + 16, n_blocks);
	kvt_put_le32(p + 20, tenant);
	kvt_put_le32(p + 24, priority);
	for (uint32_t i = 0; i < n_blocks; i++) {
		q = p + KVT_FMT_PUT_FIXED + (size_t)i * KVT_FMT_PUT_BLOCK;
		kvt_put_le32(q, blocks[i].slot);
		kvt_put_le32(q + 4, blocks[i].tag);
		kvt_put_le32(q + 8, blocks[i].lenc);
		memcpy(q + 16, blocks[i].hash, 16); /* bytes 12-15 stay zero */
	}
	q = p + KVT_FMT_PUT_FIXED + (size_t)n_blocks * KVT_FMT_PUT_BLOCK;
	for (uint64_t i = 0; i < n_tokens; i++)
		kvt_put_le32(q + 4 * i, (uint32_t)(tokens ? tokens[i] : -1));
	fmt_rec_seal(out, KVT_FMT_REC_PUT, total - KVT_FMT_RECHDR_BYTES, seqno);
}

void
kvt_fmt_del_encode(uint8_t *out, uint64_t seqno, uint64_t session)
{
	memset(out, 0, kvt_fmt_del_bytes());
	kvt_put_le64(out + KVT_FMT_RECHDR_BYTES, session);
	fmt_rec_seal(out, KVT_FMT_REC_DEL, 8, seqno);
}

int
kvt_fmt_rec_decode(const uint8_t *b, size_t len, struct kvt_fmt_rec *r, size_t *used)
{
	const uint8_t *p = b + KVT_FMT_RECHDR_BYTES;
	XXH3_state_t st;
	uint64_t need;
	size_t plen;

	if (!b || len < KVT_FMT_RECHDR_BYTES || kvt_get_le32(b + RH_MAGIC) != FMT_REC_MAGIC)
		return 1;
	plen = kvt_get_le32(b + RH_LEN);
	if (plen > KVT_FMT_MAX_REC || plen % 8 || plen > len - KVT_FMT_RECHDR_BYTES)
		return 1;
	XXH3_64bits_reset(&st);
	XXH3_64bits_update(&st, b, RH_SUM);
	XXH3_64bits_update(&st, p, plen);
	if (FMT_SUM_BAD(XXH3_64bits_digest(&st), kvt_get_le64(b + RH_SUM)))
		return 1;
	memset(r, 0, sizeof *r);
	r->type = kvt_get_le32(b + RH_TYPE);
	r->seqno = kvt_get_le64(b + RH_SEQ);
	if (plen < 8)
		return 1;
	r->session = kvt_get_le64(p);
	if (r->type == KVT_FMT_REC_DEL) {
		*used = KVT_FMT_RECHDR_BYTES + plen;
		return 0;
	}
	if (r->type != KVT_FMT_REC_PUT || plen < KVT_FMT_PUT_FIXED)
		return 1;
	r->n_tokens = kvt_get_le64(p + 8);
	r->n_blocks = kvt_get_le32(p + 16);
	r->tenant = kvt_get_le32(p + 20);
	r->priority = kvt_get_le32(p + 24);
	/* only what the record's length depends on: the other fields are kvt_fmt_rec_check's, so
	 * that a bad one drops its session instead of ending the replay */
	if (r->n_tokens > KVT_FMT_MAX_REC || r->n_blocks > KVT_FMT_MAX_REC)
		return 1;
	need = KVT_FMT_PUT_FIXED + (uint64_t)r->n_blocks * KVT_FMT_PUT_BLOCK + r->n_tokens * 4;
	if (fmt_pad8((size_t)need) != plen)
		return 1;
	r->blocks = p + KVT_FMT_PUT_FIXED;
	r->tokens = r->blocks + (size_t)r->n_blocks * KVT_FMT_PUT_BLOCK;
	*used = KVT_FMT_RECHDR_BYTES + plen;
	return 0;
}

/* KVT_ECORRUPT with a message naming record @r and what is wrong with it. */
static int KVT_PRINTF(2, 3)
fmt_rec_bad(const struct kvt_fmt_rec *r, const char *fmt, ...)
{
	char why[200];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof why, fmt, ap);
	va_end(ap);
	return kvt_err(KVT_EFORMAT, "journal record seqno %llu (session %#llx): %s",
		       (unsigned long long)r->seqno, (unsigned long long)r->session, why);
}

int
kvt_fmt_rec_check(const struct kvt_fmt_rec *r, const struct kvt_fmt_limits *lim)
{
	uint32_t tpb = lim->tokens_per_block;
	struct kvt_fmt_blkref b;

	if (r->seqno == 0 || r->seqno > KVT_FMT_MAX_SEQNO)
		return fmt_rec_bad(r, "seqno out of range 1..2^62");
	if (r->type != KVT_FMT_REC_PUT)
		return 0;
	if (r->session == 0)
		return fmt_rec_bad(r, "a PUT of session key 0 (no session)");
	if (r->priority > 100)
		return fmt_rec_bad(r, "priority %u out of range 0..100", r->priority);
	if (tpb && (uint64_t)r->n_blocks != (r->n_tokens + tpb - 1) / tpb)
		return fmt_rec_bad(r, "%llu tokens in %u blocks of %u tokens (must be %llu blocks)",
				   (unsigned long long)r->n_tokens, r->n_blocks, tpb,
				   (unsigned long long)((r->n_tokens + tpb - 1) / tpb));
	if (r->n_blocks > lim->n_slots)
		return fmt_rec_bad(r, "%u blocks, the store has %u slots", r->n_blocks,
				   lim->n_slots);
	for (uint32_t i = 0; i < r->n_blocks; i++) {
		const uint8_t *q = r->blocks + (size_t)i * KVT_FMT_PUT_BLOCK;

		kvt_fmt_rec_block(r, i, &b);
		if (b.slot >= lim->n_slots)
			return fmt_rec_bad(r, "block %u in slot %u, the store has %u slots", i,
					   b.slot, lim->n_slots);
		if (!kvt_fmt_lenc_bytes(b.lenc, lim->block_bytes) ||
		    (kvt_fmt_lenc_codec(b.lenc) != KVT_CODEC_NONE &&
		     kvt_fmt_lenc_codec(b.lenc) != lim->codec))
			return fmt_rec_bad(r, "block %u: length code %#x is no write of this store "
					   "(blocks of %llu bytes, codec %u)", i, b.lenc,
					   (unsigned long long)lim->block_bytes, lim->codec);
		if (kvt_get_le32(q + 12) != 0)
			return fmt_rec_bad(r, "block %u: reserved bytes not zero", i);
	}
	return 0;
}

void
kvt_fmt_rec_block(const struct kvt_fmt_rec *r, uint32_t i, struct kvt_fmt_blkref *o)
{
	const uint8_t *q = r->blocks + (size_t)i * KVT_FMT_PUT_BLOCK;

	o->slot = kvt_get_le32(q);
	o->tag = kvt_get_le32(q + 4);
	o->lenc = kvt_get_le32(q + 8);
	memcpy(o->hash, q + 16, 16);
}

int32_t
kvt_fmt_rec_token(const struct kvt_fmt_rec *r, uint64_t i)
{
	return (int32_t)kvt_get_le32(r->tokens + 4 * i);
}

int
kvt_fmt_fuzz_one(const uint8_t *data, size_t len)
{
	struct kvt_fmt_super s, want;
	struct kvt_fmt_blkhdr h;
	struct kvt_fmt_blkref br;
	struct kvt_fmt_rec r;
	/* as tests/fuzz/mkseeds.c writes */
	const struct kvt_fmt_limits lim = { 64, 16, 8192, KVT_CODEC_NONE };
	uint64_t id = 0, acc = 0;
	size_t off = 0, used;
	int n = 0;

	if (kvt_fmt_super_decode(data, len, &s) == 0) {
		want = s;
		want.n_layers++;
		acc += kvt_fmt_super_match(&s, &want, "fuzz") != 0;
	}
	if (kvt_fmt_blkhdr_decode(data, len, &h) == 0)
		acc += h.slot + h.key + h.stored_len + h.hash[15];
	if (kvt_fmt_jhdr_decode(data, len, &id) == 0)
		off = KVT_FMT_JHDR_BYTES;
	while (off < len && kvt_fmt_rec_decode(data + off, len - off, &r, &used) == 0) {
		acc += kvt_fmt_rec_check(&r, &lim) == 0;
		for (uint32_t i = 0; i < r.n_blocks; i++) {
			kvt_fmt_rec_block(&r, i, &br);
			acc += br.slot + br.tag + br.lenc;
		}
		for (uint64_t i = 0; i < r.n_tokens; i++)
			acc += (uint32_t)kvt_fmt_rec_token(&r, i);
		off += used;
		n++;
	}
	return n + (int)(acc & 0);
}
