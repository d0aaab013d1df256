/* SPDX-License-Identifier: MIT */
/*
 * tests/test_cuda_async.c - the async invariants of DESIGN.md on a real GPU: the engine on the
 * CUDA device (cudaMalloc HBM, cudaHostAlloc HOST, its own copy streams) and a "server" compute
 * stream whose kernels are made slow on purpose (kernels/delay.cu spins ~100 ms on the GPU
 * before touching memory), so work really is still running when the host goes on:
 *   - a copy waits for the write that produced its source: a delayed kernel writes a block, the
 *     batch is released with the compute stream, the sequence is parked at once; the HOST copy
 *     must hold the kernel's bytes (DESIGN invariant 1/4; release's stream ordering);
 *   - a slot is not reused while a kernel still reads it: a delayed kernel reads A's only HBM
 *     slot; after the release, preparing B needs that slot (HBM has one); the kernel must still
 *     read A's bytes, and B lands intact (invariant 1);
 *   - kvt_batch_wait_layer(stream) makes the stream wait for a 64 MiB promotion without host
 *     blocking: a gather kernel queued right after reads every block intact (invariant 2);
 *   - CUDA failures come back as KVT_EDEVICE with the CUDA message, and the device stays usable;
 *   - the copy-kernel fallback (used where cudaMemcpyBatchAsync is not) moves the right bytes,
 *     one launch per 128 copies, and sends memory the GPU cannot address to cudaMemcpyAsync;
 *     the first three tests run again with every engine copy forced through that kernel.
 * Skips (77) without CUDA in the build or without a GPU.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kvtier.h"

#ifdef KVT_WITH_CUDA
#include <cuda_runtime.h>

#include "engine/engine_impl.h"
#include "kernels/kernels_cuda.h"
#include "support/kvt_test.h"
#include "transfer/device.h"

#define TCA_OK(call) assert_int_equal((int)(call), (int)cudaSuccess)
#define TCA_DELAY_NS 100000000ull /* 100 ms of GPU time before a delayed kernel acts */

/* The copy path the engines of the running test are forced onto (AUTO: none). */
static enum kvt_cuda_copy_path tca_path = KVT_CUDA_COPY_AUTO;

static int
tca_force_kernel(void **state)
{
	(void)state;
	tca_path = KVT_CUDA_COPY_KERNEL;
	return 0;
}

static int
tca_unforce(void **state)
{
	(void)state;
	tca_path = KVT_CUDA_COPY_AUTO;
	return 0;
}

/* Before destroying a test's engine: under a forced path, its copies took that path only. */
static void
tca_check_path(struct kvt_engine *e)
{
	uint64_t n[KVT_CUDA_COPY_PATHS];

	assert_int_equal(kvt_device_cuda_copy_path(e->dev, tca_path, n), 0);
	if (tca_path != KVT_CUDA_COPY_KERNEL)
		return;
	assert_true(n[KVT_CUDA_COPY_KERNEL] > 0);
	assert_int_equal(n[KVT_CUDA_COPY_BATCH_API], 0);
	assert_int_equal(n[KVT_CUDA_COPY_LOOP], 0); /* the engine copies within its arenas */
}

/* An engine on the CUDA device: the given block shape, HBM and HOST sizes in blocks. */
static struct kvt_engine *
tca_engine(uint32_t layers, uint32_t kv_heads, uint32_t head_dim, uint32_t hbm_blocks,
	   uint32_t host_blocks, struct kvt_geometry *g)
{
	struct kvt_engine_opts o;
	struct kvt_engine *e = NULL;
	uint64_t bb;

	kvt_engine_opts_init(&o, sizeof o);
	o.layout = (struct kvt_layout){ .n_layers = layers, .n_kv_heads = kv_heads,
					.head_dim = head_dim, .dtype = KVT_DTYPE_F16,
					.tokens_per_block = 16 };
	bb = 2ull * 16 * kv_heads * head_dim * 2 * layers;
	o.hbm_bytes = hbm_blocks * bb;
	o.host_bytes = host_blocks * bb;
	o.device = KVT_DEVICE_CUDA;
	if (kvt_engine_create(&o, &e) != 0)
		fail_msg("kvt_engine_create (CUDA): %s", kvt_last_error_message());
	assert_int_equal(kvt_engine_geometry(e, g), 0);
	assert_int_equal(g->block_bytes, bb);
	assert_int_equal(g->hbm_slots, hbm_blocks);
	assert_int_equal(kvt_device_cuda_copy_path(e->dev, tca_path, NULL), 0);
	return e;
}

