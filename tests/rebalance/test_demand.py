"""The demand trigger through the policy's Celery task: the load a gateway publishes, a proposal of the
replicas it needs (or one fewer) whose text and fields give the planner's prediction at the forecast
load."""

from __future__ import annotations

import math
from datetime import datetime, timezone

import pytest
from django.core.cache import cache

from controlplane.deployments.models import Deployment, PlanRevision
from controlplane.deployments.selectors import devices_in_use
from controlplane.rebalance.demand import sample_publish
from controlplane.rebalance.models import RebalanceProposal, RebalanceState
from controlplane.rebalance.tasks import rebalance_evaluate_all
from tests.rebalance.helpers import policy_events, proposals, uncordon

pytestmark = pytest.mark.django_db


def passes(deployment, t0: float, share: float, seconds: range, monkeypatch, **measured) -> None:
    """A gateway publishing ``share`` of the applied plan's capacity, and a policy pass, every 10 s."""
    capacity = deployment.revision.plan["predicted"]["decode_tokens_per_s"]
    for s in seconds:
        sample_publish(deployment_id=deployment.pk, process="gw-1", sample={
            "at": t0 + s, "arrival_rate": share * capacity / 100, "output_tokens_per_s": share * capacity,
            **measured})
        monkeypatch.setattr("controlplane.rebalance.services.time.time", lambda s=s: t0 + s)
        rebalance_evaluate_all()


@pytest.fixture(autouse=True)
def fresh_cache():
    cache.clear()
    yield
    cache.clear()


def test_targets_at_risk_propose_another_replica_with_its_prediction(deployment, t0, monkeypatch):
    uncordon("node-a")  # free cards before the first pass: the fleet trigger has nothing to say
    Deployment.objects.filter(pk=deployment.pk).update(ttft_target_ms=400, max_replicas=8)
    deployment.refresh_from_db()
    replicas = len(deployment.revision.placements)
    passes(deployment, t0, 0.95, range(0, 50, 10), monkeypatch, ttft_p95_ms=900.0)
    assert proposals(deployment) == []  # at risk for 40 s: not yet lasting
    passes(deployment, t0, 0.95, range(50, 80, 10), monkeypatch, ttft_p95_ms=900.0)
    [proposal] = proposals(deployment)
    assert proposal.trigger == RebalanceProposal.Trigger.DEMAND
    assert proposal.status == RebalanceProposal.Status.OPEN
    wanted = math.ceil(replicas * 0.95 / 0.8)  # as many as bring the load under the 80 % mark at once
    assert wanted > replicas + 1
    assert len(proposal.revision.placements) == wanted and proposal.revision.request["replicas"] == wanted
    forecast = proposal.forecast
    assert forecast["replicas"] == wanted and forecast["ttft_target_ms"] == 400
    assert forecast["capacity_tokens_per_s"] > forecast["forecast_output_tokens_per_s"] > 0
    assert f"predicted TTFT p95 {forecast['ttft_ms']:.0f} ms (target 400 ms)" in proposal.reason
    assert "TTFT p95 900 ms over its 400 ms target" in proposal.reason
    [event] = policy_events(deployment)
    assert event.detail["outcome"] == "proposed" and event.detail["forecast"] == forecast


def test_low_load_applies_a_replica_fewer_in_auto_down_to_min_replicas(deployment, t0, monkeypatch):
    replicas = len(deployment.revision.placements)
    assert replicas >= 2
    Deployment.objects.filter(pk=deployment.pk).update(
        min_replicas=replicas - 1, tpot_target_ms=10_000, rebalance_policy=Deployment.RebalancePolicy.AUTO)
    deployment.refresh_from_db()
    used = devices_in_use(deployment=None)
    passes(deployment, t0, 0.05, range(0, 80, 10), monkeypatch)
    [proposal] = proposals(deployment)
    assert (proposal.trigger, proposal.status) == ("demand", RebalanceProposal.Status.ACCEPTED)
    assert proposal.forecast["meets"] is True and "it meets the targets" in proposal.reason
    deployment.refresh_from_db()
    assert deployment.revision == proposal.revision and len(deployment.revision.placements) == replicas - 1
    assert [e.detail["outcome"] for e in policy_events(deployment)] == ["applied"]
    assert len(devices_in_use(deployment=None)) < len(used)  # cards released for other deployments


def test_without_free_cards_a_scale_out_asks_for_a_larger_batch(deployment, t0, monkeypatch):
    """node-a stays cordoned: no card takes another replica, so the plan doubles its batch instead."""
    Deployment.objects.filter(pk=deployment.pk).update(tpot_target_ms=10_000)
    deployment.refresh_from_db()
    replicas, batch = len(deployment.revision.placements), deployment.revision.request["batch"]
    passes(deployment, t0, 0.95, range(0, 80, 10), monkeypatch)
    [proposal] = proposals(deployment)
    assert proposal.trigger == RebalanceProposal.Trigger.DEMAND
    assert proposal.revision.request["batch"] == 2 * batch and proposal.revision.plan["batch"] == 2 * batch
    assert len(proposal.revision.placements) == replicas and proposal.diff["batch"] == [batch, 2 * batch]
    capacity = proposal.forecast["capacity_tokens_per_s"]
    assert capacity == pytest.approx(proposal.proposed_tokens_per_s, abs=0.01)


def test_a_percentile_measured_before_the_applied_change_is_no_miss(deployment, t0, monkeypatch, settings):
    """The gateway's percentiles cover its last MOTLEY_REBALANCE_DEMAND_WINDOW_S: for that long after a
    change they still describe the plan it replaced, so a miss among them does not put the new plan at
    risk (in a bench with a cooldown shorter than the window, it asked for a replica more, then a batch
    twice as large, at every pass after each change it had made)."""
    uncordon("node-a")
    Deployment.objects.filter(pk=deployment.pk).update(ttft_target_ms=400, max_replicas=8)
    PlanRevision.objects.filter(pk=deployment.revision_id).update(  # half a second before: a stored
        applied_at=datetime.fromtimestamp(t0 - 0.5, timezone.utc))  # microsecond is no boundary case
    deployment.refresh_from_db()
    window = int(settings.MOTLEY_REBALANCE_DEMAND_WINDOW_S)
    passes(deployment, t0, 0.3, range(0, window, 10), monkeypatch, ttft_p95_ms=900.0)
    state = RebalanceState.objects.get(deployment=deployment)
    assert state.demand["memory"]["at_risk_since"] is None
    assert [s[3] for s in state.demand["series"]] == [None] * len(state.demand["series"])
    passes(deployment, t0, 0.3, range(window, window + 20, 10), monkeypatch,
           ttft_p95_ms=900.0)
    state.refresh_from_db()
    assert state.demand["memory"]["at_risk_since"] == t0 + window  # measured on this plan alone
