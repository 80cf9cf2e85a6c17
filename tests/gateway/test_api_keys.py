"""API keys: shown once, stored hashed, revocable, tied to an active user."""

from __future__ import annotations

import asyncio
import io

import pytest
from django.core.management import CommandError, call_command

from controlplane.gateway.accounts.selectors import api_key_user
from controlplane.gateway.accounts.services import api_key_create, api_key_revoke
from controlplane.gateway.models import ApiKey

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_key_is_stored_only_as_its_hash_and_resolves_to_its_user(django_user_model):
    user = django_user_model.objects.create_user("bob")
    api_key, raw = api_key_create(user=user, name="ci")
    assert raw.startswith("mk-") and len(raw) > 40
    assert raw not in {api_key.key_hash, api_key.prefix} and raw.startswith(api_key.prefix)
    assert asyncio.run(api_key_user(raw_key=raw)) == user
    assert asyncio.run(api_key_user(raw_key=raw + "x")) is None


def test_revoked_keys_and_inactive_users_are_refused(django_user_model):
    user = django_user_model.objects.create_user("carol")
    revoked, raw_revoked = api_key_create(user=user, name="old")
    _, raw_kept = api_key_create(user=user, name="new")
    first = api_key_revoke(api_key=revoked).revoked_at
    assert api_key_revoke(api_key=revoked).revoked_at == first  # idempotent
    assert asyncio.run(api_key_user(raw_key=raw_revoked)) is None
    assert asyncio.run(api_key_user(raw_key=raw_kept)) == user
    user.is_active = False
    user.save()
    assert asyncio.run(api_key_user(raw_key=raw_kept)) is None


def test_the_command_prints_a_working_key_once(django_user_model):
    user = django_user_model.objects.create_user("dave")
    out = io.StringIO()
    call_command("create_api_key", "dave", "--name", "laptop", stdout=out)
    raw = out.getvalue().strip()
    assert ApiKey.objects.get(user=user).name == "laptop"
    assert asyncio.run(api_key_user(raw_key=raw)) == user
    with pytest.raises(CommandError, match="no user"):
        call_command("create_api_key", "nobody")
