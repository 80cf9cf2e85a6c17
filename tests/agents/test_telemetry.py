"""The telemetry client against a small local websocket server that records what it receives."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from websockets.asyncio.server import serve
from websockets.http11 import Response

from agents.registration import Registration
from agents.telemetry import Telemetry, websocket_url
from contracts.stage_status import StageStatus
from tests.support.processes import free_port


def _registration(incarnation: int, credential: str = "secret") -> Registration:
    return Registration(node_id=3, node_credential=f"{credential}{incarnation}", incarnation=incarnation,
                        queue="node.3", broker_url="memory://", broker_transport_options={},
                        heartbeat_interval_s=0.2)


class FakeControlPlane:
    """Accepts ``Node 3:secret<n>`` for the current incarnation n; records frames by connection."""

    def __init__(self, port: int):
        self.port = port
        self.incarnation = 1
        self.frames: list[tuple[str, dict]] = []  # (authorization, frame)
        self.refuse_next = False
        self.server = None

    async def start(self):
        self.server = await serve(self._handle, "127.0.0.1", self.port, process_request=self._check)

    async def stop(self):
        self.server.close()
        await self.server.wait_closed()

    def _check(self, connection, request):
        if request.headers.get("Authorization") != f"Node 3:secret{self.incarnation}":
            return Response(403, "Forbidden", request.headers.__class__(), b"bad credential")
        return None

    async def _handle(self, socket):
        authorization = socket.request.headers["Authorization"]
        async for raw in socket:
            frame = json.loads(raw)
            self.frames.append((authorization, frame))
            if self.refuse_next:
                self.refuse_next = False
                self.incarnation += 1  # as if the node re-registered elsewhere
                await socket.send(json.dumps({"type": "refused", "reason": "stale incarnation"}))
                await socket.close(4409)

    def of_type(self, kind: str) -> list[dict]:
        return [frame for _, frame in self.frames if frame["type"] == kind]


async def _until(predicate, timeout_s=5.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{what} not reached in {timeout_s}s")


@pytest.fixture
async def plane():
    plane = FakeControlPlane(free_port())
    await plane.start()
    yield plane
    await plane.stop()


def _client(plane, registrations: list[Registration], snapshots=None) -> Telemetry:
    async def reregister():
        registrations.append(_registration(plane.incarnation))

    snapshot = snapshots or (lambda: ([{"index": 0, "utilization_pct": 12.0, "emulated": True}], []))
    return Telemetry(websocket_url(f"http://127.0.0.1:{plane.port}"), lambda: registrations[-1], snapshot,
                     reregister, max_backoff_s=0.5)


async def test_heartbeats_every_interval_and_stage_events_from_another_thread(plane):
    registrations = [_registration(1)]
    client = _client(plane, registrations)
    stop = asyncio.Event()
    task = asyncio.create_task(client.run(stop))
    await _until(lambda: len(plane.of_type("heartbeat")) >= 3, what="three heartbeats")
    sent = time.monotonic()
    status = StageStatus("d7-r0-s1", 7, 0, 1, "failed", exit_code=3, message="crashed")
    threading.Thread(target=client.stage_event, args=(status,)).start()
    await _until(lambda: plane.of_type("stage_event"), what="the stage event")
    assert time.monotonic() - sent < 0.5
    stop.set()
    await task
    beats = plane.of_type("heartbeat")
    assert [b["seq"] for b in beats] == list(range(1, len(beats) + 1))
    assert beats[0]["incarnation"] == 1 and beats[0]["devices"][0]["emulated"] is True
    assert 0.15 < beats[2]["sent_at"] - beats[1]["sent_at"] < 0.5
    (event,) = plane.of_type("stage_event")
    assert event == {"type": "stage_event", "incarnation": 1, "stage": status.to_json()}
    assert {auth for auth, _ in plane.frames} == {"Node 3:secret1"}


async def test_refused_makes_the_agent_register_again_and_continue_with_the_new_credential(plane):
    registrations = [_registration(1)]
    client = _client(plane, registrations)
    stop = asyncio.Event()
    task = asyncio.create_task(client.run(stop))
    await _until(lambda: plane.of_type("heartbeat"), what="a heartbeat")
    plane.refuse_next = True
    await _until(lambda: any(f["incarnation"] == 2 for f in plane.of_type("heartbeat")), what="incarnation 2")
    stop.set()
    await task
    assert len(registrations) == 2 and client.connections == 2
    assert plane.frames[-1][0] == "Node 3:secret2"


async def test_a_rejected_credential_at_the_handshake_also_re_registers(plane):
    plane.incarnation = 5
    registrations = [_registration(4)]
    client = _client(plane, registrations)
    stop = asyncio.Event()
    task = asyncio.create_task(client.run(stop))
    await _until(lambda: plane.of_type("heartbeat"), what="a heartbeat after re-registering")
    stop.set()
    await task
    assert [r.incarnation for r in registrations] == [4, 5]


async def test_reconnects_with_backoff_and_keeps_events_that_happened_while_down(plane):
    registrations = [_registration(1)]
    client = _client(plane, registrations)
    stop = asyncio.Event()
    task = asyncio.create_task(client.run(stop))
    await _until(lambda: plane.of_type("heartbeat"), what="a heartbeat")
    await plane.stop()
    client.stage_event(StageStatus("d7-r0-s1", 7, 0, 1, "exited", exit_code=0))
    await asyncio.sleep(0.8)  # a few failed attempts
    await plane.start()
    await _until(lambda: plane.of_type("stage_event"), what="the event kept while down")
    stop.set()
    await task
    assert client.connections == 2
