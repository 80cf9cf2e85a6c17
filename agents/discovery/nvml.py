"""Discovery and per-second metrics of NVIDIA GPUs through NVML (the nvidia-ml-py package).

NVML reports what a card is (name, uuid, memory, PCIe link, NUMA node, NVLink peers) and how it is
doing (utilization, memory used, temperature, power, clocks and the max SM clock, throttle reasons,
PCIe and NVLink throughput, ECC errors, XID events, retired pages: agents/discovery/nvml_counters.py).
It does not report memory bandwidth or tensor throughput: the GPU catalog fills those by name.

Every function takes the NVML module as a parameter (default: the real ``pynvml``) so tests on
machines without a GPU can hand in a stand-in, while on a GPU host this exact code runs.
"""

from __future__ import annotations

import types
from pathlib import Path

from agents.discovery.nvml_counters import (
    NvlinkCounters,
    XidWatch,
    ecc_errors,
    max_sm_clock,
    retired_pages,
)
from contracts.gpu_catalog import UnknownGpuModel, lookup
from contracts.hardware import DeviceSpec
from contracts.metrics import GpuMetrics
from contracts.names import device_name

# The NVML throttle ("clock event") reason bits that mean the card is running slower than it could.
_THROTTLE_BITS = {
    "nvmlClocksThrottleReasonSwPowerCap": "power_cap",
    "nvmlClocksThrottleReasonHwSlowdown": "hw_slowdown",
    "nvmlClocksThrottleReasonSwThermalSlowdown": "sw_thermal",
    "nvmlClocksThrottleReasonHwThermalSlowdown": "hw_thermal",
    "nvmlClocksThrottleReasonHwPowerBrakeSlowdown": "power_brake",
}


def _real_nvml() -> types.ModuleType:
    import pynvml

    return pynvml


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def nvml_available(nvml: types.ModuleType | None = None) -> bool:
    """True when NVML initializes and sees at least one GPU (False on machines without the driver)."""
    nvml = nvml or _real_nvml()
    try:
        nvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: no GPUs to manage here
        return False
    try:
        return nvml.nvmlDeviceGetCount() > 0
    finally:
        nvml.nvmlShutdown()


def discover_devices(node: str, nvml: types.ModuleType | None = None) -> list[DeviceSpec]:
    """Describe every GPU of this node; NVLink-connected GPUs share an island name."""
    nvml = nvml or _real_nvml()
    nvml.nvmlInit()
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        bus_ids = [_text(nvml.nvmlDeviceGetPciInfo(h).busId).lower() for h in handles]
        islands = _nvlink_islands(nvml, handles, bus_ids)
        return [_describe(nvml, node, index, handle, bus_ids[index], islands.get(index))
                for index, handle in enumerate(handles)]
    finally:
        nvml.nvmlShutdown()


def _describe(nvml, node: str, index: int, handle, bus_id: str, island: str | None) -> DeviceSpec:
    name = _text(nvml.nvmlDeviceGetName(handle))
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    try:
        card = lookup(name)
    except UnknownGpuModel:
        card = None  # still usable: memory is known; speed figures stay 0 until declared
    return DeviceSpec(
        name=device_name(node, index),
        node=node,
        index=index,
        model=card.name if card else name,
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        memory_bytes=int(memory.total),
        memory_bandwidth_gbs=card.memory_bandwidth_gbs if card else 0.0,
        fp16_tflops=card.fp16_tflops if card else 0.0,
        bf16_tflops=card.bf16_tflops if card else 0.0,
        int8_tops=card.int8_tops if card else 0.0,
        pcie_gen=int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)),
        pcie_lanes=int(nvml.nvmlDeviceGetMaxPcieLinkWidth(handle)),
        numa_node=_numa_node(nvml, handle, bus_id),
        nvlink_island=island,
        nvlink_bandwidth_gbs=(card.nvlink_gbs if card else 0.0) if island else 0.0,
        memory_used_bytes=int(memory.used),
        emulated=False,
    )


