"""Node liveness: heartbeats in, READY / SUSPECT / LOST out, and the sync of a node that comes back.

The only writer of what is *seen* of a node: its ``last_heartbeat`` and its ``status``, READY,
SUSPECT or LOST (an agent's registration, too, reaches the node through ``node_agent_restarted``).
What an operator *wants* of a node, its ``intent`` (schedulable, cordoned, draining), is written
only by the node actions (``node_actions.py``), and nothing here reads or writes it (ARCHITECTURE:
"intent and observation are separate fields"): every write below names ``status`` (or
``last_heartbeat``) alone, so a draining node that falls silent is LOST, and READY again when it
heartbeats or its agent registers, and stays draining throughout; nothing is placed on it.

A heartbeat arrives one of two ways (docs/deployments.md, "The agents' websocket"): recorded at
once (``node_heartbeat_record``) or noted and flushed with others (``node_heartbeats_flush``). Both
apply the same rule, written once in ``_heard_from``: a SUSPECT or LOST node is READY again, and a
LOST one (its stages were planned away) is sent ``sync`` so its agent kills what is no longer wanted.

A node falls LOST when its heartbeats stop (``node_health_check``, the beat's), sooner when its agent's
socket closed abnormally, and at once when that close meets a head's report of a broken link to one
of its stages (``node_connection_closed``, ``node_link_broken_record``: whichever comes second acts).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.db.models import Q
from django.utils import timezone

from contracts.names import parse_stage_key
from contracts.tasks import SYNC
from controlplane.deployments import dispatch
from controlplane.deployments.events import event_record
from controlplane.deployments.models import DeploymentEvent, DeploymentStage
from controlplane.deployments.stage_reports import stage_reports_record_news, stage_status_record
from controlplane.inventory.models import Node

logger = logging.getLogger(__name__)

SEEN_AGAIN = (Node.Status.SUSPECT, Node.Status.LOST)  # what a heartbeat turns READY
# A broken link reported this long before the agent's socket closed still tells of its death: which
# of the two reaches the control plane first depends on the loops in between (the relay's heartbeat,
# the head, its agent, two sockets). An older break was something else, such as a stage restarted.
BREAK_BEFORE_CLOSE_S = 2.0
_LIVENESS_KINDS = {Node.Status.SUSPECT: DeploymentEvent.Kind.NODE_SUSPECT,
                   Node.Status.LOST: DeploymentEvent.Kind.NODE_LOST}


@transaction.atomic
def node_heartbeat_record(*, node: Node, heartbeat: dict[str, Any]) -> None:
    """A heartbeat: the node is alive (``_heard_from``) and its stages are as reported."""
    node.status = Node.objects.select_for_update(no_key=True).values_list("status", flat=True).get(pk=node.pk)
    Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now())
    _heard_from(node)
    for status in heartbeat.get("stages") or ():
        if isinstance(status, dict):
            stage_status_record(node=node, status=status)


@dataclass(frozen=True)
class HeartbeatSeen:
    """One coalesced heartbeat for ``node_heartbeats_flush``: the latest a connection received."""

    node_id: int
    incarnation: int  # the connection's credential's
    received_at: datetime  # aware
    stages: list[dict[str, Any]]


@transaction.atomic
def node_heartbeats_flush(*, seen: list[HeartbeatSeen]) -> dict[int, str]:
    """Record many heartbeats at once; the reason each refused entry (by index) was refused.

    The agents' socket calls this every ``heartbeat_flush_interval_s()`` for the heartbeats it did
    not record one by one (contracts §3, docs/deployments.md): in one transaction, whatever the
    fleet's size, each node's ``last_heartbeat`` becomes the time its latest heartbeat was received
    (never earlier than what is stored), each node is heard from (``_heard_from``), and each
    reported stage whose stored state differs from the report is recorded, unless the row was
    observed after the heartbeat was received (a prompt stage event newer than the noted heartbeat
    wins). An entry of a deleted node or an older incarnation changes nothing and is refused (its
    socket is closed).
    """
    # Locked in one order (every multi-row lock is by primary key) and FOR NO KEY UPDATE, which rows
    # inserted with a foreign key to a node (a stage, an event) do not wait for: FOR UPDATE held here
    # deadlocked a drain that held one node and placed stages on the others.
    locked = Node.objects.select_for_update(no_key=True).filter(pk__in={e.node_id for e in seen})
    nodes = {n.pk: n for n in locked.order_by("pk")}
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
        _last_heartbeats_write(newer)
    for node_id in latest:
        _heard_from(nodes[node_id])
    stage_reports_record_news(reports={nodes[node_id]: (entry.received_at, entry.stages)
                                       for node_id, entry in latest.items() if entry.stages})
    return refused


def _last_heartbeats_write(nodes: list[Node]) -> None:
    """Each node's ``last_heartbeat``, as ``bulk_update`` would write it, in one statement run once
    per row (``executemany``): ``bulk_update`` builds and compiles a CASE over every row in Python,
    which at a thousand nodes cost a flush more CPU than everything else the agents' sockets do."""
    connection = connections[Node.objects.db]
    field, quote = Node._meta.get_field("last_heartbeat"), connection.ops.quote_name
    statement = (f"UPDATE {quote(Node._meta.db_table)} SET {quote(field.column)} = %s "
                 f"WHERE {quote(Node._meta.pk.column)} = %s")
    with connection.cursor() as cursor:
        cursor.executemany(statement, [(field.get_db_prep_value(n.last_heartbeat, connection), n.pk)
                                       for n in nodes])


