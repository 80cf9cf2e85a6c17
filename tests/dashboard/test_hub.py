"""The telemetry hub: latest samples, repeated samples not counted twice, history and rollups."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from controlplane.telemetry.hub import TelemetryHub
from controlplane.telemetry.models import TelemetryRollup
from controlplane.telemetry.rollups import rollup_series, rollups_save


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _published(*samples):
    return {"type": "telemetry.snapshot", "snapshot": {"nodes": list(samples)}}


def _sample(node, t, util, temp=50.0):
    return {"node": node, "received_at": t, "sent_at": t, "devices": [
        {"index": 0, "utilization_pct": util, "temperature_c": temp, "memory_used_bytes": 10,
         "memory_total_bytes": 100},
    ], "stages": []}


def test_snapshot_holds_the_latest_sample_and_is_rendered_once_per_change():
    clock = Clock(1000.0)
    hub = TelemetryHub(clock=clock)
    hub.ingest(_published(_sample("a", 1000.0, 10.0), _sample("b", 1000.0, 20.0)))
    text = hub.snapshot_text()
    assert hub.snapshot_text() is text
    assert json.loads(text)["devices"]["b/gpu0"]["utilization_pct"] == 20.0
    version = hub.version
    # The next publication repeats b's unchanged sample: nothing about b is recorded again.
    hub.ingest(_published(_sample("a", 1001.0, 30.0), _sample("b", 1000.0, 20.0)))
    assert hub.version == version + 1
    assert len(hub.history[("device", "b/gpu0")]) == 1
    assert json.loads(hub.snapshot_text())["devices"]["a/gpu0"]["utilization_pct"] == 30.0


def test_malformed_samples_are_skipped():
    hub = TelemetryHub(clock=Clock(5.0))
    hub.ingest({"snapshot": {"nodes": [None, {"node": "a", "devices": [{"no_index": 1}, "junk"],
                                              "stages": [{"state": "ready"}]}]}})
    assert hub.devices == {} and hub.stages == {}


def test_history_keeps_only_the_window_and_rollups_close_per_bucket():
    clock = Clock(1000.0)
    hub = TelemetryHub(history_s=30, rollup_s=10, clock=clock)
    for i in range(40):  # one sample a second, 1000..1039
        clock.t = 1000.0 + i
        hub.ingest(_published(_sample("a", clock.t, float(i), temp=40.0 + i)))
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
    settings.TELEMETRY_RETENTION_S = 3600
    clock = Clock(datetime.now(timezone.utc).timestamp())
    hub = TelemetryHub(rollup_s=10, clock=clock)
    for i in range(25):
        clock.t += 1
        hub.ingest(_published(_sample("a", clock.t, 50.0)))
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
