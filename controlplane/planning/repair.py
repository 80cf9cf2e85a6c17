"""The least change that makes an applied plan deployable again, and the choice between it and a
fresh plan.

After a node is lost or drained, the planner's fresh plan usually moves every boundary: every stage
of the deployment restarts, and its pipeline stops serving while they do. The repair keeps the
applied plan and moves only the stages whose device the request can no longer use (a lost, cordoned,
draining or excluded node, a device gone down) to eligible devices the plan does not use, each to
the one that serves fastest; where no free device can take one (every device in use), the stages
beside it in its pipeline take its layers, split where the pipeline serves fastest, each at the
precision of its own layers beside them. The rest of the pipeline keeps its layers, precisions and
devices: a surviving stage that takes layers loads only those (worker_runtime.serve takes over the
layers it holds).

``least_change_plan`` prices the handover itself: the layers stages load in place pause their
pipeline (longer the more they load, all at once) and drop what they held warm (KV), while a stage
moved to a free device of another node is prepared beside and costs the pipeline no pause
(``layers_reloaded``). The fresh plan must win by more than the throughput its extra loads are
worth: ``keep_within`` of it for loading the whole model beyond what the repair loads, in proportion
for less. The repair is taken when it predicts at least ``1 - keep_within x (share of layers the
fresh plan loads in the pause - share the repair loads)`` of the fresh plan's decode throughput. A
much better fresh plan still wins; a better one that does not pay for its loads now is left to the
rebalance policy, which proposes it (or applies it, ``auto``) after its cooldown when it gains its
threshold, at a time the operator can choose.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from controlplane.planning.plan import Placement, Plan
from controlplane.planning.planner import plan as make_plan
from controlplane.planning.request import PlanningError, PlanRequest
from controlplane.planning.serialize import placements_from_dict
from controlplane.planning.validate import check


def repaired_plan(applied: Mapping[str, Any], request: PlanRequest) -> Plan | None:
    """``applied`` (a plan's JSON) with each stage on a device ``request`` cannot use moved to the unused
    eligible device that serves fastest or, where none can take it (every device in use), its layers
    taken by its pipeline neighbours; None when nothing needs repairing or some stage cannot be."""
    eligible = {d.name for d in request.eligible_devices()}
    edited = copy.deepcopy(dict(applied))
    displaced = [(r, s) for r, replica in enumerate(edited.get("replicas", []))
                 for s, stage in enumerate(replica.get("stages", [])) if stage.get("device") not in eligible]
    if not displaced:
        return None
    repairs = []
    # Last position first: a stage absorbed by its neighbours shifts only the positions after it.
    for r, s in reversed(displaced):
        pending = {position for position in displaced if position < (r, s)}
        repair = _moved(edited, r, s, eligible, request, pending) or _absorbed(edited, r, s, request, pending)
        if repair is None:
            return None
        edited, what = repair
        repairs.append(what)
    problems, priced = check(edited, request)
    if problems or priced is None:
        return None
    why = f"repaired the applied plan: {'; '.join(reversed(repairs))}; every other stage kept"
    return dataclasses.replace(priced, kind="repaired", explanation=(why, *priced.explanation))


def _moved(edited: dict, r: int, s: int, eligible: set[str], request: PlanRequest,
           pending: set[tuple[int, int]]) -> tuple[dict, str] | None:
    """``edited`` with stage ``s`` of replica ``r`` on the unused eligible device that serves fastest."""
    used = {stage["device"] for replica in edited["replicas"] for stage in replica["stages"]}
    stage = edited["replicas"][r]["stages"][s]
    candidates = []
    for name in sorted(eligible - used):
        candidate = copy.deepcopy(edited)
        candidate["replicas"][r]["stages"][s]["device"] = name
        candidates.append((candidate, f"moved replica {r} stage {s} (layers {_span(stage)}) from "
                                      f"{stage['device']} to {name}"))
    return _fastest(candidates, request, pending)


def _absorbed(edited: dict, r: int, s: int, request: PlanRequest,
              pending: set[tuple[int, int]]) -> tuple[dict, str] | None:
    """``edited`` without stage ``s`` of replica ``r``, its layers [a, b) split at the best layer m between
    the stage before it (which takes [a, m) at the precision of its own last layer) and the stage after
    it (which takes [m, b) at that of its first layer). The neighbours load only the layers they take;
    the stages after it keep their layers and devices but, one place earlier in the pipeline, start
    as new processes (a stage keeps its index)."""
    stages = edited["replicas"][r]["stages"]
    (a, b), before, after = stages[s]["layers"], s > 0, s + 1 < len(stages)
    lost, candidates = f"replica {r} stage {s} (layers {_span(stages[s])}, on {stages[s]['device']})", []
    for m in range(a if after else b, (b if before else a) + 1):
        candidate = copy.deepcopy(edited)
        kept, taken = candidate["replicas"][r]["stages"], []
        if m > a:
            kept[s - 1]["layers"][1] = m
            taken.append(f"layers {a}-{m - 1} by {kept[s - 1]['device']}")
        if m < b:
            kept[s + 1]["layers"][0] = m
            taken.append(f"layers {m}-{b - 1} by {kept[s + 1]['device']}")
        del kept[s]
        candidates.append((candidate, f"{lost} taken by its neighbours: {' and '.join(taken)}"))
    return _fastest(candidates, request, pending)


def _fastest(candidates: list[tuple[dict, str]], request: PlanRequest,
             pending: set[tuple[int, int]]) -> tuple[dict, str] | None:
    """The candidate plan that serves fastest among those whose only problems are at ``pending``
    positions (stranded stages still to repair)."""
    best = None
    for candidate, what in candidates:
        problems, priced = check(candidate, request)
        if priced is None or any((p.replica, p.stage) not in pending for p in problems):
            continue
        if best is None or priced.predicted.decode_tokens_per_s > best[0]:
            best = (priced.predicted.decode_tokens_per_s, candidate, what)
    return None if best is None else best[1:]


def _span(stage: Mapping[str, Any]) -> str:
    return f"{stage['layers'][0]}-{stage['layers'][1] - 1}"


def layers_reloaded(applied: Mapping[str, Any], candidate: Plan, request: PlanRequest) -> tuple[int, int]:
    """(loaded, layers): of the model's layers in each replica of either plan, those ``candidate`` has
    a stage load during its pipeline's pause in an in-place handover. A stage given a new spec in place
    takes over the layers it holds (worker_runtime/serve.py), so a stage that stays on its device loads
    only the layers it did not hold at that precision; one that changes device loads all of its own,
    unless it is prepared beside: a replica whose stages keep their devices except some that move to
    devices of other nodes the applied plan leaves free is handed over prepared (``desired_state``):
    those load while it serves, its pause is the rewiring. A stage that goes loads nothing."""
    before = [list(stages) for stages, _ in placements_from_dict(applied)]
    after = [[stage.placement for stage in replica.stages] for replica in candidate.replicas]
    node_of = {d.name: d.node for d in request.fleet.devices}
    used = {p.device for stages in before for p in stages}
    loaded = total = 0
    for r in range(max(len(before), len(after))):
        old, new = before[r] if r < len(before) else [], after[r] if r < len(after) else []
        total += request.model.num_layers
        prepared = len(old) == len(new) and all(
            o.device == n.device or (n.device not in used and node_of.get(n.device) != node_of.get(o.device))
            for o, n in zip(old, new))
        for s, placement in enumerate(new):
            held = old[s] if s < len(old) and old[s].device == placement.device else None
            if held is None and prepared:
                continue
            loaded += len(_layer_precisions(placement) - (_layer_precisions(held) if held else set()))
    return loaded, total


def _layer_precisions(placement: Placement) -> set[tuple[int, int]]:
    return {(layer, bits) for start, end, bits in placement.segments for layer in range(start, end)}


def least_change_plan(applied: Mapping[str, Any], request: PlanRequest, *, keep_within: float) -> Plan:
    """The repair of ``applied`` when it predicts at least ``1 - keep_within x`` (the share of layers
    the planner's plan loads in the pause beyond the repair's) of the planner's plan's decode
    throughput (or the planner finds none), else the planner's plan; PlanningError when neither
    exists."""
    try:
        fresh, error = make_plan(request), None
    except PlanningError as exc:
        fresh, error = None, exc
    kept = repaired_plan(applied, request)
    if kept is None:
        if fresh is None:
            raise error
        return fresh
    if fresh is None:
        return kept
    share = kept.predicted.decode_tokens_per_s / fresh.predicted.decode_tokens_per_s
    (fresh_loads, layers), (kept_loads, kept_layers) = (
        layers_reloaded(applied, fresh, request), layers_reloaded(applied, kept, request))
    if share < 1 - keep_within * (fresh_loads / layers - kept_loads / kept_layers):
        return fresh
    return dataclasses.replace(kept, explanation=(
        kept.explanation[0] + f" ({share:.0%} of a fresh plan's decode throughput, which would load "
        f"{fresh_loads} of {layers} layers in the pause, against {kept_loads})", *kept.explanation[1:]))
