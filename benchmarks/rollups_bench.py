"""The time of storing one rollup interval of a large fleet: ``rollups.rollups_save`` (one INSERT run once
per row, ``executemany``, in one transaction) side by side with the same statements committed row by
row (outside a transaction, as it ran before) and with the ORM's ``bulk_create``.

    .venv/bin/python benchmarks/rollups_bench.py [--gpus 10000] [--rounds 5]

A hub (controlplane/telemetry/hub.py) is fed 10 s of heartbeats of ``gpus / 8`` nodes
(``telemetry_sim.heartbeat``) and its closed buckets are stored, in turn by each way, into a fresh
test database of the configured kind (SQLite by default, in a file in WAL mode as the server keeps it;
PostgreSQL where ``DATABASE_URL`` says so), each round at a bucket time of its own so that every row is
new. Reported: wall time and CPU time of the storing process per interval, each way, and their ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from django.test.runner import DiscoverRunner  # noqa: E402

from benchmarks.telemetry_sim import heartbeat  # noqa: E402
from controlplane.telemetry.hub import TelemetryHub  # noqa: E402
from controlplane.telemetry.models import TelemetryRollup  # noqa: E402
from controlplane.telemetry.rollups import rollups_save  # noqa: E402
from controlplane.telemetry.schema import Rollup  # noqa: E402
from controlplane.telemetry.services import telemetry_message, telemetry_sample  # noqa: E402

ROLLUP_S = 10


def interval(gpus: int, start: float) -> list[Rollup]:
    """The buckets a hub closes for ``gpus`` GPUs reporting once a second over one rollup interval."""
    clock = [start]
    hub = TelemetryHub(rollup_s=ROLLUP_S, clock=lambda: clock[0])
    for second in range(ROLLUP_S):
        clock[0] = start + second
        for node in range(gpus // 8):
            beat = json.loads(heartbeat({"incarnation": 1}, 8, second))
            sample = telemetry_sample(node_id=node, node_name=f"node-{node}", heartbeat=beat,
                                      received_at=clock[0])
            hub.ingest(telemetry_message(sample))
    return hub.take_closed_rollups(flush_all=True)


def bulk_create(rollups: list[Rollup]) -> None:
    """The ORM's way, as ``rollups_save`` stored them before."""
    TelemetryRollup.objects.bulk_create([
        TelemetryRollup(kind=r.kind, key=r.key, seconds=r.seconds, samples=r.samples, mean=r.mean,
                        peak=r.peak, bucket_start=datetime.fromtimestamp(r.bucket_start, timezone.utc))
        for r in rollups], batch_size=500, ignore_conflicts=True)


def commit_per_row(rollups: list[Rollup]) -> None:
    """``rollups_save`` outside its transaction: every row of the ``executemany`` a commit of its own."""
    rollups_save.__wrapped__(rollups=rollups)


def spent_ms(store, rollups: list[Rollup]) -> tuple[float, float]:
    """Wall and CPU milliseconds of storing ``rollups``."""
    wall, cpu = time.perf_counter(), time.process_time()
    store(rollups)
    return (time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    folder = tempfile.TemporaryDirectory(prefix="rollups-bench-")
    if connection.vendor == "sqlite":  # a file, as the server's: Django's test default is in memory
        connection.settings_dict["TEST"]["NAME"] = f"{folder.name}/rollups-bench.sqlite3"
    runner = DiscoverRunner(verbosity=0, interactive=False)  # replaces one a killed run left
    databases = runner.setup_databases()
    ways = {"bulk_create": bulk_create, "a commit per row": commit_per_row,
            "rollups_save": lambda rows: rollups_save(rollups=rows)}
    try:
        template = interval(args.gpus, time.time() // ROLLUP_S * ROLLUP_S - 3600)
        spent: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
        for round_ in range(args.rounds):
            for offset, (name, store) in enumerate(ways.items()):
                shift = (len(ways) * round_ + offset + 1) * ROLLUP_S
                rows = [Rollup(r.kind, r.key, r.bucket_start + shift, r.seconds, r.samples, r.mean, r.peak)
                        for r in template]
                spent[name].append(spent_ms(store, rows))
        stored = TelemetryRollup.objects.count()
    finally:
        runner.teardown_databases(databases)
        folder.cleanup()
    medians = {name: [statistics.median(v[i] for v in values) for i in (0, 1)]
               for name, values in spent.items()}
    print(f"{connection.vendor}, {len(template)} buckets per interval, {args.rounds} rounds, "
          f"{stored} rows stored")
    for name, (wall, cpu) in medians.items():
        print(f"  {name}: median {wall:.0f} ms wall, {cpu:.0f} ms CPU per interval")
    ours = medians["rollups_save"]
    for name in ("a commit per row", "bulk_create"):
        wall, cpu = (ours[i] / medians[name][i] for i in (0, 1))
        print(f"  rollups_save / {name}: wall {wall:.2f}x, CPU {cpu:.2f}x")


if __name__ == "__main__":
    main()
