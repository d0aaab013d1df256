/* SPDX-License-Identifier: MIT */
/*
 * tiers/format.h - the on-disk format of the NVMe store (internal): encoders and the parsers
 * that every byte read from disk goes through (also the fuzz target's entry point). The format
 * is documented in docs/FORMAT.md; all integers are little-endian, fixed width.
 *
 * Store file ("kvtier.store", or a private one without a name, see tier_nvme.h):
 *   [0, 4096)                       superblock (kvt_fmt_super)
 *   [4096, 1 MiB)                   zeros (slot 0 starts 1 MiB-aligned)
 *   [1 MiB + s * slot_bytes, +slot_bytes)  slot s: a 4 KiB header page (a 128-byte block
 *                                   header, zeros), then the payload at slot offset 4096
 *                                   (stored_len bytes: raw or encoded), zero padding to 4 KiB;
 *                                   slot_bytes = 4096 + round_up(block_bytes, 4096). The raw
 *                                   payload is 4 KiB aligned on disk so that it can move by
 *                                   O_DIRECT straight from/to the HOST tier's memory.
 * Journal file ("kvtier.journal"): a 64-byte file header, then records (kvt_fmt_rec), each
 *   self-checksummed; replay stops at the first record that does not verify (a torn tail).
 *
 * Threading: pure functions.
 */
#ifndef KVT_TIERS_FORMAT_H
#define KVT_TIERS_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

#define KVT_FMT_VERSION 5u        /* format version of superblock, headers and journal
				     (3: payload in its own 4 KiB pages, derived write keys;
				     4: journal entries name a write by its 32-bit tag and
				     length code, kvt_fmt_lenc; 5: the superblock names the
				     layer groups and the group it stores, issue 16) */
#define KVT_FMT_ALIGN 4096u       /* O_DIRECT alignment of offsets, lengths and buffers */
#define KVT_FMT_SUPER_BYTES 4096u /* superblock area at the start of the store */
#define KVT_FMT_DATA_OFF (1u << 20) /* file offset of slot 0: IOs of 1 MiB-multiple slots are
				       aligned to their size on the device */
#define KVT_FMT_BLKHDR_BYTES 128u /* block header at the start of every slot */
#define KVT_FMT_HDR_PAGE 4096u    /* the header page: the payload starts at this slot offset */
#define KVT_FMT_JHDR_BYTES 64u    /* journal file header */
#define KVT_FMT_RECHDR_BYTES 32u  /* journal record header */
#define KVT_FMT_PUT_FIXED 32u     /* fixed part of a PUT payload */
#define KVT_FMT_PUT_BLOCK 32u     /* one block entry of a PUT payload */
#define KVT_FMT_MAX_REC (64u << 20) /* largest journal record accepted */

/** The superblock: the store's identity and the layout it was made for. */
struct kvt_fmt_super {
	uint32_t version;          /* KVT_FMT_VERSION */
	uint32_t n_layers;         /* layout, as in struct kvt_layout */
	uint32_t n_kv_heads;       /* ... */
	uint32_t head_dim;         /* ... */
	uint32_t dtype;            /* enum kvt_dtype */
	uint32_t tokens_per_block; /* ... */
	uint32_t codec;            /* enum kvt_codec blocks are written with */
	uint64_t block_bytes;      /* raw bytes of one block */
	uint64_t slot_bytes;       /* bytes of one slot, a multiple of 4096 */
	uint64_t n_slots;          /* slots in the file */
	uint64_t data_off;         /* file offset of slot 0 (KVT_FMT_DATA_OFF) */
	uint64_t epoch;            /* bumped at every open; the high bits of write keys */
	uint64_t store_id;         /* random at creation; the journal carries it too */
	uint64_t journal_gen;      /* generation of the journal (its header) whose length ... */
	uint64_t journal_len;      /* ... was last known durable (0 = unknown: older builds) */
	uint64_t groups_fp;        /* fingerprint of the engine's layer groups (0 = a single
	                              layout, no groups): engine/group.c */
	uint32_t group;            /* the group this store holds (0 without groups) */
};

