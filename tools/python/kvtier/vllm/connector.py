# SPDX-License-Identifier: MIT
"""KvtierConnector: a vLLM KV connector (KVConnectorBase_V1, scheduler and worker sides) on
kvtier, loaded with kv_connector "KvtierConnector" and kv_connector_module_path
"kvtier.vllm.connector" (vllm 0.33.0).

Scheduling (which prefix blocks are stored, which to load, which newly computed blocks to
store, preemption fences, delayed frees) is vLLM's OffloadingConnector's, driving the kvtier
offloading spec (kvtier.vllm.spec); this class adds what that connector lacks in 0.33: a load
that partly fails (a block's NVMe copy failed its checksum and was dropped, or the block was
evicted between lookup and load) is not a crash: the worker reports the job done, and the GPU
block ids that did not load come back from get_block_ids_with_load_errors(), so vLLM's
scheduler recomputes exactly those blocks (kv_load_failure_policy "recompute", its default)
and never runs on wrong KV. The kvtier spec is used unless kv_connector_extra_config names
another spec_name.
"""

from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import \
    OffloadingConnector

SPEC = {"spec_name": "KvtierOffloadingSpec", "spec_module_path": "kvtier.vllm.spec"}


class KvtierConnector(OffloadingConnector):
    """OffloadingConnector on the kvtier spec, with vLLM's invalid-block path."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        ktc = vllm_config.kv_transfer_config
        extra = dict(ktc.kv_connector_extra_config or {})
        for k, v in SPEC.items():
            extra.setdefault(k, v)
        ktc.kv_connector_extra_config = extra
        super().__init__(vllm_config, role, kv_cache_config)

    def register_kv_caches(self, kv_caches):
        super().register_kv_caches(kv_caches)
        w = self.connector_worker.worker
        if hasattr(w, "tolerate_failures"):
            w.tolerate_failures = True

    def get_block_ids_with_load_errors(self):
        w = self.connector_worker.worker if self.connector_worker is not None else None
        if w is None or not getattr(w, "failed_block_ids", None):
            return set()
        out, w.failed_block_ids = set(w.failed_block_ids), set()
        return out
