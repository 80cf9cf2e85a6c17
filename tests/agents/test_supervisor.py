"""Supervision of real child processes (the stand-in stage): start, idempotence, exits, restarts, stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from agents import load_priority
from agents import supervisor as supervisor_module
from agents.admission import Admission
from agents.discovery.emulated import emulated_devices
from agents.processes import cpu_idle_reversible
from agents.supervisor import RestartPolicy, Supervisor
from tests.agents.helpers import (
    STAND_IN_COMMAND,
    TINY_LAYER_BYTES,
    Events,
    policies,
    stage_spec,
    tiny_model,
    wait_until,
)

FAST = RestartPolicy(max_restarts=2, backoff_s=0.2, max_backoff_s=0.4, stop_grace_s=1.0)


@pytest.fixture
def events():
    return Events()


@pytest.fixture
def spec(tmp_path):
    model = tiny_model(tmp_path / "model")
    return lambda **kw: stage_spec(model, **{"device": "cuda:0", **kw})


@pytest.fixture
def supervisor(tmp_path, tiny_fleet, events):
    sup = Supervisor(tmp_path / "state", Admission(emulated_devices(tiny_fleet, "box")), events,
                     command=STAND_IN_COMMAND, policy=FAST)
    yield sup
    sup.close()


@pytest.mark.skipif(not cpu_idle_reversible(), reason="needs CAP_SYS_NICE (root): without it no stage "
                    "loads idle, since nothing could make it normal again")
def test_a_background_stage_loads_idle_and_is_scheduled_normally_once_ready_or_when_its_time_is_up(
    supervisor, events, spec, tmp_path, monkeypatch
):
    """Loading (reading, quantizing weights) nobody waits for yields to the stages already serving on
    the same CPUs, as during a handover beside the old pipeline; the stage serves at normal priority.
    A start someone waits for (an in-place pause) loads at normal priority."""
    go = tmp_path / "go"
    loading = supervisor.start("d7-r0-s0", spec(ready_when=str(go)), background=True)
    wait_until(lambda: policies(loading.pid) == {os.SCHED_IDLE}, what="the loading stage idle")
    urgent = supervisor.start("d7-r0-s1", spec(stage_index=1, ready_when=str(go)))
    assert policies(urgent.pid) == {os.SCHED_OTHER}
    go.touch()
    events.wait_for(lambda s: s.stage_key == "d7-r0-s0" and s.state == "ready")
    assert policies(loading.pid) == {os.SCHED_OTHER}

    monkeypatch.setattr(load_priority, "LOAD_IDLE_S", 0.5)
    slow = supervisor.start("d7-r0-s2", spec(stage_index=2, ready_when=str(tmp_path / "never")),
                            background=True)
    wait_until(lambda: policies(slow.pid) == {os.SCHED_IDLE}, what="the slow stage idle")
    wait_until(lambda: policies(slow.pid) == {os.SCHED_OTHER}, timeout_s=5, what="normal once its time is up")
    assert {s.state for s in events.seen if s.stage_key == "d7-r0-s2"} == {"starting"}  # loading still


def test_start_reports_ready_and_stats_and_runs_on_the_cpu_paced_like_the_device(
    supervisor, events, spec, tmp_path
):
    status = supervisor.start("d7-r0-s0", spec())
    assert status.state == "starting" and status.pid and (status.deployment_id, status.replica) == (7, 0)
    events.wait_for(lambda s: s.state == "ready")
    spec_file = tmp_path / "state/stages/d7-r0-s0/spec.json"
    assert spec_file.stat().st_mode & 0o077 == 0  # the spec carries the pipeline's auth_token
    written = json.loads(spec_file.read_text())
    assert written["device"] == "cpu"
    assert written["emulation"]["memory_bandwidth_gbs"] == 320 and written["emulation"]["time_scale"] > 1
    (snapshot_status, usage), = wait_until(
        lambda: [x for x in supervisor.snapshot() if x[1].busy_fraction > 0],
        what="a device usage from two stats lines")
    assert snapshot_status.stats["steps"] > 0
    assert 0.3 < usage.busy_fraction <= 1.0  # 10 steps/s x 50 ms
    assert usage.memory_bytes == 100 * 1024**2 + TINY_LAYER_BYTES + 2_621_440  # + its prefill workspace
    assert usage.device_index == 0 and usage.tx_bytes_per_s > 0


def test_a_heads_broken_pipeline_is_told_at_once_with_the_stage_it_lost(supervisor, events, spec):
    """The head's ``health`` event names the stage its pipeline lost: sent as the status's
    ``broken_stage`` in a stage event of its own (liveness may learn from it that the node of that
    stage died), and cleared when the pipeline is whole again."""
    supervisor.start("d7-r0-s0", spec(health=[{"after_s": 0.3, "ok": False, "broken_stage": 2},
                                              {"after_s": 0.7, "ok": True}]))
    broken = events.wait_for(lambda s: s.broken_stage == 2)
    assert broken.state == "ready" and broken.stage_key == "d7-r0-s0"
    after = len(events.seen)
    events.wait_for(lambda s: s.broken_stage is None and any(s is later for later in events.seen[after:]))
    assert [status.broken_stage for status, _ in supervisor.snapshot()] == [None]


def test_the_same_start_twice_runs_one_process_and_a_new_spec_replaces_it(supervisor, events, spec):
    first = supervisor.start("k", spec())
    again = supervisor.start("k", spec())
    assert again.pid == first.pid
    assert len([s for s in events.seen if s.state == "starting"]) == 1
    replaced = supervisor.start("k", spec(kv_tokens_note="changed"))
    assert replaced.pid != first.pid and not psutil.pid_exists(first.pid)


def test_a_replaced_stage_is_told_so_with_sigusr1_and_stops_at_once(supervisor, events, spec):
    """A stage that would sit out SIGTERM's whole grace (it ignores it) stops at once when replaced."""
    first = supervisor.start("k", spec(ignore_sigterm=True))
    events.wait_for(lambda s: s.state == "ready")
    started = time.monotonic()
    replaced = supervisor.start("k", spec(ignore_sigterm=True, note="changed"))
    assert time.monotonic() - started < 0.9  # no SIGKILL after the 1 s grace
    assert replaced.pid != first.pid
    old = events.wait_for(lambda s: s.pid is None and s.state == "exited")
    assert old.exit_code == 0 and old.message == "stopped on request"


