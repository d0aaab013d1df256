/* SPDX-License-Identifier: MIT */
/*
 * tests/cuemu/cudart.cc - the emulated CUDA runtime (KVT_CUDA_EMU builds): state, streams,
 * events, synchronisation, the last and the sticky error. Memory and copies are in
 * cudart_mem.cc; fault injection, error names and the device in cudart_dev.cc. The contract
 * with the kernel half is cuemu.h; the model is described in cudart_int.h.
 *
 * Semantics kept from CUDA: streams are in-order queues that really run later (on one worker
 * thread each); the legacy default stream (NULL) waits for earlier work of every blocking
 * stream and blocking streams wait for earlier legacy work; non-blocking streams never
 * synchronise with it; cudaStreamWaitEvent waits for the record the event had at the time of
 * the call; a kernel fault makes cudaErrorLaunchFailure sticky (every operation not started
 * yet is dropped, not run). Deviations: one device; cudaStreamPerThread is the legacy stream;
 * stream priorities, graphs and capture do not exist.
 *
 * KVT_CUEMU_DELAY_US=n (read when a stream is created; default 0): before each operation a
 * stream's worker sleeps a pseudo-random 0..n microseconds (its own xorshift, seeded from the
 * stream's handle), as transfer/device_emu.c does, so that work of different streams finishes
 * late and in varying order: a missing wait shows up as a wrong result, not as luck.
 */
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cudart_int.h"

#define CUEMU_STREAM_BASE 0x5c0000000000ull /* stream handles: base + 16 * id (opaque) */
#define CUEMU_EVENT_BASE 0x5e0000000000ull  /* event handles: base + 16 * id (opaque) */
#define CUEMU_EXIT_WAIT 5                   /* s: how long exit waits for busy workers */
#define CUEMU_DELAY_MAX 1000000u            /* us: largest KVT_CUEMU_DELAY_US accepted */

static std::atomic<cuemu_state *> cuemu_g{ nullptr }; /* the runtime state, once created */
static thread_local cudaError_t cuemu_last;    /* the thread's last error */
static thread_local bool cuemu_on_worker;      /* this thread is a stream's worker */

/* ------------------------------------------------------------------------------------------ */
/* errors                                                                                       */

void
kvt_cuemu_reset(void)
{
	cuemu_state *g = cuemu_g;

	cuemu_rules_clear();
	if (g != nullptr)
		g->sticky = cudaSuccess;
	cuemu_last = cudaSuccess;
}

cudaError_t
kvt_cuemu_fail_check(const char *api)
{
	cudaError_t e = cuemu_enter(api, CUEMU_STICKY);

	return cuemu_ret(e);
}

void
kvt_cuemu_set_error(cudaError_t e)
{
	(void)cuemu_ret(e); /* cudaSuccess / cudaErrorNotReady leave a pending error in place */
}

static std::mutex cuemu_fault_mu;  /* guards cuemu_fault_msg */
static char cuemu_fault_msg[1024]; /* the latest kernel fault's message (kvt_cuemu_last_fault) */

void
kvt_cuemu_kernel_fault(const char *msg)
{
	fprintf(stderr, "cuemu: kernel fault: %s\n", msg != nullptr ? msg : "(no message)");
	{
		std::lock_guard<std::mutex> lk(cuemu_fault_mu);

		snprintf(cuemu_fault_msg, sizeof cuemu_fault_msg, "%s",
			 msg != nullptr ? msg : "(no message)");
	}
	cuemu_get()->sticky = cudaErrorLaunchFailure;
}

cudaError_t
cuemu_ret(cudaError_t e)
{
	if (e != cudaSuccess && e != cudaErrorNotReady)
		cuemu_last = e;
	return e;
}

cudaError_t
cuemu_sticky(void)
{
	cuemu_state *g = cuemu_g;

	return g != nullptr ? (cudaError_t)g->sticky.load() : cudaSuccess;
}

cudaError_t
cuemu_enter(const char *api, cuemu_need need)
{
	cudaError_t e = cuemu_injected(api);

	if (e != cudaSuccess || need == CUEMU_NONE)
		return e;
	if (cuemu_on_worker)
		return cudaErrorNotPermitted; /* from stream work, as from a CUDA host callback */
	if (cuemu_ndev() == 0)
		return cudaErrorNoDevice;
	if (cuemu_get()->down)
		return cudaErrorCudartUnloading;
	if (need == CUEMU_STICKY)
		return cuemu_sticky();
	return cudaSuccess;
}

