"""Fixtures of every test: a cache of its own, and no usage record left queued by the one before;
and the order the suite's workers take its modules in (``pytest_collection_modifyitems``).

The control plane's cache is shared by every process (Redis in service mode, a SQLite file under var/
in the embedded default: settings.CACHES), so tests running in this process would otherwise see each
other's telemetry, and another test run's. Each test gets a fresh in-memory cache; tests of the
shared cache itself start real processes (tests/telemetry/test_shared_state.py).
"""

from __future__ import annotations

import uuid
from itertools import groupby

import pytest
from django.test import override_settings

# A module's weight is its heaviest marker's: builds images, starts systems, drives a browser, the rest.
MARKER_WEIGHTS = {"docker": 3, "slow": 2, "browser": 1}


@pytest.hookimpl(trylast=True)  # after pytest-randomly's shuffle, whose order it keeps within a weight
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Heaviest modules first. `make test` hands each xdist worker whole modules, in this order
    (``--dist loadscope --no-loadscope-reorder``): a module's fixtures (a system, a compose stack) are
    set up once, not on every worker that ran one of its tests; and the longest modules start at
    once, so the light ones fill the workers' ends instead of one long module running alone last."""

    def weight(module: list[pytest.Item]) -> int:
        return max((MARKER_WEIGHTS.get(mark.name, 0) for item in module for mark in item.iter_markers()),
                   default=0)

    modules = [list(module) for _, module in groupby(items, key=lambda item: item.nodeid.split("::")[0])]
    items[:] = [item for module in sorted(modules, key=lambda m: -weight(m)) for item in module]


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
