/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-hf/model.c - config.json and model.safetensors as transformers' save_pretrained
 * writes them: the header JSON parsed with cJSON, tensors converted to f32 (see hf.h).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "hf.h"
#include "kernels/attention.h"
#include "util.h"

#define HF_MAX_FILE (UINT64_C(1) << 34) /* 16 GiB */
#define HF_MAX_HEADER (UINT64_C(100) << 20)

struct hf_tensor {
	char name[128];
	uint64_t off; /* into m->f32, floats */
	uint64_t n;
	uint64_t shape[4];
	int ndim;
};

static int
hf_read_file(const char *path, char **buf, uint64_t *len)
{
	FILE *f = fopen(path, "rb");
	long n;

	*buf = NULL;
	if (!f)
		return kvtr_err(-errno, "cannot open %s: %s", path, strerror(errno));
	if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
		fclose(f);
		return kvtr_err(-EIO, "cannot size %s", path);
	}
	if ((uint64_t)n > HF_MAX_FILE) {
		fclose(f);
		return kvtr_err(KVT_EFORMAT, "%s: %ld bytes is too large", path, n);
	}
	*buf = malloc((size_t)n + 1);
	if (!*buf) {
		fclose(f);
		return kvtr_err(-ENOMEM, "out of memory reading %s (%ld bytes)", path, n);
	}
	if (n > 0 && fread(*buf, 1, (size_t)n, f) != (size_t)n) {
		fclose(f);
		free(*buf);
		*buf = NULL;
		return kvtr_err(-EIO, "cannot read %s", path);
	}
	fclose(f);
	(*buf)[n] = '\0';
	*len = (uint64_t)n;
	return 0;
}

static float
hf_bf16(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/*
 * Parses the safetensors file in @buf (@len bytes): calls @cb for every tensor with its f32
 * conversion done into @dst (when @dst is NULL only counts; *total receives the floats).
 */
struct hf_st {
	cJSON *hdr;
	const unsigned char *data;
	uint64_t data_len;
};

static int
hf_st_open(const char *path, const char *buf, uint64_t len, struct hf_st *st)
{
	uint64_t hl = 0;
	char *js;

	memset(st, 0, sizeof(*st));
	if (len < 8)
		return kvtr_err(KVT_EFORMAT, "%s: not a safetensors file (%llu bytes)", path,
				(unsigned long long)len);
	for (int i = 7; i >= 0; i--)
		hl = hl << 8 | (unsigned char)buf[i];
	if (hl > HF_MAX_HEADER || hl > len - 8)
		return kvtr_err(KVT_EFORMAT, "%s: header of %llu bytes in a file of %llu", path,
				(unsigned long long)hl, (unsigned long long)len);
	js = malloc((size_t)hl + 1);
	if (!js)
		return kvtr_err(-ENOMEM, "out of memory for the header of %s", path);
	memcpy(js, buf + 8, (size_t)hl);
	js[hl] = '\0';
	st->hdr = cJSON_Parse(js);
	free(js);
	if (!cJSON_IsObject(st->hdr)) {
		cJSON_Delete(st->hdr);
		st->hdr = NULL;
		return kvtr_err(KVT_EFORMAT, "%s: the header is not a JSON object", path);
	}
	st->data = (const unsigned char *)buf + 8 + hl;
	st->data_len = len - 8 - hl;
	return 0;
}

/* One tensor entry @t: shape, and f32 conversion into @dst (NULL: only the count). */
static int
hf_st_tensor(const char *path, const struct hf_st *st, const cJSON *t, float *dst, uint64_t *n,
	     uint64_t *shape, int *ndim)
{
	const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
	const cJSON *sh = cJSON_GetObjectItemCaseSensitive(t, "shape");
	const cJSON *of = cJSON_GetObjectItemCaseSensitive(t, "data_offsets"), *x;
	uint64_t cnt = 1, b, e, esz;
	int nd = 0, kind;

	if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(of) ||
	    cJSON_GetArraySize(of) != 2)
		return kvtr_err(KVT_EFORMAT, "%s: tensor %s: no dtype, shape or data_offsets", path,
				t->string);
	if (!strcmp(dt->valuestring, "F32"))
		kind = 0, esz = 4;
	else if (!strcmp(dt->valuestring, "F16"))
		kind = 1, esz = 2;
	else if (!strcmp(dt->valuestring, "BF16"))
		kind = 2, esz = 2;
	else
		return kvtr_err(KVT_EFORMAT, "%s: tensor %s has dtype %s (f32, f16, bf16 only)",
				path, t->string, dt->valuestring);
	cJSON_ArrayForEach(x, sh) {
		if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 1e12 || nd >= 4)
			return kvtr_err(KVT_EFORMAT, "%s: tensor %s: bad shape", path, t->string);
		if (shape)
			shape[nd] = (uint64_t)x->valuedouble;
		cnt *= (uint64_t)x->valuedouble;
		nd++;
	}
	b = (uint64_t)cJSON_GetArrayItem(of, 0)->valuedouble;
	e = (uint64_t)cJSON_GetArrayItem(of, 1)->valuedouble;
	if (b > e || e > st->data_len || e - b != cnt * esz)
		return kvtr_err(KVT_EFORMAT, "%s: tensor %s: data_offsets [%llu, %llu) do not hold "
				"%llu elements of %llu bytes in %llu bytes of data", path, t->string,
				(unsigned long long)b, (unsigned long long)e,
				(unsigned long long)cnt, (unsigned long long)esz,
				(unsigned long long)st->data_len);
	if (dst) {
		const unsigned char *p = st->data + b;

		for (uint64_t i = 0; i < cnt; i++) {
			uint16_t h;

			if (kind == 0) {
				memcpy(&dst[i], p + 4 * i, 4);
				continue;
			}
			memcpy(&h, p + 2 * i, 2);
			if (kind == 2)
				dst[i] = hf_bf16(h);
			else
				(void)kvt_load_f32(KVT_DTYPE_F16, &dst[i], &h, 1);
		}
	}
	*n = cnt;
	if (ndim)
		*ndim = nd;
	return 0;
}

