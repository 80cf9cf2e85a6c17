"""/ws/dashboard/: who may connect; a snapshot then deltas of the nodes subscribed to, fed by the
telemetry group, paced by acks; a bad subscription refused saying why."""

from __future__ import annotations

import json
import time
from dataclasses import asdict

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.test import Client

from contracts.metrics import GpuMetrics
from contracts.stage_status import StageStatus
from controlplane.asgi import application
from controlplane.telemetry.services import telemetry_publish, telemetry_sample

pytestmark = pytest.mark.django_db(transaction=True)
ORIGIN = (b"origin", b"http://127.0.0.1:8000")


@database_sync_to_async
def _session_cookie(django_user_model) -> bytes:
    user = django_user_model.objects.create_user(username="viewer", password="x" * 12)
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def _publish_heartbeat(layer, node: str, util: float) -> None:
    """What the agents' socket publishes for one agent heartbeat (contracts §3), built by production code."""
    now = time.time()
    gpu = GpuMetrics(index=0, utilization_pct=util, memory_used_bytes=2**30, memory_total_bytes=2**34,
                     temperature_c=55.0, power_w=120.0, power_limit_w=300.0, sm_clock_mhz=1410,
                     throttle_reasons=(), pcie_tx_bytes_per_s=1e9, pcie_rx_bytes_per_s=2e9)
    stage = StageStatus(stage_key="d1-r0-s0", deployment_id=1, replica=0, stage_index=0, state="ready",
                        stats={"step_ms": 12.0, "compute_ms": 9.0, "transfer_ms": 2.0, "tokens_per_s": 80.0})
    heartbeat = {"type": "heartbeat", "incarnation": 1, "seq": 1, "sent_at": now - 0.01,
                 "devices": [asdict(gpu)], "stages": [stage.to_json()]}
    sample = telemetry_sample(node_id=1, node_name=node, heartbeat=heartbeat, received_at=now)
    await telemetry_publish(layer, sample)


async def test_anonymous_socket_is_refused():
    communicator = WebsocketCommunicator(application, "/ws/dashboard/", headers=[ORIGIN])
    connected, code = await communicator.connect()
    assert not connected and code == 4401


async def test_foreign_origin_is_refused_even_with_a_session(django_user_model):
    cookie = await _session_cookie(django_user_model)
    for origin in (b"http://evil.example", None):
        headers = [(b"cookie", cookie)] + ([(b"origin", origin)] if origin else [])
        communicator = WebsocketCommunicator(application, "/ws/dashboard/", headers=headers)
        connected, _ = await communicator.connect()
        assert not connected


async def test_logged_in_socket_gets_snapshots_from_the_telemetry_group_paced_by_acks(
    django_user_model, settings
):
    settings.MOTLEY_DASHBOARD_SNAPSHOT_INTERVAL_S = 0.05
    cookie = await _session_cookie(django_user_model)
    communicator = WebsocketCommunicator(application, "/ws/dashboard/", headers=[ORIGIN, (b"cookie", cookie)])
    connected, _ = await communicator.connect()
    assert connected
    try:
        initial = json.loads(await communicator.receive_from(timeout=2))  # the state at connect
        await communicator.send_to(text_data=json.dumps({"ack": initial["version"]}))
        layer = get_channel_layer()
        await _publish_heartbeat(layer, "node-x", 40.0)
        first = json.loads(await communicator.receive_from(timeout=2))
        assert first["devices"]["node-x/gpu0"]["utilization_pct"] == 40.0
        assert first["stages"]["d1-r0-s0"]["tokens_per_s"] == 80.0
        # Unacknowledged, the socket holds further snapshots back: a slow browser only misses some.
        await _publish_heartbeat(layer, "node-x", 70.0)
        assert await communicator.receive_nothing(timeout=0.3)
        await communicator.send_to(text_data=json.dumps({"ack": first["version"]}))
        second = json.loads(await communicator.receive_from(timeout=2))
        assert second["type"] == "delta" and second["patches"]["node-x/gpu0"]["utilization_pct"] == 70.0
    finally:
        await communicator.disconnect()


async def _connected(django_user_model, settings):
    settings.MOTLEY_DASHBOARD_SNAPSHOT_INTERVAL_S = 0.05
    cookie = await _session_cookie(django_user_model)
    communicator = WebsocketCommunicator(application, "/ws/dashboard/", headers=[ORIGIN, (b"cookie", cookie)])
    assert (await communicator.connect())[0]
    return communicator