def test_a_replaced_stage_is_followed_by_its_new_process_without_waiting_for_the_next_poll(
        supervisor, events, spec, monkeypatch):
    """The new spec's process starts as soon as the old one exited (EXIT_POLL_S), not at the supervisor's
    next poll: an in-place handover replaces an agent's stages one after another, each waiting. The poll
    is stretched to 3 s so that the bound is loose enough for a busy machine and still fails if a
    replacement waits for it."""
    monkeypatch.setattr(supervisor_module, "POLL_S", 3.0)
    supervisor.start("k", spec())
    events.wait_for(lambda s: s.state == "ready")
    time.sleep(3.1)  # the loop now waits on the stretched poll
    took = []
    for note in ("a", "b"):
        started = time.monotonic()
        new = supervisor.start("k", spec(note=note))
        took.append(time.monotonic() - started)
        events.wait_for(lambda s, pid=new.pid: s.state == "ready" and s.pid == pid)
    assert max(took) < 1.5, took


def test_a_crash_is_reported_within_two_seconds_restarted_with_backoff_then_given_up(
    supervisor, events, spec
):
    supervisor.start("k", spec(crash_after_s=0.3, exit_code=3, error="CUDA out of memory"))
    first = events.wait_for(lambda s: s.state == "ready")
    crashed_at = time.monotonic()
    crash = events.wait_for(lambda s: s.exit_code == 3)
    assert time.monotonic() - crashed_at < 2.5  # the stand-in crashes ~0.4 s after ready
    assert crash.state == "starting" and crash.restarts == 1 and "CUDA out of memory" in crash.message
    failed = events.wait_for(lambda s: s.state == "failed", timeout_s=15)
    assert failed.restarts == 2 and "gave up" in failed.message
    pids = {s.pid for s in events.seen if s.pid}
    assert len(pids) == 3 and first.pid in pids
    (status, _), = supervisor.snapshot()
    assert status.state == "failed"  # stays listed for the control plane to see


