/* SPDX-License-Identifier: MIT */
/*
 * kvtier.h - the public API of kvtier, a KV-cache manager for LLM inference that keeps
 * blocks of K/V across three tiers: GPU HBM, pinned host memory and NVMe.
 *
 * Vocabulary (see docs/ARCHITECTURE.md):
 *   block   tokens_per_block consecutive tokens of one sequence, K and V of every layer,
 *           stored contiguously ("block-first"): layer l of a block starts at
 *           l * layer_block_bytes, and within a layer K comes first, then V, each laid out
 *           [tokens_per_block][n_kv_heads][head_dim] (FlashInfer's "NHD").
 *   slot    a place for one block in one tier. HBM slot ids are what a paged-attention kernel
 *           reads from the block table.
 *   seq     one request or conversation: its tokens and its blocks. Identified by a 64-bit id
 *           (kvt_seq_id), not by a pointer, so that a closed sequence used again is detected and
 *           answered with KVT_ECLOSED instead of touching freed memory.
 *   tier    KVT_TIER_HBM (device), KVT_TIER_HOST (pinned DRAM), KVT_TIER_NVME (files).
 *   promote / demote / evict / pin: move to a faster tier / to a slower tier / drop the copy
 *           in a tier / forbid eviction while a kernel reads the block.
 *
 * Conventions:
 *   - Every int-returning function returns 0 (or a count) on success and a negative error code
 *     on failure: -errno where one fits (-EINVAL, -ENOMEM, -ENOSPC, -EIO, -ENOENT, -EAGAIN) or a
 *     KVT_E* code below. kvt_strerror() names any code; kvt_last_error_message() gives the
 *     detailed message of the calling thread's last failure. A failed call leaves nothing
 *     half-done visible, and the engine stays usable.
 *   - Nothing in kvtier aborts or exits the process.
 *   - Options structs carry their own size (opts_size) and are filled by *_opts_init(o, sizeof *o);
 *     new fields are only ever added at the end.
 *   - Threading: every function taking a struct kvt_engine * may be called from any thread; the
 *     engine serialises them with one internal mutex. A struct kvt_batch is used by one thread at
 *     a time (the one that runs the step). No call holds that mutex while it waits for IO or a
 *     device copy: a call whose blocks are resident does not wait for other sequences'
 *     transfers. While an append, park, prepare or detach of a sequence waits, other threads'
 *     close, detach, append, park, resume, attach_prefix and prepare of that same sequence
 *     return KVT_EBUSY. A batch may be released
 *     by another thread than the one that prepared it (not concurrently with its use); a hint
 *     (kvt_engine_hint) is engine-wide: a scheduler thread may hint the sequences that a worker
 *     thread prepares next.
 *   - Progress: completions are processed inside API calls (every prepare, append, park, poll,
 *     drain and wait processes what has landed), never on kvtier's own threads. A server that
 *     calls the engine every step needs nothing more; one that goes quiet while transfers are
 *     in flight (background demotions, parks, resumes, idle_timeout_ms) calls
 *     kvt_engine_poll() now and then (e.g. each scheduler tick), or the slots they free and
 *     the idle parks wait until its next call.
 */
#ifndef KVTIER_H
#define KVTIER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KVT_API __attribute__((visibility("default")))
#else
#define KVT_API
#endif

#define KVT_VERSION_MAJOR 0
#define KVT_VERSION_MINOR 1
#define KVT_VERSION_PATCH 0
#define KVT_VERSION_NUM (KVT_VERSION_MAJOR * 10000 + KVT_VERSION_MINOR * 100 + KVT_VERSION_PATCH)
/* The "---- 0.N" marks inside the structs below name the symbol-version node (KVTIER_0.N,
 * engine/kvtier.map) whose functions first read the fields after them: fields are only ever
 * appended (a struct's size is passed where it can grow). The library's own version above
 * stays 0.1.0 until its first tagged release. */

/** Version of the library actually linked, as "MAJOR.MINOR.PATCH". Static string. */
KVT_API const char *kvt_version(void);

/*
 * Library-specific error codes live in -20000..-20099, below every errno value (the LMDB and
 * libuv convention), so a caller can tell them apart from -errno.
 * KVT_ETOOBIG means "never": the request exceeds what the tiers can hold whatever else is
 * freed (a batch beyond HBM's slots; an append past the most blocks one sequence may hold, the
 * tiers' slots less the reserve of one per tier below HBM, see kvt_seq_append); a server must
 * not retry it. -ENOSPC means "not now": other sequences or batches hold the room.
 */
#define KVT_ERRNO_MAP(XX)                                                                          \
	XX(EDEVICE, -20000, "device (GPU) error")                     \
	XX(ESHORTIO, -20001, "short read or write could not be completed")                         \
	XX(ECORRUPT, -20002, "block checksum mismatch: stored KV is corrupt")                      \
	XX(ECLOSED, -20003, "sequence is closed or was never opened")                              \
	XX(ELOST, -20004, "KV blocks were lost (I/O error or corruption); sequence truncated, recompute") \
	XX(EFORMAT, -20005, "file is not in the expected format")                                  \
	XX(ETOOBIG, -20006, "request can never fit in the configured tier capacities")             \
	XX(EBUSY, -20007, "sequence or session is busy (in an unreleased batch, or open)")          \
	XX(ENOTSUP, -20008, "not supported by this build or device")

enum kvt_error {
#define KVT_XX_ENUM(name, val, msg) KVT_##name = (val),
	KVT_ERRNO_MAP(KVT_XX_ENUM)
#undef KVT_XX_ENUM
};

/**
 * kvt_strerror() - a short static description of err.
 * @err: 0, a negative errno value, or a KVT_E* code.
 * Returns a static string; never NULL. Thread-safe.
 */
KVT_API const char *kvt_strerror(int err);

/**
 * kvt_last_error_message() - the detailed message of the calling thread's last failed call
 * ("nvme dir /x: No such file or directory", "cudaMalloc: out of memory", ...).
 * Returns a thread-local string, valid until the next kvtier call on this thread; "" if none.
 */
KVT_API const char *kvt_last_error_message(void);

/* ------------------------------------------------------------------------------------------ */
/* Geometry                                                                                     */

/** Element type of stored K/V. */
enum kvt_dtype {
	KVT_DTYPE_F32 = 0,
	KVT_DTYPE_F16 = 1,
	KVT_DTYPE_BF16 = 2,
	KVT_DTYPE_FP8_E4M3 = 3,
	KVT_DTYPE_INT8 = 4,
};

/** Size in bytes of one element of @t, or 0 for an unknown type. */
KVT_API size_t kvt_dtype_size(enum kvt_dtype t);

/** The model's KV layout (all layers alike; MHA/GQA/MQA store K and V per layer). */
struct kvt_layout {
	uint32_t n_layers;         /* transformer layers, 1..4096 */
	uint32_t n_kv_heads;       /* K/V heads per layer, 1..4096 */
	uint32_t head_dim;         /* elements per head, 1..4096 */
	enum kvt_dtype dtype;      /* element type of stored K/V */
	uint32_t tokens_per_block; /* tokens per block, 1..65536 */
};

/**
 * Byte geometry of the HBM tier, as a paged-attention kernel needs it. For a slot-mapping entry
 * m (see kvt_seq_append) the K of that token in layer l is at
 *   hbm_base + (m / tokens_per_block) * block_bytes + l * layer_block_bytes
 *            + (m % tokens_per_block) * token_bytes
 * and its V is at the same address + v_offset. Each token's K (or V) is
 * [n_kv_heads][head_dim] elements, contiguous. kvt_kv_addr() computes this.
 */
struct kvt_geometry {
	void *hbm_base;             /* device address of HBM slot 0 (host memory when emulated) */
	uint64_t block_bytes;       /* bytes of one block, all layers; the block stride */
	uint64_t layer_block_bytes; /* bytes of one layer of one block (K and V) */
	uint64_t v_offset;          /* offset of V from K within a layer of a block */
	uint64_t token_bytes;       /* bytes of one token's K (or V) in one layer */
	uint32_t tokens_per_block;  /* as in the layout */
	uint32_t n_layers;          /* as in the layout */
	uint32_t hbm_slots;         /* number of HBM slots */
	uint32_t host_slots;        /* number of HOST slots */
	uint32_t nvme_slots;        /* number of NVME slots */
};

/* ------------------------------------------------------------------------------------------ */
/* Engine                                                                                       */

enum kvt_tier { KVT_TIER_HBM = 0, KVT_TIER_HOST = 1, KVT_TIER_NVME = 2, KVT_TIER_COUNT = 3 };

enum kvt_device_kind {
	KVT_DEVICE_EMULATED = 0, /* host memory and worker threads standing in for a GPU */
	KVT_DEVICE_CUDA = 1,     /* a real GPU through the CUDA runtime (KVT_WITH_CUDA builds) */
};

/**
 * Lossless codec of blocks written to the NVME tier (tiers/codec.h, docs/FORMAT.md). A block is
 * stored encoded only when that saves at least nvme_codec_min_saving of its bytes, otherwise raw;
 * either way its checksum covers the raw bytes and is verified after decoding.
 */
enum kvt_codec {
	KVT_CODEC_NONE = 0,     /* raw */
	KVT_CODEC_LZ4 = 1,      /* plain LZ4 */
	KVT_CODEC_SHUF_LZ4 = 2, /* bit-plane shuffle of the elements, then LZ4 */
	KVT_CODEC_BYTE_LZ4 = 3, /* byte-plane shuffle, then LZ4 */
	KVT_CODEC_CSHUF_LZ4 = 4, /* channel-major tiles, Gray-coded exponents, bit-plane shuffle,
	                            then LZ4 (recommended) */
};

/* Log levels passed to kvt_engine_opts.log. */
enum kvt_log_level { KVT_LOG_ERROR = 0, KVT_LOG_WARN = 1, KVT_LOG_INFO = 2 };

struct kvt_group; /* layer groups: see "Layer groups" at the end */

struct kvt_engine_opts {
	size_t opts_size;          /* sizeof(struct kvt_engine_opts) as the caller compiled it */
	struct kvt_layout layout;  /* the model's KV layout; required */
	uint64_t hbm_bytes;        /* HBM tier capacity in bytes; required (>= one block) */
	uint64_t host_bytes;       /* HOST tier capacity in bytes; 0 = no HOST tier (then no NVME
	                              tier either: NVMe IO is staged through HOST slots, and
	                              create refuses nvme_dir without host_bytes, -EINVAL) */
	const char *nvme_dir;      /* directory for the NVME tier's slot file; NULL = no NVME tier.
	                              Copied; the file is created mode 0600 and removed on destroy
	                              (kept when nvme_persist) */
	uint64_t nvme_bytes;       /* NVME tier capacity in bytes (0 with nvme_dir = error): the
	                              slots' bytes, not the file's size. Slots of S = 4096 +
	                              round_up(block_bytes, 4096) bytes (a header page, then the
	                              block); n = floor(nvme_bytes / S) of them; the file is
	                              1 MiB (superblock area, KVT_FMT_DATA_OFF) + n x S bytes,
	                              so up to 1 MiB larger than nvme_bytes (docs/FORMAT.md);
	                              nvme_persist adds the journal file */
	enum kvt_device_kind device; /* default KVT_DEVICE_EMULATED */
	int cuda_device;           /* CUDA device ordinal (KVT_DEVICE_CUDA only); default 0 */
	float high_watermark;      /* fraction of a tier's slots above which background demotion
	                              starts after a batch is released; default 0.95 */
	float low_watermark;       /* ... and the fraction it demotes down to; default 0.85 */
	uint32_t nvme_queue_depth; /* io_uring queue depth; default 64 */
	uint32_t emu_max_delay_us; /* emulated device test knob: every queued operation waits a
	                              random 0..this many microseconds before it runs, on its own
	                              stream's thread, so completions are delayed and reordered
	                              across streams (never within one). Default 0 */
	uint64_t emu_seed;         /* seed of that randomness; default 1 */
	uint64_t emu_copy_bytes_per_s; /* emulated copy bandwidth limit; 0 = unlimited */
	void (*log)(void *arg, int level, const char *msg); /* warnings such as the mlock
	                              fallback; NULL = print to stderr */
	void *log_arg;             /* passed to log */
	/* --- NVMe store (issue 4); see docs/FORMAT.md --- */
	enum kvt_codec nvme_codec; /* codec of blocks written to NVMe; default KVT_CODEC_NONE */
	float nvme_codec_min_saving; /* keep an encoding only if it saves at least this fraction of
	                              the block; default 0.1 */
	int nvme_persist;          /* 0 (default): a private slot file, removed on destroy.
	                              It has no name in nvme_dir (O_TMPFILE, or unlinked right
	                              after creation), so a crash leaves nothing; slot files
	                              "kvtier-<pid>-<n>.slots" of dead processes found there are
	                              removed at create (a warning through log).
	                              1: the persistent store "<nvme_dir>/kvtier.store" (+ its
	                              journal "kvtier.journal") is opened, or created when absent;
	                              parked sessions published in it survive a restart or a crash
	                              (kvt_session_list, kvt_seq_restore). A store made for another
	                              layout, block size, codec, capacity or format version (or
	                              whose journal is of another format version) is not used:
	                              create fails with KVT_EFORMAT and says what differs. A
	                              journal damaged past a torn tail replays what verifies, is
	                              kept as "kvtier.journal.damaged" and logged (warning); so
	                              is one shorter than the length the store's superblock
	                              recorded as durable (records acknowledged, then lost). */
	int nvme_buffered_fallback; /* 1: when the filesystem refuses O_DIRECT, use buffered IO
	                              (page cache) with a warning instead of failing. Default 0 */
	/* ---- 0.2: eviction and idle sessions */
	uint32_t evict_policy;     /* enum kvt_evict_policy; default KVT_EVICT_DEFAULT (arc). The
	                              NVMe tier runs GCLOCK under LRU, ARC and the default (see
	                              the enum) */
	uint32_t idle_timeout_ms;  /* a sequence not used (append, prepare, resume) for this long
	                              is parked by kvt_engine_poll(); 0 = never (default) */
	uint32_t idle_target;      /* enum kvt_tier it is parked to; default KVT_TIER_HOST */
	uint32_t prefix_cache;     /* 1: sealed blocks stay cached (evictable) after the last
	                              sequence holding them closes, for later requests with the
	                              same prefix; 0 (default, v0): closing frees them, blocks are
	                              shared only among sequences open at the same time */
	/* ---- 0.3: NVMe worker threads */
	uint32_t nvme_workers;     /* threads of the NVME tier that checksum (and encode) blocks
	                              being written and verify (and decode) blocks read, in
	                              parallel and outside the engine's lock; a block read from
	                              NVMe becomes valid only after it verified. 0 = all of it on
	                              the thread that submits or reaps, under the lock. 1..16;
	                              default 2 */
	/* ---- 0.5: the REMOTE tier (issue 18; docs/ARCHITECTURE.md "REMOTE tier") */
	const char *remote_host;   /* Redis 7 / Valkey server (or any cluster node); NULL (default)
	                              = no REMOTE tier. Copied. Create connects (AUTH, PING) within
	                              remote_connect_timeout_ms and FAILS with the client's code
	                              (-ECONNREFUSED, -ETIMEDOUT, -EACCES, -EPROTO) when the server
	                              does not answer: a misconfiguration shows at once; a server
	                              that dies later is the breaker's (kvt_seq_publish_remote) */
	uint16_t remote_port;      /* its port; default 6379 */
	const char *remote_user;   /* ACL user; NULL: AUTH with the password alone. Copied */
	const char *remote_password; /* NULL or "": no AUTH. Copied */
	const char *remote_model_id; /* model and weights identity, part of every key's namespace
	                              (with the layout); required with remote_host. Copied */
	uint32_t remote_connect_timeout_ms; /* bound of one connect; default 1000 */
	uint32_t remote_op_timeout_ms; /* bound of each socket read and write; default 2000 */
	uint32_t remote_ttl_ms;    /* PX of every put; 0 (default) = no expiry. A put of a key
	                              already there (SET NX: first writer wins) extends its expiry
	                              to the TTL (PEXPIRE GT, Redis >= 7), never shortens it */
	/* ---- 0.6: layer groups (issue 16; see "Layer groups" below) */
	const struct kvt_group *groups; /* NULL (default): the single layout above, which is
	                              one FULL group of every layer. Otherwise n_groups
	                              descriptors (read with the stride groups[0].size), copied
	                              at create; then layout gives only n_layers (the model's
	                              layers, each in exactly one group) and tokens_per_block
	                              (common to all groups); its n_kv_heads, head_dim and
	                              dtype are not read */
	uint32_t n_groups;         /* entries of groups, 1..KVT_MAX_GROUPS (0 with groups NULL) */
	uint64_t group_ref_tokens; /* context length the default capacity split assumes (see
	                              struct kvt_group.share); default 32768 */
	/* ---- 0.6: REMOTE write-through, remote prefix hits, write budgets (issue 18 items 1-3,
	 * docs/ARCHITECTURE.md "REMOTE tier") */
	uint32_t remote_write;     /* enum kvt_remote_write: which sealed prefix blocks are
	                              written through to REMOTE; default KVT_REMOTE_WRITE_SEEN_TWICE */
	uint32_t remote_no_fetch;  /* 1: kvt_seq_match_prefix and kvt_ext_lookup do not look
	                              REMOTE up for the blocks that miss locally; 0 (default):
	                              they do; other values: -EINVAL */
	uint64_t remote_write_budget; /* bytes per write_budget_period_ms the engine may send to
	                              REMOTE by write-through (token bucket, burst = one period);
	                              0 (default) = unlimited. Published sessions are not limited */
	uint64_t nvme_write_budget; /* bytes per period HOST->NVMe demotions of CACHED prefix
	                              blocks (refs 0) may write; over it they are dropped instead
	                              (a live sequence's only copy is always written, and charged);
	                              0 (default) = unlimited */
	uint32_t write_budget_period_ms; /* the buckets' period; default 1000 */
	/* ---- 0.7 */
	uint32_t emu_lazy;         /* emulated device (benchmarks): 1 = a submitted copy wakes no
	                              stream thread; it runs, after the same simulated link time
	                              (a copy queued behind a wait for another stream's event
	                              starts after that stream's), on the thread that next
	                              queries or waits for it (or on its stream's thread when a
	                              waiter leaves it behind a wait, and at destroy): no thread
	                              hand-off per copy, which on a small VM costs more than the
	                              copy; the memcpy then costs the observing thread, where a
	                              GPU's copy engine costs the host nothing. Ignored with
	                              emu_max_delay_us or a CUDA device. 0 (default): every
	                              stream's thread runs its copies as they are submitted.
	                              Other values: -EINVAL */
};

