# SPDX-License-Identifier: MIT
"""KvtierHiCacheStorage: an SGLang HiCacheStorage on kvtier's HOST / NVMe store (sglang
0.5.23), loaded by StorageBackendFactory's "dynamic" backend (extra_config backend_name,
module_path "kvtier.sglang.backend", class_name "KvtierHiCacheStorage").

Pages are stored as kvtier external-pool blocks keyed by 64-bit hashes of SGLang's page keys
(kvtier._store.hash64 of the key + this rank's suffix): eviction policy, checksums on every
NVMe read (a page that fails it is a miss, never wrong bytes), persistent store, metrics.
Two ways to the pages:
- zero-copy (SGLang's v1 interface, extra_config interface_v1 set, which makes SGLang's
  controller call batch_set_v1 / batch_get_v1 by host-pool indices): when the registered host
  pool is an MHATokenToKVPoolHost whose kv_buffer is one contiguous CPU tensor in layout
  layer_first, page_first or page_first_direct, that kv_buffer itself is registered as the
  kvtier external pool (block id = host index // page_size; per layer K and V segments as the
  layout places them), and kvtier copies pages between the host pool and its slots directly.
  In this mode the flat-page calls (set/get/batch_set/batch_get, which SGLang's controller does
  not call with interface_v1) answer False / None.
- staging (every other case: no interface_v1, another host pool class such as MLA's, or
  kvtier_zero_copy 0): the pool is a staging buffer of kvtier_staging_pages pages owned by this
  object: set() copies the value in and stores it, get() loads into staging and copies out;
  batch_get_v1 / batch_set_v1 move pages between the host pool and staging with the host pool's
  own page accessors (get_data_page / set_from_flat_data_page): one copy more than zero-copy.
The two modes may store a page's bytes in different orders (zero-copy: kvtier's segments, for
layer_first and page_first_direct layer by layer, K then V; staging: SGLang's flat page), so
their keys differ (zero-copy keys carry "_zc_" + the layout):
a store written in one mode is a miss, never wrong bytes, in the other.

extra_config keys: kvtier_page_bytes (bytes of one page, required unless a host pool is
registered before the first call: then its page size), kvtier_host_bytes (default 1 GiB),
kvtier_nvme_dir, kvtier_nvme_bytes, kvtier_persist, kvtier_evict_policy,
kvtier_staging_pages (default 64), kvtier_tenant, kvtier_zero_copy (default 1: zero-copy
where interface_v1 is set and the host pool allows it; 0: always staging); the REMOTE tier
below the store (kvtier.h "External-pool mode"): kvtier_remote_host, kvtier_remote_port
(6379), kvtier_remote_model_id (required with a host: servers share pages only under the
same id), kvtier_remote_write ("all" default here: each stored page once; "seen_twice": a
page stored or loaded again; "none"),
kvtier_remote_password, kvtier_remote_wait_ms (default 500: how long batch_exists, called
from SGLang's prefetch thread, waits for the pages it asked REMOTE for; the wait ends as soon
as nothing is on its way); kvtier_engine_opts: other kvtier.Engine options. Any other
kvtier_* key is refused (a typo is not ignored).
Thread safety: SGLang calls a backend from its prefetch and backup threads; one lock
serialises this object's jobs (the staging buffer, and each job's completion report, which
kvt_ext_poll hands out once).
"""

import ctypes
import threading

import numpy as np
import torch

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

import kvtier
import time

from kvtier._store import REMOTE_KEYS, SharedStore, check_keys, hash64, remote_opts

KEYS = ("kvtier_page_bytes", "kvtier_host_bytes", "kvtier_nvme_dir", "kvtier_nvme_bytes",
        "kvtier_persist", "kvtier_evict_policy", "kvtier_staging_pages", "kvtier_tenant",
        "kvtier_zero_copy", "kvtier_remote_wait_ms", "kvtier_engine_opts") + REMOTE_KEYS


