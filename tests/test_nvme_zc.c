/* SPDX-License-Identifier: MIT */
/*
 * tests/test_nvme_zc.c - the NVME tier's zero-copy path and slot table (tiers/tier_nvme.h):
 * kvt_nvme_put/get of raw blocks move straight between registered HOST memory and the disk
 * (counted as zero-copy IOs), the refused registration falls back to staging with a reason, and
 * short IO, bit flips and unknown slots on the new path are continued or detected. Also the
 * engine: parking to NVMe and resuming goes zero-copy, and the slot table is in its metadata; a
 * zero-copy read that timed out keeps its HOST slot quarantined until its late completion, and
 * an append does not free the HOST slot a zero-copy write still reads.
 */
#include <errno.h>
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

#include <xxhash.h>

#include "engine/engine_impl.h"
#include "support/kvt_test.h"
#include "tiers/format.h"
#include "tiers/tier_nvme.h"

#define BLOCK 10000u  /* not a 4 KiB multiple: the HOST stride is rounded up */
#define STRIDE 12288u /* round_up(BLOCK, 4096) */
#define SLOT 16384u   /* header page + STRIDE */
#define NSLOTS 8u
#define HSLOTS 4u     /* HOST slots */
#define QD 4u

/* The fixture's HOST memory (f->host) is HSLOTS * SLOT bytes: the "HOST tier", slots of STRIDE
 * bytes without header room (zopen) or of SLOT bytes with it (zopen_room). */
static int
zfx_setup(void **state)
{
	return tsup_nvme_fx_setup(state, (size_t)HSLOTS * SLOT, "nvmezc");
}

/* A fault hook: on the chosen kind of IO, flip a byte or cut the piece short. */
static struct {
	int mode;        /* 0 none, 1 flip in reads, 2 half a read piece, 3 zero bytes (reads),
			    4 half a write's payload piece */
	unsigned hits;   /* pieces changed */
	unsigned pieces; /* pieces seen (reads and writes) */
} zf;

static void
zf_hook(void *arg, bool is_write, uint32_t slot, void *buf, size_t len, uint64_t off, int *res)
{
	(void)arg, (void)slot;
	zf.pieces++;
	if (*res < 0)
		return;
	if (zf.mode == 1 && !is_write) {
		((uint8_t *)buf)[len / 2] ^= 0x04;
		zf.hits++;
	} else if ((zf.mode == 2 && !is_write && !zf.hits) ||
		   (zf.mode == 4 && is_write && (off - KVT_FMT_DATA_OFF) % SLOT != 0 && !zf.hits)) {
		*res = (int)(len / 2); /* continued from the last 4 KiB boundary */
		zf.hits++;
	} else if (zf.mode == 3 && !is_write) {
		*res = 0;
		zf.hits++;
	}
}

/* Open the tier over the fixture's HOST memory: HOST slots of STRIDE bytes, no header room
 * (@room false: a get reads through staging), or of SLOT bytes whose data start 4 KiB in (true:
 * a get of a raw block is one zero-copy IO into the room and the slot; the data of HOST slot i
 * are at zdata(f, i, true)). */
static struct kvt_nvme *
zopen_room(struct tsup_nvme_fx *f, bool refuse, int codec, bool room)
{
	static struct kvt_nvme_fault_hooks hooks;
	struct kvt_nvme_opts o = {
		.dir = f->dir,
		.capacity_bytes = (uint64_t)NSLOTS * SLOT,
		.block_bytes = BLOCK,
		.queue_depth = QD,
		.codec = codec,
		.hooks = &hooks,
		.host_base = f->host,
		.host_len = (size_t)HSLOTS * (room ? SLOT : STRIDE),
		.host_stride = room ? SLOT : STRIDE,
		.host_data_off = room ? KVT_FMT_HDR_PAGE : 0,
	};
	struct kvt_nvme *n = NULL;

	memset(&zf, 0, sizeof zf);
	hooks = (struct kvt_nvme_fault_hooks){ .on_complete = zf_hook, .refuse_register = refuse };
	assert_int_equal(kvt_nvme_open(&o, &n, NULL, 0), 0);
	assert_int_equal(kvt_nvme_slot_bytes(n), SLOT);
	return n;
}

static struct kvt_nvme *
zopen(struct tsup_nvme_fx *f, bool refuse, int codec)
{
	return zopen_room(f, refuse, codec, false);
}

