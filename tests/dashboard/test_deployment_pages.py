"""Deployments page, topology overlay and plan editor over a running deployment."""

from __future__ import annotations

import json
import time

from django.db.models import F
from django.urls import reverse

from controlplane.deployments.events import event_record
from controlplane.deployments.models import Deployment, DeploymentEvent
from controlplane.gateway.serving import decision_log
from tests.dashboard.seed import REQUEST


def test_deployments_page_shows_status_revisions_and_predicted_figures(operator_client, running_deployment,
                                                                       django_assert_max_num_queries):
    with django_assert_max_num_queries(8):
        body = operator_client.get(reverse("dashboard:deployments")).content.decode()
    assert "chat" in body and "Ready" in body and "plan revision 1 applied (planner)" in body
    predicted = running_deployment.revision.plan["predicted"]["decode_tokens_per_s"]
    assert f"{predicted:.1f}" in body
    assert body.count('data-stage="d') == running_deployment.stages.count()


def test_deployments_page_says_whether_prefix_caching_is_on_and_has_a_cell_per_stage_for_it(
        operator_client, running_deployment):
    running_deployment.prefix_caching = False
    running_deployment.save(update_fields=["prefix_caching"])
    body = operator_client.get(reverse("dashboard:deployments")).content.decode()
    assert f'data-caching="{running_deployment.pk}" data-on="false"' in body and "Turn on</button>" in body
    stages = running_deployment.stages.count()
    assert body.count('data-live="prefix_hit_rate"') == body.count('data-live="prefix_blocks"') == stages


def test_deployments_page_has_the_speculation_switch_and_a_cell_per_stage_for_its_figures(
        operator_client, running_deployment):
    running_deployment.speculation, running_deployment.speculative_tokens = "lookup", 6
    running_deployment.save(update_fields=["speculation", "speculative_tokens"])
    body = operator_client.get(reverse("dashboard:deployments")).content.decode()
    assert f'data-speculation="{running_deployment.pk}"' in body
    assert '<option value="lookup" selected>lookup</option>' in body
    assert '<option value="off">off</option>' in body
    assert 'data-field="speculative_tokens"' in body and 'max="16" value="6"' in body
    stages = running_deployment.stages.count()
    cells = [body.count(f'data-live="{name}"') for name in ("spec_acceptance", "spec_tokens_per_step")]
    assert cells == [stages, stages]


def test_deployments_page_offers_the_models_that_can_draft_and_names_the_draft_deployment(
        operator_client, running_deployment):
    small = running_deployment.model
    small.pk, small.name, small.has_weights = None, "small", True  # another model, the same vocabulary
    small.save()
    draft = Deployment.objects.create(name="chat-draft", model=small)
    running_deployment.speculation, running_deployment.draft_deployment = "draft", draft
    running_deployment.save(update_fields=["speculation", "draft_deployment"])
    body = operator_client.get(reverse("dashboard:deployments")).content.decode()
    assert '<option value="draft" selected>draft</option>' in body
    assert f'<option value="{small.pk}" selected>small</option>' in body and "served by chat-draft" in body


def test_topology_lays_each_stage_over_its_gpu_and_marks_the_bottleneck(operator_client, running_deployment):
    overlay = operator_client.get(reverse("dashboard:topology-json")).json()["deployments"]
    plan = running_deployment.revision.plan
    assert [d["name"] for d in overlay] == ["chat"]
    pipeline = overlay[0]["pipelines"][0]
    assert (pipeline["pipeline"], pipeline["plan_replica"]) == (0, 0)
    assert [s["device"] for s in pipeline["stages"]] == [s["device"] for s in plan["replicas"][0]["stages"]]
    assert pipeline["bottleneck_device"] == plan["replicas"][0]["bottleneck"]["device"]
    # The deprecated names carry the same: the list as "replicas", a pipeline's index as "index".
    assert overlay[0]["replicas"] == overlay[0]["pipelines"] and pipeline["index"] == pipeline["pipeline"]


def test_a_pipeline_is_marked_with_the_bottleneck_of_the_plan_replica_it_serves(operator_client,
                                                                                running_deployment):
    """After handovers beside, pipelines keep their plan replica under new indexes: each is marked with
    the bottleneck of the replica it serves, not of the replica its index would name."""
    running_deployment.pipelines.update(index=F("index") + 10)
    running_deployment.stages.update(pipeline=F("pipeline") + 10)
    overlay = operator_client.get(reverse("dashboard:topology-json")).json()["deployments"]
    plan = running_deployment.revision.plan
    shown = [(p["pipeline"], p["plan_replica"], p["bottleneck_device"]) for p in overlay[0]["pipelines"]]
    assert shown == [(10 + r, r, plan_replica["bottleneck"]["device"])
                     for r, plan_replica in enumerate(plan["replicas"])]


