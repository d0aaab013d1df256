/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-hf/run.c - the decode loop of kvtier-hf with the KV only in kvtier (hf.h):
 * windows of blocks per layer, the position's own K/V aside, append and store last (the order
 * of kvtier-run's window.c), parking between turns, prefix sharing, the persistent store with
 * a kill -9 in the middle.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fwd.h"
#include "hf.h"
#include "util.h"

struct hf_run {
	const struct kvhf_opts *o;
	const struct kvhf_model *m;
	struct kvhf_result *r;
	FILE *log;
	struct kvt_engine *e;
	struct kvt_geometry geo;
	struct kvhf_state st;
	float *side;          /* [n_layers][2][kv_width]: this position's K/V */
	float *kv;            /* contiguous mode: [n_layers][positions][2][kv_width] */
	uint32_t P;           /* positions of the run */
	uint32_t cap;         /* blocks per window */
	char tmpdir[4096];
};

void
kvhf_opts_init(struct kvhf_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->tokens_per_block = 16;
	o->session_key = UINT64_C(0x4b56484600000001);
}

uint64_t
kvhf_kv_bytes(const struct kvhf_model *m, uint32_t tpb, uint32_t positions)
{
	uint64_t blocks = ((uint64_t)positions + tpb - 1) / tpb;

	return blocks * tpb * (uint64_t)m->n_layers * 2 * m->kv_width * sizeof(float);
}

static void
hf_engine_log(void *arg, int level, const char *msg)
{
	FILE *f = arg;

	if (level <= KVT_LOG_WARN)
		fprintf(f, "kvtier-hf: kvtier %s: %s\n", level == KVT_LOG_ERROR ? "error" : "warning",
			msg);
}

static int
hf_engine_create(struct hf_run *c, int persist)
{
	const struct kvhf_opts *o = c->o;
	const struct kvhf_model *m = c->m;
	uint32_t P = o->n_prompt + o->gen, tpb = o->tokens_per_block;
	uint64_t nseq = o->prefix_share ? 2 : 1;
	uint64_t block = (uint64_t)tpb * (uint64_t)m->n_layers * 2 * m->kv_width * sizeof(float);
	uint64_t nblocks = nseq * ((P + tpb - 1) / tpb);
	struct kvt_engine_opts eo;
	int rc;

	kvt_engine_opts_init(&eo, sizeof(eo));
	eo.layout.n_layers = (uint32_t)m->n_layers;
	eo.layout.n_kv_heads = m->kv_heads_stored;
	eo.layout.head_dim = m->kv_head_dim_stored;
	eo.layout.dtype = KVT_DTYPE_F32;
	eo.layout.tokens_per_block = tpb;
	/* all in HBM by default: twice the blocks, below the high watermark (no demotion) */
	eo.hbm_bytes = o->hbm_bytes ? o->hbm_bytes : (2 * nblocks + 2) * block;
	eo.host_bytes = o->no_host ? 0 : o->host_bytes ? o->host_bytes : (nblocks + 1) * block;
	/* NVMe slots: a 4 KiB header page + the block rounded up to 4 KiB (tiers/tier_nvme.h) */
	eo.nvme_bytes = o->nvme_bytes ? o->nvme_bytes
				      : (nblocks + 1) * (4096 + (block + 4095) / 4096 * 4096);
	if (o->nvme_dir) {
		eo.nvme_dir = o->nvme_dir;
	} else {
		const char *base = getenv("TMPDIR");

		if (!c->tmpdir[0]) {
			snprintf(c->tmpdir, sizeof(c->tmpdir), "%s/kvtier-hf.XXXXXX",
				 base && *base ? base : "/tmp");
			if (!mkdtemp(c->tmpdir)) {
				c->tmpdir[0] = '\0';
				return kvtr_err(-errno, "cannot create a temporary NVMe directory: %s",
						strerror(errno));
			}
		}
		eo.nvme_dir = c->tmpdir;
	}
	eo.nvme_persist = persist;
	eo.prefix_cache = o->prefix_share ? 1 : 0;
	eo.log = hf_engine_log;
	eo.log_arg = c->log;
	rc = kvt_engine_create(&eo, &c->e);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_engine_create");
	rc = kvt_engine_geometry(c->e, &c->geo);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_engine_geometry");
	if (c->geo.hbm_slots < 2 && P > tpb)
		return kvtr_err(KVT_ETOOBIG, "HBM holds %u block slot(s): windows need at least 2 "
				"(%llu bytes)", c->geo.hbm_slots,
				(unsigned long long)(2 * c->geo.block_bytes));
	c->cap = c->geo.hbm_slots > 1 ? c->geo.hbm_slots - 1 : 1;
	c->r->geo = c->geo;
	return 0;
}

