/* SPDX-License-Identifier: MIT */
/*
 * tests/test_kernels_sparse.c - the sparse decode kernels' C reference (kernels/sparse.h):
 * attention over a selected block list, GQA and MLA latent, for every dtype:
 *  - bit-identical to kvt_attn_decode_ref() (the latent one) over a contiguous copy of exactly
 *    the selected tokens, and within 1e-5 of a double-precision softmax written here;
 *  - bit-identical to full attention when every block is selected (with and without a window
 *    and sinks, with a dense table and with block positions);
 *  - reading only the selected blocks: the others' table entries point at a slot of NaN;
 * the Quest summary against min/max taken here (last partial block included), the Quest score
 * against its formula and as an upper bound of q.k over the block, top-k block picking, and
 * argument errors; DSA's token lists (MLA attention masked within a block) and indexer score.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/sparse.h"
#include "support/kv_fixture.h"

/* A slot the table does not use (never written: all 0xff, NaN in every dtype). */
static uint32_t
ts_spare_slot(const struct kvt_test_kv *b)
{
	uint32_t n_slots = (uint32_t)(b->hbm_bytes / b->kv.block_stride), s, i;

	for (s = 0; s < n_slots; s++) {
		for (i = 0; i < b->n_blocks && b->table[i] != s; i++)
			;
		if (i == b->n_blocks)
			return s;
	}
	fail_msg("no spare slot");
	return 0;
}

/* A random strictly ascending selection of about half the blocks (at least one). */
static uint32_t
ts_pick(uint32_t n_blocks, uint32_t *sel, uint64_t *rng)
{
	uint32_t n = 0;

	for (uint32_t b = 0; b < n_blocks; b++)
		if (kvt_test_kv_rand(rng) & 1)
			sel[n++] = b;
	if (!n)
		sel[n++] = (uint32_t)(kvt_test_kv_rand(rng) % n_blocks);
	return n;
}

/*
 * Contiguous copy of the selected visible tokens' rows (raw bytes, as stored) as a one-block
 * paged K/V: dense attention over exactly those tokens. Returns the token count.
 */
static uint64_t
ts_gather(const struct kvt_test_kv *b, uint64_t seq, const uint32_t *sel, uint32_t n_sel,
	  uint64_t window, uint64_t sink, unsigned char **buf, struct kvt_paged_kv *dense,
	  uint64_t **tok)
{
	const struct kvt_paged_kv *kv = &b->kv;
	const size_t esize = kv->dtype == KVT_DTYPE_F32 ? 4 : 2;
	const size_t row = (size_t)kv->n_kv_heads * kv->head_dim * esize;
	const uint64_t cap = (uint64_t)n_sel * kv->tokens_per_block;
	static uint32_t table0;
	uint64_t n = 0;

	*buf = malloc(2 * cap * row + 1);
	*tok = malloc(cap * sizeof(uint64_t) + 1);
	assert_true(*buf && *tok);
	for (uint32_t i = 0; i < n_sel; i++)
		for (uint64_t t = (uint64_t)sel[i] * kv->tokens_per_block;
		     t < (uint64_t)(sel[i] + 1) * kv->tokens_per_block && t < seq; t++) {
			const unsigned char *k;

			if (!kvt_test_visible(window, sink, seq - 1, t))
				continue;
			k = (const unsigned char *)kv->k_base +
			    (uint64_t)b->table[t / kv->tokens_per_block] * kv->block_stride +
			    (t % kv->tokens_per_block) * kv->token_stride;
			memcpy(*buf + n * row, k, row);
			memcpy(*buf + (cap + n) * row, k + kv->v_offset, row);
			(*tok)[n++] = t;
		}
	table0 = 0;
	*dense = (struct kvt_paged_kv){ .k_base = *buf, .v_offset = cap * row,
					.block_stride = 0, .token_stride = row, .table = &table0,
					.tokens_per_block = (uint32_t)(n ? n : 1),
					.n_kv_heads = kv->n_kv_heads, .head_dim = kv->head_dim,
					.dtype = kv->dtype };
	return n;
}

