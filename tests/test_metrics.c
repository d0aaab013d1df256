/* SPDX-License-Identifier: MIT */
/*
 * tests/test_metrics.c - kvt_engine_metrics_text / kvt_stats_metrics_text: bad arguments,
 * -ENOSPC sizing, values that match kvt_engine_stats after real traffic, cumulative histogram
 * buckets in seconds, and a line-by-line check of the exposition format's shape (every sample
 * belongs to a family declared by # TYPE, counters end in _total). The python test
 * (python/tests/test_metrics.py) parses the same text with prometheus_client.
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

#include "support/kvt_test.h"

/* The engine's text in a malloc'd buffer (asserts success). */
static char *
metrics_get(struct kvt_engine *e, size_t *len)
{
	size_t need = 0;
	char *buf;

	assert_int_equal(kvt_engine_metrics_text(e, NULL, 0, &need), -ENOSPC);
	assert_true(need > 100);
	buf = malloc(need + 4096);
	assert_non_null(buf);
	assert_int_equal(kvt_engine_metrics_text(e, buf, need + 4096, len), 0);
	assert_int_equal(strlen(buf), *len);
	return buf;
}

/* The value of the sample line that starts with exactly @series followed by a space. */
static double
metrics_value(const char *text, const char *series)
{
	size_t n = strlen(series);

	for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
		if (strncmp(p, series, n) == 0 && p[n] == ' ')
			return strtod(p + n + 1, NULL);
	fail_msg("series %s not found", series);
	return -1;
}

static void
test_bad_args(void **state)
{
	struct kvt_stats st;
	size_t len = 7;
	char buf[8];

	(void)state;
	memset(&st, 0, sizeof st);
	st.size = sizeof st;
	assert_int_equal(kvt_engine_metrics_text(NULL, buf, sizeof buf, &len), -EINVAL);
	assert_int_equal(kvt_stats_metrics_text(NULL, buf, sizeof buf, &len), -EINVAL);
	assert_int_equal(kvt_stats_metrics_text(&st, buf, sizeof buf, NULL), -EINVAL);
	assert_int_equal(kvt_stats_metrics_text(&st, NULL, 16, &len), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "buf is NULL"));
	st.size = 3;
	assert_int_equal(kvt_stats_metrics_text(&st, buf, sizeof buf, &len), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "kvt_stats.size 3"));
	assert_int_equal(len, 7); /* untouched on -EINVAL */
}

/* Too small: -ENOSPC, the size needed, "" in the buffer; exactly that size works; one less not */
static void
test_enospc_sizing(void **state)
{
	struct kvt_stats st;
	size_t need = 0, len = 0;
	char *buf;

	(void)state;
	memset(&st, 0, sizeof st);
	st.size = sizeof st;
	assert_int_equal(kvt_stats_metrics_text(&st, NULL, 0, &need), -ENOSPC);
	assert_non_null(strstr(kvt_last_error_message(), "needs"));
	buf = malloc(need);
	assert_non_null(buf);
	memset(buf, 'x', need);
	assert_int_equal(kvt_stats_metrics_text(&st, buf, need - 1, &len), -ENOSPC);
	assert_int_equal(len, need);
	assert_int_equal(buf[0], '\0');
	assert_int_equal(kvt_stats_metrics_text(&st, buf, need, &len), 0);
	assert_int_equal(len, need - 1);
	assert_int_equal(strlen(buf), need - 1);
	assert_int_equal(buf[len - 1], '\n');
	free(buf);
}

