"""Database states the dashboard tests start from, shared by fixtures and by the browser tests'
server process (run there with ``manage.py shell -c``)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from datetime import timedelta
from pathlib import Path

from tests.support.processes import REPO_ROOT

LAB_FLEET = REPO_ROOT / "examples" / "fleets" / "lab-3node.yaml"
LLAMA3_8B = REPO_ROOT / "examples" / "models" / "Llama-3-8B" / "config.json"
# As a revision stores it. No low-bit layers: Llama-3-8B then needs two cards on some replicas, so
# the topology shows pipelines and their bottlenecks (with the default budget each card holds one).
REQUEST = {"batch": 4, "context": 2048, "max_quantized": 0.0}
OPERATOR = ("operator", "correct horse battery")
ADMIN = ("admin", "staple battery horse")  # staff: reads the audit trail (lab_with_auditor)


def running_deployment_create(*, model, name: str = "chat", request: dict | None = None):
    """A READY deployment of the planner's plan for ``request`` (default ``REQUEST``), as the
    controller leaves one once its stages run."""
    from django.utils import timezone

    from controlplane.deployments.events import event_record
    from controlplane.deployments.models import Deployment, DeploymentPipeline, DeploymentStage, PlanRevision
    from controlplane.inventory.models import Device
    from controlplane.planning import plan, plan_to_dict
    from controlplane.plans.selectors import plan_request_from_inventory

    request = request or REQUEST
    planned = plan_to_dict(plan(plan_request_from_inventory(model=model, request=request)))
    deployment = Deployment.objects.create(name=name, model=model, status=Deployment.Status.READY)
    revision = PlanRevision.objects.create(
        model=model, deployment=deployment, number=1, plan=planned, request=request,
        source=PlanRevision.Source.PLANNER, status=PlanRevision.Status.APPLIED, applied_at=timezone.now(),
    )
    deployment.revision = revision
    deployment.save()
    devices = {d.name: d for d in Device.objects.select_related("node")}
    port = 5600
    for r, replica in enumerate(planned["replicas"]):
        DeploymentPipeline.objects.create(deployment=deployment, index=r, plan_replica=r,
                                          auth_token=f"token-{r}")
        for s, stage in enumerate(replica["stages"]):
            device = devices[stage["device"]]
            port += 1
            spec = {"layers": stage["layers"], "bits": stage["bits"], "head": f"tcp://127.0.0.1:{port - s}",
                    "listen": f"tcp://127.0.0.1:{port}", "kv_tokens": stage["kv_tokens"],
                    "batch": request["batch"]}
            DeploymentStage.objects.create(
                deployment=deployment, pipeline=r, plan_replica=r, stage_index=s, node=device.node,
                device=device, port=port, spec=spec, sent_spec=spec, state=DeploymentStage.State.READY,
            )
    # The events the controller records on the way (deployments/events.py).
    event_record(kind="applied", deployment=deployment, message="plan revision 1 applied (planner)",
                 detail={"revision": 1, "source": "planner"})
    event_record(kind="ready", deployment=deployment, message="plan revision 1 ready",
                 detail={"from": "deploying"})
    return deployment


def lab_with_deployment(*, cordoned: tuple[str, ...] = ()) -> dict:
    """Everything the browser tests need: the lab fleet registered by (simulated) agents, the model,
    a READY deployment (planned with the ``cordoned`` nodes cordoned) and an operator account.
    Returns what the simulated agents need to connect."""
    from contracts.fleet_file import load_fleet_file
    from controlplane.inventory.models import Node
    from controlplane.inventory.services import fleet_import
    from controlplane.models_catalog.services import model_register

    fleet_import(fleet=load_fleet_file(LAB_FLEET))
    agents = agents_register()
    model = model_register(path=_checkpoint_stand_in())
    Node.objects.filter(name__in=cordoned).update(intent=Node.Intent.CORDONED)
    deployment = running_deployment_create(model=model)
    operator_create()
    stages = [{"stage_key": s.stage_key, "node": s.node.name, "deployment_id": deployment.pk,
               "replica": s.pipeline,
               "stage_index": s.stage_index} for s in deployment.stages.select_related("node")]
    return {"agents": agents, "deployment_id": deployment.pk, "stages": stages}


def agents_register(names: tuple[str, ...] | None = None) -> list[dict]:
    """Register an agent for each of the named nodes (all: None) as it would, with the devices the
    inventory declares; returns what a simulated agent needs to connect."""
    from controlplane.enrollment.services import agent_register, join_token_create
    from controlplane.inventory.selectors import fleet_spec_from_inventory

    token = join_token_create(ttl=timedelta(hours=1)).secret
    agents = []
    for node in fleet_spec_from_inventory().nodes:
        if names is not None and node.name not in names:
            continue
        devices = [{k: v for k, v in dataclasses.asdict(d).items() if k not in ("name", "node", "down")}
                   for d in node.devices]
        registration = agent_register(join_token=token, name=node.name, address=node.address, emulated=True,
                                      devices=devices)
        agents.append({"node": node.name, "node_id": registration.node.pk,
                       "credential": registration.credential,
                       "incarnation": registration.incarnation, "gpus": len(node.devices)})
    return agents


def operator_create() -> None:
    """The ``OPERATOR`` account, in the operators' group, unless it exists."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from controlplane.common.permissions import OPERATORS_GROUP

    operator, created = get_user_model().objects.get_or_create(username=OPERATOR[0])
    if created:
        operator.set_password(OPERATOR[1])
        operator.save()
        operator.groups.add(Group.objects.get_or_create(name=OPERATORS_GROUP)[0])


