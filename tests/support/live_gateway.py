"""A live gateway on pipelines the caller started, for end-to-end tests and benchmarks: daphne serving
``controlplane.asgi`` on a fresh embedded install whose gateway serves models from a models file
(``MOTLEY_GATEWAY_MODELS_FILE``), with an API key of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.pipeline.harness import Pipeline
from tests.support.processes import (
    REPO_ROOT,
    database_migrate,
    embedded_env,
    free_port,
    manage_argv,
    stop_process,
    wait_for_http,
)

CREATE_KEY = (
    "from django.contrib.auth.models import User; "
    "from controlplane.gateway.accounts.services import api_key_create;"
    "print(api_key_create(user=User.objects.create_user('alice'), name='live')[1])"
)


def gateway_install(workdir: Path, served: dict[str, tuple[Path, Pipeline]],
                    extra_env: dict[str, str] | None = None) -> tuple[dict[str, str], str]:
    """An embedded install in ``workdir`` whose gateway serves each model name on its (tokenizer path,
    pipeline), migrated, and an API key: (its environment, the key). The pipelines may still be loading."""
    models_file = workdir / "models.json"
    models_file.write_text(json.dumps({"models": [{
        "name": name, "tokenizer_path": str(tokenizer),
        "replicas": [{"pipeline_id": pipeline.specs[0].pipeline_id, "head_address": pipeline.head,
                      "auth_token": pipeline.specs[0].auth_token}],
    } for name, (tokenizer, pipeline) in served.items()]}))
    env = {**embedded_env(workdir), "MOTLEY_GATEWAY_MODELS_FILE": str(models_file), **(extra_env or {})}
    database_migrate(env)
    key = subprocess.run(manage_argv("shell", "-c", CREATE_KEY), env=env, cwd=REPO_ROOT, check=True,
                         capture_output=True, text=True).stdout.split()[-1]
    return env, key


@contextmanager
def daphne_serving(env: dict[str, str]) -> Iterator[str]:
    """daphne serving the control plane of ``env`` on a free loopback port: its ``/v1`` URL, once it
    answers; stopped at the end."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "controlplane.asgi:application"],
        env=env, cwd=REPO_ROOT, stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/v1/models")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        stop_process(server)
