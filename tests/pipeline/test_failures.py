"""A stage killed with SIGKILL: every request fails in bounded time, health says so, and a restart rejoins."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from contracts.pipeline_errors import PipelineBroken
from controlplane.gateway.serving.pipeline_client import PipelineClient

from .harness import TOKEN, wait_healthy
from .test_pipeline import SLOW, collect, reference

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # real stage processes
PEER_TIMEOUT_S = 1.0


async def test_kill_9_fails_everything_in_time_a_restart_rejoins_and_a_dead_head_is_noticed(start_pipeline,
                                                                                            tiny_model):
    pipeline = start_pipeline(3, peer_timeout_s=PEER_TIMEOUT_S, emulation=SLOW)
    async with PipelineClient(pipeline.head, TOKEN, "p0", timeout_s=3.0) as client:
        assert (await wait_healthy(client))["ok"]
        streams = [asyncio.create_task(collect(client, [i + 1] * 4, 200)) for i in range(8)]
        await asyncio.sleep(0.5)
        os.kill(pipeline.stages[1].popen.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        results = await asyncio.wait_for(asyncio.gather(*streams, return_exceptions=True), timeout=10)
        took = time.monotonic() - killed_at
        assert all(isinstance(r, PipelineBroken) for r in results), results
        assert took < PEER_TIMEOUT_S + 1.5, f"requests failed only after {took:.1f}s"
        health = await client.health()
        assert not health["ok"] and health["broken_stage"] == 1 and "stage 1" in health["reason"]
        with pytest.raises(PipelineBroken, match="not serving"):
            await collect(client, [1, 2], 4)
        assert pipeline.stages[1].popen.wait(timeout=5) == -signal.SIGKILL
        event = pipeline.stages[0].wait_event("health", timeout_s=5)
        while event["broken_stage"] is None:  # the events of the pipeline's start (warming up, ok) come first
            event = pipeline.stages[0].wait_event("health", timeout_s=5)
        assert event["broken_stage"] == 1 and "stage 1" in event["reason"]

        pipeline.restart(1).wait_event("ready")
        assert (await wait_healthy(client, timeout_s=20))["ok"]
        assert await collect(client, [9, 8, 7], 5) == reference(tiny_model, [9, 8, 7], 5)


        # The head itself dies: a client hears nothing and fails the stream within its own timeout.
        async with PipelineClient(pipeline.head, TOKEN, "p0", timeout_s=1.0) as fast:
            stream = asyncio.create_task(collect(fast, [3, 4], 300))
            await asyncio.sleep(0.3)
            os.kill(pipeline.stages[0].popen.pid, signal.SIGKILL)
            started = time.monotonic()
            with pytest.raises(PipelineBroken, match="said nothing of request"):
                await asyncio.wait_for(stream, timeout=5)
            assert time.monotonic() - started < 2.5
            health = await fast.health()
            assert not health["ok"] and health["broken_stage"] == 0


@pytest.mark.parametrize("killed", [1, 2])
async def test_a_killed_stage_breaks_the_pipeline_long_before_its_silence_would(start_pipeline, killed):
    """One request, its micro-batch inside the killed stage (the slow one): no other micro-batch will
    try the dead link, so only the link itself can tell. Its sockets close with the process, the link
    to it goes down and the head breaks the pipeline within a heartbeat or two: the request is
    resumed (PipelineBroken) at once instead of stalling for peer_timeout_s (10 s here)."""
    slow = {**SLOW, "time_scale": 2500.0}  # ~1 s a step on the tiny model
    pipeline = start_pipeline(3, peer_timeout_s=10.0, per_stage={killed: {"emulation": slow}})
    async with PipelineClient(pipeline.head, TOKEN, "p0", timeout_s=15.0) as client:
        assert (await wait_healthy(client))["ok"]
        stream = asyncio.create_task(collect(client, [1, 2, 3, 4], 200))
        await asyncio.sleep(1.5)
        os.kill(pipeline.stages[killed].popen.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        with pytest.raises(PipelineBroken):
            await asyncio.wait_for(stream, timeout=12)
        took = time.monotonic() - killed_at
        assert took < 2.0, f"the request failed only after {took:.1f}s"
        health = await client.health()
        assert not health["ok"] and health["broken_stage"] == killed, health
