/* SPDX-License-Identifier: MIT */
/*
 * tiers/remote.h - the REMOTE tier's groundwork (internal, issue 18): a Redis 7 / Valkey client
 * over RESP on Debian's hiredis 0.14, single server or Redis Cluster, and the self-verifying
 * value format of KV blocks kept there (docs/FORMAT.md "REMOTE values"). The engine drives it
 * from one worker thread (engine/remote.c: kvt_seq_publish_remote, kvt_seq_restore_remote);
 * docs/ARCHITECTURE.md "REMOTE tier (design)" says what is built and what is not.
 *
 * What hiredis 0.14 gives and what this client adds:
 *   - hiredis: TCP connect with a timeout, socket timeouts (redisSetTimeout: SO_RCVTIMEO and
 *     SO_SNDTIMEO), the RESP reply parser. No TLS (hiredis 0.14 has none: TLS is NOT supported
 *     by this client; a server that requires TLS cannot be used), no RESP3, no cluster support.
 *   - here: AUTH (password, or ACL user + password) on every connection; pipelined batches
 *     written with one writev per command straight from the caller's buffers (no copy of a
 *     value into hiredis's output buffer), replies read with hiredis; Redis Cluster routing
 *     (CLUSTER SLOTS map, CRC16 key slots with {hash tags}, MOVED and ASK with ASKING, slot map
 *     refresh, one connection per master); a circuit breaker per server; counters.
 *
 * Round trips. A batch is sent as pipelines, one per server it touches (all written before any
 * reply is read), and its replies read back: one round trip, counted once however many
 * servers take part. Keys answered with MOVED or ASK go out again in a second round (a MOVED
 * updates its slot at once, and a CLUSTER SLOTS riding on that round reloads the whole map);
 * keys still redirected after that fail with -EAGAIN. So a get or put of N values is at most
 * two round trips for any N.
 *
 * Failures. Every reply is read within op_timeout_ms (each read and write of the socket is
 * bounded by it) and every connect within connect_timeout_ms; a connection that failed in any
 * way (timeout, reset, EOF, protocol error) is dropped and its server's breaker counts a
 * failure. After breaker_failures consecutive failures the server's breaker opens: calls that
 * need that server fail at once with -EAGAIN for breaker_backoff_ms, then one reconnect (with a
 * PING) is tried; its failure doubles the backoff (up to breaker_backoff_max_ms), its success
 * closes the breaker. Replies of unexpected types, wrong sizes or errors never crash: each is a
 * clear per-key result.
 *
 * Threading: a client is NOT thread-safe. Each thread uses its own client, or the caller
 * serializes all calls on one (the engine's design: one worker thread owns it). Clients share
 * nothing.
 */
#ifndef KVT_TIERS_REMOTE_H
#define KVT_TIERS_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"
#include "tiers/codec.h"

struct kvt_remote;

/** Options of kvt_remote_open(); zero fields take the defaults. */
struct kvt_remote_opts {
	const char *host;              /* server (or any cluster node) name or address; copied;
	                                  default "127.0.0.1" */
	uint16_t port;                 /* its port; default 6379 */
	const char *user;              /* ACL user (AUTH user password); NULL: AUTH password alone
	                                  (the default user); copied */
	const char *password;          /* NULL or "": no AUTH; copied */
	uint32_t connect_timeout_ms;   /* bound of one connect (+ AUTH + PING); default 1000 */
	uint32_t op_timeout_ms;        /* bound of each socket read and write; default 2000 */
	uint32_t breaker_failures;     /* consecutive failures of a server that open its breaker;
	                                  default 3 */
	uint32_t breaker_backoff_ms;   /* first open period; default 200 */
	uint32_t breaker_backoff_max_ms; /* cap of the doubling; default 10000 */
	uint32_t ttl_ms;               /* puts: PX ttl; 0 = no expiry (the server's maxmemory-policy
	                                  still evicts) */
	int cluster;                   /* 0 = detect (CLUSTER SLOTS at open), 1 = require a
	                                  cluster, -1 = a single server (no CLUSTER command sent) */
};

