"""Writes to the inventory. Each service runs in one transaction: it completes or writes nothing.

(A device's observed health is written by ``health.device_health_observe``.)
"""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from contracts.hardware import DeviceSpec, FleetSpec, LinkSpec
from contracts.tasks import SET_THROTTLE
from controlplane.audit.services import SYSTEM, Actor, audit_record
from controlplane.common.task_sending import agent_task_send_on_commit
from controlplane.inventory.models import Device, Link, Node
from controlplane.inventory.selectors import node_incarnation


@dataclass(frozen=True)
class ImportResult:
    fleet: str
    nodes_created: int = 0
    nodes_updated: int = 0
    devices_created: int = 0
    devices_updated: int = 0
    devices_removed: int = 0
    links_created: int = 0
    links_updated: int = 0

    def __str__(self) -> str:
        return (
            f"fleet {self.fleet}: nodes {self.nodes_created} created, {self.nodes_updated} updated; "
            f"devices {self.devices_created} created, {self.devices_updated} updated, "
            f"{self.devices_removed} removed; "
            f"links {self.links_created} created, {self.links_updated} updated"
        )


@transaction.atomic
def fleet_import(*, fleet: FleetSpec) -> ImportResult:
    """Store a declared fleet; importing the same file again updates rows and never duplicates.

    A node is matched by name and its devices by index. The file is authoritative for the nodes it
    names: their devices beyond the declared count are removed. Nodes the file does not name, and
    their devices, are left alone, so one inventory can hold several fleet files and discovered
    nodes side by side. Validation happened when the file was parsed (``parse_fleet``).
    """
    counts = dict.fromkeys(
        ("nodes_created", "nodes_updated", "devices_created", "devices_updated", "devices_removed",
         "links_created", "links_updated"),
        0,
    )
    devices_by_name: dict[str, Device] = {}
    nodes_by_name: dict[str, Node] = {}
    for spec in fleet.nodes:
        node, created = Node.objects.update_or_create(
            name=spec.name,
            defaults={
                "address": spec.address,
                "labels": spec.labels,
                "network_gbps": spec.network_gbps,
                "fleet": fleet.name,
            },
        )
        counts["nodes_created" if created else "nodes_updated"] += 1
        nodes_by_name[node.name] = node
        for device_spec in spec.devices:
            device, created = Device.objects.update_or_create(
                node=node, index=device_spec.index, defaults=_device_fields(device_spec)
            )
            counts["devices_created" if created else "devices_updated"] += 1
            devices_by_name[device_spec.name] = device
        _, removed = Device.objects.filter(node=node, index__gte=len(spec.devices)).delete()
        counts["devices_removed"] += removed.get(Device._meta.label, 0)
    for link_spec in fleet.links:
        created = _link_upsert(link_spec, nodes_by_name, devices_by_name)
        counts["links_created" if created else "links_updated"] += 1
    return ImportResult(fleet=fleet.name, **counts)


def _device_fields(spec: DeviceSpec) -> dict[str, object]:
    return {
        "uuid": spec.uuid,
        "vendor": spec.vendor,
        "model_name": spec.model,
        "memory_bytes": spec.memory_bytes,
        "memory_bandwidth_gbs": spec.memory_bandwidth_gbs,
        "fp16_tflops": spec.fp16_tflops,
        "bf16_tflops": spec.bf16_tflops,
        "int8_tops": spec.int8_tops,
        "pcie_gen": spec.pcie_gen,
        "pcie_lanes": spec.pcie_lanes,
        "numa_node": spec.numa_node,
        "nvlink_island": spec.nvlink_island or "",
        "nvlink_bandwidth_gbs": spec.nvlink_bandwidth_gbs,
        "emulated": spec.emulated,
    }


def _link_upsert(spec: LinkSpec, nodes: dict[str, Node], devices: dict[str, Device]) -> bool:
    """Create or update the link between the spec's endpoints (either way round); True if created."""
    if spec.a in nodes:
        a, b, field_a, field_b = nodes[spec.a], nodes[spec.b], "node_a", "node_b"
    else:
        a, b, field_a, field_b = devices[spec.a], devices[spec.b], "device_a", "device_b"
    figures = {"kind": spec.kind, "bandwidth_gbs": spec.bandwidth_gbs, "latency_us": spec.latency_us}
    reverse = Link.objects.filter(**{field_a: b, field_b: a})
    if reverse.update(**figures, last_updated=timezone.now()):
        return False
    _, created = Link.objects.update_or_create(**{field_a: a, field_b: b}, defaults=figures)
    return created


@transaction.atomic
def device_emulate_throttle(*, device: Device, factor: float, actor: Actor = SYSTEM) -> str:
    """Make an emulated device throttle to ``factor`` of its speed (1.0: recovered), through its agent;
    returns the queue the task goes to, once the current transaction commits.

    The agent (contracts §3 ``set_throttle``) slows the device's stages to ``modeled / factor`` and
    reports the throttle in its metrics until told 1.0 (or restarted). Refused, naming the problem,
    for a real device (only an emulated card can be slowed on request), a factor outside (0, 1], and
    a node no agent has registered (nobody would receive it). Audited as ``device.throttle``.
    """
    if not device.emulated:
        raise ValidationError({"device": f"{device.name} is a real device: only an emulated device can be "
                                         "made to throttle"})
    if isinstance(factor, bool) or not 0 < factor <= 1:
        raise ValidationError({"factor": f"expected a number in (0, 1] (1 = recovered), got {factor!r}"})
    node = device.node
    if not node.registered:
        raise ValidationError({"device": f"{device.name}: no agent has registered node {node.name}"})
    kwargs = {"device_index": device.index, "factor": float(factor)}
    audit_record(actor=actor, action="device.throttle", target=device, detail={"factor": float(factor)})
    return agent_task_send_on_commit(node_id=node.pk, name=SET_THROTTLE, kwargs=kwargs,
                                     incarnation=lambda: node_incarnation(node_id=node.pk))
