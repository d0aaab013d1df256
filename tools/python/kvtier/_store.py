# SPDX-License-Identifier: MIT
"""The store shared by a server's scheduler side and worker side in one process: one kvtier
Engine (HOST, NVMe, persistent store) and the ExternalPool the worker registers (the server's
own device KV blocks). Used by kvtier.vllm and kvtier.sglang; no vLLM or SGLang import here.

A scheduler-side object (vLLM's OffloadingManager) and a worker-side object (the worker that
copies blocks) of the same server find the same SharedStore with shared_store(name, ...): in
vLLM with one GPU worker (tensor parallel 1) both live in the EngineCore process. The scheduler
side only answers "is it stored" (kvt_ext_lookup) once the worker registered its pool; before
that nothing is stored (a lookup is a miss, a store is refused).
"""

import threading

import kvtier

_LOCK = threading.Lock()
_STORES = {}

_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: sub-block j of a key is hash ^ (j * _MIX)
MASK64 = (1 << 64) - 1


def hash64(key):
    """A 64-bit kvtier hash of a server's block key (bytes: vLLM's OffloadKey = block hash +
    group index; SGLang's page key string): its first 8 bytes folded with the rest (the keys
    are already cryptographic or xxhash chain hashes, so no rehash is needed; the fold keeps
    the group index of an OffloadKey)."""
    if isinstance(key, str):
        key = key.encode()
    if len(key) <= 8:
        return int.from_bytes(key.ljust(8, b"\0"), "little")
    h = int.from_bytes(key[:8], "little")
    rest = key[8:]
    for i in range(0, len(rest), 8):
        h = ((h ^ int.from_bytes(rest[i:i + 8].ljust(8, b"\0"), "little")) * 0x100000001B3
             + i + 1) & MASK64
    return h


def sub_hashes(h, n):
    """The kvtier hashes of the @n device blocks one key covers (vLLM's blocks_per_chunk)."""
    return [h] if n == 1 else [(h ^ (j * _MIX)) & MASK64 for j in range(n)]


