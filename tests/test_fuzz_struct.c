/* SPDX-License-Identifier: MIT */
/*
 * tests/test_fuzz_struct.c - structure-aware fuzzing of the persistent store's journal
 * (tests/fuzz/structgen.h): valid journals, one field of one record set to a boundary value and
 * the record's checksum recomputed, replayed through
 *   - the parsers and the field checks (kvt_fmt_fuzz_one) and the index (kvt_store_fuzz_one,
 *     which fails when a session that breaks replay's promises survives): every mutation;
 *   - a real engine (kvt_engine_create on the store, kvt_session_list, kvt_seq_restore of every
 *     listed session, an append after it, the engine's invariants, the data of what restored):
 *     every mutation of a count (n_tokens, n_blocks) and a deterministic sample of the others
 *     (KVT_FUZZ_ENGINE_CASES, KVT_FUZZ_SEED).
 * Deterministic and bounded (a few seconds); the ASan build runs it like any test. See
 * structgen.h for running the libFuzzer targets longer from its images (KVT_FUZZ_STRUCT_OUT).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz/structgen.h"
#include "support/kvt_test.h"
#include "tiers/store.h"

#define FS_MAX_RECS 16u
#define FS_SLOT_BYTES 8192u /* tests/test_store.c: a header page + the 1024-byte test block */
#define FS_SLOTS 64u

/* ---- the parsers and the index: every single-field mutation -------------------------------- */

/* A journal for kvt_store_fuzz_one's store (64 slots, 16 tokens per block, raw 8192-byte
 * blocks): PUTs (n_blocks > 0) and DELs (0). */
struct fs_op {
	uint64_t session;
	uint32_t n_blocks;
	uint32_t slot0;
	uint32_t n_tokens; /* 0 = full blocks */
};

static size_t
fs_journal(uint8_t *out, const struct fs_op *ops, int n)
{
	struct kvt_fmt_blkref refs[4];
	int32_t tokens[64];
	size_t off = KVT_FMT_JHDR_BYTES;

	for (int i = 0; i < 64; i++)
		tokens[i] = i * 7 - 1;
	kvt_fmt_jhdr_encode(0x77, out);
	for (int i = 0; i < n; i++) {
		uint64_t nt = ops[i].n_tokens ? ops[i].n_tokens : 16ull * ops[i].n_blocks;

		if (!ops[i].n_blocks) {
			kvt_fmt_del_encode(out + off, (uint64_t)i + 1, ops[i].session);
			off += kvt_fmt_del_bytes();
			continue;
		}
		memset(refs, 0, sizeof refs);
		for (uint32_t b = 0; b < ops[i].n_blocks; b++) {
			refs[b].slot = ops[i].slot0 + b;
			refs[b].tag = 0x100u * (uint32_t)ops[i].session + b;
			refs[b].lenc = kvt_fmt_lenc(KVT_CODEC_NONE, 8192, 8192);
			refs[b].hash[3] = (uint8_t)(b + 1);
		}
		kvt_fmt_put_encode(out + off, (uint64_t)i + 1, ops[i].session, 3, 50, refs,
				   ops[i].n_blocks, tokens, nt);
		off += kvt_fmt_put_bytes(ops[i].n_blocks, nt);
	}
	return off;
}

static const char *fs_out; /* KVT_FUZZ_STRUCT_OUT: where to write the mutated images */
static int fs_seed_left;   /* sessions the unmutated seed keeps */

static void
fs_dump(const uint8_t *img, size_t len, unsigned long id)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof path, "%s/struct-%06lu", fs_out, id);
	f = fopen(path, "wb");
	if (f) {
		fwrite(img, 1, len, f);
		fclose(f);
	}
}

/*
 * The test's own oracle of what replay must refuse (written from docs/FORMAT.md, not from
 * kvt_fmt_rec_check): whether the PUT at @at of image @img (the mutated record; it was the
 * session @orig) breaks a rule of the format for kvt_store_fuzz_one's store (64 slots, 16 tokens
 * per block, raw 8192-byte blocks) and yet, with no later record of its key, @left sessions,
 * as many as the unmutated seed keeps, survived: then the bad one is among them.
 */
