# SPDX-License-Identifier: MIT
"""The binding against the real library: a sequence's whole life, errors as exceptions with
kvtier's code and message, deterministic release, an engine closed under live objects."""
import errno
import os
import re
import threading

import numpy as np
import pytest

import kvtier

TPB, LAYERS, HEADS, DIM = 4, 2, 2, 8


def pattern(tag, pos, layer, kv):
    base = tag * 100000 + pos * 100 + layer * 10 + kv
    return (base + np.arange(HEADS * DIM, dtype=np.float32) / 1000).astype(np.float32)


def write_tokens(eng, seq, tag, first, n):
    slots = seq.append(range(first, first + n))
    assert len(slots) == n
    for i, m in enumerate(slots):
        for layer in range(LAYERS):
            eng.write_kv(m, layer, pattern(tag, first + i, layer, 0),
                         pattern(tag, first + i, layer, 1))
    return slots


def check_tokens(batch, i, tag, n):
    table = batch.block_table()
    assert table.seq_len[i] == n
    for layer in range(LAYERS):
        batch.wait_layer(layer)
        k, v = batch.kv(i, layer, table)
        assert k.shape == (n, HEADS, DIM)
        for pos in range(n):
            np.testing.assert_array_equal(k[pos].reshape(-1), pattern(tag, pos, layer, 0))
            np.testing.assert_array_equal(v[pos].reshape(-1), pattern(tag, pos, layer, 1))


def test_version_matches_header(root):
    hdr = open(os.path.join(root, "engine", "kvtier.h")).read()
    parts = [re.search(rf"#define KVT_VERSION_{p} (\d+)", hdr).group(1)
             for p in ("MAJOR", "MINOR", "PATCH")]
    assert kvtier.version() == ".".join(parts)
    toml = open(os.path.join(root, "tools", "python", "pyproject.toml")).read()
    assert re.search(r'^version = "([^"]+)"', toml, re.M).group(1) == kvtier.version()


def test_lifecycle(engine):
    seq = engine.open_sequence(tenant=3, priority=70)
    slots = write_tokens(engine, seq, 7, 0, 10)
    assert slots[1] == slots[0] + 1  # consecutive tokens of one block
    info = seq.info()
    assert (info["n_tokens"], info["n_blocks"], info["tenant"], info["priority"]) == \
        (10, 3, 3, 70)
    with engine.prepare([seq]) as b:
        t = b.block_table()
        assert (t.n_seqs, t.indptr, t.last_block_len, t.first_block) == (1, [0, 3], [2], [0])
        assert len(set(t.blocks(0))) == 3
        check_tokens(b, 0, 7, 10)
        with pytest.raises(kvtier.BusyError) as ei:
            seq.close()
        assert ei.value.code == kvtier.EBUSY
    assert engine.stats()["batches_open"] == 0  # released by the with block
    seq.park(kvtier.TIER_HOST)
    engine.drain()
    info = seq.info()
    assert info["parked"] == 1
    assert info["blocks_in"][kvtier.TIER_HBM] == 0 and info["blocks_in"][kvtier.TIER_HOST] == 3
    seq.resume()
    engine.drain()
    assert seq.info()["parked"] == 0
    b = engine.prepare([seq.id])  # ids work too
    check_tokens(b, 0, 7, 10)
    b.release()
    b.release()  # idempotent
    st = engine.stats()
    assert st["blocks_moved"]["hbm_to_host"] >= 3 and st["blocks_moved"]["host_to_hbm"] >= 3
    assert st["tier"][0]["capacity_bytes"] == 8 * 1024
    assert st["seqs_open"] == 1
    seq.close()
    seq.close()
    with pytest.raises(kvtier.ClosedError):
        seq.append([1])
    assert engine.stats()["seqs_open"] == 0


def test_windows_and_nvme(tmp_path):
    with kvtier.Engine(n_layers=LAYERS, n_kv_heads=HEADS, head_dim=DIM, dtype="f32",
                       tokens_per_block=TPB, hbm_bytes=4 * 1024, host_bytes=2 * 1024,
                       nvme_dir=str(tmp_path), nvme_bytes=64 * 4096) as eng:
        assert os.listdir(tmp_path) == []  # the NVMe slot file has no name (a crash leaves none)
        with eng.open_sequence() as seq:
            for first in range(0, 24, 4):  # 6 blocks > 4 HBM slots: windows of 2
                write_tokens(eng, seq, 5, first, 4)
                eng.prepare([seq]).release() if first < 12 else None
            seq.park(kvtier.TIER_NVME)
            eng.drain()
            assert seq.info()["blocks_in"][kvtier.TIER_NVME] == 6
            with pytest.raises(kvtier.TooBigError) as ei:
                eng.prepare([seq])
            assert "HBM" in ei.value.message
            for first in (0, 2, 4):
                with eng.prepare([], ranges=[(seq, first, 2)]) as b:
                    t = b.block_table()
                    assert t.first_block == [first] and t.seq_len == [8]
                    for layer in range(LAYERS):
                        b.wait_layer(layer)
                        k, _ = b.kv(0, layer, t)
                        np.testing.assert_array_equal(
                            k[0].reshape(-1), pattern(5, first * TPB, layer, 0))
        assert eng.stats()["checksum_verified"] >= 6
    assert os.listdir(tmp_path) == []  # removed by close