int
kvhf_safetensors_f32(const char *path, const char *name, float **out, uint64_t *n,
		     uint64_t *shape, int *ndim)
{
	struct hf_st st;
	char *buf;
	uint64_t len, cnt = 0;
	const cJSON *t;
	int rc;

	*out = NULL;
	rc = hf_read_file(path, &buf, &len);
	if (rc)
		return rc;
	rc = hf_st_open(path, buf, len, &st);
	if (rc == 0) {
		t = cJSON_GetObjectItemCaseSensitive(st.hdr, name);
		if (!t)
			rc = kvtr_err(-ENOENT, "%s: no tensor %s", path, name);
		else
			rc = hf_st_tensor(path, &st, t, NULL, &cnt, shape, ndim);
		if (rc == 0 && !(*out = malloc((size_t)(cnt ? cnt : 1) * sizeof(float))))
			rc = kvtr_err(-ENOMEM, "out of memory for tensor %s", name);
		if (rc == 0)
			rc = hf_st_tensor(path, &st, t, *out, &cnt, NULL, NULL);
		if (rc) {
			free(*out);
			*out = NULL;
		}
		*n = cnt;
	}
	cJSON_Delete(st.hdr);
	free(buf);
	return rc;
}

/* Loads every tensor of DIR/model.safetensors into m->f32 and the index. */
static int
hf_load_tensors(struct kvhf_model *m, const char *path)
{
	struct hf_st st;
	struct hf_tensor *ix;
	const cJSON *t;
	uint64_t len, total = 0, n;
	char *buf;
	int rc, count = 0;

	rc = hf_read_file(path, &buf, &len);
	if (rc)
		return rc;
	rc = hf_st_open(path, buf, len, &st);
	if (rc) {
		free(buf);
		return rc;
	}
	cJSON_ArrayForEach(t, st.hdr) {
		if (!strcmp(t->string, "__metadata__"))
			continue;
		rc = hf_st_tensor(path, &st, t, NULL, &n, NULL, NULL);
		if (rc)
			goto out;
		if (strlen(t->string) >= sizeof(ix->name)) {
			rc = kvtr_err(KVT_EFORMAT, "%s: tensor name %s is too long", path,
				      t->string);
			goto out;
		}
		total += n;
		count++;
	}
	ix = calloc((size_t)count + 1, sizeof(*ix));
	m->f32 = malloc((size_t)(total ? total : 1) * sizeof(float));
	m->tensors = ix;
	if (!ix || !m->f32) {
		rc = kvtr_err(-ENOMEM, "out of memory for %llu weights", (unsigned long long)total);
		goto out;
	}
	total = 0;
	cJSON_ArrayForEach(t, st.hdr) {
		struct hf_tensor *x;

		if (!strcmp(t->string, "__metadata__"))
			continue;
		x = &ix[m->n_tensors++];
		snprintf(x->name, sizeof(x->name), "%s", t->string);
		x->off = total;
		rc = hf_st_tensor(path, &st, t, m->f32 + total, &x->n, x->shape, &x->ndim);
		if (rc)
			goto out;
		total += x->n;
	}
out:
	cJSON_Delete(st.hdr);
	free(buf);
	return rc;
}

/* The tensor @name with exactly @d0 x @d1 elements (@d1 = 0: one dimension); NULL when
 * @optional and absent. */
static int
hf_get(struct kvhf_model *m, const char *name, uint64_t d0, uint64_t d1, int optional,
       const float **out)
{
	const struct hf_tensor *ix = m->tensors;

	*out = NULL;
	for (uint32_t i = 0; i < m->n_tensors; i++) {
		const struct hf_tensor *x = &ix[i];

		if (strcmp(x->name, name))
			continue;
		if ((d1 == 0 && (x->ndim != 1 || x->shape[0] != d0)) ||
		    (d1 != 0 && (x->ndim != 2 || x->shape[0] != d0 || x->shape[1] != d1)))
			return kvtr_err(KVT_EFORMAT, "tensor %s has shape [%llu%s%llu], expected "
					"[%llu%s%llu]", name, (unsigned long long)x->shape[0],
					x->ndim > 1 ? ", " : "",
					x->ndim > 1 ? (unsigned long long)x->shape[1] : 0ULL,
					(unsigned long long)d0, d1 ? ", " : "",
					(unsigned long long)d1);
		*out = m->f32 + x->off;
		return 0;
	}
	if (optional)
		return 0;
	return kvtr_err(KVT_EFORMAT, "model.safetensors has no tensor %s", name);
}

/* The tensor @name of exactly @nd dims @dims (conv1d's [C][1][K]). */
static int
hf_get_nd(struct kvhf_model *m, const char *name, int nd, const uint64_t *dims,
	  const float **out)
{
	const struct hf_tensor *ix = m->tensors;

	*out = NULL;
	for (uint32_t i = 0; i < m->n_tensors; i++) {
		const struct hf_tensor *x = &ix[i];
		int ok = x->ndim == nd;

		if (strcmp(x->name, name))
			continue;
		for (int d = 0; ok && d < nd; d++)
			ok = x->shape[d] == dims[d];
		if (!ok)
			return kvtr_err(KVT_EFORMAT, "tensor %s has %d dims [%llu, ...], expected %d "
					"[%llu, ...]", name, x->ndim, (unsigned long long)x->shape[0],
					nd, (unsigned long long)dims[0]);
		*out = m->f32 + x->off;
		return 0;
	}
	return kvtr_err(KVT_EFORMAT, "model.safetensors has no tensor %s", name);
}

