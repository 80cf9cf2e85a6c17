"""The embedded default, as `make run` starts it: SQLite, filesystem broker, no services configured."""

from __future__ import annotations

import signal
import subprocess
import time

import httpx
import psutil
import pytest

from tests.support.processes import (
    REPO_ROOT,
    database_migrate,
    embedded_env,
    free_port,
    manage_argv,
    manage_shell,
    read_credentials,
    wait_for_http,
)

pytestmark = pytest.mark.slow


def test_run_local_serves_the_api_with_a_generated_admin_and_stops_all_children(tmp_path):
    env = embedded_env(tmp_path)
    database_migrate(env)
    port = free_port()
    launcher = subprocess.Popen(manage_argv("run_local", "--port", str(port), "--demo-model", "generated"),
                                env=env, cwd=REPO_ROOT)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/api/schema/")
        assert (tmp_path / "motley.sqlite3").exists()
        credentials = read_credentials(tmp_path)
        assert oct((tmp_path / "admin-credentials.txt").stat().st_mode & 0o777) == "0o600"

        anonymous = httpx.get(f"http://127.0.0.1:{port}/api/schema/?format=json")
        assert anonymous.status_code == 401
        assert anonymous.json()["error"]["message"]

        authed = httpx.get(
            f"http://127.0.0.1:{port}/api/schema/?format=json",
            headers={"Authorization": f"Token {credentials['api_token']}"},
        )
        assert authed.status_code == 200
        assert authed.json()["info"]["title"] == "motley control plane API"
        children = psutil.Process(launcher.pid).children(recursive=True)
        assert len(children) >= 2  # the ASGI server and the Celery worker (plus its pool)
    finally:
        launcher.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        launcher.send_signal(signal.SIGTERM)  # a second signal while stopping must not orphan anything
        launcher.wait(timeout=30)
    time.sleep(0.5)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def test_second_start_keeps_the_first_admin_credentials(tmp_path):
    env = embedded_env(tmp_path)
    database_migrate(env)
    script = (
        "import django; django.setup();"
        "from django.conf import settings;"
        "from controlplane.ops.services import admin_ensure;"
        "print(admin_ensure(credentials_path=settings.VAR_DIR / 'admin-credentials.txt').created)"
    )
    first = manage_shell(env, script)
    before = (tmp_path / "admin-credentials.txt").read_text()
    second = manage_shell(env, script)
    assert (first.split()[-1], second.split()[-1]) == ("True", "False")
    assert (tmp_path / "admin-credentials.txt").read_text() == before
