# SPDX-License-Identifier: MIT
"""One server process for test_vllm_restart: vLLM's scheduler with kvtier (MODE) on a
persistent kvtier store in NVME_DIR runs one request and prints its hits, output and bad
reads as JSON; the store is closed as a server's shutdown closes it.

    vllm_restart_driver.py MODE NVME_DIR
"""
import json
import random
import sys

import vllm_harness as vh
from kvtier._store import close_store

mode, nvme_dir = sys.argv[1], sys.argv[2]
rng = random.Random(42)
prompt = [rng.randrange(10, 50000) for _ in range(5 * 16 + 7)]
e = vh.Engine(mode, kvtier_nvme_dir=nvme_dir, kvtier_nvme_bytes=1 << 24,
              kvtier_persist=True, kvtier_store_name="restart")
e.add("r", prompt, max_tokens=3)
e.run()
e.settle()
e.shutdown()
close_store("restart")
print(json.dumps({"hits": e.hits["r"], "computed": e.computed["r"], "out": e.outputs["r"],
                  "bad": e.bad_reads}))
