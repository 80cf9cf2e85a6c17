"""Reads from the inventory, shaped for the code that consumes them."""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import Q

from contracts.hardware import DeviceSpec, FleetSpec, LinkSpec, NodeSpec
from contracts.names import device_name
from controlplane.inventory.calibration import Calibrations, calibrations
from controlplane.inventory.models import Device, Link, Node


def fleet_spec_from_inventory(*, node_ids: Iterable[int] | None = None, name: str = "inventory") -> FleetSpec:
    """The inventory (or the given nodes of it) as the planner's FleetSpec, health and calibration included.

    A device is down when its node is LOST (``status``, observed) or cordoned or draining
    (``intent``, the operator's: ``Node.is_down``), or the device itself is UNHEALTHY (its effective
    ``health``: the operator's ``health_override``, else what its samples show): the planner places
    nothing on it. SUSPECT nodes stay plannable; the heartbeat monitor decides when suspicion
    becomes LOST. Each device's ``calibration`` and ``calibration_by_bits`` are the
    stored calibration's (``calibration.calibrations``: measured, else its peers'). Four queries
    whatever the fleet's size.
    """
    nodes = Node.objects.prefetch_related("devices").order_by("name")
    if node_ids is not None:
        nodes = nodes.filter(pk__in=list(node_ids))
    factors = calibrations()
    node_specs = tuple(_node_spec(node, factors) for node in nodes)
    node_pks = [node.pk for node in nodes]
    links = Link.objects.filter(
        Q(node_a__in=node_pks, node_b__in=node_pks)
        | Q(device_a__node__in=node_pks, device_b__node__in=node_pks)
    ).select_related("node_a", "node_b", "device_a__node", "device_b__node")
    return FleetSpec(name=name, nodes=node_specs, links=tuple(_link_spec(link) for link in links))


def _node_spec(node: Node, factors: Calibrations) -> NodeSpec:
    return NodeSpec(
        name=node.name,
        devices=tuple(_device_spec(node, d, factors)
                      for d in sorted(node.devices.all(), key=lambda d: d.index)),
        network_gbps=node.network_gbps,
        address=node.address,
        labels=dict(node.labels),
    )


def _device_spec(node: Node, device: Device, factors: Calibrations) -> DeviceSpec:
    calibration = factors.for_device(device)
    return DeviceSpec(
        name=device_name(node.name, device.index),
        node=node.name,
        index=device.index,
        model=device.model_name,
        memory_bytes=device.memory_bytes,
        memory_bandwidth_gbs=device.memory_bandwidth_gbs,
        fp16_tflops=device.fp16_tflops,
        bf16_tflops=device.bf16_tflops,
        int8_tops=device.int8_tops,
        vendor=device.vendor,
        uuid=device.uuid,
        pcie_gen=device.pcie_gen,
        pcie_lanes=device.pcie_lanes,
        numa_node=device.numa_node,
        nvlink_island=device.nvlink_island or None,
        nvlink_bandwidth_gbs=device.nvlink_bandwidth_gbs,
        emulated=device.emulated,
        down=node.is_down or device.health == Device.Health.UNHEALTHY,
        calibration=calibration.factor,
        calibration_by_bits=tuple(sorted(calibration.by_bits.items(), reverse=True)),
    )


def _link_spec(link: Link) -> LinkSpec:
    a, b = link.endpoints
    return LinkSpec(
        a=a.name, b=b.name, kind=link.kind, bandwidth_gbs=link.bandwidth_gbs, latency_us=link.latency_us
    )


def node_incarnation(*, node_id: int) -> int:
    """The incarnation of the node's agent now (0: no agent ever registered it)."""
    return Node.objects.values_list("incarnation", flat=True).get(pk=node_id)
