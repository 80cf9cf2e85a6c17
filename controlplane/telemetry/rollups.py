"""Writing and reading the stored telemetry rollups (see models.TelemetryRollup).

The hub closes the buckets (``schema.Rollup``); this module only stores and reads them.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Iterable

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections
from django.utils import timezone as dj_timezone

from controlplane.telemetry.models import TelemetryRollup
from controlplane.telemetry.schema import FIELDS, Rollup

COLUMNS = ("kind", "key", "bucket_start", "seconds", "samples", "mean", "peak")


def rollups_save(*, rollups: Iterable[Rollup]) -> int:
    """Store closed buckets (a bucket already stored is kept) and drop rows past the retention.

    One INSERT run once per row (``executemany``), not ``bulk_create``: at 10,000 GPUs a rollup
    interval closes 10,000 buckets, and the ORM compiling them into statements cost the server
    process a sixth of a core."""
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
    """The hub's async store: the write runs in a thread, off the event loop that serves sockets."""
    await sync_to_async(rollups_save, thread_sensitive=False)(rollups=rollups)


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
