# SPDX-License-Identifier: MIT
"""KvtierOffloadingManager's mirror of what kvtier holds (kvt_ext_removed): vLLM asks
lookup() one key at a time, and the manager answers from the mirror; these tests check that
it never answers HIT for a block kvtier evicted or dropped, never MISS for one it holds
(also one stored by another manager, as after a restart), and that an overflowed removal
ring (lost removals) is handled by dropping the mirror, not by trusting it."""
import hashlib
import types

import numpy as np
import pytest

vllm_base = pytest.importorskip("vllm.v1.kv_offload.base")

import kvtier  # noqa: E402
from kvtier._store import close_store, shared_store  # noqa: E402
from kvtier.vllm.spec import KvtierOffloadingManager  # noqa: E402

LookupResult = vllm_base.LookupResult
ReqContext = vllm_base.ReqContext
BLOCK = 64


def _keys(n, seed):
    h = seed.to_bytes(32, "little")
    out = []
    for _ in range(n):
        h = hashlib.sha256(h).digest()
        out.append(vllm_base.make_offload_key(h, 0))
    return out


@pytest.fixture
def store(request):
    name = f"mirror-{request.node.name}"
    host_blocks, cap = getattr(request, "param", (16, 0))
    buf = np.zeros((64, BLOCK), dtype=np.uint8)
    st = shared_store(name, block_bytes=BLOCK, host_bytes=host_blocks * BLOCK)
    pool = st.register(64, [kvtier.ext_layer(buf.ctypes.data, BLOCK, BLOCK)], removed_cap=cap)
    spec = types.SimpleNamespace(blocks_per_chunk=1, extra_config={"kvtier_store_name": name},
                                 config=types.SimpleNamespace(engine_id=name))
    yield st, pool, spec, buf
    close_store(name)


def _store_keys(m, pool, keys, first_id=0):
    """What the worker does for a store job, then the scheduler's complete_store."""
    out = m.prepare_store(keys, ReqContext(req_id="store"))
    hs = [m.hashes(k)[0] for k in out.keys_to_store]
    if hs:
        job = pool.store(hs, [first_id + i for i in range(len(hs))])
        assert pool.wait(job, 60000)
        pool.poll()
    m.complete_store(out.keys_to_store, ReqContext(req_id="store"))
    return out.keys_to_store


def _truth(m, pool, keys):
    return [pool.lookup(m.hashes(k)) == 1 for k in keys]


def _answers(m, keys, req):
    ctx = ReqContext(req_id=req)
    return [m.lookup(k, ctx) is LookupResult.HIT for k in keys]


def test_mirror_follows_evictions(store):
    st, pool, spec, _ = store
    m = KvtierOffloadingManager(spec)
    keys = _keys(40, 1)
    for r in range(5):  # 40 blocks through 16 HOST slots: most are evicted
        _store_keys(m, pool, keys[r * 8:(r + 1) * 8])
        m.on_schedule_end(None)
        truth = _truth(m, pool, keys)
        assert _answers(m, keys, f"scan{r}") == truth
    assert sum(truth) <= 16 and sum(truth) >= 8
    # the mirror answered the hits without a call per key: kvt_ext_lookup calls grew by the
    # truth checks above, the confirmations and one per miss only
    before = pool.stats()["lookups"]
    assert _answers(m, keys, "again") == truth
    assert pool.stats()["lookups"] - before == sum(1 for t in truth if not t)
    # a drop is drained at the next scan
    k = keys[truth.index(True)]
    pool.drop(m.hashes(k))
    assert m.lookup(k, ReqContext(req_id="after-drop")) is LookupResult.MISS


def test_same_scan_then_new_step_sees_removal(store):
    st, pool, spec, _ = store
    m = KvtierOffloadingManager(spec)
    keys = _keys(8, 2)
    _store_keys(m, pool, keys)
    ctx = ReqContext(req_id="waiting")
    assert all(m.lookup(k, ctx) is LookupResult.HIT for k in keys)
    pool.drop(m.hashes(keys[0]))
    m.on_schedule_end(None)  # the next step rescans the same waiting request (same context)
    assert m.lookup(keys[0], ctx) is LookupResult.MISS
    assert m.lookup(keys[1], ctx) is LookupResult.HIT


def test_cold_mirror_finds_blocks_stored_by_another_manager(store):
    st, pool, spec, _ = store
    a, b = KvtierOffloadingManager(spec), KvtierOffloadingManager(spec)
    keys = _keys(6, 3)
    _store_keys(a, pool, keys)
    assert _answers(b, keys, "b") == [True] * 6  # b never stored them: checked with kvtier
    assert _answers(b, _keys(2, 4), "b2") == [False, False]


