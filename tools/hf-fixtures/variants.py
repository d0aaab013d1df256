#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tools/hf-fixtures/variants.py - models of the same families in other shapes, for trying
kvtier-hf on models it was not written against (held-back style; not committed as fixtures).

  /tmp/hfvenv/bin/python tools/hf-fixtures/variants.py --seed 7 --out /tmp/hfvar
  for d in /tmp/hfvar/*; do ./build/kvtier-hf --model-dir $d --check $d \\
      --tokens-per-block 8 --hbm-frac 0.1 --host-frac 0.25 --park-every 13; done

Shapes: Gemma 3 with tied embeddings, head_dim 24, MQA, sliding_window_pattern 3 (no
layer_types given), no softcapping; DeepSeek-V3 without q_lora_rank and with rope_interleave
off, and with q_lora_rank 12; Qwen2 with max_window_layers 1 (layer 0 full); Mistral MHA, 8
heads of 8, window 32.

Issue 17's families (qwen3_next, deepseek_v32) need transformers 5.20.2 (requirements-17.txt);
each venv writes the variants pinned to its transformers (as gen.py does):
  /tmp/hfvenv17/bin/python tools/hf-fixtures/variants.py --seed 7 --out /tmp/hfvar17
  for d in /tmp/hfvar17/*; do ./build/kvtier-hf --model-dir $d --check $d \\
      --tokens-per-block 8 --hbm-frac 0.1 --host-frac 0.25 --park-every 13; done
Qwen3-Next (dense MLP in every layer): linear value heads == key heads, key dim 8 != value dim
16, conv kernel 3, head_dim 24 with partial_rotary_factor 0.5, full attention first and twice
([full, linear, linear, full, linear]), MQA, tied embeddings; value heads 3x the key heads,
conv kernel 5, partial_rotary_factor 1.0 given at the top level (no rope_parameters), no
layer_types (full_attention_interval 3: layers 2 and 5 full), MHA; head_dim 20 with
partial_rotary_factor 0.25 (a rotary part of 5 dims: transformers' rope then covers 6).
DeepSeek-V3.2 (dense MLP in every layer, mlp_layer_types given): index_topk 4, one indexer
head of 8 (== qk_rope_head_dim: no un-roped part), q_lora_rank 16, 4 layers, 170 positions;
index_topk 32, 4 heads of 32, qk_rope_head_dim 4, q_lora_rank 40, 5 layers, 250 positions;
index_topk 16 with a 10-token prompt (early steps see fewer than index_topk tokens), 2 layers.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen  # noqa: E402  (sets the CPU environment before torch is imported)
from transformers import (  # noqa: E402
    DeepseekV3Config, DeepseekV3ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig,
    MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)


def gemma3_tied(seed):
    cfg = Gemma3TextConfig(
        vocab_size=200, hidden_size=40, intermediate_size=72, num_hidden_layers=6,
        num_attention_heads=2, num_key_value_heads=1, head_dim=24, max_position_embeddings=300,
        rope_theta=500000.0, rope_local_base_freq=10000.0, query_pre_attn_scalar=24,
        sliding_window=24, sliding_window_pattern=3, final_logit_softcapping=None,
        attn_implementation="eager", tie_word_embeddings=True)
    return Gemma3ForCausalLM, cfg, dict(prompt=30, gen=170, emb_std=40 ** -0.5)


def deepseek_plain_q(seed):
    cfg = DeepseekV3Config(
        vocab_size=100, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
        num_attention_heads=3, num_key_value_heads=3, first_k_dense_replace=2, q_lora_rank=None,
        kv_lora_rank=20, qk_rope_head_dim=6, qk_nope_head_dim=10, v_head_dim=12,
        rope_scaling=None, rope_interleave=False, n_routed_experts=4, num_experts_per_tok=2,
        n_group=1, topk_group=1, attn_implementation="eager", tie_word_embeddings=False)
    return DeepseekV3ForCausalLM, cfg, dict(prompt=17, gen=90)


def deepseek_lora_q(seed):
    cls, cfg, lens = deepseek_plain_q(seed)
    cfg.rope_interleave = True
    cfg.q_lora_rank = 12
    return cls, cfg, lens


def qwen2_first_full(seed):
    cfg = Qwen2Config(
        vocab_size=150, hidden_size=32, intermediate_size=50, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=1, use_sliding_window=True, sliding_window=20,
        max_window_layers=1, tie_word_embeddings=False, attn_implementation="eager")
    return Qwen2ForCausalLM, cfg, dict(prompt=25, gen=150)


def mistral_mha(seed):
    cfg = MistralConfig(
        vocab_size=90, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=8, head_dim=8, sliding_window=32,
        tie_word_embeddings=False, attn_implementation="eager")
    return MistralForCausalLM, cfg, dict(prompt=60, gen=200)


def qwen3_next_eq_heads(seed):
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
    cfg = Qwen3NextConfig(
        vocab_size=150, hidden_size=48, intermediate_size=80, num_hidden_layers=5,
        num_attention_heads=3, num_key_value_heads=1, head_dim=24,
        max_position_embeddings=512, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                         "partial_rotary_factor": 0.5},
        linear_conv_kernel_dim=3, linear_key_head_dim=8, linear_value_head_dim=16,
        linear_num_key_heads=3, linear_num_value_heads=3,
        layer_types=["full_attention", "linear_attention", "linear_attention",
                     "full_attention", "linear_attention"],
        mlp_only_layers=[0, 1, 2, 3, 4], num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=32,
        tie_word_embeddings=True, attn_implementation="eager")
    return Qwen3NextForCausalLM, cfg, dict(prompt=30, gen=130, emb_std=0.5)


def qwen3_next_3x(seed):
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
    cfg = Qwen3NextConfig(
        vocab_size=100, hidden_size=40, intermediate_size=64, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=4, head_dim=16,
        max_position_embeddings=512, rms_norm_eps=1e-5, partial_rotary_factor=1.0,
        full_attention_interval=3,
        linear_conv_kernel_dim=5, linear_key_head_dim=16, linear_value_head_dim=8,
        linear_num_key_heads=2, linear_num_value_heads=6,
        mlp_only_layers=list(range(6)), num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=32,
        tie_word_embeddings=False, attn_implementation="eager")
    return Qwen3NextForCausalLM, cfg, dict(prompt=45, gen=120)


def qwen3_next_odd_rotary(seed):
    cls, cfg, lens = gen.qwen3_next_rot5(seed)  # the committed qwen3-next-rot5's shape
    return cls, cfg, dict(lens, gen=80)


def _dsv32(n_layers, **kw):
    from transformers import DeepseekV32Config, DeepseekV32ForCausalLM
    base = dict(
        vocab_size=110, hidden_size=48, intermediate_size=80, moe_intermediate_size=32,
        num_hidden_layers=n_layers, num_attention_heads=2, num_key_value_heads=2,
        n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
        topk_group=1, first_k_dense_replace=n_layers, mlp_layer_types=["dense"] * n_layers,
        kv_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=20,
        max_position_embeddings=512, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False, attn_implementation="eager")
    base.update(kw)
    return DeepseekV32ForCausalLM, DeepseekV32Config(**base)


def deepseek_v32_topk4(seed):
    cls, cfg = _dsv32(4, q_lora_rank=16, index_topk=4, index_n_heads=1, index_head_dim=8)
    return cls, cfg, dict(prompt=20, gen=150)


def deepseek_v32_topk32(seed):
    cls, cfg = _dsv32(5, hidden_size=64, num_attention_heads=3, num_key_value_heads=3,
                      q_lora_rank=40, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=12,
                      kv_lora_rank=16, index_topk=32, index_n_heads=4, index_head_dim=32)
    return cls, cfg, dict(prompt=50, gen=200)


def deepseek_v32_short_prompt(seed):
    cls, cfg = _dsv32(2, q_lora_rank=20, qk_rope_head_dim=6, index_topk=16, index_n_heads=3,
                      index_head_dim=10)
    return cls, cfg, dict(prompt=10, gen=120)


gen.MODELS = {"gemma3-tied": gemma3_tied, "deepseek-plain-q": deepseek_plain_q,
              "deepseek-lora-q": deepseek_lora_q, "qwen2-first-full": qwen2_first_full,
              "mistral-mha": mistral_mha, "qwen3-next-eq-heads": qwen3_next_eq_heads,
              "qwen3-next-3x": qwen3_next_3x, "qwen3-next-odd-rotary": qwen3_next_odd_rotary,
              "deepseek-v32-topk4": deepseek_v32_topk4,
              "deepseek-v32-topk32": deepseek_v32_topk32,
              "deepseek-v32-short-prompt": deepseek_v32_short_prompt}
# the issue-17 families: pinned to requirements-17.txt, and gen.py's init_weights_17
gen.REQUIREMENTS.update({n: "requirements-17.txt" for n in gen.MODELS
                         if n.startswith(("qwen3-next", "deepseek-v32"))})

if __name__ == "__main__":
    gen.main()
