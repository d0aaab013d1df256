# SPDX-License-Identifier: MIT
"""tools/python/examples/kv_connector.py decodes the real stories260K model through the binding and
prints the same text as kvtier-run (the C runner) for the same flags: one session, a batched
multi-session chat parked to NVMe between turns, a shared prompt whose blocks the second
request attaches instead of prefilling, and sessions restored from the persistent store by a
second run (a server restart). Skipped without ../shared/data."""
import os
import re
import subprocess
import sys

import pytest

SHARED = ("Once upon a time, there was a little girl named Lily. She loved to play outside in "
          "the sunshine with her dog.")


def data_dir(root):
    return os.environ.get("KVT_SHARED_DATA") or os.path.join(root, "..", "shared", "data")


def model_files(root):
    models = os.path.join(data_dir(root), "models")
    model, tok = os.path.join(models, "stories260K.bin"), os.path.join(models, "tok512.bin")
    if not os.path.exists(model):
        pytest.skip("no stories260K in ../shared/data")
    return model, tok


def example(root, flags):
    env = dict(os.environ, KVT_SHARED_DATA=data_dir(root))
    return subprocess.run([sys.executable, os.path.join(root, "tools", "python", "examples",
                                                        "kv_connector.py"), "--verbose"]
                          + flags, check=True, capture_output=True, text=True, env=env)


def kvtier_run(root, flags):
    model, tok = model_files(root)
    run = os.environ.get("KVT_RUN") or os.path.join(root, "build", "kvtier-run")
    if not os.path.exists(run):
        pytest.skip("no kvtier-run to compare with")
    return subprocess.run([run, "--model", model, "--tokenizer", tok, "--temperature", "0"]
                          + flags, check=True, capture_output=True, text=True).stdout


@pytest.mark.parametrize("flags", [["--steps", "64"],
                                   ["--sessions", "2", "--turns", "2", "--steps", "40",
                                    "--prompt", "Lily had a"],
                                   # kvtier-run's built-in prompt per session and turn
                                   ["--sessions", "3", "--turns", "2", "--steps", "24"]])
def test_example_matches_kvtier_run(root, flags):
    model_files(root)
    ex = example(root, flags)
    assert ex.stdout.strip() == kvtier_run(root, flags).strip()
    assert "Lily" in ex.stdout
    if "--turns" in flags:
        assert "tokens cached (history" in ex.stderr  # the connector found the parked sessions
        assert "'nvme_to_host': 0" not in ex.stderr  # and brought them back from NVMe


def test_shared_prompt_is_attached_not_prefilled(root):
    model_files(root)
    flags = ["--sessions", "2", "--steps", "64", "--prompt", SHARED]
    ex = example(root, flags + ["--prefix-share"])
    m = re.search(r"session 2 turn 1: (\d+) tokens cached \(prefix, slowest tier (\w+)\)",
                  ex.stderr)
    assert m, ex.stderr
    matched = int(m.group(1))
    assert matched > 0 and matched % 16 == 0  # whole blocks of the shared prompt
    assert m.group(2) in ("hbm", "host", "nvme")
    assert f"prefix hit tokens {matched}," in ex.stderr  # the engine counted them as shared
    assert "session 1 turn 1:" not in ex.stderr  # the first request had nothing cached
    ref = kvtier_run(root, flags + ["--prefix-share"])
    assert ex.stdout.strip() == ref.strip()
    assert ref.strip() == kvtier_run(root, flags).strip()  # sharing does not change the text
    texts = re.findall(r"\] (.*)", ex.stdout)
    assert len(texts) == 2 and texts[0] == texts[1] and texts[0].startswith(SHARED)


def test_restart_restores_published_sessions(root, tmp_path):
    model_files(root)
    flags = ["--sessions", "2", "--steps", "20", "--prompt", "Lily", "--hbm-blocks", "8",
             "--nvme-dir", str(tmp_path)]
    first = example(root, flags)
    assert "restored" not in first.stderr
    assert {"kvtier.store", "kvtier.journal"} <= set(os.listdir(tmp_path))
    second = example(root, flags)  # the "restarted server" finds both sessions published
    assert len(re.findall(r"turn 1: 20 tokens cached \(restored, slowest tier nvme\)",
                          second.stderr)) == 2, second.stderr
    ref = kvtier_run(root, ["--sessions", "2", "--turns", "2", "--steps", "20", "--prompt",
                            "Lily"])
    lines = {(s, t): x for s, t, x in re.findall(r"\[session (\d) turn (\d)\] (.*)", ref)}
    assert lines[("1", "2")] != lines[("1", "1")]  # turn 2 continues the history
    got = re.findall(r"\[session (\d) turn 1\] (.*)", second.stdout)
    assert [x for _, x in got] == [lines[("1", "2")], lines[("2", "2")]]
    assert re.findall(r"\[session (\d) turn 1\] (.*)", first.stdout)[0][1] == \
        lines[("1", "1")]


def test_restart_two_sessions_default_hbm(root, tmp_path):
    """A restart with 2 sessions at the default HBM size: the restored sessions carry their
    history (40 tokens each) on top of this run's 40 positions, so they no longer fit HBM
    together as the first run's did; the example runs them in groups that fit."""
    model_files(root)
    flags = ["--sessions", "2", "--steps", "40", "--nvme-dir", str(tmp_path)]
    example(root, flags)
    for _ in range(2):  # each restart continues both chats (80, then 120 tokens)
        again = example(root, flags)
        assert len(re.findall(r"turn 1: \d+ tokens cached \(restored", again.stderr)) == 2
        assert len(re.findall(r"\[session \d turn 1\] ", again.stdout)) == 2


def test_more_sessions_than_hbm_holds_run_in_groups(root):
    model_files(root)
    flags = ["--sessions", "3", "--steps", "40", "--prompt", "Lily had a"]
    ex = example(root, flags + ["--hbm-blocks", "7"])  # 3 blocks a session: 2 at a time
    assert ex.stdout.strip() == kvtier_run(root, flags).strip()


@pytest.mark.parametrize("flags", [["--steps", "0"], ["--steps", "-5"], ["--sessions", "0"],
                                   ["--turns", "x"]])
def test_bad_arguments_are_argparse_errors(root, flags):
    env = dict(os.environ, KVT_SHARED_DATA=data_dir(root))
    r = subprocess.run([sys.executable, os.path.join(root, "tools", "python", "examples",
                                                     "kv_connector.py")] + flags,
                       capture_output=True, text=True, env=env)
    assert r.returncode == 2
    assert "error: argument " + flags[0] in r.stderr and "Traceback" not in r.stderr
