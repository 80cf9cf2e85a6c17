"""Writes of the deployment controller: plan revisions, deployments, reconcile and node health.

Each public service runs in one transaction. Operator actions (create, apply, stop, drain) validate
first and change nothing when refused; ``deployment_reconcile`` and ``node_health_check`` are the
level-triggered loops the Celery tasks run.
"""

from __future__ import annotations

import logging
import re
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from contracts.model_profile import ModelProfile
from contracts.routing import DEFAULT_ROUTING_STRATEGY, ROUTING_STRATEGIES
from controlplane.deployments import dispatch
from controlplane.deployments.models import Deployment, DeploymentReplica, DeploymentStage, PlanRevision
from controlplane.deployments.requests import plan_request_from_dict
from controlplane.deployments.selectors import devices_in_use, plan_devices, planning_only_message
from controlplane.inventory.models import Device, Node
from controlplane.inventory.selectors import fleet_spec_from_inventory
from controlplane.models_catalog.models import LlmModel
from controlplane.planning import PlanningError, PlanRequest, plan, plan_to_dict, validate

logger = logging.getLogger(__name__)

STAGE_KEY = re.compile(r"^d(\d+)-r(\d+)-s(\d+)$")


# --- plan revisions -------------------------------------------------------------------------------


def plan_revision_create(
    *, model: LlmModel, plan: dict[str, Any], request: dict[str, Any], source: str, deployment=None
) -> PlanRevision:
    """Store a plan as a DRAFT revision; nothing runs until it is applied to a deployment."""
    if deployment is not None and deployment.model_id != model.pk:
        raise ValidationError({"model": f"the deployment serves {deployment.model}, not {model}"})
    return PlanRevision.objects.create(
        model=model, plan=plan, request=request, source=source, deployment=deployment
    )


@dataclass(frozen=True)
class CheckedPlan:
    """A revision found deployable, with the stages it asks for on the devices as they are now."""

    revision: PlanRevision
    replicas: list[list[tuple[Device, dict[str, Any]]]]  # per replica, per stage: device, priced stage
    workload_kv_tokens: int  # batch x context: the KV one replica's workload needs on every stage
    micro_batches: list[int]  # per replica: micro-batches its head keeps in flight


def plan_revision_check(
    *, revision: PlanRevision, deployment: Deployment | None = None, exclude_nodes: tuple[Node, ...] = ()
) -> CheckedPlan:
    """Whether this revision can be deployed now (by ``deployment``, None for a new one).

    ValidationError lists every reason it cannot. Beyond the planner's own checks (layers, memory,
    precision, pins) a deployment needs weights, and devices whose node has a live agent and that
    no other deployment uses: a device on a LOST or DRAINING node, on a node no agent ever
    registered, or carrying another deployment's stage is refused by name.
    """
    model = revision.model
    if not model.has_weights:
        raise ValidationError({"model": planning_only_message(model)})
    busy = devices_in_use(deployment=deployment)
    devices, problems = plan_devices(revision.plan, busy=busy, exclude_nodes=exclude_nodes)
    if problems:
        raise ValidationError({"plan": problems})
    request = _plan_request(revision=revision, busy=busy, exclude_nodes=exclude_nodes)
    report = validate(revision.plan, request)
    if not report.ok:
        raise ValidationError({"plan": [p.message for p in report.problems]})
    priced = plan_to_dict(report.edited)
    return CheckedPlan(
        revision=revision,
        replicas=[[(devices[s["device"]], s) for s in replica["stages"]] for replica in priced["replicas"]],
        workload_kv_tokens=priced["batch"] * priced["context"],
        micro_batches=[replica["micro_batches"] for replica in priced["replicas"]],
    )


def _plan_request(
    *, revision: PlanRevision, busy: dict[str, str], exclude_nodes: tuple[Node, ...] = ()
) -> PlanRequest:
    """The revision's request on the fleet of registered nodes as it is now (LOST ones down), without
    the ``busy`` devices (``devices_in_use``: those other deployments use)."""
    registered = Node.objects.filter(incarnation__gt=0).values_list("pk", flat=True)
    fleet = fleet_spec_from_inventory(node_ids=registered)
    try:
        return plan_request_from_dict(
            revision.request, fleet=fleet, profile=ModelProfile.from_dict(revision.model.profile),
            exclude_nodes=tuple(n.name for n in exclude_nodes),
            exclude_devices=tuple(busy),
        )
    except PlanningError as exc:
        raise ValidationError({"request": str(exc)}) from None


