/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-hf/dsa.c - the DSA indexer's top-k selection (see dsa.h; the keys themselves
 * are a SIDECAR group, read and written in run.c).
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "dsa.h"
#include "kernels/sparse.h"
#include "util.h"

/*
 * torch's CPU topk (ATen/native/TopKImpl.h, topk_impl_loop, largest): the row becomes
 * (value, index) pairs in index order; with k * 64 <= n std::partial_sort keeps the first k,
 * else std::nth_element puts the k-th at k - 1; both compare values only (NaN first, then
 * greater), so which of equal values make the cut is the algorithm's. Below, libstdc++'s
 * (bits/stl_algo.h, stl_heap.h: __introselect with the median-of-three pivot and unguarded
 * partition, __insertion_sort, __heap_select), which the PyPI wheels are built with. Only the
 * set that makes the cut is used; the sort that follows it orders, and changes no member.
 */
struct tk {
	double v; /* accscalar_t of float is double: the same order */
	uint32_t i;
};

static inline bool
tk_comp(const struct tk *x, const struct tk *y)
{
	return (isnan(x->v) && !isnan(y->v)) || x->v > y->v;
}

static inline void
tk_swap(struct tk *a, struct tk *b)
{
	struct tk t = *a;

	*a = *b;
	*b = t;
}

static void
tk_push_heap(struct tk *first, ptrdiff_t hole, ptrdiff_t top, struct tk val)
{
	ptrdiff_t parent = (hole - 1) / 2;

	while (hole > top && tk_comp(first + parent, &val)) {
		first[hole] = first[parent];
		hole = parent;
		parent = (hole - 1) / 2;
	}
	first[hole] = val;
}

static void
tk_adjust_heap(struct tk *first, ptrdiff_t hole, ptrdiff_t len, struct tk val)
{
	ptrdiff_t top = hole, child = hole;

	while (child < (len - 1) / 2) {
		child = 2 * (child + 1);
		if (tk_comp(first + child, first + (child - 1)))
			child--;
		first[hole] = first[child];
		hole = child;
	}
	if ((len & 1) == 0 && child == (len - 2) / 2) {
		child = 2 * (child + 1);
		first[hole] = first[child - 1];
		hole = child - 1;
	}
	tk_push_heap(first, hole, top, val);
}

static void
tk_heap_select(struct tk *first, struct tk *middle, struct tk *last)
{
	ptrdiff_t len = middle - first, parent;

	if (len >= 2)
		for (parent = (len - 2) / 2;; parent--) {
			tk_adjust_heap(first, parent, len, first[parent]);
			if (parent == 0)
				break;
		}
	for (struct tk *i = middle; i < last; i++)
		if (tk_comp(i, first)) { /* __pop_heap(first, middle, i) */
			struct tk val = *i;

			*i = *first;
			tk_adjust_heap(first, 0, len, val);
		}
}

static void
tk_move_median_to_first(struct tk *result, struct tk *a, struct tk *b, struct tk *c)
{
	if (tk_comp(a, b)) {
		if (tk_comp(b, c))
			tk_swap(result, b);
		else if (tk_comp(a, c))
			tk_swap(result, c);
		else
			tk_swap(result, a);
	} else if (tk_comp(a, c)) {
		tk_swap(result, a);
	} else if (tk_comp(b, c)) {
		tk_swap(result, c);
	} else {
		tk_swap(result, b);
	}
}

static struct tk *
tk_partition_pivot(struct tk *first, struct tk *last)
{
	struct tk *pivot = first, *mid = first + (last - first) / 2;

	tk_move_median_to_first(first, first + 1, mid, last - 1);
	first++;
	for (;;) { /* __unguarded_partition(first + 1, last, pivot) */
		while (tk_comp(first, pivot))
			first++;
		last--;
		while (tk_comp(pivot, last))
			last--;
		if (!(first < last))
			return first;
		tk_swap(first, last);
		first++;
	}
}

static void
tk_insertion_sort(struct tk *first, struct tk *last)
{
	if (first == last)
		return;
	for (struct tk *i = first + 1; i != last; i++) {
		struct tk val = *i;

		if (tk_comp(&val, first)) {
			memmove(first + 1, first, (size_t)(i - first) * sizeof *first);
			*first = val;
		} else {
			struct tk *hole = i, *next = i - 1;

			while (tk_comp(&val, next)) {
				*hole = *next;
				hole = next--;
			}
			*hole = val;
		}
	}
}

static void
tk_nth_element(struct tk *first, struct tk *nth, struct tk *last)
{
	int depth = 0;

	if (first == last || nth == last)
		return;
	for (ptrdiff_t n = last - first; n > 1; n >>= 1) /* 2 x __lg(n) */
		depth++;
	depth *= 2;
	while (last - first > 3) {
		struct tk *cut;

		if (depth == 0) {
			tk_heap_select(first, nth + 1, last);
			tk_swap(first, nth);
			return;
		}
		depth--;
		cut = tk_partition_pivot(first, last);
		if (cut <= nth)
			first = cut;
		else
			last = cut;
	}
	tk_insertion_sort(first, last);
}

static int
u32_cmp(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return (x > y) - (x < y);
}

int
hf_torch_topk(const float *row, uint32_t n, uint32_t k, uint32_t n_valid, void *work,
	      uint32_t *out)
{
	struct tk *q = work;
	uint32_t got = 0;

	if (!row || !work || !out || !n || !k || n_valid > n)
		return -EINVAL;
	if (k > n)
		k = n;
	for (uint32_t j = 0; j < n; j++) {
		q[j].v = j < n_valid ? (double)row[j] : (double)-FLT_MAX;
		q[j].i = j;
	}
	if ((uint64_t)k * 64 <= n)
		tk_heap_select(q, q + k, q + n);
	else
		tk_nth_element(q, q + k - 1, q + n);
	for (uint32_t j = 0; j < k; j++)
		if (q[j].i < n_valid)
			out[got++] = q[j].i;
	qsort(out, got, sizeof *out, u32_cmp);
	return (int)got;
}

int
hf_dsa_select(const float *q, const float *w, uint32_t n_heads, uint32_t dim, const float *keys,
	      uint32_t pos, uint32_t topk, uint32_t n_pass, float *scores, void *work,
	      uint32_t *out)
{
	float scale = (float)pow((double)dim, -0.5);
	int rc;

	rc = kvt_dsa_index_scores_ref(q, w, n_heads, dim, scale, keys, dim, (uint64_t)pos + 1,
				      scores);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_dsa_index_scores_ref");
	if (n_pass && work) {
		rc = hf_torch_topk(scores, n_pass > pos + 1 ? n_pass : pos + 1, topk, pos + 1,
				   work, out);
		if (rc < 0)
			return kvtr_err(rc, "hf_torch_topk: bad arguments");
		return rc;
	}
	rc = kvt_topk_blocks(scores, pos + 1, topk, out);
	if (rc < 0)
		return kvtr_err_kvt(rc, "kvt_topk_blocks");
	return rc;
}
