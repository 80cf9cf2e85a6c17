"""One telemetry state for every process: what one server process received, another one serves.

Real processes: daphne serving ``controlplane.asgi`` (twice, in service mode), an agent's websocket
on the first, the API and the dashboard socket of the second, and a third process reading through
the selectors as the Celery worker does (calibration). Service mode needs a Redis server
(the channel layer and, by default, the cache); the embedded default shares its SQLite cache.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from tests.support.processes import (
    REPO_ROOT,
    database_migrate,
    embedded_env,
    free_port,
    manage_argv,
    manage_shell_json,
    redis_up,
    redis_url,
    stop_process,
    wait_for_http,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
REDIS_URL = redis_url(10)  # a database no other test uses

SEED = """
import json, uuid
from datetime import timedelta
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.authtoken.models import Token
from controlplane.enrollment.services import agent_register, join_token_create
name = "shared-" + uuid.uuid4().hex[:8]
gpu = {"model": "T4", "memory_bytes": 16 * 2**30, "memory_bandwidth_gbs": 320.0, "fp16_tflops": 65.0,
       "bf16_tflops": 0.0, "int8_tops": 130.0}
registration = agent_register(join_token=join_token_create(ttl=timedelta(hours=1)).secret, name=name,
                              address="127.0.0.1", emulated=True, devices=[gpu])
user = get_user_model().objects.create_user("watcher")
client = Client()
client.force_login(user)
print("SEED=" + json.dumps({
    "node": name, "node_id": registration.node.pk, "credential": registration.credential,
    "incarnation": registration.incarnation, "token": Token.objects.create(user=user).key,
    "session": client.cookies["sessionid"].value}))
"""

READ = """
import json
from controlplane.telemetry.selectors import device_sample, stage_sample
gpu, stage = device_sample("{node}/gpu0"), stage_sample("d7-r0-s1")
print("READ=" + json.dumps([gpu and gpu.value, stage and [stage.node, stage.value, stage.age_s()]]))
"""


def install(var_dir: Path, service: bool) -> tuple[dict, dict]:
    env = embedded_env(var_dir)
    if service:
        env["CHANNEL_REDIS_URL"] = REDIS_URL  # and so the cache (MOTLEY_CACHE_URL's default)
    database_migrate(env)
    return env, manage_shell_json(env, SEED, "SEED")


class Server:
    def __init__(self, env: dict, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [*manage_argv()[:1], "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port),
                 "controlplane.asgi:application"],
                env=env, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT)
        wait_for_http(f"{self.url}/accounts/login/", timeout_s=30)

    def stop(self) -> None:
        stop_process(self.process)


def heartbeat(seed: dict) -> dict:
    stage = {"stage_key": "d7-r0-s1", "deployment_id": 7, "replica": 0, "stage_index": 1, "state": "ready",
             "pid": 4242, "exit_code": None, "restarts": 0, "message": "",
             "stats": {"step_ms": 31.5, "tokens_per_s": 12.0}}
    return {"type": "heartbeat", "incarnation": seed["incarnation"], "seq": 1, "sent_at": time.time(),
            "devices": [{"index": 0, "utilization_pct": 77.0, "memory_used_bytes": 3 * 2**30,
                         "memory_total_bytes": 16 * 2**30, "throttle_reasons": []}], "stages": [stage]}


def send_heartbeat(server: Server, seed: dict) -> None:
    headers = {"Authorization": f"Node {seed['node_id']}:{seed['credential']}"}
    with connect(server.url.replace("http", "ws") + "/ws/agents/", additional_headers=headers,
                 open_timeout=10) as socket:
        socket.send(json.dumps(heartbeat(seed)))
        time.sleep(0.5)  # the socket's first heartbeat goes through the database before it is kept


def until(read, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = read()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


def read_in_another_process(env: dict, node: str) -> list:
    """What a third process (the Celery worker, say) reads through the selectors."""
    return manage_shell_json(env, READ.format(node=node), "READ")


@pytest.mark.service
def test_two_server_processes_on_one_redis_serve_the_same_telemetry(tmp_path):
    if not redis_up():
        pytest.skip("service mode: needs a Redis server")
    env, seed = install(tmp_path / "var", service=True)
    first = Server(env, tmp_path / "first.log")
    try:
        second = Server(env, tmp_path / "second.log")
        try:
            dashboard = connect(second.url.replace("http", "ws") + "/ws/dashboard/", open_timeout=10,
                                additional_headers={"Cookie": f"sessionid={seed['session']}"},
                                origin=second.url)
            send_heartbeat(first, seed)
            api = httpx.Client(base_url=second.url, headers={"Authorization": f"Token {seed['token']}"})
            latest = {"node": seed["node"]}
            nodes = until(lambda: api.get("/api/v1/telemetry/", params=latest).json()["nodes"], timeout_s=5)
            assert nodes, (tmp_path / "first.log").read_text()[-3000:]
            [sample] = nodes
            assert sample["devices"][0]["utilization_pct"] == 77.0
            assert sample["stages"][0]["stats"]["step_ms"] == 31.5
            assert 0 <= sample["age_s"] < 10 and not sample["stale"]
            # The second process's dashboard socket got the sample through the channel layer.
            device = f"{seed['node']}/gpu0"
            deadline = time.monotonic() + 10
            while True:
                snapshot = json.loads(dashboard.recv(timeout=max(0.1, deadline - time.monotonic())))
                dashboard.send(json.dumps({"ack": snapshot["version"]}))
                if device in snapshot["devices"]:
                    break
            assert snapshot["devices"][device]["utilization_pct"] == 77.0
            dashboard.close()
            gpu, stage = read_in_another_process(env, seed["node"])
            assert gpu["utilization_pct"] == 77.0
            assert stage[0] == seed["node"] and stage[1]["stats"]["step_ms"] == 31.5 and 0 <= stage[2] < 30
        finally:
            second.stop()
    finally:
        first.stop()
    import redis

    keys = (f"node:{seed['node']}", "stage:d7-r0-s1", "nodes")
    redis.Redis.from_url(REDIS_URL).delete(*[f"motley:1:telemetry:{k}" for k in keys])


def test_the_embedded_default_shares_its_telemetry_with_the_celery_workers_process(tmp_path):
    env, seed = install(tmp_path / "var", service=False)
    server = Server(env, tmp_path / "server.log")
    try:
        send_heartbeat(server, seed)
        gpu, stage = read_in_another_process(env, seed["node"])
        assert gpu["utilization_pct"] == 77.0 and stage[1]["state"] == "ready"
        assert (tmp_path / "var" / "cache").is_dir()  # under the install's var/, as settings.CACHES says
    finally:
        server.stop()
