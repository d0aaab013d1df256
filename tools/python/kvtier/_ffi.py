# SPDX-License-Identifier: MIT
"""ctypes declarations of kvtier.h: the library, its structs (field for field, same order and
types as the header; tests/test_layout.py compares every size and offset with a C compiler's)
and the function prototypes."""

import ctypes
import ctypes.util
import os

c_u8, c_u32, c_u64, c_i32, c_i64 = (ctypes.c_uint8, ctypes.c_uint32, ctypes.c_uint64,
                                    ctypes.c_int32, ctypes.c_int64)
c_enum = ctypes.c_int  # C enums of kvtier.h fit an int

TIER_COUNT = 3
MOVE_COUNT = 4
LAT_BUCKETS = 11
LAT_BUCKET_BOUNDS_NS = (10000, 50000, 100000, 500000, 1000000, 5000000, 10000000,
                        50000000, 100000000, 500000000, 2**64 - 1)


def _load_library():
    """KVTIER_LIBRARY, then a libkvtier.so* beside this package, then the build tree of the
    repository this package sits in (tools/python/kvtier/../../../build), then the system loader."""
    tried = []
    env = os.environ.get("KVTIER_LIBRARY")
    if env:
        return ctypes.CDLL(env)  # an explicit choice: its error is the answer
    here = os.path.dirname(os.path.abspath(__file__))
    build = os.path.normpath(os.path.join(here, "..", "..", "..", "build"))
    for path in (os.path.join(d, n) for d in (here, build)
                 for n in ("libkvtier.so", "libkvtier.so.0")):
        if os.path.exists(path):
            return ctypes.CDLL(path)
        tried.append(path)
    for name in ("libkvtier.so.0", ctypes.util.find_library("kvtier")):
        if not name:
            continue
        try:
            return ctypes.CDLL(name)
        except OSError:
            tried.append(name)
    raise OSError("kvtier: libkvtier.so not found; tried " + ", ".join(tried)
                  + " and the system loader's paths. Build it (cmake --build build) or set "
                  "KVTIER_LIBRARY=/path/to/libkvtier.so")


class Layout(ctypes.Structure):
    _fields_ = [("n_layers", c_u32), ("n_kv_heads", c_u32), ("head_dim", c_u32),
                ("dtype", c_enum), ("tokens_per_block", c_u32)]


class Geometry(ctypes.Structure):
    _fields_ = [("hbm_base", ctypes.c_void_p), ("block_bytes", c_u64),
                ("layer_block_bytes", c_u64), ("v_offset", c_u64), ("token_bytes", c_u64),
                ("tokens_per_block", c_u32), ("n_layers", c_u32), ("hbm_slots", c_u32),
                ("host_slots", c_u32), ("nvme_slots", c_u32)]


LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)


class EngineOpts(ctypes.Structure):
    _fields_ = [("opts_size", ctypes.c_size_t), ("layout", Layout), ("hbm_bytes", c_u64),
                ("host_bytes", c_u64), ("nvme_dir", ctypes.c_char_p), ("nvme_bytes", c_u64),
                ("device", c_enum), ("cuda_device", ctypes.c_int),
                ("high_watermark", ctypes.c_float), ("low_watermark", ctypes.c_float),
                ("nvme_queue_depth", c_u32), ("emu_max_delay_us", c_u32), ("emu_seed", c_u64),
                ("emu_copy_bytes_per_s", c_u64), ("log", LOG_FN), ("log_arg", ctypes.c_void_p),
                # NVMe store (issue 4)
                ("nvme_codec", c_enum), ("nvme_codec_min_saving", ctypes.c_float),
                ("nvme_persist", ctypes.c_int), ("nvme_buffered_fallback", ctypes.c_int),
                # 0.2: eviction and idle sessions
                ("evict_policy", c_u32), ("idle_timeout_ms", c_u32), ("idle_target", c_u32),
                ("prefix_cache", c_u32),
                # 0.3: NVMe worker threads
                ("nvme_workers", c_u32),
                # 0.5: the REMOTE tier (issue 18)
                ("remote_host", ctypes.c_char_p), ("remote_port", ctypes.c_uint16),
                ("remote_user", ctypes.c_char_p), ("remote_password", ctypes.c_char_p),
                ("remote_model_id", ctypes.c_char_p), ("remote_connect_timeout_ms", c_u32),
                ("remote_op_timeout_ms", c_u32), ("remote_ttl_ms", c_u32),
                # 0.6: layer groups (issue 16)
                ("groups", ctypes.c_void_p), ("n_groups", c_u32), ("group_ref_tokens", c_u64),
                # 0.5: write-through, remote prefix hits, write budgets (issue 18)
                ("remote_write", c_u32), ("remote_no_fetch", c_u32),
                ("remote_write_budget", c_u64), ("nvme_write_budget", c_u64),
                ("write_budget_period_ms", c_u32), ("emu_lazy", c_u32)]


