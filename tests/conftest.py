"""Fixtures of every test: a cache of its own, and no usage record left queued by the one before.

The control plane's cache is shared by every process (Redis in service mode, files under var/ in the
embedded default: settings.CACHES), so tests running in this process would otherwise see each
other's telemetry, and another test run's. Each test gets a fresh in-memory cache; tests of the
shared cache itself start real processes (tests/telemetry/test_shared_state.py).
"""

from __future__ import annotations

import uuid

import pytest
from django.test import override_settings


@pytest.fixture(autouse=True)
def _own_cache():
    location = f"test-{uuid.uuid4().hex}"
    with override_settings(CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                                               "LOCATION": location}}):
        yield


@pytest.fixture(autouse=True)
def _no_usage_left_queued():
    """A request's usage record is written just after its response by a task on the test's event loop
    (controlplane/gateway/accounts/usage_backlog.py); one a test ended before is not the next test's to write
    (its key and rows were rolled back)."""
    yield
    from controlplane.gateway.accounts import usage_backlog

    usage_backlog.discard()
