/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-hf/main.c - kvtier-hf: run a Hugging Face model (config.json + model.safetensors
 * from save_pretrained) in C float32 with its KV in kvtier, greedy, and check it against the
 * reference of tools/hf-fixtures/gen.py. See hf.h for the families and the method.
 *
 *   kvtier-hf --model-dir tests/data/hf/gemma3 --check tests/data/hf/gemma3
 *   kvtier-hf --model-dir DIR --prompt-ids 5,17,9 --steps 20
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "hf.h"
#include "util.h"

static void
usage(FILE *f)
{
	fprintf(f,
		"usage: kvtier-hf --model-dir DIR [options]\n"
		"  --model-dir DIR        config.json + model.safetensors (save_pretrained)\n"
		"  --check REF            REF/reference.json (or the file itself): the prompt, the\n"
		"                         greedy tokens and the logits to match; exit 1 on mismatch\n"
		"  --tol X                logit tolerance (absolute; default %g)\n"
		"  --prompt-ids A,B,...   prompt token ids (default: the reference's)\n"
		"  --steps N              greedy tokens to generate (default: the reference's, or 16)\n"
		"  --tokens-per-block N   kvtier block size (default 16)\n"
		"  --hbm SIZE | --hbm-frac F    HBM tier: bytes, or a fraction of the run's KV (per\n"
		"                         group: of the KV the group holds, window-bound for WINDOW)\n"
		"  --host SIZE | --host-frac F  HOST tier, likewise (default: all of it)\n"
		"  --no-host              no HOST tier\n"
		"  --nvme SIZE            NVMe tier bytes (default: all of it)\n"
		"  --nvme-dir DIR         NVMe directory (default: a temporary one; --persist needs\n"
		"                         one of its own)\n"
		"  --park-every N         park to NVMe and resume after every N positions\n"
		"  --prefix-share         run a second sequence that attaches the prompt's blocks\n"
		"  --persist              persistent store in --nvme-dir: kill -9 midway (a child),\n"
		"                         restore the session, finish (not with --prefix-share)\n"
		"  --close-first          --prefix-share: close the first sequence before the second\n"
		"                         attaches (its blocks only in the prefix cache)\n"
		"  --prompt-len N         with --check: the first N tokens of the reference path are\n"
		"                         the prompt (N >= the reference's prompt; same logits)\n"
		"  --kv-shared-layers N   the last N layers read an earlier layer's K/V (Gemma 3n's\n"
		"                         rule; overrides config.json's num_kv_shared_layers)\n"
		"  --report               memory: slots in use per group (all tiers) after every\n"
		"                         position, against kvtier-calc's per-group figure\n"
		"  --single-layout        the engine's single layout instead of layer groups (every\n"
		"                         layer K+V; MLA's V allocated unused; all blocks kept)\n"
		"  --contiguous           no kvtier: K/V in one plain array (the reference for\n"
		"                         models without a transformers one)\n"
		"  --dump-logits FILE     write the logits as raw f32 [positions - 1][vocab]\n"
		"  --bench-decode         the decode benchmark (bench.c): --sessions N (16) decode\n"
		"                         --steps positions (128) each, resident / offloaded to\n"
		"                         1/--ratio R (4) of the KV in HBM / with prefetch; --repeat\n"
		"                         N (3), --measure-from S (last quarter), --bandwidth B\n"
		"                         (emulated copy bytes/s; default memcpy / 4),\n"
		"                         --prefetch-depth N (2: sessions hinted ahead in (c))\n"
		"  --emu-lazy             (no value; meant for --bench-decode, --bench-sparse;\n"
		"                         applies to every engine of the run) the emulated\n"
		"                         device's lazy streams: a copy runs on the thread that\n"
		"                         observes it, after the same link time, instead of\n"
		"                         waking a stream thread per submit (kvt_engine_opts.\n"
		"                         emu_lazy; docs/PERF.md \"Lazy emulated streams\")\n"
		"  --bench-sparse         deepseek_v32: --steps N (32) greedy tokens after\n"
		"                         16 x index_topk positions (the --check path or\n"
		"                         --prompt-ids, repeated): resident / HBM 25%% of the\n"
		"                         blocks (rest HOST) / the same with the next step's\n"
		"                         selection prefetched (per step; one layer ahead);\n"
		"                         median of --repeat N (3) step times; tokens must\n"
		"                         agree; --tokens-per-block (4 here), --bandwidth B\n",
		KVHF_TOL);
}

