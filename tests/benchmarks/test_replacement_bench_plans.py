"""replacement_bench's plan edits keep every layer's precision: a planner's stage that runs its last
layers lower (``low_bits`` from ``low_from``) split in two or with its boundary moved must still be a
plan the API accepts (the bench's beside run once died on a 400: ``low_from`` outside a half)."""

from __future__ import annotations

import copy

import pytest

from benchmarks.replacement_bench import boundary_moved, two_stages, with_layers
from contracts.precision import layer_precisions

MIXED = {"device": "a/gpu0", "layers": [0, 16], "bits": 16, "low_bits": 4, "low_from": 9}


def precisions(stage: dict) -> tuple[int, ...]:
    """Per-layer bits, raising as the API's validation does for a split not strictly inside."""
    return layer_precisions(*stage["layers"], stage["bits"], stage.get("low_bits"), stage.get("low_from"))


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


def test_boundary_moved_toward_the_larger_side_stays_valid() -> None:
    stages = [{**MIXED, "layers": [0, 5], "low_from": 4}, {"device": "b/gpu0", "layers": [5, 16], "bits": 8}]
    first, second = boundary_moved({"replicas": [{"stages": stages}]})["replicas"][0]["stages"]
    assert (first["layers"], second["layers"]) == ([0, 6], [6, 16])
    assert precisions(first) + precisions(second) == (16,) * 4 + (4, 4) + (8,) * 10  # layer 5 joins the low tail


def test_boundary_moved_the_other_way_when_the_layer_would_drop_below_16_bits() -> None:
    """The larger side's first layer would join a 4-bit tail: one layer more below 16 bits than the
    plan's quality budget allowed (the apply was refused), so the boundary moves the other way."""
    stages = [{**MIXED, "layers": [0, 5], "low_from": 4}, {"device": "b/gpu0", "layers": [5, 16], "bits": 16}]
    first, second = boundary_moved({"replicas": [{"stages": stages}]})["replicas"][0]["stages"]
    assert (first["layers"], second["layers"]) == ([0, 4], [4, 16])
    assert precisions(first) + precisions(second) == (16,) * 16
