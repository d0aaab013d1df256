/* SPDX-License-Identifier: MIT */
/*
 * tests/test_durable.c - the order of writes and syncs of the persistent NVMe store, recorded
 * through the sync hook (tiers/store.h) and the NVMe completion hook: what a power cut at any
 * point would leave. Checked at every event:
 *   - no block write lands on a slot that a durable journal record names for another write
 *     (slots of dropped, closed, reclaimed or changed sessions are reused only once the record
 *     superseding theirs is durable);
 *   - a PUT names only slots whose data were made durable before it (phase 1);
 *   - every record appended is followed by a journal sync before the engine goes idle (phase
 *     2), also when a publish fails halfway;
 *   - the compacted journal is synced before it is renamed over the old one.
 * Also: a timed-out write's slot quarantined until its late completion, the store created
 * under a temporary name, session keys unique, fdatasync failures final, ENOSPC never punching
 * a published slot. Every test runs twice: with the two-IO zero-copy write of small blocks, and
 * with the HOST header room forced on (kvt_test_host_room_min_block: one IO per block).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine_impl.h"
#include "support/kvt_test.h"

#define SLOT_BYTES 8192u /* a 4 KiB header page + a 1024-byte test block, rounded up */
#define DN 64u           /* slots tracked */
#define DOPS 64u         /* records between two journal syncs */
#define DBLK 16u         /* blocks per record tracked */

struct dop {
	int ev;               /* KVT_SYNC_PUT or KVT_SYNC_DEL */
	uint64_t sess;        /* session key */
	uint32_t n;           /* blocks */
	uint32_t slot[DBLK];  /* their slots */
	uint64_t key[DBLK];   /* their write tags */
};

/* What the disk would hold after a power cut now, as far as the journal is concerned. */
struct drec {
	uint64_t ev;            /* events so far */
	uint64_t last_data;     /* event number of the last KVT_SYNC_DATA */
	uint64_t written[DN];   /* event number of the last write completed per slot */
	uint64_t dkey[DN];      /* write tag a durable record names per slot (0 = none) */
	uint64_t dsess[DN];     /* and its session */
	struct dop op[DOPS];    /* records appended since the last journal sync */
	uint32_t n_op;          /* entries in op */
	unsigned overwrites;    /* writes over a durably named slot (must stay 0) */
	unsigned unsynced_puts; /* PUTs naming data written after the last data sync (0) */
	unsigned journal_syncs; /* KVT_SYNC_JOURNAL events */
	unsigned compact_syncs; /* KVT_SYNC_COMPACT events */
	unsigned puts;          /* KVT_SYNC_PUT events */
	int fail_after_put;     /* 1: the allocation after the next PUT fails */
	unsigned super_syncs;   /* KVT_SYNC_SUPER events */
	unsigned store_early;   /* of those, with "kvtier.store" already there at creation */
	const char *dir;        /* store directory while creating (NULL otherwise) */
};

static struct drec rec;

static void
rec_forget(uint64_t sess)
{
	for (uint32_t s = 0; s < DN; s++)
		if (rec.dkey[s] && rec.dsess[s] == sess)
			rec.dkey[s] = 0;
}

