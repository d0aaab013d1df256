/* SPDX-License-Identifier: MIT */
/*
 * tiers/remote.c - the Redis client of the REMOTE tier (see remote.h): connections with
 * bounded timeouts, the circuit breaker of each server, and batches as pipelined rounds.
 *
 * Writes bypass hiredis's output buffer: every command is framed here and written with one
 * sendmsg(MSG_NOSIGNAL) from the caller's buffers (a 2 MiB value is not copied into an sds that
 * grows by 1 MiB steps, and a closed socket gives EPIPE, never SIGPIPE). hiredis's output
 * buffer stays empty, so redisGetReply() only reads: hiredis parses every reply.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "tiers/base/clock.h"
#include "tiers/base/error.h"
#include "tiers/remote_int.h"

#define RMT_PENDING INT_MIN    /* res[] of a key not answered yet */
#define RMT_MAX_BATCH 65536u   /* keys per call */
#define RMT_MAX_ARGS 8         /* arguments of one command */
#define RMT_MAX_DEL 4096u      /* pending best-effort deletes kept per server */

/* One argument of a command: up to two pieces sent back to back. */
struct rmt_arg {
	const void *p[2]; /* pieces */
	size_t n[2];      /* their bytes */
};

enum rmt_op { RMT_GET, RMT_SET, RMT_EXISTS, RMT_DEL };

/* A batch in flight: the caller's arrays and the routing state of each key. */
struct rmt_batch {
	enum rmt_op op;                   /* the command of every key */
	const char *const *keys;          /* n keys */
	const size_t *lens;               /* their lengths */
	const struct kvt_remote_val *vals; /* RMT_SET: the values */
	uint32_t n;                       /* keys */
	int *res;                         /* n results */
	kvt_remote_take_fn take;          /* RMT_GET: consumer */
	void *arg;                        /* its argument */
	uint16_t *target;                 /* per key: node of its next send (RMT_NO_NODE: route) */
	uint8_t *asking;                  /* per key: ASK redirect, send ASKING first */
	uint8_t *again;                   /* per key: goes out in the next round */
};

/* ---- sending ------------------------------------------------------------------------------- */

/* The code of a failed socket call (errno @e): a timeout (SO_SNDTIMEO/SO_RCVTIMEO) is
 * -ETIMEDOUT. */
static int
rmt_sock_code(struct kvt_remote *r, int e)
{
	if (e == EAGAIN || e == EWOULDBLOCK || e == ETIMEDOUT) {
		r->st.timeouts++;
		return -ETIMEDOUT;
	}
	return e > 0 ? -e : -EIO;
}

/* Frame and write one command (RESP array of bulk strings). Returns 0 or a negative code with a
 * message; the connection is unusable after a failure. */
static int
rmt_send(struct kvt_remote *r, struct rmt_node *nd, int argc, const struct rmt_arg *a)
{
	char frame[32 * (RMT_MAX_ARGS + 1)];
	struct iovec iov[3 * RMT_MAX_ARGS + 1];
	size_t off = 0, total = 0;
	int niov = 0, idx = 0;

	for (int i = 0; i < argc; i++) {
		size_t len = a[i].n[0] + a[i].n[1];
		int w = i ? snprintf(frame + off, sizeof frame - off, "\r\n$%zu\r\n", len)
			  : snprintf(frame + off, sizeof frame - off, "*%d\r\n$%zu\r\n", argc, len);

		iov[niov++] = (struct iovec){ frame + off, (size_t)w };
		off += (size_t)w;
		for (int k = 0; k < 2; k++)
			if (a[i].n[k])
				iov[niov++] = (struct iovec){ (void *)a[i].p[k], a[i].n[k] };
	}
	memcpy(frame + off, "\r\n", 2);
	iov[niov++] = (struct iovec){ frame + off, 2 };
	for (int i = 0; i < niov; i++)
		total += iov[i].iov_len;
	while (idx < niov) {
		struct msghdr m = { .msg_iov = iov + idx, .msg_iovlen = (size_t)(niov - idx) };
		ssize_t w = sendmsg(nd->c->fd, &m, MSG_NOSIGNAL);

		if (w < 0) {
			int e = errno;

			if (e == EINTR)
				continue;
			return kvt_err(rmt_sock_code(r, e), "remote %s:%u: write: %s", nd->host,
				       nd->port, e == EAGAIN ? "timed out" : strerror(e));
		}
		while (w > 0 && idx < niov) {
			if ((size_t)w >= iov[idx].iov_len) {
				w -= (ssize_t)iov[idx].iov_len;
				idx++;
			} else {
				iov[idx].iov_base = (char *)iov[idx].iov_base + w;
				iov[idx].iov_len -= (size_t)w;
				w = 0;
			}
		}
	}
	r->st.bytes_out += total;
	r->st.commands++;
	return 0;
}

