/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-run/runner.c - sessions, turns and the step loop of kvtier-run (see runner.h);
 * engine setup and teardown. The kvtier step itself is in batch.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "run_int.h"

static const char *const run_prompts[] = {
	"",
	"Once upon a time",
	"Lily had a little dog",
	"Tom went to the park",
	"One day, a big red ball",
	"The sun was happy",
	"She saw a bird in the tree",
	"They wanted to play",
};

#define RUN_N_PROMPTS (sizeof(run_prompts) / sizeof(run_prompts[0]))

const char *
kvtr_builtin_prompt(uint32_t s, uint32_t t, uint32_t turns)
{
	return run_prompts[((uint64_t)s * turns + t) % RUN_N_PROMPTS];
}

void
kvtr_run_opts_init(struct kvtr_run_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->steps = 256;
	o->temperature = 1.0f;
	o->topp = 0.9f;
	o->seed = 1;
	o->sessions = 1;
	o->turns = 1;
	o->tokens_per_block = 16;
	o->kv_dtype = KVT_DTYPE_F32;
}

static int
run_check_opts(const struct kvtr_run_opts *o)
{
	if (!o->model || !o->tok)
		return kvtr_err(-EINVAL, "no model or tokenizer");
	if (o->tok->vocab_size != o->model->cfg.vocab_size)
		return kvtr_err(KVT_EFORMAT, "the tokenizer does not match the model: it has %d "
				"tokens, the model has %d", o->tok->vocab_size,
				o->model->cfg.vocab_size);
	if (o->sessions < 1 || o->sessions > KVTR_MAX_SESSIONS)
		return kvtr_err(-EINVAL, "sessions %u out of range [1, %d]", o->sessions,
				KVTR_MAX_SESSIONS);
	if (o->turns < 1 || o->turns > KVTR_MAX_TURNS)
		return kvtr_err(-EINVAL, "turns %u out of range [1, %d]", o->turns, KVTR_MAX_TURNS);
	if (o->prompt && strlen(o->prompt) > KVTR_MAX_PROMPT)
		return kvtr_err(-EINVAL, "prompt is too long: %zu bytes (at most %d)",
				strlen(o->prompt), KVTR_MAX_PROMPT);
	if (o->seed == 0)
		return kvtr_err(-EINVAL, "seed must not be 0");
	if ((o->remote_save || o->remote_resume) && (!o->remote_host || o->reference))
		return kvtr_err(-EINVAL, "--remote-save and --remote-resume need --remote (and "
				"kvtier, not --reference)");
	if (o->remote_save > o->turns || o->remote_resume >= o->turns ||
	    (o->remote_save && o->remote_save <= o->remote_resume))
		return kvtr_err(-EINVAL, "remote turns out of range: --remote-resume %u must be "
				"below --turns %u, --remote-save %u at most --turns and above it",
				o->remote_resume, o->turns, o->remote_save);
	if (o->remote_resume && o->temperature != 0.0f)
		return kvtr_err(-EINVAL, "--remote-resume needs --temperature 0 (greedy): the "
				"sampler's random state does not travel with the session");
	if (o->remote_resume && o->prefix_share)
		return kvtr_err(-EINVAL, "--remote-resume and --prefix-share do not combine");
	if (!(o->temperature >= 0.0f))
		return kvtr_err(-EINVAL, "temperature must be >= 0");
	if (!o->reference && (o->tokens_per_block < 1 || o->tokens_per_block > 65536))
		return kvtr_err(-EINVAL, "tokens per block %u out of range [1, 65536]",
				o->tokens_per_block);
	if (o->kv_dtype != KVT_DTYPE_F32 && o->kv_dtype != KVT_DTYPE_F16 &&
	    o->kv_dtype != KVT_DTYPE_BF16)
		return kvtr_err(-EINVAL, "KV dtype %d is not supported (f32, f16, bf16)",
				o->kv_dtype);
	return 0;
}

/* --remote-resume: the session's sequence and token history come from the REMOTE tier (its
 * turns so far ended caught up: n_kv == n_hist). */
