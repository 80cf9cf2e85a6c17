"""The controller against recorded sends: specs, wiring, idempotence, revisions and moves, stop."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from controlplane.deployments.models import Deployment, DeploymentStage, PlanRevision
from controlplane.deployments.reconcile import deployment_reconcile
from controlplane.deployments.revisions import plan_revision_create
from controlplane.deployments.selectors import deployment_endpoints
from controlplane.deployments.services import deployment_apply, deployment_create, deployment_stop
from controlplane.deployments.stage_reports import stage_status_record
from controlplane.inventory.models import Node
from tests.deployments.conftest import REQUEST, edited_plan, report

pytestmark = pytest.mark.django_db(transaction=True)  # sends happen on commit, as in production


def ready_all(deployment, pid_base: int = 100) -> None:
    for stage in deployment.stages.filter(wanted=True):
        stage_status_record(node=stage.node, status=report(stage, "ready", pid_base + stage.stage_index))


def starts(tasks) -> dict[str, tuple[str, dict]]:
    return {kw["stage_key"]: (queue, kw["spec"])
            for queue, name, kw in tasks if name == "motley.agent.start_stage"}


def test_create_writes_wired_specs_and_reconcile_starts_each_stage_once(nodes, llm, revision, sent):
    deployment = deployment_create(name="tiny", revision=revision)
    assert sent.reconciles == [deployment.pk] and deployment.status == Deployment.Status.DEPLOYING
    deployment_reconcile(deployment_id=deployment.pk)
    started = starts(sent.take())
    key = f"d{deployment.pk}-r0-s"
    assert [queue for queue, _ in started.values()] == [f"node.{n.pk}" for n in nodes[:3]]
    specs = [started[f"{key}{i}"][1] for i in range(3)]
    listens = [s["listen"] for s in specs]
    assert len(set(listens)) == 3 and all(a.startswith("tcp://127.0.0.1:56") for a in listens)
    assert [s["next"] for s in specs] == [listens[1], listens[2], None]
    assert {s["head"] for s in specs} == {listens[0]}
    assert [s["layers"] for s in specs] == [[0, 2], [2, 4], [4, 6]]
    assert {s["pipeline_id"] for s in specs} == {f"d{deployment.pk}-r0"}
    assert len({s["auth_token"] for s in specs}) == 1 and len(specs[0]["auth_token"]) > 30
    assert specs[0]["model_path"] == llm.path and specs[0]["device"] == "cpu"
    assert specs[0]["emulation"]["memory_bandwidth_gbs"] == 320.0
    assert specs[0]["kv_tokens"] == 4 * 256  # emulated: what the workload needs, not its card's memory
    assert [s["num_stages"] for s in specs] == [3, 3, 3]
    assert specs[0]["micro_batches"] >= 1 and specs[1]["micro_batches"] is None  # the head schedules

    deployment_reconcile(deployment_id=deployment.pk)
    assert sent.take() == []  # level-triggered and idempotent: nothing new, nothing sent


def test_ready_when_every_stage_reported_ready_and_the_gateway_sees_the_head(nodes, revision, sent):
    deployment = deployment_create(name="tiny", revision=revision)
    deployment_reconcile(deployment_id=deployment.pk)
    first = deployment.stages.get(stage_index=0)
    stage_status_record(node=first.node, status=report(first, "ready", 100))
    assert deployment_reconcile(deployment_id=deployment.pk).status == Deployment.Status.DEPLOYING
    assert [e.ready for e in deployment_endpoints(deployment=deployment)] == [False]
    ready_all(deployment)
    assert deployment_reconcile(deployment_id=deployment.pk).status == Deployment.Status.READY
    (endpoint,) = deployment_endpoints(deployment=deployment)
    assert endpoint.ready and endpoint.head_address == first.spec["listen"]
    assert endpoint.auth_token == first.spec["auth_token"]


def test_a_report_for_another_nodes_stage_changes_nothing(nodes, revision, sent):
    deployment = deployment_create(name="tiny", revision=revision)
    stage = deployment.stages.get(stage_index=0)  # on n0
    stage_status_record(node=nodes[1], status=report(stage, "ready", 100))
    stage.refresh_from_db()
    assert stage.state == DeploymentStage.State.PENDING and stage.pid is None


def test_moving_one_boundary_restarts_only_the_two_stages_it_touches(nodes, real_gpus, llm, revision, sent):
    deployment = deployment_create(name="tiny", revision=revision)
    deployment_reconcile(deployment_id=deployment.pk)
    before = starts(sent.take())
    ready_all(deployment)
    deployment_reconcile(deployment_id=deployment.pk)
    sent.take()

    moved_plan = edited_plan(("n0/gpu0", 0, 3), ("n1/gpu0", 3, 4), ("n2/gpu0", 4, 6))
    moved = plan_revision_create(model=llm, plan=moved_plan, request=REQUEST, source="edited")
    deployment_apply(deployment=deployment, revision=moved)
    deployment_reconcile(deployment_id=deployment.pk)
    after = starts(sent.take())
    key = f"d{deployment.pk}-r0-s"
    assert sorted(after) == [f"{key}0", f"{key}1"]
    assert [after[f"{key}{i}"][1]["layers"] for i in (0, 1)] == [[0, 3], [3, 4]]
    # Same devices, same addresses: the untouched stage's neighbours are where they were.
    assert all(after[k][1]["listen"] == before[k][1]["listen"] for k in after)
    assert revision.__class__.objects.get(pk=revision.pk).status == PlanRevision.Status.SUPERSEDED

    # The replaced processes' last reports do not make the new stages look ready.
    zero = deployment.stages.get(stage_index=0)
    stage_status_record(node=zero.node, status=report(zero, "ready", 100))
    assert deployment_reconcile(deployment_id=deployment.pk).status == Deployment.Status.DEPLOYING
    ready_all(deployment, pid_base=200)
    assert deployment_reconcile(deployment_id=deployment.pk).status == Deployment.Status.READY
    assert sent.take() == []


def test_a_stage_given_a_low_bit_tail_restarts_alone_with_its_precisions_in_the_spec(
    nodes, real_gpus, llm, revision, sent
):
    deployment = deployment_create(name="tiny", revision=revision)
    deployment_reconcile(deployment_id=deployment.pk)
    sent.take()
    ready_all(deployment)
    plan = edited_plan(("n0/gpu0", 0, 2), ("n1/gpu0", 2, 4), ("n2/gpu0", 4, 6))
    plan["replicas"][0]["stages"][2].update(low_bits=4, low_from=5)
    mixed = plan_revision_create(model=llm, plan=plan, request=REQUEST, source="edited")
    deployment_apply(deployment=deployment, revision=mixed)
    deployment_reconcile(deployment_id=deployment.pk)
    after = starts(sent.take())
    (key,) = after
    spec = after[key][1]
    assert key.endswith("-s2") and (spec["bits"], spec["low_bits"], spec["low_from"]) == (16, 4, 5)
    stage = deployment.stages.get(stage_index=2, wanted=True)
    assert stage.spec["low_bits"] == 4
    assert deployment.stages.get(stage_index=1, wanted=True).spec["low_bits"] is None


def test_a_stage_moved_to_another_node_is_stopped_on_the_old_one(nodes, real_gpus, llm, revision, sent):
    deployment = deployment_create(name="tiny", revision=revision)
    deployment_reconcile(deployment_id=deployment.pk)
    ready_all(deployment)
    sent.take()
    # Stage 2 moves from n2 to n3: stopped on n2, started on n3; stage 1 is re-wired to it.
    moved_plan = edited_plan(("n0/gpu0", 0, 2), ("n1/gpu0", 2, 4), ("n3/gpu0", 4, 6))
    moved = plan_revision_create(model=llm, plan=moved_plan, request=REQUEST, source="edited")
    deployment_apply(deployment=deployment, revision=moved)
    deployment_reconcile(deployment_id=deployment.pk)
    tasks = sent.take()
    key = f"d{deployment.pk}-r0-s"
    started = starts(tasks)
    assert sorted(started) == [f"{key}1", f"{key}2"] and started[f"{key}2"][0] == f"node.{nodes[3].pk}"
    assert started[f"{key}1"][1]["next"] == started[f"{key}2"][1]["listen"]
    assert [(q, n, kw) for q, n, kw in tasks if n == "motley.agent.stop_stage"] == [
        (f"node.{nodes[2].pk}", "motley.agent.stop_stage", {"stage_key": f"{key}2"})
    ]
    old = deployment.stages.get(wanted=False)
    assert old.node == nodes[2]
    # Its report is about the old process: it never touches the new row on n3.
    stage_status_record(node=nodes[2], status=report(old, "exited", 102, exit_code=0))
    deployment_reconcile(deployment_id=deployment.pk)
    assert not deployment.stages.filter(wanted=False).exists()
    assert deployment.stages.get(stage_index=2).state == DeploymentStage.State.PENDING


def test_stop_stops_every_stage_and_ends_stopped_once_confirmed(nodes, revision, sent):
    deployment = deployment_create(name="tiny", revision=revision)
    deployment_reconcile(deployment_id=deployment.pk)
    ready_all(deployment)
    sent.take()
    deployment_stop(deployment=deployment)
    deployment_reconcile(deployment_id=deployment.pk)
    stops = [(queue, kw["stage_key"]) for queue, name, kw in sent.take() if name == "motley.agent.stop_stage"]
    assert len(stops) == 3
    deployment_reconcile(deployment_id=deployment.pk)
    assert sent.take() == []
    for stage in deployment.stages.all():
        exited = report(stage, "exited", 100 + stage.stage_index, exit_code=0)
        stage_status_record(node=stage.node, status=exited)
    assert deployment_reconcile(deployment_id=deployment.pk).status == Deployment.Status.STOPPED
    assert not deployment.stages.exists()


def test_a_failed_stage_fails_the_deployment_with_its_message(nodes, revision, sent):
    deployment = deployment_create(name="tiny", revision=revision)
    deployment_reconcile(deployment_id=deployment.pk)
    stage = deployment.stages.get(stage_index=1)
    failed = report(stage, "failed", 7, exit_code=1, message="out of memory")
    stage_status_record(node=stage.node, status=failed)
    deployment = deployment_reconcile(deployment_id=deployment.pk)
    assert deployment.status == Deployment.Status.FAILED and "out of memory" in deployment.status_message


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda nodes, llm: Node.objects.filter(pk=nodes[1].pk).update(status=Node.Status.LOST),
         "n1 is lost"),
        (lambda nodes, llm: Node.objects.filter(pk=nodes[2].pk).update(incarnation=0),
         "no agent has registered"),
        (lambda nodes, llm: type(llm).objects.filter(pk=llm.pk).update(has_weights=False),
         "planning only"),
    ],
)
def test_an_undeployable_plan_is_refused_with_the_reason_and_nothing_changes(
    nodes, llm, revision, sent, change, reason
):
    change(nodes, llm)
    revision.refresh_from_db()
    with pytest.raises(ValidationError, match=reason):
        deployment_create(name="tiny", revision=revision)
    assert not Deployment.objects.exists() and sent.tasks == []


def test_an_infeasible_plan_is_refused_by_the_planners_validation(nodes, llm, sent):
    gap_plan = edited_plan(("n0/gpu0", 0, 2), ("n1/gpu0", 3, 6))
    gap = plan_revision_create(model=llm, plan=gap_plan, request=REQUEST, source="edited")
    with pytest.raises(ValidationError, match="layer"):
        deployment_create(name="tiny", revision=gap)
    unknown = plan_revision_create(model=llm, plan=edited_plan(("n9/gpu0", 0, 6)), request=REQUEST,
                                   source="edited")
    with pytest.raises(ValidationError, match="n9/gpu0 is not in the inventory"):
        deployment_create(name="tiny", revision=unknown)


def test_a_device_another_deployment_uses_is_refused_and_left_out_of_re_plans(nodes, llm, revision, sent):
    deployment_create(name="first", revision=revision)
    clash = plan_revision_create(model=llm, plan=edited_plan(("n1/gpu0", 0, 6)), request=REQUEST,
                                 source="edited")
    with pytest.raises(ValidationError, match="n1/gpu0 carries a stage of deployment first"):
        deployment_create(name="second", revision=clash)
    free = plan_revision_create(model=llm, plan=edited_plan(("n3/gpu0", 0, 6)), request=REQUEST,
                                source="edited")
    second = deployment_create(name="second", revision=free)
    Node.objects.filter(name="n3").update(status=Node.Status.LOST)
    second = deployment_reconcile(deployment_id=second.pk)
    # The only free devices were n3's: nothing left to re-plan on without taking the first's.
    assert second.status == Deployment.Status.DEGRADED and "re-plan failed" in second.status_message


def test_a_deployment_without_a_revision_yet_is_left_alone(nodes, llm, sent):
    """reconcile_all may list a deployment row before anything is desired of it: nothing to decide."""
    bare = Deployment.objects.create(name="bare", model=llm)
    assert deployment_reconcile(deployment_id=bare.pk).status == Deployment.Status.PENDING
    assert sent.take() == []