class SeqOpts(ctypes.Structure):
    _fields_ = [("opts_size", ctypes.c_size_t), ("tenant", c_u32), ("priority", c_u8),
                ("session_key", c_u64),
                # 0.2
                ("retention_ms", c_u32), ("salt", c_u64), ("extra_key", c_u64)]


class SeqInfo(ctypes.Structure):
    _fields_ = [("n_tokens", c_u64), ("n_blocks", c_u32), ("blocks_in", c_u32 * TIER_COUNT),
                ("tenant", c_u32), ("priority", c_u8), ("parked", c_u8)]


class BlockTable(ctypes.Structure):
    _fields_ = [("n_seqs", c_u32), ("indptr", ctypes.POINTER(c_u32)),
                ("indices", ctypes.POINTER(c_u32)), ("last_block_len", ctypes.POINTER(c_u32)),
                ("seq_len", ctypes.POINTER(c_u64)), ("first_block", ctypes.POINTER(c_u32)),
                ("geo", Geometry)]


class SeqRange(ctypes.Structure):
    _fields_ = [("seq", c_u64), ("first_block", c_u32), ("n_blocks", c_u32)]


class TierStats(ctypes.Structure):
    _fields_ = [("capacity_bytes", c_u64), ("used_bytes", c_u64), ("slots", c_u32),
                ("used_slots", c_u32), ("evictions", c_u64), ("hits", c_u64),
                ("misses", c_u64), ("bytes_prefetched", c_u64), ("bytes_on_demand", c_u64),
                ("prefix_hit_blocks", c_u64), ("promote_count", c_u64),
                ("promote_ns_sum", c_u64), ("promote_lat", c_u64 * LAT_BUCKETS)]


class LatHist(ctypes.Structure):
    _fields_ = [("count", c_u64), ("ns_sum", c_u64), ("lat", c_u64 * LAT_BUCKETS)]


class Stats(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("tier", TierStats * TIER_COUNT),
                ("blocks_moved", c_u64 * MOVE_COUNT), ("bytes_moved", c_u64 * MOVE_COUNT),
                ("checksum_verified", c_u64), ("checksum_failed", c_u64),
                ("io_errors", c_u64), ("evictions", c_u64), ("stalls", c_u64),
                ("stall_ns", c_u64), ("blocks_lost", c_u64), ("seqs_open", c_u32),
                ("batches_open", c_u32), ("transfers_in_flight", c_u64), ("accesses", c_u64),
                ("accesses_ready", c_u64), ("hints", c_u64), ("prefix_lookups", c_u64),
                ("prefix_hit_blocks", c_u64), ("prefix_hit_tokens", c_u64),
                ("shared_blocks", c_u64), ("codec_blocks", c_u64), ("codec_raw_bytes", c_u64),
                ("codec_stored_bytes", c_u64), ("meta_bytes", c_u64),
                # 0.2
                ("idle_parked", c_u64), ("meta_block_records", c_u64),
                ("meta_token_bytes", c_u64),
                ("batches", c_u64), ("h2d_groups", c_u64), ("repromotions", c_u64),
                # 0.4
                ("nvme_write", LatHist), ("park", LatHist), ("resume", LatHist),
                # 0.5: REMOTE tier
                ("remote_publishes", c_u64), ("remote_publish_failed", c_u64),
                ("remote_blocks_put", c_u64), ("remote_restores", c_u64),
                ("remote_restore_misses", c_u64), ("remote_bytes_out", c_u64),
                ("remote_bytes_in", c_u64), ("remote_breaker_trips", c_u64),
                ("remote_errors", c_u64), ("remote_breaker_open", c_u64),
                # 0.5: write-through, remote prefix hits, write budgets (issue 18)
                ("remote_wt_queued", c_u64), ("remote_wt_stored", c_u64),
                ("remote_wt_failed", c_u64), ("remote_lookups", c_u64),
                ("remote_lookup_blocks", c_u64), ("remote_hit_blocks", c_u64),
                ("remote_miss_blocks", c_u64), ("remote_bad_values", c_u64),
                ("remote_late_blocks", c_u64), ("wb_admitted_bytes", c_u64 * 2),
                ("wb_refused_bytes", c_u64 * 2), ("wb_refused", c_u64 * 2),
                ("wb_hits_lost", c_u64 * 2), ("remote_round_trips", c_u64)]


