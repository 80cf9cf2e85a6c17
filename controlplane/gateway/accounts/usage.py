"""Usage per API key, user and model in minute buckets: the one writer and the readers.

``usage_record`` is called once per request, at its end (completed, failed, cancelled) or at its
refusal, with the tokens the gateway served: the prompt of a request that reached a replica and the
completion tokens it sent, the same figures its answer's ``usage`` carries. It adds them to the row of
(key, model, minute of admission) with ``UPDATE … SET n = n + …`` (F expressions), creating the row
when there is none; two processes creating the same row at once meet the unique constraint and the
loser adds with an update, so no count is lost on PostgreSQL or SQLite.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import IntegrityError, transaction
from django.db.models import F, Q, QuerySet, Sum
from django.db.models.functions import Trunc

from controlplane.gateway.models import UsageBucket

COUNTS = ("requests", "prompt_tokens", "completion_tokens", "errors", "refused")
BUCKETS = ("minute", "hour", "day")
GROUPS = {  # group_by -> the fields a row is grouped by (the first identifies the group)
    "key": ("api_key", "api_key__name", "api_key__prefix", "user__username"),
    "user": ("user", "user__username"),
    "model": ("model",),
}


def usage_record(
    *, api_key_id: int, user_id: int, model: str, at: datetime, requests: int = 0, prompt_tokens: int = 0,
    completion_tokens: int = 0, errors: int = 0, refused: int = 0,
) -> None:
    """Add one request's figures to its key's row of ``model`` in the minute of ``at``."""
    counts = {"requests": requests, "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
              "errors": errors, "refused": refused}
    counts = {name: value for name, value in counts.items() if value}
    if not counts:
        return
    lookup = {"api_key_id": api_key_id, "model": model,
              "bucket_start": at.astimezone(UTC).replace(second=0, microsecond=0)}
    increments = {name: F(name) + value for name, value in counts.items()}
    if UsageBucket.objects.filter(**lookup).update(**increments):
        return
    try:
        with transaction.atomic():
            UsageBucket.objects.create(**lookup, user_id=user_id, **counts)
    except IntegrityError:  # another process created the row since: add to it
        UsageBucket.objects.filter(**lookup).update(**increments)


def usage_tokens(*, api_key_id: int, since: datetime) -> int:
    """Prompt + completion tokens the key was served in requests admitted since ``since``."""
    sums = UsageBucket.objects.filter(api_key_id=api_key_id, bucket_start__gte=since).aggregate(
        p=Sum("prompt_tokens"), c=Sum("completion_tokens"))
    return (sums["p"] or 0) + (sums["c"] or 0)


def usage_buckets(
    *, since: datetime, until: datetime, user_id: int | None = None, api_key_id: int | None = None,
    model: str | None = None,
) -> QuerySet[UsageBucket]:
    """The minute rows in [since, until), of one user's keys when ``user_id`` is given."""
    rows = UsageBucket.objects.filter(bucket_start__gte=since, bucket_start__lt=until)
    filters = Q()
    if user_id is not None:
        filters &= Q(user_id=user_id)
    if api_key_id is not None:
        filters &= Q(api_key_id=api_key_id)
    if model:
        filters &= Q(model=model)
    return rows.filter(filters)


def _row(values: dict, group_by: str) -> dict:
    fields = GROUPS[group_by]
    counts = {name: values[name] or 0 for name in COUNTS}
    row = {"group": _label(values, group_by), "id": values[fields[0]], **counts,
           "total_tokens": counts["prompt_tokens"] + counts["completion_tokens"]}
    if group_by == "key":
        row["user"] = values["user__username"]
    return row


def _label(values: dict, group_by: str) -> str:
    if group_by == "key":
        return f"{values['api_key__name']} ({values['api_key__prefix']}…)"
    if group_by == "user":
        return values["user__username"]
    return values["model"]


def usage_report(*, rows: QuerySet[UsageBucket], group_by: str, bucket: str) -> dict:
    """``{"total", "totals": [row per group], "series": [row per bucket and group]}``; a row has
    ``group`` (its label), ``id`` (key id, user id or model name), the counts and ``total_tokens``;
    key rows also name their ``user``; series rows start with ``bucket_start`` (ISO, UTC)."""
    fields = GROUPS[group_by]
    sums = {name: Sum(name) for name in COUNTS}
    totals = [_row(v, group_by) for v in rows.values(*fields).annotate(**sums).order_by(fields[0])]
    series = [
        {"bucket_start": v["t"].astimezone(UTC).isoformat().replace("+00:00", "Z"), **_row(v, group_by)}
        for v in rows.annotate(t=Trunc("bucket_start", bucket, tzinfo=UTC))
        .values("t", *fields).annotate(**sums).order_by("t", fields[0])
    ]
    overall = {name: sum(row[name] for row in totals) for name in (*COUNTS, "total_tokens")}
    return {"total": overall, "totals": totals, "series": series}