/* config helpers */
static const cJSON *
hf_item(const cJSON *c, const char *k)
{
	const cJSON *x = cJSON_GetObjectItemCaseSensitive(c, k);

	return cJSON_IsNull(x) ? NULL : x;
}

static int
hf_int(const cJSON *c, const char *k, int def, int lo, int hi, int *out)
{
	const cJSON *x = hf_item(c, k);

	if (!x) {
		if (def < lo)
			return kvtr_err(KVT_EFORMAT, "config.json has no %s", k);
		*out = def;
		return 0;
	}
	if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) ||
	    x->valuedouble < lo || x->valuedouble > hi)
		return kvtr_err(KVT_EFORMAT, "config.json: %s must be an integer in [%d, %d]", k,
				lo, hi);
	*out = (int)x->valuedouble;
	return 0;
}

static int
hf_num(const cJSON *c, const char *k, double def, double *out)
{
	const cJSON *x = hf_item(c, k);

	if (!x) {
		*out = def;
		return 0;
	}
	if (!cJSON_IsNumber(x))
		return kvtr_err(KVT_EFORMAT, "config.json: %s must be a number", k);
	*out = x->valuedouble;
	return 0;
}

static int
hf_bool(const cJSON *c, const char *k, int def)
{
	const cJSON *x = hf_item(c, k);

	return x ? cJSON_IsTrue(x) : def;
}

/* Which layers slide: layer_types when given, else the family's rule. */
static int
hf_layer_types(struct kvhf_model *m, const cJSON *c)
{
	const cJSON *lt = hf_item(c, "layer_types");
	int pattern = 0, use_swa, mwl;

	if (lt) {
		if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != m->n_layers)
			return kvtr_err(KVT_EFORMAT, "config.json: layer_types must list %d layers",
					m->n_layers);
		for (int l = 0; l < m->n_layers; l++) {
			const cJSON *x = cJSON_GetArrayItem(lt, l);

			if (!cJSON_IsString(x))
				return kvtr_err(KVT_EFORMAT, "config.json: layer_types[%d]", l);
			if (!strcmp(x->valuestring, "sliding_attention") &&
			    m->family != KVHF_QWEN3NEXT)
				m->layers[l].sliding = 1;
			else if (m->dsa && (!strcmp(x->valuestring, "indexed_attention") ||
					    !strcmp(x->valuestring, "deepseek_sparse_attention")))
				continue; /* DSA: every layer indexed (transformers 5.20) */
			else if (!strcmp(x->valuestring, "linear_attention") &&
				 m->family == KVHF_QWEN3NEXT)
				m->layers[l].linear = 1;
			else if (strcmp(x->valuestring, "full_attention"))
				return kvtr_err(KVT_EFORMAT, "config.json: layer_types[%d] is %s "
						"(%s or full_attention)", l, x->valuestring,
						m->family == KVHF_QWEN3NEXT ? "linear_attention"
						: "sliding_attention");
		}
	} else if (m->family == KVHF_QWEN3NEXT) {
		/* Qwen3NextConfig: layer i is full attention when (i + 1) % interval == 0 */
		int rc = hf_int(c, "full_attention_interval", 4, 1, 1 << 20, &pattern);

		if (rc)
			return rc;
		for (int l = 0; l < m->n_layers; l++)
			m->layers[l].linear = (l + 1) % pattern != 0;
	} else if (m->family == KVHF_GEMMA3) {
		int rc = hf_int(c, hf_item(c, "sliding_window_pattern") ? "sliding_window_pattern"
				   : "_sliding_window_pattern", 6, 1, 1 << 20, &pattern);

		if (rc)
			return rc;
		for (int l = 0; l < m->n_layers; l++)
			m->layers[l].sliding = (l + 1) % pattern != 0;
	} else if (!strcmp(m->model_type, "qwen2")) {
		int rc;

		use_swa = hf_bool(c, "use_sliding_window", 0);
		rc = hf_int(c, "max_window_layers", m->n_layers, 0, 1 << 20, &mwl);
		if (rc)
			return rc;
		for (int l = 0; l < m->n_layers; l++)
			m->layers[l].sliding = use_swa && l >= mwl;
	} else if (!strcmp(m->model_type, "mistral")) {
		for (int l = 0; l < m->n_layers; l++)
			m->layers[l].sliding = 1;
	}
	if (m->sliding_window == 0)
		for (int l = 0; l < m->n_layers; l++)
			m->layers[l].sliding = 0;
	if (!strcmp(m->model_type, "qwen2") && !hf_bool(c, "use_sliding_window", 0))
		for (int l = 0; l < m->n_layers; l++)
			m->layers[l].sliding = 0;
	return 0;
}

/*
 * rope_parameters (transformers 5: {"rope_type", "rope_theta"}) when present: the default rope
 * only; *theta its rope_theta (10000 when absent; a top-level rope_theta overrides it).
 */
static int
hf_rope_parameters(const cJSON *c, double *theta)
{
	const cJSON *rp = hf_item(c, "rope_parameters"), *ty;

	*theta = 10000.0;
	if (!rp)
		return 0;
	if (!cJSON_IsObject(rp))
		return kvtr_err(KVT_EFORMAT, "config.json: rope_parameters must be an object");
	ty = hf_item(rp, "rope_type");
	if (ty && (!cJSON_IsString(ty) || strcmp(ty->valuestring, "default")))
		return kvtr_err(KVT_ENOTSUP, "config.json: rope_parameters.rope_type is not "
				"\"default\": not implemented (only the default rope)");
	return hf_num(rp, "rope_theta", 10000.0, theta);
}

