"""The gateway with heads that report prefix summaries (stand-in pipeline clients): a prompt goes to
the replica whose head holds its prefix, the router API shows the cached tokens each replica was
expected to hold, and a malformed summary is logged once and routed around as if it were absent."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from django.test import AsyncClient
from rest_framework.authtoken.models import Token

from contracts.prefix_cache import PrefixSummary, block_hashes, chain_seed
from controlplane.gateway.openai.tokenization import ModelTokenizer
from controlplane.gateway.serving.decision_log import recorder
from tests.gateway.fakes import Script
from tests.gateway.test_live_health import replica, settle

pytestmark = pytest.mark.django_db(transaction=True)
HISTORY = "You are a careful assistant. Answer in one short sentence. " * 4
BLOCK = 16


def held_by(replica: str, prompt_ids: list[int]) -> PrefixSummary:
    """The summary of a head (pipeline ``replica``) that served ``prompt_ids`` before."""
    seed = chain_seed("demo", replica, 1)
    return PrefixSummary.of(seed, BLOCK, block_hashes(prompt_ids, BLOCK, seed), 1024)


async def complete(api_key: str, prompt: str) -> dict:
    response = await AsyncClient().post(
        "/v1/completions", json.dumps({"model": "demo", "prompt": prompt, "max_tokens": 2}),
        content_type="application/json", headers={"Authorization": f"Bearer {api_key}"})
    assert response.status_code == 200, response.content
    return response.json()


async def router_api(django_user_model) -> dict:
    user, _ = await django_user_model.objects.aget_or_create(username="operator")
    token, _ = await Token.objects.aget_or_create(user=user)
    response = await AsyncClient().get("/api/v1/gateway/router/",
                                       headers={"Authorization": f"Token {token.key}"})
    assert response.status_code == 200
    return response.json()


async def test_a_prompt_goes_where_its_prefix_is_and_the_router_api_shows_why(fake_pipeline, api_key,
                                                                               demo_model, django_user_model):
    history = ModelTokenizer.load(demo_model).encode_prompt(HISTORY)
    assert len(history) > 2 * BLOCK
    fake_pipeline({"r0": Script(tokens=[5, 6], prefix_cache=held_by("r0", [1, 2, 3] * 20)),
                   "r1": Script(tokens=[5, 6], prefix_cache=held_by("r1", history))})
    await complete(api_key, HISTORY + "And now?")
    (record,) = recorder.recent
    expected = len(history) // BLOCK * BLOCK
    assert record.replica == "r1" and record.cached_tokens == expected
    assert {i["replica"]: i["cached_tokens"] for i in record.inputs} == {"r0": 0, "r1": expected}
    body = await router_api(django_user_model)
    replicas = body["models"]["demo"]["replicas"]
    assert body["router"]["recent"][-1]["cached_tokens"] == expected
    summary = replicas["r1"]["router"]["prefix_cache"]
    assert summary["reported"] and summary["block_size"] == BLOCK and summary["bloom_bytes"] == 1024
    assert 0 < summary["fill"] < 0.5
    shown = replicas["r1"]["pipeline"]["prefix_cache"]  # the head's statistics, its filter by size only
    assert "bloom" not in shown and shown["bloom_bytes"] == 1024 and shown["block_size"] == BLOCK


async def test_a_malformed_summary_is_logged_once_and_ignored(fake_pipeline, api_key, demo_model,
                                                            django_user_model, caplog):
    history = ModelTokenizer.load(demo_model).encode_prompt(HISTORY)
    fake_pipeline({"r0": Script(tokens=[5, 6], prefix_cache={"seed": "not a number", "block_size": 16}),
                   "r1": Script(tokens=[5, 6], prefix_cache=None)})
    with caplog.at_level(logging.WARNING, logger="controlplane.gateway.serving.live_health"):
        await complete(api_key, HISTORY)
        await asyncio.sleep(0.3)  # several polls (every 50 ms) of the same malformed summary
        await complete(api_key, HISTORY)
    warnings = [r for r in caplog.records if "malformed prefix summary" in r.getMessage()]
    assert len(warnings) == 1 and "r0" in warnings[0].getMessage()
    first, second = recorder.recent
    assert first.replica == "r0" and second.replica == "r0"  # still healthy and routed to: equal replicas
    assert {i["replica"]: i["cached_tokens"] for i in second.inputs} == {"r0": None, "r1": None}
    r0 = (await router_api(django_user_model))["models"]["demo"]["replicas"]["r0"]["router"]
    assert r0["healthy"] and not r0["prefix_cache"]["reported"]
    assert "malformed prefix summary" in r0["prefix_cache"]["error"]
    # Mended: read at the next poll.
    fake_pipeline({"r0": Script(tokens=[5, 6], prefix_cache=held_by("r0", history)),
                   "r1": Script(tokens=[5, 6])})
    await settle(lambda: replica("r0").prefix_summary is not None)
    await complete(api_key, HISTORY + "Again?")
    assert recorder.recent[-1].cached_tokens == len(history) // BLOCK * BLOCK
