"""A discrete-event simulation of continuous-batching pipeline replicas, driven by the gateway's router.

Each simulated replica behaves like the pipeline head of worker_runtime: requests wait first come,
first served (at most ``max_queue`` of them) until the KV space for prompt + max_tokens can be
reserved (in whole blocks), then every step carries one decode token of each running sequence plus
whole prompts of newly admitted ones (up to a token budget), and takes ``decode_step_s +
decode_s_per_token × sequences + kv_read_s_per_token × their cached tokens + prefill_s_per_token ×
prompt tokens``. The router is the real ``controlplane.gateway.routing.Router`` with real
``ReplicaState`` bookkeeping (start / token / finish), exactly as the gateway calls it.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field

from controlplane.gateway.routing import Decision, ReplicaCosts, ReplicaState, RequestShape, Router


@dataclass
class SimRequest:
    rid: str
    arrival: float
    prompt: int
    max_tokens: int
    replica: str | None = None
    rejected: str | None = None
    out: int = 0
    first_token_at: float | None = None
    done_at: float | None = None
    timed_out: bool = False  # still running at its deadline: the gateway answered 504 and cancelled it
    waited_for_kv: bool = False


@dataclass
class SimReplica:
    name: str
    costs: ReplicaCosts
    kv_capacity: int
    max_prefill_tokens: int = 4096
    max_queue: int = 256  # as the head: a request finding this many waiting is refused (429)
    kv_block_tokens: int = 16
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    kv_used: int = 0
    busy: bool = False
    peak_kv: int = 0

    def admit(self) -> list[SimRequest]:
        """Admit waiting requests in order while their KV fits and the step's prompt budget lasts."""
        admitted, budget = [], self.max_prefill_tokens
        while self.waiting:
            request = self.waiting[0]
            need = self.kv_need(request)
            if self.kv_used + need > self.kv_capacity or (admitted and request.prompt > budget):
                break
            self.waiting.popleft()
            self.kv_used += need
            self.peak_kv = max(self.peak_kv, self.kv_used)
            budget -= request.prompt
            admitted.append(request)
        if self.waiting:
            for request in self.waiting:
                request.waited_for_kv = True
        return admitted

    def kv_need(self, request: SimRequest) -> int:
        """Whole KV blocks, as the head reserves them."""
        return -(-(request.prompt + request.max_tokens) // self.kv_block_tokens) * self.kv_block_tokens

    def step_time(self, decoding: list[SimRequest], prefill: list[SimRequest]) -> float:
        c = self.costs
        return (
            c.decode_step_s
            + c.decode_s_per_token * (len(decoding) + len(prefill))
            + c.kv_read_s_per_token * sum(r.prompt + r.out for r in decoding)
            + c.prefill_s_per_token * sum(r.prompt for r in prefill)
        )


def simulate(
    trace: list[tuple[float, int, int]],
    replicas: list[SimReplica],
    router_costs: dict[str, ReplicaCosts],
    strategy: str,
    deadline_s: float,
    bypass_router: bool = False,
    until: float = float("inf"),
) -> list[SimRequest]:
    """Run ``trace`` ([(arrival_s, prompt_tokens, max_tokens)]) through the router and replicas.

    ``bypass_router`` sends everything to the first replica, whose own queue then holds it all:
    how a replica's capacity is measured. The simulation stops at ``until`` simulated seconds.
    A request still unfinished at its deadline is cancelled (its KV space freed), as the gateway
    does when it answers 504.
    """
    states = {r.name: ReplicaState(r.name, router_costs[r.name], r.kv_capacity) for r in replicas}
    router = Router([states[r.name] for r in replicas], strategy)
    by_name = {r.name: r for r in replicas}
    order = itertools.count()
    events: list = []
    requests = [SimRequest(f"q{i}", t, p, m) for i, (t, p, m) in enumerate(trace)]
    for request in requests:
        heapq.heappush(events, (request.arrival, next(order), "arrive", request))

    def start_step(replica: SimReplica, now: float) -> None:
        prefill = replica.admit()
        decoding = list(replica.running)
        if not prefill and not decoding:
            replica.busy = False
            return
        replica.busy = True
        duration = replica.step_time(decoding, prefill)
        heapq.heappush(events, (now + duration, next(order), "step", (replica, prefill, decoding)))

    def end(replica: SimReplica, request: SimRequest, now: float) -> None:
        replica.running.remove(request)
        replica.kv_used -= replica.kv_need(request)
        states[replica.name].finish(request.rid)

    while events:
        now, _, kind, payload = heapq.heappop(events)
        if now > until:
            break
        if kind == "arrive":
            request = payload
            shape = RequestShape(request.prompt, request.max_tokens)
            if bypass_router:
                outcome = Decision(router.replicas[0], strategy, 0.0, 0.0, 1)
            else:
                outcome = router.route(shape, deadline_s=deadline_s)
            if not isinstance(outcome, Decision):
                request.rejected = outcome.reason
                continue
            request.replica = outcome.replica.replica_id
            outcome.replica.start(request.rid, shape)
            replica = by_name[request.replica]
            if len(replica.waiting) >= replica.max_queue:
                request.rejected = "queue_full"
                outcome.replica.finish(request.rid)
                continue
            replica.waiting.append(request)
            if not replica.busy:
                start_step(replica, now)
            continue
        replica, prefill, decoding = payload
        state = states[replica.name]
        for request in prefill:
            request.first_token_at = now
            replica.running.append(request)
        for request in prefill + decoding:
            request.out += 1
            state.token(request.rid)
            if request.out >= request.max_tokens:
                request.done_at = now
                end(replica, request, now)
            elif now - request.arrival >= deadline_s:
                request.timed_out = True
                end(replica, request, now)
        start_step(replica, now)
    return requests
