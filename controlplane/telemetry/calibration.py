"""Calibration: how far each device's measured decode steps are from the planner's predictions.

Every ``MOTLEY_CALIBRATION_INTERVAL_S`` (beat: ``contracts.tasks.CALIBRATE``) ``calibration_fit``
reads every stage's latest sample (``selectors.stage_samples``, the state all processes share) and
turns each one that is fresh (``Latest.stale``), from a READY stage on the node the controller put
it on, and holds at least ``MOTLEY_CALIBRATION_MIN_DECODE_STEPS`` decode steps, into one
observation of its device at its precision: the stage's measured decode step (``decode_ms``,
contracts §4: compute time of the second's pure decode steps) over the planner's **raw** prediction
for the same stage (its layers and precisions from its spec) on the same device at the **observed**
batch and context (``decode_batch`` sequences, ``decode_kv_tokens / decode_batch`` tokens of cache
each), without calibration: ``CostModel.decode_s`` of a one-device request. Prefill never enters
(its steps are not decode steps), and like is compared with like whatever the load. A device whose
latest metrics report a slowdown (``contracts.metrics.SLOWDOWN_REASONS``: thermal, hardware
slowdown, power brake) is not observed while it lasts: calibration is the card's steady speed, and
throttling is health (the router's and the device's). An emulated device is observed the same way
as a real one: its stages are paced to ``time_scale x`` their modeled time (and its fleet file's
``speed_factor``), which the ratio learns.

The observations go to ``inventory.calibration.device_calibration_observe`` per (device, the
precision of the stage's last layer: ``cost_model.slowdown`` uses the same), which keeps a window
and its median; a ratio that counts for the first time or moves by more than
``MOTLEY_CALIBRATION_EVENT_CHANGE`` is recorded as a ``calibrated`` event. The planner reads it back
through ``fleet_spec_from_inventory`` for previews, validation, Rebalance and re-plans.

``stage_calibration`` gives the same figures per stage for display: measured, predicted raw and
predicted calibrated (raw x the factor the planner uses now), side by side.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import defaultdict
from collections.abc import Iterable

from django.conf import settings
from django.db import transaction

from contracts.hardware import DeviceSpec, FleetSpec
from contracts.metrics import SLOWDOWN_REASONS
from contracts.model_profile import ModelProfile
from contracts.precision import Precision
from controlplane.deployments.events import event_record
from controlplane.deployments.models import DeploymentEvent, DeploymentStage
from controlplane.inventory.calibration import Observation, calibrations, device_calibration_observe
from controlplane.inventory.selectors import fleet_spec_from_inventory
from controlplane.models_catalog.selectors import model_profile
from controlplane.planning import Placement, PlanRequest, Workload
from controlplane.planning.cost_model import CostModel
from controlplane.telemetry.selectors import Latest, device_samples, stage_samples

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StageObservation:
    """One stage's latest sample against the planner's prediction for it, at the observed load."""

    stage_key: str
    deployment_id: int
    stage: DeploymentStage
    device: DeviceSpec  # as the planner sees it now, calibration included
    bits: int  # the precision of the stage's last layer: the calibration it takes
    measured_ms: float  # mean decode step (compute, pacing included) over the sample's second
    raw_ms: float  # the planner's prediction without calibration, at the same batch and context
    batch: float  # sequences per decode step
    context: int  # tokens of cache per sequence
    decode_steps: int
    received_at: float
    throttled: bool  # the device reported a slowdown in its latest metrics: not an observation

    @property
    def ratio(self) -> float:
        return self.measured_ms / self.raw_ms

    @property
    def factor(self) -> float:
        """What the planner multiplies this stage's raw prediction by now."""
        return self.device.calibration_at(self.bits)

    @property
    def calibrated_ms(self) -> float:
        return self.raw_ms * self.factor


def predicted_decode_s(profile: ModelProfile, device: DeviceSpec, placement: Placement, *, batch: float,
                       context: int) -> float:
    """The planner's raw decode step of ``placement`` on ``device`` for ``batch`` sequences holding
    ``context`` tokens of cache each: no calibration, the device's throttling as it is."""
    raw = dataclasses.replace(device, calibration=1.0, calibration_by_bits=())
    workload = Workload(batch=max(1, round(batch)), context=max(1, context), prompt_tokens=max(1, context))
    request = PlanRequest(fleet=FleetSpec(name="calibration", nodes=()), model=profile, workload=workload)
    return CostModel(request).decode_s(raw, placement, batch)