/* Read one reply. Returns 0 and *out (never NULL), or a negative code with a message. */
static int
rmt_read(struct kvt_remote *r, struct rmt_node *nd, redisReply **out)
{
	void *rep = NULL;
	int code;

	errno = 0;
	if (redisGetReply(nd->c, &rep) == REDIS_OK && rep) {
		*out = rep;
		return 0;
	}
	switch (nd->c->err) {
	case REDIS_ERR_IO:
		code = rmt_sock_code(r, errno ? errno : EIO);
		break;
	case REDIS_ERR_EOF:
		code = -ECONNRESET;
		break;
	case REDIS_ERR_OOM:
		code = -ENOMEM;
		break;
	default:
		code = -EPROTO;
	}
	return kvt_err(code, "remote %s:%u: reading a reply: %s", nd->host, nd->port,
		       code == -ETIMEDOUT ? "no reply within op_timeout_ms" : nd->c->errstr);
}

/* ---- servers and their breakers ------------------------------------------------------------ */

int
rmt_node_add(struct kvt_remote *r, const char *host, size_t host_len, uint16_t port)
{
	struct rmt_node *nd;

	for (uint32_t i = 0; i < r->n_nodes; i++)
		if (r->nodes[i]->port == port && strlen(r->nodes[i]->host) == host_len &&
		    !memcmp(r->nodes[i]->host, host, host_len))
			return (int)i;
	if (host_len == 0 || host_len >= RMT_HOST_MAX || memchr(host, '\0', host_len))
		return kvt_err(-EPROTO, "remote: bad server name (%zu bytes)", host_len);
	if (r->n_nodes == RMT_MAX_NODES)
		return kvt_err(-ENOSPC, "remote: more than %u servers", RMT_MAX_NODES);
	if (r->n_nodes == r->cap_nodes) {
		uint32_t cap = r->cap_nodes ? r->cap_nodes * 2 : 4;
		struct rmt_node **n = realloc(r->nodes, cap * sizeof *n);

		if (!n)
			return kvt_err(-ENOMEM, "remote: no memory for a server");
		r->nodes = n;
		r->cap_nodes = cap;
	}
	nd = calloc(1, sizeof *nd);
	if (!nd)
		return kvt_err(-ENOMEM, "remote: no memory for a server");
	r->nodes[r->n_nodes] = nd;
	memcpy(nd->host, host, host_len);
	nd->port = port;
	nd->backoff_ms = r->o.breaker_backoff_ms;
	return (int)r->n_nodes++;
}

void
rmt_node_fail(struct kvt_remote *r, struct rmt_node *nd)
{
	uint64_t now = kvt_now_ns();

	if (nd->c) {
		redisFree(nd->c);
		nd->c = NULL;
	}
	r->st.errors++;
	if (nd->open_until) { /* a failed trial: open again, for twice as long */
		uint64_t b = (uint64_t)nd->backoff_ms * 2;

		nd->backoff_ms = (uint32_t)(b < r->o.breaker_backoff_max_ms ?
					    b : r->o.breaker_backoff_max_ms);
		nd->open_until = now + (uint64_t)nd->backoff_ms * 1000000u;
		r->st.breaker_trips++;
	} else if (++nd->fails >= r->o.breaker_failures) {
		nd->open_until = now + (uint64_t)nd->backoff_ms * 1000000u;
		r->st.breaker_trips++;
	}
}