def _heard_from(node: Node) -> None:
    """The liveness rule on a heartbeat, for a node whose ``status`` was read under lock: a SUSPECT or
    LOST node is READY again, and a LOST one is sent ``sync``; any other status is left as it is."""
    if node.status not in SEEN_AGAIN:
        return
    was = node.status
    Node.objects.filter(pk=node.pk).update(status=Node.Status.READY)
    node.status = Node.Status.READY
    event_record(kind=DeploymentEvent.Kind.NODE_BACK, node=node, detail={"was": was},
                 message=f"node {node.name} is back (was {was})")
    if was == Node.Status.LOST:
        _node_sync(node=node)


HEARTBEAT_FLUSH_MAX_S = 0.5


def heartbeat_flush_interval_s() -> float:
    """How often the agents' socket records coalesced heartbeats: half a heartbeat interval, at most
    ``HEARTBEAT_FLUSH_MAX_S``.

    ``node_health_check`` compares ``last_heartbeat`` (the time the latest heartbeat was *received*)
    with ``now``: a live node's stored value is at most one heartbeat interval plus this old, well
    inside the SUSPECT threshold (3 intervals by default).
    """
    return min(HEARTBEAT_FLUSH_MAX_S, settings.MOTLEY_AGENT_HEARTBEAT_INTERVAL_S / 2)


@transaction.atomic
def node_agent_restarted(*, node: Node) -> None:
    """A new incarnation of the node's agent (it registered): the node is alive, told what is wanted,
    and that is started again.

    Registration is a sign of life: the node is READY with a fresh ``last_heartbeat``, whatever it
    was. Retired stages are forgotten (``sync`` kills anything unlisted) and every wanted stage is
    started again; a start of a process the agent still runs with the same spec changes nothing.
    """
    now, was = timezone.now(), node.status
    Node.objects.filter(pk=node.pk).update(status=Node.Status.READY, last_heartbeat=now)
    node.status, node.last_heartbeat = Node.Status.READY, now
    note = "" if was == Node.Status.READY else f"; was {was}"
    event_record(kind=DeploymentEvent.Kind.NODE_REGISTERED, node=node,
                 message=f"agent of node {node.name} registered (incarnation {node.incarnation}{note})",
                 detail={"incarnation": node.incarnation, "was": was})
    DeploymentStage.objects.filter(node=node, wanted=False, held=False).delete()
    DeploymentStage.objects.filter(Q(wanted=True) | Q(held=True), node=node).update(
        state=DeploymentStage.State.PENDING, sent_spec=None, pid=None
    )
    _node_sync(node=node)


