"""How to choose among the replicas that may take a request (admission already filtered them).

Each strategy is ``choose(request, candidates, cursor) -> ReplicaState``; ``cursor`` counts the
requests routed so far, which only round-robin uses. ``CAPACITY_AWARE`` names the strategies that
admit a request only where it fits and finishes in time; the baselines route as a conventional load
balancer does and leave admission to each replica's own bounded queue.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from contracts.routing import ROUTING_STRATEGIES
from controlplane.gateway.routing.costs import RequestShape
from controlplane.gateway.routing.state import ReplicaState

Strategy = Callable[[RequestShape, Sequence[ReplicaState], int], ReplicaState]


def cost_aware(request: RequestShape, candidates: Sequence[ReplicaState], cursor: int) -> ReplicaState:
    """The replica that finishes the request soonest (ties: the one with more free KV). Its estimate
    counts only the prompt tokens that replica's head does not cache, so a conversation returns to
    the replica holding its history until that replica's queue costs more than the reuse saves."""
    return min(candidates, key=lambda r: (r.estimate_finish(request), -r.kv_free))


def cost_aware_prefix_blind(
    request: RequestShape, candidates: Sequence[ReplicaState], cursor: int
) -> ReplicaState:
    """Baseline for prefix reuse: ``cost_aware`` with every replica's cached tokens taken as 0, the cost
    router blind to where a prompt's prefix is cached (the heads still reuse what they hold)."""
    return cost_aware(request.prefix_blind(), candidates, cursor)


def least_outstanding_tokens(
    request: RequestShape, candidates: Sequence[ReplicaState], cursor: int
) -> ReplicaState:
    """Baseline: the replica with the fewest queued and running tokens, blind to its speed."""
    return min(candidates, key=lambda r: (r.outstanding_tokens, -r.kv_free))


def round_robin(request: RequestShape, candidates: Sequence[ReplicaState], cursor: int) -> ReplicaState:
    """Baseline: each replica in turn."""
    return candidates[cursor % len(candidates)]


STRATEGIES: dict[str, Strategy] = {
    "cost_aware": cost_aware,
    "cost_aware_prefix_blind": cost_aware_prefix_blind,
    "least_outstanding_tokens": least_outstanding_tokens,
    "round_robin": round_robin,
}
# a name a deployment can store, unrunnable
if tuple(sorted(STRATEGIES)) != tuple(sorted(ROUTING_STRATEGIES)):
    raise ImportError(f"router strategies {sorted(STRATEGIES)} differ from contracts.routing's "
                      f"{sorted(ROUTING_STRATEGIES)}")
CAPACITY_AWARE = frozenset({"cost_aware", "cost_aware_prefix_blind"})
# the strategies whose admission, as their choice, does not count the cached prefix
PREFIX_BLIND = frozenset({"cost_aware_prefix_blind"})
