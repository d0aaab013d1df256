# SPDX-License-Identifier: MIT
"""kvtier from Python: a thin ctypes binding of libkvtier.so (see engine/kvtier.h for every
contract; this module adds only Python ownership and exceptions).

    import kvtier
    with kvtier.Engine(n_layers=32, n_kv_heads=8, head_dim=128, dtype="bf16",
                       tokens_per_block=16, hbm_bytes=8 << 30, host_bytes=64 << 30) as eng:
        seq = eng.open_sequence()
        slots = seq.append([1, 2, 3])          # where to write each token's K/V in HBM
        with eng.prepare([seq]) as batch:      # every block in HBM and pinned
            table = batch.block_table()        # CSR block table + geometry
            for layer in range(32):
                batch.wait_layer(layer)
                ...                            # attention; write the new K/V at slots
        seq.park(kvtier.TIER_NVME)             # idle session: KV goes down, id stays
        seq.close()

Prefix sharing: eng.match_prefix(prompt) says how many prompt tokens are cached and in which
tier, seq.attach_prefix(prompt) shares those blocks so that only the rest is prefilled.
Schedule hints (eng.hint), priorities (seq.set_priority), tenant budgets
(eng.set_tenant_budget, eng.tenant_usage) and persistent sessions (Engine(nvme_persist=True),
open_sequence(session_key=...), eng.session_list(), eng.restore(), eng.drop_session()) follow
kvtier.h one function each.

The library is found through KVTIER_LIBRARY, then a libkvtier.so beside this package, then the
repository's build/ (tools/python/kvtier/../../../build), then the system loader. Failures raise
KvtierError subclasses carrying kvtier's code (negative), its
name (kvt_strerror) and the detailed message (kvt_last_error_message). Engine, Sequence and
Batch are context managers and have close()/release(): resources go back when the caller says,
not when the garbage collector runs. An Engine's objects become unusable once it is closed
(a call then raises ClosedError instead of touching freed memory). Calls release the GIL
(ctypes does), and the engine is thread-safe as kvtier.h says; a Batch is used by one thread.
numpy is optional: it is needed only by Engine.hbm_array() and Batch.kv().
"""

import ctypes
import errno
import operator
import threading
import weakref

from . import _ffi
from ._ffi import lib

__all__ = ["Engine", "Sequence", "Batch", "BlockTable", "Stream", "ExternalPool", "ExtJob",
           "ext_layer", "KvtierError", "version",
           "stats_metrics_text", "TIER_HBM", "TIER_HOST", "TIER_NVME"]

TIER_HBM, TIER_HOST, TIER_NVME = 0, 1, 2
TIER_NAMES = ("hbm", "host", "nvme")
# enum kvt_codec: codec of blocks written to NVMe (Engine(nvme_codec=...))
CODEC_NONE, CODEC_LZ4, CODEC_SHUF_LZ4, CODEC_BYTE_LZ4, CODEC_CSHUF_LZ4 = 0, 1, 2, 3, 4
CODECS = {"none": 0, "lz4": 1, "shuf_lz4": 2, "byte_lz4": 3, "cshuf_lz4": 4}
# enum kvt_evict_policy (Engine(evict_policy=...)); default = ARC
EVICT_DEFAULT, EVICT_LRU, EVICT_PRIO, EVICT_ARC = 0, 1, 2, 3
EVICT_POLICIES = {"default": 0, "lru": 1, "prio": 2, "arc": 3}
# enum kvt_remote_write (Engine(remote_write=...)): which blocks are written through to REMOTE
REMOTE_WRITES = {"seen_twice": 0, "all": 1, "none": 2}
EXT_ALL_TENANTS = 0xFFFFFFFF  # ExternalPool.clear(): every tenant (KVT_EXT_ALL_TENANTS)
MOVE_NAMES = ("hbm_to_host", "host_to_nvme", "nvme_to_host", "host_to_hbm")
DTYPES = {"f32": 0, "fp32": 0, "float32": 0, "f16": 1, "fp16": 1, "float16": 1, "bf16": 2,
          "bfloat16": 2, "fp8": 3, "fp8_e4m3": 3, "int8": 4}
DEVICES = {"emulated": 0, "cuda": 1}

# enum kvt_group_kind (Engine(groups=[{"kind": "full", ...}, ...]))
GROUP_FULL, GROUP_WINDOW, GROUP_LATENT, GROUP_ALIAS, GROUP_STATE, GROUP_SIDECAR = range(6)
GROUP_KINDS = {"full": 0, "window": 1, "latent": 2, "alias": 3, "state": 4, "sidecar": 5}

# KVT_E* codes of kvtier.h
EDEVICE, ESHORTIO, ECORRUPT, ECLOSED, ELOST, EFORMAT, ETOOBIG, EBUSY, ENOTSUP = \
    range(-20000, -20009, -1)


class KvtierError(Exception):
    """A kvtier call failed. code: the negative error code; name: kvt_strerror(code);
    message: the detailed message of kvt_last_error_message() (may be "")."""

    def __init__(self, code, message="", call=""):
        self.code = code
        self.name = lib.kvt_strerror(code).decode("utf-8", "replace")
        self.message = message
        self.call = call
        super().__init__(f"{call}: {message or self.name} ({self.name}, {code})"
                         if call else f"{message or self.name} ({code})")


class InvalidArgumentError(KvtierError, ValueError):
    """-EINVAL."""


class NoSpaceError(KvtierError):
    """-ENOSPC: not now (HBM pinned by other batches, no room below); retry later."""


class OutOfMemoryError(KvtierError, MemoryError):
    """-ENOMEM."""


class IOError_(KvtierError, OSError):
    """-EIO and other -errno codes of the NVMe tier (ENOENT, EACCES, ...)."""


class DeviceError(KvtierError):
    """KVT_EDEVICE / KVT_ESHORTIO."""


class CorruptError(KvtierError):
    """KVT_ECORRUPT / KVT_EFORMAT."""


class ClosedError(KvtierError):
    """KVT_ECLOSED: the sequence (or its engine) is closed."""


class LostError(KvtierError):
    """KVT_ELOST: blocks were lost; the sequence was truncated and must be recomputed."""


class TooBigError(KvtierError):
    """KVT_ETOOBIG: the request can never fit in the configured tiers."""


class BusyError(KvtierError):
    """KVT_EBUSY: the sequence is in an unreleased batch."""


class NotSupportedError(KvtierError, NotImplementedError):
    """KVT_ENOTSUP."""


class NotFoundError(IOError_, LookupError):
    """-ENOENT: no such session (kvt_seq_restore, kvt_session_drop), tenant without a budget
    (kvt_tenant_usage), or a missing nvme_dir."""


class AgainError(KvtierError):
    """-EAGAIN: not available now (Sequence.sidecar: a block only on NVMe not read since a
    restore; prepare it once)."""


_ERRORS = {-errno.EINVAL: InvalidArgumentError, -errno.EAGAIN: AgainError, -errno.ENOSPC: NoSpaceError,
           -errno.ENOMEM: OutOfMemoryError, -errno.ENOENT: NotFoundError,
           EDEVICE: DeviceError, ESHORTIO: DeviceError, ECORRUPT: CorruptError,
           EFORMAT: CorruptError, ECLOSED: ClosedError, ELOST: LostError,
           ETOOBIG: TooBigError, EBUSY: BusyError, ENOTSUP: NotSupportedError}


def error_for(code, call=""):
    """The exception for a negative kvtier code, with the calling thread's last message."""
    msg = lib.kvt_last_error_message().decode("utf-8", "replace")
    cls = _ERRORS.get(code, IOError_ if -4096 < code < 0 else KvtierError)
    return cls(code, msg, call)


def _check(rc, call):
    if rc < 0:
        raise error_for(rc, call)
    return rc