/** cudaGetLastError() - the thread's last error (or the sticky one), cleared. */
cudaError_t
cudaGetLastError(void)
{
	cudaError_t e = cuemu_last, s = cuemu_sticky();

	cuemu_last = cudaSuccess;
	return s != cudaSuccess ? s : e;
}

/** cudaPeekAtLastError() - the thread's last error (or the sticky one), kept. */
cudaError_t
cudaPeekAtLastError(void)
{
	cudaError_t s = cuemu_sticky();

	return s != cudaSuccess ? s : cuemu_last;
}

/* ------------------------------------------------------------------------------------------ */
/* state and workers                                                                            */

/* All of op's dependencies complete? (lock held) */
static bool
cuemu_ready(const cuemu_op &op)
{
	for (const cuemu_dep &d : op.deps)
		if (d.s->done < d.seq)
			return false;
	return true;
}

/* KVT_CUEMU_DELAY_US: max delay before a stream op in us (0: none; bad values: 0, warned). */
static unsigned
cuemu_delay_env(void)
{
	static std::atomic<bool> warned{ false }; /* the bad value was reported */
	const char *v = getenv("KVT_CUEMU_DELAY_US");
	char *end = nullptr;
	unsigned long n;

	if (v == nullptr || *v == '\0')
		return 0;
	n = strtoul(v, &end, 10);
	if (*end != '\0' || *v == '-' || n > CUEMU_DELAY_MAX) {
		if (!warned.exchange(true))
			fprintf(stderr, "cuemu: KVT_CUEMU_DELAY_US=%s: not 0..%u: no delays\n",
				v, CUEMU_DELAY_MAX);
		return 0;
	}
	return (unsigned)n;
}

