# SPDX-License-Identifier: MIT
"""The 0.2 API through the binding: engine and sequence options as keyword arguments, prefix
sharing (match_prefix -> (tokens, tier), attach_prefix), schedule hints, priorities under the
"prio" policy, tenant budgets, persistent sessions across an engine restart, metrics of a
stats snapshot."""
import errno
import os

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

import kvtier
from test_binding import DIM, HEADS, LAYERS, TPB, check_tokens, pattern

BLOCK = LAYERS * 2 * TPB * HEADS * DIM * 4  # 1024 bytes


def engine(tmp_path=None, hbm_blocks=8, host_blocks=16, **kw):
    if tmp_path is not None:
        kw.setdefault("nvme_dir", str(tmp_path))
        kw.setdefault("nvme_bytes", 64 * 4096)
    return kvtier.Engine(n_layers=LAYERS, n_kv_heads=HEADS, head_dim=DIM, dtype="f32",
                         tokens_per_block=TPB, hbm_bytes=hbm_blocks * BLOCK,
                         host_bytes=host_blocks * BLOCK, high_watermark=1.0,
                         low_watermark=1.0, **kw)


def fill(eng, seq, tag, tokens, first=0):
    """Append @tokens[first:] with K/V pattern(tag, position), then prepare and release
    (which seals full blocks: they become shareable)."""
    slots = seq.append(tokens[first:])
    for i, m in enumerate(slots):
        for layer in range(LAYERS):
            eng.write_kv(m, layer, pattern(tag, first + i, layer, 0),
                         pattern(tag, first + i, layer, 1))
    eng.prepare([seq]).release()


def test_options_as_keywords(tmp_path):
    with engine(tmp_path, nvme_codec="shuf_lz4", nvme_codec_min_saving=0.0,
                evict_policy="lru", idle_timeout_ms=0, idle_target="nvme",
                prefix_cache=True, nvme_buffered_fallback=True) as eng:
        seq = eng.open_sequence(tenant=2, priority=80, session_key=0, retention_ms=1000,
                                salt=7, extra_key=9)
        assert (seq.info()["tenant"], seq.info()["priority"]) == (2, 80)
        fill(eng, seq, 1, list(range(8)))
        seq.park(kvtier.TIER_NVME)
        eng.drain()
        st = eng.stats()
        assert st["codec_raw_bytes"] == 2 * BLOCK  # the codec saw both blocks
        with eng.prepare([seq]) as b:
            check_tokens(b, 0, 1, 8)  # and decoded them
    for bad in ({"evict_policy": "fifo"}, {"nvme_codec": "zstd"}, {"evict_policy": 9},
                {"idle_target": "hbm"}):
        with pytest.raises(kvtier.InvalidArgumentError):
            engine(**bad)
    with pytest.raises(TypeError):
        engine(layout=None)
    with engine() as eng:
        with pytest.raises(TypeError):
            eng.open_sequence(bogus=1)
        with pytest.raises(kvtier.InvalidArgumentError):
            eng.open_sequence(priority=101)


def test_option_names_errors_and_spellings(tmp_path):
    """An unknown tier name lists the valid ones (not tuple.index's ValueError); codec names
    take kvtier-bench's hyphen spelling too."""
    with pytest.raises(kvtier.InvalidArgumentError,
                       match=r"idle_target 'disk': one of \['hbm', 'host', 'nvme'\]"):
        engine(idle_target="disk")
    with engine() as eng, eng.open_sequence() as seq:
        with pytest.raises(kvtier.InvalidArgumentError, match=r"tier 'disk': one of"):
            seq.park("disk")
    for name in ("shuf-lz4", "cshuf-lz4"):
        with engine(tmp_path, nvme_codec=name, nvme_codec_min_saving=0.0) as eng:
            seq = eng.open_sequence()
            fill(eng, seq, 1, list(range(8)))
            seq.park(kvtier.TIER_NVME)
            eng.drain()
            assert eng.stats()["codec_raw_bytes"] == 2 * BLOCK  # the codec is on
            seq.close()
    with pytest.raises(kvtier.InvalidArgumentError, match=r"nvme_codec 'shuf--lz4': one of"):
        engine(nvme_codec="shuf--lz4")


