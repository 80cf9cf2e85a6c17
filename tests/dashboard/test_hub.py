"""The telemetry hub: latest samples, history and rollups, fed what production publishes; the fields
it keeps are figures the agents and stages really send."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, fields
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from contracts.metrics import GPU_FIELDS, PREFIX_FIELDS, SPEC_FIELDS, STAGE_FIELDS, GpuMetrics
from contracts.stage_status import StageStatus
from controlplane.telemetry import rollups as rollups_module
from controlplane.telemetry.hub import TelemetryHub
from controlplane.telemetry.models import TelemetryRollup
from controlplane.telemetry.rollups import rollup_series, rollups_save, rollups_store
from controlplane.telemetry.services import telemetry_message, telemetry_sample
from worker_runtime.kv_cache import KVCache
from worker_runtime.speculation import Speculator
from worker_runtime.stats import StageStats
from worker_runtime.worker import StageWorker


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _gpu(util: float, temp: float = 50.0, index: int = 0) -> dict:
    """One GPU's metrics as an agent sends them (``asdict(GpuMetrics)``)."""
    return asdict(GpuMetrics(index=index, utilization_pct=util, memory_used_bytes=10, memory_total_bytes=100,
                             temperature_c=temp, power_w=100.0, power_limit_w=300.0, sm_clock_mhz=1410,
                             throttle_reasons=("sw_power_cap",), pcie_tx_bytes_per_s=1e9,
                             pcie_rx_bytes_per_s=2e9, nvlink_tx_bytes_per_s=3e9, nvlink_rx_bytes_per_s=4e9))


def _published(node, t, util, temp=50.0, stages=()):
    """The group message the agents' socket publishes for one heartbeat received at ``t``."""
    heartbeat = {"type": "heartbeat", "incarnation": 1, "seq": 1, "sent_at": t,
                 "devices": [_gpu(util, temp)], "stages": list(stages)}
    return telemetry_message(telemetry_sample(node_id=1, node_name=node, heartbeat=heartbeat, received_at=t))


def test_gpu_fields_are_figures_agents_send():
    assert set(GPU_FIELDS) <= {f.name for f in fields(GpuMetrics)}


def test_stage_fields_are_statistics_stages_report():
    """What a stage's worker reports (worker_runtime/worker.py), its prefix cache's figures included,
    and what a speculating head adds (worker_runtime/speculation.py)."""
    worker = StageWorker(SimpleNamespace(kv=KVCache(1, 1, 4, 64)), StageStats())
    stats = worker.snapshot(SimpleNamespace(bytes_sent=0, bytes_received=0, rejected=0))
    # the host tier's figure comes with a host tier, the spec_* ones from a speculating head
    assert set(STAGE_FIELDS) - {"prefix_host_blocks", *SPEC_FIELDS} <= set(stats)
    assert set(SPEC_FIELDS) == set(Speculator(ceiling=4).figures())


def _caching_stage_stats() -> dict:
    """A head's statistics as it reports them while it caches prefixes and speculates."""
    stats = StageStats().snapshot(kv_used=3, kv_free=5, bytes_sent=0, bytes_received=0)
    return {**stats, "prefix_queried_tokens": 400, "prefix_hit_tokens": 300, "prefix_cached_blocks": 7,
            "prefix_host_blocks": 2, "prefix_evicted_blocks": 1,
            "spec_drafts": 10, "spec_draft_tokens": 40, "spec_accepted_tokens": 25}  # a speculating head's


def test_every_kept_field_of_a_real_heartbeat_reaches_the_snapshot_and_history():
    hub = TelemetryHub(clock=Clock(1000.0))
    stats = _caching_stage_stats()
    stage = StageStatus(stage_key="d1-r0-s0", deployment_id=1, replica=0, stage_index=0, state="ready",
                        pid=42, stats=stats)
    hub.ingest(_published("a", 1000.0, 10.0, stages=[stage.to_json()]))
    snapshot = json.loads(hub.snapshot_text())
    device, kept_stage = snapshot["devices"]["a/gpu0"], snapshot["stages"]["d1-r0-s0"]
    assert set(GPU_FIELDS) <= set(device) and device["throttle"] == ["sw_power_cap"]
    assert set(STAGE_FIELDS) <= set(kept_stage) and kept_stage["state"] == "ready"
    assert all(v[0] is not None for v in hub.recent("device")["a/gpu0"].values())
    assert all(v[0] is not None for v in hub.recent("stage")["d1-r0-s0"].values())


