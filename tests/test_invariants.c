/* SPDX-License-Identifier: MIT */
/*
 * tests/test_invariants.c - the six invariants of DESIGN.md and the four failure scenarios of
 * the v0 issue, each a test that fails when the engine breaks the rule. The emulated device's
 * bandwidth knob makes copies slow (so a copy that is not waited for really is still running)
 * and its delay knob reorders completions across streams.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "engine/engine_impl.h"
#include "tiers/tier_nvme.h"
#include "support/kvt_test.h"

#define SLOW_BW (100u * 1024u) /* 100 KiB/s: a 1 KiB block copy takes ~10 ms */

static kvt_seq_id
seq_with(struct kvt_engine *e, uint32_t tag, size_t n)
{
	kvt_seq_id s;

	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	assert_int_equal(tsup_append_write(e, s, tag, 0, n), 0);
	return s;
}


/* Invariant 1: a slot is never reused while a transfer reading or writing it is in flight.
 * A is parked (slow D2H copies read its HBM slots); B needs those HBM slots at once and writes
 * into them. If A's slots were handed out before the copies finished, A's copy in HOST would
 * hold B's bytes. */
static void
test_inv1_no_slot_reuse_in_flight(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 2, .host_blocks = 4, .bandwidth = SLOW_BW };
	struct kvt_engine *e;
	kvt_seq_id a, b;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	a = seq_with(e, 1, 8);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	assert_true(tsup_stats(e).transfers_in_flight > 0);
	b = seq_with(e, 2, 8); /* needs both HBM slots now */
	assert_int_equal(tsup_verify(e, b, 2), 0);
	assert_int_equal(kvt_seq_park(e, b, KVT_TIER_HOST), 0);
	assert_int_equal(tsup_verify(e, a, 1), 0);
	assert_int_equal(tsup_verify(e, b, 2), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
}

/* Invariant 2: a block is used by a kernel only after its HBM copy completed, or after the
 * kernel's stream waits for it. */