/**
 * Write-through policies (kvt_engine_opts.remote_write). A sealed prefix block (full, tokens
 * given, its K/V written) is put to REMOTE once (a per-key "REMOTE bit": put, or seen there by a
 * lookup; only a hint, a later lookup verifies) asynchronously by the remote worker, first
 * writer wins (SET NX); its bytes are snapshotted under the engine lock from HBM or HOST (one
 * block copy, no network wait).
 *   KVT_REMOTE_WRITE_SEEN_TWICE  with reuse evidence: attached by a second sequence, or sealed
 *                                again by another sequence with the same prefix (default).
 *   KVT_REMOTE_WRITE_ALL         every sealed prefix block when it becomes shareable.
 *   KVT_REMOTE_WRITE_NONE        none: REMOTE is only looked up (and sessions published).
 */
enum kvt_remote_write {
	KVT_REMOTE_WRITE_SEEN_TWICE = 0,
	KVT_REMOTE_WRITE_ALL = 1,
	KVT_REMOTE_WRITE_NONE = 2,
};

/**
 * Eviction policies, one instance per tier (docs/ARCHITECTURE.md, "Eviction policies"). The
 * chosen policy ranks the HBM and HOST tiers; the NVMe tier (the last one: its evictions drop
 * the copy) runs GCLOCK under LRU, ARC and the default - a 2-bit use counter per NVMe slot and
 * a sweeping hand (a quarter byte per slot, where ARC took 8.25: its ghosts are of little use in
 * the last tier) - and PRIO under PRIO (priorities survive parking).
 *   KVT_EVICT_LRU   least recently used.
 *   KVT_EVICT_PRIO  priority LRU with retention (TensorRT-LLM's KvCacheRetentionConfig): lower
 *                   priority goes first, LRU within a priority; a priority given with a duration
 *                   falls back to the default (50) when it runs out. The only policy that reads
 *                   kvt_seq_opts.priority and kvt_seq_set_priority().
 *   KVT_EVICT_ARC   adaptive replacement with ghost lists: learns how much room blocks used once
 *                   deserve against blocks used again. The default: on the Mooncake trace it
 *                   gives 1.5-1.7x LRU's prefix hits at 1k-4k blocks and stays within 0.1% of
 *                   it at 64k (docs/PERF.md).
 */
enum kvt_evict_policy {
	KVT_EVICT_DEFAULT = 0, /* KVT_EVICT_ARC */
	KVT_EVICT_LRU = 1,
	KVT_EVICT_PRIO = 2,
	KVT_EVICT_ARC = 3,
};

/**
 * kvt_engine_opts_init() - fill @o with defaults.
 * @o:    options to fill; not NULL.
 * @size: sizeof(*o) as the caller compiled it (ABI growth: fields beyond it are not touched).
 */
KVT_API void kvt_engine_opts_init(struct kvt_engine_opts *o, size_t size);

struct kvt_engine; /* opaque */

/**
 * kvt_engine_create() - create an engine: the device, the three tiers (HBM slots from the
 * device, HOST slots pinned with cudaHostAlloc or mmap+mlock, falling back to unpinned memory
 * with a warning through opts->log when mlock is refused; NVME slots in one O_DIRECT file under
 * nvme_dir driven by io_uring) and one eviction policy instance per tier (opts->evict_policy).
 * @o:   options; copied, the caller may free them (and nvme_dir) after the call.
 * @out: receives the engine; set to NULL on failure.
 * Returns 0, -EINVAL (bad layout or sizes: each with a message), -ENOMEM, -ENOENT/-EACCES/
 * -ENOTDIR (nvme_dir unusable), KVT_ENOTSUP (CUDA asked for in a build without it),
 * KVT_EDEVICE (device error), KVT_EFORMAT (nvme_persist: the store in nvme_dir was made for
 * another layout, layer groups, codec, capacity or format version; the message names the
 * difference),
 * -EBUSY (nvme_persist: another process uses that store; the lock is retried for up to 3 s
 * first, so that a process that just died has released it; the system errno, unlike
 * KVT_EBUSY, which is about a sequence or batch).
 * Capacities are rounded down to whole slots; each tier present must hold at least one block.
 */
KVT_API int kvt_engine_create(const struct kvt_engine_opts *o, struct kvt_engine **out);

/**
 * kvt_engine_destroy() - wait for every transfer in flight, free all tiers, remove the NVME
 * file (with nvme_persist: publish the sessions whose park to NVMe completed, keep the store).
 * Every sequence and batch of @e becomes invalid; batches not yet released are freed here
 * (their pointers must not be used, nor released, afterwards). NULL is accepted. Not to be
 * called concurrently with any other call on @e.
 */
KVT_API void kvt_engine_destroy(struct kvt_engine *e);

/** kvt_engine_geometry() - byte geometry of @e's HBM tier (see struct kvt_geometry). */
KVT_API int kvt_engine_geometry(const struct kvt_engine *e, struct kvt_geometry *out);

/**
 * kvt_kv_addr() - device addresses of the K and V of one token in one layer.
 * @g:     geometry from kvt_engine_geometry().
 * @layer: 0..n_layers-1.
 * @slot_mapping: an entry of the slot mapping written by kvt_seq_append() (>= 0).
 * @k, @v: receive the addresses (each may be NULL).
 */
static inline void
kvt_kv_addr(const struct kvt_geometry *g, uint32_t layer, int64_t slot_mapping, void **k, void **v)
{
	char *p = (char *)g->hbm_base + (uint64_t)(slot_mapping / g->tokens_per_block) * g->block_bytes +
		  (uint64_t)layer * g->layer_block_bytes +
		  (uint64_t)(slot_mapping % g->tokens_per_block) * g->token_bytes;
	if (k)
		*k = p;
	if (v)
		*v = p + g->v_offset;
}

/**
 * kvt_engine_poll() - process completed transfers (device copies, NVMe IO) without blocking:
 * block states are updated, slots whose copies finished are freed or published.
 * @max: process at most this many completions (0 = all that are ready).
 * NVMe completions are left to another thread that is reaping them at the moment (a waiting
 * call, which processes them) or submitting IO; the next poll or wait gets them.
 * Returns the number processed (>= 0) or a negative error code.
 */
KVT_API int kvt_engine_poll(struct kvt_engine *e, uint32_t max);

/**
 * kvt_engine_drain() - block until no transfer is in flight (background demotions, parks,
 * resumes) and process every completion. With a REMOTE tier it first waits (without the engine
 * lock) for the kvt_seq_publish_remote() jobs queued so far, each bounded by the client's
 * timeouts; a failed one is counted, not returned. Returns 0 or a negative error code.
 */
KVT_API int kvt_engine_drain(struct kvt_engine *e);

/**
 * kvt_engine_stream_create() - a device stream owned by the engine's device, for servers (and
 * tests) without one of their own: a cudaStream_t on CUDA; on the emulated device an in-order
 * queue run by its own thread. Pass it to kvt_batch_release()/kvt_batch_wait_layer().
 * kvt_engine_stream_memcpy_async() queues a copy on it (dst/src device or host addresses,
 * @len bytes); kvt_engine_stream_sync() waits for everything queued on it.
 * Destroy it before the engine.
 */
KVT_API int kvt_engine_stream_create(struct kvt_engine *e, void **stream);
KVT_API int kvt_engine_stream_memcpy_async(struct kvt_engine *e, void *stream, void *dst,
					   const void *src, size_t len);
KVT_API int kvt_engine_stream_sync(struct kvt_engine *e, void *stream);
KVT_API void kvt_engine_stream_destroy(struct kvt_engine *e, void *stream);

/* ------------------------------------------------------------------------------------------ */
/* Sequences                                                                                    */

/** A sequence id: low 32 bits index, high 32 bits generation; 0 is never a valid id. */
typedef uint64_t kvt_seq_id;

struct kvt_seq_opts {
	size_t opts_size;  /* sizeof(struct kvt_seq_opts) as the caller compiled it */
	uint32_t tenant;   /* tenant id: part of every prefix key (tenants never share blocks) */
	uint8_t priority;  /* 0..100, higher is kept longer; default 50 (KVT_EVICT_PRIO only) */
	uint64_t session_key; /* caller-chosen id of the conversation (0 = none). With a
	                         persistent NVMe store (nvme_persist), parking the sequence to NVMe
	                         publishes it under this key once all its blocks are durable, and
	                         kvt_seq_restore() reopens it after a restart. Unique per store. */
	/* ---- 0.2 */
	uint32_t retention_ms; /* priority falls back to 50 this long after a block is created;
	                          0 = keeps it (default) */
	uint64_t salt;     /* prefix-sharing salt: sequences share blocks only when their
	                      tenants, salts and extra keys are all equal (the three are hashed
	                      together into each block's key, so no salt value reaches another
	                      tenant's blocks; sequences of one tenant that must not share use
	                      different salts). Default 0. (Earlier builds put the salt in the
	                      tenant's place, and one salt let tenants share: sequences that are
	                      to share now belong to one tenant) */
	uint64_t extra_key; /* anything else the KV depends on (adapter id, model revision):
	                       mixed into every block's key; default 0 */
};

/** kvt_seq_opts_init() - defaults (tenant 0, priority 50). */
KVT_API void kvt_seq_opts_init(struct kvt_seq_opts *o, size_t size);

/**
 * kvt_seq_open() - open an empty sequence.
 * @o:   options (NULL = defaults).
 * @out: receives the id.
 * Returns 0, -EINVAL (priority > 100, bad opts_size), -ENOMEM, KVT_EBUSY (opts.session_key is
 * that of an open sequence), -EEXIST (the persistent store holds a session under that key:
 * kvt_seq_restore() or kvt_session_drop() it).
 */
KVT_API int kvt_seq_open(struct kvt_engine *e, const struct kvt_seq_opts *o, kvt_seq_id *out);

/**
 * kvt_seq_close() - drop the sequence and its blocks. Slots whose transfers are still in flight
 * are freed when those complete (never before). The id becomes invalid at once: any later use
 * returns KVT_ECLOSED. Returns 0, KVT_ECLOSED, or KVT_EBUSY when a batch still pins it (release
 * the batch first).
 * Persistent store: closing a sequence opened with a session_key also REMOVES its published
 * session from the store (a DEL record; after a restart it is gone), and a park not yet
 * published is abandoned. To free the sequence but keep its stored session restorable (a server's
 * "request finished"), use kvt_seq_detach(). Without a session_key, or without a store, close and
 * detach are the same.
 */
KVT_API int kvt_seq_close(struct kvt_engine *e, kvt_seq_id s);

/**
 * kvt_seq_detach() - free the sequence and its in-memory blocks like kvt_seq_close(), but keep
 * its published session in the persistent store: it stays restorable (kvt_session_list,
 * kvt_seq_restore) in this engine and after a restart, as of its last published park. A park of
 * @s still in flight is waited for and published first (this call may block on NVMe writes and
 * two fdatasyncs). Blocks the session shares with other sequences stay with them; the NVMe
 * slots its record names stay out of use until the session is restored or dropped (or given up,
 * oldest first, when the NVMe tier is full). A sequence that was never published (no
 * session_key, no store, never parked to NVMe) is simply closed; changes made after its last
 * park are not kept. Threading: as kvt_seq_close (takes the engine lock).
 * Returns 0, KVT_ECLOSED, KVT_EBUSY (a batch still pins it), or the error of the pending
 * publish (-EIO, -ENOSPC, ...: the sequence then stays open, its previous record unchanged).
 */
KVT_API int kvt_seq_detach(struct kvt_engine *e, kvt_seq_id s);

/**
 * kvt_seq_append() - reserve room for @n new tokens at the end of the sequence and say where
 * in HBM the caller must write each token's K/V.
 * @tokens:       the n token ids (int32); copied; may be NULL (then ids are recorded as -1).
 * @n:            1..(1<<20) tokens.
 * @slot_mapping: out, n entries: slot_mapping[i] = hbm_slot * tokens_per_block + offset, the
 *                vLLM convention; use kvt_kv_addr() to turn it into addresses.
 * The blocks that receive new tokens are brought into HBM if they are not (the partially filled
 * last block of a parked sequence) and stay pinned until the next kvt_batch_release() of a batch
 * holding this sequence (or close/park), so the mapping stays valid until then. Copies of those
 * blocks in slower tiers become stale and are dropped.
 * The caller must write the new tokens' K/V (every layer) before that release (or queue the
 * writes on the stream it passes to it): afterwards the block may be copied down and moved, and
 * a later write through the old mapping would be lost. A server decoding a sequence in windows
 * (kvt_batch_prepare_ranges) therefore appends the new token in the step's last batch, after
 * the windows, as tools/kvtier-run does.
 * Slots come from blocks nobody holds, but a kernel released with a stream may still be reading
 * one: order the writes after the streams of earlier releases (a server with one compute stream
 * does so naturally; a host write must wait for them).
 * Prefix sharing (with @tokens): a block this append fills gets its key now but becomes
 * shareable only once its K/V are written, which the engine takes to be the case at the first
 * of: the next kvt_batch_release() of a batch holding the sequence, kvt_seq_park() (or the idle
 * park), or the NEXT kvt_seq_append() to this sequence. So write (or queue on the stream that
 * later batches are released with) the K/V of one append before appending again to the same
 * sequence; a server that prefills and parks without ever preparing a batch shares its prompt
 * from the park on.
 * Returns 0, or one of these, with the sequence in the state given:
 *   KVT_ECLOSED, KVT_EBUSY (the sequence is in an unreleased batch, or another thread's
 *   append, park or prepare of it is waiting), -EINVAL (n out of range,
 *   slot_mapping NULL), KVT_ETOOBIG (the n tokens span more blocks than HBM has slots: append
 *   fewer at a time; or the sequence would exceed 16,777,215 blocks or the most blocks one
 *   sequence may hold, below: it could never be read back, retrying cannot help), -ENOSPC (not
 *   now: HBM is pinned, or no tier has room to make space: other sequences hold it; the
 *   message says how many blocks are held by appends not yet unpinned by a release or park,
 *   this sequence's own included, and how many by batches), -ENOMEM, KVT_EDEVICE (the copy
 *   bringing the last block back failed): nothing appended and the sequence unchanged (tokens,
 *   blocks, length). The partially filled last block may have been brought into HBM for the append: it stays there, write-pinned until the next
 *   release or park, with its copies below HBM dropped.
 *   KVT_ELOST: the partially filled last block had no valid copy left (its NVMe read failed its
 *   checksum or could not be done, and no other tier held it): the sequence is TRUNCATED to its
 *   full blocks, n_tokens = floor(n_tokens / tokens_per_block) * tokens_per_block (see
 *   kvt_seq_info), the write pins of its earlier appends are dropped (their full blocks were
 *   made shareable first), and none of the @n tokens is appended. The caller recomputes the lost
 *   tokens [new n_tokens, old n_tokens): append them again and write their K/V, then append @n.
 * The reserve: one sequence holds at most
 *     max_blocks = (hbm_slots + host_slots + nvme_slots - slots quarantined for good) - R,
 *     R = one slot per tier below HBM (2 with HOST and NVMe, 1 with HOST only, 0 with HBM alone),
 * the room that moving one block down the cascade and one back up needs at each tier boundary
 * while their copies are in flight when everything else sits below. A sequence within it is
 * always readable through kvt_batch_prepare_ranges() windows that fit HBM, whatever tier its
 * blocks are in, when no other sequence holds room (otherwise -ENOSPC, "not now"). E.g. HBM 32,
 * HOST 32 and NVMe 64 slots: 126 blocks.
 */
