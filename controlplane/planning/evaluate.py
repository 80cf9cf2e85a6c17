"""Predicted figures of a placement: the one pipeline model every plan is judged by.

The planner's own plans, the baselines and an operator's edited plan all go through
``evaluate_replica``, so their figures are comparable by construction.

Pipeline model (docs/planner.md): a replica serves ``batch`` sequences split into ``m``
micro-batches. A decode round advances every sequence by one token; it lasts
``max(m * slowest stage step, one micro-batch's trip through all stages and hops back)``.
Decode throughput is batch / round, and a sequence waits one round between two tokens. With the
request's speculation on, a round of k + 1 positions per sequence is priced too and the throughput is
the better of the two (``speculation.py``); ``round_ms`` stays the round of one position.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

from contracts.hardware import DeviceSpec
from controlplane.planning.cost_model import CostModel
from controlplane.planning.host_tier import host_tier
from controlplane.planning.plan import (
    Bottleneck,
    Figures,
    MemoryBreakdown,
    Placement,
    Plan,
    PlanKind,
    ReplicaPlan,
    StagePlan,
)
from controlplane.planning.quality_budget import quantized_layers
from controlplane.planning.request import PlanRequest
from controlplane.planning.speculation import SpeculationFigures, speculation_figures


def micro_batch_size(batch: int, micro_batches: int) -> int:
    return math.ceil(batch / micro_batches)


def _timings(cost: CostModel, placements: Sequence[Placement], micro_batch: int):
    """Per stage (compute s, transfer-to-next s), and the return hop of sampled tokens."""
    devices = [cost.device(p.device) for p in placements]
    times = [(cost.decode_s(d, p, micro_batch),
              cost.hop_s(d, devices[i + 1], micro_batch) if i + 1 < len(devices) else 0.0)
             for i, (d, p) in enumerate(zip(devices, placements))]
    return times, cost.return_s(devices[-1], devices[0], micro_batch)


def _round(times, back: float, micro_batches: int) -> tuple[float, float]:
    """(round, trip) in seconds: see the module doc."""
    trip = sum(c + t for c, t in times) + back
    return max(micro_batches * max(max(c, t) for c, t in times), trip), trip


def round_seconds(cost: CostModel, placements: Sequence[Placement], micro_batches: int) -> float:
    """A decode round of the replica: what the search compares (cheaper than ``evaluate_replica``)."""
    micro_batches = max(1, min(micro_batches, cost.batch))
    times, back = _timings(cost, placements, micro_batch_size(cost.batch, micro_batches))
    return _round(times, back, micro_batches)[0]


def replica_speculation(cost: CostModel, placements: Sequence[Placement],
                        micro_batches: int) -> SpeculationFigures | None:
    """The replica's decode throughput with the request's speculation and without (None: it is off).
    Each sequence carries k + 1 positions: the stage time model prices a micro-batch of (k + 1) x its
    tokens (weights read once; FLOPs, KV traffic and hops k + 1 times)."""
    speculation = cost.request.speculation
    if not speculation.on:
        return None
    micro_batches = max(1, min(micro_batches, cost.batch))
    mb = micro_batch_size(cost.batch, micro_batches)
    plain = _round(*_timings(cost, placements, mb), micro_batches)[0]
    wide = _round(*_timings(cost, placements, mb * (speculation.tokens + 1)), micro_batches)[0]
    return speculation_figures(speculation, batch=cost.batch, plain_round_s=plain, speculative_round_s=wide)


def network_hops(cost: CostModel, placements: Sequence[Placement]) -> int:
    """Stage-to-stage transfers that cross the network: the search's tie-break after throughput and
    low-bit layers (the return hop of sampled tokens is not counted: every plan of two or more
    nodes has one)."""
    devices = [cost.device(p.device) for p in placements]
    return sum(cost.crosses_network(a, b) for a, b in zip(devices, devices[1:]))


def stage_plan(cost: CostModel, placement: Placement, following: DeviceSpec | None, compute: float,
               transfer: float, host_kv_tokens: int) -> StagePlan:
    device = cost.device(placement.device)
    memory = cost.memory(device, placement)
    kv_tokens = min(memory.kv_tokens, 2**53)
    kv_bytes = kv_tokens * memory.kv_bytes_per_token
    return StagePlan(
        device=device.name, node=device.node, gpu_model=device.model,
        start=placement.start, end=placement.end, **placement.precision.fields(), kv_tokens=int(kv_tokens),
        memory=MemoryBreakdown(
            weights_bytes=memory.weights_bytes, kv_bytes=int(kv_bytes),
            workspace_bytes=memory.workspace_bytes,
            total_bytes=int(memory.weights_bytes + kv_bytes + memory.workspace_bytes),
            capacity_bytes=memory.capacity_bytes,
            host_kv_bytes=host_kv_tokens * memory.kv_bytes_per_token),
        compute_ms=compute * 1e3, transfer_ms=transfer * 1e3, step_ms=max(compute, transfer) * 1e3,
        link=cost.link(device, following).kind if following is not None else None,
        host_kv_tokens=host_kv_tokens, group=placement.group,
    )


def evaluate_replica(cost: CostModel, placements: Sequence[Placement], micro_batches: int,
                     replica: int = 0) -> ReplicaPlan:
    devices = [cost.device(p.device) for p in placements]
    micro_batches = max(1, min(micro_batches, cost.batch))
    mb = micro_batch_size(cost.batch, micro_batches)
    times, back = _timings(cost, placements, mb)
    round_time, trip = _round(times, back, micro_batches)
    prefill = sum(cost.prefill_s(d, p, cost.prompt) for d, p in zip(devices, placements))
    prefill += sum(cost.hop_s(devices[i], devices[i + 1], cost.prompt) for i in range(len(devices) - 1))
    host = host_tier(cost, placements, float(prefill)).tokens
    stages = tuple(stage_plan(cost, p, devices[i + 1] if i + 1 < len(devices) else None, *times[i], host)
                   for i, p in enumerate(placements))
    figures = Figures(decode_tokens_per_s=cost.batch / round_time, token_latency_ms=round_time * 1e3,
                      prefill_ms=float(prefill) * 1e3, round_ms=round_time * 1e3)
    speculation = replica_speculation(cost, placements, micro_batches)
    if speculation is not None:
        figures = replace(figures, decode_tokens_per_s=speculation.tokens_per_s,
                          token_latency_ms=speculation.token_latency_s * 1e3)
    return ReplicaPlan(stages, micro_batches, mb, figures,
                       _bottleneck(cost, stages, micro_batches, trip, round_time, replica))


def _bottleneck(cost: CostModel, stages: Sequence[StagePlan], micro_batches: int, trip: float,
                round_time: float, replica: int) -> Bottleneck:
    worst = max(range(len(stages)), key=lambda i: (stages[i].step_ms, -i))
    stage = stages[worst]
    if trip >= micro_batches * stage.step_ms / 1e3 and len(stages) > 1 and micro_batches < cost.batch:
        return Bottleneck(replica, stage.device, "pipeline latency",
                          f"{micro_batches} micro-batch(es) in flight cannot hide the {trip * 1e3:.2f} ms "
                          f"trip through {len(stages)} stages")
    if stage.transfer_ms > stage.compute_ms:
        following = stages[worst + 1].device
        return Bottleneck(replica, stage.device, f"link {stage.device} -> {following}",
                          f"{stage.link} transfer of {stage.transfer_ms:.3f} ms per micro-batch")
    device = cost.device(stage.device)
    resource = cost.limiting_resource(device, stage, micro_batch_size(cost.batch, micro_batches))
    return Bottleneck(replica, stage.device, resource,
                      f"{stage.gpu_model} step of {stage.compute_ms:.2f} ms for layers "
                      f"[{stage.start}, {stage.end}) at {stage.bits_label}")


def total_figures(replicas: Sequence[ReplicaPlan]) -> Figures:
    return Figures(
        decode_tokens_per_s=sum(r.predicted.decode_tokens_per_s for r in replicas),
        token_latency_ms=max(r.predicted.token_latency_ms for r in replicas),
        prefill_ms=max(r.predicted.prefill_ms for r in replicas),
        round_ms=max(r.predicted.round_ms for r in replicas),
    )


def plan_bottleneck(replicas: Sequence[ReplicaPlan]) -> Bottleneck:
    """The bottleneck of the slowest replica (longest round)."""
    return max(replicas, key=lambda r: r.predicted.round_ms).bottleneck


def assemble(request: PlanRequest, cost: CostModel, kind: PlanKind, replicas: Sequence[ReplicaPlan],
             explanation: Sequence[str], unused: Sequence[tuple[str, str]] = ()) -> Plan:
    return Plan(
        kind=kind, model=request.model.name, fleet=request.fleet.name, objective=request.objective,
        batch=request.workload.batch, context=request.workload.context, replicas=tuple(replicas),
        predicted=total_figures(replicas), bottleneck=plan_bottleneck(replicas),
        quantized_layers=max(quantized_layers(r.stages) for r in replicas),
        explanation=tuple(explanation), unused_devices=tuple(unused),
    )
