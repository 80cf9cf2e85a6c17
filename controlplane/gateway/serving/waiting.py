"""Requests waiting for a routable replica: one bounded FIFO queue per model, in one gateway.

Why a queue: a change of placement (a boundary move, a drain, a re-plan after a lost node) leaves a
model without a routable replica for the moment the new pipeline takes to answer, and overload leaves
every replica busy; failing every request of those moments would make each change an outage and each
burst a wall of 429s. So a request that finds no replica able to take it waits here (admission.py)
and is admitted, first come first served, as soon as the router can place it. Bounded twice: in
length, from the plan's capacity (shedding.py, at most ``MAX_WAITING``), and in time by ``WAIT_S``
(and the request's own deadline), so nothing waits forever (the "nothing hangs" invariant).

The queue itself only orders and counts: ``ModelQueue.changed`` wakes its waiters whenever the gateway
learned something (served models re-read, a head answered) and at least every ``WAIT_POLL_S``;
the head of the queue then asks the router again; a request of the model that ends wakes them too
(``ended``: a slot freed) and counts in the model's completion rate (shedding.py). Its figures are
per process, in memory (as the router's records): depth now, waits ended and how, the longest and
mean wait, for ``gateway_stats``; the same waits go to Prometheus (``observability.serving``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque

from controlplane.gateway.serving.shedding import CompletionRate
from controlplane.observability import serving

OUTCOMES = ("admitted", "timed_out", "full", "refused", "cancelled")


class Waiter:
    """One request's place in its model's queue."""

    def __init__(self) -> None:
        self.since = time.monotonic()


class ModelQueue:
    def __init__(self, model: str) -> None:
        self.model = model
        self.entries: deque[Waiter] = deque()
        self.outcomes: Counter = Counter()
        self.longest_s = 0.0
        self.total_s = 0.0
        self._changed = asyncio.Event()
        self.completions = CompletionRate()

    def __len__(self) -> int:
        return len(self.entries)

    def join(self, *, front: bool) -> Waiter:
        """A new waiter; ``front``: a request resumed after its pipeline broke goes before new ones (it
        was admitted earlier)."""
        waiter = Waiter()
        (self.entries.appendleft if front else self.entries.append)(waiter)
        serving.wait_started(model=self.model)
        return waiter

    def first(self, waiter: Waiter) -> bool:
        return bool(self.entries) and self.entries[0] is waiter

    def leave(self, waiter: Waiter, outcome: str) -> float:
        """The waiter's wait ended (``OUTCOMES``); returns how long it waited. Idempotent."""
        waited = time.monotonic() - waiter.since
        if waiter not in self.entries:
            return waited
        self.entries.remove(waiter)
        self.outcomes[outcome] += 1
        self.longest_s = max(self.longest_s, waited)
        self.total_s += waited
        serving.wait_ended(model=self.model, outcome=outcome, waited_s=waited)
        self.notify()  # the next one may try at once
        return waited

    def refused_full(self) -> None:
        """A request found the queue full: counted, never queued."""
        self.outcomes["full"] += 1
        serving.wait_ended(model=self.model, outcome="full", waited_s=0.0)

    def ended(self) -> None:
        """A request of the model ended: its slot is free for the first waiter."""
        self.completions.ended()
        if self.entries:
            self.notify()

    def notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, timeout_s: float) -> None:
        """Until something changed (``notify``) or ``timeout_s`` passed."""
        try:
            async with asyncio.timeout(max(timeout_s, 0.0)):
                await self._changed.wait()
        except TimeoutError:
            pass

    def snapshot(self) -> dict:
        ended = sum(n for outcome, n in self.outcomes.items() if outcome != "full")
        return {
            "depth": len(self.entries),
            "oldest_s": round(time.monotonic() - self.entries[0].since, 3) if self.entries else None,
            "waited": ended,
            **{outcome: self.outcomes[outcome] for outcome in OUTCOMES},
            "longest_s": round(self.longest_s, 3),
            "avg_s": round(self.total_s / ended, 3) if ended else None,
        }


class Waiting:
    """Every model's queue in one gateway (one event loop: the queues' events belong to it)."""

    def __init__(self) -> None:
        self.queues: dict[str, ModelQueue] = {}

    def queue(self, model: str) -> ModelQueue:
        if model not in self.queues:
            self.queues[model] = ModelQueue(model)
        return self.queues[model]

    def active(self) -> bool:
        return any(q.entries for q in self.queues.values())

    def notify_all(self) -> None:
        for queue in self.queues.values():
            if queue.entries:
                queue.notify()

    def snapshot(self, model: str) -> dict:
        return self.queue(model).snapshot()