/* The data of HOST slot @i. */
static uint8_t *
zdata(struct tsup_nvme_fx *f, uint32_t i, bool room)
{
	return room ? f->host + (size_t)i * SLOT + KVT_FMT_HDR_PAGE : f->host + (size_t)i * STRIDE;
}

static int
zwait(struct kvt_nvme *n, uint64_t ud)
{
	struct kvt_nvme_cqe c;

	assert_int_equal(kvt_nvme_reap(n, &c, 1, true), 1);
	assert_int_equal(c.user_data, ud);
	return c.res;
}

static int
zput(struct kvt_nvme *n, uint32_t slot, const void *src)
{
	struct kvt_nvme_wmeta m = { .session = 5, .index = slot };

	assert_int_equal(kvt_nvme_put(n, slot, src, &m, 10 + slot), 0);
	return zwait(n, 10 + slot);
}

static int
zget(struct kvt_nvme *n, uint32_t slot, void *dst)
{
	assert_int_equal(kvt_nvme_get(n, slot, dst, 20 + slot), 0);
	return zwait(n, 20 + slot);
}

static void
fill(uint8_t *p, size_t len, uint32_t seed)
{
	for (size_t i = 0; i < len; i++)
		p[i] = (uint8_t)((i * 131u + seed * 7u) ^ (i >> 9));
}

/* A raw put from HOST slot 0 goes zero-copy; a get into HOST slot 1 reads through staging, since
 * every read checks the header page and the slot has no room for it. */
static void
test_zero_copy_round_trip(void **state)
{
	struct tsup_nvme_fx *f = *state;
	struct kvt_nvme *n = zopen(f, false, KVT_CODEC_NONE);
	uint8_t *h0 = f->host, *h1 = f->host + STRIDE;
	struct kvt_nvme_stats st;
	struct kvt_nvme_slotinfo si;
	struct kvt_fmt_blkhdr h;

	assert_true(kvt_nvme_zero_copy(n));
	assert_string_equal(kvt_nvme_zc_reason(n), "");
	fill(h0, BLOCK, 1);
	assert_int_equal(zput(n, 3, h0), 0);
	assert_int_equal(zf.pieces, 2); /* the header page, then the payload */
	memset(h1, 0xee, STRIDE);
	assert_int_equal(zget(n, 3, h1), 0);
	assert_memory_equal(h1, h0, BLOCK);
	kvt_nvme_get_stats(n, &st);
	assert_int_equal(st.zc_writes, 1);
	assert_int_equal(st.zc_reads, 0);
	assert_int_equal(st.staged_writes, 0);
	assert_int_equal(st.staged_reads, 1);
	/* the slot table and the on-disk header agree on the write's tag and length code */
	assert_true(kvt_nvme_slot_info(n, 3, &si));
	assert_int_equal(si.lenc, kvt_fmt_lenc(KVT_CODEC_NONE, BLOCK, BLOCK));
	assert_int_equal(kvt_fmt_lenc_bytes(si.lenc, BLOCK), STRIDE);
	assert_int_equal(kvt_nvme_read_header(n, 3, &h), 0);
	assert_int_equal(h.key, kvt_fmt_write_key(kvt_nvme_epoch(n), 3, h.sum));
	assert_int_equal(si.tag, kvt_fmt_write_tag(h.key));
	assert_int_equal(kvt_nvme_meta_bytes(n), (uint64_t)NSLOTS * 6);
	/* a buffer outside the HOST memory works the same way */
	{
		uint8_t *out = malloc(BLOCK);

		assert_non_null(out);
		assert_int_equal(zget(n, 3, out), 0);
		assert_memory_equal(out, h0, BLOCK);
		free(out);
	}
	kvt_nvme_get_stats(n, &st);
	assert_int_equal(st.staged_reads, 2);
	kvt_nvme_close(n);
}

/* With header room a get of a raw block is ONE zero-copy IO: [header page | payload] straight
 * into the HOST slot's room and data, the header checked there. */
