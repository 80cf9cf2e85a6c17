"""The agent's websocket to the control plane (contracts §3): heartbeats, stage events, refusals.

A heartbeat goes out every ``heartbeat_interval_s`` with the device metrics and every stage's status;
a stage event goes out as soon as the supervisor reports one (so an exit reaches the control plane
well within 2 s). Events that happen while disconnected are kept (bounded) and sent on reconnect;
heartbeats are not: each is a full snapshot, so only the latest matters.

The connection is retried forever with exponential backoff. A refusal (``{"type": "refused"}``, or
the handshake rejected with 401/403 because the credential is no longer valid) means this agent is
not the node's current incarnation: it registers again and reconnects with the new credential.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus, WebSocketException

from agents.registration import Registration
from contracts.stage_status import StageStatus

log = logging.getLogger(__name__)

WS_PATH = "/ws/agents/"
MAX_PENDING_EVENTS = 1000

Snapshot = tuple[list[dict[str, Any]], list[dict[str, Any]]]  # (device metrics, stage statuses)


class Refused(Exception):
    """The control plane no longer accepts this credential or incarnation."""


def websocket_url(server: str) -> str:
    parts = urlsplit(server)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + WS_PATH, "", ""))


class Telemetry:
    def __init__(
        self,
        url: str,
        identity: Callable[[], Registration],
        snapshot: Callable[[], Snapshot],
        reregister: Callable[[], Awaitable[None]],
        max_backoff_s: float = 10.0,
    ):
        self._url = url
        self._identity = identity
        self._snapshot = snapshot
        self._reregister = reregister
        self._max_backoff_s = max_backoff_s
        self._loop = asyncio.get_running_loop()
        self._pending: deque[StageStatus] = deque(maxlen=MAX_PENDING_EVENTS)
        self._wake = asyncio.Event()
        self._seq = 0
        self.connections = 0  # successful connections so far (for logs and tests)

    def stage_event(self, status: StageStatus) -> None:
        """Queue a stage event; safe to call from any thread (the supervisor's)."""
        self._loop.call_soon_threadsafe(self._queue_event, status)

    def _queue_event(self, status: StageStatus) -> None:
        self._pending.append(status)
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Stay connected until ``stop``; pending events are sent before the last close."""
        delay = 0.5
        while not stop.is_set():
            registration = self._identity()
            try:
                async with connect(
                    self._url,
                    additional_headers={"Authorization": registration.authorization},
                    open_timeout=5,
                    close_timeout=2,
                ) as socket:
                    self.connections += 1
                    delay = 0.5
                    log.info("telemetry connected to %s as node %s", self._url, registration.node_id)
                    await self._session(socket, registration, stop)
            except Refused as exc:
                log.warning("the control plane refused this agent (%s): registering again", exc)
                await self._reregister()
                continue
            except InvalidStatus as exc:
                if exc.response.status_code in (401, 403):
                    log.warning("the control plane rejected the node credential: registering again")
                    await self._reregister()
                    continue
                log.warning("telemetry handshake failed: %s", exc)
            except (OSError, TimeoutError, WebSocketException) as exc:
                log.warning("telemetry connection lost or failed: %s", exc or type(exc).__name__)
            if stop.is_set():
                break
            try:
                await asyncio.wait_for(stop.wait(), timeout=delay * random.uniform(0.8, 1.2))
            except TimeoutError:
                pass
            delay = min(self._max_backoff_s, delay * 2)

    async def _session(
        self, socket: ClientConnection, registration: Registration, stop: asyncio.Event
    ) -> None:
        receiver = asyncio.create_task(self._receive(socket))
        try:
            next_heartbeat = time.monotonic()
            while True:
                await self._send_events(socket, registration)
                if stop.is_set():
                    return
                if time.monotonic() >= next_heartbeat:
                    heartbeat = await self._heartbeat(registration)
                    if heartbeat is not None:
                        await socket.send(json.dumps(heartbeat))
                    next_heartbeat = time.monotonic() + registration.heartbeat_interval_s
                self._wake.clear()
                waits = [asyncio.create_task(self._wake.wait()), asyncio.create_task(stop.wait())]
                done, _ = await asyncio.wait(
                    [*waits, receiver], timeout=max(0.0, next_heartbeat - time.monotonic()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for task in waits:
                    task.cancel()
                if receiver in done:
                    receiver.result()  # raises Refused or the connection's error
                    return
        finally:
            receiver.cancel()

    async def _send_events(self, socket: ClientConnection, registration: Registration) -> None:
        while self._pending:
            status = self._pending[0]
            frame = {"type": "stage_event", "incarnation": registration.incarnation,
                     "stage": status.to_json()}
            await socket.send(json.dumps(frame))
            self._pending.popleft()  # only once sent: an event is not lost with the connection

    async def _heartbeat(self, registration: Registration) -> dict[str, Any] | None:
        try:
            devices, stages = await asyncio.to_thread(self._snapshot)
        except Exception:  # a failing metrics source must not take the connection (and events) down
            log.exception("no heartbeat: the snapshot failed")
            return None
        self._seq += 1
        return {"type": "heartbeat", "incarnation": registration.incarnation, "seq": self._seq,
                "sent_at": time.time(), "devices": devices, "stages": stages}

    @staticmethod
    async def _receive(socket: ClientConnection) -> None:
        async for raw in socket:
            try:
                message = json.loads(raw)
            except (TypeError, ValueError):
                continue
            if isinstance(message, dict) and message.get("type") == "refused":
                raise Refused(str(message.get("reason", "")))
            log.debug("control plane says: %.200s", raw)
