"""Build the planner's request from what the database knows now (inventory health, model profile)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from controlplane.deployments.plan_request_form import plan_request_from_dict
from controlplane.inventory.selectors import fleet_spec_from_inventory
from controlplane.models_catalog.models import LlmModel
from controlplane.models_catalog.selectors import model_profile
from controlplane.planning import PlanRequest


def plan_request_from_inventory(
    *, model: LlmModel, request: Mapping[str, Any], node_ids: Iterable[int] | None = None
) -> PlanRequest:
    """The stored-form ``request`` (controlplane/deployments/plan_request_form.py) on the whole
    inventory (or the given nodes) as it is now: LOST/DRAINING nodes and unhealthy devices arrive
    marked down, so the planner routes around them."""
    return plan_request_from_dict(
        request, fleet=fleet_spec_from_inventory(node_ids=node_ids), profile=model_profile(model=model)
    )
