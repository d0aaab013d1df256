/* SPDX-License-Identifier: MIT */
/*
 * tests/test_calc.c - kvtier-calc: the worked examples users know (B x H_kv x S x D x 2 x L x
 * bytes), real config.json files of GQA, MQA, MLA, sliding-window, per-layer-type and KV-sharing
 * models (tests/data/configs, written from their published configurations; the expected numbers
 * are derived by hand below), the budgets, the command line (text and --json) and bad input.
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kvtier.h"
#include "engine/engine_impl.h"

#include "calc.h"
#include "util.h"

#define KiB 1024.0
#define MiB (1024.0 * 1024.0)
#define GiB (1024.0 * 1024.0 * 1024.0)

/* tests/data/configs/<name>, found from this file's path (CMake compiles with full paths). */
static const char *
calc_cfg_path(const char *name)
{
	static char path[4096];
	const char *slash = strrchr(__FILE__, '/');
	int dir = slash ? (int)(slash - __FILE__) : 1;

	snprintf(path, sizeof path, "%.*s/data/configs/%s", dir, slash ? __FILE__ : ".", name);
	return path;
}

/* A flags-only model. */
static void
calc_flags(struct kvc_model *m, uint32_t layers, uint32_t heads, uint32_t kv_heads,
	   uint32_t head_dim)
{
	kvc_model_init(m);
	m->n_layers = layers;
	m->n_heads = heads;
	m->n_kv_heads = kv_heads;
	m->head_dim = head_dim;
	assert_int_equal(kvc_model_finish(m), 0);
}

static void
calc_run(const struct kvc_model *m, uint64_t context, uint64_t batch, struct kvc_result *r)
{
	struct kvc_query q;

	kvc_query_init(&q);
	q.context = context;
	q.batch = batch;
	assert_int_equal(kvc_compute(m, &q, r), 0);
}

static void
calc_load(const char *name, struct kvc_model *m)
{
	kvc_model_init(m);
	if (kvc_model_load(calc_cfg_path(name), m) != 0)
		fail_msg("%s: %s", name, kvtr_last_error());
	assert_int_equal(kvc_model_finish(m), 0);
}

/* 32 layers, 8 KV heads, head_dim 128, fp16: 32 x 8 x 128 x 2 x 2 = 131072 B = 128 KiB per
 * token; x 4096 = 512 MiB = 0.5 GiB per sequence; x 8 = 4 GiB; 8 x 32768 tokens = 32 GiB. */
static void
test_worked_gqa(void **state)
{
	struct kvc_model m;
	struct kvc_result r;

	(void)state;
	calc_flags(&m, 32, 32, 8, 128);
	calc_run(&m, 4096, 1, &r);
	assert_int_equal(r.attn, KVC_ATTN_GQA);
	assert_true(r.token_bytes == 131072);
	assert_true(r.block_bytes == 16 * 131072);
	assert_true(r.seq_bytes == 0.5 * GiB);
	assert_true(r.seq_paged_bytes == 0.5 * GiB);
	calc_run(&m, 4096, 8, &r);
	assert_true(r.batch_bytes == 4 * GiB);
	calc_run(&m, 32768, 8, &r);
	assert_true(r.batch_bytes == 32 * GiB);
}

/* 7B MHA: 32 layers, hidden 4096 (32 heads x 128), fp16: 2 x 4096 x 32 x 2 = 0.5 MiB per token,
 * x 4096 = 2 GiB per sequence, x 32 = 64 GiB. Given as --hidden only, too. */
static void
test_worked_7b_mha(void **state)
{
	struct kvc_model m;
	struct kvc_result r;

	(void)state;
	calc_flags(&m, 32, 32, 0, 128);
	calc_run(&m, 4096, 32, &r);
	assert_int_equal(r.attn, KVC_ATTN_MHA);
	assert_true(r.token_bytes == 0.5 * MiB);
	assert_true(r.seq_bytes == 2 * GiB);
	assert_true(r.batch_bytes == 64 * GiB);
	/* hidden alone does not say how many heads: an error, not a guessed head_dim 128 */
	kvc_model_init(&m);
	m.n_layers = 32;
	m.hidden = 4096;
	assert_int_equal(kvc_model_finish(&m), -EINVAL);
	assert_non_null(strstr(kvtr_last_error(), "num_attention_heads"));
	assert_non_null(strstr(kvtr_last_error(), "head_dim"));
	m.head_dim = 128; /* with head_dim: 32 heads of 128 */
	assert_int_equal(kvc_model_finish(&m), 0);
	assert_int_equal(m.n_heads, 32);
	calc_run(&m, 4096, 32, &r);
	assert_true(r.token_bytes == 0.5 * MiB);
	assert_true(r.batch_bytes == 64 * GiB);
}

/* 70B-class: 80 layers, hidden 8192 MHA (64 heads x 128): 2 x 8192 x 80 x 2 = 2621440 B =
 * 2.5 MiB per token; with 8 KV heads of 128 (GQA): 2 x 8 x 128 x 80 x 2 = 327680 = 1/8. */
