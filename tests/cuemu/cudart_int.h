/* SPDX-License-Identifier: MIT */
/*
 * tests/cuemu/cudart_int.h - what the files of the emulated CUDA runtime share (cudart.cc:
 * state, streams, events, last error; cudart_mem.cc: memory and copies; cudart_dev.cc: fault
 * injection, error names, the device).
 * C++ only; not part of the contract with the kernel half (that is cuemu.h).
 *
 * Model: one global lock (cuemu_g->mu) and one condition variable guard every stream queue,
 * counter and event; a stream is an in-order queue of cuemu_op run by its own worker thread.
 * Operation number n of a stream is done once its `done` counter reached n. An operation can
 * wait for other streams' operations (cuemu_dep): the legacy stream's implicit
 * synchronisation and cudaStreamWaitEvent are both expressed that way.
 */
#ifndef KVT_TESTS_CUEMU_CUDART_INT_H
#define KVT_TESTS_CUEMU_CUDART_INT_H

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cuemu.h"

struct cuemu_stream;

/* what an operation waits for: stream s has completed its operation number seq */
struct cuemu_dep {
	std::shared_ptr<cuemu_stream> s; /* the stream waited for */
	uint64_t seq;                    /* its operation number (1-based) */
};

/* one cudaEventRecord: the point of a stream it marks, and when the stream got there */
struct cuemu_record {
	std::shared_ptr<cuemu_stream> s;         /* the recorded stream */
	uint64_t seq;                            /* the record's operation number on s */
	std::chrono::steady_clock::time_point t; /* completion time (once s->done >= seq) */
};

/* one stream operation */
struct cuemu_op {
	std::function<void()> run;         /* the work, on the worker; empty: a marker */
	std::function<void()> fin;         /* after run, or instead of it when dropped */
	std::vector<cuemu_dep> deps;       /* all complete before run starts */
	std::shared_ptr<cuemu_record> rec; /* set: filled when queued, rec->t at completion */
};

/* a stream: an in-order queue and its worker thread */
struct cuemu_stream {
	uintptr_t handle = 0;    /* the cudaStream_t value; 0 for the legacy stream */
	bool blocking = true;    /* synchronises with the legacy stream */
	unsigned delay_us = 0;   /* max random delay before each op (KVT_CUEMU_DELAY_US) */
	std::deque<cuemu_op> q;  /* queued operations, not yet started */
	uint64_t queued = 0;     /* operations ever queued */
	uint64_t done = 0;       /* operations completed (in order) */
	bool closing = false;    /* cudaStreamDestroy'ed: finish q, then exit */
	bool exited = false;     /* the worker returned; th can be joined at once */
	std::thread th;          /* the worker */
};

/* one event */
struct cuemu_event {
	unsigned flags = 0;                /* cudaEventCreateWithFlags flags */
	std::shared_ptr<cuemu_record> rec; /* the latest record; NULL: never recorded */
};

/* the runtime's state; allocated once, never freed (reachable for LeakSanitizer) */
struct cuemu_state {
	std::mutex mu;                                 /* guards everything below */
	std::condition_variable cv;                    /* any progress or state change */
	std::shared_ptr<cuemu_stream> legacy;          /* the legacy default stream */
	std::map<uintptr_t, std::shared_ptr<cuemu_stream>> streams; /* live handles */
	std::vector<std::shared_ptr<cuemu_stream>> workers; /* threads not yet joined */
	std::map<uintptr_t, std::shared_ptr<cuemu_event>> events;   /* live handles */
	uint64_t next_id = 0;                          /* handle numbers */
	std::atomic<bool> down{ false };               /* process exit: workers stopped */
	std::atomic<int> sticky{ 0 };                  /* cudaError_t of a kernel fault, or 0 */
};

/* what cuemu_enter checks besides fault injection: levels, each one includes those above it */
enum cuemu_need {
	CUEMU_NONE,   /* nothing: version queries */
	CUEMU_DEV,    /* a device exists (KVT_CUEMU_DEVICES), the runtime is not down */
	CUEMU_STICKY, /* what CUEMU_DEV checks, and no sticky error */
};

/* The runtime state, created (with the legacy stream's worker) on first use. */
cuemu_state *cuemu_get(void);

/*
 * Start of every API function @api: fault injection, then the checks of @need. Returns the
 * error the call must fail with, or cudaSuccess; the caller returns cuemu_ret() of it.
 */
cudaError_t cuemu_enter(const char *api, cuemu_need need);

/* Record @e as the thread's last error (unless cudaSuccess or cudaErrorNotReady); return it. */
cudaError_t cuemu_ret(cudaError_t e);

/* cudaErrorLaunchFailure once a kernel faulted, else cudaSuccess. */
cudaError_t cuemu_sticky(void);

/*
 * Queue @op on @s (NULL, cudaStreamLegacy or cudaStreamPerThread: the legacy stream), with the
 * legacy stream's implicit dependencies. *@mark (if not NULL) gets a record of the operation's
 * position, for cuemu_wait(). Returns cudaSuccess, cudaErrorCudartUnloading (after the
 * shutdown at process exit) or cudaErrorInvalidResourceHandle (unknown stream); on error @op
 * is dropped: its fin runs.
 */
cudaError_t cuemu_submit(cudaStream_t s, cuemu_op op, cuemu_record *mark);

/* Block until @r's operation completed; returns cuemu_sticky(). */
cudaError_t cuemu_wait(const cuemu_record &r);

/* Block until every operation queued so far on every stream completed (no error checks). */
void cuemu_drain(void);

/* The injected error for this call of @api (kvt_cuemu_fail), or cudaSuccess; counts the call. */
cudaError_t cuemu_injected(const char *api);

/* Clear every kvt_cuemu_fail() rule. */
void cuemu_rules_clear(void);

/* 1 unless KVT_CUEMU_DEVICES=0 (read on every call, so tests can change it). */
int cuemu_ndev(void);

/* The emulated HBM size in bytes (KVT_CUEMU_HBM_MIB, default 8192 MiB; read on every call). */
size_t cuemu_hbm_bytes(void);

/* HBM bytes in use (cudart_mem.cc). */
size_t cuemu_hbm_used(void);

#endif /* KVT_TESTS_CUEMU_CUDART_INT_H */
