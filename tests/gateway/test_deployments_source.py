"""The controller's READY deployments, seen by the gateway as served models with replica endpoints."""

from __future__ import annotations

import pytest

from contracts.fleet_file import load_fleet_file
from controlplane.deployments.models import Deployment, DeploymentStage
from controlplane.gateway.serving.deployments_source import served_models_from_deployments
from controlplane.inventory.services import fleet_import
from controlplane.models_catalog.services import model_register
from tests.dashboard.seed import LAB_FLEET, _checkpoint_stand_in, running_deployment_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def deployment():
    fleet_import(fleet=load_fleet_file(LAB_FLEET))
    return running_deployment_create(model=model_register(path=_checkpoint_stand_in()))


def test_a_ready_deployment_serves_its_model_on_its_ready_replicas(deployment):
    (served,) = served_models_from_deployments()
    plan = deployment.revision.plan
    assert served.name == deployment.model.name and served.tokenizer_path == deployment.model.path
    assert len(served.replicas) == len(plan["replicas"])
    first = served.replicas[0]
    assert first.head_address == DeploymentStage.objects.get(deployment=deployment, pipeline=0,
                                                             stage_index=0).spec["head"]
    assert first.auth_token == "token-0"
    assert first.kv_tokens == min(s["kv_tokens"] for s in plan["replicas"][0]["stages"])
    assert first.costs.decode_step_s == pytest.approx(
        plan["replicas"][0]["predicted"]["token_latency_ms"] / 1000)
    assert first.costs_source == "planned"


def test_each_replica_names_its_stages_and_their_devices_for_the_telemetry(deployment):
    (served,) = served_models_from_deployments()
    for index, replica in enumerate(served.replicas):
        planned = deployment.revision.plan["replicas"][index]["stages"]
        assert [s.stage_key for s in replica.stages] == [f"d{deployment.pk}-r{index}-s{i}"
                                                         for i in range(len(planned))]
        assert [s.device for s in replica.stages] == [s["device"] for s in planned]
        assert [s.planned_step_ms for s in replica.stages] == [s["predicted"]["step_ms"] for s in planned]


def test_replicas_not_ready_and_deployments_not_live_are_left_out(deployment):
    DeploymentStage.objects.filter(deployment=deployment, pipeline=0).update(
        state=DeploymentStage.State.STARTING)
    served = served_models_from_deployments()
    assert sum(len(s.replicas) for s in served) == len(deployment.revision.plan["replicas"]) - 1
    Deployment.objects.filter(pk=deployment.pk).update(status=Deployment.Status.STOPPED)
    assert served_models_from_deployments() == []


def test_the_default_source_serves_deployments_unless_a_models_file_is_set(deployment, settings, tmp_path):
    from controlplane.gateway.serving.deployments_source import served_models

    assert [m.name for m in served_models()] == [deployment.model.name]
    models_file = tmp_path / "models.json"
    models_file.write_text('{"models": [{"name": "fixed", "tokenizer_path": "/x", "replicas": '
                           '[{"pipeline_id": "p", "head_address": "tcp://h:1", "auth_token": "t"}]}]}')
    settings.MOTLEY_GATEWAY = {"MODELS_FILE": str(models_file)}
    assert [m.name for m in served_models()] == ["fixed"]


def test_the_deployment_routing_strategy_is_the_served_models(deployment):
    assert served_models_from_deployments()[0].strategy == "cost_aware"
    Deployment.objects.filter(pk=deployment.pk).update(routing_strategy="round_robin")
    (served,) = served_models_from_deployments()
    assert served.strategy == "round_robin"


def test_a_deployment_that_cannot_serve_now_is_listed_without_replicas_and_says_why(deployment):
    DeploymentStage.objects.filter(deployment=deployment).update(state=DeploymentStage.State.STARTING)
    Deployment.objects.filter(pk=deployment.pk).update(status=Deployment.Status.DEPLOYING)
    (served,) = served_models_from_deployments()
    number = deployment.revision.number
    assert (served.replicas == ()
            and served.reason == f"deployment {deployment.name} is deploying plan revision {number}")
    Deployment.objects.filter(pk=deployment.pk).update(status=Deployment.Status.FAILED,
                                                       status_message="n1 is lost")
    assert served_models_from_deployments()[0].reason == f"deployment {deployment.name} failed: n1 is lost"
    Deployment.objects.filter(pk=deployment.pk).update(stop_requested=True)
    assert served_models_from_deployments() == []  # being stopped: nothing is coming


