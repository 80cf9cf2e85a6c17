"""The Usage page: requests and tokens per API key, user or model, totals and a time chart.

The first paint is the same report ``GET /api/v1/usage/`` answers (``gateway.accounts.usage``), for the last
24 hours by hour and per key; usage.js redraws from that API when the grouping or the window change
and every 30 s, and links its CSV export. A plain user sees their own keys' usage, staff everyone's.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from controlplane.gateway.accounts import usage_backlog
from controlplane.gateway.accounts.usage import usage_buckets, usage_report

FIRST_SPAN = timedelta(days=1)


@login_required
def usage(request: HttpRequest) -> HttpResponse:
    usage_backlog.flush()  # what this process served and has not written yet counts
    until = datetime.now(UTC)
    since = until - FIRST_SPAN
    rows = usage_buckets(since=since, until=until, user_id=None if request.user.is_staff else request.user.pk)
    report = {"since": since.isoformat(), "until": until.isoformat(), "bucket": "hour", "group_by": "key",
              "scope": "all" if request.user.is_staff else "own",
              **usage_report(rows=rows, group_by="key", bucket="hour")}
    return render(request, "dashboard/usage.html", {"page": "usage", "usage": report})
