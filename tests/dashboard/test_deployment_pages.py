"""Deployments page, topology overlay and plan editor over a running deployment."""

from __future__ import annotations

import json

from django.urls import reverse

from tests.dashboard.seed import REQUEST


def test_deployments_page_shows_status_revisions_and_predicted_figures(operator_client, running_deployment,
                                                                       django_assert_max_num_queries):
    with django_assert_max_num_queries(8):
        body = operator_client.get(reverse("dashboard:deployments")).content.decode()
    assert "chat" in body and "Ready" in body and "revision 1 applied (planner)" in body
    predicted = running_deployment.revision.plan["predicted"]["decode_tokens_per_s"]
    assert f"{predicted:.1f}" in body
    assert body.count('data-stage="d') == running_deployment.stages.count()


def test_topology_lays_each_stage_over_its_gpu_and_marks_the_bottleneck(operator_client, running_deployment):
    overlay = operator_client.get(reverse("dashboard:topology-json")).json()["deployments"]
    plan = running_deployment.revision.plan
    assert [d["name"] for d in overlay] == ["chat"]
    replica = overlay[0]["replicas"][0]
    assert [s["device"] for s in replica["stages"]] == [s["device"] for s in plan["replicas"][0]["stages"]]
    assert replica["bottleneck_device"] == plan["replicas"][0]["bottleneck"]["device"]


def test_plan_editor_starts_from_the_applied_plan_and_its_request(operator_client, running_deployment):
    url = reverse("dashboard:plan-editor", args=[running_deployment.pk])
    page = operator_client.get(url).content.decode()
    editor = json.loads(page.split('id="editor-data" type="application/json">')[1].split("</script>")[0])
    assert editor["plan"] == running_deployment.revision.plan
    assert editor["request"] == REQUEST
    assert len(editor["devices"]) == 13  # lab-3node: 6 + 4 + 3 GPUs
    assert operator_client.get(reverse("dashboard:plan-editor", args=[999])).status_code == 404