/* Synthetic counters: cumulative buckets in seconds, sums in seconds, directions, ratio. */
static void
test_stats_content(void **state)
{
	struct kvt_stats st;
	size_t len, cap;
	char *buf, info[96];

	(void)state;
	memset(&st, 0, sizeof st);
	st.size = sizeof st;
	st.tier[KVT_TIER_HOST].promote_lat[0] = 2;  /* <= 10us */
	st.tier[KVT_TIER_HOST].promote_lat[4] = 3;  /* <= 1ms */
	st.tier[KVT_TIER_HOST].promote_lat[10] = 1; /* above 500ms */
	st.tier[KVT_TIER_HOST].promote_count = 6;
	st.tier[KVT_TIER_HOST].promote_ns_sum = 1500000000ull;
	st.tier[KVT_TIER_HBM].promote_lat[1] = 4; /* <= 50us */
	st.tier[KVT_TIER_HBM].promote_count = 4;
	st.nvme_write.lat[5] = 5;                 /* <= 5ms */
	st.nvme_write.count = 5;
	st.nvme_write.ns_sum = 10000000;
	st.park.lat[0] = 1;
	st.park.count = 1;
	st.resume.lat[10] = 3;
	st.resume.count = 3;
	st.idle_parked = 13;
	st.batches = 14;
	st.repromotions = 15;
	st.tier[KVT_TIER_NVME].capacity_bytes = 1ull << 40;
	st.blocks_moved[KVT_MOVE_NVME_TO_HOST] = 42;
	st.bytes_moved[KVT_MOVE_HOST_TO_HBM] = 12345;
	st.stall_ns = 250000000;
	st.accesses = 4;
	st.accesses_ready = 3;
	st.checksum_failed = 9;
	st.io_errors = 11;
	assert_int_equal(kvt_stats_metrics_text(&st, NULL, 0, &cap), -ENOSPC);
	buf = malloc(cap);
	assert_non_null(buf);
	assert_int_equal(kvt_stats_metrics_text(&st, buf, cap, &len), 0);
	assert_true(metrics_value(buf, "kvtier_promotion_duration_seconds_bucket"
				  "{tier=\"nvme\",le=\"1e-05\"}") == 2);
	assert_true(metrics_value(buf, "kvtier_promotion_duration_seconds_bucket"
				  "{tier=\"nvme\",le=\"0.0005\"}") == 2);
	assert_true(metrics_value(buf, "kvtier_promotion_duration_seconds_bucket"
				  "{tier=\"nvme\",le=\"0.001\"}") == 5);
	assert_true(metrics_value(buf, "kvtier_promotion_duration_seconds_bucket"
				  "{tier=\"nvme\",le=\"0.5\"}") == 5);
	assert_true(metrics_value(buf, "kvtier_promotion_duration_seconds_bucket"
				  "{tier=\"nvme\",le=\"+Inf\"}") == 6);
	assert_true(metrics_value(buf, "kvtier_promotion_duration_seconds_count"
				  "{tier=\"nvme\"}") == 6);
	assert_true(metrics_value(buf, "kvtier_promotion_duration_seconds_sum"
				  "{tier=\"nvme\"}") == 1.5);
	/* NVMe reads (counted in the HOST tier's stats) are promotions from tier="nvme", the
	 * host-to-HBM copies promotions from tier="host"; nothing is promoted from HBM */
	assert_true(metrics_value(buf, "kvtier_promotion_duration_seconds_count"
				  "{tier=\"host\"}") == 4);
	assert_true(metrics_value(buf, "kvtier_promotion_duration_seconds_bucket"
				  "{tier=\"host\",le=\"5e-05\"}") == 4);
	assert_null(strstr(buf, "kvtier_promotion_duration_seconds_bucket{tier=\"hbm\""));
	assert_null(strstr(buf, "kvtier_promotion_duration_seconds_count{tier=\"hbm\""));
	/* NVMe writes, parks, resumes: unlabelled histograms */
	assert_true(metrics_value(buf, "kvtier_nvme_write_duration_seconds_bucket"
				  "{le=\"0.001\"}") == 0);
	assert_true(metrics_value(buf, "kvtier_nvme_write_duration_seconds_bucket"
				  "{le=\"0.005\"}") == 5);
	assert_true(metrics_value(buf, "kvtier_nvme_write_duration_seconds_bucket"
				  "{le=\"+Inf\"}") == 5);
	assert_true(metrics_value(buf, "kvtier_nvme_write_duration_seconds_count") == 5);
	assert_true(metrics_value(buf, "kvtier_nvme_write_duration_seconds_sum") == 0.01);
	assert_true(metrics_value(buf, "kvtier_park_duration_seconds_bucket{le=\"1e-05\"}") ==
		    1);
	assert_true(metrics_value(buf, "kvtier_park_duration_seconds_count") == 1);
	assert_true(metrics_value(buf, "kvtier_resume_duration_seconds_bucket{le=\"+Inf\"}") ==
		    3);
	assert_true(metrics_value(buf, "kvtier_resume_duration_seconds_bucket{le=\"0.5\"}") ==
		    0);
	assert_true(metrics_value(buf, "kvtier_resume_duration_seconds_count") == 3);
	assert_true(metrics_value(buf, "kvtier_idle_parked_total") == 13);
	assert_true(metrics_value(buf, "kvtier_batches_total") == 14);
	assert_true(metrics_value(buf, "kvtier_repromotions_total") == 15);
	snprintf(info, sizeof info, "kvtier_build_info{version=\"%s\",cuda=\"", kvt_version());
	assert_non_null(strstr(buf, info));
	assert_true(metrics_value(buf, "kvtier_tier_capacity_bytes{tier=\"nvme\"}") ==
		    (double)(1ull << 40));
	assert_true(metrics_value(buf, "kvtier_blocks_moved_total"
				  "{direction=\"nvme_to_host\"}") == 42);
	assert_true(metrics_value(buf, "kvtier_moved_bytes_total"
				  "{direction=\"host_to_hbm\"}") == 12345);
	assert_true(metrics_value(buf, "kvtier_stall_seconds_total") == 0.25);
	assert_true(metrics_value(buf, "kvtier_prefetch_coverage_ratio") == 0.75);
	assert_true(metrics_value(buf, "kvtier_checksum_failures_total") == 9);
	assert_true(metrics_value(buf, "kvtier_io_errors_total") == 11);
	/* an older, shorter struct: the fields it lacks read as 0 */
	st.size = offsetof(struct kvt_stats, accesses);
	assert_int_equal(kvt_stats_metrics_text(&st, buf, cap, &len), 0);
	assert_true(metrics_value(buf, "kvtier_prefetch_coverage_ratio") == 0);
	assert_true(metrics_value(buf, "kvtier_io_errors_total") == 11);
	free(buf);
}

