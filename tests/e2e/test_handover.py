"""Live re-placement with real processes: while clients stream seeded chat requests through the
gateway without pause, a boundary move, a stage moved to another device, a node drain and a SIGKILL
of one agent each end with zero failed requests, and every answer equals the one the same request got
before anything changed (docs/deployments.md "Handover", docs/gateway.md "Request migration").

Service mode runs on cards with room for the new stages beside the old (make before break); the
embedded default on cards too small for both (the handover happens in place).
"""

from __future__ import annotations

import time

import httpx
import pytest

from benchmarks.steady_clients import PROMPTS, SteadyClients, mismatches
from tests.e2e.harness import System, embedded_system_at, running, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]
REQUEST = {"batch": 4, "context": 256, "replicas": 1}
DEGRADING = {"batch": 8, "context": 256, "replicas": 1}  # two 0.397 GiB cards hold its KV, one only 6
NODES = ["n0", "n1", "n2", "n3"]


def plan(devices: list[str], bounds: tuple[int, int]) -> dict:
    edges = [0, *bounds, 6]
    return {"replicas": [{"stages": [{"device": f"{d}/gpu0", "layers": [edges[i], edges[i + 1]], "bits": 16}
                                     for i, d in enumerate(devices)]}]}


def deploy(system: System, demo_model, overrides: str, nodes: list[str] = NODES,
           request: dict = REQUEST) -> int:
    system.manage("register_model", str(demo_model), "--name", "demo")
    model = system.get("/api/v1/models/?name=demo")["results"][0]["id"]
    system.start_agents(nodes, overrides=overrides)
    body = {"name": "demo", "model": model, "plan": plan(["n0", "n1", "n2"], (2, 4)), "request": request,
            "source": "edited"}
    response = system.post("/api/v1/deployments/", body)
    assert response.status_code == 201, response.text
    pk = response.json()["id"]
    system.wait_status(pk, "ready", 90)
    return pk


def settled(system: System, pk: int, revision: int) -> dict:
    """The deployment once ``revision`` serves alone: READY, every replica serving, nothing retired left."""
    def done():
        d = system.deployment(pk)
        return (d["status"] == "ready" and d["revision_number"] == revision
                and all(s["wanted"] and s["state"] == "ready" for s in d["stages"])
                and all(p["phase"] == "serving" for p in d["pipelines"]) and d)
    try:
        return wait_until(done, 180, f"revision {revision} serving alone")
    except AssertionError:
        raise AssertionError(f"{system.deployment(pk)}\n{system.logs()}") from None


def node_id(system: System, name: str) -> int:
    return next(n["id"] for n in system.get("/api/v1/nodes/")["results"] if n["name"] == name)


def api_key(system: System) -> str:
    return system.manage("create_api_key", "admin", "--name", "handover").strip().split()[-1]


def seeded_answers(clients: SteadyClients) -> dict[int, str]:
    """Each prompt's seeded answer once, with nothing changing."""
    expected = {}
    for prompt in range(len(PROMPTS)):
        outcome = clients.one(prompt)
        assert outcome.ok, outcome.error
        expected[prompt] = outcome.text
    return expected


def run_changes(system: System, demo_model, overrides: str) -> None:
    pk = deploy(system, demo_model, overrides)
    clients = SteadyClients(base_url=system.url, api_key=api_key(system), model="demo", clients=3)
    expected = seeded_answers(clients)
    clients.start()
    marks: list[tuple[str, float]] = []
    try:
        time.sleep(2)
        changes = [
            ("boundary move", lambda: system.post(f"/api/v1/deployments/{pk}/apply/", {
                "plan": plan(["n0", "n1", "n2"], (3, 4)), "request": REQUEST, "source": "edited"})),
            ("stage to another device", lambda: system.post(f"/api/v1/deployments/{pk}/apply/", {
                "plan": plan(["n0", "n3", "n2"], (3, 4)), "request": REQUEST, "source": "edited"})),
            ("drain", lambda: system.post(f"/api/v1/nodes/{node_id(system, 'n3')}/drain/")),
        ]
        revision = 1
        for name, change in changes:
            marks.append((name, time.monotonic()))
            response = change()
            assert response.status_code == 200, f"{name}: {response.text}\n{system.logs()}"
            revision += 1
            final = settled(system, pk, revision)
            time.sleep(1)
        used = {s["node_name"] for s in final["stages"]}
        victim = sorted(used - {"n0"} or used)[0]  # an agent carrying a stage, if possible not the head's
        marks.append(("kill -9 agent", time.monotonic()))
        system.kill(f"agent-{victim}")
        revision += 1
        final = settled(system, pk, revision)
        assert victim not in {s["node_name"] for s in final["stages"]}
        time.sleep(2)
    finally:
        outcomes = clients.stop()
        ends = [at for _, at in marks[1:]] + [time.monotonic()]
        for (name, start), end in zip(marks, ends):
            print(f"{name}: {clients.window(start, end).line()}")
    failed = [o.error for o in outcomes if not o.ok]
    assert not failed, f"{len(failed)} of {len(outcomes)} requests failed: {failed[:5]}\n{system.logs()}"
    assert len(outcomes) > 20
    assert not mismatches(outcomes, expected)


@pytest.fixture
def system_env(otlp) -> dict[str, str]:
    """A receiver's endpoint for every process, but no ``OTEL_TRACES_EXPORTER``: tracing is off."""
    return {name: value for name, value in otlp.env().items() if name != "OTEL_TRACES_EXPORTER"}


def test_service_changes_under_load_fail_no_request(service_system, demo_model):
    run_changes(service_system, demo_model, overrides="{}")


