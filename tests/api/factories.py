"""Rows for tests, with figures that satisfy every model constraint."""

from __future__ import annotations

import itertools

from contracts.hardware import GIB
from controlplane.inventory.models import Device, Link, Node

_serial = itertools.count()


def make_node(**fields) -> Node:
    return Node.objects.create(**{"name": f"node-{next(_serial)}", "network_gbps": 25.0, **fields})


def make_device(node: Node | None = None, **fields) -> Device:
    node = node or make_node()
    defaults = {
        "index": node.devices.count(),
        "model_name": "T4",
        "memory_bytes": 16 * GIB,
        "memory_bandwidth_gbs": 320.0,
        "fp16_tflops": 65.0,
        "bf16_tflops": 0.0,
        "int8_tops": 130.0,
    }
    return Device.objects.create(node=node, **{**defaults, **fields})


def make_link(**fields) -> Link:
    """A network link between two new nodes unless endpoints are given."""
    if not any(k in fields for k in ("node_a", "node_b", "device_a", "device_b")):
        fields |= {"node_a": make_node(), "node_b": make_node()}
    return Link.objects.create(**{"kind": "network", "bandwidth_gbs": 12.5, "latency_us": 30.0, **fields})