static void *
tca_block(const struct kvt_geometry *g, uint32_t slot)
{
	return (char *)g->hbm_base + (uint64_t)slot * g->block_bytes;
}

/* Every byte of device range [p, p + len) equals v. */
static void
tca_expect(const void *p, size_t len, unsigned char v, const char *what)
{
	unsigned char *h = malloc(len);
	size_t i;

	assert_non_null(h);
	TCA_OK(cudaMemcpy(h, p, len, cudaMemcpyDeviceToHost));
	for (i = 0; i < len; i++)
		if (h[i] != v)
			fail_msg("%s: byte %zu is 0x%02x, expected 0x%02x", what, i, h[i], v);
	free(h);
}

/* Prepare a batch of the one sequence s; returns the batch, *slot its first block's slot. */
static struct kvt_batch *
tca_prepare(struct kvt_engine *e, kvt_seq_id s, uint32_t *slot)
{
	struct kvt_batch *b = NULL;
	struct kvt_block_table bt;

	if (kvt_batch_prepare(e, &s, 1, &b) != 0)
		fail_msg("kvt_batch_prepare: %s", kvt_last_error_message());
	assert_int_equal(kvt_batch_block_table(b, &bt), 0);
	*slot = bt.indices[bt.indptr[0]];
	return b;
}

static struct kvt_stats
tca_stats(struct kvt_engine *e)
{
	struct kvt_stats st = { .size = sizeof st };

	assert_int_equal(kvt_engine_stats(e, &st), 0);
	return st;
}

