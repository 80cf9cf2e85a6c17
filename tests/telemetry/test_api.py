"""GET /api/v1/telemetry/: the latest sample of every node with its age, for authenticated callers."""

from __future__ import annotations

import time

from controlplane.telemetry.services import telemetry_keep, telemetry_sample
from tests.api.mixins import assert_error

URL = "/api/v1/telemetry/"


def keep(node: str, received_at: float) -> None:
    heartbeat = {"sent_at": received_at, "devices": [{"index": 0, "utilization_pct": 40.0}], "stages": []}
    telemetry_keep(telemetry_sample(node_id=1, node_name=node, heartbeat=heartbeat, received_at=received_at))


def test_anonymous_callers_are_refused(anonymous):
    assert_error(anonymous.get(URL), 401, "credentials were not provided")


def test_every_nodes_latest_sample_with_its_age(api, settings):
    settings.MOTLEY_TELEMETRY_STALE_AFTER_S = 3.0
    now = time.time()
    keep("n1", now - 10)
    keep("n0", now - 1)
    body = api.get(URL).json()
    assert body["stale_after_s"] == 3.0
    assert [(n["node"], n["stale"]) for n in body["nodes"]] == [("n0", False), ("n1", True)]
    assert 0.9 <= body["nodes"][0]["age_s"] < 2 and body["nodes"][0]["devices"][0]["utilization_pct"] == 40.0
    assert [n["node"] for n in api.get(URL, {"node": "n1"}).json()["nodes"]] == ["n1"]
    assert api.get(URL, {"node": "n9"}).json()["nodes"] == []
