"""The host KV tier across a pipeline (docs/pipeline.md, "Host KV tier"): blocks the head evicts go to
every stage's host memory and come back, copied, when a request's prefix continues into them; greedy
output is the same with the tier on and off."""

from __future__ import annotations

import asyncio

from controlplane.gateway.serving.pipeline_client import PipelineClient

from .conftest import NUM_LAYERS
from .harness import TOKEN, wait_healthy
from .in_process import InProcessPipeline
from .test_prefix_caching import reference

PREFIX = [(i * 11) % 250 + 1 for i in range(48)]  # 3 full blocks
OTHER = [(i * 13) % 250 + 2 for i in range(60)]  # a filler as long: its blocks push the prefix's out


def pipeline(tiny_model, host_kv_tokens: int, num_stages: int = 2) -> InProcessPipeline:
    # 5 blocks of device KV: one request of ~64 tokens at a time, no room to keep another's prefix.
    return InProcessPipeline(tiny_model, NUM_LAYERS, num_stages, kv_tokens=80, host_kv_tokens=host_kv_tokens)


def turns(p: InProcessPipeline) -> list[list[int]]:
    return [p.run([(prompt, 6)])[0] for prompt in (PREFIX + [3, 4], OTHER, PREFIX + [5], OTHER + [7],
                                                     PREFIX + [3, 4])]


def test_a_prefix_evicted_to_host_memory_comes_back_on_every_stage_instead_of_being_prefilled(tiny_model):
    tiered, bare = pipeline(tiny_model, host_kv_tokens=256), pipeline(tiny_model, host_kv_tokens=0)
    tiered.run([(PREFIX + [3, 4], 6)])
    bare.run([(PREFIX + [3, 4], 6)])
    before = [s["prefix_hit_tokens"] for s in tiered.stage_stats()]
    tiered.run([(OTHER, 6)])  # needs the prefix's blocks: they go to host memory
    bare.run([(OTHER, 6)])
    stats = tiered.stage_stats()
    assert [s["prefix_host_blocks"] for s in stats] == [3, 3]
    assert [s["prefix_host_blocks"] for s in bare.stage_stats()] == [0, 0]
    names = [set(stage.kv.host.names) for stage in tiered.stages]
    assert names[0] == names[1] and len(names[0]) == 3

    assert tiered.run([(PREFIX + [5], 6)]) == bare.run([(PREFIX + [5], 6)])
    hits = [s["prefix_hit_tokens"] - h for s, h in zip(tiered.stage_stats(), before)]
    assert hits == [48, 48]  # the prefix's 3 blocks, copied back: not prefilled on any stage
    assert all(s["prefix_hit_tokens"] == 0 for s in bare.stage_stats())
    assert [stage.kv.names for stage in tiered.stages][0] == tiered.stages[1].kv.names


def test_greedy_output_is_the_same_with_the_host_tier_on_and_off(tiny_model):
    tiered, bare = pipeline(tiny_model, 256, 3), pipeline(tiny_model, 0, 3)
    outputs = turns(tiered)
    jobs = [(prompt, 6) for prompt in (PREFIX + [3, 4], OTHER, PREFIX + [5], OTHER + [7], PREFIX + [3, 4])]
    assert outputs == turns(bare) == reference(tiny_model, tiered, jobs, 16)
    assert outputs[0] == outputs[4]
    stats = tiered.stage_stats()
    assert len({s["prefix_host_blocks"] for s in stats}) == 1 and stats[0]["prefix_hit_tokens"] > 0


def test_a_full_host_tier_drops_the_least_recently_used_alike_on_every_stage(tiny_model):
    tiered = pipeline(tiny_model, host_kv_tokens=48)  # 3 blocks: one prefix's
    for prompt in (PREFIX + [1], OTHER, PREFIX + [2], [9] * 60, OTHER + [3]):
        tiered.run([(prompt, 4)])
    held = [stage.kv.host.names for stage in tiered.stages]
    assert held[0] == held[1] and len(held[0]) == 3


async def test_stage_processes_move_an_evicted_prefix_to_host_memory_and_back(start_pipeline):
    """Real processes, each given its tier from its spec: both stages hold the evicted prefix in host
    memory, and its next request finds it there on both, with the tokens it had."""
    pipeline = start_pipeline(2, kv_tokens=80, host_kv_tokens=256)

    async def tokens(client, prompt) -> list[int]:
        return [e.token_id async for e in client.submit(prompt, max_tokens=6)]

    async with PipelineClient(pipeline.head, TOKEN, "p0") as client:
        assert (await wait_healthy(client))["ok"]
        first = await tokens(client, PREFIX + [3, 4])
        await tokens(client, OTHER)
        again = await tokens(client, PREFIX + [3, 4])
        for _ in range(100):  # the relay's figures come with its next heartbeat
            stages = (await client.stats())["stages"]
            if all(s and s["prefix_hit_tokens"] == 48 for s in stages):
                break
            await asyncio.sleep(0.05)
    assert again == first
    assert [s["prefix_hit_tokens"] for s in stages] == [48, 48]
    held = [s["prefix_host_blocks"] for s in stages]
    assert held[0] == held[1] >= 3  # the prefix's, the filler's, any warm-up request's
