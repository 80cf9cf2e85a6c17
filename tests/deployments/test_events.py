"""Events: recorded once per transition of the controller, kept within retention."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.deployments.events import event_record
from controlplane.deployments.liveness import (
    HeartbeatSeen,
    node_health_check,
    node_heartbeat_record,
    node_heartbeats_flush,
)
from controlplane.deployments.models import Deployment, DeploymentEvent
from controlplane.deployments.node_actions import node_drain
from controlplane.deployments.reconcile import deployment_reconcile
from controlplane.deployments.revisions import plan_revision_create
from controlplane.deployments.services import deployment_apply, deployment_create, deployment_stop
from controlplane.deployments.stage_reports import stage_status_record
from controlplane.enrollment.services import agent_register, join_token_create
from controlplane.inventory.models import Node
from tests.deployments.conftest import REQUEST, T4, edited_plan, report

pytestmark = pytest.mark.django_db(transaction=True)  # sends happen on commit, as in production
Kind = DeploymentEvent.Kind


def test_event_record_keeps_names_and_detail(nodes, revision):
    deployment = deployment_create(name="tiny", revision=revision)
    event = event_record(kind=Kind.THROTTLED, message="n1/gpu0 throttled: power cap", device="n1/gpu0",
                         deployment=deployment, detail={"reasons": ["sw_power_cap"], "sm_clock_mhz": 900})
    stored = DeploymentEvent.objects.get(pk=event.pk)
    assert (stored.kind, stored.node, stored.device, stored.deployment_id) == (
        "throttled", "n1", "n1/gpu0", deployment.pk)
    assert stored.detail == {"reasons": ["sw_power_cap"], "sm_clock_mhz": 900}
    assert event_record(kind=Kind.NODE_LOST, message="n2 lost", node=nodes[2]).node == "n2"
    with pytest.raises(ValueError, match="unknown event kind"):
        event_record(kind="exploded", message="?")


def test_retention_keeps_the_newest_per_deployment_and_drops_the_old(nodes, revision, settings):
    settings.MOTLEY_EVENTS_KEEP = 3
    settings.MOTLEY_EVENTS_RETENTION_DAYS = 1
    deployment = deployment_create(name="tiny", revision=revision)
    fleet = event_record(kind=Kind.NODE_SUSPECT, message="fleet-wide, kept apart")
    DeploymentEvent.objects.filter(pk=fleet.pk).update(at=timezone.now() - timedelta(hours=2))
    old = event_record(kind=Kind.POLICY, message="too old", deployment=deployment)
    DeploymentEvent.objects.filter(pk=old.pk).update(at=timezone.now() - timedelta(days=2))
    for i in range(5):
        event_record(kind=Kind.CALIBRATED, message=f"calibration {i}", deployment=deployment)
    kept = DeploymentEvent.objects.filter(deployment=deployment)
    assert [e.message for e in kept] == ["calibration 4", "calibration 3", "calibration 2"]
    assert DeploymentEvent.objects.filter(pk=fleet.pk).exists()  # another scope's count
    assert not DeploymentEvent.objects.filter(pk=old.pk).exists()


def kinds(**filters) -> list[str]:
    """Recorded kinds, oldest first."""
    return [e.kind for e in DeploymentEvent.objects.filter(**filters).order_by("at", "id")]


def silent_for(node: Node, seconds: float) -> None:
    Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now() - timedelta(seconds=seconds))


def heard(stage) -> None:
    """A heartbeat of the stage's node reporting it ready."""
    ready = report(stage, "ready", 100 + stage.stage_index)
    node_heartbeat_record(node=stage.node, heartbeat={"stages": [ready]})


def deploy_ready(revision, **options) -> Deployment:
    deployment = deployment_create(name="tiny", revision=revision, **options)
    deployment_reconcile(deployment_id=deployment.pk)
    for stage in deployment.stages.all():
        heard(stage)
    return deployment_reconcile(deployment_id=deployment.pk)


@pytest.fixture(autouse=True)
def short_timeouts(settings):
    settings.MOTLEY_AGENT_HEARTBEAT_INTERVAL_S = 1.0
    settings.MOTLEY_NODE_SUSPECT_MISSED_HEARTBEATS = 3
    settings.MOTLEY_NODE_LOST_AFTER_S = 10.0


