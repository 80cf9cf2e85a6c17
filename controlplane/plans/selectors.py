"""Build the planner's request from what the database knows now (inventory health, model profile)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import SimpleNamespace
from typing import Any

from contracts.hardware import FleetSpec
from contracts.names import parse_stage_key
from controlplane.deployments.models import Deployment
from controlplane.deployments.plan_request_form import plan_request_from_dict
from controlplane.inventory.calibration import calibrations
from controlplane.inventory.models import Device
from controlplane.inventory.selectors import fleet_spec_from_inventory
from controlplane.models_catalog.models import LlmModel
from controlplane.models_catalog.selectors import model_profile
from controlplane.planning import Plan, PlanRequest, plan_to_dict
from controlplane.planning.speculation import Speculation
from controlplane.planning.tensor_parallel import group_link
from controlplane.telemetry.calibration import stage_calibration
from controlplane.telemetry.selectors import stage_samples


def plan_request_from_inventory(
    *, model: LlmModel, request: Mapping[str, Any], node_ids: Iterable[int] | None = None,
    deployment: Deployment | None = None,
) -> PlanRequest:
    """The stored-form ``request`` (controlplane/deployments/plan_request_form.py) on the whole
    inventory (or the given nodes) as it is now: lost, cordoned and draining nodes and unhealthy
    devices arrive marked down, so the planner routes around them. For a ``deployment``, its
    speculation counts in the predicted tokens/s (``deployment_speculation``)."""
    return plan_request_from_dict(
        request, fleet=fleet_spec_from_inventory(node_ids=node_ids), profile=model_profile(model=model),
        speculation=deployment_speculation(deployment) if deployment is not None else Speculation(),
    )


def deployment_speculation(deployment: Deployment) -> Speculation:
    """The deployment's speculation as the planner prices it: its mode and ceiling, and the acceptance
    rate its heads measured (accepted over proposed tokens, summed over the latest report of every
    head that reported ``spec_*`` figures; contracts §4), else None for the mode's prior."""
    if deployment.speculation == "off":
        return Speculation()
    proposed = accepted = 0.0
    for key, latest in stage_samples(deployment_id=deployment.pk).items():
        parts, stats = parse_stage_key(key), latest.value.get("stats")
        if parts is None or parts.stage_index != 0 or not isinstance(stats, dict):
            continue
        draft, taken = stats.get("spec_draft_tokens"), stats.get("spec_accepted_tokens")
        if isinstance(draft, (int, float)) and isinstance(taken, (int, float)) and draft > 0:
            proposed, accepted = proposed + draft, accepted + min(taken, draft)
    return Speculation(deployment.speculation, deployment.speculative_tokens,
                       accepted / proposed if proposed > 0 else None, _propose_s(deployment))


def _propose_s(deployment: Deployment) -> float:
    """What the deployment's draft model takes to propose its ceiling of tokens: that many times the
    time between two tokens its own plan predicts (0 without a draft model, or one whose plan is not
    priced)."""
    draft = deployment.draft_deployment if deployment.speculation == "draft" else None
    plan = draft.revision.priced if draft is not None and draft.revision is not None else None
    return deployment.speculative_tokens * plan.predicted.token_latency_ms / 1e3 if plan else 0.0



def with_calibration(plan: Plan, *, fleet: FleetSpec) -> dict[str, Any]:
    """The planner's JSON of ``plan`` with, per stage, the calibration its figures were priced with
    (``calibration``: the factor of its device at the stage's last precision, where that comes from,
    the samples behind it) and the figures without it (``predicted_raw``: first principles alone).
    A tensor-parallel group stage also carries ``group_link``: the link its collectives are priced over
    (``tensor_parallel.group_link``: the slowest between two of its ranks). A stored plan never
    carries them. Two queries."""
    data = plan_to_dict(plan)
    specs = {d.name: d for d in fleet.devices}
    stored = calibrations()
    rows = {d.name: d for d in Device.objects.select_related("node").filter(node__name__in={
        d.node for d in specs.values()})}
    for replica, shown in zip(plan.replicas, data["replicas"]):
        for stage, out in zip(replica.stages, shown["stages"]):
            if stage.group and all(share.device in specs for share in stage.group):
                out["group_link"] = _group_link(fleet, [specs[share.device] for share in stage.group])
            spec, row = specs.get(stage.device), rows.get(stage.device)
            if spec is None or row is None:
                continue
            bits = stage.last_bits
            factor, factors = spec.calibration_at(bits), stored.for_device(row)
            raw = stage.compute_ms / factor
            out["calibration"] = {"factor": factor, "bits": bits, "source": factors.source,
                                  "samples": factors.samples.get(bits, 0)}
            out["predicted_raw"] = {"compute_ms": raw, "transfer_ms": stage.transfer_ms,
                                    "step_ms": max(raw, stage.transfer_ms)}
    return data


def _group_link(fleet: FleetSpec, devices: list) -> dict[str, Any]:
    # group_link asks its first argument for ``link(a, b)``: the cost model's, here the fleet's own.
    link = group_link(SimpleNamespace(link=fleet.link_between), devices)
    return {"kind": link.kind, "bandwidth_gbs": link.bandwidth_gbs, "latency_us": link.latency_us}


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
