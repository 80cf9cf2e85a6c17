"""Whether a new pipeline's stages fit on their devices beside everything that keeps running there.

The handover (docs/deployments.md, "Handover (make before break)") starts a changed replica's new
pipeline beside the old one only when every device can hold both for the transition; otherwise it
reloads the old one in place. The test is the agent's own admission test (``agents/memory_budget``:
a stage's ``contracts.footprint`` against the card's ``usable_bytes``, less what the stages already
on it hold), computed from the stored specs, so the agent never refuses a start the controller
decided, and the controller never doubles a pipeline the card could not hold. On a real GPU the
planner gives each stage all the KV its card leaves, so a second copy never fits there and the
handover is in place; emulated stages are sized to the workload and usually fit beside.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import Q

from contracts.footprint import stage_footprint, usable_bytes
from contracts.hardware import GIB, DeviceSpec
from contracts.model_profile import ModelProfile
from contracts.precision import Precision
from controlplane.deployments.models import DeploymentStage
from controlplane.inventory.models import Device


def room_shortfalls(*, profile: ModelProfile, new: Iterable[tuple[Device, dict[str, Any]]],
                    exclude: frozenset[int] = frozenset()) -> list[str]:
    """Why the new stages (device, §1 spec of ``profile``'s model) do not all fit beside what is held
    on their devices; empty when they do.

    Held: every stage row on the device (any deployment) that is wanted or not yet confirmed gone,
    since a stage being stopped holds its memory until its process exits, and the process of a row
    moved off the device in place (``sent_device``) until it is replaced; rows in ``exclude`` (the
    new stages' own rows, when they are stored already) are not.
    """
    need: dict[int, int] = {}
    devices: dict[int, Device] = {}
    for device, spec in new:
        need[device.pk] = need.get(device.pk, 0) + spec_bytes(profile, spec)
        devices[device.pk] = device
    held = dict.fromkeys(need, 0)
    profiles = {}
    gone = (DeploymentStage.State.EXITED, DeploymentStage.State.FAILED)
    rows = DeploymentStage.objects.filter(Q(device_id__in=need) | Q(sent_device_id__in=need))
    for row in rows.select_related("deployment__model"):
        if not row.wanted and row.state in gone or not row.spec or row.pk in exclude:
            continue
        model = row.deployment.model
        if model.pk not in profiles:
            profiles[model.pk] = ModelProfile.from_dict(model.profile)
        if row.device_id in held:
            held[row.device_id] += spec_bytes(profiles[model.pk], row.spec)
        if row.sent_device_id in held and row.sent_device_id != row.device_id and row.state not in gone:
            held[row.sent_device_id] += spec_bytes(profiles[model.pk], row.sent_spec)
    shortfalls = []
    for pk, device in devices.items():
        usable = usable_bytes(_device_spec(device))
        if held[pk] + need[pk] > usable:
            shortfalls.append(f"{device.name} needs {_gib(need[pk])} beside {_gib(held[pk])} held, "
                              f"{_gib(usable)} usable")
    return shortfalls


def spec_bytes(profile: ModelProfile, spec: dict[str, Any]) -> int:
    """The bytes the stage of a §1 spec holds on its card (``contracts.footprint``)."""
    start, end = spec["layers"]
    return stage_footprint(profile, start, end, Precision.of(spec), kv_tokens=spec["kv_tokens"],
                           batch=spec["batch"]).total_bytes


def _device_spec(device: Device) -> DeviceSpec:
    return DeviceSpec(name=device.name, node=device.node.name, index=device.index, model=device.model_name,
                      memory_bytes=device.memory_bytes, memory_bandwidth_gbs=device.memory_bandwidth_gbs,
                      fp16_tflops=device.fp16_tflops, bf16_tflops=device.bf16_tflops,
                      int8_tops=device.int8_tops, emulated=device.emulated)


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"
