/* SPDX-License-Identifier: MIT */
/*
 * tests/test_nvme_work_room.c - one-IO zero-copy writes from the HOST slot's header room
 * (kvt_nvme_opts.host_data_off, tiers/tier_nvme.h): a raw put is ONE IO [header page | data]
 * from the HOST slot (inline and with workers, which seal the header page into the room), the
 * room holds exactly the header page that lands on disk, a short write is continued, two puts of
 * one HOST slot at once fall back to the two-IO path, a refused registration stages and leaves the
 * room alone, a failed one-IO put leaves the slot unknown, and without room a put stays two
 * IOs. Through the engine: large blocks get the room (small ones do not), park writes one IO per
 * block, and the persistent store restores and verifies those blocks after a restart. Named
 * nvme_work_*: runs in the concurrency label (TSan).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine_impl.h"
#include "support/kvt_test.h"
#include "tiers/format.h"
#include "tiers/tier_nvme.h"

#define BLOCK 10000u   /* not a 4 KiB multiple: the data is rounded up to DATA */
#define DATA 12288u    /* round_up(BLOCK, 4096) */
#define HSTRIDE 16384u /* HOST slot: header room + DATA */
#define SLOT 16384u    /* disk slot: header page + DATA */
#define NSLOTS 8u
#define HSLOTS 4u
#define QD 4u
#define ROOM_FILL 0xa5 /* what the header room holds before the tier writes it */

/* The fixture's HOST memory (f->host) is HSLOTS * HSTRIDE bytes: the "HOST tier". */
static int
rfx_setup(void **state)
{
	struct tsup_nvme_fx *f;

	if (tsup_nvme_fx_setup(state, (size_t)HSLOTS * HSTRIDE, "nvmeroom") != 0)
		return -1;
	f = *state;
	memset(f->host, ROOM_FILL, (size_t)HSLOTS * HSTRIDE);
	return 0;
}

/* The fault hook: counts pieces (writes), cuts the first write piece short when asked. */
static struct {
	bool cut;          /* cut the first write piece to half */
	bool eio;          /* fail every write with -EIO */
	unsigned wpieces;  /* write pieces seen */
	size_t first_len;  /* bytes of the first write piece */
} rf;

static void
rf_hook(void *arg, bool is_write, uint32_t slot, void *buf, size_t len, uint64_t off, int *res)
{
	(void)arg, (void)slot, (void)buf, (void)off;
	if (!is_write || *res < 0)
		return;
	if (rf.eio)
		*res = -EIO;
	if (rf.wpieces++ == 0) {
		rf.first_len = len;
		if (rf.cut)
			*res = (int)(len / 2); /* continued from the last 4 KiB boundary */
	}
}

/* The HOST slot @i's data (its header room is the 4 KiB before). */
static uint8_t *
hdata(struct tsup_nvme_fx *f, uint32_t i)
{
	return f->host + (size_t)i * HSTRIDE + KVT_FMT_HDR_PAGE;
}

static struct kvt_nvme *
ropen(struct tsup_nvme_fx *f, size_t data_off, bool refuse, uint32_t workers)
{
	static struct kvt_nvme_fault_hooks hooks;
	struct kvt_nvme_opts o = {
		.dir = f->dir,
		.capacity_bytes = (uint64_t)NSLOTS * SLOT,
		.block_bytes = BLOCK,
		.queue_depth = QD,
		.hooks = &hooks,
		.host_base = f->host,
		.host_len = (size_t)HSLOTS * HSTRIDE,
		.host_stride = HSTRIDE,
		.host_data_off = data_off,
		.workers = workers,
	};
	struct kvt_nvme *n = NULL;

	memset(&rf, 0, sizeof rf);
	hooks = (struct kvt_nvme_fault_hooks){ .on_complete = rf_hook, .refuse_register = refuse };
	assert_int_equal(kvt_nvme_open(&o, &n, NULL, 0), 0);
	assert_int_equal(kvt_nvme_slot_bytes(n), SLOT);
	return n;
}

