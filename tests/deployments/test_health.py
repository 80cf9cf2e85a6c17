"""Node health: SUSPECT after missed heartbeats, LOST after the timeout, then DEGRADED and re-planned."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.deployments.liveness import (
    HeartbeatSeen,
    node_agent_restarted,
    node_connection_closed,
    node_health_check,
    node_heartbeat_record,
    node_heartbeats_flush,
)
from controlplane.deployments.models import Deployment, DeploymentEvent, DeploymentStage, PlanRevision
from controlplane.deployments.reconcile import deployment_reconcile
from controlplane.deployments.services import deployment_create
from controlplane.deployments.stage_reports import stage_status_record
from controlplane.enrollment.services import agent_message_receive
from controlplane.inventory.models import Node
from tests.deployments.conftest import report

pytestmark = pytest.mark.django_db(transaction=True)  # sends happen on commit, as in production


@pytest.fixture(autouse=True)
def short_timeouts(settings):
    settings.MOTLEY_AGENT_HEARTBEAT_INTERVAL_S = 1.0
    settings.MOTLEY_NODE_SUSPECT_MISSED_HEARTBEATS = 3
    settings.MOTLEY_NODE_LOST_AFTER_S = 10.0


def silent_for(node: Node, seconds: float) -> None:
    Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now() - timedelta(seconds=seconds))


def status(node: Node) -> str:
    return Node.objects.get(pk=node.pk).status


def test_suspect_after_three_missed_heartbeats_lost_after_the_timeout_ready_again_on_a_heartbeat(nodes, sent):
    node = nodes[0]
    silent_for(node, 2.5)
    node_health_check()
    assert status(node) == Node.Status.READY
    silent_for(node, 3.5)
    assert [(n.name, s) for n, s in node_health_check()] == [("n0", Node.Status.SUSPECT)]
    node_heartbeat_record(node=node, heartbeat={"stages": []})
    assert status(node) == Node.Status.READY
    silent_for(node, 11)
    node_health_check()
    assert status(node) == Node.Status.LOST
    assert node_health_check() == []  # nothing more to say about a lost node
    node_heartbeat_record(node=node, heartbeat={"stages": []})
    assert status(node) == Node.Status.READY
    # Back from LOST: told to keep only what is wanted on it (nothing here).
    assert sent.take() == [(f"node.{node.pk}", "motley.agent.sync", {"wanted_stage_keys": []})]


def closed(node: Node, ago_s: float) -> None:
    Node.objects.filter(pk=node.pk).update(connection_closed_at=timezone.now() - timedelta(seconds=ago_s))


def test_a_node_whose_agent_connection_closed_is_lost_sooner_while_other_agents_are_heard(nodes, sent,
                                                                                          settings):
    """LOST after MOTLEY_NODE_LOST_AFTER_CLOSE_S (4 s) of silence since its agent's socket closed
    abnormally, not the 10 s heartbeat timeout; never while it heartbeats after the close (it
    reconnected), and not when no agent was heard since (the control plane's server went away and
    closed every socket: then only the timeout counts)."""
    settings.MOTLEY_NODE_LOST_AFTER_CLOSE_S = 4.0
    node, other = nodes[0], nodes[1]
    for n in nodes:
        silent_for(n, 0.5)
    silent_for(node, 5)
    closed(node, 3.5)  # 3.5 s since the close: SUSPECT, not yet LOST
    assert [(n.name, s) for n, s in node_health_check()] == [("n0", Node.Status.SUSPECT)]
    closed(node, 4.5)
    assert [(n.name, s) for n, s in node_health_check()] == [("n0", Node.Status.LOST)]
    lost = DeploymentEvent.objects.filter(kind=DeploymentEvent.Kind.NODE_LOST, node="n0").latest("at")
    # Tenths of a second pass between setting the times and the check on a loaded machine.
    expected = r"its agent's connection closed 4\.[5-9] s ago, no heartbeat for 5\.\d s"
    assert re.search(expected, lost.message), lost.message

    node_heartbeat_record(node=node, heartbeat={"stages": []})  # back (a reconnected agent)
    assert status(node) == Node.Status.READY
    silent_for(node, 5)
    Node.objects.filter(pk=node.pk).update(connection_closed_at=timezone.now() - timedelta(seconds=6))
    node_health_check()  # its last heartbeat is newer than the close: only the timeout counts
    assert status(node) == Node.Status.SUSPECT

    for n in nodes:  # every agent silent since the close: the control plane's server went away
        silent_for(n, 5)
    closed(node, 4.5)
    node_health_check()
    assert status(node) == Node.Status.SUSPECT and status(other) == Node.Status.SUSPECT

    settings.MOTLEY_NODE_LOST_AFTER_CLOSE_S = 0  # off
    silent_for(other, 0.5)
    node_health_check()
    assert status(node) == Node.Status.SUSPECT


def head_reports(deployment: Deployment, broken_stage: int | None, *, node: Node | None = None) -> None:
    """The head's agent (or ``node``'s) sends its stage event: its pipeline lost ``broken_stage``."""
    head = deployment.stages.get(stage_index=0, wanted=True)
    node = Node.objects.get(pk=(node or head.node).pk)
    message = {"type": "stage_event", "incarnation": node.incarnation,
               "stage": report(head, "ready", 100, broken_stage=broken_stage)}
    assert agent_message_receive(node_id=node.pk, incarnation=node.incarnation, message=message) is None


def socket_closed(node: Node) -> None:
    node_connection_closed(node_id=node.pk, incarnation=Node.objects.get(pk=node.pk).incarnation)


def test_a_closed_socket_and_a_broken_link_to_a_stage_on_the_node_say_its_agent_died_lost_at_once(
    nodes, revision, sent, settings
):
    """kill -9 of an agent: its socket closes abnormally and its stages die with it (PDEATHSIG), so the
    head reports the link to the node's stage broken. Both together: LOST at once, whichever comes
    first, and the deployment is reconciled (re-planned). Either alone waits for the 4 s rule or the
    heartbeat timeout (a network blip, a stage restarted)."""
    settings.MOTLEY_NODE_LOST_AFTER_CLOSE_S = 4.0
    deployment = deploy_ready(revision)  # stages on n0 (head), n1, n2
    n0, n1, n2, n3 = nodes
    sent.reconciles.clear()

    socket_closed(n1)  # a close alone: a dropped connection looks the same
    assert status(n1) == Node.Status.READY and node_health_check() == []
    head_reports(deployment, 1)  # then the head's link to stage 1 broke: the agent died
    assert status(n1) == Node.Status.LOST and sent.reconciles == [deployment.pk]
    lost = DeploymentEvent.objects.filter(kind=DeploymentEvent.Kind.NODE_LOST, node="n1").latest("at")
    assert re.search(r"closed 0\.\d s ago and a pipeline lost its link to a stage on it", lost.message), (
        lost.message)

    head_reports(deployment, 2)  # the break first (stage 1 lost its link to stage 2), then the close
    assert status(n2) == Node.Status.READY
    socket_closed(n2)
    assert status(n2) == Node.Status.LOST


def test_a_broken_link_or_a_closed_socket_alone_or_apart_loses_no_node(nodes, revision, sent, settings):
    settings.MOTLEY_NODE_LOST_AFTER_CLOSE_S = 4.0
    deployment = deploy_ready(revision)
    n0, n1, n2, n3 = nodes
    head_reports(deployment, 1)  # a stage restarted, its agent alive: nothing
    assert status(n1) == Node.Status.READY
    Node.objects.filter(pk=n1.pk).update(link_broken_at=timezone.now() - timedelta(seconds=2.5))
    socket_closed(n1)  # a blip 2.5 s after that break: another story
    assert status(n1) == Node.Status.READY

    node_heartbeat_record(node=n2, heartbeat={"stages": []})
    closed(n2, 0.5)
    node_heartbeat_record(node=n2, heartbeat={"stages": []})  # heard since the close: it reconnected
    head_reports(deployment, 2)
    assert status(n2) == Node.Status.READY

    socket_closed(n0)  # the head's own node: no other node's head speaks for its stage 0
    head_reports(deployment, 0, node=n1)  # n1 carries no head of this pipeline: not heard
    head_reports(deployment, 0)
    assert status(n0) == Node.Status.READY

    settings.MOTLEY_NODE_LOST_AFTER_CLOSE_S = 0  # off, this rule with it
    socket_closed(n2)
    head_reports(deployment, 2)
    assert status(n2) == Node.Status.READY
    assert not DeploymentEvent.objects.filter(kind=DeploymentEvent.Kind.NODE_LOST).exists()


def seen(node: Node, ago_s: float, stages=(), incarnation=None) -> HeartbeatSeen:
    return HeartbeatSeen(node_id=node.pk,
                         incarnation=node.incarnation if incarnation is None else incarnation,
                         received_at=timezone.now() - timedelta(seconds=ago_s), stages=list(stages))


def test_coalesced_heartbeats_store_the_time_received_and_keep_suspect_and_lost_on_time(nodes, sent):
    a, b = nodes[0], nodes[1]
    silent_for(a, 5)
    silent_for(b, 5)
    # The worst a live node looks between flushes: one interval since its heartbeat plus a flush.
    assert node_heartbeats_flush(seen=[seen(a, 1.5), seen(b, 1.5)]) == {}
    assert node_health_check() == []
    node_heartbeats_flush(seen=[seen(a, 3.2)])  # older than what is stored: not moved back
    assert Node.objects.get(pk=a.pk).last_heartbeat > timezone.now() - timedelta(seconds=2)
    # The received time is stored, not the flush's: a silent node turns SUSPECT 3 intervals after
    # its last heartbeat, however recently that was flushed.
    silent_for(a, 3.5)
    node_heartbeats_flush(seen=[seen(a, 3.2)])
    assert [(n.name, s) for n, s in node_health_check()] == [("n0", Node.Status.SUSPECT)]
    silent_for(a, 11)
    assert [(n.name, s) for n, s in node_health_check()] == [("n0", Node.Status.LOST)]
    sent.take()
    assert node_heartbeats_flush(seen=[seen(a, 0.2)]) == {}
    assert status(a) == Node.Status.READY
    assert sent.take() == [(f"node.{a.pk}", "motley.agent.sync", {"wanted_stage_keys": []})]


def test_a_coalesced_heartbeat_of_an_older_incarnation_or_a_deleted_node_is_refused(nodes):
    a = nodes[0]
    silent_for(a, 2)
    before = Node.objects.get(pk=a.pk).last_heartbeat
    refused = node_heartbeats_flush(seen=[seen(a, 0, incarnation=a.incarnation - 1), seen(a, 1),
                                          HeartbeatSeen(node_id=10**6, incarnation=1,
                                                        received_at=timezone.now(),
                                                        stages=[])])
    assert sorted(refused) == [0, 2]
    assert "stale incarnation" in refused[0] and "deleted" in refused[2]
    # Only the current incarnation's heartbeat counted (received 1 s ago, not the stale one's 0 s).
    assert before < timezone.now() - timedelta(seconds=1.5)
    stored = Node.objects.get(pk=a.pk).last_heartbeat
    assert timezone.now() - timedelta(seconds=1.5) < stored < timezone.now() - timedelta(seconds=0.5)


def test_a_coalesced_heartbeat_records_a_stage_whose_stored_state_differs(nodes, revision, sent):
    deployment = deploy_ready(revision)
    stage = deployment.stages.order_by("stage_index").first()
    ready = report(stage, "ready", 100 + stage.stage_index)
    sent.reconciles.clear()
    assert node_heartbeats_flush(seen=[seen(stage.node, 0, [ready])]) == {}
    assert sent.reconciles == []  # nothing new: nothing written, nothing reconciled
    # The controller re-sent a start; the agent, running that spec already, reports it unchanged.
    DeploymentStage.objects.filter(pk=stage.pk).update(state=DeploymentStage.State.PENDING)
    node_heartbeats_flush(seen=[seen(stage.node, 0, [ready])])
    assert DeploymentStage.objects.get(pk=stage.pk).state == DeploymentStage.State.READY
    assert sent.reconciles == [deployment.pk]
    # A report about the spec the stage ran before its last start changes nothing, whatever its pid
    # (a stage given a new spec in place keeps its process).
    DeploymentStage.objects.filter(pk=stage.pk).update(state=DeploymentStage.State.PENDING,
                                                       sent_spec={**stage.sent_spec, "kv_tokens": 64})
    node_heartbeats_flush(seen=[seen(stage.node, 0, [ready])])
    assert DeploymentStage.objects.get(pk=stage.pk).state == DeploymentStage.State.PENDING
    node_heartbeats_flush(seen=[seen(stage.node, 0, [report(DeploymentStage.objects.get(pk=stage.pk), "ready",
                                                                100 + stage.stage_index)])])
    assert DeploymentStage.objects.get(pk=stage.pk).state == DeploymentStage.State.READY


def test_a_coalesced_report_older_than_the_rows_observation_is_skipped(nodes, revision, sent):
    """The race of commit 5379e33: a heartbeat noted while the stage was starting, flushed after the
    prompt "ready" stage event, flipped the row back to starting."""
    deployment = deployment_create(name="tiny", revision=revision)
    deployment_reconcile(deployment_id=deployment.pk)
    stage = deployment.stages.get(stage_index=0)
    noted = seen(stage.node, 0.3, [report(stage, "starting", 100)])  # received before the event below
    stage_status_record(node=stage.node, status=report(stage, "ready", 100))
    sent.reconciles.clear()
    assert node_heartbeats_flush(seen=[noted]) == {}
    assert DeploymentStage.objects.get(pk=stage.pk).state == DeploymentStage.State.READY
    assert sent.reconciles == []
    # A report received after the row's observation is still news, and is dated when it was received.
    later = seen(stage.node, 0, [report(stage, "exited", 100, exit_code=1)])
    node_heartbeats_flush(seen=[later])
    row = DeploymentStage.objects.get(pk=stage.pk)
    assert row.state == DeploymentStage.State.EXITED and row.observed_at == later.received_at


HEARD_FROM = {
    "one heartbeat": lambda node: node_heartbeat_record(node=node, heartbeat={"stages": []}),
    "a coalesced flush": lambda node: node_heartbeats_flush(seen=[seen(node, 0)]),
}


@pytest.mark.parametrize("entry", sorted(HEARD_FROM))
@pytest.mark.parametrize(
    ("before", "after", "intent"),
    [(Node.Status.READY, Node.Status.READY, Node.Intent.SCHEDULABLE),
     (Node.Status.SUSPECT, Node.Status.READY, Node.Intent.CORDONED),
     (Node.Status.LOST, Node.Status.READY, Node.Intent.DRAINING)],
)
def test_a_heartbeat_applies_one_liveness_rule_through_either_entry_point(
    nodes, revision, sent, entry, before, after, intent
):
    deployment = deployment_create(name="tiny", revision=revision)  # stage 0 is wanted on n0
    node = nodes[0]
    Node.objects.filter(pk=node.pk).update(status=before, intent=intent)
    sent.take()
    sent.reconciles.clear()
    HEARD_FROM[entry](node)
    assert status(node) == after
    assert Node.objects.get(pk=node.pk).intent == intent  # the operator's word is not liveness's to change
    if before == Node.Status.LOST:  # its stages were planned away: it is told what is still wanted
        key = f"d{deployment.pk}-r0-s0"
        assert sent.take() == [(f"node.{node.pk}", "motley.agent.sync", {"wanted_stage_keys": [key]})]
        assert sent.reconciles == [deployment.pk]
    else:
        assert sent.take() == [] and sent.reconciles == []
    assert Node.objects.get(pk=node.pk).last_heartbeat > timezone.now() - timedelta(seconds=1)


def test_nodes_without_an_agent_are_not_watched(nodes, sent):
    declared = Node.objects.create(name="declared")
    node_health_check()
    assert status(declared) == Node.Status.READY


def deploy_ready(revision, **options) -> Deployment:
    deployment = deployment_create(name="tiny", revision=revision, **options)
    deployment_reconcile(deployment_id=deployment.pk)
    for stage in deployment.stages.all():
        ready = report(stage, "ready", 100 + stage.stage_index)
        node_heartbeat_record(node=stage.node, heartbeat={"stages": [ready]})
    return deployment_reconcile(deployment_id=deployment.pk)


def test_a_lost_node_degrades_its_deployment_which_is_replanned_on_the_healthy_devices(nodes, revision, sent):
    deployment = deploy_ready(revision)
    assert deployment.status == Deployment.Status.READY
    sent.take()
    silent_for(nodes[1], 11)
    node_health_check()
    assert sent.reconciles[-1] == deployment.pk
    deployment = deployment_reconcile(deployment_id=deployment.pk)
    replanned = deployment.revision
    assert replanned.source == PlanRevision.Source.REPLAN and replanned.number == 2
    assert deployment.status == Deployment.Status.DEPLOYING
    assert not deployment.stages.filter(wanted=True, node=nodes[1]).exists()
    assert "n1/gpu0" not in str(replanned.plan["replicas"])
    # The lost node's row is forgotten (it cannot be told to stop); the new stages start elsewhere.
    deployment = deployment_reconcile(deployment_id=deployment.pk)
    assert not deployment.stages.filter(node=nodes[1]).exists()
    started = [(q, kw["stage_key"]) for q, n, kw in sent.take() if n == "motley.agent.start_stage"]
    assert started and all(q != f"node.{nodes[1].pk}" for q, _ in started)


def test_without_the_replan_policy_the_deployment_stays_degraded(nodes, revision, sent):
    deployment = deploy_ready(revision, replan_on_failure=False)
    silent_for(nodes[1], 11)
    node_health_check()
    deployment = deployment_reconcile(deployment_id=deployment.pk)
    assert deployment.status == Deployment.Status.DEGRADED and "n1" in deployment.status_message
    assert deployment.revision.number == 1


def test_a_replan_that_cannot_fit_leaves_the_deployment_degraded_with_the_reason(nodes, revision, sent):
    deployment = deploy_ready(revision)
    for node in nodes:
        silent_for(node, 11)
    node_health_check()
    deployment = deployment_reconcile(deployment_id=deployment.pk)
    assert deployment.status == Deployment.Status.DEGRADED
    assert "re-plan failed" in deployment.status_message


def test_a_restarted_agent_is_told_what_is_wanted_and_gets_its_stages_again(nodes, revision, sent):
    deployment = deploy_ready(revision)
    sent.take()
    node_agent_restarted(node=nodes[0])
    key = f"d{deployment.pk}-r0-s0"
    assert sent.take() == [(f"node.{nodes[0].pk}", "motley.agent.sync", {"wanted_stage_keys": [key]})]
    deployment_reconcile(deployment_id=deployment.pk)
    assert [kw["stage_key"] for _, n, kw in sent.take() if n == "motley.agent.start_stage"] == [key]


def test_a_registration_is_a_sign_of_life_whatever_the_node_was(nodes, sent):
    node = nodes[0]
    silent_for(node, 11)
    node_health_check()
    assert status(node) == Node.Status.LOST
    node_agent_restarted(node=node)  # what agent_register calls for the new incarnation
    assert status(node) == Node.Status.READY and node.status == Node.Status.READY
    assert node_health_check() == []  # its last_heartbeat is the registration's


@pytest.mark.parametrize("skew_s", [-3600.0, 3600.0])
def test_an_agent_clock_an_hour_off_neither_keeps_a_silent_node_alive_nor_makes_a_live_one_suspect(
    nodes, sent, skew_s
):
    """Hosts differ: liveness reads the server's receive time, never the agent's ``sent_at``."""
    node = nodes[0]
    skewed = {"sent_at": timezone.now().timestamp() + skew_s, "stages": []}
    node_heartbeat_record(node=node, heartbeat=skewed)
    node_health_check()
    assert status(node) == Node.Status.READY  # an agent clock an hour behind is still heard now
    node_heartbeats_flush(seen=[HeartbeatSeen(node.pk, node.incarnation, timezone.now(), skewed["stages"])])
    assert status(node) == Node.Status.READY
    silent_for(node, 11)
    node_health_check()
    assert status(node) == Node.Status.LOST  # an hour ahead does not keep a silent node alive
