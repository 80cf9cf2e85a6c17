"""The degrade search against the planner: on a fleet that lost a card the full workload does not fit,
the degraded one does, and it is the largest that does (more sequences first, then a longer context);
lower precision only on the operator's emergency quality budget, and only within it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controlplane.deployments.degrade import (
    CONTEXT_FLOOR,
    degraded_plan,
    emergency_request,
    lowered_precision,
    measured_low_bits,
    precision_text,
    with_workload,
    workload_of,
    workload_shown,
    workload_text,
)
from controlplane.deployments.plan_request_form import plan_request_from_dict
from controlplane.planning import PlanningError, plan_to_dict
from controlplane.planning import plan as make_plan
from tests.planning.factories import fleet, profile

ASKED = {"batch": 32, "context": 4096, "bits": [16], "replicas": 1}


def planner(cards: int, sensitivity=None, **model):
    """``plan_for`` on ``cards`` T4s of one node each: the planner's plan or its PlanningError."""
    on, prof = fleet({f"n{i}": ["T4"] for i in range(cards)}), profile(**model)
    prof = replace(prof, sensitivity=sensitivity or {})
    asked: list[dict] = []

    def plan_for(request: dict):
        asked.append(request)
        return make_plan(plan_request_from_dict(request, fleet=on, profile=prof))

    plan_for.asked = asked
    return plan_for


def fits(plan_for, request: dict) -> bool:
    try:
        plan_for(request)
    except PlanningError:
        return False
    return True


def test_a_fleet_that_lost_a_card_serves_the_most_sequences_that_fit_at_the_asked_context():
    assert fits(planner(4), ASKED) and not fits(planner(3), ASKED)  # the loss is what does not fit
    plan_for = planner(3)
    request, plan = degraded_plan(ASKED, plan_for)
    batch, context = workload_of(request)
    assert context == 4096 and 1 <= batch < 32
    assert (plan.batch, plan.context) == (batch, context)
    assert not fits(planner(3), with_workload(ASKED, batch=batch + 1, context=4096))  # the largest
    assert len(plan_for.asked) <= 6  # a binary search: a handful of planner calls
    assert {k: request[k] for k in ("bits", "replicas")} == {"bits": [16], "replicas": 1}


def test_a_fleet_that_lost_a_replicas_card_serves_the_replicas_left_at_the_whole_workload():
    """Two replicas of one card each: with one card lost, one replica of the asked workload fits, and
    each request it serves is served as asked (fewer sequences would only queue more of them)."""
    two = {**ASKED, "batch": 8, "context": 1024, "replicas": 2}
    assert fits(planner(2), two) and not fits(planner(1), two)
    request, plan = degraded_plan(two, planner(1))
    assert request == {**two, "replicas": 1} and len(plan.replicas) == 1
    assert (plan.batch, plan.context) == (8, 1024)
    three = {**two, "replicas": 3}  # three asked, two cards left: two replicas, not one
    request, plan = degraded_plan(three, planner(2))
    assert request["replicas"] == 2 and len(plan.replicas) == 2 and plan.batch == 8
    # Not one replica of the whole workload left: the workload of one replica shrinks.
    request, plan = degraded_plan({**two, "batch": 4000}, planner(1))
    assert request["replicas"] == 1 and workload_of(request)[0] < 4000


def test_the_workload_text_names_the_replicas_where_they_differ():
    asked = workload_shown({**ASKED, "replicas": 2})
    assert workload_shown(ASKED) == {"batch": 32, "context": 4096, "replicas": 1}
    assert workload_shown({"batch": 4}) == {"batch": 4, "context": workload_of({})[1], "replicas": "auto"}
    one = workload_shown(ASKED)
    assert workload_text(one, asked) == "replicas 1 of 2, batch 32 of 32, context 4096 of 4096"
    assert workload_text(asked, asked) == "batch 32 of 32, context 4096 of 4096"


