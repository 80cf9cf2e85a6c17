"""The pure router: cost model, strategies, admission, KV fit and health penalties."""

from __future__ import annotations

import pytest

from controlplane.gateway.routing import (
    Decision,
    Rejection,
    ReplicaCosts,
    ReplicaHealth,
    ReplicaState,
    RequestShape,
    Router,
)
from controlplane.gateway.routing.costs import time_to_finish, time_to_first_token

FAST = ReplicaCosts(prefill_s_per_token=0.001, decode_s_per_token=0.002, decode_step_s=0.02)


def replicas(*factors: float, kv: int = 10_000) -> list[ReplicaState]:
    return [ReplicaState(f"r{i}", FAST.scaled(f), kv) for i, f in enumerate(factors)]


def test_cost_model_adds_queued_prompts_and_shared_decode_steps():
    request = RequestShape(prompt_tokens=100, max_tokens=10)
    assert time_to_first_token(FAST, request, 0) == pytest.approx(0.1 + 0.02)
    idle = time_to_finish(FAST, request, 0, [])
    assert idle == pytest.approx(0.1 + 10 * 0.02 + 10 * 0.002)
    # Two running sequences: one ends after 3 of our steps, one outlives us (counts 10, not 50).
    busy = time_to_finish(FAST, request, 200, [(40, 3), (70, 50)])
    assert busy == pytest.approx(idle + 200 * 0.001 + (3 + 10) * 0.002)
    # Reading the KV cache: ours grows from 100 to 109 over 10 steps, theirs from 40 (3 steps) and 70 (10).
    reading = ReplicaCosts(0.001, 0.002, 0.02, kv_read_s_per_token=1e-5)
    extra = time_to_finish(reading, request, 200, [(40, 3), (70, 50)]) - busy
    assert extra == pytest.approx(1e-5 * ((100 + 109) * 10 / 2 + (40 + 42) * 3 / 2 + (70 + 79) * 10 / 2))


def test_bookkeeping_tracks_tokens_and_kv_reservations():
    (r,) = replicas(1.0, kv=1000)
    r.start("a", RequestShape(100, 50))
    assert (r.queued_tokens, r.running_tokens, r.kv_free) == (100, 50, 1000 - 160)  # whole 16-token blocks
    r.token("a")
    assert (r.queued_tokens, r.running_tokens, r.outstanding_tokens) == (0, 49, 49)
    r.finish("a")
    r.finish("a")  # idempotent
    assert (r.in_flight, r.kv_free) == (0, 1000)


def test_cost_aware_prefers_the_replica_that_finishes_first_not_the_emptiest():
    fast, slow = replicas(1.0, 4.0)
    for i in range(3):
        fast.start(f"x{i}", RequestShape(10, 20))
    router = Router([fast, slow], "cost_aware")
    decision = router.route(RequestShape(50, 100), deadline_s=60)
    assert isinstance(decision, Decision) and decision.replica is fast
    # Least-outstanding-tokens sends it to the idle but four times slower replica.
    assert Router([fast, slow], "least_outstanding_tokens").route(RequestShape(50, 100),
                                                                  deadline_s=60).replica is slow


def test_cost_aware_moves_to_the_slower_replica_when_the_fast_one_is_loaded_enough():
    fast, slow = replicas(1.0, 2.0)
    for i in range(40):
        fast.start(f"x{i}", RequestShape(200, 200))
    decision = Router([fast, slow]).route(RequestShape(10, 10), deadline_s=60)
    assert decision.replica is slow
    assert decision.estimated_finish_s == pytest.approx(slow.estimate_finish(RequestShape(10, 10)))


def test_round_robin_takes_turns():
    rs = replicas(1.0, 2.0, 4.0)
    router = Router(rs, "round_robin")
    chosen = [router.route(RequestShape(5, 5), deadline_s=60).replica.replica_id for _ in range(6)]
    assert chosen == ["r0", "r1", "r2", "r0", "r1", "r2"]


def test_a_replica_without_kv_space_for_the_whole_request_is_skipped():
    small, big = replicas(1.0, 4.0, kv=1000)
    small.start("x", RequestShape(500, 400))
    decision = Router([small, big]).route(RequestShape(50, 100), deadline_s=60)
    assert decision.replica is big  # 150 > 100 free on the fast one


