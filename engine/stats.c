/* SPDX-License-Identifier: MIT */
/*
 * engine/stats.c - recording of the prefetch and promotion counters of struct kvt_stats, in one
 * place so that every subsystem (batches, hints, the NVMe path) counts the same way.
 * All functions require e->lock.
 */
#include "engine_impl.h"

static const uint64_t stats_lat_bounds[KVT_LAT_BUCKETS] = KVT_LAT_BUCKET_BOUNDS_NS;

/* The latency bucket of @ns: the first bound >= ns, the last bucket past every bound. */
static uint32_t
stats_lat_bucket(uint64_t ns)
{
	uint32_t i = 0;

	while (i + 1 < KVT_LAT_BUCKETS && ns > stats_lat_bounds[i])
		i++;
	return i;
}

/**
 * kvt_stats_record_promote() - a promotion into @tier (KVT_TIER_HBM or KVT_TIER_HOST) completed
 * @ns nanoseconds after it was issued: promote_count, promote_ns_sum and the promote_lat bucket
 * (first bound >= ns) of that tier. Latency is issue to completion as the engine saw it (the
 * poll or wait that retired the copy), so it includes queueing behind earlier copies.
 */
void
kvt_stats_record_promote(struct kvt_engine *e, int tier, uint64_t ns)
{
	struct kvt_tier_stats *t = &e->st.tier[tier];

	t->promote_count++;
	t->promote_ns_sum += ns;
	t->promote_lat[stats_lat_bucket(ns)]++;
}

/**
 * kvt_stats_record_lat() - one event of @ns nanoseconds into histogram @h (count, ns_sum and
 * the bucket of the first bound >= ns): NVMe writes, parks, resumes.
 */
void
kvt_stats_record_lat(struct kvt_lat_hist *h, uint64_t ns)
{
	h->count++;
	h->ns_sum += ns;
	h->lat[stats_lat_bucket(ns)]++;
}

/**
 * kvt_stats_record_issue() - @bytes start moving up into @tier: counted as bytes_prefetched
 * while e->prefetching (a hint or a resume issues them ahead of need), else bytes_on_demand
 * (a batch or an append needs them now).
 */
void
kvt_stats_record_issue(struct kvt_engine *e, int tier, uint64_t bytes)
{
	if (e->prefetching)
		e->st.tier[tier].bytes_prefetched += bytes;
	else
		e->st.tier[tier].bytes_on_demand += bytes;
}
