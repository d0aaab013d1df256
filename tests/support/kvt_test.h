/* SPDX-License-Identifier: MIT */
/*
 * tests/support/kvt_test.h - helpers shared by the engine tests: a small engine, a byte pattern
 * per (sequence tag, position, layer), writers and checkers that go through the public API the
 * way a server does (append -> write K/V at the slot mapping -> prepare -> wait -> read).
 */
#ifndef KVT_TEST_H
#define KVT_TEST_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

/* Test layout: 2 layers, 2 KV heads, head_dim 8, f32, tpb 4: 1024-byte blocks. */
#define TSUP_LAYERS 2
#define TSUP_HEADS 2
#define TSUP_DIM 8
#define TSUP_TPB 4

struct tsup_cfg {
	uint32_t hbm_blocks;   /* HBM capacity in blocks */
	uint32_t host_blocks;  /* HOST capacity in blocks (0 = none) */
	uint32_t nvme_blocks;  /* NVME capacity in slots (0 = none) */
	uint32_t delay_us;     /* emulated device delay knob */
	uint64_t bandwidth;    /* emulated copy bytes/s (0 = unlimited) */
	bool no_watermarks;    /* high = low = 1.0: no background demotion after release */
	uint32_t policy;       /* enum kvt_evict_policy (0 = the default) */
	bool lazy;             /* kvt_engine_opts.emu_lazy (ignored with delay_us) */
};

/* A temp dir under KVT_TEST_TMP or /tmp; removed (with its files) by tsup_rmdir. */
char *tsup_mkdtemp(void);
void tsup_rmdir(char *dir);

struct kvt_nvme_fault_hooks;

/* kvt_engine_opts_init(o) with the test layout: TSUP_LAYERS layers, TSUP_HEADS KV heads of
 * TSUP_DIM f32 elements, TSUP_TPB tokens per block. */
void tsup_opts_init(struct kvt_engine_opts *o);

/* tsup_opts_init(o) for a persistent NVMe store: 16 HBM blocks, 8 HOST blocks, NVMe in @dir
 * (@nvme_bytes), nvme_persist on, watermarks 1.0 (no background demotion). */
void tsup_store_opts(struct kvt_engine_opts *o, const char *dir, uint64_t nvme_bytes);

/* Create an engine from @o with the NVMe fault hooks @hooks (NULL = none) in place for the
 * create (kvt_test_nvme_hooks); asserts success, printing the error when it fails. */
struct kvt_engine *tsup_create(const struct kvt_engine_opts *o,
			       const struct kvt_nvme_fault_hooks *hooks);

/* kvt_ext_wait for external-pool @job (60 s at most), then kvt_ext_poll: asserts the job is
 * reported and returns its record; its failures are in @f (@fcap entries). */
struct kvt_ext_done tsup_ext_finish(struct kvt_engine *e, uint32_t pool, uint64_t job,
				    struct kvt_ext_fail *f, size_t fcap);

/* While tsup_enospc_writes is set, tsup_enospc_hooks complete every NVMe write with -ENOSPC
 * (a volume out of space); reads and writes are untouched otherwise. */
extern int tsup_enospc_writes;
extern const struct kvt_nvme_fault_hooks tsup_enospc_hooks;

/* cmocka setup/teardown: the HOST header room on for the small test blocks (one IO per
 * zero-copy NVMe write), then back to the production minimum block size. Return 0. */
int tsup_room_on(void **state);
int tsup_room_off(void **state);

/* The fixture of the NVMe tier tests: a directory and 4 KiB-aligned "HOST tier" memory. */
struct tsup_nvme_fx {
	char dir[PATH_MAX]; /* fresh temporary directory /tmp/<name>-XXXXXX */
	uint8_t *host;      /* host_bytes of memory, 4 KiB aligned, not initialised */
};

/* cmocka setup: *state = a new tsup_nvme_fx with @host_bytes of HOST memory and a fresh
 * directory named after @name. Returns 0, or -1 when memory or the directory is refused. */
int tsup_nvme_fx_setup(void **state, size_t host_bytes, const char *name);