def test_embedded_in_place_changes_under_load_fail_no_request(embedded_system, demo_model, otlp):
    # 0.397 GiB leaves about 2.2 MiB usable past the reserve (contracts/footprint.py: 5 % + 384 MiB):
    # room for the whole demo-6 model as one stage (2.0 MiB at this workload) but not for a changed
    # stage beside the one it replaces (1.1 + 1.3 MiB), so each handover is in place.
    run_changes(embedded_system, demo_model, overrides="{memory_gib: 0.397}")
    # Tracing off: the applies, the tasks they sent, the requests and the stages exported no span.
    assert not otlp.spans


def test_embedded_lost_stage_with_no_free_card_is_taken_by_its_neighbour(tmp_path, demo_model):
    """Every card in use (three nodes, three stages): the last stage's agent is SIGKILLed and its layers
    go to the stage before it, which loads only those in place (planning.repair): no failed request,
    the same seeded answers, two stages after. At the default MOTLEY_REPLAN_KEEP_WITHIN the planner's
    fresh plan wins here (the whole tiny model on one card: a hop costs more than its layers), so the
    operator's setting that keeps placements unless a fresh plan is far better is used.

    Then the next agent is SIGKILLed: the card left holds 6 of the 8 sequences asked, so the re-plan
    degrades (degrade.py) and serves on, no request failing; n2's agent back, the full plan is
    restored. With every agent gone nothing can serve, and the gateway says so at once: 503 with
    Retry-After, no wait."""
    with running(embedded_system_at(tmp_path, MOTLEY_REPLAN_KEEP_WITHIN="2")) as system:
        repaired_under_load(system, demo_model)


def repaired_under_load(system: System, demo_model) -> None:
    pk = deploy(system, demo_model, "{memory_gib: 0.397}", nodes=NODES[:3], request=DEGRADING)
    key = api_key(system)
    clients = SteadyClients(base_url=system.url, api_key=key, model="demo", clients=3)
    expected = seeded_answers(clients)
    clients.start()
    try:
        time.sleep(2)
        system.kill("agent-n2")
        repaired = settled(system, pk, 2)
        time.sleep(2)
        one_card = time.monotonic()
        system.kill("agent-n1")
        degraded = settled(system, pk, 3)
        on_one_card = time.monotonic()
        time.sleep(1)
    finally:
        outcomes = clients.stop()
    degraded_answers = seeded_answers(clients)
    revisions = {r["number"]: r for r in system.get(f"/api/v1/deployments/{pk}/revisions/")}
    explanation = revisions[2]["plan"]["explanation"][0]
    assert explanation.startswith("repaired the applied plan: replica 0 stage 2 (layers 4-5, on n2/gpu0) "
                                  "taken by its neighbours: layers 4-5 by n1/gpu0"), explanation
    assert sorted((s["node_name"], s["stage_index"]) for s in repaired["stages"]) == [("n0", 0), ("n1", 1)]
    failed = [o.error for o in outcomes if not o.ok]
    assert not failed and len(outcomes) > 10, f"{failed[:5]} of {len(outcomes)}\n{system.logs()}"
    # The whole model in one stage can sample another token for a seeded prompt than the same model split
    # (seen for one prompt of six): the answers served on one card are held to those it gives alone.
    assert not mismatches([o for o in outcomes if o.ended < one_card], expected)
    assert not mismatches([o for o in outcomes if o.started > on_one_card], degraded_answers)
    print(f"serving on one card {on_one_card - one_card:.1f} s after the kill")
    # n0 alone holds 6 sequences of 256 tokens (degrade.py): served, and said so.
    assert revisions[2]["degraded_from"] is None and revisions[3]["degraded_from"] == DEGRADING
    assert degraded["degraded"] == {"planned": {"batch": 6, "context": 256, "replicas": 1},
                                    "asked": {"batch": 8, "context": 256, "replicas": 1}, "precision": None}
    assert {s["node_name"] for s in degraded["stages"]} == {"n0"}
    (event,) = system.get(f"/api/v1/events/?deployment={pk}&kind=degraded_plan")["results"]
    assert event["detail"]["planned"] == {"batch": 6, "context": 256, "replicas": 1}

    back = time.monotonic()  # n2's agent back: two cards hold the full workload, which is restored
    system.start_agent("n2")
    restored = settled(system, pk, 4)
    print(f"full plan restored {time.monotonic() - back:.1f} s after n2's agent started")
    assert time.monotonic() - back < 60 and restored["degraded"] is None
    assert {s["node_name"] for s in restored["stages"]} == {"n0", "n2"}
    assert system.get(f"/api/v1/events/?deployment={pk}&kind=restored")["count"] == 1
    assert clients.one(1).text == expected[1]

    for name in ("n0", "n2"):  # no card left: nothing to plan on, nothing is coming
        system.kill(f"agent-{name}")
    wait_until(lambda: "re-plan failed" in system.deployment(pk)["status_message"], 30, "re-plan failed")
    refused = wait_until(lambda: refusal(system, key), 30, "the gateway's 503")
    assert refused.elapsed.total_seconds() < 2, refused.elapsed
    assert int(refused.headers["Retry-After"]) >= 1 and "cannot be served now" in refused.text


def refusal(system: System, key: str):
    """A chat request's response when it is a 503 (the gateway knows nothing can serve), else None."""
    response = httpx.post(f"{system.url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                          json={"model": "demo", "messages": [{"role": "user", "content": "hi"}],
                                "max_tokens": 4}, timeout=5)
    return response if response.status_code == 503 else None
