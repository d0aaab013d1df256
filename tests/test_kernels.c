/* SPDX-License-Identifier: MIT */
/*
 * tests/test_kernels.c - the C reference of paged decode attention (kernels/attention_ref.c)
 * against a plain contiguous-KV loop written here exactly as llama2.c's run.c writes it, on
 * random inputs laid out in kvtier's block-first geometry behind scrambled block tables; the
 * split-KV partial/merge; the fp16/bf16 conversions; argument checks. In CUDA builds (when the
 * build passes KVT_WITH_CUDA to tests) also the launchers' host-side argument checks.
 *
 * Unwritten bytes of the fake HBM are 0xff, a NaN in every dtype, so reading a wrong address
 * turns the output into NaN and fails the bit-exact comparisons.
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
#include "kernels/gather.h"
#include "kernels/quant.h"
#include "support/kv_fixture.h"
#ifdef KVT_WITH_CUDA
#include "kernels/kernels_cuda.h"
#endif

/* ---- helpers ------------------------------------------------------------------------------ */

static uint32_t
tk_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

static float
tk_float(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

/* llama2.c softmax(), verbatim in structure. */
static void
tk_softmax(float *x, int size)
{
	float max_val = x[0], sum = 0.0f;
	int i;

	for (i = 1; i < size; i++)
		if (x[i] > max_val)
			max_val = x[i];
	for (i = 0; i < size; i++) {
		x[i] = expf(x[i] - max_val);
		sum += x[i];
	}
	for (i = 0; i < size; i++)
		x[i] /= sum;
}

/*
 * llama2.c's attention for one position: key_cache/value_cache [seq_len][kv_dim] contiguous,
 * pos = seq_len - 1, att [seq_len] scratch, out [n_heads][head_size]. Also returns each head's
 * max score in maxs (may be NULL).
 */
static void
tk_llama2(const float *q, const float *key_cache, const float *value_cache, int n_heads,
	  int n_kv_heads, int head_size, int seq_len, float *att, float *out, float *maxs)
{
	int kv_dim = n_kv_heads * head_size, kv_mul = n_heads / n_kv_heads, pos = seq_len - 1;
	int h, t, i;

	for (h = 0; h < n_heads; h++) {
		const float *qh = q + h * head_size;
		float *xb = out + h * head_size;

		for (t = 0; t <= pos; t++) {
			const float *k = key_cache + t * kv_dim + (h / kv_mul) * head_size;
			float score = 0.0f;

			for (i = 0; i < head_size; i++)
				score += qh[i] * k[i];
			score /= sqrtf(head_size);
			att[t] = score;
		}
		if (maxs) {
			maxs[h] = att[0];
			for (t = 1; t <= pos; t++)
				maxs[h] = att[t] > maxs[h] ? att[t] : maxs[h];
		}
		tk_softmax(att, pos + 1);
		memset(xb, 0, (size_t)head_size * sizeof(float));
		for (t = 0; t <= pos; t++) {
			const float *v = value_cache + t * kv_dim + (h / kv_mul) * head_size;
			float a = att[t];

			for (i = 0; i < head_size; i++)
				xb[i] += a * v[i];
		}
	}
}


static const struct kvt_test_kv_shape tk_shapes[] = {
	{ 8, 4, 8, 1, 37, 0 },     { 8, 4, 8, 16, 37, 0 },   { 8, 4, 8, 7, 50, 12 },
	{ 32, 8, 128, 16, 100, 0 }, { 32, 8, 128, 7, 33, 0 }, { 32, 8, 128, 1, 20, 4 },
	{ 4, 4, 16, 16, 16, 0 },    { 8, 1, 32, 7, 1, 0 },
};


/* ---- attention ---------------------------------------------------------------------------- */

/*
 * out: kvt_attn_decode_ref() on b; want: the llama2.c loop over the stored values widened back;
 * want_f32: the same loop over the fp32 values before storage. All [n_heads][head_dim].
 */
static void
tk_run(const struct kvt_test_kv_shape *s, struct kvt_test_kv *b, float *out, float *want,
       float *want_f32)
{
	float *scratch = malloc(s->seq_len * sizeof(float)); /* exactly seq_len: ASan checks */
	float *att = malloc(s->seq_len * sizeof(float));

	assert_true(scratch && att);
	assert_int_equal(kvt_attn_decode_ref(&b->kv, b->q, s->n_heads, s->seq_len, scratch, out),
			 0);
	/* contiguous loop over the widened stored values, and over the original fp32 values */
	tk_llama2(b->q, b->kw, b->vw, (int)s->n_heads, (int)s->n_kv_heads, (int)s->head_dim,
		  (int)s->seq_len, att, want, NULL);
	tk_llama2(b->q, b->kf, b->vf, (int)s->n_heads, (int)s->n_kv_heads, (int)s->head_dim,
		  (int)s->seq_len, att, want_f32, NULL);
	free(scratch);
	free(att);
}

static void
test_decode_matches_llama2(void **state)
{
	static const enum kvt_dtype dts[] = { KVT_DTYPE_F32, KVT_DTYPE_F16, KVT_DTYPE_BF16 };
	static const double tol[] = { 0.0, 2e-3, 1e-2 }; /* of max |out|; ~5x observed */
	uint64_t rng = 42;
	size_t si, di;

	(void)state;
	for (si = 0; si < sizeof tk_shapes / sizeof tk_shapes[0]; si++) {
		for (di = 0; di < 3; di++) {
			const struct kvt_test_kv_shape *s = &tk_shapes[si];
			size_t n = (size_t)s->n_heads * s->head_dim;
			float *out = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
			float *want32 = malloc(n * sizeof(float));
			struct kvt_test_kv b;

			assert_true(out && want && want32);
			kvt_test_kv_build(&b, s, dts[di], &rng);
			tk_run(s, &b, out, want, want32);
			/* bit-identical to llama2.c's loop over what is stored */
			if (memcmp(out, want, n * sizeof(float)))
				fail_msg("shape %zu dtype %d: not bit-identical (relerr %g)", si,
					 (int)dts[di], kvt_test_kv_relerr(out, want, n));
			if (dts[di] == KVT_DTYPE_F32)
				assert_memory_equal(out, want32, n * sizeof(float));
			else if (!(kvt_test_kv_relerr(out, want32, n) <= tol[di]))
				fail_msg("shape %zu dtype %d: relerr %g vs fp32 > %g", si,
					 (int)dts[di], kvt_test_kv_relerr(out, want32, n), tol[di]);
			assert_true(kvt_test_kv_maxabs(out, n) > 0.0f);
			if (getenv("TK_DEBUG"))
				print_message("shape %zu dtype %d relerr vs fp32 %g\n", si,
					      (int)dts[di], kvt_test_kv_relerr(out, want32, n));
			kvt_test_kv_free(&b);
			free(out);
			free(want);
			free(want32);
		}
	}
}

/* Splits [0, n) at the cuts (ascending, in (0, n)); merges the partials; compares to decode. */
static void
tk_check_split(const struct kvt_test_kv_shape *s, struct kvt_test_kv *b, const float *full,
	       const uint64_t *cuts, size_t n_cuts)
{
	size_t n = (size_t)s->n_heads * s->head_dim, c;
	float *oa = malloc(n * sizeof(float)), *ob = malloc(n * sizeof(float));
	float *ma = malloc(s->n_heads * sizeof(float)), *la = malloc(s->n_heads * sizeof(float));
	float *mb = malloc(s->n_heads * sizeof(float)), *lb = malloc(s->n_heads * sizeof(float));
	float *scratch = malloc(s->seq_len * sizeof(float));
	uint64_t t0 = 0, t1;

	assert_true(oa && ob && ma && la && mb && lb && scratch);
	for (c = 0; c <= n_cuts; c++) {
		t1 = c < n_cuts ? cuts[c] : s->seq_len;
		assert_int_equal(kvt_attn_partial_ref(&b->kv, b->q, s->n_heads, t0, t1, scratch,
						      c ? ob : oa, c ? mb : ma, c ? lb : la), 0);
		if (c)
			kvt_attn_merge(s->n_heads, s->head_dim, oa, ma, la, ob, mb, lb);
		t0 = t1;
	}
	if (getenv("TK_DEBUG"))
		print_message("%zu cuts: relerr %g\n", n_cuts, kvt_test_kv_relerr(oa, full, n));
	if (!(kvt_test_kv_relerr(oa, full, n) <= 1e-5))
		fail_msg("%zu cuts: merged relerr %g > 1e-5", n_cuts,
			 kvt_test_kv_relerr(oa, full, n));
	free(oa);
	free(ob);
	free(ma);
	free(la);
	free(mb);
	free(lb);
	free(scratch);
}

static void
test_partial_merge(void **state)
{
	uint64_t rng = 7, cuts[128];
	size_t si, nc, i;

	(void)state;
	for (si = 0; si < sizeof tk_shapes / sizeof tk_shapes[0]; si++) {
		const struct kvt_test_kv_shape *s = &tk_shapes[si];
		size_t n = (size_t)s->n_heads * s->head_dim;
		float *full = malloc(n * sizeof(float)), *o = malloc(n * sizeof(float));
		float *m = malloc(s->n_heads * sizeof(float));
		float *l = malloc(s->n_heads * sizeof(float));
		float *maxs = malloc(s->n_heads * sizeof(float));
		float *att = malloc(s->seq_len * sizeof(float)), *want = malloc(n * sizeof(float));
		struct kvt_test_kv b;

		assert_true(full && o && m && l && maxs && att && want);
		kvt_test_kv_build(&b, s, KVT_DTYPE_F32, &rng);
		assert_int_equal(kvt_attn_decode_ref(&b.kv, b.q, s->n_heads, s->seq_len, att, full),
				 0);
		/* one window over everything: bit-identical to decode; m is the max score */
		assert_int_equal(kvt_attn_partial_ref(&b.kv, b.q, s->n_heads, 0, s->seq_len, att, o,
						      m, l), 0);
		assert_memory_equal(o, full, n * sizeof(float));
		tk_llama2(b.q, b.kf, b.vf, (int)s->n_heads, (int)s->n_kv_heads, (int)s->head_dim,
			  (int)s->seq_len, att, want, maxs);
		for (i = 0; i < s->n_heads; i++) {
			assert_true(tk_bits(m[i]) == tk_bits(maxs[i]));
			assert_true(l[i] >= 1.0f && l[i] <= (float)s->seq_len);
		}
		if (s->seq_len > 1) {
			cuts[0] = 1; /* {1, n-1} */
			tk_check_split(s, &b, full, cuts, 1);
			cuts[0] = s->seq_len - 1;
			tk_check_split(s, &b, full, cuts, 1);
			for (nc = 0; nc + 1 < s->seq_len && nc < 128; nc++) /* windows of one */
				cuts[nc] = nc + 1;
			tk_check_split(s, &b, full, cuts, nc);
			for (nc = 0; (nc + 1) * s->tpb < s->seq_len && nc < 128; nc++) /* blocks */
				cuts[nc] = (nc + 1) * s->tpb;
			tk_check_split(s, &b, full, cuts, nc);
			for (nc = 0, i = 1; i < s->seq_len && nc < 128; i++) /* random cuts */
				if (kvt_test_kv_rand(&rng) % 4 == 0)
					cuts[nc++] = i;
			tk_check_split(s, &b, full, cuts, nc);
		}
		kvt_test_kv_free(&b);
		free(full);
		free(o);
		free(m);
		free(l);
		free(maxs);
		free(att);
		free(want);
	}
}

static void
test_merge_symmetric(void **state)
{
	/* two hand-made partials: out must be the weighted mean, either order */
	float oa[2] = { 1.0f, -1.0f }, ma[1] = { 2.0f }, la[1] = { 3.0f };
	float ob[2] = { 0.0f, 4.0f }, mb[1] = { 2.0f + logf(2.0f) }, lb[1] = { 1.5f };
	float oa2[2] = { 0.0f, 4.0f }, ma2[1] = { 2.0f + logf(2.0f) }, la2[1] = { 1.5f };

	(void)state;
	/* weights: a 3, b 1.5 * e^(ln 2) = 3 relative to m = 2: mean of the two */
	kvt_attn_merge(1, 2, oa, ma, la, ob, mb, lb);
	kvt_attn_merge(1, 2, oa2, ma2, la2, (const float[]){ 1.0f, -1.0f }, (const float[]){ 2.0f },
		       (const float[]){ 3.0f });
	assert_float_equal(oa[0], 0.5f, 1e-6f);
	assert_float_equal(oa[1], 1.5f, 1e-6f);
	assert_float_equal(ma[0], 2.0f + logf(2.0f), 0.0f);
	assert_float_equal(la[0] * expf(ma[0] - 2.0f), 6.0f, 1e-5f);
	assert_float_equal(oa2[0], oa[0], 1e-6f);
	assert_float_equal(oa2[1], oa[1], 1e-6f);
	assert_float_equal(la2[0], la[0], 1e-6f);
}

/* ---- sliding window and sinks ------------------------------------------------------------- */

/* (window, sink) pairs the window tests sweep; window 0 = full attention. */
static const uint64_t tk_windows[][2] = {
	{ 0, 0 }, { 1, 0 }, { 3, 0 }, { 7, 0 }, { 16, 0 }, { 17, 0 }, { 1, 1 }, { 5, 2 },
	{ 8, 4 }, { 16, 4 }, { 3, 9 }, { 1000, 0 }, { 20, 100 },
};

/* Rows of the visible positions of [t0, t1) from q gathered contiguously; returns their count. */
static uint32_t
tk_gather_visible(const struct kvt_test_kv_shape *s, const float *src, uint64_t window,
		  uint64_t sink, uint64_t q, uint64_t t0, uint64_t t1, float *dst)
{
	size_t kv_dim = (size_t)s->n_kv_heads * s->head_dim;
	uint32_t n = 0;

	for (uint64_t t = t0; t < t1; t++)
		if (kvt_test_visible(window, sink, q, t))
			memcpy(dst + kv_dim * n++, src + kv_dim * t, kv_dim * sizeof(float));
	return n;
}

static uint64_t
tk_count_visible(uint64_t window, uint64_t sink, uint64_t q, uint64_t t0, uint64_t t1)
{
	uint64_t n = 0;

	for (uint64_t t = t0; t < t1; t++)
		n += (uint64_t)kvt_test_visible(window, sink, q, t);
	return n;
}

/*
 * Decode with (window, sink) over a fixture whose invisible rows and blocks are NaN: equal bit
 * for bit to llama2.c's loop over the visible positions only, with the dense table and with a
 * table that lists only the blocks holding visible positions (pos), plus @extra live blocks
 * out of the window.
 */
static void
tk_window_case(const struct kvt_test_kv_shape *s, enum kvt_dtype dt, uint64_t window,
	       uint64_t sink, uint64_t *rng)
{
	size_t n = (size_t)s->n_heads * s->head_dim, kv_dim = (size_t)s->n_kv_heads * s->head_dim;
	float *out = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
	float *kc = malloc((size_t)s->seq_len * kv_dim * sizeof(float));
	float *vc = malloc((size_t)s->seq_len * kv_dim * sizeof(float));
	float *att = malloc(s->seq_len * sizeof(float));
	uint32_t *ctab = malloc((s->seq_len / s->tpb + 1) * sizeof(uint32_t));
	uint32_t *cpos = malloc((s->seq_len / s->tpb + 1) * sizeof(uint32_t));
	uint64_t q = s->seq_len - 1, nvis_bound;
	struct kvt_paged_kv kv;
	struct kvt_test_kv b;
	uint32_t nv, blk, ne = 0;
	float *scratch;

	assert_true(out && want && kc && vc && att && ctab && cpos);
	kvt_test_kv_build(&b, s, dt, rng);
	kvt_test_kv_poison(&b, window, sink, q);
	nv = tk_gather_visible(s, b.kw, window, sink, q, 0, s->seq_len, kc);
	assert_int_equal(tk_gather_visible(s, b.vw, window, sink, q, 0, s->seq_len, vc), nv);
	tk_llama2(b.q, kc, vc, (int)s->n_heads, (int)s->n_kv_heads, (int)s->head_dim, (int)nv,
		  att, want, NULL);
	/* scratch of exactly the visible count (ASan checks the documented bound) */
	nvis_bound = window ? (window + sink < s->seq_len ? window + sink : s->seq_len)
			    : s->seq_len;
	assert_true(nv <= nvis_bound);
	scratch = malloc(nv * sizeof(float));
	assert_non_null(scratch);
	kv = b.kv;
	kv.window = window;
	kv.sink = sink;
	assert_int_equal(kvt_attn_decode_ref(&kv, b.q, s->n_heads, s->seq_len, scratch, out), 0);
	if (memcmp(out, want, n * sizeof(float)))
		fail_msg("window %llu sink %llu seq %u tpb %u dtype %d: dense table not "
			 "bit-identical (relerr %g)", (unsigned long long)window,
			 (unsigned long long)sink, s->seq_len, s->tpb, (int)dt,
			 kvt_test_kv_relerr(out, want, n));
	/* only live blocks listed: visible ones, and every third other block (not yet dropped) */
	for (blk = 0; blk < b.n_blocks; blk++) {
		int vis = 0;

		for (uint64_t t = (uint64_t)blk * s->tpb; t < (uint64_t)(blk + 1) * s->tpb; t++)
			vis |= kvt_test_visible(window, sink, q, t);
		if (vis || blk % 3 == 0) {
			ctab[ne] = b.table[blk];
			cpos[ne++] = blk;
		}
	}
	kv.table = ctab;
	kv.pos = cpos;
	kv.n_entries = ne;
	memset(out, 0, n * sizeof(float));
	assert_int_equal(kvt_attn_decode_ref(&kv, b.q, s->n_heads, s->seq_len, scratch, out), 0);
	if (memcmp(out, want, n * sizeof(float)))
		fail_msg("window %llu sink %llu seq %u: block positions not bit-identical",
			 (unsigned long long)window, (unsigned long long)sink, s->seq_len);
	/* the one partial over everything is the decode, bit for bit */
	{
		float *m = malloc(s->n_heads * sizeof(float)), *l = malloc(s->n_heads * sizeof(float));
		float *o = malloc(n * sizeof(float));

		assert_true(m && l && o);
		assert_int_equal(kvt_attn_partial_ref(&kv, b.q, s->n_heads, 0, s->seq_len, scratch,
						      o, m, l), 0);
		assert_memory_equal(o, want, n * sizeof(float));
		free(m);
		free(l);
		free(o);
	}
	kvt_test_kv_free(&b);
	free(out);
	free(want);
	free(kc);
	free(vc);
	free(att);
	free(ctab);
	free(cpos);
	free(scratch);
}

static void
test_window_decode(void **state)
{
	static const enum kvt_dtype dts[] = { KVT_DTYPE_F32, KVT_DTYPE_F16, KVT_DTYPE_BF16 };
	uint64_t rng = 1601;

	(void)state;
	for (size_t si = 0; si < sizeof tk_shapes / sizeof tk_shapes[0]; si++)
		for (size_t wi = 0; wi < sizeof tk_windows / sizeof tk_windows[0]; wi++)
			tk_window_case(&tk_shapes[si], dts[(si + wi) % 3], tk_windows[wi][0],
				       tk_windows[wi][1], &rng);
}

/*
 * Streaming as a runner does it: the sequence in windows of @wb blocks, each a view listing
 * only its blocks (pos) with absolute positions and kv.seq_len set; windows with no visible
 * position give empty partials (l 0, m -inf, out 0) that the merge skips. The merged result
 * equals the one-shot decode within fp32 rounding.
 */
static void
tk_window_stream(const struct kvt_test_kv_shape *s, uint64_t window, uint64_t sink,
		 uint32_t wb, uint64_t *rng)
{
	size_t n = (size_t)s->n_heads * s->head_dim, h;
	float *full = malloc(n * sizeof(float)), *oa = malloc(n * sizeof(float));
	float *ob = malloc(n * sizeof(float)), *scratch = malloc(s->seq_len * sizeof(float));
	float *ma = malloc(s->n_heads * sizeof(float)), *la = malloc(s->n_heads * sizeof(float));
	float *mb = malloc(s->n_heads * sizeof(float)), *lb = malloc(s->n_heads * sizeof(float));
	uint32_t *wpos = malloc(wb * sizeof(uint32_t));
	struct kvt_paged_kv kv;
	struct kvt_test_kv b;
	int first = 1, empties = 0;

	assert_true(full && oa && ob && scratch && ma && la && mb && lb && wpos);
	kvt_test_kv_build(&b, s, KVT_DTYPE_F32, rng);
	kvt_test_kv_poison(&b, window, sink, s->seq_len - 1);
	kv = b.kv;
	kv.window = window;
	kv.sink = sink;
	assert_int_equal(kvt_attn_decode_ref(&kv, b.q, s->n_heads, s->seq_len, scratch, full), 0);
	kv.seq_len = s->seq_len;
	for (uint32_t ws = 0; ws < b.n_blocks; ws += wb) {
		uint32_t nb = b.n_blocks - ws < wb ? b.n_blocks - ws : wb;
		uint64_t t0 = (uint64_t)ws * s->tpb, t1 = (uint64_t)(ws + nb) * s->tpb;

		if (t1 > s->seq_len)
			t1 = s->seq_len;
		for (uint32_t i = 0; i < nb; i++)
			wpos[i] = ws + i;
		kv.table = b.table + ws;
		kv.pos = wpos;
		kv.n_entries = nb;
		assert_int_equal(kvt_attn_partial_ref(&kv, b.q, s->n_heads, t0, t1, scratch,
						      first ? oa : ob, first ? ma : mb,
						      first ? la : lb), 0);
		if (!tk_count_visible(window, sink, s->seq_len - 1, t0, t1)) {
			const float *o = first ? oa : ob, *m = first ? ma : mb, *l = first ? la : lb;

			empties++;
			for (h = 0; h < s->n_heads; h++)
				assert_true(l[h] == 0.0f && m[h] == -INFINITY && o[h * s->head_dim] == 0);
		}
		if (!first)
			kvt_attn_merge(s->n_heads, s->head_dim, oa, ma, la, ob, mb, lb);
		first = 0;
	}
	if (!(kvt_test_kv_relerr(oa, full, n) <= 1e-5))
		fail_msg("window %llu sink %llu, windows of %u blocks (%d empty): relerr %g",
			 (unsigned long long)window, (unsigned long long)sink, wb, empties,
			 kvt_test_kv_relerr(oa, full, n));
	kvt_test_kv_free(&b);
	free(full);
	free(oa);
	free(ob);
	free(scratch);
	free(ma);
	free(la);
	free(mb);
	free(lb);
	free(wpos);
}

static void
test_window_stream(void **state)
{
	static const struct kvt_test_kv_shape shapes[] = {
		{ 8, 4, 8, 4, 61, 0 }, { 8, 2, 16, 1, 30, 4 }, { 32, 8, 128, 16, 100, 0 },
	};
	uint64_t rng = 1602;

	(void)state;
	for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
		for (size_t wi = 0; wi < sizeof tk_windows / sizeof tk_windows[0]; wi++)
			for (uint32_t wb = 1; wb <= 3; wb++)
				tk_window_stream(&shapes[si], tk_windows[wi][0], tk_windows[wi][1],
						 wb, &rng);
}

/*
 * gpt-oss's learned sinks as attention.h says to apply them: merging the partial (o 0, m s_h,
 * l 1) into a head's partial equals softmax over [scores, s_h] with the sink's column dropped
 * (computed here in double), within fp32 rounding.
 */
static void
test_learned_sink_merge(void **state)
{
	static const struct kvt_test_kv_shape s = { 8, 2, 16, 4, 45, 0 };
	float o[128], m[8], l[8], zo[128] = { 0 }, sm[8], one[8], att[45];
	struct kvt_test_kv b;
	uint64_t rng = 1605;
	double want[128];

	(void)state;
	kvt_test_kv_build(&b, &s, KVT_DTYPE_F32, &rng);
	b.kv.window = 20; /* gpt-oss's sliding layers: window + learned sinks */
	assert_int_equal(kvt_attn_partial_ref(&b.kv, b.q, 8, 0, 45, att, o, m, l), 0);
	for (uint32_t h = 0; h < 8; h++) {
		double sc[45], mx, sum = 0.0;

		sm[h] = kvt_test_kv_uniform(&rng, 3.0f);
		one[h] = 1.0f;
		mx = sm[h];
		for (uint32_t t = 0; t < 45; t++) {
			double x = 0.0;

			sc[t] = -INFINITY;
			if (!kvt_test_visible(20, 0, 44, t))
				continue;
			for (uint32_t i = 0; i < 16; i++)
				x += (double)b.q[h * 16 + i] * b.kf[(size_t)t * 32 + (h / 4) * 16 + i];
			sc[t] = x / 4.0;
			mx = sc[t] > mx ? sc[t] : mx;
		}
		sum = exp(sm[h] - mx);
		for (uint32_t t = 0; t < 45; t++)
			sum += exp(sc[t] - mx);
		for (uint32_t i = 0; i < 16; i++) {
			double a = 0.0;

			for (uint32_t t = 0; t < 45; t++)
				a += exp(sc[t] - mx) / sum * b.vf[(size_t)t * 32 + (h / 4) * 16 + i];
			want[h * 16 + i] = a;
		}
	}
	kvt_attn_merge(8, 16, o, m, l, zo, sm, one);
	for (size_t i = 0; i < 128; i++)
		assert_float_equal(o[i], (float)want[i], 2e-6f);
	kvt_test_kv_free(&b);
}

/* kvt_attn_visible() gives exactly the positions kvt_test_visible() calls visible. */
static void
test_attn_visible(void **state)
{
	(void)state;
	for (size_t wi = 0; wi < sizeof tk_windows / sizeof tk_windows[0]; wi++)
		for (uint64_t n = 0; n < 130; n++) {
			uint64_t se, wb;

			kvt_attn_visible(tk_windows[wi][0], tk_windows[wi][1], n, &se, &wb);
			assert_true(se <= wb && wb <= (n ? n - 1 : 0));
			for (uint64_t k = 0; k < n; k++)
				assert_int_equal(k < se || k >= wb,
						 kvt_test_visible(tk_windows[wi][0],
								  tk_windows[wi][1], n - 1, k));
		}
}

/* Empty partials merge as nothing, in either order, and two empties stay empty. */
static void
test_merge_empty(void **state)
{
	float oa[2] = { 1.0f, -1.0f }, ma[1] = { 2.0f }, la[1] = { 3.0f };
	float oe[2] = { 0.0f, 0.0f }, me[1] = { -INFINITY }, le[1] = { 0.0f };
	float oe2[2] = { 0.0f, 0.0f }, me2[1] = { -INFINITY }, le2[1] = { 0.0f };

	(void)state;
	kvt_attn_merge(1, 2, oa, ma, la, oe, me, le); /* a + empty = a, exactly */
	assert_true(oa[0] == 1.0f && oa[1] == -1.0f && ma[0] == 2.0f && la[0] == 3.0f);
	kvt_attn_merge(1, 2, oe, me, le, oa, ma, la); /* empty + a = a, exactly */
	assert_true(oe[0] == 1.0f && oe[1] == -1.0f && me[0] == 2.0f && le[0] == 3.0f);
	kvt_attn_merge(1, 2, oe2, me2, le2, (const float[]){ 0.0f, 0.0f },
		       (const float[]){ -INFINITY }, (const float[]){ 0.0f });
	assert_true(oe2[0] == 0.0f && oe2[1] == 0.0f && le2[0] == 0.0f && me2[0] == -INFINITY);
}

/* Bad window arguments: clear -EINVAL, never a crash. */
static void
test_window_bad_args(void **state)
{
	static const struct kvt_test_kv_shape s = { 8, 4, 8, 4, 20, 0 };
	float scratch[20], out[64], m[8], l[8];
	uint32_t tab[5], pos[5] = { 0, 1, 2, 3, 4 };
	struct kvt_test_kv b;
	struct kvt_paged_kv kv;
	uint64_t rng = 1603;

	(void)state;
	kvt_test_kv_build(&b, &s, KVT_DTYPE_F32, &rng);
	memcpy(tab, b.table, sizeof tab);
	kv = b.kv;
	kv.seq_len = 19; /* decode: a different seq_len */
	assert_int_equal(kvt_attn_decode_ref(&kv, b.q, 8, 20, scratch, out), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "differs"));
	kv.seq_len = 10; /* partial past the query */
	assert_int_equal(kvt_attn_partial_ref(&kv, b.q, 8, 0, 12, scratch, out, m, l), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "passes"));
	kv = b.kv;
	kv.window = 4;
	kv.table = tab;
	kv.pos = pos;
	kv.n_entries = 0;
	assert_int_equal(kvt_attn_decode_ref(&kv, b.q, 8, 20, scratch, out), -EINVAL);
	kv.n_entries = 5;
	pos[3] = 2; /* not ascending */
	assert_int_equal(kvt_attn_decode_ref(&kv, b.q, 8, 20, scratch, out), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "ascending"));
	pos[3] = 3;
	kv.n_entries = 4; /* block 4 (positions 16..19) holds the window but is not listed */
	assert_int_equal(kvt_attn_decode_ref(&kv, b.q, 8, 20, scratch, out), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "block 4"));
	kv.sink = 1; /* sink block 0 missing from pos */
	kv.n_entries = 2;
	pos[0] = 3;
	pos[1] = 4;
	tab[0] = b.table[3];
	tab[1] = b.table[4];
	assert_int_equal(kvt_attn_decode_ref(&kv, b.q, 8, 20, scratch, out), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "block 0"));
	kv.sink = 0; /* without the sink, blocks 3 and 4 hold the window 16..19: fine */
	assert_int_equal(kvt_attn_decode_ref(&kv, b.q, 8, 20, scratch, out), 0);
	kvt_test_kv_free(&b);
}

