"""A websocket to a path no route matches is refused at its handshake: no HTTP 500, no traceback."""

from __future__ import annotations

import logging

import pytest
from channels.testing import WebsocketCommunicator

from controlplane.asgi import application
from controlplane.not_found import NO_SUCH_SOCKET


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("route", ["/ws/nothing/", "/ws/agents/extra/", "/", "/api/v1/nodes/"])
async def test_a_websocket_to_an_unknown_path_is_refused_with_one_line_and_no_traceback(route, caplog):
    """Channels' router raised for a path it could not route; daphne answered HTTP 500 and logged the
    traceback at every attempt (a scanner, a mistyped agent URL)."""
    caplog.set_level(logging.INFO)
    communicator = WebsocketCommunicator(application, route, headers=[(b"origin", b"http://127.0.0.1:8000")])
    connected, code = await communicator.connect()
    assert not connected and code == NO_SUCH_SOCKET
    await communicator.disconnect()
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in caplog.records if r.name == "controlplane.not_found"] == [
        f"websocket refused: no such path {route}"]
