"""Admission and choice: one place decides whether a request may run and where.

For cost-aware routing a replica is a candidate when it is healthy, has the KV space to finish the
request now (so nothing waits in a replica's queue and no cache overflows) and is estimated to
finish it within the deadline. The baselines (round-robin, least-outstanding-tokens) behave like a
conventional load balancer: any healthy replica is a candidate, a request that does not fit waits in
that replica's bounded queue (contracts §2, ``max_queue``) and a late one gets the gateway's 504.
With no candidate the request is refused at once (the gateway keeps no queue of its own):

- ``unavailable`` (503): no healthy replica;
- ``too_large`` (400): no healthy replica could hold prompt + max_tokens even when idle;
- ``saturated`` (429): healthy replicas exist but none can take it now within the deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts.routing import DEFAULT_ROUTING_STRATEGY
from controlplane.gateway.routing.costs import RequestShape
from controlplane.gateway.routing.state import ReplicaState
from controlplane.gateway.routing.strategies import CAPACITY_AWARE, STRATEGIES


@dataclass(frozen=True)
class Decision:
    replica: ReplicaState
    strategy: str
    estimated_ttft_s: float
    estimated_finish_s: float
    candidates: int


@dataclass(frozen=True)
class Rejection:
    reason: str  # "too_large" | "unavailable" | "saturated"
    message: str

    @property
    def status(self) -> int:
        return {"too_large": 400, "unavailable": 503, "saturated": 429}[self.reason]


class Router:
    """Routes requests over a deployment's replicas with one strategy."""

    def __init__(self, replicas: list[ReplicaState], strategy: str = DEFAULT_ROUTING_STRATEGY) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown routing strategy {strategy!r}; choose one of {sorted(STRATEGIES)}")
        self.replicas = replicas
        self.strategy = strategy
        self._choose = STRATEGIES[strategy]
        self._cursor = 0

    def route(self, request: RequestShape, *, deadline_s: float) -> Decision | Rejection:
        """Choose a replica for ``request`` or refuse it. The caller books an accepted request with
        ``decision.replica.start(request_id, request)`` once it has a request id."""
        healthy = [r for r in self.replicas if r.health.ok]
        if not healthy:
            return Rejection("unavailable", "no healthy replica of this model is available")
        if not any(r.could_ever_fit(request) for r in healthy):
            biggest = max(r.kv_capacity for r in healthy)
            return Rejection(
                "too_large",
                f"prompt ({request.prompt_tokens} tokens) plus max_tokens ({request.max_tokens}) exceeds "
                f"the largest replica's KV capacity of {biggest} tokens",
            )
        candidates = [r for r in healthy if r.could_ever_fit(request)]
        if self.strategy in CAPACITY_AWARE:
            candidates = [
                r for r in candidates if r.fits(request) and r.estimate_finish(request) <= deadline_s
            ]
        if not candidates:
            return Rejection(
                "saturated",
                f"all {len(healthy)} replicas are busy: none can finish this request within {deadline_s:g} s",
            )
        chosen = self._choose(request, candidates, self._cursor)
        self._cursor += 1
        return Decision(
            replica=chosen,
            strategy=self.strategy,
            estimated_ttft_s=chosen.estimate_ttft(request),
            estimated_finish_s=chosen.estimate_finish(request),
            candidates=len(candidates),
        )
