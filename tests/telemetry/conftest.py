"""Fixtures of the telemetry tests: API clients, and no memory of what earlier tests kept."""

from __future__ import annotations

import pytest

from controlplane.telemetry import services
from tests.api.mixins import anonymous, api, user  # noqa: F401  (shared fixtures)


@pytest.fixture(autouse=True)
def _fresh_process_state():
    """What this process remembers writing belongs to the cache the test replaced (tests/conftest.py)."""
    services._refreshed.clear()
    yield
    services._refreshed.clear()
