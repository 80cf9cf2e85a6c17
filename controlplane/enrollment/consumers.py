"""The agents' websocket (contracts §3): heartbeats and stage events in, refusals out.

The agent is not a browser: it proves who it is with its node credential in the Authorization
header (which a web page cannot set on a websocket), so this route skips the Origin check that
protects the browser routes.

A heartbeat is cheap on the event loop (docs/deployments.md, "The agents' websocket"): its telemetry
sample is published at once to the group ``telemetry``; it goes through ``agent_message_receive``
(the database, checked against the node's current incarnation) only when its stages' states differ
from what this connection last recorded, or it is the connection's first; otherwise the process's
``HeartbeatFlusher`` records it with every other connection's, in one transaction per flush
interval, and refuses the connection there if the node re-registered meanwhile. Stage events always
go straight to the database. Each device's observed health (controlplane/inventory/health.py) is
worked out in memory per heartbeat and written only when it changes.
"""

from __future__ import annotations

import time

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from controlplane.common import json_text
from controlplane.common.ws_dispatch import FramesWithoutSweep
from controlplane.common.ws_limits import MessageLimits
from controlplane.deployments.liveness import node_connection_closed
from controlplane.enrollment.heartbeats import running_flusher
from controlplane.enrollment.selectors import node_for_credential
from controlplane.enrollment.services import agent_message_receive
from controlplane.inventory.health import DeviceHealthWatch
from controlplane.telemetry.keeper import running_keeper
from controlplane.telemetry.services import telemetry_publish, telemetry_sample

CLOSE_ABNORMAL = 1006  # RFC 6455: closed without a closing handshake
CLOSE_UNAUTHENTICATED = 4401
CLOSE_REFUSED = 4409
_STAGE_FIELDS = ("stage_key", "state", "pid", "exit_code", "restarts", "message")


def stages_fingerprint(stages: list) -> tuple:
    """What of a heartbeat's stages the database records (contracts §3 StageStatus, less the stats)."""
    return tuple(sorted(
        (tuple(repr(s.get(k)) for k in _STAGE_FIELDS) for s in stages if isinstance(s, dict)),
    ))


class AgentConsumer(FramesWithoutSweep, AsyncJsonWebsocketConsumer):
    async def connect(self):
        headers = dict(self.scope.get("headers", []))
        found = await database_sync_to_async(node_for_credential)(
            authorization=headers.get(b"authorization", b"").decode("latin1")
        )
        if found is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        node, self.incarnation = found
        self.node_id, self.node_name = node.pk, node.name
        self.recorded: tuple | None = None  # the stages' fingerprint last recorded; None: nothing yet
        self.refused = False
        self.listed = False  # this node is in the telemetry cache's list of nodes
        self.flusher = running_flusher()
        self.health = DeviceHealthWatch(node.pk)  # writes a device's observed health only when it changes
        self.limits = MessageLimits(max_bytes=settings.MOTLEY_AGENT_WS_MAX_MESSAGE_BYTES,
                                    per_s=settings.MOTLEY_AGENT_WS_MESSAGES_PER_S, setting="MOTLEY_AGENT_WS")
        await self.accept()

    async def disconnect(self, code):
        """An abnormal close (1006: no closing handshake, as when the agent's process dies and the
        kernel closes its socket) is told to liveness, which may then declare the node lost sooner."""
        if getattr(self, "node_id", None) is None or self.refused:
            return
        self.flusher.forget(self)
        if code == CLOSE_ABNORMAL:
            await database_sync_to_async(node_connection_closed)(node_id=self.node_id,
                                                                 incarnation=self.incarnation)

    async def refuse(self, reason: str) -> None:
        """Tell the agent why it is no longer the node's and close (once)."""
        if self.refused:
            return
        self.refused = True
        self.flusher.forget(self)
        await self.send_json({"type": "refused", "reason": reason})
        await self.close(code=CLOSE_REFUSED)

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        if self.refused:
            return
        if (broken := self.limits.refusal(text_data, bytes_data)) is not None:
            self.refused = True
            self.flusher.forget(self)
            await self.close(code=broken[0], reason=broken[1])
            return
        try:
            message = json_text.loads(text_data) if text_data is not None else None
        except ValueError:
            message = None
        if not isinstance(message, dict):
            await self.send_json({"type": "error", "reason": "expected one JSON object per text frame"})
            return
        claimed = message.get("incarnation")
        if claimed != self.incarnation:
            await self.refuse(f"message incarnation {claimed!r} does not match the credential's "
                              f"({self.incarnation})")
            return
        if message.get("type") != "heartbeat":
            await self._record(message)
            return
        received_at = time.time()
        stages = [s for s in message.get("stages") or () if isinstance(s, dict)]
        fingerprint = stages_fingerprint(stages)
        if fingerprint != self.recorded:
            if not await self._record(message):
                return
            self.recorded = fingerprint
        else:
            self.flusher.note(self, received_at=received_at, stages=stages)
        sample = telemetry_sample(node_id=self.node_id, node_name=self.node_name, heartbeat=message,
                                  received_at=received_at)
        running_keeper().note(sample, new_node=not self.listed)
        self.listed = True
        await telemetry_publish(self.channel_layer, sample)
        await self.health.heartbeat(message.get("devices"))

    async def _record(self, message: dict) -> bool:
        """The message through the database at once; False if it was refused (the socket is closed)."""
        reason = await database_sync_to_async(agent_message_receive)(
            node_id=self.node_id, incarnation=self.incarnation, message=message
        )
        if reason is not None:
            await self.refuse(reason)
            return False
        return True
