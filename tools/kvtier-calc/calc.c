/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-calc/calc.c - the arithmetic of kvtier-calc (see calc.h): geometry defaults and
 * checks, bytes per token/block/sequence, sessions per budget, and the parsers of sizes, counts
 * and dtype names.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "calc.h"
#include "util.h"

void
kvc_model_init(struct kvc_model *m)
{
	memset(m, 0, sizeof(*m));
	strcpy(m->name, "custom");
	m->kv_dtype_bytes = 2.0;
	strcpy(m->kv_dtype, "bf16");
	strcpy(m->kv_dtype_why, "default");
}

void
kvc_query_init(struct kvc_query *q)
{
	memset(q, 0, sizeof(*q));
	q->context = 4096;
	q->batch = 1;
	q->tokens_per_block = 16;
	q->hbm_util = 1.0;
}

double
kvc_dtype_bytes(const char *name)
{
	static const struct {
		const char *name; /* as written in configs and on the command line */
		double bytes;     /* per element */
	} t[] = {
		{ "fp32", 4 }, { "float32", 4 }, { "f32", 4 }, { "float", 4 },
		{ "fp16", 2 }, { "float16", 2 }, { "f16", 2 }, { "half", 2 },
		{ "bf16", 2 }, { "bfloat16", 2 },
		{ "fp8", 1 }, { "fp8_e4m3", 1 }, { "fp8_e5m2", 1 }, { "float8_e4m3fn", 1 },
		{ "int8", 1 }, { "int4", 0.5 }, { "fp4", 0.5 }, { "nvfp4", 0.5 },
	};

	if (!name)
		return 0;
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		if (strcasecmp(name, t[i].name) == 0)
			return t[i].bytes;
	return 0;
}

int
kvc_parse_bytes(const char *what, const char *s, uint64_t *out)
{
	/* the tools' one size syntax (kvtier-run/util.c); 0 is a valid budget here */
	return kvtr_parse_bytes(what, s, 0, UINT64_MAX, out);
}

int
kvc_parse_count(const char *what, const char *s, double *out)
{
	static const struct {
		char c;      /* suffix */
		double mult; /* its value */
	} sfx[] = { { 'k', 1e3 }, { 'K', 1e3 }, { 'm', 1e6 }, { 'M', 1e6 },
		    { 'b', 1e9 }, { 'B', 1e9 }, { 'g', 1e9 }, { 'G', 1e9 },
		    { 't', 1e12 }, { 'T', 1e12 } };
	char *end;
	double v, mult = 1.0;

	if (!s || !*s)
		return kvtr_err(-EINVAL, "%s: empty count", what);
	errno = 0;
	v = strtod(s, &end);
	if (end != s && *end && end[1] == '\0') {
		mult = -1.0;
		for (size_t i = 0; i < sizeof(sfx) / sizeof(sfx[0]); i++)
			if (*end == sfx[i].c)
				mult = sfx[i].mult;
	} else if (end == s || *end) {
		mult = -1.0;
	}
	if (errno || mult < 0 || !(v >= 0) || v * mult > 1e16)
		return kvtr_err(-EINVAL, "%s: '%s' is not a count (e.g. 8.03e9, 8B, 560M)", what,
				s);
	*out = v * mult;
	return 0;
}

/* Layer sliding (and linear) flags from full_every (full_attn_interval) when the config gave
 * no per-layer types. */
static void
calc_layer_pattern(struct kvc_model *m)
{
	if (m->layer_types_given)
		return;
	for (uint32_t i = 0; i < m->n_layers; i++) {
		m->layer_sliding[i] = m->sliding_window &&
				      !(m->full_every && (i + 1) % m->full_every == 0);
		m->layer_linear[i] = m->full_attn_interval &&
				     (i + 1) % m->full_attn_interval != 0;
	}
}

