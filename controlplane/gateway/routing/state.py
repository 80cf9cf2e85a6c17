"""A replica as the router sees it: its costs and capacity, what it has in flight, and its health.

The gateway is the only way requests reach a replica, so its own bookkeeping (what it admitted and
how far each request got) is the exact, up-to-the-token picture of the load; telemetry adds what
bookkeeping cannot know: KV space used by others, thermal throttling, memory pressure, errors, and
which prompt prefixes its head caches (the summary its statistics carry).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from contracts.prefix_cache import PrefixSummary
from controlplane.gateway.routing.costs import ReplicaCosts, RequestShape, time_to_finish, time_to_first_token

ERROR_PENALTY = 10.0  # an error rate of 10% makes a replica look twice as slow
# Above this share of a device's memory in use a replica looks slower: past what any plan fills (the
# planner leaves 5% of each card and 384 MiB free), so only memory taken by something else counts.
MEMORY_PRESSURE_KNEE = 0.96
MEMORY_PRESSURE_PENALTY = 25.0  # 99% in use: 1.75x
SENT_MAX = 4096  # prompts remembered between two summaries: a head silent for long forgets the oldest


class _Unchanged(Enum):
    """``observe``'s default for the prefix summary, whose ``None`` means the head caches nothing."""

    UNCHANGED = "unchanged"


@dataclass(frozen=True)
class ReplicaHealth:
    """From telemetry. ``throttle``: share of clock lost to thermal/power limits (0..1);
    ``memory_pressure``: share of device memory in use (0..1); ``error_rate``: recent share of
    requests that failed (0..1); ``ok`` False: broken (a stage died, its telemetry went stale, its
    head does not answer), never chosen, and ``reason`` says why."""

    ok: bool = True
    throttle: float = 0.0
    memory_pressure: float = 0.0
    error_rate: float = 0.0
    reason: str = ""

    @property
    def slowdown(self) -> float:
        """Factor applied to every time estimate of the replica (1 when healthy)."""
        throttled = 1.0 / max(1.0 - min(self.throttle, 0.95), 0.05)
        pressure = 1.0 + MEMORY_PRESSURE_PENALTY * max(0.0, self.memory_pressure - MEMORY_PRESSURE_KNEE)
        return throttled * pressure * (1.0 + ERROR_PENALTY * self.error_rate)


@dataclass(frozen=True)
class PeerLoad:
    """What other gateway processes have in flight on a replica, as they last published it
    (controlplane/gateway/serving/fleet_view.py). Added to this process's own bookkeeping, so each
    process routes on the load of the whole fleet of gateways, not on its own share of it."""

    in_flight: int = 0
    unstarted: int = 0  # requests not prefilled yet
    queued_tokens: int = 0
    kv_reserved: int = 0
    running: tuple[tuple[int, int], ...] = ()  # (context, tokens left to decode) of each request

    def __add__(self, other: PeerLoad) -> PeerLoad:
        return PeerLoad(self.in_flight + other.in_flight, self.unstarted + other.unstarted,
                        self.queued_tokens + other.queued_tokens, self.kv_reserved + other.kv_reserved,
                        self.running + other.running)


@dataclass
class _InFlight:
    prompt: int
    prefill_left: int  # the prompt's tokens not cached at the head, until its first token
    decode_left: int
    kv_tokens: int  # reserved: whole KV blocks
    generated: int = 0


