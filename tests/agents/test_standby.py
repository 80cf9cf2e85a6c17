"""The warm standby (agents/standby.py) with the real ``worker_runtime.serve --standby``: a stage
starts from it and runs its spec, a new standby follows, the agent's stop or death takes the standby
along, and one that died before use leaves the next start to the ordinary spawn."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

from agents.admission import Admission
from agents.discovery.emulated import emulated_devices
from agents.processes import cpu_idle_reversible
from agents.standby import IDLE_WARM_UP_S, Standby
from agents.supervisor import Supervisor
from contracts.names import STANDBY_WARM_FILE
from tests.agents.helpers import Events, policies, tagged_processes, wait_until
from tests.support.processes import REPO_ROOT, free_port

pytestmark = pytest.mark.slow


def standbys(tag: str) -> list[psutil.Process]:
    found = []
    for process in tagged_processes(tag):
        try:
            if "--standby" in process.cmdline():
                found.append(process)
        except psutil.Error:
            continue
    return found


def one_stage_spec(model) -> dict:
    address = f"tcp://127.0.0.1:{free_port()}"
    return {"pipeline_id": "d5-r0", "auth_token": "secret", "model_path": str(model), "stage_index": 0,
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


def test_a_stage_starts_from_the_standby_runs_its_spec_and_a_new_standby_follows(
    tmp_path, supervisor, events, demo_model, no_orphans
):
    spare = wait_until(lambda: standbys(no_orphans), timeout_s=30, what="a standby")[0]
    status = supervisor.start("d5-r0-s0", one_stage_spec(demo_model), device_index=0)
    assert status.pid == spare.pid  # no new process: the standby became the stage
    ready = events.wait_for(lambda s: s.state == "ready", timeout_s=60)
    assert ready.pid == spare.pid
    stage_dir = tmp_path / "state/stages/d5-r0-s0"
    assert spare.cwd() == str(stage_dir)
    assert os.readlink(f"/proc/{spare.pid}/fd/2") == str(stage_dir / "stderr.log")
    assert f'"pid": {spare.pid}' in (stage_dir / "pid.json").read_text()
    stats = wait_until(lambda: supervisor.snapshot()[0][0].stats, timeout_s=10, what="a stats line")
    assert stats["kv_tokens_free"] > 0

    following = wait_until(lambda: [p for p in standbys(no_orphans) if p.pid != spare.pid], timeout_s=30,
                           what="the next standby")[0]
    records = (tmp_path / "state/stages").glob("_standby*/pid.json")
    assert any(f'"pid": {following.pid}' in record.read_text() for record in records)
    stopped = supervisor.stop("d5-r0-s0")
    assert (stopped.state, stopped.exit_code) == ("exited", 0), stopped.message
    supervisor.close()
    assert not standbys(no_orphans)  # the agent's stop kills the waiting standbys
    assert not list((tmp_path / "state/stages").glob("_standby*/pid.json"))


def warm_standbys(stages_dir) -> set[int]:
    """Pids of the standbys that say they are warm."""
    return {json.loads((folder / "pid.json").read_text())["pid"] for folder in stages_dir.glob("_standby*")
            if (folder / STANDBY_WARM_FILE).exists() and (folder / "pid.json").exists()}


def test_each_device_has_a_warm_standby_and_two_starts_take_one_each(
    tmp_path, supervisor, events, demo_model, no_orphans
):
    """An in-place handover restarts up to one stage a card at once: each should find a warm process
    (on the demo fleet a node of three cards restarted its second stage cold: 3-5 s more pause)."""
    stages_dir = tmp_path / "state/stages"
    warm = wait_until(lambda: len(pids := warm_standbys(stages_dir)) == 2 and pids, timeout_s=90,
                      what="one warm standby per device (box has two)")
    first = supervisor.start("d5-r0-s0", one_stage_spec(demo_model), device_index=0)
    second = supervisor.start("d6-r0-s0", {**one_stage_spec(demo_model), "pipeline_id": "d6-r0"}, device_index=1)
    assert {first.pid, second.pid} == warm  # both became stages: no cold spawn
    for key in ("d5-r0-s0", "d6-r0-s0"):
        events.wait_for(lambda s, key=key: s.stage_key == key and s.state == "ready", timeout_s=60)
        supervisor.stop(key)


def test_a_standby_that_died_before_use_leaves_the_start_to_an_ordinary_spawn(
    supervisor, events, demo_model, no_orphans
):
    spare = wait_until(lambda: standbys(no_orphans), timeout_s=30, what="a standby")[0]
    spare.kill()
    spare.wait(timeout=5)
    status = supervisor.start("d5-r0-s0", one_stage_spec(demo_model), device_index=0)
    assert status.state == "starting" and status.pid != spare.pid
    ready = events.wait_for(lambda s: s.state == "ready", timeout_s=60)
    assert "--spec" in psutil.Process(ready.pid).cmdline()


def test_the_standby_dies_with_a_sigkilled_agent(tmp_path, tiny_fleet, no_orphans):
    script = f"""
