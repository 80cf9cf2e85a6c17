"""Which stages form the head's pipeline, whether it is whole, and when it warms up.

Every other stage heartbeats to the head, so one place decides that a stage is dead: its previous
stage's link to it went down (as when its process dies and its sockets close), it was silent for
``peer_timeout_s``, or it restarted with a new incarnation. The pipeline is then broken: a new epoch
begins, and the head fails every request in flight with :class:`~contracts.pipeline_errors.PipelineBroken`.
Once every stage was heard again since the break, each saying its link onward is up, the pipeline is
whole: the head sends a ``reset`` of the new epoch that wipes the stages' caches, so a restarted stage
rejoins without anyone restarting the rest.

A new head's pipeline, whole for the first time, runs one request of the head's own before its
health says ok (warm_up.py: first use of new stages is slow, and no client should pay for it). One
re-formed around the same head does not: clients wait for it then, and their own first micro-batch
warms it as soon. Nor does one whose head took a new spec in place after it had warmed its pipeline
up (``warmed``, from worker_runtime.serve): that is an in-place handover, whose waiting requests a
warm-up held 0.07 s longer (docs/contracts.md §2).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

WARMING_UP = "warming up: one request through the pipeline"


@dataclass
class Peer:
    incarnation: str
    last_seen: float
    stats: dict
    linked: bool  # its link to the next stage is up (a pipeline is complete only when every one is)


class PipelineMembership:
    """The head's view of its pipeline: the stages heard (``peers``), the epoch, broken or whole, and
    the warm-up. ``on_health`` is called after every change of health (the head tells its agent);
    ``on_break(reason)`` when the pipeline breaks, after the new epoch began (the head fails what is in
    flight and wipes its own cache)."""

    def __init__(self, pipeline_id: str, num_stages: int, peer_timeout_s: float, *, warmed: bool,
                 on_health: Callable[[], None], on_break: Callable[[str], None]):
        self.pipeline_id, self.num_stages, self.peer_timeout_s = pipeline_id, num_stages, peer_timeout_s
        self._on_health, self._on_break = on_health, on_break
        self.peers: dict[int, Peer] = {}
        self.epoch = time.time_ns()  # larger than any epoch of a previous head, so stages drop stale work
        self.healthy = num_stages == 1  # one stage: whole from the start
        self.reason = "" if self.healthy else "waiting for every stage to join"
        self.broken_stage: int | None = None
        self.broken_at = time.monotonic()
        self.warming: str | None = None  # the warm-up request's id while it runs
        self.warm_up_due = not warmed  # until a warm-up ran through this pipeline

    @property
    def serving(self) -> bool:
        """Whole and warmed up: clients' requests may come (unless the head drains)."""
        return self.healthy and self.warming is None

    def silent_stage(self, now: float) -> int | None:
        """The first stage heard of but silent for over ``peer_timeout_s``, if any."""
        return next((i for i, p in self.peers.items() if now - p.last_seen > self.peer_timeout_s), None)

    def whole(self) -> bool:
        """Broken, and every stage heard since the break saying its link to the next one is up: the
        head may reset the stages and call :meth:`completed`."""
        return (not self.healthy and all(i in self.peers for i in range(1, self.num_stages))
                and all(p.last_seen > self.broken_at and p.linked for p in self.peers.values()))

    def heartbeat(self, index: int, incarnation: str, linked: bool, stats: dict) -> None:
        """Stage ``index`` (1 .. num_stages - 1) is alive: break the pipeline if it restarted or its link
        onward went down, then remember it as heard now."""
        known = self.peers.get(index)
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
            self.set_health(False, f"stage {index} lost its link to stage {index + 1}", index + 1)
        self.peers[index] = Peer(incarnation, time.monotonic(), stats, linked)

    def leaving(self, index: int, incarnation: str) -> None:
        """A relay replaced by a new spec or drained said goodbye: what it held is lost, break now; and
        forget it, so a re-forming pipeline waits for the stage that takes its place. (A stage moved
        to another device drains where it was: heard after the break, it completed the pipeline
        before the new one was heard, whose first heartbeat then broke it again.)"""
        known = self.peers.get(index)
        if known is None or known.incarnation != incarnation:
            return
        if self.healthy:
            self.break_pipeline(index, f"stage {index} is being replaced")
        del self.peers[index]

    def break_pipeline(self, stage: int, reason: str) -> None:
        """Stage ``stage`` is lost: not healthy, a new epoch, and wait for every stage to answer again."""
        log.warning("pipeline %s broken: %s", self.pipeline_id, reason)
        self.set_health(False, reason, stage)
        self.broken_at = time.monotonic()
        self.epoch += 1
        self._on_break(reason)

    def completed(self) -> bool:
        """The pipeline is whole (its stages were reset): ok now, or True when a warm-up is due first
        (the head starts it and calls :meth:`warming_up`)."""
        if self.warm_up_due:
            return True
        self.set_health(True, "", None)
        return False

    def warming_up(self, request_id: str) -> None:
        """The warm-up request runs: whole, not ok yet, no stage broken. Health turns ok when it ends,
        however it ends (:meth:`warmed`): it only spares clients a slow first request."""
        self.warming = request_id
        self.set_health(True, WARMING_UP, None)

    def warmed(self) -> None:
        """The warm-up ended, however it did: ok, unless the pipeline broke under it (the next warms up)."""
        self.warming = None
        if self.healthy:
            self.warm_up_due = False
            self.set_health(True, "", None)

    def set_health(self, healthy: bool, reason: str, broken_stage: int | None) -> None:
        self.healthy, self.reason, self.broken_stage = healthy, reason, broken_stage
        self._on_health()

    def stats_of(self, index: int) -> dict | None:
        """Stage ``index``'s statistics from its last heartbeat; None if not heard of."""
        peer = self.peers.get(index)
        return peer.stats if peer is not None else None