def _numa_node(nvml, handle, bus_id: str) -> int | None:
    try:
        node = nvml.nvmlDeviceGetNumaNodeId(handle)
        return int(node) if node >= 0 else None
    except Exception:  # older drivers lack the call: the kernel knows it from the PCI address
        path = Path("/sys/bus/pci/devices") / bus_id[-12:] / "numa_node"
        try:
            node = int(path.read_text())
        except (OSError, ValueError):
            return None
        return node if node >= 0 else None


def _nvlink_islands(nvml, handles: list, bus_ids: list[str]) -> dict[int, str]:
    """Group GPUs joined by active NVLinks (transitively) and name each group after its first GPU."""
    index_of_bus = {bus: i for i, bus in enumerate(bus_ids)}
    parent = list(range(len(handles)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    linked: set[int] = set()
    for i, handle in enumerate(handles):
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                    continue
                peer_bus = _text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId).lower()
            except Exception:  # no such link on this card (NVML raises NotSupported / InvalidArgument)
                continue
            peer = index_of_bus.get(peer_bus)
            if peer is not None and peer != i:  # NVSwitch ports report the switch's bus id: skip those
                parent[root(i)] = root(peer)
                linked.update((i, peer))
    return {i: f"nvlink-{min(j for j in linked if root(j) == root(i))}" for i in sorted(linked)}


def sample_metrics(
    nvml: types.ModuleType | None = None, nvlink: NvlinkCounters | None = None, xids: XidWatch | None = None
) -> list[GpuMetrics]:
    """One metrics sample per GPU. NVML must stay initialised by the caller for repeated sampling.

    NVLink rates need the previous reading (``nvlink``, kept across calls by ``NvmlMetrics``) and XID
    errors an event watch (``xids``); without them a one-off sample reports neither (None)."""
    nvml = nvml or _real_nvml()
    nvlink = nvlink or NvlinkCounters(nvml)
    if xids is not None:
        xids.drain()
    samples = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        nvlink_tx, nvlink_rx = nvlink.rates(index, handle)
        samples.append(
            GpuMetrics(
                index=index,
                utilization_pct=float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                memory_used_bytes=int(memory.used),
                memory_total_bytes=int(memory.total),
                temperature_c=float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
                power_w=nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                power_limit_w=nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0,
                sm_clock_mhz=int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
                throttle_reasons=_throttle_reasons(nvml, handle),
                # NVML reports KB/s over a 20 ms window.
                pcie_tx_bytes_per_s=(
                    nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_TX_BYTES) * 1024.0),
                pcie_rx_bytes_per_s=(
                    nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_RX_BYTES) * 1024.0),
                sm_clock_max_mhz=max_sm_clock(nvml, handle),
                nvlink_tx_bytes_per_s=nvlink_tx,
                nvlink_rx_bytes_per_s=nvlink_rx,
                ecc_errors=ecc_errors(nvml, handle),
                xid_errors=xids.count(index) if xids is not None else None,
                retired_pages=retired_pages(nvml, handle),
            )
        )
    return samples


def _throttle_reasons(nvml, handle) -> tuple[str, ...]:
    getter = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
              or nvml.nvmlDeviceGetCurrentClocksThrottleReasons)
    bits = int(getter(handle))
    return tuple(label for attr, label in _THROTTLE_BITS.items() if bits & int(getattr(nvml, attr, 0)))


class NvmlMetrics:
    """The agent's per-second metrics source on a GPU host: NVML stays initialised while it lives, and
    so do the NVLink counters' last reading and the XID event watch."""

    def __init__(self, nvml: types.ModuleType | None = None):
        self._nvml = nvml or _real_nvml()
        self._nvml.nvmlInit()
        handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self._nvml.nvmlDeviceGetCount())]
        self._nvlink = NvlinkCounters(self._nvml)
        for index, handle in enumerate(handles):  # the first reading, so the first sample has a rate
            self._nvlink.rates(index, handle)
        self._xids = XidWatch(self._nvml, handles)

    def sample(self, usages: object = None) -> list[GpuMetrics]:
        """NVML measures the cards itself; the stages' usage (modeled when emulating) is not needed."""
        return sample_metrics(self._nvml, self._nvlink, self._xids)

    def close(self) -> None:
        self._xids.close()
        self._nvml.nvmlShutdown()