def test_a_deployment_with_no_way_to_serve_says_so_one_that_is_coming_does_not(deployment):
    from controlplane.inventory.models import Node

    DeploymentStage.objects.filter(deployment=deployment).update(state=DeploymentStage.State.STARTING)
    Deployment.objects.filter(pk=deployment.pk).update(status=Deployment.Status.DEPLOYING)
    assert not served_models_from_deployments()[0].cannot_serve  # deploying: replicas are coming
    lost = DeploymentStage.objects.filter(deployment=deployment).first().node
    Node.objects.filter(pk=lost.pk).update(status=Node.Status.LOST)
    Deployment.objects.filter(pk=deployment.pk).update(status=Deployment.Status.DEGRADED,
                                                       status_message="re-plan failed: infeasible")
    assert served_models_from_deployments()[0].cannot_serve  # a stage on a lost node, not re-planned
    Deployment.objects.filter(pk=deployment.pk).update(status=Deployment.Status.FAILED)
    assert served_models_from_deployments()[0].cannot_serve
    DeploymentStage.objects.filter(deployment=deployment).update(state=DeploymentStage.State.READY)
    Deployment.objects.filter(pk=deployment.pk).update(status=Deployment.Status.DEGRADED)
    served = served_models_from_deployments()[0]
    assert served.replicas and not served.cannot_serve  # a replica still serves


def test_a_replicas_kv_capacity_is_what_its_stages_were_started_with(deployment):
    """Not the plan's figure: an emulated stage gets the workload's KV, and while a replica is handed
    over its slot already has the new plan. The smallest stage's budget is what the head holds."""
    for stage in DeploymentStage.objects.filter(deployment=deployment, pipeline=0):
        stage.spec = {**stage.spec, "kv_tokens": 4096 + 16 * stage.stage_index}
        stage.save(update_fields=["spec"])
    (served,) = served_models_from_deployments()
    by_id = {r.pipeline_id: r for r in served.replicas}
    planned = deployment.revision.plan["replicas"]
    assert by_id[f"d{deployment.pk}-r0"].kv_tokens == 4096
    assert min(s["kv_tokens"] for s in planned[0]["stages"]) != 4096
    assert by_id[f"d{deployment.pk}-r1"].kv_tokens == min(s["kv_tokens"] for s in planned[1]["stages"])


def test_a_replica_being_handed_over_stays_listed_but_unroutable_with_its_slots_plan(deployment, monkeypatch):
    """``serving`` False: its running requests keep their client; nothing new goes to it. A replica's
    costs come from the plan replica it serves (``slot``), not from its own index; its KV from its
    stages (the next test), else that plan replica."""
    from dataclasses import replace

    from controlplane.gateway.serving import deployments_source

    heads = deployments_source.deployment_endpoints(deployment=deployment)
    handed_over = [replace(heads[0], serving=False),
                   replace(heads[1], pipeline=7, plan_replica=0, kv_tokens=None)]
    monkeypatch.setattr(deployments_source, "deployment_endpoints", lambda deployment: handed_over)
    (served,) = served_models_from_deployments()
    old, new = served.replicas
    assert (not old.health.ok
            and old.health.reason == f"deployment {deployment.name} is handing this replica over")
    assert new.health.ok and served.reason == ""
    first_slot = deployment.revision.plan["replicas"][0]
    assert new.kv_tokens == min(s["kv_tokens"] for s in first_slot["stages"])
    assert new.costs.decode_step_s == pytest.approx(first_slot["predicted"]["token_latency_ms"] / 1000)
    monkeypatch.setattr(deployments_source, "deployment_endpoints", lambda deployment: handed_over[:1])
    (served,) = served_models_from_deployments()
    assert served.reason == f"deployment {deployment.name} is handing its replicas over to plan revision " \
                            f"{deployment.revision.number}"


def test_a_pipeline_handed_over_beside_names_the_one_that_serves_its_slot_now(deployment):
    """Its successor: the gateway routes to it until it has heard that one's head say ok (live_health).
    An incoming pipeline or one reloading in place names none."""
    from controlplane.deployments.models import DeploymentPipeline

    old, new = deployment.pipelines.order_by("index")[:2]
    old.phase = DeploymentPipeline.Phase.OUTGOING
    old.save(update_fields=["phase"])
    new.plan_replica = old.plan_replica
    new.save(update_fields=["plan_replica"])
    (served,) = served_models_from_deployments()
    by_id = {r.pipeline_id: r for r in served.replicas}
    assert by_id[old.pipeline_id].successor == new.pipeline_id and not by_id[old.pipeline_id].health.ok
    assert by_id[new.pipeline_id].successor is None and by_id[new.pipeline_id].health.ok

    old.phase = DeploymentPipeline.Phase.RELOADING
    old.save(update_fields=["phase"])
    (served,) = served_models_from_deployments()
    assert all(r.successor is None for r in served.replicas)
