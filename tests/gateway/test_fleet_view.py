"""Several gateway processes, one router view: each process's load reaches the others through Redis
(service mode) and stops counting when the process stops heartbeating; the embedded default keeps
its own view without Redis."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from django.test import AsyncClient
from rest_framework.authtoken.models import Token

from controlplane.gateway.routing import PeerLoad, ReplicaCosts, ReplicaState, RequestShape, Router
from controlplane.gateway.serving.fleet_store import FleetStore, installation_prefix, process_id
from controlplane.gateway.serving.fleet_view import FleetView, peers_of
from tests.gateway.fakes import Script
from tests.support.processes import redis_up, redis_url

REDIS_URL = redis_url(9)  # a database no other test uses
COSTS = ReplicaCosts(0.001, 0.0, 0.02)


def needs_redis() -> None:
    if not redis_up():
        pytest.skip("needs a Redis server")


@pytest.fixture
async def stores():
    """``stores(ttl_s)``: a store of its own per simulated process, all under one fresh key prefix."""
    needs_redis()
    prefix, opened = f"test-fleet-{uuid.uuid4().hex[:8]}", []

    def make(ttl_s: float = 3.0) -> FleetStore:
        opened.append(store := FleetStore(REDIS_URL, prefix=prefix, ttl_s=ttl_s))
        return store

    yield make
    for store in opened:
        await store.close()


def test_one_view_serves_every_event_loop_and_a_cancelled_heartbeat_leaves_none_waiting():
    """A gateway heartbeats on one loop and may answer the router API on another (a handler that runs
    each request on a loop of its own), whose end cancels the heartbeat mid-command: each loop closes
    and the next one reads the store."""
    needs_redis()
    view = FleetView(FleetStore(REDIS_URL, prefix=f"test-fleet-{uuid.uuid4().hex[:8]}"), process="host-a:1")
    mine = replicas()
    mine[0].start("q1", RequestShape(100, 50))

    async def heartbeat_cancelled_at_the_loops_end():
        await view.sync(mine, {})
        asyncio.get_running_loop().create_task(view.sync(mine, {}))  # cancelled by asyncio.run's end
        await asyncio.sleep(0)

    for _ in range(3):
        asyncio.run(asyncio.wait_for(heartbeat_cancelled_at_the_loops_end(), 5))
    assert view.reachable
    assert set(asyncio.run(asyncio.wait_for(view.store.contributions(), 5))) == {"host-a:1"}
    asyncio.run(view.close())


def replicas() -> list[ReplicaState]:
    return [ReplicaState(f"r{i}", COSTS, 1000) for i in range(2)]


async def test_two_processes_see_each_others_requests_in_flight(stores):
    a, b = FleetView(stores(), process="host-a:1"), FleetView(stores(), process="host-b:2")
    mine, theirs = replicas(), replicas()
    mine[0].start("q1", RequestShape(100, 50))
    await a.sync(mine, {"demo": 1})
    await b.sync(theirs, {})
    seen = theirs[0]
    assert seen.peers.in_flight == 1 and seen.in_flight == 1 and seen.queued_tokens == 100
    assert seen.running_tokens == 50 and seen.kv_free == 1000 - 160  # whole 16-token blocks
    assert theirs[1].peers == PeerLoad()
    # b's own request counts at once, a's as of the last heartbeat; the router weighs both
    seen.start("q2", RequestShape(10, 10))
    assert seen.in_flight == 2
    decision = Router(theirs, "least_outstanding_tokens").route(RequestShape(10, 10), deadline_s=30)
    assert decision.replica.replica_id == "r1"
    await b.sync(theirs, {})
    await a.sync(mine, {})
    assert mine[0].in_flight == 2 and mine[0].peers.in_flight == 1
    view = a.snapshot(mine, {})
    assert view["shared"] and view["process"] == "host-a:1"
    assert [p["process"] for p in view["processes"]] == ["host-a:1", "host-b:2"]
    assert view["replicas"]["r0"]["in_flight"] == 2
    assert view["replicas"]["r0"]["by_process"] == {"host-a:1": 1, "host-b:2": 1}


async def test_a_process_that_stops_heartbeating_stops_counting(stores):
    a, b = FleetView(stores(ttl_s=0.3), process="host-a:1"), FleetView(stores(ttl_s=0.3), process="host-b:2")
    mine, theirs = replicas(), replicas()
    mine[0].start("q1", RequestShape(100, 50))
    await a.sync(mine, {})
    await b.sync(theirs, {})
    assert theirs[0].in_flight == 1
    await asyncio.sleep(0.4)  # a is silent (killed) past its time to live
    await b.sync(theirs, {})
    assert theirs[0].in_flight == 0 and set(b.contributions) == {"host-b:2"}
    assert set(await b.store.contributions()) == {"host-b:2"}


async def test_a_closed_process_withdraws_at_once(stores):
    a, b = FleetView(stores(), process="host-a:1"), FleetView(stores(), process="host-b:2")
    mine, theirs = replicas(), replicas()
    mine[1].start("q1", RequestShape(100, 50))
    await a.sync(mine, {})
    await a.close()
    await b.sync(theirs, {})
    assert theirs[1].in_flight == 0


def test_the_error_rate_counts_every_process_outcomes():
    from controlplane.gateway.serving.decision_log import RouterRecorder

    shared = {"me": {"replicas": {}},
              "p1": {"replicas": {"r0": {**_load(1), "outcomes": [4, 1]}}},
              "p2": {"replicas": {"r0": {**_load(2), "outcomes": [6, 2]}}}}
    loads, outcomes = peers_of(shared, "me")
    assert loads["r0"].in_flight == 3 and outcomes == {"r0": (10, 3)}
    rec = RouterRecorder()
    rec.peer_outcomes = outcomes
    assert rec.error_rate("r0") == pytest.approx(0.3)


def _load(n: int) -> dict:
    return {"in_flight": n, "unstarted": 0, "queued_tokens": 0, "kv_reserved": 16 * n,
            "running": [[10, 5]] * n}


async def test_the_embedded_default_keeps_its_own_view_without_redis(settings):
    settings.MOTLEY_CACHE_URL = ""
    view = FleetView.connect()
    assert view.store is None and view.process == process_id()
    mine = replicas()
    mine[0].start("q1", RequestShape(100, 50))
    await view.sync(mine, {})
    assert mine[0].peers == PeerLoad() and mine[0].in_flight == 1
    snapshot = view.snapshot(mine, {})
    assert not snapshot["shared"] and snapshot["ttl_s"] is None
    assert snapshot["replicas"]["r0"]["by_process"] == {process_id(): 1}
    await view.close()


async def test_an_unreachable_redis_leaves_each_process_its_own_view():
    from tests.support.processes import free_port

    view = FleetView(FleetStore(f"redis://127.0.0.1:{free_port()}/0"), process="host-a:1")
    mine = replicas()
    mine[0].peers = PeerLoad(in_flight=3)
    mine[0].start("q1", RequestShape(100, 50))
    await view.sync(mine, {})
    assert not view.reachable and mine[0].peers == PeerLoad() and mine[0].in_flight == 1
    await view.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["embedded", "redis"])
async def test_the_router_api_shows_the_fleet_and_which_process_decided(
        mode, settings, fake_pipeline, demo_model, api_key, django_user_model):
    from controlplane.gateway.openai.tokenization import ModelTokenizer
    from controlplane.gateway.serving.runtime import gateway

    other = None
    if mode == "redis":
        needs_redis()
        settings.MOTLEY_CACHE_URL = REDIS_URL
        other = FleetView(FleetStore(REDIS_URL, prefix=installation_prefix()), process="other-host:7")
        busy = [ReplicaState("r0", COSTS, 1000)]
        busy[0].start("elsewhere", RequestShape(20, 20))
        await other.sync(busy, {"demo": 2})
    else:
        settings.MOTLEY_CACHE_URL = ""
    tokens = ModelTokenizer.load(demo_model).encode_prompt("hello world")
    fake_pipeline({"r0": Script(tokens=tokens), "r1": Script(tokens=tokens)})
    client = AsyncClient()
    request = json.dumps({"model": "demo", "prompt": "x", "max_tokens": 2})
    response = await client.post("/v1/completions", request, content_type="application/json",
                                 headers={"Authorization": f"Bearer {api_key}"})
    assert response.status_code == 200, response.content
    token = await Token.objects.acreate(user=await django_user_model.objects.acreate(username="operator"))
    try:
        if other is not None:  # the other process's request reaches this one's router within a heartbeat
            (r0,) = (r for r in gateway().routes["demo"].router.replicas if r.replica_id == "r0")
            for _ in range(50):
                if r0.peers.in_flight:
                    break
                await asyncio.sleep(0.05)
            assert r0.peers.in_flight == 1
            for _ in range(50):  # this process's ended decision, published for the others
                if any(r["process"] == process_id() for r in await other.store.decisions()):
                    break
                await asyncio.sleep(0.05)
            assert [r["replica"] for r in await other.store.decisions() if r["process"] == process_id()]
        body = (await client.get("/api/v1/gateway/router/",
                                 headers={"Authorization": f"Token {token.key}"})).json()
    finally:
        if other is not None:
            await other.close()
    fleet = body["fleet"]
    assert fleet["process"] == process_id() and fleet["shared"] is (mode == "redis")
    assert body["router"]["recent"][-1]["process"] == process_id()
    if mode == "redis":
        assert {p["process"] for p in fleet["processes"]} == {process_id(), "other-host:7"}
        assert fleet["replicas"]["r0"]["by_process"]["other-host:7"] == 1
        assert fleet["ttl_s"] == 3.0
    else:
        assert [p["process"] for p in fleet["processes"]] == [process_id()]
