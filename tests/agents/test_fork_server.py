"""The stage fork server (agents/fork_server.py, worker_runtime/fork_server.py) with the real runtime:
stages are forked from it warm, are the agent's own children (their exit codes read as for any
child), run in their folders, die with a SIGKILLed agent; a dead server leaves starts to the ordinary
spawn; a warming server is idle and normal before it forks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import psutil
import pytest

from agents.admission import Admission
from agents.discovery.emulated import emulated_devices
from agents.fork_server import FOLDER, IDLE_WARM_UP_S, ForkServer
from agents.processes import cpu_idle_reversible
from agents.supervisor import Supervisor
from contracts.names import FORK_SERVER_WARM_FILE
from tests.agents.helpers import Events, policies, tagged_processes, wait_until
from tests.support.processes import REPO_ROOT, free_port

pytestmark = pytest.mark.slow


def servers(tag: str) -> list[psutil.Process]:
    """The fork servers the test started (a forked stage shares their command line: found by cwd)."""
    found = []
    for process in tagged_processes(tag):
        try:
            if process.cwd().endswith(FOLDER):
                found.append(process)
        except psutil.Error:
            continue
    return found


def one_stage_spec(model, pipeline: str = "d5-r0") -> dict:
    address = f"tcp://127.0.0.1:{free_port()}"
    return {"pipeline_id": pipeline, "auth_token": "secret", "model_path": str(model), "stage_index": 0,
            "num_stages": 1, "layers": [0, 2], "bits": 16, "dtype": None, "device": "cpu", "threads": 1,
            "kv_tokens": 256, "listen": address, "next": None, "head": address, "peer_timeout_s": 2.0,
            "emulation": None}


@pytest.fixture
def events():
    return Events()


@pytest.fixture
def supervisor(tmp_path, tiny_fleet, events):
    sup = Supervisor(tmp_path / "state", Admission(emulated_devices(tiny_fleet, "box")), events)
    yield sup
    sup.close()


def warm_server(stages_dir) -> int:
    folder = stages_dir / FOLDER
    wait_until(lambda: (folder / FORK_SERVER_WARM_FILE).exists(), timeout_s=90, what="a warm fork server")
    return json.loads((folder / "pid.json").read_text())["pid"]


def test_stages_are_forked_warm_as_the_agents_own_children_and_run_their_specs(
    tmp_path, supervisor, events, demo_model, no_orphans
):
    stages_dir = tmp_path / "state/stages"
    server = warm_server(stages_dir)
    first = supervisor.start("d5-r0-s0", one_stage_spec(demo_model), device_index=0)
    second = supervisor.start("d6-r0-s0", one_stage_spec(demo_model, "d6-r0"), device_index=1)
    for status, key in ((first, "d5-r0-s0"), (second, "d6-r0-s0")):
        process = psutil.Process(status.pid)
        assert process.ppid() == os.getpid()  # adopted: the supervisor's process waits for it
        assert "--spec" not in process.cmdline()  # forked from the server, not started cold
        assert process.cwd() == str(stages_dir / key)
        assert os.readlink(f"/proc/{status.pid}/fd/2") == str(stages_dir / key / "stderr.log")
        assert os.getpgid(status.pid) == status.pid  # its own process group, as every stage
        assert f'"pid": {status.pid}' in (stages_dir / key / "pid.json").read_text()
        events.wait_for(lambda s, key=key: s.stage_key == key and s.state == "ready", timeout_s=60)
    wait_until(lambda: all(s.stats for s, _ in supervisor.snapshot()), timeout_s=10, what="stats lines")
    assert psutil.Process(server).is_running()  # one server forks them all
    for key in ("d5-r0-s0", "d6-r0-s0"):
        stopped = supervisor.stop(key)
        assert (stopped.state, stopped.exit_code) == ("exited", 0), stopped.message
    supervisor.close()
    assert not servers(no_orphans)  # the agent's stop kills the server
    assert not (stages_dir / FOLDER / "pid.json").exists()


def test_a_forked_stage_that_fails_reports_its_exit_code_and_reason(
    tmp_path, supervisor, events, demo_model, no_orphans
):
    broken = tmp_path / "broken-model"
    shutil.copytree(demo_model, broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(b"not safetensors")
    warm_server(tmp_path / "state/stages")
    status = supervisor.start("d5-r0-s0", one_stage_spec(broken), device_index=0)
    assert "--spec" not in psutil.Process(status.pid).cmdline()
    failed = events.wait_for(lambda s: s.exit_code is not None, timeout_s=60)
    assert failed.exit_code == 1
    assert "exited with code 1" in failed.message and "SafetensorError" in failed.message


def test_a_dead_server_leaves_the_start_to_an_ordinary_spawn(
    tmp_path, supervisor, events, demo_model, no_orphans
):
    server = psutil.Process(warm_server(tmp_path / "state/stages"))
    server.kill()
    server.wait(timeout=5)
    status = supervisor.start("d5-r0-s0", one_stage_spec(demo_model), device_index=0)
    assert status.state == "starting"
    ready = events.wait_for(lambda s: s.state == "ready", timeout_s=60)
    assert "--spec" in psutil.Process(ready.pid).cmdline()


def test_the_server_and_the_stages_it_forked_die_with_a_sigkilled_agent(tmp_path, tiny_fleet, demo_model,
                                                                         no_orphans):
    spec = json.dumps(one_stage_spec(demo_model))
    script = f"""