static bool
fs_bad_survives(const uint8_t *img, size_t len, size_t at, uint64_t orig, int left)
{
	size_t off = at, used;
	struct kvt_fmt_blkref b;
	struct kvt_fmt_rec r, later;
	bool bad;

	if (kvt_fmt_rec_decode(img + at, len - at, &r, &used) != 0 || r.type != KVT_FMT_REC_PUT)
		return false;
	bad = r.session == 0 || r.seqno == 0 || r.seqno > (1ull << 62) || r.priority > 100 ||
	      r.n_blocks != (r.n_tokens + 15) / 16;
	for (uint32_t i = 0; i < r.n_blocks && i < 64; i++) {
		kvt_fmt_rec_block(&r, i, &b);
		if (b.slot == 0xffffffffu) { /* a hole (docs/FORMAT.md): tag, length code 0 */
			bad |= b.tag || b.lenc ||
			       kvt_get_le32(r.blocks + (size_t)i * KVT_FMT_PUT_BLOCK + 12) != 0;
			continue;
		}
		bad |= b.slot >= 64 || b.lenc != (KVT_FMT_LENC_KNOWN | KVT_FMT_LENC_QMAX) ||
		       kvt_get_le32(r.blocks + (size_t)i * KVT_FMT_PUT_BLOCK + 12) != 0;
	}
	for (off += used; bad && off < len &&
	     kvt_fmt_rec_decode(img + off, len - off, &later, &used) == 0; off += used)
		if (later.session == r.session || later.session == orig)
			return false; /* replaced or deleted anyway */
	return bad && left >= fs_seed_left;
}

static void
test_parsers_and_index(void **state)
{
	static const struct fs_op seeds[][4] = {
		{ { 5, 2, 0, 0 }, { 9, 0, 0, 0 }, { 6, 1, 2, 5 }, { 7, 3, 10, 33 } },
		{ { 1, 2, 0, 17 }, { 2, 2, 2, 0 }, { 1, 0, 0, 0 }, { 3, 1, 63, 1 } },
	};
	const struct sg_ctx c = { .n_slots = 64, .tokens_per_block = 16 };
	static uint8_t img[4096], buf[1 << 20];
	uint8_t *mut;
	size_t off[FS_MAX_RECS], size[FS_MAX_RECS], len;
	unsigned long runs = 0, refused = 0;
	uint32_t n;

	(void)state;
	fs_out = getenv("KVT_FUZZ_STRUCT_OUT");
	for (size_t sd = 0; sd < sizeof seeds / sizeof seeds[0]; sd++) {
		len = fs_journal(img, seeds[sd], 4);
		n = sg_records(img, len, off, size, FS_MAX_RECS);
		assert_int_equal(n, 4);
		fs_seed_left = sd == 0 ? 3 : 2;
		assert_int_equal(kvt_store_fuzz_one(img, len), fs_seed_left);
		for (uint32_t r = 0; r < n; r++)
			for (int f = 0; f < SG_N_FIELDS; f++)
				for (uint32_t v = 0; v < SG_N_VALUES; v++)
					for (uint32_t el = 0; el < 2; el++) {
						size_t ml = sg_mutate(&c, img, len, off[r], size[r],
								      (enum sg_field)f, v, el, buf,
								      sizeof buf);
						bool bad;
						int left;

						if (!ml)
							continue;
						/* exactly the image: ASan sees a read past it */
						mut = malloc(ml);
						assert_non_null(mut);
						memcpy(mut, buf, ml);
						(void)kvt_fmt_fuzz_one(mut, ml);
						left = kvt_store_fuzz_one(mut, ml);
						bad = fs_bad_survives(mut, ml, off[r],
								      seeds[sd][r].session, left);
						if (left < 0 || bad)
							print_error("seed %zu record %u: %s = value "
								    "%u (entry %u): %d sessions\n",
								    sd, r, sg_field_names[f], v,
								    el, left);
						assert_true(left >= 0);
						assert_false(bad);
						refused += left < (sd == 0 ? 3 : 2);
						if (fs_out)
							fs_dump(mut, ml, runs);
						free(mut);
						runs++;
					}
	}
	print_message("%lu mutated journals, %lu lost a session\n", runs, refused);
	assert_true(runs > 500 && refused > 0);
}

