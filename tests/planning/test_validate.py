"""What-if validation of operator-edited plans."""

from __future__ import annotations

from controlplane.planning import PlanRequest, Workload, plan, plan_to_dict, validate
from tests.planning.factories import fleet, profile


def request(**changes):
    base = dict(fleet=fleet({"a": ["A100", "T4"], "b": ["3090"]}, health={"b/gpu0": {"down": False}}),
                model=profile(32), workload=Workload(8, 2048), replicas=1)
    base.update(changes)
    return PlanRequest(**base)


def edited(*stages):
    return {"replicas": [{"stages": [{"device": d, "layers": [s, e], "bits": b} for d, s, e, b in stages]}]}


def codes(report):
    return sorted({p.code for p in report.problems})


def test_the_planners_own_plan_is_valid_and_matches():
    req = request()
    own = plan(req)
    report = validate(plan_to_dict(own), req)
    assert report.ok, report.problems
    assert report.predicted.decode_tokens_per_s == own.predicted.decode_tokens_per_s
    assert report.planner_predicted == own.predicted
    assert validate(own, req).ok


def test_every_problem_is_reported_at_once():
    req = request(fleet=fleet({"a": ["A100", "T4"], "b": ["3090"]}, health={"b/gpu0": {"down": True}}))
    report = validate(edited(("a/gpu0", 0, 10, 16), ("a/gpu1", 8, 20, 2), ("b/gpu0", 20, 30, 16),
                             ("x/gpu9", 30, 31, 16)), req)
    assert codes(report) == ["device_unavailable", "layer_duplicated", "layer_missing", "not_contiguous",
                             "precision_not_allowed", "unknown_device"]
    messages = " ".join(p.message for p in report.problems)
    assert "[31, 32)" in messages and "[8, 10)" in messages and "down" in messages
    assert report.edited is None  # structure broken: not priced
    assert report.planned is not None  # the planner's own figures are still there


def test_over_memory_and_quality_budget_are_priced_side_by_side():
    req = request(max_quantized=0.0)
    report = validate(edited(("a/gpu1", 0, 30, 16), ("b/gpu0", 30, 32, 4)), req)
    assert codes(report) == ["over_memory", "over_quality_budget"]
    over = next(p for p in report.problems if p.code == "over_memory")
    assert "a/gpu1" in over.message and "over by" in over.message
    assert report.predicted is not None and report.planner_predicted is not None
    assert report.planner_predicted.decode_tokens_per_s > 0


def test_device_reused_and_malformed():
    req = request()
    assert "device_reused" in codes(validate(edited(("a/gpu0", 0, 16, 16), ("a/gpu0", 16, 32, 16)), req))
    assert codes(validate({"replicas": [{"stages": [{"device": "a/gpu0"}]}]}, req)) == ["malformed"]


def test_pins_are_checked():
    from controlplane.planning import Pin

    req = request(pins=(Pin("a/gpu1", 0, 4),))
    report = validate(edited(("a/gpu0", 0, 32, 16)), req)
    assert codes(report) == ["pin_violated"]


def test_a_stage_mixing_two_precisions_is_priced_and_a_bad_split_is_named():
    req = request()
    plan_dict = edited(("a/gpu0", 0, 20, 16), ("a/gpu1", 20, 32, 16))
    whole = validate(plan_dict, req)
    plan_dict["replicas"][0]["stages"][1].update(low_bits=4, low_from=24)
    mixed = validate(plan_dict, req)
    assert mixed.ok, mixed.problems
    (_, t4), = [r.stages for r in mixed.edited.replicas]
    assert (t4.low_bits, t4.low_from, t4.quantized_layers) == (4, 24, 8)
    assert t4.memory.weights_bytes < whole.edited.replicas[0].stages[1].memory.weights_bytes
    assert mixed.edited.quantized_layers == 8
    for change, code in (({"low_from": 32}, "bad_split"), ({"low_from": None}, "bad_split"),
                         ({"low_bits": 16}, "bad_split"), ({"low_bits": 2}, "precision_not_allowed")):
        bad = edited(("a/gpu0", 0, 20, 16), ("a/gpu1", 20, 32, 16))
        bad["replicas"][0]["stages"][1].update({"low_bits": 4, "low_from": 24, **change})
        assert code in codes(validate(bad, req)), change
    over = edited(("a/gpu0", 0, 20, 16), ("a/gpu1", 20, 32, 16))
    over["replicas"][0]["stages"][1].update(low_bits=4, low_from=21)
    assert codes(validate(over, request(max_quantized=0.25))) == ["over_quality_budget"]