static void
test_inv2_pinned_after_copy_complete(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 2, .host_blocks = 4, .bandwidth = SLOW_BW };
	struct kvt_block_table bt;
	struct kvt_engine *e;
	struct kvt_batch *bat;
	kvt_seq_id a, b;
	void *stream;
	float got[TSUP_HEADS * TSUP_DIM];
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	a = seq_with(e, 1, 8);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	b = seq_with(e, 2, 8); /* HBM slots now hold B's bytes */
	assert_int_equal(kvt_seq_park(e, b, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	/* host wait */
	assert_int_equal(kvt_batch_prepare(e, &a, 1, &bat), 0);
	/* layers land one group at a time: every layer checked below is waited for */
	for (uint32_t l = 0; l < TSUP_LAYERS; l++)
		assert_int_equal(kvt_batch_wait_layer(bat, l, NULL), 0);
	assert_int_equal(kvt_batch_block_table(bat, &bt), 0);
	assert_int_equal(tsup_check_entry(&bt, 0, 1), 0);
	assert_int_equal(kvt_batch_release(bat, NULL), 0);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	/* device-side wait: a "kernel" on the stream reads the slot after waiting */
	assert_int_equal(kvt_engine_stream_create(e, &stream), 0);
	assert_int_equal(kvt_batch_prepare(e, &b, 1, &bat), 0);
	assert_int_equal(kvt_batch_wait_layer(bat, 1, stream), 0);
	assert_int_equal(kvt_batch_block_table(bat, &bt), 0);
	{
		float *k;

		kvt_kv_addr(&bt.geo, 1, (int64_t)bt.indices[0] * TSUP_TPB, (void **)&k, NULL);
		assert_int_equal(kvt_engine_stream_memcpy_async(e, stream, got, k, sizeof got), 0);
	}
	assert_int_equal(kvt_engine_stream_sync(e, stream), 0);
	assert_true(got[3] == tsup_val(2, 0, 1, 0, 3));
	assert_int_equal(kvt_batch_release(bat, stream), 0);
	kvt_engine_stream_destroy(e, stream);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
}

/* Invariant 3: eviction never picks a pinned block or one with a transfer in flight. */
static void
test_inv3_no_eviction_of_pinned(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 4, .host_blocks = 8, .delay_us = 200 };
	struct kvt_block_table bt;
	struct kvt_engine *e;
	struct kvt_batch *bat;
	struct kvt_seq_info info;
	kvt_seq_id a, b, d;
	int64_t map[8];
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	a = seq_with(e, 1, 8);
	assert_int_equal(kvt_batch_prepare(e, &a, 1, &bat), 0); /* A pinned: 2 blocks */
	b = seq_with(e, 2, 8);                                  /* B fills HBM */
	assert_int_equal(tsup_verify(e, b, 2), 0);              /* ...and is unpinned */
	d = seq_with(e, 3, 8);                                  /* must evict B, never A */
	assert_int_equal(kvt_seq_info(e, b, &info), 0);
	assert_int_equal(info.blocks_in[KVT_TIER_HBM], 0);
	assert_int_equal(kvt_seq_info(e, a, &info), 0);
	assert_int_equal(info.blocks_in[KVT_TIER_HBM], 2);
	for (uint32_t l = 0; l < TSUP_LAYERS; l++)
		assert_int_equal(kvt_batch_wait_layer(bat, l, NULL), 0);
	assert_int_equal(kvt_batch_block_table(bat, &bt), 0);
	assert_int_equal(tsup_check_entry(&bt, 0, 1), 0);
	/* everything is pinned now (A by the batch, D by its append): no room at all */
	{
		kvt_seq_id x;

		assert_int_equal(kvt_seq_open(e, NULL, &x), 0);
		assert_int_equal(kvt_seq_append(e, x, NULL, 1, map), -ENOSPC);
		assert_int_equal(kvt_seq_close(e, x), 0);
	}
	assert_int_equal(kvt_batch_release(bat, NULL), 0);
	assert_int_equal(tsup_verify(e, d, 3), 0);
	assert_int_equal(tsup_verify(e, b, 2), 0);
	assert_int_equal(tsup_verify(e, a, 1), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
}

/* Invariant 4: a dirty block is demoted before its slot is freed; its bytes are never lost. */
static void
test_inv4_dirty_demoted_first(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 2, .host_blocks = 2, .nvme_blocks = 32,
			      .delay_us = 100 };
	struct kvt_engine *e;
	kvt_seq_id s[5];
	uint32_t i;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	for (i = 0; i < 5; i++) {
		s[i] = seq_with(e, i + 1, 8);
		assert_int_equal(tsup_verify(e, s[i], i + 1), 0);
	}
	/* 10 blocks were written into 2 HBM + 2 HOST slots: most went down to NVMe */
	assert_true(tsup_stats(e).blocks_moved[KVT_MOVE_HOST_TO_NVME] >= 6);
	for (i = 0; i < 5; i++)
		assert_int_equal(tsup_verify(e, s[i], i + 1), 0);
	assert_int_equal(tsup_stats(e).checksum_failed, 0);
	assert_true(tsup_stats(e).checksum_verified > 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

static void
corrupt_nvme_file(struct kvt_engine *e)
{
	char junk[256];
	off_t off, size;
	/* the private slot file has no name: reached through /proc/self/fd (kvt_nvme_path) */
	int fd = open(kvt_nvme_path(e->nvme), O_RDWR);

	assert_true(fd >= 0);
	memset(junk, 0x5a, sizeof junk);
	size = lseek(fd, 0, SEEK_END);
	for (off = 0; off < size; off += 4096)
		assert_int_equal(pwrite(fd, junk, sizeof junk, off + 100), sizeof junk);
	fsync(fd);
	close(fd);
}

/* Invariant 5: every block read back from NVMe is verified; a mismatch is a miss the caller
 * sees (KVT_ELOST and a truncated sequence), never wrong KV. */
static void
test_inv5_nvme_reads_verified(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 2, .host_blocks = 2, .nvme_blocks = 16 };
	struct kvt_seq_info info;
	struct kvt_engine *e;
	struct kvt_batch *bat = NULL;
	kvt_seq_id a;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	a = seq_with(e, 1, 6);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_info(e, a, &info), 0);
	assert_int_equal(info.blocks_in[KVT_TIER_NVME], 2);
	corrupt_nvme_file(e);
	assert_int_equal(kvt_batch_prepare(e, &a, 1, &bat), KVT_ELOST);
	assert_null(bat);
	assert_int_equal(tsup_stats(e).checksum_failed, 2);
	assert_int_equal(tsup_stats(e).blocks_lost, 2);
	assert_int_equal(kvt_seq_info(e, a, &info), 0);
	assert_int_equal(info.n_tokens, 0); /* the caller recomputes from here */
	tsup_check_engine(e);
	/* recompute: the sequence and the engine keep working */
	assert_int_equal(tsup_append_write(e, a, 1, 0, 6), 0);
	assert_int_equal(tsup_verify(e, a, 1), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* Invariant 6: a sealed (full) block is immutable and freed in no tier while referenced. v0 has
 * no prefix sharing yet (one reference per block), so this checks the immutability half: later
 * appends never change a sealed block, so its copies below stay valid and are not rewritten,
 * and blocks survive churn for as long as their sequence lives. */
static void
test_inv6_sealed_blocks_immutable(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 4, .host_blocks = 8, .nvme_blocks = 32 };
	struct kvt_seq_info info;
	struct kvt_engine *e;
	uint64_t before;
	kvt_seq_id a, x;
	uint32_t i;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	a = seq_with(e, 1, 10); /* 2 sealed blocks + 1 partial */
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	before = tsup_stats(e).blocks_moved[KVT_MOVE_HBM_TO_HOST];
	assert_int_equal(tsup_append_write(e, a, 1, 10, 1), 0);
	assert_int_equal(kvt_seq_info(e, a, &info), 0);
	assert_int_equal(info.blocks_in[KVT_TIER_HOST], 2); /* sealed copies still valid */
	assert_int_equal(tsup_verify(e, a, 1), 0);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	/* only the block that changed was copied down again */
	assert_int_equal(tsup_stats(e).blocks_moved[KVT_MOVE_HBM_TO_HOST], before + 1);
	for (i = 0; i < 6; i++) { /* churn */
		x = seq_with(e, 50 + i, 16);
		assert_int_equal(tsup_verify(e, x, 50 + i), 0);
		assert_int_equal(kvt_seq_close(e, x), 0);
	}
	assert_int_equal(tsup_verify(e, a, 1), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* (a) a block copied down while the write that produced it is still queued on another stream
 * must arrive with the new bytes. */
static void
test_scenario_a_copy_after_queued_write(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 2, .host_blocks = 4, .bandwidth = 64u << 20 };
	struct kvt_geometry g;
	struct kvt_engine *e;
	struct kvt_batch *bat;
	static char big_src[4 << 20], big_dst[4 << 20]; /* ~60 ms at 64 MiB/s */
	float kv[TSUP_HEADS * TSUP_DIM];
	kvt_seq_id a;
	int64_t map[1];
	void *w, *k, *v;
	uint32_t l, i;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	assert_int_equal(kvt_engine_geometry(e, &g), 0);
	assert_int_equal(kvt_engine_stream_create(e, &w), 0);
	assert_int_equal(kvt_seq_open(e, NULL, &a), 0);
	assert_int_equal(kvt_seq_append(e, a, NULL, 1, map), 0);
	assert_int_equal(kvt_batch_prepare(e, &a, 1, &bat), 0);
	/* the "model" writes K/V on its own stream, behind other work */
	assert_int_equal(kvt_engine_stream_memcpy_async(e, w, big_dst, big_src, sizeof big_src), 0);
	for (l = 0; l < TSUP_LAYERS; l++) {
		kvt_kv_addr(&g, l, map[0], &k, &v);
		for (i = 0; i < TSUP_HEADS * TSUP_DIM; i++)
			kv[i] = tsup_val(9, 0, l, 0, i);
		assert_int_equal(kvt_engine_stream_memcpy_async(e, w, k, kv, sizeof kv), 0);
		/* kv is reused: wait between the two writes of this loop */
		assert_int_equal(kvt_engine_stream_sync(e, w), 0);
		for (i = 0; i < TSUP_HEADS * TSUP_DIM; i++)
			kv[i] = tsup_val(9, 0, l, 1, i);
		assert_int_equal(kvt_engine_stream_memcpy_async(e, w, big_dst, big_src,
								 sizeof big_src), 0);
		assert_int_equal(kvt_engine_stream_memcpy_async(e, w, v, kv, sizeof kv), 0);
		if (l + 1 < TSUP_LAYERS)
			assert_int_equal(kvt_engine_stream_sync(e, w), 0);
	}
	/* the last V write is still queued behind a 4 MiB copy when the step ends */
	assert_int_equal(kvt_batch_release(bat, w), 0);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0); /* D2H now */
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_engine_stream_sync(e, w), 0);
	assert_int_equal(tsup_verify(e, a, 9), 0); /* comes back from HOST */
	kvt_engine_stream_destroy(e, w);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
}

