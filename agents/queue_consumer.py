"""The agent's Celery consumer: its own queue ``node.<id>``, JSON only, one task at a time, acks late.

A minimal Celery app, separate from the control plane's (no Django here), whose tasks are thin calls
into the supervisor. It accepts JSON only, so a pickled message is refused by kombu before anything
is deserialized (and logged by Celery as an invalid task). Tasks are acked after they ran, so a task
lost with the agent is redelivered; they are idempotent, so a redelivery changes nothing.

The worker runs on a thread of the agent (a ``WorkController`` with the solo pool, the way Celery's
own embedded test worker does), because the agent's main thread belongs to its telemetry loop and
its stages must be forked by the long-lived supervisor thread.

Traced (contracts/tracing.py, the agent's resource naming its node), a start or stop of a stage is a
span, ``agent.start_stage`` / ``agent.stop_stage``, with the stage and its device as attributes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from celery import Celery
from celery.worker import WorkController
from celery.worker import state as worker_state

from agents.supervisor import Supervisor
from agents.throttle import ThrottleRefused, Throttles
from contracts.tasks import SET_THROTTLE, START_STAGE, STOP_STAGE, SYNC
from contracts.tracing import tracer

log = logging.getLogger(__name__)


class StaleTask(RuntimeError):
    """A task sent to an earlier incarnation of this node's agent: not run."""


@contextmanager
def _task_span(name: str, **attributes: Any) -> Iterator[Any]:
    """The span of one task (None while the agent does not trace); an exception ends it in error."""
    agent_tracer = tracer(__name__)
    if agent_tracer is None:
        yield None
        return
    named = {f"motley.{key}": value for key, value in attributes.items() if value is not None}
    with agent_tracer.start_as_current_span(name, attributes=named) as span:
        yield span


def build_app(
    broker_url: str, transport_options: dict[str, Any], queue: str, supervisor: Supervisor,
    throttles: Throttles | None = None, *, incarnation: Callable[[], int],
) -> Celery:
    """``incarnation()``: this agent's incarnation now (it changes when the agent registers again).
    Every task names the incarnation it was sent to; one sent to an older incarnation was queued
    before the registration whose ``sync`` superseded it (a replay, or a start the control plane
    decided for the agent's previous life) and is refused. A newer one is run: the control plane
    sends the registration's ``sync`` before this agent has read its own registration's answer."""

    def current(task: str, sent_to: object) -> None:
        if isinstance(sent_to, bool) or not isinstance(sent_to, int):
            raise TypeError(f"{task}: incarnation must be an integer, got {sent_to!r:.100}")
        if sent_to < (mine := incarnation()):
            raise StaleTask(f"{task} was sent to incarnation {sent_to} of this node's agent, this is "
                            f"incarnation {mine}: not run (its registration's sync superseded it)")

    # fixups=[]: no Django fixup even where DJANGO_SETTINGS_MODULE is set; the agent is not Django.
    app = Celery("motley-agent", broker=broker_url, set_as_current=False, fixups=[])
    app.conf.update(
        # The embedded broker through a reader that never takes a half-written message.
        broker_transport=(
            "embedded_broker.transport:Transport" if broker_url.startswith("filesystem:") else None
        ),
        broker_transport_options=transport_options,
        # Celery would let $CELERY_BROKER_URL override broker_url; the agent consumes the broker the
        # control plane named at registration, whatever its environment says.
        broker_read_url=broker_url,
        broker_write_url=broker_url,
        broker_connection_retry_on_startup=True,
        accept_content=["json"],
        task_serializer="json",
        result_serializer="json",
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=queue,
        task_ignore_result=True,
        worker_hijack_root_logger=False,
        worker_cancel_long_running_tasks_on_connection_loss=False,
    )

    @app.task(name=START_STAGE, shared=False)
    def start_stage(stage_key: str, spec: dict[str, Any], device_index: int | None = None, *,
                    incarnation: int, background: bool = False) -> dict[str, Any]:
        current(START_STAGE, incarnation)
        if not isinstance(spec, dict):
            raise TypeError(f"start_stage {stage_key}: spec must be a JSON object")
        with _task_span("agent.start_stage", stage_key=stage_key, device=spec.get("device"),
                        device_index=device_index) as span:
            status = supervisor.start(stage_key, spec, device_index, background=bool(background))
            if span is not None:
                span.set_attribute("motley.state", status.state)
        return status.to_json()

    @app.task(name=STOP_STAGE, shared=False)
    def stop_stage(stage_key: str, *, incarnation: int) -> dict[str, Any] | None:
        current(STOP_STAGE, incarnation)
        if not isinstance(stage_key, str):
            raise TypeError(f"stop_stage: stage_key must be a string, got {stage_key!r:.100}")
        with _task_span("agent.stop_stage", stage_key=stage_key):
            status = supervisor.stop(stage_key)
        return status.to_json() if status else None

    @app.task(name=SYNC, shared=False)
    def sync(wanted_stage_keys: list[str], *, incarnation: int) -> list[str]:
        current(SYNC, incarnation)
        if not isinstance(wanted_stage_keys, list) or not all(isinstance(k, str) for k in wanted_stage_keys):
            raise TypeError("sync: wanted_stage_keys must be a list of stage keys, got "
                            f"{wanted_stage_keys!r:.100}")
        return supervisor.sync(wanted_stage_keys)

    @app.task(name=SET_THROTTLE, shared=False)
    def set_throttle(device_index: int, factor: float, *, incarnation: int) -> dict[str, Any]:
        current(SET_THROTTLE, incarnation)
        if throttles is None:
            raise ThrottleRefused("this agent runs no emulated device to throttle")
        return {"device_index": device_index, "factor": throttles.set(device_index, factor)}

    return app


class QueueConsumer:
    """Runs the agent's Celery worker on a thread; ``stop`` lets the current task finish."""

    def __init__(self, app: Celery, queue: str, hostname: str):
        app.finalize()
        self.app = app
        self._ready = threading.Event()
        self._worker = WorkController(
            app=app,
            hostname=hostname,
            pool_cls="solo",
            concurrency=1,
            queues=[queue],
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
            ready_callback=lambda consumer: self._ready.set(),
        )
        self._thread = threading.Thread(target=self._run, name="agent-queue-consumer", daemon=True)

    def _run(self) -> None:
        # The solo pool traces tasks against Celery's current app (thread-local, else the default).
        self.app.set_default()
        self.app.set_current()
        self._worker.start()

    def start(self, timeout_s: float = 30.0) -> None:
        worker_state.should_terminate = None
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError(f"the queue consumer did not connect to the broker within {timeout_s}s")

    @property
    def alive(self) -> bool:
        """False once the worker thread ended (stopped, or died on an unrecoverable error)."""
        return self._thread.is_alive()

    def stop(self, timeout_s: float = 30.0) -> None:
        # Celery's warm-shutdown flag, polled by the worker's loop (as celery.contrib.testing does).
        worker_state.should_terminate = 0
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("the queue consumer did not stop within %ss", timeout_s)
        worker_state.should_terminate = None
