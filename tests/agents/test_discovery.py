"""From the command line to the devices an agent registers and the metrics it sends."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from agents.agent import discover
from agents.config import from_args, parser
from agents.stage_usage import StageUsage
from tests.agents.fake_nvml import FakeGpu, fake_nvml

GIB = 1024**3


def _config(*args: str):
    return from_args(parser().parse_args(["run", "--server", "http://cp:8000", "--join-token", "t", *args]))


def test_an_emulated_node_is_renamed_marked_and_its_metrics_follow_its_stages(tiny_fleet):
    devices, metrics = discover(_config("--emulate", str(tiny_fleet), "--node", "box", "--name", "lab-1"))
    assert [(d.name, d.node, d.model, d.emulated) for d in devices] == [
        ("lab-1/gpu0", "lab-1", "T4", True), ("lab-1/gpu1", "lab-1", "A100-80GB-SXM", True)]
    assert devices[0].uuid == "EMULATED-lab-1-gpu0" and devices[0].memory_bytes == GIB
    idle, busy = metrics.sample([StageUsage(1, 10 * GIB, 0.9, 5e6, 1e6), StageUsage(1, GIB, 0.3, 0, 0)])
    assert (idle.utilization_pct, idle.memory_used_bytes, idle.temperature_c) == (0.0, 0, 35.0)
    assert busy.utilization_pct == 100.0 and busy.memory_used_bytes == 11 * GIB
    assert busy.temperature_c > idle.temperature_c and busy.power_w > idle.power_w
    assert busy.pcie_tx_bytes_per_s == 5e6 and busy.emulated and idle.emulated
    json.dumps([asdict(m) for m in (idle, busy)])  # goes into heartbeats as is


def test_a_gpu_node_is_discovered_through_nvml():
    nvml = fake_nvml([FakeGpu("Tesla T4", "00000000:41:00.0", 15 * GIB, utilization=40)])
    config = _config()
    devices, metrics = discover(config, nvml)
    assert [(d.name, d.model, d.emulated) for d in devices] == [(f"{config.name}/gpu0", "T4", False)]
    (sample,) = metrics.sample([])
    assert sample.utilization_pct == 40 and not sample.emulated
    metrics.close()


def test_without_gpus_or_a_fleet_file_the_agent_says_what_to_do():
    with pytest.raises(ValueError, match="use --emulate FLEET_FILE --node NODE"):
        discover(_config(), fake_nvml([]))


@pytest.mark.parametrize("args, message", [
    (["--emulate", "fleet.yaml"], "--emulate FLEET_FILE and --node NODE go together"),
    (["--node", "box"], "--emulate FLEET_FILE and --node NODE go together"),
])
def test_emulation_needs_both_the_file_and_the_node(args, message):
    with pytest.raises(SystemExit, match=message):
        _config(*args)


def test_the_join_token_can_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("MOTLEY_JOIN_TOKEN", "mjt_env")
    config = from_args(parser().parse_args(["run", "--server", "http://cp:8000"]))
    assert config.join_token == "mjt_env"


def test_the_state_dir_follows_the_installation_var_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("MOTLEY_VAR_DIR", str(tmp_path))
    assert _config("--name", "n1").state_dir == tmp_path / "agents" / "n1"


def test_a_relative_var_dir_is_made_absolute_where_the_agent_starts(monkeypatch, tmp_path):
    """Stage processes run in folders of their own: a spec path relative to the agent's folder would
    not be found from there (every stage failed with 'cannot read stage spec')."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MOTLEY_VAR_DIR", "var")
    assert _config("--name", "n1").state_dir == tmp_path / "var" / "agents" / "n1"
    assert _config("--name", "n1", "--state-dir", "here").state_dir == tmp_path / "here"