/* Linear layers (flags set), after the pattern: their geometry given and consistent. */
static int
calc_linear_finish(struct kvc_model *m)
{
	uint32_t n = 0, attn = 0;

	if (!m->layer_types_given && !m->full_attn_interval &&
	    (m->lin_k_heads || m->lin_v_heads || m->lin_k_dim || m->lin_v_dim))
		return kvtr_err(-EINVAL, "linear-attention geometry (linear_*) but no layer "
				"pattern: give layer_types or full_attention_interval in config.json "
				"(Qwen3-Next: 4)");

	for (uint32_t i = 0; i < m->n_layers; i++) {
		if (m->layer_linear[i] && i >= m->n_layers - m->kv_shared_layers)
			return kvtr_err(-EINVAL, "layer %u is linear attention and KV-shared", i);
		n += m->layer_linear[i];
		attn += !m->layer_linear[i] && i < m->n_layers - m->kv_shared_layers;
	}
	if (!n)
		return 0;
	if (!attn)
		return kvtr_err(-EINVAL, "all %u layers are linear attention: no layer stores KV "
				"(kvtier-calc sizes hybrid models)", m->n_layers);
	if (!m->lin_k_heads || !m->lin_v_heads || !m->lin_k_dim || !m->lin_v_dim)
		return kvtr_err(-EINVAL, "%u linear-attention layers but no state geometry: give "
				"linear_num_key_heads, linear_num_value_heads, linear_key_head_dim "
				"and linear_value_head_dim in config.json", n);
	if (m->lin_v_heads % m->lin_k_heads)
		return kvtr_err(-EINVAL, "%u linear value heads for %u key heads: not a multiple",
				m->lin_v_heads, m->lin_k_heads);
	if (!m->lin_conv_kernel)
		m->lin_conv_kernel = 4; /* Qwen3NextConfig's linear_conv_kernel_dim default */
	if (!(m->state_dtype_bytes > 0)) { /* the model's dtype, as vLLM's "auto" */
		m->state_dtype_bytes = m->weight_dtype_bytes > 0 ? m->weight_dtype_bytes : 2.0;
		snprintf(m->state_dtype, sizeof(m->state_dtype), "%s",
			 m->weight_dtype_bytes == 4 ? "fp32" : m->weight_dtype_bytes == 1 ? "fp8" :
			 m->weight_dtype_bytes == 0.5 ? "4-bit" : "16-bit");
	}
	return 0;
}

int
kvc_model_finish(struct kvc_model *m)
{
	int rc;

	if (!m->n_layers || m->n_layers > KVC_MAX_LAYERS)
		return kvtr_err(-EINVAL, "number of layers %u: give num_hidden_layers (or --layers)"
				" in 1..%u", m->n_layers, KVC_MAX_LAYERS);
	if (m->kv_shared_layers >= m->n_layers)
		return kvtr_err(-EINVAL, "%u KV-shared layers of %u: at least one layer must "
				"store KV", m->kv_shared_layers, m->n_layers);
	if (!(m->kv_dtype_bytes > 0))
		return kvtr_err(-EINVAL, "KV dtype unknown (use --kv-dtype)");
	calc_layer_pattern(m);
	rc = calc_linear_finish(m);
	if (rc)
		return rc;
	if (m->kv_lora_rank) /* MLA: one latent plus the rope key per token and layer */
		return 0;
	/* without the head count only an explicit head_dim says how wide a head is: no guess */
	if (!m->n_heads && m->head_dim && m->n_kv_heads)
		m->n_heads = m->n_kv_heads; /* assumed MHA: the KV bytes do not depend on it */
	else if (!m->n_heads && m->head_dim && m->hidden && m->hidden % m->head_dim == 0)
		m->n_heads = m->hidden / m->head_dim;
	if (!m->n_heads)
		return kvtr_err(-EINVAL, "number of attention heads missing or 0 "
				"(num_attention_heads / --heads), and no head_dim (--head-dim) with "
				"num_key_value_heads or hidden_size to size the heads by");
	if (!m->n_kv_heads)
		m->n_kv_heads = m->n_heads;
	if (!m->head_dim) {
		if (!m->hidden || m->hidden % m->n_heads)
			return kvtr_err(-EINVAL, "head_dim missing and hidden_size %u is not a "
					"multiple of %u heads", m->hidden, m->n_heads);
		m->head_dim = m->hidden / m->n_heads;
	}
	if (!m->v_head_dim)
		m->v_head_dim = m->head_dim;
	if (m->n_kv_heads > m->n_heads || m->n_heads % m->n_kv_heads)
		return kvtr_err(-EINVAL, "%u KV heads for %u attention heads: not a divisor",
				m->n_kv_heads, m->n_heads);
	return 0;
}

