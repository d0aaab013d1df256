/* SPDX-License-Identifier: MIT */
/*
 * engine/metrics.c - the engine's counters in the Prometheus text exposition format 0.0.4.
 *
 * Every metric is named kvtier_<what>[_<unit>][_total]: counters end in _total, units are base
 * units (bytes, seconds), per-tier series carry tier="hbm|host|nvme", copies carry
 * direction="hbm_to_host|host_to_nvme|nvme_to_host|host_to_hbm". Promotion latency is a
 * histogram per tier the block comes from (tier="host": host-to-HBM copies, tier="nvme": NVMe
 * reads); NVMe writes, parks and resumes have one each (cumulative le buckets in seconds from
 * KVT_LAT_BUCKET_BOUNDS_NS, +Inf, _sum, _count). kvtier_build_info{version,cuda} is 1.
 * The text is built with snprintf into the caller's buffer; its length is counted even when it
 * does not fit, so a too-small buffer is answered with the size needed.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "engine_impl.h"
#include "tiers/base/error.h"
#include "kvtier.h"

static const char *const metrics_tier_name[KVT_TIER_COUNT] = { "hbm", "host", "nvme" };
static const char *const metrics_move_name[KVT_MOVE_COUNT] = {
	"hbm_to_host", "host_to_nvme", "nvme_to_host", "host_to_hbm",
};

/* The output being built: text goes to buf while it fits; len counts all of it. */
struct metrics_out {
	char *buf;  /* caller's buffer, may be NULL when cap is 0 */
	size_t cap; /* its size in bytes */
	size_t len; /* bytes of text so far (written or not), without the NUL */
};

static void metrics_put(struct metrics_out *o, const char *fmt, ...) KVT_PRINTF(2, 3);

static void
metrics_put(struct metrics_out *o, const char *fmt, ...)
{
	char tmp[1];
	va_list ap;
	int n;

	va_start(ap, fmt);
	if (o->len < o->cap)
		n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
	else
		n = vsnprintf(tmp, 0, fmt, ap);
	va_end(ap);
	if (n > 0)
		o->len += (size_t)n;
}

/* "# HELP" and "# TYPE" lines of one family. */
static void
metrics_head(struct metrics_out *o, const char *name, const char *type, const char *help)
{
	metrics_put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One unlabelled sample. */
static void
metrics_one(struct metrics_out *o, const char *name, const char *type, const char *help,
	    uint64_t v)
{
	metrics_head(o, name, type, help);
	metrics_put(o, "%s %llu\n", name, (unsigned long long)v);
}

/* One family with a sample per tier; @field is the byte offset of a uint64_t (or uint32_t when
 * @is32) in struct kvt_tier_stats. */
static void
metrics_tiers(struct metrics_out *o, const struct kvt_stats *st, const char *name,
	      const char *type, const char *help, size_t field, int is32)
{
	metrics_head(o, name, type, help);
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		const char *p = (const char *)&st->tier[t] + field;
		uint64_t v;

		if (is32) {
			uint32_t v32;

			memcpy(&v32, p, sizeof v32);
			v = v32;
		} else {
			memcpy(&v, p, sizeof v);
		}
		metrics_put(o, "%s{tier=\"%s\"} %llu\n", name, metrics_tier_name[t],
			    (unsigned long long)v);
	}
}

#define METRICS_TIER64(o, st, name, type, help, f)                                                 \
	metrics_tiers(o, st, name, type, help, offsetof(struct kvt_tier_stats, f), 0)
#define METRICS_TIER32(o, st, name, type, help, f)                                                 \
	metrics_tiers(o, st, name, type, help, offsetof(struct kvt_tier_stats, f), 1)

/* Per-direction copy counters. */
static void
metrics_moves(struct metrics_out *o, const struct kvt_stats *st)
{
	metrics_head(o, "kvtier_blocks_moved_total", "counter",
		     "Block copies between tiers that completed, per direction.");
	for (int m = 0; m < KVT_MOVE_COUNT; m++)
		metrics_put(o, "kvtier_blocks_moved_total{direction=\"%s\"} %llu\n",
			    metrics_move_name[m], (unsigned long long)st->blocks_moved[m]);
	metrics_head(o, "kvtier_moved_bytes_total", "counter",
		     "Bytes of the block copies between tiers that completed, per direction.");
	for (int m = 0; m < KVT_MOVE_COUNT; m++)
		metrics_put(o, "kvtier_moved_bytes_total{direction=\"%s\"} %llu\n",
			    metrics_move_name[m], (unsigned long long)st->bytes_moved[m]);
}