KVT_API int kvt_seq_append(struct kvt_engine *e, kvt_seq_id s, const int32_t *tokens, size_t n,
			   int64_t *slot_mapping);

/**
 * kvt_seq_park() - demote every block of the sequence out of HBM (the idle chat session): to
 * @target (KVT_TIER_HOST or KVT_TIER_NVME; a tier the engine does not have is skipped to the
 * next one down). Blocks shared with another sequence that is in an unreleased batch stay
 * where they are (that batch uses them). Asynchronous: copies are queued; HBM slots are freed
 * as they complete (kvt_engine_poll/drain). The id stays valid; kvt_seq_resume() or a batch
 * brings it back. The full blocks its appends filled become shareable here (prefix sharing: the
 * K/V of every append must be written before the park, which copies them), as at a release.
 * Returns 0, KVT_ECLOSED, KVT_EBUSY (the sequence is in an unreleased batch or another
 * thread's call on it waits; or one of its blocks stayed pinned by another thread's transfer
 * through 1,000 waits for transfers: the blocks not yet demoted stay where they are, those on
 * their way down stay demoted; park again later), -EINVAL (bad target), -ENOSPC (no room below:
 * the blocks not yet demoted stay where they are; those already on their way down stay
 * demoted, which loses nothing). Every error comes with its message.
 * To KVT_TIER_NVME: before anything moves, NVMe room for every block not already there is made
 * (cached blocks nobody references are dropped, then restorable stored sessions, oldest
 * first); when the tier cannot hold them (it is full of live sequences' blocks) the call fails
 * with -ENOSPC and a message, and nothing moved. Otherwise the slots stay kept for the blocks
 * still on their way down (HBM -> HOST -> NVMe): a park to NVMe that returns 0 has all its
 * blocks on NVMe once kvt_engine_drain() returns 0 (unless resumed or used meanwhile, or an
 * NVMe write failed), and a keyed session (nvme_persist) is published then.
 */
KVT_API int kvt_seq_park(struct kvt_engine *e, kvt_seq_id s, enum kvt_tier target);

/**
 * kvt_seq_resume() - start promoting the sequence's blocks back to HBM (NVMe reads first, then
 * host-to-device copies) so that a later kvt_batch_prepare() finds them ready. Best effort:
 * stops early (returning 0) when HBM has no evictable room; prepare finishes the job.
 * Returns 0, KVT_ECLOSED, or a negative error code.
 */
KVT_API int kvt_seq_resume(struct kvt_engine *e, kvt_seq_id s);

/*
 * Persistent sessions. With opts.nvme_persist, a sequence opened with a session_key and parked to
 * KVT_TIER_NVME is *published*: when every block's NVMe write has completed, the data are made
 * durable (fdatasync) and then one record (key, tokens, slots, checksums) is appended to the
 * store's journal and made durable: the two-phase commit. After a crash or restart the journal is
 * replayed, and each published session can be reopened by its key, as of its last completed park.
 * A session whose park had not been published when the process died is absent (never partial).
 */

/**
 * kvt_session_list() - keys of the sessions published in the store that are not open in this
 * engine (restorable), of EVERY tenant, in no particular order: the operator's view (a store
 * shared by tenants). A server acting for one tenant lists with kvt_session_list_tenant().
 * @keys: receives up to @cap keys (may be NULL when @cap is 0).
 * Returns the total number of such sessions (may exceed @cap), or -EINVAL; 0 without a store.
 */
KVT_API int kvt_session_list(struct kvt_engine *e, uint64_t *keys, size_t cap);

/**
 * kvt_session_list_tenant() - as kvt_session_list(), only the sessions stored for @tenant (the
 * kvt_seq_opts.tenant of the sequence that published them, kept in the journal record).
 * Returns the total number of them (may exceed @cap), or -EINVAL; 0 without a store.
 */
KVT_API int kvt_session_list_tenant(struct kvt_engine *e, uint32_t tenant, uint64_t *keys,
				    size_t cap);

/**
 * kvt_seq_restore() - reopen the published session @session_key as a new sequence whose blocks
 * are on NVMe (parked). Every block's on-disk header is checked against the journal record
 * first (its slot was not reused, the write is the one published); if any does not match, the
 * session is dropped from the store and -ENOENT is returned, so a session is either restored
 * whole or absent. The data themselves are verified by checksum when read (resume/prepare).
 * @o:   options of the new sequence (priority, salt, extra_key; session_key is taken from the
 *       store). Its tenant (0 when @o is NULL) must be the tenant the session was stored for
 *       (the record's): the sequence gets that tenant, and another tenant is refused.
 * @out: receives the id.
 * Returns 0, -ENOENT (no such session, or it did not survive), -EPERM (the session was stored
 * for another tenant than o->tenant; or one of its blocks is shared, in memory or by the
 * journal, with a session of another tenant: a forged or inconsistent record, refused so that
 * blocks are never shared across tenants; nothing changes, the session stays in the store),
 * KVT_EBUSY (it is open in this engine), KVT_ETOOBIG (it has more blocks than one sequence may
 * hold in this engine's tiers, the reserve of kvt_seq_append(): stored by an engine with larger
 * tiers; it stays in the store), -EINVAL, -ENOMEM, -EIO (reading the headers failed).
 * With layer groups: every group's store must have the session (else -ENOENT, nothing
 * restored); when they hold different versions of it (a park that failed in one group after
 * another's went down, a crash between their publishes), the sequence is restored at the
 * longest length every group can serve (kvt_seq_append_groups' KVT_ELOST rule; kvt_seq_info
 * says it): shorter than stored, never mixed.
 */
KVT_API int kvt_seq_restore(struct kvt_engine *e, uint64_t session_key,
			    const struct kvt_seq_opts *o, kvt_seq_id *out);

/**
 * kvt_session_drop() - forget the published session @session_key of any tenant (journal
 * record removed, its NVMe slots freed unless an open sequence uses them or another stored
 * session shares them: a prefix attached from it): the operator's call, as
 * kvt_session_list(). Returns 0, -ENOENT, KVT_EBUSY (open).
 */
KVT_API int kvt_session_drop(struct kvt_engine *e, uint64_t session_key);

/**
 * kvt_session_drop_tenant() - as kvt_session_drop(), for a server acting for @tenant: a session
 * stored for another tenant is refused with -EPERM (and stays). Returns 0, -ENOENT, -EPERM,
 * KVT_EBUSY (open).
 */
KVT_API int kvt_session_drop_tenant(struct kvt_engine *e, uint32_t tenant, uint64_t session_key);

/*
 * Sessions that move between nodes (issue 18, item 4; docs/ARCHITECTURE.md "REMOTE tier").
 * With opts.remote_host, a sequence opened with a session_key can be published to the shared
 * Redis, and any engine of the same model_id and layout (another process, another node)
 * reopens it by its session key. What goes there: every FULL block as a content-addressed value
 * (key of its prefix chain hash and tenant, tiers/remote.h: shared with other sessions of the
 * same prefix, first writer wins), and one session value "kvt1:<ns>:<tenant>:s:<key>" holding
 * the token history, the full blocks' hashes, n_tokens, the tenant and the partial last block's
 * bytes (a partial block has no content address, so it travels inside the session value),
 * with an XXH3-64 of all of it (docs/FORMAT.md "REMOTE session values"). The session value is
 * overwritten by each publish (DEL, then SET NX), after the block values are stored.
 */

/**
 * kvt_seq_publish_remote() - snapshot the sequence @s and put it to the REMOTE tier,
 * asynchronously. Under the engine lock the bytes of every block are copied from HBM or HOST
 * (whichever holds a valid copy; the copy waits for the device, never for the network) into a
 * job that the engine's remote worker thread sends; the sequence is not changed and may be
 * appended to, parked, detached or closed at once. Call it when the sequence's K/V are written
 * (as for kvt_seq_park: not while a batch holding it is unreleased). Completions are reaped by
 * kvt_engine_poll() and kvt_engine_drain() (which waits for the queued jobs, each bounded by the
 * client's timeouts and breaker) and counted in kvt_stats.remote_*: a failed job (server down
 * or stopped, breaker open, server full) leaves the session simply not published remotely.
 * Returns 0 (queued), -EINVAL (no session_key, or a token appended without its id: the session
 * value carries the token history, so every token needs one),
 * KVT_ECLOSED, KVT_EBUSY (in an unreleased batch or another call), -EAGAIN (a block is only on
 * NVMe or in flight: kvt_seq_resume it, or drain, first), -ENOMEM, -ENODEV (no REMOTE tier).
 * Threading: takes the engine lock.
 */
KVT_API int kvt_seq_publish_remote(struct kvt_engine *e, kvt_seq_id s);

/**
 * kvt_seq_restore_remote() - reopen the session @session_key of tenant @o->tenant published to
 * the REMOTE tier (by this or any engine with the same model_id and layout) as a new sequence
 * of this engine: the session value and the blocks are fetched (at most two rounds each) and
 * verified, then the tokens are appended and the bytes written to HBM block by block (the
 * existing tiers then demote them as for any sequence). @o: as for kvt_seq_open (session_key is
 * taken from @session_key; tenant, salt and extra_key must be the publisher's: the blocks'
 * hashes are recomputed from the tokens and must equal the published ones). The calling thread
 * waits for the network (bounded by the client's timeouts), WITHOUT holding the engine lock.
 * Returns 0 and *out; -ENOENT (absent, evicted, another tenant's, or any value that fails a
 * check: never wrong bytes), -EINVAL (hashes differ: other salt/extra_key), -ENODEV (no
 * REMOTE tier), -EAGAIN/-ETIMEDOUT/-ECONNREFUSED (server unreachable), -ECONNRESET (the server
 * closed the connection, e.g. it restarted: the connection is dropped and the next call
 * reconnects), -EPROTO (an error reply), KVT_EBUSY (the key is open here),
 * KVT_ETOOBIG, -ENOSPC as kvt_seq_append. *out is 0 on failure, nothing left open.
 */
KVT_API int kvt_seq_restore_remote(struct kvt_engine *e, uint64_t session_key,
				   const struct kvt_seq_opts *o, kvt_seq_id *out);

/**
 * kvt_seq_tokens() - copy the token ids [@first, @first + @n) of the sequence @s into @out
 * (@n int32_t; -1 where kvt_seq_append was given no tokens). A server that reopened a session
 * (kvt_seq_restore_remote, kvt_seq_restore) reads its history back with it.
 * Returns 0, KVT_ECLOSED, -EINVAL (NULL @out with @n > 0, or the range past kvt_seq_info's
 * n_tokens). Threading: takes the engine lock.
 */
KVT_API int kvt_seq_tokens(struct kvt_engine *e, kvt_seq_id s, uint64_t first, int32_t *out,
			   size_t n);
/**
 * kvt_seq_set_priority() - retention priority of a token range (TensorRT-LLM's
 * KvCacheRetentionConfig::TokenRangeRetentionConfig): the blocks holding tokens
 * [first_token, first_token + n_tokens) get @priority until @duration_ms from now (0 = for good),
 * then fall back to the default 50. Blocks appended later get the sequence's own priority.
 * Priorities are kept per block across tiers (parking keeps them). Used by KVT_EVICT_PRIO; the
 * other policies ignore priorities.
 * @n_tokens: 0 = up to the end (first_token == the sequence's length: an empty range, a no-op).
 * Returns 0, KVT_ECLOSED, -EINVAL (priority > 100, range past end).
 */
KVT_API int kvt_seq_set_priority(struct kvt_engine *e, kvt_seq_id s, uint64_t first_token,
				 uint64_t n_tokens, uint8_t priority, uint32_t duration_ms);

/*
 * Prefix sharing. When tokens are passed to kvt_seq_append(), every full ("sealed") block gets
 * a key: XXH3-128 over (the previous block's key, its tokens, XXH3-128(tenant, salt, extra
 * key)): only sequences of one tenant with equal salts and extra keys ever share; at the next
 * kvt_batch_release() of the sequence, kvt_seq_park() of it or kvt_seq_append() to it (its K/V
 * are written then: see kvt_seq_append) the block becomes shareable.
 * A new sequence whose prompt starts with the same tokens (same tenant, salt and extra key)
 * attaches those blocks instead of computing them: the server prefills only the rest. Shared
 * blocks are immutable and refcounted; they are freed in no tier while a sequence references
 * them. After the last sequence closes, a sealed block stays cached (evictable) for the next
 * request with that prefix. A hit is confirmed by comparing tokens, so a hash collision is never
 * served. Only full blocks are shared: a sequence that diverges inside a block computes that
 * block itself. Without tokens (NULL) nothing is shared: the v0 behaviour. With a persistent
 * store (nvme_persist), the full blocks of sessions stored before a restart are found too (by
 * the prefix key stored with each block, confirmed by the tokens and the tenant of the
 * session's record): an
 * attach makes them blocks whose copy is the stored NVMe slot, shared with later attaches and
 * with the stored session when it is restored. A WINDOW or STATE group's pool finds there
 * the longest full-block boundary whose window,
 * and sinks, a stored session holds (a STATE pool: the checkpoint, the session's live state
 * block, which is at a boundary only when the session stopped on one or one token past it);
 * the blocks between are holes, as in a hit from the prefix index; every pool of a grouped
 * engine attaches the same boundary (docs/ARCHITECTURE.md "Sliding window in a core engine").
 * The store is searched linearly (stored sessions x the prompt's blocks).
 */

/**
 * kvt_seq_match_prefix() - how much of a prompt is already cached.
 * @o:      the options the sequence would be opened with (tenant, salt, extra_key); NULL =
 *          defaults.
 * @tokens: the prompt, @n tokens.
 * @matched_tokens: receives the tokens covered by cached sealed blocks (a multiple of
 *          tokens_per_block).
 * @tier:   receives the slowest tier any of them has to come from (KVT_TIER_HBM when all are
 *          in HBM), or KVT_TIER_COUNT when nothing matched. May be NULL.
 * Nothing is pinned or moved locally. With a REMOTE tier (opts.remote_host, unless
 * remote_no_fetch) the call is also the announcement of a remote prefix hit: the full blocks
 * after the local match (up to 256, and as many HOST slots as are free or held by clean
 * copies, valid in another tier: a guess never evicts a block's last copy nor waits) are
 * looked up in REMOTE with one pipelined get (<= 2 round trips), queued to the
 * remote worker; the call never waits for the network. The verified leading run lands in HOST
 * slots (INFLIGHT while the worker writes them) and becomes cached prefix blocks when a later
 * call reaps it (poll, drain, stats, match, attach); *matched_tokens counts only what is usable
 * now. Needs a HOST tier. Returns 0, -EINVAL, -ENOMEM.
 */
KVT_API int kvt_seq_match_prefix(struct kvt_engine *e, const struct kvt_seq_opts *o,
				 const int32_t *tokens, size_t n, uint64_t *matched_tokens,
				 enum kvt_tier *tier);

/**
 * kvt_seq_attach_prefix() - make an empty sequence start with the cached blocks matching the
 * prompt @tokens (@n tokens): they are shared (refcounted), not copied, and its n_tokens becomes
 * @attached_tokens (a multiple of tokens_per_block, possibly 0). The caller then appends and
 * prefills tokens [attached_tokens, n) only. The next kvt_batch_prepare() brings the attached
 * blocks to HBM. At most the most blocks one sequence may hold (the reserve of kvt_seq_append())
 * are attached; appending past them then gets KVT_ETOOBIG. With a REMOTE tier, blocks that a
 * kvt_seq_match_prefix() lookup landed in HOST are attached like local ones (they come up to
 * HBM through the next prepare); a block still in flight from REMOTE ends the match there (the
 * caller prefills it: stats.remote_late_blocks), the attach never waits for the network. The
 * blocks it attaches are reuse evidence for the write-through policy (opts.remote_write).
 * Returns 0, KVT_ECLOSED, -EINVAL (the sequence is not empty or is in a batch), -ENOMEM.
 */
