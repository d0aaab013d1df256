/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-hf/dsa.c - the DSA indexer's top-k selection (see dsa.h; the keys themselves
 * are a SIDECAR group, read and written in run.c).
 */
#include <errno.h>
#include <math.h>

#include "dsa.h"
#include "kernels/sparse.h"
#include "util.h"

int
hf_dsa_select(const float *q, const float *w, uint32_t n_heads, uint32_t dim, const float *keys,
	      uint32_t pos, uint32_t topk, float *scores, uint32_t *out)
{
	float scale = (float)pow((double)dim, -0.5);
	int rc;

	rc = kvt_dsa_index_scores_ref(q, w, n_heads, dim, scale, keys, dim, (uint64_t)pos + 1,
				      scores);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_dsa_index_scores_ref");
	rc = kvt_topk_blocks(scores, pos + 1, topk, out);
	if (rc < 0)
		return kvtr_err_kvt(rc, "kvt_topk_blocks");
	return rc;
}
