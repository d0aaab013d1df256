#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tools/hf-fixtures/topk_ties.py - which of equal values torch.topk picks (CPU, float32), for
tools/kvtier-hf/dsa.c's hf_torch_topk (tests/test_hf_dsa.c replays it; CI needs no torch).

DeepSeek-V3.2's indexer scores tie exactly where ReLU zeroes every head of a key (common with
few indexer heads), and transformers' selection among them is torch.topk's: libstdc++'s
nth_element or partial_sort inside ATen, whose choice depends on the row's length. Rows here:
a causal row as the indexer sees it (n_valid scores, then finfo.min for the masked positions),
values drawn from a few quarters (many exact ties), lengths on both sides of ATen's
k * 64 <= n switch. Writes tests/data/hf/topk-ties.json: {"torch": version, "rows": [{"n",
"k", "n_valid", "q": [n_valid ints: value q / 4], "picked": [the members < n_valid,
ascending]}]}.

  /tmp/hfvenv/bin/python tools/hf-fixtures/topk_ties.py --out tests/data/hf/topk-ties.json
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen  # noqa: E402,F401  (the CPU environment, set before torch is imported)
import torch  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/data/hf/topk-ties.json")
    a = ap.parse_args()
    g = torch.Generator().manual_seed(17)
    rows = []
    for n in (3, 4, 9, 20, 64, 127, 169, 200, 255, 256, 257, 513, 1024):
        for k in (1, 2, 4, 8, 12, 16, 32):
            for levels in (2, 5):
                n_valid = int(torch.randint(1, n + 1, (1,), generator=g))
                if len(rows) % 3 == 0:
                    n_valid = n
                q = torch.randint(-levels, levels + 1, (n_valid,), generator=g)
                row = torch.full((n,), torch.finfo(torch.float32).min)
                row[:n_valid] = q.to(torch.float32) / 4
                kk = min(k, n)
                idx = row.topk(kk).indices.tolist()
                rows.append({"n": n, "k": k, "n_valid": n_valid, "q": q.tolist(),
                             "picked": sorted(i for i in idx if i < n_valid)})
    with open(a.out, "w") as f:
        json.dump({"torch": torch.__version__, "rows": rows}, f, separators=(",", ":"))
        f.write("\n")
    print(f"{a.out}: {len(rows)} rows")


if __name__ == "__main__":
    main()