KVT_API int kvt_seq_attach_prefix(struct kvt_engine *e, kvt_seq_id s, const int32_t *tokens,
				  size_t n, uint64_t *attached_tokens);

/**
 * kvt_tenant_set_budget() - the most slots of @tier the blocks of @tenant may hold (0 =
 * unlimited). Soft: after every kvt_batch_release() and in kvt_engine_poll(), a tenant above its
 * budget has its least valuable unpinned blocks demoted out of that tier (HBM -> HOST -> NVMe;
 * on NVMe only cached prefix blocks can go). Blocks count for the tenant of the sequence that
 * created them (blocks are shared only within a tenant); when the first budget of a tenant
 * is set, the blocks its open sequences hold and its cached prefix blocks are counted from
 * then on. Up to 64 tenants have budgets. Returns 0, -EINVAL (bad tier), -ENOSPC (64 tenants already).
 */
KVT_API int kvt_tenant_set_budget(struct kvt_engine *e, uint32_t tenant, enum kvt_tier tier,
				  uint64_t max_blocks);

/**
 * kvt_tenant_usage() - slots the blocks of @tenant hold per tier (tenants with a budget only;
 * -ENOENT for others). @used: KVT_TIER_COUNT entries.
 */
KVT_API int kvt_tenant_usage(struct kvt_engine *e, uint32_t tenant, uint64_t *used);

/** Where a sequence's blocks are. */
struct kvt_seq_info {
	uint64_t n_tokens;                /* tokens held (valid K/V) */
	uint32_t n_blocks;                /* block positions, summed over the storage groups of
	                                     a grouped engine, including those a WINDOW or
	                                     STATE group no longer holds (out of its window) */
	uint32_t blocks_in[KVT_TIER_COUNT]; /* blocks with a valid copy in each tier (held ones
	                                     only: after a park to NVMe and a drain,
	                                     blocks_in[HBM] and [HOST] are 0; blocks_in[NVME]
	                                     equals n_blocks only without WINDOW or STATE
	                                     groups) */
	uint32_t tenant;                  /* as opened */
	uint8_t priority;                 /* as opened */
	uint8_t parked;                   /* 1 after kvt_seq_park until resume/append/prepare */
};

/** kvt_seq_info() - fill @out. Returns 0 or KVT_ECLOSED. */
KVT_API int kvt_seq_info(struct kvt_engine *e, kvt_seq_id s, struct kvt_seq_info *out);

/* ------------------------------------------------------------------------------------------ */
/* Batches                                                                                      */

struct kvt_batch; /* opaque */

/**
 * The block table of a prepared batch in CSR form (FlashInfer's paged_kv_t): sequence i owns
 * indices[indptr[i] .. indptr[i+1]), the HBM slot ids of its blocks in order; its last block holds
 * last_block_len[i] tokens (1..tokens_per_block), seq_len[i] tokens in all. Arrays belong to the
 * batch and live until kvt_batch_release(). Entry i corresponds to seqs[i] (or ranges[i]).
 */
struct kvt_block_table {
	uint32_t n_seqs;               /* sequences in the batch */
	const uint32_t *indptr;        /* [n_seqs + 1], indptr[0] = 0 */
	const uint32_t *indices;       /* [indptr[n_seqs]] HBM slot ids */
	const uint32_t *last_block_len; /* [n_seqs] tokens in the last block of the window */
	const uint64_t *seq_len;       /* [n_seqs] tokens covered by the window */
	const uint32_t *first_block;   /* [n_seqs] index of the window's first block in its
	                                  sequence (0 for kvt_batch_prepare) */
	struct kvt_geometry geo;       /* base pointer and strides */
};

/**
 * kvt_batch_prepare() - make every block of the @n sequences resident in HBM and pin it
 * (eviction will not pick it) for one forward step. Blocks in HOST are copied up, blocks on NVMe
 * are read (checksums verified) and copied up; room is made by demoting the least recently used
 * unpinned blocks. Copies are asynchronous: wait with kvt_batch_wait_layer() before reading.
 * @seqs: n distinct open sequence ids.  @n: 1..65536.  @out: receives the batch.
 * Returns 0; KVT_ECLOSED; -EINVAL (duplicates, n out of range, a sequence holding no tokens:
 * append before preparing); KVT_EBUSY (a sequence is in another unreleased batch, or another
 * thread's append, park or prepare of it is waiting); KVT_ETOOBIG (the batch can never fit in
 * HBM: a clear message says how many blocks it needs and how many HBM has); -ENOSPC (not now:
 * HBM is pinned, by other unreleased batches or by appends whose write pins no release, park
 * or close of their sequence has dropped yet, the message says how many of each: release
 * batches, or park or close sequences that will not run this step, then retry; retrying alone
 * cannot help while the appends' pins stay); KVT_ELOST (a block failed its checksum or could not be read: each such sequence is
 * truncated before the lost block, see kvt_seq_info, and must be recomputed from there; nothing
 * is pinned). On failure nothing stays pinned.
 */
KVT_API int kvt_batch_prepare(struct kvt_engine *e, const kvt_seq_id *seqs, size_t n,
			      struct kvt_batch **out);

/** A window of one sequence's blocks, for sequences that do not fit in HBM at once. */
struct kvt_seq_range {
	kvt_seq_id seq;       /* an open sequence */
	uint32_t first_block; /* first block of the window */
	uint32_t n_blocks;    /* blocks in the window; 0 = up to the end of the sequence */
};

/**
 * kvt_batch_prepare_ranges() - as kvt_batch_prepare(), for windows of sequences: only the blocks
 * [first_block, first_block + n_blocks) of each range are made resident and pinned, and the block
 * table covers exactly those (block_table.first_block[i] says where a window starts). This is
 * how a sequence larger than HBM is decoded: the caller walks its windows in order, computes a
 * split-KV partial attention per window and merges them with log-sum-exp (kernels/attention.h,
 * FlashDecoding), releasing each window's batch before preparing the next. A sequence may appear
 * in several ranges only if they do not overlap. Errors as kvt_batch_prepare(), plus -EINVAL for
 * a range past the end of its sequence. A window of a sequence within kvt_seq_append()'s limit
 * (the tiers' slots less the reserve) always makes progress when its blocks fit HBM: when an
 * NVMe-only block needs a HOST slot and HOST and NVMe hold only blocks without another copy,
 * a HOST block outside the batch is moved up into free HBM (or a batch block's HOST copy
 * written to NVMe and traded for an HBM victim's demotion), never -ENOSPC for ever.
 */
KVT_API int kvt_batch_prepare_ranges(struct kvt_engine *e, const struct kvt_seq_range *ranges,
				     size_t n, struct kvt_batch **out);

/**
 * kvt_batch_prepare_group() - kvt_batch_prepare_ranges() in the pool of one layer group only:
 * @group a FULL, WINDOW, LATENT or STATE group, or a SIDECAR group (its parent's pool). So a
 * sparse decode step prepares, per sequence and group, only the blocks it selected (one-block
 * ranges of the top-k blocks a SIDECAR's keys or summaries scored, plus sinks and the recent
 * window), while another batch holds another group's blocks of the same sequences (a WINDOW
 * group's window, a STATE group's live block): each pool's sequences are guarded by their own
 * batch. The batch's tables (kvt_batch_group_table), waits and release concern that pool: any
 * other group answers -EINVAL. Append in the step's last batch of each group it writes (the
 * release of a batch holding a group publishes that group's appended blocks). Errors as
 * kvt_batch_prepare_ranges(), plus -EINVAL for @group out of range or an ALIAS group. An engine
 * without groups: group 0, the same as kvt_batch_prepare_ranges().
 */
KVT_API int kvt_batch_prepare_group(struct kvt_engine *e, uint32_t group,
				    const struct kvt_seq_range *ranges, size_t n,
				    struct kvt_batch **out);

/**
 * kvt_engine_hint() - schedule hint: the sequences @seqs[0..n) will be in a batch
 * @steps_ahead steps from now (0 or 1: the next batch this thread prepares; 2 and more: later).
 * The engine starts their promotions at once and returns without waiting for them:
 *   - steps_ahead <= 1: every block goes up to HBM: blocks only on NVMe are read into HOST first
 *     (the slowest leg starts first) and continue to HBM when the read lands; blocks in HOST are
 *     copied up as one batched copy per layer group, in layer order, so a later
 *     kvt_batch_wait_layer(l) waits only for layer l's copies.
 *   - steps_ahead >= 2: only NVMe -> HOST reads start (HBM is kept for nearer batches).
 * Until a batch holding the sequence, prepared after this call, is released (or the sequence is
 * parked or closed, or hinted again: the latest hint replaces the range), making room spares
 * the hinted blocks in HBM and HOST: promotions for one announced batch never evict blocks that
 * another announced batch or a prepared batch needs. A hint is a forecast: a prepare or append
 * that can make room no other way still evicts hinted blocks rather than fail.
 * Best effort: when HBM (or HOST) has no room that can be made without waiting (everything is
 * pinned or announced), the remaining blocks are left for the prepare, which finishes the job.
 * Typical use: while batch k computes, hint the sequences of batch k + 1 (the next group of a
 * step too large for HBM, or the next window of a streamed sequence: kvt_engine_hint_ranges).
 * @seqs: n open sequence ids (copied; duplicates allowed).  @n: 1..65536.
 * Blocking: never waits for transfers (holds the engine mutex while it queues them).
 * Returns 0; -EINVAL (NULL, n out of range; nothing hinted); KVT_ECLOSED (a sequence is not
 * open; nothing hinted); KVT_ETOOBIG (steps_ahead <= 1 and the sequences' blocks together exceed
 * the HBM slots: hint what one batch holds); -ENOMEM or KVT_EDEVICE (submitting the copies
 * failed; the engine stays usable and the prepare will retry them). Counted in stats.hints; the
 * bytes it moves count as bytes_prefetched of HOST/HBM.
 */
KVT_API int kvt_engine_hint(struct kvt_engine *e, const kvt_seq_id *seqs, size_t n,
			    uint32_t steps_ahead);

/**
 * kvt_engine_hint_ranges() - as kvt_engine_hint(), for windows of sequences (struct
 * kvt_seq_range: n_blocks 0 = to the end): only those blocks are promoted and spared. A server
 * streaming a sequence larger than HBM hints window w + 1 while it computes window w. Errors as
 * kvt_engine_hint(), plus -EINVAL for a range past the end of its sequence (a sequence holding
 * no tokens yet accepts only {first_block 0, n_blocks 0}, and nothing happens for it).
 */
KVT_API int kvt_engine_hint_ranges(struct kvt_engine *e, const struct kvt_seq_range *ranges,
				   size_t n, uint32_t steps_ahead);

/** kvt_batch_block_table() - the batch's block table (see struct kvt_block_table). */
KVT_API int kvt_batch_block_table(const struct kvt_batch *b, struct kvt_block_table *out);

/**
 * kvt_batch_wait_layer() - make layer @layer's blocks usable.
 * @stream: NULL: the host blocks until the copies carrying that layer are complete.
 *          A device stream (cudaStream_t, or one from kvt_engine_stream_create): the stream is
 *          made to wait for them (cudaStreamWaitEvent) and the host returns at once.
 * Host-to-device promotions move one layer group at a time (all the blocks' layer l, then
 * l + 1, ...: one batched copy and one event per group; a group is one layer for models of up to
 * 32 layers), so this waits only for the copies up to layer @layer's group: the compute of layer
 * l overlaps the copies of the layers after it. Blocks that were already in HBM when the batch
 * was prepared need no wait at all. A wait that finds the copies unfinished counts as a stall
 * (stats.stalls; a host wait adds its time to stall_ns, a stream wait adds nothing there: the
 * device waits) and makes the batch's prefetched blocks count as not ready.
 * Returns 0, -EINVAL (NULL batch, layer out of range), KVT_EDEVICE.
 */
KVT_API int kvt_batch_wait_layer(struct kvt_batch *b, uint32_t layer, void *stream);

/**
 * kvt_batch_release() - end the step: unpin the batch's blocks (and the write pins of the
 * sequences' appended blocks) and free the batch.
 * @stream: the device stream on which the step's kernels read the blocks and wrote new K/V
 *          (NULL when all of that was done synchronously on the host). Every later copy that
 *          reads or overwrites an HBM slot waits for the work queued on it so far, so a demotion
 *          never reads K/V before it is written and a promotion never overwrites a slot a kernel
 *          still reads.
 * Afterwards, tiers above their high watermark start demoting in the background.
 * The full blocks the sequences' appends filled become shareable (prefix sharing; also at a park
 * or at the sequence's next append, see kvt_seq_append), and their write pins are dropped.
 * Returns 0 or a negative code (the batch is freed in every case). If the device cannot order
 * the copies after @stream, the host waits for @stream instead; if even that fails (a sticky
 * device error), the batch's blocks stay pinned and are never copied again.
 */
KVT_API int kvt_batch_release(struct kvt_batch *b, void *stream);

/* ------------------------------------------------------------------------------------------ */
/* Statistics                                                                                   */

/* Latency histogram buckets (upper bounds, ns) used by struct kvt_tier_stats::promote_lat:
 * 10us 50us 100us 500us 1ms 5ms 10ms 50ms 100ms 500ms, then +Inf. */
#define KVT_LAT_BUCKETS 11
#define KVT_LAT_BUCKET_BOUNDS_NS                                                           \
	{ 10000ull, 50000ull, 100000ull, 500000ull, 1000000ull, 5000000ull, 10000000ull,       \
	  50000000ull, 100000000ull, 500000000ull, UINT64_MAX }

enum kvt_move {
	KVT_MOVE_HBM_TO_HOST = 0,
	KVT_MOVE_HOST_TO_NVME = 1,
	KVT_MOVE_NVME_TO_HOST = 2,
	KVT_MOVE_HOST_TO_HBM = 3,
	KVT_MOVE_COUNT = 4,
};

struct kvt_tier_stats {
	uint64_t capacity_bytes; /* slots x slot bytes */
	uint64_t used_bytes;     /* slots in use x slot bytes */
	uint32_t slots;          /* slots in the tier */
	uint32_t used_slots;     /* slots in use (holding data or being written) */
	uint64_t evictions;      /* copies dropped from this tier to make room */
	/* The fields below are filled by later subsystems (prefetch, prefix index, codec); a field
	 * whose subsystem is not built stays 0. */
	uint64_t hits;            /* HBM: block accesses by batches that found the block ready
				   (in HBM when prepared, or prefetched and landed before the
				   batch's waits); HOST: accesses not ready in HBM whose block
				   was in HOST (or on its way there) */
	uint64_t misses;          /* HBM: accesses that waited for a promotion; HOST: those of
				   them that had to read the block from NVMe first */
	uint64_t bytes_prefetched; /* bytes promoted into this tier ahead of need (hints, resume) */
	uint64_t bytes_on_demand; /* bytes promoted into this tier because a batch or an append
				   needed them now */
	uint64_t prefix_hit_blocks; /* sealed blocks found here through the prefix index */
	uint64_t promote_count;   /* promotions into this tier that completed (HBM: host-to-device
				   copies; HOST: NVMe reads) */
	uint64_t promote_ns_sum;  /* their total latency, ns: from issue to the poll or wait that
				   saw the completion (queueing included) */
	uint64_t promote_lat[KVT_LAT_BUCKETS]; /* histogram of that latency; bucket i counts
						* latencies <= kvt_lat_bucket_ns[i] (not cumulative),
						* the last bucket everything above */
};

/* A latency histogram of struct kvt_stats (0.4): the buckets of kvt_tier_stats.promote_lat. */
struct kvt_lat_hist {
	uint64_t count;                /* events recorded */
	uint64_t ns_sum;               /* their total duration, ns */
	uint64_t lat[KVT_LAT_BUCKETS]; /* bucket i counts durations <= KVT_LAT_BUCKET_BOUNDS_NS[i]
					  (not cumulative), the last everything above */
};