/** Counters of a client since open (never reset). */
struct kvt_remote_stats {
	uint64_t round_trips;    /* rounds: pipelines sent to every server a batch touches, and
	                            their replies read (one per round, not per server); plus
	                            the CLUSTER SLOTS of open (the connect's AUTH and PING are
	                            not counted) */
	uint64_t node_rounds;    /* per-server pipelines of those rounds */
	uint64_t commands;       /* commands sent */
	uint64_t bytes_out;      /* bytes written to sockets (RESP included) */
	uint64_t bytes_in;       /* bytes of string replies received (values, status, errors;
	                            RESP framing not counted) */
	uint64_t errors;         /* connection-level failures: connect, timeout, reset, EOF,
	                            protocol */
	uint64_t timeouts;       /* ... of which a read or write ran past op_timeout_ms */
	uint64_t reply_errors;   /* error replies other than redirects (-OOM, -ERR, ...) */
	uint64_t breaker_trips;  /* breakers that opened (or re-opened after a failed trial) */
	uint64_t fast_fails;     /* keys failed at once because their server's breaker was open */
	uint64_t reconnects;     /* connections (re)established after the first */
	uint64_t moved;          /* MOVED redirects */
	uint64_t asks;           /* ASK redirects */
	uint64_t slot_refreshes; /* CLUSTER SLOTS maps loaded */
	uint64_t bad_values;     /* values that failed verification (kvt_remote_get_blocks) */
	uint64_t deletes;        /* best-effort DELs of bad values sent */
};

/**
 * kvt_remote_open() - make a client and connect to opts->host:port (AUTH, PING; with a cluster
 * also CLUSTER SLOTS, then a connection per master as batches need them).
 * Returns 0 and *out, -EINVAL (bad options), -ENOMEM, -ECONNREFUSED / -ETIMEDOUT / -EACCES
 * (AUTH refused) / -EPROTO (not a Redis server, or cluster = 1 on a single server), each with
 * kvt_last_error_message() saying which server and why. *out is NULL on failure.
 */
int kvt_remote_open(const struct kvt_remote_opts *opts, struct kvt_remote **out);

/** kvt_remote_close() - send pending deletes (best effort), close every connection, free. */
void kvt_remote_close(struct kvt_remote *r);

/** kvt_remote_is_cluster() - whether the client routes by cluster slots. */
bool kvt_remote_is_cluster(const struct kvt_remote *r);

/** kvt_remote_stats() - copy the counters into @out. */
void kvt_remote_stats(const struct kvt_remote *r, struct kvt_remote_stats *out);

/**
 * kvt_remote_breaker_open() - whether the breaker of the server owning @key is open now
 * (metrics, tests). @key NULL: whether any server's is.
 */
bool kvt_remote_breaker_open(struct kvt_remote *r, const char *key, size_t key_len);

/** One value of a put: up to two pieces sent back to back (a header and a payload). */
struct kvt_remote_val {
	const void *p[2]; /* pieces; p[1] may be NULL with n[1] = 0 */
	size_t n[2];      /* their bytes */
};

/**
 * kvt_remote_put() - SET key value NX [PX ttl_ms] for @n keys, pipelined (first writer wins:
 * a key that exists keeps its value and counts as stored).
 * @keys, @key_lens: n keys (binary-safe); @vals: n values, read during the call only.
 * @res: n results: 1 stored now, 0 already there, or a negative code (-EAGAIN breaker open or
 * still redirected, -ETIMEDOUT, -ECONNRESET/-EPIPE, -ENOSPC: the server is out of memory
 * (-OOM), -EPROTO: unexpected reply).
 * Returns the number of keys with res >= 0, or -EINVAL (n = 0 or > 65536, NULLs).
 */
int kvt_remote_put(struct kvt_remote *r, const char *const *keys, const size_t *key_lens,
		   const struct kvt_remote_val *vals, uint32_t n, int *res);

