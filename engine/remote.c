/* SPDX-License-Identifier: MIT */
/*
 * engine/remote.c - the engine side of the REMOTE tier (issue 18, items 1 and 4): a worker
 * thread owns the Redis client (tiers/remote.h; it is not thread-safe and blocks on the network)
 * and runs the jobs the engine queues: a publish (a snapshot of a session's blocks and its
 * session value, taken under the engine lock) or a restore (the session value and the blocks,
 * fetched for a caller that waits WITHOUT the engine lock). Publish completions are reaped by
 * kvt_engine_poll/drain into kvt_stats.remote_*. docs/ARCHITECTURE.md "REMOTE tier" and
 * docs/FORMAT.md "REMOTE session values" describe the design and the session value.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "engine/engine_impl.h"
#include "tiers/base/alloc.h"
#include "tiers/base/error.h"
#include "tiers/format.h"
#include "tiers/remote.h"

#define RS_MAGIC "KVTRSES1"
#define RS_VERSION 1u
#define RS_HDR 80u          /* header bytes before the tokens */
#define RS_BATCH 64u        /* blocks per put/get round */
#define RS_KEY_MAX 128u

enum { RJ_PUBLISH = 0, RJ_RESTORE = 1 };

struct rjob {
	struct rjob *next;
	int kind;
	int rc;             /* result: 0 or a negative code */
	int done;           /* restore: set by the worker under mu */
	uint32_t tenant;
	uint64_t key;       /* session key */
	uint32_t n_full;    /* full (content-addressed) blocks */
	uint8_t (*hashes)[16]; /* publish: [n_full]; restore: points into sval */
	uint8_t *data;      /* publish: n_full blocks; restore: n_full blocks read */
	uint8_t *sval;      /* the session value (publish: to put; restore: as read) */
	size_t sval_len;
	/* restore: fields of the verified session value */
	uint64_t n_tokens;
	const int32_t *tokens; /* into sval (4-byte aligned: RS_HDR is) */
	const uint8_t *partial; /* into sval, block_bytes, or NULL */
	char msg[512];      /* the worker's error message (messages are thread-local) */
};

struct kvt_reng {
	struct kvt_remote *cli;
	struct kvt_rv_ns ns;
	uint64_t block_bytes;
	uint32_t tpb;
	void *stream;       /* device stream of the publishes' copies (under the engine lock) */
	pthread_t th;
	pthread_mutex_t mu;
	pthread_cond_t cv;  /* worker: jobs queued or stop */
	pthread_cond_t done_cv; /* waiters: a job finished */
	struct rjob *head, *tail; /* queued */
	struct rjob *done;  /* finished publishes, reaped by the engine */
	uint32_t pending;   /* publishes queued or running */
	int stop;
	struct kvt_remote_stats cs; /* the client's counters after the latest job */
	int breaker_open;   /* any breaker open after the latest job */
};

/* "kvt1:<32 hex ns>:<8 hex tenant>:s:<16 hex session key>" */
static size_t
rs_key(const struct kvt_reng *r, uint32_t tenant, uint64_t key, char *out)
{
	char ns[33];

	for (int i = 0; i < 16; i++)
		snprintf(ns + 2 * i, 3, "%02x", r->ns.id[i]);
	return (size_t)snprintf(out, RS_KEY_MAX, "kvt1:%s:%08x:s:%016llx", ns, tenant,
				(unsigned long long)key);
}

static size_t
rs_len(uint64_t n_tokens, uint32_t n_full, uint64_t partial_len)
{
	return RS_HDR + 4 * n_tokens + 16ull * n_full + partial_len + 8;
}

