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

from contracts.footprint import rank_footprint, stage_footprint, usable_bytes
from contracts.hardware import GIB, DeviceSpec
from contracts.model_profile import ModelProfile
from contracts.precision import Precision
from controlplane.deployments.models import DeploymentStage
from controlplane.inventory.models import Device


def room_shortfalls(*, profile: ModelProfile, new: Iterable[tuple[Device, dict[str, Any]]],
                    exclude: frozenset[int] = frozenset()) -> list[str]:
    """Why the new stages (device, §1 spec of ``profile``'s model) do not all fit beside what is held
    on their devices; empty when they do. A tensor-parallel stage counts each rank on its own device.

    Held: every stage row on the device (any deployment) that is wanted or not yet confirmed gone,
    since a stage being stopped holds its memory until its process exits, and the process of a row
    moved off the device in place (``sent_device``) until it is replaced; rows in ``exclude`` (the
    new stages' own rows, when they are stored already) are not.
    """
    new = list(new)
    cards = _Cards({device.node_id for device, _ in new})
    need: dict[int, int] = {}
    for device, spec in new:
        for card, nbytes in cards.holdings(device, profile, spec):
            need[card.pk] = need.get(card.pk, 0) + nbytes
    held = dict.fromkeys(need, 0)
    profiles = {}
    gone = (DeploymentStage.State.EXITED, DeploymentStage.State.FAILED)
    rows = DeploymentStage.objects.filter(node_id__in=cards.nodes)  # a stage's ranks share its node
    for row in rows.select_related("deployment__model", "device", "sent_device"):
        if not row.wanted and row.state in gone or not row.spec or row.pk in exclude:
            continue
        model = row.deployment.model
        if model.pk not in profiles:
            profiles[model.pk] = ModelProfile.from_dict(model.profile)
        running = cards.holdings(row.device, profiles[model.pk], row.spec) if row.device else []
        for card, nbytes in running:
            if card.pk in held:
                held[card.pk] += nbytes
        if row.sent_device is not None and row.sent_spec and row.state not in gone:  # its running process
            on = {card.pk for card, _ in running}
            for card, nbytes in cards.holdings(row.sent_device, profiles[model.pk], row.sent_spec):
                if card.pk in held and card.pk not in on:
                    held[card.pk] += nbytes
    shortfalls = []
    for pk in need:
        device = cards.by_pk[pk]
        usable = usable_bytes(_device_spec(device))
        if held[pk] + need[pk] > usable:
            shortfalls.append(f"{device.name} needs {_gib(need[pk])} beside {_gib(held[pk])} held, "
                              f"{_gib(usable)} usable")
    return shortfalls


def spec_holdings(profile: ModelProfile, spec: dict[str, Any]) -> list[tuple[int | None, int]]:
    """The bytes the stage of a §1 spec holds on each of its cards (``contracts.footprint``), as
    (device index, bytes): one (None, bytes) for a stage on one card, its row's; one per rank, on the
    rank's ``device_index`` of the stage's node, for a tensor-parallel stage."""
    start, end = spec["layers"]
    group = spec.get("tensor_group") or ()
    if not group:
        return [(None, stage_footprint(profile, start, end, Precision.of(spec), kv_tokens=spec["kv_tokens"],
                                       batch=spec["batch"]).total_bytes)]
    return [(rank["device_index"], rank_footprint(
        profile, start, end, Precision.of({**spec, "bits": rank["bits"]}), kv_heads=rank["kv_heads"],
        intermediate=rank["intermediate"], first=r == 0, kv_tokens=spec["kv_tokens"], batch=spec["batch"],
    ).total_bytes) for r, rank in enumerate(group)]


def spec_device_ids(device: Device | None, spec: dict[str, Any] | None) -> set[int]:
    """Ids of the devices the stage of ``spec`` on ``device`` holds memory on: its own, and for a
    tensor-parallel stage its ranks' (devices of its node)."""
    if device is None:
        return set()
    indexes = [rank["device_index"] for rank in (spec or {}).get("tensor_group") or ()]
    if not indexes:
        return {device.pk}
    ranks = Device.objects.filter(node_id=device.node_id, index__in=indexes).values_list("pk", flat=True)
    return {device.pk, *ranks}


class _Cards:
    """The devices of some nodes, by id and by (node, index): where a stage's ranks are."""

    def __init__(self, nodes: set[int]):
        self.nodes = nodes
        devices = list(Device.objects.filter(node_id__in=nodes).select_related("node"))
        self.by_pk = {device.pk: device for device in devices}
        self._by_place = {(device.node_id, device.index): device for device in devices}

    def holdings(self, device: Device, profile: ModelProfile,
                 spec: dict[str, Any]) -> list[tuple[Device, int]]:
        """The bytes the stage of ``spec`` on ``device`` holds, per card (a rank on a card of its node
        the inventory does not know is not counted: the agent refuses it)."""
        found = []
        for index, nbytes in spec_holdings(profile, spec):
            card = device if index is None else self._by_place.get((device.node_id, index))
            if card is not None:
                found.append((card, nbytes))
        return found


def _device_spec(device: Device) -> DeviceSpec:
    return DeviceSpec(name=device.name, node=device.node.name, index=device.index, model=device.model_name,
                      memory_bytes=device.memory_bytes, memory_bandwidth_gbs=device.memory_bandwidth_gbs,
                      fp16_tflops=device.fp16_tflops, bf16_tflops=device.bf16_tflops,
                      int8_tops=device.int8_tops, emulated=device.emulated)


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"
