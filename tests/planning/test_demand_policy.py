"""The demand rules of the rebalance policy (planning/demand.py) against recorded load series: a pass
every 10 s feeds the policy the series so far, as the Celery task does, and applies what it decides."""

from __future__ import annotations

import math
import random

import pytest

from controlplane.planning.demand import (
    Capacity,
    Forecast,
    Knobs,
    LoadSample,
    Memory,
    Targets,
    decide,
    forecast,
    predict,
)

KNOBS = Knobs(high=0.8, low=0.5, for_s=60, cooldown_s=300, horizon_s=120)
PER_REPLICA = 100.0  # tokens/s one replica serves
TARGETS = Targets(ttft_ms=2000, tpot_ms=200, min_replicas=1, max_replicas=4)
WINDOW_S = 300


def capacity(replicas: int) -> Capacity:
    return Capacity(replicas, PER_REPLICA * replicas, token_latency_ms=80, prefill_ms=150, slots=4 * replicas)


def run(loads: list[float], *, replicas: int, targets: Targets = TARGETS,
        last_change_at: float | None = None) -> list[tuple[float, str, int]]:
    """Feed ``loads`` (output tokens/s, one sample every 10 s, 100 tokens a request) pass by pass;
    each change is applied at once. Returns (time, action, replicas after) per change."""
    series: list[LoadSample] = []
    memory, changes = Memory(), []
    for i, load in enumerate(loads):
        now = 10.0 * i
        series = [s for s in [*series, LoadSample(now, load / 100, load)] if now - s.at <= WINDOW_S]
        decision = decide(series, targets=targets, capacity=capacity(replicas), memory=memory, now=now,
                          last_change_at=last_change_at, knobs=KNOBS)
        memory = decision.memory
        if decision.action is not None:  # at max_replicas a scale-out is a larger batch, not a replica
            replicas = decision.replicas
            changes.append((now, decision.action, replicas))
            last_change_at, memory = now, Memory()
    return changes


def test_rising_load_scales_out_before_the_capacity_is_reached():
    loads = [100 + 1.0 * i for i in range(60)]  # two replicas; 100 -> 159 tokens/s over ten minutes
    changes = run(loads, replicas=2)
    assert changes and changes[0][1:] == ("out", 3)
    at = int(changes[0][0] / 10)
    assert loads[at] < 0.8 * 200  # the trend forecast answered before the load itself crossed the mark
    assert all(action == "out" for _, action, _ in changes)


def test_scale_out_needs_the_condition_to_last_and_stops_at_max_replicas():
    changes = run([290.0] * 80, replicas=2, targets=Targets(2000, 200, max_replicas=3))
    assert changes[0] == (60.0, "out", 3)  # at risk from 0 s, acted once it had lasted 60 s
    # still at risk at max_replicas: more throughput from the same replicas, once per cool-down
    assert [(at, replicas) for at, _, replicas in changes[1:]] == [(360.0, 3), (660.0, 3)]


def test_a_load_that_outruns_one_replica_gets_every_replica_it_needs_in_one_change():
    """A jump to 2.5x of one replica's capacity: HPA's rule asks for ceil(1 * 2.5 / 0.8) = 4 at once;
    the next change, a cool-down later, finds nothing to do. Capped at max_replicas."""
    assert run([250.0] * 60, replicas=1) == [(60.0, "out", 4)]
    assert run([250.0] * 60, replicas=1, targets=Targets(2000, 200, max_replicas=3))[0] == (60.0, "out", 3)


def test_a_backlog_the_served_tokens_hide_scales_out():
    """A saturated replica serves what it can: its tokens/s sit at 70 % of the planned capacity, under
    the mark, and would never ask for more. The requests in the system say otherwise: 4 held by its
    4 slots and 6 more waiting in the gateway, 250 % of what it holds at once."""
    series = [LoadSample(10.0 * i, 0.7, 70, concurrency=10.0) for i in range(8)]
    decision = decide(series, targets=Targets(None, None, max_replicas=8), capacity=capacity(1),
                      memory=Memory(at_risk_since=0.0), now=70, last_change_at=None, knobs=KNOBS)
    assert decision.action == "out" and decision.utilisation == pytest.approx(2.5)
    assert decision.replicas == 4  # ceil(1 * 2.5 / 0.8)
    assert "10.0 requests in flight or waiting for 4 sequence slots: 250% of capacity" in decision.reason
    tokens_only = [LoadSample(s.at, s.arrival_rate, s.output_tokens_per_s) for s in series]
    assert decide(tokens_only, targets=TARGETS, capacity=capacity(1), memory=Memory(), now=70,
                  last_change_at=None, knobs=KNOBS).action is None


