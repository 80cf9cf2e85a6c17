"""A re-plan after a loss or for a drain that moves only the stranded stages (``repaired_plan``) and
the choice between it and the planner's fresh plan, priced by the stages each restarts
(``least_change_plan``)."""

from __future__ import annotations

import copy

import pytest

from controlplane.planning import (
    PlanningError,
    PlanRequest,
    Workload,
    check,
    least_change_plan,
    plan,
    plan_from_dict,
    plan_to_dict,
)
from controlplane.planning.repair import layers_reloaded, repaired_plan
from tests.planning.factories import fleet, profile

LAYOUT = {"a": ["A100", "3090"], "b": ["3090"], "c": ["3090"]}


def request(layout=LAYOUT, **changes) -> PlanRequest:
    return PlanRequest(**{"fleet": fleet(layout), "model": profile(32), "workload": Workload(8, 2048),
                          "replicas": 1, **changes})


def applied(*stages) -> dict:
    return {"replicas": [{"stages": [{"device": d, "layers": [s, e], "bits": 16} for d, s, e in stages]}]}


def placements(p) -> list[tuple[str, tuple[int, int], int]]:
    return [(s.placement.device, (s.placement.start, s.placement.end), s.placement.bits)
            for r in p.replicas for s in r.stages]


def test_only_the_stranded_stage_moves_to_the_fastest_free_device():
    balanced = applied(("a/gpu0", 0, 20), ("b/gpu0", 20, 32))
    kept = repaired_plan(balanced, request(exclude_nodes=("b",)))
    assert kept.kind == "repaired"
    [(head, head_layers, _), (moved, layers, bits)] = placements(kept)
    assert (head, head_layers) == ("a/gpu0", (0, 20)) and (layers, bits) == ((20, 32), 16)
    assert moved == "a/gpu1"  # a 3090 like c/gpu0, but on the head's node: no network hop
    assert kept.explanation[0].startswith("repaired the applied plan: moved replica 0 stage 1 (layers 20-31) "
                                          "from b/gpu0 to a/gpu1")


def test_nothing_stranded_or_nowhere_to_go_is_no_repair():
    assert repaired_plan(applied(("a/gpu0", 0, 20), ("b/gpu0", 20, 32)), request()) is None
    tiny = {"a": ["T4"], "b": ["T4"]}  # no free card, and one T4 cannot hold the whole model at 16 bits
    assert repaired_plan(applied(("a/gpu0", 0, 16), ("b/gpu0", 16, 32)),
                         request(tiny, exclude_nodes=("b",), bits=(16,))) is None


def test_with_no_free_device_the_stranded_stages_layers_go_to_its_neighbours_split_at_the_best_layer():
    """Every device in use: the stage on the lost node goes, the stages beside it take its layers, split
    where the pipeline serves fastest (against every split priced by ``check``); the others keep all."""
    three = {"a": ["A100"], "b": ["3090"], "c": ["A100"]}
    before = applied(("c/gpu0", 0, 10), ("b/gpu0", 10, 20), ("a/gpu0", 20, 32))
    req = request(three, exclude_nodes=("b",))
    kept = repaired_plan(before, req)
    [(first, (start, m), _), (last, (m2, end), _)] = placements(kept)
    assert (first, start, last, end, m) == ("c/gpu0", 0, "a/gpu0", 32, m2)

    def speed(split: int) -> float:
        candidate = applied(("c/gpu0", 0, split), ("a/gpu0", split, 32))
        problems, priced = check(candidate, req)
        return priced.predicted.decode_tokens_per_s if not problems else 0.0
    best = max(range(10, 21), key=speed)
    assert m == best and 10 < m < 20  # two A100s: each takes part, the one with fewer layers more
    assert kept.predicted.decode_tokens_per_s == pytest.approx(speed(best))
    assert kept.explanation[0] == (f"repaired the applied plan: replica 0 stage 1 (layers 10-19, on b/gpu0) "
                                   f"taken by its neighbours: layers 10-{m - 1} by c/gpu0 and layers "
                                   f"{m}-19 by a/gpu0; every other stage kept")
    # c loads the layers it takes; a, now stage 1, is a new process (a stage keeps its index) and loads
    # all of its own
    assert layers_reloaded(before, kept, req) == ((m - 10) + (32 - m), 32)


def test_the_pause_loads_what_a_stage_did_not_hold_on_its_card_and_nothing_prepared_beside():
    before = applied(("a/gpu0", 0, 20), ("b/gpu0", 20, 32))
    req = request()

    def reloads(*stages) -> tuple[int, int]:
        return layers_reloaded(before, check(applied(*stages), req)[1], req)
    assert reloads(("a/gpu0", 0, 20), ("c/gpu0", 20, 32)) == (0, 32)  # c is free and another node
    assert reloads(("a/gpu0", 0, 22), ("c/gpu0", 22, 32)) == (2, 32)  # a loads layers 20-21 in place
    assert reloads(("a/gpu0", 0, 18), ("b/gpu0", 18, 32)) == (2, 32)  # b loads 18-19, a drops two
    assert reloads(("a/gpu1", 0, 20), ("b/gpu0", 20, 32)) == (20, 32)  # to a free card of its own node
    assert reloads(("b/gpu0", 0, 20), ("a/gpu0", 20, 32)) == (32, 32)  # swapped: both cards are in use
    assert reloads(("c/gpu0", 0, 32),) == (32, 32)  # one stage fewer: the pipeline's length changes


