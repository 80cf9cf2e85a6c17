"""Reads of the controller, shaped for the API, the gateway and the periodic tasks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Prefetch, QuerySet

from contracts.names import device_name
from controlplane.deployments.models import Deployment, DeploymentPipeline, DeploymentStage
from controlplane.inventory.models import Device, Node
from controlplane.models_catalog.models import LlmModel
from controlplane.planning import PlanningError, replica_placements


def deployment_list() -> QuerySet[Deployment]:
    return Deployment.objects.select_related("model", "revision").prefetch_related(
        Prefetch("stages", queryset=DeploymentStage.objects.select_related("node", "device__node")),
        "pipelines"
    )


def desired_stages(*, deployment: Deployment) -> list[DeploymentStage]:
    """The wanted stages of the pipelines the deployment ends with once its handovers are done: per
    plan replica the incoming pipeline if one is starting, else the one serving (or reloading) it; an
    outgoing pipeline, or one an incoming pipeline replaces, is on its way out."""
    pipelines = list(deployment.pipelines.all())
    incoming = {p.plan_replica for p in pipelines if p.phase == DeploymentPipeline.Phase.INCOMING}
    kept = {p.index for p in pipelines if p.phase == DeploymentPipeline.Phase.INCOMING
            or p.phase != DeploymentPipeline.Phase.OUTGOING and p.plan_replica not in incoming}
    wanted = deployment.stages.filter(wanted=True).select_related("node").order_by("pipeline", "stage_index")
    return [s for s in wanted if s.pipeline in kept]


def deployment_cannot_serve(*, deployment: Deployment) -> bool:
    """Whether nothing the controller does brings the deployment a replica until the fleet or an
    operator changes something: FAILED, or DEGRADED with a wanted stage still on a lost node (its
    re-plan found nothing that fits, or is off: a re-plan that fits replaces those stages in the pass
    that finds the loss). Reads the stages ``deployment_list`` prefetched."""
    if deployment.status == Deployment.Status.FAILED:
        return True
    return (deployment.status == Deployment.Status.DEGRADED
            and any(stage.wanted and stage.lost for stage in deployment.stages.all()))


def deployment_ids_to_reconcile() -> list[int]:
    return list(Deployment.objects.exclude(status=Deployment.Status.STOPPED).values_list("pk", flat=True))


@dataclass(frozen=True)
class StagePlace:
    """One stage of a pipeline and the device it runs on (``<node>/gpu<i>``; None when unknown): the
    gateway matches them to the agents' telemetry (stage statistics by key, GPU metrics by device)."""

    stage_key: str
    stage_index: int
    device: str | None


@dataclass(frozen=True)
class PipelineHead:
    """Where the gateway sends a pipeline's requests (its head, stage 0) and the token they carry.

    The gateway turns it into its own ``gateway.serving.directory.ReplicaEndpoint``, with routing figures.
    ``pipeline`` is the pipeline's index; ``plan_replica`` the plan replica it serves
    (``priced.replicas[plan_replica]``: its predicted costs and KV); ``serving`` is False while the
    controller hands the pipeline over (a newer pipeline of the same replica takes its place, or its
    changed stages reload in place): the gateway then admits nothing new to it, and a request it still
    runs that breaks is resumed elsewhere. ``kv_tokens``: the smallest KV budget its stages were started
    with (their specs), which is what its head holds; the replica's plan may say otherwise (an emulated
    stage gets the workload's KV, and during a handover the replica already has the new plan).
    ``successor``: of an outgoing pipeline, the one that serves its replica now; the gateway keeps
    routing to the outgoing one until it has heard that one say it is ok.
    """

    pipeline: int
    pipeline_id: str
    head_address: str
    auth_token: str
    ready: bool
    stages: tuple[StagePlace, ...] = ()
    plan_replica: int = 0
    serving: bool = True
    kv_tokens: int | None = None
    successor: str | None = None


