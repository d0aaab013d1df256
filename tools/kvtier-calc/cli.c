/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-calc/cli.c - kvtier-calc's options: a config.json and/or geometry flags (flags
 * win), the query (context, batch, block size), the budgets and the weights; --json.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "calc.h"
#include "util.h"

static void
cli_usage(FILE *f)
{
	fputs("usage: kvtier-calc [--config config.json] [options]\n"
	      "KV-cache size of a model and how many sessions fit in HBM, host memory and NVMe.\n"
	      "Model (a Hugging Face config.json, and/or flags, which override it):\n"
	      "  --config F            config.json (text_config of multimodal configs is used)\n"
	      "  --layers N            transformer layers\n"
	      "  --heads N             attention heads\n"
	      "  --kv-heads N          K/V heads (GQA; 1 = MQA; default --heads: MHA)\n"
	      "  --hidden N            hidden size (head dim = hidden / heads)\n"
	      "  --head-dim N          K/V head dim\n"
	      "  --v-head-dim N        V head dim when it differs from K's\n"
	      "  --kv-lora-rank N      MLA latent width (DeepSeek kv_lora_rank)\n"
	      "  --rope-dim N          MLA decoupled rope key dim (qk_rope_head_dim)\n"
	      "  --sliding-window N    window of the sliding layers, tokens (0 = none)\n"
	      "  --full-every N        with a window: every Nth layer is full attention\n"
	      "                        (Gemma 2: 2, Gemma 3: 6; default: all layers slide)\n"
	      "  --kv-shared-layers N  the last N layers reuse earlier layers' KV\n"
	      "  --kv-dtype T          fp32, fp16, bf16, fp8, int8, int4 (default: the config's\n"
	      "                        torch_dtype, but bf16 for a float32 one, as servers\n"
	      "                        run it; bf16 without a config)\n"
	      "  --state-dtype T       linear-attention state (Gated DeltaNet layers, read from\n"
	      "                        config.json: layer_types or full_attention_interval and\n"
	      "                        linear_*; kernel default 4): default the model's dtype\n"
	      "                        (vLLM's mamba_ssm_cache_dtype auto), not --kv-dtype\n"
	      "Query:\n"
	      "  --context N           tokens per sequence (default 4096)\n"
	      "  --batch N             sequences (default 1)\n"
	      "  --tokens-per-block N  kvtier block size (default 16)\n"
	      "Budgets (bytes with binary K/M/G/T/P suffixes and fractions, e.g. 80G, 1.5T):\n"
	      "  --hbm SIZE            GPU memory; the weights are taken out first\n"
	      "  --hbm-util F          fraction of --hbm usable (default 1.0)\n"
	      "  --host SIZE           host memory for KV\n"
	      "  --nvme SIZE           NVMe space for KV\n"
	      "  --weights SIZE        weight bytes in HBM, or:\n"
	      "  --params N            parameter count (8.03e9, 8B, 560M) x --weights-dtype\n"
	      "  --weights-dtype T     default: the config's torch_dtype (bf16 for float32),\n"
	      "                        else the KV dtype\n"
	      "Output:\n"
	      "  --json                one JSON object instead of text\n"
	      "  -h, --help            this text\n"
	      "Heads: num_attention_heads (--heads) is required unless head_dim (--head-dim) is\n"
	      "given with num_key_value_heads or hidden_size; nothing is guessed.\n"
	      "Exit status: 0 when computed, also when the weights do not fit in --hbm (the text\n"
	      "says so, 0 sessions in HBM; --json: \"weights_fit_hbm\": false); 2 on bad input.\n",
	      f);
}

enum {
	CLI_CONFIG = 256, CLI_LAYERS, CLI_HEADS, CLI_KV_HEADS, CLI_HIDDEN, CLI_HEAD_DIM,
	CLI_V_HEAD_DIM, CLI_LORA, CLI_ROPE, CLI_WINDOW, CLI_FULL_EVERY, CLI_SHARED, CLI_KV_DTYPE, CLI_STATE_DTYPE,
	CLI_CONTEXT, CLI_BATCH, CLI_TPB, CLI_HBM, CLI_HBM_UTIL, CLI_HOST, CLI_NVME, CLI_WEIGHTS,
	CLI_PARAMS, CLI_WDTYPE, CLI_JSON, CLI_HELP,
};

