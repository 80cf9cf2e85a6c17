"""Sentences a person can read: why these devices in this order, why low bits there, what limits.

Every sentence is derived from the evaluated plan and the cost model, never from the search's
internals, so the explanation of an edited plan is as true as that of the planner's own.
"""

from __future__ import annotations

from typing import Sequence

from contracts.footprint import usable_bytes
from contracts.hardware import GIB, DeviceSpec
from controlplane.planning.cost_model import CostModel
from controlplane.planning.evaluate import replica_speculation
from controlplane.planning.host_tier import host_tier
from controlplane.planning.plan import Placement, ReplicaPlan, StagePlan
from controlplane.planning.quality_budget import has_sensitivity, plan_kl, quantized_layers
from controlplane.planning.request import PlanRequest
from controlplane.planning.tensor_parallel import group_placement


def _gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def explain(request: PlanRequest, cost: CostModel, replicas: Sequence[ReplicaPlan]) -> list[str]:
    total = sum(r.predicted.decode_tokens_per_s for r in replicas)
    lines = [
        f"{len(replicas)} replica(s), {total:.0f} decode tokens/s predicted in total; each replica holds "
        f"{request.workload.batch} sequences of up to {request.workload.context} tokens."
    ]
    for index, replica in enumerate(replicas):
        lines.extend(_replica_lines(request, cost, index, replica))
    lines.append(_quality_line(request, replicas))
    return lines


def _quality_line(request: PlanRequest, replicas: Sequence[ReplicaPlan]) -> str:
    """The quality budget in force: measured (``max_kl``) or counted, and what the plan spends of it."""
    worst = max(quantized_layers(r.stages) for r in replicas)
    head = f"Quality: at most {worst} of {request.model.num_layers} layers per replica run below 16 bits"
    measured = has_sensitivity(request.model, request.bits)
    kl = max(plan_kl(r.stages, request.model.sensitivity) for r in replicas) if measured else None
    if request.measured:
        return (f"{head}; measured budget: their summed KL is at most {kl:.4g} per replica "
                f"(max_kl {request.max_kl:.4g}, from the model's measured per-layer KL).")
    spent = f"; their measured KL sums to at most {kl:.4g} per replica" if measured else ""
    return f"{head} (count budget {request.quantized_layer_budget}){spent}."


def _replica_lines(request: PlanRequest, cost: CostModel, index: int, replica: ReplicaPlan) -> list[str]:
    stages = replica.stages
    chain = " -> ".join(f"{s.device} ({s.gpu_model}, layers [{s.start}, {s.end}), {s.bits_label})"
                        for s in stages)
    figures = replica.predicted
    lines = [f"Replica {index}: {chain}; {replica.micro_batches} micro-batch(es) of "
             f"{replica.micro_batch_size}, {figures.decode_tokens_per_s:.0f} tokens/s, "
             f"{figures.token_latency_ms:.2f} ms between tokens, {figures.prefill_ms:.0f} ms prefill of "
             f"{request.workload.prompt} tokens."]
    if (speculation := _speculation_line(cost, replica)) is not None:
        lines.append(speculation)
    nodes = []
    for s in stages:
        if not nodes or nodes[-1] != s.node:
            nodes.append(s.node)
    hops = [(a, b) for a, b in zip(stages, stages[1:]) if a.link == "network"]
    if len(stages) > 1:
        # The exact search (small fleets) leaves a node and comes back only to be more than 1% faster or
        # to save low-bit layers; an edited plan may do so for nothing, so say what it costs in hops.
        route = " -> ".join(nodes)
        if len(nodes) == len(set(nodes)):
            order = f"Order: devices of a node stay adjacent (nodes {route}), {len(hops)} network hop(s)"
        else:
            order = (f"Order: a node is visited more than once (nodes {route}), {len(hops)} network hop(s) "
                     f"where keeping each node's devices adjacent needs {len(set(nodes)) - 1}")
        if hops:
            links = [(cost.link(cost.device(a.device), cost.device(b.device)), a, b) for a, b in hops]
            link, source, target = min(links, key=lambda item: item[0].bandwidth_gbs)
            order += f", the slowest at {link.bandwidth_gbs:.1f} GB/s ({source.node} -> {target.node})"
        lines.append(order + "; each stage's share is sized so the slowest step is as short as possible.")
    bottleneck = max(s.step_ms for s in stages)
    for s in stages:
        if s.quantized_layers:
            lines.append(_why_low_bits(cost, cost.device(s.device), s, replica.micro_batch_size, bottleneck))
    b = replica.bottleneck
    lines.append(f"Replica {index} is limited by {b.resource} of {b.device}: {b.detail}.")
    tight = min(stages, key=lambda s: s.kv_tokens)
    lines.append(f"KV cache: the tightest stage, {tight.device}, holds {tight.kv_tokens} tokens for the "
                 f"{request.workload.kv_tokens_required} the workload needs "
                 f"({_gib(tight.memory.total_bytes)} of {_gib(tight.memory.capacity_bytes)} used).")
    lines.append(_host_tier_line(request, cost, replica))
    return lines