/* Is @nd's breaker open now (calls fail fast)? Past its period it is half-open: the next
 * rmt_node_ready() is the trial. */
static bool
rmt_node_blocked(const struct rmt_node *nd)
{
	return nd->open_until && kvt_now_ns() < nd->open_until;
}

static void
rmt_tv(struct timeval *tv, uint32_t ms)
{
	tv->tv_sec = ms / 1000;
	tv->tv_usec = (long)(ms % 1000) * 1000;
}

/* One command on a fresh connection (AUTH, PING): the reply must not be an error. */
static int
rmt_hello_cmd(struct kvt_remote *r, struct rmt_node *nd, int argc, const struct rmt_arg *a,
	      const char *what)
{
	redisReply *rep;
	int rc = rmt_send(r, nd, argc, a);

	if (rc == 0)
		rc = rmt_read(r, nd, &rep);
	if (rc)
		return rc;
	if (rep->type == REDIS_REPLY_ERROR) {
		bool auth = !strncmp(rep->str, "WRONGPASS", 9) || !strncmp(rep->str, "NOAUTH", 6) ||
			    !strncmp(rep->str, "NOPERM", 6) || strstr(rep->str, "AUTH");

		rc = kvt_err(auth ? -EACCES : -EPROTO, "remote %s:%u: %s: %.*s", nd->host, nd->port,
			     what, (int)(rep->len < 200 ? rep->len : 200), rep->str);
	}
	freeReplyObject(rep);
	return rc;
}

/* Connect @nd if it is not (AUTH, PING, within connect_timeout_ms; then op_timeout_ms on the
 * socket). A failure counts on its breaker. Returns 0 or a negative code with a message. */
int
rmt_node_ready(struct kvt_remote *r, struct rmt_node *nd)
{
	struct timeval tv;
	bool trial = nd->open_until != 0;
	int rc = 0;

	if (nd->c)
		return 0;
	rmt_tv(&tv, r->o.connect_timeout_ms);
	errno = 0;
	nd->c = redisConnectWithTimeout(nd->host, nd->port, tv);
	if (!nd->c) {
		rc = kvt_err(-ENOMEM, "remote %s:%u: no memory for a connection", nd->host,
			     nd->port);
	} else if (nd->c->err) {
		int e = errno;

		rc = kvt_err(e == ETIMEDOUT || e == EINPROGRESS || e == EAGAIN ? -ETIMEDOUT :
			     e > 0 ? -e : -ECONNREFUSED, "remote %s:%u: connect: %s", nd->host,
			     nd->port, nd->c->errstr);
	} else if (redisSetTimeout(nd->c, tv) != REDIS_OK) {
		rc = kvt_err(-EIO, "remote %s:%u: setting socket timeouts: %s", nd->host, nd->port,
			     nd->c->errstr);
	}
	if (rc == 0 && r->password) {
		struct rmt_arg a[3] = { { { "AUTH" }, { 4 } } };
		int argc = 1;

		if (r->user) {
			a[argc++] = (struct rmt_arg){ { r->user }, { strlen(r->user) } };
		}
		a[argc++] = (struct rmt_arg){ { r->password }, { strlen(r->password) } };
		rc = rmt_hello_cmd(r, nd, argc, a, "AUTH");
	}
	if (rc == 0) {
		struct rmt_arg a[1] = { { { "PING" }, { 4 } } };

		rc = rmt_hello_cmd(r, nd, 1, a, "PING");
	}
	if (rc == 0) {
		rmt_tv(&tv, r->o.op_timeout_ms);
		if (redisSetTimeout(nd->c, tv) != REDIS_OK)
			rc = kvt_err(-EIO, "remote %s:%u: setting socket timeouts: %s", nd->host,
				     nd->port, nd->c->errstr);
	}
	if (rc) {
		rmt_node_fail(r, nd);
		return rc;
	}
	if (nd->connected_once)
		r->st.reconnects++;
	nd->connected_once = true;
	if (trial) { /* the breaker closes */
		nd->open_until = 0;
		nd->fails = 0;
		nd->backoff_ms = r->o.breaker_backoff_ms;
	}
	return 0;
}