/* Attention in double over the listed tokens, from the fixture's widened values. */
static void
ts_naive(const struct kvt_test_kv *b, uint32_t n_heads, const uint64_t *tok, uint64_t n,
	 float *out)
{
	const uint32_t d = b->kv.head_dim, nkv = b->kv.n_kv_heads, kvd = nkv * d;
	double *p = malloc((n + 1) * sizeof(double));

	assert_non_null(p);
	for (uint32_t h = 0; h < n_heads; h++) {
		const uint32_t kh = h / (n_heads / nkv);
		double mx = -INFINITY, sum = 0;

		for (uint64_t j = 0; j < n; j++) {
			double s = 0;

			for (uint32_t i = 0; i < d; i++)
				s += (double)b->q[(size_t)h * d + i] *
				     b->kw[tok[j] * kvd + kh * d + i];
			p[j] = s / sqrt((double)d);
			mx = p[j] > mx ? p[j] : mx;
		}
		for (uint64_t j = 0; j < n; j++)
			sum += (p[j] = exp(p[j] - mx));
		for (uint32_t i = 0; i < d; i++) {
			double o = 0;

			for (uint64_t j = 0; j < n; j++)
				o += p[j] / sum * b->vw[tok[j] * kvd + kh * d + i];
			out[(size_t)h * d + i] = n ? (float)o : 0.0f;
		}
	}
	free(p);
}

static void
ts_select_case(const struct kvt_test_kv_shape *s, enum kvt_dtype dt, uint64_t window,
	       uint64_t sink, uint64_t *rng)
{
	const size_t n_out = (size_t)s->n_heads * s->head_dim;
	float *got = malloc(n_out * 4), *want = malloc(n_out * 4), *ref = malloc(n_out * 4);
	float *scratch = malloc(((size_t)s->seq_len + s->tpb) * 4), *full = malloc(n_out * 4);
	uint32_t *sel, *all, n_sel, spare;
	struct kvt_test_kv b;
	struct kvt_paged_kv dense, kv;
	unsigned char *buf;
	uint64_t *tok, n;

	assert_true(got && want && ref && scratch && full);
	kvt_test_kv_build(&b, s, dt, rng);
	sel = malloc(b.n_blocks * sizeof *sel);
	all = malloc(b.n_blocks * sizeof *all);
	assert_true(sel && all);
	kv = b.kv;
	kv.window = window;
	kv.sink = sink;

	/* every block selected: full attention, bit for bit */
	for (uint32_t i = 0; i < b.n_blocks; i++)
		all[i] = i;
	assert_int_equal(kvt_attn_decode_ref(&kv, b.q, s->n_heads, s->seq_len, scratch, want), 0);
	assert_int_equal(kvt_attn_select_ref(&kv, b.q, s->n_heads, s->seq_len, all, b.n_blocks,
					     scratch, got), 0);
	assert_memory_equal(got, want, n_out * 4);
	memcpy(full, want, n_out * 4);

	/* a random selection: dense attention over the same tokens, bit for bit */
	n_sel = ts_pick(b.n_blocks, sel, rng);
	n = ts_gather(&b, s->seq_len, sel, n_sel, window, sink, &buf, &dense, &tok);
	/* the unselected blocks now read NaN: only the selected ones may be touched */
	spare = ts_spare_slot(&b);
	for (uint32_t i = 0, j = 0; i < b.n_blocks; i++) {
		if (j < n_sel && sel[j] == i)
			j++;
		else
			b.table[i] = spare;
	}
	assert_int_equal(kvt_attn_select_ref(&kv, b.q, s->n_heads, s->seq_len, sel, n_sel,
					     scratch, got), 0);
	if (n) {
		assert_int_equal(kvt_attn_decode_ref(&dense, b.q, s->n_heads, n, scratch, want), 0);
		assert_memory_equal(got, want, n_out * 4);
	} else {
		for (size_t i = 0; i < n_out; i++)
			assert_float_equal(got[i], 0.0f, 0.0);
	}
	ts_naive(&b, s->n_heads, tok, n, ref);
	if (!(kvt_test_kv_relerr(got, ref, n_out) <= 1e-5))
		fail_msg("select h %u kv %u d %u tpb %u seq %u dtype %d: relerr %g vs double",
			 s->n_heads, s->n_kv_heads, s->head_dim, s->tpb, s->seq_len, (int)dt,
			 kvt_test_kv_relerr(got, ref, n_out));
	/* a real selection (some block left out, no window) is not full attention */
	if (n_sel < b.n_blocks && !window)
		assert_true(memcmp(got, full, n_out * 4) != 0);

	/* block positions: a table listing only the selected blocks */
	{
		uint32_t *live = malloc(n_sel * sizeof *live);
		struct kvt_paged_kv pk = kv;

		assert_non_null(live);
		for (uint32_t i = 0; i < n_sel; i++)
			live[i] = b.table[sel[i]];
		pk.table = live;
		pk.pos = sel;
		pk.n_entries = n_sel;
		assert_int_equal(kvt_attn_select_ref(&pk, b.q, s->n_heads, s->seq_len, sel, n_sel,
						     scratch, ref), 0);
		assert_memory_equal(ref, got, n_out * 4);
		if (n_sel < b.n_blocks) { /* a selected block missing from pos */
			uint32_t other = 0;

			while (other < b.n_blocks) {
				uint32_t j = 0;

				while (j < n_sel && sel[j] != other)
					j++;
				if (j == n_sel)
					break;
				other++;
			}
			assert_int_equal(kvt_attn_select_ref(&pk, b.q, s->n_heads, s->seq_len,
							     &other, 1, scratch, ref), -EINVAL);
		}
		free(live);
	}
	free(buf);
	free(tok);
	free(sel);
	free(all);
	kvt_test_kv_free(&b);
	free(got);
	free(want);
	free(ref);
	free(full);
	free(scratch);
}