def _speculation_line(cost: CostModel, replica: ReplicaPlan) -> str | None:
    """How speculative decoding enters the replica's predicted tokens/s (speculation.py), if it is on."""
    figures = replica_speculation(cost, [s.placement for s in replica.stages], replica.micro_batches)
    if figures is None:
        return None
    spec = figures.speculation
    source = "measured" if spec.source == "measured" else "assumed until one is measured"
    head = (f"Speculation ({spec.mode}, up to {spec.tokens} proposals per step, acceptance "
            f"{spec.acceptance:.2f} {source}): {figures.tokens_per_step:.2f} tokens per sequence and step, "
            f"a round of {figures.speculative_round_s * 1e3:.2f} ms against "
            f"{figures.plain_round_s * 1e3:.2f} ms, so {figures.speculative_tokens_per_s:.0f} tokens/s "
            f"against {figures.plain_tokens_per_s:.0f} without")
    if figures.pays:
        return f"{head}; the predicted tokens/s count it."
    return f"{head}: it does not pay here, the proposals fall to none and the prediction is without it."


def _host_tier_line(request: PlanRequest, cost: CostModel, replica: ReplicaPlan) -> str:
    """Whether blocks evicted from the devices are kept in host memory, and the two prices that decide."""
    tier = host_tier(cost, [s.placement for s in replica.stages], replica.predicted.prefill_ms / 1e3)
    head = (f"Host KV tier: copy back {tier.copy_s * 1e3:.4g} ms/token against recompute "
            f"{tier.recompute_s * 1e3:.4g} ms/token")
    if tier.copy_s >= tier.recompute_s:
        return f"{head}: off (recomputing is as cheap)."
    if not tier.tokens:
        return f"{head}: off (no host memory granted per stage)."
    host = max(s.memory.host_kv_bytes for s in replica.stages)
    return (f"{head}: on, {tier.tokens} tokens on every stage (they hold the same blocks), in at most "
            f"{_gib(host)} of the {_gib(request.host_kv_bytes)} of host memory granted per stage.")


def _why_low_bits(cost: CostModel, device: DeviceSpec, stage: StagePlan, micro_batch: int,
                  bottleneck_ms: float) -> str:
    low = ", ".join(f"[{start}, {end}) at {bits} bits" for start, end, bits in stage.segments)
    if stage.group:
        return _why_low_bits_group(cost, stage, micro_batch, bottleneck_ms, low)
    whole = Placement(stage.device, stage.start, stage.end, 16)
    full = cost.memory(device, whole)
    need = full.holding(cost.kv_required)
    head = (f"{device.name} ({device.model}) runs layers {low}: with all [{stage.start}, {stage.end}) "
            f"at 16 bits")
    if need > full.capacity_bytes:
        return (f"{head} they would need {_gib(need)} with their KV cache but the card has "
                f"{_gib(full.capacity_bytes)}.")
    slow = cost.decode_s(device, whole, micro_batch) * 1e3
    return (f"{head} their step would take {slow:.2f} ms against the pipeline's {bottleneck_ms:.2f} ms "
            f"(an old or small card made to keep pace).")


