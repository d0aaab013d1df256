# SPDX-License-Identifier: MIT
"""Two vLLM servers (vLLM 0.33.0's real Scheduler, vllm_harness) sharing KV through kvtier's
REMOTE tier on a real redis-server the test starts: server A computes a prompt, its stored
blocks are written through; server B, which never saw the prompt, gets a prefix hit of every
full block from REMOTE (the first lookups RETRY while the fetch is in flight, then HIT), loads
them byte-exact (the checking model reads every K/V) and produces the same tokens as a server
that computed everything. A corrupted value is recomputed, never read."""

import pytest

pytest.importorskip("vllm")

import vllm_harness as vh  # noqa: E402
from vllm_harness import forget_gpu_cache, prompt  # noqa: E402
from kvtier._store import close_store, find_store  # noqa: E402
from redis_proc import redis_server  # noqa: E402,F401 (fixture)

BS = 16




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


def test_reset_drops_fetched_blocks(engines, redis_server):  # noqa: F811
    """reset_cache (vLLM: "evict all tracked blocks") also drops the blocks fetched from
    REMOTE: with REMOTE emptied, a request after the reset is computed, as with vLLM's CPU
    offloading."""
    a = engines("kvtier-spec", **_remote(redis_server.port, "A-reset"))
    p = prompt(71, 6 * BS + 5)
    a.add("a", p)
    a.run()
    a.settle()
    find_store("A-reset").engine.drain()
    b = engines("kvtier-spec", **_remote(redis_server.port, "B-reset"))
    b.add("b", p[:6 * BS] + prompt(72, 9))
    b.run()
    b.settle()
    assert b.hits["b"] == 6 * BS
    redis_server.command("FLUSHALL")
    assert b.scheduler.reset_prefix_cache(reset_connector=True)
    b.settle()
    assert find_store("B-reset").pool.stats()["stored_blocks"] == 0
    for t in b.kv.values():
        t.fill_(-1.0)
    b.add("b2", p[:6 * BS] + prompt(73, 9))
    b.run()
    assert b.hits["b2"] == 0
    assert b.bad_reads == []


def test_sliding_window_run_asked_again(redis_server):  # noqa: F811
    """A sliding-window group's scan stops once it has a window, so some keys' fetch runs are
    never looked at again; a later request that needs them asks REMOTE again (a stale run
    used to answer MISS from its old, ended fetch: the blocks were recomputed)."""
    import time
    made = []
    opts = dict(kvtier_remote_host="127.0.0.1", kvtier_remote_port=redis_server.port,
                kvtier_remote_model_id="harness@1")
    try:
        p = prompt(81, 6 * BS + 5)
        a = vh.Engine("kvtier-spec", swa=24, kvtier_store_name="SA", **opts)
        made.append(a)
        a.add("a", p)
        a.run()
        a.settle()
        for g in (0, 1):
            find_store(f"SA#g{g}").engine.drain()
        b = vh.Engine("kvtier-spec", swa=24, kvtier_store_name="SB", **opts)
        made.append(b)
        b.add("b1", p[:6 * BS] + prompt(82, 9))
        b.run()
        b.settle()
        assert b.hits["b1"] == 6 * BS
        # A serves a request ending at 64 tokens: the window blocks of that boundary
        a.scheduler.kv_cache_manager.reset_prefix_cache()
        a.add("a2", p[:4 * BS] + prompt(83, 5))
        a.run()
        a.settle()
        for g in (0, 1):
            find_store(f"SA#g{g}").engine.drain()
        b.scheduler.kv_cache_manager.reset_prefix_cache()
        for t in b.kv.values():
            t.fill_(-1.0)
        time.sleep(1.2)  # past kvtier's 1 s no-re-ask window of the hashes that missed
        b.add("b2", p[:4 * BS] + prompt(84, 5))
        b.run()
        assert b.bad_reads == []
        assert b.hits["b2"] == 4 * BS
    finally:
        for e in made:
            e.shutdown()
        for n in ("SA", "SB"):
            close_store(n)
