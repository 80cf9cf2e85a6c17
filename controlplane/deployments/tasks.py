"""Celery interface of the controller: thin wrappers around the services, run on the control queue."""

from __future__ import annotations

import logging

from celery import shared_task

from controlplane.deployments import services
from controlplane.deployments.selectors import deployment_ids_to_reconcile

logger = logging.getLogger(__name__)


@shared_task(name="motley.deployments.reconcile")
def reconcile(deployment_id: int) -> None:
    services.deployment_reconcile(deployment_id=deployment_id)


@shared_task(name="motley.deployments.reconcile_all")
def reconcile_all() -> None:
    """The periodic pass (beat): every deployment that is not STOPPED, each in its own transaction."""
    for deployment_id in deployment_ids_to_reconcile():
        try:
            services.deployment_reconcile(deployment_id=deployment_id)
        except Exception:  # one broken deployment must not starve the others
            logger.exception("reconcile of deployment %s failed", deployment_id)


@shared_task(name="motley.deployments.node_health_check")
def node_health_check() -> None:
    services.node_health_check()
