# SPDX-License-Identifier: MIT
"""ExternalPool over a REMOTE tier (kvtier.h "External-pool mode", REMOTE), through the Python
binding, against a real redis-server the test starts: two engines (two servers of a fleet)
share stored blocks; Pool.inflight tells a block on its way; a value corrupted in redis is a
miss, never wrong bytes; string and enum options reach the C engine."""
import time

import numpy as np
import pytest

import kvtier
from redis_proc import redis_server  # noqa: F401 (fixture)

NB, PAGE = 16, 512


def _engine(port, write="all", **kw):
    return kvtier.Engine(n_layers=2, n_kv_heads=2, head_dim=16, dtype="f32",
                         tokens_per_block=4, hbm_bytes=1 << 12, host_bytes=32 * 1024,
                         remote_host="127.0.0.1", remote_port=port,
                         remote_model_id="py-test@1", remote_write=write,
                         remote_op_timeout_ms=300, **kw)


def _pool(e):
    mem = np.zeros((NB, PAGE), dtype=np.uint8)
    return mem, kvtier.ExternalPool(e, NB, [kvtier.ext_layer(mem.ctypes.data, PAGE, PAGE)])


def _finish(pool, job):
    assert pool.wait(job, 10000)
    for j in pool.poll():
        if j.job == job:
            return j
    raise AssertionError("job not reported")


def _wait_fetch(pool, hashes, timeout=10.0):
    """Pool.inflight until nothing is on its way; returns the hits."""
    deadline = time.monotonic() + timeout
    while True:
        hits, pending = pool.inflight(hashes)
        if not pending or time.monotonic() > deadline:
            return hits
        time.sleep(0.002)


def test_two_servers_share_blocks(redis_server):  # noqa: F811
    a, b = _engine(redis_server.port), _engine(redis_server.port, write="none")
    ma, pa = _pool(a)
    mb, pb = _pool(b)
    rng = np.random.default_rng(7)
    ma[:4] = rng.integers(0, 256, size=(4, PAGE), dtype=np.uint8)
    hashes = [0x1000 + i for i in range(4)]
    assert _finish(pa, pa.store(hashes, [0, 1, 2, 3])).failed == []
    a.drain()
    assert int(redis_server.command("DBSIZE")) == 4
    assert pb.lookup(hashes) == 0          # a local miss: REMOTE asked
    assert _wait_fetch(pb, hashes) == 4
    assert pb.lookup(hashes, with_tier=True) == (4, kvtier.TIER_HOST)
    st = pb.stats()
    assert st["remote_fetch_blocks"] == 4 and st["remote_hit_blocks"] == 4
    assert _finish(pb, pb.load(hashes, [8, 9, 10, 11])).failed == []
    assert np.array_equal(mb[8:12], ma[:4])
    b.drain()
    assert int(redis_server.command("DBSIZE")) == 4  # B writes nothing (remote_write none)
    a.close()
    b.close()


def test_corrupt_value_is_a_miss(redis_server):  # noqa: F811
    a, b = _engine(redis_server.port), _engine(redis_server.port, write="none")
    ma, pa = _pool(a)
    mb, pb = _pool(b)
    ma[0] = 42
    assert _finish(pa, pa.store([7], [0])).failed == []
    a.drain()
    key = redis_server.command("KEYS", "kvt1:*")
    redis_server.command("SETRANGE", key, 200, "garbage")
    assert pb.lookup([7]) == 0
    assert _wait_fetch(pb, [7]) == 0
    assert b.stats()["remote_bad_values"] == 1
    with pytest.raises(kvtier.KvtierError, match="remote_write"):
        _engine(redis_server.port, write="sometimes")
    a.close()
    b.close()