static void
test_worked_70b(void **state)
{
	struct kvc_model m;
	struct kvc_result mha, gqa;

	(void)state;
	kvc_model_init(&m);
	m.n_layers = 80;
	m.hidden = 8192;
	m.n_heads = 64;
	assert_int_equal(kvc_model_finish(&m), 0);
	calc_run(&m, 4096, 1, &mha);
	assert_true(mha.token_bytes == 2.5 * MiB);
	m.n_kv_heads = 8;
	calc_run(&m, 4096, 1, &gqa);
	assert_int_equal(gqa.attn, KVC_ATTN_GQA);
	assert_true(gqa.token_bytes == 327680);
	assert_true(gqa.token_bytes * 8 == mha.token_bytes);
}

/* Llama-3-8B: 32 layers, 8 KV heads x 128, bf16 -> 128 KiB per token; 8192 tokens = 1 GiB
 * (512 blocks of 2 MiB). Budgets: 80 GiB HBM with 8.03e9 bf16 params (16.06e9 B = 14.957 GiB
 * of weights) leaves 85899345920 - 16060000000 = 69839345920 B -> floor(/ 1 GiB) = 65
 * sessions; 256 GiB host -> 256; 2 TiB NVMe in slots of 2 MiB + 4 KiB (a 4 KiB header page,
 * then the block): 2^41 / (512 x 2101248 = 1075838976) = 2044.0x -> 2044; 2365 in
 * all. */
static void
test_llama3_8b(void **state)
{
	struct kvc_model m;
	struct kvc_query q;
	struct kvc_result r;

	(void)state;
	calc_load("llama-3-8b.json", &m);
	assert_int_equal(m.n_layers, 32);
	assert_int_equal(m.n_kv_heads, 8);
	assert_int_equal(m.head_dim, 128);
	assert_true(m.kv_dtype_bytes == 2);
	kvc_query_init(&q);
	q.context = 8192;
	q.hbm_bytes = 80ull << 30;
	q.host_bytes = 256ull << 30;
	q.nvme_bytes = 2ull << 40;
	assert_int_equal(kvc_parse_count("--params", "8.03B", &q.params), 0);
	assert_int_equal(kvc_compute(&m, &q, &r), 0);
	assert_int_equal(r.attn, KVC_ATTN_GQA);
	assert_true(r.token_bytes == 128 * KiB);
	assert_true(r.seq_bytes == 1 * GiB);
	assert_true(r.weight_bytes > 16.06e9 - 1 && r.weight_bytes < 16.06e9 + 1);
	assert_int_equal(r.fit_hbm, 65);
	assert_int_equal(r.fit_host, 256);
	assert_int_equal(r.seq_blocks, 512);
	assert_int_equal(r.nvme_slot_bytes, 2101248);
	assert_int_equal(r.fit_nvme, 2044);
	assert_int_equal(r.fit_total, 2365);
	/* weights larger than HBM: nothing fits there, no negative room */
	q.weight_bytes = 100ull << 30;
	assert_int_equal(kvc_compute(&m, &q, &r), 0);
	assert_true(r.hbm_kv_bytes == 0);
	assert_int_equal(r.fit_hbm, 0);
}

/* DeepSeek-V2-Lite (MLA): 27 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 B = 31104 B
 * per token (its 16 heads x (128+64 K, 128 V) would take 27 x 16 x 320 x 2 = 276480 B as MHA);
 * 4096 tokens: 127401984 B. DeepSeek-V3: 61 x 576 x 2 = 70272 B per token; fp8 KV: 35136. */
static void
test_deepseek_mla(void **state)
{
	struct kvc_model m;
	struct kvc_result r;

	(void)state;
	calc_load("deepseek-v2-lite.json", &m);
	calc_run(&m, 4096, 1, &r);
	assert_int_equal(r.attn, KVC_ATTN_MLA);
	assert_true(r.layer_token_bytes == 1152);
	assert_true(r.token_bytes == 31104);
	assert_true(r.seq_bytes == 127401984.0);
	calc_load("deepseek-v3.json", &m);
	calc_run(&m, 4096, 1, &r);
	assert_int_equal(m.n_layers, 61);
	assert_true(r.token_bytes == 70272);
	m.kv_dtype_bytes = kvc_dtype_bytes("fp8");
	calc_run(&m, 4096, 1, &r);
	assert_true(r.token_bytes == 35136);
}

/* Mistral-7B-v0.1: 32 layers, 8 KV heads x 128, bf16 = 4096 B per layer-token, 128 KiB per
 * token; every layer slides with a 4096-token window: at 32768 tokens each layer keeps 4096,
 * 32 x 4096 x 4096 = 512 MiB instead of 32 x 32768 x 4096 = 4 GiB; at 1000 tokens nothing
 * differs (1000 x 128 KiB = 131072000 B, paged to 63 blocks of 16 = 1008 tokens). */
static void
test_mistral_sliding(void **state)
{
	struct kvc_model m;
	struct kvc_result r;

	(void)state;
	calc_load("mistral-7b-v0.1.json", &m);
	assert_int_equal(m.sliding_window, 4096);
	calc_run(&m, 32768, 1, &r);
	assert_int_equal(r.sliding_layers, 32);
	assert_true(r.token_bytes == 128 * KiB);
	assert_true(r.seq_bytes == 512 * MiB);
	assert_true(r.seq_full_bytes == 4 * GiB);
	assert_true(r.seq_kvtier_bytes == 4 * GiB); /* kvtier v0 keeps every token's block */
	calc_run(&m, 1000, 1, &r);
	assert_true(r.seq_bytes == 131072000.0);
	assert_true(r.seq_paged_bytes == 1008.0 * 128 * KiB);
}

