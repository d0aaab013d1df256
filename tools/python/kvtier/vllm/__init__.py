# SPDX-License-Identifier: MIT
"""kvtier inside vLLM (pinned: vllm 0.33.0; vLLM calls these interfaces experimental).

Two ways in, both without a fork of vLLM (docs/INTEGRATION.md has the commands):

  kvtier as the store behind vLLM's OffloadingConnector (an out-of-tree offloading spec):
      --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
          "kv_connector_extra_config": {"spec_name": "KvtierOffloadingSpec",
              "spec_module_path": "kvtier.vllm.spec", "kvtier_host_bytes": 8589934592,
              "kvtier_nvme_dir": "/nvme/kvtier", "kvtier_nvme_bytes": 68719476736,
              "kvtier_persist": true}}'

  the kvtier KV connector (KVConnectorBase_V1: OffloadingConnector's scheduling on the
  kvtier spec, plus vLLM's invalid-block path: a block whose load fails - its NVMe copy
  failed its checksum, it was evicted - is reported by get_block_ids_with_load_errors() and
  recomputed, the others are loaded):
      --kv-transfer-config '{"kv_connector": "KvtierConnector", "kv_role": "kv_both",
          "kv_connector_module_path": "kvtier.vllm.connector",
          "kv_connector_extra_config": {"kvtier_host_bytes": 8589934592}}'

Importing kvtier.vllm does not import vllm; kvtier.vllm.spec and kvtier.vllm.connector do.
"""
