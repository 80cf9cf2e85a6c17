"""Desired state: write the stages a checked plan asks for, each with the spec its process must run.

One writer for ``Deployment.revision`` and the desired half of ``DeploymentStage`` (node, device,
port, spec), whoever decided the change: an operator's create or apply, a drain, a rebalance, or
the controller's re-plan after a loss. It decides, per plan replica, how the change is made without
taking serving capacity to zero (make before break): a new pipeline beside the old one when it fits
(``room.py``), else the changed stages reloaded in place, keeping every unchanged stage's row, port
and spec so that only the stages the change touches restart; ``handover.py`` then takes each
handover to its end from ``reconcile``. Specs are built as ``contracts.stage_spec.StageSpec`` and
validated here: a spec the worker would refuse is refused at the controller, before anything is sent.
"""

from __future__ import annotations

import secrets
from dataclasses import asdict
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils import timezone

from contracts.model_profile import ModelProfile
from contracts.stage_spec import DraftLink, SpecError, StageSpec
from controlplane.deployments import dispatch, handover
from controlplane.deployments.events import event_record
from controlplane.deployments.models import (
    Deployment,
    DeploymentEvent,
    DeploymentPipeline,
    DeploymentStage,
    PlanRevision,
)
from controlplane.deployments.revisions import CheckedPlan
from controlplane.deployments.room import room_shortfalls
from controlplane.deployments.serving_switches import serving_switches
from controlplane.deployments.stage_devices import emulation_of, spec_device, tensor_group
from controlplane.inventory.models import Device, Node
from controlplane.planning.plan import StagePlan

# The event each source of a revision is recorded as when applied (an operator's or the planner's: APPLIED).
_APPLIED_KINDS = {PlanRevision.Source.REPLAN: DeploymentEvent.Kind.REPLANNED,
                  PlanRevision.Source.DRAIN: DeploymentEvent.Kind.DRAINED}


