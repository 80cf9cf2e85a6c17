"""replacement_bench says when its load leaves the machine no headroom: a steady state that already
misses the gap goal with nothing changing cannot tell a handover's gap from the machine's."""

from __future__ import annotations

from benchmarks.replacement_bench import headroom_note
from benchmarks.steady_clients import Window


def steady(gap_s: float) -> Window:
    return Window(ok=60, failed=0, errors=(), longest_gap_s=gap_s, gap_from_s=3.0, p50_s=0.61, p99_s=0.9)


def test_a_steady_state_within_the_goal_needs_no_note() -> None:
    assert headroom_note(steady(0.33), 0.5) is None


def test_a_steady_state_at_or_past_the_goal_is_named_with_its_figures() -> None:
    note = headroom_note(steady(0.53), 0.5)
    assert note is not None and "0.53 s" in note and "0.5 s goal" in note and "p50 0.61 s" in note
    assert headroom_note(steady(0.5), 0.5) is not None
