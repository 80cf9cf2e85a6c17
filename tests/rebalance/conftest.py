"""Fixtures of the rebalance policy's tests: the lab fleet registered by its agents, a READY
deployment of a model with weights whose plan was made while node-a was cordoned, applied long
enough ago that no cooldown holds, and a clock the tests move by hand (``now``)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from contracts.fleet_file import load_fleet_file
from controlplane.deployments.models import PlanRevision
from controlplane.inventory.models import Node
from controlplane.inventory.services import fleet_import
from controlplane.models_catalog.services import model_register
from tests.api.mixins import anonymous, api, user  # noqa: F401  (shared fixtures)
from tests.dashboard.seed import LAB_FLEET, REQUEST, _checkpoint_stand_in, running_deployment_create


@pytest.fixture
def policy_settings(settings):
    settings.MOTLEY_REBALANCE_DRIFT = 0.25
    settings.MOTLEY_REBALANCE_DRIFT_FOR_S = 60.0
    settings.MOTLEY_REBALANCE_MIN_GAIN = 0.15
    settings.MOTLEY_REBALANCE_COOLDOWN_S = 300.0
    settings.MOTLEY_REBALANCE_CHECK_S = 300.0
    settings.MOTLEY_CALIBRATION_MIN_DECODE_STEPS = 3
    settings.MOTLEY_TELEMETRY_STALE_AFTER_S = 3.0
    return settings


@pytest.fixture
def t0() -> float:
    """The tests' "now" at the start; later passes are given t0 + seconds."""
    return time.time()


@pytest.fixture
def deployment(db, policy_settings, t0):
    """READY on node-b and node-c (node-a cordoned when it was planned, schedulable again since the
    policy's first pass: see ``uncordon_a``); applied an hour ago."""
    fleet_import(fleet=load_fleet_file(LAB_FLEET))
    Node.objects.update(incarnation=1)  # as if each node's agent registered
    Node.objects.filter(name="node-a").update(intent=Node.Intent.CORDONED)
    deployment = running_deployment_create(model=model_register(path=_checkpoint_stand_in()))
    for stage in deployment.stages.all():  # the footprint fields a controller-written spec carries
        stage.spec = {**stage.spec, "batch": REQUEST["batch"],
                      "kv_tokens": REQUEST["batch"] * REQUEST["context"]}
        stage.save(update_fields=["spec"])
    PlanRevision.objects.filter(pk=deployment.revision_id).update(
        applied_at=timezone.now() - timedelta(hours=1))
    deployment.refresh_from_db()
    return deployment
