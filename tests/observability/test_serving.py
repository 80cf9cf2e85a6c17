"""vLLM's request metrics after real gateway requests (the /v1/ views against stand-in replicas): tokens,
latency histograms, requests waiting and running, router decisions by reason, per model and replica."""

from __future__ import annotations

import asyncio
import json

import pytest
from django.test import AsyncClient

from controlplane.gateway.openai.tokenization import ModelTokenizer
from tests.gateway.fakes import Script
from tests.observability.conftest import Scrape, parse

pytestmark = pytest.mark.django_db(transaction=True)

TEXT = "Héllo wörld — 世界 🎉 ok, and some more words to have tokens"


async def scrape() -> Scrape:
    response = await AsyncClient().get("/metrics")
    assert response.status_code == 200, response.content
    return parse(response.content.decode())


async def post(body: dict, key: str):
    return await AsyncClient().post("/v1/completions", json.dumps(body), content_type="application/json",
                                    headers={"Authorization": f"Bearer {key}"})


def delta(after: Scrape, before: Scrape, name: str, **labels) -> float:
    return after.value(name, 0.0, **labels) - before.value(name, 0.0, **labels)


async def test_requests_count_their_tokens_and_latencies_per_replica(fake_pipeline, api_key, demo_model):
    ids = ModelTokenizer.load(demo_model).encode_prompt(TEXT)
    fake = fake_pipeline({"r0": Script(tokens=ids, delay_s=0.01), "r1": Script(tokens=ids, delay_s=0.01)})
    before = await scrape()
    served = []
    for max_tokens, prompt in [(3, "one"), (5, "two words"), (7, "three more words"), (4, "a fourth")]:
        response = await post({"model": "demo", "prompt": prompt, "max_tokens": max_tokens}, api_key)
        assert response.status_code == 200, response.content
        served.append(response.json()["usage"])
    streamed = await post({"model": "demo", "prompt": "streamed", "max_tokens": 6, "stream": True,
                           "stream_options": {"include_usage": True}}, api_key)
    chunks = b"".join([c async for c in streamed.streaming_content]).decode().split("\n\n")
    served.append(json.loads(next(c for c in chunks if '"usage"' in c)[6:])["usage"])
    replicas = [s["pipeline_id"] for s in fake.submitted]
    after = await scrape()

    for replica in ("r0", "r1"):
        mine = [u for u, r in zip(served, replicas, strict=True) if r == replica]
        labels = {"model_name": "demo", "replica": replica}
        assert delta(after, before, "vllm:prompt_tokens_total", **labels) == sum(
            u["prompt_tokens"] for u in mine)
        assert delta(after, before, "vllm:generation_tokens_total", **labels) == sum(
            u["completion_tokens"] for u in mine)
        assert delta(after, before, "vllm:time_to_first_token_seconds_count", **labels) == len(mine)
        assert delta(after, before, "vllm:e2e_request_latency_seconds_count", **labels) == len(mine)
        assert delta(after, before, "vllm:inter_token_latency_seconds_count", **labels) == sum(
            u["completion_tokens"] - 1 for u in mine)
        assert delta(after, before, "motley_requests_total", outcome="completed", **labels) == len(mine)
        assert after.value("vllm:num_requests_running", 0.0, **labels) == 0
        assert after.value("vllm:num_requests_waiting", 0.0, **labels) == 0
    labels = {"model_name": "demo"}
    # Each token came 10 ms after the previous: real latencies, in the buckets that hold them.
    ttft_sum = delta(after, before, "vllm:time_to_first_token_seconds_sum", replica=replicas[0], **labels)
    assert ttft_sum >= 0.01 * replicas.count(replicas[0])
    e2e = delta(after, before, "vllm:e2e_request_latency_seconds_sum", replica=replicas[0], **labels)
    assert e2e > ttft_sum
    itl = [s for s in after.find("vllm:inter_token_latency_seconds_bucket", replica=replicas[0], **labels)]
    assert {s.labels["le"] for s in itl} >= {"0.01", "0.025", "+Inf"}
    routed = sum(delta(after, before, "motley_router_decisions_total", replica=r, reason="routed",
                       strategy="cost_aware", **labels) for r in ("r0", "r1"))
    assert routed == len(served)


async def test_waiting_then_running_while_a_request_is_served(fake_pipeline, api_key, demo_model):
    ids = ModelTokenizer.load(demo_model).encode_prompt(TEXT)
    fake_pipeline({"r0": Script(tokens=ids, delay_s=0.3)})
    labels = {"model_name": "demo", "replica": "r0"}
    before = await scrape()
    body = {"model": "demo", "prompt": "x", "max_tokens": 3, "stream": True}
    pending = asyncio.create_task(post(body, api_key))
    await asyncio.sleep(0.15)  # routed, its first token 0.3 s away
    waiting = await scrape()
    assert delta(waiting, before, "vllm:num_requests_waiting", **labels) == 1
    assert delta(waiting, before, "vllm:num_requests_running", **labels) == 0
    response = await pending  # the stream starts with its first token
    running = await scrape()
    assert delta(running, before, "vllm:num_requests_waiting", **labels) == 0
    assert delta(running, before, "vllm:num_requests_running", **labels) == 1
    assert b"[DONE]" in b"".join([c async for c in response.streaming_content])
    done = await scrape()
    assert delta(done, before, "vllm:num_requests_running", **labels) == 0
    assert delta(done, before, "vllm:time_to_first_token_seconds_count", **labels) == 1
    assert delta(done, before, "vllm:time_to_first_token_seconds_sum", **labels) >= 0.3


async def test_refusals_and_failures_are_counted_by_reason(fake_pipeline, api_key):
    from contracts.pipeline_errors import PipelineBroken

    fake = fake_pipeline({"r0": Script(tokens=[5, 6, 7], kv_tokens=64, planned_kv_tokens=64)})
    before = await scrape()
    too_large = await post({"model": "demo", "prompt": "x", "max_tokens": 100}, api_key)
    assert too_large.status_code == 400 and too_large.json()["error"]["code"] == "context_length_exceeded"
    fake.scripts["r0"].error = PipelineBroken("stage 1 died")
    broken = await post({"model": "demo", "prompt": "x", "max_tokens": 2}, api_key)
    assert broken.status_code == 503
    after = await scrape()
    labels = {"model_name": "demo", "strategy": "cost_aware"}
    decisions = "motley_router_decisions_total"
    assert delta(after, before, decisions, replica="none", reason="too_large", **labels) == 1
    assert delta(after, before, decisions, replica="r0", reason="routed", **labels) == 1
    assert delta(after, before, "motley_requests_total", model_name="demo", replica="r0",
                 outcome="failed:broken") == 1
    assert after.value("vllm:num_requests_waiting", model_name="demo", replica="r0") == 0  # back to none
    e2e = "vllm:e2e_request_latency_seconds_count"
    assert delta(after, before, e2e, model_name="demo", replica="r0") == 0
