"""Setting a key's limits: the service (validated, audited), the commands, the keys API and the admin."""

from __future__ import annotations

import io
import json

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from controlplane.audit.models import AuditEntry
from controlplane.audit.services import SYSTEM
from controlplane.gateway.accounts.services import api_key_create, api_key_set_limits
from controlplane.gateway.models import ApiKey

pytestmark = pytest.mark.django_db


@pytest.fixture
def people(django_user_model):
    return {"alice": django_user_model.objects.create_user("alice"),
            "bob": django_user_model.objects.create_user("bob"),
            "ops": django_user_model.objects.create_user("ops", is_staff=True, is_superuser=True)}


def client(user) -> APIClient:
    api = APIClient()
    api.force_authenticate(user)
    return api


def test_the_service_validates_sets_and_audits_what_changed(people):
    api_key, _ = api_key_create(user=people["alice"], name="ci")
    api_key_set_limits(api_key=api_key, actor=SYSTEM, requests_per_minute=60,
                       allowed_models=["demo", " demo"])
    api_key.refresh_from_db()
    assert (api_key.requests_per_minute, api_key.allowed_models) == (60, ["demo"])
    entry = AuditEntry.objects.get(action="api_key.updated")
    assert entry.detail["changed"] == {"requests_per_minute": [None, 60], "allowed_models": [[], ["demo"]]}
    api_key_set_limits(api_key=api_key, requests_per_minute=60)  # no change: no entry
    assert AuditEntry.objects.filter(action="api_key.updated").count() == 1
    with pytest.raises(ValidationError, match="budget_period"):
        api_key_set_limits(api_key=api_key, budget_period="week")
    with pytest.raises(ValidationError, match="allowed_models"):
        api_key_set_limits(api_key=api_key, allowed_models="demo")
    with pytest.raises(ValueError, match="not a key limit"):
        api_key_set_limits(api_key=api_key, name="renamed")
    assert ApiKey.objects.get(pk=api_key.pk).budget_period == "month"


def test_create_api_key_takes_limits_and_set_api_key_limits_changes_them(people):
    out = io.StringIO()
    call_command("create_api_key", "alice", "--name", "batch", "--rpm", "10", "--tpm", "5000",
                 "--budget", "100000", "--budget-period", "day", "--model", "demo", "--model", "other",
                 stdout=out)
    api_key = ApiKey.objects.get(name="batch")
    assert (api_key.requests_per_minute, api_key.tokens_per_minute, api_key.token_budget,
            api_key.budget_period, api_key.allowed_models) == (10, 5000, 100000, "day", ["demo", "other"])
    created = AuditEntry.objects.get(action="api_key.created")
    assert created.detail["limits"]["requests_per_minute"] == 10 and created.actor_label.startswith("cli:")
    out = io.StringIO()
    call_command("set_api_key_limits", api_key.prefix, "--rpm", "none", "--all-models", stdout=out)
    shown = json.loads(out.getvalue())
    assert (shown["requests_per_minute"] is None and shown["allowed_models"] == []
            and shown["tokens_per_minute"] == 5000)
    with pytest.raises(CommandError, match="not a count"):
        call_command("set_api_key_limits", str(api_key.pk), "--tpm", "lots")
    with pytest.raises(CommandError, match="no API key"):
        call_command("set_api_key_limits", "mk-nothing", "--tpm", "1")


def test_the_keys_api_shows_own_keys_and_only_staff_change_limits(people):
    mine, _ = api_key_create(user=people["alice"], name="mine")
    theirs, _ = api_key_create(user=people["bob"], name="theirs")
    assert APIClient().get("/api/v1/api-keys/").status_code == 401
    listed = client(people["alice"]).get("/api/v1/api-keys/").json()["results"]
    assert [k["name"] for k in listed] == ["mine"] and "key_hash" not in listed[0]
    assert listed[0]["user"] == "alice" and listed[0]["requests_per_minute"] is None
    assert client(people["alice"]).get(f"/api/v1/api-keys/{theirs.pk}/").status_code == 404
    refused = client(people["alice"]).patch(f"/api/v1/api-keys/{mine.pk}/", {"requests_per_minute": 1000},
                                            format="json")
    assert refused.status_code == 403 and "staff" in refused.json()["error"]["message"]
    staff = client(people["ops"])
    assert {k["name"] for k in staff.get("/api/v1/api-keys/").json()["results"]} == {"mine", "theirs"}
    assert [k["name"] for k in staff.get("/api/v1/api-keys/", {"user": "bob"}).json()["results"]] == [
        "theirs"]
    changed = staff.patch(f"/api/v1/api-keys/{mine.pk}/",
                          {"tokens_per_minute": 2000, "allowed_models": ["demo"], "name": "renamed"},
                          format="json")
    assert changed.status_code == 200, changed.content
    # name is read-only
    assert changed.json()["tokens_per_minute"] == 2000 and changed.json()["name"] == "mine"
    entry = AuditEntry.objects.get(action="api_key.updated")
    assert entry.actor == people["ops"] and entry.target_id == str(mine.pk)
    bad = staff.patch(f"/api/v1/api-keys/{mine.pk}/", {"budget_period": "week"}, format="json")
    assert bad.status_code == 400 and "budget_period" in bad.json()["error"]["details"]
    assert staff.delete(f"/api/v1/api-keys/{mine.pk}/").status_code == 405


def test_the_admin_changes_limits_through_the_service(people, client):
    api_key, _ = api_key_create(user=people["alice"], name="ci")
    client.force_login(people["ops"])
    url = f"/admin/gateway/apikey/{api_key.pk}/change/"
    page = client.get(url)
    assert page.status_code == 200 and b"requests_per_minute" in page.content
    response = client.post(url, {"requests_per_minute": "7", "tokens_per_minute": "", "token_budget": "",
                                 "budget_period": "month", "allowed_models": "[]"})
    assert response.status_code == 302, response.content.decode()[-2000:]
    assert ApiKey.objects.get(pk=api_key.pk).requests_per_minute == 7
    entry = AuditEntry.objects.get(action="api_key.updated")
    assert entry.via == "admin" and entry.detail["changed"] == {"requests_per_minute": [None, 7]}