struct kvt_stats {
	size_t size;                                /* sizeof(struct kvt_stats) as compiled */
	struct kvt_tier_stats tier[KVT_TIER_COUNT]; /* per tier */
	uint64_t blocks_moved[KVT_MOVE_COUNT];      /* completed block copies per direction */
	uint64_t bytes_moved[KVT_MOVE_COUNT];       /* their bytes: a block each, except an
	                                               HBM->HOST demotion of a block appended
	                                               to since its last HOST copy, which
	                                               copies only the tokens written since
	                                               into that copy's old slot when HOST
	                                               still has it (docs/ARCHITECTURE.md
	                                               "Block state machine") */
	uint64_t checksum_verified;                 /* NVMe reads whose checksum matched */
	uint64_t checksum_failed;                   /* NVMe reads whose checksum did not */
	uint64_t io_errors;                         /* NVMe reads/writes that failed */
	uint64_t evictions;                         /* sum over tiers */
	uint64_t stalls;                            /* waits that found copies unfinished
						       (layer waits, host or stream; prepare,
						       append) */
	uint64_t stall_ns;                          /* host time spent in those waits */
	uint64_t blocks_lost;                       /* blocks dropped as unrecoverable */
	uint32_t seqs_open;                         /* open sequences */
	uint32_t batches_open;                      /* unreleased batches */
	uint64_t transfers_in_flight;               /* copies and IOs not yet completed */
	/* filled by later subsystems; 0 where not built */
	uint64_t accesses;            /* block accesses by released batches (coverage denom.) */
	uint64_t accesses_ready;      /* of those, found ready: in HBM when prepared, or prefetched
					 and landed without a stall (coverage numerator) */
	uint64_t hints;               /* schedule hints accepted (kvt_engine_hint* calls) */
	uint64_t prefix_lookups;      /* sealed blocks looked up in the prefix index */
	uint64_t prefix_hit_blocks;   /* of those, found and shared */
	uint64_t prefix_hit_tokens;   /* tokens covered by those hits (prefill saved) */
	uint64_t shared_blocks;       /* blocks referenced by more than one sequence now */
	uint64_t codec_blocks;        /* NVMe blocks stored compressed */
	uint64_t codec_raw_bytes;     /* bytes before compression of blocks written to NVMe */
	uint64_t codec_stored_bytes;  /* bytes after (raw where compression did not pay) */
	uint64_t meta_bytes;          /* host memory used by kvtier's own metadata: block records,
	                                 prefix index, eviction lists, slot owner maps, sequence
	                                 tables and their block arrays (capacities, not only what
	                                 is used); token ids are NOT included: meta_token_bytes */
	/* ---- 0.2 */
	uint64_t idle_parked;         /* sequences parked by the idle timeout */
	uint64_t meta_block_records;  /* block records allocated (meta_bytes / this = per block) */
	uint64_t meta_token_bytes;    /* host memory holding token ids (4 bytes per token, each
	                                 token kept once: the sequences' arrays plus the prefix
	                                 index's copies for cached blocks of closed sequences) */
	/* ---- 0.3 */
	uint64_t batches;             /* batches prepared (kvt_batch_prepare* that succeeded) */
	uint64_t h2d_groups;          /* host-to-device copy groups submitted: each is one batched
					 copy per layer group, whatever its number of blocks */
	uint64_t repromotions;        /* host-to-device promotions of a block already promoted
					 since its last access by a batch: a block promoted twice
					 for one use (wasted copy bandwidth) */
	/* ---- 0.4 */
	struct kvt_lat_hist nvme_write; /* HOST-to-NVMe block writes that succeeded: from issue
					   to the poll or wait that saw the completion */
	struct kvt_lat_hist park;     /* parks that succeeded (kvt_seq_park, the idle timeout):
					 host time in the call, which issues the demotions and
					 submits them; the copies land later (their latency is in
					 nvme_write and blocks_moved; kvt_engine_drain waits) */
	struct kvt_lat_hist resume;   /* kvt_seq_resume calls that succeeded: host time in the
					 call, which issues the promotions (the next prepare
					 waits for what has not landed) */
	/* ---- 0.5: REMOTE tier (all 0 without one) */
	uint64_t remote_publishes;    /* kvt_seq_publish_remote() jobs whose session value was
					 stored (completions reaped by poll or drain) */
	uint64_t remote_publish_failed; /* ... that failed (server down, breaker open, full):
					 the session is then not published remotely */
	uint64_t remote_blocks_put;   /* block values sent by those jobs (stored or already
					 there) */
	uint64_t remote_restores;     /* kvt_seq_restore_remote() calls that reopened a session */
	uint64_t remote_restore_misses; /* ... that found it absent, unverifiable or of another
					 tenant (-ENOENT) */
	uint64_t remote_bytes_out;    /* bytes the REMOTE client wrote to its sockets */
	uint64_t remote_bytes_in;     /* bytes of values and replies it received */
	uint64_t remote_breaker_trips; /* times a server's breaker opened */
	uint64_t remote_errors;       /* connection-level failures (timeouts included) */
	uint64_t remote_breaker_open; /* gauge: 1 when a server's breaker was open after the
					 worker's latest job, else 0 */
	/* ---- 0.5: write-through, remote prefix hits, write budgets (issue 18 items 1-3) */
	uint64_t remote_wt_queued;    /* sealed blocks queued for write-through */
	uint64_t remote_wt_stored;    /* ... put (stored now, or already there: first writer wins) */
	uint64_t remote_wt_failed;    /* ... whose put failed (server down, breaker, full) */
	uint64_t remote_lookups;      /* remote prefix lookups sent (one pipelined get each) */
	uint64_t remote_lookup_blocks; /* blocks they asked for */
	uint64_t remote_hit_blocks;   /* blocks verified and landed in HOST (the longest verified
					 prefix of each lookup), then in the prefix index */
	uint64_t remote_miss_blocks;  /* asked for and not landed: absent, bad value (deleted),
					 after the first miss, server error or breaker open, or
					 redundant (its key was indexed here meanwhile) */
	uint64_t remote_bad_values;   /* values that failed verification (never served) */
	uint64_t remote_late_blocks;  /* attaches that stopped at a block still in flight from
					 REMOTE (the caller recomputed it: never a network wait) */
	uint64_t wb_admitted_bytes[2]; /* write budget, [0] NVMe, [1] REMOTE: bytes admitted */
	uint64_t wb_refused_bytes[2]; /* bytes refused (writes saved) */
	uint64_t wb_refused[2];       /* writes refused */
	uint64_t wb_hits_lost[2];     /* lookups that missed a block whose write was refused here
					 (NVMe: a local prefix miss; REMOTE: a remote miss) */
	uint64_t remote_round_trips;  /* pipelined rounds of the REMOTE client (every job's) */
};

/** kvt_engine_stats() - snapshot of the counters. @out->size must be set by the caller. */
KVT_API int kvt_engine_stats(struct kvt_engine *e, struct kvt_stats *out);

/**
 * kvt_engine_metrics_text() - the engine's counters in the Prometheus text exposition format
 * 0.0.4 (what a /metrics endpoint serves with Content-Type "text/plain; version=0.0.4").
 * Names start with kvtier_, counters end in _total, values are in base units (bytes, seconds);
 * per-tier series carry tier="hbm|host|nvme" (capacity, used, slots, evictions, hits, misses,
 * prefetched and on-demand bytes, prefix hits), copies carry direction="hbm_to_host|
 * host_to_nvme|nvme_to_host|host_to_hbm"; kvtier_promotion_duration_seconds is a histogram per
 * tier the block is promoted FROM (tier="host": host-to-HBM copies, promote_* of the HBM
 * tier's stats; tier="nvme": NVMe reads, promote_* of HOST's; no tier="hbm" series);
 * kvtier_nvme_write_duration_seconds, kvtier_park_duration_seconds and
 * kvtier_resume_duration_seconds are histograms of stats.nvme_write, park and resume;
 * kvtier_build_info{version="<kvt_version()>",cuda="yes|no|emulated"} is 1. Engine-wide:
 * accesses and prefetch coverage, stalls and stall seconds, checksum failures, IO errors, lost
 * blocks, hints, prefix lookups and hits, codec bytes, open sequences and batches, transfers in
 * flight, metadata bytes, idle_parked, batches, repromotions. See engine/metrics.c.
 * @buf: receives the NUL-terminated text; may be NULL when @cap is 0 (a size query).
 * @cap: size of @buf in bytes.
 * @len: on success the text's length (without the NUL); on -ENOSPC the buffer size needed
 *       (with the NUL). Counters grow between calls: allocate some slack (a few KiB of text).
 * Returns 0, -EINVAL (NULL engine or len, NULL buf with cap > 0), -ENOSPC (too small: @buf
 * holds "" when cap > 0). Thread-safe as kvt_engine_stats().
 */
KVT_API int kvt_engine_metrics_text(struct kvt_engine *e, char *buf, size_t cap, size_t *len);

/**
 * kvt_stats_metrics_text() - as kvt_engine_metrics_text() for a snapshot taken earlier with
 * kvt_engine_stats() (@st->size as set for that call; fields beyond it read as 0), e.g. after
 * the engine is gone. Returns 0, -EINVAL (NULL @st or @len, bad @st->size), -ENOSPC.
 */
KVT_API int kvt_stats_metrics_text(const struct kvt_stats *st, char *buf, size_t cap,
				   size_t *len);


/* ------------------------------------------------------------------------------------------ */
/* Layer groups (issue 16; docs/ARCHITECTURE.md "Layer groups")                                 */

/*
 * A model is a list of layer groups; each group has a kind and holds some of the model's layers
 * (every model layer 0..layout.n_layers-1 in exactly one group). Each STORAGE group (FULL,
 * WINDOW, LATENT) is kept by its own pool: one internal engine per group with its own tiers,
 * slot size (exactly the group's block bytes: no padding), lock, eviction, prefix index (keys
 * per (chain hash, group)), tenant budgets and NVMe file (group 0's in nvme_dir as today,
 * group g's in "<nvme_dir>/group<g>", created when absent). The public calls fan out: a public
 * sequence is one sequence per storage group, all holding the same tokens. ALIAS groups have
 * no storage. An engine without groups is one FULL group (group 0) and every call behaves as
 * it always did.
 *
 * Blocks of every group hold tokens_per_block tokens (the layout's: common to all groups) and
 * are laid out block-first like the single layout: layer i of the group (its i-th entry of
 * layers[]) of a block starts at i * layer_block_bytes; within it K, [tokens_per_block]
 * [k_token_bytes], then V, [tokens_per_block][v_token_bytes] (no V for LATENT).
 *
 * Calls on an engine with groups:
 *   - per group: kvt_group_geometry, kvt_layer_group, kvt_seq_append_groups,
 *     kvt_batch_group_table, kvt_batch_wait_group_layer, kvt_engine_group_stats.
 *   - fanned out over the groups with the single-layout meaning: kvt_seq_open, close,
 *     detach, park, resume, info (n_blocks, blocks_in: sums over the groups), tokens,
 *     set_priority, match_prefix (the tokens every group can serve), attach_prefix (that many
 *     in every group), kvt_tenant_set_budget (max_blocks applies to each group's pool alone),
 *     kvt_tenant_usage (the pools' slots summed), kvt_batch_prepare, prepare_ranges,
 *     kvt_engine_hint, hint_ranges (block indices are the sequence's: the same token range in
 *     every group), kvt_batch_wait_layer (a MODEL layer: waits in the group holding it, the
 *     source's for an ALIAS layer), kvt_batch_release, kvt_engine_poll, drain, stats (totals
 *     over the groups; kvt_engine_group_stats per group) and metrics (the totals, then per
 *     group: kvtier_group_slot_bytes{group,kind,layers}, kvtier_group_slots,
 *     kvtier_group_used_slots and kvtier_group_evictions_total{group,kind,tier},
 *     kvtier_group_prefix_hit_blocks_total{group,kind}), the streams.
 *   - refused with -EINVAL and a message naming the per-group call: kvt_engine_geometry,
 *     kvt_seq_append, kvt_batch_block_table (one geometry cannot describe several groups).
 *   - the persistent store (nvme_persist): every pool has its own store (group 0's in
 *     nvme_dir, group g's in nvme_dir/group<g>), whose superblock names the groups (their
 *     fingerprint) and the group: a store of other groups, or of a single layout, is refused
 *     with KVT_EFORMAT. A pool publishes its part of a session when its own blocks are
 *     durable; a session is durable only when every group's store has it: kvt_session_list
 *     (_tenant) lists the sessions all stores have, kvt_seq_restore restores every group or
 *     none (-ENOENT naming the group whose store lacks it; the others keep their part),
 *     kvt_session_drop(_tenant) drops it from every store, detach and close as for one
 *     engine.
 *   - not yet per group: the REMOTE tier (remote_host: create refuses it with KVT_ENOTSUP;
 *     kvt_seq_publish_remote / kvt_seq_restore_remote then answer -ENODEV).
 * A fanned-out call that fails in one group undoes what it did in the others where that is
 * possible (open, append, attach_prefix, prepare: nothing half-done is visible); park and
 * resume are best effort per group, as in one engine, and return the first error.
 * Threading: as for one engine. While another thread's fanned-out call changes a public
 * sequence (append, park, resume, close, detach, set_priority, attach_prefix), the calls that
 * would change it or prepare it answer KVT_EBUSY, as for a sequence whose call sleeps; info,
 * tokens and hints read it meanwhile (info may then see some groups before the change and
 * others after it).
 */

#define KVT_MAX_GROUPS 16     /* groups of one engine */
#define KVT_GROUP_MAX_STATE 4 /* state tensors of one STATE group layer (issue 17) */

enum kvt_group_kind {
	KVT_GROUP_FULL = 0,    /* K and V per token and layer; V may have its own head_dim */
	KVT_GROUP_WINDOW = 1,  /* as FULL, but attention reads only the last `window` tokens plus
	                          the first `sink`: blocks wholly out of both leave the tiers once
	                          no sequence needs them (unless the prefix cache keeps them),
	                          checked at each append: after a one-shot prefill they go at the
	                          first decode step's append */
	KVT_GROUP_LATENT = 2,  /* one K-only vector of latent_dim elements per token and layer
	                          (MLA: kv_lora_rank + qk_rope_head_dim); no V */
	KVT_GROUP_ALIAS = 3,   /* layers that read another layer's KV (cross-layer sharing):
	                          no storage */
	KVT_GROUP_STATE = 4,   /* a fixed-size state per sequence and layer (linear attention:
	                          Gated DeltaNet, Mamba), checkpointed at block boundaries:
	                          see "STATE groups" below */
	KVT_GROUP_SIDECAR = 5, /* per-token and per-block metadata stored in its parent
	                          group's blocks (sparse-attention indexer keys, page
	                          summaries): see "SIDECAR groups" below */
};

/*
 * SIDECAR groups (issue 17). A SIDECAR group names a parent (a FULL, WINDOW or LATENT group,
 * at most one sidecar each) and adds, to every layer of every block of the parent, after the
 * layer's K/V: tokens_per_block x sidecar_token_bytes (token t's at t x sidecar_token_bytes)
 * then sidecar_block_bytes. Those bytes are PART OF THE PARENT'S BLOCK: its slot grows by
 * n_layers x that, and everything that moves, checksums, encodes, parks, stores, restores,
 * shares by prefix or evicts a block does so with its sidecar, which is never apart from it.
 * The group has no pool, no layers of its own (its n_layers/layers are 0/NULL or exactly its
 * parent's) and no sequences; its slot-mapping row of kvt_seq_append_groups is its parent's,
 * its table (kvt_batch_group_table) the parent's, its geometry the parent's pool with kind
 * SIDECAR and no K/V fields; kvt_group_sidecar() gives the offset inside a layer.
 * Writing: as K/V, through the parent's slot mapping, before the release (a per-block part,
 * e.g. a page summary, rewritten by each append that touches the block).
 * Reading for scoring (an indexer over every block, a Quest-style page score): each block
 * record keeps a host MIRROR of its sidecar, refreshed when a host copy of the block appears
 * (demoted to HOST, read from NVMe) or when kvt_seq_sidecar_read() reads it from HOST or HBM;
 * kvt_seq_sidecar_read() copies from it without bringing any block up, so a step scores every
 * block, then prepares only the selected ones (kvt_batch_prepare_group with one-block ranges
 * in the parent's pool; kvt_batch_prepare_ranges would apply the ranges to every group;
 * kvt_engine_hint_ranges names them ahead). Mirror memory: n_layers x the sidecar per block
 * record, host memory, allocated with the block table.
 * Page summaries kvtier keeps itself (sidecar_summary = KVT_SUMMARY_K_MINMAX, both sizes 0):
 * no bytes are added to the parent's blocks; the mirror of each block holds, per layer, the
 * Quest summary of its K (Tang et al. 2024, arXiv 2406.10774 sec. 3.2; kernels/sparse.h):
 * [n_kv_heads][2][head_dim] fp32, the element-wise min then max over the block's tokens
 * (those appended so far in a partial last block; a LATENT parent: one head of latent_dim),
 * computed from the block's K whenever the mirror is filled (so, like the bytes above, it is
 * there for every block that was in HOST or HBM since this engine started). kvt_group_sidecar
 * gives token_bytes 0 and block_bytes = n_kv_heads x 2 x head_dim x 4; kvt_seq_sidecar_read
 * returns [n_blocks][that]. Score with q: sum_i max(q_i min_i, q_i max_i) per head.
 * Create errors (-EINVAL naming the group): parent out of range or itself, a parent that is not
 * FULL, WINDOW or LATENT, a second sidecar of one parent, layers that are not the parent's,
 * both sizes 0 (without a summary) or not 0 (with one), an unknown sidecar_summary,
 * sidecar_token_bytes over 65536 or sidecar_block_bytes over 16 MiB, a block over 1 GiB with
 * them; tokens_per_block other than the layout's: KVT_ENOTSUP.
 */

