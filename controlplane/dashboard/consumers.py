"""The browser socket ``/ws/dashboard/``: a snapshot, then deltas, of the nodes a page shows, on the
hub's ticks, paced by the browser's acks.

Telemetry to browsers is lossy by design (ARCHITECTURE invariants): every
``MOTLEY_DASHBOARD_SNAPSHOT_INTERVAL_S`` tick, a socket whose browser acknowledged its last frame is
sent the next one: a full snapshot first, then the delta from the version the browser acked
(``controlplane/telemetry/frames.py``). A socket never holds more than one frame in flight, so a slow
or stalled browser simply sees fewer of them and nothing queues up in the server on its behalf; one
that missed something (an ack that does not match, a new subscription, a reconnect, a version
older than the hub still remembers) is sent a full snapshot again. A browser silent for
``ACK_TIMEOUT_S`` is sent the next delta from the frame it has not acked (a socket delivers in order,
so the browser applies that frame first; a gap it finds is acked ``null`` and answered with a
snapshot), and the late acks of every frame so overtaken are taken as they come, however many: a
server running late does not turn its slowness into snapshots, its costliest frames (at 10,000 GPUs
a snapshot is 3 MB to every browser, and one late ack taken for a gap made every frame after it one).
Frames are rendered once per tick for all sockets that want the same, and the control plane's
ingest never waits for a browser.

The browser sends ``{"ack": version}`` after each frame and ``{"subscribe": {"nodes": "*" | [names],
"deltas": true}}`` whenever the nodes it shows change (every node until it does); a subscription that
is not valid closes the socket with ``CLOSE_BAD_SUBSCRIPTION`` and the reason, the previous one
untouched.
"""

from __future__ import annotations

import asyncio
import json

from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from controlplane.common.ws_dispatch import FramesWithoutSweep
from controlplane.common.ws_limits import MessageLimits
from controlplane.telemetry.frames import Subscription, SubscriptionError
from controlplane.telemetry.runtime import running_hub

CLOSE_UNAUTHENTICATED = 4401
CLOSE_BAD_SUBSCRIPTION = 4400
ACK_TIMEOUT_S = 10.0  # a browser silent this long is sent the next delta anyway


class DashboardConsumer(FramesWithoutSweep, AsyncWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.hub = running_hub()
        self.subscription = Subscription()
        self.held: int | None = None  # the version the browser acked holding; None: send a snapshot
        self.in_flight: int | None = None  # the version of the frame sent and not yet acked
        self.overtaken: set[int] = set()  # unacked frames the next one followed (their acks are late)
        self.sent_at = 0.0
        self.sent_tick = -1
        self.limits = MessageLimits(max_bytes=settings.MOTLEY_DASHBOARD_WS_MAX_MESSAGE_BYTES,
                                    per_s=settings.MOTLEY_DASHBOARD_WS_MESSAGES_PER_S,
                                    setting="MOTLEY_DASHBOARD_WS")
        self.closed = False
        await self.accept()
        self.pump = asyncio.create_task(self._pump())

    async def disconnect(self, code):
        pump = getattr(self, "pump", None)
        if pump is not None:
            pump.cancel()

    async def receive(self, text_data=None, bytes_data=None):
        """``{"ack": version}`` after each frame; ``{"subscribe": {...}}`` (module docstring)."""
        if self.closed:
            return
        if (broken := self.limits.refusal(text_data, bytes_data)) is not None:
            await self._close(*broken)
            return
        try:
            message = json.loads(text_data or "{}")
        except ValueError:
            return
        if not isinstance(message, dict):
            return
        if "subscribe" in message:
            try:
                self.subscription = Subscription.parse(message["subscribe"])
            except SubscriptionError as exc:
                await self._close(CLOSE_BAD_SUBSCRIPTION, str(exc))
                return
            self.held = None
            self.sent_tick = -1  # the new nodes' snapshot goes at once, not at the next tick
            await self._offer()
        elif "ack" in message and self.in_flight is not None:
            if message["ack"] in self.overtaken:
                self.overtaken.discard(message["ack"])
                return  # the late ack of a frame the one in flight follows
            # Anything but the frame in flight (a gap the browser saw) is answered with a snapshot.
            self.held = self.in_flight if message["ack"] == self.in_flight else None
            self.in_flight = None
            self.overtaken.clear()
            await self._offer()  # a tick this socket skipped while waiting is sent now, not a tick later

    async def _close(self, code: int, reason: str) -> None:
        self.closed = True
        await self.close(code=code, reason=reason)

    async def _offer(self) -> None:
        """Send the frame of this tick unless one was sent this tick or one is in flight."""
        if self.closed or self.sent_tick >= self.hub.tick:
            return
        if self.in_flight is not None:
            if asyncio.get_running_loop().time() - self.sent_at <= ACK_TIMEOUT_S:
                return
            # Silent: the next frame follows the unacked one, which the browser applies first.
            self.overtaken.add(self.in_flight)
            self.held, self.in_flight = self.in_flight, None
        if self.held is not None and self.held >= self.hub.version:
            return  # nothing new
        version, text = self.hub.frames.frame(self.subscription, self.held)
        if self.held is not None and version <= self.held:
            return
        self.in_flight, self.sent_tick = version, self.hub.tick
        self.sent_at = asyncio.get_running_loop().time()
        await self.send(text_data=text)

    async def _pump(self):
        interval = settings.MOTLEY_DASHBOARD_SNAPSHOT_INTERVAL_S
        while True:
            await self.hub.next_tick(interval)
            await self._offer()
