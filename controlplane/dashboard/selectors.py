"""Reads the dashboard pages render from: the inventory shaped for drawing, in a few queries.

The pages embed these dicts as JSON for their first paint and the JS modules redraw from the same
shapes, so the server and the browser draw one picture.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q

from controlplane.hardware.specs import GIB
from controlplane.inventory.models import Device, Link, Node
from controlplane.models_catalog.models import LlmModel


def node_list() -> list[Node]:
    """Nodes with their device count, emulated-device count and total memory (one query)."""
    return list(
        Node.objects.annotate(
            device_count=Count("devices"),
            emulated_count=Count("devices", filter=Q(devices__emulated=True)),
        ).order_by("name")
    )


def device_list() -> list[Device]:
    return list(Device.objects.select_related("node").order_by("node__name", "index"))


def model_list() -> list[LlmModel]:
    return list(LlmModel.objects.defer("config", "profile").order_by("name"))


def topology() -> dict[str, Any]:
    """Nodes, their devices and every link to draw, declared or implied (three queries).

    Links nobody declared still exist physically: devices of one NVLink island talk over NVLink
    (added here as ``implied``), and every node reaches the others through its network interface
    (drawn as the node's uplink to a shared switch, with ``network_gbps``), so the operator sees
    the graph the planner prices (``FleetSpec.link_between``) without 2,000 lines for 64 nodes.
    """
    nodes = Node.objects.prefetch_related("devices").order_by("name")
    declared = Link.objects.select_related("node_a", "node_b", "device_a__node", "device_b__node")
    links = [_link(link) for link in declared]
    pairs = {frozenset((link["a"], link["b"])) for link in links}
    node_rows = []
    for node in nodes:
        devices = sorted(node.devices.all(), key=lambda d: d.index)
        node_rows.append({
            "name": node.name, "status": node.status, "network_gbps": node.network_gbps,
            "address": node.address, "emulated": any(d.emulated for d in devices),
            "devices": [_device(node, d) for d in devices],
        })
        islands: dict[str, list[Device]] = {}
        for device in devices:
            if device.nvlink_island:
                islands.setdefault(device.nvlink_island, []).append(device)
        for members in islands.values():
            for a, b in zip(members, members[1:]):
                pair = frozenset((f"{node.name}/gpu{a.index}", f"{node.name}/gpu{b.index}"))
                if pair not in pairs:
                    pairs.add(pair)
                    links.append({"kind": "nvlink", "a": min(pair), "b": max(pair),
                                  "bandwidth_gbs": a.nvlink_bandwidth_gbs, "implied": True})
    return {"nodes": node_rows, "links": links}


def _device(node: Node, device: Device) -> dict[str, Any]:
    return {
        "name": f"{node.name}/gpu{device.index}", "index": device.index, "model": device.model_name,
        "memory_gib": round(device.memory_bytes / GIB, 1), "emulated": device.emulated,
        "health": device.health, "island": device.nvlink_island,
        "down": node.is_down or device.health == Device.Health.UNHEALTHY,
    }


def _link(link: Link) -> dict[str, Any]:
    a, b = link.endpoints
    return {"kind": link.kind, "a": a.name, "b": b.name, "bandwidth_gbs": link.bandwidth_gbs, "implied": False}
