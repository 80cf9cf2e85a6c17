"""Proposals from a draft model (docs/pipeline.md, "Draft model"): a small model sharing the target's
tokenizer, served as an ordinary one-stage pipeline of its own (its own process, KV cache with prefix
caching, health and transport), of which the target's head is a client.

For each decoding sequence the policy wants proposals for, the head submits the sequence so far (prompt
and output) with ``max_tokens`` k, greedy, and holds the sequence out of micro-batches
(``Scheduler.hold``) until its k tokens are back or its wait passes; it then goes with what came,
possibly nothing. The draft pipeline's prefix cache keeps the sequence's full blocks from one step to
the next, so each draft prefills only the partial tail and what the target emitted since. A draft
pipeline that is down, refuses or answers nothing in time costs the target only its proposals: the
link rests for ``RETRY_S``, then is tried again. Everything here is polled from the head's own loop:
no thread, no asyncio.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import zmq

from contracts.speculation import expected_tokens
from contracts.stage_spec import DraftLink, StageSpec

from .frames import FrameCodec, FrameError
from .scheduler import Request, Scheduler
from .speculation import Candidate, SpeculationPolicy, Speculator, proposal_room
from .transport import RECONNECT_MS

log = logging.getLogger(__name__)

# How long a held sequence waits for its draft: twice what the draft pipeline took per token so far
# times the tokens asked for, within these bounds (the longest until it has answered once).
DRAFT_WAIT_MIN_S = 0.02
DRAFT_WAIT_MAX_S = 0.2
TIMING_MEMORY = 0.8  # weight of the past in the draft pipeline's seconds per token, draft after draft
PROBE_EVERY = 16  # a sequence only the wait ruled out still asks for one token this often, to time it
RETRY_S = 1.0  # how long a link that failed (or answered nothing in time) rests before it is tried again
POLL_S = 0.001  # the head's longest wait for frames while sequences are held for their drafts


class DraftClient:
    """A DEALER socket to the draft pipeline's head speaking the client side of contracts §2
    synchronously: frames authenticated with the draft pipeline's token (``FrameCodec``). ``IMMEDIATE``
    as the stages' links: nothing is queued for a draft pipeline that is not connected, a send fails."""

    def __init__(self, link: DraftLink):
        self.address = link.address
        self.codec = FrameCodec(link.pipeline_id, link.auth_token)
        self._context = zmq.Context(io_threads=1)
        self._socket = self._context.socket(zmq.DEALER)
        for option, value in ((zmq.LINGER, 0), (zmq.IMMEDIATE, 1), (zmq.RECONNECT_IVL, RECONNECT_MS),
                              (zmq.RECONNECT_IVL_MAX, RECONNECT_MS)):
            self._socket.setsockopt(option, value)
        self._socket.connect(link.address)

    def send(self, header: dict[str, Any]) -> bool:
        """Whether the frame left (False: the draft pipeline is not connected or not keeping up)."""
        try:
            self._socket.send_multipart(self.codec.encode(header), flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        return True

    def receive(self) -> list[dict[str, Any]]:
        """The headers of the frames that arrived, without waiting; bad ones are dropped."""
        headers = []
        while True:
            try:
                parts = self._socket.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return headers
            try:
                headers.append(self.codec.decode(parts).header)
            except FrameError as exc:
                log.warning("dropped a frame from the draft pipeline at %s: %s", self.address, exc)

    def close(self) -> None:
        self._context.destroy(linger=0)


@dataclass
class Draft:
    draft_id: str
    length: int  # the sequence's length (prompt and output) it continues
    wanted: int
    asked: float  # when it was sent
    until: float  # when its sequence goes without the rest
    timed: bool = True  # whether its time says what a draft takes (a sequence's first prefills its prompt)
    tokens: list[int] = field(default_factory=list)
    done: bool = False


class ModelDrafter:
    """The :class:`~worker_runtime.speculation.Drafter` of a draft pipeline."""

    def __init__(self, client: DraftClient):
        self.client = client
        self._drafts: dict[int, Draft] = {}  # seq_id -> its latest draft
        self._seq_of: dict[str, int] = {}  # draft id -> seq_id, while it is awaited
        self._ids = itertools.count(1)
        self._prefix = uuid.uuid4().hex[:8]  # draft ids unique among the draft pipeline's clients
        self._resting_until = 0.0
        self.token_s: float | None = None  # the draft pipeline's seconds per drafted token, fading
        self._asked: set[int] = set()  # sequences the draft pipeline has seen (their prompt is cached there)
        self._refusals = 0  # asks ruled out by the wait since the last probe

    def prepare(self, scheduler: Scheduler, policy: SpeculationPolicy, ceiling: int) -> None:
        """Take the answers in; release the held sequences whose drafts are complete or late; then ask
        for drafts for the ready decoding sequences that have none for their current length, as many
        tokens as the policy would verify (proposals not known yet: each may carry ``ceiling``) and
        as still pay once the wait for the draft is counted (``_paying``)."""
        now = time.monotonic()
        self._collect(now)
        for seq_id in list(scheduler.held):
            draft = self._drafts.get(seq_id)
            if draft is None or draft.done or now > draft.until:
                if draft is not None and not draft.done:
                    self._end(draft, cancel=True, now=now)
                    if not draft.tokens:  # nothing came in time: the link is slow or gone
                        self._rest(now, "no draft tokens in time")
                scheduler.unhold(seq_id)
        if now < self._resting_until:
            return
        wanted = [(request, Candidate([0] * room, policy.acceptance(request.seq_id)))
                  for request in scheduler.ready
                  if (room := proposal_room(request, ceiling)) and not self._fresh(request)]
        if not wanted:
            return
        sequences = scheduler.share()
        policy.choose([c for _, c in wanted], sequences, sequences, scheduler.max_batch_tokens - sequences)
        for request, candidate in wanted:
            k = self._paying(policy, candidate, sequences)
            if k:
                wait = DRAFT_WAIT_MAX_S if self.token_s is None else 2 * self.token_s * k
                if not self._ask(request, k, now, now + min(DRAFT_WAIT_MAX_S, max(DRAFT_WAIT_MIN_S, wait))):
                    self._rest(now, "not connected")
                    return
                scheduler.hold(request)

    def _paying(self, policy: SpeculationPolicy, candidate: Candidate, sequences: int) -> int:
        """How many of the ``candidate.chosen`` tokens to ask for once the wait for them is counted: at
        most as many as raise the sequence's tokens per second, ``E(a, k) / (step + k x (token cost +
        draft time)) > 1 / step``, with the step the fitted round trip of a micro-batch of
        ``sequences`` and E(a, k) of ``contracts.speculation`` (all of them until the draft was timed)."""
        if self.token_s is None or not candidate.chosen:
            return candidate.chosen
        fixed, per_token = policy.cost.fit()
        step = fixed + per_token * sequences
        rate = candidate.acceptance
        for k in range(candidate.chosen, 0, -1):
            if expected_tokens(rate, k) * step > step + k * (per_token + self.token_s):
                return k
        if rate * step <= per_token:  # not even a draft that took no time would pay: nothing to learn
            return 0
        self._refusals += 1
        if self._refusals >= PROBE_EVERY:  # the draft's time may have changed: one token measures it
            self._refusals = 0
            return 1
        return 0

    def _ask(self, request: Request, k: int, now: float, until: float) -> bool:
        draft_id = f"draft-{self._prefix}-{next(self._ids)}"
        tokens = request.prompt + request.output
        sent = self.client.send({"type": "submit", "request_id": draft_id, "prompt": tokens, "max_tokens": k,
                                 "speculate": False, "deadline_s": DRAFT_WAIT_MAX_S * 5})
        if sent:
            self._drafts[request.seq_id] = Draft(draft_id, len(tokens), k, now, until,
                                                 timed=request.seq_id in self._asked)
            self._seq_of[draft_id] = request.seq_id
            self._asked.add(request.seq_id)
        return sent

    def _collect(self, now: float) -> None:
        for h in self.client.receive():
            if h.get("type") == "tokens":
                for draft_id, token, reason in h.get("items", ()):
                    draft = self._awaited(draft_id)
                    if draft is not None:
                        draft.tokens.append(int(token))
                        if reason is not None or len(draft.tokens) >= draft.wanted:
                            self._end(draft, now=now)
            elif h.get("type") == "error" and (draft := self._awaited(h.get("request_id"))) is not None:
                self._end(draft)
                if h.get("kind") != "rejected":  # not this draft's fault: the draft pipeline's
                    self._rest(now, str(h.get("message")))

    def _awaited(self, draft_id: Any) -> Draft | None:
        seq_id = self._seq_of.get(draft_id)
        return None if seq_id is None else self._drafts.get(seq_id)

    def _end(self, draft: Draft, cancel: bool = False, now: float | None = None) -> None:
        """``draft`` is over; with ``now``, the time it took per token (a late one: at least its wait
        per token it was asked for) joins the draft pipeline's timing."""
        draft.done = True
        self._seq_of.pop(draft.draft_id, None)
        if cancel:  # the draft pipeline stops working on it (a lost cancel: its deadline ends it)
            self.client.send({"type": "cancel", "request_id": draft.draft_id})
        if now is not None and draft.timed:
            taken = (now - draft.asked) / (draft.wanted if cancel else max(1, len(draft.tokens)))
            self.token_s = taken if self.token_s is None else (
                TIMING_MEMORY * self.token_s + (1 - TIMING_MEMORY) * taken)

    def _rest(self, now: float, why: str) -> None:
        if now >= self._resting_until:
            log.warning("draft pipeline at %s: %s; proposing nothing for %.1f s", self.client.address, why,
                        RETRY_S)
        self._resting_until = now + RETRY_S

    def _fresh(self, request: Request) -> Draft | None:
        draft = self._drafts.get(request.seq_id)
        length = len(request.prompt) + len(request.output)
        return draft if draft is not None and draft.length == length else None

    def propose(self, request: Request, room: int) -> list[int]:
        draft = self._fresh(request)
        self._drafts.pop(request.seq_id, None)
        return draft.tokens[:room] if draft is not None and draft.done else []

    def forget(self, seq_id: int) -> None:
        self._asked.discard(seq_id)
        draft = self._drafts.pop(seq_id, None)
        if draft is not None and not draft.done:
            self._end(draft, cancel=True)

    def close(self) -> None:
        self.client.close()


def speculator_for(spec: StageSpec) -> Speculator | None:
    """The head's speculative decoding as its spec asks (None: off): prompt lookup, or a draft model
    served at ``spec.draft``."""
    if spec.speculation == "off":
        return None
    drafter = ModelDrafter(DraftClient(spec.draft)) if spec.speculation == "draft" else None
    return Speculator(spec.speculative_tokens, drafter)
