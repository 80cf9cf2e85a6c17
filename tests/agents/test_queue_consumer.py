"""The agent's queue consumer against real brokers: Redis (service mode) and the filesystem transport
(embedded mode). Tasks are sent the way the controller sends them (``send_task``, JSON)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import kombu
import pytest

from agents.admission import Admission
from agents.discovery.emulated import EmulatedMetrics, emulated_devices
from agents.queue_consumer import QueueConsumer, build_app
from agents.supervisor import RestartPolicy, Supervisor
from agents.throttle import Throttles
from contracts.tasks import SET_THROTTLE, START_STAGE, STOP_STAGE, SYNC
from contracts.tracing import tracing_setup, tracing_shutdown
from tests.agents.helpers import (
    INCARNATION,
    STAND_IN_COMMAND,
    ControllerApp,
    Events,
    stage_spec,
    tiny_model,
    wait_until,
)
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.processes import filesystem_broker_options, redis_up, redis_url

pytestmark = pytest.mark.slow  # real agent consumers on real brokers

REDIS_URL = redis_url(7)


def _filesystem(tmp_path):
    return "filesystem://", filesystem_broker_options(tmp_path / "broker", polling_interval=0.1)


def _queue() -> str:
    return f"node.test-{uuid.uuid4().hex[:8]}"


@contextmanager
def consuming(url: str, options: dict, queue: str, supervisor: Supervisor, throttles: Throttles | None = None,
              hostname: str | None = None) -> Iterator[QueueConsumer]:
    """``supervisor``'s queue consumer on ``queue``, started for the block; then it stops, the
    supervisor closes and a Redis queue is deleted."""
    app = build_app(url, options, queue, supervisor, throttles, incarnation=lambda: INCARNATION)
    consumer = QueueConsumer(app, queue, hostname=hostname or f"agent@{queue}")
    consumer.start()
    try:
        yield consumer
    finally:
        consumer.stop()
        supervisor.close()
        if url.startswith("redis"):
            with kombu.Connection(url) as conn:
                conn.default_channel.client.delete(queue)


@pytest.fixture(params=["redis", "filesystem"])
def broker(request, tmp_path):
    if request.param == "redis":
        if not redis_up():
            pytest.skip("no a Redis server")
        return REDIS_URL, {}
    return _filesystem(tmp_path)


@pytest.fixture
def agent_side(broker, tmp_path, tiny_fleet):
    """A supervisor and its queue consumer on a queue of its own; yields (queue, events, supervisor)."""
    url, options = broker
    queue = _queue()
    events = Events()
    supervisor = Supervisor(tmp_path / "state", Admission(emulated_devices(tiny_fleet, "box")), events,
                            command=STAND_IN_COMMAND, policy=RestartPolicy(stop_grace_s=1.0))
    with consuming(url, options, queue, supervisor):
        yield queue, events, supervisor


@pytest.fixture
def controller(broker):
    """The sending side, as plain as the control plane's dispatch: a Celery app and send_task."""
    url, options = broker
    app = ControllerApp("controller", url, options)
    yield app
    app.close()


def test_tasks_start_idempotently_sync_and_stop(agent_side, controller, tmp_path):
    queue, events, supervisor = agent_side
    spec = stage_spec(tiny_model(tmp_path / "model"), device="cuda:0")
    for _ in range(2):  # the same start twice (a redelivery) starts one process
        controller.send_task(START_STAGE, kwargs={"stage_key": "d7-r0-s1", "spec": spec}, queue=queue,
                             serializer="json")
    ready = events.wait_for(lambda s: s.state == "ready")
    controller.send_task(START_STAGE, kwargs={"stage_key": "d7-r0-s2", "spec": spec, "device_index": 1},
                         queue=queue, serializer="json")
    events.wait_for(lambda s: s.stage_key == "d7-r0-s2" and s.state == "ready")
    assert len({s.pid for s in events.seen if s.stage_key == "d7-r0-s1" and s.pid}) == 1
    assert ready.pid == supervisor.snapshot()[0][0].pid

    controller.send_task(START_STAGE, args=["d7-r0-s3", spec], queue=queue, serializer="json")
    events.wait_for(lambda s: s.stage_key == "d7-r0-s3" and s.state == "ready")
    controller.send_task(SYNC, kwargs={"wanted_stage_keys": ["d7-r0-s3"]}, queue=queue, serializer="json")
    for unwanted in ("d7-r0-s1", "d7-r0-s2"):  # SIGTERM: the stand-in drains and exits 0
        events.wait_for(lambda s, key=unwanted: (s.stage_key, s.state, s.exit_code) == (key, "exited", 0))
    assert [s.stage_key for s, _ in supervisor.snapshot()] == ["d7-r0-s3"]
    controller.send_task(STOP_STAGE, kwargs={"stage_key": "d7-r0-s3"}, queue=queue, serializer="json")
    events.wait_for(lambda s: s.stage_key == "d7-r0-s3" and s.state == "exited")
    wait_until(lambda: supervisor.snapshot() == [], what="no stage left")


