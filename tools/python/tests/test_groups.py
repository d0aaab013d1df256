# SPDX-License-Identifier: MIT
"""Layer groups through the binding (issue 16): an engine of FULL (own V width), LATENT,
WINDOW and ALIAS groups, per-group geometry and layer map, append_groups' per-group slot
mappings, K/V bytes through each group's table after offload and a park to NVMe, bad
descriptors as InvalidArgumentError, per-group stats and a persistent session restored."""
import ctypes

import numpy as np
import pytest

import kvtier

TPB = 4
GROUPS = [
    {"kind": "full", "layers": [0, 2], "n_kv_heads": 2, "head_dim": 8, "v_head_dim": 4,
     "dtype": "f32"},
    {"kind": "latent", "layers": [1], "latent_dim": 24, "dtype": "f32"},
    {"kind": "window", "layers": [3], "n_kv_heads": 1, "head_dim": 8, "window": 8, "sink": 4,
     "dtype": "f32"},
    {"kind": "alias", "layers": [4], "alias_of": [2]},
]
BB = [TPB * (16 + 8) * 4 * 2, TPB * 24 * 4, TPB * 16 * 4]


def engine(blocks=12, host=12, **kw):
    s = sum(BB)
    groups = [dict(g) for g in GROUPS]
    for i in range(3):
        groups[i]["share"] = BB[i] / s
    return kvtier.Engine(n_layers=5, n_kv_heads=0, head_dim=0, tokens_per_block=TPB,
                         hbm_bytes=int((blocks + 0.5) * s),
                         host_bytes=int((host + 0.5) * s) if host else 0, groups=groups,
                         **kw)


def val(tag, pos, g, layer, n, v):
    return (np.arange(n, dtype=np.float32) * 3 + tag * 1009 + pos * 31 + g * 7 + layer * 5
            + v).astype(np.float32)


