"""The calibration fit: stage samples (as the agents' socket keeps them) against the planner's raw
prediction at the observed load, per device and precision; what counts, what is left out; the
planner's next plan uses the result."""

from __future__ import annotations

import time

import pytest

from contracts.fleet_file import load_fleet_file
from controlplane.deployments.models import DeploymentEvent
from controlplane.inventory.models import DeviceCalibration
from controlplane.inventory.selectors import fleet_spec_from_inventory
from controlplane.inventory.services import fleet_import
from controlplane.models_catalog.selectors import model_profile
from controlplane.models_catalog.services import model_register
from controlplane.planning import Placement, PlanRequest, Workload, plan
from controlplane.planning.cost_model import CostModel
from controlplane.plans.selectors import plan_request_from_inventory
from controlplane.telemetry.calibration import calibration_fit, stage_calibration, stage_observations
from controlplane.telemetry.services import telemetry_keep, telemetry_sample
from tests.dashboard.seed import LAB_FLEET, LLAMA3_8B, REQUEST, running_deployment_create

pytestmark = pytest.mark.django_db
SLOW = 2.5  # the measured/predicted ratio of the slow device; the others run at FAST
FAST = 1.2


@pytest.fixture
def deployment(settings):
    settings.MOTLEY_CALIBRATION_MIN_SAMPLES = 5
    settings.MOTLEY_CALIBRATION_MIN_DECODE_STEPS = 3
    settings.MOTLEY_TELEMETRY_STALE_AFTER_S = 3.0
    fleet_import(fleet=load_fleet_file(LAB_FLEET))
    return running_deployment_create(model=model_register(path=LLAMA3_8B))


def stages_of(deployment) -> list:
    return list(deployment.stages.filter(wanted=True).select_related("node", "device"))


def raw_ms(deployment, stage, batch: int, context: int) -> float:
    """The planner's own decode step for the stage at this load, priced here independently."""
    device = fleet_spec_from_inventory().device(stage.device.name)
    device = type(device)(**{**device.__dict__, "calibration": 1.0, "calibration_by_bits": ()})
    request = PlanRequest(fleet_spec_from_inventory(), model_profile(model=deployment.model),
                          Workload(batch=batch, context=context, prompt_tokens=context))
    start, end = stage.spec["layers"]
    placement = Placement(device.name, start, end, stage.spec["bits"])
    return CostModel(request).decode_s(device, placement, batch) * 1e3


def report(deployment, ratios: dict[str, float], *, at: float, batch: int = 4, context: int = 300,
           state: str = "ready", decode_steps: int = 12, node_of=None, throttle: tuple = ()) -> None:
    """One heartbeat per node carrying its stages' statistics, measured at ``ratios[device] x`` raw."""
    by_node: dict[str, list] = {}
    for stage in stages_of(deployment):
        measured = ratios[stage.device.name] * raw_ms(deployment, stage, batch, context)
        stats = {"step_ms": measured * 3, "compute_ms": measured * 3, "decode_steps": decode_steps,
                 "decode_ms": measured, "decode_batch": batch, "decode_kv_tokens": batch * context}
        node = (node_of or {}).get(stage.stage_key, stage.node.name)
        by_node.setdefault(node, []).append({
            "stage_key": stage.stage_key, "deployment_id": deployment.pk, "replica": stage.pipeline,
            "stage_index": stage.stage_index, "state": state, "stats": stats})
    for i, (node, stages) in enumerate(sorted(by_node.items())):
        devices = [{"index": k, "throttle_reasons": list(throttle)} for k in range(8)]
        heartbeat = {"sent_at": at, "devices": devices, "stages": stages}
        telemetry_keep(telemetry_sample(node_id=i + 1, node_name=node, heartbeat=heartbeat, received_at=at))


def devices_used(deployment) -> list[str]:
    return sorted({s.device.name for s in stages_of(deployment)})


