"""Services of its own for each pytest-xdist worker, set before Django's settings are read.

`make test` runs the suite in several worker processes (pytest-xdist). In-process tests already get a
PostgreSQL test database per worker (pytest-django appends the worker's name), and every test that
starts a system makes its own database, var/ folder and ports. What the workers would still share is
the Redis server: the service-mode broker and channel layer (CELERY_BROKER_URL, CHANNEL_REDIS_URL)
and the numbered databases some tests flush. So each worker starts a private `redis-server` on a free
port and points those variables, and `tests.support.processes.REDIS_ADDRESS`, at it; a run without
workers (plain `pytest`) keeps the machine's Redis on 127.0.0.1:6379. Stage ports are split the same
way: each worker hands the systems it starts blocks of its own share of the range
(`tests.support.processes.stage_ports`), so two systems started by two workers never bind one port.

Loaded with ``-p tests.worker_services`` (pyproject's addopts), before pytest-django configures Django.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import time
from urllib.parse import urlsplit, urlunsplit

SHARED_REDIS = "127.0.0.1:6379"
REDIS_VARIABLES = ("CELERY_BROKER_URL", "CHANNEL_REDIS_URL", "MOTLEY_CACHE_URL")
STAGE_PORTS = (20000, 31999)  # below Linux's ephemeral range (32768-60999): a test system's stages


def worker_index() -> int | None:
    """0, 1, ... in a pytest-xdist worker ("gw0", "gw1", ...); None in a run without workers."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") else None


def worker_count() -> int:
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def stage_port_share() -> tuple[int, int]:
    """The block of STAGE_PORTS this process may hand to the systems it starts."""
    low, high = STAGE_PORTS
    index, count = worker_index() or 0, worker_count()
    size = (high - low + 1) // count
    return low + index * size, low + (index + 1) * size - 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_private_redis() -> str:
    """A redis-server of this worker's own (nothing kept on disk), stopped when the worker exits."""
    port = _free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--databases", "16", "--loglevel", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    atexit.register(process.kill)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return f"127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"this worker's redis-server did not listen on port {port} within 10 s")


def _moved(url: str, address: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=address)) if parts.netloc == SHARED_REDIS else url


def _isolate_worker() -> None:
    if worker_index() is None:
        return
    if shutil.which("redis-server") is None:
        return  # the service-mode tests skip, saying so, as they do without Redis
    address = _start_private_redis()
    os.environ["MOTLEY_TEST_REDIS"] = address
    for variable in REDIS_VARIABLES:
        if os.environ.get(variable, "").startswith("redis://"):
            os.environ[variable] = _moved(os.environ[variable], address)


_isolate_worker()