/* Gemma-2-9B: 42 layers alternating local (even, window 4096) / global; 8 KV heads x 256;
 * published torch_dtype float32 (4 B), counted as bf16 as servers run it: 8192 B per
 * layer-token, 344064 B per token. At 8192 tokens: 21 global x 8192 x 8192 = 1344 MiB plus 21
 * local x 4096 x 8192 = 672 MiB = 2016 MiB. */
static void
test_gemma2_alternating(void **state)
{
	struct kvc_model m;
	struct kvc_result r;

	(void)state;
	calc_load("gemma-2-9b.json", &m);
	assert_true(m.kv_dtype_bytes == 2);
	assert_true(m.weight_dtype_bytes == 2);
	assert_string_equal(m.kv_dtype, "bf16");
	assert_string_equal(m.kv_dtype_why, "torch_dtype float32 in config.json; servers run "
			    "bf16: --kv-dtype to override");
	calc_run(&m, 8192, 1, &r);
	assert_int_equal(r.sliding_layers, 21);
	assert_int_equal(m.layer_sliding[0], 1);
	assert_int_equal(m.layer_sliding[1], 0);
	assert_true(r.token_bytes == 344064);
	assert_true(r.seq_bytes == 2016 * MiB);
}

/* Gemma-3-27B-it (text_config nested): 62 layers, 16 KV heads x 128, bf16 = 8192 B per
 * layer-token, 507904 B per token; window 1024, every 6th layer global (default pattern 6):
 * 10 global (layers 5, 11, ..., 59), 52 local. At 131072 tokens: 10 x 131072 x 8192 = 10 GiB
 * plus 52 x 1024 x 8192 = 416 MiB; without windows 62 GiB. */
static void
test_gemma3_pattern(void **state)
{
	struct kvc_model m;
	struct kvc_result r;

	(void)state;
	calc_load("gemma-3-27b-it.json", &m);
	assert_int_equal(m.n_layers, 62);
	assert_int_equal(m.head_dim, 128);
	calc_run(&m, 131072, 1, &r);
	assert_int_equal(r.sliding_layers, 52);
	assert_int_equal(m.layer_sliding[5], 0);
	assert_int_equal(m.layer_sliding[6], 1);
	assert_true(r.token_bytes == 507904);
	assert_true(r.seq_bytes == 10 * GiB + 416 * MiB);
	assert_true(r.seq_full_bytes == 62 * GiB);
}

/* Gemma-3n-E4B style: 35 layers with layer_types (4 local + 1 global, repeated), the last 15
 * share earlier layers' KV, so 20 store KV: 16 local (window 512) and 4 global (4, 9, 14, 19);
 * 2 KV heads x 256, bf16 = 2048 B per layer-token, 40960 B per token. At 32768 tokens:
 * 4 x 32768 x 2048 = 256 MiB plus 16 x 512 x 2048 = 16 MiB = 272 MiB; without windows and
 * sharing 35 x 32768 x 2048 = 2240 MiB. */
static void
test_gemma3n_shared(void **state)
{
	struct kvc_model m;
	struct kvc_result r;

	(void)state;
	calc_load("gemma-3n-e4b.json", &m);
	assert_int_equal(m.kv_shared_layers, 15);
	calc_run(&m, 32768, 1, &r);
	assert_int_equal(r.kv_layers, 20);
	assert_int_equal(r.sliding_layers, 16);
	assert_true(r.token_bytes == 40960);
	assert_true(r.seq_bytes == 272 * MiB);
	assert_true(r.seq_full_bytes == 2240 * MiB);
}

/* Qwen2.5-7B-Instruct has sliding_window 131072 but use_sliding_window false: no window.
 * 28 layers x 4 KV heads x 128 x 2 x 2 = 57344 B per token; 32768 tokens = 1.75 GiB.
 * Falcon-7B is MQA (multi_query): 32 layers x 1 x (4544 / 71 = 64) x 2 x 2 = 8192 B. */
static void
test_qwen_falcon(void **state)
{
	struct kvc_model m;
	struct kvc_result r;

	(void)state;
	calc_load("qwen2.5-7b-instruct.json", &m);
	calc_run(&m, 32768, 1, &r);
	assert_int_equal(m.sliding_window, 0);
	assert_int_equal(r.sliding_layers, 0);
	assert_true(r.token_bytes == 57344);
	assert_true(r.seq_bytes == 1.75 * GiB);
	calc_load("falcon-7b.json", &m);
	calc_run(&m, 2048, 1, &r);
	assert_int_equal(r.attn, KVC_ATTN_MQA);
	assert_int_equal(m.head_dim, 64);
	assert_true(r.token_bytes == 8192);
}

