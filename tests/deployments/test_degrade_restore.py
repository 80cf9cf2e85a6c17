"""Degrade, then restore, through the controller: three 1 GiB cards serve 4000 sequences of 512 tokens;
with one lost, the re-plan fits only fewer, serves them and says so; the card back, the reconcile loop
plans the full workload again and restores it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from contracts.hardware import GIB
from controlplane.deployments.liveness import node_health_check, node_heartbeat_record
from controlplane.deployments.models import Deployment, DeploymentEvent, PlanRevision
from controlplane.deployments.reconcile import deployment_reconcile
from controlplane.deployments.revisions import plan_revision_create
from controlplane.deployments.services import deployment_create
from controlplane.deployments.stage_reports import stage_status_record
from controlplane.enrollment.services import agent_register, join_token_create
from controlplane.inventory.models import Node
from tests.deployments.conftest import T4, edited_plan, report

pytestmark = pytest.mark.django_db(transaction=True)
SMALL = {**T4, "model": "small", "memory_bytes": GIB}
ASKED = {"batch": 4000, "context": 512, "replicas": 1, "bits": [16]}  # fits three cards, not two


@pytest.fixture(autouse=True)
def short_timeouts(settings):
    settings.MOTLEY_AGENT_HEARTBEAT_INTERVAL_S = 1.0
    settings.MOTLEY_NODE_LOST_AFTER_S = 10.0


@pytest.fixture
def small_nodes(db, sent) -> list[Node]:
    secret = join_token_create(ttl=timedelta(hours=1)).secret
    registered = [agent_register(join_token=secret, name=f"n{i}", address="127.0.0.1", emulated=True,
                                 devices=[SMALL]).node for i in range(3)]
    sent.take()
    return registered


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
    Node.objects.filter(pk=small_nodes[1].pk).update(last_heartbeat=timezone.now() - timedelta(seconds=11))
    node_health_check()

    deployment = serve(deployment)
    degraded = deployment.revision
    assert degraded.source == PlanRevision.Source.REPLAN and degraded.degraded_from == ASKED
    assert 1 <= degraded.request["batch"] < 4000 and degraded.request["context"] == 512
    event = deployment.events.get(kind=DeploymentEvent.Kind.DEGRADED_PLAN)
    assert event.detail["asked"] == {"batch": 4000, "context": 512}
    assert event.detail["planned"] == {"batch": degraded.request["batch"], "context": 512}
    assert f"batch {degraded.request['batch']} of 4000" in event.message
    assert deployment_reconcile(deployment_id=deployment.pk).revision == degraded  # n1 still lost: kept
    batch = degraded.request["batch"]
    shown = {"planned": {"batch": batch, "context": 512}, "asked": {"batch": 4000, "context": 512}}
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
    assert event.detail["planned"] == event.detail["asked"] == {"batch": 4000, "context": 512}
    assert kinds(deployment).count("restored") == 1
    assert admin_client.get(f"/api/v1/deployments/{deployment.pk}/").json()["degraded"] is None
