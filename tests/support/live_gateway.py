"""A live gateway for end-to-end tests and benchmarks: daphne serving ``controlplane.asgi`` on a fresh
embedded install whose gateway serves models from a models file (``MOTLEY_GATEWAY_MODELS_FILE``), with
a user who holds an API key and a REST API token. ``live_gateway`` starts one pipeline with it, the
stages sending their spans to the server as an agent's would."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from contracts.stage_spec import StageSpec
from contracts.tracing import TRACE_SINK_ENV
from tests.pipeline.harness import Pipeline
from tests.support import processes


@dataclass(frozen=True)
class Install:
    env: dict[str, str]  # the server's environment
    key: str  # an API key for /v1
    api_token: str  # a REST API token (``Authorization: Token …``) of the same user


@dataclass(frozen=True)
class Server:
    root: str  # http://127.0.0.1:<port>
    pid: int

    @property
    def base_url(self) -> str:
        """The OpenAI API."""
        return f"{self.root}/v1"

    @property
    def api_url(self) -> str:
        return f"{self.root}/api/v1"


@dataclass(frozen=True)
class LiveGateway:
    server: Server
    install: Install
    pipeline: Pipeline


def gateway_install(workdir: Path, served: dict[str, tuple[Path, Pipeline]],
                    extra_env: dict[str, str] | None = None) -> Install:
    """An embedded install in ``workdir`` whose gateway serves each model name on its (tokenizer path,
    pipeline), migrated, and its user's keys. The pipelines may still be loading."""
    models_file = workdir / "models.json"
    models_file.write_text(json.dumps({"models": [{
        "name": name, "tokenizer_path": str(tokenizer),
        "replicas": [{"pipeline_id": pipeline.specs[0].pipeline_id, "head_address": pipeline.head,
                      "auth_token": pipeline.specs[0].auth_token}],
    } for name, (tokenizer, pipeline) in served.items()]}))
    env = {**processes.embedded_env(workdir), "MOTLEY_GATEWAY_MODELS_FILE": str(models_file),
           **(extra_env or {})}
    processes.database_migrate(env)
    api_token, key = processes.create_keys(env)
    return Install(env, key, api_token)


@contextmanager
def daphne_serving(env: dict[str, str], port: int | None = None) -> Iterator[Server]:
    """daphne serving the control plane of ``env`` on ``port`` (default: a free loopback port), once it
    answers; stopped at the end."""
    port = port or processes.free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "controlplane.asgi:application"],
        env=env, cwd=processes.REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        processes.wait_for_http(f"http://127.0.0.1:{port}/v1/models")
        yield Server(f"http://127.0.0.1:{port}", server.pid)
    finally:
        processes.stop_process(server)


@contextmanager
def live_gateway(specs: list[StageSpec], tokenizer_path: Path, work: Path,
                 env: dict[str, str], also: dict[str, Path] | None = None) -> Iterator[LiveGateway]:
    """The stages of ``specs`` served as model "demo" by a server of their own, both with ``env`` (the
    ``OTEL_*`` variables of a traced one; the stages send their spans to the server's trace store);
    the stages load while the database is prepared. All stopped after the block. ``also``: more model
    names served by the same stages, each with its own tokenizer directory (another chat template)."""
    port = processes.free_port()
    pipeline = Pipeline(specs, work, env={**env, TRACE_SINK_ENV: f"http://127.0.0.1:{port}"})
    try:
        served = {"demo": tokenizer_path, **(also or {})}
        install = gateway_install(work, {name: (path, pipeline) for name, path in served.items()}, env)
        pipeline.wait_ready()
        with daphne_serving(install.env, port) as server:
            yield LiveGateway(server, install, pipeline)
    finally:
        pipeline.stop()
        pipeline.assert_none_left()
