#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tools/hf-fixtures/gen.py - reference fixtures from Hugging Face transformers' own model code.

Issue 16 item 6: small models with seeded random weights whose reference outputs come from
transformers' implementations (not from code written here), for kvtier-hf (tools/kvtier-hf) to
match. Per model it writes tests/data/hf/<name>/:
  config.json, model.safetensors  exactly as save_pretrained() writes them (float32)
  reference.json                  prompt ids, greedy ids, the smallest greedy margin (top-1
                                  minus top-2 logit), versions, sha256 of the other files
  logits.safetensors              "logits" [n_positions - 1, vocab] float32: the logits after
                                  every position of the reference path (prompt + generated)

Command (a fresh machine, CPU only; torch from PyPI is large):
  python3 -m venv /tmp/hfvenv
  /tmp/hfvenv/bin/pip install -r tools/hf-fixtures/requirements.txt
  /tmp/hfvenv/bin/python tools/hf-fixtures/gen.py --out tests/data/hf
Issue 17's models (qwen3-next, deepseek-v32) need a later transformers (4.57.6 has no
deepseek_v32), pinned in requirements-17.txt, in a venv of its own:
  python3 -m venv /tmp/hfvenv17
  /tmp/hfvenv17/bin/pip install -r tools/hf-fixtures/requirements-17.txt
  /tmp/hfvenv17/bin/python tools/hf-fixtures/gen.py --out tests/data/hf
Without --only, gen.py writes the models pinned to the transformers it runs with (REQUIREMENTS
below); --only a model pinned to another version is refused. Those two also write
states.safetensors (qwen3-next: the Gated DeltaNet states after the prompt) and
indexer.safetensors (deepseek-v32: the indexer's top-k per position; dump_17()).
Options: --only NAME (one model), --seed N and --tag T (other seeds: held-back models are made
this way, e.g. --seed 7 --tag s7 writes <name>-s7/), --list.

Deterministic: seeded, CPU, float32, torch.use_deterministic_algorithms(True), one thread, the
CPU-independent kernels (ATEN_CPU_CAPABILITY=default, MKL_CBWR=COMPATIBLE, below), eager
attention (the implementation that applies the sliding window with an explicit mask). The greedy
path is computed by full forward passes without a cache (position t's logits are those of
tokens[0..t]), so no cache implementation is involved in the reference.
"""
import argparse
import hashlib
import json
import math
import os
import shutil
import sys

# Aiming at the same bits on any x86-64 CPU: ATen's scalar kernels instead of the AVX2/AVX-512
# ones it picks at run time (on an AVX-512 machine torch.randn itself gives other values than
# the scalar path), MKL's conditional numerical reproducibility (its SSE2 code paths), oneDNN
# held to SSE4.1, one thread. Set before torch is imported; the models are tiny. Checked on one
# CPU model only (AMD EPYC, AVX-512): two runs, and a fresh venv, wrote identical files.
for _k, _v in (("ATEN_CPU_CAPABILITY", "default"), ("MKL_CBWR", "COMPATIBLE"),
               ("ONEDNN_MAX_CPU_ISA", "SSE41"), ("OMP_NUM_THREADS", "1"),
               ("MKL_NUM_THREADS", "1")):
    os.environ[_k] = _v

import torch  # noqa: E402

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)

import safetensors.torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (  # noqa: E402
    DeepseekV3Config, DeepseekV3ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig,
    MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)


def gemma3(seed):
    """Gemma 3 text: 5 layers, sliding (window 16) and full mixed, q/k norms, final logit
    softcapping (attention softcapping stays null: transformers' Gemma 3 ignores it)."""
    cfg = Gemma3TextConfig(
        vocab_size=128, hidden_size=48, intermediate_size=64, num_hidden_layers=5,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=1000000.0,
        rope_local_base_freq=10000.0, query_pre_attn_scalar=16, sliding_window=16,
        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention", "full_attention"],
        final_logit_softcapping=30.0, attn_logit_softcapping=None, rope_scaling=None,
        tie_word_embeddings=False, attn_implementation="eager", bos_token_id=1, eos_token_id=2,
        pad_token_id=0)
    return Gemma3ForCausalLM, cfg, dict(prompt=48, gen=112, emb_std=48 ** -0.5)


def deepseek_v3(seed):
    """DeepSeek-V3 with MLA (q_lora_rank set), dense MLP in every layer, no rope scaling."""
    cfg = DeepseekV3Config(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
        topk_group=1, first_k_dense_replace=3, q_lora_rank=24, kv_lora_rank=32,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, max_position_embeddings=512,
        rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None, rope_interleave=True,
        tie_word_embeddings=False, attn_implementation="eager", bos_token_id=1,
        eos_token_id=2, pad_token_id=0)
    return DeepseekV3ForCausalLM, cfg, dict(prompt=40, gen=88)


def mistral_swa(seed):
    """Mistral with a 16-token sliding window in every layer, GQA."""
    cfg = MistralConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0,
        sliding_window=16, tie_word_embeddings=False, attn_implementation="eager",
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return MistralForCausalLM, cfg, dict(prompt=48, gen=112)


def qwen2_swa(seed):
    """Qwen2 with q/k/v biases and a 16-token sliding window in every layer."""
    cfg = Qwen2Config(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        rms_norm_eps=1e-6, rope_theta=10000.0, use_sliding_window=True, sliding_window=16,
        max_window_layers=0, tie_word_embeddings=False, attn_implementation="eager",
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return Qwen2ForCausalLM, cfg, dict(prompt=48, gen=112)


def qwen3_next(seed):
    """Qwen3-Next: 4 layers, Gated DeltaNet (linear attention: 2 key heads, 4 value heads of 16,
    conv kernel 4) in layers 0-2 and gated full attention (GQA 4/2, head_dim 16, partial rotary
    0.25) in layer 3, as the 80B model's every-4th pattern; dense MLP in every layer
    (mlp_only_layers: the MoE block is never built). Needs requirements-17.txt."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
    cfg = Qwen3NextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=512, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25},
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention",
                     "full_attention"],
        mlp_only_layers=[0, 1, 2, 3], num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=32,
        tie_word_embeddings=False, attn_implementation="eager", bos_token_id=1,
        eos_token_id=2, pad_token_id=0)
    return Qwen3NextForCausalLM, cfg, dict(prompt=40, gen=88)


def qwen3_next_rot5(seed):
    """Qwen3-Next with an odd rotary part: head_dim 20 x partial_rotary_factor 0.25 = 5, which
    transformers' rope turns into 3 frequencies over 6 dims (inv_freq = 1 / base^(arange(0, 5,
    2) / 5)); one Gated DeltaNet layer then one full-attention layer, MQA. Needs
    requirements-17.txt."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
    cfg = Qwen3NextConfig(
        vocab_size=120, hidden_size=40, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=20,
        max_position_embeddings=512, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25},
        linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_num_key_heads=2, linear_num_value_heads=4,
        layer_types=["linear_attention", "full_attention"],
        mlp_only_layers=[0, 1], num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=32,
        tie_word_embeddings=False, attn_implementation="eager", bos_token_id=1,
        eos_token_id=2, pad_token_id=0)
    return Qwen3NextForCausalLM, cfg, dict(prompt=20, gen=60)


