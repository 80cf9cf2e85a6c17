"""The replacement signal (contracts §1): SIGUSR1 tells a real stage process that a new spec takes its
place. Its neighbours are being replaced too, so what it holds can never finish: the head fails its
in-flight requests at once with ``PipelineBroken("stage replaced")`` and a relay tells the head it is
leaving, where SIGTERM would drain for up to ``peer_timeout_s``."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from contracts.pipeline_errors import PipelineBroken
from controlplane.gateway.serving.pipeline_client import PipelineClient
from tests.pipeline.conftest import launcher, make_tiny_llama
from tests.pipeline.harness import TOKEN, wait_healthy
from tests.pipeline.test_pipeline import SLOW, collect

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # real stage processes
PEER_TIMEOUT_S = 5.0  # a drain (or noticing a silent stage) would take this long


@pytest.fixture
def pipeline(tmp_path):
    with launcher(make_tiny_llama(tmp_path / "model"), tmp_path) as start:
        yield start(3, peer_timeout_s=PEER_TIMEOUT_S, emulation=SLOW)


async def requests_failing_after(pipeline, stage: int, match: str) -> float:
    """Stream requests, SIGUSR1 one stage; the seconds until every request failed with ``match``."""
    async with PipelineClient(pipeline.head, TOKEN, "p0", timeout_s=10.0) as client:
        assert (await wait_healthy(client))["ok"]
        streams = [asyncio.create_task(collect(client, [i + 1] * 4, 300)) for i in range(4)]
        await asyncio.sleep(0.5)
        pipeline.stages[stage].popen.send_signal(signal.SIGUSR1)
        replaced_at = time.monotonic()
        results = await asyncio.wait_for(asyncio.gather(*streams, return_exceptions=True), timeout=15)
        took = time.monotonic() - replaced_at
        assert all(isinstance(r, PipelineBroken) and match in str(r) for r in results), results
        assert pipeline.stages[stage].popen.wait(timeout=5) == 0  # replaced is a stop on request
        return took


async def test_a_replaced_head_fails_its_requests_at_once(pipeline):
    took = await requests_failing_after(pipeline, 0, "stage replaced")
    assert took < 1.0, f"requests failed only after {took:.1f} s"


async def test_a_replaced_relay_says_so_and_the_head_fails_what_it_held_at_once(pipeline):
    # "stage 1 is being replaced" (its goodbye), or "stage 1 is unreachable" when the head's next
    # send finds its socket gone first: either way at once, not after the silence.
    took = await requests_failing_after(pipeline, 1, "stage 1")
    assert took < 1.0, (f"requests failed only after {took:.1f} s (silence is noticed after "
                        f"{PEER_TIMEOUT_S} s)")
