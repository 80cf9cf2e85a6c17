"""The latest-telemetry selector: what a heartbeat keeps, found by node, device and stage, with its age."""

from __future__ import annotations

import time

import pytest
from django.core.cache import cache

from controlplane.telemetry import selectors, services
from controlplane.telemetry.schema import NODES_KEY, stage_node_key
from controlplane.telemetry.selectors import Latest
from controlplane.telemetry.services import telemetry_keep, telemetry_sample


def stage(key: str, state: str = "ready", step_ms: float = 10.0) -> dict:
    d, r, s = (int(part[1:]) for part in key.split("-"))
    return {"stage_key": key, "deployment_id": d, "replica": r, "stage_index": s, "state": state,
            "pid": 7, "exit_code": None, "restarts": 0, "message": "", "stats": {"step_ms": step_ms}}


def keep(node: str, *, stages=(), devices=None, received_at: float | None = None, node_id: int = 1) -> dict:
    heartbeat = {"sent_at": 1.0, "devices": devices if devices is not None else [
        {"index": 0, "utilization_pct": 50.0}, {"index": 1, "utilization_pct": 70.0}],
        "stages": list(stages)}
    sample = telemetry_sample(node_id=node_id, node_name=node, heartbeat=heartbeat, received_at=received_at)
    telemetry_keep(sample)
    return sample


def test_a_kept_sample_is_read_back_by_node_device_and_stage():
    now = time.time()
    keep("n0", stages=[stage("d1-r0-s0")], received_at=now - 2)
    keep("n1", stages=[stage("d1-r0-s1", step_ms=30.0)], received_at=now - 1, node_id=2)
    assert [s["node"] for s in selectors.latest_samples()] == ["n0", "n1"]
    assert selectors.node_sample("n1").value["node_id"] == 2
    gpu = selectors.device_sample("n0/gpu1")
    assert gpu == Latest({"index": 1, "utilization_pct": 70.0}, "n0", now - 2)
    assert gpu.age_s(now) == pytest.approx(2.0)
    reading = selectors.stage_sample("d1-r0-s1")
    assert reading.node == "n1" and reading.value["stats"] == {"step_ms": 30.0}
    assert reading.value["state"] == "ready" and "pid" not in reading.value  # the telemetry part only
    assert set(selectors.stage_samples(deployment_id=1)) == {"d1-r0-s0", "d1-r0-s1"}
    assert selectors.stage_samples(deployment_id=2) == {}
    assert set(selectors.device_samples()) == {"n0/gpu0", "n0/gpu1", "n1/gpu0", "n1/gpu1"}
    assert selectors.device_sample("n0/gpu7") is None
    assert selectors.device_sample("n9/gpu0") is None and selectors.stage_sample("d9-r0-s0") is None


def test_the_latest_heartbeat_replaces_the_previous_one():
    keep("n0", stages=[stage("d1-r0-s0", step_ms=10.0)], received_at=100.0)
    keep("n0", stages=[stage("d1-r0-s0", step_ms=12.0)], received_at=101.0)
    assert len(selectors.latest_samples()) == 1
    reading = selectors.stage_sample("d1-r0-s0")
    assert reading.value["stats"] == {"step_ms": 12.0} and reading.received_at == 101.0


def test_age_and_staleness(settings):
    settings.MOTLEY_TELEMETRY_STALE_AFTER_S = 3.0
    reading = Latest({}, "n0", 1000.0)
    assert reading.age_s(1002.5) == 2.5 and not reading.stale(now=1002.5)
    assert reading.stale(now=1003.5)
    assert not reading.stale(now=1003.5, max_age_s=5.0)
    assert reading.age_s(999.0) == 0.0  # a clock step back never gives a negative age
    keep("n0", received_at=time.time() - 10)
    assert selectors.device_sample("n0/gpu0").stale()
    keep("n0")
    assert not selectors.device_sample("n0/gpu0").stale()


def test_a_sample_past_its_lifetime_is_gone(settings):
    settings.MOTLEY_TELEMETRY_SAMPLE_TTL_S = 0.2
    keep("n0", stages=[stage("d1-r0-s0")])
    assert selectors.node_sample("n0") is not None
    time.sleep(0.3)
    assert selectors.node_sample("n0") is None and selectors.stage_sample("d1-r0-s0") is None
    assert selectors.latest_samples() == []


def test_a_stage_reported_by_two_nodes_reads_as_the_one_serving():
    # Make before break: the old process drains on n0 while its replacement is ready on n1.
    keep("n1", stages=[stage("d1-r0-s0", "ready", step_ms=20.0)], node_id=2)
    keep("n0", stages=[stage("d1-r0-s0", "draining", step_ms=99.0)])  # indexed last
    assert cache.get(stage_node_key("d1-r0-s0")) == "n0"
    assert selectors.stage_sample("d1-r0-s0").node == "n1"
    assert selectors.stage_samples()["d1-r0-s0"].node == "n1"


def test_a_stage_that_moved_is_found_though_the_index_points_elsewhere():
    keep("n0", stages=[stage("d1-r0-s0")])
    keep("n1", stages=[stage("d1-r0-s0")], node_id=2)
    keep("n0", stages=[])  # n0 no longer runs it; the index still says n1 or n0, whichever wrote last
    cache.set(stage_node_key("d1-r0-s0"), "n0")
    assert selectors.stage_sample("d1-r0-s0").node == "n1"


def test_steady_heartbeats_write_one_key_and_a_lost_listing_heals(monkeypatch):
    keep("n0", stages=[stage("d1-r0-s0")])
    writes = []
    monkeypatch.setattr(cache, "set", lambda key, *a, **k: writes.append(key))
    monkeypatch.setattr(cache, "set_many", lambda values, *a, **k: writes.append(sorted(values)))
    heartbeat = {"stages": [stage("d1-r0-s0")]}
    telemetry_keep(telemetry_sample(node_id=1, node_name="n0", heartbeat=heartbeat), new_node=False)
    assert writes == [["telemetry:node:n0"]]
    monkeypatch.undo()
    cache.delete(NODES_KEY)  # two processes listed nodes at once and one write lost the other's
    monkeypatch.setattr(services, "REFRESH_S", 0.0)
    keep("n0")
    assert cache.get(NODES_KEY) == ["n0"]


def test_an_unreachable_cache_reads_as_no_telemetry_and_loses_only_the_sample(monkeypatch):
    def down(*args, **kwargs):
        raise ConnectionError("cache down")

    for name in ("get", "get_many", "set", "set_many"):
        monkeypatch.setattr(cache, name, down)
    keep("n0")  # no exception: the agents' socket goes on
    assert selectors.latest_samples() == [] and selectors.node_sample("n0") is None
    assert selectors.stage_sample("d1-r0-s0") is None
