/* SPDX-License-Identifier: MIT */
/*
 * kernels/sparse_ref.c - C reference of attention over selected blocks and of the Quest page
 * summary and score (see sparse.h).
 *
 * The selected tokens are walked block by block in the order of the list (ascending), and
 * within a block in position order, skipping positions past the sequence or outside the
 * window; each pass over them (scores, then the weighted sum of V) repeats that walk, so no
 * per-token list is kept. Scores, softmax and the weighted sum are kvt_attn_decode_ref()'s
 * (llama2.c's) operations in the same order.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "tiers/base/error.h"
#include "kernels/sparse.h"

/* The paging of one layer as the selection needs it. */
struct sel_pg {
	const unsigned char *base;
	uint64_t block_stride, token_stride;
	const uint32_t *table, *pos;
	uint32_t n_entries, tpb;
	enum kvt_dtype dtype;
	uint64_t seq_len, sink_end, win_begin; /* visible: t < sink_end or t >= win_begin */
};

static inline float
sel_elem(enum kvt_dtype dt, const unsigned char *p, uint32_t i)
{
	float f;
	uint16_t h;

	if (dt == KVT_DTYPE_F32) {
		memcpy(&f, p + (size_t)i * 4, 4);
		return f;
	}
	memcpy(&h, p + (size_t)i * 2, 2);
	return dt == KVT_DTYPE_F16 ? kvt_f16_to_f32(h) : kvt_bf16_to_f32(h);
}

static int
sel_esize(enum kvt_dtype dt, size_t *esize)
{
	if (dt == KVT_DTYPE_F32)
		*esize = 4;
	else if (dt == KVT_DTYPE_F16 || dt == KVT_DTYPE_BF16)
		*esize = 2;
	else
		return kvt_err(-EINVAL, "sparse attention: unsupported K/V dtype %d", (int)dt);
	return 0;
}

