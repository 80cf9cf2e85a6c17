"""The gateway's spans against stand-in replicas: the head gets the request span's ``traceparent``, a
refusal ends its span in error, a migration is an event with a second routing span, a wait for a
replica (a handover's pause) an event with its length and reason, and tracing off
makes no span, header or ``traceparent`` (tests/gateway/test_live.py follows one through a real
pipeline)."""

from __future__ import annotations

import asyncio

import pytest
from django.test import AsyncClient

from contracts.tracing import tracing_setup, tracing_shutdown
from controlplane.gateway.serving.runtime import gateway
from tests.gateway.fakes import Script
from tests.gateway.test_views import auth, post, tokens
from tests.gateway.test_waiting import until
from tests.support.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.django_db(transaction=True)
TRACE, PARENT = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"


@pytest.fixture
def traces(monkeypatch):
    with OtlpReceiver() as receiver:
        for name, value in receiver.env().items():
            monkeypatch.setenv(name, value)
        assert tracing_setup("gateway")
        yield receiver
        tracing_shutdown()


def traced(key: str) -> dict:
    return {"headers": {**auth(key)["headers"], "traceparent": f"00-{TRACE}-{PARENT}-01"}}


async def test_the_head_gets_the_request_spans_traceparent(traces, fake_pipeline, api_key, demo_model):
    fake = fake_pipeline({"r0": Script(tokens=tokens(demo_model, "Hi"))})
    response = await AsyncClient().post("/v1/completions", {"model": "demo", "prompt": "x", "max_tokens": 2},
                                        content_type="application/json", **traced(api_key))
    assert response.status_code == 200 and response["X-Trace-Id"] == TRACE
    spans = traces.wait(lambda spans: any(s.name == "gateway.request" for s in spans))
    request = next(s for s in spans if s.name == "gateway.request")
    assert (request.trace_id, request.parent_span_id) == (TRACE, PARENT)
    assert fake.submitted[0]["traceparent"] == f"00-{TRACE}-{request.span_id}-01"
    assert request.attributes["motley.outcome"] == "completed" and request.attributes["http.route"]
    assert request.attributes["motley.completion_tokens"] == 2 and request.status_code == 0
    admission = next(s for s in spans if s.name == "gateway.admission")
    assert admission.attributes["motley.max_tokens"] == 2 and admission.parent_span_id == request.span_id


async def test_a_refused_request_ends_its_span_in_error(traces, fake_pipeline, api_key):
    fake_pipeline({"r0": Script()})
    response = await post(AsyncClient(), "/v1/completions", {"model": "nope", "prompt": "x"}, api_key)
    assert response.status_code == 404
    spans = traces.wait(lambda spans: any(s.name == "gateway.request" for s in spans))
    assert spans[0].attributes["motley.outcome"] == "refused:404" and spans[0].status_code == 2
    assert response["X-Trace-Id"] == spans[0].trace_id


async def test_a_migrated_request_is_routed_twice_in_one_trace(traces, fake_pipeline, api_key, demo_model):
    ids = tokens(demo_model, "Hello there")
    fake_pipeline({"r0": Script(tokens=ids, break_after=[2]), "r1": Script(tokens=ids)})
    response = await post(AsyncClient(), "/v1/completions",
                          {"model": "demo", "prompt": "x", "max_tokens": len(ids)}, api_key)
    assert response.status_code == 200
    spans = traces.wait(lambda spans: any(s.name == "gateway.request" for s in spans))
    request = next(s for s in spans if s.name == "gateway.request")
    routes = [s for s in spans if s.name == "gateway.route"]
    assert [r.attributes["motley.route.resuming"] for r in routes] == [False, True]
    assert ("migrated", {"motley.failure": "broken"}) in request.events


async def test_tracing_off_makes_no_span_header_or_traceparent(fake_pipeline, api_key, demo_model):
    fake = fake_pipeline({"r0": Script(tokens=tokens(demo_model, "Hi"))})
    response = await AsyncClient().post("/v1/completions", {"model": "demo", "prompt": "x", "max_tokens": 2},
                                        content_type="application/json", **traced(api_key))
    assert response.status_code == 200 and "X-Trace-Id" not in response
    assert fake.submitted[0]["traceparent"] is None


async def test_a_request_that_waited_for_its_replica_has_the_pause_and_its_reason(
        traces, fake_pipeline, api_key, demo_model, settings):
    fake = fake_pipeline({"r0": Script(tokens=tokens(demo_model, "Hi"), healthy=False)})
    fake.reason = "deployment chat is handing over to plan revision 3"  # as an in-place handover's pause
    settings.MOTLEY_GATEWAY = {**settings.MOTLEY_GATEWAY, "WAIT_S": 10}
    waiting = asyncio.ensure_future(post(AsyncClient(), "/v1/completions",
                                         {"model": "demo", "prompt": "x", "max_tokens": 2}, api_key))
    await until(lambda: len(gateway().waiting.queue("demo")) == 1)
    await asyncio.sleep(0.3)
    fake.scripts["r0"].healthy = True
    assert (await waiting).status_code == 200
    spans = traces.wait(lambda spans: any(s.name == "gateway.request" for s in spans))
    request = next(s for s in spans if s.name == "gateway.request")
    (paused,) = [attributes for name, attributes in request.events if name == "paused"]
    assert paused["motley.pause_s"] >= 0.3
    assert paused["motley.reason"].startswith("deployment chat is handing over to plan revision 3")
    route = next(s for s in spans if s.name == "gateway.route")
    assert route.attributes["motley.route.waited_s"] == paused["motley.pause_s"]
    assert request.start_ns <= route.start_ns  # the pause is dated at its start, within the route's span


async def test_a_request_the_sampler_leaves_out_is_named_but_records_nothing(
        monkeypatch, fake_pipeline, api_key, demo_model):
    with OtlpReceiver() as receiver:
        for name, value in {**receiver.env(), "OTEL_TRACES_SAMPLER": "traceidratio",
                            "OTEL_TRACES_SAMPLER_ARG": "0"}.items():
            monkeypatch.setenv(name, value)
        assert tracing_setup("gateway")
        fake = fake_pipeline({"r0": Script(tokens=tokens(demo_model, "Hi"))})
        response = await post(AsyncClient(), "/v1/completions",
                              {"model": "demo", "prompt": "x", "max_tokens": 2}, api_key)
        tracing_shutdown()  # exports whatever was recorded
        assert response.status_code == 200 and len(response["X-Trace-Id"]) == 32
        assert fake.submitted[0]["traceparent"] is None and receiver.spans == []
