"""A paged KV cache preallocated to the token budget the plan gives a stage.

Memory is one tensor per K and V, ``[layers, slots, kv_heads, head_dim]``, cut into blocks of
``block_size`` token slots. A sequence owns a list of blocks, so sequences of any mix of lengths
waste less than one block each, freeing a sequence returns its blocks at once, and a request past
the budget is refused with :class:`KVBudgetExceeded` before anything is written, never an
out-of-memory crash in the middle of a step.

The cache also owns each sequence's length (its next position), which is all the per-sequence state
a stage keeps; :meth:`KVCache.plan` turns a ragged batch into the few index tensors every layer shares.

Prefix caching (docs/pipeline.md, "Prefix caching"): a full block can be given a name
(:meth:`KVCache.commit`, a hash chained over its prefix, ``contracts.prefix_cache``); a new sequence
may start with named blocks (:meth:`KVCache.attach`), shared by reference count. A named block no
sequence holds stays cached, in least-recently-used order, until :meth:`KVCache.evict` names it. The
cache never evicts on its own: the head decides every eviction and every stage executes it, so all
stages of a pipeline hold the same named blocks whatever their capacities. A partial block never has
a name, so a shared block is never written: a sequence computes its own copy of a partial tail.
"""

from __future__ import annotations

import math
import mmap
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .host_tier import HostTier


class KVBudgetExceeded(RuntimeError):
    """The stage's KV cache cannot hold the tokens asked for; nothing was reserved or written."""


@dataclass(frozen=True)
class AttentionPlan:
    """Index tensors for one forward of a ragged batch, shared by all layers of the stage.

    Tokens are packed flat (sequence after sequence); attention runs on a padded
    ``[batch, max_new_tokens]`` view of the queries against ``[batch, max_length]`` gathered keys.
    """

    positions: torch.Tensor  # [tokens] position of each new token
    seq_ends: torch.Tensor  # [tokens] length of the token's sequence after this step
    write_slots: torch.Tensor  # [tokens] cache slot each new token's K/V goes to
    gather_slots: torch.Tensor  # [batch * max_length] cache slots of each sequence's keys (padded), flat
    query_index: torch.Tensor | None  # [tokens] index into the padded [batch * max_new] layout, or None
    mask: torch.Tensor | None  # [batch, 1, max_new, max_length] bool, True where attention is allowed
    batch: int
    max_new: int


