# SPDX-License-Identifier: MIT
"""A hybrid model (a full-attention layer and a sliding-window layer in two KV cache groups,
as Gemma 3 and gpt-oss are built) through vLLM 0.33.0's real Scheduler with kvtier: one
kvtier pool per group, the keys of each group stored and loaded in its own pool; vLLM frees
the sliding-window group's blocks that leave the window and combines the groups' hits. The
checking model (vllm_harness) reads the full layer's every position and the window of the
sliding one: a block loaded with wrong bytes, into the wrong group, or not at all, is a bad
read. Compared with vLLM's built-in CPU offloading on the same request sequences."""
import random

import pytest

pytest.importorskip("vllm")

import vllm_harness as vh  # noqa: E402
from vllm_harness import forget_gpu_cache, prompt  # noqa: E402
from kvtier._store import close_store, find_store  # noqa: E402

MODES = ["kvtier-spec", "kvtier-connector"]
BS = 16
SWA = 24  # tokens of the sliding window: 2-3 blocks of 16

ENGINE_DEFAULTS = {"swa": SWA}  # the conftest engines fixture: every engine is hybrid





@pytest.mark.parametrize("mode", MODES)
def test_hybrid_prefix_hit_loads_both_groups(engines, mode):
    e = engines(mode)
    p = prompt(1, 5 * BS + 3)
    e.add("a", p)
    e.run()
    e.settle()
    forget_gpu_cache(e)
    e.add("b", p[:5 * BS] + prompt(2, 20))
    e.run()
    assert e.bad_reads == []
    ref = engines("cpu")
    ref.add("a", p)
    ref.run()
    ref.settle()
    forget_gpu_cache(ref)
    ref.add("b", p[:5 * BS] + prompt(2, 20))
    ref.run()
    assert ref.bad_reads == []
    assert e.hits["b"] == ref.hits["b"] == 5 * BS
    assert e.computed["b"] == ref.computed["b"]
    assert e.outputs == ref.outputs
    # each group's blocks are in its own pool
    name = vh.store_name(e)
    full = find_store(f"{name}#g0").pool.stats()
    window = find_store(f"{name}#g1").pool.stats()
    assert full["blocks_loaded"] == 5
    assert 1 <= window["blocks_loaded"] <= 3  # only the window's blocks come back
    assert full["stored_blocks"] >= 5 and window["stored_blocks"] >= 2


def test_hybrid_same_hits_and_outputs_as_vllm_cpu_offloading(engines):
    """Random request sequences with shared prefixes (GPU prefix cache dropped between some
    requests): the kvtier spec gives vLLM's built-in CPU offloading's hits and outputs."""
    for seed in (11, 12):
        rng = random.Random(seed)
        bases = [prompt(100 + i, rng.randrange(2, 6) * BS + rng.randrange(0, BS))
                 for i in range(4)]
        work = []
        for i in range(10):
            b = rng.choice(bases)
            cut = rng.randrange(0, len(b) + 1)
            work.append((f"r{i}", b[:cut] + prompt(200 + i, rng.randrange(1, 2 * BS)),
                         rng.randrange(1, 6), rng.random() < 0.5))
        res = {}
        for mode in ("cpu", "kvtier-spec"):
            e = engines(mode, kvtier_store_name=f"hy-{seed}-{mode}")
            for rid, p, mt, forget in work:
                e.add(rid, p, max_tokens=mt)
                e.run()
                e.settle()
                if forget:
                    forget_gpu_cache(e)
            assert e.bad_reads == []
            res[mode] = (dict(e.hits), dict(e.outputs))
        assert res["kvtier-spec"][0] == res["cpu"][0]
        assert res["kvtier-spec"][1] == res["cpu"][1]
        assert sum(res["cpu"][0].values()) > 0


@pytest.mark.parametrize("mode", MODES)
def test_hybrid_two_requests_small_pool(engines, mode):
    e = engines(mode, num_gpu_blocks=20, max_num_batched_tokens=64)
    e.add("a", prompt(3, 6 * BS - 2), max_tokens=24)
    e.add("b", prompt(4, 6 * BS - 2), max_tokens=24)
    e.run()
    assert e.bad_reads == []
    ref = engines("cpu", num_gpu_blocks=64)
    ref.add("a", prompt(3, 6 * BS - 2), max_tokens=24)
    ref.add("b", prompt(4, 6 * BS - 2), max_tokens=24)
    ref.run()
    assert e.outputs == ref.outputs
    assert all(len(v) == 24 for v in e.outputs.values())


def test_hybrid_restart_with_persistent_store(engines, tmp_path):
    """Both groups' pools in the persistent store (a directory each under kvtier_nvme_dir):
    after the store is closed and reopened (a server restart), a request sharing the prefix
    hits every full block of both groups from NVMe."""
    opts = dict(kvtier_nvme_dir=str(tmp_path), kvtier_nvme_bytes=1 << 24, kvtier_persist=True,
                kvtier_store_name="hy-restart")
    p = prompt(31, 5 * BS + 3)
    e = engines("kvtier-spec", **opts)
    e.add("a", p)
    e.run()
    e.settle()
    e.shutdown()
    close_store("hy-restart")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["g0", "g1"]
    e2 = engines("kvtier-spec", **opts)
    e2.add("b", p[:5 * BS] + prompt(32, 20))
    e2.run()
    assert e2.bad_reads == []
    assert e2.hits["b"] == 5 * BS
    ref = engines("cpu")
    ref.add("b", p[:5 * BS] + prompt(32, 20))
    ref.run()
    assert e2.outputs["b"] == ref.outputs["b"]
