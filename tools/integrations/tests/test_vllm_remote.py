# SPDX-License-Identifier: MIT
"""Two vLLM servers (vLLM 0.33.0's real Scheduler, vllm_harness) sharing KV through kvtier's
REMOTE tier on a real redis-server the test starts: server A computes a prompt, its stored
blocks are written through; server B, which never saw the prompt, gets a prefix hit of every
full block from REMOTE (the first lookups RETRY while the fetch is in flight, then HIT), loads
them byte-exact (the checking model reads every K/V) and produces the same tokens as a server
that computed everything. A corrupted value is recomputed, never read."""
import random

import pytest

pytest.importorskip("vllm")

import vllm_harness as vh  # noqa: E402
from kvtier._store import close_store, find_store  # noqa: E402
from redis_proc import redis_server  # noqa: E402,F401 (fixture)

BS = 16


def prompt(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(10, 50000) for _ in range(n)]


@pytest.fixture
def engines():
    made = []

    def make(mode, **kw):
        e = vh.Engine(mode, **kw)
        made.append(e)
        return e
    yield make
    for e in made:
        e.shutdown()
        ktc = e.vc.kv_transfer_config
        close_store(ktc.kv_connector_extra_config.get("kvtier_store_name")
                    or ktc.engine_id)


def _remote(port, name):
    return dict(kvtier_store_name=name, kvtier_remote_host="127.0.0.1",
                kvtier_remote_port=port, kvtier_remote_model_id="harness@1",
                kvtier_remote_write="all")


def _manager(e):
    return e.scheduler.connector.connector_scheduler.manager


@pytest.mark.parametrize("mode", ["kvtier-spec", "kvtier-connector"])
def test_second_server_hits_remote(engines, redis_server, mode):  # noqa: F811
    a = engines(mode, **_remote(redis_server.port, f"A-{mode}"))
    p = prompt(11, 6 * BS + 5)
    a.add("a", p)
    a.run()
    a.settle()
    find_store(f"A-{mode}").engine.drain()  # the write-through puts are done
    assert int(redis_server.command("DBSIZE")) >= 6
    b = engines(mode, **_remote(redis_server.port, f"B-{mode}"))
    b.add("b", p[:6 * BS] + prompt(12, 9))
    b.run()
    assert b.hits["b"] == 6 * BS
    assert b.computed["b"] == 9 + 3
    assert b.bad_reads == []
    assert _manager(b).remote_fetches >= 1
    st = find_store(f"B-{mode}").pool.stats()
    assert st["remote_hit_blocks"] >= 6
    ref = engines("cpu")
    ref.add("b", p[:6 * BS] + prompt(12, 9))
    ref.run()
    assert b.outputs["b"] == ref.outputs["b"]


def test_corrupt_remote_value_is_recomputed(engines, redis_server):  # noqa: F811
    a = engines("kvtier-spec", **_remote(redis_server.port, "A-bad"))
    p = prompt(21, 4 * BS)
    a.add("a", p)
    a.run()
    a.settle()
    find_store("A-bad").engine.drain()
    n = redis_server.command("EVAL", "local k = redis.call('KEYS', 'kvt1:*') for _, x in "
                             "ipairs(k) do redis.call('SETRANGE', x, 300, 'garbage') end "
                             "return #k", 0)
    assert int(n) >= 4
    b = engines("kvtier-spec", **_remote(redis_server.port, "B-bad"))
    b.add("b", p + prompt(22, 5))
    b.run()
    assert b.hits["b"] == 0
    assert b.bad_reads == []
    assert find_store("B-bad").engine.stats()["remote_bad_values"] >= 1
    ref = engines("cpu")
    ref.add("b", p + prompt(22, 5))
    ref.run()
    assert b.outputs["b"] == ref.outputs["b"]


def test_hybrid_model_shares_through_remote(redis_server):  # noqa: F811
    """A full and a sliding-window KV cache group (one kvtier engine each), kvtier_remote_write
    left at its adapter default ("all"): server B gets both groups' blocks from REMOTE."""
    made = []
    try:
        opts = dict(kvtier_remote_host="127.0.0.1", kvtier_remote_port=redis_server.port,
                    kvtier_remote_model_id="harness@1")
        a = vh.Engine("kvtier-spec", swa=24, kvtier_store_name="HA", **opts)
        made.append(a)
        p = prompt(41, 6 * BS + 5)
        a.add("a", p)
        a.run()
        a.settle()
        for g in (0, 1):
            find_store(f"HA#g{g}").engine.drain()
        assert int(redis_server.command("DBSIZE")) >= 6 + 2
        b = vh.Engine("kvtier-spec", swa=24, kvtier_store_name="HB", **opts)
        made.append(b)
        b.add("b", p[:6 * BS] + prompt(42, 9))
        b.run()
        assert b.bad_reads == []
        assert b.hits["b"] == 6 * BS
        assert find_store("HB#g0").pool.stats()["remote_hit_blocks"] >= 6
        assert find_store("HB#g1").pool.stats()["remote_hit_blocks"] >= 1
        ref = vh.Engine("cpu", swa=24)
        made.append(ref)
        ref.add("b", p[:6 * BS] + prompt(42, 9))
        ref.run()
        assert b.outputs["b"] == ref.outputs["b"]
    finally:
        for e in made:
            e.shutdown()
        for n in ("HA", "HB"):
            close_store(n)


@pytest.mark.parametrize("extra,msg", [
    ({"kvtier_host_byte": 123}, "did you mean 'kvtier_host_bytes'"),
    ({"kvtier_remote_host": "127.0.0.1"}, "kvtier_remote_model_id is not"),
    ({"kvtier_remote_host": "127.0.0.1", "kvtier_remote_modelid": "x"},
     "did you mean 'kvtier_remote_model_id'"),
    ({"kvtier_remote_host": "127.0.0.1", "kvtier_remote_model_id": "m",
      "kvtier_remote_write": "twice"}, "kvtier_remote_write 'twice'"),
    ({"kvtier_nvme_dir": "/tmp"}, "kvtier_nvme_bytes is not"),
])
def test_bad_keys_named_at_start(extra, msg):
    with pytest.raises(ValueError, match=msg.replace("(", r"\(")):
        e = vh.Engine("kvtier-spec", kvtier_store_name="badkeys", **extra)
        e.shutdown()
    close_store("badkeys")
