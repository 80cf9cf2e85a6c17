"""Fixtures of the dashboard tests: an imported emulated fleet, a user and a logged-in client."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from contracts.fleet_file import load_fleet_file
from controlplane.common.permissions import OPERATORS_GROUP
from controlplane.inventory.services import fleet_import
from tests.dashboard.seed import LAB_FLEET, LLAMA3_8B, running_deployment_create


@pytest.fixture
def lab_fleet(db):
    """The three-node lab (examples/fleets/lab-3node.yaml), declared and so emulated."""
    return fleet_import(fleet=load_fleet_file(LAB_FLEET))


@pytest.fixture
def operator(django_user_model):
    user = django_user_model.objects.create_user(username="operator", password="correct horse battery")
    user.groups.add(Group.objects.get_or_create(name=OPERATORS_GROUP)[0])
    return user


@pytest.fixture
def operator_client(client, operator):
    client.force_login(operator)
    return client


@pytest.fixture
def llama3_8b(db):
    from controlplane.models_catalog.services import model_register

    return model_register(path=LLAMA3_8B)


@pytest.fixture
def running_deployment(lab_fleet, llama3_8b):
    """A READY deployment of the planner's plan for the lab (rows as the controller leaves them)."""
    return running_deployment_create(model=llama3_8b)