static void
test_select_gqa(void **st)
{
	static const struct kvt_test_kv_shape shapes[] = {
		{ 4, 2, 16, 4, 37, 0 }, { 8, 8, 8, 16, 128, 4 }, { 6, 2, 24, 5, 101, 0 },
		{ 1, 1, 4, 1, 9, 0 },   { 16, 2, 64, 16, 300, 8 },
	};
	static const enum kvt_dtype dts[] = { KVT_DTYPE_F32, KVT_DTYPE_F16, KVT_DTYPE_BF16 };
	uint64_t rng = 0x5e1ec7;

	(void)st;
	for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
		for (size_t d = 0; d < 3; d++) {
			ts_select_case(&shapes[i], dts[d], 0, 0, &rng);
			ts_select_case(&shapes[i], dts[d], 13, 3, &rng); /* window + sinks */
		}
}

/* MLA: the same checks on a latent layout (the fixture's K rows are the latent vectors). */
static void
ts_latent_case(uint32_t h, uint32_t r, uint32_t rope, uint32_t tpb, uint32_t seq,
	       enum kvt_dtype dt, uint64_t window, uint64_t sink, uint64_t *rng)
{
	const struct kvt_test_kv_shape s = { 1, 1, r + rope, tpb, seq, 0 };
	const size_t n_out = (size_t)h * r;
	const float scale = 1.0f / sqrtf((float)(r + rope));
	float *q_lat = malloc(n_out * 4), *q_pe = malloc(((size_t)h * rope + 1) * 4);
	float *got = malloc(n_out * 4), *want = malloc(n_out * 4), *scratch = malloc(seq * 4 + 64);
	uint32_t *sel, *all, n_sel, spare;
	struct kvt_paged_latent lk, dl;
	struct kvt_paged_kv dense;
	struct kvt_test_kv b;
	unsigned char *buf;
	uint64_t *tok, n;