def version():
    """The linked library's version, "MAJOR.MINOR.PATCH"."""
    return lib.kvt_version().decode()


def _closed(what):
    return ClosedError(ECLOSED, f"{what} is closed", what)


def _tier(t, what="tier"):
    """A tier given as TIER_* or its name ("hbm", "host", "nvme"); @what names the argument
    in the error of an unknown name."""
    if not isinstance(t, str):
        return int(t)
    if t not in TIER_NAMES:
        raise InvalidArgumentError(-errno.EINVAL, f"{what} {t!r}: one of {list(TIER_NAMES)}",
                                   what)
    return TIER_NAMES.index(t)


def _enum(table, v, what):
    """A name of @table (a "-" may stand for each "_": "shuf-lz4" as kvtier-bench spells it
    is "shuf_lz4") or the enum value."""
    if not isinstance(v, str):
        return int(v)
    if v.replace("-", "_") not in table:
        raise InvalidArgumentError(-errno.EINVAL, f"{what} {v!r}: one of {sorted(table)}", what)
    return table[v.replace("-", "_")]


# Engine keyword arguments given by name or as Python values, converted to the C field's value
_ENGINE_CONV = {"nvme_codec": lambda v: _enum(CODECS, v, "nvme_codec"),
                "evict_policy": lambda v: _enum(EVICT_POLICIES, v, "evict_policy"),
                "idle_target": lambda v: _tier(v, "idle_target"), "nvme_persist": int,
                "nvme_buffered_fallback": int,
                "prefix_cache": int,
                "remote_write": lambda v: _enum(REMOTE_WRITES, v, "remote_write"),
                **{k: (lambda v: v.encode() if isinstance(v, str) else v)
                   for k in ("remote_host", "remote_user", "remote_password",
                             "remote_model_id")}}
_SEQ_OPTS = ("tenant", "priority", "session_key", "retention_ms", "salt", "extra_key")


def _seq_opts(**kw):
    """struct kvt_seq_opts from keyword arguments (unknown ones: TypeError)."""
    o = _ffi.SeqOpts()
    lib.kvt_seq_opts_init(ctypes.byref(o), ctypes.sizeof(o))
    for k, v in kw.items():
        if k not in _SEQ_OPTS:
            raise TypeError(f"unknown sequence option {k!r} (one of {', '.join(_SEQ_OPTS)})")
        if k == "priority" and not 0 <= int(v) <= 255:  # c_uint8 would wrap silently
            raise InvalidArgumentError(-errno.EINVAL, f"priority {v} > 100", "kvt_seq_open")
        setattr(o, k, int(v))
    return o


def _token(i, t):
    """Token @t (the @i-th) as an int: an integer (int, numpy integer), else TypeError (a
    float such as 1.5 is not truncated); outside int32, ValueError."""
    try:
        v = operator.index(t)
    except TypeError:
        raise TypeError(f"token {i} is {t!r} ({type(t).__name__}), not an integer") from None
    if not -(1 << 31) <= v < (1 << 31):
        raise ValueError(f"token {i} is {v}, outside int32 [-2147483648, 2147483647]")
    return v


def _tokens(tokens):
    tokens = [_token(i, t) for i, t in enumerate(tokens)]
    return (ctypes.c_int32 * len(tokens))(*tokens), len(tokens)


def _ranges(ranges):
    ranges = list(ranges)
    return (_ffi.SeqRange * len(ranges))(*[_ffi.SeqRange(_seq_id(s), f, n)
                                           for s, f, n in ranges]), len(ranges)


def _metrics(fn):
    need = ctypes.c_size_t(0)
    cap = 16384
    while True:
        buf = ctypes.create_string_buffer(cap)
        rc = fn(buf, cap, ctypes.byref(need))
        if rc != -errno.ENOSPC:
            return rc, buf.value.decode()
        cap = need.value + 4096  # counters may grow between the calls


def stats_metrics_text(stats):
    """kvt_stats_metrics_text: the Prometheus text of a snapshot from Engine.stats() (a dict,
    e.g. kept after the engine is closed)."""
    s = _ffi.Stats()
    _dict_struct(s, stats)
    s.size = ctypes.sizeof(s)
    rc, text = _metrics(lambda buf, cap, need: lib.kvt_stats_metrics_text(ctypes.byref(s), buf,
                                                                          cap, need))
    _check(rc, "kvt_stats_metrics_text")
    return text