/*
 * DeepSeek-V3.2's indexer geometry (transformers' DeepseekV32Config / DeepseekV32Indexer):
 * index_topk, index_n_heads, index_head_dim; the indexer reads the q latent (q_lora_rank is
 * required), ropes the first qk_rope_head_dim channels of its query and key with the model's
 * rotary embedding (dim head_dim, so head_dim must equal qk_rope_head_dim); MoE layers
 * (mlp_layer_types "sparse") are refused as in deepseek_v3.
 */
static int
hf_dsa_config(struct kvhf_model *m, const cJSON *c)
{
	const cJSON *mlt = hf_item(c, "mlp_layer_types"), *x;
	int rc;

	if ((rc = hf_int(c, "index_topk", -1, 1, 1 << 24, &m->index_topk)) ||
	    (rc = hf_int(c, "index_n_heads", -1, 1, 4096, &m->index_n_heads)) ||
	    (rc = hf_int(c, "index_head_dim", -1, 2, 4096, &m->index_head_dim)))
		return rc;
	if (!m->q_lora_rank)
		return kvtr_err(KVT_EFORMAT, "config.json: deepseek_v32 needs q_lora_rank (its "
				"indexer reads the q latent)");
	if (m->index_head_dim < m->qk_rope)
		return kvtr_err(KVT_EFORMAT, "config.json: index_head_dim %d < qk_rope_head_dim %d",
				m->index_head_dim, m->qk_rope);
	if (m->head_dim != m->qk_rope)
		return kvtr_err(KVT_ENOTSUP, "config.json: head_dim %d (the rotary embedding's "
				"dim) differs from qk_rope_head_dim %d: not implemented",
				m->head_dim, m->qk_rope);
	if (mlt) {
		if (!cJSON_IsArray(mlt) || cJSON_GetArraySize(mlt) != m->n_layers)
			return kvtr_err(KVT_EFORMAT, "config.json: mlp_layer_types must list %d "
					"layers", m->n_layers);
		cJSON_ArrayForEach(x, mlt)
			if (!cJSON_IsString(x) || strcmp(x->valuestring, "dense"))
				return kvtr_err(KVT_ENOTSUP, "config.json: mlp_layer_types has a "
						"non-dense layer: MoE layers are not implemented");
	}
	return 0;
}
static int hf_qwen3next_config(struct kvhf_model *m, const cJSON *c, double *theta);

