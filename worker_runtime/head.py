"""The head: stage 0's loop, where requests enter, micro-batches start and sampled tokens come back.

It owns all request state (the :class:`~worker_runtime.scheduler.Scheduler`) and the pipeline's health:
every other stage heartbeats here, so one place decides that a stage is dead (its previous stage's
link to it went down, as when its process dies and its sockets close; silent for ``peer_timeout_s``;
or restarted with a new incarnation), fails every request in flight with
:class:`~contracts.pipeline_errors.PipelineBroken`, and once all stages answer again starts a new epoch
with a ``reset`` that wipes their caches: a restarted stage rejoins without anyone restarting the rest.

A new pipeline, complete for the first time, runs one request of its own before its health says ok
(warm_up.py); one re-formed around its head, or whose head took a new spec in place (``warmed``), not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from contracts.pipeline_errors import DeadlineExceeded, PipelineBroken, PipelineError, RequestRejected
from contracts.sampling import SamplingParams
from contracts.stage_spec import StageSpec

from .events import EventWriter, Every
from .frames import Frame
from .kv_cache import KVBudgetExceeded
from .protocol import batch_message
from .relay import heartbeat_interval
from .scheduler import KVLedger, Request, Scheduler
from .stage import Batch
from .transport import Incoming, PeerUnavailable, Transport
from .warm_up import CLIENT as WARM_UP
from .warm_up import warm_up_request
from .worker import StageWorker

log = logging.getLogger(__name__)
KEEPALIVE_S = 0.5


@dataclass
class Peer:
    incarnation: str
    last_seen: float
    stats: dict
    linked: bool  # its link to the next stage is up (a pipeline is complete only when every one is)


class HeadLoop:
    def __init__(self, spec: StageSpec, worker: StageWorker, transport: Transport, events: EventWriter,
                 warmed: bool = False):
        self.spec, self.worker, self.transport, self.events = spec, worker, transport, events
        kv = worker.stage.kv
        self.ledger = KVLedger()
        self.ledger.set_stage(0, kv.capacity_tokens, kv.block_size)
        self.scheduler = Scheduler(
            self.ledger, spec.micro_batches or spec.num_stages, spec.max_batch_tokens, spec.max_queue
        )
        self.peers: dict[int, Peer] = {}
        self.epoch = time.time_ns()  # larger than any epoch of a previous head, so stages drop stale work
        self.healthy = spec.num_stages == 1
        self.reason = "" if self.healthy else "waiting for every stage to join"
        self.broken_stage: int | None = None
        self.broken_at = time.monotonic()
        self.draining = False
        self.warming: str | None = None  # the warm-up request's id while it runs
        self.warm_up_due = not warmed  # until a warm-up ran through this pipeline
        self._pending_free: list[int] = []
        self._keepalive = Every(KEEPALIVE_S)
        self._stats_line = Every(1.0)
        self._check = Every(heartbeat_interval(spec))
        if self.healthy:  # one stage: whole from the start
            self._complete()

    # ----- the loop

    def run(self, stopping: Callable[[], bool], replaced: Callable[[], bool] = lambda: False) -> None:
        """Serve until ``stopping()``; then refuse new requests and finish (or fail) the rest within ``peer_timeout_s``.

        ``replaced()``: this stage is being replaced by a new spec, and so are the stages downstream
        whose relays the in-flight requests need; they can never finish, so they fail at once
        (``PipelineBroken``) and the gateway resumes them elsewhere instead of waiting out the drain.
        """
        drain_until = None
        while True:
            if replaced():
                self._fail(self.scheduler.clear(), PipelineBroken("stage replaced"))
                return
            if drain_until is None and stopping():
                self.draining = True
                drain_until = time.monotonic() + self.spec.peer_timeout_s
            if drain_until is not None and (not self.scheduler.requests or time.monotonic() > drain_until):
                self._fail(self.scheduler.clear(), PipelineBroken("the head stage is shutting down"))
                return
            busy = self.healthy and self.scheduler.ready and len(self.scheduler.in_flight) < self.scheduler.micro_batches
            waited = time.perf_counter()
            incoming = self.transport.receive(0 if busy else 0.02)
            if not busy:
                self.worker.stats.record_idle(time.perf_counter() - waited)
            for message in incoming:
                self.handle(message)
            self.tick()
            if self.healthy:
                self.step()

    def step(self) -> None:
        """Start micro-batches while slots are free: stage 0's layers here, the rest downstream.

        Pending ``free`` frames go first: a request admitted into space just freed must not reach a
        stage before that space is freed there.
        """
        self._flush_frees()
        while (mb := self.scheduler.next_micro_batch()) is not None:
            inputs = [r.next_input() for r in mb.requests]
            batch = Batch.of_tokens([r.seq_id for r in mb.requests], [t for t, _ in inputs], [s for _, s in inputs])
            params = [r.params for r in mb.requests]
            try:
                out, compute_s = self.worker.step(batch, params)
            except (KVBudgetExceeded, ValueError) as exc:
                self._fail(self.scheduler.on_failed(mb.id), PipelineError(f"stage 0: {exc}"))
                continue
            sent = time.perf_counter()
            if self.spec.num_stages == 1:
                self.on_tokens(mb.id, batch.seq_ids, out.tolist())
            else:
                header, tensors = batch_message(self.epoch, mb.id, batch, params, out)
                try:
                    self.transport.send_next(header, tensors)
                except PeerUnavailable as exc:
                    self.break_pipeline(1, f"stage 1 is unreachable: {exc}")
                    return
            self.worker.record(batch, compute_s, time.perf_counter() - sent)

    def tick(self) -> None:
        now = time.monotonic()
        for request in self.scheduler.expired(now):
            self._end(request, DeadlineExceeded(f"request {request.request_id} passed its deadline"))
        if self._check.due():
            self.check_peers(now)
            for mb_id in self.scheduler.overdue(now, self.spec.peer_timeout_s):
                self._fail(self.scheduler.on_failed(mb_id), PipelineBroken(f"micro-batch {mb_id} was lost in the pipeline"))
        if self._keepalive.due():  # each client hears which of its requests the head holds (contracts §2)
            for client, ids in self.scheduler.held_by_client().items():
                self._tell(client, {"type": "alive", "requests": ids})
        self.worker.stats.queue_depth = len(self.scheduler.waiting)
        if self._stats_line.due():
            self.events.emit("stats", pipeline_id=self.spec.pipeline_id, stage_index=0, **self.own_stats())

    # ----- health

    def check_peers(self, now: float) -> None:
        missing = [i for i in range(1, self.spec.num_stages) if i not in self.peers]
        silent = [i for i, p in self.peers.items() if now - p.last_seen > self.spec.peer_timeout_s]
        if self.healthy and silent:
            self.break_pipeline(silent[0], f"stage {silent[0]} silent for over {self.spec.peer_timeout_s} s")
        elif self.healthy and not self.transport.next_linked():  # stage 1 died: its socket closed
            self.break_pipeline(1, "the head lost its link to stage 1")
        elif not self.healthy and not missing and all(p.last_seen > self.broken_at and p.linked
                                                      for p in self.peers.values()):
            try:
                self.transport.send_next({"type": "reset", "epoch": self.epoch})
            except PeerUnavailable:
                return  # stage 1 heartbeats but our link to it is not up yet: try again next check
            log.info("pipeline %s complete: epoch %d", self.spec.pipeline_id, self.epoch)
            self._complete()

    def _complete(self) -> None:
        """The pipeline is whole: ok now if a warm-up already ran through it, else start one (warm_up.py);
        health turns ok when it ends, however it ends: it only spares clients a slow first request."""
        if not self.warm_up_due:
            self._set_health(True, "", None)
            return
        request = warm_up_request(epoch=self.epoch, vocab_size=self.worker.stage.config.vocab_size,
                                  largest=self.ledger.largest(), max_batch_tokens=self.spec.max_batch_tokens,
                                  timeout_s=self.spec.peer_timeout_s)
        self.warming = request.request_id
        self._set_health(True, "warming up: one request through the pipeline", None)  # not ok, none broken
        try:
            self.scheduler.submit(request)
        except RequestRejected:
            self._warmed()

    def _warmed(self) -> None:
        """The warm-up ended, however it did: ok, unless the pipeline broke under it (the next warms up)."""
        self.warming = None
        if self.healthy:
            self.warm_up_due = False
            self._set_health(True, "", None)

    def break_pipeline(self, stage: int, reason: str) -> None:
        """Fail everything in flight, wipe stage 0's cache and wait for all stages to answer again."""
        log.warning("pipeline %s broken: %s", self.spec.pipeline_id, reason)
        self._set_health(False, reason, stage)
        self.broken_at = time.monotonic()
        self.epoch += 1
        self._fail(self.scheduler.clear(), PipelineBroken(f"pipeline {self.spec.pipeline_id} broken: {reason}"))
        self.worker.stage.kv.clear()
        self._pending_free.clear()

    def _set_health(self, healthy: bool, reason: str, broken_stage: int | None) -> None:
        """Change the pipeline's health and tell the agent at once (a ``health`` event on stdout)."""
        self.healthy, self.reason, self.broken_stage = healthy, reason, broken_stage
        self.events.emit("health", pipeline_id=self.spec.pipeline_id, **self.health())

    def on_heartbeat(self, header: dict[str, Any]) -> None:
        index, incarnation = header.get("stage_index"), header.get("incarnation")
        if not isinstance(index, int) or not 0 < index < self.spec.num_stages:
            log.warning("heartbeat from an unknown stage %r", index)
            return
        known = self.peers.get(index)
        linked = header.get("linked", True) is not False
        if known is not None and known.incarnation != incarnation and self.healthy:
            self.break_pipeline(index, f"stage {index} restarted and lost its state")
        elif not linked and self.healthy:
            # Its link onward went down: the next stage died (its socket closed) or is restarting.
            # What that stage held is lost now; waiting for its silence would stall every request
            # in flight for peer_timeout_s.
            self.break_pipeline(index + 1, f"stage {index} lost its link to stage {index + 1}")
        elif not linked and known is not None and known.linked and known.incarnation == incarnation:
            # Broken already (re-forming after a restart), and a link that was up went down: nothing
            # is in flight to fail, but the stage is named, so that the control plane can still tell
            # a dead agent from a dropped connection at once (its node's liveness rule, contracts §3).
            # A relay whose link was never up yet (its next stage still starting) names nobody.
            self._set_health(False, f"stage {index} lost its link to stage {index + 1}", index + 1)
        self.peers[index] = Peer(str(incarnation), time.monotonic(), dict(header.get("stats") or {}), linked)
        self.ledger.set_stage(index, int(header["kv_capacity"]), int(header["block_size"]))
        if not self.healthy:  # the last stage heard again completes the pipeline now, not at the next check
            self.check_peers(time.monotonic())

    def on_leaving(self, header: dict[str, Any]) -> None:
        """A relay replaced by a new spec or drained said goodbye: what it held is lost, fail it now;
        and forget it, so a re-forming pipeline waits for the stage that takes its place. (A stage
        moved to another device drains where it was: heard after the break, it completed the pipeline
        before the new one was heard, whose first heartbeat then broke it again.)"""
        index = header.get("stage_index")
        known = self.peers.get(index) if isinstance(index, int) else None
        if known is None or known.incarnation != header.get("incarnation"):
            return
        if self.healthy:
            self.break_pipeline(index, f"stage {index} is being replaced")
        del self.peers[index]

    # ----- messages

    def handle(self, message: Incoming) -> None:
        """Act on one frame; an authenticated but malformed one is logged and dropped, never fatal."""
        try:
            self._dispatch(message)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("dropped a malformed %r frame: %r", message.frame.type, exc)

    def _dispatch(self, message: Incoming) -> None:
        frame, kind = message.frame, message.frame.type
        handler = {
            "submit": self.on_submit,
            "cancel": self.on_cancel,
            "stats": self.on_query,
            "health": self.on_query,
        }.get(kind)
        if handler is not None:
            handler(message.peer, frame.header)
        elif kind == "heartbeat":
            self.on_heartbeat(frame.header)
        elif kind == "leaving":
            self.on_leaving(frame.header)
        elif kind in ("tokens", "failed"):
            self.on_result(frame)
        else:
            log.warning("dropped a frame of unknown type %r", kind)

    def on_result(self, frame: Frame) -> None:
        h = frame.header
        if h.get("epoch") != self.epoch:
            return  # belongs to the pipeline before a reset
        if frame.type == "tokens":
            self.on_tokens(h["mb"], h["seq_ids"], h["tokens"])
        elif h.get("link") is True and isinstance(h.get("stage_index"), int) and self.healthy:
            # The next stage is unreachable from there: every request in flight is lost with it, and
            # the gateway resumes them elsewhere (PipelineBroken) once the pipeline is whole again.
            self.break_pipeline(h["stage_index"] + 1, str(h.get("message")))
        else:
            self._fail(self.scheduler.on_failed(h["mb"]), PipelineError(str(h.get("message"))))

    def on_tokens(self, mb_id: int, seq_ids: list[int], tokens: list[int]) -> None:
        """Stream a micro-batch's tokens: one ``tokens`` frame per client, not one frame per token.

        A client (the gateway) usually holds most of a micro-batch's requests, and every frame costs
        an encode, an HMAC and a wake-up on both sides.
        """
        by_client: dict[bytes, list[list]] = {}
        for request, token, reason in self.scheduler.on_tokens(mb_id, seq_ids, tokens):
            by_client.setdefault(request.client, []).append([request.request_id, token, reason])
            if reason is not None:
                self._release(request)
        for client, items in by_client.items():
            self._tell(client, {"type": "tokens", "items": items})

    def on_submit(self, client: bytes, h: dict[str, Any]) -> None:
        request_id = str(h.get("request_id"))
        try:
            if not self.healthy:
                raise PipelineBroken(f"pipeline {self.spec.pipeline_id} is not serving: {self.reason}")
            if self.draining:
                raise PipelineBroken(f"pipeline {self.spec.pipeline_id} is draining")
            request = self._parse_submit(client, request_id, h)
            self.scheduler.submit(request)
        except PipelineError as exc:
            self._send_error(client, request_id, exc)

    def _parse_submit(self, client: bytes, request_id: str, h: dict[str, Any]) -> Request:
        vocab = self.worker.stage.config.vocab_size
        try:
            prompt = [int(t) for t in h["prompt"]]
            params = SamplingParams(**h.get("sampling", {}))
            max_tokens = int(h["max_tokens"])
            stop = frozenset(int(t) for t in h.get("stop_token_ids", ()))
            deadline_s = None if h.get("deadline_s") is None else float(h["deadline_s"])
        except (KeyError, TypeError, ValueError) as exc:
            raise RequestRejected(f"malformed request: {exc}") from exc
        if not prompt or max_tokens < 1 or any(not 0 <= t < vocab for t in prompt):
            raise RequestRejected(f"a request needs a non-empty prompt of token ids below {vocab} and max_tokens >= 1")
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        return Request(request_id, client, prompt, params, max_tokens, stop, deadline)

    def on_cancel(self, client: bytes, h: dict[str, Any]) -> None:
        request = self.scheduler.remove(str(h.get("request_id")))
        if request is not None:
            self._release(request)
            self._tell(
                request.client,
                {"type": "error", "request_id": request.request_id, "kind": "cancelled", "message": "cancelled"},
            )
        self.transport.reply(client, {"type": "reply", "call_id": h.get("call_id"), "body": {"cancelled": request is not None}})

    def on_query(self, client: bytes, h: dict[str, Any]) -> None:
        body = self.stats() if h["type"] == "stats" else self.health()
        self.transport.reply(client, {"type": "reply", "call_id": h.get("call_id"), "body": body})

    # ----- figures

    def health(self) -> dict[str, Any]:
        ok = self.healthy and not self.draining and self.warming is None
        return {"ok": ok, "broken_stage": self.broken_stage, "reason": self.reason}

    def own_stats(self) -> dict[str, Any]:
        return self.worker.snapshot(self.transport)

    def stats(self) -> dict[str, Any]:
        s = self.scheduler
        stages = [self.own_stats()] + [
            self.peers[i].stats if i in self.peers else None for i in range(1, self.spec.num_stages)
        ]
        return {
            "pipeline_id": self.spec.pipeline_id,
            **self.health(),
            "stages": stages,
            "queue_depth": len(s.waiting),
            "running": len(s.requests) - len(s.waiting),
            "micro_batches_in_flight": len(s.in_flight),
            "completed": s.completed,
            "rejected": s.rejected,
            "kv_tokens_free_by_stage": self.ledger.free_tokens(),
            "max_request_tokens": self.ledger.largest(),
        }

    # ----- ending requests

    def _release(self, request: Request) -> None:
        """Free a sequence's KV here now and on the other stages with the next ``free`` frame."""
        self.worker.stage.kv.free(request.seq_id)
        self._pending_free.append(request.seq_id)
        if request.request_id == self.warming:  # every request that ends, ends here
            self._warmed()

    def _flush_frees(self) -> None:
        if self._pending_free and self.spec.num_stages > 1:
            try:
                self.transport.send_next({"type": "free", "epoch": self.epoch, "seq_ids": self._pending_free})
            except PeerUnavailable as exc:
                self.break_pipeline(1, f"stage 1 is unreachable: {exc}")
        self._pending_free = []

    def _end(self, request: Request, error: PipelineError) -> None:
        self.scheduler.remove(request.request_id)
        self._release(request)
        self._send_error(request.client, request.request_id, error)

    def _fail(self, requests: list[Request], error: PipelineError) -> None:
        for request in requests:
            self._release(request)
            self._send_error(request.client, request.request_id, error)

    def _send_error(self, client: bytes, request_id: str, error: PipelineError) -> None:
        self._tell(client, {"type": "error", "request_id": request_id, "kind": error.kind, "message": str(error)})

    def _tell(self, client: bytes, body: dict[str, Any]) -> None:
        if client != WARM_UP:  # the head's own warm-up request has no client
            self.transport.reply(client, body)

