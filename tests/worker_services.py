"""Services of its own for each pytest-xdist worker, set before Django's settings are read.

`make test` runs the suite in several worker processes (pytest-xdist). In-process tests already get a
PostgreSQL test database per worker (pytest-django appends the worker's name), and every test that
starts a system makes its own database, var/ folder and ports. What the workers would still share is
the Redis server: the service-mode broker and channel layer (CELERY_BROKER_URL, CHANNEL_REDIS_URL)
and the numbered databases some tests flush. So each worker starts a private `redis-server` on a free
port and points those variables, and `tests.support.processes.redis_address()`, at it; a run without
workers (plain `pytest`) keeps the machine's Redis on 127.0.0.1:6379. Stage ports are split the same
way: each worker hands the systems it starts blocks of its own share of the range
(`tests.support.processes.stage_ports`), so two systems started by two workers never bind one port.

Loaded with ``-p tests.worker_services`` (pyproject's addopts), before pytest-django configures Django.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import time
from urllib.parse import urlsplit, urlunsplit

from tests.support.processes import SHARED_REDIS, accepts, free_port, worker_index

REDIS_VARIABLES = ("CELERY_BROKER_URL", "CHANNEL_REDIS_URL", "MOTLEY_CACHE_URL")


def _start_private_redis() -> str:
    """A redis-server of this worker's own (nothing kept on disk), stopped when the worker exits."""
    address = f"127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        ["redis-server", "--port", address.rsplit(":", 1)[1], "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--loglevel", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    atexit.register(process.kill)
    deadline = time.monotonic() + 10
    while not accepts(address):
        if time.monotonic() > deadline:
            raise RuntimeError(f"this worker's redis-server did not listen at {address} within 10 s")
        time.sleep(0.05)
    return address


def _moved(url: str, address: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=address)) if parts.netloc == SHARED_REDIS else url


def _isolate_worker() -> None:
    if worker_index() is None or shutil.which("redis-server") is None:
        return  # no workers; or no Redis at all, and the service-mode tests skip, saying so
    address = _start_private_redis()
    os.environ["MOTLEY_TEST_REDIS"] = address
    for variable in REDIS_VARIABLES:
        if os.environ.get(variable, "").startswith("redis://"):
            os.environ[variable] = _moved(os.environ[variable], address)


_isolate_worker()
