/* SPDX-License-Identifier: MIT */
/*
 * tiers/store.h - the journal and index of published sessions of the persistent NVMe store
 * (internal). The block data live in the store file (tiers/tier_nvme.c); this module keeps
 * "<dir>/kvtier.journal": an append-only log of PUT (a session's tokens and block references)
 * and DEL records (tiers/format.h), replayed into an in-memory index at open and compacted
 * (rewritten to a temporary file, fsync'ed, renamed over) at every open.
 *
 * Replay rules: a record that does not verify ends the log (a torn tail from a crash) and the
 * file is cut there; a later PUT of a key replaces the earlier one, a DEL removes it; when two
 * live sessions name the same slot with different writes (tag, length code), the later PUT wins
 * and the earlier session is dropped whole (its data were overwritten when the later one was
 * written); sessions naming the same write of a slot share that block and are all kept. A record
 * that verifies but whose fields fail kvt_fmt_rec_check (counts, slots, length codes, key, seqno,
 * priority) drops its session, an earlier PUT of it included, and replay goes on
 * (kvt_store_invalid() counts them). Whether a session's slots still
 * hold what its record says is checked by the caller against the block headers (restore).
 *
 * Durability: kvt_store_put/del only write; kvt_store_commit makes them durable (fdatasync). The
 * caller makes the blocks' data durable before it puts a record that refers to them.
 *
 * Threading: not thread-safe; the engine calls it under its mutex.
 */
#ifndef KVT_TIERS_STORE_H
#define KVT_TIERS_STORE_H

#include <stdbool.h>
#include <stdint.h>

#include "tiers/format.h"

/** One published session in the index. */
struct kvt_store_sess {
	uint64_t key;                  /* session key */
	uint64_t seqno;                /* journal sequence number of its PUT */
	uint64_t n_tokens;             /* tokens */
	uint32_t n_blocks;             /* blocks */
	uint32_t tenant;               /* as opened */
	uint32_t priority;             /* as opened */
	uint32_t open_seq;             /* engine: index of the open sequence using it, or
	                                  UINT32_MAX when none (restorable) */
	int32_t *tokens;               /* [n_tokens]; owned */
	struct kvt_fmt_blkref *blocks; /* [n_blocks]; owned */
};

struct kvt_store;

/** Events seen by the durability test hook, in the order they happen. */
enum kvt_sync_ev {
	KVT_SYNC_DATA = 1,    /* the store file's data are durable (kvt_nvme_sync succeeded) */
	KVT_SYNC_PUT = 2,     /* a PUT record was appended (key, blocks, n) */
	KVT_SYNC_DEL = 3,     /* a DEL record was appended (key) */
	KVT_SYNC_JOURNAL = 4, /* the journal is durable (kvt_store_commit's fdatasync succeeded) */
	KVT_SYNC_COMPACT = 5, /* a compacted journal is durable, about to be renamed over */
	KVT_SYNC_SUPER = 6,   /* the store file's superblock is durable (create or open) */
};

/**
 * Test hook: when set, called (under the engine lock) after each event above, so that a test
 * can record the order of writes and syncs and tell what a power cut at any point would leave.
 * NULL in production.
 */
struct kvt_sync_hook {
	void (*fn)(void *arg, int ev, uint64_t key, const struct kvt_fmt_blkref *blocks,
		   uint32_t n); /* @blocks: PUT only */
	void *arg;              /* passed to fn */
	int (*fail)(void *arg, int ev); /* may be NULL; called before the fdatasync of a
	                                   DATA, JOURNAL or COMPACT event: an errno > 0 makes it
	                                   fail with that error instead */
};
extern const struct kvt_sync_hook *kvt_test_sync_hook;

/** Report @ev to the test hook (no-op when none is set). */
void kvt_sync_note(int ev, uint64_t key, const struct kvt_fmt_blkref *blocks, uint32_t n);
/**
 * kvt_sync_fd() - fdatasync @fd as event @ev (DATA, JOURNAL or COMPACT): the test hook may inject
 * a failure instead; a success is reported to it (kvt_sync_note). Returns 0 or -errno.
 */
int kvt_sync_fd(int fd, int ev);
/** kvt_fsync_dir() - fsync directory @dir, so that entries just created or renamed in it are
 * durable. Best effort: a directory that cannot be opened is left as it is. */
void kvt_fsync_dir(const char *dir);

/**
 * kvt_store_open() - open (or create) "<dir>/kvtier.journal" for the store @store_id whose
 * records must fit @lim (its slots, tokens per block, block bytes, codec; copied), replay and
 * compact it. @fresh: the store file was just created, so any journal
 * left there belongs to an older store and is discarded (as is one whose store id differs:
 * kvt_store_damaged() names it). Replay stops at the first record that does not verify: a torn
 * tail (nothing valid after it) is cut silently; damage (valid records after it, or a header
 * that does not verify) replays what came before, keeps the journal as it was in
 * "<dir>/kvtier.journal.damaged" and is reported by kvt_store_damaged(). Returns 0, KVT_EFORMAT
 * (a journal of another format version: refused, the file untouched), -ENOMEM, -errno of the
 * file operations (with a message).
 */