def test_over_long_request_is_a_400_saturation_a_429_and_no_healthy_replica_a_503():
    rs = replicas(1.0, 2.0, kv=1000)
    too_long = Router(rs).route(RequestShape(900, 200), deadline_s=60)
    assert isinstance(too_long, Rejection) and too_long.status == 400 and "1000" in too_long.message
    for r in rs:
        r.start("hog", RequestShape(500, 400))
    saturated = Router(rs).route(RequestShape(100, 100), deadline_s=60)
    assert isinstance(saturated, Rejection) and saturated.status == 429
    for r in rs:
        r.finish("hog")
        r.observe(health=ReplicaHealth(ok=False))
    assert Router(rs).route(RequestShape(100, 100), deadline_s=60).status == 503


def test_a_request_that_cannot_finish_within_the_deadline_is_refused_at_once():
    rs = replicas(1.0)
    assert Router(rs).route(RequestShape(100, 1000), deadline_s=1.0).status == 429
    assert isinstance(Router(rs).route(RequestShape(100, 1000), deadline_s=60.0), Decision)


@pytest.mark.parametrize(
    "health",
    [ReplicaHealth(throttle=0.6), ReplicaHealth(memory_pressure=0.99), ReplicaHealth(error_rate=0.2)],
    ids=["thermal", "memory", "errors"],
)
def test_health_penalties_steer_traffic_away(health):
    a, b = replicas(1.0, 1.0)
    assert Router([a, b]).route(RequestShape(10, 10), deadline_s=60).replica is a
    a.observe(health=health)
    assert a.health.slowdown > 1.5
    assert Router([a, b]).route(RequestShape(10, 10), deadline_s=60).replica is b


def test_telemetry_free_kv_counts_space_used_by_others_once():
    (r,) = replicas(1.0, kv=1000)
    r.start("mine", RequestShape(100, 100))
    r.observe(kv_tokens_free=792)  # exactly our own reservation (208 tokens in blocks): nobody else
    assert r.kv_free == 792
    r.observe(kv_tokens_free=500)  # 292 more used by someone else
    assert r.kv_free == 500
    r.finish("mine")
    assert r.kv_free == 708


def test_a_new_capacity_keeps_what_the_head_said_is_free():
    """A plan's KV figure can be far from what the head holds (an emulated stage's KV is the workload's,
    the plan's its card's), and it changes when a new plan is applied. The head's free figure must keep
    holding against the new capacity: it was frozen against the old one, and a replica that had just
    become the only one read -1808559 free and refused three requests as saturated (replacement_bench,
    a drain beside)."""
    (r,) = replicas(1.0, kv=1_841_327)  # the plan's capacity for the card
    r.observe(kv_tokens_free=32_768)  # what the emulated head really has, all free
    assert r.kv_free == 32_768
    r.kv_capacity = 40_000  # the next plan's figure for the same head
    assert r.kv_free == 32_768
    r.start("mine", RequestShape(16, 16))
    assert r.kv_free == 32_768 - 32
    r.kv_capacity = 20_000  # less than the head has: the smaller figure wins
    assert r.kv_free == 20_000 - 32


def test_unknown_strategy_and_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="unknown routing strategy"):
        Router([], "random")
    with pytest.raises(ValueError):
        RequestShape(0, 5)
    with pytest.raises(ValueError):
        ReplicaCosts(-1, 0, 0)


def test_no_replica_at_all_is_a_503():
    assert Router([]).route(RequestShape(1, 1), deadline_s=60).status == 503


def test_baselines_route_blind_and_leave_waiting_to_the_replica_queue():
    full, idle = replicas(1.0, 1.0, kv=1000)
    full.start("hog", RequestShape(500, 400))
    router = Router([full, idle], "round_robin")
    # no KV space now: it waits there
    assert router.route(RequestShape(100, 100), deadline_s=60).replica is full
    assert router.route(RequestShape(100, 100000), deadline_s=1).status == 400  # never fits anywhere
    assert isinstance(Router([full], "least_outstanding_tokens").route(RequestShape(10, 900), deadline_s=1),
                      Decision)