/* ---- MLA latent (absorbed form) ----------------------------------------------------------- */

/* A latent test case: heads, kv_lora_rank, rope dim, tokens per block, positions, row pad. */
struct tk_lat_shape {
	uint32_t h, r, p, tpb, seq, pad;
};

static const struct tk_lat_shape tk_lat_shapes[] = {
	{ 1, 8, 0, 1, 9, 0 },     { 4, 16, 8, 4, 37, 0 },   { 16, 64, 16, 16, 70, 8 },
	{ 8, 32, 4, 7, 50, 2 },   { 2, 512, 64, 16, 40, 0 }, { 3, 24, 8, 5, 1, 0 },
};

/* The fixture's K rows are the latent vectors [c_kv | k_pe] (one KV head of r + p elements). */
static void
tk_lat_build(const struct tk_lat_shape *ls, enum kvt_dtype dt, uint64_t *rng,
	     struct kvt_test_kv *b, struct kvt_paged_latent *lk, float **q_lat, float **q_pe)
{
	const struct kvt_test_kv_shape s = { 1, 1, ls->r + ls->p, ls->tpb, ls->seq, ls->pad };
	size_t i;

	kvt_test_kv_build(b, &s, dt, rng);
	*lk = (struct kvt_paged_latent){ .base = b->kv.k_base, .block_stride = b->kv.block_stride,
					 .token_stride = b->kv.token_stride, .table = b->table,
					 .tokens_per_block = ls->tpb, .kv_lora_rank = ls->r,
					 .rope_dim = ls->p, .dtype = dt };
	*q_lat = malloc((size_t)ls->h * ls->r * sizeof(float));
	*q_pe = malloc(((size_t)ls->h * ls->p + 1) * sizeof(float));
	assert_true(*q_lat && *q_pe);
	for (i = 0; i < (size_t)ls->h * ls->r; i++)
		(*q_lat)[i] = kvt_test_kv_uniform(rng, 2.0f);
	for (i = 0; i < (size_t)ls->h * ls->p; i++)
		(*q_pe)[i] = kvt_test_kv_uniform(rng, 2.0f);
}

