# SPDX-License-Identifier: MIT
"""pytest setup: import kvtier from tools/python/ and find libkvtier.so (KVTIER_LIBRARY, as ctest sets
it, else build/libkvtier.so of this checkout); skip everything when there is none."""
import os
import sys

import pytest

PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tools/python
ROOT = os.path.dirname(os.path.dirname(PKG))
sys.path.insert(0, PKG)
if not os.environ.get("KVTIER_LIBRARY"):
    cand = os.path.join(ROOT, "build", "libkvtier.so")
    if os.path.exists(cand):
        os.environ["KVTIER_LIBRARY"] = cand


def pytest_collection_modifyitems(config, items):
    if not os.environ.get("KVTIER_LIBRARY"):
        skip = pytest.mark.skip(reason="no libkvtier.so: set KVTIER_LIBRARY or build ./build")
        for item in items:
            item.add_marker(skip)


@pytest.fixture
def root():
    return ROOT


@pytest.fixture
def engine():
    import kvtier
    # 2 layers, 2 KV heads, head_dim 8, f32, 4 tokens per block: 1024-byte blocks
    with kvtier.Engine(n_layers=2, n_kv_heads=2, head_dim=8, dtype="f32", tokens_per_block=4,
                       hbm_bytes=8 * 1024, host_bytes=16 * 1024, high_watermark=1.0,
                       low_watermark=1.0) as e:
        yield e
