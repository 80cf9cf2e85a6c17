"""PipelineClient against a scripted head: batched token frames fan out; a malformed one is dropped."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from tests.support.processes import free_port
from worker_runtime.client import PipelineClient, TokenEvent
from worker_runtime.frames import FrameCodec

from .harness import TOKEN

pytestmark = pytest.mark.timeout(30)


async def test_token_frames_fan_out_to_their_streams_and_a_malformed_one_is_dropped():
    address, codec = f"tcp://127.0.0.1:{free_port()}", FrameCodec("p0", TOKEN)
    context = zmq.asyncio.Context()
    head = context.socket(zmq.ROUTER)
    head.bind(address)

    async def scripted_head() -> None:
        peers = {}
        while len(peers) < 2:  # both submits first, then one frame carrying a token of each
            peer, *parts = await head.recv_multipart()
            peers[codec.decode(parts).header["request_id"]] = peer
        peer = peers["a"]
        await head.send_multipart(
            [peer, *codec.encode({"type": "tokens", "items": [["a", "not a number", None]]})]
        )
        await head.send_multipart(
            [peer, *codec.encode({"type": "tokens", "items": [["a", 7, None], ["b", 9, "length"]]})]
        )
        await head.send_multipart([peer, *codec.encode({"type": "tokens", "items": [["a", 8, "stop"]]})])

    try:
        async with PipelineClient(address, TOKEN, "p0", timeout_s=5) as client:

            async def stream(request_id: str) -> list[TokenEvent]:
                return [e async for e in client.submit([1, 2], max_tokens=4, request_id=request_id)]

            head_task = asyncio.create_task(scripted_head())
            a, b = await asyncio.gather(stream("a"), stream("b"))
            await head_task
        assert a == [TokenEvent("a", 7, None), TokenEvent("a", 8, "stop")]
        assert b == [TokenEvent("b", 9, "length")]
    finally:
        context.destroy(linger=0)
