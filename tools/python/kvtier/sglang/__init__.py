# SPDX-License-Identifier: MIT
"""kvtier as an SGLang HiCache storage backend (pinned: sglang 0.5.23): kvtier.sglang.backend.
Loaded through SGLang's "dynamic" storage backend:

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config
      '{"backend_name": "kvtier", "module_path": "kvtier.sglang.backend",
        "class_name": "KvtierHiCacheStorage", "kvtier_page_bytes": 65536,
        "kvtier_host_bytes": 8589934592, "kvtier_nvme_dir": "/nvme/kvtier",
        "kvtier_nvme_bytes": 68719476736, "kvtier_persist": true}'
"""
