"""Two real ASGI servers (daphne, as run_local starts them but twice) sharing one
``PROMETHEUS_MULTIPROC_DIR``: requests served by each are counted in the ``/metrics`` of either."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from tests.observability.conftest import parse
from tests.support.processes import (
    REPO_ROOT,
    database_migrate,
    embedded_env,
    free_port,
    manage_shell,
    wait_for_http,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

KEY = """
import io
from django.contrib.auth import get_user_model
from django.core.management import call_command
get_user_model().objects.create_user("scraper")
out = io.StringIO()
call_command("create_api_key", "scraper", stdout=out)
print("KEY=" + out.getvalue().strip())
"""


def test_requests_to_two_servers_are_summed_in_the_metrics_of_either(tmp_path, demo_model):
    env = embedded_env(tmp_path / "var")
    env.update(PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prometheus"), MOTLEY_TEST_DEMO_MODEL=str(demo_model),
               DJANGO_SETTINGS_MODULE="tests.observability.daphne_settings")
    database_migrate(env)
    key = next(line[4:] for line in manage_shell(env, KEY).splitlines() if line.startswith("KEY="))
    ports = [free_port(), free_port()]
    servers = [subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                                 "controlplane.asgi:application"], cwd=REPO_ROOT, env=env) for port in ports]
    try:
        for port in ports:
            wait_for_http(f"http://127.0.0.1:{port}/metrics")
        usage = []
        for port, n in zip(ports, (3, 2), strict=True):
            for i in range(n):
                body = {"model": "demo", "prompt": f"request {i} to {port}", "max_tokens": 3 + i}
                response = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=30,
                                      headers={"Authorization": f"Bearer {key}"})
                assert response.status_code == 200, response.text
                usage.append(response.json()["usage"])
        for port in ports:
            s = parse(httpx.get(f"http://127.0.0.1:{port}/metrics").text)
            for name, field in [("vllm:prompt_tokens_total", "prompt_tokens"),
                                ("vllm:generation_tokens_total", "completion_tokens")]:
                assert sum(x.value for x in s.find(name, model_name="demo")) == sum(u[field] for u in usage)
            assert sum(x.value for x in s.find("vllm:e2e_request_latency_seconds_count")) == 5
            assert sum(x.value for x in s.find("motley_router_decisions_total", reason="routed")) == 5
            assert sum(x.value for x in s.find("vllm:num_requests_running")) == 0
        writers = {path.stem.rsplit("_", 1)[1] for path in (tmp_path / "prometheus").glob("counter_*.db")}
        assert writers == {str(server.pid) for server in servers}  # each server counted its own
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(timeout=20)
