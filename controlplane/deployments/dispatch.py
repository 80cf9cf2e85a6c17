"""Messages the controller sends: tasks to agents' queues and reconcile requests to itself.

Every task is sent by its name (``contracts/tasks.py``) with ``send_task``: sending one imports
nothing of the module that runs it, so the controller's services never import their own Celery
interface (``tasks.py`` imports them, not the reverse). The app is the control plane's own
(``controlplane/celery.py``), named explicitly: Celery's ``current_app`` in a process that never
imported it, such as the ASGI server, is a default app on another broker. Agent tasks go to the node's own
queue (``contracts.names.node_queue``); reconcile requests to the control plane's default queue.

Everything is sent after the transaction that decided it commits, so a rolled-back decision sends
nothing; a send lost to a crash right after commit is repeated by the next periodic reconcile.
Payloads are JSON keyword arguments.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from contracts.names import node_queue
from contracts.tasks import RECONCILE
from controlplane.celery import app as celery_app
from controlplane.inventory.models import Node


def agent_task_send_on_commit(*, node: Node, name: str, kwargs: dict[str, Any]) -> None:
    """Queue a JSON task on the node's own queue (contracts §3) once the current transaction commits."""
    queue = node_queue(node.pk)
    transaction.on_commit(lambda: _send(name, kwargs=kwargs, queue=queue))


def reconcile_on_commit(*, deployment_id: int) -> None:
    """Ask the control worker to reconcile the deployment once the current transaction commits."""
    transaction.on_commit(lambda: _send(RECONCILE, kwargs={"deployment_id": deployment_id}))


def _send(name: str, *, kwargs: dict[str, Any], **options: Any) -> None:
    celery_app.send_task(name, kwargs=kwargs, serializer="json", **options)
