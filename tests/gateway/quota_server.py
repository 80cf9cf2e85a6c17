"""Settings of the gateway processes that tests/gateway/test_quota_processes.py starts: the installation's
own settings, serving model "demo" on a stand-in replica (tests/gateway/fakes.py) with a short quota
window, so limits and their recovery are seen in seconds."""

import os

from controlplane.settings import *  # noqa: F403

MOTLEY_GATEWAY = {
    "CLIENT": "tests.gateway.fakes.FakePipelineClient",
    "SERVED_MODELS": "tests.gateway.quota_server.served_models",
    "QUOTA_WINDOW_S": float(os.environ.get("MOTLEY_TEST_QUOTA_WINDOW_S", "3")),
    "REFRESH_S": 0.5,
    "LIVE_TELEMETRY": False,
}


def served_models():
    from tests.gateway.fakes import FakePipelineClient, Script, served_models

    if not FakePipelineClient.scripts:  # three tokens per request, whatever max_tokens allows beyond
        FakePipelineClient.reset(os.environ["MOTLEY_TEST_DEMO_MODEL"], {"r0": Script(tokens=[5, 6, 7])})
    return served_models()
