"""Celery interface of the rebalance policy: the beat's pass over every watched deployment."""

from __future__ import annotations

from celery import shared_task

from contracts import tasks as names
from controlplane.rebalance.card_claims import rebalance_pass


@shared_task(name=names.REBALANCE_EVALUATE)
def rebalance_evaluate_all() -> None:
    """Every READY deployment whose policy is not off, each in its own transactions, the free cards
    shared among competing scale-outs (``card_claims.rebalance_pass``)."""
    rebalance_pass()
