/* SPDX-License-Identifier: MIT */
/*
 * tests/test_journal.c - replay of the persistent store's journal (tiers/store.c) from files
 * damaged the ways a crash or a bad disk damages them: two records claiming one slot, a real
 * PUT cut short, a record corrupted in the middle of the log.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "tiers/base/error.h"
#include "support/kvt_test.h"
#include "tiers/format.h"
#include "tiers/store.h"

#define J_ID 0x1234u  /* store id */
#define J_SLOTS 16u   /* slots of the store */

/* what the records must fit: 16 slots, 4 tokens per block (j_put's sessions fill theirs), raw
 * or LZ4 payloads (a store of codec LZ4 also holds raw blocks: those the codec did not shrink) */
static const struct kvt_fmt_limits j_lim = {
	.n_slots = J_SLOTS, .tokens_per_block = 4, .block_bytes = 1024, .codec = KVT_CODEC_LZ4,
};

static const int32_t j_tokens[8] = { 11, 12, 13, 14, 15, 16, 17, 18 };

/* Put session @key with blocks in @slots (n <= 2 of them) and 4 tokens per block. */
static void
j_put(struct kvt_store *st, uint64_t key, const uint32_t *slots, uint32_t n)
{
	struct kvt_fmt_blkref b[4];

	memset(b, 0, sizeof b);
	for (uint32_t i = 0; i < n; i++) {
		b[i].slot = slots[i];
		b[i].tag = (uint32_t)(key * 100 + i);
		b[i].lenc = kvt_fmt_lenc(KVT_CODEC_NONE, 1024, 1024);
	}
	assert_int_equal(kvt_store_put(st, key, 0, 50, j_tokens, 4ull * n, b, n, UINT32_MAX), 0);
}

static struct kvt_store *
j_open(const char *dir)
{
	struct kvt_store *st = NULL;
	int rc = kvt_store_open(dir, J_ID, &j_lim, false, &st);

	if (rc)
		print_error("store open: %s\n", kvt_last_error_message());
	assert_int_equal(rc, 0);
	return st;
}

/* Three sessions: 1 (slots 0, 1), 2 (slots 2, 3), 3 (slots 4, 5); closed. */
static char *
j_three(void)
{
	static const uint32_t s1[] = { 0, 1 }, s2[] = { 2, 3 }, s3[] = { 4, 5 };
	char *dir = tsup_mkdtemp();
	struct kvt_store *st = j_open(dir);

	j_put(st, 1, s1, 2);
	j_put(st, 2, s2, 2);
	j_put(st, 3, s3, 2);
	assert_int_equal(kvt_store_commit(st), 0);
	kvt_store_close(st);
	return dir;
}

static void
j_path(const char *dir, char *path, size_t n)
{
	snprintf(path, n, "%s/kvtier.journal", dir);
}

/* Offset of the i-th record (0-based) of j_three's journal, all of one size. */
static size_t
j_rec_off(uint32_t i)
{
	return KVT_FMT_JHDR_BYTES + i * kvt_fmt_put_bytes(2, 8);
}

static void
test_two_records_claim_one_slot(void **state)
{
	static const uint32_t a[] = { 7, 8 }, b[] = { 8, 9 }, c[] = { 10 }, d[] = { 11, 11 };
	char *dir = tsup_mkdtemp();
	struct kvt_store *st = j_open(dir);
	struct kvt_store_sess *s;

	(void)state;
	j_put(st, 1, a, 2);
	j_put(st, 2, b, 2); /* written later over slot 8: session 1 lost its block 1 */
	j_put(st, 3, c, 1);
	j_put(st, 4, d, 2); /* names one slot twice: never written so, dropped at replay */
	assert_int_equal(kvt_store_commit(st), 0);
	kvt_store_close(st);
	st = j_open(dir);
	assert_null(kvt_store_find(st, 1)); /* dropped whole */
	s = kvt_store_find(st, 2);
	assert_non_null(s);
	assert_int_equal(s->n_blocks, 2);
	assert_int_equal(s->blocks[0].slot, 8);
	assert_non_null(kvt_store_find(st, 3));
	assert_null(kvt_store_find(st, 4));
	assert_int_equal(kvt_store_count(st), 2);
	kvt_store_close(st);
	tsup_rmdir(dir);
}