/* The samples of one histogram series: @lat are the engine's (not cumulative) buckets,
 * @label is "" or a label pair such as tier="nvme" (the le label follows it). */
static void
metrics_hist(struct metrics_out *o, const char *name, const char *label, const uint64_t *lat,
	     uint64_t ns_sum, uint64_t count)
{
	static const uint64_t bounds[KVT_LAT_BUCKETS] = KVT_LAT_BUCKET_BOUNDS_NS;
	const char *sep = label[0] ? "," : "";
	uint64_t cum = 0;

	for (int b = 0; b < KVT_LAT_BUCKETS; b++) {
		cum += lat[b];
		if (bounds[b] == UINT64_MAX)
			metrics_put(o, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, label, sep,
				    (unsigned long long)cum);
		else
			metrics_put(o, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, label, sep,
				    (double)bounds[b] / 1e9, (unsigned long long)cum);
	}
	if (label[0]) {
		metrics_put(o, "%s_sum{%s} %.9f\n", name, label, (double)ns_sum / 1e9);
		metrics_put(o, "%s_count{%s} %llu\n", name, label, (unsigned long long)count);
	} else {
		metrics_put(o, "%s_sum %.9f\n", name, (double)ns_sum / 1e9);
		metrics_put(o, "%s_count %llu\n", name, (unsigned long long)count);
	}
}

/* One unlabelled histogram family from a struct kvt_lat_hist. */
static void
metrics_lat_hist(struct metrics_out *o, const char *name, const char *help,
		 const struct kvt_lat_hist *h)
{
	metrics_head(o, name, "histogram", help);
	metrics_hist(o, name, "", h->lat, h->ns_sum, h->count);
}

/*
 * Promotion latency histograms, labelled by the tier the block comes FROM: tier="host" are the
 * host-to-HBM copies (kvt_tier_stats of HBM), tier="nvme" the NVMe reads into host memory
 * (kvt_tier_stats of HOST). Nothing is promoted from HBM, so there is no tier="hbm" series.
 */
static void
metrics_histograms(struct metrics_out *o, const struct kvt_stats *st)
{
	static const int from[] = { KVT_TIER_HOST, KVT_TIER_NVME };
	const char *name = "kvtier_promotion_duration_seconds";

	metrics_head(o, name, "histogram",
		     "Latency of promotions out of the tier (host: host-to-HBM copies, nvme: "
		     "NVMe reads), from issue to completion.");
	for (size_t i = 0; i < sizeof from / sizeof from[0]; i++) {
		const struct kvt_tier_stats *ts = &st->tier[from[i] - 1]; /* counted at the dst */
		char label[32];

		snprintf(label, sizeof label, "tier=\"%s\"", metrics_tier_name[from[i]]);
		metrics_hist(o, name, label, ts->promote_lat, ts->promote_ns_sum,
			     ts->promote_count);
	}
	metrics_lat_hist(o, "kvtier_nvme_write_duration_seconds",
			 "Latency of block writes to NVMe, from issue to completion.",
			 &st->nvme_write);
	metrics_lat_hist(o, "kvtier_park_duration_seconds",
			 "Time spent in a park (kvt_seq_park or the idle timeout) issuing the "
			 "sequence's demotions; the copies land later.", &st->park);
	metrics_lat_hist(o, "kvtier_resume_duration_seconds",
			 "Time spent in kvt_seq_resume issuing the sequence's promotions; the next "
			 "prepare waits for those not landed.", &st->resume);
}

/* kvtier_build_info: the formatting library's version and whether it has the CUDA backend. */
static void
metrics_build_info(struct metrics_out *o)
{
#if defined(KVT_CUDA_EMU)
	const char *cuda = "emulated";
#elif defined(KVT_WITH_CUDA)
	const char *cuda = "yes";
#else
	const char *cuda = "no";
#endif

	metrics_head(o, "kvtier_build_info", "gauge",
		     "Always 1; the labels say which kvtier build produced the text (version: "
		     "kvt_version(), cuda: yes, no or emulated).");
	metrics_put(o, "kvtier_build_info{version=\"%s\",cuda=\"%s\"} 1\n", kvt_version(), cuda);
}

