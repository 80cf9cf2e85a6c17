"""The gateway's span of one OpenAI request (``gateway.request``), the root of its trace in motley
(docs/observability.md, "Traces").

It starts as the view takes the request, as a child of the client's W3C ``traceparent`` where one
came, and ends with the response's last token or its error. Its children: ``gateway.admission`` (the
key's limits and quota) and ``gateway.route`` (the router's placement, its wait for a routable
replica included, the decision's inputs as attributes; one more per migration). The head's
``head.request`` is a child of the request span: its ``traceparent`` goes in the submit frame. The
response names the trace in ``X-Trace-Id``. With tracing off (contracts/tracing.py) :func:`request_span`
gives :data:`UNTRACED`, whose every method does nothing; a request the sampler leaves out gets an
:class:`Unsampled`, which does nothing either but name its trace.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

from django.http import HttpResponse
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from contracts.tracing import parent_context, trace_id_hex, traceparent_of, tracer
from controlplane.gateway.routing import Decision

TRACE_HEADER = "X-Trace-Id"


class RequestSpan:
    def __init__(self, span: Any, tracer_: Any) -> None:
        self.span, self._tracer, self._ended = span, tracer_, False
        self.traceparent = traceparent_of(span)  # for the head's span; None when not sampled

    @contextmanager
    def child(self, name: str, **attributes: Any) -> Iterator[Any]:
        """A span of a phase of the request (``gateway.admission``, ``gateway.route``)."""
        context = trace.set_span_in_context(self.span)
        with self._tracer.start_as_current_span(name, context=context, attributes=attributes) as span:
            yield span

    def routed(self, span: Any, decision: Decision, waited_s: float, resuming: bool) -> None:
        """The router's decision on ``span`` (a ``gateway.route``): the replica, its estimates, and
        what the router saw of every replica (``motley.route.inputs``, JSON)."""
        span.set_attributes({
            "motley.replica": decision.replica.replica_id, "motley.route.strategy": decision.strategy,
            "motley.route.candidates": decision.candidates, "motley.route.resuming": resuming,
            "motley.route.waited_s": round(waited_s, 6), "motley.route.cached_tokens": decision.cached_tokens,
            "motley.route.estimated_ttft_s": decision.estimated_ttft_s,
            "motley.route.estimated_finish_s": decision.estimated_finish_s,
            "motley.route.inputs": json.dumps([asdict(i) for i in decision.inputs], separators=(",", ":")),
        })

    def first_token(self, ttft_s: float) -> None:
        self.span.set_attribute("motley.ttft_s", round(ttft_s, 6))
        self.span.add_event("first_token")

    def migrated(self, kind: str) -> None:
        self.span.add_event("migrated", {"motley.failure": kind})

    def paused(self, waited_s: float, reason: str) -> None:
        """The request waited ``waited_s`` for a routable replica (a handover's pause, a re-plan, every
        replica busy): an event at the wait's start, with its length and the model's reason then."""
        start_ns = time.time_ns() - int(waited_s * 1e9)
        self.span.add_event("paused", {"motley.pause_s": round(waited_s, 6), "motley.reason": reason},
                            timestamp=start_ns)

    def end(self, outcome: str, completion_tokens: int) -> None:
        """``outcome``: completed, cancelled, or ``failed:<kind>`` / ``refused:<status>``; the first
        end counts (the generation ends it, and the view again where an error came through it)."""
        if self._ended:
            return
        self._ended = True
        self.span.set_attributes({"motley.outcome": outcome, "motley.completion_tokens": completion_tokens})
        if outcome.startswith(("failed", "refused")):
            self.span.set_status(Status(StatusCode.ERROR, outcome))
        self.span.end()

    def name_trace(self, response: HttpResponse) -> HttpResponse:
        response[TRACE_HEADER] = trace_id_hex(self.span)
        return response


class Untraced(RequestSpan):
    """Tracing off: no span, nothing recorded, no header."""

    def __init__(self) -> None:
        self.traceparent = None

    @contextmanager
    def child(self, name: str, **attributes: Any) -> Iterator[Any]:
        yield None

    def routed(self, span: Any, decision: Decision, waited_s: float, resuming: bool) -> None:
        pass

    def first_token(self, ttft_s: float) -> None:
        pass

    def migrated(self, kind: str) -> None:
        pass

    def paused(self, waited_s: float, reason: str) -> None:
        pass

    def end(self, outcome: str, completion_tokens: int) -> None:
        pass

    def name_trace(self, response: HttpResponse) -> HttpResponse:
        return response


UNTRACED = Untraced()


class Unsampled(Untraced):
    """Tracing on, the request left out by the sampler: nothing recorded (no attributes computed: the
    routing inputs' JSON is a cost every unsampled request would pay), its trace id still named."""

    def __init__(self, span: Any) -> None:
        super().__init__()
        self.span = span

    def name_trace(self, response: HttpResponse) -> HttpResponse:
        response[TRACE_HEADER] = trace_id_hex(self.span)
        return response


def request_span(headers: Any, *, path: str) -> RequestSpan:
    """The span of a request with these HTTP ``headers`` (its ``traceparent`` honoured)."""
    gateway_tracer = tracer(__name__)
    if gateway_tracer is None:
        return UNTRACED
    span = gateway_tracer.start_span("gateway.request", context=parent_context(headers.get("traceparent")),
                                     kind=SpanKind.SERVER, attributes={"http.route": path})
    return RequestSpan(span, gateway_tracer) if span.is_recording() else Unsampled(span)
