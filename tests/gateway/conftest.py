"""Fixtures of the gateway tests: the demo checkpoint (tokenizer + chat template), API keys, a
gateway wired to the stand-in pipeline client, and the live system the end-to-end tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.gateway.accounts.services import api_key_create
from tests.gateway.fakes import FakePipelineClient, Script
from tests.support.tool_templates import FAMILIES, write_tool_checkpoint
from worker_runtime.make_demo_model import parse_args, write_demo_model

DEMO_ARGS = ["--layers", "2", "--hidden", "64", "--intermediate", "128", "--heads", "4", "--kv-heads", "2",
             "--max-positions", "256"]


@pytest.fixture(scope="session")
def demo_model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("models") / "demo"
    write_demo_model(parse_args([str(out), *DEMO_ARGS]))
    return out


@pytest.fixture(scope="session")
def tool_models(demo_model, tmp_path_factory) -> dict[str, Path]:
    """The demo checkpoint with each tool template family's template and special tokens."""
    root = tmp_path_factory.mktemp("tool_models")
    return {family: write_tool_checkpoint(demo_model, root / family, family) for family in FAMILIES}


@pytest.fixture(scope="session")
def live(demo_model, tool_models, tmp_path_factory):
    """A daphne server whose gateway serves the demo model as "demo" on a real two-stage pipeline
    (tests/gateway/live_server.py), and the same pipeline as "tools" with Qwen 2.5's template (the tool
    checkpoint's tokenizer: the same vocabulary), shared by the tests of this process that use it."""
    from tests.gateway.live_server import live_system

    also = {"tools": tool_models["qwen2_5"]}
    with live_system(demo_model, tmp_path_factory.mktemp("live"), also) as system:
        yield system


@pytest.fixture
def api_key(django_user_model) -> str:
    user = django_user_model.objects.create_user("alice")  # no password: no slow hashing
    return api_key_create(user=user, name="test")[1]


@pytest.fixture
def fake_pipeline(settings, demo_model):
    """``fake_pipeline({"r0": Script(...), ...})`` serves model "demo" on those stand-in replicas (from the
    demo checkpoint, or the checkpoint ``model`` names)."""
    settings.MOTLEY_GATEWAY = {
        "CLIENT": "tests.gateway.fakes.FakePipelineClient",
        "SERVED_MODELS": "tests.gateway.fakes.served_models",
        "REFRESH_S": 0.05,
        "HEALTH_REFRESH_S": 0.05,
        "DEADLINE_S": 30.0,
        "WAIT_S": 0.2,  # a model without a routable replica: the 503 after a short wait
        "WAIT_POLL_S": 0.02,
    }

    def configure(scripts: dict[str, Script], model: Path | None = None) -> type[FakePipelineClient]:
        FakePipelineClient.reset(str(model or demo_model), scripts)
        return FakePipelineClient

    return configure


@pytest.fixture(autouse=True)
def _fresh_recorder():
    """The router's records are per process: each test starts with none (error rates count them)."""
    from controlplane.gateway.serving.decision_log import recorder

    recorder.__init__()


@pytest.fixture(autouse=True)
async def _close_gateway():
    """Each test runs on its own event loop, hence its own gateway: stop its poller and clients."""
    yield
    import asyncio

    from controlplane.gateway.serving.runtime import _gateways

    if (gateway := _gateways.get(asyncio.get_running_loop())) is not None:
        await gateway.close()
