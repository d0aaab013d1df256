/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/structgen.h - a structure-aware generator of journal images (header-only, for
 * tests/test_fuzz_struct.c): it takes a valid journal, sets one field of one record to a
 * boundary value (0, 1, the format's or the store's limit and one past it, "negative" (the top
 * bit), all ones, huge) and recomputes that record's checksum, so that the mutation reaches the
 * field checks behind the checksum (random bytes almost never do). The field table knows the
 * record layout of docs/FORMAT.md (tiers/format.c's offsets).
 *
 * Running it longer, with libFuzzer (clang): the ctest run (test_fuzz_struct) covers every
 * single-field mutation of its seeds through the parsers and the index, and through a real
 * engine (restore, then append) every mutation of a count plus a deterministic sample of the
 * others. To fuzz beyond that:
 *
 *   KVT_FUZZ_STRUCT_OUT=/tmp/kvt-seeds build/test_fuzz_struct   # writes its mutated journals
 *   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DKVT_WITH_CUDA=OFF
 *   cmake --build build-fuzz -t fuzz_journal fuzz_format
 *   build-fuzz/fuzz_journal -max_total_time=600 /tmp/kvt-seeds tests/fuzz/corpus_journal
 *   build-fuzz/fuzz_format -max_total_time=600 /tmp/kvt-seeds tests/fuzz/corpus
 *
 * and for more engine cases KVT_FUZZ_ENGINE_CASES=N (default 16; 0 = all, about a minute) with
 * KVT_FUZZ_SEED=S (default 1) picks another deterministic sample.
 */
#ifndef KVT_TESTS_FUZZ_STRUCTGEN_H
#define KVT_TESTS_FUZZ_STRUCTGEN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "tiers/format.h"

/* record header offsets (tiers/format.c: RH_*) and PUT payload offsets from the record start */
enum {
	SG_RH_MAGIC = 0, SG_RH_TYPE = 4, SG_RH_LEN = 8, SG_RH_RSV = 12, SG_RH_SEQ = 16,
	SG_RH_SUM = 24, SG_P = 32,
	SG_P_SESSION = SG_P, SG_P_NTOK = SG_P + 8, SG_P_NBLK = SG_P + 16, SG_P_TENANT = SG_P + 20,
	SG_P_PRIO = SG_P + 24, SG_P_PAD = SG_P + 28, SG_P_BLOCKS = SG_P + 32,
};

/* The fields a mutation can set: in a PUT's block entries and tokens, @elem picks the entry. */
enum sg_field {
	SG_TYPE, SG_LEN, SG_RSV, SG_SEQNO, SG_SESSION, SG_NTOKENS, SG_NBLOCKS, SG_TENANT,
	SG_PRIORITY, SG_PAD, SG_SLOT, SG_TAG, SG_LENC, SG_BRSV, SG_HASH, SG_TOKEN, SG_N_FIELDS,
};

static const char *const sg_field_names[SG_N_FIELDS] = {
	"type", "payload length", "reserved", "seqno", "session", "n_tokens", "n_blocks",
	"tenant", "priority", "padding", "slot", "tag", "length code", "block reserved",
	"hash", "token",
};

/* What the generator knows of the store the journal is for (for the limit values). */
struct sg_ctx {
	uint32_t n_slots;          /* the store's slots */
	uint32_t tokens_per_block; /* the layout's */
};

#define SG_N_VALUES 12u
#define SG_MAX_COUNT 4096u /* counts re-encoded up to this many entries; beyond, patched */

/* Boundary value @v (0..SG_N_VALUES-1) of field @f (@width bytes) of a record with @n_blocks
 * blocks; several of them are the field's limits in this store. */
static inline uint64_t
sg_value(const struct sg_ctx *c, enum sg_field f, unsigned width, uint32_t n_blocks, uint32_t v)
{
	uint64_t all = width == 8 ? UINT64_MAX : (1ull << (8 * width)) - 1;
	uint64_t tpb = c->tokens_per_block, lim0 = 0, lim1 = 0;

	switch (f) {
	case SG_SLOT: lim0 = c->n_slots - 1; lim1 = c->n_slots; break;
	case SG_PRIORITY: lim0 = 100; lim1 = 101; break;
	case SG_NTOKENS: lim0 = n_blocks * tpb; lim1 = n_blocks * tpb + 1; break;
	case SG_NBLOCKS: lim0 = n_blocks ? n_blocks - 1 : 0; lim1 = n_blocks + 1; break;
	case SG_LENC: lim0 = KVT_FMT_LENC_KNOWN | KVT_FMT_LENC_QMAX;
		lim1 = KVT_FMT_LENC_KNOWN | 1u << 12 | 1; break; /* LZ4, 1 page */
	case SG_SEQNO: lim0 = KVT_FMT_MAX_SEQNO; lim1 = KVT_FMT_MAX_SEQNO + 1; break;
	case SG_TYPE: lim0 = KVT_FMT_REC_PUT; lim1 = KVT_FMT_REC_DEL; break;
	case SG_LEN: lim0 = KVT_FMT_MAX_REC; lim1 = KVT_FMT_MAX_REC + 8; break;
	default: lim0 = 2; lim1 = 0x7f; break;
	}
	switch (v) {
	case 0: return 0;
	case 1: return 1;
	case 2: return lim0 & all;
	case 3: return lim1 & all;
	case 4: return all;                      /* max, -1 signed */
	case 5: return (all >> 1) & all;         /* max signed */
	case 6: return (all >> 1) + 1;           /* most negative */
	case 7: return all - 1;                  /* -2 */
	case 8: return width == 8 ? 1ull << 32 : 1ull << (8 * width - 2); /* huge */
	case 9: return width == 8 ? (uint64_t)KVT_FMT_MAX_REC + 1 : 0x10000 & all;
	case 10: return (lim0 + 2) & all;
	default: return (lim1 ? lim1 - 2 : 3) & all;
	}
}

static inline void
sg_put_le(uint8_t *p, uint64_t v, unsigned width)
{
	for (unsigned i = 0; i < width; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* Recompute the checksum of the record at @rec (its header's payload length, if it fits in
 * @avail bytes; else the header alone is sealed, the record stays torn). */
static inline void
sg_reseal(uint8_t *rec, size_t avail)
{
	uint64_t plen = kvt_get_le32(rec + SG_RH_LEN);
	XXH3_state_t *st = XXH3_createState();

	if (!st)
		return;
	if (plen > avail - KVT_FMT_RECHDR_BYTES)
		plen = 0;
	XXH3_64bits_reset(st);
	XXH3_64bits_update(st, rec, SG_RH_SUM);
	XXH3_64bits_update(st, rec + KVT_FMT_RECHDR_BYTES, (size_t)plen);
	kvt_put_le64(rec + SG_RH_SUM, XXH3_64bits_digest(st));
	XXH3_freeState(st);
}

/* Offset (from the start of its image) and size of each record of a journal image: up to @max.
 * Returns how many were found (the valid prefix). */
static inline uint32_t
sg_records(const uint8_t *img, size_t len, size_t *off, size_t *size, uint32_t max)
{
	size_t o = KVT_FMT_JHDR_BYTES, used;
	struct kvt_fmt_rec r;
	uint32_t n = 0;

	while (n < max && o < len && kvt_fmt_rec_decode(img + o, len - o, &r, &used) == 0) {
		off[n] = o;
		size[n++] = used;
		o += used;
	}
	return n;
}

/* Re-encode the PUT at @rec (decoded as @r) into @out with @nb blocks and @nt tokens (the first
 * ones as they were, new block entries continuing the last one's slots, new tokens counting on),
 * the checksum computed by the encoder. Returns its bytes, 0 if it does not fit @cap. */
static inline size_t
sg_reencode(const struct kvt_fmt_rec *r, uint32_t nb, uint64_t nt, uint8_t *out, size_t cap)
{
	size_t bytes = kvt_fmt_put_bytes(nb, nt);
	struct kvt_fmt_blkref *b;
	int32_t *t;

	if (bytes == 0 || bytes > cap || nb > SG_MAX_COUNT || nt > SG_MAX_COUNT)
		return 0;
	b = calloc(nb ? nb : 1, sizeof *b);
	t = calloc(nt ? nt : 1, sizeof *t);
	if (!b || !t) {
		free(b);
		free(t);
		return 0;
	}
	for (uint32_t i = 0; i < nb; i++) {
		if (i < r->n_blocks) {
			kvt_fmt_rec_block(r, i, &b[i]);
		} else if (i > 0) {
			b[i] = b[i - 1];
			b[i].slot++;
		}
	}
	for (uint64_t i = 0; i < nt; i++)
		t[i] = i < r->n_tokens ? kvt_fmt_rec_token(r, i) : (int32_t)i;
	kvt_fmt_put_encode(out, r->seqno, r->session, r->tenant, r->priority, b, nb, t, nt);
	free(b);
	free(t);
	return bytes;
}

/*
 * sg_mutate() - the journal image @in (@len bytes) with field @f of the record at @off (of @size
 * bytes) set to boundary value @v, into @out (@cap bytes); @elem picks the block entry (slot,
 * tag, length code, reserved, hash) or the token: 0 = the first, 1 = the last. The record's
 * checksum is recomputed: a fixed-size field is patched and the record resealed; a PUT's counts
 * (n_tokens, n_blocks) are re-encoded with that many tokens or block entries (so the record
 * stays structurally valid) when they fit, else patched (a record whose length no longer
 * matches). Returns the new image's bytes, or 0 when the field does not exist in that record (a
 * DEL's PUT fields, a PUT without blocks or tokens) or the image does not fit @cap.
 */
static inline size_t
sg_mutate(const struct sg_ctx *c, const uint8_t *in, size_t len, size_t off, size_t size,
	  enum sg_field f, uint32_t v, uint32_t elem, uint8_t *out, size_t cap)
{
	const uint8_t *rec = in + off;
	bool put = kvt_get_le32(rec + SG_RH_TYPE) == KVT_FMT_REC_PUT;
	uint32_t nb = put ? kvt_get_le32(rec + SG_P_NBLK) : 0;
	uint64_t nt = put ? kvt_get_le64(rec + SG_P_NTOK) : 0, val;
	struct kvt_fmt_rec r;
	size_t at, used, bytes;
	unsigned width = 4;

	switch (f) {
	case SG_TYPE: at = SG_RH_TYPE; break;
	case SG_LEN: at = SG_RH_LEN; break;
	case SG_RSV: at = SG_RH_RSV; break;
	case SG_SEQNO: at = SG_RH_SEQ; width = 8; break;
	case SG_SESSION: at = SG_P_SESSION; width = 8; break;
	default:
		if (!put)
			return 0;
		switch (f) {
		case SG_NTOKENS: at = SG_P_NTOK; width = 8; break;
		case SG_NBLOCKS: at = SG_P_NBLK; break;
		case SG_TENANT: at = SG_P_TENANT; break;
		case SG_PRIORITY: at = SG_P_PRIO; break;
		case SG_PAD: at = SG_P_PAD; break;
		case SG_TOKEN:
			if (nt == 0)
				return 0;
			at = SG_P_BLOCKS + (size_t)nb * KVT_FMT_PUT_BLOCK +
			     4 * (size_t)(elem ? nt - 1 : 0);
			break;
		default: /* a block entry's field */
			if (nb == 0)
				return 0;
			at = SG_P_BLOCKS + (size_t)(elem ? nb - 1 : 0) * KVT_FMT_PUT_BLOCK;
			at += f == SG_SLOT ? 0 : f == SG_TAG ? 4 : f == SG_LENC ? 8 :
			      f == SG_BRSV ? 12 : 16;
			width = f == SG_HASH ? 8 : 4;
			break;
		}
	}
	if (at + width > size || (elem && f != SG_TOKEN && f < SG_SLOT))
		return 0; /* (one entry of the fixed fields: elem 1 would repeat elem 0) */
	val = sg_value(c, f, width, nb, v);
	if ((f == SG_NTOKENS || f == SG_NBLOCKS) &&
	    kvt_fmt_rec_decode(rec, len - off, &r, &used) == 0) {
		if (f == SG_NTOKENS)
			nt = val;
		else
			nb = (uint32_t)val;
		bytes = kvt_fmt_put_bytes(nb, nt);
		if (bytes && len - size + bytes <= cap && nb <= SG_MAX_COUNT && nt <= SG_MAX_COUNT) {
			memcpy(out, in, off);
			if (sg_reencode(&r, nb, nt, out + off, bytes) != bytes)
				return 0;
			memcpy(out + off + bytes, rec + size, len - off - size);
			return len - size + bytes;
		}
	}
	if (len > cap)
		return 0;
	memcpy(out, in, len);
	sg_put_le(out + off + at, val, width);
	sg_reseal(out + off, len - off);
	return len;
}

#endif /* KVT_TESTS_FUZZ_STRUCTGEN_H */
