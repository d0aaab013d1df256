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
from redis_proc import redis_server  # noqa: E402,F401 (fixture)

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


# -- zero-copy on SGLang's own host pool ------------------------------------------------------
ZL, ZH, ZD, ZN = 3, 2, 16, 64  # layers, KV heads, head_dim, device tokens


def real_host_pool(layout):
    """SGLang 0.5.23's MHATokenToKVPoolHost (its own class, on CPU tensors), @layout."""
    from sglang_pool import mha_host_pool
    return mha_host_pool(ZL, ZH, ZD, PAGE_TOKENS, ZN, layout)


def zc_make(tmp_path=None, persist=False, **extra):
    x = {"interface_v1": 1, "kvtier_page_bytes": 0}
    x.update(extra)
    return make(tmp_path, persist, **x)


def host_idx(pages):
    return torch.tensor([p * PAGE_TOKENS + t for p in pages for t in range(PAGE_TOKENS)])


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
def test_zero_copy_real_host_pool(layout, tmp_path):
    hp = real_host_pool(layout)
    b = zc_make()
    try:
        b.register_mem_pool_host(hp)
        assert b.zero_copy and not hasattr(b, "staging")  # the host pool is kvtier's pool
        n = hp.size // PAGE_TOKENS
        src, dst = [1, 4, 7, 8, 30], [2, 3, 20, 21, 29]
        want = [hp.get_data_page(p * PAGE_TOKENS).clone() for p in src]
        keys = [f"zc{p}" for p in src]
        assert b.batch_set_v1(keys, host_idx(src)) == [True] * 5
        assert b.batch_exists(keys) == 5
        for p in dst:  # SGLang's own accessor writes the destination pages
            hp.set_from_flat_data_page(p * PAGE_TOKENS, torch.zeros_like(want[0]))
        assert b.batch_get_v1(keys, host_idx(dst)) == [True] * 5
        for w, p in zip(want, dst):
            assert torch.equal(hp.get_data_page(p * PAGE_TOKENS), w), (layout, p)
        # the pages around them untouched: a K/V segment landed nowhere else
        for p in range(n):
            if p not in dst and p not in src:
                assert not torch.equal(hp.get_data_page(p * PAGE_TOKENS),
                                       torch.zeros_like(want[0]))
        # bad indices answer False, the rest of the call is served
        bad = torch.cat([host_idx([n])[:PAGE_TOKENS], host_idx([5]) + 1, host_idx([6])])
        assert b.batch_get_v1(["zc1", "zc4", "zc7"], bad) == [False, False, True]
        assert b.batch_get_v1(["zc1", "nope"], host_idx([10, 11])) == [True, False]
        assert b.batch_set_v1(["dup", "dup"], host_idx([12, 13])) == [True, False]
        # the flat-page calls are not the mode's: refused, not wrong
        assert not b.set("flat", torch.zeros(want[0].numel(), dtype=torch.float16))
        assert b.get("zc1", torch.zeros(want[0].numel(), dtype=torch.float16)) is None
    finally:
        b.close()


def test_zero_copy_restart_and_modes_apart(tmp_path):
    hp = real_host_pool("layer_first")
    want = [hp.get_data_page(p * PAGE_TOKENS).clone() for p in (0, 1, 2)]
    b = zc_make(tmp_path, persist=True)
    b.register_mem_pool_host(hp)
    assert b.batch_set_v1(["r0", "r1", "r2"], host_idx([0, 1, 2])) == [True] * 3
    b.close()
    # a staging-mode backend (no interface_v1) on the same store directory: other keys
    s = make(tmp_path, persist=True, kvtier_page_bytes=0)
    s.register_mem_pool_host(hp)
    assert not s.zero_copy and s.batch_exists(["r0", "r1", "r2"]) == 0
    s.close()
    # a new zero-copy process: hits, byte-exact, into other pages
    hp2 = real_host_pool("layer_first")
    b2 = zc_make(tmp_path, persist=True)
    try:
        b2.register_mem_pool_host(hp2)
        assert b2.batch_exists(["r0", "r1", "r2"]) == 3
        assert b2.batch_get_v1(["r0", "r1", "r2"], host_idx([9, 10, 11])) == [True] * 3
        for w, p in zip(want, (9, 10, 11)):
            assert torch.equal(hp2.get_data_page(p * PAGE_TOKENS), w)
    finally:
        b2.close()


