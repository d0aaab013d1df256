# SPDX-License-Identifier: MIT
"""A vLLM engine loop on CPU for the kvtier integration tests: vLLM's real Scheduler (with a
KV connector built from the KVTransferConfig, as vLLM builds it), the worker-side connector
on CPU torch tensors standing in for the GPU KV pool, and a deterministic "model" instead of
a forward pass.

The model writes, for every token it computes, K/V values that are a function of the token
prefix only (a rolling hash of the tokens so far, per layer and element), exactly as a real
model's K/V depend only on the prefix; before computing it reads ("attends over") the K/V of
every earlier position of the request from the GPU blocks and checks them against that
function: a block loaded with wrong bytes (or not loaded) is counted in `bad_reads` with the
block id. The sampled token is a hash of the K/V bytes it read, so wrong K/V also changes the
output. Runs vLLM's (synchronous) Scheduler.
"""

import time
import zlib

import numpy as np
import torch

from vllm import SamplingParams
from vllm.config import KVTransferConfig, set_current_vllm_config
from vllm.config.kv_events import KVEventsConfig
from vllm.distributed.kv_events import EventPublisher
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.forward_context import ForwardContext
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import (get_request_block_hasher, init_none_hash,
                                         resolve_kv_cache_block_sizes)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        KVCacheTensor, SlidingWindowSpec)
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
from vllm.v1.kv_offload.base import OffloadingWorker, TransferResult
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from tests.v1.kv_connector.unit.utils import EOS_TOKEN_ID, create_vllm_config

MOD = (1 << 61) - 1
N_LAYERS, N_KV_HEADS, HEAD = 2, 2, 8


class RefCPUOffloadingSpec(CPUOffloadingSpec):
    """vLLM's built-in CPU offloading (its CPUOffloadingManager: LRU, chunk slots, store /
    load specs), with its CUDA copy worker replaced by a torch copy of the same chunk ids
    into a CPU tensor (vLLM's worker needs CUDA): the reference the kvtier spec is compared
    with."""

    def get_worker(self, kv_caches):
        if self._worker is None:
            self._worker = _RefCPUWorker(kv_caches, self.num_chunks)
        return self._worker


class _RefCPUWorker(OffloadingWorker):
    """Per KV cache group, its layers' GPU views and a CPU tensor each (a row per CPU chunk);
    a transfer's block ids are grouped by group_sizes, one CPU chunk per GPU block
    (blocks_per_chunk 1)."""

    def __init__(self, kv_caches, num_chunks):
        self.views = [[kv_caches.tensors[r.tensor_idx].tensor for r in refs]
                      for refs in kv_caches.group_data_refs]
        self.cpu = [[torch.zeros((max(num_chunks, 1),) + tuple(v.shape[1:]), dtype=v.dtype)
                     for v in vs] for vs in self.views]
        self.done = []

    def _copy(self, gpu_spec, cpu_ids, to_cpu):
        sizes = gpu_spec.group_sizes or [len(gpu_spec.block_ids)]
        off = 0
        for gi, n in enumerate(sizes):
            g = torch.as_tensor(gpu_spec.block_ids[off:off + n], dtype=torch.long)
            c = torch.as_tensor(cpu_ids[off:off + n], dtype=torch.long)
            off += n
            for v, t in zip(self.views[gi], self.cpu[gi]):
                if to_cpu:
                    t[c] = v[g]
                else:
                    v[g] = t[c]

    def submit_store(self, job_id, src_spec, dst_spec):
        self._copy(src_spec, dst_spec.block_ids, True)
        self.done.append(TransferResult(job_id, True))
        return True

    def submit_load(self, job_id, src_spec, dst_spec, expedited=False):
        self._copy(dst_spec, src_spec.block_ids, False)
        self.done.append(TransferResult(job_id, True))
        return True

    def get_finished(self):
        out, self.done = self.done, []
        return out

    def wait(self, job_ids):
        return


def block_bytes(block_size=16):
    """Bytes of one block of every layer (what kvtier stores per block): K and V, float32."""
    return N_LAYERS * 2 * block_size * N_KV_HEADS * HEAD * 4


