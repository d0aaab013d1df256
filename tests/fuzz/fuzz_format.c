/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_format.c - libFuzzer target of the NVMe store's on-disk format parsers
 * (superblock, block header, journal header and records: kvt_fmt_fuzz_one in tiers/format.c).
 *
 *   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang && cmake --build build-fuzz -t fuzz_format
 *   build-fuzz/fuzz_format -max_total_time=60 tests/fuzz/corpus
 *
 * The same entry point replays the committed corpus in ctest (replay_main.c).
 */
#include <stddef.h>
#include <stdint.h>

#include "tiers/format.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	(void)kvt_fmt_fuzz_one(data, size);
	return 0;
}