def revision_apply(*, deployment: Deployment, checked: CheckedPlan) -> None:
    """Make ``checked`` the deployment's desired state, make before break (handover.py hands over).

    Each plan replica is compared with the pipeline serving it: unchanged, nothing moves; changed, a
    new pipeline is started beside the old one when its stages fit there (``room.py``), else the
    old one reloads its changed stages in place. A pipeline of a replica the plan no longer has is
    drained like a replaced one. A handover already in flight for a replica keeps its new pipeline
    when it matches this plan, else that pipeline is dropped and the replica is decided again.
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
    deployment.save(update_fields=["revision", "last_updated"])
    kind = _APPLIED_KINDS.get(revision.source, DeploymentEvent.Kind.APPLIED)
    event_record(kind=kind, deployment=deployment,
                 message=f"plan revision {revision.number} applied ({revision.get_source_display().lower()})",
                 detail={"revision": revision.number, "source": revision.source})

    pipelines = list(deployment.pipelines.order_by("index"))
    for pipeline in pipelines:
        if pipeline.plan_replica >= len(checked.replicas):
            handover.pipeline_retire(pipeline=pipeline, now=revision.applied_at)
    for plan_replica, stages in enumerate(checked.replicas):
        _replica_apply(deployment=deployment, checked=checked, plan_replica=plan_replica, stages=stages,
                       own=[p for p in pipelines if p.plan_replica == plan_replica], now=revision.applied_at)
    serving = set(deployment.pipelines.filter(phase=DeploymentPipeline.Phase.SERVING)
                  .values_list("plan_replica", flat=True))
    if not serving.issuperset(range(len(checked.replicas))):
        deployment.status = Deployment.Status.DEPLOYING
        deployment.status_message = (f"deploying plan revision {revision.number} "
                                     f"({revision.get_source_display()})")
        deployment.save(update_fields=["status", "status_message", "last_updated"])
    dispatch.reconcile_on_commit(deployment_id=deployment.pk)


Stages = list[tuple[Device, StagePlan]]


def _replica_apply(
    *, deployment: Deployment, checked: CheckedPlan, plan_replica: int, stages: Stages,
    own: list[DeploymentPipeline], now: datetime,
) -> None:
    """Decide one plan replica: nothing, a new pipeline beside the serving one, or a reload in place."""
    current = next((r for r in own if r.phase in handover.HOLDS_REPLICA), None)
    incoming = [r for r in own if r.phase == DeploymentPipeline.Phase.INCOMING]
    if any(_matches(pipeline=r, stages=stages, checked=checked) for r in incoming):
        return  # the handover in flight already goes where this plan wants
    if current is None and incoming:  # nothing serves the replica: change its pipeline where it stands
        for pipeline in incoming[1:]:
            handover.pipeline_abandon(pipeline=pipeline)
        _stages_write(pipeline=incoming[0], checked=checked, stages=stages)
        return
    for pipeline in incoming:
        handover.pipeline_abandon(pipeline=pipeline)
    if current is not None and _matches(pipeline=current, stages=stages, checked=checked):
        return  # it runs this plan already, or a prepared handover in flight goes there
    if current is not None and handover.prepared_abandon(pipeline=current) and _matches(
            pipeline=current, stages=stages, checked=checked):
        return  # the plan is the pipeline as it runs: dropping the prepared change was all
    if current is None:  # a replica no pipeline serves yet (a new deployment, or one more replica)
        _pipeline_start(deployment=deployment, checked=checked, plan_replica=plan_replica, stages=stages,
                        now=now)
        return
    old = list(current.stages())
    lost = [row.stage_key for row in old if row.lost]
    profile = ModelProfile.from_dict(deployment.model.profile)
    shortfalls = [] if lost else room_shortfalls(profile=profile, new=[
        (device, _footprint_spec(stage, device, checked)) for device, stage in stages])
    reason = f"on a lost node: {', '.join(lost)}" if lost else f"no room beside: {'; '.join(shortfalls)}"
    if shortfalls and not lost and _prepare_beside(pipeline=current, checked=checked, stages=stages,
                                                   profile=profile, reason=reason):
        return
    if lost or shortfalls:
        was = {row.stage_index: row.spec for row in old}
        rows = _stages_write(pipeline=current, checked=checked, stages=stages)
        starting = [row.stage_key for row in rows if row.spec != was.get(row.stage_index)]
        handover.reload_started(pipeline=current, starting=starting, reason=reason, now=now)
    else:
        new = _pipeline_start(deployment=deployment, checked=checked, plan_replica=plan_replica,
                              stages=stages, now=now)
        handover.beside_started(old=current, new=new, old_rows=old)


def _matches(*, pipeline: DeploymentPipeline, stages: Stages, checked: CheckedPlan) -> bool:
    """The pipeline runs exactly these stages already (same devices, hence same ports, and same specs),
    or will once its prepared handover is released (its held rows and next specs)."""
    held = {row.stage_index: row for row in pipeline.held_stages()}
    rows = [held.get(row.stage_index, row) for row in pipeline.stages()]
    if [row.device_id for row in rows] != [device.pk for device, _ in stages]:
        return False
    addresses = [_address(row) for row in rows]
    return all(
        (row.next_spec or row.spec) == _stage_spec(pipeline=pipeline, stage=stage, stage_index=i,
                                                   device=device, addresses=addresses,
                                                   checked=checked).to_json()
        for i, (row, (device, stage)) in enumerate(zip(rows, stages))
    )


def _prepare_beside(
    *, pipeline: DeploymentPipeline, checked: CheckedPlan, stages: Stages, profile: ModelProfile, reason: str
) -> bool:
    """Start the stages an in-place handover moves to another node beside the serving pipeline, held
    (contracts §1 ``hold``), when each fits on its new card now; the pipeline keeps serving while they
    load, and the handover's pause (``handover.prepared_release``) is only the rewiring. False, with
    nothing written, when the change does not qualify: no stage moves to another node, one does not
    fit beside, the pipeline's length changes, or a stage that stays on its node changes device."""
    rows = list(pipeline.stages())
    if len(rows) != len(stages):
        return False
    moving = [i for i, (device, _) in enumerate(stages) if device.node_id != rows[i].node_id]
    staying = [i for i in range(len(stages)) if i not in moving]
    if not moving or any(stages[i][0].pk != rows[i].device_id for i in staying):
        return False
    if room_shortfalls(profile=profile, new=[
            (stages[i][0], _footprint_spec(stages[i][1], stages[i][0], checked)) for i in moving]):
        return False
    final = list(rows)
    for i in moving:
        final[i] = _held_row(pipeline=pipeline, stage_index=i, device=stages[i][0])
    addresses = [_address(row) for row in final]
    for i, (row, (device, stage)) in enumerate(zip(final, stages)):
        spec = _stage_spec(pipeline=pipeline, stage=stage, stage_index=i, device=device, addresses=addresses,
                           checked=checked).to_json()
        if i in moving:
            row.spec, row.next_spec = {**spec, "hold": True}, spec
            row.save(update_fields=["spec", "next_spec"])
        elif spec != row.spec:
            row.next_spec = spec
            row.save(update_fields=["next_spec"])
    handover.prepared_started(pipeline=pipeline, held=[final[i] for i in moving],
                              changed=[row for row in final if row.next_spec is not None], reason=reason)
    return True


