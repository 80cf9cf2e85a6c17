"""Router decisions and queue times, kept in memory for the dashboard and the ``stats`` figures.

In-memory on purpose: these are per-process, high-rate and lossy-by-design figures (the telemetry
invariant), not control state. ``router_telemetry()`` is what the dashboard reads.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field

RECENT = 500


@dataclass
class RouteRecord:
    request_id: str
    model: str
    strategy: str
    at: float  # wall clock, seconds
    replica: str | None  # None: rejected
    outcome: str  # "running" | "rejected:<reason>" | "completed" | "failed:<kind>" | "cancelled"
    estimated_ttft_s: float | None = None
    estimated_finish_s: float | None = None
    queue_s: float | None = None  # routed → first token: time waiting in the replica plus prefill
    e2e_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class RouterRecorder:
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT))
    totals: Counter = field(default_factory=Counter)
    _by_id: dict[str, RouteRecord] = field(default_factory=dict)

    def record(self, record: RouteRecord) -> None:
        self.recent.append(record)
        self.totals[(record.model, record.replica or "-", record.outcome)] += 1
        if record.replica is not None:
            self._by_id[record.request_id] = record

    def first_token(self, request_id: str, queue_s: float) -> None:
        if (record := self._by_id.get(request_id)) is not None:
            record.queue_s = queue_s

    def finished(self, request_id: str, outcome: str, e2e_s: float, completion_tokens: int) -> None:
        if (record := self._by_id.pop(request_id, None)) is not None:
            record.outcome, record.e2e_s, record.completion_tokens = outcome, e2e_s, completion_tokens
            self.totals[(record.model, record.replica, outcome)] += 1

    def snapshot(self) -> dict:
        queue_times = [r.queue_s for r in self.recent if r.queue_s is not None]
        return {
            "at": time.time(),
            "queue_s": {"p50": _percentile(queue_times, 0.5), "p99": _percentile(queue_times, 0.99)},
            "totals": [
                {"model": m, "replica": r, "outcome": o, "count": n}
                for (m, r, o), n in sorted(self.totals.items())
            ],
            "recent": [asdict(r) for r in list(self.recent)[-50:]],
        }


recorder = RouterRecorder()


def router_telemetry() -> dict:
    """Recent decisions, queue-time percentiles and outcome counts of this gateway process."""
    return recorder.snapshot()