static int
run_sess_restore(struct run_ctx *c, struct run_sess *s, const struct kvt_seq_opts *so)
{
	struct kvt_seq_info in;
	int rc;

	rc = kvt_seq_restore_remote(c->e, (uint64_t)s->idx + 1, so, &s->id);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_seq_restore_remote");
	rc = kvt_seq_info(c->e, s->id, &in);
	if (rc == 0 && in.n_tokens > (uint64_t)c->m->cfg.seq_len)
		return kvtr_err(KVT_EFORMAT, "session %u from REMOTE holds %llu tokens, more than "
				"the model's seq_len %d", s->idx + 1,
				(unsigned long long)in.n_tokens, c->m->cfg.seq_len);
	if (rc == 0)
		rc = kvt_seq_tokens(c->e, s->id, 0, s->hist, (size_t)in.n_tokens);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_seq_tokens");
	for (uint64_t i = 0; i < in.n_tokens; i++)
		if (s->hist[i] < 0 || s->hist[i] >= c->m->cfg.vocab_size)
			return kvtr_err(KVT_EFORMAT, "session %u from REMOTE: token %llu out of "
					"the vocabulary", s->idx + 1, (unsigned long long)i);
	s->n_hist = s->n_kv = (uint32_t)in.n_tokens;
	return 0;
}

/* --remote-save: publish every session (its blocks back in HBM or HOST first), then drain. */
static int
run_remote_save(struct run_ctx *c)
{
	struct kvt_stats st;
	int rc = 0;

	for (uint32_t i = 0; rc == 0 && i < c->o->sessions; i++) {
		kvt_seq_id id = c->ss[i].id;

		rc = kvt_seq_resume(c->e, id);
		if (rc == 0)
			rc = kvt_engine_drain(c->e);
		if (rc == 0)
			rc = kvt_seq_publish_remote(c->e, id);
		if (rc == 0)
			rc = kvt_seq_park(c->e, id, c->park_tier);
		if (rc)
			return kvtr_err_kvt(rc, "publishing a session to REMOTE");
	}
	rc = kvt_engine_drain(c->e);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_engine_drain");
	memset(&st, 0, sizeof st);
	st.size = sizeof st;
	rc = kvt_engine_stats(c->e, &st);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_engine_stats");
	if (st.remote_publish_failed)
		return kvtr_err(-EIO, "%llu of %u sessions could not be published to REMOTE "
				"(server down, breaker open or full)",
				(unsigned long long)st.remote_publish_failed, c->o->sessions);
	return 0;
}

static int
run_sess_init(struct run_ctx *c, struct run_sess *s, uint32_t idx)
{
	const struct kvtr_run_opts *o = c->o;
	uint64_t seed = o->seed + idx;
	size_t seq = (size_t)c->m->cfg.seq_len;
	int rc;

	s->idx = idx;
	rc = kvtr_state_init(&s->st, c->m);
	if (rc == 0)
		rc = kvtr_sampler_init(&s->samp, c->m->cfg.vocab_size, o->temperature, o->topp,
				       seed ? seed : 1);
	if (rc == 0 && o->reference) {
		rc = kvtr_kvcache_init(&s->cache, c->m);
		s->cache.dtype = o->kv_dtype; /* K/V rounded as kvtier would store them */
	}
	if (rc)
		return rc;
	s->hist = calloc(seq, sizeof(int32_t));
	s->out_toks = calloc(seq, sizeof(int32_t));
	if (!s->hist || !s->out_toks)
		return kvtr_err(-ENOMEM, "out of memory for session %u", idx + 1);
	if (!o->reference) {
		struct kvt_seq_opts so;

		kvt_seq_opts_init(&so, sizeof(so));
		so.tenant = 0;
		if (o->remote_save)
			so.session_key = (uint64_t)idx + 1;
		if (o->remote_resume)
			return run_sess_restore(c, s, &so);
		rc = kvt_seq_open(c->e, &so, &s->id);
		if (rc)
			return kvtr_err_kvt(rc, "kvt_seq_open");
	}
	return 0;
}