static int
hf_config(struct kvhf_model *m, const cJSON *c)
{
	const cJSON *mt = hf_item(c, "model_type");
	double eps, theta, local, qpas, sc;
	int rc, shared = 0;

	if (!cJSON_IsString(mt))
		return kvtr_err(KVT_EFORMAT, "config.json has no model_type");
	snprintf(m->model_type, sizeof(m->model_type), "%s", mt->valuestring);
	if (!strcmp(mt->valuestring, "gemma3_text"))
		m->family = KVHF_GEMMA3;
	else if (!strcmp(mt->valuestring, "deepseek_v3"))
		m->family = KVHF_DEEPSEEK;
	else if (!strcmp(mt->valuestring, "mistral") || !strcmp(mt->valuestring, "qwen2") ||
		 !strcmp(mt->valuestring, "llama"))
		m->family = KVHF_LLAMA;
	else if (!strcmp(mt->valuestring, "qwen3_next"))
		m->family = KVHF_QWEN3NEXT;
	else if (!strcmp(mt->valuestring, "deepseek_v32"))
		m->family = KVHF_DEEPSEEK, m->dsa = 1;
	else
		return kvtr_err(KVT_ENOTSUP, "model_type %s is not supported (gemma3_text, "
				"deepseek_v3, deepseek_v32, qwen3_next, mistral, qwen2, llama)",
				mt->valuestring);
	if (hf_item(c, "rope_scaling"))
		return kvtr_err(KVT_ENOTSUP, "config.json: rope_scaling is set: not implemented "
				"(only the default rope)");
	theta = 10000.0;
	if (m->dsa && (rc = hf_rope_parameters(c, &theta)) != 0)
		return rc;
	if ((rc = hf_int(c, "vocab_size", -1, 1, 1 << 24, &m->vocab)) ||
	    (rc = hf_int(c, "hidden_size", -1, 1, 1 << 16, &m->hidden)) ||
	    (rc = hf_int(c, "intermediate_size", -1, 1, 1 << 18, &m->inter)) ||
	    (rc = hf_int(c, "num_hidden_layers", -1, 1, 4096, &m->n_layers)) ||
	    (rc = hf_int(c, "num_attention_heads", -1, 1, 4096, &m->n_heads)) ||
	    (rc = hf_int(c, "num_key_value_heads", m->n_heads, 1, 4096, &m->n_kv_heads)) ||
	    (rc = hf_int(c, "head_dim", m->hidden / m->n_heads, 1, 4096, &m->head_dim)) ||
	    (rc = hf_int(c, "max_position_embeddings", 1 << 20, 1, 1 << 26, &m->max_pos)) ||
	    (rc = hf_int(c, "sliding_window", 0, 0, 1 << 26, &m->sliding_window)) ||
	    (rc = hf_num(c, "rms_norm_eps", 1e-6, &eps)) ||
	    (rc = hf_num(c, "rope_theta", theta, &theta)))
		return rc;
	if (m->n_heads % m->n_kv_heads)
		return kvtr_err(KVT_EFORMAT, "config.json: %d heads are not a multiple of %d KV "
				"heads", m->n_heads, m->n_kv_heads);
	m->rotary_dim = m->head_dim;
	if (m->family == KVHF_QWEN3NEXT) {
		rc = hf_qwen3next_config(m, c, &theta);
		if (rc)
			return rc;
	}
	m->eps = (float)eps;
	m->layers = calloc((size_t)m->n_layers, sizeof(*m->layers));
	if (!m->layers)
		return kvtr_err(-ENOMEM, "out of memory");
	for (int l = 0; l < m->n_layers; l++) {
		m->layers[l].rope_theta = (float)theta;
		m->layers[l].kv_src = l;
	}
	rc = hf_layer_types(m, c);
	if (rc)
		return rc;
	m->n_linear = 0;
	for (int l = 0; l < m->n_layers; l++)
		m->layers[l].lin_idx = m->layers[l].linear ? m->n_linear++ : -1;
	if (m->family == KVHF_QWEN3NEXT) {
		int nexp, step;

		if ((rc = hf_int(c, "num_experts", 0, 0, 1 << 20, &nexp)) ||
		    (rc = hf_int(c, "decoder_sparse_step", 1, 1, 1 << 20, &step)))
			return rc;
		for (int l = 0; l < m->n_layers; l++) {
			const cJSON *mo = hf_item(c, "mlp_only_layers"), *x;
			int dense = 0;

			cJSON_ArrayForEach(x, mo)
				if (cJSON_IsNumber(x) && x->valuedouble == (double)l)
					dense = 1;
			/* Qwen3NextDecoderLayer: MoE unless in mlp_only_layers or no experts */
			if (!dense && nexp > 0 && (l + 1) % step == 0)
				return kvtr_err(KVT_ENOTSUP, "config.json: layer %d is a MoE layer "
						"(not in mlp_only_layers): MoE layers are not "
						"implemented", l);
		}
		if (m->n_linear == m->n_layers)
			return kvtr_err(KVT_ENOTSUP, "config.json: no full_attention layer: a model "
					"of linear-attention layers only is not supported");
	}
	m->attn_scale = (float)pow((double)m->head_dim, -0.5);
	if (m->family == KVHF_GEMMA3) {
		if ((rc = hf_num(c, "rope_local_base_freq", 10000.0, &local)) ||
		    (rc = hf_num(c, "query_pre_attn_scalar", m->head_dim, &qpas)))
			return rc;
		for (int l = 0; l < m->n_layers; l++)
			if (m->layers[l].sliding)
				m->layers[l].rope_theta = (float)local;
		m->attn_scale = (float)pow(qpas, -0.5);
		/* attn_logit_softcapping is not applied: transformers 4.57's Gemma3Attention does
		 * not pass it to the attention (only Gemma 2 uses it); Gemma 3 ships it null */
		if ((rc = hf_num(c, "final_logit_softcapping", 0.0, &sc)))
			return rc;
		m->final_softcap = (float)sc;
		const cJSON *act = hf_item(c, "hidden_activation");

		if (hf_bool(c, "use_bidirectional_attention", 0))
			return kvtr_err(KVT_ENOTSUP, "config.json: use_bidirectional_attention (an "
					"encoder) is not supported");

		if (act && (!cJSON_IsString(act) || (strcmp(act->valuestring, "gelu_pytorch_tanh") &&
						     strcmp(act->valuestring, "gelu_tanh"))))
			return kvtr_err(KVT_ENOTSUP, "config.json: hidden_activation must be "
					"gelu_pytorch_tanh");
	} else {
		const cJSON *act = hf_item(c, "hidden_act");

		if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu")))
			return kvtr_err(KVT_ENOTSUP, "config.json: hidden_act must be silu");
	}
	if (m->family == KVHF_DEEPSEEK) {
		int fkd;

		if ((rc = hf_int(c, "q_lora_rank", 0, 0, 1 << 16, &m->q_lora_rank)) ||
		    (rc = hf_int(c, "kv_lora_rank", -1, 1, 1 << 16, &m->kv_lora_rank)) ||
		    (rc = hf_int(c, "qk_nope_head_dim", -1, 0, 4096, &m->qk_nope)) ||
		    (rc = hf_int(c, "qk_rope_head_dim", -1, 2, 4096, &m->qk_rope)) ||
		    (rc = hf_int(c, "v_head_dim", -1, 1, 4096, &m->v_head_dim)) ||
		    (rc = hf_int(c, "first_k_dense_replace", 0, 0, 1 << 20, &fkd)))
			return rc;
		if (fkd < m->n_layers)
			return kvtr_err(KVT_ENOTSUP, "config.json: first_k_dense_replace %d < %d "
					"layers: MoE layers are not implemented", fkd, m->n_layers);
		if (m->qk_rope % 2)
			return kvtr_err(KVT_EFORMAT, "config.json: qk_rope_head_dim must be even");
		m->rope_interleave = hf_bool(c, "rope_interleave", 1);
		m->attn_scale = (float)pow((double)(m->qk_nope + m->qk_rope), -0.5);
		m->kv_heads_stored = 1;
		m->kv_head_dim_stored = (uint32_t)(m->kv_lora_rank + m->qk_rope);
		if (m->dsa && (rc = hf_dsa_config(m, c)) != 0)
			return rc;
	} else {
		/* an odd rotary part r rotates r + 1 elements, as transformers' rope (fwd.c) */
		if (m->head_dim % 2 || m->rotary_dim < 1 ||
		    m->rotary_dim + m->rotary_dim % 2 > m->head_dim)
			return kvtr_err(KVT_ENOTSUP, "config.json: head_dim %d with a rotary part of "
					"%d: an even head_dim and a rotary part of 1 .. head_dim "
					"(rounded up to even) are implemented", m->head_dim,
					m->rotary_dim);
		m->kv_heads_stored = (uint32_t)m->n_kv_heads;
		m->kv_head_dim_stored = (uint32_t)m->head_dim;
	}
	m->kv_width = m->kv_heads_stored * m->kv_head_dim_stored;
	if ((rc = hf_int(c, "num_kv_shared_layers", 0, 0, m->n_layers, &shared)) != 0)
		return rc;
	return shared ? kvhf_model_share_kv(m, shared) : 0;
}