/* A copy waits for the (slow) kernel that wrote its source. */
static void
test_copy_waits_for_write(void **state)
{
	struct kvt_geometry g;
	struct kvt_engine *e = tca_engine(2, 2, 64, 1, 4, &g);
	struct kvt_seq_info info;
	struct kvt_batch *b;
	kvt_seq_id a;
	int64_t map;
	uint32_t slot;
	void *st = NULL;

	(void)state;
	assert_int_equal(kvt_engine_stream_create(e, &st), 0);
	assert_int_equal(kvt_seq_open(e, NULL, &a), 0);
	assert_int_equal(kvt_seq_append(e, a, NULL, 1, &map), 0);
	b = tca_prepare(e, a, &slot);
	assert_int_equal(slot, (uint32_t)(map / g.tokens_per_block));
	TCA_OK(cudaMemset(tca_block(&g, slot), 0x11, g.block_bytes));
	TCA_OK(cudaDeviceSynchronize());
	/* the server's kernel writes the block late; release with its stream, park at once */
	assert_int_equal(kvt_cuda_delay_fill(tca_block(&g, slot), g.block_bytes, 0x5a,
					     TCA_DELAY_NS, st), 0);
	assert_int_equal(kvt_batch_release(b, st), 0);
	assert_int_equal(kvt_seq_park(e, a, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_info(e, a, &info), 0);
	assert_int_equal(info.blocks_in[KVT_TIER_HBM], 0);
	assert_int_equal(info.blocks_in[KVT_TIER_HOST], 1);
	/* poison HBM; the block comes back from HOST and must hold the kernel's bytes */
	TCA_OK(cudaMemset(g.hbm_base, 0xee, (size_t)g.hbm_slots * g.block_bytes));
	TCA_OK(cudaDeviceSynchronize());
	b = tca_prepare(e, a, &slot);
	assert_int_equal(kvt_batch_wait_layer(b, g.n_layers - 1, NULL), 0);
	tca_expect(tca_block(&g, slot), g.block_bytes, 0x5a, "block copied down and back");
	assert_int_equal(kvt_batch_release(b, NULL), 0);
	assert_true(tca_stats(e).blocks_moved[KVT_MOVE_HBM_TO_HOST] >= 1);
	assert_true(tca_stats(e).blocks_moved[KVT_MOVE_HOST_TO_HBM] >= 1);
	kvt_engine_stream_destroy(e, st);
	tca_check_path(e);
	kvt_engine_destroy(e);
}

/* A slot is not reused (by a promotion) while a kernel still reads it. */
static void
test_slot_not_reused_while_read(void **state)
{
	struct kvt_geometry g;
	struct kvt_engine *e = tca_engine(2, 2, 64, 1, 4, &g);
	struct kvt_batch *b;
	kvt_seq_id a, bs;
	int64_t map;
	uint32_t slot_a, slot_b;
	void *st = NULL, *out = NULL;

	(void)state;
	assert_int_equal(kvt_engine_stream_create(e, &st), 0);
	TCA_OK(cudaMalloc(&out, g.block_bytes));
	/* B: written, then parked in HOST */
	assert_int_equal(kvt_seq_open(e, NULL, &bs), 0);
	assert_int_equal(kvt_seq_append(e, bs, NULL, 1, &map), 0);
	b = tca_prepare(e, bs, &slot_b);
	TCA_OK(cudaMemset(tca_block(&g, slot_b), 0xb0, g.block_bytes));
	TCA_OK(cudaDeviceSynchronize());
	assert_int_equal(kvt_batch_release(b, NULL), 0);
	assert_int_equal(kvt_seq_park(e, bs, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	/* A: written, then read late by a kernel on the compute stream */
	assert_int_equal(kvt_seq_open(e, NULL, &a), 0);
	assert_int_equal(kvt_seq_append(e, a, NULL, 1, &map), 0);
	b = tca_prepare(e, a, &slot_a);
	TCA_OK(cudaMemset(tca_block(&g, slot_a), 0xa0, g.block_bytes));
	TCA_OK(cudaMemset(out, 0x00, g.block_bytes));
	TCA_OK(cudaDeviceSynchronize());
	assert_int_equal(kvt_cuda_delay_copy(out, tca_block(&g, slot_a), g.block_bytes,
					     TCA_DELAY_NS, st), 0);
	assert_int_equal(kvt_batch_release(b, st), 0);
	/* B needs the only HBM slot: A is demoted, B promoted into it */
	b = tca_prepare(e, bs, &slot_b);
	assert_int_equal(slot_b, slot_a);
	assert_int_equal(kvt_batch_wait_layer(b, g.n_layers - 1, NULL), 0);
	assert_int_equal(kvt_engine_stream_sync(e, st), 0);
	tca_expect(out, g.block_bytes, 0xa0, "what the kernel read from A's slot");
	tca_expect(tca_block(&g, slot_b), g.block_bytes, 0xb0, "B promoted into the slot");
	assert_int_equal(kvt_batch_release(b, NULL), 0);
	/* and A's demoted copy is intact */
	b = tca_prepare(e, a, &slot_a);
	assert_int_equal(kvt_batch_wait_layer(b, g.n_layers - 1, NULL), 0);
	tca_expect(tca_block(&g, slot_a), g.block_bytes, 0xa0, "A back from HOST");
	assert_int_equal(kvt_batch_release(b, NULL), 0);
	TCA_OK(cudaFree(out));
	kvt_engine_stream_destroy(e, st);
	tca_check_path(e);
	kvt_engine_destroy(e);
}

/* kvt_batch_wait_layer(stream): the stream, not the host, waits for a 64 MiB promotion. */
static void
test_stream_waits_for_promotion(void **state)
{
	enum { NB = 128 };
	struct kvt_geometry g;
	struct kvt_engine *e = tca_engine(8, 8, 128, NB + 8, NB + 16, &g); /* 512 KiB blocks */
	struct kvt_block_table bt;
	struct kvt_batch *b;
	kvt_seq_id c;
	int64_t *map = malloc(NB * 16 * sizeof *map);
	unsigned char *host;
	uint32_t *dslots = NULL, i;
	void *st = NULL, *contig = NULL;
	size_t j;

	(void)state;
	assert_non_null(map);
	assert_int_equal(kvt_engine_stream_create(e, &st), 0);
	assert_int_equal(kvt_seq_open(e, NULL, &c), 0);
	assert_int_equal(kvt_seq_append(e, c, NULL, NB * 16, map), 0);
	for (i = 0; i < NB; i++) /* block i of the sequence holds byte 7i + 1 */
		TCA_OK(cudaMemset(tca_block(&g, (uint32_t)(map[i * 16] / 16)),
				  (unsigned char)(7 * i + 1), g.block_bytes));
	TCA_OK(cudaDeviceSynchronize());
	b = tca_prepare(e, c, &i);
	assert_int_equal(kvt_batch_release(b, NULL), 0);
	assert_int_equal(kvt_seq_park(e, c, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	TCA_OK(cudaMemset(g.hbm_base, 0xee, (size_t)g.hbm_slots * g.block_bytes));
	TCA_OK(cudaMalloc(&contig, (size_t)NB * g.block_bytes));
	TCA_OK(cudaMalloc((void **)&dslots, NB * sizeof(uint32_t)));
	TCA_OK(cudaDeviceSynchronize());
	if (kvt_batch_prepare(e, &c, 1, &b) != 0)
		fail_msg("kvt_batch_prepare: %s", kvt_last_error_message());
	assert_int_equal(kvt_batch_block_table(b, &bt), 0);
	assert_int_equal(bt.indptr[1], NB);
	TCA_OK(cudaMemcpy(dslots, bt.indices, NB * sizeof(uint32_t), cudaMemcpyHostToDevice));
	/* no host wait: the gather is queued behind the stream's wait for the promotion */
	assert_int_equal(kvt_batch_wait_layer(b, g.n_layers - 1, st), 0);
	assert_int_equal(kvt_gather_blocks_cuda(contig, g.hbm_base, g.block_bytes, 0,
						g.block_bytes, dslots, NB, st), 0);
	assert_int_equal(kvt_batch_release(b, st), 0);
	assert_int_equal(kvt_engine_stream_sync(e, st), 0);
	host = malloc((size_t)NB * g.block_bytes);
	assert_non_null(host);
	TCA_OK(cudaMemcpy(host, contig, (size_t)NB * g.block_bytes, cudaMemcpyDeviceToHost));
	for (i = 0; i < NB; i++)
		for (j = 0; j < g.block_bytes; j++)
			if (host[(size_t)i * g.block_bytes + j] != (unsigned char)(7 * i + 1))
				fail_msg("block %u byte %zu: 0x%02x, expected 0x%02x", i, j,
					 host[(size_t)i * g.block_bytes + j],
					 (unsigned char)(7 * i + 1));
	assert_int_equal(kvt_engine_drain(e), 0);
	free(host);
	free(map);
	TCA_OK(cudaFree(contig));
	TCA_OK(cudaFree(dslots));
	kvt_engine_stream_destroy(e, st);
	tca_check_path(e);
	kvt_engine_destroy(e);
}

/* A CUDA failure is KVT_EDEVICE with CUDA's message; the device is usable afterwards. */
static void
test_cuda_error_reported(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_engine *e = NULL;
	struct kvt_geometry g;
	int rc;

	(void)state;
	if (kvt_test_quick()) {
		/* compute-sanitizer runs set it: the failing cudaMalloc would count as an error */
		print_message("(skipped under KVT_TEST_QUICK)\n");
		return;
	}
	kvt_engine_opts_init(&o, sizeof o);
	o.layout = (struct kvt_layout){ .n_layers = 8, .n_kv_heads = 8, .head_dim = 128,
					.dtype = KVT_DTYPE_F16, .tokens_per_block = 16 };
	o.hbm_bytes = 1ull << 40; /* 1 TiB: more than any GPU has */
	o.device = KVT_DEVICE_CUDA;
	rc = kvt_engine_create(&o, &e);
	assert_null(e);
	assert_int_equal(rc, KVT_EDEVICE);
	print_message("(as expected: %s)\n", kvt_last_error_message());
	assert_non_null(strstr(kvt_last_error_message(), "cudaMalloc"));
	assert_non_null(strstr(kvt_last_error_message(), "cudaErrorMemoryAllocation"));
	e = tca_engine(2, 2, 64, 2, 2, &g); /* not sticky: the next engine works */
	kvt_engine_destroy(e);
}
/* Fill n bytes at p with a pattern that differs per seed. */
static void
tca_pattern(unsigned char *p, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)((i * 131u + seed * 7919u) >> 3);
}

/*
 * The copy kernel directly on the device: NB blocks host->device in a scrambled order, an
 * unaligned piece (byte path), a copy from pageable memory (the GPU cannot address it: it must
 * go through cudaMemcpyAsync), then all back device->host. Every byte checked; the counters say
 * which path each copy took.
 */
static void
test_copy_kernel_fallback(void **state)
{
	enum { NB = 300, BS = 64 << 10 }; /* 300 copies: three launches (128 + 128 + 44) */
	struct kvt_device *d = NULL;
	struct kvt_stream *s = NULL;
	struct kvt_copy v[NB + 2];
	unsigned char *host = NULL, *back = NULL, *pageable = malloc(BS), *check = malloc(BS);
	uint64_t n0[KVT_CUDA_COPY_PATHS], n1[KVT_CUDA_COPY_PATHS];
	void *dev = NULL;
	bool pinned = false;
	uint32_t i;

	(void)state;
	assert_non_null(pageable);
	assert_non_null(check);
	assert_int_equal(kvt_device_cuda_create(0, &d), 0);
	assert_int_equal(d->ops->stream_create(d, &s), 0);
	assert_int_equal(d->ops->mem_alloc(d, (size_t)(NB + 2) * BS, &dev), 0);
	assert_int_equal(d->ops->host_alloc(d, (size_t)(NB + 2) * BS, (void **)&host, &pinned), 0);
	assert_true(pinned);
	back = malloc((size_t)(NB + 2) * BS);
	assert_non_null(back);
	for (i = 0; i < NB; i++)
		tca_pattern(host + (size_t)i * BS, BS, i);
	tca_pattern(pageable, BS, 9999);
	assert_int_equal(kvt_device_cuda_copy_path(d, KVT_CUDA_COPY_KERNEL, n0), 0);
	/* host block i -> device block (i * 7) % NB (7 and 300 are coprime) */
	for (i = 0; i < NB; i++)
		v[i] = (struct kvt_copy){ .dst = (char *)dev + (size_t)((i * 7u) % NB) * BS,
					  .src = host + (size_t)i * BS, .len = BS };
	v[NB] = (struct kvt_copy){ .dst = (char *)dev + (size_t)NB * BS + 5,
				   .src = host + 3, .len = 1001 };
	v[NB + 1] = (struct kvt_copy){ .dst = (char *)dev + (size_t)(NB + 1) * BS,
				       .src = pageable, .len = BS };
	assert_int_equal(d->ops->copy_batch_async(d, s, v, NB + 2), 0);
	assert_int_equal(d->ops->stream_sync(d, s), 0);
	assert_int_equal(kvt_device_cuda_copy_path(d, KVT_CUDA_COPY_KERNEL, n1), 0);
	assert_int_equal(n1[KVT_CUDA_COPY_KERNEL] - n0[KVT_CUDA_COPY_KERNEL], NB + 1);
	assert_int_equal(n1[KVT_CUDA_COPY_LOOP] - n0[KVT_CUDA_COPY_LOOP], 1);
	assert_int_equal(n1[KVT_CUDA_COPY_BATCH_API], n0[KVT_CUDA_COPY_BATCH_API]);
	TCA_OK(cudaMemcpy(back, dev, (size_t)(NB + 2) * BS, cudaMemcpyDeviceToHost));
	for (i = 0; i < NB; i++)
		if (memcmp(back + (size_t)((i * 7u) % NB) * BS, host + (size_t)i * BS, BS))
			fail_msg("host block %u did not land in device block %u", i,
				 (i * 7u) % NB);
	assert_memory_equal(back + (size_t)NB * BS + 5, host + 3, 1001);
	assert_memory_equal(back + (size_t)(NB + 1) * BS, pageable, BS);
	/* and back: device block j -> host block j, after poisoning HOST */
	memset(host, 0xee, (size_t)(NB + 2) * BS);
	for (i = 0; i < NB; i++)
		v[i] = (struct kvt_copy){ .dst = host + (size_t)i * BS,
					  .src = (char *)dev + (size_t)i * BS, .len = BS };
	assert_int_equal(d->ops->copy_batch_async(d, s, v, NB), 0);
	assert_int_equal(d->ops->stream_sync(d, s), 0);
	assert_memory_equal(host, back, (size_t)NB * BS);
	tca_pattern(check, BS, 0);
	assert_memory_equal(host + (size_t)0 * BS, check, BS); /* block 0 came from host 0 */
	/* back to the normal choice: the batch API takes batches again (CUDA 12.8+) */
	assert_int_equal(kvt_device_cuda_copy_path(d, KVT_CUDA_COPY_AUTO, NULL), 0);
	assert_int_equal(kvt_device_cuda_batched(d), CUDART_VERSION >= 12080 ? 1 : 0);
	d->ops->host_free(d, host, (size_t)(NB + 2) * BS);
	d->ops->mem_free(d, dev);
	d->ops->stream_destroy(d, s);
	kvt_device_destroy(d);
	free(back);
	free(pageable);
	free(check);
}
#endif /* KVT_WITH_CUDA */

int
main(void)
{
#ifdef KVT_WITH_CUDA
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_copy_waits_for_write),
		cmocka_unit_test(test_slot_not_reused_while_read),
		cmocka_unit_test(test_stream_waits_for_promotion),
		cmocka_unit_test(test_cuda_error_reported),
		cmocka_unit_test(test_copy_kernel_fallback),
		cmocka_unit_test_setup_teardown(test_copy_waits_for_write, tca_force_kernel,
						tca_unforce),
		cmocka_unit_test_setup_teardown(test_slot_not_reused_while_read,
						tca_force_kernel, tca_unforce),
		cmocka_unit_test_setup_teardown(test_stream_waits_for_promotion,
						tca_force_kernel, tca_unforce),
	};
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		printf("test_cuda_async: no usable GPU: skipped\n");
		return 77;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
#else
	printf("test_cuda_async: built without KVT_WITH_CUDA: skipped\n");
	return 77;
#endif
}
