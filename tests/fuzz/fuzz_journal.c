/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_journal.c - libFuzzer target of the persistent store's journal replay
 * (store_apply, store_resolve through kvt_store_fuzz_one in tiers/store.c): any journal image
 * must replay without a crash and leave an index that keeps replay's promises (one session per
 * key, every slot in range, named once per session and by one write); a broken promise aborts.
 *
 *   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang && cmake --build build-fuzz -t fuzz_journal
 *   build-fuzz/fuzz_journal -max_total_time=60 tests/fuzz/corpus_journal
 *
 * The fuzzing build skips checksum compares (FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION) so that
 * mutations reach the record fields; the ctest replay (fuzz_journal_corpus) runs the committed
 * corpus with checksums on.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "tiers/store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (kvt_store_fuzz_one(data, size) < 0)
		abort();
	return 0;
}