/*
 * Qwen3-Next's own fields (Qwen3NextConfig): rope_parameters (rope_type "default" only; its
 * rope_theta into *theta, partial_rotary_factor; the older top-level rope_theta /
 * partial_rotary_factor when absent), the linear-attention shapes, no attention bias.
 */
static int
hf_qwen3next_config(struct kvhf_model *m, const cJSON *c, double *theta)
{
	const cJSON *rp = hf_item(c, "rope_parameters"), *rt;
	double prf;
	int rc;

	if (rp && !cJSON_IsObject(rp))
		return kvtr_err(KVT_EFORMAT, "config.json: rope_parameters must be an object");
	if (rp) {
		rt = hf_item(rp, "rope_type");
		if (rt && (!cJSON_IsString(rt) || strcmp(rt->valuestring, "default")))
			return kvtr_err(KVT_ENOTSUP, "config.json: rope_parameters.rope_type %s: "
					"only the default rope is implemented",
					cJSON_IsString(rt) ? rt->valuestring : "(not a string)");
		if ((rc = hf_num(rp, "rope_theta", *theta, theta)) ||
		    (rc = hf_num(rp, "partial_rotary_factor", 0.25, &prf)))
			return rc;
	} else if ((rc = hf_num(c, "partial_rotary_factor", 0.25, &prf)) != 0) {
		return rc;
	}
	if (!(prf > 0.0 && prf <= 1.0))
		return kvtr_err(KVT_EFORMAT, "config.json: partial_rotary_factor %g out of (0, 1]",
				prf);
	m->rotary_dim = (int)((double)m->head_dim * prf); /* transformers: int(head_dim x f) */
	m->attn_gate = 1;
	if (hf_bool(c, "attention_bias", 0))
		return kvtr_err(KVT_ENOTSUP, "config.json: attention_bias is not implemented for "
				"qwen3_next");
	if ((rc = hf_int(c, "linear_num_key_heads", -1, 1, 4096, &m->lin_nk)) ||
	    (rc = hf_int(c, "linear_num_value_heads", -1, 1, 4096, &m->lin_nv)) ||
	    (rc = hf_int(c, "linear_key_head_dim", -1, 1, 4096, &m->lin_dk)) ||
	    (rc = hf_int(c, "linear_value_head_dim", -1, 1, 4096, &m->lin_dv)) ||
	    (rc = hf_int(c, "linear_conv_kernel_dim", 4, 2, 64, &m->conv_kernel)))
		return rc;
	if (m->lin_nv % m->lin_nk)
		return kvtr_err(KVT_EFORMAT, "config.json: linear_num_value_heads %d is not a "
				"multiple of linear_num_key_heads %d", m->lin_nv, m->lin_nk);
	m->conv_dim = 2 * m->lin_nk * m->lin_dk + m->lin_nv * m->lin_dv;
	return 0;
}

int
kvhf_model_share_kv(struct kvhf_model *m, int n_shared)
{
	int first = m->n_layers - n_shared;

	if (m->family == KVHF_DEEPSEEK && n_shared)
		return kvtr_err(KVT_ENOTSUP, "KV-shared layers in an MLA model are not supported");
	if (m->n_linear && n_shared)
		return kvtr_err(KVT_ENOTSUP, "KV-shared layers in a model with linear-attention "
				"layers are not supported");
	if (n_shared < 0 || first < 1)
		return kvtr_err(KVT_EFORMAT, "%d KV-shared layers of %d: at least the first layer "
				"must store its K/V", n_shared, m->n_layers);
	for (int l = 0; l < m->n_layers; l++)
		m->layers[l].kv_src = l;
	for (int l = first; l < m->n_layers; l++) {
		int src = -1;

		/* Gemma3nTextAttention: the last layer before the shared ones of the same type */
		for (int j = first - 1; j >= 0 && src < 0; j--)
			if (m->layers[j].sliding == m->layers[l].sliding)
				src = j;
		if (src < 0)
			return kvtr_err(KVT_EFORMAT, "KV-shared layer %d (%s) has no earlier %s layer "
					"to read", l, m->layers[l].sliding ? "sliding" : "full",
					m->layers[l].sliding ? "sliding" : "full");
		m->layers[l].kv_src = src;
	}
	m->kv_shared_layers = n_shared;
	return 0;
}