/*
 * The absorbed MLA written as a plain loop over n contiguous rows lat [n][r + p], in the order
 * attention.h states: s = q_lat . c (ascending), += q_pe . k_pe, *= scale; llama2.c's softmax;
 * out[h] = sum_t p_t c_t. att [n] scratch.
 */
static void
tk_lat_loop(const float *q_lat, const float *q_pe, const float *lat, uint32_t n, uint32_t nh,
	    uint32_t r, uint32_t p, float scale, float *att, float *out)
{
	for (uint32_t h = 0; h < nh; h++) {
		float *o = out + (size_t)h * r;

		for (uint32_t t = 0; t < n; t++) {
			const float *c = lat + (size_t)t * (r + p);
			float score = 0.0f;

			for (uint32_t i = 0; i < r; i++)
				score += q_lat[(size_t)h * r + i] * c[i];
			for (uint32_t i = 0; i < p; i++)
				score += q_pe[(size_t)h * p + i] * c[r + i];
			score *= scale;
			att[t] = score;
		}
		tk_softmax(att, (int)n);
		memset(o, 0, r * sizeof(float));
		for (uint32_t t = 0; t < n; t++)
			for (uint32_t i = 0; i < r; i++)
				o[i] += att[t] * lat[(size_t)t * (r + p) + i];
	}
}

