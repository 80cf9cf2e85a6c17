"""The queue's bound from the plan's capacity and the ``Retry-After`` of a shed request (shedding.py)."""

from __future__ import annotations

import pytest

from controlplane.gateway.routing import ReplicaCosts, ReplicaHealth, ReplicaState, RequestShape
from controlplane.gateway.serving import shedding
from controlplane.gateway.serving.shedding import (
    QUEUE_ROUNDS,
    CompletionRate,
    planned_rate,
    queue_bound,
    replica_slots,
    retry_after_s,
)

COSTS = ReplicaCosts(prefill_s_per_token=0.0, decode_s_per_token=0.0, decode_step_s=0.01)
REQUEST = RequestShape(prompt_tokens=20, max_tokens=108)  # 128 KV tokens: 8 blocks of 16


def replica(name: str, kv: int, ok: bool = True) -> ReplicaState:
    return ReplicaState(name, COSTS, kv_capacity=kv, health=ReplicaHealth(ok=ok, reason="" if ok else "down"))


def test_the_bound_is_rounds_of_what_the_replicas_hold_at_once_capped_by_max_waiting():
    replicas = [replica("r0", 1024), replica("r1", 512)]  # 8 + 4 requests of 128 tokens
    assert [replica_slots(r, REQUEST) for r in replicas] == [8, 4]
    assert queue_bound(replicas, REQUEST, most=256) == QUEUE_ROUNDS * 12
    assert queue_bound(replicas, REQUEST, most=10) == 10
    assert queue_bound([replica("r0", 100)], REQUEST, most=256) == QUEUE_ROUNDS  # too small: one slot
    assert queue_bound([], REQUEST, most=256) == 256  # no replica listed: no capacity to size it from


def test_retry_after_is_the_queue_over_the_rate_rounded_up_and_the_fallback_without_one():
    assert retry_after_s(10, 4.0, fallback_s=5) == 3
    assert retry_after_s(1, 100.0, fallback_s=5) == 1
    assert retry_after_s(10, None, fallback_s=5) == 5


def test_the_planned_rate_counts_healthy_replicas_only():
    up, down = replica("r0", 1024), replica("r1", 1024, ok=False)
    rate = planned_rate([up, down], REQUEST)
    assert rate == pytest.approx(8 / up.estimate_finish(REQUEST))
    assert planned_rate([down], REQUEST) is None


def test_the_completion_rate_counts_the_ends_of_the_last_window(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(shedding.time, "monotonic", lambda: now[0])
    rate = CompletionRate()
    assert rate.per_s() is None
    now[0] += 0.5
    rate.ended()
    assert rate.per_s() == 1.0  # measured over at least a second
    now[0] = 1010.0
    for _ in range(19):
        rate.ended()
    assert rate.per_s() == pytest.approx(20 / 10)
    now[0] = 1000.0 + shedding.RATE_WINDOW_S + 5
    assert rate.per_s() == pytest.approx(19 / shedding.RATE_WINDOW_S)  # the first one fell out
    now[0] += shedding.RATE_WINDOW_S
    assert rate.per_s() is None
