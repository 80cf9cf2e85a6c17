"""The head's side of prefix caching: which cached blocks a request reuses, which blocks a step names,
and which cached blocks make room (docs/pipeline.md, "Prefix caching").

The head decides everything and its own stage-0 cache executes it first; the other stages execute the
same operations in the same order from the frames (``attach`` and ``commit`` in a ``batch``,
``evict`` in a ``free``), so every stage holds the same named blocks and no stage recomputes what
another reused. Names are chained from a seed of the model, the pipeline and its epoch: every change
of the pipeline (a stage restarted, re-placed, given another precision or other layers) starts a new
epoch, which empties every cache and changes every name, because a stage's KV depends on every stage
before it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from contracts.prefix_cache import PrefixSummary, block_hashes, chain_seed

from .kv_cache import KVCache
from .protocol import PrefixOps
from .scheduler import KVLedger, Request


class PrefixIndex:
    """Prefix caching for one head: ``admit`` is the scheduler's admission, ``operations`` and ``commit``
    go with each micro-batch, ``evicted`` and ``host_ops`` with the next ``free`` frame, ``summary`` to
    the router."""

    def __init__(self, kv: KVCache, ledger: KVLedger, model_path: str, pipeline_id: str, epoch: int,
                 restore: Callable[[list[int]], int] | None = None, tell: Callable[[], None] = lambda: None):
        """``restore(names)``: copy blocks back from the host tier (``StageWorker.restore``, paced on an
        emulated card; default ``KVCache.restore``). ``tell()``: send the other stages what is pending
        (the head's ``free`` frame), called before stage 0 copies blocks back so that every stage
        copies at once."""
        self.kv, self.ledger = kv, ledger
        self._restore = restore or (lambda names: sum(kv.restore(name) for name in names))
        self._tell = tell
        self._identity = (model_path, pipeline_id)
        self._names: dict[int, list[int]] = {}  # admitted seq_id -> names of its blocks so far
        self._prompt_names: dict[int, list[int]] = {}  # waiting seq_id -> its prompt's reusable blocks
        self.evicted: list[int] = []  # evicted here, for the other stages with the next ``free`` frame
        # What the host tier did here, in order, for the other stages with the next ``free`` frame:
        # ("offload" | "drop" | "restore", name), ("clear", 0).
        self.host_ops: list[tuple[str, int]] = []
        self._summary: tuple[tuple[int, int, int], dict[str, Any]] | None = None
        self._suspended = False
        self.new_epoch(epoch)

    def new_epoch(self, epoch: int) -> None:
        """A new pipeline state: new names (the caches are emptied by the same break), nothing pending."""
        self.seed = chain_seed(*self._identity, epoch, self.kv.block_size)
        self._names.clear()
        self._prompt_names.clear()
        self.evicted.clear()
        self.host_ops.clear()

    def admit(self, request: Request) -> bool:
        """Admit ``request`` if every stage has room for the blocks it does not find cached, evicting
        least recently used cached blocks (not its own) where that makes the room, to the host tier if
        the pipeline has one; copy back from there the blocks its prefix continues into (new blocks to
        the ledger, as computed ones would be); attach what it reuses on stage 0 now, so no later
        admission evicts it before the request's first step."""
        size = self.kv.block_size
        names = self._prompt_names.get(request.seq_id)
        if names is None:  # the block of the prompt's last token is never reused: its logits are needed
            names = block_hashes(request.prompt[:-1], size, self.seed)
        # a prompt scored for its log-probabilities is computed whole: every position's logits
        whole = self._suspended or request.params.prompt_logprobs is not None
        reused = [] if whole else list(itertools.takewhile(self.kv.holds, names))
        host = self.kv.host
        held = ([] if whole or host is None
                else list(itertools.takewhile(host.__contains__, names[len(reused):])))
        total = self.ledger.blocks(request.kv_tokens)
        if short := self.ledger.shortfall(total - len(reused)):
            pinned = set(reused + held)
            victims = list(itertools.islice((n for n in self.kv.evictable() if n not in pinned), short))
            if len(victims) < short:
                self._prompt_names[request.seq_id] = names
                return False
            if host is not None:
                self._offload(victims, keep=set(held))
            self.kv.evict(victims)
            self.evicted.extend(victims)
        self._prompt_names.pop(request.seq_id, None)
        if held:
            self.host_ops.extend(("restore", name) for name in held)
            self._tell()
            self._restore(held)
        reused += held
        self.kv.attach(request.seq_id, reused)
        self._names[request.seq_id] = reused
        request.cached = len(reused) * size
        self.ledger.reserve(request.seq_id, total)
        return True

    def _offload(self, victims: list[int], keep: set[int]) -> None:
        """Move ``victims`` to the host tier, dropping its least recently used blocks for room but
        never those in ``keep`` (about to be copied back); a victim no room is left for is forgotten."""
        host = self.kv.host
        for name in victims:
            if host.full and name not in host:
                dropped = host.least_recent(keep)
                if dropped is None:
                    continue
                host.drop(dropped)
                self.host_ops.append(("drop", dropped))
            self.kv.offload(name)
            self.host_ops.append(("offload", name))

    def operations(self, requests: Sequence[Request], inputs: Sequence[tuple[list[int], int]]) -> PrefixOps:
        """What a micro-batch of ``requests`` feeding ``inputs`` (tokens, start) does to the cached blocks:
        each new sequence attaches what it reused; every block the step fills gets its name."""
        size, attach, commit = self.kv.block_size, [], []
        for request, (tokens, start) in zip(requests, inputs):
            known = self._names[request.seq_id]
            attach.append(list(known) if not request.output else [])
            # Proposals a speculative step verifies are not the sequence's until accepted: never named.
            end, first = start + len(tokens) - len(request.proposals), len(known)
            if end // size > first:  # the step fills blocks: name them, chained on the last one named
                sequence = (request.prompt + request.output)[:end]
                known.extend(block_hashes(sequence, size, self.seed, start=first,
                                          previous=known[-1] if known else None))
            commit.append((first, known[first:]))
        return PrefixOps(attach, commit)

    def commit(self, seq_ids: Sequence[int], ops: PrefixOps) -> None:
        """Name stage 0's blocks that a step of ``ops`` filled (after the step ran)."""
        for seq_id, (first, names) in zip(seq_ids, ops.commit):
            if names:
                self.kv.commit(seq_id, first, names)

    def forget(self, seq_id: int) -> None:
        """A request ended (its blocks were freed on stage 0)."""
        self._names.pop(seq_id, None)
        self._prompt_names.pop(seq_id, None)

    @contextmanager
    def distrusted(self) -> Iterator[None]:
        """Release a micro-batch that failed on some stage inside this: that stage may lack blocks stage
        0 named, so meanwhile admissions reuse nothing, and after it every cached block no sequence
        holds is evicted on every stage (the blocks running sequences hold are alike everywhere)."""
        self._suspended = True
        try:
            yield
        finally:
            self._suspended = False
            victims = list(self.kv.evictable())
            self.kv.evict(victims)
            self.evicted.extend(victims)
            if self.kv.host is not None:  # a stage that lacked a block lacks its host copy too
                self.kv.host.clear()
                self.host_ops.append(("clear", 0))

    def summary(self) -> dict[str, Any]:
        """The Bloom summary of the cached names for the gateway's router, made again only when they
        changed (``contracts.prefix_cache.PrefixSummary``), sized for the tightest stage."""
        capacity = min(self.ledger.capacity.values())
        key = (self.seed, self.kv.names_version, capacity)
        if self._summary is None or self._summary[0] != key:
            summary = PrefixSummary.of(self.seed, self.kv.block_size, self.kv.names, capacity)
            self._summary = (key, summary.to_json())
        return self._summary[1]
