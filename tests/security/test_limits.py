"""Limits by design outside the gateway: the API's body size, registration attempts per address, and
the size and rate of websocket messages (agents' and browsers'); each with a clear error or close reason."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from agents.registration import RegistrationRefused, register
from controlplane.asgi import application
from tests.security.principals import principals_create

OWN_ORIGIN = (b"origin", b"http://127.0.0.1:8000")


@pytest.mark.django_db
def test_an_api_body_over_the_limit_is_a_413_in_the_apis_error_shape(settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    admin = principals_create()["admin"].client()
    response = admin.post("/api/v1/nodes/", {"name": "x" * 2000}, content_type="application/json")
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert "1000 bytes" in response.json()["error"]["message"]
    assert admin.post("/api/v1/nodes/", {"name": "n1"}, content_type="application/json").status_code == 201


@pytest.mark.django_db
def test_registration_attempts_past_the_limit_per_address_are_a_429_with_retry_after(settings):
    settings.MOTLEY_AGENT_REGISTRATIONS_PER_MINUTE = 3
    body = {"join_token": "mj-wrong", "name": "n", "address": "127.0.0.1", "emulated": True, "devices": []}
    client, other = Client(REMOTE_ADDR="10.0.0.1"), Client(REMOTE_ADDR="10.0.0.2")
    answers = [client.post("/api/v1/agents/register/", body, content_type="application/json").status_code
               for _ in range(4)]
    assert answers == [403, 403, 403, 429]
    refused = client.post("/api/v1/agents/register/", body, content_type="application/json")
    message = refused.json()["error"]["message"]
    assert "too many registration attempts from 10.0.0.1: at most 3 a minute" in message
    assert int(refused["Retry-After"]) > 0
    assert other.post("/api/v1/agents/register/", body, content_type="application/json").status_code == 403


async def _closed_after(route: str, messages: list[str]) -> dict:
    """Connect to ``route`` as its kind of client (a node; a signed-in browser), send ``messages`` at once,
    and return the close that follows."""
    principals = await database_sync_to_async(principals_create)()
    principal = principals["node" if "agents" in route else "plain"]
    headers = await database_sync_to_async(principal.websocket_headers)(OWN_ORIGIN[1].decode())
    communicator = WebsocketCommunicator(application, route, headers=headers)
    assert (await communicator.connect())[0]
    for text in messages:
        await communicator.send_to(text_data=text)
    while (message := await communicator.receive_output(timeout=5))["type"] != "websocket.close":
        pass
    return message


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("route", ["/ws/dashboard/", "/ws/agents/"])
async def test_a_websocket_message_over_the_size_limit_closes_the_socket_saying_so(route, settings):
    settings.MOTLEY_DASHBOARD_WS_MAX_MESSAGE_BYTES = settings.MOTLEY_AGENT_WS_MAX_MESSAGE_BYTES = 100
    closed = await _closed_after(route, ["x" * 101])
    assert closed["code"] == 1009
    assert "over 100" in closed["reason"] and "_MAX_MESSAGE_BYTES" in closed["reason"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("route", ["/ws/dashboard/", "/ws/agents/"])
async def test_a_websocket_client_over_the_message_rate_is_closed_saying_so(route, settings):
    settings.MOTLEY_DASHBOARD_WS_MESSAGES_PER_S = settings.MOTLEY_AGENT_WS_MESSAGES_PER_S = 5
    closed = await _closed_after(route, ["[]"] * 11)  # two seconds' worth pass at once; the eleventh not
    assert closed["code"] == 1008 and "over 5 messages a second" in closed["reason"]


def test_an_agent_takes_a_429_from_registration_as_transient_and_a_403_as_final():
    statuses = iter([429, 403])

    class Answer(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(next(statuses))
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error": {"message": "no"}}')

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        kwargs = {"server": f"http://127.0.0.1:{server.server_port}", "join_token": "mj-x", "name": "n",
                  "address": "127.0.0.1", "devices": []}
        with pytest.raises(httpx.HTTPStatusError):  # retried by register_until_done
            register(**kwargs)
        with pytest.raises(RegistrationRefused):
            register(**kwargs)
    finally:
        server.shutdown()
