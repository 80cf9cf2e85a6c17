"""Handover, make before break: how a changed plan replica moves to its new stages without an outage.

``desired_state.revision_apply`` decides each changed replica's mode and starts it here (``beside_started``,
``reload_started``); ``reconcile`` then takes every handover a step further on each pass
(``handovers_advance`` before it starts and stops stages, ``handovers_close`` after), and asks for a
pass itself when the next step falls due, rather than waiting for the beat (docs/deployments.md,
"Handover (make before break)"):

- **beside**: the new pipeline is INCOMING until every stage reported ready, then SERVING, and the
  old one OUTGOING (the switch). The old one keeps admitting for ``MOTLEY_HANDOVER_SWITCH_S``, so
  every gateway has seen the new one; then its head alone is stopped (it stops admitting and
  finishes its in-flight requests), and its other stages only once the head exited or
  ``MOTLEY_HANDOVER_DRAIN_S`` passed, so no relay leaves under a request; then its row goes.
- **in place**: the replica's pipeline is RELOADING (not served) while its changed stages restart, and
  SERVING again once all its stages are ready; that time is the pause.
- **prepared** (in place, when the stages that move to another node fit on their new cards now):
  those start there first, *held* (``DeploymentStage.held``, spec ``hold``: loaded, not joined),
  while the pipeline serves on; once every held one is ready (or one failed), ``prepared_release``
  makes them the pipeline's, retires the rows they replace, gives every other changed stage its
  next spec, and the pipeline is RELOADING as above: the pause is only the rewiring.

Each step is an event, once: ``handover_started``, ``handover_switched``, ``handover_drained``,
``handover_done``.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings

from controlplane.deployments import dispatch
from controlplane.deployments.events import event_record
from controlplane.deployments.models import Deployment, DeploymentEvent, DeploymentPipeline, DeploymentStage

Phase = DeploymentPipeline.Phase
Kind = DeploymentEvent.Kind
HOLDS_REPLICA = (Phase.SERVING, Phase.RELOADING)  # the pipeline a replica's changes are compared with
_GONE = (DeploymentStage.State.EXITED, DeploymentStage.State.FAILED)
_PLACEMENT = ("layers", "bits", "low_bits", "low_from", "kv_tokens", "micro_batches")


def beside_started(
    *, old: DeploymentPipeline, new: DeploymentPipeline, old_rows: list[DeploymentStage]
) -> None:
    """A new pipeline was started beside ``old`` (whose rows were ``old_rows``) for the same replica."""
    was = {row.stage_index: row for row in old_rows}
    rows = list(new.stages())
    changed = [row.stage_index for row in rows if row.stage_index not in was
               or _placement(row) != _placement(was[row.stage_index])]
    event_record(
        kind=Kind.HANDOVER_STARTED, deployment=new.deployment,
        message=f"replica r{new.plan_replica}: starting {new.pipeline_id} beside {old.pipeline_id} "
                f"(changed: {_stage_list(changed)})",
        detail={"mode": "beside", "slot": new.plan_replica, "from": old.pipeline_id, "to": new.pipeline_id,
                "starting": [row.stage_key for row in rows], "changed": changed},
    )


def reload_started(*, pipeline: DeploymentPipeline, starting: list[str], reason: str, now: datetime) -> None:
    """``pipeline`` restarts the stages ``starting`` in place (``reason``: why not beside); it is not
    served until they are ready again. A reload already under way keeps its start time."""
    if pipeline.phase != Phase.RELOADING:
        pipeline.phase, pipeline.phase_since = Phase.RELOADING, now
        pipeline.save(update_fields=["phase", "phase_since"])
    event_record(
        kind=Kind.HANDOVER_STARTED, deployment=pipeline.deployment,
        message=f"replica r{pipeline.plan_replica}: reloading {', '.join(starting)} of "
                f"{pipeline.pipeline_id} in place ({reason})",
        detail={"mode": "in_place", "slot": pipeline.plan_replica, "from": pipeline.pipeline_id,
                "to": pipeline.pipeline_id, "starting": starting,
                "changed": sorted(int(key.rsplit("-s", 1)[1]) for key in starting), "reason": reason},
    )


def prepared_started(
    *, pipeline: DeploymentPipeline, held: list[DeploymentStage], changed: list[DeploymentStage], reason: str
) -> None:
    """``held`` start beside ``pipeline``, which serves on; ``changed`` (held ones included) take their
    next spec at the release (``reason``: why the rest is in place, not beside)."""
    where = ", ".join(f"{row.stage_key} on {row.device.name}" for row in held)
    event_record(
        kind=Kind.HANDOVER_STARTED, deployment=pipeline.deployment,
        message=f"replica r{pipeline.plan_replica}: starting {where} beside {pipeline.pipeline_id}, which "
                f"serves on; then reloading in place ({reason})",
        detail={"mode": "in_place", "slot": pipeline.plan_replica, "from": pipeline.pipeline_id,
                "to": pipeline.pipeline_id, "held": [row.stage_key for row in held],
                "starting": sorted({row.stage_key for row in changed}),
                "changed": sorted({row.stage_index for row in changed}), "reason": reason},
    )


def prepared_abandon(*, pipeline: DeploymentPipeline) -> bool:
    """Drop a prepared handover a newer plan does not want: its held stages are retired (reconcile stops
    them), the next specs forgotten; the pipeline serves on as it is. False when none was in flight."""
    rows = DeploymentStage.objects.filter(deployment_id=pipeline.deployment_id, pipeline=pipeline.index)
    held = rows.filter(held=True).update(held=False, next_spec=None)
    return bool(held + rows.filter(next_spec__isnull=False).update(next_spec=None))


def prepared_release(*, pipeline: DeploymentPipeline, rows: list[DeploymentStage], now: datetime) -> None:
    """The held stages are ready (or one failed): they join ``pipeline`` in place of the rows they replace,
    which are retired, every changed stage takes its next spec, and the pipeline reloads in place."""
    held = [row for row in rows if row.held]
    moved = {row.stage_index for row in held}
    _unwant([row for row in rows if row.wanted and row.stage_index in moved])
    for row in rows:
        if row.held or (row.wanted and row.next_spec is not None):
            row.wanted, row.held, row.spec, row.next_spec = True, False, row.next_spec, None
            row.save(update_fields=["wanted", "held", "spec", "next_spec"])
    held_s = max((_seconds(now - row.sent_at) for row in held if row.sent_at), default=0.0)
    pipeline.phase, pipeline.phase_since = Phase.RELOADING, now
    pipeline.save(update_fields=["phase", "phase_since"])
    event_record(kind=Kind.HANDOVER_SWITCHED, deployment=pipeline.deployment,
                 message=f"replica r{pipeline.plan_replica}: {', '.join(row.stage_key for row in held)} "
                         f"ready beside {pipeline.pipeline_id} after {held_s} s; rewiring it in place",
                 detail={"slot": pipeline.plan_replica, "from": [pipeline.pipeline_id],
                         "to": pipeline.pipeline_id, "held": [row.stage_key for row in held],
                         "held_s": held_s})


def pipeline_abandon(*, pipeline: DeploymentPipeline) -> None:
    """Drop an incoming pipeline a newer plan does not want: its stages are stopped, its row goes."""
    rows = DeploymentStage.objects.filter(deployment_id=pipeline.deployment_id, pipeline=pipeline.index)
    rows.update(wanted=False)
    pipeline.delete()


def pipeline_retire(*, pipeline: DeploymentPipeline, now: datetime) -> None:
    """A pipeline of a replica the plan no longer has: dropped if it never served, else drained."""
    if pipeline.phase == Phase.INCOMING:
        pipeline_abandon(pipeline=pipeline)
    elif pipeline.phase != Phase.OUTGOING:
        _outgoing(pipeline, started_at=now, now=now)
        dispatch.reconcile_later(deployment_id=pipeline.deployment_id,
                                 delay_s=settings.MOTLEY_HANDOVER_SWITCH_S)


def handovers_advance(*, deployment: Deployment, now: datetime) -> None:
    """Switch each replica whose incoming pipeline is ready, end each reload whose stages are ready, and
    take each outgoing pipeline a step through its drain (stage rows are marked unwanted here;
    reconcile stops them)."""
    pipelines = list(deployment.pipelines.order_by("index"))
    rows = _rows_by_pipeline(deployment)
    for pipeline in pipelines:
        wanted = [row for row in rows[pipeline.index] if row.wanted]
        ready = bool(wanted) and all(_ready(row) for row in wanted)
        held = [row for row in rows[pipeline.index] if row.held]
        if pipeline.phase == Phase.SERVING and held and all(
                row.state in _GONE or row.lost or _ready(row) for row in held):
            prepared_release(pipeline=pipeline, rows=rows[pipeline.index], now=now)
        elif pipeline.phase == Phase.INCOMING and ready:
            old = [p for p in pipelines
                   if p.plan_replica == pipeline.plan_replica and p.phase in HOLDS_REPLICA]
            _switch(new=pipeline, old=old, now=now)
        elif pipeline.phase == Phase.RELOADING and ready:
            pause_s = _seconds(now - pipeline.phase_since)
            pipeline.phase, pipeline.phase_since = Phase.SERVING, now
            pipeline.save(update_fields=["phase", "phase_since"])
            event_record(kind=Kind.HANDOVER_DONE, deployment=deployment,
                         message=f"replica r{pipeline.plan_replica}: {pipeline.pipeline_id} serves again "
                                 f"after a {pause_s} s pause (in place)",
                         detail={"mode": "in_place", "slot": pipeline.plan_replica,
                                 "pipeline": pipeline.pipeline_id, "total_s": pause_s, "pause_s": pause_s})
    for pipeline in pipelines:
        if pipeline.phase == Phase.OUTGOING:
            _drain_step(pipeline, rows[pipeline.index], now)


def handovers_close(*, deployment: Deployment, now: datetime) -> None:
    """Forget each drained outgoing pipeline whose every stage is gone: the handover is done."""
    rows = _rows_by_pipeline(deployment)
    serving = {p.plan_replica: p for p in deployment.pipelines.filter(phase=Phase.SERVING)}
    for pipeline in deployment.pipelines.filter(phase=Phase.OUTGOING, drained_at__isnull=False):
        if rows[pipeline.index]:
            continue
        pipeline.delete()
        total_s = _seconds(now - pipeline.handover_started_at)
        successor = serving.get(pipeline.plan_replica)
        mode = "beside" if successor else "removed"
        how = f"{successor.pipeline_id} serves it" if successor else "the plan has no such replica any more"
        event_record(kind=Kind.HANDOVER_DONE, deployment=deployment,
                     message=f"replica r{pipeline.plan_replica}: {pipeline.pipeline_id} gone, {how} "
                             f"({total_s} s after the apply, no pause)",
                     detail={"mode": mode, "slot": pipeline.plan_replica, "pipeline": pipeline.pipeline_id,
                             "total_s": total_s, "pause_s": 0.0})


def handover_summary(pipelines: list[DeploymentPipeline]) -> str:
    """What is being handed over, replica by replica, for the deployment's status message ('' when
    nothing)."""
    by_replica: dict[int, list[str]] = defaultdict(list)
    for pipeline in sorted(pipelines, key=lambda p: p.index):
        if pipeline.phase != Phase.SERVING:
            by_replica[pipeline.plan_replica].append(f"{pipeline.pipeline_id} {_DOING[pipeline.phase]}")
    return "; ".join(f"handing over replica r{plan_replica}: {', '.join(parts)}"
                     for plan_replica, parts in sorted(by_replica.items()))


_DOING = {Phase.INCOMING: "starting", Phase.OUTGOING: "draining", Phase.RELOADING: "reloading in place"}


def _switch(*, new: DeploymentPipeline, old: list[DeploymentPipeline], now: datetime) -> None:
    """``new`` serves its replica; what served it is outgoing. A replica nothing served before (a new
    deployment, one more replica) simply starts serving: that is no handover."""
    applied_at = new.phase_since
    new.phase, new.phase_since = Phase.SERVING, now
    new.save(update_fields=["phase", "phase_since"])
    if not old:
        return
    pause_s = max((_seconds(now - r.phase_since) for r in old if r.phase == Phase.RELOADING), default=0.0)
    for pipeline in old:
        _outgoing(pipeline, started_at=applied_at, now=now)
    since_apply_s = _seconds(now - applied_at)
    event_record(
        kind=Kind.HANDOVER_SWITCHED, deployment=new.deployment,
        message=f"replica r{new.plan_replica}: {new.pipeline_id} serves instead of "
                f"{', '.join(r.pipeline_id for r in old)}, {since_apply_s} s after the apply "
                f"({'no pause' if not pause_s else f'{pause_s} s pause'})",
        detail={"slot": new.plan_replica, "from": [r.pipeline_id for r in old], "to": new.pipeline_id,
                "since_apply_s": since_apply_s, "pause_s": pause_s},
    )
    dispatch.reconcile_later(deployment_id=new.deployment_id, delay_s=settings.MOTLEY_HANDOVER_SWITCH_S)


def _outgoing(pipeline: DeploymentPipeline, *, started_at: datetime, now: datetime) -> None:
    pipeline.phase, pipeline.phase_since, pipeline.switched_at = Phase.OUTGOING, now, now
    pipeline.handover_started_at = started_at
    pipeline.save(update_fields=["phase", "phase_since", "switched_at", "handover_started_at"])


def _drain_step(pipeline: DeploymentPipeline, own: list[DeploymentStage], now: datetime) -> None:
    """After the switch window, stop the head; once it exited (or the drain bound passed), the rest.
    A pipeline with a stage on a lost node cannot finish anything: all of it is stopped at once."""
    if pipeline.drained_at is not None:
        return
    wanted = [row for row in own if row.wanted]
    lost = any(row.lost for row in wanted)
    switch_over = now >= pipeline.switched_at + timedelta(seconds=settings.MOTLEY_HANDOVER_SWITCH_S)
    if pipeline.head_stopped_at is None:
        if not (switch_over or lost):
            return
        _unwant([row for row in wanted if row.stage_index == 0])
        pipeline.head_stopped_at = now
        pipeline.save(update_fields=["head_stopped_at"])
        dispatch.reconcile_later(deployment_id=pipeline.deployment_id,
                                 delay_s=settings.MOTLEY_HANDOVER_DRAIN_S)
        if not lost:
            return
    head = next((row for row in own if row.stage_index == 0), None)
    head_exited = head is None or head.state in _GONE or head.lost
    timed_out = now >= pipeline.head_stopped_at + timedelta(seconds=settings.MOTLEY_HANDOVER_DRAIN_S)
    if not (head_exited or timed_out or lost):
        return
    _unwant(wanted)
    pipeline.drained_at = now
    pipeline.save(update_fields=["drained_at"])
    drain_s = _seconds(now - pipeline.head_stopped_at)
    why = "a stage's node is lost" if lost else "its head exited" if head_exited else "the drain bound passed"
    event_record(kind=Kind.HANDOVER_DRAINED, deployment=pipeline.deployment,
                 message=f"replica r{pipeline.plan_replica}: {pipeline.pipeline_id} stopped, {why} "
                         f"({drain_s} s drain)",
                 detail={"slot": pipeline.plan_replica, "pipeline": pipeline.pipeline_id, "drain_s": drain_s,
                         "head_exited": head_exited, "lost": lost})


def _ready(row: DeploymentStage) -> bool:
    """Ready with the spec it is meant to run: a stage rewritten in place still reports its old spec."""
    return row.state == row.State.READY and row.sent_spec == row.spec and not row.lost


def _unwant(rows: list[DeploymentStage]) -> None:
    DeploymentStage.objects.filter(pk__in=[row.pk for row in rows]).update(wanted=False)
    for row in rows:
        row.wanted = False


def _rows_by_pipeline(deployment: Deployment) -> defaultdict[int, list[DeploymentStage]]:
    rows: defaultdict[int, list[DeploymentStage]] = defaultdict(list)
    for row in deployment.stages.select_related("node"):
        rows[row.pipeline].append(row)
    return rows


def _placement(row: DeploymentStage) -> tuple:
    return (row.device_id, *(row.spec.get(field) for field in _PLACEMENT))


def _stage_list(indexes: list[int]) -> str:
    return ", ".join(f"s{i}" for i in indexes) or "wiring only"


def _seconds(delta: timedelta) -> float:
    return round(delta.total_seconds(), 3)
