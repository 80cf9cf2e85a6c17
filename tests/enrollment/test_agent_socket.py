"""The agents' websocket: credential in a header, incarnation checks, one node cannot touch another's."""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from controlplane.asgi import application
from controlplane.deployments.models import DeploymentStage
from controlplane.deployments.services import deployment_create, plan_revision_create
from controlplane.enrollment.services import agent_register
from controlplane.inventory.models import Node
from controlplane.telemetry.services import GROUP
from tests.deployments.conftest import REQUEST, edited_plan
from tests.enrollment.conftest import DEVICE

pytestmark = pytest.mark.django_db(transaction=True)


def register(join_token: str, name: str):
    return agent_register(join_token=join_token, name=name, address="127.0.0.1", emulated=True,
                          devices=[DEVICE])


async def connect(authorization: str | None, origin: bytes | None = None) -> WebsocketCommunicator:
    headers = [(b"authorization", authorization.encode())] if authorization else []
    if origin:
        headers.append((b"origin", origin))
    return WebsocketCommunicator(application, "/ws/agents/", headers=headers)


def heartbeat(incarnation: int, stages=()) -> dict:
    return {"type": "heartbeat", "incarnation": incarnation, "seq": 1, "sent_at": 0.0,
            "devices": [{"index": 0, "utilization": 0.5}], "stages": list(stages)}


async def test_without_a_valid_credential_the_socket_is_refused(join_token):
    a = await database_sync_to_async(register)(join_token, "node-a")
    wrong = (None, f"Token {a.credential}", f"Node {a.node.pk}:wrong", f"Node {a.node.pk + 1}:{a.credential}")
    for authorization in wrong:
        communicator = await connect(authorization)
        connected, _ = await communicator.connect()
        assert not connected, authorization
        await communicator.disconnect()


async def test_a_heartbeat_marks_the_node_alive_and_reaches_the_telemetry_group(join_token, settings):
    settings.MOTLEY_TELEMETRY_PUBLISH_INTERVAL_S = 0.01
    a = await database_sync_to_async(register)(join_token, "node-a")
    await database_sync_to_async(Node.objects.filter(pk=a.node.pk).update)(status=Node.Status.SUSPECT)
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(GROUP, channel)
    # Agents send no Origin header; a browser's Origin on this route changes nothing either.
    communicator = await connect(f"Node {a.node.pk}:{a.credential}")
    assert (await communicator.connect())[0]
    await communicator.send_json_to(heartbeat(a.incarnation))
    snapshot = (await asyncio.wait_for(layer.receive(channel), 5))["snapshot"]
    assert [n["node"] for n in snapshot["nodes"]] == ["node-a"]
    assert snapshot["nodes"][0]["devices"] == [{"index": 0, "utilization": 0.5}]
    assert await communicator.receive_nothing(0.2)
    node = await database_sync_to_async(Node.objects.get)(pk=a.node.pk)
    assert node.status == Node.Status.READY
    await communicator.disconnect()


async def test_messages_from_an_older_incarnation_are_refused_and_the_socket_closed(join_token):
    old = await database_sync_to_async(register)(join_token, "node-a")
    communicator = await connect(f"Node {old.node.pk}:{old.credential}")
    assert (await communicator.connect())[0]
    await database_sync_to_async(register)(join_token, "node-a")  # the agent restarted elsewhere
    await communicator.send_json_to(heartbeat(old.incarnation))
    answer = await communicator.receive_json_from()
    assert answer["type"] == "refused" and "stale incarnation 1" in answer["reason"]
    assert (await communicator.receive_output())["type"] == "websocket.close"


async def test_a_message_claiming_another_incarnation_is_refused(join_token):
    a = await database_sync_to_async(register)(join_token, "node-a")
    communicator = await connect(f"Node {a.node.pk}:{a.credential}")
    assert (await communicator.connect())[0]
    await communicator.send_json_to(heartbeat(a.incarnation + 5))
    answer = await communicator.receive_json_from()
    assert answer["type"] == "refused" and "does not match" in answer["reason"]


async def test_non_json_frames_are_answered_not_unpickled(join_token):
    a = await database_sync_to_async(register)(join_token, "node-a")
    communicator = await connect(f"Node {a.node.pk}:{a.credential}")
    assert (await communicator.connect())[0]
    await communicator.send_to(bytes_data=b"\x80\x04\x95pickle")
    assert (await communicator.receive_json_from())["type"] == "error"
    await communicator.send_to(text_data="[1, 2]")
    assert (await communicator.receive_json_from())["type"] == "error"
    await communicator.disconnect()


async def test_a_node_cannot_update_another_nodes_stage(join_token, llm, sent):
    a = await database_sync_to_async(register)(join_token, "n0")
    b = await database_sync_to_async(register)(join_token, "n1")
    revision = await database_sync_to_async(plan_revision_create)(
        model=llm, plan=edited_plan(("n0/gpu0", 0, 3), ("n1/gpu0", 3, 6)), request=REQUEST, source="edited")
    deployment = await database_sync_to_async(deployment_create)(name="d", revision=revision)
    communicator = await connect(f"Node {b.node.pk}:{b.credential}")
    assert (await communicator.connect())[0]
    forged = {"stage_key": f"d{deployment.pk}-r0-s0", "deployment_id": deployment.pk, "replica": 0,
              "stage_index": 0, "state": "failed", "pid": 4242, "exit_code": 1, "restarts": 9,
              "message": "forged"}
    await communicator.send_json_to({"type": "stage_event", "incarnation": b.incarnation, "stage": forged})
    await communicator.send_json_to(heartbeat(b.incarnation, [forged]))
    assert await communicator.receive_nothing(0.3)
    stage = await database_sync_to_async(DeploymentStage.objects.get)(deployment=deployment, stage_index=0)
    assert stage.node_id == a.node.pk and (stage.state, stage.pid, stage.message) == ("pending", None, "")
    await communicator.disconnect()