/* xorshift64: next pseudo-random value of *x (never 0 once seeded non-zero). */
static uint64_t
cuemu_rng_next(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

/* A stream's worker: run its queue in order; exit once closing (or down) and empty. */
static void
cuemu_worker(std::shared_ptr<cuemu_stream> s)
{
	cuemu_state *g = cuemu_g;
	uint64_t rng = (s->handle + 1) * 0x9e3779b97f4a7c15ull; /* odd * non-zero: non-zero */
	std::unique_lock<std::mutex> lk(g->mu);

	cuemu_on_worker = true;
	for (;;) {
		g->cv.wait(lk, [&] {
			if (s->q.empty())
				return s->closing || g->down;
			return g->down || cuemu_ready(s->q.front());
		});
		if (s->q.empty())
			break;
		{
			cuemu_op op = std::move(s->q.front());
			auto live = [g] { return !g->down && g->sticky.load() == cudaSuccess; };

			s->q.pop_front();
			lk.unlock();
			if (s->delay_us != 0 && live())
				std::this_thread::sleep_for(std::chrono::microseconds(
					cuemu_rng_next(&rng) % (s->delay_us + 1ull)));
			if (live() && op.run) /* a fault during the delay drops it too */
				op.run();
			if (op.fin)
				op.fin();
			op.run = nullptr; /* captured state goes without the lock */
			op.fin = nullptr;
			op.deps.clear();
			lk.lock();
			if (op.rec)
				op.rec->t = std::chrono::steady_clock::now();
		}
		s->done++;
		g->cv.notify_all();
	}
	s->exited = true;
	g->cv.notify_all();
}

/* Join the workers that exited (cudaStreamDestroy'ed and drained). Lock not held. */
static void
cuemu_reap(cuemu_state *g)
{
	std::vector<std::thread> done;

	{
		std::lock_guard<std::mutex> lk(g->mu);
		for (size_t i = 0; i < g->workers.size();) {
			if (g->workers[i]->exited) {
				done.push_back(std::move(g->workers[i]->th));
				g->workers.erase(g->workers.begin() + (long)i);
			} else {
				i++;
			}
		}
	}
	for (std::thread &t : done)
		t.join();
}

/*
 * atexit: drop what is still queued, stop and join every worker, release streams and events.
 * A worker still inside an operation after CUEMU_EXIT_WAIT (a test that failed while holding a
 * stream, a kernel that never ends) is left behind with a line on stderr, not waited for.
 */
static void
cuemu_shutdown(void)
{
	cuemu_state *g = cuemu_g;
	std::vector<std::thread> th;
	std::unique_lock<std::mutex> lk(g->mu);
	auto all_exited = [g] {
		for (auto &w : g->workers)
			if (!w->exited)
				return false;
		return true;
	};

	g->down = true;
	g->cv.notify_all();
	if (!cuemu_on_worker)
		g->cv.wait_for(lk, std::chrono::seconds(CUEMU_EXIT_WAIT), all_exited);
	for (auto &w : g->workers) {
		if (w->exited) {
			th.push_back(std::move(w->th));
			continue;
		}
		fprintf(stderr, "cuemu: at exit, a stream worker is still busy: left running\n");
		w->th.detach();
	}
	g->workers.clear();
	g->streams.clear();
	g->events.clear();
	g->legacy.reset();
	lk.unlock();
	for (std::thread &t : th)
		t.join();
}

/* Start a worker for @s (lock held); false if the thread cannot be created. */
static bool
cuemu_start(cuemu_state *g, const std::shared_ptr<cuemu_stream> &s)
{
	try {
		s->th = std::thread(cuemu_worker, s);
	} catch (const std::exception &) {
		return false;
	}
	g->workers.push_back(s);
	return true;
}

static cuemu_state *
cuemu_init(void)
{
	cuemu_state *g = new cuemu_state;

	cuemu_g = g;
	g->legacy = std::make_shared<cuemu_stream>();
	g->legacy->delay_us = cuemu_delay_env();
	if (!cuemu_start(g, g->legacy)) {
		fprintf(stderr, "cuemu: cannot start the legacy stream's worker\n");
		abort(); /* test infrastructure: nothing can run without it */
	}
	atexit(cuemu_shutdown);
	return g;
}

cuemu_state *
cuemu_get(void)
{
	static cuemu_state *g = cuemu_init();

	return g;
}

/* The stream of handle @s, or NULL (lock held). */
static std::shared_ptr<cuemu_stream>
cuemu_stream_of(cuemu_state *g, cudaStream_t s)
{
	uintptr_t h = (uintptr_t)s;

	if (h == 0 || s == cudaStreamLegacy || s == cudaStreamPerThread)
		return g->legacy;
	auto it = g->streams.find(h);
	return it != g->streams.end() ? it->second : nullptr;
}

/* The event of handle @e, or NULL (lock held). */
static std::shared_ptr<cuemu_event>
cuemu_event_of(cuemu_state *g, cudaEvent_t e)
{
	auto it = g->events.find((uintptr_t)e);

	return it != g->events.end() ? it->second : nullptr;
}

/*
 * Queue @op on @st with the legacy stream's implicit dependencies (lock held); op.rec, if set,
 * is filled with the operation's position. Returns its operation number.
 */
static uint64_t
cuemu_push(cuemu_state *g, const std::shared_ptr<cuemu_stream> &st, cuemu_op &&op)
{
	uint64_t seq = ++st->queued;

	if (st == g->legacy) {
		for (auto &w : g->workers)
			if (w != st && w->blocking && w->queued > w->done)
				op.deps.push_back(cuemu_dep{ w, w->queued });
	} else if (st->blocking && g->legacy->queued > g->legacy->done) {
		op.deps.push_back(cuemu_dep{ g->legacy, g->legacy->queued });
	}
	if (op.rec) {
		op.rec->s = st;
		op.rec->seq = seq;
	}
	st->q.push_back(std::move(op));
	g->cv.notify_all();
	return seq;
}

cudaError_t
cuemu_submit(cudaStream_t s, cuemu_op op, cuemu_record *mark)
{
	cuemu_state *g = cuemu_get();
	std::unique_lock<std::mutex> lk(g->mu);
	bool down = g->down; /* first: shutdown forgot every stream */
	std::shared_ptr<cuemu_stream> st = down ? nullptr : cuemu_stream_of(g, s);

	if (!st) {
		lk.unlock();
		if (op.fin)
			op.fin();
		return down ? cudaErrorCudartUnloading : cudaErrorInvalidResourceHandle;
	}
	uint64_t seq = cuemu_push(g, st, std::move(op));
	if (mark != nullptr)
		*mark = cuemu_record{ st, seq, {} };
	return cudaSuccess;
}

cudaError_t
cuemu_wait(const cuemu_record &r)
{
	cuemu_state *g = cuemu_get();
	std::unique_lock<std::mutex> lk(g->mu);

	g->cv.wait(lk, [&] { return r.s->done >= r.seq || g->down; });
	return cuemu_sticky();
}

void
cuemu_drain(void)
{
	cuemu_state *g = cuemu_get();
	std::unique_lock<std::mutex> lk(g->mu);
	std::vector<cuemu_dep> all;

	for (auto &w : g->workers)
		all.push_back(cuemu_dep{ w, w->queued });
	g->cv.wait(lk, [&] {
		for (const cuemu_dep &d : all)
			if (d.s->done < d.seq)
				return g->down.load();
		return true;
	});
}

/* Queue a marker on @s and wait for it: cudaStreamSynchronize of the legacy stream. */
static cudaError_t
cuemu_sync_marker(cudaStream_t s)
{
	cuemu_record mark;
	cudaError_t e = cuemu_submit(s, cuemu_op{}, &mark);

	return e != cudaSuccess ? e : cuemu_wait(mark);
}

/** kvt_cuemu_enqueue() - see cuemu.h; also cudaErrorInvalidValue (@run NULL). */
cudaError_t
kvt_cuemu_enqueue(cudaStream_t s, kvt_cuemu_fn run, kvt_cuemu_fn drop, void *ctx)
{
	cuemu_op op;

	if (run == nullptr) {
		if (drop != nullptr)
			drop(ctx);
		return cudaErrorInvalidValue;
	}
	op.run = [run, ctx] { run(ctx); };
	if (drop != nullptr)
		op.fin = [drop, ctx] { drop(ctx); };
	return cuemu_submit(s, std::move(op), nullptr);
}

/* ------------------------------------------------------------------------------------------ */
/* streams                                                                                      */

static cudaError_t
cuemu_stream_create(const char *api, cudaStream_t *ps, unsigned flags)
{
	cudaError_t e = cuemu_enter(api, CUEMU_STICKY);

	if (e != cudaSuccess)
		return cuemu_ret(e);
	if (ps == nullptr || (flags & ~(unsigned)cudaStreamNonBlocking) != 0)
		return cuemu_ret(cudaErrorInvalidValue);
	cuemu_state *g = cuemu_get();
	cuemu_reap(g);
	auto s = std::make_shared<cuemu_stream>();
	s->blocking = (flags & cudaStreamNonBlocking) == 0;
	s->delay_us = cuemu_delay_env();
	std::lock_guard<std::mutex> lk(g->mu);
	s->handle = CUEMU_STREAM_BASE + 16 * ++g->next_id;
	if (!cuemu_start(g, s))
		return cuemu_ret(cudaErrorMemoryAllocation);
	g->streams[s->handle] = s;
	*ps = (cudaStream_t)s->handle;
	return cudaSuccess;
}

/** cudaStreamCreateWithFlags() - a new stream (@flags: 0 or cudaStreamNonBlocking). */
cudaError_t
cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
	return cuemu_stream_create("cudaStreamCreateWithFlags", pStream, flags);
}

