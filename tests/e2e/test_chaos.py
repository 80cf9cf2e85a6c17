"""Chaos under load, reduced (the whole run is benchmarks/chaos_bench.py): while clients
stream seeded chat requests, a stage process, an agent and the Celery worker are SIGKILLed in turn
(the test restarts the agent and the worker as a process supervisor would). Clients see no failed
request, the deployment is READY again each time without a human, no stage process outlives its
agent, and the database holds one deployment, revisions without gaps or repeats, and usage rows
equal to the requests the clients were answered. Service mode only (PostgreSQL + Redis); the shared
servers are never restarted here.
"""

from __future__ import annotations

import os
import time

import pytest

from benchmarks.chaos_bench import SupervisedSystem, deploy, inject, rows_check, service_env
from benchmarks.steady_clients import Outcome, SteadyClients
from tests.e2e.harness import stage_processes
from tests.support.processes import redis_address, redis_up

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def supervised_system(tmp_path):
    database_url = os.environ.get("DATABASE_URL", "")
    if not database_url.startswith(("postgres://", "postgresql://")) or not redis_up():
        pytest.skip("service mode: needs DATABASE_URL=postgres://… and a Redis server")
    # dbs 5 and 4: no other test uses them
    with service_env(tmp_path, database_url, redis_db=5, redis_address=redis_address()) as env:
        system = SupervisedSystem(workdir=tmp_path, env=env, restart_delay_s=1.0)
        try:
            system.start()
            yield system
        finally:
            system.stop()
            leftovers = stage_processes(tmp_path)
            for process in leftovers:
                process.kill()
            assert not leftovers, f"stage processes outlived the system: {[p.pid for p in leftovers]}"


def test_stage_agent_and_worker_killed_under_load_fail_no_request(supervised_system, demo_model):
    system = supervised_system
    pk, key = deploy(system, demo_model, layers=6)
    clients = SteadyClients(base_url=system.url, api_key=key, model="chaos", clients=2, interval_s=0.3)
    probes: list[Outcome] = []
    clients.start()
    results = []
    try:
        time.sleep(2)
        for fault in ("stage", "agent", "celery"):
            results.append(inject(system, pk, clients, fault, probes))
    finally:
        outcomes = clients.stop() + probes
    for result in results:
        print(result)
        assert result["failed"] == 0, f"{result}\n{system.logs()}"
        assert result["orphans"] == 0, result
        assert result["ok"] > 0, result
    assert system.restarts.get("celery") == 1 and system.deployment(pk)["status"] == "ready"
    time.sleep(1)  # the last requests' usage rows are written before their [DONE]; one poll of slack
    rows = rows_check(system, outcomes)
    assert rows["deployments"] == 1 and rows["revisions_lost_or_repeated"] == 0, rows
    assert rows["client_failed"] == 0, (rows, [(o.started, o.error) for o in outcomes if not o.ok])
    assert (rows["usage_requests"], rows["usage_tokens"], rows["usage_errors"]) == (
        len(outcomes), rows["client_tokens"], 0), rows
