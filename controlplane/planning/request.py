"""What the caller asks the planner for: the fleet, the model, the workload and the operator's rules.

One frozen object so that every entry point (API, CLI, dashboard what-if, rebalancer) hands the
planner the same thing and two equal requests always give the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from contracts.hardware import DeviceSpec, FleetSpec
from contracts.model_profile import ModelProfile
from controlplane.planning.speculation import Speculation

Objective = Literal["throughput", "latency"]


class PlanningError(ValueError):
    """The request cannot be planned; the message says why (and by how much, for memory)."""


@dataclass(frozen=True)
class Workload:
    """Concurrent sequences per replica and the tokens each may hold.

    ``batch`` sequences of up to ``context`` tokens (prompt + output) must fit the KV cache of every
    replica. ``prompt_tokens`` is the typical prompt; decode steps read, on average, a KV cache
    halfway between the prompt and the full context.
    """

    batch: int = 8
    context: int = 4096
    prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.batch < 1 or self.context < 1:
            raise PlanningError("workload: batch and context must be positive")
        if self.prompt_tokens is not None and not 0 < self.prompt_tokens <= self.context:
            raise PlanningError("workload: prompt_tokens must be in (0, context]")

    @property
    def prompt(self) -> int:
        return self.prompt_tokens if self.prompt_tokens is not None else max(1, self.context // 2)

    @property
    def mean_decode_context(self) -> float:
        return (self.prompt + self.context) / 2.0

    @property
    def kv_tokens_required(self) -> int:
        return self.batch * self.context


@dataclass(frozen=True)
class Pin:
    """Operator rule: ``device`` holds exactly layers [start, end) (in the first replica)."""

    device: str
    start: int
    end: int


@dataclass(frozen=True)
class PlanRequest:
    fleet: FleetSpec
    model: ModelProfile
    workload: Workload = field(default_factory=Workload)
    objective: Objective = "throughput"
    bits: tuple[int, ...] = (16, 8, 4)
    max_quantized: float = 0.5  # largest share of the decoder layers allowed below 16 bits
    # The measured form of the quality budget: the chosen low-bit layers' summed KL (the model profile's
    # ``sensitivity``, from ``manage.py profile_quality``) at most this; replaces ``max_quantized``.
    max_kl: float | None = None
    replicas: int | Literal["auto"] = "auto"
    pins: tuple[Pin, ...] = ()
    exclude_nodes: tuple[str, ...] = ()
    exclude_devices: tuple[str, ...] = ()
    # Host memory each stage may fill with KV blocks evicted from its device (the host tier,
    # host_tier.py); the plan uses it only where copying a block back beats recomputing it.
    host_kv_bytes: int = 0
    # The deployment's speculative decoding, which the predicted decode tokens/s count (speculation.py);
    # it does not change where layers go.
    speculation: Speculation = field(default_factory=Speculation)
    # Search tensor-parallel groups jointly with the pipeline (joint.py). Off by default: deployments
    # refuse plans with groups until the stage runtime serves them (docs/planner.md,
    # "Tensor-parallel groups").
    tensor_parallel: bool = False

    def __post_init__(self) -> None:
        if self.host_kv_bytes < 0:
            raise PlanningError("host_kv_bytes must not be negative")
        measured = self.speculation.measured_acceptance
        if self.speculation.tokens < 1 or (measured is not None and not 0.0 <= measured <= 1.0):
            raise PlanningError(f"speculation: {self.speculation!r} needs tokens >= 1 and an acceptance "
                                "rate within [0, 1]")
        if self.objective not in ("throughput", "latency"):
            raise PlanningError(f"objective: {self.objective!r} is not throughput or latency")
        if not self.bits or any(b not in (16, 8, 4) for b in self.bits):
            raise PlanningError(f"bits: {self.bits!r}; allowed precisions are 16, 8 and 4")
        if not 0.0 <= self.max_quantized <= 1.0:
            raise PlanningError("max_quantized must be within [0, 1]")
        if self.max_kl is not None:
            if not self.max_kl >= 0.0:
                raise PlanningError(f"max_kl: {self.max_kl!r} is not a non-negative number")
            missing = [b for b in self.bits
                       if b < 16 and len(self.model.sensitivity.get(b, ())) != self.model.num_layers]
            if missing:
                raise PlanningError(f"max_kl needs the model's measured sensitivity at {missing} bits: run "
                                    f"manage.py profile_quality {self.model.name}")
        if self.replicas != "auto" and (not isinstance(self.replicas, int) or self.replicas < 1):
            raise PlanningError(f"replicas: {self.replicas!r} is not a positive number or 'auto'")
        for pin in self.pins:
            if not 0 <= pin.start < pin.end <= self.model.num_layers:
                raise PlanningError(f"pin {pin.device}: layers [{pin.start}, {pin.end}) outside the model")

    @property
    def quantized_layer_budget(self) -> int:
        """Number of decoder layers that may run below 16 bits (0 when 16 is the only choice; all
        of them when the operator does not allow 16 bits at all)."""
        if all(b == 16 for b in self.bits):
            return 0
        if 16 not in self.bits or self.max_kl is not None:  # the measured budget bounds KL, not a count
            return self.model.num_layers
        return int(self.max_quantized * self.model.num_layers + 1e-9)

    @property
    def measured(self) -> bool:
        """Whether the quality budget is the measured form (``max_kl``) rather than the count."""
        return self.max_kl is not None and any(b < 16 for b in self.bits)

    @property
    def sorted_bits(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.bits), reverse=True))

    def excluded_reason(self, device: DeviceSpec) -> str | None:
        """Why a device cannot carry a stage, or None when it can."""
        if device.down:
            return "down"
        if device.node in self.exclude_nodes:
            return f"node {device.node} excluded by the operator"
        if device.name in self.exclude_devices:
            return "excluded by the operator"
        return None

    def eligible_devices(self) -> tuple[DeviceSpec, ...]:
        return tuple(d for d in self.fleet.devices if self.excluded_reason(d) is None)