MAX_GROUPS = 16
GROUP_MAX_STATE = 4


class StateTensor(ctypes.Structure):
    _fields_ = [("n_dims", c_u32), ("shape", c_u32 * 4), ("dtype", c_enum)]


class Group(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("kind", c_enum), ("n_layers", c_u32),
                ("layers", ctypes.POINTER(c_u32)), ("n_kv_heads", c_u32), ("head_dim", c_u32),
                ("v_head_dim", c_u32), ("latent_dim", c_u32), ("window", c_u32),
                ("sink", c_u32), ("alias_of", ctypes.POINTER(c_u32)), ("dtype", c_enum),
                ("tokens_per_block", c_u32), ("share", ctypes.c_float), ("n_state", c_u32),
                ("state", StateTensor * GROUP_MAX_STATE), ("checkpoint_every", c_u32),
                ("parent", c_u32),
                ("sidecar_token_bytes", c_u64), ("sidecar_block_bytes", c_u64),
                ("sidecar_summary", c_u32)]


class GroupGeometry(ctypes.Structure):
    _fields_ = [("kind", c_enum), ("n_layers", c_u32), ("hbm_base", ctypes.c_void_p),
                ("block_bytes", c_u64), ("layer_block_bytes", c_u64),
                ("k_token_bytes", c_u64), ("v_token_bytes", c_u64), ("v_offset", c_u64),
                ("tokens_per_block", c_u32), ("n_kv_heads", c_u32), ("head_dim", c_u32),
                ("v_head_dim", c_u32), ("dtype", c_enum), ("window", c_u32), ("sink", c_u32),
                ("hbm_slots", c_u32), ("host_slots", c_u32), ("nvme_slots", c_u32)]


class GroupTable(ctypes.Structure):
    _fields_ = [("group", c_u32), ("n_seqs", c_u32), ("indptr", ctypes.POINTER(c_u32)),
                ("indices", ctypes.POINTER(c_u32)), ("block_pos", ctypes.POINTER(c_u32)),
                ("last_block_len", ctypes.POINTER(c_u32)),
                ("seq_len", ctypes.POINTER(c_u64)), ("first_block", ctypes.POINTER(c_u32)),
                ("window", c_u32), ("sink", c_u32), ("geo", GroupGeometry)]


# external-pool mode (issue 19, 0.6)
EXT_NO_V = 2**64 - 1


class ExtLayer(ctypes.Structure):
    _fields_ = [("base", c_u64), ("block_stride", c_u64), ("layer_stride", c_u64),
                ("k_offset", c_u64), ("v_offset", c_u64), ("k_bytes", c_u64),
                ("v_bytes", c_u64), ("n_layers", c_u32), ("reserved", c_u32)]


class ExtOpts(ctypes.Structure):
    _fields_ = [("opts_size", ctypes.c_size_t), ("n_blocks", c_u32), ("n_entries", c_u32),
                ("layers", ctypes.POINTER(ExtLayer)), ("layer_group", c_u32),
                ("max_jobs", c_u32), ("removed_cap", c_u32), ("pad_", c_u32),
                ("reserved", c_u64 * 3)]


class ExtRemoval(ctypes.Structure):
    _fields_ = [("hash", c_u64), ("tenant", c_u32), ("pad_", c_u32)]


class ExtDone(ctypes.Structure):
    _fields_ = [("job", c_u64), ("status", c_i32), ("kind", c_u32), ("n_blocks", c_u32),
                ("n_failed", c_u32), ("n_skipped", c_u32), ("failed_first", c_u32)]


class ExtFail(ctypes.Structure):
    _fields_ = [("block_id", c_u32), ("err", c_i32)]


class ExtStats(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("stored_blocks", c_u64), ("store_jobs", c_u64),
                ("load_jobs", c_u64), ("blocks_stored", c_u64), ("blocks_skipped", c_u64),
                ("blocks_loaded", c_u64), ("blocks_failed", c_u64), ("lookups", c_u64),
                ("lookup_hashes", c_u64), ("lookup_hits", c_u64), ("bytes_stored", c_u64),
                ("bytes_loaded", c_u64), ("persisted_blocks", c_u64),
                ("remote_fetch_blocks", c_u64), ("remote_hit_blocks", c_u64)]


