"""Key limits through the /v1/ endpoints: 429s naming the limit with Retry-After, recovery after the
window, tokens per minute and budgets counting what was served, keys restricted to models."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from controlplane.gateway.accounts import quotas, usage_backlog
from controlplane.gateway.accounts.services import api_key_create
from controlplane.gateway.models import ApiKey, UsageBucket
from tests.gateway.fakes import Script

pytestmark = pytest.mark.django_db(transaction=True)

T0 = 1_800_000_000.0  # a window start (a multiple of 60) and, in UTC, 2027-01-15 08:00


@pytest.fixture
def clock(monkeypatch):
    """The quotas' clock, stepped by the test: ``clock.now = …``."""

    class Clock:
        now = T0 + 15

        def __call__(self) -> float:
            return self.now

    fake = Clock()
    monkeypatch.setattr(quotas, "clock", fake)
    return fake


@pytest.fixture
def limited(django_user_model):
    def make(**limits) -> tuple[ApiKey, str]:
        user, _ = django_user_model.objects.get_or_create(username="quota-user")
        api_key, raw = api_key_create(user=user, name="limited")
        ApiKey.objects.filter(pk=api_key.pk).update(**limits)
        api_key.refresh_from_db()
        return api_key, raw
    return make


async def complete(key: str, *, max_tokens: int = 4, model: str = "demo", prompt="hello"):
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens}
    return await AsyncClient().post("/v1/completions", json.dumps(body), content_type="application/json",
                                    headers={"Authorization": f"Bearer {key}"})


async def test_requests_per_minute_refuse_the_next_with_retry_after_and_recover(fake_pipeline, limited,
                                                                                 clock):
    fake_pipeline({"r0": Script(tokens=[5, 6, 7])})
    api_key, raw = await _make(limited, requests_per_minute=3)
    for _ in range(3):
        assert (await complete(raw)).status_code == 200
    refused = await complete(raw)
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] is None
    assert (error["type"], error["code"]) == ("rate_limit_exceeded", "rate_limit_exceeded")
    assert "rate limit of 3 requests per minute" in error["message"] and api_key.prefix in error["message"]
    assert refused["Retry-After"] == "45"  # 15 s into the minute
    assert refused["x-ratelimit-limit-requests"] == "3"
    clock.now = T0 + 59.5
    assert (await complete(raw)).status_code == 429
    clock.now = T0 + 60  # the next window
    assert (await complete(raw)).status_code == 200
    assert await sync_to_async(usage_backlog.flush)()
    rows = [row async for row in UsageBucket.objects.order_by("bucket_start")]
    assert [(r.requests, r.refused) for r in rows] == [(3, 2), (1, 0)]


async def _make(limited, **limits):
    return await sync_to_async(limited)(**limits)


async def test_tokens_per_minute_reserve_max_tokens_and_count_what_was_served(fake_pipeline, limited, clock):
    """prompt + max_tokens is reserved while a request runs; at its end only what it was served stays."""
    fake_pipeline({"r0": Script(tokens=[5, 6])})  # 2 completion tokens, whatever max_tokens asks
    api_key, raw = await _make(limited, tokens_per_minute=40)
    first = await complete(raw, max_tokens=20, prompt=[1, 2, 3])
    assert first.status_code == 200 and first.json()["usage"]["total_tokens"] == 5  # 3 + 2, not 3 + 20
    for _ in range(3):  # 5 tokens each: 20 in all (had each kept its 23 reserved, the third would fail)
        assert (await complete(raw, max_tokens=20, prompt=[1, 2, 3])).status_code == 200
    refused = await complete(raw, max_tokens=20, prompt=[1, 2, 3])  # 20 + 23 > 40
    assert refused.status_code == 429 and refused["Retry-After"] == "45"
    message = refused.json()["error"]["message"]
    assert "rate limit of 40 tokens per minute" in message and "20 are counted" in message
    assert "needs up to 23 (prompt 3 + max_tokens 20)" in message
    assert (await complete(raw, max_tokens=2, prompt=[1, 2, 3])).status_code == 200  # 20 + 5 fits
    too_large = await complete(raw, max_tokens=50, prompt=[1, 2, 3])
    assert (too_large.status_code == 429
            and "alone needs up to 53 tokens" in too_large.json()["error"]["message"])
    assert "Retry-After" not in too_large  # waiting would not help
    clock.now = T0 + 61
    assert (await complete(raw, max_tokens=20, prompt=[1, 2, 3])).status_code == 200


