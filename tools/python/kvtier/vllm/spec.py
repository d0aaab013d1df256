# SPDX-License-Identifier: MIT
"""KvtierOffloadingSpec: kvtier as the store behind vLLM's OffloadingConnector.

vLLM (0.33.0) loads it with kv_connector_extra_config {"spec_name": "KvtierOffloadingSpec",
"spec_module_path": "kvtier.vllm.spec", ...}. The spec has two halves:

  KvtierOffloadingManager (scheduler side): lookup / prepare_load / touch / complete_load /
      prepare_store / complete_store / on_new_request ... answered by kvtier itself
      (kvt_ext_lookup, kvt_ext_touch): kvtier owns the slots, the eviction policy, the
      checksums and the persistent store; the manager keeps the keys whose store is in
      flight (HIT_PENDING), the keys it stored (reset_cache drops them) and an exact mirror
      of the stored keys, kept by kvt_ext_removed, so that vLLM's per-key lookups do not
      each call into kvtier.
  KvtierOffloadingWorker (worker side): registers the GPU KV tensors vLLM hands it
      (CanonicalKVCaches: per tensor [num_blocks, page] bytes with a block stride) as
      kvtier's external pool, and turns submit_store / submit_load into kvt_ext_store /
      kvt_ext_load of the GPU block ids, get_finished into kvt_ext_poll.

Both halves share one kvtier Engine per process (kvtier._store.shared_store, named by the
engine id): vLLM with tensor parallel 1 runs its scheduler and its worker in one process.

kv_connector_extra_config keys (all optional except where said):
  kvtier_host_bytes    HOST tier bytes (default: cpu_bytes_to_use, else 1 GiB)
  kvtier_nvme_dir      NVMe tier directory (default: none, HOST only)
  kvtier_nvme_bytes    NVMe tier bytes (required with kvtier_nvme_dir)
  kvtier_persist       true: the persistent store; blocks stored before a restart are hits
                       after it (same model, block size and dtype)
  kvtier_evict_policy  "arc" (default), "lru", "prio"
  kvtier_tenant        kvtier tenant of every block (default 0)
  kvtier_store_name    the shared store's name (default: the vLLM engine id)
  kvtier_engine_opts   other kvtier.Engine options, e.g. {"emu_copy_bytes_per_s": ...}
  kvtier_remote_host   a Redis / Valkey server (or cluster node) as the REMOTE tier below the
                       store: stored blocks are written through per kvtier_remote_write
                       ("seen_twice" default, "all", "none") and a lookup that misses asks
                       REMOTE for the request's following blocks at once (kvtier.h
                       "External-pool mode"); with kvtier_remote_port (6379),
                       kvtier_remote_model_id (required with a host: servers share blocks
                       only under the same id), kvtier_remote_password. Block hashes must be
                       the same on every server: run vLLM with the same PYTHONHASHSEED (or a
                       sha256 prefix_caching_hash_algo) everywhere
Not supported yet (a clear error at start): more than one worker (tensor / pipeline
parallel), more than one offloaded KV cache group (hybrid models).
"""

import time

from vllm.v1.kv_offload.base import (GPULoadStoreSpec, LoadStoreSpec, LookupResult, Medium,
                                     OffloadingEvent,
                                     OffloadingManager, OffloadingSpec, OffloadingWorker,
                                     PrepareStoreOutput, RequestOffloadingContext,
                                     TransferResult)

import kvtier
from kvtier._store import find_store, hash64, remote_opts, shared_store, sub_hashes


class KvtierLoadStoreSpec(LoadStoreSpec):
    """Where offloaded blocks live in kvtier: their 64-bit hashes, one per GPU block
    (blocks_per_chunk per offload key, in key order)."""

    def __init__(self, hashes):
        self.hashes = list(hashes)

    def __repr__(self):
        return f"KvtierLoadStoreSpec({len(self.hashes)} hashes)"


def _store_name(spec):
    x = spec.extra_config
    return str(x.get("kvtier_store_name") or spec.config.engine_id or "vllm")