def deepseek_v32(seed):
    """DeepSeek-V3.2 (DSA): MLA as deepseek-v3 plus the sparse indexer (16 heads of 16, top-k 8
    of a 128-token path: each query attends to at most 8 tokens), dense MLP in every layer.
    Needs requirements-17.txt."""
    from transformers import DeepseekV32Config, DeepseekV32ForCausalLM
    cfg = DeepseekV32Config(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
        topk_group=1, first_k_dense_replace=3, q_lora_rank=24, kv_lora_rank=32,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, max_position_embeddings=512,
        index_topk=8, index_head_dim=16, index_n_heads=16,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False, attn_implementation="eager", bos_token_id=1,
        eos_token_id=2, pad_token_id=0)
    return DeepseekV32ForCausalLM, cfg, dict(prompt=40, gen=88)


MODELS = {"gemma3": gemma3, "deepseek-v3": deepseek_v3, "mistral-swa": mistral_swa,
          "qwen2-swa": qwen2_swa, "qwen3-next": qwen3_next, "deepseek-v32": deepseek_v32,
          "qwen3-next-rot5": qwen3_next_rot5}

# The pinned environment of each model (a file beside this one): the issue-16 models keep
# transformers 4.57.6 (their committed fixtures were written with it); qwen3_next and
# deepseek_v32 need the later version of requirements-17.txt (4.57.6 has no deepseek_v32).
REQUIREMENTS = {"qwen3-next": "requirements-17.txt", "deepseek-v32": "requirements-17.txt",
                "qwen3-next-rot5": "requirements-17.txt"}