/* ---- a real engine: a sample of them, restored and appended to ----------------------------- */

struct fs_file {
	uint8_t *data;
	size_t len;
};

static void
fs_read(const char *dir, const char *name, struct fs_file *f)
{
	char path[600];
	struct stat sb;
	int fd;

	snprintf(path, sizeof path, "%s/%s", dir, name);
	fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(fstat(fd, &sb), 0);
	f->len = (size_t)sb.st_size;
	f->data = malloc(f->len ? f->len : 1);
	assert_non_null(f->data);
	assert_int_equal(pread(fd, f->data, f->len, 0), (ssize_t)f->len);
	close(fd);
}

static void
fs_write(const char *dir, const char *name, const uint8_t *p, size_t n)
{
	char path[600];
	int fd;

	snprintf(path, sizeof path, "%s/%s", dir, name);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, p, n, 0), (ssize_t)n);
	close(fd);
}

static struct kvt_engine *
fs_engine(const char *dir)
{
	struct kvt_engine_opts o;
	struct kvt_engine *e = NULL;
	int rc;

	tsup_store_opts(&o, dir, (uint64_t)FS_SLOTS * FS_SLOT_BYTES);
	rc = kvt_engine_create(&o, &e);
	if (rc)
		print_error("create: %s\n", kvt_last_error_message());
	assert_int_equal(rc, 0);
	return e;
}

/* sessions of the engine store: key, tag of their data, tokens */
static const struct {
	uint64_t key;
	uint32_t tag, n;
} fs_sess[] = { { 0x11, 3, 12 }, { 0x22, 4, 9 }, { 0x33, 5, 1 }, { 0x44, 6, 8 } };

static void
fs_park(struct kvt_engine *e, uint64_t key, uint32_t tag, uint32_t n)
{
	kvt_seq_id s = tsup_session_written(e, key, tag, n);

	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
}

/* Restore every session the engine lists, append to it, check the engine and the data. */
static uint32_t
fs_restore_all(struct kvt_engine *e)
{
	uint64_t keys[16];
	int n = kvt_session_list(e, keys, 16);
	uint32_t restored = 0;

	assert_true(n >= 0 && n <= 4);
	for (int i = 0; i < n; i++) {
		struct kvt_seq_info info;
		kvt_seq_id s = 0;
		uint32_t k;
		bool exact;
		int rc;

		for (k = 0; k < 4 && fs_sess[k].key != keys[i]; k++)
			;
		rc = kvt_seq_restore(e, keys[i], NULL, &s);
		if (k == 4) {
			/* a key the journal never had: listed (the headers are checked at
			 * restore), never restored, since no block header names it */
			assert_int_equal(rc, -ENOENT);
			continue;
		}
		if (rc != 0)
			continue;
		assert_int_equal(kvt_seq_info(e, s, &info), 0);
		assert_int_equal(kvt_seq_resume(e, s), 0);
		/* a token count its blocks can hold is no detectable damage (the headers do not
		 * record it): then only the engine's invariants and the append are checked */
		exact = info.n_tokens == fs_sess[k].n;
		assert_true(info.n_tokens <= (fs_sess[k].n + TSUP_TPB - 1) / TSUP_TPB * TSUP_TPB);
		if (exact)
			assert_int_equal(tsup_verify(e, s, fs_sess[k].tag), 0);
		assert_int_equal(tsup_append_write(e, s, fs_sess[k].tag, info.n_tokens,
						   TSUP_TPB + 1), 0);
		if (exact)
			assert_int_equal(tsup_verify(e, s, fs_sess[k].tag), 0);
		restored++;
	}
	tsup_check_engine(e);
	return restored;
}