def test_a_stage_that_caches_no_prefix_has_no_prefix_figures():
    hub = TelemetryHub(clock=Clock(1000.0))
    stats = StageStats().snapshot(kv_used=3, kv_free=5, bytes_sent=0, bytes_received=0)
    stage = StageStatus(stage_key="d1-r0-s0", deployment_id=1, replica=0, stage_index=0, state="ready",
                        pid=42, stats=stats)
    hub.ingest(_published("a", 1000.0, 10.0, stages=[stage.to_json()]))
    kept_stage = json.loads(hub.snapshot_text())["stages"]["d1-r0-s0"]
    assert not set(PREFIX_FIELDS) & set(kept_stage) and "kv_tokens_free" in kept_stage


def test_snapshot_holds_the_latest_sample_of_every_node():
    clock = Clock(1000.0)
    hub = TelemetryHub(clock=clock)
    hub.ingest(_published("a", 1000.0, 10.0))
    hub.ingest(_published("b", 1000.0, 20.0))
    assert json.loads(hub.snapshot_text())["devices"]["b/gpu0"]["utilization_pct"] == 20.0
    version = hub.version
    hub.ingest(_published("a", 1001.0, 30.0))  # one message per heartbeat: each one is news
    assert hub.version == version + 1 and hub.nodes["a"].version == hub.version
    assert hub.nodes["b"].version == version  # b sent nothing since
    assert len(hub.history[("device", "a/gpu0")]) == 2 and len(hub.history[("device", "b/gpu0")]) == 1
    assert json.loads(hub.snapshot_text())["devices"]["a/gpu0"]["utilization_pct"] == 30.0


def test_a_stage_its_node_no_longer_reports_goes_away_and_is_remembered_for_deltas():
    hub = TelemetryHub(clock=Clock(1000.0))
    stage = StageStatus(stage_key="d1-r0-s0", deployment_id=1, replica=0, stage_index=0,
                        state="ready").to_json()
    hub.ingest(_published("a", 1000.0, 10.0, stages=[stage]))
    hub.ingest(_published("a", 1001.0, 10.0))
    assert hub.stages == {} and [t[2:] for t in hub.tombstones] == [("a", "stages", "d1-r0-s0")]
    hub.clock.t += 61  # past TOMBSTONE_KEEP_S: forgotten, and deltas start after it
    hub.ingest(_published("a", hub.clock.t, 10.0))
    assert not hub.tombstones and hub.forgotten == 2


def test_malformed_samples_are_skipped():
    hub = TelemetryHub(clock=Clock(5.0))
    for message in ({"type": "telemetry.sample"}, {"type": "telemetry.sample", "sample": None},
                    {"type": "telemetry.sample", "sample": {"node": "a", "devices": [{"no_index": 1}, "junk"],
                                                            "stages": [{"state": "ready"}, None]}}):
        hub.ingest(message)
    assert hub.devices == {} and hub.stages == {}