/**
 * Consumer of one value of kvt_remote_get(): called once per key that has a value, in the
 * order the replies arrive, with the bytes (valid during the call). Returns 1 (kept), 0 (bad
 * value: kvt_remote_get() answers it as a miss and deletes the key best effort, on that
 * server's next round or at close).
 */
typedef int (*kvt_remote_take_fn)(void *arg, uint32_t i, const void *val, size_t len);

/**
 * kvt_remote_get() - GET @n keys, pipelined; each value goes to @take.
 * @res: n results: 1 hit (take kept it), 0 miss (absent, or take refused it), or a negative
 * code as for kvt_remote_put().
 * Returns the length of the leading run of hits (0..n), or -EINVAL.
 */
int kvt_remote_get(struct kvt_remote *r, const char *const *keys, const size_t *key_lens,
		   uint32_t n, kvt_remote_take_fn take, void *arg, int *res);

/**
 * kvt_remote_exists() - EXISTS of @n keys, pipelined (one round, unless redirected).
 * @res: NULL or n results: 1 present, 0 absent, or a negative code.
 * Returns the length of the leading run of present keys, or -EINVAL. (Presence is not a
 * verified hit: a get may still find the value bad or evicted.)
 */
int kvt_remote_exists(struct kvt_remote *r, const char *const *keys, const size_t *key_lens,
		      uint32_t n, int *res);

/**
 * kvt_remote_del() - DEL @n keys, pipelined. @res: NULL or n results (1 deleted, 0 absent, or
 * a negative code). Returns the number of keys with res >= 0, or -EINVAL.
 */
int kvt_remote_del(struct kvt_remote *r, const char *const *keys, const size_t *key_lens,
		   uint32_t n, int *res);

/** kvt_remote_flush() - send the pending best-effort deletes now. Returns 0 or the first
 * failure's code (they stay pending then). */
int kvt_remote_flush(struct kvt_remote *r);

/* ---- cluster helpers (tiers/remote_cluster.c) ---------------------------------------------- */

#define KVT_REMOTE_SLOTS 16384u

/** CRC16 (XMODEM) of @len bytes, as Redis Cluster computes it. */
uint16_t kvt_remote_crc16(const void *p, size_t len);

/** The cluster slot of a key: CRC16 of the first non-empty {hash tag}, else of the whole key,
 * modulo 16384 (Redis's keyHashSlot). */
uint16_t kvt_remote_key_slot(const char *key, size_t len);

/* ---- values of KV blocks (tiers/remote_value.c; docs/FORMAT.md "REMOTE values") ------------- */

#define KVT_RV_VERSION 1u       /* version of the REMOTE value format */
#define KVT_RV_HDR_BYTES 128u   /* header before the payload */
#define KVT_RV_KEY_MAX 96u      /* bytes of the longest key (with a NUL) */

/** What a block's bytes depend on: everything goes into its namespace. */
struct kvt_rv_desc {
	const char *model_id;   /* model and weights identity (e.g. "llama-3-8b@sha256:..."),
	                           given by the server; required, 1..1024 bytes */
	struct kvt_layout layout; /* the KV layout (dtype included) */
	uint32_t codec;         /* enum kvt_codec values are written with (KVT_CODEC_NONE: raw) */
	uint32_t tp_rank, tp_size; /* tensor-parallel shard (0, 1 when unsharded) */
	uint32_t pp_rank, pp_size; /* pipeline-parallel shard (0, 1 when unsharded) */
};

/** A namespace, derived once from a kvt_rv_desc (kvt_rv_ns_init). */
struct kvt_rv_ns {
	uint8_t id[16];         /* XXH3-128 of the canonical description (FORMAT.md) */
	uint64_t layout_fp;     /* XXH3-64 of the layout, block bytes and format version */
	uint64_t block_bytes;   /* raw bytes of one block */
	uint32_t codec;         /* codec puts try */
	double min_saving;      /* an encoding is kept when it saves this fraction; 0.1 */
	struct kvt_codec_geom geom; /* the codec's tile geometry */
};

