/* SPDX-License-Identifier: MIT */
/*
 * tests/test_hf_qwen3next.c - issue 17 item 4 (Qwen3-Next): the transformers fixture
 * tests/data/hf/qwen3-next (Qwen3NextForCausalLM, 3 Gated DeltaNet layers and 1 gated
 * full-attention layer, written by tools/hf-fixtures/gen.py) run by kvtier-hf's library with
 * the full-attention K/V in a FULL group and the linear-attention state (convolution state
 * and delta-rule matrix per layer) in a STATE group (engine/kvtier.h "STATE groups"), under
 * the placements of tests/test_hf_models.c: (i) all in HBM, (ii) HBM 10% and HOST 25% of what
 * each group holds (the rest on NVMe), (iii) parked to NVMe and resumed every 16 positions,
 * (iv) prefix sharing (the second sequence attaches the first's prompt blocks and continues
 * from the restored state checkpoint), (v) a persistent store, kill -9 halfway, restore. Each
 * must give the reference's greedy tokens exactly and its logits within KVHF_TOL. Also: prompts
 * ending exactly on a block boundary and one token either side for (iv) (a hit ends only where
 * a checkpoint exists: the whole blocks of prompt - 1), the state kvtier holds after the prompt
 * against transformers' own cache (states.safetensors), and checks that fail when they should.
 *
 * Tolerance: KVHF_TOL (1e-4) as for the other families. Measured max abs logit diff 1.1e-5
 * under every placement, tokens per block 4 and 16 (transformers computes the reference path
 * without a cache, i.e. the prompt through torch_chunk_gated_delta_rule's chunked form and a
 * full conv1d, the C side one token at a time through the recurrent form: the same algebra in
 * another order); the fixture's smallest greedy margin is 8.1e-3.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <errno.h>
#include <math.h>

#include "calc.h"
#include "fwd.h"
#include "hf.h"
#include "support/kvt_test.h"
#include "util.h"

#define Q3N "qwen3-next"

/* tests/data/hf/<name>, found from this file's path (CMake compiles with full paths). */
static const char *
q3n_dir(const char *name)
{
	static char path[4096];
	const char *slash = strrchr(__FILE__, '/');
	int dir = slash ? (int)(slash - __FILE__) : 1;

	snprintf(path, sizeof path, "%.*s/data/hf/%s", dir, slash ? __FILE__ : ".", name);
	return path;
}

enum q3n_place { Q3N_ALL_HBM, Q3N_TIERED, Q3N_PARKED, Q3N_PREFIX, Q3N_PREFIX_TIERED,
		 Q3N_PERSIST };

static const char *const q3n_place_names[] = { "all in HBM", "HBM 10%, HOST 25%, NVMe",
					       "parked between turns", "prefix sharing",
					       "prefix sharing, HBM 10%, HOST 25%",
					       "persistent store, kill -9, restore" };

/* The fixture's model and reference (the first @n_prompt tokens of its path as the prompt
 * when @n_prompt is not 0: kvhf_ref_resplit). */
static void
q3n_load(struct kvhf_model **m, struct kvhf_ref *ref, uint32_t n_prompt)
{
	if (kvhf_model_load(q3n_dir(Q3N), m))
		fail_msg("load: %s", kvtr_last_error());
	if (kvhf_ref_load(q3n_dir(Q3N), ref))
		fail_msg("reference: %s", kvtr_last_error());
	if (n_prompt && kvhf_ref_resplit(ref, n_prompt))
		fail_msg("resplit %u: %s", n_prompt, kvtr_last_error());
}

/*
 * Runs the fixture under @place with @tpb tokens per block, the first @n_prompt tokens of the
 * reference path as the prompt (0: the reference's own), and checks tokens and logits; the
 * placement's own evidence asserted. Returns the tokens the second sequence attached (prefix
 * placements), else 0.
 */
