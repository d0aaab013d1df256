# SPDX-License-Identifier: MIT
"""python/examples/kv_connector.py decodes the real stories260K model through the binding and
prints the same text as kvtier-run (the C runner) for the same flags, one session and a batched
multi-session chat parked to NVMe between turns. Skipped without ../shared/data."""
import os
import subprocess
import sys

import pytest


def data_dir(root):
    return os.environ.get("KVT_SHARED_DATA") or os.path.join(root, "..", "shared", "data")


@pytest.mark.parametrize("flags", [["--steps", "64"],
                                   ["--sessions", "2", "--turns", "2", "--steps", "40",
                                    "--prompt", "Lily had a"]])
def test_example_matches_kvtier_run(root, flags):
    models = os.path.join(data_dir(root), "models")
    model, tok = os.path.join(models, "stories260K.bin"), os.path.join(models, "tok512.bin")
    if not os.path.exists(model):
        pytest.skip("no stories260K in ../shared/data")
    env = dict(os.environ, KVT_SHARED_DATA=data_dir(root))
    ex = subprocess.run([sys.executable, os.path.join(root, "python", "examples",
                                                       "kv_connector.py"), "--verbose"] + flags,
                        check=True, capture_output=True, text=True, env=env)
    run = os.environ.get("KVT_RUN") or os.path.join(root, "build", "kvtier-run")
    if not os.path.exists(run):
        pytest.skip("no kvtier-run to compare with")
    ref = subprocess.run([run, "--model", model, "--tokenizer", tok, "--temperature", "0"]
                         + flags, check=True, capture_output=True, text=True)
    assert ex.stdout.strip() == ref.stdout.strip()
    assert "Lily" in ex.stdout
    if "--turns" in flags:
        assert "tokens cached" in ex.stderr  # the connector found the parked sessions
        assert "'nvme_to_host': 0" not in ex.stderr  # and brought them back from NVMe
