"""Placement is an operator's: a plain account reads and asks what-ifs, and is told why it cannot change."""

from __future__ import annotations

from importlib import import_module
from pathlib import Path

import pytest
from django.apps import apps as django_apps
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from contracts.fleet_file import load_fleet_file
from controlplane.common.permissions import OPERATORS_GROUP
from controlplane.deployments.models import PlanRevision
from controlplane.inventory.models import Node
from controlplane.inventory.services import fleet_import
from controlplane.models_catalog.services import model_register

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PLAN = {"batch": 2, "context": 1024, "replicas": 1}


@pytest.fixture
def lab(db):
    fleet_import(fleet=load_fleet_file(EXAMPLES / "fleets" / "lab-3node.yaml"))
    return model_register(path=EXAMPLES / "models" / "Llama-3-8B" / "config.json")


def _client(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_a_plain_user_previews_a_plan_but_cannot_store_it_or_cordon(lab, django_user_model):
    plain = _client(django_user_model.objects.create_user("plain"))
    assert plain.post("/api/v1/plans/", {"model": lab.pk, **PLAN}, format="json").status_code == 200
    refused = plain.post("/api/v1/plans/", {"model": lab.pk, **PLAN, "save": True}, format="json")
    assert refused.status_code == 403 and "'operators' group" in refused.json()["error"]["message"]
    node = Node.objects.first()
    assert plain.post(f"/api/v1/nodes/{node.pk}/cordon/").status_code == 403
    assert not PlanRevision.objects.exists()
    node.refresh_from_db()
    assert node.schedulable


def test_joining_the_operators_group_grants_placement(lab, django_user_model):
    user = django_user_model.objects.create_user("promoted")
    user.groups.add(Group.objects.get_or_create(name=OPERATORS_GROUP)[0])
    operator = _client(user)
    stored = operator.post("/api/v1/plans/", {"model": lab.pk, **PLAN, "save": True}, format="json")
    assert stored.status_code == 201
    node = Node.objects.first()
    assert operator.post(f"/api/v1/nodes/{node.pk}/cordon/").status_code == 200
    node.refresh_from_db()
    assert not node.schedulable


def test_the_migration_creates_the_operators_group(db):
    migration = import_module("controlplane.common.migrations.0001_operators_group")
    Group.objects.filter(name=OPERATORS_GROUP).delete()  # a flushing test before may have left none
    migration.create_group(django_apps, None)
    migration.create_group(django_apps, None)  # idempotent
    assert Group.objects.filter(name=OPERATORS_GROUP).count() == 1