def _held_row(*, pipeline: DeploymentPipeline, stage_index: int, device: Device) -> DeploymentStage:
    """A stage of ``pipeline`` started on ``device``'s node beside the pipeline (not wanted by it yet)."""
    pipeline.deployment.stages.filter(
        wanted=False, pipeline=pipeline.index, stage_index=stage_index, node=device.node
    ).delete()  # a retired row of the same key on this node: the new start supersedes that process
    return DeploymentStage.objects.create(
        deployment=pipeline.deployment, pipeline=pipeline.index, plan_replica=pipeline.plan_replica,
        stage_index=stage_index, wanted=False, held=True, node=device.node, device=device,
        port=_free_port(node=device.node), spec={},
    )


def _pipeline_start(
    *, deployment: Deployment, checked: CheckedPlan, plan_replica: int, stages: Stages, now: datetime
) -> DeploymentPipeline:
    """A new physical pipeline for ``plan_replica`` (incoming until its stages are ready), on fresh ports."""
    taken = set(deployment.pipelines.values_list("index", flat=True))
    taken |= set(deployment.stages.values_list("pipeline", flat=True))  # stopping stages keep their keys
    index = next(i for i in range(len(taken) + 1) if i not in taken)
    pipeline = DeploymentPipeline.objects.create(
        deployment=deployment, index=index, plan_replica=plan_replica, auth_token=secrets.token_urlsafe(32),
        phase=DeploymentPipeline.Phase.INCOMING, phase_since=now,
    )
    _stages_write(pipeline=pipeline, checked=checked, stages=stages)
    return pipeline


def _stages_write(
    *, pipeline: DeploymentPipeline, checked: CheckedPlan, stages: Stages
) -> list[DeploymentStage]:
    """Write the pipeline's stage rows and specs, keeping each row (so its port) while it stays on its
    node; a stage that moves to another node retires its old row (stopped by reconcile)."""
    deployment = pipeline.deployment
    beyond = deployment.stages.filter(wanted=True, pipeline=pipeline.index, stage_index__gte=len(stages))
    beyond.update(wanted=False)
    rows = [_stage_row(deployment=deployment, pipeline=pipeline.index, stage_index=i, device=device)
            for i, (device, _) in enumerate(stages)]
    addresses = [_address(row) for row in rows]
    for i, (row, (device, stage)) in enumerate(zip(rows, stages)):
        spec = _stage_spec(pipeline=pipeline, stage=stage, stage_index=i, device=device, addresses=addresses,
                           checked=checked)
        row.spec = spec.to_json()
        row.device = device
        row.plan_replica = pipeline.plan_replica
        row.save()
    return rows


