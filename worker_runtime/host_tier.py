"""The host tier of a stage's KV prefix cache: named blocks evicted from the device, kept in host memory.

When the head evicts a named block from the device and the pipeline has a host tier, every stage
copies the block's K and V of its own layers here instead of forgetting them; a later request whose
prefix continues into the block gets it copied back into a device block instead of prefilled again,
which the planner found the cheaper on this pipeline's cards (controlplane/planning/host_tier.py).

The pool holds the spec's ``host_kv_tokens`` in whole blocks. Each block is one contiguous run,
``[blocks, layers, block_size, kv_heads, head_dim]`` per K and V (the device cache's layout with the
block first), so a block goes either way in one transfer. It is pinned when the stage's device is
CUDA, so copies run at the link's full speed; on the CPU it is lazily zeroed (``kv_cache``), so a
tier nothing was evicted to costs no memory.

The head decides what enters and leaves, so every stage holds the same names: it makes room itself
(``least_recent``, then ``drop``), sparing the blocks it is about to copy back, and the other stages
replay its drops, offloads and restores in its order (docs/pipeline.md, "Host KV tier"). ``restore``
copies a block back and keeps it, the most recently used (evicted again, it needs no second copy).
A full pool asked to take one more drops its least recently used block itself: only a stage whose
pool no longer matches the head's (a failed micro-batch) gets there.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection

import torch

from .kv_cache import KVCache, _lazy_zeros


class HostTier:
    """At most ``host_kv_tokens // block_size`` named KV blocks of ``num_layers`` layers in host memory."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, host_kv_tokens: int, *,
                 block_size: int, device: torch.device | str, dtype: torch.dtype):
        if block_size <= 0 or host_kv_tokens < 0:
            raise ValueError("block_size must be positive and host_kv_tokens not negative")
        self.block_size = block_size
        self.num_blocks = host_kv_tokens // block_size
        shape = (self.num_blocks, num_layers, block_size, num_kv_heads, head_dim)
        if torch.device(device).type == "cuda":  # only ever read where written: no need to zero
            self.k = torch.empty(shape, dtype=dtype, pin_memory=True)
            self.v = torch.empty(shape, dtype=dtype, pin_memory=True)
        else:
            self.k = _lazy_zeros(shape, torch.device("cpu"), dtype)
            self.v = _lazy_zeros(shape, torch.device("cpu"), dtype)
        self._free = list(range(self.num_blocks - 1, -1, -1))
        self._held: OrderedDict[int, int] = OrderedDict()  # name -> slot, least recently used first

    @classmethod
    def of(cls, kv: KVCache, host_kv_tokens: int) -> HostTier:
        """A tier for the blocks of ``kv``, a stage's device cache: its layers, heads, block size and
        dtype, pinned if its device is CUDA."""
        layers, _, heads, head_dim = kv.k.shape
        return cls(layers, heads, head_dim, host_kv_tokens, block_size=kv.block_size, device=kv.device,
                   dtype=kv.k.dtype)

    @property
    def full(self) -> bool:
        return not self._free

    def least_recent(self, keep: Collection[int] = ()) -> int | None:
        """The least recently used block not in ``keep`` (None if there is none): the head's choice of
        the block to drop for room."""
        return next((name for name in self._held if name not in keep), None)

    @property
    def names(self) -> list[int]:
        """The blocks held, least recently used first."""
        return list(self._held)

    def __len__(self) -> int:
        """Blocks held now."""
        return len(self._held)

    def __contains__(self, name: int) -> bool:
        return name in self._held

    def offload(self, name: int, k_block: torch.Tensor, v_block: torch.Tensor) -> int | None:
        """Keep a copy of a device block's K and V (``[layers, block_size, kv_heads, head_dim]`` each)
        under ``name``; returns the name of the block dropped to make room, or None."""
        if not self.num_blocks:
            raise ValueError("this stage has no host tier (host_kv_tokens below one block)")
        if name in self._held:  # the same prefix's KV: nothing to copy
            self._held.move_to_end(name)
            return None
        dropped = None
        if not self._free:
            dropped, slot = self._held.popitem(last=False)
            self._free.append(slot)
        slot = self._free.pop()
        self.k[slot].copy_(k_block)
        self.v[slot].copy_(v_block)
        self._held[name] = slot
        return dropped

    def restore(self, name: int, k_block: torch.Tensor, v_block: torch.Tensor) -> None:
        """Copy block ``name`` back into a device block's K and V, keeping it here as the most recently
        used (KeyError if it is not held). From pinned memory the copy is queued on the current stream:
        the stage's next forward, on the same stream, reads it after it lands, and an ``offload`` that
        later reuses the slot waits for it, being a copy on that stream too."""
        slot = self._held[name]
        self._held.move_to_end(name)
        k_block.copy_(self.k[slot], non_blocking=True)
        v_block.copy_(self.v[slot], non_blocking=True)

    def drop(self, name: int) -> bool:
        """Forget block ``name``; whether it was held."""
        slot = self._held.pop(name, None)
        if slot is not None:
            self._free.append(slot)
        return slot is not None

    def clear(self) -> None:
        """Forget every block (a pipeline's new epoch, a stage given a new spec)."""
        self._free.extend(self._held.values())
        self._held.clear()
