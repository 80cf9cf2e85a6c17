"""Celery interface of the rebalance policy: the beat's pass over every watched deployment."""

from __future__ import annotations

import logging

from celery import shared_task

from contracts import tasks as names
from controlplane.rebalance.selectors import deployment_ids_to_evaluate
from controlplane.rebalance.services import rebalance_evaluate

logger = logging.getLogger(__name__)


@shared_task(name=names.REBALANCE_EVALUATE)
def rebalance_evaluate_all() -> None:
    """Every READY deployment whose policy is not off, each in its own transaction."""
    for deployment_id in deployment_ids_to_evaluate():
        try:
            rebalance_evaluate(deployment_id=deployment_id)
        except Exception:  # one deployment's failure must not starve the others
            logger.exception("rebalance policy: deployment %s failed", deployment_id)
