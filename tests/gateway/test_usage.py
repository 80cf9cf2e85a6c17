"""Usage accounting through the gateway: what is stored equals the tokens served, per key and model."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from contracts.pipeline_errors import PipelineBroken
from controlplane.gateway.accounts import usage_backlog
from controlplane.gateway.accounts.services import api_key_create
from controlplane.gateway.models import UsageBucket
from controlplane.gateway.serving.decision_log import recorder
from tests.gateway.fakes import Script

pytestmark = pytest.mark.django_db(transaction=True)


async def post(path: str, body: dict, key: str):
    return await AsyncClient().post(path, json.dumps(body), content_type="application/json",
                                    headers={"Authorization": f"Bearer {key}"})


async def stored(api_key) -> dict:
    """The figures stored for the key, once this process wrote what it queued (as the usage API does)."""
    assert await sync_to_async(usage_backlog.flush)()
    rows = [row async for row in UsageBucket.objects.filter(api_key=api_key)]
    return {name: sum(getattr(r, name) for r in rows)
            for name in ("requests", "prompt_tokens", "completion_tokens", "errors", "refused")}


@pytest.fixture
def keys(django_user_model):
    def make():
        user = django_user_model.objects.create_user("usage-user")
        return [api_key_create(user=user, name=name) for name in ("answered", "cut-short")]
    return sync_to_async(make)


async def test_stored_usage_equals_the_tokens_served(fake_pipeline, keys, demo_model):
    """Every way a request can end: the stored figures are the ``usage`` the gateway answered with, and
    for requests whose client never saw a usage (cancelled, failed) the tokens the router recorded."""
    from controlplane.gateway.openai.tokenization import ModelTokenizer

    text = ModelTokenizer.load(demo_model).encode_prompt("Héllo wörld — 世界 🎉 ok")
    fake = fake_pipeline({"r0": Script(tokens=text * 4, delay_s=0.01)})
    (answered, raw), (cut_short, raw_cut) = await keys()
    returned = []
    bodies = [
        ("/v1/completions", {"model": "demo", "prompt": "The quick brown fox", "max_tokens": 7}),
        ("/v1/completions", {"model": "demo", "prompt": [1, 2, 3, 4], "max_tokens": 30}),
        ("/v1/chat/completions",
         {"model": "demo", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 9}),
        ("/v1/completions", {"model": "demo", "prompt": "x", "max_tokens": 40, "stop": ["世界"]}),
    ]
    for path, body in bodies:
        response = await post(path, body, raw)
        assert response.status_code == 200, response.content
        returned.append(response.json()["usage"])
    streamed = await post("/v1/completions",
                          {"model": "demo", "prompt": "abc", "max_tokens": 12, "stream": True,
                           "stream_options": {"include_usage": True}}, raw)
    events = [json.loads(line[6:]) for line in b"".join([c async for c in streamed.streaming_content])
              .decode().split("\n\n") if line.startswith("data: {")]
    returned.append(events[-1]["usage"])
    totals = await stored(answered)
    assert totals["requests"] == 5 and totals["errors"] == 0
    assert totals["prompt_tokens"] == sum(u["prompt_tokens"] for u in returned)
    assert totals["completion_tokens"] == sum(u["completion_tokens"] for u in returned)

    # The other key: a stream its client leaves after a few tokens, and a replica that fails at once.
    recorder.__init__()
    response = await post("/v1/completions",
                          {"model": "demo", "prompt": "abc", "max_tokens": 40, "stream": True},
                          raw_cut)
    received = []

    async def consume():
        async for chunk in response.streaming_content:
            received.append(chunk)

    task = asyncio.ensure_future(consume())  # the client goes away: Django's handler cancels the task
    while len(received) < 3:
        await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(fake.cancelled) == 2  # the stop string's request, and this one
    fake.scripts["r0"].error = PipelineBroken("stage 1 died")
    assert (await post("/v1/completions", {"model": "demo", "prompt": "abc"}, raw_cut)).status_code == 503
    served = [r for r in recorder.recent if r.completion_tokens]
    assert len(served) == 1 and 3 <= served[0].completion_tokens < 40
    totals = await stored(cut_short)
    assert totals == {"requests": 2, "prompt_tokens": served[0].prompt_tokens,
                      "completion_tokens": served[0].completion_tokens, "errors": 1, "refused": 0}


async def test_concurrent_requests_all_count(fake_pipeline, keys, settings):
    fake_pipeline({"r0": Script(tokens=[5, 6, 7], delay_s=0.01)})
    # The requests past the replica's room queue for it: room to wait on a loaded machine (the fixture's
    # 0.2 s is for a model without a routable replica).
    settings.MOTLEY_GATEWAY = {**settings.MOTLEY_GATEWAY, "WAIT_S": 10.0}
    (api_key, raw), _ = await keys()
    body = {"model": "demo", "prompt": [1, 2], "max_tokens": 3}
    responses = await asyncio.gather(*(post("/v1/completions", body, raw) for _ in range(12)))
    assert {r.status_code for r in responses} == {200}
    assert await stored(api_key) == {"requests": 12, "prompt_tokens": 24, "completion_tokens": 36,
                                     "errors": 0, "refused": 0}


async def test_a_response_does_not_wait_for_its_usage_to_be_written(fake_pipeline, keys, monkeypatch):
    """On SQLite a write waits for whatever transaction the control plane holds (an apply, a reconcile);
    a response written before its usage record would wait with it, and no request would complete for
    0.5-0.7 s after each change of placement (usage_backlog.py). The record is written once the database
    takes it."""
    release, record = threading.Event(), usage_backlog.usage_record

    def blocked_record(**figures):
        release.wait(30)
        return record(**figures)

    monkeypatch.setattr(usage_backlog, "usage_record", blocked_record)
    fake_pipeline({"r0": Script(tokens=[5, 6, 7])})
    (answered, raw), _ = await keys()
    response = await asyncio.wait_for(post("/v1/completions",
                                           {"model": "demo", "prompt": "x", "max_tokens": 3}, raw),
                                      timeout=10)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 3
    assert usage_backlog.pending() == 1  # queued, its write blocked
    release.set()
    assert (await stored(answered))["requests"] == 1 and usage_backlog.pending() == 0
