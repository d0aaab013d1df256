/* SPDX-License-Identifier: MIT */
/* tests/support/kv_fixture.c - see kv_fixture.h. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "support/kv_fixture.h"

uint64_t
kvt_test_kv_rand(uint64_t *s)
{
	/* splitmix64 */
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* uniform in [-a, a) */
float
kvt_test_kv_uniform(uint64_t *s, float a)
{
	return ((float)(kvt_test_kv_rand(s) >> 40) / (float)(1u << 24) * 2.0f - 1.0f) * a;
}

void
kvt_test_kv_build(struct kvt_test_kv *b, const struct kvt_test_kv_shape *s, enum kvt_dtype dt,
		  uint64_t *rng)
{
	const uint32_t n_layers = 3, layer = 1, kv_dim = s->n_kv_heads * s->head_dim;
	const size_t esize = dt == KVT_DTYPE_F32 ? 4 : 2;
	const uint64_t tstride = kv_dim * esize + s->pad, lbytes = 2ull * s->tpb * tstride;
	const uint64_t bbytes = n_layers * lbytes + 64; /* padding: stride != layers * lbytes */
	const uint32_t n_blocks = (s->seq_len + s->tpb - 1) / s->tpb, n_slots = 2 * n_blocks + 3;
	uint32_t *perm = malloc(n_slots * sizeof *perm), i, j, x;
	size_t n = (size_t)s->seq_len * kv_dim;

	assert_non_null(perm);
	b->hbm_bytes = n_slots * bbytes;
	b->n_blocks = n_blocks;
	b->hbm = malloc(b->hbm_bytes);
	b->table = malloc(n_blocks * sizeof *b->table);
	b->kf = malloc(n * sizeof(float));
	b->vf = malloc(n * sizeof(float));
	b->kw = malloc(n * sizeof(float));
	b->vw = malloc(n * sizeof(float));
	b->q = malloc((size_t)s->n_heads * s->head_dim * sizeof(float));
	assert_true(b->hbm && b->table && b->kf && b->vf && b->kw && b->vw && b->q);
	memset(b->hbm, 0xff, n_slots * bbytes);
	for (i = 0; i < n_slots; i++)
		perm[i] = i;
	for (i = n_slots - 1; i > 0; i--) { /* Fisher-Yates */
		j = (uint32_t)(kvt_test_kv_rand(rng) % (i + 1));
		x = perm[i];
		perm[i] = perm[j];
		perm[j] = x;
	}
	memcpy(b->table, perm, n_blocks * sizeof *b->table);
	free(perm);
	b->kv = (struct kvt_paged_kv){ .k_base = b->hbm + layer * lbytes,
				       .v_offset = s->tpb * tstride, .block_stride = bbytes,
				       .token_stride = tstride, .table = b->table,
				       .tokens_per_block = s->tpb, .n_kv_heads = s->n_kv_heads,
				       .head_dim = s->head_dim, .dtype = dt };
	for (i = 0; i < n; i++) {
		b->kf[i] = kvt_test_kv_uniform(rng, 1.0f);
		b->vf[i] = kvt_test_kv_uniform(rng, 1.0f);
	}
	for (i = 0; i < (uint32_t)s->n_heads * s->head_dim; i++)
		b->q[i] = kvt_test_kv_uniform(rng, 2.0f);
	for (i = 0; i < s->seq_len; i++) {
		unsigned char *k = (unsigned char *)b->kv.k_base +
				   (uint64_t)b->table[i / s->tpb] * bbytes + (i % s->tpb) * tstride;

		assert_int_equal(kvt_store_f32(dt, k, b->kf + (size_t)i * kv_dim, kv_dim), 0);
		assert_int_equal(kvt_store_f32(dt, k + b->kv.v_offset, b->vf + (size_t)i * kv_dim,
					       kv_dim), 0);
		assert_int_equal(kvt_load_f32(dt, b->kw + (size_t)i * kv_dim, k, kv_dim), 0);
		assert_int_equal(kvt_load_f32(dt, b->vw + (size_t)i * kv_dim, k + b->kv.v_offset,
					      kv_dim), 0);
	}
}

void
kvt_test_kv_free(struct kvt_test_kv *b)
{
	free(b->hbm);
	free(b->table);
	free(b->kf);
	free(b->vf);
	free(b->kw);
	free(b->vw);
	free(b->q);
}

float
kvt_test_kv_maxabs(const float *x, size_t n)
{
	float m = 0.0f;
	size_t i;

	for (i = 0; i < n; i++)
		m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
	return m;
}

/* max |a - b| / max |b| */
double
kvt_test_kv_relerr(const float *a, const float *b, size_t n)
{
	double m = 0.0, s = kvt_test_kv_maxabs(b, n);
	size_t i;

	for (i = 0; i < n; i++) {
		double d = fabs((double)a[i] - (double)b[i]);

		if (!(d <= m)) /* catches NaN too */
			m = d;
	}
	return s > 0.0 ? m / s : m;
}

int
kvt_test_visible(uint64_t window, uint64_t sink, uint64_t q, uint64_t k)
{
	if (k > q)
		return 0;
	return !window || k + window > q || k < sink;
}

void
kvt_test_kv_poison(struct kvt_test_kv *b, uint64_t window, uint64_t sink, uint64_t q)
{
	const struct kvt_paged_kv *kv = &b->kv;
	const size_t esize = kv->dtype == KVT_DTYPE_F32 ? 4 : 2;
	const size_t row = (size_t)kv->n_kv_heads * kv->head_dim * esize;
	const uint32_t n_slots = (uint32_t)(b->hbm_bytes / kv->block_stride);
	uint32_t spare = 0, i, blk;
	uint64_t t, n_pos = (uint64_t)b->n_blocks * kv->tokens_per_block;

	for (;; spare++) { /* a slot the table does not use: never written, all 0xff */
		assert_true(spare < n_slots);
		for (i = 0; i < b->n_blocks && b->table[i] != spare; i++)
			;
		if (i == b->n_blocks)
			break;
	}
	for (t = 0; t < n_pos; t++) {
		unsigned char *k = (unsigned char *)kv->k_base +
				   (uint64_t)b->table[t / kv->tokens_per_block] * kv->block_stride +
				   (t % kv->tokens_per_block) * kv->token_stride;

		if (kvt_test_visible(window, sink, q, t))
			continue;
		memset(k, 0xff, row);
		memset(k + kv->v_offset, 0xff, row);
	}
	for (blk = 0; blk < b->n_blocks; blk++) {
		for (t = (uint64_t)blk * kv->tokens_per_block;
		     t < (uint64_t)(blk + 1) * kv->tokens_per_block; t++)
			if (kvt_test_visible(window, sink, q, t))
				break;
		if (t == (uint64_t)(blk + 1) * kv->tokens_per_block)
			b->table[blk] = spare;
	}
}