	assert_true(q_lat && q_pe && got && want && scratch);
	kvt_test_kv_build(&b, &s, dt, rng);
	for (size_t i = 0; i < n_out; i++)
		q_lat[i] = kvt_test_kv_uniform(rng, 2.0f);
	for (size_t i = 0; i < (size_t)h * rope; i++)
		q_pe[i] = kvt_test_kv_uniform(rng, 2.0f);
	sel = malloc(b.n_blocks * sizeof *sel);
	all = malloc(b.n_blocks * sizeof *all);
	assert_true(sel && all);
	lk = (struct kvt_paged_latent){ .base = b.kv.k_base, .block_stride = b.kv.block_stride,
					.token_stride = b.kv.token_stride, .table = b.table,
					.tokens_per_block = tpb, .kv_lora_rank = r,
					.rope_dim = rope, .dtype = dt, .window = window,
					.sink = sink };
	for (uint32_t i = 0; i < b.n_blocks; i++)
		all[i] = i;
	assert_int_equal(kvt_attn_latent_decode_ref(&lk, q_lat, q_pe, h, seq, scale, scratch,
						    want), 0);
	assert_int_equal(kvt_attn_latent_select_ref(&lk, q_lat, q_pe, h, seq, all, b.n_blocks,
						    scale, scratch, got), 0);
	assert_memory_equal(got, want, n_out * 4);
	n_sel = ts_pick(b.n_blocks, sel, rng);
	n = ts_gather(&b, seq, sel, n_sel, window, sink, &buf, &dense, &tok);
	spare = ts_spare_slot(&b);
	for (uint32_t i = 0, j = 0; i < b.n_blocks; i++) {
		if (j < n_sel && sel[j] == i)
			j++;
		else
			b.table[i] = spare;
	}
	assert_int_equal(kvt_attn_latent_select_ref(&lk, q_lat, q_pe, h, seq, sel, n_sel, scale,
						    scratch, got), 0);
	if (n) {
		dl = (struct kvt_paged_latent){ .base = dense.k_base, .block_stride = 0,
						.token_stride = dense.token_stride,
						.table = dense.table,
						.tokens_per_block = (uint32_t)n,
						.kv_lora_rank = r, .rope_dim = rope, .dtype = dt };
		assert_int_equal(kvt_attn_latent_decode_ref(&dl, q_lat, q_pe, h, n, scale, scratch,
							    want), 0);
		assert_memory_equal(got, want, n_out * 4);
	} else {
		for (size_t i = 0; i < n_out; i++)
			assert_float_equal(got[i], 0.0f, 0.0);
	}
	for (size_t i = 0; i < n_out; i++)
		assert_true(isfinite(got[i]));
	free(buf);
	free(tok);
	free(sel);
	free(all);
	kvt_test_kv_free(&b);
	free(q_lat);
	free(q_pe);
	free(got);
	free(want);
	free(scratch);
}

static void
test_select_latent(void **st)
{
	uint64_t rng = 0x1a7e;

	(void)st;
	ts_latent_case(4, 32, 8, 16, 128, KVT_DTYPE_F32, 0, 0, &rng); /* the fixture's MLA */
	ts_latent_case(16, 64, 16, 8, 77, KVT_DTYPE_BF16, 0, 0, &rng);
	ts_latent_case(3, 24, 0, 5, 40, KVT_DTYPE_F16, 0, 0, &rng); /* no rope part */
	ts_latent_case(2, 16, 8, 4, 50, KVT_DTYPE_F32, 9, 2, &rng);
}