/* Bit-identical to the contiguous loop over the visible rows; dense table and block positions. */
static void
test_latent_matches_loop(void **state)
{
	static const enum kvt_dtype dts[] = { KVT_DTYPE_F32, KVT_DTYPE_F16, KVT_DTYPE_BF16 };
	uint64_t rng = 1641;

	(void)state;
	for (size_t si = 0; si < sizeof tk_lat_shapes / sizeof tk_lat_shapes[0]; si++) {
		for (size_t wi = 0; wi < sizeof tk_windows / sizeof tk_windows[0]; wi++) {
			const struct tk_lat_shape *ls = &tk_lat_shapes[si];
			uint64_t window = tk_windows[wi][0], sink = tk_windows[wi][1];
			const struct kvt_test_kv_shape s1 = { 1, 1, ls->r + ls->p, ls->tpb, ls->seq,
							      0 };
			enum kvt_dtype dt = dts[(si + wi) % 3];
			size_t n = (size_t)ls->h * ls->r;
			float *out = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
			float *rows = malloc((size_t)ls->seq * (ls->r + ls->p) * sizeof(float));
			float *att = malloc(ls->seq * sizeof(float)), *scratch, *q_lat, *q_pe;
			uint32_t *ctab = malloc((ls->seq / ls->tpb + 1) * sizeof(uint32_t));
			uint32_t *cpos = malloc((ls->seq / ls->tpb + 1) * sizeof(uint32_t));
			float scale = 1.0f / sqrtf((float)(ls->r / 2 + ls->p)) * 1.3689f * 1.3689f;
			struct kvt_paged_latent lk;
			struct kvt_test_kv b;
			uint32_t nv, ne = 0;

			assert_true(out && want && rows && att && ctab && cpos);
			tk_lat_build(ls, dt, &rng, &b, &lk, &q_lat, &q_pe);
			kvt_test_kv_poison(&b, window, sink, ls->seq - 1);
			nv = tk_gather_visible(&s1, b.kw, window, sink, ls->seq - 1, 0, ls->seq, rows);
			tk_lat_loop(q_lat, q_pe, rows, nv, ls->h, ls->r, ls->p, scale, att, want);
			scratch = malloc(nv * sizeof(float));
			assert_non_null(scratch);
			lk.window = window;
			lk.sink = sink;
			assert_int_equal(kvt_attn_latent_decode_ref(&lk, q_lat, ls->p ? q_pe : NULL,
								    ls->h, ls->seq, scale, scratch,
								    out), 0);
			if (memcmp(out, want, n * sizeof(float)))
				fail_msg("latent shape %zu window %llu sink %llu dtype %d: not "
					 "bit-identical (relerr %g)", si, (unsigned long long)window,
					 (unsigned long long)sink, (int)dt,
					 kvt_test_kv_relerr(out, want, n));
			assert_true(kvt_test_kv_maxabs(out, n) > 0.0f);
			for (uint32_t blk = 0; blk < b.n_blocks; blk++) {
				int vis = 0;

				for (uint64_t t = (uint64_t)blk * ls->tpb;
				     t < (uint64_t)(blk + 1) * ls->tpb; t++)
					vis |= kvt_test_visible(window, sink, ls->seq - 1, t);
				if (vis || blk % 4 == 1) {
					ctab[ne] = b.table[blk];
					cpos[ne++] = blk;
				}
			}
			lk.table = ctab;
			lk.pos = cpos;
			lk.n_entries = ne;
			memset(out, 0, n * sizeof(float));
			assert_int_equal(kvt_attn_latent_decode_ref(&lk, q_lat, q_pe, ls->h, ls->seq,
								    scale, scratch, out), 0);
			assert_memory_equal(out, want, n * sizeof(float));
			kvt_test_kv_free(&b);
			free(out);
			free(want);
			free(rows);
			free(att);
			free(scratch);
			free(q_lat);
			free(q_pe);
			free(ctab);
			free(cpos);
		}
	}
}

/*
 * Streamed windows: partials over disjoint block ranges (each view listing only its blocks,
 * absolute positions) merged with kvt_attn_merge(h, rank) equal the one-shot decode within
 * fp32 rounding; the one partial over everything is the decode bit for bit.
 */
static void
test_latent_stream(void **state)
{
	uint64_t rng = 1642;

	(void)state;
	for (size_t si = 0; si < sizeof tk_lat_shapes / sizeof tk_lat_shapes[0]; si++) {
		for (size_t wi = 0; wi < sizeof tk_windows / sizeof tk_windows[0]; wi += 2) {
			const struct tk_lat_shape *ls = &tk_lat_shapes[si];
			size_t n = (size_t)ls->h * ls->r;
			float *full = malloc(n * sizeof(float)), *oa = malloc(n * sizeof(float));
			float *ob = malloc(n * sizeof(float)), *att = malloc(ls->seq * sizeof(float));
			float *ma = malloc(ls->h * sizeof(float)), *la = malloc(ls->h * sizeof(float));
			float *mb = malloc(ls->h * sizeof(float)), *lb = malloc(ls->h * sizeof(float));
			uint32_t wpos[3], wb = (uint32_t)(wi % 3) + 1;
			float scale = 0.125f, *q_lat, *q_pe;
			struct kvt_paged_latent lk;
			struct kvt_test_kv b;
			int first = 1;

			assert_true(full && oa && ob && att && ma && la && mb && lb);
			tk_lat_build(ls, KVT_DTYPE_F32, &rng, &b, &lk, &q_lat, &q_pe);
			lk.window = tk_windows[wi][0];
			lk.sink = tk_windows[wi][1];
			kvt_test_kv_poison(&b, lk.window, lk.sink, ls->seq - 1);
			assert_int_equal(kvt_attn_latent_decode_ref(&lk, q_lat, q_pe, ls->h, ls->seq,
								    scale, att, full), 0);
			assert_int_equal(kvt_attn_latent_partial_ref(&lk, q_lat, q_pe, ls->h, 0,
								     ls->seq, scale, att, oa, ma,
								     la), 0);
			assert_memory_equal(oa, full, n * sizeof(float));
			lk.seq_len = ls->seq;
			for (uint32_t ws = 0; ws < b.n_blocks; ws += wb) {
				uint32_t nb = b.n_blocks - ws < wb ? b.n_blocks - ws : wb;
				uint64_t t0 = (uint64_t)ws * ls->tpb, t1 = (uint64_t)(ws + nb) * ls->tpb;

				t1 = t1 < ls->seq ? t1 : ls->seq;
				for (uint32_t i = 0; i < nb; i++)
					wpos[i] = ws + i;
				lk.table = b.table + ws;
				lk.pos = wpos;
				lk.n_entries = nb;
				assert_int_equal(kvt_attn_latent_partial_ref(&lk, q_lat, q_pe, ls->h, t0,
									     t1, scale, att,
									     first ? oa : ob,
									     first ? ma : mb,
									     first ? la : lb), 0);
				if (!first)
					kvt_attn_merge(ls->h, ls->r, oa, ma, la, ob, mb, lb);
				first = 0;
			}
			if (getenv("TK_DEBUG"))
				print_message("latent stream %zu/%zu: relerr %g\n", si, wi,
					      kvt_test_kv_relerr(oa, full, n));
			if (!(kvt_test_kv_relerr(oa, full, n) <= 1e-5))
				fail_msg("latent shape %zu window %zu: streamed relerr %g > 1e-5", si,
					 wi, kvt_test_kv_relerr(oa, full, n));
			kvt_test_kv_free(&b);
			free(full);
			free(oa);
			free(ob);
			free(att);
			free(ma);
			free(la);
			free(mb);
			free(lb);
			free(q_lat);
			free(q_pe);
		}
	}
}

