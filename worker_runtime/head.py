"""The head: stage 0's loop, where requests enter, micro-batches start and sampled tokens come back.

It owns all request state (the :class:`~worker_runtime.scheduler.Scheduler`) and acts on what its
:class:`~worker_runtime.pipeline_membership.PipelineMembership` decides of the pipeline's stages:
when the pipeline breaks it fails every request in flight with
:class:`~contracts.pipeline_errors.PipelineBroken`; when it is whole again it sends the stages a ``reset``
and, for a new pipeline, runs its warm-up request (warm_up.py) before its health says ok. With
``prefix_caching`` its :class:`~worker_runtime.prefix_index.PrefixIndex` decides which cached blocks
each request reuses and tells every stage (docs/pipeline.md, "Prefix caching").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from contracts.pipeline_errors import DeadlineExceeded, PipelineBroken, PipelineError, RequestRejected
from contracts.stage_spec import StageSpec

from .draft_client import POLL_S, speculator_for
from .events import EventWriter, Every
from .frames import Frame
from .kv_cache import KVBudgetExceeded
from .micro_batch import micro_batch_input, token_item
from .pipeline_membership import PipelineMembership
from .prefix_index import PrefixIndex
from .protocol import batch_message
from .relay import heartbeat_interval
from .scheduler import KVLedger, Request, Scheduler
from .transport import Incoming, PeerUnavailable, Transport
from .warm_up import CLIENT as WARM_UP
from .warm_up import warm_up_request
from .worker import StageWorker

log = logging.getLogger(__name__)
KEEPALIVE_S = 0.5


class HeadLoop:
    def __init__(self, spec: StageSpec, worker: StageWorker, transport: Transport, events: EventWriter,
                 warmed: bool = False):
        self.spec, self.worker, self.transport, self.events = spec, worker, transport, events
        kv = worker.stage.kv
        self.ledger = KVLedger(kv)
        self.ledger.set_stage(0, kv.capacity_tokens, kv.block_size)
        self.membership = PipelineMembership(spec.pipeline_id, spec.num_stages, spec.peer_timeout_s,
                                             warmed=warmed, on_health=self._health_changed,
                                             on_break=self._broken)
        self.prefix = (PrefixIndex(kv, self.ledger, spec.model_path, spec.pipeline_id, self.membership.epoch,
                                   restore=worker.restore, tell=self._flush_frees)
                       if spec.prefix_caching else None)
        self.scheduler = Scheduler(
            self.ledger, spec.micro_batches or spec.num_stages, spec.max_batch_tokens, spec.max_queue,
            admission=self.prefix.admit if self.prefix else None,
        )
        self.speculator = speculator_for(spec)
        self.draining = False
        self._pending_free: list[int] = []
        self._keepalive = Every(KEEPALIVE_S)
        self._stats_line = Every(1.0)
        self._check = Every(heartbeat_interval(spec))
        if self.membership.healthy:  # one stage: whole from the start
            self._complete()

    # ----- the loop

    def run(self, stopping: Callable[[], bool], replaced: Callable[[], bool] = lambda: False) -> None:
        """Serve until ``stopping()``; then refuse new requests and finish (or fail) the rest within
        ``peer_timeout_s``.

        ``replaced()``: this stage is being replaced by a new spec, and so are the stages downstream
        whose relays the in-flight requests need; they can never finish, so they fail at once
        (``PipelineBroken``) and the gateway resumes them elsewhere instead of waiting out the drain.
        """
        try:
            self._serve(stopping, replaced)
        finally:
            if self.speculator is not None:
                self.speculator.close()

    def _serve(self, stopping: Callable[[], bool], replaced: Callable[[], bool]) -> None:
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
            busy = (self.membership.healthy and self.scheduler.ready
                    and len(self.scheduler.in_flight) < self.scheduler.micro_batches)
            waited = time.perf_counter()
            # sequences held for their drafts: their answers arrive on the draft client's socket
            incoming = self.transport.receive(0 if busy else POLL_S if self.scheduler.held else 0.02)
            if not busy:
                self.worker.stats.record_idle(time.perf_counter() - waited)
            for message in incoming:
                self.handle(message)
            self.tick()
            if self.membership.healthy:
                self.step()

    def step(self) -> None:
        """Start micro-batches while slots are free: stage 0's layers here, the rest downstream.

        Pending ``free`` frames go first: a request admitted into space just freed (or evicted) must
        not reach a stage before that space is freed there.
        """
        self._flush_frees()
        while (mb := self._next_micro_batch()) is not None:
            self._flush_frees()  # a request that failed here meanwhile freed, or an admission evicted
            if not self.membership.healthy:
                return
            if self.speculator is not None:
                self.speculator.propose(mb.requests, self.spec.max_batch_tokens)
            inputs = [r.next_input() for r in mb.requests]
            batch = micro_batch_input(mb.requests, inputs)
            mb.tokens = batch.num_tokens
            params = [r.step_params() for r in mb.requests]
            ops = self.prefix.operations(mb.requests, inputs) if self.prefix else None
            try:
                out, compute_s, logprobs = self.worker.step(batch, params)
                if ops is not None:
                    self.prefix.commit(batch.seq_ids, ops)
            except (KVBudgetExceeded, ValueError) as exc:
                self._fail(self.scheduler.on_failed(mb.id), PipelineError(f"stage 0: {exc}"))
                continue
            sent = time.perf_counter()
            if self.spec.num_stages == 1:
                self.on_tokens(mb.id, batch.seq_ids, batch.per_sequence(out.tolist()), logprobs)
            else:
                header, tensors = batch_message(self.membership.epoch, mb.id, batch, params, out, ops)
                try:
                    self.transport.send_next(header, tensors)
                except PeerUnavailable as exc:
                    self.membership.break_pipeline(1, f"stage 1 is unreachable: {exc}")
                    return
            self.worker.record(batch, compute_s, time.perf_counter() - sent)

    def _next_micro_batch(self):
        """The drafter's turn first, every time: on one stage the last one's tokens came back in ``step``."""
        if self.speculator is not None:
            self.speculator.prepare(self.scheduler)
        return self.scheduler.next_micro_batch()

    def tick(self) -> None:
        now = time.monotonic()
        for request in self.scheduler.expired(now):
            self._end(request, DeadlineExceeded(f"request {request.request_id} passed its deadline"))
        if self._check.due():
            self.check_peers(now)
            for mb_id in self.scheduler.overdue(now, self.spec.peer_timeout_s):
                self._fail(self.scheduler.on_failed(mb_id),
                           PipelineBroken(f"micro-batch {mb_id} was lost in the pipeline"))
        if self._keepalive.due():  # each client hears which of its requests the head holds (contracts §2)
            for client, ids in self.scheduler.held_by_client().items():
                self._tell(client, {"type": "alive", "requests": ids})
        self.worker.stats.queue_depth = len(self.scheduler.waiting)
        if self._stats_line.due():
            self.events.emit("stats", pipeline_id=self.spec.pipeline_id, stage_index=0, **self.own_stats())

    # ----- health

    def check_peers(self, now: float) -> None:
        membership = self.membership
        silent = membership.silent_stage(now)
        if membership.healthy and silent is not None:
            membership.break_pipeline(silent, f"stage {silent} silent for over {self.spec.peer_timeout_s} s")
        elif membership.healthy and not self.transport.next_linked():  # stage 1 died: its socket closed
            membership.break_pipeline(1, "the head lost its link to stage 1")
        elif membership.whole():
            try:
                self.transport.send_next({"type": "reset", "epoch": membership.epoch})
            except PeerUnavailable:
                return  # stage 1 heartbeats but our link to it is not up yet: try again next check
            log.info("pipeline %s complete: epoch %d", self.spec.pipeline_id, membership.epoch)
            self._complete()

    def _complete(self) -> None:
        """The pipeline is whole: ok now, or start its warm-up request first (pipeline_membership.py)."""
        if not self.membership.completed():
            return
        request = warm_up_request(epoch=self.membership.epoch, vocab_size=self.worker.stage.config.vocab_size,
                                  largest=self.ledger.largest(), max_batch_tokens=self.spec.max_batch_tokens,
                                  timeout_s=self.spec.peer_timeout_s)
        self.membership.warming_up(request.request_id)
        try:
            self.scheduler.submit(request)
        except RequestRejected:
            self.membership.warmed()

    def _broken(self, reason: str) -> None:
        """The pipeline broke (a new epoch began): fail everything in flight and wipe stage 0's cache."""
        self._fail(self.scheduler.clear(),
                   PipelineBroken(f"pipeline {self.spec.pipeline_id} broken: {reason}"))
        self.worker.clear()
        self._pending_free.clear()
        if self.prefix is not None:
            self.prefix.new_epoch(self.membership.epoch)

    def _health_changed(self) -> None:
        """Tell the agent at once (a ``health`` event on stdout)."""
        self.events.emit("health", pipeline_id=self.spec.pipeline_id, **self.health())

    def on_heartbeat(self, header: dict[str, Any]) -> None:
        index = header.get("stage_index")
        if not isinstance(index, int) or not 0 < index < self.spec.num_stages:
            log.warning("heartbeat from an unknown stage %r", index)
            return
        incarnation, linked = str(header.get("incarnation")), header.get("linked", True) is not False
        # The capacity first: a stage whose figures the ledger refuses is not counted as heard.
        self.ledger.set_stage(index, int(header["kv_capacity"]), int(header["block_size"]))
        self.membership.heartbeat(index, incarnation, linked, dict(header.get("stats") or {}))
        if not self.membership.healthy:  # the last stage heard again completes it now, not at the next check
            self.check_peers(time.monotonic())

    def on_leaving(self, header: dict[str, Any]) -> None:
        """A relay replaced by a new spec or drained said goodbye (PipelineMembership.leaving)."""
        index = header.get("stage_index")
        if isinstance(index, int):
            self.membership.leaving(index, str(header.get("incarnation")))

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
        if h.get("epoch") != self.membership.epoch:
            return  # belongs to the pipeline before a reset
        if frame.type == "tokens":
            self.on_tokens(h["mb"], h["seq_ids"], h["tokens"], h.get("logprobs"))
        elif h.get("link") is True and isinstance(h.get("stage_index"), int) and self.membership.healthy:
            # The next stage is unreachable from there: every request in flight is lost with it, and
            # the gateway resumes them elsewhere (PipelineBroken) once the pipeline is whole again.
            self.membership.break_pipeline(h["stage_index"] + 1, str(h.get("message")))
        else:
            with self.prefix.distrusted() if self.prefix is not None else nullcontext():
                self._fail(self.scheduler.on_failed(h["mb"]), PipelineError(str(h.get("message"))))

    def on_tokens(self, mb_id: int, seq_ids: list[int], tokens: list[int | list[int]],
                  logprobs: list | None = None) -> None:
        """Stream a micro-batch's tokens: one ``tokens`` frame per client, not one frame per token.

        A client (the gateway) usually holds most of a micro-batch's requests, and every frame costs
        an encode, an HMAC and a wake-up on both sides. A verified speculation (a list of the target's
        tokens) emits what its proposals got accepted first (``Speculator.settle``). ``logprobs``: the
        last stage's, per sequence, where a request asked (micro_batch.py).
        """
        mb = self.scheduler.in_flight.get(mb_id)
        if self.speculator is not None and mb is not None:
            decoding = all(r.output for r in mb.requests)
            round_trip = (mb.tokens, time.monotonic() - mb.sent_at) if decoding else None
            tokens = self.speculator.settle(mb.requests, seq_ids, tokens, round_trip)
        by_client: dict[bytes, list[list]] = {}
        scored = dict(zip(seq_ids, logprobs)) if logprobs else {}
        for request, token, reason in self.scheduler.on_tokens(mb_id, seq_ids, tokens):
            by_client.setdefault(request.client, []).append(token_item(request, token, reason, scored))
            if reason is not None:
                self._release(request)
        for client, items in by_client.items():
            self._tell(client, {"type": "tokens", "items": items})

    def on_submit(self, client: bytes, h: dict[str, Any]) -> None:
        request_id = str(h.get("request_id"))
        try:
            if not (membership := self.membership).healthy:
                raise PipelineBroken(f"pipeline {self.spec.pipeline_id} is not serving: {membership.reason}")
            if self.draining:
                raise PipelineBroken(f"pipeline {self.spec.pipeline_id} is draining")
            request = Request.from_submit(client, request_id, h, self.worker.stage.config.vocab_size)
            self.scheduler.submit(request)
        except PipelineError as exc:
            self._send_error(client, request_id, exc)

    def on_cancel(self, client: bytes, h: dict[str, Any]) -> None:
        request = self.scheduler.remove(str(h.get("request_id")))
        if request is not None:
            self._release(request)
            cancelled = {"type": "error", "request_id": request.request_id, "kind": "cancelled"}
            self._tell(request.client, {**cancelled, "message": "cancelled"})
        self.transport.reply(client, {"type": "reply", "call_id": h.get("call_id"),
                                      "body": {"cancelled": request is not None}})

    def on_query(self, client: bytes, h: dict[str, Any]) -> None:
        body = self.stats() if h["type"] == "stats" else self.health()
        self.transport.reply(client, {"type": "reply", "call_id": h.get("call_id"), "body": body})

    # ----- figures

    def health(self) -> dict[str, Any]:
        membership = self.membership
        ok = membership.serving and not self.draining
        return {"ok": ok, "broken_stage": membership.broken_stage, "reason": membership.reason}

    def own_stats(self) -> dict[str, Any]:
        figures = self.speculator.figures() if self.speculator is not None else {}
        return {**self.worker.snapshot(self.transport), **figures}

    def stats(self) -> dict[str, Any]:
        s = self.scheduler
        stages = [self.own_stats()] + [self.membership.stats_of(i) for i in range(1, self.spec.num_stages)]
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
            "prefix_cache": self.prefix.summary() if self.prefix is not None else None,
        }

    # ----- ending requests

    def _release(self, request: Request) -> None:
        """Free a sequence's KV here now and on the other stages with the next ``free`` frame, then admit
        what the freed blocks make room for (the ledger counts stage 0's blocks: the scheduler's own
        admission, before this, still saw them held)."""
        self.worker.free(request.seq_id)
        self._pending_free.append(request.seq_id)
        if self.prefix is not None:
            self.prefix.forget(request.seq_id)
        if self.speculator is not None:
            self.speculator.forget(request.seq_id)
        if request.request_id == self.membership.warming:  # every request that ends, ends here
            self.membership.warmed()
        self.scheduler.admit()

    def _flush_frees(self) -> None:
        """Tell the other stages which sequences ended, which cached blocks were evicted here, and what
        the host tier did (``PrefixIndex.host_ops``)."""
        evicted = self.prefix.evicted if self.prefix is not None else []
        host = self.prefix.host_ops if self.prefix is not None else []
        if (self._pending_free or evicted or host) and self.spec.num_stages > 1:
            header = {"type": "free", "epoch": self.membership.epoch, "seq_ids": self._pending_free}
            if evicted:
                header["evict"] = list(evicted)
            if host:
                header["host"] = [list(op) for op in host]
            try:
                self.transport.send_next(header)
            except PeerUnavailable as exc:
                self.membership.break_pipeline(1, f"stage 1 is unreachable: {exc}")
        self._pending_free = []
        evicted.clear()
        host.clear()

    def _end(self, request: Request, error: PipelineError) -> None:
        self.scheduler.remove(request.request_id)
        self._release(request)
        self._send_error(request.client, request.request_id, error)

    def _fail(self, requests: list[Request], error: PipelineError) -> None:
        for request in requests:
            self._release(request)
            self._send_error(request.client, request.request_id, error)

    def _send_error(self, client: bytes, request_id: str, error: PipelineError) -> None:
        self._tell(client,
                   {"type": "error", "request_id": request_id, "kind": error.kind, "message": str(error)})

    def _tell(self, client: bytes, body: dict[str, Any]) -> None:
        if client != WARM_UP:  # the head's own warm-up request has no client
            self.transport.reply(client, body)

