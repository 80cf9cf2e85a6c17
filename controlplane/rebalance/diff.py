"""What a proposed plan changes against the applied one, stage by stage, in the planner's JSON.

Shown to the operator beside a proposal (dashboard, API), so it names what they recognise: a stage
moved to another device, a boundary moved (its layers), its precision; replicas added or removed.
"""

from __future__ import annotations

from typing import Any


def precision_label(stage: dict[str, Any]) -> str:
    """``16-bit``, ``int8``, or ``16-bit, int4 from L20`` for a stage mixing two precisions."""
    bits = stage.get("bits")
    label = "16-bit" if bits == 16 else f"int{bits}"
    if stage.get("low_bits"):
        label += f", int{stage['low_bits']} from L{stage.get('low_from')}"
    return label


def plan_diff(current: dict[str, Any], proposed: dict[str, Any]) -> dict[str, Any]:
    """``{"replicas": [before, after], "stages": [{replica, stage, device, layers, precision}],
    "moved", "boundaries", "precision"}``: each changed field of a stage is a ``[before, after]``
    pair (None where the stage does not exist on that side); the three counts say how many stages
    changed device, layers and precision."""
    before, after = current.get("replicas", []), proposed.get("replicas", [])
    changes, counts = [], {"moved": 0, "boundaries": 0, "precision": 0}
    for r in range(max(len(before), len(after))):
        old_stages = before[r]["stages"] if r < len(before) else []
        new_stages = after[r]["stages"] if r < len(after) else []
        for s in range(max(len(old_stages), len(new_stages))):
            old = old_stages[s] if s < len(old_stages) else None
            new = new_stages[s] if s < len(new_stages) else None
            change = {"replica": r, "stage": s}
            for field, count, read in (("device", "moved", lambda st: st["device"]),
                                       ("layers", "boundaries", lambda st: list(st["layers"])),
                                       ("precision", "precision", precision_label)):
                pair = [read(old) if old else None, read(new) if new else None]
                if pair[0] != pair[1]:
                    change[field] = pair
                    counts[count] += 1
            if len(change) > 2:
                changes.append(change)
    return {"replicas": [len(before), len(after)], "stages": changes, **counts}
