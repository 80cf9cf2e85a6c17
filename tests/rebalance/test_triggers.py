"""Each trigger of the rebalance policy produces a proposal that says why, once per occurrence."""

from __future__ import annotations

import pytest

from controlplane.deployments.models import PlanRevision
from controlplane.inventory.models import Node
from controlplane.rebalance.models import RebalanceProposal
from controlplane.rebalance.services import rebalance_evaluate
from tests.rebalance.helpers import (
    SLOW,
    policy_events,
    proposals,
    slow_stage_reported,
    throttled_reported,
    uncordon,
)

pytestmark = pytest.mark.django_db


def evaluate(deployment, now: float):
    return rebalance_evaluate(deployment_id=deployment.pk, now=now)


def assert_one_open(deployment, trigger: str, *fragments: str) -> RebalanceProposal:
    [proposal] = proposals(deployment)
    assert (proposal.status, proposal.trigger) == (RebalanceProposal.Status.OPEN, trigger)
    for fragment in fragments:
        assert fragment in proposal.reason
    assert proposal.revision.source == PlanRevision.Source.REBALANCE
    assert proposal.revision.status == PlanRevision.Status.DRAFT
    assert proposal.base_revision == deployment.revision
    assert proposal.gain == pytest.approx(proposal.proposed_tokens_per_s / proposal.current_tokens_per_s - 1)
    [event] = policy_events(deployment)
    assert event.detail["outcome"] == "proposed" and event.detail["trigger"] == trigger
    assert event.detail["proposal"] == proposal.pk and proposal.reason in event.message
    return proposal


def test_a_node_joining_proposes_a_plan_using_it(deployment, t0):
    assert evaluate(deployment, t0) is None  # the first pass takes the baseline: nothing changed
    uncordon("node-a")
    assert evaluate(deployment, t0 + 10) == "proposed"
    proposal = assert_one_open(deployment, "fleet", "node-a/gpu0", "joined")
    assert proposal.gain > 0.5
    assert proposal.diff["moved"] > 0
    assert any(change["device"][1].startswith("node-a/") for change in proposal.diff["stages"]
               if "device" in change)
    # The same occurrence is decided once: later passes add no proposal and no event.
    assert evaluate(deployment, t0 + 20) is None
    assert len(proposals(deployment)) == 1 and len(policy_events(deployment)) == 1


def test_a_sustained_drift_proposes_once_calibration_prices_it(deployment, t0, settings):
    settings.MOTLEY_CALIBRATION_MIN_SAMPLES = 3
    settings.MOTLEY_REBALANCE_MIN_GAIN = 0.1  # re-splitting one replica of seven gains ~12 %
    for k, at in enumerate((t0, t0 + 20, t0 + 40)):
        slow_stage_reported(deployment, at=at)
        assert evaluate(deployment, at) is None, k  # drifting, not yet for DRIFT_FOR_S
    slow_stage_reported(deployment, at=t0 + 61)
    assert evaluate(deployment, t0 + 61) == "proposed"
    proposal = assert_one_open(deployment, "drift", SLOW, "+200%", "for 61 s")
    assert proposal.diff["boundaries"] == 2  # replica 0's boundary moves off the slow card


def test_a_sustained_throttle_proposes_with_the_card_at_its_measured_speed(deployment, t0, settings):
    settings.MOTLEY_REBALANCE_MIN_GAIN = 0.1  # one replica of seven re-split: ~13 %
    node = Node.objects.get(name="node-b")
    for at in (t0, t0 + 30):
        throttled_reported(node="node-b", node_id=node.pk, index=2, at=at)
        assert evaluate(deployment, at) is None
    throttled_reported(node="node-b", node_id=node.pk, index=2, at=t0 + 60)
    assert evaluate(deployment, t0 + 60) == "proposed", policy_events(deployment)[-1].message
    assert_one_open(deployment, "throttled", "node-b/gpu2 has been throttled to 30% of its clock for 60 s")


def test_the_periodic_check_proposes_a_better_plan(deployment, t0, settings):
    uncordon("node-a")  # before the baseline: no fleet change to see, only a better plan to find
    assert evaluate(deployment, t0) is None
    assert evaluate(deployment, t0 + settings.MOTLEY_REBALANCE_CHECK_S - 1) is None
    assert evaluate(deployment, t0 + settings.MOTLEY_REBALANCE_CHECK_S) == "proposed"
    assert_one_open(deployment, "better_plan", "the planner finds a plan", "faster on the fleet as it is now")


def test_a_newer_proposal_supersedes_the_open_one(deployment, t0):
    evaluate(deployment, t0)
    uncordon("node-c")  # nothing to gain: node-c already carries stages
    uncordon("node-a")
    evaluate(deployment, t0 + 10)
    Node.objects.filter(name="node-a").update(status=Node.Status.SUSPECT)  # still plannable: no change
    Node.objects.filter(name="node-b").update(intent=Node.Intent.CORDONED)  # node-b's devices left
    assert evaluate(deployment, t0 + 20) == "proposed"
    first, second = proposals(deployment)
    assert first.status == RebalanceProposal.Status.SUPERSEDED
    assert second.status == RebalanceProposal.Status.OPEN
    assert "node-b/gpu0 left (cordoned)" in second.reason
