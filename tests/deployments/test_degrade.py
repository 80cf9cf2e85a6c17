"""The degrade search against the planner: on a fleet that lost a card the full workload does not fit,
the degraded one does, and it is the largest that does (more sequences first, then a longer context)."""

from __future__ import annotations

import pytest

from controlplane.deployments.degrade import CONTEXT_FLOOR, degraded_plan, with_workload, workload_of
from controlplane.deployments.plan_request_form import plan_request_from_dict
from controlplane.planning import PlanningError
from controlplane.planning import plan as make_plan
from tests.planning.factories import fleet, profile

ASKED = {"batch": 32, "context": 4096, "bits": [16], "replicas": 1}


def planner(cards: int, **model):
    """``plan_for`` on ``cards`` T4s of one node each: the planner's plan or its PlanningError."""
    on, prof = fleet({f"n{i}": ["T4"] for i in range(cards)}), profile(**model)
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
