/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-calc/print.c - kvtier-calc's report: human-readable text (binary units with the
 * exact byte count) or one JSON object (cJSON; keys listed in kvc_print_json).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

#include "calc.h"
#include "util.h"

static const char *const print_attn_name[] = { "MHA", "GQA", "MQA", "MLA" };
static const char *const print_group_name[] = { "FULL", "WINDOW", "LATENT", "ALIAS",
						 "STATE" };

/* "512 MiB" style, 3 significant decimals at most. */
static const char *
print_human(double b, char *buf, size_t cap)
{
	static const char *const u[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
	int i = 0;

	while (b >= 1024.0 && i < 5) {
		b /= 1024.0;
		i++;
	}
	snprintf(buf, cap, "%.4g %s", b, u[i]);
	return buf;
}

static void
print_geometry(FILE *f, const struct kvc_model *m, const struct kvc_result *r)
{
	fprintf(f, "model            %s: %s, %u layers (%u store KV", m->name,
		print_attn_name[r->attn], m->n_layers, r->kv_layers);
	if (r->sliding_layers)
		fprintf(f, ", %u with a %u-token sliding window", r->sliding_layers,
			m->sliding_window);
	if (r->linear_layers)
		fprintf(f, "; %u linear attention", r->linear_layers);
	fprintf(f, ")\n");
	fprintf(f, "KV dtype         %s (%g bytes): %s\n", m->kv_dtype, m->kv_dtype_bytes,
		m->kv_dtype_why);
	if (r->attn == KVC_ATTN_MLA)
		fprintf(f, "per layer        latent %u + rope key %u elements x %g bytes\n",
			m->kv_lora_rank, m->rope_dim, m->kv_dtype_bytes);
	else
		fprintf(f, "per layer        %u KV heads x (K %u + V %u) x %g bytes "
			"(%u attention heads)\n", m->n_kv_heads, m->head_dim, m->v_head_dim,
			m->kv_dtype_bytes, m->n_heads);
	if (r->linear_layers)
		fprintf(f, "linear layer     state: conv %u x %u + delta rule %u x %u x %u elements x "
			"%g bytes (%s) = %.0f bytes per sequence\n",
			2 * m->lin_k_heads * m->lin_k_dim + m->lin_v_heads * m->lin_v_dim,
			m->lin_conv_kernel - 1, m->lin_v_heads, m->lin_k_dim, m->lin_v_dim,
			m->state_dtype_bytes, m->state_dtype, r->layer_state_bytes);
}

void
kvc_print_text(FILE *f, const struct kvc_model *m, const struct kvc_query *q,
	       const struct kvc_result *r)
{
	char a[32], b[32], c[32];

	print_geometry(f, m, r);
	fprintf(f, "KV per token     %s (%.0f bytes)\n", print_human(r->token_bytes, a, sizeof a),
		r->token_bytes);
	fprintf(f, "KV per block     %s (%u tokens)\n", print_human(r->block_bytes, a, sizeof a),
		q->tokens_per_block);
	if (r->linear_layers)
		fprintf(f, "state per seq    %s (%.0f bytes, any context): the KV of %.0f "
			"attention tokens\n", print_human(r->seq_state_bytes, a, sizeof a),
			r->seq_state_bytes, r->state_tokens);
	fprintf(f, "per sequence     %s at %llu tokens (paged: %s", print_human(r->seq_bytes, a,
		sizeof a), (unsigned long long)q->context,
		print_human(r->seq_paged_bytes, b, sizeof b));
	if (r->seq_full_bytes != r->seq_bytes)
		fprintf(f, "; without windows/sharing %s",
			print_human(r->seq_full_bytes, a, sizeof a));
	fprintf(f, ")\n");
	fprintf(f, "kvtier stores    %llu blocks per sequence%s: %s (NVMe: %s in %llu-byte slots)\n",
		(unsigned long long)r->seq_blocks, r->seq_state_bytes > 0 ? " + its state" : "",
		print_human(r->seq_kvtier_bytes, a, sizeof a),
		print_human(r->seq_nvme_bytes, b, sizeof b),
		(unsigned long long)r->nvme_slot_bytes);
	fprintf(f, "batch of %-7llu %s (paged: %s)\n", (unsigned long long)q->batch,
		print_human(r->batch_bytes, a, sizeof a),
		print_human(r->batch_paged_bytes, b, sizeof b));
	if (r->weight_bytes > 0)
		fprintf(f, "weights          %s\n", print_human(r->weight_bytes, a, sizeof a));
	if (q->hbm_bytes && r->weight_bytes > (double)q->hbm_bytes * q->hbm_util)
		fprintf(f, "HBM              weights (%s) do not fit in HBM (%s%s): 0 sessions "
			"in HBM\n", print_human(r->weight_bytes, a, sizeof a),
			print_human((double)q->hbm_bytes * q->hbm_util, b, sizeof b),
			q->hbm_util < 1.0 ? " usable" : "");
	else if (q->hbm_bytes)
		fprintf(f, "HBM              %s for KV after weights: %llu sessions\n",
			print_human(r->hbm_kv_bytes, a, sizeof a), (unsigned long long)r->fit_hbm);
	if (q->host_bytes)
		fprintf(f, "host             %s: %llu sessions\n",
			print_human((double)q->host_bytes, a, sizeof a),
			(unsigned long long)r->fit_host);
	if (q->nvme_bytes)
		fprintf(f, "NVMe             %s: %llu sessions\n",
			print_human((double)q->nvme_bytes, a, sizeof a),
			(unsigned long long)r->fit_nvme);
	if (q->hbm_bytes || q->host_bytes || q->nvme_bytes)
		fprintf(f, "sessions in all  %llu of %llu tokens\n",
			(unsigned long long)r->fit_total, (unsigned long long)q->context);
	fprintf(f, "kvtier groups    %u (one pool each, slot = the group's block):\n", r->n_groups);
	for (uint32_t i = 0; i < r->n_groups; i++) {
		const struct kvc_group *g = &r->groups[i];

		if (g->kind == KVC_GROUP_ALIAS) {
			fprintf(f, "  %-6s %3u layers  no storage (they read earlier layers' KV)\n",
				print_group_name[g->kind], g->n_layers);
			continue;
		}
		if (g->kind == KVC_GROUP_STATE) {
			fprintf(f, "  %-6s %3u layers  2 slots of %.0f bytes per decoding sequence "
				"(the layers' states after the previous token and after this one; "
				"checkpoints behind them are prefix cache): %s\n",
				print_group_name[g->kind], g->n_layers,
				g->block_bytes, print_human(g->seq_bytes, a, sizeof a));
			continue;
		}
		fprintf(f, "  %-6s %3u layers  block %.0f bytes, at most %llu blocks per sequence: "
			"%s", print_group_name[g->kind], g->n_layers, g->block_bytes,
			(unsigned long long)g->max_blocks, print_human(g->seq_bytes, a, sizeof a));
		if (g->kind == KVC_GROUP_WINDOW)
			fprintf(f, " (window %u)", g->window);
		fprintf(f, "\n");
	}
	fprintf(f, "kvtier per seq   %s (%.0f bytes) in all tiers at most; without block "
		"rounding %s; one pool with a common slot: %s\n", print_human(r->seq_group_bytes, a, sizeof a),
		r->seq_group_bytes, print_human(r->seq_group_token_bytes, b, sizeof b),
		print_human(r->seq_common_slot_bytes, c, sizeof c));
}

/*
 * Keys: model, attention, layers, kv_layers, sliding_layers, sliding_window, kv_heads,
 * head_dim, v_head_dim, kv_lora_rank, rope_dim, kv_dtype (its name), kv_dtype_reason (why that
 * one), kv_dtype_bytes, tokens_per_block, context,
 * batch, kv_bytes_per_token, kv_bytes_per_layer_token, kv_bytes_per_block, seq_bytes,
 * seq_paged_bytes, seq_full_bytes, seq_blocks, seq_kvtier_bytes, seq_nvme_bytes,
 * nvme_slot_bytes, batch_bytes, batch_paged_bytes, weight_bytes,
 * hbm_bytes, host_bytes, nvme_bytes, hbm_kv_bytes, sessions_hbm, sessions_host,
 * sessions_nvme, sessions_total, linear_layers, state_bytes_per_layer, seq_state_bytes,
 * state_tokens; seq_group_bytes, seq_group_token_bytes, seq_common_slot_bytes and groups:
 * [{kind, layers, window, sink, layer_token_bytes, layer_state_bytes, block_bytes,
 * max_blocks, seq_bytes, seq_token_bytes, nvme_slot_bytes}] (struct kvc_group).
 */
int
kvc_print_json(FILE *f, const struct kvc_model *m, const struct kvc_query *q,
	       const struct kvc_result *r)
{
	cJSON *o = cJSON_CreateObject();
	const struct {
		const char *key; /* JSON key */
		double v;        /* value */
	} n[] = {
		{ "layers", m->n_layers }, { "kv_layers", r->kv_layers },
		{ "sliding_layers", r->sliding_layers }, { "sliding_window", m->sliding_window },
		{ "kv_heads", m->n_kv_heads }, { "head_dim", m->head_dim },
		{ "v_head_dim", m->v_head_dim }, { "kv_lora_rank", m->kv_lora_rank },
		{ "rope_dim", m->rope_dim }, { "kv_dtype_bytes", m->kv_dtype_bytes },
		{ "tokens_per_block", q->tokens_per_block }, { "context", (double)q->context },
		{ "batch", (double)q->batch }, { "kv_bytes_per_token", r->token_bytes },
		{ "kv_bytes_per_layer_token", r->layer_token_bytes },
		{ "kv_bytes_per_block", r->block_bytes }, { "seq_bytes", r->seq_bytes },
		{ "seq_paged_bytes", r->seq_paged_bytes }, { "seq_full_bytes", r->seq_full_bytes },
		{ "seq_blocks", (double)r->seq_blocks },
		{ "seq_kvtier_bytes", r->seq_kvtier_bytes },
		{ "seq_nvme_bytes", r->seq_nvme_bytes },
		{ "nvme_slot_bytes", (double)r->nvme_slot_bytes },
		{ "batch_bytes", r->batch_bytes }, { "batch_paged_bytes", r->batch_paged_bytes },
		{ "weight_bytes", r->weight_bytes }, { "hbm_bytes", (double)q->hbm_bytes },
		{ "host_bytes", (double)q->host_bytes }, { "nvme_bytes", (double)q->nvme_bytes },
		{ "hbm_kv_bytes", r->hbm_kv_bytes }, { "sessions_hbm", (double)r->fit_hbm },
		{ "sessions_host", (double)r->fit_host }, { "sessions_nvme", (double)r->fit_nvme },
		{ "sessions_total", (double)r->fit_total },
		{ "linear_layers", r->linear_layers },
		{ "state_bytes_per_layer", r->layer_state_bytes },
		{ "seq_state_bytes", r->seq_state_bytes }, { "state_tokens", r->state_tokens },
	};
	cJSON *ga = NULL;
	char *s;
	int ok;

	ok = o && cJSON_AddBoolToObject(o, "weights_fit_hbm", !q->hbm_bytes ||
					r->weight_bytes <= (double)q->hbm_bytes * q->hbm_util) &&
	     cJSON_AddStringToObject(o, "model", m->name) &&
	     cJSON_AddStringToObject(o, "kv_dtype", m->kv_dtype) &&
	     cJSON_AddStringToObject(o, "kv_dtype_reason", m->kv_dtype_why) &&
	     cJSON_AddStringToObject(o, "attention", print_attn_name[r->attn]);
	for (size_t i = 0; ok && i < sizeof(n) / sizeof(n[0]); i++)
		ok = cJSON_AddNumberToObject(o, n[i].key, n[i].v) != NULL;
	ok = ok && cJSON_AddNumberToObject(o, "seq_group_bytes", r->seq_group_bytes) &&
	     cJSON_AddNumberToObject(o, "seq_group_token_bytes", r->seq_group_token_bytes) &&
	     cJSON_AddNumberToObject(o, "seq_common_slot_bytes", r->seq_common_slot_bytes) &&
	     (ga = cJSON_AddArrayToObject(o, "groups")) != NULL;
	for (uint32_t i = 0; ok && i < r->n_groups; i++) {
		const struct kvc_group *g = &r->groups[i];
		cJSON *x = cJSON_CreateObject();

		ok = x && cJSON_AddItemToArray(ga, x) &&
		     cJSON_AddStringToObject(x, "kind", print_group_name[g->kind]) &&
		     cJSON_AddNumberToObject(x, "layers", g->n_layers) &&
		     cJSON_AddNumberToObject(x, "window", g->window) &&
		     cJSON_AddNumberToObject(x, "sink", g->sink) &&
		     cJSON_AddNumberToObject(x, "layer_token_bytes", g->layer_token_bytes) &&
		     cJSON_AddNumberToObject(x, "layer_state_bytes", g->layer_state_bytes) &&
		     cJSON_AddNumberToObject(x, "block_bytes", g->block_bytes) &&
		     cJSON_AddNumberToObject(x, "max_blocks", (double)g->max_blocks) &&
		     cJSON_AddNumberToObject(x, "seq_bytes", g->seq_bytes) &&
		     cJSON_AddNumberToObject(x, "seq_token_bytes", g->seq_token_bytes) &&
		     cJSON_AddNumberToObject(x, "nvme_slot_bytes", (double)g->nvme_slot_bytes);
	}
	s = ok ? cJSON_Print(o) : NULL;
	cJSON_Delete(o);
	if (!s)
		return kvtr_err(-ENOMEM, "out of memory writing JSON");
	ok = fprintf(f, "%s\n", s) > 0;
	free(s);
	return ok ? 0 : kvtr_err(-EIO, "cannot write the JSON report");
}
