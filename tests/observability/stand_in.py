"""The gateway of a real server process served by stand-in replicas (tests/gateway/fakes.py): for the
metrics tests that start daphne processes. ``MOTLEY_TEST_DEMO_MODEL`` names the demo checkpoint
(its tokenizer); two replicas, each answering every request with the same few tokens."""

from __future__ import annotations

import os

from controlplane.gateway.serving.directory import ServedModel
from tests.gateway.fakes import FakePipelineClient, Script
from tests.gateway.fakes import served_models as fake_served_models

TOKENS = [300, 301, 302, 303, 304, 305, 306, 307]
FakePipelineClient.reset(os.environ["MOTLEY_TEST_DEMO_MODEL"], {
    "d1-r0": Script(tokens=TOKENS, delay_s=0.005), "d1-r1": Script(tokens=TOKENS, delay_s=0.005),
})


def served_models() -> list[ServedModel]:
    return fake_served_models()