static uint64_t
q3n_case(enum q3n_place place, uint32_t tpb, uint32_t n_prompt, int close_first)
{
	struct kvhf_model *m = NULL;
	struct kvhf_ref ref;
	struct kvhf_result r;
	struct kvhf_opts o;
	char *tmp = NULL;
	double diff = -1.0;
	uint64_t attached = 0;
	const uint64_t *sm = r.group_moved[1]; /* the STATE group's moves */

	q3n_load(&m, &ref, n_prompt);
	kvhf_opts_init(&o);
	o.model = m;
	o.prompt = ref.prompt;
	o.n_prompt = ref.n_prompt;
	o.gen = ref.n_gen;
	o.tokens_per_block = tpb;
	if (place == Q3N_TIERED || place == Q3N_PARKED || place == Q3N_PERSIST ||
	    place == Q3N_PREFIX_TIERED) {
		o.hbm_frac = 0.1f;
		o.host_frac = 0.25f;
	}
	if (place == Q3N_PARKED)
		o.park_every = 16;
	if (place == Q3N_PREFIX || place == Q3N_PREFIX_TIERED) {
		o.prefix_share = 1;
		o.close_first = close_first;
	}
	if (place == Q3N_PERSIST) {
		tmp = tsup_mkdtemp();
		o.nvme_dir = tmp;
		o.persist = 1;
	}
	if (kvhf_run(&o, &r))
		fail_msg("%s, tpb %u, prompt %u: %s", q3n_place_names[place], tpb, o.n_prompt,
			 kvtr_last_error());
	if (kvhf_check(&ref, &r, KVHF_TOL, &diff))
		fail_msg("%s, tpb %u, prompt %u: %s", q3n_place_names[place], tpb, o.n_prompt,
			 kvtr_last_error());
	print_message("%-36s tpb %2u prompt %3u%s: attached %3llu, max abs logit diff %.3g\n",
		      q3n_place_names[place], tpb, o.n_prompt, close_first ? " (first closed)" : "",
		      (unsigned long long)r.prefix_tokens, diff);
	assert_int_equal(r.n_groups, 2); /* FULL (layer 3), STATE (layers 0-2) */
	print_message("%-36s tpb %2u prompt %3u: STATE group moved HBM->HOST %llu, HOST->NVMe "
		      "%llu, NVMe->HOST %llu, HOST->HBM %llu\n", q3n_place_names[place], tpb,
		      o.n_prompt, (unsigned long long)r.group_moved[1][KVT_MOVE_HBM_TO_HOST],
		      (unsigned long long)r.group_moved[1][KVT_MOVE_HOST_TO_NVME],
		      (unsigned long long)r.group_moved[1][KVT_MOVE_NVME_TO_HOST],
		      (unsigned long long)r.group_moved[1][KVT_MOVE_HOST_TO_HBM]);
	switch (place) {
	case Q3N_ALL_HBM:
		assert_int_equal(r.stats.blocks_moved[KVT_MOVE_HBM_TO_HOST], 0);
		break;
	case Q3N_TIERED: /* down to NVMe and read back (checksums verified); states to HOST */
		assert_true(r.stats.blocks_moved[KVT_MOVE_HOST_TO_NVME] > 0);
		assert_true(r.stats.checksum_verified > 0);
		assert_true(sm[KVT_MOVE_HBM_TO_HOST] > 0 && sm[KVT_MOVE_HOST_TO_HBM] > 0);
		break;
	case Q3N_PARKED: /* the live states parked on NVMe and read back at every resume */
		assert_int_equal(r.parks, (o.n_prompt + o.gen - 1) / 16);
		assert_true(r.stats.checksum_verified > 0);
		assert_true(sm[KVT_MOVE_NVME_TO_HOST] >= r.parks);
		break;
	case Q3N_PREFIX_TIERED: /* checkpoints demoted to NVMe, the hit's read back */
		assert_true(r.stats.blocks_moved[KVT_MOVE_HOST_TO_NVME] > 0);
		assert_true(sm[KVT_MOVE_HOST_TO_NVME] > 0 && sm[KVT_MOVE_NVME_TO_HOST] > 0);
		/* fall through */
	case Q3N_PREFIX: /* the hit ends at the last checkpoint before the prompt's end */
		attached = r.prefix_tokens;
		assert_int_equal(attached, (o.n_prompt - 1) / tpb * tpb);
		break;
	case Q3N_PERSIST: /* the restored live state read from the store */
		assert_int_equal(r.restored_tokens, o.n_prompt + o.gen / 2);
		assert_true(sm[KVT_MOVE_NVME_TO_HOST] > 0);
		break;
	}
	kvhf_result_free(&r);
	kvhf_ref_free(&ref);
	kvhf_model_free(m);
	if (tmp)
		tsup_rmdir(tmp);
	return attached;
}