def test_plan_editor_starts_from_the_applied_plan_and_its_request(operator_client, running_deployment):
    url = reverse("dashboard:plan-editor", args=[running_deployment.pk])
    page = operator_client.get(url).content.decode()
    editor = json.loads(page.split('id="editor-data" type="application/json">')[1].split("</script>")[0])
    assert editor["plan"] == running_deployment.revision.plan
    assert editor["request"] == REQUEST
    assert len(editor["devices"]) == 13  # lab-3node: 6 + 4 + 3 GPUs
    assert operator_client.get(reverse("dashboard:plan-editor", args=[999])).status_code == 404


def test_plan_editor_has_the_deployments_targets_in_a_form_of_their_own(operator_client, running_deployment):
    Deployment.objects.filter(pk=running_deployment.pk).update(
        ttft_target_ms=450, target_percentile=99, priority=3, min_replicas=2)
    url = reverse("dashboard:plan-editor", args=[running_deployment.pk])
    page = operator_client.get(url).content.decode()
    editor = json.loads(page.split('id="editor-data" type="application/json">')[1].split("</script>")[0])
    assert editor["targets"] == {
        "ttft_target_ms": 450, "tpot_target_ms": None, "target_percentile": 99, "target_window_s": 300,
        "priority": 3, "min_replicas": 2, "max_replicas": None, "emergency_max_kl": None}
    form = page[page.index('id="targets" data-deployment="%d"' % running_deployment.pk):]
    assert 'name="ttft_target_ms" type="number" min="1" value="450"' in form
    assert 'name="tpot_target_ms" type="number" min="1" value=""' in form  # empty: no target
    assert 'name="emergency_max_kl" type="number" min="0" step="any" value=""' in form  # never lowered
    assert '<option value="99" selected>p99</option>' in form
    assert 'name="priority" type="number" value="3"' in form
    assert 'min="10" max="3600" value="300"' in form  # the API's window bounds
    assert all(f'data-error-for="{name}"' in form for name in editor["targets"])


def test_the_events_shown_are_the_stored_ones_newest_first(operator_client, running_deployment,
                                                              django_assert_max_num_queries):
    event_record(kind="degraded", deployment=running_deployment, message="stages on lost node(s) node-b")
    event_record(kind="node_lost", node="node-b", message="node node-b is lost: no heartbeat for 15.2 s")
    with django_assert_max_num_queries(8):
        body = operator_client.get(reverse("dashboard:deployments")).content.decode()
    deployment_events = body.split(f'data-events="{running_deployment.pk}"')[1].split("</ul>")[0]
    lines = [line.split("</span> ")[1].split("</li>")[0] for line in deployment_events.split("<li")[1:]]
    assert lines == [
        "stages on lost node(s) node-b", "plan revision 1 ready", "plan revision 1 applied (planner)"]
    assert 'class="event-degraded"' in deployment_events
    fleet = body.split('data-events="fleet"')[1].split("</ul>")[0]
    assert "node node-b is lost" in fleet and "stages on lost" not in fleet
    # Nothing is derived from the current state any more: a deleted event is gone from the page.
    DeploymentEvent.objects.filter(kind="ready").delete()
    body = operator_client.get(reverse("dashboard:deployments")).content.decode()
    assert "plan revision 1 ready" not in body


def test_deployments_page_shows_the_targets_next_to_their_attainment_and_the_demand(
        operator_client, running_deployment, monkeypatch):
    running_deployment.ttft_target_ms, running_deployment.target_percentile = 300, 99
    running_deployment.save(update_fields=["ttft_target_ms", "target_percentile"])
    recorder = decision_log.RouterRecorder(started_at=time.time() - 600)  # serving for ten minutes
    monkeypatch.setattr("controlplane.gateway.demand.recorder", recorder)
    for i, ttft_s in enumerate([0.1, 0.1, 0.1, 0.5]):  # one of four over the target: 75 %, p99 500 ms
        recorder.record(decision_log.RouteRecord(f"r{i}", "chat", "round_robin", time.time() - 5,
                                                 f"d{running_deployment.pk}-r0", "running", prompt_tokens=30))
        recorder.first_token(f"r{i}", ttft_s)
        recorder.finished(f"r{i}", "completed", ttft_s + 0.2, 11)
    body = operator_client.get(reverse("dashboard:deployments")).content.decode()
    row = body[body.index('data-target="ttft"'):body.index('data-target="tpot"')]
    assert "300 ms at p99" in row and "500.0 ms" in row and "75 %" in row and 'class="num missed"' in row
    signals = body[body.index(f'data-signals="{running_deployment.pk}"'):]
    assert "0.01 requests/s" in signals and "0.4 prompt" in signals  # 4 requests, 120 tokens over 300 s