def _why_low_bits_group(cost: CostModel, stage: StagePlan, micro_batch: int, bottleneck_ms: float,
                        low: str) -> str:
    """As ``_why_low_bits`` for a tensor-parallel group: its memory is its ranks' (each within its own
    card), so the comparison is with the ranks' usable memory at 16 bits, with the shares the planner
    would give them there, and the first rank that would overflow."""
    devices = tuple(cost.device(s.device) for s in stage.group)
    whole = group_placement(cost, devices, stage.start, stage.end, 16, micro_batch)
    fit = cost.memory(devices[0], whole)
    head = (f"{stage.device} and {len(devices) - 1} more rank(s) of its group run layers {low}: with all "
            f"[{stage.start}, {stage.end}) at 16 bits")
    over = [(share, rank) for share, rank in zip(whole.group, fit.ranks)
            if rank.holding(cost.kv_required) > rank.capacity_bytes]
    if over:
        share, rank = over[0]
        total = sum(r.holding(cost.kv_required) for r in fit.ranks)
        return (f"{head} rank {share.device} ({cost.device(share.device).model}, {share.kv_heads} kv heads, "
                f"{share.columns} MLP columns) would need {_gib(rank.holding(cost.kv_required))} with its "
                f"KV cache but its card has {_gib(rank.capacity_bytes)} (the group would need {_gib(total)} "
                f"of the {_gib(fit.capacity_bytes)} its ranks have).")
    slow = cost.decode_s(devices[0], whole, micro_batch) * 1e3
    return (f"{head} their step would take {slow:.2f} ms against the pipeline's {bottleneck_ms:.2f} ms "
            f"(a group made to keep pace).")


def unused_devices(request: PlanRequest, replicas: Sequence[ReplicaPlan]) -> list[tuple[str, str]]:
    used = {s.device for r in replicas for s in r.stages}
    unused = []
    for device in request.fleet.devices:
        if device.name in used:
            continue
        reason = request.excluded_reason(device)
        if reason is None and usable_bytes(device) <= 0:
            reason = "no free memory"
        unused.append((device.name, reason or "not needed: giving it layers would not raise throughput"))
    return unused


def min_replica_bytes(request: PlanRequest, cost: CostModel) -> float:
    """Least memory one replica needs within the request's precisions and quality budget."""
    return cost.least_replica_bytes(min(request.bits), request.quantized_layer_budget)


def infeasible_message(request: PlanRequest, cost: CostModel, devices: Sequence[DeviceSpec]) -> str:
    """Why nothing fits, with the shortfall in GiB (within the budget and at the lowest precision)."""
    have = sum(max(usable_bytes(d), 0) for d in devices)
    low = min(request.bits)
    need = min_replica_bytes(request, cost)
    floor = cost.least_replica_bytes(low, request.model.num_layers)
    head = (f"infeasible: {request.model.name} with {request.workload.batch} sequences x "
            f"{request.workload.context} tokens of KV needs at least {_gib(need)} "
            f"(weights at {low} bits for the {request.quantized_layer_budget} layers the quality budget "
            f"allows, 16 bits elsewhere, plus KV and workspace)")
    if need > have:
        if floor > have:
            lowest = (f" Even with every layer at {low} bits it needs {_gib(floor)}: short by "
                      f"{_gib(floor - have)}.")
        else:
            lowest = (f" With every layer at {low} bits (--max-quantized 1) it would need {_gib(floor)}, "
                      f"which the fleet's total memory holds.")
        return (f"{head}, but the {len(devices)} usable device(s) offer {_gib(have)}: short by "
                f"{_gib(need - have)}.{lowest} Add devices, allow lower precision (--bits, --max-quantized) "
                f"or shrink --batch / --context.")
    largest = max(devices, key=usable_bytes)
    return (f"{head}; the usable devices offer {_gib(have)} in total, but no partition fits each stage's "
            f"weights and KV into its device (largest: {largest.name} with {_gib(usable_bytes(largest))}), "
            f"or an operator pin cannot be met. Allow lower precision or shrink --batch / --context.")
