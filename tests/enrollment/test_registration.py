"""Registration: a join token (hashed, expiring, revocable) buys a node credential and an incarnation."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.core.management import call_command
from django.utils import timezone
from rest_framework.authtoken.models import Token

from controlplane.asgi import application
from controlplane.enrollment.models import JoinToken, NodeCredential
from controlplane.inventory.models import Node
from tests.api.mixins import assert_error
from tests.enrollment.conftest import registration

URL = "/api/v1/agents/register/"


def agent_socket_accepts(authorization: str | None) -> bool:
    """Whether the agents' websocket (the endpoint an agent uses with its node credential) lets this
    ``Authorization`` header in. Its check reads the database from another thread: callers are
    transactional tests."""

    async def handshake() -> bool:
        headers = [(b"authorization", authorization.encode())] if authorization else []
        communicator = WebsocketCommunicator(application, "/ws/agents/", headers=headers)
        connected, _ = await communicator.connect()
        await communicator.disconnect()
        return connected

    return async_to_sync(handshake)()


def test_a_join_token_registers_the_node_and_its_devices(anonymous, join_token, settings):
    response = anonymous.post(URL, registration(join_token), format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    node = Node.objects.get(name="node-a")
    assert body["node_id"] == node.pk and body["incarnation"] == node.incarnation == 1
    assert body["queue"] == f"node.{node.pk}"
    assert body["broker_url"] == settings.MOTLEY_AGENT_BROKER_URL
    assert body["heartbeat_interval_s"] == settings.MOTLEY_AGENT_HEARTBEAT_INTERVAL_S
    devices = [(d.index, d.model_name, d.emulated) for d in node.devices.all()]
    assert devices == [(0, "T4", True), (1, "T4", True)]
    assert node.status == Node.Status.READY and node.last_heartbeat is not None
    # Secrets are stored as digests only.
    stored = NodeCredential.objects.get(node=node)
    assert body["node_credential"] not in stored.digest and len(stored.digest) == 64
    assert not JoinToken.objects.filter(digest__contains=join_token).exists()
    assert JoinToken.objects.get().uses == 1


@pytest.mark.django_db(transaction=True)
def test_registering_again_bumps_the_incarnation_and_voids_the_old_credential(anonymous, join_token):
    first = anonymous.post(URL, registration(join_token), format="json").json()
    second = anonymous.post(URL, registration(join_token, devices=1), format="json").json()
    assert (first["node_id"], first["incarnation"] + 1) == (second["node_id"], second["incarnation"])
    assert Node.objects.get().devices.count() == 1  # the agent is authoritative for its devices
    assert not agent_socket_accepts(f"Node {first['node_id']}:{first['node_credential']}")
    assert agent_socket_accepts(f"Node {second['node_id']}:{second['node_credential']}")


def test_a_wrong_token_is_refused(anonymous, join_token):
    response = anonymous.post(URL, registration("mjt_not-a-token"), format="json")
    assert_error(response, 403, "unknown join token")
    assert not Node.objects.exists()


def test_a_revoked_token_is_refused(anonymous, join_token):
    out = StringIO()
    call_command("revoke_join_token", join_token[:12], stdout=out)
    assert "revoked join token" in out.getvalue()
    assert_error(anonymous.post(URL, registration(join_token), format="json"), 403, "revoked")
    assert not Node.objects.exists()


def test_an_expired_token_is_refused(anonymous, join_token):
    JoinToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert_error(anonymous.post(URL, registration(join_token), format="json"), 403, "expired")


def test_malformed_registrations_are_refused_with_the_field(anonymous, join_token):
    bad_name = anonymous.post(URL, {**registration(join_token), "name": "a/b"}, format="json")
    assert_error(bad_name, 400, "name")
    partial = {**registration(join_token), "devices": [{"model": "T4"}]}
    bad_device = anonymous.post(URL, partial, format="json")
    assert_error(bad_device, 400, "devices", "device 0")
    assert not Node.objects.exists()


@pytest.mark.django_db
def test_create_join_token_prints_the_secret_once_with_its_ttl():
    out, err = StringIO(), StringIO()
    call_command("create_join_token", "--ttl", "15m", "--description", "rack 3", stdout=out, stderr=err)
    secret = out.getvalue().strip()
    token = JoinToken.objects.get()
    assert secret.startswith(token.prefix) and token.description == "rack 3"
    assert timedelta(minutes=14) < token.expires_at - timezone.now() <= timedelta(minutes=15)
    assert secret not in err.getvalue()


@pytest.mark.django_db(transaction=True)
def test_one_nodes_credential_cannot_pass_for_another_nor_a_user_for_an_agent(anonymous, join_token, user):
    a = anonymous.post(URL, registration(join_token, "node-a"), format="json").json()
    b = anonymous.post(URL, registration(join_token, "node-b"), format="json").json()
    assert agent_socket_accepts(f"Node {b['node_id']}:{b['node_credential']}")
    assert not agent_socket_accepts(f"Node {a['node_id']}:{b['node_credential']}")  # b's secret, a's id
    user_token = Token.objects.create(user=user).key
    for as_user in (None, f"Token {user_token}", f"Node {a['node_id']}:{user_token}"):
        assert not agent_socket_accepts(as_user), as_user
