"""Admission and choice: one place decides whether a request may run and where.

For cost-aware routing a replica is a candidate when it is healthy, has the KV space to finish the
request now (so nothing waits in a replica's queue and no cache overflows) and is estimated to
finish it within the deadline. The baselines (round-robin, least-outstanding-tokens) behave like a
conventional load balancer: any healthy replica is a candidate, a request that does not fit waits in
that replica's bounded queue (contracts §2, ``max_queue``) and a late one gets the gateway's 504.
With no candidate the router refuses at once (the gateway then answers, or makes an ``unavailable``
request wait for a replica: controlplane/gateway/serving/admission.py):

- ``unavailable`` (503): no healthy replica;
- ``too_large`` (400): no healthy replica could hold prompt + max_tokens even when idle;
- ``saturated`` (429): healthy replicas exist but none can take it now within the deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts.routing import DEFAULT_ROUTING_STRATEGY
from controlplane.gateway.routing.costs import RequestShape
from controlplane.gateway.routing.state import ReplicaState
from controlplane.gateway.routing.strategies import CAPACITY_AWARE, PREFIX_BLIND, STRATEGIES


@dataclass(frozen=True)
class ReplicaInputs:
    """What the router knew of one replica when it decided: shown with every decision, so an operator
    can see why a request went where it went. ``reason``: why it was not a candidate ("" if it was);
    ``cached_tokens``: the request's leading prompt tokens its head is expected to hold, not
    prefilled again (None: its head reports no prefix summary); ``estimated_finish_s``: for healthy
    replicas, the request's estimated end-to-end time there."""

    replica: str
    healthy: bool
    candidate: bool
    reason: str
    slowdown: float
    throttle: float
    memory_pressure: float
    error_rate: float
    costs_source: str
    decode_step_s: float
    kv_free: int
    outstanding_tokens: int
    in_flight: int
    external_queued: int
    cached_tokens: int | None
    estimated_finish_s: float | None

    @classmethod
    def of(cls, replica: ReplicaState, request: RequestShape, *, candidate: bool, reason: str,
           finish: float | None) -> ReplicaInputs:
        h = replica.health
        return cls(
            replica.replica_id, h.ok, candidate, reason, round(h.slowdown, 4), h.throttle, h.memory_pressure,
            h.error_rate, replica.costs_source, replica.costs.decode_step_s, replica.kv_free,
            replica.outstanding_tokens, replica.in_flight, replica.external_queued,
            None if replica.prefix_summary is None else replica.cached_tokens(request),
            None if finish is None else round(finish, 4),
        )


@dataclass(frozen=True)
class Decision:
    replica: ReplicaState
    strategy: str
    estimated_ttft_s: float
    estimated_finish_s: float
    candidates: int
    inputs: tuple[ReplicaInputs, ...] = ()
    cached_tokens: int = 0  # of the prompt, expected at the chosen replica's head


@dataclass(frozen=True)
class Rejection:
    reason: str  # "too_large" | "unavailable" | "saturated"
    message: str
    inputs: tuple[ReplicaInputs, ...] = ()

    @property
    def status(self) -> int:
        return {"too_large": 400, "unavailable": 503, "saturated": 429}[self.reason]


class Router:
    """Routes requests over a deployment's replicas with one strategy. ``explain`` (default): each
    decision and rejection carries the inputs of every replica (``ReplicaInputs``)."""

    def __init__(
        self, replicas: list[ReplicaState], strategy: str = DEFAULT_ROUTING_STRATEGY, *, explain: bool = True
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown routing strategy {strategy!r}; choose one of {sorted(STRATEGIES)}")
        self.replicas = replicas
        self.strategy = strategy
        self.explain = explain
        self._choose = STRATEGIES[strategy]
        self._cursor = 0

    def route(
        self, request: RequestShape, *, deadline_s: float, exclude: frozenset[str] = frozenset()
    ) -> Decision | Rejection:
        """Choose a replica for ``request`` or refuse it. The caller books an accepted request with
        ``decision.replica.start(request_id, request)`` once it has a request id. ``exclude``: replicas
        not to choose (one that just refused this request), counted as unavailable."""
        why: dict[str, str] = {}
        finish: dict[str, float] = {}
        healthy = []
        for r in self.replicas:
            if r.replica_id in exclude:
                why[r.replica_id] = "it refused this request"
            elif r.health.ok:
                healthy.append(r)
            else:
                why[r.replica_id] = r.health.reason or "unhealthy"
        if not healthy:
            detail = "; ".join(f"{name}: {reason}" for name, reason in why.items())
            message = "no healthy replica of this model is available" + (f" ({detail})" if detail else "")
            return Rejection("unavailable", message, self._inputs(request, why, finish))
        candidates = []
        for r in healthy:
            if r.could_ever_fit(request):
                candidates.append(r)
            else:
                why[r.replica_id] = f"needs {r.kv_need(request)} KV tokens; holds {r.kv_capacity}"
        if not candidates:
            biggest = max(r.kv_capacity for r in healthy)
            return Rejection(
                "too_large",
                f"prompt ({request.prompt_tokens} tokens) plus max_tokens ({request.max_tokens}) exceeds "
                f"the largest replica's KV capacity of {biggest} tokens",
                self._inputs(request, why, finish),
            )
        # what the strategy weighs: a prefix-blind one admits, as it chooses, as if nothing were cached
        weighed = request.prefix_blind() if self.strategy in PREFIX_BLIND else request
        if self.strategy in CAPACITY_AWARE or self.explain:
            finish = {r.replica_id: r.estimate_finish(weighed) for r in candidates}
        if self.strategy in CAPACITY_AWARE:
            admitted = []
            for r in candidates:
                if not r.fits(request):
                    why[r.replica_id] = f"needs {r.kv_need(request)} KV tokens; {r.kv_free} free"
                elif finish[r.replica_id] > deadline_s:
                    why[r.replica_id] = f"estimated {finish[r.replica_id]:.1f} s > deadline {deadline_s:g} s"
                else:
                    admitted.append(r)
            candidates = admitted
        if not candidates:
            return Rejection(
                "saturated",
                f"all {len(healthy)} replicas are busy: none can finish this request within {deadline_s:g} s",
                self._inputs(request, why, finish),
            )
        chosen = self._choose(request, candidates, self._cursor)
        self._cursor += 1
        return Decision(
            replica=chosen,
            strategy=self.strategy,
            estimated_ttft_s=chosen.estimate_ttft(weighed),
            estimated_finish_s=finish.get(chosen.replica_id) or chosen.estimate_finish(weighed),
            candidates=len(candidates),
            cached_tokens=chosen.cached_tokens(request),
            inputs=self._inputs(request, why, finish),
        )

    def _inputs(self, request: RequestShape, why: dict[str, str],
                finish: dict[str, float]) -> tuple[ReplicaInputs, ...]:
        if not self.explain:
            return ()
        return tuple(
            ReplicaInputs.of(r, request, candidate=r.replica_id not in why, reason=why.get(r.replica_id, ""),
                             finish=finish.get(r.replica_id))
            for r in self.replicas
        )