static void
rput(struct kvt_nvme *n, uint32_t slot, const void *src)
{
	struct kvt_nvme_wmeta m = { .session = 9, .index = slot };

	assert_int_equal(kvt_nvme_put(n, slot, src, &m, slot), 0);
	tsup_nvme_reap_all(n, 1, 0);
}

static void
rget(struct kvt_nvme *n, uint32_t slot, void *dst)
{
	assert_int_equal(kvt_nvme_get(n, slot, dst, slot), 0);
	tsup_nvme_reap_all(n, 1, 0);
}

static void
fill(uint8_t *p, size_t len, uint32_t seed)
{
	for (size_t i = 0; i < len; i++)
		p[i] = (uint8_t)((i * 131u + seed * 7u) ^ (i >> 9));
}

/* Bytes [off, off + len) of the tier's file. */
static void
file_bytes(struct kvt_nvme *n, uint64_t off, void *out, size_t len)
{
	int fd = open(kvt_nvme_path(n), O_RDONLY);

	assert_true(fd >= 0);
	assert_int_equal(pread(fd, out, len, (off_t)off), (ssize_t)len);
	close(fd);
}

/* One put from HOST slot 0 with header room: one IO of the whole disk slot; the room holds the
 * header page that is on disk, byte for byte; the block reads back zero-copy. */
static void
room_one_io(struct tsup_nvme_fx *f, uint32_t workers)
{
	struct kvt_nvme *n = ropen(f, KVT_FMT_HDR_PAGE, false, workers);
	uint8_t disk[SLOT], *room = hdata(f, 0) - KVT_FMT_HDR_PAGE;
	struct kvt_nvme_stats st;
	struct kvt_fmt_blkhdr h, hr;
	struct kvt_nvme_slotinfo si;

	assert_true(kvt_nvme_zero_copy(n));
	fill(hdata(f, 0), BLOCK, 1 + workers);
	rput(n, 5, hdata(f, 0));
	kvt_nvme_get_stats(n, &st);
	assert_int_equal(st.zc_writes, 1);
	assert_int_equal(st.zc_one_io, 1);
	assert_int_equal(st.sqes, 1); /* one IO, where the two-IO path takes 2 */
	assert_int_equal(rf.wpieces, 1);
	assert_int_equal(rf.first_len, SLOT);
	/* the room is the header page on disk, and the data follow it */
	file_bytes(n, KVT_FMT_DATA_OFF + 5ull * SLOT, disk, SLOT);
	assert_memory_equal(disk, room, KVT_FMT_HDR_PAGE);
	assert_memory_equal(disk + KVT_FMT_HDR_PAGE, hdata(f, 0), BLOCK);
	assert_int_equal(kvt_fmt_blkhdr_decode(room, KVT_FMT_HDR_PAGE, &hr), 0);
	assert_int_equal(kvt_nvme_read_header(n, 5, &h), 0);
	assert_true(kvt_nvme_slot_info(n, 5, &si));
	assert_int_equal(kvt_fmt_write_tag(h.key), si.tag);
	assert_int_equal(hr.key, h.key);
	assert_int_equal(si.lenc, kvt_fmt_lenc(KVT_CODEC_NONE, BLOCK, BLOCK));
	assert_int_equal(hr.slot, 5);
	assert_int_equal(hr.session, 9);
	assert_int_equal(hr.stored_len, BLOCK);
	/* read back into HOST slot 1: one IO, the header page into its room (checked there) */
	memset(hdata(f, 1), 0, DATA);
	rget(n, 5, hdata(f, 1));
	assert_memory_equal(hdata(f, 1), hdata(f, 0), BLOCK);
	assert_memory_equal(hdata(f, 1) - KVT_FMT_HDR_PAGE, disk, KVT_FMT_HDR_PAGE);
	kvt_nvme_get_stats(n, &st);
	assert_int_equal(st.zc_reads, 1);
	assert_int_equal(st.sqes, 2);
	assert_int_equal(st.staged_writes + st.staged_reads, 0);
	kvt_nvme_close(n);
}

