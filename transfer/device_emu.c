/* SPDX-License-Identifier: MIT */
/*
 * transfer/device_emu.c - the emulated device: host memory and worker threads standing in for a
 * GPU, faithful to CUDA's asynchrony so that a missing wait in the engine shows up as wrong bytes
 * (and as a race under TSan) on machines without a GPU.
 *
 * Model:
 *   - "Device memory" is page-aligned heap memory; the CPU may dereference it
 *     (caps.device_mem_is_host), which only tests and the reference kernels should do.
 *   - A stream is a worker thread draining an in-order FIFO of operations: a copy batch, an
 *     event record, a wait for an event record. Before each operation the worker sleeps a random
 *     0..max_delay_us (per-stream RNG), so work on different streams completes late and in any
 *     relative order, while one stream stays strictly in order. A copy batch (one DMA) first
 *     sleeps its total length / copy_bytes_per_s (simulated link time), then moves its bytes.
 *   - An event points at its latest record (struct emu_rec). A record is done when its stream's
 *     worker reaches it. query/sync look at the latest record; stream_wait_event captures the
 *     latest record at call time, so a later re-record of the event does not release a wait
 *     already queued (as in CUDA). A never-recorded event counts as complete.
 *   - A thread that waits (event_sync, stream_sync) for a record of a stream that nobody is
 *     running (no op in progress, not held, max_delay_us 0) runs the ops queued on that stream
 *     when its wait began itself, in order (the record and what is queued behind it), instead
 *     of waking the worker and sleeping until it has run them: on a CPU host two context
 *     switches per wait (tens of microseconds on a loaded VM) would otherwise dwarf a layer's
 *     copy. The ops, their order and their link time are the same; only the thread differs.
 *     The worker keeps the stream between the ops of a backlog (a waiter takes over an idle
 *     stream only) and is woken only when it has ops to run. While a waiter runs a stream it
 *     spins for link time shorter than EMU_SPIN_NS (it would block anyway); a worker sleeps.
 *     docs/PERF.md "Sparse decode of the DSA fixture".
 *   - Lazy streams (kvt_emu_opts.lazy, for benchmarks): a submit wakes no worker. The ops wait
 *     for a thread that observes them: event_query runs the ops the simulated link has
 *     finished by then (a copy is due link time after it could start, as above), never
 *     sleeping; event_sync and stream_sync run them all as above; a stream's WAIT runs the
 *     recording stream's ops first. So a copy's bytes are in place whenever anyone can see it
 *     done, and the time it takes is the same link time, but no thread hand-off is paid per
 *     submit (on this 2-vCPU VM about 7 us of the submitting thread: the dominant cost of the
 *     hybrid fixtures' oversubscribed decode, docs/PERF.md "Lazy emulated streams"). The
 *     memcpy then runs on the observing thread, where a GPU's DMA engine costs the host
 *     nothing. A missing wait still shows as old bytes (they now stay old until someone
 *     waits), so the tests keep the default, eager workers.
 *
 * Locking: emu_dev.lock protects the lists of live objects; emu_dev.ev_lock protects every
 * event's latest pointer and every record (refs, done), and ev_cond is broadcast when a record
 * completes; emu_stream.lock protects that stream's queue and counters. Lock order: emu_dev.lock
 * before ev_lock or a stream's lock (destroy, and a waiter checking that a stream still lives,
 * nest them); ev_lock and a stream's lock are never held together. The thread that set
 * emu_stream.busy (the worker or one waiter) alone runs the stream's ops and owns rng,
 * link_end; the flag's hand-over under the stream's lock orders their accesses.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "tiers/base/clock.h"
#include "tiers/base/error.h"
#include "transfer/device.h"

#define EMU_ALIGN 4096u /* alignment of mem_alloc blocks (and the size of their header) */
#define EMU_SPIN_NS 50000u /* a waiter running a stream spins for link time below this, ns */

/* Intrusive circular doubly-linked list with a sentinel. */
struct emu_link {
	struct emu_link *prev; /* previous element or the sentinel */
	struct emu_link *next; /* next element or the sentinel */
};

enum emu_op_kind {
	EMU_OP_COPY = 0,   /* run v[0..n) memcpy's, then sleep for the simulated link time */
	EMU_OP_RECORD = 1, /* mark rec done */
	EMU_OP_WAIT = 2,   /* block this stream until rec is done */
};

/*
 * One record of an event. References (under emu_dev.ev_lock): the event while this is its
 * latest record, the RECORD op that completes it, each queued WAIT op and each event_sync caller.
 */
struct emu_stream;

struct emu_rec {
	struct emu_stream *s; /* the recording stream (valid while !done: a stream drains before
	                         it is freed; a waiter checks the device's list before use) */
	uint64_t gen;  /* the event's record count when this record was made (1, 2, ...) */
	uint32_t refs; /* references, see above; freed at 0 */
	bool done;     /* the recording stream has passed this record */
	uint64_t t_end; /* once done: the recording stream's simulated link clock there (ns):
	                   a WAIT for it starts its stream's link no earlier */
};

struct emu_op {
	struct emu_op *next;   /* FIFO link */
	enum emu_op_kind kind; /* what to do */
	struct emu_rec *rec;   /* RECORD: record to complete; WAIT: record to wait for */
	size_t total;          /* COPY: sum of the lengths, bytes */
	uint64_t t_queued;     /* CLOCK_MONOTONIC ns when pushed */
	uint32_t n;            /* COPY: number of copies in v */
	struct kvt_copy v[];   /* COPY: the caller's descriptors, copied at submit */
};

struct emu_dev;

