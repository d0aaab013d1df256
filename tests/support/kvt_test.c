/* SPDX-License-Identifier: MIT */
/* tests/support/kvt_test.c - see kvt_test.h. */
#include <dirent.h>
#include <errno.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "engine/engine_impl.h"
#include "support/kvt_test.h"

kvt_seq_id
tsup_seq_written(struct kvt_engine *e, uint32_t tag, uint32_t tokens)
{
	kvt_seq_id s;

	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	for (uint32_t pos = 0; pos < tokens; pos += TSUP_TPB) {
		uint32_t n = tokens - pos < TSUP_TPB ? tokens - pos : TSUP_TPB;
		struct kvt_seq_range r = { .seq = s, .first_block = pos / TSUP_TPB, .n_blocks = 1 };
		struct kvt_batch *b;

		assert_int_equal(tsup_append_write(e, s, tag, pos, n), 0);
		assert_int_equal(kvt_batch_prepare_ranges(e, &r, 1, &b), 0);
		assert_int_equal(kvt_batch_release(b, NULL), 0);
	}
	return s;
}

kvt_seq_id
tsup_open(struct kvt_engine *e, uint32_t tenant, uint64_t salt, uint64_t key)
{
	struct kvt_seq_opts so;
	kvt_seq_id s;

	kvt_seq_opts_init(&so, sizeof so);
	so.tenant = tenant;
	so.salt = salt;
	so.session_key = key;
	assert_int_equal(kvt_seq_open(e, &so, &s), 0);
	return s;
}

kvt_seq_id
tsup_session_written(struct kvt_engine *e, uint64_t key, uint32_t tag, uint32_t n)
{
	kvt_seq_id s = tsup_open(e, 0, 0, key);

	assert_int_equal(tsup_append_write(e, s, tag, 0, n), 0);
	return s;
}

