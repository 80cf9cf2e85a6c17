"""Received frames skip Channels' per-message sweep of old database connections; connect keeps it
(controlplane.common.ws_dispatch)."""

from __future__ import annotations

import channels.consumer
import pytest
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.testing import WebsocketCommunicator

from controlplane.common.ws_dispatch import FramesWithoutSweep

# Closing runs Channels' own sweep, which checks connections an earlier test in this thread opened.
pytestmark = pytest.mark.django_db


class Echo(FramesWithoutSweep, AsyncWebsocketConsumer):
    async def receive(self, text_data=None, bytes_data=None):
        await self.send(text_data=text_data.upper())


async def test_frames_reach_their_handler_without_a_sweep(monkeypatch):
    sweeps = []

    async def sweep():
        sweeps.append(1)

    monkeypatch.setattr(channels.consumer, "aclose_old_connections", sweep)
    communicator = WebsocketCommunicator(Echo.as_asgi(), "/ws/echo/")
    assert (await communicator.connect())[0]
    assert len(sweeps) == 1  # connecting: swept as Channels does
    for text in ("a", "b", "c"):
        await communicator.send_to(text_data=text)
        assert await communicator.receive_from() == text.upper()
    assert len(sweeps) == 1
    await communicator.disconnect()
