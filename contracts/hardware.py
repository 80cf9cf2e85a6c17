"""Plain descriptions of a fleet: nodes, devices and the links between them.

These dataclasses are the common language of the fleet-file parser, the inventory (which stores
them), the agents (which discover them) and the planner (which places layers on them). They import
nothing from Django so the planner and its CLI run without a database.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

LinkKind = Literal["nvlink", "pcie", "network"]

GIB = 1024**3


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator as the planner sees it: capacity, speed and current health."""

    name: str  # "<node>/gpu<i>"
    node: str
    index: int
    model: str  # catalog name, e.g. "A100-80GB-SXM", or the NVML name
    memory_bytes: int
    memory_bandwidth_gbs: float  # GB/s (10^9 bytes per second)
    fp16_tflops: float  # dense peak, tensor cores where the card has them
    bf16_tflops: float
    int8_tops: float
    vendor: str = "NVIDIA"
    uuid: str = ""
    pcie_gen: int = 4
    pcie_lanes: int = 16
    numa_node: int | None = None
    nvlink_island: str | None = None  # devices sharing an island talk over NVLink
    nvlink_bandwidth_gbs: float = 0.0  # per-direction GB/s between island members
    emulated: bool = False
    # Emulated cards only: the card runs at its catalog speed x this (the fleet file's speed_factor), a
    # card slower (or faster) than its spec sheet. The planner prices the catalog figures and the
    # inventory does not store it: measured step times then differ from predicted ones, as on real cards.
    speed_factor: float = 1.0
    # Health and calibration, filled from telemetry; the defaults describe a healthy, uncalibrated card.
    down: bool = False
    throttle_factor: float = 1.0  # <1.0 while thermally throttled: fraction of full speed left
    memory_used_bytes: int = 0  # memory already taken by something other than motley
    calibration: float = 1.0  # measured ms / predicted ms from real runs on this device
    # The same ratio per precision (bits, ratio), where this device has been measured at it; a
    # precision not listed takes ``calibration``. See ``calibration_at``.
    calibration_by_bits: tuple[tuple[int, float], ...] = ()

    def calibration_at(self, bits: int) -> float:
        """Measured over predicted step time of a stage whose last layer runs at ``bits``."""
        for measured_bits, ratio in self.calibration_by_bits:
            if measured_bits == bits:
                return ratio
        return self.calibration

    @property
    def pcie_bandwidth_gbs(self) -> float:
        return pcie_bandwidth_gbs(self.pcie_gen, self.pcie_lanes)


def pcie_bandwidth_gbs(gen: int, lanes: int) -> float:
    """Usable one-direction PCIe bandwidth: ~0.985 GB/s per lane at gen3, doubling each gen. A card's
    link to its host: activations between cards of a node and the host KV tier's copies take it."""
    return 0.985 * (2 ** (gen - 3)) * lanes


@dataclass(frozen=True)
class LinkSpec:
    """A declared or discovered link between two devices or two nodes (endpoints by name)."""

    a: str
    b: str
    kind: LinkKind
    bandwidth_gbs: float  # GB/s, one direction
    latency_us: float


@dataclass(frozen=True)
class NodeSpec:
    name: str
    devices: tuple[DeviceSpec, ...]
    network_gbps: float = 25.0  # Gbit/s of the node's network interface
    address: str = ""
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def network_bandwidth_gbs(self) -> float:
        return self.network_gbps / 8.0


# Defaults for links nobody declared: typical figures, so a bare fleet file still plans sensibly.
PCIE_LATENCY_US = 5.0
NVLINK_LATENCY_US = 2.0
NETWORK_LATENCY_US = 30.0


@dataclass(frozen=True)
class FleetSpec:
    name: str
    nodes: tuple[NodeSpec, ...]
    links: tuple[LinkSpec, ...] = ()

    @property
    def devices(self) -> tuple[DeviceSpec, ...]:
        return tuple(device for node in self.nodes for device in node.devices)

    def device(self, name: str) -> DeviceSpec:
        for device in self.devices:
            if device.name == name:
                return device
        raise KeyError(f"unknown device {name!r}")

    def node(self, name: str) -> NodeSpec:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"unknown node {name!r}")

    def link_between(self, a: DeviceSpec, b: DeviceSpec) -> LinkSpec:
        """The path activations take from device a to device b.

        A declared link between the two devices (or, across nodes, between their nodes) wins;
        otherwise NVLink inside an island, PCIe inside a node, and across nodes the slower of the
        two nodes' network interfaces.
        """
        declared = self._declared(a.name, b.name)
        if declared is None and a.node != b.node:
            declared = self._declared(a.node, b.node)
        if declared is not None:
            return declared
        if a.node == b.node:
            if a.nvlink_island and a.nvlink_island == b.nvlink_island and a.nvlink_bandwidth_gbs > 0:
                return LinkSpec(a.name, b.name, "nvlink", min(a.nvlink_bandwidth_gbs, b.nvlink_bandwidth_gbs),
                                NVLINK_LATENCY_US)
            return LinkSpec(a.name, b.name, "pcie", min(a.pcie_bandwidth_gbs, b.pcie_bandwidth_gbs),
                            PCIE_LATENCY_US)
        bandwidth = min(self.node(a.node).network_bandwidth_gbs, self.node(b.node).network_bandwidth_gbs)
        return LinkSpec(a.node, b.node, "network", bandwidth, NETWORK_LATENCY_US)

    def _declared(self, x: str, y: str) -> LinkSpec | None:
        for link in self.links:
            if {link.a, link.b} == {x, y}:
                return link
        return None
