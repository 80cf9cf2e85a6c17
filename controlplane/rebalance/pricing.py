"""The one question every trigger asks: on the fleet as it is now, how much faster would the
planner's plan serve than the applied one?

"Now" means what the planner would be told by a re-plan (registered nodes; lost, cordoned, draining
nodes and unhealthy devices down; calibration; other deployments' devices left out: the very
request ``deployments.revisions.replan_revision_create`` plans) plus what only telemetry knows: a card
reporting a slowdown runs at ``sm_clock / sm_clock_max`` of its speed (``DeviceSpec.throttle_factor``),
so a sustained throttle prices both plans as they would really run. The request is the applied
revision's own, so the answer is to the question the deployment was planned for.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from contracts.hardware import FleetSpec
from contracts.metrics import SLOWDOWN_REASONS
from controlplane.deployments.models import Deployment
from controlplane.deployments.revisions import registered_fleet, request_on_fleet
from controlplane.deployments.selectors import devices_in_use
from controlplane.planning import PlanningError, plan_to_dict, validate
from controlplane.telemetry.selectors import device_samples

MIN_THROTTLE_FACTOR = 0.05  # a clock reading of ~0 is a sensor glitch, not a stopped card


def throttled_devices() -> dict[str, float]:
    """Device name -> fraction of its speed left, for every card whose latest sample reports a
    slowdown (``contracts.metrics.SLOWDOWN_REASONS``); 1.0 where it reports no clocks to tell."""
    found = {}
    for name, reading in device_samples().items():
        metrics = reading.value
        if not set(metrics.get("throttle_reasons") or ()) & set(SLOWDOWN_REASONS):
            continue
        clock, top = metrics.get("sm_clock_mhz"), metrics.get("sm_clock_max_mhz")
        found[name] = min(1.0, max(MIN_THROTTLE_FACTOR, clock / top)) if clock and top else 1.0
    return found


def fleet_now(*, throttle: dict[str, float]) -> FleetSpec:
    """The registered fleet as the planner sees it, each throttled card at its measured speed."""
    fleet = registered_fleet(name="rebalance")
    nodes = tuple(dataclasses.replace(node, devices=tuple(
        dataclasses.replace(d, throttle_factor=throttle[d.name]) if d.name in throttle else d
        for d in node.devices)) for node in fleet.nodes)
    return dataclasses.replace(fleet, nodes=nodes)


def plannable_devices(*, deployment: Deployment, fleet: FleetSpec) -> list[str]:
    """The devices a re-plan of ``deployment`` could use now: up, and no other deployment's."""
    busy = devices_in_use(deployment=deployment)
    return sorted(d.name for d in fleet.devices if not d.down and d.name not in busy)


def free_devices(*, fleet: FleetSpec) -> list[str]:
    """The devices up that carry no deployment's stage."""
    used = devices_in_use(deployment=None)
    return [d.name for d in fleet.devices if not d.down and d.name not in used]


@dataclass(frozen=True)
class Pricing:
    """The applied plan and the planner's against each other on one fleet."""

    current_tokens_per_s: float
    repriced: bool  # the applied plan priced on the fleet now (else: its stored prediction)
    proposed: dict[str, Any] | None  # the planner's plan (its JSON), None when nothing fits
    proposed_tokens_per_s: float
    problem: str | None  # why there is no proposal
    request: dict[str, Any]  # the request the planner was asked: the revision's, or with ``changes``

    @property
    def gain(self) -> float:
        if self.proposed is None:
            return 0.0
        if self.current_tokens_per_s <= 0:  # the applied plan cannot serve at all now
            return math.inf
        return self.proposed_tokens_per_s / self.current_tokens_per_s - 1


def price(*, deployment: Deployment, fleet: FleetSpec, changes: dict[str, Any] | None = None,
          withheld: Iterable[str] = ()) -> Pricing:
    """Re-plan ``deployment`` on ``fleet`` (its revision's request with ``changes`` where given: a
    demand change's replicas or batch; without the free cards ``withheld`` for other deployments) and
    price its applied plan there too. The planner's plan is checked with its own ``validate`` (every
    layer served, memory, precision, pins)."""
    revision = deployment.revision
    applied, priced = revision.plan, revision.priced
    stored = float(priced.predicted.decode_tokens_per_s if priced else 0.0)
    asked = {**revision.request, **(changes or {})}
    try:
        request = request_on_fleet(asked, model=revision.model, fleet=fleet,
                                   busy=[*devices_in_use(deployment=deployment), *withheld])
    except PlanningError as exc:
        return Pricing(stored, False, None, 0.0, str(exc), asked)
    report = validate(applied, request)
    current = report.predicted.decode_tokens_per_s if report.predicted else stored
    if report.planned is None:
        return Pricing(current, report.predicted is not None, None, 0.0,
                       f"the planner finds no plan: {report.planner_error}", asked)
    check = validate(report.planned, request)
    if not check.ok:
        return Pricing(current, report.predicted is not None, None, 0.0,
                       "the planner's plan fails its own check: "
                       + "; ".join(p.message for p in check.problems), asked)
    return Pricing(current, report.predicted is not None, plan_to_dict(report.planned),
                   report.planned.predicted.decode_tokens_per_s, None, asked)
