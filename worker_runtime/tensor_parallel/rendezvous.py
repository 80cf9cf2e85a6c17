"""How a served group forms: rank 0 hosts a ``TCPStore`` on a free port of its node and starts the other
ranks with its address; each rank joins the process group through it, loads its shard and reports its
memory in the store, so rank 0 says ready only once the whole group is loaded, however long that takes.

The group's collectives run on the device's backend (NCCL on CUDA, gloo on CPU); its control channel
(channel.py) always on gloo, whose CPU tensors need no device.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from ..stage import StageMemory
from .channel import ControlChannel
from .group import ShardGroup, backend_for

# Loading a large shard takes minutes on a real card: the store waits that long for the others.
STORE_TIMEOUT = timedelta(minutes=30)
# A rank that does not join a collective for this long is hung: the others fail rather than wait on.
COLLECTIVE_TIMEOUT = timedelta(seconds=60)
STORE_HOST = "127.0.0.1"  # a group's ranks run on one node


def host_store(size: int) -> dist.TCPStore:
    """Rank 0's store, on a port the system picks (``store.port``)."""
    return dist.TCPStore(STORE_HOST, 0, size, is_master=True, timeout=STORE_TIMEOUT, wait_for_workers=False)


def join_store(port: int, size: int) -> dist.TCPStore:
    return dist.TCPStore(STORE_HOST, port, size, is_master=False, timeout=STORE_TIMEOUT)


def join(rank: int, size: int, store: dist.Store,
         device: torch.device | str) -> tuple[ShardGroup, ControlChannel]:
    """Join the group as ``rank``: its collectives' group, and its control channel."""
    device = torch.device(device)
    backend = backend_for(device)
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=COLLECTIVE_TIMEOUT,
                            device_id=device if device.type == "cuda" else None)
    control = None if backend == "gloo" else dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)
    return ShardGroup(), ControlChannel(control)


def report_loaded(store: dist.Store, rank: int, memory: StageMemory) -> None:
    store.set(f"loaded/{rank}", json.dumps({"weight_bytes_by_kind": memory.weight_bytes_by_kind,
                                            "kv_cache_bytes": memory.kv_cache_bytes,
                                            "kv_bytes_per_token": memory.kv_bytes_per_token}))


def wait_loaded(store: dist.Store, ranks: range, exited: Callable[[int], int | None],
                poll_s: float = 0.05) -> list[StageMemory]:
    """The memory each of ``ranks`` reports once loaded, in rank order. RuntimeError names a rank that
    exited first (``exited(rank)``: its exit code, None while it runs) or the store's timeout."""
    keys = [f"loaded/{rank}" for rank in ranks]
    deadline = time.monotonic() + STORE_TIMEOUT.total_seconds()
    while not store.check(keys):
        for rank in ranks:
            if (code := exited(rank)) is not None:
                raise RuntimeError(f"tensor-parallel rank {rank} exited with code {code} before it loaded "
                                   "its shard (its log is in this stage's stderr)")
        if time.monotonic() > deadline:
            raise RuntimeError(f"tensor-parallel ranks {list(ranks)} did not load within {STORE_TIMEOUT}")
        time.sleep(poll_s)
    return [StageMemory(kv_tokens=0, **json.loads(store.get(key))) for key in keys]
