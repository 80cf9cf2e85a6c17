"""A live gateway on real pipelines, for end-to-end tests and benchmarks: daphne serving
``controlplane.asgi`` on a fresh embedded install whose gateway serves models from a models file
(``MOTLEY_GATEWAY_MODELS_FILE``) on pipelines the caller started, with an API key of its own.

``live_system`` is the gateway tests' shared system (tests/gateway/conftest.py's ``live``): the demo
model on a two-stage pipeline, both tracing to a receiver of their own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.gateway.conftest import DEMO_ARGS
from tests.pipeline.harness import Pipeline, pipeline_specs
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.processes import (
    REPO_ROOT,
    database_migrate,
    embedded_env,
    free_port,
    manage_argv,
    stop_process,
    wait_for_http,
)

NUM_LAYERS = int(DEMO_ARGS[DEMO_ARGS.index("--layers") + 1])
KV_TOKENS = 1024
# Paces each stage's step to a few milliseconds, so a request lasts long enough to be disconnected.
PACING = {"memory_bandwidth_gbs": 0.03, "fp16_tflops": 1.0, "time_scale": 1.0}
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


@contextmanager
def live_system(demo_model: Path, workdir: Path) -> Iterator[dict]:
    """The demo model on a two-stage pipeline served as model "demo" (``base_url``, ``key``,
    ``pipeline``, ``traces``: their spans' receiver); all stopped at the end."""
    specs = pipeline_specs(demo_model, NUM_LAYERS, 2, kv_tokens=KV_TOKENS, emulation=PACING)
    receiver = OtlpReceiver().__enter__()
    pipeline = Pipeline(specs, workdir, env=receiver.env())  # loads while the database is prepared
    try:
        env, key = gateway_install(workdir, {"demo": (demo_model, pipeline)}, receiver.env())
        pipeline.wait_ready()
        with daphne_serving(env) as base_url:
            yield {"base_url": base_url, "key": key, "pipeline": pipeline, "traces": receiver}
    finally:
        pipeline.stop()
        pipeline.assert_none_left()
        receiver.__exit__()