class Engine:
    """A kvtier engine (kvt_engine_create). Keyword arguments are the fields of
    struct kvt_engine_opts: n_layers, n_kv_heads, head_dim, dtype ("f32", "f16", "bf16", "fp8",
    "int8" or the enum value), tokens_per_block, hbm_bytes, host_bytes, nvme_dir, nvme_bytes,
    device ("emulated" or "cuda"), cuda_device, high_watermark, low_watermark,
    nvme_queue_depth, emu_max_delay_us, emu_seed, emu_copy_bytes_per_s;
    nvme_codec ("none", "lz4", "shuf_lz4", "byte_lz4", "cshuf_lz4" or CODEC_*; "shuf-lz4" and
    the other hyphen spellings of kvtier-bench are accepted too), nvme_codec_min_saving,
    nvme_persist (True: the persistent store <nvme_dir>/kvtier.store whose published sessions
    survive a restart), nvme_buffered_fallback; evict_policy ("arc", "lru", "prio", "default"
    or EVICT_*), idle_timeout_ms, idle_target (a tier), prefix_cache (True: sealed blocks stay
    cached after their last sequence closes), nvme_workers (threads that verify and decode
    NVMe blocks outside the engine's lock, 0..16, default 2); the REMOTE tier: remote_host,
    remote_port, remote_user, remote_password, remote_model_id (str), remote_write ("all",
    "seen_twice", "none" or the enum value), remote_no_fetch, remote_connect_timeout_ms,
    remote_op_timeout_ms, remote_ttl_ms, remote_write_budget; log: a callable (level, message)
    for warnings (default: kvtier prints them to stderr).
    groups: the model's layer groups (kvtier.h "Layer groups"), a list of dicts with the
    fields of struct kvt_group: kind ("full", "window", "latent", "alias", "state" or
    GROUP_*), layers (model layer indices), n_kv_heads, head_dim, v_head_dim, latent_dim,
    window, sink, alias_of (one source layer per layer), dtype, share, and for a STATE group
    state: a list of 1 to 4 tensors, each a dict {"shape": [...], "dtype": "f32"} (kvtier.h
    "STATE groups"; Engine.group_state_tensor gives where each lies in a block); then
    n_kv_heads and head_dim of the
    engine are not read (pass 0) and group_ref_tokens may be given. The slot mappings of
    Sequence.append_groups and the tables of Batch.group_table are per group."""

    def __init__(self, n_layers, n_kv_heads, head_dim, hbm_bytes, dtype="f16",
                 tokens_per_block=16, host_bytes=0, nvme_dir=None, nvme_bytes=0,
                 device="emulated", log=None, groups=None, **opts):
        o = _ffi.EngineOpts()
        lib.kvt_engine_opts_init(ctypes.byref(o), ctypes.sizeof(o))
        keep = _groups(o, groups)  # alive until create has copied them
        if isinstance(dtype, str) and dtype not in DTYPES:
            raise InvalidArgumentError(-errno.EINVAL, f"unknown dtype {dtype!r} (one of "
                                       + ", ".join(sorted(DTYPES)) + ")", "Engine")
        sizes = {"n_layers": n_layers, "n_kv_heads": n_kv_heads, "head_dim": head_dim,
                 "tokens_per_block": tokens_per_block, "hbm_bytes": hbm_bytes,
                 "host_bytes": host_bytes, "nvme_bytes": nvme_bytes}
        for k, v in sizes.items():
            try:
                ok = 0 <= operator.index(v) < (1 << (64 if k.endswith("_bytes") else 32))
            except TypeError:
                ok = False
            if not ok:
                raise InvalidArgumentError(-errno.EINVAL, f"{k} must be a non-negative "
                                           f"integer that fits its C field, got {v!r}",
                                           "Engine")
        o.layout = _ffi.Layout(n_layers, n_kv_heads, head_dim,
                               DTYPES[dtype] if isinstance(dtype, str) else int(dtype),
                               tokens_per_block)
        o.hbm_bytes, o.host_bytes, o.nvme_bytes = hbm_bytes, host_bytes, nvme_bytes
        o.nvme_dir = nvme_dir.encode() if isinstance(nvme_dir, str) else nvme_dir
        o.device = DEVICES[device] if isinstance(device, str) else int(device)
        for k, v in opts.items():
            if k not in dict(o._fields_) or k in ("opts_size", "layout", "log", "log_arg"):
                raise TypeError(f"Engine: unknown option {k!r}")
            setattr(o, k, _ENGINE_CONV.get(k, lambda x: x)(v))
        self._log = None
        if log is not None:  # kept alive as long as the engine
            self._log = _ffi.LOG_FN(lambda _arg, lvl, msg: log(lvl, msg.decode("utf-8",
                                                                                "replace")))
            o.log = self._log
        self._h = ctypes.c_void_p()
        self._live = weakref.WeakSet()  # batches and sequences to invalidate on close
        _check(lib.kvt_engine_create(ctypes.byref(o), ctypes.byref(self._h)),
               "kvt_engine_create")
        del keep
        self.n_groups = lib.kvt_engine_n_groups(self._h)
        self.layout = {"n_layers": n_layers, "n_kv_heads": n_kv_heads, "head_dim": head_dim,
                       "dtype": o.layout.dtype, "tokens_per_block": tokens_per_block}

    def _handle(self):
        if not self._h:
            raise _closed("engine")
        return self._h

    @property
    def closed(self):
        return not self._h

    def close(self):
        """Release every batch still held, then destroy the engine (waits for transfers in
        flight; removes the NVMe file). Idempotent."""
        if not self._h:
            return
        for obj in list(self._live):
            if isinstance(obj, Batch):
                obj._engine_closing()
        for obj in list(self._live):
            if isinstance(obj, Stream):
                obj.close()
        for obj in list(self._live):
            if isinstance(obj, Sequence):
                obj._id = 0
        for obj in list(self._live):
            if isinstance(obj, ExternalPool):
                obj.pool = 0  # kvt_engine_destroy waits for its jobs and frees it
        lib.kvt_engine_destroy(self._h)
        self._h = ctypes.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter teardown
            pass

    # -- sequences and batches -----------------------------------------------------------
    def open_sequence(self, tenant=0, priority=50, **opts):
        """kvt_seq_open: a new empty Sequence. Keyword arguments are the fields of
        struct kvt_seq_opts: tenant, priority (0..100), session_key (publish it under this key
        when parked to NVMe with nvme_persist), retention_ms, salt and extra_key (prefix
        sharing happens only within one tenant, between equal salts and extra keys)."""
        o = _seq_opts(tenant=tenant, priority=priority, **opts)
        sid = ctypes.c_uint64()
        _check(lib.kvt_seq_open(self._handle(), ctypes.byref(o), ctypes.byref(sid)),
               "kvt_seq_open")
        return Sequence(self, sid.value)

    def sequence(self, seq_id):
        """A Sequence object for an id opened earlier (e.g. a parked session's)."""
        return Sequence(self, int(seq_id))

    def prepare(self, seqs, ranges=None, group=None):
        """kvt_batch_prepare: every block of @seqs (Sequence objects or ids) in HBM, pinned,
        as a Batch. With ranges=[(seq, first_block, n_blocks), ...] instead:
        kvt_batch_prepare_ranges (windows of sequences); with group too:
        kvt_batch_prepare_group (those ranges in that group's pool only)."""
        h = ctypes.c_void_p()
        if group is not None:
            arr, n = _ranges(ranges)
            rc = lib.kvt_batch_prepare_group(self._handle(), group, arr, n, ctypes.byref(h))
            call = "kvt_batch_prepare_group"
        elif ranges is not None:
            arr, n = _ranges(ranges)
            rc = lib.kvt_batch_prepare_ranges(self._handle(), arr, n, ctypes.byref(h))
            call = "kvt_batch_prepare_ranges"
        else:
            seqs = list(seqs)
            arr = (ctypes.c_uint64 * len(seqs))(*[_seq_id(s) for s in seqs])
            rc = lib.kvt_batch_prepare(self._handle(), arr, len(seqs), ctypes.byref(h))
            call = "kvt_batch_prepare"
        _check(rc, call)
        return Batch(self, h)

    def hint(self, seqs=(), steps_ahead=1, ranges=None):
        """kvt_engine_hint: @seqs (Sequences or ids) will be in a batch @steps_ahead steps from
        now (0 or 1: the next one; 2 and more: later, only NVMe -> HOST reads start); their
        promotions start now and are spared by eviction until that batch is released. With
        ranges=[(seq, first_block, n_blocks), ...]: kvt_engine_hint_ranges (windows)."""
        if ranges is not None:
            arr, n = _ranges(ranges)
            _check(lib.kvt_engine_hint_ranges(self._handle(), arr, n, steps_ahead),
                   "kvt_engine_hint_ranges")
            return
        ids = [_seq_id(s) for s in seqs]
        arr = (ctypes.c_uint64 * len(ids))(*ids)
        _check(lib.kvt_engine_hint(self._handle(), arr, len(ids), steps_ahead),
               "kvt_engine_hint")

    # -- prefix sharing, tenants, persistent sessions ------------------------------------
    def match_prefix(self, tokens, **opts):
        """kvt_seq_match_prefix: (matched_tokens, tier) for a prompt: how many of its leading
        tokens are covered by cached blocks (a multiple of tokens_per_block) and the slowest
        tier one of them has to come from (TIER_*), None when nothing matched. Keyword
        arguments: the options the sequence would be opened with (tenant, salt, extra_key).
        Nothing is pinned or moved."""
        o = _seq_opts(**opts)
        tok, n = _tokens(tokens)
        matched, tier = ctypes.c_uint64(), _ffi.c_enum()
        _check(lib.kvt_seq_match_prefix(self._handle(), ctypes.byref(o), tok, n,
                                        ctypes.byref(matched), ctypes.byref(tier)),
               "kvt_seq_match_prefix")
        return matched.value, (tier.value if tier.value < _ffi.TIER_COUNT else None)

    def set_tenant_budget(self, tenant, tier, max_blocks):
        """kvt_tenant_set_budget: at most @max_blocks slots of @tier for @tenant's blocks
        (0 = unlimited; soft: enforced after releases and in poll)."""
        _check(lib.kvt_tenant_set_budget(self._handle(), tenant, _tier(tier), max_blocks),
               "kvt_tenant_set_budget")

    def tenant_usage(self, tenant):
        """kvt_tenant_usage: slots @tenant's blocks hold, a list per tier (NotFoundError for
        a tenant without a budget)."""
        used = (ctypes.c_uint64 * _ffi.TIER_COUNT)()
        _check(lib.kvt_tenant_usage(self._handle(), tenant, used), "kvt_tenant_usage")
        return list(used)

    def session_list(self, tenant=None):
        """kvt_session_list: keys of the sessions published in the persistent store and not
        open in this engine (restorable), of every tenant; with @tenant only that tenant's
        (kvt_session_list_tenant). [] without a store."""
        cap = 0
        while True:
            keys = (ctypes.c_uint64 * max(cap, 1))()
            if tenant is None:
                n = _check(lib.kvt_session_list(self._handle(), keys, cap), "kvt_session_list")
            else:
                n = _check(lib.kvt_session_list_tenant(self._handle(), tenant, keys, cap),
                           "kvt_session_list_tenant")
            if n <= cap:
                return list(keys[:n])
            cap = n + 16  # more may be published between the calls

    def restore(self, session_key, tenant=0, priority=50, **opts):
        """kvt_seq_restore: reopen a published session as a parked Sequence (its blocks on
        NVMe, verified by checksum when read). NotFoundError when it is absent or did not
        survive whole; BusyError when it is open here; -EPERM when it was stored for another
        tenant than @tenant."""
        o = _seq_opts(tenant=tenant, priority=priority, **opts)
        sid = ctypes.c_uint64()
        _check(lib.kvt_seq_restore(self._handle(), session_key, ctypes.byref(o),
                                   ctypes.byref(sid)), "kvt_seq_restore")
        return Sequence(self, sid.value)

    def drop_session(self, session_key, tenant=None):
        """kvt_session_drop: forget a published session of any tenant (NotFoundError,
        BusyError if open); with @tenant only one of that tenant (kvt_session_drop_tenant:
        -EPERM for another's)."""
        if tenant is None:
            _check(lib.kvt_session_drop(self._handle(), session_key), "kvt_session_drop")
        else:
            _check(lib.kvt_session_drop_tenant(self._handle(), tenant, session_key),
                   "kvt_session_drop_tenant")

    # -- progress and introspection ------------------------------------------------------
    def poll(self, max_completions=0):
        """kvt_engine_poll: completions processed."""
        return _check(lib.kvt_engine_poll(self._handle(), max_completions), "kvt_engine_poll")

    def drain(self):
        """kvt_engine_drain: wait until no transfer is in flight."""
        _check(lib.kvt_engine_drain(self._handle()), "kvt_engine_drain")

    def geometry(self):
        """kvt_engine_geometry as a dict (hbm_base is an int address)."""
        g = _ffi.Geometry()
        _check(lib.kvt_engine_geometry(self._handle(), ctypes.byref(g)), "kvt_engine_geometry")
        return _struct_dict(g)

    def stats(self):
        """kvt_engine_stats as nested dicts and lists: tier is a list of three dicts (by
        TIER_HBM, TIER_HOST, TIER_NVME); blocks_moved and bytes_moved are dicts keyed by
        direction (MOVE_NAMES: "hbm_to_host", "host_to_nvme", "nvme_to_host", "host_to_hbm")."""
        s = _ffi.Stats()
        s.size = ctypes.sizeof(s)
        _check(lib.kvt_engine_stats(self._handle(), ctypes.byref(s)), "kvt_engine_stats")
        d = _struct_dict(s)
        del d["size"]
        for name, keys in _NAMED_ARRAYS.items():
            d[name] = dict(zip(keys, d[name]))
        return d

    def metrics_text(self):
        """kvt_engine_metrics_text: the counters in the Prometheus text format 0.0.4."""
        h = self._handle()
        rc, text = _metrics(lambda buf, cap, need: lib.kvt_engine_metrics_text(h, buf, cap,
                                                                               need))
        _check(rc, "kvt_engine_metrics_text")
        return text

    def write_kv(self, slot_mapping, layer, k, v):
        """Copy one token's K and V of one layer (bytes-like, each token_bytes long, e.g. a
        contiguous numpy array of the stored dtype) to where the slot mapping says, from the
        host (emulated device only: on CUDA a kernel writes them)."""
        g = self.geometry()
        ka, va = kv_addr(g, layer, slot_mapping)
        for addr, data in ((ka, k), (va, v)):
            mv = memoryview(data).cast("B")
            if mv.nbytes != g["token_bytes"]:
                raise InvalidArgumentError(-errno.EINVAL, f"write_kv: {mv.nbytes} bytes, a "
                                           f"token's K or V is {g['token_bytes']}")
            ctypes.memmove(addr, (ctypes.c_char * mv.nbytes).from_buffer_copy(mv), mv.nbytes)

    def group_geometry(self, group):
        """kvt_group_geometry as a dict (hbm_base an int address, or None for an ALIAS
        group)."""
        g = _ffi.GroupGeometry()
        _check(lib.kvt_group_geometry(self._handle(), group, ctypes.byref(g)),
               "kvt_group_geometry")
        return _struct_dict(g)

    def layer_group(self, layer):
        """kvt_layer_group: (group, layer in group) storing model @layer (an ALIAS layer: its
        source's)."""
        g, lig = ctypes.c_uint32(), ctypes.c_uint32()
        _check(lib.kvt_layer_group(self._handle(), layer, ctypes.byref(g), ctypes.byref(lig)),
               "kvt_layer_group")
        return g.value, lig.value

    def group_state_tensor(self, group, tensor):
        """kvt_group_state_tensor: (offset, bytes) of state tensor @tensor of STATE group
        @group inside one layer's part of a block (layer i of the group at i *
        layer_block_bytes of the slot)."""
        off, n = ctypes.c_uint64(), ctypes.c_uint64()
        _check(lib.kvt_group_state_tensor(self._handle(), group, tensor, ctypes.byref(off),
                                          ctypes.byref(n)), "kvt_group_state_tensor")
        return off.value, n.value

    def group_sidecar(self, group):
        """kvt_group_sidecar: (offset, token_bytes, block_bytes) of SIDECAR group @group in
        each layer's part of its parent's block."""
        off, tb, bb = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
        _check(lib.kvt_group_sidecar(self._handle(), group, ctypes.byref(off),
                                     ctypes.byref(tb), ctypes.byref(bb)), "kvt_group_sidecar")
        return off.value, tb.value, bb.value

    def group_stats(self, group):
        """kvt_engine_group_stats: stats() of one group's pool."""
        s = _ffi.Stats()
        s.size = ctypes.sizeof(s)
        _check(lib.kvt_engine_group_stats(self._handle(), group, ctypes.byref(s)),
               "kvt_engine_group_stats")
        d = _struct_dict(s)
        del d["size"]
        for name, keys in _NAMED_ARRAYS.items():
            d[name] = dict(zip(keys, d[name]))
        return d

    def stream(self):
        """kvt_engine_stream_create: a device Stream owned by the engine (a cudaStream_t on
        CUDA, an in-order worker queue when emulated) to pass to wait_layer/release."""
        h = ctypes.c_void_p()
        _check(lib.kvt_engine_stream_create(self._handle(), ctypes.byref(h)),
               "kvt_engine_stream_create")
        return Stream(self, h)

    def hbm_array(self):
        """The HBM tier as a numpy uint8 array (emulated device only: there it is host
        memory). Valid until close(); use Batch.kv() or the slot mapping to index it."""
        import numpy as np
        g = self.geometry()
        n = g["block_bytes"] * g["hbm_slots"]
        buf = (ctypes.c_uint8 * n).from_address(g["hbm_base"])
        return np.ctypeslib.as_array(buf)


