/* SPDX-License-Identifier: MIT */
/*
 * tests/test_run_cuda.c - the real model (stories260K from the shared data) decoded by
 * kvtier-run's CUDA path (HBM on the GPU, K/V written with cudaMemcpy, attention by the CUDA
 * kernel) gives the same tokens as the CPU reference (contiguous KV, llama2.c's loop), for
 * f32, f16 and bf16 KV; and with 3 sessions x 2 turns in an HBM of 6 blocks (windowed
 * attention on the GPU, parking between turns). Greedy decoding.
 *
 * The GPU sums in another order and uses its own expf, so equality is expected, not
 * guaranteed: a mismatch prints both texts and the first differing position.
 * KVT_TEST_QUICK=1 (compute-sanitizer, the CPU emulation of KVT_CUDA_EMU builds) decodes 128
 * tokens per turn instead of 256 in the single-session runs, and 88 in the windowed one: its
 * cost is the emulated attention launches (one per layer, or per window and layer, ~5 ms each
 * under ASan: about 7,900 at 128 tokens a turn, 4,100 at 88), and 88 still takes each session
 * past two full windows (176 positions: 11 blocks, windows of 5, 5 and 1 of the 6-block HBM).
 * The test asserts that the run really windowed, parked, evicted from HBM and promoted back.
 * Skips (77) without CUDA in the build, without a GPU, or without the shared data.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/kvt_test.h"
#include "support/run_util.h"
#include "tools/kvtier-run/model.h"
#include "tools/kvtier-run/tokenizer.h"
#include "tools/kvtier-run/util.h"

#ifdef KVT_WITH_CUDA
#include <cuda_runtime_api.h>

static struct kvtr_model trc_m;
static struct kvtr_tokenizer trc_t;

#define TRC_HBM_BLOCKS 6u       /* HBM of the windowed run: windows of 5 blocks */
#define TRC_QUICK_STEPS 128u     /* tokens per turn under KVT_TEST_QUICK=1 */
#define TRC_QUICK_WIN_STEPS 88u  /* ... in the windowed run (3 windows at the end) */

/* Tokens per turn: 256, or under KVT_TEST_QUICK=1 @quick. */
static uint32_t
trc_steps(uint32_t quick)
{
	return kvt_test_quick() ? quick : 256;
}

static void
trc_run(struct kvtr_run_result *r, int cuda, enum kvt_dtype dt, uint32_t sessions,
	uint32_t turns, uint64_t hbm_blocks, uint32_t steps)
{
	struct kvtr_run_opts o;
	uint64_t block = 16ull * trc_m.cfg.n_layers * 2 * trc_m.kv_dim * kvt_dtype_size(dt);

	kvtr_run_opts_init(&o);
	o.model = &trc_m;
	o.tok = &trc_t;
	o.steps = steps;
	o.temperature = 0.0f;
	o.sessions = sessions;
	o.turns = turns;
	o.kv_dtype = dt;
	o.reference = !cuda;
	o.device = cuda ? KVT_DEVICE_CUDA : KVT_DEVICE_EMULATED;
	o.hbm_bytes = hbm_blocks * block;
	o.host_bytes = hbm_blocks ? 64 * block : 0;
	if (kvtr_run(&o, r))
		fail_msg("kvtr_run (%s): %s", cuda ? "cuda" : "reference", kvtr_last_error());
}

static void
trc_compare(const struct kvtr_run_result *ref, const struct kvtr_run_result *gpu, const char *what)
{
	for (size_t i = 0; i < (size_t)ref->sessions * ref->turns; i++) {
		const struct kvtr_turn_out *a = &ref->out[i], *b = &gpu->out[i];
		uint32_t k = 0;

		while (k < a->n_tokens && k < b->n_tokens && a->tokens[k] == b->tokens[k])
			k++;
		if (k == a->n_tokens && k == b->n_tokens)
			continue;
		fail_msg("%s, output %zu: tokens differ at %u\nCPU: %s\nGPU: %s", what, i, k,
			 a->text, b->text);
	}
	print_message("%s: %zu outputs equal (%u tokens in the first)\n", what,
		      (size_t)ref->sessions * ref->turns, ref->out[0].n_tokens);
}

static void
test_model_cuda_vs_cpu(void **state)
{
	static const enum kvt_dtype dts[] = { KVT_DTYPE_F32, KVT_DTYPE_F16, KVT_DTYPE_BF16 };
	static const char *names[] = { "f32", "f16", "bf16" };

	(void)state;
	for (size_t i = 0; i < 3; i++) {
		struct kvtr_run_result ref, gpu;

		trc_run(&ref, 0, dts[i], 1, 1, 0, trc_steps(TRC_QUICK_STEPS));
		trc_run(&gpu, 1, dts[i], 1, 1, 0, trc_steps(TRC_QUICK_STEPS));
		trc_compare(&ref, &gpu, names[i]);
		kvtr_run_result_free(&ref);
		kvtr_run_result_free(&gpu);
	}
}

static void
test_model_cuda_windows_and_parking(void **state)
{
	const uint32_t steps = trc_steps(TRC_QUICK_WIN_STEPS);
	struct kvtr_run_result ref, gpu;

	(void)state;
	trc_run(&ref, 0, KVT_DTYPE_F16, 3, 2, 0, steps);
	trc_run(&gpu, 1, KVT_DTYPE_F16, 3, 2, TRC_HBM_BLOCKS, steps);
	assert_true(gpu.windows > 0); /* the GPU path really decoded by windows */
	assert_true(gpu.parks > 0);
	/* the sessions' blocks crossed the HBM/HOST boundary both ways */
	assert_true(gpu.stats.tier[KVT_TIER_HBM].evictions > 0);
	assert_true(gpu.stats.blocks_moved[KVT_MOVE_HBM_TO_HOST] > 0);
	assert_true(gpu.stats.blocks_moved[KVT_MOVE_HOST_TO_HBM] > 0);
	/* some session outgrew two full windows (hbm - 1 blocks each): a middle window too */
	assert_true(gpu.kv_blocks > 3 * 2 * (uint64_t)(TRC_HBM_BLOCKS - 1));
	trc_compare(&ref, &gpu, "3 sessions x 2 turns, HBM of 6 blocks");
	kvtr_run_result_free(&ref);
	kvtr_run_result_free(&gpu);
}
#endif /* KVT_WITH_CUDA */

int
main(void)
{
#ifdef KVT_WITH_CUDA
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_model_cuda_vs_cpu),
		cmocka_unit_test(test_model_cuda_windows_and_parking),
	};
	const char *mp = rutil_model_file("stories260K.bin"), *tp = rutil_model_file("tok512.bin");
	int n = 0, rc;

	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		printf("test_run_cuda: no usable GPU: skipped\n");
		return 77;
	}
	if (!mp || !tp) {
		printf("test_run_cuda: stories260K/tok512 not found under %s: skipped\n",
		       rutil_data_dir());
		return 77;
	}
	if (kvtr_model_load(mp, &trc_m) || kvtr_tokenizer_load(tp, trc_m.cfg.vocab_size, &trc_t)) {
		printf("test_run_cuda: cannot load the model: %s\n", kvtr_last_error());
		return 1;
	}
	rc = cmocka_run_group_tests(tests, NULL, NULL);
	kvtr_tokenizer_free(&trc_t);
	kvtr_model_free(&trc_m);
	return rc;
#else
	printf("test_run_cuda: built without KVT_WITH_CUDA: skipped\n");
	return 77;
#endif
}
