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


MODELS = {"gemma3": gemma3, "deepseek-v3": deepseek_v3, "mistral-swa": mistral_swa,
          "qwen2-swa": qwen2_swa}


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


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def make(name, out_root, seed, tag):
    cls, cfg, lens = MODELS[name](seed)
    torch.manual_seed(seed)
    model = cls(cfg).to(torch.float32).eval()
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
                   ("config.json", "model.safetensors", "logits.safetensors")},
    }
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
    for name in a.only or sorted(MODELS):
        make(name, a.out, a.seed, a.tag)


if __name__ == "__main__":
    main()
