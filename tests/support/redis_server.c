/* SPDX-License-Identifier: MIT */
/* tests/support/redis_server.c - see redis_server.h. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "support/redis_server.h"

#define TSRV_MAX 16
static pid_t tsrv_pids[TSRV_MAX];
static char tsrv_dirs[TSRV_MAX][256]; /* temp dirs made, removed at exit */
static bool tsrv_hooked;

static void
tsrv_atexit(void)
{
	char cmd[320];

	for (int i = 0; i < TSRV_MAX; i++)
		if (tsrv_pids[i] > 0) {
			kill(tsrv_pids[i], SIGCONT);
			kill(tsrv_pids[i], SIGKILL);
			waitpid(tsrv_pids[i], NULL, 0);
			tsrv_pids[i] = 0;
		}
	for (int i = 0; i < TSRV_MAX; i++)
		if (tsrv_dirs[i][0] && !getenv("KVT_TEST_KEEP")) {
			snprintf(cmd, sizeof cmd, "rm -rf '%.255s'", tsrv_dirs[i]);
			if (system(cmd) != 0)
				fprintf(stderr, "tsrv: could not remove %s\n", tsrv_dirs[i]);
		}
}

static void
tsrv_track(pid_t pid, bool add)
{
	for (int i = 0; i < TSRV_MAX; i++)
		if (add ? tsrv_pids[i] == 0 : tsrv_pids[i] == pid) {
			tsrv_pids[i] = add ? pid : 0;
			return;
		}
}

bool
tsrv_available(void)
{
	return system("command -v redis-server >/dev/null 2>&1 && "
		      "command -v redis-cli >/dev/null 2>&1") == 0;
}

static bool
tsrv_port_free(uint16_t port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1, ok;

	if (fd < 0)
		return false;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
	close(fd);
	return ok;
}

/* A port P with P and P + 10000 (the cluster bus) free. */
static uint16_t
tsrv_free_port(void)
{
	static unsigned seed;

	if (!seed)
		seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL);
	for (int t = 0; t < 1000; t++) {
		uint16_t p = (uint16_t)(20000 + (rand_r(&seed) % 25000));

		if (tsrv_port_free(p) && tsrv_port_free((uint16_t)(p + 10000)))
			return p;
	}
	return 0;
}

int
tsrv_cli(const struct tsrv *s, char *out, size_t cap, const char *fmt, ...)
{
	char cmd[1024], args[768], line[4096];
	va_list ap;
	FILE *p;
	int rc = -1;

	va_start(ap, fmt);
	vsnprintf(args, sizeof args, fmt, ap);
	va_end(ap);
	snprintf(cmd, sizeof cmd, "redis-cli -h 127.0.0.1 -p %u %s 2>&1", s->port, args);
	p = popen(cmd, "r");
	if (!p)
		return -1;
	if (fgets(line, sizeof line, p)) {
		line[strcspn(line, "\r\n")] = '\0';
		if (out)
			snprintf(out, cap, "%s", line);
		rc = 0;
	}
	while (fgets(line, sizeof line, p))
		;
	pclose(p);
	return rc;
}

static int
tsrv_wait_ping(struct tsrv *s)
{
	char out[64];

	for (int t = 0; t < 400; t++) { /* up to ~20 s on a loaded machine */
		int st;

		if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
			fprintf(stderr, "tsrv: redis-server on port %u exited (see %s/log)\n",
				s->port, s->dir);
			s->pid = 0;
			return -1;
		}
		if (tsrv_cli(s, out, sizeof out, "PING") == 0 &&
		    (!strcmp(out, "PONG") || !strncmp(out, "NOAUTH", 6))) /* up (with a password) */
			return 0;
		usleep(50000);
	}
	fprintf(stderr, "tsrv: redis-server on port %u does not answer\n", s->port);
	return -1;
}

int
tsrv_start(struct tsrv *s, uint16_t port, const char *extra)
{
	const char *base = getenv("KVT_TEST_TMP");
	char cmd[1024];

	if (!tsrv_hooked) {
		atexit(tsrv_atexit);
		tsrv_hooked = true;
	}
	if (extra && extra != s->extra)
		snprintf(s->extra, sizeof s->extra, "%s", extra);
	else if (!extra)
		s->extra[0] = '\0';
	if (!s->dir[0]) {
		snprintf(s->dir, sizeof s->dir, "%s/kvt-redis-XXXXXX", base && *base ? base : "/tmp");
		if (!mkdtemp(s->dir)) {
			fprintf(stderr, "tsrv: mkdtemp %s: %s\n", s->dir, strerror(errno));
			return -1;
		}
		for (int i = 0; i < TSRV_MAX; i++)
			if (!tsrv_dirs[i][0]) {
				snprintf(tsrv_dirs[i], sizeof tsrv_dirs[i], "%.255s", s->dir);
				break;
			}
	}
	s->port = port ? port : tsrv_free_port();
	if (!s->port)
		return -1;
	snprintf(cmd, sizeof cmd,
		 "cd '%s' && exec redis-server --port %u --bind 127.0.0.1 --save '' "
		 "--appendonly no --daemonize no --enable-debug-command local "
		 "--cluster-config-file nodes-%u.conf %s >> log 2>&1",
		 s->dir, s->port, s->port, s->extra);
	s->pid = fork();
	if (s->pid < 0)
		return -1;
	if (s->pid == 0) {
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	tsrv_track(s->pid, true);
	return tsrv_wait_ping(s);
}

void
tsrv_kill(struct tsrv *s)
{
	if (s->pid <= 0)
		return;
	kill(s->pid, SIGCONT);
	kill(s->pid, SIGKILL);
	waitpid(s->pid, NULL, 0);
	tsrv_track(s->pid, false);
	s->pid = 0;
}

void
tsrv_signal(struct tsrv *s, int sig)
{
	if (s->pid > 0)
		kill(s->pid, sig);
}

int
tsrv_cluster(struct tsrv *s, int n)
{
	char cmd[1024], out[256];
	int off;

	for (int i = 0; i < n; i++)
		if (tsrv_start(&s[i], 0, "--cluster-enabled yes --cluster-node-timeout 5000"))
			return -1;
	off = snprintf(cmd, sizeof cmd, "redis-cli --cluster create");
	for (int i = 0; i < n; i++)
		off += snprintf(cmd + off, sizeof cmd - (size_t)off, " 127.0.0.1:%u", s[i].port);
	snprintf(cmd + off, sizeof cmd - (size_t)off,
		 " --cluster-replicas 0 --cluster-yes >> '%s/log' 2>&1", s[0].dir);
	if (system(cmd) != 0) {
		fprintf(stderr, "tsrv: redis-cli --cluster create failed (see %s/log)\n", s[0].dir);
		return -1;
	}
	for (int t = 0; t < 600; t++) { /* up to ~30 s */
		int ok = 0;

		for (int i = 0; i < n; i++) {
			FILE *p;
			char line[256];

			snprintf(cmd, sizeof cmd, "redis-cli -p %u CLUSTER INFO 2>&1", s[i].port);
			p = popen(cmd, "r");
			while (p && fgets(line, sizeof line, p))
				ok += !strncmp(line, "cluster_state:ok", 16);
			if (p)
				pclose(p);
		}
		if (ok == n)
			return 0;
		usleep(50000);
	}
	(void)out;
	fprintf(stderr, "tsrv: the cluster did not reach cluster_state:ok\n");
	return -1;
}
