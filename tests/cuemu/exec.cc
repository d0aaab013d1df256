/* SPDX-License-Identifier: MIT */
/*
 * tests/cuemu/exec.cc - kernel execution of the CUDA-on-CPU emulation (see cuemu.h, device.h).
 *
 * A launch is checked on the calling thread and queued on its stream (kvt_cuemu_enqueue); the
 * stream's worker runs the grid block after block. A block's threads are fibers on the
 * worker: each has its own stack, and the scheduler (the worker's own stack) resumes them in
 * passes, thread 0 first. A fiber runs until it returns or reaches a rendezvous:
 *   - __syncthreads: released when every thread of the block has arrived;
 *   - a warp operation (shuffle, ballot, __syncwarp): released when every lane of its mask has
 *     arrived with the same operation and mask; the last lane computes every lane's result
 *     (per PTX shfl.sync) into the warp's result slots before anyone reads them. Lanes of
 *     disjoint groups may wait in different operations at once (lanes 0-15 in a shuffle of mask
 *     0xffff while 16-31 already wait in the next full-warp one).
 * A thread that returns while others wait, a mask that differs between lanes, names a lane
 * that does not exist or leaves out the caller, a shuffle from a lane outside the mask, and a
 * pass in which no fiber can run (a deadlock) are kernel faults: the message names the kernel,
 * block and thread, kvt_cuemu_kernel_fault() reports it, and the rest of the grid is dropped
 * (waiting fibers are simply never resumed). KVT_CUEMU_ORDER=reverse runs the blocks and each
 * pass's threads last to first, which shakes out code that depends on an order the hardware
 * does not promise.
 *
 * The switch is a few instructions of assembly on x86-64 (callee-saved registers and the stack
 * pointer; MXCSR and the x87 control word are left alone, no kernel changes them); elsewhere
 * ucontext. Under AddressSanitizer every switch is announced (__sanitizer_start/
 * finish_switch_fiber), so ASan knows which stack runs.
 * ThreadSanitizer does not know about fibers: KVT_CUDA_EMU builds refuse it.
 */
#include "device.h"
#include "exec_selftest.h"

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <new>

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define EXEC_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EXEC_ASAN 1
#endif
#endif
#ifdef EXEC_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace {

constexpr unsigned EXEC_MAX_THREADS = 1024;       /* threads per block */
constexpr size_t EXEC_MAX_DYN_SMEM = 48u << 10;   /* dynamic shared memory without opt-in */
constexpr size_t EXEC_STACK = 256u << 10;         /* one fiber's stack, guard page excluded */

enum exec_state {
	EXEC_READY,     /* runnable: not started, or released from a rendezvous */
	EXEC_BARRIER,   /* waiting at __syncthreads */
	EXEC_WARP,      /* waiting at a warp operation */
	EXEC_DONE,      /* returned */
};

/* one emulated thread */
struct exec_fiber {
	struct kvt_cuemu_thread idx; /* its built-in variables */
	void *sp;                    /* saved stack pointer while not running (x86-64) */
#if !defined(__x86_64__)
	ucontext_t uc;               /* saved context while not running (other targets) */
#endif
	char *stack;                 /* lowest address of its stack */
	size_t stack_size;           /* its size */
	int state;                   /* exec_state */
	bool timer_read;             /* has read %globaltimer */
	void *asan_fake;             /* ASan's fake stack while suspended */
};

/* one pending warp operation */
struct exec_group {
	unsigned mask;      /* its mask */
	int op;             /* its kvt_cuemu_warp_op */
	unsigned arrived;   /* lanes arrived */
};

/* the rendezvous state of one warp */
struct exec_warp {
	unsigned n_groups;  /* pending operations */
	exec_group g[32];   /* them (each holds at least one waiting lane) */
	unsigned waiting;   /* lanes waiting in any of them */
	unsigned exited;    /* lanes that returned */
	uint64_t val[32];   /* each arrived lane's value */
	int b[32];          /* each arrived lane's lane / delta / xor operand */
	int width[32];      /* each arrived lane's segment width */
	uint64_t res[32];   /* results of the last completed operation */
};

