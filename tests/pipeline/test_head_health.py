"""The head's rule for a complete pipeline, in one process: every stage heard since the break, and each
saying its link to the next stage is up. A head that declared the pipeline complete on the heartbeats
alone let the first micro-batches fail at a relay whose next link was still connecting ("stage 1
cannot send on: next stage is not connected"), seen once a heartbeat completed the pipeline at once.
"""

from __future__ import annotations

import io
import json

from worker_runtime.events import EventWriter
from worker_runtime.frames import Frame
from worker_runtime.head import HeadLoop
from worker_runtime.relay import RelayLoop
from worker_runtime.stage import Stage
from worker_runtime.stats import StageStats
from worker_runtime.transport import PeerUnavailable
from worker_runtime.warm_up import MAX_TOKENS as WARM_UP_MAX_TOKENS
from worker_runtime.worker import StageWorker

from .harness import pipeline_specs


class RecordingTransport:
    """Stands in for the head's links: what it sent down the pipeline, or refuses while ``up`` is False."""

    bytes_sent = bytes_received = rejected = 0

    def __init__(self) -> None:
        self.up, self.sent = True, []

    def send_next(self, header, tensors=()):
        if not self.up:
            raise PeerUnavailable("next stage is not connected")
        self.sent.append(header)
        return 1

    def next_linked(self) -> bool:
        return self.up


def heartbeat(index: int, linked: bool) -> dict:
    return {"type": "heartbeat", "stage_index": index, "incarnation": f"i{index}", "linked": linked,
            "kv_capacity": 2048, "block_size": 16, "stats": {}}


def broken(head: HeadLoop) -> tuple[bool, int | None, str]:
    membership = head.membership
    return membership.healthy, membership.broken_stage, membership.reason


def complete_head(tiny_model, transport: "RecordingTransport", events: io.StringIO | None = None) -> HeadLoop:
    """A head of a 3-stage pipeline whose other stages both heartbeated with their links up."""
    spec = pipeline_specs(tiny_model, 6, 3)[0]
    stage = Stage.load(spec.model_path, *spec.layers, kv_tokens=spec.kv_tokens)
    head = HeadLoop(spec, StageWorker(stage, StageStats()), transport, EventWriter(events or io.StringIO()))
    for index in (1, 2):
        head.on_heartbeat(heartbeat(index, linked=True))
    return head


def test_the_head_completes_the_pipeline_only_once_every_next_link_is_up(tiny_model):
    spec = pipeline_specs(tiny_model, 6, 3)[0]
    stage = Stage.load(spec.model_path, *spec.layers, kv_tokens=spec.kv_tokens)
    events = io.StringIO()
    transport = RecordingTransport()
    head = HeadLoop(spec, StageWorker(stage, StageStats()), transport, EventWriter(events))
    assert not head.membership.healthy

    head.on_heartbeat(heartbeat(1, linked=False))  # stage 1 cannot reach stage 2 yet
    head.on_heartbeat(heartbeat(2, linked=True))  # the last stage has no next link
    assert not head.membership.healthy and transport.sent == []

    transport.up = False  # stage 1 now says linked, but the head's own link to it is not up
    head.on_heartbeat(heartbeat(1, linked=True))
    assert not head.membership.healthy and transport.sent == []

    transport.up = True
    head.on_heartbeat(heartbeat(2, linked=True))  # complete on this heartbeat, not at the next check
    assert head.membership.healthy
    assert [m["type"] for m in transport.sent] == ["reset"]
    assert transport.sent[0]["epoch"] == head.membership.epoch


def test_a_complete_pipeline_says_ok_only_once_its_warm_up_request_came_back(tiny_model):
    """The first micro-batch through new stages is slow (first use of torch's kernels, cache pages
    touched first): the head runs one request of its own through them before it says ok, and no
    client hears of it. Its tokens back, the pipeline is ok, and the agent is told."""
    events = io.StringIO()
    transport = RecordingTransport()
    transport.reply = lambda client, header, tensors=(): transport.sent.append({"to": client, **header})
    head = complete_head(tiny_model, transport, events)
    assert head.membership.healthy and head.health() == {
        "ok": False, "broken_stage": None, "reason": "warming up: one request through the pipeline"}

    head.step()  # stage 0's layers run here; the micro-batch goes on to stage 1
    batch = transport.sent[-1]
    assert batch["type"] == "batch" and len(batch["seq_ids"]) == 1
    for _ in range(WARM_UP_MAX_TOKENS):
        head.on_result(Frame({"type": "tokens", "epoch": head.membership.epoch,
                              "mb": transport.sent[-1]["mb"], "seq_ids": batch["seq_ids"], "tokens": [3]}))
        head.step()
    assert head.health() == {"ok": True, "broken_stage": None, "reason": ""}
    assert not [m for m in transport.sent if "to" in m]  # nothing was sent to any client
    health = [json.loads(line) for line in events.getvalue().splitlines() if '"health"' in line]
    assert health[-1]["ok"] is True


