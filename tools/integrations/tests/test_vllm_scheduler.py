# SPDX-License-Identifier: MIT
"""vLLM's real Scheduler (vllm 0.33.0, CPU) with kvtier: the kvtier offloading spec behind
vLLM's OffloadingConnector and the kvtier KV connector, through prefix hits, preemption,
abort, a load failure, delayed frees, and against vLLM's built-in CPU offloading. Every K/V
the checking model reads is verified (vllm_harness: a block with wrong bytes is a bad read)."""
import random

import pytest

pytest.importorskip("vllm")

import vllm_harness as vh  # noqa: E402
from vllm_harness import forget_gpu_cache, prompt  # noqa: E402
from kvtier._store import hash64  # noqa: E402

MODES = ["kvtier-spec", "kvtier-connector"]
BS = 16





@pytest.mark.parametrize("mode", MODES)
def test_prefix_hit_loads_every_byte(engines, mode):
    e = engines(mode)
    p = prompt(1, 5 * BS + 3)
    e.add("a", p)
    e.run()
    e.settle()
    forget_gpu_cache(e)
    e.add("b", p[:5 * BS] + prompt(2, 20))
    e.run()
    assert e.hits["b"] == 5 * BS          # every full block of the shared prefix
    assert e.computed["b"] == 20 + 3      # only the rest was computed (+ decode steps)
    assert e.bad_reads == []
    ref = engines("cpu")
    ref.add("a", p)
    ref.run()
    ref.add("b", p[:5 * BS] + prompt(2, 20))
    ref.run()
    assert e.outputs == ref.outputs


@pytest.mark.parametrize("mode", MODES)
def test_preemption(engines, mode):
    # 14 GPU blocks for two requests of 6 blocks each that grow: one is preempted; its
    # stored blocks come back from kvtier when it resumes
    e = engines(mode, num_gpu_blocks=14, max_num_batched_tokens=64)
    e.add("a", prompt(3, 6 * BS - 2), max_tokens=24)
    e.add("b", prompt(4, 6 * BS - 2), max_tokens=24)
    e.run()
    assert e.preempted  # the pool is too small for both: vLLM preempted one
    assert e.bad_reads == []
    ref = engines("kvtier-spec", num_gpu_blocks=64, kvtier_store_name="ref-preempt")
    ref.add("a", prompt(3, 6 * BS - 2), max_tokens=24)
    ref.add("b", prompt(4, 6 * BS - 2), max_tokens=24)
    ref.run()
    assert e.outputs == ref.outputs
    assert all(len(v) == 24 for v in e.outputs.values())


@pytest.mark.parametrize("mode", MODES)
def test_abort_mid_prefill(engines, mode):
    e = engines(mode, max_num_batched_tokens=32)
    p = prompt(5, 6 * BS)
    e.add("a", p)
    e.step()
    e.step()  # two chunks of 32 computed: blocks 0..3
    e.abort("a")
    e.run()
    e.settle()
    free = e.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    assert free == 48 - 1  # every block back (block 0 is vLLM's null block)
    forget_gpu_cache(e)
    e.add("b", p)
    e.run()
    assert e.hits["b"] % BS == 0 and e.hits["b"] <= 4 * BS
    assert e.bad_reads == []


def test_load_failure_recomputes_only_invalid(engines):
    """A stored block disappears between the scheduler's lookup and the worker's load
    (kvt_ext_drop: as when a block's NVMe copy fails its checksum and kvtier drops it):
    the kvtier connector reports that GPU block through get_block_ids_with_load_errors(),
    vLLM recomputes from there, no wrong K/V is ever read."""
    e = engines("kvtier-connector")
    p = prompt(6, 6 * BS + 5)
    e.add("a", p)
    e.run()
    e.settle()
    forget_gpu_cache(e)
    dropped = []

    def drop_block_3(eng, so):
        if so.kv_connector_metadata.load_jobs and not dropped:  # b's load: submitted next
            sp = eng.worker.connector_worker.spec
            m = eng.scheduler.connector.connector_scheduler.manager
            req = eng.scheduler.requests["b"]
            from vllm.v1.kv_offload.base import make_offload_key
            key = make_offload_key(req.block_hashes[3], 0)
            pool = sp._worker.pool
            assert pool.drop(m.hashes(key)) == 1
            dropped.append(key)
    e.before_load = drop_block_3
    e.add("b", p)
    e.run()
    assert dropped
    assert len(e.invalid_reported) == 1
    assert e.bad_reads == []
    # blocks 0..2 were loaded; block 3 on were recomputed
    assert e.computed["b"] >= len(p) - 3 * BS
    assert e.computed["b"] < len(p)
    ref = engines("cpu")
    ref.add("a", p)
    ref.run()
    ref.add("b", p)
    ref.run()
    assert e.outputs == ref.outputs


