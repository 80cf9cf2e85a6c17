"""What a stage spec says of the cards it runs on: the device string, the emulated card's pacing, and
a tensor-parallel stage's ranks (contracts §1 ``tensor_group``), all built from inventory devices.

The stage's own card and each rank of its group are described the same way: an emulated device runs
on the CPU, paced to the card it stands for (``Emulation``: its catalog speed, the emulation's time
scale, its PCIe link for host-tier copies); a real one is ``cuda:<index>`` on its node.
"""

from __future__ import annotations

from collections.abc import Mapping

from django.conf import settings

from contracts.hardware import pcie_bandwidth_gbs
from contracts.stage_spec import Emulation, TensorRank
from controlplane.inventory.models import Device
from controlplane.planning.plan import StagePlan


def spec_device(device: Device) -> str:
    """The spec's ``device`` for a stage (or rank) on this card: the CPU for an emulated one."""
    return "cpu" if device.emulated else f"cuda:{device.index}"


def emulation_of(device: Device) -> Emulation | None:
    """The pacing of a stage (or rank) on an emulated card; None on a real one. The agent adds what only
    its node knows (the card's ``speed_factor``, its ``throttle_file``)."""
    if not device.emulated:
        return None
    return Emulation(memory_bandwidth_gbs=device.memory_bandwidth_gbs, fp16_tflops=device.fp16_tflops,
                     time_scale=settings.MOTLEY_EMULATION_TIME_SCALE,
                     host_link_gbs=pcie_bandwidth_gbs(device.pcie_gen, device.pcie_lanes))


def tensor_group(stage: StagePlan, devices: Mapping[str, Device]) -> tuple[TensorRank, ...]:
    """The spec's ``tensor_group`` of a plan stage: its shares in rank order, each on its inventory
    device (``devices``: by name); () for a stage on one card. Rank 0 is the stage's own card."""
    ranks = []
    for share in stage.group:
        device = devices[share.device]
        ranks.append(TensorRank(device=spec_device(device), kv_heads=share.kv_heads,
                                intermediate=share.columns, bits=share.bits, device_index=device.index,
                                emulation=emulation_of(device)))
    return tuple(ranks)