# --- operator actions -----------------------------------------------------------------------------


@transaction.atomic
def deployment_create(
    *, name: str, revision: PlanRevision, replan_on_failure: bool = True,
    routing_strategy: str = DEFAULT_ROUTING_STRATEGY, created_by=None,
) -> Deployment:
    """Create a deployment whose desired state is ``revision`` and start deploying it."""
    _require_draft(revision)
    _require_strategy(routing_strategy)
    if Deployment.objects.filter(name=name).exists():
        raise ValidationError({"name": f"a deployment named {name!r} exists"})
    checked = plan_revision_check(revision=revision)
    deployment = Deployment.objects.create(
        name=name, model=revision.model, replan_on_failure=replan_on_failure,
        routing_strategy=routing_strategy, created_by=created_by,
    )
    _revision_apply(deployment=deployment, checked=checked)
    return deployment


def _require_strategy(strategy: str) -> None:
    if strategy not in ROUTING_STRATEGIES:
        raise ValidationError({"routing_strategy": f"unknown routing strategy {strategy!r}; "
                                                   f"choose one of {', '.join(ROUTING_STRATEGIES)}"})


@transaction.atomic
def deployment_update(
    *, deployment: Deployment, routing_strategy: str | None = None, replan_on_failure: bool | None = None
) -> Deployment:
    """Change the settings that need no new plan; the gateway picks a new strategy up at its next
    refresh (in-flight requests finish where they are)."""
    deployment = Deployment.objects.select_for_update().get(pk=deployment.pk)
    fields = []
    if routing_strategy is not None:
        _require_strategy(routing_strategy)
        deployment.routing_strategy = routing_strategy
        fields.append("routing_strategy")
    if replan_on_failure is not None:
        deployment.replan_on_failure = replan_on_failure
        fields.append("replan_on_failure")
    if fields:
        deployment.save(update_fields=[*fields, "last_updated"])
    return deployment


@transaction.atomic
def deployment_apply(*, deployment: Deployment, revision: PlanRevision) -> Deployment:
    """Make ``revision`` the desired state; only the stages whose spec changes are restarted."""
    deployment = Deployment.objects.select_for_update().get(pk=deployment.pk)
    if deployment.stop_requested:
        raise ValidationError({"deployment": f"deployment {deployment.name} is stopped"})
    _require_draft(revision)
    if revision.model_id != deployment.model_id:
        raise ValidationError(
            {"revision": f"the plan is for {revision.model}, the deployment serves {deployment.model}"}
        )
    if revision.deployment_id not in (None, deployment.pk):
        raise ValidationError({"revision": "the plan revision belongs to another deployment"})
    checked = plan_revision_check(revision=revision, deployment=deployment)
    _revision_apply(deployment=deployment, checked=checked)
    return deployment


@transaction.atomic
def deployment_stop(*, deployment: Deployment) -> Deployment:
    """Stop every stage; the deployment is STOPPED once each one's agent confirmed (or is lost)."""
    deployment = Deployment.objects.select_for_update().get(pk=deployment.pk)
    deployment.stop_requested = True
    deployment.status_message = "stopping"
    deployment.save(update_fields=["stop_requested", "status_message", "last_updated"])
    deployment.stages.filter(wanted=True).update(wanted=False)
    dispatch.reconcile_on_commit(deployment_id=deployment.pk)
    return deployment


@transaction.atomic
def node_drain(*, node: Node) -> list[Deployment]:
    """Move every stage off ``node`` and keep new ones away; refused if a deployment cannot move.

    Each deployment with a stage on the node is re-planned without it first; only when every
    re-plan is deployable is anything changed.
    """
    node = Node.objects.select_for_update().get(pk=node.pk)
    if node.status == Node.Status.LOST:
        raise ValidationError({"node": f"node {node.name} is lost: there is nothing to drain"})
    on_node = DeploymentStage.objects.filter(node=node, wanted=True, deployment__stop_requested=False)
    affected = list(Deployment.objects.select_for_update().filter(pk__in=on_node.values("deployment_id")))
    checked = []
    for deployment in affected:
        try:
            revision = _replan_revision(
                deployment=deployment, source=PlanRevision.Source.DRAIN, exclude_nodes=(node,)
            )
            plan_check = plan_revision_check(revision=revision, deployment=deployment, exclude_nodes=(node,))
            checked.append((deployment, plan_check))
        except (PlanningError, ValidationError) as exc:
            messages = exc.messages if isinstance(exc, ValidationError) else [str(exc)]
            raise ValidationError(
                {"node": f"cannot drain {node.name}: deployment {deployment.name} does not fit without it: "
                         + "; ".join(messages)}
            ) from None
    node.status = Node.Status.DRAINING
    node.save(update_fields=["status", "last_updated"])
    for deployment, plan_check in checked:
        _revision_apply(deployment=deployment, checked=plan_check)
    return affected