def test_zero_copy_other_pool_falls_back_to_staging():
    b = zc_make(kvtier_page_bytes=PAGE_BYTES)
    try:
        hp = FakeHostPool(16)  # no kv_buffer of an MHA layout: staged, still correct
        b.register_mem_pool_host(hp)
        assert not b.zero_copy
        hp.kv[3] = page(900)
        assert b.batch_set_v1(["f3"], host_idx([3])) == [True]
        assert b.batch_get_v1(["f3"], host_idx([4])) == [True]
        assert torch.equal(hp.kv[4], page(900))
    finally:
        b.close()


def test_zero_copy_one_host_pool_and_page_size_checked():
    """Zero-copy serves the host pool it registered: another one is refused (its pages would
    be read from the first); a kvtier_page_bytes other than the pool's page is refused at
    attach; a staged backend answers False (not an exception into SGLang's thread) for pages
    of another size than its store's."""
    hp = real_host_pool("layer_first")
    b = zc_make()
    try:
        b.register_mem_pool_host(hp)
        b.register_mem_pool_host(hp)  # the same pool again: fine
        with pytest.raises(ValueError, match="already registered"):
            b.register_mem_pool_host(real_host_pool("layer_first"))
        assert b.batch_set_v1(["one"], host_idx([1])) == [True]
    finally:
        b.close()
    b = zc_make(kvtier_page_bytes=PAGE_BYTES)  # not the pool's page
    try:
        with pytest.raises(ValueError, match="kvtier_page_bytes"):
            b.register_mem_pool_host(hp)
    finally:
        b.close()
    s = make()  # staged, pages of PAGE_BYTES; the real pool's pages are larger
    try:
        s.register_mem_pool_host(hp)
        assert s.batch_set_v1(["big"], host_idx([1])) == [False]
    finally:
        s.close()


def test_nvme_dir_without_bytes_is_named(tmp_path):
    with pytest.raises(Exception, match="kvtier_nvme_bytes"):
        make(tmp_path, kvtier_nvme_bytes=0)


def _remote(port, **kw):
    return dict(kvtier_remote_host="127.0.0.1", kvtier_remote_port=port,
                kvtier_remote_model_id="org/model@1", **kw)


def test_remote_pages_shared_between_servers(redis_server):
    """Two SGLang servers on one REMOTE (a real redis-server): pages server A stores are
    found by server B's batch_exists (which waits for the fetch it started) and read
    byte-exact; a page corrupted in redis is a miss there, never wrong bytes."""
    a = make(**_remote(redis_server.port))  # kvtier_remote_write: "all" by default
    b = make(**_remote(redis_server.port, kvtier_remote_write="none"))
    try:
        keys = [f"page-{i}" for i in range(5)]
        vals = [page(100 + i) for i in range(5)]
        assert a.batch_set(keys, vals)
        a.store.engine.drain()
        assert int(redis_server.command("DBSIZE")) == 5
        assert b.batch_exists(keys) == 5
        outs = [torch.zeros(PAGE_ELEMS, dtype=torch.float16) for _ in keys]
        got = b.batch_get(keys, outs)
        assert all(g is not None for g in got)
        for o, v in zip(outs, vals):
            assert torch.equal(o, v)
        assert b.pool.stats()["remote_hit_blocks"] == 5
        # a page A stores, then corrupted in redis
        redis_server.command("FLUSHALL")
        assert a.set("page-bad2", page(8))
        a.store.engine.drain()
        key = redis_server.command("KEYS", "kvt1:*")
        redis_server.command("SETRANGE", key, 200, "garbage")
        assert b.batch_exists(["page-bad2"]) == 0
        assert b.store.engine.stats()["remote_bad_values"] == 1
        assert b.get("page-bad2", torch.zeros(PAGE_ELEMS, dtype=torch.float16)) is None
    finally:
        a.close()
        b.close()


def test_remote_needs_model_id():
    with pytest.raises(ValueError, match="kvtier_remote_model_id"):
        make(kvtier_remote_host="127.0.0.1")


def test_unknown_kvtier_key_refused():
    with pytest.raises(ValueError, match="did you mean 'kvtier_host_bytes'"):
        make(kvtier_host_byte=1 << 20)
    with pytest.raises(ValueError, match="kvtier_remote_write 'twice'"):
        make(kvtier_remote_host="127.0.0.1", kvtier_remote_model_id="m",
             kvtier_remote_write="twice")


def test_clear_drops_every_page(backend):
    keys = [f"c{i}" for i in range(5)]
    assert backend.batch_set(keys, [page(300 + i) for i in range(5)])
    assert backend.batch_exists(keys) == 5
    assert backend.clear() is True
    assert backend.batch_exists(keys) == 0
    assert backend.get("c0", torch.zeros(PAGE_ELEMS, dtype=torch.float16)) is None