def _stage_row(*, deployment: Deployment, pipeline: int, stage_index: int, device: Device) -> DeploymentStage:
    row = deployment.stages.filter(wanted=True, pipeline=pipeline, stage_index=stage_index).first()
    if row is not None and row.node_id == device.node_id:
        return row
    if row is not None:
        row.wanted = False
        row.save(update_fields=["wanted"])
    # A retired row of the same key on this node is replaced: the new start supersedes that process.
    deployment.stages.filter(
        wanted=False, pipeline=pipeline, stage_index=stage_index, node=device.node
    ).delete()
    return DeploymentStage.objects.create(
        deployment=deployment, pipeline=pipeline, stage_index=stage_index, node=device.node, device=device,
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
    *, pipeline: DeploymentPipeline, stage: StagePlan, stage_index: int, device: Device,
    addresses: list[str], checked: CheckedPlan,
) -> StageSpec:
    """The stage spec of contracts §1; emulated devices run on the CPU, paced to the card they stand for
    (``stage_devices.py``). A tensor-parallel stage lists its ranks (``tensor_group``), the first on
    ``device``; its one process starts the others on the same node.

    Its KV pool is ``_kv_tokens``, its host KV tier ``_host_kv_tokens``. The head (stage 0) schedules the
    pipeline: it keeps as many micro-batches in flight as its plan replica was planned with.
    """
    start, end = stage.layers
    micro_batches = checked.micro_batches[pipeline.plan_replica]
    switches = serving_switches(pipeline.deployment)
    draft = switches.pop("draft")
    spec = StageSpec(
        pipeline_id=pipeline.pipeline_id,
        auth_token=pipeline.auth_token,
        model_path=pipeline.deployment.model.path,
        stage_index=stage_index,
        num_stages=len(addresses),
        layers=(start, end),
        listen=addresses[stage_index],
        head=addresses[0],
        next=addresses[stage_index + 1] if stage_index + 1 < len(addresses) else None,
        **stage.precision.fields(),
        device=spec_device(device),
        threads=settings.MOTLEY_STAGE_THREADS,
        kv_tokens=_kv_tokens(stage, device, checked),
        host_kv_tokens=_host_kv_tokens(stage, device, checked),
        batch=checked.batch,
        peer_timeout_s=settings.MOTLEY_STAGE_PEER_TIMEOUT_S,
        emulation=emulation_of(device),
        tensor_group=tensor_group(stage, checked.devices),
        micro_batches=micro_batches if stage_index == 0 else None,
        draft=DraftLink(**draft) if draft is not None else None,
        **switches,
    )
    try:
        spec.validate()
    except SpecError as exc:
        raise ValidationError({"plan": str(exc)}) from None
    return spec


def _footprint_spec(stage: StagePlan, device: Device, checked: CheckedPlan) -> dict[str, Any]:
    """What a plan stage's footprint depends on (room.py's test), as its spec says it: its layers and
    precision, its KV pool and batch, and a group's ranks."""
    return {"layers": list(stage.layers), **stage.precision.fields(),
            "kv_tokens": _kv_tokens(stage, device, checked), "batch": checked.batch,
            "tensor_group": [asdict(rank) for rank in tensor_group(stage, checked.devices)]}


def _kv_tokens(stage: StagePlan, device: Device, checked: CheckedPlan) -> int:
    """The stage's KV pool: the plan's, but only what the workload needs on an emulated device (the host's
    RAM, shared by every emulated stage, stands for the card's memory)."""
    return min(stage.kv_tokens, checked.workload_kv_tokens) if device.emulated else stage.kv_tokens


def _host_kv_tokens(stage: StagePlan, device: Device, checked: CheckedPlan) -> int:
    """The stage's host KV tier: the plan's, at most the workload's KV on an emulated device (whose KV
    pool is in host memory already, like the tier); none for a tensor-parallel stage."""
    if stage.group:
        return 0
    return min(stage.host_kv_tokens, checked.workload_kv_tokens) if device.emulated else stage.host_kv_tokens