int
rmt_command(struct kvt_remote *r, struct rmt_node *nd, int argc, const char **argv,
	    const size_t *lens, redisReply **out)
{
	struct rmt_arg a[RMT_MAX_ARGS];
	int rc;

	if (rmt_node_blocked(nd))
		return kvt_err(-EAGAIN, "remote %s:%u: circuit breaker open", nd->host, nd->port);
	rc = rmt_node_ready(r, nd);
	if (rc)
		return rc;
	for (int i = 0; i < argc && i < RMT_MAX_ARGS; i++)
		a[i] = (struct rmt_arg){ { argv[i] }, { lens[i] } };
	rc = rmt_send(r, nd, argc < RMT_MAX_ARGS ? argc : RMT_MAX_ARGS, a);
	if (rc == 0)
		rc = rmt_read(r, nd, out);
	if (rc)
		rmt_node_fail(r, nd);
	else
		r->st.round_trips++, r->st.node_rounds++;
	return rc;
}

/* ---- one round of a batch ------------------------------------------------------------------ */

static int
rmt_q_push(struct rmt_node *nd, uint32_t i)
{
	if (nd->nq == nd->capq) {
		uint32_t cap = nd->capq ? nd->capq * 2 : 64;
		uint32_t *q = realloc(nd->q, cap * sizeof *q);

		if (!q)
			return -ENOMEM;
		nd->q = q;
		nd->capq = cap;
	}
	nd->q[nd->nq++] = i;
	return 0;
}

/* Remember a bad value's key for a best-effort DEL on @nd's next round. */
static void
rmt_del_later(struct rmt_node *nd, const char *key, size_t len)
{
	char *k;

	if (nd->ndel == RMT_MAX_DEL)
		return; /* best effort: the value is refused anyway */
	if (nd->ndel == nd->capdel) {
		uint32_t cap = nd->capdel ? nd->capdel * 2 : 16;
		char **d = realloc(nd->del, cap * sizeof *d);
		size_t *dl = d ? realloc(nd->del_len, cap * sizeof *dl) : NULL;

		if (d)
			nd->del = d;
		if (!dl)
			return;
		nd->del_len = dl;
		nd->capdel = cap;
	}
	k = malloc(len ? len : 1);
	if (!k)
		return;
	memcpy(k, key, len);
	nd->del[nd->ndel] = k;
	nd->del_len[nd->ndel++] = len;
}

/* The node a key goes to now. Returns its index, or a negative code. */
static int
rmt_route(struct kvt_remote *r, const char *key, size_t len)
{
	uint16_t n;

	if (!r->cluster)
		return 0;
	n = r->slot_node[kvt_remote_key_slot(key, len)];
	return n == RMT_NO_NODE ? 0 : n; /* unassigned: the seed answers MOVED or an error */
}

/* The code of an error reply (not a redirect). */
static int
rmt_reply_err(struct kvt_remote *r, const struct rmt_node *nd, const redisReply *rep)
{
	int code = -EPROTO;

	if (!strncmp(rep->str, "OOM", 3))
		code = -ENOSPC;
	else if (!strncmp(rep->str, "TRYAGAIN", 8) || !strncmp(rep->str, "CLUSTERDOWN", 11) ||
		 !strncmp(rep->str, "LOADING", 7) || !strncmp(rep->str, "BUSY", 4))
		code = -EAGAIN;
	else if (!strncmp(rep->str, "NOAUTH", 6) || !strncmp(rep->str, "NOPERM", 6))
		code = -EACCES;
	r->st.reply_errors++;
	return kvt_err(code, "remote %s:%u: %.*s", nd->host, nd->port,
		       (int)(rep->len < 200 ? rep->len : 200), rep->str);
}

