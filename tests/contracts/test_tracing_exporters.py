"""Where a process's spans go (contracts/tracing.py): ``OTEL_TRACES_EXPORTER`` naming ``otlp``,
``motley`` or both, and whether the process traces at all when none of its spans would go anywhere."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from contracts.tracing import (
    TRACE_SINK_ENV,
    sink_authorization,
    sink_credentials,
    tracer,
    tracing_setup,
    tracing_shutdown,
)


@pytest.fixture(autouse=True)
def _shut():
    yield
    tracing_shutdown()


@pytest.mark.parametrize("exporters", ["none", "", "jaeger", "console"])
def test_nothing_traces_without_otlp_or_motley(monkeypatch, exporters):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", exporters)
    assert not tracing_setup("gateway", store=InMemorySpanExporter()) and tracer("t") is None


def test_motley_goes_to_the_store_it_is_given(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "motley")
    store = InMemorySpanExporter()
    assert tracing_setup("gateway", store=store, node="cp")
    tracer("t").start_span("gateway.request").end()
    tracing_shutdown()
    (span,) = store.get_finished_spans()
    assert (span.name, span.resource.attributes["motley.role"], span.resource.attributes["motley.node"]) == (
        "gateway.request", "gateway", "cp")


def test_motley_with_nowhere_to_send_does_not_trace(monkeypatch):
    """An agent (no store, no pipeline), or a stage whose agent named no control plane."""
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "motley")
    monkeypatch.delenv(TRACE_SINK_ENV, raising=False)
    assert not tracing_setup("agent", node="n0") and tracer("t") is None
    assert not tracing_setup("stage", pipeline=("p0", "secret")) and tracer("t") is None
    monkeypatch.setenv(TRACE_SINK_ENV, "http://127.0.0.1:9")
    assert tracing_setup("stage", pipeline=("p0", "secret")) and tracer("t") is not None
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp,motley")
    assert tracing_setup("agent", node="n0")  # to the collector


def test_a_pipelines_signature_reads_back_and_nothing_else_does():
    assert sink_credentials(sink_authorization("d3-r1", "tok:en")) == ("d3-r1", "tok:en")
    for header in ("", "Pipeline", "Pipeline d3-r1", "Pipeline :x", "Bearer d3-r1:x", "Node 3:x"):
        assert sink_credentials(header) is None
