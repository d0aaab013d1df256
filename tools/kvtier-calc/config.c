/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-calc/config.c - a Hugging Face config.json into struct kvc_model, with cJSON.
 * Fields are looked up in text_config first (multimodal configs such as Gemma 3 nest the
 * language model there), then at the top level, under their usual aliases.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "calc.h"
#include "util.h"

#define CFG_MAX_BYTES (16u << 20)

/* The item @name in @text (the nested text_config, may be NULL), else in @root. */
static const cJSON *
cfg_item(const cJSON *root, const cJSON *text, const char *name)
{
	const cJSON *it = text ? cJSON_GetObjectItemCaseSensitive(text, name) : NULL;

	if (!it)
		it = cJSON_GetObjectItemCaseSensitive(root, name);
	return it && !cJSON_IsNull(it) ? it : NULL;
}

/* The first of @names (NULL-terminated) present as an integer 0..max into *out; absent: 0 and
 * *out untouched; wrong type or range: -EINVAL. */
static int
cfg_u32(const cJSON *root, const cJSON *text, const char *const *names, uint32_t max,
	uint32_t *out)
{
	for (; *names; names++) {
		const cJSON *it = cfg_item(root, text, *names);
		double v;

		if (!it)
			continue;
		if (cJSON_IsBool(it)) /* e.g. "sliding_window": false */
			v = 0;
		else if (cJSON_IsNumber(it))
			v = it->valuedouble;
		else
			return kvtr_err(-EINVAL, "config: %s is not a number", *names);
		if (v < 0 || v > max || v != (double)(uint32_t)v)
			return kvtr_err(-EINVAL, "config: %s = %g is not an integer in 0..%u",
					*names, v, max);
		*out = (uint32_t)v;
		return 0;
	}
	return 0;
}

static int
cfg_bool(const cJSON *root, const cJSON *text, const char *name, int dflt)
{
	const cJSON *it = cfg_item(root, text, name);

	return it && cJSON_IsBool(it) ? cJSON_IsTrue(it) : dflt;
}

static const char *
cfg_str(const cJSON *root, const cJSON *text, const char *name)
{
	const cJSON *it = cfg_item(root, text, name);

	return it && cJSON_IsString(it) ? it->valuestring : NULL;
}

/* layer_types: ["sliding_attention", "full_attention", ...], one per layer. */
static int
cfg_layer_types(const cJSON *lt, struct kvc_model *m)
{
	int n = cJSON_GetArraySize(lt), i = 0;
	const cJSON *it;

	if (n > KVC_MAX_LAYERS)
		return kvtr_err(-EINVAL, "config: layer_types has %d entries (max %d)", n,
				KVC_MAX_LAYERS);
	cJSON_ArrayForEach(it, lt) {
		if (!cJSON_IsString(it))
			return kvtr_err(-EINVAL, "config: layer_types[%d] is not a string", i);
		m->layer_linear[i] = strstr(it->valuestring, "linear") != NULL;
		m->layer_sliding[i++] = strstr(it->valuestring, "sliding") != NULL ||
					strstr(it->valuestring, "local") != NULL;
	}
	if (m->n_layers && (uint32_t)n != m->n_layers)
		return kvtr_err(-EINVAL, "config: layer_types has %d entries for %u layers", n,
				m->n_layers);
	m->layer_types_given = 1;
	return 0;
}

/* Geometry fields (integers), under their aliases. */
static int
cfg_geometry(const cJSON *root, const cJSON *text, struct kvc_model *m)
{
	static const char *const layers[] = { "num_hidden_layers", "n_layer", "num_layers",
					      "n_layers", NULL };
	static const char *const heads[] = { "num_attention_heads", "n_head", "n_heads", NULL };
	static const char *const kv_heads[] = { "num_key_value_heads", "num_kv_heads",
						"n_head_kv", "multi_query_group_num", NULL };
	static const char *const hidden[] = { "hidden_size", "n_embd", "d_model", "dim", NULL };
	static const char *const head_dim[] = { "head_dim", NULL };
	static const char *const lora[] = { "kv_lora_rank", NULL };
	static const char *const rope[] = { "qk_rope_head_dim", NULL };
	static const char *const shared[] = { "num_kv_shared_layers", NULL };
	static const char *const pattern[] = { "sliding_window_pattern", NULL };
	static const char *const lkh[] = { "linear_num_key_heads", NULL };
	static const char *const lvh[] = { "linear_num_value_heads", NULL };
	static const char *const lkd[] = { "linear_key_head_dim", NULL };
	static const char *const lvd[] = { "linear_value_head_dim", NULL };
	static const char *const lck[] = { "linear_conv_kernel_dim", NULL };
	static const char *const fai[] = { "full_attention_interval", NULL };
	int rc = 0;

	rc = rc ? rc : cfg_u32(root, text, layers, KVC_MAX_LAYERS, &m->n_layers);
	rc = rc ? rc : cfg_u32(root, text, heads, 65536, &m->n_heads);
	rc = rc ? rc : cfg_u32(root, text, kv_heads, 65536, &m->n_kv_heads);
	rc = rc ? rc : cfg_u32(root, text, hidden, 1u << 24, &m->hidden);
	rc = rc ? rc : cfg_u32(root, text, head_dim, 65536, &m->head_dim);
	rc = rc ? rc : cfg_u32(root, text, lora, 65536, &m->kv_lora_rank);
	rc = rc ? rc : cfg_u32(root, text, rope, 65536, &m->rope_dim);
	rc = rc ? rc : cfg_u32(root, text, shared, KVC_MAX_LAYERS, &m->kv_shared_layers);
	rc = rc ? rc : cfg_u32(root, text, pattern, KVC_MAX_LAYERS, &m->full_every);
	rc = rc ? rc : cfg_u32(root, text, lkh, 65536, &m->lin_k_heads);
	rc = rc ? rc : cfg_u32(root, text, lvh, 65536, &m->lin_v_heads);
	rc = rc ? rc : cfg_u32(root, text, lkd, 65536, &m->lin_k_dim);
	rc = rc ? rc : cfg_u32(root, text, lvd, 65536, &m->lin_v_dim);
	rc = rc ? rc : cfg_u32(root, text, lck, 65536, &m->lin_conv_kernel);
	rc = rc ? rc : cfg_u32(root, text, fai, KVC_MAX_LAYERS, &m->full_attn_interval);
	if (rc == 0 && cfg_bool(root, text, "multi_query", 0)) /* Falcon-7B */
		m->n_kv_heads = 1;
	return rc;
}

