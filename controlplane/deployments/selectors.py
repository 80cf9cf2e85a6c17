"""Reads of the controller, shaped for the API, the gateway and the periodic tasks."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Prefetch, QuerySet

from controlplane.deployments.models import Deployment, DeploymentReplica, DeploymentStage


def deployment_list() -> QuerySet[Deployment]:
    return Deployment.objects.select_related("model", "revision").prefetch_related(
        Prefetch("stages", queryset=DeploymentStage.objects.select_related("node", "device__node"))
    )


def deployment_ids_to_reconcile() -> list[int]:
    return list(Deployment.objects.exclude(status=Deployment.Status.STOPPED).values_list("pk", flat=True))


@dataclass(frozen=True)
class ReplicaEndpoint:
    """Where the gateway sends a replica's requests (its stage 0) and the token they carry."""

    replica: int
    pipeline_id: str
    head_address: str
    auth_token: str
    ready: bool


def deployment_endpoints(*, deployment: Deployment) -> list[ReplicaEndpoint]:
    """Every replica of the deployment's desired plan; ``ready`` when all its stages reported ready."""
    stages = list(deployment.stages.filter(wanted=True).order_by("replica", "stage_index"))
    endpoints = []
    for replica in DeploymentReplica.objects.filter(deployment=deployment).order_by("index"):
        own = [s for s in stages if s.replica == replica.index]
        if not own:
            continue
        endpoints.append(ReplicaEndpoint(
            replica=replica.index,
            pipeline_id=replica.pipeline_id,
            head_address=own[0].spec["head"],
            auth_token=replica.auth_token,
            ready=all(s.state == DeploymentStage.State.READY for s in own),
        ))
    return endpoints


def stages_wanted_on(*, node_id: int) -> QuerySet[DeploymentStage]:
    """What a node's agent should be running, for an agent that asks after a restart."""
    stages = DeploymentStage.objects.filter(node_id=node_id, wanted=True)
    return stages.order_by("deployment", "replica", "stage_index")
