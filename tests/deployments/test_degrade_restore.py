"""Degrade, then restore, through the controller: three 1 GiB cards serve 4000 sequences of 512 tokens;
with one lost, the re-plan fits only fewer, serves them and says so; the card back, the reconcile loop
plans the full workload again and restores it. A model too large for what is left at 16 bits is served at
lower precision only on its operator's emergency quality budget, and the full plan comes back at 16 bits.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from contracts.hardware import GIB
from contracts.model_profile import ModelProfile
from controlplane.deployments.liveness import node_health_check, node_heartbeat_record
from controlplane.deployments.models import Deployment, DeploymentEvent, PlanRevision
from controlplane.deployments.reconcile import deployment_reconcile
from controlplane.deployments.revisions import plan_revision_create
from controlplane.deployments.services import deployment_create
from controlplane.deployments.stage_reports import stage_status_record
from controlplane.enrollment.services import agent_register, join_token_create
from controlplane.gateway.serving.deployments_source import served_models_from_deployments
from controlplane.inventory.models import Node
from controlplane.models_catalog.models import LlmModel
from tests.deployments.conftest import T4, edited_plan, report
from tests.planning.factories import profile

pytestmark = pytest.mark.django_db(transaction=True)
SMALL = {**T4, "model": "small", "memory_bytes": GIB}
ASKED = {"batch": 4000, "context": 512, "replicas": 1, "bits": [16]}  # fits three cards, not two


@pytest.fixture(autouse=True)
def short_timeouts(settings):
    settings.MOTLEY_AGENT_HEARTBEAT_INTERVAL_S = 1.0
    settings.MOTLEY_NODE_LOST_AFTER_S = 10.0


def register(card: dict, sent) -> list[Node]:
    secret = join_token_create(ttl=timedelta(hours=1)).secret
    registered = [agent_register(join_token=secret, name=f"n{i}", address="127.0.0.1", emulated=True,
                                 devices=[card]).node for i in range(3)]
    sent.take()
    return registered


@pytest.fixture
def small_nodes(db, sent) -> list[Node]:
    return register(SMALL, sent)


@pytest.fixture
def mid_nodes(db, sent) -> list[Node]:
    """Three 3 GiB cards: 2.5 GiB usable each, 7.4 in all, 5.0 with one lost."""
    return register({**T4, "model": "mid", "memory_bytes": 3 * GIB}, sent)


@pytest.fixture
def measured_llm(llm) -> LlmModel:
    """The tiny checkpoint priced as six layers of 500 M parameters (6.1 GiB at 16 bits, 3.3 at 8) whose
    per-layer KL was measured: 0.002 each at int8, 0.02 at int4."""
    big = profile(num_layers=6, layer_params=500_000_000, name=llm.name)
    llm.profile = {**ModelProfile.to_dict(big), "sensitivity": {8: [0.002] * 6, 4: [0.02] * 6}}
    llm.save(update_fields=["profile"])
    return llm


def lose(node: Node) -> None:
    Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now() - timedelta(seconds=11))
    node_health_check()


def serve(deployment: Deployment) -> Deployment:
    """Reconcile, the wanted stages on live nodes reporting ready and the others exited, until the
    deployment is READY."""
    for attempt in range(8):
        deployment = deployment_reconcile(deployment_id=deployment.pk)
        if deployment.status == Deployment.Status.READY:
            return deployment
        for stage in deployment.stages.select_related("node"):
            if stage.sent_spec is not None and stage.node.status != Node.Status.LOST:
                state = "ready" if stage.wanted else "exited"
                stage_status_record(node=stage.node, status=report(stage, state, 100 * attempt + stage.pk))
    raise AssertionError(f"not ready: {deployment.status} {deployment.status_message}")


def kinds(deployment: Deployment) -> list[str]:
    return list(deployment.events.order_by("at", "id").values_list("kind", flat=True))


def test_a_lost_card_degrades_the_workload_and_its_return_restores_it(small_nodes, llm, sent, admin_client):
    plan = edited_plan(("n0/gpu0", 0, 2), ("n1/gpu0", 2, 4), ("n2/gpu0", 4, 6))
    revision = plan_revision_create(model=llm, plan=plan, request=ASKED, source="edited")
    deployment = serve(deployment_create(name="tiny", revision=revision))
    lose(small_nodes[1])

    deployment = serve(deployment)
    degraded = deployment.revision
    assert degraded.source == PlanRevision.Source.REPLAN and degraded.degraded_from == ASKED
    assert 1 <= degraded.request["batch"] < 4000 and degraded.request["context"] == 512
    event = deployment.events.get(kind=DeploymentEvent.Kind.DEGRADED_PLAN)
    assert event.detail["asked"] == {"batch": 4000, "context": 512, "replicas": 1}
    assert event.detail["planned"] == {"batch": degraded.request["batch"], "context": 512, "replicas": 1}
    assert f"batch {degraded.request['batch']} of 4000" in event.message
    assert deployment_reconcile(deployment_id=deployment.pk).revision == degraded  # n1 still lost: kept
    batch = degraded.request["batch"]
    shown = {"planned": {"batch": batch, "context": 512, "replicas": 1},
             "asked": {"batch": 4000, "context": 512, "replicas": 1},
             "precision": None}
    assert admin_client.get(f"/api/v1/deployments/{deployment.pk}/").json()["degraded"] == shown
    page = admin_client.get("/deployments/").content.decode()
    assert f"Serving a degraded plan: {batch} of 4000 sequences, context 512 of 512 tokens" in page

    node_heartbeat_record(node=small_nodes[1], heartbeat={"stages": []})  # n1 is back
    deployment = serve(deployment)
    restored = deployment.revision
    assert restored.number == degraded.number + 1 and restored.degraded_from is None
    assert restored.request == ASKED
    assert "n1/gpu0" in str(restored.plan["replicas"])
    event = deployment.events.get(kind=DeploymentEvent.Kind.RESTORED)
    full = {"batch": 4000, "context": 512, "replicas": 1}
    assert event.detail["planned"] == event.detail["asked"] == full
    assert kinds(deployment).count("restored") == 1
    assert admin_client.get(f"/api/v1/deployments/{deployment.pk}/").json()["degraded"] is None


def emergency_deployment(llm: LlmModel, emergency_max_kl: float | None) -> Deployment:
    plan = edited_plan(("n0/gpu0", 0, 2), ("n1/gpu0", 2, 4), ("n2/gpu0", 4, 6))
    revision = plan_revision_create(model=llm, plan=plan, request=FULL_PRECISION, source="edited")
    return serve(deployment_create(name="big", revision=revision,
                                   targets={"emergency_max_kl": emergency_max_kl}))


FULL_PRECISION = {"batch": 4, "context": 512, "replicas": 1, "bits": [16]}


def test_a_lost_card_lowers_precision_within_the_emergency_budget_and_its_return_restores_16_bits(
        mid_nodes, measured_llm, sent, admin_client):
    deployment = emergency_deployment(measured_llm, 0.05)
    lose(mid_nodes[1])
    deployment = serve(deployment)
    degraded = deployment.revision
    assert degraded.degraded_from == FULL_PRECISION
    assert degraded.request["quality"] == {"max_kl": 0.05} and degraded.request["bits"] == [16, 8, 4]
    event = deployment.events.get(kind=DeploymentEvent.Kind.DEGRADED_PLAN)
    precision = event.detail["precision"]
    low_layers = sum(precision["layers"].values())
    assert 0 < low_layers <= 6 and precision["max_kl"] == 0.05
    assert precision["kl"] == pytest.approx(0.002 * precision["layers"].get("8", 0)
                                            + 0.02 * precision["layers"].get("4", 0))
    assert precision["kl"] <= 0.05 and "precision lowered: " in event.message
    shown = admin_client.get(f"/api/v1/deployments/{deployment.pk}/").json()["degraded"]
    assert shown["precision"] == precision
    assert "emergency budget 0.05" in admin_client.get("/deployments/").content.decode()

    node_heartbeat_record(node=mid_nodes[1], heartbeat={"stages": []})
    deployment = serve(deployment)
    restored = deployment.revision
    assert restored.degraded_from is None and restored.request == FULL_PRECISION
    assert {s["bits"] for r in restored.plan["replicas"] for s in r["stages"]} == {16}
    assert all(s.get("low_bits") in (None, 16) for r in restored.plan["replicas"] for s in r["stages"])
    assert deployment.events.get(kind=DeploymentEvent.Kind.RESTORED).detail["precision"] is None


@pytest.mark.parametrize(("budget", "says"), [
    (None, "not even one sequence of 256 tokens fits"),
    (0.001, "nor on the emergency quality budget (max_kl 0.001, 16/8/4 bits)"),
], ids=["not-allowed", "budget-too-small"])
def test_without_an_emergency_budget_that_fits_the_model_cannot_serve(mid_nodes, measured_llm, sent, budget,
                                                                      says):
    deployment = emergency_deployment(measured_llm, budget)
    lose(mid_nodes[1])
    deployment = deployment_reconcile(deployment_id=deployment.pk)
    assert deployment.status == Deployment.Status.DEGRADED and says in deployment.status_message
    assert not deployment.events.filter(kind=DeploymentEvent.Kind.DEGRADED_PLAN).exists()
    assert deployment.events.get(kind=DeploymentEvent.Kind.REPLAN_FAILED)
    (served,) = served_models_from_deployments()
    assert served.cannot_serve  # the gateway answers 503 with Retry-After at once (admission.py)