/*
 * Against MLA computed without absorption (transformers' DeepseekV3Attention: k_nope and v
 * expanded per head from c_kv by W_UK and W_UV, k = [k_nope | k_pe], q = [q_nope | q_pe], plain
 * softmax attention), in double: the absorbed path (q_lat = W_UK^T q_nope in fp32, the latent
 * kernel, then W_UV applied to its output in fp32) agrees within 2e-5 of max |y|. Why that bound:
 * the two differ only in the association of fp32 sums (the scores' dots of length rank and
 * nope, the output's sums over positions then rank), each with relative error of order
 * length * 2^-24 = 3e-5 in the worst case for rank 512 and typically sqrt(length) * 2^-24 ~ 1e-6;
 * the observed error is about 1e-6 (TK_DEBUG=1 prints it).
 */
static void
test_latent_vs_expanded(void **state)
{
	static const struct { uint32_t h, r, p, nope, vd, seq, window, sink; } cs[] = {
		{ 4, 16, 8, 12, 10, 37, 0, 0 }, { 8, 64, 16, 32, 32, 90, 24, 4 },
		{ 2, 512, 64, 128, 128, 64, 0, 0 }, { 16, 32, 8, 16, 24, 50, 17, 0 },
	};
	uint64_t rng = 1643;

	(void)state;
	for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
		const uint32_t h = cs[ci].h, r = cs[ci].r, p = cs[ci].p, nope = cs[ci].nope;
		const uint32_t vd = cs[ci].vd, seq = cs[ci].seq;
		const struct tk_lat_shape ls = { h, r, p, 8, seq, 0 };
		const float mscale = 0.1f * logf(40.0f) + 1.0f; /* YaRN, factor 40 */
		const float scale = 1.0f / sqrtf((float)(nope + p)) * mscale * mscale;
		float *wuk = malloc((size_t)h * nope * r * sizeof(float));
		float *wuv = malloc((size_t)h * vd * r * sizeof(float));
		float *qn = malloc((size_t)h * nope * sizeof(float)), *q_lat2, *q_pe;
		float *q_lat = malloc((size_t)h * r * sizeof(float));
		float *olat = malloc((size_t)h * r * sizeof(float)), *att = malloc(seq * sizeof(float));
		float *y = malloc((size_t)h * vd * sizeof(float));
		float *yref = malloc((size_t)h * vd * sizeof(float));
		double *sc = malloc(seq * sizeof(double));
		struct kvt_paged_latent lk;
		struct kvt_test_kv b;
		double err;

		assert_true(wuk && wuv && qn && q_lat && olat && att && y && yref && sc);
		tk_lat_build(&ls, KVT_DTYPE_F32, &rng, &b, &lk, &q_lat2, &q_pe);
		lk.window = cs[ci].window;
		lk.sink = cs[ci].sink;
		for (size_t i = 0; i < (size_t)h * nope * r; i++)
			wuk[i] = kvt_test_kv_uniform(&rng, 2.0f / sqrtf((float)r));
		for (size_t i = 0; i < (size_t)h * vd * r; i++)
			wuv[i] = kvt_test_kv_uniform(&rng, 2.0f / sqrtf((float)r));
		for (size_t i = 0; i < (size_t)h * nope; i++)
			qn[i] = kvt_test_kv_uniform(&rng, 2.0f);
		/* absorbed: q_lat[h][j] = sum_n W_UK[h][n][j] q_nope[h][n], fp32 */
		for (uint32_t hh = 0; hh < h; hh++)
			for (uint32_t j = 0; j < r; j++) {
				float a = 0.0f;

				for (uint32_t nn = 0; nn < nope; nn++)
					a += wuk[((size_t)hh * nope + nn) * r + j] *
					     qn[(size_t)hh * nope + nn];
				q_lat[(size_t)hh * r + j] = a;
			}
		assert_int_equal(kvt_attn_latent_decode_ref(&lk, q_lat, q_pe, h, seq, scale, att,
							    olat), 0);
		for (uint32_t hh = 0; hh < h; hh++)
			for (uint32_t vi = 0; vi < vd; vi++) {
				float a = 0.0f;

				for (uint32_t j = 0; j < r; j++)
					a += wuv[((size_t)hh * vd + vi) * r + j] * olat[(size_t)hh * r + j];
				y[(size_t)hh * vd + vi] = a;
			}
		/* expanded, in double, over the visible positions */
		for (uint32_t hh = 0; hh < h; hh++) {
			double mx = -INFINITY, sum = 0.0;

			for (uint32_t t = 0; t < seq; t++) {
				const float *c = b.kf + (size_t)t * (r + p);
				double s = 0.0;

				sc[t] = -INFINITY;
				if (!kvt_test_visible(lk.window, lk.sink, seq - 1, t))
					continue;
				for (uint32_t nn = 0; nn < nope; nn++) {
					double kn = 0.0;

					for (uint32_t j = 0; j < r; j++)
						kn += (double)wuk[((size_t)hh * nope + nn) * r + j] * c[j];
					s += (double)qn[(size_t)hh * nope + nn] * kn;
				}
				for (uint32_t j = 0; j < p; j++)
					s += (double)q_pe[(size_t)hh * p + j] * c[r + j];
				sc[t] = s * scale;
				mx = sc[t] > mx ? sc[t] : mx;
			}
			for (uint32_t t = 0; t < seq; t++)
				sum += exp(sc[t] - mx);
			for (uint32_t vi = 0; vi < vd; vi++) {
				double o = 0.0;

				for (uint32_t t = 0; t < seq; t++) {
					const float *c = b.kf + (size_t)t * (r + p);
					double v = 0.0;

					if (sc[t] == -INFINITY)
						continue;
					for (uint32_t j = 0; j < r; j++)
						v += (double)wuv[((size_t)hh * vd + vi) * r + j] * c[j];
					o += exp(sc[t] - mx) / sum * v;
				}
				yref[(size_t)hh * vd + vi] = (float)o;
			}
		}
		err = kvt_test_kv_relerr(y, yref, (size_t)h * vd);
		if (getenv("TK_DEBUG"))
			print_message("latent vs expanded case %zu: relerr %g\n", ci, err);
		if (!(err <= 2e-5))
			fail_msg("latent case %zu: absorbed vs expanded relerr %g > 2e-5", ci, err);
		assert_true(kvt_test_kv_maxabs(yref, (size_t)h * vd) > 0.0f);
		kvt_test_kv_free(&b);
		free(wuk);
		free(wuv);
		free(qn);
		free(q_lat);
		free(q_lat2);
		free(q_pe);
		free(olat);
		free(att);
		free(y);
		free(yref);
		free(sc);
	}
}

/* Bad latent arguments: -EINVAL with a message. */
static void
test_latent_bad_args(void **state)
{
	const struct tk_lat_shape ls = { 2, 8, 4, 4, 10, 0 };
	float scratch[10], out[16], m[2], l[2], *q_lat, *q_pe;
	struct kvt_paged_latent lk, bad;
	struct kvt_test_kv b;
	uint64_t rng = 1644;

	(void)state;
	tk_lat_build(&ls, KVT_DTYPE_BF16, &rng, &b, &lk, &q_lat, &q_pe);
	assert_int_equal(kvt_attn_latent_decode_ref(&lk, q_lat, q_pe, 2, 10, 0.3f, scratch, out),
			 0);
	assert_int_equal(kvt_attn_latent_decode_ref(&lk, q_lat, NULL, 2, 10, 0.3f, scratch, out),
			 -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "q_pe"));
	assert_int_equal(kvt_attn_latent_decode_ref(&lk, q_lat, q_pe, 0, 10, 0.3f, scratch, out),
			 -EINVAL);
	assert_int_equal(kvt_attn_latent_decode_ref(&lk, q_lat, q_pe, 2, 0, 0.3f, scratch, out),
			 -EINVAL);
	assert_int_equal(kvt_attn_latent_decode_ref(&lk, q_lat, q_pe, 2, 10, 0.0f, scratch, out),
			 -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "scale"));
	assert_int_equal(kvt_attn_latent_decode_ref(&lk, q_lat, q_pe, 2, 10, NAN, scratch, out),
			 -EINVAL);
	assert_int_equal(kvt_attn_latent_decode_ref(NULL, q_lat, q_pe, 2, 10, 0.3f, scratch, out),
			 -EINVAL);
	assert_int_equal(kvt_attn_latent_partial_ref(&lk, q_lat, q_pe, 2, 3, 3, 0.3f, scratch,
						     out, m, l), -EINVAL);
	assert_int_equal(kvt_attn_latent_partial_ref(&lk, q_lat, q_pe, 2, 0, 3, 0.3f, scratch,
						     out, NULL, l), -EINVAL);
	bad = lk;
	bad.token_stride = 23; /* < 12 bf16 */
	assert_int_equal(kvt_attn_latent_decode_ref(&bad, q_lat, q_pe, 2, 10, 0.3f, scratch, out),
			 -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "token_stride"));
	bad = lk;
	bad.kv_lora_rank = 0;
	assert_int_equal(kvt_attn_latent_decode_ref(&bad, q_lat, q_pe, 2, 10, 0.3f, scratch, out),
			 -EINVAL);
	bad = lk;
	bad.dtype = KVT_DTYPE_INT8;
	assert_int_equal(kvt_attn_latent_decode_ref(&bad, q_lat, q_pe, 2, 10, 0.3f, scratch, out),
			 -EINVAL);
	bad = lk;
	bad.table = NULL;
	assert_int_equal(kvt_attn_latent_decode_ref(&bad, q_lat, q_pe, 2, 10, 0.3f, scratch, out),
			 -EINVAL);
	kvt_test_kv_free(&b);
	free(q_lat);
	free(q_pe);
}

