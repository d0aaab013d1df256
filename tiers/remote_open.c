/* SPDX-License-Identifier: MIT */
/*
 * tiers/remote_open.c - opening and closing a REMOTE client (see remote.h): options and their
 * defaults, the seed's connection, and the detection of a cluster (CLUSTER SLOTS at open).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tiers/base/error.h"
#include "tiers/remote_int.h"

static int
rmt_opts(struct kvt_remote *r, const struct kvt_remote_opts *in)
{
	struct kvt_remote_opts o = *in;

	o.host = o.host && *o.host ? o.host : "127.0.0.1";
	o.port = o.port ? o.port : 6379;
	o.connect_timeout_ms = o.connect_timeout_ms ? o.connect_timeout_ms : 1000;
	o.op_timeout_ms = o.op_timeout_ms ? o.op_timeout_ms : 2000;
	o.breaker_failures = o.breaker_failures ? o.breaker_failures : 3;
	o.breaker_backoff_ms = o.breaker_backoff_ms ? o.breaker_backoff_ms : 200;
	o.breaker_backoff_max_ms = o.breaker_backoff_max_ms ? o.breaker_backoff_max_ms : 10000;
	if (strlen(o.host) >= RMT_HOST_MAX)
		return kvt_err(-EINVAL, "remote: host name over %u bytes", RMT_HOST_MAX - 1);
	if (o.connect_timeout_ms > 600000 || o.op_timeout_ms > 600000)
		return kvt_err(-EINVAL, "remote: timeouts are at most 600000 ms (connect %u, op %u)",
			       o.connect_timeout_ms, o.op_timeout_ms);
	if (o.breaker_backoff_max_ms < o.breaker_backoff_ms)
		return kvt_err(-EINVAL, "remote: breaker_backoff_max_ms %u below "
			       "breaker_backoff_ms %u", o.breaker_backoff_max_ms,
			       o.breaker_backoff_ms);
	if (o.cluster < -1 || o.cluster > 1)
		return kvt_err(-EINVAL, "remote: cluster %d (0 detect, 1 cluster, -1 single)",
			       o.cluster);
	if (o.user && !(o.password && *o.password))
		return kvt_err(-EINVAL, "remote: an ACL user needs a password");
	if (o.password && *o.password && !(r->password = strdup(o.password)))
		return kvt_err(-ENOMEM, "remote: no memory");
	if (o.user && !(r->user = strdup(o.user)))
		return kvt_err(-ENOMEM, "remote: no memory");
	o.host = NULL; /* nodes[0] keeps it */
	o.user = o.password = NULL;
	r->o = o;
	return 0;
}

/* Ask the seed for its slot map: a cluster, or (error "cluster support disabled") one server. */
static int
rmt_detect(struct kvt_remote *r)
{
	const char *argv[2] = { "CLUSTER", "SLOTS" };
	const size_t lens[2] = { 7, 5 };
	redisReply *rep;
	int rc;

	if (r->o.cluster < 0)
		return 0;
	rc = rmt_command(r, r->nodes[0], 2, argv, lens, &rep);
	if (rc)
		return rc;
	if (rep->type == REDIS_REPLY_ERROR) {
		rc = r->o.cluster == 1 ? kvt_err(-EPROTO, "remote %s:%u: not a cluster: %.*s",
						 r->nodes[0]->host, r->nodes[0]->port,
						 (int)(rep->len < 200 ? rep->len : 200), rep->str)
				       : 0;
		freeReplyObject(rep);
		return rc;
	}
	freeReplyObject(rep);
	r->slot_node = malloc(KVT_REMOTE_SLOTS * sizeof *r->slot_node);
	if (!r->slot_node)
		return kvt_err(-ENOMEM, "remote: no memory for the slot map");
	r->cluster = true;
	return rmt_slots_load(r, r->nodes[0]);
}

int
kvt_remote_open(const struct kvt_remote_opts *opts, struct kvt_remote **out)
{
	struct kvt_remote_opts none = { 0 };
	struct kvt_remote *r;
	const char *host;
	int rc;

	if (!out)
		return kvt_err(-EINVAL, "remote: NULL out");
	*out = NULL;
	opts = opts ? opts : &none;
	r = calloc(1, sizeof *r);
	if (!r)
		return kvt_err(-ENOMEM, "remote: no memory");
	host = opts->host && *opts->host ? opts->host : "127.0.0.1";
	rc = rmt_opts(r, opts);
	if (rc == 0)
		rc = rmt_node_add(r, host, strlen(host), opts->port ? opts->port : 6379);
	if (rc >= 0)
		rc = rmt_node_ready(r, r->nodes[0]);
	if (rc == 0)
		rc = rmt_detect(r);
	if (rc < 0) {
		kvt_remote_close(r);
		return rc;
	}
	*out = r;
	return 0;
}

void
kvt_remote_close(struct kvt_remote *r)
{
	if (!r)
		return;
	if (r->nodes && r->o.op_timeout_ms)
		(void)kvt_remote_flush(r); /* pending deletes, best effort */
	for (uint32_t s = 0; s < r->n_nodes; s++) {
		struct rmt_node *nd = r->nodes[s];

		if (nd->c)
			redisFree(nd->c);
		for (uint32_t d = 0; d < nd->ndel; d++)
			free(nd->del[d]);
		free(nd->del);
		free(nd->del_len);
		free(nd->q);
		free(nd);
	}
	free(r->nodes);
	free(r->slot_node);
	free(r->user);
	free(r->password);
	free(r);
}

bool
kvt_remote_is_cluster(const struct kvt_remote *r)
{
	return r->cluster;
}

void
kvt_remote_stats(const struct kvt_remote *r, struct kvt_remote_stats *out)
{
	*out = r->st;
}