async def _next(communicator, layer, node: str, util: float) -> dict:
    """The next frame after one heartbeat of ``node``, skipping ticks that carry none of it."""
    await _publish_heartbeat(layer, node, util)
    while True:
        frame = json.loads(await communicator.receive_from(timeout=2))
        await communicator.send_to(text_data=json.dumps({"ack": frame["version"]}))
        if f"{node}/gpu0" in {**frame["devices"], **frame.get("patches", {})}:
            return frame


async def test_a_snapshot_of_the_subscribed_nodes_then_deltas_from_the_version_acked(
    django_user_model, settings
):
    communicator = await _connected(django_user_model, settings)
    layer = get_channel_layer()
    try:
        await communicator.send_to(text_data=json.dumps({"subscribe": {"nodes": ["node-y"]}}))
        snapshot = json.loads(await communicator.receive_from(timeout=2))
        assert snapshot["type"] == "snapshot"
        await communicator.send_to(text_data=json.dumps({"ack": snapshot["version"]}))
        await _publish_heartbeat(layer, "node-z", 10.0)  # a node not shown: counted, never sent
        delta = await _next(communicator, layer, "node-y", 55.0)
        assert delta["type"] == "delta" and delta["devices"]["node-y/gpu0"]["utilization_pct"] == 55.0
        assert "node-z/gpu0" not in delta["devices"] and delta["fleet"]["nodes"] >= 2
        following = await _next(communicator, layer, "node-y", 65.0)
        assert following["type"] == "delta" and following["from"] == delta["version"]
        assert following["patches"]["node-y/gpu0"]["utilization_pct"] == 65.0  # the fields that changed
        # An ack of anything but the frame in flight (a gap the page saw) is answered with a snapshot.
        await _publish_heartbeat(layer, "node-y", 75.0)
        frame = json.loads(await communicator.receive_from(timeout=2))
        await communicator.send_to(text_data=json.dumps({"ack": frame["version"] - 1}))
        again = json.loads(await communicator.receive_from(timeout=2))
        assert again["type"] == "snapshot" and set(again["devices"]) == {"node-y/gpu0"}
    finally:
        await communicator.disconnect()


@pytest.mark.parametrize(("subscribe", "reason"), [
    ({"nodes": 7}, 'subscribe.nodes: expected "*" or a list of node names'),
    ({"nodes": "*", "rack": "r0"}, "unknown field 'rack'"),
])
async def test_a_bad_subscription_closes_the_socket_saying_why(
    django_user_model, settings, subscribe, reason
):
    communicator = await _connected(django_user_model, settings)
    await communicator.send_to(text_data=json.dumps({"subscribe": subscribe}))
    while (message := await communicator.receive_output(timeout=2))["type"] != "websocket.close":
        pass
    assert message["code"] == 4400 and reason in message["reason"]


async def test_a_silent_browser_is_sent_the_next_delta_after_its_unacked_frame(
    django_user_model, settings, monkeypatch
):
    """No ack within ACK_TIMEOUT_S: the browser will still apply that frame first (a socket delivers
    in order), so the next frame is the delta from it, not a snapshot; and so again for that one. The
    late acks, in order, change nothing: the deltas go on."""
    from controlplane.dashboard import consumers

    monkeypatch.setattr(consumers, "ACK_TIMEOUT_S", 0.2)
    communicator = await _connected(django_user_model, settings)
    layer = get_channel_layer()
    try:
        await communicator.send_to(text_data=json.dumps({"subscribe": {"nodes": ["node-s"]}}))
        unacked = json.loads(await communicator.receive_from(timeout=2))
        await _publish_heartbeat(layer, "node-s", 20.0)
        following = json.loads(await communicator.receive_from(timeout=2))
        assert following["type"] == "delta" and following["from"] == unacked["version"]
        await _publish_heartbeat(layer, "node-s", 25.0)
        third = json.loads(await communicator.receive_from(timeout=2))  # the second went unacked too
        assert third["type"] == "delta" and third["from"] == following["version"]
        for frame in (unacked, following):  # late: ignored
            await communicator.send_to(text_data=json.dumps({"ack": frame["version"]}))
        await communicator.send_to(text_data=json.dumps({"ack": third["version"]}))
        delta = await _next(communicator, layer, "node-s", 30.0)
        assert delta["type"] == "delta" and delta["patches"]["node-s/gpu0"]["utilization_pct"] == 30.0
    finally:
        await communicator.disconnect()