/* Handle the reply of key @i. Returns its result, or RMT_PENDING when it was redirected. */
static int
rmt_answer(struct kvt_remote *r, struct rmt_batch *b, struct rmt_node *nd, uint32_t i,
	   redisReply *rep)
{
	if (rep->type == REDIS_REPLY_ERROR && b->op == RMT_GET && rep->len >= 9 &&
	    !strncmp(rep->str, "WRONGTYPE", 9)) {
		/* a key of ours holding a list, hash...: not a value of ours, a miss */
		r->st.bad_values++;
		rmt_del_later(nd, b->keys[i], b->lens[i]);
		return 0;
	}
	if (rep->type == REDIS_REPLY_ERROR) {
		const char *host;
		size_t hl;
		uint16_t slot, port;
		bool ask;
		int idx;

		if (rmt_parse_redirect(rep->str, rep->len, &ask, &slot, &host, &hl, &port) ||
		    !r->cluster)
			return rmt_reply_err(r, nd, rep);
		idx = rmt_node_add(r, host, hl, port);
		if (idx < 0)
			return idx;
		if (ask) {
			r->st.asks++;
			b->target[i] = (uint16_t)idx;
			b->asking[i] = 1;
		} else {
			r->st.moved++;
			r->slot_node[slot] = (uint16_t)idx;
			r->map_stale = true;
			b->target[i] = RMT_NO_NODE;
			b->asking[i] = 0;
		}
		b->again[i] = 1;
		return RMT_PENDING;
	}
	if (rep->type == REDIS_REPLY_STRING || rep->type == REDIS_REPLY_STATUS)
		r->st.bytes_in += rep->len;
	switch (b->op) {
	case RMT_GET:
		if (rep->type == REDIS_REPLY_NIL)
			return 0;
		if (rep->type != REDIS_REPLY_STRING) /* not Redis's answer to a GET */
			break;
		if (b->take(b->arg, i, rep->str, rep->len) == 1)
			return 1;
		r->st.bad_values++;
		rmt_del_later(nd, b->keys[i], b->lens[i]);
		return 0;
	case RMT_SET:
		if (rep->type == REDIS_REPLY_NIL)
			return 0;
		if (rep->type == REDIS_REPLY_STATUS && rep->len == 2 && !memcmp(rep->str, "OK", 2))
			return 1;
		break;
	case RMT_EXISTS:
	case RMT_DEL:
		if (rep->type == REDIS_REPLY_INTEGER)
			return rep->integer > 0;
		break;
	}
	return kvt_err(-EPROTO, "remote %s:%u: unexpected reply type %d", nd->host, nd->port,
		       rep->type);
}

/* Send key @i's command (ASKING first when redirected by ASK). */
static int
rmt_send_key(struct kvt_remote *r, struct rmt_batch *b, struct rmt_node *nd, uint32_t i)
{
	static const char *const names[] = { "GET", "SET", "EXISTS", "DEL" };
	struct rmt_arg a[6];
	char ttl[24];
	int argc = 0, rc;

	if (b->asking[i]) {
		a[0] = (struct rmt_arg){ { "ASKING" }, { 6 } };
		rc = rmt_send(r, nd, 1, a);
		if (rc)
			return rc;
	}
	a[argc++] = (struct rmt_arg){ { names[b->op] }, { strlen(names[b->op]) } };
	a[argc++] = (struct rmt_arg){ { b->keys[i] }, { b->lens[i] } };
	if (b->op == RMT_SET) {
		const struct kvt_remote_val *v = &b->vals[i];

		a[argc++] = (struct rmt_arg){ { v->p[0], v->p[1] }, { v->n[0], v->n[1] } };
		a[argc++] = (struct rmt_arg){ { "NX" }, { 2 } };
		if (r->o.ttl_ms) {
			a[argc++] = (struct rmt_arg){ { "PX" }, { 2 } };
			a[argc++] = (struct rmt_arg){ { ttl }, { (size_t)snprintf(ttl, sizeof ttl,
				"%u", r->o.ttl_ms) } };
			rc = rmt_send(r, nd, argc, a);
			if (rc)
				return rc;
			/* SET NX leaves an existing value's expiry alone: a session published
			 * now would name blocks that expire with an earlier put. PEXPIRE ... GT
			 * (Redis 7) extends it, never shortens it; its reply is read and dropped
			 * (rmt_node_recv), best effort like the TTL itself */
			a[0] = (struct rmt_arg){ { "PEXPIRE" }, { 7 } };
			a[1] = (struct rmt_arg){ { b->keys[i] }, { b->lens[i] } };
			a[2] = (struct rmt_arg){ { ttl }, { strlen(ttl) } };
			a[3] = (struct rmt_arg){ { "GT" }, { 2 } };
			return rmt_send(r, nd, 4, a);
		}
	}
	return rmt_send(r, nd, argc, a);
}