/** A block header, at the start of its slot. */
struct kvt_fmt_blkhdr {
	uint32_t slot;       /* slot it was written to */
	uint32_t index;      /* block index within its session */
	uint64_t key;        /* write key: kvt_fmt_write_key(epoch, slot, sum) */
	uint64_t session;    /* session key (0 = none) */
	uint32_t raw_len;    /* block_bytes */
	uint32_t stored_len; /* payload bytes after the header */
	uint32_t codec;      /* enum kvt_codec of the payload (NONE = raw) */
	uint8_t hash[16];    /* content hash of the block (prefix chain; zero when unknown) */
	uint64_t sum;        /* XXH3-64 of the raw (decoded) block */
};

/** One block of a published session (a PUT record entry). */
struct kvt_fmt_blkref {
	uint32_t slot;       /* slot holding it */
	uint32_t tag;        /* the write's tag: kvt_fmt_write_tag() of the slot's header key */
	uint32_t lenc;       /* the write's length code: kvt_fmt_lenc() of the header's codec and
	                        stored length */
	uint8_t hash[16];    /* content hash (zero when unknown) */
};

enum kvt_fmt_rec_type { KVT_FMT_REC_PUT = 1, KVT_FMT_REC_DEL = 2 };

/** A decoded journal record; pointers point into the parsed buffer. */
struct kvt_fmt_rec {
	uint32_t type;          /* enum kvt_fmt_rec_type */
	uint64_t seqno;         /* journal sequence number */
	uint64_t session;       /* session key */
	uint64_t n_tokens;      /* PUT: tokens */
	uint32_t n_blocks;      /* PUT: blocks */
	uint32_t tenant;        /* PUT: tenant */
	uint32_t priority;      /* PUT: 0..100 */
	const uint8_t *blocks;  /* PUT: n_blocks entries of KVT_FMT_PUT_BLOCK bytes */
	const uint8_t *tokens;  /* PUT: n_tokens little-endian int32 */
};

/**
 * The write key of a block written to @slot in store epoch @epoch with raw checksum @sum:
 * (epoch << 40) | the low 40 bits of XXH3-64 of (slot, sum). Two writes to one slot get the same
 * key only when their contents hash alike (then they are the same bytes for every practical
 * purpose); a key names its epoch, so keys of different opens never collide. Pure.
 */
uint64_t kvt_fmt_write_key(uint64_t epoch, uint32_t slot, uint64_t sum);

/** The tag of a write whose header key is @key: its low 32 bits (of the slot-and-checksum hash,
 * so two writes to one slot share a tag only when their contents hash alike or with odds of
 * 2^-32). What the NVMe tier's slot table and the journal keep of a write. Pure. */
static inline uint32_t
kvt_fmt_write_tag(uint64_t key)
{
	return (uint32_t)key;
}

/* A length code (kvt_fmt_lenc): bit 15 set (0 = unknown), the codec in bits 12-14, and in bits
 * 0-11 q = 1..4095: the payload fits in ceil(q * D / 4095) pages of 4 KiB, D the data pages of a
 * slot (round_up(block_bytes, 4096) / 4096); a raw payload has q = 4095 (all D pages). */
#define KVT_FMT_LENC_KNOWN 0x8000u
#define KVT_FMT_LENC_QMAX 4095u

/**
 * kvt_fmt_lenc() - the length code of a payload of @stored bytes in codec @codec for blocks of
 * @block_bytes (1 <= stored <= block_bytes, codec 0..KVT_CODEC_CSHUF_LZ4): 16 bits that say how
 * many bytes a read must move (kvt_fmt_lenc_bytes), at most D / 4095 + 1 pages more than the
 * payload's own. A function of (codec, stored, block_bytes): the same write always gets the
 * same code, so a code read from disk can be compared with a kept one. Pure.
 */
