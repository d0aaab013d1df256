/* SPDX-License-Identifier: MIT */
/*
 * evict/bits.h - small bit helpers shared by the eviction policies and the engine (internal):
 * arrays of 2-bit fields packed into 64-bit words (arc's list tags, clock's counters) and the
 * home bucket of a key in an open-addressed table of any size (arc's ghost hash, the prefix
 * index). All static inline: they sit on the policies' and the lookup's hot paths.
 * No state, no locking: the caller owns the arrays and serialises access to them.
 */
#ifndef KVT_EVICT_BITS_H
#define KVT_EVICT_BITS_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tiers/base/alloc.h"

#define KVT_BITS2_PER_WORD 32u /* 2-bit fields in a uint64_t word */

/* Words that hold @n 2-bit fields. */
static inline size_t
kvt_bits2_words(uint64_t n)
{
	return (size_t)((n + KVT_BITS2_PER_WORD - 1) / KVT_BITS2_PER_WORD);
}

/* Field @k (0..3) of the packed array @w: w[k / 32] bits 2 (k % 32) and up. */
static inline unsigned
kvt_bits2_get(const uint64_t *w, uint32_t k)
{
	return (unsigned)(w[k / KVT_BITS2_PER_WORD] >> (2 * (k % KVT_BITS2_PER_WORD))) & 3u;
}

/* Set field @k of @w to @v (0..3; higher bits of @v are ignored). */
static inline void
kvt_bits2_set(uint64_t *w, uint32_t k, unsigned v)
{
	unsigned sh = 2 * (k % KVT_BITS2_PER_WORD);
	uint64_t *p = &w[k / KVT_BITS2_PER_WORD];

	*p = (*p & ~(3ull << sh)) | (uint64_t)(v & 3u) << sh;
}

/* Grow the packed array *@w from @old to @n fields (kvt_realloc). The new words are filled
 * with the byte @fill (0x00: every new field 0, 0xff: every new field 3); fields past @old in
 * its last word keep what they had, so fill them with the same value from the start. 0, or
 * -ENOMEM with *@w unchanged. */
static inline int
kvt_bits2_grow(uint64_t **w, uint64_t old, uint64_t n, int fill)
{
	size_t ow = kvt_bits2_words(old), nw = kvt_bits2_words(n);
	uint64_t *p;

	if (nw <= ow)
		return 0;
	p = kvt_realloc(*w, nw * sizeof *p);
	if (!p)
		return -ENOMEM;
	memset(p + ow, fill, (nw - ow) * sizeof *p);
	*w = p;
	return 0;
}

/* Home of key @x in a table of @cap buckets (1..UINT32_MAX): 32 well-mixed bits of @x
 * (Fibonacci hashing: the high half of x times 2^64 / golden ratio) scaled to [0, cap) by a
 * multiply-shift, so the table can have any size, not only a power of two. */
static inline uint32_t
kvt_hash_home(uint64_t x, uint32_t cap)
{
	uint64_t h = (x * 0x9E3779B97F4A7C15ull) >> 32;

	return (uint32_t)((h * cap) >> 32);
}

#endif /* KVT_EVICT_BITS_H */