def pinned_transformers(name):
    """The transformers version pinned for model @name."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        REQUIREMENTS.get(name, "requirements.txt"))
    with open(path) as f:
        for line in f:
            if line.startswith("transformers=="):
                return line.strip().split("==")[1]
    raise SystemExit(f"{path}: no transformers== line")


def init_weights(model, seed, emb_std):
    """Weights of O(1) activations (transformers' default std 0.02 makes near-flat logits
    whose argmax is a coin toss): matrices N(0, 1/fan_in), embeddings N(0, emb_std^2) (Gemma
    multiplies them by sqrt(hidden): 1/sqrt(hidden) keeps its residual O(1), else its own
    token wins every step), norm weights around their neutral value, biases N(0, 0.1)."""
    g = torch.Generator().manual_seed(seed)
    gemma = model.config.model_type.startswith("gemma")
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.dim() == 2 and "embed_tokens" in name:
                p.copy_(emb_std * torch.randn(p.shape, generator=g))
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
            elif "norm" in name:
                base = 0.0 if gemma else 1.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


# Norm classes whose weight multiplies as (1 + weight) (zero-centred): their neutral value is 0.
ZERO_CENTRED_NORMS = ("Qwen3NextRMSNorm",)


def init_weights_17(model, seed, emb_std):
    """init_weights() for the issue-17 models (init_weights itself stays as it is: the issue-16
    fixtures depend on its exact sequence of draws). Same scales, plus: the depthwise conv
    weight [C, 1, K] N(0, 1/K); each norm's weight around its neutral value, read from the
    norm's class (Qwen3-Next's RMSNorm is zero-centred, its gated RMSNorm and LayerNorm are
    not); LayerNorm biases N(0, 0.1); A_log and dt_bias (Gated DeltaNet gates) N(0, 0.1)."""
    g = torch.Generator().manual_seed(seed)
    owner = {}
    for mname, mod in model.named_modules():
        for pname, _ in mod.named_parameters(recurse=False):
            owner[f"{mname}.{pname}" if mname else pname] = type(mod).__name__
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            cls = owner.get(name, "")
            if p.dim() == 2 and "embed_tokens" in name:
                p.copy_(emb_std * torch.randn(p.shape, generator=g))
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
            elif p.dim() == 3:  # depthwise conv1d [channels, 1, kernel]
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[2]))
            elif "Norm" in cls and name.endswith(".weight"):
                base = 0.0 if cls in ZERO_CENTRED_NORMS else 1.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def dump_17(name, model, prompt, toks, d, extra):
    """Extra references of the issue-17 models, for the kernel tests and the C forward pass:
    qwen3-next: states.safetensors, per Gated DeltaNet layer i the cache after the prompt
      (one cached forward pass over the prompt): "layer<i>.conv" [conv_dim, K] (transformers'
      conv state: the last K inputs of the short convolution, oldest first; kvtier keeps the
      last K - 1) and "layer<i>.recurrent" [n_v_heads, k_dim, v_dim] float32.
    deepseek-v32: indexer.safetensors, per layer i "layer<i>.topk" [n_positions, index_topk]
      int32: the token indices the indexer picked for every position of the full reference
      pass (positions < index_topk list masked future positions too; the mask drops them),
      and extra["min_topk_margin"]: over all layers and positions with more than index_topk
      visible tokens (position r sees 0..r), the smallest gap between the k-th and (k+1)-th
      index score (a C forward pass reproduces the selection only while its rounding error
      stays well below this).
    Keyed on the model's model_type, so that variants.py's models of these families get them too.
    Returns the file names written; adds entries to @extra (reference.json)."""
    kind = model.config.model_type
    if kind == "qwen3_next":
        with torch.no_grad():
            out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        cache = out.past_key_values
        t = {}
        for i, kind in enumerate(model.config.layer_types):
            if kind != "linear_attention":
                continue
            layer = cache.layers[i]
            t[f"layer{i}.conv"] = layer.conv_states[0][0].to(torch.float32).contiguous()
            t[f"layer{i}.recurrent"] = layer.recurrent_states[0][0].to(torch.float32).contiguous()
        safetensors.torch.save_file(t, os.path.join(d, "states.safetensors"),
                                    metadata={"format": "pt"})
        return ["states.safetensors"]
    if kind == "deepseek_v32":
        picked, margins, hooks = {}, [], []
        topk = torch.Tensor.topk

        def recording_topk(x, k, *args, **kwargs):
            # the indexer's only topk call: index_scores [1, S, T]; row r sees tokens 0..r
            # (the causal mask is additive, finfo.min, not -inf)
            for r, row in enumerate(x[0]):
                v = torch.sort(row[:r + 1], descending=True).values
                if v.numel() > k:
                    margins.append(float(v[k - 1] - v[k]))
            return topk(x, k, *args, **kwargs)

        def pre(_m, _inp):
            torch.Tensor.topk = recording_topk

        for i, layer in enumerate(model.model.layers):
            def hook(_m, _inp, output, i=i):
                torch.Tensor.topk = topk
                picked[i] = output[0].to(torch.int32).contiguous()
            hooks.append(layer.self_attn.indexer.register_forward_pre_hook(pre))
            hooks.append(layer.self_attn.indexer.register_forward_hook(hook))
        try:
            with torch.no_grad():
                model(input_ids=torch.tensor([toks[:-1]]), use_cache=False)
        finally:
            torch.Tensor.topk = topk
            for h in hooks:
                h.remove()
        t = {f"layer{i}.topk": picked[i] for i in sorted(picked)}
        safetensors.torch.save_file(t, os.path.join(d, "indexer.safetensors"),
                                    metadata={"format": "pt"})
        extra["min_topk_margin"] = min(margins)
        return ["indexer.safetensors"]
    return []


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def make(name, out_root, seed, tag):
    cls, cfg, lens = MODELS[name](seed)
    torch.manual_seed(seed)
    model = cls(cfg).to(torch.float32).eval()
    if name in REQUIREMENTS:
        init_weights_17(model, seed, lens.get("emb_std", 1.0))
    else:
        init_weights(model, seed, lens.get("emb_std", 1.0))
    g = torch.Generator().manual_seed(seed + 1000)
    prompt = torch.randint(3, cfg.vocab_size, (lens["prompt"],), generator=g).tolist()
    toks = list(prompt)
    with torch.no_grad():
        for _ in range(lens["gen"]):
            ids = torch.tensor([toks])
            logits = model(input_ids=ids, use_cache=False).logits[0, -1]
            toks.append(int(torch.argmax(logits)))
        # the logits after every position of the reference path, in one forward pass
        full = model(input_ids=torch.tensor([toks[:-1]]), use_cache=False).logits[0]
    full = full.to(torch.float32).contiguous()
    gen = toks[len(prompt):]
    for i, t in enumerate(gen):  # the greedy path is the argmax of the full pass too
        if int(torch.argmax(full[len(prompt) - 1 + i])) != t:
            print(f"{name}: warning: step {i}: argmax of the full pass differs from the "
                  f"incremental one", file=sys.stderr)
    top2 = torch.topk(full, 2, dim=-1).values
    margins = (top2[:, 0] - top2[:, 1])[len(prompt) - 1:]
    d = os.path.join(out_root, name + (f"-{tag}" if tag else ""))
    if os.path.isdir(d):
        shutil.rmtree(d)
    model.save_pretrained(d, safe_serialization=True)
    for extra in ("generation_config.json",):
        p = os.path.join(d, extra)
        if os.path.exists(p):
            os.remove(p)
    safetensors.torch.save_file({"logits": full}, os.path.join(d, "logits.safetensors"),
                                metadata={"format": "pt"})
    extra = {}
    extra_files = dump_17(name, model, prompt, toks, d, extra)
    ref = {
        "model": name,
        "model_type": cfg.model_type,
        "seed": seed,
        "generator": "tools/hf-fixtures/gen.py",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "safetensors": safetensors.__version__},
        "cpu_env": {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "MKL_CBWR",
                                               "ONEDNN_MAX_CPU_ISA")},
        "attn_implementation": "eager",
        "prompt_ids": prompt,
        "generated_ids": gen,
        "n_positions": len(toks) - 1,
        "logits_file": "logits.safetensors",
        "logits_shape": list(full.shape),
        "min_greedy_margin": float(margins.min()),
        "max_abs_logit": float(full.abs().max()),
        "sha256": {f: sha256(os.path.join(d, f)) for f in
                   ("config.json", "model.safetensors", "logits.safetensors",
                    *extra_files)},
    }
    if extra_files:
        ref["extra_files"] = extra_files
    ref.update(extra)
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    print(f"{d}: {len(prompt)} prompt + {len(gen)} generated tokens, {size} bytes, "
          f"min greedy margin {ref['min_greedy_margin']:.4f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/data/hf")
    ap.add_argument("--only", action="append", choices=sorted(MODELS))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tag", default="")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if a.list:
        print("\n".join(sorted(MODELS)))
        return
    os.makedirs(a.out, exist_ok=True)
    have = transformers.__version__
    names = a.only or [n for n in sorted(MODELS) if pinned_transformers(n) == have]
    if not names:
        raise SystemExit(f"transformers {have}: no model is pinned to this version (see "
                         f"requirements.txt and requirements-17.txt)")
    for name in names:
        if pinned_transformers(name) != have:
            raise SystemExit(f"{name}: needs transformers {pinned_transformers(name)} "
                             f"({REQUIREMENTS.get(name, 'requirements.txt')}), this is {have}")
        make(name, a.out, a.seed, a.tag)


if __name__ == "__main__":
    main()