static void
test_all_hbm(void **state)
{
	(void)state;
	q3n_case(Q3N_ALL_HBM, 4, 0, 0);
	q3n_case(Q3N_ALL_HBM, 16, 0, 0);
}

static void
test_tiered(void **state)
{
	(void)state;
	q3n_case(Q3N_TIERED, 4, 0, 0);
	q3n_case(Q3N_TIERED, 16, 0, 0);
}

static void
test_parked(void **state)
{
	(void)state;
	q3n_case(Q3N_PARKED, 4, 0, 0);
	q3n_case(Q3N_PARKED, 16, 0, 0);
}

static void
test_prefix(void **state)
{
	(void)state;
	q3n_case(Q3N_PREFIX, 4, 0, 0);
	q3n_case(Q3N_PREFIX, 16, 0, 0);
	q3n_case(Q3N_PREFIX_TIERED, 4, 0, 0);
	/* the first sequence closed before the attach: the checkpoint only in the prefix cache */
	q3n_case(Q3N_PREFIX, 4, 0, 1);
	q3n_case(Q3N_PREFIX_TIERED, 16, 0, 1);
}

static void
test_persist_kill9(void **state)
{
	(void)state;
	q3n_case(Q3N_PERSIST, 4, 0, 0);
	q3n_case(Q3N_PERSIST, 16, 0, 0);
}

/*
 * Prompts ending exactly on a block boundary and one token either side, for prefix sharing
 * all in HBM and under 10%/25% tiers: the attached tokens are the whole blocks of prompt - 1
 * (the checkpoint there is what the second sequence continues from). tpb 16: prompts 47, 48,
 * 49 (hits at 32, 32, 48); tpb 4: 40 (the reference's own, on a boundary) and 41.
 */
static void
test_block_boundary_prompts(void **state)
{
	struct kvhf_ref ref;
	uint32_t k;

	(void)state;
	assert_int_equal(kvhf_ref_load(q3n_dir(Q3N), &ref), 0);
	k = (ref.n_prompt + 1 + 15) / 16; /* the first boundary of 16 past the prompt */
	for (uint32_t n = k * 16 - 1; n <= k * 16 + 1; n++) {
		assert_int_equal(q3n_case(Q3N_PREFIX, 16, n, 0), (n - 1) / 16 * 16);
		assert_int_equal(q3n_case(Q3N_PREFIX_TIERED, 16, n, 0), (n - 1) / 16 * 16);
	}
	assert_int_equal(ref.n_prompt % 4, 0);
	for (uint32_t n = ref.n_prompt; n <= ref.n_prompt + 1; n++) {
		assert_int_equal(q3n_case(Q3N_PREFIX, 4, n, 0), (n - 1) / 4 * 4);
		assert_int_equal(q3n_case(Q3N_PREFIX_TIERED, 4, n, 0), (n - 1) / 4 * 4);
	}
	kvhf_ref_free(&ref);
}

/*
 * The state kvtier holds after the prompt (read back from the STATE block of the prompt's last
 * token, as the next position would read it: opts.state_out) against transformers' cache after
 * one cached forward pass over the prompt (states.safetensors: conv [conv_dim][K], of which
 * kvtier keeps the last K - 1; recurrent [nv][dk][dv]), all in HBM and under 10%/25% tiers, and
 * from the contiguous mode (no kvtier).
 */