# The generations a generated fleet cycles through: catalog model, generation label, network Gbit/s,
# whether a node's cards form an NVLink island.
GENERATIONS = (("H100-SXM", "h100", 400, True), ("A100-80GB-SXM", "a100", 200, True),
               ("L4", "ada", 100, False), ("V100-16GB", "volta", 50, True), ("T4", "turing", 25, False))


def scale_fleet(gpus: int) -> dict:
    """A fleet file's content with ``gpus`` emulated cards: nodes of eight (of two below 16 cards)
    cycling through five generations, eight nodes a rack, the cards of a node with NVLink one island.
    The shape of a cluster that grew a rack at a time, at any size."""
    per_node = 8 if gpus >= 16 else 2
    nodes = []
    for i in range(gpus // per_node):
        model, generation, gbps, nvlink = GENERATIONS[i % len(GENERATIONS)]
        nodes.append({"name": f"{generation}-{i:03d}", "network_gbps": gbps,
                      "labels": {"rack": f"r{i // 8}", "generation": generation},
                      "gpus": [{"model": model, "count": per_node, "nvlink": nvlink}]})
    return {"name": f"scale-{gpus}", "nodes": nodes}


def fleet_at_scale(gpus: int) -> dict:
    """The inventory replaced by ``scale_fleet(gpus)``, imported as ``manage.py import_fleet`` does,
    with its first node registered by an agent and the others declared (no agent), and the operator
    account. Returns the node names and the agent."""
    from django.conf import settings

    from contracts.fleet_file import load_fleet_file
    from controlplane.inventory.models import Node
    from controlplane.inventory.services import fleet_import

    Node.objects.all().delete()
    path = settings.VAR_DIR / f"scale-{gpus}.json"
    path.write_text(json.dumps(scale_fleet(gpus)))
    fleet = load_fleet_file(path)
    fleet_import(fleet=fleet)
    agents = agents_register(names=(fleet.nodes[0].name,))
    operator_create()
    return {"gpus": gpus, "nodes": [n.name for n in fleet.nodes], "agents": agents}


def scale_start() -> dict:
    """``fleet_at_scale`` at its smallest: four cards."""
    return fleet_at_scale(4)


def lab_with_auditor() -> dict:
    """``lab_with_deployment`` and a staff account (``ADMIN``), who alone reads the audit trail."""
    from django.contrib.auth import get_user_model

    seeded = lab_with_deployment()
    get_user_model().objects.create_user(username=ADMIN[0], password=ADMIN[1], is_staff=True)
    return seeded


def lab_with_proposal() -> dict:
    """``lab_with_deployment`` planned without node-a, applied an hour ago, and the rebalance
    policy's open proposal once node-a is schedulable again (a fleet change)."""
    import time

    from django.utils import timezone

    from controlplane.deployments.models import PlanRevision
    from controlplane.inventory.models import Node
    from controlplane.rebalance.services import rebalance_evaluate

    seeded = lab_with_deployment(cordoned=("node-a",))
    PlanRevision.objects.filter(deployment_id=seeded["deployment_id"]).update(
        applied_at=timezone.now() - timedelta(hours=1))
    rebalance_evaluate(deployment_id=seeded["deployment_id"], now=time.time())
    Node.objects.filter(name="node-a").update(intent=Node.Intent.SCHEDULABLE)
    assert rebalance_evaluate(deployment_id=seeded["deployment_id"], now=time.time() + 10) == "proposed"
    return seeded


# One stage of all 32 layers on a group of node-a's last two A100s (one NVLink island), Llama-3-8B's 8
# key-value heads and 14336 MLP columns split evenly.
GROUP_STAGE = {"device": "node-a/gpu2", "layers": [0, 32], "bits": 16, "group": [
    {"device": "node-a/gpu2", "kv_heads": 4, "columns": 7168, "bits": 16},
    {"device": "node-a/gpu3", "kv_heads": 4, "columns": 7168, "bits": 16}]}


def stopped_group_deployment_create(*, name: str = "tp-chat") -> int:
    """A stopped deployment of the lab's model whose applied plan holds a tensor-parallel group
    (``GROUP_STAGE``), priced by the planner's check: what the plan editor shows a group with. The
    revision is written directly, as ``running_deployment_create`` writes its own: a deployment refuses
    to apply a group until the stage runtime serves them. No stage rows: nothing runs."""
    from django.utils import timezone

    from controlplane.deployments.models import Deployment, PlanRevision
    from controlplane.models_catalog.models import LlmModel
    from controlplane.planning import check, plan_to_dict
    from controlplane.plans.selectors import plan_request_from_inventory

    model = LlmModel.objects.get()
    request = {**REQUEST, "replicas": 1}
    problems, priced = check({"replicas": [{"stages": [GROUP_STAGE]}]},
                             plan_request_from_inventory(model=model, request=request))
    assert not problems, problems
    deployment = Deployment.objects.create(name=name, model=model, status=Deployment.Status.STOPPED)
    deployment.revision = PlanRevision.objects.create(
        model=model, deployment=deployment, number=1, plan=plan_to_dict(priced), request=request,
        source=PlanRevision.Source.PLANNER, status=PlanRevision.Status.APPLIED, applied_at=timezone.now(),
    )
    deployment.save()
    return deployment.pk


def stopped_degraded_deployment_create(*, name: str = "int8-chat") -> int:
    """A stopped deployment whose applied revision a re-plan after a loss planned on the operator's
    emergency quality budget (degrade.py): 2 of the 4 sequences asked, int8 allowed within a summed
    KL of 0.5 (the model's int8 KL set here, 0.001 a layer). No stage rows: nothing runs."""
    from django.utils import timezone

    from controlplane.deployments.models import Deployment, PlanRevision
    from controlplane.models_catalog.models import LlmModel
    from controlplane.planning import plan, plan_to_dict
    from controlplane.plans.selectors import plan_request_from_inventory

    model = LlmModel.objects.get()
    model.profile = {**model.profile, "sensitivity": {"8": [0.001] * model.num_layers}}
    model.save(update_fields=["profile"])
    request = {**REQUEST, "batch": 2, "bits": [16, 8], "quality": {"max_kl": 0.5}}
    planned = plan_to_dict(plan(plan_request_from_inventory(model=model, request=request)))
    deployment = Deployment.objects.create(name=name, model=model, status=Deployment.Status.STOPPED,
                                           emergency_max_kl=0.5)
    deployment.revision = PlanRevision.objects.create(
        model=model, deployment=deployment, number=1, plan=planned, request=request, degraded_from=REQUEST,
        source=PlanRevision.Source.REPLAN, status=PlanRevision.Status.APPLIED, applied_at=timezone.now(),
    )
    deployment.save()
    return deployment.pk


def _checkpoint_stand_in() -> Path:
    """Llama-3-8B's config beside an empty ``model.safetensors``: deployable as far as the control
    plane can tell (it never opens weights; agents do), so applying a plan works. No agent runs
    here, so nothing ever tries to load it."""
    from django.conf import settings

    directory = settings.VAR_DIR / "models" / "Llama-3-8B"
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(LLAMA3_8B, directory / "config.json")
    (directory / "model.safetensors").touch()
    return directory


if __name__ == "__main__":
    print(json.dumps(lab_with_deployment()))


def demand_proposal_create(deployment_id: int) -> dict:
    """The rebalance policy's demand proposal of one replica more for the deployment, made by its own
    passes as ``tests/rebalance/test_demand.py`` drives them: a TTFT target of 400 ms at p95 (the other
    targets as a new deployment's, up to 8 replicas), and a gateway
    publishing 95 % of the applied plan's capacity at a p95 TTFT of 900 ms over 70 s. Returns the
    proposal's forecast."""
    import time

    from controlplane.deployments.models import Deployment
    from controlplane.rebalance.demand import sample_publish
    from controlplane.rebalance.models import RebalanceProposal
    from controlplane.rebalance.services import rebalance_evaluate

    Deployment.objects.filter(pk=deployment_id).update(
        ttft_target_ms=400, tpot_target_ms=None, target_percentile=95, target_window_s=300, min_replicas=1,
        max_replicas=8)
    deployment = Deployment.objects.select_related("revision").get(pk=deployment_id)
    capacity = deployment.revision.plan["predicted"]["decode_tokens_per_s"]
    t0 = time.time()
    for s in range(0, 80, 10):
        sample_publish(deployment_id=deployment_id, process="seed", sample={
            "at": t0 + s, "arrival_rate": 0.95 * capacity / 100, "output_tokens_per_s": 0.95 * capacity,
            "ttft_p95_ms": 900.0})
        rebalance_evaluate(deployment_id=deployment_id, now=t0 + s)
    return RebalanceProposal.objects.get(deployment_id=deployment_id, trigger="demand",
                                         status=RebalanceProposal.Status.OPEN).forecast
