"""Head bookkeeping alone: admission by every stage's KV budget, fair micro-batches, ending requests."""

from __future__ import annotations

import pytest

from contracts.pipeline_errors import RequestRejected
from contracts.sampling import SamplingParams
from worker_runtime.scheduler import KVLedger, Request, Scheduler


def scheduler(capacities=(256, 128), block=16, micro_batches=2, max_queue=4,
              max_batch_tokens=64) -> Scheduler:
    ledger = KVLedger()
    for stage, capacity in enumerate(capacities):
        ledger.set_stage(stage, capacity, block)
    return Scheduler(ledger, micro_batches, max_batch_tokens, max_queue)


def request(rid: str, prompt_len: int = 8, max_tokens: int = 8, stop=()) -> Request:
    return Request(rid, b"c", list(range(1, prompt_len + 1)), SamplingParams(), max_tokens, frozenset(stop))


def test_admits_while_the_smallest_stage_has_room_then_queues():
    s = scheduler()
    for i in range(5):
        s.submit(request(f"r{i}", 16, 16))  # 32 tokens = 2 blocks; stage 1 holds 8 blocks
    assert len(s.ready) == 4 and len(s.waiting) == 1
    assert s.ledger.free_tokens() == {0: 256 - 128, 1: 0}


def test_refuses_a_request_longer_than_a_whole_stage_and_a_full_queue():
    s = scheduler(max_queue=1)
    with pytest.raises(RequestRejected, match="smallest stage holds 128"):
        s.submit(request("huge", 100, 100))
    for i in range(4):
        s.submit(request(f"r{i}", 16, 16))
    s.submit(request("queued", 16, 16))
    with pytest.raises(RequestRejected, match="queue full"):
        s.submit(request("one-too-many", 16, 16))
    with pytest.raises(RequestRejected, match="already running"):
        s.submit(request("r0"))
    assert s.rejected == 3


def test_cancel_frees_kv_and_admits_the_next():
    s = scheduler()
    for i in range(5):
        s.submit(request(f"r{i}", 16, 16))
    assert s.remove("r1") is not None
    assert [r.request_id for r in s.ready] == ["r0", "r2", "r3", "r4"] and not s.waiting


def test_micro_batches_split_the_admitted_sequences_and_cap_in_flight():
    s = scheduler(micro_batches=2, max_batch_tokens=1000)
    for i in range(4):
        s.submit(request(f"r{i}", 4, 4))
    first, second = s.next_micro_batch(), s.next_micro_batch()
    assert len(first.requests) == 2 and len(second.requests) == 2
    assert s.next_micro_batch() is None  # both slots busy


def test_a_held_request_waits_out_of_micro_batches_but_counts_in_their_share():
    s = scheduler(micro_batches=2, max_batch_tokens=1000)
    for i in range(4):
        s.submit(request(f"r{i}", 4, 4))
    held, gone = s.ready[0], s.ready[1]
    s.hold(held)
    s.hold(gone)
    assert s.share() == 2
    assert [r.request_id for r in s.next_micro_batch().requests] == ["r2", "r3"]
    s.remove("r1")  # ended while held: unhold does nothing for it
    s.unhold(gone.seq_id)
    s.unhold(held.seq_id)
    assert list(s.ready) == [held] and not s.held


def test_max_batch_tokens_limits_prefill_but_a_long_prompt_runs_alone():
    s = scheduler(capacities=(1024, 1024), micro_batches=1, max_batch_tokens=20)
    s.submit(request("long", 30, 2))
    s.submit(request("short", 10, 2))
    assert [r.request_id for r in s.next_micro_batch().requests] == ["long"]


def test_tokens_finish_by_length_and_stop_token_and_late_tokens_are_ignored():
    s = scheduler(micro_batches=1)
    s.submit(request("a", 4, max_tokens=2))
    s.submit(request("b", 4, max_tokens=5, stop=[7]))
    s.submit(request("gone", 4, 4))
    mb = s.next_micro_batch()
    s.remove("gone")
    events = s.on_tokens(mb.id, [r.seq_id for r in mb.requests], [3, 7, 9])
    assert [(r.request_id, t, why) for r, t, why in events] == [("a", 3, None), ("b", 7, "stop")]
    mb = s.next_micro_batch()
    assert mb.requests[0].next_input() == ([3], 4)
    events = s.on_tokens(mb.id, [mb.requests[0].seq_id], [5])
    assert events[0][2] == "length" and not s.requests and s.completed == 2
    assert s.ledger.free_tokens() == {0: 256, 1: 128}


def test_failed_micro_batch_and_clear_release_everything():
    s = scheduler(micro_batches=2)
    for i in range(3):
        s.submit(request(f"r{i}", 4, 4))
    mb = s.next_micro_batch()
    assert {r.request_id for r in s.on_failed(mb.id)} == {r.request_id for r in mb.requests}
    assert len(s.clear()) == 3 - len(mb.requests)
    assert s.ledger.free_tokens() == {0: 256, 1: 128} and not s.in_flight


def test_deadlines_and_overdue_micro_batches():
    s = scheduler()
    r = request("late")
    r.deadline = 10.0
    s.submit(r)
    assert s.expired(11.0) == [r] and s.expired(9.0) == []
    mb = s.next_micro_batch()
    assert s.overdue(mb.sent_at + 5, 2.0) == [mb.id]
