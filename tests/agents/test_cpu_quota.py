"""The warm-up CPU quota (agents/cpu_quota.py): a cgroup that caps what its processes take together,
and the fork server held to it until warm (agents/fork_server.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from agents.admission import Admission
from agents.cpu_quota import CpuQuota
from agents.discovery.emulated import emulated_devices
from agents.fork_server import FOLDER, ForkServer
from agents.supervisor import Supervisor
from contracts.names import FORK_SERVER_WARM_FILE
from tests.agents.helpers import STAND_IN_COMMAND, Events, stage_spec, tiny_model, wait_until
from tests.agents.test_fork_server import COLD_SERVER, servers


def quota_available() -> bool:
    probe = CpuQuota("motley-probe", 0.5)
    probe.close()
    return probe.available


pytestmark = pytest.mark.skipif(not quota_available(), reason="no writable cgroup with the cpu controller "
                                "(needs root, or a delegated cgroup v2): processes then run without a quota")


def cpu_cgroup(pid: int) -> str:
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    return next(line for line in lines if ":cpu," in line or ":cpu:" in line or line.startswith("0::"))


def test_a_busy_process_in_the_group_takes_no_more_than_its_quota():
    quota = CpuQuota("motley-test", 0.2)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        quota.add(busy.pid)
        assert cpu_cgroup(busy.pid).endswith("/motley-test")
        process = psutil.Process(busy.pid)
        before, started = sum(process.cpu_times()[:2]), time.monotonic()
        time.sleep(2.0)
        share = (sum(process.cpu_times()[:2]) - before) / (time.monotonic() - started)
        assert share < 0.3, f"took {share:.2f} CPUs under a 0.2 quota"
        quota.remove(busy.pid)
        assert "motley-test" not in cpu_cgroup(busy.pid)
    finally:
        busy.kill()
        busy.wait()
        quota.close()


def test_a_warming_fork_server_is_held_to_the_quota_until_warm(tmp_path, no_orphans):
    forks = ForkServer(tmp_path, [sys.executable, "-c", COLD_SERVER])
    try:
        forks.replenish(now=100.0)
        server = wait_until(lambda: servers(no_orphans), timeout_s=10, what="a fork server")[0]
        assert cpu_cgroup(server.pid).endswith("/motley-fork-server")
        (tmp_path / FOLDER / FORK_SERVER_WARM_FILE).touch()  # as the real one writes it once imported
        forks.replenish(now=101.0)
        assert "motley-fork-server" not in cpu_cgroup(server.pid)  # before it forks: its stages inherit it
    finally:
        forks.close()


def test_a_background_start_loads_under_the_quota_and_serves_out_of_it(tmp_path, tiny_fleet):
    """A stage started ``background`` (beside a serving pipeline) loads in the loading quota's cgroup
    and leaves it once ready; an ordinary start never joins it."""
    events, go, model = Events(), tmp_path / "go", tiny_model(tmp_path / "model")
    supervisor = Supervisor(tmp_path / "state", Admission(emulated_devices(tiny_fleet, "box")), events,
                            command=STAND_IN_COMMAND)

    def spec(**kw):
        return stage_spec(model, **{"device": "cuda:0", **kw})

    try:
        beside = supervisor.start("d7-r0-s0", spec(ready_when=str(go)), background=True)
        assert cpu_cgroup(beside.pid).endswith("/motley-loading")
        urgent = supervisor.start("d7-r0-s1", spec(stage_index=1))
        assert "motley-loading" not in cpu_cgroup(urgent.pid)
        go.touch()
        events.wait_for(lambda s: s.stage_key == "d7-r0-s0" and s.state == "ready")
        assert "motley-loading" not in cpu_cgroup(beside.pid)
    finally:
        supervisor.close()


def test_the_fork_server_of_an_agent_serving_nothing_warms_up_uncapped(tmp_path, no_orphans):
    forks = ForkServer(tmp_path, [sys.executable, "-c", COLD_SERVER])
    try:
        forks.replenish(now=100.0, capped=False)
        server = wait_until(lambda: servers(no_orphans), timeout_s=10, what="a fork server")[0]
        assert "motley-fork-server" not in cpu_cgroup(server.pid)
    finally:
        forks.close()