static void
test_zero_copy_get_with_room(void **state)
{
	struct tsup_nvme_fx *f = *state;
	struct kvt_nvme *n = zopen_room(f, false, KVT_CODEC_NONE, true);
	uint8_t *h0 = zdata(f, 0, true), *h1 = zdata(f, 1, true);
	struct kvt_nvme_stats st;
	struct kvt_fmt_blkhdr h;

	fill(h0, BLOCK, 7);
	assert_int_equal(zput(n, 2, h0), 0);
	assert_int_equal(zf.pieces, 1); /* one IO from the room */
	memset(h1 - KVT_FMT_HDR_PAGE, 0xee, SLOT);
	assert_int_equal(zget(n, 2, h1), 0);
	assert_int_equal(zf.pieces, 2); /* one IO into the room */
	assert_memory_equal(h1, h0, BLOCK);
	assert_int_equal(kvt_fmt_blkhdr_decode(h1 - KVT_FMT_HDR_PAGE, KVT_FMT_HDR_PAGE, &h), 0);
	assert_int_equal(h.slot, 2);
	kvt_nvme_get_stats(n, &st);
	assert_int_equal(st.zc_writes, 1);
	assert_int_equal(st.zc_reads, 1);
	assert_int_equal(st.staged_writes + st.staged_reads, 0);
	assert_int_equal(st.sqes, 2);
	kvt_nvme_close(n);
}

/* Registration refused (RLIMIT_MEMLOCK): staging does the same job, and says why. */
static void
test_refused_registration_falls_back(void **state)
{
	struct tsup_nvme_fx *f = *state;
	struct kvt_nvme *n = zopen(f, true, KVT_CODEC_NONE);
	uint8_t *h0 = f->host, *h1 = f->host + STRIDE;
	struct kvt_nvme_stats st;

	assert_false(kvt_nvme_zero_copy(n));
	assert_non_null(strstr(kvt_nvme_zc_reason(n), "RLIMIT_MEMLOCK"));
	fill(h0, BLOCK, 2);
	assert_int_equal(zput(n, 0, h0), 0);
	assert_int_equal(zget(n, 0, h1), 0);
	assert_memory_equal(h1, h0, BLOCK);
	kvt_nvme_get_stats(n, &st);
	assert_int_equal(st.zc_writes + st.zc_reads, 0);
	assert_int_equal(st.staged_writes, 1);
	assert_int_equal(st.staged_reads, 1);
	kvt_nvme_close(n);
}

/* Bit flips and short IO on the zero-copy path (writes from the HOST slot; gets through staging
 * without header room, straight into the room and the slot with it): detected or continued,
 * never served. */
static void
zero_copy_faults(struct tsup_nvme_fx *f, bool room)
{
	struct kvt_nvme *n = zopen_room(f, false, KVT_CODEC_NONE, room);
	uint8_t *h0 = zdata(f, 0, room), *h1 = zdata(f, 1, room);
	struct kvt_nvme_stats st;

	fill(h0, BLOCK, 3);
	zf.mode = 4; /* the payload piece of the write comes back half done: continued */
	assert_int_equal(zput(n, 1, h0), 0);
	assert_int_equal(zf.hits, room ? 0 : 1); /* with room the write is one piece */
	zf.mode = 0;
	assert_int_equal(zget(n, 1, h1), 0);
	assert_memory_equal(h1, h0, BLOCK);
	zf.mode = 1; /* a flipped bit in what the read brought in */
	zf.hits = 0;
	assert_int_equal(zget(n, 1, h1), KVT_ECORRUPT);
	assert_int_equal(zf.hits, 1);
	zf.mode = 2; /* a short read: continued to the end, then verified */
	zf.hits = 0;
	memset(h1, 0, BLOCK);
	assert_int_equal(zget(n, 1, h1), 0);
	assert_int_equal(zf.hits, 1);
	assert_memory_equal(h1, h0, BLOCK);
	zf.mode = 3; /* no progress at all */
	assert_int_equal(zget(n, 1, h1), KVT_ESHORTIO);
	zf.mode = 0;
	/* a slot the table knows no write of is refused before any IO */
	assert_int_equal(kvt_nvme_get(n, 2, h1, 1), KVT_ECORRUPT);
	kvt_nvme_get_stats(n, &st);
	assert_int_equal(st.zc_writes, 1);
	assert_int_equal(st.zc_reads, room ? 4 : 0);
	assert_int_equal(st.staged_reads, room ? 0 : 4);
	kvt_nvme_close(n);
}

static void
test_zero_copy_faults(void **state)
{
	zero_copy_faults(*state, false);
}

static void
test_zero_copy_faults_room(void **state)
{
	zero_copy_faults(*state, true);
}

/* A lost write: the slot table names the latest write, the disk still holds the one before it
 * (same slot, other contents). The header's tag gives it away, with and without room. */
