"""Continuous batching at the head: admission by KV budget, micro-batches in flight, finishing requests.

Pure bookkeeping (no sockets, no torch), so every rule is tested alone. A request is admitted only
when every stage's KV cache can hold its whole length (prompt + ``max_tokens``): it then never fails
halfway for lack of memory, and the stages can allocate on demand. With prefix caching the blocks a
request finds cached are not counted again (worker_runtime/prefix_index.py decides what it reuses).
Admitted sequences rotate through ``micro_batches`` groups: a sequence is in at most one micro-batch
at a time (its next token depends on the last), and while one micro-batch is in a later stage the
head starts the next one, so with ``micro_batches >= num_stages`` every stage has work at once.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from contracts.pipeline_errors import RequestRejected
from contracts.sampling import SamplingParams

from .request_trace import RequestSpan


@dataclass(eq=False)  # identity: a request is one object, compared by `is`
class Request:
    request_id: str
    client: bytes
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    stop_token_ids: frozenset[int] = frozenset()
    deadline: float | None = None  # time.monotonic() by which it must finish
    seq_id: int = -1
    output: list[int] = field(default_factory=list)
    cached: int = 0  # leading prompt tokens found in the KV cache at admission: its first step starts there
    speculate: bool = True  # whether the head may propose tokens for it (speculation.py)
    proposals: list[int] = field(default_factory=list)  # tokens its step in flight verifies
    trace: RequestSpan | None = None  # its span, where its submit carried a sampled traceparent

    @classmethod
    def from_submit(cls, client: bytes, request_id: str, h: dict[str, Any], vocab: int) -> Request:
        """The request a client's ``submit`` header asks for; :class:`RequestRejected` naming what is
        wrong with it."""
        try:
            prompt = [int(t) for t in h["prompt"]]
            params = SamplingParams.from_header(h.get("sampling", {}))
            max_tokens = int(h["max_tokens"])
            stop = frozenset(int(t) for t in h.get("stop_token_ids", ()))
            deadline_s = None if h.get("deadline_s") is None else float(h["deadline_s"])
            speculate = h.get("speculate", True)
            if not isinstance(speculate, bool):
                raise TypeError(f"speculate must be true or false, not {speculate!r}")
        except (KeyError, TypeError, ValueError) as exc:
            raise RequestRejected(f"malformed request: {exc}") from exc
        if not prompt or max_tokens < 1 or any(not 0 <= t < vocab for t in prompt):
            raise RequestRejected(f"a request needs a non-empty prompt of token ids below {vocab} and "
                                  "max_tokens >= 1")
        if (constraint := params.constraint) is not None:
            if constraint.generated >= len(prompt):
                raise RequestRejected("a constraint's generated tokens are fewer than the prompt's")
            if problem := constraint.problem():
                raise RequestRejected(f"the constraint does not compile: {problem}")
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        # a request that scores or is constrained is not speculated: one sampled row per step, whose
        # entry (log-probabilities) or mask (structured.py) it gets
        return cls(request_id, client, prompt, params, max_tokens, stop, deadline,
                   speculate=speculate and not params.scores and constraint is None,
                   trace=RequestSpan.of_submit(h.get("traceparent"), request_id, len(prompt), max_tokens))

    @property
    def kv_tokens(self) -> int:
        return len(self.prompt) + self.max_tokens

    def next_input(self) -> tuple[list[int], int]:
        """The tokens this sequence feeds next and the position of the first: the prompt from its first
        uncached token, then its last token and the proposals to verify after it."""
        if not self.output:
            return self.prompt[self.cached:], self.cached
        return [self.output[-1], *self.proposals], len(self.prompt) + len(self.output) - 1

    def step_params(self) -> SamplingParams:
        """The sampling parameters of this request's next step: a constraint goes with the prefill only,
        where the last stage makes the sequence's matcher (structured.py), which lasts as its KV does."""
        if self.output and self.params.constraint is not None:
            return replace(self.params, constraint=None)
        return self.params

    def finish_reason(self) -> str | None:
        if self.output and self.output[-1] in self.stop_token_ids:
            return "stop"
        if len(self.output) >= self.max_tokens:
            return "length"
        return None


class BlockUse(Protocol):
    """What the head's own KV cache says of its blocks. Every stage holds the same blocks for each
    sequence and the same cached ones (docs/pipeline.md, "Prefix caching"), so stage 0's cache is the
    model of every stage's; the stages differ only in capacity."""

    @property
    def used_blocks(self) -> int: ...

    @property
    def evictable_blocks(self) -> int: ...

    def blocks_of(self, seq_id: int) -> int: ...


class NothingAllocated:
    """A ledger without a cache to ask (the scheduler alone): every admitted block is still to come."""

    used_blocks = evictable_blocks = 0

    def blocks_of(self, seq_id: int) -> int:
        return 0


