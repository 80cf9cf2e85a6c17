"""A stage address behind a closed port or on no host at all, across the namespaces' network: a client
of the pipeline gets an error naming the address within its timeout, it does not hang."""

from __future__ import annotations

import asyncio
import time

import pytest

from controlplane.gateway.serving.pipeline_client import PipelineBroken, PipelineClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


@pytest.mark.parametrize("where", ["closed port on a live node", "address with no host"])
def test_unreachable_head_is_a_clear_error_not_a_hang(network, where):
    host = network.address(1) if where.startswith("closed") else f"{network.subnet}.200"
    address = f"tcp://{host}:5999"

    async def ask() -> dict:
        async with PipelineClient(address, "token", "p0", timeout_s=2.0) as client:
            with pytest.raises(PipelineBroken, match=address):
                await client.stats()
            return await client.health()

    started = time.monotonic()
    health = asyncio.run(ask())
    assert not health["ok"] and address in health["reason"], health
    assert time.monotonic() - started < 10
