"""Demand signals of a deployment from the gateway's request records (made here through the recorder, as
the gateway makes them) and its stages' telemetry: rates, percentiles, attainment, queue and KV use."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import asdict

import pytest

from controlplane.deployments.models import Deployment
from controlplane.gateway.demand import deployment_demand, percentile_of
from controlplane.gateway.serving.decision_log import RouteRecord, RouterRecorder
from controlplane.gateway.serving.fleet_store import DECISIONS_KEPT, FleetStore
from controlplane.telemetry.services import telemetry_keep, telemetry_sample
from tests.support.processes import free_port, redis_up, redis_url

NOW = 10_000.0


def deployment(**targets) -> Deployment:
    """An unsaved deployment: the selector reads its targets and id only."""
    return Deployment(pk=7, name="chat", **targets)


def served(recorder: RouterRecorder, n: int, *, at: float, ttft_s: float | None, e2e_s: float, tokens: int,
           replica: str = "d7-r0", waited_s: float = 0.0, prompt: int = 100,
           outcome: str = "completed") -> None:
    """``n`` requests routed at ``at``, first token after ``ttft_s``, ended after ``e2e_s``."""
    for _ in range(n):
        rid = f"req-{len(recorder.recent)}"
        recorder.record(RouteRecord(rid, "tiny", "round_robin", at, replica, "running", prompt_tokens=prompt,
                                    waited_s=waited_s))
        if ttft_s is not None:
            recorder.first_token(rid, ttft_s)
        if outcome != "running":
            recorder.finished(rid, outcome, e2e_s, tokens)


def test_percentiles_are_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert percentile_of(values, 95) == 95.0 and percentile_of(values, 99) == 99.0
    assert percentile_of([3.0], 99) == 3.0 and percentile_of([], 95) is None


def test_rates_percentiles_and_attainment_over_the_window():
    recorder = RouterRecorder()
    # 90 fast requests: TTFT 100 ms, 11 tokens over 100 + 10 × 20 ms (TPOT 20 ms)
    served(recorder, 90, at=NOW - 30, ttft_s=0.1, e2e_s=0.3, tokens=11)
    # 10 slow ones: TTFT 200 ms waited in the gateway + 400 ms, TPOT 50 ms
    served(recorder, 10, at=NOW - 20, ttft_s=0.4, e2e_s=0.9, tokens=11, waited_s=0.2)
    # outside the window, and another deployment's: neither counts
    served(recorder, 5, at=NOW - 200, ttft_s=9.0, e2e_s=9.5, tokens=11)
    served(recorder, 5, at=NOW - 10, ttft_s=9.0, e2e_s=9.5, tokens=11, replica="d8-r0")
    d = deployment(ttft_target_ms=500, tpot_target_ms=30, target_percentile=95, target_window_s=60)
    demand = deployment_demand(deployment=d, now=NOW, records=recorder.recent)
    assert demand["window_s"] == 60 and demand["requests"] == 100 and demand["completed"] == 100
    assert demand["arrival_rate"] == pytest.approx(100 / 60, abs=1e-4)
    assert demand["prompt_tokens_per_s"] == pytest.approx(100 * 100 / 60, abs=1e-3)
    assert demand["output_tokens_per_s"] == pytest.approx(100 * 11 / 60, abs=1e-3)
    ttft, tpot = demand["ttft"], demand["tpot"]
    assert (ttft["p95_ms"], ttft["p99_ms"], ttft["samples"]) == (pytest.approx(600), pytest.approx(600), 100)
    assert ttft["attainment"] == 0.9 and ttft["met"] is False  # p95 is a slow one: 600 ms > 500 ms
    assert (tpot["p95_ms"], tpot["p99_ms"]) == (pytest.approx(50), pytest.approx(50))
    assert tpot["attainment"] == 0.9 and tpot["met"] is False
    assert demand["overall"] == {"ended": 100, "attainment": 0.9}
    assert demand["queue"]["wait_mean_ms"] == pytest.approx(20) and demand["queue"]["wait_p95_ms"] == 200

    relaxed = deployment(ttft_target_ms=700, tpot_target_ms=60, target_percentile=99, target_window_s=60)
    demand = deployment_demand(deployment=relaxed, now=NOW, records=recorder.recent)
    assert demand["ttft"]["met"] is True and demand["ttft"]["attainment"] == 1.0
    assert demand["overall"]["attainment"] == 1.0
    longer = deployment_demand(deployment=relaxed, window_s=300, now=NOW, records=recorder.recent)
    assert longer["requests"] == 105 and longer["ttft"]["p99_ms"] == pytest.approx(9000)


def test_when_the_kept_records_span_less_than_the_window_the_rates_are_over_their_span(monkeypatch):
    recorder = RouterRecorder()
    monkeypatch.setattr("controlplane.gateway.demand.recorder", recorder)
    monkeypatch.setattr("controlplane.gateway.demand._shared_store", lambda: None)  # one process alone
    recorder.started_at = 0.0  # serving long before
    for i in range(recorder.recent.maxlen):  # 500 requests over the last 10 s: 50 per second
        served(recorder, 1, at=NOW - 10 + i * 10 / recorder.recent.maxlen, ttft_s=0.1, e2e_s=0.2, tokens=2)
    demand = deployment_demand(deployment=deployment(target_window_s=300), now=NOW)
    assert demand["covered_s"] == pytest.approx(10) and demand["arrival_rate"] == pytest.approx(50)


def test_failed_requests_miss_the_targets_and_the_waiting_ones_are_the_queue():
    recorder = RouterRecorder()
    served(recorder, 3, at=NOW - 5, ttft_s=0.05, e2e_s=0.1, tokens=1)  # one token: no TPOT
    served(recorder, 1, at=NOW - 5, ttft_s=None, e2e_s=1.0, tokens=0, outcome="failed:broken")
    served(recorder, 2, at=NOW - 1, ttft_s=None, e2e_s=0, tokens=0, outcome="running")
    d = deployment(ttft_target_ms=100, tpot_target_ms=None, target_window_s=60)
    demand = deployment_demand(deployment=d, now=NOW, records=recorder.recent)
    assert demand["failed"] == 1 and demand["tpot"]["samples"] == 0 and demand["tpot"]["met"] is None
    assert demand["ttft"]["attainment"] == 1.0 and demand["overall"] == {"ended": 4, "attainment": 0.75}
    assert demand["queue"]["waiting"] == 2


def test_no_target_no_attainment_and_no_requests_no_figures():
    demand = deployment_demand(deployment=deployment(), now=NOW, records=[])
    assert demand["requests"] == 0 and demand["arrival_rate"] == 0
    assert demand["ttft"] == {"target_ms": None, "percentile": 95, "samples": 0, "p95_ms": None,
                              "p99_ms": None, "attainment": None, "met": None}
    assert demand["overall"]["attainment"] is None and demand["kv"]["use"] is None


def test_kv_use_and_the_heads_queue_come_from_the_stages_telemetry():
    def stage(key: str, index: int, used: int, free: int, queue: int) -> dict:
        return {"stage_key": key, "deployment_id": 7, "replica": 0, "stage_index": index, "state": "ready",
                "stats": {"kv_tokens_used": used, "kv_tokens_free": free, "queue_depth": queue}}

    heartbeat = {"stages": [stage("d7-r0-s0", 0, 300, 700, 4), stage("d7-r0-s1", 1, 600, 400, 0),
                            {**stage("d9-r0-s0", 0, 1000, 0, 9), "deployment_id": 9}]}
    telemetry_keep(telemetry_sample(node_id=1, node_name="n0", heartbeat=heartbeat, received_at=time.time()))
    demand = deployment_demand(deployment=deployment(), records=[])
    assert demand["kv"] == {"use": 0.6, "used_tokens": 900, "free_tokens": 1100}
    assert demand["queue"]["head_queue"] == 4


def test_published_load_adds_up_over_gateway_processes(settings):
    """Each process publishes its own load (the policy runs in the Celery worker, not here); the policy
    reads the sum of the rates and the worst percentile."""
    from django.core.cache import cache

    from controlplane.gateway.demand import demand_publish
    from controlplane.rebalance.demand import sample_publish, samples_read

    window = settings.MOTLEY_REBALANCE_DEMAND_WINDOW_S

    cache.clear()
    recorder = RouterRecorder()
    served(recorder, 30, at=NOW - 10, ttft_s=0.1, e2e_s=0.3, tokens=11)  # TTFT 100 ms, TPOT 20 ms
    served(recorder, 5, at=NOW - 10, ttft_s=0.1, e2e_s=0.3, tokens=11, replica="d8-r0")
    demand_publish(now=NOW, records=recorder.recent, started_at=0.0)
    sample_publish(deployment_id=7, process="other", sample={
        "at": NOW, "arrival_rate": 1.0, "output_tokens_per_s": 5.0,
        "ttft_p95_ms": 900.0, "ttft_p99_ms": 950.0, "tpot_p95_ms": None, "tpot_p99_ms": None})
    load = samples_read(deployment=deployment(target_percentile=99), now=NOW + 1)
    assert load.arrival_rate == pytest.approx(30 / window + 1.0)
    assert load.output_tokens_per_s == pytest.approx(30 * 11 / window + 5.0)
    assert (load.ttft_ms, load.tpot_ms) == (950.0, pytest.approx(20.0))
    cache.clear()


def test_every_gateway_process_counts_the_requests_the_others_served(monkeypatch):
    """Behind a load balancer the page asks whichever process answers: it adds the ended requests the
    others published to the shared store (not its own twice), and where the store's capped list covers
    less than the window, the rates are over the span it covers."""
    if not redis_up():
        pytest.skip("needs a Redis server")
    store = FleetStore(redis_url(9), prefix=f"test-demand-{uuid.uuid4().hex[:8]}")
    monkeypatch.setattr("controlplane.gateway.demand._shared_store", lambda: store)
    mine, theirs = RouterRecorder(), RouterRecorder()
    monkeypatch.setattr("controlplane.gateway.demand.recorder", mine)
    served(mine, 4, at=NOW - 30, ttft_s=0.1, e2e_s=0.3, tokens=11)
    served(theirs, 6, at=NOW - 20, ttft_s=0.9, e2e_s=1.1, tokens=11)
    for record in theirs.recent:
        record.process = "other-host:1"
    ended = [asdict(r) for r in mine.recent] + [asdict(r) for r in theirs.recent]  # both processes publish
    asyncio.run(store.publish("other-host:1", {}, ended))
    d = deployment(ttft_target_ms=500, target_window_s=60)
    demand = deployment_demand(deployment=d, now=NOW)
    assert demand["requests"] == 10 and demand["arrival_rate"] == pytest.approx(10 / 60, abs=1e-4)
    assert demand["ttft"]["attainment"] == 0.4 and demand["covered_s"] == 60

    # The store keeps the last DECISIONS_KEPT: full, they go back 15 s, and so do the figures.
    late = [{**asdict(theirs.recent[0]), "request_id": f"late-{i}", "at": NOW - 15 + i * 15 / DECISIONS_KEPT}
            for i in range(DECISIONS_KEPT)]
    asyncio.run(store.publish("other-host:1", {}, late))
    demand = deployment_demand(deployment=d, now=NOW)
    assert demand["covered_s"] == pytest.approx(15) and demand["requests"] == DECISIONS_KEPT
    assert demand["arrival_rate"] == pytest.approx(DECISIONS_KEPT / 15, rel=1e-3)
    asyncio.run(store.close())


def test_an_unreachable_store_leaves_each_process_its_own_requests(monkeypatch):
    monkeypatch.setattr("controlplane.gateway.demand._shared_store",
                        lambda: FleetStore(f"redis://127.0.0.1:{free_port()}/0"))
    mine = RouterRecorder()
    monkeypatch.setattr("controlplane.gateway.demand.recorder", mine)
    served(mine, 3, at=NOW - 5, ttft_s=0.1, e2e_s=0.3, tokens=11)
    assert deployment_demand(deployment=deployment(), now=NOW)["requests"] == 3


def test_a_process_that_started_lately_reports_its_load_over_the_time_it_served(settings):
    """Over the whole window, a process serving for 6 s of 60 would report a tenth of its load: a cold
    start read as no load, and the policy scaling in at the peak. The demand API cuts the same way."""
    from django.core.cache import cache

    from controlplane.gateway.demand import demand_publish
    from controlplane.rebalance.demand import samples_read

    cache.clear()
    settings.MOTLEY_REBALANCE_DEMAND_WINDOW_S = 60
    recorder = RouterRecorder(started_at=NOW - 6)
    served(recorder, 12, at=NOW - 3, ttft_s=0.1, e2e_s=0.3, tokens=11)
    demand_publish(now=NOW, records=recorder.recent, started_at=recorder.started_at)
    load = samples_read(deployment=deployment(), now=NOW)
    assert load.arrival_rate == pytest.approx(2.0) and load.output_tokens_per_s == pytest.approx(22.0)
    cache.clear()


def test_published_concurrency_is_the_time_requests_were_held_plus_the_model_waiting_now(settings):
    """Little's law on what was measured: the seconds the window's requests were held by a replica
    (routed to end; a running one to now; one routed before the window only from its start) over the
    window, plus the model's requests waiting in the gateway, shared by the deployments serving it."""
    from django.core.cache import cache

    from controlplane.gateway.demand import demand_publish
    from controlplane.rebalance.demand import samples_read

    cache.clear()
    settings.MOTLEY_REBALANCE_DEMAND_WINDOW_S = 60
    recorder = RouterRecorder(started_at=0.0)
    served(recorder, 1, at=NOW - 62, ttft_s=0.5, e2e_s=5.0, tokens=11)  # 3 s of it in the window
    served(recorder, 10, at=NOW - 30, ttft_s=0.5, e2e_s=3.0, tokens=11)  # 30 s
    served(recorder, 2, at=NOW - 4, ttft_s=None, e2e_s=0.0, tokens=0, outcome="running")  # 8 s so far
    served(recorder, 1, at=NOW - 10, ttft_s=0.5, e2e_s=1.0, tokens=11, replica="d8-r0")  # another deployment
    demand_publish(now=NOW, records=recorder.recent, started_at=0.0, waiting={"tiny": 3, "other": 5})
    load = samples_read(deployment=deployment(), now=NOW)
    assert load.concurrency == pytest.approx((3 + 30 + 8) / 60 + 3 / 2)
    assert samples_read(deployment=Deployment(pk=8, name="chat-2"), now=NOW).concurrency == pytest.approx(
        1 / 60 + 3 / 2)
    cache.clear()
