"""End to end: the official ``openai`` client against a live daphne server whose gateway routes to a
real two-stage pipeline of the demo model (conftest's ``live``); its greedy tokens must be the
in-process model's."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import jsonschema
import openai
import pytest

from controlplane.gateway.openai.tokenization import ModelTokenizer
from controlplane.gateway.serving.pipeline_client import PipelineClient
from tests.gateway.live_server import KV_TOKENS, NUM_LAYERS
from tests.pipeline.harness import TOKEN
from worker_runtime import SamplingParams, Stage, generate

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def reference_text(demo_model, prompt_ids: list[int], max_tokens: int) -> str:
    """Greedy tokens of the single-process model, decoded as the gateway decodes them."""
    tokenizer = ModelTokenizer.load(demo_model)
    stage = Stage.load(str(demo_model), 0, NUM_LAYERS, kv_tokens=KV_TOKENS)
    (ids,) = generate([stage], [prompt_ids], [SamplingParams()], max_tokens,
                      stop_tokens=tokenizer.eos_token_ids)
    return tokenizer.tokenizer.decode(ids, skip_special_tokens=True)


@pytest.fixture
def client(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live["base_url"], api_key=live["key"], max_retries=0, timeout=60)


def test_completion_matches_the_single_process_greedy_tokens(client, demo_model):
    prompt = "The quick brown fox"
    response = client.completions.create(model="demo", prompt=prompt, max_tokens=12, temperature=0)
    prompt_ids = ModelTokenizer.load(demo_model).encode_prompt(prompt)
    assert response.choices[0].text == reference_text(demo_model, prompt_ids, 12)
    assert response.usage.prompt_tokens == len(prompt_ids)
    assert 1 <= response.usage.completion_tokens <= 12


def test_chat_completion_matches_and_streaming_gives_the_same_text(client, demo_model):
    messages = [{"role": "user", "content": "Sphinx of black quartz, judge my vow."}]
    prompt_ids = ModelTokenizer.load(demo_model).encode_chat(messages)
    expected = reference_text(demo_model, prompt_ids, 10)
    chat = client.chat.completions.create(model="demo", messages=messages, max_tokens=10, temperature=0)
    assert chat.choices[0].message.content == expected
    stream = client.chat.completions.create(model="demo", messages=messages, max_tokens=10, temperature=0,
                                            stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream) == expected
    completions = client.completions.create(model="demo", prompt=prompt_ids, max_tokens=10, temperature=0,
                                            stream=True)
    assert "".join(chunk.choices[0].text for chunk in completions) == expected


def test_errors_reach_the_openai_client_as_its_exceptions(client, live):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="demo", prompt="x", max_tokens=-1)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=live["base_url"], api_key="mk-wrong", max_retries=0).models.list()
    assert [m.id for m in client.models.list()] == ["demo", "tools"]


async def _kv_used(head: str) -> int:
    async with PipelineClient(head, TOKEN, "p0") as pipeline:
        stats = await pipeline.stats()
    return stats["max_request_tokens"] - min(stats["kv_tokens_free_by_stage"].values())


def test_a_disconnected_stream_frees_its_kv_space(live):
    head = live["pipeline"].head
    body = {"model": "demo", "prompt": "Pack my box", "max_tokens": 240, "temperature": 0, "stream": True}
    headers = {"Authorization": f"Bearer {live['key']}"}
    with httpx.stream("POST", f"{live['base_url']}/completions", json=body, headers=headers,
                      timeout=30) as response:
        assert response.status_code == 200
        chunks = response.iter_bytes()  # kept: dropping the iterator would close the response
        next(chunks)
        assert asyncio.run(_kv_used(head)) > 0
    deadline = time.monotonic() + 10
    while (used := asyncio.run(_kv_used(head))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert used == 0, f"{used} KV tokens still held after the client left"


def model_logprobs(demo_model, ids: list[int]):
    """transformers' log-softmax over ``ids`` (row i: the distribution of token i + 1)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(demo_model, torch_dtype=torch.float32)
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def test_logprobs_reach_the_openai_client_as_transformers_computes_them(client, demo_model):
    tokenizer = ModelTokenizer.load(demo_model)
    messages = [{"role": "user", "content": "Sphinx of black quartz, judge my vow."}]
    prompt_ids = tokenizer.encode_chat(messages)
    stage = Stage.load(str(demo_model), 0, NUM_LAYERS, kv_tokens=KV_TOKENS)
    (generated,) = generate([stage], [prompt_ids], [SamplingParams()], 6, stop_tokens=tokenizer.eos_token_ids)
    logp = model_logprobs(demo_model, prompt_ids + generated)
    chat = client.chat.completions.create(model="demo", messages=messages, max_tokens=6, temperature=0,
                                          logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == len(generated) == chat.usage.completion_tokens
    for j, entry in enumerate(content):
        row = logp[len(prompt_ids) - 1 + j]
        assert entry.logprob == pytest.approx(row[generated[j]].item(), abs=2e-4)
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(row.topk(3).values.tolist(), abs=2e-4)
    stream = client.chat.completions.create(model="demo", messages=messages, max_tokens=6, temperature=0,
                                            logprobs=True, top_logprobs=3, stream=True)
    streamed = [e for chunk in stream if chunk.choices and chunk.choices[0].logprobs
                for e in chunk.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    # lm-evaluation-harness' log-likelihood request: the prompt's token ids, echo, one token more
    completion = client.completions.create(model="demo", prompt=prompt_ids, max_tokens=1, temperature=0,
                                           echo=True, logprobs=1)
    scored = completion.choices[0].logprobs
    assert scored.token_logprobs[0] is None and len(scored.token_logprobs) == len(prompt_ids) + 1
    expected = [logp[i, t].item() for i, t in enumerate(prompt_ids[1:] + generated[:1])]
    assert scored.token_logprobs[1:] == pytest.approx(expected, abs=2e-4)
    assert completion.choices[0].text.endswith(tokenizer.tokenizer.decode(generated[:1]))


def test_health_and_tokenize_on_the_live_server(live, demo_model):
    root = live["base_url"].removesuffix("/v1")
    assert httpx.get(f"{root}/health").json() == {"status": "ok"}
    headers = {"Authorization": f"Bearer {live['key']}"}
    counted = httpx.post(f"{root}/tokenize", json={"model": "demo", "prompt": "Pack my box"}, headers=headers)
    ids = ModelTokenizer.load(demo_model).encode_prompt("Pack my box")
    assert counted.json()["tokens"] == ids
    text = httpx.post(f"{root}/detokenize", json={"model": "demo", "tokens": ids}, headers=headers).json()
    assert text["prompt"].endswith("Pack my box")
    assert httpx.post(f"{root}/tokenize", json={"model": "demo", "prompt": "x"}).status_code == 401


def test_a_request_is_traced_from_the_clients_span_through_the_gateway_to_the_head(live):
    """The client's ``traceparent`` honoured; the gateway's spans and the head's reach a real OTLP/HTTP
    receiver as one trace, parent to child, and the response names the trace."""
    trace_id, client_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    response = httpx.post(f"{live['base_url']}/completions", timeout=60, json={
        "model": "demo", "prompt": "The quick brown fox", "max_tokens": 5, "temperature": 0},
        headers={"Authorization": f"Bearer {live['key']}", "traceparent": f"00-{trace_id}-{client_span}-01"})
    assert response.status_code == 200 and response.headers["X-Trace-Id"] == trace_id
    names = {"gateway.request", "gateway.admission", "gateway.route", "head.request"}
    spans = live["traces"].wait(lambda spans: names <= {s.name for s in spans if s.trace_id == trace_id})
    by_name = {s.name: s for s in spans if s.trace_id == trace_id}
    request, head = by_name["gateway.request"], by_name["head.request"]
    assert request.parent_span_id == client_span and request.resource["motley.role"] == "gateway"
    assert by_name["gateway.admission"].parent_span_id == request.span_id
    route = by_name["gateway.route"]
    assert route.parent_span_id == request.span_id and route.attributes["motley.replica"]
    assert [i["replica"] for i in json.loads(route.attributes["motley.route.inputs"])] == [
        route.attributes["motley.replica"]]
    assert head.parent_span_id == request.span_id and head.resource["motley.stage"] == "p0/0"
    usage = response.json()["usage"]
    assert request.attributes["motley.outcome"] == "completed" and request.attributes["motley.ttft_s"] > 0
    assert request.attributes["motley.completion_tokens"] == usage["completion_tokens"]
    assert head.attributes["motley.completion_tokens"] == usage["completion_tokens"]
    assert head.attributes["motley.prompt_tokens"] == usage["prompt_tokens"]
    assert "first_token" in [name for name, _ in request.events]
    assert request.start_ns <= route.start_ns <= head.start_ns <= head.end_ns <= request.end_ns
    streamed = httpx.post(f"{live['base_url']}/completions", timeout=60, json={
        "model": "demo", "prompt": "x", "max_tokens": 2, "stream": True},
        headers={"Authorization": f"Bearer {live['key']}"})
    streamed_id = streamed.headers["X-Trace-Id"]  # a trace of its own, without a traceparent
    names = {"gateway.request", "head.request"}
    spans = live["traces"].wait(lambda spans: names <= {s.name for s in spans if s.trace_id == streamed_id})
    # Its root: Django's instrumentation leaves the OpenAI routes to the gateway's own span.
    assert streamed_id != trace_id and [s.parent_span_id for s in spans
                                         if s.trace_id == streamed_id and s.name == "gateway.request"] == [""]



def test_the_servers_timeline_holds_the_request_from_the_gateway_to_the_last_stage(live):
    """The server's own trace store (``OTEL_TRACES_EXPORTER`` naming ``motley``): the gateway's spans
    and both stages' (posted to it with their pipeline's token) read back from the timeline API as one
    tree, parent before child."""
    response = httpx.post(f"{live['base_url']}/completions", timeout=60, json={
        "model": "demo", "prompt": "Sphinx of black quartz", "max_tokens": 4, "temperature": 0},
        headers={"Authorization": f"Bearer {live['key']}"})
    trace_id = response.headers["X-Trace-Id"]
    api, token = live["api"]
    headers = {"Authorization": f"Token {token}"}
    names = {"gateway.request", "gateway.admission", "gateway.route", "head.request", "stage.request"}
    deadline = time.monotonic() + 20
    while True:  # the processes export in batches, every 50 ms here
        answer = httpx.get(f"{api}/traces/{trace_id}/", headers=headers)
        spans = answer.json()["spans"] if answer.status_code == 200 else []
        if names <= {s["name"] for s in spans} or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    by_name = {s["name"]: s for s in spans}
    assert names <= set(by_name), f"the store holds {sorted(by_name)} of trace {trace_id}"
    request, head, stage = by_name["gateway.request"], by_name["head.request"], by_name["stage.request"]
    assert spans[0] == request and (request["depth"], request["parent_span_id"]) == (0, "")
    for name in ("gateway.admission", "gateway.route", "head.request"):
        assert (by_name[name]["parent_span_id"], by_name[name]["depth"]) == (request["span_id"], 1)
    assert (stage["parent_span_id"], stage["depth"]) == (head["span_id"], 2)
    assert spans.index(head) < spans.index(stage)
    assert (head["resource"]["motley.stage"], stage["resource"]["motley.stage"]) == ("p0/0", "p0/1")
    completion_tokens = response.json()["usage"]["completion_tokens"]
    assert head["attributes"]["motley.completion_tokens"] == completion_tokens
    assert stage["attributes"]["motley.steps"] == completion_tokens  # its prefill and each decode step
    assert 0 <= head["offset_s"] <= stage["offset_s"] <= request["duration_s"]
    listed = httpx.get(f"{api}/traces/", headers=headers).json()["traces"]
    assert {"trace_id": trace_id, "name": "gateway.request", "outcome": "completed", "model": "demo",
            "spans": len(spans)}.items() <= next(t for t in listed if t["trace_id"] == trace_id).items()


async def _prefix_hit_tokens(head: str) -> int:
    async with PipelineClient(head, TOKEN, "p0") as pipeline:
        return (await pipeline.stats())["stages"][0]["prefix_hit_tokens"]


def test_n_seeded_samples_are_deterministic_and_the_later_ones_hit_the_prefix_cache(client, live, demo_model):
    """n=3 with a seed: three choices, the same three on a second call; in the first call samples 1 and 2
    find the prompt's full blocks cached by sample 0 (the head's ``prefix_hit_tokens``)."""
    prompt = "Samples of one prompt share its prefill: " + "amber birch cedar dune ember fjord " * 4
    prompt_ids = ModelTokenizer.load(demo_model).encode_prompt(prompt)
    block = 16  # the stages' KV block (worker_runtime/kv_cache.py)
    reusable = (len(prompt_ids) - 1) // block * block  # the last token's block is computed, for its logits
    assert reusable >= 2 * block
    head = live["pipeline"].head

    def call():
        before = asyncio.run(_prefix_hit_tokens(head))
        response = client.completions.create(model="demo", prompt=prompt, max_tokens=8, temperature=1.0, n=3,
                                             seed=1234)
        return response, asyncio.run(_prefix_hit_tokens(head)) - before

    (first, hits), (second, _) = call(), call()
    assert hits == 2 * reusable
    texts = [c.text for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2] and [c.text for c in second.choices] == texts
    assert len(set(texts)) > 1, texts  # three seeds, not one
    assert all(c.finish_reason in ("length", "stop") for c in first.choices)
    assert first.usage.prompt_tokens == len(prompt_ids) and 3 <= first.usage.completion_tokens <= 24


PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 6},
                         "age": {"type": "integer", "minimum": 0, "maximum": 99}}}


