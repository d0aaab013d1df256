/* SPDX-License-Identifier: MIT */
/*
 * tests/test_window.c - sliding-window semantics of a core engine (issue 16 items 3 and 7):
 * kvt_engine_set_window's rules; blocks wholly out of the window of the next query (and not
 * sinks) leave the sequence at append, so held memory stays bounded by
 * ceil((window + sink) / tpb) + 1 blocks at 8x the window; the block table lists the sinks and
 * the window with each entry's position; park/resume move only in-window blocks; prefix hits
 * need only the window before the boundary. And the peers' bugs: prompts ending on a block
 * boundary and one token either side, out-of-window blocks being demoted while a hit wants
 * them (vLLM #42761), reuse past the window (TensorRT-LLM #2912/#2983), short prompts still
 * hit (vLLM #40696).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_impl.h"
#include "tiers/format.h"
#include "tiers/tier_nvme.h"
#include "support/kvt_test.h"

#define T (TSUP_TPB)
#define W 16u          /* window in tokens: 4 blocks */
#define S 4u           /* sink tokens: 1 block */
#define BOUND (((W + S) + T - 1) / T + 1) /* ceil((window + sink) / tpb) + 1 blocks */
#define MAXTOK 1024u

/* One sequence as the test knows it: its token ids and the pattern tag of each position's
 * K/V (a shared block holds its creator's tag: sequences sharing tokens share the tag). */
struct wseq {
	kvt_seq_id id;
	uint64_t n;
	int32_t tok[MAXTOK];
	uint32_t tag[MAXTOK];
};

static struct kvt_engine *
win_engine(uint32_t hbm, uint32_t host, uint32_t window, uint32_t sink, bool cache,
	   bool watermarks)
{
	struct kvt_engine_opts o;
	struct kvt_engine *e = NULL;
	int rc;

	tsup_opts_init(&o);
	o.hbm_bytes = (uint64_t)hbm * tsup_block_bytes();
	o.host_bytes = (uint64_t)host * tsup_block_bytes();
	o.emu_seed = 42;
	o.prefix_cache = cache;
	if (!watermarks)
		o.high_watermark = o.low_watermark = 1.0f;
	rc = kvt_engine_create(&o, &e);
	if (rc)
		print_error("create: %s\n", kvt_last_error_message());
	assert_int_equal(rc, 0);
	rc = kvt_engine_set_window(e, window, sink);
	if (rc)
		print_error("set_window: %s\n", kvt_last_error_message());
	assert_int_equal(rc, 0);
	return e;
}

/* Append @n tokens (ids tok[], tag for their K/V) to @s and write their K/V; rc. */
static int
w_append(struct kvt_engine *e, struct wseq *s, const int32_t *tok, uint32_t tag, size_t n)
{
	struct kvt_geometry g;
	int64_t map[64];
	uint32_t l, i;
	size_t t;
	int rc;

	assert_true(n <= 64 && s->n + n <= MAXTOK);
	rc = kvt_seq_append(e, s->id, tok, n, map);
	if (rc)
		return rc;
	assert_int_equal(kvt_engine_geometry(e, &g), 0);
	for (t = 0; t < n; t++) {
		s->tok[s->n + t] = tok[t];
		s->tag[s->n + t] = tag;
		for (l = 0; l < TSUP_LAYERS; l++) {
			float *k, *v;

			kvt_kv_addr(&g, l, map[t], (void **)&k, (void **)&v);
			for (i = 0; i < TSUP_HEADS * TSUP_DIM; i++) {
				k[i] = tsup_val(tag, s->n + t, l, 0, i);
				v[i] = tsup_val(tag, s->n + t, l, 1, i);
			}
		}
	}
	s->n += n;
	return 0;
}

/* Append tokens base + pos for positions [s->n, s->n + n), in pieces of 64. */
static void
w_fill(struct kvt_engine *e, struct wseq *s, int32_t base, uint32_t tag, size_t n)
{
	int32_t tok[64];

	while (n) {
		size_t c = n < 64 ? n : 64, t;

		for (t = 0; t < c; t++)
			tok[t] = base + (int32_t)(s->n + t);
		assert_int_equal(w_append(e, s, tok, tag, c), 0);
		n -= c;
	}
}

/* Blocks the query at position @q reads: sinks, then [first block of its window, q / T]. */
static bool
w_needed(uint64_t q, uint32_t window, uint32_t sink, uint32_t j)
{
	uint64_t lo = q + 1 > window ? q + 1 - window : 0;

	return (uint64_t)j * T < sink || (j >= lo / T && j <= q / T);
}

/*
 * Prepare @s alone, wait, and check its table: seq_len is the sequence's length, the entries
 * are in increasing position, cover every block the last query reads (and every block the
 * first query of the last append, @q0, reads), and hold the K/V written there. 0 or 1.
 */
