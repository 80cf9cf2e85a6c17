"""Three hosts as three network namespaces (tests/support/netns.py): agents reach the control plane
over the network, stages listen and connect on their nodes' addresses, links are shaped to the fleet
file's network_gbps (scaled down), and the system deploys, generates the single-process model's
tokens, prices each hop as measured, and re-plans around a killed agent without failing a client's
request (docs/agents.md "Several hosts")."""

from __future__ import annotations

import time

import pytest

from benchmarks.netns_hops import measure_hop
from benchmarks.steady_clients import PROMPTS, SteadyClients, mismatches
from tests.e2e.test_deploy import REQUEST, reference, three_stages, tokens_through
from tests.e2e.test_handover import api_key, settled

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]
NODES = ["n0", "n1", "n2"]


def test_three_hosts_deploy_generate_price_hops_and_survive_a_lost_agent(netns_system, demo_model, capsys):
    system, net = netns_system, netns_system.network
    system.manage("register_model", str(demo_model), "--name", "demo")
    model = system.get("/api/v1/models/?name=demo")["results"][0]["id"]
    system.start_agents(NODES)
    nodes = {n["name"]: n["address"] for n in system.get("/api/v1/nodes/")["results"]}
    assert nodes == {f"n{k}": net.address(k) for k in range(3)}

    body = {"name": "demo", "model": model, "plan": three_stages(2, 4), "request": REQUEST,
            "source": "edited"}
    response = system.post("/api/v1/deployments/", body)
    assert response.status_code == 201, response.text
    pk = response.json()["id"]
    stages = sorted(system.wait_status(pk, "ready", 120)["stages"], key=lambda s: s["stage_index"])

    # Each stage listens on its own node's address (the next one's is where the previous one sends).
    assert [s["address"].rsplit(":", 1)[0] for s in stages] == [f"tcp://{net.address(k)}" for k in range(3)]
    (endpoint,) = system.endpoints(pk)
    assert endpoint["head_address"] == stages[0]["address"]
    assert tokens_through(system, pk) == reference(demo_model)

    # A prefill's activation across each hop of the plan, against the planner's price of that link.
    hops = [measure_hop(net, 0, 1, tokens=2048, hidden=64), measure_hop(net, 1, 2, tokens=2048, hidden=64)]
    with capsys.disabled():
        print("\n" + "\n".join(hop.line() for hop in hops))
    assert all(abs(hop.error) < 0.25 for hop in hops), [hop.line() for hop in hops]

    # SIGKILL n1's agent while clients stream through the gateway: re-planned on n0 and n2, no request fails.
    clients = SteadyClients(base_url=system.url, api_key=api_key(system), model="demo", clients=3)
    expected = {}
    for prompt in range(len(PROMPTS)):
        outcome = clients.one(prompt)
        assert outcome.ok, outcome.error
        expected[prompt] = outcome.text
    clients.start()
    try:
        time.sleep(2)
        system.kill("agent-n1")
        final = settled(system, pk, 2)
        assert "n1" not in {s["node_name"] for s in final["stages"]}
        time.sleep(2)
    finally:
        outcomes = clients.stop()
    failed = [o.error for o in outcomes if not o.ok]
    assert not failed, f"{len(failed)} of {len(outcomes)} requests failed: {failed[:5]}\n{system.logs()}"
    assert len(outcomes) > 10
    assert not mismatches(outcomes, expected)