struct emu_stream {
	struct emu_link link;  /* in emu_dev.streams; first member */
	struct emu_dev *dev;   /* owning device */
	pthread_t thread;      /* the worker */
	pthread_mutex_t lock;  /* protects head..stop */
	pthread_cond_t cond;   /* threads in stream_sync/step wait here for executed: broadcast
	                          on each op finished while n_sync > 0, on hold/stop change */
	pthread_cond_t wcond;  /* the worker sleeps here: signalled (w_sleeping) on a push to a
	                          stream nobody runs, when a waiter leaves ops behind, on
	                          hold/stop change; never for a push while an op runs, whose
	                          runner takes the next op itself (a wake-up it would throw away
	                          costs the pusher a cross-vCPU wake, ~7 us in the build VM) */
	bool w_sleeping;       /* the worker waits on wcond and nobody has signalled it yet */
	bool kick;             /* lazy device: the worker was asked to run the queue (by a
	                          waiter leaving ops behind, hold/stop change); cleared when it
	                          finds the queue empty. Without it a worker started after a
	                          push would run the ops nobody asked for */
	uint32_t n_sync;       /* threads waiting on cond */
	struct emu_op *head;   /* next op to run; NULL when empty */
	struct emu_op *tail;   /* last queued op */
	uint64_t queued;       /* ops ever queued */
	uint64_t executed;     /* ops ever finished */
	bool hold;             /* test knob: start no further op (kvt_device_emu_stream_hold) */
	uint64_t hold_at;      /* test knob: hold once executed reaches it; 0 = off
	                          (kvt_device_emu_stream_step) */
	bool stop;             /* drain the queue, then exit */
	bool busy;             /* an op is being run (by the worker or a waiter); none other may
	                          start */
	uint32_t id;           /* 0, 1, ... in creation order on the device */
	uint64_t rng;          /* splitmix64 state of the delays; the busy thread's */
	uint64_t link_end;     /* the busy thread's: CLOCK_MONOTONIC ns at which the simulated
	                          link finished (or finishes) the work run so far */
	_Atomic uint64_t sleeps; /* timer sleeps made for link time (test knob:
	                          kvt_device_emu_stream_sleeps) */
	_Atomic uint64_t helped; /* ops run by waiters instead of the worker (test knob:
	                          kvt_device_emu_stream_helped) */
};

struct emu_event {
	struct emu_link link;   /* in emu_dev.events; first member */
	struct emu_rec *latest; /* latest record, NULL if never recorded; under ev_lock */
	uint64_t records;       /* records so far; under ev_lock */
};

struct emu_mem {
	struct emu_link link; /* in emu_dev.mems; first member; lives EMU_ALIGN before the block */
	size_t len;           /* user length in bytes */
};

struct emu_map {
	struct emu_link link; /* in emu_dev.maps; first member */
	void *p;              /* mmap'ed address */
	size_t len;           /* mapped length in bytes */
	bool locked;          /* mlock succeeded */
};

struct emu_dev {
	struct kvt_device dev;     /* the public part; first member, so d == &emu->dev */
	struct kvt_emu_opts opts;  /* knobs, copied at create */
	pthread_mutex_t lock;      /* protects the four lists and next_stream_id */
	struct emu_link streams;   /* live streams */
	struct emu_link events;    /* live events */
	struct emu_link mems;      /* live mem_alloc blocks */
	struct emu_link maps;      /* live host_alloc mappings */
	uint32_t next_stream_id;   /* id of the next stream created */
	pthread_mutex_t ev_lock;   /* protects emu_event.latest/records and every emu_rec */
	pthread_cond_t ev_cond;    /* broadcast whenever a record becomes done */
	uint32_t sleepers;         /* event_sync callers waiting for a record; under ev_lock
	                              (test knob: kvt_device_emu_sleepers) */
};

static const struct kvt_device_ops emu_ops;

/* ------------------------------------------------------------------------------------------ */
/* small helpers                                                                                */

static void
emu_list_init(struct emu_link *h)
{
	h->prev = h;
	h->next = h;
}

static void
emu_list_add(struct emu_link *h, struct emu_link *e)
{
	e->next = h->next;
	e->prev = h;
	h->next->prev = e;
	h->next = e;
}

static void
emu_list_del(struct emu_link *e)
{
	e->prev->next = e->next;
	e->next->prev = e->prev;
	e->prev = e;
	e->next = e;
}

static struct emu_dev *
emu_dev_of(struct kvt_device *d)
{
	return (struct emu_dev *)d;
}

static uint64_t
emu_mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* splitmix64: next pseudo-random value of *state. */
static uint64_t
emu_rng_next(uint64_t *state)
{
	*state += 0x9e3779b97f4a7c15ull;
	return emu_mix64(*state);
}

/*
 * Sleep until CLOCK_MONOTONIC reaches @t ns; at once, without a system call, when it has. A
 * timer sleep costs far more than a small copy's link time on some hosts (25 us measured in a
 * Firecracker VM, as much for a deadline already past as for one 3 us ahead), and every copy
 * batch made one: layer pieces of a few KiB held their stream ~25 us each, and back-to-back
 * batches queued behind each other (issue 16's 4x decode). A late sleep still overshoots, but
 * the simulated link's clock (link_end) lets the batches queued behind it catch up, and those
 * now pay nothing. (Spinning on the clock for short waits was tried: it took the vCPUs that the
 * decode and the other stream need, and stories260K's coverage fell on a loaded 2-vCPU VM.)
 */
