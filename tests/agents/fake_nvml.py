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
    max_sm_clock: int = 1980
    # Cumulative NVLink payload counters, KiB, one per active link (missing entries are 0); a test
    # advances them between samples. nvlink_fields=False: a driver without the throughput fields.
    nvlink_tx_kib: list[int] = field(default_factory=list)
    nvlink_rx_kib: list[int] = field(default_factory=list)
    nvlink_fields: bool = True
    ecc_uncorrected: int | None = 0  # None: no ECC on this card (NotSupported)
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)  # None: pre-Ampere, pages retired
    retired: list[int] | None = None  # page addresses retired (with remapped_rows None)
    xid_events: list[int] = field(default_factory=list)  # XIDs pending delivery to an event set
    xid_supported: bool = True


def _not_supported():
    return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


def fake_nvml(gpus: list[FakeGpu]) -> types.SimpleNamespace:
    memory = lambda g: types.SimpleNamespace(  # noqa: E731
        total=g.total_bytes, used=g.used_bytes, free=g.total_bytes - g.used_bytes)
    pci = lambda bus: types.SimpleNamespace(busId=bus.encode())  # noqa: E731

    def link_state(g, link):
        if link >= len(g.nvlink_peers):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.NVML_FEATURE_ENABLED

    def field_values(g, ids):
        out = []
        for field_id, link in ids:
            tx = field_id == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
            counters = g.nvlink_tx_kib if tx else g.nvlink_rx_kib
            supported = g.nvlink_fields and link < len(g.nvlink_peers)
            out.append(types.SimpleNamespace(
                fieldId=field_id, scopeId=link, valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                nvmlReturn=pynvml.NVML_SUCCESS if supported else pynvml.NVML_ERROR_NOT_SUPPORTED,
                value=types.SimpleNamespace(ullVal=counters[link] if link < len(counters) else 0)))
        return out

    def ecc(g, error_type, counter_type):
        assert error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        assert counter_type == pynvml.NVML_VOLATILE_ECC
        if g.ecc_uncorrected is None:
            raise _not_supported()
        return g.ecc_uncorrected

    def remapped(g):
        if g.remapped_rows is None:
            raise _not_supported()
        return g.remapped_rows

    def retired(g, cause):
        if g.retired is None:
            raise _not_supported()
        return g.retired if cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR else []

    event_sets: list[list[FakeGpu]] = []

    def register(g, event_types, event_set):
        if not g.xid_supported or event_types != pynvml.nvmlEventTypeXidCriticalError:
            raise _not_supported()
        event_sets[event_set].append(g)

    def wait(event_set, timeout_ms):
        for g in event_sets[event_set]:
            if g.xid_events:
                return types.SimpleNamespace(device=g, eventType=pynvml.nvmlEventTypeXidCriticalError,
                                             eventData=g.xid_events.pop(0))
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)

    def create_event_set():
        event_sets.append([])
        return len(event_sets) - 1

    return types.SimpleNamespace(
        NVML_SUCCESS=pynvml.NVML_SUCCESS,
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX=pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX=pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        NVML_VOLATILE_ECC=pynvml.NVML_VOLATILE_ECC,
        NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS=(
            pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
        NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR=(
            pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
        nvmlEventTypeXidCriticalError=pynvml.nvmlEventTypeXidCriticalError,
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
        nvmlDeviceGetMaxClockInfo=lambda g, clock: g.max_sm_clock,
        nvmlDeviceGetFieldValues=field_values,
        nvmlDeviceGetTotalEccErrors=ecc,
        nvmlDeviceGetRemappedRows=remapped,
        nvmlDeviceGetRetiredPages=retired,
        nvmlEventSetCreate=create_event_set,
        nvmlDeviceRegisterEvents=register,
        nvmlEventSetWait_v2=wait,
        nvmlEventSetFree=lambda event_set: None,
        nvmlDeviceGetIndex=lambda g: gpus.index(g),
        nvmlDeviceGetCurrentClocksEventReasons=lambda g: g.throttle_bits,
        nvmlDeviceGetPcieThroughput=lambda g, counter: (
            2048 if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else 1024),
    )
