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