def test_absorbed_layers_take_the_precision_beside_them_in_each_neighbour():
    """The stage before takes layers at its last layer's precision (its low_bits segment grows), the
    stage after at its first's: no layer a survivor keeps changes precision, so none is quantized anew."""
    two = {"a": ["T4"], "b": ["T4"], "c": ["T4"]}
    before = {"replicas": [{"stages": [
        {"device": "a/gpu0", "layers": [0, 12], "bits": 8, "low_bits": 4, "low_from": 8},
        {"device": "b/gpu0", "layers": [12, 20], "bits": 4},
        {"device": "c/gpu0", "layers": [20, 32], "bits": 8}]}]}
    kept = repaired_plan(before, request(two, exclude_nodes=("b",), max_quantized=1.0))
    first, last = (s.placement for s in kept.replicas[0].stages)
    assert (first.start, first.bits, first.low_bits, first.low_from) == (0, 8, 4, 8)
    assert (last.end, last.bits, last.low_bits, first.end) == (32, 8, None, last.start)
    assert 12 <= first.end <= 20


def shifted(before: dict, boundary: int, by: int) -> dict:
    """``before`` with the boundary after stage ``boundary`` moved by ``by`` layers (an operator's edit)."""
    edited = copy.deepcopy(before)
    stages = edited["replicas"][0]["stages"]
    stages[boundary]["layers"][1] += by
    stages[boundary + 1]["layers"][0] += by
    return edited


def test_the_repair_is_kept_within_the_tolerance_and_the_fresh_plan_taken_beyond_it():
    layout = {**LAYOUT, "spare": ["3090"]}
    before = plan(request(layout, exclude_nodes=("spare",)))  # the planner's plan, the spare unused
    stranded = next(d for d, _, _ in placements(before) if d in ("b/gpu0", "c/gpu0"))
    req = request(layout, exclude_nodes=(stranded.split("/")[0],))
    after = least_change_plan(plan_to_dict(before), req, keep_within=0.5)
    assert after.kind == "repaired"  # the spare is the same card: as fast as a fresh plan
    assert placements(after) == [("spare/gpu0" if d == stranded else d, layers, bits)
                                 for d, layers, bits in placements(before)]
    assert after.predicted.decode_tokens_per_s == pytest.approx(plan(req).predicted.decode_tokens_per_s)
    assert "(100% of a fresh plan's decode throughput, which would load" in after.explanation[0]

    req = request(exclude_nodes=("b",))
    lopsided = applied(("a/gpu0", 0, 2), ("b/gpu0", 2, 32))  # the slow card carries almost everything
    fresh = plan(req).predicted.decode_tokens_per_s
    assert repaired_plan(lopsided, req).predicted.decode_tokens_per_s < 0.3 * fresh
    assert least_change_plan(lopsided, req, keep_within=0.5).kind == "planner"  # much better: it wins


def test_the_fresh_plan_pays_for_the_stages_it_restarts_beyond_the_repair():
    """Two drains whose repairs both predict ~82 % of the fresh plan and load nothing in the pause (the
    stranded stage moves to the spare, a free card of another node: prepared beside). Where the fresh
    plan would load 19 of 32 layers in place, the repair is kept; where it loads none either (it moves
    the stranded stage to the spare too, and shrinks a neighbour), it is taken for its gain."""
    layout = {**LAYOUT, "spare": ["3090"]}
    before = plan_to_dict(plan(request(layout, exclude_nodes=("spare",))))
    assert [d for d, _, _ in placements(plan_from_dict(before))] == ["c/gpu0", "b/gpu0", "a/gpu0", "a/gpu1"]

    def compared(applied: dict, drained: str) -> tuple[float, tuple, tuple, PlanRequest]:
        req = request(layout, exclude_nodes=(drained,))
        kept, fresh = repaired_plan(applied, req), plan(req)
        share = kept.predicted.decode_tokens_per_s / fresh.predicted.decode_tokens_per_s
        return share, layers_reloaded(applied, kept, req), layers_reloaded(applied, fresh, req), req

    last_boundary_off = shifted(before, 2, -1)  # an operator's edit the fresh plan would undo
    share, kept, fresh, req = compared(last_boundary_off, "b")
    assert share == pytest.approx(0.82, abs=0.01) and kept == (0, 32) and fresh == (19, 32)
    chosen = least_change_plan(last_boundary_off, req, keep_within=0.5)  # tolerance 0.5 x 19/32
    assert chosen.kind == "repaired"
    assert "which would load 19 of 32 layers in the pause, against 0)" in chosen.explanation[0]
    assert least_change_plan(last_boundary_off, req, keep_within=0.1).kind == "planner"  # 0.1 x 19/32

    first_boundary_off = shifted(before, 0, -1)
    share, kept, fresh, req = compared(first_boundary_off, "c")
    assert share == pytest.approx(0.82, abs=0.01) and kept == (0, 32) and fresh == (0, 32)
    assert least_change_plan(first_boundary_off, req, keep_within=1.0).kind == "planner"  # no tolerance


def test_without_any_plan_the_planners_error_is_raised():
    tiny = {"a": ["T4"], "b": ["T4"]}
    with pytest.raises(PlanningError):
        least_change_plan(applied(("a/gpu0", 0, 16), ("b/gpu0", 16, 32)),
                          request(tiny, exclude_nodes=("b",), bits=(16,)), keep_within=0.1)


def test_a_repaired_plan_round_trips_through_its_json():
    kept = repaired_plan(applied(("a/gpu0", 0, 20), ("b/gpu0", 20, 32)), request(exclude_nodes=("b",)))
    assert plan_to_dict(kept)["kind"] == "repaired" and plan_from_dict(plan_to_dict(kept)) == kept
