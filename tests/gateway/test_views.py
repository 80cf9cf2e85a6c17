"""The /v1/ endpoints against stand-in replicas: OpenAI shapes, errors, streaming, stops, cancellation."""

from __future__ import annotations

import asyncio
import json

import pytest
from django.test import AsyncClient

from controlplane.gateway.openai.tokenization import ModelTokenizer
from tests.gateway.fakes import Script

pytestmark = pytest.mark.django_db(transaction=True)

TEXT = "Héllo wörld — 世界 🎉 ok"


def auth(key: str) -> dict:
    return {"headers": {"Authorization": f"Bearer {key}"}}


def tokens(demo_model, text: str = TEXT) -> list[int]:
    return ModelTokenizer.load(demo_model).encode_prompt(text)


async def post(client: AsyncClient, path: str, body, key: str):
    data = body if isinstance(body, str) else json.dumps(body)
    return await client.post(path, data, content_type="application/json", **auth(key))


def streaming(response) -> tuple[asyncio.Task, list[bytes]]:
    """A task reading a streamed response as a client does, and the chunks it has read so far."""
    received: list[bytes] = []

    async def consume():
        async for chunk in response.streaming_content:
            received.append(chunk)

    return asyncio.ensure_future(consume()), received


async def sse_events(response) -> list:
    raw = b"".join([chunk async for chunk in response.streaming_content]).decode()
    assert raw.endswith("data: [DONE]\n\n")
    return [json.loads(line[6:]) for line in raw.split("\n\n") if line.startswith("data: {")]


async def test_models_lists_the_served_models(fake_pipeline, api_key):
    fake_pipeline({"r0": Script()})
    response = await AsyncClient().get("/v1/models", **auth(api_key))
    assert response.status_code == 200
    assert response.json()["data"][0]["id"] == "demo"


@pytest.mark.parametrize("header", [None, "Bearer nope", "Token x", "Bearer "])
async def test_a_missing_or_wrong_key_is_a_401_in_openai_shape(fake_pipeline, api_key, header):
    fake_pipeline({"r0": Script()})
    headers = {"headers": {"Authorization": header}} if header else {}
    response = await AsyncClient().post("/v1/completions", "{}", content_type="application/json", **headers)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


async def test_a_revoked_key_stops_working(fake_pipeline, api_key):
    from controlplane.gateway.accounts.services import api_key_revoke
    from controlplane.gateway.models import ApiKey

    fake_pipeline({"r0": Script()})
    assert (await AsyncClient().get("/v1/models", **auth(api_key))).status_code == 200
    for row in [k async for k in ApiKey.objects.all()]:
        await asyncio.to_thread(api_key_revoke, api_key=row)
    assert (await AsyncClient().get("/v1/models", **auth(api_key))).status_code == 401


async def test_completion_returns_text_finish_reason_and_usage(fake_pipeline, api_key, demo_model):
    fake = fake_pipeline({"r0": Script(tokens=tokens(demo_model))})
    body = {"model": "demo", "prompt": "The quick brown fox", "max_tokens": 50, "temperature": 0, "seed": 3}
    response = await post(AsyncClient(), "/v1/completions", body, api_key)
    assert response.status_code == 200, response.content
    data = response.json()
    prompt_ids = tokens(demo_model, "The quick brown fox")
    assert data["object"] == "text_completion"
    assert data["choices"][0]["text"] == TEXT
    assert data["choices"][0]["finish_reason"] == "length"
    n = len(tokens(demo_model))
    assert data["usage"] == {"prompt_tokens": len(prompt_ids), "completion_tokens": n,
                             "total_tokens": len(prompt_ids) + n}
    sent = fake.submitted[0]
    assert sent["prompt_ids"] == prompt_ids and sent["max_tokens"] == 50
    assert sent["params"].temperature == 0 and sent["params"].seed == 3
    assert sent["stop_token_ids"] == ModelTokenizer.load(demo_model).eos_token_ids