def test_a_crash_without_an_error_event_quotes_stderr(supervisor, events, spec):
    supervisor.start("k", spec(crash_after_s=0.1, exit_code=9))
    crash = events.wait_for(lambda s: s.exit_code == 9)
    assert "exited with code 9" in crash.message and "crashing as scripted" in crash.message


def test_stop_terms_then_kills_and_takes_the_process_group_down(supervisor, events, spec):
    status = supervisor.start("k", spec(ignore_sigterm=True, spawn_child=True))
    events.wait_for(lambda s: s.state == "ready")
    group = [p for p in psutil.process_iter() if _pgid(p) == status.pid]
    assert len(group) == 2  # the stage and its child
    started = time.monotonic()
    stopped = supervisor.stop("k")
    assert stopped.state == "exited" and stopped.exit_code == -signal.SIGKILL
    assert 0.9 < time.monotonic() - started < 3  # the 1 s grace, then SIGKILL
    wait_until(lambda: not [p for p in group if p.is_running() and p.status() != psutil.STATUS_ZOMBIE],
               timeout_s=2, what="the group gone")  # SIGKILLed already; the kernel tears it down
    assert supervisor.snapshot() == []


def test_stop_lets_a_stage_drain_on_sigterm_and_exit_cleanly_within_its_grace(supervisor, events, spec):
    supervisor.start("k", spec())
    events.wait_for(lambda s: s.state == "ready")
    started = time.monotonic()
    stopped = supervisor.stop("k")
    assert time.monotonic() - started < 0.9  # the stand-in exits on SIGTERM: no SIGKILL after the 1 s grace
    assert (stopped.state, stopped.exit_code, stopped.message) == ("exited", 0, "stopped on request")
    assert [s.state for s in events.seen][-2:] == ["draining", "exited"]  # reported while it drained
    assert supervisor.snapshot() == []


def test_sync_stops_only_the_unwanted(supervisor, events, spec):
    for key in ("a", "b", "c"):
        supervisor.start(key, spec(pipeline_id="d1-r0", memory_mib=10))
    assert supervisor.sync(["b"]) == ["a", "c"]
    assert [s.stage_key for s, _ in supervisor.snapshot()] == ["b"]


def test_a_stage_over_the_emulated_memory_budget_is_refused(supervisor, events, spec):
    supervisor.start("big", spec(memory_mib=300))
    refused = supervisor.start("too-big", spec(memory_mib=300))  # T4 of 1 GiB (588.8 usable) holds 303.8 MiB
    assert refused.state == "failed" and refused.pid is None
    assert refused.message == ("refused: does not fit on emulated box/gpu0 (T4, 1.00 GiB): needs 303.8 MiB "
                               "(weights 1.3 MiB + KV 300.0 MiB + workspace 2.5 MiB) but 285.0 MiB is usable "
                               "(588.8 MiB after the reserve, 303.8 MiB held by other stages)")
    assert supervisor.start("elsewhere", spec(memory_mib=300), device_index=1).state == "starting"
    assert supervisor.stop("big").state == "exited"
    assert supervisor.start("too-big", spec(memory_mib=300)).state == "starting"  # the memory is free again
    unknown = supervisor.start("nowhere", spec(device="cuda:7"))
    assert unknown.state == "failed" and "device index 7 does not exist" in unknown.message