void
tsup_deadline_ms(struct timespec *ts, long ms)
{
	clock_gettime(CLOCK_REALTIME, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

void
tsup_restore(struct kvt_engine *e, uint64_t key, uint32_t tag, kvt_seq_id *s)
{
	int rc = kvt_seq_restore(e, key, NULL, s);

	if (rc)
		print_error("restore %#llx: %s\n", (unsigned long long)key,
			    kvt_last_error_message());
	assert_int_equal(rc, 0);
	assert_int_equal(kvt_seq_resume(e, *s), 0);
	assert_int_equal(tsup_verify(e, *s, tag), 0);
}

uint32_t
tsup_blocks_in(struct kvt_engine *e, kvt_seq_id s, int tier)
{
	struct kvt_seq_info info;

	assert_int_equal(kvt_seq_info(e, s, &info), 0);
	return info.blocks_in[tier];
}

void
tsup_check_engine(struct kvt_engine *e)
{
	int rc = kvt_engine_check(e);

	if (rc)
		print_error("kvt_engine_check: %s\n", kvt_last_error_message());
	assert_int_equal(rc, 0);
}

int
tsup_refuse_mlock(void)
{
	struct __user_cap_header_struct hdr = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
	struct __user_cap_data_struct cap[2];
	struct rlimit rl;

	if (syscall(SYS_capget, &hdr, cap) == 0) {
		cap[0].effective &= ~(1u << CAP_IPC_LOCK);
		if (syscall(SYS_capset, &hdr, cap) != 0)
			return 77;
	}
	if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0)
		return 77;
	rl.rlim_cur = 0;
	return setrlimit(RLIMIT_MEMLOCK, &rl) != 0 ? 77 : 0;
}

char *
tsup_mkdtemp(void)
{
	const char *base = getenv("KVT_TEST_TMP");
	char buf[512];
	char *d;

	snprintf(buf, sizeof buf, "%s/kvt-XXXXXX", base && *base ? base : "/tmp");
	d = strdup(buf);
	assert_non_null(d);
	assert_non_null(mkdtemp(d));
	return d;
}

void
tsup_rmdir(char *dir)
{
	struct dirent *de;
	char path[1024];
	DIR *d;

	if (!dir)
		return;
	d = opendir(dir);
	if (d) {
		while ((de = readdir(d))) {
			if (de->d_name[0] == '.')
				continue;
			snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
			unlink(path);
		}
		closedir(d);
	}
	rmdir(dir);
	free(dir);
}

uint64_t
tsup_block_bytes(void)
{
	return 2ull * TSUP_TPB * TSUP_HEADS * TSUP_DIM * sizeof(float) * TSUP_LAYERS;
}

void
tsup_opts_init(struct kvt_engine_opts *o)
{
	kvt_engine_opts_init(o, sizeof *o);
	o->layout.n_layers = TSUP_LAYERS;
	o->layout.n_kv_heads = TSUP_HEADS;
	o->layout.head_dim = TSUP_DIM;
	o->layout.dtype = KVT_DTYPE_F32;
	o->layout.tokens_per_block = TSUP_TPB;
}

void
tsup_store_opts(struct kvt_engine_opts *o, const char *dir, uint64_t nvme_bytes)
{
	tsup_opts_init(o);
	o->hbm_bytes = 16 * tsup_block_bytes();
	o->host_bytes = 8 * tsup_block_bytes();
	o->nvme_dir = dir;
	o->nvme_bytes = nvme_bytes;
	o->nvme_persist = 1;
	o->high_watermark = o->low_watermark = 1.0f;
}

/* Create an engine from @o with whatever kvt_test_nvme_hooks are in place; asserts success. */
static struct kvt_engine *
tsup_create_ok(const struct kvt_engine_opts *o)
{
	struct kvt_engine *e = NULL;
	int rc = kvt_engine_create(o, &e);

	if (rc)
		print_error("kvt_engine_create: %s\n", kvt_last_error_message());
	assert_int_equal(rc, 0);
	return e;
}

int
tsup_nvme_fx_setup(void **state, size_t host_bytes, const char *name)
{
	struct tsup_nvme_fx *f = calloc(1, sizeof *f);
	void *p = NULL;

	if (!f || posix_memalign(&p, 4096, host_bytes) != 0)
		return -1;
	f->host = p;
	snprintf(f->dir, sizeof f->dir, "/tmp/%s-XXXXXX", name);
	if (!mkdtemp(f->dir))
		return -1;
	*state = f;
	return 0;
}

int
tsup_nvme_fx_teardown(void **state)
{
	struct tsup_nvme_fx *f = *state;
	int r = rmdir(f->dir); /* every tier removed its file */

	free(f->host);
	free(f);
	return r;
}

int tsup_enospc_writes;

static void
tsup_enospc_hook(void *arg, bool is_write, uint32_t slot, void *buf, size_t len, uint64_t off,
		 int *res)
{
	(void)arg, (void)slot, (void)buf, (void)len, (void)off;
	if (is_write && tsup_enospc_writes)
		*res = -ENOSPC;
}

const struct kvt_nvme_fault_hooks tsup_enospc_hooks = { .on_complete = tsup_enospc_hook };

int
tsup_room_on(void **state)
{
	(void)state;
	kvt_test_host_room_min_block = 1;
	return 0;
}

int
tsup_room_off(void **state)
{
	(void)state;
	kvt_test_host_room_min_block = KVT_HOST_ROOM_MIN_BLOCK;
	return 0;
}

struct kvt_engine *
tsup_create(const struct kvt_engine_opts *o, const struct kvt_nvme_fault_hooks *hooks)
{
	struct kvt_engine *e;

	kvt_test_nvme_hooks = hooks;
	e = tsup_create_ok(o);
	kvt_test_nvme_hooks = NULL;
	return e;
}

struct kvt_engine *
tsup_engine(const struct tsup_cfg *c, char **dir)
{
	struct kvt_engine_opts o;
	uint64_t bb = tsup_block_bytes();

	tsup_opts_init(&o);
	o.hbm_bytes = c->hbm_blocks * bb;
	o.host_bytes = c->host_blocks * bb;
	o.emu_max_delay_us = c->delay_us;
	o.emu_copy_bytes_per_s = c->bandwidth;
	o.emu_lazy = c->lazy;
	o.emu_seed = 42;
	o.evict_policy = c->policy;
	if (c->no_watermarks)
		o.high_watermark = o.low_watermark = 1.0f;
	*dir = NULL;
	if (c->nvme_blocks) {
		*dir = tsup_mkdtemp();
		o.nvme_dir = *dir;
		/* nvme_blocks x (block + 128 B, rounded up to 4 KiB) bytes. A slot takes a 4 KiB
		 * header page plus the block rounded up to 4 KiB (kvt_fmt_slot_bytes,
		 * tiers/format.h): for the test block (1 KiB) that is nvme_blocks / 2 slots, and
		 * the tests' NVMe pressure was sized with it */
		o.nvme_bytes = (uint64_t)c->nvme_blocks * ((bb + 128 + 4095) / 4096 * 4096);
	}
	return tsup_create_ok(&o);
}

float
tsup_val(uint32_t tag, uint64_t pos, uint32_t layer, uint32_t kv, uint32_t i)
{
	return (float)tag * 100000.0f + (float)pos * 100.0f + (float)layer * 10.0f +
	       (float)kv * 5.0f + (float)i * 0.25f;
}

int
tsup_append_write(struct kvt_engine *e, kvt_seq_id s, uint32_t tag, uint64_t first_pos, size_t n)
{
	struct kvt_geometry g;
	int64_t map[64];
	int32_t tok[64];
	size_t t;
	uint32_t l, i;
	int rc;

	if (n > 64) {
		fprintf(stderr, "tsup_append_write: %zu tokens, at most 64\n", n);
		return -EINVAL;
	}
	for (t = 0; t < n; t++)
		tok[t] = (int32_t)(first_pos + t);
	rc = kvt_seq_append(e, s, tok, n, map);
	if (rc)
		return rc;
	rc = kvt_engine_geometry(e, &g);
	if (rc) { /* the tokens are appended: the caller must not take this for "not now" */
		fprintf(stderr, "tsup_append_write: kvt_engine_geometry: %d %s\n", rc,
			kvt_last_error_message());
		return rc;
	}
	for (t = 0; t < n; t++) {
		for (l = 0; l < TSUP_LAYERS; l++) {
			float *k, *v;

			kvt_kv_addr(&g, l, map[t], (void **)&k, (void **)&v);
			for (i = 0; i < TSUP_HEADS * TSUP_DIM; i++) {
				k[i] = tsup_val(tag, first_pos + t, l, 0, i);
				v[i] = tsup_val(tag, first_pos + t, l, 1, i);
			}
		}
	}
	return 0;
}

int
tsup_check_entry(const struct kvt_block_table *bt, uint32_t i, uint32_t tag)
{
	uint64_t pos0 = (uint64_t)bt->first_block[i] * TSUP_TPB, t;
	uint32_t l, j;

	for (t = 0; t < bt->seq_len[i]; t++) {
		uint32_t slot = bt->indices[bt->indptr[i] + t / TSUP_TPB];
		int64_t m = (int64_t)slot * TSUP_TPB + (int64_t)(t % TSUP_TPB);

		for (l = 0; l < TSUP_LAYERS; l++) {
			float *k, *v;

			kvt_kv_addr(&bt->geo, l, m, (void **)&k, (void **)&v);
			for (j = 0; j < TSUP_HEADS * TSUP_DIM; j++) {
				if (k[j] != tsup_val(tag, pos0 + t, l, 0, j) ||
				    v[j] != tsup_val(tag, pos0 + t, l, 1, j)) {
					fprintf(stderr, "tag %u pos %llu layer %u elem %u: K %g V %g\n",
						tag, (unsigned long long)(pos0 + t), l, j, k[j], v[j]);
					return 1;
				}
			}
		}
	}
	return 0;
}

int
tsup_verify(struct kvt_engine *e, kvt_seq_id s, uint32_t tag)
{
	struct kvt_block_table bt;
	struct kvt_batch *b = NULL;
	uint32_t l;
	int rc, rel;

	rc = kvt_batch_prepare(e, &s, 1, &b);
	if (rc)
		return rc;
	for (l = 0; l < TSUP_LAYERS && rc == 0; l++)
		rc = kvt_batch_wait_layer(b, l, NULL);
	if (rc == 0) {
		rc = kvt_batch_block_table(b, &bt);
		if (rc)
			fprintf(stderr, "tsup_verify: kvt_batch_block_table: %d %s\n", rc,
				kvt_last_error_message());
		else
			rc = tsup_check_entry(&bt, 0, tag);
	}
	rel = kvt_batch_release(b, NULL);
	if (rel) { /* unexpected whatever came before: it wins */
		fprintf(stderr, "tsup_verify: kvt_batch_release: %d %s\n", rel,
			kvt_last_error_message());
		rc = rel;
	}
	return rc;
}

struct kvt_stats
tsup_stats(struct kvt_engine *e)
{
	struct kvt_stats st;

	memset(&st, 0, sizeof st);
	st.size = sizeof st;
	assert_int_equal(kvt_engine_stats(e, &st), 0);
	return st;
}

bool
kvt_test_quick(void)
{
	const char *q = getenv("KVT_TEST_QUICK");

	return q && *q && *q != '0';
}

void
tsup_nvme_reap_all(struct kvt_nvme *n, uint32_t count, int res)
{
	struct kvt_nvme_cqe c[64];
	uint32_t got = 0;

	while (got < count) {
		int r = kvt_nvme_reap(n, c, 64, true);

		assert_true(r > 0);
		for (int i = 0; i < r; i++)
			assert_int_equal(c[i].res, res);
		got += (uint32_t)r;
	}
}

struct kvt_ext_done
tsup_ext_finish(struct kvt_engine *e, uint32_t pool, uint64_t job, struct kvt_ext_fail *f,
		size_t fcap)
{
	struct kvt_ext_done d[8];
	int rc = kvt_ext_wait(e, pool, job, 60000), n;

	if (rc)
		print_error("wait: %s\n", kvt_last_error_message());
	assert_int_equal(rc, 0);
	n = kvt_ext_poll(e, pool, d, 8, f, fcap);
	assert_true(n >= 1);
	for (int i = 0; i < n; i++)
		if (d[i].job == job)
			return d[i];
	fail_msg("job %llu not reported", (unsigned long long)job);
	return d[0];
}
