"""The gateway's limits by design (controlplane/gateway/limits.py): body size, max_tokens, requests in
flight per key, and the prompt that does not fit the context; each a clear OpenAI-shaped error."""

from __future__ import annotations

import asyncio
import json

import pytest
from django.test import AsyncClient

from tests.gateway.conftest import api_key, demo_model, fake_pipeline  # noqa: F401  (shared fixtures)
from tests.gateway.fakes import Script

pytestmark = pytest.mark.django_db(transaction=True)


async def post(body, key: str, **extra):
    return await AsyncClient().post("/v1/completions", body if isinstance(body, str) else json.dumps(body),
                                    content_type="application/json",
                                    headers={"Authorization": f"Bearer {key}"}, **extra)


def limits(settings, **values) -> None:
    settings.MOTLEY_GATEWAY = {**settings.MOTLEY_GATEWAY, **values}


async def test_a_body_over_the_limit_is_a_413_before_it_is_read(fake_pipeline, api_key, settings):
    fake_pipeline({"r0": Script(tokens=[5])})
    limits(settings, MAX_BODY_BYTES=1000)
    small = await post({"model": "demo", "prompt": "x", "max_tokens": 1}, api_key)
    assert small.status_code == 200, small.content
    big = await post({"model": "demo", "prompt": "x" * 2000, "max_tokens": 1}, api_key)
    assert big.status_code == 413
    error = big.json()["error"]
    assert error["code"] == "request_too_large" and "1000 bytes" in error["message"]


async def test_max_tokens_over_the_limit_is_a_400_naming_it(fake_pipeline, api_key, settings):
    fake_pipeline({"r0": Script(tokens=[5])})
    limits(settings, MAX_TOKENS=8)
    response = await post({"model": "demo", "prompt": "x", "max_tokens": 9}, api_key)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("max_tokens", "max_tokens_too_large")
    assert "limit of 8" in error["message"]
    assert (await post({"model": "demo", "prompt": "x", "max_tokens": 8}, api_key)).status_code == 200


async def test_a_prompt_longer_than_the_context_is_context_length_exceeded(fake_pipeline, api_key):
    fake_pipeline({"r0": Script(tokens=[5])})
    response = await post({"model": "demo", "prompt": "word " * 400, "max_tokens": 1}, api_key)  # context 256
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"


async def test_one_request_more_than_a_key_may_have_in_flight_is_a_429_and_a_slot_frees_when_one_ends(
        fake_pipeline, api_key, settings):
    fake_pipeline({"r0": Script(tokens=[5] * 20, delay_s=0.05)})
    limits(settings, MAX_CONCURRENT_REQUESTS_PER_KEY=2)
    body = {"model": "demo", "prompt": "x", "max_tokens": 20}
    running = [asyncio.ensure_future(post(body, api_key)) for _ in range(2)]
    await asyncio.sleep(0.3)  # both admitted and generating
    refused = await post(body, api_key)
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "too_many_concurrent_requests" and "2 requests in flight" in error["message"]
    assert [r.status_code for r in await asyncio.gather(*running)] == [200, 200]
    assert (await post({**body, "max_tokens": 1}, api_key)).status_code == 200  # the slots were given back
