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

enum { RJ_PUBLISH = 0, RJ_RESTORE = 1, RJ_WT = 2, RJ_FETCH = 3 };

#define RF_MAX 256u          /* blocks of one remote prefix lookup (one pipelined get) */
#define RW_QUEUED_MAX 1024u  /* write-through blocks queued at most (their snapshots' memory) */

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
	/* write-through (RJ_WT) and remote prefix fetches (RJ_FETCH): n_full blocks, hashes[] */
	uint8_t **bufs;     /* WT: [RS_BATCH] snapshots of the blocks' bytes */
	uint32_t *ids;      /* FETCH: [n_full] the block records (INFLIGHT HOST copies) */
	void **dst;         /* FETCH: [n_full] their HOST slots' bytes (the worker writes them) */
	int32_t *ftokens;   /* FETCH: [n_full * tpb] the blocks' tokens (their index entries) */
	int *res;           /* WT, FETCH: [n_full] per-block results */
	int lead;           /* FETCH: the leading run of verified blocks */
	bool ext;           /* FETCH: blocks of the external pool (engine/ext.c lands them) */
	uint64_t used;      /* WT: bytes of a snapshot that are the block's (the rest zeroed) */
	struct rjob *fnext; /* FETCH: list of fetches in flight (under the engine lock) */
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
	/* engine side, under the engine lock */
	struct rjob *wt_fill; /* write-through job being filled (kvt_reng_sealed) */
	uint32_t wt_queued; /* write-through blocks queued or running */
	struct rjob *fetching; /* fetches queued or running (their blocks are INFLIGHT) */
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
	if (j->bufs)
		for (uint32_t i = 0; i < j->n_full; i++)
			free(j->bufs[i]);
	free(j->bufs);
	free(j->ids);
	free(j->dst);
	free(j->ftokens);
	free(j->res);
	free(j->data);
	free(j->sval);
	if (j->kind != RJ_RESTORE)
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

/* Write-through: put the job's blocks (SET NX: first writer wins), one pipelined round. */
static int
run_wt(struct kvt_reng *r, struct rjob *j)
{
	int rc = kvt_remote_put_blocks(r->cli, &r->ns, j->tenant,
				       (const uint8_t(*)[16])j->hashes,
				       (const void *const *)j->bufs, j->n_full, j->res);

	if (rc < 0)
		for (uint32_t i = 0; i < j->n_full; i++)
			j->res[i] = rc;
	return rc < 0 ? rc : 0;
}

/* Remote prefix fetch: one pipelined get of every block straight into its HOST slot (each
 * value verified before it counts; the longest verified prefix wins). */