/** cudaStreamCreate() - a new blocking stream. */
cudaError_t
cudaStreamCreate(cudaStream_t *pStream)
{
	return cuemu_stream_create("cudaStreamCreate", pStream, 0);
}

/** cudaStreamDestroy() - forget @stream; its queued work still runs, then its worker exits. */
cudaError_t
cudaStreamDestroy(cudaStream_t stream)
{
	cudaError_t e = cuemu_enter("cudaStreamDestroy", CUEMU_DEV);
	cuemu_state *g;

	if (e != cudaSuccess)
		return cuemu_ret(e);
	g = cuemu_get();
	{
		std::lock_guard<std::mutex> lk(g->mu);
		auto it = g->streams.find((uintptr_t)stream);
		if (it == g->streams.end())
			return cuemu_ret(cudaErrorInvalidResourceHandle);
		it->second->closing = true;
		g->streams.erase(it);
		g->cv.notify_all();
	}
	cuemu_reap(g);
	return cuemu_ret(cuemu_sticky());
}

/*
 * The synchronising calls wait even with a sticky error (the workers drop what is queued, so
 * the wait is short), then return it: once they return, nothing queued runs any more.
 */

/** cudaStreamSynchronize() - wait for the work queued on @stream so far. */
cudaError_t
cudaStreamSynchronize(cudaStream_t stream)
{
	cudaError_t e = cuemu_enter("cudaStreamSynchronize", CUEMU_DEV);
	cuemu_state *g;
	cuemu_record r;

	if (e != cudaSuccess)
		return cuemu_ret(e);
	g = cuemu_get();
	{
		std::lock_guard<std::mutex> lk(g->mu);
		r.s = cuemu_stream_of(g, stream);
		if (!r.s)
			return cuemu_ret(cudaErrorInvalidResourceHandle);
		r.seq = r.s->queued;
	}
	if (r.s == g->legacy) /* also waits for the blocking streams, as legacy work does */
		return cuemu_ret(cuemu_sync_marker(stream));
	return cuemu_ret(cuemu_wait(r));
}

