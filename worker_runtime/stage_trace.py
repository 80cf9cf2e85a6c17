"""A stage's span of each traced request (``stage.request``), on every stage after the head: the request's
steps through this stage, as a child of the head's span (docs/observability.md, "Traces").

The head names the traced sequences of a prefill micro-batch with their span's ``traceparent``
(``Batch.traces``, the ``batch`` frame's ``traces``); a stage opens one span for each, counts the steps
the sequence takes part in with the compute and send time of those micro-batches, and ends it when the
sequence is freed (or every span on a reset, a pipeline starting again). A step's time is the whole
micro-batch's, shared by its sequences: the attributes say what the request waited on at this stage,
not what it alone cost. Only while this process traces (contracts/tracing.py); otherwise nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.trace import SpanKind, Status, StatusCode

from contracts.tracing import parent_context, tracer

from .stage import Batch


@dataclass
class _Open:
    span: object
    steps: int = 0
    compute_s: float = 0.0
    send_s: float = 0.0


class StageSpans:
    """The open ``stage.request`` spans of one stage, by sequence."""

    def __init__(self, stage_index: int):
        self.stage_index = stage_index
        self._open: dict[int, _Open] = {}

    def step(self, batch: Batch, compute_s: float, send_s: float) -> None:
        """A micro-batch this stage ran (``compute_s``) and passed on (``send_s``)."""
        for seq_id, traceparent in (batch.traces or {}).items():
            if seq_id not in self._open:
                self._start(seq_id, traceparent)
        for seq_id in batch.seq_ids if self._open else ():
            if (entry := self._open.get(seq_id)) is not None:
                entry.steps += 1
                entry.compute_s += compute_s
                entry.send_s += send_s

    def end(self, seq_ids: list[int], outcome: str = "freed") -> None:
        for seq_id in seq_ids:
            if (entry := self._open.pop(seq_id, None)) is not None:
                entry.span.set_attributes({"motley.steps": entry.steps, "motley.outcome": outcome,
                                           "motley.compute_s": round(entry.compute_s, 6),
                                           "motley.send_s": round(entry.send_s, 6)})
                if outcome != "freed":
                    entry.span.set_status(Status(StatusCode.ERROR, outcome))
                entry.span.end()

    def end_all(self, outcome: str) -> None:
        """Every open span ends (a reset or a newer epoch: the head fails or restarts what was in flight)."""
        self.end(list(self._open), outcome)

    def _start(self, seq_id: int, traceparent: str) -> None:
        stage_tracer = tracer(__name__)
        parent = parent_context(traceparent) if stage_tracer is not None else None
        if parent is None:
            return
        span = stage_tracer.start_span("stage.request", context=parent, kind=SpanKind.INTERNAL,
                                       attributes={"motley.stage_index": self.stage_index,
                                                   "motley.seq_id": seq_id})
        if span.is_recording():
            self._open[seq_id] = _Open(span)