/* Run the command line into a temp file; returns the exit status, *text the output. */
static int
calc_cli(char **text, int argc, ...)
{
	char *argv[32];
	va_list ap;
	FILE *out = tmpfile(), *err = tmpfile();
	long n;
	int rc;

	assert_non_null(out);
	assert_non_null(err);
	argv[0] = (char *)"kvtier-calc";
	va_start(ap, argc);
	for (int i = 1; i <= argc; i++)
		argv[i] = va_arg(ap, char *);
	va_end(ap);
	argv[argc + 1] = NULL;
	rc = kvc_cli(argc + 1, argv, out, err);
	if (rc)
		out = (fclose(out), err);
	else
		fclose(err);
	n = ftell(out);
	*text = calloc(1, (size_t)n + 1);
	assert_non_null(*text);
	rewind(out);
	assert_int_equal(fread(*text, 1, (size_t)n, out), (size_t)n);
	fclose(out);
	return rc;
}

static double
calc_json_num(const cJSON *o, const char *key)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);

	assert_true(cJSON_IsNumber(it));
	return it->valuedouble;
}

static void
test_cli(void **state)
{
	char *t;
	cJSON *o;

	(void)state;
	/* the worked example through flags, --json: 4 GiB at batch 8 */
	assert_int_equal(calc_cli(&t, 11, "--layers", "32", "--kv-heads", "8", "--heads", "32",
				  "--head-dim", "128", "--batch", "8", "--json"), 0);
	o = cJSON_Parse(t);
	assert_non_null(o);
	assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "attention")->valuestring, "GQA");
	assert_true(calc_json_num(o, "kv_bytes_per_token") == 131072);
	assert_true(calc_json_num(o, "batch_bytes") == 4 * GiB);
	cJSON_Delete(o);
	free(t);
	/* a config, a flag overriding it, budgets; human-readable */
	assert_int_equal(calc_cli(&t, 12, "--config", calc_cfg_path("llama-3-8b.json"),
				  "--context", "8192", "--hbm", "80G", "--params", "8.03e9",
				  "--host", "256G", "--kv-dtype", "fp8"), 0);
	assert_non_null(strstr(t, "KV per token     64 KiB (65536 bytes)"));
	assert_non_null(strstr(t, "per sequence     512 MiB at 8192 tokens"));
	assert_non_null(strstr(t, "host             256 GiB: 512 sessions"));
	assert_non_null(strstr(t, "KV dtype         fp8 (1 bytes): --kv-dtype\n"));
	free(t);
	/* the dtype used and why: a float32 config is counted as bf16, --kv-dtype overrides */
	assert_int_equal(calc_cli(&t, 2, "--config", calc_cfg_path("gemma-2-9b.json")), 0);
	assert_non_null(strstr(t, "KV dtype         bf16 (2 bytes): torch_dtype float32 in "
			       "config.json; servers run bf16: --kv-dtype to override\n"));
	assert_non_null(strstr(t, "KV per token     336 KiB (344064 bytes)"));
	free(t);
	assert_int_equal(calc_cli(&t, 3, "--config", calc_cfg_path("llama-3-8b.json"), "--json"),
			 0);
	o = cJSON_Parse(t);
	assert_non_null(o);
	assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "kv_dtype")->valuestring,
			    "bfloat16");
	assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "kv_dtype_reason")->valuestring,
			    "torch_dtype bfloat16 in config.json");
	cJSON_Delete(o);
	free(t);
	assert_int_equal(calc_cli(&t, 5, "--config", calc_cfg_path("gemma-2-9b.json"),
				  "--kv-dtype", "fp32", "--json"), 0);
	o = cJSON_Parse(t);
	assert_non_null(o);
	assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "kv_dtype")->valuestring, "fp32");
	assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "kv_dtype_reason")->valuestring,
			    "--kv-dtype");
	assert_true(calc_json_num(o, "kv_bytes_per_token") == 2 * 344064);
	cJSON_Delete(o);
	free(t);
	assert_int_equal(calc_cli(&t, 1, "--help"), 0);
	assert_non_null(strstr(t, "--kv-lora-rank"));
	free(t);
	/* bad input: exit 2 with a message */
	assert_int_equal(calc_cli(&t, 2, "--layers", "0"), 2);
	assert_non_null(strstr(t, "--layers"));
	free(t);
	assert_int_equal(calc_cli(&t, 2, "--config", "/nonexistent/config.json"), 2);
	assert_non_null(strstr(t, "No such file"));
	free(t);
	assert_int_equal(calc_cli(&t, 2, "--layers", "4"), 2);
	assert_non_null(strstr(t, "heads"));
	free(t);
	assert_int_equal(calc_cli(&t, 1, "--bogus"), 2);
	free(t);
	assert_int_equal(calc_cli(&t, 5, "--layers", "4", "--hidden", "512", "--kv-dtype"), 2);
	free(t);
	/* a config without num_attention_heads (or 0): an error unless head_dim is given */
	assert_int_equal(calc_cli(&t, 6, "--layers", "4", "--hidden", "512", "--kv-dtype",
				  "fp16"), 2);
	assert_non_null(strstr(t, "num_attention_heads"));
	free(t);
	assert_int_equal(calc_cli(&t, 8, "--layers", "4", "--hidden", "512", "--kv-dtype",
				  "fp16", "--head-dim", "64"), 0);
	assert_non_null(strstr(t, "KV per token     8 KiB"));
	free(t);
	/* weights larger than HBM: said plainly, 0 sessions in HBM, exit 0 (documented) */
	assert_int_equal(calc_cli(&t, 6, "--config", calc_cfg_path("llama-3-8b.json"),
				  "--hbm", "1G", "--params", "8.03e9"), 0);
	assert_non_null(strstr(t, "weights (14.96 GiB) do not fit in HBM (1 GiB): 0 sessions "
				  "in HBM"));
	free(t);
	assert_int_equal(calc_cli(&t, 7, "--config", calc_cfg_path("llama-3-8b.json"),
				  "--hbm", "1G", "--params", "8.03e9", "--json"), 0);
	assert_non_null(strstr(t, "\"weights_fit_hbm\":\tfalse"));
	assert_non_null(strstr(t, "\"sessions_hbm\":\t0"));
	free(t);
	/* the tools' shared size syntax */
	assert_int_equal(calc_cli(&t, 7, "--config", calc_cfg_path("llama-3-8b.json"),
				  "--nvme", "1.5T", "--hbm", "4X", "--json"), 2);
	assert_non_null(strstr(t, "unknown suffix"));
	free(t);
}

