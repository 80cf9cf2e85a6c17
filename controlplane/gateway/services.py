"""Writes of the gateway app: issuing and revoking API keys."""

from __future__ import annotations

import hashlib
import secrets

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from controlplane.audit.services import SYSTEM, Actor, audit_record
from controlplane.gateway.models import ApiKey

KEY_PREFIX = "mk-"


def api_key_hash(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


@transaction.atomic
def api_key_create(*, user: AbstractBaseUser, name: str, actor: Actor = SYSTEM) -> tuple[ApiKey, str]:
    """A new key for ``user``; returns the row and the raw key, which is never stored or shown again.
    Audited: ``api_key.created`` by ``actor`` (the key's prefix, never the key)."""
    raw_key = KEY_PREFIX + secrets.token_urlsafe(32)
    api_key = ApiKey.objects.create(
        user=user, name=name, prefix=raw_key[: len(KEY_PREFIX) + 6], key_hash=api_key_hash(raw_key)
    )
    audit_record(actor=actor, action="api_key.created", target=api_key,
                 detail={"user": user.get_username(), "name": name, "prefix": api_key.prefix})
    return api_key, raw_key


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