def engine_layout(block_bytes):
    """kvt_layout fields (int8 elements) whose block_bytes is >= @block_bytes, as close as the
    engine's limits (every dimension <= 4096) allow: the engine stores opaque blocks for the
    external pool, only their size matters."""
    half = -(-max(int(block_bytes), 2) // 2)
    for d in range(min(4096, half), 0, -1):
        if half % d == 0 and half // d <= 4096 * 4096:
            rest = half // d
            for layers in range(min(4096, rest), 0, -1):
                if rest % layers == 0 and rest // layers <= 4096:
                    return {"n_layers": layers, "n_kv_heads": rest // layers,
                            "head_dim": d, "tokens_per_block": 1, "dtype": "int8"}
    half = -(-half // 4096) * 4096  # no exact factorisation: round up
    return engine_layout(2 * half)


class SharedStore:
    """An Engine + the worker's ExternalPool; every call goes through the Engine's own lock
    (kvtier is thread-safe) and this object's lock for the pool reference."""

    def __init__(self, name, block_bytes, host_bytes, nvme_dir=None, nvme_bytes=0,
                 persist=False, evict_policy="default", tenant=0, **engine_opts):
        lay = engine_layout(block_bytes)
        self.name = name
        self.block_bytes = block_bytes
        self.tenant = tenant
        opts = dict(engine_opts)
        if nvme_dir:
            opts.update(nvme_dir=nvme_dir, nvme_bytes=nvme_bytes, nvme_persist=bool(persist))
        self.engine = kvtier.Engine(hbm_bytes=2 * lay["n_layers"] * lay["n_kv_heads"]
                                    * lay["head_dim"], host_bytes=host_bytes,
                                    evict_policy=evict_policy, **lay, **opts)
        self.pool = None
        self.remote = bool(opts.get("remote_host"))  # a REMOTE tier below the pool
        self._lock = threading.Lock()

    def register(self, n_blocks, layers, removed_cap=0):
        """Register the worker's device blocks (ext_layer dicts); one pool per store.
        removed_cap: kvt_ext_opts.removed_cap (0: kvtier's default)."""
        with self._lock:
            if self.pool is not None:
                raise kvtier.KvtierError(-17, f"store {self.name!r}: a pool is already "
                                         "registered", "SharedStore.register")
            self.pool = kvtier.ExternalPool(self.engine, n_blocks, layers,
                                             removed_cap=removed_cap)
            return self.pool

    def close(self):
        """Destroy the engine (it waits for the pool's jobs). Not kvt_ext_unregister first:
        that deletes the pool's records from the persistent store, destroy keeps them for
        the next process."""
        with self._lock:
            self.pool = None
            self.engine.close()


REMOTE_KEYS = ("kvtier_remote_host", "kvtier_remote_port", "kvtier_remote_model_id",
               "kvtier_remote_write", "kvtier_remote_password")


def check_keys(extra, known, what):
    """Refuse a kvtier_* key of a server's extra config that is not one of @known (a typo would
    otherwise be silently ignored), naming the closest known key."""
    import difflib
    for k in extra:
        if isinstance(k, str) and k.startswith("kvtier_") and k not in known:
            near = difflib.get_close_matches(k, known, n=1)
            raise ValueError(f"{what}: unknown key {k!r}" +
                             (f" (did you mean {near[0]!r}?)" if near else "") +
                             "; the kvtier keys are " + ", ".join(sorted(known)))


def remote_opts(extra, what):
    """Engine options of the REMOTE tier from a server's extra config (kvtier_remote_host,
    kvtier_remote_port (default 6379), kvtier_remote_model_id, kvtier_remote_write,
    kvtier_remote_password): {} when kvtier_remote_host is not set. The model id (the model and
    its weights' identity: servers share blocks only under the same one) is required with a
    host. kvtier_remote_write defaults to "all" here (every stored block is written through
    once: a server that sets a REMOTE host means to share), not the engine's "seen_twice"
    (a block is written when it is stored or loaded a second time: fewer writes of one-off
    prompts)."""
    host = extra.get("kvtier_remote_host")
    if not host:
        return {}
    model = extra.get("kvtier_remote_model_id")
    if not model:
        raise ValueError(f"{what}: kvtier_remote_host is set but kvtier_remote_model_id is "
                         "not: name the model and its weights (e.g. \"org/model@revision\"); "
                         "only servers with the same id share blocks")
    write = extra.get("kvtier_remote_write")
    write = "all" if write is None else write
    if isinstance(write, str) and write.replace("-", "_") not in kvtier.REMOTE_WRITES:
        raise ValueError(f"{what}: kvtier_remote_write {write!r}: one of "
                         + ", ".join(repr(w) for w in sorted(kvtier.REMOTE_WRITES)))
    out = {"remote_host": str(host), "remote_model_id": str(model),
           "remote_port": int(extra.get("kvtier_remote_port") or 6379), "remote_write": write}
    if extra.get("kvtier_remote_password"):
        out["remote_password"] = str(extra["kvtier_remote_password"])
    return out


def store_names(name, group_ids):
    """The SharedStore name of each KV cache group id: @name itself for a model of one group
    (None or a single id), "<name>#g<id>" for each group of a hybrid model."""
    if len(group_ids) <= 1:
        return {g: name for g in group_ids} | {None: name}
    return {g: f"{name}#g{g}" for g in group_ids}


def shared_store(name, **kw):
    """The process's SharedStore called @name, created with @kw (SharedStore's arguments) by
    its first caller; later callers get the same one (their @kw are ignored)."""
    with _LOCK:
        st = _STORES.get(name)
        if st is None or st.engine.closed:
            st = _STORES[name] = SharedStore(name, **kw)
        return st


def find_store(name):
    """The process's open SharedStore called @name, or None."""
    with _LOCK:
        st = _STORES.get(name)
    return None if st is None or st.engine.closed else st


def close_store(name):
    """Close and forget the SharedStore @name and those of its KV cache groups ("<name>#g*":
    a server's shutdown; tests' "restart")."""
    with _LOCK:
        gone = [_STORES.pop(k) for k in list(_STORES) if k == name or
                k.startswith(name + "#g")]
    for st in gone:
        st.close()