def _seq_id(s):
    return s.id if isinstance(s, Sequence) else int(s)


_GROUP_FIELDS = ("n_kv_heads", "head_dim", "v_head_dim", "latent_dim", "window", "sink",
                 "tokens_per_block", "share", "checkpoint_every", "parent",
                 "sidecar_token_bytes",
                 "sidecar_block_bytes", "sidecar_summary")


def _groups(o, groups):
    """Fill o.groups/o.n_groups from a list of dicts; returns what must stay alive."""
    if groups is None:
        return None
    groups = list(groups)
    arr = (_ffi.Group * max(len(groups), 1))()
    keep = [arr]
    for i, d in enumerate(groups):
        g = arr[i]
        lib.kvt_group_init(ctypes.byref(g), ctypes.sizeof(g))
        d = dict(d)
        kind = d.pop("kind", "full")
        if isinstance(kind, str) and kind not in GROUP_KINDS:
            raise InvalidArgumentError(-errno.EINVAL, f"group {i}: unknown kind {kind!r} (one "
                                       "of " + ", ".join(GROUP_KINDS) + ")", "Engine")
        g.kind = GROUP_KINDS[kind] if isinstance(kind, str) else int(kind)
        layers = [int(x) for x in d.pop("layers", ())]
        la = (ctypes.c_uint32 * max(len(layers), 1))(*layers)
        keep.append(la)
        g.n_layers = len(layers)
        g.layers = ctypes.cast(la, ctypes.POINTER(ctypes.c_uint32))
        if "alias_of" in d:
            src = [int(x) for x in d.pop("alias_of")]
            sa = (ctypes.c_uint32 * max(len(src), 1))(*src)
            keep.append(sa)
            g.alias_of = ctypes.cast(sa, ctypes.POINTER(ctypes.c_uint32))
        dt = d.pop("dtype", "f16")
        if isinstance(dt, str) and dt not in DTYPES:
            raise InvalidArgumentError(-errno.EINVAL, f"group {i}: unknown dtype {dt!r}",
                                       "Engine")
        g.dtype = DTYPES[dt] if isinstance(dt, str) else int(dt)
        state = list(d.pop("state", ()))
        if len(state) > _ffi.GROUP_MAX_STATE:
            raise InvalidArgumentError(-errno.EINVAL, f"group {i}: {len(state)} state tensors, "
                                       f"at most {_ffi.GROUP_MAX_STATE}", "Engine")
        g.n_state = len(state)
        for j, t in enumerate(state):
            shape = [int(x) for x in t.get("shape", ())]
            if not 1 <= len(shape) <= 4:
                raise InvalidArgumentError(-errno.EINVAL, f"group {i}: state tensor {j}: "
                                           f"{len(shape)} dims, 1..4", "Engine")
            tdt = t.get("dtype", "f32")
            if isinstance(tdt, str) and tdt not in DTYPES:
                raise InvalidArgumentError(-errno.EINVAL, f"group {i}: state tensor {j}: "
                                           f"unknown dtype {tdt!r}", "Engine")
            g.state[j].n_dims = len(shape)
            for k, x in enumerate(shape):
                g.state[j].shape[k] = x
            g.state[j].dtype = DTYPES[tdt] if isinstance(tdt, str) else int(tdt)
        for k, v in d.items():
            if k not in _GROUP_FIELDS:
                raise TypeError(f"Engine: group {i}: unknown field {k!r}")
            setattr(g, k, v)
    o.groups = ctypes.cast(arr, ctypes.c_void_p)
    o.n_groups = len(groups)
    return keep