static enum kvc_attn
calc_attn(const struct kvc_model *m)
{
	if (m->kv_lora_rank)
		return KVC_ATTN_MLA;
	if (m->n_kv_heads == m->n_heads)
		return KVC_ATTN_MHA;
	return m->n_kv_heads == 1 ? KVC_ATTN_MQA : KVC_ATTN_GQA;
}

/* The NVMe format's slot for @bytes (kvt_fmt_slot_bytes): a 4 KiB header page, then the
 * bytes rounded up to 4 KiB. */
static uint64_t
calc_nvme_slot(double bytes)
{
	return 4096 + ((uint64_t)ceil(bytes) + 4095) / 4096 * 4096;
}

/* Sessions of @seq bytes in @budget bytes. */
static uint64_t
calc_fit(double budget, double seq)
{
	return budget > 0 && seq > 0 ? (uint64_t)floor(budget / seq) : 0;
}

/* The groups of struct kvc_group for @m at @q into @r. */
static void
calc_groups(const struct kvc_model *m, const struct kvc_query *q, struct kvc_result *r)
{
	uint32_t stored = m->n_layers - m->kv_shared_layers, nl[KVC_MAX_GROUPS] = { 0 };
	uint64_t tpb = q->tokens_per_block, blocks = (q->context + tpb - 1) / tpb;
	double slot = 0.0;

	for (uint32_t i = 0; i < stored; i++) {
		if (m->layer_linear[i])
			nl[KVC_GROUP_STATE]++;
		else if (m->kv_lora_rank)
			nl[KVC_GROUP_LATENT]++;
		else if (m->layer_sliding[i] && m->sliding_window)
			nl[KVC_GROUP_WINDOW]++;
		else
			nl[KVC_GROUP_FULL]++;
	}
	nl[KVC_GROUP_ALIAS] = m->kv_shared_layers;
	r->n_groups = 0;
	for (int k = 0; k < KVC_MAX_GROUPS; k++) {
		struct kvc_group *g = &r->groups[r->n_groups];
		uint64_t tok = q->context;

		if (!nl[k])
			continue;
		memset(g, 0, sizeof(*g));
		g->kind = (enum kvc_group_kind)k;
		g->n_layers = nl[k];
		r->n_groups++;
		if (k == KVC_GROUP_ALIAS)
			continue;
		if (k == KVC_GROUP_STATE) {
			/* whatever the context, the engine's 2 live slots (engine/kvtier.h "STATE
			 * groups"): the state after the previous token and the one being written */
			g->layer_state_bytes = r->layer_state_bytes;
			g->block_bytes = (double)g->n_layers * g->layer_state_bytes;
			g->max_blocks = 2;
			g->seq_token_bytes = g->block_bytes;
		} else {
			g->layer_token_bytes = r->layer_token_bytes;
			g->block_bytes = (double)g->n_layers * (double)tpb * g->layer_token_bytes;
			g->max_blocks = blocks;
		}
		if (k == KVC_GROUP_WINDOW) {
			uint64_t bound = (g->sink + tpb - 1) / tpb +
					 ((uint64_t)m->sliding_window + tpb - 1) / tpb + 1;

			g->window = m->sliding_window;
			if (g->max_blocks > bound)
				g->max_blocks = bound;
			if (tok > (uint64_t)g->window + g->sink)
				tok = (uint64_t)g->window + g->sink;
		}
		g->seq_bytes = (double)g->max_blocks * ceil(g->block_bytes);
		if (k != KVC_GROUP_STATE)
			g->seq_token_bytes = (double)tok * g->n_layers * g->layer_token_bytes;
		g->nvme_slot_bytes = calc_nvme_slot(g->block_bytes);
		r->seq_group_bytes += g->seq_bytes;
		r->seq_group_token_bytes += g->seq_token_bytes;
		if (ceil(g->block_bytes) > slot)
			slot = ceil(g->block_bytes);
	}
	for (uint32_t i = 0; i < r->n_groups; i++)
		r->seq_common_slot_bytes += (double)r->groups[i].max_blocks * slot;
}

