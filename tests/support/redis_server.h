/* SPDX-License-Identifier: MIT */
/*
 * tests/support/redis_server.h - redis-server instances the REMOTE tests start themselves on
 * loopback ports, in a temp dir: one server, or a cluster of masters made with
 * `redis-cli --cluster create`. Every instance started is SIGKILLed at exit too (atexit), so a
 * failing test leaves no server behind, and the temp dirs are removed then (KVT_TEST_KEEP=1
 * keeps them, with each server's log).
 */
#ifndef KVT_TESTS_SUPPORT_REDIS_SERVER_H
#define KVT_TESTS_SUPPORT_REDIS_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct tsrv {
	pid_t pid;      /* redis-server, 0 when not running */
	uint16_t port;  /* its port (the cluster bus is port + 10000) */
	char dir[256];  /* its working dir (nodes.conf, log) */
	char extra[256]; /* extra arguments given at start, kept for a restart */
};

/** Whether redis-server and redis-cli are on PATH. */
bool tsrv_available(void);

/** Start a server on a free port (@port 0) or on @port, with @extra arguments appended (e.g.
 * "--maxmemory 8mb --maxmemory-policy allkeys-lru"); waits until it answers PING. Returns 0 or
 * -1 (with a line on stderr). */
int tsrv_start(struct tsrv *s, uint16_t port, const char *extra);

/** SIGKILL the server and reap it. */
void tsrv_kill(struct tsrv *s);

/** Send @sig (SIGSTOP, SIGCONT) to the server. */
void tsrv_signal(struct tsrv *s, int sig);

/** Run a command on the server through redis-cli and return its first output line in @out
 * (@cap bytes, NUL-terminated); returns 0 or -1. */
int tsrv_cli(const struct tsrv *s, char *out, size_t cap, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/** Start @n masters with --cluster-enabled and join them with redis-cli --cluster create
 * (0 replicas); waits until every node reports cluster_state:ok. Returns 0 or -1. */
int tsrv_cluster(struct tsrv *s, int n);

#endif
