"""Sending Celery tasks from the control plane: by name, as JSON, once the deciding transaction commits.

Every app that tells an agent or the control worker to act sends through here: the controller
(``deployments/dispatch.py``: stage starts and stops, syncs, reconcile requests) and the inventory
(an emulated device's throttle). A task is sent by its name (``contracts/tasks.py``), so the sender
imports nothing of the module that runs it. The app is the control plane's own
(``controlplane/celery.py``), named explicitly: Celery's ``current_app`` in a process that never
imported it, such as the ASGI server, is a default app on another broker.

Sending after commit means a rolled-back decision sends nothing; a send lost to a crash right after
commit is repeated by the next periodic reconcile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import transaction

from contracts.names import node_queue
from controlplane.celery import app as celery_app


def agent_task_send_on_commit(
    *, node_id: int, name: str, kwargs: dict[str, Any], incarnation: Callable[[], int]
) -> str:
    """Queue a JSON task on the node's own queue (contracts §3) once the current transaction commits;
    returns the queue's name.

    The task carries the incarnation of the node's agent as it is when it leaves (``incarnation()``,
    asked after the commit): an agent runs no task of an incarnation older than its own, so a task
    queued before the agent registered again (superseded by the registration's sync) is not run."""
    queue = node_queue(node_id)
    task_send_on_commit(name=name, kwargs=lambda: {**kwargs, "incarnation": incarnation()}, queue=queue)
    return queue


def task_send_on_commit(
    *, name: str, kwargs: dict[str, Any] | Callable[[], dict[str, Any]], queue: str | None = None,
    countdown: float | None = None,
) -> None:
    """Send task ``name`` with JSON keyword arguments (or what ``kwargs()`` gives then) once the
    current transaction commits (``queue`` None: the control plane's default queue; ``countdown``:
    run it that many seconds later)."""
    options: dict[str, Any] = {} if queue is None else {"queue": queue}
    if countdown is not None:
        options["countdown"] = countdown

    def send() -> None:
        arguments = kwargs() if callable(kwargs) else kwargs
        celery_app.send_task(name, kwargs=arguments, serializer="json", **options)

    transaction.on_commit(send)