static void
emu_sleep_until(struct emu_stream *s, uint64_t t, bool spin)
{
	struct timespec ts = { .tv_sec = (time_t)(t / 1000000000u),
			       .tv_nsec = (long)(t % 1000000000u) };
	uint64_t now = kvt_now_ns();

	if (now >= t)
		return;
	if (spin && t - now < EMU_SPIN_NS) { /* a waiter: its thread would block anyway */
		while (kvt_now_ns() < t)
			;
		return;
	}
	atomic_fetch_add_explicit(&s->sleeps, 1, memory_order_relaxed);
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static void
emu_sleep_ns(uint64_t ns)
{
	struct timespec ts = { .tv_sec = (time_t)(ns / 1000000000u),
			       .tv_nsec = (long)(ns % 1000000000u) };

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/* mlock() through the system call: ASan's interceptor turns mlock() into a no-op that reports
 * success, which would make *pinned lie in sanitizer builds. */
static bool
emu_mlock(void *p, size_t len)
{
	return syscall(SYS_mlock, p, len) == 0;
}

#define EMU_HUGE ((size_t)2 << 20) /* a transparent huge page */

/*
 * An anonymous mapping of @len bytes rounded up to 2 MiB (*maplen), 2 MiB aligned, with
 * transparent huge pages asked for (MADV_HUGEPAGE; where THP is off the advice does nothing).
 * A 2 MiB block then lies in one physically contiguous page that DMA (O_DIRECT NVMe IO straight
 * into HOST slots) moves as one segment instead of 512 4 KiB pages: on the build VM's virtio disk
 * zero-copy reads went from 1.2 to 3.1 GB/s (docs/PERF.md). Returns MAP_FAILED with errno set.
 */
static void *
emu_map_huge(size_t len, size_t *maplen)
{
	size_t want = (len + EMU_HUGE - 1) & ~(EMU_HUGE - 1);
	uint8_t *raw, *p;

	if (want < len || want + EMU_HUGE < want) {
		errno = ENOMEM;
		return MAP_FAILED;
	}
	raw = mmap(NULL, want + EMU_HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
		   0);
	if (raw == MAP_FAILED)
		return MAP_FAILED;
	p = (uint8_t *)(((uintptr_t)raw + EMU_HUGE - 1) & ~(uintptr_t)(EMU_HUGE - 1));
	if (p > raw)
		munmap(raw, (size_t)(p - raw));
	if (raw + want + EMU_HUGE > p + want)
		munmap(p + want, (size_t)(raw + want + EMU_HUGE - (p + want)));
	(void)madvise(p, want, MADV_HUGEPAGE);
	*maplen = want;
	return p;
}

/* Drop one reference of r (NULL ok). Caller holds ev_lock. */
static void
emu_rec_put_locked(struct emu_rec *r)
{
	if (r && --r->refs == 0)
		free(r);
}

/* ------------------------------------------------------------------------------------------ */
/* memory                                                                                       */

static int
emu_mem_alloc(struct kvt_device *d, size_t len, void **out)
{
	struct emu_dev *emu = emu_dev_of(d);
	struct emu_mem *m;
	void *raw = NULL;

	if (out != NULL)
		*out = NULL;
	if (out == NULL || len == 0)
		return kvt_err(-EINVAL, "emulated mem_alloc: len %zu, out %p", len, (void *)out);
	if (len > SIZE_MAX - EMU_ALIGN || posix_memalign(&raw, EMU_ALIGN, EMU_ALIGN + len) != 0)
		return kvt_err(-ENOMEM, "emulated mem_alloc: cannot allocate %zu bytes", len);
	m = raw;
	m->len = len;
	pthread_mutex_lock(&emu->lock);
	emu_list_add(&emu->mems, &m->link);
	pthread_mutex_unlock(&emu->lock);
	*out = (char *)raw + EMU_ALIGN;
	return 0;
}

static void
emu_mem_free(struct kvt_device *d, void *p)
{
	struct emu_dev *emu = emu_dev_of(d);
	struct emu_mem *m;

	if (p == NULL)
		return;
	m = (struct emu_mem *)(void *)((char *)p - EMU_ALIGN);
	pthread_mutex_lock(&emu->lock);
	emu_list_del(&m->link);
	pthread_mutex_unlock(&emu->lock);
	free(m);
}

static int
emu_host_alloc(struct kvt_device *d, size_t len, void **out, bool *pinned)
{
	struct emu_dev *emu = emu_dev_of(d);
	struct emu_map *m;
	size_t maplen = 0;
	char ebuf[64];
	void *p;

	if (out != NULL)
		*out = NULL;
	if (pinned != NULL)
		*pinned = false;
	if (out == NULL || pinned == NULL || len == 0)
		return kvt_err(-EINVAL, "emulated host_alloc: len %zu, out %p, pinned %p", len,
			       (void *)out, (void *)pinned);
	m = calloc(1, sizeof *m);
	if (m == NULL)
		return kvt_err(-ENOMEM, "emulated host_alloc: no memory for the mapping record");
	p = emu_map_huge(len, &maplen);
	if (p == MAP_FAILED) {
		int e = errno;

		free(m);
		return kvt_err(-ENOMEM, "emulated host_alloc: mmap %zu bytes: %s", len,
			       strerror_r(e, ebuf, sizeof ebuf));
	}
	/* mlock fails with EPERM/ENOMEM/EAGAIN under RLIMIT_MEMLOCK without CAP_IPC_LOCK: keep the
	 * mapping unlocked and say so; the caller decides whether to warn. */
	m->locked = emu_mlock(p, maplen);
	m->p = p;
	m->len = maplen;
	pthread_mutex_lock(&emu->lock);
	emu_list_add(&emu->maps, &m->link);
	pthread_mutex_unlock(&emu->lock);
	*out = p;
	*pinned = m->locked;
	return 0;
}

static void
emu_host_free(struct kvt_device *d, void *p, size_t len)
{
	struct emu_dev *emu = emu_dev_of(d);
	struct emu_map *m = NULL;
	struct emu_link *l;

	if (p == NULL)
		return;
	pthread_mutex_lock(&emu->lock);
	for (l = emu->maps.next; l != &emu->maps; l = l->next) {
		if (((struct emu_map *)l)->p == p) {
			m = (struct emu_map *)l;
			emu_list_del(l);
			break;
		}
	}
	pthread_mutex_unlock(&emu->lock);
	if (m != NULL)
		len = m->len; /* the recorded length wins over the caller's */
	munmap(p, len); /* also unlocks */
	free(m);
}

/* ------------------------------------------------------------------------------------------ */
/* stream worker                                                                                */

static void emu_help_stream(struct emu_dev *emu, struct emu_stream *s, bool due_only);

/* pthread_cond_init() on CLOCK_MONOTONIC, the clock of emu_timedwait(): a step of the wall
 * clock must not stretch a lazy waiter's retry. 0 or an error number. */
static int
emu_cond_init(pthread_cond_t *c)
{
	pthread_condattr_t a;
	int rc = pthread_condattr_init(&a);

	if (rc)
		return rc;
	rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	if (!rc)
		rc = pthread_cond_init(c, &a);
	pthread_condattr_destroy(&a);
	return rc;
}

/* A lazy device's blocked waiter sleeps at most this long before it tries to run the ops it
 * waits for again (a poll may have left them queued while it found the stream busy). */
#define EMU_LAZY_RETRY_NS 200000u

static void
emu_timedwait(pthread_cond_t *c, pthread_mutex_t *m, uint64_t ns)
{
	struct timespec ts;
	uint64_t t;

	clock_gettime(CLOCK_MONOTONIC, &ts); /* the conditions' clock (emu_cond_init) */
	t = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec + ns;
	ts.tv_sec = (time_t)(t / 1000000000u);
	ts.tv_nsec = (long)(t % 1000000000u);
	(void)pthread_cond_timedwait(c, m, &ts);
}

/* When copy @op, next on s, would finish on the simulated link: it starts when the previous op
 * has finished there (link_end) or when it was queued, whichever is later. The busy thread's
 * view (emu_op_run moves link_end there; a lazy poll asks whether it has passed). */
static uint64_t
emu_copy_end(const struct emu_stream *s, const struct emu_op *op)
{
	uint64_t start = op->t_queued > s->link_end ? op->t_queued : s->link_end;
	uint64_t bw = s->dev->opts.copy_bytes_per_s;

	return bw == 0 || op->total == 0 ? start :
		start + (uint64_t)((double)op->total * 1e9 / (double)bw);
}

/* Run op on s; the caller set s->busy. @waiter: a thread waiting for s's work, not its worker. */
static void
emu_op_run(struct emu_stream *s, struct emu_op *op, bool waiter)
{
	struct emu_dev *emu = s->dev;
	uint64_t t;
	uint32_t i;
	bool waited;

	/* the simulated link starts an op when the previous one has finished on it (link_end)
	 * or when the op was queued, whichever is later: not when this thread got round to it,
	 * so that the host's scheduling delays (late wake-ups on a busy machine) do not add up
	 * across back-to-back copies, as they would not on a DMA engine */
	if (op->t_queued > s->link_end)
		s->link_end = op->t_queued;
	switch (op->kind) {
	case EMU_OP_COPY:
		/* link time first, bytes at its end: the source must stay intact and the
		 * destination stays old for the whole transfer, as on a real DMA engine, so
		 * reusing either too early shows up as wrong bytes. The batch is one DMA: one
		 * sleep for its total length (a sleep per piece would cost the timer's slack,
		 * tens of microseconds, per piece and distort small layer pieces) */
		if (emu->opts.copy_bytes_per_s != 0 && op->total != 0) {
			s->link_end = emu_copy_end(s, op);
			emu_sleep_until(s, s->link_end, waiter);
		}
		for (i = 0; i < op->n; i++)
			if (op->v[i].len != 0)
				memcpy(op->v[i].dst, op->v[i].src, op->v[i].len);
		break;
	case EMU_OP_RECORD:
		pthread_mutex_lock(&emu->ev_lock);
		op->rec->t_end = s->link_end;
		op->rec->done = true;
		emu_rec_put_locked(op->rec);
		pthread_cond_broadcast(&emu->ev_cond);
		pthread_mutex_unlock(&emu->ev_lock);
		break;
	case EMU_OP_WAIT:
		pthread_mutex_lock(&emu->ev_lock);
		waited = !op->rec->done;
		while (!op->rec->done) {
			if (!emu->opts.lazy) {
				pthread_cond_wait(&emu->ev_cond, &emu->ev_lock);
				continue;
			}
			/* nobody may be running the recording stream: run it (a worker of a
			 * lazy device, woken by a blocked waiter) */
			pthread_mutex_unlock(&emu->ev_lock);
			emu_help_stream(emu, op->rec->s, false);
			pthread_mutex_lock(&emu->ev_lock);
			if (!op->rec->done)
				emu_timedwait(&emu->ev_cond, &emu->ev_lock, EMU_LAZY_RETRY_NS);
		}
		/* the link starts after the recording stream's link reached the record (a lazy
		 * device ran that stream just now, so its clock, not now, says when) */
		if (op->rec->t_end > s->link_end)
			s->link_end = op->rec->t_end;
		emu_rec_put_locked(op->rec);
		pthread_mutex_unlock(&emu->ev_lock);
		t = waited ? kvt_now_ns() : 0; /* the link was idle until the event came */
		if (t > s->link_end)
			s->link_end = t;
		break;
	}
}

/* Wake s's worker if it sleeps (it may have ops to run). Caller holds s->lock. */
static void
emu_wake_locked(struct emu_stream *s)
{
	s->kick = true;
	if (s->w_sleeping) {
		s->w_sleeping = false;
		pthread_cond_signal(&s->wcond);
	}
}

/* An op of s finished (or a knob changed): tell the threads waiting for executed. Caller holds
 * s->lock. */
static void
emu_notify_locked(struct emu_stream *s)
{
	if (s->n_sync != 0)
		pthread_cond_broadcast(&s->cond);
}

/* Whether a test knob keeps s from starting its next op. Caller holds s->lock. */
static bool
emu_held(const struct emu_stream *s)
{
	return s->hold || (s->hold_at != 0 && s->executed >= s->hold_at);
}

static bool
emu_rec_done(struct emu_dev *emu, struct emu_rec *r)
{
	bool done;

	pthread_mutex_lock(&emu->ev_lock);
	done = r->done;
	pthread_mutex_unlock(&emu->ev_lock);
	return done;
}

/*
 * The waiting thread runs s's queued ops itself, in order, while s is idle, until s has
 * executed @target ops (what was queued when the wait began: the op waited for and any queued
 * behind it, since handing those back to the worker would cost them a wake-up; measured in
 * docs/PERF.md), a test knob holds s, or the next op is a WAIT for a record not done yet (it
 * is put back: the waiter then sleeps as before rather than block while owning the stream).
 * With lazy streams (kvt_emu_opts.lazy) a WAIT first runs the recording stream's ops the same
 * way. @due_only (event_query on a lazy device): run only ops the simulated link has finished
 * by now, never sleep, and leave the rest queued without waking the worker.
 * Does nothing while the worker or another waiter runs s, or when ops have random delays
 * (max_delay_us): those tests want the worker's timing. Caller holds s->lock, which is held
 * again on return.
 */
static void
emu_help_locked(struct emu_stream *s, uint64_t target, bool due_only)
{
	struct emu_dev *emu = s->dev;
	bool back, wait_back = false;
	struct emu_op *op;

	if (emu->opts.max_delay_us != 0 || s->busy)
		return;
	for (;;) {
		if (s->head == NULL || emu_held(s) || s->executed >= target)
			break;
		op = s->head;
		s->head = op->next;
		if (s->head == NULL)
			s->tail = NULL;
		s->busy = true;
		pthread_mutex_unlock(&s->lock);
		back = false;
		if (op->kind == EMU_OP_WAIT && !emu_rec_done(emu, op->rec)) {
			if (emu->opts.lazy)
				emu_help_stream(emu, op->rec->s, due_only);
			back = !emu_rec_done(emu, op->rec);
		} else if (due_only && op->kind == EMU_OP_COPY) {
			back = emu_copy_end(s, op) > kvt_now_ns();
		}
		if (back) {
			pthread_mutex_lock(&s->lock);
			op->next = s->head; /* back to the front: only the busy thread pops */
			s->head = op;
			if (s->tail == NULL)
				s->tail = op;
			wait_back = op->kind == EMU_OP_WAIT;
			break;
		}
		emu_op_run(s, op, true);
		free(op);
		atomic_fetch_add_explicit(&s->helped, 1, memory_order_relaxed);
		pthread_mutex_lock(&s->lock);
		s->executed++;
		emu_notify_locked(s);
	}
	s->busy = false;
	/* ops queued since the wait began or a WAIT put back; or a stop the worker, finding the
	 * stream busy, went back to sleep on (it would then never drain and exit). A lazy
	 * device's ops behind the target wait for whoever observes them; only a WAIT put back
	 * is handed to the worker (it can block on it, running the recording stream), and a
	 * poll leaves everything to the next waiter, whom it tells the stream is free (a
	 * blocked waiter that found it busy would otherwise sleep out its retry) */
	if ((s->head != NULL && !emu_held(s) && !due_only && (!emu->opts.lazy || wait_back)) ||
	    s->stop)
		emu_wake_locked(s);
	else if (due_only)
		emu_notify_locked(s);
}

/* emu_help_locked() for a waiter in event_sync on a record of stream @s (queued on it, not
 * done), which may have been destroyed since the record was read: used only while still on
 * the device's list (and, once busy is set, its destroy waits for the waiter to finish). */
static void
emu_help_stream(struct emu_dev *emu, struct emu_stream *s, bool due_only)
{
	struct emu_link *l;

	pthread_mutex_lock(&emu->lock);
	for (l = emu->streams.next; l != &emu->streams; l = l->next)
		if (l == &s->link)
			break;
	if (l == &emu->streams) {
		pthread_mutex_unlock(&emu->lock);
		return;
	}
	pthread_mutex_lock(&s->lock);
	pthread_mutex_unlock(&emu->lock);
	emu_help_locked(s, s->queued, due_only);
	pthread_mutex_unlock(&s->lock);
}

static void *
emu_stream_main(void *arg)
{
	struct emu_stream *s = arg;
	uint32_t max_delay = s->dev->opts.max_delay_us;
	bool lazy = s->dev->opts.lazy;
	struct emu_op *op;
	bool held;

	/* simulated link times are microseconds: the default 50 us timer slack would add more
	 * than the copy itself to every batch (a bandwidth-limited layer group sleeps once) */
	(void)prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);

	/* the lock is held from an op's end to the next op's start: a waiter can take the
	 * stream over only once its worker has found the queue empty (or held), never between
	 * two ops of a backlog, where the worker, left running, overlaps them with the host */
	pthread_mutex_lock(&s->lock);
	for (;;) {
		held = false;
		while (s->busy ||
		       ((s->head == NULL || emu_held(s) || (lazy && !s->kick)) && !s->stop)) {
			if (s->head == NULL)
				s->kick = false; /* done what it was asked for */
			/* work waits behind a hold (not a lazy stream's work awaiting a kick: its
			 * link time runs from its queue time) */
			held = held || (s->head != NULL && !s->busy && emu_held(s));
			s->w_sleeping = true;
			pthread_cond_wait(&s->wcond, &s->lock);
		}
		s->w_sleeping = false;
		if (held) /* the link stood still while held: it starts now */
			s->link_end = kvt_now_ns();
		op = s->head;
		if (op == NULL) { /* stopped and drained */
			pthread_mutex_unlock(&s->lock);
			break;
		}
		s->head = op->next;
		if (s->head == NULL)
			s->tail = NULL;
		s->busy = true;
		pthread_mutex_unlock(&s->lock);

		if (max_delay != 0) {
			emu_sleep_ns(emu_rng_next(&s->rng) % ((uint64_t)max_delay + 1) * 1000u);
			s->link_end = kvt_now_ns(); /* the test knob's delay is link time */
		}
		emu_op_run(s, op, false);
		free(op);

		pthread_mutex_lock(&s->lock);
		s->executed++;
		s->busy = false;
		emu_notify_locked(s);
	}
	return NULL;
}

static void
emu_stream_push(struct emu_stream *s, struct emu_op *op)
{
	op->next = NULL;
	op->t_queued = kvt_now_ns();
	pthread_mutex_lock(&s->lock);
	if (s->tail != NULL)
		s->tail->next = op;
	else
		s->head = op;
	s->tail = op;
	s->queued++;
	/* else its runner takes this op next (a waiter hands back what it leaves); a lazy
	 * device's ops wait for a thread that observes them */
	if (!s->busy && !s->dev->opts.lazy)
		emu_wake_locked(s);
	pthread_mutex_unlock(&s->lock);
}

/* Clear s's hold (test knob) so that it drains. */
static void
emu_stream_release(struct emu_stream *s)
{
	pthread_mutex_lock(&s->lock);
	s->hold = false;
	s->hold_at = 0;
	emu_wake_locked(s);
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
}

/* Drain, stop and join the worker, free s. s is no longer on the device's list. */
static void
emu_stream_free(struct emu_stream *s)
{
	pthread_mutex_lock(&s->lock);
	s->hold = false; /* a held stream would never drain */
	s->hold_at = 0;
	s->stop = true;
	emu_wake_locked(s);
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	pthread_join(s->thread, NULL);
	pthread_cond_destroy(&s->wcond);
	pthread_cond_destroy(&s->cond);
	pthread_mutex_destroy(&s->lock);
	free(s);
}

/* ------------------------------------------------------------------------------------------ */
/* streams                                                                                      */

static int
emu_stream_start(struct emu_stream *s)
{
	sigset_t all, old;
	char name[16];
	int rc;

	/* the worker must never run the host's signal handlers */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = pthread_create(&s->thread, NULL, emu_stream_main, s);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0)
		return rc;
	snprintf(name, sizeof name, "kvt-emu-s%u", s->id % 100000u);
	pthread_setname_np(s->thread, name);
	return 0;
}

