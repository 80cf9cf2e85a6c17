"""A daphne server serving one pipeline of stage processes as model "demo" (a models file), on an
embedded install of its own: what the live gateway tests and benchmarks/tracing_bench.py run."""

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
from tests.pipeline.harness import TOKEN, Pipeline
from tests.support import processes


@dataclass(frozen=True)
class LiveGateway:
    base_url: str  # the OpenAI API: http://127.0.0.1:<port>/v1
    api_url: str  # the REST API: http://127.0.0.1:<port>/api/v1
    key: str  # an API key for base_url
    api_token: str  # a REST API token (``Authorization: Token …``) of the same user
    pipeline: Pipeline
    server_pid: int


@contextmanager
def live_gateway(specs: list[StageSpec], tokenizer_path: Path, work: Path,
                 env: dict[str, str]) -> Iterator[LiveGateway]:
    """The stages of ``specs`` (pipeline "p0", the harness's token) and a server for them, both with
    ``env`` (the ``OTEL_*`` variables of a traced one; the stages send their spans to the server, as an
    agent's would); the stages load while the database is prepared. All stopped after the block."""
    port = processes.free_port()
    pipeline = Pipeline(specs, work, env={**env, TRACE_SINK_ENV: f"http://127.0.0.1:{port}"})
    server = None
    try:
        replica = {"pipeline_id": "p0", "head_address": pipeline.head, "auth_token": TOKEN}
        models_file = work / "models.json"
        models_file.write_text(json.dumps({"models": [
            {"name": "demo", "tokenizer_path": str(tokenizer_path), "replicas": [replica]}]}))
        server_env = {**processes.embedded_env(work), "MOTLEY_GATEWAY_MODELS_FILE": str(models_file), **env}
        processes.database_migrate(server_env)
        keys = subprocess.run(processes.manage_argv("shell", "-c", processes.CREATE_KEYS), env=server_env,
                              cwd=processes.REPO_ROOT, check=True, capture_output=True, text=True).stdout
        api_token, key = keys.split()[-2:]
        pipeline.wait_ready()
        server = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                                   "controlplane.asgi:application"], env=server_env, cwd=processes.REPO_ROOT,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        processes.wait_for_http(f"http://127.0.0.1:{port}/v1/models")
        yield LiveGateway(f"http://127.0.0.1:{port}/v1", f"http://127.0.0.1:{port}/api/v1", key, api_token,
                          pipeline, server.pid)
    finally:
        if server is not None:
            processes.stop_process(server)
        pipeline.stop()
        pipeline.assert_none_left()
