"""The control channel of a served tensor-parallel group: rank 0 tells the other ranks, in its own order,
everything that changes their shard's state (a forward over a batch, a KV cache operation, a keepalive,
stop), as JSON broadcast over a gloo process group.

The other ranks hold no request state: they do what rank 0 did, in the same order, so their block tables
stay the same as rank 0's. JSON, never pickle: the header's length first, then its bytes.
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist


class ControlChannel:
    """Rank 0 ``send``s, every other rank ``receive``s the same messages in the same order."""

    def __init__(self, process_group: dist.ProcessGroup | None = None):
        self.process_group = process_group

    def send(self, message: dict) -> None:
        data = json.dumps(message, separators=(",", ":")).encode()
        self._broadcast(torch.tensor([len(data)], dtype=torch.int64))
        self._broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8))

    def receive(self) -> dict:
        size = self._broadcast(torch.zeros(1, dtype=torch.int64))
        data = self._broadcast(torch.empty(int(size.item()), dtype=torch.uint8))
        return json.loads(data.numpy().tobytes())

    def _broadcast(self, x: torch.Tensor) -> torch.Tensor:
        dist.broadcast(x, group=self.process_group, group_src=0)
        return x