def test_a_warm_up_lost_with_a_broken_pipeline_runs_again_when_it_is_whole(tiny_model):
    """The warm-up's micro-batch lost (a stage died): the pipeline is not ok for the break, and the
    next complete pipeline warms up anew; a warm-up that cannot end (past its deadline) lets the
    pipeline be ok all the same: it only spares clients a slow first request. Once one ended, a
    pipeline re-formed around the same head is ok at once."""
    head = complete_head(tiny_model, RecordingTransport())
    first = head.membership.warming
    head.step()
    head.on_heartbeat(heartbeat(1, linked=False))  # stage 2 died with the warm-up in it
    assert not head.membership.healthy and head.membership.warming is None and not head.scheduler.requests
    for index in (1, 2):
        head.on_heartbeat(heartbeat(index, linked=True))
    assert head.membership.warming not in (None, first) and not head.health()["ok"]

    head.step()
    for request in head.scheduler.requests.values():
        request.deadline = 0.0  # its tokens never come back
    head.tick()
    assert head.membership.warming is None and head.health()["ok"]

    head.on_heartbeat(heartbeat(1, linked=False))  # a stage restarted (or reloaded in place) ...
    for index in (1, 2):
        head.on_heartbeat(heartbeat(index, linked=True))
    assert head.health()["ok"] and head.membership.warming is None  # ... clients wait: no warm-up before them


def test_a_relay_that_cannot_send_on_breaks_the_pipeline_and_every_request_in_it(tiny_model):
    """A micro-batch a relay could not pass on (its next stage restarting) loses every request in
    flight with it: PipelineBroken, which the gateway resumes elsewhere, not a plain failure (seen in
    replacement_bench's in-place drain: 3 requests failed with "stage 2 cannot send on")."""
    spec = pipeline_specs(tiny_model, 6, 3)[0]
    stage = Stage.load(spec.model_path, *spec.layers, kv_tokens=spec.kv_tokens)
    head = HeadLoop(spec, StageWorker(stage, StageStats()), RecordingTransport(), EventWriter(io.StringIO()))
    for index in (1, 2):
        head.on_heartbeat(heartbeat(index, linked=True))
    assert head.membership.healthy
    failure = Frame({"type": "failed", "epoch": head.membership.epoch, "mb": 0, "seq_ids": [],
                     "stage_index": 1, "link": True,
                     "message": "stage 1 cannot send on: next stage is not connected"})
    head.on_result(failure)
    healthy, broken_stage, reason = broken(head)
    assert not healthy and broken_stage == 2 and "cannot send on" in reason


def test_a_link_that_goes_down_breaks_the_pipeline_at_once(tiny_model):
    """A stage whose process dies closes its sockets: its previous stage's link to it goes down (a
    relay's heartbeat says so; the head sees its own). The pipeline breaks then, not after the dead
    stage's peer_timeout_s of silence, which stalled every request in flight through it."""
    transport = RecordingTransport()
    head = complete_head(tiny_model, transport)
    assert head.membership.healthy
    head.on_heartbeat(heartbeat(1, linked=False))  # stage 2 died
    assert broken(head) == (False, 2, "stage 1 lost its link to stage 2")

    for index in (1, 2):  # stage 2 restarted: every link is up again
        head.on_heartbeat(heartbeat(index, linked=True))
    assert head.membership.healthy
    transport.up = False  # stage 1 died
    head.check_peers(now=0.0)
    assert broken(head) == (False, 1, "the head lost its link to stage 1")


def test_a_broken_head_still_names_a_stage_whose_link_went_down(tiny_model):
    """An agent killed while its pipeline re-forms after a restart: the head is broken already, so
    it did not break again and never named the dead stage, and the control plane waited 4 s to call
    the node lost (replacement_bench, kill -9 in place: a 7.6 s gap). A link that was up and went
    down is named even while broken; a relay whose link never came up (its next stage still
    starting) names nobody."""
    spec = pipeline_specs(tiny_model, 6, 3)[0]
    stage = Stage.load(spec.model_path, *spec.layers, kv_tokens=spec.kv_tokens)
    events = io.StringIO()
    head = HeadLoop(spec, StageWorker(stage, StageStats()), RecordingTransport(), EventWriter(events))
    for index in (1, 2):
        head.on_heartbeat(heartbeat(index, linked=True))
    head.on_leaving({"stage_index": 1, "incarnation": "i1"})  # stage 1 is being replaced
    assert not head.membership.healthy and head.membership.broken_stage == 1

    restarted = {**heartbeat(1, linked=False), "incarnation": "i1-new"}
    head.on_heartbeat(restarted)  # the new stage 1 has not reached stage 2 yet: nobody is named
    assert head.membership.broken_stage == 1
    head.on_heartbeat({**restarted, "linked": True})
    head.on_heartbeat({**restarted, "linked": False})  # stage 2 died while the pipeline re-formed
    assert broken(head) == (False, 2, "stage 1 lost its link to stage 2")
    last = json.loads(events.getvalue().splitlines()[-1])
    assert last["event"] == "health" and last["ok"] is False and last["broken_stage"] == 2


