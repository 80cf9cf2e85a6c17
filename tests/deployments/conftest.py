"""A registered fleet of four emulated one-GPU nodes (n3 spare), a deployable tiny model, and a recorder of
what the controller sends (agent tasks by queue, reconcile requests), taken where Celery would send it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from contracts import tasks
from contracts.stage_spec import spec_digest
from controlplane.common import task_sending
from controlplane.deployments.revisions import plan_revision_create
from controlplane.enrollment.services import agent_register, join_token_create
from controlplane.inventory.models import Device, Node
from controlplane.models_catalog.services import model_register
from tests.api.mixins import anonymous, api, user  # noqa: F401  (shared fixtures)

TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "torch_dtype": "float32",
    "tie_word_embeddings": False,
}
T4 = {"model": "T4", "memory_bytes": 16 * 1024**3, "memory_bandwidth_gbs": 320.0, "fp16_tflops": 65.0,
      "bf16_tflops": 0.0, "int8_tops": 130.0, "emulated": True}
REQUEST = {"batch": 4, "context": 256, "replicas": 1}


@dataclass
class Sent:
    """What the controller sent: agent tasks as (queue, name, kwargs), and deployments to reconcile."""

    tasks: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    reconciles: list[int] = field(default_factory=list)
    later: list[tuple[int, float]] = field(default_factory=list)  # (deployment, countdown) asked for

    def take(self) -> list[tuple[str, str, dict[str, Any]]]:
        tasks, self.tasks = self.tasks, []
        return tasks


class RecordingApp:
    """Stands in for the Celery app at ``send_task``, where a send leaves the process: it checks each
    message is what a broker would carry (a task name from contracts/tasks.py, JSON keyword
    arguments; an agent's task stamped with its node's incarnation then) and records it, without the
    incarnation, instead of sending it."""

    def __init__(self, record: Sent):
        self.record = record

    def send_task(self, name: str, args=None, kwargs=None, queue: str | None = None, serializer=None,
                  **options) -> None:
        countdown = options.pop("countdown", None)
        assert serializer == "json" and not args and not options, (name, args, serializer, options)
        assert name in TASK_NAMES, name
        json.dumps(kwargs)  # JSON only
        if name == tasks.RECONCILE:
            assert queue is None and set(kwargs) == {"deployment_id"}  # the control plane's own queue
            if countdown is None:
                self.record.reconciles.append(kwargs["deployment_id"])
            else:
                self.record.later.append((kwargs["deployment_id"], countdown))
        else:
            assert queue is not None and queue.startswith("node.") and countdown is None, (queue, countdown)
            kwargs = dict(kwargs)
            node = Node.objects.get(pk=int(queue.removeprefix("node.")))
            assert kwargs.pop("incarnation") == node.incarnation, (name, kwargs)  # stamped when it leaves
            self.record.tasks.append((queue, name, kwargs))


TASK_NAMES = {tasks.START_STAGE, tasks.STOP_STAGE, tasks.SYNC, tasks.RECONCILE}


@pytest.fixture(autouse=True)
def sent(monkeypatch) -> Sent:
    """Record sends at ``send_task`` instead of making them. ``transaction.on_commit`` is left as it
    is: a send is seen once the transaction that decided it commits, never if it rolls back, so the
    controller's tests run with ``django_db(transaction=True)`` as the services run in production."""
    record = Sent()
    monkeypatch.setattr(task_sending, "celery_app", RecordingApp(record))
    return record


@pytest.fixture
def nodes(db, sent) -> list[Node]:
    secret = join_token_create(ttl=timedelta(hours=1)).secret
    registered = [
        agent_register(join_token=secret, name=f"n{i}", address="127.0.0.1", emulated=True, devices=[T4]).node
        for i in range(4)
    ]
    sent.take()  # each registration's sync of an empty node
    return registered


@pytest.fixture
def real_gpus(nodes) -> list[Node]:
    """The fleet's devices as real cards: the planner gives each stage all the KV its card leaves, so
    a changed pipeline never fits beside the old one and is handed over in place."""
    Device.objects.update(emulated=False)
    return nodes


@pytest.fixture
def llm(db, tmp_path):
    checkpoint = tmp_path / "tiny"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps(TINY_CONFIG))
    (checkpoint / "model.safetensors").write_bytes(b"")
    return model_register(path=checkpoint)


def edited_plan(*stages: tuple[str, int, int]) -> dict[str, Any]:
    """One replica of ``(device, start, end)`` stages at 16 bits."""
    return {"replicas": [{"stages": [{"device": d, "layers": [s, e], "bits": 16} for d, s, e in stages]}]}


THREE_STAGES = edited_plan(("n0/gpu0", 0, 2), ("n1/gpu0", 2, 4), ("n2/gpu0", 4, 6))


@pytest.fixture
def revision(llm):
    return plan_revision_create(model=llm, plan=THREE_STAGES, request=REQUEST, source="edited")


def report(stage, state: str, pid: int | None = None, **extra) -> dict[str, Any]:
    """A StageStatus (contracts §3) for a stage row, about the spec last sent to it (as an agent says)."""
    digest = spec_digest(stage.sent_spec) if stage.sent_spec is not None else None
    return {"stage_key": stage.stage_key, "deployment_id": stage.deployment_id, "replica": stage.pipeline,
            "stage_index": stage.stage_index, "state": state, "pid": pid, "exit_code": None, "restarts": 0,
            "message": "", "stats": {}, "spec_digest": digest, **extra}