static void
metrics_tier_families(struct metrics_out *o, const struct kvt_stats *st)
{
	METRICS_TIER64(o, st, "kvtier_tier_capacity_bytes", "gauge",
		       "Capacity of the tier (slots x slot size).", capacity_bytes);
	METRICS_TIER64(o, st, "kvtier_tier_used_bytes", "gauge",
		       "Bytes of the tier's slots in use.", used_bytes);
	METRICS_TIER32(o, st, "kvtier_tier_slots", "gauge", "Block slots in the tier.", slots);
	METRICS_TIER32(o, st, "kvtier_tier_used_slots", "gauge",
		       "Block slots in use (holding data or being written).", used_slots);
	METRICS_TIER64(o, st, "kvtier_tier_evictions_total", "counter",
		       "Block copies dropped from the tier to make room.", evictions);
	METRICS_TIER64(o, st, "kvtier_tier_hits_total", "counter",
		       "Block accesses by batches that found the block in the tier, ready.", hits);
	METRICS_TIER64(o, st, "kvtier_tier_misses_total", "counter",
		       "Block accesses that had to wait for a promotion into the tier.", misses);
	METRICS_TIER64(o, st, "kvtier_tier_prefetched_bytes_total", "counter",
		       "Bytes promoted into the tier ahead of need.", bytes_prefetched);
	METRICS_TIER64(o, st, "kvtier_tier_on_demand_bytes_total", "counter",
		       "Bytes promoted into the tier because a batch needed them now.",
		       bytes_on_demand);
	METRICS_TIER64(o, st, "kvtier_tier_prefix_hit_blocks_total", "counter",
		       "Sealed blocks found in the tier through the prefix index.",
		       prefix_hit_blocks);
}