static void
test_bad_args(void **state)
{
	static const struct kvt_test_kv_shape s = { 8, 4, 8, 16, 10, 0 };
	float scratch[16], out[64], m[8], l[8];
	struct kvt_test_kv b;
	struct kvt_paged_kv kv;
	uint64_t rng = 3;

	(void)state;
	kvt_test_kv_build(&b, &s, KVT_DTYPE_F32, &rng);
	assert_int_equal(kvt_attn_decode_ref(&b.kv, b.q, 8, 10, scratch, out), 0);
	assert_int_equal(kvt_attn_decode_ref(&b.kv, b.q, 6, 10, scratch, out), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "multiple"));
	assert_int_equal(kvt_attn_decode_ref(&b.kv, b.q, 0, 10, scratch, out), -EINVAL);
	assert_int_equal(kvt_attn_decode_ref(&b.kv, b.q, 8, 0, scratch, out), -EINVAL);
	assert_int_equal(kvt_attn_decode_ref(NULL, b.q, 8, 10, scratch, out), -EINVAL);
	assert_int_equal(kvt_attn_decode_ref(&b.kv, NULL, 8, 10, scratch, out), -EINVAL);
	assert_int_equal(kvt_attn_decode_ref(&b.kv, b.q, 8, 10, NULL, out), -EINVAL);
	assert_int_equal(kvt_attn_decode_ref(&b.kv, b.q, 8, 10, scratch, NULL), -EINVAL);
	kv = b.kv;
	kv.table = NULL;
	assert_int_equal(kvt_attn_decode_ref(&kv, b.q, 8, 10, scratch, out), -EINVAL);
	kv = b.kv;
	kv.k_base = NULL;
	assert_int_equal(kvt_attn_decode_ref(&kv, b.q, 8, 10, scratch, out), -EINVAL);
	kv = b.kv;
	kv.n_kv_heads = 0;
	assert_int_equal(kvt_attn_decode_ref(&kv, b.q, 8, 10, scratch, out), -EINVAL);
	kv = b.kv;
	kv.head_dim = 0;
	assert_int_equal(kvt_attn_decode_ref(&kv, b.q, 8, 10, scratch, out), -EINVAL);
	kv = b.kv;
	kv.tokens_per_block = 0;
	assert_int_equal(kvt_attn_decode_ref(&kv, b.q, 8, 10, scratch, out), -EINVAL);
	kv = b.kv;
	kv.dtype = KVT_DTYPE_FP8_E4M3;
	assert_int_equal(kvt_attn_decode_ref(&kv, b.q, 8, 10, scratch, out), -EINVAL);
	kv = b.kv;
	kv.token_stride = 4 * 8 * 4 - 1;
	assert_int_equal(kvt_attn_decode_ref(&kv, b.q, 8, 10, scratch, out), -EINVAL);
	assert_int_equal(kvt_attn_partial_ref(&b.kv, b.q, 8, 3, 3, scratch, out, m, l), -EINVAL);
	assert_int_equal(kvt_attn_partial_ref(&b.kv, b.q, 8, 4, 3, scratch, out, m, l), -EINVAL);
	assert_int_equal(kvt_attn_partial_ref(&b.kv, b.q, 8, 0, 3, scratch, out, NULL, l), -EINVAL);
	assert_int_equal(kvt_attn_partial_ref(&b.kv, b.q, 8, 0, 3, scratch, out, m, NULL), -EINVAL);
	assert_int_equal(kvt_attn_partial_ref(&b.kv, b.q, 7, 0, 3, scratch, out, m, l), -EINVAL);
	assert_int_equal(kvt_store_f32(KVT_DTYPE_INT8, out, scratch, 1), -EINVAL);
	assert_int_equal(kvt_load_f32(KVT_DTYPE_FP8_E4M3, out, scratch, 1), -EINVAL);
	assert_int_equal(kvt_store_f32(KVT_DTYPE_F16, NULL, scratch, 1), -EINVAL);
	assert_int_equal(kvt_load_f32(KVT_DTYPE_F16, out, NULL, 1), -EINVAL);
	assert_int_equal(kvt_store_f32(KVT_DTYPE_F16, NULL, NULL, 0), 0);
	kvt_test_kv_free(&b);
}

/* ---- conversions -------------------------------------------------------------------------- */