static void
rec_sync(void *arg, int ev, uint64_t key, const struct kvt_fmt_blkref *blocks, uint32_t n)
{
	struct dop *o;

	(void)arg;
	rec.ev++;
	switch (ev) {
	case KVT_SYNC_DATA:
		rec.last_data = rec.ev;
		break;
	case KVT_SYNC_PUT:
	case KVT_SYNC_DEL:
		assert_true(rec.n_op < DOPS && n <= DBLK);
		o = &rec.op[rec.n_op++];
		o->ev = ev;
		o->sess = key;
		o->n = n;
		for (uint32_t i = 0; i < n; i++) {
			assert_true(blocks[i].slot < DN);
			o->slot[i] = blocks[i].slot;
			o->key[i] = blocks[i].tag;
			if (rec.written[blocks[i].slot] > rec.last_data)
				rec.unsynced_puts++;
		}
		if (ev == KVT_SYNC_PUT) {
			rec.puts++;
			if (rec.fail_after_put) {
				rec.fail_after_put = 0;
				kvt_test_alloc_countdown = 1;
			}
		}
		break;
	case KVT_SYNC_JOURNAL:
		rec.journal_syncs++;
		for (uint32_t i = 0; i < rec.n_op; i++) {
			o = &rec.op[i];
			rec_forget(o->sess);
			for (uint32_t b = 0; o->ev == KVT_SYNC_PUT && b < o->n; b++) {
				rec.dkey[o->slot[b]] = o->key[b];
				rec.dsess[o->slot[b]] = o->sess;
			}
		}
		rec.n_op = 0;
		break;
	case KVT_SYNC_COMPACT:
		rec.compact_syncs++;
		break;
	case KVT_SYNC_SUPER:
		rec.super_syncs++;
		if (rec.dir) {
			char path[600];

			/* the store's own name appears only once its superblock is durable */
			snprintf(path, sizeof path, "%s/kvtier.store", rec.dir);
			if (access(path, F_OK) == 0)
				rec.store_early++;
		}
		break;
	}
}

static void
rec_write(void *arg, bool is_write, uint32_t slot, void *buf, size_t len, uint64_t off, int *res)
{
	struct kvt_fmt_blkhdr h;

	(void)arg;
	/* a zero-copy write's payload piece follows its header page: count the write once */
	if (!is_write || *res < 0 || slot >= DN || (off - KVT_FMT_DATA_OFF) % SLOT_BYTES != 0)
		return;
	rec.ev++;
	rec.written[slot] = rec.ev;
	assert_int_equal(kvt_fmt_blkhdr_decode(buf, len, &h), 0);
	if (rec.dkey[slot] && rec.dkey[slot] != kvt_fmt_write_tag(h.key)) {
		print_error("write of tag %#x over slot %u, which a durable record of session "
			    "%#llx names (tag %#llx)\n", kvt_fmt_write_tag(h.key), slot,
			    (unsigned long long)rec.dsess[slot],
			    (unsigned long long)rec.dkey[slot]);
		rec.overwrites++;
	}
}

static const struct kvt_sync_hook sync_hook = { .fn = rec_sync };
static const struct kvt_nvme_fault_hooks io_hooks = { .on_complete = rec_write };

static const struct kvt_nvme_fault_hooks *dur_hooks; /* instead of io_hooks when set */

static struct kvt_engine *
dur_engine(const char *dir, uint32_t nvme_blocks)
{
	struct kvt_engine_opts o;

	tsup_store_opts(&o, dir, (uint64_t)nvme_blocks * SLOT_BYTES);
	return tsup_create(&o, dur_hooks ? dur_hooks : &io_hooks);
}

/* Park @s to NVMe, let everything complete; no record may be left unsynced. */
static void
dur_park(struct kvt_engine *e, kvt_seq_id s)
{
	struct kvt_nvme_stats st;

	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(rec.n_op, 0);
	tsup_check_engine(e);
	/* the room variant really writes one IO per zero-copy put */
	kvt_nvme_get_stats(e->nvme, &st);
	assert_int_equal(e->host_data_off, kvt_test_host_room_min_block == 1 ? 4096 : 0);
	assert_int_equal(st.zc_one_io, e->host_data_off ? st.zc_writes : 0);
}

static void
rec_check(void)
{
	assert_int_equal(rec.overwrites, 0);
	assert_int_equal(rec.unsynced_puts, 0);
}

/* Closed, reclaimed and changed sessions: their slots are reused only after a durable record
 * supersedes theirs; publishing syncs data before records and records before going idle. */