/* cmocka teardown of tsup_nvme_fx_setup: removes the directory (which fails, and so does the
 * teardown, when a tier left its file there) and frees the fixture. Returns rmdir's result. */
int tsup_nvme_fx_teardown(void **state);

struct kvt_nvme;

/* Reap @n (waiting) until @count completions came; asserts each one's result is @res. */
void tsup_nvme_reap_all(struct kvt_nvme *n, uint32_t count, int res);

/* Create an engine (asserts success). *dir receives the NVMe dir to remove, or NULL. */
struct kvt_engine *tsup_engine(const struct tsup_cfg *c, char **dir);
uint64_t tsup_block_bytes(void);

/* The float stored for element i of token pos's K (kv = 0) or V (kv = 1) in layer l. */
float tsup_val(uint32_t tag, uint64_t pos, uint32_t layer, uint32_t kv, uint32_t i);

/* Append n tokens to s and write their K/V (pattern tag) directly into HBM. Returns rc
 * (-EINVAL for n > 64). No cmocka assertion (worker threads call it): failures other than the
 * append's are printed on stderr. */
int tsup_append_write(struct kvt_engine *e, kvt_seq_id s, uint32_t tag, uint64_t first_pos,
		      size_t n);

/* Prepare a batch of one sequence, wait for every layer, compare all its K/V with the pattern,
 * release. Returns 0 when every byte matches, the kvtier error of prepare/wait/block table
 * otherwise, or 1 on a data mismatch (printed); a failed release is printed and its error
 * returned whatever came before. No cmocka assertion: worker threads call it (a cmocka failure
 * outside the test's thread longjmps into the main thread's frame and reports nothing). */
int tsup_verify(struct kvt_engine *e, kvt_seq_id s, uint32_t tag);

/* Assert: an open sequence of @tokens tokens with pattern @tag, appended a block at a time,
 * each block's write pin released by a batch of it (so it fits any HBM with one free slot). */
kvt_seq_id tsup_seq_written(struct kvt_engine *e, uint32_t tag, uint32_t tokens);

/* Assert: an open sequence with session key @key (0 = none) and @n tokens of pattern @tag,
 * appended at once. */
kvt_seq_id tsup_session_written(struct kvt_engine *e, uint64_t key, uint32_t tag, uint32_t n);
/* Open a sequence of @tenant with @salt and session key @key (0 = none); asserts success. */
kvt_seq_id tsup_open(struct kvt_engine *e, uint32_t tenant, uint64_t salt, uint64_t key);
/* @ts = CLOCK_REALTIME now + @ms (a pthread_cond_timedwait deadline). */
struct timespec;
void tsup_deadline_ms(struct timespec *ts, long ms);

/* Assert: kvt_seq_restore(e, @key) succeeds (its error printed when not) into *s, which then
 * resumes and holds pattern @tag (tsup_verify). */
void tsup_restore(struct kvt_engine *e, uint64_t key, uint32_t tag, kvt_seq_id *s);

/* Assert kvt_seq_info() succeeds; the blocks of @s whose copy in @tier is valid. */
uint32_t tsup_blocks_in(struct kvt_engine *e, kvt_seq_id s, int tier);

/* Assert kvt_engine_stats() succeeds; its figures. */
struct kvt_stats tsup_stats(struct kvt_engine *e);

/* Assert kvt_engine_check(e) passes (prints its message when it does not). */
void tsup_check_engine(struct kvt_engine *e);

/* In the calling (child) process: drop CAP_IPC_LOCK and set RLIMIT_MEMLOCK to 0, so mlock is
 * refused. Returns 0, or 77 when this machine does not allow it. */
int tsup_refuse_mlock(void);

/* Compare the K/V of a prepared batch entry with the pattern (after waiting). 0 or 1. */
int tsup_check_entry(const struct kvt_block_table *bt, uint32_t i, uint32_t tag);

/* true when KVT_TEST_QUICK is set to something other than "" or "0..." (compute-sanitizer
 * runs, the CUDA emulation): the GPU tests then run a smaller subset. */
bool kvt_test_quick(void);

#endif