/* Check the session value @v (@len bytes) read for (@j->tenant, @j->key); fill @j's fields. */
static int
rs_parse(const struct kvt_reng *r, struct rjob *j, const uint8_t *v, size_t len)
{
	uint64_t n_tokens, partial_len;
	uint32_t n_full;

	if (len < rs_len(0, 0, 0) || memcmp(v, RS_MAGIC, 8))
		return kvt_err(KVT_ECORRUPT, "session value: bad length or magic");
	if (XXH3_64bits(v, len - 8) != kvt_get_le64(v + len - 8))
		return kvt_err(KVT_ECORRUPT, "session value: checksum");
	if (kvt_get_le32(v + 8) != RS_VERSION || kvt_get_le32(v + 12) != j->tenant ||
	    memcmp(v + 16, r->ns.id, 16) || kvt_get_le64(v + 32) != j->key ||
	    kvt_get_le64(v + 40) != r->ns.layout_fp || kvt_get_le32(v + 60) != r->tpb)
		return kvt_err(KVT_ECORRUPT, "session value: version, tenant, namespace, key or "
			       "layout differ");
	n_tokens = kvt_get_le64(v + 48);
	n_full = kvt_get_le32(v + 56);
	partial_len = kvt_get_le64(v + 64);
	if (n_tokens > (1ull << 32) || n_full != n_tokens / r->tpb ||
	    partial_len != (n_tokens % r->tpb ? r->block_bytes : 0) ||
	    len != rs_len(n_tokens, n_full, partial_len))
		return kvt_err(KVT_ECORRUPT, "session value: lengths do not agree");
	j->n_tokens = n_tokens;
	j->n_full = n_full;
	j->tokens = (const int32_t *)(const void *)(v + RS_HDR);
	j->hashes = (uint8_t(*)[16])(uintptr_t)(v + RS_HDR + 4 * n_tokens);
	j->partial = partial_len ? v + RS_HDR + 4 * n_tokens + 16ull * n_full : NULL;
	for (uint64_t i = 0; i < n_tokens; i++)
		if (j->tokens[i] < 0)
			return kvt_err(KVT_ECORRUPT, "session value: token %llu is negative",
				       (unsigned long long)i);
	return 0;
}

static int
rs_take(void *arg, uint32_t i, const void *val, size_t len)
{
	struct rjob *j = arg;
	uint8_t *copy;

	(void)i;
	if (len < rs_len(0, 0, 0) || len > (64ull << 30))
		return 0;
	copy = malloc(len);
	if (!copy)
		return 0;
	memcpy(copy, val, len);
	j->sval = copy;
	j->sval_len = len;
	return 1;
}

static void
job_free(struct rjob *j)
{
	if (!j)
		return;
	free(j->data);
	free(j->sval);
	if (j->kind == RJ_PUBLISH)
		free(j->hashes);
	free(j);
}

static int
run_publish(struct kvt_reng *r, struct rjob *j)
{
	char key[RS_KEY_MAX];
	const char *keys[1] = { key };
	size_t kl;
	int res[RS_BATCH], rc;

	for (uint32_t at = 0; at < j->n_full; at += RS_BATCH) {
		uint32_t n = j->n_full - at < RS_BATCH ? j->n_full - at : RS_BATCH;
		const void *src[RS_BATCH];

		for (uint32_t i = 0; i < n; i++)
			src[i] = j->data + (uint64_t)(at + i) * r->block_bytes;
		rc = kvt_remote_put_blocks(r->cli, &r->ns, j->tenant,
					   (const uint8_t(*)[16])(j->hashes + at), src, n, res);
		if (rc < 0)
			return rc;
		for (uint32_t i = 0; i < n; i++)
			if (res[i] < 0)
				return res[i];
	}
	kl = rs_key(r, j->tenant, j->key, key);
	rc = kvt_remote_del(r->cli, keys, &kl, 1, res);
	if (rc < 0 || res[0] < 0)
		return rc < 0 ? rc : res[0];
	{
		struct kvt_remote_val v = { .p = { j->sval, NULL }, .n = { j->sval_len, 0 } };

		rc = kvt_remote_put(r->cli, keys, &kl, &v, 1, res);
	}
	if (rc < 0 || res[0] < 0)
		return rc < 0 ? rc : res[0];
	return 0;
}

