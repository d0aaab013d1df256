/* SPDX-License-Identifier: MIT */
/*
 * tests/support/kv_fixture.h - random K/V of one sequence laid out in kvtier's block-first HBM
 * geometry behind a scrambled block table, for the attention tests (CPU reference and GPU).
 *
 * The fake HBM holds 2 * n_blocks + 3 slots of 3 layers each (plus 64 bytes of padding per slot,
 * so the block stride is not a multiple of the layer size); the sequence is stored in layer 1.
 * Bytes not written are 0xff, a NaN in every dtype, so a kernel reading a wrong address produces
 * NaN. Helpers fail the current cmocka test on allocation failure.
 */
#ifndef KVT_TESTS_SUPPORT_KV_FIXTURE_H
#define KVT_TESTS_SUPPORT_KV_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/attention.h"

struct kvt_test_kv_shape {
	uint32_t n_heads;    /* query heads */
	uint32_t n_kv_heads; /* KV heads */
	uint32_t head_dim;   /* elements per head */
	uint32_t tpb;        /* tokens per block */
	uint32_t seq_len;    /* positions */
	uint32_t pad;        /* extra bytes per token row (token_stride > row bytes) */
};

/* A sequence's K/V in a fake HBM of block-first slots, layer 1 of 3, behind a random table. */
struct kvt_test_kv {
	unsigned char *hbm;       /* the slots */
	size_t hbm_bytes;         /* bytes of hbm */
	uint32_t *table;          /* [n_blocks] slot ids, distinct, scrambled */
	uint32_t n_blocks;        /* entries of table */
	struct kvt_paged_kv kv;   /* what the kernel gets */
	float *kf, *vf;           /* [seq_len][kv_dim] the fp32 values that were stored */
	float *kw, *vw;           /* [seq_len][kv_dim] the stored values widened back to fp32 */
	float *q;                 /* [n_heads][head_dim] */
};

/** splitmix64 step: the next pseudo-random 64-bit value of state *s. */
uint64_t kvt_test_kv_rand(uint64_t *s);

/** Uniform pseudo-random float in [-a, a). */
float kvt_test_kv_uniform(uint64_t *s, float a);

/**
 * kvt_test_kv_build() - allocate and fill b for shape s, K/V stored as dt: K, V values uniform in
 * [-1, 1), q in [-2, 2); kw/vw are the stored values read back (what a kernel sees). Free with
 * kvt_test_kv_free().
 */
void kvt_test_kv_build(struct kvt_test_kv *b, const struct kvt_test_kv_shape *s,
		       enum kvt_dtype dt, uint64_t *rng);

/** Free what kvt_test_kv_build() allocated. */
void kvt_test_kv_free(struct kvt_test_kv *b);

/** max |x[i]| */
float kvt_test_kv_maxabs(const float *x, size_t n);

/** max |a[i] - b[i]| / max |b[i]| (NaN anywhere gives NaN or a large value). */
double kvt_test_kv_relerr(const float *a, const float *b, size_t n);

/** 1 when key k is visible from the query at q under (window, sink) (kernels/attention.h). */
int kvt_test_visible(uint64_t window, uint64_t sink, uint64_t q, uint64_t k);

/**
 * kvt_test_kv_poison() - overwrite with 0xff (NaN in every dtype) each K and V row of b that is
 * not visible from the query at q, and point the table entries of blocks without a visible
 * position at a slot the table does not use (never written: all 0xff), so a kernel that reads
 * outside the window and sinks produces NaN. b->kf/kw/vf/vw keep the values.
 */
void kvt_test_kv_poison(struct kvt_test_kv *b, uint64_t window, uint64_t sink, uint64_t q);

#endif /* KVT_TESTS_SUPPORT_KV_FIXTURE_H */
