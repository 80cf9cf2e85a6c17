"""Overload queues instead of being refused: up to a bound sized from the plan's capacity, then shed
with 429 and a ``Retry-After`` computed from the queue, which the official ``openai`` client honours
when it retries. Against a stand-in replica (fakes.py) whose KV holds one request at a time."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from django.core.handlers.asgi import ASGIHandler

from controlplane.gateway.serving.runtime import gateway_stats
from tests.gateway.fakes import Script

pytestmark = pytest.mark.django_db(transaction=True)
# KV 150 tokens, a request needs 112 (a 1-token prompt + 100, in 16-token blocks): one slot, so the
# queue's bound is QUEUE_ROUNDS (4) requests
KV_TOKENS, MAX_TOKENS = 150, 100


@pytest.fixture
def one_slot(fake_pipeline, settings):
    settings.MOTLEY_GATEWAY = {**settings.MOTLEY_GATEWAY, "WAIT_S": 30.0}
    return fake_pipeline({"r0": Script(tokens=[5] * 8, delay_s=0.03, kv_tokens=KV_TOKENS)})


def openai_client(key: str, *, retries: int) -> openai.AsyncOpenAI:
    transport = httpx.ASGITransport(app=ASGIHandler())
    return openai.AsyncOpenAI(base_url="http://testserver/v1", api_key=key, max_retries=retries,
                              http_client=httpx.AsyncClient(transport=transport, base_url="http://testserver"))


async def complete(client: openai.AsyncOpenAI):
    try:
        return await client.completions.create(model="demo", prompt="x", max_tokens=MAX_TOKENS)
    except openai.APIStatusError as error:
        return error


async def shed_wave(client: openai.AsyncOpenAI, n: int = 8) -> list[int]:
    """``n`` requests at once: one runs, four queue, the rest are shed; their Retry-After values."""
    outcomes = await asyncio.gather(*(complete(client) for _ in range(n)))
    served = [o for o in outcomes if isinstance(o, openai.types.Completion)]
    shed = [o for o in outcomes if isinstance(o, openai.RateLimitError)]
    assert (len(served), len(shed)) == (5, n - 5), outcomes
    for error in shed:
        assert error.body["code"] == "server_saturated" and "the queue's bound, 4" in error.body["message"]
    return [int(error.response.headers["Retry-After"]) for error in shed]


async def test_overload_queues_up_to_the_bound_then_sheds_with_429_and_a_computed_retry_after(one_slot,
                                                                                              api_key):
    client = openai_client(api_key, retries=0)
    # before any request ended: the five ahead at the replica's estimated 2.2 s each (100 tokens at the
    # assumed 0.02 s a step)
    assert all(8 <= s <= 15 for s in await shed_wave(client))
    # then at the measured rate: the stand-in ends each in ~0.25 s (8 tokens), five ahead take ~2 s
    assert all(1 <= s <= 3 for s in await shed_wave(client))
    waiting = (await gateway_stats())["models"]["demo"]["waiting"]
    assert (waiting["full"], waiting["timed_out"]) == (6, 0) and waiting["admitted"] >= 8


async def test_the_openai_clients_retries_after_retry_after_all_succeed(one_slot, api_key):
    client = openai_client(api_key, retries=3)
    outcomes = await asyncio.gather(*(complete(client) for _ in range(10)))
    assert all(isinstance(o, openai.types.Completion) for o in outcomes), outcomes
    assert (await gateway_stats())["models"]["demo"]["waiting"]["full"] > 0  # some were shed, then retried


async def test_a_key_over_its_own_in_flight_limit_is_refused_and_the_default_is_none(one_slot, api_key,
                                                                                   django_user_model):
    from controlplane.gateway.accounts.services import api_key_create

    user = await django_user_model.objects.aget(username="alice")
    limited = (await asyncio.to_thread(
        lambda: api_key_create(user=user, name="limited", limits={"max_concurrent_requests": 1})))[1]
    client = openai_client(limited, retries=0)
    first, second = await asyncio.gather(complete(client), complete(client))
    refused = [o for o in (first, second) if isinstance(o, openai.RateLimitError)]
    assert len(refused) == 1 and refused[0].body["code"] == "too_many_concurrent_requests"
    unlimited = openai_client(api_key, retries=0)  # no limit of its own, none by default: both queue
    assert all(isinstance(o, openai.types.Completion)
               for o in await asyncio.gather(complete(unlimited), complete(unlimited)))