/** cudaStreamQuery() - cudaSuccess if @stream is idle, else cudaErrorNotReady. */
cudaError_t
cudaStreamQuery(cudaStream_t stream)
{
	cudaError_t e = cuemu_enter("cudaStreamQuery", CUEMU_STICKY);
	cuemu_state *g;

	if (e != cudaSuccess)
		return cuemu_ret(e);
	g = cuemu_get();
	std::lock_guard<std::mutex> lk(g->mu);
	std::shared_ptr<cuemu_stream> s = cuemu_stream_of(g, stream);
	if (!s)
		return cuemu_ret(cudaErrorInvalidResourceHandle);
	if (s->done < s->queued)
		return cudaErrorNotReady;
	if (s != g->legacy)
		return cudaSuccess;
	for (auto &w : g->workers) /* legacy: also the blocking streams' earlier work */
		if (w->blocking && w->done < w->queued)
			return cudaErrorNotReady;
	return cudaSuccess;
}

/** cudaStreamWaitEvent() - later work on @stream waits for @event's current record. */
cudaError_t
cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
	cudaError_t e = cuemu_enter("cudaStreamWaitEvent", CUEMU_STICKY);
	cuemu_state *g;
	cuemu_op op;

	if (e != cudaSuccess)
		return cuemu_ret(e);
	if ((flags & ~(unsigned)cudaEventWaitExternal) != 0)
		return cuemu_ret(cudaErrorInvalidValue);
	g = cuemu_get();
	std::unique_lock<std::mutex> lk(g->mu);
	std::shared_ptr<cuemu_stream> s = cuemu_stream_of(g, stream);
	std::shared_ptr<cuemu_event> ev = cuemu_event_of(g, event);
	if (!s || !ev)
		return cuemu_ret(cudaErrorInvalidResourceHandle);
	if (!ev->rec)
		return cudaSuccess; /* never recorded: nothing to wait for */
	op.deps.push_back(cuemu_dep{ ev->rec->s, ev->rec->seq });
	cuemu_push(g, s, std::move(op));
	return cudaSuccess;
}

/** cudaDeviceSynchronize() - wait for all work queued on every stream. */
cudaError_t
cudaDeviceSynchronize(void)
{
	cudaError_t e = cuemu_enter("cudaDeviceSynchronize", CUEMU_DEV);

	if (e != cudaSuccess)
		return cuemu_ret(e);
	cuemu_drain();
	return cuemu_ret(cuemu_sticky());
}

/* ------------------------------------------------------------------------------------------ */
/* events                                                                                       */

static cudaError_t
cuemu_event_create(const char *api, cudaEvent_t *pe, unsigned flags)
{
	cudaError_t e = cuemu_enter(api, CUEMU_STICKY);
	const unsigned all = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;

	if (e != cudaSuccess)
		return cuemu_ret(e);
	if (pe == nullptr || (flags & ~all) != 0 ||
	    ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming)))
		return cuemu_ret(cudaErrorInvalidValue);
	cuemu_state *g = cuemu_get();
	auto ev = std::make_shared<cuemu_event>();
	ev->flags = flags;
	std::lock_guard<std::mutex> lk(g->mu);
	uintptr_t h = CUEMU_EVENT_BASE + 16 * ++g->next_id;
	g->events[h] = ev;
	*pe = (cudaEvent_t)h;
	return cudaSuccess;
}

/** cudaEventCreate() - a new event with timing. */
cudaError_t
cudaEventCreate(cudaEvent_t *event)
{
	return cuemu_event_create("cudaEventCreate", event, cudaEventDefault);
}

/** cudaEventCreateWithFlags() - a new event (@flags: cudaEvent*). */
cudaError_t
cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
	return cuemu_event_create("cudaEventCreateWithFlags", event, flags);
}

