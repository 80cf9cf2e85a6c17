"""Prefix caching across a pipeline's stages (docs/pipeline.md, "Prefix caching"): the real head and
relay loops in one process (in_process.py), then real stage processes across a re-form.

Greedy output is the same with the cache on, off, and in one in-process model, at every precision;
later requests reuse a shared system prompt and a conversation's resent history on every stage
alike; a relay lacking a block the head names fails that micro-batch cleanly; a re-formed pipeline
starts from empty caches under new names.

The tests of real processes share the module's pipeline (conftest's ``shared_pipeline``), in either
order: each sends a prompt of its own and counts the hits it adds to every stage's figures.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from contracts.precision import Precision
from contracts.prefix_cache import PrefixSummary
from contracts.stage_spec import StageSpec
from controlplane.gateway.serving.pipeline_client import PipelineClient
from worker_runtime.chain import generate
from worker_runtime.stage import Stage

from .conftest import NUM_LAYERS
from .harness import TOKEN, wait_healthy
from .in_process import InProcessPipeline, relay_heartbeat

SYSTEM = [(i * 7) % 250 + 1 for i in range(40)]  # 2 full blocks and a half
OTHER_SYSTEM = [(i * 5) % 250 + 3 for i in range(40)]  # as long, sharing no block with SYSTEM


def conversation(pipeline) -> tuple[list[list[int]], list[tuple[list[int], int]]]:
    """Two rounds: a chat's first turn beside another user of the system prompt, then the chat's
    second turn resending its history beside a third user. Returns the outputs and the jobs."""
    first = [(SYSTEM + [3, 4, 5], 12), (SYSTEM + [9, 9], 10)]
    outputs = pipeline.run(first)
    second = [(first[0][0] + outputs[0] + [11, 12, 13], 12), (SYSTEM + [7], 8)]
    return outputs + pipeline.run(second), first + second


def reference(model, pipeline, jobs, bits: int) -> list[list[int]]:
    torch.set_num_threads(1)
    stages = [Stage.load(model, *spec.layers, precision=Precision(bits), kv_tokens=1024)
              for spec in pipeline.specs]
    return [generate(stages, [prompt], max_new_tokens=n)[0] for prompt, n in jobs]


@pytest.mark.parametrize("bits,num_stages", [(16, 3), (8, 2), (4, 3)])
def test_greedy_output_is_the_same_with_the_cache_on_and_off_and_later_turns_reuse(tiny_model, bits,
                                                                                    num_stages):
    cached = InProcessPipeline(tiny_model, NUM_LAYERS, num_stages, bits=bits, kv_tokens=512)
    uncached = InProcessPipeline(tiny_model, NUM_LAYERS, num_stages, bits=bits, kv_tokens=512,
                                 prefix_caching=False)
    outputs, jobs = conversation(cached)
    assert outputs == conversation(uncached)[0] == reference(tiny_model, cached, jobs, bits)

    prompts = sum(len(prompt) for prompt, _ in jobs)
    stats = cached.stage_stats()
    # the second turn reuses 3 blocks of its history, the third user the system prompt's 2
    figures = [(s["prefix_queried_tokens"], s["prefix_hit_tokens"]) for s in stats]
    assert figures == [(prompts, 80)] * num_stages
    assert len({s["prefix_cached_blocks"] for s in stats}) == 1 and stats[0]["prefix_cached_blocks"] > 0
    assert all((s["prefix_queried_tokens"], s["prefix_hit_tokens"]) == (prompts, 0)
               for s in uncached.stage_stats())
    summary = PrefixSummary.from_json(cached.head.stats()["prefix_cache"])
    assert summary.cached_tokens(jobs[2][0] + outputs[2] + [1]) == 64 and summary.block_size == 16
    assert uncached.head.stats()["prefix_cache"] is None
    assert cached.head.stats()["kv_tokens_free_by_stage"] == {i: 512 for i in range(num_stages)}


def test_a_relay_lacking_a_block_fails_that_request_and_the_pipeline_serves_on(tiny_model):
    pipeline = InProcessPipeline(tiny_model, NUM_LAYERS, 3, kv_tokens=512)
    first = pipeline.run([(SYSTEM + [3], 6)])
    last = pipeline.relays[-1].worker.stage.kv
    last.evict(list(last.evictable()))  # the last stage lost what the head still names
    assert pipeline.run([(SYSTEM + [4], 6)]) == ["failed"]
    assert pipeline.head.health()["ok"] and pipeline.head.worker.stage.kv.prefix_cached_blocks == 0
    again = pipeline.run([(SYSTEM + [3], 6), (SYSTEM + [4], 6)])  # every stage recomputes alike
    assert again == [first[0], reference(tiny_model, pipeline, [(SYSTEM + [4], 6)], 16)[0]]
    names = [stage.kv.names for stage in pipeline.stages]
    assert len(names[0]) == 2 and names == [names[0]] * 3  # the system prompt's blocks, on every stage


def test_a_restarted_stage_starts_a_new_epoch_of_empty_caches_and_new_names(tiny_model):
    pipeline = InProcessPipeline(tiny_model, NUM_LAYERS, 3, kv_tokens=512)
    outputs, _ = conversation(pipeline)
    seed = pipeline.head.prefix.seed
    restarted = pipeline.relays[0]
    restarted.incarnation = "i1-again"  # what a restarted process reports (its cache is empty anyway)
    pipeline.head.on_heartbeat({"type": "heartbeat", **relay_heartbeat(restarted)})
    assert not pipeline.head.membership.healthy and pipeline.head.worker.stage.kv.names == []
    for relay in pipeline.relays:
        pipeline.head.on_heartbeat({"type": "heartbeat", **relay_heartbeat(relay)})
    pipeline.deliver()  # the reset of the new epoch empties every stage
    assert pipeline.head.health()["ok"] and pipeline.head.prefix.seed != seed
    assert all(s.kv.names == [] for s in pipeline.stages)
    hits = [s["prefix_hit_tokens"] for s in pipeline.stage_stats()]
    assert conversation(pipeline)[0] == outputs
    assert [s["prefix_hit_tokens"] - h for s, h in zip(pipeline.stage_stats(), hits)] == [80] * 3


async def settled_hits(client) -> list[int]:
    """Every stage's ``prefix_hit_tokens`` once the relays' heartbeats carry what the module's other
    tests served: two readings a heartbeat apart (at most 0.25 s) that agree."""
    last = None
    for _ in range(100):
        hits = [s and s["prefix_hit_tokens"] for s in (await client.stats())["stages"]]
        if None not in hits and hits == last:
            return hits
        last = hits
        await asyncio.sleep(0.3)
    raise AssertionError(f"stage figures never settled: {last}")


async def test_stage_processes_reuse_prefixes_and_forget_them_when_a_stage_restarts(shared_pipeline,
                                                                                    tiny_model):
    """Real processes: every stage's heartbeat statistics count the same hits, the head's summary
    names the cached prefix, and a killed and restarted stage re-forms the pipeline under new names
    with the same tokens."""
    pipeline = shared_pipeline  # 3 stages, 512 tokens of KV each
    prompt = SYSTEM + [3, 4]

    async def serve_twice(client) -> list[list[int]]:
        return [[e.token_id async for e in client.submit(prompt, max_tokens=8)] for _ in range(2)]

    async def stages_agree(client, hits: list[int]) -> dict:
        for _ in range(100):  # the relays' figures come with their next heartbeat
            stats = await client.stats()
            if [s and s["prefix_hit_tokens"] for s in stats["stages"]] == hits:
                return stats
            await asyncio.sleep(0.05)
        raise AssertionError(f"stages disagree: {stats['stages']}")

    async with PipelineClient(pipeline.head, TOKEN, "p0") as client:
        assert (await wait_healthy(client))["ok"]
        before = await settled_hits(client)
        tokens = await serve_twice(client)
        stats = await stages_agree(client, [hits + 32 for hits in before])
        seed = stats["prefix_cache"]["seed"]
        assert PrefixSummary.from_json(stats["prefix_cache"]).cached_tokens(prompt) == 32
        pipeline.stages[1].popen.kill()
        pipeline.stages[1].popen.wait()
        pipeline.restart(1).wait_event("ready")
        assert (await wait_healthy(client))["ok"]
        assert await serve_twice(client) == tokens
        stats = await client.stats()
    assert stats["prefix_cache"]["seed"] != seed and tokens[0] == tokens[1]
    assert tokens[0] == reference(tiny_model, pipeline, [(prompt, 8)], 16)[0]


async def test_a_boundary_moved_in_place_reuses_nothing_of_the_old_split_and_gives_its_tokens(
        shared_pipeline):
    """A handover in place (contracts §1): the processes stay, their caches and names do not; what the new
    split caches is reused again."""
    pipeline = shared_pipeline  # layers [0, 2), [2, 4), [4, 6)
    prompt = OTHER_SYSTEM + [3, 4]

    async def serve(client) -> tuple[list[int], dict]:
        tokens = [e.token_id async for e in client.submit(prompt, max_tokens=8)]
        return tokens, await client.stats()

    async with PipelineClient(pipeline.head, TOKEN, "p0", timeout_s=10.0) as client:
        assert (await wait_healthy(client))["ok"]
        counted = (await client.stats())["stages"][0]["prefix_hit_tokens"]  # the head's: never late
        before, _ = await serve(client)
        reused, stats = await serve(client)
        seed, hits = stats["prefix_cache"]["seed"], stats["stages"][0]["prefix_hit_tokens"] - counted
        for index, layers in ((0, [0, 3]), (1, [3, 4])):
            pipeline.respec(index, StageSpec.from_dict({**pipeline.specs[index].to_json(), "layers": layers}))
        for index in (0, 1):
            pipeline.stages[index].wait_event("ready")
        assert (await wait_healthy(client))["ok"]
        after, stats = await serve(client)
        assert stats["prefix_cache"]["seed"] != seed
        assert stats["stages"][0]["prefix_hit_tokens"] == 0  # stage 0's cache is new with its layers
        again, stats = await serve(client)
    assert before == reused == after == again and hits == 32
    assert stats["stages"][0]["prefix_hit_tokens"] == 32