#define Q3N_STATE_TOL 1e-4
static void
test_state_vs_transformers(void **state)
{
	struct kvhf_model *m = NULL;
	struct kvhf_ref ref;
	char path[4200];

	(void)state;
	q3n_load(&m, &ref, 0);
	snprintf(path, sizeof path, "%s/states.safetensors", q3n_dir(Q3N));
	assert_int_equal(m->n_linear, 3);
	for (int mode = 0; mode < 3; mode++) {
		uint64_t cf = kvhf_gdn_conv_floats(m), rf = kvhf_gdn_rec_floats(m);
		float *out = calloc((size_t)m->n_linear * (cf + rf), sizeof(float));
		struct kvhf_result r;
		struct kvhf_opts o;
		double worst = 0.0;

		assert_non_null(out);
		kvhf_opts_init(&o);
		o.model = m;
		o.prompt = ref.prompt;
		o.n_prompt = ref.n_prompt;
		o.gen = 0;
		o.tokens_per_block = 4;
		o.state_out = out;
		o.contiguous = mode == 2;
		if (mode == 1) {
			o.hbm_frac = 0.1f;
			o.host_frac = 0.25f;
		}
		if (kvhf_run(&o, &r))
			fail_msg("mode %d: %s", mode, kvtr_last_error());
		for (int l = 0; l < m->n_layers; l++) {
			const float *w = out + (size_t)m->layers[l].lin_idx * (cf + rf);
			uint64_t n = 0, shape[4];
			float *t = NULL;
			char name[64];
			int nd = 0, K = m->conv_kernel;

			if (!m->layers[l].linear)
				continue;
			snprintf(name, sizeof name, "layer%d.conv", l);
			assert_int_equal(kvhf_safetensors_f32(path, name, &t, &n, shape, &nd), 0);
			assert_int_equal(n, (uint64_t)m->conv_dim * K);
			for (int c = 0; c < m->conv_dim; c++)
				for (int j = 0; j < K - 1; j++) {
					double d = fabs((double)w[c * (K - 1) + j] -
							(double)t[c * K + j + 1]);

					worst = d > worst ? d : worst;
				}
			free(t);
			snprintf(name, sizeof name, "layer%d.recurrent", l);
			assert_int_equal(kvhf_safetensors_f32(path, name, &t, &n, shape, &nd), 0);
			assert_int_equal(n, rf);
			for (uint64_t i = 0; i < rf; i++) {
				double d = fabs((double)w[cf + i] - (double)t[i]);

				worst = d > worst ? d : worst;
			}
			free(t);
		}
		print_message("state after the prompt (%s): max abs diff to transformers' cache "
			      "%.3g\n", mode == 0 ? "kvtier, all in HBM" : mode == 1 ?
			      "kvtier, HBM 10%, HOST 25%" : "contiguous", worst);
		assert_true(worst <= Q3N_STATE_TOL);
		assert_true(worst > 0.0 || mode == 2); /* not compared against itself */
		kvhf_result_free(&r);
		free(out);
	}
	kvhf_ref_free(&ref);
	kvhf_model_free(m);
}

/*
 * The checks can fail: a linear layer's A_log (its decay, which acts only through the state
 * carried from position to position) or one weight of its short convolution changed by 1e-2
 * moves the logits past the tolerance.
 */
static void
test_check_detects_changes(void **state)
{
	(void)state;
	for (int c = 0; c < 2; c++) {
		struct kvhf_model *m = NULL;
		struct kvhf_ref ref;
		struct kvhf_result r;
		struct kvhf_opts o;
		double diff = 0.0;

		q3n_load(&m, &ref, 0);
		if (c == 0)
			((float *)m->layers[1].A_log)[2] += 1e-2f;
		else
			((float *)m->layers[2].conv_w)[5 * m->conv_kernel] += 1e-2f;
		kvhf_opts_init(&o);
		o.model = m;
		o.prompt = ref.prompt;
		o.n_prompt = ref.n_prompt;
		o.gen = ref.n_gen;
		o.tokens_per_block = 4;
		assert_int_equal(kvhf_run(&o, &r), 0);
		assert_int_equal(kvhf_check(&ref, &r, KVHF_TOL, &diff), KVT_EFORMAT);
		print_message("%s changed by 1e-2: %s\n", c == 0 ? "A_log" : "a conv weight",
			      kvtr_last_error());
		kvhf_result_free(&r);
		kvhf_ref_free(&ref);
		kvhf_model_free(m);
	}
}

