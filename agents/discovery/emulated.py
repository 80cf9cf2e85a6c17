"""Emulated devices: one node of a fleet file, declared instead of discovered, run on the CPU.

The devices keep their catalog figures (the planner prices them like real cards) and are marked
``emulated`` in everything the agent reports. Their metrics are modeled, plausibly and visibly
synthetic: utilization is the stages' busy fraction, memory used is what the admitted stages hold,
temperature and power follow utilization, and the bytes the stages really sent and received are
PCIe or NVLink throughput by where they went:

- **NVLink** when the peer stage (the one whose ``listen`` is this stage's ``next``, or whose ``next``
  is this stage's ``listen``) runs on *another* device of this node in the *same* NVLink island of
  the fleet file (the fabric the planner priced that hop at);
- **PCIe** otherwise: a peer on this node outside the island or on the same device (stage processes
  exchange activations through host memory), a peer on another node (the bytes leave the card over
  PCIe to the network, where NVML would count them too), and the gateway's requests and tokens.

A device outside any island reports no NVLink figures at all (``None``: nothing to chart). A device
made to throttle (agents/throttle.py) reports ``sw_thermal``, an SM clock of ``max x factor`` and at
least ``THROTTLED_TEMPERATURE_C``; a fleet file's ``speed_factor`` only slows the stages' pacing, the
card is reported as running unthrottled (it is a slower card, not a hot one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from agents.stage_usage import StageUsage
from agents.throttle import Throttles
from contracts.fleet_file import load_fleet_file
from contracts.hardware import DeviceSpec
from contracts.metrics import GpuMetrics
from contracts.names import device_name

IDLE_TEMPERATURE_C = 35.0
FULL_USE_TEMPERATURE_C = 78.0
MODELED_POWER_LIMIT_W = 250.0
IDLE_POWER_FRACTION = 0.15
MODELED_SM_CLOCK_MHZ = 1410  # the modeled card's max SM clock, which it runs at unless throttled
THROTTLED_TEMPERATURE_C = 88.0  # where a real card's software thermal slowdown sets in
THROTTLE_REASON = "sw_thermal"


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
    """Per-second metrics of emulated devices, modeled from the usage of the stages they run."""

    def __init__(self, devices: Sequence[DeviceSpec], throttles: Throttles | None = None):
        self._devices = list(devices)
        self.throttles = throttles

    def sample(self, usages: Sequence[StageUsage]) -> list[GpuMetrics]:
        on_nvlink = _nvlink_hops(usages, {device.index: device for device in self._devices})
        samples = []
        for device in self._devices:
            mine = [(i, usage) for i, usage in enumerate(usages) if usage.device_index == device.index]
            utilization = min(1.0, sum(usage.busy_fraction for _, usage in mine))
            held = sum(usage.bytes_on(device.index) for usage in usages)  # a group's ranks' included
            factor = self.throttles.factor(device.index) if self.throttles else 1.0
            temperature = IDLE_TEMPERATURE_C + (FULL_USE_TEMPERATURE_C - IDLE_TEMPERATURE_C) * utilization
            if factor < 1:
                temperature = max(temperature, THROTTLED_TEMPERATURE_C)
            rates = {"tx": [0.0, 0.0], "rx": [0.0, 0.0]}  # [PCIe, NVLink] bytes/s
            for i, usage in mine:
                rates["tx"][on_nvlink[i][0]] += usage.tx_bytes_per_s
                rates["rx"][on_nvlink[i][1]] += usage.rx_bytes_per_s
            has_nvlink = bool(device.nvlink_island)
            samples.append(
                GpuMetrics(
                    index=device.index,
                    utilization_pct=round(100.0 * utilization, 1),
                    memory_used_bytes=held + device.memory_used_bytes,
                    memory_total_bytes=device.memory_bytes,
                    temperature_c=round(temperature, 1),
                    power_w=round(MODELED_POWER_LIMIT_W * (IDLE_POWER_FRACTION + (1 - IDLE_POWER_FRACTION)
                                                           * utilization), 1),
                    power_limit_w=MODELED_POWER_LIMIT_W,
                    sm_clock_mhz=round(MODELED_SM_CLOCK_MHZ * factor),
                    throttle_reasons=(THROTTLE_REASON,) if factor < 1 else (),
                    pcie_tx_bytes_per_s=rates["tx"][0],
                    pcie_rx_bytes_per_s=rates["rx"][0],
                    emulated=True,
                    sm_clock_max_mhz=MODELED_SM_CLOCK_MHZ,
                    nvlink_tx_bytes_per_s=rates["tx"][1] if has_nvlink else None,
                    nvlink_rx_bytes_per_s=rates["rx"][1] if has_nvlink else None,
                )  # no ECC, XID or retired-page counters: an emulated card has no memory to fail
            )
        return samples

    def close(self) -> None:
        """Nothing to release; the same interface as NvmlMetrics."""


def _nvlink_hops(usages: Sequence[StageUsage], devices: dict[int, DeviceSpec]) -> list[tuple[int, int]]:
    """Per stage's usage, whether its sent and its received bytes crossed NVLink (1) or PCIe (0)."""
    by_listen = {usage.listen: usage for usage in usages if usage.listen}
    by_next = {usage.next: usage for usage in usages if usage.next}

    def over_nvlink(usage: StageUsage, peer: StageUsage | None) -> int:
        if peer is None or peer.device_index == usage.device_index:
            return 0
        mine, theirs = devices.get(usage.device_index), devices.get(peer.device_index)
        if mine is None or theirs is None or not mine.nvlink_island:
            return 0
        return int(mine.nvlink_island == theirs.nvlink_island)

    return [(over_nvlink(usage, by_listen.get(usage.next) if usage.next else None),
             over_nvlink(usage, by_next.get(usage.listen) if usage.listen else None)) for usage in usages]
