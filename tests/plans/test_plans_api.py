"""The planner over HTTP: preview on the live inventory, refuse the infeasible, what-if an edit."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from contracts.fleet_file import load_fleet_file
from controlplane.deployments.models import PlanRevision
from controlplane.deployments.revisions import plan_revision_create
from controlplane.inventory.models import Node
from controlplane.inventory.services import fleet_import
from controlplane.models_catalog.services import model_register
from controlplane.planning import PlanningError, plan, plan_to_dict
from controlplane.plans.selectors import deployment_speculation, plan_request_from_inventory
from tests.api.mixins import assert_error
from tests.plans.conftest import EXAMPLES


def _layers_covered(replica: dict) -> list[int]:
    return [layer for stage in replica["stages"] for layer in range(*stage["layers"])]


def test_anonymous_callers_are_refused(anonymous, llama3_8b):
    assert anonymous.post("/api/v1/plans/", {"model": llama3_8b.id}, format="json").status_code == 401
    assert anonymous.post("/api/v1/plans/validate/", {}, format="json").status_code == 401


def test_preview_plans_every_layer_once_on_known_devices(api, lab, llama3_8b):
    response = api.post("/api/v1/plans/", {"model": llama3_8b.id, "batch": 4, "context": 2048}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    devices = {d["name"] for d in api.get("/api/v1/devices/?limit=1000").json()["results"]}
    for replica in body["replicas"]:
        assert _layers_covered(replica) == list(range(32))
        assert {stage["device"] for stage in replica["stages"]} <= devices
        assert all(stage["kv_tokens"] >= 4 * 2048 for stage in replica["stages"])
    assert body["predicted"]["decode_tokens_per_s"] > 0
    assert body["explanation"]


def test_preview_says_what_applying_it_would_be_refused_for(api, lab, llama3_8b, tmp_path):
    body = api.post("/api/v1/plans/", {"model": llama3_8b.id, "replicas": 1}, format="json").json()
    used = sorted({stage["device"] for stage in body["replicas"][0]["stages"]})
    blockers = body["deploy_blockers"]
    assert "registered for planning only (no weights)" in blockers[0]  # a bare config.json
    assert [b.split(":")[0] for b in blockers[1:]] == [f"device {name}" for name in used]
    assert all("no agent has registered node" in b for b in blockers[1:])
    Node.objects.update(incarnation=1)  # every node's agent has registered
    (tmp_path / "Llama-3-8B").mkdir()
    (tmp_path / "Llama-3-8B" / "config.json").write_text(Path(llama3_8b.path).read_text())
    (tmp_path / "Llama-3-8B" / "model.safetensors").write_bytes(b"")
    weights = model_register(path=tmp_path / "Llama-3-8B", name="llama3-weights")
    request = {"model": weights.id, "replicas": 1, "save": True}
    body = api.post("/api/v1/plans/", request, format="json").json()
    assert body["deploy_blockers"] == []
    assert "deploy_blockers" not in PlanRevision.objects.get(pk=body["revision"]).plan


def test_preview_routes_around_a_lost_node(api, lab, llama3_8b):
    lost = Node.objects.order_by("name").first()
    lost.status = Node.Status.LOST
    lost.save()
    body = api.post("/api/v1/plans/", {"model": llama3_8b.id}, format="json").json()
    used = {stage["device"] for replica in body["replicas"] for stage in replica["stages"]}
    assert used and not any(name.startswith(f"{lost.name}/") for name in used)


def test_baseline_is_never_better_than_the_planner(api, lab, llama3_8b):
    planned = api.post("/api/v1/plans/", {"model": llama3_8b.id, "replicas": 1}, format="json").json()
    even = api.post(
        "/api/v1/plans/", {"model": llama3_8b.id, "replicas": 1, "baseline": "even"}, format="json"
    )
    assert even.status_code == 200, even.content
    assert planned["predicted"]["decode_tokens_per_s"] >= even.json()["predicted"]["decode_tokens_per_s"]


def test_infeasible_request_names_the_shortfall(api, db):
    fleet_import(fleet=load_fleet_file(EXAMPLES / "fleets" / "workstation.yaml"))
    huge = model_register(path=EXAMPLES / "models" / "Llama-3-70B" / "config.json")
    response = api.post("/api/v1/plans/", {"model": huge.id, "bits": [16]}, format="json")
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "infeasible"
    assert "GiB" in response.json()["error"]["message"] or "bytes" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"batch": -1}, "batch"),
        ({"bits": [3]}, "bits"),
        ({"replicas": "many"}, "replicas"),
        ({"objective": "cheapest"}, "objective"),
        ({"model": 999999}, "model"),
        ({"pins": [{"device": "x/gpu0", "start": 5, "end": 2}]}, "pins"),
    ],
)
def test_bad_payloads_name_the_field(api, lab, llama3_8b, payload, field):
    response = api.post("/api/v1/plans/", {"model": llama3_8b.id, **payload}, format="json")
    assert_error(response, 400, field)


def test_validate_reports_every_problem_of_a_broken_edit(api, lab, llama3_8b):
    planned = api.post("/api/v1/plans/", {"model": llama3_8b.id, "replicas": 1}, format="json").json()
    edited = copy.deepcopy(planned)
    stages = edited["replicas"][0]["stages"]
    stages[0]["layers"][1] -= 1  # opens a gap: one layer belongs to no stage
    stages[-1]["device"] = "nowhere/gpu9"
    response = api.post("/api/v1/plans/validate/", {"model": llama3_8b.id, "plan": edited}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    codes = {problem["code"] for problem in body["problems"]}
    assert not body["valid"]
    assert codes == {"layer_missing", "not_contiguous", "unknown_device"}, body["problems"]
    assert body["reference"]["predicted"]["decode_tokens_per_s"] > 0


def _planned_two_stages(api, model) -> dict:
    """The planner's plan for one replica of Llama-3-8B on the lab fleet. It is deterministic: half the
    layers at 16 bits on an A100, the other half at 4 bits on the next one, which spends the whole
    quality budget (half the layers below 16 bits). The edits below move the boundary by one layer."""
    planned = api.post("/api/v1/plans/", {"model": model.id, "replicas": 1}, format="json").json()
    stages = planned["replicas"][0]["stages"]
    assert [(s["device"], s["layers"], s["bits"], s.get("low_bits")) for s in stages] == [
        ("node-a/gpu0", [0, 16], 16, None), ("node-a/gpu1", [16, 32], 4, None)
    ]
    return planned


def _move_boundary(planned: dict, by: int) -> dict:
    edited = copy.deepcopy(planned)
    first, second = edited["replicas"][0]["stages"]
    first["layers"][1] += by
    second["layers"][0] += by
    return edited


def test_validate_prices_a_valid_edit_next_to_the_planner(api, lab, llama3_8b):
    planned = _planned_two_stages(api, llama3_8b)
    edited = _move_boundary(planned, +1)  # one 4-bit layer becomes 16-bit: within the budget
    body = api.post("/api/v1/plans/validate/", {"model": llama3_8b.id, "plan": edited}, format="json").json()
    assert body["valid"] and body["problems"] == [], body["problems"]
    edited_rate = body["predicted"]["predicted"]["decode_tokens_per_s"]
    assert [s["layers"] for s in body["predicted"]["replicas"][0]["stages"]] == [[0, 17], [17, 32]]
    # Slower than the planner's split, and never faster than the reference (the planner's own plan for
    # the validate request, which may use more replicas).
    assert 0 < edited_rate < planned["predicted"]["decode_tokens_per_s"]
    assert edited_rate <= body["reference"]["predicted"]["decode_tokens_per_s"] * 1.0001


def test_validate_refuses_an_edit_over_the_quality_budget(api, lab, llama3_8b):
    edited = _move_boundary(_planned_two_stages(api, llama3_8b), -1)  # a 16-bit layer joins the 4-bit stage
    body = api.post("/api/v1/plans/validate/", {"model": llama3_8b.id, "plan": edited}, format="json").json()
    assert not body["valid"]
    assert [(p["code"], p["message"]) for p in body["problems"]] == [
        ("over_quality_budget", "replica 0: 17 layers below 16 bits, budget 16 (50% of 32)")
    ]


def test_validate_refuses_a_plan_without_replicas(api, lab, llama3_8b):
    response = api.post(
        "/api/v1/plans/validate/", {"model": llama3_8b.id, "plan": {"stages": []}}, format="json"
    )
    assert_error(response, 400, "plan")


def test_save_stores_a_draft_revision_with_the_request_as_sent(api, lab, llama3_8b):
    body = {"model": llama3_8b.id, "batch": 2, "context": 1024, "replicas": 1, "save": True}
    response = api.post("/api/v1/plans/", body, format="json")
    assert response.status_code == 201, response.content
    revision = PlanRevision.objects.get(pk=response.json()["revision"])
    assert revision.status == PlanRevision.Status.DRAFT and revision.model == llama3_8b
    assert revision.request["batch"] == 2 and revision.request["context"] == 1024
    # Stored: the planner's JSON; the response adds each stage's calibration and raw figures.
    shown = [{**r, "stages": [{k: v for k, v in s.items() if k not in ("calibration", "predicted_raw")}
                              for s in r["stages"]]} for r in response.json()["replicas"]]
    assert revision.plan["replicas"] == shown
    assert all("calibration" not in s for r in revision.plan["replicas"] for s in r["stages"])
    # The stored request asks the planner the same question again.
    again = api.post("/api/v1/plans/", {"model": llama3_8b.id, **revision.request}, format="json").json()
    assert again["predicted"] == response.json()["predicted"]


def test_stored_requests_with_unknown_fields_are_refused(lab, llama3_8b):
    with pytest.raises(PlanningError, match="unknown field.*workload"):
        plan_request_from_inventory(model=llama3_8b, request={"workload": {"batch": 2}})


def test_a_deployments_speculation_counts_with_its_measured_acceptance(api, lab, llama3_8b):
    import time

    from controlplane.deployments.models import Deployment
    from controlplane.telemetry.services import telemetry_keep, telemetry_sample

    deployment = Deployment.objects.create(name="spec", model=llama3_8b, speculation="lookup",
                                           speculative_tokens=3)
    request = {"model": llama3_8b.id, "batch": 1, "context": 2048, "replicas": 1}
    plain = api.post("/api/v1/plans/", request, format="json").json()
    prior = api.post("/api/v1/plans/", {**request, "deployment": deployment.pk}, format="json").json()
    assert not any(line.startswith("Speculation") for line in plain["explanation"])
    assert any(line.startswith("Speculation (lookup, up to 3 proposals per step, acceptance 0.50 assumed")
               for line in prior["explanation"])
    node = Node.objects.first()
    head = {"stage_key": f"d{deployment.pk}-r0-s0", "deployment_id": deployment.pk, "replica": 0,
            "stage_index": 0, "state": "ready", "pid": 1, "exit_code": None, "restarts": 0, "message": "",
            "stats": {"spec_drafts": 100, "spec_draft_tokens": 300, "spec_accepted_tokens": 240}}
    now = time.time()
    telemetry_keep(telemetry_sample(node_id=node.pk, node_name=node.name, received_at=now,
                                    heartbeat={"sent_at": now, "devices": [], "stages": [head]}))
    measured = api.post("/api/v1/plans/validate/", {**request, "deployment": deployment.pk,
                                                    "plan": plain}, format="json").json()
    assert any(line.startswith("Speculation (lookup, up to 3 proposals per step, acceptance 0.80 measured")
               for line in measured["predicted"]["explanation"])
    faster = measured["predicted"]["predicted"]["decode_tokens_per_s"]
    assert faster > plain["predicted"]["decode_tokens_per_s"]


def test_a_draft_models_proposing_is_priced_from_its_own_plan(lab, llama3_8b):
    from controlplane.deployments.models import Deployment

    priced = plan(plan_request_from_inventory(model=llama3_8b, request={"batch": 1, "context": 2048,
                                                                       "replicas": 1}))
    draft_revision = plan_revision_create(model=llama3_8b, plan=plan_to_dict(priced), request={},
                                          source="planner")
    draft = Deployment.objects.create(name="draft", model=llama3_8b, revision=draft_revision)
    target = Deployment.objects.create(name="spec", model=llama3_8b, speculation="draft",
                                       speculative_tokens=3, draft_deployment=draft)
    latency_s = draft_revision.priced.predicted.token_latency_ms / 1e3
    assert deployment_speculation(target).propose_s == pytest.approx(3 * latency_s)
    target.speculation = "lookup"
    assert deployment_speculation(target).propose_s == 0.0