class KVCache:
    """Paged K/V storage for ``num_layers`` layers and at most ``kv_tokens`` tokens in total."""

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        kv_tokens: int,
        *,
        block_size: int = 16,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        sliding_window: int | None = None,
    ):
        if kv_tokens <= 0 or block_size <= 0:
            raise ValueError("kv_tokens and block_size must be positive")
        self.block_size = block_size
        self.num_blocks = math.ceil(kv_tokens / block_size)
        self.sliding_window = sliding_window
        self.device = torch.device(device)
        shape = (num_layers, self.num_blocks * block_size, num_kv_heads, head_dim)
        # Zeros, not empty: padded gathers read unused slots, and 0 * NaN would poison real rows.
        self.k = _lazy_zeros(shape, self.device, dtype)
        self.v = _lazy_zeros(shape, self.device, dtype)
        self._free_blocks = list(range(self.num_blocks - 1, -1, -1))
        self._blocks: dict[int, list[int]] = {}
        self._lengths: dict[int, int] = {}
        self._block_of: dict[int, int] = {}  # name -> block
        self._name_of: dict[int, int] = {}  # block -> name
        self._refs: dict[int, int] = {}  # named block -> sequences holding it
        self._unused: OrderedDict[int, None] = OrderedDict()  # names no sequence holds, least recent first
        self._fresh: set[int] = set()  # attached sequences that have not run a step yet
        self.names_version = 0  # changes whenever the set of names does (the head's summary is lazy)
        # Cumulative since the process started (the statistics' prefix_* figures):
        self.prefix_queried_tokens = 0  # tokens of new sequences' first steps, cached ones included
        self.prefix_hit_tokens = 0  # tokens new sequences found cached (attached)
        self.prefix_evicted_blocks = 0
        # The host tier (host_tier.py), set by whoever runs the stage from its spec's host_kv_tokens.
        self.host: HostTier | None = None

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def free_tokens(self) -> int:
        """Tokens that can still be reserved (whole free blocks)."""
        return len(self._free_blocks) * self.block_size

    @property
    def used_blocks(self) -> int:
        """Blocks held by sequences or cached under a name (not on the free list)."""
        return self.num_blocks - len(self._free_blocks)

    @property
    def evictable_blocks(self) -> int:
        """Named blocks no sequence holds: cached, and free for the taking once evicted."""
        return len(self._unused)

    @property
    def prefix_cached_blocks(self) -> int:
        return len(self._block_of)

    @property
    def names(self) -> list[int]:
        """The names of every cached block."""
        return list(self._block_of)

    def holds(self, name: int) -> bool:
        return name in self._block_of

    def evictable(self) -> Iterator[int]:
        """Names of the blocks no sequence holds, least recently used first (a chain's tail before its
        head: :meth:`free` releases a sequence's blocks from its end)."""
        return iter(self._unused)

    def blocks_of(self, seq_id: int) -> int:
        return len(self._blocks.get(seq_id, ()))

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    @property
    def bytes_per_token(self) -> int:
        return self.nbytes // self.capacity_tokens

    @property
    def sequences(self) -> list[int]:
        return list(self._blocks)

    def length(self, seq_id: int) -> int:
        """Tokens of ``seq_id`` held in the cache (its next position); 0 for an unknown sequence."""
        return self._lengths.get(seq_id, 0)

    def reserved_tokens(self, seq_id: int) -> int:
        return len(self._blocks.get(seq_id, ())) * self.block_size

    def _blocks_needed(self, seq_id: int, n_tokens: int) -> int:
        return max(0, math.ceil(n_tokens / self.block_size) - len(self._blocks.get(seq_id, ())))

    def allocate(self, seq_id: int, n_tokens: int) -> None:
        """Reserve room for ``seq_id`` to reach ``n_tokens`` tokens in total (e.g. prompt + max new tokens).

        Reserving up front lets a scheduler admit a request only when it can finish; without it, blocks
        are taken on demand by :meth:`plan`. Raises :class:`KVBudgetExceeded` and reserves nothing if
        the blocks are not free.
        """
        self._reserve({seq_id: n_tokens})

    def _reserve(self, totals: dict[int, int]) -> None:
        needed = {seq_id: self._blocks_needed(seq_id, n) for seq_id, n in totals.items()}
        for seq_id, n in totals.items():
            if n > self.capacity_tokens:
                raise KVBudgetExceeded(
                    f"sequence {seq_id} needs {n} KV tokens but this stage's whole cache holds "
                    f"{self.capacity_tokens} (kv_tokens budget of the plan)"
                )
        total = sum(needed.values())
        if total > len(self._free_blocks):
            raise KVBudgetExceeded(
                f"KV cache full: sequences {sorted(totals)} need {total * self.block_size} more tokens, "
                f"{self.free_tokens} of {self.capacity_tokens} are free; "
                "free finished sequences or retry later"
            )
        for seq_id, count in needed.items():
            blocks = self._blocks.setdefault(seq_id, [])
            self._lengths.setdefault(seq_id, 0)
            blocks.extend(self._free_blocks.pop() for _ in range(count))

    def free(self, seq_id: int) -> None:
        """Forget ``seq_id``: its private blocks go back to the free list, its named ones lose a reference
        (and, at none, become the most recently used of the evictable, its tail block first); freeing an
        unknown sequence is a no-op (idempotent)."""
        for block in reversed(self._blocks.pop(seq_id, [])):
            name = self._name_of.get(block)
            if name is None:
                self._free_blocks.append(block)
                continue
            self._refs[block] -= 1
            if not self._refs[block]:
                self._unused[name] = None
        self._lengths.pop(seq_id, None)
        self._fresh.discard(seq_id)

    def attach(self, seq_id: int, names: list[int]) -> None:
        """Start the new sequence ``seq_id`` with the cached blocks ``names`` (its first
        ``len(names) * block_size`` tokens). Raises ``ValueError`` and changes nothing if the sequence
        exists or a name is not cached here."""
        if seq_id in self._lengths:
            raise ValueError(f"sequence {seq_id} already holds blocks: only a new sequence attaches")
        missing = next((name for name in names if name not in self._block_of), None)
        if missing is not None:
            raise ValueError(f"sequence {seq_id}: block {missing:#018x} is not cached on this stage")
        if not names:
            return
        blocks = [self._block_of[name] for name in names]
        for name, block in zip(names, blocks):
            self._refs[block] += 1
            self._unused.pop(name, None)
        self._blocks[seq_id] = blocks
        self._lengths[seq_id] = len(blocks) * self.block_size
        self._fresh.add(seq_id)
        self.prefix_hit_tokens += self._lengths[seq_id]

    def commit(self, seq_id: int, first: int, names: list[int]) -> None:
        """Name ``seq_id``'s full blocks ``first, first + 1, ...``, so later sequences can attach them. A
        name another block already has leaves this block private: the decision depends only on the
        names held, so every stage makes it alike. Raises ``ValueError`` and changes nothing if a block
        is not full or has a name."""
        full = self._lengths.get(seq_id, 0) // self.block_size
        if first < 0 or first + len(names) > full:
            raise ValueError(f"sequence {seq_id}: blocks {first}..{first + len(names) - 1} are not all full "
                             f"({full} are)")
        blocks = self._blocks.get(seq_id, [])[first:first + len(names)]
        if any(block in self._name_of for block in blocks):
            raise ValueError(f"sequence {seq_id}: a block from {first} on already has a name")
        for name, block in zip(names, blocks):
            if name in self._block_of:
                continue
            self._block_of[name], self._name_of[block], self._refs[block] = block, name, 1
            self.names_version += 1

    def evict(self, names: list[int]) -> int:
        """Forget the named blocks ``names`` no sequence holds and return them to the free list; a name not
        cached here, or still held, is skipped (after a failed micro-batch a stage may lack names the
        head holds). Returns how many were evicted."""
        evicted = 0
        for name in names:
            if name not in self._unused:
                continue
            del self._unused[name]
            block = self._block_of.pop(name)
            del self._name_of[block], self._refs[block]
            self._free_blocks.append(block)
            evicted += 1
        if evicted:
            self.prefix_evicted_blocks += evicted
            self.names_version += 1
        return evicted

    def offload(self, name: int) -> bool:
        """Copy the cached block ``name``, no sequence holding it, to the host tier and evict it here;
        False, with nothing done, where it is not such a block here."""
        if name not in self._unused or self.host is None:
            return False
        self.host.offload(name, *self._views(self._block_of[name]))
        self.evict([name])
        return True

    def restore(self, name: int) -> bool:
        """Copy block ``name`` back from the host tier into a free block, cached under its name with no
        sequence holding it, for the next ``attach``; False where the host tier lacks it or it is
        cached here already. ``KVBudgetExceeded`` when no block is free."""
        if self.host is None or name not in self.host or name in self._block_of:
            return False
        if not self._free_blocks:
            raise KVBudgetExceeded(f"no free block to copy block {name:#018x} back from the host tier into")
        block = self._free_blocks.pop()
        self.host.restore(name, *self._views(block))
        self._block_of[name], self._name_of[block], self._refs[block] = block, name, 0
        self._unused[name] = None
        self.names_version += 1
        return True

    def _views(self, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Block ``block``'s K and V, ``[layers, block_size, kv_heads, head_dim]`` views."""
        slots = slice(block * self.block_size, (block + 1) * self.block_size)
        return self.k[:, slots], self.v[:, slots]

    def clear(self) -> None:
        """Forget every sequence and every name, the host tier's too (a pipeline's new epoch, a stage
        given a new spec)."""
        self._free_blocks = list(range(self.num_blocks - 1, -1, -1))
        self._blocks.clear()
        self._lengths.clear()
        self._fresh.clear()
        if self._block_of:
            self.names_version += 1
        self._block_of.clear()
        self._name_of.clear()
        self._refs.clear()
        self._unused.clear()
        if self.host is not None:
            self.host.clear()

    def plan(self, seq_ids: list[int], starts: list[int], lengths: list[int]) -> AttentionPlan:
        """Reserve room for a ragged batch, advance each sequence's length, and build the index tensors.

        ``starts[i]`` is the position of sequence ``i``'s first new token. It may be lower than the
        cached length (the tail is recomputed and overwritten, e.g. a retried step) but not higher,
        since the cache would have a hole, nor within a named block, which other sequences may share.
        """
        if not (len(seq_ids) == len(starts) == len(lengths)) or not seq_ids:
            raise ValueError("a batch needs equally long, non-empty seq_ids, starts and lengths")
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError("a sequence may appear only once per batch")
        for seq_id, start, n in zip(seq_ids, starts, lengths):
            if n <= 0:
                raise ValueError(f"sequence {seq_id}: a batch entry needs at least one token")
            if not 0 <= start <= self.length(seq_id):
                raise ValueError(
                    f"sequence {seq_id}: start position {start} "
                    f"but the cache holds {self.length(seq_id)} tokens"
                )
            written = self._blocks.get(seq_id, [])[start // self.block_size:]
            if start < self.length(seq_id) and any(block in self._name_of for block in written):
                raise ValueError(f"sequence {seq_id}: start position {start} would overwrite a shared block")
        new = [seq_id not in self._lengths or seq_id in self._fresh for seq_id in seq_ids]
        self._reserve({seq_id: start + n for seq_id, start, n in zip(seq_ids, starts, lengths)})
        for seq_id, start, n, first in zip(seq_ids, starts, lengths, new):
            self._lengths[seq_id] = start + n
            if first:
                self.prefix_queried_tokens += start + n
                self._fresh.discard(seq_id)
        return self._build_plan(seq_ids, starts, lengths)

    def _block_table(self, seq_ids: list[int], num_blocks: int) -> torch.Tensor:
        """[batch, num_blocks] block ids; a sequence's missing tail repeats its first block (masked out)."""
        rows = []
        for seq_id in seq_ids:
            blocks = self._blocks[seq_id][:num_blocks]
            rows.append(blocks + blocks[:1] * (num_blocks - len(blocks)))
        return torch.tensor(rows, dtype=torch.long)

    def _build_plan(self, seq_ids: list[int], starts: list[int], lengths: list[int]) -> AttentionPlan:
        """The index tensors, built for the whole batch at once: a few tensor ops whatever its size."""
        batch, max_new = len(seq_ids), max(lengths)
        ends = [s + n for s, n in zip(starts, lengths)]
        max_len = max(ends)
        k_slot = torch.arange(max_len)
        table = self._block_table(seq_ids, math.ceil(max_len / self.block_size))
        # [batch, max_len]: the cache slot of every key position of every sequence
        gather = table[:, k_slot // self.block_size] * self.block_size + k_slot % self.block_size
        starts_t, lengths_t = torch.tensor(starts), torch.tensor(lengths)
        q_pos = starts_t[:, None] + torch.arange(max_new)[None, :]  # [batch, max_new]
        is_new = torch.arange(max_new)[None, :] < lengths_t[:, None]  # real (not padding) query rows
        write = gather.gather(1, q_pos.clamp(max=max_len - 1))[is_new]
        positions = q_pos[is_new]
        seq_ends = (starts_t + lengths_t)[:, None].expand(batch, max_new)[is_new]
        query_index = torch.arange(batch * max_new).view(batch, max_new)[is_new]
        k_pos = k_slot[None, None, :]
        padded = any(n != max_new for n in lengths)
        ragged_keys = any(e != max_len for e in ends)
        needs_mask = padded or max_new > 1 or ragged_keys or self.sliding_window is not None
        mask = None
        if needs_mask:
            mask = k_pos <= q_pos[:, :, None]
            if self.sliding_window is not None:
                mask &= k_pos > q_pos[:, :, None] - self.sliding_window
            mask = mask[:, None].to(self.device)
        dev = self.device
        return AttentionPlan(
            positions=positions.to(dev),
            seq_ends=seq_ends.to(dev),
            write_slots=write.to(dev),
            gather_slots=gather.view(-1).to(dev),
            query_index=query_index.to(dev) if padded else None,
            mask=mask,
            batch=batch,
            max_new=max_new,
        )


def _lazy_zeros(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor that, on the CPU, costs nothing until used: its pages come from an anonymous
    mapping, which the kernel zeroes on first touch, so the pool's memory is committed only as
    sequences fill it. ``torch.zeros`` would write every page up front: a stage's pool at the demo
    plan's budgets is about a GB, and such a stage loads in 0.44 s lazily zeroed against 0.85 s with
    ``torch.zeros``, a pause every request of the pipeline waits out (docs/benchmarks.md, "Stage start")."""
    count = math.prod(shape)
    if device.type != "cpu" or count == 0:
        return torch.zeros(shape, device=device, dtype=dtype)
    pages = mmap.mmap(-1, count * dtype.itemsize)  # anonymous, private, read-write; freed with the tensor
    return torch.frombuffer(pages, dtype=dtype, count=count).view(shape)
