"""NVML discovery: the real code path against a stand-in NVML here, against the driver on GPU hosts."""

import pynvml
import pytest

from agents.discovery.nvml import NvmlMetrics, discover_devices, nvml_available, sample_metrics
from agents.discovery.nvml_counters import NvlinkCounters
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
    (device,) = discover_devices("n",
                                 nvml=fake_nvml([FakeGpu("NVIDIA Future X1", "00000000:01:00.0", 8 * GIB)]))
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


def test_max_clock_and_nvlink_throughput_summed_over_the_active_links():
    gpus = _node_with_an_nvlink_pair_and_a_t4()
    nvml = fake_nvml(gpus)
    now = [100.0]
    counters = NvlinkCounters(nvml, clock=lambda: now[0])
    first = sample_metrics(nvml, counters)
    assert first[0].nvlink_tx_bytes_per_s is None  # one reading is no rate yet
    assert [m.sm_clock_max_mhz for m in first] == [1980, 1980, 1980]
    gpus[0].nvlink_tx_kib = [1000, 1000, 0, 2000]  # KiB sent over each of its four links
    gpus[0].nvlink_rx_kib = [10, 0, 0, 0]
    now[0] += 2.0
    a100, peer, t4 = sample_metrics(nvml, counters)
    assert a100.nvlink_tx_bytes_per_s == 4000 * 1024 / 2.0 and a100.nvlink_rx_bytes_per_s == 10 * 1024 / 2.0
    assert peer.nvlink_tx_bytes_per_s == peer.nvlink_rx_bytes_per_s == 0.0  # linked, idle: drawn as 0
    assert t4.nvlink_tx_bytes_per_s is None and t4.nvlink_rx_bytes_per_s is None  # no NVLink: not drawn
    now[0] += 1.0
    assert sample_metrics(nvml, counters)[0].nvlink_tx_bytes_per_s == 0.0  # counters unchanged


def test_a_driver_without_the_nvlink_throughput_fields_reports_none():
    gpus = _node_with_an_nvlink_pair_and_a_t4()
    gpus[0].nvlink_fields = False
    metrics = NvmlMetrics(fake_nvml(gpus))
    assert metrics.sample()[0].nvlink_tx_bytes_per_s is None
    assert metrics.sample()[1].nvlink_tx_bytes_per_s == 0.0  # primed at start: the first sample has a rate
    metrics.close()


def test_health_counters_ecc_xid_and_retired_pages():
    gpus = _node_with_an_nvlink_pair_and_a_t4()
    gpus[0].ecc_uncorrected = 2
    gpus[0].remapped_rows = (3, 1, 0, 0)
    gpus[1].xid_events = [79, 13, 48]  # fell off the bus, an application's fault (not counted), DBE
    gpus[2].ecc_uncorrected = None  # no ECC on this card
    gpus[2].remapped_rows, gpus[2].retired = None, [0x1000, 0x2000]  # a pre-Ampere card retires pages
    metrics = NvmlMetrics(fake_nvml(gpus))
    a100, peer, t4 = metrics.sample()
    assert (a100.ecc_errors, a100.retired_pages, a100.xid_errors) == (2, 4, 0)
    assert peer.xid_errors == 2 and peer.ecc_errors == 0
    assert (t4.ecc_errors, t4.retired_pages) == (None, 2)
    gpus[1].xid_events = [94]
    assert metrics.sample()[1].xid_errors == 3  # counted since the agent started
    metrics.close()
    assert sample_metrics(fake_nvml(gpus))[1].xid_errors is None  # a one-off sample watches no events


def test_a_card_without_xid_events_or_remapping_reports_none():
    gpus = _node_with_an_nvlink_pair_and_a_t4()
    gpus[2].xid_supported = False
    gpus[2].remapped_rows = None
    metrics = NvmlMetrics(fake_nvml(gpus))
    t4 = metrics.sample()[2]
    assert t4.xid_errors is None and t4.retired_pages is None
    metrics.close()


@pytest.mark.skipif(not nvml_available(), reason="no NVIDIA driver/GPU on this machine")
def test_real_nvml_discovery_on_a_gpu_host():
    devices = discover_devices("local")
    assert devices and all(d.memory_bytes > 0 and d.uuid.startswith("GPU-") for d in devices)
    metrics = NvmlMetrics()
    try:
        samples = metrics.sample()
        assert len(samples) == len(devices)
        for sample, device in zip(samples, devices):
            assert sample.sm_clock_max_mhz and 0 < sample.sm_clock_mhz <= sample.sm_clock_max_mhz
            # NVLink figures where the card has NVLink peers here (a rate from the first sample); a
            # card linked only to NVSwitch ports has no island but may report them too.
            if device.nvlink_island is not None:
                assert sample.nvlink_tx_bytes_per_s is not None and sample.nvlink_rx_bytes_per_s is not None
    finally:
        metrics.close()
