"""Writes of enrollment: issuing and revoking join tokens, registering agents."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from contracts.hardware import DeviceSpec, FleetSpec, NodeSpec
from contracts.names import device_name
from controlplane.audit.services import SYSTEM, Actor, audit_record
from controlplane.deployments.liveness import (
    node_agent_restarted,
    node_heartbeat_record,
    node_link_broken_record,
)
from controlplane.deployments.stage_reports import stage_status_record
from controlplane.enrollment.models import JoinToken, NodeCredential
from controlplane.inventory.models import Node
from controlplane.inventory.services import fleet_import

JOIN_TOKEN_PREFIX = "mjt_"
DEVICE_FIELDS = {f.name for f in fields(DeviceSpec)} - {"name", "node", "down"}


class JoinTokenRefused(Exception):
    """The join token is unknown, expired or revoked; the message says which (never the token)."""


def secret_digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class IssuedJoinToken:
    join_token: JoinToken
    secret: str  # shown once, never stored


@transaction.atomic
def join_token_create(
    *, ttl: timedelta, description: str = "", created_by=None, actor: Actor = SYSTEM
) -> IssuedJoinToken:
    """A new join token, valid for ``ttl``; audited as ``join_token.issued`` (its prefix, not the secret)."""
    if ttl <= timedelta(0):
        raise ValidationError({"ttl": "a join token's lifetime must be positive"})
    secret = JOIN_TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = JoinToken.objects.create(
        description=description,
        prefix=secret[:12],
        digest=secret_digest(secret),
        expires_at=timezone.now() + ttl,
        created_by=created_by,
    )
    audit_record(actor=actor, action="join_token.issued", target=token, detail={
        "prefix": token.prefix, "description": description, "expires_at": token.expires_at.isoformat(),
    })
    return IssuedJoinToken(join_token=token, secret=secret)


@transaction.atomic
def join_token_revoke(*, join_token: JoinToken, actor: Actor = SYSTEM) -> JoinToken:
    """Revoke a token: agents can no longer register with it. Nodes that joined with it keep working.
    Only the first revocation is audited (``join_token.revoked``)."""
    if join_token.revoked_at is None:
        join_token.revoked_at = timezone.now()
        join_token.save(update_fields=["revoked_at", "last_updated"])
        audit_record(actor=actor, action="join_token.revoked", target=join_token,
                     detail={"prefix": join_token.prefix, "uses": join_token.uses})
    return join_token


@dataclass(frozen=True)
class Registration:
    node: Node
    credential: str  # shown once to the agent, stored as a digest
    incarnation: int


@transaction.atomic
def agent_register(
    *, join_token: str, name: str, address: str, emulated: bool, devices: list[dict[str, Any]],
    remote_addr: str | None = None,
) -> Registration:
    """Exchange a join token for a node credential and a new incarnation.

    The node is matched by name and its devices stored as the agent discovered them (the agent is
    authoritative for its own node). The previous credential stops working at once, and everything
    the previous incarnation ran is re-sent to the new one (``node_agent_restarted``), so an agent
    that restarted kills what is no longer wanted and restarts what is. Audited as ``node.registered``
    by ``agent <name>`` from ``remote_addr`` (the join token's prefix, never the token).
    """
    token = JoinToken.objects.select_for_update(no_key=True).filter(digest=secret_digest(join_token)).first()
    if token is None:
        raise JoinTokenRefused("unknown join token")
    if token.revoked_at is not None:
        raise JoinTokenRefused(f"join token {token.prefix}… was revoked")
    if token.expires_at <= timezone.now():
        expired = f"{token.expires_at:%Y-%m-%d %H:%M:%S} UTC"
        raise JoinTokenRefused(f"join token {token.prefix}… expired at {expired}")
    existing = Node.objects.filter(name=name).first()
    node_spec = NodeSpec(
        name=name,
        devices=tuple(_device_spec(name, index, device, emulated) for index, device in enumerate(devices)),
        address=address,
        network_gbps=existing.network_gbps if existing else 25.0,
        labels=dict(existing.labels) if existing else {},
    )
    fleet_import(fleet=FleetSpec(name=existing.fleet if existing else "", nodes=(node_spec,)))
    Node.objects.filter(name=name).update(incarnation=F("incarnation") + 1)  # alive: node_agent_restarted
    node = Node.objects.get(name=name)
    credential = secrets.token_urlsafe(32)
    NodeCredential.objects.update_or_create(
        node=node,
        defaults={"digest": secret_digest(credential), "incarnation": node.incarnation, "join_token": token},
    )
    JoinToken.objects.filter(pk=token.pk).update(uses=F("uses") + 1, last_used_at=timezone.now())
    node_agent_restarted(node=node)
    audit_record(actor=Actor(user=None, label=f"agent {name}", via="agent", remote_addr=remote_addr),
                 action="node.registered", target=node,
                 detail={"join_token": token.prefix, "incarnation": node.incarnation, "devices": len(devices),
                         "address": address, "emulated": emulated})
    return Registration(node=node, credential=credential, incarnation=node.incarnation)


def _device_spec(node: str, index: int, data: dict[str, Any], emulated: bool) -> DeviceSpec:
    """A device as the agent reported it; its node is the registering one, whatever the payload says."""
    if not isinstance(data, dict):
        raise ValidationError({"devices": f"device {index}: expected an object"})
    known = {k: v for k, v in data.items() if k in DEVICE_FIELDS}
    known.setdefault("index", index)
    known["emulated"] = bool(known.get("emulated", False) or emulated)
    try:
        return DeviceSpec(name=device_name(node, known['index']), node=node, **known)
    except TypeError as exc:
        raise ValidationError({"devices": f"device {index}: {exc}"}) from None


def agent_message_receive(*, node_id: int, incarnation: int, message: dict[str, Any]) -> str | None:
    """Handle one websocket message of an authenticated agent; the reason it is refused, or None.

    ``incarnation`` is the one the connection's credential was issued to. A message claiming
    another, or arriving after the node re-registered, comes from an agent that is no longer the
    node's: it is refused and changes nothing.

    The agents' socket sends a heartbeat here only when its stages' states changed (or it is the
    connection's first); the others are recorded in batches by ``node_heartbeats_flush``. A
    heartbeat's telemetry is published by the socket itself, from its event loop. A head's stage
    event naming a stage its pipeline lost may tell liveness that stage's node died.
    """
    node = Node.objects.filter(pk=node_id).first()
    if node is None:
        return "the node was deleted"
    claimed = message.get("incarnation")
    if node.incarnation != incarnation:
        return (f"stale incarnation {incarnation}: node {node.name} re-registered "
                f"as incarnation {node.incarnation}")
    if claimed != incarnation:
        return f"message incarnation {claimed!r} does not match the credential's ({incarnation})"
    kind = message.get("type")
    if kind == "heartbeat":
        node_heartbeat_record(node=node, heartbeat=message)
    elif kind == "stage_event" and isinstance(message.get("stage"), dict):
        stage_status_record(node=node, status=message["stage"])
        node_link_broken_record(reporter=node, status=message["stage"])
    return None