static void
test_quest(void **st)
{
	static const struct kvt_test_kv_shape shapes[] = {
		{ 4, 2, 16, 16, 100, 0 }, { 8, 8, 8, 5, 23, 4 }, { 2, 1, 40, 1, 7, 0 },
	};
	uint64_t rng = 0x9e57;

	(void)st;
	for (size_t si = 0; si < 3; si++)
		for (int dti = 0; dti < 3; dti++) {
			const struct kvt_test_kv_shape *s = &shapes[si];
			const enum kvt_dtype dt = (enum kvt_dtype)dti;
			struct kvt_test_kv b;
			uint32_t *blocks, nb, nkv = s->n_kv_heads, d = s->head_dim;
			float *sum, *scores, *got;
			size_t per;

			kvt_test_kv_build(&b, s, dt, &rng);
			nb = b.n_blocks;
			per = kvt_quest_summary_floats(nkv, d);
			assert_int_equal(per, (size_t)nkv * 2 * d);
			blocks = malloc(nb * sizeof *blocks);
			sum = malloc(nb * per * 4);
			scores = malloc((size_t)s->n_heads * nb * 4);
			got = malloc(nb * sizeof *got);
			assert_true(blocks && sum && scores && got);
			for (uint32_t i = 0; i < nb; i++)
				blocks[i] = nb - 1 - i; /* any order */
			assert_int_equal(kvt_quest_summary_ref(&b.kv, s->seq_len, blocks, nb, sum),
					 0);
			assert_int_equal(kvt_quest_score_ref(sum, nb, nkv, d, b.q, s->n_heads,
							     scores), 0);
			for (uint32_t i = 0; i < nb; i++) {
				const uint32_t blk = blocks[i];
				const uint64_t t0 = (uint64_t)blk * s->tpb;
				const uint64_t t1 = t0 + s->tpb < s->seq_len ? t0 + s->tpb
									      : s->seq_len;

				for (uint32_t kh = 0; kh < nkv; kh++)
					for (uint32_t c = 0; c < d; c++) {
						float mn = INFINITY, mx = -INFINITY;

						for (uint64_t t = t0; t < t1; t++) {
							float x = b.kw[t * nkv * d + kh * d + c];

							mn = x < mn ? x : mn;
							mx = x > mx ? x : mx;
						}
						const float *sk = sum + i * per + kh * 2 * d;

						assert_float_equal(sk[c], mn, 0.0);
						assert_float_equal(sk[d + c], mx, 0.0);
					}
				for (uint32_t h = 0; h < s->n_heads; h++) {
					const uint32_t kh = h / (s->n_heads / nkv);
					const float *qh = b.q + (size_t)h * d;
					const float *mn = sum + i * per + kh * 2 * d, *mx = mn + d;
					double want = 0, best = -INFINITY;

					for (uint32_t c = 0; c < d; c++)
						want += fmax((double)qh[c] * mn[c],
							     (double)qh[c] * mx[c]);
					assert_float_equal(scores[(size_t)h * nb + i], want,
							   1e-5 * (1 + fabs(want)));
					/* an upper bound of q.k over the block's tokens */
					for (uint64_t t = t0; t < t1; t++) {
						double qk = 0;

						for (uint32_t c = 0; c < d; c++)
							qk += (double)qh[c] *
							      b.kw[t * nkv * d + kh * d + c];
						best = qk > best ? qk : best;
					}
					assert_true(scores[(size_t)h * nb + i] >=
						    best - 1e-5 * (1 + fabs(best)));
				}
			}
			/* errors */
			blocks[0] = nb; /* past the sequence */
			assert_int_equal(kvt_quest_summary_ref(&b.kv, s->seq_len, blocks, 1, sum),
					 -EINVAL);
			assert_int_equal(kvt_quest_summary_ref(&b.kv, s->seq_len, blocks, 0, sum),
					 -EINVAL);
			assert_int_equal(kvt_quest_score_ref(sum, nb, nkv, d, b.q, 0, scores),
					 -EINVAL);
			if (nkv > 1) /* n_heads not a multiple of n_kv_heads */
				assert_int_equal(kvt_quest_score_ref(sum, nb, nkv, d, b.q, 1,
								     scores), -EINVAL);
			assert_int_equal(kvt_quest_score_ref(NULL, nb, nkv, d, b.q, s->n_heads,
							     scores), -EINVAL);
			free(blocks);
			free(sum);
			free(scores);
			free(got);
			kvt_test_kv_free(&b);
		}
}

static void
test_topk_blocks(void **st)
{
	const float s[7] = { 0.5f, 2.0f, NAN, 2.0f, -1.0f, 3.0f, 0.5f };
	uint32_t out[7];

	(void)st;
	assert_int_equal(kvt_topk_blocks(s, 7, 3, out), 3);
	assert_int_equal(out[0], 1); /* 3.0 (5), 2.0 (1), 2.0 (3): ascending */
	assert_int_equal(out[1], 3);
	assert_int_equal(out[2], 5);
	assert_int_equal(kvt_topk_blocks(s, 7, 4, out), 4); /* the tie 0.5: the lower index */
	assert_int_equal(out[0], 0);
	assert_int_equal(out[3], 5);
	assert_int_equal(kvt_topk_blocks(s, 7, 7, out), 7); /* NaN last but still counted */
	assert_int_equal(kvt_topk_blocks(s, 7, 6, out), 6);
	for (int i = 0; i < 6; i++)
		assert_int_not_equal(out[i], 2);
	assert_int_equal(kvt_topk_blocks(s, 3, 10, out), 3);
	assert_int_equal(kvt_topk_blocks(s, 7, 0, out), -EINVAL);
	assert_int_equal(kvt_topk_blocks(NULL, 7, 2, out), -EINVAL);
}

/*
 * DSA's token lists (kvt_attn_latent_tokens_partial_ref): over a contiguous run the partial of
 * kvt_attn_latent_partial_ref bit for bit; over a random subset (several tokens of one block,
 * others of the same block left out and overwritten with NaN) the partial of a contiguous
 * copy of exactly those tokens, bit for bit, with a dense table and with block positions.
 */
