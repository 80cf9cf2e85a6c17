"""Several web (daphne) processes of one service-mode install behind HAProxy, as docker/compose.yaml
runs them but on the host: PostgreSQL (a database of its own), Redis (the channel layer, the cache and
the router view every process shares), Debian's haproxy with docker/haproxy.cfg itself. The gateway
serves stand-in replicas (tests/observability/stand_in.py), so only the web tier is under test.
For tests/gateway/test_web_failover.py and benchmarks/ha_bench.py."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tests.support.processes import (
    REPO_ROOT,
    accepts,
    create_keys,
    database_migrate,
    embedded_env,
    free_port,
    redis_up,
    redis_url,
    stop_process,
    wait_for_http,
)

HAPROXY_CFG = REPO_ROOT / "docker" / "haproxy.cfg"


def web_fleet_problem() -> str | None:
    """Why a web fleet cannot start here, or None."""
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        return "service mode: needs DATABASE_URL=postgres://…"
    if not redis_up():
        return "service mode: needs a Redis server"
    if shutil.which("haproxy") is None:
        return "no haproxy on PATH (apt-get install haproxy)"
    return None


@contextmanager
def service_install(workdir: Path, *, demo_model: Path, stand_in: str, redis_db: int) -> Iterator[dict]:
    """A migrated install of its own database (dropped at the end); yields its environment, whose
    ``MOTLEY_TEST_TOKEN`` and ``MOTLEY_TEST_KEY`` are a user's REST token and API key."""
    import psycopg
    import redis

    name = f"motley_web_{uuid.uuid4().hex[:8]}"
    database_url = os.environ["DATABASE_URL"]
    admin = urlunsplit(urlsplit(database_url)._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    redis.Redis.from_url(redis_url(redis_db)).flushdb()
    env = embedded_env(workdir / "var") | {
        "DATABASE_URL": urlunsplit(urlsplit(database_url)._replace(path=f"/{name}")),
        "CHANNEL_REDIS_URL": redis_url(redis_db),
        "DJANGO_SETTINGS_MODULE": "tests.observability.daphne_settings",
        "MOTLEY_TEST_DEMO_MODEL": str(demo_model), "MOTLEY_TEST_STAND_IN": stand_in,
    }
    try:
        database_migrate(env)
        env["MOTLEY_TEST_TOKEN"], env["MOTLEY_TEST_KEY"] = create_keys(env)
        yield env
    finally:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Web:
    """One daphne process serving ``controlplane.asgi`` on a port of its own."""

    def __init__(self, env: dict, log: Path, port: int | None = None):
        self.env, self.log, self.port = env, log, port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> Web:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port),
                 "controlplane.asgi:application"], env=self.env, cwd=REPO_ROOT, stdout=out,
                stderr=subprocess.STDOUT)
        wait_for_http(f"{self.url}/health", timeout_s=60)
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown, no goodbye to Redis (its share of the router view expires)."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            stop_process(self.process, timeout_s=20)


class Balancer:
    """Debian's haproxy on the host with docker/haproxy.cfg, in front of ``webs``."""

    def __init__(self, webs: list[Web], log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = os.environ | {"MOTLEY_BALANCER_BIND": f"127.0.0.1:{self.port}",
                            **{f"MOTLEY_WEB{i + 1}": f"127.0.0.1:{web.port}" for i, web in enumerate(webs)}}
        env.pop("MOTLEY_DNS", None)
        with log.open("ab") as out:
            self.process = subprocess.Popen(["haproxy", "-db", "-f", str(HAPROXY_CFG)], env=env,
                                            stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while not accepts(f"127.0.0.1:{self.port}"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"haproxy did not start: {log.read_text()[-2000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        stop_process(self.process)


@contextmanager
def web_fleet(workdir: Path, env: dict, count: int = 2) -> Iterator[tuple[list[Web], Balancer]]:
    """``count`` web processes of the install ``env`` and the balancer in front, all stopped at the end."""
    webs: list[Web] = []
    balancer = None
    try:
        for i in range(count):
            webs.append(Web(env, workdir / f"web{i + 1}.log").start())
        balancer = Balancer(webs, workdir / "haproxy.log")
        yield webs, balancer
    finally:
        if balancer is not None:
            balancer.stop()
        for web in webs:
            web.stop()
