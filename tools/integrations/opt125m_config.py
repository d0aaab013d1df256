# SPDX-License-Identifier: MIT
"""Write facebook/opt-125m's config.json (the model vLLM's unit tests name) into a local
Hugging Face cache, so that vllm.config.ModelConfig resolves it with HF_HUB_OFFLINE=1 and no
network. Only the architecture is needed (no weights, no tokenizer: the tests drive vLLM's
scheduler and connectors, not a forward pass).

    python opt125m_config.py HF_HOME
"""
import json
import os
import sys

CONFIG = {
    "_name_or_path": "facebook/opt-125m", "activation_dropout": 0.0,
    "activation_function": "relu", "architectures": ["OPTForCausalLM"],
    "attention_dropout": 0.0, "bos_token_id": 2, "do_layer_norm_before": True,
    "dropout": 0.1, "enable_bias": True, "eos_token_id": 2, "ffn_dim": 3072,
    "hidden_size": 768, "init_std": 0.02, "layer_norm_elementwise_affine": True,
    "layerdrop": 0.0, "max_position_embeddings": 2048, "model_type": "opt",
    "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 1,
    "prefix": "</s>", "torch_dtype": "float16", "transformers_version": "4.21.0.dev0",
    "use_cache": True, "vocab_size": 50272, "word_embed_proj_dim": 768,
}
REV = "0" * 40  # a local revision name: refs/main points at it


def main(hf_home):
    repo = os.path.join(hf_home, "hub", "models--facebook--opt-125m")
    snap = os.path.join(repo, "snapshots", REV)
    os.makedirs(snap, exist_ok=True)
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(REV)
    with open(os.path.join(snap, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    with open(os.path.join(snap, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 2, "eos_token_id": 2, "pad_token_id": 1}, f)
    print(f"opt125m_config: {snap}/config.json")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/huggingface"))
