"""Emulated devices: one node of a fleet file, declared instead of discovered, run on the CPU.

The devices keep their catalog figures (the planner prices them like real cards) and are marked
``emulated`` in everything the agent reports. Their metrics are modeled, plausibly and visibly
synthetic: utilization is the stages' busy fraction, memory used is what the admitted stages hold,
PCIe throughput is what the stages sent and received, and temperature and power follow utilization.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from agents.stage_load import StageLoad
from contracts.fleet_file import load_fleet_file
from contracts.hardware import DeviceSpec
from contracts.metrics import GpuMetrics
from contracts.names import device_name

IDLE_TEMPERATURE_C = 35.0
FULL_LOAD_TEMPERATURE_C = 78.0
MODELED_POWER_LIMIT_W = 250.0
IDLE_POWER_FRACTION = 0.15
MODELED_SM_CLOCK_MHZ = 1410


def emulated_devices(fleet_file: str | Path, node: str, name: str | None = None) -> list[DeviceSpec]:
    """The devices of ``node`` in the fleet file, renamed to the agent's node name if it differs."""
    fleet = load_fleet_file(fleet_file)
    try:
        declared = fleet.node(node)
    except KeyError:
        known = ", ".join(n.name for n in fleet.nodes)
        raise ValueError(f"{fleet_file}: no node {node!r} (declared: {known})") from None
    name = name or node
    return [
        replace(
            device,
            node=name,
            name=device_name(name, device.index),
            uuid=f"EMULATED-{name}-gpu{device.index}",
            nvlink_island=device.nvlink_island and f"{name}/{device.nvlink_island.split('/', 1)[1]}",
            emulated=True,
        )
        for device in declared.devices
    ]


class EmulatedMetrics:
    """Per-second metrics of emulated devices, modeled from the load of the stages they run."""

    def __init__(self, devices: Sequence[DeviceSpec]):
        self._devices = list(devices)

    def sample(self, loads: Sequence[StageLoad]) -> list[GpuMetrics]:
        samples = []
        for device in self._devices:
            mine = [load for load in loads if load.device_index == device.index]
            utilization = min(1.0, sum(load.busy_fraction for load in mine))
            samples.append(
                GpuMetrics(
                    index=device.index,
                    utilization_pct=round(100.0 * utilization, 1),
                    memory_used_bytes=device.memory_used_bytes + sum(load.memory_bytes for load in mine),
                    memory_total_bytes=device.memory_bytes,
                    temperature_c=round(
                        IDLE_TEMPERATURE_C + (FULL_LOAD_TEMPERATURE_C - IDLE_TEMPERATURE_C) * utilization, 1
                    ),
                    power_w=round(MODELED_POWER_LIMIT_W * (IDLE_POWER_FRACTION + (1 - IDLE_POWER_FRACTION)
                                                           * utilization), 1),
                    power_limit_w=MODELED_POWER_LIMIT_W,
                    sm_clock_mhz=MODELED_SM_CLOCK_MHZ,
                    throttle_reasons=(),
                    pcie_tx_bytes_per_s=sum(load.tx_bytes_per_s for load in mine),
                    pcie_rx_bytes_per_s=sum(load.rx_bytes_per_s for load in mine),
                    emulated=True,
                )
            )
        return samples

    def close(self) -> None:
        """Nothing to release; the same interface as NvmlMetrics."""