/*
 * Memory against kvtier-calc: 128 positions all in HBM (slots in use = blocks held), tokens per
 * block 16 and 4: the engine's groups are calc's (kind, layers, slot bytes exactly) and each
 * group's peak slots after any position at most calc's per-sequence figure (FULL every block,
 * STATE its 2 live slots: without the prefix cache no checkpoint stays).
 */
static void
test_memory_vs_calc(void **state)
{
	static const uint32_t tpbs[] = { 16, 4 };
	int32_t prompt[8] = { 3, 4, 5, 6, 7, 8, 9, 10 };

	(void)state;
	for (size_t t = 0; t < sizeof tpbs / sizeof tpbs[0]; t++) {
		struct kvhf_model *m = NULL;
		struct kvc_model cm;
		struct kvc_query q;
		struct kvc_result cr;
		struct kvhf_result r;
		struct kvhf_opts o;
		char cfg[4200];

		assert_int_equal(kvhf_model_load(q3n_dir(Q3N), &m), 0);
		kvhf_opts_init(&o);
		o.model = m;
		o.prompt = prompt;
		o.n_prompt = 8;
		o.gen = 120;
		o.tokens_per_block = tpbs[t];
		o.report = 1;
		if (kvhf_run(&o, &r))
			fail_msg("tpb %u: %s", tpbs[t], kvtr_last_error());
		snprintf(cfg, sizeof cfg, "%s/config.json", q3n_dir(Q3N));
		kvc_model_init(&cm);
		assert_int_equal(kvc_model_load(cfg, &cm), 0);
		cm.kv_dtype_bytes = 4; /* the runner's f32 K/V and states */
		cm.state_dtype_bytes = 4;
		assert_int_equal(kvc_model_finish(&cm), 0);
		kvc_query_init(&q);
		q.context = 128;
		q.tokens_per_block = tpbs[t];
		assert_int_equal(kvc_compute(&cm, &q, &cr), 0);
		assert_int_equal(r.n_groups, cr.n_groups);
		for (uint32_t g = 0; g < r.n_groups; g++) {
			const struct kvhf_group_mem *x = &r.mem[g];
			const struct kvc_group *y = &cr.groups[g];

			print_message("tpb %2u group %u (kind %d, %u layers): slot %llu bytes (calc "
				      "%.0f), peak %u slots, calc %llu blocks\n", tpbs[t], g,
				      (int)x->kind, x->n_layers, (unsigned long long)x->block_bytes,
				      y->block_bytes, x->peak_slots,
				      (unsigned long long)y->max_blocks);
			assert_int_equal((int)x->kind, (int)y->kind);
			assert_int_equal(x->n_layers, y->n_layers);
			assert_true((double)x->block_bytes == y->block_bytes);
			assert_int_equal(x->bound_blocks, y->max_blocks);
			assert_true(x->peak_slots <= y->max_blocks);
		}
		assert_int_equal((int)r.mem[1].kind, (int)KVT_GROUP_STATE);
		assert_true((double)r.bound_bytes == cr.seq_group_bytes);
		kvhf_result_free(&r);
		kvhf_model_free(m);
	}
}