static void
run_sess_fini(struct run_ctx *c, struct run_sess *s)
{
	if (c->e && s->id)
		kvt_seq_close(c->e, s->id);
	kvtr_state_fini(&s->st);
	kvtr_sampler_fini(&s->samp);
	kvtr_kvcache_fini(&s->cache);
	free(s->hist);
	free(s->turn_toks);
	free(s->out_toks);
	kvtr_str_free(&s->text);
	memset(s, 0, sizeof(*s));
}

/* Moves the turn's text and tokens into the result. */
static int
run_turn_store(struct run_ctx *c, struct run_sess *s)
{
	struct kvtr_turn_out *out = &c->r->out[(size_t)s->idx * c->o->turns + s->turn];

	out->text = strdup(kvtr_str_cstr(&s->text));
	out->tokens = malloc(((size_t)s->n_out + 1) * sizeof(int32_t));
	if (!out->text || !out->tokens)
		return kvtr_err(-ENOMEM, "out of memory storing a turn's text");
	memcpy(out->tokens, s->out_toks, (size_t)s->n_out * sizeof(int32_t));
	out->n_tokens = s->n_out;
	kvtr_str_free(&s->text);
	s->n_out = 0;
	return 0;
}

static int
run_end_turn(struct run_ctx *c, struct run_sess *s)
{
	int rc;

	s->in_turn = 0;
	if (c->e) {
		/* the idle chat session: demote all its blocks until the next turn */
		rc = kvt_seq_park(c->e, s->id, c->park_tier);
		if (rc == -ENOSPC)
			c->r->park_nospc++;
		else if (rc)
			return kvtr_err_kvt(rc, "kvt_seq_park");
		else
			c->r->parks++;
	}
	return run_turn_store(c, s);
}

/*
 * A prompt longer than the turn's room (steps, or what is left of the model's context) is cut:
 * say so once per turn (for the first session it happens to), on the log stream.
 */
static void
run_warn_prompt_cut(struct run_ctx *c, const struct run_sess *s, uint32_t turn)
{
	uint32_t left = (uint32_t)c->m->cfg.seq_len - s->n_hist;
	uint32_t room = c->steps < left ? c->steps : left;
	uint32_t n_prompt = s->n_turn_toks - 1; /* BOS is not printed */

	if (n_prompt <= room || c->cut_warned == turn + 1)
		return;
	c->cut_warned = turn + 1;
	fprintf(c->log, "kvtier-run: warning: session %u turn %u: the prompt is %u tokens but the "
		"turn has room for %u (steps %u, %u positions left of the model's context %d): "
		"%u kept, %u dropped\n", s->idx + 1, turn + 1, n_prompt, room, c->steps, left,
		c->m->cfg.seq_len, room, n_prompt - room);
}

/*
 * First turn with prefix sharing: attach the prompt blocks that are already cached (never the
 * last prompt token: its logits are needed) and emit those positions' pieces exactly as
 * run_after_forward() would have, without computing them.
 */
static int
run_attach_prefix(struct run_ctx *c, struct run_sess *s)
{
	uint32_t room = c->steps < s->n_turn_toks ? c->steps : s->n_turn_toks, g;
	uint64_t a = 0;
	int rc;

	if (room < 2)
		return 0;
	rc = kvt_seq_attach_prefix(c->e, s->id, s->turn_toks, room - 1, &a);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_seq_attach_prefix");
	for (g = 0; g < (uint32_t)a; g++) {
		int32_t next = s->turn_toks[g + 1];
		const char *piece = kvtr_tokenizer_decode(c->o->tok, s->hist[g], next);

		if (kvtr_piece_printable(piece) && (rc = kvtr_str_append(&s->text, piece)) != 0)
			return rc;
		s->out_toks[s->n_out++] = next;
		s->hist[s->n_hist++] = next;
	}
	s->n_kv = (uint32_t)a;
	c->r->prefix_tokens += a;
	return 0;
}

