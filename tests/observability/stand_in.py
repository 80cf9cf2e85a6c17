"""The gateway of a real server process served by stand-in replicas (tests/gateway/fakes.py): for the
metrics tests that start daphne processes. ``MOTLEY_TEST_DEMO_MODEL`` names the demo checkpoint
(its tokenizer); two replicas, each answering every request with the same few tokens: eight, one
every 5 ms, unless ``MOTLEY_TEST_STAND_IN`` says ``<tokens>,<seconds per token>`` (long streams for
tests/gateway/test_web_failover.py)."""

from __future__ import annotations

import os

from controlplane.gateway.serving.directory import ServedModel
from tests.gateway.fakes import FakePipelineClient, Script
from tests.gateway.fakes import served_models as fake_served_models

_count, _delay = os.environ.get("MOTLEY_TEST_STAND_IN", "8,0.005").split(",")
TOKENS = [300 + i for i in range(int(_count))]
FakePipelineClient.reset(os.environ["MOTLEY_TEST_DEMO_MODEL"], {
    replica: Script(tokens=TOKENS, delay_s=float(_delay)) for replica in ("d1-r0", "d1-r1")
})


def served_models() -> list[ServedModel]:
    return fake_served_models()
