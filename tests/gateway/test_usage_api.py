"""``GET /api/v1/usage/``: grouping, buckets, time range, who sees what, CSV."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime

import pytest
from rest_framework.test import APIClient

from controlplane.gateway.accounts.services import api_key_create
from controlplane.gateway.accounts.usage import usage_record

pytestmark = pytest.mark.django_db

DAY = datetime(2027, 1, 15, tzinfo=UTC)
RANGE = {"since": "2027-01-15T00:00:00Z", "until": "2027-01-16T00:00:00Z"}


@pytest.fixture
def usage(django_user_model):
    alice = django_user_model.objects.create_user("alice")
    bob = django_user_model.objects.create_user("bob")
    staff = django_user_model.objects.create_user("ops", is_staff=True)
    a1, _ = api_key_create(user=alice, name="a1")
    a2, _ = api_key_create(user=alice, name="a2")
    b1, _ = api_key_create(user=bob, name="b1")

    def record(key, model, hour, minute, prompt, completion, **extra):
        usage_record(api_key_id=key.pk, user_id=key.user_id, model=model,
                     at=DAY.replace(hour=hour, minute=minute),
                     requests=1, prompt_tokens=prompt, completion_tokens=completion, **extra)

    record(a1, "demo", 8, 0, 10, 5)
    record(a1, "demo", 8, 0, 10, 7)  # same key, model, minute: one row
    record(a1, "big", 9, 30, 100, 50)
    record(a2, "demo", 9, 59, 1, 1, errors=1)
    record(b1, "demo", 8, 15, 20, 20)
    usage_record(api_key_id=b1.pk, user_id=bob.pk, model="demo", at=DAY.replace(hour=8, minute=16), refused=3)
    record(b1, "demo", 23, 59, 2, 2)
    usage_record(api_key_id=b1.pk, user_id=bob.pk, model="demo", at=datetime(2027, 1, 16, tzinfo=UTC),
                 requests=1, prompt_tokens=999)  # outside the range
    return {"alice": alice, "bob": bob, "staff": staff, "a1": a1, "a2": a2, "b1": b1}


def client(user) -> APIClient:
    api = APIClient()
    api.force_authenticate(user)
    return api


def test_anonymous_is_refused_401():
    response = APIClient().get("/api/v1/usage/")
    assert response.status_code == 401 and response["WWW-Authenticate"] == "Token"


def test_staff_see_everyone_grouped_by_key_user_and_model(usage):
    api = client(usage["staff"])
    by_key = api.get("/api/v1/usage/", {**RANGE, "group_by": "key"}).json()
    assert by_key["scope"] == "all"
    assert {row["group"]: (row["requests"], row["total_tokens"]) for row in by_key["totals"]} == {
        f"a1 ({usage['a1'].prefix}…)": (3, 182), f"a2 ({usage['a2'].prefix}…)": (1, 2),
        f"b1 ({usage['b1'].prefix}…)": (2, 44)}
    assert {row["user"] for row in by_key["totals"]} == {"alice", "bob"}
    assert by_key["total"] == {"requests": 6, "prompt_tokens": 143, "completion_tokens": 85,
                               "total_tokens": 228, "errors": 1, "refused": 3}
    by_user = api.get("/api/v1/usage/", {**RANGE, "group_by": "user"}).json()["totals"]
    assert {(r["group"], r["prompt_tokens"], r["completion_tokens"], r["errors"], r["refused"])
            for r in by_user} == {("alice", 121, 63, 1, 0), ("bob", 22, 22, 0, 3)}
    by_model = api.get("/api/v1/usage/", {**RANGE, "group_by": "model"}).json()["totals"]
    assert {r["id"]: r["total_tokens"] for r in by_model} == {"big": 150, "demo": 78}
    only_bob = api.get("/api/v1/usage/", {**RANGE, "user": "bob"}).json()
    assert only_bob["total"]["total_tokens"] == 44


def test_series_by_hour_and_day(usage):
    api = client(usage["staff"])
    hourly = api.get("/api/v1/usage/", {**RANGE, "group_by": "model", "bucket": "hour"}).json()["series"]
    assert [(r["bucket_start"], r["group"], r["total_tokens"]) for r in hourly] == [
        ("2027-01-15T08:00:00Z", "demo", 72), ("2027-01-15T09:00:00Z", "big", 150),
        ("2027-01-15T09:00:00Z", "demo", 2), ("2027-01-15T23:00:00Z", "demo", 4)]
    daily = api.get("/api/v1/usage/", {"since": "2027-01-01", "until": "2027-02-01", "group_by": "user",
                                       "bucket": "day"}).json()["series"]
    assert [(r["bucket_start"], r["group"], r["prompt_tokens"]) for r in daily] == [
        ("2027-01-15T00:00:00Z", "alice", 121), ("2027-01-15T00:00:00Z", "bob", 22),
        ("2027-01-16T00:00:00Z", "bob", 999)]
    minutes = api.get("/api/v1/usage/", {"since": "2027-01-15T08:00:00Z", "until": "2027-01-15T08:30:00Z",
                                         "bucket": "minute", "group_by": "user"}).json()["series"]
    assert [(r["bucket_start"], r["group"], r["requests"], r["refused"]) for r in minutes] == [
        ("2027-01-15T08:00:00Z", "alice", 2, 0), ("2027-01-15T08:15:00Z", "bob", 1, 0),
        ("2027-01-15T08:16:00Z", "bob", 0, 3)]


def test_a_plain_user_sees_only_their_own_keys(usage):
    api = client(usage["alice"])
    body = api.get("/api/v1/usage/", {**RANGE, "group_by": "key"}).json()
    assert body["scope"] == "own"
    assert {row["user"] for row in body["totals"]} == {"alice"} and body["total"]["total_tokens"] == 184
    assert api.get("/api/v1/usage/", {**RANGE, "key": usage["b1"].pk}).json()["totals"] == []
    refused = api.get("/api/v1/usage/", {**RANGE, "user": "bob"})
    assert refused.status_code == 403 and "staff" in refused.json()["error"]["message"]
    assert api.get("/api/v1/usage/", {**RANGE, "user": "alice"}).status_code == 200


@pytest.mark.parametrize(("params", "field"), [
    ({"group_by": "team"}, "group_by"), ({"bucket": "week"}, "bucket"), ({"since": "yesterday"}, "since"),
    ({"since": "2027-01-02", "until": "2027-01-01"}, "since"),
    ({"since": "2020-01-01", "until": "2027-01-01", "bucket": "minute"}, "bucket"),
])
def test_bad_queries_are_400_naming_the_field(usage, params, field):
    response = client(usage["staff"]).get("/api/v1/usage/", params)
    assert response.status_code == 400 and field in response.json()["error"]["details"]


def test_csv_export_has_one_line_per_bucket_and_group(usage):
    response = client(usage["staff"]).get("/api/v1/usage/", {**RANGE, "group_by": "key", "format": "csv"})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert list(rows[0]) == ["bucket_start", "key", "id", "user", "requests", "prompt_tokens",
                             "completion_tokens", "total_tokens", "errors", "refused"]
    assert sum(int(r["total_tokens"]) for r in rows) == 228 and len(rows) == 5  # hours × keys with use
    error = client(usage["staff"]).get("/api/v1/usage/", {"bucket": "week", "format": "csv"})
    assert error.status_code == 400 and error.json()["error"]["details"]["bucket"]
