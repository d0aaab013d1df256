/* SPDX-License-Identifier: MIT */
/*
 * tiers/remote_int.h - what tiers/remote.c (connections, rounds, breaker), tiers/remote_open.c
 * (options, open, close) and tiers/remote_cluster.c (slot map, redirects) share. Not for other
 * modules: use remote.h.
 */
#ifndef KVT_TIERS_REMOTE_INT_H
#define KVT_TIERS_REMOTE_INT_H

#include <stdbool.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "tiers/remote.h"

#define RMT_MAX_NODES 1024u  /* servers one client talks to (a cluster's masters) */
#define RMT_NO_NODE 0xffffu  /* slot map: slot not assigned (ask the seed, follow MOVED) */
#define RMT_HOST_MAX 256u    /* bytes of a node's host name, NUL included */

/* One server: its connection, its breaker, and the work of the current round. */
struct rmt_node {
	char host[RMT_HOST_MAX];  /* name or address */
	uint16_t port;            /* TCP port */
	redisContext *c;          /* NULL: not connected */
	bool connected_once;      /* a later connect counts as a reconnect */
	uint32_t fails;           /* consecutive failures */
	uint64_t open_until;      /* breaker open until this kvt_now_ns(); 0 = closed */
	uint32_t backoff_ms;      /* the current (next) open period */
	uint32_t *q;              /* this round's key indices, in send order */
	uint32_t nq, capq;        /* entries, allocated */
	uint32_t ndel_sent;       /* pending deletes sent at the head of this round */
	bool slots_sent;          /* CLUSTER SLOTS sent at the tail of this round */
	char **del;               /* pending best-effort deletes: keys (malloc'ed) */
	size_t *del_len;          /* their lengths */
	uint32_t ndel, capdel;    /* entries, allocated */
};

struct kvt_remote {
	struct kvt_remote_opts o;         /* options, defaults applied; strings owned below */
	char *user, *password;            /* copies (NULL: none) */
	bool cluster;                     /* route by slots */
	bool map_stale;                   /* a MOVED was seen: reload CLUSTER SLOTS */
	struct rmt_node **nodes;          /* servers (stable addresses); nodes[0] is the seed */
	uint32_t n_nodes, cap_nodes;      /* entries, allocated */
	uint16_t *slot_node;              /* [KVT_REMOTE_SLOTS] node index per slot (cluster) */
	struct kvt_remote_stats st;       /* counters */
};

/* remote.c */
int rmt_node_add(struct kvt_remote *r, const char *host, size_t host_len, uint16_t port);
int rmt_node_ready(struct kvt_remote *r, struct rmt_node *nd);
int rmt_command(struct kvt_remote *r, struct rmt_node *nd, int argc, const char **argv,
		const size_t *lens, redisReply **out);
void rmt_node_fail(struct kvt_remote *r, struct rmt_node *nd);

/* remote_cluster.c */
int rmt_slots_load(struct kvt_remote *r, struct rmt_node *nd);
int rmt_slots_apply(struct kvt_remote *r, const struct rmt_node *nd, redisReply *rep);
int rmt_parse_redirect(const char *s, size_t len, bool *ask, uint16_t *slot, const char **host,
		       size_t *host_len, uint16_t *port);

#endif /* KVT_TIERS_REMOTE_INT_H */
