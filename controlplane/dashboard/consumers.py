"""The browser socket ``/ws/dashboard/``: full snapshots on the hub's ticks, paced by the browser's acks.

Telemetry to browsers is lossy by design (ARCHITECTURE invariants): the hub renders the current
snapshot once per ``MOTLEY_DASHBOARD_SNAPSHOT_INTERVAL_S`` tick (when something changed) and every socket
whose browser acknowledged the previous snapshot is sent that same text. A slow or stalled browser
therefore holds at most one snapshot in flight and simply sees fewer of them; nothing queues up in
the server on its behalf, and the control plane's ingest never waits for a browser.
"""

from __future__ import annotations

import asyncio
import json

from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from controlplane.common.ws_limits import MessageLimits
from controlplane.telemetry.runtime import running_hub

CLOSE_UNAUTHENTICATED = 4401
ACK_TIMEOUT_S = 10.0  # a browser silent this long is sent the next snapshot anyway


class DashboardConsumer(AsyncWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.hub = running_hub()
        self.sent_version = -1
        self.awaiting_ack_since: float | None = None
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
        """The browser acks each snapshot by its version: ``{"ack": version}``."""
        if self.closed:
            return
        if (broken := self.limits.refusal(text_data, bytes_data)) is not None:
            self.closed = True
            await self.close(code=broken[0], reason=broken[1])
            return
        try:
            ack = json.loads(text_data or "{}").get("ack")
        except (ValueError, AttributeError):
            return
        if ack == self.sent_version:
            self.awaiting_ack_since = None
            # A tick this socket skipped while waiting for the ack is sent now, not one tick later.
            version, text = self.hub.ticked
            if version > self.sent_version:
                await self._send_snapshot(version, text)

    async def _send_snapshot(self, version: int, text: str) -> None:
        self.sent_version = version
        self.awaiting_ack_since = asyncio.get_running_loop().time()
        await self.send(text_data=text)

    async def _pump(self):
        interval = settings.MOTLEY_DASHBOARD_SNAPSHOT_INTERVAL_S
        loop = asyncio.get_running_loop()
        # The state at connect at once, then the hub's ticks.
        version, text = self.hub.version, self.hub.snapshot_text()
        while True:
            waiting = self.awaiting_ack_since
            acked = waiting is None or loop.time() - waiting > ACK_TIMEOUT_S
            if acked and version > self.sent_version:
                await self._send_snapshot(version, text)
            version, text = await self.hub.next_snapshot(interval)