async def test_chat_completion_renders_the_models_chat_template(fake_pipeline, api_key, demo_model):
    fake = fake_pipeline({"r0": Script(tokens=tokens(demo_model, "Hi"))})
    body = {"model": "demo", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 5}
    response = await post(AsyncClient(), "/v1/chat/completions", body, api_key)
    assert response.status_code == 200, response.content
    assert response.json()["choices"][0]["message"] == {"role": "assistant", "content": "Hi"}
    tokenizer = ModelTokenizer.load(demo_model)
    expected = tokenizer.tokenizer.encode("<|begin_of_text|><|user|>Hello<|assistant|>",
                                          add_special_tokens=False).ids
    assert fake.submitted[0]["prompt_ids"] == expected


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", {"prompt": "x"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
])
async def test_a_request_opts_out_of_speculation_with_speculate_false(fake_pipeline, api_key, path, body):
    fake = fake_pipeline({"r0": Script(tokens=[5, 6])})
    for speculate in (None, True, False):
        extra = {} if speculate is None else {"speculate": speculate}
        request = {"model": "demo", "max_tokens": 2, **body, **extra}
        response = await post(AsyncClient(), path, request, api_key)
        assert response.status_code == 200, response.content
    assert [s["speculate"] for s in fake.submitted] == [True, True, False]


async def test_streamed_text_is_exact_across_multibyte_characters(fake_pipeline, api_key, demo_model):
    fake_pipeline({"r0": Script(tokens=tokens(demo_model))})
    body = {"model": "demo", "prompt": "x", "max_tokens": 100, "stream": True,
            "stream_options": {"include_usage": True}}
    response = await post(AsyncClient(), "/v1/completions", body, api_key)
    assert response.status_code == 200 and response["Content-Type"] == "text/event-stream"
    events = await sse_events(response)
    texts = [e["choices"][0]["text"] for e in events if e["choices"]]
    assert "".join(texts) == TEXT
    assert not any("\ufffd" in t for t in texts)
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["usage"]["completion_tokens"] == len(tokens(demo_model))


async def test_chat_stream_starts_with_the_role_and_ends_with_done(fake_pipeline, api_key, demo_model):
    fake_pipeline({"r0": Script(tokens=tokens(demo_model, "Hi there"))})
    body = {"model": "demo", "messages": [{"role": "user", "content": "Hello"}], "stream": True}
    events = await sse_events(await post(AsyncClient(), "/v1/chat/completions", body, api_key))
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(e["choices"][0]["delta"]["content"] for e in events) == "Hi there"
    assert all(e["object"] == "chat.completion.chunk" for e in events)


async def test_a_stop_string_cuts_the_text_and_cancels_the_request(fake_pipeline, api_key, demo_model):
    fake = fake_pipeline({"r0": Script(tokens=tokens(demo_model))})
    body = {"model": "demo", "prompt": "x", "max_tokens": 100, "stop": ["世界"]}
    data = (await post(AsyncClient(), "/v1/completions", body, api_key)).json()
    assert data["choices"][0] == {"index": 0, "text": "Héllo wörld — ", "logprobs": None,
                                  "finish_reason": "stop"}
    assert len(fake.cancelled) == 1


async def test_a_client_that_goes_away_cancels_its_request(fake_pipeline, api_key, demo_model):
    fake = fake_pipeline({"r0": Script(tokens=tokens(demo_model) * 10, delay_s=0.05)})
    body = {"model": "demo", "prompt": "x", "max_tokens": 200, "stream": True}
    # On a disconnect Django's ASGI handler cancels the task sending the response (or running the view).
    task, received = streaming(await post(AsyncClient(), "/v1/completions", body, api_key))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert received and len(fake.cancelled) == 1
    task = asyncio.ensure_future(post(AsyncClient(), "/v1/completions", {**body, "stream": False}, api_key))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(fake.cancelled) == 2


async def test_a_cancel_that_meets_a_token_is_not_lost(fake_pipeline, api_key, demo_model):
    """Tokens back to back, the client leaving at every tick of the event loop after its third chunk: at
    some tick the cancel lands as a token arrives, where Python 3.11's ``asyncio.wait_for`` returned the
    token and dropped the cancel, and the stream ran on for a client that had gone."""
    fake = fake_pipeline({"r0": Script(tokens=tokens(demo_model) * 10)})
    body = {"model": "demo", "prompt": "x", "max_tokens": 200, "stream": True}
    for ticks in range(8):
        task, received = streaming(await post(AsyncClient(), "/v1/completions", body, api_key))
        while len(received) < 3:
            await asyncio.sleep(0)
        for _ in range(ticks):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(fake.cancelled) == ticks + 1, ticks


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ("not json", None),
        ({"model": "demo", "prompt": "x", "max_tokens": -1}, "max_tokens"),
        ({"model": "demo", "prompt": "x", "max_tokens": "10"}, "max_tokens"),
        ({"model": "demo", "prompt": 42}, "prompt"),
        ({"model": "demo", "prompt": "x", "temperature": "hot"}, "temperature"),
        ({"model": "demo", "prompt": "x", "top_p": 0}, "top_p"),
        ({"model": "demo", "prompt": "x", "n": 17}, "n"),
        ({"model": "demo", "prompt": "x", "stop": [1]}, "stop"),
        ({"model": "demo", "prompt": "x", "stream": "yes"}, "stream"),
        ({"model": "demo", "prompt": "x", "speculate": "no"}, "speculate"),
        ({"model": "demo", "prompt": "x", "speculate": 0}, "speculate"),
        ({"model": 7, "prompt": "x"}, "model"),
        ({"model": "demo", "prompt": "x " * 300}, "prompt"),
        ({"model": "demo", "prompt": "x", "max_tokens": 1000}, "prompt"),
    ],
)
async def test_bad_payloads_are_400s_naming_the_field(fake_pipeline, api_key, body, param):
    fake_pipeline({"r0": Script()})
    response = await post(AsyncClient(), "/v1/completions", body, api_key)
    assert response.status_code == 400, response.content
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert response.json()["error"]["param"] == param


