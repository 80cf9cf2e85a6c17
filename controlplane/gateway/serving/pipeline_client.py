"""The caller's side of a pipeline (contracts §2): submit token ids, get an async stream of tokens.

The gateway and the tests talk to a pipeline's head only through this class. It imports no torch:
the head sends it headers only, read with the envelope codec (``contracts.pipeline_frames``), and
the errors and sampling parameters are the contract's too, so the gateway imports neither torch nor
``worker_runtime``. One DEALER socket carries every request of the client; a reader task routes
incoming frames to each request's queue or call's future. Nothing waits forever: the head sends
``alive`` with the ids of the requests of ours it holds, and a stream whose request the head neither
answered nor named for ``timeout_s`` raises :class:`PipelineBroken`, as does a call unanswered for as
long. Per request, not per head: a head restarted at the same address (ZeroMQ reconnects to it
unseen) answers calls and names its own requests, but never the ones its predecessor took with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from contracts.logprobs import TokenLogprobs
from contracts.pipeline_errors import (
    ERRORS_BY_KIND,
    DeadlineExceeded,
    PipelineBroken,
    PipelineError,
    RequestRejected,
)
from contracts.pipeline_frames import EnvelopeCodec, FrameError
from contracts.sampling import SamplingParams

__all__ = ["DeadlineExceeded", "PipelineBroken", "PipelineClient", "PipelineError", "RequestRejected",
           "TokenEvent"]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenEvent:
    request_id: str
    token_id: int
    finish_reason: str | None  # None until the last event: "stop" | "length"
    logprobs: TokenLogprobs | None = None  # where the request's sampling asked (contracts/logprobs.py)

    @classmethod
    def from_item(cls, item: list) -> TokenEvent:
        """An item of the head's ``tokens`` frame; raises ``TypeError``, ``ValueError`` or ``KeyError``."""
        request_id, token_id, finish_reason, *rest = item
        logprobs = TokenLogprobs.from_wire(rest[0]) if rest else None
        return cls(str(request_id), int(token_id), finish_reason, logprobs)


