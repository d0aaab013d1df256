/* SPDX-License-Identifier: MIT */
/*
 * kernels/gather_ref.c - C reference of the block gather/scatter (see kernels/gather.h).
 */
#include <errno.h>
#include <string.h>

#include "tiers/base/error.h"
#include "kernels/gather.h"

int
kvt_gather_check(const char *what, const void *a, const void *b, uint64_t slot_stride,
		 uint64_t offset, uint64_t len, const uint32_t *slots)
{
	if (!a || !b || !slots)
		return kvt_err(-EINVAL, "%s: NULL buffer or slot list", what);
	if (!len || offset + len < offset || offset + len > slot_stride)
		return kvt_err(-EINVAL, "%s: range offset %llu len %llu outside slot of %llu",
			       what, (unsigned long long)offset, (unsigned long long)len,
			       (unsigned long long)slot_stride);
	return 0;
}

int
kvt_gather_blocks_ref(void *dst, const void *base, uint64_t slot_stride, uint64_t offset,
		      uint64_t len, const uint32_t *slots, uint32_t n)
{
	int rc;

	if (!n)
		return 0;
	rc = kvt_gather_check("gather blocks", dst, base, slot_stride, offset, len, slots);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < n; i++)
		memcpy((char *)dst + (size_t)i * len,
		       (const char *)base + (uint64_t)slots[i] * slot_stride + offset, len);
	return 0;
}

int
kvt_scatter_blocks_ref(void *base, uint64_t slot_stride, uint64_t offset, uint64_t len,
		       const void *src, const uint32_t *slots, uint32_t n)
{
	int rc;

	if (!n)
		return 0;
	rc = kvt_gather_check("scatter blocks", base, src, slot_stride, offset, len, slots);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < n; i++)
		memcpy((char *)base + (uint64_t)slots[i] * slot_stride + offset,
		       (const char *)src + (size_t)i * len, len);
	return 0;
}