def spec_extra(mode, **kvtier_opts):
    """kv_connector_extra_config and connector names for @mode: "kvtier-spec" (vLLM's
    OffloadingConnector + the kvtier offloading spec), "kvtier-connector" (kvtier's KV
    connector), "cpu" (vLLM's CPU offloading, the reference)."""
    if mode == "cpu":
        return dict(kv_connector="OffloadingConnector", kv_connector_module_path=None,
                    extra={"spec_name": "RefCPUOffloadingSpec",
                           "spec_module_path": "vllm_harness",
                           "cpu_bytes_to_use": kvtier_opts.get("kvtier_host_bytes", 1 << 22)})
    extra = {"kvtier_host_bytes": 1 << 22}
    extra.update(kvtier_opts)
    if mode == "kvtier-spec":
        extra.update(spec_name="KvtierOffloadingSpec", spec_module_path="kvtier.vllm.spec")
        return dict(kv_connector="OffloadingConnector", kv_connector_module_path=None,
                    extra=extra)
    assert mode == "kvtier-connector", mode
    return dict(kv_connector="KvtierConnector",
                kv_connector_module_path="kvtier.vllm.connector", extra=extra)


class CapturePublisher(EventPublisher):
    """A KV event publisher that keeps every batch the scheduler publishes (it replaces the
    scheduler's null publisher: KVEventsConfig only names "null" and "zmq")."""

    def __init__(self, data_parallel_rank=0):
        super().__init__(data_parallel_rank)
        self.batches = []

    def publish(self, events):
        self.batches.append(events)

    def shutdown(self):
        pass