static const struct option cli_opts[] = {
	{ "config", required_argument, NULL, CLI_CONFIG },
	{ "layers", required_argument, NULL, CLI_LAYERS },
	{ "heads", required_argument, NULL, CLI_HEADS },
	{ "kv-heads", required_argument, NULL, CLI_KV_HEADS },
	{ "hidden", required_argument, NULL, CLI_HIDDEN },
	{ "head-dim", required_argument, NULL, CLI_HEAD_DIM },
	{ "v-head-dim", required_argument, NULL, CLI_V_HEAD_DIM },
	{ "kv-lora-rank", required_argument, NULL, CLI_LORA },
	{ "rope-dim", required_argument, NULL, CLI_ROPE },
	{ "sliding-window", required_argument, NULL, CLI_WINDOW },
	{ "full-every", required_argument, NULL, CLI_FULL_EVERY },
	{ "kv-shared-layers", required_argument, NULL, CLI_SHARED },
	{ "kv-dtype", required_argument, NULL, CLI_KV_DTYPE },
	{ "state-dtype", required_argument, NULL, CLI_STATE_DTYPE },
	{ "context", required_argument, NULL, CLI_CONTEXT },
	{ "batch", required_argument, NULL, CLI_BATCH },
	{ "tokens-per-block", required_argument, NULL, CLI_TPB },
	{ "hbm", required_argument, NULL, CLI_HBM },
	{ "hbm-util", required_argument, NULL, CLI_HBM_UTIL },
	{ "host", required_argument, NULL, CLI_HOST },
	{ "nvme", required_argument, NULL, CLI_NVME },
	{ "weights", required_argument, NULL, CLI_WEIGHTS },
	{ "params", required_argument, NULL, CLI_PARAMS },
	{ "weights-dtype", required_argument, NULL, CLI_WDTYPE },
	{ "json", no_argument, NULL, CLI_JSON },
	{ "help", no_argument, NULL, CLI_HELP },
	{ NULL, 0, NULL, 0 },
};

static int
cli_dtype(const char *what, const char *s, double *out)
{
	*out = kvc_dtype_bytes(s);
	if (!(*out > 0))
		return kvtr_err(-EINVAL, "%s: unknown dtype '%s' (fp32, fp16, bf16, fp8, int8, "
				"int4)", what, s);
	return 0;
}

/* Geometry flags into @m (after the config). */
static int
cli_model_opt(int opt, const char *a, struct kvc_model *m)
{
	switch (opt) {
	case CLI_LAYERS: return kvtr_parse_u32("--layers", a, 1, KVC_MAX_LAYERS, &m->n_layers);
	case CLI_HEADS: return kvtr_parse_u32("--heads", a, 1, 65536, &m->n_heads);
	case CLI_KV_HEADS: return kvtr_parse_u32("--kv-heads", a, 1, 65536, &m->n_kv_heads);
	case CLI_HIDDEN: return kvtr_parse_u32("--hidden", a, 1, 1u << 24, &m->hidden);
	case CLI_HEAD_DIM: return kvtr_parse_u32("--head-dim", a, 1, 65536, &m->head_dim);
	case CLI_V_HEAD_DIM: return kvtr_parse_u32("--v-head-dim", a, 1, 65536, &m->v_head_dim);
	case CLI_LORA: return kvtr_parse_u32("--kv-lora-rank", a, 0, 65536, &m->kv_lora_rank);
	case CLI_ROPE: return kvtr_parse_u32("--rope-dim", a, 0, 65536, &m->rope_dim);
	case CLI_WINDOW:
		m->layer_types_given = 0; /* the pattern is re-derived from the flags */
		return kvtr_parse_u32("--sliding-window", a, 0, UINT32_MAX, &m->sliding_window);
	case CLI_FULL_EVERY:
		m->layer_types_given = 0;
		return kvtr_parse_u32("--full-every", a, 0, KVC_MAX_LAYERS, &m->full_every);
	case CLI_SHARED: return kvtr_parse_u32("--kv-shared-layers", a, 0, KVC_MAX_LAYERS,
					       &m->kv_shared_layers);
	case CLI_KV_DTYPE:
		snprintf(m->kv_dtype, sizeof(m->kv_dtype), "%s", a);
		strcpy(m->kv_dtype_why, "--kv-dtype");
		return cli_dtype("--kv-dtype", a, &m->kv_dtype_bytes);
	case CLI_STATE_DTYPE:
		snprintf(m->state_dtype, sizeof(m->state_dtype), "%s", a);
		return cli_dtype("--state-dtype", a, &m->state_dtype_bytes);
	case CLI_WDTYPE: return cli_dtype("--weights-dtype", a, &m->weight_dtype_bytes);
	default: return 1; /* not a model option */
	}
}