def deployment_endpoints(*, deployment: Deployment) -> list[PipelineHead]:
    """Every pipeline of the deployment whose head is wanted; ``ready`` when all its stages reported
    ready and none is lost with its node (its last report says ready, but nothing runs it), ``serving``
    when it is its replica's serving pipeline (an incoming one is not yet, an outgoing or reloading one
    no longer: docs/deployments.md, "Handover (make before break)")."""
    stages = list(deployment.stages.filter(wanted=True).select_related("node", "device__node")
                  .order_by("pipeline", "stage_index"))
    endpoints = []
    pipelines = list(DeploymentPipeline.objects.filter(deployment=deployment).order_by("index"))
    serving = {p.plan_replica: p.pipeline_id for p in pipelines
               if p.phase == DeploymentPipeline.Phase.SERVING}
    for pipeline in pipelines:
        own = [s for s in stages if s.pipeline == pipeline.index]
        if not own or own[0].stage_index != 0:  # none, or an outgoing pipeline whose head was stopped
            continue
        endpoints.append(PipelineHead(
            pipeline=pipeline.index,
            pipeline_id=pipeline.pipeline_id,
            head_address=own[0].spec["head"],
            auth_token=pipeline.auth_token,
            ready=all(s.state == DeploymentStage.State.READY and not s.lost for s in own),
            stages=tuple(
                StagePlace(s.stage_key, s.stage_index, s.device.name if s.device else None) for s in own
            ),
            plan_replica=pipeline.plan_replica,
            serving=pipeline.phase == DeploymentPipeline.Phase.SERVING,
            kv_tokens=min((s.spec["kv_tokens"] for s in own if s.spec.get("kv_tokens")), default=None),
            successor=(serving.get(pipeline.plan_replica)
                       if pipeline.phase == DeploymentPipeline.Phase.OUTGOING else None),
        ))
    return endpoints


def plan_deploy_blockers(
    *, model: LlmModel, plan_data: Any, deployment: Deployment | None = None
) -> list[str]:
    """Why deploying ``plan_data`` (as a new deployment, or applying it to ``deployment``, whose own
    devices are then free to it) would be refused now; empty when nothing in the inventory stands in
    the way. What a preview shows before the operator applies anything."""
    blockers = [] if model.has_weights else [planning_only_message(model)]
    return blockers + plan_devices(plan_data, busy=devices_in_use(deployment=deployment), exclude_nodes=())[1]


def planning_only_message(model: LlmModel) -> str:
    return (f"model {model.name} was registered for planning only (no weights): "
            f"register its checkpoint directory to deploy it")


def plan_devices(
    plan_data: Any, *, busy: dict[str, str], exclude_nodes: tuple[Node, ...]
) -> tuple[dict[str, Device], list[str]]:
    """The plan's devices by name, and every reason one of them cannot take a stage now (``busy``:
    ``devices_in_use`` of the deployment asking)."""
    names = plan_device_names(plan_data)
    devices = {d.name: d for d in Device.objects.select_related("node").filter(node__name__in=[
        name.split("/", 1)[0] for name in names])}
    problems = []
    for name in names:
        device = devices.get(name)
        if device is None:
            problems.append(f"device {name} is not in the inventory")
        elif device.node in exclude_nodes:
            problems.append(f"device {name}: node {device.node.name} is being drained")
        elif (unavailable := device.node.unavailable_reason()) is not None:  # lost, cordoned, draining
            problems.append(f"device {name}: node {device.node.name} is {unavailable}")
        elif name in busy:
            problems.append(f"device {name} carries a stage of deployment {busy[name]}")
        elif device.health == Device.Health.UNHEALTHY:
            problems.append(f"device {name} is unhealthy")
        elif not device.node.registered:
            problems.append(f"device {name}: no agent has registered node {device.node.name}")
    return devices, problems


def plan_device_names(plan_data: Any) -> list[str]:
    """The devices a plan (stored, or as the API received it) puts a stage or a tensor-parallel rank on."""
    try:
        return sorted({device for replica in replica_placements(plan_data) for stage in replica
                       for device in (stage.device, *(share.device for share in stage.group))})
    except PlanningError as exc:
        raise ValidationError({"plan": str(exc)}) from None


def devices_in_use(*, deployment: Deployment | None) -> dict[str, str]:
    """Device name -> name of the other deployment whose wanted stage it carries (as its card, or as a
    rank of its tensor-parallel group: a device of the stage's node, ``device_index`` in its spec)."""
    stages = (
        DeploymentStage.objects.filter(wanted=True, deployment__stop_requested=False, device__isnull=False)
        .exclude(deployment=deployment).select_related("device__node", "deployment")
    )
    used = {}
    for stage in stages:
        used[stage.device.name] = stage.deployment.name
        for rank in stage.spec.get("tensor_group") or ():
            used[device_name(stage.device.node.name, rank["device_index"])] = stage.deployment.name
    return used
