"""The audit trail's one writer: ``audit_record``, and the ``Actor`` every audited action names.

Call contract (docs/api.md, "Audit trail"):

- An operator action's interface (a view, the admin, a management command) makes an ``Actor`` once:
  ``audit_context(request)`` for an HTTP request (DRF's or Django's: the logged-in user, how they
  authenticated, the client's address), ``actor_cli(user=None)`` for a management command
  (``"cli:<os user>"``, or the named user), or ``SYSTEM`` for what the control plane does by
  itself. It passes the actor down to the service, keyword-only (``actor: Actor = SYSTEM``).
- The service calls ``audit_record(actor=..., action=..., target=..., detail=...)`` inside its own
  transaction, after its checks passed and its writes are made: the entry is written in the
  caller's transaction, so a refused action (it raised before recording) or a rolled-back one
  leaves no entry. Call it once per action, with the final state in ``detail``.
- ``action`` is a short dotted verb, ``<target type>.<past participle>``: ``plan.applied``,
  ``node.drained``, ``api_key.created``… (the list: ``ACTIONS``, docs/api.md). New actions are added
  to ``ACTIONS``; an unknown one raises ``ValueError`` so a typo fails in tests, not in the trail.
- ``target`` is a model instance (type: its class name in snake_case, id: its pk, label: ``str()``)
  or a ``Target(type, id, label)`` for something that is not a row.

What the control plane does by itself (reconcile, a re-plan after a lost node, the health check) is
not an operator action: it is recorded as a deployment event (``deployments/events.py``), not here.
Entries are append-only: nothing in the API, the admin or the dashboard changes or deletes them.
"""

from __future__ import annotations

import getpass
import ipaddress
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import models

from controlplane.audit.models import AuditEntry
from controlplane.common.client_address import client_address

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser
    from django.http import HttpRequest

ACTIONS = frozenset({
    "plan.applied", "plan.edited", "plan.proposal_accepted", "plan.rebalanced", "plan.saved",
    "rebalance_proposal.dismissed",
    "deployment.created", "deployment.updated", "deployment.stopped",
    "node.registered", "node.drained", "node.undrained", "node.cordoned", "node.uncordoned",
    "api_key.created", "api_key.revoked", "api_key.updated",
    "join_token.issued", "join_token.revoked",
    "model.registered", "model.unregistered",
    "device.health_override", "device.throttle",
})


@dataclass(frozen=True)
class Actor:
    """Who acts: a user (or none), the label kept with the entry, how they came in, from where."""

    user: AbstractBaseUser | None
    label: str
    via: str  # session, token, api_key, cli, admin, agent, system
    remote_addr: str | None = None


SYSTEM = Actor(user=None, label="system", via="system")


@dataclass(frozen=True)
class Target:
    """What an action is done to, when it is not a model instance."""

    type: str
    id: str = ""
    label: str = ""


def audit_context(request: HttpRequest, *, via: str | None = None) -> Actor:
    """The actor of an HTTP request: its user (if logged in), how it authenticated, its address.

    ``via`` is ``token`` when DRF authenticated the request with a token, ``session`` for a browser
    session (the dashboard, the admin: pass ``via="admin"``), and anything a caller names. A
    credential DRF set as ``request.auth`` may name itself with ``audit_via`` and ``audit_label``
    (an API key: ``"api_key"``, ``"api key mk-…abcd"``). The address is the client's
    (``client_address``: behind a trusted balancer, the one its ``X-Forwarded-For`` names).
    """
    user = getattr(request, "user", None)
    user = user if user is not None and user.is_authenticated else None
    auth = getattr(request, "auth", None)  # DRF: the Token (or key) a request authenticated with
    if via is None:
        via = "session" if auth is None else getattr(auth, "audit_via", "token")
    label = getattr(auth, "audit_label", None) or (user.get_username() if user is not None else "anonymous")
    return Actor(user=user, label=label, via=via, remote_addr=client_address(request))


def actor_cli(*, user: AbstractBaseUser | None = None) -> Actor:
    """A management command's actor: the named user, else ``cli:<os user>``."""
    if user is not None:
        return Actor(user=user, label=user.get_username(), via="cli")
    try:
        os_user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a bare container)
        os_user = "unknown"
    return Actor(user=None, label=f"cli:{os_user}", via="cli")


def audit_record(
    *, actor: Actor, action: str, target: models.Model | Target, remote_addr: str | None = None,
    detail: dict[str, Any] | None = None,
) -> AuditEntry:
    """Record one action by ``actor`` on ``target``, in the caller's transaction.

    ``remote_addr`` overrides the actor's address; ``detail`` is a small JSON object (what changed).
    """
    if action not in ACTIONS:
        raise ValueError(f"unknown audit action {action!r}; add it to controlplane.audit.services.ACTIONS")
    if isinstance(target, models.Model):
        target = Target(type=_snake(type(target).__name__), id=str(target.pk), label=str(target))
    return AuditEntry.objects.create(
        actor=actor.user, actor_label=actor.label[:200], via=actor.via, action=action,
        target_type=target.type, target_id=str(target.id or ""), target_label=str(target.label or "")[:200],
        remote_addr=_address(remote_addr or actor.remote_addr), detail=detail or {},
    )


def _address(value: str | None) -> str | None:
    """An IP address, or None for anything else a server may put in REMOTE_ADDR (a unix socket's
    path): the column is PostgreSQL's ``inet``, and a bad value must not refuse the action."""
    try:
        return str(ipaddress.ip_address(value)) if value else None
    except ValueError:
        return None


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()
