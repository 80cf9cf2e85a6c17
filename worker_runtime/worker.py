"""One step of one stage: forward a micro-batch, sample on the last stage (grammar-constrained rows
masked first: structured.py), pace if emulated, count it; the end of sequences (``free``, ``clear``);
and the host KV tier's copies back (``restore``, ``replay_host``), paced alike.

Both loops (the head's and the other stages') run their compute through here, so the statistics and
the emulation pacing mean the same thing on every stage.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import NamedTuple

import torch

from contracts.sampling import SamplingParams

from .kv_cache import KVBudgetExceeded
from .logprobs import batch_logprobs
from .pacing import Pacer
from .sampling import sample
from .stage import Batch, Stage
from .stats import StageStats
from .structured import Grammars
from .transport import Transport

log = logging.getLogger(__name__)


class Step(NamedTuple):
    out: torch.Tensor
    compute_s: float
    logprobs: list[list | None] | None = None  # the last stage's, per sequence, where one asked


class StageWorker:
    def __init__(self, stage: Stage, stats: StageStats, pacer: Pacer | None = None,
                 grammars: Grammars | None = None):
        """``grammars``: the last stage's, which enforces constraints (None: a constrained row fails)."""
        self.stage, self.stats, self.pacer, self.grammars = stage, stats, pacer, grammars

    def step(self, batch: Batch, params: list[SamplingParams]) -> Step:
        """Hidden states for the next stage, or on the last stage the token of each sampled logit row
        (int64: each sequence's next token, and after each proposal of a speculative step the
        target's) and the log-probabilities of the sequences that ask (logprobs.py).

        Returns them with the compute seconds (pacing included); the caller records the step once it
        knows the transfer time too. Raises what :meth:`Stage.forward` raises (``KVBudgetExceeded``,
        ``ValueError``), having changed nothing.
        """
        started = time.perf_counter()
        out = self.stage.forward(batch)
        logprobs = None
        if self.stage.is_last:
            logits, picks = out, batch.sampled_rows()
            if batch.scored is not None:  # a scored prompt's rows are not sampled: its last one is
                ends = itertools.accumulate(batch.rows())
                keep = [row for end, n in zip(ends, picks) for row in range(end - n, end)]
                out = out[keep]
            row_params = [p for p, n in zip(params, picks) for _ in range(n)]
            out, constrained = self._constrain(out, batch, params, picks)
            out = sample(out, row_params, batch.produced_positions())
            if constrained:
                self.grammars.advance(constrained, out)
            logprobs = batch_logprobs(logits, batch, params, out)
        if self.pacer is not None:
            self.pacer.pace(batch, time.perf_counter() - started)
        return Step(out, time.perf_counter() - started, logprobs)

    def _constrain(self, logits: torch.Tensor, batch: Batch, params: list[SamplingParams],
                   picks: list[int]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """The sampled ``logits`` with the constrained rows masked, and ``(seq_id, row)`` of each."""
        if self.grammars is None:
            if any(p.constraint is not None for p in params):
                raise ValueError("this stage has no grammars to enforce a constraint with")
            return logits, []
        return self.grammars.constrain(logits, batch.seq_ids, params, picks, batch.replay)

    def free(self, seq_id: int) -> None:
        """A sequence ended: its KV space and its matcher go."""
        self.stage.kv.free(seq_id)
        if self.grammars is not None:
            self.grammars.free(seq_id)

    def clear(self) -> None:
        """Every sequence and cached block goes (a reset)."""
        self.stage.kv.clear()
        if self.grammars is not None:
            self.grammars.clear()

    def restore(self, names: list[int]) -> int:
        """Copy the blocks ``names`` back from the host tier (``KVCache.restore``), paced as a copy
        over the emulated card's host link; returns how many came back."""
        started = time.perf_counter()
        restored = sum(self.stage.kv.restore(name) for name in names)
        if self.pacer is not None and restored:
            self.pacer.pace_copy(restored * self.stage.kv.block_size, time.perf_counter() - started)
        return restored

    def replay_host(self, ops: list[tuple[str, int]]) -> None:
        """Do what the head did to its host tier, in its order (``PrefixIndex.host_ops``). A block that
        cannot come back (this stage no longer matches the head: a failed micro-batch) is skipped: the
        micro-batch attaching it fails here, and the head clears every tier."""
        kv = self.stage.kv
        for op, name in ops:
            if op == "restore":
                try:
                    self.restore([name])
                except KVBudgetExceeded as exc:
                    log.warning("block %#018x not copied back: %s", name, exc)
            elif kv.host is None:
                continue
            elif op == "offload":
                kv.offload(name)
            elif op == "drop":
                kv.host.drop(name)
            elif op == "clear":
                kv.host.clear()

    def record(self, batch: Batch, compute_s: float, transfer_s: float) -> None:
        """Count one step in the statistics, with the KV tokens its sequences read (as the pacer does)."""
        kv_tokens = sum(s + n for s, n in zip(batch.start_positions, batch.lengths))
        self.stats.record_step(compute_s, transfer_s, len(batch.seq_ids), batch.num_tokens, kv_tokens)

    def snapshot(self, transport: Transport) -> dict:
        """The §4 statistics of this stage, plus ``frames_rejected`` (bad token or malformed) and the
        prefix cache's figures. Cached blocks no sequence holds count as free: they are evicted as
        soon as a new sequence needs the room."""
        kv = self.stage.kv
        free = kv.free_tokens + kv.evictable_blocks * kv.block_size
        return {
            **self.stats.snapshot(
                kv_used=kv.capacity_tokens - free,
                kv_free=free,
                bytes_sent=transport.bytes_sent,
                bytes_received=transport.bytes_received,
            ),
            "frames_rejected": transport.rejected,
            "prefix_queried_tokens": kv.prefix_queried_tokens,
            "prefix_hit_tokens": kv.prefix_hit_tokens,
            "prefix_cached_blocks": kv.prefix_cached_blocks,
            "prefix_evicted_blocks": kv.prefix_evicted_blocks,
            "prefix_host_blocks": len(kv.host) if kv.host is not None else 0,
        }
