import uuid

import pytest

from tests.agents.helpers import ORPHAN_TAG, TINY_FLEET, tagged_processes, wait_until


@pytest.fixture(autouse=True)
def no_orphans(monkeypatch):
    """Tag every process a test starts (through the environment) and fail if one outlives the test."""
    tag = uuid.uuid4().hex
    monkeypatch.setenv(ORPHAN_TAG, tag)
    yield tag
    try:
        wait_until(lambda: not tagged_processes(tag), timeout_s=5, what="all started processes gone")
    finally:
        leftovers = tagged_processes(tag)
        for process in leftovers:
            process.kill()
        assert not leftovers, f"orphans left behind: {[p.cmdline() for p in leftovers]}"


@pytest.fixture(autouse=True)
def brokers_named_by_the_test(monkeypatch):
    """Celery lets CELERY_BROKER_URL override the broker an app was built with; CI exports it for
    service mode, and these tests name their broker (Redis or the filesystem) themselves."""
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)


@pytest.fixture
def tiny_fleet(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(TINY_FLEET)
    return path