def test_when_not_one_sequence_fits_the_context_shrinks_to_the_longest_that_does():
    plan_for = planner(1, layer_params=230_000_000)  # 13.7 GiB of weights: little room for KV on a T4
    request, plan = degraded_plan({**ASKED, "prompt_tokens": 3000}, plan_for)
    batch, context = workload_of(request)
    assert batch == 1 and CONTEXT_FLOOR <= context < 4096
    assert request["prompt_tokens"] == min(3000, context)
    assert not fits(planner(1, layer_params=230_000_000), with_workload(ASKED, batch=1, context=context + 1))


def test_nothing_that_fits_is_a_planning_error_naming_the_floor():
    with pytest.raises(PlanningError, match=f"not even one sequence of {CONTEXT_FLOOR} tokens fits"):
        degraded_plan(ASKED, planner(1, layer_params=400_000_000))  # the weights alone do not fit


# 32 layers of 400 M parameters: 25.6 GB at 16 bits, more than one T4 holds; 13 GB at 8 bits.
BIG = {"layer_params": 400_000_000}
MEASURED = {8: (0.001,) * 32, 4: (0.01,) * 32}  # summed: 0.032 all at 8 bits, 0.32 all at 4


def planner_profile():
    return replace(profile(**BIG), sensitivity=MEASURED)


def lowered(max_kl: float) -> dict:
    return emergency_request(ASKED, max_kl=max_kl, low_bits=(8, 4))


def test_lower_precision_only_where_the_operator_allows_it():
    with pytest.raises(PlanningError, match=f"not even one sequence of {CONTEXT_FLOOR} tokens fits"):
        degraded_plan(ASKED, planner(1, MEASURED, **BIG))  # no emergency budget: an outage
    request, plan = degraded_plan(ASKED, planner(1, MEASURED, **BIG), lowered=lowered(0.05))
    assert request["bits"] == [16, 8, 4] and request["quality"] == {"max_kl": 0.05}
    assert plan.quantized_layers > 0 and workload_of(request)[1] == 4096
    lowered_shown = lowered_precision(request, ASKED, plan_to_dict(plan), planner_profile())
    assert lowered_shown["layers"] == {"8": 32} and lowered_shown["kl"] == pytest.approx(0.032)
    assert lowered_shown["max_kl"] == 0.05
    assert precision_text(lowered_shown) == ("precision lowered: 32 layer(s) at 8 bits, KL 0.032 of the "
                                             "emergency budget 0.05")
    unmeasured = lowered_precision(request, ASKED, plan_to_dict(plan), profile(**BIG))  # measured again
    assert unmeasured["kl"] is None and precision_text(unmeasured).endswith("KL unmeasured of the emergency "
                                                                            "budget 0.05")


def test_the_emergency_budget_is_not_used_while_a_smaller_workload_fits_the_plans_precision():
    plan_for = planner(3)
    request, plan = degraded_plan(ASKED, plan_for, lowered=lowered(1.0))
    assert request["bits"] == [16] and "quality" not in request and plan.quantized_layers == 0
    assert lowered_precision(request, ASKED, plan_to_dict(plan), planner_profile()) is None


def test_within_the_budget_a_larger_budget_keeps_a_larger_workload():
    small, _ = degraded_plan(ASKED, planner(1, MEASURED, **BIG), lowered=lowered(0.05))
    large, plan = degraded_plan(ASKED, planner(1, MEASURED, **BIG), lowered=lowered(1.0))
    assert workload_of(large)[0] > workload_of(small)[0]  # int4 leaves more room for KV than int8
    shown = lowered_precision(large, ASKED, plan_to_dict(plan), planner_profile())
    assert shown["kl"] <= 1.0 and "4" in shown["layers"]


def test_a_budget_too_small_to_fit_is_an_outage_that_names_it():
    says = r"nor on the emergency quality budget \(max_kl 0.02, 16/8/4 bits\)"
    with pytest.raises(PlanningError, match=says):
        degraded_plan(ASKED, planner(1, MEASURED, **BIG), lowered=lowered(0.02))  # 20 of 32 layers at int8


def test_only_the_measured_precisions_are_lowered_to():
    prof = replace(profile(), sensitivity={8: MEASURED[8], 4: (0.01,) * 5})  # int4 measured on 5 layers
    assert measured_low_bits(prof) == (8,)
    assert emergency_request({"bits": [8, 4]}, max_kl=0.1, low_bits=(8,))["bits"] == [8]
