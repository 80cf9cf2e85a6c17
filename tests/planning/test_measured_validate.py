"""The what-if check and the explanation under the measured quality budget (``max_kl``)."""

from __future__ import annotations

from dataclasses import replace

from controlplane.planning import PlanRequest, Workload, plan, plan_to_dict, validate
from tests.planning.factories import fleet, profile

SIZES = [800_000_000] * 8
KL = (0.01, 0.01, 0.01, 0.01, 5.0, 5.0, 5.0, 5.0)
SENSITIVITY = {8: KL, 4: tuple(2 * k for k in KL)}


def request(max_kl: float | None = 1.0, sensitivity=SENSITIVITY) -> PlanRequest:
    model = replace(profile(sizes=SIZES, vocab=32000), sensitivity=sensitivity)
    return PlanRequest(fleet({"n0": ["T4", "3090"]}), model, Workload(batch=4, context=1024), replicas=1,
                       max_kl=max_kl)


def edited(*stages):
    return {"replicas": [{"stages": [dict(zip(("device", "layers", "bits", "low_bits", "low_from"),
                                              (d, [s, e], b, *rest)))
                                     for d, s, e, b, *rest in stages]}]}


def budget_problems(report):
    return [p for p in report.problems if p.code == "over_quality_budget"]


def test_the_planners_measured_plan_is_valid_and_explains_its_budget():
    req = request()
    own = plan(req)
    report = validate(plan_to_dict(own), req)
    assert report.ok, report.problems
    quality = own.explanation[-1]
    assert "measured budget" in quality and "max_kl 1" in quality, quality


def test_sensitive_layers_low_are_refused_with_the_sum_and_the_budget():
    # The second half (KL 5 each at 8 bits) on the T4 at 8 bits: 20 > 1.
    report = validate(edited(("n0/gpu1", 0, 4, 16), ("n0/gpu0", 4, 8, 8)), request())
    (problem,) = budget_problems(report)
    assert "sums to 20" in problem.message and "max_kl 1" in problem.message, problem.message
    assert report.edited is not None  # still priced, next to the planner's figures
    # A split stage counts only its low tail, at its own precision: [6, 8) at 4 bits is 20 too.
    report = validate(edited(("n0/gpu1", 0, 4, 16), ("n0/gpu0", 4, 8, 16, 4, 6)), request())
    assert "sums to 20" in budget_problems(report)[0].message


def test_insensitive_layers_low_are_within_the_budget_whatever_their_count():
    # Four layers at 4 bits (half the model) cost 0.08 of KL: within max_kl 1, and within the count
    # budget too; six would be over the count budget (50 %) but not over the measured one.
    assert not budget_problems(validate(edited(("n0/gpu0", 0, 4, 4), ("n0/gpu1", 4, 8, 16)), request()))
    low_kl = {8: (0.01,) * 8, 4: (0.02,) * 8}
    six = edited(("n0/gpu0", 0, 6, 4), ("n0/gpu1", 6, 8, 16))
    assert not budget_problems(validate(six, request(sensitivity=low_kl)))
    (counted,) = budget_problems(validate(six, request(max_kl=None, sensitivity=low_kl)))
    assert "6 layers below 16 bits, budget 4" in counted.message


def test_the_count_budget_explanation_names_it_and_the_measured_kl_when_profiled():
    own = plan(request(max_kl=None))
    assert "(count budget 4); their measured KL sums to" in own.explanation[-1], own.explanation[-1]
    bare = plan(PlanRequest(fleet({"n0": ["T4", "3090"]}), profile(sizes=SIZES, vocab=32000),
                            Workload(batch=4, context=1024), replicas=1))
    assert bare.explanation[-1].endswith("(count budget 4).")