static uint64_t
fs_rand(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

static void
test_engine_restore_append(void **state)
{
	const struct sg_ctx c = { .n_slots = FS_SLOTS, .tokens_per_block = TSUP_TPB };
	const char *ev = getenv("KVT_FUZZ_ENGINE_CASES"), *sv = getenv("KVT_FUZZ_SEED");
	uint32_t want = ev ? (uint32_t)strtoul(ev, NULL, 0) : 16, n, done = 0, lost = 0, n_counts;
	uint64_t x = sv ? strtoull(sv, NULL, 0) : 1, total;
	size_t off[FS_MAX_RECS], size[FS_MAX_RECS], ml, mcap;
	struct fs_file jr, sf;
	char *dir = tsup_mkdtemp();
	struct kvt_engine *e;
	uint8_t *mut;

	(void)state;
	if (x == 0)
		x = 1;
	e = fs_engine(dir);
	for (uint32_t k = 0; k < 4; k++)
		fs_park(e, fs_sess[k].key, fs_sess[k].tag, fs_sess[k].n);
	kvt_engine_destroy(e);
	e = fs_engine(dir);
	assert_int_equal(kvt_session_drop(e, 0x44), 0); /* a DEL record after the PUTs */
	kvt_engine_destroy(e);
	fs_read(dir, "kvtier.journal", &jr);
	fs_read(dir, "kvtier.store", &sf);
	n = sg_records(jr.data, jr.len, off, size, FS_MAX_RECS);
	assert_int_equal(n, 5);
	mcap = jr.len + (1u << 20);
	mut = malloc(mcap);
	assert_non_null(mut);
	/* the unmutated journal restores all three */
	e = fs_engine(dir);
	assert_int_equal(fs_restore_all(e), 3);
	kvt_engine_destroy(e);
	/* every count mutation (n_tokens, n_blocks: what reached seq.c), then a sample of all,
	 * or all of them (KVT_FUZZ_ENGINE_CASES=0) */
	n_counts = n * 2 * SG_N_VALUES;
	total = (uint64_t)n * SG_N_FIELDS * SG_N_VALUES * 2;
	for (uint64_t i = 0; want == 0 ? i < total : i < n_counts || done < n_counts + want; i++) {
		uint64_t id = want == 0 ? i : i < n_counts ? 0 : fs_rand(&x) % total;
		uint32_t r, f, v, el;

		if (want && i < n_counts) {
			r = (uint32_t)(i % n);
			f = i / n % 2 ? SG_NBLOCKS : SG_NTOKENS;
			v = (uint32_t)(i / n / 2);
			el = 0;
		} else {
			r = (uint32_t)(id % n);
			f = (uint32_t)(id / n % SG_N_FIELDS);
			v = (uint32_t)(id / n / SG_N_FIELDS % SG_N_VALUES);
			el = (uint32_t)(id / n / SG_N_FIELDS / SG_N_VALUES);
		}
		ml = sg_mutate(&c, jr.data, jr.len, off[r], size[r], (enum sg_field)f, v, el, mut,
			       mcap);
		if (!ml) {
			if (want && i < n_counts)
				done++; /* (a DEL has no counts) */
			continue;
		}
		fs_write(dir, "kvtier.store", sf.data, sf.len);
		fs_write(dir, "kvtier.journal", mut, ml);
		e = fs_engine(dir);
		lost += 3 - fs_restore_all(e);
		kvt_engine_destroy(e);
		done++;
	}
	print_message("%u mutated journals through an engine, %u sessions did not restore\n", done,
		      lost);
	assert_true(done > 0 && lost > 0);
	free(mut);
	free(jr.data);
	free(sf.data);
	tsup_rmdir(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parsers_and_index),
		cmocka_unit_test(test_engine_restore_append),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