static int
hf_weights(struct kvhf_model *m)
{
	uint64_t H = (uint64_t)m->hidden, I = (uint64_t)m->inter, V = (uint64_t)m->vocab;
	uint64_t nh = (uint64_t)m->n_heads, hd = (uint64_t)m->head_dim;
	uint64_t kvd = (uint64_t)m->n_kv_heads * hd;
	char nm[128];
	int rc;

	if ((rc = hf_get(m, "model.embed_tokens.weight", V, H, 0, &m->embed)) ||
	    (rc = hf_get(m, "model.norm.weight", H, 0, 0, &m->norm)) ||
	    (rc = hf_get(m, "lm_head.weight", V, H, 1, &m->lm_head)))
		return rc;
	if (!m->lm_head)
		m->lm_head = m->embed; /* tie_word_embeddings */
#define W(field, suffix, d0, d1, opt)                                                           \
	do {                                                                                     \
		snprintf(nm, sizeof(nm), "model.layers.%d.%s", l, suffix);                       \
		if ((rc = hf_get(m, nm, d0, d1, opt, &L->field)) != 0)                           \
			return rc;                                                               \
	} while (0)
	for (int l = 0; l < m->n_layers; l++) {
		struct kvhf_layer *L = &m->layers[l];

		W(in_norm, "input_layernorm.weight", H, 0, 0);
		W(post_attn_norm, "post_attention_layernorm.weight", H, 0, 0);
		W(gate, "mlp.gate_proj.weight", I, H, 0);
		W(up, "mlp.up_proj.weight", I, H, 0);
		W(down, "mlp.down_proj.weight", H, I, 0);
		if (L->linear) { /* Qwen3NextGatedDeltaNet */
			uint64_t nk = (uint64_t)m->lin_nk, nv = (uint64_t)m->lin_nv;
			uint64_t dk = (uint64_t)m->lin_dk, dv = (uint64_t)m->lin_dv;
			uint64_t cd[3] = { (uint64_t)m->conv_dim, 1, (uint64_t)m->conv_kernel };

			W(qkvz, "linear_attn.in_proj_qkvz.weight", 2 * nk * dk + 2 * nv * dv, H, 0);
			W(ba, "linear_attn.in_proj_ba.weight", 2 * nv, H, 0);
			W(A_log, "linear_attn.A_log", nv, 0, 0);
			W(dt_bias, "linear_attn.dt_bias", nv, 0, 0);
			W(lin_norm, "linear_attn.norm.weight", dv, 0, 0);
			W(out_proj, "linear_attn.out_proj.weight", H, nv * dv, 0);
			snprintf(nm, sizeof(nm), "model.layers.%d.linear_attn.conv1d.weight", l);
			if ((rc = hf_get_nd(m, nm, 3, cd, &L->conv_w)) != 0)
				return rc;
			continue;
		}
		if (m->family == KVHF_QWEN3NEXT) { /* gated attention: [query | gate] per head */
			W(wq, "self_attn.q_proj.weight", 2 * nh * hd, H, 0);
			W(wk, "self_attn.k_proj.weight", kvd, H, 0);
			W(wv, "self_attn.v_proj.weight", kvd, H, 0);
			W(wo, "self_attn.o_proj.weight", H, nh * hd, 0);
			W(q_norm, "self_attn.q_norm.weight", hd, 0, 0);
			W(k_norm, "self_attn.k_norm.weight", hd, 0, 0);
			continue;
		}
		if (m->family == KVHF_DEEPSEEK) {
			uint64_t qkd = (uint64_t)(m->qk_nope + m->qk_rope);
			uint64_t r = (uint64_t)m->kv_lora_rank;

			if (m->q_lora_rank) {
				W(q_a, "self_attn.q_a_proj.weight", (uint64_t)m->q_lora_rank, H, 0);
				W(q_a_norm, "self_attn.q_a_layernorm.weight",
				  (uint64_t)m->q_lora_rank, 0, 0);
				W(q_b, "self_attn.q_b_proj.weight", nh * qkd,
				  (uint64_t)m->q_lora_rank, 0);
			} else {
				W(wq, "self_attn.q_proj.weight", nh * qkd, H, 0);
			}
			W(kv_a, "self_attn.kv_a_proj_with_mqa.weight", r + (uint64_t)m->qk_rope, H,
			  0);
			W(kv_a_norm, "self_attn.kv_a_layernorm.weight", r, 0, 0);
			W(kv_b, "self_attn.kv_b_proj.weight",
			  nh * (uint64_t)(m->qk_nope + m->v_head_dim), r, 0);
			W(wo, "self_attn.o_proj.weight", H, nh * (uint64_t)m->v_head_dim, 0);
			if (m->dsa) {
				uint64_t ih = (uint64_t)m->index_n_heads;
				uint64_t id = (uint64_t)m->index_head_dim;

				W(ix_wq_b, "self_attn.indexer.wq_b.weight", ih * id,
				  (uint64_t)m->q_lora_rank, 0);
				W(ix_wk, "self_attn.indexer.wk.weight", id, H, 0);
				W(ix_kn_w, "self_attn.indexer.k_norm.weight", id, 0, 0);
				W(ix_kn_b, "self_attn.indexer.k_norm.bias", id, 0, 0);
				W(ix_wproj, "self_attn.indexer.weights_proj.weight", ih, H, 0);
			}
			continue;
		}
		W(wq, "self_attn.q_proj.weight", nh * hd, H, 0);
		W(wk, "self_attn.k_proj.weight", kvd, H, 0);
		W(wv, "self_attn.v_proj.weight", kvd, H, 0);
		W(wo, "self_attn.o_proj.weight", H, nh * hd, 0);
		W(bq, "self_attn.q_proj.bias", nh * hd, 0, 1);
		W(bk, "self_attn.k_proj.bias", kvd, 0, 1);
		W(bv, "self_attn.v_proj.bias", kvd, 0, 1);
		if (m->family == KVHF_GEMMA3) {
			W(q_norm, "self_attn.q_norm.weight", hd, 0, 0);
			W(k_norm, "self_attn.k_norm.weight", hd, 0, 0);
			W(pre_ffn_norm, "pre_feedforward_layernorm.weight", H, 0, 0);
			W(post_ffn_norm, "post_feedforward_layernorm.weight", H, 0, 0);
		}
	}
#undef W
	return 0;
}

