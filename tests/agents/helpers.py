"""Shared pieces of the agent tests: the stand-in stage, specs, an event recorder, an orphan check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
from celery import Celery

from contracts.stage_status import StageStatus
from tests.support.processes import REPO_ROOT, free_port, stop_process, wait_for_http

INCARNATION = 3  # the agent's incarnation in tests that build its queue consumer themselves
STAND_IN_COMMAND = [sys.executable, str(Path(__file__).with_name("stand_in_stage.py"))]
ORPHAN_TAG = "MOTLEY_AGENT_TEST_TAG"
MIB = 1024**2

TINY_FLEET = """
name: tiny
nodes:
  - name: box
    gpus:
      - model: T4
        overrides: {memory_gib: 1}
      - model: A100-80GB-SXM
"""


TINY_MODEL_CONFIG = {
    "model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 1000, "torch_dtype": "float16",
}
TINY_LAYER_BYTES = 1311744  # one 16-bit decoder layer of the tiny config
KV_BYTES_PER_TOKEN = 1024  # one layer: K and V of 256 values, 16-bit


def tiny_model(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(TINY_MODEL_CONFIG))
    return directory


def stage_spec(model: Path, pipeline_id: str = "d7-r0", stage_index: int = 1, device: str = "cpu",
               memory_mib: int = 100, emulation: dict | None = None, **stand_in: Any) -> dict[str, Any]:
    """A §1 spec of stage ``stage_index`` of 3, holding one layer of the tiny model and about
    ``memory_mib`` of KV. ``stand_in`` scripts the stand-in stage (stand_in_stage.py): it travels as
    the spec's ``auth_token``, a string the agent passes on unread, so the spec stays one the agent
    parses (``StageSpec.from_dict`` refuses a field it does not know)."""
    return {
        "pipeline_id": pipeline_id, "auth_token": json.dumps(stand_in, sort_keys=True),
        "model_path": str(model),
        "stage_index": stage_index, "num_stages": 3, "layers": [stage_index, stage_index + 1], "bits": 16,
        "dtype": None, "device": device, "threads": 1, "kv_tokens": memory_mib * MIB // KV_BYTES_PER_TOKEN,
        "listen": "tcp://127.0.0.1:1", "next": None if stage_index == 2 else "tcp://127.0.0.1:2",
        "head": "tcp://127.0.0.1:1", "peer_timeout_s": 1.0, "emulation": emulation,
    }


class Events:
    """Records stage events (called from the supervisor thread) and waits for one to match."""

    def __init__(self) -> None:
        self.seen: list[StageStatus] = []
        self._changed = threading.Condition()

    def __call__(self, status: StageStatus) -> None:
        with self._changed:
            self.seen.append(status)
            self._changed.notify_all()

    def wait_for(self, predicate: Callable[[StageStatus], bool], timeout_s: float = 10.0) -> StageStatus:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for status in self.seen:
                    if predicate(status):
                        return status
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = [(s.stage_key, s.state) for s in self.seen]
                    raise AssertionError(f"no matching event in {timeout_s}s; saw {seen}")
                self._changed.wait(left)


def policies(pid: int) -> set[int]:
    """The scheduling policy of every thread of ``pid`` (SCHED_IDLE while a stage loads or warms up)."""
    return {os.sched_getscheduler(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Live processes whose environment carries the test's tag (stages and their children)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(ORPHAN_TAG) == tag and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:
            continue
    return found


def wait_until(predicate: Callable[[], Any], timeout_s: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout_s}s")


@contextmanager
def daphne(env: dict[str, str]) -> Iterator[str]:
    """daphne serving controlplane.asgi with ``env`` on a free port for the block; yields its URL."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                               "controlplane.asgi:application"], env=env, cwd=REPO_ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/api/schema/")
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(server, timeout_s=3)  # daphne waits on its websocket tasks; the test is over


class ControllerApp(Celery):
    """The sending side as the control plane's dispatch: tasks by name, JSON, each stamped with the
    incarnation of the agent it is for (``INCARNATION`` unless the kwargs name one)."""

    def __init__(self, main: str, broker: str, options: dict, incarnation: int = INCARNATION):
        super().__init__(main, broker=broker, set_as_current=False, fixups=[])
        self.conf.broker_transport_options = options
        self.incarnation = incarnation

    def send_task(self, name, args=None, kwargs=None, **options):
        return super().send_task(name, args=args, kwargs={"incarnation": self.incarnation, **(kwargs or {})},
                                 **options)
