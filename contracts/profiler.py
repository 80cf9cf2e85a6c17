"""Count what each layer of a LLaMA-family decoder weighs and costs, from its config alone.

The planner prices a stage from these figures, so they follow the tensors the stage engine loads
(Hugging Face names): per decoder layer q/k/v/o projections (biases where the config has them:
q/k/v for Qwen2, all four for a LLaMA config with ``attention_bias``), gate/up/down projections
(biases with ``mlp_bias``) and two RMSNorm weights; the embedding on the first stage; the final
norm and ``lm_head`` on the last stage.

Quantization (weight-only; what the stage engine applies to every nn.Linear):
- int8: one int8 per weight plus one 16-bit scale per output channel (per row of the weight;
  bf16 in the stage engine); ``lm_head`` instead has one per ``HEAD_INT8_GROUP`` weights of a row
  where that divides its input (llama.cpp's Q8_0 blocks): per row, SmolLM2's head, tied to an
  embedding stored as Q8_0, alone took whole-model int8 past 1 % of fp32 perplexity
  (docs/benchmarks.md).
- int4: two weights per byte, grouped along the input dimension (``group_size``, default 32),
  with a 16-bit scale and zero point per group per output channel.
- Norms, biases and the embedding table stay 16-bit at every precision: the embedding is a lookup
  whose bytes barely matter next to a stage's matmuls, and quantizing it would cost accuracy for
  nothing. ``lm_head`` is a matmul and is quantized like the others.
"""

from __future__ import annotations

from math import ceil

from contracts.model_config import ModelConfig
from contracts.model_profile import LayerProfile, ModelProfile

# Groups of 32 (the smallest torch's int4 kernels take): within 10 % of fp32 perplexity on SmolLM2-135M
# where 128 (64 in practice, for its 576-wide inputs) doubled it; see docs/benchmarks.md.
DEFAULT_GROUP_SIZE = 32
HEAD_INT8_GROUP = 32  # int8 lm_head: a scale per 32 weights of a row (the stage engine's grouped kernel)
HALF = 2  # bytes of a 16-bit value


def profile_model(config: ModelConfig, name: str, *, group_size: int = DEFAULT_GROUP_SIZE) -> ModelProfile:
    """Per-layer parameters, weight bytes at 16/8/4 bits, FLOPs and KV bytes per token."""
    if group_size <= 0:
        raise ValueError(f"group_size: expected a positive integer, got {group_size}")
    c = config
    hidden = c.hidden_size
    o_bias = c.attention_bias and c.model_type != "qwen2"  # Qwen2 biases q/k/v only
    # (in_features, out_features, has_bias) of each matmul in one decoder layer.
    matmuls = [
        (hidden, c.q_size, c.attention_bias),
        (hidden, c.kv_size, c.attention_bias),
        (hidden, c.kv_size, c.attention_bias),
        (c.q_size, hidden, o_bias),
        (hidden, c.intermediate_size, c.mlp_bias),
        (hidden, c.intermediate_size, c.mlp_bias),
        (c.intermediate_size, hidden, c.mlp_bias),
    ]
    layer = _profile(
        matmuls,
        unquantized_params=2 * hidden,  # input and post-attention RMSNorm
        group_size=group_size,
        attention_flops=4 * c.num_heads * c.head_dim,
        kv_bytes=2 * c.kv_size * HALF,
    )
    embedding_params = c.vocab_size * hidden
    embedding = LayerProfile(
        params=embedding_params,
        weight_bytes={bits: embedding_params * HALF for bits in (16, 8, 4)},
        flops_per_token=0,
        attention_flops_per_token_per_context=0,
        kv_bytes_per_token=0,
    )
    head = _profile(
        [(hidden, c.vocab_size, False)],
        unquantized_params=hidden,  # final RMSNorm
        group_size=group_size,
        int8_group=head_int8_group(hidden),
        attention_flops=0,
        kv_bytes=0,
    )
    tied = embedding_params if c.tie_word_embeddings else 0
    return ModelProfile(
        name=name,
        num_layers=c.num_layers,
        hidden_size=hidden,
        vocab_size=c.vocab_size,
        activation_bytes_per_token=hidden * HALF,
        layers=(layer,) * c.num_layers,
        embedding=embedding,
        head=head,
        total_params=embedding.params + layer.params * c.num_layers + head.params - tied,
        extra={
            "model_type": c.model_type,
            "num_heads": c.num_heads,
            "num_kv_heads": c.num_kv_heads,
            "head_dim": c.head_dim,
            "intermediate_size": c.intermediate_size,
            "max_position_embeddings": c.max_position_embeddings,
            "sliding_window": c.sliding_window,
            "tie_word_embeddings": c.tie_word_embeddings,
            "torch_dtype": c.torch_dtype,
            "quantization": {
                "int8": "per-output-channel 16-bit scale",
                "int4": f"groups of {group_size} along the input dimension, 16-bit scale and zero per group",
                "group_size": group_size,
            },
        },
    )


def _profile(
    matmuls: list[tuple[int, int, bool]],
    *,
    unquantized_params: int,
    group_size: int,
    attention_flops: int,
    kv_bytes: int,
    int8_group: int | None = None,
) -> LayerProfile:
    weights = sum(n_in * n_out for n_in, n_out, _ in matmuls)
    rows = sum(n_out for _, n_out, _ in matmuls)
    int8_scales = (rows if int8_group is None
                   else sum(n_in // int8_group * n_out for n_in, n_out, _ in matmuls))
    groups = sum(ceil(n_in / group_size) * n_out for n_in, n_out, _ in matmuls)
    # Biases and norms are never quantized: 16-bit at every precision.
    plain = unquantized_params + sum(n_out for _, n_out, bias in matmuls if bias)
    return LayerProfile(
        params=weights + plain,
        weight_bytes={
            16: (weights + plain) * HALF,
            8: weights + int8_scales * HALF + plain * HALF,
            4: ceil(weights / 2) + groups * 2 * HALF + plain * HALF,
        },
        flops_per_token=2 * weights,
        attention_flops_per_token_per_context=attention_flops,
        kv_bytes_per_token=kv_bytes,
    )


def head_int8_group(hidden_size: int) -> int | None:
    """The int8 ``lm_head``'s weights per scale: ``HEAD_INT8_GROUP`` where it divides the head's input,
    else None (one scale per row, as every other int8 matmul)."""
    return HEAD_INT8_GROUP if hidden_size % HEAD_INT8_GROUP == 0 else None
