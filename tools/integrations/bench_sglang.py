#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The SGLang backend's v1 calls (batch_set_v1 then batch_get_v1 of the same pages into other
host pages) on SGLang 0.5.23's own MHATokenToKVPoolHost (CPU tensors, layout layer_first),
zero-copy (interface_v1: the host pool is kvtier's pool) against staged (the same calls
through staging pages), and, in the same run, a plain torch copy of the same pages out of the
host pool and back (the floor: one gather and one scatter of the bytes). Prints the median
of --reps runs of each, in GB/s of page bytes, and the ratios to the plain copy.

    KVTIER_LIBRARY=build/libkvtier.so $VENV_SGLANG/bin/python tools/integrations/bench_sglang.py
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402

from kvtier.sglang.backend import KvtierHiCacheStorage  # noqa: E402
from sglang_pool import mha_host_pool  # noqa: E402


def backend(zero_copy, page_bytes, n_pages, staging):
    x = {"kvtier_host_bytes": 4 * n_pages * page_bytes, "kvtier_staging_pages": staging}
    if zero_copy:
        x["interface_v1"] = 1
    else:
        x["kvtier_page_bytes"] = page_bytes
    cfg = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                               attn_cp_size=1, is_mla_model=False,
                               enable_storage_metrics=False, is_page_first_layout=False,
                               model_name=f"bench{int(zero_copy)}", extra_config=x)
    return KvtierHiCacheStorage(cfg)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=256, help="pages per call (default 256)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--staging", type=int, default=64, help="kvtier_staging_pages (staged)")
    a = ap.parse_args()
    L, H, D, P = 8, 8, 128, 16  # 8 layers of 8 KV heads x 128, f16, 16-token pages: 512 KiB
    n = 2 * a.pages + 8
    hp = mha_host_pool(L, H, D, P, n * P)
    page_bytes = 2 * L * P * H * D * 2
    src = list(range(a.pages))
    dst = list(range(a.pages, 2 * a.pages))
    idx = lambda pages: torch.tensor([p * P + t for p in pages for t in range(P)])  # noqa: E731
    gb = a.pages * page_bytes / 1e9
    res = {}
    for name, zc in (("zero-copy", True), ("staged", False)):
        b = backend(zc, page_bytes, a.pages, a.staging)
        b.register_mem_pool_host(hp)
        assert b.zero_copy == zc
        st, ld = [], []
        for r in range(a.reps):
            keys = [f"{name}-{r}-{p}" for p in src]
            t0 = time.perf_counter()
            assert all(b.batch_set_v1(keys, idx(src)))
            t1 = time.perf_counter()
            assert all(b.batch_get_v1(keys, idx(dst)))
            t2 = time.perf_counter()
            st.append(gb / (t1 - t0))
            ld.append(gb / (t2 - t1))
        assert torch.equal(hp.get_data_page(dst[3] * P), hp.get_data_page(src[3] * P))
        b.close()
        res[name] = (statistics.median(st), statistics.median(ld))
    # the floor: the same pages gathered out of the host pool and scattered back, torch copies
    buf = torch.empty((a.pages, page_bytes // 2), dtype=torch.float16)
    gt, sc = [], []
    for r in range(a.reps):
        t0 = time.perf_counter()
        for i, p in enumerate(src):
            buf[i].copy_(hp.get_data_page(p * P))
        t1 = time.perf_counter()
        for i, p in enumerate(dst):
            hp.set_from_flat_data_page(p * P, buf[i])
        t2 = time.perf_counter()
        gt.append(gb / (t1 - t0))
        sc.append(gb / (t2 - t1))
    res["plain copy"] = (statistics.median(gt), statistics.median(sc))
    print(f"{a.pages} pages of {page_bytes // 1024} KiB per call, median of {a.reps}, "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"{'':12} {'set_v1 GB/s':>12} {'get_v1 GB/s':>12} {'set/copy':>9} {'get/copy':>9}")
    for name, (s, g) in res.items():
        print(f"{name:12} {s:12.2f} {g:12.2f} {s / res['plain copy'][0]:9.3f} "
              f"{g / res['plain copy'][1]:9.3f}")


if __name__ == "__main__":
    main()
