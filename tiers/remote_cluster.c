/* SPDX-License-Identifier: MIT */
/*
 * tiers/remote_cluster.c - Redis Cluster routing for tiers/remote.c: the key's slot (CRC16 with
 * {hash tags}, as Redis's keyHashSlot), the slot map from CLUSTER SLOTS, and the MOVED / ASK
 * redirects. hiredis 0.14 has no cluster support: all of it is here.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tiers/base/error.h"
#include "tiers/remote_int.h"

/* CRC16-CCITT (XMODEM: polynomial 0x1021, initial 0), Redis Cluster's key hash. */
uint16_t
kvt_remote_crc16(const void *p, size_t len)
{
	const uint8_t *b = p;
	uint16_t crc = 0;

	for (size_t i = 0; i < len; i++) {
		crc ^= (uint16_t)(b[i] << 8);
		for (int k = 0; k < 8; k++)
			crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
	}
	return crc;
}

uint16_t
kvt_remote_key_slot(const char *key, size_t len)
{
	size_t s, e;

	for (s = 0; s < len && key[s] != '{'; s++)
		;
	if (s < len) { /* a '{': the part up to the next '}' when it is not empty */
		for (e = s + 1; e < len && key[e] != '}'; e++)
			;
		if (e < len && e > s + 1)
			return kvt_remote_crc16(key + s + 1, e - s - 1) & (KVT_REMOTE_SLOTS - 1);
	}
	return kvt_remote_crc16(key, len) & (KVT_REMOTE_SLOTS - 1);
}

/* "MOVED 3999 127.0.0.1:6381" or "ASK 3999 127.0.0.1:6381" (the host may be empty: IPv6 hosts
 * keep their colons, the port is after the last one). Returns 0 or -EPROTO. */
int
rmt_parse_redirect(const char *s, size_t len, bool *ask, uint16_t *slot, const char **host,
		   size_t *host_len, uint16_t *port)
{
	size_t i, colon = 0;
	unsigned long v = 0;
	unsigned long pv = 0;

	if (len > 6 && !memcmp(s, "MOVED ", 6))
		*ask = false, i = 6;
	else if (len > 4 && !memcmp(s, "ASK ", 4))
		*ask = true, i = 4;
	else
		return -EPROTO;
	if (i >= len || s[i] < '0' || s[i] > '9')
		return -EPROTO;
	for (; i < len && s[i] >= '0' && s[i] <= '9'; i++)
		if ((v = v * 10 + (unsigned long)(s[i] - '0')) >= KVT_REMOTE_SLOTS)
			return -EPROTO;
	if (i >= len || s[i++] != ' ')
		return -EPROTO;
	*host = s + i;
	for (size_t k = i; k < len; k++)
		if (s[k] == ':')
			colon = k;
	if (!colon || colon + 1 >= len)
		return -EPROTO;
	for (size_t k = colon + 1; k < len; k++) {
		if (s[k] < '0' || s[k] > '9' || (pv = pv * 10 + (unsigned long)(s[k] - '0')) > 65535)
			return -EPROTO;
	}
	if (pv == 0 || colon == i) /* an empty host is the node that answered: not supported */
		return -EPROTO;
	*host_len = colon - i;
	*slot = (uint16_t)v;
	*port = (uint16_t)pv;
	return 0;
}

/* One master entry of CLUSTER SLOTS: [start, end, [host, port, id...], replicas...]. Returns
 * the master's node index, or a negative code. */
static int
rmt_slots_entry(struct kvt_remote *r, const struct rmt_node *asked, const redisReply *e,
		long long *start, long long *end)
{
	const redisReply *m;

	if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
	    e->element[0]->type != REDIS_REPLY_INTEGER ||
	    e->element[1]->type != REDIS_REPLY_INTEGER)
		return -EPROTO;
	m = e->element[2];
	*start = e->element[0]->integer;
	*end = e->element[1]->integer;
	if (*start < 0 || *end < *start || *end >= KVT_REMOTE_SLOTS ||
	    m->type != REDIS_REPLY_ARRAY || m->elements < 2 ||
	    m->element[0]->type != REDIS_REPLY_STRING ||
	    m->element[1]->type != REDIS_REPLY_INTEGER || m->element[1]->integer <= 0 ||
	    m->element[1]->integer > 65535)
		return -EPROTO;
	if (m->element[0]->len == 0 || (m->element[0]->len == 1 && m->element[0]->str[0] == '?'))
		return rmt_node_add(r, asked->host, strlen(asked->host),
				    (uint16_t)m->element[1]->integer); /* "": the node asked */
	return rmt_node_add(r, m->element[0]->str, m->element[0]->len,
			    (uint16_t)m->element[1]->integer);
}

/* Install the map of a CLUSTER SLOTS reply @rep from @nd (frees nothing). Returns 0 or a
 * negative code (the map is then partly updated; MOVED replies correct what is wrong). */
int
rmt_slots_apply(struct kvt_remote *r, const struct rmt_node *nd, redisReply *rep)
{
	struct rmt_node asked = { .port = nd->port };
	int rc = 0;

	memcpy(asked.host, nd->host, sizeof asked.host); /* nodes may grow below */
	if (rep->type != REDIS_REPLY_ARRAY)
		return kvt_err(-EPROTO, "remote %s:%u: CLUSTER SLOTS: unexpected reply type %d",
			       asked.host, asked.port, rep->type);
	for (uint32_t s = 0; s < KVT_REMOTE_SLOTS; s++)
		r->slot_node[s] = RMT_NO_NODE;
	for (size_t k = 0; k < rep->elements; k++) {
		long long a, b;
		int idx = rmt_slots_entry(r, &asked, rep->element[k], &a, &b);

		if (idx < 0) {
			rc = kvt_err(idx, "remote %s:%u: CLUSTER SLOTS: bad entry %zu", asked.host,
				     asked.port, k);
			break;
		}
		for (long long s = a; s <= b; s++)
			r->slot_node[s] = (uint16_t)idx;
	}
	if (rc == 0) {
		r->map_stale = false;
		r->st.slot_refreshes++;
	}
	return rc;
}

int
rmt_slots_load(struct kvt_remote *r, struct rmt_node *nd)
{
	const char *argv[2] = { "CLUSTER", "SLOTS" };
	const size_t lens[2] = { 7, 5 };
	redisReply *rep;
	int rc = rmt_command(r, nd, 2, argv, lens, &rep);

	if (rc)
		return rc;
	rc = rmt_slots_apply(r, nd, rep);
	freeReplyObject(rep);
	return rc;
}