static void
test_one_io_inline(void **state)
{
	room_one_io(*state, 0);
}

static void
test_one_io_workers(void **state)
{
	room_one_io(*state, 2);
}

/* A one-IO put cut short is continued from the last 4 KiB boundary and lands whole. */
static void
test_one_io_short_write(void **state)
{
	struct tsup_nvme_fx *f = *state;
	struct kvt_nvme *n = ropen(f, KVT_FMT_HDR_PAGE, false, 0);
	struct kvt_nvme_stats st;

	fill(hdata(f, 2), BLOCK, 3);
	rf.cut = true;
	rput(n, 1, hdata(f, 2));
	assert_int_equal(rf.wpieces, 2);
	kvt_nvme_get_stats(n, &st);
	assert_int_equal(st.zc_one_io, 1);
	assert_int_equal(st.sqes, 2);
	rget(n, 1, hdata(f, 3));
	assert_memory_equal(hdata(f, 3), hdata(f, 2), BLOCK);
	kvt_nvme_close(n);
}

/* A one-IO put that fails (EIO) completes with the error and leaves the slot unknown (a get is
 * refused); the next put of it lands. */
static void
test_one_io_eio(void **state)
{
	struct tsup_nvme_fx *f = *state;
	struct kvt_nvme *n = ropen(f, KVT_FMT_HDR_PAGE, false, 2);
	struct kvt_nvme_wmeta m = { .session = 2 };
	struct kvt_nvme_cqe c;

	fill(hdata(f, 1), BLOCK, 7);
	rf.eio = true;
	assert_int_equal(kvt_nvme_put(n, 6, hdata(f, 1), &m, 6), 0);
	assert_int_equal(kvt_nvme_reap(n, &c, 1, true), 1);
	assert_int_equal(c.res, -EIO);
	assert_int_equal(kvt_nvme_get(n, 6, hdata(f, 2), 6), KVT_ECORRUPT);
	rf.eio = false;
	rput(n, 6, hdata(f, 1));
	rget(n, 6, hdata(f, 2));
	assert_memory_equal(hdata(f, 2), hdata(f, 1), BLOCK);
	kvt_nvme_close(n);
}

/* Two puts of one HOST slot in flight at once: the second does not share the room (two IOs);
 * both land and read back. */
static void
test_same_slot_twice(void **state)
{
	struct tsup_nvme_fx *f = *state;
	struct kvt_nvme *n = ropen(f, KVT_FMT_HDR_PAGE, false, 0);
	struct kvt_nvme_wmeta m = { .session = 1 };
	struct kvt_nvme_stats st;

	fill(hdata(f, 0), BLOCK, 4);
	assert_int_equal(kvt_nvme_put(n, 2, hdata(f, 0), &m, 2), 0);
	assert_int_equal(kvt_nvme_put(n, 3, hdata(f, 0), &m, 3), 0);
	tsup_nvme_reap_all(n, 2, 0);
	kvt_nvme_get_stats(n, &st);
	assert_int_equal(st.zc_writes, 2);
	assert_int_equal(st.zc_one_io, 1);
	assert_int_equal(st.sqes, 3);
	rget(n, 2, hdata(f, 1));
	assert_memory_equal(hdata(f, 1), hdata(f, 0), BLOCK);
	rget(n, 3, hdata(f, 2));
	assert_memory_equal(hdata(f, 2), hdata(f, 0), BLOCK);
	kvt_nvme_close(n);
}

