# SPDX-License-Identifier: MIT
"""SGLang 0.5.23's own MHATokenToKVPoolHost on CPU tensors, filled with seeded random K/V: the
host pool the SGLang backend's tests and tools/integrations/bench_sglang.py drive."""
import torch
from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost


def mha_host_pool(layers, heads, dim, page, tokens, layout="layer_first", seed=7):
    """An MHATokenToKVPoolHost of @layers x @heads x @dim (float16), @page tokens a page, over
    a stand-in device pool of @tokens tokens (SGLang sizes the host pool at twice that), in
    @layout; its kv_buffer holds torch.randn from @seed."""
    k = tuple(torch.zeros(tokens, heads, dim, dtype=torch.float16) for _ in range(layers))
    v = tuple(torch.zeros(tokens, heads, dim, dtype=torch.float16) for _ in range(layers))
    ptrs = [torch.tensor([t.data_ptr() for t in x], dtype=torch.uint64) for x in (k, v)]
    info = MHABufferInfo(buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs[0], v_data_ptrs=ptrs[1],
                                           layout=KVBufferLayout.NHD),
                         page_size=page, head_num=heads, head_dim=dim, v_head_dim=dim,
                         dtype=torch.float16, device=torch.device("cpu"))
    hp = MHATokenToKVPoolHost(info, 2.0, 0, page, layout, pin_memory=False, device="cpu",
                              device_capacity_tokens=tokens, start_layer=0, end_layer=layers)
    g = torch.Generator().manual_seed(seed)
    hp.kv_buffer.copy_(torch.randn(hp.kv_buffer.shape, generator=g).to(torch.float16))
    return hp
