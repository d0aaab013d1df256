/* SPDX-License-Identifier: MIT */
/* engine/alloc.c - see alloc.h. */
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

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
	pthread_once(&alloc_once, alloc_init_arena);
	return mallocx(n ? n : 1, alloc_flags);
}

void *
kvt_calloc(size_t n, size_t size)
{
	if (size && n > (size_t)-1 / size)
		return NULL;
	pthread_once(&alloc_once, alloc_init_arena);
	return mallocx((n * size) != 0 ? n * size : 1, alloc_flags | MALLOCX_ZERO);
}

void *
kvt_realloc(void *p, size_t n)
{
	if (!p)
		return kvt_malloc(n);
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
	return malloc(n ? n : 1);
}

void *
kvt_calloc(size_t n, size_t size)
{
	return calloc(n ? n : 1, size ? size : 1);
}

void *
kvt_realloc(void *p, size_t n)
{
	return realloc(p, n ? n : 1);
}

void
kvt_free(void *p)
{
	free(p);
}
#endif