class RelayTransport(RecordingTransport):
    """A relay's links: what it sent the head; ``up`` is its link to the next stage."""

    head_up = True

    def send_head(self, header, tensors=()):
        if not self.head_up:
            raise PeerUnavailable("head is not connected")
        self.sent.append(header)
        return 1

    def receive(self, timeout_s):
        return []


def stage_1_relay(tiny_model) -> tuple[RelayLoop, RelayTransport]:
    spec = pipeline_specs(tiny_model, 6, 3)[1]
    stage = Stage.load(spec.model_path, *spec.layers, kv_tokens=spec.kv_tokens)
    transport = RelayTransport()
    relay = RelayLoop(spec, StageWorker(stage, StageStats()), transport, EventWriter(io.StringIO()), "i1")
    return relay, transport


def test_a_relay_tells_the_head_at_once_when_its_link_onward_comes_up_or_goes_down(tiny_model):
    """Not at its next heartbeat, up to 0.25 s later: the head completes a re-forming pipeline on the
    heartbeat that says the last link is up, which is part of an in-place handover's pause."""
    relay, transport = stage_1_relay(tiny_model)
    transport.up = False
    relay.tick()
    relay.tick()  # nothing changed, the period not over: no second heartbeat
    assert [h["linked"] for h in transport.sent] == [False]
    transport.up = True
    relay.tick()
    transport.up = False
    relay.tick()
    assert [h["linked"] for h in transport.sent] == [False, True, False]


def test_a_relay_that_drained_says_it_leaves_and_the_head_waits_for_the_stage_taking_its_place(tiny_model):
    """A stage moved to another device in place drains where it was: it heartbeated after the break,
    so the head completed the pipeline on it before the new stage was heard, whose first heartbeat
    then broke the pipeline again (replacement_bench, stage moved: a second break 0.2 s later)."""
    specs = pipeline_specs(tiny_model, 6, 3)
    stage = Stage.load(specs[2].model_path, *specs[2].layers, kv_tokens=specs[2].kv_tokens)
    transport = RelayTransport()
    RelayLoop(specs[2], StageWorker(stage, StageStats()), transport, EventWriter(io.StringIO()), "i2").run(
        stopping=lambda: True)  # SIGTERM: drained, nothing in flight
    assert transport.sent[-1] == {"type": "leaving", "stage_index": 2, "incarnation": "i2"}

    head_stage = Stage.load(specs[0].model_path, *specs[0].layers, kv_tokens=specs[0].kv_tokens)
    head = HeadLoop(specs[0], StageWorker(head_stage, StageStats()), RecordingTransport(),
                    EventWriter(io.StringIO()))
    for index in (1, 2):
        head.on_heartbeat(heartbeat(index, linked=True))
    head.on_leaving({"stage_index": 1, "incarnation": "i1"})  # stage 1 replaced: the pipeline re-forms
    head.on_heartbeat(heartbeat(2, linked=True))  # the old stage 2, still draining where it was
    head.on_leaving({"stage_index": 2, "incarnation": "i2"})  # ... and gone
    head.on_heartbeat({**heartbeat(1, linked=True), "incarnation": "i1-new"})
    assert not head.membership.healthy  # not on the stage that left
    head.on_heartbeat({**heartbeat(2, linked=True), "incarnation": "i2-new"})
    assert head.membership.healthy


def test_a_relay_whose_heartbeat_could_not_go_out_tries_again_at_once(tiny_model):
    """A new relay's link to the head comes up just after it starts: its first heartbeat, the one the
    head waits for, goes out at the next turn of the loop rather than a period later."""
    relay, transport = stage_1_relay(tiny_model)
    transport.head_up = False
    relay.tick()
    transport.head_up = True
    relay.tick()
    assert [h["type"] for h in transport.sent] == ["heartbeat"]


def test_a_cancelled_warm_up_lets_the_pipeline_be_ok(tiny_model):
    """Every request that ends goes through the head's release, the warm-up too: cancelled by its id,
    it does not hold the pipeline back (were only its tokens and its errors to end it, health would stay
    not ok for good)."""
    transport = RecordingTransport()
    transport.reply = lambda client, header, tensors=(): transport.sent.append({"to": client, **header})
    head = complete_head(tiny_model, transport)
    head.on_cancel(b"gateway", {"request_id": head.membership.warming, "call_id": 1})
    assert head.membership.warming is None and head.health()["ok"]
    assert [m["body"] for m in transport.sent if m.get("to") == b"gateway"] == [{"cancelled": True}]