def _require_draft(revision: PlanRevision) -> None:
    if revision.status != PlanRevision.Status.DRAFT:
        raise ValidationError({"revision": f"plan revision {revision.pk} is {revision.status}, not a draft"})


def _replan_revision(
    *, deployment: Deployment, source: str, exclude_nodes: tuple[Node, ...] = ()
) -> PlanRevision:
    """Ask the planner the current revision's question again, on the fleet as it is now."""
    request = _plan_request(revision=deployment.revision, busy=devices_in_use(deployment=deployment),
                            exclude_nodes=exclude_nodes)
    return plan_revision_create(
        model=deployment.model, plan=plan_to_dict(plan(request)), request=deployment.revision.request,
        source=source, deployment=deployment,
    )


def _revision_apply(*, deployment: Deployment, checked: CheckedPlan) -> None:
    """Write the stages ``checked`` asks for, keeping each unchanged stage's row, port and spec.

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
            row.spec = _stage_spec(
                replica=replica, stage=stage, stage_index=i, device=device, addresses=addresses,
                workload_kv_tokens=checked.workload_kv_tokens,
            )
            if i == 0:  # the head schedules the pipeline: as many micro-batches in flight as planned
                row.spec["micro_batches"] = checked.micro_batches[index]
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
    addresses: list[str], workload_kv_tokens: int,
) -> dict[str, Any]:
    """The stage spec of contracts §1; emulated devices run on the CPU, paced to the card they stand for.

    The planner gives a stage all the KV its device's memory leaves; an emulated device's memory is
    the host's RAM, shared by every emulated stage, so it gets only what the workload needs.
    """
    start, end = stage["layers"]
    kv_tokens = min(stage["kv_tokens"], workload_kv_tokens) if device.emulated else stage["kv_tokens"]
    return {
        "pipeline_id": replica.pipeline_id,
        "auth_token": replica.auth_token,
        "model_path": replica.deployment.model.path,
        "stage_index": stage_index,
        "num_stages": len(addresses),
        "layers": [start, end],
        "bits": stage["bits"],
        "low_bits": stage.get("low_bits"),
        "low_from": stage.get("low_from"),
        "dtype": None,
        "device": "cpu" if device.emulated else f"cuda:{device.index}",
        "threads": settings.MOTLEY_STAGE_THREADS,
        "kv_tokens": kv_tokens,
        "listen": addresses[stage_index],
        "next": addresses[stage_index + 1] if stage_index + 1 < len(addresses) else None,
        "head": addresses[0],
        "peer_timeout_s": settings.MOTLEY_STAGE_PEER_TIMEOUT_S,
        "emulation": (
            {"memory_bandwidth_gbs": device.memory_bandwidth_gbs, "fp16_tflops": device.fp16_tflops,
             "time_scale": settings.MOTLEY_EMULATION_TIME_SCALE}
            if device.emulated else None
        ),
    }


# --- reconcile ------------------------------------------------------------------------------------


@transaction.atomic
def deployment_reconcile(*, deployment_id: int) -> Deployment:
    """Compare desired and observed state and act; a second run with nothing new sends nothing.

    Starts (or restarts, when its spec changed or its node's agent restarted) each wanted stage,
    stops retired ones, forgets those confirmed stopped or lost with their node, re-plans around a
    LOST node when the deployment allows it, and sets the status from what the stages report.
    """
    locked = Deployment.objects.select_for_update(of=("self",))  # PostgreSQL: not the nullable revision
    deployment = locked.select_related("revision", "model").get(pk=deployment_id)
    now = timezone.now()
    start_timeout = timedelta(seconds=settings.MOTLEY_STAGE_START_TIMEOUT_S)
    rows = list(deployment.stages.select_related("node", "device"))
    for row in rows:
        lost = _lost(row)
        if not row.wanted:
            if lost or row.sent_at is None or row.state in (row.State.EXITED, row.State.FAILED):
                row.delete()
            elif row.stop_sent_at is None or row.stop_sent_at < now - start_timeout:
                dispatch.agent_task_send_on_commit(node=row.node, name=dispatch.STOP_STAGE,
                                                   kwargs={"stage_key": row.stage_key})
                row.stop_sent_at = now
                row.save(update_fields=["stop_sent_at"])
            continue
        if lost:
            continue
        changed = row.sent_spec != row.spec or row.sent_incarnation != row.node.incarnation
        unconfirmed = (
            row.state == row.State.PENDING and row.sent_at is not None and row.sent_at < now - start_timeout
        )
        if changed or unconfirmed or row.state == row.State.EXITED:
            _stage_start(row=row, now=now, restart=changed and row.sent_spec is not None)
    wanted = [row for row in rows if row.wanted]
    if deployment.stop_requested:
        remaining = deployment.stages.count()
        _status_set(deployment, Deployment.Status.STOPPED if not remaining else deployment.status,
                    f"stopping: {remaining} stage(s) not yet confirmed stopped" if remaining else "stopped")
        return deployment
    lost = [row for row in wanted if _lost(row)]
    failed = [row for row in wanted if row.state == row.State.FAILED]
    if lost:
        names = ", ".join(sorted({row.node.name for row in lost}))
        _status_set(deployment, Deployment.Status.DEGRADED, f"stages on lost node(s) {names}")
        if deployment.replan_on_failure:
            _replan_after_loss(deployment=deployment, lost_nodes=names)
    elif failed:
        reasons = [f"{row.stage_key} failed: {row.message or f'exit code {row.exit_code}'}" for row in failed]
        _status_set(deployment, Deployment.Status.FAILED, "; ".join(reasons))
    elif all(row.state == row.State.READY for row in wanted):
        _status_set(deployment, Deployment.Status.READY, f"plan revision {deployment.revision.number} ready")
    elif deployment.status in (Deployment.Status.READY, Deployment.Status.DEGRADED):
        waiting = ", ".join(row.stage_key for row in wanted if row.state != row.State.READY)
        _status_set(deployment, Deployment.Status.DEGRADED, f"not ready: {waiting}")
    return deployment


def _lost(row: DeploymentStage) -> bool:
    """The stage's node is LOST, or its device disappeared (its agent re-registered without it)."""
    return row.node.status == Node.Status.LOST or row.device_id is None


def _stage_start(*, row: DeploymentStage, now, restart: bool) -> None:
    dispatch.agent_task_send_on_commit(
        node=row.node, name=dispatch.START_STAGE,
        kwargs={"stage_key": row.stage_key, "spec": row.spec, "device_index": row.device.index},
    )
    # Until the new process reports, reports of the one it replaces say nothing about the new spec.
    row.superseded_pid = row.pid if restart else None
    row.state = row.State.PENDING
    row.sent_spec = row.spec
    row.sent_incarnation = row.node.incarnation
    row.sent_at = now
    row.save(update_fields=["superseded_pid", "state", "sent_spec", "sent_incarnation", "sent_at"])


def _status_set(deployment: Deployment, status: str, message: str) -> None:
    if (deployment.status, deployment.status_message) != (status, message):
        deployment.status, deployment.status_message = status, message
        deployment.save(update_fields=["status", "status_message", "last_updated"])


def _replan_after_loss(*, deployment: Deployment, lost_nodes: str) -> None:
    """Plan again on the healthy devices and apply; on failure the deployment stays DEGRADED, saying why."""
    try:
        with transaction.atomic():
            revision = _replan_revision(deployment=deployment, source=PlanRevision.Source.REPLAN)
            checked = plan_revision_check(revision=revision, deployment=deployment)
            _revision_apply(deployment=deployment, checked=checked)
    except (PlanningError, ValidationError) as exc:
        reason = "; ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc)
        _status_set(deployment, Deployment.Status.DEGRADED,
                    f"stages on lost node(s) {lost_nodes}; re-plan failed: {reason}")
    else:
        logger.info("deployment %s re-planned around lost node(s) %s: revision %s",
                    deployment.name, lost_nodes, revision.number)


# --- what agents report ---------------------------------------------------------------------------


def _stage_observed(status: dict[str, Any]) -> tuple[tuple[int, int, int], dict[str, Any]] | None:
    """The (deployment, replica, stage) a StageStatus is about and the fields it reports, or None if unusable."""
    match = STAGE_KEY.match(str(status.get("stage_key", "")))
    state = status.get("state")
    if match is None or state not in DeploymentStage.State.values or state == DeploymentStage.State.PENDING:
        return None
    pid = status.get("pid")
    key = tuple(int(g) for g in match.groups())
    return key, {  # type: ignore[return-value]
        "state": state,
        "pid": pid if isinstance(pid, int) and pid > 0 else None,
        "exit_code": status.get("exit_code") if isinstance(status.get("exit_code"), int) else None,
        "restarts": max(0, int(status.get("restarts") or 0)),
        "message": str(status.get("message") or "")[:2000],
    }


def _stage_report_is_news(row: DeploymentStage, status: dict[str, Any], observed: dict[str, Any]) -> bool:
    """Whether ``stage_status_record`` would change ``row`` for this report."""
    if row.superseded_pid is not None and status.get("pid") == row.superseded_pid:
        return False
    return any(getattr(row, field) != value for field, value in observed.items())


def stage_status_record(*, node: Node, status: dict[str, Any]) -> None:
    """Store what a node's agent says about one of its stages (contracts §3 StageStatus).

    Only stages placed on ``node`` are looked up, so one node's agent can never change the state of
    another node's stage. A report from a process a restart replaced is ignored. Reconcile is asked
    to run when the state changed.
    """
    parsed = _stage_observed(status)
    if parsed is None:
        return
    (deployment_id, replica, stage_index), observed = parsed
    row = (
        DeploymentStage.objects.filter(
            node=node, deployment_id=deployment_id, replica=replica, stage_index=stage_index
        ).order_by("-wanted").first()
    )
    if row is None or not _stage_report_is_news(row, status, observed):
        return
    state_changed = row.state != observed["state"]
    for field, value in observed.items():
        setattr(row, field, value)
    row.superseded_pid = None if row.pid is not None else row.superseded_pid
    row.observed_at = timezone.now()
    row.save(update_fields=[*observed, "superseded_pid", "observed_at"])
    if state_changed:
        dispatch.reconcile_on_commit(deployment_id=deployment_id)


@transaction.atomic
def node_heartbeat_record(*, node: Node, heartbeat: dict[str, Any]) -> None:
    """A heartbeat: the node is alive (a SUSPECT or LOST node is READY again) and its stages as reported.

    A node back from LOST had its stages planned away: it is told which stages are still wanted,
    so its agent kills the rest.
    """
    was = Node.objects.select_for_update().values_list("status", flat=True).get(pk=node.pk)
    back = Node.Status.READY if was in (Node.Status.SUSPECT, Node.Status.LOST) else was
    Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now(), status=back)
    node.status = back
    if was == Node.Status.LOST:
        _node_sync(node=node)
    for status in heartbeat.get("stages") or ():
        if isinstance(status, dict):
            stage_status_record(node=node, status=status)


