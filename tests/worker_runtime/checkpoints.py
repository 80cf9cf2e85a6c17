"""Tiny random Hugging Face checkpoints, made offline with transformers' own config classes."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    vocab_size=256,
    initializer_range=0.1,
    torch_dtype="float32",
)

VARIANTS: dict[str, tuple[type, type, dict]] = {
    "llama_gqa_llama3": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(
            num_hidden_layers=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ),
    ),
    "llama_dynamic_tied": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(
            num_hidden_layers=3,
            num_key_value_heads=1,
            max_position_embeddings=24,
            rope_scaling={"rope_type": "dynamic", "factor": 2.0},
            tie_word_embeddings=True,
        ),
    ),
    "llama_linear_bias": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(
            num_hidden_layers=3,
            num_key_value_heads=4,
            rope_scaling={"rope_type": "linear", "factor": 2.0},
            attention_bias=True,
            mlp_bias=True,
        ),
    ),
    "llama_yarn": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(
            num_hidden_layers=2,
            num_key_value_heads=2,
            max_position_embeddings=128,
            rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
        ),
    ),
    # Weights of 1-4 MiB: the dense layers decode on our fp32 kernel or oneDNN (worker_runtime.dense).
    "llama_wide": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(
            num_hidden_layers=2,
            hidden_size=512,
            intermediate_size=1024,
            num_attention_heads=8,
            num_key_value_heads=2,
            initializer_range=0.02,
        ),
    ),
    "qwen2_bias": (
        Qwen2Config,
        Qwen2ForCausalLM,
        dict(num_hidden_layers=5, num_key_value_heads=2, tie_word_embeddings=False, use_sliding_window=False),
    ),
}


def make_checkpoint(variant: str, out: Path, seed: int = 0, dtype: torch.dtype = torch.float32,
                    config_dtype: str | None = None) -> Path:
    """``variant``'s random weights saved in ``dtype``; config.json's torch_dtype says ``config_dtype``
    (by default ``dtype``'s name)."""
    config_cls, model_cls, extra = VARIANTS[variant]
    return save_checkpoint(config_cls(**{**COMMON, **extra}), model_cls, out, seed, dtype, config_dtype)


def save_checkpoint(config, model_cls: type, out: Path, seed: int = 0, dtype: torch.dtype = torch.float32,
                    config_dtype: str | None = None) -> Path:
    """A ``model_cls`` of ``config`` with random weights (biases too), saved as ``make_checkpoint`` says."""
    torch.manual_seed(seed)
    model = model_cls(config)
    biases = ("attention_bias", "mlp_bias")
    if any(getattr(config, name, False) for name in biases) or config.model_type == "qwen2":
        with torch.no_grad():  # biases start at zero; make them matter
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0, 0.1)
    model.to(dtype).save_pretrained(out, safe_serialization=True)
    config = json.loads((out / "config.json").read_text())
    config["torch_dtype"] = config_dtype or str(dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(config))
    return out


def hf_model(path: Path):
    model = LlamaForCausalLM if "llama" in path.name else Qwen2ForCausalLM
    return model.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="eager").eval()
