"""PipelineClient against a scripted head: batched token frames fan out; a malformed one is dropped."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from controlplane.gateway.serving.pipeline_client import PipelineBroken, PipelineClient, TokenEvent
from tests.support.processes import free_port
from worker_runtime.frames import FrameCodec

from .harness import TOKEN

pytestmark = pytest.mark.timeout(30)


async def test_token_frames_fan_out_to_their_streams_and_a_malformed_one_is_dropped():
    """And a submit carries ``speculate`` only where the request opts out."""
    address, codec = f"tcp://127.0.0.1:{free_port()}", FrameCodec("p0", TOKEN)
    headers = {}
    context = zmq.asyncio.Context()
    head = context.socket(zmq.ROUTER)
    head.bind(address)

    async def scripted_head() -> None:
        peers = {}
        while len(peers) < 2:  # both submits first, then one frame carrying a token of each
            peer, *parts = await head.recv_multipart()
            header = codec.decode(parts).header
            peers[header["request_id"]], headers[header["request_id"]] = peer, header
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
                return [e async for e in client.submit([1, 2], max_tokens=4, request_id=request_id,
                                                       speculate=request_id == "a")]

            head_task = asyncio.create_task(scripted_head())
            a, b = await asyncio.gather(stream("a"), stream("b"))
            await head_task
        assert a == [TokenEvent("a", 7, None), TokenEvent("a", 8, "stop")]
        assert b == [TokenEvent("b", 9, "length")]
        assert "speculate" not in headers["a"] and headers["b"]["speculate"] is False
    finally:
        context.destroy(linger=0)


async def forgetful_head(head: zmq.asyncio.Socket, codec: FrameCodec, held: set[str], until: float) -> None:
    """A head (as one restarted at the same address) that answers every call and names only ``held``
    in its ``alive`` frames; at ``until`` (loop time) it ends the held requests."""
    loop, peer = asyncio.get_running_loop(), None
    while loop.time() < until:
        if await head.poll(100):
            peer, *parts = await head.recv_multipart()
            frame = codec.decode(parts)
            if "call_id" in frame.header:
                reply = {"type": "reply", "call_id": frame.header["call_id"], "body": {"ok": True}}
                await head.send_multipart([peer, *codec.encode(reply)])
        if peer is not None:
            await head.send_multipart([peer, *codec.encode({"type": "alive", "requests": sorted(held)})])
    for request_id in held:
        ended = {"type": "tokens", "items": [[request_id, 5, "stop"]]}
        await head.send_multipart([peer, *codec.encode(ended)])


async def test_a_request_the_head_no_longer_names_breaks_though_the_head_answers_calls():
    """A head restarted at the same address takes over the client's socket unseen (ZeroMQ reconnects)
    and answers its health calls, but the request its predecessor held is gone: the stream must raise
    PipelineBroken after ``timeout_s`` (the gateway then resumes it elsewhere), not wait for its
    deadline because the head as a whole is heard from. A request the head names stays open past
    ``timeout_s`` and ends normally."""
    address, codec = f"tcp://127.0.0.1:{free_port()}", FrameCodec("p0", TOKEN)
    context = zmq.asyncio.Context()
    head = context.socket(zmq.ROUTER)
    head.bind(address)
    try:
        async with PipelineClient(address, TOKEN, "p0", timeout_s=0.6) as client:
            loop = asyncio.get_running_loop()
            head_task = asyncio.create_task(forgetful_head(head, codec, {"kept"}, loop.time() + 2.0))

            async def stream(request_id: str) -> list[TokenEvent]:
                return [e async for e in client.submit([1, 2], max_tokens=4, request_id=request_id)]

            async def polled() -> None:
                while not head_task.done():
                    assert (await client.health())["ok"]
                    await asyncio.sleep(0.05)

            async def broken_after(request_id: str) -> tuple[BaseException, float]:
                with pytest.raises(PipelineBroken) as raised:
                    await stream(request_id)
                return raised.value, loop.time() - started

            started = loop.time()
            (lost, lost_after), kept, _ = await asyncio.gather(broken_after("lost"), stream("kept"), polled())
            await head_task
        # While the head still answers (2 s): not when it falls silent, as when only the head was watched.
        assert "said nothing of request lost for 0.6 s" in str(lost) and lost_after < 1.5
        assert kept == [TokenEvent("kept", 5, "stop")] and loop.time() - started >= 2.0
    finally:
        context.destroy(linger=0)