static void
ts_tokens_case(uint32_t h, uint32_t r, uint32_t rope, uint32_t tpb, uint32_t seq,
	       enum kvt_dtype dt, uint64_t *rng)
{
	const struct kvt_test_kv_shape s = { 1, 1, r + rope, tpb, seq, 0 };
	const size_t n_out = (size_t)h * r, esize = dt == KVT_DTYPE_F32 ? 4 : 2;
	const size_t row = (size_t)(r + rope) * esize;
	const float scale = 1.0f / sqrtf((float)(r + rope));
	float *q_lat = malloc(n_out * 4), *q_pe = malloc(((size_t)h * rope + 1) * 4);
	float *o1 = malloc(n_out * 4), *o2 = malloc(n_out * 4), *scratch = malloc(seq * 4 + 64);
	float m1[16], l1[16], m2[16], l2[16];
	uint32_t *tok = malloc(seq * sizeof(uint32_t)), *live, *pos, n = 0, nb = 0;
	unsigned char *copy = malloc((size_t)seq * row + 1);
	struct kvt_paged_latent lk, dl;
	struct kvt_test_kv b;
	static uint32_t table0;
	uint32_t t0 = seq / 3, t1 = seq - 1;

	assert_true(h <= 16 && q_lat && q_pe && o1 && o2 && scratch && tok && copy);
	kvt_test_kv_build(&b, &s, dt, rng);
	for (size_t i = 0; i < n_out; i++)
		q_lat[i] = kvt_test_kv_uniform(rng, 2.0f);
	for (size_t i = 0; i < (size_t)h * rope; i++)
		q_pe[i] = kvt_test_kv_uniform(rng, 2.0f);
	lk = (struct kvt_paged_latent){ .base = b.kv.k_base, .block_stride = b.kv.block_stride,
					.token_stride = b.kv.token_stride, .table = b.table,
					.tokens_per_block = tpb, .kv_lora_rank = r,
					.rope_dim = rope, .dtype = dt, .seq_len = seq };
	/* a contiguous run: the range partial */
	for (uint32_t t = t0; t < t1; t++)
		tok[n++] = t;
	assert_int_equal(kvt_attn_latent_partial_ref(&lk, q_lat, q_pe, h, t0, t1, scale, scratch,
						     o1, m1, l1), 0);
	assert_int_equal(kvt_attn_latent_tokens_partial_ref(&lk, q_lat, q_pe, h, tok, n, scale,
							    scratch, o2, m2, l2), 0);
	assert_memory_equal(o1, o2, n_out * 4);
	assert_memory_equal(m1, m2, h * 4);
	assert_memory_equal(l1, l2, h * 4);
	/* a random subset; the rows left out become NaN */
	n = 0;
	for (uint32_t t = 0; t < seq; t++) {
		unsigned char *p = (unsigned char *)b.kv.k_base +
				   (uint64_t)b.table[t / tpb] * b.kv.block_stride +
				   (t % tpb) * b.kv.token_stride;

		if (kvt_test_kv_rand(rng) % 3 == 0 || (n == 0 && t == seq - 1)) {
			memcpy(copy + (size_t)n * row, p, row);
			tok[n++] = t;
		} else {
			memset(p, 0xff, row);
		}
	}
	table0 = 0;
	dl = (struct kvt_paged_latent){ .base = copy, .block_stride = 0, .token_stride = row,
					.table = &table0, .tokens_per_block = n,
					.kv_lora_rank = r, .rope_dim = rope, .dtype = dt };
	assert_int_equal(kvt_attn_latent_partial_ref(&dl, q_lat, q_pe, h, 0, n, scale, scratch,
						     o1, m1, l1), 0);
	assert_int_equal(kvt_attn_latent_tokens_partial_ref(&lk, q_lat, q_pe, h, tok, n, scale,
							    scratch, o2, m2, l2), 0);
	assert_memory_equal(o1, o2, n_out * 4);
	assert_memory_equal(m1, m2, h * 4);
	assert_memory_equal(l1, l2, h * 4);
	for (size_t i = 0; i < n_out; i++)
		assert_true(isfinite(o2[i]));
	/* block positions: a table of only the blocks holding a listed token */
	live = malloc(b.n_blocks * sizeof(uint32_t));
	pos = malloc(b.n_blocks * sizeof(uint32_t));
	assert_true(live && pos);
	for (uint32_t i = 0; i < n; i++)
		if (!nb || pos[nb - 1] != tok[i] / tpb) {
			pos[nb] = tok[i] / tpb;
			live[nb++] = b.table[tok[i] / tpb];
		}
	lk.table = live;
	lk.pos = pos;
	lk.n_entries = nb;
	assert_int_equal(kvt_attn_latent_tokens_partial_ref(&lk, q_lat, q_pe, h, tok, n, scale,
							    scratch, o1, m1, l1), 0);
	assert_memory_equal(o1, o2, n_out * 4);
	if (nb > 1) { /* a token whose block is not in pos */
		lk.n_entries = nb - 1;
		assert_int_equal(kvt_attn_latent_tokens_partial_ref(&lk, q_lat, q_pe, h, tok, n,
								    scale, scratch, o1, m1, l1),
				 -EINVAL);
		lk.n_entries = nb;
	}
	if (n > 1) { /* not ascending */
		uint32_t sw = tok[0];

		tok[0] = tok[1];
		tok[1] = sw;
		assert_int_equal(kvt_attn_latent_tokens_partial_ref(&lk, q_lat, q_pe, h, tok, n,
								    scale, scratch, o1, m1, l1),
				 -EINVAL);
	}
	lk.pos = NULL;
	lk.table = b.table;
	tok[0] = seq; /* past the sequence */
	assert_int_equal(kvt_attn_latent_tokens_partial_ref(&lk, q_lat, q_pe, h, tok, 1, scale,
							    scratch, o1, m1, l1), -EINVAL);
	/* nothing listed: the empty partial, nothing read */
	assert_int_equal(kvt_attn_latent_tokens_partial_ref(&lk, q_lat, q_pe, h, NULL, 0, scale,
							    scratch, o1, m1, l1), 0);
	for (uint32_t i = 0; i < h; i++) {
		assert_true(isinf(m1[i]) && m1[i] < 0);
		assert_float_equal(l1[i], 0.0f, 0.0);
	}
	free(live);
	free(pos);
	kvt_test_kv_free(&b);
	free(q_lat);
	free(q_pe);
	free(o1);
	free(o2);
	free(scratch);
	free(tok);
	free(copy);
}

