"""Messages the controller sends: tasks to agents' queues and reconcile requests to itself.

Everything is sent after the transaction that decided it commits, so a rolled-back decision sends
nothing; a send lost to a crash right after commit is repeated by the next periodic reconcile.
"""

from __future__ import annotations

from typing import Any

from celery import current_app
from django.db import transaction

from controlplane.inventory.models import Node

START_STAGE = "motley.agent.start_stage"
STOP_STAGE = "motley.agent.stop_stage"
SYNC = "motley.agent.sync"


def node_queue(node: Node) -> str:
    return f"node.{node.pk}"


def agent_task_send_on_commit(*, node: Node, name: str, kwargs: dict[str, Any]) -> None:
    """Queue a JSON task on the node's own queue (contracts §3) once the current transaction commits."""
    queue = node_queue(node)
    transaction.on_commit(
        lambda: current_app.send_task(name, kwargs=kwargs, queue=queue, serializer="json")
    )


def reconcile_on_commit(*, deployment_id: int) -> None:
    def send() -> None:
        from controlplane.deployments.tasks import reconcile  # the tasks module imports the services

        reconcile.delay(deployment_id)

    transaction.on_commit(send)
