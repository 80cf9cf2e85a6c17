"""Helpers for tests that start real processes: free ports, waiting for HTTP, clean environments."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVICE_VARIABLES = ("DATABASE_URL", "CELERY_BROKER_URL", "CHANNEL_REDIS_URL", "MOTLEY_CACHE_URL")
SHARED_REDIS = "127.0.0.1:6379"  # the machine's Redis
STAGE_PORTS = (20000, 31999)  # below Linux's ephemeral range (32768-60999): a test system's stages


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def accepts(address: str) -> bool:
    """Whether a server listens at ``host:port``."""
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=0.5).close()
        return True
    except OSError:
        return False


def worker_index() -> int | None:
    """0, 1, ... in a pytest-xdist worker ("gw0", "gw1", ...); None in a run without workers."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") else None


def stage_port_share() -> tuple[int, int]:
    """The block of STAGE_PORTS this test process may hand to the systems it starts."""
    low, high = STAGE_PORTS
    index, count = worker_index() or 0, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    size = (high - low + 1) // count
    return low + index * size, low + (index + 1) * size - 1


def stage_ports() -> str:
    """``MOTLEY_STAGE_PORTS`` of a system of its own: 100 ports from a block picked at random in this
    test process's share of STAGE_PORTS, all below Linux's ephemeral range, where an outgoing
    connection's local port could already hold a stage's port ("Address already in use", seen with
    handovers' fresh ports)."""
    low, high = stage_port_share()
    base = low + (uuid.uuid4().int % ((high - low + 1) // 100)) * 100
    return f"{base}-{base + 99}"


def embedded_env(var_dir: Path) -> dict[str, str]:
    """The environment of a fresh embedded-default install: no service variables, its own var/ dir and
    stage ports."""
    dropped = {*SERVICE_VARIABLES, "DJANGO_SETTINGS_MODULE"}
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env["MOTLEY_VAR_DIR"] = str(var_dir)
    env.setdefault("MOTLEY_STAGE_PORTS", stage_ports())
    return env


def wait_for_http(url: str, timeout_s: float = 60.0, headers: dict[str, str] | None = None) -> httpx.Response:
    """Poll until the URL answers at all (any status), or fail with what we last saw."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            return httpx.get(url, headers=headers, timeout=2.0)
        except httpx.HTTPError as exc:
            last_error = exc
            time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {timeout_s}s: {last_error}")


def stop_process(process: subprocess.Popen, timeout_s: float = 10) -> None:
    """Terminate ``process`` (nothing if it has exited), kill it if it is not gone within ``timeout_s``."""
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


_CREATE_KEYS = (
    "from django.contrib.auth.models import User; "
    "from rest_framework.authtoken.models import Token; "
    "from controlplane.gateway.accounts.services import api_key_create;"
    "user = User.objects.create_user('alice'); "
    "print(Token.objects.create(user=user).key, api_key_create(user=user, name='live')[1])"
)


def manage_argv(*args: str) -> list[str]:
    return [sys.executable, str(REPO_ROOT / "manage.py"), *args]


def manage_shell(env: dict[str, str], script: str) -> str:
    """What ``manage.py shell -c script`` printed in the install ``env``; raises if it failed."""
    return subprocess.run(manage_argv("shell", "-c", script), env=env, cwd=REPO_ROOT, check=True,
                          capture_output=True, text=True).stdout


def manage_shell_json(env: dict[str, str], script: str, tag: str):
    """The JSON a ``manage.py shell`` script printed after ``{tag}=`` (Django and the imports it runs
    may print before it)."""
    return json.loads(manage_shell(env, script).split(f"{tag}=", 1)[1])


def create_keys(env: dict[str, str]) -> tuple[str, str]:
    """A user alice of the install ``env`` with a REST API token for /api/v1/ and an API key for /v1/:
    (token, key)."""
    token, key = manage_shell(env, _CREATE_KEYS).split()[-2:]
    return token, key


_migrated: Path | None = None  # an embedded install's database, migrated once per test process


def database_migrate(env: dict[str, str]) -> None:
    """``manage.py migrate`` for the install ``env`` describes. An embedded one (SQLite in its
    MOTLEY_VAR_DIR) gets a copy of a database migrated once per test process: a migrate costs 6-11 s
    on two cores and a dozen tests start installs; a service database (DATABASE_URL) is migrated."""
    global _migrated
    if env.get("DATABASE_URL"):
        subprocess.run(manage_argv("migrate", "--noinput", "-v0"), env=env, cwd=REPO_ROOT, check=True)
        return
    if _migrated is None:
        template = Path(tempfile.mkdtemp(prefix="motley-migrated-"))
        atexit.register(shutil.rmtree, template, True)
        subprocess.run(manage_argv("migrate", "--noinput", "-v0"),
                       env={**env, "MOTLEY_VAR_DIR": str(template)},
                       cwd=REPO_ROOT, check=True)
        _migrated = template / "motley.sqlite3"
    var_dir = Path(env["MOTLEY_VAR_DIR"])
    var_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_migrated, var_dir / "motley.sqlite3")


def redis_address() -> str:
    """``host:port`` of this test process's Redis server: a pytest-xdist worker's own
    (tests/worker_services.py), else the machine's."""
    return os.environ.get("MOTLEY_TEST_REDIS", SHARED_REDIS)


def redis_url(db: int) -> str:
    """Database ``db`` of this test process's Redis server."""
    return f"redis://{redis_address()}/{db}"


def redis_up() -> bool:
    """Whether this test process's Redis server accepts connections (service-mode tests skip without)."""
    return accepts(redis_address())


def read_credentials(var_dir: Path) -> dict[str, str]:
    """The ``key: value`` lines `run_local` writes to var/admin-credentials.txt."""
    text = (Path(var_dir) / "admin-credentials.txt").read_text()
    return dict(line.split(": ", 1) for line in text.splitlines())


def filesystem_broker_options(folder: Path, **extra) -> dict:
    """Transport options of kombu's filesystem broker in ``folder`` (created), as settings.py sets them."""
    for sub in ("data", "processed", "control"):
        (folder / sub).mkdir(parents=True)
    return {"data_folder_in": str(folder / "data"), "data_folder_out": str(folder / "data"),
            "processed_folder": str(folder / "processed"), "control_folder": str(folder / "control"),
            "store_processed": False, **extra}
