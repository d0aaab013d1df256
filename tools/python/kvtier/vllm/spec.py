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
Hybrid models (several KV cache groups: full attention with sliding-window layers, as Gemma 3
and gpt-oss): one kvtier Engine and pool per group ("<name>#g<group id>"), the HOST and NVMe
budgets split between them by the bytes of one block of each; an offload key's group (its
last 4 bytes, vLLM's make_offload_key) picks the pool; vLLM's scheduler combines the groups'
hits (a sliding-window group needs only the window's keys).

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
                       store: stored blocks are written through per kvtier_remote_write ("all",
                       the default here: each stored block once; "seen_twice": only a block
                       stored or loaded again; "none") and a lookup that misses asks REMOTE
                       for the request's following blocks at once (kvtier.h "External-pool
                       mode"); with kvtier_remote_port (6379), kvtier_remote_model_id
                       (required with a host: servers share blocks only under the same id),
                       kvtier_remote_password. Block hashes must be the same on every server:
                       vLLM's default sha256 block hash is; with a non-cryptographic
                       prefix_caching_hash_algo, set the same PYTHONHASHSEED on every server
A kvtier_* key not listed here is refused at start (a typo is not ignored).
Not supported yet (a clear error at start): more than one worker (tensor / pipeline
parallel). Mamba / linear-attention state groups are stored as opaque pages like any group
but are not tested.
"""

import os
import time

from vllm.v1.kv_offload.base import (GPULoadStoreSpec, LoadStoreSpec, LookupResult, Medium,
                                     OffloadingEvent,
                                     OffloadingManager, OffloadingSpec, OffloadingWorker,
                                     PrepareStoreOutput, RequestOffloadingContext,
                                     TransferResult)

import kvtier
from kvtier._store import (REMOTE_KEYS, check_keys, find_store, hash64, remote_opts,
                           shared_store, store_names, sub_hashes)

KEYS = ("kvtier_host_bytes", "kvtier_nvme_dir", "kvtier_nvme_bytes", "kvtier_persist",
        "kvtier_evict_policy", "kvtier_tenant", "kvtier_store_name",
        "kvtier_engine_opts") + REMOTE_KEYS


class KvtierLoadStoreSpec(LoadStoreSpec):
    """Where offloaded blocks live in kvtier: their 64-bit hashes, one per GPU block
    (blocks_per_chunk per offload key, in key order), and the same per KV cache group
    (by_group: group id -> its keys' hashes, in order; None: one group)."""

    def __init__(self, hashes, by_group=None):
        self.hashes = list(hashes)
        self.by_group = by_group

    def __repr__(self):
        return f"KvtierLoadStoreSpec({len(self.hashes)} hashes)"


def _store_name(spec):
    x = spec.extra_config
    return str(x.get("kvtier_store_name") or spec.config.engine_id or "vllm")


def _group_ids(spec):
    """The KV cache group ids vLLM offloads (OffloadingConfig.groups), or [None]: one group
    (a spec without a config, as the mirror tests build)."""
    groups = getattr(getattr(spec, "config", None), "groups", None)
    return [g.group_id for g in groups] if groups else [None]


def _group_of(key):
    """The KV cache group id of an offload key (vLLM's make_offload_key: hash + 4 bytes)."""
    return int.from_bytes(key[-4:], "big")


def _store_for(spec, block_bytes, gid=None, share=1.0):
    """The process's shared kvtier store for @spec (group @gid of a hybrid model: its own
    store with @share of the HOST and NVMe budgets and its own NVMe directory), created by
    the worker (which knows the bytes of one block: the sum of its layers' pages)."""
    x = spec.extra_config
    name = store_names(_store_name(spec), _group_ids(spec))[gid]
    host = int(x.get("kvtier_host_bytes") or x.get("cpu_bytes_to_use") or (1 << 30))
    nvme_dir, nvme_bytes = x.get("kvtier_nvme_dir"), int(x.get("kvtier_nvme_bytes") or 0)
    if nvme_dir and not nvme_bytes:
        raise ValueError("kvtier offloading: kvtier_nvme_dir is set but kvtier_nvme_bytes is "
                         "not: give the NVMe tier's capacity in bytes")
    if share < 1.0:
        host = max(int(host * share), block_bytes)
        nvme_bytes = int(nvme_bytes * share)
        if nvme_dir:
            nvme_dir = os.path.join(nvme_dir, f"g{gid}")
            os.makedirs(nvme_dir, exist_ok=True)
    return shared_store(name, block_bytes=block_bytes, host_bytes=host,
                        nvme_dir=nvme_dir, nvme_bytes=nvme_bytes,
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
    prepare_load holds the blocks it promises (kvt_ext_hold) until complete_load, as vLLM's
    contract asks; a block evicted between a lookup and prepare_load (or lost to a failed
    NVMe read) fails alone in the load: with the KvtierConnector vLLM recomputes just it
    (its invalid-block path), with the plain OffloadingConnector vLLM 0.33 stops (its worker
    asserts every load succeeded). With several KV cache groups each
    key is answered by its group's pool (the removal feeds of all of them are drained).

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
        self._gids = _group_ids(spec)
        self._names = store_names(_store_name(spec), self._gids)
        self._one = len(self._gids) == 1  # one group: every key is the one store's
        self._pending = set()  # keys whose store is in flight
        self._stored = set()   # keys this manager stored (for reset_cache)
        self._sub = {}         # key -> its kvtier hashes (memo: the scheduler asks often)
        self._mirror = set()   # keys whose blocks kvtier holds (see the class comment)
        self._key_of = {}      # kvtier hash -> the mirrored key it belongs to
        self._synced_ctx = None  # the request context of the scan the mirror was synced for
        self._synced_pool = {}   # group id -> the pool whose removals the mirror follows
        self._token = {}       # group id -> this manager's reader of that pool's feed
        self.mirror_syncs = 0  # removal drains (counters for tests and benchmarks)
        self.mirror_resets = 0  # mirrors dropped because kvtier's removal ring overflowed
        kec = getattr(spec, "kv_events_config", None)
        self.events = [] if getattr(kec, "enable_kv_cache_events", False) else None
        self._announced = set()  # keys a stored event announced (and no removal since)
        self._announce = []      # keys to announce stored at the end of the current call
        self._reset_pending = set()  # stores in flight at a reset: dropped when they end
        self._fetch_of = {}    # key -> the run of keys one REMOTE fetch asked (see _remote)
        self._scan_no = 0      # scans started (a run remembers the scan that asked for it)
        self._held = {}        # (request id, group id) -> hash lists prepare_load held
        self._scan_res = {}    # key -> its LookupResult in this scan (REMOTE runs only)
        self.remote_fetches = 0  # REMOTE fetches this manager started (tests, benchmarks)

    # -- the pools of the groups ---------------------------------------------------------
    def _gid(self, key):
        return self._gids[0] if self._one else _group_of(key)

    def _store(self, gid):
        name = self._names.get(gid)
        return None if name is None else find_store(name)

    def _pool(self, gid=None):
        st = self._store(self._gids[0] if gid is None else gid)
        return None if st is None else st.pool

    def _by_group(self, keys):
        """@keys split by group, in order: {group id: [keys]}."""
        out = {}
        for k in keys:
            out.setdefault(self._gid(k), []).append(k)
        return out

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

    def _sync_all(self):
        """Apply every group pool's removals since the last drain to the mirror."""
        for g in self._gids:
            pool = self._pool(g)
            if pool is not None:
                self._sync(pool, g)

    def _sync(self, pool, gid):
        """Apply the removals of group @gid's @pool since the last drain to the mirror."""
        self.mirror_syncs += 1
        if pool is not self._synced_pool.get(gid):
            # a new store: nothing mirrored of its group belongs to it (the whole mirror is
            # dropped: it is a cache, and a new pool is rare)
            self._mirror_clear()
            self._emit_removed(list(self._announced))
            self._synced_pool[gid] = pool
            self._token[gid] = pool.subscribe_removed()
        gone, lost = pool.removed(self._token[gid])
        if lost:
            self.mirror_resets += 1
            self._mirror_clear()
            self._emit_removed(list(self._announced))
            return
        removed = {}  # a key once, however many of its blocks went
        for tenant, h in gone:
            if tenant == self.tenant:
                k = self._key_of.pop(h, None)
                if k is not None:
                    self._mirror.discard(k)
                    removed[k] = None
        self._emit_removed(list(removed))

    def _emit_removed(self, keys):
        if self.events is None:
            return
        keys = [k for k in dict.fromkeys(keys) if k in self._announced]
        if keys:
            self._announced.difference_update(keys)
            self.events.append(OffloadingEvent(keys=keys, medium=Medium.CPU, removed=True))

    def take_events(self):
        if self.events is None:
            return
        events, self.events = self.events, []
        yield from events

    def _confirm(self, keys):
        """Mirror those of @keys whose blocks kvtier holds now: per group, one kvt_ext_lookup
        of all their hashes (in order) counts the leading run; the keys after it (a store
        that found no room for some blocks: rare) are checked one by one."""
        for gid, gkeys in self._by_group(keys).items():
            pool = self._pool(gid)
            if pool is None:
                continue
            hss = [self.hashes(k) for k in gkeys]
            full = pool.lookup([h for hs in hss for h in hs], tenant=self.tenant) // self.bpc
            for i, (k, hs) in enumerate(zip(gkeys, hss)):
                if i < full or (i > full and pool.lookup(hs, tenant=self.tenant) == len(hs)):
                    self._mirror_add(k, hs)

    def lookup(self, key, req_context):
        if key in self._pending:
            return LookupResult.HIT_PENDING
        gid = self._gids[0] if self._one else _group_of(key)
        if req_context is self._synced_ctx and key in self._mirror:
            sp = self._synced_pool.get(gid)
            if sp is not None and sp.pool:
                return LookupResult.HIT  # the scan's mirror is current (synced, pool open)
        st = self._store(gid)
        pool = None if st is None else st.pool
        if pool is None:
            return LookupResult.MISS
        if req_context is not self._synced_ctx or pool is not self._synced_pool.get(gid):
            self._synced_ctx = req_context
            self._scan_res = {}
            self._scan_no += 1
            self._sync_all()
        if key in self._mirror:
            return LookupResult.HIT
        if st.remote:
            return self._remote(pool, key, req_context)
        hs = self.hashes(key)
        if pool.lookup(hs, tenant=self.tenant) == len(hs):
            self._mirror_add(key, hs)
            self._confirm_after(pool, key, req_context)
            self._flush_announce()
            return LookupResult.HIT
        return LookupResult.MISS

    def _remote(self, pool, key, req_context, most_hashes=256, fresh=False):
        """lookup() of a key the mirror does not hold, on a store with a REMOTE tier. The
        first such key of a request starts one fetch: a kvt_ext_lookup of its hashes and
        those of the keys after it in the request (vLLM's ReqContext positions, up to
        @most_hashes: one pipelined get; for the last key of a request, as a sliding-window
        group's backward scan asks first, the keys before it, nearest first), which asks
        REMOTE for every block after the local run. The run's state is then read with one
        kvt_ext_inflight per scan: keys whose blocks landed are HIT (mirrored), keys still on
        their way RETRY (vLLM's scheduler keeps scanning and asks again next step, instead of
        recomputing them), the rest MISS. A run with nothing on its way is forgotten; a key
        of a run asked in an earlier scan that comes out MISS (its request went away, or its
        scan stopped before it) is asked again (kvtier does not re-ask a hash REMOTE lacked
        within a second)."""
        res = self._scan_res.get(key)
        if res is not None:
            return res
        ent = None if fresh else self._fetch_of.get(key)
        if ent is None:
            run = [key] + [k for k in self._neighbours(key, req_context)
                           if k not in self._mirror and k not in self._fetch_of]
            run = tuple(run[:max(1, most_hashes // self.bpc)])
            hs = [h for k in run for h in self.hashes(k)]
            hits = pool.lookup(hs, tenant=self.tenant)  # the local run; REMOTE asked for the rest
            if hits < len(hs):
                self.remote_fetches += 1
            if len(self._fetch_of) > 1 << 16:
                self._fetch_of.clear()
            ent = (run, self._scan_no)
            for k in run:
                self._fetch_of[k] = ent
        run = ent[0]
        hits, pending = pool.inflight([h for k in run for h in self.hashes(k)],
                                      tenant=self.tenant)
        waiting = False
        res = {}
        for i, k in enumerate(run):
            end = (i + 1) * self.bpc
            if end <= hits:
                self._mirror_add(k, self.hashes(k))
                res[k] = LookupResult.HIT
            elif end <= hits + pending:
                res[k] = LookupResult.RETRY
                waiting = True
            else:
                res[k] = LookupResult.MISS
        if not waiting:
            for k in run:
                if self._fetch_of.get(k) is ent:
                    del self._fetch_of[k]
        self._flush_announce()
        if res[key] is LookupResult.MISS and ent[1] != self._scan_no and not fresh:
            return self._remote(pool, key, req_context, most_hashes, fresh=True)
        self._scan_res.update(res)
        return res[key]

    def _following(self, key, req_context):
        """The keys after @key in its request, in order (vLLM's ReqContext positions; none
        without them), of the same KV cache group."""
        pos = getattr(req_context, "_offload_key_positions", None)
        if not isinstance(pos, dict) or key not in pos:
            return []
        at, grp = pos[key], key[-4:]
        return [k for _, k in sorted((p, k) for k, p in pos.items()
                                     if p > at and k[-4:] == grp)]

    def _neighbours(self, key, req_context):
        """The keys to fetch with @key: those after it in its request, or, when it is the
        request's last key of its group (a backward scan's first), those before it, nearest
        first."""
        after = self._following(key, req_context)
        if after:
            return after
        pos = getattr(req_context, "_offload_key_positions", None)
        if not isinstance(pos, dict) or key not in pos:
            return []
        at, grp = pos[key], key[-4:]
        return [k for _, k in sorted(((p, k) for k, p in pos.items()
                                      if p < at and k[-4:] == grp), reverse=True)]

    def _confirm_after(self, pool, key, req_context, most=8192):
        """A stored key the mirror did not hold (a cold mirror: a new process, another
        manager's stores): mirror the leading run of stored keys that follow it in the request,
        with one batched kvt_ext_lookup, so the rest of the scan hits the mirror instead of
        calling kvtier per key. The request's keys and their order come from the positions
        vLLM's scheduler records in the ReqContext before it looks up (update_offload_keys;
        vllm 0.33.0's private ReqContext._offload_key_positions): without them nothing more is
        done."""
        keys = [k for k in self._following(key, req_context) if k not in self._mirror][:most]
        if not keys:
            return
        hss = [self.hashes(k) for k in keys]
        full = pool.lookup([h for hs in hss for h in hs], tenant=self.tenant) // self.bpc
        for k, hs in zip(keys[:full], hss[:full]):
            self._mirror_add(k, hs)

    def on_schedule_end(self, context):
        self._synced_ctx = None  # the next step's first lookup drains the removals again
        self._scan_res = {}

    def prepare_load(self, keys, req_context):
        keys = list(keys)
        by_group = {}
        for gid, gkeys in self._by_group(keys).items():
            hs = [h for k in gkeys for h in self.hashes(k)]
            by_group[gid] = hs
            pool = self._pool(gid)
            if pool is None or not hs:
                continue
            # one batched check: keys that are not (or no longer) stored leave the mirror, so a
            # wrong HIT (a block evicted after the lookup) is not repeated; their loads fail
            # alone (vLLM's invalid-block path). The leading run ends at a key that is gone;
            # the mirrored keys after it are checked one by one (rare: only after a wrong HIT)
            full = pool.lookup(hs, tenant=self.tenant) // self.bpc
            healed = []
            for i, k in enumerate(gkeys[full:]):
                if k in self._mirror and (i == 0 or pool.lookup(
                        self.hashes(k), tenant=self.tenant) != self.bpc):
                    self._mirror_remove(k)
                    healed.append(k)
            self._emit_removed(healed)
            # vLLM's contract: the blocks to load are protected from eviction until
            # complete_load (stores submitted before this load must not take them); the
            # leading run is held, exactly what complete_load releases
            n = pool.hold(hs, tenant=self.tenant)
            if n:
                self._held.setdefault((req_context.req_id, gid), []).append(hs[:n])
        return KvtierLoadStoreSpec([h for k in keys for h in self.hashes(k)], by_group)

    def touch(self, keys, req_context):
        for gid, gkeys in self._by_group(keys).items():
            pool = self._pool(gid)
            if pool is not None and gkeys:
                pool.touch([h for k in gkeys for h in self.hashes(k)], tenant=self.tenant)

    def complete_load(self, keys, req_context):
        """The holds prepare_load took for this request's load end (vLLM issues one load per
        request at a time; the load job pinned the blocks meanwhile)."""
        for gid in self._gids:
            held = self._held.pop((req_context.req_id, gid), None)
            pool = self._pool(gid)
            if held and pool is not None:
                pool.release([h for hs in held for h in hs], tenant=self.tenant)

    def prepare_store(self, keys, req_context):
        keys = list(keys)
        pools = {g: self._pool(g) for g in self._by_group(keys)}
        if any(p is None for p in pools.values()) or (not keys and self._pool() is None):
            return None
        self._sync_all()  # one call per group: a key evicted since the last drain is stored again
        todo = []
        for k in keys:
            if k in self._pending or k in self._mirror:
                continue
            hs = self.hashes(k)
            # kvt_ext_inflight: the same count as a lookup, but no REMOTE fetch of a key
            # that is about to be stored from the GPU
            if pools[self._gid(k)].inflight(hs, tenant=self.tenant)[0] == len(hs):
                self._mirror_add(k, hs)
                continue
            todo.append(k)
        self._flush_announce()
        self._pending.update(todo)
        by_group = {g: [h for k in gk for h in self.hashes(k)]
                    for g, gk in self._by_group(todo).items()}
        return PrepareStoreOutput(keys_to_store=todo,
                                  store_spec=KvtierLoadStoreSpec(
                                      [h for k in todo for h in self.hashes(k)], by_group),
                                  evicted_keys=[])

    def complete_store(self, keys, req_context, success=True):
        for k in keys:
            self._pending.discard(k)
            if success:
                self._stored.add(k)
        if success and keys:
            # a store whose blocks found no room completes too: only what kvtier holds is
            # mirrored. Removals so far are drained first, so that a removal of an older copy
            # of one of these blocks (evicted while this store was in flight) cannot take out
            # what the confirmation adds; a removal after the check is drained later
            self._sync_all()
            self._confirm(dict.fromkeys(keys))
            self._flush_announce()

    def on_new_request(self, req_context):
        return RequestOffloadingContext()

    def _drop(self, keys):
        for gid, gkeys in self._by_group(keys).items():
            pool = self._pool(gid)
            if pool is not None:
                pool.drop([h for k in gkeys for h in self.hashes(k)], tenant=self.tenant)

    def reset_cache(self):
        """Evict every stored block of this manager's tenant (vLLM's contract: "all tracked
        blocks"; kvt_ext_clear of each group's pool: what this manager stored, what it found
        stored or fetched from REMOTE, REMOTE fetches in flight, stores in flight, which vLLM
        never completes: they are dropped as they land, and again when vLLM says the flushed
        jobs ended, on_reset_flushed). Values already in REMOTE stay there (other servers'
        too)."""
        for g in self._gids:
            pool = self._pool(g)
            if pool is not None:
                pool.clear(self.tenant)
        self._reset_pending |= self._pending
        self._fetch_of.clear()
        self._scan_res = {}
        self._stored.clear()
        self._pending.clear()
        self._sub.clear()
        self._mirror_clear()
        self._announced.clear()
        self._announce = []

    def on_reset_flushed(self):
        """Every job in flight at the last reset has ended: drop what those stores landed
        (not a key stored again since the reset)."""
        late = self._reset_pending - self._pending - self._stored
        if late:
            self._drop(late)
            for k in late:
                self._mirror_remove(k)
        self._reset_pending.clear()


def _slice_hashes(hashes, n, block_index, bpc):
    """The kvtier hashes of @n GPU blocks of one group: a key covers @bpc GPU blocks and the
    first GPU block may sit inside the first key (@block_index % bpc)."""
    skip = int(block_index) % bpc if bpc > 1 else 0
    out = hashes[skip:skip + n]
    if len(out) != n:
        raise ValueError(f"kvtier: {n} GPU blocks for {len(hashes)} stored hashes "
                         f"(skip {skip})")
    return out


class KvtierOffloadingWorker(OffloadingWorker):
    """The worker side: vLLM's GPU KV blocks registered as kvtier's external pool (one per KV
    cache group); every store / load is one kvtier job per group it touches (a batched gather
    / scatter of each block's per-layer pages), reported to vLLM when all of them ended.
    tolerate_failures (set by kvtier.vllm.connector.KvtierConnector): a load whose
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
        gids = _group_ids(spec)
        if gids == [None]:
            gids = [None] * len(refs)
        if len(refs) != len(gids):
            raise ValueError(f"kvtier offloading: {len(refs)} KV cache groups of tensors for "
                             f"{len(gids)} offloaded groups")
        geo = []
        for gi, grefs in enumerate(refs):
            layers, n_blocks = [], None
            for ref in grefs:
                t = kv_caches.tensors[ref.tensor_idx].tensor
                if n_blocks is None:
                    n_blocks = t.shape[0]
                elif t.shape[0] != n_blocks:
                    raise ValueError(f"kvtier offloading: KV tensors of {n_blocks} and "
                                     f"{t.shape[0]} blocks in group {gids[gi]}")
                layers.append(kvtier.ext_layer(t.data_ptr(), t.stride(0) * t.element_size(),
                                               ref.page_size_bytes))
            if not layers:
                raise ValueError(f"kvtier offloading: KV cache group {gids[gi]} has no "
                                 "tensors")
            geo.append((n_blocks, layers, sum(d["k_bytes"] for d in layers)))
        total = sum(g[2] for g in geo)
        self.groups = []  # per KV cache group (vLLM's order): (group id, store, pool, bytes)
        for gid, (n_blocks, layers, bb) in zip(gids, geo):
            st = _store_for(spec, bb, gid, share=bb / total if len(geo) > 1 else 1.0)
            self.groups.append((gid, st, st.register(n_blocks, layers), bb))
        self.store, self.pool = self.groups[0][1], self.groups[0][2]
        self.block_bytes = total
        self.tenant = self.store.tenant
        self._jobs = {}     # (group index, kvtier job id) -> vLLM job id
        self._vjobs = {}    # vLLM job id -> [kind, kvtier jobs left, ok, t0, bytes]
        self._ready = []    # vLLM jobs with nothing to copy: reported at the next poll

    def _submit(self, fname, job_id, spec, gpu_spec, kind):
        ids = [int(b) for b in gpu_spec.block_ids]
        sizes = list(gpu_spec.group_sizes) if getattr(gpu_spec, "group_sizes", None) \
            else [len(ids)]
        starts = list(gpu_spec.block_indices) if getattr(gpu_spec, "block_indices", None) \
            else [0] * len(sizes)
        if len(sizes) != len(self.groups):
            raise ValueError(f"kvtier: a transfer of {len(sizes)} groups, {len(self.groups)} "
                             "registered")
        by_group = spec.by_group if spec.by_group is not None else {self.groups[0][0]:
                                                                   spec.hashes}
        todo, off, nbytes = [], 0, 0
        for gi, (n, start) in enumerate(zip(sizes, starts)):
            gid, _st, pool, bb = self.groups[gi]
            gids_ = ids[off:off + n]
            off += n
            if not n:
                continue
            hashes = by_group.get(gid) if len(self.groups) > 1 else spec.hashes
            todo.append((gi, pool, _slice_hashes(hashes or [], n, start, self.bpc), gids_))
            nbytes += n * bb
        self._vjobs[job_id] = [kind, len(todo), True, time.perf_counter(), nbytes]
        for gi, pool, hs, gids_ in todo:
            kj = getattr(pool, fname)(hs, gids_, tenant=self.tenant)
            self._jobs[(gi, kj)] = job_id
        if not todo:
            self._ready.append(job_id)
        return True

    def submit_store(self, job_id, src_spec, dst_spec):
        assert isinstance(src_spec, GPULoadStoreSpec)
        return self._submit("store", job_id, dst_spec, src_spec, "store")

    def submit_load(self, job_id, src_spec, dst_spec, expedited=False):
        assert isinstance(dst_spec, GPULoadStoreSpec)
        return self._submit("load", job_id, src_spec, dst_spec, "load")

    def _result(self, job_id):
        kind, _left, ok, t0, nbytes = self._vjobs.pop(job_id)
        return TransferResult(job_id=job_id, success=ok, transfer_size=nbytes,
                              transfer_time=time.perf_counter() - t0)

    def get_finished(self):
        out = [self._result(j) for j in self._ready]
        self._ready = []
        for gi, (_gid, _st, pool, _bb) in enumerate(self.groups):
            for j in pool.poll():
                job_id = self._jobs.pop((gi, j.job))
                rec = self._vjobs[job_id]
                if rec[0] == "load" and j.failed:
                    self.failed_block_ids.update(j.failed_block_ids)
                    rec[2] = rec[2] and self.tolerate_failures
                # a store whose blocks found no room is a future miss, not an error: kvtier's
                # lookup is the truth the manager answers from
                rec[1] -= 1
                if not rec[1]:
                    out.append(self._result(job_id))
        return out

    def wait(self, job_ids):
        for (gi, kj), job_id in list(self._jobs.items()):
            if job_id in job_ids:
                while not self.groups[gi][2].wait(kj, 10000):
                    pass

    def shutdown(self):
        for gi, kj in list(self._jobs):
            self.groups[gi][2].wait(kj, 10000)


class KvtierOffloadingSpec(OffloadingSpec):
    """kvtier's HOST / NVMe tiers (eviction policy, checksums, persistent store) as the
    offloading medium of vLLM's OffloadingConnector."""

    def __init__(self, config):
        super().__init__(config)
        check_keys(self.extra_config, KEYS, "kvtier offloading")
        remote_opts(self.extra_config, "kvtier offloading")  # its errors at start, not later
        if config.parallel.world_size != 1:
            raise NotImplementedError(f"kvtier offloading: world size "
                                      f"{config.parallel.world_size}; one worker (tensor and "
                                      "pipeline parallel 1) is supported in this version")
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