/* Put session @key with the block references @b (n of them) and 4 tokens per block. */
static void
j_put_refs(struct kvt_store *st, uint64_t key, const struct kvt_fmt_blkref *b, uint32_t n)
{
	assert_int_equal(kvt_store_put(st, key, 0, 50, j_tokens, 4 * n, b, n, UINT32_MAX), 0);
}

/* A record naming one slot twice (no kvtier write does: forged or damaged, with a valid
 * checksum) drops its session and is reported with the other bad fields (kvt_store_invalid),
 * never silently; a session another write superseded is no damage and is not counted. */
static void
test_slot_twice_reported(void **state)
{
	struct kvt_fmt_blkref a[2];
	char *dir = tsup_mkdtemp();
	struct kvt_store *st = j_open(dir);
	uint32_t lenc = kvt_fmt_lenc(KVT_CODEC_NONE, 1024, 1024);
	const char *why = NULL;

	(void)state;
	a[0] = (struct kvt_fmt_blkref){ .slot = 6, .tag = 0x66, .lenc = lenc };
	a[1] = a[0]; /* the same slot and write, twice in one session */
	j_put_refs(st, 1, a, 2);
	a[1] = (struct kvt_fmt_blkref){ .slot = 7, .tag = 0x77, .lenc = lenc };
	j_put_refs(st, 2, a, 2); /* a good one */
	assert_int_equal(kvt_store_commit(st), 0);
	kvt_store_close(st);
	st = j_open(dir);
	assert_int_equal(kvt_store_count(st), 1);
	assert_null(kvt_store_find(st, 1));
	assert_non_null(kvt_store_find(st, 2));
	assert_int_equal(kvt_store_invalid(st, &why), 1);
	assert_non_null(strstr(why, "names slot 6 twice"));
	kvt_store_close(st);
	tsup_rmdir(dir);
}

/* Sessions naming the same write of a slot share a prefix block (hardening 1): all kept. A
 * later session naming another write there supersedes every earlier one that names it. */
static void
test_shared_slot_same_write(void **state)
{
	struct kvt_fmt_blkref a[2], b[2], c[1];
	char *dir = tsup_mkdtemp();
	struct kvt_store *st = j_open(dir);
	uint32_t lenc = kvt_fmt_lenc(KVT_CODEC_NONE, 1024, 1024);

	(void)state;
	memset(a, 0, sizeof a);
	a[0] = (struct kvt_fmt_blkref){ .slot = 3, .tag = 0x33, .lenc = lenc };
	a[1] = (struct kvt_fmt_blkref){ .slot = 4, .tag = 0x44, .lenc = lenc };
	b[0] = a[0]; /* shares block 0 of session 1 */
	b[1] = (struct kvt_fmt_blkref){ .slot = 5, .tag = 0x55, .lenc = lenc };
	j_put_refs(st, 1, a, 2);
	j_put_refs(st, 2, b, 2);
	j_put_refs(st, 3, b, 2); /* a third sharer, also of slot 5 */
	assert_int_equal(kvt_store_commit(st), 0);
	kvt_store_close(st);
	st = j_open(dir);
	assert_int_equal(kvt_store_count(st), 3);
	assert_non_null(kvt_store_find(st, 1));
	assert_non_null(kvt_store_find(st, 2));
	assert_non_null(kvt_store_find(st, 3));
	/* slot 3 rewritten by session 4 (another tag): 1, 2 and 3 lost their block 0 */
	c[0] = (struct kvt_fmt_blkref){ .slot = 3, .tag = 0x99, .lenc = lenc };
	j_put_refs(st, 4, c, 1);
	/* the same tag with another length code is another write too */
	c[0] = (struct kvt_fmt_blkref){ .slot = 4, .tag = 0x44,
					.lenc = kvt_fmt_lenc(KVT_CODEC_LZ4, 512, 1024) };
	j_put_refs(st, 5, c, 1);
	assert_int_equal(kvt_store_commit(st), 0);
	kvt_store_close(st);
	st = j_open(dir);
	assert_int_equal(kvt_store_count(st), 2);
	assert_non_null(kvt_store_find(st, 4));
	assert_non_null(kvt_store_find(st, 5));
	kvt_store_close(st);
	tsup_rmdir(dir);
}