class Engine:
    """vLLM's scheduler + the worker connector + the checking model, one process.
    kv_events: vLLM's KV cache events on, published to a CapturePublisher
    (Engine.kv_events() lists them). swa: a hybrid model: layer 1 is a sliding-window layer
    of that many tokens in a second KV cache group (vLLM frees its blocks that leave the
    window); the model then reads and hashes only the window of that layer."""

    def __init__(self, mode, num_gpu_blocks=48, block_size=16, max_num_batched_tokens=256,
                 kv_events=False, swa=None, **kvtier_opts):
        cfg = spec_extra(mode, **kvtier_opts)
        self.mode = mode
        self.block_size = block_size
        vc = create_vllm_config(block_size=block_size,
                                max_num_batched_tokens=max_num_batched_tokens,
                                disable_hybrid_kv_cache_manager=False)
        vc.scheduler_config.async_scheduling = False
        if kv_events:
            vc.kv_events_config = KVEventsConfig(enable_kv_cache_events=True,
                                                 publisher="null")
        extra = dict(cfg["extra"])
        extra.setdefault("offload_prompt_only", False)
        if kv_events:  # events carry tokens, parent and block size (vLLM's opt-in)
            extra.setdefault("self_describing_kv_events", True)
        vc.kv_transfer_config = KVTransferConfig(
            kv_connector=cfg["kv_connector"],
            kv_connector_module_path=cfg["kv_connector_module_path"], kv_role="kv_both",
            kv_connector_extra_config=extra, kv_load_failure_policy="recompute")
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=N_KV_HEADS,
                                 head_size=HEAD, dtype=torch.float32)
        names = [f"model.layers.{i}.attn" for i in range(N_LAYERS)]
        page = spec.page_size_bytes
        if swa is None:
            groups = [KVCacheGroupSpec(names, spec)]
            self.group_of = [0] * N_LAYERS
        else:
            wspec = SlidingWindowSpec(block_size=block_size, num_kv_heads=N_KV_HEADS,
                                      head_size=HEAD, dtype=torch.float32, sliding_window=swa)
            groups = [KVCacheGroupSpec(names[:1], spec), KVCacheGroupSpec(names[1:], wspec)]
            self.group_of = [0] + [1] * (N_LAYERS - 1)
        self.swa = swa
        kcc = KVCacheConfig(num_blocks=num_gpu_blocks,
                            kv_cache_tensors=[KVCacheTensor(size=page * num_gpu_blocks,
                                                            layers=[n],
                                                            layer_stride=page * num_gpu_blocks,
                                                            block_stride=page)
                                              for n in names],
                            kv_cache_groups=groups)
        vc.cache_config.num_gpu_blocks = num_gpu_blocks
        sbs, hbs = resolve_kv_cache_block_sizes(kcc, vc)
        self.vc = vc
        with set_current_vllm_config(vc):
            self.scheduler = Scheduler(vllm_config=vc, kv_cache_config=kcc, log_stats=True,
                                       structured_output_manager=StructuredOutputManager(vc),
                                       block_size=sbs, hash_block_size=hbs)
            self.publisher = CapturePublisher() if kv_events else None
            if kv_events:
                self.scheduler.kv_event_publisher = self.publisher
            self.worker = KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, kcc)
            # the GPU pool: [num_blocks, 2, block_size, heads, head] per layer, on the CPU
            self.kv = {n: torch.full((num_gpu_blocks, 2, block_size, N_KV_HEADS, HEAD), -1.0,
                                     dtype=torch.float32) for n in names}
            self.worker.register_kv_caches(self.kv)
        self.names = names
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(block_size, sha256)
        self.ctx = ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={})
        self.outputs = {}      # req id -> sampled tokens
        self.bad_reads = []    # (req id, position, block id) whose K/V was wrong
        self.computed = {}     # req id -> positions the model computed (not loaded)
        self.hits = {}         # req id -> tokens loaded from the connector at first schedule
        self.invalid_reported = set()
        self.steps = 0
        self.preempted = set()  # requests vLLM's scheduler preempted
        self.before_load = None  # callback(engine, scheduler_output) before the worker loads

    # -- requests ----------------------------------------------------------------------
    def add(self, req_id, prompt, max_tokens=4):
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        sp.update_from_generation_config({}, EOS_TOKEN_ID)
        r = Request(request_id=req_id, prompt_token_ids=list(prompt), sampling_params=sp,
                    pooling_params=None, block_hasher=self.hasher)
        self.scheduler.add_request(r)
        self.outputs[req_id] = []
        self.computed[req_id] = 0

    def abort(self, req_id):
        self.scheduler.finish_requests(req_id, RequestStatus.FINISHED_ABORTED)

    # -- the model -----------------------------------------------------------------------
    @staticmethod
    def prefix_hashes(tokens):
        h, out = 7, []
        for t in tokens:
            h = (h * 1000003 + int(t) + 1) % MOD
            out.append(h)
        return out

    @staticmethod
    def kv_value(h, layer):
        """The K/V of a position whose prefix hash is @h: [2, heads, head] float32 values,
        exact integers below 2**24."""
        base = (h ^ (layer * 0x5bd1e995)) % (1 << 20)
        return (base + torch.arange(2 * N_KV_HEADS * HEAD, dtype=torch.float64)
                ).reshape(2, N_KV_HEADS, HEAD).to(torch.float32)

    def _first_read(self, li, q):
        """The first position layer @li attends to for a token at position @q."""
        return max(0, q - self.swa + 1) if self.swa and self.group_of[li] else 0

    def _forward(self, req, n_sched):
        bs = self.block_size
        ids = self.scheduler.kv_cache_manager.get_block_ids(req.request_id)
        end = req.num_computed_tokens
        start = end - n_sched
        toks = req.all_token_ids[:end]
        hs = self.prefix_hashes(toks)
        for li, n in enumerate(self.names):  # attention reads every earlier position
            blocks = ids[self.group_of[li]]
            for p in range(self._first_read(li, start), start):
                b = blocks[p // bs]
                if not torch.equal(self.kv[n][b, :, p % bs], self.kv_value(hs[p], li)):
                    self.bad_reads.append((req.request_id, p, b))
        for li, n in enumerate(self.names):  # this step's tokens: computed, written
            blocks = ids[self.group_of[li]]
            for p in range(start, end):
                self.kv[n][blocks[p // bs], :, p % bs] = self.kv_value(hs[p], li)
        self.computed[req.request_id] += n_sched
        crc = 0  # the sampled token: a hash of the K/V of every position it reads, as read
        for li, n in enumerate(self.names):
            blocks = ids[self.group_of[li]]
            for p in range(self._first_read(li, end - 1), end):
                crc = zlib.crc32(self.kv[n][blocks[p // bs], :, p % bs].numpy().tobytes(),
                                 crc)
        return (crc ^ hs[end - 1]) % 50000 + 3

    # -- one engine step -----------------------------------------------------------------
    def step(self):
        so = self.scheduler.schedule()
        self.steps += 1
        self.preempted |= set(getattr(so, "preempted_req_ids", None) or ())
        if self.before_load is not None:
            self.before_load(self, so)
        for r in so.scheduled_new_reqs:
            self.hits.setdefault(r.req_id, r.num_computed_tokens)
        meta = so.kv_connector_metadata
        w = self.worker
        w.handle_preemptions(meta)
        w.bind_connector_metadata(meta)
        w.start_load_kv(self.ctx)
        sampled, ids = {}, []
        for rid, n in so.num_scheduled_tokens.items():
            req = self.scheduler.requests[rid]
            tok = self._forward(req, n)
            if req.num_computed_tokens >= req.num_tokens:  # a full prefill or a decode
                sampled[rid] = [tok]
            ids.append(rid)
        w.wait_for_save()
        fs, fr = w.get_finished(so.finished_req_ids)
        invalid = w.get_block_ids_with_load_errors()
        self.invalid_reported |= invalid
        wmeta = w.build_connector_worker_meta()
        w.clear_connector_metadata()
        out = ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[sampled.get(r, []) for r in ids], logprobs=None,
            prompt_logprobs_dict={}, pooler_output=None,
            kv_connector_output=KVConnectorOutput(finished_sending=fs or set(),
                                                  finished_recving=fr or set(),
                                                  invalid_block_ids=invalid,
                                                  kv_connector_worker_meta=wmeta))
        eo = self.scheduler.update_from_output(so, out)
        for o in eo.values():
            for ro in o.outputs:
                self.outputs[ro.request_id].extend(ro.new_token_ids)
        return so

    def run(self, max_steps=400):
        """Step until every request finished and no transfer is in flight."""
        cs = self.scheduler.connector.connector_scheduler
        steps, deadline = 0, time.monotonic() + 300
        while steps < max_steps and time.monotonic() < deadline:
            if not self.scheduler.requests and not cs._jobs \
                    and not self.scheduler.finished_req_ids:
                return
            if not self.scheduler.requests:
                # only transfers in flight (a slowed emulated device): give them time rather
                # than steps, so a loaded machine does not run out of steps first
                time.sleep(0.005)
            else:
                steps += 1
            self.step()
        raise AssertionError(f"not done after {steps} steps")

    def settle(self):
        """Wait for the worker's jobs in flight and let the scheduler see them."""
        for _ in range(50):
            if not self.scheduler.connector.connector_scheduler._jobs:
                return
            self.step()

    def kv_events(self):
        """The KV cache events published so far, in order."""
        return [ev for b in (self.publisher.batches if self.publisher else ())
                for ev in b.events]

    def shutdown(self):
        self.worker.shutdown()
        self.scheduler.connector.shutdown()


def prompt(seed, n):
    """@n random token ids of seed @seed (the tests' prompts)."""
    import random
    rng = random.Random(seed)
    return [rng.randrange(10, 50000) for _ in range(n)]


def forget_gpu_cache(e):
    """Drop vLLM's GPU prefix cache and scribble over every GPU block, so that a later hit
    can only come from the connector and a block it did not load reads as wrong."""
    assert e.scheduler.kv_cache_manager.reset_prefix_cache()
    for t in e.kv.values():
        t.fill_(-1.0)


def store_name(e):
    """The kvtier store name of engine @e (kvtier_store_name, else vLLM's engine id)."""
    ktc = e.vc.kv_transfer_config
    return ktc.kv_connector_extra_config.get("kvtier_store_name") or ktc.engine_id
