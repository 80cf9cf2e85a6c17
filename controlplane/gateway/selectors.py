"""Reads of the gateway app."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser

from controlplane.gateway.models import ApiKey
from controlplane.gateway.services import api_key_hash


async def api_key_active(*, raw_key: str) -> ApiKey | None:
    """The active key (with its user and limits, read fresh at every request), or None: unknown,
    revoked, or its user deactivated."""
    try:
        api_key = await ApiKey.objects.select_related("user").aget(
            key_hash=api_key_hash(raw_key), revoked_at__isnull=True
        )
    except ApiKey.DoesNotExist:
        return None
    return api_key if api_key.user.is_active else None


async def api_key_user(*, raw_key: str) -> AbstractBaseUser | None:
    """The active user owning an active key, or None (unknown, revoked, or user deactivated)."""
    api_key = await api_key_active(raw_key=raw_key)
    return api_key.user if api_key is not None else None