import time
from agents.admission import Admission
from agents.discovery.emulated import emulated_devices
from agents.supervisor import Supervisor
sup = Supervisor({str(tmp_path / 'state')!r}, Admission(emulated_devices({str(tiny_fleet)!r}, "box")),
                 lambda s: None)
time.sleep(600)
"""
    agent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO_ROOT)
    try:
        spare = wait_until(lambda: standbys(no_orphans), timeout_s=30, what="a standby")[0]
    finally:
        agent.kill()
        agent.wait()
    wait_until(lambda: not psutil.pid_exists(spare.pid) or spare.status() == psutil.STATUS_ZOMBIE,
               timeout_s=5, what="the standby gone with its agent")


# A standby that never warms up: a second thread, then it blocks on stdin, as the real one does.
COLD_STANDBY = """
import sys, threading, time
threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
sys.stdin.readline()
time.sleep(600)
"""


@pytest.mark.skipif(not cpu_idle_reversible(), reason="needs CAP_SYS_NICE (root): without it a standby "
                    "is never made idle, since nothing could make it normal again")
def test_a_standby_warms_up_idle_and_runs_its_stage_scheduled_normally(tmp_path, no_orphans):
    """Its imports must not take CPU from serving stages (every handover is followed by them), and the
    stage it becomes must not stay idle: taken, or still cold after IDLE_WARM_UP_S, it is normal."""
    standby = Standby(tmp_path, [sys.executable, "-c", COLD_STANDBY], idle=True)
    try:
        standby.replenish(now=100.0)
        spare = wait_until(lambda: standbys(no_orphans), timeout_s=10, what="a standby")[0]
        wait_until(lambda: len(os.listdir(f"/proc/{spare.pid}/task")) == 2, what="its second thread")
        assert policies(spare.pid) == {os.SCHED_IDLE}
        standby.replenish(now=100.0 + IDLE_WARM_UP_S - 1)
        assert policies(spare.pid) == {os.SCHED_IDLE}  # cold, but not for long yet
        taken = standby.take(tmp_path / "spec.json")
        assert taken is not None and taken.pid == spare.pid
        assert policies(spare.pid) == {os.SCHED_OTHER}

        standby.replenish(now=200.0)  # the next one: never warm, so normal once its time is up
        following = wait_until(lambda: [p for p in standbys(no_orphans) if p.pid != spare.pid], timeout_s=10,
                               what="the next standby")[0]
        assert os.sched_getscheduler(following.pid) == os.SCHED_IDLE
        standby.replenish(now=200.0 + IDLE_WARM_UP_S)
        assert policies(following.pid) == {os.SCHED_OTHER}
    finally:
        standby.close()
        taken_process = psutil.Process(spare.pid)
        taken_process.kill()
        taken_process.wait(timeout=5)
