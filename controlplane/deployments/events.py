"""Events: what happened to deployments and nodes, recorded once, when it happened.

``event_record`` is the one writer of ``DeploymentEvent``. The controller calls it at its
transitions (docs/deployments.md, "Events"): a revision applied (``desired_state``), a status that
changed in ``reconcile`` (READY, DEGRADED, FAILED, STOPPED) and a failed re-plan, an operator's stop
and drain (``services``), a node SUSPECT, LOST, back or re-registered (``liveness``). Other parts of
the control plane record theirs the same way (calibration: ``CALIBRATED``; a throttled device:
``THROTTLED``; policy decisions: ``POLICY``), each only when something changed, never per heartbeat.

It writes in the caller's transaction, so a decision rolled back leaves no event behind. Retention:
each deployment (and the fleet, for events of no deployment) keeps its newest ``MOTLEY_EVENTS_KEEP``
events, and none older than ``MOTLEY_EVENTS_RETENTION_DAYS``, pruned as events are recorded.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import QuerySet

from controlplane.deployments.models import Deployment, DeploymentEvent
from controlplane.inventory.models import Node

Kind = DeploymentEvent.Kind

# What each status reconcile sets is recorded as (PENDING and DEPLOYING: the revision's "applied").
STATUS_KINDS = {
    Deployment.Status.READY: Kind.READY,
    Deployment.Status.DEGRADED: Kind.DEGRADED,
    Deployment.Status.FAILED: Kind.FAILED,
    Deployment.Status.STOPPED: Kind.STOPPED,
}


def event_record(
    *, kind: str, message: str, deployment: Deployment | None = None, node: Node | str | None = None,
    device: str | None = None, detail: dict[str, Any] | None = None,
) -> DeploymentEvent:
    """Record one event (``kind`` a ``DeploymentEvent.Kind``) and prune what retention drops.

    ``node`` is a node or its name, ``device`` a device name ("<node>/gpu<i>", its node filled in when
    not given); ``detail`` a small JSON object (figures, names) the message summarises.
    """
    if kind not in Kind.values:
        raise ValueError(f"unknown event kind {kind!r}; one of {', '.join(Kind.values)}")
    node_name = node.name if isinstance(node, Node) else node
    if device and not node_name:
        node_name = device.split("/", 1)[0]
    event = DeploymentEvent.objects.create(
        kind=kind, message=message, deployment=deployment, node=node_name, device=device, detail=detail or {},
    )
    _prune(deployment_id=event.deployment_id, now=event.at)
    return event


def _prune(*, deployment_id: int | None, now) -> None:
    oldest = now - timedelta(days=settings.MOTLEY_EVENTS_RETENTION_DAYS)
    DeploymentEvent.objects.filter(at__lt=oldest).delete()
    beyond = DeploymentEvent.objects.filter(deployment_id=deployment_id).order_by("-at", "-id").values_list(
        "pk", flat=True)[settings.MOTLEY_EVENTS_KEEP:]
    extra = list(beyond)
    if extra:
        DeploymentEvent.objects.filter(pk__in=extra).delete()


def event_list() -> QuerySet[DeploymentEvent]:
    """Every kept event, newest first, with its deployment's name at hand (one query a page)."""
    return DeploymentEvent.objects.select_related("deployment").order_by("-at", "-id")