/** What kvtier computes itself for a SIDECAR group (struct kvt_group.sidecar_summary). */
enum kvt_sidecar_summary {
	KVT_SUMMARY_NONE = 0,     /* the caller writes the bytes */
	KVT_SUMMARY_K_MINMAX = 1, /* Quest: per block, layer and KV head the min and max of K */
};

/*
 * STATE groups (issue 17). A STATE group's pool holds, per block of a sequence, the state of
 * all the group's layers AFTER that block's last token: its slot is n_layers x the layer's
 * state (the n_state tensors in order, each at its element size's alignment:
 * kvt_group_state_tensor gives offsets and sizes), whatever tokens_per_block. So:
 *   - the sequence's last block holds the LIVE state (after its newest token), and every full
 *     block a CHECKPOINT: the state at that block boundary;
 *   - writing: for token i of an append, row g of kvt_seq_append_groups gives slot mapping m;
 *     its block's HBM SLOT is m / tokens_per_block (the offset within it is meaningless). The caller,
 *     running the recurrence in token order, writes into that block the state after the last
 *     token of the append that falls in it (for a full block: the checkpoint) before the
 *     release, as K/V are written. A one-token decode step writes its block; a prefill chunk
 *     writes every block it touches. The state before a sequence's first token is zero (the
 *     caller's kernel starts from zeros: kvtier does not clear slots);
 *   - reading: a step reads the state after the sequence's newest token before the append,
 *     i.e. block POSITION (n_tokens - 1) / tokens_per_block: its slot is indices[k] of the
 *     group's table (kvt_batch_group_table) for the entry k whose block_pos[k] is that
 *     position. The pool keeps, like a WINDOW group of
 *     window 2 and no sinks, only the blocks of the two newest positions (the one read and
 *     the one written): a prepared batch's table of the group lists those live blocks (one,
 *     or two when the append crossed a block boundary, and every block of a prefill chunk
 *     until the next append; block_pos tells which is which); an older block
 *     leaves the tiers at the next append, or stays cached as a checkpoint in the prefix cache
 *     (opts.prefix_cache) and is evicted like any cached block. A decode step updating in place
 *     reads and writes the same block except at a boundary, where it reads the previous
 *     block and writes the new one. One decode step, in order: kvt_seq_append_groups (1
 *     token: map[g] is its mapping in the STATE group g), kvt_batch_prepare, find the slot of
 *     position (n - 1) / tpb in the STATE table and read the state (n = the tokens held
 *     before the append; zeros at n = 0), compute, write the new state into slot map[g] /
 *     tpb (and the K/V of the other groups through their rows), kvt_batch_release;
 *   - prefix hits: a STATE pool serves a hit at boundary k x tokens_per_block only while the
 *     checkpoint of block k - 1 is kept (match/attach find the longest boundary EVERY group
 *     serves); the attached sequence's last block is that checkpoint, restored byte-exact.
 *     A whole-prompt hit leaves no token to compute logits from: ask with the prompt less
 *     its last token (vLLM's rule), so the hit ends at a checkpoint before it;
 *   - park/resume, the NVMe store, the persistent store (crash and restore), checksums, the
 *     codec (lossless), tenants and budgets: the pool's blocks as any pool's (only the live
 *     blocks move with a parked sequence).
 * Checkpoint policy (checkpoint_every): a full block not kept leaves the tiers when the window
 * passes it, so checkpoint memory falls by N, and a hit ends at the last kept boundary at or
 * below the shared length; kvt_seq_checkpoint() keeps the one a server knows it will reuse
 * (the end of a shared system prompt: the boundary at or below it).
 * Memory: a decoding sequence holds at most 2 state slots in HBM (the default share sizes the
 * pool for those 2 against the other groups' blocks of group_ref_tokens tokens); a prefill
 * chunk of n tokens holds ceil(n / tokens_per_block) + 1 until the next append: with HBM
 * alone and the default split, that is more than one sequence may hold (KVT_ETOOBIG for a
 * chunk over 2 blocks): give the group a share (or a HOST tier) sized for the chunks.
 * tokens_per_block must be the layout's (a checkpoint every block; coarser checkpoints:
 * KVT_ENOTSUP today). Create errors: -EINVAL naming the group for n_state outside 1..4, a
 * tensor's n_dims outside 1..4, a dimension outside 1..2^20, more than 2^30 elements in a
 * tensor, an unknown dtype, a block (n_layers x the layer's state) over 1 GiB, a pool of fewer
 * than 2 HBM slots, or an ALIAS layer reading a STATE layer.
 * Fields of struct kvt_group used: kind, n_layers, layers, n_state, state[], share (dtype,
 * heads and dims are ignored: each tensor has its own dtype).
 */

/** struct kvt_group.checkpoint_every: keep only the checkpoints kvt_seq_checkpoint asks for. */
#define KVT_CHECKPOINT_ASKED UINT32_MAX

/** One tensor of a STATE group's per-sequence state (issue 17). */
struct kvt_state_tensor {
	uint32_t n_dims;        /* 1..4 */
	uint32_t shape[4];      /* elements per dimension (row-major, last fastest) */
	enum kvt_dtype dtype;   /* element type */
};

/** A layer group. Fill with kvt_group_init(g, sizeof *g), then set the fields of its kind. */
struct kvt_group {
	size_t size;               /* sizeof(struct kvt_group) as the caller compiled it; also
	                              the stride of kvt_engine_opts.groups */
	enum kvt_group_kind kind;
	uint32_t n_layers;         /* model layers in the group, 1..layout.n_layers */
	const uint32_t *layers;    /* [n_layers] their model layer indices, distinct; layer i of
	                              the group is model layer layers[i] (any order) */
	/* FULL, WINDOW */
	uint32_t n_kv_heads;       /* K/V heads per layer, 1..4096 */
	uint32_t head_dim;         /* K elements per head, 1..4096 */
	uint32_t v_head_dim;       /* V elements per head, 0 = head_dim (MLA expanded, DeepSeek's
	                              v_head_dim 128 against a K head of 192) */
	/* LATENT */
	uint32_t latent_dim;       /* elements per token and layer, 1..4096 */
	/* WINDOW */
	uint32_t window;           /* tokens attention reads back from the newest, >= 1 */
	uint32_t sink;             /* leading tokens always kept (gpt-oss sinks); 0 = none */
	/* ALIAS */
	const uint32_t *alias_of;  /* [n_layers] the model layer whose KV layers[i] reads: a layer
	                              of a FULL, WINDOW or LATENT group (not an ALIAS layer, not
	                              itself) */
	/* FULL, WINDOW, LATENT */
	enum kvt_dtype dtype;      /* element type of stored K/V */
	uint32_t tokens_per_block; /* 0 = layout.tokens_per_block; any other value must equal it
	                              (per-group block sizes: KVT_ENOTSUP today) */
	float share;               /* fraction of each tier's bytes (hbm, host, nvme) this group's
	                              pool gets, 0..1. 0 in every storage group (default): split
	                              in proportion to each group's bytes for group_ref_tokens
	                              tokens: FULL and LATENT ceil(R / tpb) blocks, WINDOW at most
	                              ceil(sink / tpb) + ceil(window / tpb) + 1 blocks (what its
	                              window bounds), STATE 2; and a WINDOW or STATE pool gets at
	                              least that bound (plus half a block) of HBM, taken from the
	                              other pools in proportion, when their floors leave room.
	                              That bound is a decoding sequence's: a prefill chunk of n
	                              tokens reads back from its first token, so it holds up to
	                              ceil(sink / tpb) + ceil((window + n) / tpb) + 1 blocks at
	                              its prepare, and with the default split a small HBM may
	                              answer KVT_ETOOBIG for it: set shares sized for the
	                              chunks, or prepare windows (kvt_seq_range) of it.
	                              Otherwise every storage group sets one and they sum to at
	                              most 1. ALIAS: ignored */
	/* STATE (issue 17; "STATE groups" above) */
	uint32_t n_state;          /* tensors per layer, 1..KVT_GROUP_MAX_STATE; each tensor's
	                              dims 1..2^20, at most 2^30 elements */
	struct kvt_state_tensor state[KVT_GROUP_MAX_STATE];
	uint32_t checkpoint_every; /* which block boundaries keep their checkpoint (prefix hits
	                              end only there): 0 or 1 every one, N every N-th (boundaries
	                              at multiples of N x tokens_per_block), KVT_CHECKPOINT_ASKED
	                              none but those kvt_seq_checkpoint() asks for; asked ones are
	                              kept with any policy */
	/* SIDECAR (issue 17; "SIDECAR groups" above) */
	uint32_t parent;           /* index of the group whose blocks carry it */
	uint64_t sidecar_token_bytes; /* bytes per token and layer (0 = none), <= 65536 */
	uint64_t sidecar_block_bytes; /* bytes per block and layer (0 = none), <= 16 MiB */
	uint32_t sidecar_summary;  /* enum kvt_sidecar_summary: KVT_SUMMARY_K_MINMAX = kvtier
	                              keeps the Quest page summary of the parent's K itself (the
	                              two sizes above then 0) */
};

/** kvt_group_init() - zero @g and set g->size = @size (then tokens_per_block 0, share 0). */
KVT_API void kvt_group_init(struct kvt_group *g, size_t size);

/**
 * kvt_group_state_tensor() - where tensor @tensor (0..n_state-1) of STATE group @group lies
 * in one layer's state: *offset bytes from the start of the layer's state (layer i of the
 * group's block at geo.hbm_base + slot * geo.block_bytes + i * geo.layer_block_bytes) and
 * *bytes its size (element size x the product of its shape). Either may be NULL. Any thread
 * (reads what create fixed). Returns 0, or -EINVAL (NULL engine, no such group, not a STATE
 * group, tensor out of range).
 */
KVT_API int kvt_group_state_tensor(const struct kvt_engine *e, uint32_t group, uint32_t tensor,
				   uint64_t *offset, uint64_t *bytes);

/**
 * kvt_seq_checkpoint() - keep, in every STATE group of @e, the checkpoint of sequence @s at the
 * block boundary at or below @n_tokens (the state after floor(@n_tokens / tokens_per_block) x
 * tokens_per_block tokens), whatever the group's checkpoint_every: now if the sequence has
 * passed it and still holds that block, or when it gets there (at most 4 boundaries asked and
 * not yet reached per sequence). For a server that knows a shared part's length before the
 * prefill (a system prompt), so that a later prompt sharing it hits there. Returns 0 (also
 * when no STATE group keeps fewer than every checkpoint: nothing to do), KVT_ECLOSED, -EINVAL
 * (NULL engine, @n_tokens below one block), -ENOENT (the sequence passed that boundary and the
 * block, not kept, has left: ask before), -ENOSPC (4 asks pending). Any thread; not with a
 * call changing the same sequence (KVT_EBUSY).
 */
KVT_API int kvt_seq_checkpoint(struct kvt_engine *e, kvt_seq_id s, uint64_t n_tokens);

/**
 * kvt_group_sidecar() - where SIDECAR group @group's bytes lie in its parent's blocks (see
 * "SIDECAR groups"): *offset bytes into each layer's part of the parent's block (layer i of
 * block slot s at geo.hbm_base + s * geo.block_bytes + i * geo.layer_block_bytes + *offset,
 * geo the parent's or this group's geometry: the same pool), then tokens_per_block x
 * *token_bytes (token t's at + t * *token_bytes), then *block_bytes (a summary sidecar: no
 * bytes in the block, *block_bytes the summary's size in the mirror). Any pointer may be NULL.
 * Any thread (reads what create fixed). Returns 0, or -EINVAL (NULL engine, no such group, not
 * a SIDECAR group).
 */
KVT_API int kvt_group_sidecar(const struct kvt_engine *e, uint32_t group, uint64_t *offset,
			      uint64_t *token_bytes, uint64_t *block_bytes);

/**
 * kvt_seq_sidecar_read() - copy the sidecar of layer @layer_in_group of blocks [@first_block,
 * @first_block + @n_blocks) of sequence @s (block positions, as a table's block_pos) into
 * @dst: [n_blocks][tokens_per_block x token_bytes + block_bytes] (kvt_group_sidecar's sizes),
 * host memory, WITHOUT bringing the blocks up: from the engine's host mirror of each block's
 * sidecar, filled when a host copy of the block appears (its demotion to HOST, its read from
 * NVMe) or read here from its HOST or HBM copy. A block being written (appended to since the
 * last release or park) is read from HBM as it is now: write its sidecar before reading it.
 * Any thread; takes the parent pool's lock for the copy (an HBM read is a synchronous device
 * copy). Returns 0, or: -EINVAL (NULL engine or dst, not a SIDECAR group, layer or blocks out
 * of range), KVT_ECLOSED, -ENOENT (a block that left a WINDOW parent's window), -EAGAIN (a
 * block only on NVMe whose mirror this engine never filled: after kvt_seq_restore, or a prefix
 * hit on such a block; a prepare holding it fills it), KVT_EDEVICE (the HBM read failed).
 * dst may be partly written on error.
 */
KVT_API int kvt_seq_sidecar_read(struct kvt_engine *e, kvt_seq_id s, uint32_t group,
				 uint32_t layer_in_group, uint32_t first_block, uint32_t n_blocks,
				 void *dst);

/**
 * kvt_engine_n_groups() - groups of @e: opts.n_groups, or 1 for an engine without groups (its
 * single FULL group). Returns >= 1, or -EINVAL (NULL).
 */
KVT_API int kvt_engine_n_groups(const struct kvt_engine *e);

/**
 * Byte geometry of one group's HBM pool. For a slot-mapping entry m of the group (row g of
 * kvt_seq_append_groups) the K of that token in layer i of the group is at
 *   hbm_base + (m / tokens_per_block) * block_bytes + i * layer_block_bytes
 *            + (m % tokens_per_block) * k_token_bytes
 * and its V (v_token_bytes != 0) at hbm_base + (m / tpb) * block_bytes + i * layer_block_bytes
 * + v_offset + (m % tpb) * v_token_bytes. kvt_group_kv_addr() computes this. An ALIAS group
 * has kind, n_layers and tokens_per_block set, everything else 0. A STATE group: block_bytes
 * and layer_block_bytes as above (the layer's state at hbm_base + (m / tpb) * block_bytes +
 * i * layer_block_bytes; kvt_group_state_tensor for each tensor in it), dtype its first
 * tensor's, the slots; k/v_token_bytes, v_offset, heads, dims, window and sink 0.
 */
struct kvt_group_geometry {
	enum kvt_group_kind kind;
	uint32_t n_layers;          /* layers of the group */
	void *hbm_base;             /* device address of the group's HBM slot 0 */
	uint64_t block_bytes;       /* bytes of one block, all the group's layers (its slot) */
	uint64_t layer_block_bytes; /* bytes of one layer of one block (K then V) */
	uint64_t k_token_bytes;     /* bytes of one token's K in one layer: n_kv_heads x head_dim
	                               (LATENT: latent_dim) elements */
	uint64_t v_token_bytes;     /* ... of its V: n_kv_heads x v_head_dim elements; 0: no V */
	uint64_t v_offset;          /* V's offset within a layer of a block (tpb x k_token_bytes);
	                               0 when there is no V */
	uint32_t tokens_per_block;
	uint32_t n_kv_heads;        /* FULL/WINDOW; 1 for LATENT */
	uint32_t head_dim;          /* FULL/WINDOW K head dim; LATENT: latent_dim */
	uint32_t v_head_dim;        /* FULL/WINDOW (resolved: never 0); LATENT: 0 */
	enum kvt_dtype dtype;
	uint32_t window;            /* WINDOW: as given; else 0 */
	uint32_t sink;              /* WINDOW: as given; else 0 */
	uint32_t hbm_slots;         /* slots of the group's pool per tier */
	uint32_t host_slots;
	uint32_t nvme_slots;
};

