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


gen.MODELS = {"gemma3-tied": gemma3_tied, "deepseek-plain-q": deepseek_plain_q,
              "deepseek-lora-q": deepseek_lora_q, "qwen2-first-full": qwen2_first_full,
              "mistral-mha": mistral_mha}

if __name__ == "__main__":
    gen.main()