static void
test_bad_input(void **state)
{
	struct kvc_model m;
	uint64_t b;
	double c;

	(void)state;
	kvc_model_init(&m);
	assert_int_equal(kvc_model_from_json("[1,2]", &m), -EINVAL);
	assert_int_equal(kvc_model_from_json("{\"num_hidden_layers\": \"32\"}", &m), -EINVAL);
	assert_non_null(strstr(kvtr_last_error(), "num_hidden_layers"));
	assert_int_equal(kvc_model_from_json("{\"num_hidden_layers\": 2.5}", &m), -EINVAL);
	assert_int_equal(kvc_model_from_json("{\"num_hidden_layers\": 2, \"layer_types\": "
					     "[\"full_attention\"]}", &m), -EINVAL);
	assert_non_null(strstr(kvtr_last_error(), "layer_types"));
	kvc_model_init(&m);
	m.n_layers = 4;
	m.n_heads = 6;
	m.n_kv_heads = 4;
	m.head_dim = 64;
	assert_int_equal(kvc_model_finish(&m), -EINVAL); /* 4 does not divide 6 */
	m.n_kv_heads = 2;
	m.kv_shared_layers = 4;
	assert_int_equal(kvc_model_finish(&m), -EINVAL);
	assert_int_equal(kvc_parse_bytes("--hbm", "80G", &b), 0);
	assert_true(b == 80ull << 30);
	assert_int_equal(kvc_parse_bytes("--nvme", "1.5TiB", &b), 0);
	assert_true(b == 3ull << 39);
	assert_int_equal(kvc_parse_bytes("--hbm", "80X", &b), -EINVAL);
	assert_int_equal(kvc_parse_bytes("--hbm", "-1", &b), -EINVAL);
	assert_int_equal(kvc_parse_bytes("--nvme", "4T", &b), 0);
	assert_true(b == 4ull << 40);
	assert_int_equal(kvc_parse_bytes("--host", "0", &b), 0);
	assert_true(b == 0);
	assert_int_equal(kvc_parse_count("--params", "70B", &c), 0);
	assert_true(c == 70e9);
	assert_int_equal(kvc_parse_count("--params", "7Q", &c), -EINVAL);
	assert_true(kvc_dtype_bytes("bfloat16") == 2);
	assert_true(kvc_dtype_bytes("nope") == 0);
}

/* The NVMe slot kvtier-calc counts is the engine's: a small block (2 KiB) still takes a 4 KiB
 * header page and a 4 KiB payload (8 KiB), so an engine given room for 10 such slots has 10. */
static void
test_nvme_slot_matches_engine(void **state)
{
	struct kvc_model m;
	struct kvc_result r;
	struct kvt_engine_opts o;
	struct kvt_engine *e;
	struct kvt_stats st;
	char dir[] = "/tmp/kvt-calc-XXXXXX";
	struct dirent *de;
	struct stat fst;
	int files = 0;
	DIR *d;

	(void)state;
	kvc_model_init(&m);
	m.n_layers = 1;
	m.n_heads = 1;
	m.n_kv_heads = 1;
	m.head_dim = 32;
	assert_int_equal(kvc_model_finish(&m), 0);
	calc_run(&m, 64, 1, &r);
	assert_true(r.block_bytes == 2048);
	assert_int_equal(r.nvme_slot_bytes, 8192);
	assert_non_null(mkdtemp(dir));
	kvt_engine_opts_init(&o, sizeof o);
	o.layout = (struct kvt_layout){ .n_layers = 1, .n_kv_heads = 1, .head_dim = 32,
					.dtype = KVT_DTYPE_BF16, .tokens_per_block = 16 };
	o.hbm_bytes = 4 * 2048;
	o.host_bytes = 4 * 2048;
	o.nvme_dir = dir;
	o.nvme_bytes = 10 * r.nvme_slot_bytes;
	assert_int_equal(kvt_engine_create(&o, &e), 0);
	memset(&st, 0, sizeof st);
	st.size = sizeof st;
	assert_int_equal(kvt_engine_stats(e, &st), 0);
	assert_int_equal(st.tier[KVT_TIER_NVME].slots, 10);
	assert_int_equal(st.tier[KVT_TIER_NVME].capacity_bytes, 10 * r.nvme_slot_bytes);
	/* the file is what kvtier.h's nvme_bytes says: 1 MiB + the slots; the private slot file
	 * has no name in the directory (O_TMPFILE, or unlinked at once), so it is reached through
	 * /proc/self/fd (kvt_nvme_path) */
	assert_int_equal(stat(kvt_nvme_path(e->nvme), &fst), 0);
	assert_int_equal(fst.st_size, (1 << 20) + 10 * r.nvme_slot_bytes);
	d = opendir(dir);
	assert_non_null(d);
	while ((de = readdir(d)))
		if (de->d_name[0] != '.')
			files++;
	closedir(d);
	assert_int_equal(files, 0);
	kvt_engine_destroy(e);
	assert_int_equal(rmdir(dir), 0);
}

