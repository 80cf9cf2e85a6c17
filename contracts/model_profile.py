"""Per-layer cost profile of a model: what the planner needs to price a stage.

Pure Python (no Django, no torch). Built from a ``contracts.model_config.ModelConfig`` by
``profile_model`` (see ``contracts/profiler.py``), stored as JSON in the model catalog and
handed to the planner.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

BITS = (16, 8, 4)


@dataclass(frozen=True)
class LayerProfile:
    """One decoder layer (or the embedding / final norm + lm_head extras)."""

    params: int
    # Bytes of the weights stored at each precision, quantization scales included.
    # Keys are bits (16, 8, 4); tensors that are never quantized (norms, biases) stay 16-bit in all.
    weight_bytes: dict[int, int]
    flops_per_token: int  # matmul FLOPs per token, context-independent part (2 * params of the matmuls)
    attention_flops_per_token_per_context: int  # extra FLOPs per token per token of context (QK^T and PV)
    kv_bytes_per_token: int  # KV cache bytes per token of context, 16-bit cache


@dataclass(frozen=True)
class ModelProfile:
    name: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    activation_bytes_per_token: int  # hidden state crossing a stage boundary, 16-bit
    layers: tuple[LayerProfile, ...]
    embedding: LayerProfile  # held by the first stage
    head: LayerProfile  # final norm + lm_head, held by the last stage (tied: its own copy of the matrix)
    total_params: int  # the model's real parameter count (a tied matrix counted once)
    extra: dict[str, Any] = field(default_factory=dict)
    # Measured quality (``manage.py profile_quality``): bits -> per decoder layer, the mean KL divergence
    # (nats per token) of the next-token distribution when that layer alone runs at those bits. Empty
    # when the model was never measured: the planner then counts low-bit layers instead.
    sensitivity: dict[int, tuple[float, ...]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelProfile":
        def layer(d: dict[str, Any]) -> LayerProfile:
            return LayerProfile(**{**d, "weight_bytes": {int(k): v for k, v in d["weight_bytes"].items()}})

        return cls(
            **{
                **data,
                "layers": tuple(layer(d) for d in data["layers"]),
                "embedding": layer(data["embedding"]),
                "head": layer(data["head"]),
                "sensitivity": {int(b): tuple(v) for b, v in data.get("sensitivity", {}).items()},
            }
        )