static void
lost_write_caught(struct tsup_nvme_fx *f, bool room)
{
	struct kvt_nvme *n = zopen_room(f, false, KVT_CODEC_NONE, room);
	uint8_t *h0 = zdata(f, 0, room), *h1 = zdata(f, 1, room);
	struct kvt_nvme_slotinfo first, second;

	fill(h0, BLOCK, 11);
	assert_int_equal(zput(n, 6, h0), 0);
	assert_true(kvt_nvme_slot_info(n, 6, &first));
	fill(h0, BLOCK, 12);
	assert_int_equal(zput(n, 5, h0), 0); /* the same bytes written to slot 5 */
	assert_true(kvt_nvme_slot_info(n, 5, &second));
	assert_int_not_equal(first.tag, second.tag);
	/* slot 6 as if its second write (these contents) had been lost */
	assert_int_equal(kvt_nvme_slot_set(n, 6, &(struct kvt_nvme_slotinfo){
		.tag = kvt_fmt_write_tag(kvt_fmt_write_key(kvt_nvme_epoch(n), 6,
							   XXH3_64bits(h0, BLOCK))),
		.lenc = second.lenc }), 0);
	memset(h1, 0, BLOCK);
	assert_int_equal(zget(n, 6, h1), KVT_ECORRUPT);
	assert_non_null(strstr(kvt_last_error_message(), "holds another write"));
	/* the table entry of the write that is there reads fine */
	assert_int_equal(kvt_nvme_slot_set(n, 6, &first), 0);
	assert_int_equal(zget(n, 6, h1), 0);
	fill(h0, BLOCK, 11);
	assert_memory_equal(h1, h0, BLOCK);
	kvt_nvme_close(n);
}

static void
test_lost_write_caught(void **state)
{
	lost_write_caught(*state, false);
	lost_write_caught(*state, true);
}

/* The slot table forgets a slot being rewritten; restoring takes only valid length codes. */
static void
test_slot_table_set(void **state)
{
	struct tsup_nvme_fx *f = *state;
	struct kvt_nvme *n = zopen(f, false, KVT_CODEC_NONE);
	struct kvt_nvme_slotinfo si, bad;

	fill(f->host, BLOCK, 4);
	assert_int_equal(zput(n, 4, f->host), 0);
	assert_true(kvt_nvme_slot_info(n, 4, &si));
	assert_false(kvt_nvme_slot_info(n, 5, &bad)); /* never written */
	bad = si;
	bad.lenc = 0; /* unknown */
	assert_int_equal(kvt_nvme_slot_set(n, 4, &bad), -EINVAL);
	bad.lenc = kvt_fmt_lenc(KVT_CODEC_NONE, BLOCK, BLOCK) - 1; /* raw, not all pages */
	assert_int_equal(kvt_nvme_slot_set(n, 4, &bad), -EINVAL);
	bad.lenc = kvt_fmt_lenc(KVT_CODEC_LZ4, 100, BLOCK); /* a codec this tier does not use */
	assert_int_equal(kvt_nvme_slot_set(n, 4, &bad), -EINVAL);
	assert_int_equal(kvt_nvme_slot_set(n, NSLOTS, &si), -EINVAL);
	assert_int_equal(kvt_nvme_slot_set(n, 4, NULL), -EINVAL);
	/* the entry for slot 4 set on slot 5: the header there says slot 4 is not it */
	assert_int_equal(kvt_nvme_slot_set(n, 5, &si), 0);
	assert_int_equal(zget(n, 5, f->host + STRIDE), KVT_ECORRUPT);
	assert_int_equal(kvt_nvme_slot_set(n, 4, &si), 0);
	assert_int_equal(zget(n, 4, f->host + STRIDE), 0);
	assert_memory_equal(f->host + STRIDE, f->host, BLOCK);
	kvt_nvme_close(n);
}

/* Through the engine: park to NVMe and resume, the data verify, the slot table is counted in the
 * metadata. Puts go zero-copy either way; gets go zero-copy with the HOST header room (forced on
 * here for the test layout's small blocks: kvt_test_host_room_min_block), through staging
 * without it. The layout's block is not a 4 KiB multiple: the HOST stride is rounded up. */
