"""Tensor-parallel stages served (docs/pipeline.md, "Tensor-parallel stages"): real stage processes whose
specs carry a ``tensor_group``; each group's rank 0 starts its other ranks and is the stage its pipeline
sees.

Two stages, each split unevenly over two CPU ranks, serve concurrent requests, prefix-cache hits and
speculative verification with the tokens one process computes; a rank may hold its share at 8 bits; the
group reports every rank's bytes; a new spec that keeps what the group loaded is taken in place, one that
changes the group is refused; a rank that dies stops its stage with the reason; stopping the stage stops
its ranks.
"""

from __future__ import annotations

import asyncio
import random
import signal

import psutil
import pytest
import torch

from contracts.stage_spec import SpecError, StageSpec
from controlplane.gateway.serving.pipeline_client import PipelineClient
from worker_runtime.chain import generate
from worker_runtime.stage import Stage

from .conftest import NUM_LAYERS
from .harness import TOKEN, pipeline_specs, wait_healthy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # real stage processes
# The tiny llama: 2 kv heads, 128 MLP columns; rank 0 holds the larger share.
UNEVEN = [{"device": "cpu", "kv_heads": 1, "intermediate": 96},
          {"device": "cpu", "kv_heads": 1, "intermediate": 32}]


def grouped(*stages: int, rank_bits: int = 16) -> dict:
    """Spec overrides: ``stages`` as two-rank groups, the second rank at ``rank_bits``."""
    group = [UNEVEN[0], {**UNEVEN[1], "bits": rank_bits}]
    return {"per_stage": {i: {"tensor_group": group} for i in stages}}


async def collect(client: PipelineClient, prompt: list[int], max_tokens: int) -> list[int]:
    return [e.token_id async for e in client.submit(prompt, max_tokens=max_tokens)]


def children(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


async def test_two_grouped_stages_generate_the_tokens_of_one_process(start_pipeline, tiny_model):
    pipeline = start_pipeline(2, kv_tokens=512, speculation="lookup", **grouped(0, 1))
    assert all(len(children(pid)) == 1 for pid in pipeline.pids())  # one more process per card
    rng = random.Random(3)
    shared = [rng.randrange(1, 256) for _ in range(20)]  # a cached prefix the later requests reuse
    jobs = [(shared + [rng.randrange(1, 256) for _ in range(rng.randrange(1, 8))], rng.randrange(4, 16))
            for _ in range(8)] + [([5, 6, 7] * 8, 30)]
    async with PipelineClient(pipeline.head, TOKEN, "p0") as client:
        assert (await wait_healthy(client))["ok"]
        first = await collect(client, *jobs[0])
        outputs = [first, *await asyncio.gather(*(collect(client, p, n) for p, n in jobs[1:]))]
        stats = await client.stats()
    torch.set_num_threads(1)
    stage = Stage.load(tiny_model, 0, NUM_LAYERS, kv_tokens=1024)
    assert outputs == [generate([stage], [p], max_new_tokens=n)[0] for p, n in jobs]
    head = stats["stages"][0]
    assert head["prefix_hit_tokens"] > 0 and head["spec_accepted_tokens"] > 0
    assert stats["kv_tokens_free_by_stage"] == {"0": 512, "1": 512}


async def test_a_rank_at_8_bits_serves_reports_every_ranks_bytes_and_takes_a_relink_in_place(
        start_pipeline, tiny_model):
    """Then a new spec that keeps what the group loaded (a neighbour's timeout) is taken in place, ranks
    and all; one that changes the group is refused by the running process, naming what changed."""
    pipeline = start_pipeline(2, kv_tokens=256, **grouped(1, rank_bits=8))
    one_card = Stage.load(tiny_model, *pipeline.specs[1].layers, kv_tokens=256).memory()
    group_ready = pipeline.ready_events[1]
    assert group_ready["kv_bytes"] == one_card.kv_cache_bytes  # both ranks' heads, summed
    assert 0.5 * one_card.weight_bytes < group_ready["weight_bytes"] < one_card.weight_bytes  # rank 1 at int8
    async with PipelineClient(pipeline.head, TOKEN, "p0") as client:
        assert (await wait_healthy(client))["ok"]
        tokens = await collect(client, [9, 8, 7, 6], 12)
    assert len(tokens) == 12

    ranks = children(pipeline.pids()[1])
    pipeline.respec(1, StageSpec.from_dict({**pipeline.specs[1].to_json(), "peer_timeout_s": 3.0}))
    pipeline.stages[1].wait_event("ready")
    assert children(pipeline.pids()[1]) == ranks
    async with PipelineClient(pipeline.head, TOKEN, "p0") as client:
        assert (await wait_healthy(client))["ok"]
        assert await collect(client, [9, 8, 7, 6], 12) == tokens

    regrouped = grouped(1)["per_stage"][1]
    pipeline.respec(1, StageSpec.from_dict({**pipeline.specs[1].to_json(), **regrouped}))
    assert "tensor_group changed" in pipeline.stages[1].wait_event("error")["message"]
    assert await asyncio.to_thread(pipeline.stages[1].popen.wait, 10) == 1


def test_a_rank_that_dies_stops_its_stage_with_the_reason_and_stop_takes_the_ranks(start_pipeline):
    pipeline = start_pipeline(2, **grouped(0, 1))
    rank = children(pipeline.pids()[1])[0]
    rank.send_signal(signal.SIGKILL)
    stage = pipeline.stages[1]
    assert stage.popen.wait(timeout=30) == 1
    assert "tensor-parallel group broken (rank 1 exited with code -9)" in stage.stderr()
    ranks = children(pipeline.pids()[0])
    pipeline.stages[0].popen.send_signal(signal.SIGTERM)
    assert pipeline.stages[0].popen.wait(timeout=30) == 0
    psutil.wait_procs(ranks, timeout=10)
    assert not [r for r in ranks if r.is_running() and r.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize("bad,message", [
    ([UNEVEN[0]], "at least two ranks"),
    ([{**UNEVEN[0], "device": "cuda:0"}, UNEVEN[1]], "first rank is this process"),
    ([UNEVEN[0], {**UNEVEN[1], "kv_heads": 0}], "kv_heads and intermediate of at least 1"),
])
def test_a_bad_group_is_refused_naming_the_problem(tiny_model, bad, message):
    raw = pipeline_specs(tiny_model, NUM_LAYERS, 1)[0].to_json()
    with pytest.raises(SpecError, match=message):
        StageSpec.from_dict({**raw, "tensor_group": bad})