@dataclass(frozen=True)
class HeartbeatSeen:
    """One coalesced heartbeat for ``node_heartbeats_flush``: the latest a connection received."""

    node_id: int
    incarnation: int  # the connection's credential's
    received_at: Any  # aware datetime
    stages: list[dict[str, Any]]


@transaction.atomic
def node_heartbeats_flush(*, seen: list[HeartbeatSeen]) -> dict[int, str]:
    """Record many heartbeats at once; the reason each refused entry (by index) was refused.

    The agents' socket calls this every ``heartbeat_flush_interval_s()`` for the heartbeats it did
    not record one by one (contracts §3, docs/deployments.md): in one transaction, whatever the
    fleet's size, each node's ``last_heartbeat`` becomes the time its latest heartbeat was received
    (never earlier than what is stored), a SUSPECT or LOST node is READY again (a LOST one is sent
    ``sync``), and each reported stage whose stored state differs from the report is recorded by
    ``stage_status_record``. An entry of a deleted node or an older incarnation changes nothing and
    is refused (its socket is closed).
    """
    nodes = {n.pk: n for n in Node.objects.select_for_update().filter(pk__in={e.node_id for e in seen})}
    refused: dict[int, str] = {}
    latest: dict[int, HeartbeatSeen] = {}
    for i, entry in enumerate(seen):
        node = nodes.get(entry.node_id)
        if node is None:
            refused[i] = "the node was deleted"
        elif node.incarnation != entry.incarnation:
            refused[i] = (f"stale incarnation {entry.incarnation}: node {node.name} re-registered "
                          f"as incarnation {node.incarnation}")
        elif entry.node_id not in latest or latest[entry.node_id].received_at < entry.received_at:
            latest[entry.node_id] = entry
    newer = []
    for node_id, entry in latest.items():
        node = nodes[node_id]
        if node.last_heartbeat is None or node.last_heartbeat < entry.received_at:
            node.last_heartbeat = entry.received_at
            newer.append(node)
    if newer:
        Node.objects.bulk_update(newer, ["last_heartbeat"])
    for node_id in latest:
        node = nodes[node_id]
        if node.status in (Node.Status.SUSPECT, Node.Status.LOST):
            was = node.status
            Node.objects.filter(pk=node.pk).update(status=Node.Status.READY)
            node.status = Node.Status.READY
            if was == Node.Status.LOST:
                _node_sync(node=node)
    reporting = {node_id: entry.stages for node_id, entry in latest.items() if entry.stages}
    if reporting:
        stored: dict[tuple[int, int, int, int], list[DeploymentStage]] = {}
        for row in DeploymentStage.objects.filter(node_id__in=reporting):
            stored.setdefault((row.node_id, row.deployment_id, row.replica, row.stage_index), []).append(row)
        for node_id, stages in reporting.items():
            for status in stages:
                parsed = _stage_observed(status) if isinstance(status, dict) else None
                if parsed is None:
                    continue
                key, observed = parsed
                if any(_stage_report_is_news(row, status, observed) for row in stored.get((node_id, *key), ())):
                    stage_status_record(node=nodes[node_id], status=status)
    return refused


