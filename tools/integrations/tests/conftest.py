# SPDX-License-Identifier: MIT
"""pytest setup of the vLLM / SGLang integration tests (tools/integrations/run.sh runs them
in the venvs tools/integrations/setup.sh makes): kvtier from tools/python, libkvtier.so from
KVTIER_LIBRARY, vLLM's own test helpers (tests.v1.kv_connector.unit.utils) from the unpacked
vLLM source archive (KVT_VLLM_SRC)."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools", "python", "tests"))  # redis_proc
VLLM_SRC = os.environ.get("KVT_VLLM_SRC", "/work/vllm-src")
if os.path.isdir(os.path.join(VLLM_SRC, "tests")):
    sys.path.append(VLLM_SRC)
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
def engines(request):
    """A factory of vllm_harness.Engine(mode, **kw) (a test module's ENGINE_DEFAULTS first),
    each shut down with its kvtier stores closed at the end of the test."""
    import vllm_harness as vh
    from kvtier._store import close_store
    defaults = getattr(request.module, "ENGINE_DEFAULTS", {})
    made = []

    def make(mode, **kw):
        e = vh.Engine(mode, **{**defaults, **kw})
        made.append(e)
        return e
    yield make
    for e in made:
        e.shutdown()
        close_store(vh.store_name(e))
