"""What-if check of an operator-edited plan: every problem, and its figures next to the planner's.

Nothing here raises for a bad plan: the dashboard shows all problems at once, and the API refuses
to apply a plan whose report is not ``ok``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping

from contracts.hardware import GIB
from controlplane.planning.cost_model import CostModel
from controlplane.planning.evaluate import assemble, evaluate_replica
from controlplane.planning.explain import explain, unused_devices
from controlplane.planning.plan import Figures, Placement, Plan
from controlplane.planning.planner import plan as make_plan
from controlplane.planning.quality_budget import plan_kl, quantized_layers, within_kl
from controlplane.planning.request import PlanningError, PlanRequest
from controlplane.planning.serialize import placements_from_dict
from controlplane.planning.validate_group import group_problems

# Problems after which the edited plan cannot be priced at all.
_STRUCTURAL = {"unknown_device", "bad_range", "bad_split", "layer_missing", "layer_duplicated",
               "not_contiguous", "empty_replica", "malformed", "bad_group"}


@dataclass(frozen=True)
class Problem:
    code: str  # unknown_device | device_unavailable | device_reused | bad_range | layer_missing |
    # layer_duplicated | not_contiguous | empty_replica | over_memory | precision_not_allowed |
    # bad_split | over_quality_budget | pin_violated | malformed | bad_group
    message: str
    replica: int | None = None
    stage: int | None = None


@dataclass(frozen=True)
class ValidationReport:
    problems: tuple[Problem, ...]
    edited: Plan | None  # the edited plan, priced (None when its structure is broken)
    planned: Plan | None  # the planner's own plan for the same request (None when infeasible)
    planner_error: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def predicted(self) -> Figures | None:
        return self.edited.predicted if self.edited else None

    @property
    def planner_predicted(self) -> Figures | None:
        return self.planned.predicted if self.planned else None


def validate(edited: Plan | Mapping[str, Any], request: PlanRequest) -> ValidationReport:
    return _with_planner(request, *check(edited, request))


def check(edited: Plan | Mapping[str, Any], request: PlanRequest) -> tuple[list[Problem], Plan | None]:
    """``validate`` without the planner's own plan: the edited plan's problems and the plan priced
    (None when its structure is broken). For callers that price many variants of one plan."""
    if isinstance(edited, Plan):
        replicas = tuple((tuple(s.placement for s in r.stages), r.micro_batches) for r in edited.replicas)
    else:
        try:
            replicas = placements_from_dict(edited)
        except PlanningError as exc:
            return [Problem("malformed", str(exc))], None
    problems = _problems(request, replicas)
    priced = None
    known_bits = all({p.bits, p.last_bits, *(g.bits for g in p.group)} <= {16, 8, 4}
                     for stages, _ in replicas for p in stages)
    if not any(p.code in _STRUCTURAL for p in problems) and replicas and known_bits:
        cost = CostModel(request)
        evaluated = [evaluate_replica(cost, stages, m or min(cost.batch, len(stages)), i)
                     for i, (stages, m) in enumerate(replicas)]
        priced = assemble(request, cost, "edited", evaluated, explain(request, cost, evaluated),
                          unused_devices(request, evaluated))
    return problems, priced


def _with_planner(request: PlanRequest, problems, priced: Plan | None) -> ValidationReport:
    try:
        return ValidationReport(tuple(problems), priced, make_plan(request))
    except PlanningError as exc:
        return ValidationReport(tuple(problems), priced, None, str(exc))


def _problems(request: PlanRequest, replicas) -> list[Problem]:
    problems: list[Problem] = []
    known = {d.name: d for d in request.fleet.devices}
    uses = Counter(d for stages, _ in replicas for p in stages for d in _devices(p))
    layers = request.model.num_layers
    cost = CostModel(request)
    if not replicas:
        problems.append(Problem("empty_replica", "the plan has no replica"))
    for r, (stages, _) in enumerate(replicas):
        if not stages:
            problems.append(Problem("empty_replica", f"replica {r} has no stage", r))
            continue
        covered: Counter[int] = Counter()
        for s, p in enumerate(stages):
            problems.extend(_stage_problems(request, cost, known, uses, p, r, s))
            if 0 <= p.start < p.end <= layers:
                covered.update(range(p.start, p.end))
            if s and p.start != stages[s - 1].end:
                problems.append(Problem("not_contiguous", f"stage {s} starts at layer {p.start} but stage "
                                        f"{s - 1} ends at {stages[s - 1].end}", r, s))
        missing = [i for i in range(layers) if covered[i] == 0]
        twice = [i for i in range(layers) if covered[i] > 1]
        if missing:
            problems.append(Problem("layer_missing", f"replica {r}: layers {_ranges(missing)} are in no "
                                    f"stage", r))
        if twice:
            problems.append(Problem("layer_duplicated", f"replica {r}: layers {_ranges(twice)} are in more "
                                    f"than one stage", r))
        problems.extend(_budget_problems(request, stages, r))
    for pin in request.pins:
        if not replicas or not any((p.device, p.start, p.end) == (pin.device, pin.start, pin.end)
                                   for p in replicas[0][0]):
            problems.append(Problem("pin_violated", f"pin: {pin.device} must hold layers "
                                    f"[{pin.start}, {pin.end}) in replica 0", 0))
    return problems


def _budget_problems(request: PlanRequest, stages, r: int):
    """The quality budget in force: measured (``max_kl``: the low-bit layers' summed KL) or counted."""
    layers = request.model.num_layers
    if request.measured:
        if not all(p.bits in request.bits and p.last_bits in request.bits and 0 <= p.start < p.end <= layers
                   and not p.precision.problem(p.start, p.end) for p in stages):
            return  # precision_not_allowed, bad_range or bad_split says it; no KL to sum
        if not within_kl(stages, request.model.sensitivity, request.max_kl, request.bits):
            kl = plan_kl(stages, request.model.sensitivity)
            yield Problem("over_quality_budget", f"replica {r}: measured KL of its "
                          f"{quantized_layers(stages)} low-bit layers sums to {kl:.4g}, over the budget "
                          f"max_kl {request.max_kl:.4g}", r)
        return
    low = quantized_layers(stages)
    if low > request.quantized_layer_budget:
        yield Problem("over_quality_budget", f"replica {r}: {low} layers below 16 bits, budget "
                      f"{request.quantized_layer_budget} ({request.max_quantized:.0%} of {layers})", r)


def _stage_problems(request: PlanRequest, cost: CostModel, known, uses, p: Placement, r: int, s: int):
    where = f"replica {r} stage {s} ({p.device})"
    if p.device not in known:
        yield Problem("unknown_device", f"{where}: no such device in fleet {request.fleet.name}", r, s)
        return
    device = known[p.device]
    reason = request.excluded_reason(device)
    if reason:
        yield Problem("device_unavailable", f"{where}: device is {reason}", r, s)
    for name in _devices(p):
        if uses[name] > 1:
            who = "device" if name == p.device else f"its rank {name}"
            yield Problem("device_reused", f"{where}: {who} carries {uses[name]} stages", r, s)
    grouped = [Problem(code, text, r, s) for code, text in group_problems(request, cost, known, p, where)]
    yield from grouped
    held = {p.bits} | {share.bits for share in p.group} | ({p.low_bits} if p.low_bits is not None else set())
    for bits in sorted(held, reverse=True):
        if bits not in request.bits:
            yield Problem("precision_not_allowed",
                          f"{where}: {bits} bits not in the allowed {list(request.bits)}", r, s)
    if not 0 <= p.start < p.end <= request.model.num_layers:
        yield Problem("bad_range", f"{where}: layers [{p.start}, {p.end}) is empty or outside "
                      f"[0, {request.model.num_layers})", r, s)
        return
    split = p.precision.problem(p.start, p.end)
    if split:
        yield Problem("bad_split", f"{where}: {split}", r, s)
        return
    if {p.bits, p.last_bits} <= {16, 8, 4} and not grouped:  # a group's memory needs its shares sound
        memory = cost.memory(device, p)
        need = memory.holding(cost.kv_required)
        if need > memory.capacity_bytes:
            yield Problem("over_memory", f"{where}: needs {need / GIB:.2f} GiB (weights "
                          f"{memory.weights_bytes / GIB:.2f}, KV for {cost.kv_required} tokens "
                          f"{memory.kv_bytes_per_token * cost.kv_required / GIB:.2f}, workspace "
                          f"{memory.workspace_bytes / GIB:.2f}) but {memory.capacity_bytes / GIB:.2f} GiB is "
                          f"usable: over by {(need - memory.capacity_bytes) / GIB:.2f} GiB", r, s)


def _devices(p: Placement) -> list[str]:
    """The devices a stage runs on: its group's ranks, or its one card."""
    return list(dict.fromkeys(share.device for share in p.group)) or [p.device]


def _ranges(indices: list[int]) -> str:
    """[3, 4, 5, 9] -> '[3, 6), [9, 10)'."""
    spans, start = [], indices[0]
    for prev, cur in zip(indices, indices[1:] + [None]):
        if cur != prev + 1:
            spans.append(f"[{start}, {prev + 1})")
            start = cur
    return ", ".join(spans)
