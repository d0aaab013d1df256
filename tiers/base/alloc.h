/* SPDX-License-Identifier: MIT */
/*
 * tiers/base/alloc.h - kvtier's own host allocations (block metadata, sequences, batches).
 *
 * With KVT_WITH_JEMALLOC (CMake KVT_WITH_JEMALLOC_LIB=ON) they come from a dedicated jemalloc
 * arena through its explicit API (mallocx/rallocx/dallocx with MALLOCX_ARENA), so kvtier's
 * metadata is accounted on its own and the host process's malloc is never replaced; otherwise
 * from libc. Thread-safe.
 */
#ifndef KVT_BASE_ALLOC_H
#define KVT_BASE_ALLOC_H

#include <stddef.h>

/*
 * Fault injection for tests (SQLite's faultsim): when kvt_test_alloc_countdown is set to n > 0,
 * the n-th following allocation fails (returns NULL), and so do all later ones while
 * kvt_test_alloc_persist is set. 0 = off (the default).
 */
extern _Atomic int kvt_test_alloc_countdown;
extern _Atomic int kvt_test_alloc_persist;
extern _Atomic int kvt_test_alloc_failed; /* allocations failed by injection so far */

void *kvt_malloc(size_t n);
void *kvt_calloc(size_t n, size_t size);
void *kvt_realloc(void *p, size_t n);
void kvt_free(void *p);

#endif /* KVT_BASE_ALLOC_H */
