/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-run/stats_json.c - the --stats-json report. Keys:
 *   mode ("kvtier" | "reference"), model, run {sessions, turns, steps_per_turn, temperature,
 *   topp, seed, tokens_per_block, kv_dtype, positions, tokens_generated, steps, batches,
 *   group_splits, windows, windowed_positions, lost_events, reprefill_positions, slot_remaps,
 *   parks, park_nospc, preemptions, kv_tokens, kv_blocks, elapsed_s, tok_per_s},
 *   geometry {block_bytes, hbm_slots, host_slots, nvme_slots},
 *   tiers.{hbm,host,nvme}.{capacity_bytes, used_bytes, slots, used_slots, evictions,
 *   configured_bytes, hits, misses, bytes_prefetched, bytes_on_demand, promote_count,
 *   promote_ns_sum}, blocks_moved.{hbm_to_host, host_to_nvme, nvme_to_host, host_to_hbm},
 *   bytes_moved.{...same...}, checksum.{verified, failed}, evictions, stalls, stall_ns,
 *   accesses, accesses_ready, hints,
 *   io_errors, blocks_lost, seqs_open, batches_open, transfers_in_flight, prefix_lookups,
 *   prefix_hit_blocks, prefix_hit_tokens, shared_blocks, meta_bytes, meta_token_bytes,
 *   idle_parked, engine_batches (the engine's stats.batches; run.batches is the runner's
 *   count), repromotions, codec.{blocks, raw_bytes, stored_bytes}.
 * kvtr_summary_write() prints the one-line summary of the run for stderr.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "runner.h"
#include "util.h"

static const char *const json_tier_names[KVT_TIER_COUNT] = { "hbm", "host", "nvme" };
static const char *const json_move_names[KVT_MOVE_COUNT] = {
	"hbm_to_host", "host_to_nvme", "nvme_to_host", "host_to_hbm",
};

static const char *
json_dtype_name(enum kvt_dtype t)
{
	switch (t) {
	case KVT_DTYPE_F32: return "f32";
	case KVT_DTYPE_F16: return "f16";
	case KVT_DTYPE_BF16: return "bf16";
	default: return "other";
	}
}

/* cJSON numbers are doubles: exact for counters below 2^53, which is plenty here. */
static int
json_num(cJSON *o, const char *k, double v)
{
	return cJSON_AddNumberToObject(o, k, v) ? 0 : -ENOMEM;
}

static int
json_run(cJSON *root, const struct kvtr_run_opts *o, const struct kvtr_run_result *r)
{
	cJSON *run = cJSON_AddObjectToObject(root, "run");
	int rc = 0;

	if (!run)
		return -ENOMEM;
	rc |= json_num(run, "sessions", r->sessions);
	rc |= json_num(run, "turns", r->turns);
	rc |= json_num(run, "steps_per_turn", o->steps);
	rc |= json_num(run, "temperature", o->temperature);
	rc |= json_num(run, "topp", o->topp);
	rc |= json_num(run, "seed", (double)o->seed);
	rc |= json_num(run, "tokens_per_block", o->tokens_per_block);
	rc |= cJSON_AddStringToObject(run, "kv_dtype", json_dtype_name(o->kv_dtype)) ? 0 : -ENOMEM;
	rc |= json_num(run, "positions", (double)r->positions);
	rc |= json_num(run, "tokens_generated", (double)r->tokens_generated);
	rc |= json_num(run, "steps", (double)r->steps);
	rc |= json_num(run, "batches", (double)r->batches);
	rc |= json_num(run, "group_splits", (double)r->group_splits);
	rc |= json_num(run, "windows", (double)r->windows);
	rc |= json_num(run, "windowed_positions", (double)r->windowed_positions);
	rc |= json_num(run, "lost_events", (double)r->lost_events);
	rc |= json_num(run, "reprefill_positions", (double)r->reprefill_positions);
	rc |= json_num(run, "slot_remaps", (double)r->slot_remaps);
	rc |= json_num(run, "parks", (double)r->parks);
	rc |= json_num(run, "park_nospc", (double)r->park_nospc);
	rc |= json_num(run, "preemptions", (double)r->preemptions);
	rc |= json_num(run, "kv_tokens", (double)r->kv_tokens);
	rc |= json_num(run, "kv_blocks", (double)r->kv_blocks);
	rc |= json_num(run, "prefix_tokens", (double)r->prefix_tokens);
	rc |= json_num(run, "elapsed_s", r->elapsed_s);
	rc |= json_num(run, "tok_per_s", r->tok_per_s);
	return rc ? -ENOMEM : 0;
}