/* What does not apply is refused with a clear code and message. */
static void
test_refused(void **state)
{
	struct kvhf_model *m = NULL;
	struct kvhf_ref ref;
	struct kvhf_result r;
	struct kvhf_opts o;

	(void)state;
	q3n_load(&m, &ref, 0);
	kvhf_opts_init(&o);
	o.model = m;
	o.prompt = ref.prompt;
	o.n_prompt = ref.n_prompt;
	o.single_layout = 1; /* no place for a state */
	assert_int_equal(kvhf_run(&o, &r), KVT_ENOTSUP);
	assert_non_null(strstr(kvtr_last_error(), "linear-attention"));
	kvhf_result_free(&r);
	assert_int_equal(kvhf_model_share_kv(m, 1), KVT_ENOTSUP);
	kvhf_ref_free(&ref);
	kvhf_model_free(m);
	/* an odd head_dim (17): refused, not run wrong (an odd rotary part is run: test_rot5) */
	{
		char *dir = tsup_mkdtemp(), src[4200], dst[4200], buf[8192], *p;
		FILE *f;
		size_t len;

		snprintf(src, sizeof src, "%s/config.json", q3n_dir(Q3N));
		f = fopen(src, "r");
		assert_non_null(f);
		len = fread(buf, 1, sizeof buf - 1, f);
		fclose(f);
		buf[len] = '\0';
		p = strstr(buf, "\"head_dim\": 16");
		assert_non_null(p);
		memcpy(p, "\"head_dim\": 17", 14);
		snprintf(dst, sizeof dst, "%s/config.json", dir);
		f = fopen(dst, "w");
		assert_non_null(f);
		fputs(buf, f);
		fclose(f);
		m = NULL;
		assert_int_equal(kvhf_model_load(dir, &m), KVT_ENOTSUP);
		assert_non_null(strstr(kvtr_last_error(), "head_dim 17"));
		assert_null(m);
		unlink(dst);
		tsup_rmdir(dir);
	}
}

/*
 * An odd rotary part (tests/data/hf/qwen3-next-rot5: head_dim 20 x partial_rotary_factor 0.25
 * = 5, which transformers' rope turns into 3 frequencies theta^(-2i/5) over the first 6 dims):
 * all in HBM and HBM 10% / HOST 25%, tokens exact, logits within KVHF_TOL (refused before:
 * the held-back variant qwen3-next-odd-rotary of tools/hf-fixtures/variants.py).
 */
static void
test_rot5(void **state)
{
	for (int tiered = 0; tiered < 2; tiered++) {
		struct kvhf_model *m = NULL;
		struct kvhf_ref ref;
		struct kvhf_result r;
		struct kvhf_opts o;
		double diff = -1.0;

		(void)state;
		if (kvhf_model_load(q3n_dir("qwen3-next-rot5"), &m))
			fail_msg("load: %s", kvtr_last_error());
		assert_int_equal(m->rotary_dim, 5);
		if (kvhf_ref_load(q3n_dir("qwen3-next-rot5"), &ref))
			fail_msg("reference: %s", kvtr_last_error());
		kvhf_opts_init(&o);
		o.model = m;
		o.prompt = ref.prompt;
		o.n_prompt = ref.n_prompt;
		o.gen = ref.n_gen;
		o.tokens_per_block = 4;
		if (tiered) {
			o.hbm_frac = 0.1f;
			o.host_frac = 0.25f;
		}
		if (kvhf_run(&o, &r))
			fail_msg("run: %s", kvtr_last_error());
		if (kvhf_check(&ref, &r, KVHF_TOL, &diff))
			fail_msg("%s: %s", tiered ? "tiered" : "all in HBM", kvtr_last_error());
		print_message("qwen3-next-rot5 %s: max abs logit diff %.3g\n",
			      tiered ? "HBM 10%, HOST 25%" : "all in HBM", diff);
		kvhf_result_free(&r);
		kvhf_ref_free(&ref);
		kvhf_model_free(m);
	}
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_all_hbm),
		cmocka_unit_test(test_tiered),
		cmocka_unit_test(test_parked),
		cmocka_unit_test(test_prefix),
		cmocka_unit_test(test_persist_kill9),
		cmocka_unit_test(test_block_boundary_prompts),
		cmocka_unit_test(test_state_vs_transformers),
		cmocka_unit_test(test_memory_vs_calc),
		cmocka_unit_test(test_check_detects_changes),
		cmocka_unit_test(test_refused),
		cmocka_unit_test(test_rot5),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