uint32_t kvt_fmt_lenc(uint32_t codec, uint32_t stored, uint64_t block_bytes);
/** Whether block header @h is the write a slot table or journal names by @tag and @lenc (for
 * blocks of @block_bytes): another write's header there is a lost or misdirected write. Pure. */
static inline bool
kvt_fmt_blkhdr_is(const struct kvt_fmt_blkhdr *h, uint32_t tag, uint32_t lenc,
		  uint64_t block_bytes)
{
	return kvt_fmt_write_tag(h->key) == tag &&
	       kvt_fmt_lenc(h->codec, h->stored_len, block_bytes) == lenc;
}

/** Payload bytes a read of a slot with length code @lenc moves after the header page (a
 * multiple of 4096, at most round_up(block_bytes, 4096)); 0 when @lenc is not valid for
 * @block_bytes (unknown, codec out of range, q 0, or a raw code with q != 4095). Pure. */
uint64_t kvt_fmt_lenc_bytes(uint32_t lenc, uint64_t block_bytes);
/** The codec a valid length code names. Pure. */
static inline uint32_t
kvt_fmt_lenc_codec(uint32_t lenc)
{
	return lenc >> 12 & 7u;
}

/** Bytes of one slot for @block_bytes: KVT_FMT_HDR_PAGE + round_up(block_bytes, 4096). */
uint64_t kvt_fmt_slot_bytes(uint64_t block_bytes);

/** Write @s into @out (KVT_FMT_SUPER_BYTES, zero-filled beyond the fields). */
void kvt_fmt_super_encode(const struct kvt_fmt_super *s, uint8_t *out);
/** Parse a superblock. Returns 0 or KVT_EFORMAT (bad magic, checksum, version, geometry) with a
 * message. @len < KVT_FMT_SUPER_BYTES is refused. */
int kvt_fmt_super_decode(const uint8_t *buf, size_t len, struct kvt_fmt_super *s);
/** Compare a store's superblock with what the engine expects; KVT_EFORMAT naming the first
 * difference ("store was made for 32 layers, engine has 16"), or 0. */
int kvt_fmt_super_match(const struct kvt_fmt_super *have, const struct kvt_fmt_super *want,
			const char *path);

/** Write a block header (KVT_FMT_BLKHDR_BYTES) into @out. */
void kvt_fmt_blkhdr_encode(const struct kvt_fmt_blkhdr *h, uint8_t *out);
/** Parse a block header. Returns 0 or KVT_ECORRUPT with a message naming @slot_hint. */
int kvt_fmt_blkhdr_decode(const uint8_t *buf, size_t len, struct kvt_fmt_blkhdr *h);

/** The format version a journal header names, when its magic and checksum verify (a journal of
 * another version, not a damaged one); 0 otherwise. Pure. */
uint32_t kvt_fmt_jhdr_version(const uint8_t *buf, size_t len);
/** Journal file header for @store_id into @out (KVT_FMT_JHDR_BYTES). */
void kvt_fmt_jhdr_encode(uint64_t store_id, uint8_t *out);
/** The same with the journal's generation @gen (bumped at every compaction; 0 = none). */
void kvt_fmt_jhdr_encode_gen(uint64_t store_id, uint64_t gen, uint8_t *out);
/** The generation of a journal header that kvt_fmt_jhdr_decode() accepted (0 in older ones). */
uint64_t kvt_fmt_jhdr_gen(const uint8_t *buf);
/** Parse a journal header; 0 with *store_id, or KVT_EFORMAT. */
int kvt_fmt_jhdr_decode(const uint8_t *buf, size_t len, uint64_t *store_id);

/** Bytes of a PUT record (header + payload) for @n_blocks and @n_tokens; 0 if too large. */
size_t kvt_fmt_put_bytes(uint32_t n_blocks, uint64_t n_tokens);
/** Encode a PUT record into @out (kvt_fmt_put_bytes bytes). */
void kvt_fmt_put_encode(uint8_t *out, uint64_t seqno, uint64_t session, uint32_t tenant,
			uint32_t priority, const struct kvt_fmt_blkref *blocks, uint32_t n_blocks,
			const int32_t *tokens, uint64_t n_tokens);