def write(eng, slots, tag, first):
    for g, mapping in enumerate(slots):
        if not mapping:
            continue
        geo = eng.group_geometry(g)
        for i, m in enumerate(mapping):
            for layer in range(geo["n_layers"]):
                k, v = kvtier.group_kv_addr(geo, layer, m)
                a = val(tag, first + i, g, layer, geo["k_token_bytes"] // 4, 0)
                ctypes.memmove(k, a.ctypes.data, a.nbytes)
                if v is not None:
                    b = val(tag, first + i, g, layer, geo["v_token_bytes"] // 4, 1)
                    ctypes.memmove(v, b.ctypes.data, b.nbytes)


def check(batch, i, tag):
    for layer in range(5):
        batch.wait_layer(layer)
    for g in range(3):
        t = batch.group_table(g)
        geo = t.geo
        for e in range(t.indptr[i], t.indptr[i + 1]):
            n = t.last_block_len[i] if e + 1 == t.indptr[i + 1] else TPB
            for tok in range(n):
                pos = t.block_pos[e] * TPB + tok
                for layer in range(geo["n_layers"]):
                    base = (geo["hbm_base"] + t.indices[e] * geo["block_bytes"]
                            + layer * geo["layer_block_bytes"])
                    nk = geo["k_token_bytes"] // 4
                    k = np.frombuffer(ctypes.string_at(base + tok * geo["k_token_bytes"],
                                                       nk * 4), np.float32)
                    assert (k == val(tag, pos, g, layer, nk, 0)).all()
                    if geo["v_token_bytes"]:
                        nv = geo["v_token_bytes"] // 4
                        v = np.frombuffer(ctypes.string_at(
                            base + geo["v_offset"] + tok * geo["v_token_bytes"], nv * 4),
                            np.float32)
                        assert (v == val(tag, pos, g, layer, nv, 1)).all()


def test_geometry_and_layer_map():
    with engine() as eng:
        assert eng.n_groups == 4
        full, lat, win, ali = (eng.group_geometry(g) for g in range(4))
        assert full["k_token_bytes"] == 64 and full["v_token_bytes"] == 32
        assert full["block_bytes"] == BB[0] and full["hbm_slots"] == 12
        assert lat["v_token_bytes"] == 0 and lat["block_bytes"] == BB[1]
        assert win["window"] == 8 and win["sink"] == 4
        assert ali["kind"] == kvtier.GROUP_ALIAS and ali["block_bytes"] == 0
        assert [eng.layer_group(layer) for layer in range(5)] == [(0, 0), (1, 0), (0, 1),
                                                                  (2, 0), (0, 1)]
        with pytest.raises(kvtier.InvalidArgumentError, match="kvt_group_geometry"):
            eng.geometry()
        st = eng.stats()
        assert st["tier"][0]["slots"] == 36
        assert sum(eng.group_stats(g)["tier"][0]["slots"] for g in range(4)) == 36


def test_bytes_per_group_through_offload(tmp_path):
    with engine(nvme_dir=str(tmp_path), nvme_bytes=4 << 20) as eng:
        seqs = []
        for tag in (1, 2, 3):
            seq = eng.open_sequence()
            for first in range(0, 40, 10):
                slots = seq.append_groups(list(range(first, first + 10)))
                assert len(slots) == 4 and slots[3] == [] and len(slots[0]) == 10
                write(eng, slots, tag, first)
                eng.prepare([seq]).release()
            seqs.append(seq)
        for tag, seq in zip((1, 2, 3), seqs):
            with eng.prepare([seq]) as b:
                check(b, 0, tag)
        seqs[0].park(kvtier.TIER_NVME)
        eng.drain()
        # FULL and LATENT keep all 10 blocks; the WINDOW group (window 8, sink 4) keeps its
        # sink block and the blocks the last append's first query (position 30) still reads:
        # block j is dropped when (j + 1) * TPB <= 30 + 1 - 8 (engine/window.c)
        win_live = sum(1 for j in range(10) if j == 0 or (j + 1) * TPB > 30 + 1 - 8)
        assert win_live == 6
        assert seqs[0].info()["blocks_in"][kvtier.TIER_NVME] == 10 + 10 + win_live
        with eng.prepare([seqs[0]]) as b:
            check(b, 0, 1)
            assert b.group_table(3).group == 0
        with pytest.raises(kvtier.InvalidArgumentError, match="kvt_seq_append_groups"):
            seqs[1].append([1])


@pytest.mark.parametrize("change,msg", [
    (lambda g: g[1].update(layers=[0]), "model layer 0 is in group 0 and in group 1"),
    (lambda g: g[3].update(alias_of=[4]), "is an alias of itself"),
    (lambda g: g[2].update(window=0), "needs window >= 1"),
    (lambda g: g.pop(), "model layer 4 is in no group"),
])
def test_bad_descriptors(change, msg):
    groups = [dict(g) for g in GROUPS]
    change(groups)
    with pytest.raises(kvtier.InvalidArgumentError, match=msg):
        kvtier.Engine(n_layers=5, n_kv_heads=0, head_dim=0, tokens_per_block=TPB,
                      hbm_bytes=1 << 20, groups=groups)
    with pytest.raises(kvtier.InvalidArgumentError, match="unknown kind"):
        kvtier.Engine(n_layers=1, n_kv_heads=0, head_dim=0, hbm_bytes=1 << 20,
                      groups=[{"kind": "mamba", "layers": [0]}])
    with pytest.raises(kvtier.InvalidArgumentError, match="n_state 0 out of range"):
        kvtier.Engine(n_layers=1, n_kv_heads=0, head_dim=0, hbm_bytes=1 << 20,
                      groups=[{"kind": "state", "layers": [0]}])
    with pytest.raises(kvtier.InvalidArgumentError, match="parent 0 is not another group"):
        kvtier.Engine(n_layers=1, n_kv_heads=0, head_dim=0, hbm_bytes=1 << 20,
                      groups=[{"kind": "sidecar", "layers": [0]}])


def test_state_group():
    """A STATE group through the binding: the tensors' place in a block, the geometry."""
    groups = [{"kind": "full", "layers": [1], "n_kv_heads": 1, "head_dim": 4, "dtype": "f32"},
              {"kind": "state", "layers": [0, 2],
               "state": [{"shape": [3], "dtype": "f16"}, {"shape": [2, 5], "dtype": "f32"}]}]
    with kvtier.Engine(n_layers=3, n_kv_heads=0, head_dim=0, tokens_per_block=4,
                       hbm_bytes=1 << 20, groups=groups) as eng:
        assert eng.group_state_tensor(1, 0) == (0, 6)
        assert eng.group_state_tensor(1, 1) == (8, 40)
        geo = eng.group_geometry(1)
        assert geo["layer_block_bytes"] == 48 and geo["block_bytes"] == 96
        assert eng.layer_group(2) == (1, 1)
        with pytest.raises(kvtier.InvalidArgumentError, match="FULL group, not STATE"):
            eng.group_state_tensor(0, 0)
        seq = eng.open_sequence()
        seq.checkpoint(8)  # every block is kept by default: nothing to do
        with pytest.raises(kvtier.InvalidArgumentError, match="no block boundary"):
            seq.checkpoint(3)
        seq.close()
    with pytest.raises(kvtier.InvalidArgumentError, match="5 state tensors"):
        kvtier.Engine(n_layers=1, n_kv_heads=0, head_dim=0, hbm_bytes=1 << 20,
                      groups=[{"kind": "state", "layers": [0],
                               "state": [{"shape": [1]}] * 5}])


def test_persistent_session_restored(tmp_path):
    kw = dict(nvme_dir=str(tmp_path), nvme_bytes=4 << 20, nvme_persist=True)
    with engine(**kw) as eng:
        seq = eng.open_sequence(session_key=77)
        slots = seq.append_groups(list(range(10)))
        write(eng, slots, 5, 0)
        eng.prepare([seq]).release()
        seq.park(kvtier.TIER_NVME)
        eng.drain()
        seq.detach()
    with engine(**kw) as eng:
        assert eng.session_list() == [77]
        seq = eng.restore(77)
        assert seq.info()["n_tokens"] == 10
        with eng.prepare([seq]) as b:
            check(b, 0, 5)


def test_sidecar_group():
    """A SIDECAR group through the binding: its bytes in the parent's blocks, written through
    the parent's slot mapping and read back from the mirror, after a park to HOST too."""
    groups = [{"kind": "full", "layers": [0, 1], "n_kv_heads": 1, "head_dim": 4,
               "dtype": "f32"},
              {"kind": "sidecar", "parent": 0, "sidecar_token_bytes": 8,
               "sidecar_block_bytes": 16}]
    with kvtier.Engine(n_layers=2, n_kv_heads=0, head_dim=0, tokens_per_block=4,
                       hbm_bytes=1 << 20, host_bytes=1 << 20, groups=groups) as eng:
        off, tb, bb = eng.group_sidecar(1)
        assert (off, tb, bb) == (4 * 2 * 4 * 4, 8, 16)
        geo = eng.group_geometry(1)
        assert geo["kind"] == kvtier.GROUP_KINDS["sidecar"]
        assert geo["layer_block_bytes"] == off + 4 * tb + bb
        seq = eng.open_sequence()
        maps = seq.append_groups(list(range(6)))
        assert list(maps[1]) == list(maps[0])
        # written after the append, before the batch's release (kvtier.h contract)
        base, lbb, blk = geo["hbm_base"], geo["layer_block_bytes"], geo["block_bytes"]
        for t, m in enumerate(maps[0]):
            for layer in range(2):
                addr = base + (m // 4) * blk + layer * lbb + off + (m % 4) * tb
                ctypes.memmove(addr, bytes([t + 10 * layer + 1]) * tb, tb)
        with eng.prepare([seq]):
            pass
        seq.park("host")
        eng.drain()
        got = seq.sidecar(1, 1, 0, 2)
        assert len(got) == 2 * (4 * tb + bb)
        assert got[:tb] == bytes([11]) * tb
        assert got[4 * tb + bb + tb:4 * tb + bb + 2 * tb] == bytes([16]) * tb
        with pytest.raises(kvtier.InvalidArgumentError, match="FULL group, not SIDECAR"):
            seq.sidecar(0, 0, 0, 1)
        # the selected block alone, in the parent's pool (through the sidecar's id)
        with eng.prepare(None, ranges=[(seq, 1, 1)], group=1) as b:
            assert list(b.group_table(1).block_pos) == [1]
        seq.close()


def test_summary_sidecar():
    """kvtier's own Quest summary of K per block (sidecar_summary 1): min and max per channel."""
    groups = [{"kind": "full", "layers": [0], "n_kv_heads": 1, "head_dim": 2, "dtype": "f32"},
              {"kind": "sidecar", "parent": 0, "sidecar_summary": 1}]
    with kvtier.Engine(n_layers=1, n_kv_heads=0, head_dim=0, tokens_per_block=4,
                       hbm_bytes=1 << 20, groups=groups) as eng:
        assert eng.group_sidecar(1)[1:] == (0, 16)  # nothing in the block: the mirror only
        geo = eng.group_geometry(0)
        seq = eng.open_sequence()
        maps = seq.append_groups([1, 2, 3])
        vals = [(1.0, -4.0), (-2.0, 5.0), (0.5, 0.25)]
        for m, kv in zip(maps[0], vals):
            addr = geo["hbm_base"] + (m // 4) * geo["block_bytes"] + (m % 4) * geo["k_token_bytes"]
            ctypes.memmove(addr, np.array(kv, dtype=np.float32).tobytes(), 8)
        with eng.prepare([seq]):
            pass
        got = np.frombuffer(seq.sidecar(1, 0, 0, 1), dtype=np.float32)
        assert list(got) == [-2.0, -4.0, 1.0, 5.0]
        seq.close()


def test_external_pool_per_group():
    """ExternalPool(layer_group=g) on a grouped Engine: one pool per storage group with that
    group's geometry (group 0: 2 layers of K 256 B + V 128 B; group 1: a latent of 384 B), the
    same hashes in both groups independent, the ALIAS group refused."""
    eng = engine()
    nb = 8
    geo = [eng.group_geometry(g) for g in range(2)]
    kb = [geo[0]["k_token_bytes"] * TPB, geo[1]["k_token_bytes"] * TPB]
    vb = geo[0]["v_token_bytes"] * TPB
    m0 = [np.zeros((2, nb, kb[0]), dtype=np.uint8) for _ in range(2)]
    m1 = np.zeros((nb, kb[1]), dtype=np.uint8)
    l0 = [kvtier.ext_layer(m.ctypes.data, kb[0], kb[0], vb, v_offset=nb * kb[0]) for m in m0]
    l1 = [kvtier.ext_layer(m1.ctypes.data, kb[1], kb[1], 0)]
    with eng, kvtier.ExternalPool(eng, nb, l0, layer_group=0) as p0, \
            kvtier.ExternalPool(eng, nb, l1, layer_group=1) as p1:
        assert (p0.pool, p1.pool) == (1, 2)
        with pytest.raises(kvtier.InvalidArgumentError, match="ALIAS"):
            kvtier.ExternalPool(eng, nb, l1, layer_group=3)
        with pytest.raises(kvtier.KvtierError):
            kvtier.ExternalPool(eng, nb, l1, layer_group=1)  # one pool per group
        for i in range(3):
            for m in m0:
                m[0, i] = (np.arange(kb[0]) * 3 + i) % 251
                m[1, i, :vb] = (np.arange(vb) * 5 + i) % 253
            m1[i] = (np.arange(kb[1]) * 7 + i + 100) % 249
        hashes = [11, 22, 33]
        for p in (p0, p1):
            j = p.store(hashes, [0, 1, 2])
            assert p.wait(j, 60000)
            assert all(d.ok for d in p.poll())
        assert p0.lookup(hashes) == 3 and p1.lookup(hashes) == 3
        assert p0.drop([22]) == 1
        assert p0.lookup(hashes) == 1 and p1.lookup(hashes) == 3
        j = p1.load(hashes, [5, 6, 7])
        assert p1.wait(j, 60000)
        assert all(d.ok for d in p1.poll())
        assert (m1[5:8] == m1[0:3]).all()
        j = p0.load(hashes[:1], [4])
        assert p0.wait(j, 60000)
        assert all(d.ok for d in p0.poll())
        assert all((m[0, 4] == m[0, 0]).all() and (m[1, 4, :vb] == m[1, 0, :vb]).all()
                   for m in m0)
