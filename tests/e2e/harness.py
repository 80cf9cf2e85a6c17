"""The whole system as real processes: run_local (ASGI server, Celery worker, beat), agents with an
emulated fleet, and the stage processes they start; every process is killed when the test ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.support.processes import (
    REPO_ROOT,
    database_migrate,
    embedded_env,
    free_port,
    manage_argv,
    read_credentials,
    stage_ports,
    wait_for_http,
)

FLEET = """
name: e2e
nodes:
{nodes}
"""
NODE = """  - name: {name}
    address: 127.0.0.1
    gpus:
      - model: T4
        count: {count}
        overrides: {overrides}
"""
# Short clocks so failures show within seconds; an emulated T4 paced lightly (CPU time dominates).
TIMING = {
    "MOTLEY_AGENT_HEARTBEAT_INTERVAL_S": "1",
    "MOTLEY_NODE_LOST_AFTER_S": "4",
    "MOTLEY_NODE_HEALTH_CHECK_INTERVAL_S": "1",
    "MOTLEY_RECONCILE_INTERVAL_S": "2",
    "MOTLEY_EMULATION_TIME_SCALE": "1",
    "MOTLEY_LOG_LEVEL": "WARNING",
}


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@dataclass
class System:
    workdir: Path
    env: dict[str, str]
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    port: int = 0
    api_token: str = ""
    join_token: str = ""
    host: str = "127.0.0.1"  # the control plane's address (tests/multihost: one of its network's)

    # --- set-up -----------------------------------------------------------------------------------

    def manage(self, *args: str) -> str:
        done = subprocess.run(manage_argv(*args), env=self.env, cwd=REPO_ROOT, capture_output=True, text=True)
        assert done.returncode == 0, f"manage.py {' '.join(args)}: {done.stderr[-3000:]}"
        return done.stdout

    def start(self) -> None:
        database_migrate(self.env)
        self.port = free_port()
        self._spawn("control-plane", manage_argv("run_local", "--host", self.host, "--port", str(self.port),
                                                     "--no-demo"))
        wait_for_http(f"{self.url}/api/schema/", timeout_s=60)
        self.api_token = read_credentials(Path(self.env["MOTLEY_VAR_DIR"]))["api_token"]
        self.join_token = self.manage("create_join_token", "--ttl", "10m").strip()

    def start_agents(self, names: list[str], overrides: str = "{}",
                     cards: dict[str, int] | None = None) -> None:
        """One agent per name, each emulating a node with one T4 (``cards``: how many on a node, if more;
        ``overrides``: the fleet file's, e.g. ``{memory_gib: 0.5}``)."""
        fleet = self.workdir / "fleet.yaml"
        fleet.write_text(FLEET.format(nodes="".join(self.fleet_node(n, overrides, (cards or {}).get(n, 1))
                                                    for n in names)))
        for name in names:
            self.start_agent(name)
        wait_until(lambda: len(self.get("/api/v1/nodes/")["results"]) == len(names), 60, "agents registered")

    def start_agent(self, name: str, join_token: str | None = None, node: str | None = None) -> None:
        """An agent named ``name`` emulating fleet node ``node`` (default: the node of that name)."""
        self._spawn(f"agent-{name}", [
            *self.launcher(name), sys.executable, "-m", "agents", "run", "--server", self.url,
            "--emulate", str(self.workdir / "fleet.yaml"),
            "--node", node or name, "--name", name, "--address", self.node_address(name),
            "--state-dir", str(self.workdir / "agents" / name), "--log-level", "WARNING",
        ], env={"MOTLEY_JOIN_TOKEN": join_token or self.join_token})

    # Where each node lives: here one host, loopback; tests/multihost gives each its own namespace.
    def fleet_node(self, name: str, overrides: str, count: int = 1) -> str:
        return NODE.format(name=name, overrides=overrides, count=count)

    def launcher(self, name: str) -> list[str]:
        return []

    def node_address(self, name: str) -> str:
        return "127.0.0.1"

    def run_agent_until_exit(self, name: str, join_token: str, timeout_s: float) -> int:
        self.start_agent(name, join_token, node="n0")
        return self.processes[f"agent-{name}"].wait(timeout=timeout_s)

    def revoke_join_token(self) -> None:
        self.manage("revoke_join_token", self.join_token[:12])

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = open(self.workdir / f"{name}.log", "w")  # noqa: SIM115  (closed with the process)
        self.processes[name] = subprocess.Popen(argv, env={**self.env, **(env or {})}, cwd=REPO_ROOT,
                                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2500:]}" for p in sorted(self.workdir.glob("*.log")))

    # --- API --------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def get(self, path: str) -> Any:
        response = httpx.get(self.url + path, headers=self._auth, timeout=10)
        assert response.status_code == 200, response.text
        return response.json()

    def post(self, path: str, body: dict | None = None) -> httpx.Response:
        return httpx.post(self.url + path, json=body or {}, headers=self._auth, timeout=30)

    @property
    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Token {self.api_token}"}

    def deployment(self, pk: int) -> dict:
        return self.get(f"/api/v1/deployments/{pk}/")

    def wait_status(self, pk: int, status: str, timeout_s: float) -> dict:
        try:
            return wait_until(lambda: (d := self.deployment(pk))["status"] == status and d, timeout_s,
                              f"deployment {status}")
        except AssertionError:
            raise AssertionError(f"{self.deployment(pk)}\n{self.logs()}") from None

    def endpoints(self, pk: int) -> list[dict]:
        """What the gateway would get (the selector), read through the control plane's own settings."""
        script = (
            "import json, dataclasses;"
            "from controlplane.deployments.models import Deployment;"
            "from controlplane.deployments.selectors import deployment_endpoints;"
            f"endpoints = deployment_endpoints(deployment=Deployment.objects.get(pk={pk}));"
            "print(json.dumps([dataclasses.asdict(e) for e in endpoints]))"
        )
        return json.loads(self.manage("shell", "-c", script).strip().splitlines()[-1])

    # --- tear-down --------------------------------------------------------------------------------

    def kill(self, name: str) -> None:
        os.kill(self.processes[name].pid, signal.SIGKILL)
        self.processes[name].wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM the agents (they stop their stages) and the control plane together: nothing is left
        to serve, so neither waits for the other. SIGKILL what lingers."""
        descendants = []
        for process in self.processes.values():
            try:
                descendants += psutil.Process(process.pid).children(recursive=True)
            except psutil.Error:
                pass
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        for child in descendants:
            try:
                child.kill()
            except psutil.Error:
                pass


def stage_processes(workdir: Path) -> list[psutil.Process]:
    """Live stage worker processes started for this system, and its agents' fork servers: they run in
    their agent's stages folder under workdir (a stage forked by the fork server has the server's
    command line: agents/fork_server.py)."""
    found = []
    for process in psutil.process_iter(["cmdline", "cwd"]):
        try:
            cmdline = process.info["cmdline"] or []
            runtime = {"worker_runtime.serve", "worker_runtime.fork_server"} & set(cmdline)
            if runtime and str(workdir) in (process.info["cwd"] or ""):
                if process.status() != psutil.STATUS_ZOMBIE:
                    found.append(process)
        except psutil.Error:
            continue
    return found


def embedded_system_at(workdir: Path, **env: str) -> System:
    """A System (not started) on SQLite and the filesystem broker, as `make run` starts them, in
    ``workdir`` with the short TIMING clocks, ``env`` and stage ports of its own."""
    return System(workdir=workdir, env={**embedded_env(workdir / "var"), **TIMING, **env,
                                        "MOTLEY_STAGE_PORTS": stage_ports()})


@contextmanager
def running(system: System, *, check_leftovers: bool = True) -> Iterator[System]:
    """``system`` started for the block, then stopped; stage processes left behind are killed and,
    with ``check_leftovers``, fail the test."""
    try:
        system.start()
        yield system
    finally:
        system.stop()
        leftovers = stage_processes(system.workdir)
        for process in leftovers:
            process.kill()
        if check_leftovers:
            assert not leftovers, f"stage processes outlived the system: {[p.cmdline() for p in leftovers]}"