def test_errors_carry_code_and_message(engine):
    with pytest.raises(kvtier.InvalidArgumentError) as ei:
        kvtier.Engine(n_layers=0, n_kv_heads=2, head_dim=8, hbm_bytes=1 << 20)
    e = ei.value
    assert e.code == -errno.EINVAL and isinstance(e, ValueError)
    assert e.name == "invalid argument" and "n_layers" in e.message
    assert "kvt_engine_create" in str(e)
    seq = engine.open_sequence()
    with pytest.raises(kvtier.InvalidArgumentError):
        seq.park(7)
    with pytest.raises(kvtier.InvalidArgumentError):
        engine.prepare([seq, seq])
    with pytest.raises(kvtier.TooBigError):
        seq.append(range(9 * TPB))  # more blocks than HBM has slots
    with pytest.raises(kvtier.ClosedError) as ei:
        engine.sequence(12345).info()
    assert ei.value.code == kvtier.ECLOSED
    with pytest.raises(kvtier.InvalidArgumentError):
        engine.write_kv(0, 0, b"short", b"short")
    with pytest.raises(TypeError):
        kvtier.Engine(n_layers=1, n_kv_heads=1, head_dim=8, hbm_bytes=1 << 20, bogus=1)
    # the engine stays usable after every failure
    write_tokens(engine, seq, 1, 0, 3)
    with engine.prepare([seq]) as b:
        check_tokens(b, 0, 1, 3)


def test_stream(engine):
    seq = engine.open_sequence()
    write_tokens(engine, seq, 2, 0, 5)
    with engine.stream() as st:
        b = engine.prepare([seq])
        for layer in range(LAYERS):
            b.wait_layer(layer, st.handle)  # the stream waits, the host does not
        st.sync()
        check_tokens(b, 0, 2, 5)
        b.release(st.handle)
        seq.park(kvtier.TIER_HOST)  # copies ordered after the stream's work
        engine.drain()
    with pytest.raises(kvtier.ClosedError):
        st.sync()
    with engine.prepare([seq]) as b:
        check_tokens(b, 0, 2, 5)


def test_close_engine_under_live_objects():
    eng = kvtier.Engine(n_layers=1, n_kv_heads=1, head_dim=8, dtype="f32",
                        tokens_per_block=4, hbm_bytes=4096)
    seq = eng.open_sequence()
    seq.append([1, 2])
    batch = eng.prepare([seq])
    eng.close()
    eng.close()
    assert eng.closed
    for call in (lambda: seq.info(), lambda: batch.block_table(), lambda: eng.stats(),
                 lambda: eng.open_sequence()):
        with pytest.raises(kvtier.ClosedError):
            call()
    batch.release()  # nothing left to do, no crash
    seq.close()


def test_threads(engine):
    errors = []

    def worker(tag):
        try:
            for _ in range(20):
                with engine.open_sequence() as s:
                    s.append([tag])
                    engine.prepare([s]).release()
        except Exception as ex:  # pragma: no cover - reported below
            errors.append(ex)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # -ENOSPC is allowed under contention (HBM pinned by the others); nothing else
    assert all(isinstance(e, kvtier.NoSpaceError) for e in errors), errors
    assert engine.stats()["seqs_open"] == 0


def test_bad_engine_arguments_are_invalid_argument_errors():
    with pytest.raises(kvtier.InvalidArgumentError, match="unknown dtype 'fp7'.*bf16"):
        kvtier.Engine(n_layers=2, n_kv_heads=1, head_dim=8, dtype="fp7", hbm_bytes=1 << 20)
    with pytest.raises(kvtier.InvalidArgumentError, match=r"hbm_bytes .* got -1 \("):
        kvtier.Engine(n_layers=2, n_kv_heads=1, head_dim=8, hbm_bytes=-1)
    with pytest.raises(kvtier.InvalidArgumentError, match="n_layers .* got 2.5"):
        kvtier.Engine(n_layers=2.5, n_kv_heads=1, head_dim=8, hbm_bytes=1 << 20)
    with pytest.raises(kvtier.KvtierError):
        kvtier.Engine(n_layers=2, n_kv_heads=1, head_dim=8, hbm_bytes=1 << 20, host_bytes=-5)


