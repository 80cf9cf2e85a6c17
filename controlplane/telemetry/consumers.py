"""Browser websocket: the latest telemetry snapshot, then every one published (lossy, throttled)."""

from __future__ import annotations

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from controlplane.telemetry.services import GROUP, telemetry_snapshot


class TelemetryConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        if not self.scope["user"].is_authenticated:
            await self.close(code=4401)
            return
        await self.channel_layer.group_add(GROUP, self.channel_name)
        await self.accept()
        await self.send_json({"type": "snapshot", "snapshot": await database_sync_to_async(telemetry_snapshot)()})

    async def disconnect(self, code):
        await self.channel_layer.group_discard(GROUP, self.channel_name)

    async def telemetry_snapshot(self, event):
        await self.send_json({"type": "snapshot", "snapshot": event["snapshot"]})