/* tests/data/hf/<name>/config.json (the kvtier-hf fixtures). */
static const char *
calc_hf_path(const char *name)
{
	static char path[4096];
	const char *slash = strrchr(__FILE__, '/');
	int dir = slash ? (int)(slash - __FILE__) : 1;

	snprintf(path, sizeof path, "%.*s/data/hf/%s/config.json", dir, slash ? __FILE__ : ".",
		 name);
	return path;
}

/*
 * Issue 16: the per-group figures (struct kvc_group), derived by hand. The Gemma 3 fixture in
 * fp32 at 128 tokens (8x its 16-token window): 2 KV heads x (16 + 16) x 4 = 256 bytes per layer
 * and token; FULL (layers 2, 4) blocks of 2 x 16 x 256 = 8192 bytes, 8 of them; WINDOW (layers
 * 0, 1, 3) blocks of 12288 bytes, at most ceil(16 / 16) + 1 = 2; 65536 + 24576 = 90112 bytes;
 * tokens alone 65536 + 16 x 3 x 256 = 77824; one pool with a 12288-byte slot 10 x 12288.
 * With 4 tokens per block the window bound is ceil(16 / 4) + 1 = 5 blocks of 3072. DeepSeek
 * (MLA): LATENT, (32 + 8) x 4 = 160 bytes, blocks of 3 x 16 x 160 = 7680, 8 of them, no V.
 * Gemma 3n E4B: 20 storing layers (4 full, 16 sliding of 512) and 15 ALIAS layers.
 */
static void
test_groups(void **state)
{
	struct kvc_model m;
	struct kvc_query q;
	struct kvc_result r;

	(void)state;
	kvc_model_init(&m);
	assert_int_equal(kvc_model_load(calc_hf_path("gemma3"), &m), 0);
	m.kv_dtype_bytes = 4;
	assert_int_equal(kvc_model_finish(&m), 0);
	kvc_query_init(&q);
	q.context = 128;
	assert_int_equal(kvc_compute(&m, &q, &r), 0);
	assert_int_equal(r.n_groups, 2);
	assert_int_equal(r.groups[0].kind, KVC_GROUP_FULL);
	assert_int_equal(r.groups[0].n_layers, 2);
	assert_true(r.groups[0].block_bytes == 8192);
	assert_int_equal(r.groups[0].max_blocks, 8);
	assert_int_equal(r.groups[1].kind, KVC_GROUP_WINDOW);
	assert_int_equal(r.groups[1].n_layers, 3);
	assert_int_equal(r.groups[1].window, 16);
	assert_true(r.groups[1].block_bytes == 12288);
	assert_int_equal(r.groups[1].max_blocks, 2);
	assert_int_equal(r.groups[1].nvme_slot_bytes, 4096 + 12288);
	assert_true(r.seq_group_bytes == 90112);
	assert_true(r.seq_group_token_bytes == 77824);
	assert_true(r.seq_common_slot_bytes == 10 * 12288);
	q.tokens_per_block = 4;
	assert_int_equal(kvc_compute(&m, &q, &r), 0);
	assert_int_equal(r.groups[1].max_blocks, 5);
	assert_true(r.groups[1].seq_bytes == 5 * 3072);
	q.context = 10; /* shorter than the window: the tokens' blocks */
	assert_int_equal(kvc_compute(&m, &q, &r), 0);
	assert_int_equal(r.groups[1].max_blocks, 3);

	kvc_model_init(&m);
	assert_int_equal(kvc_model_load(calc_hf_path("deepseek-v3"), &m), 0);
	m.kv_dtype_bytes = 4;
	assert_int_equal(kvc_model_finish(&m), 0);
	kvc_query_init(&q);
	q.context = 128;
	assert_int_equal(kvc_compute(&m, &q, &r), 0);
	assert_int_equal(r.n_groups, 1);
	assert_int_equal(r.groups[0].kind, KVC_GROUP_LATENT);
	assert_true(r.groups[0].block_bytes == 7680);
	assert_true(r.seq_group_bytes == 8 * 7680);

	calc_load("gemma-3n-e4b.json", &m);
	calc_run(&m, 32768, 1, &r);
	assert_int_equal(r.n_groups, 3);
	assert_int_equal(r.groups[0].kind, KVC_GROUP_FULL);
	assert_int_equal(r.groups[0].n_layers, 4);
	assert_int_equal(r.groups[1].kind, KVC_GROUP_WINDOW);
	assert_int_equal(r.groups[1].n_layers, 16);
	assert_int_equal(r.groups[1].max_blocks, 512 / 16 + 1);
	assert_int_equal(r.groups[2].kind, KVC_GROUP_ALIAS);
	assert_int_equal(r.groups[2].n_layers, 15);
	assert_true(r.groups[2].seq_bytes == 0);
}