static int
parse_ids(const char *s, int32_t **out, uint32_t *n)
{
	size_t cap = strlen(s) / 2 + 2;
	const char *p = s;

	*out = calloc(cap, sizeof(int32_t));
	*n = 0;
	if (!*out)
		return kvtr_err(-ENOMEM, "out of memory");
	while (*p) {
		char *end;
		long v = strtol(p, &end, 10);

		if (end == p || v < 0 || v > 1 << 24 || (*end && *end != ','))
			return kvtr_err(-EINVAL, "--prompt-ids: bad list at \"%s\"", p);
		(*out)[(*n)++] = (int32_t)v;
		p = *end ? end + 1 : end;
	}
	if (*n == 0)
		return kvtr_err(-EINVAL, "--prompt-ids: empty");
	return 0;
}

int
main(int argc, char **argv)
{
	struct kvhf_opts o;
	struct kvhf_ref ref;
	struct kvhf_result r;
	struct kvhf_model *m = NULL;
	const char *dir = NULL, *check = NULL, *ids = NULL, *dump = NULL;
	char refdir[4096];
	float hbm_frac = 0.0f, host_frac = 0.0f, tol = (float)KVHF_TOL;
	uint32_t steps = 0, prompt_len = 0, shared = 0;
	uint32_t sessions = 16, ratio = 4, repeat = 3, measure_from = 0, depth = 2;
	uint64_t bandwidth = 0;
	int have_shared = 0, bench = 0, bench_sparse = 0, have_tpb = 0;
	int32_t *prompt = NULL;
	uint32_t n_prompt = 0;
	int rc = 0, have_steps = 0;
	double diff = 0.0;

	kvhf_opts_init(&o);
	memset(&ref, 0, sizeof(ref));
	memset(&r, 0, sizeof(r));
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int val = 1;

		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage(stdout);
			return 0;
		} else if (!strcmp(a, "--no-host")) {
			o.no_host = 1, val = 0;
		} else if (!strcmp(a, "--prefix-share")) {
			o.prefix_share = 1, val = 0;
		} else if (!strcmp(a, "--persist")) {
			o.persist = 1, val = 0;
		} else if (!strcmp(a, "--close-first")) {
			o.close_first = 1, val = 0;
		} else if (!strcmp(a, "--emu-lazy")) {
			o.emu_lazy = 1, val = 0;
		} else if (!strcmp(a, "--bench-decode")) {
			bench = 1, val = 0;
		} else if (!strcmp(a, "--bench-sparse")) {
			bench_sparse = 1, val = 0;
		} else if (!strcmp(a, "--report")) {
			o.report = 1, val = 0;
		} else if (!strcmp(a, "--single-layout")) {
			o.single_layout = 1, val = 0;
		} else if (!strcmp(a, "--contiguous")) {
			o.contiguous = 1, val = 0;
		} else if (!v) {
			fprintf(stderr, "kvtier-hf: %s needs a value (or is unknown)\n", a);
			usage(stderr);
			return 2;
		} else if (!strcmp(a, "--model-dir")) {
			dir = v;
		} else if (!strcmp(a, "--check")) {
			check = v;
		} else if (!strcmp(a, "--prompt-ids")) {
			ids = v;
		} else if (!strcmp(a, "--steps")) {
			rc = kvtr_parse_u32(a, v, 0, 1 << 20, &steps);
			have_steps = 1;
		} else if (!strcmp(a, "--tol")) {
			rc = kvtr_parse_float(a, v, 0.0f, 1e6f, &tol);
		} else if (!strcmp(a, "--tokens-per-block")) {
			rc = kvtr_parse_u32(a, v, 1, 65536, &o.tokens_per_block);
			have_tpb = 1;
		} else if (!strcmp(a, "--hbm")) {
			rc = kvtr_parse_size(a, v, &o.hbm_bytes);
		} else if (!strcmp(a, "--hbm-frac")) {
			rc = kvtr_parse_float(a, v, 1e-6f, 1.0f, &hbm_frac);
		} else if (!strcmp(a, "--host")) {
			rc = kvtr_parse_size(a, v, &o.host_bytes);
		} else if (!strcmp(a, "--host-frac")) {
			rc = kvtr_parse_float(a, v, 1e-6f, 1.0f, &host_frac);
		} else if (!strcmp(a, "--nvme")) {
			rc = kvtr_parse_size(a, v, &o.nvme_bytes);
		} else if (!strcmp(a, "--nvme-dir")) {
			o.nvme_dir = v;
		} else if (!strcmp(a, "--dump-logits")) {
			dump = v;
		} else if (!strcmp(a, "--sessions")) {
			rc = kvtr_parse_u32(a, v, 1, 4096, &sessions);
		} else if (!strcmp(a, "--prefetch-depth")) {
			rc = kvtr_parse_u32(a, v, 1, 8, &depth);
		} else if (!strcmp(a, "--ratio")) {
			rc = kvtr_parse_u32(a, v, 1, 1024, &ratio);
		} else if (!strcmp(a, "--repeat")) {
			rc = kvtr_parse_u32(a, v, 1, 100, &repeat);
		} else if (!strcmp(a, "--measure-from")) {
			rc = kvtr_parse_u32(a, v, 1, 1 << 20, &measure_from);
		} else if (!strcmp(a, "--bandwidth")) {
			rc = kvtr_parse_size(a, v, &bandwidth);
		} else if (!strcmp(a, "--prompt-len")) {
			rc = kvtr_parse_u32(a, v, 1, 1 << 26, &prompt_len);
		} else if (!strcmp(a, "--kv-shared-layers")) {
			rc = kvtr_parse_u32(a, v, 0, 4096, &shared);
			have_shared = 1;
		} else if (!strcmp(a, "--park-every")) {
			rc = kvtr_parse_u32(a, v, 0, 1 << 20, &o.park_every);
		} else {
			fprintf(stderr, "kvtier-hf: unknown option %s\n", a);
			usage(stderr);
			return 2;
		}
		if (rc) {
			fprintf(stderr, "kvtier-hf: %s\n", kvtr_last_error());
			return 2;
		}
		i += val;
	}
	if (!dir) {
		usage(stderr);
		return 2;
	}
	if (o.persist && !o.nvme_dir) {
		fprintf(stderr, "kvtier-hf: --persist needs --nvme-dir DIR (the store must outlive "
			"the killed child, so no temporary directory is made for it)\n");
		return 2;
	}
	if (o.persist && o.prefix_share) {
		fprintf(stderr, "kvtier-hf: --persist and --prefix-share are separate checks: give "
			"one of them per run\n");
		return 2;
	}
	if (prompt_len && !check) {
		fprintf(stderr, "kvtier-hf: --prompt-len splits the reference path: give --check\n");
		return 2;
	}
	rc = kvhf_model_load(dir, &m);
	if (rc == 0 && have_shared)
		rc = kvhf_model_share_kv(m, (int)shared);
	if (rc == 0 && check) {
		struct stat sb;

		snprintf(refdir, sizeof(refdir), "%s", check);
		if (stat(check, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
			char *slash = strrchr(refdir, '/');

			if (slash)
				*slash = '\0';
			else
				snprintf(refdir, sizeof(refdir), ".");
		}
		rc = kvhf_ref_load(refdir, &ref);
		if (rc == 0 && ref.vocab != (uint32_t)m->vocab)
			rc = kvtr_err(KVT_EFORMAT, "the reference has %u logits per row, the model "
				      "a vocabulary of %d", ref.vocab, m->vocab);
		if (rc == 0 && prompt_len)
			rc = kvhf_ref_resplit(&ref, prompt_len);
	}
	if (rc == 0 && bench) {
		o.model = m;
		o.sessions = sessions;
		o.n_prompt = have_steps ? steps : 128;
		o.gen = 0;
		rc = kvhf_bench_decode(&o, ratio, measure_from, repeat, bandwidth, depth);
		if (rc)
			fprintf(stderr, "kvtier-hf: %s\n", kvtr_last_error());
		rc = rc ? 1 : 0;
		goto out;
	}
	if (rc == 0 && ids)
		rc = parse_ids(ids, &prompt, &n_prompt);
	if (rc == 0 && bench_sparse) { /* the path: --prompt-ids, or the reference's tokens */
		uint32_t np = prompt ? n_prompt : ref.n_prompt + ref.n_gen;
		int32_t *path = calloc(np + 1, sizeof(int32_t));

		if (!path) {
			rc = kvtr_err(-ENOMEM, "out of memory");
		} else if (!prompt && !check) {
			rc = kvtr_err(-EINVAL, "--bench-sparse needs --check REF or --prompt-ids");
		} else {
			if (prompt) {
				memcpy(path, prompt, (size_t)np * sizeof(int32_t));
			} else {
				memcpy(path, ref.prompt, (size_t)ref.n_prompt * sizeof(int32_t));
				memcpy(path + ref.n_prompt, ref.gen,
				       (size_t)ref.n_gen * sizeof(int32_t));
			}
			o.model = m;
			if (!have_tpb)
				o.tokens_per_block = 4;
			rc = kvhf_bench_sparse(&o, path, np, have_steps ? steps : 32, repeat,
					       bandwidth, stdout, NULL);
		}
		free(path);
		if (rc)
			fprintf(stderr, "kvtier-hf: %s\n", kvtr_last_error());
		rc = rc ? 1 : 0;
		goto out;
	}
	if (rc) {
		fprintf(stderr, "kvtier-hf: %s\n", kvtr_last_error());
		rc = 1;
		goto out;
	}
	o.model = m;
	o.prompt = prompt ? prompt : ref.prompt;
	o.n_prompt = prompt ? n_prompt : ref.n_prompt;
	o.gen = have_steps ? steps : check ? ref.n_gen : 16;
	if (!o.prompt) {
		fprintf(stderr, "kvtier-hf: no prompt: give --prompt-ids or --check\n");
		rc = 2;
		goto out;
	}
	if ((hbm_frac > 0.0f || host_frac > 0.0f) && o.single_layout) {
		uint64_t kv = kvhf_kv_bytes_single(m, o.tokens_per_block, o.n_prompt + o.gen);
		uint64_t block = kvhf_kv_bytes_single(m, o.tokens_per_block, 1);

		/* whole blocks, at least 2 in HBM (windows) and 1 in HOST */
		if (hbm_frac > 0.0f)
			o.hbm_bytes = ((uint64_t)((double)kv * hbm_frac) / block > 2
				       ? (uint64_t)((double)kv * hbm_frac) / block : 2) * block;
		if (host_frac > 0.0f)
			o.host_bytes = ((uint64_t)((double)kv * host_frac) / block > 1
					? (uint64_t)((double)kv * host_frac) / block : 1) * block;
	} else if (hbm_frac > 0.0f || host_frac > 0.0f) { /* per group (hf.h) */
		o.hbm_frac = hbm_frac > 0.0f ? hbm_frac : 1.0f;
		o.host_frac = host_frac > 0.0f ? host_frac : 1.0f;
	}
	rc = kvhf_run(&o, &r);
	if (rc) {
		fprintf(stderr, "kvtier-hf: %s\n", kvtr_last_error());
		rc = 1;
		goto out;
	}
	printf("model %s (%s): %u prompt + %u generated tokens; %u group(s); group 0: HBM %u, "
	       "HOST %u, NVMe %u slots of %llu bytes; %llu windows\n", dir, m->model_type,
	       o.n_prompt, o.gen, r.n_groups, r.geo.hbm_slots, r.geo.host_slots,
	       r.geo.nvme_slots, (unsigned long long)r.geo.block_bytes,
	       (unsigned long long)r.windows);
	if (m->dsa) /* DSA: the blocks the selected tokens live in, against dense attention */
		printf("sparse (DSA top-%d): %llu blocks resident for attention over %llu steps "
		       "(%.2f a step), dense %llu (%.2f a step): %.1f%%; per layer %llu of %llu\n",
		       m->index_topk, (unsigned long long)r.dsa_blocks,
		       (unsigned long long)r.positions,
		       r.positions ? (double)r.dsa_blocks / (double)r.positions : 0.0,
		       (unsigned long long)r.dense_blocks,
		       r.positions ? (double)r.dense_blocks / (double)r.positions : 0.0,
		       r.dense_blocks ? 100.0 * (double)r.dsa_blocks / (double)r.dense_blocks : 0.0,
		       (unsigned long long)r.dsa_layer_blocks,
		       (unsigned long long)r.dense_layer_blocks);
	if (dump) {
		FILE *f = fopen(dump, "wb");

		if (!f || fwrite(r.logits, sizeof(float) * (size_t)m->vocab, r.n_logits, f) !=
			      r.n_logits || fclose(f) != 0) {
			fprintf(stderr, "kvtier-hf: cannot write %s\n", dump);
			rc = 1;
			goto out;
		}
	}
	printf("engine: %llu NVMe reads verified, %llu blocks moved HBM->HOST, %llu HOST->NVMe; "
	       "%llu parks; prefix attached %llu tokens; restored %llu tokens\n",
	       (unsigned long long)r.stats.checksum_verified,
	       (unsigned long long)r.stats.blocks_moved[KVT_MOVE_HBM_TO_HOST],
	       (unsigned long long)r.stats.blocks_moved[KVT_MOVE_HOST_TO_NVME],
	       (unsigned long long)r.parks, (unsigned long long)r.prefix_tokens,
	       (unsigned long long)r.restored_tokens);
	if (o.report) {
		static const char *const kind[] = { "FULL", "WINDOW", "LATENT", "ALIAS", "STATE",
						    "SIDECAR" };

		for (uint32_t g = 0; g < r.n_groups; g++) {
			const struct kvhf_group_mem *x = &r.mem[g];

			printf("report: group %u %-6s %u layers, slot %llu bytes: peak %u slots, end "
			       "%u (all tiers); kvtier-calc's bound %llu blocks\n", g,
			       kind[x->kind], x->n_layers, (unsigned long long)x->block_bytes,
			       x->peak_slots, x->end_slots, (unsigned long long)x->bound_blocks);
		}
		printf("report: %u positions, peak %llu bytes held in all tiers together, "
		       "kvtier-calc's figure %llu bytes: ratio %.3f\n", o.n_prompt + o.gen,
		       (unsigned long long)r.peak_bytes, (unsigned long long)r.bound_bytes,
		       r.bound_bytes ? (double)r.peak_bytes / (double)r.bound_bytes : 0.0);
	}
	printf("generated:");
	for (uint32_t i = o.n_prompt; i < r.n_tokens; i++)
		printf(" %d", r.tokens[i]);
	printf("\n");
	if (check) {
		if (o.prompt != ref.prompt || o.gen != ref.n_gen) {
			fprintf(stderr, "kvtier-hf: --check compares the reference's own prompt and "
				"length; drop --prompt-ids/--steps\n");
			rc = 2;
			goto out;
		}
		rc = kvhf_check(&ref, &r, tol, &diff);
		printf("check: max abs logit diff %.3g (tolerance %g): %s\n", diff, tol,
		       rc ? "MISMATCH" : "ok");
		if (rc) {
			fflush(stdout);
			fprintf(stderr, "kvtier-hf: %s\n", kvtr_last_error());
			rc = 1;
		}
	}
out:
	kvhf_result_free(&r);
	kvhf_ref_free(&ref);
	kvhf_model_free(m);
	free(prompt);
	return rc;
}
