"""Desired state: write the stages a checked plan asks for, each with the spec its process must run.

One writer for ``Deployment.revision`` and the desired half of ``DeploymentStage`` (node, device,
port, spec), whoever decided the change: an operator's create or apply, a drain, or the
controller's re-plan after a loss. Keeping stage rows, ports and specs stable across revisions is
what makes a change restart only the stages it touches, so that rule lives in one place. Specs are
built as ``contracts.stage_spec.StageSpec`` and validated here: a spec the worker would refuse is
refused at the controller, before anything is sent.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils import timezone

from contracts.stage_spec import Emulation, SpecError, StageSpec
from controlplane.deployments import dispatch
from controlplane.deployments.events import event_record
from controlplane.deployments.models import (
    Deployment,
    DeploymentEvent,
    DeploymentReplica,
    DeploymentStage,
    PlanRevision,
)
from controlplane.deployments.revisions import CheckedPlan
from controlplane.inventory.models import Device, Node

# The event each source of a revision is recorded as when applied (an operator's or the planner's: APPLIED).
_APPLIED_KINDS = {PlanRevision.Source.REPLAN: DeploymentEvent.Kind.REPLANNED,
                  PlanRevision.Source.DRAIN: DeploymentEvent.Kind.DRAINED}


def revision_apply(*, deployment: Deployment, checked: CheckedPlan) -> None:
    """Make ``checked`` the deployment's desired state, keeping each unchanged stage's row, port and spec.

    A stage keeps its row (so its address) while it stays on the same node; a stage that moves to
    another node retires its old row (stopped by reconcile) and gets a new one. Specs are then
    rewritten for every stage: only those whose spec really changed are restarted by reconcile.
    """
    revision = checked.revision
    applied = deployment.revisions.filter(status=PlanRevision.Status.APPLIED)
    applied.update(status=PlanRevision.Status.SUPERSEDED)
    revision.deployment = deployment
    revision.number = (deployment.revisions.exclude(number=None).order_by("-number").values_list(
        "number", flat=True).first() or 0) + 1
    revision.status = PlanRevision.Status.APPLIED
    revision.applied_at = timezone.now()
    revision.save()
    deployment.revision = revision
    deployment.status = Deployment.Status.DEPLOYING
    deployment.status_message = f"deploying plan revision {revision.number} ({revision.get_source_display()})"
    deployment.save(update_fields=["revision", "status", "status_message", "last_updated"])
    kind = _APPLIED_KINDS.get(revision.source, DeploymentEvent.Kind.APPLIED)
    event_record(kind=kind, deployment=deployment,
                 message=f"plan revision {revision.number} applied ({revision.get_source_display().lower()})",
                 detail={"revision": revision.number, "source": revision.source})

    deployment.stages.filter(wanted=True, replica__gte=len(checked.replicas)).update(wanted=False)
    deployment.replicas.filter(index__gte=len(checked.replicas)).delete()
    for index, stages in enumerate(checked.replicas):
        replica, _ = DeploymentReplica.objects.get_or_create(
            deployment=deployment, index=index, defaults={"auth_token": secrets.token_urlsafe(32)}
        )
        beyond = deployment.stages.filter(wanted=True, replica=index, stage_index__gte=len(stages))
        beyond.update(wanted=False)
        rows = [_stage_row(deployment=deployment, replica=index, stage_index=i, device=device)
                for i, (device, _) in enumerate(stages)]
        addresses = [_address(row) for row in rows]
        for i, (row, (device, stage)) in enumerate(zip(rows, stages)):
            spec = _stage_spec(
                replica=replica, stage=stage, stage_index=i, device=device, addresses=addresses,
                checked=checked, micro_batches=checked.micro_batches[index],
            )
            row.spec = spec.to_json()
            row.device = device
            row.save()
    dispatch.reconcile_on_commit(deployment_id=deployment.pk)


def _stage_row(*, deployment: Deployment, replica: int, stage_index: int, device: Device) -> DeploymentStage:
    row = deployment.stages.filter(wanted=True, replica=replica, stage_index=stage_index).first()
    if row is not None and row.node_id == device.node_id:
        return row
    if row is not None:
        row.wanted = False
        row.save(update_fields=["wanted"])
    # A retired row of the same key on this node is replaced: the new start supersedes that process.
    deployment.stages.filter(
        wanted=False, replica=replica, stage_index=stage_index, node=device.node
    ).delete()
    return DeploymentStage.objects.create(
        deployment=deployment, replica=replica, stage_index=stage_index, node=device.node, device=device,
        port=_free_port(node=device.node), spec={},
    )


def _host(node: Node) -> str:
    return node.address or "127.0.0.1"


def _free_port(*, node: Node) -> int:
    """The lowest port of the range no stage on the same host holds (nodes may share a host)."""
    low, high = settings.MOTLEY_STAGE_PORTS
    host = _host(node)
    same_host = {node.address, host} | ({""} if host == "127.0.0.1" else set())
    taken = set(DeploymentStage.objects.filter(node__address__in=same_host).values_list("port", flat=True))
    for port in range(low, high + 1):
        if port not in taken:
            return port
    raise ValidationError({"plan": f"no free stage port left on {host} in {low}-{high}"})


def _address(row: DeploymentStage) -> str:
    return f"tcp://{_host(row.node)}:{row.port}"


def _stage_spec(
    *, replica: DeploymentReplica, stage: dict[str, Any], stage_index: int, device: Device,
    addresses: list[str], checked: CheckedPlan, micro_batches: int,
) -> StageSpec:
    """The stage spec of contracts §1; emulated devices run on the CPU, paced to the card they stand for.

    The planner gives a stage all the KV its device's memory leaves; an emulated device's memory is
    the host's RAM, shared by every emulated stage, so it gets only what the workload needs. The
    head (stage 0) schedules the pipeline: it keeps as many micro-batches in flight as planned.
    """
    start, end = stage["layers"]
    kv_tokens = stage["kv_tokens"]
    if device.emulated:
        kv_tokens = min(kv_tokens, checked.workload_kv_tokens)
    spec = StageSpec(
        pipeline_id=replica.pipeline_id,
        auth_token=replica.auth_token,
        model_path=replica.deployment.model.path,
        stage_index=stage_index,
        num_stages=len(addresses),
        layers=(start, end),
        listen=addresses[stage_index],
        head=addresses[0],
        next=addresses[stage_index + 1] if stage_index + 1 < len(addresses) else None,
        bits=stage["bits"],
        low_bits=stage.get("low_bits"),
        low_from=stage.get("low_from"),
        device="cpu" if device.emulated else f"cuda:{device.index}",
        threads=settings.MOTLEY_STAGE_THREADS,
        kv_tokens=kv_tokens,
        batch=checked.batch,
        peer_timeout_s=settings.MOTLEY_STAGE_PEER_TIMEOUT_S,
        emulation=(
            Emulation(memory_bandwidth_gbs=device.memory_bandwidth_gbs, fp16_tflops=device.fp16_tflops,
                      time_scale=settings.MOTLEY_EMULATION_TIME_SCALE)
            if device.emulated else None
        ),
        micro_batches=micro_batches if stage_index == 0 else None,
    )
    try:
        spec.validate()
    except SpecError as exc:
        raise ValidationError({"plan": str(exc)}) from None
    return spec
