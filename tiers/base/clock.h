/* SPDX-License-Identifier: MIT */
/*
 * tiers/base/clock.h - the library's one clock (internal): CLOCK_MONOTONIC in nanoseconds, for
 * deadlines, latencies, retention times and the emulated device's link. Not installed.
 */
#ifndef KVT_BASE_CLOCK_H
#define KVT_BASE_CLOCK_H

#include <stdint.h>
#include <time.h>

/** CLOCK_MONOTONIC now, in ns since an arbitrary start. Thread-safe; never fails on Linux. */
static inline uint64_t
kvt_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif /* KVT_BASE_CLOCK_H */
