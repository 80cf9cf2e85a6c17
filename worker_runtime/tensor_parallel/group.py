"""The collectives of a tensor-parallel group: the sums after each layer's two row-parallel products, and
the first rank's input sent to the others. gloo on CPU, NCCL on CUDA: the backend follows the device."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

# A rank that never joins a collective is a dead peer: the others fail after this long, never hang.
DEFAULT_TIMEOUT = timedelta(seconds=60)


def backend_for(device: torch.device | str) -> str:
    """The ``torch.distributed`` backend for a group whose tensors live on ``device``."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


@dataclass(frozen=True)
class ShardGroup:
    """A process group of a stage's shards; ``process_group`` None: the default (whole world) group."""

    process_group: dist.ProcessGroup | None = None

    @property
    def rank(self) -> int:
        return dist.get_rank(self.process_group)

    @property
    def size(self) -> int:
        return dist.get_world_size(self.process_group)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` summed over the group, in place (every rank gets the same sum)."""
        dist.all_reduce(x, group=self.process_group)
        return x

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """The group's first rank's ``x``, written into every other rank's ``x`` in place."""
        dist.broadcast(x, group=self.process_group, group_src=0)
        return x


def init_group(rank: int, size: int, init_method: str, device: torch.device | str,
               timeout: timedelta = DEFAULT_TIMEOUT) -> ShardGroup:
    """Join the default process group as ``rank`` of ``size`` through ``init_method`` (``tcp://host:port``
    or ``file://path``), with the backend for ``device``; one group per process."""
    device = torch.device(device)
    dist.init_process_group(backend_for(device), init_method=init_method, rank=rank, world_size=size,
                            timeout=timeout, device_id=device if device.type == "cuda" else None)
    return ShardGroup()
