"""The policy's damping: a brief drift or a small gain changes nothing, nothing changes twice within
the cooldown or while a change is in flight; ``auto`` applies and records why, ``off`` never acts."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.audit.models import AuditEntry
from controlplane.deployments.models import Deployment, DeploymentPipeline, DeploymentStage, PlanRevision
from controlplane.rebalance.models import RebalanceProposal, RebalanceState
from controlplane.rebalance.selectors import deployment_ids_to_evaluate
from controlplane.rebalance.services import rebalance_evaluate
from tests.rebalance.helpers import policy_events, proposals, slow_stage_reported, uncordon

pytestmark = pytest.mark.django_db


def evaluate(deployment, now: float):
    return rebalance_evaluate(deployment_id=deployment.pk, now=now)


def test_a_brief_drift_produces_nothing(deployment, t0, settings):
    settings.MOTLEY_CALIBRATION_MIN_SAMPLES = 3
    settings.MOTLEY_REBALANCE_MIN_GAIN = 0.1  # what a sustained drift would propose (test_triggers)
    for at in (t0, t0 + 20, t0 + 40, t0 + 59):
        slow_stage_reported(deployment, at=at)
        assert evaluate(deployment, at) is None
    slow_stage_reported(deployment, at=t0 + 62, ratio=1.0)  # back as predicted before DRIFT_FOR_S
    assert evaluate(deployment, t0 + 62) is None
    slow_stage_reported(deployment, at=t0 + 100)  # a new drift starts the clock again
    assert evaluate(deployment, t0 + 100) is None
    assert RebalanceState.objects.get(deployment=deployment).drift_since == pytest.approx(t0 + 100)
    assert not proposals(deployment) and not policy_events(deployment)


def test_a_gain_under_the_threshold_is_recorded_once_and_changes_nothing(deployment, t0, settings):
    settings.MOTLEY_CALIBRATION_MIN_SAMPLES = 3  # the drift gains ~12 %, under the default 15 %
    for at in (t0, t0 + 30, t0 + 61, t0 + 80):
        slow_stage_reported(deployment, at=at)
        assert evaluate(deployment, at) in (None, "held")
    assert not proposals(deployment)
    [event] = policy_events(deployment)
    assert event.detail["outcome"] == "held" and 0 < event.detail["gain"] < 0.15
    assert "under the 15% threshold" in event.message
    assert Deployment.objects.get(pk=deployment.pk).revision == deployment.revision


def test_no_second_change_within_the_cooldown(deployment, t0, settings):
    PlanRevision.objects.filter(pk=deployment.revision_id).update(
        applied_at=timezone.now() - timedelta(seconds=60))
    deployment.refresh_from_db()
    evaluate(deployment, t0)
    uncordon("node-a")
    assert evaluate(deployment, t0 + 10) == "held"
    assert evaluate(deployment, t0 + 20) == "held"  # still waiting: not recorded again
    [event] = policy_events(deployment)
    assert "cooldown 300 s" in event.message and not proposals(deployment)
    assert evaluate(deployment, t0 + settings.MOTLEY_REBALANCE_COOLDOWN_S) == "proposed"
    assert [e.detail["outcome"] for e in policy_events(deployment)] == ["held", "proposed"]


@pytest.mark.parametrize("in_flight", ["deploying", "handover", "stage_stopping"])
def test_nothing_while_a_change_is_in_flight(deployment, t0, in_flight):
    evaluate(deployment, t0)
    uncordon("node-a")
    if in_flight == "deploying":
        Deployment.objects.filter(pk=deployment.pk).update(status=Deployment.Status.DEPLOYING)
        assert deployment.pk not in deployment_ids_to_evaluate()
    elif in_flight == "handover":  # READY, a replica's old pipeline still finishing its requests
        deployment.pipelines.filter(index=0).update(phase=DeploymentPipeline.Phase.OUTGOING)
    else:  # a stage of the previous plan not yet confirmed stopped
        stage = deployment.stages.first()
        DeploymentStage.objects.create(
            deployment=deployment, pipeline=stage.pipeline, stage_index=stage.stage_index, wanted=False,
            node=stage.node, device=stage.device, port=stage.port + 1000, spec=stage.spec)
    assert evaluate(deployment, t0 + 10) is None
    assert not proposals(deployment) and not policy_events(deployment)


def test_auto_applies_at_once_and_records_why(deployment, t0):
    Deployment.objects.filter(pk=deployment.pk).update(rebalance_policy=Deployment.RebalancePolicy.AUTO)
    evaluate(deployment, t0)
    uncordon("node-a")
    assert evaluate(deployment, t0 + 10) == "applied"
    deployment.refresh_from_db()
    [proposal] = proposals(deployment)
    assert deployment.revision == proposal.revision
    assert deployment.revision.source == PlanRevision.Source.REBALANCE
    assert deployment.status == Deployment.Status.DEPLOYING
    assert (proposal.status, proposal.decided_by) == (RebalanceProposal.Status.ACCEPTED, None)
    [event] = policy_events(deployment)
    assert event.detail["outcome"] == "applied" and "node-a/gpu0" in event.message
    assert f"applied as revision {deployment.revision.number}" in event.message
    entry = AuditEntry.objects.get(action="plan.rebalanced")
    assert (entry.actor_label, entry.via) == ("rebalance policy", "system")
    assert entry.detail["revision"] == proposal.revision_id
    # One change in flight at most: the deployment is deploying the new plan, nothing more happens.
    assert evaluate(deployment, t0 + 20) is None and len(proposals(deployment)) == 1


def test_off_never_acts(deployment, t0, settings):
    Deployment.objects.filter(pk=deployment.pk).update(rebalance_policy=Deployment.RebalancePolicy.OFF)
    assert deployment.pk not in deployment_ids_to_evaluate()
    uncordon("node-a")
    for now in (t0, t0 + 10, t0 + settings.MOTLEY_REBALANCE_CHECK_S + 10):
        assert evaluate(deployment, now) is None
    assert not RebalanceState.objects.exists() and not proposals(deployment) and not policy_events(deployment)


def test_another_applied_revision_expires_the_open_proposal(deployment, t0):
    evaluate(deployment, t0)
    uncordon("node-a")
    evaluate(deployment, t0 + 10)
    [proposal] = proposals(deployment)
    newer = PlanRevision.objects.create(model=deployment.model, deployment=deployment, number=2,
                                        plan=deployment.revision.plan, request=deployment.revision.request,
                                        source=PlanRevision.Source.EDITED, status=PlanRevision.Status.APPLIED,
                                        applied_at=timezone.now() - timedelta(hours=1))
    Deployment.objects.filter(pk=deployment.pk).update(revision=newer)
    evaluate(deployment, t0 + 20)
    proposal.refresh_from_db()
    assert proposal.status == RebalanceProposal.Status.EXPIRED


def test_a_revision_applied_while_the_plans_are_priced_wins(deployment, t0, monkeypatch, settings):
    """The plans are priced outside the deployment's row lock, so an operator may apply meanwhile:
    the policy then decides nothing on its stale pricing (the next pass looks at the new plan)."""
    from controlplane.rebalance import services

    evaluate(deployment, t0)
    uncordon("node-a")
    priced = services.price

    def price_while_an_operator_applies(**kwargs):
        found = priced(**kwargs)
        newer = PlanRevision.objects.create(
            model=deployment.model, deployment=deployment, number=2, plan=deployment.revision.plan,
            request=deployment.revision.request, source=PlanRevision.Source.EDITED,
            status=PlanRevision.Status.APPLIED, applied_at=timezone.now() - timedelta(hours=1))
        Deployment.objects.filter(pk=deployment.pk).update(revision=newer)
        return found

    monkeypatch.setattr(services, "price", price_while_an_operator_applies)
    assert evaluate(deployment, t0 + 10) is None
    assert not proposals(deployment) and not policy_events(deployment)
    monkeypatch.setattr(services, "price", priced)
    assert evaluate(deployment, t0 + 20) is None  # the new revision's baseline: node-a is in it
    assert evaluate(deployment, t0 + 20 + settings.MOTLEY_REBALANCE_CHECK_S) == "proposed"
    assert [p.trigger for p in proposals(deployment)] == ["better_plan"]


def test_the_beat_runs_the_policy_on_every_watched_deployment(deployment, t0, settings):
    from contracts.tasks import REBALANCE_EVALUATE
    from controlplane.celery import app

    assert settings.CELERY_BEAT_SCHEDULE["rebalance"]["task"] == REBALANCE_EVALUATE
    app.loader.import_default_modules()
    app.tasks[REBALANCE_EVALUATE]()  # the first pass takes the baseline
    uncordon("node-a")
    app.tasks[REBALANCE_EVALUATE]()
    assert [p.trigger for p in proposals(deployment)] == ["fleet"]
