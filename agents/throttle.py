"""The emulated throttle knob (contracts §3 ``set_throttle``): an emulated card made to run slower, live.

The agent keeps one factor per emulated device (1.0: full speed) and mirrors it to a small JSON file,
``STATE_DIR/throttle/gpu<i>.json`` = ``{"factor": f}``, which is what the device's stage processes
read: admission puts the path in their spec's ``emulation.throttle_file`` and their pacer re-reads it
at most once a second (worker_runtime/pacing.py), so a step takes ``modeled / f`` without a restart.
The device's metrics (agents/discovery/emulated.py) report the throttle while ``f < 1``: a lower SM
clock (``max x f``), a throttle reason and a higher temperature. An agent starts with every factor at
1.0 (the files are rewritten): a throttle does not outlive the agent that was told it.

The file is replaced by an atomic rename, so a stage never reads half of it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path

from agents.files import replace_whole
from contracts.hardware import DeviceSpec


class ThrottleRefused(ValueError):
    """A set_throttle the agent cannot carry out: no such emulated device, or a factor out of (0, 1]."""


class Throttles:
    """The live throttle factor of each emulated device of this node."""

    def __init__(self, directory: Path, devices: Sequence[DeviceSpec]):
        self.directory = Path(directory)
        self._factors = {device.index: 1.0 for device in devices if device.emulated}
        self._lock = threading.Lock()
        if self._factors:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        for index in self._factors:
            self._write(index, 1.0)

    def path(self, device_index: int) -> Path:
        return self.directory / f"gpu{device_index}.json"

    def factor(self, device_index: int) -> float:
        return self._factors.get(device_index, 1.0)

    def set(self, device_index: int, factor: float) -> float:
        """Throttle the device to ``factor`` of its speed (1.0: recovered); returns the factor."""
        if device_index not in self._factors:
            emulated = sorted(self._factors) or "none"
            raise ThrottleRefused(f"device index {device_index} is not an emulated device of this node "
                                  f"(emulated: {emulated})")
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
            raise ThrottleRefused(f"factor must be a number in (0, 1], got {factor!r}")
        with self._lock:
            self._write(device_index, float(factor))
            self._factors[device_index] = float(factor)
        return float(factor)

    def _write(self, device_index: int, factor: float) -> None:
        replace_whole(self.path(device_index), json.dumps({"factor": factor}))
