"""Migration with real stage processes: two single-stage pipelines of the demo model behind the
gateway; the one serving a stream is killed (SIGKILL) mid-stream, and the stream continues on the
other with exactly the text of an uninterrupted run, seeded (temperature > 0) and greedy, and held to a
JSON schema (the new replica's matcher replays the output so far)."""

from __future__ import annotations

import json
import time

import jsonschema
import pytest
from django.test import AsyncClient

from controlplane.gateway.serving.decision_log import recorder
from tests.gateway.live_server import NUM_LAYERS, PACING
from tests.gateway.test_views import auth
from tests.pipeline.harness import TOKEN, Pipeline, pipeline_specs

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
MAX_TOKENS = 120
WORDS = {"type": "object", "required": ["words"], "additionalProperties": False,
         "properties": {"words": {"type": "array", "minItems": 4, "maxItems": 6,
                                  "items": {"type": "string", "minLength": 3, "maxLength": 8}}}}


@pytest.fixture(scope="module")
def pipelines(demo_model, tmp_path_factory):
    """Replicas p0 and p1 (one stage each, same weights); the models file that serves them as "demo"."""
    workdir = tmp_path_factory.mktemp("migration")
    started = {pid: Pipeline(pipeline_specs(demo_model, NUM_LAYERS, 1, pid, kv_tokens=1024, emulation=PACING),
                             workdir / pid) for pid in ("p0", "p1") if (workdir / pid).mkdir() is None}
    try:
        for pipeline in started.values():
            pipeline.wait_ready()
        models_file = workdir / "models.json"
        models_file.write_text(json.dumps({"models": [{
            "name": "demo", "tokenizer_path": str(demo_model),
            "replicas": [{"pipeline_id": pid, "head_address": p.head, "auth_token": TOKEN}
                         for pid, p in started.items()],
        }]}))
        yield started, models_file
    finally:
        for pipeline in started.values():
            pipeline.stop()
        for pipeline in started.values():
            pipeline.assert_none_left()


@pytest.fixture
def gateway_on(settings, pipelines):
    started, models_file = pipelines
    settings.MOTLEY_GATEWAY = {"MODELS_FILE": str(models_file), "REFRESH_S": 0.2, "CLIENT_TIMEOUT_S": 1.0,
                               "WAIT_S": 20.0, "WAIT_POLL_S": 0.05, "DEADLINE_S": 60.0}
    yield started
    for pipeline in started.values():  # bring a killed replica back for the next test
        if pipeline.stages[0].popen.poll() is not None:
            pipeline.restart(0)
            pipeline.wait_ready()


async def stream_text(key: str, body: dict, *, kill_after_chunks: int | None = None, pipelines=None):
    """The streamed text, ids and usage; with ``kill_after_chunks``, the serving replica's stage is
    killed once that many chunks arrived."""
    response = await AsyncClient().post("/v1/completions", json.dumps({**body, "stream": True}),
                                        content_type="application/json", **auth(key))
    assert response.status_code == 200, response.content
    texts, ids, usage, chunks, killed = [], set(), None, 0, None
    async for raw in response.streaming_content:
        for line in raw.decode().split("\n\n"):
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            ids.add(event["id"])
            usage = event.get("usage") or usage
            texts.extend(c["text"] for c in event["choices"])
            chunks += 1
        if kill_after_chunks is not None and killed is None and chunks >= kill_after_chunks:
            (running,) = [r for r in recorder.recent if r.outcome == "running"]
            killed = running.replica
            pipelines[killed].stages[0].popen.kill()
    return "".join(texts), ids, usage, killed


@pytest.mark.parametrize("sampling", [{"temperature": 0.9, "seed": 7}, {"temperature": 0},
                                      {"temperature": 0.9, "seed": 7, "structured_outputs": {"json": WORDS}}],
                         ids=["seeded", "greedy", "constrained"])
async def test_a_killed_replica_mid_stream_continues_on_the_other_with_the_same_text(gateway_on, api_key,
                                                                                    sampling):
    body = {"model": "demo", "prompt": "Once upon a time", "max_tokens": MAX_TOKENS,
            "stream_options": {"include_usage": True}, **sampling}
    expected, _, expected_usage, _ = await stream_text(api_key, body)
    assert expected_usage["completion_tokens"] > 10, "too short a reference to kill mid-stream"
    started = time.monotonic()
    text, ids, usage, killed = await stream_text(api_key, body, kill_after_chunks=3, pipelines=gateway_on)
    assert killed is not None
    assert text == expected
    assert len(ids) == 1 and usage == expected_usage
    record = recorder.recent[-1]
    assert record.outcome == "completed" and record.migrations == 1
    assert record.replicas[0] == killed and record.replicas[1] != killed
    assert time.monotonic() - started < 15
    if "structured_outputs" in sampling:
        jsonschema.validate(json.loads(text), WORDS)
