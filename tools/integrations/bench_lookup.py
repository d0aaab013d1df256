#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The scheduler-side lookup of a 32k-token prompt (2048 blocks of 16 tokens), all stored:
vLLM's OffloadingConnector asks KvtierOffloadingManager.lookup() once per block key (answered
from the manager's mirror of what kvtier holds, kept by kvt_ext_removed); in the same run, the
same per-key loop over vLLM's own CPUOffloadingManager (a dict probe per key: the floor of a
Python manager) and one batched kvt_ext_lookup of the 2048 hashes (what kvtier itself costs
through ctypes). A first scan with a cold mirror (a new manager: with the key positions vLLM's
scheduler records in the ReqContext, one check and then one batched kvt_ext_lookup of the
request's following keys; without them one kvt_ext_lookup per key) and a scan after
kvtier evicted a block are timed too. Prints the median of --reps runs of each, in
microseconds, and the ratio kvtier / vLLM CPU manager.

    KVTIER_LIBRARY=build/libkvtier.so $VENV/bin/python tools/integrations/bench_lookup.py
"""
import argparse
import hashlib
import os
import statistics
import sys
import time
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import numpy as np  # noqa: E402
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # noqa: E402

import kvtier  # noqa: E402
from kvtier._store import close_store, shared_store  # noqa: E402
from kvtier.vllm.spec import KvtierOffloadingManager  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--reps", type=int, default=21)
    a = ap.parse_args()
    n = a.tokens // a.block
    buf = np.zeros((n, 64), dtype=np.uint8)
    st = shared_store("bench", block_bytes=64, host_bytes=2 * n * 64)
    pool = st.register(n, [kvtier.ext_layer(buf.ctypes.data, 64, 64)])
    spec = types.SimpleNamespace(blocks_per_chunk=1, extra_config={"kvtier_store_name": "bench"},
                                 config=types.SimpleNamespace(engine_id="bench"))
    m = KvtierOffloadingManager(spec)
    h = b"\0" * 32
    keys = []
    for _ in range(n):
        h = hashlib.sha256(h).digest()
        keys.append(make_offload_key(h, 0))
    hashes = [m.hashes(k)[0] for k in keys]
    pool.wait(pool.store(hashes, list(range(n))))
    pool.poll()

    def scan(mgr, ctx):
        t = time.perf_counter()
        hits = 0
        for k in keys:
            if mgr.lookup(k, ctx) is not LookupResult.HIT:
                break
            hits += 1
        return time.perf_counter() - t, hits

    def request_ctx(req_id):
        """A ReqContext as vLLM's scheduler fills it before its lookups: every key's end
        position (RequestOffloadState.update_offload_keys)."""
        ctx = ReqContext(req_id=req_id)
        for i, k in enumerate(keys):
            ctx.set_offload_key_position(k, (i + 1) * a.block)
        return ctx

    # a cold mirror (a new manager, as after a restart): the first key is checked with kvtier,
    # then the rest of the request's keys in one batched call
    cold, hits = scan(m, request_ctx("r0"))
    assert hits == n
    # the same without the scheduler's positions: one kvt_ext_lookup per key
    m2 = KvtierOffloadingManager(spec)
    cold_per_key, hits = scan(m2, ReqContext(req_id="r0b"))
    assert hits == n
    vm = CPUOffloadingManager(num_chunks=n)
    out = vm.prepare_store(keys, ReqContext(req_id="v"))
    vm.complete_store(out.keys_to_store, ReqContext(req_id="v"))
    per_key, vllm_cpu, batched = [], [], []
    for r in range(a.reps):
        ctx = ReqContext(req_id=f"r{r}")  # a scan of a new request: the mirror is synced
        dt, hits = scan(m, ctx)
        assert hits == n
        per_key.append(dt)
        dt, hits = scan(vm, ctx)
        assert hits == n
        vllm_cpu.append(dt)
        t = time.perf_counter()
        assert pool.lookup(hashes) == n
        batched.append(time.perf_counter() - t)
    # kvtier drops a block in the middle: the next scan stops there (the removal is drained)
    pool.drop([hashes[n // 2]])
    dt, hits = scan(m, ReqContext(req_id="after-drop"))
    assert hits == n // 2, hits
    med = statistics.median
    print(f"bench_lookup: {a.tokens} tokens = {n} blocks, all stored; load average "
          f"{os.getloadavg()[0]:.2f}; median of {a.reps}:")
    print(f"  kvtier manager.lookup per key (vLLM's calls)  {med(per_key) * 1e6:8.0f} us")
    print(f"  vLLM CPUOffloadingManager per key, same keys  {med(vllm_cpu) * 1e6:8.0f} us")
    print(f"  ratio kvtier / vLLM CPU manager               {med(per_key) / med(vllm_cpu):8.2f}")
    print(f"  one kvt_ext_lookup of {n} hashes (batched)    {med(batched) * 1e6:8.0f} us")
    print(f"  first scan, cold mirror (scheduler positions) {cold * 1e6:8.0f} us")
    print(f"  first scan, cold mirror, no positions         {cold_per_key * 1e6:8.0f} us")
    print(f"  scan after a drop (stops at block {n // 2})      {dt * 1e6:8.0f} us")
    close_store("bench")


if __name__ == "__main__":
    main()