static int
run_restore(struct kvt_reng *r, struct rjob *j)
{
	char key[RS_KEY_MAX];
	const char *keys[1] = { key };
	size_t kl = rs_key(r, j->tenant, j->key, key);
	int res[RS_BATCH], rc;

	rc = kvt_remote_get(r->cli, keys, &kl, 1, rs_take, j, res);
	if (rc < 0)
		return rc;
	if (res[0] < 0)
		return res[0];
	if (res[0] == 0 || !j->sval)
		return kvt_err(-ENOENT, "session %#llx of tenant %u is not in the REMOTE tier",
			       (unsigned long long)j->key, j->tenant);
	rc = rs_parse(r, j, j->sval, j->sval_len);
	if (rc) {
		/* a bad value is a miss: delete it best effort */
		(void)kvt_remote_del(r->cli, keys, &kl, 1, NULL);
		return kvt_err(-ENOENT, "session %#llx: its REMOTE value failed a check (%s)",
			       (unsigned long long)j->key, kvt_last_error_message());
	}
	if (j->n_full && !(j->data = malloc((size_t)j->n_full * r->block_bytes)))
		return kvt_err(-ENOMEM, "restore buffer of %u blocks", j->n_full);
	for (uint32_t at = 0; at < j->n_full; at += RS_BATCH) {
		uint32_t n = j->n_full - at < RS_BATCH ? j->n_full - at : RS_BATCH;
		void *dst[RS_BATCH];

		for (uint32_t i = 0; i < n; i++)
			dst[i] = j->data + (uint64_t)(at + i) * r->block_bytes;
		rc = kvt_remote_get_blocks(r->cli, &r->ns, j->tenant,
					   (const uint8_t(*)[16])(j->hashes + at), dst, n, res);
		if (rc < 0)
			return rc;
		for (uint32_t i = 0; i < n; i++) {
			if (res[i] < 0)
				return res[i];
			if (res[i] == 0)
				return kvt_err(-ENOENT, "session %#llx: block %u is absent from the "
					       "REMOTE tier or failed verification",
					       (unsigned long long)j->key, at + i);
		}
	}
	return 0;
}

static void *
worker(void *arg)
{
	struct kvt_reng *r = arg;

	pthread_mutex_lock(&r->mu);
	for (;;) {
		struct rjob *j;

		while (!r->head && !r->stop)
			pthread_cond_wait(&r->cv, &r->mu);
		if (!r->head)
			break;
		j = r->head;
		r->head = j->next;
		if (!r->head)
			r->tail = NULL;
		pthread_mutex_unlock(&r->mu);
		j->rc = j->kind == RJ_PUBLISH ? run_publish(r, j) : run_restore(r, j);
		if (j->rc)
			snprintf(j->msg, sizeof j->msg, "%s", kvt_last_error_message());
		pthread_mutex_lock(&r->mu);
		kvt_remote_stats(r->cli, &r->cs);
		r->breaker_open = kvt_remote_breaker_open(r->cli, NULL, 0);
		if (j->kind == RJ_PUBLISH) {
			j->next = r->done;
			r->done = j;
		} else {
			j->done = 1;
		}
		pthread_cond_broadcast(&r->done_cv);
	}
	pthread_mutex_unlock(&r->mu);
	return NULL;
}

static void
queue_job(struct kvt_reng *r, struct rjob *j)
{
	pthread_mutex_lock(&r->mu);
	j->next = NULL;
	if (r->tail)
		r->tail->next = j;
	else
		r->head = j;
	r->tail = j;
	if (j->kind == RJ_PUBLISH)
		r->pending++;
	pthread_cond_signal(&r->cv);
	pthread_mutex_unlock(&r->mu);
}