/* The shapes of tests/data/hf/qwen3-next/states.safetensors (transformers' own Gated DeltaNet
 * cache after the reference prompt, tools/hf-fixtures/gen.py): per linear layer i
 * "layer<i>.conv" [conv_dim, K] (transformers keeps K columns; decode needs the last K - 1) and
 * "layer<i>.recurrent" [v_heads, k_dim, v_dim]. Returns the bytes of those states at
 * @elem bytes per element with K - 1 conv columns, and the layers in *n. */
static double
calc_fixture_state_bytes(double elem, uint32_t *n)
{
	char path[4096];
	const char *slash = strrchr(__FILE__, '/');
	int dir = slash ? (int)(slash - __FILE__) : 1;
	unsigned char len8[8];
	uint64_t len = 0;
	char *hdr;
	cJSON *h, *it;
	double sum = 0;
	FILE *f;

	snprintf(path, sizeof path, "%.*s/data/hf/qwen3-next/states.safetensors", dir,
		 slash ? __FILE__ : ".");
	f = fopen(path, "rb");
	assert_non_null(f);
	assert_int_equal(fread(len8, 1, 8, f), 8);
	for (int i = 7; i >= 0; i--)
		len = len << 8 | len8[i];
	assert_true(len > 2 && len < (1u << 20));
	hdr = calloc(1, len + 1);
	assert_non_null(hdr);
	assert_int_equal(fread(hdr, 1, len, f), len);
	fclose(f);
	h = cJSON_Parse(hdr);
	free(hdr);
	assert_non_null(h);
	*n = 0;
	cJSON_ArrayForEach(it, h) {
		const cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
		double prod = 1;
		int k = 0, d = cJSON_GetArraySize(sh);
		const cJSON *x;

		if (strcmp(it->string, "__metadata__") == 0)
			continue;
		cJSON_ArrayForEach(x, sh) {
			/* conv [conv_dim, K]: K - 1 columns carry over */
			prod *= strstr(it->string, ".conv") && k == d - 1 ? x->valuedouble - 1
									   : x->valuedouble;
			k++;
		}
		*n += strstr(it->string, ".conv") != NULL;
		sum += prod * elem;
	}
	cJSON_Delete(h);
	return sum;
}

/*
 * Linear attention (Gated DeltaNet). The Qwen3-Next fixture: layers 0-2 linear, 3 full; 2 key
 * heads and 4 value heads of 16: conv_dim 2 x 2 x 16 + 4 x 16 = 128, K = 4, so
 * (128 x 3 + 4 x 16 x 16) x 4 bytes = 5632 per layer in fp32, 16896 for the three: the same as
 * the states transformers itself left in states.safetensors. Qwen3-Next-80B-A3B (as published:
 * 48 layers, full attention every 4th, 16 key and 32 value heads of 128, bf16):
 * (8192 x 3 + 32 x 128 x 128) x 2 = 1097728 bytes per layer, x 36 = 39518208 (37.7 MiB: the
 * issue's "about 38 MiB"), against 12 x 2 x (256 + 256) x 2 = 24576 bytes of attention KV per
 * token: 1608 tokens' worth.
 */
