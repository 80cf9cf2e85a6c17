"""A stage given a new spec in place (contracts §1, worker_runtime/spec_inbox.py): the same process
leaves its pipeline, loads only what it did not hold, points its links at its new neighbours and
rejoins, and the pipeline computes what a pipeline started with that split computes."""

from __future__ import annotations

import asyncio
import signal

import pytest

from contracts.stage_spec import StageSpec
from controlplane.gateway.serving.pipeline_client import PipelineClient
from tests.pipeline.harness import TOKEN, wait_healthy
from tests.pipeline.test_pipeline import collect
from tests.support.processes import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # real stage processes
PROMPT = [5, 17, 42, 9, 101]


async def generate(pipeline, max_tokens: int = 12) -> list[int]:
    async with PipelineClient(pipeline.head, TOKEN, "p0", timeout_s=10.0) as client:
        assert (await wait_healthy(client))["ok"]
        return await collect(client, PROMPT, max_tokens)


def drained(stage) -> list[dict]:
    """Every event the stage printed so far that no ``wait_event`` took."""
    events = []
    while not stage.events.empty():
        events.append(stage.events.get_nowait())
    return events


def changed(spec: StageSpec, **fields) -> StageSpec:
    return StageSpec.from_dict({**spec.to_json(), **fields})


async def test_a_boundary_moved_in_place_keeps_the_processes_and_the_tokens(start_pipeline):
    pipeline = start_pipeline(3)  # layers [0, 2), [2, 4), [4, 6)
    before = await generate(pipeline)
    pids = pipeline.pids()
    pipeline.respec(0, changed(pipeline.specs[0], layers=[0, 3]))
    pipeline.respec(1, changed(pipeline.specs[1], layers=[3, 4]))
    ready = [pipeline.stages[i].wait_event("ready") for i in (0, 1)]
    # Stage 0 now holds the embedding and three layers, stage 1 one layer: the split really moved.
    assert ready[0]["weight_bytes"] > 3 * ready[1]["weight_bytes"] > 0
    assert await generate(pipeline) == before
    assert pipeline.pids() == pids and all(stage.popen.poll() is None for stage in pipeline.stages)
    # Its pipeline warmed up when it was first complete; clients wait through a handover in place, so
    # the head that took a new spec says ok as soon as the pipeline is whole again, without a warm-up.
    reasons = [event["reason"] for event in drained(pipeline.stages[0]) if event.get("event") == "health"]
    assert reasons and not any("warming up" in reason for reason in reasons), reasons


async def test_a_precision_and_kv_change_in_place_serves_at_the_new_precision(start_pipeline):
    pipeline = start_pipeline(2)
    await generate(pipeline)
    pipeline.respec(1, changed(pipeline.specs[1], bits=8, kv_tokens=1024))
    ready = pipeline.stages[1].wait_event("ready")
    assert ready["kv_tokens"] == 1024
    assert len(await generate(pipeline)) == 12


async def test_the_stage_before_a_moved_one_only_points_its_link_at_the_new_place(start_pipeline):
    pipeline = start_pipeline(3)
    before = await generate(pipeline)
    relay_pid = pipeline.pids()[1]
    old = pipeline.stages[2]
    pipeline.specs[2] = changed(pipeline.specs[2], listen=f"tcp://127.0.0.1:{free_port()}")
    moved = pipeline.start(2)  # the last stage's new process, elsewhere, as a moved stage's is
    moved.wait_event("ready")
    old.popen.send_signal(signal.SIGUSR1)
    assert old.popen.wait(timeout=10) == 0
    pipeline.stages[2] = moved
    pipeline.respec(1, changed(pipeline.specs[1], next=pipeline.specs[2].listen))
    pipeline.stages[1].wait_event("ready")
    assert await generate(pipeline) == before
    assert pipeline.pids()[1] == relay_pid


async def test_a_spec_that_needs_another_process_is_refused_by_the_running_one(start_pipeline):
    """The agent hands a process only what it can take (``respec_blocker``); anything else is a fatal
    error naming what changed, never a stage half on its old address."""
    pipeline = start_pipeline(2)
    pipeline.respec(1, changed(pipeline.specs[1], listen=f"tcp://127.0.0.1:{free_port()}"))
    error = pipeline.stages[1].wait_event("error")
    assert "listen changed" in error["message"]
    assert await asyncio.to_thread(pipeline.stages[1].popen.wait, 10) == 1


async def test_a_held_stage_loads_beside_and_joins_only_when_its_spec_comes(start_pipeline):
    """A stage started with ``hold`` (ahead of an in-place handover) says ready but stays out of the
    pipeline; given the same spec without ``hold`` it joins without loading again."""
    pipeline = start_pipeline(2)
    before = await generate(pipeline)
    old = pipeline.stages[1]
    final = changed(pipeline.specs[1], listen=f"tcp://127.0.0.1:{free_port()}")
    pipeline.specs[1] = changed(final, hold=True)
    held = pipeline.start(1)
    held.wait_event("ready")
    async with PipelineClient(pipeline.head, TOKEN, "p0", timeout_s=10.0) as client:
        await asyncio.sleep(0.6)  # a heartbeat of the held stage would break the pipeline by now
        assert (await client.health())["ok"]
        assert await collect(client, PROMPT, 12) == before  # still through the old stage 1
    old.popen.send_signal(signal.SIGUSR1)
    assert old.popen.wait(timeout=10) == 0
    pipeline.stages[1] = held
    pipeline.respec(0, changed(pipeline.specs[0], next=final.listen))
    pipeline.respec(1, final)
    held.wait_event("ready")
    assert await generate(pipeline) == before