static int
hf_nofit(int rc)
{
	return rc == KVT_ETOOBIG || rc == -ENOSPC;
}

/*
 * Attention of layer @l at @pos over the stored positions [lo, pos) of @seq, read from the
 * K/V of layer @kl (@l itself, or the layer it shares K/V with), by windows.
 */
static int
hf_attend_stored(struct hf_run *c, kvt_seq_id seq, uint32_t kl, uint32_t l, uint32_t lo,
		 uint32_t pos)
{
	uint32_t tpb = c->geo.tokens_per_block, fb = lo / tpb, nb = (pos + tpb - 1) / tpb;
	const struct kvt_geometry *g = &c->geo;

	if (c->kv) { /* contiguous: the same positions in the same order */
		uint32_t kw = c->m->kv_width;

		for (uint32_t j = lo; j < pos; j++) {
			const float *k = c->kv + ((size_t)kl * c->P + j) * 2 * kw;

			kvhf_attn_add(c->m, &c->st, l, k, k + kw);
		}
		return 0;
	}

	for (uint32_t ws = fb; ws < nb;) {
		uint32_t wn = nb - ws < c->cap ? nb - ws : c->cap;
		struct kvt_seq_range range;
		struct kvt_block_table bt;
		struct kvt_batch *b = NULL;
		int rc, rc2;

		for (;;) {
			range.seq = seq;
			range.first_block = ws;
			range.n_blocks = wn;
			rc = kvt_batch_prepare_ranges(c->e, &range, 1, &b);
			if (rc == 0 || !hf_nofit(rc) || wn == 1)
				break;
			wn /= 2;
			c->cap = wn;
		}
		if (rc)
			return kvtr_err_kvt(rc, "kvt_batch_prepare_ranges");
		c->r->windows++;
		memset(&bt, 0, sizeof(bt));
		rc = kvt_batch_block_table(b, &bt);
		if (rc)
			rc = kvtr_err_kvt(rc, "kvt_batch_block_table");
		else if (bt.n_seqs != 1 || bt.first_block[0] != ws ||
			 bt.indptr[1] - bt.indptr[0] != wn)
			rc = kvtr_err(-EPROTO, "engine bug: window [%u, +%u) has a block table of "
				      "%u blocks from %u", ws, wn, bt.indptr[1] - bt.indptr[0],
				      bt.first_block[0]);
		if (rc == 0 && (rc = kvt_batch_wait_layer(b, kl, NULL)) != 0)
			rc = kvtr_err_kvt(rc, "kvt_batch_wait_layer");
		for (uint32_t i = 0; rc == 0 && i < wn; i++) {
			uint32_t slot = bt.indices[bt.indptr[0] + i];
			const char *base = (const char *)bt.geo.hbm_base +
					   (uint64_t)slot * g->block_bytes +
					   (uint64_t)kl * g->layer_block_bytes;

			for (uint32_t o = 0; o < tpb; o++) {
				uint64_t j = (uint64_t)(ws + i) * tpb + o;
				const float *k = (const float *)(base + (uint64_t)o * g->token_bytes);

				if (j < lo || j >= pos)
					continue;
				kvhf_attn_add(c->m, &c->st, l, k,
					      (const float *)((const char *)k + g->v_offset));
			}
		}
		rc2 = kvt_batch_release(b, NULL);
		if (rc == 0 && rc2)
			rc = kvtr_err_kvt(rc2, "kvt_batch_release");
		if (rc)
			return rc;
		ws += wn;
	}
	return 0;
}

