"""The emulated throttle knob and the fleet file's speed factor, as the agent models them: the factor
file the stages read, the metrics the control plane sees, and the spec admission writes."""

from __future__ import annotations

import json
import re

import pytest

from agents.admission import Admission
from agents.discovery.emulated import (
    MODELED_SM_CLOCK_MHZ,
    THROTTLED_TEMPERATURE_C,
    EmulatedMetrics,
    emulated_devices,
)
from agents.queue_consumer import build_app
from agents.stage_usage import StageUsage
from agents.throttle import ThrottleRefused, Throttles
from contracts.fleet_file import FleetFileError, parse_fleet
from contracts.stage_spec import StageSpec
from contracts.tasks import SET_THROTTLE
from tests.agents.helpers import stage_spec, tiny_model

GIB = 1024**3

ISLAND_FLEET = """
name: islands
nodes:
  - name: box
    gpus:
      - model: A100-80GB-SXM
        count: 2
        nvlink: true
      - model: T4
        speed_factor: 0.5
"""


@pytest.fixture
def island_fleet(tmp_path):
    path = tmp_path / "islands.yaml"
    path.write_text(ISLAND_FLEET)
    return path


def test_a_throttle_is_written_for_the_stages_and_refused_off_an_emulated_card(tmp_path, tiny_fleet):
    throttles = Throttles(tmp_path / "throttle", emulated_devices(tiny_fleet, "box"))
    assert json.loads(throttles.path(1).read_text()) == {"factor": 1.0}  # every card starts at full speed
    assert throttles.set(1, 0.25) == 0.25
    assert throttles.factor(1) == 0.25 and throttles.factor(0) == 1.0
    assert json.loads(throttles.path(1).read_text()) == {"factor": 0.25}
    for bad in (0, 1.5, -1, "fast", True, None):
        with pytest.raises(ThrottleRefused, match=r"factor must be a number in \(0, 1\]"):
            throttles.set(1, bad)
    with pytest.raises(ThrottleRefused, match="device index 9 is not an emulated device"):
        throttles.set(9, 0.5)
    assert throttles.factor(1) == 0.25  # a refused change changes nothing
    again = Throttles(tmp_path / "throttle", emulated_devices(tiny_fleet, "box"))  # the agent restarted
    assert again.factor(1) == 1.0 and json.loads(throttles.path(1).read_text()) == {"factor": 1.0}


