# SPDX-License-Identifier: MIT
"""The external-pool binding (kvtier.ExternalPool, kvt_ext_*): a vLLM-like per-layer pool
[2, num_blocks, page] in numpy memory (the emulated device reads host memory) registered by
its integer addresses; store, lookup, load into other block ids, poll, touch, drop, errors."""
import errno

import pytest

import kvtier

np = pytest.importorskip("numpy")

LAYERS, PAGE, NB = 2, 256, 16  # the conftest engine: 2 layers, K and V of 256 bytes a block


def make_pool(engine, n_blocks=NB):
    mem = [np.zeros((2, n_blocks, PAGE), dtype=np.uint8) for _ in range(LAYERS)]
    layers = [kvtier.ext_layer(m.ctypes.data, PAGE, PAGE, PAGE, v_offset=n_blocks * PAGE)
              for m in mem]
    return kvtier.ExternalPool(engine, n_blocks, layers), mem


def fill(mem, blk, tag):
    for l, m in enumerate(mem):
        m[0, blk] = (np.arange(PAGE) * 3 + tag * 7 + l) % 251
        m[1, blk] = (np.arange(PAGE) * 5 + tag * 11 + l) % 253


def same(mem, a, b):
    return all((m[:, a] == m[:, b]).all() for m in mem)


def finish(pool, job):
    assert pool.wait(job, 60000)
    for j in pool.poll():
        if j.job == job:
            return j
    raise AssertionError(f"job {job} not reported")


def test_roundtrip_lookup_poll(engine):
    pool, mem = make_pool(engine)
    with pool:
        for i in range(4):
            fill(mem, i, i + 1)
        hashes = [hash(("p", i)) for i in range(4)]  # negative ints are fine (mod 2**64)
        j = finish(pool, pool.store(hashes, [0, 1, 2, 3]))
        assert j.ok and j.kind == "store" and j.n_blocks == 4 and j.failed == []
        assert pool.lookup(hashes + [12345]) == 4
        assert pool.lookup(hashes, tenant=1) == 0
        assert pool.lookup(hashes[1:]) == 3
        n, tier = pool.lookup(hashes, with_tier=True)
        assert (n, tier) == (4, kvtier.TIER_HOST)
        job = pool.load(hashes[:2] + [999], [9, 8, 7], layerwise=True)
        for layer in range(LAYERS):
            pool.wait_layer(job, layer)
        j = finish(pool, job)
        assert j.kind == "load" and j.failed_block_ids == [7]
        assert j.failed[0][1] == -errno.ENOENT and not j.ok
        assert same(mem, 0, 9) and same(mem, 1, 8)
        assert finish(pool, pool.store(hashes[:1], [5])).n_skipped == 1
        assert pool.touch(hashes) == 4
        assert pool.drop(hashes[2:3]) == 1
        assert pool.lookup(hashes) == 2
        st = pool.stats()
        assert st["blocks_stored"] == 4 and st["blocks_loaded"] == 2
        assert st["stored_blocks"] == 3


def test_cross_layer_numpy_hashes(engine):
    mem = np.arange(NB * LAYERS * 2 * PAGE, dtype=np.uint32).astype(np.uint8).reshape(
        NB, LAYERS, 2, PAGE)
    lay = kvtier.ext_layer(mem.ctypes.data, LAYERS * 2 * PAGE, PAGE, PAGE, v_offset=PAGE,
                           n_layers=LAYERS, layer_stride=2 * PAGE)
    with kvtier.ExternalPool(engine, NB, [lay]) as pool:
        hashes = np.array([3, 1, 4], dtype=np.uint64)
        assert finish(pool, pool.store(hashes, [0, 1, 2])).ok
        assert finish(pool, pool.load(hashes, [10, 11, 12])).ok
        assert (mem[10:13] == mem[0:3]).all()


def test_errors(engine):
    m = np.zeros((2, NB, PAGE), dtype=np.uint8)
    bad = kvtier.ext_layer(m.ctypes.data, 0, PAGE, PAGE, v_offset=NB * PAGE)
    with pytest.raises(kvtier.InvalidArgumentError, match="block_stride is 0"):
        kvtier.ExternalPool(engine, NB, [bad])
    over = kvtier.ext_layer(m.ctypes.data, PAGE, PAGE, PAGE, v_offset=PAGE)
    with pytest.raises(kvtier.InvalidArgumentError, match="overlap"):
        kvtier.ExternalPool(engine, NB, [over, over])
    pool, mem = make_pool(engine)
    with pytest.raises(kvtier.KvtierError) as ei:
        make_pool(engine)
    assert ei.value.code == -errno.EEXIST
    with pytest.raises(kvtier.InvalidArgumentError, match="block_ids"):
        pool.store([1], [NB])
    with pytest.raises(kvtier.InvalidArgumentError):
        pool.store([1, 2], [0])
    pool.close()
    with pytest.raises(kvtier.ClosedError):
        pool.lookup([1])
    pool.close()  # idempotent


def test_hold_release_clear(engine):
    """Pool.hold / release (the leading stored run, counted per block) and Pool.clear."""
    pool, mem = make_pool(engine)
    with pool:
        for i in range(3):
            fill(mem, i, i + 1)
        hs = [11, 12, 13]
        assert finish(pool, pool.store(hs, [0, 1, 2])).ok
        assert pool.hold([11, 12, 99, 13]) == 2  # stops at 99: 11 and 12 held
        assert pool.drop([11]) == 1
        assert pool.lookup(hs) == 0              # dropped: not found at once
        assert pool.release([11, 12]) == 2       # then freed
        assert pool.release([11, 12]) == 0
        assert finish(pool, pool.store([21], [0], tenant=1)).ok
        assert pool.clear(tenant=0) == 2         # 12, 13
        assert pool.lookup([21], tenant=1) == 1
        assert pool.clear() == 1                 # every tenant
        assert pool.stats()["stored_blocks"] == 0