/* Send @nd's pending deletes and its queued keys. Returns 0 or the failure's code. */
static int
rmt_node_send(struct kvt_remote *r, struct rmt_batch *b, struct rmt_node *nd)
{
	int rc = 0;

	nd->ndel_sent = 0;
	for (uint32_t d = 0; rc == 0 && d < nd->ndel; d++) {
		struct rmt_arg a[2] = { { { "DEL" }, { 3 } },
					{ { nd->del[d] }, { nd->del_len[d] } } };

		rc = rmt_send(r, nd, 2, a);
		if (rc == 0) {
			nd->ndel_sent++;
			r->st.deletes++;
		}
	}
	for (uint32_t k = 0; rc == 0 && b && k < nd->nq; k++)
		rc = rmt_send_key(r, b, nd, nd->q[k]);
	return rc;
}

/* Read @nd's replies: the deletes', then each queued key's. Returns 0 or the failure's code
 * (every key not answered gets it). */
static int
rmt_node_recv(struct kvt_remote *r, struct rmt_batch *b, struct rmt_node *nd)
{
	redisReply *rep;
	uint32_t d;
	int rc = 0;

	for (d = 0; rc == 0 && d < nd->ndel_sent; d++) {
		rc = rmt_read(r, nd, &rep);
		if (rc == 0)
			freeReplyObject(rep);
	}
	if (rc == 0 && nd->ndel_sent) { /* sent and answered (whatever the answer: best effort) */
		for (d = 0; d < nd->ndel_sent; d++)
			free(nd->del[d]);
		memmove(nd->del, nd->del + nd->ndel_sent,
			(nd->ndel - nd->ndel_sent) * sizeof *nd->del);
		memmove(nd->del_len, nd->del_len + nd->ndel_sent,
			(nd->ndel - nd->ndel_sent) * sizeof *nd->del_len);
		nd->ndel -= nd->ndel_sent;
	}
	nd->ndel_sent = 0;
	for (uint32_t k = 0; rc == 0 && b && k < nd->nq; k++) {
		uint32_t i = nd->q[k];

		if (b->asking[i]) {
			rc = rmt_read(r, nd, &rep);
			if (rc)
				break;
			freeReplyObject(rep); /* +OK (an error shows in the command's reply) */
			b->asking[i] = 0;
		}
		rc = rmt_read(r, nd, &rep);
		if (rc)
			break;
		b->res[i] = rmt_answer(r, b, nd, i, rep);
		freeReplyObject(rep);
		if (b->op == RMT_SET && r->o.ttl_ms) { /* the PEXPIRE GT after it */
			rc = rmt_read(r, nd, &rep);
			if (rc)
				break;
			freeReplyObject(rep);
		}
	}
	if (rc == 0 && nd->slots_sent) {
		rc = rmt_read(r, nd, &rep);
		if (rc == 0) {
			(void)rmt_slots_apply(r, nd, rep);
			freeReplyObject(rep);
		}
	}
	nd->slots_sent = false;
	return rc;
}

/* Every key of @nd's queue that has no result yet gets @code. */
static void
rmt_node_abort(struct rmt_batch *b, struct rmt_node *nd, int code)
{
	for (uint32_t k = 0; b && k < nd->nq; k++)
		if (b->res[nd->q[k]] == RMT_PENDING && !b->again[nd->q[k]])
			b->res[nd->q[k]] = code;
	nd->nq = 0;
}

/* One round: route the keys marked again, send every server's pipeline, then read them all.
 * @b NULL: only the pending deletes (kvt_remote_flush). Returns 0, or the last failure's code
 * (the keys concerned carry it in res[]). */