static void
test_linear_state(void **state)
{
	struct kvc_model m;
	struct kvc_query q;
	struct kvc_result r;
	uint32_t n;

	(void)state;
	kvc_model_init(&m);
	assert_int_equal(kvc_model_load(calc_hf_path("qwen3-next"), &m), 0);
	m.kv_dtype_bytes = 4;
	m.state_dtype_bytes = 4; /* as the fixture's float32 states */
	assert_int_equal(kvc_model_finish(&m), 0);
	kvc_query_init(&q);
	q.context = 128;
	assert_int_equal(kvc_compute(&m, &q, &r), 0);
	assert_int_equal(r.linear_layers, 3);
	assert_int_equal(r.kv_layers, 1);
	assert_true(r.layer_state_bytes == 5632);
	assert_true(r.seq_state_bytes == 16896);
	assert_true(r.seq_state_bytes == calc_fixture_state_bytes(4, &n));
	assert_int_equal(n, 3);
	assert_true(r.token_bytes == 2 * 32 * 4);
	assert_true(r.seq_bytes == 128 * 256 + 16896);
	assert_int_equal(r.n_groups, 2);
	assert_int_equal(r.groups[0].kind, KVC_GROUP_FULL);
	assert_int_equal(r.groups[0].n_layers, 1);
	assert_int_equal(r.groups[1].kind, KVC_GROUP_STATE);
	assert_int_equal(r.groups[1].n_layers, 3);
	/* the engine's two live state slots (engine/kvtier.h "STATE groups") */
	assert_int_equal(r.groups[1].max_blocks, 2);
	assert_true(r.groups[1].block_bytes == 16896);
	assert_true(r.seq_group_bytes == 8 * 4096 + 2 * 16896);
	/* one pool with a common slot (vLLM's page-size unification): 10 slots of 16896 */
	assert_true(r.seq_common_slot_bytes == 10 * 16896);
	q.context = 100000; /* the state does not grow with the context */
	assert_int_equal(kvc_compute(&m, &q, &r), 0);
	assert_true(r.groups[1].seq_bytes == 2 * 16896);

	calc_load("qwen3-next-80b-a3b.json", &m);
	calc_run(&m, 4096, 1, &r);
	assert_int_equal(r.linear_layers, 36);
	assert_int_equal(r.kv_layers, 12);
	assert_true(r.layer_state_bytes == 1097728);
	assert_true(r.seq_state_bytes == 39518208);
	assert_true(r.token_bytes == 24576);
	assert_true(r.state_tokens > 1607 && r.state_tokens < 1609);
	assert_true(r.seq_bytes == 4096.0 * 24576 + 39518208);
	/* the state keeps the model's dtype when only the KV is quantised (vLLM sizes it from
	 * mamba_ssm_cache_dtype, not kv_cache_dtype) */
	calc_load("qwen3-next-80b-a3b.json", &m);
	m.kv_dtype_bytes = kvc_dtype_bytes("fp8");
	assert_int_equal(kvc_model_finish(&m), 0);
	calc_run(&m, 4096, 1, &r);
	assert_true(r.seq_state_bytes == 39518208);
	assert_true(r.token_bytes == 12288);
	/* a qwen3_next config without layer_types or full_attention_interval: HF's default 4 */
	kvc_model_init(&m);
	assert_int_equal(kvc_model_from_json("{\"model_type\": \"qwen3_next\", \"num_hidden_"
					     "layers\": 8, \"num_attention_heads\": 4, \"num_key_"
					     "value_heads\": 2, \"head_dim\": 16, \"linear_num_key_"
					     "heads\": 2, \"linear_num_value_heads\": 4, \"linear_"
					     "key_head_dim\": 16, \"linear_value_head_dim\": 16}",
					     &m), 0);
	assert_int_equal(kvc_model_finish(&m), 0);
	calc_run(&m, 16, 1, &r);
	assert_int_equal(r.linear_layers, 6);
	assert_int_equal(r.kv_layers, 2);
	/* linear_* geometry on another model type without a layer pattern: refused, not sized
	 * as full attention */
	kvc_model_init(&m);
	assert_int_equal(kvc_model_from_json("{\"num_hidden_layers\": 8, \"num_attention_heads\""
					     ": 4, \"hidden_size\": 64, \"linear_num_key_heads\": "
					     "2, \"linear_num_value_heads\": 4, \"linear_key_head_"
					     "dim\": 16, \"linear_value_head_dim\": 16}", &m), 0);
	assert_int_equal(kvc_model_finish(&m), -EINVAL);
	assert_non_null(strstr(kvtr_last_error(), "full_attention_interval"));

	/* a hybrid config without the state geometry, or all layers linear: refused */
	kvc_model_init(&m);
	assert_int_equal(kvc_model_from_json("{\"num_hidden_layers\": 4, \"num_attention_heads\""
					     ": 4, \"hidden_size\": 64, \"full_attention_"
					     "interval\": 2}", &m), 0);
	assert_int_equal(kvc_model_finish(&m), -EINVAL);
	assert_non_null(strstr(kvtr_last_error(), "linear_num_key_heads"));
	kvc_model_init(&m);
	assert_int_equal(kvc_model_from_json("{\"num_hidden_layers\": 2, \"num_attention_heads\""
					     ": 4, \"hidden_size\": 64, \"layer_types\": ["
					     "\"linear_attention\", \"linear_attention\"], "
					     "\"linear_num_key_heads\": 2, \"linear_num_value_"
					     "heads\": 4, \"linear_key_head_dim\": 8, \"linear_"
					     "value_head_dim\": 8}", &m), 0);
	assert_int_equal(kvc_model_finish(&m), -EINVAL);
	assert_non_null(strstr(kvtr_last_error(), "all 2 layers are linear"));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_worked_gqa),
		cmocka_unit_test(test_worked_7b_mha),
		cmocka_unit_test(test_worked_70b),
		cmocka_unit_test(test_llama3_8b),
		cmocka_unit_test(test_nvme_slot_matches_engine),
		cmocka_unit_test(test_deepseek_mla),
		cmocka_unit_test(test_mistral_sliding),
		cmocka_unit_test(test_gemma2_alternating),
		cmocka_unit_test(test_gemma3_pattern),
		cmocka_unit_test(test_gemma3n_shared),
		cmocka_unit_test(test_groups),
		cmocka_unit_test(test_linear_state),
		cmocka_unit_test(test_qwen_falcon),
		cmocka_unit_test(test_cli),
		cmocka_unit_test(test_bad_input),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