def _store_for(spec, block_bytes):
    """The process's shared kvtier store for @spec, created by the worker (which knows the
    bytes of one block: the sum of its layers' pages)."""
    x = spec.extra_config
    name = _store_name(spec)
    host = int(x.get("kvtier_host_bytes") or x.get("cpu_bytes_to_use") or (1 << 30))
    return shared_store(name, block_bytes=block_bytes, host_bytes=host,
                        nvme_dir=x.get("kvtier_nvme_dir"),
                        nvme_bytes=int(x.get("kvtier_nvme_bytes") or 0),
                        persist=bool(x.get("kvtier_persist", False)),
                        evict_policy=x.get("kvtier_evict_policy", "default"),
                        tenant=int(x.get("kvtier_tenant", 0)),
                        **remote_opts(x, "kvtier offloading"),
                        **dict(x.get("kvtier_engine_opts") or {}))


class KvtierOffloadingManager(OffloadingManager):
    """The scheduler side: kvtier answers what is stored. Single-threaded, as vLLM's
    scheduler calls it (the default no-op lock).

    vLLM asks lookup() one key at a time, for every waiting request every step (2,048 calls
    for a 32k-token prompt of 16-token blocks), so a call into kvtier per key (about 25 us
    with its argument conversion) would cost tens of ms per request per step. The manager
    keeps an exact mirror of the keys kvtier holds instead: a key enters it when one batched
    kvt_ext_lookup confirms its blocks (after its store completed, or on a first lookup that
    misses the mirror), and leaves it when kvtier reports one of its blocks removed
    (kvt_ext_removed: evicted from its last tier, dropped, lost), drained once per step and
    at the start of each request's scan. A hit of the mirror costs two set probes; a miss is
    checked with kvtier (a key stored by an earlier process, or by another manager), so the
    mirror never answers MISS for a stored key and never HIT for a key kvtier reported gone.
    A block evicted between a lookup and its load fails alone in the load (vLLM's
    invalid-block path), as it would with a call per key.

    KV cache events (vLLM's kv_events_config.enable_kv_cache_events): take_events() yields an
    OffloadingEvent (medium CPU: kvtier's HOST and NVMe are one store to vLLM) of the keys
    this manager stored once kvtier confirmed them (complete_store, or a later check that finds
    one of them held again), and of those keys again, removed=True, when kvtier reports one of
    their blocks gone (the removal feed, or a load check that finds them gone). Keys only found
    stored (another manager's, an earlier process's) are not announced, as a tier emits events
    for the state it owns. When the removal ring overflowed (which removals were lost is
    unknown), or the store was re-created, every announced key is reported removed: a router
    may then under-count hits until each key is found held again, never route to a block that
    is gone. reset_cache() emits nothing for the keys it drops (vLLM resets its event tracker
    with it), as vLLM's CPU manager."""

    def __init__(self, spec):
        self.spec = spec
        self.bpc = spec.blocks_per_chunk
        self.tenant = int(spec.extra_config.get("kvtier_tenant", 0))
        self._pending = set()  # keys whose store is in flight
        self._stored = set()   # keys this manager stored (for reset_cache)
        self._sub = {}         # key -> its kvtier hashes (memo: the scheduler asks often)
        self._mirror = set()   # keys whose blocks kvtier holds (see the class comment)
        self._key_of = {}      # kvtier hash -> the mirrored key it belongs to
        self._synced_ctx = None  # the request context of the scan the mirror was synced for
        self._synced_pool = None
        self._token = None     # this manager's reader of the pool's removal feed
        self.mirror_syncs = 0  # removal drains (counters for tests and benchmarks)
        self.mirror_resets = 0  # mirrors dropped because kvtier's removal ring overflowed
        kec = getattr(spec, "kv_events_config", None)
        self.events = [] if getattr(kec, "enable_kv_cache_events", False) else None
        self._announced = set()  # keys a stored event announced (and no removal since)
        self._announce = []      # keys to announce stored at the end of the current call
        self._reset_pending = set()  # stores in flight at a reset: dropped when they end
        self._fetch_of = {}    # key -> the run of keys one REMOTE fetch asked (see _remote)
        self._scan_res = {}    # key -> its LookupResult in this scan (REMOTE runs only)
        self.remote_fetches = 0  # REMOTE fetches this manager started (tests, benchmarks)

    def _pool(self):
        st = find_store(_store_name(self.spec))
        return None if st is None else st.pool

    def hashes(self, key):
        h = self._sub.get(key)
        if h is None:
            h = self._sub[key] = sub_hashes(hash64(key), self.bpc)
            if len(self._sub) > 1 << 20:
                self._sub.clear()
        return h

    def _mirror_add(self, key, hs):
        self._mirror.add(key)
        for h in hs:
            self._key_of[h] = key
        if self.events is not None and key in self._stored and key not in self._announced:
            self._announced.add(key)
            self._announce.append(key)

    def _mirror_remove(self, key):
        self._mirror.discard(key)
        for h in self.hashes(key):
            self._key_of.pop(h, None)

    def _flush_announce(self):
        if self._announce:
            self.events.append(OffloadingEvent(keys=self._announce, medium=Medium.CPU,
                                               removed=False))
            self._announce = []

    def _mirror_clear(self):
        self._mirror.clear()
        self._key_of.clear()

    def _sync(self, pool):
        """Apply kvtier's removals since the last drain to the mirror."""
        self.mirror_syncs += 1
        if pool is not self._synced_pool:  # a new store: nothing mirrored belongs to it
            self._mirror_clear()
            self._emit_removed(list(self._announced))
            self._synced_pool = pool
            self._token = pool.subscribe_removed()
        gone, lost = pool.removed(self._token)
        if lost:
            self.mirror_resets += 1
            self._mirror_clear()
            self._emit_removed(list(self._announced))
            return
        removed = []
        for tenant, h in gone:
            if tenant == self.tenant:
                k = self._key_of.pop(h, None)
                if k is not None:
                    self._mirror.discard(k)
                    removed.append(k)
        self._emit_removed(removed)

    def _emit_removed(self, keys):
        if self.events is None:
            return
        keys = [k for k in keys if k in self._announced]
        if keys:
            self._announced.difference_update(keys)
            self.events.append(OffloadingEvent(keys=keys, medium=Medium.CPU, removed=True))

    def take_events(self):
        if self.events is None:
            return
        events, self.events = self.events, []
        yield from events

    def _confirm(self, pool, keys):
        """Mirror those of @keys whose blocks kvtier holds now: one kvt_ext_lookup of all
        their hashes (in order) counts the leading run; the keys after it (a store that
        found no room for some blocks: rare) are checked one by one."""
        keys = list(keys)
        hss = [self.hashes(k) for k in keys]
        full = pool.lookup([h for hs in hss for h in hs], tenant=self.tenant) // self.bpc
        for i, (k, hs) in enumerate(zip(keys, hss)):
            if i < full or (i > full and pool.lookup(hs, tenant=self.tenant) == len(hs)):
                self._mirror_add(k, hs)

    def lookup(self, key, req_context):
        if key in self._pending:
            return LookupResult.HIT_PENDING
        if req_context is self._synced_ctx and key in self._mirror and self._synced_pool.pool:
            return LookupResult.HIT  # the scan's mirror is current (synced, pool open)
        pool = self._pool()
        if pool is None:
            return LookupResult.MISS
        if req_context is not self._synced_ctx or pool is not self._synced_pool:
            self._synced_ctx = req_context
            self._scan_res = {}
            self._sync(pool)
        if key in self._mirror:
            return LookupResult.HIT
        st = find_store(_store_name(self.spec))
        if st is not None and st.remote:
            return self._remote(pool, key, req_context)
        hs = self.hashes(key)
        if pool.lookup(hs, tenant=self.tenant) == len(hs):
            self._mirror_add(key, hs)
            self._confirm_after(pool, key, req_context)
            self._flush_announce()
            return LookupResult.HIT
        return LookupResult.MISS

    def _remote(self, pool, key, req_context, most_hashes=256):
        """lookup() of a key the mirror does not hold, on a store with a REMOTE tier. The
        first such key of a request starts one fetch: a kvt_ext_lookup of its hashes and
        those of the keys after it in the request (vLLM's ReqContext positions, up to
        @most_hashes: one pipelined get), which asks REMOTE for every block after the local
        run. The run's state is then read with one kvt_ext_inflight per scan: keys whose
        blocks landed are HIT (mirrored), keys still on their way RETRY (vLLM's scheduler
        keeps scanning and asks again next step, instead of recomputing them), the rest MISS.
        A run with nothing on its way is forgotten: a later miss asks again (kvtier does not
        re-ask a hash REMOTE lacked within a second)."""
        res = self._scan_res.get(key)
        if res is not None:
            return res
        run = self._fetch_of.get(key)
        if run is None:
            run = [key] + [k for k in self._following(key, req_context)
                           if k not in self._mirror and k not in self._fetch_of]
            run = run[:max(1, most_hashes // self.bpc)]
            hs = [h for k in run for h in self.hashes(k)]
            hits = pool.lookup(hs, tenant=self.tenant)  # the local run; REMOTE asked for the rest
            if hits < len(hs):
                self.remote_fetches += 1
            if len(self._fetch_of) > 1 << 16:
                self._fetch_of.clear()
            run = tuple(run)
            for k in run:
                self._fetch_of[k] = run
        hits, pending = pool.inflight([h for k in run for h in self.hashes(k)],
                                      tenant=self.tenant)
        waiting = False
        for i, k in enumerate(run):
            end = (i + 1) * self.bpc
            if end <= hits:
                self._mirror_add(k, self.hashes(k))
                self._scan_res[k] = LookupResult.HIT
            elif end <= hits + pending:
                self._scan_res[k] = LookupResult.RETRY
                waiting = True
            else:
                self._scan_res[k] = LookupResult.MISS
        if not waiting:
            for k in run:
                if self._fetch_of.get(k) is run:
                    del self._fetch_of[k]
        self._flush_announce()
        return self._scan_res[key]

    def _following(self, key, req_context):
        """The keys after @key in its request, in order (vLLM's ReqContext positions; none
        without them), of the same KV cache group."""
        pos = getattr(req_context, "_offload_key_positions", None)
        if not isinstance(pos, dict) or key not in pos:
            return []
        at, grp = pos[key], key[-4:]
        return [k for _, k in sorted((p, k) for k, p in pos.items()
                                     if p > at and k[-4:] == grp)]

    def _confirm_after(self, pool, key, req_context, most=8192):
        """A stored key the mirror did not hold (a cold mirror: a new process, another
        manager's stores): mirror the leading run of stored keys that follow it in the request,
        with one batched kvt_ext_lookup, so the rest of the scan hits the mirror instead of
        calling kvtier per key. The request's keys and their order come from the positions
        vLLM's scheduler records in the ReqContext before it looks up (update_offload_keys;
        vllm 0.33.0's private ReqContext._offload_key_positions): without them nothing more is
        done."""
        pos = getattr(req_context, "_offload_key_positions", None)
        if not isinstance(pos, dict) or key not in pos:
            return
        at, grp = pos[key], key[-4:]
        after = sorted((p, k) for k, p in pos.items()
                       if p > at and k[-4:] == grp and k not in self._mirror)[:most]
        if not after:
            return
        keys = [k for _, k in after]
        hss = [self.hashes(k) for k in keys]
        full = pool.lookup([h for hs in hss for h in hs], tenant=self.tenant) // self.bpc
        for k, hs in zip(keys[:full], hss[:full]):
            self._mirror_add(k, hs)

    def on_schedule_end(self, context):
        self._synced_ctx = None  # the next step's first lookup drains the removals again
        self._scan_res = {}

    def prepare_load(self, keys, req_context):
        keys = list(keys)
        hs = [h for k in keys for h in self.hashes(k)]
        pool = self._pool()
        if pool is not None and hs:
            # one batched check: keys that are not (or no longer) stored leave the mirror, so a
            # wrong HIT (a block evicted after the lookup) is not repeated; their loads fail
            # alone (vLLM's invalid-block path). The leading run ends at a key that is gone;
            # the mirrored keys after it are checked one by one (rare: only after a wrong HIT)
            full = pool.lookup(hs, tenant=self.tenant) // self.bpc
            healed = []
            for i, k in enumerate(keys[full:]):
                if k in self._mirror and (i == 0 or pool.lookup(
                        self.hashes(k), tenant=self.tenant) != self.bpc):
                    self._mirror_remove(k)
                    healed.append(k)
            self._emit_removed(healed)
        return KvtierLoadStoreSpec(hs)

    def touch(self, keys, req_context):
        pool = self._pool()
        if pool is not None and keys:
            pool.touch([h for k in keys for h in self.hashes(k)], tenant=self.tenant)

    def complete_load(self, keys, req_context):
        return  # kvtier pinned the blocks for the load job and unpinned them at its end

    def prepare_store(self, keys, req_context):
        pool = self._pool()
        if pool is None:
            return None
        self._sync(pool)  # one call: a key evicted since the last drain is stored again
        todo = []
        for k in keys:
            if k in self._pending or k in self._mirror:
                continue
            hs = self.hashes(k)
            if pool.lookup(hs, tenant=self.tenant) == len(hs):
                self._mirror_add(k, hs)
                continue
            todo.append(k)
        self._flush_announce()
        self._pending.update(todo)
        return PrepareStoreOutput(keys_to_store=todo,
                                  store_spec=KvtierLoadStoreSpec(
                                      [h for k in todo for h in self.hashes(k)]),
                                  evicted_keys=[])

    def complete_store(self, keys, req_context, success=True):
        for k in keys:
            self._pending.discard(k)
            if success:
                self._stored.add(k)
        pool = self._pool()
        if success and keys and pool is not None:
            # a store whose blocks found no room completes too: only what kvtier holds is
            # mirrored. Removals so far are drained first, so that a removal of an older copy
            # of one of these blocks (evicted while this store was in flight) cannot take out
            # what the confirmation adds; a removal after the check is drained later
            self._sync(pool)
            self._confirm(pool, dict.fromkeys(keys))
            self._flush_announce()

    def on_new_request(self, req_context):
        return RequestOffloadingContext()

    def reset_cache(self):
        """Drop what this manager stored, and the stores still in flight (vLLM never completes
        jobs started before a reset): their blocks are dropped now, and again when vLLM says
        the flushed jobs ended (on_reset_flushed), since one may land after this call."""
        pool = self._pool()
        gone = self._stored | self._pending
        if pool is not None and gone:
            pool.drop([h for k in gone for h in self.hashes(k)], tenant=self.tenant)
        self._reset_pending |= self._pending
        self._stored.clear()
        self._pending.clear()
        self._sub.clear()
        self._mirror_clear()
        self._announced.clear()
        self._announce = []

    def on_reset_flushed(self):
        """Every job in flight at the last reset has ended: drop what those stores landed
        (not a key stored again since the reset)."""
        pool = self._pool()
        late = self._reset_pending - self._pending - self._stored
        if pool is not None and late:
            pool.drop([h for k in late for h in self.hashes(k)], tenant=self.tenant)
            for k in late:
                self._mirror_remove(k)
        self._reset_pending.clear()


def _slice_hashes(hashes, gpu_spec, bpc):
    """The kvtier hashes of the GPU blocks of @gpu_spec: a key covers @bpc GPU blocks and
    the first GPU block may sit inside the first key (block_indices[0] % bpc)."""
    n = len(gpu_spec.block_ids)
    skip = int(gpu_spec.block_indices[0]) % bpc if bpc > 1 and len(gpu_spec.block_indices) \
        else 0
    out = hashes[skip:skip + n]
    if len(out) != n:
        raise ValueError(f"kvtier: {n} GPU blocks for {len(hashes)} stored hashes "
                         f"(skip {skip})")
    return out


class KvtierOffloadingWorker(OffloadingWorker):
    """The worker side: vLLM's GPU KV blocks registered as kvtier's external pool; every
    store / load is one kvtier job (a batched gather / scatter of each block's per-layer
    pages). tolerate_failures (set by kvtier.vllm.connector.KvtierConnector): a load whose
    blocks partly failed is reported done and its failed GPU block ids are kept in
    failed_block_ids for vLLM's invalid-block path; without it a failed load is reported as
    failed (vLLM 0.33's OffloadingConnector then stops: it has no failed-job path), never as
    loaded."""

    def __init__(self, spec, kv_caches):
        self.spec = spec
        self.bpc = spec.blocks_per_chunk
        self.tolerate_failures = False
        self.failed_block_ids = set()
        refs = kv_caches.group_data_refs
        if len(refs) != 1:
            raise NotImplementedError(f"kvtier offloading: {len(refs)} KV cache groups; "
                                      "one (full attention) is supported in this version")
        layers, n_blocks = [], None
        for ref in refs[0]:
            t = kv_caches.tensors[ref.tensor_idx].tensor
            if n_blocks is None:
                n_blocks = t.shape[0]
            elif t.shape[0] != n_blocks:
                raise ValueError(f"kvtier offloading: KV tensors of {n_blocks} and "
                                 f"{t.shape[0]} blocks")
            layers.append(kvtier.ext_layer(t.data_ptr(), t.stride(0) * t.element_size(),
                                           ref.page_size_bytes))
        self.block_bytes = sum(d["k_bytes"] for d in layers)
        self.store = _store_for(spec, self.block_bytes)
        self.tenant = self.store.tenant
        self.pool = self.store.register(n_blocks, layers)
        self._jobs = {}  # kvtier job id -> (vLLM job id, "store" | "load", gpu ids, t0, bytes)

    def _submit(self, fn, job_id, hashes, gpu_spec, kind):
        ids = [int(b) for b in gpu_spec.block_ids]
        hs = _slice_hashes(hashes, gpu_spec, self.bpc)
        kj = fn(hs, ids, tenant=self.tenant)
        self._jobs[kj] = (job_id, kind, ids, time.perf_counter(),
                          len(ids) * self.block_bytes)
        return True

    def submit_store(self, job_id, src_spec, dst_spec):
        assert isinstance(src_spec, GPULoadStoreSpec)
        return self._submit(self.pool.store, job_id, dst_spec.hashes, src_spec, "store")

    def submit_load(self, job_id, src_spec, dst_spec, expedited=False):
        assert isinstance(dst_spec, GPULoadStoreSpec)
        return self._submit(self.pool.load, job_id, src_spec.hashes, dst_spec, "load")

    def get_finished(self):
        out = []
        for j in self.pool.poll():
            job_id, kind, ids, t0, nbytes = self._jobs.pop(j.job)
            ok = True
            if kind == "load" and j.failed:
                self.failed_block_ids.update(j.failed_block_ids)
                ok = self.tolerate_failures
            # a store whose blocks found no room is a future miss, not an error: kvtier's
            # lookup is the truth the manager answers from
            out.append(TransferResult(job_id=job_id, success=ok, transfer_size=nbytes,
                                      transfer_time=time.perf_counter() - t0))
        return out

    def wait(self, job_ids):
        for kj, (job_id, *_rest) in list(self._jobs.items()):
            if job_id in job_ids:
                while not self.pool.wait(kj, 10000):
                    pass

    def shutdown(self):
        for kj in list(self._jobs):
            self.pool.wait(kj, 10000)


class KvtierOffloadingSpec(OffloadingSpec):
    """kvtier's HOST / NVMe tiers (eviction policy, checksums, persistent store) as the
    offloading medium of vLLM's OffloadingConnector."""

    def __init__(self, config):
        super().__init__(config)
        if config.parallel.world_size != 1:
            raise NotImplementedError(f"kvtier offloading: world size "
                                      f"{config.parallel.world_size}; one worker (tensor and "
                                      "pipeline parallel 1) is supported in this version")
        if len(config.groups) != 1:
            raise NotImplementedError(f"kvtier offloading: {len(config.groups)} KV cache "
                                      "groups; one is supported in this version")
        self._manager = None
        self._worker = None

    def get_manager(self):
        if self._manager is None:
            self._manager = KvtierOffloadingManager(self)
        return self._manager

    def get_worker(self, kv_caches):
        if self._worker is None:
            self._worker = KvtierOffloadingWorker(self, kv_caches)
        return self._worker