/* The whole text of @st. */
static void
metrics_write(struct metrics_out *o, const struct kvt_stats *st)
{
	double cov = st->accesses ? (double)st->accesses_ready / (double)st->accesses : 0.0;

	metrics_build_info(o);
	metrics_tier_families(o, st);
	metrics_histograms(o, st);
	metrics_moves(o, st);
	metrics_one(o, "kvtier_block_accesses_total", "counter",
		    "Block accesses by prepared batches.", st->accesses);
	metrics_one(o, "kvtier_block_accesses_ready_total", "counter",
		    "Block accesses that found the block already ready in HBM.",
		    st->accesses_ready);
	metrics_head(o, "kvtier_prefetch_coverage_ratio", "gauge",
		     "Fraction of block accesses that found the block ready in HBM "
		     "(0 before any).");
	metrics_put(o, "kvtier_prefetch_coverage_ratio %.6f\n", cov);
	metrics_one(o, "kvtier_stalls_total", "counter",
		    "Waits that found copies unfinished.", st->stalls);
	metrics_head(o, "kvtier_stall_seconds_total", "counter", "Time spent in those waits.");
	metrics_put(o, "kvtier_stall_seconds_total %.9f\n", (double)st->stall_ns / 1e9);
	metrics_one(o, "kvtier_checksum_verified_total", "counter",
		    "NVMe reads whose checksum matched.", st->checksum_verified);
	metrics_one(o, "kvtier_checksum_failures_total", "counter",
		    "NVMe reads whose checksum did not match.", st->checksum_failed);
	metrics_one(o, "kvtier_io_errors_total", "counter", "NVMe reads and writes that failed.",
		    st->io_errors);
	metrics_one(o, "kvtier_blocks_lost_total", "counter",
		    "Blocks dropped as unrecoverable.", st->blocks_lost);
	metrics_one(o, "kvtier_hints_total", "counter", "Schedule hints received.", st->hints);
	metrics_one(o, "kvtier_prefix_lookup_blocks_total", "counter",
		    "Sealed blocks looked up in the prefix index.", st->prefix_lookups);
	metrics_one(o, "kvtier_prefix_hit_blocks_total", "counter",
		    "Sealed blocks found in the prefix index and shared.", st->prefix_hit_blocks);
	metrics_one(o, "kvtier_prefix_hit_tokens_total", "counter",
		    "Tokens covered by prefix hits (prefill saved).", st->prefix_hit_tokens);
	metrics_one(o, "kvtier_codec_blocks_total", "counter",
		    "NVMe blocks stored compressed.", st->codec_blocks);
	metrics_one(o, "kvtier_codec_raw_bytes_total", "counter",
		    "Bytes before compression of blocks written to NVMe.", st->codec_raw_bytes);
	metrics_one(o, "kvtier_codec_stored_bytes_total", "counter",
		    "Bytes after compression of blocks written to NVMe.", st->codec_stored_bytes);
	metrics_one(o, "kvtier_shared_blocks", "gauge",
		    "Blocks referenced by more than one sequence.", st->shared_blocks);
	metrics_one(o, "kvtier_sequences_open", "gauge", "Open sequences.", st->seqs_open);
	metrics_one(o, "kvtier_batches_open", "gauge", "Unreleased batches.", st->batches_open);
	metrics_one(o, "kvtier_transfers_in_flight", "gauge",
		    "Copies and IOs not yet completed.", st->transfers_in_flight);
	metrics_one(o, "kvtier_metadata_bytes", "gauge",
		    "Host memory used by kvtier's own metadata (without token ids).",
		    st->meta_bytes);
	metrics_one(o, "kvtier_token_bytes", "gauge",
		    "Host memory holding token ids (4 bytes per token, kept once).",
		    st->meta_token_bytes);
	metrics_one(o, "kvtier_idle_parked_total", "counter",
		    "Sequences parked by the idle timeout.", st->idle_parked);
	metrics_one(o, "kvtier_batches_total", "counter",
		    "Batches prepared (kvt_batch_prepare* calls that succeeded).", st->batches);
	metrics_one(o, "kvtier_repromotions_total", "counter",
		    "Host-to-HBM promotions of a block already promoted since a batch last used "
		    "it (wasted copy bandwidth).", st->repromotions);
	metrics_one(o, "kvtier_remote_publishes_total", "counter",
		    "Sessions published to the REMOTE tier.", st->remote_publishes);
	metrics_one(o, "kvtier_remote_publish_failures_total", "counter",
		    "Publishes to the REMOTE tier that failed (not published).",
		    st->remote_publish_failed);
	metrics_one(o, "kvtier_remote_blocks_put_total", "counter",
		    "Block values sent to the REMOTE tier.", st->remote_blocks_put);
	metrics_one(o, "kvtier_remote_restores_total", "counter",
		    "Sessions reopened from the REMOTE tier.", st->remote_restores);
	metrics_one(o, "kvtier_remote_restore_misses_total", "counter",
		    "Restores from the REMOTE tier that found the session absent or bad.",
		    st->remote_restore_misses);
	metrics_one(o, "kvtier_remote_sent_bytes_total", "counter",
		    "Bytes the REMOTE client wrote.", st->remote_bytes_out);
	metrics_one(o, "kvtier_remote_received_bytes_total", "counter",
		    "Bytes of replies the REMOTE client received.", st->remote_bytes_in);
	metrics_one(o, "kvtier_remote_errors_total", "counter",
		    "REMOTE connection failures (timeouts included).", st->remote_errors);
	metrics_one(o, "kvtier_remote_breaker_trips_total", "counter",
		    "Times a REMOTE server's circuit breaker opened.", st->remote_breaker_trips);
	metrics_one(o, "kvtier_remote_breaker_open", "gauge",
		    "1 while a REMOTE server's circuit breaker is open.", st->remote_breaker_open);
	metrics_one(o, "kvtier_remote_round_trips_total", "counter",
		    "Pipelined rounds of the REMOTE client.", st->remote_round_trips);
	metrics_one(o, "kvtier_remote_write_through_queued_total", "counter",
		    "Sealed prefix blocks queued for write-through to REMOTE.",
		    st->remote_wt_queued);
	metrics_one(o, "kvtier_remote_write_through_stored_total", "counter",
		    "Write-through blocks stored in REMOTE (or already there).",
		    st->remote_wt_stored);
	metrics_one(o, "kvtier_remote_write_through_failed_total", "counter",
		    "Write-through blocks whose put failed.", st->remote_wt_failed);
	metrics_one(o, "kvtier_remote_lookups_total", "counter",
		    "Remote prefix lookups sent (one pipelined get each).", st->remote_lookups);
	metrics_one(o, "kvtier_remote_lookup_blocks_total", "counter",
		    "Blocks asked for by remote prefix lookups.", st->remote_lookup_blocks);
	metrics_one(o, "kvtier_remote_hit_blocks_total", "counter",
		    "Blocks verified and landed in HOST from REMOTE.", st->remote_hit_blocks);
	metrics_one(o, "kvtier_remote_miss_blocks_total", "counter",
		    "Blocks asked for from REMOTE that did not land (absent, bad, error).",
		    st->remote_miss_blocks);
	metrics_one(o, "kvtier_remote_bad_values_total", "counter",
		    "REMOTE values that failed verification (never served).",
		    st->remote_bad_values);
	metrics_one(o, "kvtier_remote_late_blocks_total", "counter",
		    "Attaches that stopped at a block still in flight from REMOTE.",
		    st->remote_late_blocks);
	{
		static const char *const wn[2] = { "nvme", "remote" };
		static const char *const names[4] = {
			"kvtier_write_budget_admitted_bytes_total",
			"kvtier_write_budget_refused_bytes_total",
			"kvtier_write_budget_refused_total", "kvtier_write_budget_hits_lost_total"
		};
		static const char *const helps[4] = {
			"Bytes the write budget admitted to a lower tier.",
			"Bytes the write budget refused (writes saved).",
			"Writes the write budget refused.",
			"Lookups that missed a block whose write the budget refused."
		};
		const uint64_t *v[4] = { st->wb_admitted_bytes, st->wb_refused_bytes,
					 st->wb_refused, st->wb_hits_lost };

		for (int m = 0; m < 4; m++) {
			metrics_head(o, names[m], "counter", helps[m]);
			for (int w = 0; w < 2; w++)
				metrics_put(o, "%s{target=\"%s\"} %llu\n", names[m], wn[w],
					    (unsigned long long)v[m][w]);
		}
	}
}

