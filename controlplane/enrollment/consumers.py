"""The agents' websocket (contracts §3): heartbeats and stage events in, refusals out.

The agent is not a browser: it proves who it is with its node credential in the Authorization
header (which a web page cannot set on a websocket), so this route skips the Origin check that
protects the browser routes.
"""

from __future__ import annotations

import json

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from controlplane.enrollment.selectors import node_for_credential
from controlplane.enrollment.services import agent_message_receive

CLOSE_UNAUTHENTICATED = 4401
CLOSE_REFUSED = 4409


class AgentConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        headers = dict(self.scope.get("headers", []))
        found = await database_sync_to_async(node_for_credential)(
            authorization=headers.get(b"authorization", b"").decode("latin1")
        )
        if found is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        node, self.incarnation = found
        self.node_id = node.pk
        await self.accept()

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        try:
            message = json.loads(text_data) if text_data is not None else None
        except ValueError:
            message = None
        if not isinstance(message, dict):
            await self.send_json({"type": "error", "reason": "expected one JSON object per text frame"})
            return
        reason = await database_sync_to_async(agent_message_receive)(
            node_id=self.node_id, incarnation=self.incarnation, message=message
        )
        if reason is not None:
            await self.send_json({"type": "refused", "reason": reason})
            await self.close(code=CLOSE_REFUSED)
