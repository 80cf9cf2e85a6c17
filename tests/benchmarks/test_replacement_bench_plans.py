"""replacement_bench's plan edits keep every layer's precision: a planner's stage that runs its last
layers lower (``low_bits`` from ``low_from``) split in two or with its boundary moved must still be a
plan the API accepts (the bench's beside run once died on a 400: ``low_from`` outside a half)."""

from __future__ import annotations

import copy

import pytest

from benchmarks.replacement_bench import boundary_moves, two_stages, with_layers
from contracts.precision import Precision

MIXED = {"device": "a/gpu0", "layers": [0, 16], "bits": 16, "low_bits": 4, "low_from": 9}


def precisions(stage: dict) -> tuple[int, ...]:
    """Per-layer bits, raising as the API's validation does for a split not strictly inside."""
    return Precision.of(stage).layer_bits(*stage["layers"])


@pytest.mark.parametrize("low_from", range(1, 16))
@pytest.mark.parametrize("middle", range(1, 16))
def test_with_layers_keeps_each_layers_bits(low_from: int, middle: int) -> None:
    stage = {**MIXED, "low_from": low_from}
    halves = [with_layers(stage, 0, middle), with_layers(stage, middle, 16)]
    assert precisions(halves[0]) + precisions(halves[1]) == precisions(stage)


def test_two_stages_splits_a_mixed_stage_onto_another_device() -> None:
    plan = {"replicas": [{"stages": [copy.deepcopy(MIXED)]}]}
    first, second = two_stages(plan, ["a/gpu0", "b/gpu0"])["replicas"][0]["stages"]
    assert (first["layers"], second["layers"], second["device"]) == ([0, 8], [8, 16], "b/gpu0")
    assert "low_bits" not in first and (second["low_bits"], second["low_from"]) == (4, 9)
    assert plan["replicas"][0]["micro_batches"] == 2


def test_the_boundary_moves_toward_the_larger_side_first_then_the_other_way() -> None:
    """Each move keeps every layer's precision valid (the moved layer takes its new stage's); which one
    the deployment takes (quality budget, memory) the API says, so both are offered."""
    stages = [{**MIXED, "layers": [0, 5], "low_from": 4}, {"device": "b/gpu0", "layers": [5, 16], "bits": 8}]
    plan = {"replicas": [{"stages": stages}]}
    larger, other = boundary_moves(plan)[:2]
    first, second = larger["replicas"][0]["stages"]
    assert (first["layers"], second["layers"]) == ([0, 6], [6, 16])
    # layer 5 joins the low tail
    assert precisions(first) + precisions(second) == (16,) * 4 + (4, 4) + (8,) * 10
    first, second = other["replicas"][0]["stages"]
    assert (first["layers"], second["layers"]) == ([0, 4], [4, 16])
    assert precisions(first) + precisions(second) == (16,) * 4 + (8,) * 12  # the low tail left with layer 4
    assert plan["replicas"][0]["stages"] == stages  # the applied plan itself is left as it was



def test_every_boundary_is_offered_in_turn_and_no_stage_is_left_empty() -> None:
    """A plan whose first boundary cannot move (the planner's plan of the run fills a card) still gets
    a boundary move: the next boundary's follow, and a one-layer stage is never emptied."""
    stages = [{"device": "a/gpu0", "layers": [0, 1], "bits": 16},
              {"device": "b/gpu0", "layers": [1, 9], "bits": 16},
              {"device": "c/gpu0", "layers": [9, 16], "bits": 8}]
    moves = boundary_moves({"replicas": [{"stages": stages}]})
    assert [[s["layers"] for s in m["replicas"][0]["stages"]] for m in moves] == [
        [[0, 2], [2, 9], [9, 16]],
        [[0, 1], [1, 8], [8, 16]], [[0, 1], [1, 10], [10, 16]],
    ]