def test_a_throttled_card_reports_it_and_a_recovered_one_stops(tmp_path, tiny_fleet):
    devices = emulated_devices(tiny_fleet, "box")
    throttles = Throttles(tmp_path / "throttle", devices)
    metrics = EmulatedMetrics(devices, throttles)
    busy = [StageUsage(1, GIB, 0.5, 0.0, 0.0)]
    before = metrics.sample(busy)[1]
    assert before.throttle_reasons == ()
    assert before.sm_clock_mhz == before.sm_clock_max_mhz == MODELED_SM_CLOCK_MHZ
    throttles.set(1, 0.5)
    cool, hot = metrics.sample(busy)
    assert hot.throttle_reasons == ("sw_thermal",)
    assert (hot.sm_clock_mhz, hot.sm_clock_max_mhz) == (MODELED_SM_CLOCK_MHZ // 2, MODELED_SM_CLOCK_MHZ)
    assert hot.temperature_c >= THROTTLED_TEMPERATURE_C > before.temperature_c
    assert cool.throttle_reasons == () and cool.sm_clock_mhz == MODELED_SM_CLOCK_MHZ  # only the one card
    throttles.set(1, 1.0)
    recovered = metrics.sample(busy)[1]
    assert recovered.throttle_reasons == () and recovered.sm_clock_mhz == MODELED_SM_CLOCK_MHZ
    assert recovered.temperature_c == before.temperature_c


def test_the_set_throttle_task_reaches_the_metrics(tmp_path, tiny_fleet):
    devices = emulated_devices(tiny_fleet, "box")
    throttles = Throttles(tmp_path / "throttle", devices)
    metrics = EmulatedMetrics(devices, throttles)
    app = build_app("memory://", {}, "node.t", supervisor=None, throttles=throttles, incarnation=lambda: 2)
    task = app.tasks[SET_THROTTLE]
    assert task(device_index=0, factor=0.5, incarnation=2) == {"device_index": 0, "factor": 0.5}
    assert metrics.sample([])[0].throttle_reasons == ("sw_thermal",)
    with pytest.raises(ThrottleRefused):
        task(device_index=0, factor=2, incarnation=2)
    without = build_app("memory://", {}, "node.t", supervisor=None, incarnation=lambda: 2)
    with pytest.raises(ThrottleRefused, match="no emulated device"):
        without.tasks[SET_THROTTLE](device_index=0, factor=0.5, incarnation=2)


def test_admission_gives_an_emulated_stage_its_cards_speed_factor_and_throttle_file(tmp_path, island_fleet):
    devices = emulated_devices(island_fleet, "box")
    assert [d.speed_factor for d in devices] == [1.0, 1.0, 0.5]
    throttles = Throttles(tmp_path / "throttle", devices)
    admission = Admission(devices, time_scale=3.0, throttles=throttles)
    spec = stage_spec(tiny_model(tmp_path / "model"), stage_index=2, memory_mib=10)
    admitted = admission.admit(StageSpec.from_dict(spec), [], device_index=2)
    assert admitted.spec.to_json()["emulation"] == {
        "memory_bandwidth_gbs": 320.0, "fp16_tflops": 65.0, "time_scale": 3.0, "speed_factor": 0.5,
        "throttle_file": str(throttles.path(2)), "host_link_gbs": None}
    parsed = StageSpec.from_dict(admitted.spec.to_json())
    assert parsed.emulation.speed_factor == 0.5  # what the stage process will read
    # The control plane's figures are kept; what only the node knows is the node's.
    sent = {**spec, "emulation": {"memory_bandwidth_gbs": 1.0, "fp16_tflops": 2.0, "time_scale": 4.0,
                                  "speed_factor": 7.0}}
    emulation = admission.admit(StageSpec.from_dict(sent), [], device_index=0).spec.emulation
    assert (emulation.memory_bandwidth_gbs, emulation.speed_factor) == (1.0, 1.0)


def test_a_slower_card_than_its_catalog_is_not_reported_as_throttled(tmp_path, island_fleet):
    devices = emulated_devices(island_fleet, "box")
    slow = EmulatedMetrics(devices, Throttles(tmp_path / "throttle", devices)).sample([])[2]
    assert slow.throttle_reasons == () and slow.sm_clock_mhz == slow.sm_clock_max_mhz


def test_a_hop_inside_an_nvlink_island_is_nvlink_and_any_other_is_pcie(island_fleet):
    """s0 on gpu0 -> s1 on gpu1 (the same island) -> s2 on the T4 (PCIe) -> the next node."""
    devices = emulated_devices(island_fleet, "box")
    address = "tcp://10.0.0.1:{}".format
    usages = [
        StageUsage(0, GIB, 0.5, 100.0, 1.0, listen=address(1), next=address(2)),
        StageUsage(1, GIB, 0.5, 200.0, 100.0, listen=address(2), next=address(3)),
        StageUsage(2, GIB, 0.5, 300.0, 200.0, listen=address(3), next="tcp://10.0.0.2:1"),
    ]
    gpu0, gpu1, t4 = EmulatedMetrics(devices).sample(usages)
    assert (gpu0.nvlink_tx_bytes_per_s, gpu0.nvlink_rx_bytes_per_s) == (100.0, 0.0)
    assert (gpu0.pcie_tx_bytes_per_s, gpu0.pcie_rx_bytes_per_s) == (0.0, 1.0)  # from the gateway
    assert (gpu1.nvlink_tx_bytes_per_s, gpu1.nvlink_rx_bytes_per_s) == (0.0, 100.0)
    assert (gpu1.pcie_tx_bytes_per_s, gpu1.pcie_rx_bytes_per_s) == (200.0, 0.0)  # to the T4
    assert (t4.pcie_tx_bytes_per_s, t4.pcie_rx_bytes_per_s) == (300.0, 200.0)  # out to the next node
    assert t4.nvlink_tx_bytes_per_s is None and t4.nvlink_rx_bytes_per_s is None  # no NVLink to chart
    json.dumps([gpu0.__dict__, t4.__dict__])


def test_two_stages_on_one_card_exchange_through_pcie(island_fleet):
    devices = emulated_devices(island_fleet, "box")
    usages = [StageUsage(0, GIB, 0.5, 50.0, 0.0, listen="tcp://h:1", next="tcp://h:2"),
              StageUsage(0, GIB, 0.5, 0.0, 50.0, listen="tcp://h:2", next=None)]
    gpu0 = EmulatedMetrics(devices).sample(usages)[0]
    assert gpu0.nvlink_tx_bytes_per_s == gpu0.nvlink_rx_bytes_per_s == 0.0
    assert (gpu0.pcie_tx_bytes_per_s, gpu0.pcie_rx_bytes_per_s) == (50.0, 50.0)


@pytest.mark.parametrize("gpu, emulated, message", [
    ({"model": "T4", "speed_factor": 0}, True, "gpus[0].speed_factor: expected a positive number, got 0"),
    ({"model": "T4", "speed_factor": "slow"}, True, "gpus[0].speed_factor: expected a positive number"),
    ({"model": "T4", "speed_factor": 0.5}, False, "gpus[0].speed_factor: applies to emulated devices only"),
])
def test_a_bad_speed_factor_is_refused_with_its_path(gpu, emulated, message):
    with pytest.raises(FleetFileError, match=re.escape(message)):
        parse_fleet({"name": "f", "emulated": emulated, "nodes": [{"name": "n", "gpus": [gpu]}]})
