"""The agents' websocket: credential in a header, incarnation checks, one node cannot touch another's."""

from __future__ import annotations

import asyncio
import time

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from contracts.names import device_name
from controlplane.asgi import application
from controlplane.deployments.models import DeploymentStage
from controlplane.deployments.revisions import plan_revision_create
from controlplane.deployments.services import deployment_create
from controlplane.enrollment import consumers, heartbeats
from controlplane.enrollment.services import agent_register
from controlplane.inventory.models import Node
from controlplane.telemetry.runtime import running_hub
from controlplane.telemetry.selectors import node_sample
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


def heartbeat(incarnation: int, stages=(), devices=({"index": 0, "utilization": 0.5},)) -> dict:
    return {"type": "heartbeat", "incarnation": incarnation, "seq": 1, "sent_at": 0.0,
            "devices": list(devices), "stages": list(stages)}


async def test_without_a_valid_credential_the_socket_is_refused(join_token):
    a = await database_sync_to_async(register)(join_token, "node-a")
    wrong = (None, f"Token {a.credential}", f"Node {a.node.pk}:wrong", f"Node {a.node.pk + 1}:{a.credential}")
    for authorization in wrong:
        communicator = await connect(authorization)
        connected, _ = await communicator.connect()
        assert not connected, authorization
        await communicator.disconnect()


async def hub_heard(hub, samples: int, since: int) -> int:
    """Wait until this process's telemetry hub has taken ``samples`` samples since its version
    ``since`` (through the channel layer's group, or straight from the socket with the in-memory
    layer); how many it took."""
    deadline = time.monotonic() + 5
    while hub.version - since < samples and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.1)  # and no more
    return hub.version - since


async def test_a_heartbeat_marks_the_node_alive_and_reaches_the_telemetry_hub(join_token):
    a = await database_sync_to_async(register)(join_token, "node-a")
    await database_sync_to_async(Node.objects.filter(pk=a.node.pk).update)(status=Node.Status.SUSPECT)
    hub = running_hub()
    since = hub.version
    # Agents send no Origin header; a browser's Origin on this route changes nothing either.
    communicator = await connect(f"Node {a.node.pk}:{a.credential}")
    assert (await communicator.connect())[0]
    await communicator.send_json_to(heartbeat(a.incarnation, devices=[{"index": 0, "utilization_pct": 50.0}]))
    assert await hub_heard(hub, 1, since) == 1
    assert hub.devices[device_name("node-a", 0)]["utilization_pct"] == 50.0
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


class Calls:
    """Count calls of a function the socket makes through the database thread."""

    def __init__(self, monkeypatch, module, name):
        self.calls: list[dict] = []
        real = getattr(module, name)

        def spy(**kwargs):
            self.calls.append(kwargs)
            return real(**kwargs)

        monkeypatch.setattr(module, name, spy)


async def test_unchanged_heartbeats_are_written_once_per_flush_not_once_each(join_token, monkeypatch):
    monkeypatch.setattr(heartbeats, "heartbeat_flush_interval_s", lambda: 0.2)
    receives = Calls(monkeypatch, consumers, "agent_message_receive")
    flushes = Calls(monkeypatch, heartbeats, "node_heartbeats_flush")
    a = await database_sync_to_async(register)(join_token, "node-a")
    hub = running_hub()
    since = hub.version
    communicator = await connect(f"Node {a.node.pk}:{a.credential}")
    assert (await communicator.connect())[0]
    await communicator.send_json_to(heartbeat(a.incarnation))  # the first: checked and written at once
    assert await communicator.receive_nothing(0.1)
    await database_sync_to_async(Node.objects.filter(pk=a.node.pk).update)(status=Node.Status.SUSPECT)
    started = time.monotonic()
    for _ in range(30):
        await communicator.send_json_to(heartbeat(a.incarnation))
        await asyncio.sleep(0.02)
    last_sent = time.time()
    assert await communicator.receive_nothing(0.35)
    elapsed = time.monotonic() - started
    assert len(receives.calls) == 1
    # At most one write per flush interval, each carrying this connection's latest heartbeat once.
    assert 1 <= len(flushes.calls) <= elapsed / 0.2 + 1
    assert all([e.node_id for e in call["seen"]] == [a.node.pk] for call in flushes.calls)
    node = await database_sync_to_async(Node.objects.get)(pk=a.node.pk)
    assert node.status == Node.Status.READY  # back from SUSPECT through the coalesced write
    assert abs(node.last_heartbeat.timestamp() - last_sent) < 0.2
    # Every heartbeat's telemetry still reached the hub, as it arrived.
    assert await hub_heard(hub, 31, since) == 31
    # The latest heartbeat is kept as the node's latest sample, off the loop within a keep interval.
    for _ in range(20):
        kept = await database_sync_to_async(node_sample)("node-a")
        if kept is not None and abs(kept.received_at - last_sent) < 0.2:
            break
        await asyncio.sleep(0.1)
    assert kept.value["node_id"] == a.node.pk and abs(kept.received_at - last_sent) < 0.2
    await communicator.disconnect()