static int
emu_stream_create(struct kvt_device *d, struct kvt_stream **out)
{
	struct emu_dev *emu = emu_dev_of(d);
	struct emu_stream *s;
	int rc;

	if (out == NULL)
		return kvt_err(-EINVAL, "emulated stream_create: out is NULL");
	*out = NULL;
	s = calloc(1, sizeof *s);
	if (s == NULL)
		return kvt_err(-ENOMEM, "emulated stream_create: no memory");
	s->dev = emu;
	emu_list_init(&s->link);
	if (pthread_mutex_init(&s->lock, NULL) != 0) {
		free(s);
		return kvt_err(-ENOMEM, "emulated stream_create: pthread_mutex_init failed");
	}
	if (emu_cond_init(&s->cond) != 0) {
		pthread_mutex_destroy(&s->lock);
		free(s);
		return kvt_err(-ENOMEM, "emulated stream_create: pthread_cond_init failed");
	}
	if (pthread_cond_init(&s->wcond, NULL) != 0) {
		pthread_cond_destroy(&s->cond);
		pthread_mutex_destroy(&s->lock);
		free(s);
		return kvt_err(-ENOMEM, "emulated stream_create: pthread_cond_init failed");
	}
	pthread_mutex_lock(&emu->lock);
	s->id = emu->next_stream_id++;
	pthread_mutex_unlock(&emu->lock);
	s->rng = emu_mix64(emu->opts.seed ^ emu_mix64((uint64_t)s->id + 1));
	rc = emu_stream_start(s);
	if (rc != 0) {
		pthread_cond_destroy(&s->wcond);
		pthread_cond_destroy(&s->cond);
		pthread_mutex_destroy(&s->lock);
		free(s);
		return kvt_err(-EAGAIN, "emulated stream_create: pthread_create: error %d", rc);
	}
	pthread_mutex_lock(&emu->lock);
	emu_list_add(&emu->streams, &s->link);
	pthread_mutex_unlock(&emu->lock);
	*out = (struct kvt_stream *)(void *)s;
	return 0;
}

