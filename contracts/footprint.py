"""A stage's memory footprint, and the memory of a device a stage may fill: one formula for everyone.

The planner sizes each stage's KV pool from this footprint, the agent admits a stage onto an
(emulated) device by it, and a loaded stage's real weight bytes are checked against it in the tests.
With one formula and one set of constants the agent cannot refuse what the planner placed, nor admit
what the planner would refuse.

A stage holding layers [start, end) of a model keeps:

- weights: each layer at its own precision (``contracts.precision.Precision``), the embedding
  at 16 bits on the stage that holds layer 0 (a lookup: never quantized), and the final norm and
  ``lm_head`` at the precision of the stage's last layer on the stage that holds the last layer;
- KV: ``kv_tokens`` tokens of context (summed over sequences) of its layers, 16-bit;
- host KV: ``host_kv_tokens`` tokens of the same layers in host memory (the host tier: blocks evicted
  from the device, copied back instead of recomputed), counted apart: it is not the device's memory;
- workspace: a prefill chunk's activations (``PREFILL_CHUNK_TOKENS`` tokens, ``ACTIVATION_WORKSPACE_FACTOR``
  hidden states each: the MLP's up/gate tensors dominate), plus on the stage holding the head the
  fp32 logits of ``batch`` sequences (one decode step of every sequence the plan priced it for).

A device's usable memory is what it has free (``memory_bytes - memory_used_bytes``) less a reserve
for the CUDA context, allocator slack and fragmentation: ``RESERVED_FRACTION`` of the card and
``RESERVED_BYTES``.

A rank of a tensor-parallel stage (``rank_footprint``) holds its share of the same stage: of every
layer its key-value heads' fraction ``h = kv_heads / K`` of the attention matmuls and of the KV, its
columns' fraction ``c = intermediate / I`` of the MLP matmuls (``TensorLayout.fractions``: the layer's
bytes times ``a h + (1 - a) c``, ``a`` attention's share of the layer's matmul weights), and ``c`` of
the ``lm_head`` on the last stage; the first rank alone keeps the embedding, whole; every rank keeps
the whole workspace (hidden states are replicated, the logits gathered). Weights and KV per token are
rounded to whole bytes.

Pure Python, imports nothing heavy: the planner (numpy), the agent and the workers (torch) all use it.
The planner's price matrices compute the same sums from prefix sums, for every range at once, with
these constants; ``tests/contracts/test_footprint.py`` holds the two to the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts.hardware import DeviceSpec
from contracts.model_profile import ModelProfile
from contracts.precision import FULL, Precision

# Memory no stage may use: CUDA context, allocator slack and fragmentation.
RESERVED_FRACTION = 0.05
RESERVED_BYTES = 384 * 1024**2
# Activation workspace: a prefill chunk's intermediate tensors (MLP up/gate dominate) ...
PREFILL_CHUNK_TOKENS = 512
ACTIVATION_WORKSPACE_FACTOR = 10
# ... and fp32 logits of a decode step on the stage that holds the head.
LOGIT_BYTES = 4
EMBEDDING_BITS = 16  # the embedding is a lookup: every stage keeps it at 16 bits
UNBOUNDED_KV_TOKENS = 2**62  # the KV room of a stage whose layers cache nothing


@dataclass(frozen=True)
class StageFootprint:
    """The bytes a stage holds on its device (see the module doc)."""

    weights_bytes: int  # layers at their precisions, + the embedding (first stage), + the head (last)
    kv_bytes_per_token: int  # KV one token of context costs on this stage's layers
    kv_tokens: int  # the KV pool, tokens of context summed over sequences
    workspace_bytes: int  # a prefill chunk's activations, + the batch's fp32 logits on the last stage
    host_kv_tokens: int = 0  # the host tier, in host memory: never part of ``total_bytes``

    @property
    def kv_bytes(self) -> int:
        return self.kv_bytes_per_token * self.kv_tokens

    @property
    def host_kv_bytes(self) -> int:
        """Host memory the stage's host tier holds at most (pinned on CUDA)."""
        return self.kv_bytes_per_token * self.host_kv_tokens

    @property
    def total_bytes(self) -> int:
        return self.holding(self.kv_tokens)

    def holding(self, kv_tokens: int) -> int:
        """Bytes the stage needs with a KV pool of ``kv_tokens`` tokens instead."""
        return self.weights_bytes + self.workspace_bytes + self.kv_bytes_per_token * kv_tokens

    def kv_tokens_within(self, capacity_bytes: int) -> int:
        """The most KV tokens the stage can cache in ``capacity_bytes`` (0: not even its weights and
        workspace fit; ``UNBOUNDED_KV_TOKENS`` when its layers cache nothing and the rest fits)."""
        free = capacity_bytes - self.weights_bytes - self.workspace_bytes
        if self.kv_bytes_per_token <= 0:
            return 0 if free < 0 else UNBOUNDED_KV_TOKENS
        return max(0, free // self.kv_bytes_per_token)


def stage_footprint(profile: ModelProfile, start: int, end: int, precision: Precision = FULL, *,
                    kv_tokens: int = 0, host_kv_tokens: int = 0, batch: int) -> StageFootprint:
    """The footprint of a stage holding layers [start, end) at ``precision`` (its head at its last
    layer's), with a KV pool of ``kv_tokens`` tokens (0: none; see ``StageFootprint.holding``), a host
    tier of ``host_kv_tokens`` and priced for ``batch`` sequences.

    ValueError for layers outside the model or a precision ``Precision.layer_bits`` refuses.
    """
    if not 0 <= start < end <= profile.num_layers:
        raise ValueError(f"layers [{start}, {end}) of a {profile.num_layers}-layer model")
    precisions = precision.layer_bits(start, end)
    layers = profile.layers[start:end]
    weights = sum(layer.weight_bytes[b] for layer, b in zip(layers, precisions))
    holds_head = end == profile.num_layers
    if start == 0:
        weights += profile.embedding.weight_bytes[EMBEDDING_BITS]
    if holds_head:
        weights += profile.head.weight_bytes[precisions[-1]]
    return StageFootprint(
        weights_bytes=weights,
        kv_bytes_per_token=sum(layer.kv_bytes_per_token for layer in layers),
        kv_tokens=kv_tokens,
        workspace_bytes=activation_workspace_bytes(profile) + logits_bytes(profile, batch) * holds_head,
        host_kv_tokens=host_kv_tokens,
    )


@dataclass(frozen=True)
class TensorLayout:
    """What a tensor-parallel group splits of every layer: ``kv_heads`` key-value heads (each with its
    query heads), ``columns`` MLP intermediate columns, and ``attention``, attention's share of the
    layer's matmul weights (and FLOPs)."""

    kv_heads: int
    columns: int
    attention: float

    def fractions(self, kv_heads: int, columns: int) -> tuple[float, float, float]:
        """A rank's fractions of a layer holding ``kv_heads`` heads and ``columns`` columns: of its
        heads (attention and KV), of its columns (MLP and ``lm_head``), and of its matmul weights."""
        heads, cols = kv_heads / self.kv_heads, columns / self.columns
        return heads, cols, self.attention * heads + (1.0 - self.attention) * cols


def tensor_layout(profile: ModelProfile) -> TensorLayout | None:
    """The model's ``TensorLayout`` from its profile (``contracts.profiler``'s ``extra``); None when the
    profile does not say its heads."""
    extra = profile.extra or {}
    try:
        hidden, heads, kv = profile.hidden_size, int(extra["num_heads"]), int(extra["num_kv_heads"])
        head_dim, columns = int(extra.get("head_dim") or hidden // heads), int(extra["intermediate_size"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv * head_dim
    mlp = 3 * hidden * columns
    return TensorLayout(kv, columns, attention / (attention + mlp))


def rank_footprint(profile: ModelProfile, start: int, end: int, precision: Precision = FULL, *,
                   kv_heads: int, intermediate: int, first: bool, kv_tokens: int = 0,
                   batch: int) -> StageFootprint:
    """The footprint of one rank of a tensor-parallel stage holding layers [start, end) at ``precision``
    (its bits before ``low_from``), ``kv_heads`` key-value heads and ``intermediate`` MLP columns of each
    (see the module doc); ``first``: the group's first rank, which keeps the embedding of a first stage.

    ValueError as ``stage_footprint``, and for a profile that does not say its heads.
    """
    layout = tensor_layout(profile)
    if layout is None:
        raise ValueError(f"the profile of {profile.name} does not say its heads: it cannot be split")
    whole = stage_footprint(profile, start, end, precision, batch=batch)  # what the rank has a share of
    heads, cols, part = layout.fractions(kv_heads, intermediate)
    bits = precision.layer_bits(start, end)
    weights = float(sum(layer.weight_bytes[b] for layer, b in zip(profile.layers[start:end], bits))) * part
    if end == profile.num_layers:
        weights += profile.head.weight_bytes[bits[-1]] * cols
    if start == 0 and first:
        weights += profile.embedding.weight_bytes[EMBEDDING_BITS]
    return StageFootprint(
        weights_bytes=round(weights),
        kv_bytes_per_token=round(whole.kv_bytes_per_token * heads),
        kv_tokens=kv_tokens,
        workspace_bytes=whole.workspace_bytes,
    )


def activation_workspace_bytes(profile: ModelProfile) -> int:
    """Every stage's activation workspace: a prefill chunk's intermediate tensors."""
    return PREFILL_CHUNK_TOKENS * profile.activation_bytes_per_token * ACTIVATION_WORKSPACE_FACTOR


def logits_bytes(profile: ModelProfile, batch: int) -> int:
    """The fp32 logits of one decode step of ``batch`` sequences, on the stage holding the head."""
    return LOGIT_BYTES * profile.vocab_size * batch


def usable_bytes(device: DeviceSpec) -> int:
    """Memory stages may fill on this device: what others leave free, less the reserve."""
    return int(device.memory_bytes - device.memory_used_bytes
               - RESERVED_FRACTION * device.memory_bytes - RESERVED_BYTES)
