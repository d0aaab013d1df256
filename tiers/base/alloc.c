/* SPDX-License-Identifier: MIT */
/* tiers/base/alloc.c - see alloc.h. */
#include <stdlib.h>
#include <string.h>

#include "tiers/base/alloc.h"

_Atomic int kvt_test_alloc_countdown;
_Atomic int kvt_test_alloc_persist;
_Atomic int kvt_test_alloc_failed;

/* true when this allocation must fail (test fault injection) */
static inline int
alloc_fault(void)
{
	int c = kvt_test_alloc_countdown;

	if (c <= 0)
		return 0;
	if (c == 1) {
		kvt_test_alloc_failed++;
		if (!kvt_test_alloc_persist)
			kvt_test_alloc_countdown = 0;
		return 1;
	}
	kvt_test_alloc_countdown = c - 1;
	return 0;
}

#ifdef KVT_WITH_JEMALLOC
#include <jemalloc/jemalloc.h>
#include <pthread.h>

static unsigned alloc_arena;
static int alloc_flags;
static pthread_once_t alloc_once = PTHREAD_ONCE_INIT;

static void
alloc_init_arena(void)
{
	size_t sz = sizeof alloc_arena;

	/* a private arena: kvtier's metadata is counted apart from the host's allocations */
	if (mallctl("arenas.create", &alloc_arena, &sz, NULL, 0) == 0)
		alloc_flags = (int)MALLOCX_ARENA(alloc_arena) | MALLOCX_TCACHE_NONE;
}

void *
kvt_malloc(size_t n)
{
	if (alloc_fault())
		return NULL;
	pthread_once(&alloc_once, alloc_init_arena);
	return mallocx(n ? n : 1, alloc_flags);
}

void *
kvt_calloc(size_t n, size_t size)
{
	if ((size && n > (size_t)-1 / size) || alloc_fault())
		return NULL;
	pthread_once(&alloc_once, alloc_init_arena);
	return mallocx((n * size) != 0 ? n * size : 1, alloc_flags | MALLOCX_ZERO);
}

void *
kvt_realloc(void *p, size_t n)
{
	if (!p)
		return kvt_malloc(n);
	if (alloc_fault())
		return NULL;
	return rallocx(p, n ? n : 1, alloc_flags);
}

void
kvt_free(void *p)
{
	if (p)
		dallocx(p, alloc_flags);
}
#else
void *
kvt_malloc(size_t n)
{
	return alloc_fault() ? NULL : malloc(n ? n : 1);
}

void *
kvt_calloc(size_t n, size_t size)
{
	return alloc_fault() ? NULL : calloc(n ? n : 1, size ? size : 1);
}

void *
kvt_realloc(void *p, size_t n)
{
	return alloc_fault() ? NULL : realloc(p, n ? n : 1);
}

void
kvt_free(void *p)
{
	free(p);
}
#endif