def _node_sync(*, node: Node) -> None:
    """Send the node's agent the stage keys still wanted on it (held ones too), and reconcile their
    deployments."""
    wanted = list(DeploymentStage.objects.filter(Q(wanted=True) | Q(held=True), node=node))
    dispatch.agent_task_send_on_commit(
        node=node, name=SYNC, kwargs={"wanted_stage_keys": sorted(row.stage_key for row in wanted)}
    )
    for deployment_id in sorted({row.deployment_id for row in wanted}):
        dispatch.reconcile_on_commit(deployment_id=deployment_id)


@transaction.atomic
def node_connection_closed(*, node_id: int, incarnation: int) -> None:
    """The agents' websocket of this incarnation closed abnormally: remembered for
    ``node_health_check`` (an older incarnation's socket closing says nothing of the node now), and
    the node is LOST at once when a broken link to one of its stages was reported too
    (``_agent_died``)."""
    now = timezone.now()
    if Node.objects.filter(pk=node_id, incarnation=incarnation).update(connection_closed_at=now):
        _lost_if_agent_died(Node.objects.select_for_update(no_key=True).get(pk=node_id), now)


@transaction.atomic
def node_link_broken_record(*, reporter: Node, status: Mapping[str, Any]) -> None:
    """A head's report (``StageStatus.broken_stage``, contracts §3) that its pipeline lost stage k:
    the node of that stage, when it is another node than the head's, is noted (``link_broken_at``)
    and LOST at once when its agent's socket closed abnormally too (``_agent_died``)."""
    key, broken = parse_stage_key(str(status.get("stage_key", ""))), status.get("broken_stage")
    if key is None or key.stage_index != 0 or type(broken) is not int:
        return
    pipeline = {"deployment_id": key.deployment_id, "pipeline": key.pipeline}
    if not DeploymentStage.objects.filter(node=reporter, stage_index=0, **pipeline).exists():
        return  # only a head placed on the reporting node speaks for its pipeline
    lost_nodes = DeploymentStage.objects.filter(stage_index=broken, **pipeline).exclude(node=reporter)
    now = timezone.now()
    locked = Node.objects.select_for_update(no_key=True).filter(pk__in=lost_nodes.values("node_id"))
    for node in locked.order_by("pk"):
        node.link_broken_at = now
        node.save(update_fields=["link_broken_at"])
        _lost_if_agent_died(node, now)


def _agent_died(node: Node) -> bool:
    """Whether the node's agent is known dead: its socket closed abnormally, nothing was heard from it
    since, and a head elsewhere saw its link to one of the node's stages break at most
    ``BREAK_BEFORE_CLOSE_S`` before the close or any time after it.

    Each alone says little: a socket also drops with the network (the agent reconnects within a
    second and heartbeats), and a link also breaks when a stage restarts. Together they are the one
    death seen two ways: the agent's stages die with it (PDEATHSIG), so their neighbours' links
    break as its socket closes. A partition that cuts both is only waited out by the heartbeat
    timeout; this only ends the waiting of ``MOTLEY_NODE_LOST_AFTER_CLOSE_S`` (0 turns both off)."""
    closed, broken = node.connection_closed_at, node.link_broken_at
    if closed is None or broken is None or settings.MOTLEY_NODE_LOST_AFTER_CLOSE_S <= 0:
        return False
    heard = node.last_heartbeat is not None and node.last_heartbeat >= closed
    return not heard and broken >= closed - timedelta(seconds=BREAK_BEFORE_CLOSE_S)


def _lost_if_agent_died(node: Node, now: datetime) -> None:
    """Mark a node read under lock LOST at once when ``_agent_died`` says so."""
    if node.status != Node.Status.LOST and node.incarnation > 0 and _agent_died(node):
        closed_s = (now - node.connection_closed_at).total_seconds()
        _mark(node, Node.Status.LOST, now, f"its agent's connection closed {closed_s:.1f} s ago and a "
                                          "pipeline lost its link to a stage on it")


