"""Key limits hold across gateway processes: two daphne servers on one installation share the counters
(Redis in service mode, the SQLite cache under var/cache/ in the embedded default). Requests spread over
both are refused at the limit with 429 and Retry-After, and served again once the window passed; the
usage either server reports is the sum of both."""

from __future__ import annotations

import math
import time

import httpx
import openai
import pytest

from tests.support.processes import (
    database_migrate,
    manage_shell_json,
    redis_up,
    redis_url,
)
from tests.telemetry.test_shared_state import Server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
REDIS_URL = redis_url(12)  # a database no other test uses
# Seven requests fall in one window: a few seconds of them on a loaded machine.
WINDOW_S = 6.0

SEED = """
import json
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from controlplane.gateway.accounts.services import api_key_create
ops = get_user_model().objects.create_user("ops", is_staff=True)
_, free = api_key_create(user=ops, name="free")
_, rpm = api_key_create(user=ops, name="rpm", limits={"requests_per_minute": 4})
_, budget = api_key_create(user=ops, name="budget", limits={"token_budget": 15, "budget_period": "day"})
print("SEED=" + json.dumps({"free": free, "rpm": rpm, "budget": budget,
                           "token": Token.objects.create(user=ops).key}))
"""


def install(var_dir, demo_model, service: bool) -> tuple[dict, dict]:
    from tests.support.processes import embedded_env

    env = embedded_env(var_dir)
    env.update(DJANGO_SETTINGS_MODULE="tests.gateway.quota_server", MOTLEY_TEST_DEMO_MODEL=str(demo_model),
               MOTLEY_TEST_QUOTA_WINDOW_S=str(WINDOW_S))
    if service:
        env["CHANNEL_REDIS_URL"] = REDIS_URL  # and so the cache
    database_migrate(env)
    return env, manage_shell_json(env, SEED, "SEED")


def complete(server: Server, key: str, **body) -> httpx.Response:
    body = {"model": "demo", "prompt": [1, 2, 3], "max_tokens": 3, **body}
    return httpx.post(f"{server.url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                      timeout=10)


def next_window() -> None:
    """Sleep to just after a window starts, so a burst of requests falls in one window."""
    now = time.time()
    time.sleep(math.floor(now / WINDOW_S) * WINDOW_S + WINDOW_S + 0.05 - now)


@pytest.fixture(params=["embedded", pytest.param("service", marks=pytest.mark.service)])
def servers(request, tmp_path, demo_model):
    service = request.param == "service"
    if service and not redis_up():
        pytest.skip("service mode: needs a Redis server")
    env, seed = install(tmp_path / "var", demo_model, service)
    first = Server(env, tmp_path / "first.log")
    try:
        second = Server(env, tmp_path / "second.log")
        try:
            for server in (first, second):  # load the tokenizer and find the replica
                assert complete(server, seed["free"]).status_code == 200, (
                    (tmp_path / "first.log").read_text()[-3000:])
            yield first, second, seed
        finally:
            second.stop()
    finally:
        first.stop()
    if service:
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        for key in client.scan_iter("motley:*quota:*"):
            client.delete(key)


def test_limits_hold_across_two_gateway_processes_and_recover_after_the_window(servers):
    first, second, seed = servers
    next_window()
    statuses = [complete(server, seed["rpm"]).status_code for server in (first, second, first, second)]
    assert statuses == [200] * 4
    for server in (first, second):  # the fifth request, whichever process gets it
        refused = complete(server, seed["rpm"])
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert f"rate limit of 4 requests per {WINDOW_S:g} s window" in refused.json()["error"]["message"]
        assert 1 <= int(refused.headers["Retry-After"]) <= WINDOW_S
    client = openai.OpenAI(base_url=f"{first.url}/v1", api_key=seed["rpm"], max_retries=0)
    with pytest.raises(openai.RateLimitError) as caught:  # what OpenAI's own client makes of it
        client.completions.create(model="demo", prompt=[1, 2, 3], max_tokens=3)
    assert caught.value.code == "rate_limit_exceeded"
    time.sleep(int(caught.value.response.headers["Retry-After"]))
    assert [complete(server, seed["rpm"]).status_code for server in (second, first)] == [200, 200]

    # A budget of 15 tokens, 6 served per request (prompt 3 + 3 tokens): the third is refused anywhere.
    assert [complete(server, seed["budget"]).status_code for server in (first, second)] == [200, 200]
    for server in (first, second):
        refused = complete(server, seed["budget"])
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "insufficient_quota"
        assert "12 tokens are used" in refused.json()["error"]["message"]

    usage = httpx.get(f"{second.url}/api/v1/usage/", params={"group_by": "key"},
                      headers={"Authorization": f"Token {seed['token']}"}, timeout=10).json()
    by_key = {row["group"].split(" ")[0]: row for row in usage["totals"]}
    assert (by_key["rpm"]["requests"], by_key["rpm"]["refused"], by_key["rpm"]["total_tokens"]) == (6, 3, 36)
    assert (by_key["budget"]["requests"], by_key["budget"]["refused"],
            by_key["budget"]["total_tokens"]) == (2, 2, 12)
