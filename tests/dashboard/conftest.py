"""Fixtures of the dashboard tests: an imported emulated fleet, a user and a logged-in client."""

from __future__ import annotations

import pytest

from controlplane.hardware.fleet_file import load_fleet_file
from controlplane.inventory.services import fleet_import
from tests.support.processes import REPO_ROOT

LAB_FLEET = REPO_ROOT / "examples" / "fleets" / "lab-3node.yaml"


@pytest.fixture
def lab_fleet(db):
    """The three-node lab (examples/fleets/lab-3node.yaml), declared and so emulated."""
    return fleet_import(fleet=load_fleet_file(LAB_FLEET))


@pytest.fixture
def operator(django_user_model):
    return django_user_model.objects.create_user(username="operator", password="correct horse battery")


@pytest.fixture
def operator_client(client, operator):
    client.force_login(operator)
    return client


@pytest.fixture
def llama3_8b(db):
    from controlplane.models_catalog.services import model_register

    return model_register(path=REPO_ROOT / "examples" / "models" / "Llama-3-8B" / "config.json")


@pytest.fixture
def running_deployment(lab_fleet, llama3_8b):
    """A READY deployment of the planner's plan for the lab, as the controller would leave it.

    Rows are written directly: page tests need the observed state, not agents to produce it (the
    browser end-to-end test runs the real controller).
    """
    from django.utils import timezone

    from controlplane.deployments.models import Deployment, DeploymentStage, PlanRevision
    from controlplane.inventory.models import Device
    from controlplane.planning import plan, plan_to_dict
    from controlplane.plans.selectors import plan_request_from_inventory

    request = {"batch": 4, "context": 2048}
    planned = plan_to_dict(plan(plan_request_from_inventory(model=llama3_8b, **request)))
    deployment = Deployment.objects.create(name="chat", model=llama3_8b, status=Deployment.Status.READY)
    revision = PlanRevision.objects.create(
        model=llama3_8b, deployment=deployment, number=1, plan=planned, request=request,
        source=PlanRevision.Source.PLANNER, status=PlanRevision.Status.APPLIED, applied_at=timezone.now(),
    )
    deployment.revision = revision
    deployment.save()
    devices = {d.name: d for d in Device.objects.select_related("node")}
    for r, replica in enumerate(planned["replicas"]):
        for s, stage in enumerate(replica["stages"]):
            device = devices[stage["device"]]
            DeploymentStage.objects.create(
                deployment=deployment, replica=r, stage_index=s, node=device.node, device=device, port=5600 + s,
                spec={"layers": stage["layers"], "bits": stage["bits"]}, state=DeploymentStage.State.READY,
            )
    return deployment
