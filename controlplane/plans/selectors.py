"""Build the planner's request from what the database knows now (inventory health, model profile)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from controlplane.inventory.selectors import fleet_spec_from_inventory
from controlplane.models_catalog.models import LlmModel
from controlplane.models_catalog.selectors import model_profile
from controlplane.planning import Pin, PlanRequest, Workload


def plan_request_from_inventory(
    *,
    model: LlmModel,
    batch: int = 8,
    context: int = 4096,
    prompt_tokens: int | None = None,
    objective: Literal["throughput", "latency"] = "throughput",
    bits: Iterable[int] = (16, 8, 4),
    max_quantized: float = 0.5,
    replicas: int | Literal["auto"] = "auto",
    pins: Iterable[dict] = (),
    exclude_nodes: Iterable[str] = (),
    exclude_devices: Iterable[str] = (),
    node_ids: Iterable[int] | None = None,
) -> PlanRequest:
    """The whole inventory (or the given nodes) as it is now: LOST/DRAINING nodes and unhealthy
    devices arrive marked down, so the planner routes around them."""
    return PlanRequest(
        fleet=fleet_spec_from_inventory(node_ids=node_ids),
        model=model_profile(model=model),
        workload=Workload(batch=batch, context=context, prompt_tokens=prompt_tokens),
        objective=objective,
        bits=tuple(bits),
        max_quantized=max_quantized,
        replicas=replicas,
        pins=tuple(Pin(device=p["device"], start=p["start"], end=p["end"]) for p in pins),
        exclude_nodes=tuple(exclude_nodes),
        exclude_devices=tuple(exclude_devices),
    )
