"""A request's spans as motley's processes make them, from the real OpenTelemetry SDK: the gateway's
``gateway.request`` with its ``gateway.admission``, and from a stage process (another resource) the
head's ``head.request`` and the next stage's ``stage.request``."""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode


@dataclass
class RequestTrace:
    trace_id: str
    gateway: list[ReadableSpan]
    stage: list[ReadableSpan]

    def stage_body(self) -> bytes:
        """The stage's spans as its OTLP/HTTP exporter posts them."""
        return encode_spans(self.stage).SerializeToString()


def _tracer(resource: dict) -> tuple[trace.Tracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("tests"), exporter


def request_trace(failed: bool = False) -> RequestTrace:
    gateway, gateway_spans = _tracer({"motley.role": "gateway", "motley.node": "cp"})
    stage, stage_spans = _tracer({"motley.role": "stage", "motley.stage": "p0/0", "motley.device": "cpu"})
    outcome = "failed:broken" if failed else "completed"
    with gateway.start_as_current_span("gateway.request", attributes={"motley.outcome": outcome}) as request:
        with gateway.start_as_current_span("gateway.admission", attributes={"motley.model": "demo"}):
            pass
        head = stage.start_span("head.request", context=trace.set_span_in_context(request),
                                attributes={"motley.prompt_tokens": 5})
        head.add_event("first_token")
        stage.start_span("stage.request", context=trace.set_span_in_context(head),
                         attributes={"motley.stage_index": 1}).end()
        if failed:
            head.set_status(Status(StatusCode.ERROR, "broken"))
        head.end()
    return RequestTrace(trace.format_trace_id(request.get_span_context().trace_id),
                        list(gateway_spans.get_finished_spans()), list(stage_spans.get_finished_spans()))