def test_an_emulated_cpu_spec_goes_to_the_first_device_of_its_model_with_room(
    supervisor, events, spec, tmp_path
):
    t4 = {"memory_bandwidth_gbs": 320.0, "fp16_tflops": 65.0, "time_scale": 5}
    assert supervisor.start("d1-r0-s1", spec(device="cpu", emulation=t4, memory_mib=300)).state == "starting"
    refused = supervisor.start("d1-r0-s2", spec(device="cpu", emulation=t4, memory_mib=300))
    assert refused.state == "failed" and "box/gpu0" in refused.message
    written = json.loads((tmp_path / "state/stages/d1-r0-s1/spec.json").read_text())
    # The control plane's figures are kept (the file is the parsed spec's JSON: every field of it).
    assert written["emulation"] == {**t4, "speed_factor": 1.0, "throttle_file": None, "host_link_gbs": None}
    devices = {s.stage_key: usage.device_index for s, usage in supervisor.snapshot()}
    assert devices == {"d1-r0-s1": 0, "d1-r0-s2": None}


def test_a_new_supervisor_kills_stages_a_killed_agent_left_running(tmp_path, tiny_fleet):
    """The pid-file sweep, for stages that outlived their agent (here: forked by a helper process that
    exits without PDEATHSIG reaching them, by starting them itself and recording their pids)."""
    state = tmp_path / "state"
    stage_dir = state / "stages" / "old"
    stage_dir.mkdir(parents=True)
    (stage_dir / "spec.json").write_text(json.dumps(stage_spec(tiny_model(tmp_path / "model"))))
    leftover = subprocess.Popen([*STAND_IN_COMMAND, "--spec", str(stage_dir / "spec.json")],
                                stdout=subprocess.DEVNULL, start_new_session=True)
    from agents.processes import write_pid_record

    write_pid_record(stage_dir / "pid.json", leftover.pid)
    (state / "stages" / "stale").mkdir()
    (state / "stages" / "stale" / "pid.json").write_text(json.dumps({"pid": os.getpid(), "create_time": 1.0}))
    sup = Supervisor(state, Admission(emulated_devices(tiny_fleet, "box")), Events(),
                     command=STAND_IN_COMMAND)
    try:
        assert sup.swept_pids == [leftover.pid]  # the stale record names a live pid of another process
        assert leftover.wait(timeout=5) is not None
    finally:
        sup.close()


def test_stages_die_with_a_sigkilled_agent(tmp_path, tiny_fleet):
    """PR_SET_PDEATHSIG: a supervisor in a process that is kill -9'd takes its stages with it."""
    script = f"""
import sys, time
sys.path.insert(0, {str(os.getcwd())!r})
from agents.admission import Admission
from agents.discovery.emulated import emulated_devices
from agents.supervisor import Supervisor
from tests.agents.helpers import STAND_IN_COMMAND, stage_spec, tiny_model
from pathlib import Path
sup = Supervisor({str(tmp_path / 'state')!r}, Admission(emulated_devices({str(tiny_fleet)!r}, "box")),
                 lambda s: None, command=STAND_IN_COMMAND)
model = tiny_model(Path({str(tmp_path / 'model')!r}))
print(sup.start("k", stage_spec(model, device="cuda:0")).pid, flush=True)
time.sleep(600)
"""
    agent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    stage_pid = int(agent.stdout.readline())
    assert psutil.pid_exists(stage_pid)
    agent.kill()
    agent.wait()
    wait_until(lambda: not psutil.pid_exists(stage_pid)
               or psutil.Process(stage_pid).status() == psutil.STATUS_ZOMBIE,
               timeout_s=5, what="stage gone with its agent")


def _pgid(process: psutil.Process) -> int | None:
    try:
        return os.getpgid(process.pid)
    except ProcessLookupError:
        return None
