"""``python -m agents run`` against a real control plane (daphne, embedded mode: SQLite and the
filesystem broker): it registers, heartbeats, takes tasks from its queue, and leaves no process behind
when stopped or kill -9'd."""

from __future__ import annotations

import json
import shlex
import signal
import sqlite3
import subprocess
import sys

import pytest
from celery import Celery
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from agents.discovery.emulated import emulated_devices
from agents.queue_consumer import START_STAGE
from agents.registration import register
from agents.telemetry import websocket_url
from tests.agents.helpers import STAND_IN_COMMAND, daphne, stage_spec, tiny_model, wait_until
from tests.support.processes import REPO_ROOT, database_migrate, embedded_env, free_port, manage_argv

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory):
    """One daphne for the module; yields (url, env, var_dir)."""
    var = tmp_path_factory.mktemp("var")
    env = {**embedded_env(var), "MOTLEY_NODE_LOST_AFTER_S": "600"}
    database_migrate(env)
    with daphne(env) as url:
        yield url, env, var


@pytest.fixture(autouse=True)
def no_orphans():
    """The module-scoped daphne outlives each test: the agent's own tests check their processes."""
    yield


def _join_token(env) -> str:
    out = subprocess.run(manage_argv("create_join_token", "--ttl", "10m"), env=env, cwd=REPO_ROOT,
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()


def _node(var, name: str):
    with sqlite3.connect(var / "motley.sqlite3") as db:
        return db.execute("SELECT id, incarnation, status, last_heartbeat FROM inventory_node WHERE name = ?",
                          (name,)).fetchone()


def _agent(url, env, token, fleet, state, name="box") -> subprocess.Popen:
    argv = [sys.executable, "-m", "agents", "run", "--server", url, "--join-token", token, "--emulate",
            str(fleet), "--node", "box", "--name", name, "--state-dir", str(state),
            "--stage-command", shlex.join(STAND_IN_COMMAND)]
    log = open(state.parent / f"agent-{name}.log", "a")  # read by the assertions' messages
    return subprocess.Popen(argv, env=env, cwd=REPO_ROOT, stderr=log, stdout=log)


def _log(state, name="box") -> str:
    return (state.parent / f"agent-{name}.log").read_text()[-4000:]


def _send(var, name: str, **kwargs) -> None:
    """A task as the control plane sends it: JSON, stamped with the node's incarnation now."""
    with sqlite3.connect(var / "motley.sqlite3") as db:
        kwargs["incarnation"] = db.execute("SELECT incarnation FROM inventory_node WHERE id = ?",
                                           (int(kwargs["queue"].removeprefix("node.")),)).fetchone()[0]
    app = Celery("test-controller", broker="filesystem://", set_as_current=False, fixups=[])
    app.conf.broker_transport_options = {
        "data_folder_in": str(var / "broker"), "data_folder_out": str(var / "broker"),
        "processed_folder": str(var / "broker-processed"), "control_folder": str(var / "broker-control"),
        "store_processed": False,
    }
    app.send_task(name, kwargs=kwargs, queue=kwargs.pop("queue"), serializer="json")
    app.close()


def _pid_of(state, key: str) -> int:
    return wait_until(lambda: (state / "stages" / key / "pid.json").exists()
                      and json.loads((state / "stages" / key / "pid.json").read_text())["pid"],
                      timeout_s=15, what=f"stage {key} running")


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] == "Z"
    except FileNotFoundError:
        return True


def test_agent_registers_heartbeats_runs_a_task_and_stops_everything(control_plane, tiny_fleet, tmp_path):
    url, env, var = control_plane
    agent = _agent(url, env, _join_token(env), tiny_fleet, tmp_path / "state")
    try:
        node_id, incarnation, status, first_beat = wait_until(lambda: _node(var, "box"), timeout_s=20,
                                                              what="node registered")
        assert incarnation >= 1 and status == "ready"
        wait_until(lambda: _node(var, "box")[3] != first_beat, timeout_s=5, what="a heartbeat")
        spec = stage_spec(tiny_model(tmp_path / "model"), device="cuda:0")
        _send(var, START_STAGE, queue=f"node.{node_id}", stage_key="d99-r0-s1", spec=spec)
        pid = _pid_of(tmp_path / "state", "d99-r0-s1")
    finally:
        agent.send_signal(signal.SIGTERM)
        code = agent.wait(timeout=30)
    assert code == 0, _log(tmp_path / "state")
    assert _gone(pid)


def test_a_kill_9_agent_takes_its_stages_along_and_a_restart_is_a_new_incarnation(control_plane, tiny_fleet,
                                                                                 tmp_path):
    url, env, var = control_plane
    token = _join_token(env)
    agent = _agent(url, env, token, tiny_fleet, tmp_path / "state", name="box9")
    try:
        node_id, first, _, _ = wait_until(lambda: _node(var, "box9"), timeout_s=20, what="node registered")
        spec = stage_spec(tiny_model(tmp_path / "model"), device="cuda:0")
        _send(var, START_STAGE, queue=f"node.{node_id}", stage_key="d98-r0-s1", spec=spec)
        pid = _pid_of(tmp_path / "state", "d98-r0-s1")
        agent.kill()
        agent.wait(timeout=10)
        wait_until(lambda: _gone(pid), timeout_s=5, what="the stage gone with its agent")
        agent = _agent(url, env, token, tiny_fleet, tmp_path / "state", name="box9")
        wait_until(lambda: _node(var, "box9")[1] == first + 1, timeout_s=20, what="incarnation + 1")
        assert not (tmp_path / "state" / "stages" / "d98-r0-s1" / "pid.json").exists()
    finally:
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0, _log(tmp_path / "state", "box9")


def test_a_refused_join_token_stops_the_agent_with_the_servers_reason(control_plane, tiny_fleet, tmp_path):
    url, env, _ = control_plane
    agent = _agent(url, env, "mjt_not-a-token", tiny_fleet, tmp_path / "state")
    assert agent.wait(timeout=30) == 2
    assert "join token refused: unknown join token" in _log(tmp_path / "state")


async def test_one_nodes_credential_cannot_act_as_another_node(control_plane, tiny_fleet):
    url, env, _ = control_plane
    token = _join_token(env)
    a, b = (register(server=url, join_token=token, name=name, address="127.0.0.1",
                     devices=emulated_devices(tiny_fleet, "box", name)) for name in ("cred-a", "cred-b"))
    assert a.node_id != b.node_id and a.queue != b.queue
    with pytest.raises(InvalidStatus) as refused:
        b_as_a = {"Authorization": f"Node {a.node_id}:{b.node_credential}"}
        async with connect(websocket_url(url), additional_headers=b_as_a):
            pass
    assert refused.value.response.status_code == 403
    async with connect(websocket_url(url), additional_headers={"Authorization": b.authorization}) as own:
        await own.send(json.dumps({"type": "heartbeat", "incarnation": b.incarnation, "seq": 1, "sent_at": 0,
                                   "devices": [], "stages": []}))


def test_an_agent_waiting_for_an_absent_server_retries_and_stops_on_sigterm(tiny_fleet, tmp_path):
    absent = f"http://127.0.0.1:{free_port()}"
    agent = _agent(absent, embedded_env(tmp_path), "mjt_x", tiny_fleet, tmp_path / "state")
    try:
        wait_until(lambda: _log(tmp_path / "state").count("retrying in") >= 2, timeout_s=20,
                   what="registration retried")
    finally:
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=10) == 0, _log(tmp_path / "state")
