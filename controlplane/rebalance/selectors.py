"""Reads of the rebalance policy: which deployments it watches, whether a change is in flight, the
proposals shown to operators."""

from __future__ import annotations

from django.db.models import QuerySet

from controlplane.deployments.models import Deployment, DeploymentPipeline
from controlplane.deployments.selectors import deployment_endpoints
from controlplane.rebalance.models import RebalanceProposal


def deployment_ids_to_evaluate() -> list[int]:
    """READY deployments whose policy is not off (the others are not evaluated at all), the highest
    priority first: where two want the last free cards, the first to scale out takes them."""
    return list(Deployment.objects.filter(status=Deployment.Status.READY, stop_requested=False)
                .exclude(rebalance_policy=Deployment.RebalancePolicy.OFF).order_by("-priority", "pk")
                .values_list("pk", flat=True))


def change_in_flight(*, deployment: Deployment) -> bool:
    """A change of placement is under way: the deployment is not READY, a pipeline is in a handover
    (``DeploymentPipeline.phase`` incoming, outgoing or reloading: the deployment stays READY
    meanwhile), a pipeline is not ready, or a stage of a previous plan is still being stopped."""
    if deployment.status != Deployment.Status.READY or deployment.stop_requested:
        return True
    if deployment.stages.filter(wanted=False).exists():
        return True
    if deployment.pipelines.exclude(phase=DeploymentPipeline.Phase.SERVING).exists():
        return True
    return any(not head.ready for head in deployment_endpoints(deployment=deployment))


def proposals_of(*, deployment: Deployment, status: str | None = None) -> QuerySet[RebalanceProposal]:
    """The deployment's proposals, newest first (of one status, if given)."""
    found = RebalanceProposal.objects.filter(deployment=deployment).select_related("revision", "decided_by")
    return found.filter(status=status) if status else found
