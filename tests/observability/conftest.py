"""Fixtures of the metrics tests: the gateway's (a stand-in pipeline, an API key, the demo tokenizer),
the lab fleet with a READY deployment, and a scrape of ``/metrics`` read back with prometheus_client's
own parser."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from contracts.fleet_file import load_fleet_file
from tests.dashboard.seed import LAB_FLEET, LLAMA3_8B, running_deployment_create
from tests.gateway.conftest import (  # noqa: F401  (the gateway's fixtures, for these tests too)
    _close_gateway,
    _fresh_recorder,
    api_key,
    demo_model,
    fake_pipeline,
)


@pytest.fixture
def running_deployment(db):
    """The three-node lab (declared, so emulated) and a READY deployment of the planner's plan on it."""
    from controlplane.inventory.services import fleet_import
    from controlplane.models_catalog.services import model_register

    fleet_import(fleet=load_fleet_file(LAB_FLEET))
    return running_deployment_create(model=model_register(path=LLAMA3_8B))


class Scrape:
    """One ``/metrics`` answer, parsed: ``value(name, **labels)`` of one sample, ``names`` of all."""

    def __init__(self, text: str):
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples = [s for f in self.families.values() for s in f.samples]
        self.names = {s.name for s in self.samples}

    def find(self, name: str, **labels) -> list:
        return [s for s in self.samples
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]

    def value(self, name: str, default: float | None = None, **labels) -> float:
        found = self.find(name, **labels)
        if not found:
            if default is not None:
                return default
            raise AssertionError(f"no sample {name}{labels} in the scrape")
        assert len(found) == 1, f"{name}{labels} matches {len(found)} samples"
        return found[0].value


def parse(text: str) -> Scrape:
    return Scrape(text)