import json, sys, time
from pathlib import Path
from agents.admission import Admission
from agents.discovery.emulated import emulated_devices
from agents.supervisor import Supervisor
state = Path({str(tmp_path / 'state')!r})
sup = Supervisor(state, Admission(emulated_devices({str(tiny_fleet)!r}, "box")), lambda s: None)
while not (state / "stages/{FOLDER}/{FORK_SERVER_WARM_FILE}").exists():
    time.sleep(0.05)
print(sup.start("d5-r0-s0", json.loads({spec!r}), device_index=0).pid, flush=True)
time.sleep(600)
"""
    agent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        stage = psutil.Process(int(agent.stdout.readline()))
        server = servers(no_orphans)[0]
        assert "--spec" not in stage.cmdline() and stage.ppid() == agent.pid
    finally:
        agent.kill()
        agent.wait()
    for process in (server, stage):
        wait_until(lambda p=process: not p.is_running() or p.status() == psutil.STATUS_ZOMBIE, timeout_s=5,
                   what=f"process {process.pid} gone with its agent")


# A server that never warms up: a second thread, then it blocks, as the real one does while importing.
COLD_SERVER = """
import threading, time
threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
time.sleep(600)
"""


@pytest.mark.skipif(not cpu_idle_reversible(), reason="needs CAP_SYS_NICE (root): without it the server is "
                    "never made idle, since nothing could make it normal again")
def test_a_server_warms_up_idle_and_is_normal_once_warm_or_cold_for_too_long(tmp_path, no_orphans):
    """Its imports must not take CPU from serving stages, and the stages it forks inherit its policy:
    warm, or still cold after IDLE_WARM_UP_S, it is scheduled normally."""
    forks = ForkServer(tmp_path, [sys.executable, "-c", COLD_SERVER], idle=True)
    try:
        forks.replenish(now=100.0)
        server = wait_until(lambda: servers(no_orphans), timeout_s=10, what="a fork server")[0]
        wait_until(lambda: len(os.listdir(f"/proc/{server.pid}/task")) == 2, what="its second thread")
        assert policies(server.pid) == {os.SCHED_IDLE}
        assert forks.take(tmp_path / "spec.json") is None  # cold: the caller spawns the ordinary way
        forks.replenish(now=100.0 + IDLE_WARM_UP_S - 1)
        assert policies(server.pid) == {os.SCHED_IDLE}  # cold, but not for long yet
        forks.replenish(now=100.0 + IDLE_WARM_UP_S)
        assert policies(server.pid) == {os.SCHED_OTHER}
        forks.replenish(now=200.0)
        assert servers(no_orphans) == [server]  # one server, not one more each tick
    finally:
        forks.close()
    assert not servers(no_orphans)
