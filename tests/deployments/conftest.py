"""A registered fleet of four emulated one-GPU nodes (n3 spare), a deployable tiny model, and a recorder of
what the controller sends (agent tasks by queue, reconcile requests)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from controlplane.deployments import dispatch
from controlplane.deployments.services import plan_revision_create
from controlplane.enrollment.services import agent_register, join_token_create
from controlplane.inventory.models import Node
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

    def take(self) -> list[tuple[str, str, dict[str, Any]]]:
        tasks, self.tasks = self.tasks, []
        return tasks


@pytest.fixture(autouse=True)
def sent(monkeypatch) -> Sent:
    """Record sends instead of making them, at once (a test's transaction never commits)."""
    record = Sent()

    class App:
        @staticmethod
        def send_task(name, kwargs, queue, serializer):
            assert serializer == "json"
            json.dumps(kwargs)  # JSON only
            record.tasks.append((queue, name, kwargs))

    monkeypatch.setattr(dispatch, "current_app", App)
    monkeypatch.setattr("controlplane.deployments.tasks.reconcile.delay", record.reconciles.append)
    monkeypatch.setattr(dispatch.transaction, "on_commit", lambda fn, *a, **k: fn())
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
    """A StageStatus (contracts §3) for a stage row."""
    return {"stage_key": stage.stage_key, "deployment_id": stage.deployment_id, "replica": stage.replica,
            "stage_index": stage.stage_index, "state": state, "pid": pid, "exit_code": None, "restarts": 0,
            "message": "", "stats": {}, **extra}
