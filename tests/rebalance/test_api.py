"""The proposals API: list, accept (an apply, audited), dismiss (audited); authentication; the
policy as a deployment setting."""

from __future__ import annotations

import pytest
from django.core.cache import cache

from controlplane.audit.models import AuditEntry
from controlplane.deployments.models import Deployment, DeploymentEvent, PlanRevision
from controlplane.rebalance.models import RebalanceProposal
from controlplane.rebalance.services import rebalance_evaluate
from tests.api.mixins import assert_error
from tests.dashboard.seed import demand_proposal_create
from tests.rebalance.helpers import uncordon

pytestmark = pytest.mark.django_db


@pytest.fixture
def proposal(deployment, t0) -> RebalanceProposal:
    rebalance_evaluate(deployment_id=deployment.pk, now=t0)
    uncordon("node-a")
    rebalance_evaluate(deployment_id=deployment.pk, now=t0 + 10)
    return RebalanceProposal.objects.get(deployment=deployment)


def test_anonymous_calls_are_refused(anonymous, proposal):
    assert anonymous.get(f"/api/v1/deployments/{proposal.deployment_id}/proposals/").status_code == 401
    for verb in ("accept", "dismiss"):
        response = anonymous.post(f"/api/v1/rebalance-proposals/{proposal.pk}/{verb}/")
        assert response.status_code == 401 and response["WWW-Authenticate"] == "Token"
    assert RebalanceProposal.objects.get(pk=proposal.pk).status == RebalanceProposal.Status.OPEN


def test_list_shows_the_open_proposal_with_its_figures(api, proposal):
    body = api.get(f"/api/v1/deployments/{proposal.deployment_id}/proposals/?status=open").json()
    [shown] = body["results"]
    assert (shown["id"], shown["trigger"], shown["status"]) == (proposal.pk, "fleet", "open")
    assert "node-a/gpu0" in shown["reason"] and shown["gain"] == pytest.approx(proposal.gain)
    assert shown["diff"]["moved"] > 0 and shown["revision_plan"]["replicas"]
    accepted = api.get(f"/api/v1/deployments/{proposal.deployment_id}/proposals/?status=accepted")
    assert accepted.json()["results"] == []
    assert_error(api.get(f"/api/v1/deployments/{proposal.deployment_id}/proposals/?status=maybe"), 400,
                 "unknown status 'maybe'")
    assert api.get("/api/v1/deployments/9999/proposals/").status_code == 404
    assert shown["forecast"] == {}  # a fleet change forecasts no load


def test_a_demand_proposal_carries_its_forecast_for_the_dashboard(api, deployment):
    """What the Deployments page draws (forecast.js): the load, the capacity, each latency at the
    percentile with its target, and the verdict, as the policy stored them."""
    cache.clear()  # the load samples are the cache's: none left from another test, none left behind
    try:
        stored = demand_proposal_create(deployment.pk)
    finally:
        cache.clear()
    [shown] = api.get(f"/api/v1/deployments/{deployment.pk}/proposals/?status=open").json()["results"]
    assert shown["trigger"] == "demand" and shown["forecast"] == stored
    assert set(stored) == {"replicas", "capacity_tokens_per_s", "forecast_output_tokens_per_s",
                           "forecast_requests_per_s", "horizon_s", "ttft_target_ms", "tpot_target_ms",
                           "utilisation", "percentile", "ttft_ms", "tpot_ms", "meets"}
    assert (stored["ttft_target_ms"], stored["percentile"]) == (400, 95)


@pytest.fixture
def operator(user):
    """A user the deployments API lets apply plans (staff are operators whatever the policy)."""
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    return user


def test_a_plain_user_decides_exactly_when_they_may_apply(api, user, proposal):
    """Whatever the deployments API allows a plain account, deciding a proposal follows: refused
    (403) where an apply is refused, else answered."""
    apply = api.post(f"/api/v1/deployments/{proposal.deployment_id}/apply/", {}, format="json")
    assert apply.status_code in (400, 403)  # an empty body: refused by permission or validation
    for verb in ("dismiss", "accept"):
        response = api.post(f"/api/v1/rebalance-proposals/{proposal.pk}/{verb}/")
        assert (response.status_code == 403) == (apply.status_code == 403), response.content


