"""The head's pipeline membership alone (no model, no sockets): which stages it waits for, what breaks
the pipeline and starts a new epoch, and when a whole pipeline warms up first."""

from __future__ import annotations

import time

from worker_runtime.pipeline_membership import WARMING_UP, PipelineMembership


class Recorded:
    def __init__(self) -> None:
        self.health: list[tuple[bool, str, int | None]] = []
        self.breaks: list[str] = []


def membership(num_stages: int = 3, warmed: bool = False) -> tuple[PipelineMembership, Recorded]:
    seen = Recorded()
    m = PipelineMembership("d1-r0", num_stages, 5.0, warmed=warmed,
                           on_health=lambda: seen.health.append((m.healthy, m.reason, m.broken_stage)),
                           on_break=seen.breaks.append)
    return m, seen


def join(m: PipelineMembership, *stages: int, incarnation: str = "a") -> None:
    for index in stages:
        m.heartbeat(index, f"{incarnation}{index}", True, {})


def test_a_pipeline_is_whole_once_every_stage_was_heard_since_the_break_with_its_link_up():
    m, seen = membership()
    assert not m.healthy and m.reason == "waiting for every stage to join" and not m.whole()
    m.heartbeat(1, "a1", False, {})  # stage 1 cannot reach stage 2 yet
    join(m, 2)
    assert not m.whole()
    join(m, 1)
    assert m.whole() and seen.breaks == [] and seen.health == []


def test_one_stage_is_whole_from_the_start():
    m, _ = membership(num_stages=1)
    assert m.healthy and not m.whole()


def test_a_restarted_stage_breaks_the_pipeline_into_a_new_epoch_and_must_be_heard_again():
    m, seen = membership(warmed=True)
    join(m, 1, 2)
    assert m.completed() is False and m.serving
    epoch = m.epoch
    join(m, 2, incarnation="b")  # stage 2 restarted
    assert (m.healthy, m.broken_stage, m.reason) == (False, 2, "stage 2 restarted and lost its state")
    assert m.epoch == epoch + 1 and seen.breaks == ["stage 2 restarted and lost its state"]
    assert not m.whole()  # stage 2 was heard after the break (its restart's heartbeat), stage 1 not
    join(m, 1)
    assert m.whole()


def test_a_link_down_breaks_a_healthy_pipeline_and_is_named_in_a_broken_one_without_a_new_epoch():
    m, seen = membership(warmed=True)
    join(m, 1, 2)
    m.completed()
    m.heartbeat(1, "a1", False, {})  # stage 2 died
    assert (m.healthy, m.broken_stage) == (False, 2) and len(seen.breaks) == 1
    epoch = m.epoch
    m.heartbeat(1, "a1", True, {})
    m.leaving(1, "a1")  # stage 1 replaced while broken: forgotten, not a second break
    assert 1 not in m.peers and len(seen.breaks) == 1
    m.heartbeat(1, "b1", False, {})  # the new stage 1, its link never up yet: nobody named
    assert m.broken_stage == 2
    m.heartbeat(1, "b1", True, {})
    m.heartbeat(1, "b1", False, {})  # a link that was up went down
    assert seen.health[-1] == (False, "stage 1 lost its link to stage 2", 2)
    assert m.epoch == epoch and len(seen.breaks) == 1


def test_a_silent_stage_is_found_and_a_leaving_one_of_another_incarnation_is_ignored():
    m, _ = membership()
    join(m, 1, 2)
    now = time.monotonic()
    assert m.silent_stage(now) is None
    m.peers[2].last_seen = now - 6.0
    assert m.silent_stage(now) == 2
    m.leaving(1, "old")
    assert 1 in m.peers


def test_a_new_pipeline_warms_up_once_and_a_reformed_one_serves_at_once():
    m, seen = membership()
    join(m, 1, 2)
    assert m.completed() is True  # a warm-up is due: the head starts it
    m.warming_up("warm-up-1")
    assert m.healthy and not m.serving and seen.health[-1] == (True, WARMING_UP, None)
    m.break_pipeline(2, "stage 2 died")  # lost with the warm-up in it
    m.warmed()
    assert m.warm_up_due and not m.healthy
    join(m, 1, 2)
    assert m.completed() is True
    m.warming_up("warm-up-2")
    m.warmed()
    assert m.serving and not m.warm_up_due and seen.health[-1] == (True, "", None)
    m.break_pipeline(1, "stage 1 restarted")
    join(m, 1, 2, incarnation="c")
    assert m.completed() is False and m.serving  # clients wait now: no warm-up before them


def test_a_head_that_warmed_its_pipeline_before_a_new_spec_does_not_warm_it_up_again():
    m, seen = membership(warmed=True)
    join(m, 1, 2)
    assert m.completed() is False and m.serving and seen.health == [(True, "", None)]


def test_stats_come_from_each_stages_last_heartbeat():
    m, _ = membership()
    m.heartbeat(1, "a1", True, {"steps": 3})
    assert m.stats_of(1) == {"steps": 3} and m.stats_of(2) is None
