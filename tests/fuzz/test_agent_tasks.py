"""Hostile agent tasks through the real queue consumer (filesystem broker, as embedded mode): unknown
fields, wrong types, missing fields and bad values for start_stage, stop_stage, sync and set_throttle.

The consumer stays up, logs each refusal with what is wrong, starts nothing from a malformed spec,
and still runs the good task sent after them. A redelivered start (the same task twice) starts one
process. A task sent to an earlier incarnation of the agent (queued before it registered again: a
replay, or a start decided for its previous life) is refused naming both incarnations, as is one
without an incarnation (docs/contracts.md §3). A spec ``StageSpec.from_dict`` refuses (an unknown
field inside it, a bad value) is refused as the task arrives and reported as a failed stage.
"""

from __future__ import annotations

import logging

import pytest

from agents.admission import Admission
from agents.discovery.emulated import emulated_devices
from agents.supervisor import RestartPolicy, Supervisor
from agents.throttle import Throttles
from contracts.tasks import SET_THROTTLE, START_STAGE, STOP_STAGE, SYNC
from tests.agents.conftest import brokers_named_by_the_test, tiny_fleet  # noqa: F401  (fixtures)
from tests.agents.helpers import (
    INCARNATION,
    STAND_IN_COMMAND,
    ControllerApp,
    Events,
    stage_spec,
    tiny_model,
    wait_until,
)
from tests.agents.test_queue_consumer import _filesystem, _queue, consuming

# CI exports CELERY_BROKER_URL, which would send the controller's tasks to Redis, not this test's broker.
pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("brokers_named_by_the_test")]


def hostile_tasks(spec: dict) -> list[tuple[str, dict, str]]:
    """(task, kwargs, a fragment of the logged error)."""
    return [
        (START_STAGE, {"stage_key": "bad-1", "spec": spec, "colour": "red"}, "colour"),
        (START_STAGE, {"stage_key": "bad-2"}, "spec"),
        (START_STAGE, {"stage_key": "bad-3", "spec": "not an object"}, "JSON object"),
        (START_STAGE, {"stage_key": "bad-5", "spec": {**spec, "layers": "all"}}, ""),  # reported as refused
        (START_STAGE, {"stage_key": "../../etc", "spec": spec}, "stage_key"),
        (START_STAGE, {"stage_key": ["a"], "spec": spec}, "stage_key"),
        (STOP_STAGE, {}, "stage_key"),
        (STOP_STAGE, {"stage_key": 7}, "stage_key"),
        (SYNC, {"wanted_stage_keys": 5}, "wanted_stage_keys"),
        (SET_THROTTLE, {"device_index": "gpu0", "factor": 0.5}, "device"),
        (SET_THROTTLE, {"device_index": 0, "factor": -1}, "factor"),
        (SET_THROTTLE, {"device_index": 0, "factor": 0.5, "extra": True}, "extra"),
        (START_STAGE, {"stage_key": "old-1", "spec": spec, "incarnation": INCARNATION - 1},
         f"sent to incarnation {INCARNATION - 1} of this node's agent, this is incarnation {INCARNATION}"),
        (SYNC, {"wanted_stage_keys": [], "incarnation": INCARNATION - 2}, f"incarnation {INCARNATION - 2}"),
        (STOP_STAGE, {"stage_key": "good", "incarnation": INCARNATION - 1}, f"incarnation {INCARNATION - 1}"),
        (START_STAGE, {"stage_key": "old-2", "spec": spec, "incarnation": None},
         "incarnation must be an integer"),
    ]


def test_hostile_tasks_are_refused_with_a_clear_error_and_start_nothing(tmp_path, tiny_fleet, caplog):
    url, options = _filesystem(tmp_path)
    queue, events = _queue(), Events()
    devices = emulated_devices(tiny_fleet, "box")
    supervisor = Supervisor(tmp_path / "state", Admission(devices), events, command=STAND_IN_COMMAND,
                            policy=RestartPolicy(stop_grace_s=1.0))
    throttles = Throttles(tmp_path / "throttle", devices)
    spec = stage_spec(tiny_model(tmp_path / "model"), device="cuda:0")
    controller = ControllerApp("controller", url, options)
    caplog.handler.setLevel(logging.INFO)
    trace = logging.getLogger("celery.app.trace")  # its own handler: Django's LOGGING may stop propagation
    trace.addHandler(caplog.handler)
    trace.setLevel(logging.INFO)
    with consuming(url, options, queue, supervisor, throttles) as consumer:
        bad = hostile_tasks(spec)
        for name, kwargs, _ in bad:
            controller.send_task(name, kwargs=kwargs, queue=queue, serializer="json")
        for _ in range(2):  # then a good start, redelivered: one process
            controller.send_task(START_STAGE, kwargs={"stage_key": "good", "spec": spec}, queue=queue,
                                 serializer="json")
        events.wait_for(lambda s: s.stage_key == "good" and s.state == "ready", timeout_s=60)
        wait_until(lambda: sum("succeeded" in r.getMessage() and START_STAGE in r.getMessage()
                               for r in caplog.records) >= 2, what="both good starts ran")
        assert consumer.alive
        assert {s.stage_key for s in events.seen if s.pid} == {"good"}  # no process from a malformed task
        refused = next(s for s in events.seen if s.stage_key == "bad-5")  # a spec it cannot read: reported
        assert refused.state == "failed" and "invalid stage spec" in refused.message
        assert len({s.pid for s in events.seen if s.pid}) == 1
    errors = "\n".join(r.getMessage() + str(r.exc_info and r.exc_info[1]) for r in caplog.records
                       if r.levelno >= logging.ERROR)
    for name, kwargs, fragment in bad:
        assert fragment in errors, (name, kwargs, fragment)
    controller.close()
    trace.removeHandler(caplog.handler)