def test_an_operator_accepts_and_the_apply_is_audited(api, operator, proposal):
    user = operator
    response = api.post(f"/api/v1/rebalance-proposals/{proposal.pk}/accept/")
    assert response.status_code == 200, response.content
    assert (response.json()["status"], response.json()["decided_by"]) == ("accepted", "alice")
    deployment = Deployment.objects.get(pk=proposal.deployment_id)
    assert deployment.revision_id == proposal.revision_id and deployment.status == Deployment.Status.DEPLOYING
    assert PlanRevision.objects.get(pk=proposal.revision_id).status == PlanRevision.Status.APPLIED
    entry = AuditEntry.objects.get(action="plan.rebalanced")
    assert (entry.actor, entry.via, entry.detail["revision"]) == (user, "token", proposal.revision_id)
    assert_error(api.post(f"/api/v1/rebalance-proposals/{proposal.pk}/accept/"), 400, "is accepted, not open")


def test_dismiss_closes_it_audited_and_changes_no_plan(api, operator, proposal):
    user = operator
    before = Deployment.objects.get(pk=proposal.deployment_id).revision_id
    response = api.post(f"/api/v1/rebalance-proposals/{proposal.pk}/dismiss/")
    assert response.status_code == 200 and response.json()["status"] == "dismissed"
    assert Deployment.objects.get(pk=proposal.deployment_id).revision_id == before
    entry = AuditEntry.objects.get(action="rebalance_proposal.dismissed")
    assert (entry.actor, entry.detail["proposal"]) == (user, proposal.pk)
    assert_error(api.post(f"/api/v1/rebalance-proposals/{proposal.pk}/accept/"), 400,
                 "is dismissed, not open")
    assert api.post("/api/v1/rebalance-proposals/9999/dismiss/").status_code == 404


def test_a_dismissed_plan_is_not_proposed_again(api, operator, proposal, t0, settings):
    api.post(f"/api/v1/rebalance-proposals/{proposal.pk}/dismiss/")
    later = t0 + 10 + settings.MOTLEY_REBALANCE_CHECK_S
    assert rebalance_evaluate(deployment_id=proposal.deployment_id, now=later) == "held"  # the periodic check
    assert RebalanceProposal.objects.filter(deployment_id=proposal.deployment_id).count() == 1
    event = DeploymentEvent.objects.filter(kind="policy").first()
    assert event.detail["trigger"] == "better_plan"
    assert f"proposal {proposal.pk} of this plan was dismissed" in event.message


def test_a_refused_apply_changes_nothing(api, operator, proposal):
    from controlplane.inventory.models import Node

    Node.objects.filter(name="node-a").update(intent=Node.Intent.CORDONED)  # the proposal's devices
    assert_error(api.post(f"/api/v1/rebalance-proposals/{proposal.pk}/accept/"), 400,
                 "node node-a is cordoned")
    assert RebalanceProposal.objects.get(pk=proposal.pk).status == RebalanceProposal.Status.OPEN
    assert not AuditEntry.objects.filter(action="plan.rebalanced").exists()


def test_the_policy_is_a_deployment_setting(api, operator, deployment):
    url = f"/api/v1/deployments/{deployment.pk}/"
    assert api.get(url).json()["rebalance_policy"] == "propose"
    response = api.patch(url, {"rebalance_policy": "auto"}, format="json")
    assert response.status_code == 200 and response.json()["rebalance_policy"] == "auto"
    entry = AuditEntry.objects.get(action="deployment.updated")
    assert entry.detail == {"rebalance_policy": ["propose", "auto"]}
    response = api.patch(url, {"rebalance_policy": "sometimes"}, format="json")
    assert response.status_code == 400 and "sometimes" in response.content.decode()
    assert Deployment.objects.get(pk=deployment.pk).rebalance_policy == "auto"
