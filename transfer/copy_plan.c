/* SPDX-License-Identifier: MIT */
/*
 * transfer/copy_plan.c - the ranges a copy kernel may touch, and the split of a copy batch
 * between the kernel and one-at-a-time copies (see copy_plan.h).
 */
#include <errno.h>

#include "tiers/base/error.h"
#include "transfer/copy_plan.h"

int
kvt_copy_ranges_init(struct kvt_copy_ranges *cr)
{
	cr->n = 0;
	if (pthread_mutex_init(&cr->lock, NULL) != 0)
		return kvt_err(-ENOMEM, "copy ranges: cannot initialise a lock");
	return 0;
}

void
kvt_copy_ranges_fini(struct kvt_copy_ranges *cr)
{
	pthread_mutex_destroy(&cr->lock);
}

int
kvt_copy_ranges_add(struct kvt_copy_ranges *cr, const void *p, size_t len)
{
	uintptr_t lo = (uintptr_t)p, hi = lo + len;
	int rc = 0;

	if (p == NULL || len == 0 || hi < lo)
		return kvt_err(-EINVAL, "copy ranges: bad range %p + %zu", p, len);
	pthread_mutex_lock(&cr->lock);
	for (uint32_t i = 0; i < cr->n && rc == 0; i++)
		if (lo < cr->r[i].hi && cr->r[i].lo < hi)
			rc = kvt_err(-EINVAL, "copy ranges: %p + %zu overlaps a recorded range", p,
				     len);
	if (rc == 0 && cr->n == KVT_COPY_RANGES_MAX)
		rc = kvt_err(-ENOSPC, "copy ranges: %u ranges recorded already",
			     KVT_COPY_RANGES_MAX);
	if (rc == 0)
		cr->r[cr->n++] = (struct kvt_mem_range){ .lo = lo, .hi = hi };
	pthread_mutex_unlock(&cr->lock);
	return rc;
}

int
kvt_copy_ranges_remove(struct kvt_copy_ranges *cr, const void *p)
{
	int rc = -ENOENT;

	pthread_mutex_lock(&cr->lock);
	for (uint32_t i = 0; i < cr->n; i++) {
		if (cr->r[i].lo != (uintptr_t)p)
			continue;
		cr->r[i] = cr->r[--cr->n];
		rc = 0;
		break;
	}
	pthread_mutex_unlock(&cr->lock);
	return rc;
}

/* Is [p, p + len) inside one of the n ranges? len >= 1. */
static bool
plan_inside(const struct kvt_mem_range *r, uint32_t n, const void *p, size_t len)
{
	uintptr_t lo = (uintptr_t)p, hi = lo + len;

	if (hi < lo)
		return false;
	for (uint32_t i = 0; i < n; i++)
		if (lo >= r[i].lo && hi <= r[i].hi)
			return true;
	return false;
}

uint32_t
kvt_copy_ranges_split(struct kvt_copy_ranges *cr, const struct kvt_copy *v, uint32_t n,
		      struct kvt_copy *kern, struct kvt_copy *rest, uint32_t *n_rest)
{
	uint32_t nk = 0, nr = 0;

	pthread_mutex_lock(&cr->lock);
	for (uint32_t i = 0; i < n; i++) {
		if (v[i].len && plan_inside(cr->r, cr->n, v[i].src, v[i].len) &&
		    plan_inside(cr->r, cr->n, v[i].dst, v[i].len))
			kern[nk++] = v[i];
		else
			rest[nr++] = v[i];
	}
	pthread_mutex_unlock(&cr->lock);
	*n_rest = nr;
	return nk;
}