class _Canary:
    """Unpickling this creates a file: proof that a pickle reached ``pickle.loads``."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_pickled_task_is_refused_without_being_unpickled(agent_side, broker, tmp_path, caplog):
    queue, events, supervisor = agent_side
    url, options = broker
    canary = tmp_path / "unpickled"
    spec = stage_spec(tiny_model(tmp_path / "model"), device="cuda:0")
    caplog.set_level(logging.ERROR)
    task_id = str(uuid.uuid4())
    with kombu.Connection(url, transport_options=options) as conn:
        conn.Producer().publish(
            ((), {"stage_key": "d7-r0-s1", "spec": spec, "device_index": _Canary(canary)}, {}),
            serializer="pickle",
            routing_key=queue,
            declare=[kombu.Queue(queue)],
            headers={"lang": "py", "task": START_STAGE, "id": task_id, "root_id": task_id, "argsrepr": "",
                     "kwargsrepr": "", "origin": "attacker", "retries": 0},
        )
    wait_until(lambda: "untrusted content of type pickle" in caplog.text, what="the refusal logged")
    assert not canary.exists()
    assert supervisor.snapshot() == [] and events.seen == []
    # The consumer goes on with JSON work.
    controller = ControllerApp("controller", url, options)
    controller.send_task(START_STAGE, args=["d7-r0-s1", spec], queue=queue, serializer="json")
    events.wait_for(lambda s: s.state == "ready")
    controller.close()


def test_the_embedded_broker_consumer_waits_for_a_message_being_written(tmp_path, tiny_fleet):
    """kombu's writer creates the file before writing it; its stock reader then dies on empty JSON."""
    url, options = _filesystem(tmp_path)
    queue = "node.half"
    events = Events()
    supervisor = Supervisor(tmp_path / "state", Admission(emulated_devices(tiny_fleet, "box")), events,
                            command=STAND_IN_COMMAND)
    with consuming(url, options, queue, supervisor, hostname="agent@half") as consumer:
        outbox = {**options, "data_folder_out": str(tmp_path / "outbox")}
        controller = ControllerApp("controller", url, outbox)
        (tmp_path / "outbox").mkdir()
        spec = stage_spec(tiny_model(tmp_path / "model"), device="cuda:0")
        controller.send_task(START_STAGE, args=["d7-r0-s1", spec], queue=queue, serializer="json")
        controller.close()
        (written,) = (tmp_path / "outbox").iterdir()
        being_written = tmp_path / "broker" / "data" / written.name
        being_written.touch()  # the writer has created the file, not yet written it
        time.sleep(0.5)  # several polls see the empty file
        assert consumer.alive
        being_written.write_bytes(written.read_bytes())
        events.wait_for(lambda s: s.state == "ready")


def test_set_throttle_through_the_broker_reaches_the_devices_metrics(broker, controller, tmp_path,
                                                                    tiny_fleet):
    url, options = broker
    queue = _queue()
    devices = emulated_devices(tiny_fleet, "box")
    throttles = Throttles(tmp_path / "throttle", devices)
    metrics = EmulatedMetrics(devices, throttles)
    supervisor = Supervisor(tmp_path / "state", Admission(devices, throttles=throttles), Events(),
                            command=STAND_IN_COMMAND)
    send = {"queue": queue, "serializer": "json"}
    with consuming(url, options, queue, supervisor, throttles):
        controller.send_task(SET_THROTTLE, kwargs={"device_index": 1, "factor": 0.5}, **send)
        hot = wait_until(lambda: metrics.sample([])[1].throttle_reasons, what="the throttle reported")
        assert hot == ("sw_thermal",) and metrics.sample([])[0].throttle_reasons == ()
        controller.send_task(SET_THROTTLE, kwargs={"device_index": 1, "factor": 1.0}, **send)
        wait_until(lambda: metrics.sample([])[1].throttle_reasons == (), what="the card recovered")


@pytest.mark.parametrize("broker", ["filesystem"], indirect=True)
def test_a_traced_agent_has_a_span_per_stage_it_starts_and_stops(monkeypatch, agent_side, controller,
                                                                  tmp_path):
    queue, events, _ = agent_side
    spec = stage_spec(tiny_model(tmp_path / "model"), device="cuda:0")
    with OtlpReceiver() as receiver:
        for name, value in receiver.env().items():
            monkeypatch.setenv(name, value)
        assert tracing_setup("agent", node="box")
        try:
            task = {"stage_key": "d7-r0-s1", "spec": spec, "device_index": 0}
            controller.send_task(START_STAGE, kwargs=task, queue=queue, serializer="json")
            events.wait_for(lambda s: s.state == "ready")
            controller.send_task(STOP_STAGE, kwargs={"stage_key": "d7-r0-s1"}, queue=queue, serializer="json")
            events.wait_for(lambda s: s.state == "exited")
            names = {"agent.start_stage", "agent.stop_stage"}
            spans = receiver.wait(lambda spans: names <= {s.name for s in spans})
        finally:
            tracing_shutdown()
    by_name = {s.name: s for s in spans}
    start, stop = by_name["agent.start_stage"], by_name["agent.stop_stage"]
    assert (start.resource["motley.role"], start.resource["motley.node"]) == ("agent", "box")
    assert start.attributes == {"motley.stage_key": "d7-r0-s1", "motley.device": "cuda:0",
                                "motley.device_index": 0, "motley.state": "starting"}
    assert stop.attributes == {"motley.stage_key": "d7-r0-s1"} and start.end_ns <= stop.start_ns