static void
emu_stream_destroy(struct kvt_device *d, struct kvt_stream *stream)
{
	struct emu_dev *emu = emu_dev_of(d);
	struct emu_stream *s = (struct emu_stream *)(void *)stream;

	if (s == NULL)
		return;
	pthread_mutex_lock(&emu->lock);
	emu_list_del(&s->link);
	pthread_mutex_unlock(&emu->lock);
	emu_stream_free(s);
}

static int
emu_copy_batch_async(struct kvt_device *d, struct kvt_stream *stream, const struct kvt_copy *v,
		     uint32_t n)
{
	struct emu_stream *s = (struct emu_stream *)(void *)stream;
	struct emu_op *op;
	uint32_t i;

	(void)d;
	if (s == NULL || (v == NULL && n != 0))
		return kvt_err(-EINVAL, "emulated copy_batch_async: stream %p, v %p, n %u",
			       (void *)s, (const void *)v, n);
	if (n == 0)
		return 0;
	for (i = 0; i < n; i++)
		if (v[i].len != 0 && (v[i].dst == NULL || v[i].src == NULL))
			return kvt_err(-EINVAL, "emulated copy_batch_async: copy %u of %u has a "
				       "NULL address (len %zu)", i, n, v[i].len);
	op = malloc(sizeof *op + (size_t)n * sizeof op->v[0]);
	if (op == NULL)
		return kvt_err(-ENOMEM, "emulated copy_batch_async: no memory for %u copies", n);
	op->kind = EMU_OP_COPY;
	op->rec = NULL;
	op->n = n;
	op->total = 0;
	memcpy(op->v, v, (size_t)n * sizeof op->v[0]);
	for (i = 0; i < n; i++)
		op->total += v[i].len;
	emu_stream_push(s, op);
	return 0;
}

