"""The head's span of one request (``head.request``): its life in the scheduler, from submission to
its last token, as a child of the gateway's span (docs/observability.md, "Traces").

Only a request whose ``submit`` carried a sampled ``traceparent`` gets one, and only while this
process traces (contracts/tracing.py): the gateway decides what is sampled, the head follows. The
batched work a request takes part in is recorded without a span per step: each prefill chunk is an
event (its micro-batch, its tokens), the decode steps are counted, and the phases are attributes
(``motley.queue_wait_s``, ``motley.prefill_s``, ``motley.decode_s``), so a long generation costs one
span, not one per token.
"""

from __future__ import annotations

import time

from opentelemetry.trace import SpanKind, Status, StatusCode

from contracts.tracing import parent_context, tracer

_FAILURES = ("failed", "broken", "rejected")


class RequestSpan:
    def __init__(self, span, request_id: str) -> None:
        self.span, self.request_id = span, request_id
        self.submitted = time.monotonic()
        self.admitted_at: float | None = None
        self.first_token_at: float | None = None
        self.decode_steps = self.tokens = 0

    @classmethod
    def of_submit(cls, traceparent: object, request_id: str, prompt_tokens: int,
                  max_tokens: int) -> RequestSpan | None:
        """The span of a request whose ``submit`` header carries ``traceparent``; None when this
        process does not trace, the header has none (or one that does not parse) or it is not sampled."""
        head_tracer = tracer(__name__)
        parent = parent_context(traceparent) if head_tracer is not None else None
        if parent is None:
            return None
        span = head_tracer.start_span("head.request", context=parent, kind=SpanKind.SERVER, attributes={
            "motley.request_id": request_id, "motley.prompt_tokens": prompt_tokens,
            "motley.max_tokens": max_tokens})
        return cls(span, request_id) if span.is_recording() else None

    def admitted(self, cached_tokens: int) -> None:
        self.admitted_at = time.monotonic()
        self.span.set_attribute("motley.queue_wait_s", round(self.admitted_at - self.submitted, 6))
        self.span.add_event("admitted", {"motley.cached_tokens": cached_tokens})

    def step(self, micro_batch: int, tokens: int, prefill: bool) -> None:
        """The request's part of a micro-batch the head starts: ``tokens`` of its input."""
        if prefill:
            self.span.add_event("prefill", {"motley.micro_batch": micro_batch, "motley.tokens": tokens})
        else:
            self.decode_steps += 1

    def token(self) -> None:
        self.tokens += 1
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
            self.span.add_event("first_token")

    def end(self, outcome: str) -> None:
        """``outcome``: the finish reason (stop, length), or why it left without one: ``removed``
        (cancelled or past its deadline, not an error here), ``failed``, ``broken``, ``rejected``."""
        now, span = time.monotonic(), self.span
        if self.admitted_at is not None and self.first_token_at is not None:
            span.set_attribute("motley.prefill_s", round(self.first_token_at - self.admitted_at, 6))
            span.set_attribute("motley.decode_s", round(now - self.first_token_at, 6))
        span.set_attributes({"motley.completion_tokens": self.tokens,
                             "motley.decode_steps": self.decode_steps, "motley.outcome": outcome})
        if outcome in _FAILURES:
            span.set_status(Status(StatusCode.ERROR, outcome))
        span.end()
