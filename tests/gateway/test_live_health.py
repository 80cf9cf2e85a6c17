"""The gateway fed by the agents' telemetry (kept as the agents' socket keeps it): a throttled device
moves requests to the other replica and back, a silent agent's replica is avoided, and the router
statistics API shows the inputs of every decision."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from django.test import AsyncClient
from rest_framework.authtoken.models import Token

from controlplane.gateway.routing import StageLink
from controlplane.gateway.serving.decision_log import recorder
from controlplane.telemetry.services import telemetry_keep, telemetry_sample
from tests.gateway.fakes import Script

pytestmark = pytest.mark.django_db(transaction=True)
GB = 1 << 30


def gpu(*, clock: int = 1590, reasons: tuple[str, ...] = ()) -> dict:
    return {"index": 0, "utilization_pct": 50.0, "memory_used_bytes": 4 * GB, "memory_total_bytes": 16 * GB,
            "temperature_c": 60.0, "power_w": 50.0, "power_limit_w": 70.0, "sm_clock_mhz": clock,
            "sm_clock_max_mhz": 1590, "throttle_reasons": list(reasons), "pcie_tx_bytes_per_s": 0.0,
            "pcie_rx_bytes_per_s": 0.0, "emulated": True}


def report(node: str, stage_key: str, *, age_s: float = 0.0, step_ms: float = 10.0, **device) -> None:
    """One heartbeat of ``node`` (its one GPU and one stage), received ``age_s`` ago."""
    stats = {"step_ms": step_ms, "batch_size": 1.0, "queue_depth": 0, "kv_tokens_free": 4000}
    heartbeat = {"devices": [gpu(**device)],
                 "stages": [{"stage_key": stage_key, "state": "ready", "stats": stats}]}
    telemetry_keep(telemetry_sample(node_id=hash(node) % 1000, node_name=node, heartbeat=heartbeat,
                                    received_at=time.time() - age_s))


@pytest.fixture
def two_replicas(fake_pipeline, demo_model):
    """Replicas r0 (stage d1-r0-s0 on n0/gpu0) and r1 (d1-r1-s0 on n1/gpu0), both reporting."""
    from controlplane.gateway.openai.tokenization import ModelTokenizer

    tokens = ModelTokenizer.load(demo_model).encode_prompt("hello world")
    fake = fake_pipeline({
        f"r{i}": Script(tokens=tokens, stages=(StageLink(f"d1-r{i}-s0", f"n{i}/gpu0"),)) for i in range(2)
    })
    for i in range(2):
        report(f"n{i}", f"d1-r{i}-s0")
    return fake


async def chosen(api_key: str, n: int = 4) -> list[str | None]:
    """Send ``n`` requests one after the other; which replica served each (None: refused)."""
    client, served = AsyncClient(), []
    for _ in range(n):
        before = len(recorder.recent)
        response = await client.post("/v1/completions",
                                     json.dumps({"model": "demo", "prompt": "x", "max_tokens": 2}),
                                     content_type="application/json",
                                     headers={"Authorization": f"Bearer {api_key}"})
        record = list(recorder.recent)[before] if len(recorder.recent) > before else None
        served.append(record.replica if response.status_code == 200 else None)
    return served


async def settle(predicate, timeout_s: float = 3.0) -> None:
    """Wait for the background refresh (50 ms in these tests) to take a new sample in."""
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert predicate()


def replica(name: str):
    from controlplane.gateway.serving.runtime import gateway

    return next(r for route in gateway().routes.values() for r in route.router.replicas
                if r.replica_id == name)


async def test_a_throttled_device_sends_requests_to_the_other_replica_and_they_return(two_replicas, api_key):
    assert await chosen(api_key) == ["r0"] * 4  # equal replicas: the first one
    report("n0", "d1-r0-s0", clock=795, reasons=("hw_thermal",))
    await settle(lambda: replica("r0").health.throttle > 0.4)
    assert await chosen(api_key) == ["r1"] * 4
    decision = list(recorder.recent)[-1]
    seen = {i["replica"]: i for i in decision.inputs}
    assert seen["r0"]["throttle"] == pytest.approx(0.5) and seen["r0"]["slowdown"] == pytest.approx(2.0)
    assert seen["r1"]["estimated_finish_s"] < seen["r0"]["estimated_finish_s"]
    report("n0", "d1-r0-s0")  # recovered
    await settle(lambda: replica("r0").health.throttle == 0)
    assert await chosen(api_key) == ["r0"] * 4


async def test_a_silent_agent_makes_its_replica_avoided_and_all_silent_is_a_503_saying_why(two_replicas,
                                                                                           api_key):
    assert await chosen(api_key, 1) == ["r0"]
    report("n0", "d1-r0-s0", age_s=10)  # n0's agent went silent 10 s ago (its last sample stays cached)
    await settle(lambda: not replica("r0").health.ok)
    assert "telemetry" in replica("r0").health.reason and "old" in replica("r0").health.reason
    assert await chosen(api_key) == ["r1"] * 4
    report("n1", "d1-r1-s0", age_s=10)
    await settle(lambda: not replica("r1").health.ok)
    response = await AsyncClient().post(
        "/v1/completions", json.dumps({"model": "demo", "prompt": "x", "max_tokens": 2}),
        content_type="application/json", headers={"Authorization": f"Bearer {api_key}"})
    assert response.status_code == 503
    message = response.json()["error"]["message"]
    assert "r0: stage d1-r0-s0: telemetry" in message and "r1: stage d1-r1-s0: telemetry" in message
    report("n0", "d1-r0-s0")  # n0 speaks again
    await settle(lambda: replica("r0").health.ok)
    assert await chosen(api_key, 1) == ["r0"]


async def test_measured_step_times_replace_the_planned_costs(two_replicas, api_key):
    await chosen(api_key, 1)
    for _ in range(3):  # three distinct samples: r0's steps take 40 ms, r1's 10 ms
        report("n0", "d1-r0-s0", step_ms=40.0)
        report("n1", "d1-r1-s0", step_ms=10.0)
        await asyncio.sleep(0.15)
    await settle(lambda: replica("r0").costs_source == "measured"
                 and replica("r1").costs_source == "measured")
    assert replica("r0").costs.decode_step_s == pytest.approx(4 * replica("r1").costs.decode_step_s)
    assert await chosen(api_key, 2) == ["r1", "r1"]


async def test_the_router_api_shows_the_inputs_of_every_replica_and_decision(two_replicas, api_key,
                                                                             django_user_model):
    report("n1", "d1-r1-s0", clock=795, reasons=("power_cap",))
    await chosen(api_key, 1)
    await settle(lambda: replica("r1").health.throttle > 0.4)
    await chosen(api_key, 1)
    anonymous = await AsyncClient().get("/api/v1/gateway/router/")
    assert anonymous.status_code == 401 and anonymous["WWW-Authenticate"] == "Token"
    user = await django_user_model.objects.acreate(username="operator")
    token = await Token.objects.acreate(user=user)
    response = await AsyncClient().get("/api/v1/gateway/router/",
                                       headers={"Authorization": f"Token {token.key}"})
    assert response.status_code == 200
    body = response.json()
    assert body["settings"]["live_telemetry"] is True and body["settings"]["telemetry_stale_s"] == 3.0
    r1 = body["models"]["demo"]["replicas"]["r1"]
    assert r1["stages"] == [{"stage_key": "d1-r1-s0", "device": "n1/gpu0"}]
    router = r1["router"]
    assert (router["healthy"] and router["health"]["throttle"] == pytest.approx(0.5)
            and router["slowdown"] == 2.0)
    assert router["costs_source"] == "assumed" and router["planned_costs"]["source"] == "assumed"
    assert router["head"]["ok"] and router["head"]["age_s"] < 5
    (device,) = router["telemetry"]["devices"]
    assert device["throttle_reasons"] == ["power_cap"] and device["age_s"] < 5
    assert router["telemetry"]["stages"][0]["step_ms"] == 10.0
    last = body["router"]["recent"][-1]
    assert last["replica"] == "r0"
    assert {i["replica"] for i in last["inputs"]} == {"r0", "r1"}
    assert set(last["inputs"][0]) >= {"healthy", "reason", "slowdown", "throttle", "memory_pressure",
                                      "error_rate", "costs_source", "kv_free", "outstanding_tokens",
                                      "estimated_finish_s"}


async def test_failed_requests_raise_the_replicas_error_rate(fake_pipeline, api_key, demo_model):
    from contracts.pipeline_errors import PipelineError

    fake_pipeline({"r0": Script(error=PipelineError("boom")), "r1": Script()})
    await chosen(api_key, 2)
    assert recorder.error_rate("r0") >= 0.2
    await settle(lambda: replica("r0").health.error_rate >= 0.2)
    assert replica("r0").health.slowdown >= 3.0


def test_the_error_rate_counts_the_replicas_faults_over_a_recent_window():
    from controlplane.gateway.serving.decision_log import RouteRecord, RouterRecorder

    rec = RouterRecorder()
    for i, outcome in enumerate(["completed"] * 6 + ["failed:broken", "failed:rejected", "cancelled",
                                                      "failed:deadline"]):
        rec.record(RouteRecord(f"q{i}", "demo", "cost_aware", 0.0, "r0", "running"))
        rec.finished(f"q{i}", outcome, 1.0, 1)
    assert rec.error_rate("r0") == pytest.approx(1 / 9)  # cancelled is the client's; 429/504 are load
    assert rec.error_rate("r0", now=time.monotonic() + 120) == 0.0
    assert rec.error_rate("other") == 0.0


def test_the_heads_free_kv_is_compared_with_the_bookkeeping_of_the_moment_it_answered():
    """A periodic refresh must not count a request finished since the head's answer as someone else's."""
    from controlplane.gateway.routing import ReplicaCosts, ReplicaState, RequestShape
    from controlplane.gateway.serving.directory import ReplicaEndpoint
    from controlplane.gateway.serving.live_health import LiveHealth

    live, endpoint = LiveHealth(), ReplicaEndpoint("r0", "tcp://head", "t", kv_tokens=1000)
    state = ReplicaState("r0", ReplicaCosts(0.001, 0.0, 0.02), 1000)
    state.start("a", RequestShape(100, 60))  # 160 tokens reserved
    live.head_answered("r0", {"ok": True, "kv_tokens_free_by_stage": {"0": 740}, "queue_depth": 0})
    live.apply(state, endpoint, head_answer=True)
    assert state.health.ok and state.kv_free == 740  # 100 used by another gateway
    state.finish("a")
    live.apply(state, endpoint)  # the telemetry refresh, later: the head's figure is old
    assert state.kv_free == 900


def test_a_stage_state_sampled_before_the_heads_ok_does_not_hold_the_replica_back():
    """After an in-place handover the head serves again before the agent's next heartbeat says its
    restarted stages are ready: a "starting" sampled before the head's "ok" is superseded (it kept the
    replica unroutable up to 1.5 s, replacement_bench: 0.9 s); one sampled after it still counts."""
    from controlplane.gateway.routing import DeviceSample, ReplicaCosts, ReplicaState, StageSample
    from controlplane.gateway.serving.directory import ReplicaEndpoint
    from controlplane.gateway.serving.live_health import HeadView, LiveHealth, TelemetryView

    endpoint = ReplicaEndpoint("d1-r0", "tcp://head", "t", kv_tokens=1000,
                               stages=(StageLink("d1-r0-s0", "n0/gpu0"),))
    state = ReplicaState("d1-r0", ReplicaCosts(0.001, 0.0, 0.02), 1000)

    def health_with_stage_sampled(age_s: float) -> str:
        live, now = LiveHealth(), time.time()
        live.telemetry = TelemetryView({"n0/gpu0": DeviceSample("n0/gpu0", 0.1, GB, 16 * GB)},
                                       {"d1-r0-s0": StageSample("d1-r0-s0", age_s, "starting")}, now)
        live.heads["d1-r0"] = HeadView(True, "", now - 0.3, {"ok": True})  # answered 0.3 s ago
        live.apply(state, endpoint)
        return "ok" if state.health.ok else state.health.reason

    assert health_with_stage_sampled(0.8) == "ok"
    assert health_with_stage_sampled(0.1) == "stage d1-r0-s0 is starting"


async def test_a_replica_handed_over_beside_serves_until_the_gateway_heard_its_successor_say_ok(
        fake_pipeline, demo_model, api_key):
    """At the switch the controller states the old pipeline unhealthy at once, but its successor's head
    says ok only once its warm-up request came back (worker_runtime/warm_up.py), and the gateway hears it
    only at its next poll: meanwhile the old one, still admitting, takes the requests."""
    from controlplane.gateway.openai.tokenization import ModelTokenizer

    tokens = ModelTokenizer.load(demo_model).encode_prompt("hello world")
    fake = fake_pipeline({"old": Script(tokens=tokens, successor="new"),
                          "new": Script(tokens=tokens, healthy=False)})
    assert await chosen(api_key, 2) == ["old", "old"]
    assert replica("old").health.ok and not replica("new").health.ok

    fake.scripts["new"].healthy = True  # warmed up
    await settle(lambda: replica("new").health.ok)
    assert not replica("old").health.ok and "handing this replica over" in replica("old").health.reason
    assert await chosen(api_key, 2) == ["new", "new"]


async def test_a_head_that_turns_ok_has_its_new_stages_telemetry_read_at_once(fake_pipeline, demo_model,
                                                                              api_key, settings):
    """A restarted or moved stage has no sample until its agent's next heartbeat: its replica is held
    back until the telemetry is read again, which a head turning ok does at once (not within
    HEALTH_REFRESH_S, nor at the next re-read of the served models)."""
    from controlplane.gateway.openai.tokenization import ModelTokenizer

    tokens = ModelTokenizer.load(demo_model).encode_prompt("hello world")
    fake = fake_pipeline({"r0": Script(tokens=tokens, healthy=False,
                                       stages=(StageLink("d1-r0-s0", "n0/gpu0"),))})
    settings.MOTLEY_GATEWAY = {**settings.MOTLEY_GATEWAY, "HEALTH_REFRESH_S": 30, "REFRESH_S": 30,
                               "WAIT_POLL_S": 30, "WAIT_HEAD_POLL_S": 0.02, "WAIT_S": 20}
    body = json.dumps({"model": "demo", "prompt": "x", "max_tokens": 2})
    waiting = asyncio.ensure_future(AsyncClient().post(
        "/v1/completions", body, content_type="application/json",
        headers={"Authorization": f"Bearer {api_key}"}))
    await asyncio.sleep(0.5)  # it waits: the head is not ok and its stage has no sample yet
    assert not waiting.done()
    report("n0", "d1-r0-s0")  # the stage's first sample, then its head completes the pipeline
    fake.scripts["r0"].healthy = True
    flipped = time.monotonic()
    response = await asyncio.wait_for(waiting, 10)
    assert response.status_code == 200, response.content
    assert time.monotonic() - flipped < 5