int
kvt_reng_open(struct kvt_engine *e)
{
	const struct kvt_engine_opts *o = &e->opts;
	struct kvt_remote_opts ro = { 0 };
	struct kvt_rv_desc d = { 0 };
	struct kvt_reng *r;
	int rc;

	if (!o->remote_model_id || !*o->remote_model_id)
		return kvt_err(-EINVAL, "remote_host given without remote_model_id (the model's "
			       "identity is part of every REMOTE key)");
	r = kvt_calloc(1, sizeof *r);
	if (!r)
		return kvt_err(-ENOMEM, "remote worker");
	d.model_id = o->remote_model_id;
	d.layout = e->layout;
	d.codec = KVT_CODEC_NONE;
	d.tp_size = 1;
	d.pp_size = 1;
	rc = kvt_rv_ns_init(&r->ns, &d);
	if (rc) {
		kvt_free(r);
		return rc;
	}
	r->block_bytes = e->block_bytes;
	r->tpb = e->layout.tokens_per_block;
	ro.host = o->remote_host;
	ro.port = o->remote_port;
	ro.user = o->remote_user;
	ro.password = o->remote_password;
	ro.connect_timeout_ms = o->remote_connect_timeout_ms;
	ro.op_timeout_ms = o->remote_op_timeout_ms;
	ro.ttl_ms = o->remote_ttl_ms;
	rc = kvt_remote_open(&ro, &r->cli);
	if (rc) {
		kvt_free(r);
		return rc; /* the client's message says which server and why */
	}
	rc = kvt_engine_stream_create(e, &r->stream);
	if (rc) {
		kvt_remote_close(r->cli);
		kvt_free(r);
		return rc;
	}
	pthread_mutex_init(&r->mu, NULL);
	pthread_cond_init(&r->cv, NULL);
	pthread_cond_init(&r->done_cv, NULL);
	if (pthread_create(&r->th, NULL, worker, r)) {
		pthread_cond_destroy(&r->done_cv);
		pthread_cond_destroy(&r->cv);
		pthread_mutex_destroy(&r->mu);
		kvt_engine_stream_destroy(e, r->stream);
		kvt_remote_close(r->cli);
		kvt_free(r);
		return kvt_err(-EAGAIN, "remote worker thread");
	}
	e->remote = r;
	return 0;
}

/* Under the engine lock (or at destroy): finished publishes -> counters. */
void
kvt_reng_reap(struct kvt_engine *e)
{
	struct kvt_reng *r = e->remote;
	struct rjob *list;

	pthread_mutex_lock(&r->mu);
	list = r->done;
	r->done = NULL;
	e->st.remote_bytes_out = r->cs.bytes_out;
	e->st.remote_bytes_in = r->cs.bytes_in;
	e->st.remote_breaker_trips = r->cs.breaker_trips;
	e->st.remote_errors = r->cs.errors;
	e->st.remote_breaker_open = (uint64_t)r->breaker_open;
	pthread_mutex_unlock(&r->mu);
	while (list) {
		struct rjob *j = list;

		list = j->next;
		if (j->rc == 0) {
			e->st.remote_publishes++;
			e->st.remote_blocks_put += j->n_full;
		} else {
			e->st.remote_publish_failed++;
			kvt_engine_log(e, KVT_LOG_WARN, "session %#llx was not published to the "
				       "REMOTE tier: %s", (unsigned long long)j->key, j->msg);
		}
		pthread_mutex_lock(&r->mu);
		r->pending--;
		pthread_cond_broadcast(&r->done_cv); /* a drain may wait for pending to reach 0 */
		pthread_mutex_unlock(&r->mu);
		job_free(j);
	}
}

void
kvt_reng_drain(struct kvt_engine *e)
{
	struct kvt_reng *r = e->remote;

	pthread_mutex_lock(&r->mu);
	while (r->pending) {
		if (r->done) {
			pthread_mutex_unlock(&r->mu);
			kvt_lock(e);
			kvt_reng_reap(e);
			kvt_unlock(e);
			pthread_mutex_lock(&r->mu);
			continue;
		}
		pthread_cond_wait(&r->done_cv, &r->mu);
	}
	pthread_mutex_unlock(&r->mu);
}