def test_each_transition_is_recorded_once_and_a_second_reconcile_records_nothing(nodes, revision, sent):
    deployment = deploy_ready(revision)
    assert kinds(deployment=deployment) == ["applied", "ready"]
    applied, ready = DeploymentEvent.objects.filter(deployment=deployment).order_by("at", "id")
    assert applied.message == "plan revision 1 applied (edited by an operator)"
    assert applied.detail == {"revision": 1, "source": "edited"}
    assert ready.message == "plan revision 1 ready" and ready.detail == {"from": "deploying"}
    for _ in range(2):
        deployment_reconcile(deployment_id=deployment.pk)
    for stage in deployment.stages.all():  # heartbeats that change nothing are no events either
        heard(stage)
    assert kinds(deployment=deployment) == ["applied", "ready"]

    first = deployment.stages.get(stage_index=0)
    stage_status_record(node=first.node, status=report(first, "starting", 100))
    for _ in range(3):
        deployment_reconcile(deployment_id=deployment.pk)
    stage_status_record(node=first.node, status=report(first, "ready", 100))
    for _ in range(2):
        deployment_reconcile(deployment_id=deployment.pk)
    assert kinds(deployment=deployment) == ["applied", "ready", "degraded", "ready"]
    degraded = DeploymentEvent.objects.get(deployment=deployment, kind="degraded")
    assert degraded.message == f"not ready: {first.stage_key}" and degraded.detail == {"from": "ready"}

    failing = report(first, "failed", 100, message="CUDA out of memory", exit_code=1)
    stage_status_record(node=first.node, status=failing)
    deployment_reconcile(deployment_id=deployment.pk)
    deployment_reconcile(deployment_id=deployment.pk)
    assert kinds(deployment=deployment)[-1] == "failed" and kinds(kind="failed") == ["failed"]
    assert "CUDA out of memory" in DeploymentEvent.objects.get(kind="failed").message

    deployment_stop(deployment=deployment)
    deployment_stop(deployment=deployment)  # asked twice: one request
    for stage in deployment.stages.all():
        stage_status_record(node=stage.node, status=report(stage, "exited", 100 + stage.stage_index))
    for _ in range(2):
        deployment_reconcile(deployment_id=deployment.pk)
    assert kinds(deployment=deployment)[-2:] == ["stopping", "stopped"]
    assert len(kinds(deployment=deployment)) == 7


def test_a_lost_node_and_its_replan_are_recorded_once_and_its_return_too(nodes, revision, sent):
    deployment = deploy_ready(revision)
    DeploymentEvent.objects.all().delete()
    silent_for(nodes[1], 4)
    node_health_check()
    node_health_check()
    silent_for(nodes[1], 11)
    node_health_check()
    node_health_check()
    assert kinds(node="n1") == ["node_suspect", "node_lost"]
    lost = DeploymentEvent.objects.get(kind="node_lost")
    assert lost.deployment is None and lost.message.startswith("node n1 is lost: no heartbeat for 1")
    for _ in range(3):
        deployment = deployment_reconcile(deployment_id=deployment.pk)
    assert kinds(deployment=deployment) == ["degraded", "replanned", "handover_started"]  # in place
    replanned = DeploymentEvent.objects.get(kind="replanned")
    assert replanned.detail == {"revision": 2, "source": "replan"}
    assert DeploymentEvent.objects.get(kind="degraded").message == "stages on lost node(s) n1"
    node_heartbeats_flush(seen=[HeartbeatSeen(node_id=nodes[1].pk, incarnation=nodes[1].incarnation,
                                              received_at=timezone.now(), stages=[])])
    node_heartbeat_record(node=nodes[1], heartbeat={"stages": []})
    assert kinds(node="n1") == ["node_suspect", "node_lost", "node_back"]
    assert DeploymentEvent.objects.get(kind="node_back").detail == {"was": "lost"}


def test_a_replan_that_does_not_fit_is_recorded_once_while_it_keeps_failing(nodes, revision, sent):
    deployment = deploy_ready(revision)
    for node in nodes:
        silent_for(node, 11)
    node_health_check()
    for _ in range(3):
        deployment = deployment_reconcile(deployment_id=deployment.pk)
    assert kinds(deployment=deployment) == ["applied", "ready", "degraded", "replan_failed"]
    failed = DeploymentEvent.objects.get(kind="replan_failed")
    assert "re-plan failed" in failed.message and failed.detail["lost_nodes"] == ["n0", "n1", "n2"]


def test_an_operator_apply_a_drain_and_a_registration_are_recorded(nodes, llm, revision, sent):
    deployment = deploy_ready(revision)
    plan = edited_plan(("n0/gpu0", 0, 3), ("n1/gpu0", 3, 4), ("n2/gpu0", 4, 6))
    moved = plan_revision_create(model=llm, plan=plan, request=REQUEST, source="edited")
    deployment_apply(deployment=deployment, revision=moved)
    node_drain(node=nodes[2])
    assert kinds(deployment=deployment) == ["applied", "ready", "applied", "handover_started", "drained",
                                            "handover_started"]  # beside, then beside again without n2
    draining = DeploymentEvent.objects.get(kind="node_draining")
    assert draining.node == "n2" and draining.detail == {
        "was": "schedulable", "intent": "draining", "deployments": ["tiny"]}
    agent_register(join_token=join_token_create(ttl=timedelta(hours=1)).secret, name="n0",
                   address="127.0.0.1", emulated=True, devices=[T4])
    registered = DeploymentEvent.objects.filter(kind="node_registered", node="n0").first()
    assert registered.detail["incarnation"] == 2 and registered.detail["was"] == "ready"
