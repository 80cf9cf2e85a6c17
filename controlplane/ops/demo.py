"""The demo `make run` brings up: a generated model, local emulated agents, a planned deployment.

Each step is idempotent, so a second `make run` reuses the model, the nodes and the deployment
(its stages are restarted by the controller when the agents re-register).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model

from contracts.fleet_file import load_fleet_file
from contracts.hardware import FleetSpec
from controlplane.deployments.models import Deployment
from controlplane.deployments.revisions import plan_revision_create
from controlplane.deployments.services import deployment_create
from controlplane.enrollment.services import join_token_create
from controlplane.gateway.services import api_key_create
from controlplane.inventory.models import Node
from controlplane.inventory.services import fleet_import
from controlplane.models_catalog.models import LlmModel
from controlplane.models_catalog.services import model_register
from controlplane.planning import plan, plan_to_dict
from controlplane.plans.selectors import plan_request_from_inventory

DEMO_FLEET = settings.BASE_DIR / "examples" / "fleets" / "demo.yaml"
DEMO_DEPLOYMENT = "demo"
DEMO_KEY_NAME = "make-run demo"
# The demo workload: 16 concurrent chats of up to 2048 tokens (the demo model's context), one pipeline.
DEMO_REQUEST = {"batch": 16, "context": 2048, "replicas": 1}


@dataclass(frozen=True)
class DemoFleet:
    fleet: FleetSpec | None  # None: one node, this host's own GPUs (its agent discovers them through NVML)
    join_token: str
    incarnations: dict[str, int]  # node name -> incarnation before the agents started


def demo_model_ensure(*, path: Path) -> LlmModel:
    """Generate the demo checkpoint once (deterministic), and register it."""
    if not (path / "config.json").exists():
        subprocess.run([sys.executable, "-m", "worker_runtime.make_demo_model", str(path)], check=True)
    return model_register(path=path, name="motley-demo")


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
    """Plan the demo model on the demo nodes and deploy it, unless a demo deployment exists."""
    existing = Deployment.objects.filter(name=DEMO_DEPLOYMENT, stop_requested=False).first()
    if existing is not None:
        return existing
    node_ids = Node.objects.filter(name__in=demo.incarnations).values_list("pk", flat=True)
    request = plan_request_from_inventory(model=model, request=DEMO_REQUEST, node_ids=node_ids)
    revision = plan_revision_create(
        model=model, plan=plan_to_dict(plan(request)), request=DEMO_REQUEST, source="planner"
    )
    return deployment_create(name=DEMO_DEPLOYMENT, revision=revision)


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


def demo_api_key_ensure(*, path: Path) -> str:
    """An OpenAI API key for the local admin, written once to a file only the owner reads."""
    if path.exists():
        return path.read_text().strip()
    admin = get_user_model().objects.filter(is_superuser=True).order_by("pk").first()
    _, raw_key = api_key_create(user=admin, name=DEMO_KEY_NAME)
    path.write_text(raw_key + "\n")
    path.chmod(0o600)
    return raw_key