static int
run_fetch(struct kvt_reng *r, struct rjob *j)
{
	int rc = kvt_remote_get_blocks(r->cli, &r->ns, j->tenant,
				       (const uint8_t(*)[16])j->hashes, j->dst, j->n_full, j->res);

	j->lead = rc > 0 ? rc : 0;
	if (rc < 0)
		for (uint32_t i = 0; i < j->n_full; i++)
			j->res[i] = rc;
	return rc < 0 ? rc : 0;
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
		j->rc = j->kind == RJ_PUBLISH ? run_publish(r, j) :
			j->kind == RJ_RESTORE ? run_restore(r, j) :
			j->kind == RJ_WT ? run_wt(r, j) : run_fetch(r, j);
		if (j->rc)
			snprintf(j->msg, sizeof j->msg, "%s", kvt_last_error_message());
		pthread_mutex_lock(&r->mu);
		kvt_remote_stats(r->cli, &r->cs);
		r->breaker_open = kvt_remote_breaker_open(r->cli, NULL, 0);
		if (j->kind != RJ_RESTORE) {
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
	if (j->kind != RJ_RESTORE)
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
	kvt_remote_stats(r->cli, &r->cs); /* what open did (CLUSTER SLOTS) counts from here */
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

/* A finished write-through: counters; a failed put clears the key's REMOTE bit (a later
 * offer of the block tries again). */
static void
reap_wt(struct kvt_engine *e, struct rjob *j)
{
	struct kvt_reng *r = e->remote;

	for (uint32_t i = 0; i < j->n_full; i++) {
		if (j->res[i] >= 0) {
			e->st.remote_wt_stored++;
		} else {
			uint64_t k[2];

			memcpy(k, j->hashes[i], 16);
			e->st.remote_wt_failed++;
			kvt_key_mark(e, k, j->tenant, 0, KVT_KEY_RBIT);
		}
	}
	if (j->rc)
		kvt_engine_log(e, KVT_LOG_WARN, "write-through of %u blocks to the REMOTE tier "
			       "failed: %s", j->n_full, j->msg);
	r->wt_queued -= j->n_full;
}

/* A finished fetch: the leading run of verified blocks become cached prefix blocks (HOST copy
 * PRESENT, in the index with their own tokens); the rest are freed (a miss: recomputed). */
static void
reap_fetch(struct kvt_engine *e, struct rjob *j)
{
	struct kvt_reng *r = e->remote;
	uint32_t tpb = r->tpb;

	for (struct rjob **pp = &r->fetching; *pp; pp = &(*pp)->fnext)
		if (*pp == j) {
			*pp = j->fnext;
			break;
		}
	for (uint32_t i = 0; i < j->n_full; i++) {
		uint32_t id = j->ids[i];
		struct kvt_block *b = kvt_blk(e, id);
		uint64_t k[2];

		memcpy(k, j->hashes[i], 16);
		b->busy = 0;
		if (j->ext) {
			/* the external pool's: it lands them (landed, found by kvt_ext_lookup) or
			 * frees them (a miss: absent, unverifiable, after the verified run, or
			 * redundant: its hash was stored or dropped meanwhile) */
			bool ok = (int)i < j->lead && j->res[i] == 1 && kvt_ext_fetching(e, id);

			if (ok) {
				kvt_copy_set_present(e, id, KVT_TIER_HOST);
				kvt_key_mark(e, k, j->tenant, KVT_KEY_RBIT, 0);
				e->st.remote_hit_blocks++;
			} else {
				e->st.remote_miss_blocks++;
				if ((int)i == j->lead && j->res[i] == 0)
					kvt_wb_miss(e, KVT_WB_REMOTE, k, j->tenant);
				kvt_copy_fail(e, id, KVT_TIER_HOST);
			}
			kvt_ext_fetched(e, id, ok, (int)i == j->lead);
			continue;
		}
		if ((int)i < j->lead && j->res[i] == 1) {
			kvt_copy_set_present(e, id, KVT_TIER_HOST);
			kvt_key_mark(e, k, j->tenant, KVT_KEY_RBIT, 0);
			/* the same key indexed meanwhile (sealed here, or another fetch): ours goes */
			if (kvt_prefix_insert_owned(e, id, j->ftokens + (uint64_t)i * tpb,
						    j->tenant) == 0) {
				e->st.remote_hit_blocks++;
				continue;
			}
			e->st.remote_miss_blocks++;
			kvt_block_uncache(e, id);
			continue;
		}
		e->st.remote_miss_blocks++;
		/* the block that ended the verified prefix (those after it are unreachable
		 * anyway): a hit lost when the budget refused its write here */
		if ((int)i == j->lead && j->res[i] == 0)
			kvt_wb_miss(e, KVT_WB_REMOTE, k, j->tenant);
		kvt_copy_fail(e, id, KVT_TIER_HOST);
		kvt_block_uncache(e, id);
	}
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
	e->st.remote_bad_values = r->cs.bad_values;
	e->st.remote_round_trips = r->cs.round_trips;
	pthread_mutex_unlock(&r->mu);
	while (list) {
		struct rjob *j = list;

		list = j->next;
		if (j->kind == RJ_WT) {
			reap_wt(e, j);
		} else if (j->kind == RJ_FETCH) {
			reap_fetch(e, j);
		} else if (j->rc == 0) {
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
	job_free(r->wt_fill);
	r->wt_fill = NULL;
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
	if (kvt_seq_live_in(e, s, 0, s->n_blocks) != s->n_blocks) {
		/* the REMOTE format stores every block: a windowed sequence has dropped some */
		rc = kvt_err(-ENOTSUP, "kvt_seq_publish_remote: the sequence dropped %u blocks out "
			     "of its sliding window; a windowed engine cannot publish it remotely",
			     s->n_blocks - kvt_seq_live_in(e, s, 0, s->n_blocks));
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
	if (s->n_tokens) /* an empty sequence has no tokens array */
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
	if (s && i < s->n_blocks && s->blocks[i] != KVT_NIL) { /* NIL: out of the window */
		const struct kvt_block *b = kvt_blk(e, s->blocks[i]);

		if (!b->hashed || memcmp(b->hash, want, 16)) {
			rc = kvt_err(-EINVAL, "session %#llx: block %u's prefix key differs from the "
				     "published one (another salt or extra_key)",
				     (unsigned long long)key, i);
		} else {
			uint64_t k[2];

			/* read from REMOTE: its REMOTE bit, so write-through does not put it back */
			memcpy(k, want, 16);
			kvt_key_mark(e, k, s->tenant, KVT_KEY_RBIT, 0);
		}
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

/* ---- write-through (issue 18 item 1) ------------------------------------------------------- */

/* The tenant of block @id: its index entry's, or its creator sequence's. */
static bool
blk_tenant(struct kvt_engine *e, uint32_t id, uint32_t *tenant)
{
	const struct kvt_block *b = kvt_blk(e, id);

	if (kvt_prefix_tenant(e, id, tenant))
		return true;
	if (b->seq < e->cap_seqs && e->seqs[b->seq].open) {
		*tenant = e->seqs[b->seq].tenant;
		return true;
	}
	return false;
}

void
kvt_reng_kick(struct kvt_engine *e)
{
	struct kvt_reng *r = e->remote;
	struct rjob *j;

	if (!r || !(j = r->wt_fill))
		return;
	r->wt_fill = NULL;
	if (!j->n_full) {
		job_free(j);
		return;
	}
	queue_job(r, j);
}

/*
 * Offer block @b (key @k of @tenant) for write-through: per opts.remote_write (the REMOTE bit
 * and the reuse evidence of its key), the write budget and the worker's backlog, its bytes are
 * snapshotted (the first @used, the rest of block_bytes zeroed: a HOST slot's tail may hold
 * an older block's bytes) into the pending job.
 */
static void
wt_offer(struct kvt_engine *e, const struct kvt_block *b, uint32_t tenant, const uint64_t k[2],
	 uint64_t used, bool evidence)
{
	struct kvt_reng *r = e->remote;
	uint32_t flags;
	struct rjob *j;
	uint8_t *buf;

	if (evidence)
		kvt_key_mark(e, k, tenant, KVT_KEY_EVID, 0);
	flags = kvt_key_flags(e, k, tenant);
	if (flags & KVT_KEY_RBIT)
		return; /* put already (or seen there) */
	if (e->opts.remote_write != KVT_REMOTE_WRITE_ALL && !(flags & KVT_KEY_EVID))
		return;
	if (kvt_copy_state(b, KVT_TIER_HBM) != KVT_COPY_PRESENT &&
	    kvt_copy_state(b, KVT_TIER_HOST) != KVT_COPY_PRESENT)
		return; /* only on NVMe or in flight: a later offer may find it */
	if (r->wt_queued >= RW_QUEUED_MAX)
		return; /* the worker is behind (slow server): skip, never wait */
	if (r->wt_fill && (r->wt_fill->tenant != tenant || r->wt_fill->n_full == RS_BATCH))
		kvt_reng_kick(e);
	if (!kvt_wb_admit(e, KVT_WB_REMOTE, e->block_bytes + KVT_RV_HDR_BYTES,
			  (flags & KVT_KEY_EVID) != 0, false, k, tenant))
		return;
	if (!(j = r->wt_fill)) {
		j = calloc(1, sizeof *j);
		if (!j || !(j->bufs = calloc(RS_BATCH, sizeof *j->bufs)) ||
		    !(j->hashes = malloc(16ull * RS_BATCH)) ||
		    !(j->res = calloc(RS_BATCH, sizeof *j->res))) {
			job_free(j);
			return; /* -ENOMEM only costs the write-through */
		}
		j->kind = RJ_WT;
		j->tenant = tenant;
		r->wt_fill = j;
	}
	if (!(buf = malloc(e->block_bytes)))
		return;
	if (copy_block(e, b, b->index, buf)) {
		free(buf);
		return;
	}
	if (used < e->block_bytes)
		memset(buf + used, 0, e->block_bytes - used);
	memcpy(j->hashes[j->n_full], k, 16);
	j->bufs[j->n_full++] = buf;
	r->wt_queued++;
	kvt_key_mark(e, k, tenant, KVT_KEY_RBIT, 0);
	e->st.remote_wt_queued++;
}

void
kvt_reng_sealed(struct kvt_engine *e, uint32_t id, bool evidence)
{
	struct kvt_reng *r = e->remote;
	const struct kvt_block *b = kvt_blk(e, id);
	uint32_t tenant;
	uint64_t k[2];

	if (!r || !b->hashed || !b->live || b->dead || b->lost ||
	    e->opts.remote_write == KVT_REMOTE_WRITE_NONE || !blk_tenant(e, id, &tenant))
		return;
	kvt_blk_key(b, k);
	wt_offer(e, b, tenant, k, e->block_bytes, evidence);
}

void
kvt_reng_ext_offer(struct kvt_engine *e, uint32_t id, uint32_t tenant, const uint64_t k[2],
		   uint64_t used, bool evidence)
{
	const struct kvt_block *b = kvt_blk(e, id);

	if (!e->remote || !b->live || b->dead || b->lost ||
	    e->opts.remote_write == KVT_REMOTE_WRITE_NONE)
		return;
	wt_offer(e, b, tenant, k, used, evidence);
}

/* ---- remote prefix hits (issue 18 item 2) -------------------------------------------------- */

bool
kvt_reng_fetching(const struct kvt_engine *e, uint32_t id)
{
	const struct kvt_reng *r = e->remote;

	for (const struct rjob *j = r ? r->fetching : NULL; j; j = j->fnext)
		for (uint32_t i = 0; i < j->n_full; i++)
			if (j->ids[i] == id)
				return true;
	return false;
}

/* Is key @k of @tenant being fetched? */
static bool
key_fetching(const struct kvt_reng *r, const uint64_t k[2], uint32_t tenant)
{
	for (const struct rjob *j = r->fetching; j; j = j->fnext)
		if (j->tenant == tenant)
			for (uint32_t i = 0; i < j->n_full; i++)
				if (!memcmp(j->hashes[i], k, 16))
					return true;
	return false;
}

/* The prefix key of block @k of @tokens (the chain from block 0). */
static void
chain_key(const int32_t *tokens, uint32_t tpb, const uint64_t salt[2], uint32_t k,
	  uint64_t h[2])
{
	h[0] = h[1] = 0;
	for (uint32_t j = 0; j <= k; j++)
		kvt_prefix_hash(h, tokens + (uint64_t)j * tpb, tpb, salt, h);
}

void
kvt_reng_note_late(struct kvt_engine *e, const int32_t *tokens, uint64_t n,
		   const uint64_t salt[2], uint32_t tenant, uint32_t k)
{
	struct kvt_reng *r = e->remote;
	uint64_t h[2];

	if (!r || !r->fetching || (uint64_t)(k + 1) * r->tpb > n)
		return;
	chain_key(tokens, r->tpb, salt, k, h);
	if (key_fetching(r, h, tenant))
		e->st.remote_late_blocks++;
}

/* A fetch job of up to @n blocks of @tenant (with @tpb tokens each for the prefix index; 0:
 * the external pool's), or NULL (-ENOMEM). */
static struct rjob *
fetch_job_new(uint32_t n, uint32_t tpb, uint32_t tenant)
{
	struct rjob *j = calloc(1, sizeof *j);

	if (!j || !(j->hashes = malloc(16ull * n)) || !(j->ids = malloc(sizeof *j->ids * n)) ||
	    !(j->dst = malloc(sizeof *j->dst * n)) || !(j->res = calloc(n, sizeof *j->res)) ||
	    (tpb && !(j->ftokens = malloc(sizeof *j->ftokens * (uint64_t)n * tpb)))) {
		job_free(j);
		return NULL;
	}
	j->kind = RJ_FETCH;
	j->tenant = tenant;
	return j;
}

/* Fetch job @j of its first @n blocks: in the list of fetches in flight, to the worker. */
static void
fetch_queue(struct kvt_engine *e, struct rjob *j, uint32_t n)
{
	struct kvt_reng *r = e->remote;

	j->n_full = n;
	j->fnext = r->fetching;
	r->fetching = j;
	e->st.remote_lookups++;
	e->st.remote_lookup_blocks += n;
	queue_job(r, j);
}

bool
kvt_reng_can_fetch(const struct kvt_engine *e)
{
	return e->remote && !e->opts.remote_no_fetch && e->slots[KVT_TIER_HOST].n_slots;
}

int
kvt_reng_ext_fetch(struct kvt_engine *e, uint32_t tenant, const uint64_t (*keys)[2],
		   const uint32_t *ids, uint32_t n)
{
	struct kvt_reng *r = e->remote;
	struct rjob *j;

	if (!r || !n || n > RF_MAX)
		return kvt_err(-EINVAL, "remote fetch of %u external blocks", n);
	j = fetch_job_new(n, 0, tenant);
	if (!j)
		return kvt_err(-ENOMEM, "remote fetch of %u external blocks", n);
	j->ext = true;
	for (uint32_t m = 0; m < n; m++) {
		const struct kvt_block *b = kvt_blk(e, ids[m]);

		j->ids[m] = ids[m];
		j->dst[m] = kvt_slot_addr(e, KVT_TIER_HOST, b->slot[KVT_TIER_HOST]);
		memcpy(j->hashes[m], keys[m], 16);
	}
	fetch_queue(e, j, n);
	return 0;
}

uint32_t
kvt_reng_lookup(struct kvt_engine *e, const int32_t *tokens, uint64_t n, const uint64_t salt[2],
		uint32_t tenant, uint32_t k, uint32_t max)
{
	struct kvt_reng *r = e->remote;
	uint32_t tpb, want, m = 0;
	struct rjob *j = NULL;
	uint64_t h[2];

	if (!r || e->opts.remote_no_fetch || !e->slots[KVT_TIER_HOST].n_slots || k >= max)
		return 0;
	tpb = r->tpb;
	want = max - k < RF_MAX ? max - k : RF_MAX;
	if ((uint64_t)(k + want) * tpb > n)
		want = (uint32_t)(n / tpb) - k;
	if (!want)
		return 0;
	if (k)
		chain_key(tokens, tpb, salt, k - 1, h);
	else
		h[0] = h[1] = 0;
	kvt_prefix_hash(h, tokens + (uint64_t)k * tpb, tpb, salt, h);
	if (key_fetching(r, h, tenant))
		return 0; /* announced already: in flight */
	/* room in HOST without waiting and without losing anything for a guess (the blocks may
	 * not be there): free slots and clean copies (valid in another tier) only, never a cached
	 * block's last copy; what is free then bounds the lookup */
	want = kvt_room_clean(e, KVT_TIER_HOST, want, NULL, NULL);
	if (!want)
		return 0;
	j = fetch_job_new(want, tpb, tenant);
	if (!j)
		return 0;
	for (m = 0; m < want; m++) {
		uint32_t at = k + m, id, slot;
		struct kvt_block *b;

		if (m)
			kvt_prefix_hash(h, tokens + (uint64_t)at * tpb, tpb, salt, h);
		if (kvt_prefix_key_block(e, h) != KVT_NIL)
			break; /* indexed here (another tenant, other tokens, unusable): stop */
		if (kvt_block_new(e, KVT_NIL, at, &id))
			break;
		b = kvt_blk(e, id);
		b->refs = 0; /* cached once it lands; nobody holds it */
		b->tslot = kvt_tenant_slot(e, tenant);
		kvt_blk_set_key(b, h);
		b->hashed = 1;
		b->written = 1;
		if (kvt_slot_alloc(e, KVT_TIER_HOST, id, &slot)) {
			b->dead = 1;
			kvt_block_try_free(e, id);
			break;
		}
		b->slot[KVT_TIER_HOST] = slot;
		kvt_copy_state_set(b, KVT_TIER_HOST, KVT_COPY_INFLIGHT);
		b->busy = 1; /* the worker writes the slot: nothing frees or reuses it */
		j->ids[m] = id;
		j->dst[m] = kvt_slot_addr(e, KVT_TIER_HOST, slot);
		memcpy(j->hashes[m], h, 16);
		memcpy(j->ftokens + (uint64_t)m * tpb, tokens + (uint64_t)at * tpb,
		       (size_t)tpb * sizeof *tokens);
	}
	if (!m) {
		job_free(j);
		return 0;
	}
	fetch_queue(e, j, m);
	return m;
}