/** cudaEventDestroy() - forget @event (a record in flight still completes). */
cudaError_t
cudaEventDestroy(cudaEvent_t event)
{
	cudaError_t e = cuemu_enter("cudaEventDestroy", CUEMU_DEV);

	if (e != cudaSuccess)
		return cuemu_ret(e);
	cuemu_state *g = cuemu_get();
	std::lock_guard<std::mutex> lk(g->mu);
	if (g->events.erase((uintptr_t)event) == 0)
		return cuemu_ret(cudaErrorInvalidResourceHandle);
	return cuemu_ret(cuemu_sticky());
}

/** cudaEventRecord() - @event marks all work queued on @stream so far. */
cudaError_t
cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
	cudaError_t e = cuemu_enter("cudaEventRecord", CUEMU_STICKY);
	cuemu_op op;

	if (e != cudaSuccess)
		return cuemu_ret(e);
	cuemu_state *g = cuemu_get();
	std::lock_guard<std::mutex> lk(g->mu);
	std::shared_ptr<cuemu_stream> s = cuemu_stream_of(g, stream);
	std::shared_ptr<cuemu_event> ev = cuemu_event_of(g, event);
	if (!s || !ev)
		return cuemu_ret(cudaErrorInvalidResourceHandle);
	op.rec = std::make_shared<cuemu_record>();
	ev->rec = op.rec;
	cuemu_push(g, s, std::move(op));
	return cudaSuccess;
}

/* what the event functions need of an event, copied under the lock */
struct cuemu_event_view {
	std::shared_ptr<cuemu_record> rec; /* its latest record; NULL: never recorded */
	unsigned flags;                    /* its creation flags */
	bool done;                         /* rec completed (rec->t is final) or NULL */
};

/* Look @event up: *@v gets its view; cudaErrorInvalidResourceHandle if unknown. */
static cudaError_t
cuemu_event_look(cudaEvent_t event, cuemu_event_view *v)
{
	cuemu_state *g = cuemu_get();
	std::lock_guard<std::mutex> lk(g->mu);
	std::shared_ptr<cuemu_event> ev = cuemu_event_of(g, event);

	if (!ev)
		return cudaErrorInvalidResourceHandle;
	v->rec = ev->rec;
	v->flags = ev->flags;
	v->done = !ev->rec || ev->rec->s->done >= ev->rec->seq;
	return cudaSuccess;
}

/** cudaEventQuery() - cudaSuccess once @event's record completed (or it has none). */
cudaError_t
cudaEventQuery(cudaEvent_t event)
{
	cudaError_t e = cuemu_enter("cudaEventQuery", CUEMU_STICKY);
	cuemu_event_view v;

	if (e == cudaSuccess)
		e = cuemu_event_look(event, &v);
	if (e != cudaSuccess)
		return cuemu_ret(e);
	return v.done ? cudaSuccess : cudaErrorNotReady;
}

/** cudaEventSynchronize() - block until @event's record completed. */
cudaError_t
cudaEventSynchronize(cudaEvent_t event)
{
	cudaError_t e = cuemu_enter("cudaEventSynchronize", CUEMU_DEV);
	cuemu_event_view v;

	if (e == cudaSuccess)
		e = cuemu_event_look(event, &v);
	if (e != cudaSuccess)
		return cuemu_ret(e);
	return cuemu_ret(v.rec ? cuemu_wait(*v.rec) : cuemu_sticky());
}

/** cudaEventElapsedTime() - ms between the completions of @start's and @end's records. */
cudaError_t
cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
	cudaError_t e = cuemu_enter("cudaEventElapsedTime", CUEMU_STICKY);
	cuemu_event_view a, b;

	if (e == cudaSuccess)
		e = cuemu_event_look(start, &a);
	if (e == cudaSuccess)
		e = cuemu_event_look(end, &b);
	if (e == cudaSuccess && ms == nullptr)
		e = cudaErrorInvalidValue;
	if (e == cudaSuccess &&
	    (((a.flags | b.flags) & cudaEventDisableTiming) || !a.rec || !b.rec))
		e = cudaErrorInvalidResourceHandle;
	if (e != cudaSuccess)
		return cuemu_ret(e);
	if (!a.done || !b.done)
		return cudaErrorNotReady;
	*ms = std::chrono::duration<float, std::milli>(b.rec->t - a.rec->t).count();
	return cudaSuccess;
}

/** kvt_cuemu_last_fault() - see cuemu.h. */
void
kvt_cuemu_last_fault(char *buf, size_t len)
{
	std::lock_guard<std::mutex> lk(cuemu_fault_mu);

	if (buf != nullptr && len > 0)
		snprintf(buf, len, "%s", cuemu_fault_msg);
}
