#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The scheduler-side lookup of a 32k-token prompt (2048 blocks of 16 tokens), all stored:
vLLM's OffloadingConnector asks KvtierOffloadingManager.lookup() once per block key; also the
one batched kvt_ext_lookup of the same 2048 hashes (what kvtier itself costs). Prints the
median of --reps runs of each, in microseconds.

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
    ctx = ReqContext(req_id="r")
    per_key, batched = [], []
    for _ in range(a.reps):
        m._sub.clear()  # as for a new request: the hashes are computed too
        t = time.perf_counter()
        hits = 0
        for k in keys:
            if m.lookup(k, ctx) is not LookupResult.HIT:
                break
            hits += 1
        per_key.append(time.perf_counter() - t)
        assert hits == n
        t = time.perf_counter()
        assert pool.lookup(hashes) == n
        batched.append(time.perf_counter() - t)
    print(f"bench_lookup: {a.tokens} tokens = {n} blocks, all stored; median of {a.reps}: "
          f"manager.lookup per key (vLLM's calls) {statistics.median(per_key) * 1e6:.0f} us, "
          f"one kvt_ext_lookup of {n} hashes {statistics.median(batched) * 1e6:.0f} us")
    close_store("bench")


if __name__ == "__main__":
    main()
