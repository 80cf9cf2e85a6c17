"""Which order the devices of a replica form a pipeline in.

Activations flow stage to stage, so the order decides which links carry them. Devices of one node
and one NVLink island stay adjacent, so a replica crosses each network link at most once, and the
node chain runs through the fastest network interfaces first. For up to ``EXACT_ORDER_LIMIT``
devices the partition search tries every order itself (Held-Karp over subsets) and, among orders
within 1% of the best, keeps one with the fewest network hops; beyond that it tries the topology
order in both directions and keeps the best.
"""

from __future__ import annotations

from typing import Sequence

from contracts.hardware import DeviceSpec, FleetSpec

EXACT_ORDER_LIMIT = 6


def speed(device: DeviceSpec) -> float:
    """Decode speed proxy: calibrated, throttled memory bandwidth (decode is bandwidth-bound)."""
    return device.memory_bandwidth_gbs * device.throttle_factor / max(device.calibration, 1e-6)


def topology_order(devices: Sequence[DeviceSpec], fleet: FleetSpec,
                   fast_first: bool = True) -> list[DeviceSpec]:
    """Node-major order: nodes by network bandwidth, then NVLink islands, then devices by speed."""
    def node_key(name: str) -> tuple:
        return (-fleet.node(name).network_bandwidth_gbs, name)

    def device_key(d: DeviceSpec) -> tuple:
        island = d.nvlink_island if d.nvlink_bandwidth_gbs > 0 else None
        return (island is None, island or "", -speed(d) if fast_first else speed(d), d.index, d.name)

    nodes = sorted({d.node for d in devices}, key=node_key)
    ordered: list[DeviceSpec] = []
    for node in nodes:
        ordered.extend(sorted((d for d in devices if d.node == node), key=device_key))
    return ordered


def candidate_orders(devices: Sequence[DeviceSpec], fleet: FleetSpec) -> list[list[DeviceSpec]]:
    """The topology order in both directions: which end holds the embedding and which the head
    matters when they are large next to a layer (128k-token vocabularies)."""
    forward = topology_order(devices, fleet)
    return [forward, forward[::-1]] if len(forward) > 1 else [forward]
