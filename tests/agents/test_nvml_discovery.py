"""NVML discovery: the real code path against a stand-in NVML here, against the driver on GPU hosts."""

import pynvml
import pytest

from agents.discovery.nvml import discover_devices, nvml_available, sample_metrics
from contracts.gpu_catalog import lookup
from tests.agents.fake_nvml import FakeGpu, fake_nvml

GIB = 1024**3


def _node_with_an_nvlink_pair_and_a_t4():
    return [
        FakeGpu("NVIDIA A100-SXM4-80GB", "00000000:07:00.0", 80 * GIB, nvlink_peers=["00000000:0f:00.0"] * 4),
        FakeGpu("NVIDIA A100-SXM4-80GB", "00000000:0F:00.0", 80 * GIB, nvlink_peers=["00000000:07:00.0"] * 4),
        FakeGpu("Tesla T4", "00000000:41:00.0", 15 * GIB, used_bytes=GIB, numa=1),
    ]


def test_discovery_fills_speed_from_the_catalog_and_groups_nvlink_peers():
    devices = discover_devices("node-a", nvml=fake_nvml(_node_with_an_nvlink_pair_and_a_t4()))
    a100, a100_peer, t4 = devices
    assert [d.name for d in devices] == ["node-a/gpu0", "node-a/gpu1", "node-a/gpu2"]
    assert a100.model == "A100-80GB-SXM" and t4.model == "T4"
    assert a100.memory_bandwidth_gbs == lookup("A100-80GB-SXM").memory_bandwidth_gbs
    assert t4.fp16_tflops == lookup("T4").fp16_tflops
    assert a100.nvlink_island == a100_peer.nvlink_island is not None
    assert a100.nvlink_bandwidth_gbs > 0
    assert t4.nvlink_island is None and t4.nvlink_bandwidth_gbs == 0
    assert t4.memory_bytes == 15 * GIB and t4.memory_used_bytes == GIB and t4.numa_node == 1
    assert not any(d.emulated for d in devices)


def test_unknown_card_is_kept_with_its_memory_and_no_speed_figures():
    (device,) = discover_devices("n", nvml=fake_nvml([FakeGpu("NVIDIA Future X1", "00000000:01:00.0", 8 * GIB)]))
    assert device.model == "NVIDIA Future X1"
    assert device.memory_bytes == 8 * GIB and device.memory_bandwidth_gbs == 0


def test_metrics_report_throttling_and_pcie_throughput_in_bytes():
    gpus = _node_with_an_nvlink_pair_and_a_t4()
    gpus[2].throttle_bits = pynvml.nvmlClocksThrottleReasonHwThermalSlowdown
    gpus[2].temperature = 91
    gpus[2].utilization = 77
    metrics = sample_metrics(nvml=fake_nvml(gpus))
    assert metrics[2].throttle_reasons == ("hw_thermal",)
    assert metrics[0].throttle_reasons == ()
    assert (metrics[2].temperature_c, metrics[2].utilization_pct) == (91, 77)
    assert metrics[0].pcie_tx_bytes_per_s == 2048 * 1024
    assert metrics[0].power_w == 100.0


@pytest.mark.skipif(not nvml_available(), reason="no NVIDIA driver/GPU on this machine")
def test_real_nvml_discovery_on_a_gpu_host():
    devices = discover_devices("local")
    assert devices and all(d.memory_bytes > 0 and d.uuid.startswith("GPU-") for d in devices)
    pynvml.nvmlInit()
    try:
        assert len(sample_metrics()) == len(devices)
    finally:
        pynvml.nvmlShutdown()