int
kvc_compute(const struct kvc_model *m, const struct kvc_query *q, struct kvc_result *r)
{
	uint32_t stored = m->n_layers - m->kv_shared_layers;
	double wdt;

	if (!q->context || !q->batch || !q->tokens_per_block)
		return kvtr_err(-EINVAL, "context, batch and tokens per block must be > 0");
	if (!(q->hbm_util > 0 && q->hbm_util <= 1))
		return kvtr_err(-EINVAL, "HBM utilisation %g: expected (0, 1]", q->hbm_util);
	memset(r, 0, sizeof(*r));
	r->attn = calc_attn(m);
	r->layer_token_bytes = m->kv_lora_rank
		? (double)(m->kv_lora_rank + m->rope_dim) * m->kv_dtype_bytes
		: (double)m->n_kv_heads * (m->head_dim + m->v_head_dim) * m->kv_dtype_bytes;
	if (m->lin_k_heads) { /* calc.h: conv state conv_dim x (K - 1), delta-rule state */
		double conv_dim = 2.0 * m->lin_k_heads * m->lin_k_dim +
				  (double)m->lin_v_heads * m->lin_v_dim;

		r->layer_state_bytes = (conv_dim * (m->lin_conv_kernel - 1) +
					(double)m->lin_v_heads * m->lin_k_dim * m->lin_v_dim) *
				       m->state_dtype_bytes;
	}
	for (uint32_t i = 0; i < stored; i++) {
		uint64_t w = q->context;
		uint64_t blocks;

		if (m->layer_linear[i]) {
			r->linear_layers++;
			continue;
		}
		if (m->layer_sliding[i] && m->sliding_window) {
			r->sliding_layers++;
			if (w > m->sliding_window)
				w = m->sliding_window;
		}
		blocks = (w + q->tokens_per_block - 1) / q->tokens_per_block;
		r->seq_bytes += (double)w * r->layer_token_bytes;
		r->seq_paged_bytes += (double)blocks * q->tokens_per_block * r->layer_token_bytes;
	}
	r->kv_layers = stored - r->linear_layers;
	r->token_bytes = r->kv_layers * r->layer_token_bytes;
	r->block_bytes = r->token_bytes * q->tokens_per_block;
	r->seq_state_bytes = r->linear_layers * r->layer_state_bytes;
	r->state_tokens = r->token_bytes > 0 ? r->seq_state_bytes / r->token_bytes : 0;
	r->seq_full_bytes = (double)(m->n_layers - r->linear_layers) * r->layer_token_bytes *
			    (double)q->context + r->seq_state_bytes;
	r->seq_bytes += r->seq_state_bytes;
	r->seq_paged_bytes += r->seq_state_bytes;
	r->batch_bytes = r->seq_bytes * (double)q->batch;
	r->batch_paged_bytes = r->seq_paged_bytes * (double)q->batch;
	wdt = m->weight_dtype_bytes > 0 ? m->weight_dtype_bytes : m->kv_dtype_bytes;
	r->weight_bytes = q->weight_bytes ? (double)q->weight_bytes : q->params * wdt;
	r->hbm_kv_bytes = (double)q->hbm_bytes * q->hbm_util - r->weight_bytes;
	if (r->hbm_kv_bytes < 0)
		r->hbm_kv_bytes = 0;
	r->seq_blocks = (q->context + q->tokens_per_block - 1) / q->tokens_per_block;
	r->nvme_slot_bytes = calc_nvme_slot(r->block_bytes);
	r->seq_kvtier_bytes = (double)r->seq_blocks * ceil(r->block_bytes) + r->seq_state_bytes;
	r->seq_nvme_bytes = (double)r->seq_blocks * (double)r->nvme_slot_bytes;
	if (r->seq_state_bytes > 0) /* the state's own slot */
		r->seq_nvme_bytes += (double)calc_nvme_slot(r->seq_state_bytes);
	r->fit_hbm = calc_fit(r->hbm_kv_bytes, r->seq_kvtier_bytes);
	r->fit_host = calc_fit((double)q->host_bytes, r->seq_kvtier_bytes);
	r->fit_nvme = calc_fit((double)q->nvme_bytes, r->seq_nvme_bytes);
	r->fit_total = r->fit_hbm + r->fit_host + r->fit_nvme;
	calc_groups(m, q, r);
	return 0;
}
