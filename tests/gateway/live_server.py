"""The gateway tests' live system (tests/gateway/conftest.py's ``live``): the demo model on a two-stage
pipeline behind a live gateway (tests/support/live_gateway.py), both tracing to a receiver of their own
and to the server's trace store.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.gateway.conftest import DEMO_ARGS
from tests.pipeline.harness import pipeline_specs
from tests.support.live_gateway import live_gateway
from tests.support.otlp_receiver import OtlpReceiver

NUM_LAYERS = int(DEMO_ARGS[DEMO_ARGS.index("--layers") + 1])
KV_TOKENS = 1024
# Paces each stage's step to a few milliseconds, so a request lasts long enough to be disconnected.
PACING = {"memory_bandwidth_gbs": 0.03, "fp16_tflops": 1.0, "time_scale": 1.0}


@contextmanager
def live_system(demo_model: Path, workdir: Path, also: dict[str, Path] | None = None) -> Iterator[dict]:
    """The demo model on a two-stage pipeline served as model "demo" (``base_url``, ``key``,
    ``pipeline``, ``traces``: a receiver of their spans, ``api``: the REST API's URL and a token),
    tracing to the receiver and to the server's trace store; all stopped at the end. ``also``: more
    model names the pipeline serves, each with its own tokenizer directory."""
    specs = pipeline_specs(demo_model, NUM_LAYERS, 2, kv_tokens=KV_TOKENS, emulation=PACING)
    with OtlpReceiver() as receiver, live_gateway(
            specs, demo_model, workdir, {**receiver.env(), "OTEL_TRACES_EXPORTER": "otlp,motley"},
            also) as system:
        yield {"base_url": system.server.base_url, "key": system.install.key, "pipeline": system.pipeline,
               "traces": receiver, "api": (system.server.api_url, system.install.api_token)}
