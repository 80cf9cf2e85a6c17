"""Sends follow the transaction that decided them: nothing before commit, nothing at all after a rollback."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import transaction

from controlplane import celery
from controlplane.common import task_sending
from controlplane.deployments.liveness import node_heartbeat_record
from controlplane.deployments.models import Deployment, PlanRevision
from controlplane.deployments.reconcile import deployment_reconcile
from controlplane.deployments.services import deployment_create
from controlplane.inventory.models import Node

pytestmark = pytest.mark.django_db(transaction=True)  # sends happen on commit, as in production


class Abandoned(Exception):
    """Raised by a caller after the services decided: the whole transaction rolls back."""


def decide(nodes, revision) -> Deployment:
    """Decisions that send both kinds of message: a reconcile request (create), stage starts
    (reconcile) and a ``sync`` (a LOST node heard from again)."""
    deployment = deployment_create(name="tiny", revision=revision)
    deployment_reconcile(deployment_id=deployment.pk)
    Node.objects.filter(pk=nodes[3].pk).update(status=Node.Status.LOST)
    node_heartbeat_record(node=nodes[3], heartbeat={"stages": []})
    return deployment


def test_a_decision_whose_transaction_rolls_back_sends_nothing(nodes, revision, sent):
    with pytest.raises(Abandoned), transaction.atomic():
        decide(nodes, revision)
        assert sent.tasks == [] and sent.reconciles == []  # nothing leaves before the commit
        raise Abandoned
    assert sent.tasks == [] and sent.reconciles == []
    assert not Deployment.objects.exists() and Node.objects.get(pk=nodes[3].pk).status == Node.Status.READY

    # The same decisions, committed, send each message once the outer transaction commits.
    revision = PlanRevision.objects.get(pk=revision.pk)  # the rolled-back apply left it in memory only
    with transaction.atomic():
        deployment = decide(nodes, revision)
        assert sent.tasks == [] and sent.reconciles == []
    names = sorted((queue, name) for queue, name, _ in sent.take())
    assert names == sorted([(f"node.{n.pk}", "motley.agent.start_stage") for n in nodes[:3]]
                           + [(f"node.{nodes[3].pk}", "motley.agent.sync")])
    assert sent.reconciles == [deployment.pk]



def test_sends_leave_through_the_control_planes_own_celery_app(monkeypatch):
    """Not Celery's ``current_app``, which in a process that never imported the control plane's app
    (the ASGI server) is a default app on another broker: its reconcile requests would be lost."""
    monkeypatch.undo()  # the recorder set aside
    assert task_sending.celery_app is celery.app
    assert task_sending.celery_app.conf.broker_url == settings.CELERY_BROKER_URL


def test_every_thread_sends_through_one_result_backend():
    """ASGI runs each request in a thread of its own: a backend per thread would be built again (every
    installed package's entry points scanned) at every request that sends a task."""
    import threading

    seen = []
    thread = threading.Thread(target=lambda: seen.append(celery.app.backend))
    thread.start()
    thread.join()
    assert seen == [celery.app.backend]