@pytest.mark.parametrize("mode", MODES)
def test_delayed_frees_keep_stored_bytes(engines, mode):
    """Stores are asynchronous (here slowed down: an emulated device of 2 MB/s): a request
    finishes while its blocks are still being copied, the next request gets those GPU blocks;
    vLLM fences the reuse (jobs_to_flush -> worker.wait), so what kvtier stored is the first
    request's K/V, as a third request that loads it checks."""
    e = engines(mode, num_gpu_blocks=12,
                kvtier_engine_opts={"emu_copy_bytes_per_s": 2 << 20})
    p = prompt(7, 5 * BS)
    e.add("a", p, max_tokens=1)
    e.run()
    e.add("x", prompt(8, 10 * BS), max_tokens=1)  # reuses a's freed blocks at once
    e.run()
    e.settle()
    forget_gpu_cache(e)
    e.add("b", p[:5 * BS] + prompt(9, 4))
    e.run()
    assert e.hits["b"] == 5 * BS
    assert e.bad_reads == []


def test_same_hits_and_outputs_as_vllm_cpu_offloading(engines):
    """A request sequence with shared prefixes, GPU prefix cache dropped between some
    requests: the kvtier spec gives vLLM's built-in CPU offloading's hits and outputs."""
    rng = random.Random(11)
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
        e = engines(mode)
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
    assert sum(res["cpu"][0].values()) > 0  # the sequence does hit


def _offload_events(e):
    """The connector's KV events (medium CPU) as comparable tuples, in order."""
    out = []
    for ev in e.kv_events():
        if getattr(ev, "medium", None) != "CPU":
            continue  # vLLM's own GPU prefix cache events
        kind = type(ev).__name__
        out.append((kind, tuple(ev.block_hashes),
                    tuple(ev.token_ids) if kind == "BlockStored" else ()))
    return out


@pytest.mark.parametrize("mode", MODES)
def test_kv_events_as_vllm_cpu_offloading(engines, mode):
    """With vLLM's KV cache events on (a capturing publisher), the same request sequence
    through the kvtier spec or connector publishes the offloaded blocks' BlockStored events
    that vLLM's built-in CPU offloading publishes (same hashes, tokens, order), and then,
    with a store too small to keep them, BlockRemoved events only for blocks it stored."""
    work = [(f"r{i}", prompt(300 + i % 3, 3 * BS + 5) + prompt(400 + i, BS), 2)
            for i in range(6)]
    ev = {}
    for m in ("cpu", mode):
        e = engines(m, kv_events=True)
        for rid, p, mt in work:
            e.add(rid, p, max_tokens=mt)
            e.run()
            e.settle()
        assert e.bad_reads == []
        ev[m] = _offload_events(e)
    stored = [x for x in ev["cpu"] if x[0] == "BlockStored"]
    assert stored and not [x for x in ev["cpu"] if x[0] != "BlockStored"]
    assert all(len(toks) == BS for _, _, toks in stored)  # self-describing: the tokens
    assert ev[mode] == ev["cpu"]
    # a 12-block store: the blocks of later requests push out earlier ones
    e = engines(mode, kv_events=True, kvtier_host_bytes=12 * vh.block_bytes(),
                kvtier_store_name=f"events-small-{mode}")
    for i in range(8):
        e.add(f"s{i}", prompt(500 + i, 4 * BS + 3), max_tokens=2)
        e.run()
        e.settle()
        forget_gpu_cache(e)
    e.add("probe", prompt(500, 4 * BS + 3), max_tokens=2)  # a scan drains the removal feed
    e.run()
    e.settle()
    got = _offload_events(e)
    put = {h for k, hs, _ in got if k == "BlockStored" for h in hs}
    gone = [h for k, hs, _ in got if k == "BlockRemoved" for h in hs]
    assert gone and set(gone) <= put and len(gone) == len(set(gone))


def test_hash64_distinct_groups():
    k = bytes(range(32))
    assert hash64(k + b"\0\0\0\0") != hash64(k + b"\0\0\0\1")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_store_before_promised_load(engines, mode, policy):
    """vLLM's contract (OffloadingManager.prepare_load): the blocks to load are protected from
    eviction until complete_load. HOST holds 8 blocks, request p stored 6; request a1's
    prefill queues a store of 4 blocks that vLLM's worker submits at the start of the next
    step, before the load of request b, which looked p's 6 blocks up in that step: the store
    must not evict them (it used to: the load failed, and the plain OffloadingConnector's
    worker asserts every job succeeded, so the engine stopped)."""
    e = engines(mode, kvtier_store_name=f"promise-{mode}-{policy}",
                kvtier_host_bytes=8 * vh.block_bytes(), kvtier_evict_policy=policy)
    p = prompt(61, 6 * BS + 3)
    e.add("p", p, max_tokens=1)
    e.run()
    e.settle()
    forget_gpu_cache(e)
    e.add("a1", prompt(62, 4 * BS + 3), max_tokens=5)
    e.step()
    e.add("b", p[:6 * BS] + prompt(63, 5), max_tokens=2)
    e.run()
    assert e.bad_reads == []
    assert e.hits["b"] == 6 * BS
    assert not e.invalid_reported