static void
test_tokens_latent(void **st)
{
	uint64_t rng = 0xd5a;

	(void)st;
	ts_tokens_case(4, 32, 8, 4, 127, KVT_DTYPE_F32, &rng); /* the deepseek-v32 fixture's */
	ts_tokens_case(4, 32, 8, 16, 128, KVT_DTYPE_F32, &rng);
	ts_tokens_case(16, 64, 16, 8, 77, KVT_DTYPE_BF16, &rng);
	ts_tokens_case(3, 24, 0, 5, 40, KVT_DTYPE_F16, &rng); /* no rope part */
}

/* The indexer score against its formula in double; ReLU: a key every head scores below 0
 * gets exactly 0; errors. */
static void
test_dsa_index_scores(void **st)
{
	enum { H = 5, D = 12, N = 40, STRIDE = 14 };
	float q[H * D], w[H], keys[N * STRIDE], sc[N];
	uint64_t rng = 0x1de;
	const float scale = 1.0f / sqrtf((float)D);

	(void)st;
	for (int i = 0; i < H * D; i++)
		q[i] = kvt_test_kv_uniform(&rng, 1.0f) + 0.25f; /* mostly positive */
	for (int h = 0; h < H; h++)
		w[h] = kvt_test_kv_uniform(&rng, 1.0f);
	for (int i = 0; i < N * STRIDE; i++)
		keys[i] = kvt_test_kv_uniform(&rng, 1.0f);
	for (int i = 0; i < D; i++) /* key 7: q . k < 0 for every head (each head's q sums
				       positive: checked below) */
		keys[7 * STRIDE + i] = -2.0f;
	for (int h = 0; h < H; h++) {
		double d = 0;

		for (int i = 0; i < D; i++)
			d += (double)q[h * D + i] * keys[7 * STRIDE + i];
		assert_true(d < 0);
	}
	assert_int_equal(kvt_dsa_index_scores_ref(q, w, H, D, scale, keys, STRIDE, N, sc), 0);
	for (int t = 0; t < N; t++) {
		double want = 0;

		for (int h = 0; h < H; h++) {
			double d = 0;

			for (int i = 0; i < D; i++)
				d += (double)q[h * D + i] * keys[t * STRIDE + i];
			d *= scale;
			want += w[h] * (d > 0 ? d : 0);
		}
		assert_true(fabs(sc[t] - want) <= 1e-5 * (1 + fabs(want)));
	}
	assert_float_equal(sc[7], 0.0f, 0.0);
	assert_int_equal(kvt_dsa_index_scores_ref(NULL, w, H, D, scale, keys, STRIDE, N, sc),
			 -EINVAL);
	assert_int_equal(kvt_dsa_index_scores_ref(q, w, H, D, scale, keys, D - 1, N, sc),
			 -EINVAL);
	assert_int_equal(kvt_dsa_index_scores_ref(q, w, 0, D, scale, keys, STRIDE, N, sc),
			 -EINVAL);
}

