"""Requests for a model without a routable replica wait (bounded, FIFO) instead of failing, then are
served, or get a 503 that says why with ``Retry-After``; unknown models are a 404, undeployed ones a
503 at once. Against stand-in replicas (fakes.py): the gateway's own logic, no stage processes."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
from django.test import AsyncClient

from controlplane.gateway.serving.decision_log import recorder
from controlplane.gateway.serving.runtime import gateway_stats
from tests.gateway.fakes import Script
from tests.gateway.test_views import post, tokens

pytestmark = pytest.mark.django_db(transaction=True)
BODY = {"model": "demo", "prompt": "x", "max_tokens": 3}


@pytest.fixture
def waits(settings):
    """``waits(**settings)``: the gateway's settings with these waiting ones."""

    def configure(**values) -> None:
        settings.MOTLEY_GATEWAY = {**settings.MOTLEY_GATEWAY, **values}

    return configure


async def timed_post(body=BODY, key: str = "") -> tuple[object, float]:
    started = time.monotonic()
    response = await post(AsyncClient(), "/v1/completions", body, key)
    return response, time.monotonic() - started


async def until(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def depth() -> int:
    from controlplane.gateway.serving.runtime import gateway

    return len(gateway().waiting.queue("demo"))


async def test_a_replica_that_never_serves_gets_a_503_after_the_wait_with_its_reason(fake_pipeline, api_key,
                                                                                    waits):
    fake = fake_pipeline({"r0": Script(tokens=[5, 6, 7], healthy=False)})
    waits(WAIT_S=0.5, RETRY_AFTER_S=7)
    response, took = await timed_post(key=api_key)
    assert response.status_code == 503, response.content
    assert 0.5 <= took < 3
    assert response["Retry-After"] == "7"
    error = response.json()["error"]
    assert error["code"] == "service_unavailable" and error["type"] == "server_error"
    assert "within 0.5 s of waiting" in error["message"] and "r0: stage 1 has not joined" in error["message"]
    assert fake.submitted == []
    waiting = (await gateway_stats())["models"]["demo"]["waiting"]
    assert waiting["depth"] == 0 and waiting["timed_out"] == 1 and waiting["longest_s"] >= 0.5
    assert recorder.recent[-1].outcome == "rejected:unavailable" and recorder.recent[-1].waited_s >= 0.5


async def test_a_model_without_replicas_says_what_its_deployment_is_doing(fake_pipeline, api_key, waits):
    fake = fake_pipeline({})
    fake.reason = "deployment chat is deploying plan revision 3"
    response, took = await timed_post(key=api_key)
    assert response.status_code == 503 and took >= 0.2
    assert "deployment chat is deploying plan revision 3" in response.json()["error"]["message"]
    listed = await AsyncClient().get("/v1/models", headers={"Authorization": f"Bearer {api_key}"})
    assert [m["id"] for m in listed.json()["data"]] == ["demo"]  # it exists: listed, and waited for


async def test_a_replica_that_becomes_ready_during_the_wait_serves_the_waiting_requests_in_order(
    fake_pipeline, api_key, demo_model, waits
):
    fake = fake_pipeline({"r0": Script(tokens=tokens(demo_model, "ok then"), healthy=False)})
    waits(WAIT_S=10, REFRESH_S=5)  # only the fast polling while requests wait can find it in time
    first = asyncio.ensure_future(timed_post({**BODY, "prompt": "first"}, api_key))
    await until(lambda: depth() == 1)
    second = asyncio.ensure_future(timed_post({**BODY, "prompt": "second"}, api_key))
    await until(lambda: depth() == 2)
    await asyncio.sleep(0.3)
    fake.scripts["r0"].healthy = True
    (one, took_one), (two, _) = await asyncio.gather(first, second)
    assert one.status_code == two.status_code == 200, (one.content, two.content)
    assert 0.3 <= took_one < 2
    prompts = [s["prompt_ids"] for s in fake.submitted]
    assert prompts == [tokens(demo_model, "first"), tokens(demo_model, "second")]  # first come, first served
    waiting = (await gateway_stats())["models"]["demo"]["waiting"]
    assert (waiting["depth"], waiting["admitted"], waiting["waited"]) == (0, 2, 2)
    assert waiting["longest_s"] >= 0.3 and waiting["avg_s"] >= 0.3
    assert all(r.waited_s >= 0.3 for r in recorder.recent)


async def test_a_full_queue_is_a_503_at_once(fake_pipeline, api_key, waits):
    fake = fake_pipeline({"r0": Script(tokens=[5, 6, 7], healthy=False)})
    waits(WAIT_S=10, MAX_WAITING=1)
    waiting = asyncio.ensure_future(timed_post(key=api_key))
    await until(lambda: depth() == 1)
    refused, took = await timed_post(key=api_key)
    assert refused.status_code == 503 and took < 1 and refused["Retry-After"]
    assert "1 requests of model 'demo' already wait" in refused.json()["error"]["message"]
    fake.scripts["r0"].healthy = True
    assert (await waiting)[0].status_code == 200
    assert (await gateway_stats())["models"]["demo"]["waiting"]["full"] == 1


async def test_a_model_with_no_way_to_serve_is_a_503_with_retry_after_at_once_and_ends_the_waits(
    fake_pipeline, api_key, waits, settings
):
    fake = fake_pipeline({})
    fake.reason = "deployment chat (degraded) has no ready replica: re-plan failed: infeasible"
    waits(WAIT_S=30)
    waiting = asyncio.ensure_future(timed_post(key=api_key))  # deploying, as far as it knows: it waits
    await until(lambda: depth() == 1)
    fake.cannot_serve = True
    (ended, ended_after), (refused, took) = await asyncio.gather(waiting, timed_post(key=api_key))
    for response in (ended, refused):
        assert response.status_code == 503 and response["Retry-After"] == str(
            math.ceil(settings.MOTLEY_RECONCILE_INTERVAL_S))
        assert "cannot be served now: deployment chat (degraded)" in response.json()["error"]["message"]
    assert took < 1 and ended_after < 2  # not the 30 s wait


async def test_an_unknown_model_is_a_404_and_an_undeployed_one_a_503_at_once(fake_pipeline, api_key):
    from controlplane.models_catalog.services import model_register
    from tests.dashboard.seed import _checkpoint_stand_in

    fake_pipeline({"r0": Script(tokens=[5])})
    model = await asyncio.to_thread(lambda: model_register(path=_checkpoint_stand_in()))
    unknown, _ = await timed_post({**BODY, "model": "nope"}, api_key)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    undeployed, took = await timed_post({**BODY, "model": model.name}, api_key)
    assert undeployed.status_code == 503 and took < 0.2, undeployed.content
    assert undeployed.json()["error"]["message"].startswith(f"The model '{model.name}' has no deployment")
    assert "Retry-After" not in undeployed


async def test_waits_are_in_the_metrics(fake_pipeline, api_key, waits):
    from tests.observability.conftest import Scrape

    async def scrape() -> Scrape:
        return Scrape((await AsyncClient().get("/metrics")).content.decode())

    fake = fake_pipeline({"r0": Script(tokens=[5, 6, 7], healthy=False)})
    waits(WAIT_S=10)
    before = await scrape()
    waiting = asyncio.ensure_future(timed_post(key=api_key))
    await until(lambda: depth() == 1)
    assert (await scrape()).value("motley_gateway_waiting_requests", model_name="demo") == 1
    await asyncio.sleep(0.2)
    fake.scripts["r0"].healthy = True
    assert (await waiting)[0].status_code == 200
    after = await scrape()
    assert after.value("motley_gateway_waiting_requests", model_name="demo") == 0
    count = "motley_gateway_wait_seconds_count"
    labels = {"model_name": "demo", "outcome": "admitted"}
    assert after.value(count, **labels) - before.value(count, 0.0, **labels) == 1
    assert after.value("motley_gateway_wait_seconds_sum", **labels) >= 0.2



async def test_a_replica_re_planned_with_its_head_elsewhere_is_served_through_a_new_client(
        fake_pipeline, api_key, waits):
    """A pipeline keeps its id when re-planned in place around a lost node, but its head may move: the
    gateway follows the new address (it asked the dead one for ever: 503s after the wait)."""
    from controlplane.gateway.serving.runtime import gateway

    fake = fake_pipeline({"d1-r0": Script(tokens=[5, 6, 7])})
    waits(WAIT_S=5.0, CLIENT_TIMEOUT_S=0.05)
    assert (await timed_post(key=api_key))[0].status_code == 200
    fake.heads["d1-r0"] = "tcp://elsewhere/d1-r0"
    await asyncio.sleep(0.1)  # past REFRESH_S: the next request reads the served models again
    response, _ = await timed_post(key=api_key)
    assert response.status_code == 200, response.content
    assert (await gateway().route("demo")).clients["d1-r0"].head_address == "tcp://elsewhere/d1-r0"
    assert len(fake.submitted) == 2
    await until(lambda: fake.closed == ["tcp://fake/d1-r0"])  # once its requests had time to end


async def test_the_clients_of_pipelines_no_longer_served_are_closed(fake_pipeline, api_key, waits):
    """A pipeline replaced beside, or a model no longer deployed, leaves no client (and its sockets)
    behind; one still served keeps its own."""
    from controlplane.gateway.serving.runtime import gateway

    fake = fake_pipeline({"d1-r0": Script(tokens=[5]), "d1-r1": Script(tokens=[6])})
    waits(CLIENT_TIMEOUT_S=0.05)
    assert (await timed_post(key=api_key))[0].status_code == 200
    assert set((await gateway().route("demo")).clients) == {"d1-r0", "d1-r1"}
    del fake.scripts["d1-r0"]  # the old pipeline of a handover beside, stopped
    await asyncio.sleep(0.1)
    assert set((await gateway().route("demo")).clients) == {"d1-r1"}
    await until(lambda: fake.closed == ["tcp://fake/d1-r0"])
    fake.scripts.clear()
    fake.reason = "stopped"  # the model's deployment stopped: a route without replicas
    await asyncio.sleep(0.1)
    assert (await gateway().route("demo")).clients == {}
    await until(lambda: sorted(fake.closed) == ["tcp://fake/d1-r0", "tcp://fake/d1-r1"])


async def test_a_waiting_request_goes_within_a_head_poll_of_its_head_saying_ok(fake_pipeline, api_key, waits):
    """While requests wait, a head that has not said ok is asked every WAIT_HEAD_POLL_S, not only at
    each re-read of the served models (WAIT_POLL_S, here far longer than the wait)."""
    fake = fake_pipeline({"r0": Script(tokens=[5, 6, 7], healthy=False)})
    waits(WAIT_S=10, REFRESH_S=5, WAIT_POLL_S=4, WAIT_HEAD_POLL_S=0.02)
    waiting = asyncio.ensure_future(timed_post(key=api_key))
    await until(lambda: depth() == 1)
    await asyncio.sleep(0.3)
    fake.scripts["r0"].healthy = True
    flipped = time.monotonic()
    response, _ = await waiting
    assert response.status_code == 200, response.content
    assert time.monotonic() - flipped < 2  # a re-read of the served models would come 4 s after the first