def test_a_figure_that_is_not_a_finite_number_is_left_out_of_its_gpu():
    hub = TelemetryHub(clock=Clock(5.0))
    gpu = {**_gpu(50.0), "temperature_c": float("inf"), "power_w": "12.5", "memory_used_bytes": 10**400,
           "pcie_tx_bytes_per_s": "fast", "pcie_rx_bytes_per_s": None, "utilization_pct": 7}
    hub.ingest(telemetry_message(telemetry_sample(node_id=1, node_name="a", heartbeat={"devices": [gpu]},
                                                  received_at=5.0)))
    kept = hub.devices["a/gpu0"]
    assert kept["utilization_pct"] == 7.0 and kept["power_w"] == 12.5 and kept["memory_total_bytes"] == 100
    left_out = {"temperature_c", "memory_used_bytes", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"}
    assert not left_out & set(kept)


def test_history_keeps_only_the_window_and_rollups_close_per_bucket():
    clock = Clock(1000.0)
    hub = TelemetryHub(history_s=30, rollup_s=10, clock=clock)
    for i in range(40):  # one sample a second, 1000..1039
        clock.t = 1000.0 + i
        hub.ingest(_published("a", clock.t, float(i), temp=40.0 + i))
    recent = hub.recent("device", ["a/gpu0"])["a/gpu0"]
    assert recent["t"][0] == 1009.0 and recent["t"][-1] == 1039.0
    closed = hub.take_closed_rollups()
    assert [r.bucket_start for r in closed] == [1000.0, 1010.0, 1020.0]
    assert closed[0].samples == 10
    assert closed[0].mean["utilization_pct"] == 4.5 and closed[0].peak["temperature_c"] == 49.0
    assert hub.take_closed_rollups() == []
    assert [r.bucket_start for r in hub.take_closed_rollups(flush_all=True)] == [1030.0]


@pytest.mark.django_db
def test_rollups_are_stored_once_and_old_ones_dropped(settings):
    settings.MOTLEY_TELEMETRY_RETENTION_HOURS = 1
    clock = Clock(datetime.now(timezone.utc).timestamp())
    hub = TelemetryHub(rollup_s=10, clock=clock)
    for i in range(25):
        clock.t += 1
        hub.ingest(_published("a", clock.t, 50.0))
    rollups = hub.take_closed_rollups(flush_all=True)
    assert rollups_save(rollups=rollups) == len(rollups)
    rollups_save(rollups=rollups)  # another process's hub writing the same buckets
    assert TelemetryRollup.objects.count() == len(rollups)
    TelemetryRollup.objects.filter(pk=TelemetryRollup.objects.first().pk).update(
        bucket_start=datetime(2000, 1, 1, tzinfo=timezone.utc))
    rollups_save(rollups=[])
    assert TelemetryRollup.objects.count() == len(rollups) - 1
    series = rollup_series(kind="device", keys=["a/gpu0"], window_s=3600)["a/gpu0"]
    assert set(series["utilization_pct"]) == {50.0}


def _closed_rollups(nodes: int) -> list:
    clock = Clock(datetime.now(timezone.utc).timestamp())
    hub = TelemetryHub(rollup_s=10, clock=clock)
    for node in range(nodes):
        hub.ingest(_published(f"n{node}", clock.t, 50.0))
    return hub.take_closed_rollups(flush_all=True)


@pytest.mark.django_db(transaction=True)
def test_an_interval_of_rollups_is_stored_in_one_transaction_not_one_commit_per_row():
    """Outside a transaction every row of ``executemany`` commits on its own: at 10,000 GPUs SQLite
    synced its journal 10,000 times an interval, 14 s of the server's time."""
    from django.db import connection

    rollups, inserts = _closed_rollups(3), []

    def observe(execute, sql, params, many, context):
        if sql.startswith("INSERT"):
            inserts.append((many, connection.in_atomic_block))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(observe):
        assert rollups_save(rollups=rollups) == 3
    assert inserts == [(True, True)]
    assert TelemetryRollup.objects.count() == 3


@pytest.mark.django_db(transaction=True)
def test_a_large_interval_is_stored_in_paced_writes_of_a_few_rows(monkeypatch, settings):
    """Written at once, 10,000 rows held the GIL from the sockets' event loop for a quarter of a second."""
    settings.MOTLEY_TELEMETRY_ROLLUP_S = 1
    monkeypatch.setattr(rollups_module, "ROWS_PER_WRITE", 2)
    monkeypatch.setattr(rollups_module, "WRITES_SPREAD", 0.3)
    writes, real_save = [], rollups_module.rollups_save

    def save(*, rollups):
        writes.append(len(rollups))
        return real_save(rollups=rollups)

    monkeypatch.setattr(rollups_module, "rollups_save", save)
    rollups = _closed_rollups(5)
    loop = asyncio.new_event_loop()
    try:
        started = loop.time()
        loop.run_until_complete(rollups_store(rollups))
        elapsed = loop.time() - started
    finally:
        loop.close()
    assert writes == [2, 2, 1]
    assert elapsed >= 0.2  # two pauses of 0.1 s (0.3 s over three writes) between them
    assert TelemetryRollup.objects.count() == 5
