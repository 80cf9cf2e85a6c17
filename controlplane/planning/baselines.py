"""The splits other systems use by default, priced by the same cost model for comparison.

* ``even``: the same number of layers on every GPU (vLLM's pipeline parallelism);
* ``memory``: layers in proportion to each GPU's memory (exo, llama.cpp's tensor split).
Both run over the planner's own replicas and device order ("the chosen GPUs") unless given groups,
with ``min(batch, stages)`` micro-batches, 16 bits where a stage fits and the next lower allowed
precision on stages that do not; a baseline that needs more low-bit layers than the budget allows,
or does not fit at all, is infeasible.
"""

from __future__ import annotations

from typing import Literal, Sequence

from contracts.footprint import usable_bytes
from controlplane.planning.cost_model import CostModel
from controlplane.planning.evaluate import assemble, evaluate_replica
from controlplane.planning.explain import explain, unused_devices
from controlplane.planning.plan import Placement, Plan
from controlplane.planning.planner import plan
from controlplane.planning.quality_budget import quantized_layers
from controlplane.planning.request import PlanningError, PlanRequest

BaselineKind = Literal["even", "memory"]


def baseline_plan(request: PlanRequest, kind: BaselineKind = "even",
                  groups: Sequence[Sequence[str]] | None = None) -> Plan:
    """A baseline plan over ``groups`` (device names per replica, in pipeline order)."""
    if kind not in ("even", "memory"):
        raise PlanningError(f"baseline: {kind!r} is not even or memory")
    if groups is None:
        groups = [[s.device for s in r.stages] for r in plan(request).replicas]
    cost = CostModel(request)
    replicas = []
    for index, names in enumerate(groups):
        devices = [cost.device(n) for n in names]
        weights = [1.0] * len(devices) if kind == "even" else [float(usable_bytes(d)) for d in devices]
        counts = _apportion(request.model.num_layers, weights)
        placements, start = [], 0
        for device, count in zip(devices, counts):
            if count:
                placements.append(Placement(device.name, start, start + count, 16))
                start += count
        placements = _fit_precision(request, cost, placements)
        replicas.append(evaluate_replica(cost, placements, min(cost.batch, len(placements)), index))
    return assemble(request, cost, kind, replicas, explain(request, cost, replicas),
                    unused_devices(request, replicas))


def _apportion(total: int, weights: Sequence[float]) -> list[int]:
    """Integer shares of ``total`` proportional to ``weights`` (largest remainder, stable)."""
    whole = sum(weights)
    exact = [total * w / whole for w in weights]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def _fit_precision(request: PlanRequest, cost: CostModel, placements: list[Placement]) -> list[Placement]:
    fitted = []
    for p in placements:
        device = cost.device(p.device)
        for bits in request.sorted_bits:
            placement = Placement(p.device, p.start, p.end, bits)
            if cost.memory(device, placement).kv_tokens >= cost.kv_required:
                fitted.append(placement)
                break
        else:
            raise PlanningError(f"baseline infeasible: layers [{p.start}, {p.end}) do not fit {p.device} "
                                f"at any allowed precision")
    if quantized_layers(fitted) > request.quantized_layer_budget:
        raise PlanningError(f"baseline infeasible: needs {quantized_layers(fitted)} low-bit layers, "
                            f"over the budget of {request.quantized_layer_budget}")
    return fitted
