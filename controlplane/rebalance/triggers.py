"""The rebalance policy's triggers: what, since a deployment's revision was applied, makes it worth
asking the planner again. Each returns an ``Occurrence`` (None: nothing to ask) and keeps in the
deployment's ``RebalanceState`` since when a condition has lasted, so that only a sustained one fires.

An occurrence has a ``key`` that names it (the fleet as it is, a drift or a throttle by the time it
began): the policy decides each occurrence once and remembers the keys it decided.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from contracts.hardware import FleetSpec
from controlplane.deployments.models import Deployment
from controlplane.inventory.models import Device
from controlplane.rebalance.models import RebalanceProposal, RebalanceState
from controlplane.rebalance.pricing import plannable_devices
from controlplane.telemetry.calibration import stage_observations

Trigger = RebalanceProposal.Trigger


@dataclass(frozen=True)
class Occurrence:
    trigger: str  # a RebalanceProposal.Trigger
    key: str
    reason: str
    detail: dict[str, Any] = field(default_factory=dict)


def baseline_take(*, state: RebalanceState, deployment: Deployment, fleet: FleetSpec, now: float) -> None:
    """Start watching the deployment's applied revision: the devices a re-plan could use now and the
    calibration factors its stages are priced with now (the plan was checked and priced on them
    when applied), nothing lasting, nothing decided."""
    state.revision = deployment.revision
    state.devices = plannable_devices(deployment=deployment, fleet=fleet)
    specs = {d.name: d for d in fleet.devices}
    state.factors = {
        f"{stage.device}@{bits}": specs[stage.device].calibration_at(bits)
        for replica in deployment.revision.placements for stage in replica
        if stage.device in specs for bits in {stage.bits, stage.last_bits}
    }
    state.drift_since, state.throttled_since = None, {}
    state.better_checked_at, state.handled, state.last_decision = now, [], ""
    state.demand = {"series": state.demand.get("series", [])}  # the load outlives a plan change


def fleet_changed(*, state: RebalanceState, deployment: Deployment, fleet: FleetSpec) -> Occurrence | None:
    """Devices joined or left the set a re-plan could use (a node registered, was lost, cordoned,
    drained, a device turned unhealthy, another deployment took or freed one). A device of the
    applied plan lost or drained is the controller's re-plan, not ours: no occurrence then."""
    now_devices = plannable_devices(deployment=deployment, fleet=fleet)
    joined = sorted(set(now_devices) - set(state.devices))
    left = sorted(set(state.devices) - set(now_devices))
    if not joined and not left:
        return None
    rows = {d.name: d for d in Device.objects.select_related("node").filter(
        node__name__in={name.split("/", 1)[0] for name in left})}
    used = _plan_devices(deployment)
    why = {name: _why_left(rows.get(name)) for name in left}
    if any(name in used and why[name] in ("lost", "draining", "gone") for name in left):
        return None
    parts = [f"{', '.join(joined)} joined"] if joined else []
    parts += [f"{name} left ({why[name]})" for name in left]
    digest = hashlib.sha1(",".join(now_devices).encode()).hexdigest()[:12]
    return Occurrence(Trigger.FLEET, f"fleet:{digest}", "the fleet changed: " + "; ".join(parts),
                      {"joined": joined, "left": left})


def _plan_devices(deployment: Deployment) -> set[str]:
    """The devices the applied plan puts a stage on."""
    return {stage.device for replica in deployment.revision.placements for stage in replica}


def _why_left(device: Device | None) -> str:
    if device is None:
        return "gone"
    if (reason := device.node.unavailable_reason()) is not None:
        return reason
    return "unhealthy" if device.health == Device.Health.UNHEALTHY else "taken by another deployment"


def throttled(*, state: RebalanceState, deployment: Deployment, throttle: dict[str, float],
              now: float) -> Occurrence | None:
    """A device of the applied plan has reported a slowdown in every sample for
    ``MOTLEY_REBALANCE_DRIFT_FOR_S``."""
    used = _plan_devices(deployment)
    since = {name: state.throttled_since.get(name, now) for name in sorted(used & set(throttle))}
    state.throttled_since = since
    lasting = [name for name, t in since.items() if now - t >= settings.MOTLEY_REBALANCE_DRIFT_FOR_S]
    if not lasting:
        return None
    name = min(lasting, key=since.get)
    return Occurrence(
        Trigger.THROTTLED, f"throttled:{name}@{since[name]:.0f}",
        f"{name} has been throttled to {throttle[name]:.0%} of its clock for {now - since[name]:.0f} s",
        {"device": name, "speed": throttle[name], "for_s": round(now - since[name], 1)},
    )


def drift(*, state: RebalanceState, deployment: Deployment, now: float) -> Occurrence | None:
    """A stage's measured decode step has differed from the applied plan's prediction by more than
    ``MOTLEY_REBALANCE_DRIFT`` for ``MOTLEY_REBALANCE_DRIFT_FOR_S``.

    Like is compared with like, as calibration does (``telemetry.calibration``): the measured step
    against the planner's first-principles figure for the same stage at the load it ran, times the
    calibration factor the plan was priced with (the baseline's), so a lightly loaded pipeline does
    not look fast. A stage on a throttled card is the throttle trigger's; no traffic, no evidence.
    """
    worst = None
    for o in stage_observations(deployment_id=deployment.pk, now=now):
        if o.throttled:
            continue
        predicted = o.raw_ms * state.factors.get(f"{o.device.name}@{o.bits}", o.factor)
        off = o.measured_ms / predicted - 1
        if abs(off) > settings.MOTLEY_REBALANCE_DRIFT and (worst is None or abs(off) > abs(worst[1])):
            worst = (o, off, predicted)
    if worst is None:
        state.drift_since = None
        return None
    state.drift_since = now if state.drift_since is None else state.drift_since
    lasted = now - state.drift_since
    if lasted < settings.MOTLEY_REBALANCE_DRIFT_FOR_S:
        return None
    o, off, predicted = worst
    return Occurrence(
        Trigger.DRIFT, f"drift@{state.drift_since:.0f}",
        f"stage {o.stage_key} on {o.device.name} measures {o.measured_ms:.3g} ms a decode step, the plan "
        f"predicts {predicted:.3g} ms ({off:+.0%}), for {lasted:.0f} s",
        {"stage": o.stage_key, "device": o.device.name, "measured_ms": round(o.measured_ms, 3),
         "predicted_ms": round(predicted, 3), "off": round(off, 3), "for_s": round(lasted, 1)},
    )
