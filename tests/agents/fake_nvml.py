"""A stand-in for the pynvml module describing a node that has no real NVIDIA GPU here.

It implements only the calls motley makes, with NVML's own constants (taken from pynvml), so the
discovery code under test is exactly what runs on a GPU host.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

import pynvml


@dataclass
class FakeGpu:
    name: str
    bus_id: str
    total_bytes: int
    used_bytes: int = 0
    nvlink_peers: list[str] = field(default_factory=list)  # bus ids, one per active link
    utilization: int = 0
    temperature: int = 40
    power_mw: int = 100_000
    throttle_bits: int = 0
    numa: int = 0


def fake_nvml(gpus: list[FakeGpu]) -> types.SimpleNamespace:
    memory = lambda g: types.SimpleNamespace(total=g.total_bytes, used=g.used_bytes, free=g.total_bytes - g.used_bytes)  # noqa: E731
    pci = lambda bus: types.SimpleNamespace(busId=bus.encode())  # noqa: E731

    def link_state(g, link):
        if link >= len(g.nvlink_peers):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.NVML_FEATURE_ENABLED

    return types.SimpleNamespace(
        NVML_NVLINK_MAX_LINKS=pynvml.NVML_NVLINK_MAX_LINKS,
        NVML_FEATURE_ENABLED=pynvml.NVML_FEATURE_ENABLED,
        NVML_TEMPERATURE_GPU=pynvml.NVML_TEMPERATURE_GPU,
        NVML_CLOCK_SM=pynvml.NVML_CLOCK_SM,
        NVML_PCIE_UTIL_TX_BYTES=pynvml.NVML_PCIE_UTIL_TX_BYTES,
        NVML_PCIE_UTIL_RX_BYTES=pynvml.NVML_PCIE_UTIL_RX_BYTES,
        nvmlClocksThrottleReasonSwPowerCap=pynvml.nvmlClocksThrottleReasonSwPowerCap,
        nvmlClocksThrottleReasonHwSlowdown=pynvml.nvmlClocksThrottleReasonHwSlowdown,
        nvmlClocksThrottleReasonSwThermalSlowdown=pynvml.nvmlClocksThrottleReasonSwThermalSlowdown,
        nvmlClocksThrottleReasonHwThermalSlowdown=pynvml.nvmlClocksThrottleReasonHwThermalSlowdown,
        nvmlClocksThrottleReasonHwPowerBrakeSlowdown=pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda i: gpus[i],
        nvmlDeviceGetName=lambda g: g.name,
        nvmlDeviceGetUUID=lambda g: f"GPU-{g.bus_id}",
        nvmlDeviceGetPciInfo=lambda g: pci(g.bus_id),
        nvmlDeviceGetMemoryInfo=memory,
        nvmlDeviceGetMaxPcieLinkGeneration=lambda g: 4,
        nvmlDeviceGetMaxPcieLinkWidth=lambda g: 16,
        nvmlDeviceGetNumaNodeId=lambda g: g.numa,
        nvmlDeviceGetNvLinkState=link_state,
        nvmlDeviceGetNvLinkRemotePciInfo=lambda g, link: pci(g.nvlink_peers[link]),
        nvmlDeviceGetUtilizationRates=lambda g: types.SimpleNamespace(gpu=g.utilization, memory=0),
        nvmlDeviceGetTemperature=lambda g, sensor: g.temperature,
        nvmlDeviceGetPowerUsage=lambda g: g.power_mw,
        nvmlDeviceGetEnforcedPowerLimit=lambda g: 300_000,
        nvmlDeviceGetClockInfo=lambda g, clock: 1410,
        nvmlDeviceGetCurrentClocksEventReasons=lambda g: g.throttle_bits,
        nvmlDeviceGetPcieThroughput=lambda g, counter: 2048 if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else 1024,
    )