def test_response_format_json_schema_always_validates_streamed_and_not(client):
    """The official client's ``response_format`` (chat, json_schema, strict) at temperature 1 with several
    seeds, two samples each: every answer is JSON that validates, streamed or not."""
    asked = {"model": "demo", "messages": [{"role": "user", "content": "Who are you? Answer in JSON."}],
             "max_tokens": 48, "temperature": 1.0,
             "response_format": {"type": "json_schema",
                                 "json_schema": {"name": "person", "schema": PERSON, "strict": True}}}
    answers = []
    for seed in (1, 2, 3):
        chat = client.chat.completions.create(**asked, seed=seed, n=2)
        assert all(c.finish_reason == "stop" for c in chat.choices)
        answers += [c.message.content for c in chat.choices]
        stream = client.chat.completions.create(**asked, seed=seed, stream=True)
        answers.append("".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices))
    for answer in answers:
        jsonschema.validate(json.loads(answer), PERSON)
    assert len(set(answers)) > 1


WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
           "properties": {"city": {"enum": ["Paris", "Oslo"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}}}
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}


def test_a_forced_tool_call_reaches_the_openai_client_as_tool_calls(client):
    """Model "tools" (the demo weights with Qwen 2.5's template): tool_choice forces the call through
    the grammar at the head, whole and streamed; the arguments validate against the tool's schema."""
    messages = [{"role": "user", "content": "Weather in Paris for three days?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    asked = {"model": "tools", "messages": messages, "tools": [WEATHER_TOOL], "max_tokens": 120,
             "temperature": 1.0}
    for choice, seed in (("required", 1), (named, 2)):
        reply = client.chat.completions.create(**asked, tool_choice=choice, parallel_tool_calls=False,
                                               seed=seed)
        assert reply.choices[0].finish_reason == "tool_calls"
        [call] = reply.choices[0].message.tool_calls
        assert call.id.startswith("call_") and call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    calls: dict[int, dict] = {}
    reasons = []
    for chunk in client.chat.completions.create(**asked, tool_choice=named, seed=3, stream=True):
        reasons.append(chunk.choices[0].finish_reason)
        for piece in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(piece.index, {"id": piece.id, "name": piece.function.name})
            call["arguments"] = call.get("arguments", "") + (piece.function.arguments or "")
    assert list(calls) == [0] and calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER)
    assert reasons[-1] == "tool_calls"