/* Registration refused: puts go through staging, the room is never written. */
static void
test_room_refused_registration(void **state)
{
	struct tsup_nvme_fx *f = *state;
	struct kvt_nvme *n = ropen(f, KVT_FMT_HDR_PAGE, true, 0);
	uint8_t room[KVT_FMT_HDR_PAGE];
	struct kvt_nvme_stats st;

	assert_false(kvt_nvme_zero_copy(n));
	fill(hdata(f, 0), BLOCK, 5);
	memset(room, ROOM_FILL, sizeof room);
	rput(n, 0, hdata(f, 0));
	rget(n, 0, hdata(f, 1));
	assert_memory_equal(hdata(f, 1), hdata(f, 0), BLOCK);
	assert_memory_equal(hdata(f, 0) - KVT_FMT_HDR_PAGE, room, sizeof room);
	kvt_nvme_get_stats(n, &st);
	assert_int_equal(st.zc_writes + st.zc_reads + st.zc_one_io, 0);
	assert_int_equal(st.staged_writes, 1);
	kvt_nvme_close(n);
}

/* Without room (data at the slot start) a zero-copy put stays two IOs; a bad offset means no
 * zero-copy, with the reason. */
static void
test_no_room_two_ios(void **state)
{
	struct tsup_nvme_fx *f = *state;
	struct kvt_nvme *n = ropen(f, 0, false, 0);
	struct kvt_nvme_stats st;

	fill(f->host, BLOCK, 6);
	rput(n, 4, f->host);
	kvt_nvme_get_stats(n, &st);
	assert_int_equal(st.zc_writes, 1);
	assert_int_equal(st.zc_one_io, 0);
	assert_int_equal(st.sqes, 2);
	assert_int_equal(rf.wpieces, 2);
	assert_int_equal(rf.first_len, KVT_FMT_HDR_PAGE);
	kvt_nvme_close(n);
	n = ropen(f, 512, false, 0);
	assert_false(kvt_nvme_zero_copy(n));
	assert_non_null(strstr(kvt_nvme_zc_reason(n), "offset"));
	kvt_nvme_close(n);
}

/* ---- through the engine -------------------------------------------------------------------- */

#define E_LAYERS 4u /* 4 layers x 2 KV heads x 64 dims x f32 x 16 tokens x K,V: 64 KiB blocks */
#define E_TPB 16u
#define E_BLOCKS 4u

static struct kvt_engine *
room_engine(const char *dir, uint32_t layers)
{
	struct kvt_engine_opts o;
	struct kvt_engine *e = NULL;
	uint64_t bb = 2ull * layers * 2 * 64 * 4 * E_TPB;

	kvt_engine_opts_init(&o, sizeof o);
	o.layout = (struct kvt_layout){ .n_layers = layers, .n_kv_heads = 2, .head_dim = 64,
					.dtype = KVT_DTYPE_F32, .tokens_per_block = E_TPB };
	o.hbm_bytes = (E_BLOCKS + 1) * bb;
	o.host_bytes = 8 * bb;
	o.nvme_dir = dir;
	o.nvme_bytes = 16 * (bb + 8192);
	o.nvme_persist = 1;
	o.high_watermark = o.low_watermark = 1.0f;
	if (kvt_engine_create(&o, &e))
		print_error("kvt_engine_create: %s\n", kvt_last_error_message());
	assert_non_null(e);
	return e;
}

