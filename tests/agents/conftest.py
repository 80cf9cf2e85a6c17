import subprocess
import sys
import uuid

import pytest

from tests.agents.helpers import ORPHAN_TAG, TINY_FLEET, tagged_processes, wait_until
from tests.support.processes import REPO_ROOT


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


@pytest.fixture(scope="session")
def demo_model(tmp_path_factory):
    """A 2-layer demo checkpoint for the tests that run the real ``worker_runtime.serve``."""
    out = tmp_path_factory.mktemp("demo")
    subprocess.run([sys.executable, "-m", "worker_runtime.make_demo_model", str(out), "--layers", "2",
                    "--hidden", "64", "--intermediate", "128", "--heads", "4", "--kv-heads", "2",
                    "--max-positions", "128"],
                   cwd=REPO_ROOT, check=True, capture_output=True)
    return out
