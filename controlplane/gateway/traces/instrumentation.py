"""The control plane's own processes traced with the maintained instrumentation (docs/observability.md,
"Traces"): Django's views in the web process, Celery's task sends there and its tasks in the worker.

Only while tracing is on (``contracts.tracing``): off, nothing is instrumented and no middleware is
added, so it costs nothing. An API request that sends a task (an apply enqueues a reconcile) and the
task run by the worker are one trace: the Celery instrumentation carries the request's context in the
message's headers, which every broker keeps (the embedded filesystem broker stores them in the
message file).

The store behind the dashboard's request timeline keeps what a request began, not the control
plane's routine, so the sampler leaves out (whatever ``OTEL_TRACES_SAMPLER`` says) a trace that would
start at a Celery span (a beat task's run, a send outside any request: liveness, reconcile, calibration
and rebalance every few seconds) or at a read (``GET``/``HEAD``/``OPTIONS``: the dashboard's pages
and their polling). A traced request's tasks still are traced: their spans have a parent. And Django
makes no span for the routes below: the OpenAI and vLLM routes, which the gateway traces itself
(``gateway.request`` honours a client's ``traceparent`` as its parent, so a Django span would be a
second root beside it), the Prometheus scrape, and the trace routes (the timeline reading the store,
stages posting their spans: a span per post would feed itself).
"""

from __future__ import annotations

import platform
from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, get_current_span
from opentelemetry.util.types import Attributes

from contracts.tracing import django_excluded_urls, tracer_provider, tracing_enabled, tracing_setup

# Regular expressions searched in a request's absolute URL (``OTEL_PYTHON_DJANGO_EXCLUDED_URLS``'s
# form; the operator's own, if set, are added).
EXCLUDED_URLS = (r"^https?://[^/]+/(v1/|health\b|tokenize\b|detokenize\b|metrics\b|api/v1/traces/)",)
_READS = frozenset({"GET", "HEAD", "OPTIONS"})
_CELERY_KINDS = (SpanKind.PRODUCER, SpanKind.CONSUMER)


class RequestsOnly(Sampler):
    """``sampler``'s decision, but never one to start a trace at a Celery span or a read."""

    def __init__(self, sampler: Sampler) -> None:
        self._sampler = sampler

    def should_sample(self, parent_context: Context | None, trace_id: int, name: str,
                      kind: SpanKind | None = None, attributes: Attributes = None,
                      links: Sequence[Link] | None = None, trace_state=None) -> SamplingResult:
        if not get_current_span(parent_context).get_span_context().is_valid:
            method = (attributes or {}).get("http.request.method") or (attributes or {}).get("http.method")
            if kind in _CELERY_KINDS or (kind is SpanKind.SERVER and method in _READS):
                return SamplingResult(Decision.DROP)
        return self._sampler.should_sample(parent_context, trace_id, name, kind, attributes, links,
                                           trace_state)

    def get_description(self) -> str:
        return f"RequestsOnly{{{self._sampler.get_description()}}}"


def control_plane_tracing(role: str, *, django: bool) -> bool:
    """Trace this control-plane process if tracing is on (its spans into the store too, with
    ``motley``): Celery's sends and runs, and with ``django`` the views; says whether it traces. The
    web process calls it before Django's handler loads its middleware, the worker in each pool
    process (a span processor's thread does not cross a fork)."""
    if not tracing_enabled():
        return False
    from controlplane.gateway.traces.store import StoreExporter

    tracing_setup(role, store=StoreExporter(), sampler=RequestsOnly, node=platform.node())  # has a target
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    CeleryInstrumentor().instrument(tracer_provider=tracer_provider())
    if django:
        from opentelemetry.instrumentation.django import DjangoInstrumentor

        DjangoInstrumentor().instrument(tracer_provider=tracer_provider(),
                                        excluded_urls=django_excluded_urls(EXCLUDED_URLS))
    return True