/* sliding_window (honouring use_sliding_window: Qwen2 has a window it does not use),
 * layer_types, or the alternating pattern of Gemma 2. */
static int
cfg_sliding(const cJSON *root, const cJSON *text, struct kvc_model *m, const char *type)
{
	static const char *const window[] = { "sliding_window", "attention_window_size", NULL };
	const cJSON *lt = cfg_item(root, text, "layer_types");
	int rc = cfg_u32(root, text, window, UINT32_MAX, &m->sliding_window);

	if (rc)
		return rc;
	if (!cfg_bool(root, text, "use_sliding_window", 1))
		m->sliding_window = 0;
	if (lt && cJSON_IsArray(lt))
		return cfg_layer_types(lt, m);
	if (type && strcmp(type, "gemma2") == 0 && !m->full_every)
		m->full_every = 2; /* even layers local, odd layers global */
	if (type && strncmp(type, "gemma3", 6) == 0 && !m->full_every)
		m->full_every = 6; /* Gemma3TextConfig's default sliding_window_pattern */
	if (type && strcmp(type, "qwen3_next") == 0 && !m->full_attn_interval)
		m->full_attn_interval = 4; /* Qwen3NextConfig's default full_attention_interval */
	return 0;
}

static void
cfg_dtype(const cJSON *root, const cJSON *text, struct kvc_model *m)
{
	const char *dt = cfg_str(root, text, "torch_dtype");
	double b;

	if (!dt)
		dt = cfg_str(root, text, "dtype");
	b = kvc_dtype_bytes(dt);
	if (!(b > 0))
		return;
	if (b == 4) { /* a float32 checkpoint: served in bf16 */
		m->kv_dtype_bytes = m->weight_dtype_bytes = 2;
		strcpy(m->kv_dtype, "bf16");
		snprintf(m->kv_dtype_why, sizeof(m->kv_dtype_why), "torch_dtype %.16s in "
			 "config.json; servers run bf16: --kv-dtype to override", dt);
		return;
	}
	m->kv_dtype_bytes = m->weight_dtype_bytes = b;
	snprintf(m->kv_dtype, sizeof(m->kv_dtype), "%s", dt);
	snprintf(m->kv_dtype_why, sizeof(m->kv_dtype_why), "torch_dtype %.16s in config.json",
		 dt);
}

int
kvc_model_from_json(const char *json, struct kvc_model *m)
{
	cJSON *root = cJSON_Parse(json);
	const cJSON *text;
	const char *type, *name;
	int rc;

	if (!root || !cJSON_IsObject(root)) {
		cJSON_Delete(root);
		return kvtr_err(-EINVAL, "config: not a JSON object");
	}
	text = cJSON_GetObjectItemCaseSensitive(root, "text_config");
	if (text && !cJSON_IsObject(text))
		text = NULL;
	type = cfg_str(root, text, "model_type");
	name = cfg_str(root, NULL, "_name_or_path");
	if (name || type)
		snprintf(m->name, sizeof(m->name), "%s", name ? name : type);
	rc = cfg_geometry(root, text, m);
	if (rc == 0)
		rc = cfg_sliding(root, text, m, type);
	if (rc == 0)
		cfg_dtype(root, text, m);
	cJSON_Delete(root);
	return rc;
}

int
kvc_model_load(const char *path, struct kvc_model *m)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	size_t n;
	int rc, err;

	if (!f) {
		err = errno;
		return kvtr_err(-err, "config %s: %s", path, strerror(err));
	}
	buf = malloc(CFG_MAX_BYTES + 1);
	if (!buf) {
		fclose(f);
		return kvtr_err(-ENOMEM, "config %s: out of memory", path);
	}
	n = fread(buf, 1, CFG_MAX_BYTES + 1, f);
	rc = ferror(f) ? kvtr_err(-EIO, "config %s: read error", path) : 0;
	if (rc == 0 && n > CFG_MAX_BYTES)
		rc = kvtr_err(-EINVAL, "config %s: larger than %u bytes", path, CFG_MAX_BYTES);
	fclose(f);
	if (rc == 0) {
		buf[n] = '\0';
		rc = kvc_model_from_json(buf, m);
		if (rc) {
			char msg[512];

			snprintf(msg, sizeof(msg), "%s", kvtr_last_error());
			rc = kvtr_err(rc, "%s: %s", path, msg);
		}
	}
	free(buf);
	return rc;
}
