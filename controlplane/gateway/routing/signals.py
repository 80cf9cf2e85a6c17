"""Live signals: what the agents' telemetry says about a replica, in the router's terms. Pure.

The gateway (``controlplane/gateway/serving/live_health.py``) reads the latest sample of every node and
hands this module, per replica, where its stages run (``StageLink``) and the samples of those stages
and devices with their age (``StageSample``, ``DeviceSample``). ``replica_reading`` turns them into
the replica's ``ReplicaHealth`` (throttling, memory pressure; not ok when a sample is missing, stale
or a stage is not ready) and the figures shown next to each decision; ``MeasuredCosts`` turns the
stages' measured step times into the replica's costs (the plan's, scaled by measured / predicted).
``benchmarks/router_bench.py`` drives the same functions with simulated samples.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median

from controlplane.gateway.routing.costs import ReplicaCosts
from controlplane.gateway.routing.state import ReplicaHealth

MAX_THROTTLE = 0.95
UNKNOWN_THROTTLE = 0.5  # throttle reasons reported without the clocks that size them: assume half speed
SERVING_STATES = frozenset({"ready"})  # a stage in any other state (starting, draining, failed) cannot serve


@dataclass(frozen=True)
class StageLink:
    """One stage of a replica: its key (stage statistics), its device (GPU metrics, ``<node>/gpu<i>``,
    None when unknown) and the plan's predicted step time (weighs its device's throttling)."""

    stage_key: str
    device: str | None = None
    planned_step_ms: float | None = None


@dataclass(frozen=True)
class DeviceSample:
    """A device's latest GPU metrics (contracts ``GpuMetrics``) and how old they are."""

    name: str
    age_s: float
    memory_used_bytes: int = 0
    memory_total_bytes: int = 0
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    throttle_reasons: tuple[str, ...] = ()

    @property
    def throttle(self) -> float:
        """Share of clock lost: ``1 - sm_clock / sm_clock_max`` while a throttle reason is reported."""
        if not self.throttle_reasons:
            return 0.0
        if self.sm_clock_mhz and self.sm_clock_max_mhz:
            return min(MAX_THROTTLE, max(0.0, 1.0 - self.sm_clock_mhz / self.sm_clock_max_mhz))
        return UNKNOWN_THROTTLE

    @property
    def memory_pressure(self) -> float:
        return self.memory_used_bytes / self.memory_total_bytes if self.memory_total_bytes else 0.0


@dataclass(frozen=True)
class StageSample:
    """A stage's latest statistics (contracts §4, averages over its last second), state and age."""

    stage_key: str
    age_s: float
    state: str | None = None
    step_ms: float | None = None
    batch_size: float | None = None
    queue_depth: int | None = None
    kv_tokens_free: int | None = None

    @property
    def stepping(self) -> bool:
        """It ran steps in its last second (an idle stage's step time says nothing)."""
        return bool(self.step_ms) and bool(self.batch_size)


@dataclass(frozen=True)
class Reading:
    """What the telemetry of one replica says: its health (``reason`` says why not ok), the age of
    its oldest sample, and, when every stage ran steps in its last second, their summed step time
    and mean batch (one token's trip through the pipeline: the measured per-token cost)."""

    health: ReplicaHealth
    age_s: float | None
    step_s: float | None
    batch: float | None
    devices: tuple[dict, ...] = ()
    stages: tuple[dict, ...] = ()

    def as_dict(self) -> dict:
        return {"age_s": self.age_s, "step_s": self.step_s, "batch": self.batch,
                "devices": list(self.devices), "stages": list(self.stages)}


def _effective_throttle(throttles: Sequence[float], weights: Sequence[float]) -> float:
    """The replica's share of speed lost when stage ``i`` (weight: its share of a token's time) runs
    ``1 / (1 - t_i)`` slower: ``1 - Σw / Σ(w / (1 - t))``. One stage: its device's throttle."""
    slowed = sum(w / (1.0 - min(t, MAX_THROTTLE)) for t, w in zip(throttles, weights))
    return 1.0 - sum(weights) / slowed if slowed else 0.0


def _sample_problem(name: str, sample: DeviceSample | StageSample | None, stale_s: float,
                    ages: list[float]) -> str | None:
    """What is wrong with ``name``'s sample for the replica's health: none, or one older than ``stale_s``;
    its age goes to ``ages``."""
    if sample is None:
        return f"{name}: no telemetry from its agent"
    ages.append(sample.age_s)
    if sample.age_s > stale_s:
        return f"{name}: telemetry {sample.age_s:.1f} s old (limit {stale_s:g} s)"
    return None