def test_prefix_sharing():
    with engine() as eng:
        prompt = list(range(100, 112))  # 3 blocks
        a = eng.open_sequence()
        assert eng.match_prefix(prompt) == (0, None)
        fill(eng, a, 5, prompt[:10])  # 2 sealed blocks + a partial one
        assert eng.match_prefix(prompt) == (8, kvtier.TIER_HBM)
        assert eng.match_prefix(prompt[:7]) == (4, kvtier.TIER_HBM)
        assert eng.match_prefix([1] + prompt[1:]) == (0, None)  # keys chain from block 0
        assert eng.match_prefix(prompt, tenant=1) == (0, None)  # another tenant's salt
        assert eng.match_prefix(prompt, extra_key=3) == (0, None)
        a.park(kvtier.TIER_HOST)
        eng.drain()
        assert eng.match_prefix(prompt) == (8, kvtier.TIER_HOST)  # where it comes from
        b = eng.open_sequence()
        assert b.attach_prefix(prompt) == 8
        assert b.info()["n_tokens"] == 8 and b.info()["n_blocks"] == 2
        with pytest.raises(kvtier.InvalidArgumentError):
            b.attach_prefix(prompt)  # not empty any more
        fill(eng, b, 6, prompt, first=8)  # prefill only the rest
        with eng.prepare([b]) as batch:
            t = batch.block_table()
            for layer in range(LAYERS):
                batch.wait_layer(layer)
                k, v = batch.kv(0, layer, t)
                for pos in range(12):  # shared positions hold a's K/V, the rest b's
                    tag = 5 if pos < 8 else 6
                    np.testing.assert_array_equal(k[pos].reshape(-1),
                                                  pattern(tag, pos, layer, 0))
                    np.testing.assert_array_equal(v[pos].reshape(-1),
                                                  pattern(tag, pos, layer, 1))
        st = eng.stats()
        assert st["prefix_hit_tokens"] == 8 and st["prefix_hit_blocks"] == 2
        assert st["shared_blocks"] == 2
        c = eng.open_sequence(tenant=1)
        assert c.attach_prefix(prompt) == 0  # tenants do not share by default
        d = eng.open_sequence(tenant=1, salt=a.info()["tenant"] + 12345)
        assert d.attach_prefix(prompt) == 0
        a.close()
        b.close()
        with pytest.raises(kvtier.ClosedError):
            b.attach_prefix(prompt)


def test_hints():
    with engine(hbm_blocks=4) as eng:
        seq = eng.open_sequence()
        fill(eng, seq, 3, list(range(12)))  # 3 blocks
        seq.park("host")
        eng.drain()
        assert seq.info()["blocks_in"][kvtier.TIER_HBM] == 0
        eng.hint([seq], steps_ahead=1)
        eng.drain()
        assert seq.info()["blocks_in"][kvtier.TIER_HBM] == 3  # promoted ahead of prepare
        with eng.prepare([seq]) as b:
            check_tokens(b, 0, 3, 12)
        seq.park("host")
        eng.drain()
        eng.hint(ranges=[(seq, 1, 1)])  # only block 1
        eng.drain()
        assert seq.info()["blocks_in"][kvtier.TIER_HBM] == 1
        st = eng.stats()
        assert st["hints"] == 2
        assert st["tier"][kvtier.TIER_HBM]["bytes_prefetched"] >= 4 * BLOCK
        big = eng.open_sequence()
        fill(eng, big, 4, list(range(500, 508)))
        with pytest.raises(kvtier.TooBigError):
            eng.hint([seq, big], steps_ahead=0)  # 5 blocks > 4 HBM slots
        eng.hint([seq, big], steps_ahead=2)  # later: NVMe reads only, no HBM needed
        with pytest.raises(kvtier.InvalidArgumentError):
            eng.hint(ranges=[(seq, 5, 1)])  # past the end
        big_id = big.id
        big.close()
        with pytest.raises(kvtier.ClosedError) as ei:
            eng.hint([seq, big_id])  # an id used again: the library says ECLOSED
        assert ei.value.code == kvtier.ECLOSED and "kvt_engine_hint" in str(ei.value)


def test_priorities_decide_eviction():
    with engine(hbm_blocks=4, evict_policy="prio") as eng:
        a, b = eng.open_sequence(), eng.open_sequence()
        fill(eng, a, 1, list(range(0, 4)))
        fill(eng, b, 2, list(range(10, 14)))
        a.set_priority(100)  # a is older: LRU alone would evict it first
        c = eng.open_sequence()
        fill(eng, c, 3, list(range(20, 32)))  # 3 blocks: one of a, b must leave HBM
        assert a.info()["blocks_in"][kvtier.TIER_HBM] == 1
        assert b.info()["blocks_in"][kvtier.TIER_HBM] == 0
        with pytest.raises(kvtier.InvalidArgumentError):
            a.set_priority(101)
        with pytest.raises(kvtier.InvalidArgumentError):
            a.set_priority(10, first_token=40, n_tokens=1)  # past the end
        a.set_priority(10, first_token=0, n_tokens=4, duration_ms=60000)


