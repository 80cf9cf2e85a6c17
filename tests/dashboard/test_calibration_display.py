"""Calibration on the dashboard: the deployments page's table per stage (predicted raw, calibrated,
measured at the load it runs) and the plan editor's table, from the same figures as the API."""

from __future__ import annotations

import re
import time

import pytest
from django.urls import reverse

from controlplane.inventory.models import DeviceCalibration
from controlplane.telemetry.services import telemetry_keep, telemetry_sample

A100 = "node-a/gpu0"


def report(deployment, *, decode_ms: float = 30.0) -> None:
    """One heartbeat per node of the deployment: its stages' statistics with decode figures."""
    by_node: dict = {}
    for stage in deployment.stages.select_related("node"):
        by_node.setdefault((stage.node_id, stage.node.name), []).append({
            "stage_key": stage.stage_key, "deployment_id": deployment.pk, "replica": stage.pipeline,
            "stage_index": stage.stage_index, "state": "ready",
            "stats": {"decode_steps": 10, "decode_ms": decode_ms, "decode_batch": 4,
                      "decode_kv_tokens": 1200}})
    for (node_id, node), stages in by_node.items():
        heartbeat = {"sent_at": 1.0, "devices": [], "stages": stages}
        telemetry_keep(telemetry_sample(node_id=node_id, node_name=node, heartbeat=heartbeat,
                                        received_at=time.time()))


def calibrate(device, ratio: float, samples: int = 8) -> None:
    DeviceCalibration.objects.create(device=device, bits=16, ratio=ratio, samples=samples,
                                     window=[[1000.0 + i, ratio, "d1-r0-s0"] for i in range(samples)])


def calibration_rows(body: str, deployment) -> dict[str, str]:
    table = body.split(f'data-calibration="{deployment.pk}"')[1].split("</table>")[0]
    rows = re.findall(r'data-calibration-stage="([^"]+)">(.*?)</tr>', table, re.S)
    return {key: re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", row)).strip() for key, row in rows}


def test_the_deployments_page_shows_raw_calibrated_and_measured(operator_client, running_deployment):
    wanted = {s.stage_key: s for s in running_deployment.stages.select_related("device__node")}
    # No decode traffic yet: one row per stage, nothing to compare.
    rows = calibration_rows(operator_client.get(reverse("dashboard:deployments")).content.decode(),
                            running_deployment)
    assert set(rows) == set(wanted) and all("no decode traffic" in row for row in rows.values())

    a100_stage = next(s for s in wanted.values() if s.device.name == A100)
    calibrate(a100_stage.device, 2.5)
    report(running_deployment)
    rows = calibration_rows(operator_client.get(reverse("dashboard:deployments")).content.decode(),
                            running_deployment)
    row = rows[a100_stage.stage_key]
    assert "4.0 seq × 300 tok" in row and "×2.50 (8 samples)" in row and "30.000 ms" in row
    raw, calibrated = (float(x) for x in re.findall(r"([\d.]+) ms", row)[:2])
    assert calibrated == pytest.approx(2.5 * raw, rel=1e-3)
    # Another A100 never measured takes its GPU model's factor, and says so.
    other = next(s for s in wanted.values()
                 if s.device.model_name == "A100-80GB-SXM" and s.device.name != A100)
    assert "×2.50 (its GPU model&#x27;s)" in rows[other.stage_key]


def test_the_plan_editor_has_the_stage_prediction_table(operator_client, running_deployment):
    url = reverse("dashboard:plan-editor", args=[running_deployment.pk])
    page = operator_client.get(url).content.decode()
    assert 'id="stage-predictions"' in page and "Calibrated ms" in page