class KvtierHiCacheStorage(HiCacheStorage):
    def __init__(self, storage_config, kwargs=None):
        self.config = storage_config
        self.extra = dict(storage_config.extra_config or {})
        check_keys(self.extra, KEYS, "KvtierHiCacheStorage")
        sc = storage_config
        model = "-".join((sc.model_name or "").split("/"))
        # as HiCacheFile: MLA KV is the same on every TP rank, other KV is per rank
        self.suffix = (f"_{model}" if sc.is_mla_model else f"_{model}_{sc.tp_rank}_{sc.tp_size}") \
            + (f"_{sc.pp_size}_{sc.pp_rank}" if sc.pp_size > 1 else "")
        self.tenant = int(self.extra.get("kvtier_tenant", 0))
        self.n_staging = int(self.extra.get("kvtier_staging_pages", 64))
        self.page_bytes = int(self.extra.get("kvtier_page_bytes", 0)) or None
        self.mem_pool_host = None
        self.store = None
        self.zero_copy = False
        # SGLang's controller takes the v1 path for a dynamic backend iff this is truthy
        self._want_zc = bool(self.extra.get("interface_v1", 0)) and \
            bool(int(self.extra.get("kvtier_zero_copy", 1)))
        self._lock = threading.Lock()
        self.remote_wait_s = int(self.extra.get("kvtier_remote_wait_ms", 500)) / 1000.0
        self._remote = remote_opts(self.extra, "KvtierHiCacheStorage")
        if self.page_bytes and not self._want_zc:
            self._open()

    # -- setup ---------------------------------------------------------------------------
    def _open(self, zc=None):
        """Open the store; @zc: (n_blocks, ext_layer list) of the host pool for zero-copy,
        None for the staging buffer."""
        x = self.extra
        if x.get("kvtier_nvme_dir") and not int(x.get("kvtier_nvme_bytes") or 0):
            raise ValueError("KvtierHiCacheStorage: kvtier_nvme_dir is set but "
                             "kvtier_nvme_bytes is not: give the NVMe tier's capacity in bytes")
        self.store = SharedStore(f"sglang{self.suffix}", block_bytes=self.page_bytes,
                                 host_bytes=int(x.get("kvtier_host_bytes") or (1 << 30)),
                                 nvme_dir=x.get("kvtier_nvme_dir"),
                                 nvme_bytes=int(x.get("kvtier_nvme_bytes") or 0),
                                 persist=bool(x.get("kvtier_persist", False)),
                                 evict_policy=x.get("kvtier_evict_policy", "default"),
                                 tenant=self.tenant, **self._remote,
                                 **dict(x.get("kvtier_engine_opts") or {}))
        if zc is not None:
            self.zero_copy = True
            self.pool = self.store.register(zc[0], zc[1])
            self.pool_blocks = zc[0]
            return
        self.staging = np.zeros((self.n_staging, self.page_bytes), dtype=np.uint8)
        self.pool = self.store.register(self.n_staging, [kvtier.ext_layer(
            self.staging.ctypes.data, self.page_bytes, self.page_bytes)])

    def _ready(self, nbytes=None):
        if self.store is None:
            if nbytes is None:
                raise ValueError("KvtierHiCacheStorage: kvtier_page_bytes is not set and no "
                                 "host pool is registered")
            self.page_bytes = int(nbytes)
            self._open()
        if nbytes is not None and nbytes != self.page_bytes:
            raise ValueError(f"KvtierHiCacheStorage: a page of {nbytes} bytes, the store "
                             f"holds pages of {self.page_bytes}")

    def register_mem_pool_host(self, mem_pool_host):
        if self.zero_copy and mem_pool_host is not self.mem_pool_host:
            # kvtier's pool is the first host pool's kv_buffer: another pool's pages would be
            # read and written there
            raise ValueError("KvtierHiCacheStorage: a host pool is already registered as "
                             "kvtier's pool (zero-copy); a backend serves one host pool")
        super().register_mem_pool_host(mem_pool_host)
        if self.store is None:
            page = mem_pool_host.get_dummy_flat_data_page()
            nbytes = page.numel() * page.element_size()
            zc = host_pool_geometry(mem_pool_host) if self._want_zc else None
            if zc is not None and zc[2] == nbytes:
                if self.page_bytes and self.page_bytes != nbytes:
                    raise ValueError(f"KvtierHiCacheStorage: kvtier_page_bytes "
                                     f"{self.page_bytes}, the host pool's pages hold {nbytes}")
                self.page_bytes = nbytes
                self.suffix += f"_zc_{mem_pool_host.layout}"
                self._open(zc[:2])
            else:
                self._ready(nbytes)

    def _h(self, key):
        return hash64(key + self.suffix)

    @staticmethod
    def _bytes_view(t):
        t = t.contiguous() if not t.is_contiguous() else t
        return t.view(torch.uint8).reshape(-1).numpy()

    # -- kvtier jobs through the staging pages ----------------------------------------------
    def _run(self, fn, hashes, ids):
        job = fn(hashes, ids, tenant=self.tenant)
        while not self.pool.wait(job, 10000):
            pass
        done = {}
        while job not in done:
            for j in self.pool.poll():
                done[j.job] = j
        j = done[job]
        failed = set(j.failed_block_ids)
        return [i not in failed for i in ids]

    def _store_pages(self, keys, pages):
        """pages: uint8 arrays of page_bytes. Returns a success flag per key."""
        out = []
        for s in range(0, len(keys), self.n_staging):
            ks, ps = keys[s:s + self.n_staging], pages[s:s + self.n_staging]
            for i, p in enumerate(ps):
                self.staging[i] = p
            out += self._run(self.pool.store, [self._h(k) for k in ks], list(range(len(ks))))
        return out

    def _load_pages(self, keys, sink):
        """Loads @keys; sink(i, uint8 page) for each loaded one. Returns success flags."""
        out = []
        for s in range(0, len(keys), self.n_staging):
            ks = keys[s:s + self.n_staging]
            ok = self._run(self.pool.load, [self._h(k) for k in ks], list(range(len(ks))))
            for i, good in enumerate(ok):
                if good:
                    sink(s + i, self.staging[i])
            out += ok
        return out

    # -- HiCacheStorage ------------------------------------------------------------------
    def exists(self, key):
        if self.store is None:
            return False
        with self._lock:
            return self.pool.lookup([self._h(key)], tenant=self.tenant) == 1

    def batch_exists(self, keys, extra_info=None):
        """The number of leading keys that are stored (kvt_ext_lookup's leading run). With a
        REMOTE tier, a run that ends early asks REMOTE for the keys after it (one pipelined
        get) and waits, at most kvtier_remote_wait_ms, for those on their way (SGLang calls
        this from its prefetch thread, then loads the pages it counted)."""
        if self.store is None or not keys:
            return 0
        hs = [self._h(k) for k in keys]
        with self._lock:
            hits = self.pool.lookup(hs, tenant=self.tenant)
        if hits == len(hs) or not self.store.remote:
            return hits
        deadline = time.monotonic() + self.remote_wait_s
        while True:  # the engine's own lock only: stores and loads go on meanwhile
            hits, pending = self.pool.inflight(hs, tenant=self.tenant)
            if not pending or time.monotonic() >= deadline:
                return hits
            time.sleep(0.0005)

    def set(self, key, value=None, target_location=None, target_sizes=None):
        return self.batch_set([key], [value]) if value is not None else False

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        if self.zero_copy:
            return False  # the pool is the host pool: pages go through batch_set_v1
        if not keys:
            return True
        if values is None or len(values) != len(keys):
            return False
        pages = [self._bytes_view(v) for v in values]
        for p in pages:
            if p.size != pages[0].size:
                return False
        with self._lock:
            try:
                self._ready(pages[0].size)
            except ValueError:
                return False  # another page size than the store's
            return all(self._store_pages(list(keys), pages))

    def get(self, key, target_location=None, target_sizes=None):
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        if not keys:
            return []
        if target_locations is None or any(t is None for t in target_locations):
            raise ValueError("KvtierHiCacheStorage.batch_get: target tensors are required "
                             "(the page is loaded into them)")
        out = [None] * len(keys)
        with self._lock:
            if self.store is None or self.zero_copy:
                return out
            self._ready(target_locations[0].numel() * target_locations[0].element_size())
            views = [self._bytes_view(t) for t in target_locations]

            def sink(i, page):
                views[i][:] = page
                out[i] = target_locations[i]
            self._load_pages(list(keys), sink)
        return out

    # zero-copy interface: pages addressed by host-pool indices
    def _zc_job(self, fn, keys, host_indices):
        """A zero-copy store or load (@fn: self.pool.store or .load) of @keys at host pages
        @host_indices (page_size indices
        per key, the page's first one page-aligned). Keys whose index is out of the pool or not
        page-aligned, and repeats (a hash or a page already in the call), answer False."""
        ps = self.mem_pool_host.page_size
        hi = host_indices.tolist() if hasattr(host_indices, "tolist") else list(host_indices)
        n_pages = self.pool_blocks
        out = [False] * len(keys)
        pos, hashes, ids, seen_h, seen_b = [], [], [], set(), set()
        for i, k in enumerate(keys):
            first = int(hi[i * ps])
            h, b = self._h(k), first // ps
            if first % ps or not 0 <= b < n_pages or h in seen_h or b in seen_b:
                continue
            seen_h.add(h)
            seen_b.add(b)
            pos.append(i)
            hashes.append(h)
            ids.append(b)
        with self._lock:
            try:
                for s in range(0, len(pos), 4096):
                    ok = self._run(fn, hashes[s:s + 4096], ids[s:s + 4096])
                    for j, good in enumerate(ok):
                        out[pos[s + j]] = good
            except kvtier.KvtierError:
                pass  # the rest stay False: SGLang recomputes / retries those pages
        return out

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        hp = self.mem_pool_host
        ps = getattr(hp, "page_size", 1) or 1
        if len(host_indices) != len(keys) * ps:
            return [False] * len(keys)
        if self.zero_copy:
            return self._zc_job(self.pool.store, keys, host_indices)
        pages = [self._bytes_view(hp.get_data_page(int(host_indices[i * ps]), flat=True))
                 for i in range(len(keys))]
        with self._lock:
            try:
                self._ready(pages[0].size if pages else None)
            except ValueError:
                return [False] * len(keys)  # another page size than the store's
            return self._store_pages(list(keys), pages)

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        hp = self.mem_pool_host
        ps = getattr(hp, "page_size", 1) or 1
        if len(host_indices) != len(keys) * ps:
            return [False] * len(keys)
        if self.zero_copy:
            return self._zc_job(self.pool.load, keys, host_indices)
        with self._lock:
            if self.store is None:
                return [False] * len(keys)
            dummy = hp.get_dummy_flat_data_page()
            dv = self._bytes_view(dummy)

            def sink(i, page):
                dv[:] = page
                hp.set_from_flat_data_page(int(host_indices[i * ps]), dummy)
            return self._load_pages(list(keys), sink)

    def clear(self):
        """kvt_ext_clear of this backend's tenant: every stored page goes (REMOTE keeps what
        was written there). True, or False before the store is open."""
        if self.store is None:
            return False
        with self._lock:
            self.pool.clear(self.tenant)
        return True

    def get_stats(self):
        return None if self.store is None else self.pool.stats()

    def close(self):
        with self._lock:
            if self.store is not None:
                self.store.close()
                self.store = None