def _closed_and_unheard(node: Node, now: datetime) -> float | None:
    """Seconds since the node's agent's connection closed, when that is past
    ``MOTLEY_NODE_LOST_AFTER_CLOSE_S``, nothing was heard from it since, and another agent was.

    A socket the kernel closed means the agent process is gone (a live agent reconnects within a
    second and heartbeats, which ends this); the stage processes died with it (PDEATHSIG), so waiting
    out ``MOTLEY_NODE_LOST_AFTER_S`` only stalls the requests of its pipelines. Another agent heard
    since the close tells this apart from the control plane's own server going away, which closes
    every socket at once: then no node is lost sooner than the heartbeat timeout."""
    closed, after = node.connection_closed_at, settings.MOTLEY_NODE_LOST_AFTER_CLOSE_S
    if closed is None or after <= 0 or node.last_heartbeat >= closed:
        return None
    if now - closed < timedelta(seconds=after):
        return None
    others = Node.objects.filter(incarnation__gt=0, last_heartbeat__gt=closed).exclude(pk=node.pk)
    return (now - closed).total_seconds() if others.exists() else None


@transaction.atomic
def node_health_check() -> list[tuple[Node, str]]:
    """Mark nodes whose heartbeats stopped: SUSPECT after a few missed, LOST after a timeout, or
    sooner when the agent's connection closed (``_closed_and_unheard``; at once, without this check,
    when a broken link to one of its stages says its agent died: ``_agent_died``).

    Only nodes an agent registered are watched (declared nodes have no heartbeat to miss). A LOST
    node's deployments are reconciled at once: they turn DEGRADED and may be re-planned.
    """
    now = timezone.now()
    suspect_before = now - timedelta(
        seconds=settings.MOTLEY_AGENT_HEARTBEAT_INTERVAL_S * settings.MOTLEY_NODE_SUSPECT_MISSED_HEARTBEATS
    )
    lost_before = now - timedelta(seconds=settings.MOTLEY_NODE_LOST_AFTER_S)
    watched = Node.objects.select_for_update(no_key=True).filter(
        incarnation__gt=0, last_heartbeat__isnull=False).order_by("pk")
    changes = []
    for node in watched.filter(last_heartbeat__lt=suspect_before).exclude(status=Node.Status.LOST):
        silent_s = round((now - node.last_heartbeat).total_seconds(), 1)
        why = f"no heartbeat for {silent_s} s"
        if node.last_heartbeat < lost_before:
            new = Node.Status.LOST
        elif (closed := _closed_and_unheard(node, now)) is not None:
            new, why = Node.Status.LOST, f"its agent's connection closed {closed:.1f} s ago, {why}"
        elif node.status == Node.Status.READY:
            new = Node.Status.SUSPECT
        else:
            continue
        _mark(node, new, now, why)
        changes.append((node, new))
    return changes


def _mark(node: Node, new: str, now: datetime, why: str) -> None:
    """Write a node's new liveness status, say why (log, event); a LOST node's deployments are
    reconciled at once."""
    node.status = new
    node.save(update_fields=["status", "last_updated"])
    silent_s = round((now - node.last_heartbeat).total_seconds(), 1) if node.last_heartbeat else None
    logger.warning("node %s is %s: %s", node.name, new, why)
    event_record(kind=_LIVENESS_KINDS[new], node=node, message=f"node {node.name} is {new}: {why}",
                 detail={"last_heartbeat": node.last_heartbeat and node.last_heartbeat.isoformat(),
                         "silent_s": silent_s})
    if new == Node.Status.LOST:
        for deployment_id in (
            DeploymentStage.objects.filter(node=node).values_list("deployment_id", flat=True).distinct()
        ):
            dispatch.reconcile_on_commit(deployment_id=deployment_id)
