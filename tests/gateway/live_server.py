"""The gateway tests' live system (tests/gateway/conftest.py's ``live``): the demo model on a two-stage
pipeline behind a live gateway (tests/support/live_gateway.py), both tracing to a receiver of their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.gateway.conftest import DEMO_ARGS
from tests.pipeline.harness import Pipeline, pipeline_specs
from tests.support.live_gateway import daphne_serving, gateway_install
from tests.support.otlp_receiver import OtlpReceiver

NUM_LAYERS = int(DEMO_ARGS[DEMO_ARGS.index("--layers") + 1])
KV_TOKENS = 1024
# Paces each stage's step to a few milliseconds, so a request lasts long enough to be disconnected.
PACING = {"memory_bandwidth_gbs": 0.03, "fp16_tflops": 1.0, "time_scale": 1.0}


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
