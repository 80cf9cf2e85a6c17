"""The loop of every stage but the head: receive a micro-batch, run it, pass it on (or sample and return
tokens).

Such a stage keeps no request state beyond its KV cache, so it needs no failure logic of its own:
it heartbeats to the head, which decides; a ``reset`` or a newer epoch wipes its cache, which is how
a restarted neighbour or head brings it back into a consistent pipeline. Its cached blocks follow the
head's decisions too: it attaches, names and evicts exactly the blocks the frames say.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from contracts.stage_spec import StageSpec

from .events import EventWriter, Every
from .frames import Frame, FrameError
from .kv_cache import KVBudgetExceeded
from .protocol import PrefixOps, batch_from_frame, batch_message, host_ops_of, names_of
from .stage_trace import StageSpans
from .transport import Incoming, PeerUnavailable, Transport
from .worker import StageWorker

log = logging.getLogger(__name__)


def heartbeat_interval(spec: StageSpec) -> float:
    """How often a stage heartbeats the head (and the head checks its peers). At most 0.25 s: a
    restarted head serves once every stage was heard again, so this period is part of an in-place
    handover's pause; a frame a quarter second per stage costs nothing."""
    return min(0.25, max(0.02, spec.peer_timeout_s / 5))


class RelayLoop:
    def __init__(self, spec: StageSpec, worker: StageWorker, transport: Transport, events: EventWriter,
                 incarnation: str):
        self.spec, self.worker, self.transport, self.events = spec, worker, transport, events
        self.incarnation = incarnation
        self.epoch = 0
        self._heartbeat = Every(heartbeat_interval(spec))
        self._linked: bool | None = None  # the link onward as last told to the head
        self._stats_line = Every(1.0)
        self.spans = StageSpans(spec.stage_index)  # traced requests' spans at this stage

    def run(self, stopping: Callable[[], bool], replaced: Callable[[], bool] = lambda: False) -> None:
        """Serve until ``stopping()``; then finish what keeps arriving for at most ``peer_timeout_s``.
        ``replaced()`` (a new spec takes this stage's place) ends it at once: the head fails what was in
        flight."""
        drain_until = None
        while not replaced():
            if drain_until is None and stopping():
                drain_until = time.monotonic() + self.spec.peer_timeout_s
            waited = time.perf_counter()
            incoming = self.transport.receive(min(0.05, self._heartbeat.remaining()))
            # all work is done by then: waiting is bubble
            self.worker.stats.record_idle(time.perf_counter() - waited)
            for message in incoming:
                self.handle(message)
            self.tick()
            if drain_until is not None and (not incoming or time.monotonic() > drain_until):
                break
        self._say_leaving()

    def _say_leaving(self) -> None:
        """Tell the head at once that this stage is gone (replaced, or drained), so it fails the
        micro-batches this stage held now rather than after ``peer_timeout_s`` of silence, and a
        re-forming pipeline waits for the stage that takes its place rather than counting this one."""
        try:
            self.transport.send_head({"type": "leaving", "stage_index": self.spec.stage_index,
                                      "incarnation": self.incarnation})
        except PeerUnavailable:
            pass  # the head is gone or being replaced too

    def tick(self) -> None:
        # A change of the link onward is told at once, not at the next period: the head completes a
        # re-forming pipeline on the heartbeat that says the last link is up (part of an in-place
        # handover's pause), and a link that goes down names a dead next stage.
        linked = self.transport.next_linked()
        if self._heartbeat.due() or linked != self._linked:
            try:
                self.transport.send_head(
                    {
                        "type": "heartbeat",
                        "stage_index": self.spec.stage_index,
                        "incarnation": self.incarnation,
                        "linked": linked,
                        "kv_capacity": self.worker.stage.kv.capacity_tokens,
                        "block_size": self.worker.stage.kv.block_size,
                        "stats": self.snapshot(),
                    }
                )
                self._linked = linked
            except PeerUnavailable:
                # The head is down or restarting, or a new relay's link to it is not up yet: try
                # again at the next turn of the loop, not a period later (a restarted stage's first
                # heartbeat is what the head waits for to complete the pipeline).
                self._linked = None
        if self._stats_line.due():
            self.events.emit("stats", pipeline_id=self.spec.pipeline_id, stage_index=self.spec.stage_index,
                             **self.snapshot())

    def snapshot(self) -> dict:
        return self.worker.snapshot(self.transport)

    def _adopt_epoch(self, epoch: int) -> bool:
        """False for a message of an older epoch (drop it); a newer epoch wipes the cache first."""
        if epoch < self.epoch:
            return False
        if epoch > self.epoch:
            self.worker.clear()
            self.spans.end_all("reset")
            self.epoch = epoch
        return True

    def handle(self, message: Incoming) -> None:
        """Act on one frame; an authenticated but malformed one is logged and dropped, never fatal."""
        try:
            self._dispatch(message.frame)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("dropped a malformed %r frame: %r", message.frame.type, exc)

    def _dispatch(self, frame: Frame) -> None:
        """The type is checked before the epoch is adopted: a frame of no known type carrying a large
        epoch made the relay drop every later real frame as stale (found by tests/fuzz/test_frames.py)."""
        if frame.type not in ("batch", "free", "reset"):
            log.warning("dropped a frame of unknown type %r", frame.type)
            return
        epoch = frame.header.get("epoch")
        if not isinstance(epoch, int):
            log.warning("dropped a %r frame without an epoch", frame.type)
            return
        if not self._adopt_epoch(epoch):
            return
        if frame.type == "batch":
            self.run_batch(frame)
        elif frame.type in ("free", "reset"):
            evict = names_of(frame.header.get("evict", []))
            host = host_ops_of(frame.header.get("host", []))
            for seq_id in frame.header.get("seq_ids", []):
                self.worker.free(seq_id)
            self.spans.end(frame.header.get("seq_ids", []), "freed" if frame.type == "free" else "reset")
            offloaded = {name for op, name in host if op == "offload"}
            self.worker.stage.kv.evict([name for name in evict if name not in offloaded])
            self._forward(frame.header)
            self.worker.replay_host(host)  # passed on first: the next stage copies its blocks back meanwhile

    def _forward(self, header: dict) -> None:
        if self.spec.is_last:
            return
        try:
            self.transport.send_next({k: v for k, v in header.items() if k not in ("pipeline_id", "tensors")})
        except PeerUnavailable as exc:
            log.warning("could not pass %r on: %s", header["type"], exc)

    def run_batch(self, frame: Frame) -> None:
        mb = frame.header.get("mb")
        kv = self.worker.stage.kv
        try:
            batch, params = batch_from_frame(frame, first_stage=False)
            ops = PrefixOps.from_header(frame.header, len(batch.seq_ids))
            for seq_id, names in zip(batch.seq_ids, ops.attach):
                if names:
                    kv.attach(seq_id, names)
            out, compute_s, logprobs = self.worker.step(batch, params)
            for seq_id, (first, names) in zip(batch.seq_ids, ops.commit):
                if names:
                    kv.commit(seq_id, first, names)
        except (FrameError, KVBudgetExceeded, ValueError) as exc:
            self._report_failure(mb, frame.header.get("seq_ids", []), f"stage {self.spec.stage_index}: {exc}")
            return
        sent = time.perf_counter()
        try:
            if self.spec.is_last:
                self.transport.send_head(
                    {"type": "tokens", "epoch": self.epoch, "mb": mb, "seq_ids": batch.seq_ids,
                     "tokens": batch.per_sequence(out.tolist()),
                     **({"logprobs": logprobs} if logprobs is not None else {})}
                )
            else:
                header, tensors = batch_message(self.epoch, mb, batch, params, out, ops)
                self.transport.send_next(header, tensors)
        except PeerUnavailable as exc:
            self._report_failure(mb, batch.seq_ids, f"stage {self.spec.stage_index} cannot send on: {exc}",
                                 link=True)
        send_s = time.perf_counter() - sent
        self.worker.record(batch, compute_s, send_s)
        self.spans.step(batch, compute_s, send_s)

    def _report_failure(self, mb: object, seq_ids: list, message: str, link: bool = False) -> None:
        """Tell the head a micro-batch failed here; ``link``: because the link onward is down (the next
        stage died or is being replaced), which breaks the pipeline, not just this micro-batch."""
        log.warning("micro-batch %s failed: %s", mb, message)
        try:
            self.transport.send_head({"type": "failed", "epoch": self.epoch, "mb": mb, "seq_ids": seq_ids,
                                      "message": message, "stage_index": self.spec.stage_index, "link": link})
        except PeerUnavailable:
            pass