int
kvt_stats_metrics_text(const struct kvt_stats *st, char *buf, size_t cap, size_t *len)
{
	struct metrics_out o = { .buf = buf, .cap = cap, .len = 0 };
	struct kvt_stats s;

	if (!st || !len)
		return kvt_err(-EINVAL, "kvt_stats_metrics_text: stats and len must not be NULL");
	if (!buf && cap)
		return kvt_err(-EINVAL, "kvt_stats_metrics_text: buf is NULL with cap %zu", cap);
	if (st->size < offsetof(struct kvt_stats, evictions) || st->size > 65536)
		return kvt_err(-EINVAL, "kvt_stats.size %zu: set it to sizeof(struct kvt_stats)",
			       st->size);
	/* a caller compiled against an older header has fewer fields: the rest read as 0 */
	memset(&s, 0, sizeof s);
	memcpy(&s, st, st->size < sizeof s ? st->size : sizeof s);
	metrics_write(&o, &s);
	if (o.len >= cap) {
		*len = o.len + 1;
		if (cap)
			buf[0] = '\0';
		return kvt_err(-ENOSPC, "metrics text needs %zu bytes, the buffer has %zu",
			       o.len + 1, cap);
	}
	*len = o.len;
	return 0;
}

int
kvt_engine_metrics_text(struct kvt_engine *e, char *buf, size_t cap, size_t *len)
{
	struct kvt_stats st;
	int rc;

	if (!e)
		return kvt_err(-EINVAL, "kvt_engine_metrics_text: engine must not be NULL");
	if (e->grp) /* a grouped engine: the totals, then per-group series (engine/group.c) */
		return kvt_grp_metrics_text(e, buf, cap, len);
	memset(&st, 0, sizeof st);
	st.size = sizeof st;
	rc = kvt_engine_stats(e, &st);
	if (rc)
		return rc;
	return kvt_stats_metrics_text(&st, buf, cap, len);
}