def _ctx_with_positions(req, keys, tpb=16):
    """A ReqContext as vLLM's scheduler fills it before looking up: each key's end token."""
    ctx = ReqContext(req_id=req)
    for i, k in enumerate(keys):
        ctx.set_offload_key_position(k, (i + 1) * tpb)
    return ctx


def test_cold_mirror_confirms_the_request_in_one_call(store):
    """A cold mirror (another manager stored the keys, as before a restart) and the positions
    vLLM's scheduler records: the first stored key is checked alone, the request's following
    keys in one batched kvt_ext_lookup, so the scan makes two calls instead of one per key;
    a key missing in the middle ends the confirmed run and is still answered MISS, and keys
    of another group are not confirmed by it."""
    st, pool, spec, _ = store
    a, b = KvtierOffloadingManager(spec), KvtierOffloadingManager(spec)
    keys = _keys(12, 21)
    _store_keys(a, pool, keys[:6] + keys[7:])  # keys[6] never stored
    other = [vllm_base.make_offload_key(k[:-4], 1) for k in keys]  # group 1: not stored
    ctx = _ctx_with_positions("b", keys)
    for i, k in enumerate(other):
        ctx.set_offload_key_position(k, (i + 1) * 16)
    before = pool.stats()["lookups"]
    got = [b.lookup(k, ctx) is LookupResult.HIT for k in keys[:6]]
    assert got == [True] * 6
    assert pool.stats()["lookups"] - before == 2  # the first key, then the other five at once
    assert b.lookup(keys[6], ctx) is LookupResult.MISS  # checked with kvtier: not stored
    assert [b.lookup(k, ctx) is LookupResult.HIT for k in keys[7:]] == [True] * 5
    assert [b.lookup(k, ctx) is LookupResult.HIT for k in other[:3]] == [False] * 3
    assert _answers(b, keys, "again") == _truth(b, pool, keys)


@pytest.mark.parametrize("store", [(8, 2)], indirect=True)
def test_lost_removals_drop_the_mirror(store):
    st, pool, spec, _ = store
    m = KvtierOffloadingManager(spec)
    keys = _keys(12, 5)
    _store_keys(m, pool, keys[:4])
    assert _answers(m, keys[:4], "s0") == [True] * 4
    for r in range(1, 3):  # 8 more into 8 HOST slots: 4 or more removals, a ring of 2 loses some
        _store_keys(m, pool, keys[r * 4:(r + 1) * 4])
    assert _answers(m, keys, "s1") == _truth(m, pool, keys)
    assert m.mirror_resets >= 1  # the ring overflowed: the mirror was rebuilt, not trusted
    assert not any(_answers(m, keys[:4], "s2"))


def test_two_managers_each_see_every_removal(store):
    st, pool, spec, _ = store
    a, b = KvtierOffloadingManager(spec), KvtierOffloadingManager(spec)
    keys = _keys(6, 6)
    _store_keys(a, pool, keys)
    assert _answers(a, keys, "a0") == [True] * 6
    assert _answers(b, keys, "b0") == [True] * 6
    pool.drop(a.hashes(keys[2]))
    assert _answers(a, keys, "a1") == [True, True, False, True, True, True]
    assert _answers(b, keys, "b1") == [True, True, False, True, True, True]


def test_wrong_hit_heals_at_prepare_load(store):
    st, pool, spec, _ = store
    m = KvtierOffloadingManager(spec)
    keys = _keys(4, 7)
    _store_keys(m, pool, keys)
    ctx = ReqContext(req_id="w")
    assert all(m.lookup(k, ctx) is LookupResult.HIT for k in keys)
    # removed behind the mirror's back within the same scan (no drain yet): the load's
    # batched check takes it out, and prepare_store stores it again
    pool.drop(m.hashes(keys[1]))
    m.prepare_load(keys, ctx)
    assert m.lookup(keys[1], ctx) is LookupResult.MISS
    out = m.prepare_store(keys, ReqContext(req_id="w2"))
    assert out.keys_to_store == [keys[1]]


def _events(m):
    return [(e.removed, e.medium, list(e.keys)) for e in m.take_events()]


