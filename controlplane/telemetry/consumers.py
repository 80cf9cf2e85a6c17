"""Browser websocket ``/ws/telemetry/``: the fleet's latest samples, at most once per publish interval.

Agents' samples reach the group ``telemetry`` one by one as they arrive; this socket only notes that
something changed and sends the whole fleet snapshot (``telemetry_snapshot``) at most once per
``MOTLEY_TELEMETRY_PUBLISH_INTERVAL_S`` (lossy, whatever the fleet's size).
"""

from __future__ import annotations

import asyncio

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from controlplane.telemetry.schema import GROUP
from controlplane.telemetry.services import telemetry_snapshot


class TelemetryConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        if not self.scope["user"].is_authenticated:
            await self.close(code=4401)
            return
        self.changed = asyncio.Event()
        await self.channel_layer.group_add(GROUP, self.channel_name)
        await self.accept()
        snapshot = await database_sync_to_async(telemetry_snapshot)()
        await self.send_json({"type": "snapshot", "snapshot": snapshot})
        self.pump = asyncio.create_task(self._pump())

    async def disconnect(self, code):
        await self.channel_layer.group_discard(GROUP, self.channel_name)
        pump = getattr(self, "pump", None)
        if pump is not None:
            pump.cancel()

    async def telemetry_sample(self, event):
        changed = getattr(self, "changed", None)
        if changed is not None:
            changed.set()

    async def _pump(self):
        while True:
            await self.changed.wait()
            self.changed.clear()
            # Off the event loop (the cache may be a shared one), and off the database thread.
            snapshot = await sync_to_async(telemetry_snapshot, thread_sensitive=False)()
            await self.send_json({"type": "snapshot", "snapshot": snapshot})
            await asyncio.sleep(settings.MOTLEY_TELEMETRY_PUBLISH_INTERVAL_S)
