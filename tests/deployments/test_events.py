"""Events: recorded once per transition of the controller, kept within retention."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.deployments.events import event_record
from controlplane.deployments.models import DeploymentEvent
from controlplane.deployments.services import deployment_create

pytestmark = pytest.mark.django_db(transaction=True)  # sends happen on commit, as in production
Kind = DeploymentEvent.Kind


def test_event_record_keeps_names_and_detail(nodes, revision):
    deployment = deployment_create(name="tiny", revision=revision)
    event = event_record(kind=Kind.THROTTLED, message="n1/gpu0 throttled: power cap", device="n1/gpu0",
                         deployment=deployment, detail={"reasons": ["sw_power_cap"], "sm_clock_mhz": 900})
    stored = DeploymentEvent.objects.get(pk=event.pk)
    assert (stored.kind, stored.node, stored.device, stored.deployment_id) == (
        "throttled", "n1", "n1/gpu0", deployment.pk)
    assert stored.detail == {"reasons": ["sw_power_cap"], "sm_clock_mhz": 900}
    assert event_record(kind=Kind.NODE_LOST, message="n2 lost", node=nodes[2]).node == "n2"
    with pytest.raises(ValueError, match="unknown event kind"):
        event_record(kind="exploded", message="?")


def test_retention_keeps_the_newest_per_deployment_and_drops_the_old(nodes, revision, settings):
    settings.MOTLEY_EVENTS_KEEP = 3
    settings.MOTLEY_EVENTS_RETENTION_DAYS = 1
    deployment = deployment_create(name="tiny", revision=revision)
    fleet = event_record(kind=Kind.NODE_SUSPECT, message="fleet-wide, kept apart")
    DeploymentEvent.objects.filter(pk=fleet.pk).update(at=timezone.now() - timedelta(hours=2))
    old = event_record(kind=Kind.POLICY, message="too old", deployment=deployment)
    DeploymentEvent.objects.filter(pk=old.pk).update(at=timezone.now() - timedelta(days=2))
    for i in range(5):
        event_record(kind=Kind.CALIBRATED, message=f"calibration {i}", deployment=deployment)
    kept = DeploymentEvent.objects.filter(deployment=deployment)
    assert [e.message for e in kept] == ["calibration 4", "calibration 3", "calibration 2"]
    assert DeploymentEvent.objects.filter(pk=fleet.pk).exists()  # another scope's count
    assert not DeploymentEvent.objects.filter(pk=old.pk).exists()