def replica_reading(
    links: Sequence[StageLink],
    devices: Mapping[str, DeviceSample],
    stages: Mapping[str, StageSample],
    *,
    stale_s: float,
) -> Reading:
    """The replica's health from its stages' samples and their devices' (see the module doc).

    Not ok, with the reason, when a stage or device has no sample, one older than ``stale_s`` (its
    agent went silent: counted as unhealthy, never as healthy), or a stage is not ``ready``.
    ``throttle`` is the stages' devices' throttling weighted by each stage's share of a token's time
    (measured step times when every stage stepped, else the plan's, else equal); ``memory_pressure``
    the fullest device's share of memory in use.
    """
    problems: list[str] = []
    stage_rows, device_rows, ages = [], {}, []
    throttles, measured, planned = [], [], []
    pressure = 0.0
    for link in links:
        stage = stages.get(link.stage_key)
        if problem := _sample_problem(f"stage {link.stage_key}", stage, stale_s, ages):
            problems.append(problem)
        elif stage.state is not None and stage.state not in SERVING_STATES:
            problems.append(f"stage {link.stage_key} is {stage.state}")
        if stage is not None:
            stage_rows.append({"stage_key": link.stage_key, "device": link.device,
                               "age_s": round(stage.age_s, 2),
                               "state": stage.state, "step_ms": stage.step_ms, "batch_size": stage.batch_size,
                               "queue_depth": stage.queue_depth, "kv_tokens_free": stage.kv_tokens_free})
        throttle = 0.0
        if link.device is not None:
            device = devices.get(link.device)
            if problem := _sample_problem(f"device {link.device}", device, stale_s, ages):
                problems.append(problem)
            if device is not None:
                throttle, pressure = device.throttle, max(pressure, device.memory_pressure)
                device_rows[link.device] = {
                    "device": link.device, "age_s": round(device.age_s, 2), "throttle": round(throttle, 3),
                    "throttle_reasons": list(device.throttle_reasons), "sm_clock_mhz": device.sm_clock_mhz,
                    "sm_clock_max_mhz": device.sm_clock_max_mhz,
                    "memory_pressure": round(device.memory_pressure, 3),
                }
        throttles.append(throttle)
        measured.append(stage.step_ms if stage is not None and stage.stepping else None)
        planned.append(link.planned_step_ms)
    if all(measured) and measured:
        weights = measured
    elif all(planned) and planned:
        weights = planned
    else:
        weights = [1.0] * len(throttles)
    stepping = bool(measured) and all(measured) and not problems
    batches = [stages[link.stage_key].batch_size for link in links] if stepping else []
    health = ReplicaHealth(
        ok=not problems,
        throttle=round(_effective_throttle(throttles, weights), 4),
        memory_pressure=round(pressure, 4),
        reason="; ".join(problems),
    )
    return Reading(
        health=health,
        age_s=round(max(ages), 2) if ages else None,
        step_s=sum(measured) / 1000 if stepping else None,
        batch=sum(batches) / len(batches) if batches else None,
        devices=tuple(device_rows.values()),
        stages=tuple(stage_rows),
    )


class MeasuredCosts:
    """A replica's costs from its measured step times: the planned costs times the median of
    ``measured / predicted`` over its last ``keep`` samples no older than ``max_age_s``, once it has
    ``min_samples`` of them (else the planned costs).

    Each sample is one telemetry sample in which every stage stepped: the summed step time at the
    observed batch, brought back to an unthrottled replica (times ``1 - throttle`` at that moment,
    since the router applies the current throttling itself), over the planned step at that batch
    (``decode_step_s + decode_s_per_token × batch``). New planned costs (a new plan revision) start
    over, since the samples measured the old one.
    """

    def __init__(self, *, keep: int = 30, min_samples: int = 3, max_age_s: float = 600.0) -> None:
        self.keep, self.min_samples, self.max_age_s = keep, min_samples, max_age_s
        self._samples: dict[str, deque[tuple[float, float]]] = {}
        self._planned: dict[str, ReplicaCosts] = {}

    def add(self, replica_id: str, planned: ReplicaCosts, *, at: float, reading: Reading) -> None:
        """Record ``reading`` (taken at ``at``, wall clock) if every stage stepped; one per sample."""
        if self._planned.get(replica_id) != planned:
            self._planned[replica_id] = planned
            self._samples[replica_id] = deque(maxlen=self.keep)
        if reading.step_s is None or reading.batch is None:
            return
        predicted = planned.decode_step_s + planned.decode_s_per_token * reading.batch
        if predicted <= 0:
            return
        samples = self._samples[replica_id]
        if samples and abs(samples[-1][0] - at) < 0.05:  # the same telemetry sample, read again
            return
        samples.append((at, reading.step_s * (1.0 - reading.health.throttle) / predicted))

    def factor(self, replica_id: str, *, now: float) -> tuple[float | None, int]:
        """measured / predicted (None: too few fresh samples) and how many samples it rests on."""
        fresh = [f for at, f in self._samples.get(replica_id, ()) if now - at <= self.max_age_s]
        return (median(fresh) if len(fresh) >= self.min_samples else None), len(fresh)

    def costs(self, replica_id: str, planned: ReplicaCosts, *,
              now: float) -> tuple[ReplicaCosts, float | None]:
        """The costs to route with and the factor applied (None: the planned costs as they are)."""
        if self._planned.get(replica_id) != planned:
            return planned, None
        factor, _ = self.factor(replica_id, now=now)
        return (planned, None) if factor is None else (planned.scaled(factor), factor)

    def forget(self, keep_ids: set[str]) -> None:
        for replica_id in set(self._samples) - keep_ids:
            self._samples.pop(replica_id, None)
            self._planned.pop(replica_id, None)
