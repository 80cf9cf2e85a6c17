"""Reads of the gateway app."""

from __future__ import annotations

import time

from django.contrib.auth.models import AbstractBaseUser
from django.db import DatabaseError

from controlplane.gateway.accounts.services import api_key_hash
from controlplane.gateway.conf import gateway_setting
from controlplane.gateway.models import ApiKey

# Key hash -> the key as last read active, and when (time.monotonic()): what a request may use while
# the database cannot be read (KEY_GRACE_S). A key read revoked or unknown is dropped at once.
_last_active: dict[str, tuple[ApiKey, float]] = {}


async def api_key_active(*, raw_key: str) -> ApiKey | None:
    """The active key (with its user and limits, read fresh at every request), or None: unknown,
    revoked, or its user deactivated.

    While the database cannot be read (a restart, a failover) a key read active within the last
    ``KEY_GRACE_S`` is used as it was then, so requests keep being served through a short outage;
    a revocation is seen at the first read that succeeds. Otherwise the DatabaseError is raised
    (the views answer it with a 503)."""
    digest = api_key_hash(raw_key)
    try:
        api_key = await _read(digest)
    except DatabaseError:
        kept = _last_active.get(digest)
        if kept is None or time.monotonic() - kept[1] > gateway_setting("KEY_GRACE_S"):
            raise
        return kept[0]
    if api_key is None or not api_key.user.is_active:
        _last_active.pop(digest, None)
        return None
    _last_active[digest] = (api_key, time.monotonic())
    return api_key


async def _read(digest: str) -> ApiKey | None:
    try:
        return await ApiKey.objects.select_related("user").aget(key_hash=digest, revoked_at__isnull=True)
    except ApiKey.DoesNotExist:
        return None


async def api_key_user(*, raw_key: str) -> AbstractBaseUser | None:
    """The active user owning an active key, or None (unknown, revoked, or user deactivated)."""
    api_key = await api_key_active(raw_key=raw_key)
    return api_key.user if api_key is not None else None