static void
test_slots_reused_only_after_durable_supersede(void **state)
{
	char *dir = tsup_mkdtemp();
	struct kvt_engine *e;
	kvt_seq_id a, b, c;

	(void)state;
	memset(&rec, 0, sizeof rec);
	kvt_test_sync_hook = &sync_hook;
	e = dur_engine(dir, 6);
	assert_true(rec.compact_syncs >= 1); /* the journal compacted at open was synced */
	a = tsup_session_written(e, 1, 1, 8);              /* 2 blocks */
	dur_park(e, a);
	b = tsup_session_written(e, 2, 2, 12);             /* 3 blocks */
	dur_park(e, b);
	assert_true(rec.puts >= 2 && rec.journal_syncs >= 2);
	rec_check();
	/* closing a: its DEL is not durable yet, so its 2 slots must wait; c needs 2 and 1 is
	 * free: the DEL is committed first */
	assert_int_equal(kvt_seq_close(e, a), 0);
	c = tsup_session_written(e, 3, 3, 6);              /* 2 blocks, the second half full */
	dur_park(e, c);
	rec_check();
	kvt_engine_destroy(e);

	/* restart: 2 and 3 are restorable (5 slots); a new session needs 2 of its 1 free slot:
	 * the oldest stored session goes, its slots reused once its DEL is durable */
	rec.n_op = 0;
	e = dur_engine(dir, 6);
	a = tsup_session_written(e, 4, 4, 8);
	dur_park(e, a);
	rec_check();
	assert_int_equal(kvt_seq_restore(e, 2, NULL, &b), -ENOENT);
	/* a restored session changed: its changed block's old slot stays named by the committed
	 * PUT until the new PUT is durable (the LIFO allocator would hand it out first) */
	tsup_restore(e, 3, 3, &c);
	assert_int_equal(tsup_append_write(e, c, 3, 6, 1), 0);
	tsup_check_engine(e);
	dur_park(e, c);
	rec_check();
	kvt_engine_destroy(e);

	e = dur_engine(dir, 6);
	tsup_restore(e, 3, 3, &c);
	tsup_restore(e, 4, 4, &a);
	rec_check();
	kvt_engine_destroy(e);
	kvt_test_sync_hook = NULL;
	tsup_rmdir(dir);
}

/* A publish that fails after putting one record still commits that record. */
static void
test_publish_failure_commits_what_was_put(void **state)
{
	char *dir = tsup_mkdtemp();
	struct kvt_engine *e;
	kvt_seq_id a, b;
	unsigned puts;

	(void)state;
	memset(&rec, 0, sizeof rec);
	kvt_test_sync_hook = &sync_hook;
	e = dur_engine(dir, 16);
	a = tsup_session_written(e, 1, 1, 8);
	b = tsup_session_written(e, 2, 2, 8);
	dur_park(e, a);
	dur_park(e, b);
	/* back up, then parked again: their NVMe copies are still valid, so both become ready
	 * in the same publish; the allocation after the first PUT fails */
	assert_int_equal(kvt_seq_resume(e, a), 0);
	assert_int_equal(kvt_seq_resume(e, b), 0);
	/* the resumes' copies land first: a park that had to wait for them would poll, and that
	 * poll could publish a alone before the failing publish is armed */
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_seq_park(e, b, KVT_TIER_NVME), 0);
	puts = rec.puts;
	rec.fail_after_put = 1;
	assert_true(kvt_engine_poll(e, 0) >= 0);
	kvt_test_alloc_countdown = 0;
	assert_int_equal(rec.puts, puts + 1); /* one put, then the failure */
	assert_int_equal(rec.n_op, 0);        /* and it was committed */
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_true(kvt_engine_poll(e, 0) >= 0); /* the other one is retried */
	assert_int_equal(rec.n_op, 0);
	assert_int_equal(rec.puts, puts + 2);
	rec_check();
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	e = dur_engine(dir, 16);
	tsup_restore(e, 1, 1, &a);
	tsup_restore(e, 2, 2, &b);
	kvt_engine_destroy(e);
	kvt_test_sync_hook = NULL;
	tsup_rmdir(dir);
}

/* A crash while the store is created leaves at most "kvtier.store.tmp" (removed by the next
 * open), never a "kvtier.store" without a durable superblock. */