int kvt_store_open(const char *dir, uint64_t store_id, const struct kvt_fmt_limits *lim,
		   bool fresh, struct kvt_store **out);
/**
 * kvt_store_open_acked() - kvt_store_open() for a store whose superblock knew journal generation
 * @ack_gen durable up to @ack_len bytes (kvt_nvme_journal_known; 0, 0 = unknown). A journal of
 * that generation that verifies less than @ack_len (cut or zeroed after its fdatasync), or one of
 * an older generation, or none at all, lost records that were acknowledged: replays what
 * verifies, keeps the journal as it was as "<dir>/kvtier.journal.damaged" and reports it
 * (kvt_store_short). A newer generation (compacted after the superblock was last written) is
 * not checked. Every compaction writes the next generation.
 */
int kvt_store_open_acked(const char *dir, uint64_t store_id, const struct kvt_fmt_limits *lim,
			 bool fresh, uint64_t ack_gen, uint64_t ack_len, struct kvt_store **out);
/** Whether kvt_store_open_acked() found acknowledged records missing: *@found, the bytes that
 * verify (0 = no journal), *@acked, the length known durable. Either pointer may be NULL. */
bool kvt_store_short(const struct kvt_store *st, uint64_t *found, uint64_t *acked);
/** The journal's generation and the bytes of it known durable (last commit or compaction). */
void kvt_store_durable(const struct kvt_store *st, uint64_t *gen, uint64_t *len);
/** Close the journal and free the index. NULL accepted. */
void kvt_store_close(struct kvt_store *st);

/**
 * kvt_store_damaged() - what kvt_store_open() found wrong with the journal: returns the offset
 * from which it did not verify though it was no torn tail (1 = its header; 0 = none), with
 * *@dropped the valid records found after it that were not replayed, and *@orphan_id the store
 * id of a journal of another store that was replaced (0 = none). Either pointer may be NULL.
 */
uint64_t kvt_store_damaged(const struct kvt_store *st, uint32_t *dropped, uint64_t *orphan_id);

/** kvt_store_invalid() - records kvt_store_open() found that verified (checksum) but failed the
 * field checks (kvt_fmt_rec_check); their sessions were dropped. *@first (may be NULL): why the
 * first of them failed ("" when none). */
uint32_t kvt_store_invalid(const struct kvt_store *st, const char **first);

/** Test hook: when set, keeping a damaged journal copies it as on a filesystem without hard
 * links. */
extern bool kvt_test_store_no_link;

/** Number of sessions in the index, and the i-th (0 <= i < count; order changes on del). */
uint32_t kvt_store_count(const struct kvt_store *st);
/** How many times the index gained or lost a session: unchanged means the same sessions. */
uint64_t kvt_store_changes(const struct kvt_store *st);
struct kvt_store_sess *kvt_store_at(struct kvt_store *st, uint32_t i);
/** The session with @key, or NULL. */
struct kvt_store_sess *kvt_store_find(struct kvt_store *st, uint64_t key);
/**
 * kvt_store_find_hash() - a published block whose content hash is @hash (16 bytes, not all
 * zero): its session and block index, a session not open in the engine (open_seq UINT32_MAX)
 * preferred when several share the block. Returns true when found. Linear in the blocks indexed.
 */
bool kvt_store_find_hash(struct kvt_store *st, const uint8_t *hash,
			 struct kvt_store_sess **sess, uint32_t *index);

/**
 * kvt_store_put() - append a PUT record for @key and replace its index entry. Arrays are copied.
 * Not durable until kvt_store_commit(). Returns 0, -ENOMEM, -EINVAL (too large), -errno.
 */
int kvt_store_put(struct kvt_store *st, uint64_t key, uint32_t tenant, uint32_t priority,
		  const int32_t *tokens, uint64_t n_tokens, const struct kvt_fmt_blkref *blocks,
		  uint32_t n_blocks, uint32_t open_seq);
/** Append a DEL record for @key and remove it from the index (no-op when absent). 0 or -errno. */
int kvt_store_del(struct kvt_store *st, uint64_t key);
/**
 * Make the records written so far durable (fdatasync). 0 or -errno. An fdatasync failure is
 * final: the kernel may have dropped the dirty pages and a later fdatasync could succeed
 * without writing them, so from then on put, del and commit fail (-EIO) and kvt_store_failed()
 * is true.
 */
int kvt_store_commit(struct kvt_store *st);
/** Whether an fdatasync of the journal failed (the store takes no more records). */
bool kvt_store_failed(const struct kvt_store *st);

/**
 * kvt_store_fuzz_one() - fuzz entry of journal replay (store_apply, store_resolve): replays the
 * journal image @data (@len bytes, journal header first, any store id) into a throw-away index of
 * 64 slots, 16 tokens per block, raw blocks of 8192 bytes (as tests/fuzz/mkseeds.c writes).
 * Returns the sessions left, or -1 if the index broke an invariant (a session twice, a slot out
 * of range or claimed twice, a field kvt_fmt_rec_check refuses). No files touched.
 */
int kvt_store_fuzz_one(const uint8_t *data, size_t len);

#endif /* KVT_TIERS_STORE_H */