int
kvhf_model_load(const char *dir, struct kvhf_model **out)
{
	struct kvhf_model *m;
	char path[4096], *buf = NULL;
	uint64_t len;
	cJSON *cfg;
	int rc;

	*out = NULL;
	m = calloc(1, sizeof(*m));
	if (!m)
		return kvtr_err(-ENOMEM, "out of memory");
	snprintf(path, sizeof(path), "%s/config.json", dir);
	rc = hf_read_file(path, &buf, &len);
	if (rc)
		goto fail;
	cfg = cJSON_Parse(buf);
	free(buf);
	if (!cJSON_IsObject(cfg)) {
		cJSON_Delete(cfg);
		rc = kvtr_err(KVT_EFORMAT, "%s is not a JSON object", path);
		goto fail;
	}
	rc = hf_config(m, cfg);
	cJSON_Delete(cfg);
	if (rc)
		goto fail;
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	rc = hf_load_tensors(m, path);
	if (rc == 0)
		rc = hf_weights(m);
	if (rc)
		goto fail;
	*out = m;
	return 0;
fail:
	kvhf_model_free(m);
	return rc;
}

int
kvhf_model_groups(const struct kvhf_model *m, struct kvhf_groups *gs)
{
	static const enum kvt_group_kind kinds[] = { KVT_GROUP_FULL, KVT_GROUP_WINDOW,
						     KVT_GROUP_LATENT, KVT_GROUP_ALIAS,
						     KVT_GROUP_STATE };
	uint32_t used = 0;

	memset(gs, 0, sizeof(*gs));
	gs->layers = calloc((size_t)m->n_layers, sizeof(uint32_t));
	gs->alias_of = calloc((size_t)m->n_layers, sizeof(uint32_t));
	if (!gs->layers || !gs->alias_of) {
		kvhf_groups_free(gs);
		return kvtr_err(-ENOMEM, "out of memory");
	}
	for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
		struct kvt_group *g = &gs->g[gs->n];
		uint32_t *ls = gs->layers + used;

		kvt_group_init(g, sizeof(*g));
		g->kind = kinds[k];
		for (int l = 0; l < m->n_layers; l++) {
			const struct kvhf_layer *L = &m->layers[l];
			enum kvt_group_kind want;

			if (L->linear)
				want = KVT_GROUP_STATE;
			else if (L->kv_src != l)
				want = KVT_GROUP_ALIAS;
			else if (m->family == KVHF_DEEPSEEK)
				want = KVT_GROUP_LATENT;
			else
				want = L->sliding ? KVT_GROUP_WINDOW : KVT_GROUP_FULL;
			if (want != g->kind)
				continue;
			if (want == KVT_GROUP_ALIAS)
				gs->alias_of[g->n_layers] = (uint32_t)L->kv_src;
			ls[g->n_layers++] = (uint32_t)l;
		}
		if (!g->n_layers)
			continue;
		used += g->n_layers;
		g->layers = ls;
		g->dtype = KVT_DTYPE_F32;
		if (g->kind == KVT_GROUP_LATENT) {
			g->latent_dim = m->kv_width;
		} else if (g->kind == KVT_GROUP_ALIAS) {
			g->alias_of = gs->alias_of;
		} else if (g->kind == KVT_GROUP_STATE) { /* kernels/linear.h's layouts */
			g->n_state = 2;
			g->state[0].n_dims = 2;
			g->state[0].shape[0] = (uint32_t)m->conv_dim;
			g->state[0].shape[1] = (uint32_t)m->conv_kernel - 1;
			g->state[0].dtype = KVT_DTYPE_F32;
			g->state[1].n_dims = 3;
			g->state[1].shape[0] = (uint32_t)m->lin_nv;
			g->state[1].shape[1] = (uint32_t)m->lin_dk;
			g->state[1].shape[2] = (uint32_t)m->lin_dv;
			g->state[1].dtype = KVT_DTYPE_F32;
		} else {
			g->n_kv_heads = (uint32_t)m->n_kv_heads;
			g->head_dim = (uint32_t)m->head_dim;
			if (g->kind == KVT_GROUP_WINDOW)
				g->window = (uint32_t)m->sliding_window;
		}
		gs->n++;
	}
	if (m->dsa) { /* the indexer keys in the LATENT group's blocks (dsa.h) */
		struct kvt_group *g = &gs->g[gs->n];
		uint32_t parent = UINT32_MAX;

		for (uint32_t i = 0; i < gs->n; i++)
			if (gs->g[i].kind == KVT_GROUP_LATENT)
				parent = i;
		if (parent == UINT32_MAX || gs->n >= KVHF_MAX_GROUPS) {
			kvhf_groups_free(gs);
			return kvtr_err(-EINVAL, "deepseek_v32: no LATENT group or no room for the "
					"indexer keys' SIDECAR group");
		}
		kvt_group_init(g, sizeof(*g));
		g->kind = KVT_GROUP_SIDECAR;
		g->parent = parent;
		g->sidecar_token_bytes = (uint64_t)m->index_head_dim * sizeof(float);
		gs->n++;
	}
	return 0;
}

void
kvhf_groups_free(struct kvhf_groups *gs)
{
	free(gs->layers);
	free(gs->alias_of);
	memset(gs, 0, sizeof(*gs));
}

void
kvhf_model_free(struct kvhf_model *m)
{
	if (!m)
		return;
	free(m->layers);
	free(m->f32);
	free(m->tensors);
	free(m);
}