static void
test_store_created_atomically(void **state)
{
	char *dir = tsup_mkdtemp(), path[600];
	struct kvt_engine *e;
	struct stat st;
	blkcnt_t full;
	FILE *f;
	int fd;

	(void)state;
	memset(&rec, 0, sizeof rec);
	snprintf(path, sizeof path, "%s/kvtier.store.tmp", dir);
	f = fopen(path, "w"); /* what a crash halfway through a creation leaves */
	assert_non_null(f);
	fputs("half a store", f);
	fclose(f);
	kvt_test_sync_hook = &sync_hook;
	rec.dir = dir;
	e = dur_engine(dir, 8);
	rec.dir = NULL;
	assert_int_equal(rec.super_syncs, 1);
	assert_int_equal(rec.store_early, 0);
	assert_int_equal(access(path, F_OK), -1); /* renamed */
	kvt_engine_destroy(e);
	/* space punched out of an existing store (ENOSPC handling) is reserved again at open */
	snprintf(path, sizeof path, "%s/kvtier.store", dir);
	fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(fstat(fd, &st), 0);
	full = st.st_blocks;
	if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, 4 * SLOT_BYTES) == 0) {
		assert_int_equal(fstat(fd, &st), 0);
		assert_true(st.st_blocks < full);
		close(fd);
		e = dur_engine(dir, 8); /* and opens again */
		kvt_engine_destroy(e);
		assert_int_equal(stat(path, &st), 0);
		assert_int_equal(st.st_blocks, full);
	} else {
		close(fd);
	}
	kvt_test_sync_hook = NULL;
	tsup_rmdir(dir);
}

/* A session key names one conversation: a second open of it is refused, whether it is open
 * now or stored (restore or drop it instead). */