/* a stream worker's execution state (thread-local: one grid at a time per worker) */
struct exec_worker {
	const struct kvt_cuemu_grid *g; /* the running grid */
	exec_fiber *fibers;             /* EXEC_MAX_THREADS entries once allocated */
	char *stacks;                   /* the fibers' stacks (mmap), guard page below each */
	unsigned n_stacks;              /* stacks mapped */
	unsigned n;                     /* threads of the running block */
	unsigned waiting_bar;           /* threads waiting at __syncthreads */
	unsigned exited;                /* threads that returned */
	unsigned last_exit;             /* the latest of them */
	exec_warp warps[EXEC_MAX_THREADS / 32]; /* the block's warps */
	exec_fiber *cur;                /* the running fiber; NULL in the scheduler */
	exec_fiber sched;               /* the scheduler's context: the worker's own stack */
	unsigned pos;                   /* the running fiber's place in this pass */
	bool reverse;                   /* passes (and blocks) run last to first */
	bool fault;                     /* the grid faulted: drop the rest */
	void *smem;                     /* dynamic shared memory (only grows) */
	size_t smem_cap;                /* its size; under ASan the running grid's part is usable */
	uint64_t grid_start;            /* %globaltimer at the grid's start */
	uint3 bid;                      /* the running block */
};

thread_local exec_worker *exec_w;

/* frees the thread's exec_w when a stream worker exits */
struct exec_worker_owner {
	~exec_worker_owner();
};
thread_local exec_worker_owner exec_owner;

/* a queued launch: the grid (its ctx owns the arguments) */
struct exec_launch {
	struct kvt_cuemu_grid g; /* copied at launch */
};

uint64_t
exec_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

} /* namespace */

/* the running fiber's built-ins (device.h); set by every switch */
__thread const struct kvt_cuemu_thread *kvt_cuemu_self;

/* ---- the context switch ---- */
#if defined(__x86_64__)
extern "C" void kvt_cuemu_swap(void **save_sp, void *to_sp);
extern "C" void kvt_cuemu_fiber_start(void);
/*
 * kvt_cuemu_swap(save, to): push the callee-saved registers, store the stack pointer in *save,
 * switch to the stack at @to and pop the same from there. MXCSR and the x87 control word are
 * left alone (saving them costs more than the rest; nothing in a kernel changes them).
 * A new fiber's stack holds the registers with r12 = argument, r13 = function, and returns
 * into kvt_cuemu_fiber_start, which calls function(argument) on a 16-byte aligned stack.
 */
asm(".text\n"
    ".globl kvt_cuemu_swap\n"
    ".hidden kvt_cuemu_swap\n"
    ".type kvt_cuemu_swap,@function\n"
    "kvt_cuemu_swap:\n"
    "	pushq %rbp\n"
    "	pushq %rbx\n"
    "	pushq %r12\n"
    "	pushq %r13\n"
    "	pushq %r14\n"
    "	pushq %r15\n"
    "	movq %rsp, (%rdi)\n"
    "	movq %rsi, %rsp\n"
    "	popq %r15\n"
    "	popq %r14\n"
    "	popq %r13\n"
    "	popq %r12\n"
    "	popq %rbx\n"
    "	popq %rbp\n"
    "	ret\n"
    ".size kvt_cuemu_swap, .-kvt_cuemu_swap\n"
    ".globl kvt_cuemu_fiber_start\n"
    ".hidden kvt_cuemu_fiber_start\n"
    ".type kvt_cuemu_fiber_start,@function\n"
    "kvt_cuemu_fiber_start:\n"
    "	movq %r12, %rdi\n"
    "	callq *%r13\n"
    "	ud2\n"
    ".size kvt_cuemu_fiber_start, .-kvt_cuemu_fiber_start\n");
#endif

