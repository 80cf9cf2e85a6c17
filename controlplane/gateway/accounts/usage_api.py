"""``GET /api/v1/usage/``: requests, tokens, errors and refusals per key, user or model over time, as JSON
or CSV (``?format=csv``). A plain user sees the usage of their own keys; staff see everyone's and may
narrow it to one user (``?user=<username>``)."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

from django.utils.dateparse import parse_date, parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.gateway.accounts import usage_backlog
from controlplane.gateway.accounts.usage import BUCKETS, COUNTS, GROUPS, usage_buckets, usage_report

BUCKET_S = {"minute": 60, "hour": 3600, "day": 86400}
DEFAULT_SPAN = {"minute": timedelta(hours=1), "hour": timedelta(days=1), "day": timedelta(days=30)}
MAX_POINTS = 10_000  # buckets per series: a minute series spans a week at most


def _instant(value: str) -> datetime:
    """An ISO 8601 time (naive: UTC) or a date (its midnight, UTC)."""
    moment = parse_datetime(value)
    if moment is None and (day := parse_date(value)) is not None:
        moment = datetime.combine(day, datetime.min.time())
    if moment is None:
        raise serializers.ValidationError("an ISO 8601 time (2027-01-15T08:00:00Z) or date (2027-01-15)")
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


class InstantField(serializers.Field):
    def to_internal_value(self, data) -> datetime:
        return _instant(str(data))


class UsageQuery(serializers.Serializer):
    group_by = serializers.ChoiceField(choices=list(GROUPS), default="key")
    bucket = serializers.ChoiceField(choices=list(BUCKETS), default="hour")
    since = InstantField(required=False)
    until = InstantField(required=False)
    key = serializers.IntegerField(required=False, min_value=1)
    user = serializers.CharField(required=False)
    model = serializers.CharField(required=False)

    def validate(self, attrs: dict) -> dict:
        until = attrs.get("until") or datetime.now(UTC)
        since = attrs.get("since") or until - DEFAULT_SPAN[attrs["bucket"]]
        if since >= until:
            raise serializers.ValidationError({"since": "must be before until"})
        points = (until - since).total_seconds() / BUCKET_S[attrs["bucket"]]
        if points > MAX_POINTS:
            raise serializers.ValidationError(
                {"bucket": f"{points:.0f} {attrs['bucket']} buckets from since to until; at most "
                           f"{MAX_POINTS}: choose a larger bucket or a shorter span"})
        return {**attrs, "since": since, "until": until}


class UsageCSVRenderer(BaseRenderer):
    """The series, one line per bucket and group (a spreadsheet's or a billing script's input)."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None) -> bytes:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        key_rows = data.get("group_by") == "key"
        writer.writerow(["bucket_start", data.get("group_by", "group"), "id", *(["user"] if key_rows else []),
                         *COUNTS[:3], "total_tokens", *COUNTS[3:]])
        for row in data.get("series", []):
            writer.writerow([row["bucket_start"], row["group"], row["id"],
                             *([row["user"]] if key_rows else []),
                             *(row[name] for name in COUNTS[:3]), row["total_tokens"],
                             *(row[name] for name in COUNTS[3:])])
        return out.getvalue().encode()


class UsageView(APIView):
    renderer_classes = [JSONRenderer, UsageCSVRenderer]

    @extend_schema(
        parameters=[
            OpenApiParameter("group_by", str, enum=list(GROUPS),
                             description="Rows per key (default), user or model."),
            OpenApiParameter("bucket", str, enum=list(BUCKETS), description="Series bucket (default hour)."),
            OpenApiParameter("since", OpenApiTypes.DATETIME,
                             description="Default: until minus 1 h / 1 day / 30 days."),
            OpenApiParameter("until", OpenApiTypes.DATETIME, description="Default: now."),
            OpenApiParameter("key", int, description="One API key (id)."),
            OpenApiParameter("user", str, description="Staff: one user's keys (username)."),
            OpenApiParameter("model", str, description="One served model."),
            OpenApiParameter("format", str, enum=["json", "csv"], description="csv: the series as CSV."),
        ],
        responses={200: OpenApiTypes.OBJECT},
    )
    def get(self, request: Request) -> Response:
        """``{"since", "until", "bucket", "group_by", "scope", "total", "totals", "series"}``: the counts
        (requests, prompt_tokens, completion_tokens, total_tokens, errors, refused) in all, per group
        and per bucket and group (docs/api.md, "Usage")."""
        query = UsageQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        usage_backlog.flush()  # what this process served and has not written yet counts
        q = query.validated_data
        user_id = None if request.user.is_staff else request.user.pk
        if q.get("user"):
            if not request.user.is_staff and q["user"] != request.user.get_username():
                raise PermissionDenied("only staff see other users' usage")
            user_id = _user_id(q["user"])
        rows = usage_buckets(since=q["since"], until=q["until"], user_id=user_id, api_key_id=q.get("key"),
                             model=q.get("model"))
        report = usage_report(rows=rows, group_by=q["group_by"], bucket=q["bucket"])
        body = {"since": _iso(q["since"]), "until": _iso(q["until"]), "bucket": q["bucket"],
                "group_by": q["group_by"], "scope": "all" if request.user.is_staff else "own", **report}
        response = Response(body)
        if request.accepted_renderer.format == "csv":
            name = f"motley-usage-{q['group_by']}-{q['until']:%Y%m%dT%H%M}.csv"
            response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response

    def handle_exception(self, exc):
        """Errors stay JSON (the API's error shape), even for a CSV request."""
        self.request.accepted_renderer, self.request.accepted_media_type = JSONRenderer(), "application/json"
        return super().handle_exception(exc)


def _user_id(username: str) -> int:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.filter(**{get_user_model().USERNAME_FIELD: username}).first()
    if user is None:
        raise serializers.ValidationError({"user": f"no user named {username!r}"})
    return user.pk


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