static int
w_verify(struct kvt_engine *e, const struct wseq *s, uint64_t q0)
{
	struct kvt_block_table bt;
	struct kvt_batch *b = NULL;
	const uint32_t *pos;
	uint32_t l, k, n, j, i, t, prev = 0, seen = 0;
	int rc = kvt_batch_prepare(e, &s->id, 1, &b);

	if (rc) {
		print_error("prepare: %s\n", kvt_last_error_message());
		return rc;
	}
	for (l = 0; l < TSUP_LAYERS && rc == 0; l++)
		rc = kvt_batch_wait_layer(b, l, NULL);
	assert_int_equal(rc, 0);
	assert_int_equal(kvt_batch_block_table(b, &bt), 0);
	pos = kvt_batch_block_pos(b);
	assert_non_null(pos);
	assert_int_equal(bt.seq_len[0], s->n);
	n = bt.indptr[1] - bt.indptr[0];
	for (k = 0; k < n && rc == 0; k++) {
		uint32_t p = pos[bt.indptr[0] + k], slot = bt.indices[bt.indptr[0] + k];

		if (k && p <= prev)
			rc = 1;
		prev = p;
		for (t = 0; t < T && (uint64_t)p * T + t < s->n && rc == 0; t++) {
			uint64_t at = (uint64_t)p * T + t;
			int64_t m = (int64_t)slot * T + t;

			for (l = 0; l < TSUP_LAYERS && rc == 0; l++) {
				float *kk, *vv;

				kvt_kv_addr(&bt.geo, l, m, (void **)&kk, (void **)&vv);
				for (i = 0; i < TSUP_HEADS * TSUP_DIM; i++)
					if (kk[i] != tsup_val(s->tag[at], at, l, 0, i) ||
					    vv[i] != tsup_val(s->tag[at], at, l, 1, i)) {
						print_error("pos %llu layer %u: K %g, want %g\n",
							    (unsigned long long)at, l, kk[i],
							    tsup_val(s->tag[at], at, l, 0, i));
						rc = 1;
						break;
					}
			}
		}
	}
	/* every block the queries read is listed */
	for (j = 0; j * T < s->n && rc == 0; j++) {
		bool listed = false;

		if (!w_needed(s->n - 1, e->win_tokens, e->win_sink, j) &&
		    !w_needed(q0, e->win_tokens, e->win_sink, j))
			continue;
		for (k = 0; k < n; k++)
			listed |= pos[bt.indptr[0] + k] == j;
		seen += listed;
		if (!listed) {
			print_error("block %u is read but not in the table\n", j);
			rc = 1;
		}
	}
	(void)seen;
	assert_int_equal(kvt_batch_release(b, NULL), 0);
	return rc;
}

/* Blocks of @s with a copy in any tier, every copy counted (HBM + HOST + NVMe). */
static uint32_t
w_held(struct kvt_engine *e, kvt_seq_id s)
{
	struct kvt_seq_info si;
	uint32_t n = 0;
	int t;

	assert_int_equal(kvt_seq_info(e, s, &si), 0);
	for (t = 0; t < KVT_TIER_COUNT; t++)
		n += si.blocks_in[t];
	return n;
}

/* Slots in use in every tier together. */
static uint32_t
w_used(struct kvt_engine *e)
{
	struct kvt_stats st = tsup_stats(e);
	uint32_t n = 0;
	int t;

	for (t = 0; t < KVT_TIER_COUNT; t++)
		n += st.tier[t].used_slots;
	return n;
}

static struct wseq *
w_new(struct kvt_engine *e, const struct kvt_seq_opts *o)
{
	struct wseq *s = calloc(1, sizeof *s);

	assert_non_null(s);
	assert_int_equal(kvt_seq_open(e, o, &s->id), 0);
	return s;
}

static void
test_set_window_rules(void **state)
{
	struct kvt_engine *e = win_engine(8, 0, 0, 0, false, false);
	kvt_seq_id s;

	(void)state;
	assert_int_equal(kvt_engine_set_window(NULL, 16, 0), -EINVAL);
	assert_int_equal(kvt_engine_set_window(e, 0, 4), -EINVAL); /* sink without window */
	assert_non_null(strstr(kvt_last_error_message(), "without a window"));
	assert_int_equal(kvt_engine_set_window(e, 16, 4), 0);
	assert_int_equal(kvt_engine_set_window(e, 0, 0), 0); /* back to full attention */
	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	assert_int_equal(kvt_engine_set_window(e, 16, 4), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "already opened"));
	assert_int_equal(kvt_seq_close(e, s), 0);
	assert_int_equal(kvt_engine_set_window(e, 16, 4), -EINVAL); /* fixed for good */
	kvt_engine_destroy(e);
}

/*
 * Decode 8x the window a token at a time (a batch per step, as a server does): after each
 * step the sequence holds at most ceil((window + sink) / tpb) + 1 blocks in all tiers
 * together (every copy counted), so does the engine (no prefix cache: dropped blocks leave
 * every tier), and its table holds the sinks and the window with their K/V.
 */
static void
test_held_bounded_at_8x_window(void **state)
{
	struct kvt_engine *e = win_engine(16, 16, W, S, false, true);
	struct wseq *s = w_new(e, NULL);
	uint32_t most = 0, step;

	(void)state;
	w_fill(e, s, 100, 1, 3); /* a prompt shorter than a block */
	assert_int_equal(w_verify(e, s, 0), 0);
	for (step = 0; s->n < 8 * W; step++) {
		uint64_t q0 = s->n;

		w_fill(e, s, 100, 1, 1);
		assert_int_equal(w_verify(e, s, q0), 0);
		if (w_held(e, s->id) > most)
			most = w_held(e, s->id);
		assert_true(w_held(e, s->id) <= BOUND);
		assert_true(w_used(e) <= BOUND);
		if (step % 16 == 0)
			tsup_check_engine(e);
	}
	assert_int_equal(s->n, 8 * W);
	assert_true(most >= (W + S) / T); /* the window itself is held */
	print_message("window %u + sink %u tokens, tpb %u, %u tokens decoded: at most %u blocks "
		      "held in all tiers (bound %u; full attention: %u)\n", W, S, T, 8 * W, most,
		      BOUND, 8 * W / T);
	/* a prefill chunk longer than the window: its first query still sees its window */
	w_fill(e, s, 100, 1, 2 * W);
	assert_int_equal(w_verify(e, s, 8 * W), 0);
	w_fill(e, s, 100, 1, 1);
	assert_true(w_held(e, s->id) <= BOUND);
	tsup_check_engine(e);
	assert_int_equal(kvt_seq_close(e, s->id), 0);
	assert_int_equal(w_used(e), 0);
	tsup_check_engine(e);
	free(s);
	kvt_engine_destroy(e);
}

/* Chunked prefill without a release between appends (write pins of dropped blocks go too). */
static void
test_prefill_chunks_without_release(void **state)
{
	struct kvt_engine *e = win_engine(12, 8, W, S, false, false);
	struct wseq *s = w_new(e, NULL);
	uint32_t i;

	(void)state;
	for (i = 0; i < 16; i++)
		w_fill(e, s, 7, 2, 2 * T); /* 8 blocks of HBM would be pinned without drops */
	assert_true(w_held(e, s->id) <= BOUND + 1); /* the chunk's two blocks on top */
	assert_int_equal(w_verify(e, s, s->n - 2 * T), 0);
	tsup_check_engine(e);
	assert_int_equal(kvt_seq_close(e, s->id), 0);
	free(s);
	kvt_engine_destroy(e);
}