# Array fields of kvt_stats that Engine.stats() returns as dicts keyed by these names.
_NAMED_ARRAYS = {"blocks_moved": MOVE_NAMES, "bytes_moved": MOVE_NAMES}


def _dict_struct(st, d):
    """Fill ctypes struct @st from a dict shaped as _struct_dict() makes them."""
    for name, _ in st._fields_:
        if name not in d:
            continue
        v, cur = d[name], getattr(st, name)
        if isinstance(v, dict) and name in _NAMED_ARRAYS:  # Engine.stats()'s named entries
            v = [v.get(k, 0) for k in _NAMED_ARRAYS[name]]
        if isinstance(cur, ctypes.Array):
            for i, x in enumerate(v):
                if isinstance(cur[i], ctypes.Structure):
                    _dict_struct(cur[i], x)
                else:
                    cur[i] = x
        elif isinstance(cur, ctypes.Structure):
            _dict_struct(cur, v)
        else:
            setattr(st, name, v)


def _struct_dict(st):
    out = {}
    for name, _ in st._fields_:
        v = getattr(st, name)
        if isinstance(v, ctypes.Array):
            v = [_struct_dict(x) if isinstance(x, ctypes.Structure) else x for x in v]
        elif isinstance(v, ctypes.Structure):
            v = _struct_dict(v)
        out[name] = v
    return out