static int
json_engine(cJSON *root, const struct kvtr_run_result *r)
{
	const struct kvt_stats *st = &r->stats;
	const uint64_t conf[KVT_TIER_COUNT] = { r->hbm_bytes, r->host_bytes, r->nvme_bytes };
	cJSON *geo = cJSON_AddObjectToObject(root, "geometry");
	cJSON *tiers = cJSON_AddObjectToObject(root, "tiers");
	cJSON *moved = cJSON_AddObjectToObject(root, "blocks_moved");
	cJSON *bytes = cJSON_AddObjectToObject(root, "bytes_moved");
	cJSON *ck = cJSON_AddObjectToObject(root, "checksum");
	cJSON *codec = cJSON_AddObjectToObject(root, "codec");
	int rc = 0;

	if (!geo || !tiers || !moved || !bytes || !ck || !codec)
		return -ENOMEM;
	rc |= json_num(geo, "block_bytes", (double)r->geo.block_bytes);
	rc |= json_num(geo, "hbm_slots", r->geo.hbm_slots);
	rc |= json_num(geo, "host_slots", r->geo.host_slots);
	rc |= json_num(geo, "nvme_slots", r->geo.nvme_slots);
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		cJSON *o = cJSON_AddObjectToObject(tiers, json_tier_names[t]);

		if (!o)
			return -ENOMEM;
		rc |= json_num(o, "capacity_bytes", (double)st->tier[t].capacity_bytes);
		rc |= json_num(o, "used_bytes", (double)st->tier[t].used_bytes);
		rc |= json_num(o, "slots", st->tier[t].slots);
		rc |= json_num(o, "used_slots", st->tier[t].used_slots);
		rc |= json_num(o, "evictions", (double)st->tier[t].evictions);
		rc |= json_num(o, "configured_bytes", (double)conf[t]);
		rc |= json_num(o, "hits", (double)st->tier[t].hits);
		rc |= json_num(o, "misses", (double)st->tier[t].misses);
		rc |= json_num(o, "bytes_prefetched", (double)st->tier[t].bytes_prefetched);
		rc |= json_num(o, "bytes_on_demand", (double)st->tier[t].bytes_on_demand);
		rc |= json_num(o, "promote_count", (double)st->tier[t].promote_count);
		rc |= json_num(o, "promote_ns_sum", (double)st->tier[t].promote_ns_sum);
	}
	for (int m = 0; m < KVT_MOVE_COUNT; m++) {
		rc |= json_num(moved, json_move_names[m], (double)st->blocks_moved[m]);
		rc |= json_num(bytes, json_move_names[m], (double)st->bytes_moved[m]);
	}
	rc |= json_num(ck, "verified", (double)st->checksum_verified);
	rc |= json_num(ck, "failed", (double)st->checksum_failed);
	rc |= json_num(root, "evictions", (double)st->evictions);
	rc |= json_num(root, "stalls", (double)st->stalls);
	rc |= json_num(root, "stall_ns", (double)st->stall_ns);
	rc |= json_num(root, "accesses", (double)st->accesses);
	rc |= json_num(root, "accesses_ready", (double)st->accesses_ready);
	rc |= json_num(root, "hints", (double)st->hints);
	rc |= json_num(root, "io_errors", (double)st->io_errors);
	rc |= json_num(root, "blocks_lost", (double)st->blocks_lost);
	rc |= json_num(root, "seqs_open", st->seqs_open);
	rc |= json_num(root, "batches_open", st->batches_open);
	rc |= json_num(root, "transfers_in_flight", (double)st->transfers_in_flight);
	rc |= json_num(root, "prefix_lookups", (double)st->prefix_lookups);
	rc |= json_num(root, "prefix_hit_blocks", (double)st->prefix_hit_blocks);
	rc |= json_num(root, "prefix_hit_tokens", (double)st->prefix_hit_tokens);
	rc |= json_num(root, "shared_blocks", (double)st->shared_blocks);
	rc |= json_num(root, "meta_bytes", (double)st->meta_bytes);
	rc |= json_num(root, "meta_token_bytes", (double)st->meta_token_bytes);
	rc |= json_num(root, "idle_parked", (double)st->idle_parked);
	rc |= json_num(root, "engine_batches", (double)st->batches);
	rc |= json_num(root, "repromotions", (double)st->repromotions);
	rc |= json_num(codec, "blocks", (double)st->codec_blocks);
	rc |= json_num(codec, "raw_bytes", (double)st->codec_raw_bytes);
	rc |= json_num(codec, "stored_bytes", (double)st->codec_stored_bytes);
	return rc ? -ENOMEM : 0;
}