async def test_a_token_budget_counts_served_tokens_and_resets_with_its_period(fake_pipeline, limited, clock):
    fake_pipeline({"r0": Script(tokens=[5, 6, 7, 8])})
    _, raw = await _make(limited, token_budget=30, budget_period="day")
    for _ in range(3):  # 3 prompt + 4 completion = 7 each: 21
        assert (await complete(raw, max_tokens=4, prompt=[1, 2, 3])).status_code == 200
    clock.now = T0 + 3600  # another hour, the same day: the budget is not a rate
    refused = await complete(raw, max_tokens=8, prompt=[1, 2, 3])  # 21 + 11 > 30
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("insufficient_quota", "insufficient_quota")
    assert "budget of 30 tokens per day" in error["message"] and "21 tokens are used" in error["message"]
    assert "resets at 2027-01-16T00:00:00Z" in error["message"]
    assert int(refused["Retry-After"]) == 16 * 3600 - 3600  # to midnight UTC
    assert (await complete(raw, max_tokens=4, prompt=[1, 2, 3])).status_code == 200  # 28 <= 30
    assert (await complete(raw, max_tokens=1, prompt=[1, 2, 3])).status_code == 429  # 28 + 4 > 30
    clock.now = T0 + 16 * 3600  # the next UTC day
    assert (await complete(raw, max_tokens=4, prompt=[1, 2, 3])).status_code == 200


@pytest.mark.parametrize("written", [True, False], ids=["usage-written", "usage-still-queued"])
async def test_a_lost_budget_counter_is_seeded_from_the_stored_usage(
    fake_pipeline, limited, clock, monkeypatch, written
):
    """Also when the usage of the requests just served still waits for its writer (usage_backlog)."""
    from django.core.cache import cache

    if not written:
        monkeypatch.setattr(usage_backlog, "write_soon", lambda: None)
    fake_pipeline({"r0": Script(tokens=[5, 6, 7, 8])})
    _, raw = await _make(limited, token_budget=20, budget_period="month")
    for _ in range(2):  # 14 served this month
        assert (await complete(raw, max_tokens=4, prompt=[1, 2, 3])).status_code == 200
    if written:
        assert await sync_to_async(usage_backlog.flush)()
    await cache.aclear()  # the cache lost every counter (a restart, an eviction)
    assert (await complete(raw, max_tokens=4, prompt=[1, 2, 3])).status_code == 429  # 14 + 7 > 20


async def test_a_key_restricted_to_models_gets_403_naming_the_model(fake_pipeline, limited, clock):
    fake_pipeline({"r0": Script(tokens=[5])})
    _, raw = await _make(limited, allowed_models=["other"])
    refused = await complete(raw, model="demo")
    assert refused.status_code == 403
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("model_not_allowed", "model")
    assert "'demo'" in error["message"] and "other" in error["message"]
    models = await AsyncClient().get("/v1/models", headers={"Authorization": f"Bearer {raw}"})
    assert models.json()["data"] == []  # it does not even see the model
    _, allowed = await _make(limited, allowed_models=["demo"])
    assert (await complete(allowed, model="demo")).status_code == 200


async def test_limits_apply_at_once_when_changed_and_a_key_without_limits_counts_nothing(
    fake_pipeline, limited, clock
):
    from django.core.cache import cache

    fake_pipeline({"r0": Script(tokens=[5])})
    api_key, raw = await _make(limited)
    for _ in range(3):
        assert (await complete(raw)).status_code == 200
    assert not [k for k in cache._cache if "quota" in k]  # LocMemCache: no counter written
    await ApiKey.objects.filter(pk=api_key.pk).aupdate(requests_per_minute=1)
    assert (await complete(raw)).status_code == 200
    assert (await complete(raw)).status_code == 429


async def test_a_request_the_router_refuses_releases_its_reservation(fake_pipeline, limited, clock):
    fake_pipeline({"r0": Script(tokens=[5], healthy=False)})  # no healthy replica: 503
    api_key, raw = await _make(limited, tokens_per_minute=30)
    for _ in range(3):
        assert (await complete(raw, max_tokens=20, prompt=[1, 2, 3])).status_code == 503
    assert await sync_to_async(usage_backlog.flush)()
    row = await UsageBucket.objects.aget(api_key=api_key)
    assert (row.requests, row.errors, row.prompt_tokens, row.completion_tokens) == (3, 3, 0, 0)


async def test_requests_in_flight_hold_their_reservation_until_they_end(fake_pipeline, limited, clock):
    import asyncio

    fake_pipeline({"r0": Script(tokens=[5] * 5, delay_s=0.05)})
    _, raw = await _make(limited, tokens_per_minute=35)
    running = asyncio.ensure_future(complete(raw, max_tokens=20, prompt=[1, 2, 3]))  # reserves 23
    await asyncio.sleep(0.1)
    assert (await complete(raw, max_tokens=20, prompt=[1, 2, 3])).status_code == 429  # 23 + 23 > 35
    assert (await running).json()["usage"]["total_tokens"] == 8
    assert (await complete(raw, max_tokens=20, prompt=[1, 2, 3])).status_code == 200  # 8 + 23 <= 35