namespace {

void exec_fiber_main(void *arg);
#if !defined(__x86_64__)
void exec_fiber_main_uc(void);
#endif

/* Prepare fiber @f to start exec_fiber_main(w) at its next resume. */
void
exec_fiber_init(exec_worker *w, exec_fiber *f)
{
#if defined(__x86_64__)
	uint64_t *top = (uint64_t *)(f->stack + EXEC_STACK); /* 16-byte aligned */
	uint64_t *sp = top - 1;                             /* the return address slot */

	*sp = (uint64_t)(uintptr_t)kvt_cuemu_fiber_start;
	*--sp = 0;                                 /* rbp */
	*--sp = 0;                                 /* rbx */
	*--sp = (uint64_t)(uintptr_t)w;            /* r12: the argument */
	*--sp = (uint64_t)(uintptr_t)exec_fiber_main; /* r13: the function */
	*--sp = 0;                                 /* r14 */
	*--sp = 0;                                 /* r15 */
	f->sp = sp;
#else
	getcontext(&f->uc);
	f->uc.uc_stack.ss_sp = f->stack;
	f->uc.uc_stack.ss_size = EXEC_STACK;
	f->uc.uc_link = NULL;
	makecontext(&f->uc, (void (*)(void))exec_fiber_main_uc, 0);
#endif
	f->state = EXEC_READY;
	f->timer_read = false;
	f->asan_fake = NULL;
}

/*
 * Switch from context @from (a fiber, or &w->sched) to @to. @final: @from never resumes (it
 * returned or faulted). Returns when something switches back to @from.
 */
void
exec_switch(exec_worker *w, exec_fiber *from, exec_fiber *to, bool final)
{
	w->cur = to == &w->sched ? NULL : to;
	kvt_cuemu_self = w->cur ? &to->idx : NULL;
#ifdef EXEC_ASAN
	__sanitizer_start_switch_fiber(final ? NULL : &from->asan_fake, to->stack,
				       to->stack_size);
#endif
	(void)final;
#if defined(__x86_64__)
	kvt_cuemu_swap(&from->sp, to->sp);
#else
	swapcontext(&from->uc, &to->uc);
#endif
#ifdef EXEC_ASAN
	__sanitizer_finish_switch_fiber(from->asan_fake, NULL, NULL);
#endif
}

/* The next READY fiber of this pass after the running one, or NULL. */
exec_fiber *
exec_next_ready(exec_worker *w)
{
	for (unsigned p = w->pos + 1; p < w->n; p++) {
		exec_fiber *f = &w->fibers[w->reverse ? w->n - 1 - p : p];

		if (f->state == EXEC_READY) {
			w->pos = p;
			return f;
		}
	}
	return NULL;
}

/*
 * The running fiber stops (waits at a rendezvous, or @final: returned or faulted): hand over
 * to the next READY fiber of the pass, or to the scheduler at the end of the pass or after a
 * fault. Returns when the fiber is resumed.
 */
void
exec_yield(exec_worker *w, bool final)
{
	exec_fiber *f = w->cur, *next = w->fault ? NULL : exec_next_ready(w);

	exec_switch(w, f, next ? next : &w->sched, final);
}

/* "thread (x,y,z) of block (x,y,z)" of fiber @i, for messages */
void
exec_who(const exec_worker *w, unsigned i, char *buf, size_t len)
{
	const uint3 &t = w->fibers[i].idx.tid;

	snprintf(buf, len, "thread (%u,%u,%u) of block (%u,%u,%u)", t.x, t.y, t.z, w->bid.x,
		 w->bid.y, w->bid.z);
}

const char *
exec_op_name(int op)
{
	static const char *const names[] = { "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
					      "__shfl_xor_sync", "__ballot_sync", "__syncwarp" };

	return op >= 0 && op <= KVT_CUEMU_SYNCWARP ? names[op] : "?";
}

/*
 * A kernel fault: report "<kernel><<<grid, block>>>: [thread (..) of block (..)] <msg>" (the
 * thread is fiber @who's, none for -1) and drop the rest of the grid. On a fiber it never
 * returns (the fiber is abandoned); in the scheduler it returns.
 */
__attribute__((format(printf, 3, 4))) void
exec_fault(exec_worker *w, int who, const char *fmt, ...)
{
	char msg[768], thr[96] = "", full[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (who >= 0) {
		exec_who(w, (unsigned)who, thr, sizeof thr - 2);
		strcat(thr, ": ");
	}
	snprintf(full, sizeof full, "%s<<<(%u,%u,%u), (%u,%u,%u)>>>: %s%s", w->g->name,
		 w->g->grid.x, w->g->grid.y, w->g->grid.z, w->g->block.x, w->g->block.y,
		 w->g->block.z, thr, msg);
	kvt_cuemu_kernel_fault(full);
	w->fault = true;
	if (w->cur)
		exec_yield(w, true);
}

unsigned
exec_self_index(const exec_worker *w)
{
	return (unsigned)(w->cur - w->fibers);
}

/* The calling fiber returned from the kernel. */
void
exec_thread_exit(exec_worker *w)
{
	const unsigned i = exec_self_index(w), lane = i % 32u;
	exec_warp *wp = &w->warps[i / 32u];

	w->cur->state = EXEC_DONE;
	w->exited++;
	w->last_exit = i;
	wp->exited |= 1u << lane;
	if (w->waiting_bar)
		exec_fault(w, (int)i, "returned while %u thread(s) wait at __syncthreads",
			   w->waiting_bar);
	for (unsigned k = 0; k < wp->n_groups; k++)
		if (wp->g[k].mask >> lane & 1u)
			exec_fault(w, (int)i, "returned while lanes 0x%08x of its warp wait for it "
				   "in %s with mask 0x%08x", wp->g[k].arrived,
				   exec_op_name(wp->g[k].op), wp->g[k].mask);
	exec_yield(w, true);
}

void
exec_fiber_main(void *arg)
{
	exec_worker *w = static_cast<exec_worker *>(arg);

#ifdef EXEC_ASAN
	__sanitizer_finish_switch_fiber(NULL, NULL, NULL);
#endif
	w->g->thread(w->g->ctx);
	exec_thread_exit(w);
	abort(); /* not reached: a returned fiber is never resumed */
}

#if !defined(__x86_64__)
void
exec_fiber_main_uc(void)
{
	exec_fiber_main(exec_w);
}
#endif

/* The calling thread's worker state, created on first use; NULL if out of memory. */
exec_worker *
exec_worker_get(void)
{
	if (!exec_w) {
		exec_worker *w = new (std::nothrow) exec_worker();

		if (!w)
			return NULL;
		w->fibers = new (std::nothrow) exec_fiber[EXEC_MAX_THREADS]();
		if (!w->fibers) {
			delete w;
			return NULL;
		}
#ifdef EXEC_ASAN
		pthread_attr_t a;
		void *lo;

		if (!pthread_getattr_np(pthread_self(), &a)) { /* the scheduler's stack */
			pthread_attr_getstack(&a, &lo, &w->sched.stack_size);
			w->sched.stack = (char *)lo;
			pthread_attr_destroy(&a);
		}
#endif
		exec_w = w;
		(void)&exec_owner; /* constructed now: its destructor frees w at thread exit */
	}
	return exec_w;
}

exec_worker_owner::~exec_worker_owner()
{
	exec_worker *w = exec_w;

	if (!w)
		return;
	if (w->stacks)
		munmap(w->stacks, w->n_stacks * (EXEC_STACK + (size_t)sysconf(_SC_PAGESIZE)));
	free(w->smem);
	delete[] w->fibers;
	delete w;
	exec_w = NULL;
}

/* Map stacks for @n fibers (guard page below each); false if mmap failed. */
bool
exec_stacks(exec_worker *w, unsigned n)
{
	const size_t page = (size_t)sysconf(_SC_PAGESIZE), one = EXEC_STACK + page;
	char *m;

	if (n <= w->n_stacks)
		return true;
	if (w->stacks)
		munmap(w->stacks, w->n_stacks * one);
	w->stacks = NULL;
	w->n_stacks = 0;
	m = (char *)mmap(NULL, n * one, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED)
		return false;
	for (unsigned i = 0; i < n; i++) {
		mprotect(m + i * one, page, PROT_NONE);
		w->fibers[i].stack = m + i * one + page;
		w->fibers[i].stack_size = EXEC_STACK;
	}
	w->stacks = m;
	w->n_stacks = n;
	return true;
}

/* Describe who waits where, for a deadlock message. */
void
exec_deadlock(exec_worker *w)
{
	char warps[256] = "";
	size_t len = 0;

	for (unsigned k = 0; k < (w->n + 31) / 32 && len < sizeof warps - 64; k++)
		for (unsigned j = 0; j < w->warps[k].n_groups && len < sizeof warps - 64; j++)
			len += (size_t)snprintf(warps + len, sizeof warps - len,
						" warp %u: lanes 0x%08x in %s of mask 0x%08x;",
						k, w->warps[k].g[j].arrived,
						exec_op_name(w->warps[k].g[j].op),
						w->warps[k].g[j].mask);
	exec_fault(w, -1, "deadlock in block (%u,%u,%u): %u thread(s) wait at __syncthreads, %u "
		   "returned, warp operations pending:%s", w->bid.x, w->bid.y, w->bid.z,
		   w->waiting_bar, w->exited, warps[0] ? warps : " none");
}

/* Run one block of the grid; false when the grid faulted. */
bool
exec_block(exec_worker *w, uint3 bid)
{
	const struct kvt_cuemu_grid *g = w->g;
	const unsigned n = g->block.x * g->block.y * g->block.z;

	w->bid = bid;
	w->n = n;
	w->waiting_bar = 0;
	w->exited = 0;
	for (unsigned k = 0; k < (n + 31) / 32; k++) {
		w->warps[k].n_groups = 0;
		w->warps[k].waiting = 0;
		w->warps[k].exited = 0;
	}
	for (unsigned i = 0; i < n; i++) {
		exec_fiber *f = &w->fibers[i];

		f->idx.tid = make_uint3(i % g->block.x, i / g->block.x % g->block.y,
					i / (g->block.x * g->block.y));
		f->idx.bid = bid;
		f->idx.bdim = g->block;
		f->idx.gdim = g->grid;
		exec_fiber_init(w, f);
	}
	if (g->smem)
		memset(w->smem, 0xff, g->smem); /* NaN floats: reads before writes show */
	while (w->exited < n) {
		exec_fiber *f;

		w->pos = ~0u; /* a pass: every READY fiber in order, each handing to the next */
		f = exec_next_ready(w);
		if (!f) {
			exec_deadlock(w);
			return false;
		}
		exec_switch(w, &w->sched, f, false);
		if (w->fault)
			return false;
	}
	return true;
}

/* The stream work of a launch: run the grid (on the stream's worker). */
void
exec_grid_run(void *ctx)
{
	exec_launch *l = static_cast<exec_launch *>(ctx);
	const struct kvt_cuemu_grid *g = &l->g;
	const char *order = getenv("KVT_CUEMU_ORDER");
	exec_worker *w = exec_worker_get();
	char msg[512];

	if (!w || !exec_stacks(w, g->block.x * g->block.y * g->block.z)) {
		snprintf(msg, sizeof msg, "%s: no memory for the emulated threads' stacks",
			 g->name);
		kvt_cuemu_kernel_fault(msg);
		return;
	}
	if (g->smem > w->smem_cap) {
		const size_t cap = (g->smem + 63) & ~(size_t)63;

		free(w->smem);
		w->smem = aligned_alloc(64, cap);
		w->smem_cap = w->smem ? cap : 0;
		if (!w->smem) {
			snprintf(msg, sizeof msg, "%s: no memory for shared memory", g->name);
			kvt_cuemu_kernel_fault(msg);
			return;
		}
	}
#ifdef EXEC_ASAN
	if (w->smem) { /* past this grid's dynamic shared memory: an over-read is reported */
		ASAN_UNPOISON_MEMORY_REGION(w->smem, g->smem);
		ASAN_POISON_MEMORY_REGION((char *)w->smem + g->smem, w->smem_cap - g->smem);
	}
#endif
	w->g = g;
	w->reverse = order && !strcmp(order, "reverse");
	w->fault = false;
	w->cur = NULL;
	for (unsigned i = 0; i < g->n_ptrs; i++)
		if (g->ptrs[i] && !kvt_cuemu_addressable(g->ptrs[i], 0)) {
			exec_fault(w, -1, "pointer argument %u (%p) is not device-addressable "
				   "memory (pageable host memory, freed, or never allocated)", i,
				   g->ptrs[i]);
			return;
		}
	w->grid_start = exec_now_ns();
	const uint64_t nb = (uint64_t)g->grid.x * g->grid.y * g->grid.z;
	for (uint64_t k = 0; k < nb && !w->fault; k++) {
		const uint64_t b = w->reverse ? nb - 1 - k : k;
		const uint3 bid = make_uint3((unsigned)(b % g->grid.x),
					     (unsigned)(b / g->grid.x % g->grid.y),
					     (unsigned)(b / ((uint64_t)g->grid.x * g->grid.y)));

		if (!exec_block(w, bid))
			break;
	}
#ifdef EXEC_ASAN
	if (w->fault) /* abandoned fibers leave poisoned frames on their stacks */
		for (unsigned i = 0; i < w->n_stacks; i++)
			__asan_unpoison_memory_region(w->fibers[i].stack, EXEC_STACK);
#endif
	w->g = NULL;
}

void
exec_grid_drop(void *ctx)
{
	exec_launch *l = static_cast<exec_launch *>(ctx);

	l->g.drop(l->g.ctx);
	delete l;
}

/* The result for lane @i of a completed shuffle of warp @wp (PTX shfl.sync); -1: bad lane. */
int
exec_shfl_src(const exec_warp *wp, int op, unsigned i)
{
	const int width = wp->width[i];
	const unsigned seg = (unsigned)(32 - width) & 31u; /* segmask: lanes of other segments */
	const unsigned cval = op == KVT_CUEMU_SHFL_UP ? 0u : 31u;
	const unsigned b = (unsigned)wp->b[i] & 31u;
	const unsigned max_lane = (i & seg) | (cval & ~seg), min_lane = i & seg;
	int j;
	bool ok;

	switch (op) {
	case KVT_CUEMU_SHFL_UP:
		j = (int)i - (int)b;
		ok = j >= (int)max_lane;
		break;
	case KVT_CUEMU_SHFL_DOWN:
		j = (int)(i + b);
		ok = j <= (int)max_lane;
		break;
	case KVT_CUEMU_SHFL_XOR:
		j = (int)(i ^ b);
		ok = j <= (int)max_lane;
		break;
	default: /* idx */
		j = (int)(min_lane | (b & ~seg));
		ok = j <= (int)max_lane;
		break;
	}
	return ok ? j : (int)i;
}

/* The last lane of group @g of @wp arrived: compute every lane's result (or fault). */
void
exec_warp_complete(exec_worker *w, exec_warp *wp, const exec_group *g, unsigned warp)
{
	unsigned ballot = 0;

	for (unsigned i = 0; i < 32; i++)
		if ((g->mask >> i & 1u) && wp->val[i])
			ballot |= 1u << i;
	for (unsigned i = 0; i < 32; i++) {
		if (!(g->mask >> i & 1u))
			continue;
		if (g->op == KVT_CUEMU_BALLOT) {
			wp->res[i] = ballot;
		} else if (g->op == KVT_CUEMU_SYNCWARP) {
			wp->res[i] = 0;
		} else {
			int j = exec_shfl_src(wp, g->op, i);

			if (!(g->mask >> j & 1u))
				exec_fault(w, (int)(warp * 32u + i), "shuffles from lane %d, "
					   "outside the mask 0x%08x (undefined value)", j, g->mask);
			wp->res[i] = wp->val[j];
		}
	}
}

} /* namespace */

/** kvt_cuemu_warp() - see device.h. */
extern "C" uint64_t
kvt_cuemu_warp(unsigned mask, int op, uint64_t val, int b, int width)
{
	exec_worker *w = exec_w;
	const unsigned i = exec_self_index(w), lane = i % 32u, warp = i / 32u;
	const unsigned lanes = w->n - warp * 32u >= 32u ? 0xffffffffu
							: (1u << (w->n - warp * 32u)) - 1u;
	exec_warp *wp = &w->warps[warp];
	const char *name = exec_op_name(op);

	if (!(mask >> lane & 1u))
		exec_fault(w, (int)i, "%s with mask 0x%08x, which leaves out its own lane %u",
			   name, mask, lane);
	if (mask & ~lanes)
		exec_fault(w, (int)i, "%s with mask 0x%08x naming lanes that do not exist (the "
			   "warp has lanes 0x%08x)", name, mask, lanes);
	if (mask & wp->exited)
		exec_fault(w, (int)i, "%s with mask 0x%08x, but lanes 0x%08x of it returned",
			   name, mask, mask & wp->exited);
	if (op != KVT_CUEMU_BALLOT && op != KVT_CUEMU_SYNCWARP &&
	    (width < 1 || width > 32 || (width & (width - 1))))
		exec_fault(w, (int)i, "%s with width %d (a power of two 1..32)", name, width);
	exec_group *g = NULL;
	for (unsigned k = 0; k < wp->n_groups; k++)
		if (wp->g[k].mask == mask && wp->g[k].op == op) {
			g = &wp->g[k];
			break;
		}
	/* lanes of the mask that wait in another operation would never come */
	const unsigned other = mask & wp->waiting & ~(g ? g->arrived : 0u);
	if (other) {
		const exec_group *h = wp->g;

		while (!(h->arrived & other))
			h++;
		exec_fault(w, (int)i, "%s with mask 0x%08x while lanes 0x%08x of its warp wait in "
			   "%s with mask 0x%08x", name, mask, h->arrived, exec_op_name(h->op),
			   h->mask);
	}
	if (!g) {
		g = &wp->g[wp->n_groups++];
		g->mask = mask;
		g->op = op;
		g->arrived = 0;
	}
	wp->val[lane] = val;
	wp->b[lane] = b;
	wp->width[lane] = width;
	g->arrived |= 1u << lane;
	if (g->arrived != mask) {
		wp->waiting |= 1u << lane;
		w->cur->state = EXEC_WARP;
		exec_yield(w, false);
		return wp->res[lane];
	}
	/* the last lane: results for all, release the others, drop the group */
	exec_warp_complete(w, wp, g, warp);
	wp->waiting &= ~mask;
	for (unsigned k = 0; k < 32; k++)
		if ((mask >> k & 1u) && k != lane)
			w->fibers[warp * 32u + k].state = EXEC_READY;
	*g = wp->g[--wp->n_groups];
	return wp->res[lane];
}

/** kvt_cuemu_syncthreads() - see device.h. */
extern "C" void
kvt_cuemu_syncthreads(void)
{
	exec_worker *w = exec_w;

	std::atomic_signal_fence(std::memory_order_seq_cst);
	if (w->exited) {
		const uint3 &t = w->fibers[w->last_exit].idx.tid;

		exec_fault(w, (int)exec_self_index(w), "reaches __syncthreads, but %u thread(s) "
			   "of its block returned before it (the latest: thread (%u,%u,%u))",
			   w->exited, t.x, t.y, t.z);
	}
	if (++w->waiting_bar < w->n) {
		w->cur->state = EXEC_BARRIER;
		exec_yield(w, false);
	} else {
		w->waiting_bar = 0;
		for (unsigned k = 0; k < w->n; k++)
			if (w->fibers[k].state == EXEC_BARRIER)
				w->fibers[k].state = EXEC_READY;
	}
	std::atomic_signal_fence(std::memory_order_seq_cst);
}

/** kvt_cuemu_dynamic_smem() - see device.h. */
extern "C" void *
kvt_cuemu_dynamic_smem(void)
{
	exec_worker *w = exec_w;

	return w->g->smem ? w->smem : NULL;
}

/** kvt_cuemu_globaltimer() - see device.h. */
extern "C" uint64_t
kvt_cuemu_globaltimer(void)
{
	exec_worker *w = exec_w;

	if (!w->cur->timer_read) {
		w->cur->timer_read = true;
		return w->grid_start;
	}
	return exec_now_ns();
}

/** kvt_cuemu_launch() - see device.h. */
extern "C" cudaError_t
kvt_cuemu_launch(const struct kvt_cuemu_grid *g, cudaStream_t s)
{
	const dim3 b = g->block, d = g->grid;
	cudaError_t e = cudaSuccess;
	exec_launch *l;

	if (!b.x || !b.y || !b.z || b.x > 1024 || b.y > 1024 || b.z > 64 ||
	    (uint64_t)b.x * b.y * b.z > EXEC_MAX_THREADS || !d.x || !d.y || !d.z ||
	    d.x > 0x7fffffffu || d.y > 65535 || d.z > 65535)
		e = cudaErrorInvalidConfiguration;
	else if (g->smem > EXEC_MAX_DYN_SMEM)
		e = cudaErrorInvalidValue; /* as the device: above 48 KiB needs an opt-in */
	if (e != cudaSuccess) {
		kvt_cuemu_set_error(e);
		g->drop(g->ctx);
		return e;
	}
	e = kvt_cuemu_fail_check("launch");
	if (e != cudaSuccess) {
		g->drop(g->ctx);
		return e;
	}
	l = new (std::nothrow) exec_launch{ *g };
	if (!l) {
		g->drop(g->ctx);
		kvt_cuemu_set_error(cudaErrorMemoryAllocation);
		return cudaErrorMemoryAllocation;
	}
	e = kvt_cuemu_enqueue(s, exec_grid_run, exec_grid_drop, l);
	if (e != cudaSuccess)
		kvt_cuemu_set_error(e);
	return e;
}
