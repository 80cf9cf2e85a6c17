"""REST API: create/list/get/stop, apply a revision, drain a node; validated first, secrets never shown."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.deployments.models import Deployment, DeploymentStage, PlanRevision
from controlplane.deployments.services import deployment_create
from controlplane.inventory.models import Node
from tests.api.mixins import assert_error
from tests.deployments.conftest import REQUEST, THREE_STAGES, edited_plan

pytestmark = pytest.mark.django_db(transaction=True)  # sends happen on commit, as in production
URL = "/api/v1/deployments/"


def test_anonymous_callers_and_agents_are_refused(anonymous, nodes, revision, sent):
    deployment = deployment_create(name="tiny", revision=revision)
    for method, url in [("get", URL), ("post", URL), ("get", f"{URL}{deployment.pk}/"),
                        ("post", f"{URL}{deployment.pk}/stop/"),
                        *[("post", f"/api/v1/nodes/{nodes[0].pk}/{action}/")
                          for action in ("cordon", "uncordon", "drain", "undrain")]]:
        assert getattr(anonymous, method)(url, {}, format="json").status_code == 401, (method, url)
    assert Node.objects.get(pk=nodes[0].pk).intent == Node.Intent.SCHEDULABLE


def test_create_from_a_plan_then_list_and_get_without_the_pipeline_token(api, nodes, llm, sent):
    response = api.post(URL, {"name": "tiny", "model": llm.pk, "plan": THREE_STAGES, "request": REQUEST,
                              "source": "edited"}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "deploying" and body["revision_number"] == 1 and body["model_name"] == "tiny"
    assert [(s["stage_key"][-2:], s["node_name"], s["layers"]) for s in body["stages"]] == [
        ("s0", "n0", [0, 2]), ("s1", "n1", [2, 4]), ("s2", "n2", [4, 6])]
    token = Deployment.objects.get().pipelines.get().auth_token
    listed = api.get(URL)
    assert listed.json()["count"] == 1 and token not in listed.content.decode()
    assert token not in api.get(f"{URL}{body['id']}/").content.decode()
    revisions = api.get(f"{URL}{body['id']}/revisions/").json()
    assert [(r["number"], r["status"], r["source"]) for r in revisions] == [(1, "applied", "edited")]


def test_stages_and_pipelines_show_pipeline_and_plan_replica_and_their_deprecated_aliases(api, nodes,
                                                                                           revision, sent):
    """``pipeline`` (a stage's pipeline index) and ``plan_replica`` (the plan replica served) are shown,
    and so are their deprecated names ``replica`` and ``slot`` with the same values: after a handover
    beside, pipeline 3 serves plan replica 0."""
    deployment = deployment_create(name="tiny", revision=revision)
    deployment.pipelines.update(index=3)
    deployment.stages.update(pipeline=3)
    body = api.get(f"{URL}{deployment.pk}/").json()
    assert [(s["stage_key"][-5:], s["pipeline"], s["plan_replica"]) for s in body["stages"]] == [
        ("r3-s0", 3, 0), ("r3-s1", 3, 0), ("r3-s2", 3, 0)]
    assert all((s["replica"], s["slot"]) == (s["pipeline"], s["plan_replica"]) for s in body["stages"])
    (pipeline,) = body["pipelines"]
    assert (pipeline["pipeline_id"], pipeline["index"], pipeline["plan_replica"], pipeline["slot"]) == (
        f"d{deployment.pk}-r3", 3, 0, 0)
    assert api.get(URL).json()["results"][0]["stages"] == body["stages"]


def test_the_schema_marks_the_old_names_deprecated(api):
    components = api.get("/api/schema/", {"format": "json"}).json()["components"]["schemas"]
    stage, pipeline = components["Stage"]["properties"], components["Pipeline"]["properties"]
    for fields, old, new in [(stage, "replica", "pipeline"), (stage, "slot", "plan_replica"),
                             (pipeline, "slot", "plan_replica")]:
        assert fields[old]["deprecated"] is True and f"use `{new}`" in fields[old]["description"], old
        assert not fields[new].get("deprecated"), new


def test_create_from_a_draft_revision(api, nodes, revision, sent):
    response = api.post(URL, {"name": "tiny", "revision": revision.pk}, format="json")
    assert response.status_code == 201, response.content
    again = api.post(URL, {"name": "other", "revision": revision.pk}, format="json")
    assert_error(again, 400, "revision")


def test_a_plan_on_a_lost_device_is_refused_with_the_reason_and_leaves_nothing(api, nodes, llm, sent):
    Node.objects.filter(name="n1").update(status=Node.Status.LOST)
    response = api.post(URL, {"name": "tiny", "model": llm.pk, "plan": THREE_STAGES, "request": REQUEST},
                        format="json")
    assert_error(response, 400, "n1/gpu0", "node n1 is lost")
    assert not Deployment.objects.exists() and not llm.plan_revisions.exists() and sent.tasks == []


def test_apply_a_new_revision_and_stop(api, nodes, llm, revision, sent):
    deployment = deployment_create(name="tiny", revision=revision)
    moved = edited_plan(("n0/gpu0", 0, 3), ("n1/gpu0", 3, 4), ("n2/gpu0", 4, 6))
    body = {"plan": moved, "request": REQUEST, "source": "edited"}
    response = api.post(f"{URL}{deployment.pk}/apply/", body, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["revision_number"] == 2
    assert [s["layers"] for s in response.json()["stages"]] == [[0, 3], [3, 4], [4, 6]]
    short = {"plan": edited_plan(("n0/gpu0", 0, 5))}
    refused = api.post(f"{URL}{deployment.pk}/apply/", short, format="json")
    assert_error(refused, 400, "layer")
    assert Deployment.objects.get().revision.number == 2
    stopped = api.post(f"{URL}{deployment.pk}/stop/")
    assert stopped.status_code == 200 and stopped.json()["stop_requested"]
    assert_error(api.post(f"{URL}{deployment.pk}/apply/", {"plan": moved}, format="json"), 400, "stopped")


def test_drain_moves_the_stages_off_the_node(api, nodes, revision, sent):
    deployment = deployment_create(name="tiny", revision=revision)
    response = api.post(f"/api/v1/nodes/{nodes[1].pk}/drain/")
    assert response.status_code == 200, response.content
    body = response.json()
    assert [d["id"] for d in body["deployments"]] == [deployment.pk] and body["changed"]
    assert (body["node"]["name"], body["node"]["status"], body["node"]["intent"]) == (
        "n1", "ready", "draining")
    assert Node.objects.get(pk=nodes[1].pk).intent == Node.Intent.DRAINING
    deployment.refresh_from_db()
    assert deployment.revision.source == "drain"
    assert not deployment.stages.filter(wanted=True, node=nodes[1]).exists()


def test_drain_is_refused_when_a_deployment_cannot_fit_without_the_node(api, nodes, revision, sent):
    deployment_create(name="tiny", revision=revision)
    Node.objects.exclude(pk=nodes[1].pk).update(status=Node.Status.LOST)
    response = api.post(f"/api/v1/nodes/{nodes[1].pk}/drain/")
    assert_error(response, 400, "cannot drain n1", "tiny")
    assert Node.objects.get(pk=nodes[1].pk).intent == Node.Intent.SCHEDULABLE


def test_routing_strategy_is_set_on_create_and_changed_by_patch(api, nodes, llm, sent):
    response = api.post(URL, {"name": "tiny", "model": llm.pk, "plan": THREE_STAGES, "request": REQUEST,
                              "routing_strategy": "round_robin"}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["routing_strategy"] == "round_robin"
    detail = f"{URL}{response.json()['id']}/"
    patched = api.patch(detail, {"routing_strategy": "least_outstanding_tokens"}, format="json")
    assert patched.status_code == 200, patched.content
    assert patched.json()["routing_strategy"] == "least_outstanding_tokens"
    assert Deployment.objects.get().routing_strategy == "least_outstanding_tokens"
    blind = api.patch(detail, {"routing_strategy": "cost_aware_prefix_blind"}, format="json")
    assert blind.status_code == 200 and blind.json()["routing_strategy"] == "cost_aware_prefix_blind"
    assert_error(api.patch(detail, {"routing_strategy": "fastest"}, format="json"), 400, "routing_strategy")
    assert_error(api.patch(detail, {"name": "other"}, format="json"), 400, "cannot change name")
    assert Deployment.objects.get().name == "tiny"


def test_an_unknown_routing_strategy_is_refused_on_create(api, nodes, llm, sent):
    response = api.post(URL, {"name": "tiny", "model": llm.pk, "plan": THREE_STAGES, "request": REQUEST,
                              "routing_strategy": "fastest"}, format="json")
    assert_error(response, 400, "routing_strategy")
    assert not Deployment.objects.exists()


def test_deleting_a_node_a_deployment_still_uses_is_a_409_naming_the_deployment(api, nodes, revision, sent):
    deployment_create(name="tiny", revision=revision)
    response = api.delete(f"/api/v1/nodes/{nodes[1].pk}/")
    assert_error(response, 409, "node n1 is used by deployment tiny (stage r0-s1)")
    assert response.json()["error"]["code"] == "conflict"
    assert Node.objects.filter(pk=nodes[1].pk).exists()


def _deployments_with_stages(count: int, *, llm, nodes) -> None:
    for i in range(count):
        revision = PlanRevision.objects.create(model=llm, plan={}, request={}, source="planner",
                                               status="applied")
        deployment = Deployment.objects.create(name=f"d{i:02}", model=llm, revision=revision)
        for index, node in enumerate(nodes[:3]):
            DeploymentStage.objects.create(
                deployment=deployment, pipeline=0, stage_index=index, node=node, device=node.devices.first(),
                port=7000 + index,
                spec={"listen": f"tcp://{node.name}:{7000 + index}", "layers": [index, index + 1]},
            )


def test_the_list_queries_do_not_grow_with_the_deployments(api, nodes, llm):
    def list_queries() -> int:
        with CaptureQueriesContext(connection) as queries:
            response = api.get(URL, {"limit": 50})
        assert response.status_code == 200
        assert all(len(d["stages"]) == 3 and d["stages"][0]["node_name"] for d in response.json()["results"])
        return len(queries)

    _deployments_with_stages(2, llm=llm, nodes=nodes)
    few = list_queries()
    Deployment.objects.all().delete()
    _deployments_with_stages(20, llm=llm, nodes=nodes)
    assert Deployment.objects.count() == 20
    assert list_queries() == few <= 6


def test_a_preview_for_a_deployment_counts_its_own_devices_free_and_others_busy(api, nodes, llm, revision,
                                                                                sent):
    deployment_create(name="tiny", revision=revision)  # holds n0, n1, n2
    body = {"model": llm.pk, "batch": 1, "context": 64, "replicas": 1, "exclude_nodes": ["n3"]}
    fresh = api.post("/api/v1/plans/", body, format="json").json()
    used = {stage["device"] for stage in fresh["replicas"][0]["stages"]}
    assert fresh["deploy_blockers"] == [f"device {d} carries a stage of deployment tiny"
                                        for d in sorted(used)]
    rebalance = api.post("/api/v1/plans/", {**body, "deployment": Deployment.objects.get().pk}, format="json")
    assert rebalance.json()["deploy_blockers"] == []
