"""Writing and reading the stored telemetry rollups (see models.TelemetryRollup).

The hub closes the buckets (``schema.Rollup``); this module only stores and reads them.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections, transaction
from django.utils import timezone as dj_timezone

from controlplane.telemetry.models import TelemetryRollup
from controlplane.telemetry.schema import FIELDS, Rollup

COLUMNS = ("kind", "key", "bucket_start", "seconds", "samples", "mean", "peak")
# A write's rows: a few milliseconds of the server's CPU each (the ORM's conversion of every value
# holds the GIL), where an interval of 10,000 GPUs written at once took a quarter of a second from
# the event loop that serves the sockets, every interval.
ROWS_PER_WRITE = 500
# The writes of one interval are spread over this share of the rollup interval.
WRITES_SPREAD = 0.5


@transaction.atomic
def rollups_save(*, rollups: Iterable[Rollup]) -> int:
    """Store closed buckets (a bucket already stored is kept) and drop rows past the retention.

    One INSERT run once per row (``executemany``), not ``bulk_create``: at 10,000 GPUs a rollup
    interval closes 10,000 buckets, and the ORM compiling them into statements cost the server
    process a sixth of a core. In one transaction: outside one, every row is a commit of its own
    (SQLite's journal synced 10,000 times an interval, 14 s of the server's time at 10,000 GPUs)."""
    rows = [(r.kind, r.key, datetime.fromtimestamp(r.bucket_start, timezone.utc), r.seconds, r.samples,
             r.mean, r.peak) for r in rollups]
    if rows:
        _insert_new(rows)
    cutoff = dj_timezone.now() - timedelta(hours=settings.MOTLEY_TELEMETRY_RETENTION_HOURS)
    TelemetryRollup.objects.filter(bucket_start__lt=cutoff).delete()
    return len(rows)


def _insert_new(rows: list[tuple]) -> None:
    """``rows`` in ``COLUMNS`` order, each converted by its field as the ORM would; a bucket another
    process stored first is left as it is (``ON CONFLICT DO NOTHING``: SQLite and PostgreSQL)."""
    connection = connections[TelemetryRollup.objects.db]
    fields = [TelemetryRollup._meta.get_field(name) for name in COLUMNS]
    quote = connection.ops.quote_name
    statement = (f"INSERT INTO {quote(TelemetryRollup._meta.db_table)} "
                 f"({', '.join(quote(f.column) for f in fields)}) "
                 f"VALUES ({', '.join(['%s'] * len(fields))}) ON CONFLICT DO NOTHING")
    prepared = [[f.get_db_prep_value(v, connection) for f, v in zip(fields, row, strict=True)]
                for row in rows]
    with connection.cursor() as cursor:
        cursor.executemany(statement, prepared)


async def rollups_store(rollups: list[Rollup]) -> None:
    """The hub's async store: the writes run in a thread, off the event loop that serves sockets,
    ``ROWS_PER_WRITE`` at a time and spread over part of the interval, so that the thread never holds
    the GIL long enough to hold up the loop's sockets."""
    writes = range(0, len(rollups), ROWS_PER_WRITE)
    pause_s = settings.MOTLEY_TELEMETRY_ROLLUP_S * WRITES_SPREAD / len(writes) if writes else 0.0
    save = sync_to_async(rollups_save, thread_sensitive=False)
    for i, start in enumerate(writes):
        if i:
            await asyncio.sleep(pause_s)
        await save(rollups=rollups[start:start + ROWS_PER_WRITE])


def rollup_series(*, kind: str, keys: list[str] | None, window_s: int) -> dict[str, Any]:
    """Stored means as columns per key, like ``TelemetryHub.recent`` (time at the bucket's middle)."""
    since = dj_timezone.now() - timedelta(seconds=window_s)
    rows = TelemetryRollup.objects.filter(kind=kind, bucket_start__gte=since).order_by("key", "bucket_start")
    if keys:
        rows = rows.filter(key__in=keys)
    fields = FIELDS[kind]
    series: dict[str, Any] = {}
    for key, bucket, seconds, mean in rows.values_list("key", "bucket_start", "seconds", "mean"):
        columns = series.setdefault(key, {"t": []} | {f: [] for f in fields})
        columns["t"].append(bucket.timestamp() + seconds / 2)
        for f in fields:
            columns[f].append(mean.get(f))
    return series
