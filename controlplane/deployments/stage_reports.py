"""Observed state: what agents report about their stages (contracts §3 ``StageStatus``), stored.

The only writer of a stage row's observed half (state, pid, exit code, restarts, message), whether
the report came as a stage event or inside a heartbeat, one at a time or coalesced. Two rules keep
reports honest and live here once: a node's agent can only speak of stages placed on that node, and
a report about the spec a stage ran before its last start (``spec_digest``: the process may be the
same one, given the new spec in place) says nothing about the new one. A third keeps the
coalesced path from going back in time: a report received before the row was last observed (a
heartbeat noted while the stage was starting, flushed after its "ready" stage event) is skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.utils import timezone

from contracts.names import StageKey, parse_stage_key
from contracts.stage_spec import spec_digest
from controlplane.deployments import dispatch
from controlplane.deployments.models import DeploymentStage
from controlplane.inventory.models import Node

Observed = dict[str, Any]  # the fields of a DeploymentStage a report sets


def stage_report_parse(status: Mapping[str, Any]) -> tuple[StageKey, Observed] | None:
    """The stage a StageStatus is about and the fields it reports, or None if it is unusable
    (not a stage key, an unknown state, or PENDING, which only the controller sets)."""
    key = parse_stage_key(str(status.get("stage_key", "")))
    state = status.get("state")
    if key is None or state not in DeploymentStage.State.values or state == DeploymentStage.State.PENDING:
        return None
    pid = status.get("pid")
    return key, {
        "state": state,
        "pid": pid if isinstance(pid, int) and pid > 0 else None,
        "exit_code": status.get("exit_code") if isinstance(status.get("exit_code"), int) else None,
        "restarts": max(0, int(status.get("restarts") or 0)),
        "message": str(status.get("message") or "")[:2000],
    }


def stage_report_is_news(
    row: DeploymentStage, status: Mapping[str, Any], observed: Observed, received_at: datetime | None = None
) -> bool:
    """Whether ``stage_status_record`` would change ``row`` for this report (received at ``received_at``;
    None: now)."""
    digest = status.get("spec_digest")
    if digest is not None and row.sent_spec is not None and digest != spec_digest(row.sent_spec):
        return False  # about the spec the stage ran before the last start (its process may be the same)
    if received_at is not None and row.observed_at is not None and received_at < row.observed_at:
        return False  # older than what the row already says
    return any(getattr(row, field) != value for field, value in observed.items())


def stage_status_record(
    *, node: Node, status: Mapping[str, Any], received_at: datetime | None = None
) -> None:
    """Store what a node's agent says about one of its stages (contracts §3 StageStatus).

    Only stages placed on ``node`` are looked up, so one node's agent can never change the state of
    another node's stage. A report about the spec the stage ran before its last start is ignored, and
    so is one received (``received_at``, None: now) before the row's ``observed_at``. Reconcile is
    asked to run when the state changed.
    """
    parsed = stage_report_parse(status)
    if parsed is None:
        return
    key, observed = parsed
    row = (
        DeploymentStage.objects.filter(
            node=node, deployment_id=key.deployment_id, pipeline=key.pipeline, stage_index=key.stage_index
        ).order_by("-wanted").first()
    )
    if row is None or not stage_report_is_news(row, status, observed, received_at):
        return
    state_changed = row.state != observed["state"]
    for field, value in observed.items():
        setattr(row, field, value)
    row.observed_at = received_at or timezone.now()
    row.save(update_fields=[*observed, "observed_at"])
    if state_changed:
        dispatch.reconcile_on_commit(deployment_id=key.deployment_id)


def stage_reports_record_news(*, reports: Mapping[Node, tuple[datetime, Iterable[Any]]]) -> None:
    """Record many nodes' stage reports (each node's: the time its heartbeat was received, and the
    reports), writing only those that differ from the stored rows and are not older than them.

    One query reads every reporting node's stages; a report is then recorded through
    ``stage_status_record`` only when it would change a row, so a fleet of unchanged stages costs
    one read (the coalesced heartbeats' path, ``liveness.node_heartbeats_flush``).
    """
    reporting = {node.pk: (node, received_at, list(statuses))
                 for node, (received_at, statuses) in reports.items()}
    reporting = {node_id: entry for node_id, entry in reporting.items() if entry[2]}
    if not reporting:
        return
    stored: dict[tuple[int, int, int, int], list[DeploymentStage]] = {}
    for row in DeploymentStage.objects.filter(node_id__in=reporting):
        stored.setdefault((row.node_id, row.deployment_id, row.pipeline, row.stage_index), []).append(row)
    for node_id, (node, received_at, statuses) in reporting.items():
        for status in statuses:
            parsed = stage_report_parse(status) if isinstance(status, Mapping) else None
            if parsed is None:
                continue
            key, observed = parsed
            rows = stored.get((node_id, *key), ())
            if any(stage_report_is_news(row, status, observed, received_at) for row in rows):
                stage_status_record(node=node, status=status, received_at=received_at)
