"""The trail is read by staff (API with filters, admin, dashboard page) and edited through none of them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse
from django.utils import timezone

from controlplane.audit.models import AuditEntry
from controlplane.audit.services import SYSTEM, Actor, Target, audit_record
from tests.api.mixins import APIResourceTests, assert_error

pytestmark = pytest.mark.django_db
URL = "/api/v1/audit/"


@pytest.fixture
def user(user):
    """The shared operator, made staff: the trail is staff's to read (tests/security/test_visibility.py
    has the refusals)."""
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    return user


def record(action: str = "model.registered", actor: Actor = SYSTEM, target: Target | None = None,
           **fields) -> AuditEntry:
    return audit_record(actor=actor, action=action, target=target or Target("model", "1", "tiny"), **fields)


class TestAuditAPI(APIResourceTests):
    url = URL
    actions = frozenset({"list", "retrieve"})
    max_list_queries = 3  # token, count, page (the actor joined)

    def make_rows(self, n: int) -> list[AuditEntry]:
        bob = get_user_model().objects.get_or_create(username="bob")[0]
        return [record(actor=Actor(user=bob, label="bob", via="token")) for _ in range(n)]

    def create_data(self) -> dict[str, Any]:
        return {"action": "plan.applied", "actor_label": "mallory", "target_type": "deployment"}

    def update_data(self) -> dict[str, Any]:
        return {"action": "model.unregistered", "actor_label": "mallory"}

    def test_put_is_refused_and_nothing_changes(self, api):
        entry = self.make_rows(1)[0]
        assert_error(api.put(f"{URL}{entry.pk}/", self.update_data(), format="json"), 405)
        assert_error(api.delete(f"{URL}{entry.pk}/"), 405)
        entry.refresh_from_db()
        assert (entry.action, entry.actor_label) == ("model.registered", "bob")


def test_an_entry_as_the_api_shows_it(api, user):
    entry = record("device.throttle", Actor(user=user, label="alice", via="session", remote_addr="10.0.0.9"),
                   Target("device", "4", "n1/gpu0"), detail={"factor": 0.5})
    assert api.get(f"{URL}{entry.pk}/").json() == {
        "id": entry.pk, "at": entry.at.isoformat().replace("+00:00", "Z"), "actor": user.pk,
        "actor_label": "alice", "via": "session", "action": "device.throttle", "target_type": "device",
        "target_id": "4", "target_label": "n1/gpu0", "remote_addr": "10.0.0.9", "detail": {"factor": 0.5},
    }


def test_filters(api, user):
    alice = Actor(user=user, label="alice", via="token")
    applied = record("plan.applied", alice, Target("deployment", "1", "demo"))
    edited = record("plan.edited", alice, Target("deployment", "2", "other"))
    cli = Actor(user=None, label="cli:root", via="cli")
    by_cli = record("join_token.issued", cli, Target("join_token", "1"))
    old = record("plan.proposal_accepted", SYSTEM, Target("deployment", "1", "demo"))
    AuditEntry.objects.filter(pk=old.pk).update(at=timezone.now() - timedelta(days=2))

    def ids(**params) -> list[int]:
        response = api.get(URL, params)
        assert response.status_code == 200, response.content
        return [item["id"] for item in response.json()["results"]]

    assert ids() == [by_cli.pk, edited.pk, applied.pk, old.pk]  # newest first
    assert ids(actor="ALICE") == [edited.pk, applied.pk]  # a username, case-insensitive
    assert ids(actor="cli:root") == [by_cli.pk]  # a label
    assert ids(action="plan") == [edited.pk, applied.pk, old.pk]  # a prefix
    assert ids(action="plan.edited") == [edited.pk]
    assert ids(target_type="deployment", target_id="1") == [applied.pk, old.pk]
    assert ids(since=(timezone.now() - timedelta(days=1)).isoformat()) == [by_cli.pk, edited.pk, applied.pk]
    assert ids(ordering="at")[0] == old.pk


def test_the_admin_lists_entries_and_refuses_every_edit(client, django_user_model):
    admin = django_user_model.objects.create_superuser("root", password=None)
    client.force_login(admin)
    entry = record()
    changelist = reverse("admin:audit_auditentry_changelist")
    listed = client.get(changelist)
    assert listed.status_code == 200 and "model.registered" in listed.content.decode()
    assert client.get(reverse("admin:audit_auditentry_add")).status_code == 403
    change = reverse("admin:audit_auditentry_change", args=[entry.pk])
    assert client.get(change).status_code == 200  # viewable, read-only
    assert client.post(change, {"action": "plan.applied", "actor_label": "mallory"}).status_code == 403
    delete = reverse("admin:audit_auditentry_delete", args=[entry.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 403
    client.post(changelist, {"action": "delete_selected", "_selected_action": [entry.pk], "post": "yes"})
    entry.refresh_from_db()
    assert (entry.action, entry.actor_label) == ("model.registered", "system")


def test_the_dashboard_page_lists_entries_newest_first_with_filters(client, user):
    client.force_login(user)
    record("api_key.created", Actor(user=user, label="alice", via="session", remote_addr="192.0.2.8"),
           Target("api_key", "3", "ci (mk-abcdef…)"), detail={"name": "ci"})
    record("model.registered", Actor(user=None, label="cli:root", via="cli"))
    body = client.get(reverse("dashboard:audit")).content.decode()
    table = body.split('id="audit-table"')[1]
    assert table.count("data-entry=") == 2 and table.index("cli:root") < table.index("api_key.created")
    for text in ("alice", "api_key.created", "ci (mk-abcdef…)", "192.0.2.8",
                 "{&quot;name&quot;: &quot;ci&quot;}", 'aria-current="page">Audit<', "dashboard/audit.js"):
        assert text in body, text
    filtered = client.get(reverse("dashboard:audit"), {"action": "api_key"}).content.decode()
    table = filtered.split('id="audit-table"')[1]
    assert table.count("data-entry=") == 1 and "api_key.created" in table and "cli:root" not in table
    nobody = client.get(reverse("dashboard:audit"), {"actor": "nobody"}).content.decode()
    assert "matches these filters" in nobody


def test_the_dashboard_page_needs_a_login_and_only_reads(client, user):
    assert client.get(reverse("dashboard:audit"))["Location"].startswith("/accounts/login/")
    client.force_login(user)
    assert client.post(reverse("dashboard:audit")).status_code == 405