static int
rmt_round(struct kvt_remote *r, struct rmt_batch *b)
{
	bool slots_sent = false;
	uint32_t active = 0;
	int last = 0, rc;

	for (uint32_t s = 0; s < r->n_nodes; s++)
		r->nodes[s]->nq = 0;
	for (uint32_t i = 0; b && i < b->n; i++) {
		struct rmt_node *nd;
		int idx;

		if (!b->again[i])
			continue;
		b->again[i] = 0;
		idx = b->target[i] != RMT_NO_NODE ? b->target[i] :
			rmt_route(r, b->keys[i], b->lens[i]);
		nd = r->nodes[idx];
		if (rmt_node_blocked(nd)) {
			r->st.fast_fails++;
			b->res[i] = kvt_err(-EAGAIN, "remote %s:%u: circuit breaker open (%u "
					    "failures in a row): failing fast", nd->host, nd->port,
					    nd->fails);
			last = b->res[i];
		} else if (rmt_q_push(nd, i)) {
			b->res[i] = last = kvt_err(-ENOMEM, "remote: no memory for a batch");
		}
	}
	for (uint32_t s = 0; s < r->n_nodes; s++) {
		struct rmt_node *nd = r->nodes[s];

		if (!nd->nq && !(b == NULL && nd->ndel))
			continue;
		if (!nd->nq && rmt_node_blocked(nd))
			continue;
		rc = rmt_node_ready(r, nd);
		if (rc == 0)
			rc = rmt_node_send(r, b, nd);
		if (rc) {
			if (nd->c)
				rmt_node_fail(r, nd);
			rmt_node_abort(b, nd, rc);
			nd->ndel_sent = 0;
			last = rc;
			continue;
		}
		if (b && r->map_stale && !slots_sent) { /* the refresh rides on this round */
			struct rmt_arg a[2] = { { { "CLUSTER" }, { 7 } }, { { "SLOTS" }, { 5 } } };

			if (rmt_send(r, nd, 2, a) == 0)
				nd->slots_sent = slots_sent = true;
		}
		active++;
		r->st.node_rounds++;
	}
	if (active)
		r->st.round_trips++;
	for (uint32_t s = 0; s < r->n_nodes; s++) {
		struct rmt_node *nd = r->nodes[s];

		if (!nd->c || (!nd->nq && !nd->ndel_sent))
			continue;
		rc = rmt_node_recv(r, b, nd);
		if (rc) {
			rmt_node_fail(r, nd);
			rmt_node_abort(b, nd, rc);
			nd->slots_sent = false;
			last = rc;
		} else {
			nd->fails = 0;
			nd->nq = 0;
		}
	}
	return last;
}

/* ---- batches ------------------------------------------------------------------------------- */

/* Run @b: a round, and a second one for the keys redirected by the first (after a slot map
 * refresh when a MOVED was seen). Keys still redirected then get -EAGAIN. */
static int
rmt_batch_run(struct kvt_remote *r, struct rmt_batch *b)
{
	uint8_t *st = malloc((size_t)b->n * (2 + sizeof(uint16_t)));
	bool more = false;

	if (!st)
		return kvt_err(-ENOMEM, "remote: no memory for a batch of %u keys", b->n);
	b->asking = st;
	b->again = st + b->n;
	b->target = (uint16_t *)(void *)(st + 2 * (size_t)b->n);
	for (uint32_t i = 0; i < b->n; i++) {
		b->res[i] = RMT_PENDING;
		b->asking[i] = 0;
		b->again[i] = 1;
		b->target[i] = RMT_NO_NODE;
	}
	for (int round = 0; round < 2; round++) {
		(void)rmt_round(r, b);
		more = false;
		for (uint32_t i = 0; i < b->n && !more; i++)
			more = b->again[i];
		if (!more)
			break;
		/* a stale map (MOVED) is reloaded by a CLUSTER SLOTS riding on the next round */
	}
	for (uint32_t i = 0; i < b->n; i++)
		if (b->res[i] == RMT_PENDING)
			b->res[i] = kvt_err(-EAGAIN, "remote: key still redirected after two rounds "
					    "(the cluster is resharding)");
	free(st);
	return 0;
}