void
kvt_reng_close(struct kvt_engine *e)
{
	struct kvt_reng *r = e->remote;

	if (!r)
		return;
	pthread_mutex_lock(&r->mu);
	r->stop = 1;
	pthread_cond_signal(&r->cv);
	pthread_mutex_unlock(&r->mu);
	pthread_join(r->th, NULL); /* runs what was queued first (each job bounded by timeouts) */
	kvt_lock(e);
	kvt_reng_reap(e);
	kvt_unlock(e);
	pthread_cond_destroy(&r->done_cv);
	pthread_cond_destroy(&r->cv);
	pthread_mutex_destroy(&r->mu);
	kvt_engine_stream_destroy(e, r->stream);
	kvt_remote_close(r->cli);
	kvt_free(r);
	e->remote = NULL;
}

/* Copy block @b's bytes (a valid HBM or HOST copy) to @dst, under the engine lock. */
static int
copy_block(struct kvt_engine *e, const struct kvt_block *b, uint32_t i, void *dst)
{
	int rc;

	if (kvt_copy_state(b, KVT_TIER_HBM) == KVT_COPY_PRESENT) {
		rc = kvt_engine_stream_memcpy_async(e, e->remote->stream, dst,
						    kvt_slot_addr(e, KVT_TIER_HBM,
								  b->slot[KVT_TIER_HBM]),
						    e->block_bytes);
		return rc ? rc : kvt_engine_stream_sync(e, e->remote->stream);
	}
	if (kvt_copy_state(b, KVT_TIER_HOST) == KVT_COPY_PRESENT) {
		memcpy(dst, kvt_slot_addr(e, KVT_TIER_HOST, b->slot[KVT_TIER_HOST]),
		       e->block_bytes);
		return 0;
	}
	return kvt_err(-EAGAIN, "block %u of the sequence has no valid copy in HBM or HOST (on "
		       "NVMe or in flight): resume it or drain first", i);
}

int
kvt_seq_publish_remote(struct kvt_engine *e, kvt_seq_id id)
{
	struct kvt_reng *r;
	struct kvt_seqrec *s;
	struct rjob *j = NULL;
	uint32_t n_full, tpb;
	uint64_t partial_len;
	uint8_t *p;
	int rc = 0;

	if (!e)
		return kvt_err(-EINVAL, "kvt_seq_publish_remote: engine is NULL");
	if (!(r = e->remote))
		return kvt_err(-ENODEV, "kvt_seq_publish_remote: the engine has no REMOTE tier "
			       "(opts.remote_host)");
	tpb = r->tpb;
	kvt_lock(e);
	s = kvt_seq_lookup(e, id, NULL);
	if (!s) {
		rc = kvt_err(KVT_ECLOSED, "kvt_seq_publish_remote: sequence %#llx is not open",
			     (unsigned long long)id);
		goto out;
	}
	if (!s->session_key) {
		rc = kvt_err(-EINVAL, "kvt_seq_publish_remote: the sequence has no session_key");
		goto out;
	}
	if (s->in_batch || s->in_call) {
		rc = kvt_err(KVT_EBUSY, "kvt_seq_publish_remote: the sequence is in an unreleased "
			     "batch or another call");
		goto out;
	}
	for (uint64_t t = 0; t < s->n_tokens; t++)
		if (s->tokens[t] < 0) {
			rc = kvt_err(-EINVAL, "kvt_seq_publish_remote: token %llu was not given "
				     "(pass tokens to kvt_seq_append)", (unsigned long long)t);
			goto out;
		}
	n_full = (uint32_t)(s->n_tokens / tpb);
	partial_len = s->n_tokens % tpb ? e->block_bytes : 0;
	j = calloc(1, sizeof *j);
	if (!j || !(j->sval = malloc(rs_len(s->n_tokens, n_full, partial_len))) ||
	    (n_full && (!(j->hashes = malloc(16ull * n_full)) ||
			!(j->data = malloc((size_t)n_full * e->block_bytes))))) {
		rc = kvt_err(-ENOMEM, "kvt_seq_publish_remote: snapshot of %u blocks", n_full);
		goto out;
	}
	j->kind = RJ_PUBLISH;
	j->tenant = s->tenant;
	j->key = s->session_key;
	j->n_full = n_full;
	j->sval_len = rs_len(s->n_tokens, n_full, partial_len);
	p = j->sval;
	memset(p, 0, RS_HDR);
	memcpy(p, RS_MAGIC, 8);
	kvt_put_le32(p + 8, RS_VERSION);
	kvt_put_le32(p + 12, s->tenant);
	memcpy(p + 16, r->ns.id, 16);
	kvt_put_le64(p + 32, s->session_key);
	kvt_put_le64(p + 40, r->ns.layout_fp);
	kvt_put_le64(p + 48, s->n_tokens);
	kvt_put_le32(p + 56, n_full);
	kvt_put_le32(p + 60, tpb);
	kvt_put_le64(p + 64, partial_len);
	memcpy(p + RS_HDR, s->tokens, 4 * s->n_tokens);
	for (uint32_t i = 0; i < s->n_blocks && !rc; i++) {
		const struct kvt_block *b = kvt_blk(e, s->blocks[i]);

		if (i < n_full) {
			if (!b->hashed) {
				rc = kvt_err(-EINVAL, "kvt_seq_publish_remote: block %u has no "
					     "prefix key", i);
				break;
			}
			memcpy(j->hashes[i], b->hash, 16);
			memcpy(p + RS_HDR + 4 * s->n_tokens + 16ull * i, b->hash, 16);
			rc = copy_block(e, b, i, j->data + (uint64_t)i * e->block_bytes);
		} else {
			rc = copy_block(e, b, i, p + RS_HDR + 4 * s->n_tokens + 16ull * n_full);
		}
	}
	if (rc)
		goto out;
	kvt_put_le64(p + j->sval_len - 8, XXH3_64bits(p, j->sval_len - 8));
out:
	kvt_unlock(e);
	if (rc) {
		job_free(j);
		return rc;
	}
	queue_job(r, j);
	return 0;
}