static int
emu_stream_sync(struct kvt_device *d, struct kvt_stream *stream)
{
	struct emu_stream *s = (struct emu_stream *)(void *)stream;
	uint64_t target;

	(void)d;
	if (s == NULL)
		return kvt_err(-EINVAL, "emulated stream_sync: stream is NULL");
	pthread_mutex_lock(&s->lock);
	target = s->queued;
	emu_help_locked(s, target, false);
	s->n_sync++;
	while (s->executed < target) {
		if (!s->dev->opts.lazy) {
			pthread_cond_wait(&s->cond, &s->lock);
			continue;
		}
		emu_timedwait(&s->cond, &s->lock, EMU_LAZY_RETRY_NS);
		emu_help_locked(s, target, false); /* a poll may have left them */
	}
	s->n_sync--;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* events                                                                                       */

static int
emu_event_create(struct kvt_device *d, struct kvt_event **out)
{
	struct emu_dev *emu = emu_dev_of(d);
	struct emu_event *e;

	if (out == NULL)
		return kvt_err(-EINVAL, "emulated event_create: out is NULL");
	*out = NULL;
	e = calloc(1, sizeof *e);
	if (e == NULL)
		return kvt_err(-ENOMEM, "emulated event_create: no memory");
	pthread_mutex_lock(&emu->lock);
	emu_list_add(&emu->events, &e->link);
	pthread_mutex_unlock(&emu->lock);
	*out = (struct kvt_event *)(void *)e;
	return 0;
}

static void
emu_event_destroy(struct kvt_device *d, struct kvt_event *event)
{
	struct emu_dev *emu = emu_dev_of(d);
	struct emu_event *e = (struct emu_event *)(void *)event;

	if (e == NULL)
		return;
	pthread_mutex_lock(&emu->lock);
	emu_list_del(&e->link);
	pthread_mutex_unlock(&emu->lock);
	/* queued RECORD/WAIT ops hold their own references to the record, so destroying an event
	 * with work in flight is safe (as cudaEventDestroy is) */
	pthread_mutex_lock(&emu->ev_lock);
	emu_rec_put_locked(e->latest);
	pthread_mutex_unlock(&emu->ev_lock);
	free(e);
}

static int
emu_event_record(struct kvt_device *d, struct kvt_event *event, struct kvt_stream *stream)
{
	struct emu_dev *emu = emu_dev_of(d);
	struct emu_event *e = (struct emu_event *)(void *)event;
	struct emu_stream *s = (struct emu_stream *)(void *)stream;
	struct emu_rec *r;
	struct emu_op *op;

	if (e == NULL || s == NULL)
		return kvt_err(-EINVAL, "emulated event_record: event %p, stream %p", (void *)e,
			       (void *)s);
	op = calloc(1, sizeof *op);
	r = calloc(1, sizeof *r);
	if (op == NULL || r == NULL) {
		free(op);
		free(r);
		return kvt_err(-ENOMEM, "emulated event_record: no memory");
	}
	pthread_mutex_lock(&emu->ev_lock);
	r->gen = ++e->records;
	r->s = s;
	r->refs = 2; /* the event (latest) and the RECORD op */
	emu_rec_put_locked(e->latest);
	e->latest = r;
	pthread_mutex_unlock(&emu->ev_lock);
	op->kind = EMU_OP_RECORD;
	op->rec = r;
	emu_stream_push(s, op);
	return 0;
}

static int
emu_event_query(struct kvt_device *d, struct kvt_event *event)
{
	struct emu_dev *emu = emu_dev_of(d);
	struct emu_event *e = (struct emu_event *)(void *)event;
	struct emu_rec *r;
	bool done;

	if (e == NULL)
		return kvt_err(-EINVAL, "emulated event_query: event is NULL");
	pthread_mutex_lock(&emu->ev_lock);
	r = e->latest;
	done = r == NULL || r->done;
	if (!done && emu->opts.lazy) { /* (lazy is off with max_delay_us: create) */
		/* run what the simulated link has finished by now, then look again */
		r->refs++;
		pthread_mutex_unlock(&emu->ev_lock);
		emu_help_stream(emu, r->s, true);
		pthread_mutex_lock(&emu->ev_lock);
		done = r->done;
		if (emu->sleepers != 0) /* the stream is free again: let them retry now */
			pthread_cond_broadcast(&emu->ev_cond);
		emu_rec_put_locked(r);
	}
	pthread_mutex_unlock(&emu->ev_lock);
	return done ? 0 : -EAGAIN; /* -EAGAIN is a state, not a failure: no message */
}

static int
emu_event_sync(struct kvt_device *d, struct kvt_event *event)
{
	struct emu_dev *emu = emu_dev_of(d);
	struct emu_event *e = (struct emu_event *)(void *)event;
	struct emu_stream *s;
	struct emu_rec *r;

	if (e == NULL)
		return kvt_err(-EINVAL, "emulated event_sync: event is NULL");
	pthread_mutex_lock(&emu->ev_lock);
	r = e->latest;
	if (r == NULL || r->done) {
		pthread_mutex_unlock(&emu->ev_lock);
		return 0;
	}
	r->refs++; /* a concurrent re-record or destroy must not free it under us */
	s = r->s;
	pthread_mutex_unlock(&emu->ev_lock);
	if (emu->opts.max_delay_us == 0)
		emu_help_stream(emu, s, false);
	pthread_mutex_lock(&emu->ev_lock);
	if (!r->done) {
		emu->sleepers++;
		while (!r->done) {
			if (!emu->opts.lazy) {
				pthread_cond_wait(&emu->ev_cond, &emu->ev_lock);
				continue;
			}
			emu_timedwait(&emu->ev_cond, &emu->ev_lock, EMU_LAZY_RETRY_NS);
			if (r->done)
				break;
			pthread_mutex_unlock(&emu->ev_lock); /* a poll may have left it queued */
			emu_help_stream(emu, s, false);
			pthread_mutex_lock(&emu->ev_lock);
		}
		emu->sleepers--;
	}
	emu_rec_put_locked(r);
	pthread_mutex_unlock(&emu->ev_lock);
	return 0;
}

static int
emu_stream_wait_event(struct kvt_device *d, struct kvt_stream *stream, struct kvt_event *event)
{
	struct emu_dev *emu = emu_dev_of(d);
	struct emu_event *e = (struct emu_event *)(void *)event;
	struct emu_stream *s = (struct emu_stream *)(void *)stream;
	struct emu_rec *r;
	struct emu_op *op;

	if (e == NULL || s == NULL)
		return kvt_err(-EINVAL, "emulated stream_wait_event: stream %p, event %p",
			       (void *)s, (void *)e);
	op = calloc(1, sizeof *op);
	if (op == NULL)
		return kvt_err(-ENOMEM, "emulated stream_wait_event: no memory");
	pthread_mutex_lock(&emu->ev_lock);
	r = e->latest;
	if (r == NULL || r->done) { /* nothing to wait for */
		pthread_mutex_unlock(&emu->ev_lock);
		free(op);
		return 0;
	}
	r->refs++;
	pthread_mutex_unlock(&emu->ev_lock);
	op->kind = EMU_OP_WAIT;
	op->rec = r;
	emu_stream_push(s, op);
	return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* device                                                                                       */

static void
emu_destroy(struct kvt_device *d)
{
	struct emu_dev *emu = emu_dev_of(d);
	struct emu_link *l;

	/* streams first: they drain their queues, which completes every record. Release every
	 * hold before draining any stream, since a stream may wait for a record on a held one. */
	pthread_mutex_lock(&emu->lock);
	for (l = emu->streams.next; l != &emu->streams; l = l->next)
		emu_stream_release((struct emu_stream *)l);
	while ((l = emu->streams.next) != &emu->streams) {
		emu_list_del(l);
		pthread_mutex_unlock(&emu->lock);
		emu_stream_free((struct emu_stream *)l);
		pthread_mutex_lock(&emu->lock);
	}
	while ((l = emu->events.next) != &emu->events) {
		emu_list_del(l);
		pthread_mutex_lock(&emu->ev_lock);
		emu_rec_put_locked(((struct emu_event *)l)->latest);
		pthread_mutex_unlock(&emu->ev_lock);
		free(l);
	}
	while ((l = emu->mems.next) != &emu->mems) {
		emu_list_del(l);
		free(l);
	}
	while ((l = emu->maps.next) != &emu->maps) {
		emu_list_del(l);
		munmap(((struct emu_map *)l)->p, ((struct emu_map *)l)->len);
		free(l);
	}
	pthread_mutex_unlock(&emu->lock);
	pthread_cond_destroy(&emu->ev_cond);
	pthread_mutex_destroy(&emu->ev_lock);
	pthread_mutex_destroy(&emu->lock);
	free(emu);
}

/* Whether this process may lock memory now (caps.pinned_host): try one page. */
static bool
emu_probe_mlock(void)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	void *p = mmap(NULL, pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	bool ok;

	if (p == MAP_FAILED)
		return false;
	ok = emu_mlock(p, pg);
	munmap(p, pg);
	return ok;
}

int
kvt_device_emu_create(const struct kvt_emu_opts *o, struct kvt_device **out)
{
	struct emu_dev *emu;

	if (out == NULL)
		return kvt_err(-EINVAL, "kvt_device_emu_create: out is NULL");
	*out = NULL;
	emu = calloc(1, sizeof *emu);
	if (emu == NULL)
		return kvt_err(-ENOMEM, "kvt_device_emu_create: no memory");
	if (o != NULL)
		emu->opts = *o;
	else
		emu->opts.seed = 1;
	if (emu->opts.max_delay_us != 0) /* no thread runs another's ops then: nobody would */
		emu->opts.lazy = false;
	if (pthread_mutex_init(&emu->lock, NULL) != 0)
		goto fail_lock;
	if (pthread_mutex_init(&emu->ev_lock, NULL) != 0)
		goto fail_ev_lock;
	if (emu_cond_init(&emu->ev_cond) != 0)
		goto fail_ev_cond;
	emu_list_init(&emu->streams);
	emu_list_init(&emu->events);
	emu_list_init(&emu->mems);
	emu_list_init(&emu->maps);
	emu->dev.ops = &emu_ops;
	emu->dev.ctx = emu;
	emu->dev.caps.async = true;
	emu->dev.caps.device_mem_is_host = true;
	emu->dev.caps.pinned_host = emu_probe_mlock();
	*out = &emu->dev;
	return 0;

fail_ev_cond:
	pthread_mutex_destroy(&emu->ev_lock);
fail_ev_lock:
	pthread_mutex_destroy(&emu->lock);
fail_lock:
	free(emu);
	return kvt_err(-ENOMEM, "kvt_device_emu_create: cannot initialise locks");
}

uint32_t
kvt_device_emu_sleepers(struct kvt_device *d)
{
	struct emu_dev *emu;
	uint32_t n;

	if (!d || d->ops != &emu_ops)
		return 0;
	emu = emu_dev_of(d);
	pthread_mutex_lock(&emu->ev_lock);
	n = emu->sleepers;
	pthread_mutex_unlock(&emu->ev_lock);
	return n;
}

/* A stream's counter (@helped: waiters' ops, else link-time sleeps); 0 off the emulator. */
static uint64_t
emu_stream_count(struct kvt_device *d, struct kvt_stream *stream, bool helped)
{
	struct emu_stream *s = (struct emu_stream *)(void *)stream;

	if (!d || d->ops != &emu_ops || !s)
		return 0;
	return atomic_load_explicit(helped ? &s->helped : &s->sleeps, memory_order_relaxed);
}

uint64_t
kvt_device_emu_stream_helped(struct kvt_device *d, struct kvt_stream *stream)
{
	return emu_stream_count(d, stream, true);
}

uint64_t
kvt_device_emu_stream_sleeps(struct kvt_device *d, struct kvt_stream *stream)
{
	return emu_stream_count(d, stream, false);
}

int
kvt_device_emu_stream_hold(struct kvt_device *d, struct kvt_stream *stream, bool hold)
{
	struct emu_stream *s = (struct emu_stream *)(void *)stream;

	if (d == NULL || d->ops != &emu_ops)
		return kvt_err(KVT_ENOTSUP, "stream hold: only the emulated device has it");
	if (s == NULL)
		return kvt_err(-EINVAL, "stream hold: stream is NULL");
	pthread_mutex_lock(&s->lock);
	s->hold = hold;
	s->hold_at = 0;
	emu_wake_locked(s);
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

int
kvt_device_emu_stream_step(struct kvt_device *d, struct kvt_stream *stream, uint32_t n_ops)
{
	struct emu_stream *s = (struct emu_stream *)(void *)stream;

	if (d == NULL || d->ops != &emu_ops)
		return kvt_err(KVT_ENOTSUP, "stream step: only the emulated device has it");
	if (s == NULL || n_ops == 0)
		return kvt_err(-EINVAL, "stream step: stream %p, %u operations", (void *)s, n_ops);
	pthread_mutex_lock(&s->lock);
	if (!s->hold) {
		pthread_mutex_unlock(&s->lock);
		return kvt_err(-EINVAL, "stream step: the stream is not held");
	}
	s->hold = false;
	s->hold_at = s->executed + n_ops; /* held: nothing runs now, so executed is exact */
	emu_wake_locked(s);
	s->n_sync++;
	while (s->executed < s->hold_at && s->head != NULL)
		pthread_cond_wait(&s->cond, &s->lock);
	s->n_sync--;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

static const struct kvt_device_ops emu_ops = {
	.abi_version = KVT_DEVICE_OPS_V1,
	.name = "emulated",
	.destroy = emu_destroy,
	.mem_alloc = emu_mem_alloc,
	.mem_free = emu_mem_free,
	.host_alloc = emu_host_alloc,
	.host_free = emu_host_free,
	.stream_create = emu_stream_create,
	.stream_destroy = emu_stream_destroy,
	.copy_batch_async = emu_copy_batch_async,
	.stream_sync = emu_stream_sync,
	.event_create = emu_event_create,
	.event_destroy = emu_event_destroy,
	.event_record = emu_event_record,
	.event_query = emu_event_query,
	.event_sync = emu_event_sync,
	.stream_wait_event = emu_stream_wait_event,
};