def test_the_fit_converges_to_the_measured_ratio_and_the_next_plan_uses_it(deployment):
    used = devices_used(deployment)
    slow = "node-a/gpu0"  # an A100 that holds a whole replica
    assert slow in used
    ratios = {name: SLOW if name == slow else FAST for name in used}
    before = plan(plan_request_from_inventory(model=deployment.model, request=REQUEST))
    now = time.time()
    # Loads vary (batch, context): the ratio does not, since predictions are made at the same load.
    for i, (batch, context) in enumerate([(4, 300), (2, 900), (3, 50), (1, 2000), (4, 10)]):
        report(deployment, ratios, at=now - 5 + i, batch=batch, context=context)
        assert calibration_fit(now=now - 5 + i + 0.5) == len(stages_of(deployment))
        if i < 4:  # fewer than 5 samples: stored, not used yet
            assert {d.calibration for d in fleet_spec_from_inventory().devices} == {1.0}
    for row in DeviceCalibration.objects.select_related("device__node"):
        assert row.samples == 5 and row.bits == 16
        assert row.ratio == pytest.approx(ratios[row.device.name], rel=1e-6)
    fleet = {d.name: d for d in fleet_spec_from_inventory().devices}
    assert fleet[slow].calibration_at(16) == pytest.approx(SLOW, rel=1e-6)
    assert all(fleet[n].calibration_at(16) == pytest.approx(FAST, rel=1e-6) for n in used if n != slow)
    # Devices never measured take their peers' factor (same GPU model, else emulated ones): FAST here.
    unused = [d for d in fleet.values() if d.name not in used]
    assert unused and all(d.calibration == pytest.approx(FAST, rel=1e-6) for d in unused)
    # Each device announced once, the deployment's events say so.
    events = DeploymentEvent.objects.filter(kind=DeploymentEvent.Kind.CALIBRATED)
    assert sorted(e.device for e in events) == used and all(e.deployment_id == deployment.pk for e in events)
    # The planner's next plan prices every device by its factor: a one-card replica placed as before
    # serves 1 / factor of the tokens it did (tests/planning: a device measured slow gets fewer layers).
    after = plan(plan_request_from_inventory(model=deployment.model, request=REQUEST))
    def placement(replica) -> tuple:
        return tuple((s.device, s.start, s.end, s.bits) for s in replica.stages)

    placed = {placement(r): r for r in before.replicas}
    alike = [(placed[placement(r)], r) for r in after.replicas
             if len(r.stages) == 1 and placement(r) in placed]
    assert slow in {r.stages[0].device for _, r in alike}
    for old, new in alike:
        expected = old.predicted.decode_tokens_per_s / ratios.get(new.stages[0].device, FAST)
        assert new.predicted.decode_tokens_per_s == pytest.approx(expected, rel=1e-6)
    assert after.predicted.decode_tokens_per_s < before.predicted.decode_tokens_per_s / FAST * 1.001
    # Display: measured, raw and calibrated side by side; calibrated = measured once fitted.
    report(deployment, ratios, at=time.time())
    figures = stage_calibration(deployment_ids=[deployment.pk])
    assert len(figures) == len(stages_of(deployment))
    for stage in stages_of(deployment):
        shown = figures[stage.stage_key]
        assert shown["source"] == "measured" and shown["samples"] == 5
        assert shown["calibrated_ms"] == pytest.approx(shown["measured_ms"], rel=1e-3)
        assert shown["measured_ms"] == pytest.approx(shown["raw_ms"] * ratios[stage.device.name], rel=1e-3)


def test_a_stray_sample_moves_nothing_and_small_changes_are_not_announced(deployment):
    used = devices_used(deployment)
    now = time.time()
    for i in range(6):
        report(deployment, {name: 2.0 for name in used}, at=now - 10 + i)
        calibration_fit(now=now - 10 + i)
    report(deployment, {name: 40.0 for name in used}, at=now - 3)  # a hiccup (a GC pause, a swap)
    calibration_fit(now=now - 3)
    report(deployment, {name: 2.1 for name in used}, at=now - 2)
    calibration_fit(now=now - 2)
    assert {round(r.ratio, 6) for r in DeviceCalibration.objects.all()} == {2.0}
    assert DeploymentEvent.objects.filter(kind="calibrated").count() == len(used)


@pytest.mark.parametrize("case", ["stale", "starting", "few decode steps", "other node", "throttled"])
def test_samples_that_say_nothing_about_speed_are_left_out(deployment, case):
    used = devices_used(deployment)
    now = time.time()
    options = {
        "stale": {"at": now - 10},
        "starting": {"at": now, "state": "starting"},
        "few decode steps": {"at": now, "decode_steps": 2},
        "other node": {"at": now, "node_of": {s.stage_key: "elsewhere" for s in stages_of(deployment)}},
        "throttled": {"at": now, "throttle": ("sw_thermal",)},
    }[case]
    report(deployment, {name: 3.0 for name in used}, **options)
    assert calibration_fit(now=now) == 0
    assert not DeviceCalibration.objects.exists()
    if case == "throttled":  # still shown, flagged
        assert all(o.throttled for o in stage_observations(now=now))


def test_the_same_sample_read_twice_counts_once(deployment):
    used = devices_used(deployment)
    now = time.time()
    report(deployment, {name: 3.0 for name in used}, at=now)
    calibration_fit(now=now)
    calibration_fit(now=now + 0.5)
    assert {r.samples for r in DeviceCalibration.objects.all()} == {1}