static void
test_f16_known_values(void **state)
{
	(void)state;
	assert_int_equal(kvt_f32_to_f16(1.0f), 0x3c00);
	assert_int_equal(kvt_f32_to_f16(-2.5f), 0xc100);
	assert_int_equal(kvt_f32_to_f16(0.0f), 0x0000);
	assert_int_equal(kvt_f32_to_f16(-0.0f), 0x8000);
	assert_int_equal(kvt_f32_to_f16(65504.0f), 0x7bff);
	assert_int_equal(kvt_f32_to_f16(65519.99f), 0x7bff);
	assert_int_equal(kvt_f32_to_f16(65520.0f), 0x7c00); /* tie with odd 0x7bff: up to inf */
	assert_int_equal(kvt_f32_to_f16(1e10f), 0x7c00);
	assert_int_equal(kvt_f32_to_f16(INFINITY), 0x7c00);
	assert_int_equal(kvt_f32_to_f16(-INFINITY), 0xfc00);
	assert_true((kvt_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (kvt_f32_to_f16(NAN) & 0x3ff));
	assert_true(isnan(kvt_f16_to_f32(kvt_f32_to_f16(tk_float(0x7f800001u))))); /* sNaN */
	assert_true(isnan(kvt_f16_to_f32(kvt_f32_to_f16(tk_float(0xffc00000u)))));
	/* subnormals: multiples of 2^-24 */
	assert_int_equal(kvt_f32_to_f16(ldexpf(1.0f, -24)), 0x0001);
	assert_int_equal(kvt_f32_to_f16(ldexpf(1.0f, -25)), 0x0000);         /* tie to even 0 */
	assert_int_equal(kvt_f32_to_f16(ldexpf(1.0f, -25) * 1.0001f), 0x0001);
	assert_int_equal(kvt_f32_to_f16(ldexpf(3.0f, -25)), 0x0002);         /* 1.5: tie to 2 */
	assert_int_equal(kvt_f32_to_f16(ldexpf(5.0f, -25)), 0x0002);         /* 2.5: tie to 2 */
	assert_int_equal(kvt_f32_to_f16(ldexpf(1023.0f, -24)), 0x03ff);
	assert_int_equal(kvt_f32_to_f16(ldexpf(1023.5f, -24)), 0x0400);      /* into normals */
	assert_int_equal(kvt_f32_to_f16(ldexpf(1.0f, -14)), 0x0400);
	assert_int_equal(kvt_f32_to_f16(ldexpf(-1.0f, -30)), 0x8000);
	assert_int_equal(kvt_f32_to_f16(tk_float(0x00000001u)), 0x0000);    /* fp32 subnormal */
	assert_true(kvt_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
	assert_true(kvt_f16_to_f32(0x83ff) == -ldexpf(1023.0f, -24));
	assert_true(kvt_f16_to_f32(0x7bff) == 65504.0f);
	assert_true(kvt_f16_to_f32(0xc100) == -2.5f);
	assert_true(isinf(kvt_f16_to_f32(0xfc00)) && kvt_f16_to_f32(0xfc00) < 0);
	/* normal ties: 1 + 2^-11 is half way between 0x3c00 (even) and 0x3c01 */
	assert_int_equal(kvt_f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3c00);
	assert_int_equal(kvt_f32_to_f16(1.0f + ldexpf(3.0f, -11)), 0x3c02);
	assert_int_equal(kvt_f32_to_f16(1.0f + ldexpf(1.0f, -11) + ldexpf(1.0f, -20)), 0x3c01);
	assert_int_equal(kvt_f32_to_f16(2047.0f / 1024.0f + ldexpf(1.0f, -11)), 0x4000); /* carry */
}

static void
test_bf16_known_values(void **state)
{
	(void)state;
	assert_int_equal(kvt_f32_to_bf16(1.0f), 0x3f80);
	assert_int_equal(kvt_f32_to_bf16(-2.5f), 0xc020);
	assert_int_equal(kvt_f32_to_bf16(-0.0f), 0x8000);
	assert_int_equal(kvt_f32_to_bf16(tk_float(0x3f808000u)), 0x3f80); /* tie, even down */
	assert_int_equal(kvt_f32_to_bf16(tk_float(0x3f818000u)), 0x3f82); /* tie, even up */
	assert_int_equal(kvt_f32_to_bf16(tk_float(0x3f808001u)), 0x3f81);
	assert_int_equal(kvt_f32_to_bf16(tk_float(0x3f807fffu)), 0x3f80);
	assert_int_equal(kvt_f32_to_bf16(tk_float(0x7f7fffffu)), 0x7f80); /* FLT_MAX -> inf */
	assert_int_equal(kvt_f32_to_bf16(INFINITY), 0x7f80);
	assert_int_equal(kvt_f32_to_bf16(-INFINITY), 0xff80);
	assert_int_equal(kvt_f32_to_bf16(tk_float(0x7fc00000u)), 0x7fc0);
	assert_true(isnan(kvt_bf16_to_f32(kvt_f32_to_bf16(tk_float(0x7f800001u))))); /* not inf */
	assert_true(isnan(kvt_bf16_to_f32(kvt_f32_to_bf16(tk_float(0xff80ffffu)))));
	assert_int_equal(kvt_f32_to_bf16(tk_float(0x00010000u)), 0x0001); /* subnormal, exact */
	assert_int_equal(kvt_f32_to_bf16(tk_float(0x00008000u)), 0x0000); /* tie to even 0 */
	assert_int_equal(kvt_f32_to_bf16(tk_float(0x00018000u)), 0x0002);
	assert_int_equal(kvt_f32_to_bf16(tk_float(0x007fffffu)), 0x0080); /* to the min normal */
	assert_true(kvt_bf16_to_f32(0x3f80) == 1.0f);
	assert_true(kvt_bf16_to_f32(0xc020) == -2.5f);
	assert_true(kvt_bf16_to_f32(0x0001) == tk_float(0x00010000u));
}

/* Independent bf16 rounding: nearest of the two neighbours by exact double arithmetic. */
static uint16_t
tk_bf16_oracle(float f)
{
	uint32_t x = tk_bits(f), lo = x & 0xffff0000u, hi = lo + 0x10000u;
	double dl, dh;

	if (isnan(f))
		return 0x7fc0;
	if ((x & 0x7fffffffu) >= 0x7f800000u || lo == x)
		return (uint16_t)(x >> 16);
	dl = fabs((double)f - (double)tk_float(lo));
	if ((hi & 0x7fffffffu) == 0x7f800000u) /* above the largest finite: "2^128" rounds to inf */
		dh = ldexp(1.0, 128) - fabs((double)f);
	else
		dh = fabs((double)tk_float(hi) - (double)f);
	if (dl < dh || (dl == dh && !((lo >> 16) & 1u)))
		return (uint16_t)(lo >> 16);
	return (uint16_t)(hi >> 16);
}

static void
test_conversion_sweeps(void **state)
{
	uint32_t i, x;

	(void)state;
	/* every fp16 / bf16 value survives the round trip (NaN stays NaN) */
	for (i = 0; i < 65536; i++) {
		float f = kvt_f16_to_f32((uint16_t)i), g = kvt_bf16_to_f32((uint16_t)i);

		if (isnan(f))
			assert_true(isnan(kvt_f16_to_f32(kvt_f32_to_f16(f))));
		else
			assert_int_equal(kvt_f32_to_f16(f), i);
		if (isnan(g))
			assert_true(isnan(kvt_bf16_to_f32(kvt_f32_to_bf16(g))));
		else
			assert_int_equal(kvt_f32_to_bf16(g), i);
	}
	/* a sweep over fp32 bit patterns against independent roundings */
	for (x = 0, i = 0; i < (1u << 20); i++, x += 4093u) {
		float f = tk_float(x);
		uint16_t b = kvt_f32_to_bf16(f);

		if (isnan(f))
			assert_true(isnan(kvt_bf16_to_f32(b)));
		else if (b != tk_bf16_oracle(f))
			fail_msg("bf16(%08x) = %04x, want %04x", x, b, tk_bf16_oracle(f));
#ifdef __FLT16_MAX__
		{
			_Float16 hw = (_Float16)f;
			uint16_t h = kvt_f32_to_f16(f), w;

			memcpy(&w, &hw, 2);
			if (isnan(f))
				assert_true(isnan(kvt_f16_to_f32(h)));
			else if (h != w)
				fail_msg("f16(%08x) = %04x, compiler says %04x", x, h, w);
		}
#endif
	}
}

static void
test_store_load(void **state)
{
	float src[37], back[37];
	unsigned char buf[1 + 37 * 4];
	uint64_t rng = 11;
	size_t i;

	(void)state;
	for (i = 0; i < 37; i++)
		src[i] = kvt_test_kv_uniform(&rng, 1000.0f);
	src[3] = INFINITY;
	src[4] = ldexpf(1.0f, -20);
	/* unaligned destinations on purpose */
	assert_int_equal(kvt_store_f32(KVT_DTYPE_F32, buf + 1, src, 37), 0);
	assert_int_equal(kvt_load_f32(KVT_DTYPE_F32, back, buf + 1, 37), 0);
	assert_memory_equal(back, src, sizeof src);
	assert_int_equal(kvt_store_f32(KVT_DTYPE_F16, buf + 1, src, 37), 0);
	assert_int_equal(kvt_load_f32(KVT_DTYPE_F16, back, buf + 1, 37), 0);
	for (i = 0; i < 37; i++)
		assert_true(back[i] == kvt_f16_to_f32(kvt_f32_to_f16(src[i])));
	assert_int_equal(kvt_store_f32(KVT_DTYPE_BF16, buf + 1, src, 37), 0);
	assert_int_equal(kvt_load_f32(KVT_DTYPE_BF16, back, buf + 1, 37), 0);
	for (i = 0; i < 37; i++) {
		assert_true(back[i] == kvt_bf16_to_f32(kvt_f32_to_bf16(src[i])));
		if (!isinf(src[i])) /* bf16 keeps 8 significant bits */
			assert_true(fabsf(back[i] - src[i]) <= fabsf(src[i]) * (1.0f / 256.0f));
	}
}

/* The gather/scatter reference: pieces land where the formula says; untouched bytes stay. */
static void
test_gather_ref(void **state)
{
	enum { NS = 9, STRIDE = 100, OFF = 30, LEN = 50, N = 4 };
	static const uint32_t slots[N] = { 8, 0, 5, 2 };
	unsigned char base[NS * STRIDE], packed[N * LEN], back[NS * STRIDE];
	size_t i, j;

	(void)state;
	for (i = 0; i < sizeof base; i++)
		base[i] = (unsigned char)(i * 7 + 3);
	memset(packed, 0xee, sizeof packed);
	assert_int_equal(kvt_gather_blocks_ref(packed, base, STRIDE, OFF, LEN, slots, N), 0);
	for (i = 0; i < N; i++)
		for (j = 0; j < LEN; j++)
			assert_int_equal(packed[i * LEN + j], base[slots[i] * STRIDE + OFF + j]);
	memset(back, 0, sizeof back);
	assert_int_equal(kvt_scatter_blocks_ref(back, STRIDE, OFF, LEN, packed, slots, N), 0);
	for (i = 0; i < NS; i++) {
		int used = 0;

		for (j = 0; j < N; j++)
			used |= slots[j] == i;
		for (j = 0; j < STRIDE; j++) {
			int in = used && j >= OFF && j < OFF + LEN;

			assert_int_equal(back[i * STRIDE + j], in ? base[i * STRIDE + j] : 0);
		}
	}
	assert_int_equal(kvt_gather_blocks_ref(packed, base, STRIDE, OFF, LEN, slots, 0), 0);
	assert_int_equal(kvt_gather_blocks_ref(NULL, base, STRIDE, OFF, LEN, slots, 1), -EINVAL);
	assert_int_equal(kvt_gather_blocks_ref(packed, base, STRIDE, 60, LEN, slots, 1), -EINVAL);
	assert_int_equal(kvt_scatter_blocks_ref(back, STRIDE, 0, 0, packed, slots, 1), -EINVAL);
}

/* e4m3: known codes, every finite code round-trips, midpoints round to the even code,
 * saturation, NaN. */
static void
test_e4m3(void **state)
{
	(void)state;
	assert_int_equal(kvt_f32_to_e4m3(0.0f), 0x00);
	assert_int_equal(kvt_f32_to_e4m3(-0.0f), 0x80);
	assert_int_equal(kvt_f32_to_e4m3(1.0f), 0x38);
	assert_int_equal(kvt_f32_to_e4m3(-1.5f), 0xbc);
	assert_int_equal(kvt_f32_to_e4m3(448.0f), 0x7e);
	assert_int_equal(kvt_f32_to_e4m3(1e9f), 0x7e);   /* saturates */
	assert_int_equal(kvt_f32_to_e4m3(-INFINITY), 0xfe);
	assert_int_equal(kvt_f32_to_e4m3(NAN), 0x7f);
	assert_int_equal(kvt_f32_to_e4m3(0x1p-9f), 0x01); /* smallest subnormal */
	assert_int_equal(kvt_f32_to_e4m3(0x1p-10f), 0x00); /* tie to even: 0 */
	assert_int_equal(kvt_f32_to_e4m3(0x1.8p-9f), 0x02); /* 1.5 * 2^-9: tie to even (2) */
	assert_int_equal(kvt_f32_to_e4m3(0x1p-6f), 0x08); /* smallest normal */
	assert_true(isnan(kvt_e4m3_to_f32(0x7f)) && isnan(kvt_e4m3_to_f32(0xff)));
	assert_true(kvt_e4m3_to_f32(0x7e) == 448.0f);
	for (int c = 0; c < 256; c++) {
		float f = kvt_e4m3_to_f32((uint8_t)c);

		if ((c & 0x7f) == 0x7f)
			continue;
		assert_int_equal(kvt_f32_to_e4m3(f), c);
		if ((c & 0x7f) < 0x7e) { /* midpoint to the next code up rounds to the even one */
			float g = kvt_e4m3_to_f32((uint8_t)(c + 1)), mid = (f + g) / 2.0f;
			int want = (c & 1) ? c + 1 : c;

			assert_int_equal(kvt_f32_to_e4m3(mid), want);
			assert_int_equal(kvt_f32_to_e4m3(nextafterf(mid, 2 * g)), c + 1);
		}
	}
}

/* Quantize + dequantize: scales, error bounds, zero groups, every type combination. */
static void
test_quant_ref(void **state)
{
	enum { NG = 5, GR = 300 };
	static const enum kvt_dtype qts[] = { KVT_DTYPE_INT8, KVT_DTYPE_FP8_E4M3 };
	float src[NG * GR], back[NG * GR], scales[NG];
	uint8_t q[NG * GR];
	uint64_t rng = 7;
	size_t i, k;

	(void)state;
	for (i = 0; i < NG * GR; i++)
		src[i] = kvt_test_kv_uniform(&rng, 3.0f) * (float)(i / GR + 1);
	for (i = 0; i < GR; i++)
		src[2 * GR + i] = 0.0f; /* an all-zero group: scale 0, codes 0 */
	for (k = 0; k < 2; k++) {
		assert_int_equal(kvt_quant_ref(qts[k], KVT_DTYPE_F32, src, NG, GR, q, scales), 0);
		assert_int_equal(kvt_dequant_ref(qts[k], q, scales, NG, GR, KVT_DTYPE_F32, back),
				 0);
		for (i = 0; i < NG * GR; i++) {
			float s = scales[i / GR];
			float bound = k == 0 ? s / 2 : fabsf(src[i]) / 16 + s * 0x1p-10f;

			if (!(fabsf(back[i] - src[i]) <= bound * 1.0001f))
				fail_msg("type %zu element %zu: %g -> %g (scale %g)", k, i, src[i],
					 back[i], s);
		}
		assert_true(scales[2] == 0.0f && q[2 * GR] == 0 && back[2 * GR] == 0.0f);
		assert_true(scales[1] == kvt_test_kv_maxabs(src + GR, GR) /
					 (k == 0 ? 127.0f : 448.0f));
	}
	{
		uint16_t h[NG * GR];

		assert_int_equal(kvt_store_f32(KVT_DTYPE_BF16, h, src, NG * GR), 0);
		assert_int_equal(kvt_quant_ref(KVT_DTYPE_INT8, KVT_DTYPE_BF16, h, NG, GR, q,
					       scales), 0);
		assert_int_equal(kvt_dequant_ref(KVT_DTYPE_INT8, q, scales, NG, GR, KVT_DTYPE_F16,
						 h), 0);
	}
	assert_int_equal(kvt_quant_ref(KVT_DTYPE_F16, KVT_DTYPE_F32, src, 1, GR, q, scales),
			 -EINVAL);
	assert_int_equal(kvt_quant_ref(KVT_DTYPE_INT8, KVT_DTYPE_INT8, src, 1, GR, q, scales),
			 -EINVAL);
	assert_int_equal(kvt_dequant_ref(KVT_DTYPE_INT8, q, scales, 1, 0, KVT_DTYPE_F32, back),
			 -EINVAL);
}

#ifdef KVT_WITH_CUDA
/* The launchers check their arguments on the host before touching the GPU: testable here. */
static void
test_cuda_launcher_args(void **state)
{
	static const uint32_t table[1] = { 0 };
	float f[64];
	struct kvt_paged_kv kv = { .k_base = f, .v_offset = 64, .block_stride = 256,
				   .token_stride = 32, .table = table, .tokens_per_block = 1,
				   .n_kv_heads = 1, .head_dim = 8, .dtype = KVT_DTYPE_F32 };
	struct kvt_paged_kv bad = kv;

	(void)state;
	assert_int_equal(kvt_attn_cuda_work_floats(8, 128, 1), 0);
	assert_int_equal(kvt_attn_cuda_work_floats(8, 128, 4), 4 * 8 * 130);
	assert_int_equal(kvt_attn_decode_cuda(&kv, f, 3, 0, 1, NULL, f, NULL), -EINVAL);
	assert_int_equal(kvt_attn_decode_cuda(NULL, f, 2, 1, 1, NULL, f, NULL), -EINVAL);
	assert_int_equal(kvt_attn_decode_cuda(&kv, f, 2, 1, 0, NULL, f, NULL), -EINVAL);
	assert_int_equal(kvt_attn_decode_cuda(&kv, f, 2, 8, 4, NULL, f, NULL), -EINVAL);
	bad.n_kv_heads = 3;
	bad.token_stride = 3 * 8 * 4;
	assert_int_equal(kvt_attn_decode_cuda(&bad, f, 4, 1, 1, NULL, f, NULL), -EINVAL);
	bad = kv;
	bad.head_dim = 4097;
	bad.token_stride = 4097 * 4;
	assert_int_equal(kvt_attn_decode_cuda(&bad, f, 1, 1, 1, NULL, f, NULL), -EINVAL);
	bad = kv;
	bad.token_stride = 34; /* not a multiple of 4 */
	assert_int_equal(kvt_attn_decode_cuda(&bad, f, 1, 1, 1, NULL, f, NULL), -EINVAL);
	assert_int_equal(kvt_attn_partial_cuda(&kv, f, 1, 1, 1, f, f, f, NULL), -EINVAL);
	assert_int_equal(kvt_attn_partial_cuda(&kv, f, 1, 0, 1, f, NULL, f, NULL), -EINVAL);
	/* split partial: the partial's checks, then n_splits and work */
	assert_int_equal(kvt_attn_partial_split_cuda(&kv, f, 1, 1, 1, 1, NULL, f, f, f, NULL),
			 -EINVAL);
	assert_int_equal(kvt_attn_partial_split_cuda(&kv, f, 1, 0, 1, 1, NULL, f, f, NULL, NULL),
			 -EINVAL);
	assert_int_equal(kvt_attn_partial_split_cuda(&kv, f, 2, 0, 8, 0, f, f, f, f, NULL),
			 -EINVAL);
	assert_int_equal(kvt_attn_partial_split_cuda(&kv, f, 2, 0, 8, KVT_ATTN_CUDA_MAX_SPLITS + 1,
						     f, f, f, f, NULL), -EINVAL);
	assert_int_equal(kvt_attn_partial_split_cuda(&kv, f, 2, 0, 8, 4, NULL, f, f, f, NULL),
			 -EINVAL);
	assert_int_equal(kvt_gather_blocks_cuda(f, f, 64, 0, 64, table, 0, NULL), 0);
	assert_int_equal(kvt_gather_blocks_cuda(NULL, f, 64, 0, 64, table, 1, NULL), -EINVAL);
	assert_int_equal(kvt_gather_blocks_cuda(f, f, 64, 32, 64, table, 1, NULL), -EINVAL);
	assert_int_equal(kvt_gather_blocks_cuda(f, f, 64, 0, 0, table, 1, NULL), -EINVAL);
	assert_int_equal(kvt_scatter_blocks_cuda(f, 64, 0, 64, f, NULL, 1, NULL), -EINVAL);
	/* split choice: about 4 blocks per SM, windows of >= 256 positions, never 0 */
	assert_int_equal(kvt_attn_cuda_splits(32, 8, 100, 132), 1);
	assert_int_equal(kvt_attn_cuda_splits(32, 8, 1 << 20, 132), 66); /* 8 groups of 4 heads */
	assert_int_equal(kvt_attn_cuda_splits(32, 8, 2560, 132), 10);
	assert_int_equal(kvt_attn_cuda_splits(6, 2, 1 << 20, 6), 4); /* hg 1: 6 blocks a window */
	assert_int_equal(kvt_attn_cuda_splits(6, 2, 1 << 20, 0), 1);
	/* window arguments (host-side, nothing queued) */
	bad = kv;
	bad.seq_len = 3;
	assert_int_equal(kvt_attn_decode_cuda(&bad, f, 1, 4, 1, NULL, f, NULL), -EINVAL);
	assert_int_equal(kvt_attn_partial_cuda(&bad, f, 1, 0, 4, f, f, f, NULL), -EINVAL);
	bad = kv;
	bad.pos = table;
	bad.n_entries = 0;
	assert_int_equal(kvt_attn_decode_cuda(&bad, f, 1, 1, 1, NULL, f, NULL), -EINVAL);
	/* latent launchers */
	{
		struct kvt_paged_latent lk = { .base = f, .block_stride = 256, .token_stride = 48,
					       .table = table, .tokens_per_block = 1,
					       .kv_lora_rank = 8, .rope_dim = 4,
					       .dtype = KVT_DTYPE_F32 };
		struct kvt_paged_latent lb = lk;

		assert_int_equal(kvt_attn_latent_cuda_work_floats(16, 512, 1), 0);
		assert_int_equal(kvt_attn_latent_cuda_work_floats(16, 512, 3), 3 * 16 * 514);
		assert_int_equal(kvt_attn_latent_cuda_splits(16, 100, 132), 1);
		assert_int_equal(kvt_attn_latent_cuda_splits(16, 1 << 20, 132), 264);
		assert_int_equal(kvt_attn_latent_cuda_splits(128, 1 << 20, 132), 33);
		assert_int_equal(kvt_attn_latent_decode_cuda(NULL, f, f, 1, 1, 1.0f, 1, NULL, f,
							     NULL), -EINVAL);
		assert_int_equal(kvt_attn_latent_decode_cuda(&lk, f, NULL, 1, 1, 1.0f, 1, NULL, f,
							     NULL), -EINVAL);
		assert_int_equal(kvt_attn_latent_decode_cuda(&lk, f, f, 1, 1, 0.0f, 1, NULL, f,
							     NULL), -EINVAL);
		assert_int_equal(kvt_attn_latent_decode_cuda(&lk, f, f, 0, 1, 1.0f, 1, NULL, f,
							     NULL), -EINVAL);
		assert_int_equal(kvt_attn_latent_decode_cuda(&lk, f, f, 1, 0, 1.0f, 1, NULL, f,
							     NULL), -EINVAL);
		assert_int_equal(kvt_attn_latent_decode_cuda(&lk, f, f, 1, 8, 1.0f, 4, NULL, f,
							     NULL), -EINVAL);
		assert_int_equal(kvt_attn_latent_partial_cuda(&lk, f, f, 1, 0, 1, 1.0f, 1, NULL, f,
							      NULL, f, NULL), -EINVAL);
		lb.kv_lora_rank = 2000;
		lb.rope_dim = 64; /* 2064 > 2048 */
		lb.token_stride = 2064 * 4;
		assert_int_equal(kvt_attn_latent_decode_cuda(&lb, f, f, 1, 1, 1.0f, 1, NULL, f,
							     NULL), -EINVAL);
		lb = lk;
		lb.token_stride = 46; /* below one vector, and not aligned */
		assert_int_equal(kvt_attn_latent_decode_cuda(&lb, f, f, 1, 1, 1.0f, 1, NULL, f,
							     NULL), -EINVAL);
		lb.token_stride = 50;
		assert_int_equal(kvt_attn_latent_decode_cuda(&lb, f, f, 1, 1, 1.0f, 1, NULL, f,
							     NULL), -EINVAL);
	}
}
#endif

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_decode_matches_llama2),
		cmocka_unit_test(test_partial_merge),
		cmocka_unit_test(test_merge_symmetric),
		cmocka_unit_test(test_bad_args),
		cmocka_unit_test(test_window_decode),
		cmocka_unit_test(test_window_stream),
		cmocka_unit_test(test_merge_empty),
		cmocka_unit_test(test_attn_visible),
		cmocka_unit_test(test_learned_sink_merge),
		cmocka_unit_test(test_window_bad_args),
		cmocka_unit_test(test_latent_matches_loop),
		cmocka_unit_test(test_latent_stream),
		cmocka_unit_test(test_latent_vs_expanded),
		cmocka_unit_test(test_latent_bad_args),
		cmocka_unit_test(test_f16_known_values),
		cmocka_unit_test(test_bf16_known_values),
		cmocka_unit_test(test_conversion_sweeps),
		cmocka_unit_test(test_store_load),
		cmocka_unit_test(test_gather_ref),
		cmocka_unit_test(test_e4m3),
		cmocka_unit_test(test_quant_ref),
#ifdef KVT_WITH_CUDA
		cmocka_unit_test(test_cuda_launcher_args),
#endif
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