def host_pool_geometry(hp):
    """(n_blocks, ext_layer list, page bytes) describing SGLang host pool @hp's kv_buffer as a
    kvtier external pool (one block per page), or None where it cannot be: not one contiguous
    CPU tensor of the MHA shape its layout gives (SGLang 0.5.23 MHATokenToKVPoolHost:
    layer_first [2, L, size, H, D], page_first [2, size, L, H, D], page_first_direct
    [2, size / page_size, L, page_size, H, D]; MLA pools and other layouts fall back)."""
    kv = getattr(hp, "kv_buffer", None)
    try:
        L, H, D = int(hp.layer_num), int(hp.head_num), int(hp.head_dim)
        size, ps, layout = int(hp.size), int(hp.page_size), hp.layout
    except (AttributeError, TypeError, ValueError):
        return None
    if not isinstance(kv, torch.Tensor) or kv.device.type != "cpu" or \
            not kv.is_contiguous() or ps < 1 or size % ps or size == 0:
        return None
    shapes = {"layer_first": (2, L, size, H, D), "page_first": (2, size, L, H, D),
              "page_first_direct": (2, size // ps, L, ps, H, D)}
    if tuple(kv.shape) != shapes.get(layout):
        return None
    tok = H * D * kv.element_size()
    half = L * size * tok  # bytes of all K (the V half follows)
    base, page = kv.data_ptr(), ps * tok
    if layout == "layer_first":  # K of page i, layer l: base + l * size * tok + i * page
        layers = [kvtier.ext_layer(base, page, page, page, v_offset=half, n_layers=L,
                                   layer_stride=size * tok)]
    elif layout == "page_first":  # page i: its ps tokens x L layers, contiguous
        layers = [kvtier.ext_layer(base, L * page, L * page, L * page, v_offset=half)]
    else:  # page_first_direct: page i, layer l at base + (i * L + l) * page
        layers = [kvtier.ext_layer(base, L * page, page, page, v_offset=half, n_layers=L,
                                   layer_stride=page)]
    return size // ps, layers, 2 * L * page
