"""What reaches a real broker: the controller's agent tasks as JSON on each node's queue and its
reconcile request, by name, on the control queue (Redis in service mode, the filesystem transport
always), and a Celery worker that refuses pickle."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
import uuid

import kombu
import pytest
from celery import Celery
from django.conf import settings

from controlplane.common import task_sending
from controlplane.deployments.reconcile import deployment_reconcile
from controlplane.deployments.services import deployment_create
from tests.support.processes import REPO_ROOT, embedded_env, filesystem_broker_options, redis_up, redis_url

pytestmark = pytest.mark.django_db(transaction=True)  # sends happen on commit, as in production
CONTROL = settings.CELERY_TASK_DEFAULT_QUEUE  # where the control worker listens ("control")


@pytest.fixture(params=["filesystem", "redis"])
def broker_app(request, tmp_path, monkeypatch, nodes):
    """The controller's sends, from now on, go to a real broker (the recorder is set aside)."""
    if request.param == "redis":
        if not redis_up():
            pytest.skip("no a Redis server")
        url, options = redis_url(8), {}
    else:
        url, options = "filesystem://", filesystem_broker_options(tmp_path / "broker")
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)  # Celery prefers it to the app's own broker
    app = Celery(f"test-{uuid.uuid4().hex[:6]}", broker=url)
    app.conf.broker_transport_options = options
    app.conf.task_serializer = "json"
    app.conf.task_default_queue = settings.CELERY_TASK_DEFAULT_QUEUE
    for queue_name in [f"node.{node.pk}" for node in nodes] + [CONTROL]:  # a Redis database outlives the test
        drain(app, queue_name)
    monkeypatch.setattr(task_sending, "celery_app", app)
    yield app
    drain(app, CONTROL)
    app.close()


def drain(app: Celery, queue: str) -> list[dict]:
    """Every message waiting on ``queue``, as (content type, task name, kwargs)."""
    received = []
    with app.connection_for_read() as connection:
        with connection.SimpleQueue(kombu.Queue(queue, routing_key=queue)) as simple:
            while True:
                try:
                    message = simple.get(timeout=0.5)
                except simple.Empty:
                    return received
                args, kwargs, _ = json.loads(message.body)
                received.append((message.content_type, message.headers["task"], kwargs))
                message.ack()


def test_reconcile_puts_json_start_tasks_on_each_nodes_queue_once(broker_app, nodes, revision):
    deployment = deployment_create(name="tiny", revision=revision)
    deployment_reconcile(deployment_id=deployment.pk)
    deployment_reconcile(deployment_id=deployment.pk)
    for index, node in enumerate(nodes[:3]):
        (message,) = drain(broker_app, f"node.{node.pk}")
        content_type, name, kwargs = message
        assert (content_type, name) == ("application/json", "motley.agent.start_stage")
        assert kwargs["stage_key"] == f"d{deployment.pk}-r0-s{index}"
        assert kwargs["spec"]["stage_index"] == index
        assert kwargs["device_index"] == 0
    assert drain(broker_app, f"node.{nodes[3].pk}") == []
    # The control worker is asked by name, with JSON keyword arguments (dispatch never imports tasks.py).
    assert drain(broker_app, CONTROL) == [
        ("application/json", "motley.deployments.reconcile", {"deployment_id": deployment.pk})
    ]


@pytest.mark.slow
def test_the_control_worker_refuses_a_pickled_task_and_accepts_a_json_one(tmp_path, monkeypatch):
    env = embedded_env(tmp_path)
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)  # the sender below uses the worker's broker
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "controlplane.celery", "worker", "--pool", "solo",
         "--queues", "control", "--loglevel", "INFO", "--without-heartbeat", "--without-gossip",
         "--without-mingle"],
        env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        broker = tmp_path / "broker"
        broker.mkdir(exist_ok=True)
        app = Celery("sender", broker="filesystem://")
        app.conf.broker_transport_options = {"data_folder_in": str(broker), "data_folder_out": str(broker),
                                             "control_folder": str(tmp_path / "control"),
                                             "store_processed": False}
        app.send_task("motley.deployments.node_health_check", queue="control", serializer="pickle")
        app.send_task("motley.deployments.node_health_check", queue="control", serializer="json")
        # Both were sent in the same millisecond, so either may be read first.
        output = _read_until(worker, ("untrusted content of type pickle", "] received"), timeout_s=30)
        assert output.count("] received") == 1  # the JSON one; the pickled one was refused unread
    finally:
        worker.terminate()
        worker.wait(timeout=15)


def _read_until(process: subprocess.Popen, needles: tuple[str, ...], timeout_s: float) -> str:
    """The process's output up to the line where the last of ``needles`` has appeared."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    seen = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        seen.append(line)
        output = "".join(seen)
        if all(needle in output for needle in needles):
            return output
    raise AssertionError(f"worker never said all of {needles!r}:\n{''.join(seen)[-3000:]}")
