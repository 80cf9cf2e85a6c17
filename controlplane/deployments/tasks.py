"""Celery interface of the controller: thin wrappers around the services, run on the control queue.

Each task's name comes from ``contracts/tasks.py``, where the sender (``dispatch.py``, the beat
schedule in settings) finds it too: nothing imports this module to send a task.
"""

from __future__ import annotations

import logging

from celery import shared_task

from contracts import tasks as names
from controlplane.deployments import liveness
from controlplane.deployments.reconcile import deployment_reconcile
from controlplane.deployments.selectors import deployment_ids_to_reconcile

logger = logging.getLogger(__name__)


@shared_task(name=names.RECONCILE)
def reconcile(deployment_id: int) -> None:
    deployment_reconcile(deployment_id=deployment_id)


@shared_task(name=names.RECONCILE_ALL)
def reconcile_all() -> None:
    """The periodic pass (beat): every deployment that is not STOPPED, each in its own transaction."""
    for deployment_id in deployment_ids_to_reconcile():
        try:
            deployment_reconcile(deployment_id=deployment_id)
        except Exception:  # one broken deployment must not starve the others
            logger.exception("reconcile of deployment %s failed", deployment_id)


@shared_task(name=names.NODE_HEALTH_CHECK)
def node_health_check() -> None:
    liveness.node_health_check()
