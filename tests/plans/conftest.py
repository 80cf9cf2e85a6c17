from pathlib import Path

import pytest

from contracts.fleet_file import load_fleet_file
from controlplane.inventory.services import fleet_import
from controlplane.models_catalog.services import model_register
from tests.api.mixins import anonymous, api, user  # noqa: F401  (shared fixtures)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def lab(db):
    fleet_import(fleet=load_fleet_file(EXAMPLES / "fleets" / "lab-3node.yaml"))


@pytest.fixture
def llama3_8b(db):
    return model_register(path=EXAMPLES / "models" / "Llama-3-8B" / "config.json")