/** kvt_rv_ns_init() - derive @ns from @d. Returns 0 or -EINVAL (bad layout, shard, codec,
 * model_id), with a message. */
int kvt_rv_ns_init(struct kvt_rv_ns *ns, const struct kvt_rv_desc *d);

/**
 * kvt_rv_key() - the key of block @hash (its prefix chain hash) of @tenant in @ns:
 * "kvt1:" 32 hex digits of ns->id ":" 8 of the tenant ":" 32 of the hash (79 bytes, no braces,
 * so keys spread over the cluster's slots). Writes a NUL-terminated key into @out
 * (KVT_RV_KEY_MAX bytes) and returns its length.
 */
size_t kvt_rv_key(const struct kvt_rv_ns *ns, uint32_t tenant, const uint8_t hash[16],
		  char *out);

/** The fields of a value's header. */
struct kvt_rv_hdr {
	uint8_t ns[16];       /* namespace id echoed */
	uint32_t tenant;      /* tenant echoed */
	uint32_t codec;       /* codec of the payload (KVT_CODEC_NONE: raw) */
	uint8_t hash[16];     /* block hash echoed */
	uint64_t layout_fp;   /* the namespace's layout fingerprint */
	uint64_t raw_len;     /* bytes of the decoded block */
	uint64_t stored_len;  /* bytes of the payload after the header */
	uint64_t payload_sum; /* XXH3-64 of the payload */
	uint64_t raw_sum;     /* XXH3-64 of the decoded block (== payload_sum when raw) */
};

/** kvt_rv_hdr_encode() - write @h as the KVT_RV_HDR_BYTES bytes of @out. */
void kvt_rv_hdr_encode(const struct kvt_rv_hdr *h, uint8_t *out);

/**
 * kvt_rv_parse() - check the value @val (@len bytes) read under the key of (@ns, @tenant,
 * @hash): length, magic, version, header checksum, namespace, tenant and hash echoed, layout
 * fingerprint, raw length, codec, payload length and XXH3-64. Fills @out.
 * Returns 0 or KVT_ECORRUPT with a message naming the first check that failed.
 */
int kvt_rv_parse(const struct kvt_rv_ns *ns, uint32_t tenant, const uint8_t hash[16],
		 const void *val, size_t len, struct kvt_rv_hdr *out);

/**
 * kvt_remote_put_blocks() - put @n blocks of @tenant: block i (ns->block_bytes at @src[i]) as
 * the value of kvt_rv_key(hashes[i]) (header + payload, encoded when ns->codec pays). One
 * pipelined round (two with redirects). @res as kvt_remote_put().
 * Returns the number stored or already there, -EINVAL, or -ENOMEM.
 */
int kvt_remote_put_blocks(struct kvt_remote *r, const struct kvt_rv_ns *ns, uint32_t tenant,
			  const uint8_t (*hashes)[16], const void *const *src, uint32_t n,
			  int *res);

/**
 * kvt_remote_get_blocks() - get @n blocks of @tenant into @dst[i] (ns->block_bytes each). A
 * value that fails any check of kvt_rv_parse() (or does not decode) is a miss, counted in
 * bad_values and deleted best effort; its @dst bytes are unspecified. @res as kvt_remote_get().
 * Returns the leading run of verified hits (the longest verified prefix), -EINVAL, -ENOMEM.
 */
int kvt_remote_get_blocks(struct kvt_remote *r, const struct kvt_rv_ns *ns, uint32_t tenant,
			  const uint8_t (*hashes)[16], void *const *dst, uint32_t n, int *res);

/** kvt_remote_exists_blocks() - the leading run of present blocks (kvt_remote_exists). */
int kvt_remote_exists_blocks(struct kvt_remote *r, const struct kvt_rv_ns *ns, uint32_t tenant,
			     const uint8_t (*hashes)[16], uint32_t n, int *res);

#endif /* KVT_TIERS_REMOTE_H */