/* (b) a freed HBM slot handed to another sequence's promotion while a reader still holds it
 * must not change what that reader sees. */
static void
test_scenario_b_reader_keeps_slot(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 1, .host_blocks = 4, .bandwidth = 64u << 20 };
	struct kvt_block_table bt;
	struct kvt_engine *e;
	struct kvt_batch *bat;
	static char big_src[4 << 20], big_dst[4 << 20];
	float seen[TSUP_HEADS * TSUP_DIM];
	kvt_seq_id a, b;
	void *r, *k;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	b = seq_with(e, 2, 4);
	assert_int_equal(kvt_seq_park(e, b, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	a = seq_with(e, 1, 4);
	assert_int_equal(kvt_engine_stream_create(e, &r), 0);
	assert_int_equal(kvt_batch_prepare(e, &a, 1, &bat), 0);
	assert_int_equal(kvt_batch_block_table(bat, &bt), 0);
	kvt_kv_addr(&bt.geo, 0, (int64_t)bt.indices[0] * TSUP_TPB, &k, NULL);
	/* the reader ("kernel") reads A's slot late, behind other work on its stream */
	assert_int_equal(kvt_engine_stream_memcpy_async(e, r, big_dst, big_src, sizeof big_src), 0);
	assert_int_equal(kvt_engine_stream_memcpy_async(e, r, seen, k, sizeof seen), 0);
	assert_int_equal(kvt_batch_release(bat, r), 0);
	/* B's promotion needs the only HBM slot: A is demoted, B copied in */
	assert_int_equal(tsup_verify(e, b, 2), 0);
	assert_int_equal(kvt_engine_stream_sync(e, r), 0);
	assert_true(seen[5] == tsup_val(1, 0, 0, 0, 5));
	assert_int_equal(tsup_verify(e, a, 1), 0);
	kvt_engine_stream_destroy(e, r);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
}

/* (c) a block found in HOST and then chosen for eviction before it is promoted must stay
 * pinned by the lookup or fail cleanly, never serve other bytes. With one HBM and one HOST
 * slot, promoting A (HOST+NVMe) means evicting dirty B, whose demotion wants A's HOST slot. */
static void
test_scenario_c_lookup_pins(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 1, .host_blocks = 1, .nvme_blocks = 16 };
	struct kvt_engine *e;
	struct kvt_batch *bat = NULL;
	kvt_seq_id a, b;
	int rc;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	a = seq_with(e, 1, 4);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	b = seq_with(e, 2, 4); /* dirty in HBM */
	assert_int_equal(tsup_verify(e, b, 2), 0);
	/* resume: NVMe -> HOST, then HOST -> HBM when room can be made */
	assert_int_equal(kvt_seq_resume(e, a), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	tsup_check_engine(e);
	rc = tsup_verify(e, a, 1);
	assert_true(rc == 0 || rc == -ENOSPC); /* never 1: other bytes */
	tsup_check_engine(e);
	assert_int_equal(tsup_verify(e, b, 2), 0);
	rc = kvt_batch_prepare(e, &a, 1, &bat);
	assert_true(rc == 0 || rc == -ENOSPC);
	if (rc == 0)
		assert_int_equal(kvt_batch_release(bat, NULL), 0);
	assert_int_equal(kvt_seq_close(e, b), 0);
	assert_int_equal(tsup_verify(e, a, 1), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* (c) again, on the path that waits: appending to A's partial block found in HOST (and NVMe)
 * while HBM holds dirty B and HOST has one slot. Making room for A in HBM means demoting B,
 * which wants A's HOST slot; the lookup's pin must keep it (the append then fails cleanly),
 * or A would be copied up from a slot that now holds B. */
static void
test_scenario_c_append_lookup(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 1, .host_blocks = 1, .nvme_blocks = 16,
			      .no_watermarks = true };
	struct kvt_seq_info info;
	struct kvt_engine *e;
	kvt_seq_id a, b;
	int rc;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	a = seq_with(e, 1, 2);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_verify(e, a, 1), 0);             /* now in HBM, HOST and NVMe */
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0); /* HBM copy dropped */
	assert_int_equal(kvt_seq_info(e, a, &info), 0);
	assert_int_equal(info.blocks_in[KVT_TIER_HOST], 1);
	assert_int_equal(info.blocks_in[KVT_TIER_NVME], 1);
	b = seq_with(e, 2, 4); /* dirty in the only HBM slot */
	assert_int_equal(tsup_verify(e, b, 2), 0);
	rc = tsup_append_write(e, a, 1, 2, 1);
	assert_true(rc == 0 || rc == -ENOSPC);
	tsup_check_engine(e);
	assert_int_equal(tsup_verify(e, b, 2), 0);
	assert_int_equal(kvt_seq_close(e, b), 0);
	if (rc)
		assert_int_equal(tsup_append_write(e, a, 1, 2, 1), 0);
	assert_int_equal(tsup_verify(e, a, 1), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* The packed copy state: 2 bits per tier, a stale INFLIGHT copy reads as INFLIGHT and is told
 * apart only by kvt_copy_stale(); setting a state clears the stale mark; tiers are independent. */
static void
test_copy_state_packing(void **state)
{
	struct kvt_block b;
	int t;

	(void)state;
	memset(&b, 0, sizeof b);
	for (t = 0; t < KVT_TIER_COUNT; t++)
		assert_int_equal(kvt_copy_state(&b, t), KVT_COPY_ABSENT);
	kvt_copy_state_set(&b, KVT_TIER_HBM, KVT_COPY_PRESENT);
	kvt_copy_state_set(&b, KVT_TIER_NVME, KVT_COPY_INFLIGHT);
	kvt_copy_mark_stale(&b, KVT_TIER_HBM); /* PRESENT: no effect */
	kvt_copy_mark_stale(&b, KVT_TIER_HOST); /* ABSENT: no effect */
	kvt_copy_mark_stale(&b, KVT_TIER_NVME);
	assert_int_equal(kvt_copy_state(&b, KVT_TIER_HBM), KVT_COPY_PRESENT);
	assert_int_equal(kvt_copy_state(&b, KVT_TIER_HOST), KVT_COPY_ABSENT);
	assert_int_equal(kvt_copy_state(&b, KVT_TIER_NVME), KVT_COPY_INFLIGHT);
	assert_false(kvt_copy_stale(&b, KVT_TIER_HBM));
	assert_false(kvt_copy_stale(&b, KVT_TIER_HOST));
	assert_true(kvt_copy_stale(&b, KVT_TIER_NVME));
	assert_false(kvt_copy_valid(&b, KVT_TIER_NVME));
	kvt_copy_state_set(&b, KVT_TIER_NVME, KVT_COPY_INFLIGHT); /* a new transfer: current */
	assert_false(kvt_copy_stale(&b, KVT_TIER_NVME));
	kvt_copy_mark_stale(&b, KVT_TIER_NVME);
	kvt_copy_state_set(&b, KVT_TIER_NVME, KVT_COPY_ABSENT);
	assert_int_equal(kvt_copy_state(&b, KVT_TIER_NVME), KVT_COPY_ABSENT);
	assert_int_equal(kvt_copy_state(&b, KVT_TIER_HBM), KVT_COPY_PRESENT);
	b.busy = KVT_BUSY_MAX; /* one transfer per destination tier fits */
	assert_int_equal(b.busy, KVT_TIER_COUNT);
	b.index = KVT_SEQ_MAX_BLOCKS - 1u;
	assert_int_equal(b.index, KVT_SEQ_MAX_BLOCKS - 1u);
	b.tslot = KVT_MAX_BUDGETS;
	assert_int_equal(b.tslot, KVT_MAX_BUDGETS);
	assert_int_equal(kvt_copy_state(&b, KVT_TIER_HBM), KVT_COPY_PRESENT);
}

/* Invariant 3 at the unit level: which copies may reclaim pick. */
static void
test_inv3_copy_evictable_rules(void **state)
{
	struct kvt_block b;

	(void)state;
	memset(&b, 0, sizeof b);
	b.live = 1;
	b.written = 1;
	kvt_copy_state_set(&b, KVT_TIER_HBM, KVT_COPY_PRESENT);
	kvt_copy_state_set(&b, KVT_TIER_HOST, KVT_COPY_PRESENT);
	assert_true(kvt_copy_evictable(&b, KVT_TIER_HBM));
	b.busy = 1; /* a transfer in flight: never */
	assert_false(kvt_copy_evictable(&b, KVT_TIER_HBM));
	assert_false(kvt_copy_evictable(&b, KVT_TIER_HOST));
	b.busy = 0;
	b.pins = 1; /* pinned: never its HBM copy; its clean HOST duplicate may go */
	assert_false(kvt_copy_evictable(&b, KVT_TIER_HBM));
	assert_true(kvt_copy_evictable(&b, KVT_TIER_HOST));
	/* ... but not before HBM holds it */
	kvt_copy_state_set(&b, KVT_TIER_HBM, KVT_COPY_INFLIGHT);
	assert_false(kvt_copy_evictable(&b, KVT_TIER_HOST));
	b.pins = 0;
	b.dead = 1;
	assert_false(kvt_copy_evictable(&b, KVT_TIER_HOST));
}

static int fault_write_res;

static void
fault_on_complete(void *arg, bool is_write, uint32_t slot, void *buf, size_t len, uint64_t off,
		  int *res)
{
	(void)arg, (void)slot, (void)buf, (void)len, (void)off;
	if (is_write && fault_write_res)
		*res = fault_write_res;
}

static const struct kvt_nvme_fault_hooks fault_hooks = { .on_complete = fault_on_complete };

/* (d) a failed NVMe write leaves the block not findable there, and the space and counters
 * rolled back; the block stays where it was. */
static void
test_scenario_d_failed_nvme_write(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 2, .host_blocks = 2, .nvme_blocks = 8 };
	struct kvt_seq_info info;
	struct kvt_engine *e;
	struct kvt_stats st;
	kvt_seq_id a;
	char *dir;
	int errs[2] = { -EIO, -ENOSPC }, i;

	(void)state;
	for (i = 0; i < 2; i++) {
		kvt_test_nvme_hooks = &fault_hooks;
		e = tsup_engine(&c, &dir);
		kvt_test_nvme_hooks = NULL;
		a = seq_with(e, 1, 8);
		fault_write_res = errs[i];
		assert_int_equal(kvt_seq_park(e, a, KVT_TIER_NVME), 0);
		assert_int_equal(kvt_engine_drain(e), 0);
		st = tsup_stats(e);
		assert_int_equal(st.io_errors, 2);
		assert_int_equal(st.blocks_moved[KVT_MOVE_HOST_TO_NVME], 0);
		assert_int_equal(st.tier[KVT_TIER_NVME].used_slots, 0);
		assert_int_equal(st.tier[KVT_TIER_NVME].used_bytes, 0);
		assert_int_equal(kvt_seq_info(e, a, &info), 0);
		assert_int_equal(info.blocks_in[KVT_TIER_NVME], 0);
		assert_int_equal(info.blocks_in[KVT_TIER_HOST], 2); /* still held above */
		tsup_check_engine(e);
		assert_int_equal(tsup_verify(e, a, 1), 0);
		/* the disk works again: the next park lands */
		fault_write_res = 0;
		assert_int_equal(kvt_seq_park(e, a, KVT_TIER_NVME), 0);
		assert_int_equal(kvt_engine_drain(e), 0);
		assert_int_equal(kvt_seq_info(e, a, &info), 0);
		assert_int_equal(info.blocks_in[KVT_TIER_NVME], 2);
		assert_int_equal(tsup_verify(e, a, 1), 0);
		tsup_check_engine(e);
		kvt_engine_destroy(e);
		tsup_rmdir(dir);
	}
}

/*
 * (e) An eviction that waits for room below (the engine lock released) while the victim's own
 * sequence appends to it. HBM holds one slot: B's partial block V, dirty; HOST is full of P's
 * blocks, so A's append, needing V's slot, evicts V, and making room for V in HOST writes one of
 * P's blocks to NVMe and waits. In that wait (the NVMe write's completion hook, the lock
 * free) B appends a token to V: V is write-pinned, its caller writes the token after. The
 * eviction must then leave V alone: a copy of V taken now would be marked current in HOST
 * and miss the token, and B, parked to HOST (which keeps a valid HOST copy and drops HBM), would
 * come back without it. Found by a breaker's 8 threads sharing an engine with NVMe and hints;
 * the test fails without the re-check in kvt_evict_one.
 */
static struct {
	struct kvt_engine *e;
	kvt_seq_id b;
	int armed, go, done, quit, rc;
	int64_t map[1];
	pthread_mutex_t mu;
	pthread_cond_t cv;
} evw = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

/* B's thread: its append, when the hook says go. (The hook runs under the NVMe tier's lock:
 * the append, which takes the engine lock, runs on this thread instead, never under it.) */
static void *
evw_thread(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&evw.mu);
	while (!evw.go && !evw.quit)
		pthread_cond_wait(&evw.cv, &evw.mu);
	if (evw.go) {
		pthread_mutex_unlock(&evw.mu);
		evw.rc = kvt_seq_append(evw.e, evw.b, NULL, 1, evw.map);
		pthread_mutex_lock(&evw.mu);
		evw.done = 1;
		pthread_cond_broadcast(&evw.cv);
	}
	pthread_mutex_unlock(&evw.mu);
	return NULL;
}