def heartbeat_flush_interval_s() -> float:
    """How often the agents' socket records coalesced heartbeats: half a heartbeat interval, at most 0.5 s.

    ``node_health_check`` compares ``last_heartbeat`` (the time the latest heartbeat was *received*)
    with ``now``: a live node's stored value is at most one heartbeat interval plus this old, well
    inside the SUSPECT threshold (3 intervals by default).
    """
    return getattr(settings, "MOTLEY_NODE_HEARTBEAT_FLUSH_S",
                   min(0.5, settings.MOTLEY_AGENT_HEARTBEAT_INTERVAL_S / 2))


@transaction.atomic
def node_agent_restarted(*, node: Node) -> None:
    """A new incarnation of the node's agent: tell it what is wanted and restart that.

    Retired stages are forgotten (``sync`` kills anything unlisted) and every wanted stage is
    started again; a start of a process the agent still runs with the same spec changes nothing.
    """
    DeploymentStage.objects.filter(node=node, wanted=False).delete()
    DeploymentStage.objects.filter(node=node, wanted=True).update(
        state=DeploymentStage.State.PENDING, sent_spec=None, pid=None, superseded_pid=None
    )
    _node_sync(node=node)


def _node_sync(*, node: Node) -> None:
    wanted = list(DeploymentStage.objects.filter(node=node, wanted=True))
    dispatch.agent_task_send_on_commit(
        node=node, name=dispatch.SYNC, kwargs={"wanted_stage_keys": sorted(row.stage_key for row in wanted)}
    )
    for deployment_id in sorted({row.deployment_id for row in wanted}):
        dispatch.reconcile_on_commit(deployment_id=deployment_id)