/** Bytes of a DEL record. */
size_t kvt_fmt_del_bytes(void);
/** Encode a DEL record into @out. */
void kvt_fmt_del_encode(uint8_t *out, uint64_t seqno, uint64_t session);

/**
 * kvt_fmt_rec_decode() - parse the record at the start of @buf (@len bytes available).
 * Returns 0 with *r and *used (the record's bytes) set; 1 when @buf holds no complete valid
 * record (end of journal, or a torn or corrupt tail: replay stops there); never reads past @len.
 */
int kvt_fmt_rec_decode(const uint8_t *buf, size_t len, struct kvt_fmt_rec *r, size_t *used);
/** What a store's records must fit (kvt_fmt_rec_check): the store's geometry and layout. */
struct kvt_fmt_limits {
	uint32_t n_slots;          /* slots of the store: every block's slot is below */
	uint32_t tokens_per_block; /* of the layout: a PUT of n tokens has ceil(n / tpb) blocks
	                              (0 = not checked: a caller without a layout) */
	uint64_t block_bytes;      /* raw bytes of one block: length codes are valid for it */
	uint32_t codec;            /* enum kvt_codec the store writes: a length code names it or
	                              KVT_CODEC_NONE (a block the codec did not shrink) */
};

/** Highest seqno a record may carry: far beyond any journal's, low enough that seqno + 1 and
 * comparisons never wrap. */
#define KVT_FMT_MAX_SEQNO (1ull << 62)

/**
 * kvt_fmt_rec_check() - the field checks of a record that kvt_fmt_rec_decode() parsed (its
 * checksum verified, its lengths fit the buffer): the store directory is a trust boundary, so
 * every decoded field is range- and consistency-checked before the index or the engine uses it.
 * A record (PUT or DEL) needs 1 <= seqno <= KVT_FMT_MAX_SEQNO. A PUT needs: session key != 0,
 * priority 0..100, n_blocks == ceil(n_tokens / tokens_per_block) (every block holds
 * tokens_per_block tokens, the last one 1..tokens_per_block), n_blocks <= n_slots, and every
 * block entry a slot < n_slots, a length code valid for block_bytes (kvt_fmt_lenc_bytes != 0)
 * whose codec is KVT_CODEC_NONE or @lim->codec, and its reserved bytes zero. Not checked: the
 * tenant (any 32-bit id is one the API accepts), the tags and content hashes (compared with the
 * block headers at restore), the token ids (opaque: any int32, -1 for unknown; only compared),
 * and slots named twice (store_resolve drops those sessions). Returns 0, or KVT_EFORMAT with a
 * message naming the record (seqno, session) and the field. Pure but for the message.
 */
int kvt_fmt_rec_check(const struct kvt_fmt_rec *r, const struct kvt_fmt_limits *lim);
/** Entry @i of a decoded PUT (i < r->n_blocks). */
void kvt_fmt_rec_block(const struct kvt_fmt_rec *r, uint32_t i, struct kvt_fmt_blkref *out);
/** Token @i of a decoded PUT. */
int32_t kvt_fmt_rec_token(const struct kvt_fmt_rec *r, uint64_t i);

/**
 * kvt_fmt_fuzz_one() - the fuzz entry point: runs every parser over @data (superblock, block
 * header, journal header, then a journal replay of the rest, each record through
 * kvt_fmt_rec_check for 64 slots of raw 8192-byte blocks of 16 tokens) and touches every decoded
 * field.
 * Returns the number of records parsed. Never crashes on any input (the property fuzzed).
 */
int kvt_fmt_fuzz_one(const uint8_t *data, size_t len);

/* little-endian helpers */
void kvt_put_le32(uint8_t *p, uint32_t v);
void kvt_put_le64(uint8_t *p, uint64_t v);
uint32_t kvt_get_le32(const uint8_t *p);
uint64_t kvt_get_le64(const uint8_t *p);

#endif /* KVT_TIERS_FORMAT_H */