@dataclass
class ReplicaState:
    """One replica of a deployment. ``kv_capacity``: the smallest stage's KV budget, tokens;
    ``kv_block_tokens``: its KV page size (the head reserves whole pages, worker_runtime's 16);
    ``prefix_summary``: the prompt prefixes its head last said it caches (None: none, or caching off)."""

    replica_id: str
    costs: ReplicaCosts
    kv_capacity: int
    health: ReplicaHealth = field(default_factory=ReplicaHealth)
    kv_block_tokens: int = 16
    costs_source: str = "assumed"  # where ``costs`` come from: measured | planned | stated | assumed
    prefix_summary: PrefixSummary | None = None
    peers: PeerLoad = field(default_factory=PeerLoad)  # the other gateway processes' load here
    _in_flight: dict[str, _InFlight] = field(default_factory=dict, repr=False)
    # The head's last free-KV figure and the reservations of every process sharing the view when it was
    # read: what the head lacks beyond those is someone else's, against whatever the capacity is now (it
    # changes with a new plan).
    _head_kv_free: int | None = field(default=None, repr=False)
    _reserved_when_heard: int = field(default=0, repr=False)
    _external_queued: int = field(default=0, repr=False)
    # Prompts sent here that the head's last summary may not show yet: request id -> (the names of
    # its blocks in the summary's chain, prefilled or ended), and all those names.
    _sent: dict[str, tuple[list[int], bool]] = field(default_factory=dict, repr=False)
    _sent_names: set[int] = field(default_factory=set, repr=False)

    # -- load figures -------------------------------------------------------------------------------
    def own_load(self) -> PeerLoad:
        """This process's own bookkeeping of the replica, as the other processes see it."""
        flights = self._in_flight.values()
        return PeerLoad(len(self._in_flight), sum(1 for r in flights if r.prefill_left), self._queued_tokens,
                        self.kv_reserved, tuple((r.prompt + r.generated, r.decode_left) for r in flights))

    @property
    def kv_reserved(self) -> int:
        """KV tokens this process reserved here."""
        return sum(r.kv_tokens for r in self._in_flight.values())

    @property
    def kv_free(self) -> int:
        return self.kv_capacity - self.kv_reserved - self.external_kv

    @property
    def external_kv(self) -> int:
        """KV tokens in use at the head that this process did not reserve: the other gateway processes'
        reservations, plus what the head lacks beyond all of those when it was last heard (a gateway
        that shares no view, or a reservation not published yet)."""
        if self._head_kv_free is None:
            return self.peers.kv_reserved
        unknown = self.kv_capacity - self._head_kv_free - self._reserved_when_heard
        return self.peers.kv_reserved + max(0, unknown)

    @property
    def _queued_tokens(self) -> int:
        return sum(r.prefill_left for r in self._in_flight.values())

    @property
    def queued_tokens(self) -> int:
        """Prompt tokens admitted but not yet prefilled (those the head caches are not prefilled), by
        every gateway process."""
        return self._queued_tokens + self.peers.queued_tokens

    @property
    def external_queued(self) -> int:
        """Requests waiting in the head's queue that no gateway process sharing the view sent."""
        return self._external_queued

    @property
    def running_tokens(self) -> int:
        """Tokens the running sequences may still decode, every gateway process's."""
        own = sum(r.decode_left for r in self._in_flight.values())
        return own + sum(left for _, left in self.peers.running)

    @property
    def outstanding_tokens(self) -> int:
        return self.queued_tokens + self.running_tokens

    @property
    def in_flight(self) -> int:
        return len(self._in_flight) + self.peers.in_flight

    def kv_need(self, request: RequestShape) -> int:
        """The KV space the head will reserve for the request: whole blocks."""
        return -(-request.kv_tokens // self.kv_block_tokens) * self.kv_block_tokens

    def fits(self, request: RequestShape) -> bool:
        return self.kv_need(request) <= self.kv_free

    def could_ever_fit(self, request: RequestShape) -> bool:
        return self.kv_need(request) <= self.kv_capacity

    def cached_tokens(self, request: RequestShape) -> int:
        """Leading prompt tokens of the request that this replica's head is expected to hold: in its
        last summary, or sent here since (a conversation's next turn may come before the next poll)."""
        return request.cached_on(self.prefix_summary, self._sent_names)

    def _queued_ahead(self, request: RequestShape) -> int:
        """Prompt tokens ahead of the request: those of the gateway processes that share the view,
        exactly; the head's other queued requests each counted as one of the request's own size
        (their sizes are unknown here)."""
        return self.queued_tokens + self._external_queued * request.prompt_tokens

    def estimate_ttft(self, request: RequestShape) -> float:
        queued, cached = self._queued_ahead(request), self.cached_tokens(request)
        return time_to_first_token(self.costs, request, queued, cached) * self.health.slowdown

    def estimate_finish(self, request: RequestShape) -> float:
        running = [(r.prompt + r.generated, r.decode_left) for r in self._in_flight.values()]
        running.extend(self.peers.running)
        return (time_to_finish(self.costs, request, self._queued_ahead(request), running,
                               self.cached_tokens(request))
                * self.health.slowdown)

    # -- bookkeeping --------------------------------------------------------------------------------
    def start(self, request_id: str, request: RequestShape) -> None:
        """The request was sent here: reserve its KV space (the whole length: the head reserves it, cached
        or not) and count its tokens (its prefill: those the head does not cache)."""
        self._in_flight[request_id] = _InFlight(
            request.prompt_tokens, request.prompt_tokens - self.cached_tokens(request), request.max_tokens,
            self.kv_need(request),
        )
        if request.prefix is not None and (summary := self.prefix_summary) is not None:
            if len(self._sent) >= SENT_MAX:
                self._sent.pop(next(iter(self._sent)))
            names = request.prefix.names(summary.seed, summary.block_size)
            self._sent[request_id] = (names, False)
            self._sent_names.update(names)

    def token(self, request_id: str) -> None:
        """One more token of the request was sampled (the first one ends its prefill)."""
        if (r := self._in_flight.get(request_id)) is not None:
            if r.prefill_left and request_id in self._sent:
                self._sent[request_id] = (self._sent[request_id][0], True)
            r.prefill_left = 0
            r.decode_left = max(0, r.decode_left - 1)
            r.generated += 1

    def finish(self, request_id: str) -> None:
        """Finished, failed or cancelled: its KV space is free again (its prompt's blocks stay cached at
        the head, until the next summary says what it kept). Idempotent."""
        self._in_flight.pop(request_id, None)
        if request_id in self._sent:
            self._sent[request_id] = (self._sent[request_id][0], True)

    def observe(
        self, *, health: ReplicaHealth | None = None, kv_tokens_free: int | None = None,
        queue_depth: int | None = None,
        prefix_summary: PrefixSummary | None | _Unchanged = _Unchanged.UNCHANGED,
    ) -> None:
        """Telemetry: health, the head's free KV tokens (what it lacks beyond the reservations of every
        gateway process sharing the view is used by someone else), the head's queue (requests waiting
        for KV space beyond those of the gateways not started yet are someone else's) and the summary
        of the prefixes it caches (None: it caches none; left out: unchanged)."""
        if not isinstance(prefix_summary, _Unchanged):
            self._summarized(prefix_summary)
        if health is not None:
            self.health = health
        if kv_tokens_free is not None:
            self._head_kv_free = kv_tokens_free
            self._reserved_when_heard = self.kv_reserved + self.peers.kv_reserved
        if queue_depth is not None:
            ours = sum(1 for r in self._in_flight.values() if r.prefill_left) + self.peers.unstarted
            self._external_queued = max(0, queue_depth - ours)

    def _summarized(self, summary: PrefixSummary | None) -> None:
        """A new summary covers every prompt sent here that was prefilled (or ended) before it; those
        still waiting are remembered until a later one. A summary in another chain (a re-formed
        pipeline, a new epoch: its caches start empty) or none forgets them all."""
        old, self.prefix_summary = self.prefix_summary, summary
        same_chain = (summary is not None and old is not None
                      and (old.seed, old.block_size) == (summary.seed, summary.block_size))
        self._sent = {rid: sent for rid, sent in self._sent.items() if not sent[1]} if same_chain else {}
        self._sent_names = {name for names, _ in self._sent.values() for name in names}
