"""The emulated throttle knob through the real processes: an operator's ``emulate-throttle`` call on a
real control plane (daphne, embedded mode) reaches ``python -m agents run`` through the filesystem
broker, and the agent's next heartbeats carry the throttle, which the control plane observes as the
device's health; told 1.0, the card recovers the same way."""

from __future__ import annotations

import json
import signal
import subprocess

import httpx
import pytest

from tests.agents.helpers import daphne, wait_until
from tests.agents.test_agent_end_to_end import _agent, _join_token, _log
from tests.support.processes import REPO_ROOT, database_migrate, embedded_env, manage_argv

pytestmark = pytest.mark.slow


@pytest.fixture
def control_plane(tmp_path_factory):
    """daphne on a fresh embedded install where a throttle counts as sustained after 0.5 s, and an API
    token; yields (url, env, headers)."""
    var = tmp_path_factory.mktemp("var")
    env = {**embedded_env(var), "MOTLEY_NODE_LOST_AFTER_S": "600",
           "MOTLEY_DEVICE_THROTTLE_SUSTAINED_S": "0.5", "DJANGO_SUPERUSER_PASSWORD": "pw-not-used"}
    database_migrate(env)
    subprocess.run(manage_argv("createsuperuser", "--noinput", "--username", "op", "--email", "op@x.example"),
                   env=env, cwd=REPO_ROOT, check=True, capture_output=True)
    token = subprocess.run(manage_argv("create_api_token", "op"), env=env, cwd=REPO_ROOT, check=True,
                           capture_output=True, text=True).stdout.strip()
    with daphne(env) as url:
        yield url, env, {"Authorization": f"Token {token}"}


def test_a_throttle_sent_through_the_api_is_reported_by_the_agent_and_observed(control_plane, tiny_fleet,
                                                                                tmp_path):
    url, env, headers = control_plane
    state = tmp_path / "state"
    agent = _agent(url, env, _join_token(env), tiny_fleet, state, name="hot")
    api = httpx.Client(base_url=f"{url}/api/v1", headers=headers, timeout=10)

    def card() -> dict:
        devices = api.get("/devices/", params={"node_name": "hot"}).json()["results"]
        return next(d for d in devices if d["index"] == 1)

    try:
        wait_until(lambda: api.get("/nodes/", params={"name": "hot"}).json()["results"], timeout_s=20,
                   what="the agent registered")
        # Heartbeats have been observed: healthy, and the throttle file the stages would read is 1.0.
        wait_until(lambda: (state / "throttle" / "gpu1.json").exists(), timeout_s=10, what="throttle files")
        assert card()["observed_health"] == "healthy"
        response = api.post(f"/devices/{card()['id']}/emulate-throttle/", json={"factor": 0.5})
        assert response.status_code == 202, response.text
        hot = wait_until(lambda: (c := card())["observed_health"] == "degraded" and c, timeout_s=15,
                         what="the throttle reported in the heartbeats and observed")
        assert hot["health"] == "degraded" and "sw_thermal" in hot["health_reason"], hot
        assert json.loads((state / "throttle" / "gpu1.json").read_text()) == {"factor": 0.5}
        others = api.get("/devices/", params={"node_name": "hot"}).json()["results"]
        assert [d["observed_health"] for d in others if d["index"] != 1] == ["healthy"]  # only that card
        assert api.post(f"/devices/{hot['id']}/emulate-throttle/", json={"factor": 1}).status_code == 202
        recovered = wait_until(lambda: (c := card())["observed_health"] == "healthy" and c, timeout_s=15,
                               what="the card recovered")
        assert recovered["health_reason"] == ""
    finally:
        api.close()
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0, _log(state, "hot")
