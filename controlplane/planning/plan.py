"""The planner's output: replicas of ordered stages with predicted figures and an explanation.

Everything here is a frozen value: the API stores it as JSON (see ``serialize``), the dashboard
draws it, the deployer turns each stage into a worker process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PlanKind = Literal["planner", "even", "memory", "edited"]


@dataclass(frozen=True)
class Placement:
    """Where a stage runs and what it holds: the part of a plan an operator may edit."""

    device: str
    start: int
    end: int
    bits: int


@dataclass(frozen=True)
class MemoryBreakdown:
    weights_bytes: int
    kv_bytes: int  # the KV pool: kv_tokens x bytes per token of this stage's layers
    workspace_bytes: int  # activations of a prefill chunk, logits on the last stage
    total_bytes: int
    capacity_bytes: int  # usable memory of the device (after other users and a reserve)


@dataclass(frozen=True)
class StagePlan:
    device: str
    node: str
    gpu_model: str
    start: int
    end: int
    bits: int
    kv_tokens: int
    memory: MemoryBreakdown
    compute_ms: float  # decode step of one micro-batch on this stage
    transfer_ms: float  # hidden states of that micro-batch to the next stage (0 on the last)
    step_ms: float  # max(compute, transfer): sends overlap the next micro-batch's compute
    link: str | None  # kind of link to the next stage: nvlink | pcie | network

    @property
    def layers(self) -> tuple[int, int]:
        return (self.start, self.end)

    @property
    def placement(self) -> Placement:
        return Placement(self.device, self.start, self.end, self.bits)


@dataclass(frozen=True)
class Figures:
    decode_tokens_per_s: float
    token_latency_ms: float  # time between two tokens of one sequence
    prefill_ms: float  # one prompt of the workload's length through the whole pipeline
    round_ms: float  # one decode round: every sequence of the batch advances by a token


@dataclass(frozen=True)
class Bottleneck:
    replica: int
    device: str
    resource: str  # "memory bandwidth" | "compute" | "link <a> -> <b>" | "pipeline latency"
    detail: str


@dataclass(frozen=True)
class ReplicaPlan:
    stages: tuple[StagePlan, ...]
    micro_batches: int
    micro_batch_size: int
    predicted: Figures
    bottleneck: Bottleneck


@dataclass(frozen=True)
class Plan:
    kind: PlanKind
    model: str
    fleet: str
    objective: str
    batch: int
    context: int
    replicas: tuple[ReplicaPlan, ...]
    predicted: Figures
    bottleneck: Bottleneck
    quantized_layers: int  # the most decoder layers below 16 bits in any replica
    explanation: tuple[str, ...]
    unused_devices: tuple[tuple[str, str], ...] = ()  # (device, why it carries no stage)