static void
engine_park_resume(bool room)
{
	struct tsup_cfg c = { .hbm_blocks = 8, .host_blocks = 8, .nvme_blocks = 16 };
	struct kvt_stats es = { .size = sizeof es };
	struct kvt_nvme_stats st;
	struct kvt_engine *e;
	char *dir = NULL;
	kvt_seq_id s;
	uint32_t nb;

	e = tsup_engine(&c, &dir);
	assert_true(kvt_nvme_zero_copy(e->nvme));
	assert_int_equal(e->host_data_off, room ? KVT_FMT_HDR_PAGE : 0);
	s = tsup_session_written(e, 0, 3, 6 * TSUP_TPB);
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	nb = tsup_blocks_in(e, s, KVT_TIER_NVME);
	assert_int_equal(nb, 6);
	assert_int_equal(kvt_seq_resume(e, s), 0);
	assert_int_equal(tsup_verify(e, s, 3), 0);
	kvt_nvme_get_stats(e->nvme, &st);
	assert_int_equal(st.zc_writes, nb);
	assert_int_equal(st.staged_writes, 0);
	assert_true((room ? st.zc_reads : st.staged_reads) >= nb);
	assert_int_equal(room ? st.staged_reads : st.zc_reads, 0);
	assert_int_equal(kvt_engine_stats(e, &es), 0);
	assert_int_equal(kvt_nvme_meta_bytes(e->nvme), (uint64_t)kvt_nvme_n_slots(e->nvme) * 6);
	assert_true(es.meta_bytes > kvt_nvme_meta_bytes(e->nvme));
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

static void
test_engine_park_resume_staged_get(void **state)
{
	(void)state;
	engine_park_resume(false);
}

static void
test_engine_park_resume_zero_copy(void **state)
{
	(void)state;
	engine_park_resume(true);
}

/* The engine tests' NVMe read fate: 0 normal, KVT_NVME_FATE_LATE (the CQE comes only after
 * the read timed out) or KVT_NVME_FATE_LOSE (it never comes); writes are always normal. */
static int read_fate;

static int
read_fate_hook(void *arg, bool is_write, uint32_t slot)
{
	(void)arg, (void)slot;
	return is_write ? KVT_NVME_FATE_NORMAL : read_fate;
}

/* An engine whose NVMe IO times out after 250 ms (room for a loaded machine: only the reads
 * the fate hook holds back should time out), and a parked one-block sequence *a on NVMe. */
static struct kvt_engine *
late_engine(char **dir, kvt_seq_id *a)
{
	static const struct kvt_nvme_fault_hooks hooks = { .fate = read_fate_hook,
							   .io_timeout_ms = 250 };
	struct tsup_cfg c = { .hbm_blocks = 8, .host_blocks = 4, .nvme_blocks = 16,
			      .no_watermarks = true };
	struct kvt_engine *e;

	kvt_test_nvme_hooks = &hooks;
	e = tsup_engine(&c, dir);
	kvt_test_nvme_hooks = NULL;
	assert_true(kvt_nvme_zero_copy(e->nvme));
	*a = tsup_session_written(e, 0, 1, TSUP_TPB);
	assert_int_equal(kvt_seq_park(e, *a, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_blocks_in(e, *a, KVT_TIER_NVME), 1);
	assert_int_equal(e->slots[KVT_TIER_HOST].n_free, 4);
	return e;
}

/* Resume @a (one block on NVMe) with reads of @fate, poll until its zero-copy read into a HOST
 * slot timed out; that slot (returned) must then be quarantined, owned by no block. */
static uint32_t
late_read(struct kvt_engine *e, kvt_seq_id a, int fate)
{
	uint64_t errs = e->st.io_errors, zc;
	struct kvt_nvme_stats st;
	uint32_t h = KVT_NIL;

	kvt_nvme_get_stats(e->nvme, &st);
	zc = st.zc_reads;
	read_fate = fate;
	assert_int_equal(kvt_seq_resume(e, a), 0);
	for (uint32_t s = 0; s < e->slots[KVT_TIER_HOST].n_slots; s++)
		if (KVT_OWNER_IS_BLOCK(kvt_owner(e, KVT_TIER_HOST, s)))
			h = s;
	assert_true(h != KVT_NIL);
	assert_int_equal(kvt_copy_state(kvt_blk(e, kvt_owner(e, KVT_TIER_HOST, h)),
					KVT_TIER_HOST), KVT_COPY_INFLIGHT);
	for (int i = 0; i < 20000 && (e->st.io_errors == errs || e->nvme_inflight); i++) {
		assert_true(kvt_engine_poll(e, 0) >= 0);
		usleep(1000);
	}
	read_fate = KVT_NVME_FATE_NORMAL;
	kvt_nvme_get_stats(e->nvme, &st);
	assert_int_equal(st.zc_reads, zc + 1); /* straight into the HOST slot */
	assert_int_equal(e->nvme_inflight, 0);
	assert_int_equal(e->st.io_errors, errs + 1); /* the timeout */
	assert_int_equal(kvt_owner(e, KVT_TIER_HOST, h), KVT_SLOT_QUARANTINED);
	assert_int_equal(e->quarantined[KVT_TIER_HOST], 1);
	assert_int_equal(e->slots[KVT_TIER_HOST].n_free, 3);
	tsup_check_engine(e);
	return h;
}

/* Park a 4-block sequence with pattern @tag to HOST (3 usable slots while one is quarantined:
 * HOST fills, a block goes on to NVMe) and check every byte of it. */
static void
fill_host_and_verify(struct kvt_engine *e, uint32_t tag)
{
	kvt_seq_id b = tsup_session_written(e, 0, tag, 4 * TSUP_TPB);

	assert_int_equal(kvt_seq_park(e, b, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_verify(e, b, tag), 0);
	tsup_check_engine(e);
	assert_int_equal(kvt_seq_close(e, b), 0);
}

/* A zero-copy read that timed out while the kernel may still write its HOST slot: the slot is
 * quarantined, not freed, so no other block's copy is placed where the abandoned read can land.
 * Its CQE never comes (LOSE): the slot stays out of use; when the read's bytes do land after
 * HOST was filled (the test writes them), every other block still reads back intact. */
static void
test_engine_timed_out_read_quarantines_host_slot(void **state)
{
	struct kvt_engine *e;
	char *dir = NULL;
	kvt_seq_id a;
	uint32_t h;

	(void)state;
	e = late_engine(&dir, &a);
	h = late_read(e, a, KVT_NVME_FATE_LOSE);
	{
		kvt_seq_id b = tsup_session_written(e, 0, 2, 4 * TSUP_TPB);

		assert_int_equal(kvt_seq_park(e, b, KVT_TIER_HOST), 0);
		assert_int_equal(kvt_engine_drain(e), 0);
		/* HOST is full, but not with the quarantined slot */
		assert_int_equal(e->slots[KVT_TIER_HOST].n_free, 0);
		assert_int_equal(kvt_owner(e, KVT_TIER_HOST, h), KVT_SLOT_QUARANTINED);
		/* the abandoned read lands now */
		memset(kvt_slot_addr(e, KVT_TIER_HOST, h), 0xa5, tsup_block_bytes());
		assert_int_equal(tsup_verify(e, b, 2), 0);
		assert_int_equal(kvt_seq_close(e, b), 0);
	}
	assert_int_equal(e->quarantined[KVT_TIER_HOST], 1); /* no CQE: kept for good */
	tsup_check_engine(e);
	assert_int_equal(kvt_seq_close(e, a), 0);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* The same read's CQE comes after the timeout (LATE): the slot stays quarantined until then, and
 * is free again once it came; the engine is whole and usable. */
static void
test_engine_late_read_releases_host_slot(void **state)
{
	struct kvt_engine *e;
	char *dir = NULL;
	kvt_seq_id a;
	uint32_t h;

	(void)state;
	e = late_engine(&dir, &a);
	h = late_read(e, a, KVT_NVME_FATE_LATE);
	for (int i = 0; i < 20000 && e->quarantined[KVT_TIER_HOST]; i++) {
		assert_true(kvt_engine_poll(e, 0) >= 0);
		usleep(1000);
	}
	assert_int_equal(e->quarantined[KVT_TIER_HOST], 0);
	assert_int_equal(e->host_late, 0);
	assert_int_equal(kvt_owner(e, KVT_TIER_HOST, h), KVT_NIL);
	assert_int_equal(e->slots[KVT_TIER_HOST].n_free, 4);
	tsup_check_engine(e);
	fill_host_and_verify(e, 3);
	assert_int_equal(kvt_seq_close(e, a), 0);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/* An append (kvt_block_bump_ver) to a block whose HOST copy a zero-copy HOST->NVMe write still
 * reads in place: the HOST slot is not freed under the write (another block's copy could be put
 * there while the kernel or a worker reads it), only once the write completed; the stale NVMe
 * copy is dropped then, and everything is consistent. seq_ready_last already waits for such a
 * write before it appends: the test calls the state change directly. */
static void
test_engine_append_keeps_host_source_of_write(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 8, .host_blocks = 4, .nvme_blocks = 16,
			      .no_watermarks = true };
	struct kvt_nvme_stats st;
	struct kvt_engine *e;
	struct kvt_block *b;
	char *dir = NULL;
	uint32_t id = KVT_NIL, h = KVT_NIL, ns;
	kvt_seq_id a;

	(void)state;
	e = tsup_engine(&c, &dir);
	assert_true(kvt_nvme_zero_copy(e->nvme));
	a = tsup_session_written(e, 0, 1, TSUP_TPB - 1); /* one partial block */
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_resume(e, a), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	for (uint32_t s = 0; s < e->slots[KVT_TIER_HOST].n_slots; s++)
		if (KVT_OWNER_IS_BLOCK(kvt_owner(e, KVT_TIER_HOST, s)))
			id = kvt_owner(e, KVT_TIER_HOST, s), h = s;
	assert_true(id != KVT_NIL);
	b = kvt_blk(e, id);
	assert_true(kvt_copy_valid(b, KVT_TIER_HBM) && kvt_copy_valid(b, KVT_TIER_HOST));
	/* a write of the clean HOST copy to NVMe, in flight (nothing polls until the drain) */
	assert_int_equal(kvt_slot_alloc(e, KVT_TIER_NVME, id, &ns), 0);
	assert_int_equal(kvt_xfer_h2n(e, id, ns, false, true), 0);
	assert_int_equal(b->busy, 1);
	kvt_block_bump_ver(e, id, 0); /* what an append to the block does */
	assert_int_equal(kvt_owner(e, KVT_TIER_HOST, h), id); /* not freed under the write */
	assert_int_equal(b->slot[KVT_TIER_HOST], h);
	assert_false(kvt_copy_valid(b, KVT_TIER_HOST)); /* but no longer valid */
	assert_true(kvt_copy_stale(b, KVT_TIER_HOST));
	assert_true(kvt_copy_stale(b, KVT_TIER_NVME));
	assert_int_equal(e->slots[KVT_TIER_HOST].n_free, 3);
	tsup_check_engine(e);
	assert_int_equal(kvt_engine_drain(e), 0); /* the write completes: both copies go */
	kvt_nvme_get_stats(e->nvme, &st);
	assert_int_equal(st.zc_writes, 1);
	assert_int_equal(kvt_copy_state(b, KVT_TIER_HOST), KVT_COPY_ABSENT);
	assert_int_equal(kvt_copy_state(b, KVT_TIER_NVME), KVT_COPY_ABSENT);
	assert_int_equal(kvt_owner(e, KVT_TIER_HOST, h), KVT_NIL);
	assert_int_equal(e->slots[KVT_TIER_HOST].n_free, 4);
	assert_int_equal(e->slots[KVT_TIER_NVME].n_free, e->slots[KVT_TIER_NVME].n_slots);
	tsup_check_engine(e);
	/* the HBM copy is the block, and the sequence goes on as usual */
	assert_int_equal(tsup_verify(e, a, 1), 0);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_verify(e, a, 1), 0);
	tsup_check_engine(e);
	assert_int_equal(kvt_seq_close(e, a), 0);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

#define ZFX_TEST(t) cmocka_unit_test_setup_teardown(t, zfx_setup, tsup_nvme_fx_teardown)
/* engine tests with the HOST header room forced on: NVMe gets go zero-copy */
#define ROOM_TEST(t) cmocka_unit_test_setup_teardown(t, tsup_room_on, tsup_room_off)

int
main(void)
{
	const struct CMUnitTest tests[] = {
		ZFX_TEST(test_zero_copy_round_trip),
		ZFX_TEST(test_zero_copy_get_with_room),
		ZFX_TEST(test_refused_registration_falls_back),
		ZFX_TEST(test_zero_copy_faults),
		ZFX_TEST(test_zero_copy_faults_room),
		ZFX_TEST(test_lost_write_caught),
		ZFX_TEST(test_slot_table_set),
		cmocka_unit_test(test_engine_park_resume_staged_get),
		ROOM_TEST(test_engine_park_resume_zero_copy),
		ROOM_TEST(test_engine_timed_out_read_quarantines_host_slot),
		ROOM_TEST(test_engine_late_read_releases_host_slot),
		ROOM_TEST(test_engine_append_keeps_host_source_of_write),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