/* The first NVMe write completion while armed: B appends (on its thread) before the reaping
 * thread goes on; it can only while that thread has let the engine lock go (the eviction's
 * wait), else the wait times out and the test fails on evw.done. */
static void
evw_complete(void *arg, bool is_write, uint32_t slot, void *buf, size_t len, uint64_t off,
	     int *res)
{
	struct timespec ts;

	(void)arg, (void)slot, (void)buf, (void)len, (void)off, (void)res;
	pthread_mutex_lock(&evw.mu);
	if (is_write && evw.armed && !evw.go) {
		evw.go = 1;
		pthread_cond_broadcast(&evw.cv);
		tsup_deadline_ms(&ts, 5000);
		while (!evw.done)
			if (pthread_cond_timedwait(&evw.cv, &evw.mu, &ts) != 0)
				break;
	}
	pthread_mutex_unlock(&evw.mu);
}

static const struct kvt_nvme_fault_hooks evw_hooks = { .on_complete = evw_complete };

static void
test_scenario_e_eviction_wait_vs_append(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_geometry g;
	struct kvt_engine *e;
	char *dir = tsup_mkdtemp();
	int64_t map[1];
	kvt_seq_id p, a, b;
	uint32_t l, i;
	pthread_t t;
	int rc, done;

	(void)state;
	tsup_opts_init(&o);
	o.hbm_bytes = tsup_block_bytes();
	o.host_bytes = 2 * tsup_block_bytes();
	o.nvme_dir = dir;
	o.nvme_bytes = 16 * ((tsup_block_bytes() + 128 + 4095) / 4096 * 4096);
	o.nvme_workers = 0; /* the waiting thread reaps: the hook runs in the eviction's wait */
	o.high_watermark = o.low_watermark = 1.0f;
	e = tsup_create(&o, &evw_hooks);
	assert_int_equal(kvt_engine_geometry(e, &g), 0);
	p = tsup_seq_written(e, 1, 2 * TSUP_TPB);
	assert_int_equal(kvt_seq_park(e, p, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_blocks_in(e, p, KVT_TIER_HOST), 2);
	assert_int_equal(tsup_blocks_in(e, p, KVT_TIER_HBM), 0);
	assert_int_equal(kvt_seq_open(e, NULL, &b), 0);
	assert_int_equal(tsup_append_write(e, b, 2, 0, 1), 0);
	assert_int_equal(tsup_verify(e, b, 2), 0); /* V: in HBM alone, unpinned */
	assert_int_equal(kvt_seq_open(e, NULL, &a), 0);
	evw.e = e;
	evw.b = b;
	assert_int_equal(pthread_create(&t, NULL, evw_thread, NULL), 0);
	pthread_mutex_lock(&evw.mu);
	evw.armed = 1;
	pthread_mutex_unlock(&evw.mu);
	rc = kvt_seq_append(e, a, NULL, 1, map);
	pthread_mutex_lock(&evw.mu);
	evw.armed = 0;
	done = evw.done;
	evw.quit = 1;
	pthread_cond_broadcast(&evw.cv);
	pthread_mutex_unlock(&evw.mu);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_equal(done, 1); /* B appended inside the eviction's wait */
	assert_int_equal(evw.rc, 0);
	assert_true(rc == 0 || rc == -ENOSPC);
	/* B's caller writes its token now, through the mapping of its append */
	for (l = 0; l < TSUP_LAYERS; l++) {
		float *k, *v;

		kvt_kv_addr(&g, l, evw.map[0], (void **)&k, (void **)&v);
		for (i = 0; i < TSUP_HEADS * TSUP_DIM; i++) {
			k[i] = tsup_val(2, 1, l, 0, i);
			v[i] = tsup_val(2, 1, l, 1, i);
		}
	}
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_verify(e, b, 2), 0); /* the release unpins V */
	assert_int_equal(kvt_seq_close(e, a), 0);
	assert_int_equal(kvt_seq_park(e, b, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_verify(e, b, 2), 0); /* back from HOST with both tokens */
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* Closing a sequence while its transfers are in flight frees the slots only after they land. */
static void
test_close_with_transfers_in_flight(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 2, .host_blocks = 2, .nvme_blocks = 8,
			      .bandwidth = SLOW_BW };
	struct kvt_engine *e;
	kvt_seq_id a, b;
	char *dir;

	(void)state;
	e = tsup_engine(&c, &dir);
	a = seq_with(e, 1, 8);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_NVME), 0);
	assert_true(tsup_stats(e).transfers_in_flight > 0);
	assert_int_equal(kvt_seq_close(e, a), 0);
	tsup_check_engine(e);
	b = seq_with(e, 2, 8);
	assert_int_equal(tsup_verify(e, b, 2), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	{
		struct kvt_seq_info info;

		/* whatever HOST holds now is B's (demoted under the watermark), nothing of A */
		assert_int_equal(kvt_seq_info(e, b, &info), 0);
		assert_int_equal(tsup_stats(e).tier[KVT_TIER_HOST].used_slots,
				 info.blocks_in[KVT_TIER_HOST]);
		assert_int_equal(tsup_stats(e).tier[KVT_TIER_NVME].used_slots, 0);
	}
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_inv1_no_slot_reuse_in_flight),
		cmocka_unit_test(test_inv2_pinned_after_copy_complete),
		cmocka_unit_test(test_inv3_no_eviction_of_pinned),
		cmocka_unit_test(test_inv4_dirty_demoted_first),
		cmocka_unit_test(test_inv5_nvme_reads_verified),
		cmocka_unit_test(test_inv6_sealed_blocks_immutable),
		cmocka_unit_test(test_scenario_a_copy_after_queued_write),
		cmocka_unit_test(test_scenario_b_reader_keeps_slot),
		cmocka_unit_test(test_scenario_c_lookup_pins),
		cmocka_unit_test(test_scenario_c_append_lookup),
		cmocka_unit_test(test_copy_state_packing),
		cmocka_unit_test(test_inv3_copy_evictable_rules),
		cmocka_unit_test(test_scenario_d_failed_nvme_write),
		cmocka_unit_test(test_close_with_transfers_in_flight),
		cmocka_unit_test(test_scenario_e_eviction_wait_vs_append),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