STRUCTS = {"kvt_layout": Layout, "kvt_geometry": Geometry, "kvt_engine_opts": EngineOpts,
           "kvt_seq_opts": SeqOpts, "kvt_seq_info": SeqInfo, "kvt_block_table": BlockTable,
           "kvt_seq_range": SeqRange, "kvt_tier_stats": TierStats, "kvt_stats": Stats,
           "kvt_lat_hist": LatHist, "kvt_state_tensor": StateTensor, "kvt_group": Group,
           "kvt_group_geometry": GroupGeometry, "kvt_group_table": GroupTable,
           "kvt_ext_layer": ExtLayer, "kvt_ext_opts": ExtOpts,
           "kvt_ext_done": ExtDone, "kvt_ext_fail": ExtFail, "kvt_ext_stats": ExtStats,
           "kvt_ext_removal": ExtRemoval}

_P = ctypes.POINTER
_vp = ctypes.c_void_p
_int = ctypes.c_int
_PROTOS = {
    "kvt_version": (ctypes.c_char_p, []),
    "kvt_strerror": (ctypes.c_char_p, [_int]),
    "kvt_last_error_message": (ctypes.c_char_p, []),
    "kvt_dtype_size": (ctypes.c_size_t, [c_enum]),
    "kvt_engine_opts_init": (None, [_P(EngineOpts), ctypes.c_size_t]),
    "kvt_engine_create": (_int, [_P(EngineOpts), _P(_vp)]),
    "kvt_engine_destroy": (None, [_vp]),
    "kvt_engine_geometry": (_int, [_vp, _P(Geometry)]),
    "kvt_engine_poll": (_int, [_vp, c_u32]),
    "kvt_engine_drain": (_int, [_vp]),
    "kvt_engine_stream_create": (_int, [_vp, _P(_vp)]),
    "kvt_engine_stream_sync": (_int, [_vp, _vp]),
    "kvt_engine_stream_destroy": (None, [_vp, _vp]),
    "kvt_seq_opts_init": (None, [_P(SeqOpts), ctypes.c_size_t]),
    "kvt_seq_open": (_int, [_vp, _P(SeqOpts), _P(c_u64)]),
    "kvt_seq_close": (_int, [_vp, c_u64]),
    "kvt_seq_detach": (_int, [_vp, c_u64]),
    "kvt_seq_append": (_int, [_vp, c_u64, _P(c_i32), ctypes.c_size_t, _P(c_i64)]),
    "kvt_seq_park": (_int, [_vp, c_u64, c_enum]),
    "kvt_seq_resume": (_int, [_vp, c_u64]),
    "kvt_seq_info": (_int, [_vp, c_u64, _P(SeqInfo)]),
    "kvt_batch_prepare": (_int, [_vp, _P(c_u64), ctypes.c_size_t, _P(_vp)]),
    "kvt_batch_prepare_ranges": (_int, [_vp, _P(SeqRange), ctypes.c_size_t, _P(_vp)]),
    "kvt_batch_prepare_group": (_int, [_vp, c_u32, _P(SeqRange), ctypes.c_size_t, _P(_vp)]),
    "kvt_batch_block_table": (_int, [_vp, _P(BlockTable)]),
    "kvt_batch_wait_layer": (_int, [_vp, c_u32, _vp]),
    "kvt_batch_release": (_int, [_vp, _vp]),
    "kvt_engine_stats": (_int, [_vp, _P(Stats)]),
    "kvt_engine_metrics_text": (_int, [_vp, ctypes.c_char_p, ctypes.c_size_t,
                                       _P(ctypes.c_size_t)]),
    "kvt_stats_metrics_text": (_int, [_P(Stats), ctypes.c_char_p, ctypes.c_size_t,
                                      _P(ctypes.c_size_t)]),
    "kvt_engine_stream_memcpy_async": (_int, [_vp, _vp, _vp, _vp, ctypes.c_size_t]),
    # schedule hints
    "kvt_engine_hint": (_int, [_vp, _P(c_u64), ctypes.c_size_t, c_u32]),
    "kvt_engine_hint_ranges": (_int, [_vp, _P(SeqRange), ctypes.c_size_t, c_u32]),
    # persistent sessions
    "kvt_session_list": (_int, [_vp, _P(c_u64), ctypes.c_size_t]),
    "kvt_seq_restore": (_int, [_vp, c_u64, _P(SeqOpts), _P(c_u64)]),
    "kvt_session_drop": (_int, [_vp, c_u64]),
    "kvt_session_list_tenant": (_int, [_vp, c_u32, _P(c_u64), ctypes.c_size_t]),
    "kvt_session_drop_tenant": (_int, [_vp, c_u32, c_u64]),
    "kvt_seq_publish_remote": (_int, [_vp, c_u64]),
    "kvt_seq_restore_remote": (_int, [_vp, c_u64, _P(SeqOpts), _P(c_u64)]),
    "kvt_seq_tokens": (_int, [_vp, c_u64, c_u64, _P(ctypes.c_int32), ctypes.c_size_t]),
    # priorities, prefix sharing, tenants
    "kvt_seq_set_priority": (_int, [_vp, c_u64, c_u64, c_u64, c_u8, c_u32]),
    "kvt_seq_match_prefix": (_int, [_vp, _P(SeqOpts), _P(c_i32), ctypes.c_size_t, _P(c_u64),
                                    _P(c_enum)]),
    "kvt_seq_attach_prefix": (_int, [_vp, c_u64, _P(c_i32), ctypes.c_size_t, _P(c_u64)]),
    "kvt_tenant_set_budget": (_int, [_vp, c_u32, c_enum, c_u64]),
    "kvt_tenant_usage": (_int, [_vp, c_u32, _P(c_u64)]),
    # layer groups (issue 16)
    "kvt_group_init": (None, [_P(Group), ctypes.c_size_t]),
    "kvt_engine_n_groups": (_int, [_vp]),
    "kvt_group_geometry": (_int, [_vp, c_u32, _P(GroupGeometry)]),
    "kvt_layer_group": (_int, [_vp, c_u32, _P(c_u32), _P(c_u32)]),
    "kvt_group_state_tensor": (_int, [_vp, c_u32, c_u32, _P(c_u64), _P(c_u64)]),
    "kvt_group_sidecar": (_int, [_vp, c_u32, _P(c_u64), _P(c_u64), _P(c_u64)]),
    "kvt_seq_sidecar_read": (_int, [_vp, c_u64, c_u32, c_u32, c_u32, c_u32, _vp]),
    "kvt_seq_checkpoint": (_int, [_vp, c_u64, c_u64]),
    "kvt_seq_append_groups": (_int, [_vp, c_u64, _P(c_i32), ctypes.c_size_t, _P(c_i64)]),
    "kvt_batch_group_table": (_int, [_vp, c_u32, _P(GroupTable)]),
    "kvt_batch_wait_group_layer": (_int, [_vp, c_u32, c_u32, _vp]),
    "kvt_engine_group_stats": (_int, [_vp, c_u32, _P(Stats)]),
    # external-pool mode
    "kvt_ext_opts_init": (None, [_P(ExtOpts), ctypes.c_size_t]),
    "kvt_ext_register": (_int, [_vp, _P(ExtOpts), _P(c_u32)]),
    "kvt_ext_unregister": (_int, [_vp, c_u32]),
    "kvt_ext_store": (_int, [_vp, c_u32, c_u32, _P(c_u64), _P(c_u32), ctypes.c_size_t, _vp,
                             _P(c_u64)]),
    "kvt_ext_lookup": (_int, [_vp, c_u32, c_u32, _P(c_u64), ctypes.c_size_t,
                              _P(ctypes.c_size_t), _P(c_enum)]),
    "kvt_ext_inflight": (_int, [_vp, c_u32, c_u32, _P(c_u64), ctypes.c_size_t,
                                _P(ctypes.c_size_t), _P(ctypes.c_size_t)]),
    "kvt_ext_load": (_int, [_vp, c_u32, c_u32, _P(c_u64), _P(c_u32), ctypes.c_size_t, c_u32,
                            _P(c_u64)]),
    "kvt_ext_poll": (_int, [_vp, c_u32, _P(ExtDone), ctypes.c_size_t, _P(ExtFail),
                            ctypes.c_size_t]),
    "kvt_ext_wait": (_int, [_vp, c_u32, c_u64, c_u32]),
    "kvt_ext_wait_layer": (_int, [_vp, c_u32, c_u64, c_u32, _vp]),
    "kvt_ext_touch": (_int, [_vp, c_u32, c_u32, _P(c_u64), ctypes.c_size_t]),
    "kvt_ext_drop": (_int, [_vp, c_u32, c_u32, _P(c_u64), ctypes.c_size_t]),
    "kvt_ext_hold": (_int, [_vp, c_u32, c_u32, _P(c_u64), ctypes.c_size_t]),
    "kvt_ext_release": (_int, [_vp, c_u32, c_u32, _P(c_u64), ctypes.c_size_t]),
    "kvt_ext_clear": (_int, [_vp, c_u32, c_u32]),
    "kvt_ext_stats": (_int, [_vp, c_u32, _P(ExtStats)]),
    "kvt_ext_removed": (_int, [_vp, c_u32, _P(ExtRemoval), ctypes.c_size_t, _P(c_u64)]),
}
lib = _load_library()
for _name, (_res, _args) in _PROTOS.items():
    _fn = getattr(lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args
