"""Deciding whether and how a stage spec runs on this node's devices, before its process starts.

The control plane plans for a device by index; the agent knows what that device really is. On a real
GPU the stage gets ``cuda:N`` (with CUDA's device order pinned to NVML's). On an emulated device it
runs on the CPU, paced to the card's modeled speed (the spec's ``emulation`` block, filled from the
device when the control plane left it out) and held to the card's memory budget.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agents.memory_budget import StageRefused, check_fits, stage_bytes
from controlplane.hardware.specs import DeviceSpec

_CUDA = re.compile(r"^cuda:(\d+)$")
DEFAULT_TIME_SCALE = 20.0


@dataclass(frozen=True)
class Admitted:
    """A spec as it will run, the node-local device it runs on, and the bytes it holds there."""

    spec: dict[str, Any]
    device_index: int | None
    memory_bytes: int


@dataclass(frozen=True)
class Admission:
    devices: Sequence[DeviceSpec]
    time_scale: float = DEFAULT_TIME_SCALE

    @property
    def emulated(self) -> bool:
        return any(device.emulated for device in self.devices)

    def admit(self, spec: dict[str, Any], others: Sequence[Admitted]) -> Admitted:
        """The spec to run, or StageRefused. ``others``: the stages already running on this node."""
        index = self._device_index(spec)
        if index is None:
            if spec.get("device") == "cpu" and not self.emulated:
                return Admitted(spec, None, 0)  # a plain CPU stage on a real node: nothing to budget
            raise StageRefused(f"spec names no device of this node (device={spec.get('device')!r}, "
                               "and no device_index)")
        device = next((d for d in self.devices if d.index == index), None)
        if device is None:
            raise StageRefused(f"device index {index} does not exist on this node "
                               f"({len(self.devices)} device(s))")
        if not device.emulated:
            return Admitted({**spec, "device": f"cuda:{index}"}, index, 0)
        need = stage_bytes(spec)
        check_fits(need, device, sum(o.memory_bytes for o in others if o.device_index == index))
        emulation = spec.get("emulation") or {
            "memory_bandwidth_gbs": device.memory_bandwidth_gbs,
            "fp16_tflops": device.fp16_tflops,
            "time_scale": self.time_scale,
        }
        return Admitted({**spec, "device": "cpu", "emulation": emulation}, index, need.total)

    def _device_index(self, spec: dict[str, Any]) -> int | None:
        explicit = spec.get("device_index")
        if isinstance(explicit, int) and not isinstance(explicit, bool):
            return explicit
        match = _CUDA.match(str(spec.get("device", "")))
        if match:
            return int(match[1])
        if len(self.devices) == 1 and self.emulated:
            return self.devices[0].index
        return None