async def test_bad_chat_messages_are_400s(fake_pipeline, api_key):
    fake_pipeline({"r0": Script()})
    for messages in ([], [{"role": "robot", "content": "x"}], [{"role": "user", "content": 5}]):
        response = await post(AsyncClient(), "/v1/chat/completions", {"model": "demo", "messages": messages},
                              api_key)
        assert response.status_code == 400


async def test_unknown_model_is_a_404(fake_pipeline, api_key):
    fake_pipeline({"r0": Script()})
    response = await post(AsyncClient(), "/v1/completions", {"model": "gpt-9", "prompt": "x"}, api_key)
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"


async def test_a_replica_is_not_routed_to_until_its_pipeline_is_serving(fake_pipeline, api_key, demo_model):
    """READY comes when each stage process started; the head says ok once the stages joined. The
    directory already knows the replica's KV budget (from the plan), so only health keeps it out."""
    fake = fake_pipeline({"r0": Script(tokens=tokens(demo_model), healthy=False, planned_kv_tokens=4096)})
    client, body = AsyncClient(), {"model": "demo", "prompt": "x", "max_tokens": 2}
    refused = await post(client, "/v1/completions", body, api_key)
    assert refused.status_code == 503, refused.content
    assert fake.submitted == []
    fake.scripts["r0"].healthy = True
    for _ in range(100):  # the background poll (REFRESH_S 0.05 s) finds it healthy
        response = await post(client, "/v1/completions", body, api_key)
        if response.status_code != 503:
            break
        await asyncio.sleep(0.02)
    assert response.status_code == 200, response.content
    assert [s["pipeline_id"] for s in fake.submitted] == ["r0"]


@pytest.mark.parametrize(
    ("error", "status"),
    [("RequestRejected", 429), ("PipelineBroken", 503), ("DeadlineExceeded", 504)],
)
async def test_pipeline_errors_map_to_status_codes(fake_pipeline, api_key, error, status):
    import contracts.pipeline_errors

    fake_pipeline({"r0": Script(error=getattr(contracts.pipeline_errors, error)("boom"))})
    response = await post(AsyncClient(), "/v1/completions", {"model": "demo", "prompt": "x"}, api_key)
    assert response.status_code == status
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


async def test_the_gateway_deadline_is_a_504_not_a_hang(fake_pipeline, api_key, demo_model, settings):
    fake_pipeline({"r0": Script(tokens=tokens(demo_model), delay_s=10)})
    settings.MOTLEY_GATEWAY = {**settings.MOTLEY_GATEWAY, "DEADLINE_S": 0.5}
    response = await asyncio.wait_for(
        post(AsyncClient(), "/v1/completions", {"model": "demo", "prompt": "x", "max_tokens": 2}, api_key), 5
    )
    assert response.status_code == 504 and response.json()["error"]["code"] == "deadline_exceeded"


async def test_router_decisions_and_queue_times_are_recorded(fake_pipeline, api_key, demo_model):
    from controlplane.gateway.serving.runtime import gateway_stats

    fake_pipeline({"r0": Script(tokens=tokens(demo_model)), "r1": Script(tokens=tokens(demo_model))})
    for _ in range(2):
        await post(AsyncClient(), "/v1/completions", {"model": "demo", "prompt": "x"}, api_key)
    stats = await gateway_stats()
    assert set(stats["models"]["demo"]["replicas"]) == {"r0", "r1"}
    recent = stats["router"]["recent"][-2:]
    assert all(r["outcome"] == "completed" and r["queue_s"] is not None for r in recent)
    assert stats["router"]["queue_s"]["p50"] is not None
