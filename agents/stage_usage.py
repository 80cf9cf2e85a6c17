"""How much of its device one stage uses: what the supervisor tells emulated discovery each second."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StageUsage:
    """How much of its device a stage uses, for emulated device metrics."""

    device_index: int | None
    memory_bytes: int
    busy_fraction: float  # share of the last stats interval spent in steps
    tx_bytes_per_s: float
    rx_bytes_per_s: float
    # The stage's address and its next stage's (spec "listen" and "next"): which of this node's stages,
    # and so devices, its activations go to and come from (NVLink or PCIe, agents/discovery/emulated.py).
    listen: str | None = None
    next: str | None = None
    # A tensor-parallel stage's other ranks: (device index, bytes) each, held on their own devices.
    group_held: tuple[tuple[int, int], ...] = ()

    def bytes_on(self, device_index: int) -> int:
        """The memory the stage holds on the device ``device_index``, its ranks' included."""
        own = self.memory_bytes if self.device_index == device_index else 0
        return own + sum(nbytes for index, nbytes in self.group_held if index == device_index)