static int
run_begin_turn(struct run_ctx *c, struct run_sess *s, uint32_t turn)
{
	const char *prompt = c->o->prompt ? c->o->prompt
					  : kvtr_builtin_prompt(s->idx, turn, c->o->turns);
	int rc;

	s->turn = turn;
	s->n_out = 0;
	free(s->turn_toks);
	s->turn_toks = malloc((strlen(prompt) + 2) * sizeof(int32_t));
	if (!s->turn_toks)
		return kvtr_err(-ENOMEM, "out of memory encoding a prompt");
	rc = kvtr_tokenizer_encode(c->o->tok, prompt, 1, s->turn_toks, &s->n_turn_toks);
	if (rc)
		return rc;
	if (s->n_hist >= (uint32_t)c->m->cfg.seq_len) {
		/* the sequence is full: this turn has no position left */
		fprintf(c->log, "kvtier-run: note: session %u reached the model's seq_len %d; "
			"turn %u is empty\n", s->idx + 1, c->m->cfg.seq_len, turn + 1);
		return run_turn_store(c, s);
	}
	run_warn_prompt_cut(c, s, turn);
	if (turn > 0 && c->e) {
		rc = kvt_seq_resume(c->e, s->id);
		if (rc)
			return kvtr_err_kvt(rc, "kvt_seq_resume");
	}
	s->turn_start = s->n_hist;
	s->hist[s->n_hist++] = s->turn_toks[0];
	s->in_turn = 1;
	if (turn == 0 && c->e && c->o->prefix_share)
		return run_attach_prefix(c, s);
	return 0;
}

/* After a computed position: choose the next token as llama2.c's generate() does. */
static int
run_after_forward(struct run_ctx *c, struct run_sess *s)
{
	uint32_t g, local;
	int32_t next;
	const char *piece;

	if (s->n_kv < s->n_hist)
		return 0; /* re-prefill after lost blocks: logits of old positions are not used */
	g = s->n_kv - 1;
	local = g - s->turn_start;
	if (local + 1 < s->n_turn_toks) {
		next = s->turn_toks[local + 1];
	} else {
		next = kvtr_sampler_sample(&s->samp, s->st.logits);
		c->r->tokens_generated++;
	}
	if (next == KVTR_TOKEN_BOS)
		return run_end_turn(c, s);
	piece = kvtr_tokenizer_decode(c->o->tok, s->hist[g], next);
	if (kvtr_piece_printable(piece)) {
		int rc = kvtr_str_append(&s->text, piece);

		if (rc)
			return rc;
		if (c->o->stream && c->o->sessions == 1 && c->o->turns == 1 &&
		    (fputs(piece, c->o->stream) < 0 || fflush(c->o->stream) != 0))
			return kvtr_err(-EIO, "cannot write the generated text: %s",
					strerror(errno));
	}
	s->out_toks[s->n_out++] = next;
	if (local + 1 >= c->steps || g + 1 >= (uint32_t)c->m->cfg.seq_len)
		return run_end_turn(c, s);
	s->hist[s->n_hist++] = next;
	return 0;
}

static int
run_step(struct run_ctx *c, uint32_t n_act)
{
	int rc = 0;

	if (c->e) {
		rc = run_step_kvt(c, c->act, n_act);
	} else {
		for (uint32_t i = 0; i < n_act; i++) {
			struct run_sess *s = c->act[i];

			kvtr_forward_contig(c->m, &s->st, &s->cache, s->hist[s->n_kv], s->n_kv);
			s->n_kv++;
			s->computed = 1;
			c->r->positions++;
		}
	}
	for (uint32_t i = 0; rc == 0 && i < n_act; i++)
		if (c->act[i]->computed)
			rc = run_after_forward(c, c->act[i]);
	c->r->steps++;
	if (rc == 0 && c->e && c->o->step_hook)
		c->o->step_hook(c->o->hook_arg, c->e, c->r->steps);
	return rc;
}

