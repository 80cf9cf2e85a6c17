"""The controller's loop: compare a deployment's desired and observed state, act, and set its status.

Kubernetes-style and level-triggered: ``deployment_reconcile`` looks only at what is stored now,
never at what changed, so running it again with nothing new sends nothing, and a message lost with
a broker is sent again by a later pass. It is the only sender of stage starts and stops, and the one
place that reacts to a lost node: the deployment turns DEGRADED and, when allowed, is re-planned on
what is left (the re-plan goes through the same check and writer as an operator's apply), on fewer
or shorter sequences when the plan's do not fit (degrade.py); a deployment serving such a degraded
plan gets its full plan back as soon as it fits again (``_restore_full_plan``).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from contracts.model_profile import ModelProfile
from contracts.tasks import START_STAGE, STOP_STAGE
from controlplane.deployments import dispatch, handover
from controlplane.deployments.degrade import (
    degraded_workload,
    precision_text,
    workload_shown,
    workload_text,
)
from controlplane.deployments.desired_state import revision_apply
from controlplane.deployments.events import STATUS_KINDS, event_record
from controlplane.deployments.models import (
    Deployment,
    DeploymentEvent,
    DeploymentPipeline,
    DeploymentStage,
    PlanRevision,
)
from controlplane.deployments.revisions import plan_revision_check, replan_revision_create
from controlplane.deployments.room import room_shortfalls, spec_device_ids
from controlplane.deployments.serving_switches import serving_switches_stale, serving_switches_write
from controlplane.planning import PlanningError

logger = logging.getLogger(__name__)


@transaction.atomic
def deployment_reconcile(*, deployment_id: int) -> Deployment:
    """Compare desired and observed state and act; a second run with nothing new sends nothing.

    Starts (or restarts, when its spec changed or its node's agent restarted) each wanted stage,
    stops retired ones, forgets those confirmed stopped or lost with their node, re-plans around a
    LOST node when the deployment allows it, and sets the status from what the stages report.
    """
    # of self: PostgreSQL cannot lock the nullable revision's side of the join
    locked = Deployment.objects.select_for_update(of=("self",), no_key=True)
    deployment = locked.select_related("revision", "model").get(pk=deployment_id)
    was_message = deployment.status_message
    now = timezone.now()
    start_timeout = timedelta(seconds=settings.MOTLEY_STAGE_START_TIMEOUT_S)
    if not deployment.stop_requested:
        handover.handovers_advance(deployment=deployment, now=now)
        if serving_switches_stale(deployment=deployment):  # its draft's pipeline changed
            serving_switches_write(deployment=deployment)
    target = getattr(deployment, "drafting_for", None)
    if target is not None and serving_switches_stale(deployment=target):  # this draft's pipeline changed
        dispatch.reconcile_on_commit(deployment_id=target.pk)
    rows = list(deployment.stages.select_related("node", "device", "sent_device"))
    leaving = _leaving_by_device(rows)
    # Loads nobody waits for (a pipeline beside a serving one, a held stage) yield the CPU
    # (agents/load_priority.py); one in an in-place handover's pause does not.
    beside = set(deployment.pipelines.filter(phase=DeploymentPipeline.Phase.INCOMING)
                 .values_list("index", flat=True))
    for row in rows:
        lost = row.lost
        if not row.wanted and not (row.held and not deployment.stop_requested):
            if lost or row.sent_at is None or row.state in (row.State.EXITED, row.State.FAILED):
                row.delete()
            elif row.stop_sent_at is None or row.stop_sent_at < now - start_timeout:
                _stage_stop(row=row, now=now)
            continue
        if lost:
            continue
        changed = row.sent_spec != row.spec or row.sent_incarnation != row.node.incarnation
        unconfirmed = (
            row.state == row.State.PENDING and row.sent_at is not None and row.sent_at < now - start_timeout
        )
        if changed or unconfirmed or row.state == row.State.EXITED:
            if (blocking := [key for pk in sorted(spec_device_ids(row.device, row.spec))
                             for key in leaving.get(pk, ()) if key != row.stage_key]) and (
                    room_shortfalls(profile=ModelProfile.from_dict(deployment.model.profile),
                                    new=[(row.device, row.spec)], exclude=frozenset({row.pk}))):
                # The leaving stages still hold the memory it needs: the agent would refuse the start.
                # Its own old process goes meanwhile (it is replaced anyway, and in place its pipeline
                # is not served): two stages that swap cards each wait for the other's to leave.
                if row.wanted and row.sent_spec is not None and row.stop_sent_at is None:
                    _stage_stop(row=row, now=now)
                _stage_wait(row=row, message=f"waiting for {', '.join(blocking)} to leave {row.device}")
                continue
            _stage_start(row=row, now=now, background=row.held or row.pipeline in beside)
    if deployment.stop_requested:
        remaining = deployment.stages.count()
        _status_set(deployment, Deployment.Status.STOPPED if not remaining else deployment.status,
                    f"stopping: {remaining} stage(s) not yet confirmed stopped" if remaining else "stopped")
        return deployment
    handover.handovers_close(deployment=deployment, now=now)
    if deployment.revision is None:  # nothing desired yet (a deployment row its creation has not filled)
        return deployment
    _status_decide(deployment=deployment, rows=[row for row in rows if row.wanted], was_message=was_message)
    return deployment


def _status_decide(*, deployment: Deployment, rows: list[DeploymentStage], was_message: str) -> None:
    """The status from the pipelines that serve or will serve (an outgoing one counts for nothing):
    READY while every plan replica has a serving pipeline whose stages are all ready, a handover or not
    (its message says what is handed over); DEPLOYING while a replica has no serving pipeline (a new
    deployment, a reload in place); DEGRADED when a serving pipeline lost readiness, a stage is on
    a lost node (then re-planned), or only an incoming pipeline's stage failed (the old one serves on);
    FAILED when a stage failed otherwise."""
    pipelines = list(deployment.pipelines.all())
    outgoing = {p.index for p in pipelines if p.phase == DeploymentPipeline.Phase.OUTGOING}
    wanted = [row for row in rows if row.pipeline not in outgoing]
    lost = [row for row in wanted if row.lost]
    failed = [row for row in wanted if row.state == row.State.FAILED]
    ready = {row.pipeline for row in rows} - {row.pipeline for row in rows if row.state != row.State.READY}
    serving = [p for p in pipelines if p.phase == DeploymentPipeline.Phase.SERVING]
    replicas = set(range(len(deployment.revision.placements)))
    summary = handover.handover_summary(pipelines)
    if lost:
        names = ", ".join(sorted({row.node.name for row in lost}))
        _status_set(deployment, Deployment.Status.DEGRADED, f"stages on lost node(s) {names}")
        if deployment.replan_on_failure:
            _replan_after_loss(deployment=deployment, lost_nodes=names, was_message=was_message)
    elif failed:
        reasons = "; ".join(f"{row.stage_key} failed: {row.message or f'exit code {row.exit_code}'}"
                            for row in failed)
        served = {p.plan_replica for p in serving if p.index in ready}
        replica_of = {p.index: p.plan_replica for p in pipelines}
        if served >= replicas and all(replica_of.get(row.pipeline) in served for row in failed):
            # Only a handover's new pipeline failed: the old one still serves, so the deployment does too.
            _status_set(deployment, Deployment.Status.DEGRADED, f"{summary}; {reasons}")
        else:
            _status_set(deployment, Deployment.Status.FAILED, reasons)
    elif {p.plan_replica for p in serving if p.index in ready} >= replicas:
        _status_set(deployment, Deployment.Status.READY,
                    summary or f"plan revision {deployment.revision.number} ready")
        if deployment.revision.degraded_from is not None and not summary:
            _restore_full_plan(deployment=deployment)
    elif not {p.plan_replica for p in serving} >= replicas:
        reloading = any(p.phase == DeploymentPipeline.Phase.RELOADING for p in pipelines)
        _status_set(deployment, Deployment.Status.DEPLOYING,
                    summary if reloading else deployment.status_message)
    elif deployment.status in (Deployment.Status.READY, Deployment.Status.DEGRADED):
        serving_indexes = {p.index for p in serving}
        waiting = ", ".join(row.stage_key for row in rows
                            if row.pipeline in serving_indexes and row.state != row.State.READY)
        _status_set(deployment, Deployment.Status.DEGRADED, f"not ready: {waiting}")


def _leaving_by_device(rows: list[DeploymentStage]) -> dict[int, list[str]]:
    """Device id -> keys of this deployment's stages whose process still runs there but that are
    leaving it: retired ones (stop sent or to send, not yet confirmed) and ones an in-place re-plan
    moved to another device whose old process is not replaced yet. A stage placed on such a device
    without room beside them starts once they are gone: a stage that moves onto a card another stage
    of the plan is leaving (a drain, an in-place re-plan) would otherwise be refused by the agent's
    admission (room.py, the same test)."""
    leaving: dict[int, list[str]] = {}
    for row in rows:
        if row.lost or row.held or row.sent_at is None or row.state in (row.State.EXITED, row.State.FAILED):
            continue
        if not row.wanted:
            devices = spec_device_ids(row.device, row.sent_spec or row.spec)
        else:  # a tensor-parallel stage's ranks count on their own devices
            devices = (spec_device_ids(row.sent_device, row.sent_spec)
                       - spec_device_ids(row.device, row.spec))
        for pk in sorted(devices):
            leaving.setdefault(pk, []).append(row.stage_key)
    return leaving


def _stage_wait(*, row: DeploymentStage, message: str) -> None:
    if row.message != message:
        row.message = message
        row.save(update_fields=["message"])


def _stage_start(*, row: DeploymentStage, now: datetime, background: bool) -> None:
    dispatch.agent_task_send_on_commit(
        node=row.node, name=START_STAGE,
        kwargs={"stage_key": row.stage_key, "spec": row.spec, "device_index": row.device.index,
                "background": background},
    )
    # Reports about the spec it ran before say nothing about this one (stage_reports.py tells them apart).
    row.state = row.State.PENDING
    row.sent_spec = row.spec
    row.sent_incarnation = row.node.incarnation
    row.sent_at, row.sent_device, row.stop_sent_at = now, row.device, None
    row.save(update_fields=["state", "sent_spec", "sent_incarnation", "sent_at", "sent_device",
                            "stop_sent_at"])


def _stage_stop(*, row: DeploymentStage, now: datetime) -> None:
    dispatch.agent_task_send_on_commit(node=row.node, name=STOP_STAGE, kwargs={"stage_key": row.stage_key})
    row.stop_sent_at = now
    row.save(update_fields=["stop_sent_at"])


def _status_set(deployment: Deployment, status: str, message: str) -> None:
    """Store a status and its message; a status that changed is an event (a message alone is not)."""
    if (deployment.status, deployment.status_message) != (status, message):
        if status != deployment.status and status in STATUS_KINDS:
            event_record(kind=STATUS_KINDS[status], message=message, deployment=deployment,
                         detail={"from": deployment.status})
        deployment.status, deployment.status_message = status, message
        deployment.save(update_fields=["status", "status_message", "last_updated"])


def _replan_after_loss(*, deployment: Deployment, lost_nodes: str, was_message: str) -> None:
    """Plan again on the healthy devices and apply; on failure the deployment stays DEGRADED, saying why.

    The attempt runs in a savepoint: a re-plan that fails leaves no draft behind and sends nothing.
    A failure is an event once: not again while each pass fails for the same reason (``was_message``
    is the message the pass started from).
    """
    try:
        with transaction.atomic():
            revision = replan_revision_create(deployment=deployment, source=PlanRevision.Source.REPLAN,
                                              degrade=True)
            checked = plan_revision_check(revision=revision, deployment=deployment)
            revision_apply(deployment=deployment, checked=checked)
    except (PlanningError, ValidationError) as exc:
        reason = "; ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc)
        deployment.refresh_from_db()  # what the rolled-back attempt set in memory is gone from the database
        message = f"stages on lost node(s) {lost_nodes}; re-plan failed: {reason}"
        if message != was_message:
            event_record(kind=DeploymentEvent.Kind.REPLAN_FAILED, message=message, deployment=deployment,
                         detail={"lost_nodes": lost_nodes.split(", "), "reason": reason})
        _status_set(deployment, Deployment.Status.DEGRADED, message)
    else:
        logger.info("deployment %s re-planned around lost node(s) %s: revision %s",
                    deployment.name, lost_nodes, revision.number)
        if revision.degraded_from is not None:
            _workload_event(deployment=deployment, revision=revision, kind=DeploymentEvent.Kind.DEGRADED_PLAN,
                            why=f"the full plan does not fit without lost node(s) {lost_nodes}")


def _restore_full_plan(*, deployment: Deployment) -> None:
    """Plan the request a degraded revision stands in for and apply it once it fits the fleet (a node
    back, a card freed); while it does not, nothing changes (the attempt runs in a savepoint). Each
    ready pass of a degraded deployment asks the planner once."""
    try:
        with transaction.atomic():
            revision = replan_revision_create(deployment=deployment, source=PlanRevision.Source.REPLAN)
            checked = plan_revision_check(revision=revision, deployment=deployment)
            revision_apply(deployment=deployment, checked=checked)
    except (PlanningError, ValidationError):
        deployment.refresh_from_db()
        return
    _workload_event(deployment=deployment, revision=revision, kind=DeploymentEvent.Kind.RESTORED,
                    why="the full plan fits again")


def _workload_event(*, deployment: Deployment, revision: PlanRevision, kind: str, why: str) -> None:
    """A degraded or restored plan, with the workload planned against the one asked, and the precision
    lowered on the emergency quality budget (``precision``: null when none was)."""
    planned = workload_shown(revision.request)
    shown = degraded_workload(revision) or {"asked": planned, "precision": None}
    asked, precision = shown["asked"], shown["precision"]
    message = f"plan revision {revision.number}: {why}; {workload_text(planned, asked)}"
    event_record(
        kind=kind, deployment=deployment,
        message=f"{message}; {precision_text(precision)}" if precision else message,
        detail={"revision": revision.number, "planned": planned, "asked": asked, "precision": precision},
    )
