/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/mkseeds.c - writes the fuzz corpora's valid seeds (the *.ok files: a superblock, a
 * block header, journals) with the format's own encoders, so that a format change re-makes them
 * instead of leaving seeds that no longer parse (the corpus replay tests fail on those):
 *
 *   cmake --build build --target fuzz_mkseeds && ./build/fuzz_mkseeds tests/fuzz
 *
 * Writes <dir>/corpus/{superblock,blockheader,journal}.ok and <dir>/corpus_journal/journal{0,1,
 * 2}.ok. Exit status 0, or 1 with a message when a file cannot be written.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tiers/format.h"

#define SEED_STORE_ID 0x77u
#define SEED_BLOCK 8192u

static int
seed_write(const char *dir, const char *name, const uint8_t *p, size_t n)
{
	char path[4096];
	FILE *f;
	int ok;

	snprintf(path, sizeof path, "%s/%s", dir, name);
	f = fopen(path, "wb");
	if (!f) {
		perror(path);
		return 1;
	}
	ok = fwrite(p, 1, n, f) == n;
	ok &= fclose(f) == 0;
	if (!ok)
		fprintf(stderr, "%s: write failed\n", path);
	return !ok;
}

/* A journal image: the header, then PUT (n_blocks > 0) and DEL (n_blocks 0) records. */
struct seed_op {
	uint64_t session;  /* session key */
	uint32_t n_blocks; /* 0 = DEL */
	uint32_t slot0;    /* first slot; the blocks take slot0, slot0 + 1, ... */
};

static size_t
seed_journal(uint8_t *out, const struct seed_op *ops, int n_ops)
{
	static const int32_t tokens[64] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 };
	struct kvt_fmt_blkref refs[4];
	size_t off = KVT_FMT_JHDR_BYTES;

	kvt_fmt_jhdr_encode(SEED_STORE_ID, out);
	for (int i = 0; i < n_ops; i++) {
		if (ops[i].n_blocks == 0) {
			kvt_fmt_del_encode(out + off, (uint64_t)i + 1, ops[i].session);
			off += kvt_fmt_del_bytes();
			continue;
		}
		memset(refs, 0, sizeof refs);
		for (uint32_t b = 0; b < ops[i].n_blocks; b++) {
			refs[b].slot = ops[i].slot0 + b;
			refs[b].tag = 0x1000u * (uint32_t)ops[i].session + b;
			refs[b].lenc = kvt_fmt_lenc(KVT_CODEC_NONE, SEED_BLOCK, SEED_BLOCK);
			refs[b].hash[0] = (uint8_t)(b + 1);
		}
		kvt_fmt_put_encode(out + off, (uint64_t)i + 1, ops[i].session, 0, 50, refs,
				   ops[i].n_blocks, tokens, 16ull * ops[i].n_blocks);
		off += kvt_fmt_put_bytes(ops[i].n_blocks, 16ull * ops[i].n_blocks);
	}
	return off;
}

int
main(int argc, char **argv)
{
	static uint8_t buf[KVT_FMT_SUPER_BYTES > 8192 ? KVT_FMT_SUPER_BYTES : 8192];
	static const struct seed_op j[] = {
		{ 5, 2, 0 }, { 9, 0, 0 }, { 6, 1, 2 },           /* corpus/journal.ok */
		{ 1, 2, 0 },                                      /* journal0 */
		{ 1, 2, 0 }, { 2, 2, 2 }, { 1, 0, 0 },           /* journal1 */
		{ 1, 2, 0 }, { 1, 2, 2 }, { 3, 1, 2 }, { 4, 1, 70 }, /* journal2: a replaced
								     session, a slot claimed twice, one out of range */
	};
	struct kvt_fmt_super s = {
		.version = KVT_FMT_VERSION, .n_layers = 2, .n_kv_heads = 2, .head_dim = 64,
		.dtype = KVT_DTYPE_F16, .tokens_per_block = 16, .codec = KVT_CODEC_NONE,
		.block_bytes = SEED_BLOCK, .slot_bytes = 0, .n_slots = 64,
		.data_off = KVT_FMT_DATA_OFF, .epoch = 3, .store_id = SEED_STORE_ID,
	};
	struct kvt_fmt_blkhdr h = {
		.slot = 3, .index = 1, .session = 5, .raw_len = SEED_BLOCK,
		.stored_len = SEED_BLOCK, .codec = KVT_CODEC_NONE, .sum = 0x1234567890abcdefull,
	};
	char sub[4096];
	int rc = 0;

	if (argc != 2) {
		fprintf(stderr, "usage: %s <tests/fuzz directory>\n", argv[0]);
		return 2;
	}
	s.slot_bytes = kvt_fmt_slot_bytes(SEED_BLOCK);
	kvt_fmt_super_encode(&s, buf);
	snprintf(sub, sizeof sub, "%s/corpus", argv[1]);
	rc |= seed_write(sub, "superblock.ok", buf, KVT_FMT_SUPER_BYTES);
	h.key = kvt_fmt_write_key(3, h.slot, h.sum);
	memset(h.hash, 0x5a, sizeof h.hash);
	kvt_fmt_blkhdr_encode(&h, buf);
	rc |= seed_write(sub, "blockheader.ok", buf, KVT_FMT_BLKHDR_BYTES);
	rc |= seed_write(sub, "journal.ok", buf, seed_journal(buf, j, 3));
	snprintf(sub, sizeof sub, "%s/corpus_journal", argv[1]);
	rc |= seed_write(sub, "journal0.ok", buf, seed_journal(buf, j + 3, 1));
	rc |= seed_write(sub, "journal1.ok", buf, seed_journal(buf, j + 4, 3));
	rc |= seed_write(sub, "journal2.ok", buf, seed_journal(buf, j + 7, 4));
	return rc;
}