/* Blocks under KVT_HOST_ROOM_MIN_BLOCK (here 32 KiB) keep the data at the HOST slot start. */
static void
test_engine_small_blocks_no_room(void **state)
{
	char *dir = tsup_mkdtemp();
	struct kvt_engine *e = room_engine(dir, 2); /* 32 KiB blocks */

	(void)state;
	assert_int_equal(e->block_bytes, 32768);
	assert_int_equal(e->host_data_off, 0);
	assert_int_equal(e->host_stride, 32768);
	assert_ptr_equal(kvt_slot_addr(e, KVT_TIER_HOST, 1), (char *)e->host_base + 32768);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* 64 KiB blocks: HOST slots have the room; a park writes one IO per block; after a restart the
 * session restores (its on-disk headers checked against the journal) and reads back intact. */
static void
test_engine_park_one_io_restore(void **state)
{
	char *dir = tsup_mkdtemp();
	struct kvt_engine *e = room_engine(dir, E_LAYERS);
	struct kvt_seq_opts so;
	struct kvt_nvme_stats st;
	struct kvt_geometry g;
	struct kvt_block_table bt;
	struct kvt_batch *b = NULL;
	int64_t map[E_BLOCKS * E_TPB];
	uint8_t *want;
	kvt_seq_id s;

	(void)state;
	assert_int_equal(e->block_bytes, 65536);
	assert_int_equal(e->host_data_off, KVT_FMT_HDR_PAGE);
	assert_int_equal(e->host_stride, 65536 + KVT_FMT_HDR_PAGE);
	assert_ptr_equal(kvt_slot_addr(e, KVT_TIER_HOST, 2),
			 (char *)e->host_base + 2 * (65536 + KVT_FMT_HDR_PAGE) + KVT_FMT_HDR_PAGE);
	assert_true(kvt_nvme_zero_copy(e->nvme));
	want = malloc((size_t)E_BLOCKS * 65536);
	assert_non_null(want);
	fill(want, (size_t)E_BLOCKS * 65536, 11);
	kvt_seq_opts_init(&so, sizeof so);
	so.session_key = 77;
	assert_int_equal(kvt_seq_open(e, &so, &s), 0);
	assert_int_equal(kvt_seq_append(e, s, NULL, E_BLOCKS * E_TPB, map), 0);
	assert_int_equal(kvt_engine_geometry(e, &g), 0);
	for (uint32_t i = 0; i < E_BLOCKS; i++)
		memcpy((uint8_t *)g.hbm_base + (uint64_t)(map[i * E_TPB] / E_TPB) * g.block_bytes,
		       want + (size_t)i * 65536, 65536);
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	kvt_nvme_get_stats(e->nvme, &st);
	assert_int_equal(st.zc_writes, E_BLOCKS);
	assert_int_equal(st.zc_one_io, E_BLOCKS);
	assert_int_equal(st.sqes, E_BLOCKS);
	tsup_check_engine(e);
	kvt_engine_destroy(e);

	e = room_engine(dir, E_LAYERS);
	assert_int_equal(kvt_seq_restore(e, 77, NULL, &s), 0);
	assert_int_equal(kvt_seq_resume(e, s), 0);
	assert_int_equal(kvt_batch_prepare(e, &s, 1, &b), 0);
	assert_int_equal(kvt_batch_wait_layer(b, E_LAYERS - 1, NULL), 0);
	assert_int_equal(kvt_batch_block_table(b, &bt), 0);
	assert_int_equal(kvt_engine_geometry(e, &g), 0);
	for (uint32_t i = 0; i < E_BLOCKS; i++)
		assert_memory_equal((uint8_t *)g.hbm_base +
				    (uint64_t)bt.indices[bt.indptr[0] + i] * g.block_bytes,
				    want + (size_t)i * 65536, 65536);
	assert_int_equal(kvt_batch_release(b, NULL), 0);
	kvt_nvme_get_stats(e->nvme, &st);
	assert_int_equal(st.zc_reads, E_BLOCKS);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	free(want);
	tsup_rmdir(dir);
}

#define RFX_TEST(t) cmocka_unit_test_setup_teardown(t, rfx_setup, tsup_nvme_fx_teardown)

int
main(void)
{
	const struct CMUnitTest tests[] = {
		RFX_TEST(test_one_io_inline),
		RFX_TEST(test_one_io_workers),
		RFX_TEST(test_one_io_short_write),
		RFX_TEST(test_one_io_eio),
		RFX_TEST(test_same_slot_twice),
		RFX_TEST(test_room_refused_registration),
		RFX_TEST(test_no_room_two_ios),
		cmocka_unit_test(test_engine_small_blocks_no_room),
		cmocka_unit_test(test_engine_park_one_io_restore),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
