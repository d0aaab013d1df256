# SPDX-License-Identifier: MIT
"""kvtier's SGLang HiCacheStorage backend, loaded as SGLang 0.5.23 loads an out-of-tree
backend (StorageBackendFactory "dynamic"), on CPU: get/set/exists, the batch variants,
batch_exists's leading run, the zero-copy (host-index) variants, a restart of the store."""
import pytest

pytest.importorskip("sglang")

import torch  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

from kvtier.sglang.backend import KvtierHiCacheStorage  # noqa: E402

PAGE_TOKENS, PAGE_ELEMS = 4, 4 * 64  # a page: 4 tokens of 64 float16 K/V elements
PAGE_BYTES = PAGE_ELEMS * 2


def make(tmp_path=None, persist=False, **extra):
    x = {"backend_name": "kvtier", "module_path": "kvtier.sglang.backend",
         "class_name": "KvtierHiCacheStorage", "kvtier_page_bytes": PAGE_BYTES,
         "kvtier_host_bytes": 64 * PAGE_BYTES, "kvtier_staging_pages": 8}
    if tmp_path is not None:
        x.update(kvtier_nvme_dir=str(tmp_path), kvtier_nvme_bytes=1 << 24,
                 kvtier_persist=persist)
    x.update(extra)
    cfg = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                               attn_cp_size=1, is_mla_model=False,
                               enable_storage_metrics=False, is_page_first_layout=True,
                               model_name="org/model", extra_config=x)
    b = StorageBackendFactory.create_backend("dynamic", cfg, None)
    while not isinstance(b, KvtierHiCacheStorage) and hasattr(b, "_inner"):
        b = b._inner
    return b


def page(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(PAGE_ELEMS, generator=g).to(torch.float16)


@pytest.fixture
def backend():
    b = make()
    yield b
    b.close()


def test_loaded_by_dynamic_factory(backend):
    assert isinstance(backend, KvtierHiCacheStorage)


def test_set_get_exists(backend):
    assert not backend.exists("k0")
    v = page(1)
    assert backend.set("k0", v)
    assert backend.exists("k0")
    out = torch.zeros(PAGE_ELEMS, dtype=torch.float16)
    assert backend.get("k0", out) is out
    assert torch.equal(out, v)
    assert backend.get("missing", torch.zeros(PAGE_ELEMS, dtype=torch.float16)) is None


def test_batch_set_get_more_than_staging(backend):
    keys = [f"b{i}" for i in range(20)]  # 20 pages through 8 staging pages
    vals = [page(100 + i) for i in range(20)]
    assert backend.batch_set(keys, vals)
    outs = [torch.zeros(PAGE_ELEMS, dtype=torch.float16) for _ in keys]
    got = backend.batch_get(keys[:10] + ["nope"] + keys[10:], outs[:10] + [
        torch.zeros(PAGE_ELEMS, dtype=torch.float16)] + outs[10:])
    assert got[10] is None
    assert all(torch.equal(o, v) for o, v in zip(outs, vals))


def test_batch_exists_counts_leading_run(backend):
    for k in ("p0", "p1", "p3"):
        assert backend.set(k, page(hash(k) & 0xffff))
    assert backend.batch_exists(["p0", "p1", "p2", "p3"]) == 2
    assert backend.batch_exists(["p2", "p0"]) == 0
    assert backend.batch_exists(["p0", "p1"]) == 2
    assert backend.batch_exists([]) == 0


def test_wrong_page_size_refused(backend):
    assert not backend.set("w", torch.zeros(PAGE_ELEMS + 1, dtype=torch.float16))
    assert not backend.exists("w")


class FakeHostPool:
    """The accessors of SGLang's HostKVCache that the v1 calls use, on a CPU tensor of
    pages (page_first: a page's bytes are contiguous)."""

    def __init__(self, n_pages):
        self.page_size = PAGE_TOKENS
        self.kv = torch.zeros(n_pages, PAGE_ELEMS, dtype=torch.float16)

    def get_data_page(self, index, flat=True):
        return self.kv[index // self.page_size]

    def get_dummy_flat_data_page(self):
        return torch.zeros(PAGE_ELEMS, dtype=torch.float16)

    def set_from_flat_data_page(self, index, data_page):
        self.kv[index // self.page_size] = data_page


def test_zero_copy_v1_by_host_indices(backend):
    hp = FakeHostPool(16)
    backend.register_mem_pool_host(hp)
    for i in range(16):
        hp.kv[i] = page(300 + i)
    src = [2, 5, 9]
    keys = ["z2", "z5", "z9"]
    idx = torch.tensor([p * PAGE_TOKENS + t for p in src for t in range(PAGE_TOKENS)])
    assert backend.batch_set_v1(keys, idx) == [True, True, True]
    want = hp.kv[src].clone()
    dst = [11, 12, 13]
    hp.kv[dst] = 0
    idx2 = torch.tensor([p * PAGE_TOKENS + t for p in dst for t in range(PAGE_TOKENS)])
    assert backend.batch_get_v1(keys + [], idx2) == [True, True, True]
    assert torch.equal(hp.kv[dst], want)
    assert backend.batch_get_v1(["z2", "nope"], idx2[:2 * PAGE_TOKENS]) == [True, False]


def test_restart_with_persistent_store(tmp_path):
    b = make(tmp_path, persist=True)
    vals = {f"r{i}": page(500 + i) for i in range(6)}
    assert b.batch_set(list(vals), list(vals.values()))
    b.close()
    b2 = make(tmp_path, persist=True)
    try:
        assert b2.batch_exists(list(vals)) == 6
        for k, v in vals.items():
            out = torch.zeros(PAGE_ELEMS, dtype=torch.float16)
            assert b2.get(k, out) is out and torch.equal(out, v)
    finally:
        b2.close()