class PipelineClient:
    def __init__(self, head_address: str, auth_token: str, pipeline_id: str, timeout_s: float = 5.0):
        self.head_address, self.timeout_s = head_address, timeout_s
        self._codec = EnvelopeCodec(pipeline_id, auth_token)
        self._context: zmq.asyncio.Context | None = None
        self._socket: zmq.asyncio.Socket | None = None
        self._reader: asyncio.Task | None = None
        self._streams: dict[str, asyncio.Queue] = {}
        self._calls: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count(1)
        self._heard: dict[str, float] = {}  # request id -> when the head last sent or named it

    async def __aenter__(self) -> "PipelineClient":
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def _ensure(self) -> zmq.asyncio.Socket:
        if self._socket is None:
            self._context = zmq.asyncio.Context()
            self._socket = self._context.socket(zmq.DEALER)
            self._socket.setsockopt(zmq.LINGER, 0)
            self._socket.connect(self.head_address)
            self._reader = asyncio.get_running_loop().create_task(self._read())
        return self._socket

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._context is not None:
            self._context.destroy(linger=0)
        self._socket = self._context = self._reader = None

    async def _send(self, header: dict[str, Any]) -> None:
        await self._ensure().send_multipart(self._codec.encode_parts(header))

    async def _read(self) -> None:
        assert self._socket is not None
        while True:
            parts = await self._socket.recv_multipart()
            try:
                h, _ = self._codec.decode_parts(parts)  # the head sends headers only
            except FrameError as exc:
                log.warning("dropped a frame from the head: %s", exc)
                continue
            now = time.monotonic()
            if h["type"] == "reply":
                future = self._calls.pop(h.get("call_id"), None)
                if future is not None and not future.done():
                    future.set_result(h.get("body"))
            elif h["type"] == "tokens":
                try:
                    events = [TokenEvent.from_item(item) for item in h["items"]]
                except (KeyError, TypeError, ValueError) as exc:
                    log.warning("dropped a malformed tokens frame from the head: %r", exc)
                    continue
                for event in events:
                    queue = self._streams.get(event.request_id)
                    if queue is not None:
                        self._heard[event.request_id] = now
                        queue.put_nowait(event)
            elif h["type"] == "alive":
                for request_id in h.get("requests", ()):
                    if request_id in self._streams:
                        self._heard[request_id] = now
            elif h["type"] == "error":
                queue = self._streams.get(h.get("request_id"))
                if queue is not None:
                    queue.put_nowait(h)

    async def submit(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams = SamplingParams(),
        *,
        max_tokens: int = 16,
        stop_token_ids: Sequence[int] = (),
        request_id: str | None = None,
        deadline_s: float | None = None,
        speculate: bool = True,
        traceparent: str | None = None,
    ) -> AsyncIterator[TokenEvent]:
        """Stream the tokens of one request; raises a :class:`PipelineError` subclass if it fails.
        ``speculate=False``: the head proposes no tokens for it, whatever its pipeline's speculation.
        ``traceparent``: the W3C trace context the head's span of the request is a child of.

        Leaving the loop early cancels the request (its KV space is freed on every stage); a request
        cancelled through :meth:`cancel` just ends its stream.
        """
        request_id = request_id or uuid.uuid4().hex
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = queue
        self._heard[request_id] = time.monotonic()
        finished = False
        try:
            await self._send(
                {
                    "type": "submit",
                    "request_id": request_id,
                    "prompt": [int(t) for t in prompt_ids],
                    "sampling": params.to_header(),
                    "max_tokens": max_tokens,
                    "stop_token_ids": [int(t) for t in stop_token_ids],
                    "deadline_s": deadline_s,
                    **({} if speculate else {"speculate": False}),
                    **({"traceparent": traceparent} if traceparent else {}),
                }
            )
            while True:
                if queue.empty():
                    try:
                        async with asyncio.timeout(min(0.25, self.timeout_s)):
                            item = await queue.get()
                    except TimeoutError:
                        if time.monotonic() - self._heard[request_id] > self.timeout_s:
                            raise PipelineBroken(
                                f"the head at {self.head_address} said nothing of request {request_id} "
                                f"for {self.timeout_s} s"
                            ) from None
                        continue
                else:
                    item = queue.get_nowait()
                if isinstance(item, TokenEvent):
                    yield item
                    if item.finish_reason is not None:
                        finished = True
                        return
                    continue
                finished = True  # an error frame ends the stream
                if item.get("kind") == "cancelled":
                    return
                raise ERRORS_BY_KIND.get(item.get("kind"), PipelineError)(str(item.get("message")))
        finally:
            self._streams.pop(request_id, None)
            self._heard.pop(request_id, None)
            if not finished and self._socket is not None:
                with contextlib.suppress(zmq.ZMQError):
                    cancel = {"type": "cancel", "request_id": request_id}
                    self._socket.send_multipart(self._codec.encode_parts(cancel))

    async def _call(self, kind: str, **fields: Any) -> Any:
        call_id = next(self._call_ids)
        future = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        try:
            await self._send({"type": kind, "call_id": call_id, **fields})
            async with asyncio.timeout(self.timeout_s):
                return await future
        except TimeoutError:
            raise PipelineBroken(f"the head at {self.head_address} did not answer {kind!r} within "
                                 f"{self.timeout_s} s") from None
        finally:
            self._calls.pop(call_id, None)

    async def cancel(self, request_id: str) -> bool:
        """Stop a request and free its KV space on every stage; False if it was not running."""
        return bool((await self._call("cancel", request_id=request_id))["cancelled"])

    async def stats(self) -> dict[str, Any]:
        """Per-stage statistics (contracts §4, ``stages[i]``) and the head's queue and admission figures."""
        return await self._call("stats")

    async def health(self) -> dict[str, Any]:
        """``{"ok", "broken_stage", "reason"}``; an unreachable head is reported, not raised."""
        try:
            return await self._call("health")
        except PipelineBroken as exc:
            return {"ok": False, "broken_stage": 0, "reason": str(exc)}