def test_tenant_budgets():
    with engine() as eng:
        eng.set_tenant_budget(5, "hbm", 1)
        assert eng.tenant_usage(5) == [0, 0, 0]
        seq = eng.open_sequence(tenant=5)
        fill(eng, seq, 1, list(range(8)))  # 2 blocks; the release enforces the budget
        eng.drain()
        used = eng.tenant_usage(5)
        assert used[kvtier.TIER_HBM] <= 1 and used[kvtier.TIER_HOST] >= 1
        with pytest.raises(kvtier.NotFoundError) as ei:
            eng.tenant_usage(6)
        assert ei.value.code == -errno.ENOENT and isinstance(ei.value, LookupError)
        with pytest.raises(kvtier.InvalidArgumentError):
            eng.set_tenant_budget(5, 7, 1)
        with eng.prepare([seq]) as b:  # over budget is soft: the batch still gets HBM
            check_tokens(b, 0, 1, 8)


def test_persistent_sessions(tmp_path):
    opts = dict(nvme_persist=True, nvme_codec="shuf_lz4")
    with engine(tmp_path, **opts) as eng:
        assert eng.session_list() == []
        for key, tag in ((42, 7), (43, 8)):
            seq = eng.open_sequence(session_key=key)
            fill(eng, seq, tag, list(range(key, key + 10)))
            seq.park(kvtier.TIER_NVME)  # published once durable
        eng.drain()
        assert eng.session_list() == []  # open here: not restorable
    assert sorted(os.listdir(tmp_path)) == ["kvtier.journal", "kvtier.store"]
    with engine(tmp_path, **opts) as eng:  # "after a restart"
        assert sorted(eng.session_list()) == [42, 43]
        assert sorted(eng.session_list(tenant=0)) == [42, 43] and eng.session_list(tenant=5) == []
        with pytest.raises(kvtier.KvtierError) as ei:  # stored for tenant 0: not tenant 5's
            eng.restore(42, tenant=5)
        assert ei.value.code == -errno.EPERM
        with pytest.raises(kvtier.KvtierError) as ei:
            eng.drop_session(43, tenant=5)
        assert ei.value.code == -errno.EPERM
        seq = eng.restore(42, tenant=0)
        info = seq.info()
        assert info["n_tokens"] == 10 and info["parked"] == 1
        assert info["blocks_in"][kvtier.TIER_NVME] == 3
        with eng.prepare([seq]) as b:
            check_tokens(b, 0, 7, 10)  # read back, checksums verified
        assert eng.stats()["checksum_verified"] >= 3
        assert eng.session_list() == [43]
        with pytest.raises(kvtier.BusyError):
            eng.restore(42)
        eng.drop_session(43)
        assert eng.session_list() == []
        with pytest.raises(kvtier.NotFoundError) as ei:
            eng.restore(43)
        assert ei.value.code == -errno.ENOENT and "kvt_seq_restore" in str(ei.value)
        with pytest.raises(kvtier.NotFoundError):
            eng.drop_session(43)
    with pytest.raises(kvtier.CorruptError) as ei:  # a store made for another layout
        kvtier.Engine(n_layers=LAYERS, n_kv_heads=HEADS, head_dim=2 * DIM, dtype="f32",
                      tokens_per_block=TPB, hbm_bytes=16 * BLOCK, host_bytes=16 * BLOCK,
                      nvme_dir=str(tmp_path),
                      nvme_bytes=64 * 4096, nvme_persist=True)
    assert ei.value.code == kvtier.EFORMAT and ei.value.message


def test_stats_snapshot_metrics():
    with engine() as eng:
        seq = eng.open_sequence()
        fill(eng, seq, 1, list(range(6)))
        st = eng.stats()
    assert eng.closed
    fams = {f.name: f for f in text_string_to_metric_families(kvtier.stats_metrics_text(st))}
    cap = {s.labels["tier"]: s.value for s in fams["kvtier_tier_capacity_bytes"].samples}
    assert cap == {"hbm": 8 * BLOCK, "host": 16 * BLOCK, "nvme": 0}
    assert fams["kvtier_sequences_open"].samples[0].value == 1