def stage_observations(*, deployment_id: int | None = None,
                       now: float | None = None) -> list[StageObservation]:
    """Every stage (of one deployment, if given) whose latest sample can be compared with a prediction."""
    now = time.time() if now is None else now
    readings = {key: r for key, r in stage_samples(deployment_id=deployment_id).items() if _usable(r, now)}
    if not readings:
        return []
    rows = DeploymentStage.objects.filter(
        wanted=True, deployment_id__in={r.value.get("deployment_id") for r in readings.values()},
        device__isnull=False,
    ).select_related("node", "device", "deployment__model")
    fleet: dict[str, DeviceSpec] | None = None
    profiles: dict[int, ModelProfile] = {}
    throttled = {name for name, metrics in device_samples().items()
                 if set(metrics.value.get("throttle_reasons") or ()) & set(SLOWDOWN_REASONS)}
    found = []
    for row in rows:
        reading = readings.get(row.stage_key)
        if reading is None or reading.node != row.node.name or not row.spec.get("layers"):
            continue
        if fleet is None:
            fleet = {d.name: d for d in fleet_spec_from_inventory(name="calibration").devices}
        device = fleet.get(row.device.name)
        if device is None:
            continue
        if row.deployment.model_id not in profiles:
            profiles[row.deployment.model_id] = model_profile(model=row.deployment.model)
        found.append(_observation(row, reading, device, profiles[row.deployment.model_id],
                                  throttled=device.name in throttled))
    return [o for o in found if o is not None]


def _usable(reading: Latest, now: float) -> bool:
    stats = reading.value.get("stats") or {}
    try:
        return (reading.value.get("state") == "ready" and not reading.stale(now=now)
                and int(stats.get("decode_steps") or 0) >= settings.MOTLEY_CALIBRATION_MIN_DECODE_STEPS
                and float(stats.get("decode_ms") or 0) > 0 and float(stats.get("decode_batch") or 0) > 0)
    except (TypeError, ValueError):
        return False


def _observation(row: DeploymentStage, reading: Latest, device: DeviceSpec, profile: ModelProfile, *,
                 throttled: bool) -> StageObservation | None:
    stats, spec = reading.value["stats"], row.spec
    start, end = spec["layers"]
    placement = Placement.at(device.name, start, end, Precision.of(spec))
    batch = float(stats["decode_batch"])
    context = round(float(stats.get("decode_kv_tokens") or 0) / batch)
    try:
        raw_s = predicted_decode_s(profile, device, placement, batch=batch, context=context)
    except (ValueError, KeyError, IndexError) as exc:  # a spec the profile does not fit: no verdict
        logger.warning("calibration: cannot price %s: %s", row.stage_key, exc)
        return None
    if not raw_s > 0:
        return None
    return StageObservation(
        stage_key=row.stage_key, deployment_id=row.deployment_id, stage=row, device=device,
        bits=placement.last_bits, measured_ms=float(stats["decode_ms"]), raw_ms=raw_s * 1e3, batch=batch,
        context=context, decode_steps=int(stats["decode_steps"]), received_at=reading.received_at,
        throttled=throttled,
    )


def calibration_fit(*, now: float | None = None) -> int:
    """One pass: every usable stage sample becomes an observation of its device at its precision.
    Returns the number of observations; records an event for each ratio that moved."""
    now = time.time() if now is None else now
    groups: dict[tuple, list[StageObservation]] = defaultdict(list)
    for observation in stage_observations(now=now):
        if observation.throttled:
            continue
        groups[(observation.stage.device_id, observation.bits)].append(observation)
    if not groups:  # no transaction at all (SQLite's IMMEDIATE mode would take the write lock)
        return 0
    with transaction.atomic():  # one write transaction per pass, whatever the number of devices
        for (_, bits), observed in groups.items():
            row = observed[0].stage
            result = device_calibration_observe(
                device=row.device, bits=bits, now=now,
                observations=[Observation(o.received_at, o.ratio, o.stage_key) for o in observed])
            if result.announce:
                _announce(observed[0], result.row.ratio, result.row.samples, result.previous)
    return sum(len(o) for o in groups.values())


def _announce(observation: StageObservation, ratio: float, samples: int, previous: float | None) -> None:
    name, bits = observation.device.name, observation.bits
    since = f", was x{previous:.3g}" if previous is not None else ""
    event_record(
        kind=DeploymentEvent.Kind.CALIBRATED, device=name, deployment=observation.stage.deployment,
        message=f"{name} at {bits} bits: measured decode steps take x{ratio:.3g} the predicted time "
                f"(median of {samples} samples{since})",
        detail={"device": name, "bits": bits, "ratio": ratio, "previous": previous, "samples": samples,
                "emulated": observation.device.emulated},
    )


def stage_calibration(*, deployment_ids: Iterable[int] | None = None) -> dict[str, dict]:
    """Per stage key: measured and predicted (raw, calibrated) decode step at the observed load, the
    factor the planner uses for its device and precision, and where that factor comes from."""
    wanted = None if deployment_ids is None else set(deployment_ids)
    observations = [o for o in stage_observations() if wanted is None or o.deployment_id in wanted]
    if not observations:
        return {}
    stored = calibrations()
    figures = {}
    for o in observations:
        factors = stored.for_device(o.stage.device)
        figures[o.stage_key] = {
            "device": o.device.name, "bits": o.bits, "batch": o.batch, "context": o.context,
            "measured_ms": round(o.measured_ms, 4), "raw_ms": round(o.raw_ms, 4),
            "calibrated_ms": round(o.calibrated_ms, 4), "factor": round(o.factor, 4),
            "samples": factors.samples.get(o.bits, 0), "source": factors.source, "throttled": o.throttled,
            "age_s": round(max(0.0, time.time() - o.received_at), 1),
        }
    return figures
