"""Messages the controller sends: tasks to agents' queues and reconcile requests to itself.

Both go through ``controlplane/common/task_sending.py`` (by name, JSON, after commit), so the
controller's services never import their own Celery interface (``tasks.py`` imports them, not the
reverse) and a rolled-back decision sends nothing.
"""

from __future__ import annotations

from typing import Any

from contracts.tasks import RECONCILE
from controlplane.common import task_sending
from controlplane.inventory.models import Node
from controlplane.inventory.selectors import node_incarnation


def agent_task_send_on_commit(*, node: Node, name: str, kwargs: dict[str, Any]) -> None:
    """Queue a JSON task on the node's own queue (contracts §3) once the current transaction commits."""
    task_sending.agent_task_send_on_commit(node_id=node.pk, name=name, kwargs=kwargs,
                                           incarnation=lambda: node_incarnation(node_id=node.pk))


def reconcile_on_commit(*, deployment_id: int) -> None:
    """Ask the control worker to reconcile the deployment once the current transaction commits."""
    task_sending.task_send_on_commit(name=RECONCILE, kwargs={"deployment_id": deployment_id})


def reconcile_later(*, deployment_id: int, delay_s: float) -> None:
    """Ask for a reconcile ``delay_s`` seconds after the current transaction commits: a handover's
    next step is due then (a switch window or a drain bound ending), sooner than the periodic pass."""
    task_sending.task_send_on_commit(name=RECONCILE, kwargs={"deployment_id": deployment_id},
                                     countdown=max(0.0, delay_s))
