"""Traces through real stage processes: the test plays the gateway's span, sends its ``traceparent``
in the submit, and a real OTLP/HTTP receiver gets the head's span of the request as its child."""

from __future__ import annotations

import pytest
from opentelemetry.trace import SpanKind

from contracts.tracing import trace_id_hex, traceparent_of, tracer, tracing_setup, tracing_shutdown
from controlplane.gateway.serving.pipeline_client import PipelineClient
from tests.support.otlp_receiver import OtlpReceiver

from .harness import TOKEN, wait_healthy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # real stage processes


@pytest.fixture
def receiver(monkeypatch):
    with OtlpReceiver() as receiver:
        for name, value in receiver.env().items():
            monkeypatch.setenv(name, value)
        yield receiver
    tracing_shutdown()


async def test_the_heads_span_is_a_child_of_the_callers(receiver, start_pipeline):
    pipeline = start_pipeline(3)
    assert tracing_setup("gateway", node="test")
    async with PipelineClient(pipeline.head, TOKEN, "p0") as client:
        assert (await wait_healthy(client))["ok"]
        span = tracer("tests").start_span("gateway.request", kind=SpanKind.SERVER)
        traced = [e.token_id async for e in client.submit([1, 2, 3, 4, 5], max_tokens=6, request_id="traced",
                                                          traceparent=traceparent_of(span))]
        span.end()
        unsampled = f"00-{trace_id_hex(span)}-{'1' * 16}-00"
        for request_id, parent in (("untraced", None), ("unsampled", unsampled), ("garbled", "00-zz")):
            tokens = [e.token_id async for e in client.submit([1, 2, 3, 4, 5], max_tokens=6,
                                                              request_id=request_id, traceparent=parent)]
            assert tokens == traced
    tracing_shutdown()  # the caller's span exported

    spans = receiver.wait(lambda spans: {"gateway.request", "head.request"} <= {s.name for s in spans})
    pipeline.stop()  # every stage exports whatever else it holds as it exits
    spans = list(receiver.spans)
    caller = next(s for s in spans if s.name == "gateway.request")
    heads = [s for s in spans if s.name == "head.request"]
    assert len(heads) == 1, "only the sampled request with a valid traceparent is traced"
    head = heads[0]
    assert (head.trace_id, head.parent_span_id) == (caller.trace_id, caller.span_id)
    assert caller.parent_span_id == "" and caller.resource["motley.role"] == "gateway"
    assert head.resource["motley.role"] == "stage" and head.resource["motley.stage"] == "p0/0"
    assert head.resource["service.name"] == "motley-test" and head.resource["motley.device"] == "cpu"
    attributes = head.attributes
    assert attributes["motley.request_id"] == "traced" and attributes["motley.outcome"] == "length"
    assert (attributes["motley.prompt_tokens"], attributes["motley.max_tokens"]) == (5, 6)
    assert attributes["motley.completion_tokens"] == 6 and attributes["motley.decode_steps"] == 5
    assert all(attributes[f"motley.{phase}_s"] >= 0 for phase in ("queue_wait", "prefill", "decode"))
    names = [name for name, _ in head.events]
    assert names == ["admitted", "prefill", "first_token"]
    assert head.events[1][1]["motley.tokens"] == 5
    assert caller.start_ns <= head.start_ns <= head.end_ns <= caller.end_ns
    assert all(h.get("x-test-tenant") == "motley" for h in receiver.headers)  # OTEL_EXPORTER_OTLP_HEADERS

    # Each stage after the head: one span of the traced request, a child of the head's, its steps counted
    # (the prefill and the 5 decode steps), ended when the head freed the sequence.
    stages = sorted((s for s in spans if s.name == "stage.request"),
                    key=lambda s: s.attributes["motley.stage_index"])
    assert [s.attributes["motley.stage_index"] for s in stages] == [1, 2]
    for stage in stages:
        assert (stage.trace_id, stage.parent_span_id) == (head.trace_id, head.span_id)
        assert stage.attributes["motley.steps"] == 6 and stage.attributes["motley.outcome"] == "freed"
        assert stage.attributes["motley.compute_s"] > 0 and stage.attributes["motley.send_s"] >= 0
        assert stage.resource["motley.stage"] == f"p0/{stage.attributes['motley.stage_index']}"
        assert head.start_ns <= stage.start_ns <= stage.end_ns