async def test_a_stage_state_change_seen_in_a_heartbeat_is_recorded_at_once(join_token, llm, monkeypatch):
    # No flush during the test: only the direct path writes.
    monkeypatch.setattr(heartbeats, "heartbeat_flush_interval_s", lambda: 60.0)
    a = await database_sync_to_async(register)(join_token, "n0")
    revision = await database_sync_to_async(plan_revision_create)(
        model=llm, plan=edited_plan(("n0/gpu0", 0, 6),), request=REQUEST, source="edited")
    deployment = await database_sync_to_async(deployment_create)(name="d", revision=revision)
    communicator = await connect(f"Node {a.node.pk}:{a.credential}")
    assert (await communicator.connect())[0]

    def status(state):
        return {"stage_key": f"d{deployment.pk}-r0-s0", "deployment_id": deployment.pk, "replica": 0,
                "stage_index": 0, "state": state, "pid": 4242, "exit_code": None, "restarts": 0,
                "message": "", "stats": {"step_ms": 1.0}}

    async def stored_state():
        stage = await database_sync_to_async(DeploymentStage.objects.get)(deployment=deployment)
        return stage.state

    for state in ("starting", "starting", "ready"):
        await communicator.send_json_to(heartbeat(a.incarnation, [status(state)]))
        assert await communicator.receive_nothing(0.1)
        assert await stored_state() == state
    await communicator.disconnect()


async def test_a_socket_of_a_re_registered_node_is_refused_on_the_coalesced_path_too(join_token, monkeypatch):
    monkeypatch.setattr(heartbeats, "heartbeat_flush_interval_s", lambda: 0.1)
    old = await database_sync_to_async(register)(join_token, "node-a")
    communicator = await connect(f"Node {old.node.pk}:{old.credential}")
    assert (await communicator.connect())[0]
    await communicator.send_json_to(heartbeat(old.incarnation))
    assert await communicator.receive_nothing(0.1)
    new = await database_sync_to_async(register)(join_token, "node-a")
    before = (await database_sync_to_async(Node.objects.get)(pk=old.node.pk)).last_heartbeat
    await communicator.send_json_to(heartbeat(old.incarnation))  # unchanged: noted for the flush
    answer = await communicator.receive_json_from(timeout=2)
    assert answer["type"] == "refused" and f"stale incarnation {old.incarnation}" in answer["reason"]
    assert (await communicator.receive_output())["type"] == "websocket.close"
    after = (await database_sync_to_async(Node.objects.get)(pk=old.node.pk)).last_heartbeat
    assert after == before and new.incarnation != old.incarnation


async def test_an_abnormal_close_is_remembered_for_liveness_a_clean_one_or_an_old_ones_is_not(join_token):
    """A socket closed without a handshake (1006: the agent process died) is noted on its node, with
    its time, for node_health_check; a clean close (an agent stopping or reconnecting) and the close
    of a socket from an older incarnation change nothing."""
    a = await database_sync_to_async(register)(join_token, "node-a")

    async def closed_at():
        return (await database_sync_to_async(Node.objects.get)(pk=a.node.pk)).connection_closed_at

    communicator = await connect(f"Node {a.node.pk}:{a.credential}")
    assert (await communicator.connect())[0]
    await communicator.disconnect(code=1000)
    assert await closed_at() is None

    communicator = await connect(f"Node {a.node.pk}:{a.credential}")
    assert (await communicator.connect())[0]
    await communicator.disconnect(code=1006)
    noted = await closed_at()
    assert noted is not None

    old = await connect(f"Node {a.node.pk}:{a.credential}")
    assert (await old.connect())[0]
    await database_sync_to_async(register)(join_token, "node-a")  # a new incarnation registered
    await old.disconnect(code=1006)
    assert await closed_at() == noted
