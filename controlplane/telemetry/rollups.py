"""Writing and reading the stored telemetry rollups (see models.TelemetryRollup).

The hub closes the buckets (``schema.Rollup``); this module only stores and reads them.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Iterable

from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone as dj_timezone

from controlplane.telemetry.models import TelemetryRollup
from controlplane.telemetry.schema import FIELDS, Rollup


def rollups_save(*, rollups: Iterable[Rollup]) -> int:
    """Store closed buckets (a bucket already stored is kept) and drop rows past the retention."""
    rows = [
        TelemetryRollup(kind=r.kind, key=r.key, seconds=r.seconds, samples=r.samples, mean=r.mean,
                        peak=r.peak, bucket_start=datetime.fromtimestamp(r.bucket_start, timezone.utc))
        for r in rollups
    ]
    TelemetryRollup.objects.bulk_create(rows, batch_size=500, ignore_conflicts=True)
    cutoff = dj_timezone.now() - timedelta(hours=settings.MOTLEY_TELEMETRY_RETENTION_HOURS)
    TelemetryRollup.objects.filter(bucket_start__lt=cutoff).delete()
    return len(rows)


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