/* Block @i of restored sequence @sid: its prefix key (computed by the append from the tokens
 * and the caller's salt and extra key) must be @want, the published one. 0 or -EINVAL. */
static int
restore_check_hash(struct kvt_engine *e, kvt_seq_id sid, uint32_t i, const uint8_t *want,
		   uint64_t key)
{
	struct kvt_seqrec *s;
	int rc = 0;

	kvt_lock(e);
	s = kvt_seq_lookup(e, sid, NULL);
	if (s && i < s->n_blocks) {
		const struct kvt_block *b = kvt_blk(e, s->blocks[i]);

		if (!b->hashed || memcmp(b->hash, want, 16))
			rc = kvt_err(-EINVAL, "session %#llx: block %u's prefix key differs from the "
				     "published one (another salt or extra_key)",
				     (unsigned long long)key, i);
	}
	kvt_unlock(e);
	return rc;
}

int
kvt_seq_restore_remote(struct kvt_engine *e, uint64_t key, const struct kvt_seq_opts *o,
		       kvt_seq_id *out)
{
	struct kvt_seq_opts opts;
	struct kvt_geometry g;
	struct kvt_reng *r;
	struct rjob *j;
	void *stream = NULL;
	kvt_seq_id sid = 0;
	int64_t *map = NULL;
	int rc;

	if (!e || !out)
		return kvt_err(-EINVAL, "kvt_seq_restore_remote: engine and out must not be NULL");
	*out = 0;
	if (!(r = e->remote))
		return kvt_err(-ENODEV, "kvt_seq_restore_remote: the engine has no REMOTE tier "
			       "(opts.remote_host)");
	if (!key)
		return kvt_err(-EINVAL, "kvt_seq_restore_remote: session key 0 is no session");
	rc = kvt_seq_opts_copy(&opts, o);
	if (rc)
		return rc;
	opts.session_key = key;
	j = calloc(1, sizeof *j);
	if (!j)
		return kvt_err(-ENOMEM, "kvt_seq_restore_remote");
	j->kind = RJ_RESTORE;
	j->tenant = opts.tenant;
	j->key = key;
	queue_job(r, j);
	pthread_mutex_lock(&r->mu);
	while (!j->done)
		pthread_cond_wait(&r->done_cv, &r->mu);
	pthread_mutex_unlock(&r->mu);
	rc = j->rc;
	if (rc) /* the worker's message, in this thread */
		kvt_err(rc, "%s", strchr(j->msg, ':') ? strchr(j->msg, ':') + 2 : j->msg);
	if (rc == 0) {
		uint32_t most;

		kvt_lock(e);
		most = kvt_seq_max_blocks(e);
		kvt_unlock(e);
		if (j->n_tokens / r->tpb + !!(j->n_tokens % r->tpb) > most)
			rc = kvt_err(KVT_ETOOBIG, "session %#llx has more blocks than one sequence "
				     "may hold in this engine (%u)", (unsigned long long)key, most);
	}
	/* a stream of this call's own: the engine's (publish) is used under the lock */
	if (rc == 0)
		rc = kvt_engine_stream_create(e, &stream);
	if (rc == 0 && !(map = malloc(sizeof *map * r->tpb)))
		rc = kvt_err(-ENOMEM, "kvt_seq_restore_remote: slot mapping");
	if (rc == 0)
		rc = kvt_seq_open(e, &opts, &sid);
	if (rc == 0)
		rc = kvt_engine_geometry(e, &g);
	for (uint64_t at = 0; rc == 0 && at < j->n_tokens; at += r->tpb) {
		uint64_t n = j->n_tokens - at < r->tpb ? j->n_tokens - at : r->tpb;
		uint64_t bi = at / r->tpb;
		const void *src = bi < j->n_full ? j->data + bi * r->block_bytes : j->partial;

		rc = kvt_seq_append(e, sid, j->tokens + at, (size_t)n, map);
		/* a full block's key, recomputed from the tokens, must be the published one before
		 * anything makes it shareable (the next append seals it) */
		if (rc == 0 && bi < j->n_full)
			rc = restore_check_hash(e, sid, (uint32_t)bi, j->hashes[bi], key);
		if (rc == 0)
			rc = kvt_engine_stream_memcpy_async(
				e, stream,
				(char *)g.hbm_base + (uint64_t)(map[0] / r->tpb) * r->block_bytes,
				src, r->block_bytes);
		if (rc == 0)
			rc = kvt_engine_stream_sync(e, stream);
	}
	kvt_lock(e);
	if (rc == 0)
		e->st.remote_restores++;
	else if (rc == -ENOENT)
		e->st.remote_restore_misses++;
	kvt_unlock(e);
	if (rc && sid) {
		char keep[512];

		snprintf(keep, sizeof keep, "%s", kvt_last_error_message());
		(void)kvt_seq_close(e, sid);
		kvt_err(rc, "%s", strchr(keep, ':') ? strchr(keep, ':') + 2 : keep);
		sid = 0;
	}
	if (stream)
		kvt_engine_stream_destroy(e, stream);
	free(map);
	job_free(j);
	*out = sid;
	return rc;
}

int
kvt_seq_tokens(struct kvt_engine *e, kvt_seq_id id, uint64_t first, int32_t *out, size_t n)
{
	struct kvt_seqrec *s;
	int rc = 0;

	if (!e || (!out && n))
		return kvt_err(-EINVAL, "kvt_seq_tokens: engine and out must not be NULL");
	if (e->grp)
		return kvt_grp_seq_tokens(e, id, first, out, n);
	kvt_lock(e);
	s = kvt_seq_lookup(e, id, NULL);
	if (!s)
		rc = kvt_err(KVT_ECLOSED, "kvt_seq_tokens: sequence %#llx is not open",
			     (unsigned long long)id);
	else if (first > s->n_tokens || n > s->n_tokens - first)
		rc = kvt_err(-EINVAL, "kvt_seq_tokens: tokens [%llu, +%zu) past the sequence's %llu",
			     (unsigned long long)first, n, (unsigned long long)s->n_tokens);
	else if (n)
		memcpy(out, s->tokens + first, n * sizeof *out);
	kvt_unlock(e);
	return rc;
}
