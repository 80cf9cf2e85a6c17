"""The control plane's sampler and Django exclusions (controlplane/gateway/traces/instrumentation.py):
what a trace may start at, and which URLs Django's instrumentation leaves alone. The spans themselves,
through a real daphne, worker and broker: tests/e2e/test_deploy.py."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Decision
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.util.http import parse_excluded_urls

from contracts.tracing import django_excluded_urls
from controlplane.gateway.traces.instrumentation import EXCLUDED_URLS, RequestsOnly

SAMPLED_PARENT = trace.set_span_in_context(NonRecordingSpan(SpanContext(
    0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, is_remote=True, trace_flags=TraceFlags(1))))


@pytest.mark.parametrize(("kind", "attributes", "parent", "sampled"), [
    (SpanKind.CONSUMER, {}, None, False),  # a beat task's run
    (SpanKind.PRODUCER, {}, None, False),  # a send outside any request
    (SpanKind.SERVER, {"http.method": "GET"}, None, False),  # the dashboard's polling
    (SpanKind.SERVER, {"http.request.method": "HEAD"}, None, False),
    (SpanKind.SERVER, {"http.method": "POST"}, None, True),  # an apply
    (SpanKind.SERVER, {"http.method": "GET"}, SAMPLED_PARENT, True),  # a client's sampled traceparent
    (SpanKind.CONSUMER, {}, SAMPLED_PARENT, True),  # a task a traced request sent
    (SpanKind.INTERNAL, {}, None, True),  # gateway.request without a traceparent
])
def test_no_trace_starts_at_a_celery_span_or_a_read(kind, attributes, parent, sampled):
    result = RequestsOnly(ALWAYS_ON).should_sample(parent, 1, "span", kind, attributes)
    assert (result.decision is Decision.RECORD_AND_SAMPLE) is sampled


@pytest.mark.parametrize(("path", "excluded"), [
    ("/v1/chat/completions", True), ("/health", True), ("/tokenize", True), ("/metrics", True),
    ("/api/v1/traces/otlp/", True), ("/api/v1/traces/", True),
    ("/api/v1/deployments/", False), ("/api/v1/deployments/3/apply/", False), ("/deployments/", False),
    ("/admin/v1/", False), ("/healthy", False),
])
def test_django_leaves_the_gateways_routes_the_scrape_and_the_trace_routes(path, excluded, monkeypatch):
    monkeypatch.setenv("OTEL_PYTHON_DJANGO_EXCLUDED_URLS", "/admin/")
    urls = parse_excluded_urls(django_excluded_urls(EXCLUDED_URLS))
    assert urls.url_disabled(f"http://cp.example:8000{path}?") is (excluded or path.startswith("/admin/"))
