"""What a proposed plan changes against the applied one, stage by stage, over the planner's placements.

Shown to the operator beside a proposal (dashboard, API), so it names what they recognise: a stage
moved to another device, a boundary moved (its layers), its precision; replicas added or removed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from controlplane.planning import Placement

Replicas = Sequence[Sequence[Placement]]  # per replica, its stages (``PlanRevision.placements``)


def precision_label(stage: Placement) -> str:
    """``16-bit``, ``int8``, or ``16-bit, int4 from L20`` for a stage mixing two precisions."""
    label = "16-bit" if stage.bits == 16 else f"int{stage.bits}"
    if stage.low_bits:
        label += f", int{stage.low_bits} from L{stage.low_from}"
    return label


def plan_diff(current: Replicas, proposed: Replicas) -> dict[str, Any]:
    """``{"replicas": [before, after], "stages": [{replica, stage, device, layers, precision}],
    "moved", "boundaries", "precision"}``: each changed field of a stage is a ``[before, after]``
    pair (None where the stage does not exist on that side); the three counts say how many stages
    changed device, layers and precision."""
    changes, counts = [], {"moved": 0, "boundaries": 0, "precision": 0}
    for r in range(max(len(current), len(proposed))):
        old_stages = current[r] if r < len(current) else ()
        new_stages = proposed[r] if r < len(proposed) else ()
        for s in range(max(len(old_stages), len(new_stages))):
            old = old_stages[s] if s < len(old_stages) else None
            new = new_stages[s] if s < len(new_stages) else None
            change = {"replica": r, "stage": s}
            for field, count, read in (("device", "moved", lambda st: st.device),
                                       ("layers", "boundaries", lambda st: [st.start, st.end]),
                                       ("precision", "precision", precision_label)):
                pair = [read(old) if old else None, read(new) if new else None]
                if pair[0] != pair[1]:
                    change[field] = pair
                    counts[count] += 1
            if len(change) > 2:
                changes.append(change)
    return {"replicas": [len(current), len(proposed)], "stages": changes, **counts}