def test_kv_events_stored_and_removed(store):
    """With vLLM's KV cache events on, the keys this manager stored are announced once kvtier
    holds them, and announced removed when kvtier evicts them; keys it only found (another
    manager's) are not announced; without events take_events yields nothing."""
    st, pool, spec, _ = store
    quiet = KvtierOffloadingManager(spec)
    m = _ev_manager(spec)
    keys = _keys(40, 7)
    assert _store_keys(m, pool, keys[:8]) == keys[:8]
    assert _events(m) == [(False, vllm_base.Medium.CPU, keys[:8])]
    assert _events(m) == []  # taken once
    _store_keys(quiet, pool, keys[8:12])  # another manager's: found, not announced
    assert _answers(m, keys[8:12], "found") == [True] * 4
    # 28 more blocks through 16 HOST slots: most of the first 8 are evicted
    for r in range(4):
        _store_keys(m, pool, keys[12 + 7 * r:12 + 7 * (r + 1)])
        m.on_schedule_end(None)
    m.lookup(keys[0], ReqContext(req_id="drain"))  # a scan drains the removal feed
    stored, removed = [], []
    for rm, med, ks in _events(m):
        assert med is vllm_base.Medium.CPU
        (removed if rm else stored).extend(ks)
    assert stored == keys[12:40]
    held = set(k for k, t in zip(keys, _truth(m, pool, keys)) if t)
    mine = set(keys[:8]) | set(keys[12:40])
    assert set(removed) == mine - held  # every announced key that went, nothing else
    assert not set(removed) & set(keys[8:12])
    assert list(quiet.take_events()) == []


def _ev_manager(spec, bpc=1):
    ev_spec = types.SimpleNamespace(**vars(spec), kv_events_config=types.SimpleNamespace(
        enable_kv_cache_events=True))
    ev_spec.blocks_per_chunk = bpc
    return KvtierOffloadingManager(ev_spec)


def _drain(m, tag):
    m.on_schedule_end(None)
    m.lookup(b"\0" * 36, ReqContext(req_id=tag))  # a new scan drains the removal feed


def test_load_check_heals_only_the_gone_key(store):
    """A key dropped between the lookup and prepare_load: only it is reported removed and
    leaves the mirror; the stored key after it stays (review finding: every key after the
    first gone one was reported removed, and never announced again)."""
    st, pool, spec, _ = store
    m = _ev_manager(spec)
    ks = _keys(3, 31)
    _store_keys(m, pool, ks)
    _events(m)
    ctx = ReqContext(req_id="r")
    assert [m.lookup(k, ctx) for k in ks] == [LookupResult.HIT] * 3
    pool.drop(m.hashes(ks[1]))
    m.prepare_load(ks, ctx)
    assert [(rm, k) for rm, _, k in _events(m)] == [(True, [ks[1]])]
    assert m.lookup(ks[2], ctx) is LookupResult.HIT


def test_stale_removal_does_not_cancel_a_fresh_store(store):
    """blocks_per_chunk 2: a half-stored key is stored again; its old second block is evicted
    while the store is in flight, and the store writes it anew: the key is announced stored
    and stays so (review finding: the stale removal, drained after the confirmation, took
    the key out of the mirror and announced it removed)."""
    st, pool, spec, _ = store
    m = _ev_manager(spec, bpc=2)
    k = _keys(1, 32)[0]
    h0, h1 = m.hashes(k)
    out = m.prepare_store([k], ReqContext(req_id="s0"))
    job = pool.store([h1], [1])  # only the second block landed before
    assert pool.wait(job, 60000)
    pool.poll()
    m.complete_store(out.keys_to_store, ReqContext(req_id="s0"))
    assert _events(m) == []  # not held: not announced
    out = m.prepare_store([k], ReqContext(req_id="s1"))
    assert out.keys_to_store == [k]
    pool.drop([h1])  # stands for another job of the step evicting the old block
    job = pool.store([h0, h1], [0, 1])
    assert pool.wait(job, 60000)
    pool.poll()
    m.complete_store(out.keys_to_store, ReqContext(req_id="s1"))
    assert [(rm, ks) for rm, _, ks in _events(m)] == [(False, [k])]
    _drain(m, "after")
    assert _events(m) == []
    assert m.lookup(k, ReqContext(req_id="again")) is LookupResult.HIT


def test_reset_drops_stores_in_flight(store):
    """reset_cache() with a store in flight (vLLM never completes it): its blocks are dropped
    at the reset and again at on_reset_flushed() once the job ended, so nothing from before
    the reset is a hit after it; a key stored again after the reset is kept."""
    st, pool, spec, _ = store
    m = KvtierOffloadingManager(spec)
    ks = _keys(5, 33)
    _store_keys(m, pool, ks[:2])
    out = m.prepare_store(ks[2:4], ReqContext(req_id="s"))
    job = pool.store([m.hashes(k)[0] for k in out.keys_to_store], [10, 11])
    m.reset_cache()
    assert pool.wait(job, 60000)
    pool.poll()
    _store_keys(m, pool, [ks[4]], first_id=20)  # stored after the reset
    m.on_reset_flushed()
    assert _truth(m, pool, ks) == [False, False, False, False, True]
    assert _answers(m, ks, "after") == [False, False, False, False, True]
