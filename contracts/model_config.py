"""The architecture of a LLaMA-family checkpoint, read from its Hugging Face ``config.json``.

This module is pure standard library on purpose: the control plane imports it to register models
and to profile them for the planner without importing torch, and the stage engine builds its
modules from the same object, so the two can never disagree about what a checkpoint contains.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")
SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")
SUPPORTED_ACTIVATIONS = ("silu",)


class UnsupportedModelError(ValueError):
    """A config that motley cannot run; the message names the field at fault."""


@dataclass(frozen=True)
class ModelConfig:
    """Everything the engine and the planner need to know about a decoder's shape."""

    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    torch_dtype: str = "float32"
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def dtype_bytes(self) -> int:
        return 4 if self.torch_dtype == "float32" else 2

    @classmethod
    def from_file(cls, path: str | Path) -> "ModelConfig":
        """Read ``config.json`` from a file or from the checkpoint directory that holds it."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise UnsupportedModelError(f"{path}: no config.json found") from None
        except json.JSONDecodeError as exc:
            raise UnsupportedModelError(f"{path}: not valid JSON ({exc})") from None
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "ModelConfig":
        """Validate a Hugging Face config and refuse, by field name, anything the engine cannot run."""
        if not isinstance(raw, dict):
            raise UnsupportedModelError("config: expected a JSON object")
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"model_type: {model_type!r} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                    "vocab_size"):
            value = raw.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise UnsupportedModelError(f"{key}: expected a positive integer, got {value!r}")
        hidden, heads = raw["hidden_size"], raw["num_attention_heads"]
        kv_heads = raw.get("num_key_value_heads") or heads
        if heads % kv_heads:
            raise UnsupportedModelError(
                f"num_key_value_heads: {kv_heads} does not divide num_attention_heads {heads}"
            )
        head_dim = raw.get("head_dim") or hidden // heads
        if raw.get("head_dim") is None and hidden % heads:
            raise UnsupportedModelError(f"num_attention_heads: {heads} does not divide hidden_size {hidden}")
        activation = raw.get("hidden_act", "silu")
        if activation not in SUPPORTED_ACTIVATIONS:
            raise UnsupportedModelError(f"hidden_act: {activation!r} is not supported (only silu / SwiGLU)")
        rope_scaling = _validated_rope_scaling(raw.get("rope_scaling"))
        dtype = raw.get("torch_dtype") or raw.get("dtype") or "float32"
        if dtype not in SUPPORTED_DTYPES:
            raise UnsupportedModelError(f"torch_dtype: {dtype!r} is not supported "
                                        f"({', '.join(SUPPORTED_DTYPES)})")
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())
        return cls(
            model_type=model_type,
            hidden_size=hidden,
            num_layers=raw["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=raw["intermediate_size"],
            vocab_size=raw["vocab_size"],
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(raw.get("rope_theta", 10000.0)),
            rope_scaling=rope_scaling,
            max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            # Qwen2 always carries q/k/v biases; LLaMA configs say so with attention_bias.
            attention_bias=model_type == "qwen2" or bool(raw.get("attention_bias", False)),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            torch_dtype=dtype,
            sliding_window=_active_sliding_window(raw),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )


def _validated_rope_scaling(scaling: Any) -> dict[str, Any] | None:
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise UnsupportedModelError(f"rope_scaling: expected an object, got {scaling!r}")
    rope_type = scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"rope_scaling.rope_type: {rope_type!r} is not supported ({', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    return {**scaling, "rope_type": rope_type}


def _active_sliding_window(raw: dict[str, Any]) -> int | None:
    """The attention window in tokens where it can matter (Mistral v0.1), else None.

    Qwen2 configs carry a window but switch it off with ``use_sliding_window: false``; a window at
    least as long as the model's context never masks anything.
    """
    window = raw.get("sliding_window")
    uses_window = raw.get("use_sliding_window", raw.get("model_type") == "mistral")
    max_positions = int(raw.get("max_position_embeddings", 4096))
    if uses_window and isinstance(window, int) and 0 < window < max_positions:
        return window
    return None