/* Every line is a comment (# HELP/# TYPE name ...) or "series value"; every sample's name is
 * its family's name (plus _bucket/_sum/_count for histograms); counters end in _total and
 * every family is declared once. */
static void
test_format_shape(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 8, .host_blocks = 8 };
	char *dir = NULL;
	struct kvt_engine *e = tsup_engine(&c, &dir);
	char family[128] = "", type[16] = "", *buf, *line, *save = NULL;
	size_t len;
	int families = 0, samples = 0;

	(void)state;
	buf = metrics_get(e, &len);
	for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char name[128], rest[128];

		if (strncmp(line, "# HELP ", 7) == 0)
			continue;
		if (sscanf(line, "# TYPE %127s %15s", family, type) == 2) {
			families++;
			assert_true(strncmp(family, "kvtier_", 7) == 0);
			if (strcmp(type, "counter") == 0)
				assert_non_null(strstr(family, "_total"));
			else
				assert_true(strcmp(type, "gauge") == 0 ||
					    strcmp(type, "histogram") == 0);
			continue;
		}
		assert_int_equal(sscanf(line, "%127[^{ ] %127s", name, rest), 2);
		samples++;
		if (strcmp(type, "histogram") == 0) {
			size_t fl = strlen(family);

			assert_true(strncmp(name, family, fl) == 0);
			assert_true(strcmp(name + fl, "_bucket") == 0 ||
				    strcmp(name + fl, "_sum") == 0 ||
				    strcmp(name + fl, "_count") == 0);
		} else {
			assert_string_equal(name, family);
		}
	}
	assert_true(families >= 30);
	assert_true(samples > families);
	free(buf);
	kvt_engine_destroy(e);
}

