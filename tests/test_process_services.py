"""A server process's own services (telemetry hub and keeper, heartbeat flusher, usage writer, the
gateway's serving state) start in one place, controlplane/process_services.py, before the ASGI
application serves its first connection (daphne sends no lifespan events) or at a lifespan start-up."""

from __future__ import annotations

import asyncio

import pytest
from channels.testing import ApplicationCommunicator, HttpCommunicator

from controlplane.asgi import application
from controlplane.enrollment import heartbeats
from controlplane.gateway.accounts import usage_backlog
from controlplane.gateway.serving import runtime
from controlplane.telemetry import keeper
from controlplane.telemetry import runtime as telemetry_runtime


def started_on(loop: asyncio.AbstractEventLoop) -> dict[str, bool]:
    hub = telemetry_runtime.current_hub()
    return {
        "telemetry hub": hub is not None and hub.loop is loop,
        "telemetry keeper": getattr(keeper._keepers.current, "loop", None) is loop,
        "heartbeat flusher": getattr(heartbeats._flushers.current, "loop", None) is loop,
        "usage writer": usage_backlog._writer is not None and usage_backlog._writer.get_loop() is loop
        and not usage_backlog._writer.done(),
        "gateway": loop in runtime._gateways,
    }


@pytest.mark.django_db
async def test_the_first_http_request_finds_every_service_running():
    loop = asyncio.get_running_loop()
    assert not any(started_on(loop).values())
    response = await HttpCommunicator(application, "GET", "/no-such-page/",
                                      headers=[(b"host", b"testserver")]).get_response()
    assert response["status"] == 404
    assert all(started_on(loop).values()), started_on(loop)


async def test_a_lifespan_start_up_starts_every_service():
    loop = asyncio.get_running_loop()
    communicator = ApplicationCommunicator(application, {"type": "lifespan"})
    await communicator.send_input({"type": "lifespan.startup"})
    assert (await communicator.receive_output())["type"] == "lifespan.startup.complete"
    assert all(started_on(loop).values()), started_on(loop)
    await communicator.send_input({"type": "lifespan.shutdown"})
    assert (await communicator.receive_output())["type"] == "lifespan.shutdown.complete"