static void
test_select_errors(void **st)
{
	const struct kvt_test_kv_shape s = { 4, 2, 8, 4, 20, 0 };
	struct kvt_test_kv b;
	uint64_t rng = 3;
	float scratch[64], out[32];
	uint32_t blocks[3] = { 0, 2, 4 }, bad[2] = { 2, 1 }, past = 5, dup[2] = { 1, 1 };
	struct kvt_paged_kv kv;
	struct kvt_paged_latent lk;

	(void)st;
	kvt_test_kv_build(&b, &s, KVT_DTYPE_F32, &rng);
	kv = b.kv;
	assert_int_equal(kvt_attn_select_ref(&kv, b.q, 4, 20, blocks, 3, scratch, out), 0);
	assert_int_equal(kvt_attn_select_ref(&kv, b.q, 4, 20, blocks, 0, scratch, out), -EINVAL);
	assert_int_equal(kvt_attn_select_ref(&kv, b.q, 4, 20, NULL, 1, scratch, out), -EINVAL);
	assert_int_equal(kvt_attn_select_ref(&kv, b.q, 4, 20, bad, 2, scratch, out), -EINVAL);
	assert_int_equal(kvt_attn_select_ref(&kv, b.q, 4, 20, dup, 2, scratch, out), -EINVAL);
	assert_int_equal(kvt_attn_select_ref(&kv, b.q, 4, 20, &past, 1, scratch, out), -EINVAL);
	assert_int_equal(kvt_attn_select_ref(&kv, b.q, 3, 20, blocks, 3, scratch, out), -EINVAL);
	assert_int_equal(kvt_attn_select_ref(&kv, b.q, 4, 0, blocks, 1, scratch, out), -EINVAL);
	assert_int_equal(kvt_attn_select_ref(NULL, b.q, 4, 20, blocks, 3, scratch, out), -EINVAL);
	kv.seq_len = 19;
	assert_int_equal(kvt_attn_select_ref(&kv, b.q, 4, 20, blocks, 3, scratch, out), -EINVAL);
	kv.seq_len = 0;
	kv.dtype = KVT_DTYPE_INT8;
	assert_int_equal(kvt_attn_select_ref(&kv, b.q, 4, 20, blocks, 3, scratch, out), -EINVAL);
	lk = (struct kvt_paged_latent){ .base = b.kv.k_base, .block_stride = b.kv.block_stride,
					.token_stride = b.kv.token_stride, .table = b.table,
					.tokens_per_block = 4, .kv_lora_rank = 12, .rope_dim = 4,
					.dtype = KVT_DTYPE_F32 };
	assert_int_equal(kvt_attn_latent_select_ref(&lk, b.q, b.q, 2, 20, blocks, 3, 0.5f,
						    scratch, out), 0);
	assert_int_equal(kvt_attn_latent_select_ref(&lk, b.q, NULL, 2, 20, blocks, 3, 0.5f,
						    scratch, out), -EINVAL);
	assert_int_equal(kvt_attn_latent_select_ref(&lk, b.q, b.q, 2, 20, blocks, 3, -1.0f,
						    scratch, out), -EINVAL);
	assert_int_equal(kvt_attn_latent_select_ref(&lk, b.q, b.q, 2, 20, bad, 2, 0.5f, scratch,
						    out), -EINVAL);
	lk.token_stride = 8;
	assert_int_equal(kvt_attn_latent_select_ref(&lk, b.q, b.q, 2, 20, blocks, 3, 0.5f,
						    scratch, out), -EINVAL);
	kvt_test_kv_free(&b);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_select_gqa),
		cmocka_unit_test(test_select_latent),
		cmocka_unit_test(test_quest),
		cmocka_unit_test(test_topk_blocks),
		cmocka_unit_test(test_select_errors),
		cmocka_unit_test(test_tokens_latent),
		cmocka_unit_test(test_dsa_index_scores),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