/* Runs every turn of every session; sessions interleave step by step. */
static int
run_loop(struct run_ctx *c)
{
	double t0 = kvtr_now(), t1 = 0.0, t2;
	uint64_t pos1 = 0;
	int rc = 0;

	uint32_t t_end = c->o->remote_save ? c->o->remote_save : c->o->turns;

	for (uint32_t t = c->o->remote_resume; rc == 0 && t < t_end; t++) {
		/* prefix sharing: session 0 computes the first prompt, the others attach it */
		uint32_t first = t == 0 && c->e && c->o->prefix_share ? 1 : c->o->sessions;

		for (uint32_t i = 0; rc == 0 && i < first; i++)
			rc = run_begin_turn(c, &c->ss[i], t);
again:
		while (rc == 0) {
			uint32_t n_act = 0;

			for (uint32_t i = 0; i < c->o->sessions; i++)
				if (c->ss[i].in_turn)
					c->act[n_act++] = &c->ss[i];
			if (n_act == 0)
				break;
			rc = run_step(c, n_act);
			if (t1 == 0.0) { /* llama2.c starts its clock after the first step */
				t1 = kvtr_now();
				pos1 = c->r->positions;
			}
		}
		if (rc == 0 && first < c->o->sessions) {
			for (uint32_t i = first; rc == 0 && i < c->o->sessions; i++)
				rc = run_begin_turn(c, &c->ss[i], t);
			first = c->o->sessions;
			goto again;
		}
	}
	if (rc == 0 && c->o->remote_save)
		rc = run_remote_save(c);
	t2 = kvtr_now();
	c->r->elapsed_s = t2 - t0;
	if (t1 > 0.0 && t2 > t1)
		c->r->tok_per_s = (double)(c->r->positions - pos1) / (t2 - t1);
	return rc;
}

static void
run_engine_log(void *arg, int level, const char *msg)
{
	FILE *f = arg;

	if (level <= KVT_LOG_WARN)
		fprintf(f, "kvtier-run: kvtier %s: %s\n",
			level == KVT_LOG_ERROR ? "error" : "warning", msg);
}

static int
run_make_tmpdir(struct run_ctx *c)
{
	const char *base = getenv("TMPDIR");

	if (!base || !*base)
		base = "/tmp";
	snprintf(c->tmpdir, sizeof(c->tmpdir), "%s/kvtier-run.XXXXXX", base);
	if (!mkdtemp(c->tmpdir)) {
		int err = errno;

		c->tmpdir[0] = '\0';
		return kvtr_err(-err, "cannot create a temporary NVMe directory under %s: %s", base,
				strerror(err));
	}
	return 0;
}

