"""audit_record and the actor helpers: what an entry holds, that it is written in the caller's
transaction, and that nothing edits it."""

from __future__ import annotations

import getpass

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django.test import RequestFactory
from rest_framework.authtoken.models import Token
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory, force_authenticate

from controlplane.audit.models import AuditEntry
from controlplane.audit.services import SYSTEM, Actor, Target, actor_cli, audit_context, audit_record
from controlplane.gateway.models import ApiKey

pytestmark = pytest.mark.django_db


def test_an_entry_names_actor_action_target_and_address(user):
    api_key = ApiKey.objects.create(user=user, name="ci", prefix="mk-abcdef", key_hash="x" * 64)
    actor = Actor(user=user, label="alice", via="session", remote_addr="10.0.0.7")
    entry = audit_record(actor=actor, action="api_key.created", target=api_key, detail={"name": "ci"})
    entry.refresh_from_db()
    assert (entry.actor, entry.actor_label, entry.via) == (user, "alice", "session")
    assert entry.remote_addr == "10.0.0.7" and entry.action == "api_key.created"
    assert (entry.target_type, entry.target_id) == ("api_key", str(api_key.pk))
    assert entry.target_label == "ci (mk-abcdef…)" and entry.detail == {"name": "ci"} and entry.at


def test_a_target_that_is_not_a_row_and_an_address_given_apart():
    entry = audit_record(actor=SYSTEM, action="device.throttle", target=Target("device", "3", "n1/gpu0"),
                         remote_addr="::ffff:10.1.2.3")
    assert (entry.actor, entry.actor_label, entry.via) == (None, "system", "system")
    assert (entry.target_type, entry.target_id, entry.target_label) == ("device", "3", "n1/gpu0")
    entry.refresh_from_db()
    assert entry.remote_addr == "10.1.2.3"


def test_an_address_that_is_not_an_ip_is_left_out():
    actor = Actor(user=None, label="alice", via="session", remote_addr="unix:/run/motley.sock")
    assert audit_record(actor=actor, action="model.registered", target=Target("model")).remote_addr is None


def test_an_unknown_action_is_refused():
    with pytest.raises(ValueError, match="plan.aplied"):
        audit_record(actor=SYSTEM, action="plan.aplied", target=Target("deployment"))
    assert not AuditEntry.objects.exists()


def test_a_rolled_back_transaction_leaves_no_entry():
    with pytest.raises(RuntimeError), transaction.atomic():
        audit_record(actor=SYSTEM, action="model.registered", target=Target("model", "1", "m"))
        raise RuntimeError("refused later in the same action")
    assert not AuditEntry.objects.exists()


def test_the_label_outlives_the_user(user):
    entry = audit_record(actor=Actor(user=user, label="alice", via="token"), action="model.registered",
                         target=Target("model", "1", "m"))
    user.delete()
    entry.refresh_from_db()
    assert entry.actor is None and entry.actor_label == "alice"


def test_entries_are_append_only():
    entry = audit_record(actor=SYSTEM, action="model.registered", target=Target("model", "1", "m"))
    entry.action = "model.unregistered"
    with pytest.raises(PermissionError):
        entry.save()
    with pytest.raises(PermissionError):
        entry.delete()
    assert AuditEntry.objects.get().action == "model.registered"


def test_audit_context_of_a_session_request(user):
    request = RequestFactory().post("/x", REMOTE_ADDR="192.0.2.1")
    request.user = user
    assert audit_context(request) == Actor(user=user, label="alice", via="session", remote_addr="192.0.2.1")
    assert audit_context(request, via="admin").via == "admin"


def test_audit_context_of_a_token_request(user):
    token = Token.objects.create(user=user)
    django_request = APIRequestFactory().post("/x", REMOTE_ADDR="192.0.2.2")
    force_authenticate(django_request, user=user, token=token)
    request = Request(django_request)
    assert audit_context(request) == Actor(user=user, label="alice", via="token", remote_addr="192.0.2.2")


def test_a_credential_may_name_itself(user):
    class Key:
        audit_via, audit_label = "api_key", "api key mk-…abcd"

    django_request = APIRequestFactory().post("/x")
    force_authenticate(django_request, user=user, token=Key())
    actor = audit_context(Request(django_request))
    assert (actor.user, actor.label, actor.via) == (user, "api key mk-…abcd", "api_key")


def test_cli_actor_names_the_os_user_or_the_given_one():
    assert actor_cli() == Actor(user=None, label=f"cli:{getpass.getuser()}", via="cli")
    bob = get_user_model().objects.create_user("bob")
    assert actor_cli(user=bob) == Actor(user=bob, label="bob", via="cli")
