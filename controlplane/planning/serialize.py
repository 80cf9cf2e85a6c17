"""The JSON form of a plan (schema: docs/planner.md) and back.

``plan_to_dict`` / ``plan_from_dict`` round-trip a full plan exactly. ``placements_from_dict``
reads only what an operator edits (device, layers, bits and an optional low_bits / low_from and
group per stage), so an edited plan may omit every predicted figure; ``validate`` re-prices it.
"""

from __future__ import annotations

from typing import Any, Mapping

from contracts.precision import Precision
from controlplane.planning.plan import (
    Bottleneck,
    Figures,
    MemoryBreakdown,
    Placement,
    Plan,
    ReplicaPlan,
    Share,
    StagePlan,
)
from controlplane.planning.request import PlanningError

_FIGURES = ("decode_tokens_per_s", "token_latency_ms", "prefill_ms", "round_ms")
_MEMORY = ("weights_bytes", "kv_bytes", "workspace_bytes", "total_bytes", "capacity_bytes", "host_kv_bytes")
_BOTTLENECK = ("replica", "device", "resource", "detail")


def _figures(f: Figures) -> dict[str, float]:
    return {k: getattr(f, k) for k in _FIGURES}


def _bottleneck(b: Bottleneck) -> dict[str, Any]:
    return {k: getattr(b, k) for k in _BOTTLENECK}


_SHARE = ("device", "kv_heads", "columns", "bits")


def _group(shares) -> dict[str, Any]:
    """A tensor-parallel stage's ``group`` (absent for a stage on one card, so such plans read as before)."""
    return {"group": [{k: getattr(share, k) for k in _SHARE} for share in shares]} if shares else {}


def _shares(d: Mapping[str, Any]) -> tuple[Share, ...]:
    return tuple(Share(str(g["device"]), int(g["kv_heads"]), int(g["columns"]), int(g["bits"]))
                 for g in d.get("group") or ())


def _stage(s: StagePlan) -> dict[str, Any]:
    return {
        "device": s.device, "node": s.node, "gpu_model": s.gpu_model, "layers": [s.start, s.end],
        "bits": s.bits, **s.precision.split_fields(), "kv_tokens": s.kv_tokens,
        "host_kv_tokens": s.host_kv_tokens,
        "memory": {k: getattr(s.memory, k) for k in _MEMORY},
        "predicted": {"compute_ms": s.compute_ms, "transfer_ms": s.transfer_ms, "step_ms": s.step_ms},
        "link": s.link, **_group(s.group),
    }


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    return {
        "kind": plan.kind, "model": plan.model, "fleet": plan.fleet, "objective": plan.objective,
        "batch": plan.batch, "context": plan.context,
        "replicas": [{"micro_batches": r.micro_batches, "micro_batch_size": r.micro_batch_size,
                      "stages": [_stage(s) for s in r.stages], "predicted": _figures(r.predicted),
                      "bottleneck": _bottleneck(r.bottleneck)} for r in plan.replicas],
        "predicted": _figures(plan.predicted), "bottleneck": _bottleneck(plan.bottleneck),
        "quantized_layers": plan.quantized_layers, "explanation": list(plan.explanation),
        "unused_devices": [{"device": d, "reason": why} for d, why in plan.unused_devices],
    }


def plan_from_dict(data: Mapping[str, Any]) -> Plan:
    """The full plan back from ``plan_to_dict``'s output (KeyError / TypeError on a partial one); a
    stage without ``host_kv_tokens`` (nor ``memory.host_kv_bytes``) has no host tier."""
    def stage(d: Mapping[str, Any]) -> StagePlan:
        start, end = d["layers"]
        return StagePlan(device=d["device"], node=d["node"], gpu_model=d["gpu_model"], start=start, end=end,
                         bits=d["bits"], low_bits=d.get("low_bits"), low_from=d.get("low_from"),
                         kv_tokens=d["kv_tokens"], host_kv_tokens=d.get("host_kv_tokens", 0),
                         memory=MemoryBreakdown(**d["memory"]), link=d["link"], group=_shares(d),
                         **d["predicted"])

    return Plan(
        kind=data["kind"], model=data["model"], fleet=data["fleet"], objective=data["objective"],
        batch=data["batch"], context=data["context"],
        replicas=tuple(ReplicaPlan(stages=tuple(stage(s) for s in r["stages"]),
                                   micro_batches=r["micro_batches"], micro_batch_size=r["micro_batch_size"],
                                   predicted=Figures(**r["predicted"]),
                                   bottleneck=Bottleneck(**r["bottleneck"]))
                       for r in data["replicas"]),
        predicted=Figures(**data["predicted"]), bottleneck=Bottleneck(**data["bottleneck"]),
        quantized_layers=data["quantized_layers"], explanation=tuple(data["explanation"]),
        unused_devices=tuple((u["device"], u["reason"]) for u in data["unused_devices"]),
    )


def stored_plan(data: Mapping[str, Any]) -> Plan | None:
    """A stored plan as the full ``Plan``; None for one that holds only what an operator edits (an edited
    plan: its figures come when it is priced) or that cannot be read as one."""
    try:
        return plan_from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def replica_placements(data: Mapping[str, Any]) -> tuple[tuple[Placement, ...], ...]:
    """Each replica's stages as a stored plan places them (PlanningError on a malformed plan)."""
    return tuple(stages for stages, _ in placements_from_dict(data))


def placements_from_dict(data: Mapping[str, Any]) -> tuple[tuple[tuple[Placement, ...], int | None], ...]:
    """Per replica: its stages' placements and its micro-batch count (None when not given)."""
    try:
        replicas = []
        for r in data["replicas"]:
            stages = []
            for s in r["stages"]:
                start, end = s["layers"]
                stages.append(Placement.at(str(s["device"]), int(start), int(end), Precision.of(s),
                                           _shares(s)))
            replicas.append((tuple(stages), r.get("micro_batches")))
        return tuple(replicas)
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanningError(f"plan: malformed ({exc!r}); expected replicas[].stages[] with device, "
                            f"layers [start, end), bits and optionally low_bits with low_from "
                            f"and a group") from None