def test_requests_held_longer_than_planned_keep_a_replica_the_tokens_would_release():
    """Two replicas serving 45 tokens/s: by tokens, one would run at 45 %, under the low mark, and the
    tokens alone take a replica away. The requests in flight say each is held longer than planned (6
    of the 8 slots busy, one replica would need 150 % of its own): no scale-in."""
    series = [LoadSample(10.0 * i, 0.45, 45, concurrency=6.0) for i in range(8)]
    decision = decide(series, targets=TARGETS, capacity=capacity(2), memory=Memory(low_since=0.0), now=70,
                      last_change_at=None, knobs=KNOBS)
    assert decision.action is None and decision.utilisation == pytest.approx(0.75)
    tokens_only = [LoadSample(s.at, s.arrival_rate, s.output_tokens_per_s) for s in series]
    assert decide(tokens_only, targets=TARGETS, capacity=capacity(2), memory=Memory(low_since=0.0), now=70,
                  last_change_at=None, knobs=KNOBS).action == "in"


def test_low_load_scales_in_down_to_min_replicas_only():
    changes = run([30.0] * 120, replicas=4, targets=Targets(2000, 200, min_replicas=2))
    assert [c[1:] for c in changes] == [("in", 3), ("in", 2)]
    assert changes[1][0] - changes[0][0] >= KNOBS.cooldown_s  # the second waited for the cool-down


def test_measured_targets_missed_scale_out_at_low_utilisation():
    series = [LoadSample(10.0 * i, 0.5, 50, ttft_ms=2600, tpot_ms=90) for i in range(8)]
    decision = decide(series, targets=TARGETS, capacity=capacity(2), memory=Memory(at_risk_since=0.0), now=70,
                      last_change_at=None, knobs=KNOBS)
    assert decision.action == "out" and "TTFT p95 2600 ms over its 2000 ms target" in decision.reason


def test_noisy_load_never_flaps():
    """Half an hour of load at a steady mean with +-20 % noise on each sample: between the marks nothing
    changes; near the low mark at most one scale-in, which the same load never pushes back out."""
    rng = random.Random(7)
    for mean, most in ((0.30, 1), (0.36, 1), (0.45, 0), (0.6, 0), (0.66, 0)):  # of three replicas' capacity
        for _ in range(2):
            loads = [3 * PER_REPLICA * mean * (1 + rng.uniform(-0.2, 0.2)) for _ in range(180)]
            changes = run(loads, replicas=3)
            assert len(changes) <= most, (mean, changes)


def test_a_spike_shorter_than_for_s_changes_nothing():
    loads = [100.0] * 30 + [400.0] * 3 + [100.0] * 30
    assert run(loads, replicas=2) == []


def test_cooldown_holds_a_due_change_and_lets_it_through_after():
    series = [LoadSample(10.0 * i, 1.9, 190) for i in range(10)]
    held = decide(series, targets=TARGETS, capacity=capacity(2), memory=Memory(at_risk_since=0.0), now=90,
                  last_change_at=0.0, knobs=KNOBS)
    assert held.action is None and "cooldown 300 s" in held.reason
    later = [LoadSample(300 + s.at, 1.9, 190) for s in series]
    done = decide(later, targets=TARGETS, capacity=capacity(2), memory=held.memory, now=390,
                  last_change_at=0.0, knobs=KNOBS)
    assert done.action == "out"


def test_forecast_follows_the_trend_and_never_goes_negative():
    series = [LoadSample(float(t), 0.0, 10.0 + t) for t in range(0, 100, 10)]
    assert math.isclose(forecast(series, at=190).output_tokens_per_s, 200.0)
    falling = [LoadSample(float(t), 1.0, 100.0 - t) for t in range(0, 100, 10)]
    assert forecast(falling, at=500) == Forecast(1.0, 0.0)
    queueing = [LoadSample(float(t), 1.0, 100.0, concurrency=2.0 + t / 10) for t in range(0, 100, 10)]
    assert math.isclose(forecast(queueing, at=190).concurrency, 21.0)


def _mm1_wait_ms(u: float, service_ms: float, q: int, n: int = 60_000, seed: int = 3) -> float:
    """The reference: an M/M/1 queue simulated by Lindley's recursion, its waits' q-th percentile."""
    rng, wait, waits = random.Random(seed), 0.0, []
    for _ in range(n):
        waits.append(wait)
        wait = max(0.0, wait + rng.expovariate(1 / service_ms) - rng.expovariate(u / service_ms))
    return sorted(waits)[int(q / 100 * n)]


def test_predicted_ttft_matches_a_simulated_queue():
    cap = capacity(2)
    for u, q in ((0.5, 95), (0.8, 95), (0.8, 99)):
        load = Forecast(arrival_rate=u * cap.tokens_per_s / 100, output_tokens_per_s=u * cap.tokens_per_s)
        predicted = predict(cap, load, Targets(2000, 200, percentile=q))
        wait = predicted.ttft_ms - cap.prefill_ms
        assert math.isclose(wait, _mm1_wait_ms(u, 1000 * 100 / cap.tokens_per_s, q), rel_tol=0.1)
    over = predict(cap, Forecast(3.0, 300.0), TARGETS)
    assert math.isinf(over.ttft_ms) and not over.meets
