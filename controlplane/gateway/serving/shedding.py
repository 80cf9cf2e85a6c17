"""How much overload a model's queue holds, and when a request it sheds should come back.

Overload queues (admission.py) instead of being refused, but a queue without a bound only turns
refusals into timeouts. The bound is sized from what the plan serves: ``QUEUE_ROUNDS`` times the
requests its replicas hold at once (each replica's KV capacity over the request's KV need), so a
request at the back of a full queue waits a few rounds of the replicas' full load, not minutes; a
model with no replica listed (deploying, re-planning) has no capacity to size it from and keeps
``MAX_WAITING``, which also caps every bound.

A shed request's ``Retry-After`` is the time the queue ahead of it takes to drain: its length over the
rate at which the model's requests ended in the last ``RATE_WINDOW_S`` (``CompletionRate``), or, before
any ended, over the rate the healthy replicas are estimated to finish requests like it at (their slots
over the request's estimated time there). Only with neither (nothing ended, no healthy replica) is
there nothing to compute it from, and the gateway's ``RETRY_AFTER_S`` is quoted.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Sequence

from controlplane.gateway.routing import ReplicaState, RequestShape

QUEUE_ROUNDS = 4  # a full queue: four times what the replicas hold at once
RATE_WINDOW_S = 30.0  # the completion rate is measured over the requests ended this recently


def replica_slots(replica: ReplicaState, request: RequestShape) -> int:
    """Requests like ``request`` the replica holds at once: its KV capacity over their KV need."""
    return max(1, replica.kv_capacity // max(replica.kv_need(request), 1))


def queue_bound(replicas: Sequence[ReplicaState], request: RequestShape, *, most: int) -> int:
    """How many requests like ``request`` may wait for the model: ``QUEUE_ROUNDS`` times its replicas'
    slots, at most ``most`` (``MAX_WAITING``; also the bound of a model with no replica listed)."""
    if not replicas:
        return most
    return max(1, min(most, QUEUE_ROUNDS * sum(replica_slots(r, request) for r in replicas)))


class CompletionRate:
    """Requests of one model that ended (completed, failed or cancelled: each frees its slot) per second,
    over the last ``RATE_WINDOW_S``, in one gateway process."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self._ended: deque[float] = deque()

    def ended(self) -> None:
        self._ended.append(time.monotonic())

    def per_s(self) -> float | None:
        """None when none ended in the window."""
        now = time.monotonic()
        while self._ended and now - self._ended[0] > RATE_WINDOW_S:
            self._ended.popleft()
        if not self._ended:
            return None
        return len(self._ended) / min(RATE_WINDOW_S, max(now - self.started, 1.0))


def planned_rate(replicas: Sequence[ReplicaState], request: RequestShape) -> float | None:
    """Requests like ``request`` the healthy replicas are estimated to finish per second (None: none is
    healthy)."""
    rates = [replica_slots(r, request) / max(r.estimate_finish(request), 1e-3)
             for r in replicas if r.health.ok]
    return sum(rates) if rates else None


def retry_after_s(queued: int, per_s: float | None, *, fallback_s: int) -> int:
    """Seconds until ``queued`` requests ahead have ended at ``per_s`` (whole seconds, at least 1);
    ``fallback_s`` when no rate is known."""
    if not per_s:
        return fallback_s
    return max(1, math.ceil(queued / per_s))
