"""Writes of the gateway app: issuing and revoking API keys."""

from __future__ import annotations

import hashlib
import secrets

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from controlplane.gateway.models import ApiKey

KEY_PREFIX = "mk-"


def api_key_hash(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


def api_key_create(*, user: AbstractBaseUser, name: str) -> tuple[ApiKey, str]:
    """A new key for ``user``; returns the row and the raw key, which is never stored or shown again."""
    raw_key = KEY_PREFIX + secrets.token_urlsafe(32)
    api_key = ApiKey.objects.create(
        user=user, name=name, prefix=raw_key[: len(KEY_PREFIX) + 6], key_hash=api_key_hash(raw_key)
    )
    return api_key, raw_key


def api_key_revoke(*, api_key: ApiKey) -> ApiKey:
    """Stop the key from working; idempotent (the first revocation time is kept)."""
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at", "last_updated"])
    return api_key