/* Engine with the asked (or automatic) tier sizes; see runner.h for the defaults. */
static int
run_engine_create(struct run_ctx *c)
{
	const struct kvtr_run_opts *o = c->o;
	const struct kvtr_model *m = c->m;
	struct kvt_engine_opts eo;
	uint64_t tpb = o->tokens_per_block;
	uint64_t block = tpb * (uint64_t)m->cfg.n_layers * 2 * m->kv_dim *
			 kvt_dtype_size(o->kv_dtype);
	uint64_t nblocks = (uint64_t)o->sessions * (((uint64_t)m->cfg.seq_len + tpb - 1) / tpb);
	int rc;

	kvt_engine_opts_init(&eo, sizeof(eo));
	eo.layout.n_layers = (uint32_t)m->cfg.n_layers;
	eo.layout.n_kv_heads = (uint32_t)m->cfg.n_kv_heads;
	eo.layout.head_dim = m->head_size;
	eo.layout.dtype = o->kv_dtype;
	eo.layout.tokens_per_block = o->tokens_per_block;
	eo.hbm_bytes = o->hbm_bytes ? o->hbm_bytes : nblocks * block;
	eo.host_bytes = o->host_bytes ? o->host_bytes : nblocks * block;
	/* an NVMe slot is a 4 KiB header page, then the block rounded up to 4 KiB (kvtier.h's
	 * nvme_bytes): room for every block of every session */
	eo.nvme_bytes = o->nvme_bytes ? o->nvme_bytes
				      : nblocks * (4096 + (block + 4095) / 4096 * 4096);
	eo.nvme_codec = o->nvme_codec;
	if (o->nvme_dir) {
		eo.nvme_dir = o->nvme_dir;
	} else {
		rc = run_make_tmpdir(c);
		if (rc)
			return rc;
		eo.nvme_dir = c->tmpdir;
	}
	eo.device = o->device;
	eo.emu_max_delay_us = o->emu_delay_us;
	eo.emu_copy_bytes_per_s = o->emu_copy_bytes_per_s;
	eo.emu_lazy = o->emu_lazy;
	eo.log = run_engine_log;
	eo.log_arg = c->log;
	if (o->remote_host) {
		/* the namespace: the model's header and an XXH3-64 of its weights */
		uint64_t h = m->map ? XXH3_64bits(m->map, m->map_len) : 0;

		snprintf(c->model_id, sizeof c->model_id, "kvtier-run:%d:%d:%d:%d:%d:%016llx",
			 m->cfg.dim, m->cfg.n_layers, m->cfg.n_heads, m->cfg.vocab_size,
			 m->cfg.seq_len, (unsigned long long)h);
		eo.remote_host = o->remote_host;
		eo.remote_port = o->remote_port;
		eo.remote_user = o->remote_user;
		eo.remote_password = o->remote_password;
		eo.remote_model_id = c->model_id;
	}
	c->r->hbm_bytes = eo.hbm_bytes;
	c->r->host_bytes = eo.host_bytes;
	c->r->nvme_bytes = eo.nvme_bytes;
	rc = kvt_engine_create(&eo, &c->e);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_engine_create");
	/* the engine's slot file has no name (kvt_nvme_path): its temporary directory is empty and
	 * goes now, so that a SIGTERM or a crash leaves nothing under TMPDIR */
	if (c->tmpdir[0] && rmdir(c->tmpdir) == 0)
		c->tmpdir[0] = '\0';
	c->park_tier = KVT_TIER_NVME;
	rc = kvt_engine_geometry(c->e, &c->geo);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_engine_geometry");
	c->r->geo = c->geo;
	return 0;
}

/*
 * Before decoding: a session that outgrows HBM is decoded by windows, which need 2 HBM slots
 * (one window block and the new token's block). Refuse an HBM of one slot up front when a
 * session can grow past one block (turns x steps positions, at most seq_len), rather than fail
 * in the middle of the text.
 */
static int
run_check_hbm(const struct run_ctx *c)
{
	uint64_t most = (uint64_t)c->o->turns * c->steps;
	uint32_t tpb = c->geo.tokens_per_block;

	if (most > (uint64_t)c->m->cfg.seq_len)
		most = (uint64_t)c->m->cfg.seq_len;
	if (c->geo.hbm_slots >= 2 || most <= tpb)
		return 0;
	return kvtr_err(KVT_ETOOBIG, "HBM holds %u block slot(s): too small to hold one "
			"decode batch of a session reaching %llu tokens (%llu blocks of %u tokens; "
			"windows need at least 2 slots): use --hbm %llu or more (2 blocks of %llu "
			"bytes) with --tokens-per-block %u", c->geo.hbm_slots,
			(unsigned long long)most,
			(unsigned long long)((most + tpb - 1) / tpb), tpb,
			(unsigned long long)(2 * c->geo.block_bytes),
			(unsigned long long)c->geo.block_bytes, tpb);
}

