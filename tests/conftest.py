"""Fixtures of every test: a cache of its own.

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