/* @b bytes as "123 B", "4.0 KiB", "1.5 MiB", ... */
static void
summary_bytes(char *buf, size_t cap, uint64_t b)
{
	static const char *const unit[] = { "KiB", "MiB", "GiB", "TiB", "PiB" };
	double v = (double)b;
	int u = -1;

	if (b < 1024) {
		snprintf(buf, cap, "%llu B", (unsigned long long)b);
		return;
	}
	while (v >= 1024.0 && u < 4) {
		v /= 1024.0;
		u++;
	}
	snprintf(buf, cap, "%.1f %s", v, unit[u]);
}

int
kvtr_summary_write(FILE *f, const struct kvtr_run_result *r, int builtin)
{
	const struct kvt_stats *st = &r->stats;
	char b[32];
	int rc = 0;

	if (r->reference) {
		rc |= fputs("kvtier: reference run (contiguous KV cache, no kvtier)", f) < 0;
	} else {
		rc |= fputs("kvtier: tiers used", f) < 0;
		for (int t = 0; t < KVT_TIER_COUNT; t++) {
			summary_bytes(b, sizeof b, st->tier[t].used_bytes);
			rc |= fprintf(f, "%s %s %u/%u blocks (%s)", t ? "," : "",
				      json_tier_names[t], st->tier[t].used_slots,
				      st->tier[t].slots, b) < 0;
		}
		rc |= fputs("; blocks moved", f) < 0;
		for (int m = 0; m < KVT_MOVE_COUNT; m++)
			rc |= fprintf(f, "%s %s %llu", m ? "," : "", json_move_names[m],
				      (unsigned long long)st->blocks_moved[m]) < 0;
		rc |= fprintf(f, "; NVMe checksums verified %llu, failed %llu",
			      (unsigned long long)st->checksum_verified,
			      (unsigned long long)st->checksum_failed) < 0;
	}
	rc |= fputc('\n', f) == EOF;
	if (builtin)
		rc |= fputs("(built-in model: random weights, the text is meaningless; --model for "
			    "a real one)\n", f) < 0;
	return rc ? -EIO : 0;
}

int
kvtr_stats_json_write(FILE *f, const char *path, const struct kvtr_run_opts *o,
		      const struct kvtr_run_result *r)
{
	cJSON *root = cJSON_CreateObject();
	char *text = NULL;
	int rc = -ENOMEM;

	if (!root)
		return kvtr_err(-ENOMEM, "out of memory building the stats JSON");
	if (!cJSON_AddStringToObject(root, "mode", r->reference ? "reference" : "kvtier") ||
	    !cJSON_AddStringToObject(root, "model", o->model ? o->model->name : "") ||
	    json_run(root, o, r) || json_engine(root, r) || !(text = cJSON_Print(root))) {
		rc = kvtr_err(-ENOMEM, "out of memory building the stats JSON");
		goto out;
	}
	rc = fputs(text, f) < 0 || fputc('\n', f) == EOF || fflush(f) != 0 ? -EIO : 0;
	if (rc)
		kvtr_err(rc, "cannot write stats to %s: %s", path, strerror(errno));
out:
	free(text);
	cJSON_Delete(root);
	return rc;
}
