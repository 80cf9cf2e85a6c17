"""The messages of the data plane, as (JSON header, tensors) pairs, and the one that carries a batch.

Stage to stage: ``batch`` (a micro-batch's hidden states, with ``logits``, the rows per sequence the
last stage returns where a speculative step verifies proposals or a prompt is scored, ``scored``, the
prompt tokens those rows score, ``replay``, a resumed constrained sequence's output so far, and with
prefix caching the cached blocks each new sequence starts with and the blocks each sequence filled:
:class:`PrefixOps`), ``free`` (sequences done, the cached blocks the head evicted: ``evict``, and what
its host tier did: ``host``), ``reset`` (drop every sequence and cached block: the head starts a new
epoch after a failure). To the head: ``tokens`` (sampled by the last stage: a token per sequence, a list
of them for a verified one; ``logprobs`` where a sequence asked, contracts/logprobs.py), ``failed`` (a
stage could not run a micro-batch), ``heartbeat`` (liveness, KV figures and statistics of a stage).
Client to head: ``submit``, ``cancel``, ``stats``, ``health``; head to client: ``tokens`` (that client's
tokens of one micro-batch), ``error``, ``reply``, ``alive``. Every data-plane message carries the head's
``epoch`` so that a stage drops what belongs to a pipeline state that was reset.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from contracts.sampling import SamplingParams

from .frames import Frame, FrameError
from .stage import Batch

NAME_LIMIT = 1 << 64  # block names are 64-bit (contracts.prefix_cache)


@dataclass(frozen=True)
class PrefixOps:
    """What a micro-batch does to each stage's cached blocks, one entry per sequence in batch order:
    ``attach``, the names of the cached blocks a new sequence starts with (before the step);
    ``commit``, the index of the first block the step filled and the names of those blocks (after
    it). In the header only where some entry is not empty."""

    attach: list[list[int]]
    commit: list[tuple[int, list[int]]]

    def to_header(self) -> dict[str, Any]:
        header: dict[str, Any] = {}
        if any(self.attach):
            header["attach"] = self.attach
        if any(names for _, names in self.commit):
            header["commit"] = [[first, names] for first, names in self.commit]
        return header

    @classmethod
    def from_header(cls, h: dict[str, Any], count: int) -> PrefixOps:
        """The operations of a ``batch`` header of ``count`` sequences; raises :class:`FrameError`."""
        try:
            attach = [names_of(entry) for entry in h.get("attach", [[]] * count)]
            commit = [(int(first), names_of(names)) for first, names in h.get("commit", [[0, []]] * count)]
        except (TypeError, ValueError) as exc:
            raise FrameError(f"malformed prefix operations: {exc!r}") from exc
        if len(attach) != count or len(commit) != count:
            raise FrameError("a batch's attach and commit lists have one entry per sequence")
        return cls(attach, commit)


HOST_OPS = ("offload", "drop", "restore", "clear")


def host_ops_of(raw: Any) -> list[tuple[str, int]]:
    """A ``free`` frame's host-tier operations, ``[[op, name], ...]`` in the head's order; raises
    ``TypeError`` or ``ValueError``."""
    if not isinstance(raw, list):
        raise TypeError(f"host operations come as a list, not {type(raw).__name__}")
    ops = []
    for entry in raw:
        op, name = entry
        if op not in HOST_OPS:
            raise ValueError(f"unknown host operation {op!r}")
        ops.append((op, names_of([name])[0]))
    return ops


def names_of(raw: Any) -> list[int]:
    """A list of block names from a header; raises ``TypeError`` or ``ValueError``."""
    if not isinstance(raw, list):
        raise TypeError(f"block names come as a list, not {type(raw).__name__}")
    names = [int(name) for name in raw]
    if any(not 0 <= name < NAME_LIMIT for name in names):
        raise ValueError("a block name is a 64-bit unsigned integer")
    return names


def batch_message(
    epoch: int, micro_batch: int, batch: Batch, params: list[SamplingParams], payload: torch.Tensor,
    prefix: PrefixOps | None = None,
) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """A micro-batch for the next stage: its layout, each sequence's sampling parameters, ``payload``, and
    what it does to the cached blocks (``prefix``)."""
    header = {
        "type": "batch",
        "epoch": epoch,
        "mb": micro_batch,
        "seq_ids": batch.seq_ids,
        "starts": batch.start_positions,
        "lengths": batch.lengths,
        "sampling": [p.to_header() for p in params],
        **({"logits": batch.logit_rows} if batch.logit_rows is not None else {}),
        **({"scored": batch.scored} if batch.scored is not None else {}),
        **({"traces": {str(k): v for k, v in batch.traces.items()}} if batch.traces else {}),
        **({"replay": {str(k): v for k, v in batch.replay.items()}} if batch.replay else {}),
        **(prefix.to_header() if prefix is not None else {}),
    }
    return header, [payload]


def batch_from_frame(frame: Frame, first_stage: bool) -> tuple[Batch, list[SamplingParams]]:
    """The :class:`Batch` a ``batch`` frame carries, checked enough that a bad one fails here, not in a
    layer."""
    h = frame.header
    try:
        seq_ids, starts, lengths = (list(map(int, h["seq_ids"])), list(map(int, h["starts"])),
                                    list(map(int, h["lengths"])))
        params = [SamplingParams.from_header(p) for p in h["sampling"]]
        logit_rows = None if h.get("logits") is None else list(map(int, h["logits"]))
        scored = None if h.get("scored") is None else [list(map(int, s)) for s in h["scored"]]
        traces = {int(k): str(v) for k, v in dict(h.get("traces") or {}).items()} or None
        replay = {int(k): [int(t) for t in v] for k, v in dict(h.get("replay") or {}).items()} or None
    except (KeyError, TypeError, ValueError) as exc:
        raise FrameError(f"malformed batch header: {exc}") from exc
    if len(frame.tensors) != 1 or not (len(seq_ids) == len(starts) == len(lengths) == len(params)):
        raise FrameError("a batch has one tensor and one start, length and sampling entry per sequence")
    if logit_rows is not None and (len(logit_rows) != len(seq_ids)
                                   or any(not 1 <= r <= n for r, n in zip(logit_rows, lengths))):
        raise FrameError("a batch's logits has one count per sequence, from 1 to its length")
    rows = logit_rows or [1] * len(seq_ids)
    if scored is not None and (len(scored) != len(seq_ids) or any(len(s) >= r for s, r in zip(scored, rows))
                               or any(t < 0 for s in scored for t in s)):
        raise FrameError("a batch's scored has one list of token ids per sequence, shorter than its rows")
    if any(named is not None and not set(named) <= set(seq_ids) for named in (traces, replay)):
        raise FrameError("a batch's traces and replay name only its own sequences")
    payload = frame.tensors[0]
    batch = Batch(seq_ids, starts, lengths, logit_rows=logit_rows, scored=scored, traces=traces,
                  replay=replay)
    if payload.shape[0] != batch.num_tokens:
        raise FrameError(f"batch payload has {payload.shape[0]} rows for {batch.num_tokens} tokens")
    return (batch.with_hidden(payload) if not first_stage
            else replace(batch, input_ids=payload)), params