/* Park and resume move only the blocks in the window (and sinks). */
static void
test_park_moves_only_window(void **state)
{
	struct kvt_engine *e = win_engine(16, 16, W, S, false, false);
	struct wseq *s = w_new(e, NULL);
	struct kvt_stats a, b;
	uint32_t live;

	(void)state;
	w_fill(e, s, 5, 3, 40);
	w_fill(e, s, 5, 3, 40);
	w_fill(e, s, 5, 3, 1);
	live = w_held(e, s->id);
	assert_true(live <= BOUND);
	a = tsup_stats(e);
	assert_int_equal(kvt_seq_park(e, s->id, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	b = tsup_stats(e);
	assert_int_equal(b.blocks_moved[KVT_MOVE_HBM_TO_HOST] -
			 a.blocks_moved[KVT_MOVE_HBM_TO_HOST], live);
	assert_int_equal(tsup_blocks_in(e, s->id, KVT_TIER_HOST), live);
	assert_int_equal(tsup_blocks_in(e, s->id, KVT_TIER_HBM), 0);
	assert_int_equal(kvt_seq_resume(e, s->id), 0);
	assert_int_equal(w_verify(e, s, s->n - 1), 0);
	b = tsup_stats(e);
	assert_int_equal(b.blocks_moved[KVT_MOVE_HOST_TO_HBM] -
			 a.blocks_moved[KVT_MOVE_HOST_TO_HBM], live);
	tsup_check_engine(e);
	assert_int_equal(kvt_seq_close(e, s->id), 0);
	free(s);
	kvt_engine_destroy(e);
}

/*
 * Prompts ending exactly on a block boundary and one token either side, longer than the
 * window and shorter: a second request with the prompt hits every full block (those the first
 * dropped out of its window since are cached) and reads the first's K/V in its window.
 */
static void
test_boundary_prompts(void **state)
{
	static const int32_t lens[] = { 10 * T - 1, 10 * T, 10 * T + 1, 3 * T - 1, 3 * T,
					3 * T + 1 };
	size_t li;

	(void)state;
	for (li = 0; li < sizeof lens / sizeof lens[0]; li++) {
		struct kvt_engine *e = win_engine(24, 16, W, S, true, false);
		struct wseq *a = w_new(e, NULL), *b = w_new(e, NULL);
		uint32_t L = (uint32_t)lens[li], full = L / T;
		uint64_t m = 0, q0;
		enum kvt_tier tier;

		w_fill(e, a, 1000, 1, L);
		/* a's prompt in one append; its first decode step drops what it no longer reads */
		assert_int_equal(w_verify(e, a, 0), 0);
		w_fill(e, a, 1000, 1, 1);
		assert_int_equal(w_verify(e, a, L), 0);
		assert_int_equal(kvt_seq_match_prefix(e, NULL, a->tok, L, &m, &tier), 0);
		assert_int_equal(m, (uint64_t)full * T);
		assert_int_equal(tier, KVT_TIER_HBM);
		assert_int_equal(kvt_seq_attach_prefix(e, b->id, a->tok, L, &m), 0);
		assert_int_equal(m, (uint64_t)full * T);
		memcpy(b->tok, a->tok, sizeof b->tok);
		memcpy(b->tag, a->tag, sizeof b->tag);
		b->n = m;
		q0 = b->n;
		/* the rest of the prompt (none on a boundary), then its own token */
		if (L > m) {
			w_fill(e, b, 1000, 1, L - m);
			assert_int_equal(w_verify(e, b, q0), 0);
		}
		w_fill(e, b, 5000, 2, 1);
		assert_int_equal(w_verify(e, b, L), 0);
		assert_true(w_held(e, b->id) <= BOUND);
		assert_int_equal(w_verify(e, a, a->n - 1), 0);
		tsup_check_engine(e);
		assert_int_equal(kvt_seq_close(e, a->id), 0);
		assert_int_equal(kvt_seq_close(e, b->id), 0);
		tsup_check_engine(e);
		free(a);
		free(b);
		kvt_engine_destroy(e);
	}
}

/*
 * vLLM #42761: the out-of-window blocks of a session (cached, refs 0) are being demoted, their
 * copies to HOST held in flight, while a prefix hit wants them: the hit reads the right K/V,
 * never another block's, never stale bytes.
 */
static void
test_hit_while_demoting(void **state)
{
	struct kvt_engine *e = win_engine(16, 32, W, S, true, true);
	struct wseq *a = w_new(e, NULL), *b = w_new(e, NULL), *c = w_new(e, NULL);
	uint32_t x, inflight = 0, boundary = 6; /* a hit of 6 blocks: reads blocks 0, 2..5 */
	uint64_t m = 0;

	(void)state;
	w_fill(e, a, 1, 1, 6 * T);
	assert_int_equal(w_verify(e, a, 0), 0);
	w_fill(e, a, 1, 1, 4 * T);
	w_fill(e, a, 1, 1, 1); /* blocks 1..5 are out of a's window now: cached, refs 0 */
	assert_int_equal(w_verify(e, a, a->n - 1), 0);
	assert_true(w_held(e, a->id) <= BOUND);
	/* c fills HBM past its high watermark; at c's release the coldest blocks, the cached
	 * ones (their only copy in HBM), are demoted, and those copies are held in flight */
	w_fill(e, c, 90000, 3, 5 * T); /* 16 of 16 HBM slots in use */
	assert_int_equal(kvt_device_emu_stream_hold(e->dev, e->d2h.s, true), 0);
	assert_int_equal(w_verify(e, c, 0), 0);
	kvt_lock(e);
	for (x = 0; x < e->cap_blocks; x++) {
		struct kvt_block *k = kvt_blk(e, x);

		if (k->live && !k->dead && k->refs == 0 && k->index >= 2 && k->index < boundary &&
		    kvt_copy_state(k, KVT_TIER_HOST) == KVT_COPY_INFLIGHT)
			inflight++;
	}
	kvt_unlock(e);
	assert_true(inflight > 0); /* the hit below races real demotions */
	assert_int_equal(kvt_seq_attach_prefix(e, b->id, a->tok, boundary * T, &m), 0);
	assert_int_equal(m, (uint64_t)boundary * T);
	memcpy(b->tok, a->tok, sizeof b->tok);
	memcpy(b->tag, a->tag, sizeof b->tag);
	b->n = m;
	/* b's batch while the demotions are still in flight: its blocks stay in HBM */
	assert_int_equal(w_verify(e, b, boundary * T - 1), 0);
	assert_int_equal(kvt_device_emu_stream_hold(e->dev, e->d2h.s, false), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(w_verify(e, b, boundary * T - 1), 0);
	w_fill(e, b, 777, 4, 1);
	assert_int_equal(w_verify(e, b, boundary * T), 0);
	assert_int_equal(w_verify(e, a, a->n - 1), 0);
	tsup_check_engine(e);
	free(a);
	free(b);
	free(c);
	kvt_engine_destroy(e);
}

/*
 * TensorRT-LLM #2912/#2983 (reuse past the window): b reuses a's prompt, longer than the
 * window; both decode past the window with different tokens; a third request reuses a's
 * prompt after both moved on. Writes are linear (no cyclic buffer): no one's K/V is
 * overwritten by another's, and every hit reads the prompt's K/V.
 */
static void
test_reuse_past_window(void **state)
{
	struct kvt_engine *e = win_engine(32, 32, W, S, true, false);
	struct wseq *a = w_new(e, NULL), *b = w_new(e, NULL), *c = w_new(e, NULL);
	uint64_t m = 0;
	uint32_t i;

	(void)state;
	w_fill(e, a, 10, 1, 9 * T);
	assert_int_equal(w_verify(e, a, 0), 0);
	assert_int_equal(kvt_seq_attach_prefix(e, b->id, a->tok, 9 * T, &m), 0);
	assert_int_equal(m, 9 * T);
	memcpy(b->tok, a->tok, sizeof b->tok);
	memcpy(b->tag, a->tag, sizeof b->tag);
	b->n = m;
	for (i = 0; i < 3 * W; i++) {
		uint64_t qa = a->n, qb = b->n;

		w_fill(e, a, 20000, 1, 1);
		w_fill(e, b, 30000, 2, 1);
		assert_int_equal(w_verify(e, a, qa), 0);
		assert_int_equal(w_verify(e, b, qb), 0);
		assert_true(w_held(e, a->id) <= BOUND && w_held(e, b->id) <= BOUND);
	}
	/* the prompt again: its window before the boundary was kept cached */
	assert_int_equal(kvt_seq_attach_prefix(e, c->id, a->tok, 9 * T + 2, &m), 0);
	assert_int_equal(m, 9 * T);
	memcpy(c->tok, a->tok, sizeof c->tok);
	memcpy(c->tag, a->tag, sizeof c->tag);
	c->n = m;
	w_fill(e, c, 40000, 3, 1);
	assert_int_equal(w_verify(e, c, 9 * T), 0);
	/* a's decoded tokens, past the window, are a prefix too (its own blocks) */
	assert_int_equal(kvt_seq_match_prefix(e, NULL, a->tok, a->n, &m, NULL), 0);
	assert_int_equal(m, a->n / T * T);
	tsup_check_engine(e);
	free(a);
	free(b);
	free(c);
	kvt_engine_destroy(e);
}

/* vLLM #40696: prompts shorter than the window, one block or two, still hit. */
static void
test_short_prompts_hit(void **state)
{
	struct kvt_engine *e = win_engine(16, 0, W, S, true, false);
	struct wseq *a = w_new(e, NULL), *b = w_new(e, NULL);
	uint64_t m = 0;

	(void)state;
	w_fill(e, a, 3, 1, T + 2);
	assert_int_equal(w_verify(e, a, 0), 0);
	assert_int_equal(kvt_seq_match_prefix(e, NULL, a->tok, T + 1, &m, NULL), 0);
	assert_int_equal(m, T);
	assert_int_equal(kvt_seq_match_prefix(e, NULL, a->tok, T - 1, &m, NULL), 0);
	assert_int_equal(m, 0);
	assert_int_equal(kvt_seq_attach_prefix(e, b->id, a->tok, T + 2, &m), 0);
	assert_int_equal(m, T);
	memcpy(b->tok, a->tok, sizeof b->tok);
	memcpy(b->tag, a->tag, sizeof b->tag);
	b->n = m;
	w_fill(e, b, 3, 1, 2);
	assert_int_equal(w_verify(e, b, T), 0);
	tsup_check_engine(e);
	free(a);
	free(b);
	kvt_engine_destroy(e);
}

/*
 * A hit is never refused because out-of-window blocks were dropped (and freed: no prefix
 * cache), and never served from another prefix's blocks: a prompt that differs from a's in a
 * dropped block hashes differently from there on, so its window is not found.
 */
static void
test_hit_needs_only_window(void **state)
{
	struct kvt_engine *e = win_engine(24, 0, W, S, false, false);
	struct wseq *a = w_new(e, NULL), *b = w_new(e, NULL);
	int32_t other[MAXTOK];
	uint64_t m = 0;

	(void)state;
	w_fill(e, a, 50, 1, 12 * T);
	assert_int_equal(w_verify(e, a, 0), 0);
	w_fill(e, a, 50, 1, 1); /* blocks 1..8 dropped, freed */
	assert_int_equal(w_verify(e, a, a->n - 1), 0);
	assert_true(w_used(e) <= BOUND);
	assert_int_equal(kvt_seq_match_prefix(e, NULL, a->tok, 12 * T, &m, NULL), 0);
	assert_int_equal(m, 12 * T);
	/* a boundary whose window reaches dropped blocks is not served: the longest one that
	 * is, here the sink block alone */
	assert_int_equal(kvt_seq_match_prefix(e, NULL, a->tok, 10 * T, &m, NULL), 0);
	assert_int_equal(m, T);
	memcpy(other, a->tok, sizeof other);
	other[2 * T] = 123456; /* in a dropped block: every key from there on differs */
	assert_int_equal(kvt_seq_match_prefix(e, NULL, other, 12 * T, &m, NULL), 0);
	assert_int_equal(m, T);
	assert_int_equal(kvt_seq_attach_prefix(e, b->id, a->tok, 12 * T + 3, &m), 0);
	assert_int_equal(m, 12 * T);
	memcpy(b->tok, a->tok, sizeof b->tok);
	memcpy(b->tag, a->tag, sizeof b->tag);
	b->n = m;
	w_fill(e, b, 50, 1, 3);
	assert_int_equal(w_verify(e, b, 12 * T), 0);
	tsup_check_engine(e);
	free(a);
	free(b);
	kvt_engine_destroy(e);
}

/* An engine on the persistent store of @o with window W and S sinks (a start or a restart). */
static struct kvt_engine *
w_store_engine(const struct kvt_engine_opts *o)
{
	struct kvt_engine *e = tsup_create(o, NULL);

	assert_int_equal(kvt_engine_set_window(e, W, S), 0);
	return e;
}

/* A sequence of @so (a session key) with 41 tokens of pattern 5 (holes 1..5: query 40 reads
 * 25..40, blocks 6..10), parked to NVMe and drained: stored. */
static struct wseq *
w_stored_session(struct kvt_engine *e, const struct kvt_seq_opts *so)
{
	struct wseq *s = w_new(e, so);

	w_fill(e, s, 9, 5, 10 * T);
	w_fill(e, s, 9, 5, 1);
	assert_int_equal(kvt_seq_park(e, s->id, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	return s;
}

/*
 * The store records a session with holes (docs/FORMAT.md, KVT_FMT_HOLE): a keyed sequence that
 * dropped blocks out of its window parks to NVMe (only its window moves), is published, and
 * detaches; it restores, here and after a restart, holding only its window, which reads the
 * K/V written, and decodes on (its next block chains to the kept key of the last hole). An
 * engine whose window would read the dropped blocks (a wider one, or none) refuses it clearly.
 */
static void
test_store_with_holes(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_seq_opts so;
	struct kvt_engine *e;
	struct wseq *s;
	char *dir = tsup_mkdtemp();
	uint32_t moved;
	kvt_seq_id r;
	uint64_t m;

	(void)state;
	tsup_store_opts(&o, dir, 1u << 20);
	e = w_store_engine(&o);
	kvt_seq_opts_init(&so, sizeof so);
	so.session_key = 0x77;
	s = w_stored_session(e, &so);
	moved = tsup_blocks_in(e, s->id, KVT_TIER_NVME);
	assert_true(moved <= BOUND);
	assert_int_equal(kvt_seq_detach(e, s->id), 0);
	tsup_check_engine(e);
	assert_int_equal(kvt_seq_restore(e, 0x77, &so, &r), 0);
	s->id = r;
	assert_int_equal(w_held(e, r), moved);
	assert_int_equal(kvt_seq_resume(e, r), 0);
	assert_int_equal(w_verify(e, s, 40), 0);
	tsup_check_engine(e);
	assert_int_equal(kvt_seq_park(e, r, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_detach(e, r), 0);
	kvt_engine_destroy(e);
	/* a restart */
	e = w_store_engine(&o);
	assert_int_equal(kvt_seq_restore(e, 0x77, &so, &r), 0);
	s->id = r;
	assert_int_equal(kvt_seq_resume(e, r), 0);
	assert_int_equal(w_verify(e, s, 40), 0);
	w_fill(e, s, 9, 5, 3 * T); /* decodes on: blocks 10.. hashed over every token */
	assert_int_equal(w_verify(e, s, 41), 0);
	assert_int_equal(kvt_seq_match_prefix(e, &so, s->tok, s->n, &m, NULL), 0);
	assert_int_equal(m, s->n / T * T);
	tsup_check_engine(e);
	assert_int_equal(kvt_seq_park(e, r, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_seq_detach(e, r), 0);
	kvt_engine_destroy(e);
	/* a wider window, or none, would read the dropped blocks: refused */
	e = tsup_create(&o, NULL);
	assert_int_equal(kvt_engine_set_window(e, 4 * W, S), 0);
	assert_int_equal(kvt_seq_restore(e, 0x77, &so, &r), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "dropped blocks"));
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	e = tsup_create(&o, NULL);
	assert_int_equal(kvt_seq_restore(e, 0x77, &so, &r), -EINVAL);
	assert_non_null(strstr(kvt_last_error_message(), "dropped blocks"));
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	free(s);
	tsup_rmdir(dir);
}

/*
 * Prefix hits after a restart from a session stored with holes: a new sequence of a restarted
 * windowed engine whose prompt starts with the stored session's tokens attaches its longest
 * full-block boundary whose window (and sinks) the session stored, the blocks between them
 * holes; they hold the stored K/V and the sequence decodes on. A boundary whose window reaches
 * the session's holes is not served, nor a prompt that differs in a dropped block (its keys
 * differ from there on), nor another tenant. Restoring the session afterwards shares the
 * blocks the attach made. (Before: a windowed engine never looked at the store: no hit.)
 */
static void
test_store_prefix_after_restart(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_seq_opts so, other_tenant;
	struct kvt_engine *e;
	struct wseq *a, *b, *c;
	char *dir = tsup_mkdtemp();
	int32_t other[MAXTOK];
	enum kvt_tier tier;
	kvt_seq_id r;
	uint64_t m;

	(void)state;
	tsup_store_opts(&o, dir, 1u << 20);
	e = w_store_engine(&o);
	kvt_seq_opts_init(&so, sizeof so);
	so.session_key = 0x88;
	a = w_stored_session(e, &so); /* 41 tokens: holes 1..5, the window 6..10 */
	assert_int_equal(kvt_seq_detach(e, a->id), 0);
	kvt_engine_destroy(e);

	e = w_store_engine(&o); /* a restart: only the store knows the blocks */
	assert_int_equal(kvt_seq_match_prefix(e, NULL, a->tok, 10 * T + 3, &m, &tier), 0);
	assert_int_equal(m, 10 * T);
	assert_int_equal(tier, KVT_TIER_NVME);
	/* 8 blocks: its window is blocks 4..7, and 4, 5 are holes; block 0 alone is served */
	assert_int_equal(kvt_seq_match_prefix(e, NULL, a->tok, 8 * T, &m, NULL), 0);
	assert_int_equal(m, T);
	memcpy(other, a->tok, sizeof other);
	other[2 * T] = 424242; /* in a dropped block */
	assert_int_equal(kvt_seq_match_prefix(e, NULL, other, 10 * T, &m, NULL), 0);
	assert_int_equal(m, T);
	kvt_seq_opts_init(&other_tenant, sizeof other_tenant);
	other_tenant.tenant = 3;
	assert_int_equal(kvt_seq_match_prefix(e, &other_tenant, a->tok, 10 * T, &m, NULL), 0);
	assert_int_equal(m, 0);

	b = w_new(e, NULL);
	assert_int_equal(kvt_seq_attach_prefix(e, b->id, a->tok, 10 * T + 3, &m), 0);
	assert_int_equal(m, 10 * T);
	memcpy(b->tok, a->tok, sizeof b->tok);
	memcpy(b->tag, a->tag, sizeof b->tag);
	b->n = m;
	assert_true(w_held(e, b->id) <= BOUND);
	w_fill(e, b, 9, 5, 3); /* decodes on from the stored window */
	assert_int_equal(w_verify(e, b, 10 * T), 0);
	tsup_check_engine(e);
	/* a second attach finds the blocks the first made, in the prefix index */
	c = w_new(e, NULL);
	assert_int_equal(kvt_seq_attach_prefix(e, c->id, a->tok, 10 * T, &m), 0);
	assert_int_equal(m, 10 * T);
	/* and the session itself restores, sharing them */
	assert_int_equal(kvt_seq_restore(e, 0x88, &so, &r), 0);
	a->id = r;
	assert_int_equal(kvt_seq_resume(e, r), 0);
	assert_int_equal(w_verify(e, a, 40), 0);
	tsup_check_engine(e);
	assert_int_equal(kvt_seq_close(e, c->id), 0);
	assert_int_equal(kvt_seq_close(e, b->id), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);

	/* the stored hit fails to be made (its 3rd block): the prefix index's shorter hit stands,
	 * its blocks intact (before: the failed blocks' ids replaced them, dead, and the
	 * engine's check failed) */
	e = w_store_engine(&o);
	c->n = 0;
	assert_int_equal(kvt_seq_open(e, NULL, &c->id), 0);
	w_fill(e, c, 9, 5, 2 * T); /* a's first 2 blocks, in the prefix index once released */
	assert_int_equal(w_verify(e, c, 0), 0);
	b->n = 0;
	assert_int_equal(kvt_seq_open(e, NULL, &b->id), 0);
	kvt_test_adopt_fail = 3;
	assert_int_equal(kvt_seq_attach_prefix(e, b->id, a->tok, 10 * T, &m), 0);
	kvt_test_adopt_fail = 0;
	assert_int_equal(m, 2 * T);
	tsup_check_engine(e);
	memcpy(b->tok, a->tok, sizeof b->tok);
	memcpy(b->tag, a->tag, sizeof b->tag);
	b->n = m;
	w_fill(e, b, 9, 5, 3);
	assert_int_equal(w_verify(e, b, 2 * T), 0);
	assert_int_equal(kvt_seq_close(e, b->id), 0);
	assert_int_equal(kvt_seq_close(e, c->id), 0);
	tsup_check_engine(e);
	kvt_engine_destroy(e);
	free(a);
	free(b);
	free(c);
	tsup_rmdir(dir);
}

/*
 * Windows and sinks of every shape against tpb 4 (smaller than a block, not multiples of it,
 * sinks longer than the window, a window of 1): decoding 8x the window, the table always
 * holds what the queries read, the K/V are right, the engine is consistent, and the sequence
 * holds at most ceil(sink / tpb) + ceil((window - 1) / tpb) + 1 blocks plus the one appended.
 */
static void
test_window_shapes(void **state)
{
	static const uint32_t shapes[][2] = { { 1, 0 }, { 1, 1 }, { 3, 0 }, { 4, 2 }, { 5, 5 },
					       { 7, 9 }, { 9, 3 }, { 13, 0 }, { 2, 17 } };
	size_t k;

	(void)state;
	for (k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
		uint32_t w = shapes[k][0], sk = shapes[k][1];
		uint32_t most = (sk + T - 1) / T + (w - 1 + T - 1) / T + 1 + 1;
		struct kvt_engine *e = win_engine(24, 8, w, sk, (k & 1) != 0, true);
		struct wseq *s = w_new(e, NULL);

		while (s->n < 8 * w + 2 * T + sk) {
			uint64_t q0 = s->n;

			w_fill(e, s, 11, 1, 1 + (s->n % 3 == 0) * 2); /* 1 or 3 tokens a step */
			assert_int_equal(w_verify(e, s, q0), 0);
			assert_true(w_held(e, s->id) <= most);
		}
		tsup_check_engine(e);
		assert_int_equal(kvt_seq_close(e, s->id), 0);
		tsup_check_engine(e);
		free(s);
		kvt_engine_destroy(e);
	}
}

/* Hints and ranges over a sequence with holes: only live blocks are promoted, pinned and
 * listed; a range wholly inside the holes holds no entry. */
static void
test_hints_and_ranges(void **state)
{
	struct kvt_engine *e = win_engine(16, 16, W, S, false, false);
	struct wseq *s = w_new(e, NULL);
	struct kvt_seq_range r[2];
	struct kvt_block_table bt;
	struct kvt_batch *b = NULL;
	uint32_t l;

	(void)state;
	w_fill(e, s, 4, 1, 48);
	w_fill(e, s, 4, 1, 1); /* 13 block positions: holes 1..7 (query 48 reads 33..48) */
	assert_int_equal(kvt_seq_park(e, s->id, KVT_TIER_HOST), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	assert_int_equal(kvt_engine_hint(e, &s->id, 1, 1), 0);
	r[0] = (struct kvt_seq_range){ .seq = s->id, .first_block = 0, .n_blocks = 9 };
	r[1] = (struct kvt_seq_range){ .seq = s->id, .first_block = 9, .n_blocks = 0 };
	assert_int_equal(kvt_engine_hint_ranges(e, r, 2, 1), 0);
	assert_int_equal(kvt_batch_prepare_ranges(e, r, 2, &b), 0);
	for (l = 0; l < TSUP_LAYERS; l++)
		assert_int_equal(kvt_batch_wait_layer(b, l, NULL), 0);
	assert_int_equal(kvt_batch_block_table(b, &bt), 0);
	assert_int_equal(bt.indptr[1] - bt.indptr[0], 2); /* the sink block, then block 8 */
	assert_int_equal(kvt_batch_block_pos(b)[0], 0);
	assert_int_equal(kvt_batch_block_pos(b)[1], 8);
	assert_int_equal(bt.indptr[2] - bt.indptr[1], 4); /* blocks 9..12 */
	assert_int_equal(kvt_batch_block_pos(b)[bt.indptr[1]], 9);
	assert_int_equal(kvt_batch_release(b, NULL), 0);
	r[0] = (struct kvt_seq_range){ .seq = s->id, .first_block = 2, .n_blocks = 5 };
	assert_int_equal(kvt_batch_prepare_ranges(e, r, 1, &b), 0);
	assert_int_equal(kvt_batch_block_table(b, &bt), 0);
	assert_int_equal(bt.indptr[1], 0); /* holes only */
	assert_int_equal(kvt_batch_release(b, NULL), 0);
	assert_int_equal(kvt_seq_set_priority(e, s->id, 0, 0, 90, 0), 0);
	assert_int_equal(w_verify(e, s, 48), 0);
	tsup_check_engine(e);
	free(s);
	kvt_engine_destroy(e);
}

/* The journal's field check (docs/FORMAT.md): a hole is slot KVT_FMT_HOLE with tag, length
 * code and reserved bytes 0, and holes do not count against the store's slots. */
static void
test_format_holes(void **state)
{
	const struct kvt_fmt_limits lim = { .n_slots = 2, .tokens_per_block = T,
					    .block_bytes = 1024, .codec = KVT_CODEC_NONE };
	struct kvt_fmt_blkref b[4];
	int32_t tok[4 * T] = { 0 };
	static uint8_t buf[4096];
	struct kvt_fmt_rec r;
	size_t used, n;
	int variant;

	(void)state;
	for (variant = 0; variant < 4; variant++) {
		memset(b, 0, sizeof b);
		b[0].slot = 0;
		b[1].slot = b[2].slot = KVT_FMT_HOLE;
		b[3].slot = 1;
		b[0].lenc = b[3].lenc = KVT_FMT_LENC_KNOWN | KVT_FMT_LENC_QMAX;
		b[0].tag = 5;
		b[3].tag = 6;
		if (variant == 1)
			b[2].tag = 1;  /* a hole with a tag */
		if (variant == 2)
			b[1].lenc = b[0].lenc; /* a hole with a length code */
		if (variant == 3)
			b[2].slot = 2; /* not a hole: 3 slots named, the store has 2 */
		n = kvt_fmt_put_bytes(4, 4 * T);
		assert_true(n <= sizeof buf);
		kvt_fmt_put_encode(buf, 1, 0x99, 0, 50, b, 4, tok, 4 * T);
		assert_int_equal(kvt_fmt_rec_decode(buf, n, &r, &used), 0);
		assert_int_equal(kvt_fmt_rec_check(&r, &lim), variant ? KVT_EFORMAT : 0);
	}
}

static uint32_t w_bad_slot = UINT32_MAX; /* NVMe reads of this slot come back corrupted */

static void
w_flip(void *arg, bool is_write, uint32_t slot, void *buf, size_t len, uint64_t off, int *res)
{
	(void)arg, (void)off;
	if (!is_write && slot == w_bad_slot && *res > 0 && len)
		((uint8_t *)buf)[0] ^= 0x5a; /* the header (or the data, read apart) */
}

static const struct kvt_nvme_fault_hooks w_flip_hooks = { .on_complete = w_flip };

/* The NVMe slot of block position @j of @s. */
static uint32_t
w_nvme_slot(struct kvt_engine *e, kvt_seq_id s, uint32_t j)
{
	uint32_t slot;

	kvt_lock(e);
	slot = kvt_blk(e, e->seqs[(uint32_t)s].blocks[j])->slot[KVT_TIER_NVME];
	kvt_unlock(e);
	assert_true(slot != KVT_NIL);
	return slot;
}

/*
 * A lost block of a sequence with holes (its NVMe read fails its checksum): truncated before
 * it as on any engine when the new next query reads no hole (the last block lost); cut back to
 * its sinks when it would (a block in the window lost: the blocks before it, which the
 * recomputation reads, were dropped). Either way the engine stays consistent and the sequence
 * goes on from there.
 */
static void
test_lost_block_with_holes(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_seq_info si;
	struct kvt_engine *e;
	struct wseq *s;
	struct kvt_batch *b = NULL;
	char *dir = tsup_mkdtemp();

	(void)state;
	tsup_opts_init(&o);
	o.hbm_bytes = 16 * tsup_block_bytes();
	o.host_bytes = 16 * tsup_block_bytes();
	o.nvme_dir = dir;
	o.nvme_bytes = 1u << 20;
	o.high_watermark = o.low_watermark = 1.0f;
	e = tsup_create(&o, &w_flip_hooks);
	assert_int_equal(kvt_engine_set_window(e, W, S), 0);
	s = w_new(e, NULL);
	w_fill(e, s, 2, 1, 40);
	w_fill(e, s, 2, 1, 1); /* 11 positions: sink 0, holes 1..5, live 6..10 */
	/* the last block lost: truncated to 40 tokens, holes kept (query 40 reads 25..) */
	assert_int_equal(kvt_seq_park(e, s->id, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	kvt_lock(e);
	for (uint32_t j = 0; j < 11; j++) /* HOST copies go: the reads come from NVMe */
		if (e->seqs[(uint32_t)s->id].blocks[j] != KVT_NIL)
			kvt_copy_drop(e, e->seqs[(uint32_t)s->id].blocks[j], KVT_TIER_HOST);
	kvt_unlock(e);
	w_bad_slot = w_nvme_slot(e, s->id, 10);
	assert_int_equal(kvt_batch_prepare(e, &s->id, 1, &b), KVT_ELOST);
	w_bad_slot = UINT32_MAX;
	assert_int_equal(kvt_seq_info(e, s->id, &si), 0);
	assert_int_equal(si.n_tokens, 40);
	tsup_check_engine(e);
	s->n = 40;
	w_fill(e, s, 2, 1, 1);
	assert_int_equal(w_verify(e, s, 40), 0);
	/* a block inside the window lost: cut back to the sink block */
	assert_int_equal(kvt_seq_park(e, s->id, KVT_TIER_NVME), 0);
	assert_int_equal(kvt_engine_drain(e), 0);
	kvt_lock(e);
	for (uint32_t j = 0; j < 11; j++)
		if (e->seqs[(uint32_t)s->id].blocks[j] != KVT_NIL)
			kvt_copy_drop(e, e->seqs[(uint32_t)s->id].blocks[j], KVT_TIER_HOST);
	kvt_unlock(e);
	w_bad_slot = w_nvme_slot(e, s->id, 8);
	assert_int_equal(kvt_batch_prepare(e, &s->id, 1, &b), KVT_ELOST);
	w_bad_slot = UINT32_MAX;
	assert_int_equal(kvt_seq_info(e, s->id, &si), 0);
	assert_int_equal(si.n_tokens, S);
	tsup_check_engine(e);
	s->n = S;
	w_fill(e, s, 2, 1, 30);
	assert_int_equal(w_verify(e, s, S), 0);
	tsup_check_engine(e);
	free(s);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

/*
 * Issue 16's 4x decode of the SWA fixtures: a session prepared from the first block its next
 * query reads is prepared whole, even while it still holds the block that has just left its
 * window (its next append drops it), so it stays in the rotation and background demotion
 * leaves its blocks alone between its per-layer prepares. It used to count as a partial
 * prepare (from above first_live) once every T tokens: every session lost its blocks to
 * background demotion after its first layer, and its next layers stalled on promotions.
 */
static void
test_turn_keeps_block_leaving_window(void **state)
{
	struct kvt_engine_opts o;
	struct kvt_engine *e = NULL;
	struct kvt_seq_range r;
	struct kvt_seq_info si;
	struct kvt_batch *b = NULL;
	struct kvt_stats st;
	struct wseq *a, *c;
	uint32_t k;

	(void)state;
	tsup_opts_init(&o);
	o.hbm_bytes = 4ull * tsup_block_bytes();
	o.host_bytes = 16ull * tsup_block_bytes();
	o.emu_seed = 42;
	o.high_watermark = 0.5f; /* 4 blocks in HBM are over it: demote all (0.1 of 4 slots) */
	o.low_watermark = 0.1f;
	assert_int_equal(kvt_engine_create(&o, &e), 0);
	assert_int_equal(kvt_engine_set_window(e, T, 0), 0);
	a = w_new(e, NULL);
	c = w_new(e, NULL);
	w_fill(e, a, 4, 1, 2 * T - 1); /* one append: block 0 stays live, query 2T-1 reads 1 */
	w_fill(e, c, 4, 2, 2 * T - 1);
	assert_int_equal(kvt_win_next_first(e, kvt_seq_lookup(e, a->id, NULL)), 1);
	r = (struct kvt_seq_range){ .seq = a->id, .first_block = 1, .n_blocks = 0 };
	assert_int_equal(kvt_engine_hint_ranges(e, &r, 1, 1), 0); /* the rotation starts */
	for (k = 0; k < 2; k++) { /* a turn: two layers' prepares of the same range */
		assert_int_equal(kvt_batch_prepare_ranges(e, &r, 1, &b), 0);
		assert_int_equal(kvt_batch_wait_layer(b, TSUP_LAYERS - 1, NULL), 0);
		assert_int_equal(kvt_batch_release(b, NULL), 0);
		assert_int_equal(kvt_engine_drain(e), 0);
		assert_int_equal(kvt_seq_info(e, a->id, &si), 0);
		assert_int_equal(si.blocks_in[KVT_TIER_HBM], 2); /* the rotation's: kept */
	}
	st = tsup_stats(e);
	assert_int_equal(st.accesses, 2);
	assert_int_equal(st.accesses_ready, 2);
	assert_int_equal(w_verify(e, a, 2 * T - 1), 0);
	tsup_check_engine(e);
	free(a);
	free(c);
	kvt_engine_destroy(e);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_set_window_rules),
		cmocka_unit_test(test_held_bounded_at_8x_window),
		cmocka_unit_test(test_prefill_chunks_without_release),
		cmocka_unit_test(test_park_moves_only_window),
		cmocka_unit_test(test_boundary_prompts),
		cmocka_unit_test(test_hit_while_demoting),
		cmocka_unit_test(test_reuse_past_window),
		cmocka_unit_test(test_short_prompts_hit),
		cmocka_unit_test(test_hit_needs_only_window),
		cmocka_unit_test(test_store_with_holes),
		cmocka_unit_test(test_store_prefix_after_restart),
		cmocka_unit_test(test_format_holes),
		cmocka_unit_test(test_lost_block_with_holes),
		cmocka_unit_test(test_window_shapes),
		cmocka_unit_test(test_hints_and_ranges),
		cmocka_unit_test(test_turn_keeps_block_leaving_window),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