@transaction.atomic
def node_health_check() -> list[tuple[Node, str]]:
    """Mark nodes whose heartbeats stopped: SUSPECT after a few missed, LOST after a timeout.

    Only nodes an agent registered are watched (declared nodes have no heartbeat to miss). A LOST
    node's deployments are reconciled at once: they turn DEGRADED and may be re-planned.
    """
    now = timezone.now()
    suspect_before = now - timedelta(
        seconds=settings.MOTLEY_AGENT_HEARTBEAT_INTERVAL_S * settings.MOTLEY_NODE_SUSPECT_MISSED_HEARTBEATS
    )
    lost_before = now - timedelta(seconds=settings.MOTLEY_NODE_LOST_AFTER_S)
    watched = Node.objects.select_for_update().filter(incarnation__gt=0, last_heartbeat__isnull=False)
    changes = []
    for node in watched.filter(last_heartbeat__lt=suspect_before).exclude(status=Node.Status.LOST):
        if node.last_heartbeat < lost_before:
            new = Node.Status.LOST
        elif node.status == Node.Status.READY:
            new = Node.Status.SUSPECT
        else:
            continue
        node.status = new
        node.save(update_fields=["status", "last_updated"])
        changes.append((node, new))
        logger.warning("node %s is %s: last heartbeat %s", node.name, new, node.last_heartbeat)
        if new == Node.Status.LOST:
            for deployment_id in (
                DeploymentStage.objects.filter(node=node).values_list("deployment_id", flat=True).distinct()
            ):
                dispatch.reconcile_on_commit(deployment_id=deployment_id)
    return changes