static void
test_truncated_put(void **state)
{
	char *dir = j_three(), path[600];
	struct kvt_store *st;
	static const uint32_t s4[] = { 6 };

	(void)state;
	j_path(dir, path, sizeof path);
	/* the last PUT cut short, 8 bytes before its end (a torn append) */
	assert_int_equal(truncate(path, (off_t)(j_rec_off(3) - 8)), 0);
	st = j_open(dir);
	assert_non_null(kvt_store_find(st, 1));
	assert_non_null(kvt_store_find(st, 2));
	assert_null(kvt_store_find(st, 3));
	assert_int_equal(kvt_store_damaged(st, NULL, NULL), 0); /* a torn tail is no damage */
	/* the torn tail is gone: what is appended now replays */
	j_put(st, 4, s4, 1);
	assert_int_equal(kvt_store_commit(st), 0);
	kvt_store_close(st);
	st = j_open(dir);
	assert_int_equal(kvt_store_count(st), 3);
	assert_non_null(kvt_store_find(st, 4));
	kvt_store_close(st);
	tsup_rmdir(dir);
}

static void
test_corrupt_record_mid_journal(void **state)
{
	char *dir = j_three(), path[600];
	struct kvt_store *st;
	uint8_t byte;
	off_t at;
	int fd;

	(void)state;
	j_path(dir, path, sizeof path);
	/* flip a bit in the first token of session 2's record: every field still parses, only
	 * the record checksum can tell */
	at = (off_t)(j_rec_off(1) + KVT_FMT_RECHDR_BYTES + KVT_FMT_PUT_FIXED +
		     2 * KVT_FMT_PUT_BLOCK);
	fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &byte, 1, at), 1);
	assert_int_equal(byte, 11); /* j_tokens[0] */
	byte ^= 0x04;
	assert_int_equal(pwrite(fd, &byte, 1, at), 1);
	close(fd);
	st = j_open(dir);
	/* the log ends at the first record that does not verify; a valid one after it says it
	 * is damage, not a torn tail: reported, and the journal as it was is kept aside */
	assert_non_null(kvt_store_find(st, 1));
	assert_null(kvt_store_find(st, 2));
	assert_null(kvt_store_find(st, 3));
	assert_int_equal(kvt_store_count(st), 1);
	{
		uint32_t dropped = 0;
		uint64_t orphan = 1;
		char kept[640];
		struct stat sb;

		assert_int_equal(kvt_store_damaged(st, &dropped, &orphan), j_rec_off(1));
		assert_int_equal(dropped, 1); /* session 3's record */
		assert_int_equal(orphan, 0);
		snprintf(kept, sizeof kept, "%s.damaged", path);
		assert_int_equal(stat(kept, &sb), 0);
		assert_int_equal(sb.st_size, (off_t)j_rec_off(3)); /* all three records */
	}
	kvt_store_close(st);
	tsup_rmdir(dir);
}

/* Without hard links (vfat, some FUSE mounts) the damaged journal is copied, whole, before
 * compaction replaces it. */
static void
test_damaged_journal_copied_without_links(void **state)
{
	char *dir = j_three(), path[600], kept[640];
	uint8_t byte, *orig, *copy;
	struct kvt_store *st;
	struct stat sb;
	size_t n;
	int fd;

	(void)state;
	j_path(dir, path, sizeof path);
	fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &byte, 1, (off_t)j_rec_off(1) + 40), 1);
	byte ^= 0x10;
	assert_int_equal(pwrite(fd, &byte, 1, (off_t)j_rec_off(1) + 40), 1);
	n = j_rec_off(3);
	orig = malloc(n);
	copy = malloc(n);
	assert_true(orig && copy);
	assert_int_equal(pread(fd, orig, n, 0), (ssize_t)n);
	close(fd);
	kvt_test_store_no_link = true;
	st = j_open(dir);
	kvt_test_store_no_link = false;
	assert_int_equal(kvt_store_count(st), 1);
	assert_int_equal(kvt_store_damaged(st, NULL, NULL), j_rec_off(1));
	snprintf(kept, sizeof kept, "%s.damaged", path);
	assert_int_equal(stat(kept, &sb), 0);
	assert_int_equal(sb.st_size, (off_t)n);
	assert_int_equal(sb.st_nlink, 1); /* a copy, not a link */
	fd = open(kept, O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, copy, n, 0), (ssize_t)n);
	close(fd);
	assert_memory_equal(copy, orig, n);
	free(orig);
	free(copy);
	kvt_store_close(st);
	tsup_rmdir(dir);
}

