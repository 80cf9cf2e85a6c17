"""Router decisions and queue times, kept in memory for the dashboard and the ``stats`` figures.

In-memory on purpose: these are per-process, high-rate and lossy-by-design figures (the telemetry
invariant), not control state. ``decision_stats()`` is what the dashboard reads. Each record keeps
the inputs the router saw for every replica (``ReplicaInputs.as_dict``); the outcomes per replica
give its recent error rate (``RouterRecorder.error_rate``), one of the router's health inputs. Each
decision, first token and end is also counted for Prometheus (``controlplane.observability.serving``:
vLLM's request metrics by model and replica, the router's decisions by reason). A request resumed
on another replica after its pipeline broke (generation.py) stays one record: ``migrated`` moves it,
its gauges and later figures to the new replica and counts the break in the old one's error rate.

Where several gateway processes share one view (fleet_view.py), each record names the process that
decided (``process``), the error rate counts the outcomes every live process published
(``peer_outcomes``), and each ended record waits in ``ended`` until it is published for the others'
``GET /api/v1/gateway/router/``.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field

from controlplane.gateway.serving.fleet_store import process_id
from controlplane.observability import serving

RECENT = 500
ERROR_WINDOW_S = 60.0  # the error rate counts the outcomes of the last minute
ERROR_MIN_REQUESTS = 5  # ... over at least this many requests (one failure alone is 20%, not 100%)
# the replica's fault (not 429s, 504s, cancels)
REPLICA_ERRORS = frozenset({"failed:broken", "failed:failed"})


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
    cached_tokens: int = 0  # of the prompt, expected at the chosen replica's head (not prefilled again)
    completion_tokens: int = 0
    inputs: list[dict] = field(default_factory=list)  # what the router saw of each replica (ReplicaInputs)
    waited_s: float = 0.0  # in the gateway's queue for a routable replica (waiting.py), resumptions included
    migrations: int = 0  # times resumed on another replica after its pipeline broke
    replicas: list[str] = field(default_factory=list)  # every replica it ran on, in order
    process: str = field(default_factory=process_id)  # the gateway process that decided


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
    _outcomes: dict[str, deque] = field(default_factory=dict)  # replica -> (monotonic time, failed)
    # replica -> the other live gateway processes' (requests, failed) of the error window
    peer_outcomes: dict[str, tuple[int, int]] = field(default_factory=dict)
    ended: deque = field(default_factory=lambda: deque(maxlen=RECENT))  # ended records not yet published
    started_at: float = field(default_factory=time.time)  # no record of this process is older

    def record(self, record: RouteRecord) -> None:
        if record.replica is not None:
            record.replicas = [record.replica]
        self.recent.append(record)
        self.totals[(record.model, record.replica or "-", record.outcome)] += 1
        if record.replica is not None:
            self._by_id[record.request_id] = record
        else:
            self.ended.append(record)
        serving.request_decided(model=record.model, strategy=record.strategy, replica=record.replica,
                                outcome=record.outcome)

    def first_token(self, request_id: str, queue_s: float) -> None:
        if (record := self._by_id.get(request_id)) is not None:
            record.queue_s = queue_s
            serving.request_first_token(model=record.model, replica=record.replica, ttft_s=queue_s,
                                        prompt_tokens=record.prompt_tokens)

    def finished(self, request_id: str, outcome: str, e2e_s: float, completion_tokens: int) -> None:
        if (record := self._by_id.pop(request_id, None)) is not None:
            record.outcome, record.e2e_s, record.completion_tokens = outcome, e2e_s, completion_tokens
            self.totals[(record.model, record.replica, outcome)] += 1
            self.ended.append(record)
            serving.request_finished(model=record.model, replica=record.replica, outcome=outcome, e2e_s=e2e_s,
                                     ttft_s=record.queue_s, completion_tokens=completion_tokens)
            if outcome != "cancelled":
                outcomes = self._outcomes.setdefault(record.replica, deque(maxlen=RECENT))
                outcomes.append((time.monotonic(), outcome in REPLICA_ERRORS))

    def migrated(self, request_id: str, *, to: str, kind: str, waited_s: float) -> None:
        """The request's pipeline broke (``kind``: broken, rejected) and it was resumed on ``to``: the
        old replica gets the failure in its error rate, the gauges and later figures follow the request."""
        if (record := self._by_id.get(request_id)) is None:
            return
        old = record.replica
        self.totals[(record.model, old, "migrated")] += 1
        self._outcomes.setdefault(old, deque(maxlen=RECENT)).append((time.monotonic(), kind == "broken"))
        serving.request_migrated(model=record.model, replica=old, to=to, started=record.queue_s is not None)
        record.replica, record.migrations, record.waited_s = (
            to, record.migrations + 1, record.waited_s + waited_s)
        record.replicas.append(to)

    def outcomes(self, replica: str, *, now: float | None = None) -> tuple[int, int]:
        """This process's requests on the replica that ended in the last ``ERROR_WINDOW_S``, and how
        many of them failed by its fault (a broken pipeline, a failed request)."""
        now = time.monotonic() if now is None else now
        recent = [failed for at, failed in self._outcomes.get(replica, ()) if now - at <= ERROR_WINDOW_S]
        return len(recent), sum(recent)

    def error_rate(self, replica: str, *, now: float | None = None) -> float:
        """Share of the replica's requests of the last ``ERROR_WINDOW_S``, those of every live gateway
        process, that failed by its fault, over at least ``ERROR_MIN_REQUESTS``."""
        (n, failed), (peer_n, peer_failed) = self.outcomes(replica, now=now), self.peer_outcomes.get(
            replica, (0, 0))
        return (failed + peer_failed) / max(n + peer_n, ERROR_MIN_REQUESTS)

    def snapshot(self) -> dict:
        queue_times = [r.queue_s for r in self.recent if r.queue_s is not None]
        return {
            "at": time.time(),
            "migrated": sum(n for (_, _, outcome), n in self.totals.items() if outcome == "migrated"),
            "queue_s": {"p50": _percentile(queue_times, 0.5), "p99": _percentile(queue_times, 0.99)},
            "totals": [
                {"model": m, "replica": r, "outcome": o, "count": n}
                for (m, r, o), n in sorted(self.totals.items())
            ],
            "recent": [asdict(r) for r in list(self.recent)[-50:]],
        }


recorder = RouterRecorder()


def decision_stats() -> dict:
    """Recent decisions, queue-time percentiles and outcome counts of this gateway process."""
    return recorder.snapshot()