class Stream:
    """A device stream from Engine.stream(); its handle (an int address) is what wait_layer()
    and release() take. close() destroys it (before the engine; Engine.close() does it too)."""

    def __init__(self, engine, handle):
        self._engine = engine
        self._h = handle
        engine._live.add(self)

    @property
    def handle(self):
        if not self._h or self._engine.closed:
            raise _closed("stream")
        return self._h.value

    def sync(self):
        """kvt_engine_stream_sync: wait for everything queued on the stream."""
        _check(lib.kvt_engine_stream_sync(self._engine._handle(), self.handle),
               "kvt_engine_stream_sync")

    def close(self):
        if self._h and not self._engine.closed:
            lib.kvt_engine_stream_destroy(self._engine._handle(), self._h)
        self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Sequence:
    """One request or conversation (a kvt_seq_id). close() ends it; the id is then invalid."""

    def __init__(self, engine, seq_id):
        self._engine = engine
        self._id = seq_id
        engine._live.add(self)

    @property
    def id(self):
        if not self._id:
            raise _closed("sequence")
        return self._id

    def _call(self, fn, *args):
        return fn(self._engine._handle(), self.id, *args)

    def append(self, tokens):
        """kvt_seq_append: reserve room for the tokens (ints; a numpy int32 array works
        too; a non-integer such as 1.5 raises TypeError, a value outside int32 ValueError,
        before anything is appended). Returns the slot mapping, one int per token: slot * tokens_per_block + offset,
        where that token's K/V must be written (kv_addr/Batch.kv help)."""
        tok, n = _tokens(tokens)
        out = (ctypes.c_int64 * n)()
        _check(self._call(lib.kvt_seq_append, tok, n, out), "kvt_seq_append")
        return list(out)

    def append_groups(self, tokens):
        """kvt_seq_append_groups: append to every group at once. Returns one slot mapping per
        group (a list per group, [] for an ALIAS group): where each token's K/V of that group's
        layers go (Engine.group_geometry gives the strides)."""
        tok, n = _tokens(tokens)
        g = self._engine.n_groups
        out = (ctypes.c_int64 * (n * g))()
        _check(self._call(lib.kvt_seq_append_groups, tok, n, out), "kvt_seq_append_groups")
        return [[] if out[i * n] == -1 else list(out[i * n:(i + 1) * n]) for i in range(g)]

    def attach_prefix(self, tokens):
        """kvt_seq_attach_prefix: start this empty sequence with the cached blocks matching the
        prompt @tokens (shared, not copied). Returns the tokens attached (a multiple of
        tokens_per_block, maybe 0): append and prefill only tokens[attached:]."""
        tok, n = _tokens(tokens)
        got = ctypes.c_uint64()
        _check(self._call(lib.kvt_seq_attach_prefix, tok, n, ctypes.byref(got)),
               "kvt_seq_attach_prefix")
        return got.value

    def set_priority(self, priority, first_token=0, n_tokens=0, duration_ms=0):
        """kvt_seq_set_priority: retention @priority (0..100) of the blocks holding tokens
        [first_token, first_token + n_tokens) (0 = to the end) for @duration_ms (0 = for
        good). Read by the "prio" eviction policy only."""
        if not 0 <= int(priority) <= 255:
            raise InvalidArgumentError(-errno.EINVAL, f"priority {priority} > 100",
                                       "kvt_seq_set_priority")
        _check(self._call(lib.kvt_seq_set_priority, first_token, n_tokens, priority,
                          duration_ms), "kvt_seq_set_priority")

    def park(self, tier=TIER_HOST):
        """kvt_seq_park: demote every block below HBM (asynchronous). With nvme_persist and a
        session_key, a park to NVMe publishes the session once its blocks are durable."""
        _check(self._call(lib.kvt_seq_park, _tier(tier)), "kvt_seq_park")

    def resume(self):
        """kvt_seq_resume: start promoting the blocks back to HBM (best effort)."""
        _check(self._call(lib.kvt_seq_resume), "kvt_seq_resume")

    def checkpoint(self, n_tokens):
        """kvt_seq_checkpoint: keep every STATE group's checkpoint at the block boundary at or
        below n_tokens (asked before the sequence passes it)."""
        _check(self._call(lib.kvt_seq_checkpoint, n_tokens), "kvt_seq_checkpoint")

    def sidecar(self, group, layer, first_block, n_blocks):
        """kvt_seq_sidecar_read: the sidecar of layer @layer (of SIDECAR group @group) of blocks
        [first_block, first_block + n_blocks) as bytes, n_blocks x (tokens_per_block x
        token_bytes + block_bytes), from the engine's host mirror: no block is brought up.
        AgainError (-EAGAIN) for a block only on NVMe never read since a restore."""
        _, tb, bb = self._engine.group_sidecar(group)
        tpb = self._engine.group_geometry(group)["tokens_per_block"]
        buf = ctypes.create_string_buffer(max(n_blocks * (tpb * tb + bb), 1))
        _check(self._call(lib.kvt_seq_sidecar_read, group, layer, first_block, n_blocks, buf),
               "kvt_seq_sidecar_read")
        return buf.raw[:n_blocks * (tpb * tb + bb)]

    def info(self):
        """kvt_seq_info: n_tokens, n_blocks, blocks_in (per tier), tenant, priority, parked."""
        i = _ffi.SeqInfo()
        _check(self._call(lib.kvt_seq_info, ctypes.byref(i)), "kvt_seq_info")
        return _struct_dict(i)

    def close(self):
        """kvt_seq_close (idempotent on this object; BusyError while a batch holds it). With
        a persistent store this also removes the sequence's published session (it will not be
        restorable, not even after a restart): use detach() to keep it."""
        if not self._id or self._engine.closed:
            self._id = 0
            return
        _check(self._call(lib.kvt_seq_close), "kvt_seq_close")
        self._id = 0

    def detach(self):
        """kvt_seq_detach: free the sequence (as close) but keep its published session in the
        persistent store, restorable (Engine.restore) as of its last park to NVMe; a park still
        in flight is published first. A sequence never published is simply closed.
        Idempotent on this object; BusyError while a batch holds it."""
        if not self._id or self._engine.closed:
            self._id = 0
            return
        _check(self._call(lib.kvt_seq_detach), "kvt_seq_detach")
        self._id = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<kvtier.Sequence {self._id:#x}>" if self._id else "<kvtier.Sequence closed>"


class BlockTable:
    """A batch's block table (struct kvt_block_table) copied into Python lists: sequence i owns
    indices[indptr[i]:indptr[i+1]] (HBM slot ids), holds seq_len[i] tokens, its last block
    last_block_len[i]; first_block[i] is where its window starts; geo the geometry dict."""

    def __init__(self, bt):
        n = bt.n_seqs
        self.n_seqs = n
        self.indptr = bt.indptr[:n + 1]
        self.indices = bt.indices[:self.indptr[n]]
        self.last_block_len = bt.last_block_len[:n]
        self.seq_len = bt.seq_len[:n]
        self.first_block = bt.first_block[:n]
        self.geo = _struct_dict(bt.geo)

    def blocks(self, i):
        """HBM slot ids of entry i, in order."""
        return self.indices[self.indptr[i]:self.indptr[i + 1]]


class GroupTable(BlockTable):
    """One group's table of a batch (struct kvt_group_table): as BlockTable, plus block_pos
    (each entry's block position in its sequence), window and sink, group; geo is the group's
    geometry dict."""

    def __init__(self, t):
        super().__init__(t)
        self.group = t.group
        self.block_pos = t.block_pos[:self.indptr[self.n_seqs]]
        self.window, self.sink = t.window, t.sink


def group_kv_addr(geo, layer_in_group, slot_mapping):
    """kvt_group_kv_addr: (K address, V address or None) of a token in a layer of a group,
    from a group geometry dict."""
    tpb = geo["tokens_per_block"]
    base = (geo["hbm_base"] + (slot_mapping // tpb) * geo["block_bytes"]
            + layer_in_group * geo["layer_block_bytes"])
    off = slot_mapping % tpb
    k = base + off * geo["k_token_bytes"]
    v = base + geo["v_offset"] + off * geo["v_token_bytes"] if geo["v_token_bytes"] else None
    return k, v


def kv_addr(geo, layer, slot_mapping):
    """kvt_kv_addr: (K address, V address) of a token in a layer, from a geometry dict."""
    tpb = geo["tokens_per_block"]
    k = (geo["hbm_base"] + (slot_mapping // tpb) * geo["block_bytes"]
         + layer * geo["layer_block_bytes"] + (slot_mapping % tpb) * geo["token_bytes"])
    return k, k + geo["v_offset"]


class Batch:
    """A prepared batch (kvt_batch_prepare): pinned until release()."""

    def __init__(self, engine, handle):
        self._engine = engine
        self._h = handle
        engine._live.add(self)

    def _handle(self):
        if not self._h:
            raise _closed("batch")
        return self._h

    def block_table(self):
        """kvt_batch_block_table as a BlockTable."""
        bt = _ffi.BlockTable()
        _check(lib.kvt_batch_block_table(self._handle(), ctypes.byref(bt)),
               "kvt_batch_block_table")
        return BlockTable(bt)

    def group_table(self, group):
        """kvt_batch_group_table as a GroupTable (an ALIAS group: its source group's)."""
        t = _ffi.GroupTable()
        _check(lib.kvt_batch_group_table(self._handle(), group, ctypes.byref(t)),
               "kvt_batch_group_table")
        return GroupTable(t)

    def wait_group_layer(self, group, layer_in_group, stream=None):
        """kvt_batch_wait_group_layer."""
        _check(lib.kvt_batch_wait_group_layer(self._handle(), group, layer_in_group, stream),
               "kvt_batch_wait_group_layer")

    def wait_layer(self, layer, stream=None):
        """kvt_batch_wait_layer: layer's blocks usable (host waits when stream is None)."""
        _check(lib.kvt_batch_wait_layer(self._handle(), layer, stream), "kvt_batch_wait_layer")

    def release(self, stream=None):
        """kvt_batch_release: unpin and free (idempotent)."""
        if not self._h:
            return
        h, self._h = self._h, None
        _check(lib.kvt_batch_release(h, stream), "kvt_batch_release")

    def _engine_closing(self):
        if self._h:
            h, self._h = self._h, None
            lib.kvt_batch_release(h, None)

    def kv(self, i, layer, table=None, dtype=None):
        """Entry i's K and V of one layer as numpy arrays [seq_len, n_kv_heads, head_dim],
        gathered from the HBM blocks (emulated device only; wait_layer first). dtype: the
        numpy dtype of the stored elements (default float32 for f32, float16 for f16)."""
        import numpy as np
        t = table or self.block_table()
        g = t.geo
        lay = self._engine.layout
        if dtype is None:
            dtype = {0: np.float32, 1: np.float16}.get(lay["dtype"])
            if dtype is None:
                raise NotSupportedError(ENOTSUP, "Batch.kv: give dtype for this KV type")
        hbm = self._engine.hbm_array()
        tpb, n = g["tokens_per_block"], t.seq_len[i]
        off = np.array([s * g["block_bytes"] + layer * g["layer_block_bytes"]
                        for s in t.blocks(i)], dtype=np.int64)
        tok = np.arange(tpb, dtype=np.int64) * g["token_bytes"]
        starts = (off[:, None] + tok[None, :]).reshape(-1)[:n]
        idx = starts[:, None] + np.arange(g["token_bytes"], dtype=np.int64)[None, :]
        shape = (n, lay["n_kv_heads"], lay["head_dim"])
        k = hbm[idx].view(dtype).reshape(shape)
        v = hbm[idx + g["v_offset"]].view(dtype).reshape(shape)
        return k, v

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        try:
            if self._h and not self._engine.closed:
                self.release()
        except Exception:
            pass


# -- external-pool mode (kvtier.h "External-pool mode", issue 19) ------------------------------

EXT_STORE, EXT_LOAD = 1, 2
EXT_LAYERWISE = 1
EXT_NO_V = _ffi.EXT_NO_V


def ext_layer(base, block_stride, k_bytes, v_bytes=0, k_offset=0, v_offset=None, n_layers=1,
              layer_stride=0):
    """One entry of a pool's geometry (struct kvt_ext_layer) as a dict; all ints (addresses
    such as tensor.data_ptr(), byte strides and offsets). v_offset None: no V (MLA latent).
    vLLM per layer [2, num_blocks, ...] with page bytes P: ext_layer(ptr, P, P, P,
    v_offset=num_blocks * P); cross-layer [num_blocks, L, 2, ...]: ext_layer(ptr, L * 2 * P, P,
    P, v_offset=P, n_layers=L, layer_stride=2 * P)."""
    return {"base": base, "block_stride": block_stride, "k_bytes": k_bytes,
            "v_bytes": v_bytes if v_offset is not None else 0, "k_offset": k_offset,
            "v_offset": v_offset, "n_layers": n_layers, "layer_stride": layer_stride}


def _u64s(values, what):
    """A ctypes uint64 array of @values (ints; negative ones, such as Python's hash(), are
    taken modulo 2**64), and its length."""
    try:
        import numpy as np
        if isinstance(values, np.ndarray) and values.dtype in (np.uint64, np.int64) \
                and values.flags["C_CONTIGUOUS"]:
            a = np.ascontiguousarray(values).view(np.uint64)
            return a.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)), len(a), a
    except ImportError:
        pass
    out = []
    for i, v in enumerate(values):
        try:
            v = operator.index(v)
        except TypeError:
            raise TypeError(f"{what}[{i}] is {v!r}, not an integer") from None
        if not -(1 << 63) <= v < (1 << 64):
            raise ValueError(f"{what}[{i}] = {v} does not fit 64 bits")
        out.append(v & 0xFFFFFFFFFFFFFFFF)
    arr = (ctypes.c_uint64 * len(out))(*out)
    return arr, len(out), arr


def _u32s(values, what):
    out = []
    for i, v in enumerate(values):
        try:
            v = operator.index(v)
        except TypeError:
            raise TypeError(f"{what}[{i}] is {v!r}, not an integer") from None
        if not 0 <= v < (1 << 32):
            raise InvalidArgumentError(-errno.EINVAL, f"{what}[{i}] = {v} is not a block id",
                                       what)
        out.append(v)
    return (ctypes.c_uint32 * len(out))(*out), len(out)


class ExtJob:
    """A finished external-pool job as ExternalPool.poll() reports it: job (id), kind
    ("store" or "load"), status (0 or the first failure's negative code), n_blocks, n_skipped
    (store: already stored), failed (list of (block_id, code): the caller blocks to
    recompute)."""

    __slots__ = ("job", "kind", "status", "n_blocks", "n_skipped", "failed")

    def __init__(self, job, kind, status, n_blocks, n_skipped, failed):
        self.job, self.kind, self.status = job, kind, status
        self.n_blocks, self.n_skipped, self.failed = n_blocks, n_skipped, failed

    @property
    def ok(self):
        return self.status == 0

    @property
    def failed_block_ids(self):
        return [b for b, _ in self.failed]

    def __repr__(self):
        return (f"ExtJob(job={self.job}, kind={self.kind!r}, status={self.status}, "
                f"n_blocks={self.n_blocks}, n_skipped={self.n_skipped}, failed={self.failed})")


class ExternalPool:
    """The caller's device KV pool registered with an Engine (kvt_ext_register): kvtier stores
    the pool's blocks in its HOST/NVMe tiers by the caller's block ids and 64-bit prefix hashes.
    @layers: a list of ext_layer() dicts (or kvt_ext_layer field dicts); @n_blocks: block ids
    are 0..n_blocks-1. Torch-free: addresses and strides are ints (tensor.data_ptr()). Jobs run
    asynchronously; poll() reports each finished job once with the blocks that failed. The
    pool's memory must outlive close() (which waits for the jobs in flight). On an Engine
    with layer groups, @layer_group names the storage group the pool holds (one pool each,
    with that group's geometry; keys are per group)."""

    def __init__(self, engine, n_blocks, layers, max_jobs=0, layer_group=0, removed_cap=0):
        self._engine = engine
        layers = list(layers)
        arr = (_ffi.ExtLayer * max(len(layers), 1))()
        for i, d in enumerate(layers):
            d = dict(d)
            vo = d.get("v_offset")
            d["v_offset"] = EXT_NO_V if vo is None else vo
            d.setdefault("n_layers", 1)
            for k, v in d.items():
                if k not in dict(_ffi.ExtLayer._fields_):
                    raise TypeError(f"ExternalPool: unknown layer field {k!r}")
                try:
                    iv = operator.index(v)
                except TypeError:
                    raise TypeError(f"ExternalPool: layers[{i}].{k} is {v!r}, not an "
                                    "integer") from None
                if not 0 <= iv < (1 << (32 if k in ("n_layers", "reserved") else 64)):
                    raise InvalidArgumentError(-errno.EINVAL, f"layers[{i}].{k} = {iv} "
                                               "does not fit its C field", "kvt_ext_register")
                setattr(arr[i], k, iv)
        o = _ffi.ExtOpts()
        lib.kvt_ext_opts_init(ctypes.byref(o), ctypes.sizeof(o))
        if not 0 <= operator.index(n_blocks) < (1 << 32):
            raise InvalidArgumentError(-errno.EINVAL, f"n_blocks {n_blocks} out of range",
                                       "kvt_ext_register")
        o.n_blocks, o.n_entries, o.layers = n_blocks, len(layers), arr
        o.layer_group = layer_group
        if max_jobs:
            o.max_jobs = max_jobs
        if removed_cap:
            o.removed_cap = removed_cap
        self._id = ctypes.c_uint32(0)
        self._gone_lock = threading.Lock()
        self._subs = {}  # removal readers: token -> [pending (tenant, hash) list, lost]
        self._gone_buf = None  # kvt_ext_removed's buffer (used under _gone_lock)
        _check(lib.kvt_ext_register(engine._handle(), ctypes.byref(o), ctypes.byref(self._id)),
               "kvt_ext_register")
        self.pool = self._id.value
        self.n_blocks = n_blocks
        engine._live.add(self)

    def _h(self):
        if not self.pool:
            raise _closed("external pool")
        return self._engine._handle()

    @property
    def closed(self):
        return not self.pool or self._engine.closed

    def close(self):
        """kvt_ext_unregister: wait for the jobs in flight, forget the pool and free its
        stored blocks (with nvme_persist their records are deleted too: to keep them for the
        next process, close the Engine instead). Idempotent."""
        if not self.pool:
            return
        p, self.pool = self.pool, 0
        if not self._engine.closed:
            _check(lib.kvt_ext_unregister(self._engine._handle(), p), "kvt_ext_unregister")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def store(self, hashes, block_ids, tenant=0, stream=None):
        """kvt_ext_store: store caller blocks block_ids[i] under hashes[i]; returns the job
        id. The blocks must not be overwritten until the job is reported (poll/wait)."""
        h, n, _keep = _u64s(hashes, "hashes")
        b, nb = _u32s(block_ids, "block_ids")
        if n != nb:
            raise InvalidArgumentError(-errno.EINVAL, f"{n} hashes for {nb} block ids",
                                       "kvt_ext_store")
        job = ctypes.c_uint64(0)
        _check(lib.kvt_ext_store(self._h(), self.pool, tenant, h, b, n, stream,
                                 ctypes.byref(job)), "kvt_ext_store")
        return job.value

    def lookup(self, hashes, tenant=0, with_tier=False):
        """kvt_ext_lookup: how many LEADING hashes are stored (non-blocking). with_tier: also
        the slowest tier they come from ((n, TIER_* or None))."""
        h, n, _keep = _u64s(hashes, "hashes")
        hits = ctypes.c_size_t(0)
        tier = ctypes.c_int(0)
        _check(lib.kvt_ext_lookup(self._h(), self.pool, tenant, h, n, ctypes.byref(hits),
                                  ctypes.byref(tier)), "kvt_ext_lookup")
        if with_tier:
            return hits.value, (None if tier.value >= _ffi.TIER_COUNT else tier.value)
        return hits.value

    def inflight(self, hashes, tenant=0):
        """kvt_ext_inflight: (hits, pending): the leading run stored (as lookup counts it,
        REMOTE fetches that landed included) and, after it, how many hashes are on their way
        (a store or a REMOTE fetch in flight): while pending > 0, ask again later rather than
        recompute. Non-blocking; starts nothing."""
        h, n, _keep = _u64s(hashes, "hashes")
        hits = ctypes.c_size_t(0)
        pending = ctypes.c_size_t(0)
        _check(lib.kvt_ext_inflight(self._h(), self.pool, tenant, h, n, ctypes.byref(hits),
                                    ctypes.byref(pending)), "kvt_ext_inflight")
        return hits.value, pending.value

    def load(self, hashes, block_ids, tenant=0, layerwise=False):
        """kvt_ext_load: load the blocks stored under hashes[i] into caller blocks
        block_ids[i]; returns the job id (poll() reports the blocks that failed)."""
        h, n, _keep = _u64s(hashes, "hashes")
        b, nb = _u32s(block_ids, "block_ids")
        if n != nb:
            raise InvalidArgumentError(-errno.EINVAL, f"{n} hashes for {nb} block ids",
                                       "kvt_ext_load")
        job = ctypes.c_uint64(0)
        _check(lib.kvt_ext_load(self._h(), self.pool, tenant, h, b, n,
                                EXT_LAYERWISE if layerwise else 0, ctypes.byref(job)),
               "kvt_ext_load")
        return job.value

    def poll(self, max_jobs=256):
        """kvt_ext_poll: the jobs finished since the last poll, as ExtJob objects (each job
        is reported once). Non-blocking."""
        done = (_ffi.ExtDone * max_jobs)()
        cap = 1024
        while True:
            fails = (_ffi.ExtFail * cap)()
            rc = lib.kvt_ext_poll(self._h(), self.pool, done, max_jobs, fails, cap)
            if rc == -errno.ENOSPC:
                cap = max(cap * 2, done[0].n_failed)
                continue
            _check(rc, "kvt_ext_poll")
            break
        out = []
        for d in done[:rc]:
            failed = [(fails[i].block_id, fails[i].err)
                      for i in range(d.failed_first, d.failed_first + d.n_failed)]
            out.append(ExtJob(d.job, {EXT_STORE: "store", EXT_LOAD: "load"}.get(d.kind, d.kind),
                              d.status, d.n_blocks, d.n_skipped, failed))
        return out

    def wait(self, job, timeout_ms=10000):
        """kvt_ext_wait: True when the job has ended (poll() still reports it), False on
        timeout."""
        rc = lib.kvt_ext_wait(self._h(), self.pool, job, timeout_ms)
        if rc == -errno.ETIMEDOUT:
            return False
        _check(rc, "kvt_ext_wait")
        return True

    def wait_layer(self, job, layer, stream=None):
        """kvt_ext_wait_layer: layer @layer of every block of load job @job has landed (the
        host waits when stream is None)."""
        _check(lib.kvt_ext_wait_layer(self._h(), self.pool, job, layer, stream),
               "kvt_ext_wait_layer")

    def touch(self, hashes, tenant=0):
        """kvt_ext_touch: an access of these stored blocks; returns how many were found."""
        h, n, _keep = _u64s(hashes, "hashes")
        return _check(lib.kvt_ext_touch(self._h(), self.pool, tenant, h, n), "kvt_ext_touch")

    def drop(self, hashes, tenant=0):
        """kvt_ext_drop: forget these stored blocks; returns how many were found."""
        h, n, _keep = _u64s(hashes, "hashes")
        return _check(lib.kvt_ext_drop(self._h(), self.pool, tenant, h, n), "kvt_ext_drop")

    def hold(self, hashes, tenant=0):
        """kvt_ext_hold: protect these stored blocks from eviction until release() (a load
        promised to the scheduler); returns how many were held."""
        h, n, _keep = _u64s(hashes, "hashes")
        return _check(lib.kvt_ext_hold(self._h(), self.pool, tenant, h, n), "kvt_ext_hold")

    def release(self, hashes, tenant=0):
        """kvt_ext_release: end one hold of each; returns how many were released."""
        h, n, _keep = _u64s(hashes, "hashes")
        return _check(lib.kvt_ext_release(self._h(), self.pool, tenant, h, n),
                      "kvt_ext_release")

    def clear(self, tenant=None):
        """kvt_ext_clear: drop every stored block of @tenant (None: of every tenant); returns
        how many were dropped."""
        t = EXT_ALL_TENANTS if tenant is None else tenant
        return _check(lib.kvt_ext_clear(self._h(), self.pool, t), "kvt_ext_clear")

    def subscribe_removed(self):
        """A reader of the removal feed (kvt_ext_removed has one reader; the pool fans it out
        to every subscriber): returns a token for removed()."""
        with self._gone_lock:
            tok = object()
            self._subs[tok] = [[], 0]
            return tok

    def removed(self, token=None, max_entries=4096):
        """kvt_ext_removed: the stored blocks that stopped being stored (evicted from their
        last tier, dropped, lost) since this reader's last call, oldest first. @token: from
        subscribe_removed() (each subscriber sees every removal once); None: the pool's
        default reader. Returns (entries, lost): entries a list of (tenant, hash); lost the
        removals the engine's ring overwrote meanwhile (then any hash may be gone: rebuild a
        mirror from lookup()). Thread-safe."""
        cap = max(1, int(max_entries))
        with self._gone_lock:
            if token not in self._subs:
                if token is not None:
                    raise KeyError("ExternalPool.removed: unknown token")
                self._subs[None] = [[], 0]
            if self._gone_buf is None or len(self._gone_buf) != cap:
                self._gone_buf = (_ffi.ExtRemoval * cap)()  # kept: a drain per request scan
            buf = self._gone_buf
            lost = ctypes.c_uint64(0)
            while True:
                n = _check(lib.kvt_ext_removed(self._h(), self.pool, buf, cap,
                                               ctypes.byref(lost)), "kvt_ext_removed")
                got = [(buf[i].tenant, buf[i].hash) for i in range(n)]
                for q in self._subs.values():
                    q[0].extend(got)
                    q[1] += lost.value
                if n < cap:
                    break
            q = self._subs[token]
            out, nlost = q[0], q[1]
            self._subs[token] = [[], 0]
            return out, nlost

    def stats(self):
        """kvt_ext_stats as a dict."""
        st = _ffi.ExtStats()
        st.size = ctypes.sizeof(st)
        _check(lib.kvt_ext_stats(self._h(), self.pool, ctypes.byref(st)), "kvt_ext_stats")
        return {f: getattr(st, f) for f, _ in st._fields_ if f != "size"}
