# SPDX-License-Identifier: MIT
"""A restart of the server process with kvtier's persistent store: blocks a first process
stored are hits in a second one (vLLM's scheduler, its OffloadingConnector with the kvtier
spec and the kvtier connector), loaded byte-exact (the checking model reads them)."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm")

HERE = os.path.dirname(os.path.abspath(__file__))


def run_server(mode, nvme_dir):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    r = subprocess.run([sys.executable, os.path.join(HERE, "vllm_restart_driver.py"), mode,
                        str(nvme_dir)], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["kvtier-spec", "kvtier-connector"])
def test_restart_hits_persistent_store(tmp_path, mode):
    first = run_server(mode, tmp_path)
    assert first["hits"] == 0 and first["bad"] == []
    second = run_server(mode, tmp_path)
    assert second["hits"] == 5 * 16        # every full block stored by the first process
    assert second["computed"] == 7 + 2     # the partial block's 7 tokens + 2 decode steps
    assert second["bad"] == []
    assert second["out"] == first["out"]