/* Real traffic: the text says what kvt_engine_stats says. */
static void
test_engine_values(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 8, .host_blocks = 16, .no_watermarks = true };
	char *dir = NULL;
	struct kvt_engine *e = tsup_engine(&c, &dir);
	struct kvt_stats st;
	kvt_seq_id s;
	char series[96], *buf;
	size_t len;

	(void)state;
	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	assert_int_equal(tsup_append_write(e, s, 3, 0, 4 * TSUP_TPB), 0);
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(tsup_verify(e, s, 3), 0);
	memset(&st, 0, sizeof st);
	st.size = sizeof st;
	assert_int_equal(kvt_engine_stats(e, &st), 0);
	assert_true(st.blocks_moved[KVT_MOVE_HBM_TO_HOST] >= 4);
	buf = metrics_get(e, &len);
	assert_true(metrics_value(buf, "kvtier_blocks_moved_total{direction=\"hbm_to_host\"}") ==
		    (double)st.blocks_moved[KVT_MOVE_HBM_TO_HOST]);
	assert_true(metrics_value(buf, "kvtier_moved_bytes_total{direction=\"host_to_hbm\"}") ==
		    (double)st.bytes_moved[KVT_MOVE_HOST_TO_HBM]);
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		static const char *const names[] = { "hbm", "host", "nvme" };

		snprintf(series, sizeof series, "kvtier_tier_capacity_bytes{tier=\"%s\"}",
			 names[t]);
		assert_true(metrics_value(buf, series) == (double)st.tier[t].capacity_bytes);
		snprintf(series, sizeof series, "kvtier_tier_used_bytes{tier=\"%s\"}", names[t]);
		assert_true(metrics_value(buf, series) == (double)st.tier[t].used_bytes);
	}
	assert_true(metrics_value(buf, "kvtier_tier_capacity_bytes{tier=\"hbm\"}") ==
		    8.0 * (double)tsup_block_bytes());
	assert_true(metrics_value(buf, "kvtier_sequences_open") == 1);
	assert_true(metrics_value(buf, "kvtier_batches_open") == 0);
	free(buf);
	assert_int_equal(kvt_seq_close(e, s), 0);
	kvt_engine_destroy(e);
}

/* Real NVMe traffic: the NVMe reads are the tier="nvme" promotions, the host-to-HBM copies the
 * tier="host" ones; each NVMe write, park and resume is counted in its histogram. */
static void
test_engine_nvme_series(void **state)
{
	struct tsup_cfg c = { .hbm_blocks = 8, .host_blocks = 4, .nvme_blocks = 32,
			      .no_watermarks = true };
	char *dir = NULL;
	struct kvt_engine *e = tsup_engine(&c, &dir);
	struct kvt_stats st;
	kvt_seq_id s;
	char *buf;
	size_t len;

	(void)state;
	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	assert_int_equal(tsup_append_write(e, s, 5, 0, 3 * TSUP_TPB), 0);
	assert_int_equal(kvt_seq_park(e, s, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_resume(e, s), 0);
	assert_int_equal(tsup_verify(e, s, 5), 0); /* a prepare: everything back in HBM */
	assert_int_equal(kvt_engine_drain(e), 0);
	memset(&st, 0, sizeof st);
	st.size = sizeof st;
	assert_int_equal(kvt_engine_stats(e, &st), 0);
	assert_int_equal(st.blocks_moved[KVT_MOVE_NVME_TO_HOST], 3);
	assert_true(st.blocks_moved[KVT_MOVE_HOST_TO_NVME] >= 3);
	assert_int_equal(st.nvme_write.count, st.blocks_moved[KVT_MOVE_HOST_TO_NVME]);
	assert_int_equal(st.park.count, 1);
	assert_int_equal(st.resume.count, 1);
	buf = metrics_get(e, &len);
	assert_true(metrics_value(buf, "kvtier_promotion_duration_seconds_count"
				  "{tier=\"nvme\"}") == 3);
	assert_true(metrics_value(buf, "kvtier_promotion_duration_seconds_bucket"
				  "{tier=\"nvme\",le=\"+Inf\"}") == 3);
	assert_true(metrics_value(buf, "kvtier_promotion_duration_seconds_count"
				  "{tier=\"host\"}") ==
		    (double)st.blocks_moved[KVT_MOVE_HOST_TO_HBM]);
	assert_true(metrics_value(buf, "kvtier_nvme_write_duration_seconds_count") ==
		    (double)st.blocks_moved[KVT_MOVE_HOST_TO_NVME]);
	assert_true(metrics_value(buf, "kvtier_park_duration_seconds_count") == 1);
	assert_true(metrics_value(buf, "kvtier_resume_duration_seconds_count") == 1);
	assert_true(metrics_value(buf, "kvtier_batches_total") == (double)st.batches);
	assert_true(st.batches >= 1);
	free(buf);
	assert_int_equal(kvt_seq_close(e, s), 0);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bad_args),
		cmocka_unit_test(test_enospc_sizing),
		cmocka_unit_test(test_stats_content),
		cmocka_unit_test(test_format_shape),
		cmocka_unit_test(test_engine_values),
		cmocka_unit_test(test_engine_nvme_series),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
