"""Writes of the gateway app: issuing and revoking API keys, and setting their limits."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from controlplane.audit.services import SYSTEM, Actor, audit_record
from controlplane.gateway.models import ApiKey

KEY_PREFIX = "mk-"
LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute", "token_budget", "budget_period", "allowed_models",
                "max_concurrent_requests")


def api_key_hash(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


@transaction.atomic
def api_key_create(
    *, user: AbstractBaseUser, name: str, actor: Actor = SYSTEM, limits: Mapping[str, Any] | None = None
) -> tuple[ApiKey, str]:
    """A new key for ``user``; returns the row and the raw key, which is never stored or shown again.
    ``limits``: any of ``LIMIT_FIELDS`` (validated as ``api_key_set_limits`` does). Audited:
    ``api_key.created`` by ``actor`` (the key's prefix, never the key, and its limits if any)."""
    raw_key = KEY_PREFIX + secrets.token_urlsafe(32)
    api_key = ApiKey(user=user, name=name, prefix=raw_key[: len(KEY_PREFIX) + 6],
                     key_hash=api_key_hash(raw_key))
    _apply_limits(api_key, limits or {})
    api_key.save()
    detail = {"user": user.get_username(), "name": name, "prefix": api_key.prefix}
    if limits:
        detail["limits"] = api_key_limits(api_key)
    audit_record(actor=actor, action="api_key.created", target=api_key, detail=detail)
    return api_key, raw_key


def api_key_limits(api_key: ApiKey) -> dict[str, Any]:
    return {name: getattr(api_key, name) for name in LIMIT_FIELDS}


def _apply_limits(api_key: ApiKey, limits: Mapping[str, Any]) -> dict[str, list]:
    """Set the limits on the row (not saved) and validate it; returns ``{field: [old, new]}`` changed."""
    if unknown := set(limits) - set(LIMIT_FIELDS):
        raise ValueError(f"not a key limit: {', '.join(sorted(unknown))} (limits: {', '.join(LIMIT_FIELDS)})")
    changed = {}
    for name, value in limits.items():
        if name == "allowed_models" and isinstance(value, list | tuple):
            value = list(dict.fromkeys(str(model).strip() for model in value))
        if getattr(api_key, name) != value:
            changed[name] = [getattr(api_key, name), value]
            setattr(api_key, name, value)
    api_key.full_clean()
    return changed


@transaction.atomic
def api_key_set_limits(*, api_key: ApiKey, actor: Actor = SYSTEM, **limits: Any) -> ApiKey:
    """Change a key's limits (any of ``LIMIT_FIELDS``; None lifts one); they apply from the key's next
    request, in every gateway process. Raises ``ValidationError`` naming a bad value; audited as
    ``api_key.updated`` with what changed (nothing changed: no entry)."""
    changed = _apply_limits(api_key, limits)
    if changed:
        api_key.save(update_fields=[*changed, "last_updated"])
        audit_record(actor=actor, action="api_key.updated", target=api_key,
                     detail={"changed": changed, "limits": api_key_limits(api_key)})
    return api_key


@transaction.atomic
def api_key_revoke(*, api_key: ApiKey, actor: Actor = SYSTEM) -> ApiKey:
    """Stop the key from working; idempotent (the first revocation time is kept, and only the first
    revocation is audited: ``api_key.revoked``)."""
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at", "last_updated"])
        detail = {"user": api_key.user.get_username(), "name": api_key.name, "prefix": api_key.prefix}
        audit_record(actor=actor, action="api_key.revoked", target=api_key, detail=detail)
    return api_key
