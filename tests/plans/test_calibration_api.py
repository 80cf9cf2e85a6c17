"""Calibration over HTTP: previews and what-if checks are priced with the stored calibration and show
the raw figure beside it; GET /api/v1/plans/calibration/ lists factors and observed stages."""

from __future__ import annotations

import time

import pytest

from contracts.fleet_file import load_fleet_file
from controlplane.inventory.models import Device, DeviceCalibration
from controlplane.inventory.services import fleet_import
from controlplane.models_catalog.services import model_register
from controlplane.telemetry.services import telemetry_keep, telemetry_sample
from tests.dashboard.seed import LAB_FLEET, LLAMA3_8B, REQUEST, running_deployment_create

A100 = "node-a/gpu0"


@pytest.fixture
def lab(db, settings):
    settings.MOTLEY_CALIBRATION_MIN_SAMPLES = 3
    fleet_import(fleet=load_fleet_file(LAB_FLEET))


@pytest.fixture
def llama3_8b(db):
    return model_register(path=LLAMA3_8B)


def calibrate(name: str, bits: int, ratio: float, samples: int = 3) -> None:
    node, index = name.split("/gpu")
    DeviceCalibration.objects.create(device=Device.objects.get(node__name=node, index=int(index)), bits=bits,
                                     ratio=ratio, samples=samples,
                                     window=[[1000.0 + i, ratio, "d1-r0-s0"] for i in range(samples)])


def stages(plan: dict) -> list[dict]:
    return [s for r in plan["replicas"] for s in r["stages"]]


def test_a_preview_is_priced_with_the_stored_calibration_and_shows_the_raw_figures(api, lab, llama3_8b):
    body = {"model": llama3_8b.id, **REQUEST}
    before = api.post("/api/v1/plans/", body, format="json").json()
    for stage in stages(before):
        assert stage["calibration"] == {"factor": 1.0, "bits": 16, "source": "none", "samples": 0}
        assert stage["predicted_raw"]["compute_ms"] == stage["predicted"]["compute_ms"]
    calibrate(A100, 16, 3.0)
    calibrate("node-a/gpu1", 16, 5.0, samples=2)  # too few samples: not used
    after = api.post("/api/v1/plans/", body, format="json").json()
    shown = {s["device"]: s for s in stages(after)}
    assert shown[A100]["calibration"] == {"factor": 3.0, "bits": 16, "source": "measured", "samples": 3}
    raw = shown[A100]["predicted_raw"]["compute_ms"]
    assert shown[A100]["predicted"]["compute_ms"] == pytest.approx(3.0 * raw)
    was = {s["device"]: s for s in stages(before)}
    assert shown[A100]["predicted_raw"]["compute_ms"] == pytest.approx(was[A100]["predicted"]["compute_ms"])
    # The other A100s were never measured: they take their GPU model's factor.
    assert shown["node-a/gpu1"]["calibration"]["source"] == "model"
    assert shown["node-a/gpu1"]["calibration"]["factor"] == 3.0
    assert after["predicted"]["decode_tokens_per_s"] < before["predicted"]["decode_tokens_per_s"]


def test_the_what_if_check_shows_both_plans_raw_and_calibrated(api, lab, llama3_8b):
    calibrate(A100, 16, 2.0)
    planned = api.post("/api/v1/plans/", {"model": llama3_8b.id, **REQUEST}, format="json").json()
    checked = api.post("/api/v1/plans/validate/", {"model": llama3_8b.id, **REQUEST, "plan": planned},
                       format="json").json()
    assert checked["valid"]
    for plan in (checked["predicted"], checked["reference"]):
        for stage in stages(plan):
            factor = stage["calibration"]["factor"]
            raw = stage["predicted_raw"]["compute_ms"]
            assert stage["predicted"]["compute_ms"] == pytest.approx(factor * raw)
        assert {s["device"]: s["calibration"]["factor"] for s in stages(plan)}[A100] == 2.0


def test_the_calibration_api_lists_factors_and_observed_stages(api, anonymous, lab, llama3_8b, settings):
    assert anonymous.get("/api/v1/plans/calibration/").status_code == 401
    assert api.get("/api/v1/plans/calibration/?deployment=x").status_code == 400
    calibrate(A100, 16, 2.0)
    deployment = running_deployment_create(model=llama3_8b)
    stage = deployment.stages.select_related("node").get(device__node__name="node-a", device__index=0)
    stats = {"decode_steps": 10, "decode_ms": 30.0, "decode_batch": 4, "decode_kv_tokens": 1200}
    heartbeat = {"sent_at": 1.0, "devices": [], "stages": [{
        "stage_key": stage.stage_key, "deployment_id": deployment.pk, "replica": stage.pipeline,
        "stage_index": stage.stage_index, "state": "ready", "stats": stats}]}
    telemetry_keep(telemetry_sample(node_id=stage.node_id, node_name="node-a", heartbeat=heartbeat,
                                    received_at=time.time()))
    body = api.get(f"/api/v1/plans/calibration/?deployment={deployment.pk}").json()
    devices = {d["device"]: d for d in body["devices"]}
    assert devices[A100] == {"device": A100, "model": "A100-80GB-SXM", "emulated": True, "factor": 2.0,
                             "by_bits": {"16": 2.0}, "samples": {"16": 3}, "source": "measured"}
    assert devices["node-b/gpu0"]["source"] == "kind" and devices["node-b/gpu0"]["factor"] == 2.0
    observed = body["stages"][stage.stage_key]
    assert observed["measured_ms"] == 30.0 and observed["factor"] == 2.0 and observed["context"] == 300
    assert observed["calibrated_ms"] == pytest.approx(2.0 * observed["raw_ms"], rel=1e-3)
    assert api.get(f"/api/v1/plans/calibration/?deployment={deployment.pk + 1}").json()["stages"] == {}