/**
 * kvt_group_geometry() - geometry of group @group of @e (0..kvt_engine_n_groups()-1; group 0 of
 * an engine without groups is its FULL layout). Returns 0, -EINVAL (NULL, group out of range).
 */
KVT_API int kvt_group_geometry(const struct kvt_engine *e, uint32_t group,
			       struct kvt_group_geometry *out);

/** kvt_group_kv_addr() - as kvt_kv_addr() for layer @layer_in_group of a storage group. */
static inline void
kvt_group_kv_addr(const struct kvt_group_geometry *g, uint32_t layer_in_group,
		  int64_t slot_mapping, void **k, void **v)
{
	char *p = (char *)g->hbm_base +
		  (uint64_t)(slot_mapping / g->tokens_per_block) * g->block_bytes +
		  (uint64_t)layer_in_group * g->layer_block_bytes;
	uint64_t off = (uint64_t)(slot_mapping % g->tokens_per_block);

	if (k)
		*k = p + off * g->k_token_bytes;
	if (v)
		*v = g->v_token_bytes ? p + g->v_offset + off * g->v_token_bytes : NULL;
}

/**
 * kvt_layer_group() - where model layer @layer is stored: its group and its index in the
 * group's layers[]. An ALIAS layer maps to its SOURCE layer's (group, layer-in-group), so a
 * kernel reading it reads the source's blocks. @group, @layer_in_group may be NULL. An engine
 * without groups: (0, layer). Returns 0, or -EINVAL (NULL engine, layer >= n_layers).
 */
KVT_API int kvt_layer_group(const struct kvt_engine *e, uint32_t layer, uint32_t *group,
			    uint32_t *layer_in_group);

/**
 * kvt_seq_append_groups() - kvt_seq_append() for every group at once: reserve @n tokens in
 * each storage group's sequence and write each group's slot mapping.
 * @slot_mapping: out, n_groups x @n entries, row-major: slot_mapping[g * n + i] is token i's
 *                entry in group g (for kvt_group_kv_addr with group g's geometry); rows of
 *                ALIAS groups are set to -1.
 * The caller writes every layer of every storage group before the release, as for
 * kvt_seq_append. Works on an engine without groups too (one row). When a group fails, the
 * tokens are taken back from the groups that appended them, and the call returns that group's
 * error (as kvt_seq_append's, the message prefixed "group g:"), the sequence as it was.
 * KVT_ELOST in one group truncates every group to the longest length all of them can serve
 * then (all groups hold the same tokens; kvt_seq_info says how many): a FULL or LATENT group
 * stops at any token, a WINDOW group only where its next query's window is still held (else
 * back to its sinks), a STATE group only at a block boundary whose state it still holds (else
 * 0). The same after kvt_batch_prepare's KVT_ELOST and after a restore whose groups'
 * stores held different versions (a park that failed in one group, a crash between the
 * groups' publishes). Threading, pins and sharing as kvt_seq_append.
 */
KVT_API int kvt_seq_append_groups(struct kvt_engine *e, kvt_seq_id s, const int32_t *tokens,
				  size_t n, int64_t *slot_mapping);

/**
 * The block table of one group of a prepared batch, for the attention kernels: CSR of HBM slot
 * ids as struct kvt_block_table, plus block_pos: each entry's block POSITION in its sequence
 * (token t of an entry e is the sequence's token block_pos[e] * tokens_per_block + t). Entries
 * are in increasing position; for FULL and LATENT groups they are consecutive
 * (first_block[i], first_block[i] + 1, ...); a WINDOW group's table may skip the blocks out of
 * window (its sinks first, then the window's), and part 2's sparse selections any blocks. The
 * last entry of sequence i holds last_block_len[i] tokens; seq_len[i] is the range's token count
 * (the whole sequence's for kvt_batch_prepare), holes included, so the query's position is
 * seq_len[i] - 1 (a WINDOW group's entries may hold fewer tokens). window and sink are the
 * group's (0 when not WINDOW): a kernel masks tokens older than the newest `window` that are not
 * among the first `sink`. A STATE group's entries are its live blocks in the range (see "STATE
 * groups": those of tokens seq_len - 2 and seq_len - 1 when the range reaches them, and after
 * a prefill chunk every block the chunk appended, until the next append). Arrays belong to the batch and live
 * until kvt_batch_release(). An ALIAS group's table is its source group's (the group of its
 * layers' sources; an ALIAS group whose layers read several groups: -EINVAL, ask per layer
 * with kvt_layer_group).
 */
struct kvt_group_table {
	uint32_t group;                /* the group whose blocks these are (an ALIAS group: its
	                                  source group) */
	uint32_t n_seqs;               /* sequences in the batch (entry i = seqs[i] / ranges[i]) */
	const uint32_t *indptr;        /* [n_seqs + 1], indptr[0] = 0 */
	const uint32_t *indices;       /* [indptr[n_seqs]] HBM slot ids of the group's pool */
	const uint32_t *block_pos;     /* [indptr[n_seqs]] position of each entry's block */
	const uint32_t *last_block_len; /* [n_seqs] tokens in the last entry, 1..tpb */
	const uint64_t *seq_len;       /* [n_seqs] the range's tokens, holes included (the
	                                  query is at seq_len - 1) */
	const uint32_t *first_block;   /* [n_seqs] position of the range's first block */
	uint32_t window;               /* WINDOW: tokens read back from the newest; else 0 */
	uint32_t sink;                 /* WINDOW: leading tokens always read; else 0 */
	struct kvt_group_geometry geo; /* the pool's base pointer and strides */
};

/**
 * kvt_batch_group_table() - the table of group @group (0..n_groups-1) of batch @b. Works for a
 * batch of an engine without groups too (group 0). Returns 0, -EINVAL (NULL, group out of
 * range, an ALIAS group of several sources).
 */
KVT_API int kvt_batch_group_table(const struct kvt_batch *b, uint32_t group,
				  struct kvt_group_table *out);

/**
 * kvt_batch_wait_group_layer() - kvt_batch_wait_layer() for layer @layer_in_group of storage
 * group @group (an ALIAS group: -EINVAL; wait for the source layer). Returns as
 * kvt_batch_wait_layer, plus -EINVAL for a group out of range.
 */
KVT_API int kvt_batch_wait_group_layer(struct kvt_batch *b, uint32_t group,
				       uint32_t layer_in_group, void *stream);

/**
 * kvt_engine_group_stats() - kvt_engine_stats() of group @group's pool alone (kvt_engine_stats
 * gives the totals: counters summed, capacities summed, seqs_open and batches_open the public
 * ones). An ALIAS group: all zero but size. Returns 0, -EINVAL (NULL, bad size, group out of
 * range).
 */
KVT_API int kvt_engine_group_stats(struct kvt_engine *e, uint32_t group, struct kvt_stats *out);
/* ------------------------------------------------------------------------------------------ */
/* External-pool mode (issue 19, 0.6; docs/ARCHITECTURE.md "External-pool mode")               */
/*
 * A server that owns its device KV pool (vLLM: per-layer tensors [2, num_blocks, block_size,
 * n_kv_heads, head_size] or one cross-layer tensor; SGLang: pages) registers that memory, and
 * kvtier manages the tiers BELOW it (HOST, NVMe) by the caller's block ids: store these caller
 * blocks under these prefix hashes, how many leading hashes are stored, load them into these
 * caller blocks, and a non-blocking poll of which jobs finished and which blocks failed.
 * Stored blocks are kvtier blocks keyed by (tenant, hash): HOST and NVMe slots, the engine's
 * eviction policy, checksums on every NVMe read, the codec, tenant budgets (blocks stored after
 * the tenant's budget was set), the engine's stats and metrics. With nvme_persist every stored
 * block is also written through to NVMe and published in the persistent store (one record per
 * block under a key derived from hash and tenant, marked as the pool's): after a
 * restart, kvt_ext_register() finds them again (checked against their NVMe headers) and they
 * are hits, loadable from NVMe. The engine's own HBM tier is not used by this mode (create the
 * engine with hbm_bytes of one block).
 *
 * REMOTE (an engine created with remote_host; not on a grouped engine, which refuses
 * remote_host): the pool's blocks are shared with every engine on the same server(s) with the
 * same remote_model_id, layout and segment sizes (other servers of the fleet):
 *   - write-through: a stored block is put to REMOTE per kvt_engine_opts.remote_write (ALL:
 *     when its store lands; SEEN_TWICE, the default: when it is seen again, a store of a hash
 *     already stored or a load of it; NONE: never), once (first writer wins), asynchronously
 *     by the engine's remote worker, within remote_write_budget; the value is the stored
 *     block's bytes (the gathered segments, zero-padded to block_bytes) with kvtier's REMOTE
 *     value header (docs/FORMAT.md "REMOTE values": namespace, tenant, key, XXH3-64).
 *   - fetch: kvt_ext_lookup() of hashes whose leading run misses locally also asks REMOTE
 *     for the hashes after that run (unless remote_no_fetch) with one pipelined get, queued to
 *     the worker: the call never waits for the network. It asks for up to 256, as many as
 *     HOST has room for without losing anything: free slots, and slots of clean HOST copies
 *     (valid on NVMe), never one of the lookup's own hits; fetches in flight hold at most
 *     half of HOST's slots. Each value is verified (kvt_rv_parse: a bad one is a miss, deleted, never
 *     served); the verified leading run lands in HOST as stored blocks, found by a LATER
 *     kvt_ext_lookup (a scheduler's next step; kvt_ext_inflight says whether to ask again) and
 *     loaded as any. A hash that missed there is not asked again for 1 s. The keys are
 *     (model_id, layout: the namespace; tenant; XXH3-128 of the caller's hash and the pool's
 *     segment sizes): the caller's hashes must identify the prefix across processes (vLLM's
 *     block hashes with a fixed PYTHONHASHSEED or sha256; SGLang's page keys do).
 * kvt_ext_stats.remote_*, kvt_stats.remote_* count it.
 *
 * Geometry: the caller's block i, layer l, has a K segment of k_bytes at
 *   base(l) + i * block_stride(l) + k_offset(l)
 * and (unless v_offset is KVT_EXT_NO_V) a V segment of v_bytes at base(l) + i * block_stride(l)
 * + v_offset(l). A block's segments, gathered in order (layer 0 K, layer 0 V, layer 1 K, ...),
 * are what is stored: together at most the engine's block_bytes (kvt_engine_geometry; equal for
 * a model whose KV the engine's layout describes). Every copy is one segment of one (block,
 * layer, K|V), batched per job on kvtier's device streams (host memory on the emulated device).
 * Examples (element size s, page = block_size * n_kv_heads * head_size * s bytes):
 *   vLLM per-layer [2, num_blocks, ...]: one entry per layer {base = data_ptr(), n_layers 1,
 *     block_stride = page, k_offset 0, v_offset = num_blocks * page, k_bytes = v_bytes = page}
 *   FlashInfer per-layer [num_blocks, 2, ...]: {block_stride 2 * page, k 0, v page}
 *   cross-layer [num_blocks, n_layers, 2, ...]: ONE entry {base, n_layers = L,
 *     layer_stride = 2 * page, block_stride = L * 2 * page, k 0, v page}
 *   MLA latent [num_blocks, block_size, latent]: {v_offset = KVT_EXT_NO_V, v_bytes 0}
 *
 * Hashes are the caller's (vLLM's block hashes, SGLang's page keys), 64 bits, already chained:
 * kvtier never recomputes them; tenant isolates (the same hash of another tenant is another
 * block). Jobs: a store or load returns a job id (never 0); kvt_ext_poll() reports each job once
 * when all its copies have ended, with the caller block ids that failed and why.
 * Threading: as the rest of the engine (any thread; the engine mutex serialises; no call holds
 * it while it waits for a copy or IO). Progress: completions are processed in kvt_ext_poll(),
 * kvt_ext_wait(), kvt_ext_wait_layer() and kvt_engine_poll() (which advances every pool's
 * jobs: NVMe reads on to their copies, write-through and publishing).
 *
 * Layer groups (a hybrid model; vLLM's KV cache groups, SGLang's hybrid pools): on a grouped
 * engine each storage group (FULL, WINDOW, LATENT, STATE) may have a pool of its own, with
 * that group's geometry (its segments together at most the group's block_bytes,
 * kvt_group_geometry), registered with layer_group = g; its id is g + 1. Everything of a pool
 * is its group's: its blocks live in that group's HOST and NVMe share (kvt_engine_opts.groups
 * share) under that group's eviction, keys are per group (the same (tenant, hash) stored in
 * two groups' pools is two independent blocks: a lookup, load or drop in one does not see the
 * other), each group's store persists its own, and a failure (an NVMe checksum) concerns the
 * group it happened in. A server with several groups stores and looks up each group's blocks
 * through its own pool and decides itself what a prefix hit across groups is (the shortest).
 * Size the groups' shares (kvt_group.share) for what their pools will hold: by default a
 * WINDOW or STATE group gets only what its window bounds (a few blocks), and a pool's stored
 * blocks are a cache there (the oldest leave the last tier to make room: a later load of one
 * reports -ENOENT for it).
 * kvt_engine_stats and metrics sum the groups; kvt_engine_group_stats gives one.
 */

#define KVT_EXT_NO_V UINT64_MAX /* v_offset of a layout without V (MLA latent) */
#define KVT_EXT_MAX_ENTRIES 4096 /* entries of struct kvt_ext_opts.layers */

/** One entry of a pool's geometry: @n_layers consecutive layers alike (1 = one layer). */
struct kvt_ext_layer {
	uint64_t base;         /* device address of block 0's first layer of this entry */
	uint64_t block_stride; /* bytes from block i to block i + 1; > 0 */
	uint64_t layer_stride; /* bytes from layer j to layer j + 1 of the entry (n_layers > 1) */
	uint64_t k_offset;     /* offset of the K segment from the block's address */
	uint64_t v_offset;     /* offset of the V segment, or KVT_EXT_NO_V */
	uint64_t k_bytes;      /* bytes of K per block and layer; > 0 */
	uint64_t v_bytes;      /* bytes of V per block and layer (0 with KVT_EXT_NO_V) */
	uint32_t n_layers;     /* layers this entry describes; >= 1 */
	uint32_t reserved;     /* 0 */
};

/** Options of kvt_ext_register(). */
struct kvt_ext_opts {
	size_t opts_size;      /* sizeof(struct kvt_ext_opts) as the caller compiled it */
	uint32_t n_blocks;     /* caller block ids are 0..n_blocks-1; 1..(1 << 30) */
	uint32_t n_entries;    /* entries in @layers; 1..KVT_EXT_MAX_ENTRIES */
	const struct kvt_ext_layer *layers; /* the geometry; copied */
	uint32_t layer_group;  /* layer group the pool holds: 0 on an engine without groups; on a
	                          grouped engine a FULL, WINDOW, LATENT or STATE group (not
	                          ALIAS or SIDECAR), one pool each ("Layer groups" below) */
	uint32_t max_jobs;     /* jobs in flight or unreported at once; default 4096 */
	uint32_t removed_cap;  /* removals kvt_ext_removed() holds undrained; default 65536;
	                          1..(1 << 24) (entries of 16 bytes) */
	uint32_t pad_;         /* 0 */
	uint64_t reserved[3];  /* 0 */
};

/** Job kinds (struct kvt_ext_done.kind). */
enum kvt_ext_kind { KVT_EXT_STORE = 1, KVT_EXT_LOAD = 2 };

/** kvt_ext_load() flags. */
#define KVT_EXT_LAYERWISE 1u /* copy layer by layer: kvt_ext_wait_layer(l) waits for l only */

/** A finished job, as kvt_ext_poll() reports it. */
struct kvt_ext_done {
	uint64_t job;          /* the id store/load returned */
	int32_t status;        /* 0: every block done; else the first failure's code */
	uint32_t kind;         /* enum kvt_ext_kind */
	uint32_t n_blocks;     /* blocks in the job */
	uint32_t n_failed;     /* of them failed: entries failed_first.. of the failures array */
	uint32_t n_skipped;    /* store: blocks already stored (nothing copied; not failures) */
	uint32_t failed_first; /* index of this job's first entry in the failures array */
};

