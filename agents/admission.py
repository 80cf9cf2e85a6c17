"""Deciding whether and how a stage spec runs on this node's devices, before its process starts.

The control plane plans for a device; the agent knows what that device is. On a real GPU the stage
runs on ``cuda:N`` (CUDA's device order pinned to NVML's by the supervisor). On an emulated device it
runs on the CPU, paced to the card's modeled speed (the spec's ``emulation`` block, filled from the
device when the control plane left it out; its ``speed_factor`` and ``throttle_file`` always from
the node, which alone knows them) and held to the card's memory budget.

Which device: the task's ``device_index`` when the control plane sends it, else ``cuda:N`` in the
spec, else (an emulated stage arrives as ``device: "cpu"``) the first device whose modeled speed is
the spec's ``emulation`` and whose budget still holds the stage. Devices of one model are
interchangeable for budgeting, so this refuses only what no such device could hold.

A tensor-parallel stage (``tensor_group``) is one process that starts its other ranks itself, so it
is admitted as a unit: every rank on its own device of this node, each held to that device's budget
by its share of the stage and paced like a stage of that device; what each rank holds counts on its
device for the stages admitted after it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from agents.memory_budget import StageRefused, check_fits, rank_footprints, spec_footprint
from agents.stage_usage import StageUsage
from agents.throttle import Throttles
from contracts.hardware import DeviceSpec
from contracts.stage_spec import Emulation, StageSpec, TensorRank

_CUDA = re.compile(r"^cuda:(\d+)$")
DEFAULT_TIME_SCALE = 20.0


@dataclass(frozen=True)
class Admitted:
    """A spec as it will run, the node-local device it runs on, and the bytes it holds there (its
    footprint, ``contracts.footprint``, on an emulated device; 0 where nothing is budgeted). A
    tensor-parallel stage's other ranks hold theirs on their own devices (``group_held``: device index,
    bytes). ``spec`` is None only for a start refused before its spec could be read."""

    spec: StageSpec | None
    device_index: int | None
    memory_bytes: int
    group_held: tuple[tuple[int, int], ...] = ()

    def bytes_on(self, device_index: int) -> int:
        """What the stage holds on the device ``device_index``, its ranks' included."""
        return self.usage((0.0, 0.0, 0.0), alive=True).bytes_on(device_index)

    def usage(self, usage: tuple[float, float, float], *, alive: bool) -> StageUsage:
        """What the stage occupies of its devices: its bytes while it runs, ``usage`` (busy fraction,
        tx/s, rx/s) and its spec's addresses."""
        spec = self.spec
        return StageUsage(self.device_index, self.memory_bytes if alive else 0, *usage,
                          listen=spec.listen if spec else None, next=spec.next if spec else None,
                          group_held=self.group_held if alive else ())


@dataclass(frozen=True)
class Admission:
    devices: Sequence[DeviceSpec]
    time_scale: float = DEFAULT_TIME_SCALE
    throttles: Throttles | None = None  # the emulated throttle knob; its files go into the specs

    def admit(
        self, spec: StageSpec, others: Sequence[Admitted], device_index: int | None = None
    ) -> Admitted:
        """The spec to run, or StageRefused. ``others``: the stages already admitted on this node."""
        if spec.tensor_group:
            return self._group(spec, others, device_index)
        if device_index is None:
            match = _CUDA.match(spec.device)
            device_index = int(match[1]) if match else None
        if device_index is None:
            if not any(d.emulated for d in self.devices):
                return Admitted(spec, None, 0)  # a plain CPU stage on a GPU node: nothing to budget
            return self._first_fit(spec, others)
        device = self._device(device_index)
        if not device.emulated:
            return Admitted(replace(spec, device=f"cuda:{device_index}"), device_index, 0)
        return self._on_emulated(spec, others, device)

    def _device(self, index: int) -> DeviceSpec:
        device = next((d for d in self.devices if d.index == index), None)
        if device is None:
            raise StageRefused(f"device index {index} does not exist on this node "
                               f"({len(self.devices)} device(s))")
        return device

    def _on_emulated(self, spec: StageSpec, others: Sequence[Admitted], device: DeviceSpec) -> Admitted:
        need = spec_footprint(spec)
        check_fits(need, device, sum(o.bytes_on(device.index) for o in others))
        emulation = self._emulation(spec.emulation, device)
        return Admitted(replace(spec, device="cpu", emulation=emulation), device.index, need.total_bytes)

    def _emulation(self, given: Emulation | None, device: DeviceSpec) -> Emulation:
        """The pacing of a stage (or rank) on an emulated ``device``: ``given`` (the device's catalog
        speed when the control plane left it out), with what only this node knows of the card: its
        real speed against the catalog's, and its live throttle."""
        emulation = given or Emulation(device.memory_bandwidth_gbs, device.fp16_tflops, self.time_scale)
        emulation = replace(emulation, speed_factor=device.speed_factor)
        if self.throttles is not None:
            emulation = replace(emulation, throttle_file=str(self.throttles.path(device.index)))
        return emulation

    def _group(self, spec: StageSpec, others: Sequence[Admitted], device_index: int | None) -> Admitted:
        """A tensor-parallel stage, admitted as a unit: every rank's device must be on this node and (an
        emulated one) hold the rank's footprint beside what it holds already; the first rank that does
        not refuses the whole stage, naming it. Rank 0 is on ``device_index`` when the task names one."""
        needs = rank_footprints(spec)
        ranks: list[TensorRank] = []
        held: list[tuple[int, int]] = []
        for r, (rank, need) in enumerate(zip(spec.tensor_group, needs)):
            index = device_index if r == 0 and device_index is not None else _rank_index(rank)
            if index is None:
                raise StageRefused(f"tensor_group rank {r} ({rank.device}) names no device of this node")
            try:
                device = self._device(index)
                if device.emulated:
                    used = sum(o.bytes_on(index) for o in others) + sum(b for i, b in held if i == index)
                    check_fits(need, device, used)
                    given = rank.emulation or (spec.emulation if r == 0 else None)
                    rank = replace(rank, device="cpu", emulation=self._emulation(given, device))
                else:
                    rank = replace(rank, device=f"cuda:{index}", emulation=None)
            except StageRefused as exc:
                raise StageRefused(f"tensor_group rank {r} (device index {index}): {exc}") from None
            ranks.append(replace(rank, device_index=index))
            held.append((index, need.total_bytes if device.emulated else 0))
        first = ranks[0]
        admitted = replace(spec, device=first.device, emulation=first.emulation, tensor_group=tuple(ranks))
        return Admitted(admitted, held[0][0], held[0][1], tuple(held[1:]))

    def _first_fit(self, spec: StageSpec, others: Sequence[Admitted]) -> Admitted:
        emulation = spec.emulation
        candidates = [
            d for d in self.devices
            if d.emulated and (emulation is None or (
                d.memory_bandwidth_gbs == emulation.memory_bandwidth_gbs
                and d.fp16_tflops == emulation.fp16_tflops))
        ]
        if not candidates:
            raise StageRefused(f"no emulated device of this node models {emulation}")
        refusals = []
        for device in candidates:
            try:
                return self._on_emulated(spec, others, device)
            except StageRefused as exc:
                refusals.append(str(exc))
        raise StageRefused("; ".join(refusals))


def _rank_index(rank: TensorRank) -> int | None:
    """The node-local device of a rank: its ``device_index``, else its ``cuda:N``."""
    if rank.device_index is not None:
        return rank.device_index
    match = _CUDA.match(rank.device)
    return int(match[1]) if match else None
