# SPDX-License-Identifier: MIT
"""KvtierHiCacheStorage: an SGLang HiCacheStorage on kvtier's HOST / NVMe store (sglang
0.5.23), loaded by StorageBackendFactory's "dynamic" backend (extra_config backend_name,
module_path "kvtier.sglang.backend", class_name "KvtierHiCacheStorage").

Pages are stored as kvtier external-pool blocks keyed by 64-bit hashes of SGLang's page keys
(kvtier._store.hash64 of the key + this rank's suffix): eviction policy, checksums on every
NVMe read (a page that fails it is a miss, never wrong bytes), persistent store, metrics.
The pool kvtier copies from and to is a staging buffer of kvtier_staging_pages pages owned by
this object: set() copies the value in and stores it, get() loads into staging and copies
out; batch_get_v1 / batch_set_v1 (SGLang's zero-copy interface, by host-pool indices) move
pages between the registered host pool and staging with the host pool's own page accessors
(get_data_page / set_from_flat_data_page). So every byte is copied once more than a true
zero-copy path (registering the host pool itself as the pool) would: the next step.

extra_config keys: kvtier_page_bytes (bytes of one page, required unless a host pool is
registered before the first call: then its page size), kvtier_host_bytes (default 1 GiB),
kvtier_nvme_dir, kvtier_nvme_bytes, kvtier_persist, kvtier_evict_policy,
kvtier_staging_pages (default 64), kvtier_tenant.
Thread safety: SGLang calls a backend from its prefetch and backup threads; one lock
serialises this object's staging buffer.
"""

import ctypes
import threading

import numpy as np
import torch

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

import kvtier
from kvtier._store import SharedStore, hash64


class KvtierHiCacheStorage(HiCacheStorage):
    def __init__(self, storage_config, kwargs=None):
        self.config = storage_config
        self.extra = dict(storage_config.extra_config or {})
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
        self._lock = threading.Lock()
        if self.page_bytes:
            self._open()

    # -- setup ---------------------------------------------------------------------------
    def _open(self):
        x = self.extra
        self.store = SharedStore(f"sglang{self.suffix}", block_bytes=self.page_bytes,
                                 host_bytes=int(x.get("kvtier_host_bytes") or (1 << 30)),
                                 nvme_dir=x.get("kvtier_nvme_dir"),
                                 nvme_bytes=int(x.get("kvtier_nvme_bytes") or 0),
                                 persist=bool(x.get("kvtier_persist", False)),
                                 evict_policy=x.get("kvtier_evict_policy", "default"),
                                 tenant=self.tenant)
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
        super().register_mem_pool_host(mem_pool_host)
        if self.store is None:
            page = mem_pool_host.get_dummy_flat_data_page()
            self._ready(page.numel() * page.element_size())

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
        """The number of leading keys that are stored (kvt_ext_lookup's leading run)."""
        if self.store is None or not keys:
            return 0
        with self._lock:
            return self.pool.lookup([self._h(k) for k in keys], tenant=self.tenant)

    def set(self, key, value=None, target_location=None, target_sizes=None):
        return self.batch_set([key], [value]) if value is not None else False

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
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
            if self.store is None:
                return out
            self._ready(target_locations[0].numel() * target_locations[0].element_size())
            views = [self._bytes_view(t) for t in target_locations]

            def sink(i, page):
                views[i][:] = page
                out[i] = target_locations[i]
            self._load_pages(list(keys), sink)
        return out

    # zero-copy interface: pages addressed by host-pool indices
    def batch_set_v1(self, keys, host_indices, extra_info=None):
        hp = self.mem_pool_host
        ps = getattr(hp, "page_size", 1) or 1
        if len(host_indices) != len(keys) * ps:
            return [False] * len(keys)
        pages = [self._bytes_view(hp.get_data_page(int(host_indices[i * ps]), flat=True))
                 for i in range(len(keys))]
        with self._lock:
            self._ready(pages[0].size if pages else None)
            return self._store_pages(list(keys), pages)

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        hp = self.mem_pool_host
        ps = getattr(hp, "page_size", 1) or 1
        if len(host_indices) != len(keys) * ps:
            return [False] * len(keys)
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
        """Not supported by kvtier's store yet (no "drop all"): False."""
        return False

    def get_stats(self):
        return None if self.store is None else self.pool.stats()

    def close(self):
        with self._lock:
            if self.store is not None:
                self.store.close()
                self.store = None
