"""A request whose pipeline breaks is resumed on a routable replica with its prompt plus the tokens so
far, and its client's stream simply continues; bounded by ``MAX_MIGRATIONS``. Against stand-in
replicas (fakes.py: a resumed prompt gets the rest of the scripted output, as a seeded pipeline
would); test_migration_live.py does it with real pipelines."""

from __future__ import annotations

import pytest
from django.test import AsyncClient

from controlplane.gateway.openai.tokenization import ModelTokenizer
from controlplane.gateway.serving.decision_log import recorder
from controlplane.gateway.serving.runtime import gateway_stats
from tests.gateway.fakes import Script
from tests.gateway.test_views import TEXT, post, sse_events, tokens
from tests.gateway.test_waiting import waits  # noqa: F401  (fixture)

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_broken_pipeline_mid_stream_continues_on_the_other_replica(fake_pipeline, api_key,
                                                                           demo_model):
    output = tokens(demo_model)
    # r1 looks busier (another gateway's queue), so r0 is chosen; r0 breaks after 3 tokens.
    fake = fake_pipeline({"r0": Script(tokens=output, break_after=[3]),
                          "r1": Script(tokens=output, queue_depth=4)})
    body = {"model": "demo", "prompt": "The quick brown fox", "max_tokens": 50, "temperature": 0.8,
            "seed": 11, "stream": True, "stream_options": {"include_usage": True}}
    response = await post(AsyncClient(), "/v1/completions", body, api_key)
    assert response.status_code == 200
    events = await sse_events(response)
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == TEXT
    assert len({e["id"] for e in events}) == 1  # one response id throughout
    prompt = tokens(demo_model, "The quick brown fox")
    assert events[-1]["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(output),
                                   "total_tokens": len(prompt) + len(output)}
    first, resumed = fake.submitted
    assert (first["pipeline_id"], resumed["pipeline_id"]) == ("r0", "r1")
    assert resumed["prompt_ids"] == prompt + output[:3] and resumed["max_tokens"] == 50 - 3
    assert resumed["request_id"] == first["request_id"] and resumed["params"] == first["params"]
    assert resumed["params"].seed == 11
    (record,) = [r for r in recorder.recent if r.replica]
    assert (record.outcome, record.migrations, record.replicas) == ("completed", 1, ["r0", "r1"])
    assert record.completion_tokens == len(output)
    stats = await gateway_stats()
    assert stats["router"]["migrated"] == 1
    assert not stats["models"]["demo"]["replicas"]["r0"]["router"]["in_flight"]  # the booking moved…
    assert not stats["models"]["demo"]["replicas"]["r1"]["router"]["in_flight"]  # …and ended


async def test_a_break_with_no_other_replica_waits_for_one_and_resumes(fake_pipeline, api_key, demo_model):
    output = tokens(demo_model)
    # before its first token, then after 5
    fake = fake_pipeline({"r0": Script(tokens=output, break_after=[0, 5])})
    body = {"model": "demo", "prompt": "x", "max_tokens": 50, "temperature": 0}
    response = await post(AsyncClient(), "/v1/completions", body, api_key)
    assert response.status_code == 200, response.content
    data = response.json()
    assert data["choices"][0]["text"] == TEXT and data["usage"]["completion_tokens"] == len(output)
    assert [len(s["prompt_ids"]) - len(fake.submitted[0]["prompt_ids"]) for s in fake.submitted] == [0, 0, 5]


async def test_a_replica_that_refuses_the_resumption_is_left_out_and_the_request_waits(
    fake_pipeline, api_key, demo_model
):
    from contracts.pipeline_errors import RequestRejected

    output = tokens(demo_model)
    fake = fake_pipeline({"r0": Script(tokens=output, break_after=[3]),
                          "r1": Script(tokens=output, queue_depth=4,
                                       error=RequestRejected("KV space is full"))})
    response = await post(AsyncClient(), "/v1/completions",
                          {"model": "demo", "prompt": "x", "max_tokens": 50},
                          api_key)
    assert response.status_code == 200, response.content
    assert response.json()["choices"][0]["text"] == TEXT
    # r0 broke (unroutable until its head answers again), r1 refused: left out, the request waited for r0.
    assert [s["pipeline_id"] for s in fake.submitted] == ["r0", "r1", "r0"]
    (record,) = [r for r in recorder.recent if r.replica]
    assert record.migrations == 2 and record.replicas == ["r0", "r1", "r0"]


async def test_more_breaks_than_max_migrations_end_the_stream_with_a_clear_error(
    fake_pipeline, api_key, demo_model, waits  # noqa: F811
):
    output = tokens(demo_model)
    fake = fake_pipeline({"r0": Script(tokens=output, break_after=[2] * 10)})
    waits(MAX_MIGRATIONS=2)
    body = {"model": "demo", "prompt": "x", "max_tokens": 50, "stream": True}
    response = await post(AsyncClient(), "/v1/completions", body, api_key)
    assert response.status_code == 200
    events = await sse_events(response)
    text = "".join(e["choices"][0]["text"] for e in events if "choices" in e)
    error = events[-1]["error"]
    assert error["code"] == "service_unavailable"
    assert "already been resumed 2 times, the most allowed (MAX_MIGRATIONS)" in error["message"]
    assert len(fake.submitted) == 3
    decoder = ModelTokenizer.load(demo_model).tokenizer
    assert TEXT.startswith(text) and decoder.decode(output[:6]).startswith(text)  # 6 tokens, nothing twice
    (record,) = [r for r in recorder.recent if r.replica]
    assert record.outcome == "failed:broken" and record.migrations == 2


async def test_migrations_are_counted_in_the_metrics(fake_pipeline, api_key, demo_model):
    from tests.observability.conftest import Scrape

    output = tokens(demo_model)
    fake_pipeline({"r0": Script(tokens=output, break_after=[3]), "r1": Script(tokens=output, queue_depth=4)})
    response = await post(AsyncClient(), "/v1/completions",
                          {"model": "demo", "prompt": "x", "max_tokens": 50},
                          api_key)
    assert response.status_code == 200
    scrape = Scrape((await AsyncClient().get("/metrics")).content.decode())
    assert scrape.value("motley_requests_migrated_total", model_name="demo", replica="r0") >= 1
    for replica in ("r0", "r1"):  # the request's gauges moved with it and are back to none
        assert scrape.value("vllm:num_requests_running", 0.0, model_name="demo", replica=replica) == 0
        assert scrape.value("vllm:num_requests_waiting", 0.0, model_name="demo", replica=replica) == 0
    assert scrape.value("vllm:num_requests_running", model_name="demo", replica="r1") == 0  # it ran there