static int
run_setup(struct run_ctx *c)
{
	size_t dim = (size_t)c->m->cfg.dim, nh = (size_t)c->m->cfg.n_heads;
	int rc;

	c->ss = calloc(c->o->sessions, sizeof(*c->ss));
	c->act = calloc(c->o->sessions, sizeof(*c->act));
	c->ids = calloc(c->o->sessions, sizeof(*c->ids));
	c->hint_ids = calloc(c->o->sessions, sizeof(*c->hint_ids));
	c->hint_last = calloc(c->o->sessions, sizeof(*c->hint_last));
	c->hint_part = calloc(c->o->sessions, sizeof(*c->hint_part));
	c->r->out = calloc((size_t)c->o->sessions * c->o->turns, sizeof(*c->r->out));
	c->wo = calloc(dim * 2 + nh * 4, sizeof(float));
	if (!c->ss || !c->act || !c->ids || !c->hint_ids || !c->hint_last || !c->hint_part || !c->r->out ||
	    !c->wo)
		return kvtr_err(-ENOMEM, "out of memory for %u sessions", c->o->sessions);
	c->po = c->wo + dim;
	c->wm = c->po + dim;
	c->wl = c->wm + nh;
	c->pm = c->wl + nh;
	c->pl = c->pm + nh;
	c->r->sessions = c->o->sessions;
	c->r->turns = c->o->turns;
	if (!c->o->reference) {
		rc = run_engine_create(c);
		if (rc == 0)
			rc = run_check_hbm(c);
		if (rc)
			return rc;
		c->side = calloc((size_t)c->m->cfg.n_layers * 2 * c->m->kv_dim, sizeof(float));
		c->tokblk = calloc(2, c->geo.token_bytes);
		if (!c->side || !c->tokblk)
			return kvtr_err(-ENOMEM, "out of memory for windowed decoding buffers");
		rc = run_dev_init(c);
		if (rc)
			return rc;
	}
	for (uint32_t i = 0; i < c->o->sessions; i++) {
		rc = run_sess_init(c, &c->ss[i], i);
		if (rc)
			return rc;
	}
	return 0;
}

static int
run_teardown(struct run_ctx *c, int rc)
{
	if (c->e && rc == 0) {
		int rc2 = kvt_engine_drain(c->e);

		if (rc2)
			rc = kvtr_err_kvt(rc2, "kvt_engine_drain");
	}
	if (c->e) {
		c->r->stats.size = sizeof(c->r->stats);
		if (kvt_engine_stats(c->e, &c->r->stats) != 0 && rc == 0)
			rc = kvtr_err_kvt(-EIO, "kvt_engine_stats");
	}
	if (c->ss) {
		uint32_t tpb = c->o->tokens_per_block ? c->o->tokens_per_block : 1;

		for (uint32_t i = 0; i < c->o->sessions; i++) {
			c->r->kv_tokens += c->ss[i].n_kv;
			c->r->kv_blocks += (c->ss[i].n_kv + tpb - 1) / tpb;
			run_sess_fini(c, &c->ss[i]);
		}
	}
	run_dev_fini(c);
	kvt_engine_destroy(c->e);
	c->e = NULL;
	if (c->tmpdir[0])
		rmdir(c->tmpdir);
	free(c->ss);
	free(c->act);
	free(c->ids);
	free(c->hint_ids);
	free(c->hint_last);
	free(c->hint_part);
	free(c->wo);
	free(c->side);
	free(c->tokblk);
	return rc;
}

int
kvtr_run(const struct kvtr_run_opts *o, struct kvtr_run_result *r)
{
	struct run_ctx c;
	int rc;

	memset(r, 0, sizeof(*r));
	memset(&c, 0, sizeof(c));
	rc = run_check_opts(o);
	if (rc)
		return rc;
	c.o = o;
	c.r = r;
	c.m = o->model;
	c.log = o->log ? o->log : stderr;
	c.steps = o->steps;
	if (c.steps == 0 || c.steps > (uint32_t)c.m->cfg.seq_len)
		c.steps = (uint32_t)c.m->cfg.seq_len;
	r->reference = o->reference;
	rc = run_setup(&c);
	if (rc == 0)
		rc = run_loop(&c);
	if (rc == 0 && o->stream && o->sessions == 1 && o->turns == 1 &&
	    (fputs("\n", o->stream) < 0 || fflush(o->stream) != 0))
		rc = kvtr_err(-EIO, "cannot write the generated text: %s", strerror(errno));
	return run_teardown(&c, rc);
}

void
kvtr_run_result_free(struct kvtr_run_result *r)
{
	if (r->out)
		for (size_t i = 0; i < (size_t)r->sessions * r->turns; i++) {
			free(r->out[i].text);
			free(r->out[i].tokens);
		}
	free(r->out);
	memset(r, 0, sizeof(*r));
}
