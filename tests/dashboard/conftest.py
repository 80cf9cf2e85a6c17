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