/* Table entry of block b: b itself, or its index in pos (binary search). -1 when absent. */
static int64_t
sel_entry(const struct sel_pg *pg, uint64_t b)
{
	uint32_t lo = 0, hi = pg->n_entries, mid;

	if (!pg->pos)
		return (int64_t)b;
	while (lo < hi) {
		mid = lo + (hi - lo) / 2;
		if (pg->pos[mid] < b)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < pg->n_entries && pg->pos[lo] == b ? (int64_t)lo : -1;
}

/* Check pos (strictly ascending) and every listed block (in the sequence, in pos). */
static int
sel_check_blocks(const struct sel_pg *pg, const uint32_t *blocks, uint32_t n_blocks,
		 int ascending)
{
	const uint64_t nb = (pg->seq_len + pg->tpb - 1) / pg->tpb;

	if (!blocks || !n_blocks)
		return kvt_err(-EINVAL, "sparse attention: NULL block list or n_blocks 0");
	if (pg->pos) {
		if (!pg->n_entries)
			return kvt_err(-EINVAL, "sparse attention: block positions with "
				       "n_entries 0");
		for (uint32_t i = 1; i < pg->n_entries; i++)
			if (pg->pos[i] <= pg->pos[i - 1])
				return kvt_err(-EINVAL, "sparse attention: block positions not "
					       "strictly ascending at entry %u", i);
	}
	for (uint32_t i = 0; i < n_blocks; i++) {
		if (blocks[i] >= nb)
			return kvt_err(-EINVAL, "sparse attention: block %u past the sequence "
				       "(%llu blocks)", blocks[i], (unsigned long long)nb);
		if (ascending && i && blocks[i] <= blocks[i - 1])
			return kvt_err(-EINVAL, "sparse attention: selected blocks not strictly "
				       "ascending at %u (%u after %u)", i, blocks[i],
				       blocks[i - 1]);
		if (sel_entry(pg, blocks[i]) < 0)
			return kvt_err(-EINVAL, "sparse attention: selected block %u is not in the "
				       "table's block positions", blocks[i]);
	}
	return 0;
}

/* Tokens [*t0, *t1) of block b that exist; the row of token t. */
static inline void
sel_block_range(const struct sel_pg *pg, uint64_t b, uint64_t *t0, uint64_t *t1)
{
	*t0 = b * pg->tpb;
	*t1 = *t0 + pg->tpb < pg->seq_len ? *t0 + pg->tpb : pg->seq_len;
}

static inline int
sel_visible(const struct sel_pg *pg, uint64_t t)
{
	return t < pg->sink_end || t >= pg->win_begin;
}

static inline const unsigned char *
sel_row(const struct sel_pg *pg, uint64_t slot, uint64_t t)
{
	return pg->base + slot * pg->block_stride + (t % pg->tpb) * pg->token_stride;
}

/* Softmax of att[0..n) in place, as kvt_attn_decode_ref (llama2.c). n >= 1. */
static void
sel_softmax(float *att, uint64_t n)
{
	float max_val = att[0], sum = 0.0f;
	uint64_t t;

	for (t = 1; t < n; t++)
		if (att[t] > max_val)
			max_val = att[t];
	for (t = 0; t < n; t++) {
		att[t] = expf(att[t] - max_val);
		sum += att[t];
	}
	for (t = 0; t < n; t++)
		att[t] /= sum;
}

static void
sel_pg_fill(struct sel_pg *pg, const void *base, uint64_t block_stride, uint64_t token_stride,
	    const uint32_t *table, const uint32_t *pos, uint32_t n_entries, uint32_t tpb,
	    enum kvt_dtype dt, uint64_t seq_len, uint64_t window, uint64_t sink)
{
	pg->base = base;
	pg->block_stride = block_stride;
	pg->token_stride = token_stride;
	pg->table = table;
	pg->pos = pos;
	pg->n_entries = n_entries;
	pg->tpb = tpb;
	pg->dtype = dt;
	pg->seq_len = seq_len;
	kvt_attn_visible(window, sink, seq_len, &pg->sink_end, &pg->win_begin);
}

int
kvt_attn_select_ref(const struct kvt_paged_kv *kv, const float *q, uint32_t n_heads,
		    uint64_t seq_len, const uint32_t *blocks, uint32_t n_blocks, float *scratch,
		    float *out)
{
	struct sel_pg pg;
	size_t esize = 0;
	int rc;

	if (!kv || !q || !scratch || !out)
		return kvt_err(-EINVAL, "sparse attention: NULL kv, q, scratch or out");
	if (!kv->k_base || !kv->table)
		return kvt_err(-EINVAL, "sparse attention: NULL k_base or block table");
	if ((rc = sel_esize(kv->dtype, &esize)) != 0)
		return rc;
	if (!n_heads || !kv->n_kv_heads || n_heads % kv->n_kv_heads)
		return kvt_err(-EINVAL, "sparse attention: n_heads %u must be a positive multiple "
			       "of n_kv_heads %u", n_heads, kv->n_kv_heads);
	if (!kv->head_dim || !kv->tokens_per_block || !seq_len)
		return kvt_err(-EINVAL, "sparse attention: head_dim %u, tokens_per_block %u, "
			       "seq_len %llu must be > 0", kv->head_dim, kv->tokens_per_block,
			       (unsigned long long)seq_len);
	if (kv->token_stride < (uint64_t)kv->n_kv_heads * kv->head_dim * esize)
		return kvt_err(-EINVAL, "sparse attention: token_stride %llu < one token's K",
			       (unsigned long long)kv->token_stride);
	if (kv->seq_len && kv->seq_len != seq_len)
		return kvt_err(-EINVAL, "sparse attention: kv->seq_len %llu differs from seq_len "
			       "%llu", (unsigned long long)kv->seq_len,
			       (unsigned long long)seq_len);
	sel_pg_fill(&pg, kv->k_base, kv->block_stride, kv->token_stride, kv->table, kv->pos,
		    kv->n_entries, kv->tokens_per_block, kv->dtype, seq_len, kv->window, kv->sink);
	if ((rc = sel_check_blocks(&pg, blocks, n_blocks, 1)) != 0)
		return rc;

	const uint32_t d = kv->head_dim, kv_mul = n_heads / kv->n_kv_heads;
	const enum kvt_dtype dt = kv->dtype;

	for (uint32_t h = 0; h < n_heads; h++) {
		const float *qh = q + (size_t)h * d;
		const uint64_t hoff = (uint64_t)(h / kv_mul) * d * esize;
		float *o = out + (size_t)h * d;
		uint64_t n = 0, t, t0, t1;

		for (uint32_t bi = 0; bi < n_blocks; bi++) {
			uint64_t slot = pg.table[sel_entry(&pg, blocks[bi])];

			sel_block_range(&pg, blocks[bi], &t0, &t1);
			for (t = t0; t < t1; t++) {
				const unsigned char *k = sel_row(&pg, slot, t) + hoff;
				float score = 0.0f;

				if (!sel_visible(&pg, t))
					continue;
				for (uint32_t i = 0; i < d; i++)
					score += qh[i] * sel_elem(dt, k, i);
				score /= sqrtf((float)d);
				scratch[n++] = score;
			}
		}
		memset(o, 0, (size_t)d * sizeof(float));
		if (!n)
			continue;
		sel_softmax(scratch, n);
		n = 0;
		for (uint32_t bi = 0; bi < n_blocks; bi++) {
			uint64_t slot = pg.table[sel_entry(&pg, blocks[bi])];

			sel_block_range(&pg, blocks[bi], &t0, &t1);
			for (t = t0; t < t1; t++) {
				const unsigned char *v;
				float a;

				if (!sel_visible(&pg, t))
					continue;
				v = sel_row(&pg, slot, t) + hoff + kv->v_offset;
				a = scratch[n++];
				for (uint32_t i = 0; i < d; i++)
					o[i] += a * sel_elem(dt, v, i);
			}
		}
	}
	return 0;
}

int
kvt_attn_latent_select_ref(const struct kvt_paged_latent *kv, const float *q_lat,
			   const float *q_pe, uint32_t n_heads, uint64_t seq_len,
			   const uint32_t *blocks, uint32_t n_blocks, float scale, float *scratch,
			   float *out)
{
	struct sel_pg pg;
	size_t esize = 0;
	int rc;

	if (!kv || !q_lat || !scratch || !out)
		return kvt_err(-EINVAL, "sparse latent attention: NULL kv, q_lat, scratch or out");
	if (!kv->base || !kv->table)
		return kvt_err(-EINVAL, "sparse latent attention: NULL base or block table");
	if (kv->rope_dim && !q_pe)
		return kvt_err(-EINVAL, "sparse latent attention: NULL q_pe with rope_dim %u",
			       kv->rope_dim);
	if ((rc = sel_esize(kv->dtype, &esize)) != 0)
		return rc;
	if (!n_heads || !kv->kv_lora_rank || !kv->tokens_per_block || !seq_len)
		return kvt_err(-EINVAL, "sparse latent attention: n_heads %u, kv_lora_rank %u, "
			       "tokens_per_block %u, seq_len %llu must be > 0", n_heads,
			       kv->kv_lora_rank, kv->tokens_per_block, (unsigned long long)seq_len);
	if (kv->token_stride < ((uint64_t)kv->kv_lora_rank + kv->rope_dim) * esize)
		return kvt_err(-EINVAL, "sparse latent attention: token_stride %llu < one latent "
			       "vector", (unsigned long long)kv->token_stride);
	if (!(scale > 0.0f) || !isfinite(scale))
		return kvt_err(-EINVAL, "sparse latent attention: scale %g must be finite and > 0",
			       (double)scale);
	if (kv->seq_len && kv->seq_len != seq_len)
		return kvt_err(-EINVAL, "sparse latent attention: kv->seq_len %llu differs from "
			       "seq_len %llu", (unsigned long long)kv->seq_len,
			       (unsigned long long)seq_len);
	sel_pg_fill(&pg, kv->base, kv->block_stride, kv->token_stride, kv->table, kv->pos,
		    kv->n_entries, kv->tokens_per_block, kv->dtype, seq_len, kv->window, kv->sink);
	if ((rc = sel_check_blocks(&pg, blocks, n_blocks, 1)) != 0)
		return rc;

	const uint32_t r = kv->kv_lora_rank, pe = kv->rope_dim;
	const enum kvt_dtype dt = kv->dtype;

	for (uint32_t h = 0; h < n_heads; h++) {
		const float *ql = q_lat + (size_t)h * r;
		const float *qp = q_pe ? q_pe + (size_t)h * pe : NULL;
		float *o = out + (size_t)h * r;
		uint64_t n = 0, t, t0, t1;

		for (uint32_t bi = 0; bi < n_blocks; bi++) {
			uint64_t slot = pg.table[sel_entry(&pg, blocks[bi])];

			sel_block_range(&pg, blocks[bi], &t0, &t1);
			for (t = t0; t < t1; t++) {
				const unsigned char *c = sel_row(&pg, slot, t);
				float score = 0.0f;

				if (!sel_visible(&pg, t))
					continue;
				for (uint32_t i = 0; i < r; i++)
					score += ql[i] * sel_elem(dt, c, i);
				for (uint32_t i = 0; i < pe; i++)
					score += qp[i] * sel_elem(dt, c, r + i);
				score *= scale;
				scratch[n++] = score;
			}
		}
		memset(o, 0, (size_t)r * sizeof(float));
		if (!n)
			continue;
		sel_softmax(scratch, n);
		n = 0;
		for (uint32_t bi = 0; bi < n_blocks; bi++) {
			uint64_t slot = pg.table[sel_entry(&pg, blocks[bi])];

			sel_block_range(&pg, blocks[bi], &t0, &t1);
			for (t = t0; t < t1; t++) {
				const unsigned char *c;
				float a;

				if (!sel_visible(&pg, t))
					continue;
				c = sel_row(&pg, slot, t);
				a = scratch[n++];
				for (uint32_t i = 0; i < r; i++)
					o[i] += a * sel_elem(dt, c, i);
			}
		}
	}
	return 0;
}

/* ---- DSA: explicit token lists ------------------------------------------------------------ */

/* The row of token t (its block checked to be in the table). */
static inline const unsigned char *
sel_token_row(const struct sel_pg *pg, uint64_t t)
{
	return sel_row(pg, pg->table[sel_entry(pg, t / pg->tpb)], t);
}

/* One head of the absorbed MLA over the listed tokens (n >= 1), attn_latent_head's order. */
static void
sel_latent_tokens_head(const struct sel_pg *pg, const uint32_t *tokens, uint32_t n, uint32_t r,
		       uint32_t pe, const float *ql, const float *qp,
		       float scale, float *att, float *out, float *m, float *l)
{
	float max_val, sum = 0.0f;

	for (uint32_t j = 0; j < n; j++) {
		const unsigned char *c = sel_token_row(pg, tokens[j]);
		float score = 0.0f;

		for (uint32_t i = 0; i < r; i++)
			score += ql[i] * sel_elem(pg->dtype, c, i);
		for (uint32_t i = 0; i < pe; i++)
			score += qp[i] * sel_elem(pg->dtype, c, r + i);
		score *= scale;
		att[j] = score;
	}
	max_val = att[0];
	for (uint32_t j = 1; j < n; j++)
		if (att[j] > max_val)
			max_val = att[j];
	for (uint32_t j = 0; j < n; j++) {
		att[j] = expf(att[j] - max_val);
		sum += att[j];
	}
	for (uint32_t j = 0; j < n; j++)
		att[j] /= sum;
	*m = max_val;
	*l = sum;
	memset(out, 0, (size_t)r * sizeof(float));
	for (uint32_t j = 0; j < n; j++) {
		const unsigned char *c = sel_token_row(pg, tokens[j]);

		for (uint32_t i = 0; i < r; i++)
			out[i] += att[j] * sel_elem(pg->dtype, c, i);
	}
}

int
kvt_attn_latent_tokens_partial_ref(const struct kvt_paged_latent *kv, const float *q_lat,
				   const float *q_pe, uint32_t n_heads, const uint32_t *tokens,
				   uint32_t n_tokens, float scale, float *scratch, float *out,
				   float *m, float *l)
{
	struct sel_pg pg;
	size_t esize = 0;
	uint32_t r, pe;
	int rc;

	if (!kv || !q_lat || !scratch || !out || !m || !l || (n_tokens && !tokens))
		return kvt_err(-EINVAL, "token-list latent attention: NULL argument");
	if (!kv->base || !kv->table)
		return kvt_err(-EINVAL, "token-list latent attention: NULL base or block table");
	if (kv->rope_dim && !q_pe)
		return kvt_err(-EINVAL, "token-list latent attention: NULL q_pe with rope_dim %u",
			       kv->rope_dim);
	if ((rc = sel_esize(kv->dtype, &esize)) != 0)
		return rc;
	if (!n_heads || !kv->kv_lora_rank || !kv->tokens_per_block)
		return kvt_err(-EINVAL, "token-list latent attention: n_heads %u, kv_lora_rank %u, "
			       "tokens_per_block %u must be > 0", n_heads, kv->kv_lora_rank,
			       kv->tokens_per_block);
	if (kv->token_stride < ((uint64_t)kv->kv_lora_rank + kv->rope_dim) * esize)
		return kvt_err(-EINVAL, "token-list latent attention: token_stride %llu < one "
			       "latent vector", (unsigned long long)kv->token_stride);
	if (!(scale > 0.0f) || !isfinite(scale))
		return kvt_err(-EINVAL, "token-list latent attention: scale %g must be finite and "
			       "> 0", (double)scale);
	if (n_tokens == 0) {
		memset(out, 0, (size_t)n_heads * kv->kv_lora_rank * sizeof(float));
		for (uint32_t h = 0; h < n_heads; h++) {
			m[h] = -INFINITY;
			l[h] = 0.0f;
		}
		return 0;
	}
	/* seq_len only bounds the tokens; the visibility is the list (no window) */
	sel_pg_fill(&pg, kv->base, kv->block_stride, kv->token_stride, kv->table, kv->pos,
		    kv->n_entries, kv->tokens_per_block, kv->dtype,
		    kv->seq_len ? kv->seq_len : (uint64_t)tokens[n_tokens - 1] + 1, 0, 0);
	if (pg.pos) {
		if (!pg.n_entries)
			return kvt_err(-EINVAL, "token-list latent attention: block positions "
				       "with n_entries 0");
		for (uint32_t i = 1; i < pg.n_entries; i++)
			if (pg.pos[i] <= pg.pos[i - 1])
				return kvt_err(-EINVAL, "token-list latent attention: block "
					       "positions not strictly ascending at entry %u", i);
	}
	for (uint32_t j = 0; j < n_tokens; j++) {
		if (j && tokens[j] <= tokens[j - 1])
			return kvt_err(-EINVAL, "token-list latent attention: tokens not strictly "
				       "ascending at %u (%u after %u)", j, tokens[j], tokens[j - 1]);
		if (tokens[j] >= pg.seq_len)
			return kvt_err(-EINVAL, "token-list latent attention: token %u past the "
				       "sequence (%llu)", tokens[j], (unsigned long long)pg.seq_len);
		if (sel_entry(&pg, tokens[j] / pg.tpb) < 0)
			return kvt_err(-EINVAL, "token-list latent attention: the block of token %u "
				       "is not in the table's block positions", tokens[j]);
	}
	r = kv->kv_lora_rank;
	pe = kv->rope_dim;
	for (uint32_t h = 0; h < n_heads; h++)
		sel_latent_tokens_head(&pg, tokens, n_tokens, r, pe, q_lat + (size_t)h * r,
				       q_pe ? q_pe + (size_t)h * pe : NULL, scale, scratch,
				       out + (size_t)h * r, &m[h], &l[h]);
	return 0;
}

int
kvt_dsa_index_scores_ref(const float *q, const float *w, uint32_t n_heads, uint32_t head_dim,
			 float scale, const float *keys, uint64_t key_stride, uint64_t n,
			 float *scores)
{
	if (!q || !w || !scores || (n && !keys))
		return kvt_err(-EINVAL, "DSA index scores: NULL argument");
	if (!n_heads || !head_dim || key_stride < head_dim)
		return kvt_err(-EINVAL, "DSA index scores: n_heads %u, head_dim %u must be > 0 and "
			       "key_stride %llu >= head_dim", n_heads, head_dim,
			       (unsigned long long)key_stride);
	for (uint64_t t = 0; t < n; t++) {
		const float *k = keys + t * key_stride;
		float s = 0.0f;

		for (uint32_t h = 0; h < n_heads; h++) {
			const float *qh = q + (size_t)h * head_dim;
			float d = 0.0f;

			for (uint32_t i = 0; i < head_dim; i++)
				d += qh[i] * k[i];
			d *= scale;
			s += w[h] * (d > 0.0f ? d : 0.0f);
		}
		scores[t] = s;
	}
	return 0;
}

/* ---- Quest -------------------------------------------------------------------------------- */

size_t
kvt_quest_summary_floats(uint32_t n_kv_heads, uint32_t head_dim)
{
	return (size_t)n_kv_heads * 2 * head_dim;
}

int
kvt_quest_summary_ref(const struct kvt_paged_kv *kv, uint64_t seq_len, const uint32_t *blocks,
		      uint32_t n_blocks, float *summary)
{
	struct sel_pg pg;
	size_t esize = 0;
	int rc;

	if (!kv || !summary || !kv->k_base || !kv->table)
		return kvt_err(-EINVAL, "quest summary: NULL kv, summary, k_base or table");
	if ((rc = sel_esize(kv->dtype, &esize)) != 0)
		return rc;
	if (!kv->n_kv_heads || !kv->head_dim || !kv->tokens_per_block || !seq_len)
		return kvt_err(-EINVAL, "quest summary: n_kv_heads %u, head_dim %u, "
			       "tokens_per_block %u, seq_len %llu must be > 0", kv->n_kv_heads,
			       kv->head_dim, kv->tokens_per_block, (unsigned long long)seq_len);
	if (kv->token_stride < (uint64_t)kv->n_kv_heads * kv->head_dim * esize)
		return kvt_err(-EINVAL, "quest summary: token_stride %llu < one token's K",
			       (unsigned long long)kv->token_stride);
	sel_pg_fill(&pg, kv->k_base, kv->block_stride, kv->token_stride, kv->table, kv->pos,
		    kv->n_entries, kv->tokens_per_block, kv->dtype, seq_len, 0, 0);
	if ((rc = sel_check_blocks(&pg, blocks, n_blocks, 0)) != 0)
		return rc;

	const uint32_t d = kv->head_dim, nkv = kv->n_kv_heads;

	for (uint32_t bi = 0; bi < n_blocks; bi++) {
		uint64_t slot = pg.table[sel_entry(&pg, blocks[bi])], t0, t1;
		float *sb = summary + bi * kvt_quest_summary_floats(nkv, d);

		sel_block_range(&pg, blocks[bi], &t0, &t1);
		for (uint32_t kh = 0; kh < nkv; kh++) {
			float *mn = sb + (size_t)kh * 2 * d, *mx = mn + d;
			const uint64_t hoff = (uint64_t)kh * d * esize;

			for (uint64_t t = t0; t < t1; t++) {
				const unsigned char *k = sel_row(&pg, slot, t) + hoff;

				for (uint32_t i = 0; i < d; i++) {
					float x = sel_elem(pg.dtype, k, i);

					/* the first token sets both; a NaN, once in, stays (x < NaN
					 * and x > NaN are false) */
					if (t == t0 || x < mn[i] || x != x)
						mn[i] = x;
					if (t == t0 || x > mx[i] || x != x)
						mx[i] = x;
				}
			}
		}
	}
	return 0;
}

int
kvt_quest_score_ref(const float *summary, uint32_t n_blocks, uint32_t n_kv_heads,
		    uint32_t head_dim, const float *q, uint32_t n_heads, float *scores)
{
	if (!summary || !q || !scores)
		return kvt_err(-EINVAL, "quest score: NULL summary, q or scores");
	if (!n_blocks || !n_kv_heads || !head_dim || !n_heads || n_heads % n_kv_heads)
		return kvt_err(-EINVAL, "quest score: n_blocks %u, n_kv_heads %u, head_dim %u must "
			       "be > 0 and n_heads %u a multiple of n_kv_heads", n_blocks,
			       n_kv_heads, head_dim, n_heads);

	const uint32_t kv_mul = n_heads / n_kv_heads;
	const size_t per_block = kvt_quest_summary_floats(n_kv_heads, head_dim);

	for (uint32_t h = 0; h < n_heads; h++) {
		const float *qh = q + (size_t)h * head_dim;

		for (uint32_t b = 0; b < n_blocks; b++) {
			const float *mn =
				summary + b * per_block + (size_t)(h / kv_mul) * 2 * head_dim;
			const float *mx = mn + head_dim;
			float s = 0.0f;

			for (uint32_t i = 0; i < head_dim; i++) {
				float lo = qh[i] * mn[i], hi = qh[i] * mx[i];

				s += hi > lo || hi != hi ? hi : lo; /* a NaN in either propagates */
			}
			scores[(size_t)h * n_blocks + b] = s;
		}
	}
	return 0;
}

int
kvt_topk_blocks(const float *scores, uint32_t n, uint32_t k, uint32_t *out)
{
	uint32_t m, c = 0;

	if (!scores || !out || !n || !k)
		return kvt_err(-EINVAL, "top-k blocks: NULL pointer, n %u or k %u 0", n, k);
	m = k < n ? k : n;
	/*
	 * Block i is chosen when fewer than m blocks beat it: j beats i when its score is
	 * higher, or equal with a lower index (NaN lowest). O(n^2) worst case, fine for tests.
	 */
	for (uint32_t i = 0; i < n && c < m; i++) {
		uint32_t better = 0;

		for (uint32_t j = 0; j < n && better < m; j++) {
			float a = scores[j], b = scores[i];
			int a_nan = a != a, b_nan = b != b;

			if (j == i)
				continue;
			if (b_nan ? (!a_nan || j < i) : (!a_nan && (a > b || (a == b && j < i))))
				better++;
		}
		if (better < m)
			out[c++] = i;
	}
	return (int)c;
}
