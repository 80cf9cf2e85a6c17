"""The least change that makes an applied plan deployable again, and the choice between it and a
fresh plan.

After a node is lost or drained, the planner's fresh plan usually moves every boundary: every stage
of the deployment restarts, and its pipeline stops serving while they do. The repair keeps the
applied plan and moves only the stages whose device the request can no longer use (a lost, cordoned,
draining or excluded node, a device gone down) to eligible devices the plan does not use, each to
the one that serves fastest; the rest of the pipeline keeps its layers, precisions and devices.

``least_change_plan`` prices the handover itself: a changed stage restarts, which pauses its
pipeline (longer the more stages restart, all loading at once) and drops what it held warm (KV,
loaded weights). The fresh plan must win by more than the throughput its extra restarts are worth:
``keep_within`` of it for changing the whole pipeline beyond what the repair changes, in proportion
for less. The repair is taken when it predicts at least ``1 - keep_within x (share of stages the
fresh plan changes - share the repair changes)`` of the fresh plan's decode throughput. A much
better fresh plan still wins; a better one that does not pay for its restarts now is left to the
rebalance policy, which proposes it (or applies it, ``auto``) after its cooldown when it gains its
threshold, at a time the operator can choose.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from controlplane.planning.plan import Plan
from controlplane.planning.planner import plan as make_plan
from controlplane.planning.request import PlanningError, PlanRequest
from controlplane.planning.serialize import placements_from_dict
from controlplane.planning.validate import check


def repaired_plan(applied: Mapping[str, Any], request: PlanRequest) -> Plan | None:
    """``applied`` (a plan's JSON) with its stages on devices ``request`` cannot use moved to unused
    eligible ones; None when nothing needs moving or no such move passes the plan's check."""
    eligible = {d.name for d in request.eligible_devices()}
    edited = copy.deepcopy(dict(applied))
    stages = [(r, s, stage) for r, replica in enumerate(edited.get("replicas", []))
              for s, stage in enumerate(replica.get("stages", []))]
    displaced = [(r, s, stage) for r, s, stage in stages if stage.get("device") not in eligible]
    if not displaced:
        return None
    moves = []
    for r, s, stage in displaced:
        free = sorted(eligible - {other["device"] for _, _, other in stages})
        was, best = stage["device"], None
        for name in free:
            stage["device"] = name
            problems, priced = check(edited, request)
            if priced is None or any((p.replica, p.stage) == (r, s) for p in problems):
                continue
            if best is None or priced.predicted.decode_tokens_per_s > best[1]:
                best = (name, priced.predicted.decode_tokens_per_s)
        if best is None:
            return None
        stage["device"] = best[0]
        moves.append(f"replica {r} stage {s} (layers {stage['layers'][0]}-{stage['layers'][1] - 1}) "
                     f"from {was} to {best[0]}")
    problems, priced = check(edited, request)
    if problems or priced is None:
        return None
    why = f"repaired the applied plan: moved {'; '.join(moves)}; every other stage kept"
    return dataclasses.replace(priced, kind="repaired", explanation=(why, *priced.explanation))


def stages_changed(applied: Mapping[str, Any], candidate: Plan) -> tuple[int, int]:
    """(changed, positions): of the pipeline positions (replica, stage) of either plan, those whose
    placement (device, layers, precision) ``candidate`` changes from ``applied``. Those stages restart
    in a handover to it; a neighbour restarted because its link changed is not counted, as both
    choices share most of those."""
    before = [list(stages) for stages, _ in placements_from_dict(applied)]
    after = [[stage.placement for stage in replica.stages] for replica in candidate.replicas]
    positions = changed = 0
    for r in range(max(len(before), len(after))):
        old, new = before[r] if r < len(before) else [], after[r] if r < len(after) else []
        for s in range(max(len(old), len(new))):
            positions += 1
            changed += (old[s] if s < len(old) else None) != (new[s] if s < len(new) else None)
    return changed, positions


def least_change_plan(applied: Mapping[str, Any], request: PlanRequest, *, keep_within: float) -> Plan:
    """The repair of ``applied`` when it predicts at least ``1 - keep_within x`` (the share of stages
    the planner's plan changes beyond the repair's) of the planner's plan's decode throughput (or the
    planner finds none), else the planner's plan; PlanningError when neither exists."""
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
    (fresh_changes, positions), (kept_changes, kept_positions) = (
        stages_changed(applied, fresh), stages_changed(applied, kept))
    if share < 1 - keep_within * (fresh_changes / positions - kept_changes / kept_positions):
        return fresh
    return dataclasses.replace(kept, explanation=(
        kept.explanation[0] + f" ({share:.0%} of a fresh plan's decode throughput, which would change "
        f"{fresh_changes} of {positions} stages)", *kept.explanation[1:]))
