"""The messages of the data plane, as (JSON header, tensors) pairs, and the one that carries a batch.

Stage to stage: ``batch`` (a micro-batch's hidden states), ``free`` (sequences done), ``reset`` (drop
every sequence: the head starts a new epoch after a failure). To the head: ``tokens`` (sampled by the
last stage), ``failed`` (a stage could not run a micro-batch), ``heartbeat`` (liveness, KV figures
and statistics of a stage). Client to head: ``submit``, ``cancel``, ``stats``, ``health``; head to
client: ``tokens`` (that client's tokens of one micro-batch), ``error``, ``reply``, ``alive``. Every
data-plane message carries the head's ``epoch`` so that a stage drops what belongs to a pipeline
state that was reset.
"""

from __future__ import annotations

from typing import Any

import torch

from contracts.sampling import SamplingParams

from .frames import Frame, FrameError
from .stage import Batch


def batch_message(
    epoch: int, micro_batch: int, batch: Batch, params: list[SamplingParams], payload: torch.Tensor
) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """A micro-batch for the next stage: its layout, each sequence's sampling parameters, and ``payload``."""
    header = {
        "type": "batch",
        "epoch": epoch,
        "mb": micro_batch,
        "seq_ids": batch.seq_ids,
        "starts": batch.start_positions,
        "lengths": batch.lengths,
        "sampling": [vars(p) for p in params],  # a frozen dataclass's fields, without asdict's deep copy
    }
    return header, [payload]


def batch_from_frame(frame: Frame, first_stage: bool) -> tuple[Batch, list[SamplingParams]]:
    """The :class:`Batch` a ``batch`` frame carries, checked enough that a bad one fails here, not in a
    layer."""
    h = frame.header
    try:
        seq_ids, starts, lengths = (list(map(int, h["seq_ids"])), list(map(int, h["starts"])),
                                    list(map(int, h["lengths"])))
        params = [SamplingParams(**p) for p in h["sampling"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise FrameError(f"malformed batch header: {exc}") from exc
    if len(frame.tensors) != 1 or not (len(seq_ids) == len(starts) == len(lengths) == len(params)):
        raise FrameError("a batch has one tensor and one start, length and sampling entry per sequence")
    payload = frame.tensors[0]
    batch = Batch(seq_ids, starts, lengths)
    if payload.shape[0] != batch.num_tokens:
        raise FrameError(f"batch payload has {payload.shape[0]} rows for {batch.num_tokens} tokens")
    return (batch.with_hidden(payload) if not first_stage
            else Batch(seq_ids, starts, lengths, input_ids=payload)), params
