"""Speculative decoding with a draft model (docs/pipeline.md, "Draft model"): the draft model served as
a real one-stage pipeline process, shared by the tests of this module; the target pipeline in process
(in_process.py), its head a client of the draft pipeline as it is in production.

The draft is the target's checkpoint cut to its first ``DRAFT_LAYERS`` layers (same embeddings, norm
and lm_head, same tokenizer). The target is the tiny model with the output projections of its later
layers scaled down (``LATER_LAYERS_SCALE``), so that, as in a trained model, its first layers carry
much of its prediction and the cut model's guesses are often right (about half of its next tokens
along the target's greedy path; the tiny model as it is agrees with its own first two layers on 4%).
The target's step cost is
fixed as a latency-bound pipeline's (``latency_bound``), where the policy always asks for the ceiling.
Greedy output is the same with the draft drafter on and off at 16 and 4
bits, in process and in a target pipeline of stage processes (its step cost its own); a draft
pipeline killed mid-run costs proposals, never a request, and is used again once it is
back.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from controlplane.gateway.serving.pipeline_client import PipelineClient
from worker_runtime.draft_client import RETRY_S

from .conftest import NUM_LAYERS, launcher, make_tiny_llama
from .harness import TOKEN, Pipeline, pipeline_specs, wait_healthy
from .in_process import InProcessPipeline
from .test_speculation import PROMPTS, jobs

DRAFT_LAYERS = 2
LATER_LAYERS_SCALE = 0.2


def rewritten(model: Path, out: Path, num_layers: int, scale: float = 1.0) -> Path:
    """A copy of the checkpoint ``model`` with its first ``num_layers`` decoder layers, the output
    projections (attention's and the MLP's) of those from ``DRAFT_LAYERS`` on multiplied by ``scale``."""
    out.mkdir()
    config = json.loads((model / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "num_hidden_layers": num_layers}))
    kept = {}
    for name, tensor in load_file(model / "model.safetensors").items():
        layer = int(name.split(".")[2]) if name.startswith("model.layers.") else -1
        if layer < num_layers:
            damped = layer >= DRAFT_LAYERS and name.endswith(("o_proj.weight", "down_proj.weight"))
            kept[name] = tensor * scale if damped else tensor
    save_file(kept, out / "model.safetensors", metadata={"format": "pt"})
    return out



pytestmark = pytest.mark.usefixtures("latency_bound")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    """The target and its draft."""
    workdir = tmp_path_factory.mktemp("draft-models")
    tiny = make_tiny_llama(workdir / "tiny")
    target = rewritten(tiny, workdir / "target", NUM_LAYERS, LATER_LAYERS_SCALE)
    return target, rewritten(target, workdir / "draft", DRAFT_LAYERS)


@pytest.fixture(scope="module")
def draft(models, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("draft")
    specs = pipeline_specs(models[1], DRAFT_LAYERS, 1, pipeline_id="draft", kv_tokens=1024)
    pipeline = Pipeline(specs, workdir)
    try:
        wait_serving(pipeline)
        yield pipeline
    finally:
        pipeline.stop()
        pipeline.assert_clean()


def wait_serving(pipeline: Pipeline) -> None:
    """Until the draft pipeline's head says it serves (after its warm-up request)."""
    pipeline.wait_ready()
    while not pipeline.stages[0].wait_event("health")["ok"]:
        pass


@pytest.mark.parametrize("bits,num_stages", [(16, 2), (4, 1)])  # one stage: tokens return within a step
def test_greedy_output_is_the_same_with_the_draft_model(models, draft, bits, num_stages):
    link = {"address": draft.head, "pipeline_id": "draft", "auth_token": TOKEN}
    speculating = InProcessPipeline(models[0], NUM_LAYERS, num_stages, bits=bits, kv_tokens=512,
                                    speculation="draft", draft=link)
    plain = InProcessPipeline(models[0], NUM_LAYERS, num_stages, bits=bits, kv_tokens=512)
    try:
        assert speculating.run(jobs()) == plain.run(jobs())
        figures = speculating.head.stats()["stages"][0]  # the head's stats keep the spec_* figures
    finally:
        speculating.head.speculator.close()
    assert figures["spec_drafts"] > 0
    rate = figures["spec_accepted_tokens"] / figures["spec_draft_tokens"]
    print(f"draft model acceptance at {bits} bits: {rate:.2f} ({figures})")
    assert 0 < rate <= 1


def test_a_dead_draft_pipeline_costs_proposals_not_requests(models, draft):
    link = {"address": draft.head, "pipeline_id": "draft", "auth_token": TOKEN}
    speculating = InProcessPipeline(models[0], NUM_LAYERS, 2, kv_tokens=512, speculation="draft", draft=link)
    plain = InProcessPipeline(models[0], NUM_LAYERS, 2, kv_tokens=512)
    expected = plain.run(jobs())
    process = draft.stages[0].popen

    def kill_once_drafting(step: int) -> None:  # drafts verified, and more on the way
        if speculating.head.speculator.drafts >= 3 and process.poll() is None:
            process.kill()

    try:
        # killed mid-run: every request completes the same, no error
        assert speculating.run(jobs(), kill_once_drafting) == expected
        assert process.poll() is not None
        before = speculating.head.own_stats()["spec_drafts"]
        assert 0 < before
        assert speculating.run(jobs()) == expected  # while it is gone: no proposals, same output
        assert speculating.head.own_stats()["spec_drafts"] == before
        draft.restart(0)
        wait_serving(draft)
        # back: proposals again once the link is up and its rest (RETRY_S) is over
        deadline = time.monotonic() + 3 * RETRY_S + 2
        while speculating.head.own_stats()["spec_drafts"] == before and time.monotonic() < deadline:
            assert speculating.run(jobs()) == expected
            time.sleep(0.2)
        assert speculating.head.own_stats()["spec_drafts"] > before
    finally:
        speculating.head.speculator.close()


async def test_stage_processes_speculate_with_the_draft_pipeline(models, draft, tmp_path):
    link = {"address": draft.head, "pipeline_id": "draft", "auth_token": TOKEN}
    expected = InProcessPipeline(models[0], NUM_LAYERS, 2, kv_tokens=512).run(jobs())
    with launcher(models[0], tmp_path) as start:
        target = start(2, speculation="draft", draft=link)
        async with PipelineClient(target.head, TOKEN, "p0") as client:
            assert (await wait_healthy(client))["ok"]

            async def tokens(prompt: list[int]) -> list[int]:
                return [event.token_id async for event in client.submit(prompt, max_tokens=24)]

            assert await asyncio.gather(*map(tokens, PROMPTS)) == expected
            figures = (await client.stats())["stages"][0]
    assert figures["spec_drafts"] > 0 and figures["spec_accepted_tokens"] > 0