/** One failed block of a finished job. */
struct kvt_ext_fail {
	uint32_t block_id;     /* the caller's block id */
	int32_t err;           /* -ENOENT (load: not stored, or evicted before the job pinned it),
	                          KVT_ECORRUPT (its NVMe copy failed its checksum: the stored
	                          block is dropped, never loaded), -EIO (read or write failed),
	                          -ENOSPC (store: no room below, every slot pinned), KVT_EDEVICE */
};

/** kvt_ext_opts_init() - defaults (@size as kvt_engine_opts_init). */
KVT_API void kvt_ext_opts_init(struct kvt_ext_opts *o, size_t size);

/**
 * kvt_ext_register() - register the caller's device KV pool with @e: one pool per engine, or
 * on a grouped engine (kvt_engine_opts.groups) one per storage group, @o->layer_group naming
 * it. The memory stays the caller's: it must stay valid until
 * kvt_ext_unregister() or kvt_engine_destroy(). With nvme_persist, every stored block is
 * written through to NVMe and published in the store once that write landed (from the pool's
 * calls, kvt_ext_poll among them); kvt_engine_destroy() finishes the writes still missing and
 * publishes them (it waits for them), keeping the records; a block whose write fails or finds
 * no NVMe room stays unpublished. The blocks published by an earlier engine on the same store
 * are found and become the pool's (a record whose block header does not match stays an ordinary record).
 * @o: options, copied.  @pool: receives the pool id (never 0) passed to every kvt_ext_* call.
 * Returns 0; -EINVAL (bad sizes, zero stride or bytes, n_blocks out of range, an entry's
 * segments overlapping each other or another entry's for some block ids, a block's segments
 * together larger than the engine's block_bytes; nothing registered, the message says which
 * entry and why; on a grouped engine also a layer_group out of range, an ALIAS group (register
 * the group it reads) or a SIDECAR group (register its parent: the sidecar is part of the
 * parent's blocks); on an engine without groups a layer_group other than 0), -EEXIST (a pool is
 * already registered for the engine or that group), -ENODEV (the engine, or the group's pool,
 * has no HOST tier), -ENOMEM.
 */
KVT_API int kvt_ext_register(struct kvt_engine *e, const struct kvt_ext_opts *o, uint32_t *pool);

/**
 * kvt_ext_unregister() - wait for the pool's jobs in flight (their copies read or write the
 * caller's memory; threads inside kvt_ext_wait on them first return), then forget the pool
 * and free its stored blocks (this version keeps no index without a pool; with nvme_persist
 * their records are deleted too: to keep them for the next process, destroy the engine instead).
 * Unreported jobs are dropped. Returns 0, -ENOENT (no such pool).
 */
KVT_API int kvt_ext_unregister(struct kvt_engine *e, uint32_t pool);

/**
 * kvt_ext_store() - store caller blocks @block_ids[i] under (@tenant, @hashes[i]), i < @n,
 * asynchronously: HOST slots are taken (the eviction policy makes room, demoting to NVMe) and
 * the gather copies queued; the caller must not overwrite those blocks until the job is
 * reported by kvt_ext_poll() (or kvt_ext_wait() returned). Hashes already stored (or being
 * stored) are skipped (n_skipped); a hash whose REMOTE fetch is in flight is stored from the
 * caller's bytes (the fetch is forgotten: it might miss). A block that finds no room fails alone (-ENOSPC in the
 * job's failures); the others are stored. A block is found by kvt_ext_lookup() once its copy
 * has landed.
 * @stream: the device stream on which the server wrote those blocks (cudaStream_t); the
 *          copies wait for the work queued on it so far. NULL: the blocks are written already.
 * @job: receives the job id.
 * Returns 0; -EINVAL (NULL arrays with n > 0, n > 65536, a block id >= n_blocks, a block id or
 * hash twice in the call; nothing queued), -ENOENT (no such pool), -EAGAIN (max_jobs jobs
 * unreported: poll them), -ENOMEM, KVT_EDEVICE.
 */
KVT_API int kvt_ext_store(struct kvt_engine *e, uint32_t pool, uint32_t tenant,
			  const uint64_t *hashes, const uint32_t *block_ids, size_t n, void *stream,
			  uint64_t *job);

/**
 * kvt_ext_lookup() - how many LEADING hashes of @hashes[0..n) are stored for @tenant
 * (complete and loadable: HOST or NVMe; a store still in flight does not count, nor one whose
 * landing no kvt_ext_poll/wait/store/load call has processed yet: lookup advances no job, to
 * stay cheap). Non-blocking and cheap (one hash-table probe per hash, under the engine mutex;
 * without REMOTE nothing is pinned or moved): a scheduler calls it for every waiting request
 * every step. With a REMOTE tier it also processes the REMOTE fetches that landed, and a run
 * that ends before @n asks REMOTE for the hashes after it, up to the first one stored or in
 * flight here ("External-pool mode" above): block records and HOST slots are taken for them
 * (free slots, or those of clean HOST copies, valid on NVMe, which then load from NVMe; never
 * one of this call's hits) and one get is queued, never waited for. The blocks that land count
 * in a later lookup (kvt_ext_inflight tells); no stored block is lost for it. A HOST-only
 * engine whose HOST is full has no clean copies: it fetches nothing until slots free up.
 * @hits: receives the count (0..n). @tier: receives the slowest tier those come from
 * (KVT_TIER_HOST or KVT_TIER_NVME; KVT_TIER_COUNT when 0); may be NULL.
 * Returns 0, -EINVAL (NULL), -ENOENT (no such pool).
 */
KVT_API int kvt_ext_lookup(struct kvt_engine *e, uint32_t pool, uint32_t tenant,
			   const uint64_t *hashes, size_t n, size_t *hits, enum kvt_tier *tier);

/**
 * kvt_ext_inflight() - what kvt_ext_lookup() would count (@hits: the leading run of @hashes
 * stored for @tenant) and, after it, how many hashes are on their way (@pending: the run of
 * hashes whose store job or REMOTE fetch is in flight, or landed but not yet processed). A
 * scheduler that got fewer hits than it asked for retries the lookup later (vLLM's "pending")
 * while @pending > 0, instead of recomputing blocks that are about to land. Processes the
 * REMOTE fetches that landed (so @hits counts them); starts nothing, advances no job.
 * Non-blocking, under the engine mutex, one probe per hash.
 * Returns 0, -EINVAL (NULL engine, hits or pending; NULL hashes with n > 0), -ENOENT (no such
 * pool).
 */
KVT_API int kvt_ext_inflight(struct kvt_engine *e, uint32_t pool, uint32_t tenant,
			     const uint64_t *hashes, size_t n, size_t *hits, size_t *pending);

/**
 * kvt_ext_load() - load the blocks stored under (@tenant, @hashes[i]) into caller blocks
 * @block_ids[i], i < @n, asynchronously: each stored block is pinned below (no eviction of
 * its only copy) until its copy into the caller's block has landed; blocks only on NVMe are read into HOST first (checksum verified, codec
 * decoded), then every block is scattered into the caller's segments. A block not stored (or
 * whose read fails or fails its checksum) fails alone: its id is reported by kvt_ext_poll()
 * and its caller block is left as it was or partly written (recompute it; never loaded with
 * wrong bytes reported as good).
 * @flags: 0 or KVT_EXT_LAYERWISE (copies issued in layer order, one batched copy per layer:
 *         kvt_ext_wait_layer(l) returns when layer l of every block has landed).
 * Returns 0; -EINVAL (as kvt_ext_store, unknown flags), -ENOENT (no such pool), -EAGAIN,
 * -ENOMEM, KVT_EDEVICE.
 */
KVT_API int kvt_ext_load(struct kvt_engine *e, uint32_t pool, uint32_t tenant,
			 const uint64_t *hashes, const uint32_t *block_ids, size_t n,
			 uint32_t flags, uint64_t *job);

/**
 * kvt_ext_poll() - report finished jobs, non-blocking. Each job is reported once.
 * @done: receives up to @cap finished jobs.  @fails: receives their failed blocks
 * (done[k].failed_first .. + n_failed), up to @fails_cap entries; may be NULL when
 * @fails_cap is 0. A job whose failures do not fit is left for the next call.
 * Returns the number of jobs written (>= 0); -EINVAL (NULL @done with cap > 0), -ENOENT (no
 * such pool), -ENOSPC (the next job alone has more failures than @fails_cap: nothing
 * reported; with @cap > 0, done[0] holds that job with its n_failed, to size @fails).
 */
KVT_API int kvt_ext_poll(struct kvt_engine *e, uint32_t pool, struct kvt_ext_done *done,
			 size_t cap, struct kvt_ext_fail *fails, size_t fails_cap);

/**
 * kvt_ext_wait() - block until job @job has ended, at most @timeout_ms (0 = do not wait:
 * only check). The job is still reported by kvt_ext_poll() afterwards.
 * Returns 0 (ended: its status comes with the poll), -ETIMEDOUT, -ENOENT (no such pool, or
 * no such job: never issued, or already reported).
 */
KVT_API int kvt_ext_wait(struct kvt_engine *e, uint32_t pool, uint64_t job, uint32_t timeout_ms);

/**
 * kvt_ext_wait_layer() - make layer @layer of every block of load job @job usable.
 * @stream: NULL: the host blocks until those copies landed; a device stream: the stream waits
 * for them and the host returns at once. Without KVT_EXT_LAYERWISE this waits for the whole
 * job. Returns 0, -EINVAL (layer out of range, a store job), -ENOENT, KVT_EDEVICE.
 */
KVT_API int kvt_ext_wait_layer(struct kvt_engine *e, uint32_t pool, uint64_t job,
			       uint32_t layer, void *stream);

/**
 * kvt_ext_touch() - the stored blocks of (@tenant, @hashes[0..n)) were used now (vLLM's
 * manager touch()): the eviction policy sees an access. Absent hashes are ignored.
 * kvt_ext_drop() - forget them (their slots are freed once no job uses them); a hash whose
 * REMOTE fetch is in flight is forgotten too (it will not land; not counted as found).
 * Returns the number of hashes found (>= 0), -EINVAL, -ENOENT (no such pool).
 */
KVT_API int kvt_ext_touch(struct kvt_engine *e, uint32_t pool, uint32_t tenant,
			  const uint64_t *hashes, size_t n);
KVT_API int kvt_ext_drop(struct kvt_engine *e, uint32_t pool, uint32_t tenant,
			 const uint64_t *hashes, size_t n);

/**
 * kvt_ext_hold() - protect the LEADING run of stored blocks of (@tenant, @hashes[0..n)) (as
 * kvt_ext_lookup counts it: the first hash not stored ends it, nothing after it is held)
 * from eviction until kvt_ext_release(): vLLM's prepare_load ... complete_load, a scheduler
 * that promised a load keeps what it promised while other jobs (stores submitted before the
 * load) make room. A held block keeps its copies where they are (its HOST copy, when it has
 * one, is not evicted, even if NVMe holds it too: hold for the span of a load, not longer,
 * or HOST fills with held blocks). Holds count per block (held twice, it
 * takes two releases); a held block that is dropped (kvt_ext_drop, kvt_ext_clear) stops
 * being found at once (a store of its hash then stores anew) and is freed at its last
 * release. A store that finds HOST full of held
 * blocks fails alone (-ENOSPC in its failures).
 * kvt_ext_release() - end one hold of each of them: release exactly what a hold returned
 * (hashes whose block is not held are ignored). A hash whose held block was dropped and then
 * stored again names two blocks: a release ends the dropped one's hold first.
 * Both: non-blocking, under the engine mutex, one probe per hash.
 * Returns the number of hashes held (@hashes[0..ret) are held) / released (>= 0), -EINVAL
 * (NULL engine, or NULL hashes with n > 0), -ENOENT (no such pool).
 */
KVT_API int kvt_ext_hold(struct kvt_engine *e, uint32_t pool, uint32_t tenant,
			 const uint64_t *hashes, size_t n);
KVT_API int kvt_ext_release(struct kvt_engine *e, uint32_t pool, uint32_t tenant,
			    const uint64_t *hashes, size_t n);

#define KVT_EXT_ALL_TENANTS UINT32_MAX /* kvt_ext_clear: every tenant */

/**
 * kvt_ext_clear() - drop every stored block of @tenant (KVT_EXT_ALL_TENANTS: of all tenants)
 * in the pool, as kvt_ext_drop of each (vLLM's reset_cache, SGLang's clear): blocks pinned by
 * a job or held go at their last unpin / release and are not found meanwhile, REMOTE fetches
 * in flight do not land, stores in flight are dropped when they land; their records leave the
 * persistent store; each landed block is reported by kvt_ext_removed. Values already written
 * to REMOTE stay there (other servers share them). Non-blocking, under the engine mutex, O(the
 * pool's block records). Returns the number of stored blocks dropped (>= 0), -EINVAL (NULL),
 * -ENOENT (no such pool).
 */
KVT_API int kvt_ext_clear(struct kvt_engine *e, uint32_t pool, uint32_t tenant);

/** A hash that stopped being stored, as kvt_ext_removed() reports it. */
struct kvt_ext_removal {
	uint64_t hash;   /* the hash the block was stored under */
	uint32_t tenant; /* and its tenant */
	uint32_t pad_;   /* zero */
};

/**
 * kvt_ext_removed() - drain the (tenant, hash) of stored blocks that stopped being stored
 * since the last call, oldest first: evicted from their last tier (eviction policy, watermarks,
 * a full NVMe tier), dropped (kvt_ext_drop), or lost (a failed or corrupt read; the block's
 * load failed). Only blocks that had landed (that kvt_ext_lookup could find) are reported, each
 * removal once. It lets a scheduler keep an exact mirror of what is stored and answer its
 * per-block lookups without a call per block (vLLM asks its offloading manager one key at a
 * time, for every waiting request every step). The feed has one reader: each removal is
 * handed to one call (several consumers of one pool fan it out themselves). A block can land,
 * be evicted and be reported removed before its store job is reported done, so a mirror adds
 * only what kvt_ext_lookup confirms after the done report (after a drain), and removes what
 * later drains report; a hash stored again after its removal may then be missing from the
 * mirror until kvt_ext_lookup finds it again (a miss is checked, never trusted). Non-blocking;
 * advances no job (a removal caused by a completion is reported after the call that processes
 * it: kvt_ext_poll, kvt_ext_wait, a store or load). The engine holds the last removed_cap
 * (kvt_ext_opts; default 65,536) removals; older ones are overwritten and counted in @lost
 * (then any hash may be gone: drop the mirror, or check it with kvt_ext_lookup).
 * @out: receives up to @max entries (may be NULL when @max is 0: only @lost is read).
 * @lost: receives the removals overwritten since the last call (not NULL).
 * Thread-safe (the engine mutex). Returns the number of entries written (0..@max, at most
 * INT_MAX; call again while it returns @max), -EINVAL (NULL engine or @lost, NULL @out with
 * @max > 0), -ENOENT (no such pool).
 */
KVT_API int kvt_ext_removed(struct kvt_engine *e, uint32_t pool, struct kvt_ext_removal *out,
			    size_t max, uint64_t *lost);

/** Counters of a pool (kvt_ext_stats). */
struct kvt_ext_stats {
	size_t size;             /* sizeof(struct kvt_ext_stats) as compiled; set by the caller */
	uint64_t stored_blocks;  /* blocks stored now (HOST or NVMe) */
	uint64_t store_jobs;     /* store jobs reported */
	uint64_t load_jobs;      /* load jobs reported */
	uint64_t blocks_stored;  /* blocks copied in by stores */
	uint64_t blocks_skipped; /* store: already stored */
	uint64_t blocks_loaded;  /* blocks copied out by loads */
	uint64_t blocks_failed;  /* failed blocks of all jobs */
	uint64_t lookups;        /* kvt_ext_lookup calls */
	uint64_t lookup_hashes;  /* hashes they were given */
	uint64_t lookup_hits;    /* leading hashes they found */
	uint64_t bytes_stored;   /* bytes copied from the caller's pool */
	uint64_t bytes_loaded;   /* bytes copied into it */
	uint64_t persisted_blocks; /* nvme_persist: stored blocks published in the store now */
	/* ---- 0.7: the REMOTE tier below the pool (all 0 without one) */
	uint64_t remote_fetch_blocks; /* blocks asked of REMOTE by lookups (after a local miss) */
	uint64_t remote_hit_blocks;   /* ... verified and landed: stored blocks now */
};

/** kvt_ext_stats() - the pool's counters. Returns 0, -EINVAL (NULL, bad size), -ENOENT. */
KVT_API int kvt_ext_stats(struct kvt_engine *e, uint32_t pool, struct kvt_ext_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* KVTIER_H */