/* Appends position @pos (token @tok) and stores its K/V of every layer. */
static int
hf_commit(struct hf_run *c, kvt_seq_id seq, uint32_t pos, int32_t tok)
{
	uint32_t tpb = c->geo.tokens_per_block, kw = c->m->kv_width;
	struct kvt_seq_range range;
	struct kvt_block_table bt;
	struct kvt_batch *b = NULL;
	int64_t slot = -1;
	int rc, rc2;

	if (c->kv) {
		for (uint32_t l = 0; l < (uint32_t)c->m->n_layers; l++)
			memcpy(c->kv + ((size_t)l * c->P + pos) * 2 * kw, c->side + (size_t)l * 2 * kw,
			       2 * kw * sizeof(float));
		return 0;
	}
	rc = kvt_seq_append(c->e, seq, &tok, 1, &slot);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_seq_append");
	range.seq = seq;
	range.first_block = pos / tpb;
	range.n_blocks = 1;
	rc = kvt_batch_prepare_ranges(c->e, &range, 1, &b);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_batch_prepare_ranges (the new token's block)");
	memset(&bt, 0, sizeof(bt));
	rc = kvt_batch_block_table(b, &bt);
	if (rc)
		rc = kvtr_err_kvt(rc, "kvt_batch_block_table");
	else if ((uint64_t)slot / tpb != bt.indices[bt.indptr[0]] ||
		 (uint64_t)slot % tpb != pos % tpb)
		rc = kvtr_err(-EPROTO, "engine bug: position %u was appended at slot mapping %lld "
			      "but its block is in HBM slot %u", pos, (long long)slot,
			      bt.indices[bt.indptr[0]]);
	for (uint32_t l = 0; rc == 0 && l < (uint32_t)c->m->n_layers; l++) {
		const float *kv = c->side + (size_t)l * 2 * kw;
		void *k, *v;

		rc = kvt_batch_wait_layer(b, l, NULL);
		if (rc) {
			rc = kvtr_err_kvt(rc, "kvt_batch_wait_layer");
			break;
		}
		kvt_kv_addr(&bt.geo, l, slot, &k, &v);
		if (c->m->layers[l].kv_src != (int)l) { /* stores nothing (the old layout's slot
							   is written zero) */
			memset(k, 0, kw * sizeof(float));
			memset(v, 0, kw * sizeof(float));
			continue;
		}
		memcpy(k, kv, kw * sizeof(float));
		memcpy(v, kv + kw, kw * sizeof(float));
	}
	rc2 = kvt_batch_release(b, NULL);
	if (rc == 0 && rc2)
		rc = kvtr_err_kvt(rc2, "kvt_batch_release");
	return rc;
}

/* One position: forward pass of @tok at @pos with attention through kvtier, then commit. */
static int
hf_position(struct hf_run *c, kvt_seq_id seq, uint32_t pos, int32_t tok)
{
	const struct kvhf_model *m = c->m;
	uint32_t kw = m->kv_width;
	int rc;

	kvhf_fwd_embed(m, &c->st, tok);
	for (uint32_t l = 0; l < (uint32_t)m->n_layers; l++) {
		uint32_t lo = 0, kl = (uint32_t)m->layers[l].kv_src;
		float *side = c->side + (size_t)kl * 2 * kw;

		kvhf_fwd_qkv(m, &c->st, l, pos);
		if (kl == l) { /* a KV-shared layer reads its source's (computed before it) */
			memcpy(side, c->st.k, kw * sizeof(float));
			memcpy(side + kw, c->st.v, kw * sizeof(float));
		}
		if (m->layers[l].sliding && pos + 1 > (uint32_t)m->sliding_window)
			lo = pos + 1 - (uint32_t)m->sliding_window;
		rc = hf_attend_stored(c, seq, kl, l, lo, pos);
		if (rc)
			return rc;
		kvhf_attn_add(m, &c->st, l, side, side + kw);
		kvhf_fwd_rest(m, &c->st, l);
	}
	kvhf_fwd_logits(m, &c->st);
	c->r->positions++;
	return hf_commit(c, seq, pos, tok);
}

static int32_t
hf_argmax(const float *x, int n)
{
	int32_t best = 0;

	for (int i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return best;
}

static int
hf_park_resume(struct hf_run *c, kvt_seq_id seq)
{
	struct kvt_seq_info si;
	int rc;

	rc = kvt_seq_park(c->e, seq, KVT_TIER_NVME);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_seq_park");
	rc = kvt_engine_drain(c->e);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_engine_drain");
	rc = kvt_seq_info(c->e, seq, &si);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_seq_info");
	if (si.blocks_in[KVT_TIER_HBM] != 0 || !si.parked)
		return kvtr_err(-EPROTO, "engine bug: a parked sequence has %u blocks in HBM "
				"(parked %u)", si.blocks_in[KVT_TIER_HBM], si.parked);
	rc = kvt_seq_resume(c->e, seq);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_seq_resume");
	c->r->parks++;
	return 0;
}

/*
 * Positions [from, to) of @seq: position p's input is tokens[p] (a prompt token or the previous
 * step's argmax, written into tokens[p + 1] when p + 1 is past the prompt); logits to
 * r->logits[p]. Parks and resumes every park_every positions.
 */
static int
hf_decode(struct hf_run *c, kvt_seq_id seq, int32_t *tokens, float *logits, uint32_t from,
	  uint32_t to)
{
	const struct kvhf_opts *o = c->o;
	uint32_t P = o->n_prompt + o->gen;
	int rc;

	for (uint32_t p = from; p < to; p++) {
		rc = hf_position(c, seq, p, tokens[p]);
		if (rc)
			return rc;
		if (p + 1 < P) {
			memcpy(logits + (size_t)p * (size_t)c->m->vocab, c->st.logits,
			       (size_t)c->m->vocab * sizeof(float));
			if (p + 1 >= o->n_prompt)
				tokens[p + 1] = hf_argmax(c->st.logits, c->m->vocab);
		}
		if (o->park_every && (p + 1) % o->park_every == 0 && p + 1 < to) {
			rc = hf_park_resume(c, seq);
			if (rc)
				return rc;
		}
	}
	return 0;
}

static int
hf_open(struct hf_run *c, uint64_t key, kvt_seq_id *seq)
{
	struct kvt_seq_opts so;
	int rc;

	kvt_seq_opts_init(&so, sizeof(so));
	so.session_key = key;
	rc = kvt_seq_open(c->e, &so, seq);
	return rc ? kvtr_err_kvt(rc, "kvt_seq_open") : 0;
}

/* Prefix sharing: a second sequence attaches the prompt's blocks and computes the rest. */
static int
hf_prefix_second(struct hf_run *c, kvt_seq_id *first, const int32_t *tokens,
		 const float *logits)
{
	uint32_t P = c->o->n_prompt + c->o->gen, V = (uint32_t)c->m->vocab;
	int32_t *t2 = malloc((size_t)P * sizeof(int32_t));
	float *l2 = malloc((size_t)P * V * sizeof(float));
	kvt_seq_id s2 = 0;
	uint64_t a = 0;
	int rc;

	if (!t2 || !l2) {
		rc = kvtr_err(-ENOMEM, "out of memory");
		goto out;
	}
	memcpy(t2, tokens, (size_t)c->o->n_prompt * sizeof(int32_t));
	if (c->o->close_first && *first) {
		rc = kvt_seq_close(c->e, *first);
		*first = 0;
		if (rc) {
			rc = kvtr_err_kvt(rc, "kvt_seq_close (the first sequence)");
			goto out;
		}
	}
	rc = hf_open(c, 0, &s2);
	if (rc)
		goto out;
	rc = kvt_seq_attach_prefix(c->e, s2, t2, c->o->n_prompt - 1, &a);
	if (rc) {
		rc = kvtr_err_kvt(rc, "kvt_seq_attach_prefix");
		goto out;
	}
	c->r->prefix_tokens = a;
	if (a == 0) {
		rc = kvtr_err(-EPROTO, "prefix sharing: nothing of the %u-token prompt was attached",
			      c->o->n_prompt);
		goto out;
	}
	memcpy(l2, logits, (size_t)a * V * sizeof(float));
	rc = hf_decode(c, s2, t2, l2, (uint32_t)a, P);
	if (rc)
		goto out;
	for (uint32_t p = 0; p < P; p++)
		if (t2[p] != tokens[p]) {
			rc = kvtr_err(KVT_EFORMAT, "prefix sharing: the sequence that attached %llu "
				      "tokens has token %d at position %u, the first one %d",
				      (unsigned long long)a, t2[p], p, tokens[p]);
			goto out;
		}
	/* the result is the second sequence's (its attached positions are the first's) */
	memcpy(c->r->logits, l2, (size_t)(P - 1) * V * sizeof(float));
out:
	if (s2)
		kvt_seq_close(c->e, s2);
	free(t2);
	free(l2);
	return rc;
}

static void
hf_teardown(struct hf_run *c)
{
	if (c->e) {
		c->r->stats.size = sizeof(c->r->stats);
		(void)kvt_engine_stats(c->e, &c->r->stats);
	}
	kvt_engine_destroy(c->e);
	c->e = NULL;
}

/*
 * Persistent store: phase A in a child process (positions [0, stop), park to NVMe, drain:
 * published; then SIGKILL itself), phase B here: a new engine on the same store, the session
 * restored by key, the rest decoded.
 */
static int
hf_persist(struct hf_run *c, int32_t *tokens, float *logits)
{
	const struct kvhf_opts *o = c->o;
	uint32_t P = o->n_prompt + o->gen, V = (uint32_t)c->m->vocab;
	uint32_t stop = o->stop_after ? o->stop_after : o->n_prompt + o->gen / 2;
	size_t shm_len = (size_t)P * sizeof(int32_t) + (size_t)P * V * sizeof(float);
	char *shm;
	kvt_seq_id seq = 0;
	uint64_t keys[4];
	struct kvt_seq_info si;
	pid_t pid;
	int rc, st = 0, n;

	if (!o->nvme_dir)
		return kvtr_err(-EINVAL, "the persistent store needs an NVMe directory");
	if (stop < 1 || stop >= P)
		return kvtr_err(-EINVAL, "stop_after %u out of range [1, %u)", stop, P);
	shm = mmap(NULL, shm_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (shm == MAP_FAILED)
		return kvtr_err(-errno, "mmap: %s", strerror(errno));
	memcpy(shm, tokens, (size_t)P * sizeof(int32_t));
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		munmap(shm, shm_len);
		return kvtr_err(-errno, "fork: %s", strerror(errno));
	}
	if (pid == 0) {
		int32_t *ct = (int32_t *)shm;
		float *cl = (float *)(shm + (size_t)P * sizeof(int32_t));

		rc = hf_engine_create(c, 1);
		if (rc == 0) { /* a session of an earlier run under the key: start afresh */
			rc = kvt_session_drop(c->e, o->session_key);
			if (rc == -ENOENT)
				rc = 0;
			else if (rc)
				rc = kvtr_err_kvt(rc, "kvt_session_drop");
		}
		if (rc == 0)
			rc = hf_open(c, o->session_key, &seq);
		if (rc == 0)
			rc = hf_decode(c, seq, ct, cl, 0, stop);
		if (rc == 0 && (rc = kvt_seq_park(c->e, seq, KVT_TIER_NVME)) != 0)
			rc = kvtr_err_kvt(rc, "kvt_seq_park");
		if (rc == 0 && (rc = kvt_engine_drain(c->e)) != 0)
			rc = kvtr_err_kvt(rc, "kvt_engine_drain");
		if (rc) {
			fprintf(c->log, "kvtier-hf: before the kill: %s\n", kvtr_last_error());
			_exit(1);
		}
		raise(SIGKILL); /* kill -9: no destroy, nothing flushed on the way out */
		_exit(2);
	}
	if (waitpid(pid, &st, 0) != pid) {
		munmap(shm, shm_len);
		return kvtr_err(-errno, "waitpid: %s", strerror(errno));
	}
	memcpy(tokens, shm, (size_t)P * sizeof(int32_t));
	memcpy(logits, shm + (size_t)P * sizeof(int32_t), (size_t)stop * V * sizeof(float));
	munmap(shm, shm_len);
	if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL)
		return kvtr_err(-EIO, "the child that fills the store did not die of SIGKILL "
				"(status %d): see its message above", st);
	rc = hf_engine_create(c, 1);
	if (rc)
		return rc;
	n = kvt_session_list(c->e, keys, 4);
	if (n != 1 || keys[0] != o->session_key)
		return kvtr_err(-ENOENT, "after kill -9 the store lists %d session(s), expected "
				"the one with key %llx", n, (unsigned long long)o->session_key);
	rc = kvt_seq_restore(c->e, o->session_key, NULL, &seq);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_seq_restore");
	rc = kvt_seq_info(c->e, seq, &si);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_seq_info");
	c->r->restored_tokens = si.n_tokens;
	if (si.n_tokens != stop)
		return kvtr_err(-EPROTO, "the restored session holds %llu tokens, %u were parked",
				(unsigned long long)si.n_tokens, stop);
	rc = hf_decode(c, seq, tokens, logits, stop, P);
	if (rc == 0) {
		kvt_seq_close(c->e, seq);
		rc = kvt_session_drop(c->e, o->session_key);
		if (rc == -ENOENT)
			rc = 0;
		else if (rc)
			rc = kvtr_err_kvt(rc, "kvt_session_drop");
	}
	return rc;
}

int
kvhf_run(const struct kvhf_opts *o, struct kvhf_result *r)
{
	struct hf_run c;
	uint32_t P;
	kvt_seq_id seq = 0;
	int rc;

	memset(r, 0, sizeof(*r));
	memset(&c, 0, sizeof(c));
	if (!o->model || !o->prompt || o->n_prompt < 1)
		return kvtr_err(-EINVAL, "no model or no prompt");
	if (o->tokens_per_block < 1 || o->tokens_per_block > 65536)
		return kvtr_err(-EINVAL, "tokens per block %u out of range [1, 65536]",
				o->tokens_per_block);
	P = o->n_prompt + o->gen;
	if (o->contiguous && (o->park_every || o->prefix_share || o->persist))
		return kvtr_err(-EINVAL, "the contiguous mode keeps no KV in kvtier: no parking, "
				"prefix sharing or persistent store with it");
	if (o->close_first && !o->prefix_share)
		return kvtr_err(-EINVAL, "close_first is a prefix-sharing option");
	if (P > (uint32_t)o->model->max_pos)
		return kvtr_err(-EINVAL, "%u positions exceed max_position_embeddings %d", P,
				o->model->max_pos);
	for (uint32_t i = 0; i < o->n_prompt; i++)
		if (o->prompt[i] < 0 || o->prompt[i] >= o->model->vocab)
			return kvtr_err(-EINVAL, "prompt token %d at %u is not in [0, %d)",
					o->prompt[i], i, o->model->vocab);
	c.o = o;
	c.m = o->model;
	c.r = r;
	c.log = o->log ? o->log : stderr;
	c.P = P;
	if (o->contiguous &&
	    !(c.kv = calloc((size_t)c.m->n_layers * P * 2 * c.m->kv_width, sizeof(float))))
		return kvtr_err(-ENOMEM, "out of memory for the contiguous KV of %u positions", P);
	r->tokens = calloc(P, sizeof(int32_t));
	r->logits = calloc((size_t)P * (size_t)c.m->vocab, sizeof(float));
	c.side = calloc((size_t)c.m->n_layers * 2 * c.m->kv_width, sizeof(float));
	if (!r->tokens || !r->logits || !c.side) {
		free(c.side);
		free(c.kv);
		return kvtr_err(-ENOMEM, "out of memory for %u positions", P);
	}
	memcpy(r->tokens, o->prompt, (size_t)o->n_prompt * sizeof(int32_t));
	r->n_tokens = P;
	r->n_logits = P - 1;
	rc = kvhf_state_init(&c.st, c.m);
	if (rc == 0 && o->persist) {
		rc = hf_persist(&c, r->tokens, r->logits);
	} else if (rc == 0 && o->contiguous) {
		rc = hf_decode(&c, 0, r->tokens, r->logits, 0, P);
	} else if (rc == 0) {
		rc = hf_engine_create(&c, 0);
		if (rc == 0)
			rc = hf_open(&c, 0, &seq);
		if (rc == 0)
			rc = hf_decode(&c, seq, r->tokens, r->logits, 0, P);
		if (rc == 0 && o->prefix_share)
			rc = hf_prefix_second(&c, &seq, r->tokens, r->logits);
		if (rc == 0 && (rc = kvt_engine_drain(c.e)) != 0)
			rc = kvtr_err_kvt(rc, "kvt_engine_drain");
	}
	hf_teardown(&c);
	if (c.tmpdir[0])
		rmdir(c.tmpdir);
	kvhf_state_fini(&c.st);
	free(c.side);
	free(c.kv);
	return rc;
}

void
kvhf_result_free(struct kvhf_result *r)
{
	free(r->tokens);
	free(r->logits);
	memset(r, 0, sizeof(*r));
}