/* Rewrite the journal header of @path with format version @ver and store id @id, sealed. */
static void
j_rewrite_header(const char *path, uint32_t ver, uint64_t id)
{
	uint8_t h[KVT_FMT_JHDR_BYTES];
	int fd = open(path, O_RDWR);

	assert_true(fd >= 0);
	kvt_fmt_jhdr_encode(id, h);
	kvt_put_le32(h + 8, ver);
	kvt_put_le64(h + 56, XXH3_64bits(h, 56));
	assert_int_equal(pwrite(fd, h, sizeof h, 0), (ssize_t)sizeof h);
	close(fd);
}

/* A journal of another format version is refused, and left as it was. */
static void
test_other_version_refused(void **state)
{
	char *dir = j_three(), path[600];
	struct kvt_store *st = NULL;
	struct stat before, after;

	(void)state;
	j_path(dir, path, sizeof path);
	j_rewrite_header(path, KVT_FMT_VERSION - 1, J_ID);
	assert_int_equal(stat(path, &before), 0);
	assert_int_equal(kvt_store_open(dir, J_ID, &j_lim, false, &st), KVT_EFORMAT);
	assert_null(st);
	assert_non_null(strstr(kvt_last_error_message(), "format version"));
	assert_int_equal(stat(path, &after), 0);
	assert_int_equal(after.st_size, before.st_size);
	assert_int_equal(after.st_ino, before.st_ino);
	tsup_rmdir(dir);
}

/* A damaged header: nothing replays, the journal is kept aside and reported; another store's
 * journal (its id) is replaced and named. */
static void
test_damaged_header_and_foreign_journal(void **state)
{
	char *dir = j_three(), path[600], kept[640];
	struct kvt_store *st;
	uint32_t dropped = 0;
	uint64_t orphan = 0;
	struct stat sb;
	uint8_t byte = 0x5a;
	int fd;

	(void)state;
	j_path(dir, path, sizeof path);
	fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, &byte, 1, 20), 1); /* inside the store id: checksum fails */
	close(fd);
	st = j_open(dir);
	assert_int_equal(kvt_store_count(st), 0);
	assert_int_equal(kvt_store_damaged(st, &dropped, &orphan), 1);
	assert_int_equal(dropped, 3);
	assert_int_equal(orphan, 0);
	snprintf(kept, sizeof kept, "%s.damaged", path);
	assert_int_equal(stat(kept, &sb), 0);
	kvt_store_close(st);
	tsup_rmdir(dir);

	dir = j_three();
	j_path(dir, path, sizeof path);
	j_rewrite_header(path, KVT_FMT_VERSION, J_ID + 1);
	st = j_open(dir);
	assert_int_equal(kvt_store_count(st), 0);
	assert_int_equal(kvt_store_damaged(st, &dropped, &orphan), 0);
	assert_int_equal(orphan, J_ID + 1);
	kvt_store_close(st);
	tsup_rmdir(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_two_records_claim_one_slot),
		cmocka_unit_test(test_shared_slot_same_write),
		cmocka_unit_test(test_slot_twice_reported),
		cmocka_unit_test(test_truncated_put),
		cmocka_unit_test(test_corrupt_record_mid_journal),
		cmocka_unit_test(test_damaged_journal_copied_without_links),
		cmocka_unit_test(test_other_version_refused),
		cmocka_unit_test(test_damaged_header_and_foreign_journal),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