static int
rmt_check(const struct kvt_remote *r, const char *const *keys, const size_t *key_lens,
	  uint32_t n, const int *res)
{
	if (!r || !keys || !key_lens || !res || n == 0 || n > RMT_MAX_BATCH)
		return kvt_err(-EINVAL, "remote: bad batch (n %u, 1..%u keys, non-NULL arrays)", n,
			       RMT_MAX_BATCH);
	for (uint32_t i = 0; i < n; i++)
		if (!keys[i] || key_lens[i] == 0 || key_lens[i] > 4096)
			return kvt_err(-EINVAL, "remote: key %u: empty, NULL or over 4096 bytes", i);
	return 0;
}

static int
rmt_count(const int *res, uint32_t n, bool leading)
{
	int c = 0;

	for (uint32_t i = 0; i < n; i++) {
		if (leading && res[i] != 1)
			break;
		c += leading ? 1 : res[i] >= 0;
	}
	return c;
}

int
kvt_remote_put(struct kvt_remote *r, const char *const *keys, const size_t *key_lens,
	       const struct kvt_remote_val *vals, uint32_t n, int *res)
{
	struct rmt_batch b = { .op = RMT_SET, .keys = keys, .lens = key_lens, .vals = vals,
			       .n = n, .res = res };
	int rc = rmt_check(r, keys, key_lens, n, res);

	if (rc == 0 && !vals)
		rc = kvt_err(-EINVAL, "remote: put without values");
	if (rc == 0)
		rc = rmt_batch_run(r, &b);
	return rc ? rc : rmt_count(res, n, false);
}

int
kvt_remote_get(struct kvt_remote *r, const char *const *keys, const size_t *key_lens,
	       uint32_t n, kvt_remote_take_fn take, void *arg, int *res)
{
	struct rmt_batch b = { .op = RMT_GET, .keys = keys, .lens = key_lens, .n = n,
			       .res = res, .take = take, .arg = arg };
	int rc = rmt_check(r, keys, key_lens, n, res);

	if (rc == 0 && !take)
		rc = kvt_err(-EINVAL, "remote: get without a consumer");
	if (rc == 0)
		rc = rmt_batch_run(r, &b);
	return rc ? rc : rmt_count(res, n, true);
}

static int
rmt_simple(struct kvt_remote *r, enum rmt_op op, const char *const *keys,
	   const size_t *key_lens, uint32_t n, int *res, bool leading)
{
	int *own = res ? NULL : malloc((size_t)n * sizeof *own);
	struct rmt_batch b = { .op = op, .keys = keys, .lens = key_lens, .n = n,
			       .res = res ? res : own };
	int rc;

	if (!res && !own)
		return kvt_err(-ENOMEM, "remote: no memory for a batch of %u keys", n);
	rc = rmt_check(r, keys, key_lens, n, b.res);
	if (rc == 0)
		rc = rmt_batch_run(r, &b);
	if (rc == 0)
		rc = rmt_count(b.res, n, leading);
	free(own);
	return rc;
}

int
kvt_remote_exists(struct kvt_remote *r, const char *const *keys, const size_t *key_lens,
		  uint32_t n, int *res)
{
	return rmt_simple(r, RMT_EXISTS, keys, key_lens, n, res, true);
}

int
kvt_remote_del(struct kvt_remote *r, const char *const *keys, const size_t *key_lens,
	       uint32_t n, int *res)
{
	return rmt_simple(r, RMT_DEL, keys, key_lens, n, res, false);
}

int
kvt_remote_flush(struct kvt_remote *r)
{
	return r ? rmt_round(r, NULL) : 0;
}

/* ---- state --------------------------------------------------------------------------------- */

bool
kvt_remote_breaker_open(struct kvt_remote *r, const char *key, size_t key_len)
{
	if (key)
		return rmt_node_blocked(r->nodes[rmt_route(r, key, key_len)]);
	for (uint32_t s = 0; s < r->n_nodes; s++)
		if (rmt_node_blocked(r->nodes[s]))
			return true;
	return false;
}
