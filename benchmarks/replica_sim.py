"""A discrete-event simulation of continuous-batching pipeline replicas, driven by the gateway's router.

Each simulated replica behaves like the pipeline head of worker_runtime: requests wait first come,
first served (at most ``max_queue`` of them) until the KV space for prompt + max_tokens can be
reserved (in whole blocks), then every step carries one decode token of each running sequence plus
whole prompts of newly admitted ones (up to a token budget), and takes ``decode_step_s +
decode_s_per_token × sequences + kv_read_s_per_token × their cached tokens + prefill_s_per_token ×
prompt tokens``. The router is the real ``controlplane.gateway.routing.Router`` with real
``ReplicaState`` bookkeeping (start / token / finish), exactly as the gateway calls it.

A replica may run slower for a while (``speed``: its share of full speed at a time, e.g. 0.5 while
throttled), and a ``LiveFeed`` plays the agents' telemetry to the router: every heartbeat each
replica reports its last second (mean step time and batch, its device's clock and throttle reasons)
and the gateway takes it in a little later, through the same ``routing.signals`` code the gateway's
live_health.py uses (health from the samples, measured costs from the step times).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane.gateway.routing import (
    Decision,
    DeviceSample,
    MeasuredCosts,
    ReplicaCosts,
    ReplicaState,
    RequestShape,
    Router,
    StageLink,
    StageSample,
    replica_reading,
)

MAX_CLOCK_MHZ = 1590


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
    speed: Callable[[float], float] = lambda now: 1.0  # share of full speed at a time (throttling)
    steps: deque = field(default_factory=lambda: deque(maxlen=10_000))  # (end, duration, sequences)

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

    def step_time(self, decoding: list[SimRequest], prefill: list[SimRequest], now: float = 0.0) -> float:
        c = self.costs
        return (
            c.decode_step_s
            + c.decode_s_per_token * (len(decoding) + len(prefill))
            + c.kv_read_s_per_token * sum(r.prompt + r.out for r in decoding)
            + c.prefill_s_per_token * sum(r.prompt for r in prefill)
        ) / self.speed(now)


@dataclass
class LiveFeed:
    """The agents' telemetry and the gateway's live_health, simulated: every ``heartbeat_s`` each
    replica's one stage reports the mean step time and batch of its last second and its device the
    clock (lowered by its throttling, with a throttle reason while throttled); ``lag_s`` later (the
    gateway's HEALTH_REFRESH_S) the router's replica takes in the health and measured costs that
    ``routing.signals`` derives from them."""

    heartbeat_s: float = 1.0
    lag_s: float = 0.5
    stale_s: float = 3.0
    measured: MeasuredCosts = field(default_factory=MeasuredCosts)

    def apply(self, replica: SimReplica, state: ReplicaState, planned: ReplicaCosts, now: float) -> None:
        at = now - self.lag_s  # when the agent took the sample
        recent = [(d, n) for end, d, n in replica.steps if at - self.heartbeat_s < end <= at]
        step_ms = 1000 * sum(d for d, _ in recent) / len(recent) if recent else 0.0
        batch = sum(n for _, n in recent) / len(recent) if recent else 0.0
        speed = replica.speed(at)
        link = StageLink(f"{replica.name}-s0", f"{replica.name}/gpu0")
        device = DeviceSample(link.device, self.lag_s, 0, 1, MAX_CLOCK_MHZ * speed, MAX_CLOCK_MHZ,
                              ("sw_thermal",) if speed < 1 else ())
        stage = StageSample(link.stage_key, self.lag_s, "ready", step_ms, batch)
        reading = replica_reading([link], {link.device: device}, {link.stage_key: stage},
                                  stale_s=self.stale_s)
        state.observe(health=reading.health)
        self.measured.add(state.replica_id, planned, at=at, reading=reading)
        state.costs, factor = self.measured.costs(state.replica_id, planned, now=now)
        state.costs_source = "measured" if factor is not None else "planned"


def simulate(
    trace: list[tuple[float, int, int]],
    replicas: list[SimReplica],
    router_costs: dict[str, ReplicaCosts],
    strategy: str,
    deadline_s: float,
    bypass_router: bool = False,
    until: float = float("inf"),
    live: LiveFeed | None = None,
) -> list[SimRequest]:
    """Run ``trace`` ([(arrival_s, prompt_tokens, max_tokens)]) through the router and replicas.

    ``bypass_router`` sends everything to the first replica, whose own queue then holds it all:
    how a replica's capacity is measured. The simulation stops at ``until`` simulated seconds.
    A request still unfinished at its deadline is cancelled (its KV space freed), as the gateway
    does when it answers 504. ``live``: the router also gets the replicas' telemetry (else it
    routes blind to it, on ``router_costs`` alone).
    """
    states = {r.name: ReplicaState(r.name, router_costs[r.name], r.kv_capacity) for r in replicas}
    router = Router([states[r.name] for r in replicas], strategy, explain=False)
    by_name = {r.name: r for r in replicas}
    order = itertools.count()
    events: list = []
    requests = [SimRequest(f"q{i}", t, p, m) for i, (t, p, m) in enumerate(trace)]
    for request in requests:
        heapq.heappush(events, (request.arrival, next(order), "arrive", request))
    if live is not None:
        heapq.heappush(events, (live.heartbeat_s + live.lag_s, next(order), "telemetry", None))

    def start_step(replica: SimReplica, now: float) -> None:
        prefill = replica.admit()
        decoding = list(replica.running)
        if not prefill and not decoding:
            replica.busy = False
            return
        replica.busy = True
        duration = replica.step_time(decoding, prefill, now)
        replica.steps.append((now + duration, duration, len(decoding) + len(prefill)))
        heapq.heappush(events, (now + duration, next(order), "step", (replica, prefill, decoding)))

    def end(replica: SimReplica, request: SimRequest, now: float) -> None:
        replica.running.remove(request)
        replica.kv_used -= replica.kv_need(request)
        states[replica.name].finish(request.rid)

    while events:
        now, _, kind, payload = heapq.heappop(events)
        if now > until:
            break
        if kind == "telemetry":
            for replica in replicas:
                live.apply(replica, states[replica.name], router_costs[replica.name], now)
            if events:  # requests still to come or running
                heapq.heappush(events, (now + live.heartbeat_s, next(order), "telemetry", None))
            continue
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
