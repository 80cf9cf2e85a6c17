"""The planner's output: replicas of ordered stages with predicted figures and an explanation.

Everything here is a frozen value: the API stores it as JSON (see ``serialize``), the dashboard
draws it, the deployer turns each stage into a worker process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from contracts.precision import Precision

PlanKind = Literal["planner", "even", "memory", "edited", "repaired"]


class StagePrecision:
    """The precision of each layer of a stage: ``bits`` for all of them, or, when ``low_bits`` is
    set, ``bits`` for [start, low_from) and ``low_bits`` for [low_from, end) and the stage's lm_head.

    Two precisions in one stage let a single card spend the quality budget on part of the model
    (half its layers at 4 bits, say) where one precision per stage would have to take all or none.
    """

    start: int
    end: int
    bits: int
    low_bits: int | None
    low_from: int | None

    @property
    def precision(self) -> Precision:
        """``bits``, ``low_bits`` and ``low_from`` as the one value the footprint, the stage spec and
        the worker take."""
        return Precision(self.bits, self.low_bits, self.low_from)

    @property
    def split(self) -> int:
        """The first layer at ``low_bits`` (``end`` when the stage has one precision)."""
        return self.end if self.low_bits is None or self.low_from is None else self.low_from

    @property
    def last_bits(self) -> int:
        """The precision of the stage's last layer, which its lm_head (if any) shares."""
        return self.bits if self.split >= self.end else self.low_bits

    @property
    def segments(self) -> tuple[tuple[int, int, int], ...]:
        """(start, end, bits) of each non-empty run of layers at one precision; on a tensor-parallel
        group whose ranks differ, a run's bits are the lowest any rank holds it at (what the quality
        budget counts: a layer is below 16 bits if any part of it is)."""
        first = min((s.bits for s in getattr(self, "group", ())), default=self.bits)
        runs = ((self.start, self.split, first), (self.split, self.end, self.low_bits))
        return tuple(run for run in runs if run[0] < run[1])

    @property
    def quantized_layers(self) -> int:
        return sum(end - start for start, end, bits in self.segments if bits < 16)

    @property
    def bits_label(self) -> str:
        """'16-bit' or '16-bit, 4-bit from layer 24', for messages."""
        ranks = sorted({s.bits for s in getattr(self, "group", ())}, reverse=True)
        if len(ranks) > 1 and self.split >= self.end:
            return "/".join(map(str, ranks)) + "-bit by rank"
        if len(self.segments) < 2:
            return f"{self.last_bits}-bit"
        return f"{self.bits}-bit, {self.low_bits}-bit from layer {self.split}"


@dataclass(frozen=True)
class Share:
    """One rank of a tensor-parallel group: the key-value heads (with their query heads) and the MLP
    columns of every layer of the stage it holds, and its precision (docs/planner.md, "Tensor-parallel
    groups")."""

    device: str
    kv_heads: int
    columns: int  # intermediate (MLP) columns, whole blocks of the quantization group
    bits: int  # before the stage's ``low_from`` (ranks may differ); from it on every rank holds ``low_bits``


@dataclass(frozen=True)
class Placement(StagePrecision):
    """Where a stage runs and what it holds: the part of a plan an operator may edit. A stage with a
    ``group`` runs on two or more devices of one node, each holding its share of every layer;
    ``device`` is then the group's first rank (it receives and passes on the hidden states)."""

    device: str
    start: int
    end: int
    bits: int
    low_bits: int | None = None
    low_from: int | None = None
    group: tuple[Share, ...] = ()

    @classmethod
    def at(cls, device: str, start: int, end: int, precision: Precision,
           group: tuple[Share, ...] = ()) -> "Placement":
        return cls(device, start, end, precision.bits, precision.low_bits, precision.low_from, group)


@dataclass(frozen=True)
class MemoryBreakdown:
    weights_bytes: int
    kv_bytes: int  # the KV pool: kv_tokens x bytes per token of this stage's layers
    workspace_bytes: int  # activations of a prefill chunk, logits on the last stage
    total_bytes: int
    capacity_bytes: int  # usable memory of the device (after other users and a reserve)
    host_kv_bytes: int = 0  # the host KV tier: host memory, not in total_bytes (host_tier.py)


@dataclass(frozen=True)
class StagePlan(StagePrecision):
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
    low_bits: int | None = None
    low_from: int | None = None
    host_kv_tokens: int = 0  # KV tokens evicted from the device kept in host memory (host_tier.py)
    group: tuple[Share, ...] = ()  # a tensor-parallel group's ranks, the first on ``device``; () for one card

    @property
    def layers(self) -> tuple[int, int]:
        return (self.start, self.end)

    @property
    def placement(self) -> Placement:
        return Placement.at(self.device, self.start, self.end, self.precision, self.group)


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