def test_library_found_in_the_repository_build_dir(root, tmp_path):
    """Without KVTIER_LIBRARY the binding loads ../build/libkvtier.so of its repository; when
    nothing is found the error names the paths tried and KVTIER_LIBRARY."""
    import ctypes.util
    import shutil
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "KVTIER_LIBRARY"}
    code = "import sys; sys.path.insert(0, sys.argv[1]); import kvtier; print(kvtier.lib._name)"
    built = os.path.join(root, "build", "libkvtier.so")
    if os.path.exists(built):
        r = subprocess.run([sys.executable, "-c", code, os.path.join(root, "tools", "python")],
                           env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == built
    if ctypes.util.find_library("kvtier"):
        pytest.skip("a libkvtier is installed system-wide")
    # a copy laid out as in a repository (tools/python/kvtier) with no build beside it
    pkg = tmp_path / "repo" / "tools" / "python"
    shutil.copytree(os.path.join(root, "tools", "python", "kvtier"), pkg / "kvtier")
    r = subprocess.run([sys.executable, "-c", code, str(pkg)], env=env,
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "libkvtier.so not found" in r.stderr and "KVTIER_LIBRARY=" in r.stderr
    assert str(tmp_path / "repo" / "build" / "libkvtier.so") in r.stderr


def test_hint_then_prepare_more_nvme_blocks_than_host_slots(tmp_path):
    """Two sequences of 5 blocks parked on NVMe, HOST 3 slots, HBM 32: hint them, then
    prepare them. The prepare should succeed (HBM has room; HOST is only staging)."""
    tpb, blk = 16, 2 * 2 * 16 * 8 * 4
    with kvtier.Engine(n_layers=2, n_kv_heads=1, head_dim=8, dtype="f32", tokens_per_block=tpb,
                       hbm_bytes=32 * blk, host_bytes=3 * blk, nvme_dir=str(tmp_path),
                       nvme_bytes=1 << 22) as eng:
        seqs = [eng.open_sequence() for _ in range(2)]
        for s in seqs:
            s.append(list(range(80)))
        eng.prepare(seqs).release()
        for s in seqs:
            s.park(kvtier.TIER_NVME)
        eng.drain()
        eng.hint(seqs, steps_ahead=1)
        eng.prepare(seqs).release()


def test_append_rejects_non_integers(engine):
    """A float token is not truncated into an int: TypeError; out of int32: ValueError; in
    both cases nothing is appended. Python ints and numpy integer arrays are accepted."""
    seq = engine.open_sequence()
    for bad in ([1.5], [1, 2.0], ["3"], np.array([1.5, 2.5]), [None]):
        with pytest.raises(TypeError, match="not an integer"):
            seq.append(bad)
    for bad in ([1 << 31], [-(1 << 31) - 1], np.array([1 << 40], dtype=np.int64)):
        with pytest.raises(ValueError, match="outside int32"):
            seq.append(bad)
    assert seq.info()["n_tokens"] == 0
    assert len(seq.append(np.arange(3, dtype=np.int32))) == 3
    assert len(seq.append([(1 << 31) - 1, -(1 << 31), np.int64(7)])) == 3
    assert seq.info()["n_tokens"] == 6
    seq.close()


def test_stats_blocks_moved_named(engine):
    """stats()["blocks_moved"] and ["bytes_moved"] are dicts keyed by direction, and such a
    snapshot still converts back (stats_metrics_text)."""
    seq = engine.open_sequence()
    write_tokens(engine, seq, 1, 0, 8)
    seq.park(kvtier.TIER_HOST)
    engine.drain()
    st = engine.stats()
    for key in ("blocks_moved", "bytes_moved"):
        assert isinstance(st[key], dict)
        assert tuple(st[key]) == kvtier.MOVE_NAMES
    assert st["blocks_moved"]["hbm_to_host"] == 2
    assert st["bytes_moved"]["hbm_to_host"] == 2 * 1024
    text = kvtier.stats_metrics_text(st)
    assert 'kvtier_blocks_moved_total{direction="hbm_to_host"} 2\n' in text
    assert 'kvtier_moved_bytes_total{direction="hbm_to_host"} 2048\n' in text
    seq.close()
