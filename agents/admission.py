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
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from agents.memory_budget import StageRefused, check_fits, spec_footprint
from agents.stage_usage import StageUsage
from agents.throttle import Throttles
from contracts.hardware import DeviceSpec
from contracts.stage_spec import Emulation, StageSpec

_CUDA = re.compile(r"^cuda:(\d+)$")
DEFAULT_TIME_SCALE = 20.0


@dataclass(frozen=True)
class Admitted:
    """A spec as it will run, the node-local device it runs on, and the bytes it holds there (its
    footprint, ``contracts.footprint``, on an emulated device; 0 where nothing is budgeted). ``spec``
    is None only for a start refused before its spec could be read."""

    spec: StageSpec | None
    device_index: int | None
    memory_bytes: int

    def usage(self, usage: tuple[float, float, float], *, alive: bool) -> StageUsage:
        """What the stage occupies of its device: its bytes while it runs, ``usage`` (busy fraction,
        tx/s, rx/s) and its spec's addresses."""
        spec = self.spec
        return StageUsage(self.device_index, self.memory_bytes if alive else 0, *usage,
                          listen=spec.listen if spec else None, next=spec.next if spec else None)


@dataclass(frozen=True)
class Admission:
    devices: Sequence[DeviceSpec]
    time_scale: float = DEFAULT_TIME_SCALE
    throttles: Throttles | None = None  # the emulated throttle knob; its files go into the specs

    def admit(
        self, spec: StageSpec, others: Sequence[Admitted], device_index: int | None = None
    ) -> Admitted:
        """The spec to run, or StageRefused. ``others``: the stages already admitted on this node."""
        if device_index is None:
            match = _CUDA.match(spec.device)
            device_index = int(match[1]) if match else None
        if device_index is None:
            if not any(d.emulated for d in self.devices):
                return Admitted(spec, None, 0)  # a plain CPU stage on a GPU node: nothing to budget
            return self._first_fit(spec, others)
        device = next((d for d in self.devices if d.index == device_index), None)
        if device is None:
            raise StageRefused(f"device index {device_index} does not exist on this node "
                               f"({len(self.devices)} device(s))")
        if not device.emulated:
            return Admitted(replace(spec, device=f"cuda:{device_index}"), device_index, 0)
        return self._on_emulated(spec, others, device)

    def _on_emulated(self, spec: StageSpec, others: Sequence[Admitted], device: DeviceSpec) -> Admitted:
        need = spec_footprint(spec)
        check_fits(need, device, sum(o.memory_bytes for o in others if o.device_index == device.index))
        emulation = spec.emulation or Emulation(device.memory_bandwidth_gbs, device.fp16_tflops,
                                                self.time_scale)
        # What only this node knows of the card: its real speed against the catalog's, and its live throttle.
        emulation = replace(emulation, speed_factor=device.speed_factor)
        if self.throttles is not None:
            emulation = replace(emulation, throttle_file=str(self.throttles.path(device.index)))
        return Admitted(replace(spec, device="cpu", emulation=emulation), device.index, need.total_bytes)

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
