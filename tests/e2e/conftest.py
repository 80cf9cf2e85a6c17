"""Fixtures of the end-to-end tests: a demo checkpoint made once, and a whole system per test."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.e2e.harness import TIMING, System, embedded_system_at, running
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.processes import REPO_ROOT, redis_up, redis_url, stage_ports


@pytest.fixture(scope="session")
def demo_model(tmp_path_factory) -> Path:
    return _demo(tmp_path_factory, layers=6)


@pytest.fixture(scope="session")
def draft_model(tmp_path_factory) -> Path:
    """A two-layer demo model: the demo tokenizer, so it can draft for ``demo_model``."""
    return _demo(tmp_path_factory, layers=2)


def _demo(tmp_path_factory, layers: int) -> Path:
    out = tmp_path_factory.mktemp("e2e-model") / f"demo-{layers}"
    shape = ["--layers", str(layers), "--hidden", "64", "--intermediate", "128", "--heads", "4",
             "--kv-heads", "2"]
    subprocess.run([sys.executable, "-m", "worker_runtime.make_demo_model", str(out), *shape], cwd=REPO_ROOT,
                   check=True, capture_output=True)
    return out


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture
def system_env() -> dict[str, str]:
    """More environment for the system fixtures' processes: a module overrides it (the ``OTEL_*``
    variables of a receiver, to trace)."""
    return {}


@pytest.fixture
def embedded_system(tmp_path, system_env) -> Iterator[System]:
    """SQLite and the filesystem broker, as `make run` starts them."""
    with running(embedded_system_at(tmp_path, **system_env)) as system:
        yield system


def _service_urls() -> tuple[str, str] | None:
    database = os.environ.get("DATABASE_URL", "")
    if not database.startswith(("postgres://", "postgresql://")):
        return None
    if not redis_up():
        return None
    return database, os.environ.get("CELERY_BROKER_URL", "").startswith("redis://") and os.environ[
        "CELERY_BROKER_URL"] or redis_url(14)


@pytest.fixture
def service_system(tmp_path, system_env) -> Iterator[System]:
    """PostgreSQL (a database of its own) and Redis as the broker and channel layer."""
    urls = _service_urls()
    if urls is None:
        pytest.skip("service mode: needs DATABASE_URL=postgres://… and a Redis server")
    import psycopg
    import redis

    database_url, broker_url = urls
    name = f"motley_e2e_{uuid.uuid4().hex[:8]}"
    admin = urlunsplit(urlsplit(database_url)._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    broker_url = broker_url.rsplit("/", 1)[0] + "/13"
    redis.Redis.from_url(broker_url).flushdb()
    env = {**os.environ, **TIMING, "MOTLEY_VAR_DIR": str(tmp_path / "var"),
           "MOTLEY_STAGE_PORTS": stage_ports(),
           "DATABASE_URL": urlunsplit(urlsplit(database_url)._replace(path=f"/{name}")),
           "CELERY_BROKER_URL": broker_url, "CHANNEL_REDIS_URL": broker_url.rsplit("/", 1)[0] + "/12",
           **system_env}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    try:
        with running(System(workdir=tmp_path, env=env)) as system:
            yield system
    finally:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
