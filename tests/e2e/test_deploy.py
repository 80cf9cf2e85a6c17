"""The whole path with real processes: a plan becomes stage processes serving tokens, a new revision
is handed over to a pipeline started beside the old one, and a node killed with SIGKILL is detected,
planned around and served again."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from contracts.sampling import SamplingParams
from contracts.tasks import CALIBRATE, NODE_HEALTH_CHECK, REBALANCE_EVALUATE, RECONCILE, RECONCILE_ALL
from controlplane.gateway.serving.pipeline_client import PipelineClient
from tests.e2e.harness import System, stage_processes, wait_until
from worker_runtime.chain import generate
from worker_runtime.stage import Stage

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
REQUEST = {"batch": 4, "context": 256, "replicas": 1}
PROMPT, MAX_TOKENS = [5, 6, 7, 8], 8


@pytest.fixture
def system_env(otlp) -> dict[str, str]:
    """Traced: every process's spans go to the test's receiver."""
    return otlp.env()


def assert_traced_with_its_task(otlp, route: str) -> None:
    """The API request whose route names ``route`` and the reconcile it sent are one trace: Django's
    server span its root, Celery's send of the task its child, the worker's run of it the send's child.
    The beat tasks and the reads (the test's polling GETs) began no trace."""
    def chain(spans):
        by_id = {s.span_id: s for s in spans}
        for run in (s for s in spans if s.name == f"run/{RECONCILE}"):
            send = by_id.get(run.parent_span_id)
            request = send and by_id.get(send.parent_span_id)
            if request and request.name.startswith("POST ") and route in request.name:
                return request, send, run
        return None

    request, send, run = chain(otlp.wait(lambda spans: chain(spans) is not None))
    assert request.parent_span_id == "" and send.name == f"apply_async/{RECONCILE}"
    assert request.trace_id == send.trace_id == run.trace_id
    assert (request.resource["motley.role"], run.resource["motley.role"]) == ("gateway", "worker")
    beat = {f"run/{name}" for name in (RECONCILE_ALL, NODE_HEALTH_CHECK, CALIBRATE, REBALANCE_EVALUATE)}
    assert not beat & {s.name for s in otlp.spans}
    assert not [s.name for s in otlp.spans if s.name.startswith("GET ")]


def three_stages(*bounds: int) -> dict:
    edges = [0, *bounds, 6]
    return {"replicas": [{"stages": [{"device": f"n{i}/gpu0", "layers": [edges[i], edges[i + 1]], "bits": 16}
                                     for i in range(3)]}]}


def reference(model) -> list[int]:
    torch.set_num_threads(1)
    stage = Stage.load(model, 0, 6, kv_tokens=1024)
    return generate([stage], [PROMPT], SamplingParams(), max_new_tokens=MAX_TOKENS)[0]


def tokens_through(system: System, deployment_id: int, head_stats: list | None = None) -> list[int]:
    """The greedy tokens of PROMPT through the deployment's replica; ``head_stats`` gets its head's
    statistics after them."""
    # READY means the replica's endpoint is ready: a coalesced heartbeat flush does not apply a stage
    # report older than the stage's last observation (stage_reports.py).
    (endpoint,) = system.endpoints(deployment_id)
    assert endpoint["ready"], endpoint

    async def run() -> list[int]:
        client = PipelineClient(endpoint["head_address"], endpoint["auth_token"], endpoint["pipeline_id"])
        async with client:
            # Every stage reported ready; the stages may still be connecting to each other.
            deadline = time.monotonic() + 20
            while not (health := await client.health())["ok"] and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert health["ok"], health
            stream = client.submit(PROMPT, SamplingParams(), max_tokens=MAX_TOKENS)
            tokens = [e.token_id async for e in stream]
            if head_stats is not None:
                head_stats.append((await client.stats())["stages"][0])
            return tokens

    return asyncio.run(run())


def registered(system: System, checkpoint, name: str) -> int:
    system.manage("register_model", str(checkpoint), "--name", name)
    return system.get(f"/api/v1/models/?name={name}")["results"][0]["id"]


def deploy(system: System, demo_model, agents=("n0", "n1", "n2"), cards: dict[str, int] | None = None,
           **options) -> int:
    model = registered(system, demo_model, "demo")
    system.start_agents(list(agents), cards=cards)
    body = {"name": "demo", "model": model, "plan": three_stages(2, 4), "request": REQUEST,
            "source": "edited", "speculation": "lookup", **options}
    response = system.post("/api/v1/deployments/", body)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def node_status(system: System, name: str) -> str:
    return {n["name"]: n["status"] for n in system.get("/api/v1/nodes/")["results"]}[name]


def pids(deployment: dict) -> dict[str, int]:
    return {s["stage_key"]: s["pid"] for s in deployment["stages"] if s["wanted"]}


def test_embedded_deploy_and_generate_and_refuse_bad_join_tokens(embedded_system, demo_model, draft_model,
                                                                  otlp):
    """The last stage a tensor-parallel group of n2's two cards (uneven shares of the demo's two kv heads
    and 128 MLP columns), and a draft model: deployed on the spare node, its pipeline linked from the
    head's spec, and its proposals verified by the pipeline with the tokens unchanged. The deployment's
    creation and the reconcile it sent through the filesystem broker are one trace."""
    system = embedded_system
    small = registered(system, draft_model, "demo-draft")
    plan = three_stages(2, 4)
    plan["replicas"][0]["stages"][2]["group"] = [
        {"device": "n2/gpu0", "kv_heads": 1, "columns": 96, "bits": 16},
        {"device": "n2/gpu1", "kv_heads": 1, "columns": 32, "bits": 16}]
    pk = deploy(system, demo_model, agents=("n0", "n1", "n2", "n3"), cards={"n2": 2}, plan=plan,
                speculation="draft", draft_model=small)
    deployment = system.wait_status(pk, "ready", 90)
    assert_traced_with_its_task(otlp, "deployments")
    (grouped,) = [s for s in deployment["stages"] if s["stage_index"] == 2 and s["wanted"]]
    assert [(r["kv_heads"], r["intermediate"]) for r in grouped["tensor_group"]] == [(1, 96), (1, 32)]
    draft = system.wait_status(deployment["draft_deployment"], "ready", 90)
    assert [s["node_name"] for s in draft["stages"]] == ["n3"]
    expected, head_stats = reference(demo_model), []
    for _ in range(10):  # the head's link to the draft pipeline comes up within its retry
        assert tokens_through(system, pk, head_stats) == expected
        if head_stats[-1]["spec_drafts"] > 0:
            break
    assert head_stats[-1]["spec_drafts"] > 0, head_stats[-1]

    # An agent with a wrong join token, then one with a revoked token, is refused and exits.
    system.revoke_join_token()
    for name, token in [("intruder", "mjt_wrong"), ("late", system.join_token)]:
        code = system.run_agent_until_exit(name, token, timeout_s=30)
        assert code != 0, name
    assert sorted(n["name"] for n in system.get("/api/v1/nodes/")["results"]) == ["n0", "n1", "n2", "n3"]


def test_service_deploy_move_a_boundary_and_survive_a_lost_node(service_system, demo_model, otlp):
    """A new revision handed over, a lost node planned around; the apply and the reconcile it sent
    through Redis are one trace."""
    system = service_system
    pk = deploy(system, demo_model)
    before = pids(system.wait_status(pk, "ready", 90))
    expected = reference(demo_model)
    assert tokens_through(system, pk) == expected

    # A new revision moving the boundary between stages 0 and 1: the emulated cards have room, so a new
    # pipeline r1 starts beside r0, which is stopped once r1 serves (docs/deployments.md, "Handover").
    body = {"plan": three_stages(3, 4), "request": REQUEST, "source": "edited"}
    response = system.post(f"/api/v1/deployments/{pk}/apply/", body)
    assert response.status_code == 200, response.text
    assert_traced_with_its_task(otlp, "apply")
    after = pids(wait_until(
        lambda: (d := system.deployment(pk))["status"] == "ready" and d["revision_number"] == 2
        and all(s["pid"] and s["wanted"] for s in d["stages"]) and not set(pids(d)) & set(before) and d,
        90, "revision 2 serving alone"))
    assert sorted(key.split("-", 1)[1] for key in after) == ["r1-s0", "r1-s1", "r1-s2"]
    assert tokens_through(system, pk) == expected

    # SIGKILL the agent of node n1: LOST, DEGRADED, re-planned on n0 and n2, serving again, no orphans.
    # n1's stage process, found by its working folder (one forked by the fork server has the server's
    # command line), not n1's fork server.
    victims = [p for p in stage_processes(system.workdir)
               if "/agents/n1/" in p.cwd() and "_fork_server" not in p.cwd()]
    assert len(victims) == 1
    system.kill("agent-n1")
    wait_until(lambda: node_status(system, "n1") == "lost", 20, "n1 lost")
    wait_until(lambda: system.deployment(pk)["revision_number"] == 3, 20, "re-plan")
    final = system.wait_status(pk, "ready", 90)
    assert all(s["node_name"] != "n1" for s in final["stages"])
    assert tokens_through(system, pk) == expected
    wait_until(lambda: not any(v.is_running() and v.status() != "zombie" for v in victims), 10,
               "n1's stage gone")
