"""Handover, make before break: a changed replica's new pipeline beside the old one when it fits, else a
reload in place; the switch, the head drained first, the rest after, events once each."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agents.memory_budget import spec_footprint
from contracts.model_profile import ModelProfile
from contracts.stage_spec import StageSpec
from controlplane.deployments.liveness import node_agent_restarted
from controlplane.deployments.models import Deployment, DeploymentEvent, DeploymentPipeline
from controlplane.deployments.node_actions import node_drain
from controlplane.deployments.reconcile import deployment_reconcile
from controlplane.deployments.revisions import plan_revision_create
from controlplane.deployments.room import spec_holdings
from controlplane.deployments.selectors import deployment_endpoints
from controlplane.deployments.services import deployment_apply, deployment_create
from controlplane.deployments.stage_reports import stage_status_record
from controlplane.inventory.models import Node
from tests.deployments.conftest import REQUEST, THREE_STAGES, edited_plan, report

pytestmark = pytest.mark.django_db(transaction=True)  # sends happen on commit, as in production

START, STOP = "motley.agent.start_stage", "motley.agent.stop_stage"
MOVED = edited_plan(("n0/gpu0", 0, 3), ("n1/gpu0", 3, 4), ("n2/gpu0", 4, 6))


def report_all(deployment, index: int, state: str, pid_base: int, **extra) -> None:
    """Every stage row of pipeline ``index`` (wanted or being stopped) reports ``state``."""
    for stage in deployment.stages.filter(pipeline=index):
        status = report(stage, state, pid_base + stage.stage_index, **extra)
        stage_status_record(node=stage.node, status=status)


def sent_keys(sent, name: str) -> list[str]:
    return sorted(kw["stage_key"] for _, task, kw in sent.take() if task == name)


def phases(deployment) -> dict[int, tuple[int, str]]:
    return {p.index: (p.plan_replica, p.phase)
            for p in DeploymentPipeline.objects.filter(deployment=deployment)}


def heads(deployment) -> list[tuple[str, int, bool, bool]]:
    endpoints = deployment_endpoints(deployment=deployment)
    return [(e.pipeline_id[-2:], e.plan_replica, e.ready, e.serving) for e in endpoints]


def kinds(deployment) -> list[str]:
    return [e.kind for e in DeploymentEvent.objects.filter(deployment=deployment, kind__startswith="handover")
            .order_by("id")]


def serving_ready(revision, sent) -> Deployment:
    deployment = deployment_create(name="tiny", revision=revision)
    deployment_reconcile(deployment_id=deployment.pk)
    report_all(deployment, 0, "ready", 100)
    deployment = deployment_reconcile(deployment_id=deployment.pk)
    assert deployment.status == Deployment.Status.READY and phases(deployment) == {0: (0, "serving")}
    assert kinds(deployment) == []  # a first deployment is no handover
    sent.take()
    sent.later.clear()
    return deployment


def apply(deployment, llm, plan) -> Deployment:
    revision = plan_revision_create(model=llm, plan=plan, request=REQUEST, source="edited")
    deployment_apply(deployment=deployment, revision=revision)
    return deployment_reconcile(deployment_id=deployment.pk)


def test_a_boundary_move_with_room_starts_beside_switches_then_stops_the_head_first(
    nodes, llm, revision, sent, settings
):
    deployment = serving_ready(revision, sent)
    d = deployment.pk
    deployment = apply(deployment, llm, MOVED)
    # Beside: a whole new pipeline r1 for replica 0 on fresh ports; r0 untouched and still serving. Its
    # stages load in the background (nobody waits for them: agents/load_priority.py).
    starts = [kw for _, name, kw in sent.take() if name == START]
    assert sorted(kw["stage_key"] for kw in starts) == [f"d{d}-r1-s{i}" for i in range(3)]
    assert {kw["background"] for kw in starts} == {True}
    assert phases(deployment) == {0: (0, "serving"), 1: (0, "incoming")}
    assert heads(deployment) == [("r0", 0, True, True), ("r1", 0, False, False)]
    assert deployment.status == Deployment.Status.READY
    assert deployment.status_message == f"handing over replica r0: d{d}-r1 starting"
    # Every stage knows its plan replica: where its predictions are (dashboard, /metrics).
    assert set(deployment.stages.values_list("pipeline", "plan_replica")) == {(0, 0), (1, 0)}
    old_ports = set(deployment.stages.filter(pipeline=0).values_list("port", flat=True))
    assert not old_ports & set(deployment.stages.filter(pipeline=1).values_list("port", flat=True))
    (started,) = DeploymentEvent.objects.filter(deployment=deployment, kind="handover_started")
    assert started.detail["mode"] == "beside" and started.detail["changed"] == [0, 1]
    assert started.detail["from"] == f"d{d}-r0" and started.detail["to"] == f"d{d}-r1"

    # The new pipeline ready: the switch. The old one keeps running through the switch window.
    report_all(deployment, 1, "ready", 200)
    deployment = deployment_reconcile(deployment_id=d)
    assert phases(deployment) == {0: (0, "outgoing"), 1: (0, "serving")}
    assert heads(deployment) == [("r0", 0, True, False), ("r1", 0, True, True)]
    assert sent.take() == [] and sent.later == [(d, settings.MOTLEY_HANDOVER_SWITCH_S)]
    assert deployment.status == Deployment.Status.READY
    deployment_reconcile(deployment_id=d)
    assert sent.take() == []  # the window is not over

    # Window over: the head alone is stopped (it finishes its in-flight requests), the rest later.
    DeploymentPipeline.objects.filter(deployment=deployment, index=0).update(
        switched_at=deployment.pipelines.get(index=0).switched_at - timedelta(seconds=60))
    sent.later.clear()
    deployment_reconcile(deployment_id=d)
    assert sent_keys(sent, STOP) == [f"d{d}-r0-s0"]
    assert sent.later == [(d, settings.MOTLEY_HANDOVER_DRAIN_S)]
    assert heads(deployment) == [("r1", 0, True, True)]  # a stopped head is no endpoint
    deployment_reconcile(deployment_id=d)
    assert sent.take() == []

    # The head exited: now the relays behind it.
    head = deployment.stages.get(pipeline=0, stage_index=0)
    stage_status_record(node=head.node, status=report(head, "exited", 100, exit_code=0))
    deployment_reconcile(deployment_id=d)
    assert sent_keys(sent, STOP) == [f"d{d}-r0-s1", f"d{d}-r0-s2"]
    report_all(deployment, 0, "exited", 100, exit_code=0)
    deployment = deployment_reconcile(deployment_id=d)
    assert phases(deployment) == {1: (0, "serving")} and not deployment.stages.filter(pipeline=0).exists()
    assert deployment.status == Deployment.Status.READY
    assert deployment.status_message == "plan revision 2 ready"
    assert kinds(deployment) == ["handover_started", "handover_switched", "handover_drained", "handover_done"]
    switched, drained, done = (DeploymentEvent.objects.get(deployment=deployment, kind=k) for k in
                               ("handover_switched", "handover_drained", "handover_done"))
    assert switched.detail["pause_s"] == 0 and switched.detail["to"] == f"d{d}-r1"
    assert drained.detail["head_exited"] is True and done.detail["mode"] == "beside"
    deployment_reconcile(deployment_id=d)
    assert sent.take() == [] and len(kinds(deployment)) == 4  # nothing more, nothing recorded again


def test_the_drain_bound_stops_the_rest_when_the_head_does_not_exit(nodes, llm, revision, sent):
    deployment = serving_ready(revision, sent)
    apply(deployment, llm, MOVED)
    report_all(deployment, 1, "ready", 200)
    deployment_reconcile(deployment_id=deployment.pk)
    long_ago = deployment.pipelines.get(index=0).switched_at - timedelta(seconds=60)
    DeploymentPipeline.objects.filter(deployment=deployment, index=0).update(switched_at=long_ago)
    deployment_reconcile(deployment_id=deployment.pk)
    sent.take()
    DeploymentPipeline.objects.filter(deployment=deployment, index=0).update(head_stopped_at=long_ago)
    deployment_reconcile(deployment_id=deployment.pk)
    assert sent_keys(sent, STOP) == [f"d{deployment.pk}-r0-s1", f"d{deployment.pk}-r0-s2"]
    drained = DeploymentEvent.objects.get(deployment=deployment, kind="handover_drained")
    assert drained.detail["head_exited"] is False and drained.detail["drain_s"] >= 60


def test_without_room_the_changed_stages_reload_in_place(nodes, real_gpus, llm, revision, sent):
    deployment = serving_ready(revision, sent)
    d = deployment.pk
    deployment = apply(deployment, llm, MOVED)
    assert sent_keys(sent, START) == [f"d{d}-r0-s0", f"d{d}-r0-s1"]  # only the changed ones, same pipeline
    assert phases(deployment) == {0: (0, "reloading")}
    assert heads(deployment) == [("r0", 0, False, False)]
    assert deployment.status == Deployment.Status.DEPLOYING
    assert deployment.status_message == f"handing over replica r0: d{d}-r0 reloading in place"
    (started,) = DeploymentEvent.objects.filter(deployment=deployment, kind="handover_started")
    assert started.detail["mode"] == "in_place" and started.detail["changed"] == [0, 1]
    assert "no room beside: n0/gpu0 needs" in started.detail["reason"]
    report_all(deployment, 0, "ready", 200)
    deployment = deployment_reconcile(deployment_id=d)
    assert phases(deployment) == {0: (0, "serving")} and deployment.status == Deployment.Status.READY
    assert kinds(deployment) == ["handover_started", "handover_done"]
    done = DeploymentEvent.objects.get(deployment=deployment, kind="handover_done")
    assert done.detail["mode"] == "in_place" and done.detail["pause_s"] >= 0


def test_a_second_apply_during_a_handover_keeps_a_matching_pipeline_and_replaces_another(
    nodes, llm, revision, sent
):
    deployment = serving_ready(revision, sent)
    d = deployment.pk
    apply(deployment, llm, MOVED)
    report_all(deployment, 1, "starting", 200)
    sent.take()
    apply(deployment, llm, MOVED)  # the same plan again: the incoming pipeline already is it
    assert sent.take() == [] and phases(deployment) == {0: (0, "serving"), 1: (0, "incoming")}
    other = edited_plan(("n0/gpu0", 0, 1), ("n1/gpu0", 1, 4), ("n3/gpu0", 4, 6))
    deployment = apply(deployment, llm, other)
    tasks = sent.take()
    assert sorted(kw["stage_key"] for _, n, kw in tasks if n == STOP) == [f"d{d}-r1-s{i}" for i in range(3)]
    assert sorted(kw["stage_key"] for _, n, kw in tasks if n == START) == [f"d{d}-r2-s{i}" for i in range(3)]
    assert phases(deployment) == {0: (0, "serving"), 2: (0, "incoming")}
    assert deployment.status == Deployment.Status.READY
    report_all(deployment, 1, "exited", 200, exit_code=0)
    report_all(deployment, 2, "ready", 300)
    deployment = deployment_reconcile(deployment_id=d)
    assert phases(deployment) == {0: (0, "outgoing"), 2: (0, "serving")}
    assert [s["node"] for s in deployment.stages.filter(pipeline=2).values("node")] == [
        n.pk for n in (nodes[0], nodes[1], nodes[3])]


def test_a_drain_moves_the_stages_beside_and_the_drained_node_keeps_serving_until_the_switch(
    nodes, llm, revision, sent
):
    deployment = serving_ready(revision, sent)
    node_drain(node=nodes[2])
    deployment = deployment_reconcile(deployment_id=deployment.pk)
    assert phases(deployment) == {0: (0, "serving"), 1: (0, "incoming")}
    assert deployment.stages.get(pipeline=0, stage_index=2).node == nodes[2]  # still serving
    assert nodes[2].pk not in set(deployment.stages.filter(pipeline=1).values_list("node", flat=True))
    assert deployment.status == Deployment.Status.READY
    started = DeploymentEvent.objects.get(deployment=deployment, kind="handover_started")
    assert started.detail["mode"] == "beside"


def test_a_replan_after_a_loss_reloads_in_place_since_the_old_pipeline_cannot_serve(
    nodes, llm, revision, sent
):
    deployment = serving_ready(revision, sent)
    Node.objects.filter(pk=nodes[1].pk).update(status=Node.Status.LOST)
    deployment = deployment_reconcile(deployment_id=deployment.pk)
    assert deployment.revision.source == "replan"
    deployment = deployment_reconcile(deployment_id=deployment.pk)  # the pass the re-plan asked for
    assert phases(deployment) == {0: (0, "reloading")} and deployment.status == Deployment.Status.DEPLOYING
    started = DeploymentEvent.objects.get(deployment=deployment, kind="handover_started")
    assert started.detail["mode"] == "in_place" and "lost node" in started.detail["reason"]
    report_all(deployment, 0, "ready", 300)
    deployment = deployment_reconcile(deployment_id=deployment.pk)
    assert deployment.status == Deployment.Status.READY and phases(deployment) == {0: (0, "serving")}
    assert not deployment.stages.filter(node=nodes[1]).exists()  # a lost node's rows are forgotten


def test_a_failed_incoming_pipeline_degrades_but_the_old_one_serves_on(nodes, llm, revision, sent):
    deployment = serving_ready(revision, sent)
    deployment = apply(deployment, llm, MOVED)
    stage = deployment.stages.get(pipeline=1, stage_index=1)
    failed = report(stage, "failed", 201, exit_code=1, message="does not fit on emulated n1/gpu0")
    stage_status_record(node=stage.node, status=failed)
    deployment = deployment_reconcile(deployment_id=deployment.pk)
    assert deployment.status == Deployment.Status.DEGRADED  # still routed to (READY or DEGRADED)
    d = deployment.pk
    assert deployment.status_message == (f"handing over replica r0: d{d}-r1 starting; "
                                         f"d{d}-r1-s1 failed: does not fit on emulated n1/gpu0")
    assert heads(deployment)[0] == ("r0", 0, True, True)


def test_the_controllers_footprint_of_a_stage_is_the_agents(nodes, llm, revision):
    """room.py and the agent's admission (agents/memory_budget.py) size a stage alike, so a pipeline the
    controller starts beside another is one the agent admits."""
    deployment = deployment_create(name="tiny", revision=revision)
    profile = ModelProfile.from_dict(llm.profile)
    for stage in deployment.stages.all():
        agent = spec_footprint(StageSpec.from_dict(stage.spec))  # as the agent reads the spec it is sent
        assert spec_holdings(profile, stage.spec) == [(None, agent.total_bytes)] and agent.total_bytes > 0


def test_a_stage_moving_onto_a_card_another_stage_is_leaving_starts_once_that_one_is_gone(
    nodes, real_gpus, llm, revision, sent
):
    """Stages 1 and 2 swap cards in place (no room beside on real cards): each new stage waits for the
    one leaving its card, else the agent's admission refuses it (seen in replacement_bench's drain)."""
    deployment = serving_ready(revision, sent)
    d = deployment.pk
    deployment = apply(deployment, llm, edited_plan(("n0/gpu0", 0, 2), ("n2/gpu0", 2, 4), ("n1/gpu0", 4, 6)))
    tasks = sent.take()
    assert sorted(kw["stage_key"] for _, n, kw in tasks if n == STOP) == [f"d{d}-r0-s1", f"d{d}-r0-s2"]
    assert sorted(kw["stage_key"] for _, n, kw in tasks if n == START) == [f"d{d}-r0-s0"]
    waiting = deployment.stages.get(wanted=True, stage_index=1)
    assert waiting.message == f"waiting for d{d}-r0-s2 to leave {waiting.device}"
    for stage in deployment.stages.filter(wanted=False):
        stage_status_record(node=stage.node, status=report(stage, "exited", None, exit_code=0))
    deployment_reconcile(deployment_id=d)
    assert sent_keys(sent, START) == [f"d{d}-r0-s1", f"d{d}-r0-s2"]


def test_two_stages_swapping_the_cards_of_one_node_in_place_stop_first_then_start(
    nodes, real_gpus, llm, sent
):
    """Stages 1 and 2 swap the two cards of one node: their rows are rewritten in place, and each new
    stage's card is held by the other's old process until that one is replaced. Each waits, stops
    its own old process meanwhile, and both start once both are gone (replacement_bench's kill -9
    re-plan on the demo's scaled cards had the agent refuse one: "does not fit", the deployment
    FAILED)."""
    from controlplane.enrollment.services import agent_register, join_token_create
    from controlplane.inventory.models import Device
    from tests.deployments.conftest import T4

    secret = join_token_create(ttl=timedelta(hours=1)).secret
    agent_register(join_token=secret, name="m", address="127.0.0.1", emulated=True, devices=[T4, T4])
    Device.objects.update(emulated=False)
    sent.take()
    first = plan_revision_create(model=llm, request=REQUEST, source="edited",
                                 plan=edited_plan(("n0/gpu0", 0, 2), ("m/gpu0", 2, 4), ("m/gpu1", 4, 6)))
    deployment = serving_ready(first, sent)
    d = deployment.pk
    deployment = apply(deployment, llm, edited_plan(("n0/gpu0", 0, 2), ("m/gpu1", 2, 4), ("m/gpu0", 4, 6)))
    tasks = sent.take()
    assert [kw["stage_key"] for _, n, kw in tasks if n == START] == []  # either would be refused
    assert sorted(kw["stage_key"] for _, n, kw in tasks if n == STOP) == [f"d{d}-r0-s1", f"d{d}-r0-s2"]
    s1, s2 = deployment.stages.get(stage_index=1), deployment.stages.get(stage_index=2)
    assert s1.message == f"waiting for d{d}-r0-s2 to leave m/gpu1"
    assert s2.message == f"waiting for d{d}-r0-s1 to leave m/gpu0"
    deployment_reconcile(deployment_id=d)
    assert sent.take() == []  # no stop sent twice while they go
    stage_status_record(node=s1.node, status=report(s1, "exited", None, exit_code=0))
    deployment_reconcile(deployment_id=d)
    assert sent_keys(sent, START) == [f"d{d}-r0-s2"]  # m/gpu0 is free now; m/gpu1 is not yet
    deployment_reconcile(deployment_id=d)
    # s2's start, queued on the node before s1's, replaces its old process on m/gpu1 first.
    assert sent_keys(sent, START) == [f"d{d}-r0-s1"]
    report_all(deployment, 0, "ready", 300)
    deployment = deployment_reconcile(deployment_id=d)
    assert deployment.status == Deployment.Status.READY and phases(deployment) == {0: (0, "serving")}


STAGE_MOVED = edited_plan(("n0/gpu0", 0, 2), ("n1/gpu0", 2, 4), ("n3/gpu0", 4, 6))


def started_specs(tasks) -> dict[str, dict]:
    return {kw["stage_key"]: kw["spec"] for _, name, kw in tasks if name == START}


def test_a_stage_moving_to_a_free_card_loads_there_held_while_the_pipeline_serves_then_rewires(
    nodes, real_gpus, llm, revision, sent
):
    """In place (no room for a whole second pipeline), but the moved stage's new card is free: it
    starts there first, held, and the pipeline serves on; the pause begins once it is ready."""
    deployment = serving_ready(revision, sent)
    d = deployment.pk
    deployment = apply(deployment, llm, STAGE_MOVED)
    tasks = sent.take()
    assert [name for _, name, _ in tasks] == [START]  # nothing of the serving pipeline is touched
    assert started_specs(tasks)[f"d{d}-r0-s2"]["hold"] is True and tasks[0][2]["background"] is True
    held = deployment.stages.get(held=True)
    assert (held.node, held.wanted) == (nodes[3], False)
    assert phases(deployment) == {0: (0, "serving")} and heads(deployment) == [("r0", 0, True, True)]
    assert deployment.status == Deployment.Status.READY
    started = DeploymentEvent.objects.get(deployment=deployment, kind="handover_started")
    assert started.detail["held"] == [f"d{d}-r0-s2"] and started.detail["changed"] == [1, 2]
    apply(deployment, llm, STAGE_MOVED)  # the same plan again: the prepared handover already goes there
    assert sent.take() == [] and deployment.stages.get(held=True).pk == held.pk

    stage_status_record(node=nodes[3], status=report(deployment.stages.get(held=True), "ready", 300))
    deployment = deployment_reconcile(deployment_id=d)
    tasks = sent.take()
    specs = started_specs(tasks)
    assert sorted(specs) == [f"d{d}-r0-s1", f"d{d}-r0-s2"]
    assert {kw["background"] for _, name, kw in tasks if name == START} == {False}  # the pause waits for them
    assert specs[f"d{d}-r0-s2"]["hold"] is False
    assert specs[f"d{d}-r0-s1"]["next"] == specs[f"d{d}-r0-s2"]["listen"]
    assert [(kw["stage_key"], task[0]) for task in tasks if task[1] == STOP for kw in [task[2]]] == [
        (f"d{d}-r0-s2", f"node.{nodes[2].pk}")]
    assert phases(deployment) == {0: (0, "reloading")}
    assert kinds(deployment) == ["handover_started", "handover_switched"]
    report_all(deployment, 0, "ready", 400)
    deployment = deployment_reconcile(deployment_id=d)
    assert phases(deployment) == {0: (0, "serving")} and deployment.status == Deployment.Status.READY
    assert [s.node for s in deployment.stages.filter(wanted=True).order_by("stage_index")] == [
        nodes[0], nodes[1], nodes[3]]
    assert kinds(deployment) == ["handover_started", "handover_switched", "handover_done"]


def test_a_newer_plan_drops_a_prepared_handover_and_its_held_stage(nodes, real_gpus, llm, revision, sent):
    deployment = serving_ready(revision, sent)
    d = deployment.pk
    apply(deployment, llm, STAGE_MOVED)
    sent.take()
    deployment = apply(deployment, llm, THREE_STAGES)  # back to the plan it runs: nothing else moves
    assert [(name, kw["stage_key"]) for _, name, kw in sent.take()] == [(STOP, f"d{d}-r0-s2")]
    assert not deployment.stages.filter(held=True).exists()
    assert not deployment.stages.filter(next_spec__isnull=False).exists()
    assert phases(deployment) == {0: (0, "serving")} and deployment.status == Deployment.Status.READY


def test_a_held_stage_that_fails_releases_the_handover_in_place(nodes, real_gpus, llm, revision, sent):
    deployment = serving_ready(revision, sent)
    d = deployment.pk
    apply(deployment, llm, STAGE_MOVED)
    sent.take()
    stage_status_record(node=nodes[3], status=report(deployment.stages.get(held=True), "failed", 300,
                                                     message="refused: out of memory"))
    deployment = deployment_reconcile(deployment_id=d)
    assert phases(deployment) == {0: (0, "reloading")}
    assert sorted(started_specs(sent.take())) == [f"d{d}-r0-s1", f"d{d}-r0-s2"]  # the failed one restarts


def test_a_restarted_agent_keeps_and_restarts_its_held_stage(nodes, real_gpus, llm, revision, sent):
    """A node's agent that registers again forgets its retired stages, not a held one: it is listed in
    the sync and started again, so the prepared handover can still complete."""
    deployment = serving_ready(revision, sent)
    d = deployment.pk
    apply(deployment, llm, STAGE_MOVED)
    sent.take()
    node_agent_restarted(node=Node.objects.get(pk=nodes[3].pk))
    held = deployment.stages.get(held=True)
    assert (held.state, held.sent_spec) == ("pending", None)
    tasks = sent.take()
    assert (f"node.{nodes[3].pk}", "motley.agent.sync", {"wanted_stage_keys": [f"d{d}-r0-s2"]}) in tasks
    deployment_reconcile(deployment_id=d)
    assert started_specs(sent.take())[f"d{d}-r0-s2"]["hold"] is True
