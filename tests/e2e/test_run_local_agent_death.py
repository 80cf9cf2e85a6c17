"""`make run` (run_local) with its demo, when a local agent is killed with SIGKILL: the control plane
stays up and, with --restart-agents, the agent comes back and the node is READY. Without it the agent
is left exited (its node turns LOST, as a lost stage's node does in tests/e2e/test_handover.py): the
supervisor's part of that is tested on plain processes below, without a system of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import psutil
import pytest

from controlplane.ops.process_group import ProcessGroup, python_argv
from controlplane.ops.supervision import supervise
from tests.e2e.harness import TIMING, wait_until
from tests.support.processes import (
    REPO_ROOT,
    database_migrate,
    embedded_env,
    free_port,
    manage_argv,
    read_credentials,
)

pytestmark = pytest.mark.slow

FLEET = """name: agent-death
nodes:
  - name: {a}
    gpus: [{{model: T4}}]
  - name: {b}
    gpus: [{{model: T4}}]
"""


def _start(tmp_path: Path, demo_model: Path, *extra: str) -> tuple[subprocess.Popen, str, dict]:
    env = {**embedded_env(tmp_path), **TIMING, "PYTHONUNBUFFERED": "1"}
    database_migrate(env)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET.format(a="death-a", b="death-b"))
    port = free_port()
    argv = manage_argv("run_local", "--port", str(port), "--demo-model", str(demo_model),
                       "--demo-fleet", str(fleet), *extra)
    log = tmp_path / "run_local.log"
    with log.open("w") as out:  # a file, not a pipe: nothing blocks on a reader
        launcher = subprocess.Popen(argv, env=env, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "demo: READY" in log.read_text() or launcher.poll() is not None, 240, "the demo")
        assert launcher.poll() is None, "run_local ended before its demo was READY"
    except AssertionError as exc:
        _stop(launcher)
        raise AssertionError(f"{exc}; its output:\n{log.read_text()[-4000:]}") from None
    return launcher, f"http://127.0.0.1:{port}", {
        "Authorization": f"Token {read_credentials(tmp_path)['api_token']}"}


def _node(base: str, headers: dict, name: str) -> dict:
    nodes = httpx.get(f"{base}/api/v1/nodes/", headers=headers, timeout=10).json()
    rows = nodes["results"] if isinstance(nodes, dict) else nodes
    return next(node for node in rows if node["name"] == name)


def _agent(launcher: subprocess.Popen, node: str) -> psutil.Process:
    return next(p for p in psutil.Process(launcher.pid).children()
                if "agents" in p.cmdline() and node in p.cmdline())


def _stop(launcher: subprocess.Popen) -> None:
    children = psutil.Process(launcher.pid).children(recursive=True)
    launcher.send_signal(signal.SIGTERM)
    launcher.wait(timeout=60)
    psutil.wait_procs(children, timeout=10)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def test_a_killed_agent_is_restarted_and_the_control_plane_stays_up(tmp_path, demo_model):
    launcher, base, headers = _start(tmp_path, demo_model, "--restart-agents")
    try:
        agent, before = _agent(launcher, "death-a"), _node(base, headers, "death-a")["incarnation"]
        os.kill(agent.pid, signal.SIGKILL)
        # back within the backoff (1 s), before its node could turn LOST (4 s)
        wait_until(lambda: (node := _node(base, headers, "death-a"))["incarnation"] > before
                   and node["status"] == "ready", 90, "death-a registered again and READY")
        assert _agent(launcher, "death-a").pid != agent.pid
        assert launcher.poll() is None
        assert httpx.get(f"{base}/api/v1/deployments/", headers=headers, timeout=10).status_code == 200
    finally:
        _stop(launcher)
    output = (tmp_path / "run_local.log").read_text()
    assert "agent death-a exited with code -9; the control plane stays up" in output
    assert "restarting it in 1s" in output and "stopping everything" not in output


def test_supervise_leaves_an_exited_agent_by_default_and_returns_on_a_control_plane_exit():
    group, reports = ProcessGroup(), []
    group.start("agent n1", python_argv("-c", "raise SystemExit(3)"), essential=False)
    group.start("asgi", python_argv("-c", "import time; time.sleep(3)"))
    try:
        name, code = supervise(group, restart_agents=False, lost_after_s=15, report=reports.append)
    finally:
        group.stop()
    assert (name, code) == ("asgi", 0)
    [report] = reports  # once: nothing restarts it to exit again
    assert "agent n1 exited with code 3; the control plane stays up" in report and "not restarted" in report


def test_supervise_restarts_a_crashing_agent_with_a_growing_delay_and_returns_on_a_control_plane_exit():
    group, reports = ProcessGroup(), []
    group.start("agent n1", python_argv("-c", "raise SystemExit(3)"), essential=False)
    group.start("asgi", python_argv("-c", "import time; time.sleep(8)"))
    started = time.monotonic()
    try:
        name, code = supervise(group, restart_agents=True, lost_after_s=15, report=reports.append)
    finally:
        group.stop()
    assert (name, code) == ("asgi", 0) and time.monotonic() - started >= 7.5
    delays = [line.split("restarting it in ")[1].split("s")[0] for line in reports if "exited" in line]
    assert delays[:3] == ["1", "2", "4"]  # doubled while it keeps failing
    assert all("agent n1 exited with code 3; the control plane stays up" in line
               for line in reports if "exited" in line)
