"""Build the planner's request from what the database knows now (inventory health, model profile)."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from contracts.hardware import FleetSpec
from controlplane.deployments.plan_request_form import plan_request_from_dict
from controlplane.inventory.calibration import calibrations
from controlplane.inventory.models import Device
from controlplane.inventory.selectors import fleet_spec_from_inventory
from controlplane.models_catalog.models import LlmModel
from controlplane.models_catalog.selectors import model_profile
from controlplane.planning import PlanRequest
from controlplane.telemetry.calibration import stage_calibration


def plan_request_from_inventory(
    *, model: LlmModel, request: Mapping[str, Any], node_ids: Iterable[int] | None = None
) -> PlanRequest:
    """The stored-form ``request`` (controlplane/deployments/plan_request_form.py) on the whole
    inventory (or the given nodes) as it is now: lost, cordoned and draining nodes and unhealthy
    devices arrive marked down, so the planner routes around them."""
    return plan_request_from_dict(
        request, fleet=fleet_spec_from_inventory(node_ids=node_ids), profile=model_profile(model=model)
    )



def with_calibration(plan_data: dict[str, Any], *, fleet: FleetSpec) -> dict[str, Any]:
    """``plan_data`` (the planner's JSON) with, per stage, the calibration its figures were priced with
    (``calibration``: the factor of its device at the stage's last precision, where that comes from,
    the samples behind it) and the figures without it (``predicted_raw``: first principles alone).
    A copy: a stored plan never carries them. Two queries."""
    data = copy.deepcopy(plan_data)
    specs = {d.name: d for d in fleet.devices}
    stored = calibrations()
    rows = {d.name: d for d in Device.objects.select_related("node").filter(node__name__in={
        d.node for d in specs.values()})}
    for replica in data.get("replicas", []):
        for stage in replica.get("stages", []):
            spec, row = specs.get(stage.get("device")), rows.get(stage.get("device"))
            if spec is None or row is None or "predicted" not in stage:
                continue
            bits = stage.get("low_bits") or stage["bits"]
            factor, factors = spec.calibration_at(bits), stored.for_device(row)
            predicted = stage["predicted"]
            raw = predicted["compute_ms"] / factor
            stage["calibration"] = {"factor": factor, "bits": bits, "source": factors.source,
                                    "samples": factors.samples.get(bits, 0)}
            stage["predicted_raw"] = {"compute_ms": raw, "transfer_ms": predicted["transfer_ms"],
                                      "step_ms": max(raw, predicted["transfer_ms"])}
    return data


def calibration_overview(*, deployment_id: int | None = None) -> dict[str, Any]:
    """Every device's calibration as the planner uses it now, and every observed stage's decode step
    (of one deployment, if given): measured, predicted raw and calibrated at the observed load."""
    stored = calibrations()
    devices = []
    for device in Device.objects.select_related("node").order_by("node__name", "index"):
        factors = stored.for_device(device)
        devices.append({"device": device.name, "model": device.model_name, "emulated": device.emulated,
                        "factor": factors.factor, "by_bits": {str(b): r for b, r in factors.by_bits.items()},
                        "samples": {str(b): n for b, n in factors.samples.items()}, "source": factors.source})
    ids = None if deployment_id is None else [deployment_id]
    return {"devices": devices, "stages": stage_calibration(deployment_ids=ids)}
