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