static void
test_session_key_unique(void **state)
{
	char *dir = tsup_mkdtemp();
	struct kvt_seq_opts so;
	struct kvt_engine *e;
	kvt_seq_id a, b;

	(void)state;
	memset(&rec, 0, sizeof rec);
	e = dur_engine(dir, 16);
	kvt_seq_opts_init(&so, sizeof so);
	so.session_key = 42;
	a = tsup_session_written(e, 42, 1, 8);
	assert_int_equal(kvt_seq_open(e, &so, &b), KVT_EBUSY);
	dur_park(e, a);
	kvt_engine_destroy(e);
	e = dur_engine(dir, 16);
	assert_int_equal(kvt_seq_open(e, &so, &b), -EEXIST);
	tsup_restore(e, 42, 1, &a);
	assert_int_equal(kvt_seq_open(e, &so, &b), KVT_EBUSY);
	assert_int_equal(kvt_seq_close(e, a), 0);
	assert_int_equal(kvt_seq_open(e, &so, &b), 0); /* closed: the key is free again */
	so.session_key = 0;
	assert_int_equal(kvt_seq_open(e, &so, &a), 0); /* 0 = no key: never refused */
	assert_int_equal(kvt_seq_open(e, &so, &a), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

static int sync_fail_ev; /* the next fdatasync of this event fails with EIO (0 = none) */

static int
fail_sync(void *arg, int ev)
{
	(void)arg;
	if (ev != sync_fail_ev)
		return 0;
	sync_fail_ev = 0;
	return EIO;
}

/* An fdatasync that fails is final: the kernel may have dropped the dirty pages, so a later
 * fdatasync that succeeds proves nothing. Neither the journal nor the store file ever reports
 * success again. */
static void
fsync_failure_is_final(int ev)
{
	static const struct kvt_sync_hook hook = { .fn = rec_sync, .fail = fail_sync };
	char *dir = tsup_mkdtemp();
	struct kvt_engine *e;
	kvt_seq_id a, b, c;
	unsigned j;

	memset(&rec, 0, sizeof rec);
	kvt_test_sync_hook = &hook;
	e = dur_engine(dir, 16);
	a = tsup_session_written(e, 1, 1, 8);
	dur_park(e, a);
	sync_fail_ev = ev;
	b = tsup_session_written(e, 2, 2, 8);
	assert_int_equal(kvt_seq_park(e, b, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(sync_fail_ev, 0); /* the failure was injected */
	assert_false(e->pub_check);        /* not retried for ever */
	j = rec.journal_syncs;
	c = tsup_session_written(e, 3, 3, 8);
	assert_int_equal(kvt_seq_park(e, c, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	e->pub_check = true;
	assert_true(kvt_engine_poll(e, 0) >= 0);
	assert_int_equal(rec.journal_syncs, j); /* no commit claims success any more */
	if (ev == KVT_SYNC_JOURNAL)
		assert_true(kvt_store_failed(e->store));
	else
		assert_true(kvt_nvme_sync_failed(e->nvme));
	assert_int_not_equal(kvt_session_drop(e, 77), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	kvt_test_sync_hook = NULL;
	tsup_rmdir(dir);
}

static void
test_journal_fsync_failure_is_final(void **state)
{
	(void)state;
	fsync_failure_is_final(KVT_SYNC_JOURNAL);
}

static void
test_data_fsync_failure_is_final(void **state)
{
	(void)state;
	fsync_failure_is_final(KVT_SYNC_DATA);
}

/* ENOSPC gives up clean NVMe copies and punches their space out, but never that of a slot a
 * published record names: that session is still restorable after a crash. */
static void
test_enospc_keeps_published_slots(void **state)
{
	struct kvt_stats st = { .size = sizeof st };
	char *dir = tsup_mkdtemp();
	struct kvt_engine *e;
	kvt_seq_id a, b;

	(void)state;
	dur_hooks = &tsup_enospc_hooks;
	e = dur_engine(dir, 16);
	dur_hooks = NULL;
	a = tsup_session_written(e, 1, 1, 8);
	dur_park(e, a);                            /* published */
	assert_int_equal(tsup_verify(e, a, 1), 0); /* back in HBM: its NVMe copies are clean */
	tsup_enospc_writes = 1;
	b = tsup_session_written(e, 2, 2, 8);
	assert_int_equal(kvt_seq_park(e, b, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	tsup_enospc_writes = 0;
	assert_int_equal(kvt_engine_stats(e, &st), 0);
	assert_true(st.tier[KVT_TIER_NVME].evictions >= 2); /* a's clean copies given up */
	tsup_check_engine(e);
	kvt_engine_destroy(e); /* a crash as far as a is concerned: its record stays */
	e = dur_engine(dir, 16);
	tsup_restore(e, 1, 1, &a);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

static int late_writes; /* 1: every NVMe write's CQE comes only after its timeout */

static int
late_fate(void *arg, bool is_write, uint32_t slot)
{
	(void)arg;
	(void)slot;
	return is_write && late_writes ? KVT_NVME_FATE_LATE : KVT_NVME_FATE_NORMAL;
}

/* A write that timed out while the kernel still owns it: its slot stays quarantined (never
 * handed to another write) until the late completion comes, then it is free again. The timeout
 * is 250 ms so that on a loaded machine only the write the hook holds back times out (at 30 ms
 * a later read timed out once in a parallel ctest run, failing the final verify). */
static void
test_timed_out_write_quarantines_slot(void **state)
{
	static const struct kvt_nvme_fault_hooks hooks = { .fate = late_fate,
							   .io_timeout_ms = 250 };
	struct kvt_engine_opts o;
	struct kvt_engine *e = NULL;
	struct kvt_seq_info info;
	char *dir = tsup_mkdtemp();
	uint32_t q = 0;
	kvt_seq_id a;

	(void)state;
	tsup_store_opts(&o, dir, 8 * SLOT_BYTES);
	o.nvme_persist = 0;
	e = tsup_create(&o, &hooks);
	a = tsup_session_written(e, 0, 1, 4); /* one block: one write, whose timeout one poll sees */
	late_writes = 1;
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_NVME), 0);
	/* poll (never waiting) until the write has timed out: its late CQE is due at the reap
	 * after that one */
	for (int i = 0; i < 20000 && (e->st.io_errors < 1 || e->nvme_inflight); i++) {
		assert_true(kvt_engine_poll(e, 0) >= 0);
		usleep(1000);
	}
	assert_int_equal(e->nvme_inflight, 0);
	assert_int_equal(e->st.io_errors, 1);
	late_writes = 0;
	assert_int_equal(kvt_seq_info(e, a, &info), 0);
	assert_int_equal(info.blocks_in[KVT_TIER_NVME], 0);
	for (uint32_t s = 0; s < e->slots[KVT_TIER_NVME].n_slots; s++)
		q += kvt_owner(e, KVT_TIER_NVME, s) == KVT_SLOT_QUARANTINED;
	assert_int_equal(q, 1);
	assert_int_equal(e->slots[KVT_TIER_NVME].n_free, 7);
	tsup_check_engine(e);
	/* the late completion comes at the next reap (or, if the disk itself was slower than
	 * the timeout, when the kernel is done): the slot is free again */
	for (int i = 0; i < 20000 && e->slots[KVT_TIER_NVME].n_free < 8; i++) {
		assert_true(kvt_engine_poll(e, 0) >= 0);
		usleep(1000);
	}
	assert_int_equal(e->slots[KVT_TIER_NVME].n_free, 8);
	assert_int_equal(e->quarantined[KVT_TIER_NVME], 0);
	tsup_check_engine(e);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_info(e, a, &info), 0);
	assert_int_equal(info.blocks_in[KVT_TIER_NVME], info.n_blocks);
	assert_int_equal(tsup_verify(e, a, 1), 0);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* A park to NVMe of more blocks than the IO queue holds: the HOST -> NVMe writes that found
 * the queue full wait for room instead of being dropped, so after the drain every block is on
 * NVMe and the session is published (they used to stay in HOST only: never durable). */
static void
test_park_larger_than_queue_depth(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_seq_info in;
	struct kvt_engine *e;
	char *dir = tsup_mkdtemp();
	uint64_t keys[2];
	kvt_seq_id s;

	(void)state;
	tsup_store_opts(&o, dir, 128ull * SLOT_BYTES);
	o.nvme_queue_depth = 4;
	o.hbm_bytes = 48 * tsup_block_bytes();
	o.host_bytes = 48 * tsup_block_bytes();
	e = tsup_create(&o, NULL);
	s = tsup_open(e, 0, 0, 9);
	for (uint32_t k = 0; k < 40 * TSUP_TPB; k += 16) /* 40 blocks, 10x the queue */
		assert_int_equal(tsup_append_write(e, s, 9, k, 16), 0);
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_info(e, s, &in), 0);
	assert_int_equal(in.blocks_in[KVT_TIER_NVME], 40);
	assert_int_equal(in.blocks_in[KVT_TIER_HOST], 0);
	assert_int_equal(in.blocks_in[KVT_TIER_HBM], 0);
	tsup_check_engine(e);
	assert_int_equal(kvt_seq_detach(e, s), 0);
	kvt_engine_destroy(e);
	/* restart: the session is there, whole */
	e = tsup_create(&o, NULL);
	assert_int_equal(kvt_session_list(e, keys, 2), 1);
	tsup_restore(e, 9, 9, &s);
	assert_int_equal(kvt_seq_info(e, s, &in), 0);
	assert_int_equal(in.n_tokens, 40 * TSUP_TPB);
	assert_int_equal(kvt_seq_close(e, s), 0);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

#define DUR_BOTH(t) cmocka_unit_test(t), \
	cmocka_unit_test_setup_teardown(t, tsup_room_on, tsup_room_off)

int
main(void)
{
	const struct CMUnitTest tests[] = {
		DUR_BOTH(test_slots_reused_only_after_durable_supersede),
		DUR_BOTH(test_publish_failure_commits_what_was_put),
		DUR_BOTH(test_timed_out_write_quarantines_slot),
		DUR_BOTH(test_store_created_atomically),
		DUR_BOTH(test_session_key_unique),
		DUR_BOTH(test_enospc_keeps_published_slots),
		DUR_BOTH(test_journal_fsync_failure_is_final),
		DUR_BOTH(test_data_fsync_failure_is_final),
		DUR_BOTH(test_park_larger_than_queue_depth),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