class KVLedger:
    """Blocks in use or promised, counted against every stage's capacity.

    A stage's blocks are those its cache holds (sequences' and cached ones, ``cache.used_blocks``) plus
    those the admitted sequences may still take to reach their whole length. A request is admitted
    when that, plus its own blocks not found cached, fits the tightest stage; the head evicts cached
    blocks first where it does not (``shortfall``). Every stage must use one block size.
    """

    def __init__(self, cache: BlockUse | None = None) -> None:
        self.cache = cache or NothingAllocated()
        self.capacity: dict[int, int] = {}  # stage -> blocks
        self.block_size: int | None = None
        self._totals: dict[int, int] = {}  # admitted seq_id -> blocks at its whole length

    def set_stage(self, stage: int, capacity_tokens: int, block_size: int) -> None:
        if self.block_size not in (None, block_size):
            raise ValueError(f"stage {stage} has KV blocks of {block_size} tokens, the head "
                             f"{self.block_size}: a pipeline's stages share one block size")
        self.block_size = block_size
        self.capacity[stage] = capacity_tokens // block_size

    def blocks(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def largest(self) -> int:
        """The longest sequence the pipeline could ever hold (the smallest stage's whole cache)."""
        return min(self.capacity.values()) * self.block_size

    def _committed(self) -> int:
        """Blocks every stage holds or has promised to the admitted sequences."""
        promised = sum(max(0, total - self.cache.blocks_of(seq_id)) for seq_id, total in self._totals.items())
        return self.cache.used_blocks + promised

    def shortfall(self, blocks: int) -> int:
        """How many cached blocks must be evicted before ``blocks`` more fit on every stage (0: they fit)."""
        committed = self._committed()
        return max([0, *(committed + blocks - capacity for capacity in self.capacity.values())])

    def free_tokens(self) -> dict[int, int]:
        """Tokens a new request could still take per stage, cached blocks no sequence holds included."""
        free = self.cache.evictable_blocks - self._committed()
        return {s: (capacity + free) * self.block_size for s, capacity in self.capacity.items()}

    def reserve(self, seq_id: int, blocks: int) -> None:
        """Count ``seq_id`` as admitted, reaching ``blocks`` blocks (those it attached included)."""
        self._totals[seq_id] = blocks

    def try_reserve(self, seq_id: int, tokens: int) -> bool:
        blocks = self.blocks(tokens)
        if self.shortfall(blocks):
            return False
        self.reserve(seq_id, blocks)
        return True

    def release(self, seq_id: int) -> None:
        self._totals.pop(seq_id, None)


@dataclass
class MicroBatch:
    id: int
    requests: list[Request]
    sent_at: float
    tokens: int = 0  # fed to the pipeline, proposals included: set by the head once it starts


class Scheduler:
    def __init__(self, ledger: KVLedger, micro_batches: int, max_batch_tokens: int, max_queue: int,
                 admission: Callable[[Request], bool] | None = None):
        """``admission(request)``: reserve the request's KV and say whether it was admitted (default: its
        whole length from the ledger; the head's prefix index finds cached blocks first)."""
        self.ledger = ledger
        self.admission = admission or (lambda r: ledger.try_reserve(r.seq_id, r.kv_tokens))
        self.micro_batches, self.max_batch_tokens, self.max_queue = micro_batches, max_batch_tokens, max_queue
        self.requests: dict[str, Request] = {}  # every request not yet finished: waiting, ready or in flight
        self.waiting: deque[Request] = deque()  # not admitted yet
        self.ready: deque[Request] = deque()  # admitted, waiting for their next micro-batch
        self.held: dict[int, Request] = {}  # admitted, waiting for their proposals first (hold)
        self.in_flight: dict[int, MicroBatch] = {}
        self._by_seq: dict[int, Request] = {}
        self._seq_ids = itertools.count(1)  # never reused, so a late token of a dead sequence is just ignored
        self._mb_ids = itertools.count(1)
        self.completed = 0
        self.rejected = 0

    def submit(self, request: Request) -> None:
        """Queue a request for admission, or raise :class:`RequestRejected` saying why not."""
        problem = None
        if request.request_id in self.requests:
            problem = f"request id {request.request_id!r} is already running"
        elif request.kv_tokens > self.ledger.largest():
            problem = (
                f"request needs {request.kv_tokens} KV tokens (prompt {len(request.prompt)} + max_tokens "
                f"{request.max_tokens}) but the smallest stage holds {self.ledger.largest()}"
            )
        elif len(self.waiting) >= self.max_queue:
            problem = f"queue full: {len(self.waiting)} requests are waiting for KV space"
        if problem:
            self.rejected += 1
            if request.trace is not None:
                request.trace.end("rejected")
            raise RequestRejected(problem)
        request.seq_id = next(self._seq_ids)
        self.requests[request.request_id] = request
        self._by_seq[request.seq_id] = request
        self.waiting.append(request)
        self.admit()

    def admit(self) -> None:
        """First come, first served: admit waiting requests while every stage has room for them."""
        while self.waiting and self.admission(self.waiting[0]):
            request = self.waiting.popleft()
            self.ready.append(request)
            if request.trace is not None:
                request.trace.admitted(request.cached)

    def share(self) -> int:
        """The sequences of a micro-batch: an even share of the admitted ones."""
        admitted = len(self.ready) + len(self.held) + sum(len(mb.requests) for mb in self.in_flight.values())
        return math.ceil(admitted / self.micro_batches)

    def hold(self, request: Request) -> None:
        """Keep a ready request out of micro-batches until :meth:`unhold` (its drafts are on the way)."""
        self.ready.remove(request)
        self.held[request.seq_id] = request

    def unhold(self, seq_id: int) -> None:
        """A held request is ready again (nothing happens to one that ended meanwhile)."""
        request = self.held.pop(seq_id, None)
        if request is not None:
            self.ready.append(request)

    def next_micro_batch(self) -> MicroBatch | None:
        """The next group to run, if a micro-batch slot is free: an even share of the admitted sequences."""
        if not self.ready or len(self.in_flight) >= self.micro_batches:
            return None
        share = self.share()
        chosen: list[Request] = []
        tokens = 0
        while self.ready and len(chosen) < share:
            size = len(self.ready[0].next_input()[0])
            if chosen and tokens + size > self.max_batch_tokens:
                break
            chosen.append(self.ready.popleft())
            tokens += size
        mb = MicroBatch(next(self._mb_ids), chosen, time.monotonic())
        self.in_flight[mb.id] = mb
        for request in chosen:
            if request.trace is not None:
                request.trace.step(mb.id, len(request.next_input()[0]), prefill=not request.output)
        return mb

    def on_tokens(self, mb_id: int, seq_ids: list[int],
                  tokens: list[int | list[int]]) -> list[tuple[Request, int, str | None]]:
        """Record the sampled tokens of a returned micro-batch (a list where a sequence emits several,
        a verified speculation); finished requests leave the scheduler, their tokens past the end
        dropped."""
        self.in_flight.pop(mb_id, None)
        events = []
        for seq_id, emitted in zip(seq_ids, tokens):
            request = self._by_seq.get(seq_id)
            if request is None:  # cancelled or failed meanwhile
                continue
            reason = None
            for token in emitted if isinstance(emitted, list) else [emitted]:
                request.output.append(int(token))
                reason = request.finish_reason()
                if request.trace is not None:
                    request.trace.token()
                events.append((request, int(token), reason))
                if reason is not None:
                    break
            if reason is None:
                self.ready.append(request)
            else:
                self.completed += 1
                self._forget(request, reason)
        self.admit()
        return events

    def on_failed(self, mb_id: int) -> list[Request]:
        """A micro-batch that a stage could not run: its requests leave the scheduler and fail."""
        mb = self.in_flight.pop(mb_id, None)
        failed = [r for r in (mb.requests if mb else []) if r.seq_id in self._by_seq]
        for request in failed:
            self._forget(request, "failed")
        self.admit()
        return failed

    def remove(self, request_id: str) -> Request | None:
        """Take a request out wherever it is (cancel, deadline); its micro-batch may still return, ignored."""
        request = self.requests.get(request_id)
        if request is not None:
            self._forget(request, "removed")
            self.admit()
        return request

    def held_by_client(self) -> dict[bytes, list[str]]:
        """The ids of the requests not yet finished, by the client that sent them."""
        held: dict[bytes, list[str]] = {}
        for request in self.requests.values():
            held.setdefault(request.client, []).append(request.request_id)
        return held

    def expired(self, now: float) -> list[Request]:
        return [r for r in self.requests.values() if r.deadline is not None and now > r.deadline]

    def overdue(self, now: float, timeout_s: float) -> list[int]:
        """Micro-batches in flight longer than ``timeout_s``: lost in a stage that failed."""
        return [mb.id for mb in self.in_flight.values() if now - mb.sent_at > timeout_s]

    def clear(self) -> list[Request]:
        """Drop everything (the pipeline broke); returns the requests that must fail."""
        failed = list(self.requests.values())
        for request in failed:
            self._forget(request, "broken")
        self.in_flight.clear()
        return failed

    def _forget(self, request: Request, outcome: str) -> None:
        """``outcome``: the finish reason, or why it leaves without one (its span's, where it has one)."""
        if request.trace is not None:
            request.trace.end(outcome)
            request.trace = None
        self.requests.pop(request.request_id, None)
        self._by_seq.pop(request.seq_id, None)
        self.ledger.release(request.seq_id)
        self.held.pop(request.seq_id, None)
        for queue in (self.waiting, self.ready):
            if request in queue:
                queue.remove(request)