static int
cli_query_opt(int opt, const char *a, struct kvc_query *q)
{
	float util;
	int rc;

	switch (opt) {
	case CLI_CONTEXT: return kvtr_parse_u64("--context", a, 1, 1ull << 40, &q->context);
	case CLI_BATCH: return kvtr_parse_u64("--batch", a, 1, 1ull << 32, &q->batch);
	case CLI_TPB: return kvtr_parse_u32("--tokens-per-block", a, 1, 65536,
					    &q->tokens_per_block);
	case CLI_HBM: return kvc_parse_bytes("--hbm", a, &q->hbm_bytes);
	case CLI_HOST: return kvc_parse_bytes("--host", a, &q->host_bytes);
	case CLI_NVME: return kvc_parse_bytes("--nvme", a, &q->nvme_bytes);
	case CLI_WEIGHTS: return kvc_parse_bytes("--weights", a, &q->weight_bytes);
	case CLI_PARAMS: return kvc_parse_count("--params", a, &q->params);
	case CLI_HBM_UTIL:
		rc = kvtr_parse_float("--hbm-util", a, 0.0f, 1.0f, &util);
		q->hbm_util = util;
		return rc;
	default: return kvtr_err(-EINVAL, "unknown option (see --help)");
	}
}

/* Pass 1: --config, --json, --help and unknown options; pass 2 applies the rest on top. */
static int
cli_parse(int argc, char **argv, struct kvc_model *m, struct kvc_query *q, int *json)
{
	const char *config = NULL;
	int opt, rc;

	opterr = 0;
	optind = 0;
	while ((opt = getopt_long(argc, argv, "h", cli_opts, NULL)) != -1) {
		if (opt == '?')
			return kvtr_err(-EINVAL, "unknown option or missing value: %s (see --help)",
					argv[optind - 1]);
		if (opt == 'h' || opt == CLI_HELP)
			return 1;
		if (opt == CLI_CONFIG)
			config = optarg;
		if (opt == CLI_JSON)
			*json = 1;
	}
	if (optind < argc)
		return kvtr_err(-EINVAL, "unexpected argument '%s' (see --help)", argv[optind]);
	if (config && (rc = kvc_model_load(config, m)) != 0)
		return rc;
	optind = 0;
	while ((opt = getopt_long(argc, argv, "h", cli_opts, NULL)) != -1) {
		if (opt == CLI_CONFIG || opt == CLI_JSON)
			continue;
		rc = cli_model_opt(opt, optarg, m);
		if (rc == 1)
			rc = cli_query_opt(opt, optarg, q);
		if (rc)
			return rc;
	}
	return 0;
}

int
kvc_cli(int argc, char **argv, FILE *out, FILE *err)
{
	struct kvc_model m;
	struct kvc_query q;
	struct kvc_result r;
	int json = 0, rc;

	kvc_model_init(&m);
	kvc_query_init(&q);
	rc = cli_parse(argc, argv, &m, &q, &json);
	if (rc == 1) {
		cli_usage(out);
		return 0;
	}
	if (rc == 0)
		rc = kvc_model_finish(&m);
	if (rc) {
		fprintf(err, "kvtier-calc: %s\n", kvtr_last_error());
		return 2;
	}
	rc = kvc_compute(&m, &q, &r);
	if (rc == 0) {
		if (json)
			rc = kvc_print_json(out, &m, &q, &r);
		else
			kvc_print_text(out, &m, &q, &r);
	}
	if (rc == 0 && (fflush(out) != 0 || ferror(out)))
		rc = kvtr_err(-EIO, "cannot write the report");
	if (rc) {
		fprintf(err, "kvtier-calc: %s\n", kvtr_last_error());
		return 1;
	}
	return 0;
}
